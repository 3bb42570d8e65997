"""The names of run settings that every harness shares (TinyLLaMA's and the inference benchmark's):
the training precisions with their TF32 and autocast switches, and ``torch.compile``'s modes."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

# fp32 is real fp32 (TF32 off); tf32 lets fp32 matmuls use TF32 tensor cores; bf16 and fp16 are
# autocast with fp32 weights.
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
# The dtype a tensor of each precision is stored in (tf32 is fp32 storage, rounded inside the matmul).
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# The modes that replay each compiled block as a CUDA (HIP) graph: one launch instead of dozens.
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def check_precision(precision: str) -> None:
    """Raise ``ValueError`` unless ``precision`` is one of ``PRECISIONS``."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: choose one of {', '.join(PRECISIONS)}")


def set_matmul_precision(precision: str) -> None:
    """fp32 means real fp32 (TF32 off); tf32 lets fp32 matmuls use TF32 tensor cores."""
    allow = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow


def autocast_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Mixed precision for bf16/fp16 (weights stay fp32); nothing for fp32/tf32."""
    if precision in ("bf16", "fp16"):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        return torch.autocast(device_type=device.type, dtype=dtype)
    return contextlib.nullcontext()
