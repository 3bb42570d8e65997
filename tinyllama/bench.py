"""The training benchmark: one honest measurement of a TinyLLaMA training step.

    python -m tinyllama.bench --version v1 --preset medium --precision bf16 --num-steps 20

What it does, in order:
1. builds the model and a few fixed batches of random tokens (the original's synthetic data);
2. checks that one training step gives every parameter a gradient (else it refuses to time);
3. runs warm-up steps (compilation, autotuning, allocator growth) and reports them apart;
4. times forward, backward and optimizer of each step with device events;
5. reports median and spread, tokens/s, peak memory, the loss curve, FLOPs and MFU.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from tinyllama import device as dev
from tinyllama import flops as model_flops
from tinyllama.checks import CorrectnessError, check_every_parameter_trained
from tinyllama.config import ModelConfig, get_preset, make_config
from tinyllama.models import VERSIONS, build, lm_loss
from tinyllama.models.v2_fused import CUDA_GRAPH_MODES
from tinyllama.models.weights import unwrap
from tinyllama.timing import PhaseTimer, Stats, summarize

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
PHASES = ("forward", "backward", "optimizer")


class BenchmarkError(RuntimeError):
    """A benchmark that cannot run as asked; the message says what to change."""


# ------------------------------------------------------------------------------------------------
# Reproducibility and precision
# ------------------------------------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy (when installed) and PyTorch on every device."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass


def configure_determinism(seed: int, deterministic: bool) -> dict[str, object]:
    """Seed everything and, if ``deterministic``, ask every library for reproducible results.

    Returns what was set, so a run can report it. cuDNN's flags steer MIOpen on ROCm builds.
    """
    seed_everything(seed)
    settings: dict[str, object] = {"seed": seed, "deterministic": deterministic}
    if not deterministic:
        return settings
    # cuBLAS needs a fixed workspace to be deterministic; it must be set before its first use.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    # warn_only: operators without a deterministic implementation warn instead of failing.
    torch.use_deterministic_algorithms(True, warn_only=True)
    settings.update({
        "CUBLAS_WORKSPACE_CONFIG": os.environ["CUBLAS_WORKSPACE_CONFIG"],
        "cudnn.deterministic (MIOpen on ROCm)": True,
        "cudnn.benchmark": False,
        "use_deterministic_algorithms": "True (warn_only)",
    })
    return settings


def set_matmul_precision(precision: str) -> None:
    """fp32 means real fp32 (TF32 off); tf32 lets fp32 matmuls use TF32 tensor cores."""
    allow = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow


def autocast_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Mixed precision for bf16/fp16 (weights stay fp32); nothing for fp32/tf32."""
    if precision in ("bf16", "fp16"):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        return torch.autocast(device_type=device.type, dtype=dtype)
    return contextlib.nullcontext()


# ------------------------------------------------------------------------------------------------
# Data and the training step
# ------------------------------------------------------------------------------------------------


def make_batches(
    config: ModelConfig, batch_size: int, seq_len: int, count: int = 4, seed: int = 0,
    device: torch.device | str = "cpu",
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` batches of random token ids and their next-token targets (seeded, so every version
    sees the same data)."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        tokens = torch.randint(0, config.vocab_size, (batch_size, seq_len + 1), generator=generator)
        tokens = tokens.to(device)
        batches.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return batches


class TrainingStep:
    """Forward, loss, backward and an AdamW step, at the chosen precision.

    ``fused_optimizer=None`` uses the model's own preference (attribute ``fused_optimizer``), and
    only on a GPU, where PyTorch has the fused kernel.
    """

    def __init__(
        self, model: nn.Module, precision: str = "fp32", device: torch.device | str | None = None,
        lr: float = 3e-4, fused_optimizer: bool | None = None, capturable: bool = False,
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
        self.model = model
        self.precision = precision
        self.device = torch.device(device) if device is not None else dev.get_device()
        if fused_optimizer is None:
            fused_optimizer = bool(getattr(model, "fused_optimizer", False))
        self.fused_optimizer = fused_optimizer and self.device.type == "cuda"
        options: dict[str, bool] = {"fused": True} if self.fused_optimizer else {}
        if capturable:  # the step count lives on the device, so that a CUDA graph can replay the update
            options["capturable"] = True
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, **options)
        # fp16's narrow range underflows small gradients: scale the loss up, unscale before the step.
        self.scaler = torch.amp.GradScaler(self.device.type) if precision == "fp16" else None

    def loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss of one forward pass (no backward)."""
        with autocast_context(self.precision, self.device):
            logits = self.model(inputs)
        return lm_loss(logits, targets)

    def __call__(
        self, inputs: torch.Tensor, targets: torch.Tensor, timer: PhaseTimer | None = None
    ) -> torch.Tensor:
        """One training step; returns the (detached) loss. Marks the timer's phases if given."""
        set_matmul_precision(self.precision)
        with dev.annotate("forward"):
            loss = self.loss(inputs, targets)
        if timer:
            timer.mark("forward")
        with dev.annotate("backward"):
            (self.scaler.scale(loss) if self.scaler else loss).backward()
        if timer:
            timer.mark("backward")
        with dev.annotate("optimizer"):
            if self.scaler:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        if timer:
            timer.mark("optimizer")
        return loss.detach()


def _captures_own_graphs(model: nn.Module) -> bool:
    """Whether ``model`` is compiled in a mode that replays CUDA graphs of its own (reduce-overhead,
    max-autotune): graphs that cannot be captured again inside another graph."""
    switches = getattr(unwrap(model), "switches", None)
    return bool(switches is not None and switches.compile and switches.compile_mode in CUDA_GRAPH_MODES)


def check_cuda_graph(device: torch.device, warmup_steps: int | None = None) -> None:
    """Raise ``ValueError`` where steps cannot be replayed from CUDA graphs: fewer warm-up steps than
    ``GraphedTrainingStep`` runs eagerly before it captures, or no GPU."""
    if warmup_steps is not None and warmup_steps < GraphedTrainingStep.EAGER_STEPS:
        raise ValueError(f"cuda_graph captures after {GraphedTrainingStep.EAGER_STEPS} eager steps: "
                         f"use warmup_steps >= {GraphedTrainingStep.EAGER_STEPS}")
    if device.type != "cuda":
        raise ValueError("cuda_graph needs a GPU (CUDA or ROCm); on the CPU run without it")


class GraphedTrainingStep(TrainingStep):
    """``TrainingStep`` replayed from CUDA (HIP) graphs: after a few eager steps, the forward, the
    backward and the optimizer step are each captured once, and every later call copies the batch
    into the captured input buffers and replays the three graphs. The GPU then runs the step's
    kernels back to back, with none of Python's per-kernel launch cost (about 30-50 microseconds for
    a Triton kernel; V3 launches about 170 per step).

    The whole step is captured, optimizer included, so gradients never outlive a step: the known
    hazard of graphed backwards, gradient accumulation into buffers a replay overwrites, cannot
    arise. Three graphs instead of one keep the forward / backward / optimizer split of the timing.
    A compiled model (V4) is captured too: after the eager steps its kernels are compiled, and
    Inductor's kernels are ordinary launches a graph records. Then the optimizer and the gaps
    between the compiled blocks are replayed as well, which ``compile_mode="reduce-overhead"`` (one
    graph per block, forward and backward) leaves to Python.
    Requirements: a GPU, fixed batch shapes, no host synchronisation inside the step, a model not
    compiled in a mode with CUDA graphs of its own, and not fp16 (its gradient scaler decides on the
    host whether to skip a step).
    """

    EAGER_STEPS = 3  # autotuning, cuBLAS workspaces and the allocator settle before capture

    def __init__(self, model: nn.Module, precision: str = "fp32", device: torch.device | str | None = None,
                 lr: float = 3e-4, fused_optimizer: bool | None = None) -> None:
        device = torch.device(device) if device is not None else dev.get_device()
        check_cuda_graph(device)
        if precision == "fp16":
            raise ValueError("cuda_graph does not support fp16: its gradient scaler checks for overflow on the "
                             "host every step; use bf16")
        if _captures_own_graphs(model):
            raise ValueError("cuda_graph cannot capture a model compiled with compile_mode='reduce-overhead' or "
                             "'max-autotune' (their own CUDA graphs); use compile_mode='default'")
        super().__init__(model, precision, device, lr, fused_optimizer, capturable=True)
        self.eager_steps_done = 0
        self._graphs: tuple[torch.cuda.CUDAGraph, torch.cuda.CUDAGraph, torch.cuda.CUDAGraph] | None = None
        self._static: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # inputs, targets, loss

    def _capture(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        static_inputs, static_targets = inputs.clone(), targets.clone()
        forward, backward, optimizer = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)  # gradients are allocated inside the captured pool
        set_matmul_precision(self.precision)
        with torch.cuda.graph(forward):
            loss = self.loss(static_inputs, static_targets)
        with torch.cuda.graph(backward, pool=forward.pool()):
            loss.backward()
        with torch.cuda.graph(optimizer, pool=forward.pool()):
            self.optimizer.step()
        self._graphs = (forward, backward, optimizer)
        self._static = (static_inputs, static_targets, loss)

    def __call__(
        self, inputs: torch.Tensor, targets: torch.Tensor, timer: PhaseTimer | None = None
    ) -> torch.Tensor:
        """One training step: eager for the first ``EAGER_STEPS`` calls (the last of them then captures
        the graphs, so that capture is not counted in a timed step), replayed after."""
        if self._graphs is None:
            # Eager steps on a side stream, as capture requires of the work it will record.
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                loss = super().__call__(inputs, targets, timer)
            torch.cuda.current_stream(self.device).wait_stream(side)
            self.eager_steps_done += 1
            if self.eager_steps_done >= self.EAGER_STEPS:
                self._capture(inputs, targets)
            return loss
        assert self._graphs is not None and self._static is not None
        static_inputs, static_targets, loss = self._static
        if inputs.shape != static_inputs.shape or targets.shape != static_targets.shape:
            raise ValueError(f"cuda_graph replays fixed shapes: captured {tuple(static_inputs.shape)}, "
                             f"got {tuple(inputs.shape)}")
        static_inputs.copy_(inputs)
        static_targets.copy_(targets)
        for graph, phase in zip(self._graphs, PHASES):
            graph.replay()
            if timer:
                timer.mark(phase)
        return loss.detach().clone()  # the captured loss is overwritten by the next replay


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
        return "\n".join([
            f"TinyLLaMA {self.version} | {self.preset} | {self.precision}{' | CUDA graphs' if self.cuda_graph else ''}"
            f" | {self.device}",
            f"  batch {self.batch_size} x seq {self.seq_len}, {self.num_parameters / 1e6:.1f}M parameters",
            f"  warm-up: {', '.join(f'{w:.1f}' for w in self.warmup_ms)} ms",
            f"  step: {s.median:.2f} ms median (p10 {s.p10:.2f}, p90 {s.p90:.2f}, n={s.n})",
            f"  forward {f.median:.2f} ms | backward {b.median:.2f} ms | optimizer {o.median:.2f} ms",
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


def _progress(iterable: Sequence[int], enabled: bool, desc: str) -> Iterator[int]:
    if not enabled:
        return iter(iterable)
    from tqdm.auto import tqdm

    return iter(tqdm(iterable, desc=desc, leave=False))


def resolve_config(
    preset: str, batch_size: int | None, seq_len: int | None, **overrides: Any
) -> tuple[ModelConfig, int, int]:
    """The model shape, batch size and sequence length of a run: the preset's, with overrides."""
    chosen = get_preset(preset)
    batch_size = chosen.batch_size if batch_size is None else batch_size
    seq_len = chosen.seq_len if seq_len is None else seq_len
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch size and sequence length must be at least 1 (got {batch_size}, {seq_len})")
    if seq_len > chosen.model.max_seq_len and overrides.get("max_seq_len") is None:
        overrides["max_seq_len"] = seq_len
    return make_config(preset, **overrides), batch_size, seq_len


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
    cuda_graph: bool = False,
    **config_overrides: Any,
) -> BenchResult:
    """Build (or take) a model, check that it trains, and time ``num_steps`` training steps.

    ``cuda_graph=True`` replays each step from CUDA (HIP) graphs after the warm-up steps
    (``GraphedTrainingStep``): the step's GPU time without Python's launch overhead. See the module
    docstring. Raises ``ValueError`` for bad settings, ``CorrectnessError`` for a model whose backward
    misses parameters, and ``BenchmarkError`` when the device runs out of memory.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if num_steps < 1 or warmup_steps < 0:
        raise ValueError(f"need num_steps >= 1 and warmup_steps >= 0 (got {num_steps}, {warmup_steps})")
    if model is None and version not in VERSIONS:
        raise ValueError(f"unknown version {version!r}: choose one of {', '.join(VERSIONS)}")
    config, batch_size, seq_len = resolve_config(preset, batch_size, seq_len, **config_overrides)
    device = dev.get_device(None if device is None else str(device))
    if cuda_graph:
        check_cuda_graph(device, warmup_steps)
    determinism = configure_determinism(seed, deterministic)
    model_options = dict(model_options or {})
    try:
        return _run(version, preset, config, batch_size, seq_len, precision, num_steps, warmup_steps,
                    seed, device, model_options, model, batches, progress, determinism, cuda_graph)
    except Exception as error:  # noqa: BLE001 - only out-of-memory is translated, the rest re-raised
        if not dev.is_out_of_memory(error):
            raise
        dev.free_memory(device)
        raise BenchmarkError(
            f"out of memory on {dev.device_name(device)} at batch {batch_size} x seq {seq_len} "
            f"({version}, {precision}): try a smaller batch (--batch-size {max(1, batch_size // 2)}) "
            f"or sequence (--seq-len {max(1, seq_len // 2)}), or a lower precision"
        ) from None


def _run(
    version: str, preset: str, config: ModelConfig, batch_size: int, seq_len: int, precision: str,
    num_steps: int, warmup_steps: int, seed: int, device: torch.device, model_options: dict[str, Any],
    model: nn.Module | None, batches: list[tuple[torch.Tensor, torch.Tensor]] | None, progress: bool,
    determinism: dict[str, object], cuda_graph: bool,
) -> BenchResult:
    if model is None:
        model = build(version, config, **model_options)
    model = model.to(device).train()
    if batches is None:
        batches = make_batches(config, batch_size, seq_len, count=4, seed=seed, device=device)
    step = (GraphedTrainingStep if cuda_graph else TrainingStep)(model, precision, device)

    # Correct first: a model whose backward does not reach every parameter is not timed.
    inputs, targets = batches[0]
    check_every_parameter_trained(model, lambda: step.loss(inputs, targets))

    dev.free_memory(device)
    dev.reset_peak_memory(device)
    losses: list[float] = []
    warmup_ms: list[float] = []
    for i in _progress(range(warmup_steps), progress, f"{version} warm-up"):
        dev.synchronize(device)
        began = time.perf_counter()
        losses.append(step(*batches[i % len(batches)]).item())
        dev.synchronize(device)
        warmup_ms.append((time.perf_counter() - began) * 1e3)

    timer = PhaseTimer(device)
    phase_ms: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for i in _progress(range(num_steps), progress, f"{version} {precision}"):
        timer.start()
        loss = step(*batches[(warmup_steps + i) % len(batches)], timer=timer)
        for phase, ms in timer.stop().items():
            phase_ms[phase].append(ms)
        losses.append(loss.item())
    if not all(math.isfinite(x) for x in losses):
        raise CorrectnessError(f"the loss became {losses[-1]} during training: lower the learning rate or "
                               "use bf16 instead of fp16")

    step_ms = [sum(parts) for parts in zip(*(phase_ms[p] for p in PHASES))]
    step_stats = summarize(step_ms)
    step_s = step_stats.median / 1e3
    flops = model_flops.training_flops(config, batch_size, seq_len)
    counted = model_flops.counted_training_flops(config, batch_size, seq_len)
    peaks = dev.device_peaks(device)
    peak_tflops = peaks.tflops(precision) if peaks else None
    achieved = flops / step_s / 1e12
    memory = dev.memory_stats(device)
    return BenchResult(
        version=version, preset=preset, precision=precision, device=dev.device_name(device),
        backend=dev.backend() if device.type == "cuda" else "cpu", batch_size=batch_size, seq_len=seq_len,
        config=config.to_dict(), num_parameters=sum(p.numel() for p in model.parameters()),
        num_steps=num_steps, warmup_steps=warmup_steps, step_ms=step_stats,
        forward_ms=summarize(phase_ms["forward"]), backward_ms=summarize(phase_ms["backward"]),
        optimizer_ms=summarize(phase_ms["optimizer"]), warmup_ms=warmup_ms, losses=losses,
        tokens_per_s=batch_size * seq_len / step_s, samples_per_s=batch_size / step_s,
        peak_memory_mib=memory.peak_mib, flops_per_step=flops, flops_per_step_counted=counted,
        achieved_tflops=achieved, peak_tflops=peak_tflops,
        mfu=achieved / peak_tflops if peak_tflops else None, determinism=determinism,
        model_options=model_options, cuda_graph=cuda_graph,
    )


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------


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


def shape_overrides(args: argparse.Namespace) -> dict[str, int | None]:
    """The model-shape flags of ``add_problem_size_arguments``, as ``make_config`` overrides."""
    return {name: getattr(args, name) for name in _SHAPE_FLAGS}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tinyllama.bench",
        description="Time TinyLLaMA training steps honestly: correctness check, warm-up, device events.",
    )
    parser.add_argument("--version", default="v1", help=f"model version ({', '.join(VERSIONS)} ...)")
    add_problem_size_arguments(parser)
    parser.add_argument("--num-steps", type=int, default=20, help="timed steps (default 20)")
    parser.add_argument("--warmup-steps", type=int, default=3, help="untimed warm-up steps (default 3)")
    parser.add_argument("--precision", default="fp32", help="fp32, tf32, bf16 or fp16 (fp16 uses a gradient scaler)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deterministic", action="store_true",
                        help="deterministic algorithms and cuDNN/MIOpen settings (reports what it set)")
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: the GPU if there is one)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a switch of the version, e.g. --option fuse_qkv=0 (repeatable)")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="replay each step from CUDA/HIP graphs after the warm-up "
                             "(GPU only; not with compile_mode reduce-overhead)")
    parser.add_argument("--json", metavar="PATH", help="append the result to this JSON list file")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


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


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.device is None and not torch.cuda.is_available():
        print("note: no GPU found, running on the CPU (expect it to be slow; try --preset ci)", file=sys.stderr)
    try:
        options = dict(parse_option(o) for o in args.option)
        result = run_benchmark(
            args.version, args.preset, batch_size=args.batch_size, seq_len=args.seq_len,
            precision=args.precision, num_steps=args.num_steps, warmup_steps=args.warmup_steps,
            seed=args.seed, deterministic=args.deterministic, device=args.device, model_options=options,
            progress=not args.quiet, cuda_graph=args.cuda_graph, **shape_overrides(args),
        )
    except (ValueError, BenchmarkError, CorrectnessError, dev.DeviceUnavailable) as error:
        # Includes BenchmarkError and CorrectnessError: one line, no traceback wall.
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(result.summary())
    if args.deterministic:
        print("  determinism: " + ", ".join(f"{k}={v}" for k, v in result.determinism.items()))
    if args.json:
        from tinyllama.records import append_json_records

        print(f"  appended to {append_json_records(args.json, [result.to_dict()])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
