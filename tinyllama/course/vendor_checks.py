"""Checks of notebook 07's exercises (vendor profilers): a kernel-name classifier, the options that
restrict ncu to the timed region, and the PyTorch-profiler launches to compare with ncu's.

Each check prints what was wrong in the participant's terms (which kernels, which launches, which
phase of the run) and fails under ``WORKSHOP_STRICT=1`` like every checkpoint."""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import pandas as pd

from tinyllama.course.checkpoints import checkpoint
from tinyllama.profiling import kernel_names

# Kernel names of both vendors and of a CPU, with their class: a classifier must read these too.
SAMPLE_KERNELS: dict[str, str] = {
    "void cudnn::bn_fw_inf_1C11_kernel_NCHW<float, float, 1, 1>(float, float)": kernel_names.BATCH_NORM,
    "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1": kernel_names.CONV_GEMM,
    "sm80_xmma_fprop_implicit_gemm_indexed_wo_smem_f16f16_f32_nhwckrsc_nhwc_tilesize128x16x64": kernel_names.CONV_GEMM,
    "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>(Params)": kernel_names.CONV_GEMM,
    "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true>(int)": kernel_names.LAYOUT,
    "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar>(int)":
        kernel_names.ELEMENTWISE,
    "void at::native::(anonymous namespace)::max_pool_forward_nchw<float, float>(int, float const*)": kernel_names.POOLING,
    "Memcpy HtoD (Pinned -> Device)": kernel_names.COPY,
    "MIOpenBatchNormFwdInferSpatialEst": kernel_names.BATCH_NORM,
    "Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0": kernel_names.CONV_GEMM,
    "naive_conv_ab_nonpacked_fwd_nchw_float_double_float": kernel_names.CONV_GEMM,
    "batched_transpose_32x16_half": kernel_names.LAYOUT,
    "aten::conv2d": kernel_names.CONV_GEMM,
    "aten::batch_norm": kernel_names.BATCH_NORM,
    "aten::relu_": kernel_names.ELEMENTWISE,
    "aten::add_": kernel_names.ELEMENTWISE,
    "aten::max_pool2d": kernel_names.POOLING,
    "aten::linear": kernel_names.CONV_GEMM,
}

# What each range of an inference-benchmark run is (inference.benchmark.RANGES), for the feedback.
RANGE_NOTES: dict[str, str] = {
    "reference": "the fp32 eager forward of the correctness check, on the first few samples of the batch only",
    "warm-up": "the warm-up iterations, where cuDNN/MIOpen also try their algorithms (extra launches)",
    "timed": "the timed iterations",
    "outside": "work outside the run's phases (weight initialisation, copies to the device)",
}


def check_kernel_classifier(classify: Callable[[str], str], kernels: pd.DataFrame, min_time_share: float = 0.95,
                            min_samples: float = 0.9) -> bool:
    """``classify(name)`` agrees with :func:`tinyllama.profiling.kernel_names.kernel_class` on at least
    ``min_time_share`` of the measured time of ``kernels`` (``kernel``, ``time_ns``) and on at least
    ``min_samples`` of :data:`SAMPLE_KERNELS` (both vendors' names). Lists the disagreements, largest first."""
    rows = kernels.groupby("kernel", as_index=False)["time_ns"].sum()
    try:
        mine = [classify(name) for name in rows["kernel"]]
        sample_mine = {name: classify(name) for name in SAMPLE_KERNELS}
    except Exception as error:  # the participant's function raised: say on which input
        return checkpoint(False, "", f"your classifier raised {type(error).__name__}: {error}")
    unknown = sorted({c for c in [*mine, *sample_mine.values()] if c not in kernel_names.KERNEL_CLASSES})
    if unknown:
        return checkpoint(False, "", f"your classifier returns {unknown}, which are not classes: return one of "
                                     f"{list(kernel_names.KERNEL_CLASSES)}")
    rows = rows.assign(mine=mine, expected=rows["kernel"].map(kernel_names.kernel_class))
    total = rows["time_ns"].sum()
    agree = rows.loc[rows["mine"] == rows["expected"], "time_ns"].sum() / total if total else 1.0
    sample_ok = sum(sample_mine[n] == c for n, c in SAMPLE_KERNELS.items()) / len(SAMPLE_KERNELS)
    wrong = rows[rows["mine"] != rows["expected"]].sort_values("time_ns", ascending=False).head(4)
    lines = [f"'{kernel_names.short_name(r.kernel)}' ({100 * r.time_ns / total:.1f}% of the time): yours {r.mine!r}, "
             f"expected {r.expected!r}" for r in wrong.itertuples()]
    lines += [f"'{kernel_names.short_name(n)}': yours {sample_mine[n]!r}, expected {c!r}"
              for n, c in SAMPLE_KERNELS.items() if sample_mine[n] != c][:4]
    ok = agree >= min_time_share and sample_ok >= min_samples
    return checkpoint(ok, f"your classes cover {100 * agree:.0f}% of this run's kernel time as the reference does, "
                          f"and {100 * sample_ok:.0f}% of the sample names of both vendors",
                      f"your classes agree on {100 * agree:.0f}% of the kernel time (need {100 * min_time_share:.0f}%) "
                      f"and {100 * sample_ok:.0f}% of the sample names (need {100 * min_samples:.0f}%). Look at: "
                      + "; ".join(lines))


def check_ncu_selection(options: Sequence[str], launches: pd.DataFrame, capture_range: str = "timed",
                        notes: Mapping[str, str] = RANGE_NOTES) -> bool:
    """ncu with ``options`` profiles launches of ``capture_range`` only, and a limited number of
    them; otherwise say which launches of this run (``launches``: launch order with ``range``) it
    would have profiled instead."""
    try:
        selection = kernel_names.parse_ncu_selection(options)
    except ValueError as error:
        return checkpoint(False, "", f"ncu would not accept these options: {error}")
    selected = kernel_names.select_launches(launches, selection, capture_range)
    if selection.launch_count is None:
        return checkpoint(False, "", f"no --launch-count: ncu would replay every one of {len(selected):,} launches "
                                     f"({kernel_names.describe_selection(selected, launches)}), each many times: "
                                     "minutes to hours. Profile a few dozen.")
    if selected.empty:
        return checkpoint(False, "", "these options profile nothing in this run: " + _ranges_hint(launches, capture_range))
    ranges = list(selected["range"].unique())
    if ranges == [capture_range]:
        fragile = ("" if not selection.from_start or selection.nvtx_ranges else
                   " Careful: a --launch-skip counted in one run holds only while every run launches as many "
                   "kernels before the timed region; cuDNN's algorithm search in the warm-up need not. A range "
                   "(--profile-from-start off, or --nvtx --nvtx-include) does not depend on it.")
        return checkpoint(True, f"ncu profiles {kernel_names.describe_selection(selected, launches)}: "
                                f"{notes.get(capture_range, capture_range)}.{fragile}", "")
    other = [r for r in ranges if r != capture_range]
    what = "; ".join(f"'{r}' is {notes.get(r, r)}" for r in other)
    return checkpoint(False, "", f"ncu would profile {kernel_names.describe_selection(selected, launches)}, not the "
                                 f"timed forward: {what}. Its kernels are not the ones you timed. "
                                 + _ranges_hint(launches, capture_range))


def _ranges_hint(launches: pd.DataFrame, capture_range: str) -> str:
    counts = launches["range"].value_counts(sort=False)
    order = ", ".join(f"{name} ({n:,} launches)" for name, n in counts.items())
    return (f"This run launches, in order: {order}. Restrict ncu to the '{capture_range}' range (it starts "
            "and stops the profiler API and is an NVTX range), or skip exactly the launches before it.")


def check_like_with_like(torch_side: pd.DataFrame, launches: pd.DataFrame, selected: pd.DataFrame,
                         per_forward: int) -> bool:
    """``torch_side`` (PyTorch-profiler launches to compare with ncu's ``selected`` ones) comes from the
    same range and holds the same positions in the forward (``index % per_forward``), over several
    iterations (so that a median can be taken)."""
    if torch_side.empty:
        return checkpoint(False, "", "your selection is empty: keep the PyTorch profiler's launches that match ncu's")
    if selected.empty:
        return checkpoint(False, "", "ncu selects no launch (exercise 07.2): fix its options first")
    wanted_ranges, ranges = set(selected["range"]), set(torch_side["range"])
    if ranges != wanted_ranges:
        extra = "; ".join(f"'{r}' is {RANGE_NOTES.get(r, r)}" for r in sorted(ranges - wanted_ranges))
        return checkpoint(False, "", f"your launches come from {sorted(ranges)}, ncu's from {sorted(wanted_ranges)}"
                                     + (f": {extra}" if extra else "") + ". Compare the same phase of the run.")
    wanted = set(selected["index"] % per_forward)
    mine = set(torch_side["index"] % per_forward)
    if mine != wanted:
        more, missing = len(mine - wanted), len(wanted - mine)
        return checkpoint(False, "", f"your launches sit at {len(mine)} positions of the forward, ncu's at "
                                     f"{len(wanted)} ({more} extra, {missing} missing). The same kernel name runs "
                                     "at many layers with different shapes: compare the same launches, position "
                                     "by position (index % launches per forward).")
    iterations = torch_side["index"] // per_forward
    return checkpoint(True, f"the same {len(wanted)} launches of the forward, from {iterations.nunique()} "
                            "timed iteration(s): like with like", "")
