"""What the RMSNorm backward diagnostics share: a variant of the library's backward kernel with
switches the library does not have, and a timer of calls replayed from a CUDA graph.

Used by gpu/rmsnorm_backward_sweep.py, gpu/rmsnorm_backward_costs.py and
gpu/rmsnorm_backward_configs.py (run as scripts: this folder is then on the import path).
The kernel is tinyllama/kernels/rmsnorm.py's ``_rmsnorm_bwd_kernel`` with, as compile-time switches:
EVICT (evict-first loads and streaming stores), MODE (0: add the weight gradient with atomics,
1: store each program's part in a row of its own, 2: no weight gradient) and PDL (wait for the
preceding kernel, under programmatic dependent launch, only before the weight-gradient sum).
"""
import torch
import triton
import triton.language as tl

from tinyllama.timing import time_callable

try:  # Hopper's programmatic dependent launch (NVIDIA only)
    from triton.language.extra.cuda import gdc_wait
    HAVE_GDC = True
except Exception:  # noqa: BLE001
    gdc_wait = None
    HAVE_GDC = False


@triton.jit(do_not_specialize=["M", "num_programs"])
def bwd_variant(DY, X, W, RSTD, DX, DW, stride_dy, stride_x, stride_dx, M, N, num_programs,
                BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, STAGES: tl.constexpr,
                EVICT: tl.constexpr = False, MODE: tl.constexpr = 0, PDL: tl.constexpr = False):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    blocks = tl.cdiv(M, BLOCK_M)
    per_program = tl.cdiv(blocks, num_programs)
    first = pid * per_program
    for block in tl.range(first, tl.minimum(first + per_program, blocks), num_stages=STAGES):
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        mask = row_ok[:, None] & col_ok[None, :]
        rows64 = rows.to(tl.int64)[:, None]
        if EVICT:
            x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            dy = tl.load(DY + rows64 * stride_dy + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        else:
            x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + rows64 * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
        xhat = x * rstd[:, None]
        g = dy * w[None, :]
        mean_gx = tl.sum(g * xhat, axis=1) / N
        dx = (g - xhat * mean_gx[:, None]) * rstd[:, None]
        if EVICT:
            tl.store(DX + rows64 * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask, cache_modifier=".cs")
        else:
            tl.store(DX + rows64 * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
    if PDL:
        gdc_wait()
    if MODE == 0:
        tl.atomic_add(DW + cols, tl.sum(dw, axis=0), mask=col_ok, sem="relaxed")
    elif MODE == 1:
        tl.store(DW + pid * N + cols, tl.sum(dw, axis=0), mask=col_ok)


def graph_time(fn, n: int = 40) -> tuple[float, float]:
    """``(median, p90 - p10)`` in us per call of ``fn(i)``, ``i`` = 0..n-1, replayed from one CUDA
    graph (warmed up and captured on a side stream, as capture requires)."""
    device = torch.device("cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(n):
            fn(i)
    stats = time_callable(graph.replay, device, warmup=2, repeat=15)
    return stats.median * 1e3 / n, (stats.p90 - stats.p10) * 1e3 / n
