"""RoPE and flash attention over a fused QKV projection, in one autograd Function: V3's attention.

``rope_attention(qkv, cos, sin, heads, kv_heads)`` computes ``flash_attention(rope(q), rope(k), v)``
for ``q``, ``k`` and ``v`` the head views of ``qkv``, the fused projection's output of shape (batch,
seq, (heads + 2 kv_heads) * head_dim). The same kernels, composed with fewer pieces around them:

- forward: in every token's row of ``qkv`` the q heads and the k heads are neighbours, so one RoPE
  launch rotates them together, as one (batch, heads + kv_heads, seq, head_dim) view; the flash
  attention forward then reads q, k and v where they lie;
- backward: the flash attention backward writes dq, dk and dv straight into the rows of one
  gradient of ``qkv``'s shape, and one RoPE launch rotates its q and k heads back, in place.

Piece by piece (V2's ``project_qkv`` with ``rope`` and ``flash_attention``) the same work takes two
RoPE launches each way, a ``cat`` kernel that copies dq, dk and dv into the projection's gradient,
and an autograd node for every split, view and transpose between them: host time on every step of
eager V3, which launches from Python (``benchmarks/history/launch_costs.md``, issue 21).

Traced or counted calls (``torch.compile``, ``FlopCounterMode``; see ``tinyllama.kernels._ops``)
take the composed path, whose registered operators compute the same.
"""

from __future__ import annotations

import torch

from tinyllama.kernels import _ops
from tinyllama.kernels._triton import check_tensors
from tinyllama.kernels.flash_attention import (
    flash_attention, flash_attention_backward, flash_attention_forward, flash_attention_reference,
)
from tinyllama.kernels.rope import rope, rope_backward, rope_forward, rope_reference


def _heads(qkv: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
    """``qkv`` (batch, seq, (heads + 2 kv_heads) * head_dim) as a (batch, heads + 2 kv_heads, seq,
    head_dim) view: q heads first, then k, then v (V2's fused weight order)."""
    check_tensors("rope_attention", qkv)
    if qkv.dim() != 3:
        raise ValueError(f"rope_attention: qkv has shape {tuple(qkv.shape)}; expected (batch, seq, width), the "
                         "fused QKV projection's output")
    batch, seq, width = qkv.shape
    total = heads + 2 * kv_heads
    if heads < 1 or kv_heads < 1 or width % total:
        raise ValueError(f"rope_attention: a width of {width} does not split into {heads} query and 2 x {kv_heads} "
                         "key/value heads of one size; pass the model's num_heads and num_kv_heads")
    return qkv.view(batch, seq, total, width // total).transpose(1, 2)


def _split(all_heads: torch.Tensor, heads: int, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return all_heads[:, :heads], all_heads[:, heads:heads + kv_heads], all_heads[:, heads + kv_heads:]


class RoPEAttentionFunction(torch.autograd.Function):
    """Autograd wrapper (see the module docstring): saves the rotated q and k (one tensor), v (a
    view of ``qkv``), the output, the log-sum-exp and the tables."""

    @staticmethod
    def forward(ctx, qkv, cos, sin, heads, kv_heads, causal):  # type: ignore[override]
        all_heads = _heads(qkv, heads, kv_heads)
        with _ops.named("rope"):
            qk = rope_forward(all_heads[:, :heads + kv_heads], cos, sin)
        q, k, v = qk[:, :heads], qk[:, heads:], all_heads[:, heads + kv_heads:]
        with _ops.named("flash_attention_forward"):
            out, lse = flash_attention_forward(q, k, v, causal)
        ctx.save_for_backward(qk, v, out, lse, cos, sin)
        ctx.heads, ctx.causal, ctx.qkv_shape = heads, causal, qkv.shape
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        qk, v, out, lse, cos, sin = ctx.saved_tensors
        heads, kv_heads = ctx.heads, v.shape[1]
        batch, seq, width = ctx.qkv_shape
        # The gradient of qkv, its rows in qkv's order; its head views receive dq, dk and dv.
        grad = torch.empty((batch, seq, heads + 2 * kv_heads, qk.shape[-1]), dtype=qk.dtype, device=qk.device)
        grad_heads = grad.transpose(1, 2)
        with _ops.named("flash_attention_backward"):
            flash_attention_backward(dout, qk[:, :heads], qk[:, heads:], v, out, lse, ctx.causal,
                                     grads=_split(grad_heads, heads, kv_heads))
        dqk = grad_heads[:, :heads + kv_heads]
        with _ops.named("rope"):
            rope_backward(dqk, cos, sin, out=dqk)  # in place: rotate back by minus the angle
        return grad.view(batch, seq, width), None, None, None, None, None


def rope_attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int,
                   causal: bool = True) -> torch.Tensor:
    """Attention of the fused projection ``qkv`` (batch, seq, (heads + 2 kv_heads) * head_dim) with
    rotary embeddings on q and k: ``flash_attention(rope(q), rope(k), v)``, differentiable in ``qkv``.

    ``cos`` and ``sin`` are the fp32 (max_seq_len, head_dim) tables of ``RotaryEmbedding``. The
    result is (batch, heads, seq, head_dim), stored (batch, seq, heads, head_dim) as
    ``flash_attention``'s, so merging the heads for the output projection is a view."""
    if _ops.dispatch_through_ops():
        q, k, v = _split(_heads(qkv, heads, kv_heads), heads, kv_heads)
        return flash_attention(rope(q, cos, sin), rope(k, cos, sin), v, causal=causal)
    return RoPEAttentionFunction.apply(qkv, cos, sin, heads, kv_heads, causal)


def rope_attention_reference(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int,
                             causal: bool = True) -> torch.Tensor:
    """The same function in plain PyTorch (V1's rotary formula and attention), for tests."""
    q, k, v = _split(_heads(qkv, heads, kv_heads), heads, kv_heads)
    return flash_attention_reference(rope_reference(q, cos, sin), rope_reference(k, cos, sin), v, causal=causal)
