"""Benchmark runs recorded with the course, read back as they were recorded.

Some figures a participant's machine cannot produce: a hub usually gives one GPU, so notebook 05 shows
the two-GPU run recorded on a node with two (``--json`` of ``torchrun ... -m inference``: one record per
rank). :func:`load_scaling_record` reads such a run, checks that it is one complete run, and returns its
figures labelled with the device, the date and the software they were measured with. Nothing is
re-measured: these are another machine's numbers, to be read as such. The runs ship with the package
(``inference/data/inference_scaling.json``, a record of runs as ``tinyllama.harness.records`` writes it), so a
course installed without its checkout has them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from tinyllama.harness.records import load_json, packaged_record

# The topic record of the scaling runs (package data of ``inference``); benchmarks/gpu/inference_scaling_gpu.py appends to it.
SCALING_TOPIC = "inference_scaling"
# The two-GPU torchrun run of ResNet-50 inference (2 x H200, 2026-11-22), shown by notebook 05: its run's source.
TWO_GPU_RECORD = "2026-11-22_2xh200_inference_torchrun.json"


@dataclass(frozen=True)
class RecordedScaling:
    """One recorded data-parallel run: its settings, every rank's timing, and the figures rank 0 derived.

    ``parameters``: the network's parameter count; ``per_rank``: one row per rank (``rank``, ``local_batch_size``, ``median_ms``, ``spread_pct``,
    ``throughput`` in samples/s); ``global_throughput``: the global batch over the slowest rank's median;
    ``baseline_throughput``: the one-GPU run at the same per-GPU batch the run was compared with (``None``
    if none was given); ``scaling_efficiency``: global / (world size x baseline)."""

    path: Path
    device: str
    timestamp: str
    world_size: int
    network: str
    precision: str
    channels_last: bool
    batch_size: int
    local_batch_size: int
    iterations: int
    parameters: int
    torch: str
    per_rank: pd.DataFrame
    global_throughput: float
    baseline_throughput: float | None
    scaling_efficiency: float | None

    @property
    def date(self) -> str:
        """The day the run was recorded (YYYY-MM-DD)."""
        return self.timestamp[:10]

    @property
    def label(self) -> str:
        """``2 x NVIDIA H200, recorded 2026-11-22 (torch 2.11.0+cu130)``: who measured what, when."""
        return f"{self.world_size} x {self.device}, recorded {self.date} (torch {self.torch})"

    @property
    def settings(self) -> str:
        """``resnet50 fp16 channels-last, batch 512 (256 per GPU), 30 timed iterations``."""
        layout = " channels-last" if self.channels_last else ""
        return (f"{self.network} {self.precision}{layout}, batch {self.batch_size} ({self.local_batch_size} per GPU), "
                f"{self.iterations} timed iterations")


def record_path(topic: str = SCALING_TOPIC) -> Path:
    """Where the shipped record of ``topic`` lies (``inference/data/<topic>.json``)."""
    return Path(__file__).parent / "data" / f"{topic}.json"


def recorded_run(source: str, topic: str = SCALING_TOPIC) -> dict:
    """The run of the shipped ``topic`` record that came from ``source`` (its original file name); the newest
    if several did. ``FileNotFoundError`` when the record holds none."""
    runs = [run for run in packaged_record("inference", topic) if run.get("source") == source]
    if not runs:
        raise FileNotFoundError(f"the course's {topic} record holds no run from {source}")
    return runs[-1]


def load_scaling_record(path: str | os.PathLike[str] | None = None) -> RecordedScaling:
    """Read a ``--json`` file of one multi-process run (default: the run :data:`TWO_GPU_RECORD` of the shipped
    scaling record): every rank's record, all of the same run. Raises ``ValueError`` naming what is
    wrong when the file holds no run, several runs, or misses a rank."""
    if path is None:
        path, records = record_path(), recorded_run(TWO_GPU_RECORD)["data"]
    else:
        path = Path(path)
        records = json.loads(path.read_text())
    if isinstance(records, dict):
        records = [records]
    if not records:
        raise ValueError(f"{path}: no records")
    world = {r.get("world_size") for r in records}
    if len(world) != 1 or None in world:
        raise ValueError(f"{path}: records of several runs (world sizes {sorted(map(str, world))}): keep one run per file")
    world_size = int(world.pop())
    ranks = sorted(int(r["rank"]) for r in records)
    if ranks != list(range(world_size)):
        raise ValueError(f"{path}: ranks {ranks} recorded for a run of {world_size} processes: a rank is missing or "
                         "repeated")
    first = records[0]
    for key in ("network", "precision", "batch_size", "timestamp", "device"):
        if any(r.get(key) != first.get(key) for r in records):
            raise ValueError(f"{path}: the ranks disagree on {key!r}: these records are not one run")
    per_rank = pd.DataFrame([{"rank": int(r["rank"]), "local_batch_size": int(r["local_batch_size"]),
                              "median_ms": float(r["median_ms"]), "spread_pct": float(r["spread_pct"]),
                              "throughput": float(r["throughput"])} for r in records]).sort_values("rank", ignore_index=True)
    return RecordedScaling(
        path=path, device=str(first["device"]), timestamp=str(first["timestamp"]), world_size=world_size,
        network=str(first["network"]), precision=str(first["precision"]), channels_last=bool(first.get("channels_last")),
        batch_size=int(first["batch_size"]), local_batch_size=int(first["local_batch_size"]),
        iterations=int(first["iterations"]), parameters=int(first.get("params") or 0), torch=str(first.get("torch", "?")), per_rank=per_rank,
        global_throughput=float(first["global_throughput"]),
        baseline_throughput=None if first.get("baseline_throughput") is None else float(first["baseline_throughput"]),
        scaling_efficiency=None if first.get("scaling_efficiency") is None else float(first["scaling_efficiency"]))


# ---------------------------------------------------------------------------------------------
# The scaling study: several networks, both modes, 1-4 GPUs, the all-reduce and a straggler
# (benchmarks/gpu/inference_scaling_gpu.py), one JSON object per file.
# ---------------------------------------------------------------------------------------------

_RUN_KEYS = ("network", "mode", "world_size", "rank", "local_batch_size", "batch_size", "median_ms", "spread_pct",
             "throughput", "global_throughput", "params", "straggler_ms", "straggler_rank")


def scaling_table(runs: pd.DataFrame | list[dict]) -> pd.DataFrame:
    """Efficiency per network, mode and GPU count, from every rank's records (straggler runs left out): the
    global throughput (global batch / slowest rank's median), the one-GPU run's at the same per-GPU batch, and
    their ratio over the count. One row per (network, mode, world size), networks by parameter count."""
    frame = pd.DataFrame(runs)
    if frame.empty:
        return pd.DataFrame(columns=["network", "params", "mode", "world_size", "per_gpu_batch", "slowest_ms",
                                     "spread_pct", "global_throughput", "one_gpu_throughput", "efficiency"])
    if "straggler_ms" in frame:
        frame = frame[frame["straggler_ms"].fillna(0) == 0]
    rows = []
    for (network, mode, k), ranks in frame.groupby(["network", "mode", "world_size"], sort=False):
        rows.append({"network": network, "params": int(ranks["params"].iloc[0]), "mode": mode, "world_size": int(k),
                     "per_gpu_batch": int(ranks["local_batch_size"].iloc[0]), "slowest_ms": float(ranks["median_ms"].max()),
                     "spread_pct": float(ranks["spread_pct"].max()),
                     "global_throughput": float(ranks["batch_size"].iloc[0] / (ranks["median_ms"].max() / 1e3))})
    table = pd.DataFrame(rows)
    one = table[table["world_size"] == 1].set_index(["network", "mode"])["global_throughput"]
    table["one_gpu_throughput"] = [one.get((n, m), float("nan")) for n, m in zip(table["network"], table["mode"])]
    table["efficiency"] = table["global_throughput"] / (table["world_size"] * table["one_gpu_throughput"])
    return table.sort_values(["params", "mode", "world_size"], ignore_index=True)


@dataclass(frozen=True)
class ScalingStudy:
    """A recorded scaling study: ``runs`` holds every rank's record (one row per rank per run), ``allreduce``
    the all-reduce sweeps (one row per world size and buffer size)."""

    path: Path
    device: str
    date: str
    gpus: int
    torch: str
    commit: str | None
    smoke: bool
    settings: dict
    runs: pd.DataFrame
    allreduce: pd.DataFrame
    failures: list

    @property
    def label(self) -> str:
        """``2 x NVIDIA H200, recorded 2026-11-26 (torch 2.11.0+cu130)``."""
        where = f"{self.gpus} x {self.device}" + (" (CPU processes, a smoke run)" if self.smoke else "")
        return f"{where}, recorded {self.date} (torch {self.torch})"

    def table(self) -> pd.DataFrame:
        """:func:`scaling_table` of the runs."""
        return scaling_table(self.runs)

    def straggler(self, mode: str) -> pd.DataFrame:
        """:func:`straggler_table` of the runs."""
        return straggler_table(self.runs, mode)


def straggler_table(runs: pd.DataFrame | list[dict], mode: str) -> pd.DataFrame:
    """Per-rank figures of the straggler run in ``mode`` beside the same run without it (same network and
    world size): columns ``rank``, ``median_ms`` and ``throughput`` without and with the delay (suffix
    ``_straggler``), and ``delayed`` (the straggler's row); ``attrs`` hold the network, world size, delay and
    global batch. Empty when there is no straggler run."""
    runs = pd.DataFrame(runs)
    runs = runs[runs["mode"] == mode]
    delayed = runs[runs["straggler_ms"].fillna(0) > 0]
    if delayed.empty:
        return pd.DataFrame()
    network, k = delayed["network"].iloc[0], int(delayed["world_size"].iloc[0])
    plain = runs[(runs["straggler_ms"].fillna(0) == 0) & (runs["network"] == network) & (runs["world_size"] == k)]
    columns = ["median_ms", "spread_pct", "throughput"]
    merged = plain.set_index("rank")[columns].join(
        delayed.set_index("rank")[columns].add_suffix("_straggler"), how="inner")
    merged["delayed"] = merged.index == int(delayed["straggler_rank"].iloc[0])
    merged = merged.reset_index()
    merged.attrs.update(network=network, world_size=k, delay_ms=float(delayed["straggler_ms"].iloc[0]),
                        batch_size=int(delayed["batch_size"].iloc[0]))
    return merged


def load_scaling_study(path: str | os.PathLike[str]) -> ScalingStudy:
    """Read a study written by ``benchmarks/gpu/inference_scaling_gpu.py``; ``ValueError`` naming what is wrong when it is
    not one, or when a run misses a rank."""
    path = Path(path)
    return _study(json.loads(path.read_text()), path)


def _is_study(data: object) -> bool:
    return isinstance(data, dict) and data.get("study") == "inference_scaling"


def _study(data: object, path: Path) -> ScalingStudy:
    if not _is_study(data):
        raise ValueError(f"{path}: not a scaling study of benchmarks/gpu/inference_scaling_gpu.py")
    runs = pd.DataFrame([{key: r.get(key) for key in (*_RUN_KEYS, "launch")} for r in data.get("runs", [])])
    if runs.empty:
        raise ValueError(f"{path}: the study holds no runs")
    runs["straggler_ms"] = runs["straggler_ms"].fillna(0.0).astype(float)
    for (launch, network, mode, k, delay), ranks in runs.groupby(["launch", "network", "mode", "world_size",
                                                                  "straggler_ms"]):
        if sorted(ranks["rank"]) != list(range(int(k))):
            raise ValueError(f"{path}: {network} {mode} on {k} processes has ranks {sorted(ranks['rank'])}: a rank "
                             "is missing or repeated")
    environment = data.get("environment") or {}
    return ScalingStudy(path=path, device=str(data["device"]), date=str(data["date"]), gpus=int(data["gpus"]),
                        torch=str(environment.get("torch", "?")), commit=data.get("commit"),
                        smoke=bool(data.get("smoke")), settings=dict(data.get("settings") or {}), runs=runs,
                        allreduce=pd.DataFrame(data.get("allreduce") or []), failures=list(data.get("failures") or []))


def latest_scaling_study(record: str | os.PathLike[str] | None = None) -> ScalingStudy | None:
    """The newest study among the runs of a scaling record (default: the shipped one, :func:`record_path`),
    ``None`` when it holds none. A smoke run (CPU processes) is refused there: it is no GPU run."""
    path = Path(record) if record is not None else record_path()
    runs = load_json(path) if record is not None else packaged_record("inference", SCALING_TOPIC)
    studies = [run for run in runs if _is_study(run.get("data"))]
    if not studies:
        return None
    study = _study(studies[-1]["data"], path)
    if study.smoke:
        raise ValueError(f"{path}: its newest study ({studies[-1].get('source')}) is a smoke run of CPU processes: "
                         "it does not belong among the recorded GPU runs; remove that run from the record")
    return study
