"""The parity check: a model holding V1's weights must give V1's fp32 logits, loss and the gradient
of every parameter (fused weights split back into V1's), within a tolerance per precision, and every
parameter must receive a gradient. ``tinyllama.harness.compare`` times no run that fails it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from tinyllama.config import autocast_context, set_matmul_precision
from tinyllama.correctness import parameters_without_gradient
from tinyllama.models import lm_loss
from tinyllama.models.weights import canonical_gradients


@dataclass(frozen=True)
class ParityTolerance:
    """Largest relative errors (norm of the difference over the norm of V1's value) that pass."""

    logits: float
    loss: float
    gradients: float


# fp32: the same function up to rounding. Reduced precisions round every matmul input to 8 (bf16) or
# 11 (fp16, tf32) significant bits; measured errors are about 1e-2 on gradients, so these catch a
# broken computation (which gives errors of order 1) without failing an honest one.
TOLERANCES: dict[str, ParityTolerance] = {
    "fp32": ParityTolerance(logits=1e-4, loss=1e-4, gradients=1e-3),
    "tf32": ParityTolerance(logits=3e-2, loss=1e-2, gradients=1.5e-1),
    "bf16": ParityTolerance(logits=5e-2, loss=2e-2, gradients=1.5e-1),
    "fp16": ParityTolerance(logits=3e-2, loss=1e-2, gradients=1.5e-1),
}


@dataclass
class Reference:
    """V1's fp32 answer on one batch: logits, loss and the gradient of every (canonical) parameter."""

    inputs: torch.Tensor
    targets: torch.Tensor
    logits: torch.Tensor
    loss: torch.Tensor
    gradients: dict[str, torch.Tensor]


@dataclass
class ParityCheck:
    """How a model's logits, loss and gradients compare with V1's on the same weights and batch."""

    precision: str
    logits_error: float
    loss_error: float
    gradient_error: float
    worst_parameter: str
    without_gradient: list[str]
    missing_parameters: list[str]
    tolerance: ParityTolerance

    @property
    def passed(self) -> bool:
        t = self.tolerance
        return (not self.without_gradient and not self.missing_parameters and self.logits_error <= t.logits
                and self.loss_error <= t.loss and self.gradient_error <= t.gradients)

    def summary(self) -> str:
        """One line: the errors and, for a failure, what failed."""
        t = self.tolerance
        text = (f"{self.precision}: logits {self.logits_error:.1e} (<= {t.logits:.0e}), loss {self.loss_error:.1e} "
                f"(<= {t.loss:.0e}), gradients {self.gradient_error:.1e} (<= {t.gradients:.0e}, worst "
                f"{self.worst_parameter})")
        if self.without_gradient:
            text += f"; no gradient for {len(self.without_gradient)} parameter(s): {', '.join(self.without_gradient[:3])}"
        if self.missing_parameters:
            text += f"; V1 parameters not found: {', '.join(self.missing_parameters[:3])}"
        return text


def l2_relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """||value - reference|| / ||reference|| in fp32 (the absolute error where the reference is 0)."""
    value, reference = value.detach().float(), reference.detach().float()
    diff = (value - reference).norm().item()
    scale = reference.norm().item()
    return diff / scale if scale > 0 else diff


# fp16 gradients underflow without loss scaling (the training step scales too): scale, then unscale.
_FP16_LOSS_SCALE = 2.0**12


def forward_backward(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, precision: str,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward and backward at ``precision`` (gradients cleared first); returns logits and loss."""
    set_matmul_precision(precision)
    model.zero_grad(set_to_none=True)
    with autocast_context(precision, device):
        logits = model(inputs)
    loss = lm_loss(logits, targets)
    if precision == "fp16":
        (loss * _FP16_LOSS_SCALE).backward()
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(_FP16_LOSS_SCALE)
    else:
        loss.backward()
    return logits.detach(), loss.detach()


def reference_answer(reference: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> Reference:
    """Run V1 at fp32 on one batch and keep what every other run must reproduce."""
    device = inputs.device
    logits, loss = forward_backward(reference, inputs, targets, "fp32", device)
    grads = {k: g.detach().clone() for k, g in canonical_gradients(reference).items() if g is not None}
    reference.zero_grad(set_to_none=True)
    return Reference(inputs, targets, logits, loss, grads)


def check_parity(model: nn.Module, reference: Reference, precision: str = "fp32",
                 tolerance: ParityTolerance | None = None) -> ParityCheck:
    """Compare ``model`` (holding the reference's weights) with the reference on its batch."""
    device = reference.inputs.device
    logits, loss = forward_backward(model, reference.inputs, reference.targets, precision, device)
    without = parameters_without_gradient(model)
    grads = canonical_gradients(model)
    errors = {name: l2_relative_error(grads[name], ref) for name, ref in reference.gradients.items()
              if grads.get(name) is not None}
    missing = sorted(set(reference.gradients) - set(grads))
    worst = max(errors, key=errors.__getitem__) if errors else "-"
    model.zero_grad(set_to_none=True)
    return ParityCheck(
        precision=precision, logits_error=l2_relative_error(logits, reference.logits),
        loss_error=l2_relative_error(loss, reference.loss), gradient_error=errors.get(worst, math.inf),
        worst_parameter=worst, without_gradient=without, missing_parameters=missing,
        tolerance=tolerance or TOLERANCES[precision],
    )
