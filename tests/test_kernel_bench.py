"""The kernel benchmark checks before it times, refuses a wrong kernel, and reports what it measured."""

import json
from dataclasses import replace

import pandas as pd
import pytest
import torch
from table_cells import table_rows

from tinyllama.config import make_config
from tinyllama.harness import kernel_bench as bench

FAKE_CEILINGS = {"copy_tbs": 1.0, "matmul_fp32_tflops": 1.0, "matmul_bf16_tflops": 1.0}
SMALL = dict(dtypes=["fp32"], seq_lens=[5], preset="ci", batch_size=1, passes=["forward", "backward"],
             repeat=1, ceilings=FAKE_CEILINGS, progress=False)


@pytest.mark.parametrize("kernel", ["rmsnorm", "rope", "swiglu"])
def test_rows_carry_time_throughput_and_the_check(kernel):
    frame = bench.run_kernel_bench(kernels=[kernel], **SMALL)
    assert set(frame["impl"]) == {"triton", "eager"} and set(frame["pass"]) == {"forward", "backward"}
    assert (frame["status"] == "ok").all()
    assert (frame["eager_ms"] > 0).all() and (frame["gpu_ms"] > 0).all() and (frame["achieved"] > 0).all()
    triton = frame[frame["impl"] == "triton"]
    assert (triton["check_error"] < 1e-5).all()
    # achieved = bytes / GPU time, and the share is relative to the (fake) ceiling of 1 TB/s
    row = triton.iloc[0]
    assert row["achieved"] == pytest.approx(row["work"] / (row["gpu_ms"] * 1e-3) / 1e12)
    assert row["ceiling_share"] == pytest.approx(row["achieved"])
    assert frame["speedup"].notna().all() and set(frame["baseline"]) == {"eager"}
    eager = frame[frame["impl"] == "eager"].set_index("pass")
    assert (eager["speedup"] == 1.0).all() and (eager["speedup_gpu"] == 1.0).all()
    assert row["speedup"] == pytest.approx(eager.loc[row["pass"], "eager_ms"] / row["eager_ms"])


def test_a_kernel_that_fails_its_check_is_not_timed(monkeypatch):
    real = bench._CASES["swiglu"]

    def broken(*args):
        case = real(*args)
        case.triton = lambda gate, up: bench.swiglu(gate, up) * 1.01  # 1% off
        return case

    monkeypatch.setitem(bench._CASES, "swiglu", broken)
    frame = bench.run_kernel_bench(kernels=["swiglu"], **SMALL)
    assert len(frame) == 1
    assert frame.iloc[0]["status"].startswith("failed check") and "eager_ms" not in frame


def test_attention_is_compared_with_sdpa_as_dispatched_by_default_and_v1():
    frame = bench.run_kernel_bench(kernels=["flash_attention"], **{**SMALL, "passes": ["forward"]})
    assert {"triton", "sdpa", "eager"} <= set(frame["impl"])
    assert (frame["unit"] == "TFLOP/s").all() and (frame["status"] == "ok").all()
    # the baseline is default SDPA, and every row names the backend it dispatched to
    assert set(frame["baseline"]) == {"sdpa"}
    assert frame["sdpa_backend"].notna().all() and (frame["sdpa_backend"] != "unknown").all()


def test_targets_are_judged_from_the_rows():
    """RMSNorm against the copy bandwidth; attention against default SDPA: GPU time from sequence 1024,
    eager from 2048 (none below 1024)."""
    attention = {"kernel": "flash_attention", "impl": "triton", "pass": "forward+backward", "dtype": "bf16",
                 "status": "ok", "eager_ms": 1.0, "ceiling_share": 0.3, "baseline": "sdpa", "sdpa_backend": "cuDNN"}
    frame = pd.DataFrame([
        {"kernel": "rmsnorm", "impl": "triton", "pass": "forward", "dtype": "bf16", "seq_len": 512,
         "status": "ok", "eager_ms": 1.0, "ceiling_share": 0.75, "speedup": 2.0, "baseline": "eager"},
        {**attention, "seq_len": 512, "speedup": 0.1, "speedup_gpu": 0.1},
        {**attention, "seq_len": 1024, "speedup": 0.5, "speedup_gpu": 0.9},
        {**attention, "seq_len": 2048, "speedup": 0.7, "speedup_gpu": 0.85},
    ])
    targets = bench.check_targets(frame)
    assert list(zip(targets["seq_len"], targets["met"])) == [(512, True), (1024, True), (2048, True), (2048, False)]
    assert targets["target"].str.contains("default SDPA \\(cuDNN\\)").iloc[1:].all()


def test_command_line_appends_json(tmp_path, capsys):
    out = tmp_path / "kernels.json"
    out.write_text(json.dumps([{"earlier": "record"}]))
    args = ["--kernels", "swiglu", "--dtypes", "fp32", "--seq-lens", "3", "--preset", "ci", "--batch-size", "1",
            "--passes", "forward", "--repeat", "1", "--quiet", "--json", str(out)]
    assert bench.main(args) == 0
    records = json.loads(out.read_text())
    assert records[0] == {"earlier": "record"} and {r["impl"] for r in records[1:]} == {"triton", "eager"}
    rows = table_rows(capsys.readouterr().out)
    assert rows[0][0] == "kernel" and rows[2][0] == "swiglu"  # the table of every measurement


def test_bad_choices_are_refused():
    with pytest.raises(SystemExit):
        bench.main(["--kernels", "softmax"])
    with pytest.raises(ValueError, match="at least 1"):
        bench.run_kernel_bench(kernels=["swiglu"], **{**SMALL, "seq_lens": [0]})


def test_eager_time_is_the_time_a_caller_waits_per_call():
    """A call that spends 2 ms on the host is 2 ms a call launched eagerly, whatever its kernels take."""
    import time

    def slow(x):
        time.sleep(0.002)
        return x * 2

    x = torch.randn(8, requires_grad=True)
    stats = bench.time_eager(slow, [[x]], [torch.ones(8)], {}, "forward", torch.device("cpu"), repeat=3)
    assert 2.0 <= stats.median < 4.0


def test_a_sample_holds_about_the_target_time_in_calls():
    """Samples are sized by the time of one call: 1 ms of 15 us calls is 67, rounded up to a
    multiple of the 4 input sets; never more than 200 calls; a call longer than the target is one."""
    assert bench._calls_per_sample(1.0, 0.015, 4) == 68
    assert bench._calls_per_sample(1.0, 0.001, 4) == 200
    assert bench._calls_per_sample(1.0, 5.0, 3) == 3


@pytest.mark.gpu
def test_graph_samples_are_sized_by_gpu_time_not_launch_time():
    """A 16 us backward takes far longer to launch from Python; a sample sized by the launches would
    hold a handful of calls (tens of us, with the graph's launch counted into each call)."""
    case = bench._rmsnorm_case(bench.make_config("medium"), 16, 512, torch.bfloat16, torch.device("cuda"))
    sets = [case.make_inputs(16, seed) for seed in range(4)]
    grads = [torch.randn_like(case.triton(*s, **case.kwargs)) for s in sets]
    stats, _, calls, launch = bench.time_pass(case.triton, sets, grads, case.kwargs, "backward",
                                              torch.device("cuda"), repeat=5)
    assert launch == "graph"
    assert calls * stats.median >= 0.5, (calls, stats.median)


def test_attention_can_be_timed_without_the_mask_and_without_shared_heads():
    frame = bench.run_kernel_bench(kernels=["flash_attention"], causal=False, kv_heads=4,
                                   **{**SMALL, "passes": ["forward"]})
    assert (frame["status"] == "ok").all()
    # V1's attention is causal only: no eager baseline; the shape names the mask and 4/4 heads
    assert set(frame["impl"]) == {"triton", "sdpa"}
    assert frame["shape"].str.contains("4/4").all() and frame["shape"].str.contains("full").all()
    causal = bench.run_kernel_bench(kernels=["flash_attention"], kv_heads=4, **{**SMALL, "passes": ["forward"]})
    # the same calls do about twice the work unmasked: seq^2 pairs against seq(seq+1)/2
    work = lambda f: (f.set_index("impl")["achieved"] * f.set_index("impl")["gpu_ms"])["triton"]  # noqa: E731
    assert work(frame) / work(causal) == pytest.approx(2 * 5 / 6)
    with pytest.raises(ValueError, match="must divide"):
        bench.run_kernel_bench(kernels=["flash_attention"], kv_heads=3, **SMALL)


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("kernel", ["rmsnorm", "rope", "swiglu"])
def test_bytes_count_every_input_read_and_every_output_written(kernel):
    """The achieved bandwidth is only as true as its byte count: a forward reads each input once and
    writes its output once (small per-row extras such as RMSNorm's rstd on top); a backward reads the
    output's gradient and writes each input's gradient at least."""
    case = bench._CASES[kernel](make_config("ci"), 2, 7, torch.float32, torch.device("cpu"))
    inputs = case.make_inputs(case.batch, 0)
    out = case.reference(*inputs, **case.kwargs)
    forward = _nbytes(inputs) + _nbytes([out])
    assert forward <= case.work("forward") <= 1.1 * forward
    assert case.work("backward") >= _nbytes([out]) + _nbytes(inputs)
    assert case.work("forward+backward") == case.work("forward") + case.work("backward")


@pytest.mark.parametrize("causal", [False, True])
def test_attention_flops_are_pytorchs_count_of_the_two_products(causal):
    """Unmasked, the forward's FLOPs equal torch.utils.flop_counter's count of attention's two products
    (QK^T and PV, two FLOPs per multiply-add); causal, the pairs a query can see, seq (seq + 1) / 2 of seq^2. The backward
    does five such products (flash attention recomputes QK^T): 2.5 forwards."""
    from torch.utils.flop_counter import FlopCounterMode

    config = replace(make_config("ci"), num_kv_heads=make_config("ci").num_heads)
    batch, seq = 2, 7
    case = bench._attention_case(config, batch, seq, torch.float32, torch.device("cpu"), causal=causal)
    q, k, v = (t.detach() for t in case.make_inputs(batch, 0))
    with FlopCounterMode(display=False) as counter:
        (q @ k.transpose(-2, -1)).softmax(-1) @ v
    full = counter.get_total_flops()
    assert case.work("forward") == pytest.approx(full * ((seq + 1) / (2 * seq) if causal else 1.0))
    assert case.work("backward") == pytest.approx(2.5 * case.work("forward"))
