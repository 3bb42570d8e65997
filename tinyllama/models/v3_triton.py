"""TinyLLaMA V3: V2 (fused projections) with its memory-bound pieces replaced by Triton kernels.

- RMSNorm: one read and one write per norm (``tinyllama.kernels.rmsnorm``) instead of PyTorch's
  half-dozen elementwise kernels; under autocast it writes the 16-bit result the next matmul needs.
- Rotary embedding: one read and one write of q and k (``tinyllama.kernels.rope``) instead of the
  casts, ``cat``, ``neg``, products and sum of V1's formula.
- Attention: flash attention (``tinyllama.kernels.flash_attention``): the (seq x seq) scores never
  reach memory, and key/value heads are shared by index instead of copied. RoPE and attention run
  as one autograd Function on the fused projection's output (``tinyllama.kernels.rope_attention``):
  q and k rotate in one launch, and the backward writes the projection's gradient as one tensor.
- SwiGLU: ``silu(gate) * up`` in one kernel forward and one backward, reading gate and up side by
  side from the fused projection and writing their gradient as one tensor
  (``tinyllama.kernels.swiglu_packed``).

Matrix multiplies stay with PyTorch (cuBLAS / hipBLASLt are already near the hardware's limit), in
V2's fused form: one QKV and one gate/up projection. V1's weights load through ``transfer_weights``
(the fused weights are V1's stacked) and give the same logits and gradients (``tests/test_parity.py``,
``tests/test_v3.py``). Every kernel has a backward: every parameter trains.

The performance-debugging exercise of the original workshop lives here as ``stage``:

1. ``stage=1`` -- broken initialisation: every weight drawn from N(0, 1) instead of N(0, 0.02).
   The logits come out about ``sqrt(hidden)`` times too large and the first loss is far above the
   ``ln(vocab)`` of an untrained model. Symptom: a loss that makes no sense. Fix: scale the init.
2. ``stage=2`` -- right numbers, wrong memory layout: every projection is computed "column-major",
   ``(W @ x^T)^T``, the habit of code ported from Fortran or cuBLAS's own convention. Same products,
   same values, but each activation comes out transposed in memory (its feature dimension strided),
   so each kernel receives non-contiguous tensors and the launchers must copy them first, and the
   element-wise PyTorch operations in between read across memory. Symptom: correct but slower; the
   profiler shows copy kernels nobody wrote. Fix: keep the layout the kernels read.
3. ``stage=3`` -- fixed (the default).
"""

from __future__ import annotations

import torch
from torch import nn

from tinyllama import kernels
from tinyllama.config import ModelConfig
from tinyllama.models import v1_baseline as v1
from tinyllama.models import v2_fused as v2

STAGES = {1: "broken weight initialisation (N(0, 1))", 2: "non-contiguous tensors fed to the kernels",
          3: "fixed"}
BROKEN_INIT_STD = 1.0


def _autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype autocast would give the next matmul's input, or None outside autocast."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return None


class RMSNorm(v1.RMSNorm):
    """V1's RMSNorm through the Triton kernel. Under autocast it returns the autocast dtype: the same
    values the following matmul would get after casting V1's fp32 result, without the extra pass."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.rmsnorm(x, self.weight, self.eps, out_dtype=_autocast_dtype(x))


class Attention(v2.FusedAttention):
    """V2's attention (one QKV projection) with Triton RoPE and flash attention, which read V1's fp32
    rotary tables (``self.rope.cos``, ``self.rope.sin``). The output is stored (batch, seq, heads,
    head_dim), so the merge of the heads before ``o_proj`` is a view."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config, fuse_qkv=True, sdpa=False)
        del self.causal_mask  # the kernel masks by index; no (seq x seq) mask in memory

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # V2's project_qkv + attend (RoPE, then attention) in one Function: the same kernels with
        # fewer launches and autograd nodes around them (eager V3 is bound by its host time)
        batch, seq, _ = x.shape
        out = kernels.rope_attention(self.qkv_proj(x), self.rope.cos, self.rope.sin, self.num_heads,
                                     self.num_kv_heads, causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(v2.FusedFeedForward):
    """V2's feed-forward (one gate/up projection) with the activation and product in one Triton kernel."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config, fuse_gate_up=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(kernels.swiglu_packed(self.gate_up_proj(x)))


class Block(v1.Block):
    norm_class = RMSNorm
    attention_class = Attention
    mlp_class = FeedForward


class ColumnMajorLinear(nn.Linear):
    """Stage 2's layout bug: ``y = (W @ x^T)^T``. The values equal ``nn.Linear``'s (up to summation
    order); the result is a transposed view whose last dimension is strided by the number of tokens."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        return (self.weight @ tokens.t()).t().view(*x.shape[:-1], self.out_features)


class TinyLlama(v2.CompiledBlocks, v1.TinyLlama):
    """TinyLLaMA with Triton RMSNorm, flash attention and SwiGLU; ``stage`` selects the debugging
    exercise's broken variants (see the module docstring). ``compile`` compiles each decoder block
    with ``torch.compile`` as V2 and V4 do (``compile_mode`` picks the mode): the kernels are
    registered operators (``torch.ops.tinyllama.*``), so Inductor traces through them."""

    version = "v3"
    switch_names = ("stage", "compile", "compile_mode")
    block_class = Block
    fused_optimizer = True  # the training step may update all parameters with one fused AdamW kernel

    def __init__(self, config: ModelConfig, *, stage: int = 3, compile: bool = False,
                 compile_mode: str = "default") -> None:
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}: choose 1 ({STAGES[1]}), 2 ({STAGES[2]}) or 3 ({STAGES[3]})")
        switches = v2.Switches(fuse_qkv=True, fuse_gate_up=True, sdpa=False, compile=bool(compile),
                               compile_mode=compile_mode)  # checks the mode before anything is built
        super().__init__(config)
        self.stage = stage
        self.switches = switches
        if stage == 1:
            self.reset_parameters(std=BROKEN_INIT_STD)
        if stage == 2:
            for module in self.modules():
                if type(module) is nn.Linear:
                    module.__class__ = ColumnMajorLinear  # same parameters, transposed outputs
        self.compile_blocks()

    def fused_weights(self) -> dict[str, list[tuple[str, int]]]:
        """V2's fused QKV and gate/up weights: V1's stacked (see ``tinyllama.models.weights``)."""
        return v2.fused_weight_spec(self.config)

    def extra_repr(self) -> str:
        compiled = f", compile_mode={self.switches.compile_mode}" if self.compiled else ""
        return f"stage={self.stage} ({STAGES[self.stage]}){compiled}"
