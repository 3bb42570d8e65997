"""The fine-tuning lab's diagnosis and isolated micro-benchmarks (notebook 20).

Before any lever is pulled, the lab asks what bounds the reference step (:func:`diagnose_step`: an eager
step against the same step replayed from CUDA graphs, judged by :func:`tinyllama.timing.host_verdict`).
Then each lever of the tuning guide is measured alone, each timed after a warm-up, repeated, with
median and p10-p90, and shown correct first where it computes something:

- :func:`micro_batch_sweep`: tokens/s and peak memory (measured, requested, reserved; the estimate
  beside them) per micro-batch, up to the first one over a memory budget;
- :func:`attention_benchmark`: the written-out (math) attention against SDPA, forward + backward;
- :func:`loader_benchmark`: the ``DataLoader`` alone at several worker counts;
- :func:`fp16_scaler_demo`: fp16 autocast with and without a gradient scaler;
- :func:`dtype_census`: which operators ran in fp32 inside a 16-bit autocast step;
- :func:`allocator_comparison`: the caching allocator with and without expandable segments, each in a
  fresh process (the setting is read when the allocator starts).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from tinyllama import device as dev
from tinyllama.config import DTYPES, BenchmarkError, autocast_context, make_config
from tinyllama.costs.memory_estimate import allocator_peaks, estimate_memory, model_layout
from tinyllama.data import TokenWindows, make_loader
from tinyllama.harness.bench import run_benchmark
from tinyllama.models import build, lm_loss
from tinyllama.models.v2_fused import FusedAttention, causal_sdpa
from tinyllama.timing import Band, Stats, host_verdict, summarize, time_samples
from tinyllama.training import make_batches, seed_everything

VOCAB = 256  # the lab's byte tokens


@dataclass(frozen=True)
class MicrobenchSizes:
    """How much each micro-benchmark runs at a profile (small repeat counts: the lab has a time budget)."""

    diagnose_steps: int
    sweep_micro_batches: tuple[int, ...]  # tried in order until one is over the memory budget
    sweep_steps: int
    attention_repeat: int
    loader_batches: int
    loader_workers: tuple[int, ...]
    fp16_steps: int
    census_batch: int
    allocator_steps: int
    sweep_warmup: int
    memory_budget_mib: float  # the lab's memory budget: a change whose peak is above it is not kept


SIZES = {
    "gpu": MicrobenchSizes(diagnose_steps=15, sweep_micro_batches=(2, 4, 8, 16, 32, 64, 128), sweep_steps=5,
                           attention_repeat=15, loader_batches=30, loader_workers=(0, 1, 2, 4), fp16_steps=12,
                           census_batch=2, allocator_steps=12, sweep_warmup=2, memory_budget_mib=3072.0),
    "ci": MicrobenchSizes(diagnose_steps=4, sweep_micro_batches=(1, 2, 4, 8), sweep_steps=3,
                          attention_repeat=5, loader_batches=8, loader_workers=(0, 1, 2, 4), fp16_steps=4,
                          census_batch=1, allocator_steps=3, sweep_warmup=1, memory_budget_mib=4.0),
}


def sizes_for(profile_name: str) -> MicrobenchSizes:
    """The micro-benchmark sizes of a profile (``gpu`` or ``ci``)."""
    if profile_name not in SIZES:
        raise ValueError(f"no micro-benchmark sizes for profile {profile_name!r}: choose one of {', '.join(SIZES)}")
    return SIZES[profile_name]


def _band(stats: Stats) -> dict[str, float]:
    return {"ms": stats.median, "p10": stats.p10, "p90": stats.p90}


# --------------------------------------------------------------------------------------------------
# Diagnosis: eager against replayed
# --------------------------------------------------------------------------------------------------

def diagnose_step(preset: str, micro_batch: int, seq_len: int, precisions: Sequence[str] = ("fp32", "bf16"), *,
                  device: torch.device, steps: int = 10, model_options: dict[str, Any] | None = None) -> pd.DataFrame:
    """One micro-step of the reference model (V2 with ``model_options``, one micro-batch, no checkpointing:
    a captured graph cannot hold accumulation or recomputation) per precision, timed eagerly and, on a GPU,
    replayed from CUDA (HIP) graphs, from the same weights and batches. Each row: the eager and replayed
    median and p10-p90 (ms), the host's share of the eager step and the verdict of
    :func:`tinyllama.timing.host_verdict` (on a CPU there is no replay: "not decided")."""
    options = dict(model_options if model_options is not None else {"sdpa": False})
    on_gpu = device.type == "cuda"
    rows = []
    for precision in precisions:
        runs = {}
        for graphed in ((False, True) if on_gpu else (False,)):
            result = run_benchmark("v2", preset, batch_size=micro_batch, seq_len=seq_len, precision=precision,
                                   num_steps=steps, warmup_steps=3, device=device, model_options=options,
                                   cuda_graph=graphed, progress=False, vocab_size=VOCAB)
            runs[graphed] = result.step_ms
        eager = runs[False]
        row = {"precision": precision, **{f"eager_{k}": v for k, v in _band(eager).items()}}
        if on_gpu:
            replayed = runs[True]
            share, said = host_verdict(eager, replayed)
            row.update({f"replayed_{k}": v for k, v in _band(replayed).items()})
            row.update({"host_share": share, "verdict": said})
        else:
            row.update({"replayed_ms": math.nan, "replayed_p10": math.nan, "replayed_p90": math.nan,
                        "host_share": math.nan, "verdict": "not decided (no CUDA-graph replay on a CPU)"})
        rows.append(row)
    dev.free_memory(device)
    return pd.DataFrame(rows).set_index("precision")


def eager_band(table: pd.DataFrame, precision: str, kind: str = "eager") -> Band:
    """The ``kind`` ("eager" or "replayed") step of ``precision`` in a :func:`diagnose_step` table, as a Band."""
    row = table.loc[precision]
    return Band(float(row[f"{kind}_ms"]), float(row[f"{kind}_p10"]), float(row[f"{kind}_p90"]))


# --------------------------------------------------------------------------------------------------
# Micro-batch sweep: tokens/s and memory, up to the budget
# --------------------------------------------------------------------------------------------------

def micro_batch_sweep(preset: str, micro_batches: Sequence[int], seq_len: int, precision: str, *,
                      device: torch.device, budget_mib: float, steps: int, warmup_steps: int = 2,
                      checkpointing: bool = True, model_options: dict[str, Any] | None = None) -> pd.DataFrame:
    """Train steps of one micro-batch each (no accumulation) at every micro-batch in ``micro_batches`` (in
    order), and stop after the first whose peak is over ``budget_mib`` or that runs out of memory. Each row:
    the step time (median, p10, p90), tokens/s at the median, the allocator's peaks (allocated, requested,
    reserved; NaN on a CPU) and the estimate of :mod:`tinyllama.costs.memory_estimate`. On a CPU, which keeps no
    allocator statistics, the estimate decides where to stop."""
    options = dict(model_options if model_options is not None else {"sdpa": False})
    config = make_config(preset, vocab_size=VOCAB)
    with torch.device("meta"):  # shapes only
        layout = model_layout(build("v2", config, **options), device, precision)
    rows = []
    for micro in micro_batches:
        estimate = estimate_memory(config, micro, seq_len, precision, layout,
                                   config.num_layers if checkpointing else 0).peak_bytes() / 2**20
        row: dict[str, Any] = {"micro_batch": micro, "status": "ok", "estimated_peak_mib": estimate}
        try:
            result = run_benchmark("v2", preset, batch_size=micro, seq_len=seq_len, precision=precision,
                                   num_steps=steps, warmup_steps=warmup_steps, device=device,
                                   model_options=options, cuda_graph=False, gradient_checkpointing=checkpointing, progress=False,
                                   vocab_size=VOCAB)
            peaks = allocator_peaks(device)
            row.update({"step_ms": result.step_ms.median, "step_ms_p10": result.step_ms.p10,
                        "step_ms_p90": result.step_ms.p90, "tokens_per_s": result.tokens_per_s, **peaks})
        except BenchmarkError:
            row.update({"status": "out of memory", "step_ms": math.nan, "step_ms_p10": math.nan,
                        "step_ms_p90": math.nan, "tokens_per_s": math.nan,
                        **{k: math.nan for k in allocator_peaks(torch.device("cpu"))}})
        rows.append(row)
        dev.free_memory(device)
        measured = row["peak_memory_mib"]
        if row["status"] != "ok" or (measured > budget_mib if math.isfinite(measured) else estimate > budget_mib):
            break
    out = pd.DataFrame(rows)
    out["estimate_error_pct"] = 100 * (out["estimated_peak_mib"] - out["peak_memory_mib"]) / out["peak_memory_mib"]
    return out


# --------------------------------------------------------------------------------------------------
# Attention alone: math against SDPA
# --------------------------------------------------------------------------------------------------

def attention_benchmark(preset: str, batch: int, seq_len: int, precision: str, *, device: torch.device,
                        repeat: int = 10, warmup: int = 3, seed: int = 0) -> dict[str, Any]:
    """The attention of one block alone, forward + backward, at ``batch`` x ``seq_len`` and ``precision``
    (the tensors' own dtype): the model's written-out math path against ``causal_sdpa``. Correct first: the
    output and the three input gradients of SDPA against the math path's on the same random inputs (max
    error relative to the largest reference value). Returns the errors, ``correct``, and per path the
    :class:`~tinyllama.timing.Stats` of one forward + backward in ms."""
    config = make_config(preset, vocab_size=VOCAB)
    dtype = DTYPES[precision]
    math_attention = FusedAttention(config, sdpa=False).to(device)
    generator = torch.Generator().manual_seed(seed)
    heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim

    def make(h: int) -> torch.Tensor:
        return torch.randn(batch, h, seq_len, head_dim, generator=generator).to(device, dtype).requires_grad_()

    q, k, v = make(heads), make(kv_heads), make(kv_heads)
    grad_out = torch.randn(batch, heads, seq_len, head_dim, generator=generator).to(device, dtype)
    paths = {"math": math_attention.attend, "sdpa": causal_sdpa}

    def fwd_bwd(fn):
        out = fn(q, k, v)
        return (out, *torch.autograd.grad(out, (q, k, v), grad_out))

    results = {name: fwd_bwd(fn) for name, fn in paths.items()}
    errors = [float((a.detach().float() - b.detach().float()).abs().max() / b.detach().float().abs().max().clamp_min(1e-12))
              for a, b in zip(results["sdpa"], results["math"])]
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2  # 16-bit: a few units of bf16 rounding (2^-8)
    out: dict[str, Any] = {"precision": precision, "max_rel_error": max(errors), "tolerance": tolerance,
                           "correct": max(errors) <= tolerance}
    del results
    for name, fn in paths.items():
        out[name] = summarize(time_samples(lambda fn=fn: fwd_bwd(fn), device, warmup=warmup, repeat=repeat))
    return out


# --------------------------------------------------------------------------------------------------
# The loader alone
# --------------------------------------------------------------------------------------------------

def loader_benchmark(text: bytes, seq_len: int, batch_size: int, workers: Sequence[int], *, batches: int = 20,
                     warmup_batches: int = 3, seed: int = 0) -> pd.DataFrame:
    """The ``DataLoader`` of the lab alone (no model): for each worker count, the start-up (creating the
    iterator and the first batch) and then ``batches`` batches timed one by one after ``warmup_batches``
    (host clock: no device work is involved). Correct first: every configuration yields the same batches,
    in the same order, as the one without workers (``same_batches``). Each row: start-up ms, per-batch
    median, p10, p90 (ms) and batches/s."""
    dataset = TokenWindows(text, seq_len)
    needed = warmup_batches + batches
    if len(dataset) < needed * batch_size:
        raise ValueError(f"the text has {len(dataset)} windows, fewer than {needed} batches of {batch_size}")
    rows, first = [], None
    cpu = torch.device("cpu")
    for count in workers:
        with warnings.catch_warnings():  # more workers than cores is the point of the comparison, not a mistake
            warnings.filterwarnings("ignore", message=".*worker processes in total.*")
            loader = make_loader(dataset, batch_size, num_workers=count, seed=seed)
        began = time.perf_counter()  # start-up is one event, not repeatable: a host clock around it
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*worker processes in total.*")
            batches_iter = iter(loader)
        seen = [next(batches_iter)[0]]
        startup_ms = (time.perf_counter() - began) * 1e3

        def next_batch(source=batches_iter, kept=seen) -> None:  # bound now: the loop rebinds both names
            kept.append(next(source)[0])

        samples = time_samples(next_batch, cpu, warmup=warmup_batches, repeat=batches)
        stats = summarize(samples)
        if first is None:
            first = seen
        same = len(seen) == len(first) and all(torch.equal(a, b) for a, b in zip(seen, first))
        rows.append({"workers": count, "startup_ms": startup_ms, "batch_ms": stats.median, "batch_ms_p10": stats.p10,
                     "batch_ms_p90": stats.p90, "batches_per_s": 1e3 / stats.median, "same_batches": same})
        del batches_iter, loader
    return pd.DataFrame(rows).set_index("workers")


# --------------------------------------------------------------------------------------------------
# fp16 without a gradient scaler
# --------------------------------------------------------------------------------------------------

FP16_SMALLEST_NORMAL = torch.finfo(torch.float16).tiny  # 6.1e-5: below it fp16 keeps fewer bits, then 0


def _gradient_census(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, device: torch.device,
                     loss_factor: float, scale: float) -> dict[str, float]:
    """One fp16 forward + backward of ``loss * loss_factor * scale``: the share of the activation gradients
    entering the linear layers (``grad_output``) that are zero or below fp16's smallest normal number
    (before unscaling), and the non-finite weight gradients."""
    counts = Counter()

    def hook(_module, _grad_input, grad_output):
        g = grad_output[0]
        if g is not None and g.dtype == torch.float16:
            counts["total"] += g.numel()
            counts["zero"] += int((g == 0).sum())
            counts["subnormal"] += int(((g != 0) & (g.abs() < FP16_SMALLEST_NORMAL)).sum())

    handles = [m.register_full_backward_hook(hook) for m in model.modules() if isinstance(m, nn.Linear)]
    try:
        model.zero_grad(set_to_none=True)
        with autocast_context("fp16", device):
            loss = lm_loss(model(inputs), targets)
        (loss * loss_factor * scale).backward()
    finally:
        for handle in handles:
            handle.remove()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    nonfinite = sum(int((~torch.isfinite(g)).sum()) for g in grads)
    model.zero_grad(set_to_none=True)
    total = max(counts["total"], 1)
    return {"zero_share": counts["zero"] / total, "subnormal_share": counts["subnormal"] / total,
            "nonfinite_weight_grads": nonfinite}


def fp16_scaler_demo(preset: str, micro_batch: int, seq_len: int, *, device: torch.device, steps: int,
                     lr: float, loss_factor: float = 1.0, seed: int = 0) -> dict[str, Any]:
    """fp16 autocast with and without ``torch.amp.GradScaler``, from the same weights on the same batches.
    ``loss_factor`` multiplies the loss before the backward, as gradient accumulation does (1 / the
    accumulation steps). Returns, per run ("no scaler", "GradScaler"): the gradient census of the first
    backward (see :func:`_gradient_census`; the scaler's at its initial scale), the losses of ``steps``
    AdamW steps, the steps whose gradients were not finite (a step without a scaler then writes NaN into the
    weights; the scaler skips it and lowers its scale) and the final scale."""
    config = make_config(preset, vocab_size=VOCAB)
    batches = make_batches(config, micro_batch, seq_len, count=4, seed=seed, device=device)
    out: dict[str, Any] = {"loss_factor": loss_factor}
    for name in ("no scaler", "GradScaler"):
        seed_everything(seed)
        model = build("v2", config, sdpa=False).to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        scaler = torch.amp.GradScaler(device.type) if name == "GradScaler" else None
        census = _gradient_census(model, *batches[0], device, loss_factor, scaler.get_scale() if scaler else 1.0)
        losses, nonfinite_steps, skipped = [], 0, 0
        for i in range(steps):
            inputs, targets = batches[i % len(batches)]
            with autocast_context("fp16", device):
                loss = lm_loss(model(inputs), targets)
            scaled = loss * loss_factor
            (scaler.scale(scaled) if scaler else scaled).backward()
            finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)
            nonfinite_steps += not finite
            if scaler:
                before = scaler.get_scale()
                scaler.step(optimizer)
                scaler.update()
                skipped += scaler.get_scale() < before  # the scaler lowers its scale only on a skipped step
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
        out[name] = {**census, "losses": losses, "nonfinite_steps": nonfinite_steps, "skipped_steps": skipped,
                     "final_scale": scaler.get_scale() if scaler else 1.0}
        del model, optimizer
    dev.free_memory(device)
    return out


# --------------------------------------------------------------------------------------------------
# Which operators ran in fp32 under autocast
# --------------------------------------------------------------------------------------------------

class DtypeCensus(TorchDispatchMode):
    """Counts every ATen operator that runs below autocast, by the dtype of its first floating-point output
    (what the operator computed in). No profiler: a dispatch mode sees each call as it happens."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat = out if isinstance(out, (tuple, list)) else (out,)
        dtype = next((t.dtype for t in flat if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
        if dtype is not None:
            self.calls[(func.overloadpacket.__name__, str(dtype).replace("torch.", ""))] += 1
        return out


def dtype_census(preset: str, batch: int, seq_len: int, precision: str, *, device: torch.device,
                 model_options: dict[str, Any] | None = None, seed: int = 0) -> pd.DataFrame:
    """One forward + backward of the lab's model under ``precision`` autocast, every operator counted by the
    dtype it computed in: a table of (op, dtype, calls), most calls first."""
    options = dict(model_options if model_options is not None else {"sdpa": False})
    config = make_config(preset, vocab_size=VOCAB)
    seed_everything(seed)
    model = build("v2", config, **options).to(device).train()
    (inputs, targets), = make_batches(config, batch, seq_len, count=1, seed=seed, device=device)
    census = DtypeCensus()
    with census:
        with autocast_context(precision, device):
            loss = lm_loss(model(inputs), targets)
        loss.backward()
    del model
    rows = [{"op": op, "dtype": dtype, "calls": n} for (op, dtype), n in census.calls.items()]
    return pd.DataFrame(rows).sort_values(["calls", "op"], ascending=[False, True]).reset_index(drop=True)


def ops_in(census: pd.DataFrame, dtype: str) -> set[str]:
    """The operators of a :func:`dtype_census` table that computed in ``dtype`` at least once."""
    return set(census.loc[census["dtype"] == dtype, "op"])


# --------------------------------------------------------------------------------------------------
# The allocator with and without expandable segments (a fresh process each)
# --------------------------------------------------------------------------------------------------

def _allocator_workload(preset: str, steps: int, seq_lens: Sequence[int], micro_batches: Sequence[int]) -> dict[str, float]:
    """Training steps whose shapes change from step to step (a sequence length and a micro-batch per step,
    as unpacked data gives): freed blocks of one shape seldom fit the next request exactly, which is where a
    caching allocator's reserved memory runs ahead of what is allocated."""
    device = dev.get_device()
    config = make_config(preset, vocab_size=VOCAB)
    seed_everything(0)
    model = build("v2", config, sdpa=False).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dev.reset_peak_memory(device)
    for i in range(steps):
        seq, micro = seq_lens[i % len(seq_lens)], micro_batches[i % len(micro_batches)]
        (inputs, targets), = make_batches(config, micro, seq, count=1, seed=i, device=device)
        lm_loss(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    dev.synchronize(device)
    stats = torch.cuda.memory_stats(device)
    return {"allocated_peak_mib": stats["allocated_bytes.all.peak"] / 2**20,
            "reserved_peak_mib": stats["reserved_bytes.all.peak"] / 2**20,
            "inactive_split_peak_mib": stats.get("inactive_split_bytes.all.peak", math.nan) / 2**20,
            "reserved_end_mib": stats["reserved_bytes.all.current"] / 2**20,
            "allocated_end_mib": stats["allocated_bytes.all.current"] / 2**20,
            "segments_end": stats.get("segment.all.current", math.nan)}


def allocator_comparison(preset: str, steps: int, seq_lens: Sequence[int], micro_batches: Sequence[int],
                         timeout_s: float = 240) -> pd.DataFrame:
    """Run :func:`_allocator_workload` in two fresh processes at once, the allocator's configuration
    variable (:func:`tinyllama.device.allocator_config_variable`) unset and set to expandable segments, and
    return one row each. Memory only is compared (the two processes share the GPU, so nothing is timed)."""
    variable = dev.allocator_config_variable()
    args = [sys.executable, "-m", __name__, "allocator", preset, str(steps), ",".join(map(str, seq_lens)),
            ",".join(map(str, micro_batches))]
    processes = {}
    for expandable in (False, True):
        env = dict(os.environ)
        env.pop(variable, None)
        if expandable:
            env[variable] = "expandable_segments:True"
        processes[expandable] = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                 text=True)
    rows = []
    for expandable, process in processes.items():
        stdout, stderr = process.communicate(timeout=timeout_s)
        if process.returncode != 0:
            raise RuntimeError(f"the allocator workload failed ({variable} "
                               f"{'expandable_segments:True' if expandable else 'unset'}):\n{stderr[-2000:]}")
        rows.append({"setting": f"{variable}=expandable_segments:True" if expandable else f"{variable} unset",
                     **json.loads(stdout.strip().splitlines()[-1])})
    out = pd.DataFrame(rows).set_index("setting")
    out["reserved_over_allocated"] = out["reserved_peak_mib"] / out["allocated_peak_mib"]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tinyllama.course.finetune_microbench allocator PRESET STEPS SEQS MICROS``: one allocator
    workload in this fresh process, its figures as one JSON line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 5 or argv[0] != "allocator":
        print("usage: python -m tinyllama.course.finetune_microbench allocator PRESET STEPS SEQ,SEQ,.. MB,MB,..",
              file=sys.stderr)
        return 2
    if dev.get_device().type != "cuda":
        print("the allocator comparison needs a GPU (CUDA or ROCm): a CPU has no caching allocator", file=sys.stderr)
        return 1
    _, preset, steps, seqs, micros = argv
    figures = _allocator_workload(preset, int(steps), [int(s) for s in seqs.split(",")],
                                  [int(m) for m in micros.split(",")])
    print(json.dumps(figures))
    return 0


__all__ = ["DtypeCensus", "MicrobenchSizes", "SIZES", "allocator_comparison", "attention_benchmark", "diagnose_step",
           "dtype_census", "eager_band", "fp16_scaler_demo", "loader_benchmark", "micro_batch_sweep", "ops_in",
           "sizes_for"]

if __name__ == "__main__":
    raise SystemExit(main())
