"""The profilers behind --kineto, --autograd-profiler and --flops-prof-step: thin wrappers over
``torch.profiler`` and DeepSpeed's FLOPS profiler, shaped as the benchmark loop needs them.

(The general profiling toolkit of the course lives in ``tinyllama.profiling``.)
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd
import torch
from torch import nn

from inference.config import KINETO_ACTIVE, KINETO_WAIT, KINETO_WARMUP, BenchmarkError
from tinyllama.harness.records import unique_path


def activities(device: torch.device) -> list[Any]:
    """The profiler's activities for ``device`` (``tinyllama.profiling``'s, imported only when a profiler runs:
    ``import inference`` loads none of the profiling package)."""
    from tinyllama.profiling.torch_profiler import activities as for_device

    return for_device(device)

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
    # One row per module of the network (the model itself first): what DeepSpeed's per-module table
    # prints, as data. Read with module_table().
    modules: list[dict[str, Any]] = field(default_factory=list)

    @property
    def macs_per_sample(self) -> float:
        return self.macs / self.batch_size

    @property
    def forward_tflops(self) -> float:
        """Achieved FLOP/s of the profiled forward pass, in TFLOP/s (the profiler's own hooks slow it)."""
        return self.flops / (self.forward_latency_ms / 1e3) / 1e12 if self.forward_latency_ms else 0.0

    def as_dict(self, with_text: bool = False) -> dict[str, object]:
        out = asdict(self)
        out.pop("modules")
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
            modules=_module_rows(model),
        )
    finally:
        profiler.end_profile()
    return result


def _module_rows(model: nn.Module) -> list[dict[str, Any]]:
    """Every module's MACs, FLOPs, parameters and latency as DeepSpeed's profiler left them on the modules
    (its own ``get_module_*`` functions: a module's figures include its children's)."""
    from deepspeed.profiling.flops_profiler.profiler import get_module_duration, get_module_flops, get_module_macs

    rows = []
    for name, module in model.named_modules():
        if not hasattr(module, "__macs__"):  # not hooked (DeepSpeed skips nothing in a plain nn.Module)
            continue
        rows.append({"module": name or "(model)", "type": type(module).__name__,
                     "depth": 0 if not name else name.count(".") + 1, "macs": int(get_module_macs(module)),
                     "flops": int(get_module_flops(module)), "params": int(module.__params__),
                     "latency_ms": float(get_module_duration(module)) * 1e3})
    return rows


def module_table(profile: FlopsProfile, depth: int = 1, top: int | None = None) -> pd.DataFrame:
    """DeepSpeed's per-module breakdown of one profiled forward at ``depth`` (1: the model's direct
    children, e.g. a ResNet's stem, ``layer1``-``layer4`` and ``fc``), as a DataFrame indexed by module:
    ``type``, ``macs``, ``params``, ``latency_ms``, and the shares ``macs_pct`` (of the model's MACs) and
    ``latency_pct`` (of its forward latency), most MACs first; ``top`` keeps that many rows.

    The latencies are host clocks around each module with a synchronize at both ends (DeepSpeed's hooks):
    they include the launches and the profiler's own cost, so they add up to about the forward's latency
    but are slower than an unprofiled forward."""
    if depth < 1:
        raise ValueError(f"depth counts from 1 (the model's direct children), got {depth}")
    if not profile.modules:
        raise ValueError("this profile holds no per-module figures: run the benchmark with flops_prof_step set")
    frame = pd.DataFrame(profile.modules)
    root = frame[frame["depth"] == 0].iloc[0]
    rows = frame[frame["depth"] == depth]
    if rows.empty:
        raise ValueError(f"the network has no modules at depth {depth} (deepest: {int(frame['depth'].max())})")
    table = rows.set_index("module")[["type", "macs", "params", "latency_ms"]].copy()
    table["macs_pct"] = 100.0 * table["macs"] / root["macs"] if root["macs"] else 0.0
    table["latency_pct"] = 100.0 * table["latency_ms"] / root["latency_ms"] if root["latency_ms"] else 0.0
    table = table.sort_values("macs", ascending=False)
    return table.head(top) if top is not None else table
