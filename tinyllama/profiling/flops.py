"""Counting FLOPs two ways, and checking that the counts agree.

- **DeepSpeed's FLOPS profiler** patches ``torch.nn.functional`` and a few tensor methods (``matmul``,
  ``@``, ``bmm``...) while one forward pass runs, and attributes multiply-accumulates (MACs), FLOPs,
  parameters and wall-clock latency to every module. :func:`deepspeed_profile` runs it and returns
  those numbers as a DataFrame, along with DeepSpeed's own printout.
- **``torch.utils.flop_counter.FlopCounterMode``** sees every ATen operator below autograd, forward
  and backward, and counts the FLOPs of matrix multiplies, convolutions and attention kernels.
  :func:`count_flops` runs it on any callable.

Where they differ, and why (:func:`compare_counts` shows it module by module):

1. DeepSpeed's "flops" add element-wise work (softmax, SiLU, adds, norms) to twice the MACs;
   ``FlopCounterMode`` counts only matmul-class operators. Compare 2 x DeepSpeed's MACs with it.
2. DeepSpeed counts one forward pass; ``FlopCounterMode`` counts whatever runs, so a training step
   (forward + backward, the backward doing two matmuls per forward matmul) is about 3x the forward.
3. Attention. Written out with ``@`` (TinyLLaMA V1) both see the two products q kᵀ and p v. Through
   ``F.scaled_dot_product_attention`` DeepSpeed counts them from the call's shapes, while
   ``FlopCounterMode`` needs a formula for the kernel PyTorch picked: it has them for the CUDA flash,
   memory-efficient and cuDNN kernels, and for the CPU flash kernel only from torch 2.15 on: older
   releases report 0 attention FLOPs on a CPU (:func:`torch_counts_cpu_attention` tells which).
   ``count_flops(..., cpu_attention=True)`` supplies the formula either way.
4. Both count the full seq x seq square even for causal attention, where a flash kernel skips about
   half of it: for a causal flash kernel these are model FLOPs, not executed FLOPs. The roofline needs
   executed FLOPs: :func:`cpu_attention_formulas` with ``causal=True`` counts a fused kernel called
   with ``is_causal`` over the lower triangle with its diagonal (:func:`causal_pairs`), the work a
   kernel that skips the masked tiles must still do.
5. DeepSpeed sees only calls that go through the functions it patches: operators called from
   compiled graphs (``torch.compile``) or from C++ are invisible to it. Profile the eager model.
"""

from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import pandas as pd
import torch
from torch import nn

from tinyllama.config import ModelConfig
from tinyllama.costs.flops import causal_pairs
from tinyllama.models.weights import unwrap  # DeepSpeed sees only the eager model, not compile's wrapper

DEFAULT_TOLERANCE = 0.01  # 1%: the two counters use the same formulas for matmuls and convolutions

_INSTALL_HINT = ("install it into this environment with `pip install deepspeed` (its FLOPS profiler is "
                 "pure Python: no GPU build or compiler is needed)")


class DeepSpeedMissing(ImportError):
    """DeepSpeed (for its FLOPS profiler) is not installed or cannot be imported."""


def _import_flops_profiler() -> Any:
    """DeepSpeed's flops_profiler module, or :class:`DeepSpeedMissing` with what to do."""
    try:
        # DeepSpeed logs which accelerator it found at import; that is noise in a notebook.
        logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
        from deepspeed.profiling.flops_profiler import profiler
    except ModuleNotFoundError as error:
        if error.name and error.name.split(".")[0] != "deepspeed":
            raise DeepSpeedMissing(f"DeepSpeed is installed but needs {error.name!r}: {_INSTALL_HINT}") from None
        raise DeepSpeedMissing(f"DeepSpeed is not installed: {_INSTALL_HINT}") from None
    except Exception as error:  # noqa: BLE001 - a broken install must give one clear line
        raise DeepSpeedMissing(f"DeepSpeed is installed but fails to import ({type(error).__name__}: "
                               f"{error}); reinstall it with `pip install --force-reinstall deepspeed`") from None
    return profiler


def deepspeed_available() -> bool:
    """True when DeepSpeed's FLOPS profiler can be imported."""
    try:
        _import_flops_profiler()
    except DeepSpeedMissing:
        return False
    return True


# --------------------------------------------------------------------------------------------------
# DeepSpeed
# --------------------------------------------------------------------------------------------------


@dataclass
class DeepSpeedProfile:
    """One forward pass as DeepSpeed's FLOPS profiler sees it.

    ``modules`` has one row per module (``name``, ``type``, ``depth``, ``params``, ``macs``, ``flops``,
    ``latency_ms``); the root module is the row with ``depth == 0``. ``text`` is DeepSpeed's printout.
    """

    flops: int
    macs: int
    params: int
    latency_ms: float
    modules: pd.DataFrame
    text: str

    def by_depth(self, depth: int) -> pd.DataFrame:
        """Modules at ``depth`` aggregated by type (DeepSpeed's "aggregated profile"), most MACs first."""
        rows = self.modules[self.modules["depth"] == depth]
        table = rows.groupby("type").agg(count=("name", "size"), params=("params", "sum"), macs=("macs", "sum"),
                                         flops=("flops", "sum"), latency_ms=("latency_ms", "sum"))
        return table.sort_values("macs", ascending=False).reset_index()


def deepspeed_profile(
    model: nn.Module, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None, *, warm_up: int = 1,
    module_depth: int = -1, top_modules: int = 3, detailed: bool = True,
) -> DeepSpeedProfile:
    """Run DeepSpeed's FLOPS profiler over ``model(*args, **kwargs)`` (one forward, without gradients,
    after ``warm_up`` untimed passes) and return its numbers and its text.

    Raises :class:`DeepSpeedMissing` when DeepSpeed cannot be imported.
    """
    profiler_module = _import_flops_profiler()
    model = unwrap(model)
    kwargs = kwargs or {}
    with torch.no_grad():
        for _ in range(warm_up):
            model(*args, **kwargs)
        profiler = profiler_module.FlopsProfiler(model)
        profiler.start_profile()
        try:
            model(*args, **kwargs)
            rows = []
            for name, module in model.named_modules():
                rows.append({
                    "name": name or "(model)", "type": type(module).__name__,
                    "depth": 0 if not name else name.count(".") + 1,
                    "params": int(module.__params__ + module.__expert_params__),
                    "macs": int(profiler_module.get_module_macs(module)),
                    "flops": int(profiler_module.get_module_flops(module)),
                    "latency_ms": 1e3 * float(profiler_module.get_module_duration(module)),
                })
            text = io.StringIO()
            with contextlib.redirect_stdout(text):
                profiler.print_model_profile(profile_step=warm_up, module_depth=module_depth,
                                             top_modules=top_modules, detailed=detailed)
            result = DeepSpeedProfile(
                flops=int(profiler.get_total_flops()), macs=int(profiler.get_total_macs()),
                params=int(profiler.get_total_params()), latency_ms=1e3 * float(profiler.get_total_duration()),
                modules=pd.DataFrame(rows), text=text.getvalue())
        finally:
            # Always restore torch.nn.functional: a half-finished profile must not leave it patched.
            profiler.end_profile()
    return result


# --------------------------------------------------------------------------------------------------
# torch.utils.flop_counter
# --------------------------------------------------------------------------------------------------


def _pairs(s_q: int, s_k: int, causal: bool) -> int:
    return causal_pairs(s_q, s_k) if causal else s_q * s_k


def _attention_forward_flops(q: Sequence[int], k: Sequence[int], v: Sequence[int], causal: bool = False) -> int:
    """q kᵀ and p v: 2 FLOPs per multiply-add, query heads (GQA broadcasts K/V), over the full square or,
    ``causal``, over the lower triangle (:func:`causal_pairs`)."""
    *batch, s_q, d = q
    s_k, d_v = k[-2], v[-1]
    heads = 1
    for n in batch:
        heads *= n
    return 2 * heads * _pairs(s_q, s_k, causal) * (d + d_v)


def _attention_backward_flops(q: Sequence[int], k: Sequence[int], v: Sequence[int], causal: bool = False) -> int:
    """Recomputed scores, then the gradients of p v (two products) and of q kᵀ (two products), over the
    same pairs as the forward."""
    *batch, s_q, d = q
    s_k, d_v = k[-2], v[-1]
    heads = 1
    for n in batch:
        heads *= n
    return 2 * heads * _pairs(s_q, s_k, causal) * (3 * d + 2 * d_v)


def _is_causal(schema: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """The ``is_causal`` argument of one call of an attention kernel with this ``schema`` (positional or
    keyword; its default when the call left it out)."""
    for i, argument in enumerate(schema.arguments):
        if argument.name != "is_causal":
            continue
        if argument.name in kwargs:
            return bool(kwargs[argument.name])
        if i < len(args) and not argument.kwarg_only:
            return bool(args[i])
        return bool(argument.default_value) if argument.has_default_value() else False
    return False


def torch_counts_cpu_attention() -> bool:
    """Whether this torch's ``FlopCounterMode`` has its own formula for the CPU flash-attention kernel
    (torch 2.15 and newer); without one it counts such attention as 0 FLOPs."""
    from torch.utils.flop_counter import flop_registry

    kernel = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    return kernel is not None and (kernel in flop_registry or kernel.default in flop_registry)


def cpu_attention_formulas(gpu_kernels: bool = False, causal: bool = False) -> dict[Any, Callable[..., int]]:
    """FLOP formulas for the CPU flash-attention kernels, which ``FlopCounterMode`` lacks; pass as its
    ``custom_mapping``. Empty where this torch has no such kernels.

    ``gpu_kernels`` also maps the CUDA/ROCm SDPA kernels (flash, memory-efficient, cuDNN) to the same
    formulas, which read the query's heads: older torch releases' own formulas assert that keys and
    values have as many heads as queries, which grouped-query attention (``enable_gqa``) breaks.

    ``causal``: a call with ``is_causal=True`` counts the lower triangle of the scores with its diagonal
    (:func:`causal_pairs`), the work a fused kernel that skips the masked tiles does (executed FLOPs, for
    a roofline); without it every call counts the full square (the model-FLOPs convention of
    :mod:`tinyllama.costs.flops`, which MFU uses, and what DeepSpeed counts).
    """
    aten = torch.ops.aten
    forward = ["_scaled_dot_product_flash_attention_for_cpu"]
    backward = ["_scaled_dot_product_flash_attention_for_cpu_backward"]
    if gpu_kernels:
        for kind in ("flash", "efficient", "cudnn"):
            forward.append(f"_scaled_dot_product_{kind}_attention")
            backward.append(f"_scaled_dot_product_{kind}_attention_backward")
    formulas: dict[Any, Callable[..., int]] = {}
    for name in forward + backward:
        if hasattr(aten, name):
            packet = getattr(aten, name)
            formulas[packet] = _attention_formula(packet.default._schema, name in backward, causal)
    return formulas


def _attention_formula(schema: Any, backward: bool, causal: bool) -> Callable[..., int]:
    """One kernel's formula, in ``FlopCounterMode``'s calling convention (the call's arguments, tensors
    as their shapes); ``causal`` reads the call's ``is_causal`` from ``schema``."""

    def formula(*args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        skip = 1 if backward else 0  # a backward's first argument is the gradient of the output
        q, k, v = args[skip:skip + 3]
        is_causal = causal and _is_causal(schema, args, kwargs)
        count = _attention_backward_flops if backward else _attention_forward_flops
        return count(q, k, v, is_causal)

    return formula


@dataclass
class FlopCount:
    """What ``FlopCounterMode`` counted: ``total``; ``by_operator`` (one row per ATen operator) and
    ``by_module`` (one row per module, names as ``Model.layers.0.attn``); ``cpu_attention`` is the part
    that came from :func:`cpu_attention_formulas` (what torch as shipped would have missed)."""

    total: int
    by_operator: pd.DataFrame
    by_module: pd.DataFrame
    cpu_attention: int = 0


def count_flops(fn: Callable[[], Any], *, cpu_attention: bool = True) -> FlopCount:
    """Count the FLOPs of everything ``fn()`` runs (forward, and backward if it calls it) with
    ``torch.utils.flop_counter.FlopCounterMode``.

    ``cpu_attention`` adds formulas for the CPU flash-attention kernel (see the module docstring).
    """
    from torch.utils.flop_counter import FlopCounterMode

    extra = cpu_attention_formulas() if cpu_attention else {}
    counter = FlopCounterMode(display=False, custom_mapping=extra) if extra else FlopCounterMode(display=False)
    with counter:
        fn()
    counts = counter.get_flop_counts()
    by_operator = pd.DataFrame(
        [{"operator": str(op), "flops": int(n)} for op, n in counts.get("Global", {}).items()],
        columns=["operator", "flops"]).sort_values("flops", ascending=False, ignore_index=True)
    by_module = pd.DataFrame(
        [{"module": name, "flops": int(sum(ops.values()))} for name, ops in counts.items() if name != "Global"],
        columns=["module", "flops"])
    attention = sum(int(n) for op, n in counts.get("Global", {}).items() if op in extra)
    return FlopCount(int(counter.get_total_flops()), by_operator, by_module, attention)


# --------------------------------------------------------------------------------------------------
# The cross-check
# --------------------------------------------------------------------------------------------------


@dataclass
class CountComparison:
    """DeepSpeed and ``FlopCounterMode`` on the same forward pass, per module.

    ``modules`` columns: ``module``, ``depth``, ``deepspeed_2macs`` (2 x DeepSpeed's MACs),
    ``deepspeed_flops`` (its FLOPs, element-wise work included), ``flop_counter``, ``rel_diff``
    (flop_counter vs 2 x MACs) and ``agree`` (within ``tolerance``). ``notes`` explains differences.
    """

    deepspeed: DeepSpeedProfile
    flop_counter: FlopCount
    modules: pd.DataFrame
    tolerance: float
    notes: list[str] = field(default_factory=list)

    @property
    def total_rel_diff(self) -> float:
        """flop_counter's total against 2 x DeepSpeed's MACs, relative."""
        reference = 2 * self.deepspeed.macs
        return abs(self.flop_counter.total - reference) / reference if reference else float("nan")

    @property
    def agree(self) -> bool:
        """Whether the totals agree within ``tolerance``."""
        return self.total_rel_diff <= self.tolerance


def compare_counts(
    model: nn.Module, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None, *,
    tolerance: float = DEFAULT_TOLERANCE, cpu_attention: bool = True,
) -> CountComparison:
    """Count one forward pass of ``model`` with DeepSpeed and with ``FlopCounterMode`` and compare them
    module by module. The counts are checked against 2 x DeepSpeed's MACs (see the module docstring:
    DeepSpeed's "flops" also include element-wise work that ``FlopCounterMode`` does not count).
    """
    model = unwrap(model)
    kwargs = kwargs or {}
    ds = deepspeed_profile(model, args, kwargs, warm_up=1, detailed=False)
    with torch.no_grad():
        fc = count_flops(lambda: model(*args, **kwargs), cpu_attention=cpu_attention)
    root = type(model).__name__
    counted = dict(zip(fc.by_module["module"], fc.by_module["flops"]))
    names = list(ds.modules["name"])

    def counted_flops(name: str) -> int:
        key = root if name == "(model)" else f"{root}.{name}"
        if key in counted:
            return int(counted[key])
        # Containers that are never called (nn.ModuleList) have no entry: add up their children.
        children = [n for n in names if n != "(model)" and n.rpartition(".")[0] == ("" if name == "(model)" else name)]
        return sum(counted_flops(child) for child in children)

    rows = []
    for _, row in ds.modules.iterrows():
        reference = 2 * row["macs"]
        mine = counted_flops(row["name"])
        rel = abs(mine - reference) / reference if reference else (0.0 if mine == 0 else float("inf"))
        rows.append({"module": row["name"], "type": row["type"], "depth": row["depth"],
                     "deepspeed_2macs": reference, "deepspeed_flops": row["flops"], "flop_counter": mine,
                     "rel_diff": rel, "agree": rel <= tolerance})
    comparison = CountComparison(ds, fc, pd.DataFrame(rows), tolerance)
    comparison.notes = _explain(comparison, cpu_attention)
    return comparison


def _explain(c: CountComparison, cpu_attention: bool) -> list[str]:
    notes = []
    elementwise = c.deepspeed.flops - 2 * c.deepspeed.macs
    if elementwise > 0:
        notes.append(f"DeepSpeed's FLOPs ({c.deepspeed.flops:,}) exceed 2 x its MACs by {elementwise:,}: the "
                     "element-wise work (softmax, activations, norms, adds) that FlopCounterMode does not count.")
    if c.flop_counter.cpu_attention:
        notes.append(f"{c.flop_counter.cpu_attention:,} attention FLOPs come from the CPU flash-attention "
                     "formula added here; torch's FlopCounterMode as shipped counts 0 for that kernel.")
    elif not cpu_attention and c.flop_counter.total < 2 * c.deepspeed.macs * (1 - c.tolerance):
        notes.append("FlopCounterMode counted less than DeepSpeed: on a CPU, scaled_dot_product_attention runs a "
                     "flash kernel FlopCounterMode has no formula for (count_flops(cpu_attention=True) adds it).")
    if c.agree:
        notes.append(f"The totals agree within {100 * c.tolerance:g}% "
                     f"(difference {100 * c.total_rel_diff:.3f}%).")
    else:
        notes.append(f"The totals differ by {100 * c.total_rel_diff:.2f}% (tolerance {100 * c.tolerance:g}%): "
                     "see the modules with agree == False.")
    return notes


def training_flop_table(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, config: ModelConfig,
) -> pd.DataFrame:
    """One TinyLLaMA training step's FLOPs, four ways, side by side.

    Rows: the analytic formula and the meta-device count of ``tinyllama.costs.flops``; ``FlopCounterMode``
    over a real forward + backward of ``model``; 3 x DeepSpeed's forward (2 x MACs). Each with its
    ratio to the analytic count. Needs DeepSpeed for the last row.
    """
    from tinyllama.costs import flops as model_flops
    from tinyllama.models import lm_loss

    batch, seq = inputs.shape
    analytic = model_flops.training_flops(config, batch, seq)
    meta = model_flops.counted_training_flops(config, batch, seq)
    step = count_flops(lambda: lm_loss(model(inputs), targets).backward())
    model.zero_grad(set_to_none=True)
    ds = deepspeed_profile(model, (inputs,), warm_up=0, detailed=False)
    rows = [
        ("analytic: 3 x (2 x matmul params x tokens + attention)", analytic),
        ("FlopCounterMode, V1 on the meta device (tinyllama.costs.flops)", meta),
        (f"FlopCounterMode, this model ({type(unwrap(model)).__name__}), forward + backward", step.total),
        ("DeepSpeed: 3 x 2 x forward MACs", 3 * 2 * ds.macs),
    ]
    table = pd.DataFrame(rows, columns=["count", "flops"])
    table["ratio_to_analytic"] = table["flops"] / analytic
    return table
