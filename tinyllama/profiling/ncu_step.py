"""Nsight Compute (ncu) on one TinyLLaMA training step, checked against a known answer.

The profiled program (``python -m tinyllama.profiling.ncu_step --version v1 --preset medium``) runs a
few unprofiled steps (compilation, autotuning, optimizer state), then, between cudaProfilerStart and
Stop, an n x n x n bf16 matrix multiply whose FLOPs ncu must count as 2 n^3, and one training step
(``--part gemm`` or ``--part step``: only one of the two in the profiled range).
:func:`profile_step_with_ncu` runs it under ncu and reads the result as kernel roofline points
(``tinyllama.profiling.vendor``): the first kernels of the range, or, given the names of the kernels that
take the step's time (from a torch.profiler run: ``roofline.top_kernels``), launches of those kernels only
(ncu's ``--kernel-name regex:``), the known GEMM then profiled in a run of its own.
``benchmarks/gpu/profiling_gpu.py`` and notebook 18 call it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from tinyllama import device as dev
from tinyllama.config import get_preset
from tinyllama.models import build
from tinyllama.profiling import vendor
from tinyllama.training import TrainingStep, make_batches

ROOT = Path(__file__).resolve().parents[2]  # the checkout that holds the package
KNOWN_GEMM = 4096  # n of the n x n x n bf16 product profiled first: 2 n^3 FLOPs


PARTS = ("both", "gemm", "step")


def run_profiled_step(version: str, preset_name: str, precision: str, device: str | None = None,
                      part: str = "both") -> None:
    """A known GEMM, then one training step, between cudaProfilerStart and Stop (ncu profiles only that).
    ``part`` ``gemm`` or ``step`` puts only that one in the profiled range (``gemm`` builds no model)."""
    if part not in PARTS:
        raise ValueError(f"part must be one of {', '.join(PARTS)}, not {part!r}")
    device_ = dev.get_device(device)
    if part != "gemm":
        preset = get_preset(preset_name)
        step = TrainingStep(build(version, preset.model).to(device_), precision, device_)
        batches = make_batches(preset.model, preset.batch_size, preset.seq_len, count=2, device=device_)
        for i in range(3):  # compile, autotune, optimizer state: before the profiled range
            step(*batches[i % 2])
    a = torch.randn(KNOWN_GEMM, KNOWN_GEMM, device=device_, dtype=torch.bfloat16)
    b = torch.randn(KNOWN_GEMM, KNOWN_GEMM, device=device_, dtype=torch.bfloat16)
    dev.synchronize(device_)
    torch.cuda.profiler.start()
    if part != "step":
        with dev.annotate("known_gemm"):
            a @ b
    if part != "gemm":
        step(*batches[0])
    dev.synchronize(device_)
    torch.cuda.profiler.stop()


def ncu_target(version: str, preset: str, precision: str, part: str = "both") -> list[str]:
    """The profiled program's command line (``part``: see :func:`run_profiled_step`)."""
    target = [sys.executable, "-m", __name__, "--version", version, "--preset", preset, "--precision", precision]
    return target + (["--part", part] if part != "both" else [])


def _run_ncu(target: list[str], name: str, launch_count: int, csv_path: Path, timeout_s: float,
             say: Callable[[str], None], result: dict[str, Any], kernel_regex: str | None = None) -> None:
    """One ncu run of ``target`` into ``csv_path``, with the tensor-core counters if this ncu knows them,
    else without (``result["tensor_counters_error"]`` says why); ``result["command"]`` is the line run."""
    for metrics in (None, list(vendor.NCU_ROOFLINE_METRICS)):
        with tempfile.TemporaryDirectory() as tmp:
            command = vendor.build_command("roofline", target, tmp, name=name, backend="cuda",
                                           launch_count=launch_count, profiler_range=True, metrics=metrics,
                                           kernel_regex=kernel_regex)
            # Inductor's parallel compile workers would each start under ncu: compile in-process instead.
            command.env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
            # The profiled program imports this package, installed or not.
            command.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
            result["command"] = command.shell()
            what = "launches of the selected kernels" if kernel_regex else "kernels"
            say(f"{name}: {launch_count} {what} ({'with' if metrics is None else 'without'} tensor counters)")
            began = time.perf_counter()
            try:
                command.run(timeout_s=timeout_s)
            except RuntimeError as error:
                text = str(error)
                log = Path(command.outputs)
                if log.exists():
                    text += "\n" + "\n".join(log.read_text().splitlines()[-10:])
                if metrics is None and "metric" in text.lower():
                    result["tensor_counters_error"] = text[-1500:]
                    continue  # this ncu lacks the tensor counters: try without them
                raise RuntimeError(text[-3000:]) from None
            result["seconds"] = result.get("seconds", 0.0) + time.perf_counter() - began
            shutil.copy(command.outputs, csv_path)
            return


def profile_step_with_ncu(version: str, preset: str, precision: str, launch_count: int, out: Path,
                          timeout_s: float, say: Callable[[str], None] = print,
                          kernels: Sequence[str] | None = None) -> dict[str, Any]:
    """Profile ``version``'s step under ncu and read the result into ``out/ncu_VERSION.csv`` and a dict;
    without tensor counters when this ncu does not know them. Raises ``RuntimeError`` with ncu's message
    when ncu fails.

    Without ``kernels``: one run, the known GEMM and the step's first ``launch_count`` kernels. With
    ``kernels`` (names as torch.profiler or ncu print them: the kernels that take the step's time), the
    step's first ``launch_count`` launches of those kernels only (``--kernel-name regex:``,
    :func:`vendor.ncu_kernel_regex`), and the known GEMM in a short run of its own (its cuBLAS kernel need
    not be one of them). ``result["selected"]`` then lists the kernels asked for and
    ``result["profiled_kernels"]`` those ncu reached."""
    out = Path(out)
    result: dict[str, Any] = {"version": version, "launch_count": launch_count}
    csv_path = out / f"ncu_{version}.csv"
    if not kernels:
        _run_ncu(ncu_target(version, preset, precision), f"ncu {version}", launch_count, csv_path, timeout_s, say,
                 result)
        frame = vendor.read_ncu_csv(csv_path)
        points = vendor.ncu_roofline_points(frame)
        # The known GEMM is the first launch in the range (the largest of the first two, should cuBLAS add one).
        first = int(points["flops"].head(2).idxmax())
        gemm, step_points, step_frame = points.loc[first], points.loc[first + 1:], frame.loc[first + 1:]
        result["kernels_profiled"] = len(frame)
    else:
        regex = vendor.ncu_kernel_regex(kernels)
        result["selected"], result["kernel_regex"] = list(kernels), regex
        gemm_csv = out / "ncu_known_gemm.csv"
        gemm_result: dict[str, Any] = {}
        _run_ncu(ncu_target(version, preset, precision, "gemm"), "ncu known GEMM", 2, gemm_csv,
                 min(timeout_s, 120.0), say, gemm_result)
        gemm_points = vendor.ncu_roofline_points(vendor.read_ncu_csv(gemm_csv))
        gemm = gemm_points.loc[int(gemm_points["flops"].idxmax())]
        _run_ncu(ncu_target(version, preset, precision, "step"), f"ncu {version}", launch_count, csv_path, timeout_s,
                 say, result, kernel_regex=regex)
        result["seconds"] = result.get("seconds", 0.0) + gemm_result.get("seconds", 0.0)
        if "tensor_counters_error" in gemm_result:
            result.setdefault("tensor_counters_error", gemm_result["tensor_counters_error"])
        step_frame = vendor.read_ncu_csv(csv_path)
        step_points = vendor.ncu_roofline_points(step_frame)
        points = step_points
        result["profiled_kernels"] = sorted(set(step_points["kernel"]))
        result["kernels_profiled"] = len(step_frame) + 1  # and the known GEMM of its own run
    result["tensor_counters"] = points.attrs.get("tensor_counters", [])
    expected = 2 * KNOWN_GEMM**3
    result["known_gemm"] = {"kernel": gemm["kernel"], "expected_flops": expected, "counted_flops": float(gemm["flops"]),
                            "ratio": float(gemm["flops"]) / expected, "time_us": float(gemm["time_ns"]) / 1e3,
                            "tflops": float(gemm["tflops"]), "dram_bytes": float(gemm["dram_bytes"])}
    result["points"] = step_points  # the step's kernels
    stats = vendor.ncu_kernel_stats(step_frame).head(15)
    result["kernel_stats"] = json.loads(stats.to_json(orient="records"))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """The profiled program that ncu starts."""
    parser = argparse.ArgumentParser(description=run_profiled_step.__doc__)
    parser.add_argument("--version", default="v1")
    parser.add_argument("--preset", default="medium")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--device", default=None)
    parser.add_argument("--part", default="both", choices=PARTS,
                        help="what the profiled range holds: the known GEMM and the step, or one of them")
    args = parser.parse_args(argv)
    run_profiled_step(args.version, args.preset, args.precision, args.device, args.part)
    return 0


if __name__ == "__main__":
    sys.exit(main())
