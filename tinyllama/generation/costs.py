"""What one decode step must move and compute: the numbers its time is compared with."""

from __future__ import annotations

import torch

from tinyllama.config import ModelConfig
from tinyllama.costs import flops as model_flops
from tinyllama.generation.runners import DTYPES


def _itemsize(dtype: torch.dtype | str) -> int:
    return (DTYPES[dtype] if isinstance(dtype, str) else dtype).itemsize


def decode_bytes(config: ModelConfig, batch: int, context_len: int, dtype: torch.dtype | str) -> int:
    """Bytes one decode step of ``batch`` sequences must move from and to memory, for a new token that
    attends to ``context_len`` positions (its own included), with ``s`` bytes per element of ``dtype``::

        weights     = (P - vocab*h + batch*h) * s           every weight read once; of the embedding
                                                             table only the batch's rows (P: parameters)
        cache read  = 2 * layers * batch * kv_dim * context_len * s     K and V of every visible position
        cache write = 2 * layers * batch * kv_dim * s                   K and V of the new token

    Activations (a few vectors of ``hidden`` or ``intermediate`` per sequence and layer) and the logits
    are left out: a minimum. A static step that reads its whole cache moves more than this.
    """
    s = _itemsize(dtype)
    h, kv = config.hidden_dim, config.kv_dim
    weights = config.num_parameters() - config.vocab_size * h + batch * h
    cache_read = 2 * config.num_layers * batch * kv * context_len
    cache_write = 2 * config.num_layers * batch * kv
    return (weights + cache_read + cache_write) * s


def decode_flops(config: ModelConfig, batch: int, context_len: int) -> int:
    """FLOPs of one decode step: 2 per multiply-add of every projection and the lm head for each sequence
    (``2 * matmul_parameters * batch``), plus the two attention products over ``context_len`` positions
    (q k^T and probs @ v: ``layers * 4 * batch * context_len * heads * head_dim``)."""
    attention = config.num_layers * 4 * batch * context_len * config.num_heads * config.head_dim
    return 2 * model_flops.matmul_parameters(config) * batch + attention
