"""The kernels as PyTorch operators (``torch.ops.tinyllama.*``): what ``torch.compile``, ``FlopCounterMode``
and the profiler see.

Each kernel module registers its forward and backward launchers here as operators with
``torch.library.triton_op`` (PyTorch >= 2.6): inside it the launches become ``wrap_triton`` calls
while PyTorch traces (see ``Launcher``), so Inductor puts our Triton kernels into the compiled graph
and ``torch.compile`` traces V3 end to end. Gradients are wired with ``register_autograd``, and
FLOP formulas with ``torch.utils.flop_counter.register_flop_formula``.

Under Triton's interpreter (no GPU) a compiled graph cannot hold an interpreted kernel, so there
the operators are plain ``torch.library.custom_op`` operators: the compiled graph calls them as
opaque functions, and their fake implementation is the same launcher code, which allocates the
outputs and launches nothing on fake tensors. They are registered the same way on a GPU unless ``TINYLLAMA_TRITON_OPS=1``
asks for ``triton_op``
(``tinyllama.kernels._triton.OPAQUE_OPS``).

Why eager calls do not go through the operators: a call through the dispatcher to a Python
operator with autograd costs about 100 us of host time more than ``autograd.Function.apply`` (this
CPU, torch 2.14: 106 us for ``custom_op``, 129 us for ``triton_op``, against 11 us; without
autograd 31 and 40 us), several times the 15-25 us a whole launch is allowed. So the public
functions (``rmsnorm``, ``flash_attention``, ...) call the autograd Functions directly and route
through the operators only when something must see them: while ``torch.compile`` traces, and while a
Python dispatch mode is active (``FlopCounterMode``, ``FakeTensorMode``, ``make_fx``);
:func:`dispatch_through_ops` decides. The profiler is not such a case: a profile of eager V3 must show
eager V3's host time and kernels (the operators would add ~100 us of dispatch per call and, for
RMSNorm's backward, a zeroing kernel), so there the autograd Functions open a ``record_function``
range named like the operator (:func:`named`), and the profiler lists ``tinyllama::rmsnorm_forward``
and the others either way.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable

import torch
from torch._library.custom_ops import CustomOpDef
from torch.utils._python_dispatch import _get_current_dispatch_mode

from tinyllama.kernels._triton import OPAQUE_OPS

NAMESPACE = "tinyllama"


def dispatch_through_ops() -> bool:
    """Whether a public kernel function should call its registered operator (see the module
    docstring) rather than its autograd Function: under a microsecond to decide."""
    return torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None


_NOT_PROFILING = contextlib.nullcontext()


def named(name: str) -> contextlib.AbstractContextManager:
    """While the profiler records, a ``record_function`` range named like the operator
    (``tinyllama::name``) around the eager launch; otherwise nothing."""
    if torch.autograd._profiler_enabled():
        return torch.profiler.record_function(f"{NAMESPACE}::{name}")
    return _NOT_PROFILING


def register(name: str, fn: Callable, schema: str, mutates_args: Iterable[str] = ()) -> CustomOpDef:
    """Register ``fn`` (a launcher whose launches go through :class:`~tinyllama.kernels._triton.Launcher`)
    as the operator ``tinyllama::name`` with the given ``schema`` (spelled out: the kernel modules'
    annotations are strings, ``from __future__ import annotations``); returns the operator
    (``torch.ops.tinyllama.name`` calls it)."""
    qualname = f"{NAMESPACE}::{name}"
    if not OPAQUE_OPS:
        try:
            return torch.library.triton_op(qualname, fn, mutates_args=tuple(mutates_args), schema=schema)
        except Exception as error:  # noqa: BLE001 - an older torch: the kernels must still import
            warnings.warn(f"torch.library.triton_op could not register {qualname} ({error}); registering it "
                          "as an opaque custom_op instead (torch.compile calls it, Inductor does not see its "
                          "kernels)", stacklevel=2)
    op = torch.library.custom_op(qualname, fn, mutates_args=tuple(mutates_args), schema=schema)
    op.register_fake(fn)  # the launcher allocates the outputs and launches nothing on fake tensors
    return op


def register_flops(op: CustomOpDef, formula: Callable[..., int]) -> None:
    """Register ``formula`` (called with the shapes of the operator's arguments, and ``out_shape``)
    as the operator's FLOP count for ``FlopCounterMode``."""
    from torch.utils.flop_counter import register_flop_formula

    packet = getattr(getattr(torch.ops, NAMESPACE), op._name.split("::")[-1])
    register_flop_formula(packet)(formula)


def no_flops(*args, out_shape=None, **kwargs) -> int:
    """The FLOP count of an element-wise operator: 0, as ``FlopCounterMode`` counts only matrix
    products (its ATen formulas cover matmuls, convolutions and attention): the totals of V3 then
    equal those of V1, V2 and V4, whose RMSNorm, RoPE and SwiGLU are ATen element-wise operators
    that it does not count either."""
    return 0
