"""What a kernel's name says, and which launches a replaying profiler selects.

Kernel names of cuDNN/cuBLAS/CUTLASS (NVIDIA), MIOpen/rocBLAS/hipBLASLt (AMD) and PyTorch read into a
class of work, a tensor-core flag and a number format; ``ncu``'s launch-selection options parsed and
replayed on a launch table (``torch_profiler.launch_table``), so a notebook can say which launches a
command would profile; vendor and PyTorch-profiler kernel times compared launch by launch.
Notebook 07's rework (branch nb07) reads its profiles with these.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Sequence

import pandas as pd


CONV_GEMM, BATCH_NORM, ELEMENTWISE, LAYOUT, POOLING, COPY, OTHER = (
    "convolution & GEMM", "batch norm", "element-wise", "layout conversion", "pooling", "memory copy", "other")
KERNEL_CLASSES = (CONV_GEMM, BATCH_NORM, ELEMENTWISE, LAYOUT, POOLING, COPY, OTHER)

# Ordered, the first match wins. Kernel names of cuDNN/cuBLAS/CUTLASS (NVIDIA), MIOpen/rocBLAS/
# hipBLASLt (AMD), PyTorch's own kernels, and the ATen operators a CPU runs instead of kernels.
_CLASS_RULES: list[tuple[str, str]] = [
    (r"^Memcpy|^Memset|memcpy|memset|copy_kernel|direct_copy|aten::(_to_copy|copy_|to|contiguous)$", COPY),
    (r"nchwToNhwc|nhwcToNchw|NCHW2NHWC|NHWC2NCHW|batched_transpose|transpose_|permute", LAYOUT),
    (r"bn_fw|bn_bw|batch_?norm|BatchNorm|BNFwd|BNBwd|MIOpenBatchNorm", BATCH_NORM),
    (r"pool|Pool", POOLING),
    (r"conv|Conv|fprop|dgrad|wgrad|implicit_gemm|gemm|Gemm|GEMM|xmma|cutlass|Cijk_|igemm|winograd|Winograd|"
     r"wgmma|cublas|nvjet|aten::(linear|addmm|mm|matmul|bmm)$", CONV_GEMM),
    (r"elementwise|relu|Relu|add|mul|clamp|sigmoid|silu|gelu|aten::(relu_?|add_?|mul_?|hardtanh_?)$", ELEMENTWISE),
]


def kernel_class(name: str) -> str:
    """The class of work of a kernel (or of a CPU operator) from its name: one of :data:`KERNEL_CLASSES`.

    Names say what a kernel does: cuDNN's convolutions are ``*_fprop_*``/``implicit_gemm`` and run as
    ``xmma``/``cutlass`` GEMMs on NVIDIA (``igemm``, ``Cijk_*`` on AMD), batch norms ``bn_fw_*``, the
    conversions between NCHW and NHWC layouts ``nchwToNhwc``. A name no rule knows is ``other``."""
    for pattern, kind in _CLASS_RULES:
        if re.search(pattern, name):
            return kind
    return OTHER


def class_shares(table: pd.DataFrame, classify=None) -> pd.DataFrame:
    """Time per kernel class of a table with ``kernel`` and ``time_ns`` (or ``total_ns``) columns:
    ``class``, ``launches``, ``time_ms``, ``share_pct``, largest first. ``classify`` defaults to
    :func:`kernel_class`."""
    classify = classify or kernel_class
    time = "time_ns" if "time_ns" in table else "total_ns"
    calls = table["calls"] if "calls" in table else pd.Series(1, index=table.index)
    frame = pd.DataFrame({"class": table["kernel"].map(classify), "launches": calls, "time_ms": table[time] / 1e6})
    shares = frame.groupby("class", as_index=False).sum()
    total = shares["time_ms"].sum()
    shares["share_pct"] = 100.0 * shares["time_ms"] / total if total else 0.0
    return shares.sort_values("time_ms", ascending=False, ignore_index=True)


# Tensor-core (matrix-core) kernels announce themselves: NVIDIA's xmma/HMMA/wgmma/tensorop kernels and
# cuDNN's sm80+/sm90 GEMM engines, AMD's MFMA kernels (hipBLASLt ``MT..._MI..`` tiles, ``mfma``).
_TENSOR_CORE = re.compile(r"xmma|hmma|HMMA|wgmma|tensorop|s1688|s16816|h1688|h16816|i8816|sm[89]0_|_mfma|MFMA|"
                          r"_MI\d+x\d+|tf32|bf16f16|f16f16", re.IGNORECASE)
# CUTLASS's "s1688"/"s16816" tensor-op GEMMs take fp32 inputs and multiply them as TF32.
# MMA shapes name the input format: 16x8x8 with fp32 accumulation (s1688) takes tf32, 16x8x16 (s16816,
# h16816) takes 16-bit inputs, bf16 where the name says so, else fp16.
# cuBLAS's nvjet GEMMs name input-compute-output formats: "tst" (tf32), "hsh" (fp16), "bsb" (bf16).
_PRECISION_TOKENS = [(r"bf16|nvjet_sm\d+_b", "bf16"), (r"tf32|s1688|nvjet_sm\d+_t", "tf32"),
                     (r"f16|fp16|half|h1688|h16816|s16816|hgemm|_HHS_|_HSS_|nvjet_sm\d+_h", "fp16"),
                     (r"f32|fp32|float|sgemm|_SSS_", "fp32")]


def tensor_core_kernel(name: str) -> bool:
    """Whether a kernel's name says it runs on tensor (matrix) cores. A heuristic on the libraries'
    naming (NVIDIA: ``xmma``, ``tensorop``, ``h16816``, ``sm90_*gemm``; AMD: ``MFMA``, ``_MI32x32..``);
    ``ncu``'s ``sm__pipe_tensor_*`` counters or rocprof-compute's MFMA counters are the proof."""
    return bool(_TENSOR_CORE.search(name))


def kernel_precision(name: str) -> str:
    """The number format a kernel's name announces (``tf32``, ``fp16``, ``bf16``, ``fp32``), or ``""``
    when it names none (most element-wise kernels carry it only as a template argument)."""
    for pattern, label in _PRECISION_TOKENS:
        if re.search(pattern, name, re.IGNORECASE):
            return label
    return ""


def short_name(name: str) -> str:
    """``void at::native::vectorized_elementwise_kernel<4, ...>(...)`` -> ``vectorized_elementwise_kernel``;
    tools print namespaces differently (ncu drops ``native::``), the base name is what they share."""
    base = _head(name).split("<")[0].strip()
    return base.split("::")[-1] or name


def _head(name: str) -> str:
    """A kernel's name without ``void``, anonymous namespaces and the argument list."""
    name = re.sub(r"^void ", "", name.strip()).replace("(anonymous namespace)::", "")
    return name.split("(")[0]


def unique_labels(names: Sequence[str], width: int = 48) -> list[str]:
    """Plot labels for kernel names: the base name and its first template arguments, cut to ``width``
    characters, and numbered where two would still read the same (no two bars share a label)."""
    labels = []
    for name in names:
        base = short_name(name)
        head = _head(name)
        detail = head.split("<", 1)[1] if "<" in head else ""
        label = f"{base}<{detail}" if detail else base
        labels.append(label if len(label) <= width else label[: width - 3] + "...")
    counts: dict[str, int] = {}
    seen: dict[str, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    out = []
    for label in labels:
        if counts[label] > 1:
            seen[label] = seen.get(label, 0) + 1
            label = f"{label} #{seen[label]}"
        out.append(label)
    return out


# --------------------------------------------------------------------------------------------------
# Which launches an ncu command profiles
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NcuSelection:
    """The options of an ncu command that choose which kernel launches it profiles."""

    launch_skip: int = 0
    launch_count: int | None = None  # None: every launch (ncu's default)
    from_start: bool = True  # False: only between cudaProfilerStart() and cudaProfilerStop()
    nvtx_include: tuple[str, ...] = ()  # push/pop ranges ("timed/") whose launches are profiled

    @property
    def nvtx_ranges(self) -> tuple[str, ...]:
        """The range names of the ``--nvtx-include`` rules (``"timed/"`` -> ``"timed"``)."""
        return tuple(rule.rstrip("/").split("@")[-1] for rule in self.nvtx_include)


def parse_ncu_selection(options: Sequence[str]) -> NcuSelection:
    """Read the launch-selecting options of an ncu command line: ``--launch-skip N`` (``-s``),
    ``--launch-count N`` (``-c``), ``--profile-from-start on|off``, ``--nvtx`` with ``--nvtx-include
    RANGE/`` (push/pop ranges end in ``/``). Raises ``ValueError`` naming an option it does not know
    (a typo would make ncu refuse to start) or an ``--nvtx-include`` without ``--nvtx``."""
    if isinstance(options, str):
        options = shlex.split(options)
    values = {"launch_skip": 0, "launch_count": None, "from_start": True}
    include: list[str] = []
    nvtx = False
    items = [str(o) for o in options]
    i = 0
    while i < len(items):
        option = items[i]
        key, _, inline = option.partition("=")

        def value() -> str:
            nonlocal i
            if inline:
                return inline
            if i + 1 >= len(items):
                raise ValueError(f"{option} needs a value")
            i += 1
            return items[i]

        if key in ("--launch-skip", "-s"):
            values["launch_skip"] = int(value())
        elif key in ("--launch-count", "-c"):
            values["launch_count"] = int(value())
        elif key == "--profile-from-start":
            answer = value().lower()
            if answer not in ("on", "off", "yes", "no", "true", "false", "1", "0"):
                raise ValueError(f"--profile-from-start takes on or off, not {answer!r}")
            values["from_start"] = answer in ("on", "yes", "true", "1")
        elif key == "--nvtx":
            nvtx = True
        elif key == "--nvtx-include":
            include.append(value())
        else:
            raise ValueError(f"{option!r} is not an option that selects launches: use --launch-skip, "
                             "--launch-count, --profile-from-start, --nvtx and --nvtx-include")
        i += 1
    if include and not nvtx:
        raise ValueError("--nvtx-include needs --nvtx as well: without it ncu ignores the ranges")
    if values["launch_skip"] < 0 or (values["launch_count"] is not None and values["launch_count"] < 1):
        raise ValueError("--launch-skip must be >= 0 and --launch-count >= 1")
    return NcuSelection(values["launch_skip"], values["launch_count"], values["from_start"], tuple(include))


def select_launches(launches: pd.DataFrame, options: Sequence[str] | NcuSelection,
                    capture_range: str = "timed") -> pd.DataFrame:
    """The rows of ``launches`` (in launch order, with a ``range`` column, as
    :func:`tinyllama.profiling.torch_profiler.launch_table` gives) that ncu with ``options`` profiles.

    ``--profile-from-start off`` keeps the launches of ``capture_range`` (the range that starts and
    stops the profiler API, :func:`tinyllama.device.capture_range`), ``--nvtx-include R/`` those of
    range ``R``; ``--launch-skip`` and ``--launch-count`` then apply to the launches that remain, as
    ncu applies them to the launches its filters let through."""
    selection = options if isinstance(options, NcuSelection) else parse_ncu_selection(options)
    eligible = launches
    if not selection.from_start:
        eligible = eligible[eligible["range"] == capture_range]
    if selection.nvtx_ranges:
        eligible = eligible[eligible["range"].isin(selection.nvtx_ranges)]
    end = None if selection.launch_count is None else selection.launch_skip + selection.launch_count
    return eligible.iloc[selection.launch_skip:end]


def describe_selection(selected: pd.DataFrame, launches: pd.DataFrame) -> str:
    """What a selection holds, range by range: "launches 0-59 of 15,023: 60 in 'reference'"."""
    if selected.empty:
        return f"no launch at all of the {len(launches):,} this run made"
    parts = [f"{n} in '{name}'" for name, n in selected["range"].value_counts(sort=False).items()]
    return (f"launches {int(selected['launch'].min())}-{int(selected['launch'].max())} of {len(launches):,}: "
            + ", ".join(parts))


def compare_launch_times(vendor_launches: pd.DataFrame, torch_side: pd.DataFrame, per_forward: int,
                         first_index: int = 0) -> pd.DataFrame:
    """The vendor's profiled launches beside the PyTorch profiler's, launch by launch.

    ``vendor_launches`` (ncu's rows in launch order: ``kernel``, ``gpu__time_duration.sum``) started at
    launch ``first_index`` of the timed range; ``torch_side`` holds PyTorch-profiler launches of the
    timed range (``kernel``, ``index``, ``time_ns``). Both are put at their position in the forward
    (``index % per_forward``); the PyTorch side gives the median over the iterations at each position.
    Columns: ``position``, ``kernel`` (the vendor's name), ``vendor_ns``, ``torch_ns``, ``ratio``
    (vendor / PyTorch) and ``same_kernel`` (the two short names agree: the same launch)."""
    if per_forward < 1:
        raise ValueError("per_forward must be at least 1 (launches of one forward)")
    time = "gpu__time_duration.sum" if "gpu__time_duration.sum" in vendor_launches else "time_ns"
    vendor_side = pd.DataFrame({
        "position": [(first_index + i) % per_forward for i in range(len(vendor_launches))],
        "kernel": vendor_launches["kernel"].to_numpy(), "vendor_ns": vendor_launches[time].to_numpy()})
    torch_rows = torch_side.assign(position=torch_side["index"] % per_forward)
    medians = torch_rows.groupby("position").agg(torch_kernel=("kernel", "first"), torch_ns=("time_ns", "median"))
    table = vendor_side.merge(medians, left_on="position", right_index=True, how="left")
    table["ratio"] = table["vendor_ns"] / table["torch_ns"]
    table["same_kernel"] = [isinstance(t, str) and short_name(v) == short_name(t)
                            for v, t in zip(table["kernel"], table["torch_kernel"])]
    return table.drop(columns="torch_kernel").reset_index(drop=True)

# ---- single questions about a kernel's name -------------------------------------------------------------------

# Kernels that torch.compile (Inductor) generates: ``triton_poi_fused_*`` (point-wise), ``triton_red_fused_*``
# and ``triton_per_fused_*`` (reductions), ``triton_tem_fused_*`` (templates: matmul with fused epilogue),
# ``cpp_fused_*`` on a CPU (recorded as ``graph_N_cpp_fused_*`` when Inductor's ``cpp.enable_kernel_profile``
# is on). Inductor wraps each launch in a profiler range of the kernel's own name.
_FUSED_KERNEL = re.compile(r"^(graph_\d+_)?((triton|cpp)_(poi|red|per|tem|for|mix)_|triton_.*fused|cpp_fused_)")


def is_fused_kernel(name: str) -> bool:
    """Whether ``name`` is a kernel ``torch.compile`` generated (``triton_poi_fused_add_mul_0``). The
    profiler records its launch as a host range of the same name, which is not a user range."""
    return bool(_FUSED_KERNEL.search(name))


# Kernels that only change a tensor's memory layout between NCHW and NHWC. cuDNN names them
# ``cudnn::engines_precompiled::nchwToNhwcKernel`` / ``nhwcToNchwKernel`` (seen on an H200 with cuDNN 9,
# 2026-11-22); MIOpen's are ``batched_transpose_*`` (from its sources, not seen on a GPU here).
_LAYOUT_CONVERSION = re.compile(r"nchwToNhwc|nhwcToNchw|batched_transpose", re.IGNORECASE)


def is_layout_conversion(name: str) -> bool:
    """Whether a device kernel only converts a tensor between the NCHW and NHWC layouts."""
    return bool(_LAYOUT_CONVERSION.search(name))


# Device kernels of cuBLAS/cuBLASLt (gemm, xmma, nvjet, cutlass), hipBLASLt/Tensile (Cijk_) and
# Inductor's matmul templates; attention kernels built on CUTLASS are not GEMM launches of a projection.
_GEMM_KERNEL = re.compile(r"gemm|xmma|nvjet|cutlass|wgmma|Cijk_|triton_tem_fused_.*mm", re.IGNORECASE)
_NOT_GEMM_KERNEL = re.compile(r"fmha|flash|attention|sdpa|softmax", re.IGNORECASE)


def is_gemm_kernel(name: str) -> bool:
    """Whether a device kernel's name is a matrix-multiply kernel (NVIDIA or AMD libraries, Inductor)."""
    return bool(_GEMM_KERNEL.search(name)) and not _NOT_GEMM_KERNEL.search(name)


# kernel_class puts convolutions and matrix products in one class; these name parts tell them apart
# (cuDNN's fprop/dgrad/wgrad and implicit GEMMs, MIOpen's igemm/winograd, oneDNN's convolution ops).
_CONVOLUTION = re.compile(r"conv|fprop|dgrad|wgrad|implicit_gemm|igemm|winograd", re.IGNORECASE)

def is_convolution_kernel(name: str) -> bool:
    """Whether a kernel (or a CPU operator) of :data:`CONV_GEMM` is a convolution rather than a matrix product."""
    return bool(_CONVOLUTION.search(name))
