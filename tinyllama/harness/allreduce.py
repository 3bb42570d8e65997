"""The all-reduce, timed: how long ``torch.distributed.all_reduce`` of a buffer takes in this process group,
and the bandwidth that makes.

Data-parallel training all-reduces the gradients every step; what that costs depends on the link between
the GPUs (NVLink, Infinity Fabric, PCIe, a network) and on the size of the buffer. Rather than assume a
bandwidth, :func:`time_all_reduce` measures it in the process group this process has joined (NCCL on NVIDIA
GPUs, RCCL on AMD GPUs, both named ``nccl`` in PyTorch; gloo on the CPU), with the conventions of NVIDIA's
``nccl-tests``:

- *algorithm bandwidth* ``algbw = bytes / time``: the buffer's size over the time of one all-reduce;
- *bus bandwidth* ``busbw = algbw x 2 (n - 1) / n``: in a ring each rank sends and receives
  ``2 (n - 1) / n`` times the buffer, so busbw is the rate each link carried. It stays about the same as
  the number of ranks grows, which is what makes it comparable across node sizes and with the link's
  datasheet rate.

Every sample starts after a barrier (all ranks leave it within microseconds) and times ``inner`` back-to-back
all-reduces with device events (a host clock on the CPU, where gloo's all-reduce returns when it is done),
after warm-up all-reduces that set up the communicator and its buffers. The ranks finish at slightly
different times: the figure of a size is the slowest rank's median. Run it on its own::

    torchrun --nproc-per-node 2 -m tinyllama.harness.allreduce                        # GPUs: NCCL / RCCL
    torchrun --nproc-per-node 2 -m tinyllama.harness.allreduce --device cpu --sizes-mib 1,4   # CPU: gloo
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch
import torch.distributed as dist

from tinyllama import device as dev
from tinyllama.config import BenchmarkError, ConfigError
from tinyllama.harness import process_group
from tinyllama.timing import Stats, require_unprofiled, summarize

MIB = 2**20
# ResNet-50's 25,557,032 parameters as fp32 gradients: 97.5 MiB, the buffer DDP all-reduces every step
# (in buckets of 25 MiB by default, which the smaller sizes of the sweep stand for).
RESNET50_PARAMETERS = 25_557_032
DEFAULT_SIZES_MIB = (1.0, 4.0, 16.0, 64.0, RESNET50_PARAMETERS * 4 / MIB)


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: ``algbw x 2 (n - 1) / n`` (0 for one rank, which sends
    nothing). Same unit as ``algbw``."""
    if world_size < 1:
        raise ValueError(f"world size must be at least 1 (got {world_size})")
    return algbw * 2 * (world_size - 1) / world_size


@dataclass
class AllReduceTiming:
    """One buffer size's all-reduce in one process group: every rank's median, and the bandwidths of the
    slowest rank's median (GB/s are 10^9 bytes per second)."""

    bytes: int
    dtype: str
    world_size: int
    backend: str
    device: str
    iterations: int  # timed samples per rank
    inner: int  # all-reduces per sample
    timing: Stats  # this rank's milliseconds per all-reduce
    per_rank_median_ms: list[float] = field(default_factory=list)
    per_rank_spread_pct: list[float] = field(default_factory=list)

    @property
    def median_ms(self) -> float:
        """The slowest rank's median milliseconds per all-reduce: the time the group needed."""
        return max(self.per_rank_median_ms or [self.timing.median])

    @property
    def spread_pct(self) -> float:
        """The largest p10-p90 spread of any rank, in percent of its median."""
        return max(self.per_rank_spread_pct or [self.timing.spread_pct])

    @property
    def algbw_gbs(self) -> float:
        """Algorithm bandwidth, GB/s: the buffer's bytes over the time of one all-reduce."""
        return self.bytes / (self.median_ms / 1e3) / 1e9

    @property
    def busbw_gbs(self) -> float:
        """Bus bandwidth, GB/s: ``algbw x 2 (n - 1) / n``."""
        return bus_bandwidth(self.algbw_gbs, self.world_size)

    def as_record(self) -> dict[str, Any]:
        """A flat dict for JSON and pandas."""
        return {"bytes": self.bytes, "mib": self.bytes / MIB, "dtype": self.dtype, "world_size": self.world_size,
                "backend": self.backend, "device": self.device, "iterations": self.iterations, "inner": self.inner,
                "median_ms": self.median_ms, "spread_pct": self.spread_pct, "algbw_gbs": self.algbw_gbs,
                "busbw_gbs": self.busbw_gbs, "per_rank_median_ms": list(self.per_rank_median_ms),
                "per_rank_spread_pct": list(self.per_rank_spread_pct),
                "rank0": {k: v for k, v in asdict(self.timing).items()}}

    def describe(self) -> str:
        """``97.5 MiB fp32 on 2 ranks (nccl): 0.512 ms (spread 1.2%), algbw 199.6 GB/s, busbw 199.6 GB/s``."""
        return (f"{self.bytes / MIB:,.1f} MiB {self.dtype} on {self.world_size} ranks ({self.backend}): "
                f"{self.median_ms:.3f} ms (spread {self.spread_pct:.1f}%), algbw {self.algbw_gbs:,.2f} GB/s, "
                f"busbw {self.busbw_gbs:,.2f} GB/s")


def _check(size_bytes: int, iterations: int, warmup: int, inner: int) -> process_group.DistContext:
    ctx = process_group.current()
    if not ctx.distributed:
        raise ConfigError("an all-reduce needs a process group of 2 or more processes: start with "
                          "torchrun --nproc-per-node 2 (or more)")
    if size_bytes < 4:
        raise ConfigError(f"the buffer must hold at least one element (got {size_bytes} bytes)")
    if iterations < 1 or inner < 1:
        raise ConfigError(f"iterations and inner must be at least 1 (got {iterations}, {inner})")
    if warmup < 1:
        raise ConfigError(f"warm-up must be at least 1 (got {warmup}): the first all-reduce sets up the communicator")
    return ctx


def time_all_reduce(size_bytes: int, device: torch.device | str, *, dtype: torch.dtype = torch.float32,
                    iterations: int = 10, warmup: int = 3, inner: int = 5) -> AllReduceTiming:
    """Time ``all_reduce`` (sum) of a ``size_bytes`` buffer of ``dtype`` on ``device`` in the joined process
    group: ``warmup`` untimed all-reduces, then ``iterations`` samples of ``inner`` back-to-back ones, each
    sample after a barrier. Every rank must call it with the same arguments (it is a collective)."""
    ctx = _check(size_bytes, iterations, warmup, inner)
    require_unprofiled("the all-reduce timing")
    device = torch.device(device)
    element = torch.empty((), dtype=dtype).element_size()
    numel = max(1, size_bytes // element)
    buffer = torch.zeros(numel, dtype=dtype, device=device)  # zeros stay zeros: no overflow however often summed
    on_gpu = device.type == "cuda"
    for _ in range(warmup):
        dist.all_reduce(buffer)
    dev.synchronize(device)
    samples: list[float] = []
    for _ in range(iterations):
        dist.barrier()
        dev.synchronize(device)  # nothing queued from before: the sample is these all-reduces only
        if on_gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                dist.all_reduce(buffer)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / inner)
        else:
            began = time.perf_counter()
            for _ in range(inner):
                dist.all_reduce(buffer)
            samples.append((time.perf_counter() - began) * 1e3 / inner)
    del buffer
    timing = summarize(samples)
    medians = process_group.gather(timing.median, ctx)
    spreads = process_group.gather(timing.spread_pct, ctx)
    return AllReduceTiming(bytes=numel * element, dtype=str(dtype).replace("torch.", ""), world_size=ctx.world_size,
                           backend=str(ctx.backend), device=dev.device_name(device), iterations=iterations,
                           inner=inner, timing=timing, per_rank_median_ms=[float(m) for m in medians],
                           per_rank_spread_pct=[float(s) for s in spreads])


def check_all_reduce(device: torch.device | str) -> None:
    """Raise ``BenchmarkError`` unless an all-reduce of each rank's ``rank + 1`` gives ``n (n + 1) / 2``
    everywhere: correct before timed."""
    ctx = process_group.current()
    value = torch.full((1024,), float(ctx.rank + 1), device=torch.device(device))
    dist.all_reduce(value)
    expected = ctx.world_size * (ctx.world_size + 1) / 2
    if not torch.all(value == expected):
        raise BenchmarkError(f"all_reduce gave {value[0].item()} on {ctx.label}, expected {expected}: the process "
                             "group does not sum across the ranks")


def sweep_all_reduce(sizes_bytes: Sequence[int], device: torch.device | str, **kwargs: Any) -> list[AllReduceTiming]:
    """:func:`time_all_reduce` for each size (checked first with :func:`check_all_reduce`)."""
    check_all_reduce(device)
    return [time_all_reduce(int(size), device, **kwargs) for size in sizes_bytes]


def parse_sizes_mib(text: str) -> list[int]:
    """``"1,4,97.5"`` (MiB) -> bytes, each a whole number of 4-byte elements; ``ConfigError`` for bad input."""
    sizes = []
    for part in text.split(","):
        try:
            mib = float(part)
        except ValueError:
            raise ConfigError(f"--sizes-mib takes sizes in MiB separated by commas, e.g. 1,4,16 (got {text!r})") from None
        if not math.isfinite(mib) or mib <= 0:
            raise ConfigError(f"--sizes-mib: every size must be a positive number of MiB (got {part!r})")
        sizes.append(max(4, int(mib * MIB) // 4 * 4))
    return sizes


def table(timings: Sequence[AllReduceTiming]) -> str:
    """One line per size: MiB, ms, spread, algbw, busbw."""
    lines = [f"{'MiB':>8} {'ms':>9} {'spread %':>9} {'algbw GB/s':>11} {'busbw GB/s':>11}"]
    for t in timings:
        lines.append(f"{t.bytes / MIB:8.2f} {t.median_ms:9.3f} {t.spread_pct:9.1f} {t.algbw_gbs:11.2f} {t.busbw_gbs:11.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m tinyllama.harness.allreduce",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mib", default=",".join(f"{s:g}" for s in DEFAULT_SIZES_MIB),
                        help="buffer sizes in MiB (default: 1,4,16,64 and ResNet-50's fp32 gradients, 97.5)")
    parser.add_argument("--iterations", type=int, default=10, help="timed samples per size (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed all-reduces first (default 3)")
    parser.add_argument("--inner", type=int, default=5, help="all-reduces per sample (default 5)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="cuda: one GPU per process, NCCL/RCCL; cpu: gloo (default: GPUs if any)")
    parser.add_argument("--json", default=None, metavar="FILE", help="rank 0 writes the results to FILE ('-': print)")
    args = parser.parse_args(argv)
    try:
        sizes = parse_sizes_mib(args.sizes_mib)
        if not process_group.launched_by_torchrun():
            raise ConfigError("start it with torchrun --nproc-per-node N (N >= 2): it times a collective")
        env = process_group.from_environment()
        use_gpu = args.device != "cpu" and dev.backend() != "cpu"
        if args.device == "cuda" and not use_gpu:
            raise ConfigError("--device cuda: PyTorch sees no GPU here; use --device cpu (gloo)")
        device = torch.device(f"cuda:{env.local_rank}") if use_gpu else torch.device("cpu")
        ctx = process_group.join(device)
        try:
            timings = sweep_all_reduce(sizes, device, iterations=args.iterations, warmup=args.warmup, inner=args.inner)
        finally:
            process_group.teardown()
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except BenchmarkError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if ctx.is_main:
        print(f"all_reduce (sum) on {ctx.world_size} x {timings[0].device}, {ctx.backend} "
              f"({dev.collective_library(str(ctx.backend))}): slowest rank's median per size")
        print(table(timings))
        records = [t.as_record() for t in timings]
        if args.json == "-":
            print(json.dumps(records, indent=1))
        elif args.json:
            with open(args.json, "w") as handle:
                json.dump(records, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
