"""The PyTorch profiler helpers, the memory views and the FLOP counters (DeepSpeed and flop_counter)."""

import json
import sys

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from conftest import GPU
from fake_profiler import FakeProfiler

from tinyllama import device as dev
from tinyllama.config import get_preset
from tinyllama.harness.bench import TrainingStep, make_batches
from tinyllama.models import build
from tinyllama.models.v1_baseline import Attention, Block, TinyLlama
from tinyllama.profiling import flops as pflops
from tinyllama.profiling import memory
from tinyllama.profiling import torch_profiler as tp
from tinyllama.profiling.vendor import KERNEL_COLUMNS

PRESET = get_preset("ci")
CONFIG = PRESET.model
MIB = 2**20


def _step(precision="fp32", batch_size=PRESET.batch_size, seed=0):
    torch.manual_seed(seed)
    model = build("v1", CONFIG)
    step = TrainingStep(model, precision, "cpu")
    (inputs, targets), = make_batches(CONFIG, batch_size, PRESET.seq_len, count=1, seed=seed)
    return step, inputs, targets


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    step, inputs, targets = _step()
    folder = tmp_path_factory.mktemp("traces")
    return tp.profile_steps(lambda: step(inputs, targets), wait=0, warmup=1, active=2, trace_dir=folder,
                            record_shapes=True)


# --- the PyTorch profiler --------------------------------------------------------------------------

def test_operator_table_counts_the_matmuls_of_a_step(run):
    ops = run.operators()
    assert {"name", "kind", "category", "calls_per_step", "self_cpu_ms", "self_device_ms"} <= set(ops.columns)
    mm = ops.set_index("name").loc["aten::mm"]
    # 7 projections per layer + the output head, forward; the backward does two products for each
    assert mm["calls_per_step"] == 3 * (7 * CONFIG.num_layers + 1)
    assert mm["kind"] == "operator" and mm["category"] == tp.GEMM
    assert set(ops.loc[ops["name"].isin(tp.PHASES), "kind"]) == {"annotation"}
    assert ops["self_cpu_ms"].is_monotonic_decreasing  # sorted by CPU time on a CPU


def test_top_operators_and_the_cpu_has_no_device_kernels(run):
    top = run.top(5)
    assert len(top) == 5 and set(top["kind"]) == {"operator"}
    assert top["self_cpu_ms"].is_monotonic_decreasing and 0 < top["share_pct"].sum() <= 100
    kernels = run.kernels()
    assert tuple(kernels.columns) == KERNEL_COLUMNS and kernels.empty
    overhead = run.overhead()
    assert overhead.cpu_ms > 0 and overhead.ratio is None and "needs a GPU" in overhead.verdict
    assert "aten::mm" in run.table(row_limit=50)  # the whole table: the order of CPU times moves with the load


def test_overhead_verdicts():
    assert "low" in tp.Overhead(10.0, 9.5).verdict
    assert "moderate" in tp.Overhead(15.0, 10.0).verdict
    assert tp.Overhead(30.0, 10.0).ratio == 3.0 and "high" in tp.Overhead(30.0, 10.0).verdict


def test_breakdown_by_phase_and_category(run):
    table = run.breakdown()
    assert set(tp.PHASES) <= set(table["phase"]) <= set(tp.PHASES) | {"outside phases"}
    assert table.loc[table["phase"] == "outside phases", "share_pct"].sum() < 1  # loss.detach() after the step
    gemm = table[table["category"] == tp.GEMM]
    assert set(gemm["phase"]) == {"forward", "backward"}
    assert set(table.loc[table["phase"] == "optimizer", "category"]) == {tp.OPTIMIZER}
    assert table["share_pct"].sum() == pytest.approx(100.0)
    shares = run.category_shares()
    assert {tp.GEMM, tp.ATTENTION, tp.ELEMENTWISE, tp.OPTIMIZER} <= set(shares["category"])
    # every operator's self time is in exactly one cell
    ops = run.operators()
    assert shares["time_ms"].sum() == pytest.approx(ops.loc[ops["kind"] == "operator", "self_cpu_ms"].sum(), rel=1e-6)


@pytest.mark.filterwarnings("ignore:Profiler won't be using warmup")
def test_trace_has_the_phase_ranges_and_is_never_overwritten(run, tmp_path):
    events = json.loads(run.trace_path.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert set(tp.PHASES) <= names  # what Perfetto and vendor timelines show as phases
    step, inputs, targets = _step()
    first = tp.profile_steps(lambda: step(inputs, targets), wait=0, warmup=0, active=1, trace_dir=tmp_path)
    second = tp.profile_steps(lambda: step(inputs, targets), wait=0, warmup=0, active=1, trace_dir=tmp_path)
    assert first.trace_path != second.trace_path and first.trace_path.exists() and second.trace_path.exists()
    board = tp.profile_steps(lambda: step(inputs, targets), wait=0, warmup=0, active=1, trace_dir=tmp_path / "tb",
                             tensorboard=True)
    assert board.trace_path.name.endswith((".pt.trace.json", ".pt.trace.json.gz"))
    with pytest.raises(ValueError, match="active >= 1"):
        tp.profile_steps(lambda: None, active=0)


@pytest.mark.parametrize("name, category", [
    ("aten::mm", tp.GEMM), ("aten::addmm", tp.GEMM), ("aten::bmm", tp.ATTENTION), ("aten::_softmax", tp.ATTENTION),
    ("aten::_scaled_dot_product_flash_attention", tp.ATTENTION), ("aten::_log_softmax", tp.LOSS),
    ("aten::nll_loss_forward", tp.LOSS), ("aten::mul", tp.ELEMENTWISE), ("aten::rsqrt", tp.ELEMENTWISE),
    ("aten::erfinv", tp.ELEMENTWISE),  # no rule names it: found through PyTorch's pointwise tag
    ("aten::mean", tp.REDUCTION), ("aten::_foreach_addcdiv_", tp.OPTIMIZER), ("aten::cat", tp.MEMORY),
    ("aten::copy_", tp.MEMORY), ("triton_poi_fused_mul_silu_0", tp.ELEMENTWISE),
    ("triton_red_fused_mean_pow_1", tp.REDUCTION), ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", tp.GEMM),
    ("Cijk_Alik_Bljk_BBS_BH_MT256x256x64", tp.GEMM), ("flash_fwd_kernel", tp.ATTENTION),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", tp.ELEMENTWISE),
])
def test_categories(name, category):
    assert tp.categorize(name) == category


# --- memory ----------------------------------------------------------------------------------------

def test_memory_breakdown_matches_the_model_and_activations_scale_with_batch():
    step, inputs, targets = _step()
    table = memory.memory_breakdown(step, inputs, targets).set_index("kind")["mib"]
    params_mib = CONFIG.num_parameters() * 4 / MIB
    assert table["parameters"] == pytest.approx(params_mib)
    assert table["gradients"] == pytest.approx(params_mib)
    assert table["optimizer state"] == pytest.approx(2 * params_mib)  # AdamW: two moments per weight
    double, inputs2, targets2 = _step(batch_size=2 * PRESET.batch_size)
    doubled = memory.memory_breakdown(double, inputs2, targets2).set_index("kind")["mib"]
    ratio = doubled["activations saved for backward"] / table["activations saved for backward"]
    assert 1.8 < ratio <= 2.0  # activations grow with the batch (a few batch-independent buffers)


@pytest.mark.skipif(GPU, reason="checks the CPU behaviour")
def test_phase_memory_on_the_cpu_says_what_to_use_instead():
    step, inputs, targets = _step()
    table = memory.phase_memory(step, inputs, targets, warmup=0)
    assert list(table["phase"]) == ["start", "forward", "backward", "optimizer"]
    assert table["peak_mib"].isna().all() and "memory_breakdown" in table.attrs["note"]
    with pytest.raises(dev.DeviceUnavailable, match="needs a GPU"):
        memory.memory_snapshot(lambda: step(inputs, targets))


def test_memory_timeline_by_category_and_its_plot(tmp_path):
    step, inputs, targets = _step()
    timeline = memory.memory_timeline(lambda: step(inputs, targets), device="cpu")
    assert timeline["time_ms"].is_monotonic_increasing and timeline["time_ms"].iloc[0] == 0
    assert {"parameter", "optimizer state", "activation", "gradient"} <= set(timeline.columns)
    assert timeline["parameter"].max() == pytest.approx(CONFIG.num_parameters() * 4 / MIB, rel=0.01)
    assert timeline["activation"].max() > 0 and timeline["gradient"].max() > 0
    path = tmp_path / "memory.png"
    memory.plot_memory_timeline(timeline, path)
    assert path.stat().st_size > 10_000


def test_snapshot_timeline_adds_what_existed_before_the_step():
    snapshot = {
        "segments": [{"device": 0, "blocks": [{"size": 1000, "state": "active_allocated"},
                                              {"size": 500, "state": "inactive"}]}],
        "device_traces": [[
            {"action": "alloc", "size": 300, "time_us": 10},
            {"action": "segment_alloc", "size": 4096, "time_us": 11},
            {"action": "alloc", "size": 200, "time_us": 12},
            {"action": "free_requested", "size": 300, "time_us": 13},
            {"action": "free_completed", "size": 300, "time_us": 14},
        ]],
    }
    frame = memory.snapshot_timeline(snapshot)
    # 1000 bytes allocated at the end, +200 net during the trace: 800 were there before it
    assert (frame["allocated_mib"] * MIB).tolist() == pytest.approx([1100, 1300, 1000])
    assert frame["time_ms"].tolist() == pytest.approx([0.0, 0.002, 0.004])
    with pytest.raises(ValueError, match="no allocator events"):
        memory.snapshot_timeline({"device_traces": [[]]})


# --- FLOP counting ---------------------------------------------------------------------------------

def test_flop_counter_counts_a_known_gemm_forward_and_backward():
    m, k, n = 37, 53, 29  # not powers of two
    a = torch.randn(m, k, requires_grad=True)
    b = torch.randn(k, n, requires_grad=True)
    assert pflops.count_flops(lambda: a @ b).total == 2 * m * n * k
    both = pflops.count_flops(lambda: (a @ b).sum().backward())
    assert both.total == 3 * 2 * m * n * k  # the backward is two GEMMs of the same size
    assert both.by_operator.set_index("operator").loc["aten.mm", "flops"] == 3 * 2 * m * n * k


def test_deepspeed_resnet18_is_1_82_gmacs_and_agrees_with_flop_counter():
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(weights=None).eval()
    comparison = pflops.compare_counts(model, (torch.randn(1, 3, 224, 224),))
    assert comparison.deepspeed.macs == pytest.approx(1.82e9, rel=0.01)
    assert comparison.deepspeed.params == sum(p.numel() for p in model.parameters())
    assert comparison.agree and comparison.total_rel_diff <= pflops.DEFAULT_TOLERANCE
    assert comparison.modules["agree"].all()
    assert comparison.deepspeed.flops > 2 * comparison.deepspeed.macs  # BatchNorm, ReLU, pooling, adds
    depth1 = comparison.deepspeed.by_depth(1).set_index("type")
    assert depth1.loc["Linear", "macs"] == 512 * 1000
    assert "DeepSpeed Flops Profiler" in comparison.deepspeed.text


def test_deepspeed_and_flop_counter_agree_on_v1_module_by_module():
    torch.manual_seed(0)
    model = build("v1", CONFIG)
    tokens = torch.randint(0, CONFIG.vocab_size, (PRESET.batch_size, PRESET.seq_len))
    comparison = pflops.compare_counts(model, (tokens,))
    assert comparison.agree and comparison.modules["agree"].all()
    rows = comparison.modules.set_index("module")
    b, s, h = PRESET.batch_size, PRESET.seq_len, CONFIG.hidden_dim
    # V1 writes attention out with @: both counters see q k^T and p v
    attention_products = 2 * 2 * b * s * s * h
    projections = 2 * b * s * (2 * h * h + 2 * h * CONFIG.kv_dim)
    assert rows.loc["layers.0.attn", "flop_counter"] == projections + attention_products
    assert rows.loc["layers", "flop_counter"] == CONFIG.num_layers * rows.loc["layers.0", "flop_counter"]
    assert any("element-wise" in note for note in comparison.notes)


class _SdpaAttention(Attention):
    def attend(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


class _SdpaBlock(Block):
    attention_class = _SdpaAttention


class _SdpaLlama(TinyLlama):
    block_class = _SdpaBlock


@pytest.mark.skipif(GPU, reason="the CPU flash kernel is what flop_counter misses")
def test_attention_through_sdpa_is_where_the_counters_differ():
    torch.manual_seed(0)
    model = _SdpaLlama(CONFIG)
    tokens = torch.randint(0, CONFIG.vocab_size, (PRESET.batch_size, PRESET.seq_len))
    b, s, h = PRESET.batch_size, PRESET.seq_len, CONFIG.hidden_dim
    attention_products = 2 * 2 * b * s * s * h  # per layer, full square (causal is not discounted)
    as_shipped = pflops.compare_counts(model, (tokens,), cpu_attention=False)
    rows = as_shipped.modules.set_index("module")
    missing = rows.loc["layers.0.attn", "deepspeed_2macs"] - rows.loc["layers.0.attn", "flop_counter"]
    if pflops.torch_counts_cpu_attention():  # torch >= 2.15 counts the CPU flash kernel itself
        assert missing == 0 and as_shipped.agree
    else:
        assert missing == attention_products
        assert not as_shipped.agree and any("flash kernel" in note for note in as_shipped.notes)
    fixed = pflops.compare_counts(model, (tokens,), cpu_attention=True)
    assert fixed.agree and fixed.flop_counter.cpu_attention == CONFIG.num_layers * attention_products
    # forward + backward: the backward recomputes the scores and does four more products (2.5x)
    count = pflops.count_flops(lambda: model(tokens).sum().backward())
    assert count.cpu_attention == pytest.approx(3.5 * CONFIG.num_layers * attention_products)


def test_training_flops_agree_four_ways():
    step, inputs, targets = _step()
    table = pflops.training_flop_table(step.model, inputs, targets, CONFIG)
    assert len(table) == 4 and table["ratio_to_analytic"].tolist() == pytest.approx([1.0] * 4)


def test_missing_deepspeed_gives_one_clear_line(monkeypatch):
    for name in [m for m in sys.modules if m == "deepspeed" or m.startswith("deepspeed.")] + ["deepspeed"]:
        monkeypatch.setitem(sys.modules, name, None)
    assert not pflops.deepspeed_available()
    with pytest.raises(pflops.DeepSpeedMissing, match="pip install deepspeed"):
        pflops.deepspeed_profile(torch.nn.Linear(2, 2), (torch.ones(1, 2),))


def test_deepspeed_leaves_torch_unpatched_even_when_the_model_fails():
    pytest.importorskip("deepspeed")
    original, original_matmul = F.linear, torch.matmul

    class FailsSecondTime(torch.nn.Linear):
        calls = 0

        def forward(self, x):
            FailsSecondTime.calls += 1
            if FailsSecondTime.calls == 2:
                raise RuntimeError("boom")
            return super().forward(x)

    with pytest.raises(RuntimeError, match="boom"):
        pflops.deepspeed_profile(FailsSecondTime(3, 3), (torch.ones(1, 3),), warm_up=1)
    assert F.linear is original and torch.matmul is original_matmul


# --- the GPU bookkeeping, on a recorded profile built by hand ----------------------------------------

class _Event:
    def __init__(self, name, parent=None, kernels=(), device="DeviceType.CPU", self_cpu=1.0, self_device=0.0, count=1):
        self.name = self.key = name
        self.cpu_parent = parent
        self.kernels = [type("Kernel", (), {"name": k, "duration": d})() for k, d in kernels]
        self.device_type = device
        self.self_cpu_time_total = self.cpu_time_total = self_cpu
        self.self_device_time_total = self.device_time_total = self_device
        self.count = count


def test_gpu_breakdown_counts_every_kernel_once_with_its_launcher():
    forward, optimizer = _Event("forward"), _Event("optimizer")
    engine = _Event("autograd::engine::evaluate_function: MmBackward0")
    events = [
        forward, optimizer, engine,
        _Event("aten::mm", forward, [("sm90_gemm", 100.0)]),
        # the range's device-side copy must not count; compiled code launches a fused kernel from the range
        _Event("forward", None, [("forward", 500.0), ("triton_poi_fused_mul_0", 50.0)]),
        _Event("aten::mm", engine, [("sm90_gemm", 200.0)]),
        _Event("aten::_foreach_add_", optimizer, [("multi_tensor_apply_kernel", 20.0)]),
    ]
    cuda = "DeviceType.CUDA"
    averages = [
        _Event("aten::mm", self_device=300.0, count=2), _Event("aten::_foreach_add_", self_device=20.0),
        _Event("forward", self_cpu=5.0), _Event("optimizer"), _Event("cudaDeviceSynchronize", self_cpu=400.0),
        _Event("sm90_gemm", device=cuda, self_cpu=0.0, self_device=300.0, count=2),
        _Event("triton_poi_fused_mul_0", device=cuda, self_cpu=0.0, self_device=50.0),
        _Event("multi_tensor_apply_kernel", device=cuda, self_cpu=0.0, self_device=20.0),
        _Event("orphan_kernel", device=cuda, self_cpu=0.0, self_device=30.0),
        _Event("forward", device=cuda, self_cpu=0.0, self_device=500.0),  # gpu_user_annotation
    ]
    run = tp.ProfileRun(FakeProfiler(events, averages), torch.device("cuda"), steps=1, trace_path=None)
    table = run.breakdown().set_index(["phase", "category"])["time_ms"] * 1e3
    assert table.to_dict() == pytest.approx({
        ("backward", tp.GEMM): 200.0, ("forward", tp.GEMM): 100.0, ("forward", tp.ELEMENTWISE): 50.0,
        ("unattributed", tp.OTHER): 30.0, ("optimizer", tp.OPTIMIZER): 20.0})
    kernels = run.kernels()
    assert kernels["total_ns"].sum() == 400_000 and "forward" not in set(kernels["kernel"])
    outside = run.kernels_outside_operators()
    assert outside.to_dict("records") == [{"kernel": "triton_poi_fused_mul_0", "category": tp.ELEMENTWISE,
                                           "launched_in": "forward", "time_ms": 0.05}]
    # roofline points on the same profile: operators, the fused kernel's time, and the rest kept apart
    from tinyllama.profiling import roofline as rl

    roofs = rl.Roofs("gpu", {"fp32": 50.0, "bf16": 800.0}, 3.0)
    work = pd.DataFrame([
        {"operator": "aten::mm", "category": tp.GEMM, "calls": 2, "flops": 8e9, "flop_source": "flop_counter",
         "bytes": 1e8, "precision": "bf16"},
        {"operator": "aten::_foreach_add_", "category": tp.OPTIMIZER, "calls": 1, "flops": 1e6,
         "flop_source": "estimate: 1 per element", "bytes": 1.2e7, "precision": "fp32"}])
    points = rl.operator_points(work, run, roofs, label="gpu").set_index("operator")
    assert points["time_ms"].to_dict() == pytest.approx({
        "aten::mm": 0.3, "(kernels outside ATen ops: element-wise)": 0.05, rl.UNATTRIBUTED: 0.03,
        "aten::_foreach_add_": 0.02})
    assert points.loc["aten::mm", "tflops"] == pytest.approx(8e9 / 0.3e-3 / 1e12)
    overhead = run.overhead()
    assert overhead.waiting_ms == pytest.approx(0.4) and overhead.device_ms == pytest.approx(0.4)
    assert overhead.ratio == pytest.approx(overhead.cpu_ms / 0.4) and overhead.cpu_ms < 0.1


def test_attention_formulas_match_torchs_and_read_query_heads_under_gqa():
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    q, kv = (2, 8, 96, 64), (2, 8, 80, 64)  # cross lengths, not powers of two
    assert pflops._attention_forward_flops(q, kv, kv) == sdpa_flop_count(q, kv, kv)
    assert pflops._attention_backward_flops(q, kv, kv) == sdpa_backward_flop_count(q, q, kv, kv)
    grouped = (2, 2, 80, 64)  # 4 query heads share each key/value head
    assert pflops._attention_forward_flops(q, grouped, grouped) == sdpa_flop_count(q, kv, kv)
    names = {str(op) for op in pflops.cpu_attention_formulas(gpu_kernels=True)}
    assert {"aten._scaled_dot_product_flash_attention", "aten._scaled_dot_product_efficient_attention_backward"} <= names
    assert not any("cudnn" in n or n.endswith("_attention") for n in map(str, pflops.cpu_attention_formulas()))
