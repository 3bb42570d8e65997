"""Correctness checks that run before anything is timed.

The original workshop's Triton version cut the autograd graph at every norm: its backward reached
1 of 110 parameters and it "trained" 3x faster. A model that fails ``check_every_parameter_trained``
is never timed here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class CorrectnessError(RuntimeError):
    """A model computed something it should not have; timing it would be meaningless."""


def parameters_without_gradient(model: nn.Module) -> list[str]:
    """Names of trainable parameters whose gradient is missing, all zero, or not finite."""
    missing = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        grad = param.grad
        if grad is None or not torch.isfinite(grad).all() or not grad.abs().sum() > 0:
            missing.append(name)
    return missing


def check_every_parameter_trained(model: nn.Module, loss_fn: Callable[[], torch.Tensor]) -> None:
    """Run ``loss_fn()`` and its backward once and raise ``CorrectnessError`` unless every trainable
    parameter of ``model`` received a finite, non-zero gradient. Gradients are cleared afterwards."""
    model.zero_grad(set_to_none=True)
    loss = loss_fn()
    if not torch.isfinite(loss):
        raise CorrectnessError(f"the loss is {loss.item()}: the model does not compute a finite loss")
    loss.backward()
    missing = parameters_without_gradient(model)
    total = sum(1 for p in model.parameters() if p.requires_grad)
    model.zero_grad(set_to_none=True)
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise CorrectnessError(
            f"only {total - len(missing)} of {total} parameters receive a gradient (missing: {shown}); "
            "the backward pass does not reach them, so this model does not train and is not timed"
        )
