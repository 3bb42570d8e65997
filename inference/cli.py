"""The command line: ``python -m inference --network resnet50 --batch-size 32 --fp16 1``.

The original micro_benchmarking_pytorch.py's flag names are kept, so the workshop's commands work
unchanged; ``--precision``, ``--warmup``, ``--json``, ``--nhwc``, ``--sweep`` and ``--max-batch`` are
new. Under ``torchrun --nproc-per-node N -m inference ...`` every process runs its share of the batch
and rank 0 prints every rank's report and the global throughput.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from inference import distributed, networks, profilers, sweep
from inference.benchmark import BenchmarkResult, run_benchmark
from inference.config import (
    COMPILE_MODES,
    INFERENCE_PRECISIONS,
    MODE_WORK,
    MODES,
    ORIGINAL_DEFAULT_MODE,
    BenchmarkConfig,
    BenchmarkError,
    ConfigError,
    parse_compile_context,
)
from inference.results import resolve
from tinyllama.harness.records import append_csv, append_json


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m inference",
        description="Micro-benchmark a torchvision network: inference or training throughput, precision, "
                    "channels-last, torch.compile, profilers, several GPUs with torchrun.",
        epilog="Examples:\n"
               "  python -m inference --network resnet50 --batch-size 32 --iterations 20 --fp16 1\n"
               "  python -m inference --network resnet50 --batch-size 256 --precision fp16 --nhwc --compile\n"
               "  python -m inference --network resnet50 --batch-size 256 --precision fp16 --nhwc --freeze --cuda-graphs\n"
               "  python -m inference --network resnet50 --sweep 8,32,128,256 --precision bf16\n"
               "  torchrun --nproc-per-node 2 -m inference --network resnet50 --batch-size 128\n"
               "  torchrun --nproc-per-node 2 -m inference --network resnet50 --batch-size 128 --straggler-ms 5",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = parser.add_argument_group("what to run")
    what.add_argument("--network", help="torchvision network name (--list shows them)")
    what.add_argument("--list", action="store_true", help="list the networks with their input sizes and exit")
    what.add_argument("--batch-size", type=int, default=64,
                      help="global batch size, split across processes under torchrun (default 64)")
    what.add_argument("--iterations", type=int, default=20, help="timed iterations (default 20)")
    what.add_argument("--warmup", type=int, default=5, help="warm-up iterations, timed apart (default 5)")
    what.add_argument("--mode", choices=MODES, default="inference",
                      help="inference: eval + inference_mode, forward only (default); "
                           "training: forward, loss, backward, SGD step (the default of the original "
                           "micro_benchmarking_pytorch.py: add --mode training to reproduce its figures)")
    what.add_argument("--input-size", type=int, default=None,
                      help="image height = width (default: the size the network is made for)")
    what.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: the GPU if any, else the CPU)")
    what.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs")

    speed = parser.add_argument_group("precision and speed-ups")
    speed.add_argument("--precision", choices=INFERENCE_PRECISIONS, default=None,
                       help="fp32 (default), fp16 or bf16 weights and activations, or amp (autocast)")
    speed.add_argument("--fp16", type=int, default=0, help="1: same as --precision fp16 (the original's flag)")
    speed.add_argument("--amp", action="store_true", help="same as --precision amp")
    speed.add_argument("--amp-opt-level", type=int, default=0, help=argparse.SUPPRESS)  # the original's APEX flag
    speed.add_argument("--nhwc", "--channels-last", dest="channels_last", action="store_true",
                       help="channels-last memory layout for weights and inputs")
    speed.add_argument("--bn-16bit", dest="batchnorm_fp32", action="store_false",
                       help="with fp16/bf16, store batch-norm layers in 16 bits too (by default they keep fp32 "
                            "weights and statistics, which cuDNN/MIOpen normalise fastest)")
    speed.add_argument("--compile", action="store_true", help="torch.compile the network")
    speed.add_argument("--compileContext", default=None, metavar="DICT",
                       help="torch.compile settings as a Python dict, e.g. \"{'mode': 'max-autotune'}\" "
                            f"(modes: {', '.join(COMPILE_MODES)}) or \"{{'options': {{'freezing': True}}}}\"; "
                            "implies --compile")
    speed.add_argument("--freeze", action="store_true",
                       help="inference only: Inductor freezing, the weights become constants and each batch norm is "
                            "folded into its convolution; implies --compile")
    speed.add_argument("--cuda-graphs", action="store_true",
                       help="replay the compiled step as one CUDA graph (a GPU only); implies --compile")
    speed.add_argument("--max-autotune", action="store_true",
                       help="Inductor times alternative kernels for matrix products and its generated kernels, "
                            "convolutions stay cuDNN/MIOpen calls; implies --compile (compiles for minutes)")
    speed.add_argument("--no-check", dest="check", action="store_false",
                       help="time even when the outputs differ from fp32 eager by more than the tolerance")

    prof = parser.add_argument_group("profilers")
    prof.add_argument("--kineto", action="store_true",
                      help="write a PyTorch profiler trace (wait 1, warm-up 2, record 2 iterations) for "
                           "Perfetto / chrome://tracing into --output-dir")
    prof.add_argument("--autograd-profiler", "--autograd_profiler", dest="autograd_profiler", action="store_true",
                      help="print the operator table; mark iterations and phases with NVTX/ROCTX ranges")
    prof.add_argument("--flops-prof-step", type=int, default=None, metavar="N",
                      help="run DeepSpeed's FLOPS profiler at timed iteration N (0-based, N < --iterations)")

    sweeps = parser.add_argument_group("sweeps (one process)")
    sweeps.add_argument("--sweep", default=None, metavar="B1,B2,...",
                        help="run each batch size; out-of-memory sizes are reported and skipped")
    sweeps.add_argument("--max-batch", action="store_true",
                        help="find the largest batch that fits in device memory (doubling from --batch-size, "
                             "then bisecting) and benchmark it")
    sweeps.add_argument("--max-batch-limit", type=int, default=8192, help="stop the search here (default 8192)")
    sweeps.add_argument("--memory-budget-gib", type=float, default=None,
                        help="with --max-batch: search as if the device had only this much memory (GiB); "
                             "default: the whole device")

    out = parser.add_argument_group("results")
    out.add_argument("--output-dir", default=".",
                     help="where traces and relative --csv-file/--json paths go (default: the current directory)")
    out.add_argument("--csv-file", default=None, help="append the results as rows to this CSV file")
    out.add_argument("--json", default=None, metavar="FILE",
                     help="append the results to this JSON list file; '-' prints them as JSON instead")
    out.add_argument("--quiet", action="store_true", help="no progress bars")

    multi = parser.add_argument_group("several GPUs (torchrun sets these itself)")
    multi.add_argument("--distributed_dataparallel", action="store_true",
                       help="join a process group started by hand: needs --rank, --world-size and --dist-url")
    multi.add_argument("--device_ids", default=None, help="comma-separated GPU indices, one per local process")
    multi.add_argument("--rank", type=int, default=None, help="this process's rank (by hand)")
    multi.add_argument("--world-size", type=int, default=None, help="number of processes (by hand)")
    multi.add_argument("--dist-backend", choices=("nccl", "gloo"), default=None,
                       help="nccl on GPUs (RCCL on AMD), gloo on the CPU (default: chosen by device)")
    multi.add_argument("--dist-url", default=None, help="rendezvous address, e.g. tcp://127.0.0.1:29500 (by hand)")
    multi.add_argument("--baseline-throughput", type=float, default=None, metavar="SAMPLES_PER_S",
                       help="throughput of a 1-GPU run at the per-GPU batch: rank 0 reports scaling efficiency")
    multi.add_argument("--straggler-ms", type=float, default=0.0, metavar="MS",
                       help="a straggler made on purpose: delay one rank's work by MS milliseconds every iteration "
                            "(a GPU sleep kernel; a host sleep on the CPU); default 0, no delay")
    multi.add_argument("--straggler-rank", type=int, default=None, metavar="R",
                       help="the rank --straggler-ms delays (default: the last rank)")
    return parser


def _precision(args: argparse.Namespace) -> str:
    chosen = {name for flag, name in ((args.fp16, "fp16"), (args.amp or args.amp_opt_level, "amp")) if flag}
    if args.precision:
        chosen.add(args.precision)
    if len(chosen) > 1:
        raise ConfigError(f"conflicting precisions: {', '.join(sorted(chosen))}; give one")
    if args.fp16 not in (0, 1):
        raise ConfigError(f"--fp16 takes 0 or 1 (got {args.fp16})")
    return chosen.pop() if chosen else "fp32"


def config_from_args(args: argparse.Namespace) -> BenchmarkConfig:
    """The :class:`BenchmarkConfig` the parsed flags describe (validated)."""
    if not args.network:
        raise ConfigError("--network is required (python -m inference --list shows the networks)")
    compile_options = parse_compile_context(args.compileContext)
    levers = {"freeze": args.freeze, "cuda_graphs": args.cuda_graphs, "max_autotune": args.max_autotune}
    config = BenchmarkConfig(
        network=args.network, batch_size=args.batch_size, iterations=args.iterations, warmup=args.warmup,
        mode=args.mode, precision=_precision(args), channels_last=args.channels_last,
        batchnorm_fp32=args.batchnorm_fp32,
        compile=args.compile or args.compileContext is not None or any(levers.values()),
        compile_options=compile_options or None, **levers,
        input_size=args.input_size, device=args.device, seed=args.seed, check=args.check, kineto=args.kineto,
        autograd_profiler=args.autograd_profiler, flops_prof_step=args.flops_prof_step,
        output_dir=args.output_dir, baseline_throughput=args.baseline_throughput, progress=not args.quiet,
        straggler_ms=args.straggler_ms, straggler_rank=args.straggler_rank,
    )
    networks.get_spec(config.network)  # unknown names fail here, with the closest ones
    config.validate()
    if args.sweep and args.max_batch:
        raise ConfigError("use --sweep or --max-batch, not both")
    return config


def _device_ids(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(f"--device_ids takes GPU indices separated by commas, e.g. 0,1 (got {text!r})") from None


def print_networks() -> None:
    """The --list output: every network, grouped by task, with its input size."""
    for task in networks.TASKS:
        specs = networks.list_networks(task)
        print(f"{task} ({len(specs)} networks, input size in pixels):")
        for spec in specs:
            print(f"  {spec.name:<40} {spec.input_size}")


def header(config: BenchmarkConfig) -> str:
    """The run's first line: the network and the mode that runs, with what that mode times; when the
    mode is not the original micro-benchmark's default, a second line says how to reproduce that."""
    line = f"{config.network}: mode {config.mode} ({MODE_WORK[config.mode]}), {config.precision}"
    if config.mode == ORIGINAL_DEFAULT_MODE:
        return line + ", the original micro_benchmarking_pytorch.py's default mode"
    return (line + f"\nnote: the original micro_benchmarking_pytorch.py runs {ORIGINAL_DEFAULT_MODE} by default; "
            f"add --mode {ORIGINAL_DEFAULT_MODE} to reproduce its figures")


def _write_results(records: list[dict], args: argparse.Namespace) -> None:
    if args.csv_file:
        path = append_csv(resolve(args.csv_file, args.output_dir), records)
        print(f"results appended to {path}")
    if args.json == "-":
        print(json.dumps(records, indent=2, default=str))
    elif args.json:
        path = append_json(resolve(args.json, args.output_dir), records)
        print(f"results appended to {path}")


def _report(result: BenchmarkResult, ctx: distributed.DistContext) -> list[BenchmarkResult]:
    """Rank 0 prints every rank's report in rank order; returns all ranks' results on rank 0."""
    everyone = distributed.gather(result, ctx)
    if not ctx.is_main:
        return []
    for each in everyone:
        print(each.summary())
        if each.operator_table:
            print(f"operator table (rank {each.rank}):\n{each.operator_table}")
        if each.flops_profile:
            print(each.flops_profile.text)
    if result.global_summary():
        print(result.global_summary())
    return everyone


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list:
        print_networks()
        return 0
    try:
        config = config_from_args(args)
        if config.flops_prof_step is not None:
            profilers.require_deepspeed()
        device_ids = _device_ids(args.device_ids)
    except ConfigError as error:
        parser.error(str(error))  # exits 2 with the usage line
    except BenchmarkError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1

    ctx = distributed.DistContext()
    try:
        ctx, device = distributed.setup(
            distributed_dataparallel=args.distributed_dataparallel, rank=args.rank, world_size=args.world_size,
            dist_backend=args.dist_backend, dist_url=args.dist_url, device_ids=device_ids, device=args.device)
        config = config.replace(device=str(device), progress=config.progress and ctx.is_main)
        if (args.sweep or args.max_batch) and ctx.distributed:
            raise ConfigError("--sweep and --max-batch run in one process: start them without torchrun")
        if ctx.is_main:
            print(header(config), flush=True)
        if args.sweep:
            swept = sweep.sweep_batch_sizes(config, sweep.parse_batch_sizes(args.sweep))
            print(swept.table())
            records = [r.as_record() for r in swept.results]
        elif args.max_batch:
            budget = None if args.memory_budget_gib is None else int(args.memory_budget_gib * 2**30)
            found = sweep.find_max_batch_size(config, limit=args.max_batch_limit, memory_budget_bytes=budget)
            print(found.describe())
            if found.result is not None:
                print(found.result.summary())
            records = [found.result.as_record()] if found.result is not None else []
        else:
            results = _report(run_benchmark(config), ctx)
            records = [r.as_record() for r in results]
        if ctx.is_main and records:
            _write_results(records, args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except BenchmarkError as error:
        print(f"error{f' (rank {ctx.rank})' if ctx.distributed else ''}: {error}", file=sys.stderr)
        return 1
    finally:
        distributed.teardown()
    return 0
