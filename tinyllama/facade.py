"""Lazy re-exports for the packages' public surfaces (PEP 562).

A package lists the names a notebook may import from it and the module that holds each; the module is
imported the first time one of its names is asked for. Notebooks then import from a handful of packages
(``from tinyllama.harness import run_benchmark``), a module can move inside its package by changing one
line of that list, and importing a package stays cheap: nothing it lists is loaded until used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any


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
