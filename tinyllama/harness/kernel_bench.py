"""Each Triton kernel against PyTorch, correct first, then timed honestly.

    python -m tinyllama.harness.kernel_bench --kernels rmsnorm rope swiglu flash_attention \\
        --dtypes fp32 bf16 --seq-lens 512 1024 2048 4096 --json kernels.json

For every kernel, data type and sequence length (shapes from a model preset, ``medium`` by default;
attention causal with the preset's grouped-query heads, ``--full`` without the mask, ``--kv-heads``
for another number of key/value heads):

1. the Triton kernel is checked against its PyTorch reference on fresh random inputs: output and
   every input gradient. A kernel that fails is not timed (its rows say why);
2. each implementation (Triton, V1's eager PyTorch, and for attention PyTorch's SDPA as it dispatches
   by default on the device, its backend named in ``sdpa_backend``, and SDPA forced to its flash
   backend) runs once untimed (compilation, autotuning; reported as ``warmup_ms``), then is timed by
   ``tinyllama.timing.time_callable`` with device events: forward, backward, forward + backward;
3. one timed sample repeats the operation enough times to last about a millisecond, cycling through
   copies of the inputs that together exceed the last-level cache (so that no input is served from
   a cache it would not fit in). Each is timed twice: ``eager_ms``, launched from Python one call
   after another as a participant calls it (the headline: a host-bound call shows its launch cost
   here), and ``gpu_ms``, the same calls captured in a CUDA/HIP graph on the stream the forwards ran
   on and replayed, so the time is the kernels' alone (``launch`` says whether capture worked; where
   it did not, ``gpu_ms`` is launched too), its count set from a replay's GPU time;
4. the result is the achieved bandwidth (RMSNorm, SwiGLU: bytes that must move) or FLOP/s
   (attention) in GPU time, and its share of the device's measured ceiling (``tinyllama.costs.ceilings``);
   ``speedup`` (eager) and ``speedup_gpu`` are the baseline's time over this row's: default SDPA for
   attention, eager PyTorch for the others.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F

from tinyllama import device as dev
from tinyllama.config import ModelConfig, get_preset, make_config
from tinyllama.costs.ceilings import measure_copy_tbs, measure_matmul_tflops
from tinyllama.harness.cli import progress_bar
from tinyllama.harness.records import markdown_table
from tinyllama.kernels import (
    flash_attention,
    flash_attention_reference,
    rmsnorm,
    rmsnorm_reference,
    rope,
    rope_reference,
    swiglu,
    swiglu_reference,
)
from tinyllama.kernels._triton import KernelMismatch, KernelTolerance, compare_with_reference
from tinyllama.models import v1_baseline as v1
from tinyllama.timing import Stats, graph_replay, time_callable

KERNELS = ("rmsnorm", "rope", "swiglu", "flash_attention")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PASSES = ("forward", "backward", "forward+backward")
GPU_SEQ_LENS = (512, 1024, 2048, 4096)
CPU_SEQ_LENS = (16, 33)

Inputs = list[torch.Tensor]


@dataclass
class KernelCase:
    """One kernel at one shape and dtype: how to make inputs, what to run, how much work it is."""

    kernel: str
    dtype: torch.dtype
    batch: int
    seq_len: int
    shape: str
    make_inputs: Callable[[int, int], Inputs]  # (batch, seed) -> inputs that require grad
    names: list[str]
    triton: Callable[..., torch.Tensor]
    reference: Callable[..., torch.Tensor]
    baselines: dict[str, Callable[..., torch.Tensor]]
    work: Callable[[str], float]  # pass -> bytes or FLOPs
    unit: str  # "TB/s" or "TFLOP/s"
    kwargs: dict[str, Any] = field(default_factory=dict)


def _randn(shape: Sequence[int], dtype: torch.dtype, device: torch.device, seed: int, scale: float = 1.0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g)).to(device, dtype).requires_grad_()


def _rmsnorm_case(config: ModelConfig, batch: int, seq: int, dtype: torch.dtype, device: torch.device) -> KernelCase:
    hidden, size = config.hidden_dim, dtype.itemsize

    def make(b: int, seed: int) -> Inputs:
        return [_randn((b, seq, hidden), dtype, device, seed), _randn((hidden,), torch.float32, device, seed + 1, 0.2)]

    def work(pass_: str) -> float:
        rows = batch * seq
        fwd = rows * hidden * 2 * size + hidden * 4 + rows * 4  # read x, write y; weight; rstd
        bwd = rows * hidden * 3 * size + rows * 4 + 2 * hidden * 4  # read dy and x, write dx; rstd; w, dw
        return {"forward": fwd, "backward": bwd, "forward+backward": fwd + bwd}[pass_]

    return KernelCase("rmsnorm", dtype, batch, seq, f"({batch * seq}, {hidden})", make, ["x", "weight"],
                      rmsnorm, rmsnorm_reference, {"eager": rmsnorm_reference}, work, "TB/s", {"eps": config.norm_eps})


def _rope_case(config: ModelConfig, batch: int, seq: int, dtype: torch.dtype, device: torch.device) -> KernelCase:
    heads, head_dim, size = config.num_heads, config.head_dim, dtype.itemsize
    tables = v1.RotaryEmbedding(head_dim, max(seq, config.max_seq_len), config.rope_theta).to(device)

    def make(b: int, seed: int) -> Inputs:
        return [_randn((b, heads, seq, head_dim), dtype, device, seed)]

    def work(pass_: str) -> float:
        elements = batch * heads * seq * head_dim  # read x (or dy), write the result; tables stay in cache
        return {"forward": 2 * elements * size, "backward": 2 * elements * size,
                "forward+backward": 4 * elements * size}[pass_]

    # The query of the medium model; the reference is V1's formula as the V1 model runs it.
    return KernelCase("rope", dtype, batch, seq, f"({batch}, {heads}, {seq}, {head_dim})", make, ["x"], rope,
                      rope_reference, {"eager": rope_reference}, work, "TB/s",
                      {"cos": tables.cos, "sin": tables.sin})


def _swiglu_case(config: ModelConfig, batch: int, seq: int, dtype: torch.dtype, device: torch.device) -> KernelCase:
    width, size = config.intermediate_dim, dtype.itemsize

    def make(b: int, seed: int) -> Inputs:
        return [_randn((b, seq, width), dtype, device, seed, 3.0), _randn((b, seq, width), dtype, device, seed + 1)]

    def work(pass_: str) -> float:
        elements = batch * seq * width
        return {"forward": 3 * elements * size, "backward": 5 * elements * size,
                "forward+backward": 8 * elements * size}[pass_]

    # The references are V1's formulas: eager PyTorch as the V1 model runs it.
    return KernelCase("swiglu", dtype, batch, seq, f"({batch * seq}, {width})", make, ["gate", "up"], swiglu,
                      swiglu_reference, {"eager": swiglu_reference}, work, "TB/s")


def _attention_case(config: ModelConfig, batch: int, seq: int, dtype: torch.dtype,
                    device: torch.device, causal: bool = True) -> KernelCase:
    heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
    v1_attention = v1.Attention(replace(config, max_seq_len=max(seq, config.max_seq_len))).to(device)

    def make(b: int, seed: int) -> Inputs:
        return [_randn((b, heads, seq, head_dim), dtype, device, seed),
                _randn((b, kv_heads, seq, head_dim), dtype, device, seed + 1),
                _randn((b, kv_heads, seq, head_dim), dtype, device, seed + 2)]

    def work(pass_: str) -> float:
        # causal: each query sees itself and the keys before it; full: every key
        pairs = seq * (seq + 1) / 2 if causal else seq * seq
        fwd = 4 * batch * heads * pairs * head_dim  # two matmuls, 2 FLOPs per multiply-add
        return {"forward": fwd, "backward": 2.5 * fwd, "forward+backward": 3.5 * fwd}[pass_]

    # "sdpa": as PyTorch dispatches it by default here (cuDNN on an H100/H200 with recent PyTorch),
    # the baseline a participant reaches for; "sdpa_flash" forces its flash backend, for reference.
    baselines: dict[str, Callable[..., torch.Tensor]] = {"sdpa": _sdpa(None)}
    if dtype != torch.float32 and device.type == "cuda":
        baselines["sdpa_flash"] = _sdpa("flash")
    # V1's attention (causal only) materialises fp32-softmaxed (seq x seq) scores: only where they fit easily.
    score_bytes = batch * heads * seq * seq * 4
    if causal and (device.type != "cuda"
                   or score_bytes * 6 < 0.4 * torch.cuda.get_device_properties(device).total_memory):
        baselines["eager"] = lambda q, k, v, causal: v1_attention.attend(q, k, v)
    mask = "" if causal else ", full"
    return KernelCase("flash_attention", dtype, batch, seq, f"({batch}, {heads}/{kv_heads}, {seq}, {head_dim}{mask})",
                      make, ["q", "k", "v"], flash_attention, flash_attention_reference, baselines, work,
                      "TFLOP/s", {"causal": causal})


def _sdpa(backend: str | None) -> Callable[..., torch.Tensor]:
    """PyTorch's scaled_dot_product_attention, grouped-query heads served by ``enable_gqa`` where the
    installed torch has it (>= 2.5), else by repeating K/V; ``backend="flash"`` forces the flash kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        try:
            gqa = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
            if backend == "flash":
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)
        except TypeError:  # torch < 2.5: no enable_gqa
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
            return run(q, k, v, causal)

    return run


_CASES = {"rmsnorm": _rmsnorm_case, "rope": _rope_case, "swiglu": _swiglu_case, "flash_attention": _attention_case}


# ------------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------------


def _scaled(stats: Stats, factor: float) -> Stats:
    return Stats(**{k: (v * factor if k != "n" else v) for k, v in stats.__dict__.items()})


def _cache_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 32 * 2**20
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 * 2**20))


def _passes(fn: Callable[..., torch.Tensor], sets: list[Inputs], grads: list[torch.Tensor], kwargs: dict[str, Any],
            pass_: str) -> list[Callable[[], object]]:
    """One zero-argument call per input set that runs ``pass_`` of ``fn``."""
    if pass_ == "forward":
        return [lambda s=s: fn(*s, **kwargs) for s in sets]
    if pass_ == "backward":
        outs = [fn(*s, **kwargs) for s in sets]  # graphs kept alive by the closures
        return [lambda o=o, s=s, g=g: torch.autograd.grad(o, s, g, retain_graph=True)
                for o, s, g in zip(outs, sets, grads)]
    return [lambda s=s, g=g: torch.autograd.grad(fn(*s, **kwargs), s, g) for s, g in zip(sets, grads)]


def _graphed(run: Callable[[], None], device: torch.device) -> Callable[[], None] | None:
    """``run`` as a graph replay (:func:`tinyllama.timing.graph_replay`), or None where it cannot be captured
    (then its launches are timed): a replay launches all its kernels at once, so the time is the GPU's, not
    Python's launch overhead.

    Captured on the current stream, the one the forward passes ran on (``time_pass`` makes it):
    captured on another, each backward would wait for its forward's stream, and those waits put
    about 2 us between the kernels of a replay (H200, RMSNorm backward: 17.8 us a call for a
    15.6 us kernel)."""
    if device.type != "cuda":
        return None
    try:
        return graph_replay(run, device, stream=torch.cuda.current_stream(device))
    except RuntimeError:  # an operation that cannot be captured: time plain launches
        return None


def time_pass(fn: Callable[..., torch.Tensor], sets: list[Inputs], grads: list[torch.Tensor],
              kwargs: dict[str, Any], pass_: str, device: torch.device, repeat: int,
              target_ms: float = 1.0) -> tuple[Stats, float, int, str]:
    """``(stats per call in ms, warm-up ms, calls per timed sample, how they were launched)`` for one
    pass of ``fn``."""
    if device.type == "cuda":
        # Run on a stream of our own, never the legacy default stream: a backward runs on the stream
        # its forward ran on, and capture cannot take in work queued on the legacy default stream
        # ("operation would make the legacy stream depend on a capturing blocking stream").
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))  # the inputs were made on the default one
        with torch.cuda.stream(stream):
            result = _time_pass(fn, sets, grads, kwargs, pass_, device, repeat, target_ms)
        torch.cuda.current_stream(device).wait_stream(stream)
        return result
    return _time_pass(fn, sets, grads, kwargs, pass_, device, repeat, target_ms)


def _calls_per_sample(target_ms: float, per_call_ms: float, n_sets: int) -> int:
    """Calls in one timed sample: about ``target_ms`` of work, at most 200, a multiple of the
    number of input sets (each set as often as the others)."""
    calls = max(1, min(200, math.ceil(target_ms / max(per_call_ms, 1e-3))))
    return n_sets * math.ceil(calls / n_sets)


def _many(calls: list[Callable[[], object]], count: int) -> Callable[[], None]:
    """One call that runs ``count`` of ``calls``, cycling through the input sets."""
    def run() -> None:
        for i in range(count):
            calls[i % len(calls)]()
    return run


def time_eager(fn: Callable[..., torch.Tensor], sets: list[Inputs], grads: list[torch.Tensor],
               kwargs: dict[str, Any], pass_: str, device: torch.device, repeat: int,
               target_ms: float = 1.0) -> Stats:
    """Milliseconds per call of one pass of ``fn`` launched from Python, one call after another, as a
    participant calls it: where launching takes longer than the kernels run, this is the launch time.
    Samples of about ``target_ms``, cycling through the input sets; call it after ``time_pass`` (or
    any first call), which compiles and autotunes."""
    calls = _passes(fn, sets, grads, kwargs, pass_)
    for call in calls:
        call()
    estimate = time_callable(calls[0], device, warmup=1, repeat=3).median
    inner = _calls_per_sample(target_ms, estimate, len(calls))
    return _scaled(time_callable(_many(calls, inner), device, warmup=1, repeat=repeat), 1.0 / inner)


def _time_pass(fn: Callable[..., torch.Tensor], sets: list[Inputs], grads: list[torch.Tensor],
               kwargs: dict[str, Any], pass_: str, device: torch.device, repeat: int,
               target_ms: float) -> tuple[Stats, float, int, str]:
    calls = _passes(fn, sets, grads, kwargs, pass_)
    dev.synchronize(device)
    began = time.perf_counter()
    for call in calls:  # first calls: compilation and autotuning happen here
        call()
    dev.synchronize(device)
    warmup_ms = (time.perf_counter() - began) * 1e3
    estimate = time_callable(calls[0], device, warmup=1, repeat=3).median
    inner = _calls_per_sample(target_ms, estimate, len(calls))

    def many(count: int) -> Callable[[], None]:
        return _many(calls, count)

    replay = _graphed(many(inner), device)
    if replay is not None:
        # The count above comes from launches, which for a short kernel take far longer than the
        # kernel itself (Python, autograd): a replay would hold a few calls, tens of us, and the
        # graph launch's own microseconds would be counted into each. Size it by the GPU's time.
        per_call = time_callable(replay, device, warmup=1, repeat=3).median / inner
        longer = _calls_per_sample(target_ms, per_call, len(calls))
        if longer > inner:
            replay = None  # free the first graph's memory before the second capture
            inner = longer
            replay = _graphed(many(inner), device)
    stats = time_callable(replay or many(inner), device, warmup=1, repeat=repeat)
    return _scaled(stats, 1.0 / inner), warmup_ms, inner, "graph" if replay else "launches"


# ------------------------------------------------------------------------------------------------
# The benchmark
# ------------------------------------------------------------------------------------------------


def measure_kernel_ceilings(dtypes: Sequence[str], device: torch.device) -> dict[str, float]:
    """Measured copy bandwidth (TB/s) and matmul rate (TFLOP/s) per dtype (fp32 follows the TF32
    setting, as the kernels do)."""
    out = {"copy_tbs": measure_copy_tbs(device=device).value}
    for name in dtypes:
        precision = "tf32" if name == "fp32" and torch.backends.cuda.matmul.allow_tf32 else name
        out[f"matmul_{name}_tflops"] = measure_matmul_tflops(precision, device=device).value
    return out


def _kernel_options() -> dict[str, Any]:
    """The switches that change which kernel code runs (``tinyllama.kernels._triton``), stamped on
    every row so that runs with different settings can share one record file."""
    from tinyllama.kernels import _triton

    forced = _triton.TENSOR_DESCRIPTORS
    return {"tensor_descriptors": "auto" if forced is None else str(forced).lower(),
            "warp_specialize": _triton.WARP_SPECIALIZE}


def _check(case: KernelCase, device: torch.device, seed: int) -> float:
    """Largest relative error of the Triton kernel against the reference on fresh inputs (batch 1,
    so that the reference's fp32 intermediates fit); raises ``KernelMismatch``."""
    inputs = case.make_inputs(1, seed)
    errors = compare_with_reference(case.triton, case.reference, inputs, case.names, KernelTolerance(), **case.kwargs)
    return max(errors.values())


def run_kernel_bench(
    kernels: Sequence[str] = KERNELS,
    dtypes: Sequence[str] = ("fp32", "bf16"),
    seq_lens: Sequence[int] | None = None,
    preset: str | None = None,
    batch_size: int | None = None,
    device: torch.device | str | None = None,
    repeat: int = 10,
    passes: Sequence[str] = PASSES,
    ceilings: dict[str, float] | None = None,
    progress: bool = True,
    seed: int = 0,
    causal: bool = True,
    kv_heads: int | None = None,
) -> Any:
    """Check, then time, each kernel against PyTorch; returns a pandas DataFrame, one row per
    (kernel, dtype, sequence length, implementation, pass). See the module docstring. Attention is
    causal unless ``causal=False``, with the preset's key/value heads unless ``kv_heads`` is given
    (the query heads' number: no grouped-query sharing)."""
    import pandas as pd

    unknown = set(kernels) - set(KERNELS) or set(dtypes) - set(DTYPES) or set(passes) - set(PASSES)
    if unknown:
        raise ValueError(f"unknown choice {sorted(unknown)}: kernels {KERNELS}, dtypes {tuple(DTYPES)}, passes {PASSES}")
    device = dev.get_device(None if device is None else str(device))
    preset = preset or ("medium" if device.type == "cuda" else "ci")
    chosen = get_preset(preset)
    batch = batch_size or chosen.batch_size
    seq_lens = list(seq_lens or (GPU_SEQ_LENS if device.type == "cuda" else CPU_SEQ_LENS))
    if batch < 1 or any(s < 1 for s in seq_lens):
        raise ValueError("batch size and sequence lengths must be at least 1")
    config = make_config(preset, max_seq_len=max([chosen.model.max_seq_len, *seq_lens]))
    if kv_heads is not None:
        if kv_heads < 1 or config.num_heads % kv_heads:
            raise ValueError(f"kv_heads {kv_heads} must divide the preset's {config.num_heads} query heads")
        config = replace(config, num_kv_heads=kv_heads)
    ceilings = ceilings or measure_kernel_ceilings(dtypes, device)
    stamp = {"device": dev.device_name(device), "date": _dt.date.today().isoformat(), "preset": preset,
             "torch": torch.__version__, "triton": dev.environment_summary(device).get("triton"),
             **_kernel_options()}

    todo = [(k, d, s) for k in kernels for d in dtypes for s in seq_lens]
    rows: list[dict[str, Any]] = []
    for kernel, dtype_name, seq in progress_bar(todo, "kernel bench" if progress else None):
        base = {"kernel": kernel, "dtype": dtype_name, "batch": batch, "seq_len": seq, **stamp}
        try:
            options = {"causal": causal} if kernel == "flash_attention" else {}
            case = _CASES[kernel](config, batch, seq, DTYPES[dtype_name], device, **options)
            base["shape"] = case.shape
            rows.extend(_bench_case(case, base, device, repeat, passes, ceilings, dtype_name, seed))
        except Exception as error:  # noqa: BLE001 - one failing case must not lose the others
            status = "skipped: out of memory" if dev.is_out_of_memory(error) else f"error: {error}".splitlines()[0]
            rows.append({**base, "status": status[:300]})
        finally:
            dev.free_memory(device)
    frame = pd.DataFrame(rows)
    return _add_speedups(frame)


def _bench_case(case: KernelCase, base: dict[str, Any], device: torch.device, repeat: int, passes: Sequence[str],
                ceilings: dict[str, float], dtype_name: str, seed: int) -> list[dict[str, Any]]:
    try:
        error = _check(case, device, seed + 1000 + case.seq_len)
    except KernelMismatch as mismatch:
        return [{**base, "impl": "triton", "status": f"failed check: {mismatch}"}]
    dev.free_memory(device)
    set_bytes = sum(t.numel() * t.element_size() for t in case.make_inputs(1, 0)) * case.batch
    n_sets = max(1, min(4, math.ceil(2 * _cache_bytes(device) / max(set_bytes, 1))))
    sets = [case.make_inputs(case.batch, seed + i) for i in range(n_sets)]
    grads = [torch.randn_like(s[0]) for s in sets]  # every kernel's output has its first input's shape
    ceiling = ceilings["copy_tbs"] if case.unit == "TB/s" else ceilings.get(f"matmul_{dtype_name}_tflops")
    if "sdpa" in case.baselines:
        base = {**base, "sdpa_backend": _default_sdpa_backend(case, sets[0])}
    rows = []
    for impl, fn in {"triton": case.triton, **case.baselines}.items():
        for pass_ in passes:
            row = {**base, "impl": impl, "pass": pass_, "check_error": error if impl == "triton" else None}
            try:
                gpu, warmup_ms, inner, launch = time_pass(fn, sets, grads, case.kwargs, pass_, device, repeat)
                eager = time_eager(fn, sets, grads, case.kwargs, pass_, device, repeat)
            except Exception as failure:  # noqa: BLE001 - e.g. SDPA's flash backend unavailable here
                if dev.is_out_of_memory(failure):
                    dev.free_memory(device)
                reason = "out of memory" if dev.is_out_of_memory(failure) else str(failure).splitlines()[0]
                rows.append({**row, "status": f"skipped: {reason}"[:300]})
                continue
            achieved = case.work(pass_) / (gpu.median * 1e-3) / 1e12
            rows.append({**row, "status": "ok", "eager_ms": eager.median, "eager_spread_pct": eager.spread_pct,
                         "gpu_ms": gpu.median, "gpu_p10_ms": gpu.p10, "gpu_p90_ms": gpu.p90,
                         "gpu_spread_pct": gpu.spread_pct, "calls_per_sample": inner, "launch": launch,
                         "warmup_ms": warmup_ms, "work": case.work(pass_), "unit": case.unit, "achieved": achieved,
                         "ceiling": ceiling, "ceiling_share": achieved / ceiling if ceiling else None})
    return rows


def _default_sdpa_backend(case: KernelCase, inputs: Inputs) -> str:
    """The backend SDPA dispatches to by default for this case's inputs (one profiled call)."""
    from tinyllama.profiling.attention import sdpa_backend

    q, k, v = (t.detach().requires_grad_() for t in inputs)
    return sdpa_backend(q, k, v, causal=bool(case.kwargs.get("causal", True))).backend


def _add_speedups(frame: Any) -> Any:
    """``speedup`` (eager) and ``speedup_gpu`` (GPU time): the baseline's time / this row's, within the
    same (kernel, dtype, seq, pass); the baseline is SDPA as dispatched by default for attention and
    eager PyTorch for the others."""
    if frame.empty or "eager_ms" not in frame:
        return frame
    frame["speedup"] = float("nan")
    frame["speedup_gpu"] = float("nan")
    frame["baseline"] = None
    keys = ["kernel", "dtype", "seq_len", "pass"]
    for _, group in frame[frame["status"] == "ok"].groupby(keys):
        impls = group.set_index("impl")
        baseline = next((b for b in ("sdpa", "eager") if b in impls.index), None)
        if baseline is None:
            continue
        frame.loc[group.index, "speedup"] = impls.loc[baseline, "eager_ms"] / group["eager_ms"]
        frame.loc[group.index, "speedup_gpu"] = impls.loc[baseline, "gpu_ms"] / group["gpu_ms"]
        frame.loc[group.index, "baseline"] = baseline
    return frame


# ------------------------------------------------------------------------------------------------
# Targets and presentation
# ------------------------------------------------------------------------------------------------


def check_targets(frame: Any) -> Any:
    """The performance targets, one row per measurement they apply to, with the measured value and
    whether it is met: RMSNorm forward and backward at >= 70% of the measured copy bandwidth (GPU
    time); flash attention forward+backward against SDPA as dispatched by default (its backend named)
    at >= 0.8x in GPU time from sequence 1024, and at >= 0.8x launched eagerly from sequence 2048."""
    import pandas as pd

    columns = ["target", "dtype", "seq_len", "value", "met"]
    if frame.empty or "eager_ms" not in frame:
        return pd.DataFrame(columns=columns)
    ok = frame[(frame["status"] == "ok") & (frame["impl"] == "triton")]
    rows = []
    for pass_ in ("forward", "backward"):
        for _, r in ok[(ok["kernel"] == "rmsnorm") & (ok["pass"] == pass_)].iterrows():
            rows.append([f"rmsnorm {pass_} >= 70% of copy bandwidth", r["dtype"], r["seq_len"],
                         r["ceiling_share"], bool(r["ceiling_share"] >= 0.7)])
    attention = ok[(ok["kernel"] == "flash_attention") & (ok["pass"] == "forward+backward")
                   & (ok["baseline"] == "sdpa")]
    for _, r in attention.iterrows():
        sdpa = f"default SDPA ({r.get('sdpa_backend', 'backend unknown')})"
        if r["seq_len"] >= 1024:
            rows.append([f"flash attention fwd+bwd >= 0.8x {sdpa}, GPU time", r["dtype"], r["seq_len"],
                         r["speedup_gpu"], bool(r["speedup_gpu"] >= 0.8)])
        if r["seq_len"] >= 2048:
            rows.append([f"flash attention fwd+bwd >= 0.8x {sdpa}, eager", r["dtype"], r["seq_len"],
                         r["speedup"], bool(r["speedup"] >= 0.8)])
    return pd.DataFrame(rows, columns=columns)


def to_markdown(frame: Any, columns: Sequence[str] | None = None, digits: int = 3) -> str:
    """``frame``'s ``columns`` (those it has; all by default) as a GitHub markdown table
    (:func:`tinyllama.harness.records.markdown_table`); ``(no rows)`` for an empty frame."""
    if frame.empty:
        return "(no rows)"
    return markdown_table(frame[[c for c in (columns or frame.columns) if c in frame.columns]], digits)


SUMMARY_COLUMNS = ("kernel", "dtype", "seq_len", "impl", "sdpa_backend", "pass", "eager_ms", "eager_spread_pct",
                   "gpu_ms", "gpu_spread_pct", "launch", "achieved", "unit", "ceiling_share", "speedup",
                   "speedup_gpu", "baseline", "check_error", "status")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tinyllama.harness.kernel_bench",
        description="Check each Triton kernel against PyTorch, then time both (device events, after warm-up).")
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=list(DTYPES))
    parser.add_argument("--seq-lens", nargs="+", type=int,
                        help=f"sequence lengths (default {GPU_SEQ_LENS} on a GPU, {CPU_SEQ_LENS} on the CPU)")
    parser.add_argument("--preset", help="model shapes (default medium on a GPU, ci on the CPU)")
    parser.add_argument("--batch-size", type=int, help="default: the preset's")
    parser.add_argument("--passes", nargs="+", default=list(PASSES), choices=PASSES)
    parser.add_argument("--full", action="store_true", help="attention without the causal mask")
    parser.add_argument("--kv-heads", type=int, help="attention's key/value heads (default: the preset's; the "
                        "number of query heads for no grouped-query sharing)")
    parser.add_argument("--repeat", type=int, default=10, help="timed samples per measurement (default 10)")
    parser.add_argument("--device", help="cuda, cuda:N or cpu (default: the GPU if there is one)")
    parser.add_argument("--json", metavar="PATH", help="append the rows to this JSON list file")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        device = dev.get_device(args.device)
        if device.type == "cpu":
            print("note: no GPU, the kernels run in Triton's interpreter (slow); the times say nothing "
                  "about a GPU", file=sys.stderr)
        frame = run_kernel_bench(args.kernels, args.dtypes, args.seq_lens, args.preset, args.batch_size, device,
                                 args.repeat, args.passes, progress=not args.quiet, causal=not args.full,
                                 kv_heads=args.kv_heads)
    except (ValueError, dev.DeviceUnavailable) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(to_markdown(frame, SUMMARY_COLUMNS))
    targets = check_targets(frame)
    if not targets.empty:
        print()
        print(to_markdown(targets))
    if args.json:
        from tinyllama.harness.records import append_json

        records = [{k: v for k, v in r.items() if not (isinstance(v, float) and math.isnan(v))}
                   for r in frame.to_dict(orient="records")]
        print(f"appended {len(records)} rows to {append_json(args.json, records)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
