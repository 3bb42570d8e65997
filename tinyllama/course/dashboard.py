"""The course's closing dashboard: a participant's recorded figures beside the reference run's, the
optimization checklist with the effect of each optimization from the one comparison that isolates it,
the chain of TinyLLaMA's versions, the common pitfalls, and an export.

Every function takes the long tables of :func:`tinyllama.course.results.load_results` (the participant)
and :func:`tinyllama.course.reference.load_reference` (the solutions' run), so figures line up by
(notebook, figure).

A checklist item is credited only with a **controlled pair**: two runs timed in the same process (one
record of one notebook) that differ in that one change and nothing else. A ratio that spans several
changes (V4 over V1 in fp32: precision, fusion, kernels and compile together) credits none of them.
Recorded figures carry no spread, so a difference smaller than :data:`EAGER_VARIATION` (eager steps) or
:data:`REPLAY_VARIATION` (both sides replayed from CUDA graphs) is reported as :data:`WITHIN`, never as
faster or slower, and never ranked.
"""

from __future__ import annotations

import datetime as _dt
import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from tinyllama.course.results import results_dir
from tinyllama.harness.records import markdown_table
from tinyllama.timing import Band, verdict

Figures = Mapping[str, Any]  # the figures of one record (one run of one notebook), by name

# How far a figure moves between two runs in fresh processes on the same machine, as a fraction. Eager
# step times of these models move 10-30% between processes (Python launches, clocks, neighbours on the
# host); CUDA-graph replays move under 2%. A ratio of two recorded figures closer to 1 than this is not
# a result a re-run would reproduce: the dashboard calls it "within run-to-run variation".
EAGER_VARIATION = 0.15
REPLAY_VARIATION = 0.03
WITHIN = "within run-to-run variation"
# In a record's figures: the p10-p90 bands of its timed figures, {figure: (p10, p90)}, where the notebook
# recorded them (results.record(..., spreads=...)). A pair of two such step times is judged by the bands.
SPREADS = "_spreads"
FASTER, SLOWER = "faster", "slower"


def is_number(value: Any) -> bool:
    """A finite real number (not a bool, not a string)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


def notebook_number(notebook: str) -> str:
    """``"12_fusion"`` -> ``"12"``."""
    return str(notebook)[:2]


def judge(factor: float, variation: float = EAGER_VARIATION) -> str:
    """The verdict on a speed-up ``factor`` (old time / new time) of two figures without a recorded
    spread: :data:`FASTER` when the new time is more than ``1 + variation`` times shorter,
    :data:`SLOWER` when more than ``1 + variation`` times longer, else :data:`WITHIN`. The rule is
    symmetric on a ratio scale: 1.2x and 1/1.2x are as far from 1 as each other."""
    if not is_number(factor) or factor <= 0:
        raise ValueError(f"a speed-up is a positive number, got {factor!r}")
    if variation < 0:
        raise ValueError(f"variation is a fraction >= 0 (0.15 for 15%), got {variation!r}")
    if factor > 1 + variation:
        return FASTER
    if factor < 1 / (1 + variation):
        return SLOWER
    return WITHIN


def latest_values(table: pd.DataFrame) -> pd.DataFrame:
    """The most recent value of every (notebook, figure) in a long results table, in course order,
    with the time, profile and device of the record it came from."""
    columns = ["notebook", "figure", "value", "time", "profile", "device"]
    if table.empty:
        return pd.DataFrame(columns=columns)
    latest = table.sort_values("time", kind="stable").drop_duplicates(["notebook", "figure"], keep="last")
    return latest.sort_values(["notebook", "time"], kind="stable")[columns].reset_index(drop=True)


def by_notebook(table: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """The latest figures of each notebook: ``{"12_fusion": {"speedup_both": 1.01, ...}, ...}``."""
    found: dict[str, dict[str, Any]] = {}
    for row in latest_values(table).itertuples():
        found.setdefault(row.notebook, {})[row.figure] = row.value
    return found


def runs_by_notebook(table: pd.DataFrame) -> dict[str, list[dict[str, Any]]]:
    """The records of each notebook, newest first, each as its figures: one entry per run (one process),
    so two figures of one entry were measured in the same process."""
    found: dict[str, list[dict[str, Any]]] = {}
    if table.empty:
        return found
    for (notebook, _), rows in table.sort_values("time", kind="stable").groupby(["notebook", "time"], sort=False):
        figures = dict(zip(rows["figure"], rows["value"]))
        if {"spread_low", "spread_high"} <= set(rows.columns):
            figures[SPREADS] = {f: (float(low), float(high)) for f, low, high in
                                zip(rows["figure"], rows["spread_low"], rows["spread_high"])
                                if is_number(low) and is_number(high)}
        found.setdefault(notebook, []).insert(0, figures)
    return dict(sorted(found.items()))


def side_by_side(mine: pd.DataFrame, reference: pd.DataFrame) -> pd.DataFrame:
    """Every figure recorded by the participant or by the reference run, one row each: ``yours``,
    ``reference`` and, where both are numbers, ``yours / reference``."""
    left = latest_values(mine).rename(columns={"value": "yours", "profile": "your profile", "device": "your device"})
    right = latest_values(reference)[["notebook", "figure", "value"]].rename(columns={"value": "reference"})
    table = left.drop(columns="time").merge(right, on=["notebook", "figure"], how="outer")
    table["yours / reference"] = [
        float(y) / float(r) if is_number(y) and is_number(r) and float(r) != 0 else math.nan
        for y, r in zip(table["yours"], table["reference"])]
    table = table.sort_values(["notebook"], kind="stable").reset_index(drop=True)
    return table[["notebook", "figure", "yours", "reference", "yours / reference", "your profile", "your device"]]


# ---------------------------------------------------------------------------------------------------------
# The optimization checklist: each item from the controlled pairs that isolate it

Describe = Callable[[Figures], str]
Compute = Callable[[Figures], "float | None"]


def _number(figures: Figures, name: str) -> float | None:
    value = figures.get(name)
    return float(value) if is_number(value) else None


def _ratio(old: str, new: str) -> Compute:
    """``old / new`` of one record: a speed-up when both are times (pass rates the other way round).
    The compute function keeps the two names (``.names``) so that :func:`measure` can judge two step
    times by their recorded spreads."""
    def compute(figures: Figures) -> float | None:
        a, b = _number(figures, old), _number(figures, new)
        return a / b if a is not None and b is not None and a > 0 and b > 0 else None
    compute.names = (old, new)  # type: ignore[attr-defined]
    return compute


def band_verdict(figures: Figures, old: str, new: str) -> str | None:
    """The verdict on two step times of one record from their recorded p10-p90 bands
    (:func:`tinyllama.timing.verdict`: faster or slower only when the bands do not overlap), or ``None``
    where either has no band (the fixed variation rule of :func:`judge` applies then). Only step times
    (``step_ms*``) are judged this way: a band of a rate would turn the verdict round."""
    spreads = figures.get(SPREADS) or {}
    if not (old.startswith("step_ms") and new.startswith("step_ms") and old in spreads and new in spreads):
        return None
    a, b = _number(figures, old), _number(figures, new)
    if a is None or b is None:
        return None
    _, said = verdict(Band(a, *spreads[old]), Band(b, *spreads[new]))
    return {"faster": FASTER, "slower": SLOWER}.get(said, WITHIN)


def _figure(name: str) -> Compute:
    def compute(figures: Figures) -> float | None:
        value = _number(figures, name)
        return value if value is not None and value > 0 else None
    return compute


def _half_precision(compute: Compute) -> Compute:
    """``compute`` only where the record's ``precision`` is a 16-bit format (else its runs share a precision)."""
    def guarded(figures: Figures) -> float | None:
        return compute(figures) if figures.get("precision") in ("bf16", "fp16") else None
    return guarded


def _compiled_over_eager_half(figures: Figures) -> float | None:
    """Notebook 06's half-precision pair: both speed-ups are over the same fp32 eager run, so their ratio
    is the compiled half-precision run over the eager one."""
    for name in figures:
        if name.endswith("_compiled_speedup"):
            return _ratio(name, name.replace("_compiled_speedup", "_eager_speedup"))(figures)
    return None


def _scaling(figures: Figures) -> float | None:
    largest = figures.get("scaling_max_processes")
    return _ratio(f"throughput_{largest}_processes", "throughput_1_process")(figures) if largest else None


def _text(template: str) -> Describe:
    """A description with the record's figures filled in (names the record lacks are kept in braces)."""
    return lambda figures: template.format_map(_Missing(figures))


class _Missing(dict):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _distributed(strategy: str) -> Describe:
    def describe(figures: Figures) -> str:
        ratio = _ratio(f"tokens_per_s_{strategy}", "baseline_tokens_per_s")(figures)
        processes, where = figures.get("processes", "?"), figures.get("distributed_device", "?")
        gpus = "GPUs" if where in ("cuda", "hip") else f"{where} processes (gloo: no GPU scaling measured)"
        efficiency = f", efficiency {ratio / float(processes):.2f}" if ratio and is_number(processes) else ""
        return (f"TinyLLaMA {figures.get('preset', '')} step, {strategy.upper()} on {processes} {gpus}: "
                f"tokens/s over one process{efficiency}")
    return describe


@dataclass(frozen=True)
class Pair:
    """A controlled pair: two runs of one notebook, in one process, that differ in one change only.

    ``compute`` gives the speed-up from one record (old time / new time, or new rate / old rate: above 1
    when the change helps). ``variation`` is the run-to-run variation its verdict allows
    (:data:`REPLAY_VARIATION` only when both runs were replayed from CUDA graphs). ``kernel``: a
    micro-benchmark of one kernel or operation, not a whole step or batch. ``kept_by_notebook``: the
    notebook decided keep or not itself, from both runs' spreads, and recorded 1.0 for a change not kept
    (notebook 20's phases)."""

    notebook: str  # two digits
    describe: Describe
    compute: Compute
    variation: float = EAGER_VARIATION
    kernel: bool = False
    kept_by_notebook: bool = False


@dataclass(frozen=True)
class ChecklistItem:
    """One optimization of the course and the controlled pairs that measure it."""

    name: str
    advice: str
    pairs: tuple[Pair, ...]


def _pair(notebook: str, what: str, compute: Compute, **options: Any) -> Pair:
    return Pair(notebook, _text(what), compute, **options)


def _lab(phase: str, what: str) -> Pair:
    return Pair("20", _text(f"fine-tuning step (lab), {what}"), _figure(f"speedup_{phase}"), kept_by_notebook=True)


CHECKLIST: tuple[ChecklistItem, ...] = (
    ChecklistItem("Mixed precision (bf16/fp16)", "autocast to bf16 (fp16 with a gradient scaler); check the error "
                  "against fp32 first", (
                      _pair("17", "TinyLLaMA V1 step, {precision} autocast over fp32",
                            _half_precision(_ratio("step_ms_v1_fp32", "step_ms_v1"))),
                      _pair("10", "TinyLLaMA V1 step, bf16 autocast over fp32", _figure("bf16_speedup")),
                      _pair("02", "ResNet-50 inference, fp16 over fp32 ({fp32_computes_in})",
                            _figure("fp16_speedup_vs_fp32")),
                      _pair("02", "ResNet-50 inference, bf16 over fp32 ({fp32_computes_in})",
                            _figure("bf16_speedup_vs_fp32")),
                      _lab("precision", "16-bit autocast over the configuration kept before"))),
    ChecklistItem("TF32 matmuls", "torch.backends.cuda.matmul.allow_tf32 = True (or set_float32_matmul_precision"
                  "('high')) where fp32 is kept", (
                      _pair("10", "TinyLLaMA V1 step, TF32 matmuls over true fp32", _figure("tf32_speedup")),
                      _pair("02", "ResNet-50 inference, TF32 convolutions over true fp32", _figure("tf32_speedup")),
                      _pair("00", "matmul rate, TF32 over fp32", _ratio("matmul_tf32_tflops", "matmul_fp32_tflops"),
                            kernel=True))),
    ChecklistItem("Batch size", "the largest batch that fits and keeps the GPU busy (throughput, not latency)", (
        _pair("01", "ResNet-50 inference, batch {best_sweep_batch_size} over batch {batch_size} (images/s)",
              _ratio("best_sweep_throughput", "fp32_throughput")),
        _lab("micro-batch", "larger micro-batch, same effective batch"))),
    ChecklistItem("Channels-last memory layout", "model and inputs .to(memory_format=torch.channels_last) for "
                  "convolutions in half precision", (
                      _pair("03", "ResNet-50 fp16 training step, channels-last over the default layout",
                            _figure("channels_last_speedup")),)),
    ChecklistItem("Fused projections (V2)", "one QKV matmul and one gate/up matmul instead of five", (
        _pair("17", "TinyLLaMA step, V2 over V1 (both {precision}, eager)", _ratio("step_ms_v1", "step_ms_v2")),
        _pair("17", "TinyLLaMA step, V2 over V1 (both {precision}, replayed from CUDA graphs)",
              _ratio("step_ms_v1_graphed", "step_ms_v2_graphed"), variation=REPLAY_VARIATION),
        _pair("12", "TinyLLaMA step, V2 over V1 (both fp32, eager)", _figure("v2_over_v1_fp32_eager")),
        _pair("12", "TinyLLaMA step, both fusions over none ({focus_setting})", _figure("speedup_both")))),
    ChecklistItem("Triton kernels (V3)", "fused kernels for memory-bound chains (RMSNorm, SwiGLU) and attention, "
                  "with a backward, checked before timing", (
                      _pair("17", "TinyLLaMA step, V3 over V2 (both {precision}, eager)",
                            _ratio("step_ms_v2", "step_ms_v3")),
                      _pair("17", "TinyLLaMA step, V3 over V2 (both {precision}, replayed from CUDA graphs)",
                            _ratio("step_ms_v2_graphed", "step_ms_v3_graphed"), variation=REPLAY_VARIATION),
                      _pair("13", "your RMSNorm kernel over eager PyTorch ({timed_dtype}, bandwidth)",
                            lambda f: _ratio(f"rmsnorm_mine_{f.get('timed_dtype')}_tbs",  # rates: new over old
                                             f"rmsnorm_eager_{f.get('timed_dtype')}_tbs")(f), kernel=True))),
    ChecklistItem("Flash attention / SDPA", "F.scaled_dot_product_attention (or a flash kernel) instead of "
                  "written-out attention", (
                      _lab("attention_kernel", "SDPA over attention written out"),
                      _pair("14", "attention fwd+bwd, PyTorch's SDPA over our Triton kernel (eager)",
                            _figure("ours_over_sdpa_eager"), kernel=True))),
    ChecklistItem("torch.compile", "torch.compile the model (per block or whole); report the compile time apart", (
        _pair("16", "TinyLLaMA V4 step ({precision}), compiled (default) over the same code eager",
              _ratio("step_ms_V4 eager", "step_ms_V4 compiled (default)")),
        _pair("06", "ResNet-50 inference, compiled (default) over eager", _figure("speedup_default")),
        _pair("06", "ResNet-50 inference in half precision, compiled over eager", _compiled_over_eager_half))),
    ChecklistItem("CUDA graphs", "replay captured graphs (mode='reduce-overhead', torch.cuda.graphs) when the "
                  "host's launches bound the step", (
                      *(_pair("17", f"TinyLLaMA V{n} step ({{precision}}), replayed from CUDA graphs over eager",
                              _ratio(f"step_ms_v{n}", f"step_ms_v{n}_graphed")) for n in (1, 2, 3, 4)),
                      _pair("16", "TinyLLaMA V4 compiled step, whole-step graphs over launched from Python",
                            _ratio("step_ms_V4 compiled (default)", "step_ms_V4 compiled + whole-step graphs")),
                      _pair("16", "TinyLLaMA V4 step, compiled reduce-overhead over compiled default",
                            _ratio("step_ms_V4 compiled (default)", "step_ms_V4 compiled (reduce-overhead)")),
                      _pair("06", "ResNet-50 inference, compiled reduce-overhead over compiled default",
                            _ratio("speedup_reduce-overhead", "speedup_default")),
                      _pair("14", "SDPA fwd+bwd, graph replay over eager",
                            _ratio("sdpa_default_ms_eager_longest", "sdpa_default_ms_graph_longest"), kernel=True))),
    ChecklistItem("Gradient checkpointing off", "turn checkpointing off where the activations fit: it runs every "
                  "block's forward twice", (_lab("checkpointing_off", "checkpointing off over on"),)),
    ChecklistItem("Data-loader workers", "worker processes when reading and preparing a batch takes a visible "
                  "share of the step", (_lab("loader_workers", "loader workers over none"),)),
    ChecklistItem("Sequence length", "a shorter maximum length where examples are padded to it (less work, not "
                  "faster work)", (_lab("sequence_length", "shorter maximum length, per optimizer step"),)),
    ChecklistItem("Several GPUs (data parallel)", "torchrun with one process per GPU; keep the per-GPU batch", (
        Pair("05", _text("ResNet-50 inference, {scaling_max_processes} processes over one ({scaling_device}, "
                         "images/s)"), _scaling),
        Pair("21", _distributed("ddp"), _ratio("tokens_per_s_ddp", "baseline_tokens_per_s")),
        Pair("21", _distributed("fsdp"), _ratio("tokens_per_s_fsdp", "baseline_tokens_per_s")))),
)

NOT_KEPT = ("not kept by notebook 20 (its fast steps not faster beyond noise by 10%, its memory over the budget, "
            "or its loss moved)")
KEPT = "its fast steps faster beyond noise (kept by notebook 20)"


def measure(pair: Pair, runs: Mapping[str, list[Figures]]) -> tuple[str, float, str] | None:
    """``(description, speed-up, verdict)`` of ``pair`` from the newest run of its notebook that holds
    both of its figures (so both come from one process), else ``None``. A change that notebook 20 did
    not keep has a NaN speed-up: its recorded 1.0 is not a measurement."""
    for notebook, records in runs.items():
        if notebook_number(notebook) != pair.notebook:
            continue
        for figures in records:
            factor = pair.compute(figures)
            if factor is None or not math.isfinite(factor) or factor <= 0:
                continue
            if pair.kept_by_notebook:
                return (pair.describe(figures), math.nan, NOT_KEPT) if factor == 1.0 else \
                    (pair.describe(figures), factor, KEPT)
            names = getattr(pair.compute, "names", None)
            from_bands = band_verdict(figures, *names) if names else None
            return pair.describe(figures), factor, from_bands or judge(factor, pair.variation)
    return None


def _missing(item: ChecklistItem, runs: Mapping[str, list[Figures]]) -> str:
    """Why ``item`` has no controlled pair in ``runs``."""
    wanted = sorted({p.notebook for p in item.pairs})
    ran = [nb for nb in wanted if any(notebook_number(name) == nb for name in runs)]
    if ran:
        return f"not measured as a controlled pair in the records of notebook {' or '.join(ran)}"
    return "not measured yet: run notebook " + " or ".join(wanted)


def _absent(pair: Pair, runs: Mapping[str, list[Figures]]) -> str:
    """Why one side lacks a pair that the other side has."""
    if any(notebook_number(name) == pair.notebook for name in runs):
        return f"not in the records of notebook {pair.notebook}"
    return f"not measured yet: run notebook {pair.notebook}"


CHECKLIST_COLUMNS = ["optimization", "notebook", "comparison", "scope", "yours (x)", "yours", "reference (x)",
                     "reference"]


def checklist(mine: pd.DataFrame, reference: pd.DataFrame | None = None) -> pd.DataFrame:
    """The optimization checklist: one row per controlled pair found in the participant's or the
    reference's records (``yours (x)``: the speed-up, ``yours``: its verdict, faster, slower or
    :data:`WITHIN`; the same for the reference), and one row for an item with none, saying so
    (``not measured yet: run notebook NN`` or ``not measured as a controlled pair``). ``scope`` is
    ``whole step`` or ``one kernel`` (a micro-benchmark: it speeds a step only by its share of it)."""
    sides = {"yours": runs_by_notebook(mine),
             "reference": runs_by_notebook(reference) if reference is not None else {}}
    rows = []
    for item in CHECKLIST:
        found = []
        for pair in item.pairs:
            measured = {side: measure(pair, runs) for side, runs in sides.items()}
            if not any(measured.values()):
                continue
            label = next(m[0] for m in (measured["yours"], measured["reference"]) if m)
            row = {"optimization": item.name, "notebook": pair.notebook, "comparison": label,
                   "scope": "one kernel" if pair.kernel else "whole step"}
            for side, m in measured.items():
                row[f"{side} (x)"], row[side] = (m[1], m[2]) if m else (math.nan, _absent(pair, sides[side]))
            found.append(row)
        if not found:
            found.append({"optimization": item.name, "notebook": "-", "comparison": "-", "scope": "-",
                          **{f"{side} (x)": math.nan for side in sides},
                          **{side: _missing(item, runs) for side, runs in sides.items()}})
        rows.extend(found)
    return pd.DataFrame(rows, columns=CHECKLIST_COLUMNS)


def advice() -> pd.Series:
    """What to do for each checklist item, by name."""
    return pd.Series({item.name: item.advice for item in CHECKLIST}, name="what to do")


# ---------------------------------------------------------------------------------------------------------
# The chain of TinyLLaMA versions, one change per step


# (stage, the one change it makes over the stage before, the figure of notebook 17 that times it)
CHAIN: tuple[tuple[str, str, str], ...] = (
    ("V1 fp32", "", "step_ms_v1_fp32"),
    ("V1 {precision}", "{precision} autocast", "step_ms_v1"),
    ("V2 {precision}", "fused projections (one QKV, one gate/up matmul)", "step_ms_v2"),
    ("V3 {precision}", "Triton kernels (RMSNorm, flash attention, SwiGLU)", "step_ms_v3"),
    ("V4 {precision}", "SDPA and torch.compile in place of the Triton kernels", "step_ms_v4"),
    ("V4 {precision} graphed", "the whole step replayed from CUDA graphs", "step_ms_v4_graphed"),
)


def version_chain(table: pd.DataFrame) -> pd.DataFrame:
    """Notebook 17's stages V1 fp32 -> V1 bf16 -> V2 -> V3 -> V4 -> V4 replayed from CUDA graphs, from
    its newest record that timed at least two of them: index ``stage``, columns ``step_ms`` (median
    step time, ms) and ``change`` (what the stage changes over the one before it, empty for the
    first). Stages a record lacks are left out; at fp32 (a CPU) the V1 precision stage is V1 fp32
    itself and left out. Empty when notebook 17 was not recorded. ``attrs["notebook"]`` names it."""
    for notebook, records in runs_by_notebook(table).items():
        if notebook_number(notebook) != "17":
            continue
        for figures in records:
            precision = str(figures.get("precision", "fp32"))
            rows = []
            for stage, change, name in CHAIN:
                if name == "step_ms_v1" and precision == "fp32":
                    continue
                value = _number(figures, name)
                if value is not None and value > 0:
                    rows.append({"stage": stage.format(precision=precision),
                                 "change": change.format(precision=precision), "step_ms": value})
            if len(rows) >= 2:
                chain = pd.DataFrame(rows).set_index("stage")[["step_ms", "change"]]
                chain.iloc[0, chain.columns.get_loc("change")] = ""
                chain.attrs["notebook"] = notebook
                return chain
    empty = pd.DataFrame(columns=["step_ms", "change"], index=pd.Index([], name="stage"))
    empty.attrs["notebook"] = None
    return empty

# ---------------------------------------------------------------------------------------------------------
# Pitfalls


def _evidence(template: str, *names: str, notebook: str) -> Callable[[Mapping[str, Figures]], str | None]:
    def compute(figures: Mapping[str, Figures]) -> str | None:
        for name, values in figures.items():
            if notebook_number(name) == notebook and all(n in values for n in names):
                try:
                    return template.format(*(values[n] for n in names))
                except (TypeError, ValueError, ZeroDivisionError):
                    return None
        return None
    return compute


@dataclass(frozen=True)
class Pitfall:
    """A common mistake, the notebook that shows it, and what the participant's records show of it."""

    pitfall: str
    notebook: str
    instead: str
    evidence: Callable[[Mapping[str, Figures]], str | None] | None = None


PITFALLS: tuple[Pitfall, ...] = (
    Pitfall("Timing the first iterations (allocation, cuDNN autotuning, compilation)", "01",
            "warm up, then time many steps; report the median and the spread",
            _evidence("first iteration {0:.4g} ms against {1:.4g} ms a batch afterwards", "first_iteration_ms",
                      "fp32_ms_per_batch", notebook="01")),
    Pitfall("Reading a host clock without synchronizing the device", "01",
            "device events, or torch.cuda.synchronize() before the clock (tinyllama.timing)"),
    Pitfall("Half precision taken on trust", "02", "compare with fp32 on the same inputs before timing",
            _evidence("bf16 differed from fp32 by {0:.2g} (relative), fp16 by {1:.2g}", "bf16_max_rel_diff",
                      "fp16_max_rel_diff", notebook="02")),
    Pitfall("A step bound by the host's launches, not the GPU", "03",
            "compare CPU time with device time; fewer, larger kernels; CUDA graphs",
            _evidence("CPU {0:.3g} ms against device {1:.3g} ms per step", "cpu_ms_per_step", "device_ms_per_step",
                      notebook="03")),
    Pitfall("Utilisation quoted against the datasheet only", "04",
            "quote it against a measured ceiling too (00's matmul rate)",
            _evidence("{0:.3g} TFLOP/s achieved: {1:.3g}% of the measured ceiling", "achieved_tflops",
                      "achieved_pct_of_ceiling", notebook="04")),
    Pitfall("Scaling measured with too little work per GPU", "05", "keep the per-GPU batch; report the efficiency",
            _evidence("per-GPU batch {0}, {1} processes on {2}", "per_gpu_batch", "scaling_max_processes",
                      "scaling_device", notebook="05")),
    Pitfall("Counting compile time as speed, or forgetting it", "06", "report compile time apart from the steady step",
            _evidence("default mode compiled in {0:.3g} s; an eager batch takes {1:.3g} ms", "compile_s_default",
                      "eager_ms", notebook="06")),
    Pitfall("A fusion that leaves strided views behind", "12",
            "check what the fused output costs the element-wise kernels after it",
            _evidence("SiLU*mul on strided halves took {0:.3g}x the contiguous time",
                      "strided_over_contiguous_silu_mul", notebook="12")),
    Pitfall("A fast kernel that is not correct (or has no backward)", "13",
            "check forward and gradients on fresh, odd-shaped inputs before timing",
            _evidence("your kernels passed their checks: {0}", "kernels_correct", notebook="13")),
    Pitfall("Comparing launch costs instead of kernels at small sizes", "14",
            "time eager and graph-replayed; say which one bounds the step",
            _evidence("our attention: {0:.3g} ms eager, {1:.3g} ms replayed", "ours_ms_eager_longest",
                      "ours_ms_graph_longest", notebook="14")),
    Pitfall("Crediting one change with a ratio that spans several", "17",
            "credit a change only with the pair that differs in it alone, timed in one process",
            _evidence("V4 over V1 fp32 is {0:.3g}x: precision, fusion, kernels and compile together",
                      "speedup_v4_over_v1_fp32", notebook="17")),
    Pitfall("Ranking two changes on a difference a re-run would not reproduce", "20",
            f"time the two in turns and keep a change only when faster beyond noise; without spreads, treat "
            f"differences under {EAGER_VARIATION:.0%} of eager steps as {WITHIN}"),
    Pitfall("A broken weight initialisation (loss far above ln V at the start)", "15",
            "compare the first loss with ln(vocabulary)",
            _evidence("first loss {0:.4g} against ln V = {1:.3g}", "stage1_first_loss", "expected_initial_loss",
                      notebook="15")),
    Pitfall("Non-contiguous tensors fed to kernels (hidden copies)", "15",
            "x @ W.T, not (W @ x.T).T; count aten::copy_ in the profile",
            _evidence("the strided version took {0:.3g}x the fixed step", "stage2_over_fixed", notebook="15")),
)


def pitfalls(mine: pd.DataFrame) -> pd.DataFrame:
    """The common pitfalls, the notebook that shows each, and what the participant's records show."""
    figures = by_notebook(mine)
    rows = [{"pitfall": p.pitfall, "shown in": p.notebook, "instead": p.instead,
             "what you measured": "" if p.evidence is None else p.evidence(figures) or f"(run notebook {p.notebook})"}
            for p in PITFALLS]
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------------------
# Export


def _index_as_columns(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with its named index as its first columns (a markdown table shows no index)."""
    return table.reset_index() if any(name is not None for name in table.index.names) else table


def export_results(table: pd.DataFrame, sections: Mapping[str, pd.DataFrame], title: str,
                   directory: str | Path | None = None, now: _dt.datetime | None = None) -> tuple[Path, Path]:
    """Write ``table`` (every recorded figure) as CSV and ``sections`` (titled tables) as markdown into
    ``exports/`` of the results directory, under a new name each time (``results-YYYYmmdd-HHMMSS``, with
    ``-2``, ``-3``... if that exists): an earlier export is never overwritten. Returns both paths."""
    folder = (Path(directory) if directory is not None else results_dir()) / "exports"
    folder.mkdir(parents=True, exist_ok=True)
    stamp = f"results-{(now or _dt.datetime.now()):%Y%m%d-%H%M%S}"
    text = f"# {title}\n\n" + "\n\n".join(f"## {name}\n\n{markdown_table(_index_as_columns(frame), digits=4)}"
                                           for name, frame in sections.items())
    for attempt in range(1, 1000):
        base = folder / (stamp if attempt == 1 else f"{stamp}-{attempt}")
        try:
            # "x": create, fail if the file exists, so a name is never reused.
            with open(base.with_suffix(".csv"), "x", encoding="utf-8") as csv_file:
                table.to_csv(csv_file, index=False)
        except FileExistsError:
            continue
        markdown = base.with_suffix(".md")
        with open(markdown, "x", encoding="utf-8") as md_file:
            md_file.write(text + "\n")
        return base.with_suffix(".csv"), markdown
    raise RuntimeError(f"no free export name in {folder}: remove old exports")
