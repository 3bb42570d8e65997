"""Many runs in one process: batch-size sweeps, the largest batch that fits, and comparisons.

Runs that do not fit in device memory are caught, their memory is given back, and the sweep goes on.
All runs of one sweep happen in the same process on the same device, so their ratios are speed-ups.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from tqdm.auto import tqdm

from inference.benchmark import BenchmarkResult, OutOfMemoryError, run_benchmark
from inference.config import BenchmarkConfig, ConfigError
from inference.distributed import resolve_device
from inference.memory import memory_budget
from tinyllama.costs.anatomy import BatchSearch, largest_batch

Runner = Callable[[BenchmarkConfig], BenchmarkResult]


@dataclass
class SweepPoint:
    """One batch size of a sweep: its result, or why there is none."""

    batch_size: int
    status: str  # "ok", "out of memory", "skipped"
    result: BenchmarkResult | None = None
    detail: str = ""


@dataclass
class SweepResult:
    """A batch-size sweep, in the order the sizes were given."""

    points: list[SweepPoint] = field(default_factory=list)

    @property
    def results(self) -> list[BenchmarkResult]:
        return [p.result for p in self.points if p.result is not None]

    def table(self) -> str:
        """A text table: batch size, throughput, ms per batch, peak memory, status."""
        lines = [f"{'batch':>7}  {'samples/s':>12}  {'ms/batch':>10}  {'peak MiB':>10}  status"]
        for p in self.points:
            if p.result is None:
                lines.append(f"{p.batch_size:>7}  {'-':>12}  {'-':>10}  {'-':>10}  {p.status} {p.detail}".rstrip())
                continue
            r = p.result
            peak = f"{r.peak_memory_mib:,.0f}" if r.peak_memory_mib is not None else "-"
            lines.append(f"{p.batch_size:>7}  {r.throughput:>12,.1f}  {r.ms_per_batch:>10.3f}  {peak:>10}  {p.status}"
                         + ("  (spread > 5%)" if r.spread_warning else ""))
        return "\n".join(lines)


def parse_batch_sizes(text: str) -> list[int]:
    """``"8,16,32"`` -> ``[8, 16, 32]``, each at least 1."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--sweep takes batch sizes separated by commas, e.g. 8,16,32 (got {text!r})") from None
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"--sweep batch sizes must be at least 1 (got {text!r})")
    return sizes


def sweep_batch_sizes(config: BenchmarkConfig, batch_sizes: Iterable[int], runner: Runner = run_benchmark) -> SweepResult:
    """Run ``config`` at each batch size. After an out-of-memory, larger sizes are skipped (they
    would not fit either) and smaller ones still run."""
    sizes = list(batch_sizes)
    sweep = SweepResult()
    smallest_oom: int | None = None
    for size in tqdm(sizes, desc="batch sweep", disable=not config.progress):
        if smallest_oom is not None and size >= smallest_oom:
            sweep.points.append(SweepPoint(size, "skipped", detail=f"(batch {smallest_oom} ran out of memory)"))
            continue
        try:
            result = runner(config.replace(batch_size=size, progress=False))
        except OutOfMemoryError as error:
            smallest_oom = size if smallest_oom is None else min(smallest_oom, size)
            sweep.points.append(SweepPoint(size, "out of memory", detail=str(error).split(":")[0]))
            continue
        sweep.points.append(SweepPoint(size, "ok", result))
    return sweep


@dataclass
class MaxBatchResult(BatchSearch):
    """:class:`tinyllama.costs.anatomy.BatchSearch` of a network, with the full benchmark at the largest
    batch that fits (``result``; ``None`` when no full run was asked for or none completed), and the
    memory budget the search ran under (``memory_budget_bytes``; ``None``: the whole device).

    When the full benchmark was asked for, ``largest`` is a batch whose full run completed, never one
    that only a short probe survived."""

    result: BenchmarkResult | None = None
    memory_budget_bytes: int | None = None

    @property
    def max_batch_size(self) -> int | None:
        """The largest batch that fits (``None``: not even the first probe)."""
        return self.largest

    @property
    def bounded_by(self) -> str:
        """``"memory budget"``, ``"device memory"`` (a probe ran out of memory), or ``"batch limit"``
        (none did up to ``limit``: the size found is a lower bound, not the largest that fits)."""
        if self.first_failing is None:
            return "batch limit"
        return "memory budget" if self.memory_budget_bytes is not None else "device memory"

    def describe(self) -> str:
        """One line: the largest batch that fits, what bounded the search, and every probe."""
        where = (f"a memory budget of {self.memory_budget_bytes / 2**30:.3g} GiB"
                 if self.memory_budget_bytes is not None else "the whole device")
        if self.largest is None and any(status == FULL_RUN_OUT_OF_MEMORY for _, status in self.probes):
            probes = ", ".join(f"{b}: {status}" for b, status in self.probes)
            return (f"no batch completed its full run: the probes fitted, every full run ran out of memory "
                    f"(probes: {probes}); in {where}")
        if self.bounded_by == "batch limit":
            bound = (f"bounded by the batch limit {self.limit}: nothing ran out of memory, so the largest batch "
                     "is not known (raise the limit or lower the budget)")
        else:
            in_full_run = (self.first_failing, FULL_RUN_OUT_OF_MEMORY) in self.probes
            bound = (f"bounded by the {self.bounded_by}: batch {self.first_failing} ran out of memory"
                     + (" in its full run" if in_full_run else ""))
        return f"{super().describe()}; in {where}, {bound}"


def find_max_batch_size(config: BenchmarkConfig, start: int | None = None, limit: int = 8192,
                        runner: Runner = run_benchmark, memory_budget_bytes: int | None = None,
                        resolution: float = 0.0, benchmark_largest: bool = True) -> MaxBatchResult:
    """Double the batch from ``start`` (default: ``config.batch_size``) until it runs out of memory or
    passes ``limit``, then bisect between the last size that fit and the first that did not, until
    they are within ``resolution`` (a fraction of the smaller; 0: exactly)
    (:func:`tinyllama.costs.anatomy.largest_batch`). Each probe is a short run (1 warm-up, 1 timed
    iteration, no check); with ``benchmark_largest`` the largest size that fits is then benchmarked
    with ``config``'s own settings (``result``). A full run does more than a probe (the reference
    check, more iterations, other convolution algorithms) and can run out of memory where the probe
    did not: then the search goes down to a batch whose full run completes
    (:func:`_confirm_with_full_runs`), and that is the largest batch it reports.

    With ``memory_budget_bytes`` every run (probes and the final one) may hold at most that much
    (:func:`inference.memory.memory_budget`: the GPU's allocator capped, or live tensors counted on
    the CPU), so the search finds the limit of a device of that size, not of the whole GPU."""
    size = start or config.batch_size
    if size < 1 or limit < size:
        raise ConfigError(f"the search needs 1 <= start <= limit (got start {size}, limit {limit})")
    if memory_budget_bytes is not None and memory_budget_bytes <= 0:
        raise ConfigError(f"the memory budget must be positive (got {memory_budget_bytes} bytes)")
    probe_config = config.replace(warmup=1, iterations=1, check=False, progress=False, kineto=False,
                                  autograd_profiler=False, flops_prof_step=None)

    def budgeted(run_config: BenchmarkConfig) -> BenchmarkResult:
        if memory_budget_bytes is None:
            return runner(run_config)
        with memory_budget(resolve_device(run_config.device), memory_budget_bytes):
            return runner(run_config)

    with tqdm(desc="max batch search", disable=not config.progress) as bar:
        def fits(batch: int) -> bool:
            bar.update()
            bar.set_postfix(batch=batch)
            try:
                budgeted(probe_config.replace(batch_size=batch))
            except OutOfMemoryError:
                return False
            return True

        search = largest_batch(fits, start=size, limit=limit, resolution=resolution)
    found = MaxBatchResult(search.largest, search.first_failing, limit, list(search.probes),
                           memory_budget_bytes=memory_budget_bytes)
    if found.largest is not None and benchmark_largest:
        _confirm_with_full_runs(found, lambda batch: budgeted(config.replace(batch_size=batch, progress=False)),
                                resolution)
    return found


FULL_RUN_COMPLETED = "full run: completed"
FULL_RUN_OUT_OF_MEMORY = "full run: out of memory"


def _confirm_with_full_runs(found: MaxBatchResult, full_run: Callable[[int], BenchmarkResult],
                            resolution: float) -> None:
    """Make ``found.largest`` a batch whose full run completed (in place): try the sizes the probes
    passed, largest first, until a full run completes; if a larger one failed, bisect between the two
    with full runs to ``resolution``. ``found.first_failing`` becomes the smallest size whose full run
    ran out of memory, ``found.result`` the full run of ``found.largest`` (``None`` if none completed)."""
    good: int | None = None
    bad: int | None = None

    def attempt(batch: int) -> bool:
        nonlocal good, bad
        try:
            result = full_run(batch)
        except OutOfMemoryError:
            found.probes.append((batch, FULL_RUN_OUT_OF_MEMORY))
            bad = batch if bad is None else min(bad, batch)
            return False
        found.probes.append((batch, FULL_RUN_COMPLETED))
        good, found.result = batch, result
        return True

    for batch in sorted({b for b, status in found.probes if status == "fits"}, reverse=True):
        if attempt(batch):
            break
    if good is not None and bad is not None:
        while bad - good > max(1, int(good * resolution)):
            attempt((good + bad) // 2)
    found.largest = good
    if bad is not None:
        found.first_failing = bad


def run_many(configs: Iterable[BenchmarkConfig], runner: Runner = run_benchmark) -> list[BenchmarkResult | OutOfMemoryError]:
    """Run each config in turn in this process; an out-of-memory becomes an entry, not an abort."""
    out: list[BenchmarkResult | OutOfMemoryError] = []
    for config in configs:
        try:
            out.append(runner(config))
        except OutOfMemoryError as error:
            out.append(error)
    return out
