"""Why the kernel bench timed the RMSNorm backward at 17.5 us when the kernel in a plain graph took 16.3:

    python gpu/bench_capture_stream.py      # under a minute on an H200; prints its figures

the bench captured its graphs on a stream other than the one the forward ran on, so every backward
waited for its forward's stream, and in a replay those waits put ~2 us between the kernels. The
figures in benchmarks/2026-11-23_h200_rmsnorm_backward_costs.json ('capture_stream') come from this
script run against the bench before its fix, when ``B._graphed`` was ``graphed_other_stream`` below;
since the fix the first two lines measure what the last two do."""
import importlib, os, sys, torch
sys.path.insert(0, os.getcwd())
R = importlib.import_module("tinyllama.kernels.rmsnorm")
from tinyllama.kernels import bench as B
dev = torch.device("cuda")
case = B._rmsnorm_case(B.make_config("medium"), 16, 512, torch.bfloat16, dev)
sets = [case.make_inputs(16, seed) for seed in range(4)]
grads = [torch.randn_like(case.triton(*s, **case.kwargs)) for s in sets]
B._graphed = graphed_other_stream
for k in range(2):
    st, _, calls, launch = B.time_pass(case.triton, sets, grads, case.kwargs, "backward", dev, repeat=10)
    print("captured on another stream", round(st.median * 1e3, 2), calls, launch, flush=True)
print("picked", R._rmsnorm_bwd_kernel.best_config)
def graphed_other_stream(run, device):  # the bench's capture before the fix
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay
orig = graphed_other_stream
def graphed_same_stream(run, device):
    s = torch.cuda.current_stream(device)
    run(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        run()
    return g.replay
B._graphed = graphed_same_stream
for k in range(2):
    st, _, calls, launch = B.time_pass(case.triton, sets, grads, case.kwargs, "backward", dev, repeat=10)
    print("capture on the forward's stream", round(st.median * 1e3, 2), calls, launch, flush=True)
B._graphed = orig
# kernel durations inside a bench-style replay
stream = torch.cuda.Stream(); stream.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(stream):
    calls_ = B._passes(case.triton, sets, grads, case.kwargs, "backward")
    for c in calls_: c()
    def many():
        for i in range(60): calls_[i % 4]()
    replay = orig(many, dev)
    replay(); torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        replay(); torch.cuda.synchronize()
ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
names = {}
for e in ev:
    names.setdefault(e.name[:40], []).append(e.device_time)
for n, ts in names.items():
    ts = sorted(ts); print(n, len(ts), "median us", round(ts[len(ts) // 2], 2), "sum", round(sum(ts), 1))
starts = sorted((e.time_range.start, e.time_range.end) for e in ev)
gaps = [b[0] - a[1] for a, b in zip(starts, starts[1:])]
gaps.sort(); print("gaps median us", gaps[len(gaps) // 2] if gaps else None, "span", starts[-1][1] - starts[0][0])
