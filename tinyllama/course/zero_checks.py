"""The check of notebook 21's ZeRO exercise (21.6): the bytes one rank keeps for the model's state in bf16
mixed-precision training with AdamW, part by part, at ZeRO stages 0 to 3, against
``tinyllama.harness.distributed.zero_state_bytes``.

The participant's function returns the four parts (bf16 parameters, bf16 gradients, fp32 master weights,
AdamW's fp32 moments) so that mistakes with the same total tell apart: forgetting the master copy and
counting the two moments as one both remove 4 bytes a parameter. Each part is compared on cases with a
parameter count that does not split evenly and several world sizes (one rank included, where every
stage is the same), and a wrong part is matched with the typical mistakes (:data:`SLIPS`) to name its
cause."""

from __future__ import annotations

from typing import Callable, Sequence

from tinyllama.course.checkpoints import checkpoint
from tinyllama.harness.distributed import ZERO_PARTS, zero_state_bytes

# World sizes 4 and 8 (and 1): on 2 ranks half a part and a part divided by N are the same number, and
# the feedback could not tell "one moment" from "sharded at stage 0".
CASES: tuple[tuple[int, int, int], ...] = tuple((p, stage, n) for stage in (0, 1, 2, 3)
                                                for p, n in ((1_000_003, 4), (5_000, 8), (7_777, 1)))

# Which stage first shards each part.
_SHARDED_FROM = {"parameters": 3, "gradients": 2, "master weights": 1, "optimizer moments": 1}
_BYTES = {"parameters": 2, "gradients": 2, "master weights": 4, "optimizer moments": 8}


def _cause(part: str, num: int, stage: int, world: int, got: float) -> str:
    """Why ``got`` is wrong for ``part``: the typical mistake it equals, else what the part is."""
    def near(value: float) -> bool:
        return abs(got - value) <= max(1.0, 1e-6 * abs(value))

    full = _BYTES[part] * num
    sharded = stage >= _SHARDED_FROM[part]
    if part == "master weights" and near(0):
        return ("the fp32 master copy is missing: in bf16 mixed precision AdamW updates fp32 weights (4 bytes a "
                "parameter) and casts them to the bf16 ones the model computes with")
    if part == "optimizer moments" and near((full / world if sharded else full) / 2):
        return "AdamW keeps two moments per parameter (exp_avg and exp_avg_sq), 4 bytes each in fp32"
    if part in ("parameters", "gradients") and near(2 * (full / world if sharded else full)):
        return f"the {part} the model computes with are bf16: 2 bytes a parameter"
    if world > 1 and sharded and near(full):
        return f"stage {stage} shards the {part} over the ranks (from stage {_SHARDED_FROM[part]} on): divide by N"
    if world > 1 and not sharded and near(full / world):
        if stage == 0:
            return "stage 0 (plain DDP) shards nothing: every rank keeps the whole state"
        return (f"stage {stage} keeps the whole {part} on every rank: stage 1 shards the optimizer state (master "
                "copy and moments), stage 2 the gradients too, stage 3 the parameters too")
    return f"{part}: {_BYTES[part]} bytes a parameter, divided by N from stage {_SHARDED_FROM[part]} on"


def check_zero_formula(formula: Callable[[int, int, int], dict], cases: Sequence[tuple[int, int, int]] = CASES) -> bool:
    """``formula(num_parameters, stage, world_size)`` returns the bytes of each of :data:`ZERO_PARTS` one rank
    keeps; checked part by part on ``cases``, each wrong part with its likely cause (at most one line per
    cause)."""
    wrong: dict[str, str] = {}
    for num, stage, world in cases:
        got = formula(num, stage, world)
        if not isinstance(got, dict) or set(got) != set(ZERO_PARTS):
            return checkpoint(False, "", f"return a dict with the keys {', '.join(map(repr, ZERO_PARTS))} "
                                         f"(got {got!r:.120})")
        expected = zero_state_bytes(num, stage, world)
        for part in ZERO_PARTS:
            value = float(got[part])
            # A shard rounded up or down (ceil or floor of num / N) is right too.
            if abs(value - expected[part]) > _BYTES[part] + 1e-6 * expected[part]:
                cause = _cause(part, num, stage, world, value)
                wrong.setdefault(cause, f"stage {stage}, {world} rank(s), {num:,} parameters, {part}: "
                                        f"{value:,.0f} bytes, expected {expected[part]:,.0f} ({cause})")
    return checkpoint(not wrong, f"the ZeRO memory formula matches on {len(cases)} cases, part by part",
                      "the ZeRO memory formula is off:\n  - " + "\n  - ".join(wrong.values()))
