"""The inference benchmark on the CPU: networks, modes, precisions, the correctness check, timing
records, sweeps with out-of-memory, compile, and the results files.

Small networks (resnet18, mobilenet_v3_small, squeezenet1_0) at batch 2 and their own input size,
unless a test says it shrinks the input to stay fast.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torchvision
from torch.utils.flop_counter import FlopCounterMode

import inference
from inference import networks, precision, results, sweep
from inference.benchmark import CheckFailedError, OutOfMemoryError
from inference.config import BenchmarkConfig, ConfigError, parse_compile_context


def quick(network: str = "resnet18", **settings) -> BenchmarkConfig:
    base = dict(network=network, batch_size=2, iterations=2, warmup=1, device="cpu", progress=False)
    base.update(settings)
    return BenchmarkConfig(**base)


# ------------------------------------------------------------------------------------ networks


def test_every_task_is_offered_with_the_input_size_each_network_is_made_for():
    specs = {s.name: s for s in networks.list_networks()}
    assert {s.task for s in specs.values()} == set(networks.TASKS)
    assert len(specs) > 90
    assert specs["resnet50"].input_size == 224
    assert specs["inception_v3"].input_size == 299
    assert specs["efficientnet_b7"].input_size == 600
    assert specs["vit_h_14"].input_size == 224  # built without weights ViT-H/14 is a 224 model
    assert specs["deeplabv3_resnet50"].input_size == 520
    assert specs["fasterrcnn_resnet50_fpn"].input_size == 800
    assert specs["ssdlite320_mobilenet_v3_large"].input_size == 320


def test_fixed_size_models_are_listed_with_the_size_they_are_built_for():
    spec = networks.get_spec("vit_b_32")
    model = networks.build(spec)
    assert model.image_size == spec.input_size
    # The zero-initialised ViT head gets weights, or every output would be 0 whatever the input.
    assert model.heads.head.weight.abs().sum() > 0


def test_unknown_network_names_the_closest_ones():
    with pytest.raises(networks.UnknownNetworkError) as caught:
        networks.get_spec("resnet5")
    assert "resnet50" in caught.value.suggestions
    assert "resnet50" in str(caught.value)


def test_the_original_benchmarks_names_still_work():
    assert networks.get_spec("resnext50").name == "resnext50_32x4d"
    assert networks.get_spec("SqueezeNet").name == "squeezenet1_0"


def test_building_never_downloads(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("tried to download weights")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_network)
    for name in ("lraspp_mobilenet_v3_large", "fasterrcnn_mobilenet_v3_large_320_fpn", "mobilenet_v3_small"):
        assert sum(p.numel() for p in networks.build(networks.get_spec(name)).parameters()) > 0


# ------------------------------------------------------------------------------------ runs


@pytest.mark.parametrize("network,mode,prec", [
    ("resnet18", "inference", "fp32"),
    ("resnet18", "inference", "bf16"),
    ("resnet18", "training", "fp32"),
    ("resnet18", "training", "bf16"),
    ("mobilenet_v3_small", "inference", "bf16"),
    ("mobilenet_v3_small", "training", "fp32"),
    ("squeezenet1_0", "inference", "fp32"),
    ("squeezenet1_0", "training", "bf16"),
])
def test_small_networks_run_in_both_modes(network, mode, prec):
    result = inference.run_benchmark(quick(network, mode=mode, precision=prec, iterations=3))
    assert (result.network, result.mode, result.precision, result.input_size) == (network, mode, prec, 224)
    assert result.local_batch_size == 2 and result.timing.n == 3 and len(result.warmup_ms) == 1
    assert result.throughput == pytest.approx(2 / (result.timing.median / 1e3))
    assert result.us_per_sample == pytest.approx(1e3 * result.timing.median / 2)
    assert result.check == "passed" and result.accuracy.passed
    if prec == "fp32":
        assert result.accuracy.max_abs_diff == 0  # the very same eager fp32 computation
    else:
        assert result.accuracy.max_abs_diff > 0  # bf16 really ran: its rounding shows
    if mode == "training":
        assert abs(result.first_loss - math.log(1000)) < 2  # random weights: about ln(1000)
        assert math.isfinite(result.final_loss) and result.final_loss != result.first_loss  # the weights moved
    else:
        assert result.final_loss is None and result.first_loss is None


class ParameterWatch:
    """Counts gradients reaching each parameter and records the state forward passes ran in."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.grads = {name: 0 for name, _ in model.named_parameters()}
        self.forwards: list[tuple[bool, bool, bool]] = []
        for name, param in model.named_parameters():
            param.register_hook(lambda grad, name=name: self.grads.__setitem__(name, self.grads[name] + 1))
        model.register_forward_hook(self._on_forward)

    def _on_forward(self, module, args, output):
        self.forwards.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled(), module.training))


@pytest.fixture
def watched(monkeypatch):
    watches: list[ParameterWatch] = []
    build = networks.build

    def build_and_watch(spec, seed=0):
        model = build(spec, seed)
        watches.append(ParameterWatch(model))
        return model

    monkeypatch.setattr(networks, "build", build_and_watch)
    return watches


def test_inference_mode_runs_no_backward(watched):
    inference.run_benchmark(quick("resnet18", mode="inference", iterations=3))
    watch = watched[0]
    assert len(watch.forwards) == 1 + 1 + 3  # reference, warm-up, timed
    assert all(inference_mode and not grad and not training for inference_mode, grad, training in watch.forwards)
    assert sum(watch.grads.values()) == 0
    assert all(p.grad is None for p in watch.model.parameters())


def test_training_mode_trains_every_parameter(watched):
    # The same watch sees backward in training mode: the test above would catch a backward pass.
    inference.run_benchmark(quick("resnet18", mode="training", iterations=3))
    watch = watched[0]
    assert all(count == 1 + 3 for count in watch.grads.values()), "a parameter got no gradient in some step"
    assert [training for _, _, training in watch.forwards][-4:] == [True] * 4


def test_channels_last_matches_fp32_and_lays_inputs_out_nhwc():
    result = inference.run_benchmark(quick("resnet18", channels_last=True))
    assert result.channels_last and result.accuracy.passed
    assert result.accuracy.max_rel_diff < 1e-4


def test_fp16_underflow_is_caught_before_timing():
    # Random-weight MobileNetV3 produces outputs of about 1e-9, below fp16's range: fp16 flushes them
    # to zero. The check must stop the run rather than time a wrong result.
    with pytest.raises(CheckFailedError, match="smallest normal"):
        inference.run_benchmark(quick("mobilenet_v3_small", precision="fp16", input_size=64))


def test_a_precision_without_kernels_is_a_clear_error(monkeypatch):
    # Some PyTorch builds have no fp16 convolution on the CPU; the participant gets one line, not a traceback.
    def no_half_kernel(*args, **kwargs):
        raise RuntimeError("\"slow_conv2d_cpu\" not implemented for 'Half'")

    monkeypatch.setattr(networks, "forward", no_half_kernel)
    with pytest.raises(inference.BenchmarkError, match="fp16 is not supported on cpu.*try --precision bf16"):
        inference.run_benchmark(quick("squeezenet1_0", precision="fp16", input_size=64))


def test_16_bit_runs_keep_batch_norms_in_fp32_unless_asked():
    model = torchvision.models.resnet18(num_classes=10)
    half = precision.plan("bf16", torch.device("cpu"))
    precision.apply(model, half)
    assert model.conv1.weight.dtype == torch.bfloat16 and model.fc.weight.dtype == torch.bfloat16
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and all(m.weight.dtype == m.running_var.dtype == torch.float32 for m in norms)
    precision.apply(model, half, batchnorm_fp32=False)
    assert all(m.weight.dtype == m.running_var.dtype == torch.bfloat16 for m in norms)
    # Both variants are checked against fp32 before timing and say which one ran.
    for keep in (True, False):
        result = inference.run_benchmark(quick("resnet18", precision="bf16", mode="training", batchnorm_fp32=keep))
        assert result.accuracy.passed and result.batchnorm_fp32 is keep
        assert result.as_record()["batchnorm_fp32"] is keep
    assert inference.run_benchmark(quick("resnet18")).batchnorm_fp32 is None  # fp32: nothing to keep


def test_amp_on_cpu_uses_bf16_autocast():
    plan = precision.plan("amp", torch.device("cpu"))
    assert plan.weight_dtype == torch.float32 and plan.autocast_dtype == torch.bfloat16
    result = inference.run_benchmark(quick("squeezenet1_0", precision="amp"))
    assert result.accuracy.passed and result.accuracy.max_abs_diff > 0


def test_compile_reports_compilation_apart_and_is_checked():
    result = inference.run_benchmark(quick("squeezenet1_0", compile=True, warmup=2,
                                           compile_options={"backend": "aot_eager"}))
    # the first call traces and compiles: it takes longer than a steady one, and the excess is the compile time
    assert result.compiled and result.first_iteration_ms > result.timing.median
    assert result.compile_s > 0
    assert result.compile_s == pytest.approx((result.first_iteration_ms - result.timing.median) / 1e3)
    assert result.accuracy.passed


def wrong_backend(graph_module, example_inputs):
    """A torch.compile back end that scales every output: fast to compile, and wrong."""
    def run(*args):
        return [o * 1.5 if isinstance(o, torch.Tensor) else o for o in graph_module(*args)]
    return run


def test_a_compiler_that_gets_the_answer_wrong_is_not_timed():
    with pytest.raises(CheckFailedError, match="FAILED"):
        inference.run_benchmark(quick("squeezenet1_0", compile=True, compile_options={"backend": wrong_backend}))


def test_a_compiled_training_step_with_a_wrong_loss_is_not_timed():
    # Input shrunk to 64 pixels to keep the CPU test fast.
    config = quick("resnet18", mode="training", compile=True, input_size=64)
    right = inference.run_benchmark(config.replace(compile_options={"backend": "aot_eager"}))
    assert "first-step loss" in right.loss_check and "[ok" in right.loss_check
    with pytest.raises(CheckFailedError, match=r"first-step loss .*\[FAILED"):
        inference.run_benchmark(config.replace(compile_options={"backend": wrong_backend}))


def test_detection_and_segmentation_run_in_both_modes():
    # Input shrunk to 128 pixels here to keep the CPU test fast (the default is the model's own size).
    for network in ("ssdlite320_mobilenet_v3_large", "lraspp_mobilenet_v3_large"):
        for mode in ("inference", "training"):
            result = inference.run_benchmark(quick(network, mode=mode, input_size=128, batch_size=2))
            assert result.timing.n == 2
            if mode == "training":
                assert math.isfinite(result.final_loss)
    assert result.check == "passed"  # segmentation maps are compared; detector boxes are not


# ------------------------------------------------------------------------------------ compile settings


def test_compile_context_parses_the_originals_syntax():
    assert parse_compile_context("{'mode': 'max-autotune', 'fullgraph': 'True'}") == {
        "mode": "max-autotune", "fullgraph": True}
    assert parse_compile_context("{'options': {'freezing': 'True'}}") == {"options": {"freezing": True}}
    assert parse_compile_context("{'mode': 'reduce-overhead'}") == {"mode": "reduce-overhead"}


@pytest.mark.parametrize("text,message", [
    ("{'mode': 'fastest'}", "compile mode must be one of"),
    ("{'options': {'static-memory': 'True'}}", "unknown inductor option 'static-memory'"),
    ("{'mode': 'max-autotune', 'options': {'freezing': True}}", "not both"),
    ("mode=max-autotune", "Python dict literal"),
    ("{'speed': 1}", "unknown torch.compile setting"),
])
def test_bad_compile_context_is_a_clear_error(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_compile_context(text)


# ------------------------------------------------------------------------------------ sweeps


@pytest.fixture
def memory_of_four(monkeypatch):
    """Pretend the device holds at most 4 samples: larger batches raise the out-of-memory error that
    PyTorch raises, from inside the real run."""
    make_inputs = networks.make_inputs

    def limited(spec, batch_size, input_size, generator):
        if batch_size > 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return make_inputs(spec, batch_size, input_size, generator)

    monkeypatch.setattr(networks, "make_inputs", limited)


def test_sweep_catches_out_of_memory_and_goes_on(memory_of_four):
    # Input shrunk to 64 pixels to keep the CPU test fast.
    swept = sweep.sweep_batch_sizes(quick("squeezenet1_0", iterations=1, input_size=64), [2, 8, 4, 16])
    assert [(p.batch_size, p.status) for p in swept.points] == [
        (2, "ok"), (8, "out of memory"), (4, "ok"), (16, "skipped")]
    assert [r.local_batch_size for r in swept.results] == [2, 4]
    assert "out of memory" in swept.table()


def test_max_batch_search_finds_the_largest_batch_that_fits(memory_of_four):
    found = sweep.find_max_batch_size(quick("squeezenet1_0", iterations=1, input_size=64), start=1, limit=64)
    assert (found.max_batch_size, found.first_failing) == (4, 5)
    assert found.result is not None and found.result.local_batch_size == 4


def test_out_of_memory_is_a_one_line_error(memory_of_four):
    with pytest.raises(OutOfMemoryError, match="out of memory at batch size 8.*smaller --batch-size"):
        inference.run_benchmark(quick("squeezenet1_0", batch_size=8, input_size=64))


# ------------------------------------------------------------------------------------ profilers


def test_deepspeed_profile_step_returns_resnet18s_macs():
    result = inference.run_benchmark(quick("resnet18", iterations=3, flops_prof_step=1))
    profile = result.flops_profile
    assert profile.step == 1 and profile.batch_size == 2
    assert profile.macs_per_sample == pytest.approx(1.82e9, rel=0.01)  # ResNet-18 at 224 x 224
    assert profile.params == sum(p.numel() for p in networks.build(networks.get_spec("resnet18")).parameters())
    assert "Flops Profiler" in profile.text
    assert result.timing.n == 2  # the profiled iteration is left out of the timing
    # Cross-check with PyTorch's own counter (multiply-adds of convolutions and matmuls).
    model = networks.build(networks.get_spec("resnet18")).eval()
    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        model(torch.randn(1, 3, 224, 224))
    assert profile.macs_per_sample == pytest.approx(counter.get_total_flops() / 2, rel=0.01)


def test_kineto_writes_a_trace_and_never_overwrites_one(tmp_path):
    config = quick("squeezenet1_0", iterations=5, kineto=True, output_dir=str(tmp_path), input_size=64)
    first = inference.run_benchmark(config).trace_files
    second = inference.run_benchmark(config).trace_files
    assert len(first) == len(second) == 1 and first != second
    trace = json.loads(open(first[0]).read())
    names = {event.get("name") for event in trace["traceEvents"]}
    assert {"iteration 3", "iteration 4"} <= names  # the two recorded iterations (after wait 1, warm-up 2)
    assert "iteration 0" not in names


def test_autograd_profiler_returns_the_operator_table():
    result = inference.run_benchmark(quick("squeezenet1_0", autograd_profiler=True, input_size=64))
    assert "aten::" in result.operator_table and result.profiler == "autograd"
    assert "forward" in result.operator_table  # the NVTX/ROCTX phase ranges are recorded as well


def test_missing_deepspeed_is_one_clear_line(monkeypatch):
    for name in ("deepspeed", "deepspeed.profiling", "deepspeed.profiling.flops_profiler"):
        monkeypatch.setitem(__import__("sys").modules, name, None)
    with pytest.raises(inference.MissingDependencyError, match=r"^install deepspeed: pip install deepspeed$"):
        inference.run_benchmark(quick("resnet18", iterations=3, flops_prof_step=1))


# ------------------------------------------------------------------------------------ results files


def test_csv_appends_rows_with_one_header(tmp_path):
    path = tmp_path / "runs.csv"
    # The notebook entry point: a function returning the result record.
    record = inference.run("squeezenet1_0", batch_size=2, iterations=2, warmup=1, device="cpu", input_size=64,
                           progress=False).as_record()
    results.append_csv(path, [record])
    results.append_csv(path, [record, record])
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and lines[0].startswith("timestamp,network")
    assert sum(line.startswith("timestamp,") for line in lines) == 1
    frame = results.results_frame(results.load_json(results.append_json(tmp_path / "runs.json", [record])))
    assert frame.loc[0, "throughput"] == pytest.approx(record["throughput"])


def test_a_csv_with_other_columns_is_left_alone(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("a,b\n1,2\n")
    written = results.append_csv(path, [{"x": 1}])
    assert written != path and path.read_text() == "a,b\n1,2\n"
    assert written.read_text().splitlines() == ["x", "1"]


def test_json_appends_to_the_list_and_refuses_other_files(tmp_path):
    path = tmp_path / "runs.json"
    results.append_json(path, [{"run": 1}])
    results.append_json(path, [{"run": 2}, {"run": 3}])
    assert [r["run"] for r in results.load_json(path)] == [1, 2, 3]
    other = tmp_path / "notes.json"
    other.write_text('{"mine": true}')
    with pytest.raises(results.ResultsFileError, match="not a list"):
        results.append_json(other, [{"run": 4}])
    assert other.read_text() == '{"mine": true}'


def test_compare_precisions_measures_each_precision_against_fp32():
    """bf16 keeps 8 bits of mantissa: its output is measurably off fp32's, and within the tolerance;
    fp32 against itself (no TF32 on a CPU) is off by nothing but summation order."""
    from inference.precision import compare_precisions

    bf16, fp32 = compare_precisions("resnet18", ("bf16", "fp32"), batch_size=2, device="cpu", input_size=64,
                                    reference_tf32=False)
    assert (bf16.precision, fp32.precision) == ("bf16", "fp32") and bf16.samples == 2
    assert 1e-3 < bf16.max_rel_diff <= bf16.tolerance and bf16.mean_abs_diff > 0 and bf16.passed
    assert fp32.max_rel_diff < 1e-5 and fp32.passed


def test_importing_inference_loads_no_profiler():
    """``import inference`` stays light: the profiling package loads only when a profiler runs."""
    import subprocess
    import sys

    code = "import sys, inference; print(sorted(m for m in sys.modules if m.startswith('tinyllama.profiling')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
