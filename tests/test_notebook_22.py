"""Notebook 22 (text generation): the exercises and their order; each reference answer passes its check, and
typical mistakes fail it with a message that names the mistake (under WORKSHOP_STRICT=1); the helpers the
notebook shows (operator count, verdicts, the predicted and measured turn) on cases with known answers."""

from types import SimpleNamespace

import pytest
import torch

from notebook_exercises import SolutionExercises
from tinyllama import course
from tinyllama.config import get_preset
from tinyllama.course import drift
from tinyllama.course import generation_checks as gen_checks
from tinyllama.course.checkpoints import CheckpointFailed
from tinyllama.generation import CachedDecoder, decode_bytes, decode_flops
from tinyllama.models import build
from tinyllama.timing import summarize

pytestmark = pytest.mark.usefixtures("strict")

CONFIG = get_preset("ci").model


@pytest.fixture(scope="module")
def notebook():
    return SolutionExercises("22_generation")


def _namespace(**extra):
    namespace = {"torch": torch, "course": course, "gen_checks": gen_checks, "config": CONFIG, "S": 4,
                 "PROMPT": 24, "NEW": 12, "on_gpu": False}
    namespace.update(extra)
    return namespace


def _with_cache_bytes(notebook):
    return notebook.run("22.1", _namespace(), check=False)


def _sweep(batches, ms):
    return [SimpleNamespace(batch_size=b, decode_ms=summarize([t * 0.98, t, t * 1.02])) for b, t in zip(batches, ms)]


def _turn_namespace(**extra):
    batches, ms = [1, 4, 16, 64, 256], [1.0, 1.0, 1.1, 2.5, 9.6]
    return _namespace(sweep=_sweep(batches, ms), predicted=30.0, predicted_turn_batch=100, **extra)


def test_the_exercises_and_their_order(notebook):
    assert notebook.ids() == ["22.1", "22.2", "22.3", "22.4"]


def test_the_reference_answers_pass(notebook):
    namespace = notebook.run("22.1", _namespace())
    assert namespace["kv_ok"]
    namespace = notebook.run("22.2", namespace)
    assert namespace["bytes_ok"]
    assert namespace["decode_step_bytes"](CONFIG, 3, 20, 40, 2) == decode_bytes(CONFIG, 3, 20, torch.bfloat16)
    assert notebook.run("22.3", _namespace())["writer_ok"]
    namespace = notebook.run("22.4", _turn_namespace())
    assert namespace["turn_ok"] and namespace["measured_turn"] == pytest.approx(256 * 1.0 / 9.6)


@pytest.mark.parametrize("mistake, named", [
    (("return 2 * config.num_layers", "return config.num_layers"), "K or V only"),
    (("config.num_kv_heads * seq_len", "config.num_heads * seq_len"), "num_heads instead of num_kv_heads"),
    (("2 * config.num_layers * batch", "2 * batch"), "one layer only"),
    (("* config.head_dim * bytes_per_value", "* config.head_dim"), "elements instead of bytes"),
])
def test_kv_cache_mistakes_fail_and_are_named(notebook, mistake, named):
    with pytest.raises(CheckpointFailed, match=named):
        notebook.run("22.1", _namespace(), mistake)


@pytest.mark.parametrize("mistake, named", [
    (("kv_cache_bytes(config, batch, context_len, bytes_per_value)", "kv_cache_bytes(config, batch, capacity, bytes_per_value)"),
     "full capacity"),
    (("return weight_values * bytes_per_value + cache_read + cache_write", "return weight_values * bytes_per_value"),
     "no KV cache"),
    (("return weight_values * bytes_per_value", "return weight_values * 4"), "the weights at 4 bytes"),
    (("+ cache_read + cache_write", "+ cache_read"), "not written"),
    (("- config.vocab_size * config.hidden_dim + batch * config.hidden_dim", ""), "the whole embedding table"),
    (("weight_values * bytes_per_value +", "batch * weight_values * bytes_per_value +"), "once per sequence"),
])
def test_decode_bytes_mistakes_fail_and_are_named(notebook, mistake, named):
    with pytest.raises(CheckpointFailed, match=named):
        notebook.run("22.2", _with_cache_bytes(notebook), mistake)


_BODY = "    cache_k[:, :, positions] = k\n    cache_v[:, :, positions] = v\n"


@pytest.mark.parametrize("body, named", [
    ("    cache_k[:, :, positions - 1] = k\n    cache_v[:, :, positions - 1] = v\n", r"p - 1 \(one slot early\)"),
    ("    cache_k[:, :, positions + 1] = k\n    cache_v[:, :, positions + 1] = v\n", r"p \+ 1 \(one slot late\)|IndexError"),
    ("    cache_k[:, :, :positions[-1] + 1] = k\n    cache_v[:, :, :positions[-1] + 1] = v\n",
     "more than the positions given"),
    ("    return torch.index_copy(cache_k, 2, positions, k), torch.index_copy(cache_v, 2, positions, v)\n",
     "returned a new tensor"),
    ("    cache_k[:, :, positions] = k\n", "K written, V not"),
    ("    cache_k[:, :, positions] = v\n    cache_v[:, :, positions] = k\n", "K and V swapped"),
])
def test_cache_writer_mistakes_fail_and_are_named(notebook, body, named):
    with pytest.raises(CheckpointFailed, match=named):
        notebook.run("22.3", _namespace(), (_BODY, body))


def test_a_writer_the_probe_passes_is_still_run_inside_generation(lenient, capsys):
    """A writer that writes the right slots only while the cache is short (a prefill) passes the probe's small
    cache but not generation: the second stage of the check is not decoration."""
    def only_the_prefill(cache_k, cache_v, positions, k, v):
        if len(positions) > 1 or positions[0] < 9:
            cache_k[:, :, positions] = k
            cache_v[:, :, positions] = v

    assert not gen_checks.check_cache_writer(only_the_prefill)
    assert "generation with it differs" in capsys.readouterr().out


@pytest.mark.parametrize("mistake, named", [
    (("    return batches[largest] * step_ms[smallest] / step_ms[largest]\n", "    return batches[largest]\n"),
     "the largest batch"),
    (("    return batches[largest] * step_ms[smallest] / step_ms[largest]\n", "    return batches[smallest]\n"),
     "the smallest batch"),
    (("    return batches[largest] * step_ms[smallest] / step_ms[largest]\n",
      "    return min((b for b, t in zip(batches, step_ms) if t > 1.2 * step_ms[smallest]), default=batches[largest])\n"),
     "a batch of the sweep"),
    (("    smallest = min(range(len(batches)), key=lambda i: batches[i])\n", "    smallest = 0\n"),
     "listed from the largest batch"),
])
def test_turn_mistakes_fail_and_are_named(notebook, mistake, named):
    with pytest.raises(CheckpointFailed, match=named):
        notebook.run("22.4", _turn_namespace(), mistake)


# ---- the helpers the notebook shows ---------------------------------------------------------------

def test_count_ops_counts_kernels_not_views():
    x = torch.randn(4, 6)
    counted = gen_checks.count_ops(lambda: (x.view(6, 4).t() @ x.t()).relu().reshape(-1).sum())
    assert counted["mm"] == 1 and counted["relu"] == 1 and counted["sum"] == 1
    assert "view" not in counted and "t" not in counted and "_unsafe_view" not in counted


def test_an_eager_decode_step_dispatches_a_few_dozen_operators_per_layer():
    torch.manual_seed(0)
    model = build("v1", CONFIG).eval()
    prompt = torch.randint(0, CONFIG.vocab_size, (1, 5))
    decoder = CachedDecoder(model, 1, 8)
    with torch.no_grad():
        decoder.prefill(prompt)
    ops = sum(gen_checks.count_ops(lambda: decoder.decode(prompt[:, -1], 5)).values())
    assert 15 * CONFIG.num_layers < ops < 80 * CONFIG.num_layers


def test_verdict_reads_the_spreads():
    slow, fast = summarize([10.0, 10.5, 11.0]), summarize([5.0, 5.2, 5.4])
    assert gen_checks.verdict(slow, fast) == (pytest.approx(10.5 / 5.2), "faster")
    assert gen_checks.verdict(fast, slow)[1] == "slower"
    assert gen_checks.verdict(slow, summarize([9.0, 10.4, 12.0]))[1] == "within noise"


def test_the_predicted_turn_is_where_flops_per_byte_reach_the_ridge():
    medium = get_preset("medium").model
    turn = gen_checks.predicted_turn(medium, 24, "bf16", 4.0, 800.0)
    assert turn is not None
    intensity = lambda b: decode_flops(medium, b, 24) / decode_bytes(medium, b, 24, "bf16")  # noqa: E731
    assert intensity(int(turn)) < 200.0 <= intensity(int(turn) + 1)
    assert gen_checks.predicted_turn(medium, 4096, "bf16", 4.0, 800.0) is None  # the cache keeps it memory-bound
    assert gen_checks.predicted_turn(medium, 24, "bf16", 4.0, 1.0) == 1.0  # a ridge below decode's own intensity


def test_the_knee_of_made_up_sweeps():
    for _, batches, ms in gen_checks.TURN_CASES:
        assert gen_checks.knee_batch(batches, ms) in (40.0, 100.0, 12.0)


def _rung(mode, samples):
    return SimpleNamespace(mode=mode, decode_ms=summarize(samples))


def test_two_host_launched_rungs_are_not_ranked():
    # Two eager rungs 1.5x apart with p10-p90 bands far apart: the host paces both (their ratio moved from
    # 0.96x to 1.38x between runs on one machine), so the ladder gives the ratio and no verdict.
    slow = [15.0 + 0.01 * i for i in range(10)]
    fast = [10.0 + 0.01 * i for i in range(10)]
    assert gen_checks.host_launched(_rung("no cache", slow), _rung("cache eager", fast))
    ratio, said = gen_checks.ladder_verdict(_rung("no cache", slow), _rung("cache eager", fast))
    assert ratio == pytest.approx(15.045 / 10.045) and said == gen_checks.HOST_PACED
    assert gen_checks.ladder_verdict(_rung("no cache", fast), _rung("cache eager", slow))[1] == gen_checks.HOST_PACED
    # HOST_PACED carries none of the verdict words the drift report compares between runs.
    assert drift._SAID.search(gen_checks.HOST_PACED) is None


def test_rungs_with_a_replay_are_judged_on_their_bands():
    slow = [10.0 + 0.01 * i for i in range(10)]
    fast = [9.0 + 0.01 * i for i in range(10)]
    overlapping = [9.05 + 0.01 * i for i in range(10)]
    assert not gen_checks.host_launched(_rung("cache eager", slow), _rung("cache CUDA graph", fast))
    _, said = gen_checks.ladder_verdict(_rung("cache CUDA graph", slow), _rung("cache compile + CUDA graph", fast))
    assert said == "faster"
    _, said = gen_checks.ladder_verdict(_rung("cache CUDA graph", fast), _rung("cache compile + CUDA graph", slow))
    assert said == "slower"
    # A launched rung against a replayed one: the graph took the host out of one of them, so bands decide.
    _, said = gen_checks.ladder_verdict(_rung("cache eager", slow), _rung("cache CUDA graph", fast))
    assert said == "faster"
    _, said = gen_checks.ladder_verdict(_rung("cache CUDA graph", fast), _rung("cache compile + CUDA graph", overlapping))
    assert said == "within noise"
