"""Checks of notebook 16's exercises (SDPA and ``torch.compile``), with feedback that names the
likely mistake:

- :func:`check_operator_fates`: a prediction of what compilation does to each of a few ATen operators
  (``gone``, ``fewer``, ``same``) against the calls per step the profiler counted, eager and compiled;
- :func:`check_backend_reader`: a function that names the SDPA backend from the operator and kernel
  names of a profile, on the names each backend leaves and on the notebook's own profile;
- :func:`check_break_even`: a function for the steps after which a compile pays for itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

from tinyllama.course.checkpoints import checkpoint
from tinyllama.course.diagnosis import Case, check_cases
from tinyllama.profiling.attention import backend_from_operators
from tinyllama.profiling.compiled import break_even_steps, fate

FATES = ("gone", "fewer", "same", "more")
_GEMMS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm"}


def _why(op: str, measured: str) -> str:
    """Why an operator met its fate under regional compilation of the decoder blocks."""
    if measured == "same" and op in _GEMMS:
        return ("matrix multiplies stay calls to the vendor's GEMM library (extern kernels in Inductor's code): "
                "Inductor fuses the element-wise work around them, not into them")
    if measured == "same" and "scaled_dot_product" in op:
        return "attention stays one library kernel: the compiled graph calls the backend's operator directly"
    if measured == "gone" and op == "aten::scaled_dot_product_attention":
        return ("this is the dispatcher that picks a backend; the compiled graph calls the chosen backend's "
                "operator directly, so the wrapper disappears while the backend's operator stays")
    if measured == "same":
        return ("this operator runs only outside the compiled blocks: V4 compiles each decoder block, while the "
                "embedding, final norm, output head, loss and optimizer stay eager")
    if measured == "fewer":
        return ("its calls inside the blocks were fused into generated kernels; the calls left come from the parts "
                "that stay eager (final norm, output head, loss, optimizer)")
    if measured == "gone":
        return "every call was inside the compiled blocks, where Inductor fused it into a generated kernel"
    return "the compiled step calls it more often than the eager one: look at the generated code's library calls"


def check_operator_fates(predicted: Mapping[str, str], eager: pd.Series, compiled: pd.Series,
                         required: Sequence[str] = ()) -> bool:
    """Each ``predicted[op]`` (``gone``, ``fewer``, ``same`` or ``more``) against the fate the profiler
    measured between ``eager`` and ``compiled`` calls per step (:func:`~tinyllama.profiling.compiled.operator_calls`).
    Every operator in ``required`` must be predicted. Passes when every prediction is right."""
    problems, lines = [], []
    missing = [op for op in required if op not in predicted or predicted[op] is None]
    if missing:
        problems.append(f"write a prediction for {', '.join(missing)}")
    for op, guess in predicted.items():
        if guess is None:
            continue
        if guess not in FATES:
            problems.append(f"{op}: {guess!r} is not one of {', '.join(FATES)}")
            continue
        before, after = float(eager.get(op, 0.0)), float(compiled.get(op, 0.0))
        if before == 0:
            problems.append(f"{op}: not called in the eager step at all; pick operators from the eager table")
            continue
        measured = fate(before, after)
        line = f"{op}: {before:g} -> {after:g} calls per step, {measured}; you predicted {guess}"
        if guess != measured:
            problems.append(f"{line}. Why: {_why(op, measured)}")
        else:
            lines.append(f"{line}. {_why(op, measured)}")
    passed = "your predictions match the profiler:\n  - " + "\n  - ".join(lines)
    failed = (f"{len(problems)} prediction(s) differ from the profiler:\n  - " + "\n  - ".join(problems)
              + ("\n  right:\n  - " + "\n  - ".join(lines) if lines else ""))
    return checkpoint(not problems, passed, failed)


# Names a profile shows for each backend (operators, then kernels as NVIDIA, AMD or the CPU name them).
BACKEND_CASES: tuple[tuple[str, list[str], str], ...] = (
    ("cuDNN on an H100/H200",
     ["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_cudnn_attention",
      "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128"], "cuDNN"),
    ("FlashAttention-2 (NVIDIA)",
     ["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
      "aten::_flash_attention_forward", "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>"], "flash"),
    ("memory-efficient (xFormers' CUTLASS kernel)",
     ["aten::_scaled_dot_product_efficient_attention", "aten::_efficient_attention_forward",
      "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)"], "memory-efficient"),
    ("flash on AMD (AOTriton)", ["aten::_scaled_dot_product_flash_attention", "attn_fwd"], "flash"),
    ("the CPU's flash kernel",
     ["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"], "flash (CPU)"),
    ("the math path",
     ["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_attention_math", "aten::bmm", "aten::_softmax"],
     "math"),
    ("its backward",
     ["aten::_scaled_dot_product_flash_attention_backward", "aten::_flash_attention_backward",
      "aten::_scaled_dot_product_flash_attention"], "flash"),
)


def check_backend_reader(reader: Callable[[list[str]], str], profile_names: Sequence[str]) -> bool:
    """``reader(names)`` names the SDPA backend (as :data:`~tinyllama.profiling.attention.BACKEND_OPERATORS`
    spells it: ``cuDNN``, ``flash``, ``memory-efficient``, ``flash (CPU)``, ``math``) for the names each
    backend leaves in a profile, and for ``profile_names``, the notebook's own profile."""
    cases = [Case(label, (names,), expected, f"its operator is {next(n for n in names if '_scaled_dot' in n)}")
             for label, names, expected in BACKEND_CASES]
    measured, operator = backend_from_operators(list(profile_names))
    cases.append(Case("your own profile", (list(profile_names),), measured,
                      f"the profile holds {operator}"))
    return check_cases("read_backend", reader, cases,
                       hint="Read the backend's own operator (aten::_scaled_dot_product_<backend>...), most specific "
                            "name first: a cuDNN kernel's name contains 'flash', and the CPU's operator starts like "
                            "the GPU flash operator.")


BREAK_EVEN_CASES: tuple[tuple[float, float, float], ...] = ((30.0, 50.0, 25.0), (12.0, 2.5, 2.0), (0.0, 10.0, 5.0),
                                                            (40.0, 20.0, 25.0), (5.0, 8.0, 8.0))


def _saved_s(eager_ms: float, compiled_ms: float) -> float:
    return (eager_ms - compiled_ms) / 1e3


# Typical wrong break-even functions (exercises 06.2 and 16.3) beyond those of
# :data:`tinyllama.course.compile_mode_checks.BREAK_EVEN_SLIPS` (milliseconds, upside down, negative, no guard,
# whole steps, never pays), each with what it gets wrong. A slip is named when the participant's function
# answers every case of BREAK_EVEN_CASES as it does (raising included).
BREAK_EVEN_SLIPS: tuple[tuple[Callable[[float, float, float], float], str], ...] = (
    (lambda c, e, k: c * 1e3 / _saved_s(e, k) if e > k else math.inf,
     ("Your break_even gives 1000 times too many steps: the compile time was turned into milliseconds while the "
     "saving is already in seconds; convert only one of the two.")),
    (lambda c, e, k: c / _saved_s(e, k) if e >= k else math.inf,
     ("Your break_even divides by zero where the compiled step is exactly as fast as the eager one: a step that "
     "saves nothing never pays, so return math.inf whenever the saving is not positive (> 0, not >= 0).")),
    (lambda c, e, k: c / ((k - e) / 1e3) if k > e else math.inf,
     ("Your break_even takes the saving as compiled - eager: a step saves eager_ms - compiled_ms, which is "
     "positive when the compiled step is faster.")),
    (lambda c, e, k: c / (e / k),
     ("Your break_even divides by the speed-up eager / compiled: a ratio is not a saving; divide the compile time "
     "by the time each step saves, eager_ms - compiled_ms, in seconds.")),
)


def _answers(function: Callable[..., Any], cases: Sequence[tuple[float, ...]]) -> list[Any]:
    """``function(*case)`` for each case, or the type of the exception it raised."""
    out: list[Any] = []
    for case in cases:
        try:
            out.append(function(*case))
        except NotImplementedError:
            raise
        except Exception as error:  # noqa: BLE001 - a raise is an answer the slips can share
            out.append(type(error))
    return out


def _same_answer(a: Any, b: Any) -> bool:
    if isinstance(a, type) or isinstance(b, type):
        return a is b
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        return False
    return a == b or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def break_even_slip(candidate: Callable[[float, float, float], float]) -> str | None:
    """What is wrong with ``candidate`` when it answers every case of :data:`BREAK_EVEN_CASES` as a typical
    mistake does: those of :func:`tinyllama.course.compile_mode_checks.name_break_even_slip` first, then
    :data:`BREAK_EVEN_SLIPS`; ``None`` when it is right or wrong in no typical way."""
    from tinyllama.course.compile_mode_checks import (  # it imports this module
        NEVER_PAYS,
        name_break_even_slip,
    )

    named = name_break_even_slip(candidate, BREAK_EVEN_CASES)
    # Its catch-all ("right where faster, wrong where it saves nothing") comes after the exact slips of both lists.
    catch_all = named is not None and named.startswith(NEVER_PAYS.split("{answer}")[0])
    if named is not None and not catch_all:
        return f"Your break_even {named}."
    yours = _answers(candidate, BREAK_EVEN_CASES)
    if all(_same_answer(a, b) for a, b in zip(yours, _answers(break_even_steps, BREAK_EVEN_CASES))):
        return None
    for slip, text in BREAK_EVEN_SLIPS:
        if all(_same_answer(a, b) for a, b in zip(yours, _answers(slip, BREAK_EVEN_CASES))):
            return text
    return f"Your break_even {named}." if named is not None else None


def check_break_even(candidate: Callable[[float, float, float], float]) -> bool:
    """``candidate(compile_s, eager_ms, compiled_ms)`` gives the steps after which the compile has paid
    for itself, ``math.inf`` when the compiled step is not faster (units: seconds and milliseconds). A
    wrong function is compared with the typical mistakes (:func:`break_even_slip`) on the same cases and
    the one it reproduces is named."""
    cases = []
    for compile_s, eager_ms, compiled_ms in BREAK_EVEN_CASES:
        expected = break_even_steps(compile_s, eager_ms, compiled_ms)
        label = f"compile {compile_s:g} s, eager {eager_ms:g} ms, compiled {compiled_ms:g} ms"
        if math.isinf(expected):
            cases.append(Case(label, (compile_s, eager_ms, compiled_ms), lambda a: a == math.inf,
                              "a compiled step that is not faster never pays back its compile", "math.inf"))
        else:
            cases.append(Case(label, (compile_s, eager_ms, compiled_ms),
                              lambda a, e=expected: isinstance(a, (int, float)) and math.isclose(a, e, rel_tol=1e-6,
                                                                                                abs_tol=1e-9),
                              "the compile time over the time each step saves, both in seconds", f"{expected:g}"))
    hint = break_even_slip(candidate) or (
        "Divide the compile time by the time each step saves, in one unit (seconds and milliseconds differ by "
        "1000), and return math.inf when the compiled step saves nothing.")
    return check_cases("break_even", candidate, cases, hint=hint)


def _three_digits(value: float) -> str:
    """``value`` to three significant digits, without an exponent (``0.723``, ``17.4``, ``1,250``)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


_UNITS: tuple[tuple[float, float, str], ...] = ((1.0, 1e-3, "ms"), (600.0, 1.0, "s"), (7200.0, 60.0, "minutes"),
                                                (math.inf, 3600.0, "hours"))


def format_duration(seconds: float, like: float | None = None) -> str:
    """A duration in the unit that shows its size, to three significant digits: milliseconds under a
    second, seconds under ten minutes, minutes under two hours, else hours. ``like``: pick the unit for
    that duration instead (so that the terms of one sum share a unit)."""
    for value in (seconds, like if like is not None else seconds):
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"a duration must be finite and >= 0 (got {value})")
    scale, unit = next((scale, unit) for limit, scale, unit in _UNITS
                       if (like if like is not None else seconds) < limit)
    return f"{_three_digits(seconds / scale)} {unit}"


def describe_break_even(compile_s: float, eager_ms: float, compiled_ms: float) -> str:
    """A sentence for a measured break-even point, with its arithmetic: the compile's time over what a
    step saves gives the steps, and those steps take as long eagerly as the compile plus the same steps
    compiled (one unit for the three terms, chosen by the largest)."""
    steps = break_even_steps(compile_s, eager_ms, compiled_ms)
    if math.isinf(steps):
        return "the compiled step is not faster here, so the compile never pays for itself"
    eager_s = steps * eager_ms / 1e3
    return (f"the compile pays for itself from step {math.floor(steps) + 1:,} on: {format_duration(compile_s)} of "
            f"compile / {eager_ms - compiled_ms:.2f} ms saved a step = {steps:,.1f} steps, which take "
            f"{format_duration(eager_s)} eager = {format_duration(compile_s, eager_s)} compile + "
            f"{format_duration(steps * compiled_ms / 1e3, eager_s)} compiled")


__all__ = ["BACKEND_CASES", "BREAK_EVEN_CASES", "FATES", "check_backend_reader", "check_break_even",
           "check_operator_fates", "describe_break_even", "format_duration"]
