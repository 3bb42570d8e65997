"""Text generation on the command line: check, then time prefill and decode apart.

    python -m tinyllama.harness.generate --preset ci --version v3 --batch-size 2 --prompt-len 20 --new-tokens 12 --check
    python -m tinyllama.harness.generate --preset medium --version v2 --precision bf16 --compile --cuda-graphs --check

prints the prefill time, decode ms per token (median and p10-p90), tokens/s, the bytes a decode step must
move, the bandwidth achieved and its share of the measured copy bandwidth; ``--json`` appends the record.
A bad setting prints one line and exits with status 2. The library is ``tinyllama.generation``; its
main names are importable from here too (``from tinyllama.harness.generate import generate, decode_bytes``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from tinyllama import device as dev
from tinyllama.config import BenchmarkError
from tinyllama.correctness import CorrectnessError
from tinyllama.generation import (
    CachedDecoder,
    GenerationCheck,
    GenerationResult,
    KVCache,
    Recompute,
    Sampling,
    check_generation,
    decode_bytes,
    decode_flops,
    generate,
    run_generation_benchmark,
)
from tinyllama.harness.cli import add_problem_size_arguments, add_run_arguments, shape_overrides
from tinyllama.models import VERSIONS

__all__ = ["CachedDecoder", "GenerationCheck", "GenerationResult", "KVCache", "Recompute", "Sampling", "build_parser",
           "check_generation", "decode_bytes", "decode_flops", "generate", "main", "run_generation_benchmark"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tinyllama.harness.generate",
        description="Time TinyLLaMA text generation: prefill and decode apart, bandwidth of a decode step.",
    )
    parser.add_argument("--version", default="v1", help=f"model version ({', '.join(VERSIONS)})")
    add_problem_size_arguments(parser)
    parser.add_argument("--prompt-len", dest="seq_len", type=int,
                        help="prompt tokens per sequence, the same as --seq-len (default: the preset's seq_len)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens to generate per sequence (default 32)")
    parser.add_argument("--precision", default="fp32", help="fp32 or bf16: the weights' and the cache's dtype")
    parser.add_argument("--compile", action="store_true", help="torch.compile the static decode step")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="capture one decode step in a CUDA/HIP graph and replay it (GPU only)")
    parser.add_argument("--no-cache", action="store_true",
                        help="no KV cache: recompute the whole sequence for every token (the reference)")
    parser.add_argument("--check", action="store_true",
                        help="first compare greedy tokens and logits with the fp32 no-cache reference; refuse to "
                             "time if they differ")
    # A "step" of this harness is a whole generation (prefill and every decode step), timed as a unit.
    add_run_arguments(parser, per=" (whole generations)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (2 with one line on stderr for what to fix)."""
    args = build_parser().parse_args(argv)
    if args.version == "v3" and (args.device or dev.backend()) == "cpu" and not args.quiet:
        print("note: on the CPU, V3's Triton kernels run in Triton's interpreter: slow, and no guide to a GPU's "
              "times", file=sys.stderr)
    try:
        result = run_generation_benchmark(
            args.version, args.preset, batch_size=args.batch_size, prompt_len=args.seq_len, new_tokens=args.new_tokens,
            precision=args.precision, use_cache=not args.no_cache, compile=args.compile,
            cuda_graph=args.cuda_graphs, check=args.check, warmup=args.warmup_steps, repeat=args.num_steps,
            seed=args.seed, device=args.device, progress=not args.quiet, **shape_overrides(args))
    except (ValueError, BenchmarkError, CorrectnessError, dev.DeviceUnavailable) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(result.summary())
    if args.json:
        from tinyllama.harness.records import append_json

        print(f"  appended to {append_json(args.json, [result.to_dict()])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
