"""The course's closing dashboard: a participant's recorded figures beside the reference run's, the
optimization checklist with the effect each optimization had, the common pitfalls, and an export.

Every function takes the long tables of :func:`tinyllama.course.results.load_results` (the participant)
and :func:`tinyllama.course.reference.load_reference` (the solutions' run), so figures line up by
(notebook, figure). A figure named ``*speedup*`` (or ``vN_over_vM``) is a speed-up: old time / new time,
above 1 when faster; any notebook that records one under that convention appears in the speed-up plot
and, when its name matches an item's pattern, in the checklist, without changes here.
"""

from __future__ import annotations

import datetime as _dt
import math
import numbers
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from tinyllama.course.results import results_dir

Figures = Mapping[str, Any]  # the latest figures of one notebook, by name
_SPEEDUP = re.compile(r"speedup|^v\d_over_v\d", re.IGNORECASE)
_NOT_A_MEASUREMENT = re.compile(r"^predicted|^(\w+)_speedup_vs_\1$")  # predictions, and fp32 over itself


def is_number(value: Any) -> bool:
    """A finite real number (not a bool, not a string)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


def notebook_number(notebook: str) -> str:
    """``"12_fusion"`` -> ``"12"``."""
    return str(notebook)[:2]


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


def is_speedup(figure: str) -> bool:
    """Whether a figure's name marks it as a measured speed-up (old time / new time)."""
    return bool(_SPEEDUP.search(figure)) and not _NOT_A_MEASUREMENT.search(figure)


def speedups(table: pd.DataFrame) -> pd.DataFrame:
    """The latest measured speed-ups of a results table (predictions left out): notebook, figure, value."""
    latest = latest_values(table)
    # A speed-up is a positive ratio; a zero or negative one is not a measurement (and has no logarithm).
    keep = pd.Series([is_speedup(f) and is_number(v) and float(v) > 0
                      for f, v in zip(latest["figure"], latest["value"])], index=latest.index, dtype=bool)
    chosen = latest.loc[keep, ["notebook", "figure", "value"]].copy()
    chosen["value"] = chosen["value"].astype(float)
    return chosen.reset_index(drop=True)


# ---------------------------------------------------------------------------------------------------------
# The optimization checklist


def _ratio(numerator: str, denominator: str) -> Callable[[Figures], float | None]:
    def compute(figures: Figures) -> float | None:
        a, b = figures.get(numerator), figures.get(denominator)
        return float(a) / float(b) if is_number(a) and is_number(b) and float(b) != 0 else None
    return compute


def _figure(name: str) -> Callable[[Figures], float | None]:
    def compute(figures: Figures) -> float | None:
        value = figures.get(name)
        return float(value) if is_number(value) else None
    return compute


def _rmsnorm_over_eager(figures: Figures) -> float | None:
    dtype = figures.get("timed_dtype")
    return _ratio(f"rmsnorm_mine_{dtype}_tbs", f"rmsnorm_eager_{dtype}_tbs")(figures) if dtype else None


def _compiled_over_eager_half(figures: Figures) -> float | None:
    for name in figures:
        match = re.fullmatch(r"(\w+)_compiled_speedup", name)
        if match:
            return _ratio(name, f"{match.group(1)}_eager_speedup")(figures)
    return None


def _scaling(figures: Figures) -> float | None:
    largest = figures.get("scaling_max_processes")
    return _ratio(f"throughput_{largest}_processes", "throughput_1_process")(figures) if largest else None


@dataclass(frozen=True)
class Measure:
    """One measured effect of an optimization: which notebook, what it compares (``label`` may name
    that notebook's figures in braces), and how to compute the factor from its latest figures."""

    notebook: str  # two digits
    label: str
    compute: Callable[[Figures], float | None]
    unit: str = "x"  # "x" (a speed-up: old time / new time) or another factor such as "x less memory"
    kernel: bool = False  # a micro-benchmark (one kernel or operation), not a whole step or batch

    def describe(self, figures: Figures) -> str:
        """The label with this notebook's figures filled in (names it does not have are kept)."""
        return self.label.format_map(_Missing(figures))


class _Missing(dict):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


LATER_NOTEBOOKS = 16  # notebooks from here on (SDPA and compile, V1-V4, roofline, labs) join by figure name


@dataclass(frozen=True)
class ChecklistItem:
    """One optimization of the course and where it was measured."""

    name: str
    advice: str
    measures: tuple[Measure, ...] = ()
    pattern: str | None = None  # speed-up figures of later notebooks (16 on) that measure it too, by name
    elsewhere: str | None = None  # how to measure it when no notebook does


CHECKLIST: tuple[ChecklistItem, ...] = (
    ChecklistItem("Mixed precision (bf16/fp16)", "autocast to bf16 (fp16 with a gradient scaler); check the "
                  "error against fp32 first", (
                      Measure("02", "ResNet-50 inference, fp16 over fp32", _figure("fp16_speedup_vs_fp32")),
                      Measure("02", "ResNet-50 inference, bf16 over fp32", _figure("bf16_speedup_vs_fp32")),
                      Measure("10", "TinyLLaMA V1 training step, bf16 over fp32", _figure("bf16_speedup"))),
                  pattern=r"bf16|fp16|precision|autocast"),
    ChecklistItem("TF32 matmuls", "torch.backends.cuda.matmul.allow_tf32 = True (or set_float32_matmul_precision"
                  "('high')) where fp32 is kept", (
                      Measure("00", "matmul rate, TF32 over fp32", _ratio("matmul_tf32_tflops", "matmul_fp32_tflops"),
                              kernel=True),
                      Measure("10", "TinyLLaMA V1 training step, TF32 over fp32", _figure("tf32_speedup"))),
                  pattern=r"tf32"),
    ChecklistItem("Batch size", "the largest batch that fits and keeps the GPU busy (throughput, not latency)", (
        Measure("01", "ResNet-50 inference, best batch of the sweep ({best_sweep_batch_size}) over batch {batch_size}",
                _ratio("best_sweep_throughput", "fp32_throughput")),), pattern=r"batch"),
    ChecklistItem("Channels-last memory layout", "model and inputs .to(memory_format=torch.channels_last) for "
                  "convolutions in half precision", pattern=r"channels_last|nhwc",
                  elsewhere="no notebook measures it: run `python -m inference --network resnet50 --precision fp16 "
                            "--nhwc` and the same without `--nhwc`"),
    ChecklistItem("Fused projections (V2)", "one QKV matmul and one gate/up matmul instead of five", (
        Measure("12", "TinyLLaMA V2 over V1, fp32 eager step", _figure("v2_over_v1_fp32_eager")),
        Measure("12", "both fusions ({focus_setting})", _figure("speedup_both"))), pattern=r"v2|fus"),
    ChecklistItem("Triton kernels (V3)", "fused kernels for memory-bound chains (RMSNorm, SwiGLU), with a backward, "
                  "checked before timing", (
                      Measure("13", "your RMSNorm kernel over eager PyTorch ({timed_dtype}, bandwidth)",
                              _rmsnorm_over_eager, kernel=True),), pattern=r"v3|triton|kernel"),
    ChecklistItem("Flash attention / SDPA", "F.scaled_dot_product_attention (or a flash kernel) instead of "
                  "written-out attention", (
                      Measure("14", "PyTorch's default SDPA over our Triton kernel, fwd+bwd eager",
                              _figure("ours_over_sdpa_eager"), kernel=True),
                      Measure("14", "memory kept for the backward, math path over flash",
                              _ratio("math_saved_mib_at_predict_seq", "flash_saved_mib_at_predict_seq"),
                              unit="x less memory", kernel=True)), pattern=r"sdpa|attention|flash"),
    ChecklistItem("torch.compile", "torch.compile the model (per block or whole); report the compile time apart", (
        Measure("06", "ResNet-50 inference, best mode ({best_compile_mode}) over eager",
                _figure("best_compile_speedup")),
        Measure("06", "ResNet-50 inference in half precision, compiled over eager", _compiled_over_eager_half)),
        pattern=r"compile|v4"),
    ChecklistItem("CUDA graphs", "replay captured graphs (mode='reduce-overhead', torch.cuda.graphs) when the "
                  "host's launches bound the step", (
                      Measure("14", "SDPA fwd+bwd, graph replay over eager",
                              _ratio("sdpa_default_ms_eager_longest", "sdpa_default_ms_graph_longest"), kernel=True),
                      Measure("14", "our Triton attention, graph replay over eager",
                              _ratio("ours_ms_eager_longest", "ours_ms_graph_longest"), kernel=True)),
                  pattern=r"graph|reduce_overhead"),
    ChecklistItem("Several GPUs (data parallel)", "torchrun with one process per GPU; keep the per-GPU batch", (
        Measure("05", "ResNet-50 throughput, {scaling_max_processes} processes over one ({scaling_device})",
                _scaling),),
        pattern=r"gpus|processes|ddp|fsdp"),
)


def _effects(item: ChecklistItem, figures: Mapping[str, Figures]) -> list[tuple[str, str, float, str, bool]]:
    """(notebook, label, factor, unit, kernel) of every measure of ``item`` found in ``figures``."""
    found = []
    for measure in item.measures:
        for notebook, values in figures.items():
            if notebook_number(notebook) == measure.notebook:
                factor = measure.compute(values)
                if factor is not None and math.isfinite(factor):
                    found.append((notebook, measure.describe(values), factor, measure.unit, measure.kernel))
    if item.pattern:
        for notebook, values in figures.items():
            if not notebook_number(notebook).isdigit() or int(notebook_number(notebook)) < LATER_NOTEBOOKS:
                continue
            for name, value in values.items():
                if is_speedup(name) and is_number(value) and re.search(item.pattern, name, re.IGNORECASE):
                    found.append((notebook, name, float(value), "x", False))
    return found


def _where(item: ChecklistItem) -> str:
    numbers_ = sorted({measure.notebook for measure in item.measures})
    return ", ".join(numbers_) if numbers_ else "-"


def checklist(mine: pd.DataFrame, reference: pd.DataFrame | None = None) -> pd.DataFrame:
    """The optimization checklist: one row per item, with the effect the participant measured (every
    measure found, ``"not measured yet: run notebook NN"`` otherwise; micro-benchmarks of one kernel are
    marked ``[kernel]``), the reference run's, and ``yours (best x)``: the largest speed-up of a whole step
    or batch among the participant's measures (NaN when none; ``reference (best x)`` the same)."""
    figures = by_notebook(mine)
    reference_figures = by_notebook(reference) if reference is not None else {}
    rows = []
    for item in CHECKLIST:
        row: dict[str, Any] = {"optimization": item.name, "notebooks": _where(item), "what to do": item.advice}
        for column, source in (("yours", figures), ("reference", reference_figures)):
            effects = _effects(item, source)
            if effects:
                row[column] = "; ".join(f"{factor:.3g}{unit} ({notebook_number(nb)}: {label}"
                                        f"{' [kernel]' if kernel else ''})"
                                        for nb, label, factor, unit, kernel in effects)
            elif item.elsewhere:
                row[column] = item.elsewhere
            else:
                wanted = sorted({m.notebook for m in item.measures})
                ran = [nb for nb in wanted if any(notebook_number(name) == nb for name in source)]
                row[column] = (f"not in the records of notebook {' or '.join(ran)}: run it again" if ran else
                               "not measured yet: run notebook " + " or ".join(wanted))
            speeds = [factor for _, _, factor, unit, kernel in effects if unit == "x" and not kernel]
            row[f"{column} (best x)"] = max(speeds) if speeds else math.nan
        rows.append(row)
    return pd.DataFrame(rows).set_index("optimization")


# ---------------------------------------------------------------------------------------------------------
# The speed-up chain V1 -> V4


_VERSION_STEP = re.compile(r"^v([1-4])_(?:\w+_)?step_ms$|^step_ms_v([1-4])$", re.IGNORECASE)


def version_step_times(table: pd.DataFrame) -> pd.Series:
    """The latest training-step time of each TinyLLaMA version recorded under the names ``vN_step_ms``
    (or ``vN_<setting>_step_ms``, ``step_ms_vN``), from the last notebook that recorded them all
    together; empty when none did. Indexed ``V1``..``V4`` in order."""
    for notebook, values in reversed(list(by_notebook(table).items())):
        times: dict[str, float] = {}
        for name, value in values.items():
            match = _VERSION_STEP.match(name)
            if match and is_number(value):
                times.setdefault(f"V{match.group(1) or match.group(2)}", float(value))
        if len(times) >= 2:
            series = pd.Series(times, name=notebook).sort_index()
            series.index.name = "version"
            return series
    return pd.Series(dtype=float, name="step_ms")


def precision_step_times(table: pd.DataFrame) -> pd.Series:
    """Notebook 10's V1 step time in fp32, then with TF32 and with bf16 (from its speed-ups), when it
    was recorded; empty otherwise."""
    for notebook, values in by_notebook(table).items():
        if notebook_number(notebook) != "10":
            continue
        base, tf32, bf16 = (values.get(k) for k in ("fp32_step_ms", "tf32_speedup", "bf16_speedup"))
        if all(is_number(v) for v in (base, tf32, bf16)):
            return pd.Series({"V1 fp32": base, "V1 TF32": base / tf32, "V1 bf16": base / bf16}, name=notebook)
    return pd.Series(dtype=float, name="step_ms")


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


def markdown_table(table: pd.DataFrame, index: bool = True) -> str:
    """A pandas table as a GitHub markdown table (numbers to 4 significant figures)."""
    frame = table.reset_index() if index and any(name is not None for name in table.index.names) else table

    def cell(value: Any) -> str:
        if is_number(value) and not isinstance(value, numbers.Integral):
            return f"{float(value):.4g}"
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return ""
        return str(value).replace("|", "/").replace("\n", " ")

    lines = ["| " + " | ".join(str(c) for c in frame.columns) + " |", "|" + " --- |" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def export_results(table: pd.DataFrame, sections: Mapping[str, pd.DataFrame], title: str,
                   directory: str | Path | None = None, now: _dt.datetime | None = None) -> tuple[Path, Path]:
    """Write ``table`` (every recorded figure) as CSV and ``sections`` (titled tables) as markdown into
    ``exports/`` of the results directory, under a new name each time (``results-YYYYmmdd-HHMMSS``, with
    ``-2``, ``-3``... if that exists): an earlier export is never overwritten. Returns both paths."""
    folder = (Path(directory) if directory is not None else results_dir()) / "exports"
    folder.mkdir(parents=True, exist_ok=True)
    stamp = f"results-{(now or _dt.datetime.now()):%Y%m%d-%H%M%S}"
    text = f"# {title}\n\n" + "\n\n".join(f"## {name}\n\n{markdown_table(frame)}" for name, frame in sections.items())
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
