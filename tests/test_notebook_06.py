"""Notebook 06's exercise checks catch plausible wrong answers: each check cell of the solution notebook is
run on the reference answer (it passes) and on an answer with one typical mistake (it fails, under
WORKSHOP_STRICT=1). The modes table is made up, shaped as inference.compile_modes.modes_table makes it."""

import math
import re

import pandas as pd
import pytest
from notebook_exercises import SolutionExercises

from inference import compile_modes as cm
from tinyllama import course
from tinyllama.course.break_even_checks import check_break_even
from tinyllama.course.checkpoints import CheckpointFailed
from tinyllama.course.compile_mode_checks import (
    check_serving_seconds,
    check_speedup_predictions,
)

pytestmark = pytest.mark.usefixtures("strict")

ALL_MODES = ("default", "reduce-overhead", "max-autotune")
TABLE = pd.DataFrame({"order": [0, 1, 2], "compile_cold_s": [1.0, 14.0, 16.0], "compile_warm_s": [1.0, 3.0, 3.5],
                      "ms_per_batch": [9.5, 4.8, 4.7], "speedup": [1.0, 9.5 / 4.8, 9.5 / 4.7]},
                     index=pd.Index(["eager", "default", "reduce-overhead"], name="mode"))


@pytest.fixture(scope="module")
def notebook():
    return SolutionExercises("06_torch_compile")


def _namespace():
    return {"math": math, "course": course, "pd": pd, "cm": cm, "ALL_MODES": ALL_MODES, "table": TABLE,
            "check_break_even": check_break_even, "check_serving_seconds": check_serving_seconds,
            "check_speedup_predictions": check_speedup_predictions}


def test_the_reference_answers_pass(notebook):
    assert notebook.ids() == ["06.1", "06.2", "06.3"]
    for exercise in notebook.ids():
        notebook.run(exercise, _namespace())


@pytest.mark.parametrize("mistake", [
    ('predicted_speedup["max-autotune"] = 2.5\n', ""),  # a mode left without a prediction
    ('predicted_speedup["default"] = 1.5', 'predicted_speedup["default"] = 50'),  # "50% faster", not a ratio
    ('predicted_speedup["default"] = 1.5', 'predicted_speedup["default"] = 0.004'),  # a time in seconds
    ('predicted_speedup["default"] = 1.5', 'predicted_speedup["max_autotune"] = 1.5'),  # a mode that does not exist
])
def test_prediction_mistakes_fail(notebook, mistake):
    with pytest.raises(CheckpointFailed):
        notebook.run("06.1", _namespace(), mistake)


SAVED = "saved_s = (eager_ms - compiled_ms) / 1e3"
GUARD = "if saved_s > 0 else math.inf"


@pytest.mark.parametrize("mistake, message", [
    # the slips of break_even_checks.BREAK_EVEN_SLIPS, the one list of 06.2 and 16.3
    ((SAVED, "saved_s = eager_ms - compiled_ms"), "1000 times too few steps"),  # seconds over milliseconds
    ((GUARD, "if saved_s != 0 else math.inf"), "negative number of steps where the compiled step is slower"),
    ((" if saved_s > 0 else math.inf", ""), "divides by zero where the two steps take equal times"),
    (("compile_s / saved_s", "saved_s / compile_s"), "is upside down: it divides the time a step saves"),
    ((SAVED, "saved_s = compiled_ms / 1e3"), "counts the compiled steps that fit into the compile time"),
    ((SAVED, "saved_s = eager_ms / 1e3"), "counts the eager steps that fit into the compile time"),
    ((GUARD, "if saved_s > 0 else None"), "where it saves nothing it returns None"),
    (("return compile_s / saved_s", "return compile_s * 1e3 / saved_s"), "1000 times too many steps"),
    ((GUARD, "if saved_s >= 0 else math.inf"), "(> 0, not >= 0)"),  # 0 / 0 when compiled is as fast
    ((SAVED, "saved_s = (compiled_ms - eager_ms) / 1e3"), "takes the saving as compiled - eager"),
    ((SAVED, "saved_s = eager_ms / compiled_ms"), "divides by the speed-up eager / compiled"),
    # no typical slip: the general hint
    (("return compile_s / saved_s", "return 2 * compile_s / saved_s"), "in one unit (seconds and milliseconds"),
])
def test_break_even_mistakes_fail_each_with_its_own_message(notebook, mistake, message):
    with pytest.raises(CheckpointFailed, match=re.escape(message)) as failed:
        notebook.run("06.2", _namespace(), mistake)
    from tinyllama.course.break_even_checks import BREAK_EVEN_SLIPS

    others = [slip.name for slip in BREAK_EVEN_SLIPS if message not in slip.message and slip.message in str(failed.value)]
    assert not others, f"the feedback names other mistakes too: {others}"


def test_every_break_even_slip_differs_from_the_reference_and_is_named_as_itself():
    """One list of slips for 06.2 and 16.3 (break_even_checks.BREAK_EVEN_SLIPS): each differs from the answer on
    the check's cases, and the naming function names each as itself (no earlier slip answers the same)."""
    from tinyllama.course import break_even_checks as cc

    right = [cc.outcome(cc.break_even_steps, case) for case in cc.BREAK_EVEN_CASES]
    for slip in cc.BREAK_EVEN_SLIPS:
        answers = [cc.outcome(slip.value, case) for case in cc.BREAK_EVEN_CASES]
        assert not all(map(cc.same_outcome, answers, right)), slip.name
        assert cc.name_break_even_slip(slip.value) == slip.message


@pytest.mark.parametrize("mistake", [
    ("later_s = compile_warm_s if scenario.kept_cache else compile_cold_s",
     "later_s = compile_cold_s"),  # the kept cache ignored: every restart cold
    ("later_s = compile_warm_s if scenario.kept_cache else compile_cold_s",
     "later_s = compile_warm_s"),  # a fresh node thought warm
    ("one_time_s = compile_cold_s + (scenario.starts - 1) * later_s",
     "one_time_s = compile_cold_s"),  # compiled once, whatever the starts
    ("ms_per_batch / 1e3", "ms_per_batch"),  # milliseconds added to seconds
])
def test_serving_mistakes_fail(notebook, mistake):
    with pytest.raises(CheckpointFailed):
        notebook.run("06.3", _namespace(), mistake)


def test_serving_check_says_what_a_wrong_choice_costs(capsys):
    def milliseconds_as_seconds(cold, warm, ms, scenario):  # the batches outweigh any compile: compiled always wins
        later = warm if scenario.kept_cache else cold
        return cold + (scenario.starts - 1) * later + scenario.starts * scenario.batches_per_start * ms

    with pytest.raises(CheckpointFailed):
        check_serving_seconds(milliseconds_as_seconds, TABLE)
    out = capsys.readouterr().out
    # the one-off job: 500 batches save 2.4 s, far less than 13 s of compile beyond eager's
    assert "one-off job (" in out and "your figures choose reduce-overhead" in out
    assert "the cheapest is eager at 5.8 s: your choice costs 12.6 s more (+219.1%)" in out


def test_prediction_check_compares_with_what_was_measured(capsys):
    assert check_speedup_predictions({"default": 1.5, "reduce-overhead": 3.0, "max-autotune": 2.0},
                                     {"default": 1.98, "reduce-overhead": 2.01}, ALL_MODES, "a CPU has no graphs")
    out = capsys.readouterr().out
    assert "predicted 1.5 x, measured 1.98 x" in out
    assert "max-autotune over eager: predicted 2 x; measured: a CPU has no graphs" in out
