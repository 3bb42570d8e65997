"""The inference benchmark's command line: the original's flags, clear errors for bad ones, results
files that only grow, and a 2-process torchrun on the CPU with gloo."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import GPU

from inference.cli import build_parser, config_from_args, main

REPO = Path(__file__).resolve().parents[1]


def run_module(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("flags,message", [
    (["--network", "resnet18", "--batch-size", "0"], "--batch-size must be at least 1"),
    (["--network", "resnet18", "--iterations", "0"], "--iterations must be at least 1"),
    (["--network", "resnet18", "--iterations", "10", "--flops-prof-step", "10"],
     "--flops-prof-step 10 must be smaller than --iterations 10"),
    (["--network", "resnet18", "--kineto", "--iterations", "3"], "--kineto needs --iterations 5"),
    (["--network", "resnet18", "--fp16", "1", "--precision", "bf16"], "conflicting precisions"),
    (["--network", "resnet18", "--compileContext", "{'mode': 'fastest'}"], "compile mode must be one of"),
    (["--network", "resnet18", "--distributed_dataparallel"], "needs --rank, --world-size, --dist-url"),
    (["--batch-size", "8"], "--network is required"),
])
def test_bad_flags_exit_non_zero_with_a_message(flags, message, capsys):
    with pytest.raises(SystemExit) as exited:
        code = main([*flags, "--device", "cpu"])
        raise SystemExit(code)
    assert exited.value.code != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_unknown_network_exits_non_zero_with_the_closest_names(capsys):
    assert main(["--network", "resnet5", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "unknown network 'resnet5'" in err and "resnet50" in err


@pytest.mark.skipif(GPU, reason="checks the message on a machine without a GPU")
def test_asking_for_a_gpu_without_one_is_one_line(capsys):
    assert main(["--network", "resnet18", "--device", "cuda"]) == 1
    err = capsys.readouterr().err
    assert "PyTorch sees no GPU" in err and "Traceback" not in err


def test_the_originals_flags_map_onto_the_config():
    parser = build_parser()
    config = config_from_args(parser.parse_args([
        "--network", "resnet50", "--batch-size", "32", "--iterations", "20", "--fp16", "1", "--nhwc",
        "--compileContext", "{'mode': 'max-autotune', 'fullgraph': 'True'}", "--autograd_profiler"]))
    assert (config.network, config.batch_size, config.iterations, config.precision) == ("resnet50", 32, 20, "fp16")
    assert config.channels_last and config.compile and config.autograd_profiler
    assert config.compile_options == {"mode": "max-autotune", "fullgraph": True}
    assert config.mode == "inference"  # inference is the default
    assert config_from_args(parser.parse_args(["--network", "resnet50", "--amp"])).precision == "amp"
    assert config.batchnorm_fp32
    assert not config_from_args(parser.parse_args(["--network", "resnet50", "--fp16", "1", "--bn-16bit"])).batchnorm_fp32


def test_list_prints_every_task_with_input_sizes(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "classification (" in out and "segmentation (" in out and "detection (" in out
    assert any(line.split() == ["inception_v3", "299"] for line in out.splitlines())


def test_missing_deepspeed_is_one_line_at_the_command_line(monkeypatch, capsys):
    for name in ("deepspeed", "deepspeed.profiling", "deepspeed.profiling.flops_profiler"):
        monkeypatch.setitem(sys.modules, name, None)
    assert main(["--network", "resnet18", "--iterations", "3", "--flops-prof-step", "1", "--device", "cpu"]) == 1
    assert capsys.readouterr().err.strip() == "error: install deepspeed: pip install deepspeed"


def test_command_line_appends_csv_and_json_in_the_output_dir(tmp_path, monkeypatch, capsys):
    flags = ["--network", "mobilenet_v3_small", "--batch-size", "2", "--iterations", "2",
             "--warmup", "1", "--precision", "bf16", "--mode", "training", "--device", "cpu", "--quiet",
             "--output-dir", str(tmp_path / "results"), "--csv-file", "runs.csv", "--json", "runs.json"]
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert main(flags) == 0
    printed = capsys.readouterr().out
    assert "samples/s" in printed and "training loss" in printed
    assert printed.startswith("mobilenet_v3_small: mode training (forward, loss, backward and an SGD step), bf16, "
                              "the original micro_benchmarking_pytorch.py's default mode\n")
    rows = list(csv.DictReader((tmp_path / "results" / "runs.csv").open()))
    records = json.loads((tmp_path / "results" / "runs.json").read_text())
    assert len(rows) == len(records) == 2
    assert {r["precision"] for r in rows} == {"bf16"} and {r["mode"] for r in records} == {"training"}
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["runs.csv", "runs.json"]


def test_the_header_and_the_record_say_which_mode_ran(tmp_path, capsys):
    """The default is inference, the original micro-benchmark's is training: the same command line
    measures different work, so the first line says which mode ran and how to get the original's."""
    assert main(["--network", "mobilenet_v3_small", "--batch-size", "1", "--iterations", "1", "--warmup", "1",
                 "--input-size", "64", "--device", "cpu", "--quiet", "--json", str(tmp_path / "runs.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "mobilenet_v3_small: mode inference (eval mode, torch.inference_mode, forward only), fp32"
    assert lines[1] == ("note: the original micro_benchmarking_pytorch.py runs training by default; "
                        "add --mode training to reproduce its figures")
    assert [r["mode"] for r in json.loads((tmp_path / "runs.json").read_text())] == ["inference"]


def test_torchrun_with_gloo_splits_the_batch_and_reports_every_rank(tmp_path):
    done = run_module(
        "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "inference", "--network", "resnet18", "--batch-size", "4", "--iterations", "3", "--warmup", "1",
        "--dist-backend", "gloo", "--device", "cpu", "--quiet", "--json", str(tmp_path / "runs.json"),
        "--baseline-throughput", "10",
        cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "[rank 0/2]" in out and "[rank 1/2]" in out
    assert out.count("batch 2 of global 4") == 2
    assert "global: 2 processes, global batch 4:" in out and "scaling efficiency" in out
    records = json.loads((tmp_path / "runs.json").read_text())
    assert sorted(r["rank"] for r in records) == [0, 1]
    assert all(r["local_batch_size"] == 2 and r["world_size"] == 2 for r in records)
    medians = [r["median_ms"] for r in records]
    # each process's own rate is its share of the batch (2 samples) over its own median time
    assert all(r["throughput"] == pytest.approx(2 / (r["median_ms"] / 1e3)) for r in records)
    assert records[0]["global_throughput"] == pytest.approx(4 / (max(medians) / 1e3))
    assert records[0]["scaling_efficiency"] == pytest.approx(records[0]["global_throughput"] / (2 * 10))


# --------------------------------------------------------------------------------------------------
# The inference levers: --freeze, --cuda-graphs, --max-autotune
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flags,message", [
    (["--freeze", "--mode", "training"], "use it with --mode inference only"),
    (["--freeze", "--compileContext", "{'mode': 'reduce-overhead'}"], "drop the mode from --compileContext"),
    (["--max-autotune", "--compileContext", "{'mode': 'max-autotune'}"], "drop the mode from --compileContext"),
])
def test_lever_misuse_exits_with_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as exited:
        raise SystemExit(main(["--network", "resnet18", "--device", "cpu", *flags]))
    assert exited.value.code != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.skipif(GPU, reason="checks the refusal on a machine without a GPU")
def test_cuda_graphs_on_a_cpu_is_refused_before_anything_is_built(capsys):
    assert main(["--network", "resnet18", "--device", "cpu", "--cuda-graphs"]) != 0
    err = capsys.readouterr().err
    assert "--cuda-graphs records the step as a GPU graph: it needs a GPU" in err and "Traceback" not in err


def test_levers_imply_compile_and_build_their_inductor_options():
    parser = build_parser()
    config = config_from_args(parser.parse_args(["--network", "resnet50", "--freeze", "--cuda-graphs"]))
    assert config.compile and config.levers == ["freeze", "cuda_graphs"]
    assert config.inductor_options() == {"freezing": True, "triton.cudagraphs": True}
    tuned = config_from_args(parser.parse_args(["--network", "resnet50", "--max-autotune"]))
    # convolutions stay cuDNN/MIOpen calls: only the matrix products and generated kernels are tuned
    assert tuned.inductor_options() == {"max_autotune": True, "max_autotune_conv_backends": "ATEN"}
    merged = config_from_args(parser.parse_args(["--network", "resnet50", "--freeze",
                                                 "--compileContext", "{'options': {'shape_padding': True}}"]))
    assert merged.inductor_options() == {"shape_padding": True, "freezing": True}
    plain = config_from_args(parser.parse_args(["--network", "resnet50"]))
    assert not plain.compile and plain.levers == [] and plain.inductor_options() == {}


def test_levers_need_compile_when_built_directly():
    from inference.config import BenchmarkConfig, ConfigError

    with pytest.raises(ConfigError, match="set compile=True"):
        BenchmarkConfig(network="resnet18", freeze=True).validate()
    BenchmarkConfig(network="resnet18", compile=True, freeze=True).validate()


def test_the_compile_keyword_arguments_carry_the_levers():
    from inference.benchmark import _compile_kwargs
    from inference.config import BenchmarkConfig

    kwargs = _compile_kwargs(BenchmarkConfig(network="resnet18", compile=True, freeze=True, max_autotune=True))
    assert kwargs == {"dynamic": False, "options": {"freezing": True, "max_autotune": True,
                                                    "max_autotune_conv_backends": "ATEN"}}
    assert "options" not in _compile_kwargs(BenchmarkConfig(network="resnet18", compile=True))


@pytest.mark.slow
def test_a_frozen_cpu_run_passes_the_check_and_says_so(tmp_path, capsys):
    # about 25-40 s on 2 cores: one Inductor compile of ResNet-18 at 64 px, checked against fp32 eager
    code = main(["--network", "resnet18", "--batch-size", "2", "--input-size", "64", "--iterations", "3",
                 "--warmup", "1", "--device", "cpu", "--freeze", "--quiet", "--json", str(tmp_path / "r.json")])
    assert code == 0, capsys.readouterr().err
    (record,) = json.loads((tmp_path / "r.json").read_text())
    assert record["compiled"] and record["levers"] == "freeze" and record["check"] == "passed"
    assert record["accuracy_passed"] is True
