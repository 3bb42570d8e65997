"""Checks of notebook 06's exercises (``torch.compile``'s modes on the inference benchmark):

- :func:`check_speedup_predictions`: a predicted speed-up over eager for each mode, written as a ratio,
  beside what was measured (a prediction is never wrong; a missing one, or one that is not a ratio, is);
- :func:`check_serving_seconds`: a function for what a serving scenario costs in one mode (one-time
  seconds cold or warm at each start, plus the batches), on made-up cases and on the measured table,
  and what the mode it chooses costs against the cheapest.

The break-even exercise (06.2, shared with notebook 16's 16.3) is checked in
:mod:`tinyllama.course.break_even_checks`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import pandas as pd

from tinyllama.course.checkpoints import checkpoint
from tinyllama.course.diagnosis import Case, check_cases
from tinyllama.course.feedback import compare_prediction

if TYPE_CHECKING:  # imported where used: importing the inference package breaks Triton's interpreter afterwards
    from inference.compile_modes import Scenario

# A speed-up is a ratio eager / compiled: 2 means twice as fast. Outside this range it is a time or a percentage.
PLAUSIBLE_SPEEDUP = (0.05, 20.0)


def check_speedup_predictions(predicted: Mapping[str, float | None], measured: Mapping[str, float],
                              asked: Sequence[str], not_measured: str = "") -> bool:
    """Every mode in ``asked`` has a prediction that reads as a speed-up (a ratio between 0.05 and 20);
    each is printed beside the measured speed-up where ``measured`` has one (``not_measured`` says why
    the others were not). Passes when the predictions are written as ratios, whatever they say."""
    problems = []
    for mode in asked:
        value = predicted.get(mode)
        if value is None or not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
            problems.append(f"{mode}: no prediction (write a number before you look at the measurement)")
        elif not PLAUSIBLE_SPEEDUP[0] <= value <= PLAUSIBLE_SPEEDUP[1]:
            problems.append(f"{mode}: {value:g} is not a speed-up: write eager time / compiled time (2 = twice as "
                            "fast, 0.9 = a little slower), not a time in ms or a percentage")
    unknown = sorted(set(predicted) - set(asked))
    if unknown:
        problems.append(f"no mode called {', '.join(map(repr, unknown))}: the modes are {', '.join(asked)}")
    if problems:
        return checkpoint(False, "", "your predictions cannot be compared yet:\n  - " + "\n  - ".join(problems))
    for mode in asked:
        if mode in measured:
            compare_prediction(f"speed-up of {mode} over eager", float(predicted[mode]), measured[mode], "x")
        else:
            print(f"speed-up of {mode} over eager: predicted {predicted[mode]:.3g} x; measured: "
                  + (not_measured or "not on this device"))
    return checkpoint(True, "every mode has a predicted speed-up; the surprises above are the lesson", "")


SERVING_CASES: tuple[tuple[float, float, float], ...] = ((30.0, 3.0, 5.0), (0.8, 0.8, 10.0), (12.0, 12.0, 4.0))


def check_serving_seconds(candidate: Callable[[float, float, float, Scenario], float], table: pd.DataFrame,
                          scenarios: Sequence[Scenario] | None = None) -> bool:
    """``candidate(compile_cold_s, compile_warm_s, ms_per_batch, scenario)`` gives the seconds a scenario
    costs in one configuration, as :func:`inference.compile_modes.serving_seconds` does: on made-up cases
    and on every run of ``table`` (:func:`inference.compile_modes.modes_table`). Then, for each scenario,
    the mode the candidate's figures choose (the cheapest by them) and what it costs against the cheapest
    by the reference, in seconds and percent (printed first, right or wrong). ``scenarios``: those of
    :data:`inference.compile_modes.SCENARIOS` when not given."""
    from inference.compile_modes import SCENARIOS, serving_seconds

    scenarios = SCENARIOS if scenarios is None else scenarios
    cases = []
    rows = [(f"made-up run (cold {c:g} s, warm {w:g} s, {ms:g} ms a batch)", c, w, ms) for c, w, ms in SERVING_CASES]
    rows += [(f"measured {mode}", float(r.compile_cold_s), float(r.compile_warm_s), float(r.ms_per_batch))
             for mode, r in table.iterrows()]
    for label, cold, warm, ms in rows:
        for scenario in scenarios:
            expected = serving_seconds(cold, warm, ms, scenario)
            cases.append(Case(f"{label}, {scenario.name}", (cold, warm, ms, scenario),
                              lambda a, e=expected: isinstance(a, (int, float)) and math.isclose(a, e, rel_tol=1e-6),
                              _why(scenario), f"{expected:,.4g} s"))
    for scenario in scenarios:
        reference = {mode: serving_seconds(r.compile_cold_s, r.compile_warm_s, r.ms_per_batch, scenario)
                     for mode, r in table.iterrows()}
        try:
            yours = {mode: float(candidate(r.compile_cold_s, r.compile_warm_s, r.ms_per_batch, scenario))
                     for mode, r in table.iterrows()}
        except NotImplementedError:  # an exercise not written yet: its own message says what to do
            raise
        except Exception:  # the check below reports which case raised
            continue
        chosen, best = min(yours, key=yours.get), min(reference, key=reference.get)
        extra = reference[chosen] - reference[best]
        print(f"{scenario.name} ({scenario.description}): your figures choose {chosen}, which costs "
              f"{_duration(reference[chosen])}; " + (f"that is the cheapest (next: {_runner_up(reference, best)})"
                                                     if chosen == best else
                                                     f"the cheapest is {best} at {_duration(reference[best])}: your "
                                                     f"choice costs {_duration(extra)} more "
                                                     f"(+{100 * extra / reference[best]:.1f}%)"))
    return check_cases("serving_seconds", candidate, cases,
                       hint="Per start: the one-time cost (cold the first time; later cold again unless the cache "
                            "is kept), plus the start's batches at ms_per_batch / 1000 seconds each.")


def _why(scenario: Scenario) -> str:
    later = "warm (the cache is kept)" if scenario.kept_cache else "cold again (empty caches every time)"
    return (f"{scenario.starts} start(s): one cold compile, the {max(scenario.starts - 1, 0)} later ones {later}, "
            f"plus {scenario.starts} x {scenario.batches_per_start:,} batches")


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds:,.1f} s"


def _runner_up(costs: Mapping[str, float], best: str) -> str:
    others = {mode: cost for mode, cost in costs.items() if mode != best}
    if not others:
        return "no other run"
    second = min(others, key=others.get)
    return f"{second}, {_duration(others[second] - costs[best])} more"


__all__ = ["PLAUSIBLE_SPEEDUP", "SERVING_CASES", "check_serving_seconds", "check_speedup_predictions"]
