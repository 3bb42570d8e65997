"""The generation benchmark: check, then time prefill and decode apart; a decode step's bandwidth
against the measured copy bandwidth (``tinyllama.costs.ceilings``)."""

from __future__ import annotations

import datetime as _dt
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import pandas as pd
import torch

from tinyllama import device as dev
from tinyllama.config import BenchmarkError, ConfigError, ModelConfig, get_preset, make_config
from tinyllama.correctness import CorrectnessError
from tinyllama.costs.ceilings import measure_copy_tbs
from tinyllama.generation.check import check_generation
from tinyllama.generation.costs import decode_bytes, decode_flops
from tinyllama.generation.runners import (
    DTYPES,
    CachedDecoder,
    Runner,
    Sampling,
    cast_for_inference,
    decode_loop,
    make_runner,
)
from tinyllama.models import VERSIONS, build, model_class, transfer_weights
from tinyllama.timing import PhaseTimer, Stats, summarize


def check_init_std(config: ModelConfig) -> float:
    """The weights' standard deviation for a checked run: 1/sqrt(hidden), which gives attention scores and
    logits of unit scale at every size. Training's 0.02 makes attention nearly uniform, so a token rotated
    to the wrong position would hardly change the logits; a larger fixed value (0.1) saturates the softmax
    of the large presets, where bf16 rounding then swings the logits. Speed does not depend on it."""
    return config.hidden_dim ** -0.5


CHECK_BATCH, CHECK_TOKENS = 4, 32  # the check's size: the fp32 reference recomputes every sequence in full


def time_generation(runner: Runner, prompt: torch.Tensor, new_tokens: int, warmup: int, repeat: int,
                    device: torch.device) -> tuple[list[float], Stats, Stats]:
    """Greedy generations of ``new_tokens``: ``warmup`` untimed (compilation, capture; each timed whole on
    the host clock and returned), then ``repeat`` timed with device events, each split into its prefill
    and its decode steps. Returns the warm-up ms, prefill ms and decode ms per step (per token)."""
    pick = Sampling().pick
    warmup_ms = []
    for _ in range(warmup):
        dev.synchronize(device)
        began = time.perf_counter()
        decode_loop(runner, prompt, new_tokens, pick)
        dev.synchronize(device)
        warmup_ms.append((time.perf_counter() - began) * 1e3)
    timer = PhaseTimer(device)
    prefill, decode = [], []
    for _ in range(repeat):
        timer.start()
        decode_loop(runner, prompt, new_tokens, pick, timer)
        phases = timer.stop()
        prefill.append(phases["prefill"])
        decode.append(phases["decode"] / (new_tokens - 1))
    return warmup_ms, summarize(prefill), summarize(decode)


@dataclass
class GenerationResult:
    """What one generation benchmark measured. ``to_dict()`` gives one flat record."""

    version: str
    preset: str
    precision: str
    mode: str
    device: str
    backend: str
    batch_size: int
    prompt_len: int
    new_tokens: int
    config: dict[str, Any]
    num_parameters: int
    cache_bytes: int
    warmup_ms: list[float]
    prefill_ms: Stats
    decode_ms: Stats  # per decode step, i.e. per token of each sequence
    decode_tokens_per_s: float  # batch / decode step time
    tokens_per_s: float  # batch * new_tokens / (prefill + all decode steps)
    mean_context: float  # positions a decode step attends to, averaged over the steps
    decode_bytes: float  # decode_bytes() at each step's context, averaged
    decode_flops: float
    achieved_gbs: float
    achieved_tflops: float
    copy_gbs: float  # measured device-to-device copy, read + written (tinyllama.costs.ceilings)
    check: str | None
    torch_version: str = torch.__version__
    timestamp: str = field(default_factory=lambda: _dt.datetime.now().isoformat(timespec="seconds"))
    command: str = "generate"

    @property
    def copy_fraction(self) -> float:
        return self.achieved_gbs / self.copy_gbs

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if isinstance(getattr(self, key), Stats):
                out.update(getattr(self, key).as_dict(prefix=f"{key}_"))
            elif key == "config":
                out.update({f"config_{k}": v for k, v in value.items()})
            else:
                out[key] = value
        out["copy_fraction"] = self.copy_fraction
        return out

    def summary(self) -> str:
        p, d = self.prefill_ms, self.decode_ms
        return "\n".join([
            f"TinyLLaMA {self.version} generation | {self.preset} | {self.precision} | {self.mode} | {self.device}",
            f"  batch {self.batch_size}, prompt {self.prompt_len} + {self.new_tokens} new tokens, "
            f"{self.num_parameters / 1e6:.3g}M parameters, cache {self.cache_bytes / 2**20:.3g} MiB",
            *([f"  {self.check}"] if self.check else []),
            f"  warm-up: {', '.join(f'{w:.1f}' for w in self.warmup_ms)} ms per generation",
            f"  prefill: {p.median:.3f} ms median (p10 {p.p10:.3f}, p90 {p.p90:.3f}, n={p.n})",
            f"  decode: {d.median:.3f} ms/token median (p10 {d.p10:.3f}, p90 {d.p90:.3f}, spread {d.spread_pct:.0f}%)",
            f"  {self.decode_tokens_per_s:,.0f} tokens/s in decode, {self.tokens_per_s:,.0f} tokens/s with the prefill",
            f"  a decode step must move {self.decode_bytes / 1e6:.4g} MB (mean context {self.mean_context:.0f}): "
            f"{self.achieved_gbs:.4g} GB/s = {100 * self.copy_fraction:.3g}% of the measured copy bandwidth "
            f"{self.copy_gbs:.4g} GB/s",
            f"  a decode step does {self.decode_flops / 1e9:.4g} GFLOP: {self.achieved_tflops:.3g} TFLOP/s",
        ])


def mode_name(use_cache: bool, compile: bool, cuda_graph: bool) -> str:
    """"no cache", "cache eager", "cache compile", "cache CUDA graph", "cache compile + CUDA graph"."""
    if not use_cache:
        return "no cache"
    parts = [name for name, on in (("compile", compile), ("CUDA graph", cuda_graph)) if on]
    return "cache " + (" + ".join(parts) or "eager")


def _validate(version: str, batch_size: int, prompt_len: int, new_tokens: int, precision: str, use_cache: bool,
              compile: bool, cuda_graph: bool, warmup: int, repeat: int, config: ModelConfig, preset: str) -> None:
    """One ``ConfigError`` sentence for the first bad setting, before anything is built."""
    if version not in VERSIONS:
        raise ConfigError(f"unknown version {version!r}: choose one of {', '.join(VERSIONS)}")
    if precision not in DTYPES:
        raise ConfigError(f"unknown precision {precision!r}: choose one of {', '.join(DTYPES)}")
    if batch_size < 1 or prompt_len < 1:
        raise ConfigError(f"batch size and prompt length must be at least 1 (got {batch_size}, {prompt_len})")
    if new_tokens < 2:
        raise ConfigError(f"new tokens must be at least 2 to time a decode step (got {new_tokens})")
    if not use_cache and (compile or cuda_graph):
        raise ConfigError("compile and CUDA graphs apply to the cached decode step, not to recomputation "
                          "without a cache (--no-cache): drop one or the other")
    if warmup < 1 or repeat < 1:
        raise ConfigError(f"need at least 1 warm-up and 1 timed generation (got {warmup}, {repeat})")
    if prompt_len + new_tokens > config.max_seq_len:
        raise ConfigError(f"prompt {prompt_len} + {new_tokens} new tokens exceed max_seq_len {config.max_seq_len} "
                          f"of preset {preset}: shorten the prompt or generate fewer tokens")


def run_generation_benchmark(version: str = "v1", preset: str = "ci", *, batch_size: int | None = None,
                             prompt_len: int | None = None, new_tokens: int = 32, precision: str = "fp32",
                             use_cache: bool = True, compile: bool = False, cuda_graph: bool = False,
                             check: bool = False, warmup: int = 2, repeat: int = 10, seed: int = 0,
                             device: torch.device | str | None = None, progress: bool = True,
                             **config_overrides: Any) -> GenerationResult:
    """Build ``version`` at ``preset`` with random weights, optionally check its generation against the
    fp32 no-cache reference (on at most ``CHECK_BATCH`` x ``CHECK_TOKENS``; ``CorrectnessError`` if wrong,
    before anything is timed), then time greedy generations of a random prompt: prefill and decode apart.
    Raises ``ConfigError`` for bad settings and ``BenchmarkError`` when the device runs out of memory."""
    chosen = get_preset(preset)
    batch_size = chosen.batch_size if batch_size is None else batch_size
    prompt_len = chosen.seq_len if prompt_len is None else prompt_len
    config = make_config(preset, **config_overrides)
    _validate(version, batch_size, prompt_len, new_tokens, precision, use_cache, compile, cuda_graph, warmup, repeat,
              config, preset)
    device = dev.get_device(None if device is None else str(device))
    if cuda_graph and device.type != "cuda":
        raise ConfigError("--cuda-graphs needs a GPU (CUDA or ROCm) and this run is on the CPU: run without it")
    mode = mode_name(use_cache, compile, cuda_graph)
    if progress:
        print(f"measuring the copy bandwidth of {dev.device_name(device)} ...", flush=True)
    copy_gbs = measure_copy_tbs(device=device).value * 1e3
    try:
        torch.manual_seed(seed)
        options = {"compile": False} if "compile" in model_class(version).switch_names else {}
        model = build(version, config, **options).to(device)
        model.reset_parameters(check_init_std(config))
        prompt = torch.randint(0, config.vocab_size, (batch_size, prompt_len),
                               generator=torch.Generator().manual_seed(seed)).to(device)
        # The reference is V1 in fp32 with the same weights, copied before the model is cast.
        reference = transfer_weights(model, build("v1", config)).to(device).eval() if check else None
        cast_for_inference(model, precision)
        verdict = None
        if reference is not None:
            b, n = min(batch_size, CHECK_BATCH), min(new_tokens, CHECK_TOKENS)
            if progress:
                print(f"checking {mode} against the fp32 no-cache reference ({b} x {n} tokens) ...", flush=True)
            # The timed run's capacity: a static step of the same shape, compiled once for both up to CHECK_BATCH.
            runner = make_runner(model, b, prompt_len + new_tokens, use_cache=use_cache, compile=compile,
                                 cuda_graph=cuda_graph)
            result = check_generation(runner, reference, prompt[:b], n, precision)
            del reference, runner
            if not result.passed:
                raise CorrectnessError(result.summary() + ": not timed")
            verdict = result.summary()
        runner = make_runner(model, batch_size, prompt_len + new_tokens, use_cache=use_cache, compile=compile,
                             cuda_graph=cuda_graph)
        if progress:
            print(f"timing {mode}: {warmup} warm-up and {repeat} timed generations ...", flush=True)
        with torch.no_grad():
            warmup_ms, prefill, decode = time_generation(runner, prompt, new_tokens, warmup, repeat, device)
    except Exception as error:  # noqa: BLE001 - only out-of-memory is translated, the rest re-raised
        if not dev.is_out_of_memory(error):
            raise
        dev.free_memory(device)
        raise BenchmarkError(f"out of memory on {dev.device_name(device)} at batch {batch_size} with "
                             f"{prompt_len} + {new_tokens} tokens ({version}, {precision}, {mode}): try a smaller "
                             f"--batch-size ({max(1, batch_size // 2)})") from None
    # Decode step i attends to prompt_len + i + 1 positions; bytes and FLOPs are linear in it.
    contexts = [prompt_len + i + 1 for i in range(new_tokens - 1)]
    dtype = DTYPES[precision]
    step_bytes = statistics.fmean(decode_bytes(config, batch_size, c, dtype) for c in contexts)
    step_flops = statistics.fmean(decode_flops(config, batch_size, c) for c in contexts)
    step_s = decode.median / 1e3
    total_s = (prefill.median + decode.median * (new_tokens - 1)) / 1e3
    cache_bytes = runner.cache.nbytes if isinstance(runner, CachedDecoder) else 0
    return GenerationResult(
        version=version, preset=preset, precision=precision, mode=mode, device=dev.device_name(device),
        backend=dev.backend() if device.type == "cuda" else "cpu", batch_size=batch_size, prompt_len=prompt_len,
        new_tokens=new_tokens, config=config.to_dict(), num_parameters=config.num_parameters(),
        cache_bytes=cache_bytes, warmup_ms=warmup_ms, prefill_ms=prefill, decode_ms=decode,
        decode_tokens_per_s=batch_size / step_s, tokens_per_s=batch_size * new_tokens / total_s,
        mean_context=statistics.fmean(contexts), decode_bytes=step_bytes, decode_flops=step_flops,
        achieved_gbs=step_bytes / step_s / 1e9, achieved_tflops=step_flops / step_s / 1e12, copy_gbs=copy_gbs,
        check=verdict,
    )


TABLE_COLUMNS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "preset": lambda r: r["preset"], "version": lambda r: r["version"], "precision": lambda r: r["precision"],
    "mode": lambda r: r["mode"], "batch": lambda r: r["batch_size"], "prefill ms": lambda r: r["prefill_ms_median"],
    "decode ms/token": lambda r: r["decode_ms_median"], "p10-p90 spread %": lambda r: r["decode_ms_spread_pct"],
    "decode tokens/s": lambda r: r["decode_tokens_per_s"], "GB/s": lambda r: r["achieved_gbs"],
    "% of copy GB/s": lambda r: 100 * r["copy_fraction"],
}


def summary_table(records: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """The :data:`TABLE_COLUMNS` of generation records (``GenerationResult.to_dict()``), one row each (pandas;
    :func:`tinyllama.harness.records.markdown_table` writes it as markdown)."""
    return pd.DataFrame([{name: column(r) for name, column in TABLE_COLUMNS.items()} for r in records],
                        columns=list(TABLE_COLUMNS))
