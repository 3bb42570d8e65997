"""The record of one comparison (plain JSON-able data: device, date, environment, every run) and
its presentations: the table, the text, the plot, and the JSON and CSV files it appends to."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinyllama.harness.cli import wide_tables
from tinyllama.harness.comparison.regressions import find_regressions
from tinyllama.harness.records import append_csv, append_json, load_json

RECORD_KIND = "tinyllama.harness.compare"

# The columns of the printed table (the record keeps everything the benchmark measured).
TABLE_COLUMNS = {
    "label": "run", "check": "check", "step_ms_median": "step ms", "step_ms_spread_pct": "spread %",
    "forward_ms_median": "fwd ms", "backward_ms_median": "bwd ms", "optimizer_ms_median": "opt ms",
    "tokens_per_s": "tokens/s", "peak_memory_mib": "peak MiB", "achieved_tflops": "TFLOP/s",
    "mfu_measured": "MFU % (measured)", "mfu": "MFU % (datasheet)", "speedup": "speed-up",
    "gemm_ops": "GEMM ops", "gemm_kernels": "GEMM kernels",
}


@dataclass
class Comparison:
    """The record of one comparison: ``record`` is plain JSON-able data; the methods present it."""

    record: dict[str, Any]

    @property
    def runs(self) -> list[dict[str, Any]]:
        return self.record["runs"]

    @property
    def failed(self) -> list[str]:
        """Labels of runs that were not timed (failed the check, or ran out of memory)."""
        return [r["label"] for r in self.runs if r["check"] != "passed"]

    def to_frame(self) -> Any:
        """Every figure of every run, one row per run (pandas)."""
        import pandas as pd

        return pd.DataFrame(self.runs)

    def table(self) -> Any:
        """The figures that matter, one row per run, named for reading (pandas)."""
        columns = dict(TABLE_COLUMNS)
        if not any(r.get("mfu_measured") is not None for r in self.runs):
            del columns["mfu_measured"]  # no measured ceiling: no column of blanks
        frame = self.to_frame().reindex(columns=list(columns)).rename(columns=columns)
        for column in ("MFU % (measured)", "MFU % (datasheet)"):
            if column in frame:
                frame[column] = frame[column].map(lambda x: None if x is None or x != x else round(100 * x, 1))
        return frame.set_index("run")

    def __str__(self) -> str:
        r = self.record
        head = (f"{r['device']} | torch {r['environment']['torch']} | {r['date']} | preset {r['preset']}, "
                f"batch {r['batch_size']} x seq {r['seq_len']} | speed-up vs {r['baseline_run']}"
                + (f" | step times from {r['timed_in_turns']} rounds in turns" if r.get("timed_in_turns") else ""))
        with wide_tables():
            body = self.table().to_string(float_format=lambda x: f"{x:,.2f}")
        notes = [f"{run['label']}: NOT TIMED - {run['check_message']}" for run in self.runs
                 if run["check"] != "passed"]
        return "\n".join([head, body, *notes])

    def plot(self, title: str | None = None) -> Any:
        """Speed-up bars and stacked forward/backward/optimizer times (a matplotlib figure)."""
        return plot_comparison(self, title)

    def save_json(self, path: str | os.PathLike[str]) -> Path:
        """Append this record to the JSON list in ``path`` (earlier records are kept)."""
        return append_json(path, [self.record])

    def save_csv(self, path: str | os.PathLike[str]) -> Path:
        """Append this comparison's rows to the CSV file ``path`` (earlier rows are kept)."""
        rows = [{f"record_{key}": self.record[key] for key in ("preset", "device", "date")} | run for run in self.runs]
        return append_csv(path, rows)

    def regressions(self, baseline: Comparison | dict[str, Any]) -> Any:
        """``find_regressions(baseline, self)``."""
        return find_regressions(baseline, self)


def load_record(path: str | os.PathLike[str], index: int = -1) -> dict[str, Any]:
    """Record ``index`` (default: the last) among the comparison records in the JSON file ``path``."""
    if not Path(path).exists():
        raise ValueError(f"baseline file {path} does not exist: give a file written by --json")
    records = [r for r in load_json(path) if isinstance(r, dict) and r.get("kind") == RECORD_KIND]
    if not records:
        raise ValueError(f"{path} holds no comparison records: give a file written by python -m tinyllama.harness.compare --json")
    try:
        return records[index]
    except IndexError:
        raise ValueError(f"{path} holds {len(records)} comparison record(s); index {index} is out of range") from None


def plot_comparison(source: Comparison | dict[str, Any] | Any, title: str | None = None) -> Any:
    """Two panels from one record: speed-up over the baseline run, and each run's step split into
    forward, backward and optimizer (median ms). ``source``: a Comparison, its record, or its
    ``to_frame()``. Returns the matplotlib figure."""
    import matplotlib.pyplot as plt
    import pandas as pd

    if isinstance(source, pd.DataFrame):
        frame, record = source, {}
    else:
        record = source if isinstance(source, dict) else source.record
        frame = pd.DataFrame(record["runs"])
    timed = frame[frame["check"] == "passed"]
    labels = list(timed["label"])
    fig, (ax_speed, ax_split) = plt.subplots(1, 2, figsize=(12, 0.5 * len(labels) + 2.0), layout="constrained",
                                         width_ratios=(1, 1.4))
    ypos = range(len(labels))
    speedups = list(timed["speedup"])
    ax_speed.barh(ypos, speedups, color="tab:green")
    ax_speed.axvline(1.0, color="black", linewidth=0.8)
    for y, s in zip(ypos, speedups):
        ax_speed.text(s, y, f" {s:.2f}x", va="center")
    ax_speed.set_yticks(list(ypos), labels)
    ax_speed.invert_yaxis()
    ax_speed.set_xlabel(f"speed-up over {record.get('baseline_run', 'the baseline')} (same process)")
    left = [0.0] * len(labels)
    for phase, color in (("forward", "tab:blue"), ("backward", "tab:orange"), ("optimizer", "tab:gray")):
        values = list(timed[f"{phase}_ms_median"])
        ax_split.barh(ypos, values, left=left, color=color, label=phase)
        left = [a + b for a, b in zip(left, values)]
    # The whole step's median and its p10..p90 range: the spread that every difference must beat.
    step = timed["step_ms_median"]
    ax_split.errorbar(step, list(ypos), xerr=[step - timed["step_ms_p10"], timed["step_ms_p90"] - step],
                      fmt="|", color="black", capsize=3, label="step p10..p90")
    ax_split.set_yticks(list(ypos), [""] * len(labels))  # the same rows as the left panel: its labels serve
    ax_split.invert_yaxis()
    ax_split.set_xlabel("median time per training step (ms)")
    # Below the figure, not over the bars: with many runs any corner inside the axes hides one.
    fig.legend(*ax_split.get_legend_handles_labels(), loc="outside lower center", ncol=4, fontsize=8)
    untimed = [r for r in frame.to_dict("records") if r["check"] != "passed"]
    subtitle = f" (not timed: {', '.join(r['label'] for r in untimed)})" if untimed else ""
    if record:
        title = title or f"{record['device']}, preset {record['preset']}, {record['date'][:10]}"
    fig.suptitle((title or "") + subtitle)
    return fig
