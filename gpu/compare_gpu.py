"""The V1 -> V2 -> V4 measurement on one GPU, in one process: correct first, then timed.

    PYTHONUNBUFFERED=1 python gpu/compare_gpu.py --out results/   # about 4-6 minutes on an H100

1. measures this GPU's matmul ceilings (bf16 and fp32, 8192^3, tinyllama.ceilings);
2. runs ``tinyllama.compare`` at the medium preset (hidden 1024, 12 layers, batch 16 x 512): V1 fp32,
   V2's fusions one at a time in fp32 and in bf16, eager and replayed from CUDA graphs (with an
   unfused V2 as the control), V2 + SDPA,
   V2 + SDPA + compile, V4 bf16, V4 with CUDA graphs per compiled block (compile mode
   reduce-overhead) and V4 with the whole training step replayed from CUDA graphs. Every run
   gets V1's weights and is checked against V1 (loss, logits, every gradient) before it is timed;
   the profiler counts GEMM launches per step;
3. profiles V4's training step (top kernels and operators, time by kind of kernel);
4. judges the issue's targets: V4 bf16 at most 1/10 of V1 fp32's step time, at least 45% MFU
   against the measured bf16 ceiling, and each V2 fusion's own effect (time and GEMM launches);
5. writes compare.json (the comparison record, appended), summary.json (ceilings, targets, fusion
   effects, V4's profile), compare.csv, compare.md and compare.png to --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from tinyllama import compare as cmp  # noqa: E402
from tinyllama import device as dev  # noqa: E402
from tinyllama.ceilings import measure_matmul_tflops  # noqa: E402

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
    switches = ",".join(s for s in (FUSIONS[name], "cuda_graph=1" if steps == "CUDA graphs" else "") if s)
    return f"v2{f'[{switches}]' if switches else ''}:{precision}"


def default_runs() -> list[str]:
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


KERNEL_KINDS = (("GEMM", lambda n: cmp.is_gemm_kernel(n)),
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


# ------------------------------------------------------------------------------------------------
# Markdown
# ------------------------------------------------------------------------------------------------


def md_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
        return str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def markdown(record: dict[str, Any], summary: dict[str, Any]) -> str:
    env = record["environment"]
    table_rows = []
    for r in record["runs"]:
        timed = r["check"] == "passed"
        table_rows.append({
            "run": r["label"], "check": r["check"],
            "step ms (p10-p90)": f"{r['step_ms_median']:.2f} ({r['step_ms_p10']:.2f}-{r['step_ms_p90']:.2f})" if timed else "-",
            "fwd/bwd/opt ms": (f"{r['forward_ms_median']:.1f} / {r['backward_ms_median']:.1f} / "
                               f"{r['optimizer_ms_median']:.1f}") if timed else "-",
            "tokens/s": f"{r['tokens_per_s']:,.0f}" if timed else "-",
            "peak MiB": f"{r['peak_memory_mib']:,.0f}" if timed and r.get("peak_memory_mib") else "-",
            "TFLOP/s": f"{r['achieved_tflops']:.1f}" if timed else "-",
            "MFU measured": f"{100 * r['mfu_measured']:.1f}%" if timed and r.get("mfu_measured") else "-",
            "speed-up": f"{r['speedup']:.2f}x" if timed and r.get("speedup") else "-",
            "GEMM kernels/ops": f"{r.get('gemm_kernels')}/{r.get('gemm_ops')}" if timed else "-",
        })
    parts = [
        f"# TinyLLaMA V1 -> V2 -> V4 on {record['device']}",
        "",
        f"{record['date']} | torch {env['torch']} | CUDA {env.get('cuda')} | HIP {env.get('hip')} | "
        f"preset {record['preset']} (hidden {record['config']['hidden_dim']}, {record['config']['num_layers']} "
        f"layers), batch {record['batch_size']} x seq {record['seq_len']} | {record['num_steps']} timed steps "
        f"after {record['warmup_steps']} warm-up | wall time {summary['wall_s']:.0f} s",
        "",
        "Measured matmul ceilings (8192^3): " + ", ".join(f"{p} {v:.0f} TFLOP/s" for p, v in summary["ceilings_tflops"].items())
        + (f"; datasheet bf16 {summary['datasheet_bf16_tflops']:.0f} TFLOP/s" if summary.get("datasheet_bf16_tflops") else ""),
        "",
        "Every run got V1's weights and was checked against V1 at fp32 (logits, loss, every gradient) "
        "and at its own precision before it was timed. Speed-ups are against V1 fp32 in this same process.",
        "",
        md_table(table_rows, list(table_rows[0])),
        "",
        "## Targets",
        "",
        md_table([{**t, "met": "met" if t["met"] else "NOT MET"} for t in summary["targets"]], ["target", "measured", "met"]),
        "",
        "## V2's fusions, one at a time (against an unfused V2 of the same precision)",
        "",
        md_table(summary["fusion_effects"], ["precision", "steps", "fusion", "control_ms", "fused_ms", "speedup", "verdict",
                                             "gemm_kernels", "gemm_ops"]),
        "",
    ]
    profile = summary.get("v4_profile") or []
    if profile:
        parts += [f"## Where V4's step goes (PyTorch profiler, {V4})", "",
                  md_table([{"kind of kernel": k, "ms per step": v} for k, v in summary["v4_kernel_time_by_kind"].items()],
                           ["kind of kernel", "ms per step"]), "",
                  md_table([r for r in profile if r["kind"] == "kernel"][:15],
                           ["name", "calls_per_step", "device_ms", "percent"]), "",
                  md_table([r for r in profile if r["kind"] == "op"][:15],
                           ["name", "calls_per_step", "device_ms", "cpu_ms", "percent"]), ""]
    if summary.get("gate_up_operators"):
        parts += ["## The gate/up fusion, operator by operator (PyTorch profiler, bf16 eager steps)", "",
                  f"Milliseconds per step of each operator (device time): {fusion_label('none', 'bf16')} (control) against "
                  f"{fusion_label('gate_up', 'bf16')} (fused), largest changes first.", "",
                  md_table(summary["gate_up_operators"], ["operator", "control_ms", "fused_ms", "delta_ms"]), ""]
    failed = [r for r in record["runs"] if r["check"] != "passed"]
    if failed:
        parts += ["## Not timed", ""] + [f"- {r['label']}: {r['check_message']}" for r in failed] + [""]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for compare.json/.csv/.md/.png and summary.json")
    parser.add_argument("--preset", default="medium")
    parser.add_argument("--num-steps", type=int, default=20)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--runs", nargs="+", default=None, help="override the run list (compare's run specs)")
    parser.add_argument("--device", default=None, help="default: the GPU; 'cpu' only for a smoke test")
    args = parser.parse_args(argv)

    began = time.perf_counter()
    if args.device is None and not torch.cuda.is_available():
        print("error: no GPU found. This script measures a GPU; for a smoke test on the CPU pass "
              "--device cpu --preset ci.", file=sys.stderr)
        return 2
    device = dev.get_device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(json.dumps(dev.environment_summary(device)), flush=True)

    print("measuring matmul ceilings (8192^3 on a GPU) ...", flush=True)
    ceilings = {p: measure_matmul_tflops(p, device=device).value for p in ("bf16", "fp32")}
    print("  " + ", ".join(f"{p}: {v:.1f} TFLOP/s" for p, v in ceilings.items()), flush=True)

    runs = args.runs or default_runs()
    # Profiled besides V4: the unfused V2 and V2 with only the gate/up fusion (bf16), to show where
    # that fusion gains or loses time, operator by operator.
    gate_up = (fusion_label("none", "bf16"), fusion_label("gate_up", "bf16"))
    result = cmp.compare(runs, args.preset, num_steps=args.num_steps, warmup_steps=args.warmup_steps,
                         device=device, profile_runs=[V4, *gate_up], profile_top=200, ceilings=ceilings,
                         progress=True)
    record = result.record
    print(result, flush=True)

    profile = record["profiles"].get(V4, [])
    peaks = dev.device_peaks(device)
    summary = {
        "kind": "tinyllama.compare_gpu", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": record["device"], "torch": record["environment"]["torch"],
        "ceilings_tflops": ceilings, "datasheet_bf16_tflops": peaks.bf16_tflops if peaks else None,
        "targets": targets(record), "fusion_effects": fusion_effects(record),
        "v4_kernel_time_by_kind": kernel_time_by_kind(profile), "v4_profile": profile[:60],
        "gate_up_operators": operator_differences(record["profiles"], *gate_up),
        "wall_s": time.perf_counter() - began,
    }
    result.save_json(out / "compare.json")
    result.save_csv(out / "compare.csv")
    from tinyllama.records import append_json_records

    append_json_records(out / "summary.json", [summary])
    (out / "compare.md").write_text(markdown(record, summary))
    result.plot().savefig(out / "compare.png", dpi=110)

    print("\ntargets:")
    for t in summary["targets"]:
        print(f"  [{'met' if t['met'] else 'NOT MET'}] {t['target']}: {t['measured']}")
    if summary["v4_kernel_time_by_kind"]:
        print("V4 kernel time per step by kind: " + ", ".join(
            f"{k} {v:.2f} ms" for k, v in summary["v4_kernel_time_by_kind"].items()))
    print(f"wrote {', '.join(sorted(os.listdir(out)))} to {out} in {summary['wall_s']:.0f} s", flush=True)
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main())
