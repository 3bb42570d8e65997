"""Notebook 00's matrix-size sweep: one matrix product timed alone and back to back, for growing ``n``.

A product timed alone from an idle device costs its launch (the host call, the driver, the device
starting the kernel: tens of microseconds on a GPU) plus its work. Back to back, the next launch
overlaps the running kernel, and the time per call is the work alone, unless the host cannot issue
calls as fast as the device finishes them. Comparing the two tells where a single call is
launch-bound and from which size on the device is busy with the work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch

from tinyllama import device as dev
from tinyllama.config import DTYPES
from tinyllama.timing import CallTimes, time_single_and_back_to_back

Regime = Literal["launch-bound", "launch visible", "device busy", "no launch (CPU)"]

# A single call at least this many times its back-to-back time (their p10-p90 bands apart) spends most
# of its time on the launch, not on the work.
LAUNCH_BOUND_FACTOR = 2.0
# Back to back, the device waited for the host when issuing a call took at least this share of the
# time per call (the share inference.launch uses for a whole network's iteration).
ISSUE_BOUND_RATIO = 0.8


@dataclass
class SweepPoint:
    """One size of the sweep: ``n`` and its :class:`~tinyllama.timing.CallTimes` (ms per product)."""

    n: int
    precision: str
    times: CallTimes
    on_gpu: bool

    @property
    def flops(self) -> float:
        return 2.0 * self.n**3

    @property
    def single_tflops(self) -> float:
        return self.flops / (self.times.single.median * 1e-3) / 1e12

    @property
    def back_to_back_tflops(self) -> float:
        return self.flops / (self.times.back_to_back.median * 1e-3) / 1e12

    @property
    def single_over_back_to_back(self) -> float:
        """Median single-call time / median back-to-back time per call."""
        return self.times.single.median / self.times.back_to_back.median

    @property
    def regime(self) -> Regime:
        """``launch-bound``: the single call takes at least :data:`LAUNCH_BOUND_FACTOR` x the back-to-back
        time and the two bands are apart; ``device busy``: the bands overlap (the launch is lost in the
        noise of the work); ``launch visible``: apart, but by less than the factor. On a CPU the host
        computes each product itself: ``no launch (CPU)``."""
        if not self.on_gpu:
            return "no launch (CPU)"
        single, chained = self.times.single, self.times.back_to_back
        if single.p10 <= chained.p90:
            return "device busy"
        return "launch-bound" if self.single_over_back_to_back >= LAUNCH_BOUND_FACTOR else "launch visible"

    @property
    def issue_bound(self) -> bool:
        """Back to back, the host's issuing set the pace (on a GPU only; on a CPU the host does the work)."""
        return self.on_gpu and self.times.issue.median >= ISSUE_BOUND_RATIO * self.times.back_to_back.median


def sweep(precision: str, sizes: Sequence[int], device: torch.device, warmup: int = 3, repeat: int = 10,
          target_ms: float = 2.0) -> list[SweepPoint]:
    """Time an ``n x n`` by ``n x n`` product at ``precision`` for each ``n`` of ``sizes``, alone and back
    to back (:func:`tinyllama.timing.time_single_and_back_to_back`)."""
    if precision not in DTYPES:
        raise ValueError(f"unknown precision {precision!r}: use one of {sorted(DTYPES)}")
    if not sizes or min(sizes) < 1:
        raise ValueError(f"give matrix sizes of at least 1 (got {list(sizes)})")
    points = []
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"  # as tinyllama.costs.ceilings measures the rate
    try:
        for n in sorted(sizes):
            a = torch.randn(n, n, device=device, dtype=DTYPES[precision])
            b = torch.randn(n, n, device=device, dtype=DTYPES[precision])
            times = time_single_and_back_to_back(lambda: torch.mm(a, b), device, warmup=warmup, repeat=repeat,
                                                 target_ms=target_ms)
            points.append(SweepPoint(n, precision, times, device.type == "cuda"))
            del a, b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    dev.free_memory(device)
    return points


def half_rate_n(points: Sequence[SweepPoint], back_to_back: bool = True) -> int:
    """The smallest ``n`` whose rate reaches half the largest ``n``'s rate (back to back, or single)."""
    rate = (lambda p: p.back_to_back_tflops) if back_to_back else (lambda p: p.single_tflops)
    top = rate(max(points, key=lambda p: p.n))
    return min(p.n for p in points if rate(p) >= top / 2)


def _sizes(points: Sequence[SweepPoint]) -> str:
    return ", ".join(str(p.n) for p in points)


def lessons(points: Sequence[SweepPoint]) -> list[str]:
    """The sweep's lesson in sentences, each from the measured points: where the single call is
    launch-bound, where the device is busy, and where even back to back the host set the pace."""
    if not points:
        raise ValueError("no sweep points: run the sweep first")
    if not points[0].on_gpu:
        ratios = ", ".join(f"{p.single_over_back_to_back:.2f}x" for p in points)
        return [f"On a CPU the host computes each product itself: there is no launch to overlap, and a single "
                f"call over back to back is {ratios} for n = {_sizes(points)}. On a GPU this cell shows which "
                "sizes pay mostly for their launch."]
    out = []
    bound = [p for p in points if p.regime == "launch-bound"]
    visible = [p for p in points if p.regime == "launch visible"]
    busy = [p for p in points if p.regime == "device busy"]
    if bound:
        out.append(f"Launch-bound single calls at n = {_sizes(bound)}: alone, a product took "
                   f"{min(p.times.single.median for p in bound) * 1e3:.3g}-{max(p.times.single.median for p in bound) * 1e3:.3g} us, "
                   f"back to back {min(p.times.back_to_back.median for p in bound) * 1e3:.3g}-"
                   f"{max(p.times.back_to_back.median for p in bound) * 1e3:.3g} us "
                   f"({min(p.single_over_back_to_back for p in bound):.3g}-{max(p.single_over_back_to_back for p in bound):.3g}x "
                   "less): the single call's time there is mostly the launch, not the work, and its rate says "
                   "nothing about how well the device computes.")
    else:
        out.append(f"No size of the sweep has a single call at {LAUNCH_BOUND_FACTOR:g}x its back-to-back time or "
                   "more: the launch is not what sets these times.")
    if visible:
        out.append(f"At n = {_sizes(visible)} the launch is visible but not dominant: a single call takes "
                   + ", ".join(f"{p.single_over_back_to_back:.2f}x" for p in visible) + " its back-to-back time.")
    if busy:
        out.append(f"The device is busy with the work at n = {_sizes(busy)}: single and back-to-back times agree "
                   "within their spreads (p10-p90), so the launch is lost in the work.")
    issue = [p for p in points if p.issue_bound]
    if issue:
        out.append(f"Even back to back, the host set the pace at n = {_sizes(issue)}: issuing one call took "
                   + ", ".join(f"{p.times.issue.median * 1e3:.3g}" for p in issue)
                   + " us of the " + ", ".join(f"{p.times.back_to_back.median * 1e3:.3g}" for p in issue)
                   + " us per call, so the device's own time per product is lower still and those rates are lower "
                   "bounds.")
    return out
