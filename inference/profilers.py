"""The profilers behind --kineto, --autograd-profiler and --flops-prof-step: thin wrappers over
``torch.profiler`` and DeepSpeed's FLOPS profiler, shaped as the benchmark loop needs them.

(The general profiling toolkit of the course lives in ``tinyllama.profiling``.)
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch import nn

from inference.config import KINETO_ACTIVE, KINETO_WAIT, KINETO_WARMUP, BenchmarkError
from tinyllama.profiling.torch_profiler import activities
from tinyllama.records import unique_path

DEEPSPEED_MISSING = "install deepspeed: pip install deepspeed"
TABLE_ROWS = 25


class MissingDependencyError(BenchmarkError):
    """A package that a flag needs is not installed."""


@dataclass
class KinetoTrace:
    """The trace files a --kineto run wrote (one per completed profiler cycle)."""

    paths: list[str] = field(default_factory=list)


@contextlib.contextmanager
def kineto(device: torch.device, prefix: Path) -> Iterator[tuple[torch.profiler.profile, KinetoTrace]]:
    """``torch.profiler`` with the original benchmark's schedule (wait 1, warm-up 2, record 2). Call
    ``profiler.step()`` after every iteration; the trace is written to ``<prefix>_step<N>.json``
    (never over an existing file), viewable in https://ui.perfetto.dev or chrome://tracing."""
    trace = KinetoTrace()

    def write_trace(profiler: torch.profiler.profile) -> None:
        path = unique_path(prefix.with_name(f"{prefix.name}_step{profiler.step_num}.json"))
        path.parent.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(path))
        trace.paths.append(str(path))

    schedule = torch.profiler.schedule(wait=KINETO_WAIT, warmup=KINETO_WARMUP, active=KINETO_ACTIVE, repeat=1)
    with torch.profiler.profile(activities=activities(device), schedule=schedule,
                                on_trace_ready=write_trace, record_shapes=True) as profiler:
        yield profiler, trace


@dataclass
class OperatorTable:
    """The operator table of an --autograd-profiler run, as text and as rows."""

    text: str = ""
    rows: list[dict[str, object]] = field(default_factory=list)


@contextlib.contextmanager
def operator_table(device: torch.device) -> Iterator[OperatorTable]:
    """Profile the enclosed iterations and fill in the table of operators sorted by device time
    (CPU time on the CPU). The benchmark also marks each iteration and phase with
    ``tinyllama.device.annotate``, which emits NVTX (NVIDIA) or ROCTX (AMD) ranges for nsys/rocprof."""
    table = OperatorTable()
    with torch.profiler.profile(activities=activities(device), record_shapes=True) as profiler:
        yield table
    averages = profiler.key_averages()
    on_device = device.type == "cuda"
    # Newer PyTorch calls it device time; before 2.4 only the CUDA name exists.
    sort_by = "cpu_time_total"
    if on_device:
        sort_by = "device_time_total" if averages and hasattr(averages[0], "device_time_total") else "cuda_time_total"
    table.text = averages.table(sort_by=sort_by, row_limit=TABLE_ROWS)
    events = sorted(averages, key=lambda e: getattr(e, sort_by), reverse=True)[:TABLE_ROWS]
    table.rows = [
        {"name": e.key, "calls": e.count, "cpu_time_total_us": e.cpu_time_total,
         "device_time_total_us": getattr(e, sort_by) if on_device else 0.0}
        for e in events
    ]


@dataclass
class FlopsProfile:
    """What DeepSpeed's FLOPS profiler measured in one forward pass (of ``batch_size`` samples)."""

    step: int
    batch_size: int
    params: int
    macs: int
    flops: int
    forward_latency_ms: float
    text: str = ""

    @property
    def macs_per_sample(self) -> float:
        return self.macs / self.batch_size

    @property
    def forward_tflops(self) -> float:
        """Achieved FLOP/s of the profiled forward pass, in TFLOP/s (the profiler's own hooks slow it)."""
        return self.flops / (self.forward_latency_ms / 1e3) / 1e12 if self.forward_latency_ms else 0.0

    def as_dict(self, with_text: bool = False) -> dict[str, object]:
        out = asdict(self)
        if not with_text:
            out.pop("text")
        out["macs_per_sample"] = self.macs_per_sample
        out["forward_tflops"] = self.forward_tflops
        return out


def require_deepspeed() -> type:
    """DeepSpeed's ``FlopsProfiler`` class, or a one-line :class:`MissingDependencyError`."""
    try:
        from deepspeed.profiling.flops_profiler import FlopsProfiler
    except ImportError:
        raise MissingDependencyError(DEEPSPEED_MISSING) from None
    return FlopsProfiler


def deepspeed_flops(model: nn.Module, run_step: Callable[[], object], step: int, batch_size: int) -> FlopsProfile:
    """Run ``run_step`` (one whole iteration, which calls ``model``) under DeepSpeed's FLOPS profiler
    and return its totals and its printed report. ``model`` must be the eager module: a compiled
    graph does not call the functions that the profiler counts."""
    profiler_class = require_deepspeed()
    profiler = profiler_class(model)
    profiler.start_profile()
    try:
        run_step()
        report = io.StringIO()
        with contextlib.redirect_stdout(report):
            profiler.print_model_profile(profile_step=step, module_depth=-1, top_modules=3, detailed=True)
        result = FlopsProfile(
            step=step,
            batch_size=batch_size,
            params=int(profiler.get_total_params()),
            macs=int(profiler.get_total_macs()),
            flops=int(profiler.get_total_flops()),
            forward_latency_ms=float(profiler.get_total_duration()) * 1e3,
            text=report.getvalue(),
        )
    finally:
        profiler.end_profile()
    return result
