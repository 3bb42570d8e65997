"""Data-parallel TinyLLaMA training on 1, 2 and 4 GPUs (the counts the node has), DDP and FSDP2, medium and large.

    PYTHONUNBUFFERED=1 python benchmarks/gpu/distributed_gpu.py --out $OUT     # on a node with 2 GPUs about 4-6 minutes, 4: 6-9

For each preset it starts ``torchrun --nproc-per-node 1``, then 2 and 4 where the node has them, of
``tinyllama.harness.distributed --strategy ddp fsdp`` (both strategies in the same processes, one after the
other; the same per-GPU batch: the preset's batch on every GPU, bf16, V2 with SDPA). The scaling
efficiency of each multi-GPU run is taken against the 1-GPU run of the same strategy
(``tinyllama.harness.distributed.scaling_table``). Every rank's record is appended to ``distributed.json``; ``distributed_summary.json`` and
``distributed.md`` hold the table of runs (tokens/s, slowest step, peak memory per GPU, communication
per step within a profiled step, beside that step, never beside the unprofiled one; scaling efficiency).
``--record tinyllama/course/data/distributed.json`` appends this run to that record itself (with its date, device,
GPU count, commit from ``$OURS_COMMIT`` or the checkout, and summary); otherwise append ``distributed.json`` as a run (``tinyllama.harness.records.run_record``, ``gpus`` the GPU count) to the record ``tinyllama/course/data/distributed.json``:
notebook 21 shows the latest such file beside its own run. With one GPU only the 1-GPU runs happen.
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

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from tinyllama import device as dev  # noqa: E402
from tinyllama.config import get_preset  # noqa: E402
from tinyllama.course.results import course_commit  # noqa: E402
from tinyllama.harness.distributed import fsdp_available, scaling_table  # noqa: E402
from tinyllama.harness.records import append_json, load_json, markdown_table, run_record  # noqa: E402


def run(k: int, preset: str, strategies: list[str], json_file: Path, args: argparse.Namespace) -> int:
    """One torchrun launch of ``k`` processes; its exit status (its output goes to our stdout)."""
    per_gpu = get_preset(preset).batch_size
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(k),
            "-m", "tinyllama.harness.distributed", "--strategy", *strategies, "--version", args.version,
            "--preset", preset, "--precision", args.precision, "--batch-size", str(k * per_gpu),
            "--num-steps", str(args.num_steps), "--warmup-steps", str(args.warmup_steps),
            "--profiled-steps", "2", "--timeout-s", "300", "--json", str(json_file), "--quiet"]
    argv += [a for o in args.option for a in ("--option", o)]
    if args.device == "cpu":
        argv += ["--device", "cpu"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    began = time.perf_counter()
    print(f"\n=== {' and '.join(strategies)} {preset} on {k} GPU(s) ===\n{' '.join(argv)}", flush=True)
    try:
        done = subprocess.run(argv, env=env, cwd=ROOT, timeout=args.run_timeout)
        status = done.returncode
    except subprocess.TimeoutExpired:
        status = 124
    print(f"--- exit {status} after {time.perf_counter() - began:.0f} s", flush=True)
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "results"))
    parser.add_argument("--presets", nargs="+", default=["medium", "large"])
    parser.add_argument("--strategies", nargs="+", default=["ddp", "fsdp"])
    parser.add_argument("--version", default="v2")
    parser.add_argument("--option", action="append", default=["sdpa=1"], metavar="KEY=VALUE")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--num-steps", type=int, default=20)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: 2 gloo processes on the CPU, to check this script without a GPU (--presets ci)")
    parser.add_argument("--run-timeout", type=float, default=270, help="seconds per torchrun launch")
    parser.add_argument("--record", type=Path, default=None, metavar="JSON",
                        help="append this run to the topic record JSON (e.g. tinyllama/course/data/distributed.json)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_file = out / "distributed.json"
    gpus = torch.cuda.device_count() if dev.backend() != "cpu" and args.device == "cuda" else 0
    if args.device == "cpu":
        gpus = 2  # CPU processes stand in for the GPUs
    elif gpus < 1:
        print("no GPU: nothing to measure here (the CPU path is tests/test_distributed.py and notebook 21)")
        return 1
    counts = [k for k in (1, 2, 4) if k <= gpus]
    if gpus < 2:
        print(f"only {gpus} GPU visible: the multi-GPU runs are skipped", flush=True)
    strategies = [s for s in args.strategies if not s.startswith("fsdp") or fsdp_available()]
    failures = []
    for preset in args.presets:
        for k in counts:
            before = len(load_json(json_file))
            status = run(k, preset, strategies, json_file, args)
            got = {r["strategy"] for r in load_json(json_file)[before:]}
            if status != 0 or got != set(strategies):
                failures.append(f"{preset} x{k}: exit {status}, records for {sorted(got) or 'nothing'}")
    records = load_json(json_file)
    table = scaling_table(records)
    columns = ["preset", "strategy", "world_size", "local_batch_size", "tokens_per_s", "slowest_step_ms",
               "peak_memory_mib", "profiled_step_ms", "transfer_ms", "wait_ms", "exposed_communication_ms",
               "scaling_efficiency"]  # communication inside its profiled step: transfer + wait (skew) <= that step
    device_name = dev.device_name("cpu" if args.device == "cpu" else None)
    summary = {"date": dt.date.today().isoformat(), "device": device_name, "gpus": gpus,
               "environment": dev.environment_summary("cpu" if args.device == "cpu" else None), "version": args.version, "options": args.option,
               "precision": args.precision, "failures": failures,
               "runs": json.loads(table[columns].to_json(orient="records")) if len(table) else []}
    (out / "distributed_summary.json").write_text(json.dumps(summary, indent=1))
    lines = [f"# TinyLLaMA data-parallel training on {gpus} x {summary['device']}", "",
             f"{summary['date']} | torch {torch.__version__} | {args.version} {' '.join(args.option)} {args.precision} | "
             "per-GPU batch = the preset's batch", ""]
    if len(table):
        lines.append(markdown_table(table[columns]))
    lines += ["", "failures: " + ("; ".join(failures) if failures else "none")]
    (out / "distributed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if args.record is not None and records:
        commit = os.environ.get("OURS_COMMIT") or course_commit()
        stem = f"{summary['date']}_{gpus}x{device_name.split()[-1].lower()}_distributed"
        taken = {run.get("source") for run in load_json(args.record)}
        source = next(name for name in (f"{stem}{f'-{k}' if k > 1 else ''}.json" for k in range(1, 1000))
                      if name not in taken)  # a second run of the day gets -2: a record's sources are distinct
        append_json(args.record, [run_record(records, device=device_name, gpus=gpus, commit=commit, source=source,
                                             topic="distributed", summary=summary)])
        print(f"appended this run ({source}, commit {commit or 'unknown'}) to {args.record}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
