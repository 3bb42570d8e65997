"""Notebook 05 (inference on several GPUs): the recorded two-GPU run is read back as recorded, every exercise's
reference answer passes its check and plausible wrong answers fail it, and the torchrun command it builds runs."""

import dataclasses
import json
import re
import sys
from pathlib import Path

import pandas as pd
import pytest

from inference import recorded as rec
from notebook_exercises import SolutionExercises
from tinyllama import course
from tinyllama.course import scaling_checks
from tinyllama.course.checkpoints import CheckpointFailed

pytestmark = pytest.mark.usefixtures("strict")


@pytest.fixture(scope="module")
def notebook():
    return SolutionExercises("05_multi_gpu")


@pytest.fixture(scope="module")
def recorded():
    return rec.load_scaling_record()


BUS_GBS = 123.4  # a bus bandwidth as the all-reduce sweep of section 4 measures it


def _namespace(recorded, **extra):
    namespace = {"pd": pd, "course": course, "scaling_checks": scaling_checks, "recorded": recorded,
                 "display": lambda *a, **k: None, "predicted_efficiency": None, "bus_gbs": BUS_GBS,
                 "bandwidth_source": "a sweep"}
    namespace.update(extra)
    return namespace


def test_the_exercises_and_their_order(notebook):
    assert notebook.ids() == ["05.1", "05.2", "05.3", "05.4"]


def test_the_recorded_run_is_read_as_recorded(recorded):
    raw = rec.recorded_run(rec.TWO_GPU_RECORD)["data"]
    assert (recorded.world_size, recorded.batch_size, recorded.local_batch_size) == (2, 512, 256)
    assert recorded.device == "NVIDIA H200" and recorded.date == "2026-11-22" and recorded.parameters == 25_557_032
    assert list(recorded.per_rank["throughput"]) == [r["throughput"] for r in sorted(raw, key=lambda r: r["rank"])]
    assert recorded.label == "2 x NVIDIA H200, recorded 2026-11-22 (torch 2.11.0+cu130)"
    assert recorded.settings == "resnet50 fp16 channels-last, batch 512 (256 per GPU), 30 timed iterations"


def test_a_file_that_is_not_one_run_is_refused(tmp_path, recorded):
    raw = rec.recorded_run(rec.TWO_GPU_RECORD)["data"]
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps(raw[:1]))
    with pytest.raises(ValueError, match="a rank is missing"):
        rec.load_scaling_record(missing)
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps([raw[0], {**raw[1], "network": "resnet18"}]))
    with pytest.raises(ValueError, match="not one run"):
        rec.load_scaling_record(mixed)
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    with pytest.raises(ValueError, match="no records"):
        rec.load_scaling_record(empty)


def test_the_split_passes(notebook, recorded):
    namespace = notebook.run("05.1", _namespace(recorded))
    assert namespace["per_rank_batch"] == 256 and namespace["split_ok"]
    assert namespace["global_throughput"] == pytest.approx(recorded.global_throughput, rel=1e-9)


THROUGHPUT = 'recorded.batch_size / (recorded.per_rank["median_ms"].max() / 1e3)'


@pytest.mark.parametrize("mistake, message", [
    (('recorded.per_rank["median_ms"].max()', 'recorded.per_rank["median_ms"].min()'), "the fastest rank's time"),
    (('recorded.per_rank["median_ms"].max()', 'recorded.per_rank["median_ms"].mean()'), "the ranks' mean time"),
    ((THROUGHPUT, 'recorded.per_rank["throughput"].sum()'), "the sum of the ranks' own rates"),
    ((THROUGHPUT, 'recorded.batch_size / recorded.per_rank["median_ms"].max()'), "That divides by milliseconds"),
    ((THROUGHPUT, 'per_rank_batch / (recorded.per_rank["median_ms"].max() / 1e3)'), "That is one rank's rate"),
    ((THROUGHPUT, 'recorded.batch_size * recorded.world_size / (recorded.per_rank["median_ms"].max() / 1e3)'),
     "counts the global batch 2 times"),
    (("per_rank_batch = recorded.batch_size // recorded.world_size", "per_rank_batch = recorded.batch_size"),
     "that is the global batch"),
    (("per_rank_batch = recorded.batch_size // recorded.world_size",
      "per_rank_batch = recorded.batch_size * recorded.world_size"), "that multiplies by the ranks"),
])
def test_split_mistakes_fail_each_with_its_own_message(notebook, recorded, mistake, message):
    with pytest.raises(CheckpointFailed, match=re.escape(message)):
        notebook.run("05.1", _namespace(recorded), mistake)


def test_the_sum_of_the_ranks_is_named(recorded, capsys, lenient):
    assert not scaling_checks.check_split(256, float(recorded.per_rank["throughput"].sum()), recorded)
    assert "sum of the ranks' own rates" in capsys.readouterr().out


def _through_split(notebook, recorded):
    return notebook.run("05.1", _namespace(recorded), check=False)


def test_the_efficiency_passes(notebook, recorded):
    namespace = notebook.run("05.2", _through_split(notebook, recorded))
    assert namespace["recorded_efficiency"] == pytest.approx(recorded.scaling_efficiency, rel=1e-6)


@pytest.mark.parametrize("mistake", [
    ("return global_throughput / (k * baseline_throughput)", "return global_throughput / baseline_throughput"),
    ("return global_throughput / (k * baseline_throughput)", "return 100 * global_throughput / (k * baseline_throughput)"),
    ("return global_throughput / (k * baseline_throughput)", "return (k * baseline_throughput) / global_throughput"),
])
def test_efficiency_mistakes_fail(notebook, recorded, mistake):
    with pytest.raises(CheckpointFailed):
        notebook.run("05.2", _through_split(notebook, recorded), mistake)


def test_an_efficiency_function_is_held_to_the_recorded_runs_own_figure(recorded):
    """Right on the made-up runs is not enough: the recorded run's printed efficiency is checked too, so a
    record whose figures disagree with one another is caught (and the check cannot pass by comparing the
    function with itself)."""
    right = lambda g, b, k: g / (k * b)  # noqa: E731
    assert scaling_checks.check_efficiency_function(right, recorded)
    inconsistent = dataclasses.replace(recorded, scaling_efficiency=recorded.scaling_efficiency * 1.01)
    with pytest.raises(CheckpointFailed, match="differs from the efficiency the recorded run printed"):
        scaling_checks.check_efficiency_function(right, inconsistent)


def _measured_runs() -> pd.DataFrame:
    return pd.DataFrame({"world_size": [1, 2, 2, 4, 4, 4, 4], "rank": [0, 0, 1, 0, 1, 2, 3],
                         "scaling_efficiency": [None, 0.9, None, 0.8, None, None, None]})


def test_the_measured_efficiencies_are_held_to_the_packages():
    assert scaling_checks.check_measured_efficiency(pd.Series({1: 1.0, 2: 0.9, 4: 0.8}), _measured_runs())


@pytest.mark.parametrize("efficiency", [{1: 1.0, 2: 1.8, 4: 3.2},  # not divided by k
                                        {1: 100.0, 2: 90.0, 4: 80.0},  # a percent
                                        {1: 1.0, 2: 0.9, 4: 0.9}])  # one run wrong
def test_measured_efficiency_mistakes_fail(efficiency):
    with pytest.raises(CheckpointFailed, match="against the package's"):
        scaling_checks.check_measured_efficiency(pd.Series(efficiency), _measured_runs())


def test_the_allreduce_passes(notebook, recorded):
    namespace = notebook.run("05.3", _namespace(recorded))
    # 2 x 7/8 x 25.56 M fp32 gradients (4 bytes) at the measured bus bandwidth
    assert namespace["allreduce_ms"] == pytest.approx(1.75 * 25_557_032 * 4 / (BUS_GBS * 1e9) * 1e3)
    table = namespace["exposed"]
    assert list(table.index) == [256, 64, 16] and table["efficiency if exposed"].is_monotonic_decreasing


@pytest.mark.parametrize("mistake", [
    ("allreduce_ms = 2 * (k - 1) / k * parameters", "allreduce_ms = parameters"),  # no ring factor
    ("/ (bus_gbs * 1e9) * 1e3", "/ (bus_gbs * 1e9)"),  # seconds, not ms
    ("parameters * bytes_per_parameter", "parameters * 2"),  # as if the gradients were fp16
    ("parameters * bytes_per_parameter", "parameters"),  # a count, not bytes
    ("/ (bus_gbs * 1e9)", "/ (bus_gbs * 2**30)"),  # GiB/s, not GB/s
    ("return step_ms / (step_ms + allreduce_ms)", "return allreduce_ms / (step_ms + allreduce_ms)"),  # the lost share
])
def test_allreduce_mistakes_fail(notebook, recorded, mistake):
    with pytest.raises(CheckpointFailed):
        notebook.run("05.3", _namespace(recorded), mistake)


def test_ring_allreduce_refuses_bad_input():
    assert scaling_checks.ring_allreduce_ms(1000, 2, 1, 10.0) == 0.0  # one GPU exchanges nothing
    with pytest.raises(ValueError):
        scaling_checks.ring_allreduce_ms(1000, 2, 0, 10.0)


def _command_namespace(tmp_path):
    sizes = course.PROFILES["ci"]
    return {"sys": sys, "Path": Path, "course": course, "sizes": sizes, "per_gpu_batch": sizes.inference_batch_size,
            "run_device": "cpu", "results_folder": tmp_path, "time": __import__("time"),
            "shlex": __import__("shlex")}


def test_the_command_passes(notebook, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(tmp_path))
    namespace = notebook.run("05.4", _command_namespace(tmp_path))
    argv = namespace["torchrun_command"](3, tmp_path / "x.json", baseline=10.0)
    assert argv[argv.index("--batch-size") + 1] == str(3 * namespace["per_gpu_batch"])
    assert argv[-2:] == ["--baseline-throughput", "10"] and "--device" in argv


def test_the_launchers_flags_pass_in_either_order(notebook, tmp_path, monkeypatch):
    # --standalone after --nproc-per-node is as right as before it
    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(tmp_path))
    swapped = ('"--standalone", "--nproc-per-node", str(k),', '"--nproc-per-node", str(k), "--standalone",')
    namespace = notebook.run("05.4", _command_namespace(tmp_path), swapped)
    assert namespace["command_ok"]


@pytest.mark.parametrize("mistake", [
    ('"--batch-size", str(k * per_gpu_batch)', '"--batch-size", str(per_gpu_batch)'),  # the per-GPU batch as global
    ('"--standalone", "--nproc-per-node", str(k),', '"--standalone",'),  # one process
    ('"--json", str(json_file), ', ""),  # nothing to read back
    ('"--iterations", str(sizes.inference_steps)', '"--iterations", "20"'),
    ('"torch.distributed.run", "--standalone", ', '"torch.distributed.run", '),  # every launch on port 29500
])
def test_command_mistakes_fail(notebook, tmp_path, monkeypatch, mistake):
    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(tmp_path))
    with pytest.raises((CheckpointFailed, ValueError)):
        notebook.run("05.4", _command_namespace(tmp_path), mistake)


def _allreduce_row(mib, median, p10, p90):
    """A row of tinyllama.harness.allreduce's record: rank 0's timing and the bus bandwidth of its median."""
    return {"mib": mib, "busbw_gbs": mib * 2**20 / (median / 1e3) / 1e9,
            "rank0": {"median": median, "p10": p10, "p90": p90}}


def test_a_small_all_reduce_with_one_slow_sample_is_still_lower():
    # 1 MiB in 0.036 ms (one slow sample: p90 0.085, a spread of 150% of the median) against 97.5 MiB in
    # 0.395 ms: 11% of the bandwidth, lower whatever its spread.
    small = _allreduce_row(1.0, 0.036, 0.029, 0.085)
    large = _allreduce_row(97.5, 0.395, 0.390, 0.410)
    share, said = scaling_checks.latency_verdict(small, large)
    assert share == pytest.approx((1 / 0.036) / (97.5 / 0.395))
    assert said == "lower"


def test_an_all_reduce_as_fast_per_mib_is_not_lower():
    small = _allreduce_row(4.0, 0.0165, 0.015, 0.018)  # 4.1 ms per GiB against 4.05: the bands overlap
    large = _allreduce_row(97.5, 0.395, 0.390, 0.410)
    assert scaling_checks.latency_verdict(small, large)[1] == "within noise"
    faster = _allreduce_row(4.0, 0.010, 0.0098, 0.0102)  # per MiB beyond the large one's band: higher
    assert scaling_checks.latency_verdict(faster, large)[1] == "higher"
