"""The fine-tuning lab's diagnosis and micro-benchmarks (tinyllama.course.finetune_microbench) on the CPU at
the ci sizes: each test states a fact that would be false if the code were wrong."""

import math

import pytest
import torch

from tinyllama import device as dev
from tinyllama.costs.memory_estimate import allocator_peaks
from tinyllama.course import finetune_microbench as micro
from tinyllama.data import build_corpus

CPU = torch.device("cpu")


def test_sizes_are_known_per_profile_and_unknown_ones_refused():
    assert micro.sizes_for("ci").memory_budget_mib < micro.sizes_for("gpu").memory_budget_mib
    with pytest.raises(ValueError, match="no micro-benchmark sizes"):
        micro.sizes_for("laptop")


def test_the_diagnosis_on_a_cpu_times_eagerly_and_decides_nothing():
    table = micro.diagnose_step("ci", 1, 32, ("fp32",), device=CPU, steps=2)
    assert list(table.index) == ["fp32"]
    assert table.loc["fp32", "eager_p10"] <= table.loc["fp32", "eager_ms"] <= table.loc["fp32", "eager_p90"]
    assert math.isnan(table.loc["fp32", "replayed_ms"])
    assert table.loc["fp32", "verdict"].startswith("not decided")


def test_the_micro_batch_sweep_stops_after_the_first_over_the_budget():
    # ci estimates at seq 32: about 2.3, 2.5, 3.1, 4.4 MiB for micro-batches 1, 2, 4, 8 (checkpointing on)
    table = micro.micro_batch_sweep("ci", (1, 2, 4, 8, 16), 32, "fp32", device=CPU, budget_mib=3.0, steps=1,
                                    warmup_steps=0)
    assert table["estimated_peak_mib"].is_monotonic_increasing
    assert table["estimated_peak_mib"].iloc[-1] > 3.0 >= table["estimated_peak_mib"].iloc[-2]
    assert (table["status"] == "ok").all() and table["tokens_per_s"].gt(0).all()
    assert table["peak_memory_mib"].isna().all()  # a CPU keeps no allocator statistics


def test_sdpa_matches_the_math_path_and_a_wrong_attention_is_caught(monkeypatch):
    run = micro.attention_benchmark("ci", 2, 24, "fp32", device=CPU, repeat=2, warmup=1)
    assert run["correct"] and run["max_rel_error"] < 1e-5
    assert run["math"].n == 2 and run["sdpa"].median > 0
    # attention without the causal mask is another function: the correctness check must say so
    monkeypatch.setattr(micro, "causal_sdpa", lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)))
    assert not micro.attention_benchmark("ci", 2, 24, "fp32", device=CPU, repeat=1, warmup=0)["correct"]


def test_the_loader_gives_the_same_batches_with_and_without_workers():
    corpus = build_corpus(2**18, seed=0)
    table = micro.loader_benchmark(corpus.train, 32, 2, (0, 2), batches=3, warmup_batches=1)
    assert list(table.index) == [0, 2]
    assert table["same_batches"].all()
    assert (table["batch_ms_p10"] <= table["batch_ms_p90"]).all()
    with pytest.raises(ValueError, match="fewer than"):
        micro.loader_benchmark(b"x" * 100, 32, 2, (0,), batches=3)


def test_the_gradient_scaler_keeps_fp16_gradients_in_range():
    demo = micro.fp16_scaler_demo("ci", 1, 32, device=CPU, steps=2, lr=1e-3, loss_factor=0.25)
    unscaled, scaled = demo["no scaler"], demo["GradScaler"]
    # without the scaler many activation gradients fall below fp16's normal range; scaled by 65536, few do
    assert unscaled["subnormal_share"] > 10 * max(scaled["subnormal_share"], 1e-4)
    assert scaled["final_scale"] > 1 and unscaled["final_scale"] == 1.0
    assert len(unscaled["losses"]) == 2


def test_the_census_sees_bf16_matmuls_and_an_fp32_softmax():
    census = micro.dtype_census("ci", 1, 16, "bf16", device=CPU)
    assert "mm" in micro.ops_in(census, "bfloat16") and "mm" not in micro.ops_in(census, "float32")
    assert {"_softmax", "_log_softmax"} <= micro.ops_in(census, "float32")
    fp32 = micro.dtype_census("ci", 1, 16, "fp32", device=CPU)
    assert micro.ops_in(fp32, "bfloat16") == set()


def test_the_allocator_variable_follows_the_back_end(monkeypatch):
    monkeypatch.setattr(dev, "backend", lambda: "rocm")
    assert dev.allocator_config_variable() == "PYTORCH_HIP_ALLOC_CONF"
    monkeypatch.setattr(dev, "backend", lambda: "cuda")
    assert dev.allocator_config_variable() == "PYTORCH_CUDA_ALLOC_CONF"


def test_the_allocator_workload_refuses_bad_arguments_and_a_cpu(capsys):
    assert micro.main(["allocator", "ci"]) == 2
    assert micro.main(["allocator", "ci", "2", "32", "1"]) == 1
    assert "needs a GPU" in capsys.readouterr().err
    assert all(math.isnan(v) for v in allocator_peaks(CPU).values())
