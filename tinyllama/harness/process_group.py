"""One process among several: joining the process group that torchrun prepared, what this process
knows of it (rank, world size, local rank), and leaving it. Shared by the training harness
(``tinyllama.harness.distributed``) and the inference benchmark (``inference.distributed``).

``torchrun --nproc-per-node N ...`` starts N processes and sets RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT in each; ``join`` reads them (``init_method="env://"``). Every collective
gets a timeout, so that a rank that died or never arrived ends the others with an error instead of a
hang.
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from tinyllama import device as dev
from tinyllama.config import BenchmarkError, ConfigError

# Long enough for the first collectives on a cold GPU node (NCCL/RCCL set-up, compilation on one rank),
# short enough that a dead rank ends a notebook's run in minutes, not in PyTorch's default 10 minutes.
DEFAULT_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class DistContext:
    """Where this process stands among the others (a single process: rank 0 of 1)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def label(self) -> str:
        """``rank 1/2`` (for messages that every rank prints)."""
        return f"rank {self.rank}/{self.world_size}"

    def local_batch(self, global_batch: int) -> int:
        """This process's share of ``global_batch``; ``ConfigError`` when it does not split evenly."""
        if global_batch % self.world_size:
            raise ConfigError(
                f"--batch-size {global_batch} does not split evenly across {self.world_size} processes: "
                f"use a multiple of {self.world_size}"
            )
        return global_batch // self.world_size


def launched_by_torchrun() -> bool:
    """True inside a process that torchrun (torch.distributed.run) started."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def from_environment() -> DistContext:
    """What torchrun told this process (rank 0 of 1 outside torchrun), before any group is joined."""
    if not launched_by_torchrun():
        return DistContext()
    return DistContext(rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                       local_rank=int(os.environ["LOCAL_RANK"]))


def current() -> DistContext:
    """The context of the process group this process belongs to (single process when none)."""
    if not (dist.is_available() and dist.is_initialized()):
        return DistContext()
    return DistContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", dist.get_rank())),
        backend=str(dist.get_backend()),
    )


def join(device: torch.device, *, backend: str | None = None, rank: int | None = None, world_size: int | None = None,
         init_method: str = "env://", timeout_s: float = DEFAULT_TIMEOUT_S) -> DistContext:
    """Join the process group: ``backend`` (default: nccl on GPUs, gloo on the CPU, see
    ``tinyllama.device.collective_backend``), rank and world size from torchrun's environment unless
    given. The back end is checked first (nccl on a CPU is refused with a message, on every rank,
    before anything waits for the others). Every collective of the group times out after ``timeout_s``.
    """
    backend = backend or dev.collective_backend(device)
    try:
        dev.check_collective_backend(backend, device)
    except dev.DeviceUnavailable as error:
        raise ConfigError(str(error)) from None
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL/RCCL use the current device of each process
    env = from_environment()
    rank = env.rank if rank is None else rank
    world_size = env.world_size if world_size is None else world_size
    try:
        dist.init_process_group(backend=backend, init_method=init_method, rank=rank, world_size=world_size,
                                timeout=_dt.timedelta(seconds=timeout_s))
    except (RuntimeError, ValueError) as error:
        raise BenchmarkError(f"could not join the process group ({backend}, {init_method}): {error}") from None
    return current()


def teardown() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    """Wait for all processes (a no-op for a single one)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def gather(value: Any, ctx: DistContext) -> list[Any]:
    """Every process's ``value`` (any picklable object), in rank order (``[value]`` for one process)."""
    if not ctx.distributed:
        return [value]
    values: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(values, value)
    return values
