"""Checks of notebook 19's exercises (results and wrap-up), with feedback that names the likely mistake:

- :func:`check_credit`: for three optimizations, the comparison among :data:`COMPARISONS` that credits
  it: the two runs differ in that change alone and ran in one process (one notebook's run);
- :func:`check_step_verdicts`: a function that gives each step of a chain of step times its speed-up and
  its verdict (faster, slower, or within run-to-run variation), on made-up chains and the real one;
- :func:`check_most_different`: the figure that differs most from the reference, and the first cause
  (profile, device, software, noise) that explains it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tinyllama.course import dashboard
from tinyllama.course.checkpoints import checkpoint
from tinyllama.course.diagnosis import Case, check_cases

# What each stage of TinyLLaMA's training step runs, setting by setting.
SETTINGS = ("precision", "projections", "kernels", "compile", "graphs")
_V1 = {"precision": "fp32", "projections": "five separate matmuls",
       "kernels": "PyTorch operators, attention written out", "compile": "eager", "graphs": "launched from Python"}
STAGES: dict[str, dict[str, str]] = {
    "V1 fp32": _V1,
    "V1 bf16": {**_V1, "precision": "bf16 autocast"},
    "V2 bf16": {**_V1, "precision": "bf16 autocast", "projections": "one QKV + one gate/up matmul"},
    "V3 bf16": {**_V1, "precision": "bf16 autocast", "projections": "one QKV + one gate/up matmul",
                "kernels": "Triton: RMSNorm, flash attention, SwiGLU"},
    "V4 bf16 eager": {**_V1, "precision": "bf16 autocast", "projections": "one QKV + one gate/up matmul",
                      "kernels": "PyTorch operators, SDPA attention"},
}
STAGES["V4 bf16 compiled"] = {**STAGES["V4 bf16 eager"], "compile": "torch.compile"}
STAGES["V4 bf16 compiled + graphs"] = {**STAGES["V4 bf16 compiled"], "graphs": "whole step replayed from CUDA graphs"}

# The optimizations of exercise 19.1 and the setting each one changes.
ITEMS = {"Mixed precision (bf16/fp16)": "precision", "Fused projections (V2)": "projections", "torch.compile": "compile"}


@dataclass(frozen=True)
class Run:
    """One timed run: the notebook that timed it, the stage it ran, and the figure it recorded (ms)."""

    notebook: str  # two digits
    stage: str
    figure: str


@dataclass(frozen=True)
class Comparison:
    """A speed-up the records allow: ``before``'s step time over ``after``'s."""

    letter: str
    before: Run
    after: Run

    def changes(self) -> list[str]:
        """The settings whose values differ between the two stages."""
        return [s for s in SETTINGS if STAGES[self.before.stage][s] != STAGES[self.after.stage][s]]

    def same_process(self) -> bool:
        """Both runs timed by one notebook (the newest record of each notebook is one process)."""
        return self.before.notebook == self.after.notebook


_COMPARISONS = (
    (Run("17", "V1 fp32", "step_ms_v1_fp32"), Run("17", "V4 bf16 compiled", "step_ms_v4")),
    (Run("16", "V4 bf16 eager", "step_ms_V4 eager"), Run("16", "V4 bf16 compiled", "step_ms_V4 compiled (default)")),
    (Run("17", "V1 bf16", "step_ms_v1"), Run("17", "V2 bf16", "step_ms_v2")),
    (Run("16", "V4 bf16 eager", "step_ms_V4 eager"),
     Run("16", "V4 bf16 compiled + graphs", "step_ms_V4 compiled + whole-step graphs")),
    (Run("17", "V1 fp32", "step_ms_v1_fp32"), Run("17", "V1 bf16", "step_ms_v1")),
    (Run("17", "V3 bf16", "step_ms_v3"), Run("17", "V4 bf16 compiled", "step_ms_v4")),
    (Run("16", "V4 bf16 eager", "step_ms_V4 eager"), Run("17", "V4 bf16 compiled", "step_ms_v4")),
    (Run("17", "V1 fp32", "step_ms_v1_fp32"), Run("17", "V2 bf16", "step_ms_v2")),
)
COMPARISONS: tuple[Comparison, ...] = tuple(Comparison(chr(ord("A") + i), before, after)
                                            for i, (before, after) in enumerate(_COMPARISONS))


def stages_table() -> pd.DataFrame:
    """The settings of every stage, one row each."""
    table = pd.DataFrame(STAGES).T[list(SETTINGS)]
    table.index.name = "stage"
    return table


def _value(run: Run, runs: Mapping[str, list[dict[str, Any]]]) -> float:
    """``run``'s step time from the newest record of its notebook; NaN where absent, or where the record
    ran at fp32 and the stage is a bf16 one (a CPU run: there is no bf16 stage to read)."""
    for notebook, records in runs.items():
        if dashboard.notebook_number(notebook) == run.notebook and records:
            figures = records[0]
            value = figures.get(run.figure)
            half = figures.get("precision") in ("bf16", "fp16")
            if dashboard.is_number(value) and float(value) > 0 and (half or "bf16" not in run.stage):
                return float(value)
    return math.nan


def comparisons_table(table: pd.DataFrame) -> pd.DataFrame:
    """The comparisons of exercise 19.1 with their step times and speed-ups from ``table``'s records."""
    runs = dashboard.runs_by_notebook(table)
    rows = []
    for c in COMPARISONS:
        before, after = _value(c.before, runs), _value(c.after, runs)
        rows.append({"comparison": c.letter, "before": f"{c.before.stage} (notebook {c.before.notebook})",
                     "after": f"{c.after.stage} (notebook {c.after.notebook})", "before ms": before,
                     "after ms": after, "speed-up": before / after})
    return pd.DataFrame(rows).set_index("comparison")


def _and(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _judge_choice(item: str, letter: Any, speedups: Mapping[str, float]) -> str | None:
    """What is wrong with crediting ``item`` with comparison ``letter``; None when it is right."""
    setting = ITEMS[item]
    letters = [c.letter for c in COMPARISONS]
    if letter is None:
        return f"{item}: choose a comparison (one of {', '.join(letters)})"
    if letter not in letters:
        return f"{item}: {letter!r} is not a comparison; choose one of {', '.join(letters)} (a string such as 'A')"
    c = next(c for c in COMPARISONS if c.letter == letter)
    changes = c.changes()
    factor = speedups.get(letter, math.nan)
    said = f"{factor:.3g}x" if math.isfinite(factor) else "its speed-up"
    if setting not in changes:
        return (f"{item}: {letter} ({c.before.stage} -> {c.after.stage}) does not change the {setting} at all; "
                f"it changes {_and(changes)}")
    if len(changes) > 1:
        return (f"{item}: {letter} changes {_and(changes)} together; {said} credits all of them, not the "
                f"{setting} alone")
    if not c.same_process():
        return (f"{item}: {letter} changes only the {setting}, but its runs were timed by notebooks "
                f"{c.before.notebook} and {c.after.notebook}, in two processes: an eager step's time moves between processes (the "
                f"dashboard allows +-{dashboard.EAGER_VARIATION:.0%} for it), so the ratio mixes the change with "
                "that variation")
    return None


def check_credit(credit: Mapping[str, Any], table: pd.DataFrame) -> bool:
    """``credit[item]`` names, for each of :data:`ITEMS`, a comparison whose two runs differ in that one
    setting and were timed in one process. ``table``: the records the speed-ups are shown from."""
    if not isinstance(credit, Mapping):
        return checkpoint(False, "", f"credit must be a dict from optimization to a letter, got {type(credit).__name__}")
    shown = comparisons_table(table)["speed-up"].to_dict()
    problems = [p for item in ITEMS if (p := _judge_choice(item, credit.get(item), shown)) is not None]
    extra = sorted(set(credit) - set(ITEMS))
    if extra:
        problems.append(f"not an optimization of this exercise: {', '.join(map(str, extra))} "
                        f"(the keys are {', '.join(ITEMS)})")
    lines = []
    for item, letter in credit.items():
        if item in ITEMS and not problems:
            factor = shown.get(letter, math.nan)
            verdict = dashboard.judge(factor) if math.isfinite(factor) else "not recorded here"
            c = next(c for c in COMPARISONS if c.letter == letter)
            lines.append(f"{item}: {letter} ({c.before.stage} -> {c.after.stage}), "
                         + (f"{factor:.3g}x: {verdict}" if math.isfinite(factor) else verdict))
    return checkpoint(not problems, "each optimization is credited by a controlled pair:\n  - " + "\n  - ".join(lines),
                      f"{len(problems)} choice(s) to look at again:\n  - " + "\n  - ".join(problems))


# Made-up chains of step times (ms) for exercise 19.2: (label, times, variation, why).
CHAIN_CASES: tuple[tuple[str, tuple[float, ...], float, str], ...] = (
    ("100 -> 50 -> 48 -> 30 ms", (100.0, 50.0, 48.0, 30.0), 0.15,
     "each step over the stage just before it (old time / new time); 50 -> 48 ms is 1.04x, inside +-15%"),
    ("100 -> 104 -> 60 ms", (100.0, 104.0, 60.0), 0.15,
     "a step 4% slower is within run-to-run variation too, not 'slower'"),
    ("50 -> 70 ms", (50.0, 70.0), 0.15, "70 ms after 50 ms is 0.71x: slower beyond the variation"),
    ("100 -> 116 ms", (100.0, 116.0), 0.15,
     "the new time is 1.16 times the old, more than 1 + variation: slower. The rule is the same in both "
     "directions on a ratio scale: 0.862x is 1/1.16"),
    ("100 -> 90 ms at 5% variation", (100.0, 90.0), 0.05,
     "1.11x is beyond a variation of 5%: use the variation you are given, not a fixed 15%"),
    ("100 -> 99 -> 101 ms", (100.0, 99.0, 101.0), 0.15, "both steps are within variation: no verdict either way"),
)


def expected_verdicts(times: Sequence[float], variation: float) -> list[tuple[float, str]]:
    """The reference answer of exercise 19.2: ``(old / new, verdict)`` for each consecutive pair."""
    return [(a / b, dashboard.judge(a / b, variation)) for a, b in zip(times[:-1], times[1:])]


def _matches(expected: list[tuple[float, str]]) -> Callable[[Any], bool]:
    def judge(answer: Any) -> bool:
        try:
            pairs = [(float(s), str(v)) for s, v in answer]
        except (TypeError, ValueError):
            return False
        return len(pairs) == len(expected) and all(
            math.isclose(s, e, rel_tol=1e-6) and v == w for (s, v), (e, w) in zip(pairs, expected))
    return judge


def _shown(expected: list[tuple[float, str]]) -> str:
    return "[" + ", ".join(f"({s:.3g}, {v!r})" for s, v in expected) + "]"


def check_step_verdicts(candidate: Callable[[list[float], float], Any], chain_ms: Sequence[float],
                        variation: float) -> bool:
    """``candidate(times, variation)`` gives each step of a chain of step times its speed-up (old time /
    new time) and its verdict, on :data:`CHAIN_CASES` and on ``chain_ms`` (the notebook's chain)."""
    cases = []
    for label, times, var, why in CHAIN_CASES:
        expected = expected_verdicts(times, var)
        cases.append(Case(f"{label} (variation {var:g})", (list(times), var), _matches(expected), why, _shown(expected)))
    if len(chain_ms) >= 2:
        expected = expected_verdicts(list(chain_ms), variation)
        cases.append(Case("the chain of this notebook", (list(map(float, chain_ms)), variation), _matches(expected),
                          "the same rule on the measured chain", _shown(expected)))
    return check_cases("step_verdicts", candidate, cases,
                       hint=f"Words: {dashboard.FASTER!r}, {dashboard.SLOWER!r}, {dashboard.WITHIN!r}. A step is "
                            "within run-to-run variation when neither time is more than (1 + variation) times the "
                            "other.")


CAUSES = ("profile", "device", "software", "noise")


def _causes_in_order(yours: pd.Series, theirs: pd.Series) -> list[tuple[str, Any, Any]]:
    """(cause, yours, the reference's) for each cause of :data:`CAUSES` that differs, in order."""
    found = [(cause, yours[column], theirs[column]) for cause, column in
             (("profile", "profile"), ("device", "device"), ("software", "torch"), ("software", "triton"))
             if yours[column] != theirs[column]]
    return found


def check_most_different(most_different: Any, cause: Any, explanation: Any, comparable: pd.DataFrame,
                         mine: pd.DataFrame, ref: pd.DataFrame) -> bool:
    """Exercise 19.3: the (notebook, figure) of ``comparable`` farthest from the reference on a ratio scale,
    the first cause of :data:`CAUSES` that differs between the participant's record and the reference's,
    and a sentence."""
    if comparable.empty:
        return checkpoint(most_different is None, "nothing of yours to compare yet, and nothing named",
                          "you recorded no figure that the reference has too: set most_different = None")
    distance = np.log(comparable["yours / reference"].astype(float)).abs()
    top = comparable.loc[distance.idxmax()]
    named = tuple(most_different) if isinstance(most_different, (tuple, list)) else most_different
    if named != (top.notebook, top.figure):
        largest = comparable.loc[comparable["yours / reference"].astype(float).idxmax()]
        hint = (" You took the largest ratio: a figure far below 1 is as different as one far above (the distance "
                "is |log(ratio)|)." if named == (largest.notebook, largest.figure) else
                " Take the row of `comparable` whose |log(yours / reference)| is largest.")
        return checkpoint(False, "", f"most_different = {most_different!r} is not the figure farthest from the "
                                     f"reference on a ratio scale.{hint}")
    yours_row = mine[(mine.notebook == top.notebook) & (mine.figure == top.figure)].iloc[-1]
    ref_row = ref[(ref.notebook == top.notebook) & (ref.figure == top.figure)].iloc[-1]
    differs = _causes_in_order(yours_row, ref_row)
    expected = differs[0][0] if differs else "noise"
    if cause not in CAUSES:
        message = f"cause = {cause!r}: choose one of {', '.join(CAUSES)}"
    elif cause == expected:
        message = ""
    elif CAUSES.index(cause) < CAUSES.index(expected):
        column = {"profile": "profile", "device": "device", "software": "torch"}[cause]
        message = (f"cause = {cause!r}: yours and the reference's {cause} are the same ({yours_row[column]!r}); "
                   "go further down the list")
    else:
        first, a, b = differs[0]
        message = (f"cause = {cause!r}: rule the causes out in order; the {first} differs first (yours {a!r}, the "
                   f"reference's {b!r}), and a difference there already explains the figure")
    if message:
        return checkpoint(False, "", message)
    return checkpoint(isinstance(explanation, str) and len(explanation.split()) >= 6,
                      f"{top.figure} of {top.notebook} is the figure farthest from the reference, and the {cause} "
                      "is the first difference",
                      "write a sentence in `explanation`: what differs, and why")
