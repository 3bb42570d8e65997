"""The break-even of a compile, exercises 06.2 and 16.3: after how many steps has ``torch.compile`` paid for
itself? Both notebooks ask for ``break_even(compile_s, eager_ms, compiled_ms)`` and are checked on the same
cases (:data:`BREAK_EVEN_CASES`) against one list of typical mistakes (:data:`BREAK_EVEN_SLIPS`, each a
:class:`~tinyllama.course.feedback.NumberSlip`, named by :func:`name_break_even_slip`):

- :func:`check_break_even` (06.2): every case right, with the slip a wrong answer reproduces named;
- :func:`check_break_even_steps` (16.3): the same, with the cases a named slip gets wrong listed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from tinyllama.course.checkpoints import checkpoint
from tinyllama.course.diagnosis import Case, check_cases
from tinyllama.course.feedback import NumberSlip
from tinyllama.profiling.compiled import break_even_steps

BREAK_EVEN_CASES: tuple[tuple[float, float, float], ...] = ((30.0, 50.0, 25.0), (12.0, 2.5, 2.0), (0.0, 10.0, 5.0),
                                                            (40.0, 20.0, 25.0), (5.0, 8.0, 8.0))


def _saved_s(eager_ms: float, compiled_ms: float) -> float:
    return (eager_ms - compiled_ms) / 1e3


# The typical wrong break-even functions of exercises 06.2 and 16.3 (one list for both notebooks), each with
# what it gets wrong. A slip is named when the participant's function answers every case of BREAK_EVEN_CASES
# as it does (raising included); BREAK_EVEN_CASES separate every slip from the answer and from each other.
BREAK_EVEN_SLIPS: tuple[NumberSlip, ...] = (
    NumberSlip("milliseconds", lambda c, e, k: c / (e - k) if e > k else math.inf,
                  "gives 1000 times too few steps: the compile is in seconds and the saving per step in milliseconds; "
                  "turn eager_ms - compiled_ms into seconds before dividing"),
    NumberSlip("milliseconds twice", lambda c, e, k: c * 1e3 / _saved_s(e, k) if e > k else math.inf,
                  "gives 1000 times too many steps: the compile time was turned into milliseconds while the saving "
                  "is already in seconds; convert only one of the two"),
    NumberSlip("upside down", lambda c, e, k: _saved_s(e, k) / c if e > k else math.inf,
                  "is upside down: it divides the time a step saves by the compile time; the steps are the compile "
                  "time over the time each step saves"),
    NumberSlip("negative", lambda c, e, k: c / _saved_s(e, k) if e != k else math.inf,
                  "returns a negative number of steps where the compiled step is slower: a step that saves nothing "
                  "or loses time never pays back the compile, so return math.inf whenever eager_ms - compiled_ms <= 0, "
                  "not only when they are equal"),
    NumberSlip("no guard", lambda c, e, k: c / _saved_s(e, k),
                  "divides by zero where the two steps take equal times (and gives a negative count where the compiled "
                  "step is slower): return math.inf when the compiled step saves nothing"),
    NumberSlip("guard >= 0", lambda c, e, k: c / _saved_s(e, k) if e >= k else math.inf,
                  "divides by zero where the compiled step is exactly as fast as the eager one: a step that saves "
                  "nothing never pays, so return math.inf whenever the saving is not positive (> 0, not >= 0)"),
    NumberSlip("compiled - eager", lambda c, e, k: c / ((k - e) / 1e3) if k > e else math.inf,
                  "takes the saving as compiled - eager: a step saves eager_ms - compiled_ms, which is positive when "
                  "the compiled step is faster"),
    NumberSlip("speed-up", lambda c, e, k: c / (e / k),
                  "divides by the speed-up eager / compiled: a ratio is not a saving; divide the compile time by the "
                  "time each step saves, eager_ms - compiled_ms, in seconds"),
    NumberSlip("eager steps in the compile", lambda c, e, k: c / (e / 1e3),
                  "counts the eager steps that fit into the compile time; the compile pays for itself through what "
                  "each compiled step saves (eager_ms - compiled_ms), not through the whole step"),
    NumberSlip("compiled steps in the compile", lambda c, e, k: c / (k / 1e3),
                  "counts the compiled steps that fit into the compile time; the compile pays for itself through what "
                  "each compiled step saves (eager_ms - compiled_ms), not through the whole step"),
)

# The catch-all, tried after every slip of BREAK_EVEN_SLIPS: right wherever the compiled step is faster,
# wrong (not negative) where it saves nothing.
NEVER_PAYS = ("is right where the compiled step is faster, but where it saves nothing it returns {answer}: a compile "
              "that saves nothing never pays for itself, so return math.inf there (not 0, None or -1)")


def outcome(fn: Callable[..., Any], args: tuple[float, float, float]) -> Any:
    """``fn(*args)``, or the type of the exception it raised (a slip may divide by zero as the answer does)."""
    try:
        return fn(*args)
    except NotImplementedError:  # an exercise not written yet: its own message says what to do
        raise
    except Exception as error:  # noqa: BLE001 - a participant's answer may raise anything: compared by type
        return type(error)


def same_outcome(answer: Any, expected: Any) -> bool:
    """Two outcomes agree: the same exception type, both infinite of one sign, or numbers within 1e-6."""
    if isinstance(expected, type) or isinstance(answer, type):
        return answer is expected
    if isinstance(answer, bool) or not isinstance(answer, (int, float)) or not isinstance(expected, (int, float)):
        try:
            answer = float(answer)  # a NumPy or 0-d tensor answer
        except (TypeError, ValueError):
            return False
    if math.isinf(expected) or math.isinf(answer):
        return answer == expected
    return math.isclose(answer, expected, rel_tol=1e-6, abs_tol=1e-9)


def name_break_even_slip(candidate: Callable[[float, float, float], Any],
                         cases: Sequence[tuple[float, float, float]] = BREAK_EVEN_CASES) -> str | None:
    """What is wrong with ``candidate`` on ``cases``, in words that complete "break_even ...", when it
    reproduces a slip of :data:`BREAK_EVEN_SLIPS`, else when it is right only where the compiled step is
    faster (:data:`NEVER_PAYS`, after every named slip); ``None`` when it is right on every case or wrong
    in a way no slip explains. Used by the checks of exercises 06.2 and 16.3."""
    answers = [outcome(candidate, case) for case in cases]
    expected = [break_even_steps(*case) for case in cases]
    if all(same_outcome(a, e) for a, e in zip(answers, expected)):
        return None
    for slip in BREAK_EVEN_SLIPS:
        if all(same_outcome(a, outcome(slip.value, case)) for a, case in zip(answers, cases)):
            return slip.message
    faster = [math.isfinite(e) for e in expected]
    if all(same_outcome(a, e) for a, e, f in zip(answers, expected, faster) if f):
        wrong = next(a for a, e, f in zip(answers, expected, faster) if not f and not same_outcome(a, e))
        return NEVER_PAYS.format(answer=wrong.__name__ if isinstance(wrong, type) else repr(wrong))
    return None


def check_break_even(candidate: Callable[[float, float, float], float]) -> bool:
    """``candidate(compile_s, eager_ms, compiled_ms)`` gives the steps after which the compile has paid
    for itself, ``math.inf`` when the compiled step is not faster (units: seconds and milliseconds). A
    wrong function is compared with the typical mistakes (:func:`name_break_even_slip`) on the same cases and
    the one it reproduces is named (exercise 06.2)."""
    cases = []
    for compile_s, eager_ms, compiled_ms in BREAK_EVEN_CASES:
        expected = break_even_steps(compile_s, eager_ms, compiled_ms)
        label = f"compile {compile_s:g} s, eager {eager_ms:g} ms, compiled {compiled_ms:g} ms"
        if math.isinf(expected):
            cases.append(Case(label, (compile_s, eager_ms, compiled_ms), lambda a: a == math.inf,
                              "a compiled step that is not faster never pays back its compile", "math.inf"))
        else:
            cases.append(Case(label, (compile_s, eager_ms, compiled_ms),
                              lambda a, e=expected: isinstance(a, (int, float)) and math.isclose(a, e, rel_tol=1e-6,
                                                                                                abs_tol=1e-9),
                              "the compile time over the time each step saves, both in seconds", f"{expected:g}"))
    named = name_break_even_slip(candidate)
    hint = f"Your break_even {named}." if named is not None else (
        "Divide the compile time by the time each step saves, in one unit (seconds and milliseconds differ by "
        "1000), and return math.inf when the compiled step saves nothing.")
    return check_cases("break_even", candidate, cases, hint=hint)


# ---- notebook 16, exercise 16.3: the break-even point, with its typical mistakes named ---------------------------


def _case_label(case: tuple[float, float, float]) -> str:
    compile_s, eager_ms, compiled_ms = case
    return f"compile {compile_s:g} s, eager {eager_ms:g} ms, compiled {compiled_ms:g} ms"


def check_break_even_steps(candidate: Callable[[float, float, float], float]) -> bool:
    """Exercise 16.3: ``candidate(compile_s, eager_ms, compiled_ms)`` gives the steps after which the
    compile has paid for itself (``math.inf`` when the compiled step is not faster), on the cases of
    :func:`check_break_even`, which prints the verdict; a wrong answer
    that reproduces a typical mistake fails with that mistake named, and the cases it gets wrong."""
    slip = name_break_even_slip(candidate)
    if slip is None:  # right, or wrong in no typical way: the general check says which cases and why
        return check_break_even(candidate)
    wrong = []
    for case in BREAK_EVEN_CASES:
        answer, expected = outcome(candidate, case), break_even_steps(*case)
        if not same_outcome(answer, expected):
            shown = f"raised {answer.__name__}" if isinstance(answer, type) else f"returned {answer!r}"
            wrong.append(f"{_case_label(case)}: {shown}, expected {expected:g}")
    return checkpoint(False, "", f"break_even {slip}.\n  It is wrong on {len(wrong)} of {len(BREAK_EVEN_CASES)} "
                                 "cases:\n  - " + "\n  - ".join(wrong))


__all__ = ["BREAK_EVEN_CASES", "BREAK_EVEN_SLIPS", "NEVER_PAYS", "check_break_even", "check_break_even_steps",
           "name_break_even_slip", "outcome", "same_outcome"]
