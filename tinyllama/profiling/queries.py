"""Questions put to the PyTorch profiler about a training step: how many matrix multiplies (GEMM
operators and device kernels) it runs, and where its time goes (top kernels and operators)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tinyllama import device as dev
from tinyllama.profiling.kernel_names import is_gemm_kernel
from tinyllama.profiling.torch_profiler import activities, event_time, is_device_event
from tinyllama.training import TrainingStep

# PyTorch's matrix-multiply operators at the bottom of the call tree (linear and matmul call these).
GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::_scaled_mm"})
def profile_training_steps(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], precision: str,
                           device: torch.device, steps: int) -> Any:
    """Profile ``steps`` training steps after one unprofiled step (compiled code is built by then)."""
    from torch.profiler import profile

    step = TrainingStep(model, precision, device)
    step(*batch)
    dev.synchronize(device)
    with profile(activities=activities(device)) as prof:
        for _ in range(steps):
            step(*batch)
        dev.synchronize(device)
    del step
    return prof


def count_gemms(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], precision: str,
                device: torch.device) -> dict[str, int | None]:
    """GEMMs in one training step: ``gemm_ops`` counts PyTorch's matmul operators (nested calls once),
    ``gemm_kernels`` the device's matrix-multiply kernel launches (``None`` on the CPU)."""
    events = profile_training_steps(model, batch, precision, device, steps=1).events()
    ops = 0
    for e in events:
        if e.name in GEMM_OPS and not is_device_event(e):
            parent = e.cpu_parent
            while parent is not None and parent.name not in GEMM_OPS:
                parent = parent.cpu_parent
            ops += parent is None
    kernels = sum(1 for e in events if is_device_event(e) and is_gemm_kernel(e.name))
    return {"gemm_ops": ops, "gemm_kernels": kernels if device.type == "cuda" else None}


def _self_device_us(event: Any) -> float:
    return event_time(event, "self_device_time_total", "self_cuda_time_total")  # renamed in torch 2.4


def top_operations(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], precision: str,
                   device: torch.device, steps: int = 3, top: int = 15) -> list[dict[str, Any]]:
    """Where a training step spends its time, per step, from the PyTorch profiler.

    On a GPU: the ``top`` device kernels by time (``kind="kernel"``, ``percent`` of all kernel time)
    and the ``top`` PyTorch operators by the device time of the kernels they launched
    (``kind="op"``). On the CPU: the ``top`` operators by their own CPU time.
    """
    prof = profile_training_steps(model, batch, precision, device, steps)
    on_gpu = device.type == "cuda"
    rows: list[dict[str, Any]] = []
    if on_gpu:
        events = prof.events()
        cpu_names = {e.name for e in events if not is_device_event(e)}
        kernels: dict[str, list[float]] = {}
        for e in events:
            # Device-side copies of record_function ranges ("forward", ...) carry a CPU event's name.
            if is_device_event(e) and e.name not in cpu_names and not getattr(e, "is_user_annotation", False):
                kernels.setdefault(e.name, []).append(e.time_range.elapsed_us() / 1e3)
        total = sum(sum(times) for times in kernels.values())
        for name, times in sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:top]:
            rows.append({"kind": "kernel", "name": name, "calls_per_step": len(times) / steps,
                         "device_ms": sum(times) / steps, "cpu_ms": None,
                         "percent": 100.0 * sum(times) / total if total else None})
    ops = [e for e in prof.key_averages() if not is_device_event(e) and not getattr(e, "is_user_annotation", False)]
    key = _self_device_us if on_gpu else (lambda e: float(e.self_cpu_time_total))
    total = sum(key(e) for e in ops)
    for e in sorted(ops, key=key, reverse=True)[:top]:
        rows.append({"kind": "op", "name": e.key, "calls_per_step": e.count / steps,
                     "device_ms": _self_device_us(e) / 1e3 / steps if on_gpu else None,
                     "cpu_ms": e.self_cpu_time_total / 1e3 / steps,
                     "percent": 100.0 * key(e) / total if total else None})
    return rows
