"""Good manners on a shared GPU: use the GPU the hub assigned, warn when someone else is already
using it, and give memory back when a notebook is done."""

from __future__ import annotations

import os
from typing import MutableMapping

import torch

from tinyllama import device as dev

BUSY_THRESHOLD_BYTES = 2**30  # a CUDA/HIP context of another process alone takes a few hundred MiB


def describe_device(device: torch.device | str | None = None) -> str:
    """One line: which device this notebook uses and which environment variable assigned it."""
    device = dev.get_device(None if device is None else str(device))
    if device.type != "cuda":
        return f"Device: cpu ({dev.device_name(device)})"
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    variable = dev.visible_devices_variable()
    assigned = os.environ.get(variable)
    origin = (f"{variable}={assigned}, as assigned by the hub" if assigned is not None
              else f"{variable} is not set, so this is the first GPU of the node")
    return (f"Device: {device} = {dev.device_name(device)} ({origin}; "
            f"{torch.cuda.device_count()} GPU(s) visible)")


def check_busy(device: torch.device | str | None = None, threshold_bytes: int = BUSY_THRESHOLD_BYTES,
               quiet: bool = False) -> bool:
    """Warn (and return ``True``) when more than ``threshold_bytes`` of the GPU's memory is held by
    other processes: timings will then be slower and noisier than on an idle GPU. ``False`` on the
    CPU and on an idle GPU."""
    used = dev.memory_in_use_by_others(device)
    if used is None or used <= threshold_bytes:
        return False
    if not quiet:
        print(f"WARNING: the GPU is already busy: {used / 2**30:.1f} GiB of its memory is held by other "
              "processes (another kernel of yours, or another user). Your timings will be slower and "
              "noisier; shut down kernels you no longer use (Kernel > Shut Down Kernel), or ask the "
              "instructor for another GPU.")
    return True


def _holds_device_memory(value: object) -> bool:
    return isinstance(value, (torch.Tensor, torch.nn.Module, torch.optim.Optimizer))


def finish(namespace: MutableMapping[str, object] | None = None,
           device: torch.device | str | None = None, quiet: bool = False) -> list[str]:
    """Free this notebook's device memory for the next notebook and for other users.

    Pass ``globals()`` to also delete the notebook's tensors, models and optimizers (names starting
    with ``_`` are kept). Returns the names deleted.
    """
    device = dev.get_device(None if device is None else str(device))
    before = dev.memory_stats(device).reserved_bytes
    deleted: list[str] = []
    if namespace is not None:
        deleted = sorted(name for name, value in namespace.items()
                         if not name.startswith("_") and _holds_device_memory(value))
        for name in deleted:
            del namespace[name]
    dev.free_memory(device)
    if not quiet:
        freed = ""
        if before is not None:
            after = dev.memory_stats(device).reserved_bytes or 0
            freed = f"; device memory held by this kernel: {before / 2**20:.0f} MiB -> {after / 2**20:.0f} MiB"
        names = ", ".join(deleted) if deleted else "none"
        print(f"Finished: deleted {len(deleted)} tensor/model variable(s) ({names}){freed}.")
    return deleted
