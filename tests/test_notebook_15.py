"""Notebook 15's checks (``tinyllama.course.diagnosis``) catch the plausible wrong answers: a detector with a
relative threshold or blind to NaN, a projection that is transposed, and one that copies its way to the
right layout."""

import math

import pytest
import torch
from torch import nn

from tinyllama.course import checkpoints
from tinyllama.course.diagnosis import Case, check_cases, check_layout, copy_operators
from tinyllama.course.profile import PROFILES


@pytest.fixture(autouse=True)
def lenient(monkeypatch):
    monkeypatch.delenv(checkpoints.STRICT_VARIABLE, raising=False)


def _cases(vocab=128):
    uniform = math.log(vocab)
    return [
        Case("broken", ([uniform * 4], vocab), True, "far above"),
        Case("fine", ([uniform + 0.05], vocab), False, "just above"),
        Case("3 nats off on 32000", ([math.log(32000) + 3.0], 32000), True, "a relative rule misses it"),
        Case("fine on 32000", ([math.log(32000) + 0.1], 32000), False, "use the vocab_size argument"),
        Case("NaN", ([float("nan")], vocab), True, "comparisons with NaN are False"),
    ]


def _right(losses, vocab_size):
    first = losses[0]
    return not math.isfinite(first) or abs(first - math.log(vocab_size)) > 1.0


def test_a_right_detector_passes(capsys):
    assert check_cases("detector", _right, _cases())
    assert "PASS: detector is right on all 5 cases" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, missed", [
    (lambda losses, v: losses[0] > 2 * math.log(v), "3 nats off on 32000"),  # a relative threshold
    (lambda losses, v: abs(losses[0] - math.log(v)) > 1.0, "NaN"),  # NaN compares False
    (lambda losses, v: losses[0] > math.log(128) + 1, "fine on 32000"),  # ignores the vocabulary argument
])
def test_plausible_wrong_detectors_fail_and_name_the_case(capsys, wrong, missed):
    assert not check_cases("detector", wrong, _cases())
    out = capsys.readouterr().out
    assert "CHECK: detector is wrong on" in out and missed in out


def test_a_failing_case_is_reported_not_raised(capsys):
    def broken(losses, vocab_size):
        raise KeyError("oops")

    assert not check_cases("detector", broken, _cases())
    assert "raised KeyError" in capsys.readouterr().out


def test_a_missing_answer_still_raises_not_implemented():
    def todo(losses, vocab_size):
        raise NotImplementedError("exercise 15.1")

    with pytest.raises(NotImplementedError):
        check_cases("detector", todo, _cases())


def test_predicate_cases_say_what_they_want(capsys):
    case = Case("stage 3", (), lambda found: len(found) == 0, "contiguous", "nothing")
    assert not check_cases("finder", lambda: {"lm_head": (1, 12)}, [case])
    assert "expected nothing" in capsys.readouterr().out


def test_strict_mode_raises(monkeypatch):
    monkeypatch.setenv(checkpoints.STRICT_VARIABLE, "1")
    with pytest.raises(checkpoints.CheckpointFailed):
        check_cases("detector", lambda losses, v: False, _cases())


def _inputs(shape):
    rows, tokens, features_in, features_out = shape
    return torch.randn(features_out, features_in), torch.randn(rows, tokens, features_in)


SHAPES = [(2, 5, 24, 40), (1, 13, 33, 10)]


def test_the_row_major_projection_passes(capsys):
    assert check_layout("project", lambda w, x: x @ w.t(), _inputs, SHAPES, seed=0)
    assert "PASS" in capsys.readouterr().out


def test_the_column_major_projection_is_caught_by_its_strides(capsys):
    def column_major(w, x):
        tokens = x.reshape(-1, x.shape[-1])
        return (w @ tokens.t()).t().view(*x.shape[:-1], w.shape[0])

    assert not check_layout("project", column_major, _inputs, SHAPES, seed=0)
    out = capsys.readouterr().out
    assert "last dimension is strided" in out and "copies data" not in out


@pytest.mark.parametrize("copying", [
    lambda w, x: (w @ x.reshape(-1, x.shape[-1]).t()).t().contiguous().view(*x.shape[:-1], w.shape[0]),
    lambda w, x: (w @ x.reshape(-1, x.shape[-1]).t()).t().reshape(*x.shape[:-1], w.shape[0]).contiguous(),
])
def test_a_projection_that_copies_to_the_right_layout_is_caught(capsys, copying):
    assert not check_layout("project", copying, _inputs, SHAPES, seed=0)
    out = capsys.readouterr().out
    assert "copies data" in out and "aten::clone" in out


def test_copy_operators_counts_copies_not_views():
    x = torch.randn(6, 8)
    assert copy_operators(lambda: x.t()) == {}
    assert copy_operators(lambda: x.t().contiguous()).get("aten::clone") == 1


def test_the_notebook_sizes_are_small_on_a_cpu_and_not_powers_of_two():
    gpu, ci = PROFILES["gpu"], PROFILES["ci"]
    assert ci.debug_steps < gpu.debug_steps and ci.debug_profiled_steps <= gpu.debug_profiled_steps
    assert ci.debug_batch_size * ci.debug_seq_len < gpu.debug_batch_size * gpu.debug_seq_len
    assert ci.debug_seq_len & (ci.debug_seq_len - 1)  # not a power of two: masks and edges are exercised


def test_every_exercise_can_be_revealed_and_its_answer_works(capsys):
    """course.reveal runs each solution cell of notebook 15 in a namespace with what the cell needs."""
    import pandas as pd

    import importlib

    import nbformat

    from tinyllama.config import make_config
    from tinyllama.course.make_notebooks import exercises

    reveal = importlib.import_module("tinyllama.course.reveal")  # the module; tinyllama.course.reveal is the function

    solution = reveal.solution_notebook("15.1")
    assert sorted(exercises(nbformat.read(solution, as_version=4), solution.stem)) == ["15.1", "15.2", "15.3", "15.4"]
    config = make_config("ci")
    namespace = {"math": math, "torch": torch, "nn": nn, "config": config,
                 "weight_table": pd.DataFrame({"stage 1": [1.0, 1.02], "stage 3": [0.02, 0.021]})}
    for exercise in ("15.1", "15.2", "15.3", "15.4"):
        reveal.reveal(exercise, namespace)
    assert math.isclose(namespace["expected_initial_loss"], math.log(config.vocab_size))
    assert namespace["init_looks_broken"]([float("nan")], 128) and not namespace["init_looks_broken"]([4.9], 128)
    assert namespace["cause"] == "initialisation" and namespace["intended_std"] == config.init_std
    layer = nn.Linear(8, 6, bias=False)
    nn.init.normal_(layer.weight, std=1.0)
    assert namespace["repair"](layer) is layer and layer.weight.std().item() < 0.1
    found = namespace["strided_outputs"](nn.Sequential(nn.Linear(8, 6, bias=False)), torch.randn(2, 3, 8))
    assert found == {}
    weight, x = torch.randn(6, 8), torch.randn(2, 3, 8)
    assert torch.allclose(namespace["project"](weight, x), x @ weight.T)
    assert "Reference answer of exercise 15.4" in capsys.readouterr().out
