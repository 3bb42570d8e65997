"""Notebook 01's exercises catch plausible wrong answers (each reference answer passes its check, a typical
mistake fails it under WORKSHOP_STRICT=1), and inference.launch measures and detects what the notebook
says: host time against device time, the flat region of a sweep, the crossover batch."""

import re
from types import SimpleNamespace

import pytest

import inference
from inference import launch
from notebook_exercises import SolutionExercises
from tinyllama import course
from tinyllama.course import rate_checks
from tinyllama.course.checkpoints import CheckpointFailed
from tinyllama.timing import summarize

pytestmark = pytest.mark.usefixtures("strict")

SIZES = [1, 8, 32, 64, 128, 256]
MS = [5.55, 5.50, 5.28, 9.42, 17.6, 33.9]  # an H200's fp32 ResNet-50 sweep: flat to 32


@pytest.fixture(scope="module")
def notebook():
    return SolutionExercises("01_inference_baseline")


def _namespace():
    baseline = SimpleNamespace(batch_size=64, ms_per_batch=9.415, throughput=64 / 9.415e-3)
    first = SimpleNamespace(host_ms=SimpleNamespace(median=5.3))
    return {"course": course, "rate_checks": rate_checks, "launch": launch, "baseline": baseline, "first": first,
            "device": SimpleNamespace(type="cuda"),
            "sizes": SIZES, "ms_per_batch": MS, "flat_end": launch.flat_until(SIZES, MS)}


def test_the_reference_answers_pass(notebook, capsys):
    assert notebook.ids() == ["01.1", "01.2", "01.3"]
    namespace = _namespace()
    for exercise in notebook.ids():
        notebook.run(exercise, namespace)
    assert "predicted end of the launch-bound region: batch 40" in capsys.readouterr().out


@pytest.mark.parametrize("exercise, mistake, message", [
    ("01.1", ("(ms_per_batch * 1e-3)", "ms_per_batch"), "1000x too small: milliseconds are 1e-3 seconds"),
    ("01.1", ("batch_size / (ms_per_batch * 1e-3)", "(ms_per_batch * 1e-3) / batch_size"),  # seconds per sample
     "samples_per_second(1, 5) = 0.005 samples/s, expected 200 samples/s (2.5e-05x the expected value)"),
    ("01.1", ("batch_size / (ms_per_batch * 1e-3)", "1 / (ms_per_batch * 1e-3)"),  # batches per second
     "samples_per_second(256, 32) = 31.25 samples/s, expected 8000 samples/s (0.003906x the expected value)"),
    ("01.2", ("break", "continue"), "a bump ends the flat region even if a later point is low again"),
    ("01.2", ("            break", "            last = size\n            break"), "flat_until differs from the reference"),
    ("01.3", ("ms_per_batch / batch_size)", "ms_per_batch)"), "too small: divide the time per batch by its batch size"),
    ("01.3", ("host_ms / (ms_per_batch / batch_size)", "(ms_per_batch / batch_size) / host_ms"),  # inverted
     "crossover_batch(5, 32, 256) = 0.025, expected 40 (0.000625x the expected value)"),
    ("01.3", ("host_ms / (ms_per_batch / batch_size)", "host_ms * (ms_per_batch / batch_size)"),  # multiplied
     "crossover_batch(5, 32, 256) = 0.625, expected 40 (0.01562x the expected value)"),
])
def test_mistakes_fail(notebook, exercise, mistake, message):
    namespace = _namespace()
    with pytest.raises(CheckpointFailed, match=re.escape(message)):
        notebook.run(exercise, namespace, mistake)


def test_flat_until_and_crossover():
    assert launch.flat_until(SIZES, MS) == 32
    assert launch.flat_until([1, 2, 4], [1.0, 3.0, 3.0]) == 1
    assert launch.flat_until([1, 2, 4], [1.0, 1.1, 1.19]) == 4
    assert launch.flat_until([1, 2, 4, 8], [1.0, 1.1, 2.0, 1.0]) == 2  # a bump ends it
    with pytest.raises(ValueError):
        launch.flat_until([1, 2], [1.0])
    assert launch.crossover_batch(5.3, 33.9, 256) == pytest.approx(40.02, rel=1e-3)
    with pytest.raises(ValueError):
        launch.crossover_batch(5.0, 0.0, 256)


def test_launch_bound_needs_a_gpu_and_a_host_near_the_device_time():
    def pair(host_ms, device_ms, applies=True):
        return launch.HostDevice(1, summarize([host_ms] * 3), summarize([device_ms] * 3), applies)
    assert pair(5.3, 5.5).launch_bound
    assert not pair(5.3, 33.9).launch_bound
    assert not pair(5.0, 5.0, applies=False).launch_bound  # a CPU computes what it issues
    assert pair(2.0, 4.0).host_ratio == pytest.approx(0.5)


def test_host_and_device_times_on_the_cpu():
    config = inference.BenchmarkConfig(network="resnet18", batch_size=1, input_size=32, warmup=1, iterations=2,
                                       device="cpu", progress=False)
    timed = launch.host_and_device_ms(config)
    assert timed.batch_size == 1 and timed.host_ms.n == 2 and not timed.applies
    assert timed.host_ms.median == timed.device_ms.median > 0  # the host's time is the whole time on a CPU


def test_flat_check_says_what_to_compare_with(lenient, capsys):
    def against_neighbour(sizes, ms):
        last = sizes[0]
        for i in range(1, len(sizes)):
            if ms[i] > launch.FLAT_TOLERANCE * ms[i - 1]:
                break
            last = sizes[i]
        return last
    assert not rate_checks.check_flat_until(against_neighbour, launch.flat_until)
    out = capsys.readouterr().out
    assert "slow creep" in out and "not with its neighbour" in out
    assert not rate_checks.check_flat_until(lambda s, m: None, launch.flat_until)
    assert "course.reveal('01.2')" in capsys.readouterr().out
