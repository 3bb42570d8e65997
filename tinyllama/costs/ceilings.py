"""Measured ceilings of the current device: the roofs of the roofline.

A datasheet peak is a promise; these are what this device actually does with a large matrix
multiply (compute roof, per precision) and a large device-to-device copy (memory roof).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tinyllama import device as dev
from tinyllama.config import DTYPES, PRECISIONS
from tinyllama.timing import Stats, time_callable


@dataclass
class Ceiling:
    """One measured rate: ``value`` in TFLOP/s (matmul) or TB/s (copy)."""

    kind: str  # "matmul" or "copy"
    precision: str
    value: float
    unit: str
    size: int
    time: Stats

    @property
    def spread(self) -> tuple[float, float]:
        """The rate's p10-p90 band: the same work over the p90 and the p10 of its timings."""
        return self.value * self.time.median / self.time.p90, self.value * self.time.median / self.time.p10


def measure_matmul_tflops(
    precision: str = "bf16", n: int | None = None, device: torch.device | str | None = None,
    repeat: int = 10,
) -> Ceiling:
    """TFLOP/s of an ``n x n x n`` matrix multiply at ``precision`` (2 n^3 FLOPs per product).

    ``n`` defaults to 8192 on a GPU and 512 on the CPU, large enough to be compute bound.
    """
    if precision not in DTYPES:
        raise ValueError(f"unknown precision {precision!r}: use one of {sorted(DTYPES)}")
    device = dev.get_device(None if device is None else str(device))
    n = n or (8192 if device.type == "cuda" else 512)
    dtype = DTYPES[precision]
    if device.type == "cpu" and dtype == torch.float16:
        dtype = torch.float32 if not _cpu_supports(torch.float16) else dtype
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        stats = time_callable(lambda: torch.mm(a, b), device, warmup=3, repeat=repeat)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    tflops = 2 * n**3 / (stats.median * 1e-3) / 1e12
    return Ceiling("matmul", precision, tflops, "TFLOP/s", n, stats)


def _cpu_supports(dtype: torch.dtype) -> bool:
    try:
        torch.mm(torch.ones(2, 2, dtype=dtype), torch.ones(2, 2, dtype=dtype))
        return True
    except RuntimeError:
        return False


def measure_copy_tbs(
    nbytes: int | None = None, device: torch.device | str | None = None, repeat: int = 10
) -> Ceiling:
    """TB/s of a device-to-device copy, counting bytes read plus bytes written.

    ``nbytes`` defaults to 1 GiB on a GPU (far larger than any cache) and 64 MiB on the CPU.
    """
    device = dev.get_device(None if device is None else str(device))
    nbytes = nbytes or (2**30 if device.type == "cuda" else 2**26)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    stats = time_callable(lambda: dst.copy_(src), device, warmup=3, repeat=repeat)
    tbs = 2 * src.numel() * 4 / (stats.median * 1e-3) / 1e12
    return Ceiling("copy", "any", tbs, "TB/s", nbytes, stats)


def measure_ceilings(
    device: torch.device | str | None = None, precisions: tuple[str, ...] = PRECISIONS,
    matmul_size: int | None = None, copy_bytes: int | None = None,
) -> dict[str, Ceiling]:
    """Matmul ceilings for each precision and the copy bandwidth, keyed ``"matmul_bf16"``, ``"copy"``."""
    out = {f"matmul_{p}": measure_matmul_tflops(p, matmul_size, device) for p in precisions}
    out["copy"] = measure_copy_tbs(copy_bytes, device)
    return out
