"""Checks of notebook 16's exercises (SDPA and ``torch.compile``), with feedback that names the
likely mistake:

- :func:`check_operator_fates`: a prediction of what compilation does to each of a few ATen operators
  (``gone``, ``fewer``, ``same``) against the calls per step the profiler counted, eager and compiled;
- :func:`check_backend_reader`: a function that names the SDPA backend from the operator and kernel
  names of a profile, on the names each backend leaves and on the notebook's own profile;
- :func:`check_break_even`: a function for the steps after which a compile pays for itself (notebook 06's
  exercise 06.2; notebook 16's 16.3 is checked on the same cases by
  :func:`tinyllama.course.compile_mode_checks.check_break_even_steps`). The typical mistakes of both
  exercises live here, in one list (:data:`BREAK_EVEN_SLIPS`, named by :func:`name_break_even_slip`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

from tinyllama.course.checkpoints import checkpoint
from tinyllama.course.diagnosis import Case, check_cases
from tinyllama.course.feedback import NumberSlip
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


# The typical wrong break-even functions of exercises 06.2 and 16.3 (one list for both notebooks), each with
# what it gets wrong. A slip is named when the participant's function answers every case of BREAK_EVEN_CASES
# as it does (raising included); BREAK_EVEN_CASES separate every slip from the answer and from each other.
BREAK_EVEN_SLIPS: tuple[NumberSlip, ...] = (
    NumberSlip("milliseconds", lambda c, e, k: c / (e - k) if e > k else math.inf,
                  "gives 1000 times too few steps: the compile is in seconds and the saving per step in milliseconds; "
                  "turn eager_ms - compiled_ms into seconds before dividing"),
    NumberSlip("milliseconds twice", lambda c, e, k: c * 1e3 / _saved_s(e, k) if e > k else math.inf,
                  "gives 1000 times too many steps: the compile time was turned into milliseconds while the saving "
                  "is already in seconds; convert only one of the two"),
    NumberSlip("upside down", lambda c, e, k: _saved_s(e, k) / c if e > k else math.inf,
                  "is upside down: it divides the time a step saves by the compile time; the steps are the compile "
                  "time over the time each step saves"),
    NumberSlip("negative", lambda c, e, k: c / _saved_s(e, k) if e != k else math.inf,
                  "returns a negative number of steps where the compiled step is slower: a step that saves nothing "
                  "or loses time never pays back the compile, so return math.inf whenever eager_ms - compiled_ms <= 0, "
                  "not only when they are equal"),
    NumberSlip("no guard", lambda c, e, k: c / _saved_s(e, k),
                  "divides by zero where the two steps take equal times (and gives a negative count where the compiled "
                  "step is slower): return math.inf when the compiled step saves nothing"),
    NumberSlip("guard >= 0", lambda c, e, k: c / _saved_s(e, k) if e >= k else math.inf,
                  "divides by zero where the compiled step is exactly as fast as the eager one: a step that saves "
                  "nothing never pays, so return math.inf whenever the saving is not positive (> 0, not >= 0)"),
    NumberSlip("compiled - eager", lambda c, e, k: c / ((k - e) / 1e3) if k > e else math.inf,
                  "takes the saving as compiled - eager: a step saves eager_ms - compiled_ms, which is positive when "
                  "the compiled step is faster"),
    NumberSlip("speed-up", lambda c, e, k: c / (e / k),
                  "divides by the speed-up eager / compiled: a ratio is not a saving; divide the compile time by the "
                  "time each step saves, eager_ms - compiled_ms, in seconds"),
    NumberSlip("eager steps in the compile", lambda c, e, k: c / (e / 1e3),
                  "counts the eager steps that fit into the compile time; the compile pays for itself through what "
                  "each compiled step saves (eager_ms - compiled_ms), not through the whole step"),
    NumberSlip("compiled steps in the compile", lambda c, e, k: c / (k / 1e3),
                  "counts the compiled steps that fit into the compile time; the compile pays for itself through what "
                  "each compiled step saves (eager_ms - compiled_ms), not through the whole step"),
)

# The catch-all, tried after every slip of BREAK_EVEN_SLIPS: right wherever the compiled step is faster,
# wrong (not negative) where it saves nothing.
NEVER_PAYS = ("is right where the compiled step is faster, but where it saves nothing it returns {answer}: a compile "
              "that saves nothing never pays for itself, so return math.inf there (not 0, None or -1)")


def outcome(fn: Callable[..., Any], args: tuple[float, float, float]) -> Any:
    """``fn(*args)``, or the type of the exception it raised (a slip may divide by zero as the answer does)."""
    try:
        return fn(*args)
    except NotImplementedError:  # an exercise not written yet: its own message says what to do
        raise
    except Exception as error:  # noqa: BLE001 - a participant's answer may raise anything: compared by type
        return type(error)


def same_outcome(answer: Any, expected: Any) -> bool:
    """Two outcomes agree: the same exception type, both infinite of one sign, or numbers within 1e-6."""
    if isinstance(expected, type) or isinstance(answer, type):
        return answer is expected
    if isinstance(answer, bool) or not isinstance(answer, (int, float)) or not isinstance(expected, (int, float)):
        try:
            answer = float(answer)  # a NumPy or 0-d tensor answer
        except (TypeError, ValueError):
            return False
    if math.isinf(expected) or math.isinf(answer):
        return answer == expected
    return math.isclose(answer, expected, rel_tol=1e-6, abs_tol=1e-9)


def name_break_even_slip(candidate: Callable[[float, float, float], Any],
                         cases: Sequence[tuple[float, float, float]] = BREAK_EVEN_CASES) -> str | None:
    """What is wrong with ``candidate`` on ``cases``, in words that complete "break_even ...", when it
    reproduces a slip of :data:`BREAK_EVEN_SLIPS`, else when it is right only where the compiled step is
    faster (:data:`NEVER_PAYS`, after every named slip); ``None`` when it is right on every case or wrong
    in a way no slip explains. Used by the checks of exercises 06.2 and 16.3."""
    answers = [outcome(candidate, case) for case in cases]
    expected = [break_even_steps(*case) for case in cases]
    if all(same_outcome(a, e) for a, e in zip(answers, expected)):
        return None
    for slip in BREAK_EVEN_SLIPS:
        if all(same_outcome(a, outcome(slip.value, case)) for a, case in zip(answers, cases)):
            return slip.message
    faster = [math.isfinite(e) for e in expected]
    if all(same_outcome(a, e) for a, e, f in zip(answers, expected, faster) if f):
        wrong = next(a for a, e, f in zip(answers, expected, faster) if not f and not same_outcome(a, e))
        return NEVER_PAYS.format(answer=wrong.__name__ if isinstance(wrong, type) else repr(wrong))
    return None


def check_break_even(candidate: Callable[[float, float, float], float]) -> bool:
    """``candidate(compile_s, eager_ms, compiled_ms)`` gives the steps after which the compile has paid
    for itself, ``math.inf`` when the compiled step is not faster (units: seconds and milliseconds). A
    wrong function is compared with the typical mistakes (:func:`name_break_even_slip`) on the same cases and
    the one it reproduces is named (exercise 06.2)."""
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
    named = name_break_even_slip(candidate)
    hint = f"Your break_even {named}." if named is not None else (
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


__all__ = ["BACKEND_CASES", "BREAK_EVEN_CASES", "BREAK_EVEN_SLIPS", "FATES", "NEVER_PAYS",
           "check_backend_reader", "check_break_even", "check_operator_fates", "describe_break_even", "format_duration",
           "name_break_even_slip", "outcome", "same_outcome"]
