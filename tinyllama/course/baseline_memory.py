"""The memory arithmetic notebook 10 prints beside its sweeps, from the run's numbers and the model's shapes.

- :func:`loglog_slope`: the least-squares slope of ``log y`` against ``log x`` (1: linear, 2: quadratic);
- :func:`sequence_terms`: at each sequence length, the share of V1's saved activations (and of its FLOPs)
  that grows with ``S^2``, and the log-log slope that share implies, ``1 + share``: a sum ``a S + b S^2``
  has slope 1 where the linear term dominates and 2 only where the square does;
- :func:`peak_versus_saved` and :func:`describe_peak_growth`: the device's peak above what was held
  against the saved activations, point by point, and how each grows over a sweep;
- :func:`training_fit`: whether a preset's training state and activations fit a memory budget.

The saved activations from the shapes come from :mod:`tinyllama.costs.memory_estimate` (V1's layout: the
attention's math path, separate projections), which matches what autograd saves for V1 in fp32.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from tinyllama.config import ModelConfig
from tinyllama.costs import flops
from tinyllama.costs.memory_estimate import FP32, Layout, estimate_memory

MIB = 2**20
GIB = 2**30

# V1 as the memory estimate sees it: scores and softmax written out, three projections, K/V repeated.
V1_LAYOUT = Layout(attention="math", fused_qkv=False, fused_gate_up=False, native_gqa=True)

# Memory is counted, not timed: two growth factors within this ratio of each other grow "about as fast".
SAME_GROWTH = 0.05

PEAK_COLUMN = "GPU peak above held MiB"
LAYER_SQUARE = "one layer's S x S MiB"


def loglog_slope(x: Sequence[float], y: Sequence[float]) -> float:
    """The least-squares slope of ``log y`` against ``log x``: the exponent ``p`` of ``y ~ x^p``."""
    xs, ys = [float(v) for v in x], [float(v) for v in y]
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"a slope needs at least two (x, y) points of equal count (got {len(xs)} and {len(ys)})")
    if min(xs + ys) <= 0 or not all(math.isfinite(v) for v in xs + ys):
        raise ValueError("a log-log slope needs positive, finite x and y")
    lx, ly = [math.log(v) for v in xs], [math.log(v) for v in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    spread = sum((v - mx) ** 2 for v in lx)
    if spread == 0:
        raise ValueError("a slope needs at least two different x values")
    return sum((u - mx) * (v - my) for u, v in zip(lx, ly)) / spread


def saved_bytes(config: ModelConfig, batch: int, seq: int) -> int:
    """Bytes V1 saves for the backward in fp32, from the shapes (:mod:`tinyllama.costs.memory_estimate`)."""
    return estimate_memory(config, batch, seq, "fp32", V1_LAYOUT).activations


def square_bytes(config: ModelConfig, batch: int, seq: int) -> int:
    """The part of V1's saved activations that grows with ``S^2``: in every layer the fp32 softmax output
    (``B x heads x S x S``, 4 bytes each) and the boolean causal mask (``S x S``, 1 byte each)."""
    return config.num_layers * (batch * config.num_heads * seq * seq * FP32 + seq * seq)


def square_flops_share(config: ModelConfig, seq: int) -> float:
    """The share of V1's training FLOPs in attention's two ``S x S`` products (``q k^T``, ``probs v``)."""
    total = flops.forward_flops(config, 1, seq)
    return (total - 2 * flops.matmul_parameters(config) * seq) / total


def sequence_terms(config: ModelConfig, batch: int, seqs: Sequence[int]) -> pd.DataFrame:
    """One row per sequence length: the saved activations from the shapes (MiB), the ``S^2`` part of them,
    its share, the local log-log slope ``1 + share`` (of ``a S + b S^2``) and the ``S^2`` share of the FLOPs."""
    rows = []
    for seq in seqs:
        total, square = saved_bytes(config, batch, seq), square_bytes(config, batch, seq)
        rows.append({"seq": int(seq), "saved MiB (shapes)": total / MIB, "S^2 part MiB": square / MIB,
                     "S^2 share of saved": square / total, "local log-log slope": 1 + square / total,
                     "S^2 share of FLOPs": square_flops_share(config, seq)})
    return pd.DataFrame(rows)


def describe_sequence_slope(measured_slope: float, terms: pd.DataFrame, crossover: float | None = None) -> str:
    """Why the saved activations' log-log slope over a sequence sweep is what it is: the ``S^2`` share at
    both ends of the sweep and the slope it implies there (``terms`` from :func:`sequence_terms`)."""
    first, last = terms.iloc[0], terms.iloc[-1]
    kind = ("close to linear" if measured_slope < 1.25 else "close to quadratic" if measured_slope > 1.75
            else "between linear and quadratic")
    text = (f"Fitted log-log slope of the saved activations over the sequence sweep: {measured_slope:.2f} "
            f"(1 = linear, 2 = quadratic): {kind} at these sizes. From the model's shapes, the S^2 term (every "
            f"layer's softmax output) is {first['S^2 share of saved']:.1%} of the saved bytes at seq "
            f"{int(first['seq'])} and {last['S^2 share of saved']:.1%} at seq {int(last['seq'])}, so the local "
            f"slope, 1 + that share, goes from {first['local log-log slope']:.2f} to {last['local log-log slope']:.2f}. "
            "Per token and layer the linear terms keep 10 x hidden + 4 x intermediate values, the S^2 term "
            "heads x S: the slope approaches 2 only where heads x S outgrows them")
    if crossover is not None and math.isfinite(crossover):
        text += f" (the fit above puts that point at seq {crossover:,.0f})"
    return (text + f". Attention's S^2 products are {first['S^2 share of FLOPs']:.1%} of the FLOPs at seq "
            f"{int(first['seq'])} and {last['S^2 share of FLOPs']:.1%} at seq {int(last['seq'])}.")


def peak_versus_saved(by_batch: pd.DataFrame, by_seq: pd.DataFrame, config: ModelConfig) -> pd.DataFrame:
    """Both sweeps' points with the peak above held against the saved activations: their ratio, the
    excess (peak - saved) and one layer's ``B x heads x S x S`` fp32 tensor, the size of each gradient the
    attention's backward holds at once (of the probabilities, of the scores). No peak (a CPU): NaN."""
    rows = []
    for sweep, frame in (("batch", by_batch), ("seq", by_seq)):
        for _, point in frame.iterrows():
            saved = float(point["saved MiB"])
            peak = point.get(PEAK_COLUMN)
            peak = math.nan if peak is None or pd.isna(peak) else float(peak)
            rows.append({"sweep": sweep, "batch": int(point["batch"]), "seq": int(point["seq"]), "saved MiB": saved,
                         "peak MiB": peak, "peak / saved": peak / saved, "excess MiB": peak - saved,
                         LAYER_SQUARE: point["batch"] * config.num_heads * point["seq"] ** 2 * FP32 / MIB})
    return pd.DataFrame(rows)


def growth_verdict(peak_growth: float, saved_growth: float, tolerance: float = SAME_GROWTH) -> str:
    """``"faster"``, ``"more slowly"`` or ``"about as fast"``: the peak's growth against the saved
    activations', alike within ``tolerance`` (a ratio)."""
    ratio = peak_growth / saved_growth
    if ratio > 1 + tolerance:
        return "faster"
    if ratio < 1 - tolerance:
        return "more slowly"
    return "about as fast"


def describe_peak_growth(table: pd.DataFrame) -> list[str]:
    """One sentence per sweep of :func:`peak_versus_saved`'s table: how much the saved activations and
    the peak grow from the first point to the last, the verdict, and where the excess is largest; on a
    device without a peak, one sentence that says so."""
    if table["peak MiB"].isna().any():
        return ["No device peak on this device (a CPU keeps no allocator statistics): the peak against the "
                "saved activations is measured on a GPU."]
    lines = []
    for sweep, frame in table.groupby("sweep", sort=False):
        first, last = frame.iloc[0], frame.iloc[-1]
        saved_growth = last["saved MiB"] / first["saved MiB"]
        peak_growth = last["peak MiB"] / first["peak MiB"]
        widest = frame.loc[frame["peak / saved"].idxmax()]
        before = frame.iloc[-2] if len(frame) > 1 else first
        step = (f"from {sweep} {int(before[sweep])} to {int(last[sweep])} the excess goes "
                f"{before['excess MiB']:,.0f} -> {last['excess MiB']:,.0f} MiB, one layer's S x S tensor "
                f"{before[LAYER_SQUARE]:,.0f} -> {last[LAYER_SQUARE]:,.0f} MiB")
        lines.append(f"{sweep} sweep: saved activations x{saved_growth:.2f}, peak x{peak_growth:.2f}: the peak grows "
                     f"{growth_verdict(peak_growth, saved_growth)} (within {SAME_GROWTH:.0%} counts as about as fast); "
                     f"peak / saved stays between {frame['peak / saved'].min():.3f} and {frame['peak / saved'].max():.3f}, "
                     f"highest at {sweep} {int(widest[sweep])}; {step}.")
    return lines


@dataclass(frozen=True)
class TrainingFit:
    """Training state and activations of one configuration against a memory budget (bytes)."""

    name: str
    parameters: int
    batch: int
    seq: int
    state_bytes: int
    activation_bytes: float
    peak_factor: float | None  # measured peak / saved activations; None: not measured (the activations alone)
    budget_bytes: float

    @property
    def total_bytes(self) -> float:
        """Training state plus the activations times the peak factor (1 where none was measured)."""
        return self.state_bytes + self.activation_bytes * (self.peak_factor or 1.0)

    @property
    def fits(self) -> bool:
        """Whether the total stays within the budget."""
        return self.total_bytes <= self.budget_bytes

    @property
    def largest_batch(self) -> int:
        """The largest batch at this sequence length the budget holds by the same arithmetic (0: none)."""
        per_sequence = self.activation_bytes * (self.peak_factor or 1.0) / self.batch
        return max(0, int((self.budget_bytes - self.state_bytes) // per_sequence))

    def describe(self) -> str:
        """The arithmetic in one paragraph, every figure printed from the fields."""
        factor = (f" x {self.peak_factor:.3f} (the peak / saved factor measured in the sweep)" if self.peak_factor
                  else " (no device peak measured here: the saved activations alone)")
        verdict = (f"fits in {self.budget_bytes / 1e9:.0f} GB ({self.budget_bytes / GIB:.1f} GiB) with "
                   f"{(self.budget_bytes - self.total_bytes) / GIB:.1f} GiB to spare" if self.fits else
                   f"does not fit in {self.budget_bytes / 1e9:.0f} GB ({self.budget_bytes / GIB:.1f} GiB): "
                   f"{(self.total_bytes - self.budget_bytes) / GIB:.1f} GiB too much")
        return (f"{self.name} preset ({self.parameters:,} parameters) at batch {self.batch} x seq {self.seq}: "
                f"training state {self.state_bytes / GIB:.1f} GiB (16 bytes per parameter) + saved activations "
                f"{self.activation_bytes / GIB:.1f} GiB (your formula){factor} = {self.total_bytes / GIB:.1f} GiB: "
                f"it {verdict}. The same arithmetic allows batch {self.largest_batch} at seq {self.seq}; the "
                f"activations are {self.activation_bytes / self.state_bytes:.1f}x the training state.")


def training_fit(name: str, config: ModelConfig, batch: int, seq: int,
                 activation_bytes: Callable[[ModelConfig, int, int], float], peak_factor: float | None,
                 budget_bytes: float = 80e9) -> TrainingFit:
    """:class:`TrainingFit` of ``config`` at ``batch x seq`` in fp32 with AdamW: 16 bytes per parameter of
    state, ``activation_bytes(config, batch, seq)`` of saved activations times ``peak_factor``."""
    if batch < 1 or seq < 1 or budget_bytes <= 0:
        raise ValueError(f"batch, seq and budget must be positive (got {batch}, {seq}, {budget_bytes})")
    if peak_factor is not None and not (math.isfinite(peak_factor) and peak_factor > 0):
        raise ValueError(f"peak_factor must be a positive number or None (got {peak_factor!r})")
    parameters = config.num_parameters()
    return TrainingFit(name, parameters, batch, seq, 16 * parameters, float(activation_bytes(config, batch, seq)),
                       None if peak_factor is None else float(peak_factor), float(budget_bytes))
