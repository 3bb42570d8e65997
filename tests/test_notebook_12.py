"""Notebook 12's checks (tinyllama.fusion) catch plausible wrong answers, and its helpers read a
comparison record as the notebook expects."""

import time

import pytest

from tinyllama.compare import RUN_SETS, parse_run
from tinyllama.course.checkpoints import CheckpointFailed
from tinyllama.fusion import (LAUNCH_BOUND_SHARE, check_gemm_prediction, check_host_share, fusion_effects,
                              fusion_label, fusion_runs, gemm_count_hint, host_share, time_samples)


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
    assert list(effects["verdict"]) == ["faster beyond the spread", "slower beyond the spread", "within the spread"]
    assert effects.loc["qkv", "speedup"] == pytest.approx(10 / 9)
    assert effects.loc["qkv", "gemm_ops_fused"] == 45


def test_time_samples_gives_one_sample_per_repeat():
    calls = []

    def sleep_2ms():
        calls.append(1)
        time.sleep(0.002)

    samples = time_samples(sleep_2ms, "cpu", warmup=1, repeat=4, inner=3)
    # one warm-up call, then 4 samples of 3 calls each, each sample the mean of its 3 calls in ms
    assert len(samples) == 4 and len(calls) == 1 + 4 * 3
    assert all(2.0 <= s < 50.0 for s in samples), samples
