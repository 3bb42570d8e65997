"""What the three kernels share: interpreter detection, autotuning configs, input checks, and the
tolerances that say when a kernel agrees with its PyTorch reference.

Vendor differences stay in ``tinyllama.device``; here we only ask it which back end we run on.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tinyllama import device as dev

# Read once, when the kernel modules are imported: tinyllama.kernels sets TRITON_INTERPRET=1 on a
# machine without a GPU before it imports them, and @triton.jit reads the same variable.
INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"

# Register the kernels as opaque operators (``torch.library.custom_op``: a compiled graph calls our
# launchers) by default, and as ``torch.library.triton_op`` (Inductor compiles the Triton kernels into
# its graph) only when TINYLLAMA_TRITON_OPS=1 is set before the import, never under the interpreter.
# Why opaque by default: on an H200 (torch 2.11, Triton 3.6, 2026-11-23) Inductor failed to compile our
# flash attention forward traced through triton_op (CompilationError in _attn_fwd_kernel), while the
# opaque operators passed every test of tests/test_kernel_ops.py, torch.compile of V3 included.
OPAQUE_OPS: bool = INTERPRET or os.environ.get("TINYLLAMA_TRITON_OPS", "0") != "1"

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Grid dimensions 1 and 2 are limited to 65535 programs on both vendors' GPUs.
MAX_GRID_Y = 65535


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for launch grids, in plain Python: ``triton.cdiv`` is a constexpr function in
    Triton >= 3.5, and calling one from Python costs the host about 4 us."""
    return -(a // -b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for ``n <= 1``), in plain Python (see :func:`cdiv`)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


def configs(gpu: list[triton.Config], interpreter: triton.Config) -> list[triton.Config]:
    """The autotuning candidates: ``gpu`` when compiling, the single ``interpreter`` config when
    interpreting (the interpreter is far too slow to benchmark configurations, and one small block
    size keeps the CPU tests fast while still crossing block boundaries)."""
    return [interpreter] if INTERPRET else gpu


def autotune(candidates: list[triton.Config], key: list[str], prune: Callable[..., list[triton.Config]] | None = None,
             reset_to_zero: list[str] | None = None):
    """``triton.autotune`` that times each candidate for about 30 ms instead of Triton's default of
    about 125 ms (where the installed Triton lets us choose), so that first calls stay short.
    ``reset_to_zero`` names outputs that a kernel accumulates into (zeroed before each timed try)."""
    options: dict[str, object] = {}
    if prune is not None:
        options["prune_configs_by"] = {"early_config_prune": prune}
    if reset_to_zero:
        options["reset_to_zero"] = reset_to_zero
    if "do_bench" in inspect.signature(triton.autotune).parameters:
        from triton.testing import do_bench

        options["do_bench"] = lambda fn, quantiles: do_bench(fn, warmup=5, rep=25, quantiles=quantiles)
    return triton.autotune(configs=candidates, key=key, **options)


def pipeline_stages(cuda: int) -> int:
    """``num_stages`` for a loop that streams tiles: NVIDIA pipelines ``cuda`` loads ahead through
    shared memory; AMD's stream pipeliner is tuned for 1-2 stages and has 64 KiB of LDS."""
    return min(cuda, 2) if dev.backend() == "rocm" else cuda


# The back end, asked once (``torch.cuda.is_available()`` reads the environment on every call).
_BACKEND = dev.backend()


def dot_precision(dtype: torch.dtype) -> str:
    """``input_precision`` for ``tl.dot``: fp32 inputs use full-precision products unless PyTorch
    itself allows TF32 for fp32 matmuls (so that "fp32" means the same as in the V1 model).
    ``ieee`` is accepted by every back end; 16-bit inputs ignore it."""
    if dtype == torch.float32 and _BACKEND == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "ieee"


def upcast_dots(dtype: torch.dtype) -> bool:
    """Whether ``tl.dot`` operands must be converted to fp32 first: Triton's interpreter multiplies
    bf16 tiles as their raw 16-bit integers (observed with Triton 3.8), so it gets fp32 tiles."""
    return INTERPRET and dtype == torch.bfloat16


@triton.jit
def mma(a, b, acc, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """``acc + a @ b`` with fp32 accumulation (see ``upcast_dots`` for ``UPCAST``)."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=PRECISION)


# ------------------------------------------------------------------------------------------------
# Tensor descriptors: tiles of a (rows, width) matrix read by the Tensor Memory Accelerator (TMA)
# ------------------------------------------------------------------------------------------------

# False (the default): pointer loads everywhere. On an H200 with Triton 3.6 the descriptor path of the
# flash attention was slower than pointer loads, 0.60-0.65x of cuDNN's SDPA against 0.67-0.70x
# (benchmarks/history/flash_attention.md), so it is opt-in:
# TINYLLAMA_TENSOR_DESCRIPTORS=auto decides per device and tensors (``use_tensor_descriptors``), =1
# forces descriptors (tests do so under the interpreter, which executes them too), =0 is the default.
TENSOR_DESCRIPTORS: bool | None = {"1": True, "auto": None}.get(os.environ.get("TINYLLAMA_TENSOR_DESCRIPTORS", ""),
                                                                False)
_TMA_DEVICES: dict[object, bool] = {}

# Warp-specialized loops (``tl.range(..., warp_specialize=True)``: producer warps issue the loads,
# consumer warps the products) as extra autotuning candidates, only with TINYLLAMA_WARP_SPECIALIZE=1:
# they double the compile time of a first call and were not yet measured faster on Hopper with the
# Triton this course pins (3.6; its tutorial enables them on Blackwell only).
WARP_SPECIALIZE: bool = os.environ.get("TINYLLAMA_WARP_SPECIALIZE", "0") == "1" and not INTERPRET


def use_tensor_descriptors(*tensors: torch.Tensor) -> bool:
    """Whether kernels should read these tensors' tiles through tensor descriptors (TMA loads): on a
    GPU with TMA (``tinyllama.device``), with a Triton that builds descriptors inside a kernel
    (``tl.make_tensor_descriptor``, Triton >= 3.4), and only where TMA can address the tensors: start
    16-byte aligned, every stride but the last a multiple of 16 bytes, unit last stride. Elsewhere
    (AMD, older GPUs, the interpreter, odd strides) the kernels use pointer loads: same results."""
    if TENSOR_DESCRIPTORS is not None:
        return TENSOR_DESCRIPTORS
    first = tensors[0]
    ok = _TMA_DEVICES.get(first.device)
    if ok is None:
        ok = (not INTERPRET and hasattr(tl, "make_tensor_descriptor") and hasattr(triton, "set_allocator")
              and dev.has_tensor_memory_accelerator(first.device))
        _TMA_DEVICES[first.device] = ok
    if not ok:
        return False
    for t in tensors:
        size = t.element_size()
        strides = t.stride()
        if t.data_ptr() % 16 or strides[-1] != 1 or any(s * size % 16 for s in strides[:-1]):
            return False
    return True


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_descriptor_memory() -> None:
    """Give Triton an allocator for the descriptors a kernel builds (128 bytes of device memory per
    program), unless one is set. Triton keeps it in a context variable, which a new thread does not
    inherit (autograd runs backwards in its own threads): call this before each launch that uses
    descriptors, it costs a lookup."""
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch)


@triton.jit
def row_tiles(base, stride_row, N_ROWS, ROWS: tl.constexpr, WIDTH: tl.constexpr, TMA: tl.constexpr):
    """What ``load_rows`` / ``store_rows`` read from: a descriptor of the (N_ROWS, WIDTH) matrix at
    ``base`` (row stride ``stride_row``, unit column stride) in tiles of ``ROWS`` rows, or ``base``
    itself for pointer loads. Made once per program, outside the loops that use it."""
    if TMA:
        return tl.make_tensor_descriptor(base, shape=[N_ROWS, WIDTH], strides=[stride_row, 1],
                                         block_shape=[ROWS, WIDTH])
    else:
        return base


@triton.jit
def load_rows(src, stride_row, start, N_ROWS, ROWS: tl.constexpr, WIDTH: tl.constexpr, TMA: tl.constexpr):
    """Rows ``[start, start + ROWS)`` of a ``row_tiles`` matrix; rows past ``N_ROWS`` read as zero."""
    if TMA:
        return src.load([start, 0])
    else:
        rows = start + tl.arange(0, ROWS)
        return tl.load(src + rows[:, None] * stride_row + tl.arange(0, WIDTH)[None, :],
                       mask=(rows < N_ROWS)[:, None], other=0.0)


@triton.jit
def store_rows(dst, stride_row, start, N_ROWS, value, ROWS: tl.constexpr, WIDTH: tl.constexpr, TMA: tl.constexpr):
    """Write ``value`` to rows ``[start, start + ROWS)``; rows past ``N_ROWS`` are not written."""
    if TMA:
        dst.store([start, 0], value)
    else:
        rows = start + tl.arange(0, ROWS)
        tl.store(dst + rows[:, None] * stride_row + tl.arange(0, WIDTH)[None, :], value,
                 mask=(rows < N_ROWS)[:, None])


def check_tensors(kernel: str, *tensors: torch.Tensor) -> None:
    """Raise a short ``ValueError`` or ``RuntimeError`` unless the tensors can go to a Triton kernel:
    floating point of a supported type, all on one device, and a device Triton can run on.

    On every eager launch, so written for the host's time (about 1 us for three tensors): one
    ``device`` object per tensor, compared with the first's."""
    first = tensors[0]
    if not isinstance(first, torch.Tensor):
        raise TypeError(f"{kernel}: expected tensors, got {type(first).__name__}")
    device = first.device
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{kernel}: expected tensors, got {type(t).__name__}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{kernel}: dtype {t.dtype} is not supported; use float32, bfloat16 or float16")
        if t.device != device:
            raise ValueError(f"{kernel}: tensors are on {device} and {t.device}; put them on one device")
    if not first.is_cuda:
        if device.type == "cpu" and not INTERPRET:
            raise RuntimeError(
                f"{kernel}: the tensors are on the CPU, but Triton compiles for the GPU here. Move them to the "
                "GPU, or set TRITON_INTERPRET=1 before importing tinyllama.kernels to run the kernels on the CPU."
            )
        if device.type != "cpu":
            raise RuntimeError(f"{kernel}: Triton cannot run on a {device.type} device; use a GPU")


def rows_view(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a 2-D (rows, last dim) tensor whose last dimension has unit stride.

    This is the contiguity rule of the row kernels (RMSNorm, SwiGLU): any distance between rows is
    fine and costs nothing (slices, head views); a last dimension that is not contiguous (a
    transposed view, a stride-0 broadcast) is copied once, because reading across memory would be
    slower than the copy.
    """
    rows = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    if rows.stride(-1) != 1 and rows.shape[-1] > 1:
        rows = rows.contiguous()
    return rows


def empty_rows(like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An empty contiguous tensor of ``like``'s shape (and device; ``dtype`` or ``like``'s): seen as
    (rows, last dim), its row stride is the last dimension. Allocating in the caller's shape
    spares the host the ``view`` back to it (a ``view`` to a ``torch.Size`` costs 1-4 us)."""
    return torch.empty_like(like, dtype=dtype, memory_format=torch.contiguous_format)


def unit_last_stride(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself if its last dimension has unit stride, else a contiguous copy."""
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


_MULTIPROCESSORS: dict[torch.device, int] = {}


def multiprocessor_count(device: torch.device) -> int:
    """Streaming multiprocessors (NVIDIA) or compute units (AMD): how many programs run at once
    (asked once per device: ``get_device_properties`` costs the host microseconds per call)."""
    count = _MULTIPROCESSORS.get(device)
    if count is None:
        # the interpreter runs programs one after another; a few suffice
        count = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
        _MULTIPROCESSORS[device] = count
    return count


# ------------------------------------------------------------------------------------------------
# Agreement with the reference
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelTolerance:
    """Largest allowed ``max|actual - expected| / max|expected|`` (error relative to the tensor's scale).

    fp32 is tight (rounding only). The 16-bit bounds leave room for rounding the inputs, the output
    and, in attention, the probabilities before the second matmul (as every flash kernel does): at
    sequence length 1000 the attention gradients are about 1.4% off in bf16 (PyTorch's own bf16
    attention: 0.7%); a real bug (a wrong mask, a missing term) is off by tens of percent."""

    fp32: float = 1e-5
    bf16: float = 3e-2
    fp16: float = 5e-3

    def __call__(self, dtype: torch.dtype) -> float:
        return {torch.float32: self.fp32, torch.bfloat16: self.bf16, torch.float16: self.fp16}[dtype]


class KernelMismatch(AssertionError):
    """A kernel's result differs from its PyTorch reference by more than the tolerance."""


def max_relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max|actual - expected| / max|expected|`` in fp64 (0 when both are all zero)."""
    if actual.shape != expected.shape:
        raise KernelMismatch(f"shape {tuple(actual.shape)} differs from the reference's {tuple(expected.shape)}")
    a, e = actual.double(), expected.double()
    if not torch.isfinite(a).all():
        return float("inf")
    scale = e.abs().max().item()
    err = (a - e).abs().max().item()
    return err / scale if scale > 0 else err


def assert_close(name: str, actual: torch.Tensor, expected: torch.Tensor, tolerance: float) -> float:
    """Raise ``KernelMismatch`` naming ``name`` unless ``actual`` agrees with ``expected``; returns the error."""
    err = max_relative_error(actual, expected)
    if not err <= tolerance:
        raise KernelMismatch(f"{name}: relative error {err:.3g} exceeds {tolerance:.3g}")
    return err


def compare_with_reference(
    kernel: Callable[..., torch.Tensor],
    reference: Callable[..., torch.Tensor],
    inputs: Sequence[torch.Tensor],
    names: Sequence[str],
    tolerance: KernelTolerance | None = None,
    grad_out: torch.Tensor | None = None,
    **kwargs: object,
) -> dict[str, float]:
    """Check ``kernel(*inputs, **kwargs)`` against ``reference`` run in fp32 on the same values: the
    output and the gradient of every input for one random upstream gradient (or ``grad_out``).

    ``inputs`` must require gradients (they may be views of leaves, to test strided memory). Returns
    the relative error of each compared tensor, keyed ``"out"`` and ``"d" + name``; raises
    ``KernelMismatch`` at the first one above the tolerance of the inputs' dtype.
    """
    tolerance = tolerance or KernelTolerance()
    tol = tolerance(inputs[0].dtype)
    out = kernel(*inputs, **kwargs)
    exact = [t.detach().float().requires_grad_() for t in inputs]
    expected = reference(*exact, **kwargs).float()
    errors = {"out": assert_close("output", out, expected, tol)}
    if grad_out is None:
        grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, list(inputs), grad_out, allow_unused=True)
    expected_grads = torch.autograd.grad(expected, exact, grad_out.float())
    for name, grad, want in zip(names, grads, expected_grads):
        if grad is None:
            raise KernelMismatch(f"gradient of {name}: missing (the backward does not reach it)")
        errors["d" + name] = assert_close(f"gradient of {name}", grad, want, tol)
    return errors


# ------------------------------------------------------------------------------------------------
# Launching: the autotuner's choice remembered per key, the compiled kernel launched directly
# ------------------------------------------------------------------------------------------------

try:  # Triton >= 3.4 keeps the launch hooks here; without it we launch through Triton's own path
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - older Triton
    _knobs = None
from triton.runtime import driver
from triton.runtime.autotuner import Autotuner


# Keys a launcher remembers before it starts afresh.
MAX_LAUNCH_KEYS = 4096


class Launcher:
    """Launch a ``@triton.jit`` kernel (optionally ``@triton.autotune``-d) with little host time.

    ``kernel[grid](*args, **meta)`` costs 45-100 us of host time per call in Triton 3.x for kernels
    of ~30 arguments (H200, Triton 3.6), against 15 us for a small plain kernel: on every call the
    autotuner rebuilds its key (a dict of all arguments, the dtypes of all tensors) and looks the
    configuration up, then ``JITFunction.run`` binds every argument again, specialises each one
    (dtype, 16-byte alignment, divisibility by 16) and hashes the result to find the compiled binary.

    A launcher does that work once per *key* and remembers the outcome. The key is what decides
    which binary Triton would pick and which configuration the autotuner would choose: the exact
    values of every scalar argument (the autotuner's key among them; Triton specialises integers on
    being 1 or a multiple of 16, and types them 32- or 64-bit, all implied by the value), every
    constexpr passed by the caller, and each tensor's dtype and address modulo 16 (Triton specialises
    on 16-byte alignment). The first call for a key runs the autotuner and Triton's normal
    launch (compiling, timing candidates); later calls with the same key launch the remembered
    ``CompiledKernel`` directly with the arguments in signature order, the way ``JITFunction.run``
    ends (``CompiledKernel.run``; unchanged from Triton 3.4 to 3.8). The interpreter (CPU) and a
    Triton without ``triton.knobs`` have no compiled binary to launch: there later calls go to
    ``JITFunction.run`` with the remembered configuration, skipping only the autotuner.

    ``misses`` counts calls that went through the autotuner (tests use it). Runtime arguments are
    passed positionally in signature order, constexprs by keyword; every constexpr of the kernel
    follows its runtime arguments (checked here).

    Inside ``torch.library.triton_op`` tracing (fake or functional tensors) the call becomes
    ``wrap_triton(kernel)[grid](...)``, so ``torch.compile`` sees the kernel; on fake tensors of an
    opaque operator (``OPAQUE_OPS``: always under the interpreter, where no graph can hold an
    interpreted kernel) nothing is launched (see ``tinyllama.kernels._ops``).
    """

    # False: every launch goes through Triton's own path (autotuner, then JITFunction.run), as before
    # launchers remembered anything; for measuring what remembering saves (see ``triton_launch_path``).
    remember: bool = True

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.autotuner = kernel if isinstance(kernel, Autotuner) else None
        jit = kernel.fn if self.autotuner is not None else kernel
        self.jit = jit
        params = list(inspect.signature(jit.fn).parameters.values())
        constexpr = [p.annotation is tl.constexpr or p.annotation == "tl.constexpr" for p in params]
        self.n_runtime = constexpr.index(True) if True in constexpr else len(params)
        if any(not c for c in constexpr[self.n_runtime:]):
            raise TypeError(f"{self.name}: every constexpr must follow the runtime arguments")
        self.constexpr_names = [p.name for p in params[self.n_runtime:]]
        self.n_tensors = -1  # how many leading arguments are tensors (or None): known at the first call
        self.direct = not INTERPRET and _knobs is not None
        self.cache: dict[tuple, tuple] = {}
        self.misses = 0

    @property
    def name(self) -> str:
        return getattr(self.jit, "__name__", repr(self.jit))

    def __call__(self, grid, *args, **meta):
        """Launch on ``grid`` (a tuple, or a callable of the configuration's meta-parameters)."""
        first = args[0]
        if first.__class__ is not torch.Tensor and isinstance(first, torch.Tensor) and _traced(args):
            if OPAQUE_OPS:
                return None  # fake tensors: only shapes are wanted, and the allocations gave them
            from torch.library import wrap_triton

            return wrap_triton(self.kernel)[grid](*args, **meta)
        if not Launcher.remember:
            return self.kernel[grid](*args, **meta)
        # The key (hot path, a few microseconds): the kernels take their tensors (or None) first,
        # then scalars. Scalars enter by value (finer than the classes Triton specialises on, so a
        # new value is a miss, never a wrong binary); tensors by dtype and 16-byte alignment; and the
        # device that is current, on which the binary was loaded.
        n = self.n_tensors
        if n < 0:
            n = self.n_tensors = next((i for i, a in enumerate(args)
                                       if not (a is None or isinstance(a, torch.Tensor))), len(args))
        device = _DEVICE_AND_STREAM[0]() if self.direct else None
        key = (device, args[n:], *meta.items(),
               *[None if t is None else (t.dtype, t.data_ptr() & 15) for t in args[:n]])
        entry = self.cache.get(key)
        if entry is None:
            return self._first_call(key, grid, args, meta)
        compiled, config_meta, tail, options = entry
        if grid.__class__ is not tuple:
            grid = grid(config_meta)
        if compiled is None:
            return self.jit.run(*args, grid=grid, warmup=False, **meta, **options)
        full = (*args, *tail)
        stream = _DEVICE_AND_STREAM[1](device)
        enter, exit_ = _hook(_knobs.runtime.launch_enter_hook), _hook(_knobs.runtime.launch_exit_hook)
        compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                     compiled.function, compiled.packed_metadata,
                     compiled.launch_metadata(grid, stream, *full) if enter is not None else None,
                     enter, exit_, *full)
        return compiled

    def _first_call(self, key: tuple, grid, args: tuple, meta: dict):
        if len(args) != self.n_runtime:  # the direct launch passes them in signature order
            raise TypeError(f"{self.name}: pass its {self.n_runtime} runtime arguments positionally "
                            f"(got {len(args)}) and its constexprs by keyword")
        self.misses += 1
        if len(self.cache) >= MAX_LAUNCH_KEYS:  # sizes that change every call (decoding): stay bounded
            self.cache.clear()
        compiled = self.kernel[grid](*args, **meta)
        config = self.autotuner.best_config if self.autotuner is not None else None
        options = config.all_kwargs() if config is not None else {}
        config_meta = {**meta, **(config.kwargs if config is not None else {})}
        if hasattr(compiled, "result"):  # Triton's asynchronous compilation mode
            compiled = compiled.result()
        direct = self.direct and compiled is not None and hasattr(compiled, "packed_metadata")
        tail = tuple(config_meta[name] for name in self.constexpr_names) if direct else ()
        self.cache[key] = (compiled if direct else None, config_meta, tail, options)
        return compiled


def _hook(chain):
    """A launch hook, or ``None`` for an empty chain: Triton >= 3.5 keeps its hooks in a ``HookChain``
    that is never ``None``, and building the launch metadata for it and calling it empty, twice per
    launch, cost 2-3 us of host time (H200 host, Triton 3.6). A profiler that adds a hook (Proton)
    makes the chain non-empty, and then the launch passes it on as ``JITFunction.run`` does."""
    return None if chain is None or not getattr(chain, "calls", True) else chain


def _resolve_device_and_stream() -> None:
    active = driver.active
    _DEVICE_AND_STREAM[:] = [active.get_current_device, active.get_current_stream]


def _first_device() -> int:
    _resolve_device_and_stream()
    return _DEVICE_AND_STREAM[0]()


def _first_stream(device: int) -> int:
    _resolve_device_and_stream()
    return _DEVICE_AND_STREAM[1](device)


# Triton's driver functions for the current device and stream (PyTorch's current stream, a CUDA
# graph's while capturing), looked up at the first launch: ``driver.active`` is a proxy whose every
# attribute access costs the host a microsecond or two.
_DEVICE_AND_STREAM: list[Callable] = [_first_device, _first_stream]


def _traced(args: tuple) -> bool:
    """Whether the tensors are those of a tracer (fake or functional tensors), not real data."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return any(isinstance(a, (FakeTensor, FunctionalTensor)) for a in args)


@contextlib.contextmanager
def triton_launch_path() -> Iterator[None]:
    """Within this context every launcher launches through Triton's own path (``kernel[grid](...)``:
    the autotuner's lookup and ``JITFunction.run``'s binding), as a plain ``@triton.autotune`` kernel
    would: the "before" of :class:`Launcher`'s host time."""
    previous, Launcher.remember = Launcher.remember, False
    try:
        yield
    finally:
        Launcher.remember = previous


def launcher(kernel) -> Launcher:
    """Decorator form of :class:`Launcher`, placed above ``@autotune`` / ``@triton.jit``."""
    return Launcher(kernel)
