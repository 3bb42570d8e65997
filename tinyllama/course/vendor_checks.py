"""Checks of notebook 07's exercises (vendor profilers): a kernel-name classifier, the options that
restrict ncu to the timed region, the PyTorch-profiler launches to compare with ncu's, and the
explanation of a kernel from its hardware counters (what limits it, what would make it faster).

Each check prints what was wrong in the participant's terms (which kernels, which launches, which
phase of the run) and fails under ``WORKSHOP_STRICT=1`` like every checkpoint."""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import pandas as pd

from tinyllama.course.checkpoints import checkpoint
from tinyllama.profiling import kernel_names, vendor

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
    same range and holds the same positions in the forward (``index % per_forward``), in every iteration
    of that range (so that a median can be taken). A wrong selection is compared with the typical ones
    (by kernel name, the whole forward, the run's launch numbers, one iteration) and the one it
    reproduces is named."""
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
    phase = launches[launches["range"].isin(wanted_ranges)]
    if mine != wanted:
        more, missing = len(mine - wanted), len(wanted - mine)
        by_name = set(phase.loc[phase["kernel"].isin(set(selected["kernel"])), "index"] % per_forward)
        by_launch = set(selected["launch"] % per_forward) if "launch" in selected else set()
        if mine == by_name:
            why = (f"that selects by kernel name: {more} more launch(es) of the same kernels run at other layers, on "
                   "other shapes, and their times are not the ones ncu measures. Select by position in the forward "
                   "(index % launches per forward)")
        elif mine == set(phase["index"] % per_forward):
            why = (f"that is the whole forward, all {len(mine)} positions: ncu profiles only {len(wanted)} launches; "
                   "keep the rows at the positions of `selected`")
        elif by_launch and mine == by_launch and by_launch != wanted:
            why = ("those positions come from `launch`, the launch's number in the whole run: the reference and "
                   "the warm-up launch before the timed range, so its count is shifted. Use `index`, the number "
                   "within the range")
        else:
            why = ("the same kernel name runs at many layers with different shapes: compare the same launches, "
                   "position by position (index % launches per forward)")
        return checkpoint(False, "", f"your launches sit at {len(mine)} positions of the forward, ncu's at "
                                     f"{len(wanted)} ({more} extra, {missing} missing): {why}.")
    iterations = torch_side["index"] // per_forward
    at_positions = phase[(phase["index"] % per_forward).isin(wanted)]
    available = (at_positions["index"] // per_forward).nunique()
    if iterations.nunique() < available:
        return checkpoint(False, "", f"your launches come from {iterations.nunique()} of the {available} iterations "
                                     f"of the '{min(wanted_ranges)}' range: one iteration's time is one sample. "
                                     "Keep those positions in every iteration (select by index % launches per "
                                     "forward, not by index), so that a median can be taken")
    return checkpoint(True, f"the same {len(wanted)} launches of the forward, from {iterations.nunique()} "
                            "timed iteration(s): like with like", "")


# --------------------------------------------------------------------------------------------------
# Exercise 07.4: explain a kernel from its counters
# --------------------------------------------------------------------------------------------------

# What would make a kernel faster: the participant names one of these for each kernel.
REMEDY_CHOICES: dict[str, str] = {
    "fuse": "remove a pass over memory: fuse the kernel with its neighbour, or fold it away (a batch norm folds "
            "into the convolution before it: `python -m inference --freeze`, measured in notebook 06)",
    "tensor_cores": "faster arithmetic: tensor cores, a lower precision",
    "more_work_in_flight": "more work in flight: more blocks or warps per SM (occupancy), more work per launch",
}
RIGHT_REMEDY = {"memory": "fuse", "compute": "tensor_cores", "latency": "more_work_in_flight"}
# Why a remedy does not fit a limit: (limit, remedy) -> the reason, in the participant's terms.
_WRONG_REMEDY = {
    ("memory", "tensor_cores"): "tensor cores make arithmetic faster, but this kernel waits for memory: its SMs "
                                "are far from busy, and faster arithmetic would wait just the same",
    ("memory", "more_work_in_flight"): "the memory system already runs at {memory:.0f}% of its peak: more warps in "
                                       "flight cannot move more bytes per second; only fewer bytes help",
    ("compute", "fuse"): "the SMs are the busy unit ({sm:.0f}% of peak); removing a memory pass saves little "
                         "when memory is not what the kernel waits for",
    ("compute", "more_work_in_flight"): "the SMs are already busy ({sm:.0f}% of peak): more warps queue for the "
                                        "same arithmetic units",
    ("latency", "fuse"): "neither memory ({memory:.0f}%) nor the SMs ({sm:.0f}%) are busy: fewer bytes do not help a "
                         "kernel that waits on latency; keep more work in flight",
    ("latency", "tensor_cores"): "the SMs are not busy ({sm:.0f}% of peak): faster arithmetic does not help a kernel "
                                 "that waits on latency",
}


def explanation_cases(counters: pd.DataFrame) -> list[tuple[str, pd.Series, str]]:
    """The kernels a counter explanation is checked on: the batch-norm kernel and the longest
    convolution/GEMM of ``counters`` (:func:`vendor.kernel_counters`, when there), then synthetic
    kernels that separate the usual slips (a cache-bound kernel with little DRAM traffic, a kernel with
    neither unit busy, one with both busy and the SMs ahead). Each case: (label, row, lesson)."""
    cases: list[tuple[str, pd.Series, str]] = []
    classes = counters["kernel"].map(kernel_names.kernel_class) if len(counters) else pd.Series(dtype=str)
    for kind, label in ((kernel_names.BATCH_NORM, "the batch-norm kernel"), (kernel_names.CONV_GEMM, "the convolution")):
        rows = counters[classes == kind]
        if len(rows):
            row = rows.sort_values("total_ns", ascending=False).iloc[0]
            cases.append((f"{label} ({kernel_names.short_name(row['kernel'])})", row, ""))

    def synthetic(sm: float, memory: float, dram: float, occupancy: float) -> pd.Series:
        return pd.Series({"kernel": "synthetic", "sm_pct": sm, "memory_pct": memory, "dram_pct": dram,
                          "achieved_occupancy_pct": occupancy})

    cases += [
        ("a synthetic kernel that reuses its data in L1/L2", synthetic(48.0, 84.0, 22.0, 70.0),
         ("DRAM is at 22% but the memory system as a whole (its caches) at 84%: read memory_pct, the busiest "
         "memory unit, not only DRAM's share")),
        ("a synthetic kernel with little work per launch", synthetic(18.0, 35.0, 34.0, 20.0),
         (f"memory is ahead of the SMs, but at 35% of its peak it is not busy: below {vendor.HIGH_PCT:.0f}% on both "
         "sides the kernel is waiting (latency), not limited by either unit")),
        ("a synthetic GEMM-like kernel", synthetic(88.0, 72.0, 40.0, 25.0),
         "both units are busy; the SMs are the busier (88% against 72%): compute-bound"),
    ]
    return cases


def check_counter_explanation(explain: Callable[[pd.Series], tuple[str, str]], counters: pd.DataFrame) -> bool:
    """``explain(row)`` returns (limit, remedy) for one kernel's counters: the limit as
    :func:`vendor.limiter` reads it (``"memory"``, ``"compute"`` or ``"latency"``) and the remedy of
    :data:`REMEDY_CHOICES` that fits it, on the run's batch-norm kernel and convolution and on the
    synthetic kernels of :func:`explanation_cases`. The first wrong case is named with its counters."""
    cases = explanation_cases(counters)
    real = [label for label, row, _ in cases if row["kernel"] != "synthetic"]
    for label, row, lesson in cases:
        sm, memory, dram = (float(row[c]) for c in ("sm_pct", "memory_pct", "dram_pct"))
        numbers = f"SM {sm:.0f}%, memory {memory:.0f}%, DRAM {dram:.0f}% of peak"
        try:
            answer = explain(row)
        except Exception as error:  # the participant's function raised: say on which kernel
            return checkpoint(False, "", f"explain raised {type(error).__name__} on {label} ({numbers}): {error}")
        if not (isinstance(answer, tuple) and len(answer) == 2):
            return checkpoint(False, "", f"explain returned {answer!r} for {label}: return a pair (limit, remedy), "
                                         f"e.g. ('memory', 'fuse')")
        limit, remedy = answer
        if limit not in vendor.LIMITERS:
            return checkpoint(False, "", f"{label}: {limit!r} is not a limit; say one of {list(vendor.LIMITERS)}")
        if remedy not in REMEDY_CHOICES:
            return checkpoint(False, "", f"{label}: {remedy!r} is not a remedy; choose one of {list(REMEDY_CHOICES)}")
        expected = vendor.limiter(sm, memory)
        if limit != expected:
            reason = lesson or _real_limit_reason(limit, expected, sm, memory)
            return checkpoint(False, "", f"{label} ({numbers}): you say {limit!r}, the counters say {expected!r}. "
                                         f"{reason}.")
        if remedy != RIGHT_REMEDY[expected]:
            why = _WRONG_REMEDY[(expected, remedy)].format(sm=sm, memory=memory)
            return checkpoint(False, "", f"{label} is {expected}-bound ({numbers}), and you would make it faster "
                                         f"with {remedy!r}: {why}.")
    return checkpoint(True, f"your explanation reads {', '.join(real) or 'the recorded kernels'} and "
                            f"{len(cases) - len(real)} synthetic kernels as the counters do", "")


def _real_limit_reason(said: str, expected: str, sm: float, memory: float) -> str:
    """Why a measured kernel's limit is ``expected`` and not what the participant ``said``."""
    high = vendor.HIGH_PCT
    if expected == "memory" and said == "compute":
        return ("its SMs are far less busy than its memory: it does a few operations per byte it reads and writes, "
                "so the time goes to moving the bytes")
    if expected == "memory":
        return (f"memory at {memory:.0f}% of its peak is busy: a kernel waits on latency only when neither unit "
                f"reaches {high:.0f}%")
    if expected == "compute" and said == "memory":
        return f"the SMs ({sm:.0f}%) are busier than memory ({memory:.0f}%): the arithmetic sets the pace"
    if expected == "compute":
        return f"the SMs at {sm:.0f}% of their peak are busy: not waiting, working"
    return (f"neither the SMs ({sm:.0f}%) nor memory ({memory:.0f}%) reach {high:.0f}% of their peak: the kernel "
            "waits (latency), whichever of the two is ahead")
