"""V2's fusions in a comparison record: the run specs of each fusion and its control, and each
fusion's effect against the unfused V2 of the same precision and kind of step (eager, or replayed
from CUDA graphs), with the 95% interval of the speed-up and the verdict of ``tinyllama.timing.verdict``."""

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


def _band(row: Mapping[str, Any]) -> Band:
    return Band(row["step_ms_median"], row["step_ms_p10"], row["step_ms_p90"],
                row.get("step_ms_median_low", math.nan), row.get("step_ms_median_high", math.nan))


def _on(control: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    """Decide on the medians' 95% intervals where both runs recorded them (every record since they were kept),
    else on the p10-p90 bands."""
    known = all(math.isfinite(row.get(key, math.nan)) for row in (control, run)
                for key in ("step_ms_median_low", "step_ms_median_high"))
    return "median" if known else "spread"


def verdict(control: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    """``tinyllama.timing.verdict`` of the fused run against its control: "faster" or "slower" where the two
    medians' 95% confidence intervals do not overlap (a rerun would find the same order), else "within noise".
    A fusion changes a step by a few percent; the p10-p90 band of an eager step's single samples is wider
    than that, and decided on the bands the eager rows' verdicts flipped between two runs on one H200 machine
    (2026-11-27) whose medians agreed within 0.4%."""
    return timing_verdict(_band(control), _band(run), on=_on(control, run))[1]


def _speedup_interval(control: Mapping[str, Any], run: Mapping[str, Any]) -> dict[str, float]:
    low, high = ("step_ms_median_low", "step_ms_median_high") if _on(control, run) == "median" else ("step_ms_p10",
                                                                                                     "step_ms_p90")
    return {"speedup_low": control[low] / run[high], "speedup_high": control[high] / run[low]}


def fusion_effects(record: Mapping[str, Any], settings: Iterable[tuple[str, bool]]) -> Any:
    """Each fusion against the unfused V2 of the same (precision, graphed) setting, as a pandas
    DataFrame: ``setting``, ``fusion``, ``control_ms``, ``fused_ms``, ``speedup`` (control / fused),
    ``speedup_low``/``speedup_high`` (from the intervals :func:`verdict` decides on), ``verdict``, and the GEMM launches
    per step of both. Settings whose control was not timed are left out."""
    import pandas as pd

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
                "control_ms": control["step_ms_median"], "fused_ms": run["step_ms_median"],
                "speedup": control["step_ms_median"] / run["step_ms_median"],
                **_speedup_interval(control, run),
                "verdict": verdict(control, run),
                "gemm_ops_control": control.get("gemm_ops"), "gemm_ops_fused": run.get("gemm_ops"),
                "gemm_kernels_control": control.get("gemm_kernels"), "gemm_kernels_fused": run.get("gemm_kernels"),
            })
    return pd.DataFrame(rows, columns=["setting", "fusion", "control_ms", "fused_ms", "speedup", "speedup_low",
                                       "speedup_high", "verdict", "gemm_ops_control", "gemm_ops_fused",
                                       "gemm_kernels_control", "gemm_kernels_fused"], dtype=object)
