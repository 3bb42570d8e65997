"""Notebook 00's exercises: each reference answer passes its check, a typical mistake fails it (under
WORKSHOP_STRICT=1), and an unanswered exercise (the participant's skeleton returns None) is said so
without a traceback, because the browser test runs the participant's copy to its verdict untouched."""

import re

import nbformat
import pytest
from notebook_exercises import SolutionExercises

from tinyllama import course
from tinyllama.costs import ceilings
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


@pytest.mark.parametrize("mistake, message", [
    (("2 * n**3", "n**3"), "2x too small: each of the n^3 terms is a multiply AND an add"),  # multiply-add as one FLOP
    (("(ms * 1e-3)", "ms"), "1000x too small: milliseconds are 1e-3 seconds"),  # milliseconds taken for seconds
    (("/ 1e12", "/ 1e9"), "1000x too large: divided by 1e9 (giga): tera is 1e12"),  # GFLOP/s, not TFLOP/s
])
def test_matmul_rate_mistakes_fail(notebook, measured, mistake, message):
    with pytest.raises(CheckpointFailed, match=re.escape(message)):
        _run(notebook, "00.1", measured, mistake)


@pytest.mark.parametrize("mistake, message", [
    (("2 * nbytes", "nbytes"), "2x too small: a copy reads every byte AND writes it: count both"),  # reads only
    (("(ms * 1e-3)", "ms"), "1000x too small: milliseconds are 1e-3 seconds"),
    (("/ 1e12", "/ 1e9"), "1000x too large: divided by 1e9 (giga): tera is 1e12"),  # GB/s, not TB/s
    (("/ 1e12", "/ 2**40"), "0.9095x the expected value"),  # TiB/s: tera is 1e12 bytes here, as the datasheets count
])
def test_copy_bandwidth_mistakes_fail(notebook, measured, mistake, message):
    with pytest.raises(CheckpointFailed, match=re.escape(message)):
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


# ------------------------------------------------------------------------ the matrix-size sweep


def _times(single_us, back_to_back_us, issue_us, spread=0.05):
    """CallTimes with medians in microseconds and a p10-p90 band of +-spread around each."""
    from tinyllama.timing import CallTimes, summarize

    def stats(us):
        ms = us / 1e3
        return summarize([ms * (1 - spread), ms, ms * (1 + spread)])

    return CallTimes(stats(single_us), stats(back_to_back_us), stats(issue_us), calls=50)


# An H200's bf16 sweep in shape: a single small product costs its launch (about 25 us), back to back the
# small ones run at the host's issue rate, the large ones at the device's.
GPU_SWEEP = {256: (25.0, 6.0, 5.5), 1024: (30.0, 9.0, 5.5), 2048: (40.0, 28.0, 5.5), 8192: (1460.0, 1450.0, 5.5)}


def _points(sweep, on_gpu=True):
    from tinyllama.course import matmul_sweep

    return [matmul_sweep.SweepPoint(n, "bf16", _times(*us), on_gpu) for n, us in sweep.items()]


def test_the_sweep_classifies_launch_bound_visible_and_busy_sizes():
    points = {p.n: p for p in _points(GPU_SWEEP)}
    assert [points[n].regime for n in (256, 1024, 2048, 8192)] == [
        "launch-bound", "launch-bound", "launch visible", "device busy"]
    assert points[256].issue_bound and not points[8192].issue_bound
    assert points[8192].back_to_back_tflops == pytest.approx(2 * 8192**3 / 1450e-6 / 1e12)


def test_overlapping_bands_are_within_noise_not_launch_bound():
    from tinyllama.course import matmul_sweep

    noisy = matmul_sweep.SweepPoint(512, "bf16", _times(30.0, 14.0, 5.0, spread=0.5), True)
    assert noisy.single_over_back_to_back > matmul_sweep.LAUNCH_BOUND_FACTOR
    assert noisy.regime == "device busy"  # the two bands overlap: no verdict beyond the noise


def test_the_lessons_follow_the_data():
    from tinyllama.course import matmul_sweep

    text = " ".join(matmul_sweep.lessons(_points(GPU_SWEEP)))
    assert "Launch-bound single calls at n = 256, 1024" in text
    assert "busy with the work at n = 8192" in text
    assert "host set the pace at n = 256:" in text  # 5.5 of 6 us; at 1024 5.5 of 9 us is not
    # A device with no launch-bound size: the text must not claim one.
    calm = {n: (us[1] * 1.01, us[1], 1.0) for n, us in GPU_SWEEP.items()}
    text = " ".join(matmul_sweep.lessons(_points(calm)))
    assert "No size of the sweep" in text and "Launch-bound single calls" not in text
    assert "host set the pace" not in text
    cpu = " ".join(matmul_sweep.lessons(_points(GPU_SWEEP, on_gpu=False)))
    assert cpu.startswith("On a CPU") and {p.regime for p in _points(GPU_SWEEP, on_gpu=False)} == {"no launch (CPU)"}
    with pytest.raises(ValueError, match="no sweep points"):
        matmul_sweep.lessons([])


def test_the_half_rate_size_reads_the_chosen_series():
    from tinyllama.course import matmul_sweep

    points = _points(GPU_SWEEP)
    assert matmul_sweep.half_rate_n(points) == 2048 and matmul_sweep.half_rate_n(points, back_to_back=False) == 2048
    fast = {512: (10.0, 1.0, 0.5), 1024: (10.0, 8.0, 0.5), 2048: (64.0, 64.0, 0.5)}  # rates 268, 268, 268 back to back
    assert matmul_sweep.half_rate_n(_points(fast)) == 512
    assert matmul_sweep.half_rate_n(_points(fast), back_to_back=False) == 1024


def test_single_and_back_to_back_times_are_measured_on_the_cpu():
    import torch

    from tinyllama.course import matmul_sweep
    from tinyllama.timing import time_single_and_back_to_back

    times = time_single_and_back_to_back(lambda: torch.ones(8).sum(), "cpu", warmup=1, repeat=3, target_ms=0.5,
                                         max_calls=7)
    assert 1 <= times.calls <= 7 and times.single.n == times.back_to_back.n == 3
    assert times.issue.median == times.back_to_back.median  # on the CPU the host does the work
    points = matmul_sweep.sweep("fp32", [16, 8], torch.device("cpu"), warmup=1, repeat=2, target_ms=0.2)
    assert [p.n for p in points] == [8, 16] and all(p.single_tflops > 0 for p in points)
    with pytest.raises(ValueError, match="unknown precision"):
        matmul_sweep.sweep("fp64", [8], torch.device("cpu"))
    with pytest.raises(ValueError, match="at least 1"):
        time_single_and_back_to_back(lambda: None, "cpu", repeat=0)
