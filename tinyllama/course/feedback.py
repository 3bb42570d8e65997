"""Exercise checks with specific feedback: where an answer is wrong, by how much, and what to look at.

- :func:`compare_outputs` describes how one tensor differs from its reference: the worst element and
  where it is, the share of elements off, the region the wrong elements occupy (a tail of columns
  points at a mask), a constant factor (a missing scale), a transposed or misshapen result.
- :func:`check_function` runs a participant's function and its reference on fresh random inputs over
  a list of shapes (sizes that are not powers of two included) and passes only if every shape agrees;
  with ``guard=True`` (a participant's kernel) a load or store past the end of a tensor is named, not a
  crash (:mod:`tinyllama.course.guards`).
- :func:`check_ratio` compares two timed series by the ratio of their medians, with its spread.
- :func:`compare_prediction` puts what the participant predicted beside what was measured; it never
  fails, because a wrong prediction is the lesson, not an error.

A number against an expected range is :func:`tinyllama.course.checkpoints.check_between` (its ``why``
says where the range comes from). Every check prints ``PASS``/``CHECK`` through
:func:`~tinyllama.course.checkpoints.checkpoint` and fails the notebook under ``WORKSHOP_STRICT=1``; in
a participant's Jupyter kernel a failed check of an exercise's answer stops the notebook there
(:mod:`tinyllama.course.exercise_stop`).
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tinyllama.course.checkpoints import checkpoint
from tinyllama.course.guards import STORE_HINT, Guards
from tinyllama.timing import quantile

Shape = tuple[int, ...]


@dataclass
class Mismatch:
    """How ``actual`` differs from ``expected`` (both tensors); ``ok`` when every element is within
    ``atol + rtol * |expected|``."""

    name: str
    ok: bool
    problem: str = ""  # a shape or dtype problem that makes an element comparison meaningless
    numel: int = 0
    off: int = 0  # elements outside the tolerance (NaN and inf included)
    worst_index: tuple[int, ...] | None = None
    worst_actual: float = math.nan
    worst_expected: float = math.nan
    worst_error: float = 0.0
    atol: float = 0.0
    rtol: float = 0.0
    notes: list[str] = field(default_factory=list)  # patterns found among the wrong elements

    @property
    def share_off(self) -> float:
        """Fraction of the elements outside the tolerance."""
        return self.off / self.numel if self.numel else 0.0

    def describe(self) -> str:
        """One paragraph a participant can act on."""
        if self.problem:
            return f"{self.name}: {self.problem}"
        if self.ok:
            return (f"{self.name}: all {self.numel:,} elements within atol={self.atol:g} + rtol={self.rtol:g}*|ref| "
                    f"(largest difference {self.worst_error:.3g})")
        where = ", ".join(str(i) for i in self.worst_index or ())
        text = (f"{self.name}: {self.off:,} of {self.numel:,} elements ({self.share_off:.1%}) are off; the worst is "
                f"at index [{where}]: got {self.worst_actual:.6g}, expected {self.worst_expected:.6g} "
                f"(difference {self.worst_error:.3g}, allowed {self.atol + self.rtol * abs(self.worst_expected):.3g})")
        return text + "".join(f"; {note}" for note in self.notes)


def _as_tensor(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.as_tensor(value)


def _span(indices: torch.Tensor, size: int, axis_name: str) -> str | None:
    """'columns 64..99 of 100' when the wrong elements sit in a contiguous part of an axis."""
    low, high = int(indices.min()), int(indices.max())
    if high - low + 1 == size:
        return None
    return f"{axis_name} {low}..{high} of {size}"


def _patterns(diff_ok: torch.Tensor, actual: torch.Tensor, expected: torch.Tensor) -> list[str]:
    """Patterns among the wrong elements that point at a cause."""
    notes = []
    wrong = ~diff_ok
    if actual.dim() >= 1 and wrong.any():
        positions = wrong.nonzero()
        names = ["rows", "columns"] if actual.dim() == 2 else [f"dim {d}" for d in range(actual.dim())]
        if actual.dim() == 1:
            names = ["elements"]
        spans = [_span(positions[:, d], actual.shape[d], names[d]) for d in range(actual.dim())]
        spans = [s for s in spans if s]
        if spans:
            notes.append("the wrong elements lie only in " + " and ".join(spans)
                         + " (a mask, a block edge or an offset?)")
    nonfinite = int((~torch.isfinite(actual) & torch.isfinite(expected)).sum())
    if nonfinite:
        notes.append(f"{nonfinite:,} elements are NaN or inf where the reference is finite (division by zero, "
                     "a masked load without `other=`, an overflow?)")
    finite = torch.isfinite(actual) & torch.isfinite(expected)
    a, e = actual[finite], expected[finite]
    if a.numel() and not a.any() and e.any():
        notes.append("the result is all zeros: nothing was computed or stored (a store never reached, a mask "
                     "that is always false?)")
        return notes
    denominator = float((e * e).sum())
    if denominator > 0 and a.numel() > 1:
        factor = float((a * e).sum()) / denominator
        residual = float(((a - factor * e) ** 2).sum()) / denominator
        if residual < 1e-6 and abs(factor - 1.0) > 1e-3:
            notes.append(f"the result is {factor:.4g} x the reference everywhere (a missing or extra factor: a "
                         "scale, a square root, 1/N?)")
    return notes


def compare_outputs(actual: Any, expected: Any, atol: float = 1e-5, rtol: float = 1e-5,
                    name: str = "output") -> Mismatch:
    """Describe how ``actual`` differs from ``expected`` (tensors or numbers), element by element."""
    actual_t, expected_t = _as_tensor(actual).detach(), _as_tensor(expected).detach()
    if actual_t.shape != expected_t.shape:
        problem = f"shape {tuple(actual_t.shape)} differs from the reference's {tuple(expected_t.shape)}"
        if actual_t.dim() >= 2 and actual_t.transpose(-1, -2).shape == expected_t.shape:
            problem += " (transposed? the last two dimensions are swapped)"
        return Mismatch(name, False, problem=problem, atol=atol, rtol=rtol)
    a = actual_t.double().cpu()
    e = expected_t.double().cpu()
    error = (a - e).abs()
    allowed = atol + rtol * e.abs()
    within = error <= allowed  # NaN compares False: it counts as off
    mismatch = Mismatch(name, bool(within.all()), numel=a.numel(), off=int((~within).sum()), atol=atol, rtol=rtol)
    if a.numel() == 0:
        return mismatch
    # The worst element: the largest error relative to what is allowed there (NaN counts as infinite).
    badness = torch.nan_to_num(error / allowed.clamp_min(1e-300), nan=math.inf, posinf=math.inf)
    flat = int(torch.argmax(badness if not mismatch.ok else error))
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape)) if a.dim() else ()
    mismatch.worst_index = index
    mismatch.worst_actual, mismatch.worst_expected = float(a[index]), float(e[index])
    mismatch.worst_error = float(error[index])
    if not mismatch.ok:
        if a.dim() >= 2 and a.shape[-1] == a.shape[-2] and torch.allclose(a.transpose(-1, -2), e, atol=atol, rtol=rtol):
            mismatch.notes.append("it equals the reference transposed (swapped strides or indices?)")
        mismatch.notes.extend(_patterns(within, a, e))
    return mismatch


def _outputs(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def check_function(name: str, candidate: Callable[..., Any], reference: Callable[..., Any],
                   make_inputs: Callable[[Shape], Sequence[Any]], shapes: Iterable[Shape], atol: float = 1e-5,
                   rtol: float = 1e-5, seed: int | None = None, hint: str = "", guard: bool = False) -> bool:
    """Run ``candidate(*make_inputs(shape))`` and ``reference(...)`` on the same fresh random inputs for
    every shape, and pass only if every output agrees within ``atol + rtol * |reference|``.

    ``make_inputs(shape)`` draws from PyTorch's random generator; this function seeds it (with
    ``seed``, else a fresh random seed that the feedback names, so a failure can be reproduced) and
    restores the notebook's generator state afterwards. Outputs may be tensors or tuples of tensors.
    Use shapes that are not powers of two: a missing mask only shows on them.

    ``guard=True`` is for a candidate that launches a kernel of the participant's (Triton): it runs on
    guarded copies of the inputs, and what it allocates is guarded too (:mod:`tinyllama.course.guards`),
    so a load or store past the end of a tensor fails the check with a message that names the missing
    mask, instead of crashing the interpreter or poisoning the GPU's context. The reference gets the
    inputs as they are.
    """
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    failures: list[str] = []
    shapes = [tuple(shape) for shape in shapes]
    for shape in shapes:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            inputs = tuple(make_inputs(shape))
        expected = _outputs(reference(*inputs))
        guards = Guards(candidate) if guard else None
        try:
            if guards is None:
                actual = _outputs(candidate(*inputs))
            else:
                guarded = guards.inputs(inputs)
                with guards:
                    actual = _outputs(candidate(*guarded))
        except NotImplementedError:  # an exercise not written yet: its own message says what to do
            raise
        except Exception as error:  # the participant's code failed: say where, keep the traceback short
            found = guards.findings() if guards is not None else []
            stopped = found and STORE_HINT in str(error)  # the guards stopped a store past an end: say only that
            failures.extend(f"shape {shape}: {text}" for text in found)
            if not stopped:
                failures.append(f"shape {shape}: {type(error).__name__}: {error}")
            continue
        if guards is not None:  # before the values: a kernel can go past an end and still get them right
            failures.extend(f"shape {shape}: {text}" for text in guards.findings(actual, expected))
        if len(actual) != len(expected):
            failures.append(f"shape {shape}: returned {len(actual)} outputs, the reference returns {len(expected)}")
            continue
        for number, (a, e) in enumerate(zip(actual, expected)):
            label = f"shape {shape}" + (f", output {number}" if len(expected) > 1 else "")
            mismatch = compare_outputs(a, e, atol, rtol, label)
            if not mismatch.ok:
                failures.append(mismatch.describe())
    shown = ", ".join(str(s) for s in shapes)
    message = (f"{name} differs from the reference on {len(failures)} check(s) (seed {seed}):\n  - "
               + "\n  - ".join(failures) + (f"\n  {hint}" if hint else ""))
    return checkpoint(not failures, f"{name} agrees with the reference on fresh random inputs of shapes {shown}",
                      message)


# ---- naming the typical mistake (a slip) a wrong answer reproduces -------------------------------------


def slip_hint(value: float, expected: float, slips: list[tuple[float, str]], tolerance: float = 0.1) -> str:
    """The slip whose factor ``value / expected`` matches (within ``tolerance``, relative), else ''."""
    if not (math.isfinite(value) and expected and value):
        return ""
    ratio = value / expected
    for factor, text in slips:
        if abs(ratio / factor - 1) <= tolerance:
            return text
    return ""


@dataclass(frozen=True)
class Slip:
    """A typical wrong answer to a function exercise: ``function`` computes it on the same inputs (or, for an
    answer that cannot run, ``error`` is a phrase of the error it raises; for a kernel whose wrong result no
    PyTorch function can model, ``matches(actual, inputs, expected)`` recognises it), ``message`` says what
    went wrong."""

    name: str
    message: str
    function: Callable[..., Any] | None = None
    error: str = ""
    matches: Callable[[torch.Tensor, tuple, torch.Tensor], bool] | None = None


def _agree(actual: Sequence[Any], expected: Sequence[Any], atol: float, rtol: float) -> bool:
    if len(actual) != len(expected):
        return False
    try:
        return all(compare_outputs(a, e, atol, rtol).ok for a, e in zip(actual, expected))
    except Exception:  # noqa: BLE001 - an output that is no tensor or number is no match
        return False


def name_slip(candidate: Callable[..., Any], reference: Callable[..., Any],
              make_inputs: Callable[[tuple[int, ...]], Sequence[Any]], shapes: Sequence[tuple[int, ...]],
              slips: Sequence[Slip], atol: float, rtol: float, seed: int = 0) -> Slip | None:
    """The first of ``slips`` that ``candidate`` reproduces on every shape where it differs from ``reference``
    (the same seeded inputs for all three); ``None`` when it agrees everywhere or reproduces none of them."""

    def inputs(shape: tuple[int, ...]) -> tuple[Any, ...]:  # fresh copies each time: an answer may write to them
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return tuple(make_inputs(shape))

    wrong_on = []  # (shape, expected, actual or None, error or None) where the answer is wrong
    for shape in shapes:
        expected = _outputs(reference(*inputs(shape)))
        try:
            actual, error = _outputs(candidate(*inputs(shape))), None
        except NotImplementedError:
            raise
        except Exception as raised:  # noqa: BLE001 - the participant's code: a slip may explain the error
            actual, error = None, raised
        if error is not None or not _agree(actual, expected, atol, rtol):
            wrong_on.append((shape, expected, actual, error))

    def reproduces(slip: Slip, shape: tuple[int, ...], expected: Any, actual: Any, error: Exception | None) -> bool:
        if error is not None and slip.error and slip.error in str(error):
            return True
        if slip.function is None:
            return False
        try:
            wrong = _outputs(slip.function(*inputs(shape)))
        except Exception as raised:  # noqa: BLE001 - a slip that fails: the answer must fail the same way
            return error is not None and type(raised) is type(error) and str(raised) == str(error)
        return (error is None and not _agree(wrong, expected, atol, rtol)
                and _agree(actual, wrong, atol, rtol))

    if not wrong_on:
        return None
    return next((slip for slip in slips if all(reproduces(slip, *case) for case in wrong_on)), None)


def check_function_slips(name: str, candidate: Callable[..., Any], reference: Callable[..., Any],
                         make_inputs: Callable[[tuple[int, ...]], Sequence[Any]], shapes: Sequence[tuple[int, ...]],
                         slips: Sequence[Slip], atol: float, rtol: float, hint: str) -> bool:
    """:func:`tinyllama.course.feedback.check_function` on ``shapes``, but a wrong answer that reproduces one
    of ``slips`` fails with that slip's message instead of the general ``hint``."""
    slip = name_slip(candidate, reference, make_inputs, shapes, slips, atol, rtol)
    if slip is not None:
        shown = ", ".join(str(tuple(shape)) for shape in shapes)
        return checkpoint(False, "", f"{name} differs from the reference on inputs of shapes {shown}: {slip.message}")
    return check_function(name, candidate, reference, make_inputs, shapes=shapes, atol=atol, rtol=rtol, hint=hint)


# ---- numbers: a wrong answer recognised by the formula that gives it --------------------------------------------

@dataclass(frozen=True)
class NumberSlip:
    """A typical wrong number: ``value(*arguments)`` is what the mistaken formula gives; ``message`` says what
    went wrong."""

    name: str
    value: Callable[..., float]
    message: str


def name_number_slip(answer: float, slips: Sequence[NumberSlip], arguments: tuple, right: float,
                     rel: float) -> NumberSlip | None:
    """The first of ``slips`` whose value on ``arguments`` is ``answer`` (within ``rel``) and not the right one."""
    for slip in slips:
        wrong = slip.value(*arguments)
        if not math.isclose(wrong, right, rel_tol=rel) and math.isclose(answer, wrong, rel_tol=rel):
            return slip
    return None


# ---- kernels: a wrong result recognised, under guards --------------------------------------------------------

# The guards' sentence when the only sign is NaN in the result (rows read from the NaN between a view's rows, or
# past an end): no load or store was seen past an end, so the kernel can run again on the inputs as they are.
NAN_ONLY = "elements are NaN where the reference is finite"


def tensors_close(actual: Any, expected: Any, atol: float, rtol: float) -> bool:
    """Both are tensors of one shape, equal within ``atol`` and ``rtol`` (in float64, NaN equal to NaN)."""
    if not isinstance(actual, torch.Tensor) or not isinstance(expected, torch.Tensor):
        return False
    if actual.shape != expected.shape:
        return False
    return bool(torch.allclose(actual.detach().double().cpu(), expected.detach().double().cpu(), atol=atol,
                               rtol=rtol, equal_nan=True))


def _shows(slip: Slip, actual: torch.Tensor, inputs: tuple, expected: torch.Tensor, atol: float, rtol: float) -> bool:
    if slip.matches is not None:
        return bool(slip.matches(actual, inputs, expected))
    wrong = slip.function(*inputs)  # type: ignore[misc]
    return not tensors_close(wrong, expected, atol, rtol) and tensors_close(actual, wrong, atol, rtol)


def name_kernel_slip(candidate: Callable[..., Any], reference: Callable[..., Any],
                     make_inputs: Callable[[Shape], Sequence[Any]], shapes: Iterable[Shape], slips: Sequence[Slip],
                     atol: float, rtol: float, seed: int, guard: bool = True, results: list | None = None) -> Slip | None:
    """The slip whose result ``candidate`` reproduces on the first shape where it is wrong, else ``None``
    (also when it raises or goes past an end of a tensor: the check itself names that). Unguarded, each result
    is appended to ``results`` (the check reuses them instead of running a slow function twice)."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    for shape in shapes:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            inputs = tuple(make_inputs(tuple(shape)))
        expected = reference(*inputs)
        guards = Guards(candidate) if guard else None
        try:
            if guards is None:
                actual = candidate(*inputs)
            else:
                guarded = guards.inputs(inputs)
                with guards:
                    actual = candidate(*guarded)
        except NotImplementedError:
            raise
        except Exception:  # noqa: BLE001 - the check runs it again and says what it raised
            return None
        if guards is not None:
            found = guards.findings((actual,), (expected,))
            if found and not all(NAN_ONLY in text for text in found):
                return None  # past an end: the guards' sentence is the feedback
            if found:  # NaN from the gaps between rows, nothing past an end: read again from the real gaps
                actual = candidate(*inputs)
        if results is not None and guards is None:
            results.append(actual)
        if tensors_close(actual, expected, atol, rtol):
            continue
        return next((slip for slip in slips if _shows(slip, actual, inputs, expected, atol, rtol)), None)
    return None


def check_kernel(name: str, candidate: Callable[..., Any], reference: Callable[..., Any],
                 make_inputs: Callable[[Shape], Sequence[Any]], shapes: Iterable[Shape], slips: Sequence[Slip],
                 hint: str, atol: float, rtol: float, seed: int | None = None, guard: bool = True) -> bool:
    """:func:`check_function` (same output when right) whose feedback names the typical mistake a wrong kernel
    reproduces (``slips``: each a :class:`Slip` whose ``function`` computes it in PyTorch, or whose ``matches``
    recognises its result), else gives ``hint``. The kernel runs under :class:`~tinyllama.course.guards.Guards`
    unless ``guard`` is off, so a read past an end is named rather than crashing."""
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    shapes = [tuple(shape) for shape in shapes]
    results: list = []
    slip = name_kernel_slip(candidate, reference, make_inputs, shapes, slips, atol, rtol, seed, guard, results)
    said = f"It matches a typical mistake: {slip.message}" if slip is not None else hint
    if not guard:  # the same seed gives the same inputs, shape after shape: reuse what the first pass computed
        results.reverse()

        def again(*inputs: Any) -> Any:
            return results.pop() if results else candidate(*inputs)
    return check_function(name, again if not guard else candidate, reference, make_inputs, shapes, atol=atol,
                          rtol=rtol, seed=seed, hint=said, guard=guard)


def ratio_with_spread(numerator: Sequence[float], denominator: Sequence[float]) -> tuple[float, float, float]:
    """The ratio of the medians of two sample series, and a spread band from their quartiles:
    (q25(num) / q75(den), median / median, q75(num) / q25(den))."""
    if not numerator or not denominator:
        raise ValueError("both series need at least one sample: time each side a few times")
    ratio = statistics.median(numerator) / statistics.median(denominator)
    return (quantile(numerator, 0.25) / quantile(denominator, 0.75), ratio,
            quantile(numerator, 0.75) / quantile(denominator, 0.25))


def check_ratio(name: str, numerator: Sequence[float], denominator: Sequence[float], low: float,
                high: float = math.inf, why: str = "") -> bool:
    """The ratio of the medians of two timed series lies in ``[low, high]``; the feedback gives the
    ratio with its spread band (from the quartiles), so a ratio inside the noise reads as such. A
    measured result: it never stops a participant's notebook outside ``WORKSHOP_STRICT``."""
    lo, ratio, hi = ratio_with_spread(numerator, denominator)
    band = f"{ratio:.3g} (spread {lo:.3g}..{hi:.3g}, {len(numerator)} and {len(denominator)} samples)"
    expected = f"{low:.3g}..{high:.3g}" if math.isfinite(high) else f">= {low:.3g}"
    reason = f" {why}" if why else ""
    if low <= ratio <= high:
        return checkpoint(True, f"{name} = {band}, in the expected range {expected}.{reason}", "")
    noisy = lo <= high and hi >= low
    return checkpoint(False, "", f"{name} = {band}, outside the expected range {expected}"
                      + (" (though its spread reaches into it: repeat the measurement)" if noisy else "")
                      + f".{reason}", measured=True)  # timings: the hardware decides, never stop a participant


# A measurement within this factor of the prediction, either way, is "close to your prediction".
CLOSE_FACTOR = 1.25


def compare_prediction(name: str, predicted: float | None, measured: float, unit: str = "") -> float | None:
    """Print the prediction beside the measurement and return measured / predicted (``None`` when no
    prediction was written). Never fails: a surprise is what the cell is for.

    A ratio (``unit="x"``: a speed-up, a slow-down) is read against 1: a prediction on the other side
    of 1 than the measurement (a speed-up predicted, a slow-down measured) is called out as such,
    however close the two numbers are."""
    shown = f" {unit}" if unit else ""
    if predicted is None or (isinstance(predicted, float) and math.isnan(predicted)):
        print(f"{name}: measured {measured:.4g}{shown}; no prediction was written (write one before you measure)")
        return None
    ratio = measured / predicted if predicted else math.inf
    if unit == "x" and (predicted - 1.0) * (measured - 1.0) < 0:
        verdict = (f"the opposite of your prediction: you expected {'more' if predicted > 1 else 'less'} than 1x, "
                   f"it measured {'more' if measured > 1 else 'less'}")
    elif ratio == 0:
        verdict = "nothing measured where you predicted some"
    else:
        verdict = ("close to your prediction" if 1 / CLOSE_FACTOR <= ratio <= CLOSE_FACTOR else
                   f"{ratio:.2f}x your prediction" if ratio > 1 else f"{1 / ratio:.2f}x below your prediction")
    print(f"{name}: predicted {predicted:.4g}{shown}, measured {measured:.4g}{shown}: {verdict}")
    return ratio
