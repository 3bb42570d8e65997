"""The checks of notebook 13's backward exercises: RMSNorm's gradient formula (13.6) and the autograd
Function around the participant's Triton forward (13.7), and the tiny model that shows which
parameters a Function trains.

The reference answer is PyTorch's own autograd through RMSNorm's formula (:func:`reference_grads`),
never a hand-written gradient; the typical mistakes ("slips") are hand-written gradients with one
thing wrong each (:data:`FORMULA_SLIPS`, :data:`FUNCTION_SLIPS`), each with the message it deserves. A wrong answer is
compared with every slip on the same inputs, and the feedback names the one it equals. The cases are
chosen so that every slip differs from the right answer: rows of different scales (a gradient
computed from the output instead of the input changes by each row's scale), a three-dimensional
input (a weight gradient summed over the first dimension only keeps the wrong shape), a weight that
is not all ones, and a case where ``eps`` is not negligible next to the mean square (the wrong
``eps`` shows only there).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.autograd.gradcheck import GradcheckError

from tinyllama.correctness import CorrectnessError, check_every_parameter_trained, parameters_without_gradient
from tinyllama.course.checkpoints import checkpoint
from tinyllama.course.feedback import compare_outputs

Grads = tuple[torch.Tensor | None, torch.Tensor | None]
Backward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], Grads]


@dataclass(frozen=True)
class Case:
    """One set of inputs: ``shape`` of x (the last dimension is the row), ``scale`` the range of the rows'
    root-mean-squares, ``eps`` the one the forward uses."""

    shape: tuple[int, ...]
    scale: tuple[float, float]
    eps: float
    note: str


# eps 0.1 on rows whose mean square is about 0.01: there eps decides rstd, so a wrong one shows.
EPS_CASE = Case((4, 11), (0.1, 0.1), 0.1, "eps not negligible: rows of mean square about 0.01, eps 0.1")
FORMULA_CASES: tuple[Case, ...] = (
    Case((3, 37), (0.3, 3.0), 1e-5, "rows of different scales"),
    Case((2, 5, 19), (0.3, 3.0), 1e-5, "batch x sequence x hidden"),
    EPS_CASE,
)
GRADCHECK_CASE = Case((3, 37), (0.3, 3.0), 1e-5, "gradcheck")


def make_inputs(case: Case, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu",
                seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, weight, dy)`` for ``case``: rows of x with root-mean-squares spread over ``case.scale``
    (geometrically), a weight of ones plus noise, and an upstream gradient."""
    generator = torch.Generator().manual_seed(seed)
    rows = 1
    for size in case.shape[:-1]:
        rows *= size
    low, high = case.scale
    scales = torch.logspace(math.log10(low), math.log10(high), rows, dtype=torch.float64)
    scales = scales[torch.randperm(rows, generator=generator)].reshape(*case.shape[:-1], 1)
    x = torch.randn(case.shape, generator=generator, dtype=torch.float64) * scales
    weight = 1 + 0.3 * torch.randn(case.shape[-1], generator=generator, dtype=torch.float64)
    dy = torch.randn(case.shape, generator=generator, dtype=torch.float64)
    return tuple(t.to(device=device, dtype=dtype) for t in (x, weight, dy))  # type: ignore[return-value]


def rmsnorm_formula(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dimension, in x's dtype (float64 here)."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def reference_grads(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> Grads:
    """``(dx, dweight)`` of :func:`rmsnorm_formula` for the upstream gradient ``dy``, by PyTorch's autograd
    in float64: the answer every check compares with."""
    with torch.enable_grad():
        x64 = x.detach().double().requires_grad_()
        w64 = weight.detach().double().requires_grad_()
        dx, dweight = torch.autograd.grad(rmsnorm_formula(x64, w64, eps), (x64, w64), dy.double())
    return dx, dweight


# ---- the typical mistakes, each a gradient with one thing wrong ----------------------------------------------


def _parts(x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, eps: float):
    rstd = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    xhat = x * rstd
    return rstd, xhat, dy * weight


def _dweight(dy: torch.Tensor, xhat: torch.Tensor) -> torch.Tensor:
    return (dy * xhat).reshape(-1, xhat.shape[-1]).sum(dim=0)


def _no_mean_term(dy, x, weight, eps):
    rstd, xhat, g = _parts(x, weight, dy, eps)
    return rstd * g, _dweight(dy, xhat)


def _sum_not_mean(dy, x, weight, eps):
    rstd, xhat, g = _parts(x, weight, dy, eps)
    return rstd * (g - xhat * (g * xhat).sum(dim=-1, keepdim=True)), _dweight(dy, xhat)


def _no_weight_in_dx(dy, x, weight, eps):
    rstd, xhat, _ = _parts(x, weight, dy, eps)
    return rstd * (dy - xhat * (dy * xhat).mean(dim=-1, keepdim=True)), _dweight(dy, xhat)


def _dweight_from_x(dy, x, weight, eps):
    dx, _ = reference_grads(dy, x, weight, eps)
    return dx, _dweight(dy, x)


def _eps_outside_root(dy, x, weight, eps):
    # the backward's rstd written as 1/sqrt(mean(x^2)) + eps; everything else right
    rstd = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True)) + eps
    xhat, g = x * rstd, dy * weight
    return rstd * (g - xhat * (g * xhat).mean(dim=-1, keepdim=True)), _dweight(dy, xhat)


def _with_eps(value: float) -> Backward:
    return lambda dy, x, weight, eps: reference_grads(dy, x, weight, value)


EPS_MESSAGE = ("the gradients are (nearly) right where eps is negligible next to mean(x^2) and wrong where it is "
               "not: compute rstd with the eps you are given, inside the root, exactly as the forward does{matched}")


@dataclass(frozen=True)
class Slip:
    """A typical wrong gradient and what to say about it. ``tol``: how close an answer must come to be
    this slip, where wider than the check's (one slip standing for a family: every small eps)."""

    name: str
    grads: Backward
    message: str
    tol: float = 0.0


# Every eps below 1e-5 gives nearly the same gradient on EPS_CASE (rstd 10 instead of 3): one slip.
_SMALL_EPS = dict(grads=_with_eps(0.0), tol=1e-2)

FORMULA_SLIPS: tuple[Slip, ...] = (
    Slip("no mean term", _no_mean_term,
         "dx lacks the mean term: rstd depends on every element of the row, so dx = rstd * (g - xhat * "
         "mean(g * xhat)) with g = dy * weight, not rstd * g alone"),
    Slip("sum, not mean", _sum_not_mean,
         "the mean term sums g * xhat over the row where it should average it (divide by N, the row's length)"),
    Slip("no weight in dx", _no_weight_in_dx,
         "dx ignores the weight: the gradient reaching xhat is g = dy * weight, in both places of dx's formula"),
    Slip("dweight from x", _dweight_from_x,
         "dweight sums dy * x: the weight multiplies the normalised row, so dweight sums dy * xhat = dy * x * rstd"),
    Slip("eps outside the root", _eps_outside_root,
         EPS_MESSAGE.format(matched=" (yours adds eps after the root: 1/sqrt(mean(x^2)) + eps)")),
    Slip("eps small", message=EPS_MESSAGE.format(matched=" (yours equals the gradient with an eps of 1e-5 or less: "
                                                         "a number written in place of eps, or none)"), **_SMALL_EPS),
)

# What the Function may get wrong beyond the formula: the tensors it saves, the eps it carries.
FUNCTION_SLIPS: tuple[Slip, ...] = (
    Slip("output saved", lambda dy, x, weight, eps: reference_grads(dy, rmsnorm_formula(x, weight, eps), weight, eps),
         "your backward computed the gradients from the output y, not the input x: save x with "
         "ctx.save_for_backward (rstd and xhat come from x; y has lost each row's scale)"),
    Slip("eps small", message=EPS_MESSAGE.format(matched=" (yours equals the gradient with an eps of 1e-5 or less, "
                                                         "where the forward got 0.1: keep the forward's eps on ctx and "
                                                         "pass it to the backward)"), **_SMALL_EPS),
)


def _same(actual: torch.Tensor | None, expected: torch.Tensor, tol: float) -> bool:
    """Within ``tol`` of ``expected``, relative to each element and to the tensor's largest element."""
    if actual is None or not isinstance(actual, torch.Tensor) or tuple(actual.shape) != tuple(expected.shape):
        return False
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    return bool(torch.allclose(a, e, rtol=tol, atol=tol * float(e.abs().max())))


def name_slip(actual: Sequence[torch.Tensor | None], x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor,
              eps: float, slips: Sequence[Slip], tol: float) -> Slip | None:
    """The first slip of ``slips`` whose gradients ``actual`` (dx, dweight) equals within ``tol`` on these
    inputs, among those that differ from the right answer by more than ``tol``; else ``None``."""
    x64, w64, dy64 = (t.detach().double().cpu() for t in (x, weight, dy))
    reference = reference_grads(dy64, x64, w64, eps)
    for slip in slips:
        expected = slip.grads(dy64, x64, w64, eps)
        changed = [not _same(e, r, tol) for e, r in zip(expected, reference)]
        close = max(tol, slip.tol)
        if any(changed) and all(_same(a, e, close) for a, e, c in zip(actual, expected, changed) if c):
            return slip
    return None


def _seed(seed: int | None) -> int:
    return int.from_bytes(os.urandom(4), "little") if seed is None else seed


def _shape_problems(name: str, value: torch.Tensor | None, expected: torch.Tensor, what: str) -> str | None:
    """What is wrong with the type or shape of gradient ``name`` (``what``: whose shape it must have)."""
    if value is None:
        why = ("the weight is a parameter; without its gradient it never trains" if name == "dweight" else
               "x needs its gradient: the layers before the norm learn from it")
        return f"{name} is None: {why}"
    if not isinstance(value, torch.Tensor):
        return f"{name} is a {type(value).__name__}, not a tensor"
    if tuple(value.shape) != tuple(expected.shape):
        return (f"{name} has shape {tuple(value.shape)} where {what} has {tuple(expected.shape)}"
                + ("; the weight is shared by every row, so its gradient sums dy * xhat over every dimension but the "
                   "last (batch and sequence)" if name == "dweight" else ""))
    return None


@dataclass
class _Failure:
    """A case on which the answer's gradients differ from the reference."""

    case: Case
    label: str
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # x, weight, dy
    grads: Sequence[torch.Tensor | None]
    mismatches: list[str]


def _diagnose(failures: Sequence[_Failure], slips: Sequence[Slip], tol: float) -> list[str]:
    """What to tell about ``failures``: the slip the answer equals (a wrong eps judged where eps matters,
    every other slip on the first case it shows on), else every mismatch."""
    eps_slips = [slip for slip in slips if slip.name.startswith("eps")]
    order = [(f, eps_slips) for f in failures if f.case is EPS_CASE] + [(f, slips) for f in failures]
    for failure, candidates in order:
        x, weight, dy = failure.inputs
        slip = name_slip(failure.grads, x, weight, dy, failure.case.eps, candidates, tol)
        if slip is not None:
            return [f"{failure.label}: {slip.message}"]
    problems = []
    if [f.case for f in failures] == [EPS_CASE]:
        problems.append(f"{failures[0].label}: " + EPS_MESSAGE.format(matched=""))
    return problems + [f"{f.label}: {text}" for f in failures for text in f.mismatches]


# ---- 13.6: the formula ---------------------------------------------------------------------------------------


class _Float64Probe(torch.autograd.Function):
    """RMSNorm's formula in float64 as the forward, the participant's ``backward`` as the backward: what
    ``torch.autograd.gradcheck`` differentiates numerically and compares."""

    @staticmethod
    def forward(ctx, x, weight, eps, backward):  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.eps, ctx.answer = eps, backward
        return rmsnorm_formula(x, weight, eps)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        dx, dweight = ctx.answer(dy, x, weight, ctx.eps)
        return dx, dweight, None, None


def gradcheck_backward(backward: Backward, case: Case = GRADCHECK_CASE, seed: int = 0) -> str | None:
    """``torch.autograd.gradcheck`` in float64 on the CPU of RMSNorm's formula with ``backward`` as its
    gradient: ``None`` when the gradients agree with finite differences of the forward, else which
    gradient differs (``dx``, ``dweight`` or the error)."""
    x, weight, _ = make_inputs(case, seed=seed)
    inputs = (x.requires_grad_(), weight.requires_grad_())
    try:
        torch.autograd.gradcheck(lambda a, b: _Float64Probe.apply(a, b, case.eps, backward), inputs,
                                 eps=1e-6, atol=1e-6, rtol=1e-4)
    except GradcheckError as error:
        found = re.search(r"with respect to input (\d)", str(error))
        return {"0": "dx", "1": "dweight"}.get(found.group(1), str(error)) if found else str(error).splitlines()[0]
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001 - the participant's code failed: say how, briefly
        return f"{type(error).__name__}: {error}"
    return None


def check_rmsnorm_backward(backward: Backward, cases: Sequence[Case] = FORMULA_CASES, seed: int | None = None) -> bool:
    """Exercise 13.6: ``backward(dy, x, weight, eps)`` returns RMSNorm's ``(dx, dweight)``. Checked by
    ``torch.autograd.gradcheck`` in float64 (3 x 37) and against PyTorch's autograd on fresh random inputs
    (:data:`FORMULA_CASES`); a wrong answer is named by the slip it equals."""
    seed = _seed(seed)
    problems: list[str] = []
    failures: list[_Failure] = []
    for number, case in enumerate(cases):
        x, weight, dy = make_inputs(case, seed=seed + number)
        reference = reference_grads(dy, x, weight, case.eps)
        label = f"x of shape {case.shape} ({case.note})"
        try:
            result = backward(dy.clone(), x.clone(), weight.clone(), case.eps)
        except NotImplementedError:
            raise
        except Exception as error:  # noqa: BLE001 - the participant's code failed: say where
            problems.append(f"{label}: {type(error).__name__}: {error}")
            continue
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            problems.append(f"{label}: return two tensors, (dx, dweight); got {type(result).__name__}")
            break
        shapes = [_shape_problems(name, value, expected, of)
                  for name, value, expected, of in zip(("dx", "dweight"), result, reference, ("x", "the weight"))]
        shapes = [problem for problem in shapes if problem]
        if shapes:
            problems.extend(f"{label}: {problem}" for problem in shapes)
            break  # the same mistake on every case
        wrong = [compare_outputs(value, expected, atol=1e-5 * float(expected.abs().max()), rtol=1e-5, name=name)
                 for name, value, expected in zip(("dx", "dweight"), result, reference)]
        wrong = [mismatch.describe() for mismatch in wrong if not mismatch.ok]
        if wrong:
            failures.append(_Failure(case, label, (x, weight, dy), result, wrong))
    if failures and not problems:
        problems = _diagnose(failures, FORMULA_SLIPS, tol=1e-4)
    if not problems:  # the values agree; gradcheck is the independent test (finite differences of the forward)
        differs = gradcheck_backward(backward)
        if differs is not None:
            problems.append(f"gradcheck (float64, x of shape {GRADCHECK_CASE.shape}): {differs} differs from the "
                            "finite differences of the forward")
    shown = ", ".join(str(case.shape) for case in cases)
    return checkpoint(not problems,
                      f"rmsnorm_backward agrees with PyTorch's autograd on x of shapes {shown} (float64, eps 1e-5 and "
                      f"0.1) and passes torch.autograd.gradcheck on {GRADCHECK_CASE.shape[0]} x "
                      f"{GRADCHECK_CASE.shape[1]}",
                      f"rmsnorm_backward is wrong (seed {seed}):\n  - " + "\n  - ".join(problems))


# ---- 13.7: the Function, and which parameters it trains --------------------------------------------------------

Norm = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]


class _NormLayer(nn.Module):
    def __init__(self, width: int, norm: Norm, eps: float) -> None:
        super().__init__()
        self.norm, self.eps = norm, eps
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(width))  # not all ones: a gradient of ones would hide

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x, self.weight, self.eps)


class NormNet(nn.Module):
    """Embedding, norm, linear, norm, output head: a decoder's layout without attention, its norms
    computed by ``norm(x, weight, eps)`` (a kernel, a Function's ``apply``, a PyTorch formula)."""

    def __init__(self, norm: Norm, width: int = 37, vocab: int = 29, eps: float = 1e-5) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.norm1 = _NormLayer(width, norm, eps)
        self.proj = nn.Linear(width, width, bias=False)
        self.norm2 = _NormLayer(width, norm, eps)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm2(self.proj(self.norm1(self.embed(tokens)))))


@dataclass
class Trained:
    """Which parameters of a :class:`NormNet` got a gradient from one backward, and what the course's
    check (:func:`tinyllama.correctness.check_every_parameter_trained`) said."""

    trained: list[str]
    untrained: list[str]
    verdict: str  # "" when the check passed, else its message

    @property
    def summary(self) -> str:
        total = len(self.trained) + len(self.untrained)
        return f"{len(self.trained)} of {total} parameters trained"


def trained_parameters(norm: Norm, device: torch.device | str = "cpu", seed: int = 0) -> Trained:
    """One forward and backward of a small :class:`NormNet` whose norms call ``norm``: the parameters that
    received a gradient, and the verdict of the course's check."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = NormNet(norm).to(device)
        tokens, targets = torch.randint(0, 29, (2, 2, 7)).to(device)  # drawn on the CPU: the forked generator

    def loss() -> torch.Tensor:
        return nn.functional.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())

    model.zero_grad(set_to_none=True)
    loss().backward()
    untrained = parameters_without_gradient(model)
    trained = [name for name, _ in model.named_parameters() if name not in untrained]
    try:
        check_every_parameter_trained(model, loss)
        verdict = ""
    except CorrectnessError as error:
        verdict = str(error)
    return Trained(trained, untrained, verdict)


def _untrained_hint(untrained: Sequence[str]) -> str:
    """What a set of untrained parameters of :class:`NormNet` says about the Function's backward."""
    if untrained and set(untrained) <= {"norm1.weight", "norm2.weight"}:
        return (" Only the norms' weights get nothing: your backward returns None (or zeros) for the weight, its "
                "second value; return dweight there.")
    if {"embed.weight", "proj.weight"} <= set(untrained):
        return (" Nothing before a norm learns: your backward returns None (or zeros) for x, its first value; "
                "return dx there.")
    return " Return one gradient per input of forward, in order: (dx, dweight, None for eps)."


def _function_tolerance(dtype: torch.dtype) -> float:
    # fp32: the order of additions; 16-bit: a rounding step of the results (bf16 keeps 8 significant bits)
    return 1e-5 if dtype in (torch.float32, torch.float64) else 2**-6


def check_rmsnorm_function(function: type[torch.autograd.Function], reference: Norm,
                           device: torch.device | str, dtypes: Sequence[torch.dtype],
                           shapes: Sequence[tuple[int, ...]], seed: int | None = None) -> bool:
    """Exercise 13.7: ``function.apply(x, weight, eps)`` computes RMSNorm and its backward gives ``x`` and
    ``weight`` their gradients. First the course's trained-parameters check on a small model whose norms
    use ``function``; then the output and both gradients against ``reference`` (tinyllama's RMSNorm, by
    autograd) on fresh random inputs of ``shapes`` (and a 3-D input and a case where eps matters) in each
    of ``dtypes`` on ``device``."""
    seed = _seed(seed)
    try:
        trained = trained_parameters(function.apply, device, seed)
        problem = trained.verdict
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001 - the participant's Function failed: say how
        trained, problem = None, f"{type(error).__name__}: {error}"
    hint = _untrained_hint(trained.untrained if trained is not None else [])
    model = f"a small model whose norms use {function.__name__}"
    ok = checkpoint(not problem, f"{model}: {trained.summary if trained else ''} "
                                 "(tinyllama.correctness.check_every_parameter_trained passes)",
                    f"{model}: {problem}.{hint}")
    if not ok:
        return False
    cases = [Case(tuple(shape), (0.3, 3.0), 1e-5, "rows of different scales") for shape in shapes]
    cases += [Case((2, 3, 37), (0.3, 3.0), 1e-5, "batch x sequence x hidden"), EPS_CASE]
    problems: list[str] = []
    for dtype in dtypes:
        tol = _function_tolerance(dtype)
        failures: list[_Failure] = []
        for number, case in enumerate(cases):
            x, weight, dy = make_inputs(case, dtype, device, seed + number)
            label = f"{str(dtype).removeprefix('torch.')}, x of shape {case.shape} ({case.note})"
            mine_x, mine_w = x.clone().requires_grad_(), weight.clone().requires_grad_()
            ref_x, ref_w = x.clone().requires_grad_(), weight.clone().requires_grad_()
            try:
                y = function.apply(mine_x, mine_w, case.eps)
                y.backward(dy)
            except NotImplementedError:
                raise
            except Exception as error:  # noqa: BLE001 - say what failed, not a traceback
                problems.append(f"{label}: {type(error).__name__}: {error}")
                break
            expected_y = reference(ref_x, ref_w, case.eps)
            expected_y.backward(dy)
            wrong = []
            for name, value, expected in (("y", y, expected_y), ("dx", mine_x.grad, ref_x.grad),
                                          ("dweight", mine_w.grad, ref_w.grad)):
                shape = _shape_problems(name, value, expected, "the reference")
                if shape:
                    wrong.append(shape)
                    continue
                mismatch = compare_outputs(value, expected, atol=tol * float(expected.detach().abs().max()), rtol=tol,
                                           name=name)
                if not mismatch.ok:
                    wrong.append(mismatch.describe())
            if wrong:
                failures.append(_Failure(case, label, (x, weight, dy), (mine_x.grad, mine_w.grad), wrong))
        if failures and not problems:
            problems = _diagnose(failures, FUNCTION_SLIPS + FORMULA_SLIPS, tol=max(tol, 1e-4))
        if problems:
            break
    shown = ", ".join(str(case.shape) for case in cases)
    names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
    return ok and checkpoint(not problems,
                             f"{function.__name__}: y, dx and dweight agree with tinyllama's RMSNorm and autograd on "
                             f"fresh random inputs of shapes {shown} in {names}",
                             f"{function.__name__} differs from tinyllama's RMSNorm (seed {seed}):\n  - "
                             + "\n  - ".join(problems))
