"""Notebook 03's exercise checks catch plausible wrong answers: each solution cell runs with its check cell on
tables shaped like the notebook's (a real CPU profile of a small convolutional network, and a kernel table
with the kernel names cuDNN showed on an H200), passing with the reference answer and failing (under
WORKSHOP_STRICT=1) with one typical mistake."""

import math
import re

import pandas as pd
import pytest
import torch
from torch import nn

from notebook_exercises import SolutionExercises
from tinyllama import course
from tinyllama.course import profiler_checks
from tinyllama.course.checkpoints import CheckpointFailed
from tinyllama.profiling import memory, torch_profiler

pytestmark = pytest.mark.usefixtures("strict")

# Kernel names (shortened) and totals from the fp32 profile of notebook 03 on an H200 (2026-11-22).
GPU_KERNELS = pd.DataFrame({
    "kernel": ["void cudnn::bn_fw_inf_1C11_kernel_NCHW<float, float, bool=1, int=1>",
               "void at::native::vectorized_elementwise_kernel<4, at::native::clamp_min>",
               "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32",
               "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, bool=0>",
               "void cudnn::engines_precompiled::nhwcToNchwKernel<float, float, float, bool=1>",
               "sm80_xmma_fprop_implicit_gemm_indexed_wo_smem_tf32f32"],
    "calls": [2650, 2450, 400, 1950, 1200, 50],
    "total_ns": [1.227e8, 5.719e7, 2.645e7, 2.445e7, 2.055e7, 1.842e7]})


@pytest.fixture(scope="module")
def notebook():
    return SolutionExercises("03_pytorch_profiler")


@pytest.fixture(scope="module")
def cpu_run():
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                        nn.BatchNorm2d(8), nn.ReLU()).eval()
    x = torch.randn(2, 3, 16, 16)

    def step():
        with torch.inference_mode():
            return net(x)

    return torch_profiler.profile_steps(step, device="cpu", wait=0, warmup=1, active=2)


def _namespace(**extra):
    return {"course": course, "profiler_checks": profiler_checks, "pd": pd, "math": math, **extra}


def test_the_exercises_are_numbered():
    assert set(SolutionExercises("03_pytorch_profiler").found) == {"03.1", "03.2", "03.3", "03.4", "03.5"}


def _ops(cpu_run):
    return _namespace(ops=cpu_run.operators(), self_column="self_cpu_ms", total_column="cpu_total_ms", run=cpu_run)


def test_conv_share_reference_passes(notebook, cpu_run):
    namespace = notebook.run("03.1", _ops(cpu_run))
    assert 0 < namespace["conv_share_pct"] < 100


@pytest.mark.parametrize("mistake, message", [
    # nested totals summed
    (('operator_rows.loc[is_conv, self_column]', 'operator_rows.loc[is_conv, total_column]'), "nested conv operators"),
    # totals over totals
    (('operator_rows.loc[is_conv, self_column].sum() / operator_rows[self_column].sum()',
      'operator_rows.loc[is_conv, total_column].sum() / operator_rows[total_column].sum()'), "total time over total time"),
    # only the outer operator, whose self time is tiny
    (('str.contains("conv")', 'str.contains("conv2d")'), "that counts only aten::conv2d"),
    # a fraction, not percent
    (('100 * operator_rows', 'operator_rows'), "a fraction, not a percent"),
    # the range ProfilerStep* in the denominator
    (('/ operator_rows[self_column].sum()', '/ ops[self_column].sum()'), "the denominator includes the ranges"),
])
def test_conv_share_mistakes_fail_each_with_its_own_message(notebook, cpu_run, mistake, message):
    with pytest.raises(CheckpointFailed, match=re.escape(message)):
        notebook.run("03.1", _ops(cpu_run), mistake)


# The fp32 and fp16 times per kind of work of the H200 run: memory only in fp16.
BOTH = pd.DataFrame({"fp32_ms": [4.31, 2.485, 2.114, 0.204, 0.0], "fp16_ms": [2.832, 2.348, 1.054, 0.210, 0.115]},
                    index=["GEMM (projections)", "norm & reduction", "element-wise", "other", "memory (copy, cat, index)"])


def test_category_ratio_reference_passes_and_names_element_wise(notebook):
    namespace = notebook.run("03.2", _namespace(both=BOTH.copy(), display=lambda *_: None))
    assert namespace["shrank_most"] == "element-wise"
    assert math.isnan(namespace["ratio"]["memory (copy, cat, index)"])


@pytest.mark.parametrize("mistake", [
    ('both["fp16_ms"].where(both["fp16_ms"] > 0) / both["fp32_ms"].where(both["fp32_ms"] > 0)',
     'both["fp16_ms"] / both["fp32_ms"]'),  # the inf
    ("ratio.idxmin()", "ratio.idxmax()"),  # shrank least
    ('both["fp16_ms"].where(both["fp16_ms"] > 0) / both["fp32_ms"].where(both["fp32_ms"] > 0)',
     'both["fp32_ms"].where(both["fp32_ms"] > 0) / both["fp16_ms"].where(both["fp16_ms"] > 0)'),  # upside down
    ("ratio.idxmin()", '(both["fp32_ms"] - both["fp16_ms"]).idxmax()'),  # most ms saved, not the smallest ratio
])
def test_category_ratio_mistakes_fail(notebook, mistake):
    with pytest.raises(CheckpointFailed):
        notebook.run("03.2", _namespace(both=BOTH.copy(), display=lambda *_: None), mistake)


def test_conversion_share_reference_passes_on_gpu_names(notebook):
    namespace = notebook.run("03.3", _namespace(kernels_fp16=GPU_KERNELS.copy(), on_gpu=True))
    assert namespace["conversion_share"] == pytest.approx((2.445e7 + 2.055e7) / GPU_KERNELS["total_ns"].sum())


def test_conversion_share_is_zero_on_a_cpu_table(notebook, cpu_run):
    from tinyllama.profiling.timeline import kernel_table

    namespace = notebook.run("03.3", _namespace(kernels_fp16=kernel_table(cpu_run), on_gpu=False))
    assert namespace["conversion_share"] == 0


@pytest.mark.parametrize("mistake, message", [
    (('"nchwToNhwc|nhwcToNchw|batched_transpose"', '"nchwToNhwc"'), "counts only the nchwToNhwc kernels"),
    (("conversion_share = kernels_fp16", "conversion_share = 100 * kernels_fp16"), "a fraction is wanted (0..1), not percent"),
    (('.sum() / kernels_fp16["total_ns"].sum()', '.sum() / kernels_fp16["total_ns"].max()'), "over the largest kernel's time"),
    # any name with a layout in it: the batch norm kernel ..._NCHW is no conversion
    (('"nchwToNhwc|nhwcToNchw|batched_transpose"', '"nhwc|nchw"'), "every kernel whose name mentions a layout"),
    # the share of the launches
    (('kernels_fp16.loc[is_conversion, "total_ns"].sum() / kernels_fp16["total_ns"].sum()',
      'kernels_fp16.loc[is_conversion, "calls"].sum() / kernels_fp16["calls"].sum()'), "share of the launches (calls)"),
    # over the rest of the time
    (('/ kernels_fp16["total_ns"].sum()', '/ kernels_fp16.loc[~is_conversion, "total_ns"].sum()'),
     "over the other kernels' time"),
])
def test_conversion_share_mistakes_fail_each_with_its_own_message(notebook, mistake, message):
    with pytest.raises(CheckpointFailed, match=re.escape(message)):
        notebook.run("03.3", _namespace(kernels_fp16=GPU_KERNELS.copy(), on_gpu=True), mistake)


@pytest.mark.parametrize("share", [0.0, 0.1])
def test_amdahl_reference_passes(notebook, share, capsys):
    namespace = notebook.run("03.4", _namespace(conversion_share=share))
    assert namespace["predicted_cl_speedup"] == pytest.approx(1 / (1 - share))
    shown = capsys.readouterr().out
    # one PASS line, the one the stored GPU output shows: the made-up shares are checked silently
    assert shown.count("PASS:") == 1 and "PASS: the predicted speed-up without the conversions = " in shown


# Each typical formula with the phrase of its own message (profiler_checks.AMDAHL_SLIPS and IGNORES_SHARE).
AMDAHL_MISTAKES = [
    ("1 + share", "only the first term of 1 / (1 - share)"),
    ("1 - share", "the new time as a fraction of the old one"),
    ("1 / (1 + share)", "a slow-down: removing work cannot slow the step"),
    ("share / (1 - share)", "the gain (speed-up - 1)"),
    ("1 / share", "divides by the conversions' share"),
    ("1 / (1 - 100 * share)", "treats the share as a percent"),
    ("1 / (1 - conversion_share)", "the same value for every share"),  # the measured share, not the argument
]


def _only_its_own_phrase(text: str, phrase: str) -> None:
    assert phrase in text, text
    others = [other for _, other in AMDAHL_MISTAKES if other != phrase and other in text]
    assert not others, f"the feedback names other mistakes too: {others}"


@pytest.mark.parametrize("wrong, phrase", AMDAHL_MISTAKES, ids=[w for w, _ in AMDAHL_MISTAKES])
def test_amdahl_mistakes_fail_each_with_its_own_message(notebook, wrong, phrase):
    with pytest.raises(CheckpointFailed) as failed:
        notebook.run("03.4", _namespace(conversion_share=0.1), ("return 1 / (1 - share)", f"return {wrong}"))
    _only_its_own_phrase(str(failed.value), phrase)


@pytest.mark.parametrize("wrong, phrase", AMDAHL_MISTAKES[:3], ids=[w for w, _ in AMDAHL_MISTAKES[:3]])
def test_on_a_cpu_the_slips_right_at_share_zero_still_fail(notebook, wrong, phrase):
    """The ci profile on a CPU measures no conversions (share 0), where 1 + s, 1 - s and 1 / (1 + s) give the
    right 1.0: the formula run on made-up shares still names each."""
    assert profiler_checks.AMDAHL_SLIPS[AMDAHL_MISTAKES.index((wrong, phrase))][0](0.0) == 1.0
    with pytest.raises(CheckpointFailed) as failed:
        notebook.run("03.4", _namespace(conversion_share=0.0), ("return 1 / (1 - share)", f"return {wrong}"))
    _only_its_own_phrase(str(failed.value), phrase)


def test_every_amdahl_slip_differs_from_the_answer_and_the_others_at_the_made_up_shares():
    shares = profiler_checks.AMDAHL_SHARES
    rows = [[round(1 / (1 - s), 9) for s in shares]] + [[round(slip(s), 9) for s in shares]
                                                        for slip, _ in profiler_checks.AMDAHL_SLIPS]
    assert len({tuple(row) for row in rows}) == len(rows)


def test_a_formula_that_raises_is_named_not_a_crash():
    with pytest.raises(CheckpointFailed, match="speedup_without failed at the shares"):
        profiler_checks.check_amdahl(1.0, 0.0, lambda share: share.item())


def _resnet_namespace():
    from inference import networks

    spec = networks.get_spec("resnet18")
    model_cl = networks.build(spec, seed=0).eval().half().to(memory_format=torch.channels_last)
    inputs_cl = torch.randn(2, 3, 32, 32).half().contiguous(memory_format=torch.channels_last)
    return _namespace(batch_size=2, image_size=32, model_cl=model_cl, inputs_cl=inputs_cl, memory=memory)


@pytest.fixture(scope="module")
def resnet():
    return _resnet_namespace()


def test_first_conv_reference_passes(notebook, resnet):
    notebook.run("03.5", dict(resnet))


@pytest.mark.parametrize("mistake", [
    ("** 2 * 2 /", "** 2 * 4 /"),  # fp32 bytes
    ("(image_size // 2)", "image_size"),  # the stride forgotten
    ("/ 2**20", "/ 1e6"),  # MB, not MiB
])
def test_first_conv_mistakes_fail(notebook, resnet, mistake):
    with pytest.raises(CheckpointFailed):
        notebook.run("03.5", dict(resnet), mistake)


# ------------------------------------------------------------------------ the profiler's overhead, the verdict


def _stats(median, spread=0.05, n=5):
    from tinyllama.timing import summarize

    return summarize([median * (1 - spread), median * (1 - spread / 2), median, median * (1 + spread / 2),
                      median * (1 + spread)][:n] if n == 5 else [median] * n)


def _evidence(host, device, spread=0.05, applies=True):
    from inference.launch import HostDevice

    return HostDevice(64, _stats(host, spread), _stats(device, spread), applies)


def test_the_profilers_overhead_is_called_slower_only_beyond_the_spreads():
    # An H200's fp32 ResNet-50 step at batch 64: 4.5 ms to issue without the profiler, 8.9 ms under it.
    table, sentences = profiler_checks.profiler_overhead(_evidence(4.5, 9.5), _stats(8.9), _stats(9.6))
    assert list(table.index) == ["without the profiler (timed first)", "under the profiler"]
    assert "host's time to issue a step is 1.98x" in sentences[0] and "profiler's own cost" in sentences[0]
    assert "within noise" in sentences[1]  # 9.6 against 9.5 ms, bands overlap
    _, noisy = profiler_checks.profiler_overhead(_evidence(4.5, 9.5, spread=0.6), _stats(5.0, 0.6), _stats(9.5))
    assert "within noise" in noisy[0]
    _, cpu = profiler_checks.profiler_overhead(_evidence(22.0, 22.0, applies=False), _stats(40.0), _stats(40.0))
    assert len(cpu) == 2 and "On a CPU" in cpu[1] and "device" not in cpu[0]


def test_the_host_device_verdict_reads_the_unprofiled_evidence_with_its_spreads():
    assert profiler_checks.host_device_verdict(_evidence(4.5, 9.5)).startswith("The device is the limit")
    assert profiler_checks.host_device_verdict(_evidence(3.3, 3.33)).startswith("Launch-bound")
    assert profiler_checks.host_device_verdict(_evidence(7.6, 9.5, spread=0.2)).startswith("At the threshold")
    assert profiler_checks.host_device_verdict(_evidence(22.0, 22.0, applies=False)).startswith("On a CPU")


def test_the_memory_sentences_follow_the_table():
    # The H200's channels-last fp16 step: batch norm allocates the most.
    table = pd.DataFrame({"operator": ["aten::cudnn_batch_norm", "aten::cudnn_convolution", "aten::max_pool2d_with_indices"],
                          "allocated_mib": [1358.7, 1258.7, 122.5], "allocations": [53, 90, 2],
                          "largest_mib": [98.0, 98.0, 98.0]})
    lines = profiler_checks.allocations_summary(table)
    assert lines[0].startswith("aten::cudnn_batch_norm allocates the most: 1,358.7 MiB in 53 allocations (50%")
    assert lines[-1].endswith("allocate nothing.")
    flipped = table.assign(allocated_mib=[100.0, 1258.7, 122.5])
    assert profiler_checks.allocations_summary(flipped)[0].startswith("aten::cudnn_convolution allocates the most")
    in_place = pd.concat([table, pd.DataFrame({"operator": ["aten::add_"], "allocated_mib": [1.0], "allocations": [1],
                                               "largest_mib": [1.0]})], ignore_index=True)
    assert "aten::add_" in profiler_checks.allocations_summary(in_place)[-1]
    assert profiler_checks.allocations_summary(table.iloc[:0]) == ["The memory profile recorded no allocations in this step."]


def _code_cells():
    import nbformat

    from tinyllama.course.results import checkout_root

    nb = nbformat.read(checkout_root() / "solutions" / "03_pytorch_profiler.ipynb", as_version=4)
    return nb, [cell.source for cell in nb.cells if cell.cell_type == "code"]


def test_everything_is_timed_before_the_first_profiler_session():
    _, sources = _code_cells()
    first_profile = next(i for i, s in enumerate(sources) if "profile_steps(" in s)
    for marker in ("time_samples(", "host_and_device_ms(", "run_benchmark(", "inference.run("):
        late = [i for i, s in enumerate(sources) if marker in s and i > first_profile]
        assert not late, f"{marker} is called after the first profiler session (code cells {late})"
    assert any("host_and_device_ms(" in s for s in sources[:first_profile])  # notebook 01's function
    assert any("host_device_verdict(evidence)" in s for s in sources[first_profile:])


def test_the_memory_answer_does_not_say_batch_norm_allocates_little():
    nb, _ = _code_cells()
    answer = next(cell.source for cell in nb.cells if cell.cell_type == "markdown" and "Read the figure" in cell.source)
    assert "allocate little" not in answer and "batch norms allocate" in answer
