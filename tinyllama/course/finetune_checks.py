"""Checks of notebook 20's counting exercises (the fine-tuning lab), with a slip model each: a wrong number
is compared with what each typical mistake gives at the same sizes, and the message names the one it
matches.

- :func:`check_swiglu_bytes` (exercise 20.1): the bytes a SwiGLU block keeps for the backward, in fp32
  and under bf16 autocast (:func:`swiglu_slips`);
- :func:`check_kept_per_block` and :func:`check_recompute_fraction` (exercise 20.3): what a checkpointed
  block keeps, and the extra work of recomputing it (:func:`kept_slips`, :data:`RECOMPUTE_SLIPS`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tinyllama.config import ModelConfig
from tinyllama.costs.memory_estimate import Layout, block_terms
from tinyllama.course.checkpoints import check_between, check_close, checkpoint
from tinyllama.course.feedback import NumberSlip

PRECISIONS = ("fp32", "bf16")  # the two answers of 20.1, in the order the check cell checks them
BYTES = {"fp32": 4, "bf16": 2}


def name_count_slip(answer: float, precision: str, slips: Sequence[NumberSlip], answers: dict[str, float] | None = None,
                    expected: float | None = None, rel_tol: float = 0.01) -> NumberSlip | None:
    """The slip of ``slips`` whose value at ``precision`` is ``answer`` (within ``rel_tol``). Where several
    agree there, the one that also explains the participant's other ``answers`` (precision -> number) is
    named; a slip that gives ``expected`` is never named (it is no mistake at these sizes)."""
    def close(a: float, b: float) -> bool:
        return math.isfinite(a) and math.isclose(a, b, rel_tol=rel_tol)

    matching = [slip for slip in slips if close(answer, slip.value(precision))
                and (expected is None or not close(slip.value(precision), expected))]
    if len(matching) > 1 and answers:
        everywhere = [slip for slip in matching if all(close(float(v), slip.value(p)) for p, v in answers.items())]
        matching = everywhere or matching
    return matching[0] if matching else None


# ---- exercise 20.1: the SwiGLU's bytes per block ----------------------------------------------------------------


def swiglu_slips(batch: int, seq: int, intermediate: int, hidden: int) -> tuple[NumberSlip, ...]:
    """The typical wrong counts of the bytes a SwiGLU keeps per block, at these sizes (the right one:
    gate, up, silu(gate) and their product, ``4 * B * S * I`` values of the compute dtype's bytes)."""
    bsi = batch * seq * intermediate
    return (
        NumberSlip("three tensors", lambda p: 3 * bsi * BYTES[p],
                  "you counted three B x S x I tensors; the backward also needs a fourth: gate and up (the two "
                  "projections' outputs), silu(gate), and their product, which down_proj reads"),
        NumberSlip("bf16 as fp32", lambda p: 4 * bsi * 4,
                  "under bf16 autocast the projections compute in bf16, so what they output and the SwiGLU keeps "
                  "is 2 bytes per value, not the 4 of fp32"),
        NumberSlip("hidden for intermediate", lambda p: 4 * batch * seq * hidden * BYTES[p],
                  "your tensors have the hidden size h; the SwiGLU's tensors are B x S x I, with the intermediate "
                  "size I (config.intermediate_dim)"),
        NumberSlip("elements", lambda p: 4 * bsi,
                  "that counts values, not bytes: multiply by the bytes per value (4 in fp32, 2 under bf16 autocast)"),
        NumberSlip("MiB", lambda p: 4 * bsi * BYTES[p] / 2**20,
                  "that is in MiB (divided by 2**20); the answer is in bytes"),
    )


def check_swiglu_bytes(precision: str, swiglu_fp32: float, swiglu_bf16: float, measured: float, derived: float,
                       batch: int, seq: int, intermediate: int, hidden: int) -> bool:
    """Exercise 20.1 at one ``precision``: the participant's bytes for it against what autograd saved per
    block (``measured``; ``derived``: the estimate's formula). A wrong number is compared with each typical
    mistake of :func:`swiglu_slips` at the same sizes (both answers together where two slips give one
    number at one precision) and the one it matches is named."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)} (got {precision!r})")
    answers = {"fp32": swiglu_fp32, "bf16": swiglu_bf16}
    yours = float(answers[precision])
    slip = name_count_slip(yours, precision, swiglu_slips(batch, seq, intermediate, hidden), answers, measured)
    hint = slip.message if slip is not None else (
        f"autograd saved {measured / 2**20:.3f} MiB per block ({measured / (batch * seq * intermediate):.0f} bytes "
        f"per (token, intermediate feature)); the formula gives {derived / 2**20:.3f} MiB. How many tensors of "
        "B x S x I elements, and how many bytes each?")
    return check_close(f"your SwiGLU bytes per block, {precision}", yours, measured, rel_tol=0.01, hint=hint)


# ---- exercise 20.3: the checkpointing trade -------------------------------------------------------------------


def kept_slips(config: ModelConfig, batch: int, seq: int, precision: str, layout: Layout) -> tuple[NumberSlip, ...]:
    """The typical wrong counts of what a checkpointed block keeps (the right one: its fp32 input,
    ``B * S * h * 4`` bytes), at these sizes."""
    values = batch * seq * config.hidden_dim
    whole_block = sum(block_terms(config, batch, seq, precision, layout).values())
    return (
        NumberSlip("residual in 2 bytes", lambda p: values * 2,
                  "that counts 2 bytes per value; the residual stream, the block's input, stays fp32 (4 bytes) also "
                  "under autocast: only the matmuls read and write 16-bit values"),
        NumberSlip("every tensor", lambda p: whole_block,
                  "that is what a block keeps without checkpointing (every tensor its backward needs); a "
                  "checkpointed block keeps only its input and recomputes the rest"),
        NumberSlip("all blocks", lambda p: values * 4 * config.num_layers,
                  f"that is every block's input together ({config.num_layers} blocks); the answer is per block"),
        NumberSlip("values", lambda p: values,
                  "that counts values, not bytes: the block's input is fp32, 4 bytes per value"),
        NumberSlip("MiB", lambda p: values * 4 / 2**20, "that is in MiB (divided by 2**20); the answer is in bytes"),
    )


def check_kept_per_block(kept_per_block: float, expected: float, config: ModelConfig, batch: int, seq: int,
                         precision: str, layout: Layout) -> bool:
    """Exercise 20.3, first part: ``kept_per_block`` is what one checkpointed block keeps (``expected``, from
    :func:`tinyllama.costs.memory_estimate.estimate_memory`), else the typical mistake it matches
    (:func:`kept_slips`) is named."""
    slip = name_count_slip(float(kept_per_block), precision, kept_slips(config, batch, seq, precision, layout),
                           expected=expected)
    hint = slip.message if slip is not None else (
        "only the block's input: batch x sequence x hidden values, in the dtype of the residual stream (fp32, also "
        "under autocast)")
    return check_close("kept_per_block", float(kept_per_block), expected, rel_tol=0.01, hint=hint)


RECOMPUTE_RANGE = (0.25, 0.40)
RECOMPUTE_WHY = "one extra forward of the blocks on top of forward (1) + backward (about 2): about 1/3."

# Typical wrong extra work of checkpointing: (the value, how close counts as it, what it is).
RECOMPUTE_SLIPS: tuple[tuple[float, float, str], ...] = (
    (1.0, 0.02, ("that recomputes the whole step; checkpointing runs only the forward of the blocks again, not the "
                 "backward or the optimizer: one forward on top of forward + backward")),
    (0.5, 0.02, ("that counts the backward as one forward; a backward costs about two (the gradients for the inputs "
                 "and for the weights), so a step without checkpointing is about three forwards")),
    (0.25, 0.02, ("that is the extra forward as a share of the step with checkpointing (1 of its 4 forwards); the "
                  "question asks for a share of the step without it (3 forwards)")),
    (100 / 3, 0.05, "that is a percent; recompute_fraction is a fraction (the cell prints it x 100)"),
)


def check_recompute_fraction(recompute_fraction: float) -> bool:
    """Exercise 20.3, second part: the extra FLOPs of checkpointing as a fraction of a step without it,
    about 1/3; a value that matches a typical mistake (:data:`RECOMPUTE_SLIPS`, 1/4 included, which lies
    on the plausible range's edge) fails with that mistake named."""
    value = float(recompute_fraction)
    for wrong, rel_tol, message in RECOMPUTE_SLIPS:
        if math.isclose(value, wrong, rel_tol=rel_tol):
            return checkpoint(False, "", f"recompute_fraction = {value:.4g}: {message}.")
    return check_between("recompute_fraction", value, *RECOMPUTE_RANGE, why=RECOMPUTE_WHY,
                         hint="count FLOPs: a forward is about 1, its backward about 2")


__all__ = [
    "RECOMPUTE_SLIPS",
    "check_kept_per_block",
    "check_recompute_fraction",
    "check_swiglu_bytes",
    "kept_slips",
    "name_count_slip",
    "swiglu_slips",
]
