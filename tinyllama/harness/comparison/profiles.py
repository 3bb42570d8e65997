"""What the profiler says about each run of a comparison: its GEMM counts and top operations.

``tinyllama.harness.compare`` times every run first and asks these questions afterwards, through
:func:`tinyllama.profiling.isolated.isolated`: in a process of their own, so that the profiler's residue
slows no timing, neither the comparison's nor any its caller makes next. :func:`profile_runs` is what
runs in that process: it rebuilds each run's model with V1's weights (the runs were checked against V1
already) and profiles its training step on the comparison's first batch.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from tinyllama import device as dev
from tinyllama.harness.comparison.runs import RunSpec
from tinyllama.models import build
from tinyllama.models.weights import from_canonical, unwrap
from tinyllama.profiling.queries import count_gemms, top_operations


def profile_runs(specs: Sequence[RunSpec], config: Any, weights: dict[str, torch.Tensor],
                 batch: tuple[torch.Tensor, torch.Tensor], device: str, gemm_counts: bool,
                 top_of: Sequence[str], top: int) -> dict[str, dict[str, Any]]:
    """Per run label: ``gemm_ops`` and ``gemm_kernels`` (when ``gemm_counts``), ``profile`` (the ``top``
    operations, for labels in ``top_of``), or ``error`` (what stopped this run's profile: out of memory,
    say). Meant to run in a fresh process (see the module docstring)."""
    where = dev.get_device(device)
    inputs, targets = (t.to(where) for t in batch)
    out: dict[str, dict[str, Any]] = {}
    for spec in specs:
        answers: dict[str, Any] = {}
        try:
            torch._dynamo.reset()  # each run compiles afresh, as when it was checked and timed
            with where:
                model = build(spec.version, config, **spec.model_options)
            unwrap(model).load_state_dict(from_canonical(model, {k: v.to(where) for k, v in weights.items()}))
            if gemm_counts:
                answers.update(count_gemms(model, (inputs, targets), spec.precision, where))
            if spec.label in top_of:
                answers["profile"] = top_operations(model, (inputs, targets), spec.precision, where, top=top)
            del model
        except Exception as error:  # noqa: BLE001 - out-of-memory is reported for the run, not raised
            if not dev.is_out_of_memory(error):
                raise
            answers["error"] = "out of memory while profiling"
        out[spec.label] = answers
        dev.free_memory(where)
    return out
