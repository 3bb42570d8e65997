"""The sweep runner: one row per configuration, comparable losses, out-of-memory recorded, not fatal."""

import pytest

from tinyllama.anatomy import pretend_out_of_memory
from tinyllama.data import build_corpus
from tinyllama.sweep import STATUS_OK, STATUS_OOM, RunConfig, run_sweep


@pytest.fixture(scope="module")
def corpus():
    return build_corpus(2**18, seed=0)


def test_a_sweep_gives_one_row_per_configuration_and_equal_losses_for_equal_effective_batches(corpus):
    base = RunConfig("micro 2 x 2", preset="ci", micro_batch=2, accumulation_steps=2, seq_len=32)
    configs = [base, base.but("micro 4 x 1", micro_batch=4, accumulation_steps=1),
               base.but("checkpointing", checkpointing=True)]
    table = run_sweep(configs, corpus, steps=3, warmup_steps=1, progress=False)
    assert list(table["name"]) == [c.name for c in configs] and set(table["status"]) == {STATUS_OK}
    for column in ("step_ms", "data_ms", "tokens_per_s", "eval_loss", "estimated_peak_mib"):
        assert table[column].notna().all() and (table[column] > 0).all(), column
    assert (table["effective_batch"] == 4).all()
    # same weights, same samples per optimizer step: accumulation and checkpointing change no loss
    assert table["eval_loss"].max() - table["eval_loss"].min() < 1e-3
    assert len(table["losses"].iloc[0]) == 4


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
