"""The V1 -> V2 -> V3 -> V4 measurement on one GPU, in one process: correct first, then timed.

    PYTHONUNBUFFERED=1 python benchmarks/gpu/compare_gpu.py --out results/

(4-6 minutes on an H100 without the V3 rows; with them an estimated 8-12, V3's first steps autotune
its kernels and its compiled runs compile.) V3 against V4 alone:

    PYTHONUNBUFFERED=1 python benchmarks/gpu/compare_gpu.py --out results/ --runs v1:fp32 v3:bf16 \
        "v3[cuda_graph=1]:bf16" "v3[compile=1]:bf16" "v3[compile=1,compile_mode=reduce-overhead]:bf16" \
        "v4[cuda_graph=0]:bf16" "v4[compile_mode=reduce-overhead]:bf16" v4:bf16

1. measures this GPU's matmul ceilings (bf16 and fp32, 8192^3, tinyllama.costs.ceilings);
2. runs ``tinyllama.harness.compare`` at the medium preset (hidden 1024, 12 layers, batch 16 x 512): V1 fp32,
   V2's fusions one at a time in fp32 and in bf16, eager and replayed from CUDA graphs (with an
   unfused V2 as the control), V2 + SDPA,
   V2 + SDPA + compile, V3 bf16 (the Triton kernels: eager, whole step replayed from CUDA graphs,
   blocks compiled, blocks compiled with compile's CUDA graphs), V4 bf16 with eager launches, V4 with
   CUDA graphs per compiled block (compile mode reduce-overhead) and V4 as shipped (its whole training
   step replayed from CUDA graphs). Every run
   gets V1's weights and is checked against V1 (loss, logits, every gradient) before it is timed;
   the profiler counts GEMM launches per step;
3. profiles V4's and V3's training steps (top kernels and operators, time by kind of kernel);
4. judges the issue's targets: V4 bf16 at most 1/10 of V1 fp32's step time, at least 45% MFU
   against the measured bf16 ceiling, V3 eager within 1.2x of V4 with eager launches and V3's
   whole-step CUDA graph no slower than V4 as shipped, and each V2 fusion's own effect (time and GEMM launches);
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

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

from tinyllama import device as dev  # noqa: E402
from tinyllama.costs.ceilings import measure_matmul_tflops  # noqa: E402
from tinyllama.harness import compare as cmp  # noqa: E402
from tinyllama.harness.comparison.targets import (  # noqa: E402
    V3,
    V4,
    default_runs,
    fusion_effects,
    fusion_label,
    kernel_time_by_kind,
    operator_differences,
    targets,
)
from tinyllama.harness.records import append_json, markdown_table  # noqa: E402

# ------------------------------------------------------------------------------------------------
# Markdown
# ------------------------------------------------------------------------------------------------


def md_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """``columns`` of ``rows`` as a markdown table (a missing key blank)."""
    return markdown_table(pd.DataFrame(rows, columns=columns, dtype=object))


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
        f"# TinyLLaMA V1 -> V2 -> V3 -> V4 on {record['device']}",
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
    v3_profile = summary.get("v3_profile") or []
    if v3_profile:
        parts += [f"## Where V3's step goes (PyTorch profiler, {V3}; our kernels appear as tinyllama:: operators)", "",
                  md_table([{"kind of kernel": k, "ms per step": v} for k, v in summary["v3_kernel_time_by_kind"].items()],
                           ["kind of kernel", "ms per step"]), "",
                  md_table([r for r in v3_profile if r["kind"] == "kernel"][:15],
                           ["name", "calls_per_step", "device_ms", "percent"]), "",
                  md_table([r for r in v3_profile if r["kind"] == "op"][:15],
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
                         device=device, profile_runs=[V4, V3, *gate_up], profile_top=200, ceilings=ceilings,
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
        "v3_kernel_time_by_kind": kernel_time_by_kind(record["profiles"].get(V3, [])),
        "v3_profile": record["profiles"].get(V3, [])[:60],
        "gate_up_operators": operator_differences(record["profiles"], *gate_up),
        "wall_s": time.perf_counter() - began,
    }
    result.save_json(out / "compare.json")
    result.save_csv(out / "compare.csv")
    append_json(out / "summary.json", [summary])
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
