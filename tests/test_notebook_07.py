"""Notebook 07's exercise checks catch plausible wrong answers: each check cell of the solution notebook is
run on the reference answer (it passes) and on an answer with one typical mistake (it fails, under
WORKSHOP_STRICT=1). The launch sequence is a small GPU-like run: a reference forward, a warm-up with
extra launches (cuDNN's algorithm search), and three timed forwards; the counters those of the sample ncu
run in tests/data (a memory-bound batch norm, a compute-bound GEMM)."""

import re
from pathlib import Path

import pandas as pd
import pytest

from notebook_exercises import SolutionExercises
from tinyllama import course
from tinyllama.course import vendor_checks
from tinyllama.course.checkpoints import CheckpointFailed
from tinyllama.profiling import kernel_names, vendor

pytestmark = pytest.mark.usefixtures("strict")

FORWARD = [  # (kernel, time in ns at the timed batch)
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nchwkcrs", 90_000.0),
    ("void cudnn::bn_fw_inf_1C11_kernel_NCHW<float, float, 1, 1>(float)", 46_000.0),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::launch_clamp_scalar>(int)", 23_000.0),
    ("void at::native::(anonymous namespace)::max_pool_forward_nchw<float, float>(int)", 30_000.0),
    ("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float>(int)", 12_000.0),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>(Params)", 70_000.0),
    ("void cudnn::bn_fw_inf_1C11_kernel_NCHW<float, float, 1, 1>(float)", 20_000.0),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>(int)", 15_000.0),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32", 40_000.0),
    ("void at::native::reduce_kernel<512, 1>(int)", 5_000.0),
]
ITERATIONS = 3


class Profile:
    vendor_launch_count = 6
    inference_steps = ITERATIONS


def _launches() -> pd.DataFrame:
    rows = [(k, t / 8) for k, t in FORWARD]  # the reference forward: a smaller batch, shorter kernels
    rows += [(k, t) for k, t in FORWARD] + [("void cudnn::search_candidate<1>(int)", 9_000.0)] * 7  # warm-up
    rows += [(k, t) for _ in range(ITERATIONS) for k, t in FORWARD]
    ranges = ["reference"] * len(FORWARD) + ["warm-up"] * (len(FORWARD) + 7) + ["timed"] * (ITERATIONS * len(FORWARD))
    frame = pd.DataFrame(rows, columns=["kernel", "time_ns"])
    frame.insert(0, "launch", range(len(frame)))
    frame.insert(2, "range", ranges)
    frame.insert(3, "index", frame.groupby("range").cumcount())
    return frame


@pytest.fixture(scope="module")
def notebook():
    return SolutionExercises("07_vendor_profilers")


def _namespace(selected_options=None):
    launches = _launches()
    timed = launches[launches["range"] == "timed"]
    namespace = {"pd": pd, "course": course, "vendor": vendor, "kernel_names": kernel_names, "vendor_checks": vendor_checks, "profile": Profile,
                 "launches": launches, "timed": timed, "per_forward": len(timed) // ITERATIONS}
    if selected_options is not None:
        namespace["selected"] = kernel_names.select_launches(launches, selected_options)
    return namespace


def _run(notebook, exercise, replace=None, selected_options=None):
    notebook.run(exercise, _namespace(selected_options), replace)


def test_the_reference_answers_pass(notebook):
    assert set(notebook.found) == {"07.1", "07.2", "07.3", "07.4"}
    _run(notebook, "07.1")
    _run(notebook, "07.2")
    _run(notebook, "07.3", selected_options=["--profile-from-start", "off", "--launch-count", "6"])


@pytest.mark.parametrize("mistake", [
    # only the word "conv": the GEMM engines (xmma, cutlass, Cijk) that run the convolutions are missed
    ('("conv", "Conv", "fprop", "gemm", "Gemm", "xmma", "cutlass", "nvjet", "Cijk_", "linear")', '("conv", "Conv")'),
    # the layout conversions of the convolution library counted as convolutions (rules in the wrong order)
    ('(("nchwToNhwc", "nhwcToNchw", "NCHW2NHWC", "transpose"), "layout conversion"),', ""),
    ('return "other"', 'return "misc"'),  # not one of the classes
])
def test_classifier_mistakes_fail(notebook, mistake):
    with pytest.raises(CheckpointFailed):
        _run(notebook, "07.1", mistake)


def test_a_classifier_that_misses_the_time_fails_on_this_run(notebook):
    with pytest.raises(CheckpointFailed):  # batch norm not recognised: a large share of this run's time
        _run(notebook, "07.1", ('(("bn_fw", "batch_norm", "BatchNorm", "batchnorm"), "batch norm"),', ""))


ANSWER = 'ncu_options = ["--profile-from-start", "off", "--launch-count", str(profile.vendor_launch_count)]'


@pytest.mark.parametrize("wrong", [
    'ncu_options = ["--launch-skip", "0", "--launch-count", str(profile.vendor_launch_count)]',  # the check's forward
    'ncu_options = ["--launch-skip", "10", "--launch-count", "6"]',  # skips the reference, lands in the warm-up
    'ncu_options = ["--profile-from-start", "off"]',  # no limit: every timed launch replayed
    'ncu_options = ["--nvtx-include", "timed/", "--launch-count", "6"]',  # ignored without --nvtx
    'ncu_options = ["--profile-from-start off", "--launch-count 6"]',  # option and value in one string
])
def test_ncu_selection_mistakes_fail(notebook, wrong):
    with pytest.raises(CheckpointFailed):
        _run(notebook, "07.2", (ANSWER, wrong))


@pytest.mark.parametrize("other", [
    'ncu_options = ["--nvtx", "--nvtx-include", "timed/", "--launch-count", "6"]',
    'ncu_options = ["--launch-skip", str((launches["range"] != "timed").sum()), "--launch-count", "6"]',
])
def test_the_other_two_ways_pass(notebook, other):
    _run(notebook, "07.2", (ANSWER, other))


def test_the_check_says_what_would_have_been_profiled(capsys, lenient):
    ok = vendor_checks.check_ncu_selection(["--launch-skip", "0", "--launch-count", "6"], _launches())
    out = capsys.readouterr().out
    assert not ok and "launches 0-5" in out and "6 in 'reference'" in out and "correctness check" in out


LIKE = "torch_side = timed[(timed[\"index\"] % per_forward).isin(positions)]"


@pytest.mark.parametrize("wrong, message", [
    # by name: the same kernels at other layers
    ('torch_side = timed[timed["kernel"].isin(selected["kernel"])]', "that selects by kernel name"),
    # the correctness check's launches
    ('torch_side = launches[launches["range"] == "reference"]', "'reference' is"),
    ('torch_side = timed', "that is the whole forward"),  # the whole forward
    # the launch's number in the whole run, not within the range
    ('torch_side = timed[(timed["index"] % per_forward).isin(selected["launch"] % per_forward)]',
     "come from `launch`, the launch's number in the whole run"),
    # the positions of one iteration only: no median
    ('torch_side = timed[timed["index"].isin(selected["index"])]', "from 1 of the 3 iterations"),
])
def test_like_with_like_mistakes_fail_each_with_its_own_message(notebook, wrong, message):
    with pytest.raises(CheckpointFailed, match=re.escape(message)):
        _run(notebook, "07.3", (LIKE, wrong), selected_options=["--profile-from-start", "off", "--launch-count", "6"])


# --- 07.4: explain a kernel from its counters -----------------------------------------------------------

SAMPLE_COUNTERS = Path(__file__).parent / "data" / "ncu_counters.csv"


def _counters():
    return vendor.kernel_counters(vendor.recorded_counters(SAMPLE_COUNTERS)[0])


def _explain(notebook, replace=None):
    namespace = {"pd": pd, "vendor": vendor, "vendor_checks": vendor_checks, "counters": _counters()}
    notebook.run("07.4", namespace, replace)


def test_the_reference_explanation_passes(notebook, capsys):
    _explain(notebook)
    assert "PASS" in capsys.readouterr().out


@pytest.mark.parametrize("mistake, message", [
    # batch norm read as arithmetic: the comparison the wrong way round
    (('if row["memory_pct"] >= row["sm_pct"]:', 'if row["memory_pct"] < row["sm_pct"]:'),
     "the batch-norm kernel.*you say 'compute'.*far less busy than its memory"),
    # no "is anything busy?" test: the busier unit always wins; the real kernels cannot show it
    (('if max(row["sm_pct"], row["memory_pct"]) < vendor.HIGH_PCT:', 'if False:'),
     "little work per launch.*you say 'memory'.*it is not busy"),
    # DRAM only: a kernel limited by its cache traffic looks idle
    (('    if row["memory_pct"] >= row["sm_pct"]:', '    if row["dram_pct"] >= row["sm_pct"]:'),
     "reuses its data in L1/L2.*you say 'compute'.*read memory_pct"),
    # the right limit, the wrong cure: more threads for a kernel that waits for bytes
    (('return "memory", "fuse"', 'return "memory", "more_work_in_flight"'),
     "memory-bound.*'more_work_in_flight'.*cannot move more bytes"),
    # tensor cores for a memory-bound kernel
    (('return "memory", "fuse"', 'return "memory", "tensor_cores"'),
     "memory-bound.*'tensor_cores'.*waits for memory"),
])
def test_explanation_mistakes_fail_each_with_its_own_message(notebook, mistake, message):
    old, new = mistake
    with pytest.raises(CheckpointFailed, match=message):
        _explain(notebook, (old, new))
