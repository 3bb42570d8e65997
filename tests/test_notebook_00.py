"""Notebook 00's exercises: each reference answer passes its check, a typical mistake fails it (under
WORKSHOP_STRICT=1), and an unanswered exercise (the participant's skeleton returns None) is said so
without a traceback, because the browser test runs the participant's copy to its verdict untouched."""

import nbformat
import pytest

from notebook_exercises import SolutionExercises
from tinyllama import ceilings, course
from tinyllama.course import rate_checks
from tinyllama.course.checkpoints import CheckpointFailed
from tinyllama.course.results import checkout_root

pytestmark = pytest.mark.usefixtures("strict")


@pytest.fixture(scope="module")
def notebook():
    return SolutionExercises("00_environment_check")


@pytest.fixture(scope="module")
def measured():
    """Ceilings measured on this CPU, small and quick: the check cells compare with their figures."""
    matmul = {p: ceilings.measure_matmul_tflops(p, n=48, device="cpu", repeat=2) for p in ("fp32", "bf16")}
    return {"matmul": matmul, "copy": ceilings.measure_copy_tbs(2**20, device="cpu", repeat=2)}


def _run(notebook, exercise, measured, replace=None):
    namespace = {"course": course, "rate_checks": rate_checks, **measured}
    return notebook.run(exercise, namespace, replace)


def test_the_exercises_and_their_reference_answers_pass(notebook, measured):
    assert notebook.ids() == ["00.1", "00.2", "00.3"]
    for exercise in notebook.ids():
        _run(notebook, exercise, measured)


@pytest.mark.parametrize("mistake", [
    ("2 * n**3", "n**3"),  # the multiply-add counted as one FLOP
    ("(ms * 1e-3)", "ms"),  # milliseconds taken for seconds
    ("/ 1e12", "/ 1e9"),  # GFLOP/s, not TFLOP/s
])
def test_matmul_rate_mistakes_fail(notebook, measured, mistake):
    with pytest.raises(CheckpointFailed):
        _run(notebook, "00.1", measured, mistake)


@pytest.mark.parametrize("mistake", [
    ("2 * nbytes", "nbytes"),  # only the bytes read
    ("(ms * 1e-3)", "ms"),
])
def test_copy_bandwidth_mistakes_fail(notebook, measured, mistake):
    with pytest.raises(CheckpointFailed):
        _run(notebook, "00.2", measured, mistake)


@pytest.mark.parametrize("mistake", [
    ('(torchvision ResNet-50)"] = "tf32"', '(torchvision ResNet-50)"] = "fp32"'),  # cuDNN's TF32 default missed
    ("dtype=torch.bfloat16)\"] = \"bf16\"", "dtype=torch.bfloat16)\"] = \"fp32\""),  # autocast ignored
    ('1 GiB each"] = "copy"', '1 GiB each"] = "fp16"'),  # an element-wise add is memory-bound
])
def test_ceiling_choice_mistakes_fail(notebook, measured, mistake):
    with pytest.raises(CheckpointFailed):
        _run(notebook, "00.3", measured, mistake)


def test_a_wrong_factor_is_named(lenient, capsys):
    assert not rate_checks.check_formula("f", lambda n, ms: n**3 / (ms * 1e-3) / 1e12, [((1000, 2.0), 1.0)], "00.1",
                                         factors={2.0: "a multiply AND an add"})
    out = capsys.readouterr().out
    assert "2x too small: a multiply AND an add" in out
    assert not rate_checks.check_formula("f", lambda n, ms: 2 * n**3 / ms / 1e12, [((1000, 2.0), 1.0)], "00.1")
    assert "1000x too small: milliseconds are 1e-3 seconds" in capsys.readouterr().out


def test_unanswered_exercises_are_said_so_without_raising(lenient, capsys):
    assert not rate_checks.check_formula("matmul_tflops", lambda n, ms: None, [((1000, 2.0), 1.0)], "00.1")
    assert "course.reveal('00.1')" in capsys.readouterr().out
    assert not rate_checks.check_ceiling_choices({s: None for s in rate_checks.SITUATIONS})
    assert "course.reveal('00.3')" in capsys.readouterr().out


def test_a_wrong_choice_says_why(lenient, capsys):
    answers = {s: expected for s, (expected, _) in rate_checks.SITUATIONS.items()}
    assert rate_checks.check_ceiling_choices(answers)
    answers["x @ w with x and w fp32 tensors"] = "tf32"
    assert not rate_checks.check_ceiling_choices(answers)
    assert "allow_tf32 is False by default" in capsys.readouterr().out
    answers["x @ w with x and w fp32 tensors"] = "fast"
    assert not rate_checks.check_ceiling_choices(answers)
    assert "not a ceiling name" in capsys.readouterr().out


def test_the_participant_copy_runs_to_its_verdict_unanswered():
    """The browser test runs notebooks/00 untouched: nothing in it may raise for a missing answer."""
    participant = nbformat.read(checkout_root() / "notebooks" / "00_environment_check.ipynb", as_version=4)
    sources = "\n".join(cell.source for cell in participant.cells)
    assert "NotImplementedError" not in sources
    assert "return None" in sources and "predicted_fraction_of_peak = None" in sources


def test_the_record_keeps_the_keys_later_notebooks_read():
    """course.device_ceilings reads matmul_<precision>_tflops, matmul_size and copy_tbs from notebook 00."""
    nb = nbformat.read(checkout_root() / "solutions" / "00_environment_check.ipynb", as_version=4)
    record = [cell.source for cell in nb.cells if "session.record(" in cell.source][0]
    for key in ('f"matmul_{precision}_tflops"', '"matmul_size"', '"copy_tbs"', '"verdict"'):
        assert key in record
