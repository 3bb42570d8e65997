"""The launch sequence of a run with its named ranges (torch_profiler.launch_table), the capture range
that starts and stops the profiler API (device.capture_range), and the ranges the inference benchmark
names (inference.benchmark.RANGES)."""

import pytest
import torch

import inference
from inference.benchmark import RANGES
from tinyllama import device as dev
from tinyllama.profiling.torch_profiler import activities, launch_table


def test_cpu_launches_are_top_level_operators_in_order_with_their_range():
    x = torch.randn(16, 16)
    with torch.profiler.profile(activities=activities(torch.device("cpu"))) as prof:
        torch.mm(x, x)  # outside every range: left out on a CPU
        with torch.profiler.record_function("first"):
            torch.mm(x, x)
            torch.relu(x)
        with torch.profiler.record_function("second"):
            with torch.profiler.record_function("inner"):
                torch.add(x, x)
            torch.mm(x, x)
    table = launch_table(prof, ["first", "second"], "cpu")
    assert list(table["kernel"]) == ["aten::mm", "aten::relu", "aten::add", "aten::mm"]
    assert list(table["range"]) == ["first", "first", "second", "second"]  # "inner" is not asked for: its parent
    assert list(table["index"]) == [0, 1, 0, 1] and list(table["launch"]) == [0, 1, 2, 3]
    assert (table["time_ns"] > 0).all()


def test_the_capture_range_starts_and_stops_the_profiler_api_around_its_body(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append("start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append("stop"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("synchronize"))
    monkeypatch.setattr(dev, "backend", lambda: "cpu")  # no NVTX on this machine
    with dev.capture_range("timed", torch.device("cuda")):
        calls.append("body")
    assert calls == ["start", "body", "synchronize", "stop"]
    calls.clear()
    with dev.capture_range("timed", torch.device("cpu")):
        calls.append("body")
    assert calls == ["body"]  # on the CPU only a PyTorch-profiler range


@pytest.mark.parametrize("error", [RuntimeError("hipProfilerStart is deprecated"), AttributeError("no start")])
def test_a_missing_profiler_api_does_not_stop_the_run(monkeypatch, error):
    calls = []

    def broken():
        calls.append("api")
        raise error
    monkeypatch.setattr(torch.cuda.profiler, "start", broken)
    monkeypatch.setattr(torch.cuda.profiler, "stop", broken)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("synchronize"))
    monkeypatch.setattr(dev, "backend", lambda: "cpu")
    with dev.capture_range("timed", torch.device("cuda")):
        calls.append("body")
    # the body ran and was synchronised; only the capture range was lost
    assert calls == ["api", "body", "synchronize", "api"]


@pytest.mark.timeout(300)
def test_the_benchmark_names_its_phases_and_times_whole_forwards():
    config = inference.BenchmarkConfig(network="resnet18", batch_size=2, input_size=32, iterations=2, warmup=1,
                                       progress=False, device="cpu")
    with torch.profiler.profile(activities=activities(torch.device("cpu"))) as prof:
        inference.run_benchmark(config)
    table = launch_table(prof, RANGES, "cpu")
    assert list(table["range"].unique()) == list(RANGES)  # reference, then warm-up, then timed
    timed = table[table["range"] == "timed"]
    per_forward = len(timed) // 2
    assert len(timed) == 2 * per_forward and per_forward > 20
    # the reference is one forward (plus moving the inputs); the warm-up one forward plus the check's comparison
    assert list(timed["kernel"].iloc[:per_forward]) == list(timed["kernel"].iloc[per_forward:])
    assert (table["range"] == "reference").sum() >= per_forward


class _KinetoEvent:
    """A stand-in for the profiler's raw records (torch._C._autograd._KinetoEvent), as a GPU run has them."""

    def __init__(self, name, device, kind, start, end):
        self._name, self._device, self._kind, self._start, self._end = name, device, kind, start, end

    def name(self):
        return self._name

    def device_type(self):
        return f"DeviceType.{self._device}"

    def activity_type(self):
        return self._kind

    def is_user_annotation(self):
        return self._kind in (1, 2)

    def start_ns(self):
        return self._start

    def end_ns(self):
        return self._end


class _FakeProfile:
    def __init__(self, events):
        self.profiler = type("Inner", (), {"kineto_results": type("Results", (), {"events": lambda _: events})()})()


def test_gpu_launches_come_from_the_device_records_in_device_order():
    cpu, gpu = "CPU", "CUDA"
    events = [
        _KinetoEvent("timed", cpu, 1, 0, 1000),  # the host side of a range: not a launch, not the device's span
        _KinetoEvent("cudaLaunchKernel", cpu, 7, 10, 12),  # a host launch: the table counts device kernels
        _KinetoEvent("warm-up", gpu, 2, 0, 300),
        _KinetoEvent("timed", gpu, 2, 300, 900),
        _KinetoEvent("inner", gpu, 2, 400, 500),  # a range not asked for
        _KinetoEvent("conv_fprop", gpu, 5, 350, 380),
        _KinetoEvent("nchwToNhwc", gpu, 5, 310, 320),  # no host launch to hang it on: still counted
        _KinetoEvent("Memcpy HtoD (Pageable -> Device)", gpu, 3, 320, 330),
        _KinetoEvent("bn_fw", gpu, 5, 420, 450),
        _KinetoEvent("relu", gpu, 5, 100, 104),
        _KinetoEvent("reduce", gpu, 5, 950, 960),
    ]
    table = launch_table(_FakeProfile(events), RANGES, "cuda")
    assert list(table["kernel"]) == ["relu", "nchwToNhwc", "conv_fprop", "bn_fw", "reduce"]  # device start order
    assert list(table["range"]) == ["warm-up", "timed", "timed", "timed", "outside"]
    assert list(table["index"]) == [0, 0, 1, 2, 0] and list(table["time_ns"]) == [4.0, 10.0, 30.0, 30.0, 10.0]
