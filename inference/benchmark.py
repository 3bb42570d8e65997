"""One benchmark run: build the network, show it correct, warm it up, time it, report.

Inference really is inference: ``model.eval()`` and ``torch.inference_mode()``, no loss, no backward.
Training runs forward, loss, backward and an SGD step. Before anything is timed the configuration's
outputs are compared with fp32 eager on the same weights and inputs (a failed check stops the run).
Warm-up iterations are timed one by one and reported apart: the first one pays for allocation,
autotuning and compilation. Timed iterations are measured with device events (a host clock on the
CPU), back to back without a synchronize between them, and summarised by median and spread.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator

import torch
from torch import nn
from tqdm.auto import tqdm

from tinyllama import device as dev
from tinyllama.timing import PhaseTimer, Stats, summarize

from inference import distributed, networks, precision, profilers, straggler
from inference.config import BenchmarkConfig, BenchmarkError, ConfigError
from inference.distributed import DistContext

SPREAD_WARNING_PCT = 5.0  # warn when the 10th-90th percentile spread exceeds this share of the median
# The named ranges of a run, in order, as profilers see them (PyTorch profiler, NVTX/ROCTX): the fp32
# eager reference of the correctness check (on the first precision.CHECK_SAMPLES samples), the warm-up
# (the first iteration is checked against it; cuDNN/MIOpen search their algorithms here), and the timed
# iterations, which also start and stop the driver's profiler API (tinyllama.device.capture_range).
RANGES = ("reference", "warm-up", "timed")


class OutOfMemoryError(BenchmarkError):
    """The run did not fit in device memory; the memory has been given back."""

    def __init__(self, batch_size: int, detail: str) -> None:
        self.batch_size = batch_size
        super().__init__(
            f"out of memory at batch size {batch_size} ({detail}): try a smaller --batch-size, "
            "--precision fp16/bf16, or --max-batch to find the largest batch that fits"
        )


class CheckFailedError(BenchmarkError):
    """The configuration's outputs are too far from fp32 eager to be worth timing."""


@dataclass
class BenchmarkResult:
    """Everything one run measured, for the summary, the results files and pandas."""

    network: str
    task: str
    mode: str
    precision: str
    batch_size: int
    local_batch_size: int
    world_size: int
    rank: int
    input_size: int
    channels_last: bool
    compiled: bool
    compile_options: dict[str, Any]
    params: int
    device: str
    backend: str
    warmup_ms: list[float]
    timing: Stats
    peak_memory_mib: float | None
    check: str
    accuracy: precision.AccuracyReport | None = None
    loss_check: str | None = None
    first_loss: float | None = None
    final_loss: float | None = None
    profiler: str | None = None
    trace_files: list[str] = field(default_factory=list)
    operator_table: str | None = None
    flops_profile: profilers.FlopsProfile | None = None
    global_throughput: float | None = None
    per_rank_throughput: list[float] | None = None
    baseline_throughput: float | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    batchnorm_fp32: bool | None = None  # fp16/bf16 runs: were batch norms kept in fp32?
    levers: list[str] = field(default_factory=list)  # inference levers of the compile (config.LEVERS)
    straggler_ms: float = 0.0  # the delay added to the straggler's every iteration (inference.straggler)
    straggler_rank: int | None = None  # the delayed rank (None: no straggler)
    timestamp: str = field(default_factory=lambda: _dt.datetime.now().isoformat(timespec="seconds"))

    # ------------------------------------------------------------------ derived figures
    @property
    def throughput(self) -> float:
        """Samples per second of this process, from the median iteration time."""
        return self.local_batch_size / (self.timing.median / 1e3)

    @property
    def throughput_mean(self) -> float:
        """Samples per second from the mean iteration time (total samples / total time)."""
        return self.local_batch_size / (self.timing.mean / 1e3)

    @property
    def ms_per_batch(self) -> float:
        return self.timing.median

    @property
    def us_per_sample(self) -> float:
        return 1e3 * self.timing.median / self.local_batch_size

    @property
    def first_iteration_ms(self) -> float:
        return self.warmup_ms[0]

    @property
    def compile_s(self) -> float | None:
        """Time the first iteration took beyond a steady one: compilation, for a compiled run."""
        if not self.compiled:
            return None
        return max(0.0, (self.first_iteration_ms - self.timing.median) / 1e3)

    @property
    def spread_warning(self) -> bool:
        return self.timing.spread_pct > SPREAD_WARNING_PCT

    @property
    def scaling_efficiency(self) -> float | None:
        """Global throughput over world size x the throughput of a 1-GPU run (when one was given)."""
        if self.baseline_throughput is None or self.global_throughput is None:
            return None
        return self.global_throughput / (self.world_size * self.baseline_throughput)

    @property
    def configuration(self) -> str:
        parts = [self.precision] + (["channels-last"] if self.channels_last else [])
        if self.compiled:
            mode = self.compile_options.get("mode") or ("options" if "options" in self.compile_options else "default")
            parts.append(f"compiled ({mode})")
        parts += [name.replace("_", " ") for name in self.levers]
        return " ".join(parts)

    # ------------------------------------------------------------------ records
    def as_record(self) -> dict[str, Any]:
        """A flat dict of scalars and short lists: one CSV row, one JSON entry, one DataFrame row."""
        record: dict[str, Any] = {
            "timestamp": self.timestamp, "network": self.network, "task": self.task, "mode": self.mode,
            "precision": self.precision, "batchnorm_fp32": self.batchnorm_fp32,
            "channels_last": self.channels_last, "compiled": self.compiled,
            "compile_options": self.compile_options, "levers": ",".join(self.levers), "batch_size": self.batch_size,
            "local_batch_size": self.local_batch_size, "world_size": self.world_size, "rank": self.rank,
            "input_size": self.input_size, "params": self.params, "device": self.device, "backend": self.backend,
            "iterations": self.timing.n, "warmup": len(self.warmup_ms), "warmup_ms": self.warmup_ms,
            "first_iteration_ms": self.first_iteration_ms, "compile_s": self.compile_s,
            "median_ms": self.timing.median, "mean_ms": self.timing.mean, "std_ms": self.timing.std,
            "min_ms": self.timing.min, "max_ms": self.timing.max, "p10_ms": self.timing.p10,
            "p90_ms": self.timing.p90, "spread_pct": self.timing.spread_pct,
            "spread_warning": self.spread_warning, "throughput": self.throughput,
            "throughput_mean": self.throughput_mean, "ms_per_batch": self.ms_per_batch,
            "us_per_sample": self.us_per_sample, "peak_memory_mib": self.peak_memory_mib,
            "check": self.check, "loss_check": self.loss_check, "first_loss": self.first_loss,
            "final_loss": self.final_loss, "profiler": self.profiler,
            "trace_files": self.trace_files, "global_throughput": self.global_throughput,
            "per_rank_throughput": self.per_rank_throughput, "baseline_throughput": self.baseline_throughput,
            "scaling_efficiency": self.scaling_efficiency,
            "straggler_ms": self.straggler_ms, "straggler_rank": self.straggler_rank,
        }
        accuracy = self.accuracy.as_dict() if self.accuracy else {}
        for key in ("max_abs_diff", "max_rel_diff", "mean_abs_diff", "top1_agreement", "tolerance", "passed"):
            record[f"accuracy_{key}"] = accuracy.get(key)
        flops = self.flops_profile.as_dict() if self.flops_profile else {}
        for key in ("step", "macs", "flops", "params", "macs_per_sample", "forward_latency_ms", "forward_tflops"):
            record[f"flops_profile_{key}"] = flops.get(key)
        for key in ("torch", "python", "cuda", "hip", "triton", "tf32_matmul", "tf32_conv"):
            record[key] = self.environment.get(key)
        return record

    def summary(self) -> str:
        """The human-readable report the command line prints."""
        who = f"[rank {self.rank}/{self.world_size}] " if self.world_size > 1 else ""
        lines = [
            f"{who}{self.network} ({self.task}), {self.mode}, {self.configuration}, "
            f"batch {self.local_batch_size}" + (f" of global {self.batch_size}" if self.world_size > 1 else "")
            + f", input 3x{self.input_size}x{self.input_size}",
            f"{who}device: {self.device} ({self.backend}), torch {self.environment.get('torch')}",
            f"{who}check: {self.accuracy.describe() if self.accuracy else self.check}",
        ] + ([f"{who}check: {self.loss_check}"] if self.loss_check else []) + [
            f"{who}warm-up: {len(self.warmup_ms)} iterations, ms: " + ", ".join(f"{t:.1f}" for t in self.warmup_ms)
            + (f"  (first iteration {self.first_iteration_ms:.1f} ms"
               + (f", compilation about {self.compile_s:.1f} s" if self.compiled and self.compile_s is not None else "")
               + ")"),
            f"{who}timed: {self.timing.n} iterations: median {self.timing.median:.3f} ms, mean {self.timing.mean:.3f}, "
            f"std {self.timing.std:.3f}, min {self.timing.min:.3f}, max {self.timing.max:.3f}, "
            f"p10-p90 spread {self.timing.spread_pct:.1f}% of the median",
            f"{who}throughput: {self.throughput:,.1f} samples/s (mean-based {self.throughput_mean:,.1f}), "
            f"{self.ms_per_batch:.3f} ms per batch, {self.us_per_sample:.1f} us per sample",
            f"{who}peak device memory: "
            + (f"{self.peak_memory_mib:,.0f} MiB" if self.peak_memory_mib is not None else "not tracked on the CPU"),
        ]
        if self.final_loss is not None:
            lines.append(f"{who}training loss: {self.first_loss:.4f} at the first warm-up step, "
                         f"{self.final_loss:.4f} at the last timed step")
        if self.spread_warning:
            lines.append(f"{who}WARNING: the iterations spread by {self.timing.spread_pct:.1f}% of the median "
                         f"(more than {SPREAD_WARNING_PCT:g}%): the device may be shared, busy or throttling; run "
                         "more --iterations, and check who else uses it (nvidia-smi, rocm-smi, top)")
        if self.profiler:
            lines.append(f"{who}note: timed with the {self.profiler} profiler attached, which slows the run; "
                         "benchmark without it for figures to compare")
        for path in self.trace_files:
            lines.append(f"{who}trace written: {path} (open in https://ui.perfetto.dev or chrome://tracing)")
        if self.flops_profile:
            fp = self.flops_profile
            lines.append(f"{who}DeepSpeed FLOPS profile at iteration {fp.step}: {fp.macs / 1e9:.3f} GMACs, "
                         f"{fp.flops / 1e9:.3f} GFLOPs per forward of {fp.batch_size} samples "
                         f"({fp.macs_per_sample / 1e9:.3f} GMACs per sample), {fp.params / 1e6:.2f} M params, "
                         f"forward {fp.forward_latency_ms:.2f} ms under the profiler "
                         "(that iteration is left out of the timing)")
        return "\n".join(lines)

    def global_summary(self) -> str:
        """The figures of all processes together (empty for a single process)."""
        if self.world_size == 1 or self.global_throughput is None:
            return ""
        per_rank = ", ".join(f"{t:,.1f}" for t in self.per_rank_throughput or [])
        lines = [f"global: {self.world_size} processes, global batch {self.batch_size}: "
                 f"{self.global_throughput:,.1f} samples/s (global batch / slowest rank's median; "
                 f"per rank: {per_rank})"]
        if self.straggler_rank is not None:
            lines.append(f"global: rank {self.straggler_rank} is a straggler made on purpose, delayed by "
                         f"{self.straggler_ms:g} ms every iteration")
        if self.scaling_efficiency is not None:
            lines.append(f"global: scaling efficiency {100 * self.scaling_efficiency:.1f}% against "
                         f"{self.world_size} x {self.baseline_throughput:,.1f} samples/s of the 1-GPU run")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def run_benchmark(config: BenchmarkConfig) -> BenchmarkResult:
    """Run one benchmark as ``config`` says and return its :class:`BenchmarkResult`.

    Inside a process group (torchrun), every process calls this; the batch is split across them and
    every result carries the global throughput. Raises :class:`BenchmarkError` subclasses with a
    one-line message for what a participant can fix (bad settings, out of memory, failed check).
    """
    config.validate()
    spec = networks.get_spec(config.network)
    if config.flops_prof_step is not None:
        profilers.require_deepspeed()
    ctx = distributed.current()
    device = distributed.resolve_device(config.device)
    if config.cuda_graphs and device.type != "cuda":
        raise ConfigError(f"--cuda-graphs records the step as a GPU graph: it needs a GPU (this run is on {device})")
    local_batch = ctx.local_batch(config.batch_size)
    problem: BenchmarkError | None = None
    try:
        return _run(config, spec, ctx, device, local_batch)
    except BenchmarkError:
        raise
    except Exception as error:  # turn the errors a participant can act on into one line
        if dev.is_out_of_memory(error):
            problem = OutOfMemoryError(local_batch, str(error).splitlines()[0][:200])
        elif (message := precision.unsupported_message(error, config.precision, device)) is not None:
            problem = BenchmarkError(message)
        else:
            raise
    finally:
        dev.free_memory(device)
    # Raised here, outside the handler, so the failed run's frames (and tensors) are already released.
    raise problem


def _compile_kwargs(config: BenchmarkConfig) -> dict[str, Any]:
    # Static shapes: each batch size gets its own graph, as a deployment would compile it.
    kwargs: dict[str, Any] = {"dynamic": False}
    kwargs.update(config.compile_options or {})
    if kwargs.get("mode") == "default":
        kwargs.pop("mode")
    if config.levers:
        kwargs["options"] = config.inductor_options()
    return kwargs


def _training_loss(model: nn.Module, spec: networks.NetworkSpec, inputs: Any, targets: Any) -> float:
    """The fp32 eager training-mode loss of one batch, leaving the model's buffers (BatchNorm running
    statistics) as they were."""
    saved = {name: buffer.clone() for name, buffer in model.named_buffers()}
    model.train()
    with torch.no_grad():
        value = float(networks.loss(spec, networks.forward(model, spec, inputs, targets), targets))
        for name, buffer in model.named_buffers():
            buffer.copy_(saved[name])
    return value


@contextlib.contextmanager
def _no_range(name: str) -> Iterator[None]:
    yield


@contextlib.contextmanager
def _cudnn_benchmark(device: torch.device) -> Iterator[None]:
    """Let cuDNN/MIOpen time its convolution algorithms for these shapes (during warm-up)."""
    if device.type != "cuda":
        yield
        return
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


class _FreezingOnFirstCall:
    """A compiled module whose first call (the one Dynamo traces) runs with Inductor's ``freezing`` set
    globally: Dynamo decides while tracing whether the parameters become constants, and it reads the
    global flag, not ``torch.compile(options=...)``, which Inductor applies only later (torch 2.14: with
    the option alone nothing is frozen). Later calls run the compiled graph as is (a patch costs
    about 0.1 ms, too much inside a timed step)."""

    def __init__(self, compiled: Callable[..., Any]) -> None:
        self._compiled, self._traced = compiled, False

    def __getattr__(self, name: str) -> Any:  # ``training`` and the like, from the compiled module
        return getattr(self._compiled, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._traced:
            return self._compiled(*args, **kwargs)
        import torch._inductor.config as inductor_config

        with inductor_config.patch(freezing=True):
            output = self._compiled(*args, **kwargs)
        self._traced = True
        return output


class _Run:
    """One run, stage by stage: ``prepare`` builds the network, its inputs and the fp32 eager
    reference and applies the configuration; ``step`` is one iteration; ``warm_up`` and ``time`` run
    iterations; ``result`` reports. The checks (``judge``, ``judge_loss``) stop a wrong configuration
    before it is timed."""

    def __init__(self, config: BenchmarkConfig, spec: networks.NetworkSpec, ctx: DistContext,
                 device: torch.device, local_batch: int) -> None:
        self.config, self.spec, self.ctx, self.device, self.local_batch = config, spec, ctx, device, local_batch
        self.training = config.mode == "training"
        self.plan = precision.plan(config.precision, device)
        self.size = config.input_size or spec.input_size
        self.label = " ".join([config.precision] + (["channels-last"] if config.channels_last else [])
                              + (["compiled"] if config.compile else [])
                              + [name.replace("_", " ") for name in config.levers])
        self.check_samples = min(local_batch, precision.CHECK_SAMPLES)
        self.check = ("off (--no-check)" if not config.check
                      else "skipped: detectors return a value-dependent number of boxes")
        self.accuracy: precision.AccuracyReport | None = None
        self.loss_check: str | None = None
        self.reference: torch.Tensor | None = None
        self.reference_loss: float | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scaler: Any = None
        profiling = config.kineto or config.autograd_profiler
        self.phase: Callable[[str], ContextManager[None]] = dev.annotate if profiling else _no_range
        self.mark_step = getattr(torch.compiler, "cudagraph_mark_step_begin", None) if config.compile else None
        # A straggler made on purpose (--straggler-ms): checked on every rank before anything waits for the others.
        self.straggler_rank = straggler.straggler_rank_of(config.straggler_ms, config.straggler_rank, ctx.world_size)
        self.delay: Callable[[], None] = lambda: None

    def prepare(self) -> None:
        """The network (same weights on every process), its inputs (different data on each, as data
        parallelism has it), the fp32 eager reference, then the configuration applied."""
        config, spec, device = self.config, self.spec, self.device
        self.model = networks.build(spec, config.seed).to(device)
        if self.straggler_rank == self.ctx.rank:
            self.delay = straggler.make_delay(config.straggler_ms, device)
        self.params = sum(p.numel() for p in self.model.parameters())
        generator = torch.Generator().manual_seed(config.seed + 1 + 1000 * self.ctx.rank)
        cpu_inputs = networks.make_inputs(spec, self.local_batch, self.size, generator)
        cpu_targets = networks.make_targets(spec, self.local_batch, self.size, generator) if self.training else None
        if config.check and spec.task != "detection":  # the reference, before the configuration touches the model
            self.model.eval()
            with torch.inference_mode(), dev.annotate(RANGES[0]):
                head = networks.to_device(networks.head(cpu_inputs, self.check_samples), device)
                self.reference = networks.primary_output(spec, networks.forward(self.model, spec, head)).float().clone()
        # In training, also the loss of the first step (before any update), where it is deterministic.
        if self.reference is not None and self.training and not networks.random_in_training(self.model):
            self.reference_loss = _training_loss(self.model, spec, networks.to_device(cpu_inputs, device),
                                                 networks.to_device(cpu_targets, device))
        elif self.reference is not None and self.training:
            self.loss_check = "first-step loss not compared: the network draws random numbers in training (dropout)"
        precision.apply(self.model, self.plan, config.batchnorm_fp32)
        if config.channels_last:
            self.model.to(memory_format=torch.channels_last)
        self.inputs = networks.to_device(cpu_inputs, device, self.plan.input_dtype, config.channels_last)
        self.targets = networks.to_device(cpu_targets, device, self.plan.input_dtype)
        self.run_model: nn.Module = self.model
        if self.training:
            self._prepare_training()
        else:
            self.model.eval()
        self.step_model: Callable[..., Any] = self.run_model
        if config.compile:
            torch._dynamo.reset()  # a fresh compile, not one cut short by earlier runs' recompile limit
            self.step_model = torch.compile(self.run_model, **_compile_kwargs(config))
            if config.freeze:
                self.step_model = _FreezingOnFirstCall(self.step_model)

    def _prepare_training(self) -> None:
        if self.reference is not None:  # the eager configuration in eval mode; the timed step's loss comes later
            self.model.eval()
            with torch.inference_mode(), self.plan.autocast(self.device):
                output = networks.forward(self.model, self.spec, networks.head(self.inputs, self.check_samples))
                self.judge(networks.primary_output(self.spec, output), f"{self.config.precision}"
                           f"{' channels-last' if self.config.channels_last else ''} (eager, eval mode)")
        self.model.train()
        if self.ctx.distributed:
            self.run_model = nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        # The fused SGD updates every parameter in one kernel launch on a GPU: the compiled step at batch 64
        # waits for the host (about 19 ms a step against 11 ms replayed as a CUDA graph on an H200), so
        # launches saved are time saved. The CPU has no fused SGD.
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9,
                                         fused=self.device.type == "cuda")
        self.scaler = self.plan.make_grad_scaler(self.device)

    def judge(self, output: torch.Tensor, configuration: str) -> None:
        """Compare ``output`` with the fp32 eager reference; raise ``CheckFailedError`` if too far."""
        assert self.reference is not None
        self.accuracy = precision.compare(self.reference, output, self.config.precision,
                                          self.spec.task == "classification", self.plan.compute_dtype, configuration)
        self.check = "passed" if self.accuracy.passed else "failed"
        if not self.accuracy.passed:
            raise CheckFailedError(f"{self.accuracy.describe()}: {self.accuracy.failure_hint()}")

    def judge_loss(self, loss: float) -> None:
        """Compare the first training step's loss with fp32 eager's; raise ``CheckFailedError`` if too far."""
        assert self.reference_loss is not None
        difference = abs(loss - self.reference_loss) / abs(self.reference_loss)
        tolerance = precision.TOLERANCE[self.plan.compute_dtype]
        passed = math.isfinite(loss) and difference <= tolerance
        self.loss_check = (f"first-step loss {loss:.5f} vs fp32 eager {self.reference_loss:.5f}: relative "
                           f"difference {difference:.3g} [{'ok' if passed else 'FAILED'}, tolerance {tolerance:g}]")
        if not passed:
            raise CheckFailedError(f"{self.label} training: {self.loss_check}: a wrong result must not be timed; "
                                   "pass --no-check to time it anyway")

    def step(self, module: Callable[..., Any] | None = None) -> Any:
        """One iteration of ``module`` (default: the configured model): the outputs in inference, the
        detached loss in training (forward, loss, backward, SGD step)."""
        module = self.step_model if module is None else module
        self.delay()  # queued before the iteration's work: the straggler starts it late
        if self.mark_step is not None:
            self.mark_step()
        if not self.training:
            with torch.inference_mode(), self.plan.autocast(self.device), self.phase("forward"):
                return networks.forward(module, self.spec, self.inputs)
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        with self.phase("forward"), self.plan.autocast(self.device):
            loss = networks.loss(self.spec, networks.forward(module, self.spec, self.inputs, self.targets), self.targets)
        with self.phase("backward"):
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        with self.phase("optimizer"):
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
        return loss.detach()

    def warm_up(self, timer: PhaseTimer, prefix: str) -> tuple[list[float], float | None]:
        """Warm-up iterations, each timed on its own (the first one pays the one-time costs); the
        first is checked. Returns their ms and the first training loss."""
        warmup_ms: list[float] = []
        first_loss: float | None = None
        desc = f"{prefix}warm-up" + (" (the first iteration compiles)" if self.config.compile else "")
        with dev.annotate(RANGES[1]):
            for i in tqdm(range(self.config.warmup), desc=desc, disable=not self.show_progress, leave=False):
                timer.start()
                output = self.step()
                timer.mark("warm-up")
                warmup_ms.append(timer.stop()["warm-up"])
                if i == 0 and self.training:
                    first_loss = float(output)
                    if self.reference_loss is not None:
                        self.judge_loss(first_loss)
                if i == 0 and self.reference is not None and not self.training:
                    self.judge(networks.primary_output(self.spec, output)[:self.check_samples], self.label)
                del output
        return warmup_ms, first_loss

    @property
    def show_progress(self) -> bool:
        return self.config.progress and self.ctx.is_main

    def time(self, timer: PhaseTimer, prefix: str) -> dict[str, Any]:
        """The timed iterations, back to back, under the profilers asked for; the DeepSpeed FLOPS
        profile takes one iteration out of the timing."""
        config, spec, device = self.config, self.spec, self.device
        out: dict[str, Any] = {"samples": [], "flops_profile": None, "operator_table": None, "trace": None, "last": None}
        with contextlib.ExitStack() as stack:
            kineto = None
            if config.kineto:
                trace_prefix = Path(config.output_dir) / (
                    f"trace_{spec.name}_{config.mode}_{config.precision}_bs{config.batch_size}_rank{self.ctx.rank}")
                kineto, out["trace"] = stack.enter_context(profilers.kineto(device, trace_prefix))
            if config.autograd_profiler:
                out["operator_table"] = stack.enter_context(profilers.operator_table(device))
            distributed.barrier()  # all processes start timing together
            dev.reset_peak_memory(device)
            timer.start()
            # The range's closing synchronize comes after the last iteration's end event: timing unchanged.
            with dev.capture_range(RANGES[2], device):
                for i in tqdm(range(config.iterations), desc=f"{prefix}timed", disable=not self.show_progress,
                              leave=False):
                    if i == config.flops_prof_step:
                        out["samples"].extend(timer.stop().values())
                        out["flops_profile"] = profilers.deepspeed_flops(
                            self.model, lambda: self.step(self.run_model), i, self.local_batch)
                        timer.start()
                    else:
                        with self.phase(f"iteration {i}"):
                            out["last"] = self.step()
                        timer.mark(f"iteration {i}")
                    if kineto is not None:
                        kineto.step()
            out["samples"].extend(timer.stop().values())
        return out


def _run(config: BenchmarkConfig, spec: networks.NetworkSpec, ctx: DistContext, device: torch.device,
         local_batch: int) -> BenchmarkResult:
    run = _Run(config, spec, ctx, device, local_batch)
    run.prepare()
    timer = PhaseTimer(device, profiled=bool(config.kineto or config.autograd_profiler))
    prefix = f"[rank {ctx.rank}] " if ctx.distributed else ""
    with _cudnn_benchmark(device):
        warmup_ms, first_loss = run.warm_up(timer, prefix)
        timed = run.time(timer, prefix)
    peak = dev.memory_stats(device).peak_bytes
    environment = {**dev.environment_summary(device), **precision.tf32_enabled(device)}
    trace, table, last = timed["trace"], timed["operator_table"], timed["last"]
    result = BenchmarkResult(
        network=spec.name, task=spec.task, mode=config.mode, precision=config.precision,
        batch_size=config.batch_size, local_batch_size=local_batch, world_size=ctx.world_size, rank=ctx.rank,
        input_size=run.size, channels_last=config.channels_last, compiled=config.compile,
        compile_options=dict(config.compile_options or {}), params=run.params, device=str(environment["device"]),
        backend=dev.backend() if device.type == "cuda" else "cpu", warmup_ms=warmup_ms,
        timing=summarize(timed["samples"]), peak_memory_mib=None if peak is None else peak / 2**20, check=run.check,
        accuracy=run.accuracy, loss_check=run.loss_check, first_loss=first_loss,
        final_loss=float(last) if run.training and last is not None else None,
        profiler="kineto" if config.kineto else ("autograd" if config.autograd_profiler else None),
        trace_files=list(trace.paths) if trace else [], operator_table=table.text if table else None,
        flops_profile=timed["flops_profile"], baseline_throughput=config.baseline_throughput,
        environment=environment, levers=config.levers, straggler_ms=config.straggler_ms if run.straggler_rank is not None else 0.0,
        straggler_rank=run.straggler_rank, batchnorm_fp32=config.batchnorm_fp32 if run.plan.weight_dtype != torch.float32 else None,
    )
    medians = distributed.gather(result.timing.median, ctx)
    result.per_rank_throughput = distributed.gather(result.throughput, ctx)
    result.global_throughput = config.batch_size / (max(medians) / 1e3)
    return result
