"""The KV cache and the forward that reads and writes it.

The model's own modules do the work (embedding, norms, projections fused or not, feed-forward, lm head),
so each version's kernels run: V3's Triton RMSNorm and SwiGLU, V2's fused QKV and gate/up matmuls. The
attention over the cache is written here in plain PyTorch, because the versions' attention kernels take
no cache: grouped-query attention with RoPE at each token's absolute position and a causal mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from tinyllama.config import ModelConfig


@dataclass
class KVCache:
    """Keys and values of every layer, ``k`` and ``v`` of shape [layers, batch, kv_heads, capacity, head_dim].

    Allocated once; each forward writes its tokens' keys and values in place at their positions
    (``index_copy_``), so a decode step has the same shapes and addresses every time: it can be compiled
    once and captured in a CUDA graph. Zeros, not ``torch.empty``: the attention masks positions not
    written yet, and a masked zero contributes exactly nothing, where uninitialised memory may hold NaN
    (and 0 * NaN is NaN).

    ``writer`` replaces the write of one layer's new keys and values (``write_in_place`` by default) with
    a function of the same signature: notebook 22's exercise plugs a participant's version in here.
    """

    k: torch.Tensor
    v: torch.Tensor
    writer: Optional[Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]] = None

    @classmethod
    def allocate(cls, config: ModelConfig, batch: int, capacity: int, dtype: torch.dtype,
                 device: torch.device | str, writer: Optional[Callable[..., None]] = None) -> "KVCache":
        shape = (config.num_layers, batch, config.num_kv_heads, capacity, config.head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device),
                   writer)

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def write(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``, ``v`` (batch, kv_heads, len(positions), head_dim) of ``layer`` at ``positions``."""
        (self.writer or write_in_place)(self.k[layer], self.v[layer], positions, k, v)


def write_in_place(cache_k: torch.Tensor, cache_v: torch.Tensor, positions: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor) -> None:
    """Write ``k``, ``v`` (batch, kv_heads, len, head_dim) into one layer's ``cache_k``, ``cache_v`` (batch,
    kv_heads, capacity, head_dim) at slots ``positions`` (len,), in place (``index_copy_``): the same
    addresses every step, as a compiled step and a CUDA graph need."""
    cache_k.index_copy_(2, positions, k)
    cache_v.index_copy_(2, positions, v)


def rotary_rows(rope: nn.Module, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of a ``RotaryEmbedding``'s fp32 cos and sin tables at absolute ``positions`` (len,), in
    ``dtype`` as V1 rounds them: a decode token at position p turns by p, where ``RotaryEmbedding.forward``
    would turn a sequence of one token by 0."""
    return rope.cos.index_select(0, positions).to(dtype), rope.sin.index_select(0, positions).to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """V1's rotary embedding of ``x`` (batch, heads, len, head_dim) with the rows of ``rotary_rows``."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def hidden_keys(positions: torch.Tensor, kv_len: int, groups: int) -> torch.Tensor:
    """The attention mask of ``attend``, (groups * len, kv_len), True where a key is hidden: cache slot j
    is visible to a query at position p when j <= p (causal within a prefill; slots not written yet are
    hidden). Repeated for the ``groups`` query heads that ``attend`` stacks along the length axis."""
    slots = torch.arange(kv_len, device=positions.device)
    return (slots[None, :] > positions[:, None]).repeat(groups, 1)


def project(attn: nn.Module, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query, key and value of ``h`` through the attention module's own projections (one fused QKV
    matmul in V2/V3/V4, three in V1 and unfused V2), split into heads, not rotated yet."""
    if getattr(attn, "fuse_qkv", False):
        q, k, v = attn.qkv_proj(h).split([attn.q_dim, attn.kv_dim, attn.kv_dim], dim=-1)
    else:
        q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
    return (attn.split_heads(q, attn.num_heads), attn.split_heads(k, attn.num_kv_heads),
            attn.split_heads(v, attn.num_kv_heads))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention of ``q`` (batch, heads, len, d) over cached ``k``, ``v`` (batch, kv_heads,
    S, d) with the mask ``hidden`` of ``hidden_keys``. V1's arithmetic: scores / sqrt(d), mask, softmax in
    fp32, probabilities @ v.

    The query heads that share a K/V head are stacked along the length axis, so K and V are read once;
    V1's ``repeat_interleave`` would copy them per query head, more than doubling a decode step's
    cache traffic."""
    batch, heads, length, dim = q.shape
    kv_heads = k.shape[1]
    q = q.reshape(batch, kv_heads, heads // kv_heads * length, dim)  # query head h uses K/V head h // groups
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(dim)
    scores = scores.masked_fill(hidden, float("-inf"))
    probs = F.softmax(scores.float(), dim=-1).to(q.dtype)
    return (probs @ v).view(batch, heads, length, dim)


def cached_forward(model: nn.Module, cache: KVCache, tokens: torch.Tensor, positions: torch.Tensor,
                   kv_len: int, all_logits: bool = False) -> torch.Tensor:
    """Logits of ``tokens`` (batch, len) at ``positions`` (len,), reading and writing ``cache``.

    Each layer writes its keys and values at ``positions`` and attends over cache slots ``0..kv_len-1``.
    Returns (batch, len, vocab), or (batch, 1, vocab) for the last token only unless ``all_logits``
    (the lm head is the largest matmul of a prefill with a long prompt)."""
    config: ModelConfig = model.config
    x = model.embed(tokens)
    batch, length, _ = x.shape
    # Made once for all layers, not per layer: a decode step is a chain of small kernels, and each one
    # saved counts. Every layer's rotary tables are the same (made from the config).
    cos, sin = rotary_rows(model.layers[0].attn.rope, positions, x.dtype)
    hidden = hidden_keys(positions, kv_len, config.num_heads // config.num_kv_heads)
    for index, layer in enumerate(model.layers):
        attn = layer.attn
        q, k, v = project(attn, layer.attn_norm(x))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        cache.write(index, positions, k, v)
        out = attend(q, cache.k[index, :, :, :kv_len], cache.v[index, :, :, :kv_len], hidden)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(batch, length, -1))
        x = x + layer.mlp(layer.mlp_norm(x))
    if not all_logits:
        x = x[:, -1:]
    return model.lm_head(model.norm(x))
