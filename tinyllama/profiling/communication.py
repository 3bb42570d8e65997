"""How long the collectives of a multi-process step take, read from a PyTorch profile.

On a GPU, NCCL/RCCL run as kernels on their own stream, beside the compute kernels: DDP starts
reducing a bucket of gradients while the backward is still computing the next ones. So this module
gives two figures per step: the time the communication kernels ran, and the part of it when no compute
kernel ran beside them (``exposed``: what the step would save with free communication). On a CPU,
gloo runs on the host: the time is that of the collectives' host ranges (``gloo:all_reduce``,
``c10d::allreduce_``, ...), outermost ones only, so that nothing counts twice.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tinyllama.profiling.torch_profiler import ProfileRun, is_device_event

# Kernel names of NCCL and RCCL (ncclDevKernel_AllReduce_Sum_f32_RING_LL, ncclKernel_...), the c10d
# operators PyTorch records for every collective, and gloo's ranges.
_COLLECTIVE = re.compile(r"nccl|rccl|gloo|c10d::|all_?reduce|reduce_?scatter|all_?gather|all_to_all|broadcast",
                         re.IGNORECASE)


# FSDP2's packing of a block's shards into one buffer before the all-gather (and out of it after): copies
# on this rank, not communication.
_PACKING = re.compile(r"copy_in|copy_out", re.IGNORECASE)


def is_collective(name: str) -> bool:
    """Whether a profiler event (kernel or host range) is inter-process communication."""
    return bool(_COLLECTIVE.search(name)) and not _PACKING.search(name)


@dataclass
class CommunicationTime:
    """Communication per profiled step, in milliseconds, and the collectives by name.

    ``exposed_ms`` is ``None`` on a CPU (gloo runs on the host: there is no separate stream to overlap
    with). ``collectives`` has columns ``name``, ``calls_per_step``, ``ms_per_step``.
    """

    communication_ms: float
    exposed_ms: float | None
    on_device: bool
    collectives: pd.DataFrame

    @property
    def overlapped_ms(self) -> float | None:
        return None if self.exposed_ms is None else self.communication_ms - self.exposed_ms


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length where two sorted, disjoint interval lists overlap."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _span(event: Any) -> tuple[float, float]:
    return float(event.time_range.start), float(event.time_range.end)


def _outermost(event: Any) -> bool:
    parent = getattr(event, "cpu_parent", None)
    while parent is not None:
        if is_collective(parent.name):
            return False
        parent = getattr(parent, "cpu_parent", None)
    return True


def communication_time(run: ProfileRun) -> CommunicationTime:
    """The communication in ``run`` (a ``profile_steps`` result), per profiled step."""
    events = list(run.profiler.events())
    if run.on_device:
        kernels = [e for e in events if is_device_event(e)]
        chosen = [e for e in kernels if is_collective(e.name)]
        comm = _union([_span(e) for e in chosen])
        compute = _union([_span(e) for e in kernels if not is_collective(e.name)])
        exposed: float | None = (_length(comm) - _intersection(comm, compute)) / 1e3 / run.steps
    else:
        chosen = [e for e in events if not is_device_event(e) and is_collective(e.name) and _outermost(e)]
        comm = _union([_span(e) for e in chosen])
        exposed = None
    rows: dict[str, list[float]] = {}
    for event in chosen:
        calls_us = rows.setdefault(event.name, [0.0, 0.0])
        calls_us[0] += 1
        calls_us[1] += _span(event)[1] - _span(event)[0]
    table = pd.DataFrame([{"name": name, "calls_per_step": calls / run.steps, "ms_per_step": us / 1e3 / run.steps}
                          for name, (calls, us) in rows.items()], columns=["name", "calls_per_step", "ms_per_step"])
    return CommunicationTime(communication_ms=_length(comm) / 1e3 / run.steps, exposed_ms=exposed,
                             on_device=run.on_device,
                             collectives=table.sort_values("ms_per_step", ascending=False, ignore_index=True))


def trace_timeline(path: str | Path, step: int | None = None) -> pd.DataFrame:
    """The work of one profiled step in a Chrome trace that ``profile_steps`` wrote, for a timeline
    plot: on a GPU every kernel and copy, by stream; on a CPU the outermost operators of every thread
    (a collective inside a DDP hook stays visible, its parts do not). Columns: ``lane`` (stream or
    thread; gloo runs its collectives on threads of its own), ``name``, ``start_ms`` (from the step's
    start), ``duration_ms``, ``collective``. ``step``
    picks a ``ProfilerStep#N`` (default: the last one in the trace)."""
    events = [e for e in json.loads(Path(path).read_text())["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")),
                   key=lambda e: int(e["name"].split("#")[1]))
    if not steps:
        raise ValueError(f"{path} holds no profiled step (ProfilerStep#N)")
    chosen = steps[-1] if step is None else next(e for e in steps if e["name"] == f"ProfilerStep#{step}")
    begin, end = float(chosen["ts"]), float(chosen["ts"]) + float(chosen["dur"])
    device_events = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if device_events:
        rows = [(f"stream {e.get('tid')}", e) for e in device_events]
    else:
        rows = []
        for tid in {e.get("tid") for e in events if e.get("cat") == "cpu_op"}:
            ops = sorted((e for e in events if e.get("cat") == "cpu_op" and e.get("tid") == tid),
                         key=lambda e: (float(e["ts"]), -float(e["dur"])))
            reach = -1.0
            for e in ops:  # outermost: not inside the previous outermost operator of the thread
                if float(e["ts"]) >= reach:
                    rows.append((f"thread {tid}", e))
                    reach = float(e["ts"]) + float(e["dur"])
        rows += [(f"thread {e.get('tid')}", e) for e in events
                 if e.get("cat") == "user_annotation" and is_collective(str(e.get("name", "")))]
    frame = pd.DataFrame([{"lane": lane, "name": e["name"], "start_ms": (float(e["ts"]) - begin) / 1e3,
                           "duration_ms": float(e["dur"]) / 1e3, "collective": is_collective(e["name"])}
                          for lane, e in rows if begin <= float(e["ts"]) < end],
                         columns=["lane", "name", "start_ms", "duration_ms", "collective"])
    return frame.sort_values(["lane", "start_ms"], ignore_index=True)
