"""Notebook 10's checks catch plausible wrong answers, and its measuring helpers measure."""

import pytest
import torch

from tinyllama import anatomy, bench
from tinyllama.config import get_preset
from tinyllama.course import baseline_checks as bc
from tinyllama.course.checkpoints import CheckpointFailed
from tinyllama.models import build


def params(vocab, hidden, layers, heads, kv_heads, intermediate):
    kv = kv_heads * (hidden // heads)
    return 2 * vocab * hidden + layers * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * intermediate
                                          + 2 * hidden) + hidden


def flops(c, seq):
    h, kv = c.hidden_dim, c.kv_dim
    n = c.num_layers * (2 * h * h + 2 * h * kv + 3 * h * c.intermediate_dim) + c.vocab_size * h
    return 6 * n + 12 * c.num_layers * seq * h


def activations(c, batch, seq):
    h, i = c.hidden_dim, c.intermediate_dim
    per_layer = 10 * batch * seq * h + 4 * batch * seq * i + batch * c.num_heads * seq * seq
    return 4 * (c.num_layers * per_layer + 3 * batch * seq * h + batch * seq * c.vocab_size)


def test_parameter_check_passes_the_right_count_and_names_the_missing_part(strict, capsys):
    assert bc.check_parameter_formula(params)
    with pytest.raises(CheckpointFailed, match="misses the output head"):
        bc.check_parameter_formula(lambda v, h, *rest: params(v, h, *rest) - v * h + 0 * h)
    with pytest.raises(CheckpointFailed, match="full width"):
        bc.check_parameter_formula(lambda v, h, l, heads, kv, i: params(v, h, l, heads, heads, i))
    with pytest.raises(CheckpointFailed, match="final RMSNorm"):
        bc.check_parameter_formula(lambda v, h, *rest: params(v, h, *rest) + h)


def test_flops_check_passes_the_right_count_and_diagnoses_common_mistakes(strict):
    assert bc.check_flops_formula(flops)
    with pytest.raises(CheckpointFailed, match="half of the attention square"):
        bc.check_flops_formula(lambda c, s: flops(c, s) - 6 * c.num_layers * s * c.hidden_dim)
    with pytest.raises(CheckpointFailed, match="forward pass only"):
        bc.check_flops_formula(lambda c, s: flops(c, s) / 3)
    with pytest.raises(CheckpointFailed, match="6N with N = all parameters"):
        bc.check_flops_formula(lambda c, s: 6 * c.num_parameters() + 12 * c.num_layers * s * c.hidden_dim)


def test_activation_check_passes_the_formula_and_catches_a_missing_square_term(strict):
    assert bc.check_activation_formula(activations)
    with pytest.raises(CheckpointFailed, match=r"S\^2 term"):
        bc.check_activation_formula(lambda c, b, s: activations(c, b, s) - 4 * c.num_layers * b * c.num_heads * s * s)
    with pytest.raises(CheckpointFailed, match="off by more than 10%"):
        bc.check_activation_formula(lambda c, b, s: activations(c, b, s) / 2)


def _trainer():
    config = get_preset("ci").model
    model = build("v1", config)
    return config, model, bench.TrainingStep(model, "fp32", torch.device("cpu"))


def test_fits_check_wants_the_gradients_of_a_failed_step_dropped(strict):
    config, model, trainer = _trainer()

    def step(batch):
        trainer(*bench.make_batches(config, batch, 16, count=1)[0])

    def good(batch):
        try:
            step(batch)
            return True
        except torch.OutOfMemoryError:
            trainer.optimizer.zero_grad(set_to_none=True)
            return False

    def leaves_gradients(batch):
        try:
            step(batch)
            return True
        except torch.OutOfMemoryError:
            return False

    def raises(batch):
        step(batch)
        return True

    assert bc.check_fits(good, model, 2)
    with pytest.raises(CheckpointFailed, match="still hold a gradient"):
        bc.check_fits(leaves_gradients, model, 2)
    with pytest.raises(CheckpointFailed, match="let the out-of-memory error escape"):
        bc.check_fits(raises, model, 2)


def test_largest_batch_doubles_then_bisects():
    search = anatomy.largest_batch(lambda b: b <= 37, start=4, limit=1000, resolution=0.0)
    assert (search.largest, search.first_failing) == (37, 38)
    assert [b for b, _ in search.probes][:5] == [4, 8, 16, 32, 64]
    capped = anatomy.largest_batch(lambda b: True, start=2, limit=16)
    assert (capped.largest, capped.first_failing) == (16, None) and "limit of 16" in capped.describe()
    assert anatomy.largest_batch(lambda b: False, start=2).largest is None


def test_saved_activations_match_the_formula_and_fit_recovers_coefficients():
    config = get_preset("ci").model
    model = build("v1", config)
    x, y = bench.make_batches(config, 2, 32, count=1)[0]
    from tinyllama.models import lm_loss

    saved = anatomy.saved_activations(model, lambda: lm_loss(model(x), y))
    assert abs(saved.bytes / activations(config, 2, 32) - 1) < 0.02
    assert all(p.grad is not None for p in model.parameters())  # the backward ran
    a, b, c = anatomy.fit_batch_seq([(bb, s, bb * (100 * s + 3 * s * s) + 7) for bb in (1, 2, 3) for s in (8, 16, 40)])
    assert (round(a), round(b), round(c)) == (100, 3, 7)


def test_pretend_out_of_memory_raises_once():
    with anatomy.pretend_out_of_memory(1000) as mode:
        with pytest.raises(anatomy.OutOfMemoryError):
            torch.ones(10_000) + 1
        torch.ones(10_000) + 1  # after the error, clean-up runs
    assert mode.raised and mode.allocated > 1000
