"""The all-reduce timed, the straggler made on purpose, the several-run launch and the recorded scaling study
(notebook 05), on the CPU: two ranks forked from the test process join a gloo group, as torchrun's would.

The straggler's facts: in inference only the delayed rank's median grows (by about the delay) and the global
throughput follows it; in training (DDP) rank 0 waits for it too."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import multiprocessing
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable

import matplotlib
import pytest
import torch
import torchvision  # noqa: F401  (imported once here, not in every forked rank)

from inference import recorded as rec
from inference import scaling, scaling_figures, straggler
from inference.benchmark import run_benchmark
from inference.cli import build_parser, config_from_args
from inference.config import BenchmarkConfig, ConfigError
from tinyllama.harness import allreduce, process_group
from tinyllama.harness.records import append_json, packaged_record, run_record

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "tests" / "data" / "inference_scaling_smoke.json"
RANK_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(target: Callable[[int], Any], tmp_path: Path, world_size: int = 2) -> list[Any]:
    """Fork ``world_size`` ranks in a gloo group, each running ``target(rank)``; what each returned."""
    port = _free_port()
    context = multiprocessing.get_context("fork")

    def body(rank: int) -> None:
        os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                           "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        torch.set_num_threads(1)
        code = 0
        with open(tmp_path / f"rank{rank}.err", "w") as err, contextlib.redirect_stderr(err):
            try:
                process_group.join(torch.device("cpu"), backend="gloo", timeout_s=60)
                value = target(rank)
                (tmp_path / f"rank{rank}.json").write_text(json.dumps(value, default=str))
            except BaseException as error:  # noqa: BLE001 - reported by the test
                print(f"{type(error).__name__}: {error}", file=sys.stderr)
                code = 1
            finally:
                process_group.teardown()
        os._exit(code)

    processes = [context.Process(target=body, args=(rank,)) for rank in range(world_size)]
    for p in processes:
        p.start()
    deadline = time.monotonic() + RANK_TIMEOUT_S
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in processes:
        if p.is_alive():
            p.kill()
            p.join()
    errors = {rank: (tmp_path / f"rank{rank}.err").read_text() for rank, p in enumerate(processes) if p.exitcode}
    assert not errors, f"ranks failed: {errors}"
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(world_size)]


# ------------------------------------------------------------------ the all-reduce


def test_bus_bandwidth_is_nccl_tests_convention():
    assert allreduce.bus_bandwidth(100.0, 2) == 100.0
    assert allreduce.bus_bandwidth(100.0, 8) == pytest.approx(175.0)
    assert allreduce.bus_bandwidth(100.0, 1) == 0.0  # one rank sends nothing
    with pytest.raises(ValueError):
        allreduce.bus_bandwidth(100.0, 0)


@pytest.mark.parametrize("text,message", [("1,x", "sizes in MiB"), ("0", "positive"), ("-4", "positive"),
                                          ("nan", "positive")])
def test_bad_sizes_are_one_line(text, message):
    with pytest.raises(ConfigError, match=message):
        allreduce.parse_sizes_mib(text)


def test_sizes_are_whole_fp32_elements():
    assert allreduce.parse_sizes_mib("1,0.5") == [2**20, 2**19]
    assert allreduce.DEFAULT_SIZES_MIB[-1] == pytest.approx(25_557_032 * 4 / 2**20)


def test_one_process_cannot_time_a_collective():
    with pytest.raises(ConfigError, match="2 or more processes"):
        allreduce.time_all_reduce(2**20, "cpu")


def test_two_gloo_ranks_time_the_all_reduce_and_agree_on_the_slowest(tmp_path):
    def target(rank: int) -> dict:
        timings = allreduce.sweep_all_reduce([2**16, 2**20], "cpu", iterations=3, warmup=1, inner=2)
        return [t.as_record() for t in timings]

    ranks = _run_ranks(target, tmp_path)
    for records in ranks:
        assert [r["bytes"] for r in records] == [2**16, 2**20]
        for r in records:
            assert r["world_size"] == 2 and r["backend"] == "gloo" and len(r["per_rank_median_ms"]) == 2
            assert r["median_ms"] == max(r["per_rank_median_ms"]) > 0  # the slowest rank's median
            assert r["algbw_gbs"] == pytest.approx(r["bytes"] / (r["median_ms"] / 1e3) / 1e9)
            assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"])  # 2 (n-1)/n = 1 for two ranks
    assert ranks[0][1]["per_rank_median_ms"] == ranks[1][1]["per_rank_median_ms"]  # every rank got everyone's


# ------------------------------------------------------------------ the straggler


@pytest.mark.parametrize("ms,rank,message", [(-1.0, None, "0 ms or more"), (math.nan, None, "0 ms or more"),
                                             (5.0, -1, "0 or more"), (0.0, 1, "give the delay too")])
def test_bad_straggler_settings_are_one_line(ms, rank, message):
    with pytest.raises(ConfigError, match=message):
        BenchmarkConfig(network="resnet18", straggler_ms=ms, straggler_rank=rank).validate()


def test_the_straggler_defaults_to_the_last_rank_and_must_be_in_the_group():
    assert straggler.straggler_rank_of(5.0, None, 4) == 3
    assert straggler.straggler_rank_of(0.0, None, 4) is None
    with pytest.raises(ConfigError, match="ranks 0 to 1"):
        straggler.straggler_rank_of(5.0, 2, 2)


def test_the_command_line_takes_the_straggler():
    args = build_parser().parse_args(["--network", "resnet18", "--straggler-ms", "7.5", "--straggler-rank", "0"])
    config = config_from_args(args)
    assert (config.straggler_ms, config.straggler_rank) == (7.5, 0)


def test_a_host_delay_sleeps_for_its_time():
    delay = straggler.make_delay(30.0, torch.device("cpu"))
    began = time.perf_counter()
    delay()
    assert 0.029 <= time.perf_counter() - began < 0.5
    assert straggler.make_delay(0.0, torch.device("cpu"))() is None


DELAY_MS = 250.0
TINY = dict(network="resnet18", batch_size=4, input_size=32, iterations=3, warmup=1, device="cpu", progress=False)


def test_a_straggler_slows_its_own_rank_in_inference_and_every_rank_in_training(tmp_path):
    def target(rank: int) -> dict:
        out = {}
        for mode in ("inference", "training"):
            for delay in (0.0, DELAY_MS):
                result = run_benchmark(BenchmarkConfig(**TINY, mode=mode, straggler_ms=delay))
                out[f"{mode}_{delay:g}"] = result.as_record()
        return out

    ranks = _run_ranks(target, tmp_path)
    late, fast = ranks[1], ranks[0]
    grow = {key: {r: ranks[r][f"{key}_{DELAY_MS:g}"]["median_ms"] - ranks[r][f"{key}_0"]["median_ms"] for r in (0, 1)}
            for key in ("inference", "training")}
    # inference: the straggler (the last rank) is slower by about the delay, rank 0 is not
    assert grow["inference"][1] == pytest.approx(DELAY_MS, rel=0.4)
    assert grow["inference"][0] < 0.4 * DELAY_MS
    record = fast[f"inference_{DELAY_MS:g}"]
    assert record["straggler_rank"] == 1 and record["straggler_ms"] == DELAY_MS
    assert fast["inference_0"]["straggler_rank"] is None and fast["inference_0"]["straggler_ms"] == 0
    # the global throughput is the global batch over the slowest (the straggler's) median
    assert record["global_throughput"] == pytest.approx(4 / (late[f"inference_{DELAY_MS:g}"]["median_ms"] / 1e3))
    # training: DDP's all-reduce makes rank 0 wait for the straggler every step
    # (half the delay at least: on two loaded CPU cores the waits measured 58-61% of it)
    assert grow["training"][0] > 0.5 * DELAY_MS and grow["training"][1] > 0.5 * DELAY_MS


def test_a_straggler_outside_the_group_stops_every_rank_before_it_waits(tmp_path):
    def target(rank: int) -> str:
        try:
            run_benchmark(BenchmarkConfig(**TINY, straggler_ms=5.0, straggler_rank=2))
        except ConfigError as error:
            return str(error)
        return "no error"

    assert all("not a rank of this run" in message for message in _run_ranks(target, tmp_path))


# ------------------------------------------------------------------ several runs in one launch


@pytest.mark.parametrize("plan,message", [
    ([], "non-empty list"),
    ([3], "not a dict"),
    ([{"network": "resnet18", "batch_size": 4}], "per_process_batch"),
    ([{"network": "resnet18", "per_process_batch": 0}], "per_process_batch must be"),
    ([{"network": "resnet18", "per_process_batch": 2, "colour": 1}], "unknown settings colour"),
    ([{"network": "resnet18", "per_process_batch": 2, "straggler_ms": -3}], "0 ms or more"),
    ([{"network": "resnet18", "per_process_batch": 2, "straggler_steps": 1}], "needs an earlier run of resnet18"),
    ([{"network": "resnet18", "per_process_batch": 2, "mode": "training"},
      {"network": "resnet18", "per_process_batch": 2, "straggler_steps": 1}], "needs an earlier run of resnet18 inference"),
    ([{"network": "resnet18", "per_process_batch": 2},
      {"network": "resnet18", "per_process_batch": 2, "straggler_steps": -1}], "positive number"),
])
def test_a_bad_plan_names_its_entry(plan, message):
    with pytest.raises(ConfigError, match=message):
        scaling.configs_from_plan(plan, 2)


def test_a_plan_is_the_same_work_per_process_on_any_count():
    plan = [{"network": "resnet18", "per_process_batch": 8, "mode": "training"}]
    assert [r.config.batch_size for k in (1, 2, 4) for r in scaling.configs_from_plan(plan, k)] == [8, 16, 32]


def test_a_delay_in_steps_counts_in_the_latest_earlier_plain_run_of_the_same_kind():
    plain = {"network": "resnet18", "per_process_batch": 2}
    runs = scaling.configs_from_plan([plain, {**plain, "mode": "training"}, plain, {**plain, "straggler_steps": 1.5}], 2)
    assert (runs[3].reference, runs[3].straggler_steps) == (2, 1.5)


def test_a_delay_in_steps_is_that_share_of_the_step_on_two_ranks(tmp_path):
    plain = {**{k: v for k, v in TINY.items() if k not in ("batch_size", "device", "progress")}, "per_process_batch": 1}

    def target(rank: int) -> list:
        planned = scaling.configs_from_plan([plain, {**plain, "straggler_steps": 2.0}], 2, "cpu")
        return scaling.run_plan(planned, process_group.current(), torch.device("cpu"))["runs"]

    records = _run_ranks(target, tmp_path)[0]  # rank 0 holds every rank's records
    first = max(r["median_ms"] for r in records[:2])
    assert [r["straggler_ms"] for r in records] == [0.0, 0.0, round(2 * first, 3), round(2 * first, 3)]
    assert [r["straggler_rank"] for r in records] == [None, None, 1, 1]


def test_the_plan_file_is_read_or_refused(tmp_path):
    assert scaling.load_plan('[{"network": "resnet18", "per_process_batch": 1}]')[0]["network"] == "resnet18"
    with pytest.raises(ConfigError, match="cannot read"):
        scaling.load_plan(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        scaling.load_plan(str(tmp_path / "bad.json"))


# ------------------------------------------------------------------ the recorded study


@pytest.fixture(scope="module")
def study():
    return rec.load_scaling_study(SMOKE)


def test_the_smoke_study_is_read_as_recorded(study):
    raw = json.loads(SMOKE.read_text())
    assert study.smoke and study.gpus == 2 and "a smoke run" in study.label and study.date == raw["date"]
    assert len(study.runs) == len(raw["runs"]) and len(study.allreduce) == len(raw["allreduce"])


def test_the_efficiency_table_is_global_over_k_times_one(study):
    table = study.table()
    assert set(table["world_size"]) == {1, 2} and (table["efficiency"] > 0).all()
    assert not (study.runs["straggler_ms"] > 0).sum() == 0  # the smoke study has straggler runs ...
    assert len(table) == 2 * 2 * 2  # ... which the table leaves out: 2 networks x 2 modes x 2 counts
    for _, row in table.iterrows():
        ranks = study.runs[(study.runs.network == row.network) & (study.runs["mode"] == row["mode"])
                           & (study.runs.world_size == row.world_size) & (study.runs.straggler_ms == 0)]
        assert row.global_throughput == pytest.approx(ranks.batch_size.iloc[0] / (ranks.median_ms.max() / 1e3))
        one = table[(table.network == row.network) & (table["mode"] == row["mode"]) & (table.world_size == 1)]
        assert row.efficiency == pytest.approx(row.global_throughput / (row.world_size * one.global_throughput.iloc[0]))
    assert list(table.drop_duplicates("network")["network"]) == ["resnet18", "resnet50"]  # by parameter count


def test_the_straggler_table_pairs_each_rank_with_and_without(study):
    frame = study.straggler("training")
    assert list(frame["rank"]) == [0, 1] and list(frame["delayed"]) == [False, True]
    assert frame.attrs["delay_ms"] == 100.0 and frame.attrs["world_size"] == 2
    plain = study.runs[(study.runs["mode"] == "training") & (study.runs.network == frame.attrs["network"])
                       & (study.runs.world_size == 2) & (study.runs.straggler_ms == 0)].sort_values("rank")
    assert list(frame["median_ms"]) == list(plain["median_ms"])
    assert rec.straggler_table(study.runs[study.runs.straggler_ms == 0], "training").empty


def test_a_smoke_study_is_refused_among_the_recorded_gpu_runs(tmp_path):
    record = tmp_path / "inference_scaling.json"
    torchrun = run_record([{"rank": 0}], device="NVIDIA H200", source="torchrun.json")  # a run that is no study
    append_json(record, [torchrun])
    assert rec.latest_scaling_study(record) is None
    append_json(record, [run_record(json.loads(SMOKE.read_text()), device="CPU", gpus=2, source="smoke.json")])
    with pytest.raises(ValueError, match="smoke run of CPU processes"):
        rec.latest_scaling_study(record)


def test_the_newest_study_of_a_record_is_read():
    study = rec.latest_scaling_study()
    runs = [run for run in packaged_record("inference", rec.SCALING_TOPIC) if isinstance(run["data"], dict)]
    assert study is not None and study.date == runs[-1]["data"]["date"] and len(study.runs) == len(runs[-1]["data"]["runs"])


def test_a_study_missing_a_rank_or_of_another_kind_is_refused(tmp_path):
    raw = json.loads(SMOKE.read_text())
    lost = dict(raw, runs=[r for r in raw["runs"] if not (r["world_size"] == 2 and r["rank"] == 1)])
    (tmp_path / "lost.json").write_text(json.dumps(lost))
    with pytest.raises(ValueError, match="a rank is missing"):
        rec.load_scaling_study(tmp_path / "lost.json")
    (tmp_path / "other.json").write_text(json.dumps([raw["runs"][0]]))
    with pytest.raises(ValueError, match="not a scaling study"):
        rec.load_scaling_study(tmp_path / "other.json")


def test_the_checkouts_recorded_studies_are_gpu_runs():
    study = rec.latest_scaling_study()  # None until a GPU study is recorded; never a smoke run
    assert study is None or (not study.smoke and study.gpus >= 1)


def test_the_figures_are_labelled(study):
    fig = scaling_figures.efficiency_figure(study.table(), study.label)
    assert [ax.get_ylabel() for ax in fig.axes] == ["scaling efficiency (%)"] * 2 and fig._suptitle.get_text() == study.label
    fig = scaling_figures.allreduce_figure([(study.allreduce, "smoke")])
    ax = fig.axes[0]
    assert (ax.get_xscale(), ax.get_yscale(), ax.get_xlabel(), ax.get_ylabel()) == (
        "log", "log", "buffer size (MiB)", "bus bandwidth (GB/s)")
    fig = scaling_figures.straggler_figure({m: study.straggler(m) for m in ("inference", "training")}, study.label)
    assert [ax.get_ylabel() for ax in fig.axes] == ["median time per iteration (ms)"] * 2


def test_the_gpu_script_plans_both_modes_of_every_network():
    spec = importlib.util.spec_from_file_location("inference_scaling_gpu", ROOT / "benchmarks" / "gpu" / "inference_scaling_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    full = module.settings(False, 0.0)
    assert full["networks"] == ["resnet18", "resnet50", "resnet152", "vit_b_16"] and full["counts"] == [1, 2, 4]
    plan = module.plan_of("vit_b_16", full, 10.0)
    assert [(e["mode"], e["per_process_batch"], e["straggler_ms"]) for e in plan] == [("inference", 128, 10.0),
                                                                                      ("training", 64, 10.0)]
    planned = scaling.configs_from_plan(plan, 2)  # the plan is valid for the launch it feeds
    assert [r.config.batch_size for r in planned] == [256, 128]


def test_failure_reason_names_the_ranks_error_not_torchruns_banner():
    output = "\n".join([
        "[rank0]: Traceback (most recent call last):",
        "[rank0]:   File \"x.py\", line 3, in <module>",
        "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "E1127 torch.distributed.elastic.multiprocessing.api: failed (exitcode: 1)",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "inference.scaling FAILED",
        "------------------------------------------------------------",
        "============================================================",
    ])
    assert scaling.failure_reason(output).startswith("[rank0]: torch.OutOfMemoryError: CUDA out of memory")
    assert scaling.failure_reason("ValueError: bad plan\n=====\n") == "ValueError: bad plan"
    assert scaling.failure_reason("just a line\n") == "just a line"
    assert scaling.failure_reason("=====\n") == "no output"
    # Where no line names an error, the rank's last line before torchrun's summary, never the summary's own.
    summary = ["============================================================", "Root Cause (first observed failure):",
               "[0]:", "  exitcode  : 1 (pid: 16675)", "  error_file: <N/A>",
               "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
               "============================================================"]
    assert scaling.failure_reason("\n".join(["[rank1]: fp16 outputs are not finite", *summary])) == \
        "[rank1]: fp16 outputs are not finite"
