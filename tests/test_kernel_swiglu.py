"""The Triton SwiGLU against ``silu(gate) * up``: output and both gradients.

On a CPU the kernel runs in Triton's interpreter at small shapes; with a GPU, compiled at the
workshop's shapes (the medium model's feed-forward is 8192 tokens x 4096).
"""

import pytest
import torch

from conftest import DEVICE

from tinyllama.kernels import KernelMismatch, swiglu, swiglu_packed, swiglu_packed_reference, swiglu_reference
from tinyllama.kernels._triton import compare_with_reference

SHAPES = ([(16, 512, 4096), (8, 256, 11008), (1000, 1000)] if DEVICE == "cuda"
          else [(3, 48), (2, 5, 100), (1, 257), (33, 64)])
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _pair(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    # Scale 3 reaches silu's curved region and both tails.
    gate = (3 * torch.randn(*shape, generator=g)).to(DEVICE, dtype).requires_grad_()
    up = torch.randn(*shape, generator=g).to(DEVICE, dtype).requires_grad_()
    return gate, up


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_and_gradients_match_the_reference(shape, dtype):
    gate, up = _pair(shape, dtype, seed=sum(shape))
    errors = compare_with_reference(swiglu, swiglu_reference, [gate, up], ["gate", "up"])
    assert set(errors) == {"out", "dgate", "dup"}


def test_halves_of_one_fused_projection_and_transposed_views():
    """Gate and up as the two halves of one (rows, 2 * width) tensor (row stride twice the row), and
    as transposed views with a transposed upstream gradient."""
    rows, width = (500, 1000) if DEVICE == "cuda" else (9, 100)
    g = torch.Generator().manual_seed(5)
    fused = torch.randn(rows, 2 * width, generator=g).to(DEVICE).requires_grad_()
    gate, up = fused.chunk(2, dim=-1)
    assert not gate.is_contiguous() and gate.stride(-1) == 1
    compare_with_reference(swiglu, swiglu_reference, [gate, up], ["gate", "up"])

    gate_t = torch.randn(width, rows, generator=g).to(DEVICE).requires_grad_().t()
    up_t = torch.randn(width, rows, generator=g).to(DEVICE).requires_grad_().t()
    grad_out = torch.randn(width, rows, generator=g).to(DEVICE).t()
    compare_with_reference(swiglu, swiglu_reference, [gate_t, up_t], ["gate", "up"], grad_out=grad_out)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_packed_halves_match_the_reference_and_return_one_gradient(dtype):
    """``swiglu_packed`` on a fused (rows, 2 * width) projection output, width not a power of two:
    output and gradient agree, and the gradient is one contiguous tensor (no concatenation copy)."""
    rows, width = (333, 1000) if DEVICE == "cuda" else (7, 50)
    g = torch.Generator().manual_seed(11)
    gate_up = (2 * torch.randn(2, rows, 2 * width, generator=g)).to(DEVICE, dtype).requires_grad_()
    errors = compare_with_reference(swiglu_packed, swiglu_packed_reference, [gate_up], ["gate_up"])
    assert set(errors) == {"out", "dgate_up"}
    grad = torch.autograd.grad(swiglu_packed(gate_up), gate_up, torch.ones(2, rows, width, device=DEVICE, dtype=dtype))[0]
    assert grad.shape == gate_up.shape and grad.is_contiguous()
    with pytest.raises(ValueError, match="even"):
        swiglu_packed(torch.randn(3, 5, device=DEVICE))


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # the interpreter's numpy
def test_extreme_values_stay_finite():
    gate = torch.tensor([[-100.0, -20.0, 0.0, 20.0, 100.0]], device=DEVICE, requires_grad=True)
    up = torch.ones_like(gate, requires_grad=True)
    out = swiglu(gate, up)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(gate.grad).all() and torch.isfinite(up.grad).all()
    assert out[0, 2].item() == 0.0 and abs(out[0, 4].item() - 100.0) < 1e-4


def test_a_wrong_result_is_caught():
    gate, up = _pair((3, 48), torch.float32, seed=6)
    with pytest.raises(KernelMismatch):
        compare_with_reference(lambda g, u: torch.sigmoid(g) * u, swiglu_reference, [gate, up], ["gate", "up"])


def test_mismatched_inputs_give_a_clear_error():
    with pytest.raises(ValueError, match="same shape"):
        swiglu(torch.randn(2, 4, device=DEVICE), torch.randn(2, 5, device=DEVICE))
