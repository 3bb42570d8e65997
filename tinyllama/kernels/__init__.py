"""Triton kernels of TinyLLaMA V3, each with forward and backward:

- ``rmsnorm(x, weight, eps)``: RMSNorm over the last dimension;
- ``flash_attention(q, k, v, causal=True)``: FlashAttention-2 style attention with grouped-query
  heads, q of shape (batch, heads, seq, head_dim), k and v of shape (batch, kv_heads, seq, head_dim);
- ``swiglu(gate, up)``: ``silu(gate) * up``; ``swiglu_packed(gate_up)`` for gate and up side by side
  in one tensor (a fused projection's output), whose gradient comes back as one tensor;
- ``rope(x, cos, sin)``: rotary position embedding of x (batch, heads, seq, head_dim);
- ``rope_attention(qkv, cos, sin, heads, kv_heads)``: ``flash_attention(rope(q), rope(k), v)`` of a fused
  QKV projection's output in one autograd Function (one RoPE launch each way, the gradient written
  as one tensor): V3's attention.

Each module holds the kernels, their launchers, the autograd Function and a PyTorch reference.
On a machine without a GPU they run through Triton's interpreter (slowly, but exactly).
"""

from __future__ import annotations

import os

from tinyllama import device as _device

# Triton's @triton.jit decides between compiling and interpreting when the decorator runs, that is
# when the kernel modules below are imported. Without a GPU, choose the interpreter first (unless
# the user has already chosen), so the same code runs on a laptop and in CI.
if _device.backend() == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton  # noqa: F401
except ImportError as _error:  # pragma: no cover - Triton is a dependency on Linux
    raise ImportError(
        "tinyllama.kernels needs Triton (pip install triton; on AMD use the ROCm build that comes with "
        "PyTorch): V1, V2 and V4 work without it"
    ) from _error

from tinyllama.kernels._triton import INTERPRET, KernelMismatch, KernelTolerance, assert_close, max_relative_error
from tinyllama.kernels.flash_attention import flash_attention, flash_attention_reference
from tinyllama.kernels.rmsnorm import rmsnorm, rmsnorm_reference
from tinyllama.kernels.rope import rope, rope_reference
from tinyllama.kernels.rope_attention import rope_attention, rope_attention_reference
from tinyllama.kernels.swiglu import swiglu, swiglu_packed, swiglu_packed_reference, swiglu_reference

__all__ = [
    "INTERPRET", "KernelMismatch", "KernelTolerance", "assert_close", "max_relative_error",
    "flash_attention", "flash_attention_reference", "rmsnorm", "rmsnorm_reference",
    "rope", "rope_reference", "rope_attention", "rope_attention_reference",
    "swiglu", "swiglu_packed", "swiglu_packed_reference", "swiglu_reference",
]
