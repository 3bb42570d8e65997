"""The closing dashboard: latest figures line up with the reference's, the checklist reports each
optimization's measured effect (or names the notebook that measures it), the pitfalls show evidence,
and an export never overwrites an earlier one."""

import datetime as dt
import math

import pandas as pd
import pytest

from tinyllama.course import dashboard, results


def table(*rows, device="NVIDIA H200", profile="gpu"):
    """A long results table from (notebook, figure, value, time) rows."""
    records = [{"time": time, "notebook": nb, "profile": profile, "figures": {figure: value},
                "environment": {"backend": "cuda", "device": device, "torch": "2.11", "triton": "3.6"}}
               for nb, figure, value, time in rows]
    return results.records_table(records)


T1, T2 = "2026-11-23T07:00:00+00:00", "2026-11-23T08:00:00+00:00"


def test_latest_value_wins_and_sides_line_up():
    mine = table(("02_precision", "fp16_speedup_vs_fp32", 1.2, T1), ("02_precision", "fp16_speedup_vs_fp32", 1.5, T2),
                 ("01_inference_baseline", "fp32_throughput", 100.0, T1), profile="ci", device="CPU")
    ref = table(("02_precision", "fp16_speedup_vs_fp32", 1.36, T1), ("03_pytorch_profiler", "top_operator", "conv", T1))
    both = dashboard.side_by_side(mine, ref).set_index(["notebook", "figure"])
    assert both.loc[("02_precision", "fp16_speedup_vs_fp32"), "yours"] == 1.5
    assert both.loc[("02_precision", "fp16_speedup_vs_fp32"), "yours / reference"] == pytest.approx(1.5 / 1.36)
    assert math.isnan(both.loc[("01_inference_baseline", "fp32_throughput"), "yours / reference"])
    assert both.loc[("03_pytorch_profiler", "top_operator"), "reference"] == "conv"
    assert list(both.index.get_level_values(0)) == sorted(both.index.get_level_values(0))


def test_speedups_leave_out_predictions_and_a_precision_over_itself():
    mine = table(("02_precision", "fp32_speedup_vs_fp32", 1.0, T1), ("02_precision", "fp16_speedup_vs_fp32", 1.4, T1),
                 ("11_finding_bottlenecks", "predicted_speedup_compile", 3.0, T1),
                 ("12_fusion", "v2_over_v1_fp32_eager", 0.99, T1), ("12_fusion", "verdict_qkv", "faster", T1),
                 ("16_sdpa_and_compile", "compile_speedup", 0.0, T1))
    assert set(dashboard.speedups(mine).figure) == {"fp16_speedup_vs_fp32", "v2_over_v1_fp32_eager"}
    assert dashboard.speedups(results.records_table([])).empty


def test_checklist_reports_measured_effects_and_names_the_missing_notebook():
    mine = table(("10_tinyllama_baseline", "bf16_speedup", 3.0, T1), ("10_tinyllama_baseline", "tf32_speedup", 2.0, T1),
                 ("00_environment_check", "matmul_tf32_tflops", 400.0, T1),
                 ("00_environment_check", "matmul_fp32_tflops", 50.0, T1),
                 ("17_v1_to_v4", "v4_compile_speedup", 9.5, T1))
    checks = dashboard.checklist(mine)
    assert checks.loc["Mixed precision (bf16/fp16)", "yours (best x)"] == 3.0
    assert "3x (10: TinyLLaMA V1 training step, bf16 over fp32)" in checks.loc["Mixed precision (bf16/fp16)", "yours"]
    # The matmul rate is a micro-benchmark: shown, marked, and left out of the whole-step column.
    assert "8x (00: matmul rate, TF32 over fp32 [kernel])" in checks.loc["TF32 matmuls", "yours"]
    assert checks.loc["TF32 matmuls", "yours (best x)"] == 2.0
    assert checks.loc["Batch size", "yours"] == "not measured yet: run notebook 01"
    assert checks.loc["CUDA graphs", "yours"] == "not measured yet: run notebook 14"
    ran = dashboard.checklist(table(("01_inference_baseline", "fp32_throughput", 100.0, T1)))
    assert ran.loc["Batch size", "yours"] == "not in the records of notebook 01: run it again"
    assert math.isnan(checks.loc["Batch size", "yours (best x)"])
    # A later notebook joins a row by its figure's name.
    assert checks.loc["torch.compile", "yours (best x)"] == 9.5
    assert "no notebook measures it" in checks.loc["Channels-last memory layout", "yours"]
    assert checks.loc["Several GPUs (data parallel)", "reference"].startswith("not measured yet: run notebook 05")


def test_checklist_measures_with_named_figures():
    mine = table(("05_multi_gpu", "scaling_max_processes", 4, T1), ("05_multi_gpu", "scaling_device", "cuda", T1),
                 ("05_multi_gpu", "throughput_1_process", 100.0, T1), ("05_multi_gpu", "throughput_4_processes", 360.0, T1),
                 ("13_triton_basics", "timed_dtype", "fp32", T1), ("13_triton_basics", "rmsnorm_mine_fp32_tbs", 2.0, T1),
                 ("13_triton_basics", "rmsnorm_eager_fp32_tbs", 0.5, T1))
    checks = dashboard.checklist(mine)
    assert "3.6x (05: ResNet-50 throughput, 4 processes over one (cuda))" in checks.loc["Several GPUs (data parallel)", "yours"]
    assert "4x (13: your RMSNorm kernel over eager PyTorch (fp32, bandwidth) [kernel])" in \
        checks.loc["Triton kernels (V3)", "yours"]


def test_chains_of_step_times():
    mine = table(("10_tinyllama_baseline", "fp32_step_ms", 200.0, T1), ("10_tinyllama_baseline", "tf32_speedup", 2.0, T1),
                 ("10_tinyllama_baseline", "bf16_speedup", 4.0, T1))
    assert list(dashboard.precision_step_times(mine)) == [200.0, 100.0, 50.0]
    assert dashboard.version_step_times(mine).empty
    versions = table(("17_v1_to_v4", "v3_step_ms", 60.0, T1), ("17_v1_to_v4", "v1_step_ms", 240.0, T1),
                     ("17_v1_to_v4", "v2_step_ms", 230.0, T1), ("17_v1_to_v4", "v4_bf16_step_ms", 24.0, T1))
    chain = dashboard.version_step_times(versions)
    assert list(chain.index) == ["V1", "V2", "V3", "V4"] and list(chain) == [240.0, 230.0, 60.0, 24.0]


def test_pitfalls_show_the_participants_evidence():
    mine = table(("15_performance_debugging", "stage1_first_loss", 103.4, T1),
                 ("15_performance_debugging", "expected_initial_loss", 6.9078, T1))
    found = dashboard.pitfalls(mine).set_index("pitfall")["what you measured"]
    assert found["A broken weight initialisation (loss far above ln V at the start)"] == "first loss 103.4 against ln V = 6.91"
    assert found["Half precision taken on trust"] == "(run notebook 02)"
    assert all(dashboard.pitfalls(mine)["shown in"].str.fullmatch(r"\d\d"))


def test_export_never_overwrites(tmp_path):
    mine = table(("02_precision", "fp16_speedup_vs_fp32", 1.4, T1))
    now = dt.datetime(2026, 11, 23, 9, 30, 0)
    sections = {"Figures": dashboard.side_by_side(mine, mine).set_index(["notebook", "figure"])}
    first = dashboard.export_results(mine, sections, "my results", directory=tmp_path, now=now)
    before = first[0].read_bytes(), first[1].read_bytes()
    second = dashboard.export_results(mine, sections, "my results", directory=tmp_path, now=now)
    assert first[0].name == "results-20261123-093000.csv" and second[0].name == "results-20261123-093000-2.csv"
    assert (first[0].read_bytes(), first[1].read_bytes()) == before
    assert pd.read_csv(second[0]).loc[0, "value"] == 1.4
    text = second[1].read_text()
    assert text.startswith("# my results") and "| 02_precision | fp16_speedup_vs_fp32 | 1.4 | 1.4 | 1 |" in text
