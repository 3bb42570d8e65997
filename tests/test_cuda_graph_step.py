"""The CUDA-graph training step: refused where it cannot work, and on a GPU the same training as
the eager step (same losses, same weights) while the batch changes from step to step."""

import pytest
import torch
from conftest import GPU

from tinyllama.config import get_preset
from tinyllama.harness import bench
from tinyllama.models import build, transfer_weights


def _tiny(version="v1", **options):
    torch.manual_seed(0)
    return build(version, get_preset("ci").model, **options)


@pytest.mark.skipif(GPU, reason="checks the message on a machine without a GPU")
def test_refused_without_a_gpu():
    with pytest.raises(ValueError, match="needs a GPU"):
        bench.GraphedTrainingStep(_tiny(), "fp32", "cpu")


def test_refused_for_fp16_and_self_graphing_compile_modes_and_short_warmups(device):
    if GPU:
        with pytest.raises(ValueError, match="fp16"):
            bench.GraphedTrainingStep(_tiny().to(device), "fp16", device)
        with pytest.raises(ValueError, match="reduce-overhead"):
            bench.GraphedTrainingStep(_tiny("v4", compile_mode="reduce-overhead").to(device), "bf16", device)
    else:  # the check itself, without a GPU: V4 as shipped can be captured, with its own graphs not
        assert _tiny("v4", compile_mode="reduce-overhead").own_cuda_graphs
        assert _tiny("v2", compile=True, compile_mode="max-autotune").own_cuda_graphs
        assert not _tiny("v4").own_cuda_graphs and not _tiny("v3").own_cuda_graphs
    with pytest.raises(ValueError, match="warmup_steps >= 3"):
        bench.run_benchmark("v1", "ci", warmup_steps=1, num_steps=1, cuda_graph=True, device=device, progress=False)


@pytest.mark.gpu
@pytest.mark.parametrize("version,precision", [("v1", "fp32"), ("v3", "bf16"), ("v4", "bf16")])
def test_graphed_steps_train_like_eager_steps(version, precision):
    config = get_preset("ci").model
    eager_model = _tiny(version).cuda()
    graph_model = transfer_weights(eager_model, _tiny(version).cuda())
    batches = bench.make_batches(config, 2, 32, count=3, seed=1, device="cuda")
    eager = bench.TrainingStep(eager_model, precision, "cuda", fused_optimizer=True)
    graphed = bench.GraphedTrainingStep(graph_model, precision, "cuda", fused_optimizer=True)
    losses = []
    for i in range(7):  # 3 eager steps, then capture, then replays on changing batches
        batch = batches[i % len(batches)]
        losses.append((eager(*batch).item(), graphed(*batch).item()))
    assert graphed._graphs is not None
    for step, (a, b) in enumerate(losses):
        assert abs(a - b) <= 1e-4 * abs(a), f"step {step}: eager loss {a}, graphed {b}"
    assert len({round(a, 6) for a, _ in losses[3:]}) > 1  # the batches really differed
    for (name, p), q in zip(eager_model.named_parameters(), graph_model.parameters()):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-6), name


@pytest.mark.gpu
def test_run_benchmark_records_graph_mode():
    result = bench.run_benchmark("v3", "ci", precision="bf16", num_steps=3, warmup_steps=3, cuda_graph=True,
                                 progress=False)
    assert result.cuda_graph and result.to_dict()["cuda_graph"] is True
    assert result.forward_ms.median > 0 and result.backward_ms.median > 0 and result.optimizer_ms.median > 0


def test_v4_replays_its_step_by_default_where_a_replay_is_possible():
    """V4 as shipped replays its whole training step on a GPU (``graphed_step``); an explicit switch wins,
    and wherever a replay is impossible or wrong the default falls back to eager launches."""
    from tinyllama.config import get_preset
    from tinyllama.models import build
    from tinyllama.training import replays_step

    config = get_preset("ci").model
    v4, v2 = build("v4", config, compile=False), build("v2", config)
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert replays_step(v4, gpu, "bf16") and not replays_step(v2, gpu, "bf16")
    assert not replays_step(v4, cpu, "bf16")  # no graphs on the CPU
    assert not replays_step(v4, gpu, "fp16")  # the gradient scaler decides on the host
    assert not replays_step(v4, gpu, "bf16", accumulation_steps=2)
    assert not replays_step(v4, gpu, "bf16", gradient_checkpointing=True)
    assert not replays_step(v4, gpu, "bf16", warmup_steps=1)  # captured after three eager steps
    assert not replays_step(v4, gpu, "bf16", cuda_graph=False) and replays_step(v2, cpu, "bf16", cuda_graph=True)
    own = build("v4", config, compile=True, compile_mode="reduce-overhead")
    assert not replays_step(own, gpu, "bf16")  # compile's own graphs cannot be captured again


def test_run_benchmark_on_the_cpu_runs_v4_eagerly_by_default():
    from tinyllama.harness.bench import run_benchmark

    result = run_benchmark("v4", "ci", precision="fp32", num_steps=1, warmup_steps=0, device="cpu",
                           model_options={"compile": False}, progress=False)
    assert result.cuda_graph is False
