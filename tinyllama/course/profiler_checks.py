"""Checks of notebook 03's exercises (the PyTorch profiler on the inference benchmark), with feedback
that names the likely mistake:

- :func:`check_conv_share`: the convolutions' share of the step from the operator table (self time,
  operator rows only);
- :func:`check_category_ratios`: fp16 over fp32 time per kind of work, absent kinds NaN (never inf),
  and the kind that shrank most;
- :func:`check_conversion_share`: the layout-conversion kernels' share of a kernel table;
- :func:`check_amdahl`: the speed-up that removing a fraction of the time gives (the participant's
  formula run on made-up shares, then at the measured one);
- :func:`check_activation_mib`: the size of the first convolution's output.

And the readings the notebook prints from its measurements: :func:`profiler_overhead` (the same step
with and without the profiler), :func:`host_device_verdict` (host against device, from the unprofiled
timing of :func:`inference.launch.host_and_device_ms`, the function notebook 01 uses) and
:func:`allocations_summary` (which operators allocate, from the memory profile).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from inference.launch import LAUNCH_BOUND_RATIO, HostDevice
from tinyllama.course.checkpoints import check_close, check_equal, checkpoint
from tinyllama.profiling.timeline import is_layout_conversion, layout_conversion_share
from tinyllama.timing import Stats, verdict


def conv_share_reference(ops: pd.DataFrame, self_column: str) -> float:
    """The convolutions' share (%) of the operators' self time in ``ops`` (a ``ProfileRun.operators()`` table)."""
    operators = ops[ops["kind"] == "operator"]
    total = float(operators[self_column].sum())
    return 100.0 * float(operators.loc[operators["name"].str.contains("conv"), self_column].sum()) / total if total else 0.0


def _share(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole else math.nan


def conv_share_slips(ops: pd.DataFrame, self_column: str, total_column: str) -> list[tuple[float, str]]:
    """Typical wrong answers of exercise 03.1 computed on ``ops``: (the share a mistake gives, what it is)."""
    operators = ops[ops["kind"] == "operator"]
    conv = operators["name"].str.contains("conv")
    self_all, conv_self = float(operators[self_column].sum()), float(operators.loc[conv, self_column].sum())
    nested = int(conv.sum())
    slips = [(_share(float(operators.loc[conv, total_column].sum()), self_all),
              (f"a total time counts a convolution once in each of the {nested} nested conv operators (conv2d calls "
              "convolution calls _convolution calls the library's kernel): sum the self time")),
             (_share(float(operators.loc[conv, total_column].sum()), float(operators[total_column].sum())),
              ("total time over total time: a total counts the work of everything an operator calls, so nested "
              "operators count the same work several times, in the numerator and the denominator. Use the self time")),
             (_share(conv_self, self_all) / 100.0, "a fraction, not a percent: conv_share_pct is in percent (x 100)"),
             (_share(conv_self, float(ops[self_column].sum())),
              ("the denominator includes the ranges (kind 'annotation', such as ProfilerStep*): a range is not an "
              "operator, its time is the step's time again. Divide by the operator rows' self time only"))]
    names = sorted(set(operators.loc[conv, "name"]))
    if 1 < len(names) <= 6:  # every proper subset of the nested conv operators: one of them counted, not all
        for mask in range(1, 2 ** len(names) - 1):
            chosen = [name for bit, name in enumerate(names) if mask >> bit & 1]
            part = float(operators.loc[operators["name"].isin(chosen), self_column].sum())
            slips.append((_share(part, self_all), (f"that counts only {', '.join(chosen)}: a convolution's self time "
                                                  "lies in the innermost operator that runs the kernel, so take every "
                                                  "row whose name contains 'conv' (all nested conv operators)")))
    return slips


def check_conv_share(conv_share_pct: float, ops: pd.DataFrame, self_column: str, total_column: str) -> bool:
    """``conv_share_pct`` is the convolutions' share of the step's self time (within 1%). A wrong share is
    compared with :func:`conv_share_slips` on the same table and the mistake it matches is named."""
    expected = conv_share_reference(ops, self_column)
    if conv_share_pct is None or not math.isfinite(float(conv_share_pct)):
        return checkpoint(False, "", "conv_share_pct is not a number yet: compute it from the table `ops`")
    share = float(conv_share_pct)
    if math.isclose(share, expected, rel_tol=0.01):
        return check_close("the convolutions' share of the step (%)", share, expected, rel_tol=0.01)
    named = next((text for value, text in conv_share_slips(ops, self_column, total_column)
                  if math.isfinite(value) and math.isclose(share, value, rel_tol=1e-3)
                  and not math.isclose(value, expected, rel_tol=0.01)), None)
    if named is None and share > 100.0:
        named = ("a share above 100% counts some work twice: nested operators' total times overlap, sum the "
                 "self time")
    return check_close("the convolutions' share of the step (%)", share, expected, rel_tol=0.01,
                       hint=named or "divide the convolution rows' self time by the self time of every operator row "
                                     "(kind == 'operator': ranges such as ProfilerStep* span the whole step)")


def category_ratio_reference(both: pd.DataFrame) -> pd.Series:
    """fp16 / fp32 time per kind of work of ``both`` (columns ``fp32_ms``, ``fp16_ms``); NaN where either is 0."""
    return both["fp16_ms"].where(both["fp16_ms"] > 0) / both["fp32_ms"].where(both["fp32_ms"] > 0)


def check_category_ratios(ratio: pd.Series, shrank_most: str, both: pd.DataFrame) -> bool:
    """``ratio`` is fp16 / fp32 per kind of work with NaN for a kind absent from either run (no inf, no 0),
    and ``shrank_most`` the kind with the smallest ratio."""
    if ratio is None or shrank_most is None:
        return checkpoint(False, "", "ratio or shrank_most is still None: compute both")
    expected = category_ratio_reference(both)
    ratio = pd.Series(ratio, dtype="float64").reindex(expected.index)
    if np.isinf(ratio).any():
        bad = ", ".join(ratio.index[np.isinf(ratio)])
        return checkpoint(False, "", f"the ratio is inf for {bad}: that kind of work is absent from fp32 (0 ms) and "
                          "was divided by zero. An absent kind has no ratio: make it NaN before dividing")
    zero = (ratio == 0) & expected.isna()
    if zero.any():
        return checkpoint(False, "", f"the ratio is 0 for {', '.join(ratio.index[zero])}, absent from fp16: "
                          "absent is not 'infinitely faster', make it NaN")
    same = np.allclose(ratio.to_numpy(), expected.to_numpy(), rtol=1e-6, equal_nan=True)
    if not same:
        flipped = np.allclose(ratio.to_numpy(), 1.0 / expected.to_numpy(), rtol=1e-6, equal_nan=True)
        return checkpoint(False, "", "the ratio differs from fp16_ms / fp32_ms" +
                          (": it is upside down (fp32 over fp16)" if flipped else "") +
                          " (below 1: fp16 took less time)")
    checkpoint(True, "fp16 / fp32 per kind of work: absent kinds are NaN, no inf", "")
    return check_equal("the kind of work that shrank most", shrank_most, expected.idxmin(),
                       hint="shrank most = the smallest fp16 / fp32 ratio (not the largest, not the most ms saved)")


def conversion_share_slips(kernels: pd.DataFrame) -> list[tuple[float, str]]:
    """Typical wrong answers of exercise 03.3 computed on ``kernels``: (the share a mistake gives, what it is)."""
    names, times = kernels["kernel"].astype(str), kernels["total_ns"].astype(float)
    total = float(times.sum())
    chosen = names.map(is_layout_conversion)
    conversions = float(times[chosen].sum())
    slips = [(100.0 * conversions / total, "a fraction is wanted (0..1), not percent")]
    for one, other in (("nchwToNhwc", "nhwcToNchw"), ("nhwcToNchw", "nchwToNhwc")):
        part = float(times[names.str.contains(one, case=False)].sum())
        slips.append((part / total, (f"that counts only the {one} kernels: the library converts both ways, into NHWC "
                                    f"before a convolution and back after it ({other} too)")))
    mentions = names.str.contains("nhwc|nchw", case=False)
    slips.append((float(times[mentions].sum()) / total,
                  ("that counts every kernel whose name mentions a layout: a convolution that works on NHWC data "
                  "says so in its name without converting anything. Match the conversion kernels' own names "
                  "(nchwToNhwc, nhwcToNchw; batched_transpose on AMD)")))
    if "calls" in kernels:
        calls = kernels["calls"].astype(float)
        slips.append((float(calls[chosen].sum()) / float(calls.sum()) if calls.sum() else math.nan,
                      "that is the share of the launches (calls), not of the time: weight each kernel by total_ns"))
    if total > conversions:
        slips.append((conversions / (total - conversions),
                      "that is over the other kernels' time: divide by the whole table's time, conversions included"))
    slips.append((conversions / float(times.max()), ("that is over the largest kernel's time: divide by the whole "
                                                    "table's time (the sum of total_ns)")))
    return slips


def check_conversion_share(conversion_share: float, kernels: pd.DataFrame) -> bool:
    """``conversion_share`` is the fraction of ``kernels``' time in NCHW <-> NHWC conversion kernels. A wrong
    share is compared with :func:`conversion_share_slips` on the same table and the mistake it matches is named."""
    expected = layout_conversion_share(kernels)
    if conversion_share is None:
        return checkpoint(False, "", "conversion_share is still None: compute it from the kernel table")
    share = float(conversion_share)
    if math.isnan(expected):
        return checkpoint(math.isnan(share) or share == 0.0, "the table holds no time, so there is no share",
                          "the table holds no time: the share should be NaN or 0")
    hint = ("count both directions, NCHW to NHWC and back (cuDNN: nchwToNhwcKernel and nhwcToNchwKernel; MIOpen on "
            "AMD: batched_transpose kernels), over the whole table's time")
    if not math.isclose(share, expected, rel_tol=0.01, abs_tol=1e-9):
        named = next((text for value, text in conversion_share_slips(kernels)
                      if math.isfinite(value) and math.isclose(share, value, rel_tol=1e-3, abs_tol=1e-12)
                      and not math.isclose(value, expected, rel_tol=0.01, abs_tol=1e-9)), None)
        if named is not None and named.startswith("a fraction"):
            return checkpoint(False, "", f"conversion_share = {share:.3g}: {named}")
        hint = named or hint
    return check_close("the layout conversions' share of the device time", share, expected, rel_tol=0.01, abs_tol=1e-9,
                       hint=hint)


# Typical wrong speed-ups for removing a fraction of the time (exercise 03.4), each a function of the
# share, with what it is.
AMDAHL_SLIPS: tuple[tuple[Callable[[float], float], str], ...] = (
        (lambda s: 1.0 + s, ("1 + share is only the first term of 1 / (1 - share): the gain grows faster than the "
                            "share, because the time left shrinks too")),
        (lambda s: 1.0 - s, ("1 - share is the new time as a fraction of the old one: a speed-up is the old time over "
                            "the new, its inverse")),
        (lambda s: 1.0 / (1.0 + s), ("below 1, a slow-down: removing work cannot slow the step; the new time is "
                                    "(1 - share) of the old one, and the speed-up is old over new")),
        (lambda s: s / (1.0 - s), "that is the gain (speed-up - 1), not the speed-up: old time over new time"),
        (lambda s: 1.0 / s, ("1 / share divides by the conversions' share: the step keeps the time that is NOT "
                            "conversion, 1 - share")),
        (lambda s: 1.0 / (1.0 - 100.0 * s), "that treats the share as a percent: conversion_share is a fraction (0..1)"),
)

# Made-up shares on which the participant's formula is run: the measured share can be 0 (a CPU converts no
# layouts), where 1 + s, 1 - s and 1 / (1 + s) all give the right 1.0. At these shares every slip of
# AMDAHL_SLIPS gives its own values, none of them the answer's.
AMDAHL_SHARES: tuple[float, ...] = (0.1, 0.25, 0.6)

# Said when the formula gives one value whatever the share: it reads conversion_share (or a number), not share.
IGNORES_SHARE = ("it gives the same value for every share: the formula must use its argument `share`, not "
                 "conversion_share or a number")


def _amdahl_slip(values: list[float], shares: tuple[float, ...]) -> str | None:
    """The slip of :data:`AMDAHL_SLIPS` whose values at ``shares`` are ``values``, else :data:`IGNORES_SHARE`
    when the values do not change with the share; ``None`` when no typical mistake explains them."""
    for slip, text in AMDAHL_SLIPS:
        try:
            slipped = [slip(s) for s in shares]
        except ZeroDivisionError:
            continue
        if all(math.isclose(v, w, rel_tol=1e-6) for v, w in zip(values, slipped)):
            return text
    if len(set(values)) == 1:
        return IGNORES_SHARE
    return None


def check_amdahl(predicted_speedup: float, removed_share: float, formula: Callable[[float], float]) -> bool:
    """``formula(share)`` is 1 / (1 - share), the speed-up of a step without that fraction of its time, and
    ``predicted_speedup`` (the formula at the measured ``removed_share``) is its value there. The formula is
    run first on :data:`AMDAHL_SHARES` (the measured share may be 0, where several slips are right too); a
    wrong formula is compared with :data:`AMDAHL_SLIPS` at the same shares and the mistake it matches is
    named. Prints one ``PASS`` line, for the measured share."""
    if predicted_speedup is None:
        return checkpoint(False, "", "predicted_cl_speedup is still None: write the formula")
    hint = "the new time is (1 - share) of the old one, and a speed-up is old time over new time"
    try:
        values = [float(formula(share)) for share in AMDAHL_SHARES]
    except NotImplementedError:  # an exercise not written yet: its own message says what to do
        raise
    except Exception as error:  # noqa: BLE001 - the participant's formula failed: say so, keep it short
        return checkpoint(False, "", f"speedup_without failed at the shares {', '.join(map(str, AMDAHL_SHARES))}: "
                                     f"{type(error).__name__}: {error}. Write it as arithmetic on the number `share`")
    expected = [1.0 / (1.0 - share) for share in AMDAHL_SHARES]
    if not all(math.isclose(v, e, rel_tol=1e-3) for v, e in zip(values, expected)):
        shown = ", ".join(f"speedup_without({share:g}) = {v:.4g} (expected {e:.4g})"
                          for share, v, e in zip(AMDAHL_SHARES, values, expected))
        return checkpoint(False, "", f"{shown}: {_amdahl_slip(values, AMDAHL_SHARES) or hint}")
    expected_here = 1.0 / (1.0 - removed_share)
    return check_close("the predicted speed-up without the conversions", float(predicted_speedup), expected_here,
                       rel_tol=1e-3, hint=f"predicted_cl_speedup must be speedup_without(conversion_share): {hint}")


def check_activation_mib(first_conv_mib: float, sizes: pd.DataFrame) -> bool:
    """``first_conv_mib`` is the size of the first convolution's output, as the forward pass made it
    (``sizes``: :func:`tinyllama.profiling.memory.output_sizes`)."""
    if first_conv_mib is None:
        return checkpoint(False, "", "first_conv_mib is still None: count the bytes of the output")
    first = sizes.iloc[0]
    expected = float(first["mib"])
    ratio = float(first_conv_mib) / expected if expected else math.inf
    why = {2.0: "twice too large: fp16 stores 2 bytes an element, not 4", 0.5: "half the size: an fp16 element is 2 bytes",
           4.0: "4x too large: the stride 2 halves both the height and the width",
           2**20: "in bytes: divide by 2**20 for MiB"}
    hint = next((text for factor, text in why.items() if math.isclose(ratio, factor, rel_tol=1e-3)),
                f"the output is {tuple(first['shape'])} in {first['dtype']}")
    return check_close(f"the first convolution's output ({first['module']}) in MiB", float(first_conv_mib), expected,
                       rel_tol=1e-3, hint=hint)


def _band(numerator: Stats, denominator: Stats) -> tuple[float, float, float]:
    """The ratio of two medians and its band from the p10-p90 ranges: (low, ratio, high)."""
    return (numerator.p10 / denominator.p90, numerator.median / denominator.median, numerator.p90 / denominator.p10)


def profiler_overhead(unprofiled: HostDevice, profiled_host: Stats, profiled_device: Stats) -> tuple[pd.DataFrame, list[str]]:
    """The same step without the profiler (``unprofiled``, timed first in the process) and under it
    (``profiled_*``, the active steps of the profile): a table of both, and a sentence per side (host,
    device) that says "slower" only where the two p10-p90 bands are apart."""
    table = pd.DataFrame({
        "host ms to issue (median)": [unprofiled.host_ms.median, profiled_host.median],
        "host p10-p90": [f"{unprofiled.host_ms.p10:.3g}-{unprofiled.host_ms.p90:.3g}",
                         f"{profiled_host.p10:.3g}-{profiled_host.p90:.3g}"],
        "device ms (median)": [unprofiled.device_ms.median, profiled_device.median],
        "device p10-p90": [f"{unprofiled.device_ms.p10:.3g}-{unprofiled.device_ms.p90:.3g}",
                           f"{profiled_device.p10:.3g}-{profiled_device.p90:.3g}"],
        "steps": [unprofiled.host_ms.n, profiled_host.n],
    }, index=pd.Index(["without the profiler (timed first)", "under the profiler"], name="step"))
    sentences = []
    sides = [("the host's time to issue a step", unprofiled.host_ms, profiled_host)]
    if unprofiled.applies:
        sides.append(("the device's time per step", unprofiled.device_ms, profiled_device))
    for side, before, after in sides:
        low, ratio, high = _band(after, before)
        _, reading = verdict(before, after)  # "slower": the profiled band lies above the unprofiled one
        if reading == "slower":
            sentences.append(f"Under the profiler {side} is {ratio:.2f}x its unprofiled value (band {low:.2f}-"
                             f"{high:.2f}x): that much is the profiler's own cost.")
        elif reading == "faster":
            sentences.append(f"Under the profiler {side} is {ratio:.2f}x its unprofiled value (band {low:.2f}-"
                             f"{high:.2f}x), shorter: the device or the host was disturbed during one of the runs.")
        else:
            sentences.append(f"Under the profiler {side} is {ratio:.2f}x its unprofiled value (band {low:.2f}-"
                             f"{high:.2f}x): within noise.")
    if not unprofiled.applies:
        sentences.append("On a CPU the host computes the step, so its time to issue the step is the whole step.")
    return table, sentences


def host_device_verdict(evidence: HostDevice) -> str:
    """Whether the device waits for the host, from unprofiled host and device times of one step
    (:func:`inference.launch.host_and_device_ms`): launch-bound when the host's time is at least
    ``LAUNCH_BOUND_RATIO`` of the device's across the spreads, the device the limit when it is below it
    across the spreads, and "at the threshold" when the bands straddle it."""
    if not evidence.applies:
        return (f"On a CPU the host computes what it issues (host {evidence.host_ms.median:.3g} ms = the whole step): "
                "there is no device to wait for the host, and the test does not apply.")
    low, ratio, high = _band(evidence.host_ms, evidence.device_ms)
    figures = (f"without a profiler the host needs {evidence.host_ms.median:.3g} ms to issue a step, the device "
               f"{evidence.device_ms.median:.3g} ms to run it: host/device {ratio:.2f} (band {low:.2f}-{high:.2f})")
    if low >= LAUNCH_BOUND_RATIO:
        return f"Launch-bound: {figures}, at or above {LAUNCH_BOUND_RATIO:g}: the device waits for the host's launches."
    if high < LAUNCH_BOUND_RATIO:
        return f"The device is the limit: {figures}, below {LAUNCH_BOUND_RATIO:g}: the host runs ahead and queues work."
    return (f"At the threshold: {figures}, which straddles {LAUNCH_BOUND_RATIO:g}: the host takes nearly as long as "
            "the device, and a small change on either side (a faster kernel, a slower host) makes the step "
            "launch-bound.")


def allocations_summary(by_operator: pd.DataFrame) -> list[str]:
    """Sentences from ``timeline.allocations_by_operator`` (columns ``operator``, ``allocated_mib``,
    ``allocations``, ``largest_mib``): which operator allocates the most, each allocating operator's
    share, and whether any in-place operator (a name ending in ``_``) allocated."""
    if by_operator.empty:
        return ["The memory profile recorded no allocations in this step."]
    ranked = by_operator.sort_values("allocated_mib", ascending=False)
    total = float(ranked["allocated_mib"].sum())
    top = ranked.iloc[0]
    out = [(f"{top['operator']} allocates the most: {top['allocated_mib']:,.1f} MiB in {int(top['allocations'])} "
           f"allocations ({100 * top['allocated_mib'] / total:.0f}% of the {total:,.1f} MiB allocated in the step).")]
    for _, row in ranked.iloc[1:].iterrows():
        out.append(f"{row['operator']}: {row['allocated_mib']:,.1f} MiB in {int(row['allocations'])} allocations "
                   f"({100 * row['allocated_mib'] / total:.0f}%), the largest {row['largest_mib']:,.1f} MiB.")
    in_place = [name for name in ranked["operator"] if str(name).endswith("_")]
    out.append("In-place operators (a name ending in _) among them: " + (", ".join(in_place) if in_place else
               "none: the ReLUs and the residual additions write into their input and allocate nothing."))
    return out
