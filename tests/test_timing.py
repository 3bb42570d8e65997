"""The phase timer reads its clock only after the device has finished the work it times."""

import subprocess
import sys

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


def test_issue_verdict_calls_a_step_host_bound_only_when_the_device_finishes_right_after_the_issue():
    from tinyllama.costs.kernel_costs import LaunchCost
    from tinyllama.timing import Band, issue_verdict, summarize

    # Issued in 46.4 ms, finished 47.4 ms after the start: the device waited for the launches.
    ratio, said = issue_verdict(Band(46.4, 46.0, 47.0), Band(47.4, 47.0, 48.0))
    assert said == "host-bound" and ratio == pytest.approx(47.4 / 46.4)
    # Finished twice as late as the issue: the device sets the pace.
    assert issue_verdict(Band(20.0, 19.0, 21.0), Band(40.0, 39.0, 41.0))[1] == "device-bound"
    # LaunchCost.host_bound is the same rule, not a second one.
    host, late = summarize([10.0, 10.0]), summarize([30.0, 30.0])
    assert LaunchCost(host, summarize([11.0, 11.0]), 1).host_bound
    assert not LaunchCost(host, late, 1).host_bound


def test_the_median_interval_is_the_textbook_order_statistics_and_covers_the_median_95_percent_of_the_time():
    import random

    from tinyllama.timing import median_interval, summarize

    assert median_interval(range(1, 101)) == (40.0, 61.0)  # ranks 40 and 61 of 100, as the tables give
    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few samples: their whole range
    stats = summarize(list(range(1, 101)))
    assert (stats.median_low, stats.median_high) == (40.0, 61.0)
    generator = random.Random(0)
    covered = 0
    for _ in range(2000):  # skewed samples (timings have a long right tail): true median ln 2
        low, high = median_interval([generator.expovariate(1.0) for _ in range(100)])
        covered += low <= 0.6931471805599453 <= high
    assert 0.93 <= covered / 2000 <= 0.98
    with pytest.raises(ValueError, match="confidence"):
        median_interval([1.0, 2.0], confidence=95)


def test_the_p10_interval_covers_the_true_p10_95_percent_of_the_time():
    import math
    import random

    from tinyllama.timing import quantile_interval, summarize

    generator = random.Random(1)
    true_p10 = -math.log(0.9)  # of the exponential distribution with rate 1
    covered = sum(low <= true_p10 <= high for low, high in (
        quantile_interval([generator.expovariate(1.0) for _ in range(200)], 0.10) for _ in range(2000)))
    assert 0.93 <= covered / 2000 <= 0.98
    stats = summarize(list(range(1, 41)))  # 40 steps, as notebook 20 times each configuration
    assert stats.p10_low <= stats.p10 <= stats.p10_high and (stats.p10_low, stats.p10_high) == (1.0, 9.0)


def test_verdict_on_medians_needs_the_intervals_apart_and_the_least_gain():
    import math

    from tinyllama.timing import Band, verdict

    before = Band(64.8, 59.1, 111.1, 63.9, 65.6)  # a launch-bound step: wide single-step band, narrow median interval
    after = Band(52.1, 49.4, 61.0, 51.6, 52.7)
    assert verdict(before, after) == (before.median / after.median, "within noise")  # the bands overlap
    assert verdict(before, after, on="median")[1] == "faster"
    assert verdict(after, before, on="median")[1] == "slower"
    assert verdict(before, after, on="median", min_ratio=1.3)[1] == "within noise"  # 1.24x is below the least gain
    assert verdict(after, before, on="median", min_ratio=1.3)[1] == "within noise"
    assert verdict(before, Band(52.1, 49.4, 56.9), on="median")[1] == "within noise"  # no interval recorded: NaN
    assert verdict(before, Band(math.nan, math.nan, math.nan, math.nan, math.nan), on="median")[1] == "within noise"
    with pytest.raises(ValueError, match="spread"):
        verdict(before, after, on="p50")


def test_verdict_on_the_fast_steps_reads_the_p10s_and_their_intervals():
    from tinyllama.timing import Band, verdict

    fp32 = Band(55.9, 55.1, 59.0, 55.4, 57.7, 55.0, 55.3)
    # A median that followed the host (its interval overlapping fp32's) over fast steps 1.29x faster.
    bf16 = Band(55.7, 42.8, 62.0, 50.5, 58.2, 42.6, 44.9)
    assert verdict(fp32, bf16, on="median")[1] == "within noise"
    ratio, said = verdict(fp32, bf16, on="p10", min_ratio=1.05)
    assert said == "faster" and ratio == pytest.approx(55.1 / 42.8)
    assert verdict(bf16, fp32, on="p10", min_ratio=1.05)[1] == "slower"
    assert verdict(fp32, bf16, on="p10", min_ratio=1.3)[1] == "within noise"
    assert verdict(fp32, Band(55.7, 42.8, 62.0), on="p10")[1] == "within noise"  # no interval recorded
    with pytest.raises(ValueError, match="at least 1"):
        verdict(fp32, bf16, min_ratio=0.9)


def test_time_in_turns_warms_each_up_then_rotates_the_order_every_round():
    order: list[str] = []
    calls = {name: (lambda name=name: order.append(name)) for name in "abc"}
    samples = timing.time_in_turns(calls, "cpu", rounds=4, per_turn=2, warmup=1)
    assert {name: len(ms) for name, ms in samples.items()} == {"a": 8, "b": 8, "c": 8}
    assert all(ms >= 0 for values in samples.values() for ms in values)
    rounds = ["aabbcc", "bbccaa", "ccaabb", "aabbcc"]  # each round starts one further along
    assert "".join(order) == "abc" + "".join(rounds)


def test_time_in_turns_refuses_what_it_cannot_time():
    with pytest.raises(ValueError, match="at least 1"):
        timing.time_in_turns({"a": lambda: None}, "cpu", rounds=0)
    with pytest.raises(ValueError, match="nothing to time"):
        timing.time_in_turns({}, "cpu")


def test_graph_replay_needs_a_gpu_and_says_what_to_do_instead():
    with pytest.raises(RuntimeError, match="needs a GPU.*time the calls themselves"):
        timing.graph_replay(lambda: None, "cpu")


@pytest.mark.gpu
def test_graph_replay_repeats_the_captured_work():
    x = torch.zeros(1000, device="cuda")
    replay = timing.graph_replay(lambda: x.add_(1), "cuda")  # one call outside, one captured
    replay()
    replay()
    torch.cuda.synchronize()
    assert x[0].item() == 3  # the call outside the graph, then two replays (capturing runs nothing)


@pytest.mark.gpu
def test_graph_replay_refuses_a_call_that_waits_for_the_host_in_one_line():
    # In a process of its own: a failed capture leaves PyTorch's CUDA state unusable for later captures.
    code = ("import torch\nfrom tinyllama import timing\nx = torch.ones(10, device='cuda')\n"
            "try:\n    timing.graph_replay(lambda: x.sum().item(), 'cuda')\n"
            "except RuntimeError as error:\n    print(error)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    said = done.stdout.strip()
    assert "could not be captured in a CUDA graph" in said and "time_callable" in said
    assert len(said.splitlines()) == 1, said
