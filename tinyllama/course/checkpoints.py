"""Checkpoints: tell the participant whether a result is plausible, and why.

Each helper prints ``PASS: ...`` or ``CHECK: ...`` with the reason and returns ``True``/``False``,
so a participant sees at once whether to go on or to look again. Under ``WORKSHOP_STRICT=1`` (set
by the instructor runner and by CI) a failed checkpoint raises :class:`CheckpointFailed`, so a
solution notebook that no longer gives plausible results fails its test instead of printing.

In a Jupyter kernel, a failed check of an exercise's answer raises
:class:`~tinyllama.course.exercise_stop.ExerciseCheckFailed` whatever ``WORKSHOP_STRICT`` says: the
participant's "Run All" stops at that check with a short message (which exercise, what is wrong,
``course.reveal("N.M")``), and the wrong value never reaches a later cell or the records. Which checks
are an exercise's is decided in :mod:`tinyllama.course.exercise_stop`; a plausibility check on a measured
result (``measured=True``, or a statement that does not use the answer) only prints outside strict mode.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

STRICT_VARIABLE = "WORKSHOP_STRICT"


class CheckpointFailed(AssertionError):
    """A checkpoint failed while ``WORKSHOP_STRICT=1``."""


def strict() -> bool:
    """True when failed checkpoints raise (``WORKSHOP_STRICT`` set to 1/true/yes)."""
    return os.environ.get(STRICT_VARIABLE, "").strip().lower() in ("1", "true", "yes")


def checkpoint(ok: bool, passed: str, failed: str, *, measured: bool = False) -> bool:
    """Print ``PASS: passed`` when ``ok``, else ``CHECK: failed`` (what to look at); return ``ok``.

    A failure raises :class:`~tinyllama.course.exercise_stop.ExerciseCheckFailed` when it is the check of
    an exercise's answer in a notebook cell (see :func:`~tinyllama.course.exercise_stop.failing_exercise`;
    never for ``measured=True``, a plausibility check on a measured result), and
    :class:`CheckpointFailed` under ``WORKSHOP_STRICT=1``."""
    ok = bool(ok)
    if ok:
        print(f"PASS: {passed}")
        return True
    if not measured:
        from tinyllama.course.exercise_stop import ExerciseCheckFailed, failing_exercise

        found = failing_exercise(sys._getframe(1))
        if found is not None:  # its message shows what CHECK would print: raise instead of printing twice
            raise ExerciseCheckFailed(failed, *found)
    print(f"CHECK: {failed}")
    if strict():
        raise CheckpointFailed(failed)
    return False


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def check_close(name: str, actual: float, expected: float, rel_tol: float = 1e-2, abs_tol: float = 0.0,
                hint: str = "") -> bool:
    """``actual`` equals ``expected`` within ``rel_tol`` (relative) or ``abs_tol`` (absolute)."""
    ok = math.isfinite(actual) and math.isclose(actual, expected, rel_tol=rel_tol, abs_tol=abs_tol)
    return checkpoint(ok, f"{name} = {_fmt(actual)}, as expected ({_fmt(expected)})",
                      f"{name} = {_fmt(actual)}, expected {_fmt(expected)} (within {rel_tol:.0%}). {hint}".strip())


def check_equal(name: str, actual: Any, expected: Any, hint: str = "") -> bool:
    """``actual == expected`` exactly (counts, shapes, configuration values)."""
    return checkpoint(actual == expected, f"{name} = {actual!r}, as expected",
                      f"{name} = {actual!r}, expected {expected!r}. {hint}".strip())


def check_between(name: str, value: float, low: float, high: float, unit: str = "", hint: str = "",
                  why: str = "") -> bool:
    """``low <= value <= high``: a plausible range (for example, above zero and below the datasheet
    peak: a measured rate above the peak means the timing is wrong). ``why`` says where the range
    comes from and is shown either way; a value outside it is also given as a factor of the bound
    it missed (a factor of 2, 1e3 or 1e6 usually means a formula or a unit is off)."""
    unit = f" {unit}" if unit else ""
    ok = math.isfinite(value) and low <= value <= high
    reason = f" {why}" if why else ""
    if ok:
        return checkpoint(True, f"{name} = {_fmt(value)}{unit} is plausible (between {_fmt(low)} and "
                                f"{_fmt(high)}{unit}).{reason}", "")
    where, factor = "outside", ""
    if math.isfinite(value):
        where = "below" if value < low else "above"
        bound = low if value < low else high
        if bound and value and (value > 0) == (bound > 0):
            times = value / bound if value > bound else bound / value
            factor = f" ({times:.3g}x {'below' if value < low else 'above'} the bound)"
    return checkpoint(False, "", f"{name} = {_fmt(value)}{unit} is {where} the plausible range "
                                 f"{_fmt(low)} .. {_fmt(high)}{unit}{factor}.{reason} {hint}".rstrip())


def check_faster(name: str, new_ms: float, old_ms: float, min_speedup: float = 1.0, hint: str = "") -> bool:
    """``new_ms`` is at least ``min_speedup`` times faster than ``old_ms`` (two timings of one run). A
    measured result: it never stops a participant's notebook outside ``WORKSHOP_STRICT``."""
    speedup = old_ms / new_ms if new_ms > 0 else math.inf
    return checkpoint(speedup >= min_speedup,
                      f"{name} is {speedup:.2f}x faster ({_fmt(old_ms)} ms -> {_fmt(new_ms)} ms)",
                      f"{name} is {speedup:.2f}x ({_fmt(old_ms)} ms -> {_fmt(new_ms)} ms), expected at least "
                      f"{min_speedup:.2f}x. {hint}".strip(), measured=True)  # a timing: hardware decides it


def check_allclose(name: str, actual: Any, expected: Any, rtol: float = 1e-5, atol: float = 1e-8,
                   hint: str = "") -> bool:
    """Two tensors agree elementwise (``torch.allclose``), reporting the largest difference."""
    import torch

    actual_t, expected_t = torch.as_tensor(actual), torch.as_tensor(expected)
    if actual_t.shape != expected_t.shape:
        return checkpoint(False, "", f"{name}: shape {tuple(actual_t.shape)} differs from the reference "
                                     f"{tuple(expected_t.shape)}. {hint}".strip())
    a64, e64 = actual_t.detach().double().cpu(), expected_t.detach().double().cpu()
    ok = torch.allclose(a64, e64, rtol=rtol, atol=atol)
    worst = (a64 - e64).abs().max().item() if a64.numel() else 0.0
    return checkpoint(ok, f"{name} matches the reference",
                      f"{name} differs from the reference (largest difference {worst:.3g}, "
                      f"tolerance rtol={rtol:g}, atol={atol:g}). {hint}".strip())
