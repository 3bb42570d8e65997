"""Why each of SDPA's GPU backends can or cannot run given tensors, in PyTorch's own words, one backend
at a time.

PyTorch asks each backend in turn: ``torch.backends.cuda.can_use_cudnn_attention``,
``can_use_flash_attention`` and ``can_use_efficient_attention`` take the call's parameters
(``torch.backends.cuda.SDPAParams``) and, with ``debug=True``, give the reason of the first condition
the backend fails. They give it as a C++ warning, which these functions (unlike an operator) do not
turn into a Python warning: it goes to the process's standard error as a log line,
``[W1127 03:57:51.333166426 sdp_utils.cpp:588] Warning: <reason> (function <check>)``, which a
notebook does not show. :func:`capture_native_warnings` reads that file descriptor (and Python's
warnings, where a version routes them there, with their ``(Triggered internally at ...)`` suffix)
around one check, so that every reason is attributed to the backend that gave it.

A forced backend that fails (``sdpa_kernel(...)``) gives no better answer: the dispatcher then prints a
header per backend ("Memory efficient kernel not used because:") and every backend's reasons in one
stream, which is why the checks are asked here one by one.

- :func:`backend_verdicts`: a :class:`BackendVerdict` for cuDNN, flash, memory-efficient and math;
  on a CPU it says that the first three are GPU backends and asks nothing;
- :func:`verdicts_from_checks`: the same from given check functions (PyTorch's by default);
- :func:`parse_debug_output`, :func:`clean_message`: PyTorch's warning text to reasons.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

# The backends in the order recent PyTorch versions try them on an H100/H200, with their check's name.
BACKENDS: tuple[str, ...] = ("cudnn", "flash", "efficient", "math")
LABELS: dict[str, str] = {"cudnn": "cuDNN", "flash": "flash", "efficient": "memory-efficient", "math": "math"}
CHECKS: dict[str, str] = {"cudnn": "can_use_cudnn_attention", "flash": "can_use_flash_attention",
                          "efficient": "can_use_efficient_attention"}
CPU_NOTE = ("cuDNN, flash and memory-efficient attention are GPU backends (CUDA; on ROCm flash and memory-efficient "
            "only): on a CPU, SDPA chooses between its own fused CPU kernel and the math path, so there is no GPU "
            "backend to ask")

# A C++ warning as PyTorch's logger writes it: "[W1127 03:57:51.333166426 file.cpp:588] Warning: " (older
# versions "[W file.cpp:588] ", glog builds "W1127 03:57:51.333166 1234 file.cpp:588] ").
_LOG_PREFIX = re.compile(r"^\[?W(?:\d{4}\s|\s)[^\]\n]*\]\s*(?:Warning:\s*)?")
_FUNCTION_SUFFIX = re.compile(r"\s*\(function [^()]*\)\s*$")
_TRIGGERED_SUFFIX = re.compile(r"\s*\(Triggered internally at [^()]*\)\.?\s*$")


def clean_message(text: str) -> str:
    """One warning's reason: PyTorch's log prefix, its ``(function ...)`` and its ``(Triggered internally
    at ...)`` suffixes removed, whitespace folded."""
    text = _LOG_PREFIX.sub("", text.strip())
    for _ in range(2):  # either suffix may come last
        text = _FUNCTION_SUFFIX.sub("", text)
        text = _TRIGGERED_SUFFIX.sub("", text)
    return " ".join(text.split())


def _is_header(reason: str) -> bool:
    """The dispatcher's "<backend> kernel not used because:" line, which carries no reason of its own."""
    return not reason or reason.endswith("because:")


def parse_debug_output(text: str) -> list[str]:
    """The reasons in captured standard error: one per logged warning (a line that does not start a
    new warning continues the one before), cleaned, headers dropped, each reason once. Lines before
    the first warning are kept as reasons of their own only when no warning was logged."""
    messages: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if _LOG_PREFIX.match(line) or not messages:
            messages.append(line)
        else:
            messages[-1] += " " + line.strip()
    reasons = [clean_message(m) for m in messages]
    return list(dict.fromkeys(r for r in reasons if not _is_header(r)))


def capture_native_warnings(fn: Callable[[], Any]) -> tuple[Any, list[str]]:
    """``(fn(), reasons)``: what ``fn`` warned, through Python's warnings or as C++ log lines on the
    process's standard error (file descriptor 2, redirected to a temporary file while ``fn`` runs)."""
    for stream in (sys.stdout, sys.stderr, sys.__stderr__):
        if stream is not None:
            stream.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        os.dup2(sink.fileno(), 2)
        try:
            result = fn()
        finally:
            if sys.__stderr__ is not None:
                sys.__stderr__.flush()
            os.dup2(saved, 2)
            os.close(saved)
        sink.seek(0)
        logged = sink.read().decode("utf-8", errors="replace")
    said = [clean_message(str(w.message)) for w in caught]
    reasons = [r for r in said if not _is_header(r)] + parse_debug_output(logged)
    return result, list(dict.fromkeys(reasons))


@dataclass(frozen=True)
class BackendVerdict:
    """One SDPA backend for one call: ``usable`` True (PyTorch's check passes), False (it refuses, for
    ``reasons``) or None (not asked: a CPU, or a torch without the check; ``reasons`` says why)."""

    backend: str
    usable: bool | None
    reasons: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return LABELS.get(self.backend, self.backend)

    def describe(self) -> str:
        """``"<backend>: can run these inputs"`` or ``"<backend>: refused: <PyTorch's reason>"``."""
        if self.usable:
            return f"{self.label}: can run these inputs"
        said = "; ".join(self.reasons) or "PyTorch gave no reason"
        return f"{self.label}: {'refused: ' if self.usable is False else ''}{said}"


def sdpa_params(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> Any:
    """``torch.backends.cuda.SDPAParams`` for a call of :func:`~tinyllama.profiling.attention.sdpa` (no
    mask, no dropout; ``enable_gqa`` when key/value have fewer heads). Torch < 2.5 has no ``enable_gqa``:
    there the key/value heads are repeated, as ``sdpa`` does."""
    gqa = q.shape[1] != k.shape[1]
    try:
        return torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, causal, gqa)
    except TypeError:  # torch < 2.5: six arguments, no grouped-query heads
        if gqa:
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        return torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, causal)


def _torch_checks() -> dict[str, Callable[[Any, bool], bool] | None]:
    return {name: getattr(torch.backends.cuda, check, None) for name, check in CHECKS.items()}


def _math_verdict() -> BackendVerdict:
    if torch.backends.cuda.math_sdp_enabled():
        return BackendVerdict("math", True)
    return BackendVerdict("math", False, ("the math path is disabled (torch.backends.cuda.enable_math_sdp(False) "
                                          "or an sdpa_kernel context without MATH)",))


def verdicts_from_checks(params: Any, checks: Mapping[str, Callable[[Any, bool], bool] | None] | None = None,
                         ) -> list[BackendVerdict]:
    """A verdict per backend (:data:`BACKENDS`), each from its own check called alone with ``debug=True``
    (``checks``: backend name -> function of ``(params, debug)``, PyTorch's by default; None where this
    torch has no such check). Each check's warnings are captured apart, so a reason is never another
    backend's; a check that raises is reported with its error's first line."""
    checks = _torch_checks() if checks is None else dict(checks)
    verdicts = []
    for name in BACKENDS:
        if name == "math":
            verdicts.append(_math_verdict())
            continue
        check = checks.get(name)
        if check is None:
            verdicts.append(BackendVerdict(name, None, (
                f"this torch ({torch.__version__}) has no torch.backends.cuda.{CHECKS[name]} to ask",)))
            continue
        try:
            usable, reasons = capture_native_warnings(lambda: bool(check(params, True)))
        except (RuntimeError, TypeError) as error:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            verdicts.append(BackendVerdict(name, None, (f"PyTorch's check failed: {first}",)))
            continue
        verdicts.append(BackendVerdict(name, usable, () if usable else tuple(reasons)))
    return verdicts


def backend_verdicts(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> list[BackendVerdict]:
    """Can cuDNN, flash, memory-efficient attention and the math path run :func:`~tinyllama.profiling.attention.sdpa`
    on these tensors, and if not, why (PyTorch's reason for that backend alone). On a CPU the three fused
    backends are GPU backends: their verdicts say so (:data:`CPU_NOTE`) and PyTorch is not asked."""
    if q.device.type != "cuda":  # ROCm GPUs are "cuda" devices too
        return [BackendVerdict(name, None, (f"a GPU backend, not available on {q.device.type}",)) if name != "math"
                else _math_verdict() for name in BACKENDS]
    return verdicts_from_checks(sdpa_params(q, k, v, causal))


__all__ = ["BACKENDS", "CPU_NOTE", "BackendVerdict", "backend_verdicts", "capture_native_warnings", "clean_message",
           "parse_debug_output", "sdpa_params", "verdicts_from_checks"]
