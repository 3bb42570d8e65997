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


# ---- the exercises through the notebook's own check cells: the reference passes, each slip fails with its message ----

from collections import OrderedDict  # noqa: E402

import pandas as pd  # noqa: E402

from notebook_exercises import SolutionExercises  # noqa: E402
from tinyllama import course  # noqa: E402
from tinyllama.config import make_config  # noqa: E402
from tinyllama.course import debugging_checks  # noqa: E402
from tinyllama.models import build as build_model  # noqa: E402
from tinyllama.models import lm_loss  # noqa: E402
from tinyllama.models.v3_triton import ColumnMajorLinear  # noqa: E402


@pytest.fixture(scope="module")
def solution():
    return SolutionExercises("15_performance_debugging")


def _exercise(solution, exercise, namespace, replacements=()):
    return solution.run(exercise, namespace, list(replacements) or None)


def _only(shown, message, messages):
    assert message in shown, shown
    others = [text for text in messages if text != message and text in shown]
    assert not others, f"the feedback names other mistakes too: {others}"


CONFIG = make_config("ci")


def _namespace():
    uniform = math.log(CONFIG.vocab_size)
    return {"math": math, "torch": torch, "nn": nn, "pd": pd, "course": course, "config": CONFIG,
            "debugging_checks": debugging_checks, "Case": Case, "check_cases": check_cases, "device": torch.device("cpu"),
            "colleague_losses": [4 * uniform, 3 * uniform], "reference_losses": [uniform + 0.05, uniform]}


def test_the_reference_answers_pass_their_checks(solution, capsys):
    namespace = _exercise(solution, "15.1", _namespace())
    _exercise(solution, "15.2", _diagnosis_namespace(namespace))
    _exercise(solution, "15.3", _layout_namespace(namespace))
    _exercise(solution, "15.4", namespace)
    shown = capsys.readouterr().out
    assert "CHECK" not in shown
    for text in ("PASS: expected_initial_loss is the cross-entropy of a uniform guess over the vocabulary",
                 "PASS: init_looks_broken is right on all 8 cases", "PASS: cause: the initialisation",
                 "PASS: intended_std is the recipe's", "PASS: the repaired model starts at the uniform guess",
                 "PASS: strided_outputs is right on all 3 cases", "PASS: strided_outputs leaves no hooks behind",
                 "PASS: project agrees with the reference", "PASS: project returns a contiguous last dimension"):
        assert text in shown


LOSS = "expected_initial_loss = math.log(config.vocab_size)"
DETECTOR = "return not math.isfinite(first) or abs(first - math.log(vocab_size)) > 1.0"
SLIPS_15_1 = [
    (LOSS, "expected_initial_loss = math.log2(config.vocab_size)", "log2"),
    (LOSS, "expected_initial_loss = 1 / config.vocab_size", "probability"),
    (LOSS, "expected_initial_loss = math.log10(config.vocab_size)", "log10"),
    (DETECTOR, "return first > 2 * math.log(vocab_size)", "relative"),
    (DETECTOR, "return abs(first - math.log(vocab_size)) > 1.0", "nan-blind"),
    (DETECTOR, "return not math.isfinite(first) or abs(first - expected_initial_loss) > 1.0", "own vocabulary"),
    (DETECTOR, "return not math.isfinite(first) or abs(first - math.log(vocab_size)) > 0.1", "too tight"),
]


@pytest.mark.parametrize("old, new, slip", SLIPS_15_1, ids=[s[2] for s in SLIPS_15_1])
def test_each_first_loss_and_detector_slip_fails_with_its_own_message(solution, capsys, old, new, slip):
    _exercise(solution, "15.1", _namespace(), [(old, new)])
    shown = capsys.readouterr().out
    messages = [m for _, _, m in debugging_checks.LOSS_SLIPS] + [m for _, m in debugging_checks.detector_slips(1).values()]
    named = dict((name, m) for name, _, m in debugging_checks.LOSS_SLIPS)
    named.update((name, m) for name, (_, m) in debugging_checks.detector_slips(1).items())
    assert "CHECK: " in shown
    _only(shown, named[slip], messages)


def _weight_stds(state):
    return pd.Series({name: value.float().std().item() for name, value in state.items() if value.dim() == 2})


def _diagnosis_namespace(namespace):
    """15.2's check cell with a PyTorch model (V1) standing in for V3: the check reads weights and a first loss."""
    def build(version, config, stage=1):
        return build_model("v1", config)

    torch.manual_seed(0)
    broken = build_model("v1", CONFIG)
    with torch.no_grad():
        for name, value in broken.state_dict().items():
            if value.dim() == 2:
                value.normal_(0.0, 1.0)  # the colleague's weights: std 1 where the recipe says 0.02
    broken_state = {name: value.clone() for name, value in broken.state_dict().items()}
    inputs = torch.randint(0, CONFIG.vocab_size, (2, 11))
    namespace.update({"build": build, "broken_state": broken_state, "weight_stds": _weight_stds, "lm_loss": lm_loss,
                      "inputs": inputs, "targets": torch.roll(inputs, -1, dims=1), "uniform": math.log(CONFIG.vocab_size),
                      "weight_table": pd.DataFrame({"stage 1": _weight_stds(broken_state),
                                                    "stage 3": _weight_stds(broken_state) * 0.02})})
    return namespace


REPAIR_LOOP = "            if isinstance(module, (nn.Linear, nn.Embedding)):\n"
SLIPS_15_2 = [
    ([('cause = "initialisation"', 'cause = "learning_rate"')], debugging_checks.WHY_NOT["learning_rate"]),
    ([('cause = "initialisation"', 'cause = "targets"')], debugging_checks.WHY_NOT["targets"]),
    ([('cause = "initialisation"', 'cause = "data"')], debugging_checks.WHY_NOT["data"]),
    ([('broken_std = float(weight_table["stage 1"].median())', "broken_std = config.init_std"),
      ("intended_std = config.init_std", 'intended_std = float(weight_table["stage 1"].median())')], "are swapped"),
    ([(REPAIR_LOOP, "            if isinstance(module, nn.Linear):\n")], "did you reach the embedding"),
    ([(REPAIR_LOOP, "            if hasattr(module, 'weight'):\n")], "repair changed the RMSNorm scales"),
    ([("    return model\n", "    return copy.deepcopy(model)\n")], "repair must change the model it is given"),
]


@pytest.mark.parametrize("replacements, message", SLIPS_15_2, ids=[s[1][:30] for s in SLIPS_15_2])
def test_each_diagnosis_slip_fails_with_its_own_message(solution, capsys, replacements, message):
    import copy

    namespace = _diagnosis_namespace(_exercise(solution, "15.1", _namespace()))
    namespace["copy"] = copy
    capsys.readouterr()
    _exercise(solution, "15.2", namespace, replacements)
    shown = capsys.readouterr().out
    assert "CHECK: " in shown
    # Swapped numbers also make the repair draw with the colleague's std: what follows says so, rightly.
    _only(shown, message, [m for _, m in SLIPS_15_2[:4 if message == "are swapped" else None]])


class _Block(nn.Module):
    def __init__(self, linear):
        super().__init__()
        self.proj, self.out = linear(24, 24, bias=False), linear(24, 24, bias=False)

    def forward(self, x):
        return self.out(torch.relu(self.proj(x)))


def _layout_namespace(namespace):
    """15.3's check cell with small models standing in for V3's stages: projections nested in blocks, column-major
    (stage 2) or not (stage 3)."""
    torch.manual_seed(0)
    namespace.update({"stage2": nn.Sequential(OrderedDict(block0=_Block(ColumnMajorLinear), block1=_Block(ColumnMajorLinear))),
                      "stage3": nn.Sequential(OrderedDict(block0=_Block(nn.Linear), block1=_Block(nn.Linear))),
                      "inputs": torch.randn(2, 5, 24)})
    return namespace


HOOKS = "    handles = [module.register_forward_hook(hook_for(name)) for name, module in model.named_modules()]"
SLIPS_15_3 = [
    ("output.stride(-1) != 1:", "not output.is_contiguous():", debugging_checks.STRIDED_SLIPS["is_contiguous"][1]),
    (HOOKS, HOOKS.replace("model.named_modules()", "model.named_children()"),
     debugging_checks.STRIDED_SLIPS["children only"][1]),
    ("found[name] = tuple(output.stride())", "found[type(module).__name__] = tuple(output.stride())",
     debugging_checks.STRIDED_SLIPS["class names"][1]),
    ("            handle.remove()", "            pass", "hooks are still registered on the models"),
]


@pytest.mark.parametrize("old, new, message", SLIPS_15_3, ids=[s[1][-30:] for s in SLIPS_15_3])
def test_each_layout_finder_slip_fails_with_its_own_message(solution, capsys, old, new, message):
    _exercise(solution, "15.3", _layout_namespace(_namespace()), [(old, new)])
    shown = capsys.readouterr().out
    assert "CHECK: " in shown
    _only(shown, message, [m for _, _, m in SLIPS_15_3])


PROJECT = "    return x @ weight.t()"
SLIPS_15_4 = [
    ("    return (weight @ x.reshape(-1, x.shape[-1]).t()).t().view(*x.shape[:-1], weight.shape[0])",
     "last dimension is strided"),
    ("    return (weight @ x.reshape(-1, x.shape[-1]).t()).t().contiguous().view(*x.shape[:-1], weight.shape[0])",
     "the function copies data (aten::clone"),
    ("    return x @ weight", "the shapes do not fit: weight is (out, in)"),
]


@pytest.mark.parametrize("new, message", SLIPS_15_4, ids=[s[1][:25] for s in SLIPS_15_4])
def test_each_projection_slip_fails_with_its_own_message(solution, capsys, new, message):
    _exercise(solution, "15.4", _namespace(), [(PROJECT, new)])
    shown = capsys.readouterr().out
    assert "CHECK: " in shown
    _only(shown, message, [m for _, m in SLIPS_15_4])
