"""The figures of notebook 10 (the TinyLLaMA baseline), and the comparison sentences printed beside them.

- :func:`plot_phases`: forward, backward and optimizer of one step, medians with p10-p90 bars;
- :func:`precision_verdicts` / :func:`plot_precisions`: the step time of each precision with its p10-p90
  band, each judged against the reference by :func:`tinyllama.timing.verdict` (both runs' bands);
- :func:`plot_activation_sweeps`: saved activations and the device's peak over the batch and sequence
  sweeps; the sequence panel is log-log with slope-1 and slope-2 guides and the fitted slope.

Each function returns the matplotlib figure; the notebook shows it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import pandas as pd

from tinyllama.course.baseline_memory import PEAK_COLUMN, loglog_slope
from tinyllama.timing import Band, Stats, verdict

SLOPE_GUIDES = (1, 2)


def _pyplot() -> Any:
    import matplotlib.pyplot as plt

    return plt


def _band(stats: Stats | Band) -> tuple[float, float, float]:
    return stats.median, stats.p10, stats.p90


def plot_phases(phases: Mapping[str, Stats | Band], title: str) -> Any:
    """Horizontal bars of each phase's median time per step (ms) with p10-p90 error bars."""
    if not phases:
        raise ValueError("no phases to plot")
    plt = _pyplot()
    bands = [_band(s) for s in phases.values()]
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    colors = ["tab:blue", "tab:red", "tab:gray", "tab:green"][:len(bands)]
    ax.barh(list(phases), [m for m, _, _ in bands], xerr=[[m - lo for m, lo, _ in bands], [hi - m for m, _, hi in bands]],
            color=colors, capsize=4)
    ax.set_xlabel("time per step (ms), median with p10-p90")
    ax.set_title(title)
    ax.invert_yaxis()
    fig.tight_layout()
    return fig


def precision_verdicts(steps: Mapping[str, Stats | Band], reference: str = "fp32") -> dict[str, tuple[float, str]]:
    """For every precision but ``reference``: (speed-up, verdict) of its step against the reference's,
    from :func:`tinyllama.timing.verdict` (``"faster"``, ``"slower"`` or ``"within noise"``)."""
    if reference not in steps:
        raise ValueError(f"the reference {reference!r} is not among the runs ({', '.join(steps)})")
    return {name: verdict(steps[reference], stats) for name, stats in steps.items() if name != reference}


def describe_precisions(steps: Mapping[str, Stats | Band], reference: str = "fp32",
                        same_arithmetic: Collection[str] = ()) -> list[str]:
    """One sentence per precision: median and p10-p90 of both runs, the speed-up and the verdict. A name in
    ``same_arithmetic`` ran the reference's arithmetic (its loss equal bit for bit): the sentence says that
    any difference is the machine's drift between the two runs, not the precision."""
    ref = steps[reference]
    lines = []
    for name, (ratio, said) in precision_verdicts(steps, reference).items():
        run = steps[name]
        line = (f"{name} against {reference}: {run.median:.4g} ms (p10-p90 {run.p10:.4g}-{run.p90:.4g}) against "
                f"{ref.median:.4g} ms ({ref.p10:.4g}-{ref.p90:.4g}): {ratio:.2f}x, "
                + ("faster: its whole band lies below the reference's" if said == "faster" else
                   "slower: its whole band lies above the reference's" if said == "slower" else
                   "within noise: the two p10-p90 bands overlap"))
        if name in same_arithmetic:
            line += (f"; but it ran {reference}'s arithmetic (the same loss bit for bit), so "
                     + ("the two bands agree, as they should" if said == "within noise" else
                        "this difference is the machine drifting between the two runs, not the precision"))
        lines.append(line)
    return lines


def plot_precisions(steps: Mapping[str, Stats | Band], title: str, reference: str = "fp32",
                    same_arithmetic: Collection[str] = ()) -> Any:
    """Bars of each precision's median step time (ms) with p10-p90 error bars, each labelled with its
    speed-up over ``reference`` and the verdict of :func:`precision_verdicts` (and "same arithmetic" for a
    name in ``same_arithmetic``, which ran the reference's arithmetic)."""
    plt = _pyplot()
    verdicts = precision_verdicts(steps, reference)
    names = list(steps)
    bands = [_band(steps[n]) for n in names]
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:red"]
    ax.bar(names, [m for m, _, _ in bands], yerr=[[m - lo for m, lo, _ in bands], [hi - m for m, _, hi in bands]],
           color=[colors[i % len(colors)] for i in range(len(names))], capsize=6, ecolor="black")
    for i, (name, (_, _, hi)) in enumerate(zip(names, bands)):
        label = "reference" if name == reference else f"{verdicts[name][0]:.2f}x, {verdicts[name][1]}"
        if name in same_arithmetic:
            label += f"\n(same arithmetic as {reference})"
        ax.annotate(label, (i, hi), xytext=(0, 4), textcoords="offset points", ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("step time (ms), median with p10-p90")
    ax.set_xlabel("precision")
    ax.set_title(title)
    ax.margins(y=0.18)
    fig.tight_layout()
    return fig


def slope_guide(x: pd.Series, anchor: float, slope: float) -> list[float]:
    """y values of a line of ``slope`` on log-log axes through (``x[0]``, ``anchor``)."""
    x0 = float(x.iloc[0])
    return [anchor * (float(v) / x0) ** slope for v in x]


def plot_activation_sweeps(by_batch: pd.DataFrame, by_seq: pd.DataFrame, title: str, seq_len: int,
                           seq_batch: int) -> Any:
    """Two panels: memory against the batch (linear axes) and against the sequence length (log-log, with
    dotted guides of slope 1 and 2 through the first measured point and the fitted slope in the legend).
    Each shows your formula (line), the saved activations and, where measured, the peak above held."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11.5, 4.4))
    for ax, frame, key, label in ((left, by_batch, "batch", f"batch size (seq {seq_len})"),
                                  (right, by_seq, "seq", f"sequence length (batch {seq_batch})")):
        ax.plot(frame[key], frame["predicted MiB"], "-", color="tab:gray", label="your formula (saved activations)")
        ax.plot(frame[key], frame["saved MiB"], "o", color="tab:blue", label="measured: saved for backward")
        if frame[PEAK_COLUMN].notna().all():
            ax.plot(frame[key], frame[PEAK_COLUMN], "s", color="tab:red", mfc="none",
                    label="measured: peak above held")
        ax.set_xlabel(label)
        ax.set_ylabel("memory (MiB)")
        ax.grid(alpha=0.3)
    slope = loglog_slope(by_seq["seq"], by_seq["saved MiB"])
    anchor = float(by_seq["saved MiB"].iloc[0])
    for guide, style in zip(SLOPE_GUIDES, (":", "--")):
        right.plot(by_seq["seq"], slope_guide(by_seq["seq"], anchor, guide), style, color="black", alpha=0.6,
                   label=f"slope {guide} ({'linear' if guide == 1 else 'quadratic'} in S)")
    left.set_title("batch sweep: linear in the batch")
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xticks(list(by_seq["seq"]), [str(int(v)) for v in by_seq["seq"]])
    right.xaxis.set_minor_locator(_pyplot().NullLocator())  # only the measured lengths are labelled
    right.set_title(f"sequence sweep (log-log): fitted slope {slope:.2f}")
    left.legend(fontsize=8)
    right.legend(fontsize=8, loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
