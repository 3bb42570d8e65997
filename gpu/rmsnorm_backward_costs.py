"""Where the bf16 RMSNorm backward's fixed cost goes at 8192 x 1024 (50 MB), and what an elementwise
op of the same bytes reaches. Graph-timed, 40 calls over 4 input sets.

    python gpu/rmsnorm_backward_costs.py    # about a minute on an H200; writes $OUT/rms_bwd4.json

A copy of the backward kernel with a MODE switch (atomic sum, a row per program, no weight gradient)
and an optional programmatic dependent launch, so that each piece can be timed alone. Recorded in
benchmarks/2026-11-23_h200_rmsnorm_backward_costs.json ('costs'), run before the library's backward
stopped launching a zeroing kernel ('library_*' there is that older path)."""
import json, os, sys, torch, triton
import triton.language as tl
sys.path.insert(0, os.getcwd())
import importlib; R = importlib.import_module("tinyllama.kernels.rmsnorm")
from tinyllama.kernels import bench as B
dev = torch.device("cuda")
SM = torch.cuda.get_device_properties(dev).multi_processor_count
OUT = os.environ.get("OUT", "/tmp")
copy = B.measure_kernel_ceilings(["bf16"], dev)["copy_tbs"]
res = {"sm": SM, "copy_tbs": copy}
try:
    from triton.language.extra.cuda import gdc_wait
    HAVE_GDC = True
except Exception as e:
    res["gdc"] = repr(e); HAVE_GDC = False
    gdc_wait = None


@triton.jit(do_not_specialize=["M", "num_programs"])
def bwd(DY, X, W, RSTD, DX, DW, stride, M, N, num_programs,
        BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, STAGES: tl.constexpr, MODE: tl.constexpr, PDL: tl.constexpr):
    # MODE 0 atomic add, 1 store own row, 2 no dw
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
        x = tl.load(X + rows64 * stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows64 * stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
        xhat = x * rstd[:, None]
        g = dy * w[None, :]
        mean_gx = tl.sum(g * xhat, axis=1) / N
        dx = (g - xhat * mean_gx[:, None]) * rstd[:, None]
        tl.store(DX + rows64 * stride + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
    if PDL:
        gdc_wait()
    if MODE == 0:
        tl.atomic_add(DW + cols, tl.sum(dw, axis=0), mask=col_ok, sem="relaxed")
    elif MODE == 1:
        tl.store(DW + pid * N + cols, tl.sum(dw, axis=0), mask=col_ok)


@triton.jit
def add_kernel(A, Bp, C, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(C + offs, tl.load(A + offs, mask=m) + tl.load(Bp + offs, mask=m), mask=m)


def graph_time(fn, n=40):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            fn(i)
    st = B.time_callable(g.replay, dev, warmup=2, repeat=15)
    return st.median * 1e3 / n, (st.p90 - st.p10) * 1e3 / n


M, N, dtype = 8192, 1024, torch.bfloat16
xs = [torch.randn(M, N, device=dev, dtype=dtype) for _ in range(4)]
dys = [torch.randn(M, N, device=dev, dtype=dtype) for _ in range(4)]
w = torch.randn(N, device=dev) * 0.2
rstds = [torch.rsqrt(x.float().pow(2).mean(-1) + 1e-5) for x in xs]
nbytes = M * N * 3 * 2 + M * 4 + 2 * N * 4
share = lambda t: round(nbytes / (t * 1e-6) / 1e12 / copy, 3)
ref = R.rmsnorm_backward(dys[1], xs[1], w, rstds[1])
for rep in range(3):
    t, s = graph_time(lambda i: R.rmsnorm_backward(dys[i % 4], xs[i % 4], w, rstds[i % 4]))
    res[f"library_{rep}"] = (round(t, 2), share(t), round(s, 2))
res["zeros_only"] = round(graph_time(lambda i: torch.zeros(N, device=dev))[0], 2)
dx = torch.empty(M, N, device=dev, dtype=dtype)
dw_fixed = torch.zeros(N, device=dev)
parts = torch.empty(2 * SM, N, device=dev)
for bm, warps, stages, per_sm in ((2, 2, 4, 2), (4, 4, 3, 2), (8, 8, 3, 1), (4, 8, 3, 2)):
    P = min(SM * per_sm, triton.cdiv(M, bm))
    variants = {
        "fill+atomic": lambda i: bwd[(P,)](dys[i % 4], xs[i % 4], w, rstds[i % 4], dx, torch.zeros(N, device=dev), N, M, N, P, BLOCK_N=1024, BLOCK_M=bm, STAGES=stages, MODE=0, PDL=False, num_warps=warps),
        "atomic_nofill": lambda i: bwd[(P,)](dys[i % 4], xs[i % 4], w, rstds[i % 4], dx, dw_fixed, N, M, N, P, BLOCK_N=1024, BLOCK_M=bm, STAGES=stages, MODE=0, PDL=False, num_warps=warps),
        "store_rows": lambda i: bwd[(P,)](dys[i % 4], xs[i % 4], w, rstds[i % 4], dx, parts, N, M, N, P, BLOCK_N=1024, BLOCK_M=bm, STAGES=stages, MODE=1, PDL=False, num_warps=warps),
        "no_dw": lambda i: bwd[(P,)](dys[i % 4], xs[i % 4], w, rstds[i % 4], dx, parts, N, M, N, P, BLOCK_N=1024, BLOCK_M=bm, STAGES=stages, MODE=2, PDL=False, num_warps=warps),
    }
    if HAVE_GDC:
        variants["fill+atomic_pdl"] = lambda i: bwd[(P,)](dys[i % 4], xs[i % 4], w, rstds[i % 4], dx, torch.zeros(N, device=dev), N, M, N, P, BLOCK_N=1024, BLOCK_M=bm, STAGES=stages, MODE=0, PDL=True, num_warps=warps, launch_pdl=True)
    for name, fn in variants.items():
        key = f"{bm}_{warps}_{stages}_x{per_sm}_{name}"
        try:
            if name.startswith("fill"):
                dwv = torch.zeros(N, device=dev)
                bwd[(P,)](dys[1], xs[1], w, rstds[1], dx, dwv, N, M, N, P, BLOCK_N=1024, BLOCK_M=bm, STAGES=stages, MODE=0, PDL=name.endswith("pdl"), num_warps=warps, **({"launch_pdl": True} if name.endswith("pdl") else {}))
                torch.cuda.synchronize()
                err = ((dwv - ref[1]).abs().max() / ref[1].abs().max()).item()
                assert err < 1e-4, err
            t, s = graph_time(fn)
            res[key] = (round(t, 2), share(t), round(s, 2))
        except Exception as e:  # noqa
            res[key] = repr(e)[:200]
        print(key, res[key], flush=True)
# Elementwise references of the same byte count: c = a + b over 8192 x 1024 bf16.
cs = [torch.empty(M, N, device=dev, dtype=dtype) for _ in range(4)]
t, s = graph_time(lambda i: torch.add(xs[i % 4], dys[i % 4], out=cs[i % 4]))
res["torch_add"] = (round(t, 2), share(t), round(s, 2))
for block in (1024, 2048, 4096, 8192):
    t, s = graph_time(lambda i: add_kernel[(triton.cdiv(M * N, block),)](xs[i % 4], dys[i % 4], cs[i % 4], M * N, BLOCK=block, num_warps=4 if block <= 2048 else 8))
    res[f"triton_add_{block}"] = (round(t, 2), share(t), round(s, 2))
for k, v in res.items():
    print(k, v)
json.dump(res, open(f"{OUT}/rms_bwd4.json", "w"), indent=1)
