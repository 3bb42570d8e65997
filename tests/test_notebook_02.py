"""Notebook 02's exercise checks catch plausible wrong answers: each check cell of the solution notebook is
run on the reference answer (it passes) and on an answer with one typical mistake (it fails, under
WORKSHOP_STRICT=1). The measurements are replaced by fixed figures of the size an H200 and a CPU give."""

import re
from types import SimpleNamespace

import pytest

from inference.precision import MANTISSA_BITS, AccuracyReport
from notebook_exercises import SolutionExercises
from tinyllama import course
from tinyllama.course.checkpoints import CheckpointFailed
from tinyllama.course.precision_checks import (check_batch_prediction, check_error_ratio, check_unit_roundoff,
                                               measured_rounding_error)

pytestmark = pytest.mark.usefixtures("strict")
MIB = 2**20


@pytest.fixture(scope="module")
def notebook():
    return SolutionExercises("02_precision")


def test_the_exercises_are_numbered():
    assert SolutionExercises("02_precision").ids() == ["02.1", "02.2", "02.3"]


# ------------------------------------------------------------------------------------ 02.1


def _roundoff(notebook, replace=None):
    return notebook.run("02.1", {"course": course, "check_unit_roundoff": check_unit_roundoff}, replace)


def test_the_unit_roundoff_passes(notebook):
    assert _roundoff(notebook)["roundoff_ok"]


@pytest.mark.parametrize("mistake, message", [
    ("2.0 ** -mantissa_bits", "machine epsilon"),  # the spacing, not half of it
    ("2.0 ** -(mantissa_bits + 2)", "you halved the spacing twice"),  # below the errors measured
    ("10.0 ** -mantissa_bits", "mantissa bits are binary digits, so the spacing between 1 and 2 is 2^-m, not 10^-m"),
    ("2.0 ** -mantissa_bits + 1", "raises first and adds 1 afterwards"),  # operator precedence
    ("2.0 ** -(mantissa_bits - 1)", "the exponent is m - 1 instead of m + 1"),
    ("2.0 ** (mantissa_bits + 1)", "the exponent lost its minus sign"),
    # right for the 16-bit formats, wrong for fp32: no single slip, the rows and the general advice say where
    ("2.0 ** -(mantissa_bits + 1 + (mantissa_bits > 20))", "Your bound is below errors that were measured"),
])
def test_wrong_unit_roundoffs_fail_each_with_its_own_message(notebook, mistake, message):
    with pytest.raises(CheckpointFailed, match=re.escape(message)):
        _roundoff(notebook, ("2.0 ** -(mantissa_bits + 1)", mistake))


def test_a_unit_roundoff_that_raises_is_said_so(notebook):
    with pytest.raises(CheckpointFailed, match=r"unit_roundoff\(23\) raised TypeError"):
        _roundoff(notebook, ("2.0 ** -(mantissa_bits + 1)", "2.0 ** -(mantissa_bits + None)"))


def test_the_measured_rounding_errors_approach_the_bound_from_below():
    for fmt, bits in MANTISSA_BITS.items():
        assert 0.98 * 2.0 ** -(bits + 1) <= measured_rounding_error(fmt) <= 2.0 ** -(bits + 1)
    with pytest.raises(ValueError, match="unknown format"):
        measured_rounding_error("fp8")


# ------------------------------------------------------------------------------------ 02.2


def _report(p, rel):
    return AccuracyReport(precision=p, configuration=p, samples=64, max_abs_diff=rel * 112, max_rel_diff=rel,
                          mean_abs_diff=rel * 14, reference_max_abs=112.0, top1_agreement=1.0, finite=True,
                          tolerance={"fp32": 1e-2, "fp16": 1e-2, "bf16": 5e-2}[p])


def _error_ratio(notebook, replace=None, errors=(2.1e-4, 6.4e-4, 5.4e-3)):
    """The H200's figures of 2026-11-22 (fp16 6.4e-4, bf16 5.4e-3 of the largest output) by default."""
    reports = [_report(p, e) for p, e in zip(("fp32", "fp16", "bf16"), errors)]
    namespace = {"course": course, "check_error_ratio": check_error_ratio, "MANTISSA_BITS": MANTISSA_BITS,
                 "unit_roundoff": lambda bits: 2.0 ** -(bits + 1), "network": "resnet50", "device": "cuda",
                 "profile": SimpleNamespace(inference_batch_size=64, image_size=224), "precisions": ("fp32", "fp16", "bf16"),
                 "flags": {"tf32_conv": True, "tf32_matmul": False},
                 "inference": SimpleNamespace(compare_precisions=lambda *args, **kwargs: reports)}
    return notebook.run("02.2", namespace, replace)


def test_the_error_ratio_passes(notebook):
    assert _error_ratio(notebook)["ratio_ok"]
    assert _error_ratio(notebook, errors=(0.0, 7.06e-4, 5.8e-3))["ratio_ok"]  # the CPU's figures


@pytest.mark.parametrize("mistake", [
    'unit_roundoff(MANTISSA_BITS["fp16"]) / unit_roundoff(MANTISSA_BITS["bf16"])',  # upside down
    'MANTISSA_BITS["fp16"] / MANTISSA_BITS["bf16"]',  # the bits' ratio, not the roundoffs'
    "1.0",  # same 16 bits, same error
])
def test_wrong_error_ratios_fail(notebook, mistake):
    with pytest.raises(CheckpointFailed):
        _error_ratio(notebook, ('unit_roundoff(MANTISSA_BITS["bf16"]) / unit_roundoff(MANTISSA_BITS["fp16"])', mistake))


def test_a_network_failing_its_tolerance_fails_the_check(notebook):
    with pytest.raises(CheckpointFailed, match="too far from true fp32"):
        _error_ratio(notebook, errors=(2.1e-4, 2e-2, 0.16))


# ------------------------------------------------------------------------------------ 02.3

# (budget MiB, parameters, 16-bit format, fp32's largest batch, the 16-bit largest batch found)
GPU = (4096, 25_557_032, "fp16", 340, 668)  # ResNet-50 at 224 px: the weights take 2% of the budget
CPU = (6, 1_248_424, "bf16", 11, 68)  # SqueezeNet at 32 px: the weights take 79% of it


def _search(largest, bounded_by="memory budget", full_run=False):
    """A finished search; with ``full_run`` (as on a GPU) the full benchmark at the largest batch completed."""
    result = SimpleNamespace(batch_size=largest, throughput=1000.0) if full_run else None
    return SimpleNamespace(max_batch_size=largest, first_failing=largest + 1, bounded_by=bounded_by, result=result,
                           describe=lambda: f"largest batch that fits: {largest}")


def _batch(notebook, scenario, replace=None, bounded_by="memory budget", full_runs=None):
    budget_mib, params, half, fp32_largest, half_largest = scenario
    on_gpu = half == "fp16"
    full_runs = on_gpu if full_runs is None else full_runs
    bytes_per_value = {"fp32": 4, "fp16": 2, "bf16": 2}
    namespace = {"course": course, "check_batch_prediction": check_batch_prediction, "half": half, "on_gpu": on_gpu,
                 "budget_bytes": budget_mib * MIB, "bytes_per_value": bytes_per_value,
                 "weight_bytes": {p: params * b for p, b in bytes_per_value.items()},
                 # Both searches already ran: the check cell does not search again.
                 "found": {"fp32": _search(fp32_largest, full_run=full_runs),
                           half: _search(half_largest, bounded_by, full_run=full_runs)},
                 "search_config": SimpleNamespace(batch_size=2, input_size=32), "config": SimpleNamespace(input_size=32),
                 "search_network": "squeezenet1_0", "network": "squeezenet1_0",
                 "by_precision": {p: SimpleNamespace(throughput=500.0) for p in ("fp32", half)}}
    return notebook.run("02.3", namespace, replace)


def test_on_a_gpu_a_largest_batch_without_a_completed_full_run_fails_the_check(notebook):
    with pytest.raises(CheckpointFailed, match="without a completed full run"):
        _batch(notebook, GPU, full_runs=False)


@pytest.mark.parametrize("scenario", [GPU, CPU], ids=["gpu", "cpu"])
def test_the_batch_prediction_passes(notebook, scenario):
    assert _batch(notebook, scenario)["prediction_ok"]


@pytest.mark.parametrize("scenario", [GPU, CPU], ids=["gpu", "cpu"])
@pytest.mark.parametrize("mistake", [
    # The 16-bit activations taken as large as fp32's.
    ('per_sample_fp32 * bytes_per_value[half] / bytes_per_value["fp32"]', "per_sample_fp32"),
    # Four times, not twice, the samples per byte.
    ('per_sample_fp32 * bytes_per_value[half] / bytes_per_value["fp32"]', "per_sample_fp32 / 4"),
])
def test_wrong_batch_predictions_fail(notebook, scenario, mistake):
    with pytest.raises(CheckpointFailed):
        _batch(notebook, scenario, mistake)


def test_forgetting_the_weights_fails_where_they_take_most_of_the_budget(notebook):
    with pytest.raises(CheckpointFailed, match="Split the budget"):
        _batch(notebook, CPU, ('(budget_bytes - weight_bytes[half]) / per_sample_half',
                               "budget_bytes / per_sample_half"))
    with pytest.raises(CheckpointFailed):  # the weights' share taken off the fp32 side only
        _batch(notebook, CPU, ('(budget_bytes - weight_bytes["fp32"]) / found["fp32"].max_batch_size',
                               'budget_bytes / found["fp32"].max_batch_size'))


def test_a_search_stopped_by_its_batch_limit_fails_the_check(notebook):
    with pytest.raises(CheckpointFailed, match="batch limit"):
        _batch(notebook, GPU, bounded_by="batch limit")


def test_missing_predictions_fail_with_a_message_not_a_traceback():
    with pytest.raises(CheckpointFailed, match="no prediction written"):
        check_error_ratio(None, 6.4e-4, 5.4e-3)
    with pytest.raises(CheckpointFailed, match="no prediction written"):
        check_batch_prediction(None, 668, 340)
    with pytest.raises(CheckpointFailed, match="found no batch"):
        check_batch_prediction(656.0, None, None)


# ------------------------------------------------------------------------------------ the largest batch's full run


def _probe_fits_full_run_does_not(config):
    """A pretend benchmark: 1 MiB of activations per sample and 1.5 MiB of weights; the full run (the one
    with the reference check, which probes skip) holds 3 MiB more, so it fails at sizes a probe survives."""
    import torch

    import inference

    extra = 0 if not config.check else 3 * MIB
    try:
        held = torch.empty(3 * MIB // 2 + extra + config.batch_size * MIB, dtype=torch.uint8)
    except torch.OutOfMemoryError as error:
        raise inference.OutOfMemoryError(config.batch_size, str(error)) from None
    del held
    return f"full run at {config.batch_size}" if config.check else "probe"


def _search_with_full_runs(budget_mib, **kwargs):
    from inference import sweep
    from inference.config import BenchmarkConfig

    config = BenchmarkConfig(network="resnet18", batch_size=2, device="cpu", progress=False)
    return sweep.find_max_batch_size(config, limit=1024, runner=_probe_fits_full_run_does_not,
                                     memory_budget_bytes=budget_mib * MIB, **kwargs)


def test_the_largest_batch_reported_is_one_whose_full_run_completed():
    found = _search_with_full_runs(12)  # probes fit up to 10 (1.5 + 10 <= 12), full runs up to 7 (4.5 + 7)
    assert (found.max_batch_size, found.first_failing) == (7, 8)
    assert found.result == "full run at 7"
    assert (10, "full run: out of memory") in found.probes and (7, "full run: completed") in found.probes
    assert "batch 8 ran out of memory in its full run" in found.describe()


def test_the_full_runs_bisect_to_the_search_resolution():
    found = _search_with_full_runs(100, resolution=1 / 8)  # probes to about 98, full runs to 95
    assert found.result == f"full run at {found.max_batch_size}"
    assert 95 - 95 // 8 <= found.max_batch_size <= 95 < found.first_failing


def test_a_search_where_no_full_run_completes_reports_no_batch():
    found = _search_with_full_runs(4)  # probes fit batch 2 (1.5 + 2 <= 4), no full run fits (4.5 > 4)
    assert found.max_batch_size is None and found.result is None
    assert "no batch completed its full run" in found.describe()


def test_without_full_runs_the_probes_decide():
    found = _search_with_full_runs(12, benchmark_largest=False)
    assert (found.max_batch_size, found.result) == (10, None)


# ------------------------------------------------------------------------------------ autocast against .half()


def _run(precision, median, spread=0.02, peak=None):
    from tinyllama.timing import summarize

    timing = summarize([median * (1 - spread), median, median * (1 + spread)])
    return SimpleNamespace(precision=precision, batch_size=64, device="NVIDIA H200", ms_per_batch=median, timing=timing,
                           throughput=64 / (median * 1e-3), peak_memory_mib=peak,
                           environment={"tf32_conv": True, "tf32_matmul": False, "backend": "cuda"})


def _side_by_side(half_ms, amp_ms, spread=0.02, peaks=(444.6, 560.0), errors=(6.4e-4, 6.0e-4)):
    from tinyllama.course.precision_checks import autocast_against_half

    return autocast_against_half(_run("fp16", half_ms, spread, peaks[0]), _run("amp", amp_ms, spread, peaks[1]),
                                 _report("fp16", errors[0]), _report("fp16", errors[1]))


def test_autocast_against_half_says_slower_faster_or_within_noise_from_the_spreads():
    table, sentences = _side_by_side(6.63, 7.60)
    assert list(table.index) == [".half() (fp16)", "autocast (amp)"]
    assert table.loc["autocast (amp)", "ms/batch"] == 7.60 and table.loc[".half() (fp16)", "peak MiB"] == 444.6
    assert sentences[0].startswith("Speed: autocast is 1.15x slower than .half()")
    assert _side_by_side(7.60, 6.63)[1][0].startswith("Speed: autocast is 1.15x faster than .half()")
    assert "within noise" in _side_by_side(6.63, 6.80, spread=0.05)[1][0]  # the bands overlap


def test_autocast_against_half_reads_memory_and_accuracy_from_the_runs():
    _, sentences = _side_by_side(6.63, 7.60)
    assert "autocast holds 26% more" in sentences[1]
    assert "autocast holds 10% less." in _side_by_side(6.63, 7.60, peaks=(500.0, 450.0))[1][1]
    assert "both peak at about 500 MiB" in _side_by_side(6.63, 7.60, peaks=(500.0, 502.0))[1][1]
    assert "not tracked" in _side_by_side(6.63, 7.60, peaks=(None, None))[1][1]
    assert "autocast is closer, both within the tolerance" in sentences[2]
    assert ".half() is closer" in _side_by_side(6.63, 7.60, errors=(5e-4, 9e-4))[1][2]
    assert "not both are within the tolerance" in _side_by_side(6.63, 7.60, errors=(5e-4, 2e-2))[1][2]


def test_autocast_against_half_refuses_runs_that_do_not_compare():
    from tinyllama.course.precision_checks import autocast_against_half

    other = _run("amp", 7.6)
    other.batch_size = 32
    with pytest.raises(ValueError, match="same batch"):
        autocast_against_half(_run("fp16", 6.6), other, _report("fp16", 6e-4), _report("fp16", 6e-4))
