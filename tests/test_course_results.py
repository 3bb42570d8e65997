"""The results tracker: appends, never overwrites, stamps every record, refuses the shared checkout."""

import datetime as dt
import json
import math
import os

import numpy as np
import pandas as pd
import pytest
import torch

from tinyllama.course import results


@pytest.fixture
def results_env(monkeypatch, tmp_path):
    directory = tmp_path / "results"
    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(directory))
    monkeypatch.delenv("WORKSHOP_RUN_ID", raising=False)
    return directory


def test_records_are_appended_and_earlier_ones_kept_byte_for_byte(results_env):
    path = results.record("01_inference_baseline", {"throughput_img_s": 1234.5}, profile="ci", quiet=True)
    first = path.read_bytes()
    results.record("01_inference_baseline", {"throughput_img_s": 999.0}, profile="ci", quiet=True)
    data = path.read_bytes()
    assert data.startswith(first) and len(data.splitlines()) == 2
    assert [json.loads(line)["figures"]["throughput_img_s"] for line in data.splitlines()] == [1234.5, 999.0]


def test_record_is_stamped_with_date_environment_profile_and_run(results_env, monkeypatch):
    monkeypatch.setenv("WORKSHOP_RUN_ID", "run-7")
    path = results.record("00_environment_check", {"copy_tbs": 3.1}, profile="gpu", notes="idle GPU", quiet=True)
    entry = json.loads(path.read_text())
    stamped = dt.datetime.fromisoformat(entry["time"])
    assert stamped.tzinfo is not None and stamped.date() == dt.datetime.now(stamped.tzinfo).date()
    assert entry["environment"]["backend"] == "cpu" and entry["environment"]["torch"] == torch.__version__
    assert (entry["profile"], entry["run_id"], entry["notes"], entry["notebook"]) == \
        ("gpu", "run-7", "idle GPU", "00_environment_check")


def test_default_directory_is_in_the_home_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("WORKSHOP_RESULTS_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert results.results_dir() == (tmp_path / "tinyllama-workshop-results").resolve()
    assert results.results_dir().is_dir()


def test_a_directory_inside_the_checkout_is_refused(monkeypatch):
    root = results.checkout_root()
    assert root is not None, "the tests run from a checkout"
    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(root / "my_results"))
    with pytest.raises(ValueError, match="inside the course checkout.*WORKSHOP_RESULTS_DIR"):
        results.record("00_environment_check", {"x": 1.0})
    assert not (root / "my_results").exists()
    with pytest.raises(ValueError, match="inside the course checkout"):
        results.results_dir(root)


def test_figures_are_converted_to_plain_json(results_env):
    path = results.record("02_precision", {"a": np.float32(1.5), "b": torch.tensor(3), "c": np.int64(7),
                                           "d": "fp16", "e": True}, quiet=True)
    figures = json.loads(path.read_text())["figures"]
    assert figures == {"a": 1.5, "b": 3, "c": 7, "d": "fp16", "e": True}


@pytest.mark.parametrize("figures, error, match", [
    ({"t": math.nan}, ValueError, "finite"),
    ({"t": float("inf")}, ValueError, "finite"),
    ({"t": [1, 2]}, TypeError, "list"),
    ({"t": torch.ones(3)}, TypeError, "Tensor"),
    ({}, ValueError, "no figures"),
])
def test_bad_figures_are_refused_and_nothing_is_written(results_env, figures, error, match):
    with pytest.raises(error, match=match):
        results.record("02_precision", figures)
    assert not (results_env / results.RESULTS_FILE).exists()


def test_load_results_gives_one_row_per_figure(results_env):
    assert list(results.load_results().columns) == results.COLUMNS and results.load_results().empty
    results.record("00_environment_check", {"matmul_bf16_tflops": 700.0, "verdict": "PASS"}, profile="gpu", quiet=True)
    results.record("01_inference_baseline", {"throughput_img_s": 7000.0}, profile="gpu", quiet=True)
    table = results.load_results()
    assert len(table) == 3 and set(table.notebook) == {"00_environment_check", "01_inference_baseline"}
    assert pd.api.types.is_datetime64_any_dtype(table["time"])
    row = table[table.figure == "throughput_img_s"].iloc[0]
    assert (row.value, row.profile, row.backend) == (7000.0, "gpu", "cpu")
    latest = table.pivot_table(index="notebook", columns="figure", values="value", aggfunc="last")
    assert latest.loc["00_environment_check", "matmul_bf16_tflops"] == 700.0


def test_a_damaged_line_is_skipped_with_a_warning_and_kept(results_env):
    results.record("00_environment_check", {"copy_tbs": 1.0}, quiet=True)
    path = results_env / results.RESULTS_FILE
    with open(path, "a") as f:
        f.write("{not json\n")
    results.record("00_environment_check", {"copy_tbs": 2.0}, quiet=True)
    with pytest.warns(UserWarning, match=":2 is not a valid record"):
        table = results.load_results()
    assert list(table.value) == [1.0, 2.0]
    assert "{not json" in path.read_text()


def test_record_reports_where_it_wrote(results_env, capsys):
    path = results.record("00_environment_check", {"copy_tbs": 1.0})
    assert f"Recorded 1 figure(s) from 00_environment_check in {path}" in capsys.readouterr().out
    assert os.fspath(path).startswith(os.fspath(results_env.resolve()))


def test_a_record_names_the_commit_it_ran_at(tmp_path, monkeypatch):
    from tinyllama.course import results

    monkeypatch.setenv("WORKSHOP_COMMIT", "abc123def456")
    results.course_commit.cache_clear()
    try:
        results.record("00_environment_check", {"x": 1.0}, directory=tmp_path, quiet=True)
        assert results.read_records(tmp_path)[-1]["commit"] == "abc123def456"
    finally:
        results.course_commit.cache_clear()


def test_spreads_are_stored_from_pairs_stats_and_bands_and_carried_by_the_table(results_env):
    from tinyllama.timing import Band, summarize

    stats = summarize([10.0, 11.0, 12.0, 13.0, 30.0])
    results.record("17_version_comparison", {"step_ms": stats.median, "eager_ms": 20.0, "pair": np.float64(5.0),
                                             "verdict": "device-bound"},
                   spreads={"step_ms": stats, "eager_ms": Band(20.0, 19.0, 22.0), "pair": (np.float32(4.5), 6)},
                   quiet=True)
    entry = results.read_records()[0]
    assert entry["spreads"] == {"step_ms": [stats.p10, stats.p90], "eager_ms": [19.0, 22.0], "pair": [4.5, 6.0]}
    table = results.load_results().set_index("figure")
    assert (table.loc["eager_ms", "spread_low"], table.loc["eager_ms", "spread_high"]) == (19.0, 22.0)
    assert pd.isna(table.loc["verdict", "spread_low"]) and pd.isna(table.loc["verdict", "spread_high"])


def test_records_without_spreads_or_commit_stay_readable(results_env):
    results.record("00_environment_check", {"copy_tbs": 4.1}, quiet=True)
    assert "spreads" not in results.read_records()[0]  # none given: the record looks as it always did
    old = {"time": "2026-11-20T10:00:00+00:00", "notebook": "01_inference_baseline", "profile": "gpu",
           "figures": {"throughput": 7000.0}, "environment": {"device": "NVIDIA H200"}}
    with open(results_env / results.RESULTS_FILE, "a") as f:
        f.write(json.dumps(old) + "\n")
    table = results.load_results()
    assert list(table.columns) == results.COLUMNS and len(table) == 2
    row = table[table.figure == "throughput"].iloc[0]
    assert row.value == 7000.0 and pd.isna(row.commit) and pd.isna(row.spread_low)


@pytest.mark.parametrize("spreads, match", [
    ({"missing": (1.0, 2.0)}, "not among the recorded figures"),
    ({"verdict": (1.0, 2.0)}, "not a number"),
    ({"step_ms": (12.0, 8.0)}, "p10 before p90"),
    ({"step_ms": (8.0, 10.0, 12.0)}, r"give \(p10, p90\)"),
    ({"step_ms": 0.5}, r"give \(p10, p90\)"),
    ({"step_ms": (8.0, math.nan)}, "finite"),
    ({"step_ms": ("8", "12")}, "must be numbers"),
])
def test_bad_spreads_are_refused_and_nothing_is_written(results_env, spreads, match):
    with pytest.raises(ValueError, match=match):
        results.record("17_version_comparison", {"step_ms": 10.0, "verdict": "host-bound"}, spreads=spreads)
    assert not (results_env / results.RESULTS_FILE).exists()
