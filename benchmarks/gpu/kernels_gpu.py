"""One call on a GPU for the Triton kernels and V3: correct first, then fast.

    python benchmarks/gpu/kernels_gpu.py --out DIR            # about 7-8 minutes on an H100, autotuning included

In order, each part on its own, so that a failing part loses nothing of the others (the results are
rewritten to DIR/kernels_gpu.json and DIR/kernels_gpu.md after every part):

1. environment and measured ceilings (copy bandwidth, matmul rates);
2. the kernel tests (tests/test_kernel_*.py, tests/test_v3.py) compiled, at the workshop's shapes;
3. the model: V3's logits and gradients against V1's with the same weights (fp32 and bf16), the
   debugging stages (stage 1's first loss, stage 2's step time), and bf16 training steps of V1,
   V3 (eager, and replayed from CUDA graphs) and V4 (as shipped, with its CUDA graphs per compiled
   block, and replayed from CUDA graphs like V3), in this one process on the same batches;
4. host time per launch of each of our launchers (remembered configuration and binary, and through
   Triton's own autotuned path), beside a plain Triton launch and F.rms_norm (tinyllama.harness.launch_costs);
5. the kernel benchmark: each kernel against PyTorch eager (attention against SDPA as dispatched by
   default, its backend named, and SDPA's flash backend), eager and graph-replayed, at the medium model's shapes, sequence lengths 512..4096, fp32 and bf16, each checked
   against its reference before it is timed, and the issue's targets judged from the numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from tinyllama import device as dev  # noqa: E402
from tinyllama.harness.records import markdown_table  # noqa: E402

# Last: the launcher's memory (tests/test_kernel_launch.py) and the registered operators with
# torch.compile of V3 (tests/test_kernel_ops.py), here with compiled kernels and triton_op.
TEST_FILES = ["tests/test_kernel_rmsnorm.py", "tests/test_kernel_rope.py", "tests/test_kernel_swiglu.py",
              "tests/test_kernel_flash_attention.py", "tests/test_kernel_rope_attention.py",
              "tests/test_kernel_bench.py", "tests/test_v3.py", "tests/test_cuda_graph_step.py",
              "tests/test_kernel_launch.py", "tests/test_kernel_ops.py"]


class Report:
    """Everything measured so far; written to disk after every part."""

    def __init__(self, out: Path, budget_s: float) -> None:
        self.out = out
        self.began = time.monotonic()
        self.budget_s = budget_s
        self.data: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "parts": {}}
        self.markdown: list[str] = []

    def remaining(self) -> float:
        return self.budget_s - (time.monotonic() - self.began)

    def run(self, name: str, part: Callable[[], tuple[Any, list[str]]]) -> None:
        """Run one part; record its result, markdown, duration, or the error that stopped it."""
        print(f"\n=== {name} ({self.remaining():.0f} s of the budget left) ===", flush=True)
        began = time.monotonic()
        try:
            result, lines = part()
            self.data["parts"][name] = {"status": "ok", "seconds": round(time.monotonic() - began, 1),
                                        "result": result}
            self.markdown += [f"## {name}", "", *lines, ""]
        except Exception as error:  # noqa: BLE001 - keep the other parts' results
            trace = traceback.format_exc()
            print(trace, flush=True)
            self.data["parts"][name] = {"status": f"error: {error}", "seconds": round(time.monotonic() - began, 1),
                                        "traceback": trace}
            self.markdown += [f"## {name}", "", f"**failed**: `{str(error).splitlines()[0] if str(error) else error!r}`",
                              ""]
        self.save()

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "kernels_gpu.json").write_text(json.dumps(self.data, indent=1, default=_jsonable))
        env = self.data.get("environment", {})
        title = f"# Triton kernels and V3: {env.get('device', '?')}, {self.data['date']}"
        versions = f"torch {env.get('torch')}, Triton {env.get('triton')}, Python {env.get('python')}"
        (self.out / "kernels_gpu.md").write_text("\n".join([title, "", versions, "", *self.markdown]) + "\n")


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def _records(frame: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not (isinstance(v, float) and math.isnan(v))}
            for r in frame.to_dict(orient="records")]


# ------------------------------------------------------------------------------------------------
# Parts
# ------------------------------------------------------------------------------------------------


def part_environment(report: Report) -> tuple[Any, list[str]]:
    from tinyllama.harness.kernel_bench import measure_kernel_ceilings

    env = dev.environment_summary()
    report.data["environment"] = env
    print(env, flush=True)
    ceilings = measure_kernel_ceilings(["fp32", "bf16"], dev.get_device())
    report.data["ceilings"] = ceilings
    peaks = dev.device_peaks()
    rows = [{"measured ceiling": "copy (read + write)", "value": f"{ceilings['copy_tbs']:.2f} TB/s",
             "datasheet": peaks.memory_bandwidth_tbs if peaks else "n/a"}]
    rows += [{"measured ceiling": f"matmul {dtype}", "value": f"{ceilings[f'matmul_{dtype}_tflops']:.1f} TFLOP/s",
              "datasheet": peaks.tflops(dtype) if peaks else "n/a"} for dtype in ("fp32", "bf16")]
    lines = [markdown_table(pd.DataFrame(rows, dtype=object), digits=4)]  # datasheets: 989.4 TFLOP/s
    print("\n".join(lines), flush=True)
    return {"environment": env, "ceilings": ceilings}, lines


def part_tests(report: Report, deadline_s: float) -> tuple[Any, list[str]]:
    """Each test file in its own pytest process (compiled kernels are cached on disk and shared), so
    that a file cut off by the deadline keeps the results of the files before it."""
    try:
        import pytest  # noqa: F401
    except ImportError:
        return {"skipped": "pytest is not installed"}, [
            "pytest is not installed here: skipped (the kernel benchmark below still checks every kernel "
            "against its reference before timing it)."]
    began = time.monotonic()
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    files: dict[str, Any] = {}
    failed: list[dict[str, str]] = []
    for test_file in TEST_FILES:
        left = deadline_s - (time.monotonic() - began)
        name = Path(test_file).stem
        if left < 20:
            files[name] = {"status": "not run: time budget"}
            continue
        xml_path, log_path = report.out / f"{name}.xml", report.out / f"{name}.log"
        cmd = [sys.executable, "-m", "pytest", test_file, "-q", "-p", "no:cacheprovider", f"--junitxml={xml_path}",
               "-o", "addopts="]
        print(" ".join(cmd), flush=True)
        file_began = time.monotonic()
        with open(log_path, "w") as log:
            try:
                code: Any = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=left).returncode
            except subprocess.TimeoutExpired:
                code = f"cut off after {left:.0f} s"
        counts = {key: 0 for key in totals}
        if xml_path.exists():
            root = ET.parse(xml_path).getroot()
            suite = root if root.tag == "testsuite" else root.find("testsuite")
            counts = {key: int(suite.get(key, 0)) for key in totals}
            for case in suite.iter("testcase"):
                problem = case.find("failure") if case.find("failure") is not None else case.find("error")
                if problem is not None:
                    failed.append({"test": f"{case.get('classname')}::{case.get('name')}",
                                   "message": (problem.get("message") or "")[:500]})
        for key in totals:
            totals[key] += counts[key]
        files[name] = {"exit": code, "seconds": round(time.monotonic() - file_began, 1), **counts}
        print(f"{name}: {files[name]}\n" + log_path.read_text()[-1500:], flush=True)
    passed = totals["tests"] - totals["failures"] - totals["errors"] - totals["skipped"]
    lines = [f"Kernel tests compiled at the workshop's shapes: **{passed} passed**, {totals['failures']} failed, "
             f"{totals['errors']} errors, {totals['skipped']} skipped in {time.monotonic() - began:.0f} s "
             "(compilation and autotuning included).", "",
             markdown_table(pd.DataFrame([{"file": n, "exit": f.get("exit", f.get("status")), "tests": f.get("tests"),
                                           "failed": f.get("failures"), "errors": f.get("errors"),
                                           "seconds": f.get("seconds")} for n, f in files.items()], dtype=object),
                            digits=4)]
    lines += [f"- FAILED {f['test']}: {f['message'][:200]}" for f in failed]
    return {"passed": passed, **totals, "files": files, "failed": failed}, lines


def part_bench(report: Report, preset: str, seq_lens: list[int]) -> tuple[Any, list[str]]:
    from tinyllama.harness.kernel_bench import SUMMARY_COLUMNS, check_targets, run_kernel_bench, to_markdown

    frame = run_kernel_bench(dtypes=["fp32", "bf16"], seq_lens=seq_lens, preset=preset,
                             ceilings=report.data.get("ceilings"), progress=False)
    targets = check_targets(frame)
    print(to_markdown(frame, SUMMARY_COLUMNS), flush=True)
    print(to_markdown(targets), flush=True)
    from tinyllama.config import get_preset

    shape = get_preset(preset)
    c = shape.model
    lines = [f"Shapes of the `{preset}` model: batch {shape.batch_size}, hidden {c.hidden_dim}, feed-forward "
             f"{c.intermediate_dim}, {c.num_heads} heads / {c.num_kv_heads} KV heads of {c.head_dim}. "
             "`eager_ms` is the median per call launched from Python one call after another (the headline: "
             "what a participant sees); `gpu_ms` the same calls replayed from a CUDA graph (`launch`: graph), "
             "the kernels' own time; `achieved` is bytes moved (RMSNorm, RoPE, SwiGLU) or causal attention "
             "FLOPs per second in GPU time; `ceiling_share` is its fraction of the measured copy bandwidth or "
             "matmul rate; `speedup` (eager) and `speedup_gpu` are the baseline's time over this row's: SDPA "
             "as PyTorch dispatches it by default (`sdpa_backend` names the backend) for attention, eager "
             "PyTorch for the others; `sdpa_flash` is SDPA forced to its flash backend. Every Triton row was "
             "checked against the reference first (`check_error`: largest relative error, output and all "
             "gradients).", "",
             "### Targets", "", to_markdown(targets), "", "### All measurements", "",
             to_markdown(frame, SUMMARY_COLUMNS)]
    return {"rows": _records(frame), "targets": _records(targets)}, lines


def part_launch_costs(report: Report, preset: str) -> tuple[Any, list[str]]:
    from tinyllama.harness.kernel_bench import to_markdown
    from tinyllama.harness.launch_costs import check_target, measure_launch_costs

    frame = measure_launch_costs(preset, torch.bfloat16)
    target = check_target(frame)
    print(to_markdown(frame), flush=True)
    print(target, flush=True)
    lines = ["Host microseconds per call of each launcher, bf16, 64 tokens of the model's shapes (the GPU "
             "finishes each kernel before the next is issued: `host_bound`), 200 calls back to back, in 7 "
             "interleaved rounds after warm-up (median, p10, p90 over the rounds). `remembered`: launched by the "
             "project's Launcher (configuration and binary remembered per key); `triton`: the same launchers "
             "through Triton's "
             "own `kernel[grid](...)` (autotuner lookup and argument binding on every call). "
             "`us_per_launch` divides by the kernels launched per call (attention backward: 2); `vs_plain` and "
             "`vs_rms_norm` divide it by the plain Triton launch's and `F.rms_norm`'s of this run.", "",
             f"Target: {target['target']}: **{'met' if target['met'] else 'NOT MET'}** ({target['measured']})", "",
             to_markdown(frame)]
    return {"rows": _records(frame), "target": target}, lines


def part_model(report: Report, preset_name: str, num_steps: int) -> tuple[Any, list[str]]:
    from tinyllama.config import get_preset
    from tinyllama.harness.bench import make_batches, run_benchmark
    from tinyllama.kernels import max_relative_error
    from tinyllama.models import VERSIONS, build, lm_loss
    from tinyllama.models.weights import canonical_gradients, transfer_weights

    device = dev.get_device()
    preset = get_preset(preset_name)
    config = preset.model
    out: dict[str, Any] = {}
    lines: list[str] = []

    # 1. Same weights, same numbers: V3 against V1 at the medium shape (batch 2 to keep it quick).
    torch.manual_seed(0)
    v1 = build("v1", config).to(device)
    v3 = transfer_weights(v1, build("v3", config).to(device))
    tokens = torch.randint(0, config.vocab_size, (2, preset.seq_len), device=device)
    parity = {}
    for precision in ("fp32", "bf16"):
        torch.backends.cuda.matmul.allow_tf32 = False
        results = []
        for model in (v1, v3):
            model.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                logits = model(tokens)
            lm_loss(logits, tokens).backward()
            grads = canonical_gradients(model)  # V1's names; V3's fused gradients split into their parts
            results.append((logits.detach().float(), {n: g.float() for n, g in grads.items()}))
            model.zero_grad(set_to_none=True)
        (l1, g1), (l3, g3) = results
        parity[precision] = {"logits": max_relative_error(l3, l1),
                             "worst_gradient": max(max_relative_error(g3[n], g) for n, g in g1.items())}
    out["parity_v3_vs_v1"] = parity
    table = markdown_table(pd.DataFrame([{"precision": p, "logits": f"{r['logits']:.2e}",
                                          "worst parameter gradient": f"{r['worst_gradient']:.2e}"}
                                         for p, r in parity.items()]))
    lines += [f"V3 against V1, same weights, {preset_name} shape at batch 2 (relative error: max |diff| / max |V1|):", "",
              table]
    print(table, flush=True)

    # 2. Stage 1: the broken initialisation's first loss.
    with torch.no_grad():
        broken = build("v3", config, stage=1).to(device)
        loss1 = lm_loss(broken(tokens), tokens).item()
        loss3 = lm_loss(v3(tokens), tokens).item()
    del broken, v1, v3
    dev.free_memory(device)
    out["stage_losses"] = {"stage1": loss1, "stage3": loss3, "ln_vocab": math.log(config.vocab_size)}
    lines += ["", f"First loss: stage 1 (N(0, 1) init) **{loss1:.1f}**, stage 3 {loss3:.2f}; "
              f"ln(vocab) = {math.log(config.vocab_size):.2f}.", ""]

    # 3. Training steps, bf16, medium, the same batches for every run, one process.
    batches = make_batches(config, preset.batch_size, preset.seq_len, count=4, seed=0, device=device)
    # V3 eager pays Python's launch cost for each of its ~130 Triton kernels per step; "graph" replays
    # the whole step from CUDA graphs. V4 is timed as it ships, with its own CUDA graphs (one per
    # compiled block) and, like V3[graph], with the whole step replayed from CUDA graphs.
    runs = [("v1", {}, False), ("v3", {}, False), ("v3", {}, True), ("v3", {"stage": 2}, False)]
    if "v4" in VERSIONS:
        runs += [("v4", {}, False), ("v4", {"compile_mode": "reduce-overhead"}, False), ("v4", {}, True)]
    steps: dict[str, Any] = {}
    for version, options, graphed in runs:
        label = version + "".join(f"[{k}={v}]" for k, v in options.items()) + ("[graph]" if graphed else "")
        if report.remaining() < 60 and steps:
            steps[label] = {"status": "skipped: time budget"}
            continue
        try:
            if version == "v4":
                import torch._dynamo as dynamo  # imported late: it must not import Triton before the kernels do

                dynamo.reset()  # each compiled run starts from an empty compiler cache
            result = run_benchmark(version, preset_name, precision="bf16", num_steps=num_steps, warmup_steps=3,
                                   model_options=options, batches=batches, progress=False, cuda_graph=graphed)
            steps[label] = result.to_dict()
            print(result.summary(), flush=True)
        except Exception as error:  # noqa: BLE001 - one run failing must not lose the others
            steps[label] = {"status": f"error: {str(error).splitlines()[0] if str(error) else error!r}"}
            print(traceback.format_exc(), flush=True)
        dev.free_memory(device)
    out["steps_bf16"] = steps
    rows = []
    for label, r in steps.items():
        if "step_ms_median" not in r:
            rows.append({"run": label, "step ms (median)": r.get("status")})
            continue
        rows.append({"run": label, "step ms (median)": f"{r['step_ms_median']:.1f}",
                     "p10-p90": f"{r['step_ms_p10']:.1f}-{r['step_ms_p90']:.1f}", "forward": f"{r['forward_ms_median']:.1f}",
                     "backward": f"{r['backward_ms_median']:.1f}", "optimizer": f"{r['optimizer_ms_median']:.1f}",
                     "tokens/s": f"{r['tokens_per_s']:,.0f}", "peak MiB": f"{r['peak_memory_mib'] or 0:,.0f}"})
    lines += [f"Training step, {preset_name}, bf16 autocast, 3 warm-up + "
              f"{num_steps} timed steps, same batches, this process:", "", markdown_table(pd.DataFrame(rows))]
    median = {k: r["step_ms_median"] for k, r in steps.items() if "step_ms_median" in r}
    ratios = {}
    if "v3" in median and "v1" in median:
        ratios["v1_over_v3"] = median["v1"] / median["v3"]
    if "v3" in median and "v3[stage=2]" in median:
        ratios["stage2_over_stage3"] = median["v3[stage=2]"] / median["v3"]
    if "v3" in median and "v4" in median:
        ratios["v3_over_v4"] = median["v3"] / median["v4"]
    if "v3[graph]" in median and "v4" in median:
        ratios["v3[graph]_over_v4"] = median["v3[graph]"] / median["v4"]
    if "v3[graph]" in median and "v4[graph]" in median:
        ratios["v3[graph]_over_v4[graph]"] = median["v3[graph]"] / median["v4[graph]"]
    if "v3[graph]" in median and "v4[compile_mode=reduce-overhead]" in median:
        ratios["v3[graph]_over_v4[compile_mode=reduce-overhead]"] = (
            median["v3[graph]"] / median["v4[compile_mode=reduce-overhead]"])
    out["ratios"] = ratios
    lines += [""] + [f"- {k.replace('_over_', ' / ')} = **{v:.2f}**" for k, v in ratios.items()]
    for key in ("v3_over_v4", "v3[graph]_over_v4", "v3[graph]_over_v4[graph]",
                "v3[graph]_over_v4[compile_mode=reduce-overhead]"):
        if key in ratios:
            lines.append(f"- target V3 within 1.2x of V4 ({key.replace('_over_', ' / ')}): "
                         f"{'met' if ratios[key] <= 1.2 else 'NOT met'}")
    return out, lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for kernels_gpu.json, kernels_gpu.md and the test log")
    parser.add_argument("--budget-s", type=float, default=400, help="total time to aim for (default 400 s)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["tests", "launch", "bench", "model"])
    parser.add_argument("--preset", default="medium", help="model shapes (default medium; ci for a CPU smoke run)")
    parser.add_argument("--seq-lens", nargs="+", type=int, default=[512, 1024, 2048, 4096])
    parser.add_argument("--num-steps", type=int, default=15, help="timed training steps per run (default 15)")
    args = parser.parse_args()
    if not torch.cuda.is_available() and args.preset != "ci":
        print("error: no GPU visible to PyTorch; this script measures GPU kernels (the CPU tests are "
              "`pytest tests/test_kernel_*.py`; `--preset ci` smoke-tests this script on the CPU)", file=sys.stderr)
        return 2
    if torch.cuda.is_available():
        os.environ.pop("TRITON_INTERPRET", None)
    report = Report(Path(args.out), args.budget_s)
    report.run("environment", lambda: part_environment(report))
    if "tests" not in args.skip:
        report.run("kernel tests", lambda: part_tests(report, deadline_s=max(90.0, min(240.0, report.remaining() - 200))))
    # The model before the kernel benchmark: the benchmark's thousands of graph captures and its
    # out-of-memory probes (V1's attention at seq 4096) left the graphed training step unable to
    # allocate when it came after them (H200, 2026-11-22); in a fresh process it runs in 7 GiB.
    if "model" not in args.skip:
        report.run("model", lambda: part_model(report, args.preset, args.num_steps))
    if "launch" not in args.skip:
        report.run("host time per launch", lambda: part_launch_costs(report, args.preset))
    if "bench" not in args.skip:
        seq_lens = args.seq_lens if report.remaining() > 120 else args.seq_lens[:1] + args.seq_lens[-1:]
        report.run("kernel benchmark", lambda: part_bench(report, args.preset, seq_lens))
    print(f"\nwrote {report.out / 'kernels_gpu.json'} and {report.out / 'kernels_gpu.md'} "
          f"({time.monotonic() - report.began:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
