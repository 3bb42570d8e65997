"""What the TinyLLaMA command lines (``tinyllama.harness.bench``, ``tinyllama.harness.distributed``,
``tinyllama.harness.compare``, ``tinyllama.harness.kernel_bench``) share: the problem-size, model and run
flags, ``KEY=VALUE`` switches, progress bars and messages, and wide pandas tables."""

from __future__ import annotations

import argparse
import contextlib
from typing import Any, Iterable, Iterator, TypeVar

T = TypeVar("T")

_SHAPE_FLAGS = ("hidden_dim", "num_layers", "num_heads", "num_kv_heads", "intermediate_dim")


def add_problem_size_arguments(parser: argparse.ArgumentParser) -> None:
    """The preset and the original workshop's shape flags, shared by every TinyLLaMA command line."""
    parser.add_argument("--preset", default="tiny", help="problem size: ci, tiny, small, medium, large (default tiny)")
    parser.add_argument("--batch-size", type=int, help="sequences per step (default: the preset's)")
    parser.add_argument("--seq-len", type=int, help="tokens per sequence (default: the preset's)")
    parser.add_argument("--hidden-dim", type=int, help="model width (default: the preset's)")
    parser.add_argument("--num-layers", type=int, help="decoder layers (default: the preset's)")
    parser.add_argument("--num-heads", type=int, help="query heads (default: the preset's)")
    parser.add_argument("--num-kv-heads", type=int, help="key/value heads (default: the preset's)")
    parser.add_argument("--intermediate-dim", type=int, help="feed-forward width (default: the preset's)")


def add_model_arguments(parser: argparse.ArgumentParser, versions: Iterable[str]) -> None:
    """The model version, its precision and its ``KEY=VALUE`` switches (``--option``), shared by the
    training harnesses' command lines (``bench``, ``distributed``)."""
    parser.add_argument("--version", default="v1", help=f"model version ({', '.join(versions)})")
    parser.add_argument("--precision", default="fp32", help="fp32, tf32, bf16 or fp16 (fp16 uses a gradient scaler)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a switch of the version, e.g. --option sdpa=1 or --option fuse_qkv=0 (repeatable)")


def add_run_arguments(parser: argparse.ArgumentParser, per: str = "", result: str = "result") -> None:
    """Steps, seed, device, the JSON file and quiet, shared by the TinyLLaMA harnesses' command lines
    (``per``: e.g. " per run"; ``result``: what ``--json`` appends)."""
    parser.add_argument("--num-steps", type=int, default=20, help=f"timed steps{per} (default 20)")
    parser.add_argument("--warmup-steps", type=int, default=3, help=f"untimed warm-up steps{per} (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: the GPU if there is one)")
    parser.add_argument("--json", metavar="PATH", help=f"append the {result} to this JSON list file")
    parser.add_argument("--quiet", action="store_true", help="no progress output")


def shape_overrides(args: argparse.Namespace) -> dict[str, int | None]:
    """The model-shape flags of ``add_problem_size_arguments``, as ``make_config`` overrides."""
    return {name: vars(args)[name] for name in _SHAPE_FLAGS}


def parse_option(text: str) -> tuple[str, Any]:
    """``key=value`` with value read as int, float, bool or string."""
    if "=" not in text:
        raise ValueError(f"--option {text!r} is not KEY=VALUE")
    key, raw = text.split("=", 1)
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return key, lowered == "true"
    for cast in (int, float):
        try:
            return key, cast(raw)
        except ValueError:
            pass
    return key, raw


def progress_bar(items: Iterable[T], desc: str | None) -> Iterable[T]:
    """``items`` with a progress bar named ``desc``; without one where ``desc`` is ``None``."""
    if desc is None:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, leave=False)


def say(message: str, enabled: bool = True) -> None:
    """A progress message, printed at once (runs take minutes), unless ``enabled`` is false."""
    if enabled:
        print(message, flush=True)


@contextlib.contextmanager
def wide_tables() -> Iterator[None]:
    """Show every column of a wide pandas table when printing it."""
    import pandas as pd

    with pd.option_context("display.width", 250, "display.max_columns", 50):
        yield
