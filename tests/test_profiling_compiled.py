"""tinyllama.profiling.compiled: reading the code Inductor generated, first calls after a Dynamo reset,
operator fates and launch counts from profiles, and the break-even point of a compile."""

import math

import pandas as pd
import pytest
import torch

from tinyllama.profiling import compiled
from tinyllama.profiling.torch_profiler import profile_steps

# The shape of Inductor's output on a GPU (torch 2.5-2.14): kernel definitions with their comment, then
# the call function with comments above library calls and kernel launches.
GPU_CODE = '''
# kernel path: /tmp/torchinductor_x/ab/cabc.py
# Topologically Sorted Source Nodes: [x32, pow_1, mean, add, rsqrt, normed], Original ATen: [aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul]
# Source node to ATen node mapping:
#   add => add
triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0 = async_compile.triton('triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0', \'\'\'
import triton
@triton.jit
def triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0(in_ptr0, out_ptr0, xnumel, rnumel):
    pass
\'\'\', device_str='cuda')

triton_poi_fused_mul_silu_1 = async_compile.triton('triton_poi_fused_mul_silu_1', \'\'\'
def triton_poi_fused_mul_silu_1(in_ptr0, out_ptr0, xnumel):
    tmp0 = triton_helpers.maximum(tmp1, tmp2)
\'\'\', device_str='cuda')


class Runner:
    def __init__(self, partitions):
        self.partitions = partitions

    def call(self, args):
        primals_1, primals_2, primals_3 = args
        args.clear()
        with torch.cuda._DeviceGuard(0):
            buf0 = empty_strided_cuda((2, 32, 1), (32, 1, 64), torch.float32)
            # Topologically Sorted Source Nodes: [x32, pow_1, mean, add, rsqrt, normed], Original ATen: [aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul]
            stream0 = get_raw_stream(0)
            triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0.run(buf0, primals_1, 64, 64, stream=stream0)
            # Topologically Sorted Source Nodes: [linear], Original ATen: [aten.t, aten.mm]
            extern_kernels.mm(buf0, reinterpret_tensor(primals_2, (64, 128), (1, 64), 0), out=buf1)
            # Topologically Sorted Source Nodes: [attn], Original ATen: [aten._scaled_dot_product_cudnn_attention]
            buf2 = torch.ops.aten._scaled_dot_product_cudnn_attention.default(buf1, buf1, buf1, None, True)
            triton_poi_fused_mul_silu_1.run(buf1, buf3, 8192, stream=stream0)
        return (buf3, )
'''

CPU_BACKWARD_CODE = '''
cpp_fused__unsafe_view_mul_silu_silu_backward_split_view_0 = async_compile.cpp_pybinding(['const float*'], r\'\'\'
extern "C" void kernel(const float* in_ptr0) {}
\'\'\')


class Runner:
    def call(self, args):
        primals_1, mm_2, tangents_1 = args
        args.clear()
        # Topologically Sorted Source Nodes: [view_12, permute_8, mm_4], Original ATen: [aten.view, aten.t, aten.mm]
        extern_kernels.mm(reinterpret_tensor(tangents_1, (64, 64), (1, 64), 0), mm_2, out=buf0)
        cpp_fused__unsafe_view_mul_silu_silu_backward_split_view_0(mm_2, buf0)
        return (buf0, )

runner = Runner(partitions=[])
call = runner.call
'''


def test_calls_are_read_in_order_with_their_kinds_and_operators():
    calls = compiled.compiled_calls(GPU_CODE, "forward graph 0")
    assert [c.name for c in calls] == ["triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "mm",
                                       "_scaled_dot_product_cudnn_attention", "triton_poi_fused_mul_silu_1"]
    assert [c.kind for c in calls] == ["Triton, reduction", compiled.LIBRARY_CALL, compiled.LIBRARY_CALL,
                                       "Triton, point-wise"]
    assert calls[0].aten_ops == ("_to_copy", "pow", "mean", "add", "rsqrt", "mul")  # from Inductor's comment
    assert calls[1].aten_ops == ("t", "mm")
    assert calls[3].aten_ops == ("mul", "silu")  # no comment: read from the kernel's name
    assert "triton_helpers" not in {c.name for c in calls}


def test_kernel_names_give_their_operators_longest_name_first():
    assert compiled._ops_from_name("cpp_fused__unsafe_view_add_mean_mul_pow_rsqrt_2") == (
        "_unsafe_view", "add", "mean", "mul", "pow", "rsqrt")
    assert compiled._ops_from_name("triton_per_fused_silu_backward_split_with_sizes_0") == (
        "silu_backward", "split_with_sizes")


def test_backward_graphs_are_labelled_and_tabled():
    assert compiled.graph_label(CPU_BACKWARD_CODE, 1) == "backward graph 1"
    assert compiled.graph_label(GPU_CODE, 0) == "forward graph 0"
    table = compiled.calls_table([GPU_CODE, CPU_BACKWARD_CODE])
    assert list(table["graph"].unique()) == ["forward graph 0", "backward graph 1"]
    backward = table[table["graph"] == "backward graph 1"]
    assert list(backward["name"]) == ["mm", "cpp_fused__unsafe_view_mul_silu_silu_backward_split_view_0"]
    assert backward.iloc[1]["kind"] == "C++ loop (CPU)"
    assert backward.iloc[1]["aten_ops"] == "_unsafe_view, mul, silu, silu_backward, split, view"


def test_code_without_a_call_function_has_no_calls():
    assert compiled.compiled_calls("x = 1\n") == []


def test_fates():
    assert [compiled.fate(4, 0), compiled.fate(4, 1), compiled.fate(4, 4), compiled.fate(4, 5)] == [
        "gone", "fewer", "same", "more"]


def test_break_even_steps():
    assert compiled.break_even_steps(30.0, 50.0, 25.0) == pytest.approx(1200.0)
    assert compiled.break_even_steps(0.0, 10.0, 5.0) == 0.0
    assert compiled.break_even_steps(40.0, 20.0, 25.0) == math.inf
    assert compiled.break_even_steps(40.0, 20.0, 20.0) == math.inf
    with pytest.raises(ValueError, match="positive"):
        compiled.break_even_steps(1.0, 0.0, 1.0)


def test_first_call_resets_dynamo_so_each_first_call_compiles():
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    fn = torch.compile(lambda x: x.sin() + 1, backend=counter)
    x = torch.randn(4)
    fn(x)
    fn(x)
    assert counter.frame_count == 1  # cached in memory
    result = compiled.first_call(lambda: fn(x), "cpu")
    assert counter.frame_count == 2 and result.seconds > 0
    assert result.code == []  # no Inductor: nothing generated
    assert result.compile_seconds(steady_ms=result.seconds * 1e3 + 5) == 0.0


def test_inductor_code_is_captured_cold_and_warm():
    fn = torch.compile(lambda x: (x.sin() * 2).sum(-1))
    x = torch.randn(8, 8)
    with compiled.empty_compile_caches():
        cold = compiled.first_call(lambda: fn(x), "cpu")
        warm = compiled.first_call(lambda: fn(x), "cpu")
    assert warm.seconds < cold.seconds  # the second found the graph and the kernel on disk
    table = compiled.calls_table(cold.code)
    kernel = table[table["kind"] != compiled.LIBRARY_CALL].iloc[0]
    assert {"sin", "mul", "sum"} <= set(kernel["aten_ops"].split(", "))


def test_operator_calls_and_launches_on_the_cpu():
    x = torch.randn(16, 16)
    run = profile_steps(lambda: x.sin().mul(2).sum(), device="cpu", wait=0, warmup=1, active=2)
    calls = compiled.operator_calls(run)
    assert calls["aten::sin"] == 1.0 and calls["aten::sum"] == 1.0
    assert isinstance(calls, pd.Series)
    assert compiled.launches_per_step(run) == pytest.approx(3.0)  # sin, mul, sum: each a top-level operator


def test_generated_kernels_are_recognised_on_both_devices():
    from tinyllama.profiling.kernel_names import is_fused_kernel

    for name in ("triton_poi_fused_add_mul_0", "triton_red_fused_mean_1", "cpp_fused_add_mean_0",
                 "graph_0_cpp_fused_mul_silu_3"):
        assert is_fused_kernel(name), name
    for name in ("aten::mm", "void at::native::elementwise_kernel<128, 4>", "graph_break", "forward"):
        assert not is_fused_kernel(name), name
