"""TinyLLaMA V2: fused projections, with every optimization behind its own switch.

V1 multiplies each token by four attention matrices and three feed-forward matrices. Three of the
attention products (query, key, value) read the same input, and so do two of the feed-forward ones
(gate, up). V2 stacks those weights so that one larger matrix multiply replaces several small ones:
fewer kernel launches, one read of the input instead of three, and larger GEMMs that use the GPU
better. The function is unchanged: ``qkv_proj.weight`` is V1's ``q_proj``, ``k_proj`` and ``v_proj``
weights concatenated along the output dimension, ``gate_up_proj.weight`` is ``gate_proj`` then
``up_proj`` (see ``fused_weights()``), so V1's weights load into V2 and give the same logits.

The switches let a notebook turn on one optimization at a time::

    build("v2", config, fuse_qkv=True, fuse_gate_up=False, sdpa=False, compile=False)

``sdpa`` replaces the explicit mask-and-softmax attention with PyTorch's
``scaled_dot_product_attention`` (a flash-attention kernel where the device has one);
``compile`` compiles each decoder block with ``torch.compile`` (``compile_mode`` picks the mode).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cache, partial

import torch
import torch.nn.functional as F
from torch import nn

from tinyllama.config import COMPILE_MODES, CUDA_GRAPH_MODES, ModelConfig
from tinyllama.models import v1_baseline as v1

# enable_gqa (torch >= 2.5) lets SDPA read each key/value head for its whole group of query heads
# instead of copying it. Only the flash kernel implements it: for fp32 on a GPU (no flash kernel)
# SDPA would fall back to its unfused math path, so there K/V are repeated and a fused fp32 kernel runs.
SDPA_HAS_GQA = torch.torch_version.TorchVersion(torch.__version__) >= (2, 5)


def causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                native_gqa: bool | None = None) -> torch.Tensor:
    """Causal attention of ``q`` (batch, heads, seq, d) over ``k``, ``v`` (batch, kv_heads, seq, d)
    with PyTorch's fused ``scaled_dot_product_attention``.

    ``native_gqa`` chooses how grouped-query heads are served: ``True`` passes ``enable_gqa`` (no copy
    of K/V), ``False`` repeats K/V first, ``None`` picks ``enable_gqa`` where a flash kernel can use it
    (half precision, or the CPU) and the installed torch has it.
    """
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        if native_gqa is None:
            native_gqa = SDPA_HAS_GQA and (q.device.type == "cpu" or q.dtype in (torch.float16, torch.bfloat16))
        if native_gqa:
            if not SDPA_HAS_GQA:
                raise RuntimeError(f"torch {torch.__version__} has no enable_gqa in SDPA: use torch >= 2.5")
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@dataclass(frozen=True)
class Switches:
    """V2's optimizations, each on or off."""

    fuse_qkv: bool = True
    fuse_gate_up: bool = True
    sdpa: bool = False
    compile: bool = False
    compile_mode: str = "default"

    def __post_init__(self) -> None:
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"unknown compile_mode {self.compile_mode!r}: choose one of {', '.join(COMPILE_MODES)}")

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class FusedAttention(v1.Attention):
    """V1's attention with one QKV projection (``fuse_qkv``) and/or PyTorch SDPA (``sdpa``)."""

    def __init__(self, config: ModelConfig, fuse_qkv: bool = True, sdpa: bool = False) -> None:
        super().__init__(config)
        self.fuse_qkv = fuse_qkv
        self.sdpa = sdpa
        self.q_dim = config.num_heads * config.head_dim
        self.kv_dim = config.kv_dim
        if fuse_qkv:
            del self.q_proj, self.k_proj, self.v_proj
            self.qkv_proj = nn.Linear(config.hidden_dim, self.q_dim + 2 * self.kv_dim, bias=False)
        if sdpa:
            del self.causal_mask  # SDPA masks inside its kernel; the (seq x seq) mask is not needed

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not self.fuse_qkv:
            return super().project_qkv(x)
        q, k, v = self.qkv_proj(x).split([self.q_dim, self.kv_dim, self.kv_dim], dim=-1)
        q = self.split_heads(q, self.num_heads)
        k = self.split_heads(k, self.num_kv_heads)
        v = self.split_heads(v, self.num_kv_heads)
        return self.rope(q), self.rope(k), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return causal_sdpa(q, k, v) if self.sdpa else super().attend(q, k, v)


class FusedFeedForward(v1.FeedForward):
    """V1's SwiGLU with the gate and up projections in one matrix (``fuse_gate_up``)."""

    def __init__(self, config: ModelConfig, fuse_gate_up: bool = True) -> None:
        super().__init__(config)
        self.fuse_gate_up = fuse_gate_up
        if fuse_gate_up:
            del self.gate_proj, self.up_proj
            self.gate_up_proj = nn.Linear(config.hidden_dim, 2 * config.intermediate_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fuse_gate_up:
            return super().forward(x)
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class FusedBlock(v1.Block):
    """V1's decoder layer built from the fused modules (with all switches at their defaults;
    ``block_class`` makes the variant for other switches)."""

    switches = Switches()
    attention_class = FusedAttention
    mlp_class = FusedFeedForward


@cache
def block_class(switches: Switches) -> type[FusedBlock]:
    """The decoder-layer class for one combination of switches: V1's Block builds its parts as
    ``self.attention_class(config)`` and ``self.mlp_class(config)``, so these carry the switches.
    One class per combination, made once: torch.compile guards on a module's class, and models with
    equal switches then share its compiled graphs."""
    return type("FusedBlock", (FusedBlock,), {
        "switches": switches,
        "attention_class": partial(FusedAttention, fuse_qkv=switches.fuse_qkv, sdpa=switches.sdpa),
        "mlp_class": partial(FusedFeedForward, fuse_gate_up=switches.fuse_gate_up),
    })


class CompiledBlocks:
    """The ``compile`` and ``compile_mode`` switches (V2, V3, V4): regional compilation of every
    decoder block, and the step mark that CUDA graph trees need in the modes that replay graphs.
    The model sets ``self.switches`` (a :class:`Switches`) and calls :meth:`compile_blocks` once its
    layers exist; put this class before ``v1.TinyLlama`` among the bases."""

    switches: Switches
    layers: nn.ModuleList

    def compile_blocks(self) -> None:
        if self.switches.compile:
            # Regional compilation: each block is compiled, and as all blocks run the same code, the
            # graph compiled for the first serves the others. Parameter names are unchanged.
            for layer in self.layers:
                layer.compile(mode=self.switches.compile_mode)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.own_cuda_graphs:
            # Each forward starts a new step for PyTorch's CUDA graph trees. Without this mark the
            # blocks of one forward, compiled one by one, could be taken for separate steps when no
            # backward is pending (evaluation), and each would overwrite the graph outputs that the
            # next one reads. Consequence: a model's outputs are valid until its next forward.
            torch.compiler.cudagraph_mark_step_begin()
        return super().forward(input_ids)  # type: ignore[misc]

    @property
    def compiled(self) -> bool:
        return self.switches.compile

    @property
    def own_cuda_graphs(self) -> bool:
        return self.switches.compile and self.switches.compile_mode in CUDA_GRAPH_MODES


class TinyLlama(CompiledBlocks, v1.TinyLlama):
    """TinyLLaMA with fused projections; every optimization can be switched off (see module doc)."""

    version = "v2"
    switch_names = ("fuse_qkv", "fuse_gate_up", "sdpa", "compile", "compile_mode")

    def __init__(self, config: ModelConfig, *, fuse_qkv: bool = True, fuse_gate_up: bool = True,
                 sdpa: bool = False, compile: bool = False, compile_mode: str = "default") -> None:
        switches = Switches(bool(fuse_qkv), bool(fuse_gate_up), bool(sdpa), bool(compile), compile_mode)
        # The block class carrying these switches, read by V1's __init__ when it builds the layers.
        self.block_class = block_class(switches)
        super().__init__(config)
        self.switches = switches
        self.compile_blocks()

    def fused_weights(self) -> dict[str, list[tuple[str, int]]]:
        """Which parameters are V1 weights stacked along the output dimension, and in what order."""
        return fused_weight_spec(self.config, self.switches.fuse_qkv, self.switches.fuse_gate_up)


def fused_weight_spec(config: ModelConfig, fuse_qkv: bool = True,
                      fuse_gate_up: bool = True) -> dict[str, list[tuple[str, int]]]:
    """The fused parameters of a model built from ``FusedAttention`` / ``FusedFeedForward`` (name
    suffix -> the V1 weights stacked in it and their row counts), read by ``tinyllama.models.weights``."""
    c = config
    spec: dict[str, list[tuple[str, int]]] = {}
    if fuse_qkv:
        spec["attn.qkv_proj.weight"] = [("attn.q_proj.weight", c.num_heads * c.head_dim),
                                        ("attn.k_proj.weight", c.kv_dim), ("attn.v_proj.weight", c.kv_dim)]
    if fuse_gate_up:
        spec["mlp.gate_up_proj.weight"] = [("mlp.gate_proj.weight", c.intermediate_dim),
                                           ("mlp.up_proj.weight", c.intermediate_dim)]
    return spec
