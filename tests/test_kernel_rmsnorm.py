"""The Triton RMSNorm against its PyTorch reference: output, input gradient and weight gradient.

On a CPU the kernel runs in Triton's interpreter at small shapes (hidden sizes that are not powers of
two included); with a GPU the same tests run compiled at the workshop's shapes.
"""

import pytest
import torch

from conftest import DEVICE

from tinyllama.kernels import KernelMismatch, rmsnorm, rmsnorm_reference
from tinyllama.kernels._triton import compare_with_reference, max_relative_error
from tinyllama.kernels.rmsnorm import rmsnorm_backward, rmsnorm_forward

# (leading shape, hidden size)
SHAPES = ([((16, 512), 1024), ((4, 256), 4096), ((3, 333), 1000), ((2, 7), 257)] if DEVICE == "cuda"
          else [((2, 3), 48), ((5,), 100), ((1, 7), 257), ((4, 16), 64), ((37,), 48)])
# 37 rows: the backward's programs get unequal runs of row blocks (3, 3, 3 and 1 on the CPU).
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _inputs(lead, hidden, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, hidden, generator=g).to(DEVICE, dtype).requires_grad_()
    weight = (1 + 0.2 * torch.randn(hidden, generator=g)).to(DEVICE).requires_grad_()
    return x, weight


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead,hidden", SHAPES)
def test_forward_and_gradients_match_the_reference(lead, hidden, dtype):
    x, weight = _inputs(lead, hidden, dtype, seed=hidden)
    errors = compare_with_reference(rmsnorm, rmsnorm_reference, [x, weight], ["x", "weight"], eps=1e-5)
    assert set(errors) == {"out", "dx", "dweight"}


def test_non_contiguous_inputs_and_gradients():
    """A transposed view (last dimension strided), a row slice (rows further apart than their
    length) and a transposed upstream gradient: a launcher that assumed contiguous memory would read
    the wrong elements and fail here."""
    hidden, rows = (1000, 300) if DEVICE == "cuda" else (100, 12)
    g = torch.Generator().manual_seed(1)
    weight = (1 + 0.2 * torch.randn(hidden, generator=g)).to(DEVICE).requires_grad_()
    base_t = torch.randn(hidden, rows, generator=g).to(DEVICE).requires_grad_()
    transposed = base_t.t()  # (rows, hidden), strides (1, rows)
    base_wide = torch.randn(rows, 2 * hidden + 3, generator=g).to(DEVICE).requires_grad_()
    sliced = base_wide[:, 3:hidden + 3]  # row stride 2 * hidden + 3, offset 3
    for x in (transposed, sliced):
        assert not x.is_contiguous()
        grad_out = torch.randn(hidden, rows, generator=g).to(DEVICE).t()
        compare_with_reference(rmsnorm, rmsnorm_reference, [x, weight], ["x", "weight"], grad_out=grad_out)


@pytest.fixture
def deterministic():
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(False)


def _weight_gradient(lead, hidden, seed):
    x, weight = _inputs(lead, hidden, torch.float32, seed)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed + 1)).to(DEVICE)
    rmsnorm(x, weight).backward(dy)
    return weight.grad


@pytest.mark.parametrize("lead,hidden", [SHAPES[0], SHAPES[-1]])
def test_deterministic_mode_sums_the_weight_gradient_in_a_fixed_order(lead, hidden, deterministic):
    """Under torch.use_deterministic_algorithms the programs' partial sums are added by PyTorch in a
    fixed order (no atomics): the same inputs give bit-identical weight gradients, equal to the
    atomic path's up to rounding."""
    first, second = _weight_gradient(lead, hidden, 5), _weight_gradient(lead, hidden, 5)
    assert torch.equal(first, second)
    torch.use_deterministic_algorithms(False)
    atomic = _weight_gradient(lead, hidden, 5)
    assert max_relative_error(atomic, first) < 1e-5


def test_rstd_is_the_reciprocal_root_mean_square():
    x, weight = _inputs((3,), 257, torch.float32, seed=2)
    _, rstd = rmsnorm_forward(x.detach(), weight.detach(), eps=1e-5)
    expected = torch.rsqrt(x.detach().pow(2).mean(-1) + 1e-5)
    assert max_relative_error(rstd, expected) < 1e-6


@pytest.mark.parametrize("lead", [(3, 5), (0,)], ids=["rows", "no-rows"])
def test_the_kernels_zero_the_vectors_they_are_given(lead):
    """The forward zeroes the backward's weight-gradient sum and a backward zeroes the next one's
    (NaN before: a vector left untouched would stay NaN); a gradient added into such a vector equals
    one added into a vector the launcher zeroed itself."""
    x, weight = _inputs(lead, 100, torch.float32, seed=6)
    x, weight = x.detach(), weight.detach()
    zeroed = torch.full((100,), float("nan"), device=DEVICE)
    _, rstd = rmsnorm_forward(x, weight, 1e-5, zeroed=zeroed)
    assert torch.equal(zeroed, torch.zeros_like(zeroed))
    dy = torch.randn_like(x)
    zero_next = torch.full((100,), float("nan"), device=DEVICE)
    dx, dweight = rmsnorm_backward(dy, x, weight, rstd, dweight_sum=zeroed, zero_next=zero_next)
    assert torch.equal(zero_next, torch.zeros_like(zero_next))
    dx_own, dweight_own = rmsnorm_backward(dy, x, weight, rstd)
    assert torch.equal(dx, dx_own) and max_relative_error(dweight, dweight_own) < 1e-6


def test_repeated_backward_gives_the_same_gradients():
    """Three backward passes through one graph (retain_graph): each adds its weight gradient into a
    vector of its own, zeroed by the kernel before it, so none carries over the previous sum."""
    x, weight = _inputs((4, 9), 100, torch.float32, seed=7)
    out = rmsnorm(x, weight)
    dy = torch.randn_like(out)
    grads = [torch.autograd.grad(out, [x, weight], dy, retain_graph=True) for _ in range(3)]
    exact = [t.detach().requires_grad_() for t in (x, weight)]
    expected = torch.autograd.grad(rmsnorm_reference(*exact), exact, dy)
    for dx, dweight in grads:
        assert max_relative_error(dx, expected[0]) < 1e-5 and max_relative_error(dweight, expected[1]) < 1e-5


def test_a_wrong_sum_vector_is_refused():
    x, weight = _inputs((2,), 48, torch.float32, seed=8)
    with pytest.raises(ValueError, match="float32 vector of length 48"):
        rmsnorm_forward(x.detach(), weight.detach(), 1e-5, zeroed=torch.zeros(47, device=DEVICE))


@pytest.mark.gpu
def test_the_backward_is_one_kernel():
    """No zeroing kernel of its own: the backward launches only the Triton kernel."""
    x, weight = _inputs((16, 512), 1024, torch.bfloat16, seed=9)
    out = rmsnorm(x, weight)
    dy = torch.randn_like(out)
    torch.autograd.grad(out, [x, weight], dy, retain_graph=True)  # autotuning happens here
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.autograd.grad(out, [x, weight], dy, retain_graph=True)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) == 1 and "rmsnorm_bwd" in kernels[0], kernels


@pytest.mark.gpu
def test_a_captured_backward_replays_to_the_same_gradient():
    """Forward run eagerly, backward captured in a CUDA graph and replayed twice: each replay must
    zero its own sum (a sum zeroed by the eager forward would be added into again on replay)."""
    x, weight = _inputs((8, 300), 1000, torch.bfloat16, seed=10)
    dy = torch.randn_like(x)
    # Not on the legacy default stream: the backward runs on its forward's stream, which capture
    # cannot take in from there.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = rmsnorm(x, weight)
        eager = torch.autograd.grad(out, [x, weight], dy, retain_graph=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = torch.autograd.grad(out, [x, weight], dy, retain_graph=True)
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert max_relative_error(captured[1], eager[1]) < 1e-5 and torch.equal(captured[0], eager[0])


def test_out_dtype_rounds_the_fp32_result_once():
    """Under autocast V3 asks for a bf16 result: it must equal the fp32 result cast to bf16."""
    x, weight = _inputs((4,), 100, torch.float32, seed=3)
    y16 = rmsnorm(x, weight, 1e-5, out_dtype=torch.bfloat16)
    assert y16.dtype == torch.bfloat16 and y16.shape == x.shape
    expected = rmsnorm_reference(x, weight, 1e-5).to(torch.bfloat16)
    assert (y16.float() - expected.float()).abs().max().item() <= 2 ** -7 * expected.float().abs().max().item()


def test_a_wrong_result_is_caught():
    """The comparison itself must be able to fail: a norm without its weight is rejected."""
    x, weight = _inputs((2, 3), 48, torch.float32, seed=4)
    with pytest.raises(KernelMismatch):
        compare_with_reference(lambda a, w, eps: rmsnorm(a, torch.ones_like(w), eps), rmsnorm_reference,
                               [x, weight], ["x", "weight"], eps=1e-5)


def test_bad_shapes_give_a_clear_error():
    x = torch.randn(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="last dimension"):
        rmsnorm(x, torch.ones(7, device=DEVICE))
    with pytest.raises(ValueError, match="not supported"):
        rmsnorm(x.double(), torch.ones(8, device=DEVICE, dtype=torch.float64))
