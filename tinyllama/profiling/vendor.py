"""The vendors' profilers, in one place: which are installed, how to run them, how to read them.

AMD: ``rocprofv3`` (kernel statistics, timeline, counters), ``rocprof-sys`` (system timeline),
``rocprof-compute`` (hardware counters, empirical roofline). NVIDIA: ``nsys`` (timeline, kernel statistics)
and ``ncu`` (hardware counters, roofline). Nothing else in the project names these tools, but the two runs
built on them: :mod:`~tinyllama.profiling.ncu_step` and :mod:`~tinyllama.profiling.vendor_roofline`.

- :func:`detect_tools` finds them on ``PATH`` and asks each for its version (a tool that is present
  but fails to start is reported as not working, with its error);
- :func:`build_command` writes the command line for one of the workshop's runs (``kernel_stats``,
  ``timeline``, ``counters``, ``roofline``) with whichever vendor's tool this machine has, or raises
  :class:`ProfilerNotFoundError` naming the missing tool and what to use instead;
- the ``read_*`` functions turn the tools' CSV output into pandas DataFrames, kernel statistics of every
  tool in one shape (:data:`KERNEL_COLUMNS`): rocprofv3 ``--stats``, rocprof-compute's ``roofline.csv``
  and ``pmc_perf.csv``, ``ncu --csv`` (details page, long, or raw page, wide) and ``nsys stats --format
  csv`` (``cuda_gpu_kern_sum``). Kernel names are read in :mod:`~tinyllama.profiling.kernel_names`.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shlex
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd

from tinyllama import device as dev
from tinyllama.profiling import kernel_names

# --------------------------------------------------------------------------------------------------
# Detection
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolSpec:
    """What the course needs to know about one profiler."""

    name: str
    vendor: str  # "rocm" or "cuda"
    executables: tuple[str, ...]  # the first one found on PATH is used
    purpose: str
    install: str


TOOLS: dict[str, ToolSpec] = {
    "rocprofv3": ToolSpec("rocprofv3", "rocm", ("rocprofv3",),
                          "kernel statistics, timeline trace, hardware counters",
                          "part of ROCm (rocprofiler-sdk): `module load rocm`, or add /opt/rocm/bin to PATH"),
    "rocprof-sys": ToolSpec("rocprof-sys", "rocm", ("rocprof-sys-sample", "rocprof-sys-run", "rocprof-sys-python"),
                            "system timeline (CPU, GPU, runtime) in Perfetto",
                            "ROCm Systems Profiler: `module load rocprofiler-systems`"),
    "rocprof-compute": ToolSpec("rocprof-compute", "rocm", ("rocprof-compute",),
                                "hardware counters, memory chart, empirical roofline",
                                "ROCm Compute Profiler: `module load rocprofiler-compute`"),
    "nsys": ToolSpec("nsys", "cuda", ("nsys",), "timeline trace and kernel statistics",
                     "NVIDIA Nsight Systems (CUDA toolkit or a standalone installer)"),
    "ncu": ToolSpec("ncu", "cuda", ("ncu",), "hardware counters, speed-of-light and roofline per kernel",
                    "NVIDIA Nsight Compute (CUDA toolkit or a standalone installer)"),
}


@dataclass
class ToolInfo:
    """One profiler as found on this machine."""

    name: str
    vendor: str
    path: str | None
    version: str | None
    works: bool
    message: str

    @property
    def available(self) -> bool:
        """Found on PATH and answered ``--version``."""
        return self.path is not None and self.works


class ProfilerNotFoundError(RuntimeError):
    """A vendor profiler that a run needs is not installed (or does not start) on this machine."""


_VERSION = re.compile(r"version\s*:?\s*v?(\d+(?:\.\d+)+)", re.IGNORECASE)
_ANY_VERSION = re.compile(r"(?<![\w.])v?(\d+(?:\.\d+)+)")


def parse_version(text: str) -> str | None:
    """The version number in a tool's ``--version`` text ("... Version 2024.1.1.0 (build ...)")."""
    match = _VERSION.search(text) or _ANY_VERSION.search(text)
    return match.group(1) if match else None


def detect_tool(name: str, timeout_s: float = 30.0) -> ToolInfo:
    """Find profiler ``name`` (a key of :data:`TOOLS`) and ask it for its version."""
    if name not in TOOLS:
        raise ValueError(f"unknown profiler {name!r}: choose one of {', '.join(TOOLS)}")
    spec = TOOLS[name]
    path = next((p for p in map(shutil.which, spec.executables) if p), None)
    if path is None:
        return ToolInfo(name, spec.vendor, None, None, False,
                        f"{name} not found on PATH ({spec.install})")
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as error:
        return ToolInfo(name, spec.vendor, path, None, False, f"{path} does not start: {error}")
    text = (done.stdout or "") + (done.stderr or "")
    if done.returncode != 0:
        last = text.strip().splitlines()[-1] if text.strip() else f"exit status {done.returncode}"
        return ToolInfo(name, spec.vendor, path, parse_version(text), False, f"{path} --version failed: {last}")
    return ToolInfo(name, spec.vendor, path, parse_version(text), True, "ok")


def detect_tools(names: Iterable[str] | None = None) -> pd.DataFrame:
    """Every vendor profiler the course uses, found or not: one row each, with path and version."""
    infos = {name: detect_tool(name) for name in names or TOOLS}
    return pd.DataFrame([{"tool": name, "vendor": i.vendor, "available": i.available, "version": i.version, "path": i.path,
                          "purpose": TOOLS[name].purpose, "message": i.message} for name, i in infos.items()])


# --------------------------------------------------------------------------------------------------
# Command builders
# --------------------------------------------------------------------------------------------------

TASKS = ("kernel_stats", "timeline", "counters", "roofline")

# Which tool does which run, per back end, in order of preference.
_CHOICES: dict[str, dict[str, tuple[str, ...]]] = {
    "rocm": {"kernel_stats": ("rocprofv3",), "timeline": ("rocprofv3", "rocprof-sys"),
             "counters": ("rocprof-compute", "rocprofv3"), "roofline": ("rocprof-compute",)},
    "cuda": {"kernel_stats": ("nsys", "ncu"), "timeline": ("nsys",), "counters": ("ncu",), "roofline": ("ncu",)},
}

def roofline_tool(backend: str | None = None) -> str | None:
    """The tool that takes the roofline on ``backend`` (default this machine's): ``ncu`` on CUDA,
    ``rocprof-compute`` on ROCm, ``None`` on a CPU."""
    choices = _CHOICES.get(backend or dev.backend())
    return choices["roofline"][0] if choices else None


# Counters per kernel that place it on a roofline: time, DRAM traffic, and the floating-point work
# of the CUDA cores (thread instructions; an FMA is two FLOPs) and of the tensor cores.
NCU_ROOFLINE_METRICS: tuple[str, ...] = (
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__sass_thread_inst_executed_op_fadd_pred_on.sum",
    "sm__sass_thread_inst_executed_op_fmul_pred_on.sum",
    "sm__sass_thread_inst_executed_op_ffma_pred_on.sum",
    "sm__sass_thread_inst_executed_op_hadd_pred_on.sum",
    "sm__sass_thread_inst_executed_op_hmul_pred_on.sum",
    "sm__sass_thread_inst_executed_op_hfma_pred_on.sum",
)
# Tensor-core operation counters; their names differ between Nsight Compute releases and chips, so
# they are asked for separately and dropped when the installed ncu does not know them.
NCU_TENSOR_METRICS: tuple[str, ...] = (
    "sm__ops_path_tensor_src_bf16_dst_fp32.sum",
    "sm__ops_path_tensor_src_fp16_dst_fp32.sum",
    "sm__ops_path_tensor_src_tf32_dst_fp32.sum",
)
NCU_COUNTER_SECTIONS: tuple[str, ...] = ("SpeedOfLight", "MemoryWorkloadAnalysis", "Occupancy", "LaunchStats")
# The counters that say what limits a kernel, by their documented names (the metrics behind ncu's
# SpeedOfLight, Occupancy and LaunchStats sections): time, SM and memory throughput as a percentage of
# the peak sustained rate ("speed of light"), DRAM's share and its achieved bandwidth, achieved and
# theoretical occupancy, registers per thread. The ``counters`` run asks for exactly these (raw page).
NCU_COUNTER_METRICS: tuple[str, ...] = (
    "gpu__time_duration.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes.sum.per_second",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__maximum_warps_per_active_cycle_pct",
    "launch__registers_per_thread",
)


@dataclass
class ProfilerCommand:
    """A vendor-profiler run: ``argv`` (then ``then``, e.g. ``nsys stats``), its environment, and
    where its results land."""

    task: str
    tool: str
    argv: list[str]
    outputs: str
    env: dict[str, str] = field(default_factory=dict)
    then: list[list[str]] = field(default_factory=list)
    note: str = ""

    def shell(self) -> str:
        """The whole run as one shell line, to paste into a terminal."""
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        lines = [shlex.join(self.argv)] + [shlex.join(argv) for argv in self.then]
        return (prefix + " " if prefix else "") + " && ".join(lines)

    def run(self, timeout_s: float | None = None) -> subprocess.CompletedProcess[str]:
        """Run it (and its follow-ups), capturing output; raises ``RuntimeError`` with the tool's last
        lines when a step fails."""
        done = None
        for argv in [self.argv, *self.then]:
            # Own process group: on a timeout the profiler and the program it runs are stopped together.
            process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       env={**os.environ, **self.env}, start_new_session=True)
            try:
                stdout, stderr = process.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
                raise RuntimeError(f"{argv[0]} did not finish within {timeout_s:.0f} s and was stopped: "
                                   "profile fewer kernels (launch_count) or a smaller problem") from None
            done = subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)
            if done.returncode != 0:
                tail = "\n".join(((done.stdout or "") + (done.stderr or "")).strip().splitlines()[-15:])
                raise RuntimeError(f"{argv[0]} failed with exit status {done.returncode}:\n{tail}")
        assert done is not None
        return done


def bench_target(version: str = "v1", preset: str = "tiny", precision: str = "fp32", num_steps: int = 5,
                 *extra: str) -> list[str]:
    """The workshop's run to profile: ``python -m tinyllama.harness.bench`` with this Python, quiet (no progress
    bar in the profiler's output). Pass it as ``target`` to :func:`build_command`."""
    import sys

    return [sys.executable, "-m", "tinyllama.harness.bench", "--version", version, "--preset", preset,
            "--precision", precision, "--num-steps", str(num_steps), "--quiet", *extra]


def _missing_message(task: str, wanted: Sequence[str], backend: str, infos: dict[str, ToolInfo]) -> str:
    found = "; ".join(infos[n].message for n in wanted if n in infos)
    return (f"{task.replace('_', ' ')} on {backend.upper()} needs {' or '.join(wanted)}, which this machine "
            f"does not have ({found}). The PyTorch profiler (tinyllama.profiling.profile_steps) works "
            "everywhere and shows operator and kernel times.")


def build_command(
    task: str,
    target: Sequence[str],
    out_dir: str | os.PathLike[str],
    *,
    name: str = "tinyllama",
    backend: str | None = None,
    tool: str | None = None,
    check: bool = True,
    launch_skip: int = 0,
    launch_count: int = 50,
    kernel_regex: str | None = None,
    profiler_range: bool = False,
    metrics: Sequence[str] | None = None,
    selection: Sequence[str] | None = None,
    clock_control: str | None = None,
    kernels: int = 5,
    tools: dict[str, ToolInfo] | None = None,
) -> ProfilerCommand:
    """The command line that profiles ``target`` (an argv, e.g. ``["python", "-m", "tinyllama.harness.bench",
    ...]``) for ``task`` with this machine's vendor tool.

    ``backend`` defaults to this machine's (``tinyllama.device.backend()``); ``tool`` picks one tool
    instead of the preferred one. With ``check`` (the default) the tool must be installed and working,
    else :class:`ProfilerNotFoundError` says which is missing; ``check=False`` only writes the command
    (to show it on a machine without the tool). ``launch_skip``/``launch_count``/``kernel_regex`` limit
    ncu to a few kernels (it replays each one many times); ``profiler_range`` profiles only between
    ``torch.cuda.profiler.start()`` and ``stop()``; ``metrics`` replaces ncu's default metric list
    (:data:`NCU_ROOFLINE_METRICS` + :data:`NCU_TENSOR_METRICS` for the roofline); ``selection``
    replaces ncu's launch options by yours (e.g. ``["--profile-from-start", "off", "--launch-count",
    "60"]``, checked by :func:`kernel_names.parse_ncu_selection`); ``clock_control`` (``"base"``, ncu's
    default, or ``"none"``) sets the clocks of an ncu ``kernel_stats`` or ``counters`` run (the roofline
    runs at ``"none"``). An ncu ``counters`` run reads :data:`NCU_COUNTER_METRICS` (raw page, one row per
    launch: :func:`ncu_counters`); a rocprof-compute ``counters`` run is followed by one ``analyze`` per
    kernel (the ``kernels`` longest, as ``analyze --list-stats`` numbers them) that saves its
    speed-of-light table (:func:`read_rocprof_compute_sol`).
    """
    if task not in TASKS:
        raise ValueError(f"unknown profiling task {task!r}: choose one of {', '.join(TASKS)}")
    if not target:
        raise ValueError("nothing to profile: give the command to run, e.g. ['python', 'train.py']")
    backend = backend or dev.backend()
    if backend not in _CHOICES:
        raise ProfilerNotFoundError(
            "there is no GPU here, so no vendor profiler applies: use the PyTorch profiler "
            "(tinyllama.profiling.profile_steps), which times operators on the CPU too.")
    wanted = (tool,) if tool else _CHOICES[backend][task]
    for name_ in wanted:
        if name_ not in TOOLS:
            raise ValueError(f"unknown profiler {name_!r}: choose one of {', '.join(TOOLS)}")
    chosen = wanted[0]
    if check:
        infos = tools or {n: detect_tool(n) for n in wanted}
        usable = [n for n in wanted if n in infos and infos[n].available]
        if not usable:
            raise ProfilerNotFoundError(_missing_message(task, wanted, backend, infos))
        chosen = usable[0]
    out = Path(out_dir)
    target = list(target)
    builder = {"rocprofv3": _rocprofv3, "rocprof-sys": _rocprof_sys, "rocprof-compute": _rocprof_compute,
               "nsys": _nsys, "ncu": _ncu}[chosen]
    if clock_control not in (None, "base", "none"):
        raise ValueError(f"clock_control must be 'base' (ncu's default) or 'none', not {clock_control!r}")
    return builder(task, target, out, name, launch_skip=launch_skip, launch_count=launch_count,
                   kernel_regex=kernel_regex, profiler_range=profiler_range, metrics=metrics,
                   selection=selection, clock_control=clock_control, kernels=kernels)


def _rocprofv3(task: str, target: list[str], out: Path, name: str, **_: object) -> ProfilerCommand:
    base = ["rocprofv3", "-d", str(out), "-o", name]
    if task == "kernel_stats":
        argv = base + ["--kernel-trace", "--stats", "--truncate-kernels", "--output-format", "csv", "--", *target]
        return ProfilerCommand(task, "rocprofv3", argv, f"{out}/**/{name}_kernel_stats.csv",
                               note="read with read_rocprofv3_kernel_stats(out_dir)")
    if task == "timeline":
        argv = base + ["--runtime-trace", "--output-format", "pftrace", "--", *target]
        return ProfilerCommand(task, "rocprofv3", argv, f"{out}/**/{name}_results.pftrace",
                               note="open the .pftrace file at https://ui.perfetto.dev")
    # Counters without rocprof-compute: the raw counters that give FLOPs and HBM traffic.
    argv = base + ["--pmc", "SQ_INSTS_VALU_ADD_F32", "SQ_INSTS_VALU_MUL_F32", "SQ_INSTS_VALU_FMA_F32",
                   "SQ_INSTS_VALU_MFMA_MOPS_BF16", "--output-format", "csv", "--", *target]
    return ProfilerCommand(task, "rocprofv3", argv, f"{out}/**/{name}_counter_collection.csv")


def _rocprof_sys(task: str, target: list[str], out: Path, name: str, **_: object) -> ProfilerCommand:
    env = {"ROCPROFSYS_OUTPUT_PATH": str(out), "ROCPROFSYS_OUTPUT_PREFIX": f"{name}-",
           "ROCPROFSYS_TRACE": "true", "ROCPROFSYS_PROFILE": "true"}
    return ProfilerCommand(task, "rocprof-sys", ["rocprof-sys-sample", "--", *target], f"{out}/**/*.proto",
                           env=env, note="open the .proto trace at https://ui.perfetto.dev")


def _rocprof_compute(task: str, target: list[str], out: Path, name: str, *, kernel_regex: str | None = None,
                     kernels: int = 5, **_: object) -> ProfilerCommand:
    workload = out / name
    argv = ["rocprof-compute", "profile", "-n", name, "-p", str(workload)]
    if task == "roofline":
        argv.append("--roof-only")
    if kernel_regex:
        argv += ["-k", kernel_regex]
    argv += ["--", *target]
    if task == "counters":
        if kernels < 1:
            raise ValueError("kernels must be at least 1: how many of the longest kernels to analyze")
        # One analysis per kernel (ids of `analyze --list-stats`, longest first), each saving its tables
        # as CSV (--save-dfs); -b 2 keeps the System Speed-of-Light panel.
        then = [["rocprof-compute", "analyze", "-p", str(workload), "-k", str(k), "-b", "2",
                 "--save-dfs", str(workload / f"sol_kernel_{k}")] for k in range(kernels)]
        return ProfilerCommand(
            task, "rocprof-compute", argv, f"{workload}/sol_kernel_*/2.1_Speed-of-Light.csv", then=then,
            note="read with rocprof_compute_counters(sorted(workload.glob('sol_kernel_*')))")
    return ProfilerCommand(
        task, "rocprof-compute", argv, f"{workload}/roofline.csv and {workload}/pmc_perf.csv",
        then=[["rocprof-compute", "analyze", "-p", str(workload)]],
        note="read with read_rocprof_compute_roofline() and rocprof_compute_points()")


def _nsys(task: str, target: list[str], out: Path, name: str, *, profiler_range: bool = False,
          **_: object) -> ProfilerCommand:
    report = out / name
    argv = ["nsys", "profile", "--trace=cuda,nvtx,osrt", "--sample=none", "--force-overwrite=true",
            f"--output={report}"]
    if profiler_range:
        argv += ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
    argv += target
    if task == "timeline":
        return ProfilerCommand(task, "nsys", argv, f"{report}.nsys-rep",
                               note="open the .nsys-rep in Nsight Systems; NVTX ranges show forward/backward/optimizer")
    stats = ["nsys", "stats", "--report", "cuda_gpu_kern_sum", "--format", "csv", "--force-export=true",
             "--output", str(report), f"{report}.nsys-rep"]
    return ProfilerCommand(task, "nsys", argv, f"{report}_cuda_gpu_kern_sum.csv", then=[stats],
                           note="read with read_nsys_kernel_summary()")


def _ncu(task: str, target: list[str], out: Path, name: str, *, launch_skip: int = 0, launch_count: int = 50,
         kernel_regex: str | None = None, profiler_range: bool = False, metrics: Sequence[str] | None = None,
         selection: Sequence[str] | None = None, clock_control: str | None = None, **_: object) -> ProfilerCommand:
    csv_path = out / f"{name}_ncu_{task}.csv"
    argv = ["ncu", "--csv", "--print-units", "base", "--log-file", str(csv_path)]
    if selection is not None:
        kernel_names.parse_ncu_selection(selection)  # a clear error for an option ncu would reject, before it runs
        argv += list(selection)
    else:
        argv += ["--launch-skip", str(launch_skip), "--launch-count", str(launch_count)]
        argv += ["--profile-from-start", "off"] if profiler_range else []
    if kernel_regex:
        argv += ["--kernel-name", f"regex:{kernel_regex}"]
    if task == "kernel_stats":
        argv += ["--clock-control", clock_control] if clock_control else []
        argv += ["--metrics", ",".join(metrics or ["gpu__time_duration.sum"])]
    elif task == "roofline":
        # Real clocks (ncu locks them to base by default), so durations match an unprofiled run.
        argv += ["--clock-control", "none", "--metrics", ",".join(metrics or NCU_ROOFLINE_METRICS + NCU_TENSOR_METRICS)]
    else:
        # Raw page: one row per launch, one column per metric, a row of units under the header.
        argv += ["--clock-control", clock_control] if clock_control else []
        argv += ["--page", "raw", "--metrics", ",".join(metrics or NCU_COUNTER_METRICS)]
    argv += target
    note = ("ncu replays every kernel many times: keep --launch-count small. Read with read_ncu_csv(); "
            "for the GUI add -o REPORT (a .ncu-rep) or use --set roofline.")
    return ProfilerCommand(task, "ncu", argv, str(csv_path), note=note)


# --------------------------------------------------------------------------------------------------
# Parsers
# --------------------------------------------------------------------------------------------------

KERNEL_COLUMNS = ("kernel", "calls", "total_ns", "mean_ns", "min_ns", "max_ns", "percent")


def _kernel_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Sort by total time, fill the percentage if the tool gave none, keep the common columns."""
    frame = frame.copy()
    for column in KERNEL_COLUMNS[1:]:
        if column not in frame:
            frame[column] = float("nan")
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    if frame["percent"].isna().all() and len(frame):
        frame["percent"] = 100.0 * frame["total_ns"] / frame["total_ns"].sum()
    if frame["mean_ns"].isna().all() and len(frame):
        frame["mean_ns"] = frame["total_ns"] / frame["calls"]
    frame["calls"] = frame["calls"].astype("int64")
    return frame[list(KERNEL_COLUMNS)].sort_values("total_ns", ascending=False).reset_index(drop=True)


def _find_file(path: str | os.PathLike[str], pattern: str) -> Path:
    """``path`` itself, or the newest file matching ``pattern`` below it."""
    path = Path(path)
    if path.is_dir():
        found = sorted(path.rglob(pattern), key=lambda p: p.stat().st_mtime)
        if not found:
            raise FileNotFoundError(f"no {pattern} under {path}: did the profiler run write its output there?")
        return found[-1]
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    return path


def _csv_after_header(text: str, first_column: str) -> str:
    """The CSV that starts at the header line whose first field is ``first_column`` (tools print
    progress lines, and the profiled program its own output, before it)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().lstrip('"').startswith(first_column):
            return "\n".join(lines[i:])
    raise ValueError(f"no CSV header starting with {first_column!r} found")


def _numbers(series: pd.Series) -> pd.Series:
    """Numbers that may carry thousands separators ("5,850,000") or "n/a"."""
    return pd.to_numeric(series.astype(str).str.replace(",", "", regex=False).str.strip(), errors="coerce")


def read_rocprofv3_kernel_stats(path: str | os.PathLike[str]) -> pd.DataFrame:
    """``rocprofv3 --kernel-trace --stats`` output (``*_kernel_stats.csv``: Name, Calls,
    TotalDurationNs, AverageNs, Percentage, MinNs, MaxNs, StdDev) in :data:`KERNEL_COLUMNS`.
    ``path`` may be the file or the ``-d`` output folder."""
    raw = pd.read_csv(_find_file(path, "*kernel_stats.csv"))
    missing = {"Name", "Calls", "TotalDurationNs"} - set(raw.columns)
    if missing:
        raise ValueError(f"not a rocprofv3 kernel_stats.csv: columns {sorted(missing)} are missing")
    return _kernel_table(raw.rename(columns={
        "Name": "kernel", "Calls": "calls", "TotalDurationNs": "total_ns", "AverageNs": "mean_ns",
        "MinNs": "min_ns", "MaxNs": "max_ns", "Percentage": "percent"}))


def read_nsys_kernel_summary(path: str | os.PathLike[str]) -> pd.DataFrame:
    """``nsys stats --report cuda_gpu_kern_sum --format csv`` output in :data:`KERNEL_COLUMNS`.

    Reads both the current column names (``Time (%)``, ``Total Time (ns)``, ``Instances``, ``Avg (ns)``,
    ...) and the older ones (``Time(%)``, ``Calls``, ``Average``, ...)."""
    path = _find_file(path, "*cuda_gpu_kern_sum*.csv")
    text = _csv_after_header(path.read_text(), "Time")
    raw = pd.read_csv(io.StringIO(text), dtype=str)
    raw.columns = [c.strip() for c in raw.columns]
    names = {"Time (%)": "percent", "Time(%)": "percent", "Total Time (ns)": "total_ns", "Total Time": "total_ns",
             "Instances": "calls", "Calls": "calls", "Avg (ns)": "mean_ns", "Average": "mean_ns",
             "Min (ns)": "min_ns", "Minimum": "min_ns", "Max (ns)": "max_ns", "Maximum": "max_ns", "Name": "kernel"}
    raw = raw.rename(columns={c: names[c] for c in raw.columns if c in names})
    if not {"kernel", "total_ns", "calls"} <= set(raw.columns):
        raise ValueError(f"not an nsys cuda_gpu_kern_sum CSV: columns are {list(raw.columns)}")
    for column in KERNEL_COLUMNS[1:]:
        if column in raw:
            raw[column] = _numbers(raw[column])
    return _kernel_table(raw)


# ncu prints units with SI prefixes unless asked for base units; bring everything to bytes,
# nanoseconds and plain counts.
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_TIME = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}


def _unit_factor(unit: str) -> tuple[float, str]:
    """(factor, base unit) for an ncu unit: "Kbyte" -> (1e3, "byte"), "usecond" -> (1e3, "nsecond")."""
    unit = (unit or "").strip()
    if unit in _TIME:
        return _TIME[unit], "nsecond"
    match = re.fullmatch(r"([KMGTP]?)(byte|inst|warp|cycle|sector|request|thread|block)(/second)?", unit)
    if match:
        prefix, base, per = match.groups()
        return _PREFIX[prefix], base + (per or "")
    return 1.0, unit


def read_ncu_csv(path_or_text: str | os.PathLike[str]) -> pd.DataFrame:
    """``ncu --csv`` output as one row per profiled kernel launch.

    Accepts the details page (the default: one row per metric, columns ``ID``, ``Kernel Name``,
    ``Section Name``, ``Metric Name``, ``Metric Unit``, ``Metric Value``) and the raw page
    (``--page raw``: one column per metric, a second header row of units). Values are converted to
    base units (bytes, nanoseconds, counts); ``frame.attrs["units"]`` maps each metric to its unit.
    Lines printed before the header (``==PROF==`` messages, the program's output) are skipped.
    """
    text = str(path_or_text)
    if "\n" not in text:
        text = _find_file(text, "*.csv").read_text()
    body = _csv_after_header(text, "ID")
    rows = list(csv.reader(io.StringIO(body)))
    header = rows[0]
    if "Metric Name" in header:
        return _ncu_long(pd.DataFrame(rows[1:], columns=header))
    return _ncu_wide(header, rows[1:])


_NCU_IDENTITY = {"ID": "id", "Kernel Name": "kernel", "Block Size": "block_size", "Grid Size": "grid_size",
                 "Device": "device", "Stream": "stream", "Process ID": "pid"}
_NCU_CONTEXT = {"Process Name", "Host Name", "Context", "CC", "Kernel Time", "Section Name"}


def _ncu_long(raw: pd.DataFrame) -> pd.DataFrame:
    raw = raw[raw["ID"].astype(str).str.strip().str.fullmatch(r"\d+")]
    factors = raw["Metric Unit"].map(lambda u: _unit_factor(u)[0])
    raw = raw.assign(value=_numbers(raw["Metric Value"]) * factors)
    units = {m: _unit_factor(u)[1] for m, u in zip(raw["Metric Name"], raw["Metric Unit"])}
    identity = [c for c in _NCU_IDENTITY if c in raw.columns]
    wide = raw.pivot_table(index=identity, columns="Metric Name", values="value", aggfunc="first").reset_index()
    wide.columns.name = None
    wide = wide.rename(columns=_NCU_IDENTITY)
    wide["id"] = wide["id"].astype(int)
    wide = wide.sort_values("id").reset_index(drop=True)
    wide.attrs["units"] = units
    return wide


def _ncu_wide(header: list[str], rows: list[list[str]]) -> pd.DataFrame:
    units_row = rows[0] if rows and not rows[0][0].strip().isdigit() else None
    data = pd.DataFrame(rows[1:] if units_row else rows, columns=header)
    units = dict(zip(header, units_row)) if units_row else {}
    out = data[[c for c in _NCU_IDENTITY if c in data.columns]].rename(columns=_NCU_IDENTITY)
    metrics: dict[str, pd.Series] = {}  # joined at once: a raw page has hundreds of columns
    for column in header:
        if column in _NCU_IDENTITY or column in _NCU_CONTEXT:
            continue
        factor, base = _unit_factor(units.get(column, ""))
        values = _numbers(data[column])
        if values.notna().any():
            metrics[column] = values * factor
            units[column] = base
    out = pd.concat([out, pd.DataFrame(metrics, index=data.index)], axis=1)
    out["id"] = out["id"].astype(int)
    out.attrs["units"] = {k: v for k, v in units.items() if k in out.columns}
    return out.sort_values("id").reset_index(drop=True)


def ncu_kernel_stats(frame: pd.DataFrame) -> pd.DataFrame:
    """Per-kernel statistics (:data:`KERNEL_COLUMNS`) from ncu launches with ``gpu__time_duration.sum``."""
    if "gpu__time_duration.sum" not in frame:
        raise ValueError("these ncu results have no gpu__time_duration.sum: profile with --metrics gpu__time_duration.sum")
    grouped = frame.groupby("kernel")["gpu__time_duration.sum"]
    table = pd.DataFrame({"calls": grouped.count(), "total_ns": grouped.sum(), "mean_ns": grouped.mean(),
                          "min_ns": grouped.min(), "max_ns": grouped.max()}).reset_index()
    return _kernel_table(table)


_SASS = "sm__sass_thread_inst_executed_op_{}_pred_on.sum"


def ncu_roofline_points(frame: pd.DataFrame) -> pd.DataFrame:
    """Each profiled launch as a roofline point: time, DRAM bytes, FLOPs, intensity, rates.

    FLOPs = CUDA-core floating-point thread instructions (add and multiply count 1, fused multiply-add 2;
    fp32 and fp16) plus the tensor-core operations of every ``sm__ops_path_tensor_*`` counter present.
    A metric the run did not collect counts as zero, so a run without tensor counters under-counts the
    FLOPs of GEMM kernels (``tensor_counters`` says whether they were there).
    """
    needed = {"gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum"}
    missing = needed - set(frame.columns)
    if missing:
        raise ValueError(f"ncu results lack {sorted(missing)}: profile with the metrics of NCU_ROOFLINE_METRICS")

    def col(name: str) -> pd.Series:
        return frame[name].fillna(0.0) if name in frame else pd.Series(0.0, index=frame.index)

    cuda_core = sum(col(_SASS.format(op)) * (2.0 if op.endswith("fma") else 1.0)
                    for op in ("fadd", "fmul", "ffma", "hadd", "hmul", "hfma"))
    tensor_columns = [c for c in frame.columns if c.startswith("sm__ops_path_tensor")]
    tensor = sum((col(c) for c in tensor_columns), pd.Series(0.0, index=frame.index))
    seconds = frame["gpu__time_duration.sum"] * 1e-9
    dram = col("dram__bytes_read.sum") + col("dram__bytes_write.sum")
    flops = cuda_core + tensor
    points = pd.DataFrame({
        "id": frame["id"], "kernel": frame["kernel"], "time_ns": frame["gpu__time_duration.sum"],
        "dram_bytes": dram, "flops": flops, "tensor_flops": tensor,
    })
    points["intensity"] = points["flops"] / points["dram_bytes"].where(points["dram_bytes"] > 0)
    points["tflops"] = points["flops"] / seconds / 1e12
    points["tbs"] = points["dram_bytes"] / seconds / 1e12
    for pct in ("sm__throughput.avg.pct_of_peak_sustained_elapsed",
                "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"):
        if pct in frame:
            points[pct.split(".")[0].replace("__", "_") + "_pct"] = frame[pct]
    points.attrs["tensor_counters"] = tensor_columns
    return points


def read_rocprof_compute_roofline(path: str | os.PathLike[str]) -> pd.DataFrame:
    """rocprof-compute's empirical ceilings (``roofline.csv``: ``device``, ``HBMBw``, ``L2Bw``, ``L1Bw``,
    ``LDSBw``, ``FP32Flops``, ``MFMABF16Flops``, ... in GB/s and GFLOP/s) as one row per device, with
    the headline ceilings added in TB/s and TFLOP/s (``hbm_tbs``, ``fp32_tflops``, ``mfma_bf16_tflops``...)."""
    raw = pd.read_csv(_find_file(path, "roofline.csv"))
    raw.columns = [c.strip() for c in raw.columns]
    if "HBMBw" not in raw:
        raise ValueError(f"not a rocprof-compute roofline.csv (no HBMBw column): {list(raw.columns)}")
    out = raw.copy()
    for level in ("HBM", "MALL", "L2", "L1", "LDS"):
        if f"{level}Bw" in raw:
            out[f"{level.lower()}_tbs"] = pd.to_numeric(raw[f"{level}Bw"], errors="coerce") / 1e3
    for column, key in (("FP32Flops", "fp32"), ("FP64Flops", "fp64"), ("MFMAF32Flops", "mfma_fp32"),
                        ("MFMABF16Flops", "mfma_bf16"), ("MFMAF16Flops", "mfma_fp16"), ("MFMAF64Flops", "mfma_fp64")):
        if column in raw:
            out[f"{key}_tflops"] = pd.to_numeric(raw[column], errors="coerce") / 1e3
    return out


def read_rocprof_compute_pmc(path: str | os.PathLike[str]) -> pd.DataFrame:
    """rocprof-compute's per-dispatch counters (``pmc_perf.csv``: ``Dispatch_ID``, ``Kernel_Name``,
    ``Start_Timestamp``, ``End_Timestamp`` and one column per hardware counter)."""
    raw = pd.read_csv(_find_file(path, "pmc_perf.csv"))
    missing = {"Kernel_Name", "Start_Timestamp", "End_Timestamp"} - set(raw.columns)
    if missing:
        raise ValueError(f"not a rocprof-compute pmc_perf.csv: columns {sorted(missing)} are missing")
    return raw


def rocprof_compute_points(pmc: pd.DataFrame) -> pd.DataFrame:
    """Roofline points per kernel from rocprof-compute counters, the way its roofline counts them.

    FLOPs: every VALU add, multiply and transcendental is 64 operations (one per lane of a wavefront),
    an FMA 128, and each MFMA "MOPS" unit 512 FLOPs. HBM bytes: the L2-to-memory read and write requests
    by size (MI300: ``TCC_EA0_*``, plus ``TCC_BUBBLE_sum`` 128-byte reads; MI200: ``TCC_EA_*``)."""
    def col(name: str) -> pd.Series:
        return pmc[name].fillna(0.0) if name in pmc else pd.Series(0.0, index=pmc.index)

    valu = sum(64 * (col(f"SQ_INSTS_VALU_ADD_{p}") + col(f"SQ_INSTS_VALU_MUL_{p}") + 2 * col(f"SQ_INSTS_VALU_FMA_{p}")
                     + col(f"SQ_INSTS_VALU_TRANS_{p}")) for p in ("F16", "F32", "F64"))
    mfma = sum(512 * col(f"SQ_INSTS_VALU_MFMA_MOPS_{p}") for p in ("F16", "BF16", "F32", "F64"))
    if "TCC_EA0_RDREQ_sum" in pmc:
        bubble = col("TCC_BUBBLE_sum")
        hbm = (bubble * 128 + col("TCC_EA0_RDREQ_32B_sum") * 32
               + (col("TCC_EA0_RDREQ_sum") - bubble - col("TCC_EA0_RDREQ_32B_sum")) * 64
               + (col("TCC_EA0_WRREQ_sum") - col("TCC_EA0_WRREQ_64B_sum")) * 32 + col("TCC_EA0_WRREQ_64B_sum") * 64)
    else:
        hbm = (col("TCC_EA_RDREQ_32B_sum") * 32 + (col("TCC_EA_RDREQ_sum") - col("TCC_EA_RDREQ_32B_sum")) * 64
               + col("TCC_EA_WRREQ_64B_sum") * 64 + (col("TCC_EA_WRREQ_sum") - col("TCC_EA_WRREQ_64B_sum")) * 32)
    per_dispatch = pd.DataFrame({"kernel": pmc["Kernel_Name"], "time_ns": pmc["End_Timestamp"] - pmc["Start_Timestamp"],
                                 "flops": valu + mfma, "mfma_flops": mfma, "hbm_bytes": hbm})
    points = per_dispatch.groupby("kernel", sort=False).agg(
        calls=("time_ns", "size"), time_ns=("time_ns", "sum"), flops=("flops", "sum"),
        mfma_flops=("mfma_flops", "sum"), hbm_bytes=("hbm_bytes", "sum")).reset_index()
    seconds = points["time_ns"] * 1e-9
    points["intensity"] = points["flops"] / points["hbm_bytes"].where(points["hbm_bytes"] > 0)
    points["tflops"] = points["flops"] / seconds / 1e12
    points["tbs"] = points["hbm_bytes"] / seconds / 1e12
    return points.sort_values("time_ns", ascending=False).reset_index(drop=True)


# --------------------------------------------------------------------------------------------------
# Counters: what limits a kernel
# --------------------------------------------------------------------------------------------------

# The columns of a counter table, whichever tool measured it (NaN where a tool has no such counter).
COUNTER_COLUMNS = ("duration_ns", "sm_pct", "memory_pct", "dram_pct", "dram_bytes_per_s",
                   "achieved_occupancy_pct", "theoretical_occupancy_pct", "registers_per_thread")
_NCU_COUNTER_NAMES = dict(zip(NCU_COUNTER_METRICS, COUNTER_COLUMNS))

# A unit "busy" above this share of its peak: Nsight Compute's own speed-of-light rule calls a kernel
# whose compute and memory throughput both stay below 60% of peak latency-limited.
HIGH_PCT = 60.0
LIMITERS: dict[str, str] = {
    "memory": "memory-bound: the memory system (DRAM or the caches) is the busiest unit, above "
              f"{HIGH_PCT:.0f}% of its peak and above the SMs' throughput",
    "compute": f"compute-bound: the SMs' throughput is above {HIGH_PCT:.0f}% of peak and above memory's",
    "latency": f"latency-bound: neither the SMs nor memory reach {HIGH_PCT:.0f}% of peak; the kernel waits "
               "(too few warps in flight to hide memory latency, too little work per launch, dependencies)",
}
# What makes a kernel of each class faster.
REMEDIES: dict[str, str] = {
    "memory": "move fewer bytes: fuse it with its neighbour or fold it away (one pass over memory less), "
              "or use a smaller number format",
    "compute": "do less or cheaper arithmetic: tensor cores, a lower precision, a better algorithm",
    "latency": "keep more work in flight: more blocks or warps (occupancy), more work per launch, fewer "
               "dependent steps",
}


def limiter(sm_pct: float, memory_pct: float, high: float = HIGH_PCT) -> str:
    """What limits a kernel, from its speed-of-light throughputs (percent of peak): ``"memory"`` when
    the memory throughput (DRAM or a cache, the busiest) reaches ``high`` and is at least the SMs',
    ``"compute"`` when the SMs' throughput reaches ``high`` and exceeds memory's, else ``"latency"``
    (neither unit busy: the kernel waits). NaN counts as 0."""
    sm = 0.0 if pd.isna(sm_pct) else float(sm_pct)
    memory = 0.0 if pd.isna(memory_pct) else float(memory_pct)
    if max(sm, memory) < high:
        return "latency"
    return "memory" if memory >= sm else "compute"


def ncu_counters(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per profiled launch (``id``, ``kernel`` and :data:`COUNTER_COLUMNS`) from an ncu run with
    :data:`NCU_COUNTER_METRICS` (``read_ncu_csv``). ``memory_pct`` is the larger of the memory throughput
    (the busiest of DRAM, L1 and L2) and DRAM's; a metric the run lacks is NaN, and a run without
    the time or the two throughputs is refused."""
    needed = ["gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
              "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"]
    missing = [m for m in needed if m not in frame]
    if missing:
        raise ValueError(f"these ncu results lack {missing}: profile with --metrics "
                         f"{','.join(NCU_COUNTER_METRICS)} (vendor.build_command('counters', ...))")
    out = frame[["id", "kernel"]].copy()
    for metric, column in _NCU_COUNTER_NAMES.items():
        out[column] = pd.to_numeric(frame[metric], errors="coerce") if metric in frame else float("nan")
    out["memory_pct"] = out[["memory_pct", "dram_pct"]].max(axis=1)
    return out.reset_index(drop=True)


def kernel_counters(launches: pd.DataFrame, high: float = HIGH_PCT) -> pd.DataFrame:
    """Per kernel name, from per-launch counters (:func:`ncu_counters`): ``launches``, ``total_ns``, the
    time-weighted mean of every percentage and of the DRAM bandwidth (a long launch counts more), the
    registers per thread, and ``limiter`` (:func:`limiter`); longest first."""
    if launches.empty:
        raise ValueError("no launch to summarise: did ncu profile any kernel (check its kernel filter)?")
    rows = []
    for name, group in launches.groupby("kernel", sort=False):
        weight = group["duration_ns"].fillna(0.0)
        row = {"kernel": name, "launches": len(group), "total_ns": weight.sum(),
               "duration_ns": group["duration_ns"].mean()}
        for column in COUNTER_COLUMNS[1:]:
            values = group[column]
            ok = values.notna() & (weight > 0)
            row[column] = float((values[ok] * weight[ok]).sum() / weight[ok].sum()) if ok.any() else float("nan")
        rows.append(row)
    table = pd.DataFrame(rows)
    table["limiter"] = [limiter(s, m, high) for s, m in zip(table["sm_pct"], table["memory_pct"])]
    return table.sort_values("total_ns", ascending=False, ignore_index=True)


def ncu_kernel_regex(names: Iterable[str]) -> str:
    """An ncu ``--kernel-name regex:`` value that matches these kernels (by their function name, ncu's
    default ``--kernel-name-base``) and no other: ``^(a|b)$``."""
    bases = sorted({kernel_names.short_name(n) for n in names})
    if not bases:
        raise ValueError("no kernel names given: pick the kernels to profile first")
    return "^(" + "|".join(re.escape(b) for b in bases) + ")$"


def counter_selection(timed: pd.DataFrame, names: Iterable[str], limit: int, per_kernel: int = 2,
                      capture_range: str = "timed") -> tuple[list[str], pd.DataFrame]:
    """The ncu options that profile the kernels ``names`` in the timed range, and the launches of
    ``timed`` (launch order, ``kernel`` column) they select.

    ncu applies ``--launch-count`` to the launches its kernel filter lets through, so the count is the
    smallest that reaches ``per_kernel`` launches of every kernel (matched by function name), at most
    ``limit``. Returns (options without the kernel filter, selected rows)."""
    bases = {kernel_names.short_name(n) for n in names}
    if limit < 1:
        raise ValueError("limit must be at least 1 launch")
    rows = timed[timed["range"] == capture_range] if "range" in timed else timed
    eligible = rows[rows["kernel"].map(kernel_names.short_name).isin(bases)]
    seen: dict[str, int] = {}
    count = len(eligible)
    for i, name in enumerate(eligible["kernel"].map(kernel_names.short_name)):
        seen[name] = seen.get(name, 0) + 1
        if len(seen) == len(bases) and min(seen.values()) >= per_kernel:
            count = i + 1
            break
    count = max(1, min(count, limit))
    return ["--profile-from-start", "off", "--launch-count", str(count)], eligible.head(count)


def read_rocprof_compute_sol(path: str | os.PathLike[str]) -> pd.DataFrame:
    """rocprof-compute's System Speed-of-Light table as ``analyze --save-dfs DIR`` writes it
    (``2.1_Speed-of-Light.csv``: ``Metric``, ``Avg``, ``Unit``, ``Peak``, ``Pct of Peak``), indexed by metric,
    values as numbers (a blank cell, an unavailable counter, is NaN)."""
    raw = pd.read_csv(_find_file(path, "2.1_Speed-of-Light.csv"), dtype=str, keep_default_na=False)
    raw.columns = [c.strip() for c in raw.columns]
    missing = {"Metric", "Avg", "Pct of Peak"} - set(raw.columns)
    if missing:
        raise ValueError(f"not a rocprof-compute speed-of-light table: columns {sorted(missing)} are missing")
    table = raw.assign(Metric=raw["Metric"].str.strip()).set_index("Metric")
    for column in ("Avg", "Peak", "Pct of Peak"):
        if column in table:
            table[column] = pd.to_numeric(table[column].str.strip(), errors="coerce")
    return table


def _sol(table: pd.DataFrame, names: Sequence[str], column: str) -> float:
    """The first of ``names`` in a speed-of-light table (metric names vary a little between releases)."""
    for name in names:
        if name in table.index and pd.notna(table.loc[name, column]):
            return float(table.loc[name, column])
    return float("nan")


def rocprof_compute_counters(folders: Iterable[str | os.PathLike[str]], high: float = HIGH_PCT) -> pd.DataFrame:
    """One row per analyzed kernel (a folder of ``analyze -k K --save-dfs``) in the columns of
    :func:`kernel_counters`: ``sm_pct`` is the busier of VALU and MFMA utilisation, ``dram_pct`` and
    ``dram_bytes_per_s`` the HBM traffic (L2-Fabric read + write bandwidth against the HBM peak), ``memory_pct``
    the busiest of HBM, L2 and vector L1, ``achieved_occupancy_pct`` the wavefront occupancy. The kernel's
    name and time come from the folder's ``0.1_Top_Kernels.csv`` when it is there."""
    rows = []
    for folder in folders:
        folder = Path(folder)
        sol = read_rocprof_compute_sol(folder)
        hbm_pct = sum(_sol(sol, [m], "Pct of Peak") for m in ("L2-Fabric Read BW", "L2-Fabric Write BW"))
        hbm_gbs = sum(_sol(sol, [m], "Avg") for m in ("L2-Fabric Read BW", "L2-Fabric Write BW"))
        sm = max(_sol(sol, ["VALU Utilization", "VALU Util"], "Pct of Peak"),
                 _sol(sol, ["MFMA Utilization", "MFMA Util"], "Pct of Peak"))
        caches = [_sol(sol, [m], "Pct of Peak") for m in ("L2 Cache BW", "vL1D Cache BW", "Vector L1D Cache BW")]
        memory = max([hbm_pct, *[c for c in caches if pd.notna(c)]])
        row = {"kernel": folder.name, "launches": float("nan"), "total_ns": float("nan"), "duration_ns": float("nan"),
               "sm_pct": sm, "memory_pct": memory, "dram_pct": hbm_pct, "dram_bytes_per_s": hbm_gbs * 1e9,
               "achieved_occupancy_pct": _sol(sol, ["Wavefront Occupancy", "Wave Occupancy"], "Pct of Peak"),
               "theoretical_occupancy_pct": float("nan"), "registers_per_thread": float("nan")}
        top = folder / "0.1_Top_Kernels.csv"
        if top.exists():
            kernels = pd.read_csv(top)
            if len(kernels) and "Kernel_Name" in kernels:
                first = kernels.iloc[0]
                row.update(kernel=str(first["Kernel_Name"]), launches=first.get("Count", float("nan")),
                           total_ns=first.get("Sum(ns)", float("nan")), duration_ns=first.get("Mean(ns)", float("nan")))
        rows.append(row)
    if not rows:
        raise ValueError("no analyze output given: pass the sol_kernel_* folders of the counters run")
    table = pd.DataFrame(rows)
    table["limiter"] = [limiter(s, m, high) for s, m in zip(table["sm_pct"], table["memory_pct"])]
    return table


# The counters of a real run, kept with the package for machines without ncu (a CPU, a node without
# the tool): the raw ncu CSV of notebook 07's counters run and a JSON of where and when it was taken.
RECORDED_COUNTERS = Path(__file__).with_name("data") / "resnet50_ncu_counters.csv"


def recorded_counters(csv_path: str | os.PathLike[str] | None = None) -> tuple[pd.DataFrame, dict]:
    """The recorded per-launch counters (:func:`ncu_counters`) and their description (``device``,
    ``date``, ``command``, ... from the JSON beside the CSV; ``{}`` without one). Reads
    :data:`RECORDED_COUNTERS` unless ``csv_path`` names another file; raises ``FileNotFoundError`` when
    there is none."""
    import json

    path = Path(csv_path) if csv_path is not None else RECORDED_COUNTERS
    if not path.exists():
        raise FileNotFoundError(f"no recorded counters at {path}")
    meta_path = path.with_suffix(".json")
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    return ncu_counters(read_ncu_csv(path)), meta
