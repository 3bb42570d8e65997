"""Notebook 14's exercise checks catch plausible wrong answers: each check cell of the solution notebook is
run on the reference answer (it passes) and on an answer with one typical mistake (it fails, under
WORKSHOP_STRICT=1)."""

import math

import pytest
import torch

from notebook_exercises import SolutionExercises
from tinyllama import course
from tinyllama.course.checkpoints import CheckpointFailed
from tinyllama.course.results import checkout_root
from tinyllama.kernels import flash_attention_reference

pytestmark = pytest.mark.usefixtures("strict")

PATH = checkout_root() / "solutions" / "14_flash_attention.ipynb"


@pytest.fixture(scope="module")
def notebook():
    return SolutionExercises(PATH.stem)


def _run(notebook, exercise, replace=None, setup=""):
    """Run the solution cell of ``exercise`` (with ``replace`` = (old, new) applied) and its check cell."""
    namespace = {"torch": torch, "math": math, "course": course, "flash_attention_reference": flash_attention_reference}
    exec(setup, namespace)
    notebook.run(exercise, namespace, replace)


def test_the_reference_answers_pass(notebook):
    assert set(notebook.found) == {"14.1", "14.2", "14.3", "14.4"}
    for exercise in ("14.1", "14.2", "14.3"):
        _run(notebook, exercise)


@pytest.mark.parametrize("mistake", [
    ("S * S * 4", "S * 4"),  # bytes of one row, not of the matrix
    ("B * H * S * S * 2", "H * S * S * 2"),  # the batch forgotten
    ("intensity_naive = attention_flops / naive_bytes", "intensity_naive = attention_flops / fused_bytes"),  # no S^2 traffic
])
def test_score_bytes_and_intensity_mistakes_fail(notebook, mistake):
    with pytest.raises(CheckpointFailed):
        _run(notebook, "14.1", mistake)


def test_intensity_without_the_two_flops_per_multiply_add_passes_only_within_the_range(notebook):
    with pytest.raises(CheckpointFailed):  # intensity of written-out attention counted per byte of S, not S^2
        _run(notebook, "14.1", ("naive_bytes = 2 * (4 * B * H * S * D + 4 * B * H * S * S)",
                                 "naive_bytes = 2 * (4 * B * H * S * D + 4 * B * H * S)"))


@pytest.mark.parametrize("mistake", [
    ("l * torch.exp(m - m_new)", "l"),  # the old sum not rescaled
    ("torch.exp(block - m_new[:, None])", "torch.exp(block)"),  # no maximum subtracted: overflow
    ("m = m_new", "pass"),  # the running maximum never kept
])
def test_online_softmax_mistakes_fail(notebook, mistake):
    with pytest.raises(CheckpointFailed):
        _run(notebook, "14.2", mistake)


@pytest.mark.parametrize("mistake", [
    ("kv = h // groups", "kv = h % k.shape[1]"),  # grouped heads interleaved instead of consecutive
    ("end = stop_m if causal else seq", "end = start_m + 1 if causal else seq"),  # the key loop stops early
    ("cols[None, None, :] > rows[None, :, None]", "cols[None, None, :] >= rows[None, :, None]"),  # the diagonal masked
    ("acc = acc * alpha[..., None] + p @ v_tile", "acc = acc + p @ v_tile"),  # acc not rescaled
])
def test_tiled_attention_mistakes_fail(notebook, mistake):
    with pytest.raises(CheckpointFailed):
        _run(notebook, "14.3", mistake)


def test_memory_prediction_in_bf16_bytes_fails():
    # The check of 14.4 compares measured / predicted with 0.6..1.7: probabilities counted at 2 bytes
    # (the inputs' bf16) instead of the reference's fp32 are 2x off.
    with pytest.raises(CheckpointFailed):
        course.check_between("math path: measured / predicted saved bytes", 2.05, 0.6, 1.7)
