"""Many training configurations, one process, one table: the sweep behind the fine-tuning lab.

Each :class:`RunConfig` (model version and switches, precision, micro-batch and accumulation steps,
sequence length, loader workers, gradient checkpointing) is trained from the same initial weights on
the same text (``tinyllama.data``) for the same number of optimizer steps with
``tinyllama.harness.bench.run_benchmark``, then evaluated on held-out text. :func:`run_sweep` returns one
DataFrame row per configuration: step time (median and spread), the wait for data, tokens/s, peak
memory (allocated, requested and reserved: ``memory_estimate.allocator_peaks``) beside the estimate of
``tinyllama.costs.memory_estimate``, the loss curve and the held-out loss.
A configuration that runs out of memory is recorded as such (``status``) and the sweep goes on.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping, Sequence

import pandas as pd
import torch

from tinyllama import device as dev
from tinyllama.config import BenchmarkError, autocast_context, check_precision, resolve_config
from tinyllama.costs.memory_estimate import allocator_peaks, estimate_memory, model_layout
from tinyllama.data import ByteTokenizer, Corpus, TokenWindows, make_loader, validation_batches
from tinyllama.harness.bench import endless, run_benchmark
from tinyllama.harness.cli import progress_bar, say
from tinyllama.models import build, lm_loss
from tinyllama.timing import Band, Stats, summarize, time_in_turns
from tinyllama.training import TrainingStep, seed_everything

STATUS_OK = "ok"
STATUS_OOM = "out of memory"
MEASURED = ("step_ms", "step_ms_p10", "step_ms_p90", "step_ms_median_low", "step_ms_median_high",
            "step_ms_p10_low", "step_ms_p10_high", "data_ms", "forward_ms", "backward_ms", "optimizer_ms",
            "tokens_per_s", "peak_memory_mib", "requested_peak_mib", "reserved_peak_mib", "train_loss", "eval_loss")


@dataclass(frozen=True)
class RunConfig:
    """One training configuration of a sweep. The effective batch (sequences per optimizer step) is
    ``micro_batch * accumulation_steps``."""

    name: str
    version: str = "v2"
    preset: str = "small"
    model_options: dict[str, Any] = field(default_factory=dict)
    precision: str = "fp32"
    micro_batch: int = 8
    accumulation_steps: int = 1
    seq_len: int = 256
    num_workers: int = 0
    checkpointing: bool = False
    pin_memory: bool | None = None  # None: pinned where there is a GPU
    prefetch_factor: int = 2

    def __post_init__(self) -> None:
        check_precision(self.precision)
        if self.micro_batch < 1 or self.accumulation_steps < 1 or self.seq_len < 1 or self.num_workers < 0:
            raise ValueError(f"{self.name}: micro_batch, accumulation_steps and seq_len must be at least 1 and "
                             "num_workers at least 0")

    @property
    def effective_batch(self) -> int:
        return self.micro_batch * self.accumulation_steps

    def but(self, name: str, **changes: Any) -> "RunConfig":
        """A copy named ``name`` with ``changes`` (the next phase of a tuning: one setting changed)."""
        return replace(self, name=name, **changes)

    def describe(self) -> str:
        options = ", ".join(f"{k}={v}" for k, v in self.model_options.items())
        return (f"{self.version}{f' ({options})' if options else ''} {self.precision}, micro-batch {self.micro_batch} x "
                f"{self.accumulation_steps} steps (effective {self.effective_batch}), seq {self.seq_len}, "
                f"{self.num_workers} loader workers, checkpointing {'on' if self.checkpointing else 'off'}")


def evaluate(model: torch.nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], precision: str,
             device: torch.device) -> float:
    """Mean next-token loss of ``model`` over ``batches`` (no gradients, at ``precision``)."""
    model.eval()
    total = 0.0
    with torch.no_grad(), autocast_context(precision, device):
        for inputs, targets in batches:
            total += float(lm_loss(model(inputs.to(device)), targets.to(device)))
    model.train()
    return total / len(batches)


def _step_columns(stats: Stats) -> dict[str, float]:
    """A row's step-time columns (what :func:`step_band` reads back) from the step times' :class:`Stats`."""
    return {"step_ms": stats.median, "step_ms_p10": stats.p10, "step_ms_p90": stats.p90,
            "step_ms_median_low": stats.median_low, "step_ms_median_high": stats.median_high,
            "step_ms_p10_low": stats.p10_low, "step_ms_p10_high": stats.p10_high}


def run_config(config: RunConfig, corpus: Corpus, *, steps: int, warmup_steps: int = 2, lr: float = 1e-3,
               seed: int = 0, device: torch.device | str | None = None, eval_batches: int = 4,
               eval_batch_size: int = 8) -> dict[str, Any]:
    """Train ``config`` for ``warmup_steps + steps`` optimizer steps from weights seeded by ``seed``
    and return its row (see the module docstring). The held-out loss is the mean over the first
    ``eval_batches`` batches of ``eval_batch_size`` held-out windows (at the configuration's sequence
    length): the same text for every configuration of that length. Out of memory gives a row with ``status`` set to
    ``"out of memory"``; other errors propagate."""
    device = dev.get_device(None if device is None else str(device))
    tokenizer = ByteTokenizer()
    model_config, _, _ = resolve_config(config.preset, config.micro_batch, config.seq_len,
                                        vocab_size=tokenizer.vocab_size)
    row: dict[str, Any] = {"name": config.name, **{k: v for k, v in asdict(config).items() if k != "name"},
                           "effective_batch": config.effective_batch, "steps": steps, "status": STATUS_OK}
    row["model_options"] = dict(config.model_options)
    # Every column exists in every row (NaN where a configuration ran out of memory).
    row.update({column: math.nan for column in MEASURED})
    row.update({"losses": [], "error": ""})
    model = None
    try:
        seed_everything(seed)  # the same initial weights for every configuration of a sweep
        model = build(config.version, model_config, **config.model_options)
        loader = make_loader(TokenWindows(corpus.train, config.seq_len, tokenizer), config.micro_batch,
                             num_workers=config.num_workers, pin_memory=config.pin_memory,
                             prefetch_factor=config.prefetch_factor, seed=seed)
        result = run_benchmark(config.version, config.preset, batch_size=config.micro_batch, seq_len=config.seq_len,
                               precision=config.precision, num_steps=steps, warmup_steps=warmup_steps, seed=seed,
                               device=device, model=model, loader=loader, accumulation_steps=config.accumulation_steps,
                               gradient_checkpointing=config.checkpointing, lr=lr, progress=False,
                               vocab_size=tokenizer.vocab_size)
        peaks = allocator_peaks(device)  # read before the evaluation allocates anything
        held_out = validation_batches(corpus, config.seq_len, eval_batch_size, eval_batches)
        row.update({
            **_step_columns(result.step_ms),
            "data_ms": result.data_ms.median if result.data_ms else math.nan,
            "forward_ms": result.forward_ms.median, "backward_ms": result.backward_ms.median,
            "optimizer_ms": result.optimizer_ms.median, "tokens_per_s": result.tokens_per_s,
            "peak_memory_mib": result.peak_memory_mib if result.peak_memory_mib is not None else math.nan,
            "requested_peak_mib": peaks["requested_peak_mib"], "reserved_peak_mib": peaks["reserved_peak_mib"],
            "losses": result.losses, "train_loss": sum(result.losses[-5:]) / len(result.losses[-5:]),
            "eval_loss": evaluate(model, held_out, config.precision, device),
        })
    except BenchmarkError as error:  # run_benchmark's out-of-memory, already freed
        row.update({"status": STATUS_OOM, "error": str(error)})
    except Exception as error:  # noqa: BLE001 - only out-of-memory is recorded, the rest re-raised
        if not dev.is_out_of_memory(error):
            raise
        row.update({"status": STATUS_OOM, "error": str(error).splitlines()[0]})
    try:
        if model is None:  # out of memory while building: the shapes suffice (meta tensors hold no memory)
            with torch.device("meta"):
                model = build(config.version, model_config, **config.model_options)
        layout = model_layout(model, device, config.precision)
        fused = bool(getattr(model, "fused_optimizer", False)) and device.type == "cuda"
        estimate = estimate_memory(model_config, config.micro_batch, config.seq_len, config.precision, layout,
                                   model_config.num_layers if config.checkpointing else 0, fused_optimizer=fused)
        row["estimated_peak_mib"] = estimate.peak_bytes() / 2**20
        row["estimated_activations_mib"] = estimate.activations / 2**20
    except ValueError:  # a version the estimator does not cover (V3)
        row["estimated_peak_mib"] = row["estimated_activations_mib"] = math.nan
    del model
    dev.free_memory(device)
    return row


def time_side_by_side(configs: Sequence[RunConfig], corpus: Corpus, *, rounds: int = 20, steps_per_round: int = 2,
                      warmup_steps: int = 2, lr: float = 1e-3, seed: int = 0,
                      device: torch.device | str | None = None, progress: bool = True) -> dict[str, Stats]:
    """The optimizer-step times of ``configs``, timed in turns (:func:`tinyllama.timing.time_in_turns`): every
    configuration is built and warmed up, then each of ``rounds`` rounds gives every one ``steps_per_round``
    steps, in an order that rotates from round to round. Every configuration lives on the device at once:
    run the ones that fit alone (:func:`run_config` says which) through it. Returns each configuration's
    step times (ms) by name."""
    if rounds < 1 or steps_per_round < 1:
        raise ValueError(f"rounds and steps_per_round must be at least 1 (got {rounds}, {steps_per_round})")
    device = dev.get_device(None if device is None else str(device))
    tokenizer = ByteTokenizer()
    calls = {}
    for config in configs:
        model_config, _, _ = resolve_config(config.preset, config.micro_batch, config.seq_len,
                                            vocab_size=tokenizer.vocab_size)
        seed_everything(seed)
        model = build(config.version, model_config, **config.model_options).to(device).train()
        model.set_gradient_checkpointing(config.checkpointing)
        loader = make_loader(TokenWindows(corpus.train, config.seq_len, tokenizer), config.micro_batch,
                             num_workers=config.num_workers, pin_memory=config.pin_memory,
                             prefetch_factor=config.prefetch_factor, seed=seed,
                             persistent_workers=config.num_workers > 0)
        step, source = TrainingStep(model, config.precision, device, lr=lr), endless(loader)
        calls[config.name] = (lambda step=step, source=source, n=config.accumulation_steps: step.accumulate(source, n))
    samples = time_in_turns(calls, device, rounds=rounds, per_turn=steps_per_round, warmup=warmup_steps,
                            progress=(lambda r: progress_bar(r, "side by side")) if progress else None)
    del calls
    dev.free_memory(device)
    return {name: summarize(ms) for name, ms in samples.items()}


def run_sweep(configs: Sequence[RunConfig], corpus: Corpus, *, steps: int, warmup_steps: int = 2,
              lr: float = 1e-3, seed: int = 0, device: torch.device | str | None = None, eval_batches: int = 4,
              eval_batch_size: int = 8, progress: bool = True, side_by_side_rounds: int = 0,
              steps_per_round: int = 2) -> pd.DataFrame:
    """Run every configuration in this process (see :func:`run_config`) and return one row each, in
    order. Names must be unique (they index the table).

    With ``side_by_side_rounds`` above 0, the step times of the rows (``step_ms``, its spread and interval,
    ``tokens_per_s``) come from :func:`time_side_by_side` of the configurations that ran, after their
    training (which still gives the losses, the memory and the wait for data): the times to compare them by."""
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise ValueError(f"configuration names must be unique: {names}")
    rows = [run_config(config, corpus, steps=steps, warmup_steps=warmup_steps, lr=lr, seed=seed, device=device,
                       eval_batches=eval_batches, eval_batch_size=eval_batch_size)
            for config in progress_bar(configs, "sweep" if progress else None)]
    ran = [config for config, row in zip(configs, rows) if row["status"] == STATUS_OK]
    if side_by_side_rounds and len(ran) > 1:
        try:
            times = time_side_by_side(ran, corpus, rounds=side_by_side_rounds, steps_per_round=steps_per_round,
                                      warmup_steps=warmup_steps, lr=lr, seed=seed, device=device, progress=progress)
        except Exception as error:  # noqa: BLE001 - only out-of-memory is reported, the rest re-raised
            if not dev.is_out_of_memory(error):
                raise
            dev.free_memory(dev.get_device(None if device is None else str(device)))
            say(f"timing in turns ran out of memory with {len(ran)} configurations on the device at once: the step "
                "times below are those of their training, one after the other, and follow the host's drift "
                "(compare fewer configurations at a time)")
            times = {}
        for config, row in zip(configs, rows):
            if config.name in times:
                stats = times[config.name]
                row.update({**_step_columns(stats),
                            "tokens_per_s": config.effective_batch * config.seq_len / (stats.median / 1e3)})
    return pd.DataFrame(rows)


def compare_with(table: pd.DataFrame, baseline: pd.Series | dict[str, Any], reference_loss: float,
                 tolerance: float) -> pd.DataFrame:
    """``table`` with each configuration measured against ``baseline`` (a row of a sweep, measured in
    the same process) and its loss against ``reference_loss``:

    - ``step_speedup``: baseline step time / this step time (per optimizer step, the guide's seconds
      per iteration); ``throughput_speedup``: tokens/s over the baseline's (they differ when a
      configuration changes the tokens per step, as a shorter sequence does);
    - ``memory_ratio``: peak memory over the baseline's (NaN without allocator statistics, on a CPU);
    - ``estimate_error_pct``: the estimated peak against the measured one;
    - ``loss_change_pct`` and ``converged``: the held-out loss against ``reference_loss``, within
      ``tolerance`` (relative) or not. Out-of-memory rows get NaN and ``converged`` False.
    """
    out = table.copy()
    base = dict(baseline)
    out["step_speedup"] = base["step_ms"] / out["step_ms"]
    out["throughput_speedup"] = out["tokens_per_s"] / base["tokens_per_s"]
    out["memory_ratio"] = out["peak_memory_mib"] / base["peak_memory_mib"]
    out["estimate_error_pct"] = 100 * (out["estimated_peak_mib"] - out["peak_memory_mib"]) / out["peak_memory_mib"]
    out["loss_change_pct"] = 100 * (out["eval_loss"] - reference_loss) / reference_loss
    out["converged"] = (out["loss_change_pct"].abs() <= 100 * tolerance) & (out["status"] == STATUS_OK)
    return out


def step_band(row: pd.Series | Mapping[str, Any]) -> Band:
    """The step time of a sweep row (``step_ms``, its ``step_ms_p10``/``step_ms_p90`` and, where the row
    has them, the confidence intervals of its median, ``step_ms_median_low``/``_high``, and of its p10,
    ``step_ms_p10_low``/``_high``) as the :class:`~tinyllama.timing.Band` that
    :func:`tinyllama.timing.verdict` compares. A row that ran out of memory gives a band of NaN, which no
    verdict calls faster or slower."""
    def get(column: str) -> float:
        return float(row.get(column, math.nan))

    return Band(get("step_ms"), get("step_ms_p10"), get("step_ms_p90"), get("step_ms_median_low"),
                get("step_ms_median_high"), get("step_ms_p10_low"), get("step_ms_p10_high"))


__all__ = ["RunConfig", "STATUS_OK", "STATUS_OOM", "compare_with", "evaluate", "run_config",
           "run_sweep", "step_band", "time_side_by_side"]
