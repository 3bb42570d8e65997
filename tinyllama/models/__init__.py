"""The TinyLLaMA versions and the registry that builds them.

Every version computes the same function: the same weights give the same logits, loss and
gradients (``tests/test_parity.py``). They differ only in speed.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tinyllama.config import ModelConfig
from tinyllama.models.weights import canonical_gradients, transfer_weights

# version -> (module, class). Imported on demand, so that a version whose dependencies are missing
# (Triton on a machine without it) does not stop the others from loading.
_REGISTRY: dict[str, tuple[str, str]] = {
    "v1": ("tinyllama.models.v1_baseline", "TinyLlama"),
    "v2": ("tinyllama.models.v2_fused", "TinyLlama"),
    "v3": ("tinyllama.models.v3_triton", "TinyLlama"),
    "v4": ("tinyllama.models.v4_sdpa", "TinyLlama"),
}

VERSIONS: tuple[str, ...] = tuple(_REGISTRY)

DESCRIPTIONS: dict[str, str] = {
    "v1": "plain PyTorch baseline: separate projections, explicit mask and softmax",
    "v2": "fused QKV and gate/up projections; SDPA and torch.compile behind switches",
    "v3": "V2's fused projections with Triton kernels (forward and backward): RMSNorm, RoPE, flash attention "
          "(GQA by index), SwiGLU; stage=1/2 are the debugging exercise's broken init and non-contiguous inputs",
    "v4": "PyTorch SDPA + fused projections + torch.compile, trained in bf16 with fused AdamW",
}


def model_class(version: str) -> type[nn.Module]:
    """The class that implements ``version``."""
    if version not in _REGISTRY:
        raise ValueError(f"unknown version {version!r}: choose one of {', '.join(_REGISTRY)}")
    module, name = _REGISTRY[version]
    return getattr(importlib.import_module(module), name)


def build(version: str, config: ModelConfig, **options: Any) -> nn.Module:
    """A freshly initialised model of ``version`` with shape ``config``; ``options`` are the
    version's switches (for example V2's fusions)."""
    return model_class(version)(config, **options)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, averaged over all tokens, computed in fp32."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


__all__ = ["VERSIONS", "DESCRIPTIONS", "build", "canonical_gradients", "model_class", "lm_loss", "transfer_weights"]
