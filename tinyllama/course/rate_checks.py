"""Checks of the rate formulas and the ceiling choice that notebooks 00 and 01 ask for.

- :func:`check_formula`: a participant's formula (a function of a few numbers) against the reference on
  given cases; a wrong answer is diagnosed by the factor it is off by (2: the multiply-add or the
  read-and-write counted once; 1e3: milliseconds taken for seconds; ...), and an unanswered one (the
  skeleton returns ``None``) is said so instead of failing with a traceback.
- :data:`SITUATIONS` and :func:`check_ceiling_choices` (exercise 00.3): which measured ceiling bounds a
  given operation, with why for each situation answered wrong.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tinyllama.course.checkpoints import checkpoint

# Factors a rate formula is typically off by, and what each one points at.
COMMON_FACTORS: dict[float, str] = {
    2.0: "something that happens twice counted once, or once counted twice",
    1e3: "milliseconds are 1e-3 seconds",
    1e6: "a unit prefix (micro, mega) is off",
    1e9: "tera is 1e12, giga 1e9",
    1e12: "the result is in FLOP/s or B/s, not in tera-units",
}


# A factor whose cause depends on its direction in tera-units: 1000x too small is milliseconds taken for
# seconds (COMMON_FACTORS), 1000x too large a giga-unit where a tera-unit was asked for.
TERA_TOO_LARGE: dict[float, str] = {1e3: "divided by 1e9 (giga): tera is 1e12"}


def _factor_note(actual: float, expected: float, factors: Mapping[float, str],
                 too_large: Mapping[float, str] | None = None) -> str:
    """What a constant factor between ``actual`` and ``expected`` points at (empty if none known);
    ``too_large`` overrides the note of a factor when ``actual`` is that many times too large."""
    if not (actual and expected) or (actual > 0) != (expected > 0):
        return ""
    ratio = actual / expected
    for factor, note in (too_large or {}).items():
        if math.isclose(ratio, factor, rel_tol=1e-3):
            return f"{factor:g}x too large: {note}"
    for factor, note in factors.items():
        for candidate, word in ((factor, "too large"), (1 / factor, "too small")):
            if math.isclose(ratio, candidate, rel_tol=1e-3):
                return f"{factor:g}x {word}: {note}"
    return f"{ratio:.4g}x the expected value"


def check_formula(name: str, formula: Callable[..., Any], cases: Sequence[tuple[tuple[float, ...], float]],
                  exercise: str, factors: Mapping[float, str] | None = None, rel_tol: float = 1e-6,
                  unit: str = "") -> bool:
    """``formula(*arguments)`` equals the expected value (within ``rel_tol``) for every ``(arguments,
    expected)`` of ``cases``; the feedback lists the cases that differ and the factor each is off by
    (``factors`` maps a factor to its likely cause, added to :data:`COMMON_FACTORS`)."""
    known = {**COMMON_FACTORS, **(factors or {})}
    too_large = TERA_TOO_LARGE if unit.startswith("T") else None
    unit = f" {unit}" if unit else ""
    problems = []
    for arguments, expected in cases:
        shown = ", ".join(f"{a:g}" for a in arguments)
        try:
            actual = formula(*arguments)
        except NotImplementedError:  # an exercise not written yet: its own message says what to do
            raise
        except Exception as error:  # the participant's formula failed: say where, keep it short
            problems.append(f"{name}({shown}) raised {type(error).__name__}: {error}")
            continue
        if actual is None:
            return checkpoint(False, "", f"{name} returns None: write the formula in exercise {exercise} "
                                         f"(stuck? run course.reveal('{exercise}'))")
        try:
            value = float(actual)
        except (TypeError, ValueError):
            problems.append(f"{name}({shown}) returned {actual!r}, not a number")
            continue
        if not (math.isfinite(value) and math.isclose(value, expected, rel_tol=rel_tol)):
            problems.append(f"{name}({shown}) = {value:.6g}{unit}, expected {expected:.6g}{unit} "
                            f"({_factor_note(value, expected, known, too_large)})")
    return checkpoint(not problems, f"{name} gives the expected value on all {len(cases)} cases",
                      f"{name} is off on {len(problems)} of {len(cases)} cases:\n  - " + "\n  - ".join(problems))


# --- exercise 00.3: which ceiling bounds an operation ----------------------------------------------------

CEILINGS = ("fp32", "tf32", "bf16", "fp16", "copy")

# situation -> (the ceiling that bounds it, why). On an NVIDIA GPU of the Ampere generation or newer, with
# PyTorch's defaults unless the situation says otherwise.
SITUATIONS: dict[str, tuple[str, str]] = {
    "x @ w with x and w fp32 tensors": (
        "fp32", "torch.backends.cuda.matmul.allow_tf32 is False by default: an fp32 matmul runs in full fp32"),
    "a convolution of an fp32 model (torchvision ResNet-50)": (
        "tf32", "torch.backends.cudnn.allow_tf32 is True by default: cuDNN runs fp32 convolutions on the tensor "
                "cores in TF32"),
    "x @ w of fp32 tensors after torch.set_float32_matmul_precision('high')": (
        "tf32", "'high' allows TF32 for fp32 matmuls (the same as torch.backends.cuda.matmul.allow_tf32 = True)"),
    "x @ w of fp32 tensors inside torch.autocast('cuda', dtype=torch.bfloat16)": (
        "bf16", "autocast casts the matmul's inputs to bf16, whatever the tensors are stored in"),
    "a Linear layer of a model converted with model.half()": (
        "fp16", "the weights and the activations are fp16, so the matmul is an fp16 matmul"),
    "x + y of two fp16 tensors of 1 GiB each": (
        "copy", "one addition per 6 bytes moved: memory-bound, far below any matmul ceiling; the copy bandwidth "
                "bounds it"),
}


def check_ceiling_choices(answers: Mapping[str, str | None]) -> bool:
    """Exercise 00.3: ``answers`` maps each of :data:`SITUATIONS` to one of :data:`CEILINGS`."""
    if not isinstance(answers, Mapping):
        return checkpoint(False, "", f"ceiling_for is a {type(answers).__name__}: make it a dict from each "
                                     "situation to a ceiling name")
    missing = [s for s in SITUATIONS if answers.get(s) is None]
    if len(missing) == len(SITUATIONS):
        return checkpoint(False, "", "ceiling_for has no answers yet: fill in exercise 00.3 (stuck? run "
                                     "course.reveal('00.3'))")
    problems = [f"{s!r}: no answer" for s in missing]
    for situation, answer in answers.items():
        if situation not in SITUATIONS:
            problems.append(f"{situation!r} is not one of the situations (keep the keys as given)")
        elif answer is not None and answer not in CEILINGS:
            problems.append(f"{situation!r}: {answer!r} is not a ceiling name; use one of {', '.join(CEILINGS)}")
        elif answer is not None and answer != SITUATIONS[situation][0]:
            expected, why = SITUATIONS[situation]
            problems.append(f"{situation!r}: you chose {answer!r}, the ceiling is {expected!r}: {why}")
    return checkpoint(not problems, f"the ceiling of every one of the {len(SITUATIONS)} situations is right",
                      f"{len(problems)} of {len(SITUATIONS)} situations are not right:\n  - " + "\n  - ".join(problems))


# --- exercise 01.2: where the time per batch stops being flat ---------------------------------------------

# (batch sizes, ms per batch, what the case tests): flat then rising, flat to the end, rising at once,
# a dip below the first (still flat), a bump that comes back down (the flat region ends at the bump), and
# a creep of small steps (measured against the first point, not the previous one).
FLAT_CASES: tuple[tuple[tuple[int, ...], tuple[float, ...], str], ...] = (
    ((1, 8, 32, 64, 128, 256), (5.5, 5.5, 5.3, 9.4, 17.6, 33.9), "flat to 32, then rising"),
    ((1, 2, 4), (3.0, 3.1, 3.2), "flat over the whole sweep"),
    ((1, 2, 4, 8), (1.0, 2.0, 4.0, 8.0), "rising from the first step (no flat region)"),
    ((1, 8, 32, 64), (6.0, 5.0, 4.8, 12.0), "faster than batch 1 still counts as flat"),
    ((1, 8, 32, 64), (5.0, 5.2, 7.0, 5.5), "a bump ends the flat region even if a later point is low again"),
    ((1, 2, 4, 8, 16), (1.0, 1.15, 1.3, 1.5, 1.7), "a slow creep: each step is small, the sum is not"),
)


def check_flat_until(flat_until: Callable[[Sequence[int], Sequence[float]], Any],
                     reference: Callable[[Sequence[int], Sequence[float]], int],
                     measured: tuple[Sequence[int], Sequence[float]] | None = None) -> bool:
    """Exercise 01.2: ``flat_until(batch_sizes, ms_per_batch)`` agrees with ``reference`` on
    :data:`FLAT_CASES` and on the ``measured`` sweep."""
    cases = [(sizes, ms, what) for sizes, ms, what in FLAT_CASES]
    if measured is not None:
        cases.append((tuple(measured[0]), tuple(measured[1]), "your measured sweep"))
    problems = []
    for sizes, ms, what in cases:
        expected = reference(sizes, ms)
        try:
            got = flat_until(list(sizes), list(ms))
        except NotImplementedError:  # an exercise not written yet: its own message says what to do
            raise
        except Exception as error:
            problems.append(f"{what}: raised {type(error).__name__}: {error}")
            continue
        if got is None:
            return checkpoint(False, "", "flat_until returns None: write it in exercise 01.2 (stuck? run "
                                         "course.reveal('01.2'))")
        if got != expected:
            shown = ", ".join(f"{s}: {m:g}" for s, m in zip(sizes, ms))
            problems.append(f"{what} (batch: ms {shown}): got {got}, expected {expected}")
    hint = ("\n  Compare every point with the smallest batch's time (not with its neighbour), and stop at the first "
            "point that is slower than the tolerance allows: return the last size before it.")
    return checkpoint(not problems, f"flat_until finds the end of the flat region in all {len(cases)} sweeps",
                      f"flat_until differs from the reference in {len(problems)} of {len(cases)} sweeps:\n  - "
                      + "\n  - ".join(problems) + hint)
