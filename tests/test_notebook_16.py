"""Notebook 16's exercise checks catch plausible wrong answers: each check cell of the solution notebook is
run on the reference answer (it passes) and on an answer with one typical mistake (it fails, under
WORKSHOP_STRICT=1). The operator counts are those of a V4 step at the ci preset on a CPU (eager, then
compiled), as the profiler gave them."""

import inspect
import math

import pandas as pd
import pytest
from notebook_exercises import SolutionExercises

from tinyllama import course
from tinyllama.course import break_even_checks, compile_checks, compile_mode_checks
from tinyllama.course.checkpoints import CheckpointFailed
from tinyllama.course.results import checkout_root

pytestmark = pytest.mark.usefixtures("strict")

PATH = checkout_root() / "solutions" / "16_sdpa_and_compile.ipynb"
SDPA_CPU = "aten::_scaled_dot_product_flash_attention_for_cpu"
EAGER_CALLS = pd.Series({"aten::mm": 27.0, SDPA_CPU: 2.0, "aten::scaled_dot_product_attention": 2.0, "aten::silu": 2.0,
                         "aten::rsqrt": 5.0, "aten::embedding": 1.0, "aten::mul": 72.0, "aten::cat": 8.0})
COMPILED_CALLS = pd.Series({"aten::mm": 27.0, SDPA_CPU: 2.0, "aten::rsqrt": 1.0, "aten::embedding": 1.0,
                            "aten::mul": 10.0})
PROFILE_NAMES = ["aten::scaled_dot_product_attention", SDPA_CPU, "aten::mm", "cpp_fused_add_0"]


@pytest.fixture(scope="module")
def notebook():
    return SolutionExercises(PATH.stem)


def _namespace():
    return {"math": math, "course": course, "pd": pd, "eager_calls": EAGER_CALLS, "compiled_calls": COMPILED_CALLS,
            "sdpa_operator": SDPA_CPU, "names": PROFILE_NAMES, **{n: getattr(compile_checks, n) for n in (
                "check_backend_reader", "check_operator_fates")}, "check_break_even": break_even_checks.check_break_even,
            "check_break_even_steps": break_even_checks.check_break_even_steps}


def _run(notebook, exercise, replace=None):
    """Run the solution cell of ``exercise`` (with ``replace`` = (old, new) applied) and its check cell."""
    notebook.run(exercise, _namespace(), replace)


def test_the_reference_answers_pass(notebook):
    assert set(notebook.found) == {"16.1", "16.2", "16.3"}
    for exercise in ("16.1", "16.2", "16.3"):
        _run(notebook, exercise)


@pytest.mark.parametrize("mistake", [
    # the CPU's operator left out: it starts like the GPU flash operator, so a CPU profile reads "flash"
    ('(("aten::_scaled_dot_product_flash_attention_for_cpu", "flash (CPU)"),\n', "("),
    # kernel names instead of operators: cuDNN's Hopper kernel has "flash" in its name
    ("if any(name.startswith(operator) for name in names):",
     "if any(operator.split('_scaled_dot_product_')[1].split('_')[0] in name for name in names):"),
])
def test_backend_reader_mistakes_fail(notebook, mistake):
    with pytest.raises(CheckpointFailed):
        _run(notebook, "16.1", mistake)


def test_a_reader_that_matches_kernel_substrings_fails():
    def by_kernel(names):  # a plausible first try: look for "flash" anywhere
        text = " ".join(names).lower()
        return "flash" if "flash" in text else "cuDNN" if "cudnn" in text else "math"
    with pytest.raises(CheckpointFailed):
        compile_checks.check_backend_reader(by_kernel, PROFILE_NAMES)


@pytest.mark.parametrize("mistake", [
    ('["aten::mm"] = "same"', '["aten::mm"] = "fewer"'),  # GEMMs thought fused
    ('["aten::rsqrt"] = "fewer"', '["aten::rsqrt"] = "gone"'),  # the final norm forgotten: it stays eager
    ('["aten::scaled_dot_product_attention"] = "gone"', '["aten::scaled_dot_product_attention"] = "same"'),
    ('predicted_fates["aten::embedding"] = "same"\n', ""),  # a required operator left without a prediction
])
def test_operator_fate_mistakes_fail(notebook, mistake):
    with pytest.raises(CheckpointFailed):
        _run(notebook, "16.2", mistake)


def test_an_operator_not_in_the_eager_step_is_refused():
    with pytest.raises(CheckpointFailed):
        compile_checks.check_operator_fates({"aten::bmm": "same"}, EAGER_CALLS, COMPILED_CALLS)


BREAK_EVEN_SLIPS = [  # (the solution's text, the slip, what the check must say)
    ("saved_s = (eager_ms - compiled_ms) / 1e3", "saved_s = eager_ms - compiled_ms",
     "1000 times too few steps: the compile is in seconds"),
    ("compile_s / saved_s", "saved_s / compile_s", "is upside down"),
    ("if saved_s > 0 else math.inf", "if saved_s != 0 else math.inf",
     "negative number of steps where the compiled step is slower"),
    ("return compile_s / saved_s if saved_s > 0 else math.inf", "return compile_s / saved_s",
     "divides by zero where the two steps take equal times"),
    ("saved_s = (eager_ms - compiled_ms) / 1e3", "saved_s = eager_ms / 1e3",
     "counts the eager steps that fit into the compile time"),
    ("saved_s = (eager_ms - compiled_ms) / 1e3", "saved_s = compiled_ms / 1e3",
     "counts the compiled steps that fit into the compile time"),
    ("if saved_s > 0 else math.inf", "if saved_s > 0 else 0", "where it saves nothing it returns 0"),
    ("if saved_s > 0 else math.inf", "if saved_s > 0 else None", "where it saves nothing it returns None"),
    # the slips 06.2 names too: one list (break_even_checks.BREAK_EVEN_SLIPS), each named before the catch-all
    ("if saved_s > 0 else math.inf", "if saved_s >= 0 else math.inf", "(> 0, not >= 0)"),
    ("return compile_s / saved_s", "return compile_s * 1e3 / saved_s", "1000 times too many steps"),
    ("saved_s = (eager_ms - compiled_ms) / 1e3", "saved_s = (compiled_ms - eager_ms) / 1e3",
     "takes the saving as compiled - eager"),
    ("saved_s = (eager_ms - compiled_ms) / 1e3", "saved_s = eager_ms / compiled_ms", "divides by the speed-up eager / compiled"),
]


@pytest.mark.parametrize("old, new, message", BREAK_EVEN_SLIPS, ids=[slip[1] for slip in BREAK_EVEN_SLIPS])
def test_each_break_even_slip_fails_with_its_own_message(notebook, old, new, message):
    with pytest.raises(CheckpointFailed) as failed:
        _run(notebook, "16.3", (old, new))
    text = str(failed.value)
    assert message in text and "It is wrong on" in text
    others = [m for _, _, m in BREAK_EVEN_SLIPS if m != message and m in text]
    assert not others, f"the feedback names other mistakes too: {others}"


def test_the_reference_break_even_passes_with_the_general_checks_message(notebook, capsys):
    _run(notebook, "16.3")
    assert "PASS: break_even is right on all 5 cases" in capsys.readouterr().out


def test_a_wrong_break_even_of_no_known_kind_gets_the_general_feedback(notebook):
    with pytest.raises(CheckpointFailed, match="break_even is wrong on .* cases") as failed:
        _run(notebook, "16.3", ("return compile_s / saved_s", "return 2 * compile_s / saved_s"))
    assert "It is wrong on" not in str(failed.value)


def test_every_break_even_slip_differs_from_the_answer_and_from_the_others():
    """The check's cases separate each listed slip (the one list of 06.2 and 16.3) from the right answer and from
    every other slip, and the catch-all never hides a named slip."""
    cases = break_even_checks.BREAK_EVEN_CASES
    outcomes = {}
    for slip in break_even_checks.BREAK_EVEN_SLIPS:
        got = [break_even_checks.outcome(slip.value, case) for case in cases]
        reference = [break_even_checks.break_even_steps(*case) for case in cases]
        assert not all(map(break_even_checks.same_outcome, got, reference)), slip.name
        assert break_even_checks.name_break_even_slip(slip.value) == slip.message
        outcomes[slip.name] = got
    for a in outcomes:
        for b in outcomes:
            assert a == b or not all(map(break_even_checks.same_outcome, outcomes[a], outcomes[b])), (a, b)


def test_the_two_break_even_checks_live_in_one_module_and_the_notebooks_modules_import_neither_other():
    for module in (compile_checks, compile_mode_checks):
        assert not hasattr(module, "BREAK_EVEN_SLIPS") and not hasattr(module, "name_break_even_slip")
    assert "import" not in "".join(line for line in inspect.getsource(compile_mode_checks).splitlines()
                                   if "compile_checks" in line)
    assert "compile_mode_checks import" not in inspect.getsource(compile_checks)


def test_break_even_sentence():
    assert "never pays" in compile_checks.describe_break_even(10.0, 5.0, 6.0)
    # The stored H200 run's cold compile: 12.67 s, eager step 43.00 ms, compiled 24.88 ms.
    cold = compile_checks.describe_break_even(12.67, 43.0, 24.88)
    assert "from step 700 on" in cold and "18.12 ms saved a step = 699.2 steps" in cold
    assert "30.1 s eager = 12.7 s compile + 17.4 s compiled" in cold
    # Its warm compile, 0.52 s: under a second, so milliseconds, and no "0.0 minutes" of anything.
    warm = compile_checks.describe_break_even(0.52, 43.0, 24.88)
    assert "520 ms of compile" in warm and "28.7 steps" in warm and "from step 29 on" in warm
    assert "1.23 s eager = 0.520 s compile + 0.714 s compiled" in warm
    assert "minutes" not in warm and "0.0 " not in warm


@pytest.mark.parametrize("seconds, shown", [(0.0004, "0.400 ms"), (0.72, "720 ms"), (1.0, "1.00 s"), (17.4, "17.4 s"),
                                            (125.4, "125 s"), (1200.0, "20.0 minutes"), (3 * 86400.0, "72.0 hours")])
def test_durations_are_shown_in_a_unit_of_their_size(seconds, shown):
    assert compile_checks.format_duration(seconds) == shown


def test_the_terms_of_a_sum_share_a_unit():
    assert compile_checks.format_duration(0.5, like=30.0) == "0.500 s"
    with pytest.raises(ValueError):
        compile_checks.format_duration(-1.0)


@pytest.mark.parametrize("compile_s, eager_ms, compiled_ms", [(12.67, 43.0, 24.88), (0.38, 9.95, 7.26),
                                                              (33.9, 9.95, 7.26), (300.0, 25.0, 24.0)])
def test_the_printed_sum_adds_up(compile_s, eager_ms, compiled_ms):
    # "..., which take E eager = C compile + S compiled": E = C + S, to the three digits printed.
    sentence = compile_checks.describe_break_even(compile_s, eager_ms, compiled_ms)
    eager, rest = sentence.split("which take ")[1].split(" eager = ")
    compile_part, compiled = rest.split(" compile + ")
    unit = eager.split()[1]
    assert compile_part.split()[1] == unit and compiled.split()[1] == unit
    number = lambda text: float(text.split()[0].replace(",", ""))  # noqa: E731
    assert number(eager) == pytest.approx(number(compile_part) + number(compiled), rel=0.01)
