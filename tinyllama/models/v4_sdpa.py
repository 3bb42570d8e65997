"""TinyLLaMA V4: everything PyTorch itself offers, switched on.

- attention through ``scaled_dot_product_attention`` (causal; a flash-attention kernel on GPUs, and
  grouped-query heads read in place with ``enable_gqa`` where the torch version and kernel allow it),
- V2's fused QKV and gate/up projections,
- ``torch.compile`` of every decoder block (regional compilation: one compiled graph, reused),
- and three settings of the training step, which the harness reads from the model:
  ``preferred_precision = "bf16"`` (autocast to bfloat16, fp32 master weights),
  ``fused_optimizer = True`` (AdamW updating all parameters in one fused kernel) and
  ``graphed_step = True``: on a GPU the harness (``tinyllama.harness.bench``, ``tinyllama.harness.compare``) replays the
  whole training step, forward, backward and optimizer, from CUDA (HIP) graphs after its warm-up steps,
  wherever a step can be replayed (``tinyllama.training.replays_step``: not fp16, not with gradient
  accumulation or checkpointing, not in a compile mode with graphs of its own). The compiled step is then
  launched by one graph instead of by Python, kernel by kernel: that is V4 as shipped, the fastest
  correct configuration measured (BENCHMARKS.md). ``cuda_graph=0`` runs it with eager launches.

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
    graphed_step = True

    def __init__(self, config: ModelConfig, *, compile: bool = True, compile_mode: str = "default") -> None:
        super().__init__(config, fuse_qkv=True, fuse_gate_up=True, sdpa=True, compile=compile,
                         compile_mode=compile_mode)
