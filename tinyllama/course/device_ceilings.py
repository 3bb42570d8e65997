"""This device's measured ceilings, as notebook 00 recorded them: the one place later notebooks get them.

Notebook 00 measures a large matrix multiply per precision and a large copy and records them
(``matmul_<precision>_tflops``, ``copy_tbs``, ``matmul_size``). A later notebook needs the same figures
for its roofs; :func:`device_ceilings` reads the latest record of notebook 00 made on this device at
this profile's sizes, or measures the ceilings now (``tinyllama.costs.ceilings``, the same sizes) when there
is none, and says which it did.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Sequence

import torch

from tinyllama import device as dev
from tinyllama.costs import ceilings
from tinyllama.course import results
from tinyllama.course.profile import Profile
from tinyllama.profiling.roofline import Roofs

NOTEBOOK_00 = "00_environment_check"


@dataclass
class DeviceCeilings:
    """The roofs of this device and where they come from.

    ``roofs``: measured matmul TFLOP/s per precision and copy TB/s, with the datasheet peaks beside them;
    ``source``: a sentence (``"notebook 00 (2026-11-23 07:38)"`` or ``"measured now: ..."``);
    ``recorded``: whether they come from notebook 00's record."""

    roofs: Roofs
    source: str
    recorded: bool
    # The p10-p90 band of each rate (keys: the precisions and "copy"), where it was measured or recorded.
    spreads: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def copy_tbs(self) -> float:
        """The copy bandwidth (bytes read + written per second), TB/s."""
        return self.roofs.bandwidth_tbs

    def matmul_tflops(self, precision: str) -> float:
        """The measured matmul rate of ``precision``, TFLOP/s."""
        return self.roofs.compute_tflops[precision]

    def ridge_spread(self, precision: str) -> tuple[float, float] | None:
        """The band of the ridge point of ``precision`` (FLOP/byte) that the two rates' p10-p90 bands allow: the
        lowest compute rate over the highest bandwidth, the highest over the lowest. None without both bands."""
        compute, copy = self.spreads.get(precision), self.spreads.get("copy")
        if compute is None or copy is None:
            return None
        return compute[0] / copy[1], compute[1] / copy[0]


def _recorded(device_name: str, profile: Profile, precisions: Sequence[str], directory: str | os.PathLike[str] | None
              ) -> tuple[dict[str, float], float, str, dict[str, tuple[float, float]]] | None:
    """The newest notebook-00 record of this device and profile with every precision wanted and the copy, with
    the p10-p90 bands it recorded (keys: the precisions and "copy"; none in records made before it kept them)."""
    for entry in reversed(results.read_records(directory)):
        figures = entry["figures"]
        if entry.get("notebook") != NOTEBOOK_00 or (entry.get("environment") or {}).get("device") != device_name:
            continue
        if entry.get("profile") not in (None, profile.name) or figures.get("matmul_size") != profile.matmul_size:
            continue
        rates = {p: figures.get(f"matmul_{p}_tflops") for p in precisions}
        if figures.get("copy_tbs") is None or any(v is None for v in rates.values()):
            continue
        recorded = entry.get("spreads") or {}
        names = {**{p: f"matmul_{p}_tflops" for p in precisions}, "copy": "copy_tbs"}
        spreads = {key: (float(recorded[name][0]), float(recorded[name][1])) for key, name in names.items()
                   if name in recorded}
        return ({p: float(v) for p, v in rates.items()}, float(figures["copy_tbs"]), str(entry.get("time", "")),
                spreads)
    return None


def device_ceilings(device: torch.device | str | None, profile: Profile, precisions: Sequence[str] | None = None,
                    *, directory: str | os.PathLike[str] | None = None, quiet: bool = False) -> DeviceCeilings:
    """The ceilings of ``device``: notebook 00's latest record made on this device at ``profile``'s matmul
    size (with every one of ``precisions``, default the profile's ``matmul_precisions``; ``()`` for the copy
    alone, and the copy), else
    measured now with ``tinyllama.costs.ceilings`` at the profile's sizes. Prints where they come from unless
    ``quiet``."""
    device = dev.get_device(None if device is None else str(device))
    precisions = tuple(profile.matmul_precisions if precisions is None else precisions)
    unknown = [p for p in precisions if p not in ("fp32", "tf32", "bf16", "fp16")]
    if unknown:
        raise ValueError(f"unknown precision(s) {unknown}: use fp32, tf32, bf16 or fp16")
    name = dev.device_name(device)
    found = _recorded(name, profile, precisions, directory)
    if found is not None:
        rates, copy_tbs, when, spreads = found
        source, recorded = f"notebook 00 ({when[:16].replace('T', ' ')}, {name})", True
    else:
        earlier = [e for e in results.read_records(directory) if e.get("notebook") == NOTEBOOK_00]
        reason = ("notebook 00 has recorded no ceilings in your results" if not earlier else
                  f"notebook 00 recorded none on this device ({name}) at matmul size {profile.matmul_size} "
                  f"with {', '.join(precisions)}")
        if not quiet:
            print(f"{reason}: measuring them now ({profile.matmul_size}^3 matmul, "
                  f"{profile.copy_bytes / 2**20:.0f} MiB copy)")
        measured = {p: ceilings.measure_matmul_tflops(p, n=profile.matmul_size, device=device, repeat=profile.repeat)
                    for p in precisions}
        measured["copy"] = ceilings.measure_copy_tbs(profile.copy_bytes, device=device, repeat=profile.repeat)
        rates = {p: measured[p].value for p in precisions}
        copy_tbs = measured["copy"].value
        spreads = {key: ceiling.spread for key, ceiling in measured.items()}
        source, recorded = "measured now (run notebook 00 to record them once)", False
    peaks = dev.device_peaks(device)
    roofs = Roofs(device=name, compute_tflops=rates, bandwidth_tbs=copy_tbs,
                  datasheet_tflops={p: peaks.tflops(p) if peaks else None for p in rates},
                  datasheet_tbs=peaks.memory_bandwidth_tbs if peaks else None)
    if not quiet:
        print(f"ceilings of {name}: " + "".join(f"{p} matmul {v:.4g} TFLOP/s, " for p, v in rates.items())
              + f"copy {copy_tbs:.4g} TB/s; from {source}")
    return DeviceCeilings(roofs, source, recorded, spreads)
