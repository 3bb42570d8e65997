"""Notebook 17 (V1-V4 side by side): its exercise checks pass the reference answers and fail answers with
one typical mistake (under WORKSHOP_STRICT=1), and its helpers read a comparison record and notebook 11's
predictions as the notebook expects."""

import math

import pandas as pd
import pytest
import torch
from notebook_exercises import SolutionExercises

from tinyllama import course
from tinyllama.config import get_preset
from tinyllama.costs import flops as model_flops
from tinyllama.course import versions
from tinyllama.course.checkpoints import CheckpointFailed
from tinyllama.course.results import checkout_root
from tinyllama.harness.comparison.parity import TOLERANCES
from tinyllama.harness.comparison.runs import parse_run

pytestmark = pytest.mark.usefixtures("strict")

PATH = checkout_root() / "solutions" / "17_version_comparison.ipynb"


@pytest.fixture(scope="module")
def notebook():
    return SolutionExercises(PATH.stem)


def _run_record(label, step_ms, ceiling=100.0, tokens=8 * 64, flops_per_step=6.0e12, **extra):
    spec = parse_run(label)
    return {"label": label, "version": spec.version, "precision": spec.precision, "options": dict(spec.options),
            "check": "passed", "step_ms_median": step_ms, "step_ms_p10": 0.95 * step_ms, "step_ms_p90": 1.1 * step_ms,
            "tokens_per_s": tokens / (step_ms / 1e3), "peak_memory_mib": 1000.0,
            "achieved_tflops": flops_per_step / (step_ms / 1e3) / 1e12, "ceiling_tflops": ceiling,
            "mfu_measured": flops_per_step / (step_ms / 1e3) / 1e12 / ceiling,
            "check_logits_error": 1e-7, "check_loss_error": 1e-8, "check_gradient_error": 2e-7, **extra}


def _record(config, batch, seq, graphs=True):
    """A comparison record as compare writes it, with figures that follow from the model FLOPs."""
    flops = model_flops.training_flops(config, batch, seq)
    times = {"v1:fp32": 240.0, "v1:bf16": 60.0, "v2:bf16": 55.0, "v3:bf16": 53.0, "v4:bf16": 28.0,
             "v4[cuda_graph=0]:bf16": 28.0,  # the eager row where graphs are asked for (V4 replays by default)
             "v1[cuda_graph=1]:bf16": 57.0, "v2[cuda_graph=1]:bf16": 52.0, "v3[cuda_graph=1]:bf16": 24.0,
             "v4[cuda_graph=1]:bf16": 23.0}
    runs = []
    for label in versions.version_runs("bf16", graphs):
        own = {} if label.endswith("fp32") else {"check_logits_error_own_precision": 1e-2,
                                                  "check_loss_error_own_precision": 2e-3,
                                                  "check_gradient_error_own_precision": 3e-2}
        runs.append(_run_record(label, times[label], ceiling=50.0 if label.endswith("fp32") else 750.0,
                                tokens=batch * seq, flops_per_step=flops, **own))
    return {"runs": runs}


def _exec(notebook, exercise, replace=None, namespace=None):
    """Run the solution cell of ``exercise`` (with ``replace`` applied); return the namespace and the check cell."""
    namespace = {"torch": torch, "pd": pd, "math": math, "course": course, "versions": versions,
                 "model_flops": model_flops, **(namespace or {})}
    return notebook.run(exercise, namespace, replace, check=False), notebook.check_source(exercise)


def _run(notebook, exercise, replace=None, namespace=None):
    """Run the solution cell of ``exercise`` (with ``replace`` = (old, new) applied) and its check cell."""
    namespace, check = _exec(notebook, exercise, replace, namespace)
    exec(check, namespace)
    return namespace


def test_the_notebook_has_six_exercises(notebook):
    assert set(notebook.found) == {"17.1", "17.2", "17.3", "17.4", "17.5", "17.6"}


def test_the_reference_answers_pass(notebook):
    table = versions.example_correctness_table()
    _run(notebook, "17.1")
    tolerance = _run(notebook, "17.2", namespace={"correctness": table})
    _run(notebook, "17.3", namespace={"correctness": table, "precision": "bf16",
                                       "share_of_tolerance": tolerance["share_of_tolerance"]})
    _run(notebook, "17.4")
    _run(notebook, "17.6")


def test_reading_the_table_wrongly_fails(notebook):
    namespace = _run(notebook, "17.2", namespace={"correctness": versions.example_correctness_table()})
    for mistake in (("worst_run = shares.idxmax()[0]", "worst_run = 'v4:bf16'"),  # the largest absolute error
                    ("within_tolerance = bool((shares <= 1.0).all())", "within_tolerance = False")):
        with pytest.raises(CheckpointFailed):
            _run(notebook, "17.3", mistake, namespace={"correctness": namespace["correctness"], "precision": "bf16",
                                                        "share_of_tolerance": namespace["share_of_tolerance"]})


ANSWER_17_1 = "saved = (1.0 - 1.0 / speedups).sum()\n    return 1.0 / (1.0 - saved)"
COMBINE_SLIPS = [  # (the solution's text, the slip, what the check must say)
    (ANSWER_17_1, "return speedups.prod()", "Your answer multiplies the speed-ups"),
    (ANSWER_17_1, "return speedups.sum()", "Your answer adds the speed-ups"),
    (ANSWER_17_1, "return 1.0 + (speedups - 1.0).sum()", "Your answer adds the gains (S - 1)"),
    ("(1.0 - 1.0 / speedups).sum()", "(1.0 - 1.0 / speedups).max()", "counts only the remedy that saves most"),
    ("return 1.0 / (1.0 - saved)", "return 1.0 - saved", "the new step time as a fraction of V1's"),
    ("return 1.0 / (1.0 - saved)", "return saved", "the share of V1's step the remedies save together"),
]


@pytest.mark.parametrize("old, new, message", COMBINE_SLIPS, ids=[slip[1] for slip in COMBINE_SLIPS])
def test_each_combined_speedup_slip_fails_with_its_own_message(notebook, old, new, message):
    with pytest.raises(CheckpointFailed) as failed:
        _run(notebook, "17.1", (old, new))
    text = str(failed.value)
    assert "combined_speedup differs from the reference" in text and message in text
    others = [m for _, _, m in COMBINE_SLIPS if m != message and m in text]
    assert not others, f"the feedback names other mistakes too: {others}"


def test_a_combined_speedup_of_no_known_kind_gets_the_general_hint(notebook):
    with pytest.raises(CheckpointFailed, match="turn each into the time it saves"):
        _run(notebook, "17.1", ("return 1.0 / (1.0 - saved)", "return 1.0 / (1.0 - saved / 2)"))


def test_the_combine_examples_separate_every_slip():
    examples = [torch.tensor(e, dtype=torch.float64) for e in versions.COMBINE_EXAMPLES]
    values = {name: [float(slip(e)) for e in examples] for name, slip, _ in versions.COMBINE_SLIPS}
    values["answer"] = [float(versions._combined_reference(e)) for e in examples]
    for a in values:
        for b in values:
            assert a == b or not all(map(math.isclose, values[a], values[b])), (a, b)


def test_combined_speedup_is_amdahl_for_disjoint_parts():
    # 1.25x saves 20% of the step, 2x saves 50%: together 70%, a step 1/0.3 times faster.
    assert versions._combined_reference(torch.tensor([1.25, 2.0], dtype=torch.float64)).item() == pytest.approx(1 / 0.3)


SHARE_SLIPS = [  # (the solution's text, the slip, what the check must say)
    ('/ table[f"{name} tolerance"]', "", "these are the largest errors themselves"),
    ("return shares.max(axis=1)", "return shares.mean(axis=1)", "that is the mean of the three shares"),
    ("return shares.max(axis=1)", "return shares.sum(axis=1)", "that is the sum of the three shares"),
    ('table[f"{name} error"] / table[f"{name} tolerance"]', 'table[f"{name} tolerance"] / table[f"{name} error"]',
     "upside down: tolerance / error"),
    ("return shares.max(axis=1)", "return 100 * shares.max(axis=1)", "a percentage: give the share as a fraction"),
    ("return shares.max(axis=1)", "return shares.iloc[:, 2]", "only the gradient's share"),
    ("return shares.max(axis=1)",
     'return (table[[f"{n} error" for n in ("logits", "loss", "gradient")]].max(axis=1)\n'
     '            / table[[f"{n} tolerance" for n in ("logits", "loss", "gradient")]].max(axis=1))',
     "the largest error over the largest tolerance"),
    ("return shares.max(axis=1)", "return shares.max()", "return a Series with one number per row"),
]


@pytest.mark.parametrize("old, new, message", SHARE_SLIPS, ids=[slip[2][:30] for slip in SHARE_SLIPS])
def test_each_share_of_tolerance_slip_fails_with_its_own_message(notebook, old, new, message):
    with pytest.raises(CheckpointFailed) as failed:
        _run(notebook, "17.2", (old, new), namespace={"correctness": versions.example_correctness_table()})
    text = str(failed.value)
    assert "share_of_tolerance is off" in text and message in text
    others = [m for _, _, m in SHARE_SLIPS if m != message and m in text]
    assert not others, f"the feedback names other mistakes too: {others}"


def test_the_example_table_separates_every_share_slip():
    table = versions.example_correctness_table()
    values = {name: [float(x) for x in slip(table)] for name, slip, _ in versions.SHARE_SLIPS}
    values["answer"] = [float(x) for x in versions._tolerance_reference(table)]
    for a in values:
        for b in values:
            assert a == b or not all(map(math.isclose, values[a], values[b])), (a, b)


def test_worst_run_is_the_one_nearest_its_tolerance_not_the_largest_error():
    table = versions.example_correctness_table()
    assert versions.check_worst_run("v2:fp32", True, table)
    with pytest.raises(CheckpointFailed):
        versions.check_worst_run("v4:bf16", True, table)  # the largest absolute error, far inside bf16's tolerance
    over = table.copy()
    over.loc[("v4:bf16", "bf16"), "gradient error"] = 0.5
    with pytest.raises(CheckpointFailed):
        versions.check_worst_run("v4:bf16", True, over)  # now beyond its tolerance: within must be False
    assert versions.check_worst_run("v4:bf16", False, over)


@pytest.mark.parametrize("mistake", [
    ("return 3 * forward", "return forward"),  # forward only
    ("forward = 2 * model_flops", "forward = model_flops"),  # multiply-adds as one FLOP (weights only)
    ("+ config.num_layers * 2 * 2 * seq_len * config.hidden_dim", ""),  # no attention products
])
def test_flops_per_token_mistakes_fail(notebook, mistake):
    with pytest.raises(CheckpointFailed):
        _run(notebook, "17.4", mistake)


ANSWER_17_5 = "return tokens_per_s * flops_per_token / (ceiling_tflops * 1e12)"
MFU_SLIPS = [  # (the solution's text, the slip, what the check must say)
    ("/ (ceiling_tflops * 1e12)", "/ ceiling_tflops", "1e12 times the expected value"),
    (ANSWER_17_5, "return 100 * tokens_per_s * flops_per_token / (ceiling_tflops * 1e12)",
     "a percentage where a fraction was asked for"),
    ("1e12)", "1e9)", "a TFLOP/s is 1e12 FLOP/s, not 1e9"),
    (ANSWER_17_5, "return 3 * tokens_per_s * flops_per_token / (ceiling_tflops * 1e12)",
     "flops_per_token already counts the whole training step"),
    (ANSWER_17_5, "return 6 * tokens_per_s * flops_per_token / (ceiling_tflops * 1e12)",
     "the 6 of '6 x parameters' is in it"),
    (ANSWER_17_5, "return ceiling_tflops * 1e12 / (tokens_per_s * flops_per_token)",
     "upside down: the ceiling over the achieved rate"),
]


def _check_mfu(notebook, replace):
    config = get_preset("medium").model
    namespace, _ = _exec(notebook, "17.5", replace)
    return versions.check_mfu_from_tokens(namespace["mfu_from_tokens"], _record(config, 16, 512),
                                          model_flops.training_flops(config, 1, 512) / 512)


@pytest.mark.parametrize("old, new, message", MFU_SLIPS, ids=[slip[2][:30] for slip in MFU_SLIPS])
def test_each_mfu_slip_fails_with_its_own_message_against_the_record(notebook, old, new, message):
    with pytest.raises(CheckpointFailed) as failed:
        _check_mfu(notebook, (old, new))
    text = str(failed.value)
    assert "mfu_from_tokens is off for 11 of 11 runs" in text and message in text
    others = [m for _, _, m in MFU_SLIPS if m != message and m in text]
    assert not others, f"the feedback names other mistakes too: {others}"


def test_the_made_up_runs_separate_every_mfu_slip():
    values = {name: [slip(t, f, c) for t, f, c, _ in versions.MFU_CASES] for name, slip, _ in versions.MFU_SLIPS}
    values["answer"] = [versions._mfu_reference(t, f, c) for t, f, c, _ in versions.MFU_CASES]
    for a in values:
        for b in values:
            assert a == b or not all(map(math.isclose, values[a], values[b])), (a, b)


def test_an_mfu_of_no_known_kind_gets_the_general_hint(notebook):
    with pytest.raises(CheckpointFailed, match="the achieved FLOP/s .* over the ceiling's FLOP/s"):
        _check_mfu(notebook, ("(ceiling_tflops * 1e12)", "(ceiling_tflops * 1e12 + 1e12)"))


def test_mfu_from_the_reference_answer_matches_compare(notebook):
    config = get_preset("medium").model
    flops, _ = _exec(notebook, "17.4")
    mfu, _ = _exec(notebook, "17.5")
    assert versions.check_mfu_from_tokens(mfu["mfu_from_tokens"], _record(config, 16, 512),
                                          flops["flops_per_token"](config, 512))


@pytest.mark.parametrize("mistake", [
    ("return 1.0 - graphed_ms / eager_ms", "return graphed_ms / eager_ms"),  # the GPU's share
    ("return 1.0 - graphed_ms / eager_ms", "return 100 * (1.0 - graphed_ms / eager_ms)"),
    ("return 1.0 - graphed_ms / eager_ms", "return (eager_ms - graphed_ms) / graphed_ms"),
    ("return 1.0 - graphed_ms / eager_ms", "return float((1.0 - graphed_ms / eager_ms).mean())"),
])
def test_host_share_mistakes_fail(notebook, mistake):
    with pytest.raises(CheckpointFailed):
        _run(notebook, "17.6", mistake)


def test_version_runs_parse_and_put_the_baseline_first():
    gpu = versions.version_runs("bf16", graphs=True)
    assert gpu[0] == "v1:fp32" and len(gpu) == 9
    assert all(parse_run(label).label == label for label in gpu)
    assert [parse_run(label).cuda_graph for label in gpu].count(True) == 4
    assert versions.version_runs("fp32", graphs=False) == ["v1:fp32", "v2:fp32", "v3:fp32", "v4:fp32"]


def test_version_table_reads_eager_and_graphed_rows():
    config = get_preset("medium").model
    table = versions.version_table(_record(config, 16, 512), "bf16")
    assert list(table.index) == ["v1", "v2", "v3", "v4"]
    assert table.loc["v3", "eager ms"] == 53.0 and table.loc["v3", "graphed ms"] == 24.0
    assert table.loc["v4", "speed-up over V1 bf16"] == pytest.approx(60.0 / 28.0)
    assert table.loc["v4", "speed-up over V1 fp32"] == pytest.approx(240.0 / 28.0)
    eager_only = versions.version_table(_record(config, 16, 512, graphs=False), "bf16")
    assert eager_only["graphed ms"].isna().all() and eager_only["eager ms"].notna().all()


def test_a_run_that_failed_its_check_has_no_figures():
    config = get_preset("medium").model
    record = _record(config, 16, 512)
    next(r for r in record["runs"] if r["label"] == "v3:bf16")["check"] = "failed"
    table = versions.version_table(record, "bf16")
    assert math.isnan(table.loc["v3", "eager ms"]) and math.isnan(table.loc["v3", "speed-up over V1 bf16"])


def test_correctness_table_has_one_row_per_check_with_its_tolerance():
    config = get_preset("medium").model
    table = versions.correctness_table(_record(config, 16, 512))
    assert ("v1:fp32", "fp32") in table.index and ("v1:fp32", "bf16") not in table.index
    assert table.loc[("v4[cuda_graph=0]:bf16", "bf16"), "gradient tolerance"] == TOLERANCES["bf16"].gradients
    assert table.loc[("v4[cuda_graph=0]:bf16", "fp32"), "logits tolerance"] == TOLERANCES["fp32"].logits
    assert len(table) == 1 + 2 * 8


def test_predictions_from_notebook_11_are_read_and_combined(tmp_path):
    assert versions.notebook_11_predictions(directory=str(tmp_path)) == {}
    course.record("11_finding_bottlenecks", {"predicted_speedup_fused_projections": 1.25,
                                             "predicted_speedup_fused_kernels": 1.2,
                                             "predicted_speedup_flash_attention": 1.5}, directory=tmp_path, quiet=True)
    found = versions.notebook_11_predictions(directory=str(tmp_path))
    assert found == {"fused_projections": 1.25, "fused_kernels": 1.2, "flash_attention": 1.5}
    combined = versions.version_predictions(found, versions._combined_reference)
    assert combined["v2"] == pytest.approx(1.25)
    assert combined["v3"] == pytest.approx(1 / (1 - 0.2 - 1 / 6 - 1 / 3))  # savings 20% + 1/6 + 1/3 of V1's step
    assert combined["v4"] is None  # compile was not predicted
    overlapping = versions.version_predictions({**found, "fused_kernels": 4.0}, versions._combined_reference)
    assert overlapping["v3"] is None  # the savings add up to more than the whole step
