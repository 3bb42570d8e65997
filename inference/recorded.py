"""Benchmark runs recorded with the course (``benchmarks/`` of the checkout), read back as they were recorded.

Some figures a participant's machine cannot produce: a hub usually gives one GPU, so notebook 05 shows
the two-GPU run recorded on a node with two (``--json`` of ``torchrun ... -m inference``: one record per
rank). :func:`load_scaling_record` reads such a file, checks that it is one complete run, and returns its
figures labelled with the device, the date and the software they were measured with. Nothing is
re-measured: these are another machine's numbers, to be read as such.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from tinyllama.course.results import checkout_root

# The two-GPU torchrun run of ResNet-50 inference (2 x H200, 2026-11-22), shown by notebook 05.
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


def benchmarks_dir() -> Path:
    """The checkout's ``benchmarks/`` folder (a course installed without its checkout has none)."""
    root = checkout_root()
    if root is None or not (root / "benchmarks").is_dir():
        raise FileNotFoundError("the course's recorded benchmarks are not here: they live in benchmarks/ of the course "
                                "checkout; install the course from its checkout (bash course.sh kernel) to read them")
    return root / "benchmarks"


def load_scaling_record(path: str | os.PathLike[str] | None = None) -> RecordedScaling:
    """Read a ``--json`` file of one multi-process run (default :data:`TWO_GPU_RECORD` in
    :func:`benchmarks_dir`): every rank's record, all of the same run. Raises ``ValueError`` naming what is
    wrong when the file holds no run, several runs, or misses a rank."""
    path = Path(path) if path is not None else benchmarks_dir() / TWO_GPU_RECORD
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
