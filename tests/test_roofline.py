"""Roofline: measured roofs, work per operator, points, classification and the plot."""

from pathlib import Path

import pandas as pd
import pytest
import torch

from tinyllama import flops as model_flops
from tinyllama.bench import TrainingStep, make_batches
from tinyllama.config import get_preset
from tinyllama.models import build
from tinyllama.profiling import roofline as rl
from tinyllama.profiling import vendor

PRESET = get_preset("ci")
CONFIG = PRESET.model
DATA = Path(__file__).parent / "data"
H100ISH = rl.Roofs("test device", {"fp32": 50.0, "tf32": 400.0, "bf16": 800.0, "fp16": 780.0}, 3.0,
                   {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}, 3.35)


def test_roofs_measured_on_the_cpu_are_positive_and_plausible():
    roofs = rl.measure_roofs("cpu", matmul_size=128, copy_bytes=2**23)
    for precision in rl.PRECISIONS:
        assert 1e-6 < roofs.compute_tflops[precision] < 50  # a 2-core CPU: well above a MFLOP/s, far below 50 TFLOP/s
    assert 1e-5 < roofs.bandwidth_tbs < 2
    assert roofs.datasheet_tbs is None and all(v is None for v in roofs.datasheet_tflops.values())
    table = roofs.table()
    assert list(table["ceiling"]) == ["matmul fp32", "matmul tf32", "matmul bf16", "matmul fp16", "copy (read + write)"]
    assert table["measured_pct_of_datasheet"].isna().all()  # no invented peak for a CPU


def test_ridge_point_and_classification():
    assert H100ISH.ridge("bf16") == pytest.approx(800 / 3)
    assert H100ISH.compute("int8") == 50.0  # an unmeasured precision falls back to fp32's roof
    points = pd.DataFrame({
        "operator": ["gemm", "add", "copy"], "flops": [8e12, 1e9, 0], "bytes": [4e9, 12e9, 8e9],
        "time_ms": [20.0, 8.0, 4.0], "precision": ["bf16", "fp32", "fp32"],
        "flop_source": ["flop_counter", "estimate: 1 per element", "none"]})
    p = rl.classify(points, H100ISH).set_index("operator")
    assert p.loc["gemm", "intensity"] == 2000 and p.loc["gemm", "bound"] == "compute"
    assert p.loc["gemm", "attainable_tflops"] == 800 and p.loc["gemm", "tflops"] == pytest.approx(400)
    assert p.loc["gemm", "pct_of_roof"] == pytest.approx(50) and p.loc["gemm", "roof_time_ms"] == pytest.approx(10)
    assert p.loc["add", "bound"] == "memory" and p.loc["add", "attainable_tflops"] == pytest.approx(1e9 / 12e9 * 3)
    assert p.loc["add", "roof_time_ms"] == pytest.approx(4.0) and p.loc["add", "excess_ms"] == pytest.approx(4.0)
    assert p.loc["copy", "roof_time_ms"] == pytest.approx(8e9 / 3e12 * 1e3) and p.loc["copy", "bound"] == "memory"
    assert p["time_pct"].sum() == pytest.approx(100)


def test_work_of_a_known_gemm_and_of_views_and_broadcasts():
    m, k, n = 37, 53, 29
    a, b = torch.randn(m, k), torch.randn(n, k)
    work = rl.count_operator_work(lambda: a @ b.t()).set_index("operator")  # b.t() is a view: no traffic
    mm = work.loc["aten::mm"]
    assert mm["flops"] == 2 * m * n * k and mm["flop_source"] == "flop_counter"
    assert mm["bytes"] == 4 * (m * k + k * n + m * n) and mm["precision"] == "fp32"
    assert "aten::t" not in work.index
    column, x = torch.randn(m, 1), torch.randn(m, n)
    work = rl.count_operator_work(lambda: x + column.expand(m, n)).set_index("operator")
    add = work.loc["aten::add"]
    assert add["bytes"] == 4 * (m * n + m + m * n)  # the broadcast column is read once
    assert add["flops"] == m * n and add["flop_source"].startswith("estimate")
    y = torch.randn(m, n)
    work = rl.count_operator_work(lambda: y.mul_(2.0)).set_index("operator")
    assert work.loc["aten::mul_", "bytes"] == 2 * 4 * m * n  # read and written in place


def _training_step(precision):
    torch.manual_seed(0)
    step = TrainingStep(build("v1", CONFIG), precision, "cpu")
    (inputs, targets), = make_batches(CONFIG, PRESET.batch_size, PRESET.seq_len, count=1)
    return lambda: step(inputs, targets)


def test_work_of_a_training_step_matches_the_analytic_flops():
    work = rl.count_operator_work(_training_step("fp32"))
    counted = work.loc[work["flop_source"] == "flop_counter", "flops"].sum()
    assert counted == model_flops.training_flops(CONFIG, PRESET.batch_size, PRESET.seq_len)
    assert (work.loc[work["flops"] > 0, "bytes"] > 0).all()
    assert set(work.loc[work["operator"].isin(["aten::mm", "aten::bmm"]), "precision"]) == {"fp32"}
    bf16 = rl.count_operator_work(_training_step("bf16")).set_index("operator")
    assert bf16.loc["aten::mm", "precision"] == "bf16"  # autocast runs the projections in bf16


@pytest.fixture(scope="module")
def points():
    roofs = rl.measure_roofs("cpu", matmul_size=128, copy_bytes=2**23)
    fp32 = rl.roofline_points(_training_step("fp32"), roofs, label="V1 fp32", device="cpu", active=2)
    bf16 = rl.roofline_points(_training_step("bf16"), roofs, label="V1 bf16", device="cpu", active=2)
    return roofs, fp32, bf16


def test_points_of_a_step(points):
    roofs, fp32, _ = points
    assert {"label", "operator", "category", "flops", "bytes", "time_ms", "intensity", "tflops", "bound",
            "attainable_tflops", "excess_ms", "time_pct"} <= set(fp32.columns)
    assert set(fp32["label"]) == {"V1 fp32"} and fp32["time_ms"].is_monotonic_decreasing
    mm = fp32.set_index("operator").loc["aten::mm"]
    assert mm["time_ms"] > 0 and mm["tflops"] == pytest.approx(mm["flops"] / mm["time_ms"] / 1e9)
    assert mm["bound"] in ("compute", "memory") and mm["attainable_tflops"] <= roofs.compute("fp32") + 1e-12
    assert fp32["time_pct"].sum() == pytest.approx(100)


def test_compare_and_summaries(points):
    _, fp32, bf16 = points
    compared = rl.compare_points(fp32, bf16).set_index("operator")
    assert compared.loc["aten::mm", "speedup"] == pytest.approx(
        compared.loc["aten::mm", "time_ms_before"] / compared.loc["aten::mm", "time_ms_after"])
    assert "aten::_to_copy" in compared.index  # autocast's casts exist only in bf16
    summary = rl.category_summary(pd.concat([fp32, bf16]))
    assert set(summary["label"]) == {"V1 fp32", "V1 bf16"}
    assert summary.groupby("label")["time_ms"].sum()["V1 fp32"] == pytest.approx(fp32["time_ms"].sum())


def test_roofline_plot_renders(points, tmp_path):
    roofs, fp32, bf16 = points
    path = tmp_path / "roofline.png"
    fig = rl.plot_roofline({"V1 fp32": fp32, "V1 bf16": bf16}, roofs, path, title="V1 fp32 vs bf16")
    assert path.stat().st_size > 20_000
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert "mm" in labels and "bmm" in labels  # the biggest operators are named
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(text.startswith("V1 fp32") for text in legend) and any("measured fp32" in t for t in legend)
    with pytest.raises(ValueError, match="no points"):
        rl.plot_roofline({}, roofs)


def test_kernel_points_from_ncu_counters(tmp_path):
    kernels = vendor.ncu_roofline_points(vendor.read_ncu_csv(DATA / "ncu_details.csv"))
    points = rl.kernel_points(kernels, H100ISH, label="ncu").set_index("operator")
    gemm = points.loc[rl.short_kernel_name(kernels["kernel"][0])]
    assert gemm.name.startswith("sm90_xmma_gemm") and len(gemm.name) == 40
    assert gemm["bound"] == "compute" and gemm["precision"] == "bf16" and gemm["roof_tflops"] == 800
    add = points.loc["vectorized_elementwise_kernel"]
    assert add["bound"] == "memory" and add["precision"] == "fp32" and add["category"] == "element-wise"
    assert add["tbs"] == pytest.approx(201.33e6 / 60.16e-6 / 1e12)
    rl.plot_roofline(points.reset_index(), H100ISH, tmp_path / "ncu.png")
    assert (tmp_path / "ncu.png").exists()


def test_short_kernel_names():
    assert rl.short_kernel_name("void at::native::vectorized_elementwise_kernel<4, at::native::X>(int, T2)") == \
        "vectorized_elementwise_kernel"
    assert len(rl.short_kernel_name("x" * 100)) == 40
