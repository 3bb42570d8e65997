"""Time per module of a model, forward and backward, from one PyTorch profile.

An operator name alone does not say which part of a transformer ran it: ``aten::mm`` is a query
projection, a feed-forward projection or the output head; ``aten::mul`` is RMSNorm, RoPE or SwiGLU.
The module that called it does. :func:`module_ranges` wraps every submodule's forward in a profiler
range (``## module layers.0.attn.q_proj``), and :func:`module_operator_times` reads a profile taken
inside it back as one row per (operator, module, phase):

- forward operators get the innermost module range around them;
- backward operators run later, from the autograd engine, outside every range. Each one is found
  under its ``autograd::engine::evaluate_function: MmBackward0`` node, whose sequence number is the
  one its forward operator recorded: the backward work is credited to the module of that forward
  operator (the way TensorBoard's module view links them);
- time is self CPU time on a CPU, and on a GPU the device time of the kernels each operator launched
  (kernels launched inside a range but outside any operator, such as Triton kernels called directly,
  appear under their kernel name);
- ``flops`` is the profiler's own estimate (``with_flops``: matrix multiplies, and one per element
  for a few element-wise operators), per step.

:func:`profile_modules` does both in one call and returns the :class:`ProfileRun` too.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import pandas as pd
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

from tinyllama import device as dev
from tinyllama.profiling.torch_profiler import PHASES, ProfileRun, is_device_event, row_kind

RANGE_PREFIX = "## module "
OUTSIDE = ""  # the module of work that ran outside every module range (the loss, the optimizer)
_ENGINE = "autograd::engine::evaluate_function:"


@contextlib.contextmanager
def module_ranges(model: nn.Module, prefix: str = RANGE_PREFIX) -> Iterator[list[str]]:
    """Within the block, every submodule's forward (the model itself excluded) runs inside a profiler
    range named ``prefix + its name`` (``## module layers.0.mlp``). Yields the names; the hooks are
    removed on exit. The ``## `` prefix marks the ranges as annotations, not operators."""
    handles = []
    names = []
    for name, module in model.named_modules():
        if not name:
            continue
        names.append(name)
        stack: list[Any] = []

        def enter(_module: nn.Module, _args: Any, label: str = prefix + name, stack: list[Any] = stack) -> None:
            scope = torch.profiler.record_function(label)
            scope.__enter__()
            stack.append(scope)

        def leave(_module: nn.Module, _args: Any, _out: Any, stack: list[Any] = stack) -> None:
            if stack:
                stack.pop().__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave, always_call=True))
    try:
        yield names
    finally:
        for handle in handles:
            handle.remove()


def _ancestors(event: Any) -> Iterator[Any]:
    node = getattr(event, "cpu_parent", None)
    while node is not None:
        yield node
        node = getattr(node, "cpu_parent", None)


def _range_module(event: Any, prefix: str, include_self: bool = True) -> str | None:
    """The innermost module range around ``event`` (itself included), or ``None``."""
    if include_self and event.name.startswith(prefix):
        return event.name[len(prefix):]
    for node in _ancestors(event):
        if node.name.startswith(prefix):
            return node.name[len(prefix):]
    return None


def _phase(event: Any) -> str:
    for node in [event, *_ancestors(event)]:
        if node.name in PHASES:
            return node.name
        if node.name.startswith("autograd::engine"):
            return "backward"
    return "backward" if event.name.startswith("autograd::") else "outside phases"


def _engine_node(event: Any) -> Any | None:
    for node in [event, *_ancestors(event)]:
        if node.name.startswith(_ENGINE):
            return node
    return None


def _kernels(event: Any) -> list[Any]:
    """Device kernels the profiler linked to ``event`` (not the device copy of a range)."""
    return [k for k in getattr(event, "kernels", []) if k.name != event.name and k.name not in PHASES
            and not k.name.startswith("ProfilerStep#")]


COLUMNS = ["operator", "module", "phase", "calls_per_step", "time_ms", "flops"]


def module_operator_times(run: ProfileRun, prefix: str = RANGE_PREFIX) -> pd.DataFrame:
    """One row per (operator, module, phase) of a profile taken inside :func:`module_ranges`, per step:
    ``operator`` (the ATen name, or a kernel's name for a kernel launched outside operators), ``module``
    (the innermost module path, ``""`` outside every module), ``phase`` (forward, backward, optimizer,
    outside phases), ``calls_per_step``, ``time_ms`` (self CPU time on a CPU, device time of the
    launched kernels on a GPU; a dtype cast's copy kernel counts for its ``aten::_to_copy``), ``flops``
    (the profiler's estimate; 0 where it has none). Sorted by time."""
    events = [e for e in run.profiler.events() if not is_device_event(e)]
    # Forward operators that created an autograd node recorded its sequence number: map it to a module.
    forward_module: dict[tuple[int, int], str] = {}
    for event in events:
        sequence = getattr(event, "sequence_nr", -1)
        if sequence is None or sequence < 0 or row_kind(event.name) != "operator":
            continue
        module = _range_module(event, prefix)
        if module is not None:
            forward_module.setdefault((getattr(event, "thread", 0), sequence), module)
            forward_module.setdefault((-1, sequence), module)

    def module_of(event: Any) -> str:
        module = _range_module(event, prefix)
        if module is not None:
            return module
        node = _engine_node(event)
        if node is None:
            return OUTSIDE
        sequence = getattr(node, "sequence_nr", -1)
        thread = getattr(node, "fwd_thread", None)
        return forward_module.get((thread, sequence), forward_module.get((-1, sequence), OUTSIDE))

    totals: dict[tuple[str, str, str], list[float]] = {}

    def add(name: str, module: str, phase: str, us: float, flops: float, calls: int) -> None:
        entry = totals.setdefault((name, module, phase), [0.0, 0.0, 0.0])
        entry[0] += us
        entry[1] += flops
        entry[2] += calls

    for event in events:
        operator = row_kind(event.name) == "operator"
        flops = float(getattr(event, "flops", 0) or 0) if operator else 0.0
        parent = getattr(event, "cpu_parent", None)
        # A dtype cast (autocast's, or .to(dtype)) copies through a child aten::copy_: that copy's time is the
        # cast's, so it goes to the cast's row, and the aten::copy_ rows keep the copies that cast nothing.
        cast_copy = operator and event.name == "aten::copy_" and parent is not None and parent.name == "aten::_to_copy"
        owner, calls = (parent, 0) if cast_copy else (event, 1)
        if not run.on_device:
            if operator:
                add(owner.name, module_of(owner), _phase(owner), float(event.self_cpu_time_total), 0.0 if cast_copy else flops,
                    calls)
            continue
        kernels = _kernels(event)
        if operator:
            add(owner.name, module_of(owner), _phase(owner), sum(k.duration for k in kernels), 0.0 if cast_copy else flops,
                calls)
        else:
            for kernel in kernels:
                add(kernel.name, module_of(event), _phase(event), kernel.duration, 0.0, 1)
    rows = [{"operator": name, "module": module, "phase": phase, "calls_per_step": calls / run.steps,
             "time_ms": us / 1e3 / run.steps, "flops": flops / run.steps}
            for (name, module, phase), (us, flops, calls) in totals.items()]
    frame = pd.DataFrame(rows, columns=COLUMNS)
    return frame.sort_values("time_ms", ascending=False, ignore_index=True)


def profile_modules(
    step: Callable[[], Any], model: nn.Module, *, device: torch.device | str | None = None, wait: int = 1,
    warmup: int = 1, active: int = 3, prefix: str = RANGE_PREFIX,
) -> tuple[ProfileRun, pd.DataFrame]:
    """Profile ``step()`` (``wait`` skipped, ``warmup`` discarded, ``active`` recorded calls) with
    ``model``'s modules marked by :func:`module_ranges` and the profiler's FLOP estimates on; returns
    the :class:`ProfileRun` and :func:`module_operator_times` of it."""
    if active < 1 or wait < 0 or warmup < 0:
        raise ValueError(f"need active >= 1 and wait, warmup >= 0 (got wait={wait}, warmup={warmup}, active={active})")
    device = dev.get_device(None if device is None else str(device))
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)  # the HIP activity on ROCm builds
    with module_ranges(model, prefix):
        with profile(activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
                     record_shapes=True, with_flops=True) as prof:
            for _ in range(wait + warmup + active):
                step()
                dev.synchronize(device)
                prof.step()
    run = ProfileRun(prof, device, active, None)
    return run, module_operator_times(run, prefix)
