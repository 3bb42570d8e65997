"""The model-size record (inference.model_sizes) read back as recorded: a real CPU smoke run of
benchmarks/gpu/inference_models_gpu.py (tests/data/inference_models_cpu_smoke.json), its table and verdicts, and clear
errors for files that are not such a record."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from inference import model_sizes  # noqa: E402

SMOKE = Path(__file__).parent / "data" / "inference_models_cpu_smoke.json"


def test_the_smoke_record_reads_back_with_who_measured_it():
    recorded = model_sizes.load_model_sizes(SMOKE)
    assert recorded.device.startswith("CPU") and recorded.date == "2026-11-26" and len(recorded.commit) >= 7
    assert recorded.label.startswith(f"{recorded.device}, recorded 2026-11-26 (torch ")
    assert {r["configuration"] for r in recorded.records} == set(model_sizes.CONFIGURATIONS)
    assert all(r["check"] == "passed" for r in recorded.records)


def test_the_table_has_one_row_per_network_and_batch_with_the_runs_ratio():
    recorded = model_sizes.load_model_sizes(SMOKE)
    table = model_sizes.size_table(recorded.records)
    assert list(table.index) == [("resnet18", 2), ("resnet34", 2)]
    for (network, batch), row in table.iterrows():
        runs = {r["configuration"]: r for r in recorded.records if r["network"] == network}
        assert row["freeze / eager"] == pytest.approx(runs["eager"]["median_ms"] / runs["compile + freeze"]["median_ms"])
        assert row["compile + freeze img/s"] == pytest.approx(runs["compile + freeze"]["throughput"])
        assert row["verdict"] in ("faster", "slower", "within noise")
        assert row["compile + freeze compile s"] > 0 and row["params_M"] > 10
    fig = model_sizes.plot_sizes(table, "smoke")
    assert fig.axes[0].get_yscale() == "log"
    plt.close(fig)


def test_verdicts_come_from_both_bands():
    base = {"network": "resnet18", "batch_size": 64, "params": 11_689_512, "compile_s": 5.0, "iterations": 30,
            "mean_ms": 10.0, "std_ms": 0.1, "min_ms": 9.0, "max_ms": 11.0}
    eager = {**base, "configuration": "eager", "median_ms": 10.0, "p10_ms": 9.8, "p90_ms": 10.2, "throughput": 6400.0}
    close = {**base, "configuration": "compile + freeze", "median_ms": 9.9, "p10_ms": 9.7, "p90_ms": 10.1,
             "throughput": 6465.0}
    clear = {**close, "median_ms": 8.0, "p10_ms": 7.9, "p90_ms": 8.1}
    assert model_sizes.size_table([eager, close]).iloc[0]["verdict"] == "within noise"
    assert model_sizes.size_table([eager, clear]).iloc[0]["verdict"] == "faster"
    missing = model_sizes.size_table([eager, {**close, "error": "out of memory at batch size 64"}])
    assert missing.iloc[0]["verdict"] == "not measured"


def test_files_that_are_not_a_record_are_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"device": "x", "records": []}))
    with pytest.raises(ValueError, match="no date, commit, torch"):
        model_sizes.load_model_sizes(bad)
    bad.write_text(json.dumps({"device": "x", "date": "d", "commit": "c", "torch": "t",
                               "records": [{"configuration": "compiled"}]}))
    with pytest.raises(ValueError, match="without a known configuration"):
        model_sizes.load_model_sizes(bad)
    with pytest.raises(ValueError, match="no successful run"):
        model_sizes.size_table([{"error": "out of memory"}])
