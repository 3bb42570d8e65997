"""The phase timer reads its clock only after the device has finished the work it times."""

import pytest
import torch

from tinyllama import timing


class _FakeEvent:
    """Stands in for torch.cuda.Event and logs when it is recorded and read."""

    log: list[str] = []

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing

    def record(self) -> None:
        self.log.append("record")

    def elapsed_time(self, other: "_FakeEvent") -> float:
        self.log.append("read")
        return 1.0


@pytest.fixture
def log(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(timing.dev, "synchronize", lambda device=None: calls.append("synchronize"))
    monkeypatch.setattr(_FakeEvent, "log", calls)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    clock = iter(range(100))
    monkeypatch.setattr(timing.time, "perf_counter", lambda: calls.append("clock") or float(next(clock)))
    return calls


def test_device_events_are_read_only_after_a_synchronize(log):
    timer = timing.PhaseTimer(torch.device("cuda"))  # events, as on a GPU (faked: no GPU needed)
    timer.start()
    timer.mark("forward")
    timer.mark("backward")
    assert timer.stop() == {"forward": 1.0, "backward": 1.0}
    # Earlier work finished before the first event; the device finished before any event is read.
    assert log == ["synchronize", "record", "record", "record", "synchronize", "read", "read"]


def test_the_host_clock_starts_after_a_synchronize(log):
    timer = timing.PhaseTimer(torch.device("cpu"))
    timer.start()
    timer.mark("call")
    assert timer.stop() == {"call": 1000.0}
    assert log == ["synchronize", "clock", "clock", "synchronize"]


def test_host_verdict_needs_the_bands_to_separate_and_the_share_to_matter():
    from tinyllama.timing import Band, host_verdict

    # 20% host share, bands apart: host-bound
    share, said = host_verdict(Band(50.0, 49.0, 51.0), Band(40.0, 39.5, 40.5))
    assert said == "host-bound" and abs(share - 0.2) < 1e-12
    # the same medians, the eager band reaching below the replay's: within noise, so not host-bound
    assert host_verdict(Band(50.0, 38.0, 60.0), Band(40.0, 39.5, 40.5))[1] == "device-bound"
    # bands apart but the host adds 3%: below the line
    assert host_verdict(Band(41.2, 41.1, 41.3), Band(40.0, 39.9, 40.1))[1] == "device-bound"
    # a replay slower than the eager step (noise or a graph's cost) is never host-bound
    assert host_verdict(Band(40.0, 39.9, 40.1), Band(44.0, 43.9, 44.1))[1] == "device-bound"
