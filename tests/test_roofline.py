"""Roofline: measured roofs, work per operator, points, classification and the plot."""

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
import torch
from fake_profiler import FakeProfiler

from tinyllama.config import get_preset
from tinyllama.costs import flops as model_flops
from tinyllama.harness.bench import TrainingStep, make_batches
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


# --- attribution: work and time of the same calls, and a roofline that is physically possible ----------

def _below_the_roof(points, roofs, tolerance=0.10):
    """Every placeable point at most ``tolerance`` above min(compute roof, bandwidth x intensity),
    computed here from first principles (not with the library's own check)."""
    bad = []
    for _, p in points.iterrows():
        if not (p["flops"] > 0 and p["bytes"] > 0 and p["time_ms"] > 0):
            continue
        achieved = p["flops"] / (p["time_ms"] / 1e3) / 1e12
        attainable = min(max(roofs.compute_tflops.values()), roofs.bandwidth_tbs * p["flops"] / p["bytes"])
        if achieved > (1 + tolerance) * attainable:
            bad.append(f"{p['operator']}: {achieved:.3g} TFLOP/s > roof {attainable:.3g}")
    return bad


class _Kernel:
    def __init__(self, name, us):
        self.name, self.duration = name, us


class _Ev:
    """A host event of torch.profiler's events() / key_averages(), as much of it as the code reads."""

    def __init__(self, name, parent=None, kernels=(), shapes=None, dtypes=None, kwinputs=None, device=False,
                 self_us=0.0, count=1):
        self.name = self.key = name
        self.cpu_parent = parent
        self.kernels = [_Kernel(k, us) for k, us in kernels]
        self.input_shapes, self.input_dtypes, self.kwinputs = shapes, dtypes, kwinputs or {}
        self.device_type = "DeviceType.CUDA" if device else "DeviceType.CPU"
        self.self_cpu_time_total = self.cpu_time_total = 0.0 if device else 1.0
        self.self_device_time_total = self.device_time_total = self_us
        self.count = count


N = 16 * 512 * 1024  # elements of one activation of the H200 figure's medium preset


def _compiled_step_profile():
    """One step of a compiled model (V4-like), as the profiler records it: the eager twin's counting saw
    170 adds in the blocks and the head; the compiled run runs one add as an operator (in the uncompiled
    head, 1 us of kernel), the blocks' adds are inside a fused Triton kernel launched from its own range."""
    from tinyllama.profiling.torch_profiler import ProfileRun

    region = _Ev("Torch-Compiled Region: 0/0")
    fused = _Ev("triton_poi_fused_add_mul_0", region, [("triton_poi_fused_add_mul_0", 60.0)],
                shapes=[[N], [N], [N], []], dtypes=["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar"])
    mm = _Ev("aten::mm", region, [("nvjet_sm90_gemm", 500.0)], shapes=[[8192, 1024], [1024, 4096]],
             dtypes=["c10::BFloat16", "c10::BFloat16"])
    head_add = _Ev("aten::add", None, [("vectorized_elementwise_kernel<add>", 1.0)], shapes=[[2, 1024], [2, 1024]],
                   dtypes=["float", "float"])
    events = [region, fused, mm, head_add]
    averages = [_Ev("aten::mm", self_us=500.0), _Ev("aten::add", self_us=1.0),
                _Ev("triton_poi_fused_add_mul_0"), _Ev("Torch-Compiled Region: 0/0"),
                _Ev("nvjet_sm90_gemm", device=True, self_us=500.0),
                _Ev("vectorized_elementwise_kernel<add>", device=True, self_us=1.0),
                _Ev("triton_poi_fused_add_mul_0", device=True, self_us=60.0)]
    run = ProfileRun(FakeProfiler(events, averages), torch.device("cuda"), steps=1, trace_path=None)
    mm_flops, mm_bytes = 2 * 8192 * 1024 * 4096, 2 * (8192 * 1024 + 1024 * 4096 + 8192 * 4096)
    work = pd.DataFrame([
        {"operator": "aten::mm", "category": "GEMM (projections)", "calls": 1, "flops": mm_flops,
         "flop_source": "flop_counter", "bytes": mm_bytes, "precision": "bf16"},
        {"operator": "aten::add", "category": "element-wise", "calls": 170, "flops": 169 * N + 2048,
         "flop_source": "estimate: 1 per element", "bytes": 169 * 12 * N + 3 * 4 * 2048, "precision": "fp32"}])
    work.attrs["per_call"] = {  # as count_operator_work records it: (operator, shapes) -> (calls, FLOPs, bytes)
        ("aten::mm", ((8192, 1024), (1024, 4096))): (1, mm_flops, mm_bytes),
        ("aten::add", ((N,), (N,))): (169, 169 * N, 169 * 12 * N),
        ("aten::add", ((2, 1024), (2, 1024))): (1, 2048, 3 * 4 * 2048)}
    return work, run


def test_compiled_step_attribution_divides_each_kernels_work_by_its_own_time():
    # H200-like roofs (measured and datasheet): 4.2 TB/s copy, 785 TFLOP/s bf16, 51 TFLOP/s fp32.
    roofs = rl.Roofs("H200", {"fp32": 51.2, "bf16": 785.0}, 4.2, {"fp32": 67.0, "bf16": 989.4}, 4.8)
    work, run = _compiled_step_profile()
    points = rl.operator_points(work, run, roofs, label="V4")
    # Today's figure: 170 adds' FLOPs over the time of the one add left in the head -> ~1000x the roof.
    assert _below_the_roof(points, roofs) == []
    p = points.set_index("operator")
    add = p.loc["aten::add"]
    assert add["calls"] == 1 and add["flops"] == 2048 and add["bytes"] == 3 * 4 * 2048
    assert add["time_ms"] == pytest.approx(1e-3)
    fused = p.loc["triton_poi_fused_add_mul_0"]  # one point: its own time, bytes of its own arguments
    assert fused["time_ms"] == pytest.approx(0.06) and fused["bytes"] == 3 * 2 * N
    assert fused["flops"] == 2 * N and fused["kind"] == "fused kernel"  # add and mul: one FLOP each per element
    assert fused["tbs"] == pytest.approx(3 * 2 * N / 60e-6 / 1e12)
    assert p.loc["aten::mm", "time_ms"] == pytest.approx(0.5)
    assert points["time_ms"].sum() == pytest.approx(0.561)  # every kernel once, no time invented or lost


def test_fused_kernel_bytes_from_inductor_where_it_records_them():
    work, run = _compiled_step_profile()
    fused = next(e for e in run.profiler.events() if e.name.startswith("triton_"))
    fused.kwinputs = {"kernel_num_gb": 4 * 2 * N / 1e9}  # Inductor counts an in-out buffer twice
    points = rl.operator_points(work, run, H100ISH).set_index("operator")
    assert points.loc["triton_poi_fused_add_mul_0", "bytes"] == pytest.approx(4 * 2 * N)
    assert "Inductor" in points.loc["triton_poi_fused_add_mul_0", "flop_source"]
    fused.input_shapes = fused.input_dtypes = None  # nothing recorded: time kept, no work invented
    fused.kwinputs = {}
    points = rl.operator_points(work, run, H100ISH).set_index("operator")
    assert points.loc["triton_poi_fused_add_mul_0", "time_ms"] == pytest.approx(0.06)
    assert points.loc["triton_poi_fused_add_mul_0", "bytes"] == 0


def test_check_physical_flags_points_above_the_roof_and_keeps_those_below(tmp_path):
    roofs = rl.Roofs("gpu", {"fp32": 50.0, "bf16": 800.0}, 3.0)
    points = rl.classify(pd.DataFrame({
        "operator": ["gemm", "add", "mul", "near"], "flops": [8e12, 1e9, 3.5e9, 1e9], "bytes": [4e9, 12e9, 2.6e10, 12e9],
        "time_ms": [20.0, 8.0, 0.2, 3.8], "precision": ["bf16", "fp32", "fp32", "fp32"],
        "flop_source": ["flop_counter", "estimate: 1 per element", "estimate: 1 per element", "estimate: 1 per element"]}),
        roofs)
    points.insert(0, "label", "V4")
    above = rl.check_physical(points, roofs)
    # mul moves 26 GB in 0.2 ms (130 TB/s on a 3 TB/s device); "near" is 5% over the roof: measurement noise
    assert list(above["operator"]) == ["mul"] and above["roof_ratio"].iloc[0] == pytest.approx(130 / 3, rel=1e-3)
    assert rl.check_physical(points, roofs, tolerance=0.01)["operator"].tolist() == ["mul", "near"]
    with pytest.raises(rl.AboveRoofError, match="mul"):
        rl.check_physical(points, roofs, strict=True)
    # the datasheet is the physical limit: a kernel may beat the measured copy, not the datasheet
    sheet = rl.Roofs("gpu", {"fp32": 50.0, "bf16": 800.0}, 3.0, {"fp32": 60.0, "bf16": 900.0}, 3.35)
    assert rl.check_physical(points, sheet, tolerance=0.01)["operator"].tolist() == ["mul"]
    with pytest.warns(rl.AboveRoofWarning, match="mul"):
        fig = rl.plot_roofline({"V4": points}, roofs, tmp_path / "r.png")
    drawn = [t.get_text() for t in fig.axes[0].texts]
    assert "mul" not in drawn and "add" in drawn and "gemm" in drawn
    assert any("1 above the roof not drawn" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
    with pytest.raises(rl.AboveRoofError):
        rl.plot_roofline({"V4": points}, roofs, strict=True)


def _best_roofs(tries=3):
    """Roofs of this CPU for a CI-sized model: the best of a few measurements (a shared 2-core CPU's
    single matmul timing can be 100x off), a copy small enough to stay in cache like the model's tensors,
    and, a CPU's precisions sharing its vector units, the best matmul rate as every precision's roof."""
    runs = [rl.measure_roofs("cpu", matmul_size=128, copy_bytes=2**16) for _ in range(tries)]
    peak = max(v for r in runs for v in r.compute_tflops.values())
    return rl.Roofs("cpu", {p: peak for p in rl.PRECISIONS}, max(r.bandwidth_tbs for r in runs))


def test_points_of_a_real_cpu_step_are_below_their_roofs(points):
    _, fp32, bf16 = points
    roofs = _best_roofs()
    # Tolerance 2x, not the default 10%: this CPU is shared (the roofs and the step are timed under other
    # jobs' load). An attribution error is 10x to 1000x above the roof, still caught.
    for frame in (fp32, bf16):
        above = rl.check_physical(frame, roofs, tolerance=1.0)
        assert above.empty, above[["operator", "roof_ratio"]]
        assert _below_the_roof(frame, roofs, tolerance=1.0) == []
        timed = frame[frame["kind"] == "operator"]
        assert (timed["calls"] > 0).all()  # work only for the calls the profiler timed


# --- the physical check on every point, bytes-only ones included; where each point's time is shown ---------------

def _synthetic_points():
    """Roofs 50 TFLOP/s fp32, 800 bf16, 3 TB/s (no datasheet): one point of each kind the check must judge."""
    rows = [  # operator, kind, flops, bytes, time_ms, precision, flop_source
        ("gemm above its compute roof", "operator", 8e12, 1e9, 5.0, "bf16", "flop_counter"),  # 1600 TFLOP/s
        ("copy faster than the bandwidth", "operator", 0.0, 6e9, 0.5, "none", "none"),  # 12 TB/s: 4x
        ("legal gemm", "operator", 8e12, 1e9, 20.0, "bf16", "flop_counter"),  # 400 TFLOP/s
        ("legal copy", "operator", 0.0, 6e9, 2.5, "none", "none"),  # 2.4 TB/s
        ("triton_poi_fused_add_mul_0", "fused kernel", 4e12, 3e9, 1.2, "bf16",  # a wild FLOP guess, 2.5 TB/s
         "estimate: 2 per element (kernel name); bytes: Inductor"),
        ("triton_poi_fused__to_copy_1", "fused kernel", 0.0, 3e9, 0.1, "bf16", "none; bytes: Inductor"),  # 30 TB/s
        ("(time not matched to an operator)", "other", 0.0, 0.0, 0.7, "none", "none"),
    ]
    frame = pd.DataFrame(rows, columns=["operator", "kind", "flops", "bytes", "time_ms", "precision", "flop_source"])
    frame["category"] = "other"
    return frame


ROOFS_3TBS = rl.Roofs("gpu", {"fp32": 50.0, "bf16": 800.0}, 3.0)


def test_check_physical_judges_every_point_by_the_roof_it_can_reach():
    flagged = rl.check_physical(_synthetic_points(), ROOFS_3TBS).set_index("operator")
    assert set(flagged.index) == {"gemm above its compute roof", "copy faster than the bandwidth",
                                  "triton_poi_fused__to_copy_1"}
    assert flagged.loc["gemm above its compute roof", "check"] == "roofline"
    assert flagged.loc["gemm above its compute roof", "roof_ratio"] == pytest.approx(2.0)
    copy = flagged.loc["copy faster than the bandwidth"]  # bytes only: time >= bytes / bandwidth
    assert copy["check"] == "bandwidth" and copy["roof_ratio"] == pytest.approx(4.0) and copy["tbs"] == pytest.approx(12.0)
    assert "over-counted" in copy["why"]
    assert flagged.loc["triton_poi_fused__to_copy_1", "roof_ratio"] == pytest.approx(10.0)
    # The fused kernel with guessed FLOPs is judged by its bytes (2.5 TB/s: legal), not by the guess (3300 TFLOP/s).
    assert "triton_poi_fused_add_mul_0" not in flagged.index
    with pytest.raises(rl.AboveRoofError, match="copy faster than the bandwidth at 12 TB/s, 4x faster"):
        rl.check_physical(_synthetic_points(), ROOFS_3TBS, strict=True)
    # The datasheet's bandwidth is the physical limit: 4x the measured copy is still beyond 3.35 TB/s x 1.1.
    sheet = rl.Roofs("gpu", {"fp32": 50.0, "bf16": 800.0}, 3.0, {"fp32": 67.0, "bf16": 989.4}, 3.35)
    assert "copy faster than the bandwidth" in set(rl.check_physical(_synthetic_points(), sheet)["operator"])


def test_placement_shares_add_up_to_the_device_time():
    points = _synthetic_points()
    flagged = rl.check_physical(points, ROOFS_3TBS)
    where = rl.placement(points, flagged).set_axis(points["operator"])
    assert where["legal gemm"] == "roofline" and where["legal copy"] == "bandwidth chart"
    assert where["triton_poi_fused_add_mul_0"] == "bandwidth chart"  # bytes known, FLOPs a guess
    assert where["copy faster than the bandwidth"] == "flagged: faster than its roof"
    assert where["(time not matched to an operator)"] == "no work known"
    table = rl.placement_summary(points, flagged).set_index("placement")
    assert table["time_ms"].sum() == pytest.approx(points["time_ms"].sum())
    assert table.loc["roofline", "time_ms"] == pytest.approx(20.0)
    assert table.loc["bandwidth chart", "time_ms"] == pytest.approx(2.5 + 1.2)
    assert table.loc["flagged: faster than its roof", "time_ms"] == pytest.approx(5.0 + 0.5 + 0.1)
    assert table["pct"].sum() == pytest.approx(100.0)
    assert table.loc["bandwidth chart", "fused_pct"] == pytest.approx(100 * 1.2 / 1.3)


def test_bandwidth_chart_and_roofline_share_the_points_between_them(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = _synthetic_points()
    points.insert(0, "label", "V4")
    kept = points.drop(index=rl.check_physical(points, ROOFS_3TBS).index)
    fig = rl.plot_bandwidth({"V4": kept}, ROOFS_3TBS)
    bars = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert bars == ["V4: legal copy", "V4: triton_poi_fused_add_mul_0"]  # longest first, top down
    assert fig.axes[0].get_xscale() == "log" and "TB/s" in fig.axes[0].get_xlabel()
    assert rl.overlapping_labels(fig) == []
    plt.close(fig)
    fig = rl.plot_roofline({"V4": rl.classify(kept, ROOFS_3TBS)}, ROOFS_3TBS, tmp_path / "r.png", guessed_fused=False)
    drawn = [t.get_text() for t in fig.axes[0].texts]
    assert "legal gemm" in drawn and not any("triton" in t for t in drawn)
    assert any("not on this chart" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
    plt.close(fig)


def test_top_kernels_take_the_time_of_the_step():
    points = pd.DataFrame({"operator": ["a"], "time_ms": [1.0]})
    points.attrs["kernels"] = [("void at::native::elementwise<1>(int)", 1.0), ("nvjet_gemm_a", 6.0), ("softmax", 2.0),
                               ("nvjet_gemm_b", 1.0)]
    assert rl.top_kernels(points, share=0.7) == (["nvjet_gemm_a", "softmax"], pytest.approx(0.8))
    assert rl.top_kernels(points, share=1.0, limit=1) == (["nvjet_gemm_a"], pytest.approx(0.6))
    assert rl.top_kernels(pd.DataFrame({"time_ms": []})) == ([], 0.0)  # no kernels recorded: a CPU
    with pytest.raises(ValueError):
        rl.top_kernels(points, share=0.0)


def test_a_causal_fused_kernel_is_credited_with_the_triangle_it_computes():
    from tinyllama.costs.flops import causal_pairs

    q, k, v = (torch.randn(2, 4, 33, 8, requires_grad=True) for _ in range(3))
    for causal, pairs in ((True, 33 * 34 // 2), (False, 33 * 33)):
        work = rl.count_operator_work(
            lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward())
        by_op = work.set_index("operator")["flops"]
        forward = by_op[[o for o in by_op.index if "attention" in o and "backward" not in o]].sum()
        backward = by_op[[o for o in by_op.index if "attention" in o and "backward" in o]].sum()
        assert forward == 2 * 2 * 4 * pairs * (8 + 8)  # q kᵀ and p v over the pairs computed
        assert backward == 2 * 2 * 4 * pairs * (3 * 8 + 2 * 8)
    assert causal_pairs(4, 4) == 10 and causal_pairs(2, 5) == 3 and causal_pairs(5, 2) == 3 + 3 * 2
    # The model FLOPs (MFU) keep the full square whatever the kernel skips.
    from tinyllama.profiling.flops import count_flops

    assert count_flops(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)).total == \
        2 * 2 * 4 * 33 * 33 * 16


def test_an_operator_that_returns_its_inputs_memory_moves_no_bytes():
    a, b = torch.randn(4, 8, 16), torch.randn(16, 5)
    work = rl.count_operator_work(lambda: (a @ b).contiguous().add_(1.0)).set_index("operator")
    # matmul folds the batch into rows and views the product back: _unsafe_view, an undeclared view
    assert work.loc["aten::_unsafe_view", "bytes"] == 0
    assert work.loc["aten::mm", "bytes"] == 4 * (32 * 16 + 16 * 5 + 32 * 5)
    assert work.loc["aten::add_", "bytes"] == 2 * 4 * 32 * 5  # in place: read and written, it does move its bytes
    copied = rl.count_operator_work(lambda: a.transpose(0, 1).contiguous()).set_index("operator")
    assert copied["bytes"].sum() == 2 * 4 * a.numel()  # a real copy: read once, written once


def test_bandwidth_chart_of_two_full_versions_keeps_its_labels_apart(tmp_path):
    # Sixteen bars, the lowest ones close to the copy bandwidth: where the legend sat inside the axes
    # (lower right), their labels ran into it.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def version(label: str, scale: float) -> pd.DataFrame:
        rows = [{"operator": f"triton_poi_fused_{label}_{i}", "category": "element-wise", "flops": 0.0,
                 "bytes": 2.9e12 * (0.2 + 0.1 * i) * 1e-3 * scale, "time_ms": (0.2 + 0.1 * i) * scale}
                for i in range(7)]
        # a tiny operator far below the bandwidth stretches the log axis: the others end near its right edge
        if label == "v1":
            rows.append({"operator": "ones_like", "category": "element-wise", "flops": 0.0, "bytes": 8.0,
                         "time_ms": 0.001})
        return pd.DataFrame(rows)

    points = {"V1": version("v1", 1.0), "V4": version("v4", 0.5)}
    roofs = dataclasses.replace(ROOFS_3TBS, datasheet_tbs=3.35)  # two roof lines: a legend of two rows
    fig = rl.plot_bandwidth(points, roofs, top=8)
    fig.tight_layout()
    assert len(fig.axes[0].get_yticklabels()) == 15
    assert rl.overlapping_labels(fig) == []
    fig.savefig(tmp_path / "bandwidth.png")
    plt.close(fig)


def test_the_spine_counts_intensity_without_the_profiling_package():
    """tinyllama.costs.intensity (the spine) imports downward only: the causal count lives in tinyllama.costs.flops."""
    import subprocess
    import sys

    code = "import sys, tinyllama.costs.intensity; print(sorted(m for m in sys.modules if m.startswith('tinyllama.profiling')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
