"""The GPU measurement of the versions (``benchmarks/gpu/compare_gpu.py``): its run list, and the judgement of
a comparison record against the course's targets (V4's speed-up and MFU, each V2 fusion's own
effect), with the profiles' differences that explain them."""

from __future__ import annotations

from typing import Any

from tinyllama.harness.comparison.fusions import fusion_effects as effects_frame
from tinyllama.harness.comparison.fusions import fusion_label, fusion_runs, timed_run  # noqa: F401 (fusion_label: benchmarks/gpu/compare_gpu.py)
from tinyllama.profiling.kernel_names import is_gemm_kernel

V4 = "v4:bf16"  # as shipped: on a GPU its whole training step, optimizer included, replayed from CUDA graphs
V4_EAGER = "v4[cuda_graph=0]:bf16"  # the same compiled model, every kernel launched from Python
V4_GRAPHS = "v4[compile_mode=reduce-overhead]:bf16"  # compile's own graphs, one per compiled block
V1 = "v1:fp32"
# V3 (the Triton kernels) as a participant runs it, its whole step replayed from CUDA graphs, and its
# blocks compiled (the kernels are registered operators, so Inductor traces through them), without
# and with compile's own CUDA graphs.
V3 = "v3:bf16"
V3_STEP_GRAPH = "v3[cuda_graph=1]:bf16"
V3_COMPILED = "v3[compile=1]:bf16"
V3_COMPILED_GRAPHS = "v3[compile=1,compile_mode=reduce-overhead]:bf16"
V3_RUNS = [V3, V3_STEP_GRAPH, V3_COMPILED, V3_COMPILED_GRAPHS]
V3_EAGER_VS_V4 = 1.2  # V3's step at most this many times V4's


# Where each fusion is measured: eager steps in fp32 and bf16, and bf16 steps replayed from CUDA graphs
# (the eager bf16 steps are bound by Python's launches, so there a fusion also saves launch time,
# and the host's jitter widens the spread; the graphed steps show what the fusion does on the GPU).
FUSION_SETTINGS = (("fp32", False), ("bf16", False), ("bf16", True))


def _steps(graphed: bool) -> str:
    return "CUDA graphs" if graphed else "eager"


def default_runs() -> list[str]:
    """The runs the GPU measurement compares (``benchmarks/gpu/compare_gpu.py``)."""
    runs = [V1]
    for precision, graphed in FUSION_SETTINGS:
        if (precision, graphed) == ("bf16", False):
            runs.append("v1:bf16")
        runs += fusion_runs(precision, graphed)
    # V4 with eager launches, then each compiled block replayed as a CUDA graph (compile's own), then as
    # shipped, the whole step replayed from graphs (tinyllama.training.GraphedTrainingStep): launch overhead
    return runs + ["v2[sdpa=1]:bf16", "v2[sdpa=1,compile=1]:bf16", *V3_RUNS, V4_EAGER, V4_GRAPHS, V4]


# ------------------------------------------------------------------------------------------------
# Judging the record
# ------------------------------------------------------------------------------------------------


def _count(value: Any) -> str:
    return "None" if value is None or value != value else str(int(value))  # None or NaN: not counted


def fusion_effects(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Each fusion against the unfused V2 of the same precision and kind of step: step time and GEMM
    launches, as rows for the GPU measurement's table (:func:`tinyllama.harness.comparison.fusions.fusion_effects`
    is the same as a DataFrame)."""
    frame = effects_frame(record, FUSION_SETTINGS)
    rows = []
    for precision, graphed in FUSION_SETTINGS:
        for name in ("qkv", "gate_up", "both"):
            match = frame[(frame["setting"] == f"{precision}, {_steps(graphed)}") & (frame["fusion"] == name)]
            row = {"precision": precision, "steps": _steps(graphed), "fusion": name}
            if match.empty:
                rows.append({**row, "verdict": "not measured (failed or missing)"})
                continue
            e = match.iloc[0]
            rows.append({**row, "control_ms": e["control_ms"], "fused_ms": e["fused_ms"], "speedup": e["speedup"],
                         "verdict": e["verdict"],
                         "gemm_kernels": f"{_count(e['gemm_kernels_control'])} -> {_count(e['gemm_kernels_fused'])}",
                         "gemm_ops": f"{_count(e['gemm_ops_control'])} -> {_count(e['gemm_ops_fused'])}"})
    return rows


def targets(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's performance targets, each with the measured value and met / not met."""
    v1, v4 = timed_run(record, V1), timed_run(record, V4)
    out = []
    for label, name in ((V4, "V4 bf16 as shipped"), (V4_EAGER, "V4 bf16 with eager launches,")):
        run = timed_run(record, label)
        target = f"{name} step time <= 1/10 of V1 fp32's"
        if label != V4 and not any(r["label"] == label for r in record["runs"]):
            continue  # the eager-launch run is optional
        if v1 and run:
            ratio = run["step_ms_median"] / v1["step_ms_median"]
            out.append({"target": target, "met": ratio <= 0.1, "measured":
                        f"{run['step_ms_median']:.1f} ms vs {v1['step_ms_median']:.1f} ms = 1/{1 / ratio:.2f}"})
        else:
            out.append({"target": target, "measured": f"{V1} or {label} not timed", "met": False})
    out += _v3_targets(record, v4)
    mfu = v4.get("mfu_measured") if v4 else None
    if mfu is None:
        measured = "n/a (V4 not timed or no ceiling)"
    else:
        datasheet = "n/a" if v4.get("mfu") is None else f"{100 * v4['mfu']:.1f}%"
        measured = (f"{100 * mfu:.1f}% ({v4['achieved_tflops']:.0f} of {v4['ceiling_tflops']:.0f} TFLOP/s; "
                    f"datasheet MFU {datasheet})")
    out.append({"target": "V4 bf16 MFU >= 45% of the measured bf16 matmul rate", "measured": measured,
                "met": mfu is not None and mfu >= 0.45})
    # GEMM launches: device kernels on a GPU, PyTorch's matmul operators on the CPU (no kernels there).
    launches = "gemm_ops" if record["device"].startswith("CPU") else "gemm_kernels"
    for effect in fusion_effects(record):
        target = f"V2 fusion '{effect['fusion']}' ({effect['precision']}, {effect['steps']} steps) shows its own effect"
        if "speedup" not in effect:
            out.append({"target": target, "measured": effect["verdict"], "met": False})
            continue
        before, after = effect[launches].split(" -> ")
        fewer = "None" not in (before, after) and int(after) < int(before)
        out.append({"target": target, "met": fewer and effect["verdict"].startswith("faster"),
                    "measured": f"{effect['speedup']:.3f}x, {effect['verdict']}, GEMM launches {effect[launches]}"})
    return out


def _v3_targets(record: dict[str, Any], v4: dict[str, Any] | None) -> list[dict[str, Any]]:
    """V3 against V4, launches like for like: both with eager launches (V4's blocks compiled, V3's Triton
    kernels) within ``V3_EAGER_VS_V4``, and V3's whole step replayed from CUDA graphs no slower than V4 as
    shipped (replayed too). Where the record has no eager-launch V4 (a CPU, where V4 runs eagerly as
    shipped), V4 itself. Left out when the record has no V3 runs (the CPU)."""
    out = []
    v4_eager = V4_EAGER if any(r["label"] == V4_EAGER for r in record["runs"]) else V4
    for label, v4_label, name, limit in ((V3, v4_eager, "V3 bf16 step time", V3_EAGER_VS_V4),
                                         (V3_STEP_GRAPH, V4, "V3 bf16 whole step in CUDA graphs", 1.0)):
        if not any(r["label"] == label for r in record["runs"]):
            continue
        target = f"{name} <= {limit:g}x V4's ({v4_label})"
        run, base = timed_run(record, label), (v4 if v4_label == V4 else timed_run(record, v4_label))
        if run and base:
            ratio = run["step_ms_median"] / base["step_ms_median"]
            out.append({"target": target, "met": ratio <= limit,
                        "measured": f"{run['step_ms_median']:.1f} ms vs {base['step_ms_median']:.1f} ms = {ratio:.2f}x"})
        else:
            out.append({"target": target, "measured": f"{label} or {v4_label} not timed", "met": False})
    return out


KERNEL_KINDS = (("GEMM", is_gemm_kernel),
                ("attention", lambda n: any(s in n.lower() for s in ("flash", "fmha", "attention", "sdpa"))),
                ("optimizer", lambda n: any(s in n.lower() for s in ("adam", "multi_tensor", "foreach"))),
                ("Inductor-fused elementwise/reduction", lambda n: n.startswith("triton_")),
                ("copies", lambda n: "memcpy" in n.lower() or "memset" in n.lower() or "copy" in n.lower()))


def operator_differences(profiles: dict[str, list[dict[str, Any]]], control: str, run: str,
                         top: int = 12) -> list[dict[str, Any]]:
    """Ms per step of each PyTorch operator (device time; CPU time on the CPU) in ``run`` against
    ``control`` (both profiled), the largest changes first: where a fusion gains or loses time."""
    if control not in profiles or run not in profiles:
        return []
    def ms(row: dict[str, Any]) -> float:  # device time on a GPU, the operator's own CPU time on the CPU
        return row["device_ms"] if row["device_ms"] is not None else row["cpu_ms"] or 0.0

    ops = [{r["name"]: ms(r) for r in profiles[label] if r["kind"] == "op"} for label in (control, run)]
    rows = [{"operator": name, "control_ms": ops[0].get(name, 0.0), "fused_ms": ops[1].get(name, 0.0),
             "delta_ms": ops[1].get(name, 0.0) - ops[0].get(name, 0.0)} for name in set(ops[0]) | set(ops[1])]
    return sorted(rows, key=lambda r: -abs(r["delta_ms"]))[:top]


def kernel_time_by_kind(profile: list[dict[str, Any]]) -> dict[str, float]:
    """Device ms per step of the profiled kernels, grouped into GEMM, attention, optimizer, ..."""
    out: dict[str, float] = {}
    for row in profile:
        if row["kind"] != "kernel":
            continue
        kind = next((k for k, test in KERNEL_KINDS if test(row["name"])), "other")
        out[kind] = out.get(kind, 0.0) + row["device_ms"]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
