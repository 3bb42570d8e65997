"""TinyLLaMA: a LLaMA-style decoder in four ever faster versions, with the tools to measure them.

Read the spine first, top to bottom:

- ``config``: the model's shape, the problem sizes, precisions and compile modes, the errors of a bad setting;
- ``models/``: the four versions (V1's class declares the contract the harnesses read);
- ``kernels/``: the Triton kernels of V3, each beside its launcher, autograd Function and reference;
- ``training``: the training step every harness times; ``data``: real text to train on;
- ``timing``: honest timing of device work and the verdicts drawn from it;
- ``correctness``: the checks that run before anything is timed;
- ``device``: everything that depends on the GPU vendor.

Then the folders built on it, each importing only what lies above it in this list:

- ``costs/``: what a step must cost on paper (FLOPs, bytes, memory) and the device's measured ceilings;
- ``profiling/``: the instruments (torch.profiler, vendor profilers, the roofline);
- ``generation/``: text generation with a KV cache;
- ``harness/``: the command lines that run a measurement end to end and write its record;
- ``course/``: the notebooks' machinery (checks, records of a participant's runs, the generator).

The packages' public surfaces: ``lazy_exports`` gives a package the ``__getattr__`` that imports the names
notebooks use from it on first use (PEP 562), so importing a package stays cheap and a module can move inside
its package with one line of its ``_LAZY`` table changed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

__version__ = "0.1.0"


def lazy_exports(package: str, names: Mapping[str, str], namespace: MutableMapping[str, Any]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` that import ``names`` (name -> module, absolute or
    relative to ``package``; ``module:attribute`` where the name differs from the module's, as where a
    function shares its module's name) on first use and keep them in ``namespace`` (the package's
    ``globals()``)."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = names[name].partition(":")
        value = getattr(importlib.import_module(module, package), attribute or name)
        namespace[name] = value  # later lookups find it without this function
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
