"""The first and last cell of every notebook: choose the profile and the device, warn about a busy
GPU, record results, and free memory at the end."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, MutableMapping

import torch

from tinyllama import device as dev
from tinyllama.course import gpu_share, results
from tinyllama.course.profile import Profile, select_profile


@dataclass
class Session:
    """What a notebook runs with: its name, its size profile and its device."""

    notebook: str
    profile: Profile
    device: torch.device

    def record(self, figures: Mapping[str, Any], notes: str | None = None,
               spreads: Mapping[str, Any] | None = None) -> Path:
        """Append ``figures`` to this user's results, with the p10-p90 ``spreads`` of timed ones
        (see :func:`tinyllama.course.results.record`)."""
        return results.record(self.notebook, figures, profile=self.profile.name, device=str(self.device),
                              notes=notes, spreads=spreads)

    def finish(self, namespace: MutableMapping[str, object] | None = None) -> list[str]:
        """Free device memory at the end of the notebook; pass ``globals()`` to drop its tensors too."""
        return gpu_share.finish(namespace, self.device)


def start(notebook: str, profile: str | None = None, device: str | None = None, seed: int = 0) -> Session:
    """Begin a notebook: say which profile and device it uses (the GPU the hub assigned), warn when
    that GPU is busy, say where results go, and seed the random generators."""
    selection = select_profile(profile)
    chosen = dev.get_device(device)
    print(selection.message())
    print(gpu_share.describe_device(chosen))
    gpu_share.check_busy(chosen)
    print(f"Results are recorded in: {results.results_dir() / results.RESULTS_FILE}"
          + ("" if os.environ.get(results.ENV_VARIABLE) else f" (set {results.ENV_VARIABLE} to change)"))
    torch.manual_seed(seed)
    return Session(notebook, selection.profile, chosen)
