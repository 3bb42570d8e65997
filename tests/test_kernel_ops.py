"""The kernels as PyTorch operators (``torch.ops.tinyllama.*``): ``torch.compile`` traces V3 and
matches eager, ``FlopCounterMode`` counts V3's attention as it counts PyTorch's, the profiler names
the operators, and ``torch.library.opcheck`` accepts each one. Eager calls stay off the dispatcher
(``dispatch_through_ops``). On a CPU the kernels run in Triton's interpreter, in fp32, at odd sizes.
"""

import dataclasses

import pytest
import torch

from conftest import DEVICE, logits_and_grads

from tinyllama import kernels
from tinyllama.config import get_preset
from tinyllama.kernels._ops import dispatch_through_ops
from tinyllama.models import build
from tinyllama.models.weights import transfer_weights
from tinyllama.profiling.flops import count_flops

OPS = ("rmsnorm_forward", "rmsnorm_backward", "rope", "swiglu_forward", "swiglu_backward", "swiglu_packed_forward",
       "swiglu_packed_backward", "flash_attention_forward", "flash_attention_backward")


@pytest.fixture(scope="module")
def config():
    return dataclasses.replace(get_preset("ci").model, num_layers=1)


@pytest.fixture(scope="module")
def tokens(config):
    return torch.randint(0, config.vocab_size, (2, 21), generator=torch.Generator().manual_seed(0)).to(DEVICE)


def test_every_operator_is_registered():
    for name in OPS:
        assert hasattr(torch.ops.tinyllama, name), name


def test_eager_calls_stay_off_the_dispatcher_and_traced_ones_do_not():
    from torch.utils.flop_counter import FlopCounterMode

    assert not dispatch_through_ops()
    with FlopCounterMode(display=False):
        assert dispatch_through_ops()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert not dispatch_through_ops()  # a profile of eager V3 shows eager V3 (named ranges instead)


def test_compiled_v3_trains_like_eager_v3(config, tokens):
    torch.manual_seed(0)
    eager = build("v3", config).to(DEVICE)
    compiled_model = transfer_weights(eager, build("v3", config).to(DEVICE))
    compiled = torch.compile(compiled_model)
    logits0, grads0 = logits_and_grads(eager, tokens)
    logits1, grads1 = logits_and_grads(compiled, tokens)
    torch.testing.assert_close(logits1, logits0, rtol=1e-5, atol=1e-5)
    assert grads1.keys() == grads0.keys()
    for name, grad in grads0.items():
        torch.testing.assert_close(grads1[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def _attention_flops(count, names):
    return sum(int(row.flops) for row in count.by_operator.itertuples() if any(n in row.operator for n in names))


def test_flop_counter_counts_v3_attention_as_pytorch_attention(config, tokens):
    """V3's registered formula gives its attention the FLOPs FlopCounterMode gives V4's SDPA (forward
    and backward), and V3's total (all matmuls included) equals V4's; the forward alone equals V1's,
    which computes attention with two matmuls."""
    torch.manual_seed(0)
    v1 = build("v1", config).to(DEVICE)
    v3 = transfer_weights(v1, build("v3", config).to(DEVICE))
    v4 = transfer_weights(v1, build("v4", config).to(DEVICE))
    step = count_flops(lambda: logits_and_grads(v3, tokens))
    ours = _attention_flops(step, ["tinyllama.flash_attention"])
    sdpa = count_flops(lambda: logits_and_grads(v4, tokens))
    theirs = _attention_flops(sdpa, ["scaled_dot_product", "flash_attention_for_cpu"])
    batch, seq = tokens.shape
    forward = 4 * batch * config.num_heads * seq * seq * config.head_dim * config.num_layers
    assert ours == theirs == forward + 10 * forward // 4  # SDPA's formulas: 4 and 10 products of s x s x d
    assert step.total == sdpa.total
    with torch.no_grad():
        assert count_flops(lambda: v3(tokens)).total == count_flops(lambda: v1(tokens)).total
    elementwise = _attention_flops(step, ["tinyllama.rmsnorm", "tinyllama.rope", "tinyllama.swiglu"])
    assert elementwise == 0  # registered, counted as FlopCounterMode counts ATen's element-wise operators


WANTED = {f"tinyllama::{op}" for op in ("rmsnorm_forward", "rmsnorm_backward", "rope", "swiglu_packed_forward",
                                        "swiglu_packed_backward", "flash_attention_forward", "flash_attention_backward")}


def test_the_profiler_names_the_operators(config, tokens):
    """Eager V3 under the profiler: each launch sits in a range named like its operator, once per use
    (a forward and a backward per layer; RMSNorm twice per layer and once more at the end, RoPE for q
    and k together once forward and once backward), and no operator was dispatched (eager stays eager)."""
    torch.manual_seed(0)
    v3 = build("v3", config).to(DEVICE)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        logits_and_grads(v3, tokens)
    counts = {event.key: event.count for event in prof.key_averages()}
    assert WANTED <= counts.keys(), WANTED - counts.keys()
    layers = config.num_layers
    assert counts["tinyllama::rmsnorm_forward"] == counts["tinyllama::rmsnorm_backward"] == 2 * layers + 1
    assert counts["tinyllama::rope"] == 2 * layers
    assert counts["tinyllama::flash_attention_forward"] == counts["tinyllama::flash_attention_backward"] == layers


def test_the_profiler_names_the_dispatched_operators(config, tokens):
    """Traced or counted, V3 goes through the registered operators, which the profiler lists too."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    v3 = build("v3", config).to(DEVICE)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with FlopCounterMode(display=False):
            logits_and_grads(v3, tokens)
    names = {event.key for event in prof.key_averages()}
    assert WANTED <= names, WANTED - names


def _opcheck_cases():
    g = torch.Generator().manual_seed(5)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(DEVICE)

    x, w = r(3, 5, 24), 1 + 0.1 * r(24)
    y, rstd = torch.ops.tinyllama.rmsnorm_forward(x, w, 1e-5, None)
    angles = r(11, 8)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    q, k, v = r(1, 4, 19, 16), r(1, 2, 19, 16), r(1, 2, 19, 16)
    out, lse = torch.ops.tinyllama.flash_attention_forward(q, k, v, True, None)
    gu = r(2, 7, 2 * 20)
    return {
        "rmsnorm_forward": (x.requires_grad_(), w.requires_grad_(), 1e-5, None),
        "rmsnorm_backward": (r(3, 5, 24), x.detach(), w.detach(), rstd),
        "rope": (r(2, 3, 9, 16).requires_grad_(), cos, sin, False),
        "swiglu_forward": (r(4, 30).requires_grad_(), r(4, 30).requires_grad_()),
        "swiglu_backward": (r(4, 30), r(4, 30), r(4, 30)),
        "swiglu_packed_forward": (gu.requires_grad_(),),
        "swiglu_packed_backward": (r(2, 7, 20), gu.detach()),
        "flash_attention_forward": (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), True, None),
        "flash_attention_backward": (r(1, 4, 19, 16), q.detach(), k.detach(), v.detach(), out, lse, True, None),
    }


@pytest.mark.parametrize("name", OPS)
def test_opcheck(name):
    args = _opcheck_cases()[name]
    torch.library.opcheck(getattr(torch.ops.tinyllama, name).default, args)


def test_operator_and_function_agree():
    """The registered operator (with its autograd) and the eager Function give the same values."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 13, 16, generator=g).to(DEVICE).requires_grad_() for _ in range(3))
    eager = kernels.flash_attention(q, k, v)
    grads = torch.autograd.grad(eager.sum(), (q, k, v))
    op_out = torch.ops.tinyllama.flash_attention_forward(q, k, v, True, None)[0]
    op_grads = torch.autograd.grad(op_out.sum(), (q, k, v))
    torch.testing.assert_close(op_out, eager, rtol=0, atol=0)
    for a, b in zip(op_grads, grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
