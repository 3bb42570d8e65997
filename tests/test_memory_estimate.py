"""The memory estimator against what a step really holds: every activation term against the tensors
autograd saves, and parameters, gradients and AdamW state against the tensors themselves."""

import pytest
import torch

from tinyllama.config import make_config
from tinyllama.costs.memory_estimate import (
    CHECKPOINT_TERM,
    Layout,
    activation_terms,
    block_terms,
    compare_terms,
    estimate_memory,
    measure_activation_terms,
    model_layout,
)
from tinyllama.models import build
from tinyllama.profiling.memory import memory_breakdown
from tinyllama.training import TrainingStep, make_batches

CONFIG = make_config("ci", vocab_size=256)
CASES = [("v1", {}), ("v2", {}), ("v2", {"sdpa": True})]


@pytest.mark.parametrize("version,options", CASES)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_every_activation_term_matches_the_saved_tensors(version, options, precision, checkpointing):
    torch.manual_seed(0)
    model = build(version, CONFIG, **options).set_gradient_checkpointing(checkpointing)
    (inputs, targets), = make_batches(CONFIG, 3, 20, count=1)  # a sequence that is not a power of two
    layout = model_layout(model, "cpu", precision)
    estimate = estimate_memory(CONFIG, 3, 20, precision, layout, CONFIG.num_layers if checkpointing else 0)
    table = compare_terms(estimate.terms, measure_activation_terms(model, inputs, targets, precision))
    assert table["measured_mib"].iloc[-1] > 0
    # Within 25% term by term (the terms are exact on a CPU; the margin is for other PyTorch releases).
    wrong = table[~table["error_pct"].abs().le(25)]
    assert wrong.empty, f"terms off by more than 25%:\n{wrong}"
    assert (CHECKPOINT_TERM in set(table["term"])) == checkpointing


def test_the_terms_scale_as_derived():
    layout = Layout("math", True, True, True)
    small, long = block_terms(CONFIG, 2, 64, "fp32", layout), block_terms(CONFIG, 2, 128, "fp32", layout)
    assert long["SwiGLU"] == 2 * small["SwiGLU"]  # linear in the sequence
    quadratic = long["attention"] - 2 * small["attention"]  # what grows faster than linearly: the scores
    assert quadratic == 2 * CONFIG.num_heads * (128**2 - 2 * 64**2) * 4 + (128**2 - 2 * 64**2)
    flash = block_terms(CONFIG, 2, 128, "fp32", Layout("sdpa", True, True, True))
    assert flash["attention"] < long["attention"] / 2
    half = block_terms(CONFIG, 2, 64, "bf16", layout)
    assert half["SwiGLU"] == small["SwiGLU"] // 2
    with_checkpoints = activation_terms(CONFIG, 2, 64, "fp32", layout, checkpointed_layers=CONFIG.num_layers)
    without = activation_terms(CONFIG, 2, 64, "fp32", layout)
    assert with_checkpoints["bytes"].sum() < without["bytes"].sum()


def test_parameters_gradients_and_optimizer_state_match_the_tensors():
    torch.manual_seed(0)
    model = build("v2", CONFIG)
    (inputs, targets), = make_batches(CONFIG, 2, 16, count=1)
    step = TrainingStep(model, "fp32", "cpu")
    step(inputs, targets)  # AdamW's state exists after a first step
    measured = memory_breakdown(step, inputs, targets).set_index("kind")["mib"]
    estimate = estimate_memory(CONFIG, 2, 16, "fp32", model_layout(model))
    assert estimate.parameters / 2**20 == pytest.approx(measured["parameters"], rel=0.01)
    assert estimate.gradients / 2**20 == pytest.approx(measured["gradients"], rel=0.01)
    assert estimate.optimizer_states / 2**20 == pytest.approx(measured["optimizer state"], rel=0.25)
    assert estimate.peak_bytes() > estimate.parameters + estimate.optimizer_states + estimate.activations


def test_v3_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="V3"):
        model_layout(build("v3", CONFIG))


@pytest.mark.parametrize("options,precision,checkpointing", [({}, "fp32", False), ({"sdpa": True}, "bf16", True)])
def test_the_peak_model_is_within_25_percent_of_the_profilers_peak(options, precision, checkpointing):
    from tinyllama.profiling.memory import memory_timeline

    config = make_config("ci", vocab_size=256, hidden_dim=128, intermediate_dim=384, num_layers=4)
    torch.manual_seed(0)
    model = build("v2", config, **options).set_gradient_checkpointing(checkpointing)
    step = TrainingStep(model, precision, "cpu")
    (inputs, targets), = make_batches(config, 4, 128, count=1)
    # a whole step after a first one (AdamW's state exists), every category of the profiler's memory
    timeline = memory_timeline(lambda: step(inputs, targets), device="cpu", warmup=1)
    measured = timeline.drop(columns=["time_ms"]).sum(axis=1).max() * 2**20
    estimate = estimate_memory(config, 4, 128, precision, model_layout(model, "cpu", precision),
                               config.num_layers if checkpointing else 0)
    assert estimate.peak_bytes() == pytest.approx(measured, rel=0.25)


@pytest.mark.parametrize("seq,heads", [(256, 4), (192, 8)])
def test_the_scores_gradients_are_in_the_peak_where_attention_dominates(seq, heads):
    """One block, a long sequence, the math path: the S x S scores and their gradients are most of the
    step, so a peak model without the backward's score gradients falls well below the measured peak
    (about 0.6-0.7x); with them it is no lower than the profiler's peak and at most 30% above (it assumes
    both S x S gradients alive at once)."""
    from tinyllama.profiling.memory import memory_timeline

    config = make_config("ci", vocab_size=64, hidden_dim=64, intermediate_dim=128, num_layers=1, num_heads=heads,
                         num_kv_heads=heads // 2, max_seq_len=512)
    torch.manual_seed(0)
    model = build("v2", config)
    step = TrainingStep(model, "fp32", "cpu")
    (inputs, targets), = make_batches(config, 4, seq, count=1)
    timeline = memory_timeline(lambda: step(inputs, targets), device="cpu", warmup=1)
    measured = timeline.drop(columns=["time_ms"]).sum(axis=1).max() * 2**20
    estimate = estimate_memory(config, 4, seq, "fp32", model_layout(model, "cpu", "fp32"))
    assert 0.95 * measured <= estimate.peak_bytes() <= 1.3 * measured, estimate.peak_bytes() / measured
