"""Data-parallel training (tinyllama.harness.distributed) on the CPU with gloo and two ranks: DDP and FSDP2 on
disjoint halves of each global batch reproduce one process on the whole batch at every step, the
bad settings stop every rank with one line before anyone waits, and a rank that fails ends the
others with an error within the timeout.

The ranks are forked from the test process (torch is already imported there, so a rank starts in a
fraction of a second); the last test starts them with torchrun, as a participant does."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch._dynamo  # noqa: F401  (AdamW imports it on first use: seconds in every forked rank otherwise)

from tinyllama import device as dev
from tinyllama.harness import distributed, process_group
from tinyllama.harness.distributed import (
    SyntheticTokens,
    _cpu_requested,
    fsdp_available,
    main,
    model_state_bytes,
    rank_loader,
    run_distributed,
)
from tinyllama.harness.process_group import DistContext

ROOT = Path(__file__).resolve().parents[1]
RUN = dict(preset="ci", batch_size=4, seq_len=16, num_steps=4, warmup_steps=1, seed=3, progress=False)
RANK_TIMEOUT_S = 60  # a hang fails the test instead of stalling CI


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_env(rank: int, world_size: int, port: int) -> None:
    """What torchrun sets in each process it starts."""
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})


def _run_ranks(target: Callable[[int, Path], Any], tmp_path: Path, world_size: int = 2) -> list[int]:
    """Fork ``world_size`` ranks running ``target(rank, folder)``; their exit codes. Fails on a hang."""
    port = _free_port()
    context = multiprocessing.get_context("fork")

    def body(rank: int) -> None:
        _rank_env(rank, world_size, port)
        torch.set_num_threads(1)
        with open(tmp_path / f"rank{rank}.err", "w") as err, contextlib.redirect_stderr(err):
            code = target(rank, tmp_path)
        sys.stdout.flush()
        os._exit(int(code or 0))

    processes = [context.Process(target=body, args=(rank,)) for rank in range(world_size)]
    for p in processes:
        p.start()
    deadline = time.monotonic() + RANK_TIMEOUT_S
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [rank for rank, p in enumerate(processes) if p.is_alive()]
    for p in processes:
        if p.is_alive():
            p.kill()
            p.join()
    assert not hung, f"ranks {hung} still running after {RANK_TIMEOUT_S} s: a hang"
    return [p.exitcode for p in processes]


def _train_rank(strategy: str) -> Callable[[int, Path], int]:
    def target(rank: int, folder: Path) -> int:
        process_group.join(torch.device("cpu"), backend="gloo", timeout_s=30)
        try:
            result = run_distributed(strategy, profiled_steps=1, return_weights=True, **RUN)
        finally:
            process_group.teardown()
        mine = result.ranks[rank]
        torch.save({"losses": result.losses, "weights": result.weights, "counted": mine.counted_state_mib,
                    "predicted": result.predicted_state_mib, "communication_ms": mine.communication_ms,
                    "collectives": [c["name"] for c in mine.collectives], "local_batch": result.local_batch_size,
                    "world_size": result.world_size, "rank_losses": [r.losses for r in result.ranks]},
                   folder / f"rank{rank}.pt")
        return 0
    return target


@pytest.fixture(scope="module")
def one_process():
    """The reference: one process, the plain model, the whole global batch."""
    torch.set_num_threads(1)
    return run_distributed("ddp", profiled_steps=1, return_weights=True, **RUN)  # the same steps as the ranks


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_on_halves_of_the_batch_equal_one_process_on_the_whole(strategy, one_process, tmp_path):
    if strategy == "fsdp" and not fsdp_available():
        pytest.skip(f"PyTorch {torch.__version__} has no FSDP2 (fully_shard)")
    codes = _run_ranks(_train_rank(strategy), tmp_path)
    errors = [(tmp_path / f"rank{r}.err").read_text()[-2000:] for r in range(2)]
    assert codes == [0, 0], errors
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert ranks[0]["world_size"] == 2 and ranks[0]["local_batch"] == RUN["batch_size"] // 2
    # Disjoint halves: the two ranks saw different sequences, so their own losses differ ...
    assert ranks[0]["rank_losses"][0] != ranks[0]["rank_losses"][1]
    # ... and their mean is one process's loss on the whole batch, at every step (fp32 rounding apart).
    expected = one_process.losses
    assert len(ranks[0]["losses"]) == len(expected) == RUN["num_steps"] + RUN["warmup_steps"]
    assert ranks[0]["losses"] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    for rank in ranks:  # every rank ends with the weights of the single process
        assert rank["weights"].keys() == one_process.weights.keys()
        for name, tensor in one_process.weights.items():
            torch.testing.assert_close(rank["weights"][name], tensor, rtol=1e-4, atol=1e-5, msg=name)
    # What each rank keeps: counted from the tensors, as the formula says (FSDP2: half of everything).
    for part in ("weights", "optimizer state"):
        assert ranks[0]["counted"][part] == pytest.approx(ranks[0]["predicted"][part], rel=0.01)
    assert ranks[0]["counted"]["weights"] == pytest.approx(
        (0.5 if strategy == "fsdp" else 1.0) * one_process.predicted_state_mib["weights"], rel=0.01)
    # The profiler saw the collectives.
    assert ranks[0]["communication_ms"] > 0 and any("gloo" in name for name in ranks[0]["collectives"])


def test_the_sampler_splits_each_global_batch_into_disjoint_parts():
    data = SyntheticTokens(vocab_size=50, seq_len=4, num_samples=12, seed=0)
    whole = [x for x, _ in rank_loader(data, 4, DistContext())]
    parts = [[x for x, _ in rank_loader(data, 2, DistContext(rank=r, world_size=2))] for r in range(2)]
    for step, batch in enumerate(whole):
        split = torch.cat([parts[0][step], parts[1][step]])
        assert sorted(map(tuple, split.tolist())) == sorted(map(tuple, batch.tolist()))
        assert not set(map(tuple, parts[0][step].tolist())) & set(map(tuple, parts[1][step].tolist()))


def test_model_state_formula():
    assert sum(model_state_bytes(1000, "ddp", 4).values()) == 16_000  # weights, AdamW moments, buckets
    assert sum(model_state_bytes(1000, "none", 1).values()) == 12_000
    assert sum(model_state_bytes(1000, "fsdp", 4).values()) == 3_000


@pytest.mark.parametrize("flags, message", [
    (["--batch-size", "3"], "--batch-size 3 does not split evenly across 2 processes: use a multiple of 2"),
    (["--backend", "nccl", "--device", "cpu"], "nccl back end (NCCL/RCCL) connects GPUs"),
    (["--strategy", "zero3"], "unknown strategy 'zero3'"),
    (["--fail-rank", "5"], "--fail-rank must be between 0 and 1"),
    (["--turns", "-1"], "--turns must be 0 (off) or a number of rounds"),
])
def test_bad_settings_stop_the_rank_before_it_waits_for_the_others(flags, message, monkeypatch, capsys):
    _rank_env(1, 2, _free_port())  # a rank of 2 whose partner never comes: joining would wait
    monkeypatch.setattr(process_group, "join", lambda *a, **k: pytest.fail("joined the group despite a bad setting"))
    try:
        assert main(["--preset", "ci", "--quiet", *flags]) == 2
    finally:
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(name, None)
    err = capsys.readouterr().err
    assert err.startswith("error (rank 1/2): ") and message in err and "Traceback" not in err


def test_a_failing_rank_ends_every_rank_with_an_error_within_the_timeout(tmp_path):
    def target(rank: int, folder: Path) -> int:
        return main(["--preset", "ci", "--batch-size", "4", "--num-steps", "3", "--warmup-steps", "1", "--quiet",
                     "--device", "cpu", "--timeout-s", "10", "--profiled-steps", "0", "--fail-rank", "1"])

    began = time.monotonic()
    codes = _run_ranks(target, tmp_path)
    assert time.monotonic() - began < 10 + 15  # the timeout, and the time to build and run the steps
    errors = [(tmp_path / f"rank{r}.err").read_text() for r in range(2)]
    assert codes == [1, 1], errors
    assert "error (rank 1/2): rank 1/2 stopped on purpose at step 1" in errors[1]
    assert "error (rank 0/2): a collective failed" in errors[0] and "another rank has probably failed" in errors[0]
    assert all("Traceback" not in e for e in errors), errors


def _torchrun(*flags: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "tinyllama.harness.distributed", "--preset", "ci", "--device", "cpu", "--quiet", *flags],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def test_every_rank_is_reported_with_the_global_figures_and_the_scaling_efficiency(tmp_path, capsys):
    def target(rank: int, folder: Path) -> int:
        return main(["--preset", "ci", "--batch-size", "4", "--num-steps", "3", "--warmup-steps", "1", "--quiet",
                     "--device", "cpu", "--profiled-steps", "1", "--baseline-tokens-per-s", "100",
                     "--json", str(folder / "runs.json")])

    assert _run_ranks(target, tmp_path) == [0, 0], [(tmp_path / f"rank{r}.err").read_text() for r in range(2)]
    records = json.loads((tmp_path / "runs.json").read_text())  # written once, by rank 0
    assert sorted(r["rank"] for r in records) == [0, 1]
    assert all(r["local_batch_size"] == 2 and r["world_size"] == 2 and r["backend"] == "gloo" for r in records)
    slowest = max(r["step_ms_median"] for r in records)
    # each rank's own rate is its share of the batch (2 x 32 tokens) over its own median step
    assert all(r["rank_tokens_per_s"] == pytest.approx(2 * 32 / (r["step_ms_median"] / 1e3)) for r in records)
    assert records[0]["tokens_per_s"] == pytest.approx(4 * 32 / (slowest / 1e3))
    assert records[0]["scaling_efficiency"] == pytest.approx(records[0]["tokens_per_s"] / (2 * 100))
    assert all(r["communication_ms"] > 0 for r in records)
    # within each rank's own profiled step; transfer + wait = communication on every rank, the transfer the
    # same on both (the physical check found nothing)
    assert all(0 < r["communication_ms"] <= r["profiled_step_ms"] for r in records)
    assert all(r["transfer_ms"] + r["wait_ms"] == pytest.approx(r["communication_ms"]) for r in records)
    assert records[0]["communication_problems"] == [] and len(records[0]["communication_steps"]) == 1


def test_every_strategy_is_timed_before_any_is_profiled(tmp_path):
    """Two strategies in one launch: both trained, then timed in turns, then both profiled (a profiler session
    before the second's timing would slow it, and the timers refuse to time after one)."""
    if not fsdp_available():
        pytest.skip(f"PyTorch {torch.__version__} has no FSDP2 (fully_shard)")

    def target(rank: int, folder: Path) -> int:
        return main(["--preset", "ci", "--batch-size", "4", "--num-steps", "2", "--warmup-steps", "1", "--quiet",
                     "--device", "cpu", "--profiled-steps", "1", "--strategy", "ddp", "fsdp", "--turns", "3",
                     "--json", str(folder / "runs.json")])

    assert _run_ranks(target, tmp_path) == [0, 0], [(tmp_path / f"rank{r}.err").read_text()[-2000:] for r in range(2)]
    records = json.loads((tmp_path / "runs.json").read_text())
    assert sorted((r["strategy"], r["rank"]) for r in records) == [("ddp", 0), ("ddp", 1), ("fsdp", 0), ("fsdp", 1)]
    assert all(0 < r["communication_ms"] <= r["profiled_step_ms"] for r in records)
    # the step times are the turns' (3 rounds of 2 steps), not the 2 training steps', on every rank
    assert all(r["timed_in_turns"] and r["step_ms_n"] == 6 and r["step_ms_median"] > 0 for r in records)
    assert all(r["slowest_step_ms"] == max(o["step_ms_median"] for o in records if o["strategy"] == r["strategy"])
               for r in records)
    assert all(len(r["losses"]) == 3 for r in records)  # the losses stay those of the training (1 + 2 steps)


def test_runs_that_do_not_fit_side_by_side_keep_their_training_times(monkeypatch):
    from types import SimpleNamespace

    from tinyllama.harness import distributed

    def run(at_rest: float, peak: float) -> SimpleNamespace:
        return SimpleNamespace(ranks=[SimpleNamespace(allocated_at_rest_mib=at_rest, peak_memory_mib=peak)] * 2)

    runs = [run(30_000, 40_000), run(25_000, 31_000)]  # 55 GiB at rest, the larger rise 10 GiB
    for total_gib, fits in ((80, True), (70, False)):  # 90% of 70 GiB is 63 GiB < 65 GiB
        monkeypatch.setattr(distributed.dev, "memory_stats",
                            lambda device, total=total_gib: SimpleNamespace(total_bytes=total * 2**30))
        assert distributed.fits_side_by_side(runs, torch.device("cpu")) is fits
    monkeypatch.setattr(distributed.dev, "memory_stats", lambda device: SimpleNamespace(total_bytes=None))
    assert distributed.fits_side_by_side(runs, torch.device("cpu"))  # the CPU keeps no total: host memory


def test_torchrun_stops_every_rank_when_one_fails(tmp_path):
    began = time.monotonic()
    done = _torchrun("--batch-size", "4", "--num-steps", "3", "--warmup-steps", "1", "--profiled-steps", "0",
                     "--timeout-s", "20", "--fail-rank", "0", cwd=tmp_path)
    assert done.returncode != 0 and "[rank 1/2]" not in done.stdout
    assert "error (rank 0/2): rank 0/2 stopped on purpose" in done.stderr
    # rank 1 learns it from the collective that lost its partner, or from torchrun stopping it
    assert "error (rank 1/2): " in done.stderr, done.stderr[-3000:]
    assert time.monotonic() - began < 200


def _trace(tmp_path, events):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", **e} for e in events]}))
    return path


def test_trace_timeline_keeps_the_last_step_and_marks_the_collectives(tmp_path):
    from tinyllama.profiling.communication import trace_timeline

    gpu = _trace(tmp_path, [
        {"name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 100, "tid": 1},
        {"name": "ProfilerStep#2", "cat": "user_annotation", "ts": 100, "dur": 100, "tid": 1},
        {"name": "ampere_sgemm", "cat": "kernel", "ts": 10, "dur": 5, "tid": 7},
        {"name": "ampere_sgemm", "cat": "kernel", "ts": 110, "dur": 30, "tid": 7},
        {"name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "cat": "kernel", "ts": 130, "dur": 40, "tid": 20},
        {"name": "aten::mm", "cat": "cpu_op", "ts": 105, "dur": 3, "tid": 1},
    ])
    frame = trace_timeline(gpu).sort_values("start_ms")
    assert list(frame.name) == ["ampere_sgemm", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"]  # kernels of step 2 only
    assert list(frame.lane) == ["stream 7", "stream 20"] and list(frame.collective) == [False, True]
    assert frame.start_ms.tolist() == pytest.approx([0.010, 0.030]) and frame.duration_ms.tolist() == pytest.approx([0.03, 0.04])
    cpu = _trace(tmp_path, [
        {"name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 100, "tid": 1},
        {"name": "aten::linear", "cat": "cpu_op", "ts": 10, "dur": 20, "tid": 1},
        {"name": "aten::mm", "cat": "cpu_op", "ts": 12, "dur": 10, "tid": 1},  # inside aten::linear: not a row
        {"name": "c10d::allreduce_", "cat": "cpu_op", "ts": 40, "dur": 1, "tid": 1},
        {"name": "gloo:all_reduce", "cat": "user_annotation", "ts": 41, "dur": 30, "tid": 9},
    ])
    frame = trace_timeline(cpu)
    assert sorted(frame.name) == ["aten::linear", "c10d::allreduce_", "gloo:all_reduce"]
    assert frame.set_index("name").collective.to_dict() == {"aten::linear": False, "c10d::allreduce_": True,
                                                           "gloo:all_reduce": True}


def test_fsdp_packing_copies_are_not_communication():
    from tinyllama.profiling.communication import is_collective

    assert is_collective("FSDP::all_gather (layers.0)") and is_collective("ncclKernel_ReduceScatter_RING")
    assert not is_collective("FSDP::all_gather_copy_in") and not is_collective("aten::mm")


@pytest.mark.parametrize("argv, cpu", [(["--device", "cpu"], True), (["--device=cpu"], True),
                                       (["--preset", "ci"], False), (["--device", "cuda:1"], False)])
def test_a_cpu_rank_is_recognised_from_its_arguments(argv, cpu):
    assert _cpu_requested(argv) is cpu


def test_hiding_the_gpus_empties_the_back_ends_visibility_variable(monkeypatch):
    monkeypatch.setenv(dev.visible_devices_variable(), "0,1")
    dev.hide_gpus()
    assert os.environ[dev.visible_devices_variable()] == ""


# ------------------------------------------------------------------------------------------------
# Communication figures from synthetic profiles: rank 1 arrives 5 ms late to each of 3 all-reduces
# whose transfer takes 2 ms, in a profiled step of 30 ms. The two ranks' clocks differ (rank 1's
# profile counts from 1000 s): only the collectives' ends are comparable across processes.
# ------------------------------------------------------------------------------------------------

ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
STEP = (0.0, 30.0)
LATE = {0: [(1.0, 8.0), (10.0, 17.0), (20.0, 27.0)],  # rank 0 arrives first: 5 ms wait + 2 ms transfer
        1: [(6.0, 8.0), (15.0, 17.0), (25.0, 27.0)]}  # rank 1 arrives last: the transfer alone
COMPUTE = {0: [(0.0, 1.0), (8.0, 10.0), (17.0, 20.0)], 1: [(0.0, 6.0), (8.0, 15.0), (17.0, 25.0)]}
OFFSET_MS = {0: 0.0, 1: 1_000_000.0}


def _event(name, start_ms, end_ms, device=True, annotation=False, parent=None):
    from types import SimpleNamespace

    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start_ms * 1e3, end=end_ms * 1e3),
                           device_type="DeviceType.CUDA" if device else "DeviceType.CPU", cpu_parent=parent,
                           is_user_annotation=annotation)


def _gpu_events(rank, collectives=None, compute=None, step=STEP):
    """One rank's profiler events (as ``prof.events()`` gives them) for one profiled step."""
    o = OFFSET_MS[rank]
    events = [_event("ProfilerStep#2", step[0] + o, step[1] + o, device=False),
              # the step's and the all-reduce range's copies on the device timeline: neither compute nor communication
              _event("ProfilerStep#2", step[0] + o, step[1] + o, annotation=True),
              _event("nccl:all_reduce", o, step[1] + o, annotation=True)]
    events += [_event(ALL_REDUCE, s + o, e + o) for s, e in (LATE[rank] if collectives is None else collectives)]
    compute = COMPUTE[rank] if compute is None else compute
    events += [_event("ampere_sgemm_128x64_tn", s + o, e + o) for s, e in compute]
    return events


def _figures(events_by_rank, on_device=True):
    from tinyllama.profiling.communication import communication_figures, rank_profile

    return communication_figures([rank_profile(events, on_device) for events in events_by_rank])


def test_a_late_rank_makes_the_others_wait_not_transfer():
    from tinyllama.profiling.communication import check_physical

    f0, f1 = _figures([_gpu_events(0), _gpu_events(1)])
    assert [len(f.steps) for f in (f0, f1)] == [1, 1] and f0.steps[0].matched and f1.steps[0].matched
    # transfer: 3 x 2 ms on both ranks; the early rank's 3 x 5 ms are wait, reported apart
    assert f0.transfer_ms == pytest.approx(6.0) and f1.transfer_ms == pytest.approx(6.0)
    assert f0.wait_ms == pytest.approx(15.0) and f1.wait_ms == pytest.approx(0.0)
    assert f0.communication_ms == pytest.approx(21.0) and f1.communication_ms == pytest.approx(6.0)
    # set against the profiled step itself; nothing overlaps the collectives here, so all of it is exposed
    assert f0.step_ms == pytest.approx(30.0) and f1.step_ms == pytest.approx(30.0)
    assert f0.exposed_ms == pytest.approx(21.0) and f1.exposed_ms == pytest.approx(6.0)
    assert f0.exposed_transfer_ms == pytest.approx(6.0) and f1.exposed_transfer_ms == pytest.approx(6.0)
    assert check_physical([f0, f1]) == []


def test_compute_beside_the_collectives_reduces_the_exposed_time():
    # rank 0 computes on another stream during 3 ms of its first wait and 1 ms of its first transfer ([6, 8])
    compute = COMPUTE[0] + [(2.0, 5.0), (7.0, 8.0)]
    f0, f1 = _figures([_gpu_events(0, compute=compute), _gpu_events(1)])
    assert f0.communication_ms == pytest.approx(21.0) and f0.transfer_ms == pytest.approx(6.0)
    assert f0.exposed_ms == pytest.approx(21.0 - 3.0 - 1.0)
    assert f0.exposed_transfer_ms == pytest.approx(6.0 - 1.0)
    assert f1.exposed_ms == pytest.approx(6.0)


def test_communication_and_exposed_time_stay_within_the_profiled_step():
    # a collective that runs past the step's end, and one of the warm-up step before it (outside the profiled step)
    collectives = {0: LATE[0] + [(-9.0, -1.0), (28.0, 40.0)], 1: LATE[1] + [(-3.0, -1.0), (29.0, 40.0)]}
    f0, f1 = _figures([_gpu_events(r, collectives=collectives[r]) for r in (0, 1)])
    for f in (f0, f1):
        step = f.steps[0]
        assert step.step_ms == pytest.approx(30.0)
        assert step.communication_ms <= step.step_ms and step.exposed_ms <= step.step_ms
        assert step.transfer_ms + step.wait_ms == pytest.approx(step.communication_ms)
    # the last all-reduce counts up to the step's end: rank 0 from 28 ms, rank 1 from 29 ms
    assert f0.communication_ms == pytest.approx(21.0 + 2.0) and f1.communication_ms == pytest.approx(6.0 + 1.0)
    assert f0.transfer_ms == pytest.approx(f1.transfer_ms) == pytest.approx(7.0)


def test_gloo_host_ranges_give_the_same_split_on_a_cpu():
    def events(rank):
        o = OFFSET_MS[rank]
        out = [_event("ProfilerStep#2", o, 30.0 + o, device=False)]
        for s, e in LATE[rank]:
            outer = _event("gloo:all_reduce", s + o, e + o, device=False, annotation=True)
            out += [outer, _event("c10d::allreduce_", s + o, s + o + 0.5, device=False, parent=outer)]  # inside: once
            # the caller's thread only hands the work to gloo, and returns when it likes: not the collective
            out.append(_event("c10d::allreduce_", s + o - 0.4, s + o - 0.1 * (1 + rank), device=False))
        return out

    f0, f1 = _figures([events(0), events(1)], on_device=False)
    assert (f0.transfer_ms, f0.wait_ms, f1.transfer_ms, f1.wait_ms) == pytest.approx((6.0, 15.0, 6.0, 0.0))
    assert f0.exposed_ms is None and not f0.on_device
    assert list(f0.collectives.name) == ["gloo:all_reduce"] and f0.collectives.calls_per_step[0] == 3


def test_saved_chrome_traces_of_two_ranks_give_the_same_figures(tmp_path):
    from tinyllama.profiling.communication import communication_figures, read_trace

    paths = []
    for rank in (0, 1):
        o = OFFSET_MS[rank] * 1e3 + 1.7e15  # absolute microseconds, a different origin on each rank
        x = lambda name, cat, s, e, tid: {"ph": "X", "name": name, "cat": cat, "ts": o + s * 1e3,  # noqa: E731
                                          "dur": (e - s) * 1e3, "tid": tid}
        events = [x("ProfilerStep#2", "user_annotation", 0, 30, 1),
                  x("ProfilerStep#2", "gpu_user_annotation", 0, 30, 7),
                  x("nccl:all_reduce", "gpu_user_annotation", 0, 30, 20)]
        events += [x(ALL_REDUCE, "kernel", s, e, 20) for s, e in LATE[rank]]
        events += [x("ampere_sgemm_128x64_tn", "kernel", s, e, 7) for s, e in COMPUTE[rank]]
        path = tmp_path / f"rank{rank}.json"
        path.write_text(json.dumps({"traceEvents": events}))
        paths.append(path)
    f0, f1 = communication_figures([read_trace(p) for p in paths])
    assert (f0.transfer_ms, f0.wait_ms, f0.exposed_ms) == pytest.approx((6.0, 15.0, 21.0))
    assert (f1.transfer_ms, f1.wait_ms, f1.exposed_ms) == pytest.approx((6.0, 0.0, 6.0))
    assert f0.step_ms == pytest.approx(30.0)


def test_impossible_communication_figures_are_flagged():
    from tinyllama.profiling.communication import (
        CommunicationTime,
        ImpossibleFigures,
        StepCommunication,
        check_physical,
    )

    def rank(r, communication, transfer, exposed, step_ms=30.0):
        return CommunicationTime(rank=r, on_device=True, steps=[StepCommunication(
            step=2, step_ms=step_ms, communication_ms=communication, transfer_ms=transfer,
            wait_ms=communication - transfer, exposed_ms=exposed, exposed_transfer_ms=min(exposed, transfer),
            matched=True)])

    assert check_physical([rank(0, 21.0, 6.0, 21.0), rank(1, 6.0, 6.0, 6.0)]) == []
    with pytest.raises(ImpossibleFigures, match="communication 40.000 ms in a step of 30.000 ms"):
        check_physical([rank(0, 40.0, 6.0, 21.0), rank(1, 6.0, 6.0, 6.0)])  # issue 31: 150 ms in a 107 ms step
    problems = check_physical([rank(0, 21.0, 6.0, 25.0), rank(1, 6.0, 6.0, 6.0)], strict=False)
    assert len(problems) == 1 and "exposed 25.000 ms exceeds" in problems[0]
    problems = check_physical([rank(0, 21.0, 21.0, 21.0), rank(1, 6.0, 6.0, 6.0)], strict=False)  # skew as transfer
    assert len(problems) == 1 and "transfer times differ" in problems[0]


def test_the_summary_and_records_carry_each_ranks_split_within_its_profiled_step():
    from tinyllama.profiling.communication import rank_profile
    from tinyllama.timing import summarize

    ranks = [distributed.RankResult(
        rank=r, device="GPU", step_ms=summarize([20.0, 21.0, 22.0]), phase_ms={}, warmup_ms=[], losses=[1.0],
        tokens_per_s=1.0, peak_memory_mib=1.0, allocated_at_rest_mib=1.0, counted_state_mib={},
        communication_ms=None, exposed_communication_ms=None,
        communication_profile=rank_profile(_gpu_events(r), on_device=True)) for r in (0, 1)]
    assert distributed._combine_communication(ranks) == []
    result = distributed.DistributedResult(
        strategy="ddp", world_size=2, backend="nccl", library="NCCL", version="v1", preset="ci", precision="bf16",
        global_batch_size=4, local_batch_size=2, seq_len=16, num_parameters=10, num_steps=3, warmup_steps=1,
        ranks=ranks, losses=[1.0], tokens_per_s=1.0, slowest_step_ms=21.0, predicted_state_mib={})
    records = result.to_records()
    assert [r["transfer_ms"] for r in records] == pytest.approx([6.0, 6.0])
    assert [r["wait_ms"] for r in records] == pytest.approx([15.0, 0.0])
    assert [r["communication_ms"] for r in records] == pytest.approx([21.0, 6.0])
    assert [r["exposed_communication_ms"] for r in records] == pytest.approx([21.0, 6.0])
    # against the profiled step (30 ms), not the unprofiled median (21 ms)
    assert [r["profiled_step_ms"] for r in records] == pytest.approx([30.0, 30.0])
    assert all(r["communication_ms"] <= r["profiled_step_ms"] for r in records)
    assert records[0]["communication_steps"][0]["wait_ms"] == pytest.approx(15.0)
    assert "communication_profile" not in records[0] and ranks[0].communication_profile is None
    text = result.summary()
    assert "profiled step of 30.00 ms: communication 21.00 ms = transfer 6.00 + wait for other ranks 15.00" in text
    assert "communication 6.00 ms = transfer 6.00 + wait for other ranks 0.00" in text
    assert "IMPOSSIBLE" not in text
    table = distributed.scaling_table(records)
    assert table.loc[0, "transfer_ms"] == pytest.approx(6.0) and table.loc[0, "wait_ms"] == pytest.approx(15.0)
    assert table.loc[0, "profiled_step_ms"] == pytest.approx(30.0)


def _bf16_fsdp_rank(rank: int, folder: Path) -> int:
    """FSDP2 under wrap's bf16 policy: what a block computes with, what AdamW updates, what is reduced."""
    from tinyllama.config import get_preset
    from tinyllama.harness.distributed import wrap
    from tinyllama.models import build

    process_group.join(torch.device("cpu"), backend="gloo", timeout_s=30)
    try:
        found = {}
        for strategy in ("fsdp", "fsdp-fp32"):
            torch.manual_seed(0)
            model = wrap(build("v2", get_preset("ci").model), strategy, torch.device("cpu"), "bf16")
            seen: list[torch.dtype] = []
            model.layers[0].attn.register_forward_pre_hook(
                lambda module, args: seen.append(next(module.parameters()).dtype))
            inputs = torch.randint(0, 64, (2, 8))
            model(inputs).float().sum().backward()
            shards = {p.dtype for p in model.parameters()}
            grads = {p.grad.dtype for p in model.parameters() if p.grad is not None}
            found[strategy] = {"computed": seen, "shards": shards, "grads": grads}
        torch.save(found, folder / f"bf16-{rank}.pt")
    finally:
        process_group.teardown()
    return 0


def test_fsdp2_in_bf16_gathers_bf16_weights_and_keeps_fp32_shards(tmp_path):
    """wrap's mixed-precision policy: each block computes with bf16 weights (all-gathered in bf16, half the
    bytes), AdamW's shards and the reduced gradients stay fp32; the byte formula follows it."""
    if not fsdp_available():
        pytest.skip(f"PyTorch {torch.__version__} has no FSDP2 (fully_shard)")
    codes = _run_ranks(_bf16_fsdp_rank, tmp_path)
    assert codes == [0, 0], [(tmp_path / f"rank{r}.err").read_text()[-2000:] for r in range(2)]
    found = torch.load(tmp_path / "bf16-0.pt")
    seen = found["fsdp"]
    assert seen["computed"] == [torch.bfloat16]
    assert seen["shards"] == {torch.float32} and seen["grads"] == {torch.float32}
    # fsdp-fp32, the comparison without the policy: fp32 weights gathered (autocast casts inside each operator)
    assert found["fsdp-fp32"]["computed"] == [torch.float32]


def test_communication_bytes_with_bf16_gathers():
    from tinyllama.harness.distributed import communication_bytes, gathered_bytes

    assert gathered_bytes("bf16") == 2 and gathered_bytes("fp32") == gathered_bytes("fp16") == 4
    assert gathered_bytes("bf16", "fsdp-fp32") == 4 and communication_bytes(1000, "fsdp-fp32", 4) == 9_000
    # FSDP2 on 4 ranks, 1,000 parameters: 3/4 of (2 gathers x 2 bytes + 1 reduce-scatter x 4 bytes) a parameter.
    assert communication_bytes(1000, "fsdp", 4, gathered_bytes_per_value=2) == 6_000
    assert communication_bytes(1000, "fsdp", 4) == 9_000 and communication_bytes(1000, "ddp", 4) == 6_000
    assert communication_bytes(1000, "fsdp", 1, gathered_bytes_per_value=2) == 0


# ---- variants, ZeRO arithmetic, named lanes ------------------------------------------------------------

from tinyllama.config import ConfigError  # noqa: E402
from tinyllama.harness.distributed import check_strategy, communication_bytes, parse_strategy, zero_state_bytes  # noqa: E402


def test_a_variant_is_read_from_its_text_and_a_bad_one_is_refused():
    assert parse_strategy("ddp") == ("ddp", {})
    assert parse_strategy("ddp:bucket_cap_mb=5,accumulate=4,no_sync=1") == (
        "ddp", {"bucket_cap_mb": 5.0, "accumulate": 4, "no_sync": True})
    assert parse_strategy("fsdp:reshard_after_forward=0") == ("fsdp", {"reshard_after_forward": False})
    for bad, message in (("dpp", "unknown strategy"), ("fsdp:bucket_cap_mb=5", "fsdp takes"),
                         ("ddp:accumulate=two", "not a number"), ("ddp:accumulate=0", "at least 1"),
                         ("zero1:no_sync=1", "zero1 takes")):
        with pytest.raises(ConfigError, match=message):
            parse_strategy(bad)
    with pytest.raises(ConfigError, match="fp16"):
        check_strategy("zero1", "fp16")


def test_zero_stages_shard_the_optimizer_state_then_the_gradients_then_the_parameters():
    p, n = 1_000, 4
    totals = [sum(zero_state_bytes(p, stage, n).values()) for stage in range(4)]
    assert totals == [16 * p, 4 * p + 12 * p / n, 2 * p + 14 * p / n, 16 * p / n]
    assert all(sum(zero_state_bytes(p, stage, 1).values()) == 16 * p for stage in range(4))  # one rank: no sharding
    assert zero_state_bytes(p, 1, n)["master weights"] == 4 * p / n and zero_state_bytes(p, 1, n)["parameters"] == 2 * p
    with pytest.raises(ConfigError, match="stages"):
        zero_state_bytes(p, 4, n)


def test_communication_bytes_of_the_variants():
    p, n = 1_000_000, 4
    ddp = communication_bytes(p, "ddp", n)
    assert communication_bytes(p, "ddp:accumulate=4", n) == 4 * ddp  # an all-reduce after every micro-batch
    assert communication_bytes(p, "ddp:accumulate=4,no_sync=1", n) == ddp  # one per optimizer step
    assert communication_bytes(p, "ddp:bucket_cap_mb=1", n) == ddp  # buckets split the bytes, not add to them
    assert communication_bytes(p, "zero1", n) == pytest.approx(1.5 * ddp, abs=1)  # + the broadcast of the shards
    assert model_state_bytes(p, "zero1", n)["optimizer state"] == 8 * p // n


def test_the_lanes_are_named_by_what_runs_on_them():
    import pandas as pd

    from tinyllama.profiling.communication import lane_names

    def frame(rows):
        return pd.DataFrame([{"lane": lane, "name": name, "start_ms": 0.0, "duration_ms": 1.0, "collective": coll}
                             for lane, name, coll in rows])

    gpu = frame([("stream 7", "ampere_sgemm", False), ("stream 7", "elementwise", False),
                 ("stream 20", "ncclDevKernel_AllGather_RING_LL", True),
                 ("stream 20", "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", True),
                 ("stream 9", "Memcpy DtoD", False)])
    assert lane_names(gpu, "NCCL") == {"stream 7": "compute stream", "stream 20": "NCCL stream: all-gather, reduce-scatter",
                                       "stream 9": "copy stream"}
    cpu = frame([("thread 1", "aten::linear", False), ("thread 1", "aten::mm", False),
                 ("thread 1", "c10d::allreduce_", True), ("thread 9", "gloo:all_reduce", True),
                 ("thread 10", "gloo:all_reduce", True)])
    named = lane_names(cpu, "gloo")
    assert named["thread 1"] == "main thread: forward, backward, optimizer"
    # two lanes that would read the same keep their ids
    assert named["thread 9"] == "gloo thread: all-reduce [thread 9]" and named["thread 10"].endswith("[thread 10]")


def test_variants_count_their_all_reduces_and_no_sync_keeps_the_loss_curve(tmp_path):
    """One launch: a small bucket cap, gradient accumulation with and without no_sync, ZeRO-1, and the plain
    all-reduce reference; counted by the communication hook, checked against DDP's losses."""
    def target(rank: int, folder: Path) -> int:
        return main(["--preset", "ci", "--batch-size", "4", "--num-steps", "2", "--warmup-steps", "1", "--quiet",
                     "--device", "cpu", "--profiled-steps", "1", "--time-all-reduce", "--json", str(folder / "runs.json"),
                     "--strategy", "ddp", "ddp:bucket_cap_mb=0.05", "ddp:accumulate=2", "ddp:accumulate=2,no_sync=1",
                     "zero1", "--turns", "0"])

    assert _run_ranks(target, tmp_path) == [0, 0], [(tmp_path / f"rank{r}.err").read_text()[-2000:] for r in range(2)]
    runs = {r["strategy"]: r for r in json.loads((tmp_path / "runs.json").read_text()) if r["rank"] == 0}
    assert runs["ddp"]["bucket_all_reduces_per_step"] is None  # the plain run has no hook
    assert runs["ddp:bucket_cap_mb=0.05"]["bucket_all_reduces_per_step"] > 1  # 0.4 MiB of gradients in several buckets
    synced, unsynced = runs["ddp:accumulate=2"], runs["ddp:accumulate=2,no_sync=1"]
    assert synced["bucket_all_reduces_per_step"] == 2 * unsynced["bucket_all_reduces_per_step"]
    assert synced["accumulation_steps"] == 2 and synced["losses"] == pytest.approx(unsynced["losses"], rel=1e-5)
    # ZeRO-1: the same updates as DDP, half of AdamW's state on each of the 2 ranks
    assert runs["zero1"]["losses"] == pytest.approx(runs["ddp"]["losses"], rel=1e-5)
    assert runs["zero1"]["counted_optimizer_state_mib"] == pytest.approx(runs["ddp"]["counted_optimizer_state_mib"] / 2,
                                                                        rel=0.01)
    assert all(r["all_reduce_ms"] > 0 and r["all_reduce_bytes"] == 4 * r["num_parameters"] for r in runs.values())
    # variants are timed, not profiled
    assert runs["ddp"]["communication_ms"] > 0 and runs["zero1"]["communication_ms"] is None
    # --turns 0: each run's step times are its own 2 training steps
    assert all(not r["timed_in_turns"] and r["step_ms_n"] == 2 for r in runs.values())
