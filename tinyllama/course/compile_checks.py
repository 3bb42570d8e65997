"""Checks of notebook 16's exercises (SDPA and ``torch.compile``), with feedback that names the
likely mistake:

- :func:`check_operator_fates`: a prediction of what compilation does to each of a few ATen operators
  (``gone``, ``fewer``, ``same``) against the calls per step the profiler counted, eager and compiled;
- :func:`check_backend_reader`: a function that names the SDPA backend from the operator and kernel
  names of a profile, on the names each backend leaves and on the notebook's own profile;
- :func:`describe_break_even` and :func:`format_duration`: the break-even of a measured compile in words
  (the break-even exercise itself, shared with notebook 06, is checked in :mod:`tinyllama.course.break_even_checks`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

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


__all__ = ["BACKEND_CASES", "FATES", "check_backend_reader", "check_operator_fates", "describe_break_even",
           "format_duration"]
