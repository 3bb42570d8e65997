"""Is the device waiting for the host? Host time against device time of one inference iteration.

A GPU runs kernels after the Python call that launched them returns; the host can run ahead and queue
work. When each kernel is short (a small batch), the host cannot queue kernels as fast as the GPU
finishes them: the GPU waits between kernels, and the time per batch is the host's time to issue the
iteration, whatever the batch size. That is the *launch-bound* (host-bound) regime, and its signature in
a batch-size sweep is a flat time per batch while the throughput grows in proportion to the batch.

:func:`host_and_device_ms` measures both sides of that statement on the benchmark's own network and
configuration: for each iteration, starting from an idle device, how long the host takes to issue it
(a host clock around the call, no synchronize) and how long the device takes to finish it (device
events). When the two are close, the device waited for the host. :func:`flat_until` finds the flat
region of a sweep; :func:`crossover_batch` predicts where it ends.

On a CPU the host computes what it issues, so host time is the whole time and the test does not apply
(``HostDevice.applies`` is False there).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import torch
from tqdm.auto import tqdm

from inference import distributed, networks
from inference.benchmark import _cudnn_benchmark, _Run
from inference.config import BenchmarkConfig
from tinyllama import device as dev
from tinyllama.timing import PhaseTimer, Stats, require_unprofiled, summarize

# The device waited for the host when the host needed at least this share of the device's time per
# iteration to issue it (the rest is the last kernels finishing after the last launch).
LAUNCH_BOUND_RATIO = 0.8
# A time per batch within this factor of the smallest batch's counts as "flat" (the spread of a GPU
# timing is a few percent; a batch that really adds work adds far more than 20% once the GPU is busy).
FLAT_TOLERANCE = 1.2


@dataclass
class HostDevice:
    """Host and device time of one iteration at one batch size (milliseconds, ``iterations`` samples)."""

    batch_size: int
    host_ms: Stats  # the host's time to issue one iteration (no synchronize inside)
    device_ms: Stats  # the device's time from the iteration's first launch to its last kernel's end
    applies: bool  # False on a CPU, where the host computes what it issues

    @property
    def host_ratio(self) -> float:
        """Median host time / median device time: near 1, the device waited for the host."""
        return self.host_ms.median / self.device_ms.median if self.device_ms.median else float("nan")

    @property
    def launch_bound(self) -> bool:
        """The device spent the iteration waiting for the host (on a GPU only)."""
        return self.applies and self.host_ratio >= LAUNCH_BOUND_RATIO


def host_and_device_ms(config: BenchmarkConfig, iterations: int | None = None) -> HostDevice:
    """Issue ``iterations`` (default ``config.iterations``) iterations of ``config``'s network, each from
    an idle device after ``config.warmup`` warm-up iterations (the first one checked against the fp32
    reference, as in every benchmark run), and time the host's issuing and the device's work of each."""
    config.validate()
    require_unprofiled("host_and_device_ms")
    spec = networks.get_spec(config.network)
    device = distributed.resolve_device(config.device)
    run = _Run(config, spec, distributed.current(), device, config.batch_size)
    on_gpu = device.type == "cuda"
    host: list[float] = []
    work: list[float] = []
    try:
        run.prepare()
        with _cudnn_benchmark(device):
            run.warm_up(PhaseTimer(device), "")
            for _ in tqdm(range(iterations or config.iterations), desc=f"host/device batch {config.batch_size}",
                          disable=not config.progress, leave=False):
                dev.synchronize(device)  # an idle device: nothing queued from before
                if on_gpu:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                begin = time.perf_counter()
                output = run.step()
                host.append((time.perf_counter() - begin) * 1e3)
                if on_gpu:
                    end.record()
                    end.synchronize()
                    work.append(start.elapsed_time(end))
                else:
                    work.append(host[-1])
                del output
    finally:
        del run
        dev.free_memory(device)
    return HostDevice(config.batch_size, summarize(host), summarize(work), applies=on_gpu)


def flat_until(batch_sizes: Sequence[int], ms_per_batch: Sequence[float], tolerance: float = FLAT_TOLERANCE) -> int:
    """The largest batch size of a sweep (sizes in increasing order) up to which every time per batch
    stays within ``tolerance`` x the first (smallest) batch's: the end of the flat, launch-bound region.
    The first size when the second is already slower."""
    if not batch_sizes or len(batch_sizes) != len(ms_per_batch):
        raise ValueError("give one time per batch size, at least one of each")
    last = batch_sizes[0]
    for size, ms in zip(batch_sizes[1:], ms_per_batch[1:]):
        if ms > tolerance * ms_per_batch[0]:
            break
        last = size
    return last


def crossover_batch(host_ms: float, ms_per_batch: float, batch_size: int) -> float:
    """The batch size at which the device's work per iteration equals the host's time to issue it: the
    host time divided by the device time per sample, taken at a large (device-bound) ``batch_size``."""
    if ms_per_batch <= 0 or batch_size <= 0:
        raise ValueError("the time per batch and the batch size must be positive")
    return host_ms / (ms_per_batch / batch_size)
