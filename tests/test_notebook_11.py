"""Notebook 11 (finding the bottlenecks): each exercise's check catches a plausible wrong answer, and the
module-by-module profile attributes forward and backward work to the modules that ran it."""

import pytest
import torch

from tinyllama.config import get_preset
from tinyllama.course import bottlenecks, feedback
from tinyllama.course.checkpoints import CheckpointFailed
from tinyllama.harness.bench import TrainingStep, make_batches
from tinyllama.models import build
from tinyllama.profiling import modules

pytestmark = pytest.mark.usefixtures("lenient")

PRESET = get_preset("ci")
CONFIG = PRESET.model


def reference_classify(operator, module):
    name = operator.split("::")[-1]
    part = module.rsplit(".", 1)[-1]
    if part in ("", "embed", "lm_head"):
        return "other"
    if "norm" in part:
        return "norm"
    if part == "attn":
        return "attention"
    if part.endswith("_proj") and name in ("mm", "addmm", "matmul", "linear", "bmm"):
        return "attn_proj" if part in ("q_proj", "k_proj", "v_proj", "o_proj") else "ffn"
    return "elementwise"


def by_name_only(operator, module):
    """A classification from the operator name alone: the mistake exercise 11.1 is about."""
    name = operator.split("::")[-1]
    if "softmax" in name or name in ("bmm", "masked_fill"):
        return "attention"
    if name in ("mm", "addmm"):
        return "ffn"
    if name in ("mean", "rsqrt", "pow"):
        return "norm"
    return "elementwise"


def test_classifier_check_passes_the_reference_and_names_the_wrong_cases(capsys):
    assert bottlenecks.check_classifier(reference_classify)
    assert not bottlenecks.check_classifier(by_name_only)
    out = capsys.readouterr().out
    assert "classify('aten::_log_softmax', '')" in out and "loss" in out
    assert "classify('aten::mm', 'layers.0.attn.q_proj')" in out


def test_classifier_check_fails_loudly_under_strict(monkeypatch):
    monkeypatch.setenv("WORKSHOP_STRICT", "1")
    with pytest.raises(CheckpointFailed):
        bottlenecks.check_classifier(by_name_only)


def test_classifier_check_passes_a_not_written_exercise_through():
    def not_written(operator, module):
        raise NotImplementedError("exercise 11.1")

    with pytest.raises(NotImplementedError):
        bottlenecks.check_classifier(not_written)


@pytest.mark.parametrize("factor, words", [(1 / 3, "forward"), (1 / 2, "MACs"), (100.0, "percentage"),
                                           (1e-3, "milliseconds used as seconds"), (1e3, "the wrong way")])
def test_mfu_check_recognises_the_usual_slips(capsys, factor, words):
    forward, step_ms, ceiling = 4e12, 100.0, 400.0
    right = 3 * forward / (step_ms / 1e3) / (ceiling * 1e12)
    assert bottlenecks.check_mfu(right, forward, step_ms, ceiling)
    capsys.readouterr()
    assert not bottlenecks.check_mfu(right * factor, forward, step_ms, ceiling)
    assert words in capsys.readouterr().out


def _roof(flops, nbytes, peak, bandwidth):
    return 1e3 * torch.maximum(flops / (peak * 1e12), nbytes / (bandwidth * 1e12))


@pytest.mark.parametrize("wrong", [
    lambda f, b, p, w: 1e3 * (f / (p * 1e12) + b / (w * 1e12)),  # adds the two times
    lambda f, b, p, w: 1e3 * torch.minimum(f / (p * 1e12), b / (w * 1e12)),  # the smaller one
    lambda f, b, p, w: torch.maximum(f / (p * 1e12), b / (w * 1e12)),  # seconds, not milliseconds
])
def test_roof_time_check(wrong):
    assert bottlenecks.check_roof_time(_roof)
    assert not bottlenecks.check_roof_time(wrong)


def test_step_speedup_check():
    assert bottlenecks.check_step_speedup(lambda s, k: 1 / ((1 - s) + s / k))
    assert not bottlenecks.check_step_speedup(lambda s, k: (1 - s) + s / k)  # the new time, not the ratio
    assert not bottlenecks.check_step_speedup(lambda s, k: 1 + s * (k - 1))  # the touched part scaled up


def test_predictions_and_rank_are_checked_for_plausibility_only():
    assert bottlenecks.check_prediction("p", 1.0) and bottlenecks.check_prediction("p", 3.5)
    assert not bottlenecks.check_prediction("p", 0.8) and not bottlenecks.check_prediction("p", 25.0)
    assert bottlenecks.check_rank("attention>ffn>elementwise>norm")
    assert not bottlenecks.check_rank("attention")
    assert not bottlenecks.check_rank("attention>mlp")
    assert not bottlenecks.check_rank("ffn>ffn")


def test_module_ranges_are_removed_afterwards():
    model = build("v1", CONFIG)
    with modules.module_ranges(model) as names:
        assert "layers.0.attn.q_proj" in names and "" not in names
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())


def test_profile_credits_forward_and_backward_to_their_modules():
    torch.manual_seed(0)
    model = build("v1", CONFIG)
    step = TrainingStep(model, "fp32", "cpu")
    (inputs, targets), = make_batches(CONFIG, PRESET.batch_size, PRESET.seq_len, count=1)
    run, ops = modules.profile_modules(lambda: step(inputs, targets), model, device="cpu", wait=0, warmup=1,
                                       active=1)
    assert list(ops.columns) == modules.COLUMNS
    mm = ops[ops["operator"] == "aten::mm"]
    forward = mm[mm["phase"] == "forward"].set_index("module")["calls_per_step"]
    backward = mm[mm["phase"] == "backward"].set_index("module")["calls_per_step"]
    # each projection: one product forward, two backward (input and weight gradients), in its own module
    projections = [f"layers.{i}.{p}" for i in range(CONFIG.num_layers)
                   for p in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj",
                             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")] + ["lm_head"]
    assert sorted(forward.index) == sorted(projections) and set(forward) == {1.0}
    assert sorted(backward.index) == sorted(projections) and set(backward) == {2.0}
    softmax_backward = ops[ops["operator"] == "aten::_softmax_backward_data"]
    assert set(softmax_backward["module"]) == {f"layers.{i}.attn" for i in range(CONFIG.num_layers)}
    assert set(ops.loc[ops["phase"] == "optimizer", "module"]) == {modules.OUTSIDE}
    # the time of every operator is counted once
    operators = run.operators()
    assert ops["time_ms"].sum() == pytest.approx(operators.loc[operators["kind"] == "operator", "self_cpu_ms"].sum(),
                                                 rel=1e-6)
    # FLOPs: the profiler's matmul estimate covers the analytic count of a step
    from tinyllama.costs import flops
    assert ops["flops"].sum() >= flops.training_flops(CONFIG, PRESET.batch_size, PRESET.seq_len)
    classified = {reference_classify(o, m) for o, m in zip(ops["operator"], ops["module"])}
    assert classified == set(bottlenecks.CATEGORIES)


def test_cast_time_counts_autocasts_casts_only():
    import pandas as pd

    ops = pd.DataFrame({"operator": ["aten::_to_copy", "aten::mm", "aten::add", "aten::copy_", "aten::_to_copy"],
                        "category": ["elementwise", "ffn", "elementwise", "elementwise", "other"],
                        "time_ms": [2.0, 10.0, 2.0, 1.0, 1.0], "calls_per_step": [30, 6, 4, 2, 1]})
    casts = bottlenecks.cast_time(ops)
    assert casts["calls"] == 31 and casts["time_ms"] == 3.0  # copy_ is no cast of its own
    assert casts["share_of_step"] == 3.0 / 16.0
    assert casts["share_of_elementwise"] == 2.0 / 5.0  # the elementwise category's casts over its time
    empty = bottlenecks.cast_time(ops[ops["operator"] != "aten::_to_copy"])
    assert empty == {"calls": 0.0, "time_ms": 0.0, "share_of_step": 0.0, "share_of_elementwise": 0.0}


def test_roof_bands_split_the_time_by_distance_from_the_roof():
    bands = bottlenecks.roof_bands([4.0, 3.0, 2.0, 1.0], [1.2, 2.0, 5.0, 40.0])
    assert list(bands.index) == ["within 2x", "2-10x", "over 10x"]
    assert bands.tolist() == [0.7, 0.2, 0.1]  # 2.0x counts as within 2x (the bound is inclusive)


def test_a_casts_copy_is_credited_to_the_cast():
    """``x.to(dtype)`` runs aten::_to_copy, whose child aten::copy_ does the work: the row of the cast holds
    that time, and the aten::copy_ rows keep only the copies that cast nothing (those of the same model
    without the casts)."""

    class Model(torch.nn.Module):
        def __init__(self, cast: bool) -> None:
            super().__init__()
            self.proj, self.cast = torch.nn.Linear(64, 64), cast

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x.to(torch.float64).to(torch.float32) if self.cast else x)

    x = torch.randn(256, 64)
    copies = {}
    for cast in (True, False):
        model = Model(cast)
        _, ops = modules.profile_modules(lambda: model(x), model, device="cpu", wait=0, warmup=1, active=2)
        copies[cast] = ops.loc[ops["operator"] == "aten::copy_", "calls_per_step"].sum()
        casts = ops[ops["operator"] == "aten::_to_copy"]
        if cast:
            assert casts["calls_per_step"].sum() == 2 and casts["time_ms"].sum() > 0
        else:
            assert casts.empty
    assert copies[True] == copies[False]


# ---- each exercise through its cells: the reference passes, each typical mistake has its own message ----------

from notebook_exercises import SolutionExercises, run_source  # noqa: E402

from tinyllama import course  # noqa: E402


@pytest.fixture(scope="module")
def solution():
    return SolutionExercises("11_finding_bottlenecks")


def _run(solution, exercise, namespace, replace=None):
    """The exercise's cell (with ``replace`` planted), then its check cell (the next code cell)."""
    run_source(solution.source(exercise, replace), namespace)
    cells = solution.nb.cells
    after = next(i for i in range(solution.found[exercise][0] + 1, len(cells)) if cells[i].cell_type == "code")
    run_source(cells[after].source, namespace)


def _assert_slip(solution, capsys, exercise, namespace, replace, message, others):
    _run(solution, exercise, namespace, replace)
    shown = capsys.readouterr().out
    assert "CHECK:" in shown and "PASS" not in shown.split("CHECK:")[0], shown
    assert message in shown, shown
    named = [text for text in others if text != message and text in shown]
    assert not named, f"the feedback names other mistakes too: {named}\n{shown}"


def _namespace():
    return {"bottlenecks": bottlenecks, "course": course, "torch": torch, "forward_flops": 4e12, "step_ms": 100.0,
            "ceiling_tflops": 400.0, "predicted_mfu_pct": 30.0, "peaks": None, "precision": "bf16"}


CLASSIFY_SLIPS = [
    ('if part in ("", "embed", "lm_head"):', 'if part in ("", "embed"):', "the output head: a GEMM"),
    ('if "norm" in part:', 'if part.endswith("_norm"):', "the final norm (module 'norm')"),
    ('if part == "attn":', 'if part in ("attn", "rope"):', "RoPE rotates with multiplies and adds"),
    (' and name in ("mm", "addmm", "matmul", "linear", "bmm")', "", "an add inside a projection sums the gradients"),
    ('    if part in ("", "embed", "lm_head"):',
     '    if "softmax" in name:\n        return "attention"\n    if part in ("", "embed", "lm_head"):',
     "the loss's log-softmax"),
    ('else "ffn"', 'else "mlp"', "'mlp' is not one of the categories"),
]


def test_the_classifier_reference_passes(solution, capsys):
    _run(solution, "11.1", _namespace())
    assert "PASS: classify puts all" in capsys.readouterr().out


@pytest.mark.parametrize("old, new, message", CLASSIFY_SLIPS, ids=[s[2][:24] for s in CLASSIFY_SLIPS])
def test_each_classifier_slip_fails_with_its_own_message(solution, capsys, old, new, message):
    _assert_slip(solution, capsys, "11.1", _namespace(), (old, new), message, [t for *_, t in CLASSIFY_SLIPS])


MFU_SLIPS = [
    ("training_flops = 3 * forward_flops", "training_flops = forward_flops", "only the forward pass's FLOPs"),
    ("training_flops = 3 * forward_flops", "training_flops = 2 * forward_flops", "counted as one forward's worth"),
    ("training_flops = 3 * forward_flops", "training_flops = 6 * forward_flops", "already counts FLOPs (2 x MACs)"),
    ("training_flops = 3 * forward_flops", "training_flops = 1.5 * forward_flops", "(MACs) taken for FLOPs"),
    ("(step_ms / 1e3)", "step_ms", "milliseconds used as seconds"),
    ("mfu = achieved_tflops / ceiling_tflops", "mfu = 100 * achieved_tflops / ceiling_tflops", "a percentage"),
    ("(step_ms / 1e3) / 1e12", "(step_ms / 1e3)", "the achieved rate is in FLOP/s and the ceiling in TFLOP/s"),
]


def test_the_mfu_reference_passes(solution, capsys):
    _run(solution, "11.2", _namespace())
    assert "PASS: MFU = 0.3" in capsys.readouterr().out


@pytest.mark.parametrize("old, new, message", MFU_SLIPS, ids=[s[1] for s in MFU_SLIPS])
def test_each_mfu_slip_fails_with_its_own_message(solution, capsys, old, new, message):
    _assert_slip(solution, capsys, "11.2", _namespace(), (old, new), message, [t for *_, t in MFU_SLIPS])


ROOF_SLIPS = [
    ("1e3 * torch.maximum(compute_s, memory_s)", "1e3 * (compute_s + memory_s)", "you add the two times"),
    ("1e3 * torch.maximum(compute_s, memory_s)", "1e3 * torch.minimum(compute_s, memory_s)", "the smaller of the two"),
    ("1e3 * torch.maximum(compute_s, memory_s)", "torch.maximum(compute_s, memory_s)", "your times are in seconds"),
    ("1e3 * torch.maximum(compute_s, memory_s)", "1e3 * max(compute_s, memory_s)", "Python's max"),
    ("nbytes / (bandwidth_tbs * 1e12)", "nbytes / (bandwidth_tbs * 1e9)", "1 TB/s is 1e12 bytes per second"),
    ("(peak_tflops * 1e12)", "peak_tflops", None),  # the compute time alone off: no slip of its own, the general hint
]


def test_the_roof_time_reference_passes(solution, capsys):
    _run(solution, "11.3", _namespace())
    assert "PASS: time_at_roof_ms agrees" in capsys.readouterr().out


@pytest.mark.parametrize("old, new, message", ROOF_SLIPS, ids=[s[1] for s in ROOF_SLIPS])
def test_each_roof_time_slip_fails_with_its_own_message(solution, capsys, old, new, message):
    general = "An operator needs at least the time for its arithmetic"
    others = [t for *_, t in ROOF_SLIPS if t] + [general]
    _assert_slip(solution, capsys, "11.3", _namespace(), (old, new), message or general, others)


SPEEDUP_SLIPS = [
    ("1.0 / ((1.0 - share) + share / local_speedup)", "(1.0 - share) + share / local_speedup", "the new step time"),
    ("1.0 / ((1.0 - share) + share / local_speedup)", "(1.0 - share) + share * local_speedup",
     "you average the speed-ups"),
    ("share / local_speedup)", "share * local_speedup)", "multiplied by the local speed-up"),
    ("1.0 / ((1.0 - share) + share / local_speedup)", "1.0 / (1.0 - share)", "the limit for a part"),
    ("1.0 / ((1.0 - share) + share / local_speedup)", "local_speedup + 0 * share", "the whole step is sped up"),
]


def test_the_step_speedup_reference_passes(solution, capsys):
    _run(solution, "11.4", _namespace())
    assert "PASS: step_speedup agrees" in capsys.readouterr().out


@pytest.mark.parametrize("old, new, message", SPEEDUP_SLIPS, ids=[s[2] for s in SPEEDUP_SLIPS])
def test_each_step_speedup_slip_fails_with_its_own_message(solution, capsys, old, new, message):
    _assert_slip(solution, capsys, "11.4", _namespace(), (old, new), message, [t for *_, t in SPEEDUP_SLIPS])


def test_every_listed_slip_differs_from_the_answer_on_the_checks_shapes():
    for slips, reference, make_inputs, shapes in (
            (bottlenecks.ROOF_SLIPS, bottlenecks._roof_reference, bottlenecks._roof_inputs, [(1,), (7,), (33,)]),
            (bottlenecks.SPEEDUP_SLIPS, bottlenecks._speedup_reference, bottlenecks._speedup_inputs,
             [(1,), (9,), (40,)])):
        for slip in slips:
            if slip.function is not None:
                assert feedback.name_slip(slip.function, reference, make_inputs, shapes, slips, 0.0, 1e-6) is slip
