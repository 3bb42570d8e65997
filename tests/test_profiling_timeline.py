"""tinyllama.profiling.timeline: kernels linked to the operators that launched them, allocations charged to
the operator that asked, layout conversions found by name; on a hand-made GPU trace in the format the
PyTorch profiler writes, and on a real CPU profile."""

import json
import math

import matplotlib
import pandas as pd
import pytest
import torch
from torch import nn

from tinyllama.profiling import memory, timeline, torch_profiler

matplotlib.use("Agg")


def _op(name, ts, dur, tid=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {}}


def _launch(ts, correlation, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid, "ts": ts, "dur": 2,
            "args": {"correlation": correlation}}


def _kernel(name, ts, dur, correlation):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": correlation, "stream": 7}}


def _memory(ts, size, total, device_type=1, tid=1):
    return {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": tid, "ts": ts,
            "args": {"Bytes": size, "Total Allocated": total, "Device Type": device_type, "Device Id": 0}}


@pytest.fixture
def gpu_trace(tmp_path):
    mib = 2**20
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        _op("aten::conv2d", 10, 30), _op("aten::convolution", 11, 28), _op("aten::cudnn_convolution", 12, 26),
        _op("aten::empty", 13, 1), _memory(13.5, 4 * mib, 104 * mib),  # the output, through empty
        _launch(15, 101), _launch(20, 102), _launch(25, 103),
        _memory(27, 2 * mib, 106 * mib), _memory(30, -2 * mib, 104 * mib),  # the workspace
        _op("aten::relu_", 45, 5), _launch(46, 104),
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 1, "ts": 100, "dur": 50},
        _op("aten::relu_", 110, 5), _launch(111, 105), _memory(112, 1 * mib, 105 * mib),
        _kernel("void cudnn::engines_precompiled::nchwToNhwcKernel<__half>", 30, 4, 101),
        _kernel("sm90_xmma_fprop_implicit_gemm_f16f16", 35, 20, 102),
        _kernel("void cudnn::engines_precompiled::nhwcToNchwKernel<__half>", 56, 3, 103),
        _kernel("void at::native::vectorized_elementwise_kernel<4>", 60, 5, 104),
        _kernel("void at::native::vectorized_elementwise_kernel<4>", 120, 5, 105),
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_conversion_kernels_are_found_by_name():
    assert timeline.is_layout_conversion("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float>")
    assert timeline.is_layout_conversion("void engines_precompiled::nhwcToNchwKernel<float>")
    assert timeline.is_layout_conversion("batched_transpose_32x32_half")
    assert not timeline.is_layout_conversion("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n")
    assert not timeline.is_layout_conversion("void cudnn::bn_fw_inf_1C11_kernel_NCHW<float>")


def test_conversion_share_counts_both_directions_over_the_whole_table():
    kernels = pd.DataFrame({"kernel": ["a_nchwToNhwcKernel", "gemm", "b_nhwcToNchwKernel"], "total_ns": [10.0, 80.0, 10.0]})
    assert timeline.layout_conversion_share(kernels) == pytest.approx(0.2)
    assert math.isnan(timeline.layout_conversion_share(kernels.iloc[:0]))


def test_kernels_of_the_last_step_carry_the_operator_that_launched_them(gpu_trace):
    frame = timeline.kernel_timeline(gpu_trace, step=1)
    device = frame[frame["side"] == "device"].reset_index(drop=True)
    assert len(device) == 4  # the kernel launched in step 2 is not in step 1
    assert device["operator"].tolist() == ["aten::cudnn_convolution"] * 3 + ["aten::relu_"]
    assert device["category"].tolist() == ["layout conversion", "GEMM (projections)", "layout conversion", "element-wise"]
    assert device["start_ms"].tolist() == pytest.approx([0.030, 0.035, 0.056, 0.060])
    host = frame[frame["side"] == "host"]
    assert host["name"].tolist() == ["aten::conv2d", "aten::relu_"]  # outermost only
    last = timeline.kernel_timeline(gpu_trace)
    assert last.loc[last["side"] == "device", "start_ms"].tolist() == pytest.approx([0.020])  # from step 2's start


def test_allocations_are_charged_to_the_operator_around_empty(gpu_trace):
    frame = timeline.allocations(gpu_trace, "cuda", step=1)
    assert frame["operator"].tolist() == ["aten::cudnn_convolution"] * 3
    assert frame["mib"].tolist() == [4, 2, -2]
    assert frame["allocated_mib"].max() == 106
    table = timeline.allocations_by_operator(frame)
    assert table.loc[0, "operator"] == "aten::cudnn_convolution"
    assert table.loc[0, "allocated_mib"] == 6 and table.loc[0, "allocations"] == 2 and table.loc[0, "largest_mib"] == 4
    assert timeline.allocations(gpu_trace, "cpu", step=1).empty
    with pytest.raises(ValueError, match="'cuda' or 'cpu'"):
        timeline.allocations(gpu_trace, "gpu")


def test_a_trace_without_steps_or_memory_gets_a_clear_error(tmp_path):
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"traceEvents": [_op("aten::relu_", 0, 1)]}))
    with pytest.raises(ValueError, match="ProfilerStep"):
        timeline.kernel_timeline(path)


def test_a_cpu_profile_gives_host_rows_allocations_and_a_kernel_table(tmp_path):
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()).eval()
    x = torch.randn(2, 3, 16, 16)

    def step():
        with torch.inference_mode():
            return net(x)

    run = torch_profiler.profile_steps(step, device="cpu", wait=0, warmup=1, active=1, profile_memory=True,
                                       trace_dir=tmp_path)
    frame = timeline.kernel_timeline(run.trace_path)
    assert set(frame["side"]) == {"host"} and "aten::conv2d" in set(frame["name"])
    held = timeline.allocations(run.trace_path, "cpu")
    by_op = timeline.allocations_by_operator(held)
    assert by_op["largest_mib"].max() >= 2 * 8 * 16 * 16 * 4 / 2**20  # the convolution's output at least
    table = timeline.kernel_table(run)
    assert "CPU operators" in table.attrs["source"] and table["percent"].sum() == pytest.approx(100)
    assert timeline.layout_conversion_share(table) == 0
    assert timeline.plot_kernel_timeline(frame, "t").axes and timeline.plot_allocations(held, by_op, "m").axes


def test_output_sizes_lists_each_leaf_module_in_call_order():
    net = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 5))
    sizes = memory.output_sizes(net, torch.randn(2, 3, 16, 16))
    assert sizes["module"].tolist() == ["0", "1", "2", "3"]
    assert sizes.loc[0, "shape"] == (2, 4, 8, 8) and sizes.loc[0, "mib"] == pytest.approx(2 * 4 * 8 * 8 * 4 / 2**20)
    assert not any(m._forward_hooks for m in net.modules())  # hooks removed
