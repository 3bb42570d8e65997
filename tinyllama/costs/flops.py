"""How much arithmetic a TinyLLaMA training step does.

Two independent counts that must agree: an analytic formula from the shapes, and PyTorch's own
``torch.utils.flop_counter.FlopCounterMode`` run over V1 on the meta device (no memory, no time).
Every version computes the same function, so every version is credited with the same model FLOPs:
MFU compares useful work, not the extra work an inefficient version may do.
"""

from __future__ import annotations

import torch

from tinyllama.config import ModelConfig


def matmul_parameters(config: ModelConfig) -> int:
    """Parameters that take part in a matrix multiply (everything but the embedding and the norms)."""
    h, i = config.hidden_dim, config.intermediate_dim
    per_layer = 2 * h * h + 2 * h * config.kv_dim + 3 * h * i
    return config.num_layers * per_layer + config.vocab_size * h


def forward_flops(config: ModelConfig, batch_size: int, seq_len: int) -> int:
    """FLOPs of one forward pass: 2 per multiply-add of every projection, plus the two attention
    products (scores = q k^T and probs @ v), counted over the full seq x seq square as the V1
    baseline computes them (the causal half is masked, not skipped)."""
    tokens = batch_size * seq_len
    projections = 2 * matmul_parameters(config) * tokens
    attention = config.num_layers * 2 * (2 * batch_size * seq_len * seq_len * config.hidden_dim)
    return projections + attention


def causal_pairs(s_q: int, s_k: int) -> int:
    """Query-key pairs a causal attention computes: the lower triangle of the ``s_q x s_k`` score matrix
    with its diagonal (query ``i`` sees keys ``0..i``; PyTorch's ``is_causal`` aligns the mask top-left),
    ``s (s + 1) / 2`` for a square one. A fused (flash) kernel skips the tiles above the diagonal, so
    this, not ``s_q x s_k``, is the work it does."""
    if s_q <= s_k:
        return s_q * (s_q + 1) // 2
    return s_k * (s_k + 1) // 2 + (s_q - s_k) * s_k


def training_flops(config: ModelConfig, batch_size: int, seq_len: int) -> int:
    """FLOPs of one training step: the backward pass does twice the forward's matmul work
    (gradients with respect to inputs and to weights), so a step is 3x the forward."""
    return 3 * forward_flops(config, batch_size, seq_len)


def counted_training_flops(config: ModelConfig, batch_size: int, seq_len: int) -> int:
    """The same count measured by ``FlopCounterMode`` over a V1 forward, loss and backward on the
    meta device (shapes only, so it costs nothing even for the large preset)."""
    from torch.utils.flop_counter import FlopCounterMode

    from tinyllama.models import build, lm_loss

    with torch.device("meta"):
        model = build("v1", config)
        tokens = torch.zeros(batch_size, seq_len, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        lm_loss(model(tokens), tokens).backward()
    return int(counter.get_total_flops())
