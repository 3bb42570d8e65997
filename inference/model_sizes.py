"""torch.compile across model sizes: eager, compiled and compiled with freezing, network by network.

``benchmarks/gpu/inference_models_gpu.py`` runs ResNet-18, -50, -152 and ViT-B/16 in fp16 channels-last at two batch
sizes, each network eager, compiled (default) and compiled with Inductor's freezing, one process per
GPU, every run checked against fp32 eager before it is timed, and writes one JSON file: the device,
date, commit and software, and the records ``python -m inference --json`` writes (one per run, with a
``configuration`` label), and appends it as a run to the record ``inference/data/inference_models.json``
(package data). :func:`load_model_sizes` reads that record's newest run (or a given file) and labels it
with who measured it, where and when: these are another
machine's numbers. :func:`size_table` puts any such records side by side, recorded or measured now
(:meth:`BenchmarkResult.as_record <inference.benchmark.BenchmarkResult.as_record>` gives the same dicts).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from inference.recorded import record_path
from tinyllama.harness.records import packaged_record
from tinyllama.timing import Stats, verdict

NETWORKS = ("resnet18", "resnet50", "resnet152", "vit_b_16")
CONFIGURATIONS = ("eager", "compile", "compile + freeze")
TOPIC = "inference_models"  # the shipped record: inference/data/inference_models.json


@dataclass(frozen=True)
class RecordedSizes:
    """One recorded run of the model-size script: where it ran, when, on what, and its records."""

    path: Path
    device: str
    date: str
    commit: str
    torch: str
    command: str
    records: list[dict[str, Any]]

    @property
    def label(self) -> str:
        """``NVIDIA H200, recorded 2026-11-26 (torch 2.11.0+cu130, commit 1a2b3c4)``."""
        return f"{self.device}, recorded {self.date} (torch {self.torch}, commit {self.commit[:7]})"


def load_model_sizes(path: str | os.PathLike[str] | None = None) -> RecordedSizes:
    """Read a file written by ``benchmarks/gpu/inference_models_gpu.py`` (default: the newest run of the shipped
    record ``inference/data/inference_models.json``). Raises ``FileNotFoundError`` when there is none and
    ``ValueError`` naming what is missing from a file that is not such a record."""
    if path is None:
        runs = packaged_record("inference", TOPIC)
        if not runs:
            raise FileNotFoundError(f"no recorded model-size run (inference/data/{TOPIC}.json is empty): "
                                    "benchmarks/gpu/inference_models_gpu.py appends one on a GPU")
        path, data = record_path(TOPIC), runs[-1]["data"]
    else:
        path = Path(path)
        data = json.loads(path.read_text())
    missing = [key for key in ("device", "date", "commit", "torch", "records") if key not in data]
    if missing:
        raise ValueError(f"{path}: not a model-size record (no {', '.join(missing)})")
    if not data["records"]:
        raise ValueError(f"{path}: the record holds no runs")
    for record in data["records"]:
        if record.get("configuration") not in CONFIGURATIONS:
            raise ValueError(f"{path}: a record without a known configuration ({record.get('configuration')!r})")
    return RecordedSizes(path, str(data["device"]), str(data["date"]), str(data["commit"]), str(data["torch"]),
                         str(data.get("command", "")), list(data["records"]))


def _stats(record: dict[str, Any]) -> Stats:
    return Stats(median=record["median_ms"], mean=record["mean_ms"], std=record["std_ms"], min=record["min_ms"],
                 max=record["max_ms"], p10=record["p10_ms"], p90=record["p90_ms"], n=record["iterations"])


def size_table(records: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One row per network and batch size: parameters (millions), images/s of each configuration, the
    compile's one-time seconds (first iteration beyond steady ones, compile and freeze), and compile +
    freeze against eager: the ratio of medians and a verdict from both runs' 10th-90th percentile bands
    (``faster``, ``slower``, ``within noise``). Runs that failed (``error``) are left out; a network whose
    eager or frozen run is missing gets no ratio."""
    good = [r for r in records if not r.get("error")]
    if not good:
        raise ValueError("no successful run among the records")
    rows = []
    keys = sorted({(r["network"], int(r["batch_size"])) for r in good},
                  key=lambda k: (NETWORKS.index(k[0]) if k[0] in NETWORKS else len(NETWORKS), k[0], k[1]))
    for network, batch in keys:
        runs = {r["configuration"]: r for r in good if r["network"] == network and int(r["batch_size"]) == batch}
        any_run = next(iter(runs.values()))
        row: dict[str, Any] = {"network": network, "batch_size": batch, "params_M": any_run["params"] / 1e6}
        for name in CONFIGURATIONS:
            row[f"{name} img/s"] = runs[name]["throughput"] if name in runs else float("nan")
        for name in CONFIGURATIONS[1:]:
            row[f"{name} compile s"] = runs[name]["compile_s"] if name in runs else float("nan")
        if "eager" in runs and "compile + freeze" in runs:
            ratio, said = verdict(_stats(runs["eager"]), _stats(runs["compile + freeze"]))
            row.update({"freeze / eager": ratio, "verdict": said})
        else:
            row.update({"freeze / eager": float("nan"), "verdict": "not measured"})
        rows.append(row)
    return pd.DataFrame(rows).set_index(["network", "batch_size"])


def plot_sizes(table: pd.DataFrame, title: str) -> Any:
    """Two panels per network (at the table's largest batch of each): images/s of each configuration
    (log scale: the networks differ by an order of magnitude), and the compile's one-time seconds."""
    import matplotlib.pyplot as plt
    import numpy as np

    last = table.reset_index().sort_values("batch_size").groupby("network", sort=False).tail(1)
    last = last.set_index("network").reindex([n for n in table.index.get_level_values(0).unique()])
    fig, (ax_rate, ax_compile) = plt.subplots(1, 2, figsize=(11, 3.8))
    x = np.arange(len(last))
    width = 0.8 / len(CONFIGURATIONS)
    colors = dict(zip(CONFIGURATIONS, ["gray", "tab:blue", "tab:green"]))
    for i, name in enumerate(CONFIGURATIONS):
        ax_rate.bar(x + (i - 1) * width, last[f"{name} img/s"], width, label=name, color=colors[name])
    ax_rate.set_yscale("log")
    ax_rate.set_xticks(x, [f"{n}\n(batch {b})" for n, b in zip(last.index, last["batch_size"])], fontsize=8)
    ax_rate.set_ylabel("throughput (images/s, log scale)")
    ax_rate.set_title("steady throughput", fontsize=9)
    ax_rate.legend(fontsize=8)
    for i, name in enumerate(CONFIGURATIONS[1:]):
        ax_compile.bar(x + (i - 0.5) * 0.4, last[f"{name} compile s"], 0.4, label=name, color=colors[name])
    ax_compile.set_xticks(x, list(last.index), fontsize=8)
    ax_compile.set_ylabel("one-time cost (s)")
    ax_compile.set_title("compile (first iteration beyond steady ones)", fontsize=9)
    ax_compile.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


__all__ = ["CONFIGURATIONS", "NETWORKS", "RecordedSizes", "load_model_sizes", "plot_sizes", "size_table"]
