"""The drift of two solution runs: stated results must be equal, numbers agree within their spreads (else a
tolerance), host-sensitive figures are reported apart and never fail, one-sided figures are listed, and
numbers measured on another device or profile are refused."""

import nbformat
import pandas as pd
import pytest
from nbformat.v4 import new_code_cell, new_notebook
from table_cells import table_rows

from tinyllama.course import drift, reference, results
from tinyllama.timing import Band, summarize


def _entry(notebook, figures, spreads=None, device="NVIDIA H200", profile="gpu", commit="abc1234"):
    entry = {"time": "2026-11-26T10:00:00+00:00", "notebook": notebook, "profile": profile, "run_id": "run-1",
             "commit": commit, "notes": None, "figures": figures,
             "environment": {"backend": "cuda", "device": device, "torch": "2.11.0", "triton": "3.6.0"}}
    if spreads:
        entry["spreads"] = {name: list(pair) for name, pair in spreads.items()}
    return entry


def _run(folder, *entries, without=()):
    """A folder of executed notebooks, each carrying its entries' records (as run_solutions writes them)."""
    folder.mkdir(parents=True)
    by_notebook = {}
    for entry in entries:
        by_notebook.setdefault(entry["notebook"], []).append(entry)
    for name, records in by_notebook.items():
        nb = new_notebook(cells=[new_code_cell("x = 1")])
        reference.attach_records(nb, records)
        nbformat.write(nb, folder / f"{name}.ipynb")
    for name in without:
        nbformat.write(new_notebook(cells=[new_code_cell("x = 1")]), folder / f"{name}.ipynb")
    return folder


def _drift(tmp_path, a_entries, b_entries, **options):
    a = _run(tmp_path / "a", *a_entries)
    b = _run(tmp_path / "b", *b_entries)
    return drift.compare(drift.load_run(a), drift.load_run(b), **options)


def _status(found, figure):
    rows = found.table[found.table.figure == figure]
    assert len(rows) == 1, f"{figure} not compared once: {found.table}"
    return rows.iloc[0]["status"]


def test_an_equal_verdict_passes(tmp_path):
    found = _drift(tmp_path, [_entry("17_x", {"verdict": "host-bound", "kept": True, "none_yet": None})],
                   [_entry("17_x", {"verdict": "host-bound", "kept": True, "none_yet": None})])
    assert [_status(found, f) for f in ("verdict", "kept", "none_yet")] == ["equal"] * 3
    assert found.moved.empty and found.exit_status == 0
    assert "No figure moved beyond its spread." in found.report()


@pytest.mark.parametrize("before, after", [("host-bound", "device-bound"), (True, False), ("SDPA", None),
                                           ("1", 1)])
def test_a_changed_stated_result_fails(tmp_path, before, after):
    found = _drift(tmp_path, [_entry("20_x", {"verdict": before})], [_entry("20_x", {"verdict": after})])
    assert _status(found, "verdict") == "moved" and found.exit_status == 1
    assert "## Moved beyond their spread (1)" in found.report()


def test_a_number_within_its_spread_passes_even_beyond_the_tolerance(tmp_path):
    # 15% apart, beyond the 10% tolerance, but the two p10-p90 spreads overlap: the spreads decide.
    found = _drift(tmp_path, [_entry("17_x", {"step_ms": 10.0}, {"step_ms": (9.0, 11.0)})],
                   [_entry("17_x", {"step_ms": 11.5}, {"step_ms": (10.5, 12.5)})])
    row = found.table.iloc[0]
    assert (row.status, row.rule) == ("within spread", "spreads overlap") and found.exit_status == 0
    assert row.change_pct == pytest.approx(15.0)


def test_a_number_outside_its_spread_fails_even_within_the_tolerance(tmp_path):
    # 5% apart, within the tolerance, but the spreads are narrow and apart: that is drift.
    found = _drift(tmp_path, [_entry("17_x", {"step_ms": 10.0}, {"step_ms": (9.8, 10.2)})],
                   [_entry("17_x", {"step_ms": 10.5}, {"step_ms": (10.3, 10.7)})])
    row = found.moved.iloc[0]
    assert (row.figure, row.rule, row.A_spread, row.B_spread) == ("step_ms", "spreads apart", (9.8, 10.2),
                                                                  (10.3, 10.7))
    assert found.exit_status == 1
    assert ["17_x", "step_ms", "10", "10.5", "+5.0%", "[9.8, 10.2]", "[10.3, 10.7]", "spreads apart"] in table_rows(
        found.report())


def test_numbers_without_spreads_in_both_runs_use_the_tolerance(tmp_path):
    found = _drift(tmp_path, [_entry("10_x", {"near": 100.0, "far": 100.0, "count": 290, "zero": 0.0},
                                     {"near": (99.0, 101.0)})],
                   [_entry("10_x", {"near": 109.0, "far": 112.0, "count": 290, "zero": 0.0})])
    statuses = {f: _status(found, f) for f in ("near", "far", "count", "zero")}
    assert statuses == {"near": "within tolerance", "far": "moved", "count": "within tolerance",
                        "zero": "within tolerance"}
    assert "a spread in one run only" in found.table.set_index("figure").loc["near", "rule"]
    stricter = _drift(tmp_path / "strict", [_entry("10_x", {"near": 100.0})], [_entry("10_x", {"near": 109.0})],
                      tolerance=0.05)
    assert _status(stricter, "near") == "moved"


def test_a_host_sensitive_figure_that_moved_is_reported_but_does_not_fail(tmp_path):
    found = _drift(tmp_path, [_entry("13_triton_basics", {"launch_mine_us": 30.0, "rows": 8192})],
                   [_entry("13_triton_basics", {"launch_mine_us": 60.0, "rows": 8192})])
    row = found.table.set_index("figure").loc["launch_mine_us"]
    assert (row.status, row.rule) == ("host-sensitive", "beyond 10%") and row.change_pct == pytest.approx(100.0)
    assert "launch cost" in row.why
    assert found.moved.empty and found.exit_status == 0
    report = found.report()
    assert "## Host-sensitive (1)" in report
    assert ["13_triton_basics", "launch_mine_us", "30", "60", "+100.0%"] in [row[:5] for row in table_rows(report)]


def _printing(folder, notebook, printed, device="NVIDIA H200", cell_id="c0ffee00"):
    """An executed notebook whose one code cell printed ``printed`` (and showed a table with other words)."""
    folder.mkdir(parents=True, exist_ok=True)
    cell = new_code_cell("print(...)")
    cell.id = cell_id
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed),
                    nbformat.v4.new_output("execute_result", data={"text/plain": "slower faster kept"},
                                           execution_count=1)]
    nb = new_notebook(cells=[nbformat.v4.new_markdown_cell("faster, says the text"), cell])
    reference.attach_records(nb, [_entry(notebook, {"n": 1}, device=device)])
    nbformat.write(nb, folder / f"{notebook}.ipynb")
    return folder


def test_stated_words_are_the_verdict_words_each_cell_printed(tmp_path):
    path = _printing(tmp_path, "12_x", "V2: host share 4.9% -> not launch-bound\nqkv 1.03x: Faster; 0.8x below your "
                                       "prediction\nwithin noise of the line; the device is the limit\n") / "12_x.ipynb"
    assert drift.stated_words(path) == {"said: c0ffee00": "not launch-bound; faster; below your prediction; "
                                                          "within noise of the line; the device is the limit"}


def test_a_printed_verdict_that_changed_is_drift_unless_labelled(tmp_path):
    a = _printing(tmp_path / "a", "16_x", "V4 against V3: 1.28x, within noise\n")
    b = _printing(tmp_path / "b", "16_x", "V4 against V3: 1.26x, faster\n")
    found = drift.compare(drift.load_run(a), drift.load_run(b))
    row = found.table.set_index("figure").loc["said: c0ffee00"]
    assert (row.status, row.A, row.B) == ("moved", "within noise", "faster") and found.exit_status == 1
    same = drift.compare(drift.load_run(a), drift.load_run(_printing(tmp_path / "c", "16_x", "1.20x, within noise\n")))
    assert _status(same, "said: c0ffee00") == "equal" and same.exit_status == 0
    labelled = [drift.Label("16_*", "said: c0ffee00", "reads a host-sensitive figure")]
    assert _status(drift.compare(drift.load_run(a), drift.load_run(b), labels=labelled), "said: c0ffee00") == \
        "host-sensitive"
    # On another device a notebook may take another branch: its words are not compared there.
    other = _printing(tmp_path / "d", "16_x", "on the CPU every step is host-bound\n", device="CPU")
    assert _status(drift.compare(drift.load_run(a), drift.load_run(other)), "said: c0ffee00") == "not compared"


def test_run_specific_paths_are_not_compared(tmp_path):
    found = _drift(tmp_path, [_entry("03_x", {"trace_fp32": "/tmp/a/trace-1.json"})],
                   [_entry("03_x", {"trace_fp32": "/tmp/b/trace-2.json"})])
    assert _status(found, "trace_fp32") == "run-specific" and found.exit_status == 0


def test_figures_and_notebooks_in_one_run_only_are_listed(tmp_path):
    a = _run(tmp_path / "a", _entry("16_x", {"both": 1.0, "old_name": 2.0}), _entry("18_y", {"z": 1.0}),
             without=["19_z"])
    b = _run(tmp_path / "b", _entry("16_x", {"both": 1.0, "new_name": 2.0}), _entry("20_w", {"z": 1.0}))
    found = drift.compare(drift.load_run(a), drift.load_run(b))
    assert _status(found, "old_name") == "only in A" and _status(found, "new_name") == "only in B"
    assert found.exit_status == 0
    report = found.report()
    assert "## In one run only (2)" in report
    assert "Notebooks with figures in A only: 18_y" in report and "Notebooks with figures in B only: 20_w" in report
    assert "Notebooks without recorded figures in A: 19_z" in report


def test_different_devices_refuse_the_numbers_unless_forced(tmp_path):
    a_entries = [_entry("17_x", {"step_ms": 10.0, "verdict": "device-bound"}, device="NVIDIA H200")]
    b_entries = [_entry("17_x", {"step_ms": 30.0, "verdict": "device-bound"}, device="AMD Instinct MI300X")]
    found = _drift(tmp_path, a_entries, b_entries)
    assert found.refused == ["17_x"] and found.exit_status == 2
    assert _status(found, "step_ms") == "not compared" and _status(found, "verdict") == "equal"
    header = found.report().split("## Moved")[0]
    assert "Different device: ran on NVIDIA H200 in A, AMD Instinct MI300X in B (notebooks 17)" in header
    assert "not compared" in header
    forced = _drift(tmp_path / "forced", a_entries, b_entries, force=True)
    assert _status(forced, "step_ms") == "moved" and forced.exit_status == 1 and not forced.refused


def test_a_different_profile_refuses_and_different_commits_are_said_and_compared(tmp_path):
    found = _drift(tmp_path, [_entry("10_x", {"step_ms": 10.0}, profile="gpu")],
                   [_entry("10_x", {"step_ms": 10.0}, profile="ci")])
    assert found.exit_status == 2 and "Different profile: profile gpu in A, ci in B" in found.report()
    found = _drift(tmp_path / "commits", [_entry("10_x", {"step_ms": 10.0}, commit="abc1234")],
                   [_entry("10_x", {"step_ms": 10.0}, commit=None)])
    assert found.exit_status == 0 and _status(found, "step_ms") == "within tolerance"
    assert "Different commits, compared anyway: at abc1234 in A, unknown in B (notebooks 10)" in found.report()


def test_a_figure_recorded_twice_keeps_its_last_value_and_spread():
    merged = drift.notebook_figures("17_x", [_entry("17_x", {"a": 1.0, "b": 2.0}, {"a": (0.5, 1.5)}),
                                            _entry("17_x", {"a": 3.0})])
    assert merged.figures == {"a": 3.0, "b": 2.0} and merged.spreads == {}


def test_spreads_recorded_from_stats_and_bands_line_up(tmp_path, monkeypatch):
    # The whole path: results.record with spreads, the runner's attach_records, load_run, compare.
    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(tmp_path / "results"))
    stats = summarize([9.0, 9.5, 10.0, 10.5, 11.0])
    results.record("17_x", {"step_ms": stats.median, "eager_ms": 20.0}, spreads={"step_ms": stats,
                   "eager_ms": Band(20.0, 19.0, 21.0)}, quiet=True)
    records = results.read_records()
    assert records[0]["spreads"] == {"step_ms": [stats.p10, stats.p90], "eager_ms": [19.0, 21.0]}
    nb = new_notebook(cells=[])
    reference.attach_records(nb, records)
    (tmp_path / "a").mkdir()
    nbformat.write(nb, tmp_path / "a" / "17_x.ipynb")
    run = drift.load_run(tmp_path / "a")
    assert run.notebooks["17_x"].spreads["step_ms"] == (pytest.approx(stats.p10), pytest.approx(stats.p90))
    assert run.notebooks["17_x"].device == records[0]["environment"]["device"]


# --------------------------------------------------------------------------------------------------
# The registry of host-sensitive figures
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("notebook, figure, kind", [
    ("13_triton_basics", "launch_eager_us", drift.HOST_SENSITIVE),
    ("17_version_comparison", "host_share_v3", drift.HOST_SENSITIVE),
    ("12_fusion", "host_share_v2[fuse_qkv=0,fuse_gate_up=0]:bf16", drift.HOST_SENSITIVE),
    ("16_sdpa_and_compile", "compile_s_default (cold)", drift.HOST_SENSITIVE),
    ("16_sdpa_and_compile", "cold_first_step_s", drift.HOST_SENSITIVE),
    ("06_torch_compile", "small_compile_cold_s_max-autotune", drift.HOST_SENSITIVE),
    ("01_inference_baseline", "first_iteration_ms", drift.HOST_SENSITIVE),
    ("22_generation", "decode_ms_cache_eager", drift.HOST_SENSITIVE),
    ("03_pytorch_profiler", "trace_fp16", drift.RUN_SPECIFIC),
    # eager steps of the medium model moved 10-30% between machine starts where graph replays moved under 2%
    ("17_version_comparison", "step_ms_v1", drift.HOST_SENSITIVE),
    ("17_version_comparison", "speedup_v4_over_v1", drift.HOST_SENSITIVE),
    ("16_sdpa_and_compile", "step_ms_V4 eager", drift.HOST_SENSITIVE),
    ("20_finetuning_lab", "reference_step_ms", drift.HOST_SENSITIVE),
    # moved between two H200 runs (2026-11-26 and 27) with the host's issue time
    ("15_performance_debugging", "fixed_step_ms", drift.HOST_SENSITIVE),
    ("01_inference_baseline", "flat_until_batch_size", drift.HOST_SENSITIVE),
    ("04_flops_profiler", "achieved_tflops_batch1", drift.HOST_SENSITIVE),
    # moved beyond 10% between two runs at once on one 4 x H200 machine (2026-11-27)
    ("04_flops_profiler", "achieved_tflops_batch8", drift.HOST_SENSITIVE),
    ("06_torch_compile", "fp16_compiled_speedup", drift.HOST_SENSITIVE),
    ("10_tinyllama_baseline", "tf32_speedup", drift.HOST_SENSITIVE),
    ("21_distributed_training", "step_ms_fsdp", drift.HOST_SENSITIVE),
    ("21_distributed_training", "communication_ms_ddp", drift.HOST_SENSITIVE),
    ("21_distributed_training", "transfer_ms_ddp", drift.HOST_SENSITIVE),  # overlaps the backward: moves with it
    ("20_finetuning_lab", "final_step_ms", drift.HOST_SENSITIVE),
    ("19_results_and_wrap_up", "most_different_figure", drift.RUN_SPECIFIC),
    # moved between two runs at once on one 4 x H200 machine (afc0e7f, 2026-11-27): the chip, or the host's pace
    ("00_environment_check", "matmul_fp32_tflops", drift.HOST_SENSITIVE),
    ("18_roofline", "matmul_bf16_tflops", drift.HOST_SENSITIVE),
    ("04_flops_profiler", "mfu_measured", drift.HOST_SENSITIVE),
    ("03_pytorch_profiler", "fp16_channels_last_ms", drift.HOST_SENSITIVE),
    ("03_pytorch_profiler", "channels_last_speedup", drift.HOST_SENSITIVE),
    ("03_pytorch_profiler", "profiled_device_ms", drift.HOST_SENSITIVE),
    ("03_pytorch_profiler", "said: 0a3f51c5", drift.HOST_SENSITIVE),  # section 4's host/device sentence
    # moved beyond their spreads between two runs at once on one 2 x H200 machine (60c89c6, 2026-11-28)
    ("18_roofline", "copy_tbs", drift.HOST_SENSITIVE),  # each chip's own copy bandwidth (4.15 and 3.97 TB/s)
    ("00_environment_check", "copy_tbs", drift.HOST_SENSITIVE),
    ("11_finding_bottlenecks", "step_ms", drift.HOST_SENSITIVE),  # host-bound by 11's own verdict
    ("11_finding_bottlenecks", "step_ms_p90", drift.HOST_SENSITIVE),
    ("11_finding_bottlenecks", "mfu", drift.HOST_SENSITIVE),  # over that step
    ("07_vendor_profilers", "said: 3d24506a", drift.HOST_SENSITIVE),  # the profiler's cost on the host
    ("14_flash_attention", "said: a7e3c915", drift.HOST_SENSITIVE),  # the host-versus-device table
    ("06_torch_compile", "said: 29a8c616", drift.HOST_SENSITIVE),  # prediction on the small model's speed-up
    ("06_torch_compile", "said: dd917ee0", drift.HOST_SENSITIVE),  # live fp16 compile + freeze, no graphs
    ("21_distributed_training", "said: a186b4ec", drift.HOST_SENSITIVE),  # tuning verdicts on eager steps
    ("21_distributed_training", "said: 00755c1d", drift.HOST_SENSITIVE),  # hand-written DDP steps, eager
])
def test_the_registry_labels_figures_that_vary_with_the_host(notebook, figure, kind):
    assert drift.label_of(notebook, figure).kind == kind


@pytest.mark.parametrize("notebook, figure", [
    ("17_version_comparison", "step_ms_v1_graphed"),  # graph replays: the device's own time, must agree
    ("17_version_comparison", "step_ms_v1_fp32"),     # fp32 V1: device-bound
    ("17_version_comparison", "mfu_v4_graphed"),
    ("16_sdpa_and_compile", "step_ms_V4 compiled + whole-step graphs"),
    ("16_sdpa_and_compile", "compile_pays_off_default"),  # a verdict
    ("20_finetuning_lab", "kept_changes"),
    ("20_finetuning_lab", "final_peak_mib"),      # follows the kept changes, which must agree
    ("21_distributed_training", "transfer_ms_fsdp"),  # the transfer after the later rank arrived
    ("21_distributed_training", "plain_all_reduce_busbw_gbs"),  # the link itself
    ("04_flops_profiler", "achieved_tflops_batch32"),  # device-bound from batch 32 on
    ("10_tinyllama_baseline", "fp32_step_ms"),
    ("22_generation", "decode_ms_cache_graph"),    # graph replays: the device's own time
    ("13_triton_basics", "rmsnorm_mine_bf16_tbs"),
    ("06_torch_compile", "cheapest_one-off_job"),  # a stated result, even if derived from compile seconds
    ("03_pytorch_profiler", "channels_last_work_speedup"),  # the profiles' kernel times: the work itself
    ("03_pytorch_profiler", "fp16_over_fp32_time"),
    ("03_pytorch_profiler", "unprofiled_device_ms"),
    ("14_flash_attention", "said: 19c263d2"),  # ours against SDPA and the prediction: must agree
    ("06_torch_compile", "said: a455eeeb"),  # compile-time and speed-up lines of the large network
    ("22_generation", "said: 0b9cae96"),  # the ladder: replayed rungs judged, eager pair not ranked
    ("04_flops_profiler", "mfu_datasheet"),
    ("11_finding_bottlenecks", "time_share_attention_pct"),  # shares of the profiled kernels' time
])
def test_the_registry_leaves_stated_results_and_device_timings_compared(notebook, figure):
    assert drift.label_of(notebook, figure) is None


def test_every_label_says_why_and_covers_a_figure_the_solutions_record():
    table = reference.load_reference()
    recorded = list(zip(table.notebook, table.figure))
    recorded += [(path.stem, said) for path in sorted(reference.solutions_dir().glob("*.ipynb"))
                 for said in drift.stated_words(path)]
    # 19 records the figure that differs most from the stored run's, and the path of its export, only when the run
    # has figures of its own; its stored solution ran from an empty results folder (it shows the reference run).
    only_with_results = {("19_results_and_wrap_up", name) for name in ("most_different_figure", "export_csv")}
    wrap_up = "\n".join(cell.source for cell in nbformat.read(
        reference.solutions_dir() / "19_results_and_wrap_up.ipynb", as_version=4).cells)
    assert '"most_different_figure": ' in wrap_up and 'figures["export_csv"] = ' in wrap_up
    for label in drift.LABELS:
        assert label.why and label.kind in (drift.HOST_SENSITIVE, drift.RUN_SPECIFIC)
        assert any(label.matches(notebook, figure) for notebook, figure in [*recorded, *only_with_results]), \
            f"{label.notebooks} / {label.figures} labels no figure the solutions record"


# --------------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------------

def test_the_command_prints_the_table_writes_the_csv_and_fails_on_drift(tmp_path, capsys):
    a = _run(tmp_path / "a", _entry("20_x", {"kept": "SDPA", "step_ms": 35.0}), _entry("21_y", {"n": 2}))
    b = _run(tmp_path / "b", _entry("20_x", {"kept": "math", "step_ms": 35.2}), _entry("21_y", {"n": 2}))
    csv = tmp_path / "out" / "drift.csv"
    assert drift.main([str(a), str(b), "--csv", str(csv)]) == 1
    printed = capsys.readouterr().out
    assert ["20_x", "kept", "SDPA", "math"] in [row[:4] for row in table_rows(printed)]
    assert "1 figure(s) moved beyond their spread." in printed
    table = pd.read_csv(csv)
    assert list(table.columns) == drift.ROW_COLUMNS and len(table) == 3
    assert drift.main([str(a), str(b), "--notebooks", "21"]) == 0
    assert "1 figure(s) in 1 notebook(s)" in capsys.readouterr().out


def test_the_command_says_clearly_when_a_folder_has_no_notebooks(tmp_path, capsys):
    assert drift.main([str(tmp_path), str(tmp_path)]) == 2
    assert "no notebooks in" in capsys.readouterr().err
    assert drift.main(["solutions", "solutions", "--tolerance", "5"]) == 2
    assert "between 0 and 1" in capsys.readouterr().err


def test_the_stored_solutions_do_not_drift_from_themselves(capsys):
    code = drift.main([str(reference.solutions_dir()), str(reference.solutions_dir())])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "## Moved beyond their spread (0)" in printed and "No figure moved beyond its spread." in printed
    assert "Different" not in printed.split("## Moved")[0]


def test_the_readme_states_the_tolerance_the_code_uses():
    readme = (reference.checkout_root() / "README.md").read_text()
    assert f"else within {drift.RELATIVE_TOLERANCE:.0%}." in readme
