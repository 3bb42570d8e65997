"""RMSNorm in Triton: ``y = x / sqrt(mean(x^2) + eps) * weight``, forward and backward.

Each program normalises ``BLOCK_M`` rows at once, a whole row in registers (``BLOCK_N`` is the
hidden size rounded up to a power of two, the tail masked), accumulating in fp32 whatever the input
type. The forward saves ``rstd = 1 / sqrt(mean(x^2) + eps)`` per row, so the backward does not
recompute the reduction. The backward runs one or two programs per multiprocessor; each streams
through one contiguous run of rows, keeping the next blocks' loads in flight while it computes
(``tl.range`` with ``num_stages``), sums its part of the weight gradient in registers and adds it to
the result with one atomic add per column. The vector it adds into was zeroed by the kernel that ran
before it (the forward's, or an earlier backward's): a zeroing kernel of its own, between two kernels that
each fill and drain the GPU, cost 2 us of 17 (H200, 8K rows of 1024 in bf16), enough to drop the
backward below 70% of the copy bandwidth. Atomics add in no fixed order, so the weight gradient may
differ in its last bits from run to run; under ``torch.use_deterministic_algorithms(True)`` each
program writes its part to a row of its own instead and PyTorch adds the rows, in a fixed order, in
a second kernel (H200, 8K rows of 1024 in bf16: 21 us instead of 17, of which the sum is 4).

Both kernels are autotuned per row count as well as width: the best tile for 8K rows is not the
best for 64K (H200: a forward tuned at 8K rows ran at 71% of the copy bandwidth at 64K, against 97%
tuned there).

Backward, with ``xhat = x * rstd`` and ``g = dy * weight``:
``dx = rstd * (g - xhat * mean(g * xhat))`` and ``dweight = sum over rows of dy * xhat``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tinyllama.kernels import _ops
from tinyllama.kernels._triton import (
    autotune, cdiv, check_tensors, configs, empty_rows, launcher, multiprocessor_count, next_power_of_2,
    pipeline_stages, rows_view,
)

# A row is held in registers; beyond this many elements it would spill (and a 64K-wide hidden
# size is far beyond any model in the course).
MAX_HIDDEN = 65536


def _row_configs() -> list[triton.Config]:
    # Rows per program x warps. Few candidates: each one is compiled and timed on first use.
    gpu = [triton.Config({"BLOCK_M": m}, num_warps=w)
           for m, w in ((1, 2), (1, 4), (1, 8), (2, 2), (2, 4), (4, 4), (4, 8), (8, 8))]
    return configs(gpu, triton.Config({"BLOCK_M": 4}, num_warps=4))


# Programs per multiprocessor in the backward: at most this many (the deterministic path keeps one
# row of partial sums per program).
MAX_PER_SM = 2


def _streaming_configs() -> list[triton.Config]:
    # Rows per block x warps x blocks in flight x programs per multiprocessor (H200 sweeps, 2026-11-22:
    # deeper pipelines beat many programs; two programs per multiprocessor help 16-bit rows, one fp32;
    # AMD's pipeliner gets at most 2 stages, see pipeline_stages).
    gpu = [triton.Config({"BLOCK_M": m, "STAGES": pipeline_stages(s), "PER_SM": p}, num_warps=w)
           for m, w, s, p in ((4, 4, 3, 1), (4, 4, 3, 2), (8, 8, 3, 1), (4, 8, 3, 1), (4, 8, 3, 2), (2, 2, 4, 2),
                              (2, 4, 3, 2), (8, 16, 1, 1))]
    return configs(gpu, triton.Config({"BLOCK_M": 4, "STAGES": 2, "PER_SM": 1}, num_warps=4))


def _prune(configs_: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """Keep configurations that give each thread between 2 and 64 elements of the tile."""
    block_n = kwargs["BLOCK_N"]
    kept = [c for c in configs_
            if 2 <= c.kwargs["BLOCK_M"] * block_n // (32 * c.num_warps) <= 64]
    return kept or configs_[:1]


@launcher
@autotune(_row_configs(), ["N", "M"], _prune)
# M is not specialised: one compiled kernel serves every row count. N is: Triton then knows when the
# width is a multiple of 16, so the masked loads of a row become wide vector loads. Without that hint
# every element is loaded on its own, and a bf16 row takes as long as an fp32 one (H200, medium
# shapes: the bf16 forward reached 35% of the copy bandwidth without the hint, 65-77% with it).
@triton.jit(do_not_specialize=["M"])
def _rmsnorm_fwd_kernel(X, W, Y, RSTD, ZEROED, stride_x, stride_y, M, N, eps,
                        BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, ZERO: tl.constexpr):
    # ZERO: program 0 also sets ZEROED (N fp32) to zero, the backward's weight-gradient sum.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < M
    mask = row_ok[:, None] & (cols < N)[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    tl.store(Y + rows64 * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=row_ok)
    if ZERO:
        if tl.program_id(0) == 0:
            tl.store(ZEROED + cols, tl.zeros([BLOCK_N], dtype=tl.float32), mask=cols < N)


@launcher
@autotune(_streaming_configs(), ["N", "M"], _prune, reset_to_zero=["DW"])
@triton.jit(do_not_specialize=["M"])  # N specialised, as in the forward
def _rmsnorm_bwd_kernel(DY, X, W, RSTD, DX, DW, ZEROED, stride_dy, stride_x, stride_dx, M, N,
                        BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, STAGES: tl.constexpr,
                        PER_SM: tl.constexpr, ATOMIC: tl.constexpr, ZERO: tl.constexpr):
    # PER_SM only sizes the grid (the launcher's); ATOMIC: add into DW (N,), else store row pid of DW;
    # ZERO: program 0 sets ZEROED (N fp32) to zero, the sum of a later backward.
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    if ZERO:
        if pid == 0:
            tl.store(ZEROED + cols, tl.zeros([BLOCK_N], dtype=tl.float32), mask=col_ok)
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # One contiguous run of row blocks per program (a program past the end gets none). tl.range with
    # num_stages loads the next blocks while this one is computed: without it each program waits
    # for every load, and a bf16 backward reached only 54-63% of the copy bandwidth (H200).
    blocks = tl.cdiv(M, BLOCK_M)
    per_program = tl.cdiv(blocks, num_programs)
    first = pid * per_program
    for block in tl.range(first, tl.minimum(first + per_program, blocks), num_stages=STAGES):
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        mask = row_ok[:, None] & col_ok[None, :]
        rows64 = rows.to(tl.int64)[:, None]
        x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows64 * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
        xhat = x * rstd[:, None]
        g = dy * w[None, :]
        mean_gx = tl.sum(g * xhat, axis=1) / N
        dx = (g - xhat * mean_gx[:, None]) * rstd[:, None]
        tl.store(DX + rows64 * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
    if ATOMIC:
        tl.atomic_add(DW + cols, tl.sum(dw, axis=0), mask=col_ok, sem="relaxed")
    else:
        tl.store(DW + pid * N + cols, tl.sum(dw, axis=0), mask=col_ok)


# ------------------------------------------------------------------------------------------------
# Launchers
# ------------------------------------------------------------------------------------------------


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    check_tensors("rmsnorm", x, weight)
    shape, wshape = x.shape, weight.shape
    if len(wshape) != 1 or not shape or wshape[0] != shape[-1]:
        raise ValueError(f"rmsnorm: weight of shape {tuple(wshape)} does not match the last dimension "
                         f"of x {tuple(shape)}; it must be a vector of length x.shape[-1]")
    if shape[-1] > MAX_HIDDEN:
        raise ValueError(f"rmsnorm: hidden size {shape[-1]} exceeds {MAX_HIDDEN}, the widest row kept in registers")


def _check_sum_vector(name: str, v: torch.Tensor | None, x: torch.Tensor) -> None:
    if v is not None and (v.shape != (x.shape[-1],) or v.dtype != torch.float32 or v.device != x.device
                          or not v.is_contiguous()):
        raise ValueError(f"rmsnorm: {name} must be a contiguous float32 vector of length {x.shape[-1]} on "
                         f"{x.device}, got {v.dtype} of shape {tuple(v.shape)} on {v.device}")


def rmsnorm_forward(
    x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype | None = None,
    zeroed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, rstd)``: the normalised ``x`` (shape of ``x``, dtype ``out_dtype`` or ``x``'s) and the
    fp32 reciprocal root-mean-square of each row, which the backward reuses.

    ``zeroed``, an fp32 vector of length ``x.shape[-1]``, is set to zero by the kernel on the way:
    the backward can add its weight gradient into it (``rmsnorm_backward(..., dweight_sum=zeroed)``)
    without a zeroing kernel of its own."""
    _check(x, weight)
    _check_sum_vector("zeroed", zeroed, x)
    rows = rows_view(x)
    M, N = rows.shape
    y = empty_rows(x, out_dtype)  # x's shape, rows N apart
    rstd = torch.empty(M, dtype=torch.float32, device=x.device)
    if M:
        grid = lambda meta: (cdiv(M, meta["BLOCK_M"]),)  # noqa: E731
        _rmsnorm_fwd_kernel(grid, rows, weight.contiguous(), y, rstd, zeroed, rows.stride(0), N, M, N, eps,
                            BLOCK_N=next_power_of_2(N), ZERO=zeroed is not None)
    elif zeroed is not None:
        zeroed.zero_()
    return y, rstd


def rmsnorm_backward(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
    dweight_sum: torch.Tensor | None = None, zero_next: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dx, dweight)`` for the upstream gradient ``dy``; ``rstd`` comes from ``rmsnorm_forward``.

    ``dweight_sum``: an fp32 vector of zeros (the forward's ``zeroed``) that the programs add the
    weight gradient into; without it one is zeroed here, a kernel launch of its own (H200, 8K rows
    of 1024 in bf16: 17.4 us instead of 15.2). ``zero_next``: a vector the kernel sets to zero, the
    ``dweight_sum`` of a later backward."""
    check_tensors("rmsnorm backward", dy, x, weight)
    _check_sum_vector("dweight_sum", dweight_sum, x)
    _check_sum_vector("zero_next", zero_next, x)
    dy_rows, x_rows = rows_view(dy), rows_view(x)
    M, N = x_rows.shape
    dx = empty_rows(x)  # x's shape, rows N apart
    # A few programs per multiprocessor (the config's PER_SM), never more than there are row blocks.
    sms = multiprocessor_count(x.device)
    grid = lambda meta: (max(1, min(cdiv(M, meta["BLOCK_M"]), sms * meta["PER_SM"])),)  # noqa: E731
    atomic = not torch.are_deterministic_algorithms_enabled()
    # fp32 sums: one vector (atomics), or a zeroed row per possible program (rows of idle programs add 0).
    if atomic:
        dweight = dweight_sum if dweight_sum is not None else torch.zeros(N, dtype=torch.float32, device=x.device)
    else:
        dweight = torch.zeros((sms * MAX_PER_SM, N), dtype=torch.float32, device=x.device)
    if M:
        _rmsnorm_bwd_kernel(
            grid, dy_rows, x_rows, weight.contiguous(), rstd, dx, dweight, zero_next, dy_rows.stride(0),
            x_rows.stride(0), N, M, N, BLOCK_N=next_power_of_2(N), ATOMIC=atomic, ZERO=zero_next is not None)
    elif zero_next is not None:
        zero_next.zero_()
    if not atomic:
        dweight = dweight.sum(dim=0)
    return dx, dweight if dweight.dtype == weight.dtype else dweight.to(weight.dtype)


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class RMSNormFunction(torch.autograd.Function):
    """Autograd wrapper: the forward saves ``x`` (as rows) and ``rstd``; the backward gives ``dx`` and
    ``dweight``.

    No backward launches a zeroing kernel for its weight-gradient sum: the forward's kernel zeroes
    the first one, and each backward's kernel zeroes the one for a second backward through the same
    graph (``retain_graph=True``). A vector zeroed outside the CUDA graph now being captured (or
    inside one, when running eagerly) is not used: a replay would add into a sum it never zeroed."""

    @staticmethod
    def forward(ctx, x, weight, eps, out_dtype):  # type: ignore[override]
        zeroed = torch.empty(x.shape[-1], dtype=torch.float32, device=x.device) if ctx.needs_input_grad[1] else None
        with _ops.named("rmsnorm_forward"):
            y, rstd = rmsnorm_forward(x, weight, eps, out_dtype, zeroed)
        ctx.save_for_backward(x, weight, rstd)
        ctx.zeroed, ctx.zeroed_in_capture = zeroed, _capturing(x.device)
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, weight, rstd = ctx.saved_tensors
        capturing = _capturing(x.device)
        dweight_sum = ctx.zeroed if ctx.zeroed_in_capture == capturing else None
        zero_next = torch.empty_like(ctx.zeroed) if ctx.zeroed is not None else None
        ctx.zeroed, ctx.zeroed_in_capture = zero_next, capturing
        with _ops.named("rmsnorm_backward"):
            dx, dweight = rmsnorm_backward(dy, x, weight, rstd, dweight_sum, zero_next)
        return (dx if ctx.needs_input_grad[0] else None,
                dweight if ctx.needs_input_grad[1] else None, None, None)


# The operators tinyllama::rmsnorm_forward and tinyllama::rmsnorm_backward (see tinyllama.kernels._ops):
# what torch.compile, FlopCounterMode and the profiler see. An operator keeps no state from its
# forward to its backward, so here the backward zeroes its own weight-gradient sum (one small kernel
# more than RMSNormFunction's eager path; Inductor may fuse it).


def _forward_op(x: torch.Tensor, weight: torch.Tensor, eps: float,
                out_dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    return rmsnorm_forward(x, weight, eps, out_dtype)


def _backward_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                 rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return rmsnorm_backward(dy, x, weight, rstd)


forward_op = _ops.register("rmsnorm_forward", _forward_op,
                           schema="(Tensor x, Tensor weight, float eps, ScalarType? out_dtype) -> (Tensor, Tensor)")
backward_op = _ops.register("rmsnorm_backward", _backward_op,
                            schema="(Tensor dy, Tensor x, Tensor weight, Tensor rstd) -> (Tensor, Tensor)")


def _setup_context(ctx, inputs, output) -> None:
    x, weight, _eps, _out_dtype = inputs
    ctx.save_for_backward(x, weight, output[1])


def _op_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dweight = torch.ops.tinyllama.rmsnorm_backward(dy, x, weight, rstd)
    return dx, dweight, None, None


forward_op.register_autograd(_op_backward, setup_context=_setup_context)
_ops.register_flops(forward_op, _ops.no_flops)
_ops.register_flops(backward_op, _ops.no_flops)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5,
            out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """RMSNorm over the last dimension of ``x`` with a learned ``weight``, differentiable in both.

    Statistics are computed in fp32 for any input type. ``out_dtype`` (default: ``x``'s) lets a
    caller under autocast get the 16-bit result that the next matmul would cast to anyway.
    Eager calls go straight to the autograd Function; traced or counted ones through the
    operator ``torch.ops.tinyllama.rmsnorm_forward`` (see ``tinyllama.kernels._ops``).
    """
    if _ops.dispatch_through_ops():
        return torch.ops.tinyllama.rmsnorm_forward(x, weight, eps, out_dtype)[0]
    return RMSNormFunction.apply(x, weight, eps, out_dtype)


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5,
                      out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The same function in plain PyTorch (the V1 model's formula), for tests and the benchmark."""
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    return y.to(out_dtype or x.dtype)
