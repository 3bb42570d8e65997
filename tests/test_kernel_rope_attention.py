"""RoPE and flash attention in one autograd Function (V3's attention) against the plain formula and
against the two kernels composed: output and the fused projection's gradient, strided projections,
launches per call, and bad input.

On a CPU the kernels run in Triton's interpreter in fp32 at small shapes that are not powers of two;
with a GPU, compiled at the workshop's shapes in bf16 as well.
"""

import pytest
import torch
from conftest import DEVICE

# tinyllama.kernels first: on a CPU it chooses Triton's interpreter before any kernel is defined.
from tinyllama import kernels
from tinyllama.kernels import max_relative_error
from tinyllama.kernels._triton import KernelTolerance, Launcher, compare_with_reference
from tinyllama.models.v1_baseline import RotaryEmbedding

# (batch, seq, heads, kv_heads, head_dim)
SHAPES = ([(4, 512, 8, 4, 128), (2, 1000, 8, 8, 64)] if DEVICE == "cuda"
          else [(2, 37, 4, 2, 16), (1, 21, 3, 3, 32), (2, 9, 2, 1, 16)])
DTYPES = [torch.float32, torch.bfloat16] if DEVICE == "cuda" else [torch.float32]


def _tables(head_dim, max_seq):
    module = RotaryEmbedding(head_dim, max_seq).to(DEVICE)
    return module.cos, module.sin


def _qkv(batch, seq, heads, kv_heads, head_dim, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    width = (heads + 2 * kv_heads) * head_dim
    return torch.randn(batch, seq, width, generator=g).to(DEVICE, dtype).requires_grad_()


def _composed(qkv, cos, sin, heads, kv_heads, causal=True):
    """The two kernels one after the other, as V2's project_qkv would call them."""
    batch, seq, width = qkv.shape
    d = width // (heads + 2 * kv_heads)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q, k, v = (t.view(batch, seq, -1, d).transpose(1, 2) for t in (q, k, v))
    return kernels.flash_attention(kernels.rope(q, cos, sin), kernels.rope(k, cos, sin), v, causal=causal)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_output_and_projection_gradient_match_the_reference(shape, dtype, causal):
    batch, seq, heads, kv_heads, d = shape
    qkv = _qkv(*shape, dtype=dtype, seed=seq)
    cos, sin = _tables(d, seq + 5)  # tables longer than the sequence
    errors = compare_with_reference(kernels.rope_attention, kernels.rope_attention_reference, [qkv], ["qkv"],
                                    cos=cos, sin=sin, heads=heads, kv_heads=kv_heads, causal=causal)
    assert set(errors) == {"out", "dqkv"}


@pytest.mark.parametrize("shape", SHAPES[:2], ids=str)
def test_it_computes_what_the_two_kernels_compute_one_after_the_other(shape):
    batch, seq, heads, kv_heads, d = shape
    cos, sin = _tables(d, seq)
    qkv = _qkv(*shape, seed=1)
    fused = kernels.rope_attention(qkv, cos, sin, heads, kv_heads)
    composed = _composed(qkv, cos, sin, heads, kv_heads)
    assert fused.shape == composed.shape == (batch, heads, seq, d)
    assert fused.transpose(1, 2).is_contiguous()  # merging the heads is a view
    upstream = torch.randn_like(fused)
    (g_fused,) = torch.autograd.grad(fused, qkv, upstream)
    (g_composed,) = torch.autograd.grad(composed, qkv, upstream)
    tol = KernelTolerance().fp32 * 10  # the same kernels; only the order of the gradient's assembly differs
    assert max_relative_error(fused, composed) <= tol
    assert g_fused.shape == qkv.shape and max_relative_error(g_fused, g_composed) <= tol


def test_a_projection_with_a_strided_last_dimension_gives_the_same_result():
    """Stage 2 of the debugging exercise hands over (W x^T)^T: a transposed view of the projection."""
    batch, seq, heads, kv_heads, d = SHAPES[0]
    cos, sin = _tables(d, seq)
    qkv = _qkv(*SHAPES[0], seed=2)
    strided = qkv.detach().reshape(batch * seq, -1).t().contiguous().t().view(qkv.shape).requires_grad_()
    assert strided.stride(-1) != 1
    upstream = torch.randn(batch, heads, seq, d, device=DEVICE)
    out, out_strided = (kernels.rope_attention(t, cos, sin, heads, kv_heads) for t in (qkv, strided))
    grads = [torch.autograd.grad(o, t, upstream)[0] for o, t in ((out, qkv), (out_strided, strided))]
    assert max_relative_error(out_strided, out) <= 1e-6
    assert max_relative_error(grads[1], grads[0]) <= 1e-6


def test_one_rope_launch_each_way_instead_of_two(monkeypatch):
    launches: dict[str, int] = {}
    original = Launcher.__call__

    def counting(self, grid, *args, **meta):
        launches[self.name] = launches.get(self.name, 0) + 1
        return original(self, grid, *args, **meta)

    monkeypatch.setattr(Launcher, "__call__", counting)
    batch, seq, heads, kv_heads, d = SHAPES[0]
    cos, sin = _tables(d, seq)
    counts = {}
    for name, fn in (("fused", kernels.rope_attention), ("composed", _composed)):
        launches.clear()
        out = fn(_qkv(*SHAPES[0]), cos, sin, heads, kv_heads)
        forward = dict(launches)
        out.backward(torch.ones_like(out))
        counts[name] = (forward, {k: v - forward.get(k, 0) for k, v in launches.items()})
    (fwd, bwd), (fwd_composed, bwd_composed) = counts["fused"], counts["composed"]
    assert fwd["_rope_kernel"] == 1 and fwd_composed["_rope_kernel"] == 2
    assert bwd["_rope_kernel"] == 1 and bwd_composed["_rope_kernel"] == 2
    assert sum(fwd.values()) == 2 and sum(bwd.values()) == 3  # + flash attention's forward, its two backward


def test_bad_input_gets_a_clear_error():
    cos, sin = _tables(16, 8)
    with pytest.raises(ValueError, match="does not split into 4 query and 2 x 2"):
        kernels.rope_attention(torch.randn(1, 8, 100, device=DEVICE), cos, sin, 4, 2)
    with pytest.raises(ValueError, match="expected \\(batch, seq, width\\)"):
        kernels.rope_attention(torch.randn(8, 128, device=DEVICE), cos, sin, 4, 2)
    with pytest.raises(ValueError, match="shorter than the sequence length"):
        kernels.rope_attention(torch.randn(1, 9, 128, device=DEVICE), cos, sin, 4, 2)
