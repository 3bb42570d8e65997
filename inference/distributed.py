"""Several processes, one per GPU: torchrun, or processes started by hand as the original allowed.

``torchrun --nproc-per-node N -m inference ...`` sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous
address; by hand, ``--distributed_dataparallel --rank R --world-size N --dist-url tcp://HOST:PORT``
does the same for one process. The global batch is split evenly across the processes. NCCL is used
on GPUs (RCCL on AMD, under the same name) and gloo on the CPU. What every multi-process harness shares
(the context, joining, gathering) is ``tinyllama.harness.process_group``.
"""

from __future__ import annotations

import torch

from inference.config import BenchmarkError, ConfigError
from tinyllama import device as dev
from tinyllama.harness.process_group import (
    DistContext,
    barrier,
    current,
    from_environment,
    gather,
    join,
    launched_by_torchrun,
    teardown,
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
        env = from_environment()
        rank, world_size, local_rank = env.rank, env.world_size, env.local_rank
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
    if world_size > 1 or distributed_dataparallel:
        join(chosen, backend=dist_backend, rank=rank, world_size=world_size, init_method=init_method)
        return current(), chosen
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)
    return DistContext(rank, world_size, local_rank, dist_backend or dev.collective_backend(chosen)), chosen


__all__ = ["DistContext", "barrier", "choose_device", "current", "gather", "launched_by_torchrun", "resolve_device",
           "setup", "teardown"]
