"""Notebook 12's checks (tinyllama.course.fusion_checks) catch plausible wrong answers, and its helpers read a
comparison record as the notebook expects."""

import time

import pytest

from tinyllama.course.checkpoints import CheckpointFailed
from tinyllama.course.fusion_checks import (
    JUDGED_ON_REPLAY,
    LAUNCH_BOUND_SHARE,
    check_gemm_prediction,
    check_host_share,
    fusion_effects,
    fusion_label,
    fusion_runs,
    gemm_count_hint,
    host_share,
    launch_verdict,
    setting_launch_verdict,
)
from tinyllama.harness.compare import RUN_SETS, parse_run
from tinyllama.timing import summarize, time_samples, verdict


def right_count(num_layers, fuse_qkv, fuse_gate_up):
    forward = num_layers * (9 - 2 * fuse_qkv - fuse_gate_up) + 1
    return forward, 2 * forward


def _row(label, gemm_ops, median=10.0, p10=9.5, p90=10.5):
    spec = parse_run(label)
    return {"label": label, "version": spec.version, "options": dict(spec.options), "check": "passed",
            "gemm_ops": gemm_ops, "step_ms_median": median, "step_ms_p10": p10, "step_ms_p90": p90}


def _record(num_layers=3):
    runs = []
    for label in RUN_SETS["fusions"]:
        spec = parse_run(label)
        options = dict(spec.options)
        qkv = bool(options.get("fuse_qkv", spec.version != "v1"))
        gate_up = bool(options.get("fuse_gate_up", spec.version != "v1"))
        runs.append(_row(label, sum(right_count(num_layers, qkv, gate_up))))
    return {"config": {"num_layers": num_layers}, "runs": runs}


def test_labels_match_the_compare_run_set():
    assert fusion_runs("fp32") == RUN_SETS["fusions"][1:]
    for graphed in (False, True):
        for label in fusion_runs("bf16", graphed):
            assert parse_run(label).label == label
    assert fusion_label("none", "bf16", graphed=True) == "v2[fuse_qkv=0,fuse_gate_up=0,cuda_graph=1]:bf16"


def test_right_gemm_count_passes(monkeypatch):
    monkeypatch.setenv("WORKSHOP_STRICT", "1")
    assert check_gemm_prediction(right_count, _record(), [r["label"] for r in _record()["runs"]])


@pytest.mark.parametrize("wrong, cause", [
    (lambda n, q, g: (right_count(n, q, g)[0], 0), "backward is missing"),
    (lambda n, q, g: (n * (7 - 2 * q - g) + 1,) * 1 + (2 * (n * (7 - 2 * q - g) + 1),), "attention products"),
    (lambda n, q, g: (n * (9 - 2 * q - g), 2 * n * (9 - 2 * q - g)), "output head"),
    (lambda n, q, g: (right_count(n, q, g)[0], right_count(n, q, g)[0]), "two in the backward"),
])
def test_wrong_gemm_counts_fail_with_the_cause(monkeypatch, capsys, wrong, cause):
    monkeypatch.setenv("WORKSHOP_STRICT", "0")
    record = _record()
    assert not check_gemm_prediction(wrong, record, [r["label"] for r in record["runs"]])
    assert cause in capsys.readouterr().out


def test_gemm_hint_is_empty_when_right():
    assert gemm_count_hint(327, 327, 12) == ""
    assert "third" in gemm_count_hint(109, 327, 12)


def test_host_share_check_accepts_the_rule_and_rejects_mistakes(monkeypatch, capsys):
    monkeypatch.setenv("WORKSHOP_STRICT", "0")

    def right(eager, gpu):
        share = 1 - gpu / eager
        return share, share > LAUNCH_BOUND_SHARE

    assert check_host_share(right)
    mistakes = {
        "percentage": lambda e, g: (100 * (1 - g / e), (1 - g / e) > LAUNCH_BOUND_SHARE),
        "GPU's share": lambda e, g: (g / e, (1 - g / e) > LAUNCH_BOUND_SHARE),
        "not by the GPU time": lambda e, g: ((e - g) / g, (1 - g / e) > LAUNCH_BOUND_SHARE),
        "the rule is share": lambda e, g: (1 - g / e, (1 - g / e) > 0.5),
        "return a pair": lambda e, g: 1 - g / e,
    }
    for cause, wrong in mistakes.items():
        assert not check_host_share(wrong), cause
        assert cause in capsys.readouterr().out


def test_strict_mode_raises(monkeypatch):
    monkeypatch.setenv("WORKSHOP_STRICT", "1")
    with pytest.raises(CheckpointFailed):
        check_host_share(lambda e, g: (g / e, False))


def test_host_share_and_fusion_effects():
    assert host_share(100.0, 60.0) == pytest.approx(0.4)
    record = {"runs": [_row(fusion_label("none"), 57, 10.0, 9.9, 10.1), _row(fusion_label("qkv"), 45, 9.0, 8.9, 9.1),
                       _row(fusion_label("gate_up"), 51, 11.0, 10.9, 11.1), _row(fusion_label("both"), 39, 10.0, 9.5, 10.5)]}
    effects = fusion_effects(record, [("fp32", False), ("bf16", True)]).set_index("fusion")
    # Rows without intervals (older records) are decided on the p10-p90 bands.
    assert list(effects["verdict"]) == ["faster", "slower", "within noise"]
    assert effects.loc["qkv", "speedup"] == pytest.approx(10 / 9)
    assert (effects.loc["qkv", "speedup_low"], effects.loc["qkv", "speedup_high"]) == pytest.approx((9.9 / 9.1, 10.1 / 8.9))
    assert effects.loc["qkv", "gemm_ops_fused"] == 45


def test_fusion_effects_decide_on_the_medians_intervals_where_recorded():
    # A 4% gain whose single steps scatter by 20% (the bands overlap) but whose medians are known to 1%: faster.
    def timed(label, median):
        return {**_row(label, 0, median, 0.9 * median, 1.1 * median),
                "step_ms_median_low": 0.995 * median, "step_ms_median_high": 1.005 * median}

    record = {"runs": [timed(fusion_label("none"), 10.0), timed(fusion_label("qkv"), 9.6),
                       timed(fusion_label("gate_up"), 10.4), timed(fusion_label("both"), 10.02)]}
    effects = fusion_effects(record, [("fp32", False)]).set_index("fusion")
    assert list(effects["verdict"]) == ["faster", "slower", "within noise"]
    assert effects.loc["qkv", "speedup_low"] == pytest.approx(9.95 / (1.005 * 9.6))


def _p10_row(label, median, median_halfwidth, p10, p10_halfwidth):
    return {**_row(label, 0, median, p10, 1.2 * median),
            "step_ms_median_low": median - median_halfwidth, "step_ms_median_high": median + median_halfwidth,
            "step_ms_p10_low": p10 - p10_halfwidth, "step_ms_p10_high": p10 + p10_halfwidth}


def test_fusion_effects_decide_on_the_fast_steps_where_recorded():
    # The medians part by 4% (the host was busier for the control), the fast steps are equal: within noise.
    record = {"runs": [_p10_row(fusion_label("none"), 10.0, 0.05, 9.0, 0.02),
                       _p10_row(fusion_label("qkv"), 9.6, 0.05, 9.0, 0.02),
                       # the medians' intervals overlap, the fast steps are 3.5% apart beyond theirs: faster
                       _p10_row(fusion_label("gate_up"), 9.9, 0.3, 9.0 / 1.035, 0.02),
                       # the fast steps part beyond their intervals but by 1%, under the least gain: within noise
                       _p10_row(fusion_label("both"), 10.0, 0.05, 9.0 / 0.99, 0.01)]}
    effects = fusion_effects(record, [("fp32", False)]).set_index("fusion")
    assert list(effects["compared"]) == ["p10", "p10", "p10"]
    assert list(effects["verdict"]) == ["within noise", "faster", "within noise"]
    assert effects.loc["qkv", "speedup"] == pytest.approx(1.0)
    assert effects.loc["gate_up", "speedup"] == pytest.approx(1.035)
    assert (effects.loc["gate_up", "control_ms"], effects.loc["gate_up", "fused_ms"]) == pytest.approx((9.0, 9.0 / 1.035))
    assert effects.loc["gate_up", "speedup_low"] == pytest.approx(8.98 / (9.0 / 1.035 + 0.02))


def test_a_fusion_slower_by_more_than_the_least_gain_is_slower():
    record = {"runs": [_p10_row(fusion_label("none"), 10.0, 0.05, 9.0, 0.02),
                       _p10_row(fusion_label("qkv"), 10.0, 0.05, 9.0 / 0.96, 0.02),
                       _p10_row(fusion_label("gate_up"), 10.0, 0.05, 9.0 / 1.015, 0.01)]}
    effects = fusion_effects(record, [("fp32", False)]).set_index("fusion")
    assert list(effects["verdict"]) == ["slower", "within noise"]


def test_eager_rows_of_a_replayed_precision_are_judged_on_the_replay():
    # bf16 eager: the fused run is 4% faster on the fast steps, beyond their intervals; the same fusion replayed
    # is within 1%. The replay is the verdict; the eager row keeps its ratio. fp32 (not replayed) is judged eager.
    def p10(label, value, halfwidth=0.02):
        return _p10_row(label, 10.0, 0.05, value, halfwidth)

    runs = [p10(fusion_label(name, precision, graphed), value)
            for (precision, graphed), values in {("fp32", False): (9.0, 9.0 / 1.04, 9.0, 9.0),
                                                 ("bf16", False): (9.0, 9.0 / 1.04, 9.0 / 0.96, 9.0),
                                                 ("bf16", True): (8.0, 8.0 / 1.005, 8.0 / 0.96, 8.0)}.items()
            for name, value in zip(("none", "qkv", "gate_up", "both"), values)]
    settings = [("fp32", False), ("bf16", False), ("bf16", True)]
    effects = fusion_effects({"runs": runs}, settings).set_index(["setting", "fusion"])
    assert effects.loc[("fp32, eager", "qkv"), "verdict"] == "faster"
    assert list(effects.loc["bf16, eager", "verdict"]) == [JUDGED_ON_REPLAY] * 3
    assert effects.loc[("bf16, eager", "qkv"), "speedup"] == pytest.approx(1.04)
    assert list(effects.loc["bf16, CUDA graphs", "verdict"]) == ["within noise", "slower", "within noise"]
    # Without the replayed setting (or where its fused run failed) the eager row is judged on its own.
    assert fusion_effects({"runs": runs}, settings[:2]).set_index(["setting", "fusion"]).loc[
        ("bf16, eager", "qkv"), "verdict"] == "faster"
    failed = [{**r, "check": "failed"} if r["label"] == fusion_label("qkv", "bf16", True) else r for r in runs]
    effects = fusion_effects({"runs": failed}, settings).set_index(["setting", "fusion"])
    assert effects.loc[("bf16, eager", "qkv"), "verdict"] == "faster"
    assert effects.loc[("bf16, eager", "gate_up"), "verdict"] == JUDGED_ON_REPLAY


def test_launch_verdict_reads_the_share_from_both_intervals():
    def diagnose(eager_ms, gpu_ms):
        share = 1.0 - gpu_ms / eager_ms
        return share, share > LAUNCH_BOUND_SHARE

    def timed(median, halfwidth):
        return {"step_ms_median": median, "step_ms_median_low": median - halfwidth,
                "step_ms_median_high": median + halfwidth}

    # 5.6% with an eager median known to 1.5 ms: the share may be 3-8%, on the line.
    share, least, most, said = launch_verdict(diagnose, timed(58.2, 1.5), timed(54.9, 0.05))
    assert share == pytest.approx(1 - 54.9 / 58.2)
    assert least == pytest.approx(1 - 54.95 / 56.7) and most == pytest.approx(1 - 54.85 / 59.7)
    assert said == "within noise of the line"
    assert launch_verdict(diagnose, timed(66.0, 1.0), timed(54.9, 0.05))[3] == "launch-bound"
    assert launch_verdict(diagnose, timed(238.7, 0.2), timed(236.5, 0.1))[3] == "not launch-bound"
    # An older record without intervals: its medians alone decide.
    share, least, most, said = launch_verdict(diagnose, {"step_ms_median": 58.2}, {"step_ms_median": 54.9})
    assert least == most == pytest.approx(1 - 54.9 / 58.2) and said == "launch-bound"


def test_time_samples_gives_one_sample_per_repeat():
    calls = []

    def sleep_2ms():
        calls.append(1)
        time.sleep(0.002)

    samples = time_samples(sleep_2ms, "cpu", warmup=1, repeat=4, inner=3)
    # one warm-up call, then 4 samples of 3 calls each, each sample the mean of its 3 calls in ms
    assert len(samples) == 4 and len(calls) == 1 + 4 * 3
    assert all(2.0 <= s < 50.0 for s in samples), samples


# ---- each exercise through its cells: the reference passes, each typical mistake has its own message ----------

from types import SimpleNamespace  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from notebook_exercises import SolutionExercises, run_source  # noqa: E402

from tinyllama import course  # noqa: E402
from tinyllama.course import fusion_checks as fusion


@pytest.fixture(scope="module")
def solution():
    return SolutionExercises("12_fusion")


def _check_cell(solution, exercise, marker):
    """The source of the first code cell after ``exercise``'s cell that contains ``marker``."""
    cells = solution.nb.cells
    return next(cells[i].source for i in range(solution.found[exercise][0] + 1, len(cells))
                if cells[i].cell_type == "code" and marker in cells[i].source)


def _assert_only(shown, message, others, passed):
    assert "CHECK:" in shown and passed not in shown, shown
    assert message in shown, shown
    named = [text for text in others if text != message and text in shown]
    assert not named, f"the feedback names other mistakes too: {named}\n{shown}"


QKV_SLIPS = [
    ("return qkv.split([wq.shape[0], wk.shape[0], wv.shape[0]], dim=-1)", "return qkv.chunk(3, dim=-1)",
     "cut into three equal parts"),
    ("torch.cat([wq, wk, wv], dim=0)", "torch.cat([wq, wv, wk], dim=0)", "k and v come out swapped"),
    ("qkv = x @ w_qkv.T", "qkv = x @ w_qkv", "uses the stacked weight as stored"),
    ("torch.cat([wq, wk, wv], dim=0)", "torch.cat([wq, wk, wv], dim=1)", "stacked along dim 1"),
]


def _qkv(solution, replace=None):
    namespace = {"torch": torch, "F": F, "course": course, "check_fused_qkv": fusion.check_fused_qkv}
    run_source(solution.source("12.1", replace), namespace)
    run_source(_check_cell(solution, "12.1", "fused_qkv"), namespace)


def test_fused_qkv_reference_passes(solution, capsys, lenient):
    _qkv(solution)
    shown = capsys.readouterr().out
    assert "PASS: fused_qkv agrees with the reference on fresh random inputs of shapes (2, 7, 48, 6, 2), " \
           "(1, 13, 40, 10, 5), (3, 5, 30, 6, 1), (2, 3, 24, 4, 4)" in shown and "CHECK" not in shown


@pytest.mark.parametrize("old, new, message", QKV_SLIPS, ids=[s[2] for s in QKV_SLIPS])
def test_each_fused_qkv_slip_fails_with_its_own_message(solution, capsys, lenient, old, new, message):
    _qkv(solution, (old, new))
    _assert_only(capsys.readouterr().out, message, [t for *_, t in QKV_SLIPS], "PASS")


def test_a_fused_qkv_that_is_no_slip_gets_the_general_hint(capsys, lenient):
    assert not fusion.check_fused_qkv(lambda x, wq, wk, wv: (F.linear(x, wq), F.linear(x, wk), 2 * F.linear(x, wv)))
    shown = capsys.readouterr().out
    assert "q must be (batch, seq, heads * head_dim)" in shown
    assert not [t for *_, t in QKV_SLIPS if t in shown]


GEMM_SLIPS = [
    ("return forward, 2 * forward", "return forward, forward", "two in the backward, not one"),
    ("per_layer = 4 + 2 + 3", "per_layer = 4 + 3", "the attention products q k^T and p v"),
    ("forward = num_layers * per_layer + 1", "forward = num_layers * per_layer", "the output head (lm_head) is a GEMM"),
    ("per_layer -= 2 if fuse_qkv else 0", "per_layer -= 1 if fuse_qkv else 0", "two fewer GEMMs per layer, not one"),
    ("per_layer -= 1 if fuse_gate_up else 0", "per_layer -= 2 if fuse_gate_up else 0",
     "one fewer GEMM per layer, not two"),
    ("return forward, 2 * forward", "return forward, 0", "the backward is missing"),
]


def _gemms(solution, replace=None):
    record = _record(num_layers=3)
    namespace = {"pd": pd, "config": SimpleNamespace(num_layers=3), "on_gpu": False,
                 "check_gemm_prediction": check_gemm_prediction,
                 "result": SimpleNamespace(record=record, runs=record["runs"])}
    run_source(solution.source("12.2", replace), namespace)
    run_source(_check_cell(solution, "12.2", "check_gemm_prediction("), namespace)


def test_gemm_count_reference_passes(solution, capsys, lenient):
    _gemms(solution)
    assert "PASS: your GEMM counts match the profiler's for every run" in capsys.readouterr().out


@pytest.mark.parametrize("old, new, message", GEMM_SLIPS, ids=[s[2] for s in GEMM_SLIPS])
def test_each_gemm_count_slip_fails_with_its_own_message(solution, capsys, lenient, old, new, message):
    _gemms(solution, (old, new))
    _assert_only(capsys.readouterr().out, message, [t for *_, t in GEMM_SLIPS], "PASS")


STRIDED = "strided_ms = time_samples(lambda: F.silu(gate) * up, device, warmup=profile.warmup, repeat=profile.repeat"
PACKED_END = "                         repeat=profile.repeat, inner=10)\n"
TIMING_SLIPS = [
    ("gate_packed, up_packed = gate.contiguous(), up.contiguous()",
     "gate_packed, up_packed = up.contiguous(), gate.contiguous()", "the copies hold the halves swapped"),
    ("gate_packed, up_packed = gate.contiguous(), up.contiguous()", "gate_packed, up_packed = gate, up",
     "it is the chunked half itself, not a copy"),
    (STRIDED, STRIDED.replace("repeat=profile.repeat", "repeat=2"), "strided_ms has 2 sample(s), not 5"),
    (PACKED_END, PACKED_END + "packed_ms = sum(packed_ms) / len(packed_ms)\n", "packed_ms is a float, not a list"),
]


def _timing(solution, replace=None):
    tokens, inter = 64, 48
    h_fused = torch.randn(tokens, 2 * inter)
    gate, up = h_fused.chunk(2, dim=-1)
    namespace = {"torch": torch, "F": F, "pd": pd, "plt": matplotlib.pyplot, "course": course, "gate": gate, "up": up,
                 "time_samples": time_samples, "summarize": summarize, "verdict": verdict,
                 "device": torch.device("cpu"), "on_gpu": False,
                 "profile": SimpleNamespace(warmup=1, repeat=5), "check_strided_timing": fusion.check_strided_timing,
                 "predicted_strided_slowdown": 1.5, "tokens": tokens, "inter": inter, "dtype": torch.float32}
    run_source(solution.source("12.3", replace), namespace)
    run_source(_check_cell(solution, "12.3", "check_strided_timing("), namespace)
    matplotlib.pyplot.close("all")


def test_strided_timing_reference_passes(solution, capsys, lenient):
    _timing(solution)
    shown = capsys.readouterr().out
    assert "PASS: silu(gate) * up on the contiguous copies matches the reference\n" \
           "PASS: the timed pairs differ only in layout: chunked halves strided, copies contiguous" in shown


@pytest.mark.parametrize("old, new, message", TIMING_SLIPS, ids=[s[2] for s in TIMING_SLIPS])
def test_each_strided_timing_slip_fails_with_its_own_message(solution, capsys, monkeypatch, old, new, message):
    monkeypatch.setenv("WORKSHOP_STRICT", "1")  # the notebook stops at the failed check, as a participant's does
    with pytest.raises(CheckpointFailed) as failed:
        _timing(solution, (old, new))
    _assert_only(capsys.readouterr().out + str(failed.value), message, [t for *_, t in TIMING_SLIPS],
                 "PASS: the timed pairs differ only in layout")


def test_one_launch_verdict_for_the_runs_of_a_precision():
    assert setting_launch_verdict(["launch-bound", "launch-bound"]) == "launch-bound"
    assert setting_launch_verdict(["not launch-bound"] * 4) == "not launch-bound"
    # shares of 4.3-6.1%: some runs beyond the line, some within noise of it, one clear: at the line
    assert setting_launch_verdict(["launch-bound", "within noise of the line", "not launch-bound"]) == "at the line"
    assert setting_launch_verdict(["launch-bound", "not launch-bound"]) == "at the line"
    with pytest.raises(ValueError):
        setting_launch_verdict([])
