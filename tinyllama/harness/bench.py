"""The training benchmark: one honest measurement of a TinyLLaMA training step.

    python -m tinyllama.harness.bench --version v1 --preset medium --precision bf16 --num-steps 20
    python -m tinyllama.harness.bench --preset small --data text --workers 2 --batch-size 4 --accumulation-steps 4

What it does, in order:
1. builds the model and a few fixed batches of random tokens (the original's synthetic data), or takes
   its batches from a data loader (``loader=``, e.g. ``tinyllama.data``'s real text);
2. checks that one training step gives every parameter a gradient (else it refuses to time);
3. runs warm-up steps (compilation, autotuning, allocator growth) and reports them apart;
4. times the wait for data, forward, backward and optimizer of each step with device events, over
   ``accumulation_steps`` micro-batches per optimizer step (gradient accumulation);
5. reports median and spread, tokens/s, peak memory, the loss curve, FLOPs and MFU.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Iterator, Mapping, NamedTuple, Sequence

import torch
from torch import nn

from tinyllama import device as dev
from tinyllama.config import BenchmarkError, check_precision, resolve_config
from tinyllama.correctness import CorrectnessError, check_every_parameter_trained
from tinyllama.costs import flops as model_flops
from tinyllama.harness.cli import (
    add_model_arguments,
    add_problem_size_arguments,
    add_run_arguments,
    parse_option,
    progress_bar,
    shape_overrides,
)
from tinyllama.models import VERSIONS, build
from tinyllama.models.weights import unwrap
from tinyllama.timing import PhaseTimer, Stats, summarize, time_in_turns

# The training step lives in tinyllama.training; these names stay importable from here.
from tinyllama.training import (
    DATA_PHASES,
    GraphedTrainingStep,
    TrainingStep,
    check_cuda_graph,
    configure_determinism,
    make_batches,
    replays_step,
)

__all__ = ["BenchResult", "BenchmarkError", "GraphedTrainingStep", "NoRoomForTurns", "TrainingStep", "TurnRun", "main",
           "make_batches", "time_steps_in_turns",
           "run_benchmark"]


# ------------------------------------------------------------------------------------------------
# The result record
# ------------------------------------------------------------------------------------------------


@dataclass
class BenchResult:
    """Everything one benchmark run measured. ``to_dict()`` gives one flat pandas row."""

    version: str
    preset: str
    precision: str
    device: str
    backend: str
    batch_size: int
    seq_len: int
    config: dict[str, Any]
    num_parameters: int
    num_steps: int
    warmup_steps: int
    step_ms: Stats
    forward_ms: Stats
    backward_ms: Stats
    optimizer_ms: Stats
    warmup_ms: list[float]
    losses: list[float]
    tokens_per_s: float
    samples_per_s: float
    peak_memory_mib: float | None
    flops_per_step: int
    flops_per_step_counted: int
    achieved_tflops: float
    peak_tflops: float | None
    mfu: float | None
    determinism: dict[str, object]
    model_options: dict[str, Any] = field(default_factory=dict)
    cuda_graph: bool = False
    # The wait for each step's micro-batches (from a data loader: its workers' lag; from fixed batches
    # next to nothing), part of step_ms. None only in records made before it was measured.
    data_ms: Stats | None = None
    accumulation_steps: int = 1  # micro-batches per optimizer step: the effective batch is batch_size x this
    gradient_checkpointing: bool = False  # every block recomputed in the backward
    data_source: str = "random tokens"
    torch_version: str = torch.__version__
    timestamp: str = field(default_factory=lambda: _dt.datetime.now().isoformat(timespec="seconds"))

    def to_dict(self) -> dict[str, Any]:
        """A flat dict: timing statistics become ``step_ms_median``, ``forward_ms_p90`` and so on."""
        out: dict[str, Any] = {}
        for key, value in asdict(self).items():
            stats = getattr(self, key)
            if isinstance(stats, Stats):
                out.update(stats.as_dict(prefix=f"{key}_"))
            elif key == "config":
                out.update({f"config_{k}": v for k, v in value.items()})
            else:
                out[key] = value
        return out

    def to_frame(self) -> Any:
        """A one-row pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame([self.to_dict()])

    def summary(self) -> str:
        """A few human-readable lines."""
        mfu = "n/a (no datasheet peak for this device)" if self.mfu is None else f"{100 * self.mfu:.1f}%"
        memory = "n/a on the CPU" if self.peak_memory_mib is None else f"{self.peak_memory_mib:,.0f} MiB"
        s, f, b, o = self.step_ms, self.forward_ms, self.backward_ms, self.optimizer_ms
        data = "" if self.data_ms is None else f"data {self.data_ms.median:.2f} ms | "
        accumulation = (f" x {self.accumulation_steps} micro-batches (effective batch "
                        f"{self.batch_size * self.accumulation_steps})" if self.accumulation_steps > 1 else "")
        return "\n".join([
            f"TinyLLaMA {self.version} | {self.preset} | {self.precision}{' | CUDA graphs' if self.cuda_graph else ''}"
            f"{' | checkpointing' if self.gradient_checkpointing else ''} | {self.device}",
            f"  batch {self.batch_size} x seq {self.seq_len}{accumulation}, {self.num_parameters / 1e6:.1f}M parameters,"
            f" data: {self.data_source}",
            f"  warm-up: {', '.join(f'{w:.1f}' for w in self.warmup_ms)} ms",
            f"  step: {s.median:.2f} ms median (p10 {s.p10:.2f}, p90 {s.p90:.2f}, n={s.n})",
            f"  {data}forward {f.median:.2f} ms | backward {b.median:.2f} ms | optimizer {o.median:.2f} ms",
            f"  {self.tokens_per_s:,.0f} tokens/s, {self.samples_per_s:,.1f} samples/s, peak memory {memory}",
            f"  {_si(self.flops_per_step)}FLOP/step -> {_si(self.achieved_tflops * 1e12)}FLOP/s, MFU {mfu}",
            f"  loss {self.losses[0]:.4f} -> {self.losses[-1]:.4f}",
        ])


# ------------------------------------------------------------------------------------------------
# The benchmark
# ------------------------------------------------------------------------------------------------


def _si(value: float) -> str:
    """1.2e12 -> '1.20 T' (for FLOP counts that span from the CPU preset to the large one)."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.2f} {prefix}"
    return f"{value:.0f} "


def run_benchmark(
    version: str = "v1",
    preset: str = "tiny",
    *,
    batch_size: int | None = None,
    seq_len: int | None = None,
    precision: str = "fp32",
    num_steps: int = 20,
    warmup_steps: int = 3,
    seed: int = 0,
    deterministic: bool = False,
    device: torch.device | str | None = None,
    model_options: dict[str, Any] | None = None,
    model: nn.Module | None = None,
    batches: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    progress: bool = True,
    cuda_graph: bool | None = None,
    loader: Iterable[tuple[torch.Tensor, torch.Tensor]] | None = None,
    accumulation_steps: int = 1,
    gradient_checkpointing: bool = False,
    lr: float = 3e-4,
    **config_overrides: Any,
) -> BenchResult:
    """Build (or take) a model, check that it trains, and time ``num_steps`` training steps.

    ``cuda_graph=True`` replays each step from CUDA (HIP) graphs after the warm-up steps
    (``GraphedTrainingStep``): the step's GPU time without Python's launch overhead; ``False`` launches
    every kernel from Python; ``None`` (the default) takes the model's own setting where a replay is
    possible (``training.replays_step``: V4 on a GPU replays, every other version runs eagerly). ``loader``: the
    batch source, any iterable of ``(inputs, targets)`` on the CPU or the device (a ``DataLoader`` of
    ``tinyllama.data``), run through again when it ends; its batch shape must be ``batch_size`` x
    ``seq_len``. ``accumulation_steps`` micro-batches make one optimizer step (gradient
    accumulation). ``gradient_checkpointing`` recomputes every block in the backward. See the module
    docstring. Raises ``ValueError`` for bad settings, ``CorrectnessError`` for a model whose backward
    misses parameters, and ``BenchmarkError`` when the device runs out of memory.
    """
    check_precision(precision)
    if num_steps < 1 or warmup_steps < 0:
        raise ValueError(f"need num_steps >= 1 and warmup_steps >= 0 (got {num_steps}, {warmup_steps})")
    if accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be at least 1 (got {accumulation_steps})")
    if cuda_graph and accumulation_steps > 1:
        raise ValueError("cuda_graph replays one whole step per batch: use accumulation_steps=1 with it")
    if model is None and version not in VERSIONS:
        raise ValueError(f"unknown version {version!r}: choose one of {', '.join(VERSIONS)}")
    config, batch_size, seq_len = resolve_config(preset, batch_size, seq_len, **config_overrides)
    device = dev.get_device(None if device is None else str(device))
    if cuda_graph:
        check_cuda_graph(device, warmup_steps)
    determinism = configure_determinism(seed, deterministic)
    model_options = dict(model_options or {})
    try:
        if model is None:
            model = build(version, config, **model_options)
        model = model.to(device).train()
        if gradient_checkpointing:
            unwrap(model).set_gradient_checkpointing(True)
        if cuda_graph is None:
            cuda_graph = replays_step(model, device, precision, accumulation_steps=accumulation_steps,
                                      gradient_checkpointing=gradient_checkpointing, warmup_steps=warmup_steps)
        if loader is not None:
            source = endless(loader)
            first = next(source)
            if tuple(first[0].shape) != (batch_size, seq_len):
                raise ValueError(f"the loader gives batches of shape {tuple(first[0].shape)}, the run expects "
                                 f"batch_size x seq_len = ({batch_size}, {seq_len}): pass the loader's sizes")
            source = itertools.chain([first], source)  # the check below reads it; training starts with it
            inputs, targets = first[0].to(device), first[1].to(device)
        else:
            if batches is None:
                batches = make_batches(config, batch_size, seq_len, count=4, seed=seed, device=device)
            source = itertools.cycle(batches)
            inputs, targets = batches[0]
        step = (GraphedTrainingStep if cuda_graph else TrainingStep)(model, precision, device, lr=lr)
        # Correct first: a model whose backward does not reach every parameter is not timed.
        check_every_parameter_trained(model, lambda: step.loss(inputs, targets))
        warmup_ms, phase_ms, losses = _time_steps(step, source, accumulation_steps, warmup_steps, num_steps,
                                                  f"{version} {precision}" if progress else None)
    except Exception as error:  # noqa: BLE001 - only out-of-memory is translated, the rest re-raised
        if not dev.is_out_of_memory(error):
            raise
        dev.free_memory(device)
        raise BenchmarkError(
            f"out of memory on {dev.device_name(device)} at batch {batch_size} x seq {seq_len} "
            f"({version}, {precision}): try a smaller batch (--batch-size {max(1, batch_size // 2)}) "
            f"or sequence (--seq-len {max(1, seq_len // 2)}), or a lower precision"
        ) from None

    step_stats = summarize([sum(parts) for parts in zip(*(phase_ms[p] for p in DATA_PHASES))])
    step_s = step_stats.median / 1e3
    tokens = batch_size * seq_len * accumulation_steps
    flops = model_flops.training_flops(config, batch_size, seq_len) * accumulation_steps
    peaks = dev.device_peaks(device)
    peak_tflops = peaks.tflops(precision) if peaks else None
    achieved = flops / step_s / 1e12
    return BenchResult(
        version=version, preset=preset, precision=precision, device=dev.device_name(device),
        backend=dev.backend() if device.type == "cuda" else "cpu", batch_size=batch_size, seq_len=seq_len,
        config=config.to_dict(), num_parameters=sum(p.numel() for p in model.parameters()),
        num_steps=num_steps, warmup_steps=warmup_steps, step_ms=step_stats,
        forward_ms=summarize(phase_ms["forward"]), backward_ms=summarize(phase_ms["backward"]),
        optimizer_ms=summarize(phase_ms["optimizer"]), warmup_ms=warmup_ms, losses=losses,
        tokens_per_s=tokens / step_s, samples_per_s=batch_size * accumulation_steps / step_s,
        peak_memory_mib=dev.memory_stats(device).peak_mib, flops_per_step=flops,
        flops_per_step_counted=model_flops.counted_training_flops(config, batch_size, seq_len) * accumulation_steps,
        achieved_tflops=achieved, peak_tflops=peak_tflops,
        mfu=achieved / peak_tflops if peak_tflops else None, determinism=determinism,
        model_options=model_options, cuda_graph=cuda_graph, data_ms=summarize(phase_ms["data"]),
        accumulation_steps=accumulation_steps, gradient_checkpointing=bool(getattr(unwrap(model), "checkpointed_layers", ())),
        data_source="fixed random batches" if loader is None else type(loader).__name__,
    )


class TurnRun(NamedTuple):
    """One run of :func:`time_steps_in_turns`: a model with its weights, the precision of its steps, whether
    they are replayed from CUDA graphs, and (where known) its peak memory timed alone, in MiB."""

    model: nn.Module
    precision: str
    cuda_graph: bool = False
    peak_memory_mib: float | None = None


class NoRoomForTurns(BenchmarkError):
    """The runs do not fit on the device at once: time them one after the other instead."""


# Runs are timed in turns only where all of them, and the largest step's rise above them, stay under this
# share of the device's memory: the rest is the allocator's and the compiler's margin.
TURNS_MEMORY_SHARE = 0.9


def time_steps_in_turns(runs: Mapping[str, TurnRun], batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                        device: torch.device | str | None = None, *, rounds: int = 10, per_turn: int = 2,
                        warmup_steps: int = 3, lr: float = 3e-4) -> dict[str, Stats]:
    """The training-step times of several models, timed in turns (:func:`tinyllama.timing.time_in_turns`):
    each run gets its own training step (replayed from CUDA graphs where asked) and ``warmup_steps`` steps
    (compilation, capture, the allocator's growth), then each of ``rounds`` rounds gives every run
    ``per_turn`` steps on ``batches``, in an order that rotates. Whatever the host does meanwhile falls on all
    runs alike, so their ratios do not follow its drift, as those of runs timed minutes apart do.

    Every run lives on the device at once. A run is added only where the memory already held plus its
    ``peak_memory_mib`` fits, and the turns start only where all runs plus the largest rise of one step above
    its memory between steps fit (under :data:`TURNS_MEMORY_SHARE` of the device); else, or where the device
    runs out of memory anyway, :class:`NoRoomForTurns` says why, with the device's memory given back. Models
    already on the device count in the memory held from the start, so the rule errs on the safe side."""
    if rounds < 1 or per_turn < 1:
        raise ValueError(f"rounds and per_turn must be at least 1 (got {rounds}, {per_turn})")
    device = dev.get_device(None if device is None else str(device))
    if any(run.cuda_graph for run in runs.values()):
        check_cuda_graph(device, warmup_steps)
    total = dev.memory_stats(device).total_bytes
    limit = None if total is None else TURNS_MEMORY_SHARE * total
    calls: dict[str, Any] = {}
    rises = [0.0]
    try:
        for label, run in runs.items():
            held = dev.memory_stats(device).current_bytes
            peak = (run.peak_memory_mib or 0.0) * 2**20
            if limit is not None and held + peak > limit:
                raise NoRoomForTurns(f"{label} needs up to {peak / 2**30:.1f} GiB beside the {held / 2**30:.1f} GiB "
                                     f"the runs before it hold, on {dev.device_name(device)}")
            step = (GraphedTrainingStep if run.cuda_graph else TrainingStep)(run.model.train(), run.precision, device,
                                                                            lr=lr)
            source = itertools.cycle(batches)
            for _ in range(warmup_steps):
                step.accumulate(source, 1)
            dev.synchronize(device)
            if held is not None:
                rises.append(peak - (dev.memory_stats(device).current_bytes - held))
            calls[label] = (lambda step=step, source=source: step.accumulate(source, 1))
        if limit is not None and dev.memory_stats(device).current_bytes + max(rises) > limit:
            raise NoRoomForTurns(f"the largest step does not fit beside every run's memory on {dev.device_name(device)}")
        samples = time_in_turns(calls, device, rounds=rounds, per_turn=per_turn, warmup=0)
    except Exception as error:  # noqa: BLE001 - running out of memory becomes NoRoomForTurns, the rest re-raised
        if not dev.is_out_of_memory(error):
            raise
        raise NoRoomForTurns(f"out of memory with every run on {dev.device_name(device)} at once") from None
    finally:
        calls.clear()
        dev.free_memory(device)
    return {label: summarize(ms) for label, ms in samples.items()}


def endless(loader: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The loader's batches, epoch after epoch (a DataLoader reshuffles at each new pass)."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("the loader gave no batch: a dataset smaller than one batch? (drop_last drops it)")


def _time_steps(step: TrainingStep, source: Iterator[tuple[torch.Tensor, torch.Tensor]], accumulation_steps: int,
                warmup_steps: int, num_steps: int,
                progress: str | None) -> tuple[list[float], dict[str, list[float]], list[float]]:
    """Warm-up steps (each timed whole, host clock), then timed steps split into phases by a
    ``PhaseTimer``, each over ``accumulation_steps`` micro-batches from ``source``. Returns the warm-up
    ms, each phase's ms per step and every step's loss."""
    device = step.device
    dev.free_memory(device)
    dev.reset_peak_memory(device)
    losses: list[float] = []
    warmup_ms: list[float] = []
    for _ in progress_bar(range(warmup_steps), progress and f"{progress} warm-up"):
        dev.synchronize(device)
        began = time.perf_counter()
        losses.append(step.accumulate(source, accumulation_steps).item())
        dev.synchronize(device)
        warmup_ms.append((time.perf_counter() - began) * 1e3)
    timer = PhaseTimer(device)
    phase_ms: dict[str, list[float]] = {phase: [] for phase in DATA_PHASES}
    for _ in progress_bar(range(num_steps), progress):
        timer.start()
        loss = step.accumulate(source, accumulation_steps, timer=timer)
        for phase, ms in timer.stop().items():
            phase_ms[phase].append(ms)
        losses.append(loss.item())
    if not all(math.isfinite(x) for x in losses):
        raise CorrectnessError(f"the loss became {losses[-1]} during training: lower the learning rate or "
                               "use bf16 instead of fp16")
    return warmup_ms, phase_ms, losses


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tinyllama.harness.bench",
        description="Time TinyLLaMA training steps honestly: correctness check, warm-up, device events.",
    )
    add_model_arguments(parser, VERSIONS)
    add_problem_size_arguments(parser)
    add_run_arguments(parser)
    parser.add_argument("--deterministic", action="store_true",
                        help="deterministic algorithms and cuDNN/MIOpen settings (reports what it set)")
    parser.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                        help="replay each step from CUDA/HIP graphs after the warm-up (GPU only; not with "
                             "compile_mode reduce-overhead); --no-cuda-graph launches every kernel from Python. "
                             "Default: the version's own setting (V4 replays on a GPU, the others do not)")
    parser.add_argument("--data", choices=("random", "text"), default="random",
                        help="random tokens (default), or real text: the standard library's source, byte tokens "
                             "(vocabulary 256), through a DataLoader")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers with --data text (default 0)")
    parser.add_argument("--accumulation-steps", type=int, default=1,
                        help="micro-batches of --batch-size per optimizer step (gradient accumulation, default 1)")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="recompute every block in the backward instead of keeping its activations")
    return parser


def _text_loader(preset: str, batch_size: int | None, seq_len: int | None, workers: int, seed: int) -> tuple[Any, dict[str, Any]]:
    """A DataLoader of the standard library's source for ``--data text``, and the run's overrides
    (the byte vocabulary, and the batch and sequence the loader uses)."""
    from tinyllama.config import get_preset
    from tinyllama.data import ByteTokenizer, TokenWindows, build_corpus, make_loader

    chosen = get_preset(preset)
    batch_size = chosen.batch_size if batch_size is None else batch_size
    seq_len = chosen.seq_len if seq_len is None else seq_len
    corpus = build_corpus(max(2**20, 64 * batch_size * (seq_len + 1)), seed=seed)
    loader = make_loader(TokenWindows(corpus.train, seq_len), batch_size, num_workers=workers, seed=seed)
    return loader, {"batch_size": batch_size, "seq_len": seq_len, "vocab_size": ByteTokenizer.vocab_size}


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.device is None and not torch.cuda.is_available():
        print("note: no GPU found, running on the CPU (expect it to be slow; try --preset ci)", file=sys.stderr)
    try:
        options = dict(parse_option(o) for o in args.option)
        loader, data = None, {"batch_size": args.batch_size, "seq_len": args.seq_len}
        if args.data == "text":
            loader, data = _text_loader(args.preset, args.batch_size, args.seq_len, args.workers, args.seed)
        result = run_benchmark(
            args.version, args.preset, precision=args.precision, num_steps=args.num_steps,
            warmup_steps=args.warmup_steps, seed=args.seed, deterministic=args.deterministic, device=args.device,
            model_options=options, progress=not args.quiet, cuda_graph=args.cuda_graph, loader=loader,
            accumulation_steps=args.accumulation_steps, gradient_checkpointing=args.gradient_checkpointing,
            **data, **shape_overrides(args),
        )
    except (ValueError, BenchmarkError, CorrectnessError, dev.DeviceUnavailable) as error:
        # Includes BenchmarkError and CorrectnessError: one line, no traceback wall.
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(result.summary())
    if args.deterministic:
        print("  determinism: " + ", ".join(f"{k}={v}" for k, v in result.determinism.items()))
    if args.json:
        from tinyllama.harness.records import append_json

        print(f"  appended to {append_json(args.json, [result.to_dict()])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
