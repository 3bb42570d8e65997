"""V2's fusions in a comparison record: the run specs of each fusion and its control, and each
fusion's effect against the unfused V2 of the same precision and kind of step (eager, or replayed
from CUDA graphs): the ratio of the fast steps (p10s), its range from their 95% intervals, and the verdict
of ``tinyllama.timing.verdict`` with a least gain of 2%. Where a precision also ran replayed from CUDA
graphs, its eager rows are shown and the replayed rows judge the fusion."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from tinyllama.timing import Band
from tinyllama.timing import verdict as timing_verdict

# Name -> V2's switches. "none" is the control every fusion is measured against.
FUSIONS: dict[str, dict[str, int]] = {
    "none": {"fuse_qkv": 0, "fuse_gate_up": 0},
    "qkv": {"fuse_qkv": 1, "fuse_gate_up": 0},
    "gate_up": {"fuse_qkv": 0, "fuse_gate_up": 1},
    "both": {},  # V2's defaults: both fusions on (labelled ``v2:fp32`` as in compare's run set "fusions")
}


def fusion_label(name: str, precision: str = "fp32", graphed: bool = False) -> str:
    """The ``tinyllama.harness.compare`` run spec of one fusion setting, written as ``compare`` labels it,
    e.g. ``v2[fuse_qkv=1,fuse_gate_up=0,cuda_graph=1]:bf16``."""
    if name not in FUSIONS:
        raise ValueError(f"unknown fusion {name!r}: choose one of {', '.join(FUSIONS)}")
    switches = [f"{k}={v}" for k, v in FUSIONS[name].items()] + (["cuda_graph=1"] if graphed else [])
    options = f"[{','.join(switches)}]" if switches else ""
    return f"v2{options}:{precision}"


def fusion_runs(precision: str = "fp32", graphed: bool = False) -> list[str]:
    """The four V2 runs of one setting: no fusion, QKV, gate/up, both."""
    return [fusion_label(name, precision, graphed) for name in FUSIONS]


def timed_run(record: Mapping[str, Any], label: str) -> dict[str, Any] | None:
    """The run labelled ``label`` in a comparison record, if it passed its check and was timed."""
    row = next((r for r in record["runs"] if r["label"] == label), None)
    return row if row is not None and row.get("check") == "passed" else None


# The least gain a fusion is called faster (or slower) by. In three processes on one H200 (2026-11-27,
# bf16 eager steps timed in turns, 30 rounds) the fast steps' ratios of the QKV and gate/up fusions were
# 1.034-1.037 and 0.961-0.965, the graph replays' own ratios, while "both" (0.992-0.999; replayed 0.990)
# fell on either side of its interval's edge: a change under 2% is not one a rerun would repeat.
FUSION_MIN_GAIN = 1.02

# What each way of comparing reads of a run's row: the figure, and the low and high end of its interval.
_COMPARED = {
    "p10": ("step_ms_p10", "step_ms_p10_low", "step_ms_p10_high"),
    "median": ("step_ms_median", "step_ms_median_low", "step_ms_median_high"),
    "spread": ("step_ms_median", "step_ms_p10", "step_ms_p90"),
}


# The verdict of an eager row whose fusion was also timed replayed from CUDA graphs at the same precision: the
# replay judges it. On one H200 (2026-11-27, two processes at once, 30 rounds in turns) the bf16 eager rows were
# "faster"/"slower" in one process and "within noise" in the other (its fast steps' intervals 5x wider: the host
# was busier), while the replayed rows, which have no host time in them, agreed to 0.1%.
JUDGED_ON_REPLAY = "judged on the replay"


def _band(row: Mapping[str, Any]) -> Band:
    return Band(row["step_ms_median"], row["step_ms_p10"], row["step_ms_p90"],
                row.get("step_ms_median_low", math.nan), row.get("step_ms_median_high", math.nan),
                row.get("step_ms_p10_low", math.nan), row.get("step_ms_p10_high", math.nan))


def compared_on(control: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    """How the two runs are compared: on the p10s' 95% intervals where both rows recorded them (every
    comparison record since 2026-11-27), else on the medians' intervals, else on the p10-p90 bands."""
    def known(*keys: str) -> bool:
        return all(math.isfinite(row.get(key, math.nan)) for row in (control, run) for key in keys)

    if known("step_ms_p10_low", "step_ms_p10_high"):
        return "p10"
    return "median" if known("step_ms_median_low", "step_ms_median_high") else "spread"


def verdict(control: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    """``tinyllama.timing.verdict`` of the fused run against its control: "faster" or "slower" where the two
    p10s' 95% confidence intervals do not overlap and the p10s differ by at least :data:`FUSION_MIN_GAIN`,
    else "within noise". The p10s are the fast steps, where the host kept up with the device: an eager
    step's median follows the host's load, and decided on the medians the bf16 eager rows flipped between
    processes on one H200 whose fast steps agreed within 0.4% (2026-11-27)."""
    return timing_verdict(_band(control), _band(run), on=compared_on(control, run), min_ratio=FUSION_MIN_GAIN)[1]


def _effect(control: Mapping[str, Any], run: Mapping[str, Any]) -> dict[str, Any]:
    """The compared figure of both runs, their ratio (control / fused) and the ratio's range from the
    intervals the verdict reads."""
    on = compared_on(control, run)
    value, low, high = _COMPARED[on]
    return {"compared": on, "control_ms": control[value], "fused_ms": run[value],
            "speedup": control[value] / run[value],
            "speedup_low": control[low] / run[high], "speedup_high": control[high] / run[low]}


def fusion_effects(record: Mapping[str, Any], settings: Iterable[tuple[str, bool]]) -> Any:
    """Each fusion against the unfused V2 of the same (precision, graphed) setting, as a pandas
    DataFrame: ``setting``, ``fusion``, ``compared`` (the figure compared: ``"p10"``, the fast steps, in
    every record that kept their intervals), ``control_ms`` and ``fused_ms`` (that figure of both runs),
    ``speedup`` (control / fused), ``speedup_low``/``speedup_high`` (from the intervals :func:`verdict`
    decides on), ``verdict``, and the GEMM launches per step of both. Settings whose control was not
    timed are left out. An eager row whose fusion and control were also timed replayed at the same precision
    (and listed in ``settings``) has the verdict :data:`JUDGED_ON_REPLAY`: the replayed row is the verdict."""
    import pandas as pd

    settings = list(settings)

    def replayed(name: str, precision: str) -> bool:
        return ((precision, True) in settings and timed_run(record, fusion_label("none", precision, True)) is not None
                and timed_run(record, fusion_label(name, precision, True)) is not None)

    rows = []
    for precision, graphed in settings:
        control = timed_run(record, fusion_label("none", precision, graphed))
        if control is None:
            continue
        for name in ("qkv", "gate_up", "both"):
            run = timed_run(record, fusion_label(name, precision, graphed))
            if run is None:
                continue
            rows.append({
                "setting": f"{precision}, {'CUDA graphs' if graphed else 'eager'}", "fusion": name,
                **_effect(control, run),
                "verdict": (JUDGED_ON_REPLAY if not graphed and replayed(name, precision)
                            else verdict(control, run)),
                "gemm_ops_control": control.get("gemm_ops"), "gemm_ops_fused": run.get("gemm_ops"),
                "gemm_kernels_control": control.get("gemm_kernels"), "gemm_kernels_fused": run.get("gemm_kernels"),
            })
    return pd.DataFrame(rows, columns=["setting", "fusion", "compared", "control_ms", "fused_ms", "speedup", "speedup_low",
                                       "speedup_high", "verdict", "gemm_ops_control", "gemm_ops_fused",
                                       "gemm_kernels_control", "gemm_kernels_fused"], dtype=object)
