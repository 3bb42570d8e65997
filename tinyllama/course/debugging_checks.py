"""The checks of notebook 15 (performance debugging): the first loss and the detector (15.1), the diagnosis
(15.2), the finder of strided outputs (15.3) and the projection without a copy (15.4).

Each check runs the participant's answer on labelled cases (:mod:`tinyllama.course.diagnosis`) or on fresh
random inputs (:func:`tinyllama.course.check_function`), and when the answer is wrong compares it with the
typical mistakes of the exercise (small functions here, run on the same cases) to name the one it equals;
else it gives a general hint.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from tinyllama.course.checkpoints import checkpoint
from tinyllama.course.diagnosis import Case, check_cases, check_layout
from tinyllama.course.feedback import check_function

# ---- 15.1: the first loss and the detector -----------------------------------------------------------------------

LOSS_SLIPS: tuple[tuple[str, Callable[[int], float], str], ...] = (
    ("log2", lambda v: math.log2(v), "that is log2(V): PyTorch's cross-entropy uses the natural logarithm (math.log)."),
    ("log10", lambda v: math.log10(v), "that is log10(V): PyTorch's cross-entropy uses the natural logarithm."),
    ("probability", lambda v: 1.0 / v, "that is the probability 1/V of the right token; the loss is minus its "
                                       "natural logarithm."),
    ("sign", lambda v: -math.log(v), "that is ln(1/V), a negative number: the loss is minus the logarithm of the "
                                     "probability."),
    ("vocabulary", lambda v: float(v), "that is the vocabulary size itself: the loss is a logarithm of it."),
)


def check_initial_loss(expected_initial_loss: float, vocab_size: int) -> bool:
    """Exercise 15.1, the number: the cross-entropy of a uniform guess over ``vocab_size`` tokens."""
    uniform = math.log(vocab_size)
    value = float(expected_initial_loss)
    said = next((message for _, slip, message in LOSS_SLIPS if math.isclose(value, slip(vocab_size), rel_tol=1e-3)),
                "a uniform guess over V tokens puts probability 1/V on the right one, and the loss is minus its "
                "natural logarithm")
    return checkpoint(abs(value - uniform) < 1e-3 * uniform,
                      "expected_initial_loss is the cross-entropy of a uniform guess over the vocabulary",
                      f"expected_initial_loss = {value:.4g}, expected {uniform:.4g}: {said}")


def detector_cases(colleague_losses: Sequence[float], reference_losses: Sequence[float], vocab_size: int) -> list[Case]:
    """The two runs of the notebook and made-up runs that separate a right detector from each slip."""
    uniform = math.log(vocab_size)
    return [
        Case("the colleague's run (stage=1)", (colleague_losses, vocab_size), True,
             "its first loss is far above a uniform guess"),
        Case("the intended model (stage=3)", (reference_losses, vocab_size), False,
             "a correctly initialised model starts just above a uniform guess"),
        Case("a run starting 0.2 nats above a uniform guess", ([uniform + 0.2, uniform], vocab_size), False,
             "logits of standard deviation about 0.6 add 0.2 nats: still a sound start"),
        Case("a run starting 0.1 nats below a uniform guess", ([uniform - 0.1, uniform], vocab_size), False,
             "a few dozen tokens of one batch scatter the mean loss by a tenth of a nat either way"),
        Case("a run starting 3 nats above on a vocabulary of 32000", ([math.log(32000) + 3.0, 12.0], 32000), True,
             "3 nats is a model 20 times more sure of wrong tokens than a uniform guess (use the vocab_size argument)"),
        Case("a run starting 0.1 nats above on a vocabulary of 32000", ([math.log(32000) + 0.1, 10.3], 32000), False,
             "a sound start on a larger vocabulary: its uniform guess is ln 32000 (use the vocab_size argument)"),
        Case("a run whose first loss is NaN", ([float("nan"), float("nan")], vocab_size), True,
             "NaN at step 0 means the forward pass overflowed: never a sound start (comparisons with NaN are False)"),
        Case("a run whose first loss is infinite", ([float("inf"), 9.0], vocab_size), True,
             "an infinite loss gives the right token probability 0"),
    ]


def detector_slips(vocab_size: int) -> dict[str, tuple[Callable[[Sequence[float], int], bool], str]]:
    """The typical wrong detectors (``vocab_size``: the notebook's, which a detector that ignores its argument
    uses) and what to say about each."""
    return {
        "relative": (lambda losses, v: losses[0] > 2 * math.log(v),
                     "your detector is relative (a multiple of the uniform guess): on a large vocabulary 3 nats above "
                     "is less than twice ln V. Compare the difference first loss - ln V with a fixed margin, about a nat."),
        "nan-blind": (lambda losses, v: abs(losses[0] - math.log(v)) > 1.0,
                      "your detector calls a NaN loss sound: every comparison with NaN is False. Test "
                      "math.isfinite(first) first."),
        "own vocabulary": (lambda losses, v: not math.isfinite(losses[0]) or abs(losses[0] - math.log(vocab_size)) > 1,
                           "your detector ignores its vocab_size argument (it uses the notebook's vocabulary): the "
                           "uniform guess is math.log(vocab_size)."),
        "too tight": (lambda losses, v: not math.isfinite(losses[0]) or abs(losses[0] - math.log(v)) > 0.1,
                      "your margin is too tight: a sound start lies a few tenths of a nat from ln V (logits of the "
                      "recipe's size, and one batch's scatter). Use about a nat."),
    }


def _answers(function: Callable[..., Any], cases: Sequence[Case]) -> list[Any]:
    answers = []
    for case in cases:
        try:
            answers.append(bool(function(*case.args)))
        except NotImplementedError:
            raise
        except Exception as error:  # noqa: BLE001 - check_cases says what it raised
            answers.append(type(error).__name__)
    return answers


def check_detector(init_looks_broken: Callable[[Sequence[float], int], bool], colleague_losses: Sequence[float],
                   reference_losses: Sequence[float], vocab_size: int) -> bool:
    """Exercise 15.1, the detector: right on every case of :func:`detector_cases`; a wrong detector is named
    among :func:`detector_slips` by its answers on the same cases."""
    cases = detector_cases(colleague_losses, reference_losses, vocab_size)
    hint = "compare the first loss with the uniform guess for that vocab_size, in nats"
    answers = _answers(init_looks_broken, cases)
    if not all(case.judge(answer) for case, answer in zip(cases, answers)):
        for slip, message in detector_slips(vocab_size).values():
            if _answers(slip, cases) == answers:
                hint = f"It behaves like a typical mistake: {message}"
                break
    return check_cases("init_looks_broken", init_looks_broken, cases, hint=hint)


# ---- 15.2: the diagnosis ---------------------------------------------------------------------------------------

WHY_NOT = {
    "learning_rate": "the learning rate acts only from the second step on, and the loss is already wrong at step 0",
    "targets": "an untrained model cannot know the targets, whichever they are: it would still start at the "
               "uniform guess",
    "data": "random tokens make the uniform guess the floor of the loss, not a reason to start far above it",
}
SUSPECTS = ("learning_rate", "initialisation", "targets", "data")


def check_cause(cause: str) -> bool:
    """Exercise 15.2, the cause: what acts before the first update; each wrong suspect says why it cannot be."""
    return checkpoint(cause == "initialisation", "cause: the initialisation (the loss is wrong before any update)",
                      f"cause = {cause!r}: " + WHY_NOT.get(cause, f"choose one of {SUSPECTS}"))


def check_stds(broken_std: float, intended_std: float, measured_median: float, init_std: float) -> bool:
    """Exercise 15.2, the numbers: the colleague's weights' standard deviation as measured, and the recipe's."""
    swapped = math.isclose(broken_std, init_std, rel_tol=0.1) and math.isclose(intended_std, measured_median, rel_tol=0.1)
    if swapped:
        return checkpoint(False, "", f"broken_std = {broken_std:.3g} and intended_std = {intended_std:.3g} are swapped: "
                                     "broken_std is what the colleague's matrices have (the table), intended_std what "
                                     "the recipe asks for (config.init_std)")
    ok = checkpoint(0.9 * measured_median <= broken_std <= 1.1 * measured_median,
                    "broken_std is what the weight table shows for the colleague's matrices",
                    f"broken_std = {broken_std:.3g}, but the colleague's matrices have a median standard deviation of "
                    f"{measured_median:.3g} (the table above)")
    return ok & checkpoint(math.isclose(intended_std, init_std, rel_tol=1e-6), "intended_std is the recipe's",
                           f"intended_std = {intended_std:.3g}; the recipe's value is config.init_std")


# ---- 15.3: which modules hand on a strided last dimension ---------------------------------------------------------

def _hooked(model: nn.Module, inputs: torch.Tensor, modules: Sequence[tuple[str, nn.Module]],
            strided: Callable[[torch.Tensor], bool], remove: bool = True) -> dict[str, tuple[int, ...]]:
    found: dict[str, tuple[int, ...]] = {}

    def hook_for(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if isinstance(output, torch.Tensor) and output.dim() and output.shape[-1] > 1 and strided(output):
                found[name] = tuple(output.stride())
        return hook

    handles = [module.register_forward_hook(hook_for(name)) for name, module in modules]
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        if remove:
            for handle in handles:
                handle.remove()
    return found


def _strided(t: torch.Tensor) -> bool:
    return t.stride(-1) != 1


STRIDED_SLIPS: dict[str, tuple[Callable[[nn.Module, torch.Tensor], Any], str]] = {
    "is_contiguous": (lambda model, x: _hooked(model, x, list(model.named_modules()), lambda t: not t.is_contiguous()),
                      "your function tests is_contiguous(): a slice of a wider tensor is not contiguous, yet its rows "
                      "have stride 1 and the kernels read them in place. Test output.stride(-1) != 1."),
    "children only": (lambda model, x: _hooked(model, x, list(model.named_children()), _strided),
                      "your function hooks only the model's direct children: the projections sit inside the blocks. "
                      "Hook every module, model.named_modules()."),
    "class names": (lambda model, x: {type(m).__name__: s for n, m in model.named_modules()
                                      for k, s in _hooked(model, x, [(n, m)], _strided).items()},
                    "your keys are not the modules' names: use the names model.named_modules() gives (such as "
                    "'layers.0.attn.q_proj'), not the classes."),
}


def check_strided_outputs(strided_outputs: Callable[[nn.Module, torch.Tensor], dict], cases: Sequence[Case]) -> bool:
    """Exercise 15.3, the finder: right on every labelled case; a wrong finder is named among
    :data:`STRIDED_SLIPS` by its answers on the same cases."""
    hint = "look at output.stride(-1) of every module's output"
    try:
        answers = [strided_outputs(*case.args) for case in cases]
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001 - check_cases says what it raised
        answers = None
    if answers is not None and not all(case.judge(answer) for case, answer in zip(cases, answers)):
        for slip, message in STRIDED_SLIPS.values():
            if [slip(*case.args) for case in cases] == answers:
                hint = f"It behaves like a typical mistake: {message}"
                break
    return check_cases("strided_outputs", strided_outputs, cases, hint=hint)


# ---- 15.4: the projection ----------------------------------------------------------------------------------------

PROJECTION_SHAPES = ((2, 5, 24, 40), (3, 7, 33, 10), (1, 13, 64, 96))


def projection_inputs(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight (out, in), x (rows, tokens, in))`` for ``shape`` = (rows, tokens, in, out)."""
    rows, tokens, features_in, features_out = shape
    return torch.randn(features_out, features_in), torch.randn(rows, tokens, features_in)


def _projection_hint(project: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> str:
    weight, x = projection_inputs((2, 3, 5, 7))
    try:
        result = project(weight, x)
    except NotImplementedError:
        raise
    except RuntimeError:
        return ("the shapes do not fit: weight is (out, in) and x is (..., in), so the product is x times the "
                "weight's transpose, weight.t() (a view).")
    except Exception:  # noqa: BLE001 - check_function says what it raised
        return "the result must equal x @ weight.T"
    del result
    return "the result must equal x @ weight.T"


def check_projection(project: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> tuple[bool, bool]:
    """Exercise 15.4: the values of ``project(weight, x)`` (against ``nn.functional.linear``), then its layout: a
    contiguous last dimension, made without a copy (:func:`tinyllama.course.diagnosis.check_layout`)."""
    values_ok = check_function("project", project, lambda weight, x: nn.functional.linear(x, weight),
                               projection_inputs, PROJECTION_SHAPES, atol=1e-4, rtol=1e-4,
                               hint=_projection_hint(project))
    layout_ok = check_layout("project", project, projection_inputs, PROJECTION_SHAPES,
                             hint="compute the product in the layout the kernels read instead of fixing it afterwards")
    return values_ok, layout_ok
