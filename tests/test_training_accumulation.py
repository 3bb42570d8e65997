"""Gradient accumulation and gradient checkpointing change the memory and the time of a step, never its
gradients."""

import pytest
import torch

from tinyllama.config import make_config
from tinyllama.models import VERSIONS, build, lm_loss
from tinyllama.profiling.memory import memory_timeline
from tinyllama.training import TrainingStep, make_batches
from tinyllama.timing import PhaseTimer

CONFIG = make_config("ci")


def _gradients(model):
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def test_accumulating_k_micro_batches_gives_the_gradients_of_one_batch_k_times_larger():
    torch.manual_seed(0)
    model = build("v2", CONFIG)
    (inputs, targets), = make_batches(CONFIG, 8, 16, count=1, seed=1)
    lm_loss(model(inputs), targets).backward()
    whole = _gradients(model)
    model.zero_grad(set_to_none=True)

    step = TrainingStep(model, "fp32", "cpu", lr=0.0)  # lr 0: the update leaves the weights as they are
    captured = {}
    step._update = lambda timer: captured.update(_gradients(model))  # read the gradients the step would apply
    micro = iter([(inputs[i:i + 2], targets[i:i + 2]) for i in range(0, 8, 2)])
    timer = PhaseTimer(torch.device("cpu"))
    timer.start()
    step.accumulate(micro, steps=4, timer=timer)
    phases = timer.stop()
    assert set(phases) == {"data", "forward", "backward"}
    for name, grad in whole.items():
        torch.testing.assert_close(captured[name], grad, rtol=1e-5, atol=1e-7, msg=f"gradient of {name}")


def test_accumulation_divides_each_micro_batch_loss():
    # Without the division by k the gradients would be k times too large: the test above would fail.
    torch.manual_seed(0)
    model = build("v1", CONFIG)
    (inputs, targets), = make_batches(CONFIG, 4, 16, count=1, seed=2)
    step = TrainingStep(model, "fp32", "cpu")
    loss = step.accumulate(iter([(inputs[:2], targets[:2]), (inputs[2:], targets[2:])]), steps=2)
    reference = lm_loss(build("v1", CONFIG).eval()(inputs), targets)  # a different model: only the scale matters
    assert loss.ndim == 0 and 0.5 * reference.item() < loss.item() < 2 * reference.item()
    with pytest.raises(StopIteration):
        step.accumulate(iter([(inputs, targets)]), steps=2)


@pytest.mark.parametrize("version", [v for v in VERSIONS if v != "v3"])
def test_checkpointing_gives_the_same_gradients(version):
    torch.manual_seed(0)
    options = {"compile": False} if version == "v4" else {}
    model = build(version, CONFIG, **options)
    (inputs, targets), = make_batches(CONFIG, 2, 24, count=1, seed=3)
    lm_loss(model(inputs), targets).backward()
    plain = _gradients(model)
    model.zero_grad(set_to_none=True)
    model.set_gradient_checkpointing(True)
    assert model.checkpointed_layers == frozenset(range(CONFIG.num_layers))
    lm_loss(model(inputs), targets).backward()
    for name, grad in _gradients(model).items():
        torch.testing.assert_close(grad, plain[name], rtol=1e-5, atol=1e-7, msg=f"gradient of {name}")


def test_checkpointing_v3_gives_the_same_gradients():
    torch.manual_seed(0)
    model = build("v3", CONFIG)
    (inputs, targets), = make_batches(CONFIG, 1, 8, count=1, seed=3)
    lm_loss(model(inputs), targets).backward()
    plain = _gradients(model)
    model.zero_grad(set_to_none=True)
    model.set_gradient_checkpointing([0])  # one block: per-block control
    lm_loss(model(inputs), targets).backward()
    for name, grad in _gradients(model).items():
        torch.testing.assert_close(grad, plain[name], rtol=1e-4, atol=1e-6, msg=f"gradient of {name}")
    with pytest.raises(ValueError, match="no block"):
        model.set_gradient_checkpointing([5])


def test_checkpointing_lowers_the_peak_activation_memory():
    config = make_config("ci", num_layers=4)
    (inputs, targets), = make_batches(config, 4, 96, count=1, seed=4)
    peaks = {}
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = build("v1", config).set_gradient_checkpointing(checkpointing)

        def step():
            lm_loss(model(inputs), targets).backward()
            model.zero_grad(set_to_none=True)

        timeline = memory_timeline(step, device="cpu", warmup=0)
        # everything but the weights: activations, temporaries, gradients (the profiler's categories)
        peaks[checkpointing] = timeline.drop(columns=["time_ms", "parameter"]).sum(axis=1).max()
    assert peaks[True] < 0.75 * peaks[False], peaks
