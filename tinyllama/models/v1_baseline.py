"""TinyLLaMA V1: the plain-PyTorch baseline.

A LLaMA-style decoder written for reading, not for speed: every step of attention is spelled out
(three projections, an explicit causal mask, softmax, a second matmul), key/value heads are copied
to match the query heads, and the SwiGLU feed-forward has separate gate, up and down projections.
Its weight names are the canonical ones that every faster version maps to and from.

Later versions subclass these modules and replace only what they speed up.
"""

from __future__ import annotations

import math
from typing import ClassVar, Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from tinyllama.config import ModelConfig


class RMSNorm(nn.Module):
    """Root-mean-square layer norm: x / rms(x) * weight, computed in fp32 for stability."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE): rotates pairs of channels by a position-dependent angle."""

    def __init__(self, head_dim: int, max_seq_len: int, theta: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)  # (max_seq_len, head_dim)
        # Not parameters, and not saved: recomputed from the config, so every version agrees.
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` of shape (batch, heads, seq, head_dim)."""
        seq_len = x.shape[-2]
        cos = self.cos[:seq_len].to(x.dtype)
        sin = self.sin[:seq_len].to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


class Attention(nn.Module):
    """Causal grouped-query self-attention with an explicit mask and softmax."""

    rope_class: type[nn.Module] = RotaryEmbedding

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.hidden_dim, config.num_heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_dim, config.kv_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_dim, config.kv_dim, bias=False)
        self.o_proj = nn.Linear(config.num_heads * config.head_dim, config.hidden_dim, bias=False)
        self.rope = self.rope_class(config.head_dim, config.max_seq_len, config.rope_theta)
        mask = torch.tril(torch.ones(config.max_seq_len, config.max_seq_len, dtype=torch.bool))
        self.register_buffer("causal_mask", mask, persistent=False)

    def split_heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        """(batch, seq, heads * head_dim) -> (batch, heads, seq, head_dim)."""
        batch, seq, _ = x.shape
        return x.view(batch, seq, heads, self.head_dim).transpose(1, 2)

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Query, key and value of ``x``, split into heads and rotated."""
        q = self.split_heads(self.q_proj(x), self.num_heads)
        k = self.split_heads(self.k_proj(x), self.num_kv_heads)
        v = self.split_heads(self.v_proj(x), self.num_kv_heads)
        return self.rope(q), self.rope(k), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(q k^T / sqrt(d) + causal mask) v, materialising the (seq x seq) scores."""
        groups = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(groups, dim=1)  # copy each K/V head for its group of query heads
        v = v.repeat_interleave(groups, dim=1)
        seq_len = q.shape[-2]
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~self.causal_mask[:seq_len, :seq_len], float("-inf"))
        probs = F.softmax(scores.float(), dim=-1).to(q.dtype)
        return probs @ v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = self.project_qkv(x)
        out = self.attend(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_dim, config.intermediate_dim, bias=False)
        self.up_proj = nn.Linear(config.hidden_dim, config.intermediate_dim, bias=False)
        self.down_proj = nn.Linear(config.intermediate_dim, config.hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """One decoder layer: pre-norm attention and pre-norm feed-forward, each with a residual."""

    norm_class: type[nn.Module] = RMSNorm
    attention_class: type[nn.Module] = Attention
    mlp_class: type[nn.Module] = FeedForward

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = self.norm_class(config.hidden_dim, config.norm_eps)
        self.attn = self.attention_class(config)
        self.mlp_norm = self.norm_class(config.hidden_dim, config.norm_eps)
        self.mlp = self.mlp_class(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TinyLlama(nn.Module):
    """Token embedding, ``num_layers`` blocks, a final norm and the output projection to the vocabulary.

    ``forward(input_ids)`` returns logits of shape (batch, seq, vocab).
    """

    version = "v1"
    block_class: type[nn.Module] = Block
    # The contract every harness reads (tinyllama.harness.bench, tinyllama.harness.compare); each version declares
    # its own values, these are the defaults.
    switch_names: ClassVar[tuple[str, ...]] = ()  # the keyword switches of __init__, for build(**switches)
    preferred_precision: ClassVar[str] = "fp32"  # the precision of a run spec that names none
    fused_optimizer: ClassVar[bool] = False  # the training step may use fused AdamW (on a GPU)
    # The harness replays the whole training step from CUDA (HIP) graphs by default, on a GPU and where a
    # step can be replayed (tinyllama.training.replays_step); a run's cuda_graph switch overrides it.
    graphed_step: ClassVar[bool] = False
    compiled: bool = False  # the blocks run through torch.compile
    own_cuda_graphs: bool = False  # compiled in a mode that replays CUDA graphs of its own
    # Indices of the blocks whose activations are recomputed in the backward instead of kept
    # (gradient checkpointing); set with set_gradient_checkpointing. Empty: none.
    checkpointed_layers: frozenset[int] = frozenset()

    def fused_weights(self) -> dict[str, list[tuple[str, int]]]:
        """Parameters that are V1 weights stacked along the output dimension (``tinyllama.models.weights``):
        none in V1."""
        return {}

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_dim)
        self.layers = nn.ModuleList(self.block_class(config) for _ in range(config.num_layers))
        self.norm = self.block_class.norm_class(config.hidden_dim, config.norm_eps)
        self.lm_head = nn.Linear(config.hidden_dim, config.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self, std: float | None = None) -> None:
        """Normal(0, std) for every projection and the embedding (std from the config, 0.02), ones
        for the norms: the LLaMA recipe that starts the loss at about ln(vocab)."""
        std = self.config.init_std if std is None else std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif hasattr(module, "weight") and module.weight is not None and module.weight.dim() == 1:
                nn.init.ones_(module.weight)

    def set_gradient_checkpointing(self, enabled: bool | Iterable[int] = True) -> "TinyLlama":
        """Gradient checkpointing per decoder block: ``True`` for every block, ``False`` for none, or the
        indices of the blocks to checkpoint. A checkpointed block keeps only its input for the backward
        and runs its forward again there (``torch.utils.checkpoint``, non-reentrant): the same gradients
        for about one more forward of compute. Returns the model."""
        if enabled is True or enabled is False:
            layers = set(range(len(self.layers))) if enabled else set()
        else:
            layers = {int(i) for i in enabled}
            wrong = sorted(i for i in layers if not 0 <= i < len(self.layers))
            if wrong:
                raise ValueError(f"no block {wrong} to checkpoint: the model has blocks 0..{len(self.layers) - 1}")
        self.checkpointed_layers = frozenset(layers)
        return self

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[-1] > self.config.max_seq_len:
            raise ValueError(
                f"sequence length {input_ids.shape[-1]} exceeds max_seq_len {self.config.max_seq_len}"
            )
        x = self.embed(input_ids)
        recompute = bool(self.checkpointed_layers) and torch.is_grad_enabled()
        for index, layer in enumerate(self.layers):
            if recompute and index in self.checkpointed_layers:
                # Non-reentrant: works with inputs that need no gradient and with torch.compile'd blocks.
                x = checkpoint(layer, x, use_reentrant=False)
            else:
                x = layer(x)
        return self.lm_head(self.norm(x))
