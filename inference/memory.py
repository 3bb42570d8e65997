"""A memory budget for a block of code, on a GPU and on the CPU alike.

On a GPU the budget caps PyTorch's caching allocator (:func:`tinyllama.device.cap_memory`): an
allocation past it raises the ``torch.OutOfMemoryError`` of a full device. On the CPU, memory is the
machine's RAM: running out of it swaps or kills the process instead of raising. There
:class:`LiveBytesBudget` counts the bytes of the tensors created in the block that are still alive
(each storage once, freed ones subtracted), and raises the same error when they pass the budget. So a
search for the largest batch finds a real limit in a notebook on either device.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from tinyllama import device as dev

# torch.OutOfMemoryError exists from torch 2.5; older releases only have the CUDA one.
OutOfMemoryError: type[RuntimeError] = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


class LiveBytesBudget(TorchDispatchMode):
    """Count the bytes of live storages created by the operators run in the block; raise
    ``torch.OutOfMemoryError`` when they would pass ``budget_bytes``.

    ``peak_bytes`` is the largest count seen. Storages are tracked through weak references, so a
    tensor freed by Python (or by the autograd graph) stops counting; views share their base's storage
    and count once. Tensors that existed before the block are not counted.
    """

    def __init__(self, budget_bytes: int) -> None:
        super().__init__()
        if budget_bytes <= 0:
            raise ValueError(f"the memory budget must be positive (got {budget_bytes} bytes)")
        self.budget_bytes = budget_bytes
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak_bytes = 0
        self.raised = False

    def live_bytes(self) -> int:
        """Bytes of the tracked storages that are still alive (forgets the freed ones)."""
        for key in [key for key, (ref, _) in self.live.items() if ref.expired()]:
            del self.live[key]
        return sum(size for _, size in self.live.values())

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.raised:  # once: what runs after the error (its clean-up) gets its memory
            return out
        for tensor in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu" and not tensor.is_sparse:
                storage = tensor.untyped_storage()
                ref = StorageWeakRef(storage)
                known = self.live.get(ref.cdata)
                if known is None or known[0].expired():  # new, or a freed storage's address reused
                    self.live[ref.cdata] = (ref, storage.nbytes())
        used = self.live_bytes()
        self.peak_bytes = max(self.peak_bytes, used)
        if used > self.budget_bytes:
            self.raised = True
            raise OutOfMemoryError(f"out of memory (memory budget): {used:,} bytes of live tensors, more than the "
                                   f"budget of {self.budget_bytes:,} (raised by inference.memory.memory_budget)")
        return out


@contextlib.contextmanager
def memory_budget(device: torch.device | str, budget_bytes: int) -> Iterator[LiveBytesBudget | None]:
    """Run the block with at most ``budget_bytes`` of memory on ``device``: on a GPU by capping the
    caching allocator (yields ``None``), on the CPU by counting live tensors (yields the
    :class:`LiveBytesBudget`, whose ``peak_bytes`` says how much the block held at most)."""
    device = torch.device(device)
    if device.type == "cuda":
        with dev.cap_memory(device, budget_bytes):
            yield None
        return
    with LiveBytesBudget(budget_bytes) as budget:
        yield budget
