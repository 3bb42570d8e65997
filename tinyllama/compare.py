"""Compare TinyLLaMA versions honestly: one process, one device, the same weights and batches.

    python -m tinyllama.compare --preset medium --runs v1:fp32 v2:fp32 "v2[fuse_qkv=0]:fp32" v4:bf16

For each run, in order:
1. the model is built and V1's weights are copied into it (``transfer_weights``), so every run
   computes with the same numbers;
2. it is checked against V1 at fp32 on a fresh random batch: logits, loss and the gradient of every
   parameter (fused weights split back into V1's) must agree, and every parameter must receive a
   gradient; a run at another precision is also checked at that precision, with a looser tolerance.
   A run that fails is not timed;
3. it is timed by the training benchmark (``tinyllama.bench``) on batches shared by all runs;
4. the profiler counts its matrix-multiply (GEMM) launches in one training step: the evidence that a
   fusion really replaced several products by one.

The result is one record (device, date, torch version, every run) that prints as a table, appends to
a JSON or CSV file, plots (``plot_comparison``) and compares with an earlier record
(``find_regressions``: each figure that moved by more than the two runs' own spread is flagged).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import inspect
import math
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from torch import nn

from tinyllama import device as dev
from tinyllama.bench import (PRECISIONS, BenchmarkError, TrainingStep, add_problem_size_arguments, autocast_context,
                             check_cuda_graph, make_batches, parse_option, resolve_config, run_benchmark,
                             set_matmul_precision, shape_overrides)
from tinyllama.checks import CorrectnessError, parameters_without_gradient
from tinyllama.models import VERSIONS, build, lm_loss, model_class
from tinyllama.models.weights import canonical_gradients, canonical_state_dict, from_canonical, unwrap

RECORD_KIND = "tinyllama.compare"

# Ready-made run lists (``--runs fusions``): each switches on one more optimization than the last.
RUN_SETS: dict[str, list[str]] = {
    "versions": ["v1:fp32", *(v for v in VERSIONS if v != "v1")],
    "fusions": ["v1:fp32", "v2[fuse_qkv=0,fuse_gate_up=0]:fp32", "v2[fuse_qkv=1,fuse_gate_up=0]:fp32",
                "v2[fuse_qkv=0,fuse_gate_up=1]:fp32", "v2:fp32"],
    "ladder": ["v1:fp32", "v1:bf16", "v2:bf16", "v2[sdpa=1]:bf16", "v2[sdpa=1,compile=1]:bf16", "v4:bf16"],
}


# ------------------------------------------------------------------------------------------------
# Run specifications: "v2[fuse_qkv=0,sdpa=1]:bf16"
# ------------------------------------------------------------------------------------------------

_SPEC = re.compile(r"^(?P<version>[A-Za-z0-9_.-]+)(?:\[(?P<options>[^\]]*)\])?(?::(?P<precision>[A-Za-z0-9]+))?$")


# Switches of the run rather than of the model: any version takes them.
RUN_SWITCHES = ("cuda_graph",)  # 1: replay each training step from CUDA graphs (tinyllama.bench)


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
    def cuda_graph(self) -> bool:
        """Whether the run's training steps are replayed from CUDA graphs."""
        return bool(dict(self.options).get("cuda_graph", False))


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
    allowed = [name for name, p in inspect.signature(cls.__init__).parameters.items()
               if p.kind == p.KEYWORD_ONLY] + list(RUN_SWITCHES)
    for key, _ in options:
        if key not in allowed:
            choices = ", ".join(allowed) if allowed else "none"
            raise ValueError(f"run {text!r}: {version} has no switch {key!r} (its switches: {choices})")
    precision = match["precision"] or getattr(cls, "preferred_precision", "fp32")
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


# ------------------------------------------------------------------------------------------------
# Correct first: every run against V1 at fp32, same weights, a fresh batch
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tolerance:
    """Largest relative errors (norm of the difference over the norm of V1's value) that pass."""

    logits: float
    loss: float
    gradients: float


# fp32: the same function up to rounding. Reduced precisions round every matmul input to 8 (bf16) or
# 11 (fp16, tf32) significant bits; measured errors are about 1e-2 on gradients, so these catch a
# broken computation (which gives errors of order 1) without failing an honest one.
TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(logits=1e-4, loss=1e-4, gradients=1e-3),
    "tf32": Tolerance(logits=3e-2, loss=1e-2, gradients=1.5e-1),
    "bf16": Tolerance(logits=5e-2, loss=2e-2, gradients=1.5e-1),
    "fp16": Tolerance(logits=3e-2, loss=1e-2, gradients=1.5e-1),
}


@dataclass
class Reference:
    """V1's fp32 answer on one batch: logits, loss and the gradient of every (canonical) parameter."""

    inputs: torch.Tensor
    targets: torch.Tensor
    logits: torch.Tensor
    loss: torch.Tensor
    gradients: dict[str, torch.Tensor]


@dataclass
class ParityCheck:
    """How a model's logits, loss and gradients compare with V1's on the same weights and batch."""

    precision: str
    logits_error: float
    loss_error: float
    gradient_error: float
    worst_parameter: str
    without_gradient: list[str]
    missing_parameters: list[str]
    tolerance: Tolerance

    @property
    def passed(self) -> bool:
        t = self.tolerance
        return (not self.without_gradient and not self.missing_parameters and self.logits_error <= t.logits
                and self.loss_error <= t.loss and self.gradient_error <= t.gradients)

    def summary(self) -> str:
        """One line: the errors and, for a failure, what failed."""
        t = self.tolerance
        text = (f"{self.precision}: logits {self.logits_error:.1e} (<= {t.logits:.0e}), loss {self.loss_error:.1e} "
                f"(<= {t.loss:.0e}), gradients {self.gradient_error:.1e} (<= {t.gradients:.0e}, worst "
                f"{self.worst_parameter})")
        if self.without_gradient:
            text += f"; no gradient for {len(self.without_gradient)} parameter(s): {', '.join(self.without_gradient[:3])}"
        if self.missing_parameters:
            text += f"; V1 parameters not found: {', '.join(self.missing_parameters[:3])}"
        return text


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """||value - reference|| / ||reference|| in fp32 (the absolute error where the reference is 0)."""
    value, reference = value.detach().float(), reference.detach().float()
    diff = (value - reference).norm().item()
    scale = reference.norm().item()
    return diff / scale if scale > 0 else diff


# fp16 gradients underflow without loss scaling (the training step scales too): scale, then unscale.
_FP16_LOSS_SCALE = 2.0**12


def forward_backward(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, precision: str,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward and backward at ``precision`` (gradients cleared first); returns logits and loss."""
    set_matmul_precision(precision)
    model.zero_grad(set_to_none=True)
    with autocast_context(precision, device):
        logits = model(inputs)
    loss = lm_loss(logits, targets)
    if precision == "fp16":
        (loss * _FP16_LOSS_SCALE).backward()
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(_FP16_LOSS_SCALE)
    else:
        loss.backward()
    return logits.detach(), loss.detach()


def reference_answer(reference: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> Reference:
    """Run V1 at fp32 on one batch and keep what every other run must reproduce."""
    device = inputs.device
    logits, loss = forward_backward(reference, inputs, targets, "fp32", device)
    grads = {k: g.detach().clone() for k, g in canonical_gradients(reference).items() if g is not None}
    reference.zero_grad(set_to_none=True)
    return Reference(inputs, targets, logits, loss, grads)


def check_parity(model: nn.Module, reference: Reference, precision: str = "fp32",
                 tolerance: Tolerance | None = None) -> ParityCheck:
    """Compare ``model`` (holding the reference's weights) with the reference on its batch."""
    device = reference.inputs.device
    logits, loss = forward_backward(model, reference.inputs, reference.targets, precision, device)
    without = parameters_without_gradient(model)
    grads = canonical_gradients(model)
    errors = {name: relative_error(grads[name], ref) for name, ref in reference.gradients.items()
              if grads.get(name) is not None}
    missing = sorted(set(reference.gradients) - set(grads))
    worst = max(errors, key=errors.__getitem__) if errors else "-"
    model.zero_grad(set_to_none=True)
    return ParityCheck(
        precision=precision, logits_error=relative_error(logits, reference.logits),
        loss_error=relative_error(loss, reference.loss), gradient_error=errors.get(worst, math.inf),
        worst_parameter=worst, without_gradient=without, missing_parameters=missing,
        tolerance=tolerance or TOLERANCES[precision],
    )


# ------------------------------------------------------------------------------------------------
# Profiler evidence: GEMM launches per training step, and the top operations
# ------------------------------------------------------------------------------------------------

# PyTorch's matrix-multiply operators at the bottom of the call tree (linear and matmul call these).
GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::_scaled_mm"})
# Device kernels of cuBLAS/cuBLASLt (gemm, xmma, nvjet, cutlass), hipBLASLt/Tensile (Cijk_) and
# Inductor's matmul templates; attention kernels built on CUTLASS are not GEMM launches of a projection.
_GEMM_KERNEL = re.compile(r"gemm|xmma|nvjet|cutlass|wgmma|Cijk_|triton_tem_fused_.*mm", re.IGNORECASE)
_NOT_GEMM_KERNEL = re.compile(r"fmha|flash|attention|sdpa|softmax", re.IGNORECASE)


def is_gemm_kernel(name: str) -> bool:
    """Whether a device kernel's name is a matrix-multiply kernel (NVIDIA or AMD libraries, Inductor)."""
    return bool(_GEMM_KERNEL.search(name)) and not _NOT_GEMM_KERNEL.search(name)


def _is_device_event(event: Any) -> bool:
    return event.device_type != torch.autograd.DeviceType.CPU


def _profile_steps(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], precision: str,
                   device: torch.device, steps: int) -> Any:
    """Profile ``steps`` training steps after one unprofiled step (compiled code is built by then)."""
    from torch.profiler import ProfilerActivity, profile

    step = TrainingStep(model, precision, device)
    step(*batch)
    dev.synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step(*batch)
        dev.synchronize(device)
    del step
    return prof


def count_gemms(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], precision: str,
                device: torch.device) -> dict[str, int | None]:
    """GEMMs in one training step: ``gemm_ops`` counts PyTorch's matmul operators (nested calls once),
    ``gemm_kernels`` the device's matrix-multiply kernel launches (``None`` on the CPU)."""
    events = _profile_steps(model, batch, precision, device, steps=1).events()
    ops = 0
    for e in events:
        if e.name in GEMM_OPS and not _is_device_event(e):
            parent = e.cpu_parent
            while parent is not None and parent.name not in GEMM_OPS:
                parent = parent.cpu_parent
            ops += parent is None
    kernels = sum(1 for e in events if _is_device_event(e) and is_gemm_kernel(e.name))
    return {"gemm_ops": ops, "gemm_kernels": kernels if device.type == "cuda" else None}


def _self_device_us(event: Any) -> float:
    for attribute in ("self_device_time_total", "self_cuda_time_total"):  # renamed in torch 2.4
        if hasattr(event, attribute):
            return float(getattr(event, attribute))
    return 0.0


def top_operations(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], precision: str,
                   device: torch.device, steps: int = 3, top: int = 15) -> list[dict[str, Any]]:
    """Where a training step spends its time, per step, from the PyTorch profiler.

    On a GPU: the ``top`` device kernels by time (``kind="kernel"``, ``percent`` of all kernel time)
    and the ``top`` PyTorch operators by the device time of the kernels they launched
    (``kind="op"``). On the CPU: the ``top`` operators by their own CPU time.
    """
    prof = _profile_steps(model, batch, precision, device, steps)
    on_gpu = device.type == "cuda"
    rows: list[dict[str, Any]] = []
    if on_gpu:
        events = prof.events()
        cpu_names = {e.name for e in events if not _is_device_event(e)}
        kernels: dict[str, list[float]] = {}
        for e in events:
            # Device-side copies of record_function ranges ("forward", ...) carry a CPU event's name.
            if _is_device_event(e) and e.name not in cpu_names and not getattr(e, "is_user_annotation", False):
                kernels.setdefault(e.name, []).append(e.time_range.elapsed_us() / 1e3)
        total = sum(sum(times) for times in kernels.values())
        for name, times in sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:top]:
            rows.append({"kind": "kernel", "name": name, "calls_per_step": len(times) / steps,
                         "device_ms": sum(times) / steps, "cpu_ms": None,
                         "percent": 100.0 * sum(times) / total if total else None})
    ops = [e for e in prof.key_averages() if not _is_device_event(e) and not getattr(e, "is_user_annotation", False)]
    key = _self_device_us if on_gpu else (lambda e: float(e.self_cpu_time_total))
    total = sum(key(e) for e in ops)
    for e in sorted(ops, key=key, reverse=True)[:top]:
        rows.append({"kind": "op", "name": e.key, "calls_per_step": e.count / steps,
                     "device_ms": _self_device_us(e) / 1e3 / steps if on_gpu else None,
                     "cpu_ms": e.self_cpu_time_total / 1e3 / steps,
                     "percent": 100.0 * key(e) / total if total else None})
    return rows


# ------------------------------------------------------------------------------------------------
# The comparison
# ------------------------------------------------------------------------------------------------

# The columns of the printed table (the record keeps everything the benchmark measured).
TABLE_COLUMNS = {
    "label": "run", "check": "check", "step_ms_median": "step ms", "step_ms_spread_pct": "spread %",
    "forward_ms_median": "fwd ms", "backward_ms_median": "bwd ms", "optimizer_ms_median": "opt ms",
    "tokens_per_s": "tokens/s", "peak_memory_mib": "peak MiB", "achieved_tflops": "TFLOP/s",
    "mfu_measured": "MFU % (measured)", "mfu": "MFU % (datasheet)", "speedup": "speed-up",
    "gemm_ops": "GEMM ops", "gemm_kernels": "GEMM kernels",
}


@dataclass
class Comparison:
    """The record of one comparison: ``record`` is plain JSON-able data; the methods present it."""

    record: dict[str, Any]

    @property
    def runs(self) -> list[dict[str, Any]]:
        return self.record["runs"]

    @property
    def failed(self) -> list[str]:
        """Labels of runs that were not timed (failed the check, or ran out of memory)."""
        return [r["label"] for r in self.runs if r["check"] != "passed"]

    def to_frame(self) -> Any:
        """Every figure of every run, one row per run (pandas)."""
        import pandas as pd

        return pd.DataFrame(self.runs)

    def table(self) -> Any:
        """The figures that matter, one row per run, named for reading (pandas)."""
        frame = self.to_frame().reindex(columns=list(TABLE_COLUMNS)).rename(columns=TABLE_COLUMNS)
        for column in ("MFU % (measured)", "MFU % (datasheet)"):
            frame[column] = frame[column].map(lambda x: None if x is None or x != x else round(100 * x, 1))
        return frame.set_index("run")

    def __str__(self) -> str:
        r = self.record
        head = (f"{r['device']} | torch {r['environment']['torch']} | {r['date']} | preset {r['preset']}, "
                f"batch {r['batch_size']} x seq {r['seq_len']} | speed-up vs {r['baseline_run']}")
        with _pandas_display():
            body = self.table().to_string(float_format=lambda x: f"{x:,.2f}")
        notes = [f"{run['label']}: NOT TIMED - {run['check_message']}" for run in self.runs
                 if run["check"] != "passed"]
        return "\n".join([head, body, *notes])

    def plot(self, title: str | None = None) -> Any:
        """Speed-up bars and stacked forward/backward/optimizer times (a matplotlib figure)."""
        return plot_comparison(self, title)

    def save_json(self, path: str | os.PathLike[str]) -> Path:
        """Append this record to the JSON list in ``path`` (earlier records are kept)."""
        from tinyllama.records import append_json_records

        return append_json_records(path, [self.record])

    def save_csv(self, path: str | os.PathLike[str]) -> Path:
        """Append this comparison's rows to the CSV file ``path`` (earlier rows are kept)."""
        import pandas as pd

        path = Path(path)
        frame = self.to_frame()
        for key in ("date", "device", "preset"):
            frame.insert(0, f"record_{key}", self.record[key])
        if path.exists() and path.stat().st_size:
            frame = pd.concat([pd.read_csv(path), frame], ignore_index=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as tmp:
            frame.to_csv(tmp, index=False)
        os.replace(tmp.name, path)
        return path

    def regressions(self, baseline: Comparison | dict[str, Any]) -> Any:
        """``find_regressions(baseline, self)``."""
        return find_regressions(baseline, self)


class _pandas_display:
    """Show every column of a wide table when printing it."""

    def __enter__(self) -> None:
        import pandas as pd

        self._context = pd.option_context("display.width", 250, "display.max_columns", 50)
        self._context.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._context.__exit__(*exc)


def _say(message: str, enabled: bool) -> None:
    if enabled:
        print(message, flush=True)


def compare(
    runs: Sequence[str | RunSpec] = ("v1:fp32", "v2:fp32", "v4"),
    preset: str = "ci",
    *,
    batch_size: int | None = None,
    seq_len: int | None = None,
    num_steps: int = 10,
    warmup_steps: int = 3,
    seed: int = 0,
    device: torch.device | str | None = None,
    gemm_counts: bool = True,
    profile_runs: Sequence[str] = (),
    profile_top: int = 15,
    ceilings: dict[str, float] | None = None,
    progress: bool = True,
    **config_overrides: Any,
) -> Comparison:
    """Check every run against V1, then time it; see the module docstring.

    ``runs``: specs such as ``"v2[fuse_qkv=0]:fp32"`` or run-set names (``RUN_SETS``).
    ``gemm_counts``: count GEMM operators and kernels per step with the profiler.
    ``profile_runs``: labels of runs whose top operations are recorded (``profile_top`` rows).
    ``ceilings``: measured matmul TFLOP/s per precision (``tinyllama.ceilings``); the MFU of a run is
    also given against the ceiling of its precision. Speed-ups are against the first V1 fp32 run
    (else the first V1 run, else the first run).
    """
    specs = expand_runs(runs)
    device = dev.get_device(None if device is None else str(device))
    graphed = [s.label for s in specs if s.cuda_graph]
    if graphed:  # refused before any run, rather than after V1 has been timed
        try:
            check_cuda_graph(device, warmup_steps)
        except ValueError as error:
            raise ValueError(f"{', '.join(graphed)}: {error}") from None
    profile_labels = {parse_run(r).label if isinstance(r, str) else r.label for r in profile_runs}
    config, batch_size, seq_len = resolve_config(preset, batch_size, seq_len, **config_overrides)
    overrides = {k: v for k, v in config_overrides.items() if v is not None}
    batches = make_batches(config, batch_size, seq_len, count=4, seed=seed, device=device)
    # The check uses a batch that no run trains on: fresh random inputs.
    check_inputs, check_targets = make_batches(config, batch_size, seq_len, count=1, seed=seed + 1000,
                                               device=device)[0]

    _say(f"reference: V1 fp32 at preset {preset} (batch {batch_size} x seq {seq_len}) on "
         f"{dev.device_name(device)}", progress)
    torch.manual_seed(seed)
    with device:  # initialise on the device: much faster than on the host for the large presets
        reference_model = build("v1", config)
    weights = {k: v.detach().clone() for k, v in canonical_state_dict(reference_model).items()}
    reference = reference_answer(reference_model, check_inputs, check_targets)
    del reference_model

    rows: list[dict[str, Any]] = []
    profiles: dict[str, list[dict[str, Any]]] = {}
    for index, spec in enumerate(specs, 1):
        _say(f"[{index}/{len(specs)}] {spec.label}", progress)
        began = time.perf_counter()
        row, model = _check_run(spec, config, weights, reference, device, progress)
        if model is not None:
            try:
                row.update(_time_run(spec, model, preset, batch_size, seq_len, num_steps, warmup_steps, seed,
                                     device, batches, progress, overrides))
                if gemm_counts:
                    row.update(count_gemms(model, batches[0], spec.precision, device))
                if spec.label in profile_labels:
                    _say("  profiling the top operations", progress)
                    profiles[spec.label] = top_operations(model, batches[0], spec.precision, device, top=profile_top)
            except (BenchmarkError, CorrectnessError) as error:
                row.update(check="failed", check_message=str(error))
                _say(f"  NOT TIMED: {error}", progress)
            except Exception as error:  # noqa: BLE001 - only out-of-memory is reported and skipped
                if not dev.is_out_of_memory(error):
                    raise
                row.update(check="out of memory", check_message=f"out of memory while timing: {_oom_advice(batch_size)}")
                _say(f"  NOT TIMED: {row['check_message']}", progress)
        row["run_s"] = time.perf_counter() - began
        rows.append(row)
        del model
        dev.free_memory(device)

    _add_ratios(rows, ceilings or {})
    record = {
        "kind": RECORD_KIND, "schema": 1,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": dev.device_name(device), "environment": dev.environment_summary(device),
        "preset": preset, "config": config.to_dict(), "batch_size": batch_size, "seq_len": seq_len,
        "num_steps": num_steps, "warmup_steps": warmup_steps, "seed": seed,
        "ceilings_tflops": dict(ceilings or {}), "baseline_run": _baseline_label(rows),
        "runs": rows, "profiles": profiles,
    }
    return Comparison(record)


def _oom_advice(batch_size: int) -> str:
    return f"try a smaller batch (batch_size={max(1, batch_size // 2)}) or fewer runs"


def _check_run(spec: RunSpec, config: Any, weights: dict[str, torch.Tensor], reference: Reference,
               device: torch.device, progress: bool) -> tuple[dict[str, Any], nn.Module | None]:
    """Build the run's model with V1's weights and check it; the model is ``None`` if it failed."""
    row: dict[str, Any] = {"label": spec.label, "version": spec.version, "precision": spec.precision,
                           "options": dict(spec.options)}
    began = time.perf_counter()
    compiled = False
    try:
        # A fresh compiler cache for each run (V4 compiles by default): the graphs, guards and
        # recompile counts of earlier runs in this process must neither slow this one down nor push
        # its blocks past torch.compile's recompile limit (beyond it, they would silently run eagerly).
        torch._dynamo.reset()
        with device:
            model = build(spec.version, config, **spec.model_options)
        unwrap(model).load_state_dict(from_canonical(model, weights))
        switches = getattr(unwrap(model), "switches", None)
        compiled = switches is not None and switches.compile
        if compiled:
            _say("  compiling (torch.compile: the first steps take a while)", progress)
        checks = [check_parity(model, reference, "fp32")]
        if spec.precision != "fp32":
            checks.append(check_parity(model, reference, spec.precision))
    except Exception as error:  # noqa: BLE001 - out-of-memory and compiler failures become a row
        if dev.is_out_of_memory(error):
            message = f"out of memory during the check: {_oom_advice(reference.inputs.shape[0])}"
            status = "out of memory"
        elif compiled:  # e.g. no C compiler or Triton for Inductor on this machine
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            message = f"torch.compile failed ({type(error).__name__}: {first_line}); run it without compile=1"
            status = "failed"
        else:
            raise
        _say(f"  NOT TIMED: {message}", progress)
        return {**row, "check": status, "check_message": message}, None
    row["check_s"] = time.perf_counter() - began
    for check in checks:
        suffix = "" if check.precision == "fp32" else "_own_precision"
        row[f"check_logits_error{suffix}"] = check.logits_error
        row[f"check_loss_error{suffix}"] = check.loss_error
        row[f"check_gradient_error{suffix}"] = check.gradient_error
    failed = [c for c in checks if not c.passed]
    row["check"] = "failed" if failed else "passed"
    row["check_message"] = "; ".join(c.summary() for c in (failed or checks))
    _say(f"  check vs V1 {'FAILED, not timed' if failed else 'passed'}: {row['check_message']}", progress)
    if failed:
        return row, None
    return row, model


def _time_run(spec: RunSpec, model: nn.Module, preset: str, batch_size: int, seq_len: int, num_steps: int,
              warmup_steps: int, seed: int, device: torch.device, batches: list[tuple[torch.Tensor, torch.Tensor]],
              progress: bool, overrides: dict[str, Any]) -> dict[str, Any]:
    result = run_benchmark(
        spec.label, preset, batch_size=batch_size, seq_len=seq_len, precision=spec.precision,
        num_steps=num_steps, warmup_steps=warmup_steps, seed=seed, device=device,
        model_options=spec.model_options, model=model, batches=batches, progress=progress,
        cuda_graph=spec.cuda_graph, **overrides,
    )
    out = result.to_dict()
    for key in ("version", "model_options"):  # the run's own fields say these already
        out.pop(key)
    out["fused_optimizer"] = bool(getattr(model, "fused_optimizer", False)) and device.type == "cuda"
    _say(f"  {result.step_ms.median:.2f} ms/step (p10 {result.step_ms.p10:.2f}, p90 {result.step_ms.p90:.2f}), "
         f"{result.tokens_per_s:,.0f} tokens/s", progress)
    return out


def _baseline_label(rows: list[dict[str, Any]]) -> str | None:
    timed = [r for r in rows if r["check"] == "passed"]
    for wanted in (lambda r: r["version"] == "v1" and r["precision"] == "fp32", lambda r: r["version"] == "v1",
                   lambda r: True):
        found = next((r for r in timed if wanted(r)), None)
        if found:
            return found["label"]
    return None


def _add_ratios(rows: list[dict[str, Any]], ceilings: dict[str, float]) -> None:
    """Speed-up over the baseline run and MFU against the measured ceiling of each run's precision."""
    base_label = _baseline_label(rows)
    base = next((r for r in rows if r["label"] == base_label), None)
    for row in rows:
        timed = row["check"] == "passed"
        row["speedup"] = base["step_ms_median"] / row["step_ms_median"] if timed and base else None
        ceiling = ceilings.get(row["precision"])
        row["ceiling_tflops"] = ceiling
        row["mfu_measured"] = row["achieved_tflops"] / ceiling if timed and ceiling else None


# ------------------------------------------------------------------------------------------------
# Regressions: a new record against a saved one
# ------------------------------------------------------------------------------------------------

# Figures with a spread (p10..p90 of the timed steps), and whether larger is better.
_TIMED_FIGURES = ("step_ms", "forward_ms", "backward_ms", "optimizer_ms")
# Peak memory has no spread: a change smaller than this is noise of the allocator.
MEMORY_TOLERANCE = 0.01


def _record_of(source: Comparison | dict[str, Any]) -> dict[str, Any]:
    return source.record if isinstance(source, Comparison) else source


def load_record(path: str | os.PathLike[str], index: int = -1) -> dict[str, Any]:
    """Record ``index`` (default: the last) among the comparison records in the JSON file ``path``."""
    from tinyllama.records import load_json_records

    if not Path(path).exists():
        raise ValueError(f"baseline file {path} does not exist: give a file written by --json")
    records = [r for r in load_json_records(path) if isinstance(r, dict) and r.get("kind") == RECORD_KIND]
    if not records:
        raise ValueError(f"{path} holds no comparison records: give a file written by python -m tinyllama.compare --json")
    try:
        return records[index]
    except IndexError:
        raise ValueError(f"{path} holds {len(records)} comparison record(s); index {index} is out of range") from None


def find_regressions(baseline: Comparison | dict[str, Any], new: Comparison | dict[str, Any]) -> Any:
    """Compare each figure of each run present in both records (pandas DataFrame, one row a figure).

    A timed figure is flagged ``slower``/``faster`` when the new run's p10..p90 range lies entirely
    above/below the old one's: it moved by more than the two runs' own spread. tokens/s and MFU move
    with the step time and are judged by its range; peak memory is flagged beyond 1%. A run that
    now fails its check is flagged ``fails check``. ``result.attrs["warnings"]`` says when the two
    records were taken on different devices, torch versions or problem sizes.
    """
    import pandas as pd

    old_record, new_record = _record_of(baseline), _record_of(new)
    warnings = [f"{key} differs: baseline {old_record.get(key)!r}, now {new_record.get(key)!r}"
                for key in ("device", "preset", "batch_size", "seq_len")
                if old_record.get(key) != new_record.get(key)]
    old_torch, new_torch = (r.get("environment", {}).get("torch") for r in (old_record, new_record))
    if old_torch != new_torch:
        warnings.append(f"torch differs: baseline {old_torch}, now {new_torch}")
    old_runs = {r["label"]: r for r in old_record["runs"]}
    rows: list[dict[str, Any]] = []
    for run in new_record["runs"]:
        old = old_runs.get(run["label"])
        if old is None:
            rows.append(_verdict(run["label"], "run", None, None, None, "new run"))
            continue
        if run["check"] != "passed" or old["check"] != "passed":
            flag = "fails check" if run["check"] != "passed" and old["check"] == "passed" else (
                "now passes check" if run["check"] == "passed" else "not timed in either")
            rows.append(_verdict(run["label"], "check", None, None, None, flag))
            continue
        for figure in _TIMED_FIGURES:
            rows.append(_band_verdict(run["label"], figure, old, new=run, larger_is_better=False))
        for figure in ("tokens_per_s", "mfu_measured"):
            if old.get(figure) is not None and run.get(figure) is not None:
                rows.append(_band_verdict(run["label"], figure, old, new=run, larger_is_better=True))
        if old.get("peak_memory_mib") is not None and run.get("peak_memory_mib") is not None:
            a, b = old["peak_memory_mib"], run["peak_memory_mib"]
            flag = ("more memory" if b > a * (1 + MEMORY_TOLERANCE) else
                    "less memory" if b < a * (1 - MEMORY_TOLERANCE) else "within spread")
            rows.append(_verdict(run["label"], "peak_memory_mib", a, b, f"+-{100 * MEMORY_TOLERANCE:.0f}%", flag))
    for label in old_runs.keys() - {r["label"] for r in new_record["runs"]}:
        rows.append(_verdict(label, "run", None, None, None, "missing now"))
    frame = pd.DataFrame(rows, columns=["run", "figure", "baseline", "now", "change_pct", "allowed", "flag"])
    frame.attrs["warnings"] = warnings
    return frame


def _verdict(label: str, figure: str, old: float | None, new: float | None, allowed: str | None,
             flag: str) -> dict[str, Any]:
    change = 100.0 * (new / old - 1.0) if old and new is not None else None
    return {"run": label, "figure": figure, "baseline": old, "now": new, "change_pct": change,
            "allowed": allowed, "flag": flag}


def _band(run: dict[str, Any], figure: str) -> tuple[float, float, float]:
    """(value, low, high) of a figure. Step-derived figures (tokens/s, MFU) scale with 1/step time."""
    if figure in _TIMED_FIGURES:
        return run[f"{figure}_median"], run[f"{figure}_p10"], run[f"{figure}_p90"]
    value, median = run[figure], run["step_ms_median"]
    return value, value * median / run["step_ms_p90"], value * median / run["step_ms_p10"]


def _band_verdict(label: str, figure: str, old: dict[str, Any], new: dict[str, Any],
                  larger_is_better: bool) -> dict[str, Any]:
    a, a_lo, a_hi = _band(old, figure)
    b, b_lo, b_hi = _band(new, figure)
    if b_lo > a_hi:
        flag = "better" if larger_is_better else "slower"
    elif b_hi < a_lo:
        flag = "worse" if larger_is_better else "faster"
    else:
        flag = "within spread"
    return _verdict(label, figure, a, b, f"{a_lo:.4g}..{a_hi:.4g}", flag)


REGRESSION_FLAGS = frozenset({"slower", "worse", "more memory", "fails check", "missing now"})


# ------------------------------------------------------------------------------------------------
# Plot
# ------------------------------------------------------------------------------------------------


def plot_comparison(source: Comparison | dict[str, Any] | Any, title: str | None = None) -> Any:
    """Two panels from one record: speed-up over the baseline run, and each run's step split into
    forward, backward and optimizer (median ms). ``source``: a Comparison, its record, or its
    ``to_frame()``. Returns the matplotlib figure."""
    import matplotlib.pyplot as plt
    import pandas as pd

    if isinstance(source, pd.DataFrame):
        frame, record = source, {}
    else:
        record = _record_of(source)
        frame = pd.DataFrame(record["runs"])
    timed = frame[frame["check"] == "passed"]
    labels = list(timed["label"])
    fig, (ax_speed, ax_split) = plt.subplots(1, 2, figsize=(12, 0.5 * len(labels) + 2.0), layout="constrained")
    ypos = range(len(labels))
    speedups = list(timed["speedup"])
    ax_speed.barh(ypos, speedups, color="tab:green")
    ax_speed.axvline(1.0, color="black", linewidth=0.8)
    for y, s in zip(ypos, speedups):
        ax_speed.text(s, y, f" {s:.2f}x", va="center")
    ax_speed.set_yticks(list(ypos), labels)
    ax_speed.invert_yaxis()
    ax_speed.set_xlabel(f"speed-up over {record.get('baseline_run', 'the baseline')} (same process)")
    left = [0.0] * len(labels)
    for phase, color in (("forward", "tab:blue"), ("backward", "tab:orange"), ("optimizer", "tab:gray")):
        values = list(timed[f"{phase}_ms_median"])
        ax_split.barh(ypos, values, left=left, color=color, label=phase)
        left = [a + b for a, b in zip(left, values)]
    # The whole step's median and its p10..p90 range: the spread that every difference must beat.
    step = timed["step_ms_median"]
    ax_split.errorbar(step, list(ypos), xerr=[step - timed["step_ms_p10"], timed["step_ms_p90"] - step],
                      fmt="|", color="black", capsize=3, label="step p10..p90")
    ax_split.set_yticks(list(ypos), labels)
    ax_split.invert_yaxis()
    ax_split.set_xlabel("median time per training step (ms)")
    ax_split.legend(loc="lower right")
    untimed = [r for r in frame.to_dict("records") if r["check"] != "passed"]
    subtitle = f" (not timed: {', '.join(r['label'] for r in untimed)})" if untimed else ""
    if record:
        title = title or f"{record['device']}, preset {record['preset']}, {record['date'][:10]}"
    fig.suptitle((title or "") + subtitle)
    return fig


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------

_EPILOG = """\
run specs:  VERSION[KEY=VALUE,...][:PRECISION]
  v1:fp32                          V1 in fp32
  v4                               V4 at its preferred precision (bf16)
  "v2[fuse_qkv=0]:fp32"            V2 without the QKV fusion (quote specs with brackets in a shell)
  "v2[sdpa=1,compile=1]:bf16"      V2 with SDPA and torch.compile
  "v4[cuda_graph=1]"                V4 with each training step replayed from CUDA graphs (GPU only)
  V2 switches: fuse_qkv, fuse_gate_up, sdpa, compile (0/1), compile_mode=default|reduce-overhead|max-autotune
  every version: cuda_graph (0/1)
  precisions: fp32 (TF32 off), tf32, bf16 and fp16 (autocast, fp32 weights)
run sets (expand to several specs):
""" + "\n".join(f"  {name:9s} {' '.join(specs)}" for name, specs in RUN_SETS.items()) + """

Every run gets V1's weights and is checked against V1 (fp32; and at its own precision) before it
is timed; a run that fails is reported and not timed. Speed-ups are against the first V1 fp32 run.
Exit status: 0 all good, 1 a run failed its check or --baseline found a regression, 2 bad input.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tinyllama.compare", epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compare TinyLLaMA versions in one process on the same weights and batches, correct first.",
    )
    parser.add_argument("--runs", nargs="+", default=["v1:fp32", "v2:fp32", "v4"], metavar="SPEC",
                        help="runs to compare (see below); default: v1:fp32 v2:fp32 v4")
    add_problem_size_arguments(parser)
    parser.add_argument("--num-steps", type=int, default=20, help="timed steps per run (default 20)")
    parser.add_argument("--warmup-steps", type=int, default=3, help="untimed warm-up steps per run (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: the GPU if there is one)")
    parser.add_argument("--no-gemm-count", action="store_true", help="skip the profiler's GEMM count per run")
    parser.add_argument("--profile", nargs="*", default=[], metavar="SPEC",
                        help="record the profiler's top operations of these runs")
    parser.add_argument("--ceiling", action="append", default=[], metavar="PRECISION=TFLOPS",
                        help="a measured matmul ceiling for MFU, e.g. bf16=780 (repeatable)")
    parser.add_argument("--measure-ceiling", action="store_true",
                        help="measure the matmul ceilings of the runs' precisions first (tinyllama.ceilings)")
    parser.add_argument("--json", metavar="PATH", help="append the record to this JSON list file")
    parser.add_argument("--csv", metavar="PATH", help="append the rows to this CSV file")
    parser.add_argument("--plot", metavar="PATH", help="save the speed-up / phase plot (png, pdf, svg)")
    parser.add_argument("--baseline", metavar="OLD.json", help="flag figures that moved beyond their spread since "
                        "the last comparison record in this file")
    parser.add_argument("--quiet", action="store_true", help="no progress messages")
    return parser


def measure_ceilings(precisions: Iterable[str], device: torch.device | str | None = None) -> dict[str, float]:
    """Measured matmul TFLOP/s for each precision (``tinyllama.ceilings.measure_matmul_tflops``)."""
    from tinyllama.ceilings import measure_matmul_tflops

    return {p: measure_matmul_tflops(p, device=device).value for p in dict.fromkeys(precisions)}


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    progress = not args.quiet
    try:
        specs = expand_runs(args.runs)
        profile = [parse_run(s).label for s in args.profile]
        ceilings = dict(_parse_ceiling(c) for c in args.ceiling)
        baseline = load_record(args.baseline) if args.baseline else None
        if args.measure_ceiling:
            _say("measuring matmul ceilings ...", progress)
            ceilings = {**measure_ceilings([s.precision for s in specs], args.device), **ceilings}
        result = compare(
            specs, args.preset, batch_size=args.batch_size, seq_len=args.seq_len, num_steps=args.num_steps,
            warmup_steps=args.warmup_steps, seed=args.seed, device=args.device,
            gemm_counts=not args.no_gemm_count, profile_runs=profile, ceilings=ceilings, progress=progress,
            **shape_overrides(args),
        )
    except (ValueError, BenchmarkError, dev.DeviceUnavailable) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:
        if not dev.is_out_of_memory(error):
            raise
        print("error: out of memory for V1's reference at this size: try a smaller --batch-size or --seq-len",
              file=sys.stderr)
        return 2
    print(result)
    status = 1 if result.failed else 0
    if baseline is not None:
        regressions = result.regressions(baseline)
        for warning in regressions.attrs["warnings"]:
            print(f"warning: {warning}")
        flagged = regressions[regressions["flag"] != "within spread"]
        with _pandas_display():
            print(f"\nagainst the baseline ({baseline['date']}): "
                  + ("every figure within its spread" if flagged.empty else f"\n{flagged.to_string(index=False)}"))
        status = max(status, 1 if flagged["flag"].isin(REGRESSION_FLAGS).any() else 0)
    for label, rows in result.record["profiles"].items():
        import pandas as pd

        with _pandas_display():
            print(f"\ntop operations of {label}:\n{pd.DataFrame(rows).to_string(index=False)}")
    try:
        if args.json:
            print(f"appended the record to {result.save_json(args.json)}")
        if args.csv:
            print(f"appended the rows to {result.save_csv(args.csv)}")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.plot:
        result.plot().savefig(args.plot, dpi=120)
        print(f"saved the plot to {args.plot}")
    return status


def _parse_ceiling(text: str) -> tuple[str, float]:
    key, _, value = text.partition("=")
    if key not in PRECISIONS:
        raise ValueError(f"--ceiling {text!r}: write PRECISION=TFLOPS with a precision among {', '.join(PRECISIONS)}")
    try:
        return key, float(value)
    except ValueError:
        raise ValueError(f"--ceiling {text!r}: {value!r} is not a number of TFLOP/s") from None


if __name__ == "__main__":
    sys.exit(main())
