"""V2's fusions in a comparison record: the run specs of each fusion and its control, and each
fusion's effect against the unfused V2 of the same precision and kind of step (eager, or replayed
from CUDA graphs), with a band from the p10..p90 spreads and a verdict."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

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


def verdict(control: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    """'faster'/'slower beyond the spread' when the p10..p90 ranges of the step times do not overlap."""
    if run["step_ms_p90"] < control["step_ms_p10"]:
        return "faster beyond the spread"
    if run["step_ms_p10"] > control["step_ms_p90"]:
        return "slower beyond the spread"
    return "within the spread"


def fusion_effects(record: Mapping[str, Any], settings: Iterable[tuple[str, bool]]) -> Any:
    """Each fusion against the unfused V2 of the same (precision, graphed) setting, as a pandas
    DataFrame: ``setting``, ``fusion``, ``control_ms``, ``fused_ms``, ``speedup`` (control / fused),
    ``speedup_low``/``speedup_high`` (from the p10..p90 spreads), ``verdict``, and the GEMM launches
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
                "speedup_low": control["step_ms_p10"] / run["step_ms_p90"],
                "speedup_high": control["step_ms_p90"] / run["step_ms_p10"],
                "verdict": verdict(control, run),
                "gemm_ops_control": control.get("gemm_ops"), "gemm_ops_fused": run.get("gemm_ops"),
                "gemm_kernels_control": control.get("gemm_kernels"), "gemm_kernels_fused": run.get("gemm_kernels"),
            })
    return pd.DataFrame(rows, columns=["setting", "fusion", "control_ms", "fused_ms", "speedup", "speedup_low",
                                       "speedup_high", "verdict", "gemm_ops_control", "gemm_ops_fused",
                                       "gemm_kernels_control", "gemm_kernels_fused"], dtype=object)
