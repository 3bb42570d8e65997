"""What ``torch.compile`` did to a model: the code Inductor generated, what it cost to make, and what
it changed in a step.

- :func:`empty_compile_caches`: a context in which Inductor's and Triton's on-disk caches (compiled
  graphs, generated kernels, their binaries) start empty, so that a compile inside it is *cold*;
- :func:`first_call`: resets Dynamo's in-memory cache, runs a function once (it compiles), times it
  after a synchronize and keeps the code Inductor wrote for each graph (a :class:`FirstCall`);
- :func:`compiled_calls`: the calls a compiled graph makes, in order, read from that code: each
  generated kernel (``triton_poi_fused_add_mul_0``, ``cpp_fused_...`` on a CPU) with the ATen
  operators it fused, and each library call it left in place (``extern_kernels.mm``, the SDPA backend);
- :func:`operator_calls`: ATen operators per step in a profile (to see which ones compilation removed)
  and :func:`fate`: ``gone``, ``fewer``, ``same`` or ``more`` between two counts;
- :func:`launches_per_step`: kernels (and copies) the device ran per step, or on a CPU the host's
  top-level operator calls plus generated kernels;
- :func:`break_even_steps`: after how many steps a compile has paid for itself.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from tinyllama import device as dev
from tinyllama.profiling.torch_profiler import (ProfileRun, has_operator_ancestor, is_device_event, is_fused_kernel,
                                               row_kind)

# Inductor's kernel name prefixes and what kind of kernel each is.
KERNEL_KINDS: tuple[tuple[str, str], ...] = (
    ("triton_poi_", "Triton, point-wise"),
    ("triton_red_", "Triton, reduction"),
    ("triton_per_", "Triton, persistent reduction"),
    ("triton_tem_", "Triton, template (matmul)"),
    ("triton_", "Triton"),
    ("cpp_fused_", "C++ loop (CPU)"),
)
LIBRARY_CALL = "library call"
# A generated kernel's launch in the wrapper: ``triton_poi_fused_add_0.run(...)`` on a GPU,
# ``cpp_fused_add_0(...)`` on a CPU; a library call: ``extern_kernels.mm(...)`` or ``torch.ops.aten.X.default(...)``.
_KERNEL_CALL = re.compile(r"^\s*(?:\w+\s*=\s*)?((?:triton|cpp)_\w+?)(?:\.run)?\(")
_EXTERN_CALL = re.compile(r"^\s*(?:\w+\s*=\s*)?(?:extern_kernels\.(\w+)|torch\.ops\.aten\.(\w+)\.\w+)\(")
_ORIGINAL_ATEN = re.compile(r"Original ATen: \[([^\]]*)\]")


@contextlib.contextmanager
def empty_compile_caches() -> Iterator[None]:
    """Inside: Inductor's cache folder (compiled graphs, generated code, AOTAutograd's cache) and
    Triton's (kernel binaries) are a fresh temporary folder, deleted on exit, and the in-memory
    caches of generated code are cleared. A compile here pays for everything, as in a fresh
    environment; outside, the default folders (``/tmp/torchinductor_$USER``, ``~/.triton``) are warm
    after any earlier run."""
    from torch._inductor import utils

    fresh = getattr(utils, "fresh_cache", None) or utils.fresh_inductor_cache  # renamed in torch 2.8
    with fresh():
        yield


@dataclass
class FirstCall:
    """The first call of a function after Dynamo's cache was reset: ``seconds`` from the call to the
    device's last kernel (tracing, code generation, kernel compilation and one run), ``code``: the
    Python module Inductor generated for each graph it compiled (or loaded from its cache)."""

    seconds: float
    code: list[str] = field(default_factory=list)

    def compile_seconds(self, steady_ms: float) -> float:
        """The compile's share of the first call: its time minus one steady call of ``steady_ms``."""
        return max(self.seconds - steady_ms / 1e3, 0.0)


def first_call(fn: Callable[[], Any], device: torch.device | str | None = None) -> FirstCall:
    """Reset Dynamo (forgetting every compiled graph, so that the next call compiles again), call
    ``fn()`` once, synchronize, and return its time with the code Inductor wrote.

    The C++ kernels of a CPU compile are generated with profiler ranges of their own names
    (``cpp.enable_kernel_profile``), so that they show in a profile as a GPU's kernels do.
    """
    from unittest import mock

    from torch._inductor import config as inductor_config
    from torch._inductor.graph import GraphLowering

    codes: list[str] = []
    torch._dynamo.reset()
    device = dev.get_device(None if device is None else str(device))
    dev.synchronize(device)
    with mock.patch.object(GraphLowering, "save_output_code", codes.append, create=True), \
            inductor_config.patch({"cpp.enable_kernel_profile": True}):
        began = time.perf_counter()
        fn()
        dev.synchronize(device)
        seconds = time.perf_counter() - began
    return FirstCall(seconds, list(dict.fromkeys(codes)))


@dataclass(frozen=True)
class CompiledCall:
    """One call a compiled graph makes: a kernel Inductor generated (``kind`` from its name) or a
    library call it kept (``kind == "library call"``), with the ATen operators it stands for."""

    graph: str
    position: int
    name: str
    kind: str
    aten_ops: tuple[str, ...]


def _kind(name: str) -> str:
    return next(kind for prefix, kind in KERNEL_KINDS if name.startswith(prefix))


def _ops_from_name(name: str) -> tuple[str, ...]:
    """ATen operators in a generated kernel's name (``cpp_fused__unsafe_view_add_0`` -> _unsafe_view,
    add), matched longest first against ``torch.ops.aten`` (Inductor names a kernel after at most ten)."""
    body = re.sub(r"^(?:triton_(?:poi|red|per|tem|for|mix)_|cpp_)fused_?", "", name)
    body = re.sub(r"_\d+$", "", body)
    tokens, ops, i = body.split("_"), [], 0
    while i < len(tokens):
        for j in range(len(tokens), i, -1):
            candidate = "_".join(tokens[i:j])
            if candidate.strip("_") and hasattr(torch.ops.aten, candidate):
                ops.append(candidate)
                i = j
                break
        else:
            i += 1
    return tuple(ops)


def _definition_ops(code: str) -> dict[str, tuple[str, ...]]:
    """Kernel name -> the ATen operators of the comment Inductor writes above its definition."""
    found: dict[str, tuple[str, ...]] = {}
    comment: tuple[str, ...] | None = None
    for line in code.splitlines():
        match = _ORIGINAL_ATEN.search(line)
        if match and line.lstrip().startswith("#"):
            comment = tuple(op.strip().removeprefix("aten.") for op in match.group(1).split(",") if op.strip())
            continue
        definition = re.match(r"^((?:triton|cpp)_\w+) = async_compile\.", line)
        if definition and comment is not None:
            found[definition.group(1)] = comment
        if line.strip() and not line.lstrip().startswith("#"):
            comment = None
    return found


def compiled_calls(code: str, graph: str = "graph") -> list[CompiledCall]:
    """The calls in the ``call`` function of one module Inductor generated, in order: generated
    kernels (with the ATen operators they fused, from Inductor's comment or the kernel's name) and
    the library calls it kept (with the operators of the comment above them)."""
    definitions = _definition_ops(code)
    lines = code.splitlines()
    header = re.compile(r"\s+def call\(self, args\)|def call\(args\)")  # a Runner method (torch >= 2.9) or a function
    start = next((i for i, line in enumerate(lines) if header.match(line)), None)
    if start is None:
        return []
    calls: list[CompiledCall] = []
    comment: tuple[str, ...] = ()
    indent = len(lines[start]) - len(lines[start].lstrip())
    for line in lines[start + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break  # the end of the call function
        match = _ORIGINAL_ATEN.search(line)
        if match and line.lstrip().startswith("#"):
            comment = tuple(op.strip().removeprefix("aten.") for op in match.group(1).split(",") if op.strip())
            continue
        kernel = _KERNEL_CALL.match(line)
        if kernel and not kernel.group(1).startswith("triton_helpers"):
            name = kernel.group(1)
            ops = definitions.get(name) or comment or _ops_from_name(name)
            calls.append(CompiledCall(graph, len(calls), name, _kind(name), tuple(ops)))
            comment = ()
            continue
        extern = _EXTERN_CALL.match(line)
        if extern:
            name = extern.group(1) or extern.group(2)
            calls.append(CompiledCall(graph, len(calls), name, LIBRARY_CALL, comment or (name,)))
            comment = ()
    return calls


def graph_label(code: str, index: int) -> str:
    """``forward`` or ``backward`` (a backward graph takes the incoming gradients, ``tangents_``), numbered."""
    return f"{'backward' if 'tangents_' in code else 'forward'} graph {index}"


def calls_table(codes: list[str]) -> pd.DataFrame:
    """:func:`compiled_calls` of every generated module as one DataFrame: ``graph``, ``position``,
    ``name``, ``kind``, ``aten_ops`` (a comma-separated string) and ``fused`` (how many operators)."""
    rows = []
    for index, code in enumerate(codes):
        for call in compiled_calls(code, graph_label(code, index)):
            ops = [op for op in call.aten_ops if op]
            rows.append({"graph": call.graph, "position": call.position, "name": call.name, "kind": call.kind,
                         "aten_ops": ", ".join(ops), "fused": len(ops)})
    return pd.DataFrame(rows, columns=["graph", "position", "name", "kind", "aten_ops", "fused"])


# --------------------------------------------------------------------------------------------------
# Profiles of steps: operators and launches
# --------------------------------------------------------------------------------------------------


def operator_calls(run: ProfileRun) -> pd.Series:
    """Calls per step of every ATen operator in a profile (nested calls included), by name."""
    ops = run.operators()
    ops = ops[ops["kind"] == "operator"]
    return ops.groupby("name")["calls_per_step"].sum().sort_values(ascending=False)


def fate(before: float, after: float) -> str:
    """What happened to an operator's calls per step: ``gone``, ``fewer``, ``same`` or ``more``."""
    if before > 0 and after == 0:
        return "gone"
    if math.isclose(before, after, rel_tol=1e-9, abs_tol=1e-9):
        return "same"
    return "fewer" if after < before else "more"


def launches_per_step(run: ProfileRun) -> float:
    """Work items per step. On a GPU: the device's kernels, copies and memsets (each one launch). On a
    CPU, where nothing is launched: the host's top-level ATen operator calls (each would launch at
    least one kernel on a GPU; views are counted too) plus the kernels Inductor generated."""
    if run.on_device:
        return float(run.kernels()["calls"].sum()) / run.steps
    count = 0
    for event in run.profiler.events():
        if is_device_event(event):
            continue
        if is_fused_kernel(event.name) or (row_kind(event.name) == "operator" and not has_operator_ancestor(event)):
            count += 1
    return count / run.steps


def break_even_steps(compile_s: float, eager_ms: float, compiled_ms: float) -> float:
    """Steps after which a compile of ``compile_s`` seconds has paid for itself, when it turns an
    eager step of ``eager_ms`` into one of ``compiled_ms``: ``compile_s / (eager - compiled)``;
    ``math.inf`` when the compiled step is not faster."""
    if compile_s < 0 or eager_ms <= 0 or compiled_ms <= 0:
        raise ValueError(f"need compile_s >= 0 and positive step times (got {compile_s}, {eager_ms}, {compiled_ms})")
    saved_s = (eager_ms - compiled_ms) / 1e3
    return compile_s / saved_s if saved_s > 0 else math.inf
