"""torch.compile across model sizes on one GPU: ResNet-18, -50, -152 and ViT-B/16, each eager, compiled and
compiled with Inductor's freezing, fp16 channels-last, at batch 64 and 256. Notebook 06 reads the newest run of
the record ``inference/data/inference_models.json``; append the file there as a run (``tinyllama.harness.records.run_record``).

    python benchmarks/gpu/inference_models_gpu.py --out $OUT/2026-11-26_h200_inference_models.json     # about 7 min, H200
    python benchmarks/gpu/inference_models_gpu.py --smoke --out tests/data/inference_models_cpu_smoke.json   # CPU, ~2 min

One process, one device: every network's three runs are timed in this process, each checked against
fp32 eager before it is timed (the benchmark stops a run whose outputs differ). Each compile starts from
empty Inductor and Triton cache folders, so the compile seconds of the networks compare. Writes one JSON
file: ``device``, ``date``, ``commit``, ``torch``, ``command`` and ``records``, the records ``python -m
inference --json`` writes, each with its ``configuration`` (``eager``, ``compile``, ``compile + freeze``).
A run that fails (out of memory) is kept as a record with its ``error``. ``--smoke`` runs two small
networks at 64 px in fp32 on the CPU: a real run of the same code, for the tests' fixture.
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from anywhere

import torch  # noqa: E402

from inference import BenchmarkConfig, BenchmarkError, run_benchmark  # noqa: E402
from inference.model_sizes import CONFIGURATIONS, NETWORKS  # noqa: E402
from tinyllama import device as dev  # noqa: E402
from tinyllama.profiling.compiled import empty_compile_caches  # noqa: E402

LEVERS = {"eager": {}, "compile": {"compile": True}, "compile + freeze": {"compile": True, "freeze": True}}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def commit() -> str:
    # OURS_COMMIT first: a device machine may run a copy of the tree whose .git is not the tree's commit.
    if os.environ.get("OURS_COMMIT"):
        return os.environ["OURS_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def measure(network: str, batch: int, name: str, settings: dict) -> dict:
    config = BenchmarkConfig(network=network, batch_size=batch, mode="inference", progress=False,
                             **LEVERS[name], **settings)
    log(f"{network} batch {batch}: {name} ...")
    try:
        with empty_compile_caches():
            record = run_benchmark(config).as_record()
    except BenchmarkError as error:
        log(f"  FAILED: {error}")
        return {"network": network, "batch_size": batch, "configuration": name, "error": str(error)}
    record["configuration"] = name
    log(f"  {record['throughput']:,.0f} img/s (median {record['median_ms']:.3f} ms, spread {record['spread_pct']:.1f}%), "
        f"check {record['check']}" + (f", compile {record['compile_s']:.1f} s" if record["compile_s"] is not None else ""))
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--smoke", action="store_true", help="two small networks at 64 px in fp32 on the CPU")
    parser.add_argument("--networks", nargs="+", default=None, help=f"default: {' '.join(NETWORKS)}")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=None, help="default: 64 256")
    args = parser.parse_args(argv)
    device = torch.device("cpu") if args.smoke else dev.get_device()
    if not args.smoke and device.type != "cuda":
        parser.error("this script measures a GPU (PyTorch sees none): use --smoke on a CPU")
    if args.smoke:
        networks, batches = args.networks or ["resnet18", "resnet34"], args.batch_sizes or [2]
        settings = dict(precision="fp32", channels_last=True, input_size=64, warmup=1, iterations=5, device="cpu")
    else:
        networks, batches = args.networks or list(NETWORKS), args.batch_sizes or [64, 256]
        settings = dict(precision="fp16", channels_last=True, warmup=5, iterations=30, device=str(device))
    began = time.time()
    records = [measure(network, batch, name, settings) for network in networks for batch in batches
               for name in CONFIGURATIONS]
    out = {"device": dev.device_name(device), "date": dt.date.today().isoformat(), "commit": commit(),
           "torch": torch.__version__, "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
           "settings": settings, "seconds": round(time.time() - began, 1), "records": records}
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=str) + "\n")
    failed = [r for r in records if r.get("error")]
    log(f"wrote {path}: {len(records)} runs, {len(failed)} failed, {out['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
