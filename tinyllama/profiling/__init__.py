"""The instruments of the course: profilers, FLOP counters, memory views and the roofline.

- :mod:`~tinyllama.profiling.torch_profiler`: the PyTorch profiler with a schedule, traces for
  Perfetto/TensorBoard, operator tables, the CPU/device overhead test, time by phase and category;
- :mod:`~tinyllama.profiling.memory`: memory by kind, per phase, and over a step (timeline, snapshot);
- :mod:`~tinyllama.profiling.flops`: DeepSpeed's FLOPS profiler as data, ``torch.utils.flop_counter``,
  and the cross-check between them;
- :mod:`~tinyllama.profiling.vendor`: rocprofv3, rocprof-sys, rocprof-compute, nsys and ncu (detection,
  command lines, output parsers): the one place that knows about vendor tools;
- :mod:`~tinyllama.profiling.roofline`: measured roofs, operator and kernel points, the roofline plot;
- :mod:`~tinyllama.profiling.vendor_roofline`: the vendor's roofline of a few kernels of a step (``ncu``,
  ``rocprof-compute``), or the command lines where the tool is missing.
- :mod:`~tinyllama.profiling.timeline`: one profiled step from its trace: kernels with the operators that
  launched them, allocations by operator, the layout-conversion kernels, and their plots (imported as a module);
- :mod:`~tinyllama.profiling.compiled`: what ``torch.compile`` did: the calls of Inductor's generated code
  (kernels with the operators they fused, library calls kept), cold and warm first calls, operator fates
  and launches per step, the break-even point of a compile (imported as a module, ``profiling.compiled``).
"""

from tinyllama.profiling.flops import (
    CountComparison, DeepSpeedMissing, DeepSpeedProfile, FlopCount, compare_counts, count_flops,
    deepspeed_available, deepspeed_profile, training_flop_table,
)
from tinyllama.profiling.memory import (
    memory_breakdown, memory_snapshot, memory_timeline, phase_memory, plot_memory_timeline,
    plot_snapshot_timeline, snapshot_timeline,
)
from tinyllama.profiling.attribution import attribute
from tinyllama.profiling.roofline import (
    Roofs, category_summary, classify, compare_points, count_operator_work, kernel_points, measure_roofs,
    operator_points, plot_roofline, roofline_points,
)
from tinyllama.profiling.torch_profiler import CATEGORIES, Overhead, ProfileRun, categorize, profile_steps
from tinyllama.profiling.vendor import (
    KERNEL_COLUMNS, ProfilerCommand, ProfilerNotFoundError, bench_target, build_command, detect_tools, ncu_kernel_stats,
    ncu_roofline_points, read_ncu_csv, read_nsys_kernel_summary, read_rocprof_compute_pmc,
    read_rocprof_compute_roofline, read_rocprofv3_kernel_stats, rocprof_compute_points,
)

from tinyllama import lazy_exports

# What notebooks import from this package beyond the names above, and the module that holds each: imported on
# first use (tinyllama.lazy_exports), so importing the package stays cheap and a module can move with one line here.
_LAZY: dict[str, str] = {
    "backend_from_operators": ".attention", "peak_memory_bytes": ".attention", "saved_tensor_bytes": ".attention",
    "sdpa": ".attention", "sdpa_backend": ".attention",
    "allows_tf32": ".attribution",
    "lane_names": ".communication", "trace_timeline": ".communication",
    "short_kernel_name": ".roofline",
    "CPU_NOTE": ".sdpa_reasons", "backend_verdicts": ".sdpa_reasons",
    "CATEGORIES": ".torch_profiler", "ELEMENTWISE": ".torch_profiler", "GEMM": ".torch_profiler",
    "REDUCTION": ".torch_profiler", "activities": ".torch_profiler", "launch_table": ".torch_profiler",
    "profile_steps": ".torch_profiler",
    "roofline_commands": ".vendor_roofline", "run_vendor_roofline": ".vendor_roofline:vendor_roofline",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
__all__ = [
    "CATEGORIES", "KERNEL_COLUMNS", "CountComparison", "attribute", "DeepSpeedMissing", "DeepSpeedProfile", "FlopCount",
    "Overhead", "ProfileRun", "ProfilerCommand", "ProfilerNotFoundError", "Roofs", "bench_target", "build_command",
    "categorize", "category_summary", "classify", "compare_counts", "compare_points", "count_flops",
    "count_operator_work", "deepspeed_available", "deepspeed_profile", "detect_tools", "kernel_points",
    "measure_roofs", "memory_breakdown", "memory_snapshot", "memory_timeline", "ncu_kernel_stats",
    "ncu_roofline_points", "operator_points", "phase_memory", "plot_memory_timeline", "plot_roofline",
    "plot_snapshot_timeline", "profile_steps", "read_ncu_csv", "read_nsys_kernel_summary",
    "read_rocprof_compute_pmc", "read_rocprof_compute_roofline", "read_rocprofv3_kernel_stats",
    "rocprof_compute_points", "roofline_points", "snapshot_timeline", "training_flop_table",
]
