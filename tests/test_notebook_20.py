"""Notebook 20's exercise checks catch plausible wrong answers: each check cell of the solution notebook
is run on the reference answer (it passes) and on an answer with one typical mistake (it fails, under
WORKSHOP_STRICT=1)."""

import pytest

from notebook_exercises import SolutionExercises
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
from tinyllama.course import get_profile
from tinyllama.memory_estimate import CHECKPOINT_TERM, block_terms, estimate_memory, measure_activation_terms, model_layout
from tinyllama.models import build
from tinyllama.sweep import STATUS_OK, RunConfig
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
    assert set(notebook.found) == {"20.1", "20.2", "20.3"}
    for exercise in ("20.1", "20.2", "20.3"):
        _run(notebook, exercise)


@pytest.mark.parametrize("mistake", [
    ("swiglu_fp32 = 4 * B_mem", "swiglu_fp32 = 3 * B_mem"),  # the product that down_proj reads forgotten
    ("swiglu_bf16 = 4 * B_mem * S_mem * I * 2", "swiglu_bf16 = 4 * B_mem * S_mem * I * 4"),  # bf16 counted as fp32
    ("swiglu_fp32 = 4 * B_mem * S_mem * I * 4", "swiglu_fp32 = 4 * B_mem * S_mem * config.hidden_dim * 4"),  # h for I
])
def test_swiglu_mistakes_fail(notebook, mistake):
    with pytest.raises(CheckpointFailed):
        _run(notebook, "20.1", mistake)


@pytest.mark.parametrize("mistake", [
    ('table["loss_change_pct"].abs() <= 100 * tolerance', 'table["loss_change_pct"] <= 100 * tolerance'),  # one-sided
    ("<= 100 * tolerance", "<= tolerance"),  # percent compared with a fraction
    ('table.loc[ok, "step_ms"].idxmin()', 'table.loc[ok, "step_ms"].reset_index(drop=True).idxmin()'),  # position for label
    ("    if not ok.any():\n        return None\n", ""),  # nothing qualifies: must say so, not fail
])
def test_keep_best_mistakes_fail(notebook, mistake):
    with pytest.raises((CheckpointFailed, KeyError, ValueError)):
        _run(notebook, "20.2", mistake)


@pytest.mark.parametrize("mistake", [
    ("config.hidden_dim * 4", "config.hidden_dim * 2"),  # the residual stream taken as bf16 under autocast
    ("recompute_fraction = 1 / 3", "recompute_fraction = 1.0"),  # the whole step recomputed
])
def test_checkpointing_trade_mistakes_fail(notebook, mistake):
    with pytest.raises(CheckpointFailed):
        _run(notebook, "20.3", mistake)
