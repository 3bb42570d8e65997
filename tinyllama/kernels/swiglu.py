"""SwiGLU activation in Triton: ``out = silu(gate) * up``, forward and backward in one pass each.

PyTorch eager runs ``silu`` and the product as two kernels and keeps ``silu(gate)`` for the backward;
here the forward reads ``gate`` and ``up`` once and writes ``out`` once, and the backward reads
``gate``, ``up`` and ``dout`` once and writes both gradients, recomputing the sigmoid on the way.
Arithmetic is fp32 whatever the storage type.

With ``s = sigmoid(gate)``: ``d gate = dout * up * s * (1 + gate * (1 - s))``, ``d up = dout * gate * s``.

``swiglu_packed(gate_up)`` takes gate and up side by side in one tensor, as a fused gate/up
projection makes them, and returns its gradient as one tensor too (no concatenation in the backward).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tinyllama.kernels import _ops
from tinyllama.kernels._triton import (
    MAX_GRID_Y, autotune, cdiv, check_tensors, configs, empty_rows, launcher, next_power_of_2, rows_view,
)


def _tile_configs() -> list[triton.Config]:
    gpu = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w)
           for m, n, w in ((1, 1024, 4), (1, 2048, 8), (2, 1024, 8), (4, 512, 4), (8, 256, 4))]
    return configs(gpu, triton.Config({"BLOCK_M": 4, "BLOCK_N": 64}, num_warps=4))


def _prune(configs_: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """Drop tiles that are more than twice as wide as a row, and column grids taller than allowed."""
    n = named_args["N"]
    kept = [c for c in configs_
            if c.kwargs["BLOCK_N"] <= max(128, 2 * next_power_of_2(n))
            and cdiv(n, c.kwargs["BLOCK_N"]) <= MAX_GRID_Y]
    return kept or configs_[-1:]


@launcher
@autotune(_tile_configs(), ["N"], _prune)
# M and N may change from call to call without a recompile of the kernel for each value; N keeps
# Triton's divisibility-by-16 specialisation, which lets the masked loads be vectorised (see rmsnorm.py).
@triton.jit(do_not_specialize=["M"])
def _swiglu_fwd_kernel(G, U, OUT, stride_g, stride_u, stride_o, M, N,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)[:, None]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    mask = (rows < M) & (cols < N)
    g = tl.load(G + rows * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + rows * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    out = g / (1.0 + tl.exp(-g)) * u
    tl.store(OUT + rows * stride_o + cols, out.to(OUT.dtype.element_ty), mask=mask)


@launcher
@autotune(_tile_configs(), ["N"], _prune)
@triton.jit(do_not_specialize=["M"])
def _swiglu_bwd_kernel(DOUT, G, U, DG, DU, stride_do, stride_g, stride_u, stride_dg, stride_du, M, N,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)[:, None]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    mask = (rows < M) & (cols < N)
    dout = tl.load(DOUT + rows * stride_do + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + rows * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + rows * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-g))
    dg = dout * u * s * (1.0 + g * (1.0 - s))
    du = dout * g * s
    tl.store(DG + rows * stride_dg + cols, dg.to(DG.dtype.element_ty), mask=mask)
    tl.store(DU + rows * stride_du + cols, du.to(DU.dtype.element_ty), mask=mask)


def _grid(M: int, N: int):
    return lambda meta: (cdiv(M, meta["BLOCK_M"]), cdiv(N, meta["BLOCK_N"]))


def _check(gate: torch.Tensor, up: torch.Tensor, *more: torch.Tensor) -> None:
    check_tensors("swiglu", gate, up, *more)
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(f"swiglu: gate {tuple(gate.shape)} {gate.dtype} and up {tuple(up.shape)} {up.dtype} "
                         "must have the same shape and dtype")
    if gate.dim() == 0:
        raise ValueError("swiglu: gate and up must have at least one dimension")


def swiglu_forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` (shape and dtype of ``gate``)."""
    _check(gate, up)
    g, u = rows_view(gate), rows_view(up)
    M, N = g.shape
    out = empty_rows(gate)  # gate's shape, rows N apart
    if M and N:
        _swiglu_fwd_kernel(_grid(M, N), g, u, out, g.stride(0), u.stride(0), N, M, N)
    return out


def swiglu_backward(
    dout: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
    grads: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d gate, d up)`` for the upstream gradient ``dout``. ``grads``, if given, are two (rows, width)
    tensors with unit last stride to write into (for example the halves of one fused gradient)."""
    _check(gate, up, dout)
    do, g, u = rows_view(dout), rows_view(gate), rows_view(up)
    M, N = g.shape
    if grads is None:  # gate's shape, rows N apart
        dg, du = empty_rows(gate), empty_rows(gate)
        stride_dg = stride_du = N
    else:
        dg, du = grads
        stride_dg, stride_du = dg.stride(0), du.stride(0)
    if M and N:
        _swiglu_bwd_kernel(_grid(M, N), do, g, u, dg, du, do.stride(0), g.stride(0), u.stride(0), stride_dg, stride_du,
                           M, N)
    if grads is not None:
        return dg.view(gate.shape), du.view(gate.shape)
    return dg, du


class SwiGLUFunction(torch.autograd.Function):
    """Autograd wrapper: saves ``gate`` and ``up`` (not the activation), recomputes in the backward."""

    @staticmethod
    def forward(ctx, gate, up):  # type: ignore[override]
        ctx.save_for_backward(gate, up)
        with _ops.named("swiglu_forward"):
            return swiglu_forward(gate, up)

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        gate, up = ctx.saved_tensors
        with _ops.named("swiglu_backward"):
            return swiglu_backward(dout, gate, up)


# The operators tinyllama::swiglu_forward / _backward and tinyllama::swiglu_packed_forward / _backward
# (see tinyllama.kernels._ops): what torch.compile, FlopCounterMode and the profiler see.


def _forward_op(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return swiglu_forward(gate, up)


def _backward_op(dout: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return swiglu_backward(dout, gate, up)


def _packed_forward_op(gate_up: torch.Tensor) -> torch.Tensor:
    return swiglu_forward(*gate_up.chunk(2, dim=-1))


def _packed_backward_op(dout: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    return swiglu_packed_backward(dout, gate_up)


forward_op = _ops.register("swiglu_forward", _forward_op, schema="(Tensor gate, Tensor up) -> Tensor")
backward_op = _ops.register("swiglu_backward", _backward_op,
                            schema="(Tensor dout, Tensor gate, Tensor up) -> (Tensor, Tensor)")
packed_forward_op = _ops.register("swiglu_packed_forward", _packed_forward_op, schema="(Tensor gate_up) -> Tensor")
packed_backward_op = _ops.register("swiglu_packed_backward", _packed_backward_op,
                                   schema="(Tensor dout, Tensor gate_up) -> Tensor")


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _op_backward(ctx, dout):
    gate, up = ctx.saved_tensors
    return torch.ops.tinyllama.swiglu_backward(dout, gate, up)


def _packed_op_backward(ctx, dout):
    (gate_up,) = ctx.saved_tensors
    return torch.ops.tinyllama.swiglu_packed_backward(dout, gate_up)


forward_op.register_autograd(_op_backward, setup_context=_setup_context)
packed_forward_op.register_autograd(_packed_op_backward, setup_context=_setup_context)
for _op in (forward_op, backward_op, packed_forward_op, packed_backward_op):
    _ops.register_flops(_op, _ops.no_flops)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` elementwise, differentiable in both; ``gate`` and ``up`` may be any views
    (for example the two halves of one fused projection) of the same shape. Eager calls go straight
    to the autograd Function; traced or counted ones through ``torch.ops.tinyllama.swiglu_forward``
    (see ``tinyllama.kernels._ops``)."""
    if _ops.dispatch_through_ops():
        return torch.ops.tinyllama.swiglu_forward(gate, up)
    return SwiGLUFunction.apply(gate, up)


class SwiGLUPackedFunction(torch.autograd.Function):
    """``swiglu`` of the two halves of one tensor, whose gradient is written as one tensor: the
    backward kernel stores both halves' gradients into it, where autograd would otherwise allocate
    ``d gate`` and ``d up`` and then copy both into a concatenation for the fused projection."""

    @staticmethod
    def forward(ctx, gate_up):  # type: ignore[override]
        ctx.save_for_backward(gate_up)
        with _ops.named("swiglu_packed_forward"):
            return swiglu_forward(*gate_up.chunk(2, dim=-1))

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        (gate_up,) = ctx.saved_tensors
        with _ops.named("swiglu_packed_backward"):
            return swiglu_packed_backward(dout, gate_up)


def swiglu_packed_backward(dout: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    """The gradient of ``swiglu_packed`` with respect to ``gate_up``, as one tensor of its shape."""
    width = gate_up.shape[-1] // 2
    grad = torch.empty((dout.numel() // max(width, 1), 2 * width), dtype=gate_up.dtype, device=gate_up.device)
    swiglu_backward(dout, *gate_up.chunk(2, dim=-1), grads=(grad[:, :width], grad[:, width:]))
    return grad.view(gate_up.shape)


def swiglu_packed(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` where ``gate`` and ``up`` are the first and second half of the last
    dimension of ``gate_up`` (the output of a fused gate/up projection), differentiable."""
    if gate_up.dim() == 0 or gate_up.shape[-1] % 2:
        raise ValueError(f"swiglu_packed: the last dimension of {tuple(gate_up.shape)} must be even "
                         "(gate and up side by side)")
    if _ops.dispatch_through_ops():
        return torch.ops.tinyllama.swiglu_packed_forward(gate_up)
    return SwiGLUPackedFunction.apply(gate_up)


def swiglu_packed_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """``swiglu_packed`` in plain PyTorch (V2's formula)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The same function in plain PyTorch (the V1 model's formula)."""
    return F.silu(gate) * up
