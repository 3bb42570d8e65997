"""Number formats: how a precision is applied to a network, and how far its outputs are from fp32.

``fp16`` and ``bf16`` store weights and activations in 16 bits (``model.to(dtype)``), except the
batch-norm layers, which keep fp32 parameters and statistics (the usual mixed-precision practice,
and what the original benchmark did): cuDNN/MIOpen normalise 16-bit activations with fp32 statistics
in their fast kernels, while an all-16-bit batch norm falls back to PyTorch's slower native kernels
(see :func:`apply`, ``batchnorm_fp32``). ``amp`` keeps fp32 weights and lets ``torch.autocast`` run
the matrix work in 16 bits (fp16 on a GPU, with a gradient scaler when training; bf16 on the CPU,
whose autocast is made for it). ``fp32`` on a GPU uses TF32 for convolutions when PyTorch allows it
(its default): the run records that setting.

A lower precision is only worth timing once its outputs are shown close to fp32's on the same
weights and inputs: :func:`compare` measures that.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import asdict, dataclass
from typing import ContextManager, Iterator, Mapping, Sequence

import torch

from inference import networks
from inference.config import BenchmarkError
from tinyllama import device as dev

# Largest difference from the fp32 reference, relative to the reference's largest magnitude, that a
# run may show. Random-weight networks amplify rounding less than trained ones do at these sizes
# (resnet50: fp16 about 1e-3, bf16 about 5e-3 on the CPU). fp32 is allowed TF32's rounding, which has
# fp16's 10-bit mantissa.
TOLERANCE = {torch.float32: 1e-2, torch.float16: 1e-2, torch.bfloat16: 5e-2}
CHECK_SAMPLES = 8  # samples of the batch compared against the fp32 reference


@dataclass(frozen=True)
class PrecisionPlan:
    """How one precision is applied on one device."""

    name: str
    weight_dtype: torch.dtype
    input_dtype: torch.dtype
    autocast_dtype: torch.dtype | None
    grad_scaler: bool

    @property
    def compute_dtype(self) -> torch.dtype:
        """The format the matrix work runs in."""
        return self.autocast_dtype or self.weight_dtype

    def autocast(self, device: torch.device) -> ContextManager[object]:
        """``torch.autocast`` for ``amp``, nothing otherwise."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.autocast_dtype)

    def make_grad_scaler(self, device: torch.device) -> "torch.amp.GradScaler | None":
        """A gradient scaler for fp16 autocast training (fp16 gradients underflow without one)."""
        if not self.grad_scaler:
            return None
        return torch.amp.GradScaler(device.type)


def plan(precision: str, device: torch.device) -> PrecisionPlan:
    """The :class:`PrecisionPlan` for ``precision`` (fp32, fp16, bf16, amp) on ``device``."""
    if precision == "fp32":
        return PrecisionPlan("fp32", torch.float32, torch.float32, None, False)
    if precision == "fp16":
        return PrecisionPlan("fp16", torch.float16, torch.float16, None, False)
    if precision == "bf16":
        return PrecisionPlan("bf16", torch.bfloat16, torch.bfloat16, None, False)
    if precision == "amp":
        on_gpu = device.type == "cuda"
        dtype = torch.float16 if on_gpu else torch.bfloat16
        return PrecisionPlan("amp", torch.float32, torch.float32, dtype, on_gpu)
    raise BenchmarkError(f"unknown precision {precision!r}: use fp32, fp16, bf16 or amp")


def apply(model: torch.nn.Module, chosen: PrecisionPlan, batchnorm_fp32: bool = True) -> torch.nn.Module:
    """Store ``model``'s weights in ``chosen.weight_dtype`` (in place; returns the model). With
    ``batchnorm_fp32`` the batch-norm layers keep fp32 weights and running statistics."""
    if chosen.weight_dtype == torch.float32:
        return model
    model.to(dtype=chosen.weight_dtype)
    if batchnorm_fp32:
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.float()
    return model


def tf32_enabled(device: torch.device) -> dict[str, bool]:
    """Whether fp32 matrix multiplications and convolutions may use TF32 on ``device``."""
    if device.type != "cuda":
        return {"tf32_matmul": False, "tf32_conv": False}
    return {"tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
            "tf32_conv": bool(torch.backends.cudnn.allow_tf32)}


# Explicit mantissa bits (the stored fraction; the leading 1 is implied) of the formats the course uses.
# TF32 is not a storage format: NVIDIA's matrix units round fp32 inputs to it and accumulate in fp32.
MANTISSA_BITS = {"fp32": 23, "tf32": 10, "fp16": 10, "bf16": 7}


@contextlib.contextmanager
def tf32_mode(enabled: bool) -> Iterator[None]:
    """Within the block, fp32 convolutions (cuDNN) and matmuls (cuBLAS) may (``True``) or may not
    (``False``) round their inputs to TF32. PyTorch's defaults: convolutions may, matmuls may not.
    The previous settings are restored afterwards. Without a GPU the flags change nothing."""
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = enabled
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def round_to_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``x`` (fp32) rounded to the nearest value with ``bits`` explicit mantissa bits and fp32's
    exponent range, returned in fp32: what a matrix unit sees of an fp32 input in TF32 (``bits=10``).
    Ties round away from zero (hardware rounds them to even; the largest error is the same)."""
    if x.dtype != torch.float32:
        raise TypeError(f"round_to_mantissa takes an fp32 tensor (got {x.dtype})")
    if not 0 <= bits <= 23:
        raise ValueError(f"fp32 has 23 mantissa bits: keep 0..23 of them (got {bits})")
    drop = 23 - bits
    if drop == 0:
        return x.clone()
    as_int = x.contiguous().view(torch.int32)
    # Add half of the last kept bit to the magnitude, then clear the dropped bits; a carry into the
    # exponent is the correct rounding up to the next power of two.
    rounded = (as_int + (1 << (drop - 1))) & ~((1 << drop) - 1)
    return rounded.view(torch.float32)


def ran_as(precision: str, environment: Mapping[str, object]) -> str:
    """What a run in ``precision`` computed in, from its recorded ``environment`` (``tf32_conv``,
    ``tf32_matmul``, ``backend``): "fp32" on an NVIDIA GPU runs its convolutions in TF32 by default."""
    if precision != "fp32":
        return {"fp16": "fp16 weights and activations", "bf16": "bf16 weights and activations",
                "amp": "fp32 weights, autocast to 16 bits"}.get(precision, precision)
    conv, matmul = bool(environment.get("tf32_conv")), bool(environment.get("tf32_matmul"))
    if not (conv or matmul):
        return "fp32 throughout (TF32 off)" if environment.get("backend") != "cpu" else "fp32 throughout"
    parts = " and ".join(name for name, on in (("convolutions", conv), ("matmuls", matmul)) if on)
    text = f"{parts} in TF32, storage fp32"
    if environment.get("backend") == "rocm":
        text += " (if this GPU and ROCm honour PyTorch's TF32 flags)"
    return text


def unsupported_message(error: BaseException, precision: str, device: torch.device) -> str | None:
    """A one-line explanation when ``error`` says that an operation has no kernel for the precision."""
    text = str(error)
    if "not implemented for" in text and ("Half" in text or "BFloat16" in text):
        first = text.splitlines()[0]
        alternative = "bf16" if precision == "fp16" else "fp32"
        return (f"{precision} is not supported on {device.type} by this PyTorch for this network ({first}): "
                f"try --precision {alternative} or --precision amp")
    return None


@dataclass(frozen=True)
class AccuracyReport:
    """How far a configuration's outputs are from fp32 eager on the same weights and inputs.

    ``max_rel_diff`` is the largest absolute difference divided by the largest reference magnitude
    (an element-wise ratio explodes where the reference is near zero).
    """

    precision: str
    configuration: str
    samples: int
    max_abs_diff: float
    max_rel_diff: float
    mean_abs_diff: float
    reference_max_abs: float
    top1_agreement: float | None
    finite: bool
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.finite and self.max_rel_diff <= self.tolerance

    def as_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["passed"] = self.passed
        return out

    def describe(self) -> str:
        """One line for the summary."""
        verdict = "ok" if self.passed else "FAILED"
        top1 = f", top-1 agreement {100 * self.top1_agreement:.0f}%" if self.top1_agreement is not None else ""
        finite = "" if self.finite else ", NON-FINITE values (overflow to inf or nan)"
        return (f"{self.configuration} vs fp32 eager on {self.samples} samples: max abs diff {self.max_abs_diff:.3g}, "
                f"max rel diff {self.max_rel_diff:.3g} (of max |ref| {self.reference_max_abs:.3g}), "
                f"mean abs diff {self.mean_abs_diff:.3g}{top1}{finite} [{verdict}, tolerance {self.tolerance:g}]")

    def failure_hint(self) -> str:
        """What to try when the check failed."""
        if not self.finite:
            return "the format overflowed: try --precision bf16 (fp32's range) or amp"
        if self.reference_max_abs < 6.1e-5 and self.precision in ("fp16", "amp"):
            return ("the fp32 outputs are smaller than fp16's smallest normal number (6.1e-5), so fp16 "
                    "flushes them: try --precision bf16")
        return "a wrong result must not be timed; pass --no-check to time it anyway"


def compare(reference: torch.Tensor, output: torch.Tensor, precision: str, classification: bool,
            compute_dtype: torch.dtype, configuration: str | None = None) -> AccuracyReport:
    """Compare ``output`` with the fp32 ``reference`` (same weights, same inputs). ``configuration``
    names what produced ``output`` (e.g. "fp16 channels-last compiled"); default: the precision."""
    ref = reference.detach().float().cpu()
    out = output.detach().float().cpu()
    if ref.shape != out.shape:
        raise BenchmarkError(f"outputs have shape {tuple(out.shape)}, the fp32 reference {tuple(ref.shape)}")
    finite = bool(torch.isfinite(out).all())
    diff = (out - ref).abs()
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    max_abs = float(diff.max()) if diff.numel() else 0.0
    if scale > 0:
        max_rel = max_abs / scale
    else:
        max_rel = 0.0 if max_abs == 0 else float("inf")
    top1 = None
    if classification and ref.dim() == 2:
        top1 = float((out.argmax(dim=1) == ref.argmax(dim=1)).float().mean())
    return AccuracyReport(
        precision=precision,
        configuration=configuration or precision,
        samples=int(ref.shape[0]) if ref.dim() else 1,
        max_abs_diff=max_abs,
        max_rel_diff=max_rel,
        mean_abs_diff=float(diff.mean()) if diff.numel() else 0.0,
        reference_max_abs=scale,
        top1_agreement=top1,
        finite=finite,
        tolerance=TOLERANCE[compute_dtype],
    )


def compare_precisions(network: str, precisions: Sequence[str] = ("fp16", "bf16"), batch_size: int = 16,
                       device: str | None = None, channels_last: bool = False, input_size: int | None = None,
                       seed: int = 0, batchnorm_fp32: bool = True,
                       reference_tf32: bool | None = None) -> list[AccuracyReport]:
    """The workshop's accuracy check: run ``network`` in fp32 and in each of ``precisions`` on the same
    weights and the same random batch (eval mode), and report how far each output is from fp32's.

    ``reference_tf32``: run the fp32 reference with TF32 allowed (``True``) or not (``False``: the
    true fp32 result, against which "fp32" itself can be compared); ``None`` keeps PyTorch's settings.
    The candidates run with the settings in force (:func:`tf32_mode` changes them); an fp32
    candidate on a GPU that allows TF32 convolutions is labelled as such."""
    spec = networks.get_spec(network)
    if spec.task == "detection":
        raise BenchmarkError("precisions are compared on tensors: detectors return a value-dependent number of boxes")
    from inference.distributed import resolve_device

    where = resolve_device(device)
    size = input_size or spec.input_size
    model = networks.build(spec, seed).to(where).eval()
    cpu_inputs = networks.make_inputs(spec, batch_size, size, torch.Generator().manual_seed(seed + 1))
    settings = contextlib.nullcontext() if reference_tf32 is None else tf32_mode(reference_tf32)
    with torch.inference_mode(), settings:
        reference = networks.primary_output(spec, model(networks.to_device(cpu_inputs, where))).float()
    reports = []
    for name in precisions:
        chosen = plan(name, where)
        candidate = apply(copy.deepcopy(model), chosen, batchnorm_fp32)
        if channels_last:
            candidate.to(memory_format=torch.channels_last)
        inputs = networks.to_device(cpu_inputs, where, chosen.input_dtype, channels_last)
        with torch.inference_mode(), chosen.autocast(where):
            output = networks.primary_output(spec, candidate(inputs))
        label = name + (" channels-last" if channels_last else "")
        if name == "fp32" and any(tf32_enabled(where).values()):
            label += f" ({ran_as(name, {**tf32_enabled(where), 'backend': dev.backend()})})"
        reports.append(compare(reference, output, name, spec.task == "classification", chosen.compute_dtype, label))
        del candidate, output
    return reports
