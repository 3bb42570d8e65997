"""The sweep runner: one row per configuration, comparable losses, out-of-memory recorded, not fatal."""

import pytest

from tinyllama.costs.anatomy import pretend_out_of_memory
from tinyllama.data import build_corpus
from tinyllama.harness.sweep import STATUS_OK, STATUS_OOM, RunConfig, run_sweep


@pytest.fixture(scope="module")
def corpus():
    return build_corpus(2**18, seed=0)


def test_a_sweep_gives_one_row_per_configuration_and_equal_losses_for_equal_effective_batches(corpus):
    base = RunConfig("micro 2 x 2", preset="ci", micro_batch=2, accumulation_steps=2, seq_len=32)
    configs = [base, base.but("micro 4 x 1", micro_batch=4, accumulation_steps=1),
               base.but("checkpointing", checkpointing=True)]
    table = run_sweep(configs, corpus, steps=2, warmup_steps=1, progress=False)
    assert list(table["name"]) == [c.name for c in configs] and set(table["status"]) == {STATUS_OK}
    for column in ("step_ms", "data_ms", "tokens_per_s", "eval_loss", "estimated_peak_mib"):
        assert table[column].notna().all() and (table[column] > 0).all(), column
    assert (table["effective_batch"] == 4).all()
    # same weights, same samples per optimizer step: accumulation and checkpointing change no loss
    assert table["eval_loss"].max() - table["eval_loss"].min() < 1e-3
    assert len(table["losses"].iloc[0]) == 3


def test_an_out_of_memory_configuration_is_recorded_and_the_sweep_goes_on(corpus):
    large = RunConfig("too large", preset="ci", micro_batch=8, seq_len=64)
    small = RunConfig("fits", preset="ci", micro_batch=1, seq_len=16)
    with pretend_out_of_memory(20 * 2**20) as budget:  # the first run exceeds it, once
        table = run_sweep([large, small], corpus, steps=2, warmup_steps=0, progress=False)
    assert budget.raised
    assert list(table["status"]) == [STATUS_OOM, STATUS_OK]
    assert "out of memory" in table["error"].iloc[0]
    assert table["estimated_peak_mib"].notna().all()  # the estimate is shown for the failed one too


def test_duplicate_names_are_refused(corpus):
    with pytest.raises(ValueError, match="unique"):
        run_sweep([RunConfig("a", preset="ci"), RunConfig("a", preset="ci")], corpus, steps=1, progress=False)


def test_compare_with_measures_against_the_baseline_and_the_reference_loss():
    import math

    import pandas as pd

    from tinyllama.harness.sweep import compare_with

    table = pd.DataFrame([
        {"name": "base", "status": STATUS_OK, "step_ms": 100.0, "tokens_per_s": 1000.0, "peak_memory_mib": 50.0,
         "estimated_peak_mib": 40.0, "eval_loss": 2.0},
        {"name": "fast", "status": STATUS_OK, "step_ms": 50.0, "tokens_per_s": 1500.0, "peak_memory_mib": 100.0,
         "estimated_peak_mib": 110.0, "eval_loss": 2.2},
        {"name": "oom", "status": STATUS_OOM, "step_ms": math.nan, "tokens_per_s": math.nan, "peak_memory_mib": math.nan,
         "estimated_peak_mib": 500.0, "eval_loss": math.nan},
    ])
    out = compare_with(table, table.iloc[0], reference_loss=2.0, tolerance=0.05).set_index("name")
    assert out.loc["fast", "step_speedup"] == pytest.approx(2.0)
    assert out.loc["fast", "throughput_speedup"] == pytest.approx(1.5)
    assert out.loc["fast", "memory_ratio"] == pytest.approx(2.0)
    assert out.loc["base", "estimate_error_pct"] == pytest.approx(-20.0)
    assert out.loc["fast", "loss_change_pct"] == pytest.approx(10.0)
    assert list(out["converged"]) == [True, False, False]


def test_side_by_side_timing_gives_every_configuration_its_steps_in_rotating_turns(corpus, monkeypatch):
    from tinyllama.harness import sweep

    turns: list[str] = []
    original = sweep.TrainingStep.accumulate

    def logged(self, batches, steps=1, timer=None):
        turns.append(self.precision)
        return original(self, batches, steps, timer)

    monkeypatch.setattr(sweep.TrainingStep, "accumulate", logged)
    a = RunConfig("a", preset="ci", micro_batch=2, seq_len=16, precision="fp32")
    b = a.but("b", precision="bf16")
    times = sweep.time_side_by_side([a, b], corpus, rounds=3, steps_per_round=2, warmup_steps=1, progress=False)
    assert {name: stats.n for name, stats in times.items()} == {"a": 6, "b": 6}
    # one warm-up step each, then the rounds: a a b b | b b a a | a a b b (the order rotates)
    assert turns == ["fp32", "bf16"] + ["fp32"] * 2 + ["bf16"] * 4 + ["fp32"] * 4 + ["bf16"] * 2
    assert all(stats.median_low <= stats.median <= stats.median_high for stats in times.values())


def test_a_side_by_side_sweep_takes_its_step_times_from_the_turns_and_leaves_out_what_did_not_fit(corpus, monkeypatch):
    from tinyllama.harness import sweep
    from tinyllama.timing import summarize

    asked = []

    def fake(configs, corpus, **options):
        asked.extend(config.name for config in configs)
        return {config.name: summarize([10.0 * (i + 1)] * 20) for i, config in enumerate(configs)}

    monkeypatch.setattr(sweep, "time_side_by_side", fake)
    large = RunConfig("too large", preset="ci", micro_batch=8, seq_len=64)
    first, second = RunConfig("first", preset="ci", micro_batch=1, seq_len=16), RunConfig("second", preset="ci",
                                                                                          micro_batch=2, seq_len=16)
    with pretend_out_of_memory(20 * 2**20):
        table = run_sweep([large, first, second], corpus, steps=2, warmup_steps=0, progress=False,
                          side_by_side_rounds=5).set_index("name")
    assert asked == ["first", "second"]  # the one that ran out of memory is not timed
    assert table.loc["first", "step_ms"] == 10.0 and table.loc["second", "step_ms"] == 20.0
    assert table.loc["second", "tokens_per_s"] == pytest.approx(2 * 16 / 0.020)
    assert table.loc["first", "step_ms_median_low"] == 10.0


def test_a_side_by_side_timing_that_runs_out_of_memory_says_so_and_keeps_the_training_times(corpus, monkeypatch,
                                                                                           capsys):
    import torch

    from tinyllama.harness import sweep

    def too_large(configs, corpus, **options):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(sweep, "time_side_by_side", too_large)
    first, second = RunConfig("first", preset="ci", micro_batch=1, seq_len=16), RunConfig("second", preset="ci",
                                                                                          micro_batch=2, seq_len=16)
    table = run_sweep([first, second], corpus, steps=3, warmup_steps=0, progress=False, side_by_side_rounds=5)
    assert "ran out of memory with 2 configurations" in capsys.readouterr().out
    assert (table["step_ms"] > 0).all() and table["step_ms_p10_low"].notna().all()  # the training pass's times
