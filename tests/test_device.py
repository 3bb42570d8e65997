"""The one place that knows about GPU vendors."""

import pytest
import torch
from conftest import GPU

from tinyllama import device as dev
from tinyllama.costs.ceilings import measure_copy_tbs, measure_matmul_tflops
from tinyllama.timing import PhaseTimer, summarize, time_callable


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
    ("NVIDIA H200", "NVIDIA H200"),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB"),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB"),
    ("AMD Instinct MI300X", "AMD Instinct MI300X"),
    ("AMD Instinct MI325X", "AMD Instinct MI325X"),
    ("AMD Instinct MI250X/MI250", "AMD Instinct MI250X"),
    ("gfx942:sramecc+:xnack-", "AMD Instinct MI300X"),
])
def test_datasheet_lookup_finds_common_accelerators(name, expected):
    assert dev.lookup_peaks(name).name == expected


def test_unknown_devices_have_no_invented_peak():
    assert dev.lookup_peaks("Some Future GPU 9000") is None


def test_peaks_are_ordered_as_the_hardware_is():
    h100 = dev.lookup_peaks("H100 SXM")
    assert h100.tflops("bf16") > h100.tflops("tf32") > h100.tflops("fp32")
    assert dev.lookup_peaks("H200").memory_bandwidth_tbs > h100.memory_bandwidth_tbs
    assert dev.lookup_peaks("MI250X").tflops("tf32") is None  # no TF32 on CDNA2
    with pytest.raises(ValueError, match="unknown precision"):
        h100.tflops("int4")


@pytest.mark.skipif(GPU, reason="checks the CPU fallback")
def test_cpu_machine_reports_cpu_and_refuses_a_gpu_with_a_reason():
    assert dev.backend() == "cpu"
    assert dev.get_device().type == "cpu"
    assert dev.memory_stats().peak_bytes is None
    with pytest.raises(dev.DeviceUnavailable, match="sees no GPU"):
        dev.get_device("cuda")


def test_out_of_memory_errors_are_recognised():
    assert dev.is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate"))
    assert dev.is_out_of_memory(RuntimeError("HIP error: out of memory"))
    assert not dev.is_out_of_memory(RuntimeError("shape mismatch"))


def test_summary_statistics_are_right():
    stats = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert stats.median == 3.0 and stats.min == 1.0 and stats.max == 100.0 and stats.n == 5
    assert stats.p10 == pytest.approx(1.4) and stats.p90 == pytest.approx(61.6)
    with pytest.raises(ValueError):
        summarize([])


def test_phase_timer_measures_the_work_it_brackets():
    import time

    timer = PhaseTimer(torch.device("cpu"))
    timer.start()
    time.sleep(0.02)
    timer.mark("slow")
    timer.mark("instant")
    phases = timer.stop()
    assert list(phases) == ["slow", "instant"]
    assert 15 < phases["slow"] < 500 and phases["instant"] < 5


def test_time_callable_repeats_after_warmup():
    calls = []
    stats = time_callable(lambda: calls.append(1), "cpu", warmup=2, repeat=5)
    assert len(calls) == 7 and stats.n == 5


def test_cpu_ceilings_are_positive_and_plausible():
    matmul = measure_matmul_tflops("fp32", n=256, device="cpu", repeat=3)
    copy = measure_copy_tbs(nbytes=2**22, device="cpu", repeat=3)
    assert 1e-4 < matmul.value < 50  # TFLOP/s: a CPU core does more than 0.1 GFLOP/s, less than 50 TFLOP/s
    assert 1e-4 < copy.value < 5  # TB/s
