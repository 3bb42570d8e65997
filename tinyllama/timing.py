"""Honest timing of asynchronous device work.

GPU kernels run after the Python call that launched them returns, so a host clock read without a
synchronize measures the launch, not the work. Here, GPU work is timed with device events and CPU
work with a monotonic clock; both after warm-up, repeated, and summarised by median and spread.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

import torch
import torch.autograd.profiler as _autograd_profiler

from tinyllama import device as dev
from tinyllama.config import BenchmarkError

# --------------------------------------------------------------------------------------------------
# No timing after a profiler session
# --------------------------------------------------------------------------------------------------
# After a torch.profiler session ends, CUPTI (roctracer on ROCm) stays attached to the process and
# every later kernel launch costs more: on an H200 an eager V2 step went from 56.7 ms in a fresh
# process to 81.5 ms after one profiler session, while CUDA-graph replays did not move. A timing
# taken after profiling therefore says "host-bound" about a step that is not. So every timer here
# first asks :func:`require_unprofiled`, which refuses once a profiler has run in this process.
# PyTorch calls ``_run_on_profiler_start`` whenever a kineto session starts (torch.profiler.profile
# and torch.autograd.profiler.profile alike), so wrapping it sees the participant's own profilers too.

class ProfilerResidueError(BenchmarkError):
    """A timing was asked for in a process where a profiler session has already run."""


_profiler_sessions: list[str] = []


def _install_profiler_hook() -> None:
    original = getattr(_autograd_profiler, "_run_on_profiler_start", None)
    if original is None or getattr(original, "_tinyllama_hook", False):
        return

    def on_start() -> None:
        _profiler_sessions.append("torch.profiler")
        original()

    on_start._tinyllama_hook = True  # type: ignore[attr-defined]
    _autograd_profiler._run_on_profiler_start = on_start


_install_profiler_hook()


def profiler_has_run() -> bool:
    """Whether a profiler session has started in this process (since :func:`forget_profiler_sessions`)."""
    return bool(_profiler_sessions)


def profiler_active() -> bool:
    """Whether a torch.profiler session is recording right now."""
    return bool(getattr(_autograd_profiler, "_is_profiler_enabled", False))


def forget_profiler_sessions() -> None:
    """Clear the record of profiler sessions: for test suites, whose tests each start clean. A
    participant restarts the kernel instead (the residue is real; only a new process is free of it)."""
    _profiler_sessions.clear()


def require_unprofiled(what: str = "this timing") -> None:
    """Raise :class:`ProfilerResidueError` when a profiler session has run in this process and none is
    recording now. Timing the profiled run itself (inside a session) is allowed: it measures what
    profiling costs and is reported as profiled. On a CPU the profiler leaves no residue, but the rule
    holds there too, so a notebook that breaks it fails on the CI machine before it misleads on a GPU."""
    if _profiler_sessions and not profiler_active():
        raise ProfilerResidueError(
            f"{what} refused: a profiler session has already run in this process, and on a GPU its "
            "tracing library stays attached and slows every later launch (eager steps by 10-40%). Time "
            "first and profile afterwards (restart the kernel, run the timing cells before the profiling "
            "ones), or profile in a separate process (tinyllama.profiling.isolated).")


@dataclass
class Stats:
    """Summary of repeated measurements (milliseconds unless said otherwise)."""

    median: float
    mean: float
    std: float
    min: float
    max: float
    p10: float
    p90: float
    n: int
    # The 95% confidence intervals of the median and of the p10 (:func:`quantile_interval`): where the same
    # quantile of a rerun of as many samples would fall. NaN in figures recorded before they were kept.
    median_low: float = math.nan
    median_high: float = math.nan
    p10_low: float = math.nan
    p10_high: float = math.nan

    @property
    def spread_pct(self) -> float:
        """Relative spread: (p90 - p10) / median, in percent."""
        return 100.0 * (self.p90 - self.p10) / self.median if self.median else 0.0

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        out = {prefix + k: v for k, v in asdict(self).items()}
        out[prefix + "spread_pct"] = self.spread_pct
        return out


def quantile(samples: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``samples`` (0 <= q <= 1), interpolated linearly between the closest ranks, as
    ``numpy.percentile`` does by default."""
    data = sorted(float(s) for s in samples)
    if not data:
        raise ValueError("no samples to take a quantile of")
    position = q * (len(data) - 1)
    low = int(position)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (position - low)


# The confidence of :func:`quantile_interval`: 95%, the usual two-sided level.
INTERVAL_CONFIDENCE = 0.95


def quantile_interval(samples: Sequence[float], q: float = 0.5,
                      confidence: float = INTERVAL_CONFIDENCE) -> tuple[float, float]:
    """The ``confidence`` interval of the ``q`` quantile of ``samples`` (the median by default), free of any
    assumption about their distribution: the order statistics of ranks ``n q -+ z sqrt(n q (1 - q))`` (the
    binomial count of samples below the true quantile, in its normal approximation; for the median of 100
    samples the 40th and 61st). It narrows as ``1/sqrt(n)``, unlike the p10-p90 spread of single samples, so
    it answers "would a rerun give another median (or p10)?" rather than "how much does one step vary?".
    Where the ranks run past the samples, the interval ends at the smallest or the largest one."""
    data = sorted(float(s) for s in samples)
    if not data:
        raise ValueError("no samples to take a quantile interval of")
    if not 0.0 < confidence < 1.0 or not 0.0 < q < 1.0:
        raise ValueError(f"confidence and q must lie between 0 and 1, got {confidence} and {q}")
    n = len(data)
    half = statistics.NormalDist().inv_cdf(0.5 + confidence / 2) * math.sqrt(n * q * (1 - q))
    low_rank = max(1, math.floor(n * q - half))  # 1-based ranks, as the textbooks state them
    high_rank = min(n, math.ceil(n * q + half + 1))
    return data[low_rank - 1], data[high_rank - 1]


def median_interval(samples: Sequence[float], confidence: float = INTERVAL_CONFIDENCE) -> tuple[float, float]:
    """The ``confidence`` interval of the median of ``samples`` (:func:`quantile_interval` at 0.5)."""
    return quantile_interval(samples, 0.5, confidence)


def summarize(samples: Sequence[float]) -> Stats:
    """Median (with its 95% confidence interval), mean, standard deviation, extremes and 10th/90th
    percentiles of ``samples``."""
    if not samples:
        raise ValueError("no samples to summarize: run at least one timed step")
    data = sorted(float(s) for s in samples)
    n = len(data)
    median_low, median_high = median_interval(data)
    p10_low, p10_high = quantile_interval(data, 0.10)
    return Stats(
        median=statistics.median(data),
        mean=statistics.fmean(data),
        std=statistics.stdev(data) if n > 1 else 0.0,
        min=data[0],
        max=data[-1],
        p10=quantile(data, 0.10),
        p90=quantile(data, 0.90),
        n=n,
        median_low=median_low,
        median_high=median_high,
        p10_low=p10_low,
        p10_high=p10_high,
    )


class PhaseTimer:
    """Times the phases of one step (forward, backward, optimizer, ...).

    On a GPU it records a device event at every mark and reads the elapsed times after one
    synchronize at the end of the step, so the phases do not stall the queue. On the CPU it reads a
    monotonic clock. It refuses to start in a process a profiler has run in (:func:`require_unprofiled`),
    unless the run it times is itself ``profiled`` and reported as such.

    >>> timer = PhaseTimer(torch.device("cpu"))
    >>> timer.start(); _ = torch.ones(4).sum(); timer.mark("work")
    >>> list(timer.stop())
    ['work']
    """

    def __init__(self, device: torch.device, profiled: bool = False) -> None:
        # A run that is itself profiled (and reported as such) may follow another profiler session.
        if not profiled:
            require_unprofiled("timing with a PhaseTimer")
        self.device = device
        self._use_events = device.type == "cuda"
        self._marks: list[tuple[str, object]] = []

    def _now(self) -> object:
        if self._use_events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def start(self) -> None:
        """Begin a step: earlier work on the device is finished first, so it is not counted."""
        dev.synchronize(self.device)
        self._marks = [("start", self._now())]

    def mark(self, phase: str) -> None:
        """End ``phase`` (which began at the previous mark)."""
        self._marks.append((phase, self._now()))

    def stop(self) -> dict[str, float]:
        """Wait for the device and return each phase's duration in milliseconds. A phase marked
        several times in a step (forward and backward of each accumulated micro-batch) is summed."""
        dev.synchronize(self.device)
        out: dict[str, float] = {}
        for (_, before), (phase, after) in zip(self._marks, self._marks[1:]):
            if self._use_events:
                ms = before.elapsed_time(after)  # type: ignore[attr-defined]
            else:
                ms = (after - before) * 1e3  # type: ignore[operator]
            out[phase] = out.get(phase, 0.0) + ms
        return out


class Band(NamedTuple):
    """A timing's median, its p10-p90 band and (where known) the 95% intervals of its median and of its p10:
    what :func:`verdict` reads, for figures kept in a table."""

    median: float
    p10: float
    p90: float
    median_low: float = math.nan
    median_high: float = math.nan
    p10_low: float = math.nan
    p10_high: float = math.nan


# The least gain the course calls worth a change (``verdict``'s ``min_ratio`` where a decision is taken on
# it). It is set beyond what two runs of one machine disagree by: in two runs of notebook 20 on one H200
# machine (2026-11-27, timed in turns), the fast steps' gain of one change differed by up to 8% (bf16 after
# the shorter sequence: 1.08x and 1.01x), so a least gain of 5% let one run keep that change and the other
# not, and every later phase of the two runs differed.
MIN_GAIN = 1.10


def verdict(before: Stats | Band, after: Stats | Band, *, on: str = "spread",
            min_ratio: float = 1.0) -> tuple[float, str]:
    """The one comparison of two timed runs: the gain ``before / after`` (of the medians, or of the p10s with
    ``on="p10"``), and ``"faster"`` when after's whole band lies below before's, ``"slower"`` when above, else
    ``"within noise"``.

    ``on="spread"`` compares the p10-p90 bands of single samples: is (nearly) every call faster? That
    needs a gain larger than the samples' own scatter. ``on="median"`` compares the medians' 95%
    confidence intervals (:func:`quantile_interval`): would a rerun find the same order of the typical
    calls? ``on="p10"`` compares the intervals of the p10s, the fast calls: where a step's time is the
    longer of the host's issue time and the device's work, the host's part comes and goes with its load,
    and the median follows it from run to run, while the fast steps, where the host kept up, show what
    the configuration itself does. ``min_ratio`` (at least 1) is the gain below which a difference counts as
    within noise even where the bands part (:data:`MIN_GAIN` where a change is kept or rejected on it). A band
    of NaN (no timing, or no interval recorded) is never faster or slower."""
    if min_ratio < 1.0:
        raise ValueError(f"min_ratio is a gain, at least 1, got {min_ratio}")
    if on == "spread":
        before_low, before_high, after_low, after_high = before.p10, before.p90, after.p10, after.p90
    elif on == "median":
        before_low, before_high = before.median_low, before.median_high
        after_low, after_high = after.median_low, after.median_high
    elif on == "p10":
        before_low, before_high = before.p10_low, before.p10_high
        after_low, after_high = after.p10_low, after.p10_high
    else:
        raise ValueError(f"on must be 'spread', 'median' or 'p10', got {on!r}")
    # The gain is that of the quantile compared (the medians' for the spreads).
    ratio = before.p10 / after.p10 if on == "p10" else before.median / after.median
    if after_high < before_low and ratio >= min_ratio:
        return ratio, "faster"
    if after_low > before_high and 1 / ratio >= min_ratio:
        return ratio, "slower"
    return ratio, "within noise"


# A host that adds less than this share to an eager step does not set its pace, even where the two
# bands separate: a few percent is within what a profile, a clock change or a neighbour moves.
HOST_BOUND_SHARE = 0.05


def host_verdict(eager: Stats | Band, replayed: Stats | Band) -> tuple[float, str]:
    """The one host-versus-device verdict, from unprofiled evidence: an eager step against the same step
    replayed from CUDA graphs (the device's own time, no host in it). Returns the host's share of the
    eager step, ``1 - replayed / eager``, and ``"host-bound"`` when the eager step is slower beyond both
    bands and by more than :data:`HOST_BOUND_SHARE`, else ``"device-bound"`` (the replay is the eager
    step's time within noise, or the host adds only a little)."""
    share = 1.0 - replayed.median / eager.median
    _, said = verdict(eager, replayed)
    return share, "host-bound" if said == "faster" and share > HOST_BOUND_SHARE else "device-bound"


# The device finished within this factor of the host's issue time: it was waiting for the launches.
HOST_FINISH_FACTOR = 1.25


def issue_verdict(issued: Stats | Band, finished: Stats | Band) -> tuple[float, str]:
    """The host-versus-device verdict where no replay exists (one call, or a step that cannot be captured):
    how long the host took to issue the work against how long the device took to finish it, both from the
    same start on an idle device and without a profiler. Returns ``finished / issued`` and ``"host-bound"``
    when the device finished within :data:`HOST_FINISH_FACTOR` of the issue time (it waited for the
    launches), else ``"device-bound"``. :func:`host_verdict` is the same question answered from an eager
    step against its replay; use it where the step can be replayed."""
    ratio = finished.median / issued.median
    return ratio, "host-bound" if ratio < HOST_FINISH_FACTOR else "device-bound"


def time_samples(fn: Callable[[], object], device: torch.device | str | None = None, warmup: int = 3,
                 repeat: int = 10, inner: int = 1, min_time_s: float = 0.0) -> list[float]:
    """Milliseconds per call of ``fn()`` on ``device``, one sample per timed repetition of ``inner``
    calls (averaged): ``warmup`` untimed calls, then at least ``repeat`` samples (and more until
    ``min_time_s`` has passed, at most 10,000). Device events on a GPU, a monotonic clock on the CPU.
    """
    if repeat < 1 or inner < 1:
        raise ValueError("repeat and inner must be at least 1")
    device = torch.device(device) if device is not None else dev.get_device()
    for _ in range(warmup):
        fn()
    timer = PhaseTimer(device)
    samples: list[float] = []
    began = time.perf_counter()
    while len(samples) < repeat or time.perf_counter() - began < min_time_s:
        timer.start()
        for _ in range(inner):
            fn()
        timer.mark("calls")
        samples.append(timer.stop()["calls"] / inner)
        if len(samples) >= 10_000:
            break
    return samples


def time_in_turns(calls: Mapping[str, Callable[[], object]], device: torch.device | str | None = None, *,
                  rounds: int = 20, per_turn: int = 2, warmup: int = 2,
                  progress: Callable[[Iterable[int]], Iterable[int]] | None = None) -> dict[str, list[float]]:
    """Milliseconds of each call of every function in ``calls``, timed in turns: ``warmup`` untimed calls of
    each, then ``rounds`` rounds in which each function makes ``per_turn`` timed calls (one sample a call,
    from an idle device), in an order that rotates from round to round.

    This is how the course compares settings that it cannot time in two processes at once: whatever the
    host does meanwhile (another process, a clock change, a neighbour's compile) falls on all of them alike.
    Timed one after the other instead, a launch-bound training step's median moved by up to 26% between
    two settings' turns on an H200 (notebook 20, 2026-11-27), and two runs reached opposite verdicts. The
    order is the same in every process, so ranks of a process group that call this with the same names
    run their collectives in step. ``progress`` wraps the rounds (a progress bar)."""
    if rounds < 1 or per_turn < 1 or warmup < 0:
        raise ValueError(f"rounds and per_turn must be at least 1 and warmup at least 0 "
                         f"(got {rounds}, {per_turn}, {warmup})")
    if not calls:
        raise ValueError("nothing to time: give at least one function")
    device = torch.device(device) if device is not None else dev.get_device()
    names = list(calls)
    for name in names:
        for _ in range(warmup):
            calls[name]()
    timer = PhaseTimer(device)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for turn in (progress or (lambda rounds: rounds))(range(rounds)):
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            for _ in range(per_turn):
                timer.start()
                calls[name]()
                timer.mark("call")
                samples[name].append(timer.stop()["call"])
    return samples


def time_callable(fn: Callable[[], object], device: torch.device | str | None = None, warmup: int = 3,
                  repeat: int = 10, min_time_s: float = 0.0) -> Stats:
    """:func:`time_samples` of ``fn()`` (one call a sample), summarised: milliseconds per call."""
    return summarize(time_samples(fn, device, warmup, repeat, min_time_s=min_time_s))


def graph_replay(run: Callable[[], object], device: torch.device | str | None = None,
                 stream: torch.cuda.Stream | None = None) -> Callable[[], None]:
    """``run`` captured once in a CUDA (HIP) graph, after one call outside it (capture needs its kernels
    compiled and its memory allocated first); returns the graph's replay. A replay launches every captured
    kernel at once, without Python, so its time is the device's own (``costs.kernel_costs.device_ms`` and the
    kernel benchmark time kernels so; a training step replays its own three graphs, ``training``). ``stream``: the
    stream to capture on (default: a private one of ``torch.cuda.graph``); give the stream earlier work ran
    on where the captured calls depend on it (a backward on its forward's). Raises ``RuntimeError`` naming
    the cause where ``run`` cannot be captured (it waits for the host, or needs a GPU)."""
    device = dev.get_device(None if device is None else str(device))
    if device.type != "cuda":
        raise RuntimeError(f"graph replay needs a GPU, not {device}: time the calls themselves")
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        run()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=stream):
            run()
    except RuntimeError as error:
        cause = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise RuntimeError(f"the call could not be captured in a CUDA graph ({cause}); time its launches with "
                           "tinyllama.timing.time_callable instead") from error
    return graph.replay


@dataclass
class CallTimes:
    """One call of a function timed two ways (milliseconds per call).

    ``single``: each call alone, from an idle device (synchronize before and after): what one call
    costs a caller who waits for it, launch latency included. ``back_to_back``: ``calls`` calls
    between two device events, per call: what the call costs once the device is kept fed. ``issue``:
    the host's time to issue those back-to-back calls, per call (no synchronize inside); when it is
    close to ``back_to_back``, the device waited for the host even there.
    """

    single: Stats
    back_to_back: Stats
    issue: Stats
    calls: int


def time_single_and_back_to_back(fn: Callable[[], object], device: torch.device | str | None = None,
                                 warmup: int = 3, repeat: int = 10, target_ms: float = 2.0,
                                 max_calls: int = 200) -> CallTimes:
    """:class:`CallTimes` of ``fn()``: ``repeat`` single calls, then ``repeat`` samples of back-to-back
    calls, as many per sample as fill about ``target_ms`` (at most ``max_calls``, which keeps the
    device's launch queue from filling and blocking the host)."""
    if repeat < 1 or max_calls < 1 or target_ms <= 0:
        raise ValueError("repeat and max_calls must be at least 1 and target_ms positive")
    device = torch.device(device) if device is not None else dev.get_device()
    single = summarize(time_samples(fn, device, warmup=warmup, repeat=repeat))
    calls = max(1, min(max_calls, int(target_ms / max(single.median, 1e-6)) + 1))
    on_gpu = device.type == "cuda"
    issue: list[float] = []
    work: list[float] = []
    for _ in range(repeat):
        dev.synchronize(device)  # start from an idle device, as the single calls do
        if on_gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        began = time.perf_counter()
        for _ in range(calls):
            fn()
        issued = time.perf_counter()
        issue.append((issued - began) * 1e3 / calls)
        if on_gpu:
            end.record()
            end.synchronize()
            work.append(start.elapsed_time(end) / calls)
        else:
            work.append(issue[-1])
    return CallTimes(single, summarize(work), summarize(issue), calls)


class StepClock:
    """A step that times itself: each call starts from an idle device and records the host's time to
    issue ``fn()`` (a clock around the call, no synchronize inside) and the device's time to finish it
    (device events; on a CPU the two are the same), in milliseconds. It times a step that another
    caller drives, such as a profiler's loop, the way :func:`time_single_and_back_to_back` times a single
    call.

    >>> clock = StepClock(lambda: torch.ones(4).sum(), torch.device("cpu"))
    >>> _ = clock(); _ = clock()
    >>> clock.host_ms().n
    2
    """

    def __init__(self, fn: Callable[[], object], device: torch.device | str | None = None) -> None:
        self.fn = fn
        self.device = torch.device(device) if device is not None else dev.get_device()
        self.host: list[float] = []
        self.work: list[float] = []

    def __call__(self) -> object:
        require_unprofiled("a StepClock step")
        dev.synchronize(self.device)
        on_gpu = self.device.type == "cuda"
        if on_gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        began = time.perf_counter()
        out = self.fn()
        self.host.append((time.perf_counter() - began) * 1e3)
        if on_gpu:
            end.record()
            end.synchronize()
            self.work.append(start.elapsed_time(end))
        else:
            self.work.append(self.host[-1])
        return out

    def host_ms(self, last: int | None = None) -> Stats:
        """The host's time to issue a call, over the ``last`` calls (default: all)."""
        return summarize(self.host[-last:] if last else self.host)

    def device_ms(self, last: int | None = None) -> Stats:
        """The device's time from a call's first launch to its last kernel's end, over the ``last`` calls."""
        return summarize(self.work[-last:] if last else self.work)
