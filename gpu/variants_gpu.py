"""Variants measured once to choose between them (NVIDIA H200, 2026-11-22; BENCHMARKS.md):

    OUT=DIR python gpu/variants_gpu.py kernels resnet    # about 1-2 minutes
    OUT=DIR python gpu/variants_gpu.py llama             # about 2 minutes

- llama: V1 fp32, then V4 (bf16) compiled per block or whole, each in "default" and "reduce-overhead"
  (CUDA graph) mode, V3 eager, V3 compiled per block (fails: dynamo cannot trace the autotuned
  Triton launchers), and V3 with each block captured by ``torch.cuda.make_graphed_callables``; every
  run is timed with ``tinyllama.bench`` (which first checks that every parameter gets a gradient),
  and its device time per step is summed from a PyTorch profiler trace;
- kernels: RMSNorm and SwiGLU against eager at the medium shapes (``tinyllama.kernels.bench``);
- resnet: ResNet-50 fp16 with and without fp32 batch norms (``inference``).

The V4 whole-model and V3 graphed variants are set up here, not in the package: they are the
evidence for choices, not course material. Results go to $OUT/explore_<parts>.json.
"""
import json, os, sys, time, traceback
import torch
sys.path.insert(0, os.getcwd())
from tinyllama import bench
from tinyllama.models import build, transfer_weights
from tinyllama.config import get_preset
OUT = os.environ.get("OUT", "/tmp")
results = {}
T0 = time.time()

def save():
    json.dump(results, open(f"{OUT}/explore_{'_'.join(parts)}.json", "w"), indent=1, default=str)

def record(name, fn):
    t = time.time()
    try:
        r = fn()
    except Exception as e:
        r = {"error": repr(e)[:1500], "tb": traceback.format_exc()[-2500:]}
    r["wall_s"] = round(time.time() - t, 1)
    results[name] = r
    print(f"[{time.time()-T0:6.0f}s] {name}: {json.dumps(r, default=str)[:700]}", flush=True)
    save()
    torch.cuda.empty_cache()

MARK = {"on": False}
_orig = bench.TrainingStep.loss
def _loss(self, i, t):
    if MARK["on"]:
        torch.compiler.cudagraph_mark_step_begin()
    return _orig(self, i, t)
bench.TrainingStep.loss = _loss

preset = get_preset("medium")
cfg = preset.model
batches = bench.make_batches(cfg, preset.batch_size, preset.seq_len, count=4, seed=0, device="cuda")

def device_ms(model, precision="bf16", steps=3):
    from torch.profiler import profile, ProfilerActivity
    step = bench.TrainingStep(model, precision, "cuda")
    for _ in range(2):
        step(*batches[0])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(*batches[0])
        torch.cuda.synchronize()
    total = sum(e.time_range.elapsed_us() for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA)
    return total / steps / 1e3

def timed(model, precision="bf16", mark=False, steps=20, warmup=4, devtime=True):
    MARK["on"] = mark
    try:
        r = bench.run_benchmark(model=model, preset="medium", precision=precision, num_steps=steps,
                                warmup_steps=warmup, batches=batches, progress=False)
        out = {k: round(v, 3) if isinstance(v, float) else v for k, v in dict(
            step=r.step_ms.median, p10=r.step_ms.p10, p90=r.step_ms.p90, fwd=r.forward_ms.median,
            bwd=r.backward_ms.median, opt=r.optimizer_ms.median, loss0=r.losses[0], loss_last=r.losses[-1],
            tflops=r.achieved_tflops, peak_mib=r.peak_memory_mib).items()}
        out["warmup_ms"] = [round(w) for w in r.warmup_ms]
        if devtime:
            try:
                out["device_ms"] = round(device_ms(model, precision), 3)
            except Exception as e:
                out["device_ms_error"] = repr(e)[:300]
        return out
    finally:
        MARK["on"] = False

torch.manual_seed(0)
ref = build("v1", cfg).cuda()

def with_weights(m):
    transfer_weights(ref, m)
    return m.cuda()

parts = sys.argv[1:] or ["all"]

if any(p in parts for p in ("all", "llama")):
    record("v1_fp32", lambda: timed(ref, "fp32", devtime=False, steps=10))
    record("v4_regional_default", lambda: timed(with_weights(build("v4", cfg))))
    torch._dynamo.reset()
    record("v4_regional_reduce_overhead", lambda: timed(with_weights(build("v4", cfg, compile_mode="reduce-overhead")), mark=True))
    torch._dynamo.reset()
    def whole(mode):
        m = with_weights(build("v4", cfg, compile=False))
        m.compile(mode=mode)
        return m
    record("v4_whole_default", lambda: timed(whole("default")))
    torch._dynamo.reset()
    record("v4_whole_reduce_overhead", lambda: timed(whole("reduce-overhead"), mark=True))
    torch._dynamo.reset()
    record("v3_eager", lambda: timed(with_weights(build("v3", cfg))))
    def v3_regional(mode):
        m = with_weights(build("v3", cfg))
        for layer in m.layers:
            layer.compile(mode=mode)
        return m
    record("v3_regional_default", lambda: timed(v3_regional("default")))
    torch._dynamo.reset()
    record("v3_regional_reduce_overhead", lambda: timed(v3_regional("reduce-overhead"), mark=True))
    torch._dynamo.reset()
    def v3_graphed():
        m = with_weights(build("v3", cfg)).train()
        x = torch.randn(preset.batch_size, preset.seq_len, cfg.hidden_dim, device="cuda", requires_grad=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            graphed = torch.cuda.make_graphed_callables(tuple(m.layers), tuple((x,) for _ in m.layers))
        m.layers = torch.nn.ModuleList(graphed)
        return m
    record("v3_graphed_blocks", lambda: timed(v3_graphed()))

if any(p in parts for p in ("all", "kernels")):
    def kb():
        from tinyllama.kernels.bench import run_kernel_bench
        f = run_kernel_bench(kernels=["rmsnorm", "swiglu"], dtypes=["fp32", "bf16"], seq_lens=[512, 4096],
                             preset="medium", progress=False)
        cols = [c for c in ("kernel", "dtype", "seq_len", "impl", "pass", "time_ms", "achieved", "ceiling_share", "status") if c in f.columns]
        return {"rows": f[cols].to_dict(orient="records")}
    record("kernel_bench", kb)

if any(p in parts for p in ("all", "resnet")):
    import inference
    def rn(**kw):
        r = inference.run("resnet50", iterations=40, warmup=10, progress=False, **kw)
        return {"img_s": round(r.throughput), "median_ms": round(r.timing.median, 3), "spread": round(r.timing.spread_pct, 2), "check": r.check}
    for bnf in (False, True):
        record(f"rn50_train64_fp16_bnfp32={bnf}", lambda: rn(mode="training", batch_size=64, precision="fp16", batchnorm_fp32=bnf))
    record("rn50_train64_fp32", lambda: rn(mode="training", batch_size=64, precision="fp32"))
    record("rn50_train64_fp16_cl_bnfp32", lambda: rn(mode="training", batch_size=64, precision="fp16", channels_last=True))
    for bnf in (False, True):
        record(f"rn50_infer256_fp16_bnfp32={bnf}", lambda: rn(batch_size=256, precision="fp16", batchnorm_fp32=bnf))
print("done", time.time() - T0)
