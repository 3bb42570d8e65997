"""Where the bf16 RMSNorm backward's fixed cost goes at 8192 x 1024 (50 MB), and what an elementwise
op of the same bytes reaches. Graph-timed, 40 calls over 4 input sets.

    python gpu/rmsnorm_backward_costs.py    # about a minute on an H200; writes $OUT/rms_bwd4.json

The backward kernel with a MODE switch (atomic sum, a row per program, no weight gradient) and an
optional programmatic dependent launch (gpu/rmsnorm_backward_variants.py), so that each piece can be timed alone. Recorded in
benchmarks/2026-11-23_h200_rmsnorm_backward_costs.json ('costs'), run before the library's backward
stopped launching a zeroing kernel ('library_*' there is that older path)."""
import json, os, sys, torch, triton
import triton.language as tl
sys.path.insert(0, os.getcwd())
import importlib; R = importlib.import_module("tinyllama.kernels.rmsnorm")
from tinyllama.kernels import bench as B
from rmsnorm_backward_variants import HAVE_GDC, bwd_variant, graph_time  # this folder
dev = torch.device("cuda")
SM = torch.cuda.get_device_properties(dev).multi_processor_count
OUT = os.environ.get("OUT", "/tmp")
copy = B.measure_kernel_ceilings(["bf16"], dev)["copy_tbs"]
res = {"sm": SM, "copy_tbs": copy}
if not HAVE_GDC:
    res["gdc"] = "no programmatic dependent launch in this Triton"


@triton.jit
def add_kernel(A, Bp, C, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(C + offs, tl.load(A + offs, mask=m) + tl.load(Bp + offs, mask=m), mask=m)


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
        "fill+atomic": lambda i: bwd_variant[(P,)](dys[i % 4], xs[i % 4], w, rstds[i % 4], dx, torch.zeros(N, device=dev), N, N, N, M, N, P, BLOCK_N=1024, BLOCK_M=bm, STAGES=stages, MODE=0, PDL=False, num_warps=warps),
        "atomic_nofill": lambda i: bwd_variant[(P,)](dys[i % 4], xs[i % 4], w, rstds[i % 4], dx, dw_fixed, N, N, N, M, N, P, BLOCK_N=1024, BLOCK_M=bm, STAGES=stages, MODE=0, PDL=False, num_warps=warps),
        "store_rows": lambda i: bwd_variant[(P,)](dys[i % 4], xs[i % 4], w, rstds[i % 4], dx, parts, N, N, N, M, N, P, BLOCK_N=1024, BLOCK_M=bm, STAGES=stages, MODE=1, PDL=False, num_warps=warps),
        "no_dw": lambda i: bwd_variant[(P,)](dys[i % 4], xs[i % 4], w, rstds[i % 4], dx, parts, N, N, N, M, N, P, BLOCK_N=1024, BLOCK_M=bm, STAGES=stages, MODE=2, PDL=False, num_warps=warps),
    }
    if HAVE_GDC:
        variants["fill+atomic_pdl"] = lambda i: bwd_variant[(P,)](dys[i % 4], xs[i % 4], w, rstds[i % 4], dx, torch.zeros(N, device=dev), N, N, N, M, N, P, BLOCK_N=1024, BLOCK_M=bm, STAGES=stages, MODE=0, PDL=True, num_warps=warps, launch_pdl=True)
    for name, fn in variants.items():
        key = f"{bm}_{warps}_{stages}_x{per_sm}_{name}"
        try:
            if name.startswith("fill"):
                dwv = torch.zeros(N, device=dev)
                bwd_variant[(P,)](dys[1], xs[1], w, rstds[1], dx, dwv, N, N, N, M, N, P, BLOCK_N=1024, BLOCK_M=bm, STAGES=stages, MODE=0, PDL=name.endswith("pdl"), num_warps=warps, **({"launch_pdl": True} if name.endswith("pdl") else {}))
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
