"""How many kernels one step launches, and where its device time goes by kind of work.

:func:`take_census` answers, for one or more :class:`~inference.config.BenchmarkConfig`, the questions
a compile option raises: how many device kernels does one inference step launch, and how does the
step's device time split between convolutions, batch norms, element-wise and Inductor-fused kernels,
matrix products, copies and layout conversions? Each configuration is built and checked exactly as the
benchmark builds it (the same network, weights, inputs and compile; the first warm-up iteration
compared with fp32 eager), warmed up, then a few steps are recorded with ``torch.profiler``.

The profiler runs **in a subprocess** (``python -m inference.kernel_census``): a profiler session
leaves the process that ran it slower (the CUPTI callbacks stay installed), so the notebook that asks
keeps timing honestly afterwards. Nothing of the census is timed against anything else: its times are
shares of one step.

What the counts are:

- on a GPU, every device kernel, copy and fill the profiler recorded, divided by the recorded steps
  (kernels inside a replayed CUDA graph count one by one, as the GPU runs them);
- on a CPU nothing is launched: the count is the host's top-level ATen operator calls plus the kernels
  Inductor generated (``cpp_fused_*``), each of which would be at least one launch on a GPU, and their
  time is CPU time. ``Census.source`` says which.

Kinds (:data:`KINDS`) come from the names, read by :func:`tinyllama.profiling.kernel_names.kernel_class`
(cuDNN/MIOpen/cuBLAS/hipBLASLt/PyTorch kernel names and ATen operators) and
:func:`tinyllama.profiling.kernel_names.is_fused_kernel` (Inductor's generated kernels). An Inductor
kernel whose name says it computes a batch norm (``triton_poi_fused__native_batch_norm_legit_no_training_relu_0``:
the batch norm fused with the ReLU after it) counts as batch norm: it still reads and writes the whole
activation for it. With Inductor's freezing the batch norms are folded into the convolutions' weights and
biases, and no kernel is left that computes one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from inference.config import BenchmarkConfig, BenchmarkError
from tinyllama.profiling.kernel_names import BATCH_NORM as _BN_CLASS
from tinyllama.profiling.kernel_names import CONV_GEMM, COPY, ELEMENTWISE, LAYOUT, kernel_class
from tinyllama.profiling.kernel_names import is_convolution_kernel, is_fused_kernel

CONVOLUTION, BATCH_NORM, FUSED, MATRIX_PRODUCT, COPY_LAYOUT, OTHER = (
    "convolution", "batch norm", "element-wise / fused", "matrix product", "copy / layout", "other")
KINDS = (CONVOLUTION, BATCH_NORM, FUSED, MATRIX_PRODUCT, COPY_LAYOUT, OTHER)
PROFILED_STEPS = 3  # recorded steps per configuration (the counts are divided by it)
TIMEOUT_S = 1200.0  # a census compiles each configuration again: minutes on a CPU, seconds on a GPU

# Matrix products kernel_class does not name: the CPU's oneDNN/MKL linear layers after freezing.
_LINEAR = re.compile(r"_linear\b|_linear_pointwise|mkl_linear")


def kernel_kind(name: str) -> str:
    """The kind of work (one of :data:`KINDS`) a kernel, or on a CPU an operator, does, from its name."""
    kind = kernel_class(name)
    fused = is_fused_kernel(name)
    if kind == _BN_CLASS or (fused and "batch_norm" in name):
        return BATCH_NORM
    if fused:
        return FUSED
    if kind == CONV_GEMM or _LINEAR.search(name):
        return CONVOLUTION if is_convolution_kernel(name) else MATRIX_PRODUCT
    if kind == ELEMENTWISE:
        return FUSED
    if kind in (COPY, LAYOUT):
        return COPY_LAYOUT
    return OTHER


@dataclass(frozen=True)
class Census:
    """What one step of one configuration ran. ``kernels``: one row per kernel name (``kernel``, ``kind``,
    ``per_step``: launches per step, ``ms_per_step``); ``source``: ``"device kernels"`` or the CPU's
    operators; ``check``: the correctness check of the run the census profiled."""

    label: str
    device: str
    on_device: bool
    source: str
    steps: int
    check: str
    kernels: pd.DataFrame

    @property
    def per_step(self) -> float:
        """Kernels (on a CPU: top-level operator calls and generated kernels) per step."""
        return float(self.kernels["per_step"].sum())

    @property
    def ms_per_step(self) -> float:
        """Device time of one step (on a CPU: the CPU time of its operators), as the profiler saw it."""
        return float(self.kernels["ms_per_step"].sum())

    def by_kind(self) -> pd.DataFrame:
        """One row per kind of :data:`KINDS` (all of them, zeros included): ``per_step``,
        ``ms_per_step`` and ``share_pct`` of the step's time."""
        grouped = self.kernels.groupby("kind")[["per_step", "ms_per_step"]].sum().reindex(list(KINDS), fill_value=0.0)
        total = grouped["ms_per_step"].sum()
        grouped["share_pct"] = 100.0 * grouped["ms_per_step"] / total if total else 0.0
        return grouped.rename_axis("kind")

    def share(self, kind: str) -> float:
        """Percent of the step's time in ``kind``."""
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
        return float(self.by_kind().loc[kind, "share_pct"])


def census_table(censuses: Mapping[str, Census] | Sequence[Census]) -> pd.DataFrame:
    """The censuses side by side, one row each: kernels per step, time per step and each kind's share (%)."""
    items = list(censuses.values()) if isinstance(censuses, Mapping) else list(censuses)
    rows = []
    for census in items:
        kinds = census.by_kind()
        rows.append({"configuration": census.label, "kernels_per_step": census.per_step,
                     "ms_per_step": census.ms_per_step,
                     **{f"{kind} %": kinds.loc[kind, "share_pct"] for kind in KINDS}})
    return pd.DataFrame(rows).set_index("configuration")


class CensusError(BenchmarkError):
    """The census subprocess failed (a configuration that cannot run, a failed check, a timeout)."""


def take_census(configs: Mapping[str, BenchmarkConfig], steps: int = PROFILED_STEPS,
                timeout_s: float = TIMEOUT_S) -> dict[str, Census]:
    """Profile ``steps`` inference steps of each configuration (by label) in one fresh Python process, one
    profiler session per configuration, and return their censuses by label. This process runs no
    profiler and keeps no trace of one. Raises :class:`CensusError` with the subprocess's message."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1 (got {steps})")
    if not configs:
        raise ValueError("no configuration to take a census of")
    for label, config in configs.items():
        if config.mode != "inference":
            raise ValueError(f"{label}: the census profiles inference steps (mode='inference'), not {config.mode!r}")
        config.validate()
    with tempfile.TemporaryDirectory(prefix="kernel-census-") as folder:
        request, answer = Path(folder) / "request.json", Path(folder) / "census.json"
        request.write_text(json.dumps({"steps": steps, "configs": {label: dataclasses.asdict(config)
                                                                   for label, config in configs.items()}}))
        command = [sys.executable, "-m", "inference.kernel_census", str(request), str(answer)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                                  env={**os.environ, "PYTHONWARNINGS": "ignore"})
        except subprocess.TimeoutExpired:
            raise CensusError(f"the census took more than {timeout_s:.0f} s and was stopped") from None
        if done.returncode != 0 or not answer.exists():
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            message = next((line.removeprefix("census: ") for line in reversed(lines) if line.startswith("census: ")),
                           "\n".join(lines[-12:]) or f"exit status {done.returncode}")
            raise CensusError(f"the census subprocess failed: {message}")
        data = json.loads(answer.read_text())
    return {label: _census(label, entry, data["steps"]) for label, entry in data["censuses"].items()}


def _census(label: str, entry: dict[str, Any], steps: int) -> Census:
    rows = pd.DataFrame(entry["rows"], columns=["kernel", "calls", "total_us"])
    kernels = pd.DataFrame({"kernel": rows["kernel"], "kind": rows["kernel"].map(kernel_kind),
                            "per_step": rows["calls"] / steps, "ms_per_step": rows["total_us"] / 1e3 / steps})
    kernels = kernels.sort_values("ms_per_step", ascending=False, ignore_index=True)
    return Census(label, entry["device"], entry["on_device"], entry["source"], steps, entry["check"], kernels)


def plot_census(censuses: Mapping[str, Census], title: str, ax: Any = None) -> Any:
    """One horizontal bar per configuration: the step's time split by kind (percent), the kernels per
    step written beside it. Returns the figure."""
    import matplotlib.pyplot as plt

    table = census_table(censuses)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.7 * len(table) + 1.8))
    colors = dict(zip(KINDS, ["tab:blue", "tab:red", "tab:orange", "tab:purple", "tab:gray", "tab:olive"]))
    left = pd.Series(0.0, index=table.index)
    for kind in KINDS:
        values = table[f"{kind} %"]
        ax.barh(table.index, values, left=left, color=colors[kind], label=kind)
        left += values
    counted = "kernels" if next(iter(censuses.values())).on_device else "ops + generated kernels"
    for y, (label, row) in enumerate(table.iterrows()):
        ax.annotate(f"{row['kernels_per_step']:.0f} {counted}\nper step", (100, y), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=8)
    ax.set_xlim(0, 135)
    ax.set_xticks(range(0, 101, 20))
    ax.set_xlabel("share of one step's " + ("device time" if next(iter(censuses.values())).on_device else "CPU time")
                  + " (%)")
    ax.invert_yaxis()
    ax.legend(fontsize=8, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    ax.set_title(title, fontsize=9, pad=44)
    ax.figure.tight_layout()
    return ax.figure


__all__ = ["BATCH_NORM", "CONVOLUTION", "COPY_LAYOUT", "Census", "CensusError", "FUSED", "KINDS", "MATRIX_PRODUCT",
           "OTHER", "census_table", "kernel_kind", "plot_census", "take_census"]


# --------------------------------------------------------------------------------------------------
# The subprocess: build, check, warm up and profile each configuration
# --------------------------------------------------------------------------------------------------


def _profile_one(config: BenchmarkConfig, steps: int) -> dict[str, Any]:
    import torch
    import torch._inductor.config as inductor_config

    from inference import distributed, networks
    from inference.benchmark import _cudnn_benchmark, _Run
    from tinyllama import device as dev
    from tinyllama.profiling.torch_profiler import has_operator_ancestor, is_device_event, profile_steps, row_kind
    from tinyllama.timing import PhaseTimer

    # On a CPU Inductor's generated C++ kernels run unseen unless each is wrapped in a profiler range.
    inductor_config.cpp.enable_kernel_profile = True
    spec = networks.get_spec(config.network)
    device = distributed.resolve_device(config.device)
    run = _Run(config, spec, distributed.current(), device, config.batch_size)
    try:
        run.prepare()
        with _cudnn_benchmark(device):
            # The first iteration is checked against fp32 eager. This process profiles (each configuration
            # after the first follows a profile), and reports no times: a profiled run's timer.
            run.warm_up(PhaseTimer(device, profiled=True), "")
            profiled = profile_steps(run.step, device=device, wait=0, warmup=1, active=steps)
        if profiled.on_device:
            table = profiled.kernels()
            rows = [[name, int(calls), float(ns) / 1e3] for name, calls, ns in
                    zip(table["kernel"], table["calls"], table["total_ns"])]
            source = "device kernels"
        else:
            totals: dict[str, list[float]] = {}
            for event in profiled.profiler.events():
                if is_device_event(event):
                    continue
                top_operator = row_kind(event.name) == "operator" and not has_operator_ancestor(event)
                if top_operator or is_fused_kernel(event.name):
                    entry = totals.setdefault(event.name, [0, 0.0])
                    entry[0] += 1
                    entry[1] += float(event.cpu_time_total)
            rows = [[name, int(calls), us] for name, (calls, us) in totals.items()]
            source = ("CPU operators: no kernels are launched on a CPU; top-level ATen operator calls and "
                      "Inductor's generated C++ kernels, with their CPU time")
        return {"rows": rows, "source": source, "on_device": profiled.on_device, "check": run.check,
                "device": dev.device_name(device)}
    finally:
        del run
        dev.free_memory(device)
        torch._dynamo.reset()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m inference.kernel_census REQUEST.json ANSWER.json``: the subprocess of :func:`take_census`."""
    parser = argparse.ArgumentParser(prog="python -m inference.kernel_census", description=main.__doc__)
    parser.add_argument("request")
    parser.add_argument("answer")
    args = parser.parse_args(argv)
    request = json.loads(Path(args.request).read_text())
    censuses = {}
    for label, fields in request["configs"].items():
        config = BenchmarkConfig(**{**fields, "progress": False})
        try:
            censuses[label] = _profile_one(config, int(request["steps"]))
        except BenchmarkError as error:
            print(f"census: {label}: {error}", file=sys.stderr)
            return 2
    Path(args.answer).write_text(json.dumps({"steps": int(request["steps"]), "censuses": censuses}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
