"""Sweeps run once to choose designs (NVIDIA H200, 2026-11-22; record benchmarks/2026-11-22_h200_sweeps.json):

    OUT=DIR python gpu/sweeps_gpu.py rms v4        # about 2.5 minutes

- rms: the RMSNorm kernels at 8K and 64K rows x 1024, bf16 and fp32, each launch checked against
  PyTorch then timed from a CUDA graph. Forward: rows per program x warps. Backward: the strided
  persistent loop of the time (``orig``) at 1-8 programs per multiprocessor, against ``bwd_v2``
  below: contiguous runs of row blocks per program (``c``) and ``tl.range`` pipelining with 1-3
  stages. Chosen for tinyllama/kernels/rmsnorm.py: contiguous runs, 3 stages, one program per
  multiprocessor, autotuned per row count. (At 8K rows the inputs fit in the 50 MB L2 cache, so
  shares above 1 there mean cache hits, not a wrong byte count.)
- v4: V4's 30 most expensive kernels per step (PyTorch profiler) and Inductor options tried on
  its SwiGLU backward (a fused pointwise ``cat`` at ~60% of the copy bandwidth): neither
  ``max_pointwise_cat_inputs=1`` nor ``coordinate_descent_tuning`` changed it.
"""
import importlib, json, os, sys, time, traceback, glob, shutil
import torch
import triton
import triton.language as tl
sys.path.insert(0, os.getcwd())
from tinyllama.ceilings import measure_copy_tbs

OUT = os.environ.get("OUT", "/tmp")
parts = sys.argv[1:] or ["rms", "v4"]
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
T0 = time.time()


def save():
    json.dump(res, open(f"{OUT}/sweeps.json", "w"), indent=1, default=str)


def log(*a):
    print(f"[{time.time()-T0:6.0f}s]", *a, flush=True)


def graph_time(fn, calls=20, reps=10):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / calls)
    ts.sort()
    return ts[len(ts) // 2]


@triton.jit(do_not_specialize=["M", "num_programs"])
def bwd_v2(DY, X, W, RSTD, DX, DW_PARTIAL, stride_dy, stride_x, stride_dx, M, N, num_programs,
           BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, STAGES: tl.constexpr, CONTIG: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    nblocks = tl.cdiv(M, BLOCK_M)
    if CONTIG:
        per = tl.cdiv(nblocks, num_programs)
        lo = pid * per
        hi = tl.minimum(lo + per, nblocks)
        step = 1
    else:
        lo = pid
        hi = nblocks
        step = num_programs
    for block in tl.range(lo, hi, step, num_stages=STAGES):
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
    tl.store(DW_PARTIAL + pid * N + cols, tl.sum(dw, axis=0), mask=col_ok)


def rms_sweep():
    R = importlib.import_module("tinyllama.kernels.rmsnorm")
    fwd, bwd = R._rmsnorm_fwd_kernel.fn, R._rmsnorm_bwd_kernel.fn
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    copy = measure_copy_tbs(device="cuda").value
    res["copy_tbs"] = copy
    N = 1024
    out = res.setdefault("rms", {})
    for M in (8192, 65536):
        for dtype in (torch.bfloat16, torch.float32):
            size = dtype.itemsize
            x = torch.randn(M, N, device="cuda", dtype=dtype)
            dy = torch.randn(M, N, device="cuda", dtype=dtype)
            w = torch.rand(N, device="cuda") + 0.5
            y = torch.empty_like(x); dx = torch.empty_like(x)
            rstd = torch.empty(M, device="cuda")
            ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5) * w).to(dtype)
            key = f"{M}_{str(dtype)[6:]}"
            # forward
            best = None
            rows = []
            for m in (1, 2, 4, 8, 16, 32):
                for nw in (1, 2, 4, 8, 16):
                    ept = m * N // (32 * nw)
                    if not 1 <= ept <= 128:
                        continue
                    try:
                        launch = lambda m=m, nw=nw: fwd[(triton.cdiv(M, m),)](x, w, y, rstd, N, N, M, N, 1e-5, BLOCK_N=N, BLOCK_M=m, num_warps=nw)
                        launch(); torch.cuda.synchronize()
                        err = (y.float() - ref.float()).abs().max().item()
                        t = graph_time(launch)
                        share = M * N * 2 * size / (t * 1e-3) / 1e12 / copy
                        rows.append((m, nw, round(t * 1e3, 2), round(share, 3), err))
                    except Exception as e:
                        rows.append((m, nw, repr(e)[:200]))
            rows_ok = [r for r in rows if len(r) == 5]
            rows_ok.sort(key=lambda r: r[2])
            out[key + "_fwd"] = rows_ok[:8] + [r for r in rows if len(r) != 5]
            log(key, "fwd best", rows_ok[:3])
            save()
            # backward: original kernel x programs per SM; v2 with pipelining / contiguous chunks
            R.rmsnorm_forward(x, w, 1e-5)  # fills rstd via the autotuned kernel
            _, rstd = R.rmsnorm_forward(x, w, 1e-5)
            x32 = x.float(); xhat = x32 * rstd[:, None]; g = dy.float() * w
            dx_ref = (g - xhat * (g * xhat).mean(-1, keepdim=True)) * rstd[:, None]
            dw_ref = (dy.float() * xhat).sum(0)
            rows = []
            for m in (1, 2, 4, 8, 16):
                for nw in (4, 8, 16):
                    ept = m * N // (32 * nw)
                    if not 2 <= ept <= 64:
                        continue
                    for per_sm in (1, 2, 4, 8):
                        P = min(triton.cdiv(M, m), per_sm * sm)
                        partial = torch.empty(P, N, device="cuda")
                        variants = [("orig", None)] + [(f"pipe{s}{'c' if c else ''}", (s, c)) for s, c in ((1, 1), (2, 0), (2, 1), (3, 1))]
                        for name, opt in variants:
                            if opt is None:
                                def launch(m=m, nw=nw, P=P, partial=partial):
                                    bwd[(P,)](dy, x, w, rstd, dx, partial, N, N, N, M, N, P, BLOCK_N=N, BLOCK_M=m, num_warps=nw)
                                    return partial.sum(0)
                            else:
                                def launch(m=m, nw=nw, P=P, partial=partial, opt=opt):
                                    bwd_v2[(P,)](dy, x, w, rstd, dx, partial, N, N, N, M, N, P, BLOCK_N=N, BLOCK_M=m,
                                                 STAGES=opt[0], CONTIG=opt[1], num_warps=nw)
                                    return partial.sum(0)
                            try:
                                dw = launch(); torch.cuda.synchronize()
                                e1 = ((dx.float() - dx_ref).abs().max() / dx_ref.abs().max()).item()
                                e2 = ((dw - dw_ref).abs().max() / dw_ref.abs().max()).item()
                                t = graph_time(launch)
                                share = M * N * 3 * size / (t * 1e-3) / 1e12 / copy
                                rows.append((name, m, nw, per_sm, round(t * 1e3, 2), round(share, 3), round(max(e1, e2), 5)))
                            except Exception as e:
                                rows.append((name, m, nw, per_sm, repr(e)[:200]))
            rows_ok = [r for r in rows if len(r) == 7]
            rows_ok.sort(key=lambda r: r[4])
            out[key + "_bwd"] = rows_ok[:15] + [r for r in rows_ok if r[0] == "orig" and r[3] == 4][:6] + [r for r in rows if len(r) != 7][:5]
            log(key, "bwd best", rows_ok[:4])
            save()
            torch.cuda.empty_cache()


def top_kernels(model, batches, precision="bf16", steps=3):
    from torch.profiler import profile, ProfilerActivity
    from tinyllama import bench
    step = bench.TrainingStep(model, precision, "cuda")
    for _ in range(3):
        step(*batches[0])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(*batches[0])
        torch.cuda.synchronize()
    agg = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            a = agg.setdefault(e.name[:120], [0, 0.0])
            a[0] += 1; a[1] += e.time_range.elapsed_us()
    total = sum(v[1] for v in agg.values()) / steps / 1e3
    top = sorted(agg.items(), key=lambda kv: -kv[1][1])[:30]
    return {"device_ms": round(total, 3), "kernels_per_step": sum(v[0] for v in agg.values()) / steps,
            "top": [(k, v[0] // steps, round(v[1] / steps / 1e3, 3)) for k, v in top]}


def v4_variants():
    from tinyllama import bench
    from tinyllama.models import build, transfer_weights
    from tinyllama.config import get_preset
    import torch._inductor.config as ic
    preset = get_preset("medium"); cfg = preset.model
    batches = bench.make_batches(cfg, preset.batch_size, preset.seq_len, count=4, seed=0, device="cuda")
    torch.manual_seed(0)
    ref = build("v1", cfg)
    out = res.setdefault("v4", {})
    variants = [("default", {}), ("pointwise_cat_off", {"max_pointwise_cat_inputs": 1}),
                ("coord_descent", {"coordinate_descent_tuning": True}), ("default_again", {})]
    for name, opts in variants:
        torch._dynamo.reset()
        saved = {k: getattr(ic, k) for k in opts}
        try:
            for k, v in opts.items():
                setattr(ic, k, v)
            model = transfer_weights(ref, build("v4", cfg)).cuda()
            t = time.time()
            r = bench.run_benchmark(model=model, preset="medium", precision="bf16", num_steps=20, warmup_steps=4,
                                    batches=batches, progress=False)
            row = {"step": round(r.step_ms.median, 3), "p10": round(r.step_ms.p10, 3), "p90": round(r.step_ms.p90, 3),
                   "loss_last": r.losses[-1], "wall_s": round(time.time() - t, 1)}
            row.update(top_kernels(model, batches))
            out[name] = row
            log(name, {k: row[k] for k in ("step", "p10", "p90", "device_ms", "kernels_per_step")})
            for k in row["top"][:12]:
                log("   ", k)
        except Exception as e:
            out[name] = {"error": repr(e)[:800], "tb": traceback.format_exc()[-1500:]}
            log(name, out[name])
        finally:
            for k, v in saved.items():
                setattr(ic, k, v)
        save()
        del model
        torch.cuda.empty_cache()
    # Keep Inductor's generated code that holds the SwiGLU backward (sigmoid) for reading.
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if cache:
        keep = f"{OUT}/inductor_code"
        os.makedirs(keep, exist_ok=True)
        for path in glob.glob(f"{cache}/**/*.py", recursive=True):
            text = open(path).read()
            if "sigmoid" in text and "triton" in text:
                shutil.copy(path, keep)


for part, fn in (("rms", rms_sweep), ("v4", v4_variants)):
    if part in parts:
        try:
            fn()
        except Exception:
            res[part + "_error"] = traceback.format_exc()[-2000:]
            log(res[part + "_error"])
        save()
log("done")
