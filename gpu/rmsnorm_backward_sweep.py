"""The RMSNorm backward's weight-gradient sum, on a GPU: where its fixed cost goes, and the sweep
behind the atomic version in tinyllama/kernels/rmsnorm.py.

    python gpu/rmsnorm_backward_sweep.py        # about 2 minutes on an H200; writes $OUT/rms_bwd3.json

1. the library's backward as it is, and alone the pieces of the earlier design: PyTorch's sum of
   one partial weight gradient per multiprocessor, and the zeroing of an fp32 vector;
2. the backward kernel adding its weight gradient with atomics (gpu/rmsnorm_backward_variants.py),
   for every block size, warp count, pipeline depth and programs per multiprocessor (1 or 2), with
   and without streaming cache hints (evict-first loads, .cs stores), each checked against the
   library first.
Every call is timed inside a CUDA graph of 40 calls that cycle through 4 input sets.
"""
import importlib, itertools, json, os, sys, torch, triton
sys.path.insert(0, os.getcwd())
R = importlib.import_module("tinyllama.kernels.rmsnorm")
from tinyllama.kernels import bench as B
from rmsnorm_backward_variants import bwd_variant, graph_time  # this folder

dev = torch.device("cuda")
SM = torch.cuda.get_device_properties(dev).multi_processor_count
OUT = os.environ.get("OUT", "/tmp")
res = {"sm": SM, "copy_tbs": B.measure_kernel_ceilings(["bf16"], dev)["copy_tbs"]}


for dtype, M in ((torch.bfloat16, 8192), (torch.bfloat16, 16384), (torch.float32, 8192), (torch.bfloat16, 65536)):
    N = 1024
    key = f"{str(dtype)[6:]}_{M}"
    xs = [torch.randn(M, N, device=dev, dtype=dtype) for _ in range(4)]
    dys = [torch.randn(M, N, device=dev, dtype=dtype) for _ in range(4)]
    w = torch.randn(N, device=dev) * 0.2
    rstds = [torch.rsqrt(x.float().pow(2).mean(-1) + 1e-5) for x in xs]
    nbytes = M * N * 3 * dtype.itemsize + M * 4 + 2 * N * 4
    ref = R.rmsnorm_backward(dys[1], xs[1], w, rstds[1])
    t, _ = graph_time(lambda i: R.rmsnorm_backward(dys[i % 4], xs[i % 4], w, rstds[i % 4]))
    r = {"library": (round(t, 2), round(nbytes / (t * 1e-6) / 1e12 / res["copy_tbs"], 3))}
    part = torch.randn(SM, N, device=dev)
    r["partial_sum_only"] = round(graph_time(lambda i: part.sum(0))[0], 2)
    r["zeros_only"] = round(graph_time(lambda i: torch.zeros(N, device=dev))[0], 2)
    dx = torch.empty(M, N, device=dev, dtype=dtype)
    for bm, warps, stages, per_sm, evict in itertools.product((2, 4, 8), (2, 4, 8), (2, 3, 4), (1, 2), (0, 1)):
        if not 2 <= bm * N // (32 * warps) <= 64:
            continue
        P = min(SM * per_sm, triton.cdiv(M, bm))
        def run(i, P=P, bm=bm, warps=warps, stages=stages, evict=evict):
            dw = torch.zeros(N, device=dev)
            bwd_variant[(P,)](dys[i % 4], xs[i % 4], w, rstds[i % 4], dx, dw, N, N, N, M, N, P,
                             BLOCK_N=1024, BLOCK_M=bm, STAGES=stages, EVICT=evict, num_warps=warps)
            return dw
        name = f"{bm}_{warps}_{stages}_x{per_sm}_e{evict}"
        try:
            dw = run(1)
            torch.cuda.synchronize()
            err = ((dw - ref[1]).abs().max() / ref[1].abs().max()).item()
            assert err < 1e-4, err
            t, _ = graph_time(run)
            r[name] = (round(t, 2), round(nbytes / (t * 1e-6) / 1e12 / res["copy_tbs"], 3))
        except Exception as e:  # noqa
            r[name] = repr(e)[:80]
    best = sorted((v[0], k) for k, v in r.items() if isinstance(v, tuple) and k != "library")[:8]
    print(key, "library", r["library"], best, flush=True)
    res[key] = r
json.dump(res, open(f"{OUT}/rms_bwd3.json", "w"), indent=1)
