"""No timing after a profiler session: the timers refuse, and the harnesses profile where it leaves none."""

import pytest
import torch

from tinyllama import timing
from tinyllama.costs.kernel_costs import device_ms, host_us_per_call
from tinyllama.profiling.attention import sdpa_backend
from tinyllama.profiling.isolated import IsolatedRunError, isolated


def _profile_something() -> None:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        torch.ones(8).sum()


def test_a_fresh_process_times():
    assert not timing.profiler_has_run()
    assert timing.time_callable(lambda: torch.ones(4).sum(), "cpu", repeat=2).n == 2


@pytest.mark.parametrize("timer", [
    lambda: timing.time_callable(lambda: None, "cpu", repeat=2),
    lambda: timing.time_single_and_back_to_back(lambda: None, "cpu", repeat=2),
    lambda: timing.StepClock(lambda: None, "cpu")(),
    lambda: device_ms(lambda: None, "cpu", repeat=2),
    lambda: host_us_per_call(lambda: None, "cpu", calls=2, repeat=1),
])
def test_every_timer_refuses_after_a_profiler_session(timer):
    _profile_something()
    assert timing.profiler_has_run()
    with pytest.raises(timing.ProfilerResidueError, match="time first|separate process"):
        timer()


def test_the_participants_own_profiler_is_seen_too():
    with torch.autograd.profiler.profile():
        torch.ones(2).sum()
    assert timing.profiler_has_run()


def test_timing_the_profiled_run_itself_is_allowed():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        clock = timing.StepClock(lambda: torch.ones(4).sum(), "cpu")
        clock()
        clock()
    assert clock.host_ms().n == 2
    with pytest.raises(timing.ProfilerResidueError):
        clock()


def test_forgetting_sessions_is_what_a_new_process_gives():
    _profile_something()
    timing.forget_profiler_sessions()
    assert timing.time_callable(lambda: None, "cpu", repeat=1).n == 1


def test_sdpa_backend_needs_no_profiler():
    q = torch.randn(1, 2, 16, 8, requires_grad=True)
    choice = sdpa_backend(q, q.detach().clone(), q.detach().clone())
    assert choice.backend in ("flash (CPU)", "math")
    assert not timing.profiler_has_run()


def _add(a, b, scale=1):
    return (a + b) * scale


def _fails():
    raise ValueError("the reason it failed")


def _profiles_and_reports() -> bool:
    _profile_something()
    return timing.profiler_has_run()


def test_isolated_returns_what_the_call_returned():
    out = isolated(_add, torch.arange(3), torch.ones(3, dtype=torch.long), scale=2)
    assert torch.equal(out, torch.tensor([2, 4, 6]))


def test_isolated_profiles_leave_this_process_clean():
    assert isolated(_profiles_and_reports) is True  # the session happened, over there
    assert not timing.profiler_has_run()


def test_isolated_passes_the_error_back():
    with pytest.raises(IsolatedRunError, match="ValueError: the reason it failed"):
        isolated(_fails)


def test_isolated_refuses_what_cannot_be_imported_there():
    with pytest.raises(ValueError, match="top level of an importable module"):
        isolated(lambda: 1)


def test_compare_counts_gemms_without_leaving_a_profiler_session():
    from tinyllama.harness.compare import compare

    result = compare(["v1:fp32", "v2:fp32"], "ci", num_steps=2, warmup_steps=1, device="cpu", progress=False,
                     profile_runs=["v2:fp32"], profile_top=3)
    assert not timing.profiler_has_run()
    ops = {r["label"]: r["gemm_ops"] for r in result.runs}
    assert ops["v2:fp32"] < ops["v1:fp32"]  # the fused projections, counted over there
    assert len(result.record["profiles"]["v2:fp32"]) > 0


@pytest.mark.gpu
def test_an_isolated_profile_leaves_the_eager_step_as_fast_as_before():
    """An eager V2 bf16 step timed before and after a profile taken by profile_training_isolated agrees
    within the runs' spread; one taken in this process is what the timers refuse (measured for the record)."""
    from tinyllama.config import make_config
    from tinyllama.models import build
    from tinyllama.profiling.torch_profiler import profile_training_isolated
    from tinyllama.training import TrainingStep, make_batches

    device = torch.device("cuda")
    config = make_config("small")
    torch.manual_seed(0)
    model = build("v2", config).to(device)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    batch = make_batches(config, 8, 256, count=1, device=device)[0]
    step = TrainingStep(model, "bf16", device)

    def timed() -> timing.Stats:
        return timing.time_callable(lambda: step(*batch), device, warmup=5, repeat=40)

    before = timed()
    tables = profile_training_isolated("v2", config, weights, batch, "bf16", device, wait=1, warmup=1, active=2)
    assert tables.on_device and len(tables.kernels()) > 0
    after = timed()
    ratio, said = timing.verdict(before, after)
    print(f"eager V2 bf16 step: fresh {before.median:.2f} ms (p10-p90 {before.p10:.2f}-{before.p90:.2f}), after an "
          f"isolated profile {after.median:.2f} ms ({after.p10:.2f}-{after.p90:.2f}): {ratio:.3f}x, {said}")
    # The course's one comparison decides: a profile in this process made this step "slower" beyond both bands
    # (1.21x, H200, 2026-11-26). A further bound on the medians failed once on the host's drift alone (43.4 and
    # 50.6 ms, bands 32.7-45.9 and 35.4-52.9: within noise, H200, 2026-11-27).
    assert said != "slower"
    with torch.profiler.profile():
        step(*batch)
        torch.cuda.synchronize()
    with pytest.raises(timing.ProfilerResidueError):
        timed()
    timing.forget_profiler_sessions()  # only to measure what the refusal protects against
    residue = timed()
    print(f"after a profiler session in this process: {residue.median:.2f} ms ({residue.p10:.2f}-{residue.p90:.2f}), "
          f"{residue.median / before.median:.2f}x the fresh step")


def test_a_profiled_run_may_follow_a_profiler_session():
    _profile_something()
    timer = timing.PhaseTimer(torch.device("cpu"), profiled=True)  # its times are reported as profiled
    timer.start()
    timer.mark("work")
    assert list(timer.stop()) == ["work"]
    with pytest.raises(timing.ProfilerResidueError):
        timing.PhaseTimer(torch.device("cpu"))
