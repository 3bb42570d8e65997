"""Reading a comparison of V2's fusions (notebook 12): each fusion against its unfused control, the
host's share of an eager step, and the checks of the notebook's exercises.

- ``fusion_label``, ``fusion_runs``, ``fusion_effects``: from :mod:`tinyllama.harness.comparison.fusions`
  (the run specs of each fusion and its control; each fusion's effect against its control);
- :func:`host_share`: the share of an eager step that the device does not account for
  (1 - GPU time / eager step time), and :data:`LAUNCH_BOUND_SHARE`, the share above which an eager
  comparison of effects of a few percent measures the host rather than the GPU; :func:`launch_verdict`:
  that share read from both runs' intervals (launch-bound, not, or within noise of the line), and
  :func:`setting_launch_verdict`, one verdict for the runs of one precision;
- ``time_samples`` (from :mod:`tinyllama.timing`): per-call times of a callable, the samples that
  ``course.check_ratio`` compares;
- :func:`check_fused_qkv`, :func:`check_gemm_prediction`, :func:`check_strided_timing`,
  :func:`check_host_share`: the checks of exercises 12.1-12.4, with feedback that names the likely
  mistake (the function or the values a participant writes are passed in; the reference answers and
  the typical mistakes, :data:`QKV_SLIPS`..., live here).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from tinyllama.course.checkpoints import check_allclose, checkpoint
from tinyllama.course.feedback import Slip, check_function_slips
from tinyllama.harness.comparison.fusions import FUSIONS, JUDGED_ON_REPLAY, fusion_effects, fusion_label, fusion_runs, timed_run, verdict  # noqa: F401
from tinyllama.timing import HOST_BOUND_SHARE

# An eager step whose host share is above this cannot show the fusions' effects of a few percent:
# the difference would be the host's (Python, dispatch, launches), not the GPU's. The same line as
# tinyllama.timing.host_verdict's, which also asks that the two runs' bands separate.
LAUNCH_BOUND_SHARE = HOST_BOUND_SHARE


def host_share(eager_ms: float, gpu_ms: float) -> float:
    """The share of an eager step the GPU's work does not account for: 1 - gpu_ms / eager_ms
    (``gpu_ms`` from the same step replayed from CUDA graphs, or the profiler's busy time)."""
    if eager_ms <= 0:
        raise ValueError(f"eager step time must be positive, got {eager_ms}")
    return 1.0 - gpu_ms / eager_ms


def launch_verdict(diagnose: Callable[[float, float], tuple[float, bool]], eager: Mapping[str, Any],
                   graphed: Mapping[str, Any]) -> tuple[float, float, float, str]:
    """The host share of an eager comparison row against its graph-replayed twin, read with ``diagnose``
    (exercise 12.4's ``(eager_ms, gpu_ms) -> (share, launch_bound)``) at the medians and at the ends of
    their 95% intervals. Returns ``(share, least, most, said)``: ``said`` is ``"launch-bound"`` where
    even the least share the intervals allow is above the line, ``"not launch-bound"`` where even the
    most is not, else ``"within noise of the line"``: a share near the line lands on either side of it
    from one run to the next, and no rerun would say otherwise."""
    share, _ = diagnose(eager["step_ms_median"], graphed["step_ms_median"])
    ends = (eager.get("step_ms_median_low", math.nan), eager.get("step_ms_median_high", math.nan),
            graphed.get("step_ms_median_low", math.nan), graphed.get("step_ms_median_high", math.nan))
    if not all(math.isfinite(end) for end in ends):  # an older record: its medians alone
        eager_low = eager_high = eager["step_ms_median"]
        graphed_low = graphed_high = graphed["step_ms_median"]
    else:
        eager_low, eager_high, graphed_low, graphed_high = ends
    least, least_bound = diagnose(eager_low, graphed_high)
    most, most_bound = diagnose(eager_high, graphed_low)
    said = "launch-bound" if least_bound else "not launch-bound" if not most_bound else "within noise of the line"
    return share, least, most, said


def setting_launch_verdict(saids: Sequence[str]) -> str:
    """One verdict for the eager steps of one precision from its runs' :func:`launch_verdict` words:
    ``"launch-bound"`` where every run is, ``"not launch-bound"`` where every run is not, else ``"at the
    line"``. A single run's share near the line lands on either side of it from one process to the next
    (the bf16 V2 runs' shares were 4.3-6.1% in two processes on one H200 machine, 2026-11-27), while the
    runs of one precision together stay on the line or clear of it."""
    if not saids:
        raise ValueError("no runs to judge")
    if all(said == "launch-bound" for said in saids):
        return "launch-bound"
    return "not launch-bound" if all(said == "not launch-bound" for said in saids) else "at the line"


# ------------------------------------------------------------------------------------------------
# Checks of the exercises
# ------------------------------------------------------------------------------------------------


def separate_qkv(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor):
    """The reference of exercise 12.1: V1's three projections."""
    return F.linear(x, wq), F.linear(x, wk), F.linear(x, wv)


def qkv_inputs(shape: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """``(x, wq, wk, wv)`` for a (batch, seq, hidden, heads, kv_heads) shape, in nn.Linear's layout."""
    batch, seq, hidden, heads, kv_heads = shape
    head_dim = hidden // heads
    scale = hidden ** -0.5
    return (torch.randn(batch, seq, hidden), torch.randn(heads * head_dim, hidden) * scale,
            torch.randn(kv_heads * head_dim, hidden) * scale, torch.randn(kv_heads * head_dim, hidden) * scale)


# (batch, seq, hidden, heads, kv_heads): grouped-query (kv_heads < heads), one K/V head, and plain multi-head.
# The check runs on the CPU in fp32, where the only difference to the reference is rounding.
QKV_SHAPES = ((2, 7, 48, 6, 2), (1, 13, 40, 10, 5), (3, 5, 30, 6, 1), (2, 3, 24, 4, 4))


def _fused(x: torch.Tensor, weights: Sequence[torch.Tensor], dim: int = 0) -> torch.Tensor:
    return x @ torch.cat(list(weights), dim=dim).T


QKV_SLIPS: tuple[Slip, ...] = (
    Slip("equal thirds", "q, k and v are cut into three equal parts: with grouped-query attention k and v are "
                         "narrower than q (kv_heads * head_dim columns each); cut at the row counts of wq, wk and wv",
         lambda x, wq, wk, wv: _fused(x, (wq, wk, wv)).chunk(3, dim=-1)),
    Slip("k and v swapped", "k and v come out swapped: the parts of the output follow the order in which the weights "
                            "are stacked",
         lambda x, wq, wk, wv: _fused(x, (wq, wv, wk)).split([wq.shape[0], wk.shape[0], wv.shape[0]], dim=-1)),
    Slip("not transposed", "the product uses the stacked weight as stored: an nn.Linear weight is (out_features, "
                           "in_features), so the output is x @ w.T (or F.linear(x, w))",
         lambda x, wq, wk, wv: (x @ torch.cat([wq, wk, wv], dim=0)).split([wq.shape[0], wk.shape[0], wv.shape[0]],
                                                                           dim=-1)),
    Slip("stacked along dim 1", "the weights are stacked along dim 1, their input features: stack along dim 0, the "
                                "output features (one row per output), so that the outputs come side by side",
         lambda x, wq, wk, wv: _fused(x, (wq, wk, wv), dim=1).split([wq.shape[0], wk.shape[0], wv.shape[0]], dim=-1)),
)


def check_fused_qkv(fused_qkv: Callable[..., Any]) -> bool:
    """Exercise 12.1: ``fused_qkv(x, wq, wk, wv)`` against three ``F.linear`` calls on fresh random inputs of
    :data:`QKV_SHAPES`; a typical mistake (:data:`QKV_SLIPS`) is named."""
    return check_function_slips("fused_qkv", fused_qkv, separate_qkv, qkv_inputs, shapes=list(QKV_SHAPES),
                                slips=QKV_SLIPS, atol=1e-5, rtol=1e-4,
                                hint="q must be (batch, seq, heads * head_dim) and k, v (batch, seq, kv_heads * "
                                     "head_dim)")


def gemm_count_hint(predicted: int, measured: int, num_layers: int, fuse_qkv: bool = False,
                    fuse_gate_up: bool = False) -> str:
    """The likely mistake behind a predicted GEMM count per training step that differs from the
    profiler's (empty when they agree); ``fuse_qkv``, ``fuse_gate_up``: the run's fusions."""
    if predicted == measured:
        return ""
    difference = measured - predicted
    if difference % 3 == 0 and (fuse_qkv != fuse_gate_up):
        per_forward = difference // 3
        if fuse_qkv and per_forward == -num_layers:
            return ("the QKV fusion turns three projections (q, k, v) into one: two fewer GEMMs per layer, not one "
                    "(x3 with the backward)")
        if fuse_gate_up and per_forward == num_layers:
            return ("the gate/up fusion turns two projections into one: one fewer GEMM per layer, not two "
                    "(x3 with the backward)")
    if measured and predicted * 3 == measured:
        return "your count is a third of the profiler's: the backward is missing (two products per forward product)"
    if measured and predicted * 3 == measured * 2:
        return "your count is two thirds of the profiler's: each forward product has two in the backward, not one"
    if measured and predicted * 2 == measured * 3:
        return ("your count is 1.5x the profiler's: a forward product needs two backward products (one "
                "gradient per operand), not three")
    difference = measured - predicted
    if difference % 3 == 0:
        per_forward = difference // 3
        if per_forward == num_layers * 2:
            return ("you are short by two forward products per layer (x3 with the backward): the attention "
                    "products q k^T and p v are matrix multiplies too")
        if per_forward == -num_layers * 2:
            return "you count two forward products per layer too many: did you forget what the fusion removes?"
        if per_forward == 1:
            return "you are short by one forward product (x3 with the backward): the output head (lm_head) is a GEMM"
        if per_forward == -1:
            return "you count one forward product too many per step"
        if per_forward % num_layers == 0:
            return (f"you are off by {abs(per_forward) // num_layers} forward product(s) per layer (x3 with the "
                    "backward): count the projections each fusion replaces, and the attention products")
    return "compare your forward count with the model's code, layer by layer, then triple it for forward + backward"


def check_gemm_prediction(predict: Callable[[int, bool, bool], tuple[int, int]], record: Mapping[str, Any],
                          labels: Sequence[str]) -> bool:
    """Exercise 12.2: ``predict(num_layers, fuse_qkv, fuse_gate_up) -> (forward, backward)`` GEMM
    launches per training step, against the profiler's count (``gemm_ops``) of each run in
    ``labels`` of a ``tinyllama.harness.compare`` record."""
    num_layers = int(record["config"]["num_layers"])
    lines, wrong = [], []
    for label in labels:
        row = timed_run(record, label)
        if row is None or row.get("gemm_ops") is None:
            lines.append(f"{label}: not counted (the run failed its check or was not profiled)")
            wrong.append(label)
            continue
        options = row.get("options") or {}
        fuse_qkv = bool(options.get("fuse_qkv", row["version"] != "v1"))
        fuse_gate_up = bool(options.get("fuse_gate_up", row["version"] != "v1"))
        forward, backward = predict(num_layers, fuse_qkv, fuse_gate_up)
        predicted, measured = int(forward) + int(backward), int(row["gemm_ops"])
        hint = gemm_count_hint(predicted, measured, num_layers, fuse_qkv, fuse_gate_up)
        lines.append(f"{label}: predicted {forward} + {backward} = {predicted}, profiler {measured}"
                     + (f" <- {hint}" if hint else ""))
        if hint:
            wrong.append(label)
    table = "\n  ".join(lines)
    return checkpoint(not wrong, f"your GEMM counts match the profiler's for every run:\n  {table}",
                      f"your GEMM counts differ from the profiler's for {len(wrong)} run(s):\n  {table}")


def check_strided_timing(gate: torch.Tensor, up: torch.Tensor, gate_packed: torch.Tensor, up_packed: torch.Tensor,
                         strided_ms: Any, packed_ms: Any, repeat: int) -> bool:
    """Exercise 12.3: the pairs timed hold the same numbers (``gate_packed``, ``up_packed``: contiguous copies
    of the chunked halves ``gate``, ``up``) and differ only in layout, and each timing is the list of
    ``repeat`` per-call times in ms that ``time_samples`` gives. Names the typical mistake (halves swapped,
    a copy that is no copy, one number or another count of samples) and prints the two ``PASS`` lines of a
    right answer."""
    for name, samples in (("strided_ms", strided_ms), ("packed_ms", packed_ms)):
        if not isinstance(samples, (list, tuple)):
            return checkpoint(False, "", f"{name} is a {type(samples).__name__}, not a list: keep the list of per-call "
                                         "times that time_samples returns (its median and spread are compared below)")
        if len(samples) != repeat:
            return checkpoint(False, "", f"{name} has {len(samples)} sample(s), not {repeat}: time with the profile's "
                                         "repeat count (repeat=profile.repeat), the same for both pairs")
        if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in samples):
            return checkpoint(False, "", f"{name} holds values that are not positive times in ms: {samples[:3]}...")
    expected = F.silu(gate) * up
    packed = F.silu(gate_packed) * up_packed
    if packed.shape == expected.shape and torch.allclose(packed.double(), (F.silu(up) * gate).double(), rtol=1e-2,
                                                         atol=1e-3) and not torch.allclose(
                                                             packed.double(), expected.double(), rtol=1e-2, atol=1e-3):
        return checkpoint(False, "", "the copies hold the halves swapped: gate_packed holds up's numbers and up_packed "
                                     "gate's; copy gate to gate_packed and up to up_packed")
    same_numbers = check_allclose("silu(gate) * up on the contiguous copies", packed, expected, rtol=1e-2, atol=1e-3,
                                  hint="the copies must hold the same numbers as the halves")
    if not same_numbers:
        return False
    for name, copy in (("gate_packed", gate_packed), ("up_packed", up_packed)):
        if not copy.is_contiguous():
            same = copy.data_ptr() == (gate if name == "gate_packed" else up).data_ptr()
            return checkpoint(False, "", f"{name} is not contiguous" + (": it is the chunked half itself, not a copy"
                                                                          if same else "")
                              + ". Make a contiguous copy (Tensor.contiguous()) outside the timed function, so the "
                                "two timed pairs differ only in layout")
    return checkpoint(not gate.is_contiguous() and gate_packed.is_contiguous() and up_packed.is_contiguous(),
                      "the timed pairs differ only in layout: chunked halves strided, copies contiguous",
                      "one of the timed pairs is not what it should be: the copies must be contiguous")


# (eager ms, GPU ms): a launch-bound step, a device-bound one, one in between, the H200's bf16 V2.
HOST_SHARE_CASES = ((100.0, 60.0), (250.0, 249.0), (40.0, 37.0), (58.8, 54.5))


def check_host_share(diagnose: Callable[[float, float], tuple[float, bool]],
                     threshold: float = LAUNCH_BOUND_SHARE) -> bool:
    """Exercise 12.4: ``diagnose(eager_ms, gpu_ms) -> (share, launch_bound)`` gives :func:`host_share`
    and says launch-bound exactly when the share is above ``threshold``, on a few cases (the feedback
    names the likely mistake)."""
    problems = []
    for eager, gpu in HOST_SHARE_CASES:
        expected = host_share(eager, gpu)
        answer = diagnose(eager, gpu)
        if not isinstance(answer, tuple) or len(answer) != 2:
            problems.append(f"eager {eager} ms, GPU {gpu} ms: returned {answer!r}; return a pair (share, launch_bound)")
            continue
        got, bound = float(answer[0]), bool(answer[1])
        if not math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9):
            if math.isclose(got, 100 * expected, rel_tol=1e-6):
                why = "a factor of 100: return a fraction (0.4), not a percentage"
            elif math.isclose(got, 1 - expected, rel_tol=1e-6):
                why = "that is the GPU's share of the step; the host's share is what is left of it"
            elif math.isclose(got, (eager - gpu) / gpu, rel_tol=1e-6):
                why = "divide by the eager step time (the whole step), not by the GPU time"
            elif math.isclose(got, -expected, rel_tol=1e-6):
                why = "the sign is reversed: the eager step is the longer one"
            else:
                why = "the host's share is the part of the eager step that the GPU time does not cover"
            problems.append(f"eager {eager} ms, GPU {gpu} ms: share {got:.4g}, expected {expected:.4g} ({why})")
        if bound != (expected > threshold):
            problems.append(f"eager {eager} ms, GPU {gpu} ms (host share {expected:.3f}): launch-bound {bound}, but "
                            f"the rule is share > {threshold} (the fusions' effects are a few percent)")
    cases = ", ".join(f"{e:g}/{g:g} ms" for e, g in HOST_SHARE_CASES)
    return checkpoint(not problems, f"the host share and the launch-bound decision follow the rule on eager/GPU "
                                    f"times {cases}",
                      "the host share or the decision is off:\n  - " + "\n  - ".join(problems))
