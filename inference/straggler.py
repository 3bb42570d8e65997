"""A straggler made on purpose: one rank's work delayed by a fixed time every iteration.

In a real job one slow GPU (shared with someone else, throttled, on a worse link) is enough to slow the whole
group; ``--straggler-ms MS --straggler-rank R`` makes that happen on demand so it can be seen in the per-rank
figures. The delay is queued as device work, in the same stream as the iteration:

- on a GPU, ``torch.cuda._sleep`` (a kernel that spins for a number of clock cycles; NVIDIA and AMD alike),
  with the cycles per millisecond measured once on this GPU (the clock is not a constant: boost, power);
- on the CPU, a host sleep (the host is the device there).

Inference shares nothing between the ranks inside the timed loop: the straggler's own median grows by the
delay, and the global throughput (global batch / slowest rank's median) follows it. In training, DDP's
all-reduce of the gradients makes every rank wait for the straggler every step.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable

import torch

from tinyllama import device as dev
from tinyllama.config import ConfigError

_CALIBRATION_CYCLES = 2_000_000  # about a millisecond at GPU clocks: long against the launch, short to wait for


def check_straggler(straggler_ms: float, straggler_rank: int | None) -> None:
    """``ConfigError`` for a delay that is negative or not a number, or a negative rank."""
    if not isinstance(straggler_ms, (int, float)) or not math.isfinite(straggler_ms) or straggler_ms < 0:
        raise ConfigError(f"--straggler-ms must be a delay of 0 ms or more (got {straggler_ms!r})")
    if straggler_rank is not None and straggler_rank < 0:
        raise ConfigError(f"--straggler-rank must be 0 or more (got {straggler_rank})")
    if straggler_rank is not None and not straggler_ms:
        raise ConfigError("--straggler-rank says which rank to delay: give the delay too (--straggler-ms MS)")


def straggler_rank_of(straggler_ms: float, straggler_rank: int | None, world_size: int) -> int | None:
    """The rank to delay in a group of ``world_size`` (default: the last one), ``None`` when there is no
    delay; ``ConfigError`` when the rank is not in the group."""
    if not straggler_ms:
        return None
    rank = world_size - 1 if straggler_rank is None else straggler_rank
    if not 0 <= rank < world_size:
        raise ConfigError(f"--straggler-rank {rank} is not a rank of this run (ranks 0 to {world_size - 1})")
    return rank


def gpu_cycles_per_ms(device: torch.device) -> float:
    """Clock cycles ``torch.cuda._sleep`` spins per millisecond on ``device``, measured with device events
    (median of five, after one warm-up)."""
    with torch.cuda.device(device):
        torch.cuda._sleep(_CALIBRATION_CYCLES)  # warm-up: the first launch loads the kernel
        samples = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(_CALIBRATION_CYCLES)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
    return _CALIBRATION_CYCLES / statistics.median(samples)


def make_delay(delay_ms: float, device: torch.device) -> Callable[[], None]:
    """A function that queues ``delay_ms`` of device work on ``device`` (a GPU sleep kernel) or, on the CPU,
    sleeps for it on the host."""
    if delay_ms <= 0:
        return lambda: None
    if device.type == "cuda" and hasattr(torch.cuda, "_sleep"):
        cycles = int(delay_ms * gpu_cycles_per_ms(device))
        return lambda: torch.cuda._sleep(cycles)
    if device.type == "cuda":  # a PyTorch without the sleep kernel: hold the host, the GPU idles behind it
        def host_then_device() -> None:
            dev.synchronize(device)
            time.sleep(delay_ms / 1e3)
        return host_then_device
    return lambda: time.sleep(delay_ms / 1e3)
