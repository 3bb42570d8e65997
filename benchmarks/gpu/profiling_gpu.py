"""One call on a GPU: the profiling and roofline toolkit, checked and measured for real.

    python benchmarks/gpu/profiling_gpu.py --out DIR            # medium, bf16, V1 and the fastest version

In order (progress is printed; the whole run is meant to finish in about 5 minutes on one H100):

1. the vendor profilers found here, with versions;
2. measured ceilings (matmul fp32/tf32/bf16/fp16, device copy) next to the datasheet peaks;
3. correctness first: DeepSpeed's and torch.utils.flop_counter's counts of V1 and resnet18 agree, the
   training FLOPs agree four ways, and the fast version gives V1's loss from V1's weights and trains
   every parameter;
4. per version: the PyTorch-profiler operator table of a step, the time by phase and category, the
   CPU/device overhead ratio, memory per phase, and the roofline points of every operator;
5. ncu for real on a TinyLLaMA step (a known GEMM first, whose FLOPs ncu must count as 2 n^3, then the
   first kernels of a step), parsed by tinyllama.profiling.vendor, as kernel roofline points;
6. writes profiling.json, profiling.md, roofline.png, ncu_roofline.png, memory.png and the ncu CSVs
   to DIR (flat, at most 8 files).

``--device cpu --preset ci`` runs the same steps on a CPU (no ncu, no datasheet), to test the script.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tinyllama import device as dev  # noqa: E402
from tinyllama.config import get_preset  # noqa: E402
from tinyllama.correctness import check_every_parameter_trained  # noqa: E402
from tinyllama.harness.records import markdown_table  # noqa: E402
from tinyllama.models import VERSIONS, build, model_class  # noqa: E402
from tinyllama.models.weights import transfer_weights  # noqa: E402
from tinyllama.profiling import flops as pflops  # noqa: E402
from tinyllama.profiling import memory, roofline, vendor  # noqa: E402
from tinyllama.profiling.ncu_step import KNOWN_GEMM, profile_step_with_ncu  # noqa: E402
from tinyllama.profiling.torch_profiler import profile_steps  # noqa: E402
from tinyllama.training import TrainingStep, make_batches  # noqa: E402

FAST_ORDER = ("v4", "v3", "v2")  # the course's versions, fastest by design first
STARTED = time.perf_counter()


def say(message: str) -> None:
    print(f"[{time.perf_counter() - STARTED:6.1f} s] {message}", flush=True)


def elapsed() -> float:
    return time.perf_counter() - STARTED


def attempt(record: dict[str, Any], key: str, fn: Callable[[], Any]) -> Any:
    """Run one part; a failure is recorded with its message and the run goes on."""
    try:
        return fn()
    except Exception as error:  # noqa: BLE001 - every part reports, none stops the others
        record[key] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc(limit=4)}
        say(f"{key} FAILED: {type(error).__name__}: {error}")
        return None


def frame_records(frame: Any, columns: list[str] | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    if frame is None:
        return []
    frame = frame if columns is None else frame[[c for c in columns if c in frame.columns]]
    frame = frame if limit is None else frame.head(limit)
    return json.loads(frame.to_json(orient="records"))


def build_model(version: str, config: Any, compiled: bool = True) -> torch.nn.Module:
    """The version as the course runs it; ``compiled=False`` builds an uncompiled twin where the
    version has a compile switch (for counting its work operator by operator)."""
    if not compiled and "compile" in model_class(version).switch_names:
        return build(version, config, compile=False)
    return build(version, config)


# --------------------------------------------------------------------------------------------------
# The measurement
# --------------------------------------------------------------------------------------------------


def check_flop_counters(record: dict[str, Any], device: torch.device, config: Any, preset: Any) -> None:
    torch.manual_seed(0)
    v1 = build("v1", config).to(device)
    tokens = torch.randint(0, config.vocab_size, (preset.batch_size, preset.seq_len), device=device)
    c = pflops.compare_counts(v1, (tokens,))
    record["flops_v1_forward"] = {
        "deepspeed_macs": c.deepspeed.macs, "deepspeed_flops": c.deepspeed.flops,
        "flop_counter": c.flop_counter.total, "rel_diff": c.total_rel_diff, "agree": c.agree,
        "tolerance": c.tolerance, "notes": c.notes,
        "by_type_depth3": frame_records(c.deepspeed.by_depth(3))}
    say(f"V1 forward: DeepSpeed 2xMACs {2 * c.deepspeed.macs:.4g} vs flop_counter {c.flop_counter.total:.4g} "
        f"-> agree={c.agree}")
    inputs, targets = make_batches(config, preset.batch_size, preset.seq_len, count=1, device=device)[0]
    table = pflops.training_flop_table(v1, inputs, targets, config)
    record["training_flops"] = frame_records(table)
    say("training FLOPs, four ways: " + ", ".join(f"{r:.4f}" for r in table["ratio_to_analytic"]))
    del v1
    import torchvision

    resnet = torchvision.models.resnet18(weights=None).to(device).eval()
    r = pflops.compare_counts(resnet, (torch.randn(1, 3, 224, 224, device=device),))
    record["flops_resnet18"] = {"deepspeed_gmacs": r.deepspeed.macs / 1e9, "flop_counter_gflops": r.flop_counter.total / 1e9,
                                "rel_diff": r.total_rel_diff, "agree": r.agree, "notes": r.notes}
    say(f"resnet18: DeepSpeed {r.deepspeed.macs / 1e9:.3f} GMACs, flop_counter {r.flop_counter.total / 1e9:.3f} GFLOPs "
        f"-> agree={r.agree}")
    dev.free_memory(device)


def check_same_function(fast: str, config: Any, preset: Any, precision: str, device: torch.device) -> dict[str, Any]:
    """V1's weights in the fast version give V1's loss, and every parameter trains."""
    torch.manual_seed(1)
    reference = build("v1", config).to(device)
    candidate = build_model(fast, config).to(device)
    transfer_weights(reference, candidate)
    batch = make_batches(config, preset.batch_size, preset.seq_len, count=1, seed=123, device=device)[0]
    losses: dict[str, float] = {}
    for name, model in (("v1", reference), (fast, candidate)):
        step = TrainingStep(model, precision, device)

        def loss_fn() -> torch.Tensor:
            loss = step.loss(*batch)
            losses[name] = loss.item()
            return loss

        check_every_parameter_trained(model, loss_fn)
    rel = abs(losses[fast] - losses["v1"]) / abs(losses["v1"])
    tolerance = 2e-2 if precision in ("bf16", "fp16") else 1e-3
    if not rel <= tolerance:
        raise AssertionError(f"{fast} gives loss {losses[fast]:.5f} where V1 gives {losses['v1']:.5f} "
                             f"(relative difference {rel:.2e} > {tolerance}): not timed")
    return {"losses": losses, "rel_diff": rel, "tolerance": tolerance, "every_parameter_trained": True}


def measure_version(label: str, version: str, precision: str, config: Any, preset: Any, device: torch.device,
                    roofs: roofline.Roofs, out: Path, with_memory_plot: bool) -> tuple[dict[str, Any], Any]:
    say(f"{label}: building {version} ({precision})")
    torch.manual_seed(0)
    model = build_model(version, config).to(device)
    step = TrainingStep(model, precision, device)
    inputs, targets = make_batches(config, preset.batch_size, preset.seq_len, count=1, device=device)[0]
    twin = build_model(version, config, compiled=False).to(device)
    count_step = TrainingStep(twin, precision, device) if twin is not model else step
    record: dict[str, Any] = {"label": label, "version": version, "precision": precision}
    began = time.perf_counter()
    step(inputs, targets)  # warm-up: compilation, optimizer state
    dev.synchronize(device)
    record["first_step_s"] = time.perf_counter() - began

    say(f"{label}: PyTorch profiler (1 wait, 1 warm-up, 3 active steps)")
    run = profile_steps(lambda: step(inputs, targets), device=device, wait=1, warmup=1, active=3)
    overhead = run.overhead()
    ops = run.operators()
    step_ms = (run.kernels()["total_ns"].sum() / 1e6 / run.steps) if run.on_device else float(ops["self_cpu_ms"].sum())
    record["profile"] = {
        "device_ms_per_step": step_ms,
        "overhead": {"cpu_ms": overhead.cpu_ms, "device_ms": overhead.device_ms, "ratio": overhead.ratio,
                     "waiting_ms": overhead.waiting_ms, "verdict": overhead.verdict},
        "top_operators": frame_records(run.top(15), ["name", "category", "calls_per_step", "self_device_ms",
                                                     "self_cpu_ms", "share_pct"]),
        "category_shares": frame_records(run.category_shares()),
        "breakdown": frame_records(run.breakdown()),
        "top_kernels": frame_records(run.kernels(), limit=10),
        "kernels_outside_operators": frame_records(run.kernels_outside_operators(), limit=10),
    }
    say(f"{label}: {step_ms:.2f} ms of device work per step, CPU/device {overhead.ratio if overhead.ratio else float('nan'):.2f}")

    say(f"{label}: memory per phase")
    record["phase_memory"] = attempt(record, "phase_memory", lambda: frame_records(
        memory.phase_memory(step, inputs, targets, warmup=0))) or []
    record["memory_breakdown"] = attempt(record, "memory_breakdown", lambda: frame_records(
        memory.memory_breakdown(step, inputs, targets))) or []

    def memory_plot() -> None:
        title = f"{label}: memory over one training step ({preset_name(preset)})"
        if device.type == "cuda":
            snap = memory.memory_snapshot(lambda: step(inputs, targets), device=device, warmup=0)
            memory.plot_snapshot_timeline(memory.snapshot_timeline(snap, device.index or 0), out / "memory.png", title=title)
        else:
            memory.plot_memory_timeline(memory.memory_timeline(lambda: step(inputs, targets), device=device),
                                        out / "memory.png", title=title)

    if with_memory_plot:
        attempt(record, "memory_plot", memory_plot)

    say(f"{label}: roofline points (count, then profile)")
    points = roofline.roofline_points(lambda: step(inputs, targets), roofs, label=label, device=device,
                                      count_fn=lambda: count_step(inputs, targets))
    record["roofline_points"] = frame_records(points, ["operator", "category", "calls", "flops", "flop_source", "bytes",
                                                       "precision", "time_ms", "time_pct", "intensity", "tflops", "tbs",
                                                       "bound", "attainable_tflops", "pct_of_roof", "excess_ms"])
    del model, twin, step, count_step
    dev.free_memory(device)
    return record, points


def preset_name(preset: Any) -> str:
    c = preset.model
    return f"hidden {c.hidden_dim}, {c.num_layers} layers, batch {preset.batch_size} x {preset.seq_len}"


def write_markdown(record: dict[str, Any], out: Path) -> None:
    env = record["environment"]
    lines = [f"# Profiling and roofline: {record['preset']} ({record['precision']}), {env['device']}, {record['date']}",
             "", f"torch {env['torch']}, triton {env.get('triton')}; `python benchmarks/gpu/profiling_gpu.py --out DIR` "
             f"({record['seconds']:.0f} s)", "", "## Vendor profilers", "",
             markdown_table(pd.DataFrame([{"tool": t["tool"], "available": t["available"], "version": t["version"],
                                           "note": t["message"][:80]} for t in record.get("tools", [])], dtype=object)),
             "", "## Ceilings", "",
             markdown_table(pd.DataFrame([{
                 "ceiling": c["ceiling"], "measured": f"{c['measured']:.4g} {c['unit']}",
                 "datasheet": c["datasheet"] or "n/a",
                 "% of datasheet": None if c["measured_pct_of_datasheet"] is None else f"{c['measured_pct_of_datasheet']:.0f}%"}
                 for c in record.get("ceilings", [])], dtype=object), digits=4)]
    lines += ["", "## Correctness before measuring", ""]
    for key in ("flops_v1_forward", "flops_resnet18", "same_function"):
        lines.append(f"- {key}: `{json.dumps({k: v for k, v in record.get(key, {}).items() if k not in ('traceback', 'by_type_depth3')}, default=str)[:600]}`")
    for r in record.get("training_flops", []):
        lines.append(f"- training FLOPs, {r['count']}: {r['flops']:.4g} ({r['ratio_to_analytic']:.4f} x analytic)")
    for run in record.get("runs", []):
        p = run.get("profile", {})
        lines += ["", f"## {run['label']} ({run['version']}, {run['precision']})", "",
                  f"Device work per step {p.get('device_ms_per_step', float('nan')):.2f} ms; CPU/device "
                  f"{(p.get('overhead') or {}).get('ratio')}: {(p.get('overhead') or {}).get('verdict')}; first step "
                  f"{run.get('first_step_s', float('nan')):.1f} s", "",
                  markdown_table(pd.DataFrame([{"category": c["category"], "ms/step": f"{c['time_ms']:.2f}",
                                                "share": f"{c['share_pct']:.1f}%"} for c in p.get("category_shares", [])])),
                  "", markdown_table(pd.DataFrame([{
                      "operator": o["operator"], "category": o["category"], "ms/step": f"{o['time_ms']:.2f}",
                      "FLOP/byte": o["intensity"], "TFLOP/s": o["tflops"], "bound": o["bound"],
                      "% of roof": None if o["pct_of_roof"] is None else round(o["pct_of_roof"])}
                      for o in run.get("roofline_points", [])[:12]], dtype=object))]
        lines += ["", "Memory per phase (MiB): " + ", ".join(
            f"{m['phase']} {m['allocated_mib']} (peak {m['peak_mib']})" for m in run.get("phase_memory", []))]
    for n in record.get("ncu", []):
        lines += ["", f"## ncu, {n.get('version')}", ""]
        if "error" in n:
            lines.append(f"not run: {n['error'][:500]}")
            continue
        g = n["known_gemm"]
        lines.append(f"Known {KNOWN_GEMM}^3 bf16 GEMM: ncu counted {g['counted_flops']:.4g} FLOPs of {g['expected_flops']:.4g} "
                     f"(ratio {g['ratio']:.3f}), {g['time_us']:.1f} us, {g['tflops']:.0f} TFLOP/s. "
                     f"{n['kernels_profiled']} kernels in {n.get('seconds', 0):.0f} s; tensor counters: {n['tensor_counters']}")
    (out / "profiling.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="folder for the results (flat)")
    parser.add_argument("--preset", default="medium")
    parser.add_argument("--precision", default="bf16", help="precision of every run (fp32, tf32, bf16, fp16)")
    parser.add_argument("--versions", nargs="+", help="versions to compare (default: v1 and the fastest available)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--ncu-launch-count", type=int, default=40, help="kernels ncu profiles per version (after the GEMM)")
    parser.add_argument("--skip-ncu", action="store_true")
    parser.add_argument("--budget-s", type=float, default=330, help="skip optional parts past this many seconds")
    args = parser.parse_args()
    if not args.out:
        parser.error("--out is required")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = dev.get_device(args.device)
    preset = get_preset(args.preset)
    config = preset.model
    fast = next((v for v in FAST_ORDER if v in VERSIONS), None)
    versions = args.versions or (["v1", fast] if fast else ["v1"])
    runs = [(v.upper(), v, args.precision) for v in versions]
    if len(runs) == 1:  # nothing faster exists yet: V1 in fp32 against V1 at the chosen precision
        runs = [("V1 fp32", "v1", "fp32"), (f"V1 {args.precision}", "v1", args.precision)]

    record: dict[str, Any] = {"date": dt.date.today().isoformat(), "preset": args.preset, "precision": args.precision,
                              "environment": dev.environment_summary(device), "runs": [], "ncu": []}
    say(f"device {record['environment']['device']}, torch {torch.__version__}; runs {runs}")
    tools = vendor.detect_tools()
    record["tools"] = frame_records(tools)
    found = [f"{t} {v or ''}" for t, v, a in zip(tools["tool"], tools["version"], tools["available"]) if a]
    say("vendor profilers: " + (", ".join(found) if found else "none found"))

    say("ceilings (matmul per precision, copy)")
    roofs = roofline.measure_roofs(device, matmul_size=None if device.type == "cuda" else 512)
    record["roofs"] = roofs.to_dict()
    record["ceilings"] = frame_records(roofs.table())
    for c in record["ceilings"]:
        say(f"  {c['ceiling']}: {c['measured']:.4g} {c['unit']} (datasheet {c['datasheet']})")

    say("correctness: FLOP counters")
    attempt(record, "flops_v1_forward", lambda: check_flop_counters(record, device, config, preset))
    fast_runs = [(label, v, p) for label, v, p in runs if v != "v1"]
    for label, version, precision in fast_runs:
        say(f"correctness: {version} computes V1's function")
        result = attempt(record, "same_function", lambda: check_same_function(version, config, preset, precision, device))
        if result is None:
            say(f"{version} is not measured: it failed its correctness check")
            runs = [r for r in runs if r[1] != version]
        else:
            record["same_function"] = result
            say(f"  losses {result['losses']} (relative difference {result['rel_diff']:.2e})")
        dev.free_memory(device)

    points = {}
    for i, (label, version, precision) in enumerate(runs):
        measured = attempt(record, f"run_{label}", lambda: measure_version(label, version, precision, config, preset,
                                                                          device, roofs, out, with_memory_plot=i == 0))
        if measured:
            record["runs"].append(measured[0])
            points[label] = measured[1]
    if points:
        title = f"{' vs '.join(points)} at {args.preset} ({preset_name(preset)}), {record['environment']['device']}"
        roofline.plot_roofline(points, roofs, out / "roofline.png", title=title)
        if len(points) > 1:
            first, second = list(points.values())[:2]
            record["compare_points"] = frame_records(roofline.compare_points(first, second), limit=20)
        import pandas as pd

        record["category_summary"] = frame_records(roofline.category_summary(pd.concat(points.values())))
        say(f"roofline.png written ({', '.join(points)})")

    ncu_available = bool(tools.set_index("tool").loc["ncu", "available"])
    if args.skip_ncu or device.type != "cuda" or not ncu_available:
        reason = "skipped (--skip-ncu)" if args.skip_ncu else "no GPU" if device.type != "cuda" else \
            tools.set_index("tool").loc["ncu", "message"]
        record["ncu"].append({"version": "all", "error": reason})
        say(f"ncu: {reason}")
    else:
        ncu_points = {}
        for label, version, _ in runs:
            left = args.budget_s - elapsed()
            if left < 60:
                record["ncu"].append({"version": version, "error": f"skipped: {elapsed():.0f} s used of the {args.budget_s:.0f} s budget"})
                say(f"ncu {version}: skipped (time budget)")
                continue
            holder: dict[str, Any] = {}
            result = attempt(holder, "ncu", lambda: profile_step_with_ncu(
                version, args.preset, args.precision, args.ncu_launch_count, out, timeout_s=min(180.0, left - 30), say=say))
            if result is None:
                record["ncu"].append({"version": version, **holder["ncu"]})
                continue
            kernel_pts = roofline.kernel_points(result.pop("points"), roofs, label=f"{label} (ncu)",
                                                precision=args.precision if args.precision != "fp32" else "fp32")
            result["points"] = frame_records(kernel_pts, ["operator", "category", "calls", "flops", "bytes", "time_ms",
                                                          "intensity", "tflops", "tbs", "bound", "pct_of_roof"])
            record["ncu"].append(result)
            ncu_points[f"{label} (ncu)"] = kernel_pts
            say(f"ncu {version}: GEMM FLOPs ratio {result['known_gemm']['ratio']:.3f}, {result['kernels_profiled']} kernels")
        if ncu_points:
            roofline.plot_roofline(ncu_points, roofs, out / "ncu_roofline.png",
                                   title=f"ncu: first {args.ncu_launch_count} kernels of a step, DRAM bytes measured")

    record["seconds"] = elapsed()
    (out / "profiling.json").write_text(json.dumps(record, indent=1, default=str))
    write_markdown(record, out)
    say(f"done: {sorted(p.name for p in out.iterdir())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
