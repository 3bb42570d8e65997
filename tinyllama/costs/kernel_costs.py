"""What a memory-bound kernel costs: the bytes it must move, the bandwidth that gives, its time on
the device, and what the host spends launching it.

A row-wise kernel such as RMSNorm does a handful of operations per byte, so its best possible time is
the bytes it must move divided by the memory bandwidth (:func:`rmsnorm_forward_bytes`,
:func:`achieved_tbs`). Whether that time is what a program sees depends on the host: each launch of a
Triton kernel costs Python and the driver some microseconds (:func:`host_us_per_call`), and a kernel
whose device time (:func:`device_ms`) is shorter than its launch leaves the GPU idle between calls
(:func:`launch_bound_bytes` is where the two meet).

On a CPU, Triton kernels run through the interpreter: every time here is then the interpreter's and
says nothing about a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tinyllama import device as dev
from tinyllama.timing import Stats, graph_replay, issue_verdict, require_unprofiled, summarize, time_callable


def rmsnorm_forward_bytes(rows: int, width: int, itemsize: int, weight_itemsize: int | None = None) -> int:
    """The fewest bytes an RMSNorm forward over ``rows`` rows of ``width`` elements must move: read
    x once, read the weight once, write y once (``itemsize`` bytes per element of x and y,
    ``weight_itemsize`` per weight, default the same). Statistics kept for a backward are not counted."""
    if min(rows, width, itemsize) < 0:
        raise ValueError("rows, width and itemsize must not be negative")
    weight_itemsize = itemsize if weight_itemsize is None else weight_itemsize
    return 2 * rows * width * itemsize + width * weight_itemsize


def achieved_tbs(nbytes: float, ms: float) -> float:
    """Bandwidth in TB/s (10^12 bytes per second) of moving ``nbytes`` in ``ms`` milliseconds."""
    if ms <= 0:
        raise ValueError(f"a time of {ms} ms cannot be right: time the kernel after a synchronize")
    return nbytes / (ms * 1e-3) / 1e12


def launch_bound_bytes(host_us: float, tbs: float) -> float:
    """The bytes a kernel must move at ``tbs`` TB/s to take as long as its launch takes the host
    (``host_us`` microseconds): below it, a stream of launches keeps the GPU waiting for the host."""
    return host_us * 1e-6 * tbs * 1e12


# Bytes overwritten before each timed call so that its inputs come from memory, not the L2 cache
# (50 MiB on an H100/H200, 256 MiB of Infinity Cache on an MI300X).
FLUSH_BYTES = 512 * 2**20


def device_ms(fn: Callable[[], object], device: torch.device | str | None = None, warmup: int = 3,
              repeat: int = 10, calls: int = 10) -> Stats:
    """GPU time of one ``fn()`` in milliseconds, without the host's launch cost.

    On a GPU, after ``warmup`` eager calls (compilation, autotuning), ``calls`` pairs of (overwrite a
    buffer larger than the last-level cache, ``fn()``) are captured in one CUDA/HIP graph, and the
    flushes alone in another; each sample is (replay of the first - replay of the second) / ``calls``,
    timed with device events, ``repeat`` samples. Replaying a graph launches nothing from Python, so a
    kernel whose launch costs the host more than its work costs the device (an autotuned launcher,
    several eager operators) is still timed by its GPU work; the flush makes every call read its
    inputs from memory. Where ``fn`` cannot be captured (it synchronizes, allocates on the host) the
    error says so (:func:`tinyllama.timing.graph_replay`). On a CPU this is
    :func:`tinyllama.timing.time_callable`: with Triton's interpreter, the interpreter's time.
    """
    require_unprofiled("device_ms")
    device = dev.get_device(None if device is None else str(device))
    if device.type != "cuda":
        return time_callable(fn, device, warmup=warmup, repeat=repeat)
    for _ in range(max(warmup, 1)):
        fn()
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=device)

    def flushed_calls() -> None:
        for _ in range(calls):
            flush.zero_()
            fn()

    def flushes() -> None:
        for _ in range(calls):
            flush.zero_()

    with_fn, flush_only = graph_replay(flushed_calls, device), graph_replay(flushes, device)

    def replay_ms(replay: Callable[[], None]) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    replay_ms(with_fn), replay_ms(flush_only)  # the first replay uploads the graph
    samples = [max(replay_ms(with_fn) - replay_ms(flush_only), 0.0) / calls for _ in range(max(repeat, 5))]
    return summarize(samples)


@dataclass
class LaunchCost:
    """Microseconds per call of a stream of ``calls`` calls: ``host_us`` until the host has issued
    them all (the launch cost, as long as the device's queue does not fill), ``wall_us`` until the
    device has also finished them (the larger of launch and device time)."""

    host_us: Stats
    wall_us: Stats
    calls: int

    @property
    def host_bound(self) -> bool:
        """The device finished almost as soon as the host issued the last call: the host set the pace
        (:func:`tinyllama.timing.issue_verdict`)."""
        return issue_verdict(self.host_us, self.wall_us)[1] == "host-bound"


def host_us_per_call(fn: Callable[[], object], device: torch.device | str | None = None, calls: int = 200,
                     repeat: int = 5, warmup: int = 3) -> LaunchCost:
    """Time ``calls`` back-to-back calls of ``fn`` with the host's clock, ``repeat`` times, after
    ``warmup`` calls (compilation, autotuning): see :class:`LaunchCost`. Keep ``calls`` below the
    device's launch queue (about a thousand kernels), or the host waits for the device and its time
    is no longer the launch cost."""
    if calls < 1 or repeat < 1:
        raise ValueError("calls and repeat must be at least 1")
    require_unprofiled("host_us_per_call")
    device = dev.get_device(None if device is None else str(device))
    for _ in range(warmup):
        fn()
    host, wall = [], []
    for _ in range(repeat):
        dev.synchronize(device)
        began = time.perf_counter()
        for _ in range(calls):
            fn()
        issued = time.perf_counter()
        dev.synchronize(device)
        done = time.perf_counter()
        host.append((issued - began) / calls * 1e6)
        wall.append((done - began) / calls * 1e6)
    return LaunchCost(summarize(host), summarize(wall), calls)
