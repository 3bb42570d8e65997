"""``tinyllama.harness.compare``: run specs, the check before timing, GEMM evidence, records, regressions."""

import copy
import json

import matplotlib
import pytest
import torch
from conftest import GPU

matplotlib.use("Agg")

from tinyllama.config import get_preset  # noqa: E402
from tinyllama.harness import bench  # noqa: E402
from tinyllama.harness import compare as cmp  # noqa: E402
from tinyllama.models import build, v2_fused  # noqa: E402

LAYERS = get_preset("ci").model.num_layers
RUNS = ["v1:fp32", "v2[fuse_qkv=0,fuse_gate_up=0]:fp32", "v2[fuse_qkv=1,fuse_gate_up=0]:fp32",
        "v2[fuse_qkv=0,fuse_gate_up=1]:fp32", "v2[sdpa=1]:fp32", "v4[compile=0]"]


@pytest.fixture(scope="module")
def result():
    return cmp.compare(RUNS, "ci", num_steps=3, warmup_steps=1, device="cpu", progress=False,
                       profile_runs=["v4[compile=0]:bf16"], ceilings={"fp32": 0.5, "bf16": 1.0})


def _row(result, label):
    return next(r for r in result.runs if r["label"] == label)


# ------------------------------------------------------------------------------------------------
# Run specs
# ------------------------------------------------------------------------------------------------


def test_run_specs_read_version_switches_and_precision():
    spec = cmp.parse_run("v2[fuse_qkv=0,sdpa=1,compile_mode=max-autotune]:bf16")
    assert (spec.version, spec.precision) == ("v2", "bf16")
    assert spec.model_options == {"fuse_qkv": 0, "sdpa": 1, "compile_mode": "max-autotune"}
    assert spec.label == "v2[fuse_qkv=0,sdpa=1,compile_mode=max-autotune]:bf16"
    assert cmp.parse_run(spec.label) == spec
    assert cmp.parse_run("v4").precision == "bf16"  # V4's preferred precision
    assert cmp.parse_run("v1").precision == "fp32"


def test_cuda_graph_is_a_switch_of_the_run_not_of_the_model():
    spec = cmp.parse_run("v4[compile_mode=default,cuda_graph=1]")
    assert spec.cuda_graph and spec.model_options == {"compile_mode": "default"}
    assert spec.label == "v4[compile_mode=default,cuda_graph=1]:bf16" and cmp.parse_run(spec.label) == spec
    assert cmp.parse_run("v1[cuda_graph=1]:fp32").model_options == {}  # V1 has no switches, yet takes this one
    assert not cmp.parse_run("v1[cuda_graph=0]").cuda_graph and not cmp.parse_run("v1").cuda_graph


@pytest.mark.skipif(GPU, reason="checks the message on a machine without a GPU")
def test_cuda_graph_runs_are_refused_on_the_cpu_before_anything_runs(capsys):
    with pytest.raises(ValueError, match="v4\\[cuda_graph=1\\]:bf16: cuda_graph needs a GPU"):
        cmp.compare(["v1:fp32", "v4[cuda_graph=1]"], "ci", device="cpu", progress=True)
    assert "reference" not in capsys.readouterr().out  # refused before V1 was even built
    with pytest.raises(ValueError, match="v1\\[cuda_graph=1\\]:fp32: cuda_graph captures after 3 eager steps"):
        cmp.compare(["v1[cuda_graph=1]:fp32"], "ci", device="cpu", warmup_steps=2)


@pytest.mark.parametrize("text,message", [
    ("v9:fp32", "unknown version"),
    ("v2[fuse_everything=1]:fp32", "no switch 'fuse_everything'.*fuse_qkv"),
    ("v1[fuse_qkv=0]", "v1 has no switch"),
    ("v2:fp8", "unknown precision"),
    ("v2[fuse_qkv=0:fp32", "cannot read run"),
])
def test_bad_run_specs_are_clear_errors(text, message):
    with pytest.raises(ValueError, match=message):
        cmp.parse_run(text)


def test_run_sets_expand_and_duplicates_collapse():
    specs = cmp.expand_runs(["fusions", "v1:fp32", "v2"])
    labels = [s.label for s in specs]
    assert labels[0] == "v1:fp32" and len(labels) == len(set(labels)) == 5
    assert "v2[fuse_qkv=1,fuse_gate_up=0]:fp32" in labels


# ------------------------------------------------------------------------------------------------
# The comparison
# ------------------------------------------------------------------------------------------------


def test_every_run_is_checked_then_timed(result):
    assert result.failed == []
    for row in result.runs:
        assert row["check"] == "passed" and row["check_gradient_error"] <= 1e-3
        assert row["step_ms_median"] > 0 and row["forward_ms_median"] > 0 and row["backward_ms_median"] > 0
    v4 = _row(result, "v4[compile=0]:bf16")
    assert v4["precision"] == "bf16" and 0 < v4["check_gradient_error_own_precision"] <= 0.15


def test_speedups_are_against_v1_in_the_same_run(result):
    v1 = _row(result, "v1:fp32")
    assert result.record["baseline_run"] == "v1:fp32" and v1["speedup"] == 1.0
    for row in result.runs:
        assert row["speedup"] == pytest.approx(v1["step_ms_median"] / row["step_ms_median"])
        expected_ceiling = {"fp32": 0.5, "bf16": 1.0}[row["precision"]]
        assert row["mfu_measured"] == pytest.approx(row["achieved_tflops"] / expected_ceiling)


def test_gemm_counts_show_each_fusion(result):
    """Per layer and step, fusing QKV saves 2 forward and 4 backward products (3 -> 1 each way,
    backward has two per product), fusing gate/up 1 + 2, and SDPA V1's two attention bmm's + 4."""
    ops = {r["label"]: r["gemm_ops"] for r in result.runs}
    unfused = ops["v2[fuse_qkv=0,fuse_gate_up=0]:fp32"]
    assert ops["v1:fp32"] == unfused
    assert unfused - ops["v2[fuse_qkv=1,fuse_gate_up=0]:fp32"] == 6 * LAYERS
    assert unfused - ops["v2[fuse_qkv=0,fuse_gate_up=1]:fp32"] == 3 * LAYERS
    assert ops["v2[fuse_qkv=1,fuse_gate_up=0]:fp32"] - ops["v2[sdpa=1]:fp32"] == 3 * LAYERS + 6 * LAYERS
    assert all(r["gemm_kernels"] is None for r in result.runs)  # no device kernels on the CPU


def test_record_is_complete_json(result):
    record = json.loads(json.dumps(result.record))
    assert record["kind"] == cmp.RECORD_KIND and record["device"].startswith("CPU")
    assert record["environment"]["torch"] and record["date"][:2] == "20"
    assert [r["label"] for r in record["runs"]] == [cmp.parse_run(r).label for r in RUNS]
    top = record["profiles"]["v4[compile=0]:bf16"]
    assert top and all(r["kind"] == "op" for r in top) and top[0]["cpu_ms"] >= top[-1]["cpu_ms"]


def test_table_and_plot(result):
    table = result.table()
    assert list(table.index) == [r["label"] for r in result.runs]
    assert {"step ms", "spread %", "fwd ms", "bwd ms", "opt ms", "tokens/s", "speed-up", "GEMM ops"} <= set(table)
    assert "v1:fp32" in str(result)
    fig = result.plot()
    speed, split = fig.axes[:2]
    assert len(speed.patches) == len(result.runs) and len(split.patches) == 3 * len(result.runs)


def test_the_measured_mfu_column_is_left_out_without_a_ceiling(result):
    assert result.table()["MFU % (measured)"].notna().all()  # the fixture gives fp32 and bf16 ceilings
    record = copy.deepcopy(result.record)
    for row in record["runs"]:
        row["ceiling_tflops"] = row["mfu_measured"] = None
    unmeasured = cmp.Comparison(record)
    assert "MFU % (measured)" not in unmeasured.table() and "MFU % (measured)" not in str(unmeasured)


def test_ceilings_are_measured_on_a_gpu_unless_given(monkeypatch):
    from types import SimpleNamespace

    measured = []
    monkeypatch.setattr("tinyllama.costs.ceilings.measure_matmul_tflops",
                        lambda precision, device=None: measured.append(precision) or SimpleNamespace(value=100.0))
    assert cmp.resolve_ceilings({}, ["fp32", "bf16"], torch.device("cpu")) == {}
    assert measured == []
    both = cmp.resolve_ceilings({"bf16": 700.0}, ["fp32", "bf16", "fp32"], torch.device("cuda"))
    assert both == {"fp32": 100.0, "bf16": 700.0} and measured == ["fp32"]
    assert cmp.resolve_ceilings({}, ["fp32"], torch.device("cpu"), measure=True) == {"fp32": 100.0}


def test_a_version_that_computes_something_else_is_not_timed(monkeypatch):
    def no_rotary_on_k(self, x):
        q, k, v = v2_fused.v1.Attention.project_qkv(self, x)
        return q, self.split_heads(self.k_proj(x), self.num_kv_heads), v

    monkeypatch.setattr(v2_fused.FusedAttention, "project_qkv", no_rotary_on_k)
    out = cmp.compare(["v1:fp32", "v2[fuse_qkv=0]:fp32"], "ci", num_steps=2, warmup_steps=0, device="cpu",
                      progress=False, gemm_counts=False)
    assert out.failed == ["v2[fuse_qkv=0]:fp32"]
    bad = _row(out, "v2[fuse_qkv=0]:fp32")
    assert bad["check"] == "failed" and "logits" in bad["check_message"]
    assert "step_ms_median" not in bad and bad["speedup"] is None
    assert "NOT TIMED" in str(out)
    out.plot()  # a failed run is left out of the plot, not drawn as zero


def test_every_run_starts_from_a_fresh_compiler_cache(monkeypatch):
    # Compiled runs earlier in the process must not leave this run near torch.compile's recompile limit.
    resets = []
    monkeypatch.setattr(cmp.torch._dynamo, "reset", lambda: resets.append(1))
    cmp.compare(["v1:fp32", "v4[compile=0]:fp32"], "ci", num_steps=1, warmup_steps=0, device="cpu",
                progress=False, gemm_counts=False)
    assert len(resets) == 2


def test_runs_that_passed_are_timed_again_in_turns_and_those_times_are_reported(monkeypatch):
    # The turns' samples (made up here, one figure per run) must become the runs' step times and every figure
    # derived from them; a run that failed its check is neither rebuilt nor timed.
    def no_rotary_on_k(self, x):
        q, k, v = v2_fused.v1.Attention.project_qkv(self, x)
        return q, self.split_heads(self.k_proj(x), self.num_kv_heads), v

    monkeypatch.setattr(v2_fused.FusedAttention, "project_qkv", no_rotary_on_k)
    timed = {}

    def fake_turns(calls, device, *, rounds, per_turn, warmup):
        for name, call in calls.items():
            call()  # each is a training step of its own model
        timed.update(names=list(calls), rounds=rounds, per_turn=per_turn)
        return {name: [10.0 * (i + 1)] * (rounds * per_turn) for i, name in enumerate(calls)}

    monkeypatch.setattr(bench, "time_in_turns", fake_turns)
    runs = ["v1:fp32", "v2[fuse_qkv=0]:fp32", "v1:tf32"]
    out = cmp.compare(runs, "ci", num_steps=2, warmup_steps=1, device="cpu", progress=False, gemm_counts=False,
                      turns=3, ceilings={"tf32": 0.5})
    assert timed == {"names": ["v1:fp32", "v1:tf32"], "rounds": 3, "per_turn": 2}
    v1, v2 = _row(out, "v1:fp32"), _row(out, "v1:tf32")
    assert (v1["step_ms_median"], v2["step_ms_median"], v2["step_ms_n"]) == (10.0, 20.0, 6)
    assert v2["speedup"] == pytest.approx(0.5)
    assert v2["tokens_per_s"] == pytest.approx(v2["batch_size"] * v2["seq_len"] / 0.020)
    assert v2["mfu_measured"] == pytest.approx(v2["flops_per_step"] / 0.020 / 1e12 / 0.5)
    assert out.record["timed_in_turns"] == 3 and "3 rounds in turns" in str(out)
    assert "step_ms_median" not in _row(out, "v2[fuse_qkv=0]:fp32")


def test_turns_time_each_run_rounds_times_steps_per_turn_on_the_cpu():
    out = cmp.compare(["v1:fp32", "v2:fp32"], "ci", num_steps=3, warmup_steps=1, device="cpu", progress=False,
                      gemm_counts=False, turns=2, steps_per_turn=2)
    assert [r["step_ms_n"] for r in out.runs] == [4, 4]
    assert out.record["timed_in_turns"] == 2 and out.record["steps_per_turn"] == 2


def test_runs_that_do_not_fit_at_once_keep_their_own_timing_and_say_so(monkeypatch, capsys):
    # A device of 1 GiB already holding 1 GiB: no run can be added beside the others.
    full = cmp.dev.MemoryStats(current_bytes=2**30, peak_bytes=None, reserved_bytes=None, total_bytes=2**30)
    monkeypatch.setattr(cmp.dev, "memory_stats", lambda device=None: full)
    out = cmp.compare(["v1:fp32", "v2:fp32"], "ci", num_steps=3, warmup_steps=1, device="cpu", progress=True,
                      gemm_counts=False, turns=2)
    assert [r["step_ms_n"] for r in out.runs] == [3, 3] and out.record["timed_in_turns"] == 0
    assert "not timed in turns" in capsys.readouterr().out and "rounds in turns" not in str(out)


def test_running_out_of_memory_while_building_the_runs_again_keeps_their_own_timing(monkeypatch, capsys):
    def no_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(cmp, "TurnRun", no_memory)
    out = cmp.compare(["v1:fp32", "v2:fp32"], "ci", num_steps=3, warmup_steps=1, device="cpu", progress=True,
                      gemm_counts=False, turns=2)
    assert [r["step_ms_n"] for r in out.runs] == [3, 3] and out.record["timed_in_turns"] == 0
    assert "not timed in turns (out of memory building every run at once)" in capsys.readouterr().out


@pytest.mark.parametrize("options", [{"turns": -1}, {"turns": 2, "steps_per_turn": 0}])
def test_bad_turns_are_refused_before_any_run(options):
    with pytest.raises(ValueError, match="turns must be 0"):
        cmp.compare(["v1:fp32", "v2:fp32"], "ci", device="cpu", progress=False, **options)


# ------------------------------------------------------------------------------------------------
# Saving and regressions
# ------------------------------------------------------------------------------------------------


def test_json_and_csv_append_and_never_overwrite(result, tmp_path):
    path = tmp_path / "runs.json"
    result.save_json(path)
    result.save_json(path)
    assert len(json.loads(path.read_text())) == 2
    assert cmp.load_record(path)["runs"][0]["label"] == "v1:fp32"
    csv = tmp_path / "runs.csv"
    result.save_csv(csv)
    result.save_csv(csv)
    import pandas as pd

    assert len(pd.read_csv(csv)) == 2 * len(result.runs)
    other = tmp_path / "notes.json"
    other.write_text('{"mine": 1}')
    with pytest.raises(ValueError, match="not a list"):
        result.save_json(other)
    assert other.read_text() == '{"mine": 1}'


def _shifted(record, label, factor, figure="step_ms"):
    new = copy.deepcopy(record)
    row = next(r for r in new["runs"] if r["label"] == label)
    for stat in ("median", "p10", "p90"):
        row[f"{figure}_{stat}"] *= factor
    if figure == "step_ms":
        row["tokens_per_s"] /= factor
    return new


def _flags(frame, label, figure):
    return frame[(frame["run"] == label) & (frame["figure"] == figure)]["flag"].tolist()


def test_regression_flags_only_moves_beyond_the_spread(result):
    def spread(label):  # p90 / p10 of the run's step times
        row = _row(result, label)
        return row["step_ms_p90"] / row["step_ms_p10"]

    old = result.record
    frame = cmp.find_regressions(old, _shifted(old, "v2[sdpa=1]:fp32", 1.1 * spread("v2[sdpa=1]:fp32")))
    assert _flags(frame, "v2[sdpa=1]:fp32", "step_ms") == ["slower"]
    assert _flags(frame, "v2[sdpa=1]:fp32", "tokens_per_s") == ["worse"]
    assert _flags(frame, "v1:fp32", "step_ms") == ["within spread"]
    # Half the spread (in log terms): slower, yet the p10..p90 ranges still overlap, however narrow they are.
    slightly = cmp.find_regressions(old, _shifted(old, "v1:fp32", spread("v1:fp32") ** 0.5))
    assert _flags(slightly, "v1:fp32", "step_ms") == ["within spread"]  # ranges still overlap
    faster = cmp.find_regressions(old, _shifted(old, "v1:fp32", 0.9 / spread("v1:fp32")))
    assert _flags(faster, "v1:fp32", "step_ms") == ["faster"]
    same = cmp.find_regressions(old, old)
    assert set(same["flag"]) == {"within spread"} and same.attrs["warnings"] == []


def test_regression_reports_memory_checks_and_missing_runs(result):
    old = copy.deepcopy(result.record)
    for r in old["runs"]:
        r["peak_memory_mib"] = 100.0
    new = copy.deepcopy(old)
    new["device"] = "another GPU"
    new["runs"][0]["peak_memory_mib"] = 110.0
    new["runs"][1].update(check="failed")
    del new["runs"][2]
    frame = cmp.find_regressions(old, new)
    assert _flags(frame, new["runs"][0]["label"], "peak_memory_mib") == ["more memory"]
    assert _flags(frame, new["runs"][1]["label"], "check") == ["fails check"]
    assert _flags(frame, old["runs"][2]["label"], "run") == ["missing now"]
    assert any("device differs" in w for w in frame.attrs["warnings"])


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------


def test_command_line_records_and_compares_with_a_baseline(tmp_path, capsys):
    path = tmp_path / "cmp.json"
    args = ["--preset", "ci", "--runs", "v1:fp32", "v2:fp32", "--num-steps", "2", "--warmup-steps", "0",
            "--device", "cpu", "--quiet", "--no-gemm-count", "--json", str(path)]
    assert cmp.main(args) == 0
    status = cmp.main(args + ["--baseline", str(path), "--csv", str(tmp_path / "cmp.csv")])
    out = capsys.readouterr().out
    assert "against the baseline" in out and status in (0, 1)  # 1 only if the CPU's timing moved
    assert len(json.loads(path.read_text())) == 2 and (tmp_path / "cmp.csv").exists()


@pytest.mark.parametrize("args,message", [
    (["--runs", "v7"], "unknown version"),
    (["--runs", "v1", "--baseline", "/nonexistent.json"], "does not exist"),
    (["--runs", "v1", "--ceiling", "bf16=fast"], "not a number"),
    (["--runs", "v1", "--preset", "huge"], "unknown preset"),
    (["--runs", "v1", "--turns", "-1"], "turns must be 0"),
])
def test_command_line_bad_input_is_one_line(args, message, capsys):
    assert cmp.main(args + ["--quiet", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_gemm_kernel_names_of_both_vendors():
    for name in ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas",
                 "nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT", "ampere_sgemm_128x64_tn",
                 "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)",
                 "Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1_SN_1LDSB0_GRVW8"):
        assert cmp.is_gemm_kernel(name), name
    for name in ("flash_fwd_kernel", "fmha_cutlassF_f32_aligned_64x64_rf_sm80",
                 "triton_poi_fused_add_mul_0", "void at::native::vectorized_elementwise_kernel<4>"):
        assert not cmp.is_gemm_kernel(name), name


def test_gpu_runs_are_valid_and_a_record_is_judged(result):
    """The GPU measurement (benchmarks/gpu/compare_gpu.py): its run list parses, and its judgement reads a record."""
    from tinyllama.harness.comparison import targets as script

    labels = [s.label for s in cmp.expand_runs(script.default_runs())]
    assert labels[0] == "v1:fp32" and labels[-3:] == ["v4[cuda_graph=0]:bf16", "v4[compile_mode=reduce-overhead]:bf16",
                                                  "v4:bf16"]  # V4 as shipped last: its whole step replayed
    assert labels[-7:-3] == ["v3:bf16", "v3[cuda_graph=1]:bf16", "v3[compile=1]:bf16",
                             "v3[compile=1,compile_mode=reduce-overhead]:bf16"]
    assert "v2[fuse_qkv=0,fuse_gate_up=1]:bf16" in labels and "v2[fuse_qkv=0,fuse_gate_up=1,cuda_graph=1]:bf16" in labels
    assert "v2[cuda_graph=1]:bf16" in labels

    record = copy.deepcopy(result.record)
    for row in record["runs"]:
        row["label"] = row["label"].replace("v4[compile=0]:bf16", "v4:bf16")
    judged = {t["target"]: t for t in script.targets(record)}
    v1, v4 = _row(result, "v1:fp32"), _row(result, "v4[compile=0]:bf16")
    ratio_target = judged["V4 bf16 as shipped step time <= 1/10 of V1 fp32's"]
    assert ratio_target["met"] == (v4["step_ms_median"] <= 0.1 * v1["step_ms_median"])
    assert judged["V4 bf16 MFU >= 45% of the measured bf16 matmul rate"]["met"] == (v4["mfu_measured"] >= 0.45)
    effects = {(e["precision"], e["steps"], e["fusion"]): e for e in script.fusion_effects(record)}
    unfused = _row(result, "v2[fuse_qkv=0,fuse_gate_up=0]:fp32")["gemm_ops"]
    assert effects[("fp32", "eager", "qkv")]["gemm_ops"] == f"{unfused} -> {unfused - 6 * LAYERS}"
    for steps in ("eager", "CUDA graphs"):  # this record has no bf16 V2 runs
        assert effects[("bf16", steps, "qkv")]["verdict"].startswith("not measured")
    op = lambda name, ms: {"kind": "op", "name": name, "device_ms": ms, "cpu_ms": 9.0}  # noqa: E731
    profiles = {"a": [op("aten::mm", 10.0), op("aten::silu", 1.0)],
                "b": [op("aten::mm", 9.0), op("aten::silu", 2.5), op("aten::cat", 0.2)]}
    diff = script.operator_differences(profiles, "a", "b")
    assert [(r["operator"], round(r["delta_ms"], 6)) for r in diff] == [
        ("aten::silu", 1.5), ("aten::mm", -1.0), ("aten::cat", 0.2)]
    assert script.operator_differences(profiles, "a", "missing") == []


# ------------------------------------------------------------------------------------------------
# V3 compiled
# ------------------------------------------------------------------------------------------------


def test_v3_compile_runs_parse_and_build_compiled_models():
    for text, mode, own_graphs in (("v3[compile=1]:bf16", "default", False),
                                   ("v3[compile=1,compile_mode=reduce-overhead]:bf16", "reduce-overhead", True)):
        spec = cmp.parse_run(text)
        assert spec.label == text and spec.model_options["compile"] == 1
        model = build(spec.version, get_preset("ci").model, **spec.model_options)
        assert model.compiled and model.own_cuda_graphs == own_graphs and model.switches.compile_mode == mode
        assert all(hasattr(layer, "_compiled_call_impl") and layer._compiled_call_impl is not None
                   for layer in model.layers)  # every block compiled (regional compilation, as V2 and V4)
    eager = build("v3", get_preset("ci").model)
    assert not eager.compiled and not eager.own_cuda_graphs
    spec = cmp.parse_run("v3[compile=1,cuda_graph=1]:bf16")
    assert spec.cuda_graph and spec.model_options == {"compile": 1}
    with pytest.raises(ValueError, match="compile_mode"):
        build("v3", get_preset("ci").model, compile=1, compile_mode="fastest")


@pytest.mark.slow
def test_compiled_v3_is_checked_against_v1_and_timed():
    """V3 with its blocks compiled (the Triton kernels traced as tinyllama:: operators) passes the
    same check against V1 as every run, then is timed."""
    result = cmp.compare(["v1:fp32", "v3[compile=1]:fp32"], "ci", num_steps=1, warmup_steps=0, device="cpu",
                         progress=False)
    row = _row(result, "v3[compile=1]:fp32")
    assert row["check"] == "passed", row["check_message"]
    assert row["check_gradient_error"] <= 1e-3 and row["step_ms_median"] > 0


def test_v3_targets_are_judged_against_v4(result):
    from tinyllama.harness.comparison import targets as script

    record = copy.deepcopy(result.record)
    v4 = next(r for r in record["runs"] if r["label"] == "v4[compile=0]:bf16")
    fake = []
    for label, ms in ((script.V4_EAGER, 10.0), (script.V4, 8.0), (script.V3, 11.9), (script.V3_STEP_GRAPH, 8.5)):
        fake.append({**v4, "label": label, "step_ms_median": ms})
    record["runs"] = [r for r in record["runs"] if r["label"] != "v4[compile=0]:bf16"] + fake
    judged = {t["target"]: t for t in script.targets(record)}
    eager = judged["V3 bf16 step time <= 1.2x V4's (v4[cuda_graph=0]:bf16)"]  # launches like for like
    graphs = judged["V3 bf16 whole step in CUDA graphs <= 1x V4's (v4:bf16)"]
    assert eager["met"] and "1.19x" in eager["measured"]
    assert not graphs["met"] and "1.06x" in graphs["measured"]
    record["runs"] = [r for r in record["runs"] if not r["label"].startswith("v3")]
    assert not any(t["target"].startswith("V3") for t in script.targets(record))  # no V3 runs: not judged
