"""Attribution: which FLOPs, bytes and device time belong to each operator of a profiled step.

Work and time must describe the same calls. :func:`count_operator_work` runs the step once under a
dispatch mode and records each operator's FLOPs (``torch.utils.flop_counter``'s formulas for matmuls,
convolutions and attention; an estimate, marked in ``flop_source``, for the rest) and bytes (every
input read once, every output written once: the least traffic with no cache reuse and no fusion), per
call signature. The counting sees each operator the way the dispatcher runs it (a ``_to_copy``, not the
``copy_`` inside it); the profiler sees every nested operator. So :func:`attribute` gives each kernel
(each slice of CPU time on a CPU) to the outermost operator around it that the counting saw, and each
operator the work of the calls the profiler timed. For a ``torch.compile``-d model the point-wise and
reduction operators of compiled regions no longer run as operators: Inductor fused them into generated
kernels (``triton_poi_fused_*`` ...), which become points of their own with their own time.

:mod:`tinyllama.profiling.roofline` places the result against the device's roofs.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Callable, Mapping, Sequence

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tinyllama.profiling.flops import cpu_attention_formulas
from tinyllama.profiling.torch_profiler import (
    PHASES,
    ProfileRun,
    categorize,
    is_device_event,
    is_fused_kernel,
    row_kind,
)

# FLOPs per element for operators that are neither tagged pointwise nor counted by flop_counter.
# A batch norm in eval mode is a scale and a shift per element (its statistics are fixed); a training-mode
# batch norm also computes them, which this estimate leaves out (as DeepSpeed's FLOPS profiler does).
_PER_ELEMENT = {"aten::_softmax": 5, "aten::_log_softmax": 5, "aten::_softmax_backward_data": 3,
                "aten::_log_softmax_backward_data": 3, "aten::native_batch_norm": 2, "aten::cudnn_batch_norm": 2,
                "aten::miopen_batch_norm": 2, "aten::_native_batch_norm_legit_no_training": 2,
                "aten::_native_batch_norm_legit": 2,
                "aten::_batch_norm_no_update": 2}

# Convolutions: cuDNN's TF32 switch (on by default), not the matmul one (off by default).
_CONVOLUTIONS = ("aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::conv2d")


def allows_tf32(operator: str) -> bool:
    """Whether PyTorch lets ``operator`` run an fp32 CUDA computation in TF32: convolutions follow
    ``torch.backends.cudnn.allow_tf32`` (on by default), matrix products
    ``torch.backends.cuda.matmul.allow_tf32`` (off by default). Not on ROCm, where MIOpen's convolutions
    stay fp32."""
    if operator in _CONVOLUTIONS:
        return bool(torch.backends.cudnn.allow_tf32) and torch.version.hip is None
    return bool(torch.backends.cuda.matmul.allow_tf32)


# AdamW per parameter: two moment updates, bias corrections, sqrt, eps, divide, decay, update.
_ADAM_FLOPS_PER_PARAM = 16


def _footprint(t: torch.Tensor) -> int:
    """Bytes a tensor occupies: a broadcast (stride-0) dimension is stored once."""
    elements = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            elements *= size
    return elements * t.element_size()


def _aliases(outputs: list[torch.Tensor], inputs: list[torch.Tensor]) -> bool:
    """Whether every output shares its memory with an input (a view, or the input returned as it is)."""
    try:
        held = {t.untyped_storage().data_ptr() for t in inputs if t.numel()}
        return bool(outputs) and all(t.numel() and t.untyped_storage().data_ptr() in held for t in outputs) \
            and 0 not in held  # meta and fake tensors have no memory: every pointer is 0, nothing can be told
    except (RuntimeError, NotImplementedError, TypeError):  # tensors without storage (subclasses): not an alias
        return False


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _qualified(packet: Any) -> str:
    return getattr(packet, "_qualified_op_name", None) or str(packet).replace(".", "::", 1)


def _signature(shapes: Sequence[Any], dtypes: Sequence[str] | None) -> tuple | None:
    """The shapes of an operator call's tensor arguments, as the profiler records them (``record_shapes``):
    tensor lists, non-tensor arguments and 0-d tensors (a Python number may arrive as either) left out.
    ``None`` when nothing was recorded. A profiler that records shapes but no dtypes (older PyTorch) gives
    the non-empty shapes of plain integers: a tensor list or a scalar has none."""
    if shapes is None:
        return None
    if not dtypes:
        if not shapes:
            return None
        return tuple(tuple(int(n) for n in shape) for shape in shapes
                     if shape and isinstance(shape, (list, tuple)) and all(isinstance(n, int) for n in shape))
    if len(dtypes) != len(shapes):
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
        mutates = any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)
        # An output that is an input's memory (``_unsafe_view``, a view the schema does not declare, or
        # ``contiguous`` of a contiguous tensor) moves no data: counted as traffic it would put the op beyond
        # the bandwidth. In-place and out= operators (a written argument) do move theirs.
        aliased = not mutates and _aliases(outputs, inputs)
        nbytes = 0 if aliased else sum(map(_footprint, inputs)) + sum(map(_footprint, writes))
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
        record["tf32"] |= allows_tf32(name) and any(t.is_cuda for t in inputs)
        return out


_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}


def count_operator_work(fn: Callable[[], Any]) -> pd.DataFrame:
    """Run ``fn()`` once and return, per ATen operator: ``operator``, ``category``, ``calls``,
    ``flops`` (counted by ``FlopCounterMode`` where it has a formula, else estimated; a fused attention kernel
    called with ``is_causal`` over the lower triangle it computes: :func:`tinyllama.costs.flops.causal_pairs`), ``flop_source``,
    ``bytes`` (inputs read once + outputs written once) and ``precision`` (of its floating inputs;
    ``tf32`` for fp32 matmuls and convolutions on a GPU with TF32 allowed: :func:`allows_tf32`).

    ``frame.attrs["per_call"]`` holds the same work per call signature: ``{(operator, signature): (calls,
    flops, bytes)}``, the signature being the shapes of the tensor arguments: :func:`operator_points` uses it
    to give each operator the work of the calls the profiler timed."""
    from torch.utils.flop_counter import FlopCounterMode

    # Executed FLOPs: a causal fused kernel is credited with the triangle it computes, not the masked half it skips.
    extra = cpu_attention_formulas(gpu_kernels=True, causal=True)
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


UNATTRIBUTED = "(time not matched to an operator)"


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


def _attr_us(event: Any) -> float:
    value = getattr(event, "self_cpu_time_total", None)
    return float(value) if value is not None else 0.0


def shape_label(operator: str, signature: tuple | None) -> str:
    """``aten::convolution`` called on (64, 256, 56, 56) and (64, 256, 1, 1) ->
    ``aten::convolution 64x256x56x56 · 64x256x1x1``: the operator and its first two tensor arguments' shapes
    (for a layer: its input and its weight)."""
    if not signature:
        return f"{operator} (shapes not recorded)"
    return f"{operator} " + " · ".join("x".join(map(str, shape)) for shape in signature[:2])


def attribute(work: pd.DataFrame, run: ProfileRun, by_shape: bool = False) -> pd.DataFrame:
    """Join :func:`count_operator_work` (one step) with the profiler's time (per step). Work and time
    describe the same calls:

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

    ``by_shape`` gives each operator one row per call signature (the shapes of its tensor arguments, as
    the profiler recorded them): the layers of a network that share an operator (every convolution is
    ``aten::convolution``) come apart by their shapes. The ``operator`` column then names the shapes too
    (:func:`shape_label`) and ``shapes`` holds them.
    """
    steps = max(run.steps, 1)
    counted = set(work["operator"])
    exact = {(op, tuple(sig)): (flops / n, nbytes / n)
             for (op, sig), (n, flops, nbytes) in (work.attrs.get("per_call") or {}).items() if n}
    average = {r.operator: (r.flops / r.calls, r.bytes / r.calls) if r.calls else (0.0, 0.0)
               for r in work.itertuples(index=False)}

    events = [e for e in run.profiler.events() if not is_device_event(e)]
    calls: Counter = Counter()  # (operator, signature) -> timed calls whose work was counted
    for event in events:
        if _is_operator(event) and event.name in counted and _owner(event, counted) is event:
            calls[(event.name, _event_signature(event))] += 1
    def key(owner: Any) -> Any:  # what a slice of time is booked to: the operator, or the operator and its shapes
        return (owner.name, _event_signature(owner)) if by_shape else owner.name

    time: Counter = Counter()  # key(operator) -> microseconds
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
                    time[key(owner)] += kernel.duration
                elif not _is_operator(event):
                    outside[categorize(kernel.name)] += kernel.duration
                # a kernel of an operator the counting did not see: its time stays unattributed
        measured = run.kernels()["total_ns"].sum() / 1e3 / steps
    else:
        for event in events:
            if _is_operator(event):
                owner = _owner(event, counted)
                if owner is not None:
                    time[key(owner)] += _attr_us(event)
        ops = run.operators()
        measured = float(ops.loc[ops["kind"] == "operator", "self_cpu_ms"].sum()) * 1e3

    rows = []
    for r in work.itertuples(index=False):
        timed = {sig: n for (name, sig), n in calls.items() if name == r.operator}
        if by_shape:  # one row per signature, its calls and its time
            groups = {sig: ({sig: n}, time.get((r.operator, sig), 0.0)) for sig, n in timed.items()}
            groups |= {k[1]: ({}, us) for k, us in time.items() if k[0] == r.operator and k[1] not in timed}
        else:
            groups = {None: (timed, time.get(r.operator, 0.0))}
        for signature, (group, us) in groups.items():
            if not group and not us:
                continue  # never ran as an operator in the timed steps (fused into compiled code)
            flops = nbytes = 0.0
            approximated = False
            for sig, n in group.items():
                per = exact.get((r.operator, sig)) if sig is not None else None
                if per is None:
                    per, approximated = average[r.operator], True
                flops += per[0] * n / steps
                nbytes += per[1] * n / steps
            source = r.flop_source + ("; average per call" if approximated and exact else "")
            row = {"operator": shape_label(r.operator, signature) if by_shape else r.operator, "kind": "operator",
                   "category": r.category, "calls": sum(group.values()) / steps, "flops": flops, "flop_source": source,
                   "bytes": nbytes, "precision": r.precision, "time_ms": us / 1e3 / steps}
            rows.append(row | ({"shapes": signature} if by_shape else {}))
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
                                         "precision", "time_ms"] + (["shapes"] if by_shape else []))
    rest = measured / 1e3 - points["time_ms"].sum()
    if rest > 1e-6 * max(measured / 1e3, 1e-9):
        points = pd.concat([points, pd.DataFrame([{
            "operator": UNATTRIBUTED, "kind": "other", "category": "other", "calls": 0, "flops": 0,
            "flop_source": "none", "bytes": 0, "precision": "none", "time_ms": rest}])], ignore_index=True)
    return points
