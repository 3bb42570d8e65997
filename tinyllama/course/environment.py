"""The checks of notebook 00: is this environment ready for the course?

Each check returns a :class:`Check` with a verdict -- ``PASS`` (ready), ``WARN`` (works, but a later
notebook will miss something, or the numbers will be off) or ``FAIL`` (fix this first) -- and a
one-line reason. :func:`verdict` sums them up.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import shutil
from dataclasses import dataclass
from typing import Iterable, Literal

import pandas as pd
import torch

from tinyllama import device as dev
from tinyllama.config import DTYPES
from tinyllama.costs.ceilings import Ceiling
from tinyllama.course.profile import Profile

Status = Literal["PASS", "WARN", "FAIL"]
GIB = 2**30


@dataclass(frozen=True)
class Check:
    """The verdict of one check."""

    name: str
    status: Status
    detail: str

    def __str__(self) -> str:
        return f"{self.status}  {self.name}: {self.detail}"


def show(checks: Check | Iterable[Check]) -> None:
    """Print one line per check."""
    for check in [checks] if isinstance(checks, Check) else checks:
        print(check)


# --- back end, device, memory -----------------------------------------------------------------------

def check_backend(device: torch.device) -> Check:
    """Which back end runs the course, and on which device."""
    name = dev.device_name(device)
    if dev.backend() == "cpu":
        return Check("back end", "WARN", f"CPU only ({name}): PyTorch sees no GPU. Fine for CI and for "
                     "reading the course at tiny sizes; on the hub, start a server on a GPU node "
                     f"(and check that {dev.visible_devices_variable()} is not empty).")
    version = torch.version.hip if dev.backend() == "rocm" else torch.version.cuda
    label = "ROCm/HIP" if dev.backend() == "rocm" else "CUDA"
    return Check("back end", "PASS", f"{label} {version} on {device} = {name}")


def _system_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(profile: Profile, device: torch.device) -> Check:
    """Enough device memory for the profile's sizes, and not already taken by someone else."""
    if device.type != "cuda":
        total = _system_memory_bytes()
        if total is None:
            return Check("memory", "WARN", "could not read the size of system memory")
        status: Status = "PASS" if total >= 2 * GIB else "WARN"
        return Check("memory", status, f"{total / GIB:.1f} GiB of system memory (the ci profile needs < 2 GiB)")
    total = dev.memory_stats(device).total_bytes or 0
    others = dev.memory_in_use_by_others(device) or 0
    detail = (f"{total / GIB:.1f} GiB on the device, {others / GIB:.1f} GiB in use outside this kernel's tensors "
              "(other processes, and the driver's own few hundred MiB)")
    if total < profile.min_device_memory_gib * GIB:
        return Check("memory", "WARN", f"{detail}: the {profile.name} profile wants "
                     f"{profile.min_device_memory_gib:.0f} GiB; the largest sizes may run out of memory")
    if others > GIB:
        return Check("memory", "WARN", f"{detail}: the GPU is shared with a busy process, so timings will be "
                     "slow and noisy (shut down kernels you no longer use)")
    return Check("memory", "PASS", detail)


# --- library versions ----------------------------------------------------------------------------------

# distribution -> (why the course needs it, verdict when missing)
PACKAGES: dict[str, tuple[str, Status]] = {
    "torch": ("everything", "FAIL"),
    "torchvision": ("the inference benchmark (notebooks 01-07)", "FAIL"),
    "triton": ("the V3 Triton kernels", "WARN"),
    "deepspeed": ("the FLOPS profiler (notebook 04)", "WARN"),
    "matplotlib": ("the plots", "FAIL"),
    "pandas": ("the results tables", "FAIL"),
    "ipywidgets": ("the interactive sliders", "WARN"),
}
MIN_TORCH = "2.5"
# Builds that ship a package under another distribution name (ROCm wheels: pytorch-triton-rocm).
DISTRIBUTION_ALIASES = {"triton": ("triton", "pytorch-triton-rocm", "pytorch-triton")}


def package_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (without importing it), or ``None``."""
    if distribution == "torch":
        return str(torch.__version__)  # the running build, e.g. a site's ROCm module
    for name in DISTRIBUTION_ALIASES.get(distribution, (distribution,)):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_packages() -> list[Check]:
    """One check per library the course uses."""
    checks = []
    for name, (purpose, missing) in PACKAGES.items():
        version = package_version(name)
        if version is None:
            checks.append(Check(name, missing, f"not installed: needed for {purpose}"))
        elif name == "torch" and not torch.torch_version.TorchVersion(version) >= MIN_TORCH:
            checks.append(Check(name, "FAIL", f"{version} is older than {MIN_TORCH}, which the course needs"))
        else:
            checks.append(Check(name, "PASS", version))
    return checks


# --- profilers -----------------------------------------------------------------------------------------

# A plain PATH lookup for now: the profiling toolkit's tinyllama.profiling.vendor (being written) will
# replace it, and the lead switches notebook 00 over when it lands. tool -> executables providing it.
VENDOR_PROFILERS: dict[str, dict[str, tuple[str, ...]]] = {
    "rocm": {"rocprofv3": ("rocprofv3",),
             "rocprof-sys": ("rocprof-sys-run", "rocprof-sys-instrument", "rocprof-sys"),
             "rocprof-compute": ("rocprof-compute",)},
    "cuda": {"nsys": ("nsys",), "ncu": ("ncu",)},
}


def find_vendor_profilers() -> dict[str, str | None]:
    """Every vendor profiler the course uses, with the path of its executable (``None`` if missing)."""
    found: dict[str, str | None] = {}
    for tools in VENDOR_PROFILERS.values():
        for tool, executables in tools.items():
            found[tool] = next((path for exe in executables if (path := shutil.which(exe))), None)
    return found


def check_profilers(backend: str | None = None) -> list[Check]:
    """The PyTorch profiler (everywhere) and this back end's vendor profilers (notebook 07)."""
    backend = backend or dev.backend()
    checks = [Check("torch.profiler", "PASS", "built into PyTorch: kernel tables and traces on every back end")]
    found = find_vendor_profilers()
    if backend == "cpu":
        checks.append(Check("vendor profilers", "PASS", "not needed without a GPU (notebook 07 shows the commands)"))
        return checks
    for tool in VENDOR_PROFILERS[backend]:
        if found[tool]:
            checks.append(Check(tool, "PASS", found[tool]))
        else:
            checks.append(Check(tool, "WARN", "not on PATH: notebook 07 will skip it (on the hub, try "
                                "`module load` for the profiler, then restart the kernel)"))
    return checks


# --- correctness and rates ----------------------------------------------------------------------------

# Relative (Frobenius) error of a matmul against float64 that a healthy device stays under.
MATMUL_TOLERANCE = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 2e-2, "fp16": 5e-3}


def matmul_relative_error(precision: str, device: torch.device, shape: tuple[int, int, int] = (200, 300, 100),
                          seed: int = 0) -> float:
    """Relative error of an ``m x k`` by ``k x n`` product on ``device`` at ``precision`` against the
    float64 product of the same (already rounded) inputs. Shapes are not powers of two on purpose."""
    if precision not in DTYPES:
        raise ValueError(f"unknown precision {precision!r}: use one of {', '.join(DTYPES)}")
    m, k, n = shape
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=generator).to(DTYPES[precision])
    b = torch.randn(k, n, generator=generator).to(DTYPES[precision])
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        product = (a.to(device) @ b.to(device)).double().cpu()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    reference = a.double() @ b.double()
    return (torch.linalg.norm(product - reference) / torch.linalg.norm(reference)).item()


def copy_is_exact(device: torch.device, numel: int = 1_000_003) -> bool:
    """A device-to-device copy reproduces its source bit for bit (odd size on purpose)."""
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    return bool(torch.equal(dst, src))


# Below this fraction of the datasheet peak a rate is suspicious (busy GPU, throttling, a slow path);
# above the peak (plus rounding) the timing itself is wrong.
LOW_FRACTION = 0.2
HIGH_FRACTION = 1.05


def _rate_check(name: str, value: float, unit: str, peak: float | None, floor: float) -> Check:
    shown = f"{value:.3g} {unit}"
    if not math.isfinite(value) or value <= floor:
        return Check(name, "FAIL", f"{shown}: implausibly low; is the device working?")
    if peak is None:
        return Check(name, "PASS", f"{shown} (no datasheet peak for this device: the measured rate is the ceiling)")
    fraction = value / peak
    detail = f"{shown} = {fraction:.0%} of the datasheet peak {peak:g} {unit}"
    if fraction > HIGH_FRACTION:
        return Check(name, "FAIL", f"{detail}: faster than the hardware can be, so the timing is wrong")
    if fraction < LOW_FRACTION:
        return Check(name, "WARN", f"{detail}: far below the peak; is the GPU busy or throttled?")
    return Check(name, "PASS", detail)


def check_matmul_rate(ceiling: Ceiling, device: torch.device) -> Check:
    """A measured matmul rate against the datasheet peak of this precision (when known)."""
    peaks = dev.device_peaks(device)
    peak = peaks.tflops(ceiling.precision) if peaks is not None else None
    return _rate_check(f"matmul {ceiling.precision} (n={ceiling.size})", ceiling.value, "TFLOP/s", peak, floor=1e-4)


def check_copy_rate(ceiling: Ceiling, device: torch.device) -> Check:
    """A measured copy rate against the datasheet memory bandwidth (when known)."""
    peaks = dev.device_peaks(device)
    peak = peaks.memory_bandwidth_tbs if peaks is not None else None
    return _rate_check(f"copy ({ceiling.size / 2**20:.0f} MiB)", ceiling.value, "TB/s", peak, floor=1e-4)


# --- summary ------------------------------------------------------------------------------------------

def checks_table(checks: Iterable[Check]) -> pd.DataFrame:
    """The checks as a table (one row each)."""
    return pd.DataFrame([{"check": c.name, "verdict": c.status, "detail": c.detail} for c in checks])


def verdict(checks: Iterable[Check], backend: str | None = None) -> tuple[Status, str]:
    """The overall verdict and one sentence that says what it means and what to fix."""
    checks = list(checks)
    backend = backend or dev.backend()
    failed = [c.name for c in checks if c.status == "FAIL"]
    warned = [c.name for c in checks if c.status == "WARN"]
    if failed:
        return "FAIL", f"NOT READY: fix {', '.join(failed)} first (see the table above)."
    if backend == "cpu":
        return "WARN", ("READY for the ci profile only: no GPU, so the notebooks run at tiny sizes. "
                        "Start your server on a GPU node for the course.")
    if warned:
        return "WARN", f"READY, with warnings about {', '.join(warned)} (see the table above)."
    return "PASS", "READY: every check passed."
