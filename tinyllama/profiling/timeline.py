"""One profiled step on a timeline, read from the Chrome trace that ``profile_steps`` writes: which
kernel ran when and which operator launched it, when memory was allocated and by which operator,
and the layout-conversion kernels that cuDNN/MIOpen insert around convolutions of NCHW tensors.

The trace is the documented Chrome trace format (``traceEvents``) that Perfetto and
``chrome://tracing`` open. In it:

- host operators are complete events (``"ph": "X"``) of category ``cpu_op``, each profiled step a
  ``user_annotation`` range ``ProfilerStep#N``;
- device kernels, copies and fills (categories ``kernel``, ``gpu_memcpy``, ``gpu_memset``) carry a
  ``correlation`` id, and so does the runtime call that launched them (``cudaLaunchKernel``,
  ``hipLaunchKernel``...) on the host thread, inside the operator that asked for them;
- with ``profile_memory=True`` every allocation and free is an instant event ``[memory]`` whose
  ``args`` hold ``Bytes`` (negative for a free), ``Total Allocated`` (bytes the allocator holds for
  tensors after it) and ``Device Type`` (0 the CPU, 1 a CUDA or ROCm GPU).

:func:`kernel_timeline` and :func:`allocations` turn these into DataFrames of one step;
:func:`plot_kernel_timeline` and :func:`plot_allocations` draw them.
"""

from __future__ import annotations

import bisect
import math
import re
from pathlib import Path
from typing import Any

import pandas as pd

from tinyllama.profiling.kernel_names import is_layout_conversion
from tinyllama.profiling.torch_profiler import ProfileRun, categorize, load_events

MIB = 2**20
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAYOUT_CONVERSION = "layout conversion"
_DEVICE_TYPE = {"cpu": 0, "cuda": 1}
# Operators that only allocate for the operator around them: memory is charged to that one.
_ALLOCATING_HELPERS = re.compile(r"^aten::(empty|empty_strided|empty_like|new_empty|new_empty_strided|resize_)$")


def kernel_table(run: ProfileRun) -> pd.DataFrame:
    """The profile's work items in the columns of :meth:`ProfileRun.kernels` (``kernel``, ``calls``,
    ``total_ns``, ``percent``...): the device kernels on a GPU; on a CPU, where nothing runs as a kernel,
    the operators' self CPU time (``frame.attrs["source"]`` says which)."""
    if run.on_device:
        frame = run.kernels()
        frame.attrs["source"] = "device kernels"
        return frame
    ops = run.operators()
    ops = ops[(ops["kind"] == "operator") & (ops["self_cpu_ms"] > 0)]
    calls = (ops["calls_per_step"] * run.steps).round().astype(int)
    total_ns = ops["self_cpu_ms"] * run.steps * 1e6
    frame = pd.DataFrame({"kernel": ops["name"], "calls": calls, "total_ns": total_ns,
                          "mean_ns": total_ns / calls.clip(lower=1), "min_ns": math.nan, "max_ns": math.nan})
    frame["percent"] = 100.0 * frame["total_ns"] / frame["total_ns"].sum() if len(frame) else 0.0
    frame = frame.sort_values("total_ns", ascending=False, ignore_index=True)
    frame.attrs["source"] = "CPU operators (self time): no device kernels on a CPU"
    return frame


def layout_conversion_share(kernels: pd.DataFrame) -> float:
    """The fraction (0..1) of the kernels' total time spent in layout-conversion kernels
    (:func:`is_layout_conversion`); NaN for a table without any time."""
    total = float(kernels["total_ns"].sum()) if len(kernels) else 0.0
    if total <= 0:
        return math.nan
    chosen = kernels["kernel"].map(is_layout_conversion)
    return float(kernels.loc[chosen, "total_ns"].sum()) / total


# --------------------------------------------------------------------------------------------------
# Reading the trace
# --------------------------------------------------------------------------------------------------


def _step_range(events: list[dict[str, Any]], step: int | None, path: Any) -> tuple[float, float]:
    steps = sorted((e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")),
                   key=lambda e: int(str(e["name"]).split("#")[1]))
    if not steps:
        raise ValueError(f"{path} holds no profiled step (ProfilerStep#N): was it written by profile_steps?")
    if step is None:
        chosen = steps[-1]
    else:
        found = [e for e in steps if e["name"] == f"ProfilerStep#{step}"]
        if not found:
            raise ValueError(f"no ProfilerStep#{step} in {path}; it holds {', '.join(e['name'] for e in steps)}")
        chosen = found[0]
    return float(chosen["ts"]), float(chosen["ts"]) + float(chosen["dur"])


def _operators_by_thread(events: list[dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
    threads: dict[Any, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            threads.setdefault(e.get("tid"), []).append(e)
    for ops in threads.values():
        ops.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0.0))))
    return threads


def innermost_operators(events: list[dict[str, Any]], points: list[tuple[Any, float]],
                        skip: re.Pattern[str] | None = None) -> list[str | None]:
    """For each ``(thread id, time in us)``, the name of the innermost host operator that encloses it
    on that thread (``None`` outside every operator), looking through operators whose name matches
    ``skip``. Operators of one thread nest, so one sweep with a stack of the open ones answers all points."""
    threads = _operators_by_thread(events)
    answers: list[str | None] = [None] * len(points)
    by_thread: dict[Any, list[tuple[float, int]]] = {}
    for index, (tid, ts) in enumerate(points):
        by_thread.setdefault(tid, []).append((float(ts), index))
    for tid, queries in by_thread.items():
        ops = threads.get(tid, [])
        starts = [float(e["ts"]) for e in ops]
        queries.sort()
        stack: list[dict[str, Any]] = []
        next_op = 0
        for ts, index in queries:
            # Open every operator that starts at or before this point (an instant at an operator's
            # start belongs to it), closing those that ended before it.
            limit = bisect.bisect_right(starts, ts)
            while next_op < limit:
                op = ops[next_op]
                while stack and float(stack[-1]["ts"]) + float(stack[-1]["dur"]) < float(op["ts"]):
                    stack.pop()
                stack.append(op)
                next_op += 1
            while stack and float(stack[-1]["ts"]) + float(stack[-1]["dur"]) < ts:
                stack.pop()
            names = [op["name"] for op in reversed(stack) if skip is None or not skip.search(op["name"])]
            answers[index] = names[0] if names else None
    return answers


def _outermost(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    chosen, reach = [], -math.inf
    for e in ops:
        if float(e["ts"]) >= reach:
            chosen.append(e)
            reach = float(e["ts"]) + float(e["dur"])
    return chosen


def kernel_timeline(path: str | Path, step: int | None = None) -> pd.DataFrame:
    """The work of one profiled step (default: the last ``ProfilerStep#N`` of the trace), one row per
    item, with times in ms from the step's start:

    - ``side="host"``: the outermost operators of each host thread (``aten::conv2d``, ``aten::relu_``...),
      what the CPU was doing; on a CPU that is all the work;
    - ``side="device"`` (a GPU trace): every kernel, copy and fill launched in the step, with the innermost
      ``operator`` that launched it (through the launch's correlation id).

    ``category`` is :data:`LAYOUT_CONVERSION` for layout-conversion kernels, else the operator's
    :func:`~tinyllama.profiling.torch_profiler.categorize` category (the kernel name's when no operator is
    known). Columns: ``side``, ``lane`` (``host`` or the stream), ``name``, ``operator``, ``category``,
    ``start_ms``, ``duration_ms``."""
    events = load_events(path)
    begin, end = _step_range(events, step, path)
    rows = []
    for ops in _operators_by_thread(events).values():
        for e in _outermost([op for op in ops if begin <= float(op["ts"]) < end]):
            rows.append({"side": "host", "lane": "host", "name": e["name"], "operator": e["name"],
                         "category": categorize(e["name"]), "start_ms": (float(e["ts"]) - begin) / 1e3,
                         "duration_ms": float(e["dur"]) / 1e3})
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES]
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") not in DEVICE_CATEGORIES and "correlation" in e.get("args", {})}
    chosen = []
    for kernel in device:
        launch = launches.get(kernel.get("args", {}).get("correlation"))
        launched_at = float(launch["ts"]) if launch is not None else float(kernel["ts"])
        if begin <= launched_at < end:
            chosen.append((kernel, launch))
    operators = innermost_operators(events, [(launch.get("tid") if launch else None, float(launch["ts"]) if launch else -1.0)
                                             for _, launch in chosen])
    for (kernel, _), operator in zip(chosen, operators):
        name = str(kernel["name"])
        category = LAYOUT_CONVERSION if is_layout_conversion(name) else categorize(operator or name)
        rows.append({"side": "device", "lane": f"stream {kernel.get('tid')}", "name": name, "operator": operator,
                     "category": category, "start_ms": (float(kernel["ts"]) - begin) / 1e3,
                     "duration_ms": float(kernel.get("dur", 0.0)) / 1e3})
    frame = pd.DataFrame(rows, columns=["side", "lane", "name", "operator", "category", "start_ms", "duration_ms"])
    return frame.sort_values(["side", "start_ms"], ignore_index=True)


def allocations(path: str | Path, device: str = "cuda", step: int | None = None) -> pd.DataFrame:
    """The allocations and frees of one profiled step (default: the last) on ``device`` ("cuda" also
    stands for a ROCm GPU; "cpu" for the host's allocator), from a trace profiled with
    ``profile_memory=True``. Columns: ``time_ms`` (from the step's start), ``mib`` (positive: allocated,
    negative: freed), ``allocated_mib`` (all the allocator holds for tensors afterwards, weights included),
    ``operator`` (the innermost host operator that asked, looking through ``aten::empty`` and its kin, which
    allocate for the operator around them; ``None`` outside operators). On a GPU ``allocated_mib`` includes
    what was allocated before profiling (the weights); the CPU's allocator counts from the profiler's start."""
    if device not in _DEVICE_TYPE:
        raise ValueError(f"device must be 'cuda' or 'cpu', not {device!r}")
    events = load_events(path)
    begin, end = _step_range(events, step, path)
    chosen = [e for e in events if e.get("name") == "[memory]" and begin <= float(e["ts"]) < end
              and int(e.get("args", {}).get("Device Type", -1)) == _DEVICE_TYPE[device]]
    if not chosen and not any(e.get("name") == "[memory]" for e in events):
        raise ValueError(f"{path} holds no memory events: profile with profile_memory=True")
    chosen.sort(key=lambda e: float(e["ts"]))
    operators = innermost_operators(events, [(e.get("tid"), float(e["ts"])) for e in chosen], _ALLOCATING_HELPERS)
    frame = pd.DataFrame([{"time_ms": (float(e["ts"]) - begin) / 1e3, "mib": float(e["args"]["Bytes"]) / MIB,
                           "allocated_mib": float(e["args"]["Total Allocated"]) / MIB, "operator": op}
                          for e, op in zip(chosen, operators)],
                         columns=["time_ms", "mib", "allocated_mib", "operator"])
    return frame


def allocations_by_operator(frame: pd.DataFrame) -> pd.DataFrame:
    """:func:`allocations` summed per operator: ``allocated_mib`` (everything it allocated in the step),
    ``allocations``, ``largest_mib`` (its largest single allocation), largest first."""
    allocated = frame[frame["mib"] > 0].copy()
    allocated["operator"] = allocated["operator"].fillna("(outside operators)")
    table = allocated.groupby("operator").agg(allocated_mib=("mib", "sum"), allocations=("mib", "size"),
                                              largest_mib=("mib", "max"))
    return table.sort_values("allocated_mib", ascending=False).reset_index()


# --------------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------------

_COLORS = {"GEMM (projections)": "tab:blue", "norm & reduction": "tab:orange", "element-wise": "tab:green",
           LAYOUT_CONVERSION: "tab:red", "memory (copy, cat, index)": "tab:purple", "other": "tab:gray",
           "attention": "tab:cyan", "loss": "tab:olive", "optimizer": "tab:brown"}


def plot_kernel_timeline(frame: pd.DataFrame, title: str = "", ax: Any = None) -> Any:
    """A Gantt chart of :func:`kernel_timeline`: the host's operators on the top row, below them one row
    per kind of device work (layout conversions apart), each bar one operator or kernel. Returns the
    figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    device = frame[frame["side"] == "device"]
    order = (device.groupby("category")["duration_ms"].sum().sort_values(ascending=False).index.tolist()
             if len(device) else [])
    lanes = [("host", frame[frame["side"] == "host"], "host: operators")]
    lanes += [(c, device[device["category"] == c], f"device: {c}") for c in order]
    if ax is None:
        fig, ax = plt.subplots(figsize=(11, 1.4 + 0.5 * len(lanes)))
    else:
        fig = ax.figure
    for row, (_, items, _) in enumerate(lanes):
        colors = [_COLORS.get(c, "tab:gray") for c in items["category"]]
        ax.broken_barh(list(zip(items["start_ms"], items["duration_ms"])), (row - 0.4, 0.8), facecolors=colors,
                       edgecolor="none")
    ax.set_yticks(range(len(lanes)), [label for _, _, label in lanes])
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_xlabel("time from the step's start (ms)")
    ax.set_title(title or "One step on a timeline")
    present = [c for c in _COLORS if c in set(frame["category"])]
    ax.legend(handles=[Patch(color=_COLORS[c], label=c) for c in present], fontsize=7, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_allocations(frame: pd.DataFrame, by_operator: pd.DataFrame, title: str = "", top: int = 8) -> Any:
    """Two panels: memory the allocator holds over the step (:func:`allocations`, peak marked) and the
    operators that allocated the most in it (:func:`allocations_by_operator`). Returns the figure."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    if len(frame):
        left.step(frame["time_ms"], frame["allocated_mib"], where="post")
        peak = frame["allocated_mib"].idxmax()
        left.plot(frame["time_ms"][peak], frame["allocated_mib"][peak], "o", color="tab:red")
        left.annotate(f"peak {frame['allocated_mib'][peak]:,.1f} MiB", (frame["time_ms"][peak], frame["allocated_mib"][peak]),
                      textcoords="offset points", xytext=(6, -12), fontsize=8)
    left.set_xlabel("time from the step's start (ms)")
    left.set_ylabel("allocated (MiB)")
    left.set_title("memory held over the step", fontsize=9)
    left.grid(alpha=0.3)
    shown = by_operator.head(top).iloc[::-1]
    right.barh(shown["operator"].str.replace("aten::", "", regex=False), shown["allocated_mib"], color="tab:blue")
    right.set_xlabel("allocated in the step (MiB)")
    right.set_title("operators that allocate", fontsize=9)
    right.tick_params(axis="y", labelsize=8)
    fig.suptitle(title or "Memory of one step", fontsize=10)
    fig.tight_layout()
    return fig
