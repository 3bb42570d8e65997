"""The kernel census (inference.kernel_census): each name read into the right kind of work, counts per
step (not per profiled window), and on a CPU run of ResNet-18 the batch norms present in eager mode and
gone with Inductor's freezing, all measured in a subprocess."""

from __future__ import annotations

import pandas as pd
import pytest

from inference.config import BenchmarkConfig
from inference.kernel_census import (BATCH_NORM, CONVOLUTION, COPY_LAYOUT, FUSED, KINDS, MATRIX_PRODUCT, OTHER, Census,
                                     CensusError, census_table, kernel_kind, take_census)

BASE = BenchmarkConfig(network="resnet18", batch_size=2, input_size=64, warmup=1, iterations=3, device="cpu",
                       progress=False)


@pytest.mark.parametrize("name,kind", [
    ("void cudnn::bn_fw_inf_1C11_kernel_NCHW<float, float, true, 1>(float, float, cudnnTensorStruct)", BATCH_NORM),
    ("triton_poi_fused__native_batch_norm_legit_no_training_relu_3", BATCH_NORM),  # fused, still a batch norm
    ("graph_0_cpp_fused__native_batch_norm_legit_no_training_add_relu_6", BATCH_NORM),
    ("triton_poi_fused_convolution_relu_2", FUSED),  # after freezing: the folded bias and the ReLU
    ("graph_1_cpp_fused_addmm_mean_view_3", FUSED),
    ("sm90_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32", CONVOLUTION),
    ("aten::conv2d", CONVOLUTION),
    ("mkldnn::_convolution_pointwise", CONVOLUTION),
    ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", MATRIX_PRODUCT),
    ("aten::linear", MATRIX_PRODUCT),
    ("mkl::_mkl_linear", MATRIX_PRODUCT),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar", FUSED),
    ("aten::add_", FUSED),
    ("Memcpy HtoD (Pageable -> Device)", COPY_LAYOUT),
    ("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>",
     COPY_LAYOUT),
    ("aten::max_pool2d", OTHER),
    ("some_kernel_no_rule_knows", OTHER),
])
def test_each_name_is_read_into_its_kind(name, kind):
    assert kernel_kind(name) == kind


def _census(rows, steps=2, label="x"):
    kernels = pd.DataFrame(rows, columns=["kernel", "calls", "total_us"])
    frame = pd.DataFrame({"kernel": kernels["kernel"], "kind": kernels["kernel"].map(kernel_kind),
                          "per_step": kernels["calls"] / steps, "ms_per_step": kernels["total_us"] / 1e3 / steps})
    return Census(label, "test", True, "device kernels", steps, "passed", frame)


def test_shares_cover_every_kind_and_add_up():
    census = _census([["aten::conv2d", 40, 6000.0], ["aten::batch_norm", 40, 3000.0], ["aten::add_", 16, 1000.0]])
    kinds = census.by_kind()
    assert list(kinds.index) == list(KINDS) and kinds["share_pct"].sum() == pytest.approx(100.0)
    assert census.per_step == 48 and census.ms_per_step == pytest.approx(5.0)
    assert census.share(CONVOLUTION) == pytest.approx(60.0) and census.share(MATRIX_PRODUCT) == 0.0
    with pytest.raises(ValueError, match="unknown kind"):
        census.share("batchnorm")
    table = census_table({"x": census})
    assert table.loc["x", "kernels_per_step"] == 48 and table.loc["x", "batch norm %"] == pytest.approx(30.0)


def test_bad_requests_are_refused_before_a_subprocess_starts():
    with pytest.raises(ValueError, match="mode='inference'"):
        take_census({"train": BASE.replace(mode="training")})
    with pytest.raises(ValueError, match="steps must be at least 1"):
        take_census({"eager": BASE}, steps=0)
    with pytest.raises(ValueError, match="no configuration"):
        take_census({})


def test_a_failing_configuration_comes_back_as_one_message():
    with pytest.raises(CensusError, match="unknown network 'resnet5'"):
        take_census({"typo": BASE.replace(network="resnet5")})


def test_counts_are_per_step_whatever_the_profiled_window():
    one, three = take_census({"eager": BASE}, steps=1)["eager"], take_census({"eager": BASE}, steps=3)["eager"]
    assert one.steps == 1 and three.steps == 3
    # eager ResNet-18: 20 convolutions, 20 batch norms, 17 ReLUs, 8 additions, pooling, flatten, linear
    assert one.per_step == three.per_step == 69
    counts = three.by_kind()["per_step"]
    assert counts[CONVOLUTION] == 20 and counts[BATCH_NORM] == 20 and counts[MATRIX_PRODUCT] == 1
    assert not three.on_device and "CPU operators" in three.source and three.check == "passed"


@pytest.mark.slow
def test_freezing_folds_every_batch_norm_away():
    # about 30 s on 2 cores: one Inductor compile with freezing, in the subprocess
    censuses = take_census({"eager": BASE, "frozen": BASE.replace(compile=True, freeze=True)}, steps=2)
    eager, frozen = censuses["eager"], censuses["frozen"]
    assert eager.share(BATCH_NORM) > 0 and eager.by_kind().loc[BATCH_NORM, "per_step"] == 20
    assert frozen.share(BATCH_NORM) == 0 and frozen.by_kind().loc[BATCH_NORM, "per_step"] == 0
    assert frozen.check == "passed" and frozen.per_step < eager.per_step
    assert frozen.by_kind().loc[CONVOLUTION, "per_step"] == 20  # the convolutions stay, now with the batch norms inside
