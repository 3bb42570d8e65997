"""TinyLLaMA V4: everything PyTorch itself offers, switched on.

- attention through ``scaled_dot_product_attention`` (causal; a flash-attention kernel on GPUs, and
  grouped-query heads read in place with ``enable_gqa`` where the torch version and kernel allow it),
- V2's fused QKV and gate/up projections,
- ``torch.compile`` of every decoder block (regional compilation: one compiled graph, reused),
- and two settings of the training step, which the harness reads from the model:
  ``preferred_precision = "bf16"`` (autocast to bfloat16, fp32 master weights) and
  ``fused_optimizer = True`` (AdamW updating all parameters in one fused kernel).

V4 is V2 with every switch on, so it computes the same function as V1 (tests/test_parity.py).
``compile=False`` builds it uncompiled (fast to start, for tests on the CPU).
"""

from __future__ import annotations

from tinyllama.config import ModelConfig
from tinyllama.models import v2_fused as v2


class TinyLlama(v2.TinyLlama):
    """V2 with fused projections, SDPA and ``torch.compile``; trains in bf16 with fused AdamW."""

    version = "v4"
    switch_names = ("compile", "compile_mode")
    preferred_precision = "bf16"
    fused_optimizer = True

    def __init__(self, config: ModelConfig, *, compile: bool = True, compile_mode: str = "default") -> None:
        super().__init__(config, fuse_qkv=True, fuse_gate_up=True, sdpa=True, compile=compile,
                         compile_mode=compile_mode)
