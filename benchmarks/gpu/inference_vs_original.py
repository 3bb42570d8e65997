"""ResNet-50 against the original micro-benchmark at its best flags, both run here, one process per run.

    git clone https://github.com/ROCm/pytorch-micro-benchmarking ORIGINAL     # on a machine with a network
    python benchmarks/gpu/inference_vs_original.py --original ORIGINAL --out DIR          # about 8 minutes on one H200

The original ``micro_benchmarking_pytorch.py`` and ``python -m inference`` get the same flags (fp16,
channels-last, torch.compile; inference at batch 256, training at batch 64); ours is also run with the
inference levers (``--freeze``, ``--cuda-graphs``; in training ``--cuda-graphs``), each checked against fp32 eager
before it is timed. Every run is a fresh process, and the rounds alternate the two programs so that a
drift of the machine shows in both. The original reports the mean over its iterations from a host
clock; ours reports the median of device-event timings: the table gives both, and the verdict compares
the lowest and highest of each side's rounds. Writes ``inference_vs_original.json`` and ``.md`` to --out.

The original's fp16 training updates fp32 copies of the weights that never receive gradients
(``fp16util.get_param_copy``), so its optimizer step does nothing; ours updates every weight.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from tinyllama.harness.records import markdown_table  # noqa: E402

CASES = {  # name -> the flags both programs take, then the lever sets of ours
    "inference b256 fp16 channels-last compile": (
        ["--network", "resnet50", "--mode", "inference", "--batch-size", "256", "--fp16", "1", "--nhwc", "--compile"],
        [[], ["--freeze"], ["--freeze", "--cuda-graphs"]]),
    "training b64 fp16 channels-last compile": (
        ["--network", "resnet50", "--mode", "training", "--batch-size", "64", "--fp16", "1", "--nhwc", "--compile"],
        [[], ["--cuda-graphs"]]),
}
THROUGHPUT = re.compile(r"Throughput \[img/sec\] : ([0-9.]+)")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_original(original: Path, flags: list[str], iterations: int) -> dict:
    command = [sys.executable, "micro_benchmarking_pytorch.py", *flags, "--iterations", str(iterations)]
    began = time.time()
    done = subprocess.run(command, cwd=original, capture_output=True, text=True, timeout=900)
    found = THROUGHPUT.findall(done.stdout)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"the original failed ({done.returncode}): {(done.stdout + done.stderr)[-2000:]}")
    return {"throughput": float(found[-1]), "wall_s": time.time() - began, "command": " ".join(command[1:])}


def run_ours(flags: list[str], levers: list[str], iterations: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "inference", *flags, *levers, "--iterations", str(iterations),
                   "--warmup", "10", "--quiet", "--json", f"{tmp}/run.json"]
        began = time.time()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"ours failed ({done.returncode}): {(done.stdout + done.stderr)[-2000:]}")
        record = json.loads(Path(f"{tmp}/run.json").read_text())[0]
    keep = ("throughput", "throughput_mean", "median_ms", "spread_pct", "compile_s", "check", "accuracy_max_rel_diff",
            "loss_check", "levers")
    return {**{k: record.get(k) for k in keep}, "wall_s": time.time() - began,
            "command": "python -m inference " + " ".join(command[3:-2])}


def summarise(rounds: list[dict], key: str = "throughput") -> dict:
    values = [r[key] for r in rounds]
    return {"median": statistics.median(values), "low": min(values), "high": max(values), "runs": values}


def verdict(ours: dict, original: dict) -> str:
    if ours["low"] > original["high"]:
        return "faster"
    if ours["high"] < original["low"]:
        return "slower"
    return "within noise"


def with_rounds(side: dict) -> str:
    """The median img/s, then each round's: ``1,234 (1,230, 1,240)``."""
    return f"{side['median']:,.0f} ({', '.join(f'{v:,.0f}' for v in side['runs'])})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--original", required=True, type=Path, help="a checkout of ROCm/pytorch-micro-benchmarking")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each program and setting (default 3)")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--case", choices=("inference", "training"), default=None, help="run one case only")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    record: dict = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="minutes"),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__, "commit": os.environ.get("OURS_COMMIT"),
        "original_commit": os.environ.get("ORIGINAL_COMMIT"), "iterations": args.iterations, "cases": {}}
    for case, (flags, lever_sets) in CASES.items():
        if args.case and not case.startswith(args.case):
            continue
        runs: dict[str, list[dict]] = {"original": [], **{" ".join(levers) or "same flags": [] for levers in lever_sets}}
        for round_ in range(args.rounds):
            log(f"{case}, round {round_ + 1}: the original")
            runs["original"].append(run_original(args.original, flags, args.iterations))
            for levers in lever_sets:
                name = " ".join(levers) or "same flags"
                log(f"{case}, round {round_ + 1}: ours, {name}")
                try:
                    runs[name].append(run_ours(flags, levers, args.iterations))
                except (RuntimeError, subprocess.TimeoutExpired) as error:
                    log(f"  failed: {str(error)[-600:]}")
        original = summarise(runs["original"])
        rows = {}
        for name, done in runs.items():
            if not done or name == "original":
                continue
            ours = summarise(done)
            rows[name] = {**ours, "ratio": ours["median"] / original["median"], "verdict": verdict(ours, original),
                          "spread_pct": [r["spread_pct"] for r in done], "check": done[0]["check"],
                          "loss_check": done[0]["loss_check"], "command": done[0]["command"]}
            log(f"{case}: ours {name} {ours['median']:,.0f} img/s, original {original['median']:,.0f}: "
                f"{rows[name]['ratio']:.2f}x, {rows[name]['verdict']}")
        record["cases"][case] = {"original": {**original, "command": runs["original"][0]["command"]},
                                 "ours": rows, "raw": runs}
        (args.out / "inference_vs_original.json").write_text(json.dumps(record, indent=1))
    lines = [f"# ResNet-50, ours against the original micro-benchmark ({record['device']}, torch {record['torch']}, "
             f"{record['date']})", "", markdown_table(pd.DataFrame([
                 {"case": case, "ours": name, "img/s (rounds)": with_rounds(row),
                  "original img/s (rounds)": with_rounds(entry["original"]), "ratio": f"{row['ratio']:.2f}x",
                  "verdict": row["verdict"]}
                 for case, entry in record["cases"].items() for name, row in entry["ours"].items()]))]
    (args.out / "inference_vs_original.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
