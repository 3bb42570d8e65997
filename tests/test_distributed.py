"""Data-parallel training (tinyllama.distributed) on the CPU with gloo and two ranks: DDP and FSDP2 on
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
from tinyllama import distributed, process_group
from tinyllama.distributed import (SyntheticTokens, _cpu_requested, fsdp_available, main, model_state_bytes,
                                   rank_loader, run_distributed)
from tinyllama.process_group import DistContext

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
                           "-m", "tinyllama.distributed", "--preset", "ci", "--device", "cpu", "--quiet", *flags],
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
