"""What kernel names say (class of work, tensor cores, number format) and which launches ncu's options select:
tinyllama.profiling.kernel_names, checked on the names of real NVIDIA, AMD and PyTorch kernels."""

import pandas as pd
import pytest

from tinyllama.profiling import kernel_names



# --- reading kernel names -------------------------------------------------------------------------

@pytest.mark.parametrize("name, kind", [
    ("void cudnn::bn_fw_inf_1C11_kernel_NCHW<float, float, 1, 1>(float)", kernel_names.BATCH_NORM),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32", kernel_names.CONV_GEMM),
    ("sm80_xmma_fprop_implicit_gemm_indexed_wo_smem_f16f16_f32", kernel_names.CONV_GEMM),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64>(Params)", kernel_names.CONV_GEMM),
    ("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float>(int)", kernel_names.LAYOUT),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::launch_clamp_scalar>(int)", kernel_names.ELEMENTWISE),
    ("void at::native::(anonymous namespace)::max_pool_forward_nchw<float, float>(int)", kernel_names.POOLING),
    ("Memcpy HtoD (Pinned -> Device)", kernel_names.COPY),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>(int)", kernel_names.COPY),
    ("MIOpenBatchNormFwdInferSpatialEst", kernel_names.BATCH_NORM),
    ("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN", kernel_names.CONV_GEMM),
    ("batched_transpose_32x16_half", kernel_names.LAYOUT),
    ("nvjet_sm90_hsh_448x64_64x2_2x1_v_bz_coopB_NNN", kernel_names.CONV_GEMM),
    ("aten::conv2d", kernel_names.CONV_GEMM), ("aten::relu_", kernel_names.ELEMENTWISE), ("aten::flatten", kernel_names.OTHER),
    ("void at::native::reduce_kernel<512, 1>(int)", kernel_names.OTHER),
])
def test_kernel_classes_are_read_from_the_names(name, kind):
    assert kernel_names.kernel_class(name) == kind


@pytest.mark.parametrize("name, tensor, precision", [
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n", True, "tf32"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64>(Params)", True, "tf32"),
    ("sm80_xmma_fprop_implicit_gemm_indexed_wo_smem_f16f16_f32", True, "fp16"),
    # 16x8x16 MMAs with fp32 accumulation take 16-bit inputs, not tf32 (an H200's fp16 ResNet-50 runs these)
    ("void cutlass::Kernel2<cutlass_80_tensorop_f16_s16816gemm_f16_256x128_32x3_nn_align8>(Params)", True, "fp16"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>(Params)", True, "bf16"),
    ("nvjet_sm90_hsh_320x128_64x3_4x2_h_bz_coopB_NNT", True, "fp16"),  # cuBLAS's Hopper GEMMs
    ("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_TNT", True, "tf32"),
    ("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN", True, "fp16"),
    ("void implicit_convolve_sgemm<float, float, 128, 5>(int)", False, "fp32"),
    ("void cudnn::bn_fw_inf_1C11_kernel_NCHW<float, float, 1, 1>(float)", False, "fp32"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::launch_clamp_scalar>(int)", False, ""),
])
def test_tensor_cores_and_number_formats_are_read_from_the_names(name, tensor, precision):
    assert kernel_names.tensor_core_kernel(name) is tensor
    assert kernel_names.kernel_precision(name) == precision


def test_plot_labels_are_unique_and_short():
    names = ["void a::k<float, 1>(x)", "void b::k<float, 1>(y)", "void a::k<float, 2>(x)",
             "void at::native::(anonymous namespace)::max_pool_forward_nchw<float, float>(int, float const*)",
             "x" * 80]
    labels = kernel_names.unique_labels(names, width=30)
    assert len(set(labels)) == len(labels)
    assert labels[:3] == ["k<float, 1> #1", "k<float, 1> #2", "k<float, 2>"]
    assert labels[3].startswith("max_pool_forward_nchw")
    assert all(len(label) <= 30 + 3 for label in labels)


def test_class_shares_sum_time_per_class():
    table = pd.DataFrame({"kernel": ["aten::conv2d", "aten::relu_", "aten::conv2d"], "time_ns": [3e6, 1e6, 4e6]})
    shares = kernel_names.class_shares(table).set_index("class")
    assert shares.loc[kernel_names.CONV_GEMM, "time_ms"] == pytest.approx(7.0)
    assert shares.loc[kernel_names.CONV_GEMM, "launches"] == 2
    assert shares["share_pct"].sum() == pytest.approx(100.0)
    assert shares.index[0] == kernel_names.CONV_GEMM


# --- which launches ncu profiles ---------------------------------------------------------------------

def _launches(reference=5, warmup=8, timed=12, outside=2):
    ranges = ["outside"] * outside + ["reference"] * reference + ["warm-up"] * warmup + ["timed"] * timed
    frame = pd.DataFrame({"launch": range(len(ranges)), "kernel": [f"k{i % 4}" for i in range(len(ranges))],
                                 "range": ranges, "time_ns": 1000.0})
    frame["index"] = frame.groupby("range").cumcount()
    return frame


def test_ncu_options_are_parsed_and_typos_refused():
    sel = kernel_names.parse_ncu_selection(["--profile-from-start", "off", "-c", "5"])
    assert (sel.from_start, sel.launch_count, sel.launch_skip) == (False, 5, 0)
    sel = kernel_names.parse_ncu_selection("--nvtx --nvtx-include timed/ --launch-count=3 --launch-skip 2")
    assert sel.nvtx_ranges == ("timed",) and (sel.launch_skip, sel.launch_count) == (2, 3)
    assert kernel_names.parse_ncu_selection([]).launch_count is None
    with pytest.raises(ValueError, match="needs --nvtx"):
        kernel_names.parse_ncu_selection(["--nvtx-include", "timed/", "-c", "5"])
    with pytest.raises(ValueError, match="not an option"):
        kernel_names.parse_ncu_selection(["--launch-cout", "5"])
    with pytest.raises(ValueError, match="on or off"):
        kernel_names.parse_ncu_selection(["--profile-from-start", "maybe"])
    with pytest.raises(ValueError, match="needs a value"):
        kernel_names.parse_ncu_selection(["--launch-count"])


def test_selected_launches_follow_ncus_rules():
    launches = _launches()
    first = kernel_names.select_launches(launches, ["--launch-skip", "0", "--launch-count", "4"])
    assert list(first["range"]) == ["outside", "outside", "reference", "reference"]
    ranged = kernel_names.select_launches(launches, ["--profile-from-start", "off", "--launch-count", "4"])
    assert list(ranged["range"]) == ["timed"] * 4 and list(ranged["index"]) == [0, 1, 2, 3]
    nvtx = kernel_names.select_launches(launches, ["--nvtx", "--nvtx-include", "warm-up/", "-s", "1", "-c", "100"])
    assert list(nvtx["range"]) == ["warm-up"] * 7
    counted = kernel_names.select_launches(launches, ["--launch-skip", "15", "--launch-count", "3"])
    assert list(counted["range"]) == ["timed"] * 3
    text = kernel_names.describe_selection(first, launches)
    assert "launches 0-3 of 27" in text and "2 in 'outside'" in text and "2 in 'reference'" in text
    assert "no launch" in kernel_names.describe_selection(first.iloc[:0], launches)


def test_launch_times_are_compared_position_by_position():
    # Two iterations of a 3-launch forward in the PyTorch profiler; ncu saw launches 1 and 2 of the first.
    torch_side = pd.DataFrame({"kernel": ["void a::conv<1>(x)", "bn", "relu"] * 2, "index": range(6),
                                      "time_ns": [10.0, 20.0, 30.0, 12.0, 22.0, 50.0]})
    ncu = pd.DataFrame({"kernel": ["bn", "void at::relu<float>(int)"], "gpu__time_duration.sum": [42.0, 80.0]})
    table = kernel_names.compare_launch_times(ncu, torch_side, per_forward=3, first_index=1)
    assert list(table["position"]) == [1, 2]
    assert list(table["torch_ns"]) == [21.0, 40.0]  # medians over the two iterations
    assert list(table["ratio"]) == [2.0, 2.0]
    assert list(table["same_kernel"]) == [True, True]  # namespaces and templates do not matter
    shifted = kernel_names.compare_launch_times(ncu, torch_side, per_forward=3, first_index=0)
    assert not shifted["same_kernel"].any()  # off by one launch: not the same kernels

