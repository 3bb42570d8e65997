"""What a training step is made of, measured from the model itself: parameters, the activations
autograd keeps for the backward, and how large a batch fits in memory.

These are the references against which formulas written by hand are checked (notebook 10):

- :func:`built_parameter_count`: ``sum(p.numel())`` of a model built on the meta device (no memory);
- :func:`saved_activations`: the bytes autograd saves during a forward pass for its backward, each
  storage counted once, the model's parameters and buffers excluded (any device, exact);
- :func:`fit_batch_seq`: the coefficients ``a, b, c`` of ``bytes = B*(a*S + b*S^2) + c`` from measured
  points, which says whether a quantity grows linearly or quadratically with the sequence length;
- :func:`largest_batch`: the largest batch for which ``fits(batch)`` is true (doubling, then bisection);
- :func:`pretend_out_of_memory`: raise ``torch.OutOfMemoryError`` once an amount of memory has been
  allocated, to test out-of-memory handling on a CPU, where a real one would kill the machine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from tinyllama.config import ModelConfig

# torch.OutOfMemoryError exists from torch 2.5; older releases only have the CUDA one.
OutOfMemoryError: type[RuntimeError] = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


def built_parameter_count(config: ModelConfig, version: str = "v1") -> int:
    """``sum(p.numel() for p in model.parameters())`` of ``version`` built with ``config`` on the meta
    device (shapes only: costs nothing even for the large preset)."""
    from tinyllama.models import build

    with torch.device("meta"):
        model = build(version, config)
    return sum(p.numel() for p in model.parameters())


@dataclass(frozen=True)
class SavedTensor:
    """One storage autograd saved for the backward: its bytes, the shape and dtype of the first tensor saved
    on it, and the label :func:`saved_for_backward` was asked to give it."""

    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    label: Any = None


@contextlib.contextmanager
def saved_for_backward(exclude: Iterable[torch.Tensor] = (),
                       label: Callable[[torch.Tensor], Any] | None = None) -> Iterator[dict[int, SavedTensor]]:
    """Within the block, every storage autograd saves for the backward, once (views of one tensor share
    it), through ``torch.autograd.graph.saved_tensors_hooks``: storage address -> :class:`SavedTensor`.
    The storages of ``exclude`` (a model's parameters and buffers: they exist whether or not a step runs)
    and meta tensors (no memory) are left out; ``label(tensor)`` says what saved a storage, asked when it
    is first seen. Saved tensors live until the backward, so no two of them share an address."""
    skip = {tensor.untyped_storage().data_ptr() for tensor in exclude}
    saved: dict[int, SavedTensor] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if tensor.device.type != "meta" and key not in skip and key not in saved:
            saved[key] = SavedTensor(storage.nbytes(), tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."),
                                     label(tensor) if label is not None else None)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield saved


@dataclass
class SavedActivations:
    """The tensors autograd saved for the backward during one forward pass.

    ``bytes``: their total (each storage once); ``table``: one row per shape and dtype with columns
    ``shape``, ``dtype``, ``tensors`` and ``mib``, largest first.
    """

    bytes: int
    table: pd.DataFrame = field(repr=False)


def saved_activations(model: nn.Module, forward: Callable[[], torch.Tensor]) -> SavedActivations:
    """Run ``forward()`` (it returns the loss) under ``torch.autograd.graph.saved_tensors_hooks``,
    record every tensor saved for the backward, then run the backward (which frees them).

    Each storage is counted once (views of one tensor share it), and the storages of ``model``'s
    parameters and buffers are left out: they exist whether or not a step runs. The result is exact
    and the same on every device; on a GPU the allocator's peak adds the backward's temporaries.
    """
    with saved_for_backward(exclude=[*model.parameters(), *model.buffers()]) as saved:
        loss = forward()
    loss.backward()
    rows: dict[tuple[tuple[int, ...], str], list[int]] = {}
    for tensor in saved.values():
        rows.setdefault((tensor.shape, tensor.dtype), []).append(tensor.nbytes)
    table = pd.DataFrame([{"shape": str(shape), "dtype": dtype, "tensors": len(sizes), "mib": sum(sizes) / 2**20}
                          for (shape, dtype), sizes in rows.items()], columns=["shape", "dtype", "tensors", "mib"])
    table = table.sort_values("mib", ascending=False, ignore_index=True)
    return SavedActivations(sum(tensor.nbytes for tensor in saved.values()), table)


def fit_batch_seq(points: Sequence[tuple[int, int, float]]) -> tuple[float, float, float]:
    """Least-squares ``a, b, c`` of ``value = B*(a*S + b*S**2) + c`` over ``(B, S, value)`` points:
    ``a`` is the part per token, ``b`` the part per (token, token) pair, ``c`` what does not grow."""
    if len(points) < 3:
        raise ValueError("fitting three coefficients needs at least three (batch, seq, value) points")
    design = torch.tensor([[b * s, b * s * s, 1.0] for b, s, _ in points], dtype=torch.float64)
    target = torch.tensor([[float(v)] for _, _, v in points], dtype=torch.float64)
    scale = design.abs().amax(dim=0).clamp_min(1.0)  # columns differ by orders of magnitude
    solution = torch.linalg.lstsq(design / scale, target).solution.squeeze(1) / scale
    return float(solution[0]), float(solution[1]), float(solution[2])


@dataclass
class BatchSearch:
    """The outcome of :func:`largest_batch`: the largest batch that fitted (``None``: not even the
    first), the smallest that did not (``None``: none failed up to ``limit``), and every probe."""

    largest: int | None
    first_failing: int | None
    limit: int
    probes: list[tuple[int, str]] = field(default_factory=list)  # (batch, "fits" or "out of memory")

    def describe(self) -> str:
        """One line: the largest batch that fits, what bounds it, and every probe."""
        probes = ", ".join(f"{b}: {status}" for b, status in self.probes)
        if self.largest is None:
            return f"not even batch {self.probes[0][0]} fits (probes: {probes})"
        bound = (f"batch {self.first_failing} does not" if self.first_failing is not None
                 else f"no out-of-memory up to the search's limit of {self.limit}")
        return f"largest batch that fits: {self.largest} ({bound}; probes: {probes})"


def largest_batch(fits: Callable[[int], bool], start: int = 1, limit: int = 4096,
                  resolution: float = 0.0625) -> BatchSearch:
    """Double the batch from ``start`` while ``fits(batch)`` is true and the batch stays within
    ``limit``, then bisect between the last batch that fitted and the first that did not, until they
    are within ``resolution`` (a fraction of the smaller, at least 1) of each other.

    ``fits`` must return ``False`` on out-of-memory (and leave the memory as it found it), not raise.
    """
    if not 1 <= start <= limit:
        raise ValueError(f"the search needs 1 <= start <= limit (got start {start}, limit {limit})")
    probes: list[tuple[int, str]] = []

    def probe(batch: int) -> bool:
        ok = bool(fits(batch))
        probes.append((batch, "fits" if ok else "out of memory"))
        return ok

    good, bad, batch = 0, None, start
    while batch <= limit:
        if probe(batch):
            good, batch = batch, batch * 2
        else:
            bad = batch
            break
    if bad is not None:
        while bad - good > max(1, int(good * resolution)):
            middle = (good + bad) // 2
            if probe(middle):
                good = middle
            else:
                bad = middle
    return BatchSearch(good or None, bad, limit, probes)


class _Budget(TorchDispatchMode):
    def __init__(self, budget_bytes: int) -> None:
        super().__init__()
        self.budget_bytes = budget_bytes
        self.allocated = 0
        self.raised = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.raised:  # once: what runs after the error (clean-up included) gets its memory
            return out
        for tensor in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(tensor, torch.Tensor):
                self.allocated += tensor.numel() * tensor.element_size()
        if self.allocated > self.budget_bytes:
            self.raised = True
            raise OutOfMemoryError(f"pretend out of memory: {self.allocated:,} bytes allocated, more than the "
                                   f"pretend device's {self.budget_bytes:,} (raised by tinyllama.costs.anatomy."
                                   "pretend_out_of_memory)")
        return out


@contextlib.contextmanager
def pretend_out_of_memory(budget_bytes: int) -> Iterator[_Budget]:
    """Within the block, raise ``torch.OutOfMemoryError`` once, as soon as the operators run there have
    produced more than ``budget_bytes`` of outputs in total (frees are not counted). Forward, backward
    and optimizer operators all count; after the error nothing is counted any more, so the clean-up
    that follows runs. The yielded object's ``allocated`` says how much was produced, ``raised``
    whether the error was raised."""
    with _Budget(budget_bytes) as mode:
        yield mode
