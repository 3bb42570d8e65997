"""Nsight Compute (ncu) on one TinyLLaMA training step, checked against a known answer.

The profiled program (``python -m tinyllama.profiling.ncu_step --version v1 --preset medium``) runs a
few unprofiled steps (compilation, autotuning, optimizer state), then, between cudaProfilerStart and
Stop, an n x n x n bf16 matrix multiply whose FLOPs ncu must count as 2 n^3, and one training step.
:func:`profile_step_with_ncu` runs it under ncu and reads the result as kernel roofline points
(``tinyllama.profiling.vendor``); ``gpu/profiling_gpu.py`` calls it.
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


def run_profiled_step(version: str, preset_name: str, precision: str, device: str | None = None) -> None:
    """A known GEMM, then one training step, between cudaProfilerStart and Stop (ncu profiles only that)."""
    device_ = dev.get_device(device)
    preset = get_preset(preset_name)
    step = TrainingStep(build(version, preset.model).to(device_), precision, device_)
    batches = make_batches(preset.model, preset.batch_size, preset.seq_len, count=2, device=device_)
    for i in range(3):  # compile, autotune, optimizer state: before the profiled range
        step(*batches[i % 2])
    a = torch.randn(KNOWN_GEMM, KNOWN_GEMM, device=device_, dtype=torch.bfloat16)
    b = torch.randn(KNOWN_GEMM, KNOWN_GEMM, device=device_, dtype=torch.bfloat16)
    dev.synchronize(device_)
    torch.cuda.profiler.start()
    with dev.annotate("known_gemm"):
        a @ b
    step(*batches[0])
    dev.synchronize(device_)
    torch.cuda.profiler.stop()


def profile_step_with_ncu(version: str, preset: str, precision: str, launch_count: int, out: Path,
                          timeout_s: float, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Profile ``version``'s step under ncu (its first ``launch_count`` kernels after the known GEMM)
    and read the result into ``out/ncu_VERSION.csv`` and a dict; without tensor counters when this
    ncu does not know them. Raises ``RuntimeError`` with ncu's message when ncu fails."""
    target = [sys.executable, "-m", __name__, "--version", version, "--preset", preset, "--precision", precision]
    csv_path = out / f"ncu_{version}.csv"
    result: dict[str, Any] = {"version": version, "launch_count": launch_count}
    for metrics in (None, list(vendor.NCU_ROOFLINE_METRICS)):
        with tempfile.TemporaryDirectory() as tmp:
            command = vendor.build_command("roofline", target, tmp, name=f"ncu_{version}", backend="cuda",
                                           launch_count=launch_count, profiler_range=True, metrics=metrics)
            # Inductor's parallel compile workers would each start under ncu: compile in-process instead.
            command.env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
            # The profiled program imports this package, installed or not.
            command.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
            result["command"] = command.shell()
            say(f"ncu {version}: {launch_count} kernels ({'with' if metrics is None else 'without'} tensor counters)")
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
            result["seconds"] = time.perf_counter() - began
            shutil.copy(command.outputs, csv_path)
            break
    frame = vendor.read_ncu_csv(csv_path)
    points = vendor.ncu_roofline_points(frame)
    result["kernels_profiled"] = len(frame)
    result["tensor_counters"] = points.attrs.get("tensor_counters", [])
    # The known GEMM is the first launch in the range (the largest of the first two, should cuBLAS add one).
    first = int(points["flops"].head(2).idxmax())
    gemm = points.loc[first]
    expected = 2 * KNOWN_GEMM**3
    result["known_gemm"] = {"kernel": gemm["kernel"], "expected_flops": expected, "counted_flops": float(gemm["flops"]),
                            "ratio": float(gemm["flops"]) / expected, "time_us": float(gemm["time_ns"]) / 1e3,
                            "tflops": float(gemm["tflops"]), "dram_bytes": float(gemm["dram_bytes"])}
    result["points"] = points.loc[first + 1:]  # the step's kernels
    stats = vendor.ncu_kernel_stats(frame.loc[first + 1:]).head(15)
    result["kernel_stats"] = json.loads(stats.to_json(orient="records"))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """The profiled program that ncu starts."""
    parser = argparse.ArgumentParser(description=run_profiled_step.__doc__)
    parser.add_argument("--version", default="v1")
    parser.add_argument("--preset", default="medium")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    run_profiled_step(args.version, args.preset, args.precision, args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
