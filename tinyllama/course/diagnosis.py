"""Checks for diagnosis exercises: a participant's verdict function judged on labelled cases, and the
memory layout a participant's function produces.

- :func:`check_cases` runs a function on a list of :class:`Case` s (arguments, the right answer and
  why it is right) and passes only when every case is answered right; the feedback names each case
  it got wrong, what it returned, what was expected and the reason. Use it for a detector ("is this
  run's initialisation broken?") tried on real runs and on made-up edge cases (NaN, a near miss).
- :func:`check_layout` runs a function on fresh inputs and passes only when every tensor it returns
  has a contiguous last dimension (stride 1: what a row kernel reads in place) and no copy operator
  (``aten::clone``, ``aten::copy_``, ...) ran inside it: a ``.contiguous()`` at the end makes the
  layout right by moving the copy, not by removing it.

Both print ``PASS``/``CHECK`` through :func:`~tinyllama.course.checkpoints.checkpoint` and fail the
notebook under ``WORKSHOP_STRICT=1``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tinyllama.course.checkpoints import checkpoint
from tinyllama.profiling.operators import OperatorCalls

COPY_OPERATOR = re.compile(r"clone|copy")


@dataclass
class Case:
    """One labelled case: ``candidate(*args)`` should give ``expected``, for the reason ``why``.

    ``expected`` is a value compared with ``==``, or a predicate (a callable taking the candidate's
    answer and returning ``True`` when it is right); ``expected_text`` then says in words what it wants.
    """

    label: str
    args: tuple[Any, ...]
    expected: Any
    why: str
    expected_text: str = ""

    def judge(self, answer: Any) -> bool:
        if callable(self.expected):
            return bool(self.expected(answer))
        return bool(answer == self.expected)

    def wanted(self) -> str:
        return self.expected_text or repr(self.expected)


def _short(value: Any, width: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def check_cases(name: str, candidate: Callable[..., Any], cases: Sequence[Case], hint: str = "") -> bool:
    """``candidate(*case.args)`` is right for every case; the feedback lists each wrong case with what
    the candidate answered, what was expected and why. A case whose call raises counts as wrong."""
    wrong: list[str] = []
    for case in cases:
        try:
            answer = candidate(*case.args)
        except NotImplementedError:  # an exercise not written yet: its own message says what to do
            raise
        except Exception as error:  # the participant's code failed on this case: say which, keep it short
            wrong.append(f"{case.label}: raised {type(error).__name__}: {error}")
            continue
        if not case.judge(answer):
            wrong.append(f"{case.label}: returned {_short(answer)}, expected {case.wanted()} ({case.why})")
    message = (f"{name} is wrong on {len(wrong)} of {len(cases)} cases:\n  - " + "\n  - ".join(wrong)
               + (f"\n  {hint}" if hint else ""))
    return checkpoint(not wrong, f"{name} is right on all {len(cases)} cases", message)


def copy_operators(fn: Callable[[], Any]) -> dict[str, int]:
    """ATen operators that copy data (``aten::clone``, ``aten::copy_``, ``aten::_reshape_copy``...) run
    by ``fn()``, with their number of calls. Views (transpose, a ``view`` that fits) copy nothing."""
    with OperatorCalls() as recorder:
        fn()
    copies: dict[str, int] = {}
    for name in recorder.names:
        if COPY_OPERATOR.search(name):
            copies[name] = copies.get(name, 0) + 1
    return copies


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def check_layout(name: str, fn: Callable[..., Any], make_inputs: Callable[[tuple[int, ...]], Sequence[Any]],
                 shapes: Iterable[tuple[int, ...]], seed: int | None = None, hint: str = "") -> bool:
    """For every shape, ``fn(*make_inputs(shape))`` returns tensors whose last dimension has stride 1
    and runs no copy operator (see :func:`copy_operators`). The values are not compared: check them
    with :func:`tinyllama.course.check_function`."""
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    problems: list[str] = []
    shapes = [tuple(shape) for shape in shapes]
    for shape in shapes:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            inputs = tuple(make_inputs(shape))
        outputs: list[Any] = []
        try:
            copies = copy_operators(lambda: outputs.append(fn(*inputs)))
        except NotImplementedError:
            raise
        except Exception as error:  # the participant's code failed: say where
            problems.append(f"shape {shape}: {type(error).__name__}: {error}")
            continue
        for number, out in enumerate(_tensors(outputs[0])):
            label = f"shape {shape}" + (f", output {number}" if len(_tensors(outputs[0])) > 1 else "")
            if out.dim() and out.shape[-1] > 1 and out.stride(-1) != 1:
                problems.append(f"{label}: the result has strides {tuple(out.stride())} for shape {tuple(out.shape)}: "
                                f"its last dimension is strided by {out.stride(-1)} elements, so a kernel that reads "
                                "rows must copy it first (a transposed view?)")
        if copies:
            listed = ", ".join(f"{op} x{calls}" for op, calls in sorted(copies.items()))
            problems.append(f"shape {shape}: the function copies data ({listed}): the layout is right only because "
                            "the copy moved into your function (a .contiguous(), or a reshape of a transposed view?)")
    shown = ", ".join(str(s) for s in shapes)
    message = (f"{name} does not give the layout the kernels read on {len(problems)} check(s) (seed {seed}):\n  - "
               + "\n  - ".join(problems) + (f"\n  {hint}" if hint else ""))
    return checkpoint(not problems, f"{name} returns a contiguous last dimension without copying, for shapes {shown}",
                      message)
