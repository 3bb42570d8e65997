"""``torch.compile``'s modes measured apart: each mode's compile cold and warm, its steady batch time,
and what ``max-autotune`` chose (notebook 06).

A compile is only comparable with another when both start from the same state. Two caches decide it:

- **on disk**, Inductor's and Triton's cache folders (compiled graphs, generated kernels, their binaries,
  autotuning results): a compile that finds them full is *warm*. :func:`run_mode` compiles each mode
  in its own empty folders (*cold*, as on a new machine), then once more in the folders the cold compile
  filled (*warm*, as after a restart);
- **in the process**, the first compile also pays for importing Inductor and Triton and starting the
  compile workers; every later compile skips that. :func:`warm_up_compiler` pays it up front with a
  one-line function, so that the first mode measured does not carry it (and says how long it took).

- :func:`one_time_seconds`: what a run's warm-up iterations took beyond steady ones (the compile, the
  graph recording of ``reduce-overhead``, cuDNN's algorithm search);
- :func:`run_eager` and :func:`run_mode`: the benchmark of :mod:`inference` run eagerly, or compiled in
  one mode cold and warm (a :class:`ModeRun`); :func:`modes_table` puts runs side by side;
- :func:`autotune_choices`: the table ``max-autotune`` prints for each operation it autotuned, read into
  rows (which kernel won, a generated Triton one or the vendor library's);
- :func:`forward_operators`: the ATen operators of one forward pass, by kind (what Inductor keeps as
  library calls, what it can fuse, what costs nothing).
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from inference import networks
from inference.benchmark import BenchmarkResult, run_benchmark
from inference.config import WITHOUT_CONV_TEMPLATES, BenchmarkConfig
from tinyllama import device as dev
from tinyllama.profiling.compiled import empty_compile_caches
from tinyllama.profiling.operators import OperatorCalls

# ATen operators that call a vendor library (cuDNN/MIOpen, cuBLAS/hipBLASLt, oneDNN) and that Inductor
# keeps as library calls in the default mode; max-autotune may replace them with generated kernels.
LIBRARY_OPERATORS = frozenset({"conv1d", "conv2d", "conv3d", "convolution", "_convolution", "cudnn_convolution",
                               "mkldnn_convolution", "linear", "matmul", "mm", "addmm", "bmm", "baddbmm",
                               "_scaled_mm"})
LIBRARY_CHOICES = LIBRARY_OPERATORS | {"bias_addmm", "_int_mm"}


_HEADER = re.compile(r"^AUTOTUNE (\w+)\((.*)\)\s*$")
_CHOICE = re.compile(r"^\s+(\S+) ([0-9.]+|inf) ms\b")
_SUMMARY = re.compile(r"AUTOTUNE benchmarking takes ([0-9.]+) seconds and ([0-9.]+) seconds precompiling "
                      r"for (\d+) choices")
_DETAIL = re.compile(r"^(strides|dtypes): ")


def one_time_seconds(result: BenchmarkResult) -> float:
    """Seconds the warm-up iterations took beyond as many steady iterations (the median): the compile
    in the first one, the CUDA graph recording of ``reduce-overhead`` in the next ones, and cuDNN's
    algorithm search (``cudnn.benchmark``) for every run, eager included."""
    median = result.timing.median
    return sum(max(ms - median, 0.0) for ms in result.warmup_ms) / 1e3


def warm_up_compiler(device: torch.device | str) -> float:
    """Compile and run a one-line function in empty cache folders and return its seconds: the costs a
    process pays at its first compile (importing Inductor and Triton, starting the compile workers,
    the first kernel build), which every later compile in the process skips."""
    device = torch.device(device)
    x = torch.randn(256, 256, device=device)
    fn = torch.compile(lambda t: torch.relu(t) * 2.0 + 1.0, dynamic=False)
    with empty_compile_caches():
        dev.synchronize(device)
        began = time.perf_counter()
        fn(x)
        dev.synchronize(device)
        seconds = time.perf_counter() - began
    torch._dynamo.reset()
    return seconds


@dataclass
class ModeRun:
    """One configuration: eager (``mode == "eager"``) or compiled in ``mode``. ``cold`` ran in empty cache
    folders, ``warm`` (compiled runs) right after it in the folders the cold compile filled; ``order``
    is the position of the cold compile among this process's compiles (1: the first; 0 for eager);
    ``autotune`` the choices max-autotune printed during the cold compile (empty for other modes)."""

    mode: str
    order: int
    cold: BenchmarkResult
    warm: BenchmarkResult | None = None
    autotune: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def cold_s(self) -> float:
        """One-time seconds with empty caches (for eager: its warm-up excess, paid at every start)."""
        return one_time_seconds(self.cold)

    @property
    def warm_s(self) -> float:
        """One-time seconds with the caches filled (eager caches nothing: the same as ``cold_s``)."""
        return one_time_seconds(self.warm) if self.warm is not None else self.cold_s

    @property
    def ms_per_batch(self) -> float:
        """The steady median of the cold run's timed iterations."""
        return self.cold.ms_per_batch


def _settings(settings: dict[str, Any]) -> dict[str, Any]:
    bad = {"compile", "compile_options", "network"} & set(settings)
    if bad:
        raise ValueError(f"pass the mode as an argument, not {', '.join(sorted(bad))} in the settings")
    return settings


def run_eager(network: str, **settings: Any) -> ModeRun:
    """The eager baseline: one benchmark run of ``network`` (settings: :class:`BenchmarkConfig`'s fields)."""
    return ModeRun("eager", 0, run_benchmark(BenchmarkConfig(network=network, **_settings(settings))))


def run_mode(network: str, mode: str, order: int, warm: bool = True, inductor: dict[str, Any] | None = None,
             **settings: Any) -> ModeRun:
    """``network`` compiled with ``torch.compile(mode=mode)``: a cold run in fresh, empty Inductor and
    Triton cache folders, then (``warm``) a second run with Dynamo reset and the folders the first
    filled. Both are full benchmark runs (checked against fp32 eager, warmed up, timed). ``order``
    says how many compiles this process has run before, counting this one (for the record).
    ``inductor``: settings of ``torch._inductor.config`` that hold for both compiles (e.g.
    :data:`WITHOUT_CONV_TEMPLATES`), restored afterwards."""
    config = BenchmarkConfig(network=network, compile=True, compile_options={"mode": mode}, **_settings(settings))
    import torch._inductor.config as inductor_config

    with inductor_config.patch(inductor or {}), empty_compile_caches():
        with captured_autotune() as printed:
            cold = run_benchmark(config)
        warm_run = None
        if warm:  # as after a restart: Dynamo reset (run_benchmark does it), nothing in memory, the folders full
            _clear_memory_caches()
            with captured_autotune():  # warm: the choices come from the cache; keep any table out
                warm_run = run_benchmark(config)
    return ModeRun(mode, order, cold, warm_run, autotune_choices(printed[0]))


def _clear_memory_caches() -> None:
    """Forget the generated modules Inductor keeps in memory, so that a compile must load them from disk."""
    from torch._inductor import utils

    (getattr(utils, "clear_caches", None) or utils.clear_inductor_caches)()  # renamed in newer releases


def modes_table(runs: Sequence[ModeRun]) -> pd.DataFrame:
    """One row per run, indexed by mode: the order of its compile, one-time seconds cold and warm, the
    steady median and spread, and the speed-up over the first run (the eager baseline)."""
    if not runs:
        raise ValueError("no runs to tabulate")
    base = runs[0].ms_per_batch
    rows = [{"mode": r.mode, "order": r.order, "precision": r.cold.precision, "compile_cold_s": r.cold_s,
             "compile_warm_s": r.warm_s, "ms_per_batch": r.ms_per_batch, "spread_pct": r.cold.timing.spread_pct,
             "speedup": base / r.ms_per_batch} for r in runs]
    return pd.DataFrame(rows).set_index("mode")


@contextlib.contextmanager
def captured_autotune() -> Iterator[list[str]]:
    """Inside, what is written to ``sys.stderr`` is kept; on exit the list yielded holds it as one string,
    and everything but max-autotune's choice tables is passed on to the real ``sys.stderr`` (warnings
    stay visible; the tables, dozens of lines per operation, are read by :func:`autotune_choices`)."""
    buffer, out, original = io.StringIO(), [], sys.stderr
    try:
        with contextlib.redirect_stderr(buffer):
            yield out
    finally:
        text = buffer.getvalue()
        out.append(text)
        rest = _without_autotune(text)
        if rest.strip():
            original.write(rest)


def _without_autotune(text: str) -> str:
    kept, inside, stats = [], False, False
    for line in text.splitlines(keepends=True):
        if line.startswith("Autotune Choices Stats:"):  # newer PyTorch: a JSON summary line follows
            stats = True
            continue
        if stats and line.startswith("{"):
            stats = False
            continue
        stats = False
        if _HEADER.match(line):
            inside = True
            continue
        if inside and (_DETAIL.match(line) or _CHOICE.match(line)):
            continue
        if _SUMMARY.search(line):
            inside = False
            continue
        inside = False
        kept.append(line)
    return "".join(kept)


def choice_kind(name: str) -> str:
    """``generated (Triton)`` for a Triton template Inductor wrote, ``library`` for the vendor library's
    kernel through ATen, ``other`` for anything else (a decomposition, CUTLASS...)."""
    if name.startswith("triton_"):
        return "generated (Triton)"
    if name in LIBRARY_CHOICES or name.startswith(("aten", "extern")):
        return "library"
    return "other"


def autotune_choices(text: str) -> pd.DataFrame:
    """The choice tables max-autotune prints (``AUTOTUNE convolution(16x64x56x56, 64x64x3x3)``, then the
    fastest choices with their times, then ``... AUTOTUNE benchmarking takes X seconds and Y seconds
    precompiling for N choices``) as one row per autotuned operation: ``operation``, ``sizes``,
    ``choices`` (tried), ``winner``, ``winner_kind`` (:func:`choice_kind`), ``winner_ms``, ``library_ms``
    (the library's kernel, when it is among the choices shown), ``benchmark_s``, ``precompile_s``."""
    rows: list[dict[str, Any]] = []
    row: dict[str, Any] | None = None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            row = {"operation": header.group(1), "sizes": header.group(2), "choices": 0, "winner": None,
                   "winner_kind": None, "winner_ms": float("nan"), "library_ms": float("nan"),
                   "benchmark_s": float("nan"), "precompile_s": float("nan")}
            rows.append(row)
            continue
        if row is None:
            continue
        choice = _CHOICE.match(line)
        if choice and not _DETAIL.match(line.strip()):
            name, ms = choice.group(1), float(choice.group(2))
            if row["winner"] is None:  # the table is sorted: the first choice is the fastest
                row.update(winner=name, winner_kind=choice_kind(name), winner_ms=ms)
            if choice_kind(name) == "library" and row["library_ms"] != row["library_ms"]:
                row["library_ms"] = ms
            continue
        summary = _SUMMARY.search(line)
        if summary:
            row.update(benchmark_s=float(summary.group(1)), precompile_s=float(summary.group(2)),
                       choices=int(summary.group(3)))
            row = None
    return pd.DataFrame(rows, columns=["operation", "sizes", "choices", "winner", "winner_kind", "winner_ms",
                                       "library_ms", "benchmark_s", "precompile_s"])


def operator_kind(name: str) -> str:
    """``library`` (a convolution or matrix product: a vendor library's kernel, kept by Inductor),
    ``view`` (no kernel: a new shape over the same memory), or ``element-wise / other`` (normalisation,
    activations, additions, pooling: what Inductor fuses into generated kernels)."""
    base = name.removeprefix("aten::")
    if base in LIBRARY_OPERATORS:
        return "library"
    op = getattr(torch.ops.aten, base, None)
    overloads = [getattr(op, o) for o in op.overloads()] if op is not None else []
    if overloads and all(getattr(o, "is_view", False) for o in overloads):
        return "view"
    return "element-wise / other"


def forward_operators(network: str, input_size: int | None = None) -> pd.DataFrame:
    """The ATen operators one inference forward of ``network`` (batch 1) calls, as eager PyTorch runs it,
    counted on the meta device (shapes only, no arithmetic): ``operator``, ``calls``, ``kind``
    (:func:`operator_kind`), most called first. The same on every device."""
    spec = networks.get_spec(network)
    model = networks.build(spec).eval().to("meta")
    size = input_size or spec.input_size
    inputs = torch.empty(1, 3, size, size, device="meta")
    with torch.inference_mode(), OperatorCalls() as recorder:
        networks.forward(model, spec, inputs)
    calls = Counter(name.removeprefix("aten::") for name in recorder.names)
    table = pd.DataFrame([{"operator": name, "calls": count, "kind": operator_kind(name)}
                          for name, count in calls.items()])
    return table.sort_values(["calls", "operator"], ascending=[False, True], ignore_index=True)


__all__ = ["LIBRARY_CHOICES", "LIBRARY_OPERATORS", "ModeRun", "autotune_choices", "captured_autotune", "choice_kind",
           "forward_operators", "modes_table", "one_time_seconds", "operator_kind", "run_eager", "run_mode",
           "warm_up_compiler"]


# --------------------------------------------------------------------------------------------------
# Serving scenarios: what a mode costs in all, compile and batches together
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """A way of serving: the process starts ``starts`` times and runs ``batches_per_start`` batches each
    time; ``kept_cache``: every start after the first finds the compile caches the first one filled
    (the same node, a kept ``TORCHINDUCTOR_CACHE_DIR``), else every start compiles cold."""

    name: str
    description: str
    starts: int
    batches_per_start: int
    kept_cache: bool


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("one-off job", "a script classifies 500 batches once, on a freshly provisioned machine", 1, 500, False),
    Scenario("nightly restarts", "a service on its own node, restarted every night with its cache folders kept, "
             "serving 100,000 batches a day for 30 days", 30, 100_000, True),
    Scenario("autoscaled replicas", "replicas started on fresh nodes at each traffic peak (empty caches), each "
             "serving 2,000 batches before it is stopped: 200 starts a month", 200, 2_000, False),
)


def serving_seconds(compile_cold_s: float, compile_warm_s: float, ms_per_batch: float, scenario: Scenario) -> float:
    """Seconds a ``scenario`` costs in one configuration: its one-time cost at every start (cold at the first;
    warm at the later ones when the cache is kept, else cold again) plus every batch at ``ms_per_batch``."""
    later = compile_warm_s if scenario.kept_cache else compile_cold_s
    one_time = compile_cold_s + (scenario.starts - 1) * later
    return one_time + scenario.starts * scenario.batches_per_start * ms_per_batch / 1e3


def scenario_costs(table: pd.DataFrame, scenarios: Sequence[Scenario] = SCENARIOS) -> pd.DataFrame:
    """:func:`serving_seconds` of every run in ``table`` (:func:`modes_table`) for every scenario: one
    column per scenario, one row per run."""
    return pd.DataFrame({s.name: {mode: serving_seconds(row.compile_cold_s, row.compile_warm_s, row.ms_per_batch, s)
                                  for mode, row in table.iterrows()} for s in scenarios})


def plot_modes(table: pd.DataFrame, title: str) -> Any:
    """Two panels for a :func:`modes_table`: the steady time per batch of each run (median, with the
    10th-90th percentile spread), and each compiled mode's one-time seconds cold and warm (log scale:
    they differ by up to two decades). Returns the matplotlib figure."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax_time, ax_compile) = plt.subplots(1, 2, figsize=(10, 3.8))
    labels = list(table.index)
    spread = table["ms_per_batch"] * table["spread_pct"] / 100
    colors = ["gray" if mode == "eager" else "tab:blue" for mode in labels]
    ax_time.bar(labels, table["ms_per_batch"], 0.6, yerr=spread / 2, capsize=3, color=colors)
    for x, (ms, half_spread, speedup) in enumerate(zip(table["ms_per_batch"], spread / 2, table["speedup"])):
        text = f"{ms:.3g} ms" if ms < 1000 else f"{ms:,.0f} ms"
        ax_time.annotate(f"{text}\n{speedup:.2f}x", (x, ms + half_spread), ha="center", va="bottom", fontsize=8,
                         xytext=(0, 2), textcoords="offset points")
    ax_time.set_ylabel("time per batch (ms, median)")
    ax_time.set_title("steady speed (bar labels: speed-up over eager)", fontsize=9)
    ax_time.set_ylim(0, 1.35 * float((table["ms_per_batch"] + spread / 2).max()))
    compiled = table[table.index != "eager"]
    x = np.arange(len(compiled))
    ax_compile.bar(x - 0.2, compiled["compile_cold_s"], 0.4, label="cold (empty caches)", color="tab:orange")
    ax_compile.bar(x + 0.2, compiled["compile_warm_s"], 0.4, label="warm (caches filled)", color="tab:green")
    ax_compile.set_xticks(x, [f"{mode}\n(compiled {ordinal(order)})" for mode, order in compiled["order"].items()])
    ax_compile.set_yscale("log")
    ax_compile.set_ylabel("one-time cost (s, log scale)")
    ax_compile.set_title("compile and first iterations, beyond steady ones", fontsize=9)
    ax_compile.legend(fontsize=8, loc="upper left")
    if len(compiled):
        low = max(float(compiled[["compile_cold_s", "compile_warm_s"]].min().min()), 1e-3)
        high = float(compiled[["compile_cold_s", "compile_warm_s"]].max().max())
        ax_compile.set_ylim(low / 2, high * 6)  # room for the legend above the bars
    for ax in (ax_time, ax_compile):
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 21st."""
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


__all__ += ["ordinal", "plot_modes", "SCENARIOS", "Scenario", "scenario_costs", "serving_seconds"]
