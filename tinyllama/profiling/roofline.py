"""Roofline analysis: where each operator of a training step sits against the device's roofs.

The roofs are measured on this device (``tinyllama.ceilings``: a large matmul per precision, a large
copy) and drawn next to the datasheet peaks (``tinyllama.device``). Each operator becomes a point:

- FLOPs: ``torch.utils.flop_counter``'s formulas for matmuls, convolutions and attention; for the rest
  an estimate (one FLOP per element for element-wise work, a few per element for softmax), marked as
  such in ``flop_source``;
- bytes: every input read once and every output written once (tensor sizes: the least traffic with no
  cache reuse and no fusion; ncu or rocprof-compute measure the real DRAM traffic per kernel);
- time: the device time of the kernels the operator launched, itself or through the operators it
  calls (on a CPU: the self CPU time of the operator and of those it calls).

Work and time must describe the same calls. The counting pass sees each operator the way the dispatcher
runs it (a ``_to_copy``, not the ``copy_`` inside it); the profiler sees every nested operator. So each
kernel (each slice of CPU time) goes to the outermost operator around it that the counting saw, and
each operator's work is that of the calls the profiler timed: its work per call, for the same input
shapes, times the calls timed. For a ``torch.compile``-d model the point-wise and reduction operators
of the compiled regions no longer run as operators: Inductor fused them into generated kernels
(``triton_poi_fused_*``...), which are placed as points of their own (:func:`operator_points`).

A point above its roof is an attribution error, not a fast kernel: :func:`check_physical` finds them,
and :func:`plot_roofline` refuses to draw them.

From these: arithmetic intensity (FLOP/byte), achieved TFLOP/s, the roof that bounds it (memory or
compute), the attainable rate there, and the time above the roof: where the remaining time sits.
:func:`plot_roofline` draws V1 and a faster version on one log-log plot, so a participant sees which
operators moved.
"""

from __future__ import annotations

import re
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tinyllama import ceilings
from tinyllama import device as dev
from tinyllama.profiling.flops import cpu_attention_formulas
from tinyllama.profiling.torch_profiler import (
    PHASES, ProfileRun, _is_device, categorize, is_fused_kernel, profile_steps, row_kind)

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")

# --------------------------------------------------------------------------------------------------
# Roofs
# --------------------------------------------------------------------------------------------------


@dataclass
class Roofs:
    """Measured and datasheet roofs of one device: TFLOP/s per precision and TB/s."""

    device: str
    compute_tflops: dict[str, float]
    bandwidth_tbs: float
    datasheet_tflops: dict[str, float | None] = field(default_factory=dict)
    datasheet_tbs: float | None = None

    def compute(self, precision: str) -> float:
        """The measured compute roof for ``precision`` (fp32's where that one was not measured)."""
        return self.compute_tflops.get(precision, self.compute_tflops.get("fp32", max(self.compute_tflops.values())))

    def ridge(self, precision: str) -> float:
        """Arithmetic intensity (FLOP/byte) where the memory roof meets the compute roof."""
        return self.compute(precision) / self.bandwidth_tbs

    def table(self) -> pd.DataFrame:
        """Measured ceilings next to the datasheet peaks, with the ratio."""
        rows = [{"ceiling": f"matmul {p}", "unit": "TFLOP/s", "measured": v, "datasheet": self.datasheet_tflops.get(p)}
                for p, v in self.compute_tflops.items()]
        rows.append({"ceiling": "copy (read + write)", "unit": "TB/s", "measured": self.bandwidth_tbs,
                     "datasheet": self.datasheet_tbs})
        frame = pd.DataFrame(rows)
        frame["measured_pct_of_datasheet"] = 100.0 * frame["measured"] / frame["datasheet"].astype(float)
        return frame

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "compute_tflops": self.compute_tflops, "bandwidth_tbs": self.bandwidth_tbs,
                "datasheet_tflops": self.datasheet_tflops, "datasheet_tbs": self.datasheet_tbs}


def measure_roofs(
    device: torch.device | str | None = None, precisions: Sequence[str] = PRECISIONS,
    matmul_size: int | None = None, copy_bytes: int | None = None,
) -> Roofs:
    """Measure the matmul rate for each precision and the copy bandwidth on ``device``
    (``tinyllama.ceilings``) and look up its datasheet peaks (``tinyllama.device``; none on a CPU)."""
    device = dev.get_device(None if device is None else str(device))
    measured = ceilings.measure_ceilings(device, tuple(precisions), matmul_size, copy_bytes)
    peaks = dev.device_peaks(device)
    return Roofs(
        device=dev.device_name(device),
        compute_tflops={p: measured[f"matmul_{p}"].value for p in precisions},
        bandwidth_tbs=measured["copy"].value,
        datasheet_tflops={p: (peaks.tflops(p) if peaks else None) for p in precisions},
        datasheet_tbs=peaks.memory_bandwidth_tbs if peaks else None,
    )


# --------------------------------------------------------------------------------------------------
# Work per operator
# --------------------------------------------------------------------------------------------------

# FLOPs per element for operators that are neither tagged pointwise nor counted by flop_counter.
_PER_ELEMENT = {"aten::_softmax": 5, "aten::_log_softmax": 5, "aten::_softmax_backward_data": 3,
                "aten::_log_softmax_backward_data": 3}
# AdamW per parameter: two moment updates, bias corrections, sqrt, eps, divide, decay, update.
_ADAM_FLOPS_PER_PARAM = 16


def _footprint(t: torch.Tensor) -> int:
    """Bytes a tensor occupies: a broadcast (stride-0) dimension is stored once."""
    elements = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            elements *= size
    return elements * t.element_size()


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _qualified(packet: Any) -> str:
    return getattr(packet, "_qualified_op_name", None) or str(packet).replace(".", "::", 1)


def _signature(shapes: Sequence[Any], dtypes: Sequence[str] | None) -> tuple | None:
    """The shapes of an operator call's tensor arguments, as the profiler records them (``record_shapes``):
    tensor lists, non-tensor arguments and 0-d tensors (a Python number may arrive as either) left out.
    ``None`` when nothing was recorded."""
    if shapes is None or dtypes is None or len(dtypes) != len(shapes):
        return None
    return tuple(tuple(int(n) for n in shape) for shape, dtype in zip(shapes, dtypes)
                 if dtype and dtype not in _NOT_TENSORS and shape and all(isinstance(n, int) for n in shape))


# The profiler's type names of arguments that are not tensors (tensors are named by dtype: "float", "c10::BFloat16").
_NOT_TENSORS = {"Scalar", "ScalarList", "TensorList", "GenericList", "None", "String", "Device"}


class _WorkRecorder(TorchDispatchMode):
    """Records calls, bytes moved and estimated FLOPs of every ATen operator that runs, in total per
    operator (``ops``) and per call signature (``calls``: operator and input shapes)."""

    def __init__(self, formulas: Mapping[Any, Callable[..., int]] | None = None) -> None:
        super().__init__()
        self.ops: dict[str, dict[str, Any]] = {}
        self.calls: dict[tuple[str, tuple], dict[str, float]] = {}
        self.formulas = formulas or {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._schema.name
        if getattr(func, "is_view", False) or name.startswith("profiler::"):
            return out  # a view moves no data; the profiler's own range markers are not work
        inputs = _tensors((args, kwargs))
        outputs = _tensors(out)
        writes = outputs or [t for schema, value in zip(func._schema.arguments, args)
                             if schema.alias_info is not None and schema.alias_info.is_write
                             for t in _tensors(value)]
        nbytes = sum(map(_footprint, inputs)) + sum(map(_footprint, writes))
        tags = set(getattr(func, "tags", ()))
        if name.startswith(("aten::_fused_adam", "aten::_fused_sgd")):
            flops, source = _ADAM_FLOPS_PER_PARAM * sum(t.numel() for t in _tensors(args[0])), "estimate: 16 per parameter"
        elif name.startswith("aten::_foreach_"):
            flops, source = sum(t.numel() for t in _tensors(args[0])), "estimate: 1 per element"
        elif torch.Tag.pointwise in tags:
            flops, source = sum(t.numel() for t in writes), "estimate: 1 per element"
        elif name in _PER_ELEMENT:
            flops, source = _PER_ELEMENT[name] * inputs[0].numel(), f"estimate: {_PER_ELEMENT[name]} per element"
        elif getattr(torch.Tag, "reduction", None) in tags:
            flops, source = inputs[0].numel() if inputs else 0, "estimate: 1 per input element"
        else:
            flops, source = 0, "none"
        floating = [t.dtype for t in inputs if t.is_floating_point()]
        counted = flops
        packet = getattr(func, "_overloadpacket", None)
        if packet in self.formulas:
            try:
                counted = int(self.formulas[packet](*args, **kwargs, out_val=out))
            except Exception:  # noqa: BLE001 - a formula that cannot read these arguments: keep the estimate
                counted = flops
        named = dict(zip((a.name for a in func._schema.arguments), args)) | kwargs
        signature = tuple(tuple(v.shape) for a in func._schema.arguments
                          if isinstance(v := named.get(a.name), torch.Tensor) and v.dim() > 0)
        call = self.calls.setdefault((name, signature), {"calls": 0, "bytes": 0.0, "flops": 0.0})
        call["calls"] += 1
        call["bytes"] += nbytes
        call["flops"] += counted
        record = self.ops.setdefault(name, {"calls": 0, "bytes": 0, "estimated_flops": 0, "flop_source": source,
                                            "dtypes": Counter(), "tf32": False})
        record["calls"] += 1
        record["bytes"] += nbytes
        record["estimated_flops"] += flops
        record["dtypes"].update(floating[:1])
        record["tf32"] |= bool(torch.backends.cuda.matmul.allow_tf32) and any(t.is_cuda for t in inputs)
        return out


_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}


def count_operator_work(fn: Callable[[], Any]) -> pd.DataFrame:
    """Run ``fn()`` once and return, per ATen operator: ``operator``, ``category``, ``calls``,
    ``flops`` (counted by ``FlopCounterMode`` where it has a formula, else estimated), ``flop_source``,
    ``bytes`` (inputs read once + outputs written once) and ``precision`` (of its floating inputs;
    ``tf32`` for fp32 matmuls on a GPU with TF32 allowed).

    ``frame.attrs["per_call"]`` holds the same work per call signature: ``{(operator, signature): (calls,
    flops, bytes)}``, the signature being the shapes of the tensor arguments: :func:`operator_points` uses it
    to give each operator the work of the calls the profiler timed."""
    from torch.utils.flop_counter import FlopCounterMode

    extra = cpu_attention_formulas(gpu_kernels=True)
    counter = FlopCounterMode(display=False, custom_mapping=extra) if extra else FlopCounterMode(display=False)
    recorder = _WorkRecorder(getattr(counter, "flop_registry", None))
    with counter, recorder:
        fn()
    counted = {_qualified(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    rows = []
    for name, r in recorder.ops.items():
        dtype = r["dtypes"].most_common(1)[0][0] if r["dtypes"] else None
        precision = _DTYPE_NAMES.get(dtype, "other" if dtype else "none")
        if name in counted:
            flops, source = counted[name], "flop_counter"
            if precision == "fp32" and r["tf32"]:
                precision = "tf32"
        else:
            flops, source = r["estimated_flops"], r["flop_source"]
        rows.append({"operator": name, "category": categorize(name), "calls": r["calls"], "flops": flops,
                     "flop_source": source, "bytes": r["bytes"], "precision": precision})
    frame = pd.DataFrame(rows).sort_values("flops", ascending=False, ignore_index=True)
    # A plain dict (pandas compares attrs when it concatenates frames: a DataFrame there would not compare).
    frame.attrs["per_call"] = {key: (c["calls"], c["flops"], c["bytes"]) for key, c in recorder.calls.items()}
    return frame


# --------------------------------------------------------------------------------------------------
# Points
# --------------------------------------------------------------------------------------------------

UNATTRIBUTED = "(time not matched to an operator)"


def classify(points: pd.DataFrame, roofs: Roofs) -> pd.DataFrame:
    """Add the roofline columns to points that have ``flops``, ``bytes``, ``time_ms`` and ``precision``:
    ``intensity`` (FLOP/byte), ``tflops`` and ``tbs`` achieved, ``roof_tflops`` (the compute roof: the
    measured matmul rate of the precision for matmul-class work, fp32's for the rest), ``bound``
    (``memory`` below the ridge point, ``compute`` above), ``attainable_tflops``, ``pct_of_roof``,
    ``roof_time_ms`` (the time at the roof) and ``excess_ms`` (measured minus that)."""
    p = points.copy()
    seconds = p["time_ms"] / 1e3
    p["intensity"] = p["flops"] / p["bytes"].where(p["bytes"] > 0)
    p["tflops"] = p["flops"] / seconds.where(seconds > 0) / 1e12
    p["tbs"] = p["bytes"] / seconds.where(seconds > 0) / 1e12
    p["roof_tflops"] = _compute_roofs(p, roofs)
    ridge = p["roof_tflops"] / roofs.bandwidth_tbs
    p["bound"] = (p["intensity"] >= ridge).map({True: "compute", False: "memory"}).where(p["intensity"].notna(), "")
    p["attainable_tflops"] = (p["intensity"] * roofs.bandwidth_tbs).clip(upper=p["roof_tflops"])
    p["pct_of_roof"] = 100.0 * p["tflops"] / p["attainable_tflops"]
    roof_s = pd.concat([p["flops"] / (p["roof_tflops"] * 1e12), p["bytes"] / (roofs.bandwidth_tbs * 1e12)], axis=1).max(axis=1)
    p["roof_time_ms"] = 1e3 * roof_s.where(p["bytes"] > 0)
    p["excess_ms"] = p["time_ms"] - p["roof_time_ms"]
    total = p["time_ms"].sum()
    p["time_pct"] = 100.0 * p["time_ms"] / total if total else 0.0
    return p


def _is_operator(event: Any) -> bool:
    return row_kind(event.name) == "operator"


def _owner(event: Any, counted: set[str]) -> Any:
    """The outermost operator around ``event`` (itself included) that the counting pass saw: the call
    whose work was counted (``aten::_to_copy``, not the ``aten::copy_`` that launches its kernel)."""
    owner, node = None, event
    while node is not None:
        if _is_operator(node) and node.name in counted:
            owner = node
        node = getattr(node, "cpu_parent", None)
    return owner


def _event_signature(event: Any) -> tuple | None:
    return _signature(getattr(event, "input_shapes", None), getattr(event, "input_dtypes", None))


# Bytes per element of the profiler's dtype names (record_shapes).
_DTYPE_BYTES = {"double": 8, "float": 4, "c10::BFloat16": 2, "c10::Half": 2, "long int": 8, "int": 4, "short int": 2,
                "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
                "c10::complex<float>": 8, "c10::complex<double>": 16}
_FLOAT_PRECISION = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16", "double": "fp64"}
# Operator names in an Inductor kernel's name that compute (the others move data: _to_copy, view, cat...).
_ARITHMETIC = re.compile(r"^(add|sub|mul|div|neg|pow|rsqrt|sqrt|exp|exp2|log|log1p|sigmoid|silu|tanh|gelu|relu|erf|"
                         r"cos|sin|mean|sum|amax|amin|max|min|maximum|minimum|where|clamp|abs|reciprocal|addcmul|"
                         r"addcdiv|lerp|softmax|var|lt|gt|le|ge|eq|ne|threshold|backward|prod|argmax|argmin)$")


def _fused_kernel_work(name: str, event: Any) -> tuple[float, float, str, str] | None:
    """FLOPs, bytes, precision and the source of the numbers of one launch of an Inductor kernel, from
    its launch range (``record_shapes``): ``None`` where the profiler recorded nothing about it.

    Bytes: Inductor's own count (``kernel_num_gb``, recorded with ``torch._inductor.config.benchmark_kernel``)
    where present, else every tensor argument read or written once (the least traffic of the kernel: a
    fused kernel touches its buffers, and nothing in between). FLOPs: Inductor's ``kernel_flop`` where
    present (templates), else one FLOP per element of the largest argument for each arithmetic operator
    its name lists (``triton_poi_fused_add_mul_pow_0``: 3): an estimate, which moves the point along the
    memory roof, never above it, since its rate there is bytes / time."""
    if event is None or getattr(event, "name", None) != name:
        return None
    shapes, dtypes = getattr(event, "input_shapes", None), getattr(event, "input_dtypes", None)
    extra = getattr(event, "kwinputs", None) or {}
    tensors = []
    if shapes is not None and dtypes is not None and len(shapes) == len(dtypes):
        for shape, dtype in zip(shapes, dtypes):
            if dtype in _DTYPE_BYTES and all(isinstance(n, int) for n in shape):
                numel = 1
                for n in shape:
                    numel *= int(n)
                tensors.append((numel, dtype))
    if "kernel_num_gb" in extra:
        nbytes, source = float(extra["kernel_num_gb"]) * 1e9, "bytes: Inductor"
    elif tensors:
        nbytes, source = float(sum(n * _DTYPE_BYTES[d] for n, d in tensors)), "bytes: kernel arguments once"
    else:
        return None
    floating = Counter(d for _, d in tensors if d in _FLOAT_PRECISION)
    precision = _FLOAT_PRECISION[floating.most_common(1)[0][0]] if floating else "fp32"
    if extra.get("kernel_flop"):
        return float(extra["kernel_flop"]), nbytes, precision, f"flop_counter (Inductor kernel_flop); {source}"
    fused = re.sub(r"_\d+$", "", name.split("fused_", 1)[-1]) if "fused_" in name else ""
    ops = max(1, sum(bool(_ARITHMETIC.match(token)) for token in fused.split("_")))
    largest = max((n for n, _ in tensors), default=0)
    return float(ops * largest), nbytes, precision, f"estimate: {ops} per element (kernel name); {source}"


def _compute_roofs(points: pd.DataFrame, roofs: Roofs) -> list[float]:
    """The compute roof of each point: its precision's matmul rate for work counted by ``flop_counter``
    (matmuls, attention: tensor cores), fp32's for the rest (element-wise work runs on the vector units)."""
    source = points.get("flop_source", pd.Series("flop_counter", index=points.index)).astype(str)
    matmul = source.str.startswith("flop_counter")
    return [roofs.compute(prec) if mm else roofs.compute("fp32") for prec, mm in zip(points["precision"], matmul)]


# A point may sit above its roof by this much before it is called impossible. The roofs are one
# measurement each (a large matmul, a large copy that reads and writes: a kernel that mostly reads, or
# finds part of its data in L2, can run a few percent faster), and the profiler's kernel times jitter
# by a few percent. An attribution error (one operator's FLOPs over another kernel's time) lands
# 10x to 1000x above the roof, far beyond this.
ROOF_TOLERANCE = 0.10


class AboveRoofError(ValueError):
    """Points above their roof: their work was divided by a time that does not belong to it."""


class AboveRoofWarning(UserWarning):
    """Points above their roof were left out of a plot."""


def check_physical(points: pd.DataFrame, roofs: Roofs, tolerance: float = ROOF_TOLERANCE, *,
                   strict: bool = False) -> pd.DataFrame:
    """The points whose achieved rate exceeds the attainable one, ``min(compute roof of their precision,
    bandwidth x intensity)``, by more than ``tolerance`` (a fraction: see :data:`ROOF_TOLERANCE`): no
    kernel can run there, so their FLOPs, bytes or time were attributed wrongly. Each roof is the higher
    of the measured one and the datasheet's (where known): the measured roofs are what one benchmark
    reached, and a kernel may beat them (a read-mostly kernel beats a copy); the datasheet it cannot. Returns those rows
    with ``attainable_tflops`` and ``roof_ratio`` (achieved / attainable); empty when every point is
    physically possible. ``strict`` raises :class:`AboveRoofError` naming them instead.

    Points without FLOPs, bytes or time are not on the plot and are not checked."""
    p = points.copy()
    ok = (p["flops"] > 0) & (p["bytes"] > 0) & (p["time_ms"] > 0)
    p = p[ok]
    if p.empty:
        return p.assign(attainable_tflops=pd.Series(dtype=float), roof_ratio=pd.Series(dtype=float))
    achieved = p["flops"] / (p["time_ms"] / 1e3) / 1e12
    intensity = p["flops"] / p["bytes"]
    peaks = Roofs(roofs.device, {k: max(v, roofs.datasheet_tflops.get(k) or 0.0) for k, v in roofs.compute_tflops.items()},
                  max(roofs.bandwidth_tbs, roofs.datasheet_tbs or 0.0))
    attainable = pd.concat([pd.Series(_compute_roofs(p, peaks), index=p.index), intensity * peaks.bandwidth_tbs],
                           axis=1).min(axis=1)
    p["tflops"], p["intensity"], p["attainable_tflops"] = achieved, intensity, attainable
    p["roof_ratio"] = achieved / attainable
    above = p[p["roof_ratio"] > 1.0 + tolerance].sort_values("roof_ratio", ascending=False)
    if strict and len(above):
        raise AboveRoofError(f"{len(above)} point(s) above the roof by more than {tolerance:.0%}: "
                             + _describe(above))
    return above


def _describe(above: pd.DataFrame) -> str:
    label = above["label"] if "label" in above else pd.Series("", index=above.index)
    return "; ".join(f"{(lab + ': ') if lab else ''}{op} at {t:.3g} TFLOP/s, {r:.3g}x its roof {a:.3g}"
                     for lab, op, t, r, a in zip(label, above["operator"], above["tflops"], above["roof_ratio"],
                                                 above["attainable_tflops"]))


def operator_points(work: pd.DataFrame, run: ProfileRun, roofs: Roofs, label: str = "") -> pd.DataFrame:
    """Join :func:`count_operator_work` (one step) with the profiler's time (per step) and :func:`classify`
    the points. Work and time describe the same calls:

    - time: each device kernel (each slice of self CPU time on a CPU) goes to the outermost operator
      around its launch that the counting saw (:func:`_owner`), never to an operator by name alone;
    - work: per operator, its work per call for the input shapes the profiler recorded
      (``work.attrs["per_call"]``, with ``record_shapes``), times the calls the profiler timed; without
      shapes, its average work per call times those calls. Work counted on calls that did not run as
      operators (fused into compiled kernels) is on no operator's point;
    - kernels ``torch.compile`` generated (``triton_poi_fused_*``, ``triton_red_fused_*``,
      ``triton_per_fused_*``, ``triton_tem_fused_*``) are one point each (``kind`` ``fused kernel``),
      with their own device time and the work of :func:`_fused_kernel_work` (from their launch range;
      with no shapes recorded they keep their time and no work). One launched inside another range
      has no launch record: its time goes to the "kernels outside ATen ops" rows.

    Time on kernels no counted operator launched is kept in rows without work: one per category of
    kernels launched outside ATen operators, and :data:`UNATTRIBUTED` for the rest.
    """
    steps = max(run.steps, 1)
    counted = set(work["operator"])
    exact = {(op, tuple(sig)): (flops / n, nbytes / n)
             for (op, sig), (n, flops, nbytes) in (work.attrs.get("per_call") or {}).items() if n}
    average = {r.operator: (r.flops / r.calls, r.bytes / r.calls) if r.calls else (0.0, 0.0)
               for r in work.itertuples(index=False)}

    events = [e for e in run.profiler.events() if not _is_device(e)]
    calls: Counter = Counter()  # (operator, signature) -> timed calls whose work was counted
    for event in events:
        if _is_operator(event) and event.name in counted and _owner(event, counted) is event:
            calls[(event.name, _event_signature(event))] += 1
    time: Counter = Counter()  # operator -> microseconds
    fused: dict[str, dict[str, Any]] = {}
    outside: Counter = Counter()
    if run.on_device:
        for event in events:
            for kernel in getattr(event, "kernels", []):
                if (kernel.name == event.name and not is_fused_kernel(kernel.name)) or kernel.name in PHASES \
                        or kernel.name.startswith("ProfilerStep#"):
                    continue  # the device-side copy of a range, not a kernel
                if is_fused_kernel(kernel.name) and kernel.name == event.name:  # launched from its own range
                    f = fused.setdefault(kernel.name, {"us": 0.0, "launches": 0, "flops": 0.0, "bytes": 0.0,
                                                       "unknown": 0, "precision": "fp32", "source": "none"})
                    f["us"] += kernel.duration
                    f["launches"] += 1
                    found = _fused_kernel_work(kernel.name, event)
                    if found is None:
                        f["unknown"] += 1
                    else:
                        f["flops"] += found[0]
                        f["bytes"] += found[1]
                        f["precision"], f["source"] = found[2], found[3]
                    continue
                owner = _owner(event, counted)
                if owner is not None:
                    time[owner.name] += kernel.duration
                elif not _is_operator(event):
                    outside[categorize(kernel.name)] += kernel.duration
                # a kernel of an operator the counting did not see: its time stays unattributed
        measured = run.kernels()["total_ns"].sum() / 1e3 / steps
    else:
        for event in events:
            if _is_operator(event):
                owner = _owner(event, counted)
                if owner is not None:
                    time[owner.name] += _attr_us(event)
        ops = run.operators()
        measured = float(ops.loc[ops["kind"] == "operator", "self_cpu_ms"].sum()) * 1e3

    rows = []
    for r in work.itertuples(index=False):
        timed = {sig: n for (name, sig), n in calls.items() if name == r.operator}
        if not timed and not time.get(r.operator):
            continue  # never ran as an operator in the timed steps (fused into compiled code)
        flops = nbytes = 0.0
        approximated = False
        for sig, n in timed.items():
            per = exact.get((r.operator, sig)) if sig is not None else None
            if per is None:
                per, approximated = average[r.operator], True
            flops += per[0] * n / steps
            nbytes += per[1] * n / steps
        source = r.flop_source + ("; average per call" if approximated and exact else "")
        rows.append({"operator": r.operator, "kind": "operator", "category": r.category,
                     "calls": sum(timed.values()) / steps, "flops": flops, "flop_source": source, "bytes": nbytes,
                     "precision": r.precision, "time_ms": time.get(r.operator, 0.0) / 1e3 / steps})
    for name, f in fused.items():
        known = f["unknown"] == 0
        rows.append({"operator": name, "kind": "fused kernel", "category": categorize(name),
                     "calls": f["launches"] / steps, "flops": f["flops"] / steps if known else 0.0,
                     "flop_source": f["source"] if known else "none: launch not recorded",
                     "bytes": f["bytes"] / steps if known else 0.0, "precision": f["precision"],
                     "time_ms": f["us"] / 1e3 / steps})
    for category, us in outside.items():
        rows.append({"operator": f"(kernels outside ATen ops: {category})", "kind": "other", "category": category,
                     "calls": 0, "flops": 0, "flop_source": "none", "bytes": 0, "precision": "none",
                     "time_ms": us / 1e3 / steps})
    points = pd.DataFrame(rows, columns=["operator", "kind", "category", "calls", "flops", "flop_source", "bytes",
                                         "precision", "time_ms"])
    rest = measured / 1e3 - points["time_ms"].sum()
    if rest > 1e-6 * max(measured / 1e3, 1e-9):
        points = pd.concat([points, pd.DataFrame([{
            "operator": UNATTRIBUTED, "kind": "other", "category": "other", "calls": 0, "flops": 0,
            "flop_source": "none", "bytes": 0, "precision": "none", "time_ms": rest}])], ignore_index=True)
    points = classify(points, roofs)
    points.insert(0, "label", label)
    return points.sort_values("time_ms", ascending=False, ignore_index=True)


def _attr_us(event: Any) -> float:
    value = getattr(event, "self_cpu_time_total", None)
    return float(value) if value is not None else 0.0


def roofline_points(
    step_fn: Callable[[], Any], roofs: Roofs, *, label: str = "", device: torch.device | str | None = None,
    warmup: int = 1, active: int = 3, count_fn: Callable[[], Any] | None = None,
) -> pd.DataFrame:
    """The roofline points of the operators of ``step_fn()``: one counting pass (FLOPs and bytes),
    then ``warmup`` + ``active`` profiled calls with their shapes (time); see :func:`operator_points`.

    For a ``torch.compile``-d model pass ``count_fn``, the same step of an uncompiled twin: compiled
    code does not run operator by operator, so the work of the operators it still calls (matmuls,
    attention, the uncompiled parts) is counted on the eager graph, per call signature, and its fused
    kernels are points of their own. Set ``torch._inductor.config.benchmark_kernel = True`` before
    compiling to have Inductor record each kernel's bytes (and a template's FLOPs) with its launch.
    """
    device = dev.get_device(None if device is None else str(device))
    step_fn()  # warm: compilation, autotuning and lazy state must not be counted or timed
    dev.synchronize(device)
    work = count_operator_work(count_fn or step_fn)
    run = profile_steps(step_fn, device=device, wait=0, warmup=warmup, active=active, record_shapes=True)
    return operator_points(work, run, roofs, label)


def kernel_points(kernels: pd.DataFrame, roofs: Roofs, label: str = "", precision: str = "bf16") -> pd.DataFrame:
    """Roofline points from measured kernel counters (``vendor.ncu_roofline_points`` or
    ``vendor.rocprof_compute_points``), aggregated by kernel name and :func:`classify`-ed. Kernels with
    tensor-core/MFMA FLOPs use the ``precision`` roof, the others fp32's."""
    k = kernels.rename(columns={"dram_bytes": "bytes", "hbm_bytes": "bytes"})
    matrix = k.get("tensor_flops", k.get("mfma_flops", pd.Series(0.0, index=k.index)))
    grouped = k.assign(matrix=matrix).groupby("kernel", sort=False).agg(
        calls=("time_ns", "size"), time_ns=("time_ns", "sum"), flops=("flops", "sum"), bytes=("bytes", "sum"),
        matrix=("matrix", "sum")).reset_index()
    points = pd.DataFrame({
        "operator": grouped["kernel"].map(short_kernel_name), "kernel": grouped["kernel"],
        "category": grouped["kernel"].map(categorize), "calls": grouped["calls"], "flops": grouped["flops"],
        "flop_source": ["flop_counter" if m > 0 else "counters" for m in grouped["matrix"]],
        "bytes": grouped["bytes"], "precision": [precision if m > 0 else "fp32" for m in grouped["matrix"]],
        "time_ms": grouped["time_ns"] / 1e6})
    points = classify(points, roofs)
    points.insert(0, "label", label)
    return points.sort_values("time_ms", ascending=False, ignore_index=True)


def short_kernel_name(name: str, width: int = 40) -> str:
    """``void at::native::vectorized_elementwise_kernel<4, ...>(...)`` -> ``vectorized_elementwise_kernel``."""
    base = name.split("(")[0].split("<")[0].strip()
    base = base.split("::")[-1].replace("void ", "")
    return base if len(base) <= width else base[: width - 3] + "..."


def compare_points(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """Operator by operator: time before and after, the speed-up, and how intensity and rate moved.
    Operators present in only one version appear with the other side empty."""
    cols = ["operator", "category", "time_ms", "intensity", "tflops", "bound"]
    merged = before[cols].merge(after[cols], on=["operator"], how="outer", suffixes=("_before", "_after"))
    merged["category"] = merged["category_before"].fillna(merged["category_after"])
    merged = merged.drop(columns=["category_before", "category_after"])
    merged["saved_ms"] = merged["time_ms_before"].fillna(0) - merged["time_ms_after"].fillna(0)
    merged["speedup"] = merged["time_ms_before"] / merged["time_ms_after"]
    return merged.sort_values("saved_ms", ascending=False, ignore_index=True)


def category_summary(points: pd.DataFrame) -> pd.DataFrame:
    """Time, time at the roof and excess per category: where the remaining time sits."""
    table = points.groupby(["label", "category"], as_index=False)[["time_ms", "roof_time_ms", "excess_ms"]].sum(min_count=1)
    return table.sort_values(["label", "time_ms"], ascending=[True, False], ignore_index=True)


# --------------------------------------------------------------------------------------------------
# The plot
# --------------------------------------------------------------------------------------------------

_STYLES = [("tab:red", "o"), ("tab:blue", "s"), ("tab:green", "^"), ("tab:purple", "D")]


def plot_roofline(
    points: pd.DataFrame | Mapping[str, pd.DataFrame], roofs: Roofs, path: str | Path | None = None, *,
    top: int = 6, title: str = "", arrows: bool = True, tolerance: float = ROOF_TOLERANCE, strict: bool = False,
) -> Any:
    """A log-log roofline: measured roofs (solid) and datasheet peaks (dashed), each version's operators
    as points sized by their share of the step time, the ``top`` operators of each labelled, and arrows
    from the first version's operators to the same operators in the next one. Saved to ``path`` if
    given; returns the matplotlib figure. Points without FLOPs or bytes (copies, unmatched time) cannot
    be placed on these axes: the legend says how much time they hold.

    A roofline must be physically possible: points above their roof by more than ``tolerance``
    (:func:`check_physical`) are not drawn; an :class:`AboveRoofWarning` names them and the plot says
    how many were left out. ``strict`` raises :class:`AboveRoofError` instead."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np

    versions = dict(points) if isinstance(points, Mapping) else {
        str(label): frame for label, frame in points.groupby("label", sort=False)}
    if not versions:
        raise ValueError("no points to plot: pass the DataFrame of roofline_points() or a dict of them")
    placeable = {k: v[(v["flops"] > 0) & (v["bytes"] > 0) & (v["time_ms"] > 0)] for k, v in versions.items()}
    excluded: dict[str, pd.DataFrame] = {}
    for k, v in placeable.items():
        above = check_physical(v.assign(label=k), roofs, tolerance, strict=strict)
        if len(above):
            excluded[k] = above
            placeable[k] = v.drop(index=above.index)
            message = (f"roofline: {len(above)} point(s) of {k} above the roof by more than {tolerance:.0%} "
                       f"not drawn (work and time that do not belong together, or a roof measured too low): {_describe(above)}")
            warnings.warn(message, AboveRoofWarning, stacklevel=2)
            print(message)
    intensities = pd.concat([v["intensity"] for v in placeable.values()])
    precisions = sorted({p for v in placeable.values() for p in v["precision"] if p in roofs.compute_tflops} | {"fp32"},
                        key=lambda p: roofs.compute(p))
    lo = min(float(intensities.min()) if len(intensities) else 0.1, 0.05) / 2
    hi = max(float(intensities.max()) if len(intensities) else 10.0, max(roofs.ridge(p) for p in precisions)) * 4
    x = np.logspace(np.log10(lo), np.log10(hi), 200)

    fig, ax = plt.subplots(figsize=(10, 6.5))
    for i, precision in enumerate(precisions):
        roof = roofs.compute(precision)
        ax.plot(x, np.minimum(x * roofs.bandwidth_tbs, roof), color="black", lw=1.8 if i == len(precisions) - 1 else 1.0,
                label=f"measured {precision} matmul {_rate(roof, 'FLOP/s')}"
                      + ("" if i else f"; copy {_rate(roofs.bandwidth_tbs, 'B/s')}"))
        ax.annotate(precision, (hi, roof), textcoords="offset points", xytext=(-28, 3), fontsize=8)
        sheet = roofs.datasheet_tflops.get(precision)
        if sheet and roofs.datasheet_tbs:
            ax.plot(x, np.minimum(x * roofs.datasheet_tbs, sheet), color="gray", ls="--", lw=1.0,
                    label=f"datasheet {precision} {_rate(sheet, 'FLOP/s')}; {_rate(roofs.datasheet_tbs, 'B/s')}")

    first = next(iter(versions))
    for (label, frame), (color, marker) in zip(placeable.items(), _STYLES):
        total = versions[label]["time_ms"].sum()
        hidden = versions[label]["time_ms"].sum() - frame["time_ms"].sum()
        share = frame["time_ms"] / total if total else frame["time_ms"] * 0
        dropped = f"; {len(excluded[label])} above the roof not drawn" if label in excluded else ""
        ax.scatter(frame["intensity"], frame["tflops"], s=20 + 900 * share, color=color, marker=marker, alpha=0.6,
                   edgecolor="black", linewidth=0.5,
                   label=f"{label}: {total:,.1f} ms/step ({100 * hidden / total if total else 0:.0f}% not placeable{dropped})")
        for _, row in frame.nlargest(top, "time_ms").iterrows():
            name = row["operator"].replace("aten::", "")
            ax.annotate(name if len(name) <= 30 else name[:27] + "...", (row["intensity"], row["tflops"]), fontsize=8,
                        color=color, textcoords="offset points", xytext=(6, 4))
    if arrows and len(placeable) > 1:
        a, b = list(placeable.values())[:2]
        b_by_op = b.set_index("operator")
        for _, row in a.nlargest(top, "time_ms").iterrows():
            if row["operator"] in b_by_op.index:
                target = b_by_op.loc[row["operator"]]
                if isinstance(target, pd.DataFrame):
                    target = target.iloc[0]
                ax.annotate("", xy=(target["intensity"], target["tflops"]), xytext=(row["intensity"], row["tflops"]),
                            arrowprops={"arrowstyle": "->", "color": "gray", "lw": 0.8, "alpha": 0.7})
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ymax = max([roofs.compute(p) for p in precisions] + [v for v in roofs.datasheet_tflops.values() if v])
    achieved = pd.concat([v["tflops"] for v in placeable.values()])
    floor = float(achieved.min()) if len(achieved) else ymax * 1e-4
    ax.set_ylim(bottom=min(floor, ymax * 1e-4) / 3, top=ymax * 3)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(title or f"Roofline: {roofs.device} ({first} and the others; point area = share of step time)")
    ax.grid(which="both", alpha=0.25)
    legend = ax.legend(loc="lower right", fontsize=8)
    for handle in getattr(legend, "legend_handles", getattr(legend, "legendHandles", [])):
        if hasattr(handle, "set_sizes"):
            handle.set_sizes([40])
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=130)
    return fig


def _rate(tera: float, unit: str) -> str:
    """A rate given in tera-units, with a prefix that suits it: 0.0021 TFLOP/s -> '2.1 GFLOP/s'."""
    for factor, prefix in ((1.0, "T"), (1e-3, "G"), (1e-6, "M")):
        if tera >= factor:
            return f"{tera / factor:,.3g} {prefix}{unit}"
    return f"{tera / 1e-9:,.3g} k{unit}"
