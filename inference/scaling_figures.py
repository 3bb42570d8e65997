"""The figures of a scaling study (notebook 05): efficiency per network, the all-reduce's bandwidth against the
buffer size, and a straggler's per-rank times. Each function draws into a new matplotlib figure and returns it;
every figure is titled with where its numbers come from (measured here, or the recorded device and date)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure


def efficiency_figure(table: pd.DataFrame, source: str) -> Figure:
    """Scaling efficiency (global throughput / (K x one GPU)) per network, one panel per mode, one bar per GPU
    count above one; networks in order of parameter count. ``table`` is :func:`inference.recorded.scaling_table`."""
    modes = [m for m in ("inference", "training") if m in set(table["mode"])]
    fig, axes = plt.subplots(1, len(modes), figsize=(5.5 * len(modes) + 1.5, 3.8), squeeze=False, sharey=True)
    counts = sorted(k for k in set(table["world_size"]) if k > 1)
    for ax, mode in zip(axes[0], modes):
        rows = table[table["mode"] == mode]
        networks = list(dict.fromkeys(rows.sort_values("params")["network"]))
        width = 0.8 / max(1, len(counts))
        for i, k in enumerate(counts):
            values = [rows[(rows["network"] == n) & (rows["world_size"] == k)]["efficiency"] for n in networks]
            heights = [float(v.iloc[0]) * 100 if len(v) else float("nan") for v in values]
            xs = [j + (i - (len(counts) - 1) / 2) * width for j in range(len(networks))]
            bars = ax.bar(xs, heights, width, label=f"{k} GPUs")
            ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax.axhline(100, color="black", lw=1, ls="--", label="ideal")
        params = rows.drop_duplicates("network").set_index("network")["params"]
        ax.set_xticks(range(len(networks)), [f"{n}\n{params[n] / 1e6:.0f} M params" for n in networks], fontsize=8)
        ax.set_ylabel("scaling efficiency (%)")
        ax.set_ylim(0, 115)
        ax.set_title(f"{mode}: efficiency per network", fontsize=10)
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: no bar hidden
    fig.suptitle(source, fontsize=9)
    fig.tight_layout()
    return fig


def allreduce_figure(sweeps: list[tuple[pd.DataFrame, str]]) -> Figure:
    """Bus bandwidth (GB/s) against the buffer size (MiB), log-log, one line per (sweep, label)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for frame, label in sweeps:
        for k, rows in frame.groupby("world_size"):
            ax.plot(rows["mib"], rows["busbw_gbs"], marker="o", label=f"{label}, {k} ranks")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("buffer size (MiB)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("all_reduce: bus bandwidth = size / time x 2 (n-1)/n", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def straggler_figure(tables: dict[str, pd.DataFrame], source: str) -> Figure:
    """Each rank's median time without and with the straggler, one panel per mode. ``tables`` maps a mode to
    the frame :meth:`inference.recorded.ScalingStudy.straggler` returns (or one built the same way)."""
    fig, axes = plt.subplots(1, len(tables), figsize=(5.2 * len(tables) + 2.5, 3.6), squeeze=False)
    for ax, (mode, frame) in zip(axes[0], tables.items()):
        xs = list(range(len(frame)))
        ax.bar([x - 0.2 for x in xs], frame["median_ms"], 0.4, label="no straggler")
        ax.bar([x + 0.2 for x in xs], frame["median_ms_straggler"], 0.4,
               label=f"rank {int(frame.loc[frame['delayed'], 'rank'].iloc[0])} delayed {frame.attrs.get('delay_ms', 0):.3g} ms")
        ax.set_xticks(xs, [f"rank {int(r)}" + (" (straggler)" if d else "") for r, d in zip(frame["rank"], frame["delayed"])])
        ax.set_ylabel("median time per iteration (ms)")
        ax.set_title(f"{mode}: each rank's time", fontsize=10)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(source, fontsize=9)
    fig.tight_layout()
    return fig
