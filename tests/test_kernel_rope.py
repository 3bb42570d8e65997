"""The Triton RoPE against V1's formula: output and input gradient, strided views, the V1 module itself.

On a CPU the kernel runs in Triton's interpreter at small shapes (head sizes whose half is not a
power of two, a sequence of one token); with a GPU, compiled at the workshop's shapes.
"""

import pytest
import torch
from conftest import DEVICE

# tinyllama.kernels first: on a CPU it chooses Triton's interpreter before any kernel is defined.
from tinyllama.kernels import KernelMismatch, max_relative_error
from tinyllama.kernels._triton import compare_with_reference
from tinyllama.kernels.rope import rope, rope_reference
from tinyllama.models.v1_baseline import RotaryEmbedding

# (batch, heads, seq, head_dim)
SHAPES = ([(16, 8, 512, 128), (2, 4, 1000, 64)] if DEVICE == "cuda"
          else [(2, 3, 37, 64), (1, 2, 5, 96), (2, 1, 9, 40), (3, 2, 1, 64)])
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _tables(head_dim, max_seq):
    """V1's fp32 cos and sin buffers, (max_seq, head_dim)."""
    module = RotaryEmbedding(head_dim, max_seq).to(DEVICE)
    return module.cos, module.sin


def _input(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE, dtype).requires_grad_()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_and_gradient_match_the_reference(shape, dtype):
    x = _input(shape, dtype, seed=sum(shape))
    # Tables longer than the sequence: only the first seq rows may be used.
    cos, sin = _tables(shape[-1], shape[2] + 7)
    errors = compare_with_reference(rope, rope_reference, [x], ["x"], cos=cos, sin=sin)
    assert set(errors) == {"out", "dx"}


def test_output_and_gradient_are_heads_contiguous_views():
    """Shape and dtype of x, memory ordered (batch, seq, heads, head_dim) for the output and for the
    gradient, whatever the layout of x and of the upstream gradient."""
    x = _input((2, 3, 5, 16), torch.bfloat16, seed=1)
    cos, sin = _tables(16, 5)
    out = rope(x, cos, sin)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert not out.is_contiguous() and out.transpose(1, 2).is_contiguous()
    (dx,) = torch.autograd.grad(out, x, torch.randn(x.shape, device=DEVICE, dtype=x.dtype))
    assert dx.shape == x.shape and dx.dtype == x.dtype and dx.transpose(1, 2).is_contiguous()


def test_q_and_k_views_of_one_fused_projection():
    """q and k as (batch, heads, seq, head_dim) views of one (batch, seq, Hq*D + 2*Hkv*D) projection:
    tokens further apart than their heads, heads D apart, and an offset for k. The upstream gradient
    is contiguous in (batch, heads, seq, head_dim), unlike the output."""
    batch, seq, hq, hkv, d = (4, 512, 8, 2, 128) if DEVICE == "cuda" else (2, 11, 3, 2, 32)
    g = torch.Generator().manual_seed(2)
    fused = torch.randn(batch, seq, (hq + 2 * hkv) * d, generator=g).to(DEVICE).requires_grad_()
    q = fused[..., :hq * d].view(batch, seq, hq, d).transpose(1, 2)
    k = fused[..., hq * d:(hq + hkv) * d].view(batch, seq, hkv, d).transpose(1, 2)
    cos, sin = _tables(d, seq)
    for view, heads in ((q, hq), (k, hkv)):
        assert not view.is_contiguous() and view.stride(-1) == 1 and view.stride(2) == (hq + 2 * hkv) * d
        grad_out = torch.randn(batch, heads, seq, d, generator=g).to(DEVICE)
        compare_with_reference(rope, rope_reference, [view], ["x"], grad_out=grad_out, cos=cos, sin=sin)


def test_last_dimension_not_unit_stride():
    """A view whose head dimension is strided is copied once, and still rotated correctly."""
    batch, heads, seq, d = 2, 3, 7, 32
    g = torch.Generator().manual_seed(3)
    base = torch.randn(batch, heads, d, seq, generator=g).to(DEVICE).requires_grad_()
    x = base.transpose(-1, -2)
    assert x.stride(-1) == seq
    cos, sin = _tables(d, seq)
    compare_with_reference(rope, rope_reference, [x], ["x"], cos=cos, sin=sin)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_equals_the_v1_rotary_embedding_module(dtype):
    batch, heads, seq, d = 2, 4, 30, 64
    module = RotaryEmbedding(d, max_seq_len=48).to(DEVICE)
    x = _input((batch, heads, seq, d), dtype, seed=4).detach()
    expected = module(x)
    # fp32: rounding only. bf16: V1 rounds the tables and each product to bf16, the kernel rounds
    # once at the end, so they may differ by a few bf16 ulps.
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    assert max_relative_error(rope(x, module.cos, module.sin), expected) <= tol


def test_rotating_back_by_minus_the_angle_returns_the_input():
    x = _input((2, 3, 20, 48), torch.float32, seed=5).detach()
    cos, sin = _tables(48, 20)
    rotated = rope(x, cos, sin)
    assert max_relative_error(rotated, x) > 0.1  # the rotation does move x ...
    assert max_relative_error(rope(rotated, cos, -sin), x) < 1e-6  # ... and its inverse undoes it


def test_a_wrong_formula_is_caught():
    """The comparison must be able to fail on the output and on the gradient alone."""
    x = _input((1, 2, 9, 32), torch.float32, seed=6)
    cos, sin = _tables(32, 9)
    with pytest.raises(KernelMismatch, match="output"):
        compare_with_reference(lambda a, cos, sin: rope(a, cos, -sin), rope_reference, [x], ["x"], cos=cos, sin=sin)

    def wrong_backward(a, cos, sin):
        # Right value (the correction is exactly zero), but the gradient of a rotation by +angle,
        # that is a backward with the sign of sin flipped.
        flipped = rope(a, cos, -sin)
        return rope(a.detach(), cos, sin) + (flipped - flipped.detach())

    with pytest.raises(KernelMismatch, match="gradient of x"):
        compare_with_reference(wrong_backward, rope_reference, [x], ["x"], cos=cos, sin=sin)


def test_bad_inputs_give_a_clear_error():
    cos, sin = _tables(8, 4)
    with pytest.raises(ValueError, match="odd"):
        rope(torch.randn(1, 1, 2, 7, device=DEVICE), *_tables(7, 4))
    with pytest.raises(ValueError, match="shorter than the sequence length 5"):
        rope(torch.randn(1, 1, 5, 8, device=DEVICE), cos, sin)
    with pytest.raises(ValueError, match="4 dimensions"):
        rope(torch.randn(2, 3, 8, device=DEVICE), cos, sin)
    with pytest.raises(ValueError, match="do not match head_dim 16"):
        rope(torch.randn(1, 1, 2, 16, device=DEVICE), cos, sin)
    with pytest.raises(ValueError, match="same shape"):
        rope(torch.randn(1, 1, 2, 8, device=DEVICE), cos, sin[:3])
    with pytest.raises(ValueError, match="not supported"):
        rope(torch.ones(1, 1, 2, 8, dtype=torch.int32, device=DEVICE), cos, sin)
