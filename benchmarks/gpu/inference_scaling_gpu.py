"""Data-parallel scaling of the inference benchmark over 1, 2 and 4 GPUs, four networks, both modes, plus the
all-reduce timed and a straggler made on purpose: the record notebook 05 shows.

    OURS_COMMIT=$(git rev-parse HEAD) PYTHONUNBUFFERED=1 python benchmarks/gpu/inference_scaling_gpu.py --out $OUT
        # on a node with 2 (or 4) GPUs: about 4-5 minutes on 2 x H200, 5 on 4 x H200
    python benchmarks/gpu/inference_scaling_gpu.py --out DIR --smoke     # CPU processes with gloo at toy sizes (checks the script)

On however many GPUs the machine has (1, 2, 4: the counts that fit), for each network (resnet18, resnet50,
resnet152, vit_b_16) one ``torchrun`` launch of ``inference.scaling`` runs inference and training (DDP) at a
fixed batch per GPU (fp16, channels-last, eager): the same work per GPU on every count (weak scaling), so the
efficiency of K GPUs is their global throughput over K times the one-GPU run's. With 2 or more GPUs the
resnet50 launch also times ``all_reduce`` from 1 MiB to ResNet-50's fp32 gradients (``tinyllama.harness.allreduce``),
and on the largest count a last launch repeats resnet50 in both modes with the last rank delayed by
``--straggler-ms`` every iteration. Each launch is separate, so a failure (out of memory, a failed check) costs
that launch only; it is listed under ``failures``.

Writes ``inference_scaling.json`` (one object: device, date, software, commit, settings, every rank's record of
every run, the all-reduce sweeps, failures) and ``inference_scaling.md`` (the efficiency table) to ``--out``.
Append the JSON as a run (``tinyllama.harness.records.run_record``) to the record ``inference/data/inference_scaling.json``:
notebook 05 reads the newest study there. A ``--smoke`` record is marked ``"smoke": true`` and the notebook
refuses it there.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from inference import scaling  # noqa: E402
from inference.recorded import scaling_table  # noqa: E402
from tinyllama import device as dev  # noqa: E402
from tinyllama.harness import allreduce  # noqa: E402

NETWORKS = ("resnet18", "resnet50", "resnet152", "vit_b_16")


def settings(smoke: bool, straggler_ms: float) -> dict[str, Any]:
    """The sizes of a full (GPU) run or of a smoke (CPU) run."""
    if smoke:
        return {"networks": ["resnet18", "resnet50"], "counts": [1, 2], "precision": "fp32", "channels_last": False,
                "input_size": 32, "per_process_batch": {"inference": 2, "training": 2},
                "iterations": {"inference": 4, "training": 3}, "warmup": 1, "allreduce_sizes_mib": "0.25,1",
                "straggler_ms": straggler_ms or 100.0, "device": "cpu"}
    return {"networks": list(NETWORKS), "counts": [1, 2, 4], "precision": "fp16", "channels_last": True,
            "input_size": None, "per_process_batch": {"inference": 128, "training": 64},
            "iterations": {"inference": 30, "training": 20}, "warmup": 5,
            "allreduce_sizes_mib": ",".join(f"{s:g}" for s in allreduce.DEFAULT_SIZES_MIB),
            "straggler_ms": straggler_ms or 10.0, "device": "cuda"}


def plan_of(network: str, s: dict[str, Any], straggler_ms: float = 0.0) -> list[dict[str, Any]]:
    """Inference and training of ``network`` at the settings' per-GPU batches."""
    entries = []
    for mode in ("inference", "training"):
        entry = {"network": network, "mode": mode, "per_process_batch": s["per_process_batch"][mode],
                 "precision": s["precision"], "channels_last": s["channels_last"], "input_size": s["input_size"],
                 "iterations": s["iterations"][mode], "warmup": s["warmup"]}
        if straggler_ms:
            entry["straggler_ms"] = straggler_ms
        entries.append(entry)
    return entries


def launch(k: int, plan: list[dict[str, Any]], name: str, s: dict[str, Any], out: Path, timeout: float,
           allreduce_sizes: str | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """One torchrun launch of ``inference.scaling`` on ``k`` processes: its study, or the failure."""
    plan_file, json_file = out / f"plan_{name}_k{k}.json", out / f"study_{name}_k{k}.json"
    plan_file.write_text(json.dumps(plan))
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(k),
            "-m", "inference.scaling", "--plan", str(plan_file), "--json", str(json_file), "--device", s["device"]]
    if allreduce_sizes and k >= 2:
        argv += ["--allreduce-sizes-mib", allreduce_sizes]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    if s["device"] == "cpu":
        env["OMP_NUM_THREADS"] = "1"  # one core per CPU process, as one GPU per process
    began = time.perf_counter()
    print(f"\n=== {name} on {k} process(es) ===\n{' '.join(argv)}", flush=True)
    try:
        done = subprocess.run(argv, env=env, cwd=ROOT, timeout=timeout, capture_output=True, text=True)
        output = done.stdout + done.stderr
        status, tail = done.returncode, "\n".join(output.strip().splitlines()[-8:])
        reason = scaling.failure_reason(output)
    except subprocess.TimeoutExpired:
        status, tail = 124, f"did not finish within {timeout:.0f} s"
        reason = tail
    print(f"--- exit {status} after {time.perf_counter() - began:.0f} s\n{tail}", flush=True)
    if status != 0 or not json_file.exists():
        return None, f"{name} on {k}: exit {status}: {reason}"
    study = json.loads(json_file.read_text())
    for record in study["runs"]:
        record["launch"] = name
    return study, None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "results"))
    parser.add_argument("--smoke", action="store_true", help="2 CPU processes with gloo at toy sizes")
    parser.add_argument("--straggler-ms", type=float, default=0.0,
                        help="the straggler's delay per iteration (default 10 ms on GPUs, 100 ms in --smoke)")
    parser.add_argument("--launch-timeout", type=float, default=240, help="seconds per torchrun launch")
    parser.add_argument("--networks", nargs="+", default=None, help=f"default: {' '.join(NETWORKS)}")
    args = parser.parse_args()
    if args.straggler_ms < 0:
        parser.error("--straggler-ms must be 0 or more")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    s = settings(args.smoke, args.straggler_ms)
    if args.networks:
        s["networks"] = list(args.networks)
    gpus = 2 if args.smoke else (torch.cuda.device_count() if dev.backend() != "cpu" else 0)
    if gpus < 1:
        print("no GPU: nothing to measure here (--smoke runs CPU processes to check the script)")
        return 1
    counts = [k for k in s["counts"] if k <= gpus]
    began = time.perf_counter()
    runs: list[dict[str, Any]] = []
    sweeps: list[dict[str, Any]] = []
    failures: list[str] = []
    for k in counts:
        for network in s["networks"]:
            study, failure = launch(k, plan_of(network, s), network, s, out, args.launch_timeout,
                                    s["allreduce_sizes_mib"] if network == "resnet50" else None)
            if failure:
                failures.append(failure)
                continue
            runs += study["runs"]
            sweeps += study["allreduce"]
    if counts[-1] >= 2:
        study, failure = launch(counts[-1], plan_of("resnet50", s, s["straggler_ms"]), "straggler", s, out,
                                args.launch_timeout)
        if failure:
            failures.append(failure)
        else:
            runs += study["runs"]
    device = dev.device_name("cpu" if args.smoke else None)
    record = {"study": "inference_scaling", "smoke": args.smoke, "date": dt.date.today().isoformat(),
              "timestamp": dt.datetime.now().isoformat(timespec="seconds"), "device": device, "gpus": gpus,
              "counts": counts, "environment": dev.environment_summary("cpu" if args.smoke else None),
              "commit": os.environ.get("OURS_COMMIT"), "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
              "settings": s, "seconds": round(time.perf_counter() - began, 1), "runs": runs, "allreduce": sweeps,
              "failures": failures}
    (out / "inference_scaling.json").write_text(json.dumps(record, indent=1, default=str))
    table = scaling_table(runs)
    lines = [f"# Inference benchmark scaling on {gpus} x {device}{' (smoke: CPU processes)' if args.smoke else ''}", "",
             f"{record['date']} | torch {torch.__version__} | commit {record['commit']} | {s['precision']}"
             f"{' channels-last' if s['channels_last'] else ''} | per-GPU batch {s['per_process_batch']}", "",
             table.to_string(index=False) if len(table) else "(no runs)", "",
             "all-reduce: " + "; ".join(f"{r['world_size']} ranks {r['mib']:.1f} MiB busbw {r['busbw_gbs']:.1f} GB/s"
                                        for r in sweeps),
             "", "failures: " + ("; ".join(failures) if failures else "none"),
             f"", f"{record['seconds']:.0f} s in all"]
    (out / "inference_scaling.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
