"""How long the collectives of a multi-process step take, read from a PyTorch profile of every rank.

On a GPU, NCCL/RCCL run as kernels on their own stream, beside the compute kernels: DDP starts
reducing a bucket of gradients while the backward is still computing the next ones. On a CPU, gloo
runs on the host: its collectives are the host ranges ``gloo:all_reduce``, ``c10d::allreduce_``, ...
(outermost ones only, so that nothing counts twice).

A collective completes on no rank before the last rank has arrived: a rank that arrives early spins
in the collective's kernel (or range) until then. The time a rank spends in its collectives is
therefore two things: the **wait** for the late ranks (skew: the late rank's compute, not the
interconnect) and the **transfer** (after the last rank arrived: what the interconnect costs). Read
from one rank alone, the wait looks like communication: two ranks of one symmetric all-reduce then
differ many times over. :func:`communication_figures` matches the collectives of every rank and
splits them, per profiled step and per rank:

- ``communication_ms``: the time this rank's collectives ran (their union within the step), which is
  ``transfer_ms + wait_ms`` and never longer than the step;
- ``transfer_ms``: the collectives' time after the last rank arrived, the same on every rank;
- ``wait_ms``: this rank's wait for the others, reported apart;
- ``exposed_ms``: the part of ``communication_ms`` when no compute ran beside it on this rank (GPU
  only), and ``exposed_transfer_ms`` the same for the transfer alone;
- ``step_ms``: the wall time of the profiled step itself (``ProfilerStep#N``), which these figures
  are set against: profiled steps are slower than unprofiled ones.

:func:`check_physical` is the one place that says whether such figures can be true.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import pandas as pd

from tinyllama.config import BenchmarkError
from tinyllama.profiling.torch_profiler import ProfileRun, is_device_event, load_events

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


# ------------------------------------------------------------------------------------------------
# Intervals
# ------------------------------------------------------------------------------------------------

Interval = tuple[float, float]


def _union(intervals: Iterable[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: Iterable[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def _overlap(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Where two sorted, disjoint interval lists overlap."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


# ------------------------------------------------------------------------------------------------
# What one rank's profile holds: its profiled steps and the collectives in each
# ------------------------------------------------------------------------------------------------


@dataclass
class ProfiledStep:
    """One profiled step of one rank, in milliseconds from the step's start (its own clock).

    ``collectives``: ``(name, start, end)`` of every collective that started in the step, in order of
    start, its end clipped to the step's end. ``busy``: on a GPU, the time within those collectives
    when compute (any other kernel or copy) ran beside them; ``None`` on a CPU."""

    number: int
    step_ms: float
    collectives: list[tuple[str, float, float]] = field(default_factory=list)
    busy: list[Interval] | None = None


@dataclass
class RankProfile:
    """What :func:`communication_figures` needs of one rank: small and picklable, so that rank 0 can
    gather it from every rank. ``table``: the collectives by name (``name``, ``calls_per_step``,
    ``ms_per_step``, this rank's own durations, waits included)."""

    on_device: bool
    steps: list[ProfiledStep]
    table: list[dict[str, Any]] = field(default_factory=list)

    def collectives(self) -> pd.DataFrame:
        frame = pd.DataFrame(self.table, columns=["name", "calls_per_step", "ms_per_step"])
        return frame.sort_values("ms_per_step", ascending=False, ignore_index=True)


def _profile(steps: list[tuple[int, float, float]], collectives: list[tuple[str, float, float]],
             compute: list[Interval] | None) -> RankProfile:
    """Steps ``(number, start, end)``, collectives ``(name, start, end)`` and compute intervals, all in
    microseconds on one rank's clock, cut into :class:`ProfiledStep` s (in milliseconds)."""
    steps = sorted(steps, key=lambda s: s[1])
    compute_union = None if compute is None else _union(compute)
    out: list[ProfiledStep] = []
    rows: dict[str, list[float]] = {}
    for number, begin, end in steps:
        mine = sorted(((name, s, min(e, end)) for name, s, e in collectives if begin <= s < end),
                      key=lambda c: (c[1], c[0]))
        busy = None
        if compute_union is not None:
            comm = _union((s, e) for _, s, e in mine)
            busy = [((s - begin) / 1e3, (e - begin) / 1e3) for s, e in _overlap(comm, compute_union)]
        out.append(ProfiledStep(number, (end - begin) / 1e3,
                                [(name, (s - begin) / 1e3, (e - begin) / 1e3) for name, s, e in mine], busy))
        for name, s, e in mine:
            row = rows.setdefault(name, [0.0, 0.0])
            row[0] += 1
            row[1] += (e - s) / 1e3
    count = max(len(out), 1)
    table = [{"name": name, "calls_per_step": calls / count, "ms_per_step": ms / count}
             for name, (calls, ms) in rows.items()]
    return RankProfile(on_device=compute is not None, steps=out, table=table)


def _span(event: Any) -> Interval:
    return float(event.time_range.start), float(event.time_range.end)


def _outermost(event: Any) -> bool:
    parent = getattr(event, "cpu_parent", None)
    while parent is not None:
        if is_collective(parent.name):
            return False
        parent = getattr(parent, "cpu_parent", None)
    return True


def _is_range_copy(event: Any) -> bool:
    """A range's copy on the device timeline (``gpu_user_annotation``: ``ProfilerStep#N``, ``forward``,
    ``nccl:all_reduce``, ``FSDP::all_gather (...)``): it spans every kernel launched inside the range,
    on any stream, and is neither compute nor communication."""
    return bool(getattr(event, "is_user_annotation", False)) or event.name.startswith("ProfilerStep")


def _step_number(event: Any, default: int) -> int | None:
    """N of a ``ProfilerStep#N`` host range (``prof.events()`` names them all ``ProfilerStep*``; the
    number is in ``trace_name``), ``None`` for any other event."""
    name = getattr(event, "trace_name", None) or event.name
    if is_device_event(event) or not name.startswith("ProfilerStep"):
        return None
    number = name.partition("#")[2]
    return int(number) if number.isdigit() else default


def _executed(collectives: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """On a CPU, gloo's own ranges (``gloo:all_reduce``, on gloo's threads) where there are any: they are
    the collectives running, and end together on every rank. The ranges on the calling thread
    (``c10d::allreduce_``, ``FSDP::all_gather (...)``) only hand the work to gloo: they end whenever the
    caller returns, which differs from rank to rank, and would be read as skew or transfer."""
    gloo = [c for c in collectives if c[0].startswith("gloo:")]
    return gloo or collectives


def rank_profile(events: Iterable[Any], on_device: bool) -> RankProfile:
    """One rank's :class:`RankProfile` from the profiler's events (``prof.events()``: objects with
    ``name``, ``time_range``, ``device_type``, ``cpu_parent``, ``is_user_annotation``)."""
    events = list(events)
    numbered = [(_step_number(e, i), e) for i, e in enumerate(events)]
    steps = [(n, *_span(e)) for n, e in numbered if n is not None]
    if on_device:
        work = [e for e in events if is_device_event(e) and not _is_range_copy(e)]
        collectives = [(e.name, *_span(e)) for e in work if is_collective(e.name)]
        compute: list[Interval] | None = [_span(e) for e in work if not is_collective(e.name)]
    else:
        collectives = _executed([(e.name, *_span(e)) for e in events
                                 if not is_device_event(e) and is_collective(e.name) and _outermost(e)])
        compute = None
    return _profile(steps, collectives, compute)


def read_profile(run: ProfileRun) -> RankProfile:
    """This rank's :class:`RankProfile` from a ``profile_steps`` result."""
    return rank_profile(run.profiler.events(), run.on_device)


_DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def read_trace(path: str | Path) -> RankProfile:
    """One rank's :class:`RankProfile` from a Chrome trace that ``profile_steps`` wrote (``--trace-dir``):
    the same figures from saved traces, one per rank."""
    events = [e for e in load_events(path) if e.get("ph") == "X"]

    def span(e: dict[str, Any]) -> Interval:
        return float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))

    steps = [(int(str(e["name"]).split("#")[1]), *span(e)) for e in events  # the host range, not its device copy
             if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") == "user_annotation"]
    device = [e for e in events if e.get("cat") in _DEVICE_CATEGORIES]
    if device:
        collectives = [(str(e["name"]), *span(e)) for e in device if is_collective(str(e["name"]))]
        compute: list[Interval] | None = [span(e) for e in device if not is_collective(str(e["name"]))]
    else:
        host = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation") and is_collective(str(e["name"]))]
        collectives = []
        for tid in {e.get("tid") for e in host}:  # outermost: not inside another collective of its thread
            reach = -1.0
            for e in sorted((e for e in host if e.get("tid") == tid), key=lambda e: (float(e["ts"]), -float(e["dur"]))):
                if span(e)[0] >= reach:
                    collectives.append((str(e["name"]), *span(e)))
                    reach = span(e)[1]
        collectives, compute = _executed(collectives), None
    return _profile(steps, collectives, compute)


# ------------------------------------------------------------------------------------------------
# Every rank together: transfer and wait
# ------------------------------------------------------------------------------------------------


@dataclass
class StepCommunication:
    """One profiled step of one rank, in milliseconds: see the module's docstring. ``matched``: every
    collective of the step was found on every rank (else the unmatched ones count as transfer whole,
    and the ranks' transfer times may differ: :func:`check_physical` says so)."""

    step: int
    step_ms: float
    communication_ms: float
    transfer_ms: float
    wait_ms: float
    exposed_ms: float | None
    exposed_transfer_ms: float | None
    matched: bool


@dataclass
class CommunicationTime:
    """One rank's communication in its profiled steps, per step and as means over them (milliseconds
    per step). ``exposed_ms`` is ``None`` on a CPU (gloo runs on the host: no stream to overlap with)."""

    rank: int
    on_device: bool
    steps: list[StepCommunication]
    collectives: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["name", "calls_per_step",
                                                                                    "ms_per_step"]))

    def _mean(self, name: str) -> float | None:
        values = [getattr(s, name) for s in self.steps]
        if not values or any(v is None for v in values):
            return None
        return sum(values) / len(values)

    @property
    def step_ms(self) -> float | None:
        """The profiled steps' own wall time (not the unprofiled median)."""
        return self._mean("step_ms")

    @property
    def communication_ms(self) -> float | None:
        return self._mean("communication_ms")

    @property
    def transfer_ms(self) -> float | None:
        return self._mean("transfer_ms")

    @property
    def wait_ms(self) -> float | None:
        return self._mean("wait_ms")

    @property
    def exposed_ms(self) -> float | None:
        return self._mean("exposed_ms")

    @property
    def exposed_transfer_ms(self) -> float | None:
        return self._mean("exposed_transfer_ms")

    @property
    def overlapped_ms(self) -> float | None:
        exposed, total = self.exposed_ms, self.communication_ms
        return None if exposed is None or total is None else total - exposed


def _keyed(collectives: list[tuple[str, float, float]]) -> dict[tuple[str, int], Interval]:
    """The collectives of one step by (name, how many of that name came before): the k-th all-reduce
    of a step is the same collective on every rank, whatever the order of other names around it."""
    seen: dict[str, int] = {}
    out = {}
    for name, start, end in collectives:
        k = seen.get(name, 0)
        seen[name] = k + 1
        out[(name, k)] = (start, end)
    return out


def communication_figures(profiles: Sequence[RankProfile]) -> list[CommunicationTime]:
    """Every rank's communication per profiled step (``profiles`` in rank order; step ``i`` of every
    rank is the same training step).

    The profiles of different processes have different clocks (each profiler counts from its own
    start, and hosts' clocks differ by more than a collective lasts), so the ranks' START times of a
    collective cannot be compared reliably. Its END can: a collective completes on every rank at once
    (within microseconds), once the last rank has arrived and the data has moved. Aligned at their
    ends, the ranks' copies of one collective differ only in how early each started: the shortest is
    the last rank to arrive, which did not wait, so the transfer is the shortest duration over the
    ranks, and rank r waited ``duration_r - transfer``. On each rank the transfer is the LAST
    ``transfer`` ms of its collective: ``transfer_ms`` is the union of those tails within the step,
    ``wait_ms`` the rest of the collectives' union, so that ``communication_ms = transfer_ms + wait_ms``
    is within the step by construction.
    """
    figures = []
    keyed = [[_keyed(step.collectives) for step in p.steps] for p in profiles]
    for rank, profile in enumerate(profiles):
        steps = []
        for i, step in enumerate(profile.steps):
            peers = [k[i] for k in keyed if i < len(k)]
            tails, matched = [], len(peers) == len(profiles)
            for key, (start, end) in keyed[rank][i].items():
                durations = [peer[key][1] - peer[key][0] for peer in peers if key in peer]
                matched &= len(durations) == len(profiles)
                transfer = min(durations) if len(durations) == len(profiles) else end - start
                tails.append((end - transfer, end))
            comm = _union((s, e) for _, s, e in step.collectives)
            transfer_union = _union(tails)
            communication, transfer = _length(comm), _length(transfer_union)
            exposed = exposed_transfer = None
            if step.busy is not None:
                exposed = communication - _length(_overlap(comm, _union(step.busy)))
                exposed_transfer = transfer - _length(_overlap(transfer_union, _union(step.busy)))
            steps.append(StepCommunication(step=step.number, step_ms=step.step_ms, communication_ms=communication,
                                           transfer_ms=transfer, wait_ms=communication - transfer, exposed_ms=exposed,
                                           exposed_transfer_ms=exposed_transfer, matched=matched))
        figures.append(CommunicationTime(rank=rank, on_device=profile.on_device, steps=steps,
                                         collectives=profile.collectives()))
    return figures


# ------------------------------------------------------------------------------------------------
# Physical sanity
# ------------------------------------------------------------------------------------------------


class ImpossibleFigures(BenchmarkError):
    """Communication figures that cannot be true: longer than the step they were measured in, or a
    transfer that differs between the ranks of the same collectives."""


def check_physical(figures: Sequence[CommunicationTime], *, rel_tol: float = 0.05, abs_tol_ms: float = 0.05,
                   strict: bool = True) -> list[str]:
    """Every reason ``figures`` (one per rank) cannot be true, as sentences; raises
    :class:`ImpossibleFigures` with all of them when ``strict``.

    Per rank and step: communication and exposed time within the profiled step, exposed within the
    communication, transfer + wait = communication. Per step across ranks: the transfer times equal
    within ``max(abs_tol_ms, rel_tol x the largest)`` (the skew goes to ``wait_ms``, not here)."""
    problems = []
    for f in figures:
        for s in f.steps:
            where = f"rank {f.rank}, profiled step {s.step}"
            slack = max(abs_tol_ms, 1e-6 * s.step_ms)
            if s.communication_ms > s.step_ms + slack:
                problems.append(f"{where}: communication {s.communication_ms:.3f} ms in a step of {s.step_ms:.3f} ms")
            for name in ("exposed_ms", "exposed_transfer_ms"):
                value = getattr(s, name)
                if value is not None and value > min(s.step_ms, s.communication_ms) + slack:
                    problems.append(f"{where}: {name.removesuffix('_ms').replace('_', ' ')} {value:.3f} ms exceeds the "
                                    f"communication ({s.communication_ms:.3f} ms) or the step ({s.step_ms:.3f} ms)")
            if min(s.transfer_ms, s.wait_ms) < -slack or abs(s.transfer_ms + s.wait_ms - s.communication_ms) > slack:
                problems.append(f"{where}: transfer {s.transfer_ms:.3f} + wait {s.wait_ms:.3f} ms is not the "
                                f"communication {s.communication_ms:.3f} ms")
    for i in range(min((len(f.steps) for f in figures), default=0)):
        transfers = [f.steps[i].transfer_ms for f in figures]
        if max(transfers) - min(transfers) > max(abs_tol_ms, rel_tol * max(transfers)):
            why = ("collectives that do not end together on every rank" if all(f.steps[i].matched for f in figures)
                   else "collectives not found on every rank")
            problems.append(f"profiled step {figures[0].steps[i].step}: the ranks' transfer times differ ("
                            + ", ".join(f"rank {f.rank} {t:.3f} ms" for f, t in zip(figures, transfers))
                            + f"): {why}")
    if strict and problems:
        raise ImpossibleFigures("impossible communication figures:\n  - " + "\n  - ".join(problems))
    return problems


def trace_timeline(path: str | Path, step: int | None = None) -> pd.DataFrame:
    """The work of one profiled step in a Chrome trace that ``profile_steps`` wrote, for a timeline
    plot: on a GPU every kernel and copy, by stream; on a CPU the outermost operators of every thread
    (a collective inside a DDP hook stays visible, its parts do not). Columns: ``lane`` (stream or
    thread; gloo runs its collectives on threads of its own), ``name``, ``start_ms`` (from the step's
    start), ``duration_ms``, ``collective``. ``step``
    picks a ``ProfilerStep#N`` (default: the last one in the trace)."""
    events = [e for e in load_events(path) if e.get("ph") == "X"]
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


_KINDS = (("all-reduce", re.compile(r"all_?reduce", re.IGNORECASE)),
          ("all-gather", re.compile(r"all_?gather", re.IGNORECASE)),
          ("reduce-scatter", re.compile(r"reduce_?scatter", re.IGNORECASE)),
          ("broadcast", re.compile(r"broadcast", re.IGNORECASE)),
          ("all-to-all", re.compile(r"all_?to_?all", re.IGNORECASE)))
_COPY = re.compile(r"memcpy|memset", re.IGNORECASE)


def collective_kinds(names: Iterable[str]) -> list[str]:
    """The kinds of collective (``all-reduce``, ``all-gather``, ...) that event names show, in a fixed order."""
    names = list(names)
    return [kind for kind, pattern in _KINDS if any(pattern.search(n) for n in names)]


def lane_names(timeline: pd.DataFrame, library: str) -> dict[str, str]:
    """A name for every lane of :func:`trace_timeline` by what runs on it, instead of its stream or thread
    id: on a GPU ``"compute stream"`` (kernels, no collective), ``"NCCL stream: all-reduce"`` (only
    collectives: ``library`` names them), ``"copy stream"`` (only copies and sets), ``"compute + NCCL
    stream"``; on the CPU the thread with the most operators is ``"main thread: forward, backward,
    optimizer"``, the others (where gloo runs its collectives) ``"gloo thread: all-gather, ..."``. The
    id follows in brackets where two lanes would read the same."""
    on_cpu = timeline.lane.astype(str).str.startswith("thread").all()
    names: dict[str, str] = {}
    busiest = timeline[~timeline.collective].lane.value_counts()
    main = busiest.index[0] if on_cpu and len(busiest) else None
    for lane, part in timeline.groupby("lane", sort=False):
        kinds = collective_kinds(part[part.collective].name)
        what = ", ".join(kinds) or "collectives"
        if on_cpu:
            names[lane] = ("main thread: forward, backward, optimizer" if lane == main else
                           f"{library} thread: {what}" if part.collective.any() else "other thread")
        elif part.collective.all():
            names[lane] = f"{library} stream: {what}"
        elif not part.collective.any():
            names[lane] = "copy stream" if part.name.map(lambda n: bool(_COPY.search(n))).all() else "compute stream"
        else:
            names[lane] = f"compute + {library} stream: {what}"
    counts = pd.Series(list(names.values())).value_counts()
    return {lane: f"{name} [{lane}]" if counts[name] > 1 else name for lane, name in names.items()}
