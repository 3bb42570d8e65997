"""Roofline analysis: where each operator of a training step sits against the device's roofs.

The roofs are measured on this device (``tinyllama.costs.ceilings``: a large matmul per precision, a large
copy) and drawn next to the datasheet peaks (``tinyllama.device``). Each operator becomes a point:

FLOPs, bytes and device time per operator come from :mod:`tinyllama.profiling.attribution` (work and
time of the same calls; the fused kernels of a compiled model as points of their own).

A point beyond its roof is an attribution error, not a fast kernel: :func:`check_physical` finds them
among every point (a point with FLOPs against the roof at its intensity, one with bytes only against the
bandwidth), and :func:`plot_roofline` refuses to draw them. Points the roofline cannot place (bytes only,
or a fused kernel whose FLOPs would be a guess) go on a bandwidth chart (:func:`plot_bandwidth`);
:func:`placement_summary` says how much of the device time each chart shows.

From these: arithmetic intensity (FLOP/byte), achieved TFLOP/s, the roof that bounds it (memory or
compute), the attainable rate there, and the time above the roof: where the remaining time sits.
:func:`plot_roofline` draws V1 and a faster version on one log-log plot, so a participant sees which
operators moved.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd
import torch

from tinyllama import device as dev
from tinyllama.config import PRECISIONS  # the one definition, shared by every harness
from tinyllama.costs import ceilings
from tinyllama.profiling.attribution import UNATTRIBUTED, attribute, count_operator_work  # noqa: F401 (re-exported)
from tinyllama.profiling.torch_profiler import ProfileRun, categorize, profile_steps

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
    (``tinyllama.costs.ceilings``) and look up its datasheet peaks (``tinyllama.device``; none on a CPU)."""
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
# Points
# --------------------------------------------------------------------------------------------------


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


def on_roofline(points: pd.DataFrame) -> pd.Series:
    """Which points the roofline can place: FLOPs and bytes both known, and the FLOPs not guessed from a
    fused kernel's name (an Inductor kernel's FLOPs are Inductor's own count only for templates; for the
    rest they are one per element per operator its name lists, which would set its intensity by a guess:
    such kernels are read by their bytes, on the bandwidth chart, :func:`on_bandwidth_chart`)."""
    source = points.get("flop_source", pd.Series("", index=points.index)).astype(str)
    kind = points.get("kind", pd.Series("", index=points.index)).astype(str)
    guessed = (kind == "fused kernel") & source.str.startswith("estimate")
    return (points["flops"] > 0) & (points["bytes"] > 0) & (points["time_ms"] > 0) & ~guessed


def on_bandwidth_chart(points: pd.DataFrame) -> pd.Series:
    """The points with bytes and time that the roofline cannot place (no FLOPs, or a fused kernel's guessed
    FLOPs): their achieved bandwidth (bytes / time) against the bandwidth roof is what bounds them."""
    return (points["bytes"] > 0) & (points["time_ms"] > 0) & ~on_roofline(points)


# Why a point lands beyond its roof, by what it is: the likely mistakes of the accounting.
_WHY_BYTES = ("its bytes are over-counted (a view, an alias or an in-place write counted as traffic, a broadcast "
              "input counted in full) or its kernels' time went to another operator")
_WHY_WORK = ("its work belongs to more calls than its time (a kernel booked to another operator), or its bytes were "
             "read from a cache faster than the memory the roof was measured on (a few tens of percent at most)")


def check_physical(points: pd.DataFrame, roofs: Roofs, tolerance: float = ROOF_TOLERANCE, *,
                   strict: bool = False) -> pd.DataFrame:
    """Every point with time and work that runs faster than physics allows: its time is shorter than
    ``max(FLOPs / compute roof, bytes / bandwidth)`` by more than ``tolerance`` (a fraction: see
    :data:`ROOF_TOLERANCE`), so its FLOPs, bytes or time were attributed wrongly.

    - a point with FLOPs and bytes (:func:`on_roofline`) against the roof at its intensity:
      ``min(compute roof of its precision, bandwidth x intensity)``;
    - a point with bytes only, or a fused kernel whose FLOPs are a guess (:func:`on_bandwidth_chart`),
      against the bandwidth: ``time >= bytes / bandwidth``;
    - a point with FLOPs and no bytes against its compute roof.

    Each roof is the higher of the measured one and the datasheet's (where known): the measured roofs are
    what one benchmark reached, and a kernel may beat them (a read-mostly kernel beats a copy); the datasheet
    it cannot. Returns those rows, the worst first, with ``check`` (``roofline``, ``bandwidth`` or
    ``compute``), ``tflops`` and ``tbs`` achieved, ``attainable_tflops`` (NaN for a bandwidth check),
    ``roof_ratio`` (how many times faster than the roof allows) and ``why`` (the likely mistake); empty when
    every point is physically possible. ``strict`` raises :class:`AboveRoofError` naming them instead.

    Points with time but neither FLOPs nor bytes cannot be checked (nor placed)."""
    p = points.copy()
    p = p[(p["time_ms"] > 0) & ((p["flops"] > 0) | (p["bytes"] > 0))]
    columns = {"check": pd.Series(dtype=str), "tflops": pd.Series(dtype=float), "tbs": pd.Series(dtype=float),
               "intensity": pd.Series(dtype=float), "attainable_tflops": pd.Series(dtype=float),
               "roof_ratio": pd.Series(dtype=float), "why": pd.Series(dtype=str)}
    if p.empty:
        return p.assign(**columns)
    seconds = p["time_ms"] / 1e3
    placed, bandwidth = on_roofline(p), on_bandwidth_chart(p)
    p["check"] = ["roofline" if r else "bandwidth" if b else "compute" for r, b in zip(placed, bandwidth)]
    peaks = Roofs(roofs.device, {k: max(v, roofs.datasheet_tflops.get(k) or 0.0) for k, v in roofs.compute_tflops.items()},
                  max(roofs.bandwidth_tbs, roofs.datasheet_tbs or 0.0))
    compute = pd.Series(_compute_roofs(p, peaks), index=p.index)
    flops = p["flops"].where(p["check"] != "bandwidth", 0.0)  # a guessed FLOP count is not evidence
    least_s = pd.concat([flops / (compute * 1e12), p["bytes"] / (peaks.bandwidth_tbs * 1e12)], axis=1).max(axis=1)
    p["tflops"] = p["flops"] / seconds / 1e12
    p["tbs"] = p["bytes"] / seconds / 1e12
    p["intensity"] = (p["flops"] / p["bytes"].where(p["bytes"] > 0)).where(placed)
    p["attainable_tflops"] = pd.concat([compute, p["intensity"] * peaks.bandwidth_tbs], axis=1).min(axis=1).where(
        p["check"] != "bandwidth")
    p["roof_ratio"] = least_s / seconds
    p["why"] = [_WHY_BYTES if c == "bandwidth" else _WHY_WORK for c in p["check"]]
    above = p[p["roof_ratio"] > 1.0 + tolerance].sort_values("roof_ratio", ascending=False)
    if strict and len(above):
        raise AboveRoofError(f"{len(above)} point(s) above the roof by more than {tolerance:.0%}: "
                             + _describe(above))
    return above


def _describe(above: pd.DataFrame) -> str:
    label = above["label"] if "label" in above else pd.Series("", index=above.index)
    check = above["check"] if "check" in above else pd.Series("roofline", index=above.index)
    parts = []
    for lab, op, c, t, b, r, a in zip(label, above["operator"], check, above["tflops"], above["tbs"],
                                      above["roof_ratio"], above["attainable_tflops"]):
        rate = (f"{t:.3g} TFLOP/s, {r:.3g}x its roof {a:.3g}" if c != "bandwidth" else
                f"{b:.3g} TB/s, {r:.3g}x faster than the bandwidth allows")
        parts.append(f"{(lab + ': ') if lab else ''}{op} at {rate}")
    return "; ".join(parts)


PLACEMENTS = ("roofline", "bandwidth chart", "flagged: faster than its roof", "no work known")


def placement(points: pd.DataFrame, flagged: pd.DataFrame | None = None) -> pd.Series:
    """Where each point's time is shown: ``roofline`` (:func:`on_roofline`), ``bandwidth chart``
    (:func:`on_bandwidth_chart`), ``flagged: faster than its roof`` (rows of ``flagged``, the result of
    :func:`check_physical`: drawn nowhere) or ``no work known`` (time without FLOPs or bytes)."""
    where = pd.Series(PLACEMENTS[3], index=points.index)
    where[on_bandwidth_chart(points)] = PLACEMENTS[1]
    where[on_roofline(points)] = PLACEMENTS[0]
    if flagged is not None and len(flagged):
        where[where.index.isin(flagged.index)] = PLACEMENTS[2]
    return where


def placement_summary(points: pd.DataFrame, flagged: pd.DataFrame | None = None) -> pd.DataFrame:
    """Device time per step by :func:`placement`: ``time_ms`` and ``pct`` of the device time, and the same
    for the fused kernels of a compiled model alone (``fused_ms``, ``fused_pct`` of their time)."""
    where = placement(points, flagged)
    kind = points.get("kind", pd.Series("", index=points.index)).astype(str)
    fused = kind == "fused kernel"
    total, fused_total = points["time_ms"].sum(), points.loc[fused, "time_ms"].sum()
    rows = []
    for name in PLACEMENTS:
        ms, fused_ms = points.loc[where == name, "time_ms"].sum(), points.loc[(where == name) & fused, "time_ms"].sum()
        rows.append({"placement": name, "time_ms": ms, "pct": 100.0 * ms / total if total else 0.0,
                     "fused_ms": fused_ms, "fused_pct": 100.0 * fused_ms / fused_total if fused_total else float("nan")})
    return pd.DataFrame(rows)


def operator_points(work: pd.DataFrame, run: ProfileRun, roofs: Roofs, label: str = "",
                    by_shape: bool = False) -> pd.DataFrame:
    """The roofline points of one profiled step: :func:`tinyllama.profiling.attribution.attribute` (each
    operator's work and time, fused kernels as points of their own; with ``by_shape`` one point per operator
    and call signature, so that the layers of a network come apart) placed against ``roofs`` by
    :func:`classify`, labelled, the most time-consuming first."""
    points = classify(attribute(work, run, by_shape=by_shape), roofs)
    points.insert(0, "label", label)
    return points.sort_values("time_ms", ascending=False, ignore_index=True)


def roofline_points(
    step_fn: Callable[[], Any], roofs: Roofs, *, label: str = "", device: torch.device | str | None = None,
    warmup: int = 1, active: int = 3, count_fn: Callable[[], Any] | None = None, by_shape: bool = False,
) -> pd.DataFrame:
    """The roofline points of the operators of ``step_fn()``: one counting pass (FLOPs and bytes),
    then ``warmup`` + ``active`` profiled calls with their shapes (time); see :func:`operator_points`.

    For a ``torch.compile``-d model pass ``count_fn``, the same step of an uncompiled twin: compiled
    code does not run operator by operator, so the work of the operators it still calls (matmuls,
    attention, the uncompiled parts) is counted on the eager graph, per call signature, and its fused
    kernels are points of their own. Set ``torch._inductor.config.benchmark_kernel = True`` before
    compiling to have Inductor record each kernel's bytes (and a template's FLOPs) with its launch.

    ``by_shape``: one point per operator and shapes (a network's layers), see :func:`operator_points`.
    """
    device = dev.get_device(None if device is None else str(device))
    step_fn()  # warm: compilation, autotuning and lazy state must not be counted or timed
    dev.synchronize(device)
    work = count_operator_work(count_fn or step_fn)
    run = profile_steps(step_fn, device=device, wait=0, warmup=warmup, active=active, record_shapes=True)
    points = operator_points(work, run, roofs, label, by_shape=by_shape)
    kernels = run.kernels() if run.on_device else None
    # The step's device kernels, longest first (name, ms per step): which ones a vendor profiler should
    # read (:func:`top_kernels`). Plain tuples: pandas compares attrs when it concatenates frames.
    points.attrs["kernels"] = [] if kernels is None else [
        (str(k), float(ns) / 1e6 / max(run.steps, 1)) for k, ns in zip(kernels["kernel"], kernels["total_ns"])]
    return points


def top_kernels(points: pd.DataFrame, share: float = 0.8, limit: int = 6) -> tuple[list[str], float]:
    """The device kernels that take the time of the step that :func:`roofline_points` profiled: the
    longest first, until they hold ``share`` of the device time or ``limit`` of them are taken. Returns
    their names and the share of the device time they hold (0 where no kernels were recorded: a CPU)."""
    if not 0 < share <= 1 or limit < 1:
        raise ValueError("share must be in (0, 1] and limit at least 1")
    kernels = sorted(points.attrs.get("kernels", []), key=lambda k: -k[1])
    total = sum(ms for _, ms in kernels)
    names, held = [], 0.0
    for name, ms in kernels:
        if len(names) == limit or (total and held / total >= share):
            break
        names.append(name)
        held += ms
    return names, (held / total if total else 0.0)


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
    ax: Any = None, label_width: int = 30, guessed_fused: bool = True,
) -> Any:
    """A log-log roofline: measured roofs (solid) and datasheet peaks (dashed), each version's operators
    as points sized by their share of the step time, the ``top`` operators of each labelled, and arrows
    from the first version's operators to the same operators in the next one. Saved to ``path`` if
    given; returns the matplotlib figure. Points without FLOPs or bytes (copies, unmatched time) cannot
    be placed on these axes: the legend says how much time they hold.

    A roofline must be physically possible: points above their roof by more than ``tolerance``
    (:func:`check_physical`) are not drawn; an :class:`AboveRoofWarning` names them and the plot says
    how many were left out. ``strict`` raises :class:`AboveRoofError` instead.

    ``ax`` draws into those axes (a panel of a larger figure) instead of a new figure. Labels are moved
    apart until none overlaps another or the legend (:func:`overlapping_labels` lists any left); a label
    longer than ``label_width`` characters is cut. ``guessed_fused=False`` leaves out the fused kernels
    whose FLOPs are guessed from their name (:func:`on_roofline`; draw them with :func:`plot_bandwidth`),
    and the legend then says how much time is not on this chart."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np

    versions = dict(points) if isinstance(points, Mapping) else {
        str(label): frame for label, frame in points.groupby("label", sort=False)}
    if not versions:
        raise ValueError("no points to plot: pass the DataFrame of roofline_points() or a dict of them")
    placeable = {k: v[on_roofline(v) if not guessed_fused else (v["flops"] > 0) & (v["bytes"] > 0) & (v["time_ms"] > 0)]
                 for k, v in versions.items()}
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

    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 6.5))
    else:
        fig = ax.figure
    fixed, movable, markers = [], [], []  # roof labels stay; point labels may move; markers: (x, y, area in pt²)
    for i, precision in enumerate(precisions):
        roof = roofs.compute(precision)
        ax.plot(x, np.minimum(x * roofs.bandwidth_tbs, roof), color="black", lw=1.8 if i == len(precisions) - 1 else 1.0,
                label=f"measured {precision} matmul {_rate(roof, 'FLOP/s')}"
                      + ("" if i else f"; copy {_rate(roofs.bandwidth_tbs, 'B/s')}"))
        fixed.append(ax.annotate(precision, (hi, roof), textcoords="offset points", xytext=(-28, 3), fontsize=8))
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
        markers.append((frame["intensity"].to_numpy(), frame["tflops"].to_numpy(), (20 + 900 * share).to_numpy()))
        ax.scatter(frame["intensity"], frame["tflops"], s=20 + 900 * share, color=color, marker=marker, alpha=0.6,
                   edgecolor="black", linewidth=0.5,
                   label=f"{label}: {total:,.1f} ms/step ({100 * hidden / total if total else 0:.0f}% "
                         f"{'not placeable' if guessed_fused else 'not on this chart'}{dropped})")
        for _, row in frame.nlargest(top, "time_ms").iterrows():
            name = row["operator"].replace("aten::", "")
            short = name if len(name) <= label_width else name[: label_width - 3] + "..."
            movable.append(ax.annotate(short, (row["intensity"], row["tflops"]), fontsize=8, color=color,
                                       textcoords="offset points", xytext=(6, 4)))
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
    _separate_labels(fig, fixed, movable, legend, ax, markers)
    if path is not None:
        fig.savefig(path, dpi=130)
    return fig


def plot_bandwidth(points: Mapping[str, pd.DataFrame], roofs: Roofs, *, ax: Any = None, top: int = 8,
                   title: str = "", label_width: int = 34) -> Any:
    """The bandwidth chart beside the roofline: each version's points that the roofline cannot place
    (:func:`on_bandwidth_chart`: bytes only, or a fused kernel whose FLOPs would be a guess) as horizontal
    bars of their achieved bandwidth (bytes / time, TB/s, log scale), the ``top`` longest of each version,
    against the measured copy bandwidth (solid) and the datasheet's (dashed). A bar's label gives the
    point's time per step. Pass the points that :func:`check_physical` left (a point beyond the
    bandwidth is an accounting error, not a fast kernel). Returns the figure."""
    import matplotlib.pyplot as plt

    rows = []
    for (label, frame), (color, _) in zip(points.items(), _STYLES):
        chosen = frame[on_bandwidth_chart(frame)].nlargest(top, "time_ms")
        rows += [(label, color, r["operator"], r["bytes"] / (r["time_ms"] / 1e3) / 1e12, r["time_ms"])
                 for _, r in chosen.iterrows()]
    if ax is None:
        fig, ax = plt.subplots(figsize=(8, 0.9 + 0.32 * max(len(rows), 1)))
    else:
        fig = ax.figure
    if not rows:
        ax.text(0.5, 0.5, "no bytes-only or fused kernels to show", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    names = [f"{lab}: {op.replace('aten::', '')}" for lab, _, op, _, _ in rows]
    names = [n if len(n) <= label_width else n[: label_width - 3] + "..." for n in names]
    y = list(range(len(rows)))[::-1]
    ax.barh(y, [r[3] for r in rows], color=[r[1] for r in rows], alpha=0.7, edgecolor="black", linewidth=0.5)
    ax.set_yticks(y, names, fontsize=7)
    ax.axvline(roofs.bandwidth_tbs, color="black", lw=1.5, label=f"measured copy {_rate(roofs.bandwidth_tbs, 'B/s')}")
    if roofs.datasheet_tbs:
        ax.axvline(roofs.datasheet_tbs, color="gray", ls="--", lw=1.0, label=f"datasheet {_rate(roofs.datasheet_tbs, 'B/s')}")
    for yi, r in zip(y, rows):
        ax.annotate(f"{r[4]:.3g} ms", (r[3], yi), textcoords="offset points", xytext=(3, -3), fontsize=7)
    rates = [r[3] for r in rows] + [roofs.bandwidth_tbs]
    ax.set_xscale("log")
    ax.set_xlim(min(rates) / 3, max(rates + [roofs.datasheet_tbs or 0.0]) * 6)
    ax.set_xlabel("achieved bandwidth (TB/s, bytes read + written / time)")
    ax.set_title(title or f"Bytes-only and fused kernels against the bandwidth of {roofs.device}", fontsize=9)
    ax.grid(axis="x", which="both", alpha=0.25)
    # Outside the axes, to the right: inside, a bar ending at the bottom right would run its label into it.
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return fig


# Where a point's label may go, in points from the point (tried in this order): right, then left of it,
# then further up and down.
_LABEL_OFFSETS = [(6, 4), (6, -11), (-6, 4), (-6, -11), (6, 15), (6, -22), (-6, 15), (-6, -22), (6, 26), (6, -33),
                  (-6, 26), (-6, -33), (6, 37), (6, -44), (-6, 37), (-6, -44)]


def _separate_labels(fig: Any, fixed: list[Any], movable: list[Any], legend: Any, ax: Any = None,
                     markers: Sequence[tuple[Any, Any, Any]] = ()) -> None:
    """Place each point label at the first offset of :data:`_LABEL_OFFSETS` where it stays inside the axes
    and overlaps no label placed before it, no roof label, no large marker other than its own point's, and
    not the legend; a label with no free place is left out (its point stays, and the tables name it)."""
    from matplotlib.transforms import Bbox

    renderer = _renderer(fig)
    taken = [t.get_window_extent(renderer).expanded(1.02, 1.1) for t in fixed]
    if legend is not None:
        taken.append(legend.get_window_extent(renderer))
    blobs = []  # the markers' boxes in display units, with their centres (a label may touch its own point)
    if ax is not None:
        for xs, ys, areas in markers:
            for x, y, area in zip(xs, ys, areas):
                cx, cy = ax.transData.transform((x, y))
                r = 0.5 * (float(area) ** 0.5) * fig.dpi / 72.0
                if area > 60:  # small markers hide nothing a label needs
                    blobs.append(((x, y), Bbox.from_extents(cx - r, cy - r, cx + r, cy + r)))
    frame = ax.get_window_extent(renderer) if ax is not None else None  # a label must not leave the axes

    def inside(box: Any) -> bool:
        return frame is None or (box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0 and box.y1 <= frame.y1)

    for label in movable:
        own = tuple(label.xy)
        obstacles = taken + [box for centre, box in blobs if not _same_point(centre, own)]
        for dx, dy in _LABEL_OFFSETS:
            label.set_position((dx, dy))  # the offset, in points, of an annotation's text
            label.set_horizontalalignment("left" if dx > 0 else "right")
            box = label.get_window_extent(renderer).expanded(1.02, 1.1)
            if inside(box) and not any(box.overlaps(other) for other in obstacles):
                taken.append(box)
                break
        else:
            label.set_visible(False)


def _same_point(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return abs(a[0] - b[0]) <= 1e-12 * max(abs(a[0]), 1.0) and abs(a[1] - b[1]) <= 1e-12 * max(abs(a[1]), 1.0)


def _renderer(fig: Any) -> Any:
    """The renderer that sizes ``fig``'s texts, whatever canvas the figure has (Jupyter's inline backend
    gives it a plain one until it is shown)."""
    if hasattr(fig.canvas, "get_renderer"):
        return fig.canvas.get_renderer()
    from matplotlib.backend_bases import _get_renderer  # a renderer of the figure's own size and dpi

    return _get_renderer(fig)


def overlapping_labels(fig: Any) -> list[tuple[str, str]]:
    """Pairs of visible texts of ``fig``'s axes (point and roof labels, the legend as one box) whose boxes
    overlap: empty for a readable plot."""
    renderer = _renderer(fig)
    pairs = []
    for ax in fig.axes:
        boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts if t.get_visible() and t.get_text()]
        legend = ax.get_legend()
        if legend is not None:
            boxes.append(("(legend)", legend.get_window_extent(renderer)))
        for i, (a, box_a) in enumerate(boxes):
            pairs += [(a, b) for b, box_b in boxes[i + 1:] if box_a.overlaps(box_b)]
    return pairs


def _rate(tera: float, unit: str) -> str:
    """A rate given in tera-units, with a prefix that suits it: 0.0021 TFLOP/s -> '2.1 GFLOP/s'."""
    for factor, prefix in ((1.0, "T"), (1e-3, "G"), (1e-6, "M")):
        if tera >= factor:
            return f"{tera / factor:,.3g} {prefix}{unit}"
    return f"{tera / 1e-9:,.3g} k{unit}"
