"""What one benchmark run is asked to do, checked before anything is built.

A :class:`BenchmarkConfig` is what the command line and the notebook API both produce. Its
``validate()`` turns every bad value into a :class:`ConfigError` with a one-line message that says
what to do, so that neither a participant nor a notebook ever sees a traceback for a typo.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

from inference.straggler import check_straggler
from tinyllama.config import COMPILE_MODES, BenchmarkError, ConfigError

MODES = ("inference", "training")
# What each mode times, for the run's header. The original micro_benchmarking_pytorch.py defaults to
# training; this benchmark, made for an inference workshop, to inference: the same command line measures
# different work in the two, so the header says which mode ran and how to reproduce the original.
MODE_WORK = {"inference": "eval mode, torch.inference_mode, forward only",
             "training": "forward, loss, backward and an SGD step"}
ORIGINAL_DEFAULT_MODE = "training"
# Not tinyllama.config.PRECISIONS: inference casts the whole network (fp16, bf16) or autocasts (amp).
INFERENCE_PRECISIONS = ("fp32", "fp16", "bf16", "amp")
# Keys of torch.compile that --compileContext may set.
COMPILE_KEYS = ("mode", "options", "fullgraph", "dynamic", "backend", "disable")
# The inference levers a deployment reaches for after torch.compile's default, as Inductor options (one
# home: the command line, the notebooks and the GPU scripts all build them here):
# - freeze: the weights become constants of the compiled graph, so Inductor folds each batch norm into the
#   convolution before it (scale the weights, add a bias) and fixes the weights' layout once; only valid
#   when nothing updates the weights (inference);
# - cuda_graphs: the compiled step is recorded once as a CUDA graph and replayed (one launch a step);
# - max_autotune: Inductor times alternative kernels for its matrix products and generated kernels, but
#   convolutions stay cuDNN/MIOpen calls (Inductor's Triton convolution templates compile for minutes per
#   shape and lost to cuDNN on six of seven ResNet shapes on an H200, benchmarks/history/inference.md).
WITHOUT_CONV_TEMPLATES = {"max_autotune_conv_backends": "ATEN"}
LEVERS = {
    "freeze": {"freezing": True},
    "cuda_graphs": {"triton.cudagraphs": True},
    "max_autotune": {"max_autotune": True, **WITHOUT_CONV_TEMPLATES},
}
# The PyTorch profiler's schedule for --kineto, as the original benchmark used it.
KINETO_WAIT, KINETO_WARMUP, KINETO_ACTIVE = 1, 2, 2


@dataclass
class BenchmarkConfig:
    """One benchmark run.

    ``batchnorm_fp32`` keeps batch-norm layers in fp32 when the precision is fp16 or bf16 (False:
    the whole network in 16 bits, for comparison). ``batch_size`` is the global batch: with several
    processes (torchrun) each one runs ``batch_size / world_size`` samples. ``input_size`` ``None``
    means the size the network is built for (224 for ResNet-50, 299 for Inception v3, 520 for
    segmentation, ...).
    ``compile_options`` are keyword arguments of ``torch.compile`` (mode, options, fullgraph, dynamic,
    backend); ``None`` with ``compile=True`` means PyTorch's defaults. ``freeze``, ``cuda_graphs`` and
    ``max_autotune`` add the inference levers of :data:`LEVERS` to the compile (and imply it).
    """

    network: str = "resnet50"
    batch_size: int = 64
    iterations: int = 20
    warmup: int = 5
    mode: str = "inference"
    precision: str = "fp32"
    channels_last: bool = False
    batchnorm_fp32: bool = True
    compile: bool = False
    compile_options: dict[str, Any] | None = None
    freeze: bool = False
    cuda_graphs: bool = False
    max_autotune: bool = False
    input_size: int | None = None
    device: str | None = None
    seed: int = 0
    check: bool = True
    kineto: bool = False
    autograd_profiler: bool = False
    flops_prof_step: int | None = None
    output_dir: str = "."
    baseline_throughput: float | None = None
    progress: bool = True
    straggler_ms: float = 0.0  # delay one rank's work by this much every iteration (inference.straggler)
    straggler_rank: int | None = None  # the rank to delay; None: the last one

    @property
    def levers(self) -> list[str]:
        """The names of the inference levers asked for, in :data:`LEVERS` order."""
        return [name for name in LEVERS if getattr(self, name)]

    def inductor_options(self) -> dict[str, Any]:
        """The Inductor options of the levers, merged with any ``compile_options['options']``."""
        options: dict[str, Any] = dict((self.compile_options or {}).get("options") or {})
        for name in self.levers:
            options.update(LEVERS[name])
        return options

    def replace(self, **changes: Any) -> "BenchmarkConfig":
        """A copy with ``changes`` applied (for sweeps)."""
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        """Raise :class:`ConfigError` for the first setting that cannot work."""
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be at least 1 (got {self.batch_size})")
        if self.iterations < 1:
            raise ConfigError(f"--iterations must be at least 1 (got {self.iterations})")
        if self.warmup < 1:
            raise ConfigError(
                f"--warmup must be at least 1 (got {self.warmup}): the first iteration pays one-time "
                "costs (allocation, autotuning, compilation) that must not be timed"
            )
        _check_choice("--mode", self.mode, MODES)
        _check_choice("--precision", self.precision, INFERENCE_PRECISIONS)
        if self.input_size is not None and self.input_size < 16:
            raise ConfigError(f"--input-size must be at least 16 pixels (got {self.input_size})")
        if self.flops_prof_step is not None:
            if self.flops_prof_step < 0:
                raise ConfigError(f"--flops-prof-step must be 0 or more (got {self.flops_prof_step})")
            if self.flops_prof_step >= self.iterations:
                raise ConfigError(
                    f"--flops-prof-step {self.flops_prof_step} must be smaller than --iterations "
                    f"{self.iterations} (it is the 0-based iteration that DeepSpeed profiles)"
                )
            if self.iterations < 2:
                raise ConfigError(
                    "--flops-prof-step needs --iterations 2 or more: the profiled iteration is left out "
                    "of the timing, so at least one other must be timed"
                )
        needed = KINETO_WAIT + KINETO_WARMUP + KINETO_ACTIVE
        if self.kineto and self.iterations < needed:
            raise ConfigError(
                f"--kineto needs --iterations {needed} or more (the profiler waits {KINETO_WAIT}, warms "
                f"up {KINETO_WARMUP} and records {KINETO_ACTIVE}); got {self.iterations}"
            )
        if self.kineto and self.autograd_profiler:
            raise ConfigError("use --kineto or --autograd-profiler, not both: two profilers cannot run at once")
        if self.baseline_throughput is not None and self.baseline_throughput <= 0:
            raise ConfigError("--baseline-throughput must be a positive samples/s figure of a 1-GPU run")
        check_straggler(self.straggler_ms, self.straggler_rank)
        if self.compile_options and not self.compile:
            raise ConfigError("compile_options were given but compile is off: set compile=True")
        if self.levers and not self.compile:
            raise ConfigError(f"{', '.join(self.levers)} work through torch.compile: set compile=True (the "
                              "command line's --freeze, --cuda-graphs and --max-autotune imply --compile)")
        if self.freeze and self.mode != "inference":
            raise ConfigError("--freeze makes the weights constants of the compiled graph, which training must "
                              "update: use it with --mode inference only")
        if self.levers and (self.compile_options or {}).get("mode") not in (None, "default"):
            raise ConfigError(f"--freeze, --cuda-graphs and --max-autotune are Inductor options, which "
                              f"torch.compile does not take together with a mode ({self.compile_options['mode']!r}): "
                              "drop the mode from --compileContext")
        if self.compile:
            check_compile_options(self.compile_options or {})


def _check_choice(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{flag} must be one of {', '.join(choices)} (got {value!r})")


def _as_bool(value: Any) -> Any:
    # The original benchmark's examples write booleans as strings: {'fullgraph': 'True'}.
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return value


def parse_compile_context(text: str | None) -> dict[str, Any]:
    """Parse ``--compileContext``: a Python dict literal such as
    ``"{'mode': 'max-autotune', 'fullgraph': 'True'}"`` or ``"{'options': {'freezing': True}}"``.
    ``'True'``/``'False'`` strings become booleans. Raises :class:`ConfigError` for anything else.
    """
    if text is None or not text.strip():
        return {}
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError) as error:
        raise ConfigError(
            f"--compileContext must be a Python dict literal such as \"{{'mode': 'max-autotune'}}\" "
            f"({error.__class__.__name__}: {error})"
        ) from None
    if not isinstance(value, dict):
        raise ConfigError(f"--compileContext must be a dict, got {type(value).__name__}")
    parsed = {key: _as_bool(item) for key, item in value.items()}
    if isinstance(parsed.get("options"), dict):
        parsed["options"] = {key: _as_bool(item) for key, item in parsed["options"].items()}
    check_compile_options(parsed)
    return parsed


def check_compile_options(options: dict[str, Any]) -> None:
    """Check torch.compile keyword arguments before compiling, with messages that name the fix."""
    for key in options:
        if key not in COMPILE_KEYS:
            raise ConfigError(
                f"unknown torch.compile setting {key!r}: use {', '.join(COMPILE_KEYS)}"
            )
    mode = options.get("mode")
    if mode is not None and mode not in COMPILE_MODES:
        raise ConfigError(f"compile mode must be one of {', '.join(COMPILE_MODES)} (got {mode!r})")
    inductor_options = options.get("options")
    if inductor_options is not None:
        if mode is not None:
            raise ConfigError(
                "torch.compile takes 'mode' or 'options', not both: put the mode's settings into options"
            )
        if not isinstance(inductor_options, dict):
            raise ConfigError("compile 'options' must be a dict of inductor settings, e.g. {'freezing': True}")
        known = _inductor_option_names()
        for key in inductor_options:
            if known and key.replace("-", "_") not in known:
                close = difflib.get_close_matches(key.replace("-", "_"), known, n=3, cutoff=0.6)
                hint = f"; close: {', '.join(close)}" if close else ""
                raise ConfigError(
                    f"unknown inductor option {key!r} in this PyTorch{hint} "
                    "(torch._inductor.list_options() lists them)"
                )


def _inductor_option_names() -> list[str]:
    try:
        import torch._inductor

        return list(torch._inductor.list_options())
    except Exception:  # an old or stripped PyTorch: let torch.compile itself judge
        return []
