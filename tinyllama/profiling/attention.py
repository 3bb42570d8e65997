"""PyTorch's attention as a baseline, and what attention keeps in memory.

- :func:`sdpa`: ``torch.nn.functional.scaled_dot_product_attention`` for grouped-query heads (``enable_gqa``
  where the installed torch has it, else key/value heads repeated), as PyTorch dispatches it or forced
  to one backend (``"flash"``, ``"efficient"``, ``"cudnn"``, ``"math"``);
- :func:`sdpa_backend`: which backend PyTorch's dispatcher picks for given tensors, read from the
  operator it calls (``aten::_scaled_dot_product_cudnn_attention`` is cuDNN, and so on) and, when
  asked, the kernels it launched (why each backend can or cannot run the tensors, in PyTorch's words:
  :mod:`tinyllama.profiling.sdpa_reasons`);
- :func:`saved_tensor_bytes`: the bytes autograd keeps for the backward while a function runs (exact,
  on every device: the CPU keeps no allocator statistics, but saved tensors can always be counted);
- :func:`peak_memory_bytes`: the allocator's peak above its starting point while a function runs (a GPU
  only; ``None`` on the CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from tinyllama import device as dev
from tinyllama.costs.anatomy import saved_for_backward
from tinyllama.profiling.operators import OperatorCalls

# The operator each SDPA backend runs under, most specific first (ATen names, as a profiler records them).
BACKEND_OPERATORS: tuple[tuple[str, str], ...] = (
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "flash (CPU)"),
    ("aten::_scaled_dot_product_cudnn_attention", "cuDNN"),
    ("aten::_scaled_dot_product_flash_attention", "flash"),
    ("aten::_scaled_dot_product_efficient_attention", "memory-efficient"),
    ("aten::_scaled_dot_product_fused_attention_overrideable", "fused (overrideable)"),
    ("aten::_scaled_dot_product_attention_math", "math"),
)
BACKENDS = ("flash", "efficient", "cudnn", "math")


def _backend_enum(name: str) -> Any:
    from torch.nn.attention import SDPBackend

    members = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
               "math": "MATH"}
    if name not in members:
        raise ValueError(f"unknown SDPA backend {name!r}: use one of {', '.join(BACKENDS)} (or None for PyTorch's choice)")
    member = getattr(SDPBackend, members[name], None)
    if member is None:
        raise ValueError(f"this torch ({torch.__version__}) has no SDPA backend {name!r}")
    return member


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
         backend: str | None = None) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d) [+ causal mask]) v`` by PyTorch's SDPA.

    q: (batch, heads, seq, head_dim); k, v: (batch, kv_heads, seq, head_dim) with ``heads`` a multiple of
    ``kv_heads``. ``backend=None`` lets PyTorch choose; a name forces that backend (PyTorch raises
    ``RuntimeError`` when it cannot run these inputs).
    """
    def run() -> torch.Tensor:
        if q.shape[1] == k.shape[1]:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        try:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        except TypeError:  # torch < 2.5: no enable_gqa
            groups = q.shape[1] // k.shape[1]
            return F.scaled_dot_product_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1),
                                                  is_causal=causal)

    if backend is None:
        return run()
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(_backend_enum(backend)):
        return run()


@dataclass
class BackendChoice:
    """The backend SDPA ran: its name (``"cuDNN"``, ``"flash"``, ``"memory-efficient"``, ``"math"``,
    ``"flash (CPU)"``, or ``"unknown"``), the operator that says so, and the device kernels it launched."""

    backend: str
    operator: str
    kernels: list[str] = field(default_factory=list)

    def describe(self) -> str:
        kernels = f"; kernels: {', '.join(self.kernels[:3])}" if self.kernels else ""
        return f"{self.backend} (operator {self.operator}{kernels})"


def backend_from_operators(names: list[str]) -> tuple[str, str]:
    """``(backend, operator)`` for the operator names a profiler recorded during one SDPA call."""
    for operator, backend in BACKEND_OPERATORS:
        if operator in names:
            return backend, operator
    return "unknown", next((n for n in names if "scaled_dot_product" in n), "none recorded")


def sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                 backend: str | None = None, kernels: bool = False) -> BackendChoice:
    """Which backend :func:`sdpa` runs for these tensors (forward and, when they require gradients, the
    backward), named from the operator the dispatcher calls, seen by a dispatch mode (no profiler).
    ``kernels=True`` also lists the device kernels it launched, which takes a profiler session: the
    process then refuses later timings (``tinyllama.timing``), so ask for kernels after timing."""
    with OperatorCalls() as recorder:
        out = sdpa(q, k, v, causal, backend)
        if out.requires_grad:
            out.sum().backward()
    dev.synchronize(q.device)
    name, operator = backend_from_operators(recorder.names)
    softmax = next((n for n in recorder.names if n in ("aten::_safe_softmax", "aten::_softmax", "aten::softmax")), None)
    if name == "unknown" and softmax:
        # The math path is composite: below the dispatcher it is already its matmuls and softmax.
        name, operator = "math", f"{softmax} (the math path, written out in operators)"
    launched: list[str] = []
    if kernels and q.device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            out = sdpa(q, k, v, causal, backend)
            if out.requires_grad:
                out.sum().backward()
            dev.synchronize(q.device)
        for event in prof.events():
            device_type = getattr(event, "device_type", None)
            if device_type is not None and "CUDA" in str(device_type) and event.name not in launched:
                launched.append(event.name)
    for tensor in (q, k, v):
        tensor.grad = None
    return BackendChoice(name, operator, launched)


def saved_tensor_bytes(fn: Callable[[], Any]) -> int:
    """Bytes of the tensors autograd saves for the backward while ``fn()`` runs, each storage counted
    once (inputs that are saved count too). The result of ``fn`` is dropped."""
    with saved_for_backward() as saved:
        fn()
    return sum(tensor.nbytes for tensor in saved.values())


def peak_memory_bytes(fn: Callable[[], Any], device: torch.device | str | None = None) -> int | None:
    """The allocator's peak while ``fn()`` runs, above what was allocated before it (GPU only; ``None``
    on the CPU, where PyTorch keeps no allocator statistics: use :func:`saved_tensor_bytes` there)."""
    device = torch.device(device) if device is not None else dev.get_device()
    if device.type != "cuda":
        return None
    dev.synchronize(device)
    dev.reset_peak_memory(device)
    before = dev.memory_stats(device).current_bytes or 0
    result = fn()
    dev.synchronize(device)
    peak = dev.memory_stats(device).peak_bytes or 0
    del result
    return max(0, peak - before)
