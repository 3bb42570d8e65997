"""The vendor's own roofline of a few kernels of one training step, where its tool is installed.

NVIDIA: Nsight Compute (``ncu``) on a known GEMM and the kernels of one step: those that take its time
when their names are given (from a torch.profiler run), else the first ones launched
(:func:`tinyllama.profiling.ncu_step.profile_step_with_ncu`). AMD: ``rocprof-compute profile --roof-only``
on a short ``tinyllama.harness.bench`` run, read from its ``pmc_perf.csv``. Either way the result is a table of
kernels with measured time, FLOPs and DRAM/HBM bytes, which :func:`tinyllama.profiling.roofline.kernel_points`
places against the measured roofs. Where the tool is missing (or on a CPU), :func:`vendor_roofline` runs
nothing and returns the command lines to run on a GPU node that has it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from tinyllama import device as dev
from tinyllama.profiling import vendor


@dataclass
class VendorRoofline:
    """The outcome: ``tool`` (``ncu``, ``rocprof-compute`` or ``None``), whether it ``ran``, the ``reason``
    when it did not, the command lines (``commands``: back end -> shell line), the kernels it measured
    (``kernels``: ``kernel``, ``time_ns``, ``flops``, ``dram_bytes`` or ``hbm_bytes``, ...) and ``details``
    (ncu: the known GEMM's counted / expected FLOPs)."""

    tool: str | None
    ran: bool
    reason: str
    commands: dict[str, str] = field(default_factory=dict)
    kernels: pd.DataFrame | None = None
    details: dict[str, Any] = field(default_factory=dict)


def roofline_commands(version: str, preset: str, precision: str, launch_count: int,
                      out: str | Path = "vendor-roofline", kernels: Sequence[str] | None = None) -> dict[str, str]:
    """The shell lines that take the vendor roofline of ``version``'s step, per back end: ``ncu`` on the known
    GEMM and the first ``launch_count`` kernels of a step, or, given ``kernels``, on the step's first
    ``launch_count`` launches of those kernels (CUDA; the known GEMM then has a run of its own);
    ``rocprof-compute`` on a two-step bench run (ROCm). Written without checking that the tools exist."""
    from tinyllama.profiling.ncu_step import ncu_target

    part = "step" if kernels else "both"
    ncu = vendor.build_command("roofline", ncu_target(version, preset, precision, part), out, name=f"ncu_{version}",
                               backend="cuda", check=False, launch_count=launch_count, profiler_range=True,
                               kernel_regex=vendor.ncu_kernel_regex(kernels) if kernels else None)
    rocm = vendor.build_command("roofline", vendor.bench_target(version, preset, precision, 2), out,
                                name=f"rocprof_{version}", backend="rocm", check=False)
    return {"cuda": ncu.shell(), "rocm": rocm.shell()}


def vendor_roofline(version: str, preset: str, precision: str, launch_count: int, out: str | Path,
                    timeout_s: float = 180.0, say: Callable[[str], None] = print,
                    kernels: Sequence[str] | None = None) -> VendorRoofline:
    """Run this machine's vendor roofline on ``version`` at ``preset`` (see the module's docstring), or say
    why not. ``kernels``: the names of the kernels to profile (ncu; rocprof-compute's roofline run covers
    every kernel). A tool that fails is reported (``ran=False``, its message in ``reason``), never raised."""
    backend = dev.backend()
    commands = roofline_commands(version, preset, precision, launch_count, out, kernels)
    tool = vendor.roofline_tool(backend)
    if tool is None:
        return VendorRoofline(None, False, "no GPU here: vendor profilers measure GPU kernels only", commands)
    info = vendor.detect_tool(tool)
    if not info.available:
        return VendorRoofline(tool, False, f"{tool} is not available: {info.message}", commands)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        if tool == "ncu":
            from tinyllama.profiling.ncu_step import profile_step_with_ncu

            result = profile_step_with_ncu(version, preset, precision, launch_count, out, timeout_s=timeout_s, say=say,
                                           kernels=kernels)
            commands["cuda"] = result.get("command", commands["cuda"])
            return VendorRoofline(tool, True, "", commands, result["points"],
                                  {"known_gemm": result["known_gemm"], "kernels_profiled": result["kernels_profiled"],
                                   "tensor_counters": result["tensor_counters"],
                                   "profiled_kernels": result.get("profiled_kernels", [])})
        command = vendor.build_command("roofline", vendor.bench_target(version, preset, precision, 2), out,
                                       name=f"rocprof_{version}", backend="rocm")
        say(f"rocprof-compute on {version}: {command.shell()}")
        command.run(timeout_s=timeout_s)
        pmc = vendor.read_rocprof_compute_pmc(out)
        return VendorRoofline(tool, True, "", commands, vendor.rocprof_compute_points(pmc),
                              {"kernels_profiled": int(len(pmc))})
    except (RuntimeError, ValueError, FileNotFoundError) as error:
        return VendorRoofline(tool, False, f"{tool} failed: {str(error)[-1500:]}", commands)
