"""Eager V3 bf16 step at medium with the RMSNorm autograd Function as it is (no zeroing kernel) and
as it was (torch.zeros in each backward), alternating in one process; V1 once as a host-independent
check; and the host time of one RMSNorm forward+backward call.

    python gpu/rmsnorm_change_ab.py         # about a minute on an H200; prints its figures

Recorded in benchmarks/2026-11-23_h200_rmsnorm_backward_costs.json ('v3_eager_ab')."""
import importlib, os, sys, time, torch
sys.path.insert(0, os.getcwd())
from tinyllama.bench import run_benchmark
R = importlib.import_module("tinyllama.kernels.rmsnorm")
new_fwd, new_bwd = R.RMSNormFunction.forward, R.RMSNormFunction.backward

def old_fwd(ctx, x, weight, eps, out_dtype):
    y, rstd = R.rmsnorm_forward(x, weight, eps, out_dtype)
    ctx.save_for_backward(x, weight, rstd)
    return y

def old_bwd(ctx, dy):
    x, weight, rstd = ctx.saved_tensors
    dx, dweight = R.rmsnorm_backward(dy, x, weight, rstd)
    return (dx if ctx.needs_input_grad[0] else None, dweight if ctx.needs_input_grad[1] else None, None, None)

def use(mode):
    f, b = (new_fwd, new_bwd) if mode == "new" else (old_fwd, old_bwd)
    R.RMSNormFunction.forward = staticmethod(f)
    R.RMSNormFunction.backward = staticmethod(b)

x = torch.randn(16, 512, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
w = torch.ones(1024, device="cuda", requires_grad=True)
for rnd in range(2):
    for mode in ("new", "old"):
        use(mode)
        for _ in range(20):
            R.rmsnorm(x, w).sum().backward()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(200):
            out = R.rmsnorm(x, w)
            out.backward(out)
        host = (time.perf_counter() - t) / 200 * 1e6
        torch.cuda.synchronize()
        r = run_benchmark("v3", "medium", precision="bf16", num_steps=15, progress=False)
        print(f"round {rnd} {mode}: v3 step {r.step_ms.median:.2f} ms (fwd {r.forward_ms.median:.2f} bwd {r.backward_ms.median:.2f} opt {r.optimizer_ms.median:.2f}); host us per rmsnorm fwd+bwd {host:.1f}", flush=True)
r = run_benchmark("v1", "medium", precision="bf16", num_steps=10, progress=False)
print(f"v1 step {r.step_ms.median:.2f} ms")
