"""Several benchmark runs in one group of processes: a scaling study in one ``torchrun`` launch.

Starting ``torchrun`` costs seconds (Python, PyTorch, the process group, NCCL's set-up); a study of several
networks and modes pays it once::

    torchrun --nproc-per-node 2 -m inference.scaling --plan plan.json --json study.json \\
        --allreduce-sizes-mib 1,4,16,64,97.5

``plan.json`` is a list of runs, each a dict of :class:`inference.config.BenchmarkConfig` fields with
``per_process_batch`` in place of ``batch_size`` (the global batch is that times the number of processes,
so the same plan is the same work per GPU on 1, 2 or 4 GPUs: weak scaling), for example
``{"network": "resnet50", "mode": "training", "per_process_batch": 64, "precision": "fp16",
"channels_last": true}``. ``"straggler_steps": F`` in place of ``straggler_ms`` delays the last rank by F times
the slowest median of the latest earlier run of the same network and mode without a straggler (a delay
that is the same share of the step in inference and in training). Every process runs every entry in order (:func:`inference.benchmark.run_benchmark`:
checked against fp32 eager, warmed up, timed); rank 0 writes ``{"runs": [every rank's record of every
entry], "allreduce": [...]}`` (``tinyllama.harness.allreduce`` with ``--allreduce-sizes-mib``, 2 or more processes).
A run that fails stops the launch with its error: the others would wait for it at the next collective.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

from inference import distributed
from inference.benchmark import run_benchmark
from inference.config import BenchmarkConfig, BenchmarkError, ConfigError
from tinyllama import device as dev
from tinyllama.harness import allreduce

_FIELDS = {f.name for f in dataclasses.fields(BenchmarkConfig)}


@dataclasses.dataclass
class PlannedRun:
    """One plan entry: its config, and the delay in steps of an earlier run (``straggler_steps``) if any."""

    config: BenchmarkConfig
    straggler_steps: float = 0.0
    reference: int | None = None  # the index of the earlier run whose median the delay is taken from


def configs_from_plan(plan: Sequence[dict[str, Any]], world_size: int, device: str | None = None) -> list[PlannedRun]:
    """The validated runs of each plan entry for ``world_size`` processes; ``ConfigError`` naming the entry and
    the key for anything wrong."""
    if not isinstance(plan, (list, tuple)) or not plan:
        raise ConfigError("the plan must be a non-empty list of runs (dicts of benchmark settings)")
    configs = []
    for index, entry in enumerate(plan):
        if not isinstance(entry, dict):
            raise ConfigError(f"plan entry {index} is a {type(entry).__name__}, not a dict of settings")
        entry = dict(entry)
        if "batch_size" in entry:
            raise ConfigError(f"plan entry {index}: give per_process_batch (the batch of one process), not batch_size")
        per_process = entry.pop("per_process_batch", None)
        if not isinstance(per_process, int) or per_process < 1:
            raise ConfigError(f"plan entry {index}: per_process_batch must be a whole number of samples >= 1 "
                              f"(got {per_process!r})")
        steps = entry.pop("straggler_steps", 0.0)
        unknown = sorted(set(entry) - _FIELDS)
        if unknown:
            raise ConfigError(f"plan entry {index}: unknown settings {', '.join(unknown)}")
        config = BenchmarkConfig(**{**entry, "batch_size": per_process * world_size, "progress": False,
                                    "device": device})
        config.validate()
        reference = None
        if steps:
            if not isinstance(steps, (int, float)) or not steps > 0 or config.straggler_ms:
                raise ConfigError(f"plan entry {index}: straggler_steps must be a positive number, without "
                                  f"straggler_ms (got {steps!r})")
            earlier = [i for i, run in enumerate(configs) if not run.config.straggler_ms and not run.straggler_steps
                       and (run.config.network, run.config.mode) == (config.network, config.mode)]
            if not earlier:
                raise ConfigError(f"plan entry {index}: straggler_steps needs an earlier run of {config.network} "
                                  f"{config.mode} without a straggler, whose step it counts in")
            reference = earlier[-1]
        configs.append(PlannedRun(config, float(steps), reference))
    return configs


def run_plan(planned: Sequence[PlannedRun], ctx: distributed.DistContext, device: torch.device,
             allreduce_sizes: Sequence[int] = (), quiet: bool = True) -> dict[str, Any]:
    """Run every planned run in this process group, then the all-reduce sweep; every rank's records (on rank 0;
    the other ranks get their own only)."""
    runs: list[dict[str, Any]] = []
    slowest: dict[int, float] = {}  # plan index -> the slowest rank's median (the same on every rank: gathered)
    for index, run in enumerate(planned):
        config = run.config.replace(device=str(device))
        if run.straggler_steps:
            config = config.replace(straggler_ms=round(run.straggler_steps * slowest[run.reference], 3))
        result = run_benchmark(config)
        everyone = distributed.gather(result, ctx)
        slowest[index] = max(r.timing.median for r in everyone)
        if ctx.is_main and not quiet:
            print(result.global_summary() or result.summary(), flush=True)
        runs.extend(r.as_record() for r in everyone)
    timings = allreduce.sweep_all_reduce(allreduce_sizes, device) if allreduce_sizes and ctx.distributed else []
    if ctx.is_main and timings and not quiet:
        print(allreduce.table(timings), flush=True)
    return {"runs": runs, "allreduce": [t.as_record() for t in timings]}


def failure_reason(output: str) -> str:
    """The line of a failed torchrun launch's output that says why: the rank's own error (``ValueError: ...``,
    ``torch.OutOfMemoryError: ...``, a failed check), not torchrun's closing summary (from its first banner of
    ``=`` signs: ``exitcode``, ``error_file``, ``traceback : To enable traceback see ...``), nor its
    ``ChildFailedError`` and its own log lines. Falls back to the last other line with any text."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    banner = next((i for i, line in enumerate(lines) if len(line) >= 5 and set(line) <= set("=")), len(lines))
    own = [line for line in lines[:banner]
           if "ChildFailedError" not in line and "torch.distributed.elastic" not in line and not set(line) <= set("=-")]
    for line in reversed(own):
        text = re.sub(r"^\[rank\d+\]:\s*", "", line)  # torchrun's prefix of a rank's stderr
        head = text.split(":", 1)[0].strip()
        if head.endswith(("Error", "Exception")) or text.lower().startswith(("check failed", "error:")):
            return line
    return own[-1] if own else "no output"


def load_plan(text_or_path: str) -> list[dict[str, Any]]:
    """A plan from a JSON file, or from JSON text (starting with ``[``)."""
    try:
        text = text_or_path if text_or_path.lstrip().startswith("[") else Path(text_or_path).read_text()
        return json.loads(text)
    except OSError as error:
        raise ConfigError(f"--plan: cannot read {text_or_path!r} ({error.strerror})") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"--plan is not JSON: {error}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m inference.scaling",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", required=True, help="a JSON file (or JSON text) listing the runs")
    parser.add_argument("--json", required=True, metavar="FILE", help="rank 0 writes every rank's records here")
    parser.add_argument("--allreduce-sizes-mib", default=None, metavar="MIB,...",
                        help="then time all_reduce of these sizes (2 or more processes)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="cpu: CPU processes with gloo (default: one GPU per process if any)")
    parser.add_argument("--quiet", action="store_true", help="print only the file written")
    args = parser.parse_args(argv)
    ctx = distributed.DistContext()
    try:
        plan = load_plan(args.plan)
        sizes = allreduce.parse_sizes_mib(args.allreduce_sizes_mib) if args.allreduce_sizes_mib else []
        if args.device == "cuda" and dev.backend() == "cpu":
            raise ConfigError("--device cuda: PyTorch sees no GPU here; use --device cpu (gloo)")
        # None on GPUs: each process takes the GPU of its local rank
        ctx, device = distributed.setup(device="cpu" if args.device == "cpu" else None)
        configs = configs_from_plan(plan, ctx.world_size, str(device))
        study = run_plan(configs, ctx, device, sizes, quiet=args.quiet)
    except ConfigError as error:
        print(f"error{f' (rank {ctx.rank})' if ctx.distributed else ''}: {error}", file=sys.stderr)
        return 2
    except BenchmarkError as error:
        print(f"error{f' (rank {ctx.rank})' if ctx.distributed else ''}: {error}", file=sys.stderr)
        return 1
    finally:
        distributed.teardown()
    if ctx.is_main:
        Path(args.json).write_text(json.dumps(study, indent=1, default=str))
        print(f"{len(study['runs'])} records and {len(study['allreduce'])} all-reduce sizes written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
