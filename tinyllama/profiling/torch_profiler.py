"""The PyTorch profiler, set up the way the course uses it, with its results as DataFrames.

:func:`profile_steps` runs a step function under ``torch.profiler.profile`` with a schedule (wait,
warm-up, active steps), CPU and device activities, optional shapes, memory and stacks, and writes a
trace that Perfetto (https://ui.perfetto.dev), ``chrome://tracing`` and TensorBoard open. The
:class:`ProfileRun` it returns answers the usual questions:

- ``operators()``: ``key_averages()`` as a DataFrame (per step, milliseconds);
- ``top(n)``: the operators that take the most device time (CPU time on a CPU);
- ``kernels()``: device kernels in the same columns as the vendor tools' kernel statistics;
- ``overhead()``: CPU time / device time, the walkthrough's test for launch overhead;
- ``breakdown()``: time per phase (forward, backward, optimizer) and category (GEMM, attention,
  element-wise, ...), from each operator's place in the call tree.

``tinyllama.training.TrainingStep`` marks forward, backward and optimizer with
``tinyllama.device.annotate``: they appear as ranges here and as NVTX/ROCTX ranges in nsys and rocprofv3.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile, schedule

from tinyllama import device as dev
from tinyllama.profiling.kernel_names import is_fused_kernel
from tinyllama.profiling.vendor import KERNEL_COLUMNS
from tinyllama.training import PHASES, TrainingStep

# Every profile here reads one cycle: PyTorch's note (from its second profiler on) that events are
# cleared between cycles says nothing about these profiles and only confuses a participant.
warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")

# --------------------------------------------------------------------------------------------------
# What kind of work an operator or a kernel is
# --------------------------------------------------------------------------------------------------

GEMM, ATTENTION, ELEMENTWISE, REDUCTION, LOSS, OPTIMIZER, MEMORY, OTHER = (
    "GEMM (projections)", "attention", "element-wise", "norm & reduction", "loss", "optimizer",
    "memory (copy, cat, index)", "other")
CATEGORIES = (GEMM, ATTENTION, ELEMENTWISE, REDUCTION, LOSS, OPTIMIZER, MEMORY, OTHER)

# Ordered: the first match wins. ATen operator names (without "aten::") and kernel names both pass
# here. In TinyLLaMA the projections are 2-D matrix multiplies (mm/addmm: nn.Linear folds batch and
# sequence into rows) while q kᵀ and p v are batched (bmm), which is how the two are told apart.
_RULES: list[tuple[str, str]] = [
    (r"log_softmax|nll_loss|cross_entropy", LOSS),
    (r"_foreach_|fused_adam|adamw?\b|multi_tensor_apply|FusedAdam|Adam", OPTIMIZER),
    (r"scaled_dot_product|flash|fmha|efficient_attention|attention|attn|softmax|masked_fill|\bbmm|baddbmm", ATTENTION),
    (r"\bmm\b|addmm|matmul|linear|_scaled_mm|gemm|gemv|xmma|cutlass|Cijk|convolution|conv2d", GEMM),
    (r"rms_norm|layer_norm|batch_norm|\bmean\b|\bsum\b|amax|\bvar|norm\b|reduce|triton_red|triton_per", REDUCTION),
    (r"copy|clone|\bcat\b|index|embedding|gather|scatter|fill|zero_|contiguous|repeat|expand|\bstack\b|"
     r"memcpy|memset|to_copy|^to$|\bempty", MEMORY),
    (r"elementwise|triton_poi|silu|\bmul|\badd|\bsub|\bdiv|\bneg|pow|rsqrt|sqrt|exp|\bcos|\bsin|where|"
     r"sigmoid|gelu|relu|tanh|\bsilu", ELEMENTWISE),
]


def load_events(path: str | Path) -> list[dict[str, Any]]:
    """The ``traceEvents`` of a Chrome trace file (what :func:`profile_steps` writes, as Perfetto reads it)."""
    data = json.loads(Path(path).read_text())
    return data["traceEvents"] if isinstance(data, dict) else data


def categorize(name: str) -> str:
    """The category of an operator (``aten::bmm``) or a kernel name (``triton_poi_fused_mul_0``).

    Operators not named by a rule are looked up in PyTorch's operator tags: ``pointwise`` ones are
    element-wise, ``reduction`` ones reductions."""
    short = name.split("::", 1)[1] if name.startswith("aten::") else name
    for pattern, category in _RULES:
        if re.search(pattern, short):
            return category
    packet = getattr(torch.ops.aten, short, None) if name.startswith("aten::") else None
    if packet is not None:
        try:
            tags = set(getattr(packet, packet.overloads()[0]).tags)
        except (AttributeError, IndexError, RuntimeError):
            tags = set()
        if torch.Tag.pointwise in tags:
            return ELEMENTWISE
        if getattr(torch.Tag, "reduction", None) in tags:
            return REDUCTION
    return OTHER


def row_kind(name: str, is_annotation: bool = False) -> str:
    """``operator``, ``runtime`` (cudaLaunchKernel, hipMemcpy...), ``autograd`` or ``annotation``."""
    if is_annotation or name.startswith(("ProfilerStep#", "## ")) or "#" in name or name in PHASES:
        return "annotation"
    if re.match(r"(cuda|cu|hip|hsa)[A-Z]", name):
        return "runtime"
    if name.startswith("autograd::"):
        return "autograd"
    if "::" in name:
        return "operator"
    return "annotation"


# --------------------------------------------------------------------------------------------------
# Running the profiler
# --------------------------------------------------------------------------------------------------


def has_operator_ancestor(event: Any) -> bool:
    """True when a profiler event runs inside an ATen operator (its CPU parents include one): counting only
    events without such an ancestor counts each top-level operator call once."""
    parent = getattr(event, "cpu_parent", None)
    while parent is not None:
        if row_kind(parent.name) == "operator":
            return True
        parent = getattr(parent, "cpu_parent", None)
    return False


def activities(device: torch.device) -> list[ProfilerActivity]:
    """What the profiler records on ``device``: the host, and the GPU's kernels where there is one
    (the CUDA activity records HIP kernels on ROCm builds)."""
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])


def event_time(event: Any, *names: str, default: float = 0.0) -> float:
    """The first of ``names`` that ``event`` has (torch renamed cuda_* to device_* in 2.4)."""
    for name in names:
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return default


def is_device_event(event: Any) -> bool:
    """Whether a profiler event ran on the device (a kernel, a copy) rather than the host."""
    return not str(getattr(event, "device_type", "CPU")).endswith("CPU")


def _unique_path(folder: Path, stem: str, suffix: str) -> Path:
    """A new file name in ``folder``: recorded traces are never overwritten."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = folder / f"{stem}-{stamp}{suffix}"
    n = 1
    while path.exists():
        path = folder / f"{stem}-{stamp}-{n}{suffix}"
        n += 1
    return path


@dataclass
class Overhead:
    """The walkthrough's overhead test: CPU time of all operators against device time of all kernels,
    per step. Below 1.2 the GPU is kept busy; above 2 the CPU (Python, dispatch, launches) is the limit."""

    cpu_ms: float
    device_ms: float | None
    waiting_ms: float = 0.0  # time the CPU spent waiting for the device (synchronize): not overhead

    @property
    def ratio(self) -> float | None:
        return None if not self.device_ms else self.cpu_ms / self.device_ms

    @property
    def verdict(self) -> str:
        if self.ratio is None:
            return "no device time: on a CPU everything is CPU time, the test needs a GPU"
        if self.ratio < 1.2:
            return "low CPU overhead: the device is the limit"
        if self.ratio <= 2.0:
            return "moderate CPU overhead"
        return "high CPU overhead: the device waits for the CPU (launches, Python); fuse or compile"


class ProfileRun:
    """The result of :func:`profile_steps`: the profiler and DataFrames of what it recorded.

    Times are milliseconds per step (the active steps' total divided by their number), except in
    ``kernels()``, which lists totals over the active steps like the vendor tools do.
    """

    def __init__(self, profiler: profile, device: torch.device, steps: int, trace_path: Path | None) -> None:
        self.profiler = profiler
        self.device = device
        self.steps = steps
        self.trace_path = trace_path
        self.on_device = device.type == "cuda"

    def table(self, row_limit: int = 15, sort_by: str | None = None) -> str:
        """PyTorch's own text table of ``key_averages()``."""
        sort_by = sort_by or ("self_device_time_total" if self.on_device else "self_cpu_time_total")
        try:
            return self.profiler.key_averages().table(sort_by=sort_by, row_limit=row_limit)
        except (AttributeError, KeyError):  # torch < 2.4 calls it self_cuda_time_total
            return self.profiler.key_averages().table(sort_by=sort_by.replace("device", "cuda"), row_limit=row_limit)

    def operators(self, group_by_input_shape: bool = False) -> pd.DataFrame:
        """``key_averages()`` of the host-side events (operators, runtime calls, ranges), one row each.

        Columns: ``name``, ``kind`` (see :func:`row_kind`), ``category`` (operators only),
        ``calls_per_step``, ``self_cpu_ms``, ``cpu_total_ms``, ``self_device_ms``, ``device_total_ms``,
        ``self_cpu_memory_mib``, ``self_device_memory_mib`` (with ``profile_memory``), and ``input_shapes``
        when grouped by input shape (needs ``record_shapes``).
        """
        rows = []
        for e in self.profiler.key_averages(group_by_input_shape=group_by_input_shape):
            if is_device_event(e):
                continue
            kind = row_kind(e.key, bool(getattr(e, "is_user_annotation", False)))
            row = {
                "name": e.key, "kind": kind, "category": categorize(e.key) if kind == "operator" else "",
                "calls_per_step": e.count / self.steps,
                "self_cpu_ms": event_time(e, "self_cpu_time_total") / 1e3 / self.steps,
                "cpu_total_ms": event_time(e, "cpu_time_total") / 1e3 / self.steps,
                "self_device_ms": event_time(e, "self_device_time_total", "self_cuda_time_total") / 1e3 / self.steps,
                "device_total_ms": event_time(e, "device_time_total", "cuda_time_total") / 1e3 / self.steps,
                "self_cpu_memory_mib": event_time(e, "self_cpu_memory_usage") / 2**20 / self.steps,
                "self_device_memory_mib": event_time(e, "self_device_memory_usage", "self_cuda_memory_usage") / 2**20 / self.steps,
            }
            if group_by_input_shape:
                row["input_shapes"] = str(getattr(e, "input_shapes", ""))
            rows.append(row)
        frame = pd.DataFrame(rows)
        by = "self_device_ms" if self.on_device else "self_cpu_ms"
        return frame.sort_values(by, ascending=False, ignore_index=True)

    def top(self, n: int = 10) -> pd.DataFrame:
        """The ``n`` operators with the most self device time (self CPU time on a CPU), with their share."""
        return _top(self.operators(), self.on_device, n)

    def kernels(self) -> pd.DataFrame:
        """Device kernels (and copies) with their total time over the active steps, in the columns of
        ``tinyllama.profiling.vendor.KERNEL_COLUMNS``. Empty on a CPU."""
        annotations = {e.key for e in self.profiler.key_averages()
                       if not is_device_event(e) and row_kind(e.key, bool(getattr(e, "is_user_annotation", False))) == "annotation"}
        rows = []
        for e in self.profiler.key_averages():
            if not is_device_event(e) or (e.key in annotations and not is_fused_kernel(e.key)) or e.key.startswith("ProfilerStep#"):
                continue
            total_ns = event_time(e, "self_device_time_total", "self_cuda_time_total") * 1e3
            rows.append({"kernel": e.key, "calls": e.count, "total_ns": total_ns, "mean_ns": total_ns / max(e.count, 1),
                         "min_ns": float("nan"), "max_ns": float("nan")})
        frame = pd.DataFrame(rows, columns=list(KERNEL_COLUMNS[:-1]))
        total = frame["total_ns"].sum()
        frame["percent"] = 100.0 * frame["total_ns"] / total if total else 0.0
        return frame.sort_values("total_ns", ascending=False, ignore_index=True)

    def kernels_outside_operators(self) -> pd.DataFrame:
        """Device kernels launched outside any ATen operator (by ``torch.compile``'s generated code, by
        Triton kernels called directly), which the operator table cannot show: ``kernel``, ``category``
        (from the kernel name), ``launched_in`` (the range around the launch) and ``time_ms`` per step."""
        rows: dict[tuple[str, str], float] = {}
        for event in self.profiler.events():
            if is_device_event(event) or row_kind(event.name) == "operator":
                continue
            for kernel in _launched_kernels(event):
                key = (kernel.name, event.name)
                rows[key] = rows.get(key, 0.0) + kernel.duration
        frame = pd.DataFrame([{"kernel": k, "category": categorize(k), "launched_in": where,
                               "time_ms": us / 1e3 / self.steps} for (k, where), us in rows.items()],
                             columns=["kernel", "category", "launched_in", "time_ms"])
        return frame.sort_values("time_ms", ascending=False, ignore_index=True)

    def overhead(self) -> Overhead:
        """CPU time of every host-side event against the device time of every kernel, per step. Time spent
        waiting for the device (synchronize, ``.item()``) is not CPU work and is reported apart."""
        ops = self.operators()
        waiting = ops["name"].str.contains("Synchronize|_local_scalar_dense", regex=True)
        cpu_ms = float(ops.loc[~waiting, "self_cpu_ms"].sum())
        device_ms = float(self.kernels()["total_ns"].sum()) / 1e6 / self.steps if self.on_device else None
        return Overhead(cpu_ms, device_ms, float(ops.loc[waiting, "self_cpu_ms"].sum()))

    def breakdown(self) -> pd.DataFrame:
        """Time per (phase, category), per step: each operator's self time goes to the phase range it
        runs in (ops run by the autograd engine are backward) and to its :func:`categorize` category;
        everything inside the optimizer range is ``optimizer``.

        Columns: ``phase``, ``category``, ``time_ms`` (device time on a GPU, self CPU time on a CPU),
        ``share_pct``. On a GPU every kernel counts once, with the event that launched it: kernels
        launched outside ATen operators (compiled code, Triton kernels called directly) take their
        category from the kernel name; kernels the profiler could not link to any event are ``unattributed``.
        """
        totals: dict[tuple[str, str], float] = {}

        def add(phase: str, category: str, us: float) -> None:
            key = (phase, OPTIMIZER if phase == "optimizer" else category)
            totals[key] = totals.get(key, 0.0) + us

        linked_us = 0.0
        for event in self.profiler.events():
            if is_device_event(event):
                continue
            operator = row_kind(event.name) == "operator"
            if not self.on_device:
                if operator and event_time(event, "self_cpu_time_total") > 0:
                    add(_phase_of(event), categorize(event.name), event_time(event, "self_cpu_time_total"))
                continue
            for kernel in _launched_kernels(event):
                linked_us += kernel.duration
                add(_phase_of(event, include_self=True), categorize(event.name if operator else kernel.name),
                    kernel.duration)
        if self.on_device:
            missing_us = self.kernels()["total_ns"].sum() / 1e3 - linked_us
            if missing_us > 1e-3 * max(linked_us, 1.0):
                totals[("unattributed", OTHER)] = missing_us
        rows = [{"phase": p, "category": c, "time_ms": us / 1e3 / self.steps} for (p, c), us in totals.items()]
        frame = pd.DataFrame(rows, columns=["phase", "category", "time_ms"])
        total = frame["time_ms"].sum()
        frame["share_pct"] = 100.0 * frame["time_ms"] / total if total else 0.0
        return frame.sort_values("time_ms", ascending=False, ignore_index=True)

    def category_shares(self) -> pd.DataFrame:
        """:meth:`breakdown` summed over phases: the share of time in GEMMs, attention, element-wise..."""
        return _category_shares(self.breakdown())

    def tables(self) -> "ProfileTables":
        """What this profile answers, as tables that can be pickled (and so come back from another process)."""
        return ProfileTables(str(self.device), self.steps, self.on_device, self.trace_path, self.operators(),
                             self.kernels(), self.kernels_outside_operators(), self.breakdown(), self.overhead(),
                             self.table())


def _top(operators: pd.DataFrame, on_device: bool, n: int) -> pd.DataFrame:
    ops = operators[operators["kind"] == "operator"].copy()
    by = "self_device_ms" if on_device else "self_cpu_ms"
    total = ops[by].sum()
    ops["share_pct"] = 100.0 * ops[by] / total if total else 0.0
    return ops.head(n).reset_index(drop=True)


def _category_shares(breakdown: pd.DataFrame) -> pd.DataFrame:
    frame = breakdown.groupby("category", as_index=False)[["time_ms", "share_pct"]].sum()
    return frame.sort_values("time_ms", ascending=False, ignore_index=True)


@dataclass
class ProfileTables:
    """A :class:`ProfileRun`'s answers, kept as tables: the same methods (``operators``, ``top``,
    ``kernels``, ``kernels_outside_operators``, ``overhead``, ``breakdown``, ``category_shares``, ``table``)
    without the live profiler, so a profile taken in another process (:func:`profile_training_isolated`)
    reads like one taken here."""

    device: str
    steps: int
    on_device: bool
    trace_path: Path | None
    operator_table: pd.DataFrame
    kernel_table: pd.DataFrame
    outside_table: pd.DataFrame
    breakdown_table: pd.DataFrame
    overhead_figures: Overhead
    text: str

    def operators(self) -> pd.DataFrame:
        return self.operator_table.copy()

    def top(self, n: int = 10) -> pd.DataFrame:
        return _top(self.operator_table, self.on_device, n)

    def kernels(self) -> pd.DataFrame:
        return self.kernel_table.copy()

    def kernels_outside_operators(self) -> pd.DataFrame:
        return self.outside_table.copy()

    def overhead(self) -> Overhead:
        return self.overhead_figures

    def breakdown(self) -> pd.DataFrame:
        return self.breakdown_table.copy()

    def category_shares(self) -> pd.DataFrame:
        return _category_shares(self.breakdown_table)

    def table(self, row_limit: int = 15, sort_by: str | None = None) -> str:
        """PyTorch's text table as it was printed in the profiling process (its first 15 rows)."""
        return self.text


def _launched_kernels(event: Any) -> list[Any]:
    """The device kernels linked to a host event, without the device-side copy of a range
    (``gpu_user_annotation``: same name as the range, spanning every kernel inside it). A kernel
    ``torch.compile`` generated has the name of its launch range too, and is kept."""
    return [k for k in getattr(event, "kernels", []) if (k.name != event.name or is_fused_kernel(k.name))
            and k.name not in PHASES and not k.name.startswith("ProfilerStep#")]


def _phase_of(event: Any, include_self: bool = False) -> str:
    """The phase range above ``event`` in the call tree; the autograd engine's work is backward."""
    node = event if include_self else getattr(event, "cpu_parent", None)
    while node is not None:
        if node.name in PHASES:
            return node.name
        if node.name.startswith("autograd::engine"):
            return "backward"
        node = getattr(node, "cpu_parent", None)
    return "backward" if event.name.startswith("autograd::") else "outside phases"


def launch_table(profiler: Any, ranges: Sequence[str], device: torch.device | str | None = None) -> pd.DataFrame:
    """Every launch the profiler recorded, in launch order, with the named range it ran in.

    On a GPU a launch is a device kernel (copies and memsets are not kernels: ``ncu`` does not count
    them either), timed on the device; on a CPU it is a top-level operator call (what a CPU runs in
    place of a kernel), timed by its CPU time, and only inside ``ranges``. ``ranges`` are the range
    names to look for (the innermost one wins); kernels outside all of them get ``"outside"``.

    Columns: ``launch`` (0, 1, ... in order), ``kernel``, ``range``, ``index`` (the launch's number
    within its range) and ``time_ns``.
    """
    device = torch.device(device) if device is not None else dev.get_device()
    wanted = set(ranges)
    if device.type == "cuda":
        rows = _device_launches(getattr(profiler, "profiler", profiler).kineto_results.events(), wanted)
    else:
        rows = _operator_launches(profiler.events(), wanted)
    frame = pd.DataFrame(sorted(rows, key=lambda row: row[0]), columns=["start", "kernel", "range", "time_ns"])
    frame = frame.drop(columns="start")
    frame.insert(0, "launch", range(len(frame)))
    frame.insert(3, "index", frame.groupby("range").cumcount())
    return frame


# libkineto::ActivityType: a range's copy on the device's timeline, and a kernel.
_GPU_USER_ANNOTATION, _CONCURRENT_KERNEL = 2, 5


def _device_launches(events: Iterable[Any], wanted: set[str]) -> list[tuple]:
    """Kernels read from the device's own records, each in the innermost wanted range that holds its
    start on the device's timeline. Not from the host events the profiler hangs them on: it also hangs
    cuDNN's kernels on CUPTI's records of lazy kernel loading ("Lazy Function Loading" under
    ``cudaFuncGetAttributes``, which launches nothing), so a table built from host events put kernels
    in the wrong place and order, and a ResNet-50's timed forwards did not repeat (H200, torch 2.11)."""
    kernels, spans = [], []
    for event in events:
        if str(event.device_type()).endswith("CPU"):
            continue
        name = event.name()
        kind = event.activity_type() if hasattr(event, "activity_type") else None
        if kind == _GPU_USER_ANNOTATION or (kind is None and event.is_user_annotation()):
            if name in wanted:
                spans.append((event.start_ns(), event.end_ns(), name))
        elif kind == _CONCURRENT_KERNEL or (kind is None and not name.startswith(("Memcpy", "Memset"))):
            kernels.append((event.start_ns(), name, event.end_ns() - event.start_ns()))
    rows = []
    for start, name, duration in kernels:
        holding = [(end - begin, label) for begin, end, label in spans if begin <= start < end]
        rows.append((start, name, min(holding)[1] if holding else "outside", float(duration)))
    return rows


def _operator_launches(events: Iterable[Any], wanted: set[str]) -> list[tuple]:
    """On a CPU: the top-level operator calls inside a wanted range, timed by their CPU time (building
    the network runs outside the ranges, and launches no kernels on a GPU either)."""

    def range_of(event: Any) -> str:
        node = event
        while node is not None:
            if node.name in wanted:
                return node.name
            node = getattr(node, "cpu_parent", None)
        return "outside"

    rows = []
    for event in events:
        if is_device_event(event) or row_kind(event.name) != "operator":
            continue
        parent = getattr(event, "cpu_parent", None)
        while parent is not None and row_kind(parent.name) != "operator":
            parent = getattr(parent, "cpu_parent", None)
        if parent is None and range_of(event) != "outside":  # its children are part of its call
            rows.append((event.time_range.start, event.name, range_of(event),
                         event_time(event, "cpu_time_total") * 1e3))
    return rows


def profile_steps(
    step: Callable[[], Any],
    *,
    device: torch.device | str | None = None,
    wait: int = 1,
    warmup: int = 1,
    active: int = 3,
    record_shapes: bool = False,
    profile_memory: bool = False,
    with_stack: bool = False,
    trace_dir: str | Path | None = None,
    tensorboard: bool = False,
    name: str = "tinyllama",
) -> ProfileRun:
    """Call ``step()`` ``wait + warmup + active`` times under the PyTorch profiler and record the
    ``active`` ones (the first ``wait`` calls are ignored, the ``warmup`` ones profiled and discarded).

    ``trace_dir`` writes a Chrome/Perfetto trace (``NAME-TIMESTAMP.json``) there; with ``tensorboard``
    it uses TensorBoard's handler instead (``*.pt.trace.json``, which Perfetto opens too; view with
    ``tensorboard --logdir TRACE_DIR``). Existing files are never overwritten.
    """
    if active < 1 or wait < 0 or warmup < 0:
        raise ValueError(f"need active >= 1 and wait, warmup >= 0 (got wait={wait}, warmup={warmup}, active={active})")
    device = dev.get_device(None if device is None else str(device))
    folder = Path(trace_dir) if trace_dir is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def on_trace_ready(prof: profile) -> None:
        if folder is None:
            return
        if tensorboard:
            before = set(folder.glob("*.pt.trace.json*"))
            torch.profiler.tensorboard_trace_handler(str(folder), worker_name=name)(prof)
            written.extend(sorted(set(folder.glob("*.pt.trace.json*")) - before))
        else:
            path = _unique_path(folder, name, ".json")
            prof.export_chrome_trace(str(path))
            written.append(path)

    with profile(activities=activities(device), schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
                 record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack,
                 on_trace_ready=on_trace_ready) as prof:
        for _ in range(wait + warmup + active):
            step()
            dev.synchronize(device)  # clean step boundaries on the timeline
            prof.step()
    return ProfileRun(prof, device, active, written[-1] if written else None)


def profile_training(version: str, config: Any, weights: dict[str, torch.Tensor],
                     batch: tuple[torch.Tensor, torch.Tensor], precision: str, device: torch.device | str,
                     model_options: dict[str, Any] | None = None, *, wait: int = 1, warmup: int = 1, active: int = 3,
                     trace_dir: str | Path | None = None, name: str = "tinyllama") -> ProfileTables:
    """Build ``version`` with ``model_options``, load ``weights`` (its state dict), and profile its training
    step on ``batch`` (:func:`profile_steps`); the answers as :class:`ProfileTables`."""
    from tinyllama.models import build

    device = dev.get_device(str(device))
    with device:
        model = build(version, config, **(model_options or {}))
    model.load_state_dict({k: v.to(device) for k, v in weights.items()})
    inputs, targets = (t.to(device) for t in batch)
    step = TrainingStep(model, precision, device)
    run = profile_steps(lambda: step(inputs, targets), device=device, wait=wait, warmup=warmup, active=active,
                        trace_dir=trace_dir, name=name)
    return run.tables()


def profile_training_isolated(*args: Any, **kwargs: Any) -> ProfileTables:
    """:func:`profile_training` in a process of its own (``tinyllama.profiling.isolated``): this process
    keeps no profiler residue, so it can go on timing. Same arguments."""
    from tinyllama.profiling.isolated import isolated

    return isolated(profile_training, *args, **kwargs)
