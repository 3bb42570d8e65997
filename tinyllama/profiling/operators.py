"""The ATen operators a piece of code calls, recorded without a profiler.

A ``TorchDispatchMode`` sees every operator the dispatcher runs, on any device (the meta device included:
shapes only, no arithmetic), and nothing of it stays attached when it exits. A profiler session does stay
(after one, every later launch in the process is slower: :mod:`tinyllama.timing`), so this is how the course
asks what ran before or between timings: which SDPA backend, how many operators a decode step calls, which
copies a function makes, what a network's forward is made of.
"""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class OperatorCalls(TorchDispatchMode):
    """While active (``with OperatorCalls() as calls:``), records each ATen operator called, in order:
    ``calls.calls`` holds their ``OpOverload`` (``is_view``, ``overloadpacket``, ``_schema``), ``calls.names``
    their schema names (``aten::mm``)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Any] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.calls.append(func)
        return func(*args, **(kwargs or {}))

    @property
    def names(self) -> list[str]:
        """The schema name of each call, in order (``aten::addmm``)."""
        return [func._schema.name for func in self.calls]


__all__ = ["OperatorCalls"]
