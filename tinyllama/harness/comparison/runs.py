"""Run specifications of a comparison: ``"v2[fuse_qkv=0,sdpa=1]:bf16"`` is a version, its switches
(the model's declared ``switch_names`` and the run's own ``cuda_graph``) and a precision; and the
ready-made run sets (``--runs fusions``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

from tinyllama.config import PRECISIONS
from tinyllama.harness.cli import parse_option
from tinyllama.models import VERSIONS, model_class

# Ready-made run lists (``--runs fusions``): each switches on one more optimization than the last.
RUN_SETS: dict[str, list[str]] = {
    "versions": ["v1:fp32", *(v for v in VERSIONS if v != "v1")],
    "fusions": ["v1:fp32", "v2[fuse_qkv=0,fuse_gate_up=0]:fp32", "v2[fuse_qkv=1,fuse_gate_up=0]:fp32",
                "v2[fuse_qkv=0,fuse_gate_up=1]:fp32", "v2:fp32"],
    "ladder": ["v1:fp32", "v1:bf16", "v2:bf16", "v2[sdpa=1]:bf16", "v2[sdpa=1,compile=1]:bf16", "v4:bf16"],
}


_SPEC = re.compile(r"^(?P<version>[A-Za-z0-9_.-]+)(?:\[(?P<options>[^\]]*)\])?(?::(?P<precision>[A-Za-z0-9]+))?$")


# Switches of the run rather than of the model: any version takes them.
RUN_SWITCHES = ("cuda_graph",)  # 1: replay each training step from CUDA graphs (tinyllama.harness.bench)


@dataclass(frozen=True)
class RunSpec:
    """One run of a comparison: a version, its switches and a precision."""

    version: str
    precision: str
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        """The spec written back, e.g. ``v2[fuse_qkv=0]:fp32``: the run's name in tables and files."""
        opts = ",".join(f"{k}={_format_value(v)}" for k, v in self.options)
        return f"{self.version}{f'[{opts}]' if opts else ''}:{self.precision}"

    @property
    def model_options(self) -> dict[str, Any]:
        """The switches passed to the model's constructor."""
        return {k: v for k, v in self.options if k not in RUN_SWITCHES}

    @property
    def cuda_graph(self) -> bool | None:
        """Whether the run's training steps are replayed from CUDA graphs, as the spec says (``cuda_graph=1``
        or ``=0``); ``None`` where it says nothing: the version's own setting, which the harness resolves
        with the model on the device (``tinyllama.training.replays_step``; the record's ``cuda_graph`` says
        what ran)."""
        value = dict(self.options).get("cuda_graph")
        return None if value is None else bool(value)


def _format_value(value: Any) -> str:
    return str(int(value)) if isinstance(value, bool) else str(value)


def parse_run(text: str) -> RunSpec:
    """Read ``VERSION[KEY=VALUE,...][:PRECISION]``. Without a precision, the version's preferred one
    (V4: bf16) or fp32. Raises ``ValueError`` naming what is wrong."""
    match = _SPEC.match(text.strip())
    if not match:
        raise ValueError(f"cannot read run {text!r}: write VERSION[KEY=VALUE,...]:PRECISION, e.g. v2[fuse_qkv=0]:fp32")
    version = match["version"]
    if version not in VERSIONS:
        raise ValueError(f"run {text!r}: unknown version {version!r}; choose one of {', '.join(VERSIONS)}")
    cls = model_class(version)
    options = tuple(parse_option(o.strip()) for o in (match["options"] or "").split(",") if o.strip())
    allowed = [*cls.switch_names, *RUN_SWITCHES]
    for key, _ in options:
        if key not in allowed:
            choices = ", ".join(allowed) if allowed else "none"
            raise ValueError(f"run {text!r}: {version} has no switch {key!r} (its switches: {choices})")
    precision = match["precision"] or cls.preferred_precision
    if precision not in PRECISIONS:
        raise ValueError(f"run {text!r}: unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    return RunSpec(version, precision, options)


def expand_runs(items: Iterable[str | RunSpec]) -> list[RunSpec]:
    """Specs and run-set names (``fusions``, ``ladder``, ``versions``) as a list of distinct runs."""
    specs: list[RunSpec] = []
    for item in items:
        if isinstance(item, RunSpec):
            new = [item]
        elif item in RUN_SETS:
            new = [parse_run(s) for s in RUN_SETS[item]]
        else:
            new = [parse_run(item)]
        specs.extend(s for s in new if s.label not in {x.label for x in specs})
    if not specs:
        raise ValueError("no runs given: name at least one, e.g. v1:fp32 v2:fp32")
    return specs
