"""Notebook 20's exercise checks catch plausible wrong answers: each check cell of the solution notebook
is run on the reference answer (it passes) and on an answer with one typical mistake (it fails, under
WORKSHOP_STRICT=1)."""

import re

import pytest
from notebook_exercises import SolutionExercises

from tinyllama.course import finetune_checks
from tinyllama.course.checkpoints import CheckpointFailed
from tinyllama.course.results import checkout_root

pytestmark = pytest.mark.usefixtures("strict")

PATH = checkout_root() / "solutions" / "20_finetuning_lab.ipynb"

SETUP = """
import math
import pandas as pd
import torch
from tinyllama import course
from tinyllama.config import make_config
from tinyllama.course import finetune_checks, get_profile
from tinyllama.costs.memory_estimate import CHECKPOINT_TERM, block_terms, estimate_memory, measure_activation_terms, model_layout
from tinyllama.models import build
from tinyllama.harness.sweep import STATUS_OK, RunConfig
from tinyllama.training import make_batches

profile = get_profile("ci")
device = torch.device("cpu")
config = make_config(profile.lab_preset, vocab_size=256)
current = RunConfig("kept", preset=profile.lab_preset, micro_batch=3, seq_len=40, precision="bf16")
"""


@pytest.fixture(scope="module")
def notebook():
    return SolutionExercises(PATH.stem)


def _run(notebook, exercise, replace=None):
    """Run the solution cell of ``exercise`` (with ``replace`` = (old, new) applied) and its check cell."""
    namespace: dict = {}
    exec(SETUP, namespace)
    notebook.run(exercise, namespace, replace)


def test_the_reference_answers_pass(notebook):
    assert set(notebook.found) == {"20.1", "20.2", "20.3", "20.4"}
    for exercise in ("20.1", "20.2", "20.3", "20.4"):
        _run(notebook, exercise)


def _only(message: str, phrase: str, phrases: list[str]) -> None:
    """``message`` says ``phrase`` and none of the other slips' ``phrases``."""
    assert phrase in message, message
    others = [other for other in phrases if other != phrase and other in message]
    assert not others, f"the feedback names other mistakes too: {others}"


FP32, BF16 = "swiglu_fp32 = 4 * B_mem * S_mem * I * 4", "swiglu_bf16 = 4 * B_mem * S_mem * I * 2"
SWIGLU_MISTAKES = [  # (old, new), the phrase of its own message
    (("swiglu_fp32 = 4 * B_mem", "swiglu_fp32 = 3 * B_mem"), "the backward also needs a fourth"),  # the product forgotten
    ((BF16, "swiglu_bf16 = 4 * B_mem * S_mem * I * 4"), "2 bytes per value, not the 4 of fp32"),  # bf16 counted as fp32
    ((FP32, "swiglu_fp32 = 4 * B_mem * S_mem * config.hidden_dim * 4"), "with the intermediate size I"),  # h for I
    ((FP32, "swiglu_fp32 = 4 * B_mem * S_mem * I"), "that counts values, not bytes"),  # elements, no bytes
    ((FP32, FP32 + " / 2**20"), "that is in MiB (divided by 2**20)"),  # the MiB the cell prints
]


@pytest.mark.parametrize("mistake, phrase", SWIGLU_MISTAKES, ids=[p for _, p in SWIGLU_MISTAKES])
def test_swiglu_mistakes_fail(notebook, mistake, phrase):
    with pytest.raises(CheckpointFailed) as failed:
        _run(notebook, "20.1", mistake)
    _only(str(failed.value), phrase, [p for _, p in SWIGLU_MISTAKES])


def test_a_swiglu_slip_in_both_answers_is_named_by_both():
    """Where the intermediate size is twice the hidden size, values without bytes and the hidden size for I give
    one number in bf16 (4 B S I = 8 B S h): the fp32 answer decides which mistake is named."""
    slips = finetune_checks.swiglu_slips(2, 10, 8, 4)  # batch 2, sequence 10, I = 8 = 2 h
    elements = finetune_checks.name_count_slip(640, "bf16", slips, {"fp32": 640, "bf16": 640})
    hidden = finetune_checks.name_count_slip(640, "bf16", slips, {"fp32": 1280, "bf16": 640})
    assert (elements.name, hidden.name) == ("elements", "hidden for intermediate")


KEPT = "kept_per_block = current.micro_batch * current.seq_len * config.hidden_dim * 4"
EVERY_TENSOR = ("kept_per_block = sum(block_terms(config, current.micro_batch, current.seq_len, current.precision, "
                "model_layout(build(current.version, config, **current.model_options), device, current.precision))"
                ".values())")
TRADE_MISTAKES = [
    (("config.hidden_dim * 4", "config.hidden_dim * 2"), "stays fp32 (4 bytes) also under autocast"),  # bf16 residual
    ((KEPT, EVERY_TENSOR), "what a block keeps without checkpointing"),  # every tensor, not only the input
    ((KEPT, KEPT + " * config.num_layers"), "every block's input together"),  # all blocks, not one
    ((KEPT, KEPT[:-len(" * 4")]), "counts values, not bytes"),  # values, no bytes
    ((KEPT, KEPT + " / 2**20"), "that is in MiB"),  # the MiB the cell prints
    (("recompute_fraction = 1 / 3", "recompute_fraction = 1.0"), "recomputes the whole step"),
    (("recompute_fraction = 1 / 3", "recompute_fraction = 1 / 2"), "counts the backward as one forward"),
    (("recompute_fraction = 1 / 3", "recompute_fraction = 1 / 4"), "a share of the step with checkpointing"),
    (("recompute_fraction = 1 / 3", "recompute_fraction = 100 / 3"), "that is a percent"),
]


@pytest.mark.parametrize("mistake, phrase", TRADE_MISTAKES, ids=[p for _, p in TRADE_MISTAKES])
def test_checkpointing_trade_mistakes_fail(notebook, mistake, phrase):
    with pytest.raises(CheckpointFailed) as failed:
        _run(notebook, "20.3", mistake)
    _only(str(failed.value), phrase, [p for _, p in TRADE_MISTAKES])


def test_a_quarter_fails_though_it_lies_on_the_range():
    """1/4 is the plausible range's low edge, but it is the share of the checkpointed step: named, not passed."""
    with pytest.raises(CheckpointFailed, match="with checkpointing"):
        finetune_checks.check_recompute_fraction(0.25)
    assert finetune_checks.check_recompute_fraction(0.3)


# Each typical mistake in the keep rule fails the check at its own case (the first one it gets wrong), so
# the participant reads the hint written for that mistake.
KEEP_RULE = 'faster = verdict(before, step_band(row), on="p10", min_ratio=MIN_GAIN)[1] == "faster"'
TIE_RULE = 'better = best is None or verdict(step_band(best), step_band(row), on="p10", min_ratio=MIN_GAIN)[1] == "faster"'


@pytest.mark.parametrize("mistake, first_failed", [
    (('[1] == "faster"\n        better', '[1] != "slower"\n        better'),  # an overlapping interval taken as faster
     "a candidate within noise, its median a little above the baseline's"),
    ((KEEP_RULE, 'faster = row["step_ms"] < baseline["step_ms"]'),  # medians compared, intervals ignored
     "a lower median whose fast steps are not faster"),
    (('on="p10", ', ""),  # single steps' bands: misses clear gains
     "a clear gain whose single steps scatter"),
    (('on="p10"', 'on="median"'),  # the typical step, which follows the host
     "a typical step that follows the host"),
    ((", min_ratio=MIN_GAIN", ""),  # any gain beyond the intervals kept, however small
     "a gain of 7% whose intervals part"),
    (("verdict(before, step_band(row)", "verdict(step_band(row), before"),  # the baseline second: keeps the slower
     "a candidate faster beyond noise ="),
    ((TIE_RULE, 'better = best is None or row["step_ms"] < best["step_ms"]'),  # ties broken by the noisy median
     "two candidates within noise of each other"),
    ((TIE_RULE, "better = best is None"),  # the first that qualifies, even where a later one beats it
     "two candidates faster beyond noise, the second beyond the first"),
    (("ran and converged and faster", "ran and faster"),  # the loss tolerance ignored
     "a candidate faster beyond noise whose loss rose 7%"),
    (('abs(row["loss_change_pct"])', 'row["loss_change_pct"]'),  # one-sided: a loss that fell too far kept
     "a candidate faster beyond noise whose loss fell 9%"),
    (("<= 100 * tolerance", "<= tolerance"),  # percent compared with a fraction
     "a candidate faster beyond noise whose loss moved +2%"),
    (("return None if best is None", 'return baseline["name"] if best is None'),  # the baseline's name instead of None
     "only a slower candidate"),
    (("converged and faster and fits and", "converged and faster and"),  # the memory budget ignored
     "the fastest candidate over the memory budget"),
    (('row["memory_mib"] <= budget_mib', 'row["memory_mib"] <= baseline["memory_mib"]'),  # the baseline's memory as the limit
     "a candidate with more memory than the baseline, within the budget"),
    (('row["memory_mib"] <= budget_mib', 'row["memory_mib"] < budget_mib'),  # the budget itself excluded
     "a candidate exactly at the budget"),
])
def test_keep_best_mistakes_fail(notebook, mistake, first_failed):
    with pytest.raises(CheckpointFailed, match=re.escape(f"keep_best with {first_failed}")):
        _run(notebook, "20.2", mistake)


def test_keep_best_decides_on_the_fast_steps_and_the_least_gain(notebook):
    """Two runs of the lab on one H200 machine (2026-11-27) timed bf16 against fp32 at micro-batch 16 in turns: the
    medians said 1.18x and 1.00x (the host's issue time and the device's work are close there, and the host's part
    comes and goes), the p10s 1.29x and 1.23x. Kept on the fast steps, both runs keep bf16. Later in the same runs
    bf16 gained 1.08x and 1.01x (intervals apart in the first): below the least gain, neither run keeps it. A
    clear gain over the budget is not kept."""
    namespace: dict = {}
    exec(SETUP, namespace)
    notebook.run("20.2", namespace, check=False)
    keep_best, pd, STATUS_OK = namespace["keep_best"], namespace["pd"], namespace["STATUS_OK"]
    columns = ["name", "status", "step_ms", "step_ms_p10", "step_ms_p90", "step_ms_median_low", "step_ms_median_high",
               "step_ms_p10_low", "step_ms_p10_high", "loss_change_pct", "memory_mib"]

    def row(*values):
        return pd.Series(dict(zip(columns, values)))

    fp32 = row("kept", STATUS_OK, 55.9, 55.1, 59.0, 55.4, 57.7, 55.0, 55.3, 0.0, 500.0)
    for bf16_median, bf16_low, bf16_high in ((46.9, 44.0, 50.7), (55.7, 50.5, 58.2)):  # the two runs' medians
        bf16 = row("bf16", STATUS_OK, bf16_median, 43.5, 62.0, bf16_low, bf16_high, 42.8, 44.9, 0.0, 500.0)
        assert keep_best(pd.DataFrame([fp32, bf16]), fp32, 0.03, 1000.0) == "bf16"
    small = row("8% faster", STATUS_OK, 52.0, 50.9, 55.0, 51.5, 52.5, 50.7, 51.1, 0.0, 500.0)
    assert keep_best(pd.DataFrame([fp32, small]), fp32, 0.03, 1000.0) is None
    assert keep_best(pd.DataFrame([fp32, bf16]).assign(memory_mib=900.0), fp32, 0.03, 800.0) is None


# Each typical mistake in finding the largest micro-batch within the budget fails at its own case.
@pytest.mark.parametrize("mistake, first_failed", [
    (('peak = measured if math.isfinite(measured) else row["estimated_peak_mib"]', 'peak = row["estimated_peak_mib"]'),
     "an estimate within the budget whose measured peak is over it"),  # the estimate trusted over the measurement
    (('row["status"] == "ok" and peak', "peak"),  # an out-of-memory row taken by its estimate
     "a row that ran out of memory"),
    (("peak <= budget_mib", "peak < budget_mib"), "a peak exactly at the budget"),  # the budget itself excluded
    (('(best is None or row["micro_batch"] > best)', "True"),  # the last row that fits, not the largest
     "rows not in order of micro-batch"),
    (('peak = measured if math.isfinite(measured) else row["estimated_peak_mib"]', "peak = measured"),  # no CPU fallback
     "no measurements at all"),
])
def test_largest_within_budget_mistakes_fail(notebook, mistake, first_failed):
    with pytest.raises(CheckpointFailed, match=re.escape(f"largest_within_budget with {first_failed}")):
        _run(notebook, "20.4", mistake)
