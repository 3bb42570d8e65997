"""ResNet-50 on one GPU with the inference benchmark, side by side with the original's H200 figures.

    python benchmarks/gpu/inference_gpu.py --out DIR            # about 4-5 minutes on one H100
    python benchmarks/gpu/inference_gpu.py --out DIR --smoke    # the same steps at toy size (CPU is fine)

Correct first: fp16 and bf16 outputs are compared with fp32 on the same weights and inputs, and every
timed run checks its own outputs against fp32 eager before it is timed. Then, all in this one process
on this one device: inference at batch 256 in fp32 and fp16, training at batch 64 in fp32 and fp16
(the original's settings), the best settings the module offers (16-bit, channels-last, torch.compile)
at batch 256, a short batch sweep, and a quick look at the profilers. Writes results.json and
results.md to --out and prints progress as it goes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
import traceback
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere


import inference  # noqa: E402
from inference import BenchmarkConfig, BenchmarkError, compare_precisions, run_benchmark  # noqa: E402
from inference.sweep import sweep_batch_sizes  # noqa: E402
from tinyllama import device as dev  # noqa: E402
from tinyllama.harness.records import markdown_table  # noqa: E402

# Measured of the original micro_benchmarking_pytorch.py on an NVIDIA H200 (torch 2.11), img/s.
ORIGINAL_H200 = {
    ("inference", 256, "fp32"): 7468.0,
    ("inference", 256, "fp16"): 10717.0,
    ("training", 64, "fp32"): 1974.0,
    ("training", 64, "fp16"): 2844.0,
}
BEST_TARGET = 1.5 * ORIGINAL_H200[("inference", 256, "fp16")]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class Plan:
    """The sizes of a full run or of a smoke run."""

    def __init__(self, smoke: bool) -> None:
        self.smoke = smoke
        self.network = "resnet18" if smoke else "resnet50"
        self.input_size = 64 if smoke else None  # None: the network's own 224
        self.infer_batch = 8 if smoke else 256
        self.train_batch = 4 if smoke else 64
        self.warmup = 2 if smoke else 10
        self.iterations = 5 if smoke else 40
        self.sweep = [1, 4, 8, 16] if smoke else [1, 16, 64, 128, 256, 512, 1024]
        # On the CPU a smoke run uses a compiler back end that needs no C++ toolchain time.
        self.compile_backend = {"backend": "aot_eager"} if smoke else {}

    def config(self, **settings) -> BenchmarkConfig:
        base = dict(network=self.network, input_size=self.input_size, warmup=self.warmup,
                    iterations=self.iterations, progress=False)
        base.update(settings)
        return BenchmarkConfig(**base)


def measure(name: str, config: BenchmarkConfig, runs: list[dict], original: float | None = None) -> dict:
    """Run one configuration, print a line, and keep its record (or its error)."""
    log(f"{name}: {config.mode} batch {config.batch_size} {config.precision}"
        f"{' channels-last' if config.channels_last else ''}{' compile ' + str(config.compile_options or {}) if config.compile else ''} ...")
    entry: dict = {"name": name, "original_h200": original}
    try:
        result = run_benchmark(config)
    except BenchmarkError as error:
        log(f"  {name}: FAILED: {error}")
        entry["error"] = str(error)
    except Exception as error:  # keep going: one broken configuration must not lose the others
        log(f"  {name}: ERROR: {error!r}")
        entry["error"] = repr(error)
        entry["traceback"] = traceback.format_exc()
    else:
        entry.update(result.as_record())
        extra = f", compile {result.compile_s:.1f} s" if result.compile_s is not None else ""
        ratio = f", {result.throughput / original:.2f}x the original's H200 figure" if original else ""
        log(f"  {name}: {result.throughput:,.0f} img/s, median {result.timing.median:.2f} ms, "
            f"spread {result.timing.spread_pct:.1f}%, "
            f"peak {'-' if result.peak_memory_mib is None else f'{result.peak_memory_mib:,.0f}'} MiB, "
            f"first iteration {result.first_iteration_ms:.0f} ms{extra}{ratio}; {result.accuracy.describe() if result.accuracy else result.check}")
    runs.append(entry)
    return entry


def profiler_checks(plan: Plan, out: Path) -> dict:
    """Short runs with each profiler: the trace has device kernels, the table has device times."""
    checks: dict = {}
    small = dict(batch_size=32 if not plan.smoke else 4, iterations=6, warmup=2, output_dir=str(out / "traces"))
    try:
        result = run_benchmark(plan.config(kineto=True, **small))
        trace = json.loads(Path(result.trace_files[0]).read_text())
        kernels = [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"]
        checks["kineto"] = {"trace": result.trace_files[0], "kernel_events": len(kernels)}
        log(f"kineto: trace {result.trace_files[0]} with {len(kernels)} device kernel events")
    except Exception as error:
        checks["kineto"] = {"error": repr(error)}
        log(f"kineto: ERROR {error!r}")
    try:
        result = run_benchmark(plan.config(autograd_profiler=True, **small))
        checks["autograd_profiler"] = {"table_head": result.operator_table.splitlines()[:8]}
        log("autograd profiler table:\n" + "\n".join(result.operator_table.splitlines()[:12]))
    except Exception as error:
        checks["autograd_profiler"] = {"error": repr(error)}
        log(f"autograd profiler: ERROR {error!r}")
    try:
        result = run_benchmark(plan.config(flops_prof_step=3, **small))
        profile = result.flops_profile
        checks["deepspeed"] = profile.as_dict()
        log(f"deepspeed: {profile.macs_per_sample / 1e9:.3f} GMACs per sample, {profile.params / 1e6:.2f} M params")
    except inference.MissingDependencyError as error:
        checks["deepspeed"] = {"skipped": str(error)}
        log(f"deepspeed: skipped ({error})")
    except Exception as error:
        checks["deepspeed"] = {"error": repr(error)}
        log(f"deepspeed: ERROR {error!r}")
    return checks


def write_markdown(path: Path, report: dict) -> None:
    env = report["environment"]
    lines = [
        f"# Inference benchmark on {env['device']} ({report['date']})",
        "",
        f"torch {env['torch']}, CUDA {env.get('cuda')}, HIP {env.get('hip')}, triton {env.get('triton')}; "
        f"network {report['network']}; every run checked against fp32 eager before it was timed.",
        "Original: micro_benchmarking_pytorch.py measured on an NVIDIA H200 (torch 2.11), not in this "
        "process: compare with care when this device is not an H200.",
        "",
        "## Precision check (same weights, same inputs, eval mode)",
        "",
    ]
    lines += [f"- {line}" for line in report["precision_check"]]
    rows = []
    for run in report["runs"]:
        if "error" in run:
            rows.append({"run": run["name"], "img/s": f"failed: {run['error'][:80]}"})
            continue
        settings = run["precision"] + (" nhwc" if run["channels_last"] else "") + (
            f" compile {json.dumps(run['compile_options'])}" if run["compiled"] else "")
        original = run.get("original_h200")
        rel = run.get("accuracy_max_rel_diff")
        rows.append({
            "run": run["name"], "mode": run["mode"], "batch": run["batch_size"], "settings": settings,
            "img/s": f"{run['throughput']:,.0f}", "original H200 img/s": f"{original:,.0f}" if original else "",
            "ratio": f"{run['throughput'] / original:.2f}x" if original else "", "median ms": f"{run['median_ms']:.2f}",
            "spread %": f"{run['spread_pct']:.1f}", "first iter ms": f"{run['first_iteration_ms']:.0f}",
            "compile s": f"{run['compile_s']:.1f}" if run.get("compile_s") is not None else "",
            "peak MiB": f"{run['peak_memory_mib']:,.0f}" if run.get("peak_memory_mib") is not None else "-",
            "check max rel diff": f"{rel:.2g}" if rel is not None else run["check"]})
    columns = ["run", "mode", "batch", "settings", "img/s", "original H200 img/s", "ratio", "median ms", "spread %",
               "first iter ms", "compile s", "peak MiB", "check max rel diff"]
    lines += ["", "## Throughput", "", markdown_table(pd.DataFrame(rows, columns=columns, dtype=object))]
    targets = report["targets"]
    lines += ["", "## Targets", ""]
    for item in targets["same_settings"]:
        lines.append(f"- {item['name']}: {item['ours']:,.0f} vs {item['original']:,.0f} img/s "
                     f"({item['ratio']:.2f}x): {'met' if item['met'] else 'NOT met'}")
    best = targets["best"]
    if best:
        lines.append(f"- best {report['network']} inference at batch {best['batch_size']} ({best['name']}): "
                     f"{best['ours']:,.0f} img/s vs "
                     f"1.5 x 10,717 = {BEST_TARGET:,.0f}: {'met' if best['met'] else 'NOT met'}; "
                     f"{best['speedup_vs_fp32']:.2f}x our fp32 and {best['speedup_vs_fp16']:.2f}x our fp16 eager "
                     "in this process")
    lines += ["", "## Batch sweep (fp16, channels-last, eager inference)", "", "```", report["sweep_table"], "```",
              "", "## Profilers", "", "```", json.dumps(report["profilers"], indent=2, default=str)[:3000], "```", ""]
    path.write_text("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for results.json and results.md")
    parser.add_argument("--smoke", action="store_true", help="toy sizes, to check the script itself")
    parser.add_argument("--budget-s", type=float, default=320.0,
                        help="seconds the whole run may take: optional compiled variants are skipped when "
                             "they would pass it (default 320)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = Plan(args.smoke)
    began = time.time()
    device = dev.get_device()
    env = dev.environment_summary(device)
    log(f"device {env['device']} ({env['backend']}), torch {env['torch']}, triton {env.get('triton')}")
    if device.type != "cuda" and not args.smoke:
        log("no GPU: run with --smoke on the CPU, or on a GPU node")
        return 1

    # 1. Correct first: lower precisions against fp32 on the same weights and inputs.
    check_lines = []
    for channels_last in (False, True):
        for report in compare_precisions(plan.network, ("fp16", "bf16", "amp"), batch_size=32 if not plan.smoke else 4,
                                         channels_last=channels_last, input_size=plan.input_size):
            check_lines.append(report.describe())
            log(f"check: {report.describe()}")

    # 2. The original's settings, then the best this module offers, all in this process.
    runs: list[dict] = []
    ib, tb = plan.infer_batch, plan.train_batch
    same = []
    for mode, batch in (("inference", ib), ("training", tb)):
        for prec in ("fp32", "fp16"):
            original = ORIGINAL_H200.get((mode, batch, prec)) if not plan.smoke else None
            entry = measure(f"{mode} {prec}", plan.config(mode=mode, batch_size=batch, precision=prec), runs, original)
            same.append(entry)
    measure("training amp nhwc", plan.config(mode="training", batch_size=tb, precision="amp", channels_last=True), runs)
    measure("training fp16 nhwc", plan.config(mode="training", batch_size=tb, precision="fp16", channels_last=True), runs)

    def compiled(prec: str, options: dict | None) -> BenchmarkConfig:
        chosen = plan.compile_backend or options  # a smoke run compiles with a quick back end
        return plan.config(batch_size=ib, precision=prec, channels_last=True, compile=True,
                           compile_options=chosen or None)

    freezing = {"options": {"freezing": True}}  # inductor folds BatchNorm into the convolutions
    best_candidates = [
        measure("fp16 nhwc", plan.config(batch_size=ib, precision="fp16", channels_last=True), runs),
        measure("bf16 nhwc", plan.config(batch_size=ib, precision="bf16", channels_last=True), runs),
    ]
    compile_began = time.time()
    best_candidates.append(measure("fp16 nhwc compile freezing", compiled("fp16", freezing), runs))
    compile_cost = time.time() - compile_began

    # 3. A short batch sweep.
    log(f"batch sweep {plan.sweep} (fp16, channels-last, eager inference) ...")
    swept = sweep_batch_sizes(plan.config(precision="fp16", channels_last=True, iterations=max(10, plan.iterations // 2),
                                          warmup=3), plan.sweep)
    print(swept.table(), flush=True)

    # 4. The profilers, briefly.
    profilers = profiler_checks(plan, out)

    # Optional compiled variants, while the time budget lasts (each costs about one compilation).
    optional = [("fp16 nhwc compile reduce-overhead", "fp16", {"mode": "reduce-overhead"}),
                ("bf16 nhwc compile freezing", "bf16", freezing), ("fp16 nhwc compile", "fp16", None)]
    if not plan.smoke:
        optional.append(("fp16 nhwc compile max-autotune-no-cudagraphs", "fp16",
                         {"mode": "max-autotune-no-cudagraphs"}))
    for name, prec, options in optional:
        # Autotuning compiles and times many kernel variants: 289 s against about 25 s for a default
        # compile of ResNet-50 on an H200 (2026-11-22).
        factor = 12 if "max-autotune" in name else 1.2
        if time.time() - began + factor * compile_cost > args.budget_s:
            log(f"skipping {name}: it would pass the time budget of {args.budget_s:.0f} s")
            continue
        best_candidates.append(measure(name, compiled(prec, options), runs))

    # 5. Targets and files.
    def throughput(entry: dict) -> float:
        return entry.get("throughput", 0.0) if "error" not in entry else 0.0

    same_settings = [
        {"name": e["name"], "ours": throughput(e), "original": e["original_h200"],
         "ratio": throughput(e) / e["original_h200"], "met": throughput(e) >= e["original_h200"]}
        for e in same if e.get("original_h200")
    ]
    best = max(best_candidates, key=throughput)
    fp32_inference, fp16_inference = same[0], same[1]
    best_summary = None
    if throughput(best) > 0:
        best_summary = {"name": best["name"], "batch_size": best["batch_size"], "ours": throughput(best),
                        "target": BEST_TARGET,
                        "met": throughput(best) >= BEST_TARGET,
                        "speedup_vs_fp32": throughput(best) / max(throughput(fp32_inference), 1e-9),
                        "speedup_vs_fp16": throughput(best) / max(throughput(fp16_inference), 1e-9)}
    report = {
        "date": dt.datetime.now().isoformat(timespec="seconds"), "environment": env, "network": plan.network,
        "smoke": plan.smoke, "original_h200": {f"{m} {b} {p}": v for (m, b, p), v in ORIGINAL_H200.items()},
        "precision_check": check_lines, "runs": runs,
        "sweep": [{"batch_size": p.batch_size, "status": p.status, "record": p.result.as_record() if p.result else None}
                  for p in swept.points],
        "sweep_table": swept.table(), "profilers": profilers,
        "targets": {"same_settings": same_settings, "best": best_summary}, "elapsed_s": time.time() - began,
    }
    (out / "results.json").write_text(json.dumps(report, indent=2, default=str))
    write_markdown(out / "results.md", report)
    log(f"done in {time.time() - began:.0f} s: {out / 'results.json'}, {out / 'results.md'}")
    for item in same_settings:
        log(f"target {item['name']}: {item['ratio']:.2f}x the original ({'met' if item['met'] else 'NOT met'})")
    if best_summary:
        log(f"target best: {best_summary['name']} {best_summary['ours']:,.0f} img/s vs {BEST_TARGET:,.0f} "
            f"({'met' if best_summary['met'] else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
