"""How much memory a TinyLLaMA training step needs, from the shapes alone, term by term.

Four kinds of memory (after Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", arXiv 2205.05198, who count the activations of one layer tensor by tensor):

- parameters (fp32 master weights, also under autocast), their gradients (fp32), and AdamW's two
  moments per parameter (fp32);
- **activations**: what autograd keeps from the forward for the backward. Counted per decoder block,
  tensor by tensor, for this model as it is written (``tinyllama.models.v1_baseline`` and V2's
  fused projections), at a precision (fp32, or bf16/fp16 autocast) and an attention path (the math
  path that writes the score matrix, or SDPA/flash that keeps only its output and one log-sum-exp
  per row). With gradient checkpointing a block keeps only its input and recomputes the rest in the
  backward, one block at a time.

Every term is checked against what autograd really saves: :func:`measure_activation_terms` records
each saved tensor with ``torch.autograd.graph.saved_tensors_hooks`` and assigns it to the module that
saved it (``tests/test_memory_estimate.py``, notebook 20). The peak adds what is alive at once on a
GPU (:meth:`MemoryEstimate.peak_bytes`); it is a model, shown next to the measured peak with its error.

Notation in the formulas: B batch, S sequence, h hidden size, kv = key/value heads x head size,
H query heads, I intermediate size, V vocabulary, c bytes of the compute dtype (4 in fp32, 2 under
bf16/fp16 autocast); the residual stream and the norms stay fp32 (4 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from tinyllama.config import DTYPES, ModelConfig, autocast_context, check_precision
from tinyllama.costs.anatomy import saved_for_backward
from tinyllama.models import lm_loss
from tinyllama.models.weights import unwrap

MIB = 2**20
FP32 = 4
INDEX = 8  # int64 token ids

# The terms of one decoder block and of the rest of the model, in forward order.
BLOCK_TERMS = ("attention norm", "QKV input", "RoPE tables", "attention", "output projection input", "MLP norm",
               "gate/up input", "SwiGLU")
MODEL_TERMS = ("embedding", "final norm", "output head input", "loss", "autocast weight copies")
CHECKPOINT_TERM = "checkpointed block input"


@dataclass(frozen=True)
class Layout:
    """How a model version computes a block, as far as what it saves is concerned."""

    attention: str = "math"  # "math" (explicit scores and softmax) or "sdpa"
    fused_qkv: bool = True  # one QKV projection (V2, V4) or three (V1)
    fused_gate_up: bool = True
    native_gqa: bool = True  # SDPA reads K/V heads in place (enable_gqa) rather than repeating them

    def __post_init__(self) -> None:
        if self.attention not in ("math", "sdpa"):
            raise ValueError(f"attention must be 'math' or 'sdpa' (got {self.attention!r})")


def model_layout(model: nn.Module, device: torch.device | str = "cpu", precision: str = "fp32") -> Layout:
    """The :class:`Layout` of a built model (V1, V2 with any switches, V4) on ``device`` at ``precision``.

    SDPA's grouped-query path (``enable_gqa``) is used where ``tinyllama.models.v2_fused.causal_sdpa``
    takes it: on a CPU, or in bf16/fp16 on a GPU. V3's Triton kernels save other tensors: not covered.
    """
    model = unwrap(model)
    version = getattr(model, "version", None)
    if version == "v1":
        return Layout("math", False, False, True)
    switches = getattr(model, "switches", None)
    if version not in ("v2", "v4") or switches is None:
        raise ValueError(f"the memory estimator covers V1, V2 and V4 (got {version!r}): V3's Triton kernels keep "
                         "other tensors for their backward")
    native = torch.device(device).type == "cpu" or precision in ("bf16", "fp16")
    return Layout("sdpa" if switches.sdpa else "math", switches.fuse_qkv, switches.fuse_gate_up, native)


def compute_bytes(precision: str) -> int:
    """Bytes per element of the matmul inputs and outputs: 4 in fp32/tf32, 2 under bf16/fp16 autocast."""
    check_precision(precision)
    return torch.finfo(DTYPES[precision]).bits // 8


def block_terms(config: ModelConfig, batch: int, seq: int, precision: str, layout: Layout) -> dict[str, int]:
    """Bytes each part of one decoder block keeps for the backward (no checkpointing).

    - ``attention norm`` / ``MLP norm``: RMSNorm's fp32 input, 1/rms per row, and the normalised input
      before the weight: ``2*B*S*h*4 + B*S*4``;
    - ``QKV input`` / ``gate/up input``: the norm's output as the projections read it (a c-byte copy
      under autocast, one per projection: V1's three separate projections cast it three times);
    - ``RoPE tables``: under autocast the cos and sin tables cast to the compute dtype, for q and k;
    - ``attention``: math path: q and K/V repeated to every query head (``3*B*S*h*c``), the boolean
      causal mask (``S*S``), the fp32 probabilities (``B*H*S*S*4``) and under autocast their c-byte
      copy that the second matmul reads; SDPA: q, k, v (k and v with ``kv`` features when grouped
      heads are read in place; v is a view of V2's fused QKV output, so all of it is kept), the
      output and one fp32 log-sum-exp per row and head (``B*H*S*4``);
    - ``output projection input``: the heads merged back (a copy in the math path, a view of SDPA's
      output);
    - ``SwiGLU``: gate and up, silu(gate), and their product: ``4*B*S*I*c``.
    """
    c = compute_bytes(precision)
    h, kv, heads, inter = config.hidden_dim, config.kv_dim, config.num_heads, config.intermediate_dim
    tokens = batch * seq
    half = c != FP32
    norm = 2 * tokens * h * FP32 + tokens * FP32
    terms = {
        "attention norm": norm,
        "QKV input": (1 if layout.fused_qkv or not half else 3) * tokens * h * c,
        "RoPE tables": 4 * seq * config.head_dim * c if half else 0,
    }
    if layout.attention == "math":
        probabilities = batch * heads * seq * seq
        terms["attention"] = 3 * tokens * h * c + seq * seq + probabilities * FP32 + (probabilities * c if half else 0)
        terms["output projection input"] = tokens * h * c
    else:
        lse = batch * heads * seq * FP32
        if layout.native_gqa:
            qkv_output = tokens * (h + 2 * kv) * c if layout.fused_qkv else tokens * kv * c  # v (its storage)
            kept = tokens * h * c + tokens * kv * c + qkv_output  # q and k after RoPE, and v's storage
        else:
            kept = 3 * tokens * h * c  # q, and k, v repeated to every query head
        terms["attention"] = kept + tokens * h * c + lse  # + output + log-sum-exp
        terms["output projection input"] = 0
    terms["MLP norm"] = norm
    terms["gate/up input"] = (1 if layout.fused_gate_up or not half else 2) * tokens * h * c
    terms["SwiGLU"] = 4 * tokens * inter * c
    return terms


def linear_parameters(config: ModelConfig) -> int:
    """Parameters of the projections (the weights autocast casts): all but the embedding and the norms."""
    h = config.hidden_dim
    return config.num_parameters() - config.vocab_size * h - (2 * config.num_layers + 1) * h


def model_terms(config: ModelConfig, batch: int, seq: int, precision: str, checkpointed_layers: int = 0) -> dict[str, int]:
    """Bytes kept outside the blocks: the token ids (embedding), the final norm, the output head's input,
    the loss's fp32 log-probabilities and targets, and under autocast one c-byte copy of every
    projection weight (autocast casts each weight once per forward and the backward reads the copy;
    a checkpointed block's copies are made again in its recomputation, not kept)."""
    c = compute_bytes(precision)
    h, tokens = config.hidden_dim, batch * seq
    per_block = (linear_parameters(config) - config.vocab_size * h) // config.num_layers
    kept_weights = per_block * (config.num_layers - checkpointed_layers) + config.vocab_size * h
    return {
        "embedding": tokens * INDEX,
        "final norm": 2 * tokens * h * FP32 + tokens * FP32,
        "output head input": tokens * h * c,
        "loss": tokens * config.vocab_size * FP32 + tokens * INDEX + FP32,
        "autocast weight copies": kept_weights * c if c != FP32 else 0,
    }


def activation_terms(config: ModelConfig, batch: int, seq: int, precision: str = "fp32",
                     layout: Layout = Layout(), checkpointed_layers: int = 0) -> pd.DataFrame:
    """Every activation term of a forward pass: columns ``term``, ``scope`` (``per block`` or
    ``model``), ``blocks`` (how many blocks keep it), ``bytes`` (in all). With
    ``checkpointed_layers`` blocks checkpointed, those keep only their fp32 input (``B*S*h*4``)."""
    if not 0 <= checkpointed_layers <= config.num_layers:
        raise ValueError(f"checkpointed_layers must be 0..{config.num_layers} (got {checkpointed_layers})")
    kept = config.num_layers - checkpointed_layers
    rows = [{"term": t, "scope": "per block", "blocks": kept, "bytes": b * kept}
            for t, b in block_terms(config, batch, seq, precision, layout).items()]
    rows.append({"term": CHECKPOINT_TERM, "scope": "per block", "blocks": checkpointed_layers,
                 "bytes": checkpointed_layers * batch * seq * config.hidden_dim * FP32})
    rows += [{"term": t, "scope": "model", "blocks": 0, "bytes": b}
             for t, b in model_terms(config, batch, seq, precision, checkpointed_layers).items()]
    return pd.DataFrame(rows)


@dataclass
class MemoryEstimate:
    """The estimate of one configuration, in bytes."""

    parameters: int
    gradients: int
    optimizer_states: int
    activations: int  # kept from the forward for the backward
    recompute: int  # one checkpointed block's activations, rebuilt during the backward (0 without)
    backward_transient: int  # gradients alive beside the activations: the logits', and a math-path block's scores
    optimizer_transient: int  # temporaries of the (foreach) AdamW update
    terms: pd.DataFrame

    def peak_bytes(self) -> int:
        """The model of the peak: weights and AdamW state always; then either the start of the backward
        (all activations, a block being recomputed, the logits' gradient) or the optimizer step (all
        gradients and its temporaries), whichever is larger. Gradients grow while activations are freed
        during the backward, so the two ends bound the middle."""
        backward = self.activations + self.recompute + self.backward_transient
        update = self.gradients + self.optimizer_transient
        return self.parameters + self.optimizer_states + max(backward, update)

    def table(self) -> pd.DataFrame:
        """One row per kind, in MiB, with the peak last."""
        rows = [("parameters", self.parameters), ("gradients", self.gradients),
                ("optimizer states", self.optimizer_states), ("activations (saved for backward)", self.activations),
                ("recomputed block (checkpointing)", self.recompute),
                ("backward temporaries (logits, scores)", self.backward_transient),
                ("optimizer temporaries", self.optimizer_transient), ("peak (model)", self.peak_bytes())]
        return pd.DataFrame([{"kind": k, "mib": v / MIB} for k, v in rows])


def estimate_memory(config: ModelConfig, batch: int, seq: int, precision: str = "fp32", layout: Layout = Layout(),
                    checkpointed_layers: int = 0, fused_optimizer: bool = False) -> MemoryEstimate:
    """The memory of one training step (AdamW, fp32 master weights) for ``config`` at ``batch`` x
    ``seq``, ``precision`` and ``layout``, with ``checkpointed_layers`` blocks checkpointed."""
    params = config.num_parameters()
    terms = activation_terms(config, batch, seq, precision, layout, checkpointed_layers)
    one_block = sum(block_terms(config, batch, seq, precision, layout).values())
    logits = batch * seq * config.vocab_size
    c = compute_bytes(precision)
    # The math path's backward of one block also holds the gradients of its probabilities and scores
    # (two fp32 S x S tensors per head) while the activations are still there.
    scores_gradients = 2 * batch * config.num_heads * seq * seq * FP32 if layout.attention == "math" else 0
    return MemoryEstimate(
        parameters=params * FP32, gradients=params * FP32, optimizer_states=2 * params * FP32,
        activations=int(terms["bytes"].sum()), recompute=one_block if checkpointed_layers else 0,
        # d(loss)/d(log-probabilities) in fp32, and d(loss)/d(logits) in the compute dtype
        backward_transient=logits * FP32 + logits * c + scores_gradients,
        # foreach AdamW: about one fp32 temporary per parameter; the fused kernel works in place
        optimizer_transient=0 if fused_optimizer else params * FP32,
        terms=terms,
    )


# ------------------------------------------------------------------------------------------------
# The measurement each term is checked against
# ------------------------------------------------------------------------------------------------


def term_of_module(name: str) -> str:
    """The term a tensor saved inside module ``name`` (``named_modules()``) belongs to."""
    parts = name.split(".")
    if parts[0] == "layers" and len(parts) >= 3:
        part = ".".join(parts[2:])
        table = {"attn_norm": "attention norm", "attn.q_proj": "QKV input", "attn.k_proj": "QKV input",
                 "attn.v_proj": "QKV input", "attn.qkv_proj": "QKV input", "attn.rope": "RoPE tables",
                 "attn": "attention", "attn.o_proj": "output projection input", "mlp_norm": "MLP norm",
                 "mlp.gate_proj": "gate/up input", "mlp.up_proj": "gate/up input",
                 "mlp.gate_up_proj": "gate/up input", "mlp": "SwiGLU", "mlp.down_proj": "SwiGLU"}
        if part in table:
            return table[part]
    return {"embed": "embedding", "norm": "final norm", "lm_head": "output head input", "": "loss"}.get(name, name)


def measure_activation_terms(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                             precision: str = "fp32") -> pd.DataFrame:
    """What one forward pass really keeps for the backward, by term: every tensor autograd saves is
    recorded with ``torch.autograd.graph.saved_tensors_hooks``, each storage once, and assigned to the
    innermost module running when it was saved (:func:`term_of_module`); parameters and buffers are
    left out; cast copies of a projection's weight count as ``autocast weight copies``.

    A checkpointed block saves through checkpoint's own hooks (nothing reaches these); what reaches
    them is its input, kept for the recomputation: counted as ``checkpointed block input``. Runs the
    backward afterwards (which frees everything). Columns ``term``, ``bytes``, ``tensors``.
    """
    model_ = unwrap(model)
    device = inputs.device
    names = {module: name for name, module in model_.named_modules()}
    names_to_modules = dict(model_.named_modules())
    weights = {tuple(m.weight.shape) for m in model_.modules() if isinstance(m, nn.Linear)}
    stack: list[str] = []

    def is_weight_copy(tensor: torch.Tensor) -> bool:
        # A projection's weight cast by autocast: half precision, the weight's shape, or its transpose
        # as a view (what the matmul saves); an activation of the same shape would be contiguous.
        if tensor.dtype not in (torch.float16, torch.bfloat16) or tensor.dim() != 2:
            return False
        return (tuple(tensor.shape) in weights and tensor.is_contiguous()) or \
            (tuple(tensor.t().shape) in weights and tensor.t().is_contiguous() and not tensor.is_contiguous())

    def term_of(tensor: torch.Tensor) -> str:
        if not stack:
            term = "loss"  # saved outside the model: the cross-entropy
        elif stack[-1] == "":
            # The model's own forward saves nothing but what torch.utils.checkpoint keeps of a
            # checkpointed block: its input, saved before the block runs.
            term = CHECKPOINT_TERM
        elif names_to_modules[stack[-1]].__class__.__name__.endswith("Linear") and is_weight_copy(tensor):
            term = "autocast weight copies"
        else:
            term = term_of_module(stack[-1])
        return term

    def enter(module: nn.Module, args: tuple) -> None:
        stack.append(names[module])

    def leave(module: nn.Module, args: tuple, output: object) -> None:
        stack.pop()

    handles = []
    for module in model_.modules():
        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave))
    try:
        with saved_for_backward(exclude=[*model_.parameters(), *model_.buffers()], label=term_of) as saved:
            with autocast_context(precision, device):
                logits = model(inputs)
            loss = lm_loss(logits, targets)
        del logits
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    rows: dict[str, list[int]] = {}
    for tensor in saved.values():
        rows.setdefault(tensor.label, []).append(tensor.nbytes)
    return pd.DataFrame([{"term": t, "bytes": sum(b), "tensors": len(b)} for t, b in rows.items()])


def compare_terms(estimated: pd.DataFrame, measured: pd.DataFrame) -> pd.DataFrame:
    """Estimated against measured bytes per term (both frames have ``term`` and ``bytes``): columns
    ``term``, ``estimated_mib``, ``measured_mib``, ``error_pct`` (estimate relative to measurement;
    NaN where nothing was measured), with a total row last."""
    est = estimated.groupby("term", sort=False)["bytes"].sum()
    mea = measured.groupby("term", sort=False)["bytes"].sum()
    order = [t for t in (*BLOCK_TERMS, CHECKPOINT_TERM, *MODEL_TERMS) if t in est.index or t in mea.index]
    order += [t for t in mea.index if t not in order]  # anything unexpected shows up, not hidden
    frame = pd.DataFrame({"term": order, "estimated_mib": [est.get(t, 0) / MIB for t in order],
                          "measured_mib": [mea.get(t, 0) / MIB for t in order]})
    frame = frame[(frame["estimated_mib"] > 0) | (frame["measured_mib"] > 0)].reset_index(drop=True)
    total = pd.DataFrame([{"term": "total", "estimated_mib": frame["estimated_mib"].sum(),
                           "measured_mib": frame["measured_mib"].sum()}])
    frame = pd.concat([frame, total], ignore_index=True)
    measured_mib = frame["measured_mib"].where(frame["measured_mib"] > 0)
    frame["error_pct"] = 100 * (frame["estimated_mib"] - measured_mib) / measured_mib
    return frame


def peak_error(estimate: MemoryEstimate, measured_peak_bytes: float | None) -> float | None:
    """(estimate - measured) / measured of the peak, or None where nothing was measured (a CPU)."""
    if not measured_peak_bytes:
        return None
    return (estimate.peak_bytes() - measured_peak_bytes) / measured_peak_bytes


def allocator_peaks(device: torch.device | str) -> dict[str, float]:
    """The caching allocator's peaks since the last reset, in MiB, NaN where it keeps none (a CPU):
    ``peak_memory_mib`` (allocated: the tensors' blocks, rounded up to the allocator's block sizes),
    ``requested_peak_mib`` (the bytes the program asked for, before rounding) and ``reserved_peak_mib``
    (the segments taken from the driver: allocated plus cached and fragmented space). Between the estimate
    and the requested bytes lie what the model of the peak leaves out (library workspaces, temporaries);
    between requested and allocated, rounding; between allocated and reserved, the cache."""
    device = torch.device(device)
    names = {"peak_memory_mib": "allocated_bytes.all.peak", "requested_peak_mib": "requested_bytes.all.peak",
             "reserved_peak_mib": "reserved_bytes.all.peak"}
    if device.type != "cuda":
        return {name: float("nan") for name in names}
    stats = torch.cuda.memory_stats(device)
    return {name: stats[key] / MIB if key in stats else float("nan") for name, key in names.items()}


__all__ = ["BLOCK_TERMS", "CHECKPOINT_TERM", "Layout", "MODEL_TERMS", "MemoryEstimate", "activation_terms",
           "allocator_peaks", "block_terms", "compare_terms", "estimate_memory", "measure_activation_terms", "model_layout",
           "model_terms", "peak_error", "term_of_module"]
