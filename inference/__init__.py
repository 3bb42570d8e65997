"""A micro-benchmark for torchvision networks: the workshop's inference benchmark.

From a notebook::

    import inference
    result = inference.run("resnet50", batch_size=64, precision="fp16", channels_last=True)
    print(result.summary())
    inference.results_frame([result])          # a pandas DataFrame

From a shell: ``python -m inference --network resnet50 --batch-size 32 --fp16 1`` (``--help``).
"""

from __future__ import annotations

from typing import Any

from inference.benchmark import BenchmarkResult, CheckFailedError, OutOfMemoryError, run_benchmark
from inference.config import BenchmarkConfig, BenchmarkError, ConfigError
from inference.memory import LiveBytesBudget, memory_budget
from inference.networks import NetworkSpec, UnknownNetworkError, get_spec, list_networks
from inference.precision import MANTISSA_BITS, AccuracyReport, compare_precisions, ran_as, round_to_mantissa, tf32_mode
from inference.profilers import FlopsProfile, MissingDependencyError
from inference.results import results_frame
from inference.sweep import MaxBatchResult, SweepResult, find_max_batch_size, run_many, sweep_batch_sizes
from tinyllama.harness.records import append_csv, append_json, load_json

from tinyllama import lazy_exports

# What notebooks import from this package beyond the names above, and the module that holds each: imported on
# first use (tinyllama.lazy_exports), so importing the package stays cheap and a module can move with one line here.
_LAZY: dict[str, str] = {
    "RANGES": ".benchmark",
    "BenchmarkConfig": ".config",
    "CHECK_SAMPLES": ".precision", "MANTISSA_BITS": ".precision", "tf32_enabled": ".precision",
    "latest_scaling_study": ".recorded", "load_scaling_record": ".recorded", "straggler_table": ".recorded",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
__all__ = [
    "AccuracyReport", "BenchmarkConfig", "BenchmarkError", "BenchmarkResult", "CheckFailedError", "ConfigError",
    "FlopsProfile", "LiveBytesBudget", "MANTISSA_BITS", "MaxBatchResult", "MissingDependencyError", "NetworkSpec", "OutOfMemoryError", "SweepResult",
    "UnknownNetworkError", "append_csv", "append_json", "compare_precisions", "find_max_batch_size", "get_spec", "list_networks",
    "load_json", "memory_budget", "ran_as", "results_frame", "round_to_mantissa", "run", "run_benchmark", "run_many",
    "sweep_batch_sizes", "tf32_mode",
]


def run(network: str = "resnet50", **settings: Any) -> BenchmarkResult:
    """Benchmark ``network`` and return the result record; ``settings`` are the fields of
    :class:`BenchmarkConfig` (batch_size, iterations, warmup, mode, precision, channels_last, compile,
    compile_options, input_size, device, kineto, autograd_profiler, flops_prof_step, output_dir, ...)."""
    return run_benchmark(BenchmarkConfig(network=network, **settings))
