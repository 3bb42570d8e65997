"""Everything that depends on the GPU vendor, in one place.

The course runs on AMD ROCm, NVIDIA CUDA and the CPU. PyTorch exposes both GPU vendors through
``torch.cuda``; this module says which one it is, names the device, synchronizes, reads memory
statistics, and looks up datasheet peaks. Other modules import from here instead of testing
``torch.version.hip`` themselves.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from typing import Iterator, Literal

import torch

Backend = Literal["rocm", "cuda", "cpu"]


class DeviceUnavailable(RuntimeError):
    """The device that was asked for does not exist on this machine."""


def backend() -> Backend:
    """Which back end PyTorch will use: ``"rocm"``, ``"cuda"`` or ``"cpu"`` (no usable GPU)."""
    if not torch.cuda.is_available():
        return "cpu"
    return "rocm" if getattr(torch.version, "hip", None) else "cuda"


def get_device(name: str | None = None) -> torch.device:
    """The device to run on: ``name`` if given (``"cpu"``, ``"cuda"``, ``"cuda:1"``), else the GPU the
    hub assigned (``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES`` decide which one is ``cuda:0``),
    else the CPU.

    Raises ``DeviceUnavailable`` with a one-line explanation when a GPU is asked for and none is usable.
    """
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable(
            f"device {name!r} was asked for but PyTorch sees no GPU: run on the CPU (device='cpu') "
            "or check that this node has a GPU and a GPU build of PyTorch (ROCm or CUDA)."
        )
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise DeviceUnavailable(
            f"device {name!r} does not exist: this process sees {torch.cuda.device_count()} GPU(s)."
        )
    return device


def has_tensor_memory_accelerator(device: torch.device | str | None = None) -> bool:
    """Whether ``device`` has NVIDIA's Tensor Memory Accelerator (TMA: Hopper, compute capability 9.0,
    and later), the copy engine behind Triton's tensor descriptors. AMD GPUs and the CPU have none."""
    device = get_device(device if device is None else str(device))
    if device.type != "cuda" or backend() != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def device_name(device: torch.device | str | None = None) -> str:
    """A human-readable name: the GPU's marketing name, or the CPU model from /proc/cpuinfo."""
    device = get_device(device if device is None else str(device))
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return "CPU: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return "CPU: " + (platform.processor() or platform.machine())


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait until all queued work on ``device`` has finished (a no-op on the CPU)."""
    device = torch.device(device) if device is not None else get_device()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class MemoryStats:
    """Device memory in bytes. ``None`` where the back end keeps no statistics (the CPU)."""

    current_bytes: int | None
    peak_bytes: int | None
    reserved_bytes: int | None
    total_bytes: int | None

    @property
    def peak_mib(self) -> float | None:
        return None if self.peak_bytes is None else self.peak_bytes / 2**20


def memory_stats(device: torch.device | str | None = None) -> MemoryStats:
    """Current, peak (since the last reset), reserved and total memory of ``device``."""
    device = torch.device(device) if device is not None else get_device()
    if device.type != "cuda":
        return MemoryStats(None, None, None, None)
    return MemoryStats(
        current_bytes=torch.cuda.memory_allocated(device),
        peak_bytes=torch.cuda.max_memory_allocated(device),
        reserved_bytes=torch.cuda.memory_reserved(device),
        total_bytes=torch.cuda.get_device_properties(device).total_memory,
    )


def reset_peak_memory(device: torch.device | str | None = None) -> None:
    """Start a new peak-memory measurement on ``device``."""
    device = torch.device(device) if device is not None else get_device()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def free_memory(device: torch.device | str | None = None) -> None:
    """Give cached blocks back to the driver, so that other users of a shared GPU can have them."""
    import gc

    gc.collect()
    device = torch.device(device) if device is not None else get_device()
    if device.type == "cuda":
        torch.cuda.empty_cache()


@contextlib.contextmanager
def cap_memory(device: torch.device | str, budget_bytes: int) -> Iterator[None]:
    """Within the block, let PyTorch's caching allocator hold at most ``budget_bytes`` on the GPU
    ``device`` (``torch.cuda.set_per_process_memory_fraction``, on CUDA and ROCm alike): a larger
    allocation raises the same ``torch.OutOfMemoryError`` a full GPU raises. What the process already
    holds counts against the budget (cached blocks are given back first). The previous cap is restored
    afterwards. A GPU-only setting: on the CPU use :func:`inference.memory.memory_budget`."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"cap_memory caps a GPU's caching allocator; {device} has none")
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    if not 0 < budget_bytes <= total:
        raise ValueError(f"the memory budget must be between 1 byte and the device's {total / 2**30:.1f} GiB "
                         f"(got {budget_bytes / 2**30:.3g} GiB)")
    # The getter exists from torch 2.6; before it, the cap is 1.0 unless someone set another.
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    before = float(getter(index)) if getter is not None else 1.0
    free_memory(device)
    torch.cuda.set_per_process_memory_fraction(budget_bytes / total, index)
    try:
        yield
    finally:
        free_memory(device)
        torch.cuda.set_per_process_memory_fraction(before, index)


def memory_in_use_by_others(device: torch.device | str | None = None) -> int | None:
    """Bytes in use on the GPU by anyone (other processes included), or ``None`` on the CPU.

    Used to warn a participant when a shared GPU is already busy.
    """
    device = torch.device(device) if device is not None else get_device()
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return total - free - torch.cuda.memory_reserved(device)


def visible_devices_variable() -> str:
    """The environment variable that assigns GPUs to this process on this back end."""
    return "HIP_VISIBLE_DEVICES" if backend() == "rocm" else "CUDA_VISIBLE_DEVICES"


def allocator_config_variable() -> str:
    """The environment variable that configures PyTorch's caching allocator on this back end (read once,
    when the allocator starts: set it before the process first touches the GPU, or in a child process)."""
    return "PYTORCH_HIP_ALLOC_CONF" if backend() == "rocm" else "PYTORCH_CUDA_ALLOC_CONF"


def hide_gpus() -> None:
    """Let this process see no GPU, as a CPU-only rank on a GPU node must: some collectives and
    libraries otherwise pick ``cuda:<local rank>`` by themselves (on a one-GPU node rank 1 then fails
    with "invalid device ordinal"). Takes effect only before the process first touches the GPU."""
    os.environ[visible_devices_variable()] = ""


def gpu_count() -> int:
    """How many GPUs this process sees (0 on the CPU)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def visible_device_environment(index: int, count: int = 1) -> dict[str, str]:
    """The environment for a child process that is to see ``count`` GPUs only, the ``index``-th one this
    process sees and the ones after it (the first becomes the child's ``cuda:0``): this back end's variable
    (:func:`visible_devices_variable`) set to those GPUs. Where this process's own variable already lists
    GPUs (``CUDA_VISIBLE_DEVICES=2,3``, or UUIDs), the child gets the entries at those positions of that list,
    since the child's value replaces it. On ROCm, ``ROCR_VISIBLE_DEVICES`` (which HIP's numbering counts
    within) is inherited unchanged."""
    seen = gpu_count()
    if count < 1 or not (0 <= index and index + count <= seen):
        asked = f"GPU {index}" if count == 1 else f"GPUs {index}-{index + count - 1}"
        raise DeviceUnavailable(f"{asked} {'was' if count == 1 else 'were'} asked for, but this process sees "
                                f"{seen} GPU(s)")
    variable = visible_devices_variable()
    listed = [entry.strip() for entry in os.environ.get(variable, "").split(",") if entry.strip()]
    chosen = [listed[i] if i < len(listed) else str(i) for i in range(index, index + count)]
    return {variable: ",".join(chosen)}


# --------------------------------------------------------------------------------------------------
# Collective communication between processes (torch.distributed). PyTorch's "nccl" back end is NVIDIA's
# NCCL on CUDA builds and AMD's RCCL on ROCm builds (same API, same back-end name, and RCCL reads the
# same NCCL_* variables). The CPU uses gloo.
# --------------------------------------------------------------------------------------------------

# Environment variables a participant sets to debug or steer the collectives, with what each does. The
# names are those documented by NVIDIA (NCCL user guide, "Environment Variables"), AMD (RCCL
# documentation, "RCCL environment variables") and PyTorch (ProcessGroupNCCL and gloo).
COLLECTIVE_ENV_VARIABLES: dict[str, dict[str, str]] = {
    "NCCL (NVIDIA) and RCCL (AMD)": {
        "NCCL_DEBUG": "INFO prints what the library set up (rings, transports) and what it waits for; WARN by default",
        "NCCL_DEBUG_SUBSYS": "which parts log, e.g. INIT,NET (with NCCL_DEBUG=INFO)",
        "NCCL_SOCKET_IFNAME": "the network interfaces to use between nodes, e.g. =ib0 or ^docker,lo",
        "NCCL_IB_HCA": "the InfiniBand/RoCE adapters to use between nodes",
        "NCCL_IB_DISABLE": "1: no InfiniBand, sockets only (to rule the fabric out)",
        "NCCL_P2P_DISABLE": "1: no direct GPU-to-GPU copies inside a node (to rule NVLink/xGMI out)",
    },
    "PyTorch (ProcessGroupNCCL, also with RCCL)": {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "what the watchdog does on a collective error or timeout (3, tear down the "
                                           "process, by default in recent PyTorch)",
        "TORCH_NCCL_BLOCKING_WAIT": "1: wait() blocks and raises at the timeout instead of the watchdog acting",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "collectives kept by the flight recorder, dumped on a timeout with "
                                        "TORCH_NCCL_DUMP_ON_TIMEOUT=1",
    },
    "PyTorch (every back end)": {
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL checks that every rank calls the same collectives with the same shapes",
        "GLOO_SOCKET_IFNAME": "the network interface gloo uses (CPU runs, and PyTorch's own bookkeeping)",
    },
}


def collective_backend(device: torch.device | str) -> str:
    """The ``torch.distributed`` back end for processes that each own ``device``: ``"nccl"`` on GPUs
    (NCCL on NVIDIA, RCCL on AMD: PyTorch names both ``nccl``), ``"gloo"`` on the CPU."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def collective_library(backend_name: str) -> str:
    """What a back-end name runs on this machine: ``nccl`` is "RCCL" on ROCm builds, "NCCL" on CUDA."""
    if backend_name == "nccl":
        return "RCCL" if getattr(torch.version, "hip", None) else "NCCL"
    return backend_name


def check_collective_backend(backend_name: str, device: torch.device | str) -> None:
    """Raise ``DeviceUnavailable`` when ``backend_name`` cannot connect processes that own ``device``:
    nccl without a GPU (or in a PyTorch built without it), an unknown name, gloo missing."""
    import torch.distributed as dist

    device = torch.device(device)
    if backend_name == "nccl":
        if device.type != "cuda":
            raise DeviceUnavailable("the nccl back end (NCCL/RCCL) connects GPUs, and these processes run on the CPU: "
                                    "use the gloo back end, or run on GPUs")
        if not dist.is_nccl_available():
            raise DeviceUnavailable("this PyTorch was built without NCCL/RCCL: use the gloo back end")
    elif backend_name == "gloo":
        if not dist.is_gloo_available():
            raise DeviceUnavailable("this PyTorch was built without gloo: use the nccl back end on GPUs")
    else:
        raise DeviceUnavailable(f"unknown back end {backend_name!r}: use nccl (GPUs: NCCL or RCCL) or gloo (CPU)")


def is_out_of_memory(error: BaseException) -> bool:
    """True for the out-of-memory errors of every back end (CUDA, HIP, and the CPU allocator)."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("out of memory" in text or "hip error: out of memory" in text)


@contextlib.contextmanager
def annotate(name: str) -> Iterator[None]:
    """A named range that vendor timelines show (NVTX on NVIDIA, ROCTX on AMD) and that the
    PyTorch profiler records, so that forward, backward and optimizer appear as phases."""
    with torch.profiler.record_function(name):
        if backend() != "cpu":
            torch.cuda.nvtx.range_push(name)  # PyTorch routes this to ROCTX on ROCm builds
            try:
                yield
            finally:
                torch.cuda.nvtx.range_pop()
        else:
            yield


@contextlib.contextmanager
def capture_range(name: str, device: torch.device | str | None = None) -> Iterator[None]:
    """The region a profiler should record: an :func:`annotate` range ``name`` (for ``ncu --nvtx
    --nvtx-include NAME/``, ``nsys --capture-range=nvtx``, a ROCTX marker trace) that also starts and
    stops the driver's profiler API (``cudaProfilerStart``/``Stop``: ``ncu --profile-from-start off``,
    ``nsys --capture-range=cudaProfilerApi``). Without a profiler attached both are no-ops; on the
    CPU it is only a PyTorch-profiler range."""
    device = torch.device(device) if device is not None else get_device()
    on_gpu = device.type == "cuda"
    with annotate(name):
        if on_gpu:
            _profiler_api("start")
        try:
            yield
        finally:
            if on_gpu:
                torch.cuda.synchronize(device)  # the region's kernels run before the capture stops
                _profiler_api("stop")


def _profiler_api(what: str) -> None:
    """``torch.cuda.profiler.start()``/``stop()``; a build without the call (some ROCm releases
    dropped hipProfilerStart) only loses the capture range, never the run."""
    try:
        getattr(torch.cuda.profiler, what)()
    except (RuntimeError, AttributeError):
        pass


# --------------------------------------------------------------------------------------------------
# Datasheet peaks. Dense (no structured sparsity) figures from the vendors' data sheets, in TFLOP/s
# and TB/s. "fp32" is the best plain-FP32 rate (matrix cores where the chip has FP32 matrix math);
# "tf32" is None on chips without TF32. A peak is a ceiling nobody reaches: the course always shows a
# measured ceiling next to it (tinyllama.costs.ceilings).
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DevicePeaks:
    """Datasheet peak rates of one accelerator."""

    name: str
    fp32_tflops: float
    tf32_tflops: float | None
    bf16_tflops: float
    fp16_tflops: float
    memory_bandwidth_tbs: float
    source: str

    def tflops(self, precision: str) -> float | None:
        """Peak TFLOP/s for ``precision`` (``fp32``, ``tf32``, ``bf16``, ``fp16``; dtypes accepted)."""
        key = _precision_key(precision)
        return {"fp32": self.fp32_tflops, "tf32": self.tf32_tflops, "bf16": self.bf16_tflops,
                "fp16": self.fp16_tflops}[key]


def _precision_key(precision: str | torch.dtype) -> str:
    aliases = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", "float32": "fp32",
               "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "amp": "fp16"}
    key = aliases.get(precision, precision)
    if key not in ("fp32", "tf32", "bf16", "fp16"):
        raise ValueError(f"unknown precision {precision!r}: use fp32, tf32, bf16 or fp16")
    return str(key)


# (pattern matched against the device name, peaks). More specific names first.
PEAKS: list[tuple[str, DevicePeaks]] = [
    (r"MI325X", DevicePeaks("AMD Instinct MI325X", 163.4, 653.7, 1307.4, 1307.4, 6.0, "AMD MI325X data sheet")),
    (r"MI300X", DevicePeaks("AMD Instinct MI300X", 163.4, 653.7, 1307.4, 1307.4, 5.3, "AMD MI300X data sheet")),
    (r"MI300A", DevicePeaks("AMD Instinct MI300A", 122.6, 490.3, 980.6, 980.6, 5.3, "AMD MI300A data sheet")),
    (r"MI250X?", DevicePeaks("AMD Instinct MI250X", 95.7, None, 383.0, 383.0, 3.2, "AMD MI250X data sheet")),
    (r"MI210", DevicePeaks("AMD Instinct MI210", 45.3, None, 181.0, 181.0, 1.6, "AMD MI210 data sheet")),
    (r"H200", DevicePeaks("NVIDIA H200", 67.0, 494.7, 989.4, 989.4, 4.8, "NVIDIA H200 data sheet (SXM)")),
    (r"H100.*(PCIe|PCI)", DevicePeaks("NVIDIA H100 PCIe", 51.0, 378.0, 756.0, 756.0, 2.0, "NVIDIA H100 data sheet (PCIe)")),
    (r"H100.*NVL", DevicePeaks("NVIDIA H100 NVL", 60.0, 417.5, 835.0, 835.0, 3.9, "NVIDIA H100 data sheet (NVL)")),
    (r"H100", DevicePeaks("NVIDIA H100 SXM", 67.0, 494.7, 989.4, 989.4, 3.35, "NVIDIA H100 data sheet (SXM)")),
    (r"A100.*40GB", DevicePeaks("NVIDIA A100 40GB", 19.5, 156.0, 312.0, 312.0, 1.555, "NVIDIA A100 data sheet")),
    (r"A100", DevicePeaks("NVIDIA A100 80GB", 19.5, 156.0, 312.0, 312.0, 2.039, "NVIDIA A100 data sheet (SXM)")),
    (r"L40S", DevicePeaks("NVIDIA L40S", 91.6, 183.0, 362.0, 362.0, 0.864, "NVIDIA L40S data sheet")),
]

# ROCm sometimes reports only the architecture; map it to the most common part.
_GFX_ALIASES = {"gfx942": "MI300X", "gfx90a": "MI250X"}


def lookup_peaks(name: str) -> DevicePeaks | None:
    """The datasheet peaks for a device name, or ``None`` when the device is not in the table
    (the honest answer: the course then shows only measured ceilings)."""
    name = _GFX_ALIASES.get(name.split(":")[0].strip(), name)
    for pattern, peaks in PEAKS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return peaks
    return None


def device_peaks(device: torch.device | str | None = None) -> DevicePeaks | None:
    """The datasheet peaks of ``device`` (``None`` for the CPU and for unknown GPUs)."""
    device = get_device(device if device is None else str(device))
    if device.type != "cuda":
        return None
    peaks = lookup_peaks(torch.cuda.get_device_name(device))
    if peaks is None and backend() == "rocm":
        arch = getattr(torch.cuda.get_device_properties(device), "gcnArchName", "")
        peaks = lookup_peaks(arch)
    return peaks


def environment_summary(device: torch.device | str | None = None) -> dict[str, object]:
    """Back end, device and library versions: stamped on every recorded result."""
    import platform

    device = get_device(device if device is None else str(device))
    summary: dict[str, object] = {
        "backend": backend(),
        "device": device_name(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "hip": getattr(torch.version, "hip", None),
        "cuda": torch.version.cuda if backend() == "cuda" else None,
        "visible_devices": os.environ.get(visible_devices_variable()),
    }
    try:
        import triton

        summary["triton"] = triton.__version__
    except ImportError:
        summary["triton"] = None
    return summary
