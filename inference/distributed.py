"""Several processes, one per GPU: torchrun, or processes started by hand as the original allowed.

``torchrun --nproc-per-node N -m inference ...`` sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous
address; by hand, ``--distributed_dataparallel --rank R --world-size N --dist-url tcp://HOST:PORT``
does the same for one process. The global batch is split evenly across the processes. NCCL is used
on GPUs (RCCL on AMD, under the same name) and gloo on the CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from tinyllama import device as dev

from inference.config import BenchmarkError, ConfigError


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

    def local_batch(self, global_batch: int) -> int:
        """This process's share of ``global_batch``."""
        if global_batch % self.world_size:
            raise ConfigError(
                f"--batch-size {global_batch} does not split evenly across {self.world_size} processes: "
                f"use a multiple of {self.world_size}"
            )
        return global_batch // self.world_size


def launched_by_torchrun() -> bool:
    """True inside a process that torchrun (torch.distributed.run) started."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


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


def resolve_device(name: str | None) -> torch.device:
    """``tinyllama.device.get_device``, with its errors (no GPU, no such GPU) as one-line messages."""
    try:
        return dev.get_device(name)
    except RuntimeError as error:
        raise BenchmarkError(str(error)) from None


def choose_device(local_rank: int, device_ids: list[int] | None, device: str | None) -> torch.device:
    """This process's device: ``device`` when given, else the GPU ``device_ids[local_rank]`` (or
    ``local_rank``), else the CPU."""
    if device is not None:
        return resolve_device(device)
    if dev.backend() == "cpu":
        return torch.device("cpu")
    index = device_ids[local_rank % len(device_ids)] if device_ids else local_rank
    return resolve_device(f"cuda:{index}")


def setup(*, distributed_dataparallel: bool = False, rank: int | None = None, world_size: int | None = None,
          dist_backend: str | None = None, dist_url: str | None = None, device_ids: list[int] | None = None,
          device: str | None = None) -> tuple[DistContext, torch.device]:
    """Join the process group when started by torchrun or with ``--distributed_dataparallel``, and
    pick this process's device. A single process returns rank 0 of 1 and starts no group."""
    if launched_by_torchrun():
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ["LOCAL_RANK"])
        init_method = "env://"
    elif distributed_dataparallel:
        missing = [flag for flag, value in (("--rank", rank), ("--world-size", world_size), ("--dist-url", dist_url))
                   if value is None]
        if missing:
            raise ConfigError(
                f"--distributed_dataparallel needs {', '.join(missing)} (or start the processes with torchrun)"
            )
        assert rank is not None and world_size is not None
        if not 0 <= rank < world_size:
            raise ConfigError(f"--rank must be between 0 and --world-size - 1 (got {rank} of {world_size})")
        local_rank = rank
        init_method = dist_url
    else:
        return DistContext(), choose_device(0, device_ids, device)

    chosen = choose_device(local_rank, device_ids, device)
    backend = dist_backend or ("nccl" if chosen.type == "cuda" else "gloo")
    if backend == "nccl" and chosen.type != "cuda":
        raise ConfigError("the nccl back end needs GPUs: use --dist-backend gloo on the CPU")
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)  # NCCL uses the current device of each process
    if world_size > 1 or distributed_dataparallel:
        try:
            dist.init_process_group(backend=backend, init_method=init_method, rank=rank, world_size=world_size)
        except (RuntimeError, ValueError) as error:
            raise BenchmarkError(f"could not join the process group ({backend}, {init_method}): {error}") from None
    return current() if dist.is_initialized() else DistContext(rank, world_size, local_rank, backend), chosen


def teardown() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    """Wait for all processes (a no-op for a single one)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def gather(value: Any, ctx: DistContext) -> list[Any]:
    """Every process's ``value``, in rank order (``[value]`` for a single process)."""
    if not ctx.distributed:
        return [value]
    values: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(values, value)
    return values
