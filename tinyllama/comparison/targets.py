"""The GPU measurement of the versions (``gpu/compare_gpu.py``): its run list, and the judgement of
a comparison record against the course's targets (V4's speed-up and MFU, each V2 fusion's own
effect), with the profiles' differences that explain them."""

from __future__ import annotations

from typing import Any

from tinyllama.profiling.queries import is_gemm_kernel

V4 = "v4:bf16"
V4_GRAPHS = "v4[compile_mode=reduce-overhead]:bf16"
V4_STEP_GRAPH = "v4[cuda_graph=1]:bf16"  # the whole training step, optimizer included, in CUDA graphs
V1 = "v1:fp32"
FUSIONS = {  # name -> V2 switches; "none" is the control that every fusion is measured against
    "none": "fuse_qkv=0,fuse_gate_up=0",
    "qkv": "fuse_qkv=1,fuse_gate_up=0",
    "gate_up": "fuse_qkv=0,fuse_gate_up=1",
    "both": "",
}


# Where each fusion is measured: eager steps in fp32 and bf16, and bf16 steps replayed from CUDA graphs
# (the eager bf16 steps are bound by Python's launches, so there a fusion also saves launch time,
# and the host's jitter widens the spread; the graphed steps show what the fusion does on the GPU).
FUSION_SETTINGS = (("fp32", "eager"), ("bf16", "eager"), ("bf16", "CUDA graphs"))


def fusion_label(name: str, precision: str, steps: str = "eager") -> str:
    """The run spec of V2 with fusion ``name`` at ``precision``, eager or replayed from CUDA graphs."""
    switches = ",".join(s for s in (FUSIONS[name], "cuda_graph=1" if steps == "CUDA graphs" else "") if s)
    return f"v2{f'[{switches}]' if switches else ''}:{precision}"


def default_runs() -> list[str]:
    """The runs the GPU measurement compares (``gpu/compare_gpu.py``)."""
    runs = [V1]
    for precision, steps in FUSION_SETTINGS:
        if (precision, steps) == ("bf16", "eager"):
            runs.append("v1:bf16")
        runs += [fusion_label(name, precision, steps) for name in FUSIONS]
    # V4 as it is, then with each compiled block replayed as a CUDA graph (compile's own), then with
    # the whole step replayed from graphs (tinyllama.bench.GraphedTrainingStep): launch overhead
    return runs + ["v2[sdpa=1]:bf16", "v2[sdpa=1,compile=1]:bf16", V4, V4_GRAPHS, V4_STEP_GRAPH]


# ------------------------------------------------------------------------------------------------
# Judging the record
# ------------------------------------------------------------------------------------------------


def _row(record: dict[str, Any], label: str) -> dict[str, Any] | None:
    row = next((r for r in record["runs"] if r["label"] == label), None)
    return row if row is not None and row["check"] == "passed" else None


def _beyond_spread(control: dict[str, Any], run: dict[str, Any]) -> str:
    """'faster'/'slower' when the p10..p90 ranges of the step times do not overlap."""
    if run["step_ms_p90"] < control["step_ms_p10"]:
        return "faster beyond the spread"
    if run["step_ms_p10"] > control["step_ms_p90"]:
        return "slower beyond the spread"
    return "within the spread"


def fusion_effects(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Each fusion against the unfused V2 of the same precision and kind of step: step time and GEMM
    launches."""
    rows = []
    for precision, steps in FUSION_SETTINGS:
        control = _row(record, fusion_label("none", precision, steps))
        for name in ("qkv", "gate_up", "both"):
            run = _row(record, fusion_label(name, precision, steps))
            if control is None or run is None:
                rows.append({"precision": precision, "steps": steps, "fusion": name,
                             "verdict": "not measured (failed or missing)"})
                continue
            rows.append({
                "precision": precision, "steps": steps, "fusion": name,
                "control_ms": control["step_ms_median"], "fused_ms": run["step_ms_median"],
                "speedup": control["step_ms_median"] / run["step_ms_median"],
                "verdict": _beyond_spread(control, run),
                "gemm_kernels": f"{control.get('gemm_kernels')} -> {run.get('gemm_kernels')}",
                "gemm_ops": f"{control.get('gemm_ops')} -> {run.get('gemm_ops')}",
            })
    return rows


def targets(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's performance targets, each with the measured value and met / not met."""
    v1, v4 = _row(record, V1), _row(record, V4)
    out = []
    for label, name in ((V4, "V4 bf16"), (V4_STEP_GRAPH, "V4 bf16, whole step in CUDA graphs,")):
        run = _row(record, label)
        target = f"{name} step time <= 1/10 of V1 fp32's"
        if label != V4 and not any(r["label"] == label for r in record["runs"]):
            continue  # the whole-step graph run is optional (not on the CPU)
        if v1 and run:
            ratio = run["step_ms_median"] / v1["step_ms_median"]
            out.append({"target": target, "met": ratio <= 0.1, "measured":
                        f"{run['step_ms_median']:.1f} ms vs {v1['step_ms_median']:.1f} ms = 1/{1 / ratio:.2f}"})
        else:
            out.append({"target": target, "measured": f"{V1} or {label} not timed", "met": False})
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
