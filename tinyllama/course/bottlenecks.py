"""The checks of notebook 11 (finding the bottlenecks of V1), with feedback that names the likely mistake.

- :func:`check_classifier`: a participant's ``classify(operator, module)`` against known cases, the
  tricky ones included (a softmax that belongs to the loss, a multiply inside RMSNorm, an add inside a
  projection's backward), each with the reason for its category;
- :func:`check_mfu`: an MFU against the value its inputs give, with the usual slips recognised by
  their factor (forward FLOPs only, MACs for FLOPs, percent for a fraction, milliseconds for seconds);
- :func:`check_roof_time`: a participant's time-at-the-roof function on fresh random operators, the typical
  mistakes (:data:`ROOF_SLIPS`: a sum, the smaller time, seconds, a missing 1e12, Python's ``max``) named;
- :func:`check_step_speedup`: a participant's Amdahl's-law step speed-up on fresh random shares, the typical
  mistakes (:data:`SPEEDUP_SLIPS`) named (:func:`check_function_slips` compares a wrong answer with each);
- :func:`check_prediction`: a predicted step speed-up is a plausible number (not graded);
- :func:`cast_time`: the time autocast's dtype casts take inside a profile of operators;
- :func:`roof_bands`: how the step's time spreads over operators near and far from their roof.

The categories are those of :data:`CATEGORIES`; each one is the target of one remedy of notebooks
12-17 (fused projections, fused kernels, flash attention, compilation).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import pandas as pd
import torch

from tinyllama.course.checkpoints import check_between, checkpoint
from tinyllama.course.feedback import Slip, check_function_slips, slip_hint

CATEGORIES = ("attention", "attn_proj", "ffn", "norm", "elementwise", "other")
LABELS = {
    "attention": "attention core (scores, mask, softmax, p·v)",
    "attn_proj": "attention projections (q, k, v, o GEMMs)",
    "ffn": "feed-forward GEMMs (gate, up, down)",
    "norm": "RMSNorm",
    "elementwise": "element-wise (RoPE, SiLU·up, residual adds, casts)",
    "other": "other (embedding, output head, loss, optimizer)",
}

# (operator, module, expected category, why): module paths as the profile of V1 names them.
CASES: list[tuple[str, str, str, str]] = [
    ("aten::mm", "layers.3.mlp.down_proj", "ffn", "a matrix multiply inside a feed-forward projection"),
    ("aten::mm", "layers.0.mlp.gate_proj", "ffn", "backward matmuls of the gate projection are feed-forward GEMMs too"),
    ("aten::mm", "layers.0.attn.q_proj", "attn_proj", "the query projection: a GEMM that fused projections change"),
    ("aten::addmm", "layers.2.attn.o_proj", "attn_proj", "the output projection of attention (addmm: a GEMM with a bias)"),
    ("aten::bmm", "layers.0.attn", "attention", "q kᵀ and p v are GEMMs, but they belong to the attention core "
                                               "that flash attention replaces, not to a projection"),
    ("aten::_softmax", "layers.2.attn", "attention", "the softmax over the attention scores"),
    ("aten::masked_fill", "layers.1.attn", "attention", "the causal mask is part of the attention core"),
    ("aten::_softmax_backward_data", "layers.1.attn", "attention", "the softmax's backward, still attention"),
    ("aten::repeat_interleave", "layers.0.attn", "attention", "copying K/V heads for their query heads (GQA)"),
    ("aten::_log_softmax", "", "other", "the loss's log-softmax, outside every block: not attention despite "
                                         "'softmax' in its name"),
    ("aten::mul", "layers.1.attn_norm", "norm", "a multiply inside RMSNorm is normalisation work"),
    ("aten::mean", "norm", "norm", "the final norm (module 'norm') is RMSNorm too"),
    ("aten::mul", "layers.1.mlp", "elementwise", "SwiGLU's silu(gate) * up: element-wise, not a GEMM"),
    ("aten::silu_backward", "layers.0.mlp", "elementwise", "the backward of SiLU"),
    ("aten::mul", "layers.1.attn.rope", "elementwise", "RoPE rotates with multiplies and adds"),
    ("aten::cat", "layers.1.attn.rope", "elementwise", "RoPE's half rotation: a copy-like element-wise op"),
    ("aten::add", "layers.4", "elementwise", "the residual add of a block"),
    ("aten::add", "layers.0.attn.k_proj", "elementwise", "in the backward, an add inside a projection sums the "
                                                        "gradients of its input: element-wise, not a GEMM"),
    ("aten::mm", "lm_head", "other", "the output head: a GEMM, but neither attention nor feed-forward"),
    ("aten::embedding_dense_backward", "embed", "other", "the embedding's backward"),
    ("aten::_foreach_mul_", "", "other", "the optimizer: 'mul' in its name, but outside every module"),
]


def check_classifier(classify: Callable[[str, str], str]) -> bool:
    """``classify(operator, module)`` gives the expected category for every case of :data:`CASES`."""
    wrong = []
    for operator, module, expected, why in CASES:
        try:
            got = classify(operator, module)
        except NotImplementedError:
            raise
        except Exception as error:  # noqa: BLE001 - the participant's code: say where it failed
            got = f"{type(error).__name__}: {error}"
        if got != expected:
            wrong.append(f"classify({operator!r}, {module!r}) gave {got!r}, expected {expected!r}: {why}")
    unknown = sorted({c for *_, c, _ in CASES} - set(CATEGORIES))
    assert not unknown, unknown
    invented = sorted({got for operator, module, *_ in CASES
                       if isinstance(got := _safe(classify, operator, module), str) and got not in CATEGORIES})
    note = (f"\n  {', '.join(repr(c) for c in invented)} is not one of the categories: return one of "
            f"{', '.join(CATEGORIES)} (a module's name is not a category)" if invented else "")
    return checkpoint(not wrong, f"classify puts all {len(CASES)} known operators in the right category",
                      f"{len(wrong)} of {len(CASES)} operators in the wrong category (categories: "
                      f"{', '.join(CATEGORIES)}):\n  - " + "\n  - ".join(wrong) + note)


def _safe(classify: Callable[[str, str], str], operator: str, module: str) -> Any:
    try:
        return classify(operator, module)
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001 - check_classifier reports the error itself
        return None


# Factors by which a plausible slip moves an MFU, and the slip.
_MFU_SLIPS = [
    (1 / 3, "a third of the expected value: were only the forward pass's FLOPs counted? A training step is "
            "forward + backward, and the backward does about twice the forward's matmul work"),
    (2 / 3, "two thirds of the expected value: the backward was counted as one forward's worth; it does two "
            "matmuls (the input's gradient and the weight's) for every forward matmul, so a step is 3x the forward"),
    (1 / 2, "half the expected value: were multiply-accumulates (MACs) taken for FLOPs? One MAC is two FLOPs"),
    (2.0, "twice the expected value: forward_flops already counts FLOPs (2 x MACs); doubling it again counts each "
          "multiply-add twice"),
    (1 / 6, "a sixth of the expected value: forward only, and MACs instead of FLOPs"),
    (100.0, "100x the expected value: a percentage where a fraction was asked for (0.25, not 25)"),
    (1e3, "1000x the expected value: the step time converted the wrong way (ms / 1e6, or s x 1e3?) or GFLOP/s taken "
          "for TFLOP/s"),
    (1e-3, "1/1000 of the expected value: the step time in milliseconds used as seconds? Divide a time in ms by "
           "1e3 for seconds"),
    (1e12, "1e12 times the expected value: the achieved rate is in FLOP/s and the ceiling in TFLOP/s: divide the rate "
           "by 1e12 (or multiply the ceiling by it)"),
    (1e-12, "1e-12 times the expected value: FLOP/s divided by TFLOP/s without the 1e12"),
]


def check_mfu(mfu: float, forward_flops: float, step_ms: float, ceiling_tflops: float) -> bool:
    """``mfu`` (a fraction) against the FLOPs of one training step (3 x ``forward_flops``: the backward
    does twice the forward's matmul work) / step time / measured ceiling."""
    training_flops = 3 * forward_flops
    expected = training_flops / (step_ms / 1e3) / (ceiling_tflops * 1e12)
    hint = slip_hint(float(mfu), expected, _MFU_SLIPS)
    return check_between("MFU", float(mfu), 0.97 * expected, 1.03 * expected, hint=hint,
                         why=f"FLOPs of one training step (3 x forward = {training_flops:.3g}) / step time ({step_ms:.4g} ms) / "
                             f"the measured ceiling ({ceiling_tflops:.4g} TFLOP/s) gives {expected:.4g}.")


def _roof_inputs(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    """Random operators spanning memory-bound and compute-bound, and a random device."""
    flops = torch.exp(torch.empty(shape, dtype=torch.float64).uniform_(math.log(1e3), math.log(1e13)))
    nbytes = torch.exp(torch.empty(shape, dtype=torch.float64).uniform_(math.log(1e3), math.log(1e11)))
    peak_tflops = float(torch.empty(()).uniform_(0.05, 1000.0))
    bandwidth_tbs = float(torch.empty(()).uniform_(0.01, 6.0))
    return flops, nbytes, peak_tflops, bandwidth_tbs


def _roof_reference(flops: torch.Tensor, nbytes: torch.Tensor, peak_tflops: float, bandwidth_tbs: float) -> torch.Tensor:
    return 1e3 * torch.maximum(flops / (peak_tflops * 1e12), nbytes / (bandwidth_tbs * 1e12))


ROOF_SLIPS: tuple[Slip, ...] = (
    Slip("sum", "you add the two times: the arithmetic and the memory traffic overlap, so the operator needs the "
                "larger of the two, not their sum",
         lambda f, b, p, w: 1e3 * (f / (p * 1e12) + b / (w * 1e12))),
    Slip("min", "you take the smaller of the two times: the operator is done only when both its arithmetic and its "
                "bytes are, so it needs the larger one",
         lambda f, b, p, w: 1e3 * torch.minimum(f / (p * 1e12), b / (w * 1e12))),
    Slip("seconds", "your times are in seconds (1/1000 of the reference): the answer is in milliseconds, x 1e3",
         lambda f, b, p, w: torch.maximum(f / (p * 1e12), b / (w * 1e12))),
    Slip("microseconds", "your times are in microseconds (1000x the reference): the answer is in milliseconds",
         lambda f, b, p, w: 1e6 * torch.maximum(f / (p * 1e12), b / (w * 1e12))),
    Slip("no 1e12", "your times are 1e12x the reference: TFLOP/s and TB/s are 1e12 FLOP and bytes per second",
         lambda f, b, p, w: 1e3 * torch.maximum(f / p, b / w)),
    Slip("GB/s", "the memory time is 1000x too long: 1 TB/s is 1e12 bytes per second, not 1e9",
         lambda f, b, p, w: 1e3 * torch.maximum(f / (p * 1e12), b / (w * 1e9))),
    Slip("python max", "Python's max (or an if) compares whole tensors and fails for more than one operator: "
                       "torch.maximum takes the larger value element by element", error="ambiguous"),
)


def check_roof_time(time_at_roof_ms: Callable[..., torch.Tensor]) -> bool:
    """``time_at_roof_ms(flops, nbytes, peak_tflops, bandwidth_tbs)`` (tensors of operators, two rates)
    against the reference on random operators that are memory- and compute-bound; a typical mistake
    (:data:`ROOF_SLIPS`) is named."""
    return check_function_slips("time_at_roof_ms", time_at_roof_ms, _roof_reference, _roof_inputs,
                                shapes=[(1,), (7,), (33,)], slips=ROOF_SLIPS, atol=0.0, rtol=1e-6,
                                hint="An operator needs at least the time for its arithmetic at the compute roof and "
                                     "at least the time for its bytes at the memory roof; both happen at once.")


def _speedup_inputs(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    share = torch.rand(shape, dtype=torch.float64) * 0.98 + 0.01
    local = torch.exp(torch.empty(shape, dtype=torch.float64).uniform_(0.0, math.log(50.0)))
    return share, local


def _speedup_reference(share: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    return 1.0 / ((1.0 - share) + share / local)


SPEEDUP_SLIPS: tuple[Slip, ...] = (
    Slip("new time", "that is the new step time as a fraction of the old one; the speed-up is old / new, its inverse",
         lambda s, k: (1.0 - s) + s / k),
    Slip("weighted speed-ups", "you average the speed-ups weighted by share (1 - share + share x local): speed-ups do "
                               "not add up, times do. Add the times of both parts, then take old / new",
         lambda s, k: (1.0 - s) + s * k),
    Slip("multiplied", "the touched part's time is multiplied by the local speed-up; a speed-up divides its time",
         lambda s, k: 1.0 / ((1.0 - s) + s * k)),
    Slip("limit", "that is the limit for a part that takes no time at all, 1 / (1 - share): the touched part still "
                  "takes share / local_speedup",
         lambda s, k: 1.0 / (1.0 - s)),
    Slip("whole step", "the whole step is sped up by the local speed-up: only the share the remedy touches gets "
                       "faster, the rest keeps its time",
         lambda s, k: k + 0.0 * s),
)


def check_step_speedup(step_speedup: Callable[..., torch.Tensor]) -> bool:
    """``step_speedup(share, local_speedup)`` (Amdahl's law) on random shares and local speed-ups; a typical
    mistake (:data:`SPEEDUP_SLIPS`) is named."""
    return check_function_slips("step_speedup", step_speedup, _speedup_reference, _speedup_inputs,
                                shapes=[(1,), (9,), (40,)], slips=SPEEDUP_SLIPS, atol=0.0, rtol=1e-9,
                                hint="Only the share of the step that the remedy touches gets faster; the rest of the "
                                     "step takes as long as before. Write the new step time as a fraction of the old "
                                     "one.")


def check_prediction(name: str, speedup: float) -> bool:
    """A predicted step speed-up (old / new step time) is a plausible number; predictions are not graded."""
    return check_between(name, float(speedup), 1.0, 10.0,
                         why="A step-time ratio old/new: below 1 would mean the remedy slows the step down, and "
                             "above 10 the part it speeds up would have to be over 90% of the step and vanish. "
                             "Inside that range any prediction is fine: notebooks 12-17 measure it.")


def check_rank(rank: str) -> bool:
    """``rank`` is at least two known categories, most costly first, separated by '>'."""
    parts = [p.strip() for p in str(rank).split(">")]
    unknown = [p for p in parts if p not in CATEGORIES]
    ok = len(parts) >= 2 and not unknown and len(set(parts)) == len(parts)
    return checkpoint(ok, f"bottleneck_rank {rank!r} ranks {len(parts)} categories",
                      f"bottleneck_rank {rank!r} should be two or more distinct categories from "
                      f"{', '.join(CATEGORIES)}, most costly first, joined by '>'"
                      + (f" (unknown: {', '.join(unknown)})" if unknown else ""))


# The operator a dtype cast runs as (``tensor.to(dtype)`` and autocast's casts both reach it); its copy kernel
# is its device time. ``aten::to`` and ``aten::copy_`` are left out: the first only calls it, and the second
# also copies without a cast (contiguous copies, optimizer updates).
CAST_OPERATORS = ("aten::_to_copy",)


def cast_time(ops: pd.DataFrame) -> dict[str, float]:
    """Autocast's dtype casts in a profile of operators (``modules.profile_modules``' rows: ``operator``,
    ``category``, ``time_ms`` and ``calls_per_step`` per step): their calls, time, share of the profiled
    time and share of the element-wise category they are sorted into. Zeros where nothing casts (fp32)."""
    casts = ops[ops["operator"].isin(CAST_OPERATORS)]
    total = float(ops["time_ms"].sum())
    elementwise = float(ops.loc[ops["category"] == "elementwise", "time_ms"].sum())
    time_ms = float(casts["time_ms"].sum())
    in_elementwise = float(casts.loc[casts["category"] == "elementwise", "time_ms"].sum())
    return {"calls": float(casts["calls_per_step"].sum()), "time_ms": time_ms,
            "share_of_step": time_ms / total if total else 0.0,
            "share_of_elementwise": in_elementwise / elementwise if elementwise else 0.0}


def roof_bands(time_ms: Sequence[float], over_roof: Sequence[float],
               edges: Sequence[float] = (2.0, 10.0)) -> pd.Series:
    """The share of ``time_ms`` (operators' times per step) held by operators within ``edges[0]`` x their
    roof time, between the edges, and beyond the last one, by their ``over_roof`` (measured / roof time)."""
    frame = pd.DataFrame({"time_ms": list(time_ms), "over": list(over_roof)})
    bounds = [0.0, *edges, float("inf")]
    labels = [f"within {edges[0]:g}x"] + [f"{a:g}-{b:g}x" for a, b in zip(edges, edges[1:])] + [f"over {edges[-1]:g}x"]
    bands = pd.cut(frame["over"], bounds, labels=labels, right=True)
    shares = frame.groupby(bands, observed=False)["time_ms"].sum() / frame["time_ms"].sum()
    return shares.reindex(labels, fill_value=0.0)

