"""The closing dashboard: latest figures line up with the reference's, the checklist reports each
optimization's measured effect (or names the notebook that measures it), the pitfalls show evidence,
and an export never overwrites an earlier one."""

import datetime as dt
import math

import pandas as pd
import pytest
from table_cells import table_rows

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


def test_judge_is_symmetric_on_a_ratio_scale_and_refuses_bad_input():
    assert dashboard.judge(1.2) == dashboard.FASTER and dashboard.judge(1 / 1.2) == dashboard.SLOWER
    assert dashboard.judge(1.14) == dashboard.WITHIN and dashboard.judge(1 / 1.14) == dashboard.WITHIN
    assert dashboard.judge(0.86) == dashboard.SLOWER  # 1/0.86 = 1.163: beyond 15%, although 1 - 0.86 < 0.15
    assert dashboard.judge(1.04, variation=dashboard.REPLAY_VARIATION) == dashboard.FASTER
    for bad in (0.0, -1.0, math.nan, "2"):
        with pytest.raises(ValueError, match="positive number"):
            dashboard.judge(bad)
    with pytest.raises(ValueError, match="fraction"):
        dashboard.judge(1.1, variation=-0.1)


V17 = {"precision": "bf16", "step_ms_v1_fp32": 240.0, "step_ms_v1": 60.0, "step_ms_v2": 57.0, "step_ms_v3": 36.0,
       "step_ms_v4": 25.0, "step_ms_v4_graphed": 24.0, "speedup_v4_over_v1_fp32": 9.6}


def rows(notebook, figures, time=T1, **options):
    return [(notebook, name, value, time) for name, value in figures.items()]


def test_checklist_credits_each_item_only_with_its_controlled_pair():
    mine = table(*rows("17_version_comparison", V17),
                 *rows("16_sdpa_and_compile", {"step_ms_V4 eager": 40.0, "step_ms_V4 compiled (default)": 26.0}),
                 ("00_environment_check", "matmul_tf32_tflops", 400.0, T1),
                 ("00_environment_check", "matmul_fp32_tflops", 50.0, T1))
    checks = dashboard.checklist(mine).set_index(["optimization", "notebook"])
    assert checks.loc[("Mixed precision (bf16/fp16)", "17"), "yours (x)"] == pytest.approx(4.0)
    assert checks.loc[("Fused projections (V2)", "17"), "yours (x)"] == pytest.approx(60 / 57)
    assert checks.loc[("Fused projections (V2)", "17"), "yours"] == dashboard.WITHIN
    assert checks.loc[("Triton kernels (V3)", "17"), "yours (x)"] == pytest.approx(57 / 36)
    assert checks.loc[("torch.compile", "16"), "yours (x)"] == pytest.approx(40 / 26)
    assert checks.loc[("CUDA graphs", "17"), "yours (x)"] == pytest.approx(25 / 24)
    # The ratio across every change is never used; a kernel's micro-benchmark is marked as one.
    assert 9.6 not in set(checks["yours (x)"]) and ("torch.compile", "17") not in checks.index
    assert checks.loc[("TF32 matmuls", "00"), "scope"] == "one kernel"
    # Items whose notebooks did not run name them; the reference side says the same.
    assert checks.loc[("Batch size", "-"), "yours"] == "not measured yet: run notebook 01 or 20"
    assert checks.loc[("Several GPUs (data parallel)", "-"), "reference"] == "not measured yet: run notebook 05 or 21"


def test_a_pair_comes_from_one_record_and_a_precision_pair_needs_two_precisions():
    # Two records of 17, each with one side of the V2-over-V1 pair: no pair (two processes).
    split = table(("17_version_comparison", "step_ms_v1", 60.0, T1), ("17_version_comparison", "step_ms_v2", 57.0, T2))
    checks = dashboard.checklist(split).set_index("optimization")
    assert checks.loc["Fused projections (V2)", "yours"] == "not measured as a controlled pair in the records of notebook 17"
    # 17 run in fp32 (a CPU): V1 fp32 and V1 at its precision are the same configuration.
    fp32 = table(*rows("17_version_comparison", {**V17, "precision": "fp32"}))
    checks = dashboard.checklist(fp32).set_index(["optimization", "notebook"])
    assert ("Mixed precision (bf16/fp16)", "17") not in checks.index
    # The newest record that holds the pair wins.
    newer = table(*rows("17_version_comparison", V17), *rows("17_version_comparison", {**V17, "step_ms_v2": 30.0}, T2))
    assert dashboard.checklist(newer).set_index(["optimization", "notebook"]).loc[
        ("Fused projections (V2)", "17"), "yours (x)"] == pytest.approx(2.0)


def test_the_labs_join_the_checklist():
    mine = table(*rows("20_finetuning_lab", {"speedup_micro-batch": 7.8, "speedup_precision": 1.0}),
                 *rows("21_distributed_training", {"processes": 2, "distributed_device": "cuda", "preset": "medium",
                                                   "baseline_tokens_per_s": 100.0, "tokens_per_s_ddp": 180.0}),
                 *rows("05_multi_gpu", {"scaling_max_processes": 4, "scaling_device": "cuda",
                                        "throughput_1_process": 100.0, "throughput_4_processes": 360.0}))
    checks = dashboard.checklist(mine).set_index(["optimization", "notebook"])
    assert checks.loc[("Batch size", "20"), "yours"] == dashboard.KEPT
    assert checks.loc[("Batch size", "20"), "yours (x)"] == 7.8
    assert checks.loc[("Mixed precision (bf16/fp16)", "20"), "yours"] == dashboard.NOT_KEPT
    assert math.isnan(checks.loc[("Mixed precision (bf16/fp16)", "20"), "yours (x)"])  # 1.0 means not kept
    ddp = checks.loc[("Several GPUs (data parallel)", "21")]
    assert ddp["yours (x)"] == pytest.approx(1.8) and "DDP on 2 GPUs" in ddp["comparison"] and "efficiency 0.90" in \
        ddp["comparison"]
    assert checks.loc[("Several GPUs (data parallel)", "05"), "yours (x)"] == pytest.approx(3.6)
    cpu = table(*rows("21_distributed_training", {"processes": 2, "distributed_device": "cpu", "preset": "tiny",
                                                  "baseline_tokens_per_s": 100.0, "tokens_per_s_ddp": 90.0}))
    row = dashboard.checklist(cpu).set_index(["optimization", "notebook"]).loc[("Several GPUs (data parallel)", "21")]
    assert "no GPU scaling measured" in row["comparison"] and row["yours"] == dashboard.WITHIN


def test_the_chain_of_versions_one_change_per_step():
    chain = dashboard.version_chain(table(*rows("17_version_comparison", V17)))
    assert list(chain.index) == ["V1 fp32", "V1 bf16", "V2 bf16", "V3 bf16", "V4 bf16", "V4 bf16 graphed"]
    assert list(chain["step_ms"]) == [240.0, 60.0, 57.0, 36.0, 25.0, 24.0]
    assert chain["change"].iloc[0] == "" and chain.loc["V1 bf16", "change"] == "bf16 autocast"
    assert chain.attrs["notebook"] == "17_version_comparison"
    fp32 = dashboard.version_chain(table(*rows("17_version_comparison", {**V17, "precision": "fp32"})))
    assert list(fp32.index)[:2] == ["V1 fp32", "V2 fp32"]
    assert dashboard.version_chain(table(("10_tinyllama_baseline", "fp32_step_ms", 200.0, T1))).empty


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
    assert text.startswith("# my results")
    header, rule, row = table_rows(text)
    assert header[:5] == ["notebook", "figure", "yours", "reference", "yours / reference"]
    assert row[:5] == ["02_precision", "fp16_speedup_vs_fp32", "1.4", "1.4", "1"]
    assert [cell[0] + cell[-1] for cell in rule[:5]] == [":-", ":-", "-:", "-:", "-:"]  # numbers right-aligned


def spread_table(figures, spreads, notebook="17_version_comparison"):
    """One record of ``notebook`` with ``figures`` and the p10-p90 ``spreads`` of some of them."""
    record = {"time": T1, "notebook": notebook, "profile": "gpu", "figures": figures, "spreads": spreads,
              "environment": {"backend": "cuda", "device": "NVIDIA H200", "torch": "2.11", "triton": "3.6"}}
    return results.records_table([record])


def test_recorded_spreads_decide_a_pair_of_step_times_where_the_fixed_rule_would_not():
    figures = {"precision": "bf16", "step_ms_v1": 60.0, "step_ms_v2": 50.0,
               "step_ms_v1_graphed": 55.0, "step_ms_v2_graphed": 53.0}
    # 1.2x apart, beyond the 15% rule, but the bands overlap: within run-to-run variation.
    # 1.04x apart (replays, beyond 3%), bands apart: faster, as the fixed rule also says.
    spreads = {"step_ms_v1": [48.0, 70.0], "step_ms_v2": [45.0, 55.0],
               "step_ms_v1_graphed": [54.8, 55.2], "step_ms_v2_graphed": [52.8, 53.2]}
    runs = dashboard.runs_by_notebook(spread_table(figures, spreads))
    record = runs["17_version_comparison"][0]
    assert record[dashboard.SPREADS]["step_ms_v1"] == (48.0, 70.0)
    eager = dashboard._pair("17", "V2 over V1 eager", dashboard._ratio("step_ms_v1", "step_ms_v2"))
    _, factor, said = dashboard.measure(eager, runs)
    assert factor == pytest.approx(1.2) and said == dashboard.WITHIN  # the fixed rule alone would say faster
    assert dashboard.judge(factor) == dashboard.FASTER
    replayed = dashboard._pair("17", "V2 over V1 replayed", dashboard._ratio("step_ms_v1_graphed", "step_ms_v2_graphed"),
                               variation=dashboard.REPLAY_VARIATION)
    assert dashboard.measure(replayed, runs)[2] == dashboard.FASTER
    # 1.05x apart (inside the 15% rule), bands apart: faster from the bands.
    close = {"precision": "bf16", "step_ms_v1": 52.5, "step_ms_v2": 50.0}
    runs = dashboard.runs_by_notebook(spread_table(close, {"step_ms_v1": [52.0, 53.0], "step_ms_v2": [49.5, 50.5]}))
    assert dashboard.measure(eager, runs)[2] == dashboard.FASTER
    # Without spreads the fixed rule applies.
    runs = dashboard.runs_by_notebook(spread_table(close, {}))
    assert dashboard.measure(eager, runs)[2] == dashboard.WITHIN
    # A band of a rate is never used (it would turn the verdict round).
    assert dashboard.band_verdict({"tokens_per_s_a": 2.0, "tokens_per_s_b": 1.0,
                                   dashboard.SPREADS: {"tokens_per_s_a": (1.9, 2.1), "tokens_per_s_b": (0.9, 1.1)}},
                                  "tokens_per_s_a", "tokens_per_s_b") is None
