"""Rotary position embedding (RoPE) in Triton, forward and backward in one pass each.

RoPE rotates each pair of channels ``(i, i + half)`` of a head vector by an angle that depends on
the token's position ``s`` and the pair ``i``. With ``x1, x2`` the two halves of the head vector and
``c, s`` the cosine and sine of the angles at that position (the first half of the tables held by
``tinyllama.models.v1_baseline.RotaryEmbedding``, whose two halves are equal):

    out1 = x1 * c - x2 * s
    out2 = x2 * c + x1 * s

which is V1's ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x2, x1)``. A rotation
is orthogonal, so the backward is the rotation by minus the angle, the same kernel with ``-s``:

    dx1 = dy1 * c + dy2 * s
    dx2 = dy2 * c - dy1 * s

It needs no saved activations, only the tables. Arithmetic is fp32 (the tables are fp32), the
result is stored in ``x``'s dtype.

Layout: ``x`` is (batch, heads, seq, head_dim) with any strides in the first three dimensions
(typically a transposed view of one fused QKV projection). The kernel sees ``batch * seq * heads``
rows of ``head_dim`` elements, ordered (batch, seq, heads) like the output, which is allocated as
(batch, seq, heads, head_dim) in memory and returned as its (batch, heads, seq, head_dim) view: each
token's heads are then contiguous, and the flash-attention kernel that reads it accepts any strides.
Only the first half of each table row is read, so the tables must have equal halves (as
``RotaryEmbedding`` builds them); ``rope_reference`` uses both halves.

Cost: the kernel reads ``x`` once and writes the output once (the tables are small and stay in
cache, each row of them shared by all heads of a token). PyTorch eager runs about half a dozen
elementwise kernels for the same formula (two table casts, ``neg``, ``cat``, two multiplications and
an addition), reading and writing tensors of ``x``'s size about five times each, and as many again
in the backward. The operation is bound by memory bandwidth, so the fused kernel is several times
faster.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tinyllama.kernels import _ops
from tinyllama.kernels._triton import (
    autotune, cdiv, check_tensors, configs, launcher, next_power_of_2, unit_last_stride,
)


def _row_configs() -> list[triton.Config]:
    # Rows per program x warps: the tile is small (a head vector is 64-128 elements), so few warps.
    gpu = [triton.Config({"BLOCK_M": m}, num_warps=w) for m in (1, 2, 4, 8, 16) for w in (1, 2, 4, 8)]
    return configs(gpu, triton.Config({"BLOCK_M": 4}, num_warps=1))


def _prune(configs_: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """Keep configurations that give each thread between 2 and 16 elements of a half tile: fewer
    leaves threads idle, more holds many rows in registers for nothing (the kernel does no reuse)."""
    block_half = kwargs["BLOCK_HALF"]
    kept = [c for c in configs_
            if 2 <= c.kwargs["BLOCK_M"] * block_half // (32 * c.num_warps) <= 16]
    return kept or configs_[:1]


@launcher
@autotune(_row_configs(), ["HALF"], _prune)
# M (the row count) and S (the sequence length) change from call to call without a recompile for
# each value; they only enter the index arithmetic. HALF is a constexpr (one compile per head size):
# the column mask is then constant along a row when head_dim / 2 is a power of two, and the second
# half's offset is known, so both halves can be loaded as wide vectors (H200, bf16, 8 x 32 x 2048 x
# 128: the forward ran at 96% of the bandwidth of a plain copy).
@triton.jit(do_not_specialize=["M", "S"])
def _rope_kernel(X, COS, SIN, OUT, M, S, H,
                 stride_xb, stride_xh, stride_xs, stride_ob, stride_oh, stride_os, stride_cos, stride_sin,
                 HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, INVERSE: tl.constexpr, BLOCK_M: tl.constexpr):
    # Row r is (batch b, position s, head h) in the output's memory order; int32 suffices for the
    # row index (the launcher checks M), offsets are int64.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    h = rows % H
    token = rows // H
    pos = token % S
    b = token // S
    h64, pos64, b64 = h.to(tl.int64)[:, None], pos.to(tl.int64)[:, None], b.to(tl.int64)[:, None]
    cols = tl.arange(0, BLOCK_HALF)[None, :]
    mask = row_ok[:, None] & (cols < HALF)
    x_ptr = X + b64 * stride_xb + h64 * stride_xh + pos64 * stride_xs + cols
    o_ptr = OUT + b64 * stride_ob + h64 * stride_oh + pos64 * stride_os + cols
    x1 = tl.load(x_ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + HALF, mask=mask, other=0.0).to(tl.float32)
    # The tables' first half only: their second half repeats it.
    c = tl.load(COS + pos64 * stride_cos + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(SIN + pos64 * stride_sin + cols, mask=mask, other=0.0).to(tl.float32)
    if INVERSE:  # rotation by minus the angle: the backward
        s = -s
    tl.store(o_ptr, (x1 * c - x2 * s).to(OUT.dtype.element_ty), mask=mask)
    tl.store(o_ptr + HALF, (x2 * c + x1 * s).to(OUT.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------------------------------------
# Launchers
# ------------------------------------------------------------------------------------------------


def _check(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    check_tensors("rope", x, cos, sin)
    shape = x.shape
    if len(shape) != 4:
        raise ValueError(f"rope: x has shape {tuple(shape)}; expected 4 dimensions (batch, heads, seq, head_dim)")
    head_dim, seq = shape[3], shape[2]
    if head_dim % 2:
        raise ValueError(f"rope: head_dim {head_dim} is odd; RoPE rotates pairs of channels, so it must be even")
    table = cos.shape
    if table != sin.shape or cos.dtype != sin.dtype:
        raise ValueError(f"rope: cos {tuple(table)} {cos.dtype} and sin {tuple(sin.shape)} {sin.dtype} "
                         "must have the same shape and dtype")
    if len(table) != 2 or table[1] != head_dim:
        raise ValueError(f"rope: tables of shape {tuple(table)} do not match head_dim {head_dim}; "
                         "expected (max_seq_len, head_dim)")
    if table[0] < seq:
        raise ValueError(f"rope: tables have {table[0]} positions, shorter than the sequence length {seq}")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """Run the kernel on ``x`` (checked). The result goes to ``out`` if given (a tensor of ``x``'s
    shape and dtype with unit last stride; ``x`` itself rotates in place, as each program reads its
    rows before it writes them), else to a new tensor stored (batch, seq, heads, head_dim)."""
    x, cos, sin = unit_last_stride(x), unit_last_stride(cos), unit_last_stride(sin)
    B, H, S, D = x.shape
    M = B * S * H
    if M > 2 ** 31 - 16:  # room for the last block of rows
        raise ValueError(f"rope: {M} rows (batch * seq * heads) exceed the kernel's 32-bit row index")
    if out is None:  # (batch, heads, seq, head_dim) stored as (batch, seq, heads, head_dim), in one call
        out = torch.empty_strided((B, H, S, D), (S * H * D, D, H * D, 1), dtype=x.dtype, device=x.device)
        so = (S * H * D, D, H * D)
    else:
        if out.shape != x.shape or out.dtype != x.dtype or out.stride(-1) != 1:
            raise ValueError(f"rope: out must have x's shape {tuple(x.shape)} and dtype {x.dtype} with unit last "
                             f"stride, got {tuple(out.shape)} {out.dtype} strides {out.stride()}")
        so = out.stride()
    if M and D:
        def grid(meta: dict) -> tuple[int]:
            return (cdiv(M, meta["BLOCK_M"]),)

        sx = x.stride()
        _rope_kernel(grid, x, cos, sin, out, M, S, H, sx[0], sx[1], sx[2], so[0], so[1], so[2],
                     cos.stride(0), sin.stride(0), HALF=D // 2, BLOCK_HALF=next_power_of_2(D // 2), INVERSE=inverse)
    return out


def rope_forward(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` rotated by the angles of its positions (shape and dtype of ``x``)."""
    _check(x, cos, sin)
    return _rotate(x, cos, sin, inverse=False)


def rope_backward(dout: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """``dx`` for the upstream gradient ``dout``: ``dout`` rotated by minus the angles, into ``out``
    if given (``dout`` itself rotates in place; see ``_rotate``)."""
    _check(dout, cos, sin)
    return _rotate(dout, cos, sin, inverse=True, out=out)


class RoPEFunction(torch.autograd.Function):
    """Autograd wrapper: saves only the tables; the tables get no gradient."""

    @staticmethod
    def forward(ctx, x, cos, sin):  # type: ignore[override]
        ctx.save_for_backward(cos, sin)
        with _ops.named("rope"):
            return rope_forward(x, cos, sin)

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        cos, sin = ctx.saved_tensors
        with _ops.named("rope"):
            return rope_backward(dout, cos, sin), None, None


# The operator tinyllama::rope (see tinyllama.kernels._ops): what torch.compile, FlopCounterMode and
# the profiler see. Its gradient is the same operator with the inverse rotation.


def _rope_op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool) -> torch.Tensor:
    _check(x, cos, sin)
    return _rotate(x, cos, sin, inverse)


rope_op = _ops.register("rope", _rope_op, schema="(Tensor x, Tensor cos, Tensor sin, bool inverse) -> Tensor")


def _setup_context(ctx, inputs, output) -> None:
    _x, cos, sin, inverse = inputs
    ctx.save_for_backward(cos, sin)
    ctx.inverse = inverse


def _op_backward(ctx, dout):
    cos, sin = ctx.saved_tensors
    return torch.ops.tinyllama.rope(dout, cos, sin, not ctx.inverse), None, None, None


rope_op.register_autograd(_op_backward, setup_context=_setup_context)
_ops.register_flops(rope_op, _ops.no_flops)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of ``x`` (batch, heads, seq, head_dim), differentiable in ``x``.

    ``cos`` and ``sin`` are the fp32 (max_seq_len, head_dim) tables of ``RotaryEmbedding``, whose two
    halves are equal; position ``s`` uses row ``s``. ``x`` may be any view whose last dimension has
    unit stride (otherwise it is copied once). The result has ``x``'s shape and dtype and is a
    (batch, heads, seq, head_dim) view of memory ordered (batch, seq, heads, head_dim).
    Eager calls go straight to the autograd Function; traced or counted ones through the
    operator ``torch.ops.tinyllama.rope`` (see ``tinyllama.kernels._ops``).
    """
    if _ops.dispatch_through_ops():
        return torch.ops.tinyllama.rope(x, cos, sin, False)
    return RoPEFunction.apply(x, cos, sin)


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The same function in plain PyTorch (the V1 model's formula, computed in ``x``'s dtype)."""
    seq, half = x.shape[-2], x.shape[-1] // 2
    cos, sin = cos[:seq].to(x.dtype), sin[:seq].to(x.dtype)
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
