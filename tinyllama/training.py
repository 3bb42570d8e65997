"""The training step every TinyLLaMA harness times: seeded batches, reproducibility settings, and
one step (forward, loss, backward, AdamW) run eagerly (``TrainingStep``) or replayed from CUDA
graphs (``GraphedTrainingStep``), with its phases marked for a ``PhaseTimer`` and the profilers.
``TrainingStep.accumulate`` takes the step's micro-batches from a batch source (a data loader):
gradient accumulation, and the wait for data marked as its own phase."""

from __future__ import annotations

import os
import random
from typing import Iterator

import torch

from tinyllama import device as dev
from tinyllama.config import ModelConfig, autocast_context, check_precision, set_matmul_precision
from tinyllama.models import lm_loss
from tinyllama.models.v1_baseline import TinyLlama
from tinyllama.models.weights import unwrap
from tinyllama.timing import PhaseTimer

PHASES = ("forward", "backward", "optimizer")
# The phases of a step that takes its batches from a source: the wait for each micro-batch (and its
# copy to the device) first.
DATA_PHASES = ("data", *PHASES)


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

    ``fused_optimizer=None`` uses the model's own preference (its ``fused_optimizer``), and only on a
    GPU, where PyTorch has the fused kernel.
    """

    def __init__(
        self, model: TinyLlama, precision: str = "fp32", device: torch.device | str | None = None,
        lr: float = 3e-4, fused_optimizer: bool | None = None, capturable: bool = False,
    ) -> None:
        check_precision(precision)
        self.model = model
        self.precision = precision
        self.device = torch.device(device) if device is not None else dev.get_device()
        if fused_optimizer is None:
            fused_optimizer = unwrap(model).fused_optimizer
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

    def _forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor, scale: float,
                          timer: PhaseTimer | None) -> torch.Tensor:
        """Forward and backward of one (micro-)batch, the loss multiplied by ``scale`` before the
        backward; gradients add up in ``.grad``. Returns the unscaled loss, detached."""
        with dev.annotate("forward"):
            loss = self.loss(inputs, targets)
        if timer:
            timer.mark("forward")
        with dev.annotate("backward"):
            scaled = loss * scale if scale != 1.0 else loss
            (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        if timer:
            timer.mark("backward")
        return loss.detach()

    def _update(self, timer: PhaseTimer | None) -> None:
        with dev.annotate("optimizer"):
            if self.scaler:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        if timer:
            timer.mark("optimizer")

    def __call__(
        self, inputs: torch.Tensor, targets: torch.Tensor, timer: PhaseTimer | None = None
    ) -> torch.Tensor:
        """One training step; returns the (detached) loss. Marks the timer's phases if given."""
        set_matmul_precision(self.precision)
        loss = self._forward_backward(inputs, targets, 1.0, timer)
        self._update(timer)
        return loss

    def accumulate(self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]], steps: int = 1,
                   timer: PhaseTimer | None = None) -> torch.Tensor:
        """One optimizer step over ``steps`` micro-batches taken from ``batches`` (gradient
        accumulation: the effective batch is the micro-batch times ``steps``). Each micro-batch's loss
        is divided by ``steps`` before its backward, so the summed gradients are those of the mean loss
        over the whole effective batch, as one batch ``steps`` times larger would give.

        Marks ``data`` (waiting for the next micro-batch and queuing its copy to the device), then
        ``forward`` and ``backward`` per micro-batch (the timer sums them), then ``optimizer``. Returns
        the mean loss of the micro-batches, detached.
        """
        if steps < 1:
            raise ValueError(f"accumulation steps must be at least 1 (got {steps})")
        set_matmul_precision(self.precision)
        total = None
        for _ in range(steps):
            with dev.annotate("data"):
                inputs, targets = next(batches)
                # non_blocking: from pinned memory the copy overlaps with the work already queued.
                inputs = inputs.to(self.device, non_blocking=True)
                targets = targets.to(self.device, non_blocking=True)
            if timer:
                timer.mark("data")
            loss = self._forward_backward(inputs, targets, 1.0 / steps, timer)
            total = loss / steps if total is None else total + loss / steps
        self._update(timer)
        assert total is not None
        return total


def replays_step(model: torch.nn.Module, device: torch.device, precision: str, *, cuda_graph: bool | None = None,
                 accumulation_steps: int = 1, gradient_checkpointing: bool = False,
                 warmup_steps: int | None = None) -> bool:
    """Whether a harness replays ``model``'s training steps from CUDA (HIP) graphs
    (``GraphedTrainingStep``). ``cuda_graph`` True or False is the caller's explicit choice (True is
    checked by :func:`check_cuda_graph`); ``None`` takes the model's default (``graphed_step``, V4's),
    which applies only where a replay is possible and correct: a GPU, not fp16 (its gradient scaler decides
    on the host), one micro-batch a step, no recomputed blocks, enough warm-up steps to capture after, and a
    model without compile's own CUDA graphs. Elsewhere the default is an eager step, silently: the same
    code runs on a CPU and in every configuration a participant tries."""
    if cuda_graph is not None:
        return bool(cuda_graph)
    inner = unwrap(model)
    return (bool(getattr(inner, "graphed_step", False)) and device.type == "cuda" and precision != "fp16"
            and accumulation_steps == 1 and not gradient_checkpointing and not inner.own_cuda_graphs
            and (warmup_steps is None or warmup_steps >= GraphedTrainingStep.EAGER_STEPS))


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
    kernels back to back, with none of Python's per-kernel launch cost (about 20-50 microseconds for
    a Triton kernel; V3 launches about 130 per step).

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

    def __init__(self, model: TinyLlama, precision: str = "fp32", device: torch.device | str | None = None,
                 lr: float = 3e-4, fused_optimizer: bool | None = None) -> None:
        device = torch.device(device) if device is not None else dev.get_device()
        check_cuda_graph(device)
        if precision == "fp16":
            raise ValueError("cuda_graph does not support fp16: its gradient scaler checks for overflow on the "
                             "host every step; use bf16")
        if unwrap(model).own_cuda_graphs:  # graphs that cannot be captured again inside another graph
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

    def accumulate(self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]], steps: int = 1,
                   timer: PhaseTimer | None = None) -> torch.Tensor:
        """One replayed step on the next batch of ``batches`` (marked ``data``); a captured step has no
        room for accumulation, so ``steps`` must be 1."""
        if steps != 1:
            raise ValueError("cuda_graph replays one whole step per batch: use accumulation_steps=1 with it")
        inputs, targets = next(batches)
        inputs, targets = inputs.to(self.device, non_blocking=True), targets.to(self.device, non_blocking=True)
        if timer:
            timer.mark("data")
        return self(inputs, targets, timer)

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
