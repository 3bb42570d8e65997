"""Guarded buffers: run a participant's kernel so that a missing mask gives a message, not a crash.

A Triton kernel indexes memory itself: a ``tl.load``/``tl.store`` without a mask reaches past the end of
its tensor wherever the length is not a multiple of the block. Through the interpreter that reads and
writes the process's heap (the Jupyter kernel dies, "corrupted double-linked list", with no feedback);
on a GPU it can raise an illegal memory access that poisons the CUDA context for the rest of the
notebook. :class:`Guards` (used by ``check_function(..., guard=True)``) makes such a run safe and
explains it:

- every tensor the kernel sees lives inside a larger allocation with a **guard region** on both sides
  of at least ``max(64 KiB, the tensor's own size)``: a missing mask overshoots by less than one block,
  and a block up to 64 KiB (16,384 fp32 elements, the interpreter's 1024 many times over) or up to the
  length rounded up to a power of two then lands in the guard, which is ours, not someone else's memory;
- the inputs are guarded copies whose guards (and the gaps between the rows of a strided view) hold
  **NaN**: an unmasked load past the end brings NaN into the result;
- the outputs are allocated by the participant's own launcher (``torch.empty_like(x)``, which for a view
  would allocate a fresh, unguarded tensor), so while the function runs a ``TorchDispatchMode``
  replaces every fresh allocation (``empty``, ``empty_like``, ``zeros``, ``new_empty``, ``clone``, ...)
  with a guarded one. Their guards hold a byte pattern (``0xA5``) that no computation stores by
  accident, not NaN: a store of NaN read from an input's guard would otherwise leave a NaN guard
  looking untouched. This catches the stores past the end of the participant's own output, whatever
  the launcher calls, with no change to the launcher and with the true length ``n`` passed. (Guarding
  the inputs alone would miss those stores; patching ``torch.empty_like`` and friends would miss
  ``x.new_empty`` and every other spelling, which all reach the dispatcher as the same few operators.)
- through the interpreter, every ``tl.load``/``tl.store`` is also checked before it happens: an access
  that lands in a guard is reported exactly (which tensor, how far past its end), and a store there is
  stopped. On a GPU there is no such hook: a store past the end shows as a changed guard, a load past
  the end when its NaN reaches the result; and every kernel launched inside ``with guards:`` is read
  once compiled (its Triton IR, ``ttir``): a ``tt.load`` of a block of pointers without a mask operand is
  named with its source line, so a load whose lanes past the end are dropped later (by a masked store,
  by ``tl.where``) is named too, though on a GPU it read the guard unharmed (past the end of an
  allocation it would fault).

:meth:`Guards.findings` turns what was seen into sentences that name the likely missing mask. A kernel
whose pointers go further astray than one guard (a wrong stride times a large row index) can still
fault: the guards are sized for missing masks, not for arbitrary addresses.
"""

from __future__ import annotations

import inspect
import linecache
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

GUARD_BYTES = 64 * 2**10  # the least guard on each side; a tensor's own size if larger
INPUT_FILL = float("nan")  # around the inputs: a load past the end brings NaN into the result
OUTPUT_BYTE = 0xA5  # around fresh allocations: a byte pattern no store writes by accident

STORE_HINT = "is every tl.store masked (mask=offsets < n)?"
LOAD_HINT = "is every tl.load masked (mask=offsets < n, other=0.0)?"

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # reinterpret an element's bits

aten = torch.ops.aten
# Allocations a launcher makes for its outputs, and copies it may hand a kernel (x.contiguous(), x.float()).
_FRESH = {aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default, aten.new_empty.default,
          aten.new_empty_strided.default, aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default}
_COPIES = {aten.clone.default, aten._to_copy.default}


@dataclass
class _Buffer:
    """One guarded tensor: ``tensor`` (what the function sees) starts ``pad`` elements into ``buffer``."""

    label: str
    buffer: torch.Tensor  # the whole allocation, flat
    tensor: torch.Tensor
    pad: int
    span: int  # elements from the tensor's first to its last element, gaps between rows included
    sentinel: torch.Tensor  # the bits a guard element holds
    nan: bool  # guarded with NaN (an input or a copy), else with the byte pattern (a fresh allocation)


def _guardable(t: Any) -> bool:
    return (isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 0 and not t.requires_grad
            and all(s >= 0 for s in t.stride()) and t.element_size() in _BITS and t.layout == torch.strided)


def _names(fn: Any, count: int) -> list[str]:
    """The candidate's parameter names (``x``, ``weight``), to name the input a kernel overran."""
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return [f"`{params[i]}`" if i < len(params) else f"input {i + 1}" for i in range(count)]


# A load or store in Triton IR: ``%x = tt.load %ptrs, %mask[, %other] ... : tensor<1024x!tt.ptr<f32>> loc(#loc5)``.
_TTIR_ACCESS = re.compile(r"\btt\.(?P<kind>load|store)\s+(?P<operands>%[\w.#]+(?:\s*,\s*%[\w.#]+)*)"
                          r"[^:\n]*:\s*(?P<type>\S+)[^\n]*?(?:loc\((?P<loc>#loc\d*)\))?\s*$", re.MULTILINE)
_TTIR_LOC = re.compile(r"^(?P<name>#loc\d*)\s*=\s*loc\((?P<body>.*)\)\s*$", re.MULTILINE)
_TTIR_FILE_LINE = re.compile(r'^"(?P<file>[^"]*)":(?P<line>\d+):\d+')
_TTIR_NAMED = re.compile(r'^"[^"]*"\((?P<inner>#loc\d*)\)')


@dataclass(frozen=True)
class UnmaskedAccess:
    """A ``tl.load``/``tl.store`` of a block of pointers without a mask, found in a kernel's Triton IR."""

    kind: str  # "load" or "store"
    kernel: str
    file: str
    line: int  # 0 when the IR carries no location

    def source(self) -> str:
        """The kernel's source line of the access, when the file is known (a notebook cell's is)."""
        return linecache.getline(self.file, self.line).strip() if self.file and self.line else ""


def _ttir_location(name: str | None, locations: dict[str, str]) -> tuple[str, int]:
    """(file, line) of a ``#locN`` reference, following named locations (``loc("x"(#loc6))``) to theirs."""
    for _ in range(16):  # a chain of named locations is short; never loop on a malformed one
        body = locations.get(name or "")
        if body is None:
            return "", 0
        found = _TTIR_FILE_LINE.match(body)
        if found:
            return found["file"], int(found["line"])
        inner = _TTIR_NAMED.match(body)
        if not inner:
            return "", 0
        name = inner["inner"]
    return "", 0


def unmasked_accesses(ttir: str, kernel: str = "") -> list[UnmaskedAccess]:
    """The loads and stores of blocks of pointers (``tensor<...x!tt.ptr<...>>``) without a mask operand in
    the Triton IR ``ttir`` of one compiled kernel. A scalar load (``tl.load(ptr)``) and a block pointer
    (``tl.make_block_ptr``, bounded by ``boundary_check``) are not blocks of pointers: never reported."""
    locations = {m["name"]: m["body"] for m in _TTIR_LOC.finditer(ttir)}
    found = []
    for m in _TTIR_ACCESS.finditer(ttir):
        operands = len(m["operands"].split(","))
        if not m["type"].startswith("tensor<") or "!tt.ptr" not in m["type"]:
            continue
        if operands < (2 if m["kind"] == "load" else 3):  # load: ptrs[, mask[, other]]; store: ptrs, value[, mask]
            file, line = _ttir_location(m["loc"], locations)
            found.append(UnmaskedAccess(m["kind"], kernel, file, line))
    return found


def _compiled_ttir(kernel: Any) -> str:
    """The Triton IR of a compiled kernel (``CompiledKernel.asm["ttir"]``), or "" where this Triton has none."""
    try:
        text = kernel.asm["ttir"]
    except Exception:  # noqa: BLE001 - another Triton, or no compiled kernel: the guards alone still work
        return ""
    return text if isinstance(text, str) else ""


class Guards(TorchDispatchMode):
    """Guard a function's inputs (:meth:`inputs`) and, inside ``with guards:``, its fresh allocations;
    then :meth:`findings` says what went past an end. One instance per call of ``function`` (whose
    parameter names label the inputs in the feedback)."""

    def __init__(self, function: Any = None, watch_interpreter: bool | None = None) -> None:
        """``watch_interpreter``: check each interpreted load and store (default: when TRITON_INTERPRET is
        on); ``False`` leaves only what a GPU run has, the guards."""
        super().__init__()
        self.function = function
        name = getattr(function, "__name__", "")
        self._maker = f"`{name}`" if name.isidentifier() else "your function"  # 'the tensor `add` made with ...'
        self._inputs = 0  # how many of the buffers are inputs
        if watch_interpreter is None:
            watch_interpreter = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
        self.watch_interpreter = watch_interpreter
        self.buffers: list[_Buffer] = []
        self.accesses: dict[tuple[str, str], set[int]] = {}  # (load/store, label) -> element distances
        self.compiled: dict[str, str] = {}  # kernel name -> its Triton IR (compiled launches, not interpreted)
        self._saved: dict[str, Any] = {}
        self._jit_run: Any = None

    # ---- making guarded tensors ----------------------------------------------------------------------

    def _guard(self, t: torch.Tensor, label: str, fill_input: bool) -> torch.Tensor:
        """A tensor equal to ``t`` (shape, strides, dtype, device, values) inside a guarded allocation."""
        size = t.element_size()
        span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
        pad = max(GUARD_BYTES, -(-span * size // GUARD_BYTES) * GUARD_BYTES) // size
        buffer = torch.empty(pad + span + pad, dtype=t.dtype, device=t.device)
        if fill_input:
            buffer.fill_(INPUT_FILL)
        else:
            buffer.view(torch.uint8).fill_(OUTPUT_BYTE)
        sentinel = buffer[:1].view(_BITS[size]).clone()
        # set_, not as_strided: the result is not a view (no ._base), like the tensor it stands for.
        guarded = torch.empty(0, dtype=t.dtype, device=t.device).set_(buffer.untyped_storage(), pad, t.shape,
                                                                       t.stride())
        if fill_input:
            guarded.copy_(t)
        else:
            guarded.zero_()  # a fresh allocation starts as zeros (the feedback names an output never written)
        self.buffers.append(_Buffer(label, buffer, guarded, pad, span, sentinel, fill_input))
        return guarded

    def inputs(self, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        """Guarded copies of the floating-point tensors among ``inputs``; other values pass unchanged."""
        names = _names(self.function, len(inputs))
        with torch.no_grad():
            guarded = tuple(self._guard(value, names[i], True) if _guardable(value) else value
                            for i, value in enumerate(inputs))
        self._inputs = len(self.buffers)
        return guarded

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001: the mode's protocol
        result = func(*args, **(kwargs or {}))
        if (func in _FRESH or func in _COPIES) and _guardable(result):
            made = len(self.buffers) - self._inputs + 1  # the function's first allocation, or a later one
            label = f"the tensor {self._maker} made with torch.{func.overloadpacket.__name__}" + (
                f" (allocation #{made} there)" if made > 1 else "")
            return self._guard(result, label, func in _COPIES)  # a copy keeps its values, an allocation is zeroed
        return result

    # ---- checking accesses in the interpreter ----------------------------------------------------------

    def _check(self, kind: str, ptrs: Any, mask: Any) -> None:
        """Record the lanes of an interpreted load/store that land in a guard; stop a store there."""
        import numpy as np

        addresses = np.asarray(ptrs.data).astype(np.uint64, copy=False)
        active = addresses[np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)]
        if not active.size:
            return
        hit = False
        for b in self.buffers:
            if b.buffer.device.type != "cpu":  # the interpreter reads host copies of device memory
                continue
            size = b.buffer.element_size()
            base = b.buffer.data_ptr()
            first, end, stop = base + b.pad * size, base + (b.pad + b.span) * size, base + b.buffer.numel() * size
            after = active[(active >= end) & (active < stop)]
            before = active[(active >= base) & (active < first)]
            if after.size or before.size:
                hit = True
                seen = self.accesses.setdefault((kind, b.label), set())
                seen.update(((after - np.uint64(end)) // size + 1).tolist())  # 1: the first element past the end
                seen.update((-((np.uint64(first) - before) // size).astype(np.int64)).tolist())  # -k: before the start
        if hit and kind == "store":
            raise IndexError(f"tl.store outside a tensor stopped by the check: {STORE_HINT}")

    def __enter__(self):
        if self.watch_interpreter:
            try:
                from triton.runtime.interpreter import interpreter_builder as builder
            except Exception:  # another Triton: the guards alone keep the run safe
                builder = None
            if builder is not None and hasattr(builder, "create_masked_load") and hasattr(builder, "create_masked_store"):
                load, store = builder.create_masked_load, builder.create_masked_store

                def checked_load(ptrs, mask, *rest):
                    self._check("load", ptrs, mask)
                    return load(ptrs, mask, *rest)

                def checked_store(ptrs, value, mask, *rest):
                    self._check("store", ptrs, mask)
                    return store(ptrs, value, mask, *rest)

                self._saved = {"builder": builder, "create_masked_load": builder.__dict__.get("create_masked_load"),
                               "create_masked_store": builder.__dict__.get("create_masked_store")}
                builder.create_masked_load, builder.create_masked_store = checked_load, checked_store
        else:
            self._watch_compiled()
        return super().__enter__()

    def _watch_compiled(self) -> None:
        """Keep the Triton IR of every kernel launched while the guards are on (compiled, not interpreted):
        ``JITFunction.run`` returns the compiled kernel, cache hits included."""
        try:
            from triton.runtime.jit import JITFunction
        except Exception:  # noqa: BLE001 - no Triton: nothing is launched that could be read
            return
        run = JITFunction.__dict__.get("run")
        if run is None:
            return
        guards = self

        def recorded_run(jit, *args, **kwargs):
            kernel = run(jit, *args, **kwargs)
            ttir = _compiled_ttir(kernel)
            if ttir:
                guards.compiled[getattr(jit, "__name__", None) or getattr(getattr(jit, "fn", None), "__name__", "kernel")] = ttir
            return kernel

        self._jit_run = (JITFunction, run)
        JITFunction.run = recorded_run

    def __exit__(self, *exc: Any) -> None:
        try:
            return super().__exit__(*exc)
        finally:
            if self._jit_run is not None:
                cls, run = self._jit_run
                cls.run = run
                self._jit_run = None
            builder = self._saved.pop("builder", None)
            for name, prior in self._saved.items():
                if prior is None:
                    builder.__dict__.pop(name, None)
                else:
                    setattr(builder, name, prior)
            self._saved = {}

    # ---- what happened --------------------------------------------------------------------------------

    def findings(self, actual: Iterable[Any] = (), expected: Iterable[Any] = ()) -> list[str]:
        """Sentences for every access past an end: loads and stores the interpreter saw in a guard, guard
        regions a store changed, and NaN in ``actual`` where ``expected`` has none (with the guards
        intact, most likely an unmasked load that read the NaN around an input)."""
        found = []
        for (kind, label), seen in self.accesses.items():
            found.append(_sentence(kind, label, "read" if kind == "load" else "tried to write",
                                   max((d for d in seen if d > 0), default=0),
                                   max((-d for d in seen if d < 0), default=0), 0))
        stopped = {label for kind, label in self.accesses if kind == "store"}
        for b in self.buffers:
            if b.label in stopped:
                continue
            changed = b.buffer.view(_BITS[b.buffer.element_size()]) != b.sentinel
            changed.as_strided(b.tensor.shape, b.tensor.stride(), b.pad).fill_(False)  # the tensor's own elements
            where = changed.nonzero().flatten()
            if not where.numel():
                continue
            end = b.pad + b.span
            past, early = where[where >= end], where[where < b.pad]
            found.append(_sentence("store", b.label, "wrote", int(past.max()) - end + 1 if past.numel() else 0,
                                   b.pad - int(early.min()) if early.numel() else 0,
                                   where.numel() - past.numel() - early.numel()))
        unmasked = [a for kernel, ttir in self.compiled.items() for a in unmasked_accesses(ttir, kernel)
                    if a.kind == "load"]  # a store past an end changes a guard: named above
        found += [_unmasked_sentence(a) for a in dict.fromkeys(unmasked)]
        nan = sum(_nan_where_finite(a, e) for a, e in zip(actual, expected))
        if not found and nan and any(b.nan for b in self.buffers):
            found.append(f"{nan:,} elements are NaN where the reference is finite; in this check the memory around "
                         "each input (and between its rows) holds NaN, so most likely a load read past the end of a "
                         f"tensor: {LOAD_HINT}")
        return found


def _nan_where_finite(actual: Any, expected: Any) -> int:
    if not isinstance(actual, torch.Tensor) or not isinstance(expected, torch.Tensor) or actual.shape != expected.shape:
        return 0
    return int((torch.isnan(actual.detach()).cpu() & torch.isfinite(expected.detach()).cpu()).sum())


def _sentence(kind: str, label: str, verb: str, past: int, before: int, gaps: int) -> str:
    """'your kernel wrote outside `out` (up to 9 elements past its end): is every tl.store masked ...?'
    from how far past the end and before the start it went and how many gap elements it touched."""
    parts = [f"up to {past:,} elements past its end" if past else "",
             f"up to {before:,} elements before its start" if before else "",
             f"{gaps:,} elements between its rows" if gaps else ""]
    return (f"your kernel {verb} outside {label} ({', '.join(p for p in parts if p)}): "
            + (STORE_HINT if kind == "store" else LOAD_HINT))


def _unmasked_sentence(access: UnmaskedAccess) -> str:
    """'`x = tl.load(X + offsets)` (line 7 of `add_kernel`) has no mask: ...' for a load found in the IR."""
    code = access.source()
    where = (f"`{code}` (line {access.line} of `{access.kernel}`)" if code else
             f"a tl.load in `{access.kernel}`" + (f" (line {access.line})" if access.line else ""))
    return (f"{where} has no mask: where a length is not a multiple of the block it reads past the end of its "
            "tensor (here into the check's guard, without harm; past the end of an allocation it faults): "
            + LOAD_HINT)
