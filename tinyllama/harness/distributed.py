"""Data-parallel training of TinyLLaMA on several processes, one per GPU: PyTorch's DDP or FSDP2,
started by torchrun.

    torchrun --nproc-per-node 2 -m tinyllama.harness.distributed --strategy ddp --preset medium --precision bf16 \\
        --batch-size 32 --json runs.json

``--batch-size`` is the **global** batch: every rank takes ``batch / world_size`` sequences of each
global batch through a ``DistributedSampler`` (over the synthetic token source here, over any
map-style dataset of ``(inputs, targets)`` pairs through ``run_distributed(dataset=...)``), so that N
ranks see exactly the sequences one process sees, split in disjoint parts. With the same seed and
global batch, N ranks therefore compute the loss curve and the weights of one process (DDP averages
the gradients: equal up to fp32 rounding; ``tests/test_distributed.py`` checks it).

- ``ddp``: ``DistributedDataParallel``: every rank keeps the whole model, its gradients and AdamW's
  state; the gradients are averaged with all-reduce, bucket by bucket, during the backward.
- ``fsdp``: FSDP2 (``fully_shard``, each decoder block and then the whole model): every rank keeps
  1/N of the weights, gradients and optimizer state; a block's weights are all-gathered just before
  it runs and its gradients reduce-scattered after. In bf16 with a mixed-precision policy (bf16
  gathers, fp32 reduce-scatter);
- ``fsdp-fp32``: the same FSDP2 without that policy (fp32 gathers under autocast), for the comparison
  of the two in one launch (``--strategy fsdp fsdp-fp32``).
- ``zero1``: DDP with ``torch.distributed.optim.ZeroRedundancyOptimizer``: the gradients all-reduced as
  in DDP, AdamW's state sharded over the ranks (ZeRO stage 1); each rank updates its shard of the
  weights and broadcasts it to the others.

A strategy takes variants after a colon, ``BASE:key=value,key=value`` (:func:`parse_strategy`):
``bucket_cap_mb`` (DDP's bucket size, MiB), ``accumulate`` (micro-batches per optimizer step) and
``no_sync`` (1: DDP all-reduces only the last micro-batch's backward of each step) for ``ddp`` and
``zero1``; ``reshard_after_forward`` (0: FSDP2 keeps each block's gathered weights from its forward to
its backward, like ZeRO stage 2; 1, the default: frees them, stage 3) for ``fsdp``. A variant also
counts DDP's bucket all-reduces (a communication hook that calls the default one). Variants are timed,
not profiled. Several strategies in one launch are trained one after the other (losses, memory), then
timed again in turns (``--turns``, :func:`time_runs_in_turns`): those are the step times they are compared by.

Each rank measures what ``tinyllama.harness.bench`` measures on one GPU (step time and its phases, tokens/s,
memory), after a correctness check and warm-up; rank 0 gathers every rank's figures and adds the
global ones: tokens/s over the slowest rank, scaling efficiency against a 1-GPU run of the same
per-GPU batch (``--baseline-tokens-per-s``), and the communication time read from a PyTorch profile
of a few more steps on every rank: per rank, the time its collectives ran, split into the transfer
(after the last rank arrived: the same on every rank) and the wait for the other ranks (skew), and
the part not hidden behind compute, all set against the profiled steps' own wall time
(``tinyllama.profiling.communication``).

Errors end every rank with one line (``error (rank 1/2): ...``) instead of a hang: bad settings are
refused before any rank waits for another, every collective has a timeout (``--timeout-s``), and a
rank that torchrun stops because another failed says so.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import signal
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from tinyllama import device as dev
from tinyllama.config import BenchmarkError, ConfigError, check_precision, resolve_config
from tinyllama.correctness import CorrectnessError, check_every_parameter_trained
from tinyllama.harness import process_group
from tinyllama.harness.bench import TURNS_MEMORY_SHARE, _time_steps
from tinyllama.harness.cli import (
    add_model_arguments,
    add_problem_size_arguments,
    add_run_arguments,
    parse_option,
    progress_bar,
    say,
    shape_overrides,
)
from tinyllama.harness.process_group import DistContext
from tinyllama.models import VERSIONS, build
from tinyllama.timing import Stats, summarize, time_in_turns
from tinyllama.training import DATA_PHASES, TrainingStep, configure_determinism

STRATEGIES = ("ddp", "fsdp", "fsdp-fp32", "zero1")
# The options a variant may set, per base strategy, and how each is read from its text.
VARIANT_OPTIONS: dict[str, dict[str, Callable[[str], Any]]] = {
    "ddp": {"bucket_cap_mb": float, "accumulate": int, "no_sync": lambda v: bool(int(v))},
    "zero1": {"bucket_cap_mb": float, "accumulate": int},
    "fsdp": {"reshard_after_forward": lambda v: bool(int(v)), "accumulate": int},
    "fsdp-fp32": {"reshard_after_forward": lambda v: bool(int(v)), "accumulate": int},
}


class RankFailure(RuntimeError):
    """A rank stopped on purpose (``--fail-rank``), to show what the others do when one fails."""


# ------------------------------------------------------------------------------------------------
# Data: a map-style dataset, split across ranks by a DistributedSampler
# ------------------------------------------------------------------------------------------------


class SyntheticTokens(Dataset):
    """``num_samples`` sequences of random token ids and their next-token targets, drawn once from a
    seeded generator: sample ``i`` is the same on every rank, in every run with the same seed."""

    def __init__(self, vocab_size: int, seq_len: int, num_samples: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab_size, (num_samples, seq_len + 1), generator=generator)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.tokens[index]
        return row[:-1], row[1:]


def rank_loader(dataset: Dataset, local_batch: int, ctx: DistContext, *, shuffle: bool = False, seed: int = 0,
                num_workers: int = 0) -> DataLoader:
    """This rank's ``DataLoader``: a ``DistributedSampler`` gives rank ``r`` the samples ``r, r + N,
    r + 2N, ...`` (of a permutation, with ``shuffle``), so that step ``k`` of the N ranks together
    covers samples ``k*G .. (k+1)*G - 1`` of one process with the global batch ``G = N * local_batch``."""
    sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=shuffle, seed=seed,
                                 drop_last=True)
    return DataLoader(dataset, batch_size=local_batch, sampler=sampler, drop_last=True, num_workers=num_workers)


# ------------------------------------------------------------------------------------------------
# Wrapping the model
# ------------------------------------------------------------------------------------------------


def _fully_shard() -> Callable[..., Any] | None:
    try:  # public from PyTorch 2.6
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        try:  # PyTorch 2.4-2.5
            from torch.distributed._composable.fsdp import fully_shard
        except ImportError:
            return None
    return fully_shard


def fsdp_available() -> bool:
    """Whether this PyTorch has FSDP2 (``fully_shard``)."""
    return _fully_shard() is not None


def parse_strategy(strategy: str) -> tuple[str, dict[str, Any]]:
    """``"ddp:bucket_cap_mb=5,accumulate=4"`` -> ``("ddp", {"bucket_cap_mb": 5.0, "accumulate": 4})``.
    Raises ``ConfigError`` for an unknown base, option or value."""
    base, _, rest = strategy.partition(":")
    if base not in STRATEGIES:
        raise ConfigError(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    allowed = VARIANT_OPTIONS[base]
    options: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, equals, value = item.partition("=")
        if key not in allowed or not equals:
            raise ConfigError(f"strategy {strategy!r}: {base} takes {', '.join(f'{k}=VALUE' for k in allowed)}, "
                              f"not {item!r}")
        try:
            options[key] = allowed[key](value)
        except ValueError:
            raise ConfigError(f"strategy {strategy!r}: {key}={value!r} is not a number") from None
    if options.get("accumulate", 1) < 1 or options.get("bucket_cap_mb", 1.0) <= 0:
        raise ConfigError(f"strategy {strategy!r}: accumulate must be at least 1 and bucket_cap_mb above 0")
    return base, options


def check_strategy(strategy: str, precision: str = "fp32") -> None:
    """Raise ``ConfigError`` for an unknown strategy or variant, FSDP2 on a PyTorch without it, or ZeRO-1
    with fp16 (its gradient scaler does not know the sharded optimizer)."""
    base, _ = parse_strategy(strategy)
    if base.startswith("fsdp") and not fsdp_available():
        raise ConfigError(f"FSDP2 (fully_shard) needs PyTorch 2.4 or newer; this is {torch.__version__}: "
                          "use --strategy ddp")
    if base == "zero1" and precision == "fp16":
        raise ConfigError("zero1 runs in fp32, tf32 or bf16: fp16's gradient scaler does not support "
                          "ZeroRedundancyOptimizer")


def _mixed_precision_policy(precision: str) -> Any:
    """FSDP2's mixed-precision policy for a training precision: in bf16, weights all-gathered and computed
    in bf16, gradients reduce-scattered in fp32, fp32 shards kept for AdamW. ``None`` otherwise: fp32 and
    tf32 need none, and fp16 keeps fp32 weights under autocast, because its gradient scaler (unscale,
    the inf check) is written for plain fp32 gradients."""
    if precision != "bf16":
        return None
    dtype = torch.bfloat16
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy
    except ImportError:  # PyTorch 2.4-2.5
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def wrap(model: nn.Module, strategy: str, device: torch.device, precision: str = "fp32") -> nn.Module:
    """``model`` made data-parallel over the current process group.

    DDP keeps the gradients as views into its communication buckets (``gradient_as_bucket_view``), so
    that they are not stored twice, and does not broadcast the (constant) buffers before each forward.
    FSDP2 shards every decoder block, then the rest (embedding, final norm, output head) with the
    root: a block's weights are gathered only while it runs. In bf16 FSDP2 runs with a
    mixed-precision policy: each rank keeps fp32 shards (AdamW updates those), all-gathers the weights
    already cast to bf16 (half the bytes of fp32) and reduce-scatters the gradients in fp32 (no precision
    lost in the sum over ranks). DDP has no such policy: autocast casts its fp32 weights inside each
    operator, and it all-reduces fp32 gradients.
    """
    check_strategy(strategy, precision)
    base, variant = parse_strategy(strategy)
    if base in ("ddp", "zero1"):
        from torch.nn.parallel import DistributedDataParallel

        # broadcast_buffers=False: the model's only buffers are constant (RoPE's tables, the causal mask);
        # broadcasting them from rank 0 before every forward (DDP's default) adds a collective to each step
        # for nothing.
        extra = {"bucket_cap_mb": variant["bucket_cap_mb"]} if "bucket_cap_mb" in variant else {}
        wrapped = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                          gradient_as_bucket_view=True, broadcast_buffers=False, **extra)
        if variant:
            count_bucket_all_reduces(wrapped)
        return wrapped
    fully_shard = _fully_shard()
    assert fully_shard is not None
    policy = _mixed_precision_policy(precision) if base == "fsdp" else None  # fsdp-fp32: none
    options: dict[str, Any] = {} if policy is None else {"mp_policy": policy}
    if "reshard_after_forward" in variant:
        options["reshard_after_forward"] = variant["reshard_after_forward"]
    for block in model.layers:
        fully_shard(block, **options)
    fully_shard(model, **options)
    return model


def count_bucket_all_reduces(ddp: nn.Module) -> None:
    """Count the bucket all-reduces of a ``DistributedDataParallel`` in ``ddp.bucket_all_reduces`` (a list
    of one int), through a communication hook that does what DDP does without one (PyTorch's
    ``allreduce_hook``: divide by the world size, all-reduce)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    counter = [0]

    def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP refuses annotations other than its own types
        counter[0] += 1
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    ddp.bucket_all_reduces = counter  # type: ignore[assignment]


class NoSyncStep(TrainingStep):
    """A training step for gradient accumulation under DDP: every micro-batch but the last of an optimizer
    step runs inside ``model.no_sync()``, so that DDP only adds up the gradients locally and all-reduces
    once per step (after the last micro-batch's backward) instead of once per micro-batch."""

    _left = 1

    def accumulate(self, batches: Any, steps: int = 1, timer: Any = None) -> torch.Tensor:
        self._left = steps
        return super().accumulate(batches, steps, timer)

    def _forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor, scale: float, timer: Any) -> torch.Tensor:
        self._left -= 1
        if self._left > 0:
            with self.model.no_sync():
                return super()._forward_backward(inputs, targets, scale, timer)
        return super()._forward_backward(inputs, targets, scale, timer)


def inner_model(model: nn.Module) -> nn.Module:
    """The TinyLLaMA inside a DDP wrapper (FSDP2 keeps the module itself)."""
    return getattr(model, "module", model)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (a plain tensor is its own)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every weight, whole and on the CPU, under the plain model's names. Under FSDP2 this gathers
    the shards: every rank must call it."""
    out = {}
    for name, tensor in inner_model(model).state_dict().items():
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        out[name] = tensor.detach().cpu().clone()
    return out


# ------------------------------------------------------------------------------------------------
# What each rank keeps: the formula and the count
# ------------------------------------------------------------------------------------------------


def model_state_bytes(num_parameters: int, strategy: str, world_size: int, bytes_per_value: int = 4) -> dict[str, int]:
    """The bytes one rank keeps between steps for weights, AdamW's two moments and (DDP) gradient
    buckets, by the formula: fp32 weights (4 bytes a parameter), AdamW's ``exp_avg`` and
    ``exp_avg_sq`` (8), DDP's buckets that the gradients live in (4); FSDP2 divides weights and
    optimizer state by the world size and keeps no buckets between steps (its gradients, 4/N a
    parameter, are freed by ``zero_grad(set_to_none=True)`` like the plain model's)."""
    p = num_parameters
    shard = -(-p // world_size)
    if strategy == "none":  # one process, the plain model
        return {"weights": bytes_per_value * p, "optimizer state": 2 * bytes_per_value * p}
    base, _ = parse_strategy(strategy)
    if base == "ddp":
        return {"weights": bytes_per_value * p, "optimizer state": 2 * bytes_per_value * p,
                "gradient buckets": bytes_per_value * p}
    if base == "zero1":  # ZeroRedundancyOptimizer: AdamW's state of 1/N of the parameters on each rank
        return {"weights": bytes_per_value * p, "optimizer state": 2 * bytes_per_value * shard,
                "gradient buckets": bytes_per_value * p}
    return {"weights": bytes_per_value * shard, "optimizer state": 2 * bytes_per_value * shard}


ZERO_PARTS = ("parameters", "gradients", "master weights", "optimizer moments")


def zero_state_bytes(num_parameters: int, stage: int, world_size: int) -> dict[str, float]:
    """The bytes one rank keeps for the model's state in bf16 mixed-precision training with Adam(W), as the
    ZeRO paper and the Ultra-Scale Playbook count them: bf16 parameters (2 bytes a parameter) and
    gradients (2), an fp32 master copy of the weights (4) and Adam's two fp32 moments (4 + 4). ZeRO stage 1
    shards the optimizer state (master copy and moments) over the ``world_size`` ranks, stage 2 the
    gradients too, stage 3 the parameters too; stage 0 (plain DDP) shards nothing."""
    if stage not in (0, 1, 2, 3):
        raise ConfigError(f"ZeRO stages are 0, 1, 2 and 3, not {stage!r}")
    if world_size < 1 or num_parameters < 0:
        raise ConfigError(f"need world_size >= 1 and num_parameters >= 0 (got {world_size}, {num_parameters})")
    p, n = num_parameters, world_size
    return {"parameters": 2 * p / (n if stage >= 3 else 1), "gradients": 2 * p / (n if stage >= 2 else 1),
            "master weights": 4 * p / (n if stage >= 1 else 1), "optimizer moments": 8 * p / (n if stage >= 1 else 1)}


def communication_bytes(num_parameters: int, strategy: str, world_size: int, bytes_per_value: int = 4,
                        gathered_bytes_per_value: int | None = None) -> int:
    """The bytes each rank sends per training step (and receives as many) with ring collectives over
    ``world_size`` ranks: DDP all-reduces every gradient once, ``2 (N-1)/N`` of the gradients' bytes (a
    reduce-scatter then an all-gather); FSDP2 all-gathers every block's weights twice (forward, and
    again for the backward) and reduce-scatters the gradients once, ``3 (N-1)/N``. One process
    (``"none"``) sends nothing. ``bytes_per_value``: the gradients' (fp32, 4 bytes); FSDP2's gathered
    weights take ``gathered_bytes_per_value`` (default the same; 2 under its bf16 mixed-precision policy,
    which :func:`wrap` sets for bf16 runs: :func:`gathered_bytes`).

    Per optimizer step, variants included: ``zero1`` adds the broadcast of each rank's updated shard to
    the others (one more pass of the weights); with ``accumulate=k`` DDP all-reduces after each of the
    k micro-batches' backwards, unless ``no_sync`` keeps all but the last local; FSDP2 gathers and
    reduce-scatters per micro-batch."""
    if strategy == "none" or world_size == 1:
        return 0
    base, variant = parse_strategy(strategy)
    gathered = bytes_per_value if gathered_bytes_per_value is None else gathered_bytes_per_value
    share = (world_size - 1) / world_size * num_parameters
    backwards = variant.get("accumulate", 1)
    reductions = 1 if variant.get("no_sync") else backwards
    if base == "ddp":
        return round(2 * share * bytes_per_value * reductions)
    if base == "zero1":
        return round(2 * share * bytes_per_value * reductions + share * bytes_per_value)
    return round(share * (2 * gathered + bytes_per_value) * backwards)


def gathered_bytes(precision: str, strategy: str = "fsdp") -> int:
    """Bytes per weight that ``strategy`` all-gathers at a training precision, as :func:`wrap` sets it up
    (2 for ``fsdp`` in bf16, under its policy; 4 otherwise)."""
    return 2 if parse_strategy(strategy)[0] == "fsdp" and _mixed_precision_policy(precision) is not None else 4


def counted_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """The bytes of the tensors this rank holds for weights and optimizer state, counted (local
    shards only, under FSDP2): the formula's figures, checked on the real objects."""
    weights = sum(_local(p).numel() * _local(p).element_size() for p in model.parameters())
    local = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer: this rank's own AdamW
    state = sum(_local(t).numel() * _local(t).element_size() for s in local.state.values()
                for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
    return {"weights": weights, "optimizer state": state}


# ------------------------------------------------------------------------------------------------
# The result
# ------------------------------------------------------------------------------------------------


@dataclass
class RankResult:
    """What one rank measured."""

    rank: int
    device: str
    step_ms: Stats
    phase_ms: dict[str, float]
    warmup_ms: list[float]
    losses: list[float]
    tokens_per_s: float
    peak_memory_mib: float | None
    allocated_at_rest_mib: float | None
    counted_state_mib: dict[str, float]
    communication_ms: float | None  # this rank's collectives per profiled step: transfer_ms + wait_ms
    exposed_communication_ms: float | None  # ... of it with no compute beside it (GPU only)
    collectives: list[dict[str, Any]] = field(default_factory=list)
    trace_path: str | None = None
    profiled_step_ms: float | None = None  # the profiled steps' own wall time, which the above are set against
    transfer_ms: float | None = None  # after the last rank arrived: the same on every rank
    wait_ms: float | None = None  # waiting for the other ranks inside the collectives (skew)
    exposed_transfer_ms: float | None = None
    communication_steps: list[dict[str, Any]] = field(default_factory=list)  # the above, per profiled step
    communication_profile: Any = None  # this rank's RankProfile, until rank 0 has combined them all
    bucket_all_reduces_per_step: float | None = None  # DDP variants: bucket all-reduces per optimizer step


@dataclass
class DistributedResult:
    """A distributed run: every rank's figures and the global ones. ``to_records()`` gives one flat
    row per rank (global figures repeated) for a JSON file or a DataFrame."""

    strategy: str
    world_size: int
    backend: str
    library: str
    version: str
    preset: str
    precision: str
    global_batch_size: int
    local_batch_size: int
    seq_len: int
    num_parameters: int
    num_steps: int
    warmup_steps: int
    ranks: list[RankResult]
    losses: list[float]
    tokens_per_s: float
    slowest_step_ms: float
    predicted_state_mib: dict[str, float]
    baseline_tokens_per_s: float | None = None
    communication_problems: list[str] = field(default_factory=list)  # check_physical's findings, if any
    accumulation_steps: int = 1  # micro-batches (of local_batch_size each) per optimizer step
    timed_in_turns: bool = False  # step times from time_in_turns (with the launch's other runs), not its training
    # A plain all-reduce of the gradients' bytes (fp32) in the same process group (--time-all-reduce):
    all_reduce_bytes: int | None = None
    all_reduce_ms: float | None = None
    all_reduce_busbw_gbs: float | None = None
    config: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, torch.Tensor] | None = None
    torch_version: str = torch.__version__
    timestamp: str = field(default_factory=lambda: _dt.datetime.now().isoformat(timespec="seconds"))

    @property
    def scaling_efficiency(self) -> float | None:
        """Global tokens/s against N times the 1-GPU tokens/s of the same per-GPU batch."""
        if not self.baseline_tokens_per_s:
            return None
        return self.tokens_per_s / (self.world_size * self.baseline_tokens_per_s)

    def to_records(self) -> list[dict[str, Any]]:
        """One flat dict per rank: the run's settings and global figures, then the rank's own."""
        skip = ("ranks", "weights", "config", "predicted_state_mib")
        common = {k: v for k, v in asdict(self).items() if k not in skip}
        common["scaling_efficiency"] = self.scaling_efficiency
        common.update({f"config_{k}": v for k, v in self.config.items()})
        common.update({f"predicted_{k.replace(' ', '_')}_mib": v for k, v in self.predicted_state_mib.items()})
        common["predicted_state_mib"] = sum(self.predicted_state_mib.values())
        records = []
        for r in self.ranks:
            row = dict(common)
            row.update({"rank": r.rank, "device": r.device, "rank_tokens_per_s": r.tokens_per_s,
                        "rank_losses": r.losses, "warmup_ms": r.warmup_ms,
                        "peak_memory_mib": r.peak_memory_mib, "allocated_at_rest_mib": r.allocated_at_rest_mib,
                        "communication_ms": r.communication_ms,
                        "exposed_communication_ms": r.exposed_communication_ms, "collectives": r.collectives,
                        "trace_path": r.trace_path, "profiled_step_ms": r.profiled_step_ms,
                        "transfer_ms": r.transfer_ms, "wait_ms": r.wait_ms,
                        "exposed_transfer_ms": r.exposed_transfer_ms,
                        "communication_steps": r.communication_steps,
                        "bucket_all_reduces_per_step": r.bucket_all_reduces_per_step})
            row.update(r.step_ms.as_dict(prefix="step_ms_"))
            row.update({f"{phase}_ms_median": ms for phase, ms in r.phase_ms.items()})
            row.update({f"counted_{k.replace(' ', '_')}_mib": v for k, v in r.counted_state_mib.items()})
            records.append(row)
        return records

    def summary(self) -> str:
        """A few lines: every rank, then the global figures."""
        how = ("one process, the plain model" if self.strategy == "none" else
               f"{self.strategy.upper()} on {self.world_size} process(es), {self.library}")
        lines = [f"TinyLLaMA {self.version} | {self.preset} | {self.precision} | {how} | global batch "
                 f"{self.global_batch_size} ({self.local_batch_size} per rank) x seq {self.seq_len}, "
                 f"{self.num_parameters / 1e6:.1f}M parameters"]
        for r in self.ranks:
            memory = "n/a on the CPU" if r.peak_memory_mib is None else f"{r.peak_memory_mib:,.0f} MiB"
            comm = "" if r.communication_ms is None or r.profiled_step_ms is None else (
                f"; in its profiled step of {r.profiled_step_ms:.2f} ms: communication {r.communication_ms:.2f} ms = "
                f"transfer {r.transfer_ms:.2f} + wait for other ranks {r.wait_ms:.2f}" + (
                    "" if r.exposed_communication_ms is None else
                    f", exposed {r.exposed_communication_ms:.2f} (transfer {r.exposed_transfer_ms:.2f})"))
            lines.append(f"  [rank {r.rank}/{self.world_size}] {r.device}: step {r.step_ms.median:.2f} ms median "
                         f"(p10 {r.step_ms.p10:.2f}, p90 {r.step_ms.p90:.2f}), {r.tokens_per_s:,.0f} tokens/s, "
                         f"peak memory {memory}{comm}")
        if any(r.communication_ms is not None for r in self.ranks) and self.world_size > 1:
            lines.append("  communication per profiled step: transfer = after the last rank arrived (the same on every "
                         "rank), wait = skew (this rank arrived early)")
        for problem in self.communication_problems:
            lines.append(f"  IMPOSSIBLE communication figure, not to be trusted: {problem}")
        lines.append(f"  global: {self.tokens_per_s:,.0f} tokens/s (slowest rank {self.slowest_step_ms:.2f} ms/step"
                     f"{', timed in turns with the other runs' if self.timed_in_turns else ''}), "
                     f"loss {self.losses[0]:.4f} -> {self.losses[-1]:.4f}")
        counts = [r.bucket_all_reduces_per_step for r in self.ranks if r.bucket_all_reduces_per_step is not None]
        if counts:
            lines.append(f"  {max(counts):g} bucket all-reduce(s) per optimizer step"
                         + (f" of {self.accumulation_steps} micro-batches" if self.accumulation_steps > 1 else ""))
        if self.all_reduce_ms is not None:
            lines.append(f"  a plain all-reduce of the gradients' {self.all_reduce_bytes / 2**20:,.2f} MiB here: "
                         f"{self.all_reduce_ms:.3f} ms, bus bandwidth {self.all_reduce_busbw_gbs:,.2f} GB/s")
        if self.scaling_efficiency is not None:
            lines.append(f"  scaling efficiency {100 * self.scaling_efficiency:.1f}% against {self.world_size} x "
                         f"{self.baseline_tokens_per_s:,.0f} tokens/s (1 process, same per-GPU batch)")
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------


class _FailAt:
    """A training step that raises ``RankFailure`` at call ``at`` (0-based): a rank that crashes."""

    def __init__(self, step: TrainingStep, at: int, label: str) -> None:
        self.step, self.at, self.label, self.calls = step, at, label, 0
        self.device = step.device

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.calls == self.at:
            raise RankFailure(f"{self.label} stopped on purpose at step {self.at} (--fail-rank): this is what a "
                              "crashed rank looks like to the others")
        self.calls += 1
        return self.step(*args, **kwargs)

    def accumulate(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``TrainingStep.accumulate``, failing at call ``at`` like ``__call__``."""
        if self.calls == self.at:
            raise RankFailure(f"{self.label} stopped on purpose at step {self.at} (--fail-rank): this is what a "
                              "crashed rank looks like to the others")
        self.calls += 1
        return self.step.accumulate(*args, **kwargs)


def rank_device(ctx: DistContext, name: str | None = None) -> torch.device:
    """This rank's device: ``name`` when given, else the GPU of its local rank, else the CPU."""
    if name is not None:
        return dev.get_device(name)
    if dev.backend() == "cpu":
        return torch.device("cpu")
    return dev.get_device(f"cuda:{ctx.local_rank}")


def run_distributed(
    strategy: str = "ddp",
    version: str = "v1",
    preset: str = "tiny",
    *,
    batch_size: int | None = None,
    seq_len: int | None = None,
    precision: str = "fp32",
    num_steps: int = 20,
    warmup_steps: int = 3,
    seed: int = 0,
    device: torch.device | str | None = None,
    dataset: Dataset | None = None,
    shuffle: bool = False,
    baseline_tokens_per_s: float | None = None,
    profiled_steps: int = 2,
    trace_dir: str | Path | None = None,
    return_weights: bool = False,
    fail_rank: int | None = None,
    fail_step: int = 1,
    model_options: dict[str, Any] | None = None,
    progress: bool = True,
    **config_overrides: Any,
) -> DistributedResult:
    """Train ``num_steps`` timed steps (after ``warmup_steps``) on every rank of the current process
    group, and return every rank's figures and the global ones (on every rank).

    ``batch_size`` is the global batch. Outside a process group this is one process training the plain
    model (no wrapper; the result's strategy is ``"none"``): the reference that N ranks must reproduce.
    ``dataset`` is any map-style dataset of ``(inputs, targets)`` pairs (default: ``SyntheticTokens``); its ``seq_len`` must match.
    ``profiled_steps`` more steps run under the PyTorch profiler for the communication time (0: none);
    with ``trace_dir`` each rank writes their trace there (``STRATEGY-rankR-TIME.json``, for Perfetto).
    ``return_weights`` gathers the final weights (whole, on the CPU) into ``result.weights``.
    ``fail_rank`` makes that rank raise ``RankFailure`` at timed-or-warm-up step ``fail_step``.
    """
    check_precision(precision)
    check_strategy(strategy, precision)
    accumulate = parse_strategy(strategy)[1].get("accumulate", 1) if dist.is_initialized() else 1
    if num_steps < 1 or warmup_steps < 0 or profiled_steps < 0:
        raise ConfigError(f"need num_steps >= 1 and warmup_steps, profiled_steps >= 0 "
                          f"(got {num_steps}, {warmup_steps}, {profiled_steps})")
    if version not in VERSIONS:
        raise ConfigError(f"unknown version {version!r}: choose one of {', '.join(VERSIONS)}")
    ctx = process_group.current()
    steps_needed = (warmup_steps + num_steps) * accumulate
    run = _Run.build(strategy, version, preset, batch_size, seq_len, precision, seed, device, dataset, shuffle,
                     steps_needed, model_options, config_overrides)
    config, batch_size, seq_len, local_batch = run.config, run.batch_size, run.seq_len, run.local_batch
    device, batches, model, wrapped, step = run.device, run.batches, run.model, run.wrapped, run.step
    num_parameters = sum(p.numel() for p in model.parameters())
    inputs, targets = batches[0]
    check_every_parameter_trained(wrapped, lambda: step.loss(inputs, targets))
    counter = getattr(wrapped, "bucket_all_reduces", None)
    if counter is not None:
        counter[0] = 0  # count the warm-up and timed steps only
    runner: Any = _FailAt(step, fail_step, ctx.label) if fail_rank == ctx.rank else step
    warmup_ms, phase_ms, losses = _time_steps(runner, iter(batches), accumulate, warmup_steps, num_steps,
                                              f"{strategy} {version} {precision}" if progress and ctx.is_main else None)
    memory = dev.memory_stats(device)
    at_rest = None if memory.current_bytes is None else memory.current_bytes / 2**20
    counted = {k: v / 2**20 for k, v in counted_state_bytes(wrapped, step.optimizer).items()}
    communication, trace = _profile_communication(step, batches, profiled_steps, device, trace_dir,
                                                  f"{strategy if dist.is_initialized() else 'none'}-rank{ctx.rank}")
    step_stats = summarize([sum(parts) for parts in zip(*(phase_ms[p] for p in DATA_PHASES))])
    mine = RankResult(
        rank=ctx.rank, device=dev.device_name(device), step_ms=step_stats,
        phase_ms={p: summarize(phase_ms[p]).median for p in DATA_PHASES}, warmup_ms=warmup_ms, losses=losses,
        tokens_per_s=accumulate * local_batch * seq_len / (step_stats.median / 1e3), peak_memory_mib=memory.peak_mib,
        allocated_at_rest_mib=at_rest, counted_state_mib=counted,
        communication_ms=None, exposed_communication_ms=None,
        collectives=[] if communication is None else communication.collectives().to_dict("records"),
        trace_path=None if trace is None else str(trace), communication_profile=communication,
        bucket_all_reduces_per_step=None if counter is None else counter[0] / (warmup_steps + num_steps),
    )
    weights = full_state_dict(wrapped) if return_weights else None
    ranks = process_group.gather(mine, ctx)
    problems = _combine_communication(ranks)
    global_losses = [sum(values) / len(values) for values in zip(*(r.losses for r in ranks))]
    slowest = max(r.step_ms.median for r in ranks)
    kind = strategy if dist.is_initialized() else "none"
    predicted = {k: v / 2**20 for k, v in model_state_bytes(num_parameters, kind, ctx.world_size).items()}
    backend = ctx.backend or dev.collective_backend(device)
    return DistributedResult(
        strategy=kind, world_size=ctx.world_size, backend=backend, library=dev.collective_library(backend),
        version=version, preset=preset,
        precision=precision, global_batch_size=batch_size, local_batch_size=local_batch, seq_len=seq_len,
        num_parameters=num_parameters, num_steps=num_steps, warmup_steps=warmup_steps, ranks=ranks,
        losses=global_losses, tokens_per_s=accumulate * batch_size * seq_len / (slowest / 1e3), slowest_step_ms=slowest,
        predicted_state_mib=predicted, baseline_tokens_per_s=baseline_tokens_per_s,
        communication_problems=problems, config=config.to_dict(), weights=weights, accumulation_steps=accumulate,
    )


@dataclass
class _Run:
    """What one run trains: its configuration, this rank's batches, the model, its wrapper and its step."""

    config: Any
    batch_size: int
    seq_len: int
    local_batch: int
    device: torch.device
    batches: list[tuple[torch.Tensor, torch.Tensor]]
    model: nn.Module
    wrapped: nn.Module
    step: TrainingStep

    @classmethod
    def build(cls, strategy: str, version: str, preset: str, batch_size: int | None, seq_len: int | None,
              precision: str, seed: int, device: torch.device | str | None, dataset: Dataset | None, shuffle: bool,
              steps_needed: int, model_options: dict[str, Any] | None, config_overrides: dict[str, Any]) -> "_Run":
        ctx = process_group.current()
        config, batch_size, seq_len = resolve_config(preset, batch_size, seq_len, **config_overrides)
        local_batch = ctx.local_batch(batch_size)
        device = rank_device(ctx, None if device is None else str(device))
        if dataset is None:
            dataset = SyntheticTokens(config.vocab_size, seq_len, batch_size * min(steps_needed, 8), seed=seed)
        batches = _fetch_batches(rank_loader(dataset, local_batch, ctx, shuffle=shuffle, seed=seed), steps_needed,
                                 device)
        configure_determinism(seed, deterministic=False)  # the same initial weights on every rank
        model = build(version, config, **dict(model_options or {})).to(device).train()
        wrapped = wrap(model, strategy, device, precision) if dist.is_initialized() else model
        base, variant = parse_strategy(strategy)
        kind = NoSyncStep if dist.is_initialized() and variant.get("no_sync") else TrainingStep
        step = kind(wrapped, precision, device, fused_optimizer=getattr(model, "fused_optimizer", False))
        if base == "zero1" and dist.is_initialized():
            from torch.distributed.optim import ZeroRedundancyOptimizer

            # AdamW as TrainingStep sets it up, its state sharded: each rank keeps and updates 1/N of it.
            step.optimizer = ZeroRedundancyOptimizer(
                wrapped.parameters(), optimizer_class=torch.optim.AdamW, lr=step.optimizer.defaults["lr"],
                weight_decay=0.0, **({"fused": True} if step.fused_optimizer else {}))
        return cls(config, batch_size, seq_len, local_batch, device, batches, model, wrapped, step)


def profile_communication(result: DistributedResult, *, batch_size: int | None = None, seq_len: int | None = None,
                          seed: int = 0, device: torch.device | str | None = None, dataset: Dataset | None = None,
                          shuffle: bool = False, profiled_steps: int = 2, trace_dir: str | Path | None = None,
                          model_options: dict[str, Any] | None = None, **config_overrides: Any) -> DistributedResult:
    """Profile ``profiled_steps`` steps of the run ``result`` describes, trained afresh on every rank, and
    fill its ranks' communication figures (in place; also returned). For a run timed with
    ``profiled_steps=0`` before others: a profiler session slows every later launch in its process, so
    the command line times every strategy first and profiles them afterwards, this way."""
    if profiled_steps < 1:
        raise ConfigError(f"profiled_steps must be at least 1, got {profiled_steps}")
    ctx = process_group.current()
    run = _Run.build(result.strategy if dist.is_initialized() else "ddp", result.version, result.preset, batch_size,
                     seq_len, result.precision, seed, device, dataset, shuffle, 2, model_options, config_overrides)
    run.step(*run.batches[0])  # the first step builds what later steps reuse (buckets, compiled code)
    communication, trace = _profile_communication(run.step, run.batches, profiled_steps, run.device, trace_dir,
                                                  f"{result.strategy}-rank{ctx.rank}")
    mine = (communication, None if trace is None else str(trace), communication.collectives().to_dict("records"))
    for rank, (profile, path, collectives) in zip(result.ranks, process_group.gather(mine, ctx)):
        rank.communication_profile, rank.trace_path, rank.collectives = profile, path, collectives
    result.communication_problems = _combine_communication(result.ranks)
    del run
    dev.free_memory(device)
    return result


def fits_side_by_side(results: Sequence[DistributedResult], device: torch.device) -> bool:
    """Whether every run of ``results`` fits on ``device`` at once, for :func:`time_runs_in_turns`: their
    memory between steps added up, plus the largest rise within a step, under ``bench.TURNS_MEMORY_SHARE`` of
    the device's memory (from the ranks' own figures, the same on every rank: every rank decides alike).
    Always on the CPU."""
    total = dev.memory_stats(device).total_bytes
    rests = [max((r.allocated_at_rest_mib or 0.0) for r in result.ranks) for result in results]
    rises = [max((r.peak_memory_mib or 0.0) - (r.allocated_at_rest_mib or 0.0) for r in result.ranks)
             for result in results]
    return total is None or (sum(rests) + max(rises, default=0.0)) * 2**20 < TURNS_MEMORY_SHARE * total


def time_runs_in_turns(results: Sequence[DistributedResult], *, rounds: int = 10, per_turn: int = 2, seed: int = 0,
                  device: torch.device | str | None = None, dataset: Dataset | None = None,
                  model_options: dict[str, Any] | None = None, progress: bool = True,
                  **config_overrides: Any) -> None:
    """Time the runs of ``results`` again, in turns, and put those times in their step figures (in place):
    every run is built afresh on every rank and warmed up, then each of ``rounds`` rounds gives each run
    ``per_turn`` optimizer steps, in an order that rotates from round to round
    (:func:`tinyllama.timing.time_in_turns`). Whatever the host does meanwhile falls on every run alike.
    Timed one after the other, the same variants' verdicts flipped between two runs on two H200s
    (2026-11-27). The first training of each run still gives its losses, memory and phases. Every rank
    calls it with the same runs."""
    ctx = process_group.current()
    calls = {}
    for result in results:
        steps = min(8, result.warmup_steps + rounds * per_turn) * result.accumulation_steps
        run = _Run.build(result.strategy if dist.is_initialized() else "ddp", result.version, result.preset,
                         result.global_batch_size, result.seq_len, result.precision, seed, device, dataset, False,
                         steps, model_options, config_overrides)
        source = itertools.cycle(run.batches)
        calls[str(len(calls))] = (lambda step=run.step, source=source, n=result.accumulation_steps:
                                  step.accumulate(source, n))
        device = run.device
    samples = time_in_turns(calls, device, rounds=rounds, per_turn=per_turn,
                            warmup=max(result.warmup_steps for result in results),
                            progress=(lambda r: progress_bar(r, "in turns")) if progress and ctx.is_main else None)
    del calls
    dev.free_memory(device)
    every_rank = process_group.gather(samples, ctx)
    for index, result in enumerate(results):
        for rank, rank_samples in zip(result.ranks, every_rank):
            rank.step_ms = summarize(rank_samples[str(index)])
            rank.tokens_per_s = result.accumulation_steps * result.local_batch_size * result.seq_len / (
                rank.step_ms.median / 1e3)
        result.slowest_step_ms = max(r.step_ms.median for r in result.ranks)
        result.tokens_per_s = result.accumulation_steps * result.global_batch_size * result.seq_len / (
            result.slowest_step_ms / 1e3)
        result.timed_in_turns = True


def time_gradient_all_reduce(results: Sequence[DistributedResult], device: torch.device) -> None:
    """Time a plain all-reduce of as many bytes as the model's fp32 gradients in the current process group
    (``tinyllama.harness.allreduce``: the slowest rank's median) and write its time and bus bandwidth into every
    result (in place): the reference the training steps' collectives are compared with. Every rank calls it."""
    from tinyllama.harness.allreduce import time_all_reduce

    timing = time_all_reduce(4 * results[0].num_parameters, device, iterations=5, warmup=2, inner=3)
    for result in results:
        result.all_reduce_bytes, result.all_reduce_ms = timing.bytes, timing.median_ms
        result.all_reduce_busbw_gbs = timing.busbw_gbs


def _combine_communication(ranks: list[RankResult]) -> list[str]:
    """Every rank's communication figures from all the ranks' profiles (gathered with the results):
    matched collective by collective, so that each rank's communication is split into the transfer (the
    same on every rank) and its own wait, within its profiled step. Fills the ``RankResult`` s in place;
    returns what :func:`check_physical` finds impossible (nothing, when the figures hold)."""
    if any(r.communication_profile is None for r in ranks):
        return []
    from tinyllama.profiling.communication import check_physical, communication_figures

    figures = communication_figures([r.communication_profile for r in ranks])
    for r, f in zip(ranks, figures):
        r.communication_ms, r.exposed_communication_ms = f.communication_ms, f.exposed_ms
        r.profiled_step_ms, r.transfer_ms, r.wait_ms = f.step_ms, f.transfer_ms, f.wait_ms
        r.exposed_transfer_ms = f.exposed_transfer_ms
        r.communication_steps = [asdict(s) for s in f.steps]
        r.communication_profile = None  # combined: not kept in the result
    return check_physical(figures, strict=False)


def _fetch_batches(loader: DataLoader, count: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``count`` batches of ``loader`` on ``device`` (the loader is read again from its start
    when it runs out). Fetched before timing, so that the timed steps measure the training step, as
    ``tinyllama.harness.bench`` does."""
    batches: list[tuple[torch.Tensor, torch.Tensor]] = []
    while len(batches) < count:
        before = len(batches)
        for inputs, targets in loader:
            batches.append((inputs.to(device), targets.to(device)))
            if len(batches) == count:
                break
        if len(batches) == before:
            raise ConfigError("the dataset has fewer samples than one global batch: use a smaller --batch-size")
    return batches


def _profile_communication(step: TrainingStep, batches: list[tuple[torch.Tensor, torch.Tensor]], steps: int,
                           device: torch.device, trace_dir: str | Path | None, name: str) -> tuple[Any, Path | None]:
    """``steps`` more training steps under the PyTorch profiler: this rank's ``RankProfile`` (its
    collectives, step by step, for ``_combine_communication``), and the path of the trace written to
    ``trace_dir`` (``None`` without one)."""
    if steps < 1:
        return None, None
    from tinyllama.profiling.communication import read_profile
    from tinyllama.profiling.torch_profiler import profile_steps

    calls = iter(range(10**9))
    run = profile_steps(lambda: step(*batches[next(calls) % len(batches)]), device=device, wait=0, warmup=1,
                        active=steps, trace_dir=trace_dir, name=name)
    return read_profile(run), run.trace_path


# ------------------------------------------------------------------------------------------------
# Reading records back
# ------------------------------------------------------------------------------------------------

RUN_KEYS = ("preset", "version", "precision", "strategy", "local_batch_size", "seq_len")


def scaling_table(records: Sequence[dict[str, Any]]) -> Any:
    """One row per run (``to_records()`` rows, from any number of runs and files): processes, global
    tokens/s, the slowest rank's step, the largest peak memory and communication of any rank, and the
    scaling efficiency against the 1-process run of the same settings and per-GPU batch (``NaN``
    where there is none). Sorted by the run's settings, then the number of processes.

    Communication: ``transfer_ms`` (the same on every rank: their mean), the largest ``wait_ms``
    (skew), and ``communication_ms`` / ``exposed_communication_ms`` of the rank that waited most, with
    ``profiled_step_ms``, the longest profiled step they are set against (records written before these
    were split have ``NaN`` there)."""
    import pandas as pd

    frame = pd.DataFrame(list(records))
    if frame.empty:
        return frame
    for column in ("peak_memory_mib", "communication_ms", "exposed_communication_ms", "transfer_ms", "wait_ms",
                   "profiled_step_ms"):
        if column not in frame:
            frame[column] = float("nan")
    keys = [*RUN_KEYS, "world_size", "timestamp"]
    runs = frame.groupby(keys, as_index=False, dropna=False).agg(
        tokens_per_s=("tokens_per_s", "first"), slowest_step_ms=("slowest_step_ms", "first"),
        peak_memory_mib=("peak_memory_mib", "max"), communication_ms=("communication_ms", "max"),
        exposed_communication_ms=("exposed_communication_ms", "max"), transfer_ms=("transfer_ms", "mean"),
        wait_ms=("wait_ms", "max"), profiled_step_ms=("profiled_step_ms", "max"), device=("device", "first"),
        library=("library", "first"))
    runs = runs.sort_values("timestamp").drop_duplicates([*RUN_KEYS, "world_size"], keep="last")
    single = runs[runs.world_size == 1].set_index(list(RUN_KEYS))["tokens_per_s"]
    baseline = runs.set_index(list(RUN_KEYS)).index.map(lambda key: single.get(key, float("nan")))
    runs["scaling_efficiency"] = runs["tokens_per_s"].to_numpy() / (runs["world_size"].to_numpy() * baseline.to_numpy())
    return runs.sort_values([*RUN_KEYS, "world_size"], ignore_index=True)


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchrun --nproc-per-node N -m tinyllama.harness.distributed",
        description="Data-parallel TinyLLaMA training (DDP or FSDP2) on N processes: every rank's step time, "
                    "tokens/s and memory, the global figures, scaling efficiency and communication time.",
        epilog="examples:\n"
               "  torchrun --nproc-per-node 2 -m tinyllama.harness.distributed --strategy ddp --preset medium --batch-size 32\n"
               "  torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\\n"
               "      -m tinyllama.harness.distributed --strategy fsdp --preset large --batch-size 128\n"
               "  python -m tinyllama.harness.distributed ...   (one process, the plain model: the 1-GPU reference)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--strategy", nargs="+", default=["ddp"],
                        help=f"{', '.join(STRATEGIES)} (FSDP2: fully_shard; zero1: DDP with ZeroRedundancyOptimizer), "
                             "or several (default ddp), trained one after the other in the same processes, then timed in "
                             "turns (--turns); a variant as BASE:key=value,...: ddp:bucket_cap_mb=5, ddp:accumulate=4,no_sync=1, "
                             "fsdp:reshard_after_forward=0 (variants are timed, not profiled)")
    add_model_arguments(parser, VERSIONS)
    add_problem_size_arguments(parser)
    add_run_arguments(parser, result="records, one per rank,")
    parser.add_argument("--backend", help="nccl (GPUs: NCCL, or RCCL on AMD) or gloo (CPU); default: by device")
    parser.add_argument("--timeout-s", type=float, default=process_group.DEFAULT_TIMEOUT_S,
                        help="seconds any collective may wait for the other ranks "
                             f"(default {process_group.DEFAULT_TIMEOUT_S:.0f})")
    parser.add_argument("--baseline-tokens-per-s", type=float,
                        help="tokens/s of a 1-GPU run with the same per-GPU batch: prints the scaling efficiency")
    parser.add_argument("--profiled-steps", type=int, default=2,
                        help="steps profiled after the timed ones, for the communication time (0: none; default 2)")
    parser.add_argument("--turns", type=int, default=10, metavar="ROUNDS",
                        help="with several strategies: after training each, time them all again in turns, ROUNDS "
                             "rounds of 2 steps each in a rotating order, so that the host's drift falls on all alike; "
                             "those are the step times reported (0: each strategy's training steps; default 10)")
    parser.add_argument("--time-all-reduce", action="store_true",
                        help="after the timed runs, time a plain all-reduce of the gradients' bytes (fp32) in the same "
                             "process group: its time and bus bandwidth go into every record")
    parser.add_argument("--trace-dir", metavar="DIR", help="every rank writes the profiled steps' trace there "
                                                            "(Chrome/Perfetto JSON)")
    parser.add_argument("--save-weights", metavar="PATH", help="rank 0 saves the final weights (whole) to PATH "
                                                                "(a new name if PATH exists)")
    parser.add_argument("--fail-rank", type=int, help="this rank raises an error at --fail-step (to see how a "
                                                      "failure ends the run)")
    parser.add_argument("--fail-step", type=int, default=1, help="the step --fail-rank fails at (default 1)")
    return parser


class _Stopped(Exception):
    """torchrun (or the user) sent SIGTERM: another rank has failed, or the run was interrupted."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Stopped()


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point for every rank; returns the exit status (0, 1 failure, 2 bad settings)."""
    args = build_parser().parse_args(argv)
    ctx = process_group.from_environment()
    prefix = f"error ({ctx.label})" if ctx.distributed else "error"
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        # Refused before any rank waits for another: every rank finds the same fault and says so.
        check_precision(args.precision)
        for strategy in args.strategy:
            check_strategy(strategy, args.precision)
        _, global_batch, _ = resolve_config(args.preset, args.batch_size, args.seq_len, **shape_overrides(args))
        ctx.local_batch(global_batch)
        if args.turns < 0:
            raise ConfigError(f"--turns must be 0 (off) or a number of rounds, got {args.turns}")
        if args.fail_rank is not None and not 0 <= args.fail_rank < ctx.world_size:
            raise ConfigError(f"--fail-rank must be between 0 and {ctx.world_size - 1}")
        device = rank_device(ctx, args.device)
        dev.check_collective_backend(args.backend or dev.collective_backend(device), device)
        if process_group.launched_by_torchrun():
            ctx = process_group.join(device, backend=args.backend, timeout_s=args.timeout_s)
        results = []
        options = dict(parse_option(o) for o in args.option)
        # Every strategy is trained and timed before any is profiled: a profiler session slows every later launch
        # here. With several, they are then timed again in turns, side by side (those times are reported).
        for strategy in args.strategy:
            results.append(run_distributed(
                strategy, args.version, args.preset, batch_size=args.batch_size, seq_len=args.seq_len,
                precision=args.precision, num_steps=args.num_steps, warmup_steps=args.warmup_steps, seed=args.seed,
                device=device, baseline_tokens_per_s=args.baseline_tokens_per_s, profiled_steps=0,
                return_weights=bool(args.save_weights), fail_rank=args.fail_rank, fail_step=args.fail_step,
                model_options=options, progress=not args.quiet, **shape_overrides(args)))
            dev.free_memory(device)
        if args.turns and len(results) > 1:
            if fits_side_by_side(results, device):
                time_runs_in_turns(results, rounds=args.turns, seed=args.seed, device=device, model_options=options,
                              progress=not args.quiet, **shape_overrides(args))
            else:
                say("the strategies do not fit on the device all at once: each one's step times are those of its "
                    "own training, one after the other, and follow the host's drift (run fewer at a time)",
                    ctx.is_main)
        if args.time_all_reduce and ctx.distributed and results:
            time_gradient_all_reduce(results, device)
        if args.profiled_steps:
            # Variants and zero1 are timed only: the profile is for the timeline of DDP and FSDP2 themselves.
            for result in (r for r in results if r.strategy in ("ddp", "fsdp", "fsdp-fp32")):
                profile_communication(result, batch_size=args.batch_size, seq_len=args.seq_len, seed=args.seed,
                                      device=device, profiled_steps=args.profiled_steps, trace_dir=args.trace_dir,
                                      model_options=options, **shape_overrides(args))
    except (ValueError, dev.DeviceUnavailable) as error:  # ConfigError included
        print(f"{prefix}: {error}", file=sys.stderr, flush=True)
        return 2
    except (BenchmarkError, CorrectnessError, RankFailure) as error:
        print(f"{prefix}: {error}", file=sys.stderr, flush=True)
        return 1
    except _Stopped:
        print(f"{prefix}: stopped by torchrun: another rank failed (its error is above) or the run was interrupted",
              file=sys.stderr, flush=True)
        return 1
    except RuntimeError as error:  # a collective that lost its peers or timed out
        if dev.is_out_of_memory(error):
            print(f"{prefix}: out of memory on {ctx.label}: use a smaller --batch-size or --seq-len, or --strategy "
                  "fsdp", file=sys.stderr, flush=True)
            return 1
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"{prefix}: a collective failed ({first[:300]}): another rank has probably failed or timed out "
              f"(--timeout-s {args.timeout_s:.0f}); its error is above", file=sys.stderr, flush=True)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        process_group.teardown()
    if ctx.is_main:
        from tinyllama.harness.records import append_json, unique_path

        for result in results:
            print(result.summary(), flush=True)
            if args.json:
                print(f"  appended {len(result.ranks)} record(s) to {append_json(args.json, result.to_records())}")
            if args.save_weights:
                path = unique_path(args.save_weights)
                torch.save(result.weights, path)
                print(f"  final weights saved to {path}")
    return 0


def _cpu_requested(argv: Sequence[str]) -> bool:
    """Whether the arguments ask for ``--device cpu`` (read by the same parser as ``main``)."""
    device = build_parser().parse_known_args(list(argv))[0].device
    return device is not None and device.split(":")[0] == "cpu"


if __name__ == "__main__":
    if _cpu_requested(sys.argv[1:]):
        dev.hide_gpus()  # a CPU rank on a GPU node sees no GPU (done here: main() also runs inside tests)
    sys.exit(main())
