"""Notebook 10's checks catch plausible wrong answers, its measuring helpers measure, and the figures it
prints beside its sweeps (log-log slope and its guides, the S^2 share, the peak against the saved
activations, the large preset's fit, the precision verdicts) say what the numbers say."""

import json
import math
import re

import matplotlib
import pandas as pd
import pytest
import torch

from tinyllama.config import get_preset
from tinyllama.costs import anatomy
from tinyllama.course import baseline_checks as bc
from tinyllama.course import baseline_memory as bm
from tinyllama.course import baseline_plots as bp
from tinyllama.course.checkpoints import CheckpointFailed
from tinyllama.course.results import checkout_root
from tinyllama.harness import bench
from tinyllama.models import build
from tinyllama.timing import Band, verdict

matplotlib.use("Agg")


def params(vocab, hidden, layers, heads, kv_heads, intermediate):
    kv = kv_heads * (hidden // heads)
    return 2 * vocab * hidden + layers * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * intermediate
                                          + 2 * hidden) + hidden


def flops(c, seq):
    h, kv = c.hidden_dim, c.kv_dim
    n = c.num_layers * (2 * h * h + 2 * h * kv + 3 * h * c.intermediate_dim) + c.vocab_size * h
    return 6 * n + 12 * c.num_layers * seq * h


def activations(c, batch, seq):
    h, i = c.hidden_dim, c.intermediate_dim
    per_layer = 10 * batch * seq * h + 4 * batch * seq * i + batch * c.num_heads * seq * seq
    return 4 * (c.num_layers * per_layer + 3 * batch * seq * h + batch * seq * c.vocab_size)


def test_parameter_check_passes_the_right_count_and_names_the_missing_part(strict, capsys):
    assert bc.check_parameter_formula(params)
    with pytest.raises(CheckpointFailed, match="misses the output head"):
        bc.check_parameter_formula(lambda v, h, *rest: params(v, h, *rest) - v * h + 0 * h)
    with pytest.raises(CheckpointFailed, match="full width"):
        bc.check_parameter_formula(lambda v, h, l, heads, kv, i: params(v, h, l, heads, heads, i))
    with pytest.raises(CheckpointFailed, match="final RMSNorm"):
        bc.check_parameter_formula(lambda v, h, *rest: params(v, h, *rest) + h)


def test_flops_check_passes_the_right_count_and_diagnoses_common_mistakes(strict):
    assert bc.check_flops_formula(flops)
    with pytest.raises(CheckpointFailed, match="half of the attention square"):
        bc.check_flops_formula(lambda c, s: flops(c, s) - 6 * c.num_layers * s * c.hidden_dim)
    with pytest.raises(CheckpointFailed, match="forward pass only"):
        bc.check_flops_formula(lambda c, s: flops(c, s) / 3)
    with pytest.raises(CheckpointFailed, match="6N with N = all parameters"):
        bc.check_flops_formula(lambda c, s: 6 * c.num_parameters() + 12 * c.num_layers * s * c.hidden_dim)


def test_activation_check_passes_the_formula_and_catches_a_missing_square_term(strict):
    assert bc.check_activation_formula(activations)
    with pytest.raises(CheckpointFailed, match=r"S\^2 term"):
        bc.check_activation_formula(lambda c, b, s: activations(c, b, s) - 4 * c.num_layers * b * c.num_heads * s * s)
    with pytest.raises(CheckpointFailed, match="off by more than 10%"):
        bc.check_activation_formula(lambda c, b, s: activations(c, b, s) / 2)


def _trainer():
    config = get_preset("ci").model
    model = build("v1", config)
    return config, model, bench.TrainingStep(model, "fp32", torch.device("cpu"))


def test_fits_check_wants_the_gradients_of_a_failed_step_dropped(strict):
    config, model, trainer = _trainer()

    def step(batch):
        trainer(*bench.make_batches(config, batch, 16, count=1)[0])

    def good(batch):
        try:
            step(batch)
            return True
        except torch.OutOfMemoryError:
            trainer.optimizer.zero_grad(set_to_none=True)
            return False

    def leaves_gradients(batch):
        try:
            step(batch)
            return True
        except torch.OutOfMemoryError:
            return False

    def raises(batch):
        step(batch)
        return True

    assert bc.check_fits(good, model, 2)
    with pytest.raises(CheckpointFailed, match="still hold a gradient"):
        bc.check_fits(leaves_gradients, model, 2)
    with pytest.raises(CheckpointFailed, match="let the out-of-memory error escape"):
        bc.check_fits(raises, model, 2)


def test_largest_batch_doubles_then_bisects():
    search = anatomy.largest_batch(lambda b: b <= 37, start=4, limit=1000, resolution=0.0)
    assert (search.largest, search.first_failing) == (37, 38)
    assert [b for b, _ in search.probes][:5] == [4, 8, 16, 32, 64]
    capped = anatomy.largest_batch(lambda b: True, start=2, limit=16)
    assert (capped.largest, capped.first_failing) == (16, None) and "limit of 16" in capped.describe()
    assert anatomy.largest_batch(lambda b: False, start=2).largest is None


def test_saved_activations_match_the_formula_and_fit_recovers_coefficients():
    config = get_preset("ci").model
    model = build("v1", config)
    x, y = bench.make_batches(config, 2, 32, count=1)[0]
    from tinyllama.models import lm_loss

    saved = anatomy.saved_activations(model, lambda: lm_loss(model(x), y))
    assert abs(saved.bytes / activations(config, 2, 32) - 1) < 0.02
    assert all(p.grad is not None for p in model.parameters())  # the backward ran
    a, b, c = anatomy.fit_batch_seq([(bb, s, bb * (100 * s + 3 * s * s) + 7) for bb in (1, 2, 3) for s in (8, 16, 40)])
    assert (round(a), round(b), round(c)) == (100, 3, 7)


def test_pretend_out_of_memory_raises_once():
    with anatomy.pretend_out_of_memory(1000) as mode:
        with pytest.raises(anatomy.OutOfMemoryError):
            torch.ones(10_000) + 1
        torch.ones(10_000) + 1  # after the error, clean-up runs
    assert mode.raised and mode.allocated > 1000


# ------------------------------------------------------------------------------------------------
# The figures printed beside the sweeps
# ------------------------------------------------------------------------------------------------

# The medium preset's sweeps as an H200 measured them (saved activations and peak above held, MiB).
H200_BY_BATCH = pd.DataFrame({
    "batch": [2, 4, 8, 16, 32], "seq": [512] * 5,
    "saved MiB": [1459.020, 2915.039, 5827.078, 11651.156, 23299.313],
    "predicted MiB": [1455.906, 2911.812, 5823.625, 11647.250, 23294.500],
    "GPU peak above held MiB": [1499.192, 2975.192, 5927.380, 11831.661, 23640.411]})
H200_BY_SEQ = pd.DataFrame({
    "batch": [4] * 5, "seq": [128, 256, 512, 1024, 2048],
    "saved MiB": [656.197, 1360.770, 2915.039, 6604.078, 16304.156],
    "predicted MiB": [655.953, 1359.906, 2911.812, 6591.625, 16255.250],
    "GPU peak above held MiB": [752.392, 1400.849, 2975.192, 6704.380, 17160.634]})


def test_loglog_slope_recovers_the_exponent_and_refuses_bad_input():
    xs = [16, 32, 64, 128, 256]
    assert bm.loglog_slope(xs, [3 * x**1.5 for x in xs]) == pytest.approx(1.5, abs=1e-12)
    assert bm.loglog_slope(xs, [7 * x for x in xs]) == pytest.approx(1.0, abs=1e-12)
    # a S + b S^2 lies between the two, nearer 1 while the linear term dominates
    assert 1.0 < bm.loglog_slope(xs, [1000 * x + x * x for x in xs]) < 1.3
    # the stored H200 sweep: slope 1.15, far from quadratic
    assert bm.loglog_slope(H200_BY_SEQ.seq, H200_BY_SEQ["saved MiB"]) == pytest.approx(1.15, abs=0.01)
    for x, y in (([1], [1]), ([1, 2], [1, -2]), ([4, 4], [1, 2]), ([1, 2], [1])):
        with pytest.raises(ValueError):
            bm.loglog_slope(x, y)


@pytest.mark.parametrize("preset", ["ci", "medium"])
def test_saved_bytes_from_the_shapes_are_the_exercise_formula_and_the_local_slope_is_one_plus_the_square_share(preset):
    config = get_preset(preset).model
    for seq in (16, 128, 512):
        # the estimate also counts the boolean causal mask and RMSNorm's 1/rms: 1.1% more at the ci shape
        assert bm.saved_bytes(config, 2, seq) == pytest.approx(activations(config, 2, seq), rel=0.02)
    terms = bm.sequence_terms(config, 4, [128, 256, 512])
    for _, row in terms.iterrows():
        s = int(row.seq)
        # d log M / d log S, numerically, from the shapes
        numeric = (math.log(bm.saved_bytes(config, 4, s + 1)) - math.log(bm.saved_bytes(config, 4, s - 1))) / (
            math.log(s + 1) - math.log(s - 1))
        assert row["local log-log slope"] == pytest.approx(numeric, abs=2e-3)
        # the S^2 part is every layer's softmax output (fp32) and causal mask (1 byte)
        assert row["S^2 part MiB"] * 2**20 == config.num_layers * (4 * config.num_heads * s * s * 4 + s * s)
        # the FLOP share: the attention products of tinyllama.costs.flops
        attention = 12 * config.num_layers * s * config.hidden_dim
        assert row["S^2 share of FLOPs"] == pytest.approx(attention / flops(config, s), rel=1e-9)
    assert terms["S^2 share of saved"].is_monotonic_increasing


def test_the_slope_sentence_prints_the_fitted_slope_and_the_share_at_both_ends():
    config = get_preset("medium").model
    terms = bm.sequence_terms(config, 4, list(H200_BY_SEQ.seq))
    slope = bm.loglog_slope(H200_BY_SEQ.seq, H200_BY_SEQ["saved MiB"])
    text = bm.describe_sequence_slope(slope, terms, crossover=3333.0)
    assert f"{slope:.2f}" in text and "close to linear" in text and "seq 3,333" in text
    first, last = terms.iloc[0], terms.iloc[-1]
    assert f"{first['S^2 share of saved']:.1%}" in text and f"{last['S^2 share of saved']:.1%}" in text
    assert "close to quadratic" in bm.describe_sequence_slope(1.9, terms)
    assert "between linear and quadratic" in bm.describe_sequence_slope(1.5, terms)


def _line(ax, prefix):
    found = [line for line in ax.get_lines() if line.get_label().startswith(prefix)]
    assert len(found) == 1, [line.get_label() for line in ax.get_lines()]
    return found[0]


def test_sequence_panel_is_log_log_with_slope_guides_through_the_first_point_and_the_fitted_slope():
    fig = bp.plot_activation_sweeps(H200_BY_BATCH, H200_BY_SEQ, "test", 512, 4)
    left, right = fig.axes
    assert right.get_xscale() == "log" and right.get_yscale() == "log" and left.get_xscale() == "linear"
    for slope in (1, 2):
        line = _line(right, f"slope {slope} ")
        x, y = (list(map(float, v)) for v in line.get_data())
        assert x == list(map(float, H200_BY_SEQ.seq))
        assert y[0] == pytest.approx(H200_BY_SEQ["saved MiB"].iloc[0])
        assert bm.loglog_slope(x, y) == pytest.approx(slope, abs=1e-9)
    fitted = bm.loglog_slope(H200_BY_SEQ.seq, H200_BY_SEQ["saved MiB"])
    assert right.get_title().endswith(f"fitted slope {fitted:.2f}")
    assert "linear" in _line(right, "slope 1").get_label() and "quadratic" in _line(right, "slope 2").get_label()
    assert all(ax.get_xlabel() and "MiB" in ax.get_ylabel() for ax in (left, right))
    _line(left, "measured: peak")  # drawn where measured ...
    cpu = H200_BY_SEQ.assign(**{"GPU peak above held MiB": None})
    fig = bp.plot_activation_sweeps(H200_BY_BATCH.assign(**{"GPU peak above held MiB": None}), cpu, "cpu", 512, 4)
    assert not [line for line in fig.axes[1].get_lines() if "peak" in line.get_label()]  # ... and only there
    matplotlib.pyplot.close("all")


def test_peak_against_saved_says_what_the_h200_sweep_shows():
    config = get_preset("medium").model
    table = bm.peak_versus_saved(H200_BY_BATCH, H200_BY_SEQ, config)
    assert len(table) == 10 and set(table.sweep) == {"batch", "seq"}
    assert table["excess MiB"].iloc[-1] == pytest.approx(17160.634 - 16304.156)
    assert table["one layer's S x S MiB"].iloc[-1] == pytest.approx(4 * 8 * 2048**2 * 4 / 2**20)
    batch, seq = bm.describe_peak_growth(table)
    assert batch.startswith("batch sweep") and "grows about as fast" in batch
    assert seq.startswith("seq sweep") and "grows more slowly" in seq and "highest at seq 128" in seq
    assert "100 -> 856 MiB" in seq  # the jump at the longest sequence
    assert "faster" not in batch + seq  # the question no longer presumes it


def test_growth_verdict_thresholds_and_the_cpu_sentence():
    assert bm.growth_verdict(1.2, 1.0) == "faster"
    assert bm.growth_verdict(0.9, 1.0) == "more slowly"
    assert bm.growth_verdict(1.04, 1.0) == "about as fast"
    table = bm.peak_versus_saved(H200_BY_BATCH.assign(**{"GPU peak above held MiB": None}),
                                 H200_BY_SEQ.assign(**{"GPU peak above held MiB": None}), get_preset("medium").model)
    assert table["peak / saved"].isna().all()
    assert bm.describe_peak_growth(table) == [bm.describe_peak_growth(table)[0]]
    assert "No device peak" in bm.describe_peak_growth(table)[0]


def test_large_preset_fit_is_the_arithmetic_of_question_1():
    large = get_preset("large")
    fit = bm.training_fit("large", large.model, large.batch_size, large.seq_len, activations, 1.02)
    gib = 2**30
    assert fit.state_bytes == 16 * 1_010_796_544
    assert fit.state_bytes / gib == pytest.approx(15.06, abs=0.01)
    assert fit.activation_bytes / gib == pytest.approx(34.2, abs=0.05)
    assert fit.total_bytes / gib == pytest.approx(15.06 + 1.02 * 34.22, abs=0.05)  # about 50, not 65-70
    assert fit.fits and fit.total_bytes < 80e9
    per_sequence = fit.activation_bytes * 1.02 / large.batch_size
    assert fit.state_bytes + fit.largest_batch * per_sequence <= 80e9 < fit.state_bytes + (fit.largest_batch + 1) * per_sequence
    text = fit.describe()
    assert f"= {fit.total_bytes / gib:.1f} GiB" in text and "it fits in 80 GB" in text and "x 1.020" in text
    unmeasured = bm.training_fit("large", large.model, 8, 1024, activations, None)
    assert unmeasured.total_bytes == unmeasured.state_bytes + unmeasured.activation_bytes
    assert "no device peak measured" in unmeasured.describe()
    tight = bm.training_fit("large", large.model, 8, 1024, activations, 1.02, budget_bytes=40e9)
    assert not tight.fits and "does not fit" in tight.describe() and tight.largest_batch < 8
    for bad in ({"peak_factor": 0.0}, {"peak_factor": math.nan}, {"budget_bytes": 0}):
        kwargs = {"peak_factor": 1.0, **bad}
        with pytest.raises(ValueError):
            bm.training_fit("large", large.model, 8, 1024, activations, **kwargs)


def test_precision_verdicts_come_from_both_bands():
    steps = {"fp32": Band(237.8, 237.6, 238.0), "tf32": Band(75.8, 70.0, 82.0), "bf16": Band(237.0, 200.0, 250.0),
             "fp16": Band(300.0, 290.0, 310.0)}
    verdicts = bp.precision_verdicts(steps)
    assert verdicts == {name: verdict(steps["fp32"], steps[name]) for name in ("tf32", "bf16", "fp16")}
    assert [said for _, said in verdicts.values()] == ["faster", "within noise", "slower"]
    lines = bp.describe_precisions(steps)
    assert "3.14x, faster" in lines[0] and "within noise" in lines[1] and "slower" in lines[2]
    # a run that did fp32's arithmetic (the same loss bit for bit) is never credited with a speed-up
    same = bp.describe_precisions(steps, same_arithmetic=["tf32"])[0]
    assert "machine drifting" in same and "not the precision" in same
    with pytest.raises(ValueError, match="reference"):
        bp.precision_verdicts({"tf32": steps["tf32"]})


def test_precision_plot_has_error_bars_and_labels_each_bar_with_its_verdict():
    steps = {"fp32": Band(237.8, 237.6, 238.0), "tf32": Band(75.8, 70.0, 82.0), "bf16": Band(237.0, 200.0, 250.0)}
    fig = bp.plot_precisions(steps, "test", same_arithmetic=["bf16"])
    ax = fig.axes[0]
    labels = [text.get_text() for text in ax.texts]
    assert labels[0] == "reference" and labels[1] == "3.14x, faster" and labels[2].startswith("1.00x, within noise")
    assert "same arithmetic" in labels[2]
    # the error bars span p10-p90 of each run
    segments = [seg for collection in ax.collections for seg in collection.get_segments()]
    spans = sorted((round(min(s[:, 1]), 3), round(max(s[:, 1]), 3)) for s in segments)
    assert spans == sorted((round(b.p10, 3), round(b.p90, 3)) for b in steps.values())
    assert "p10-p90" in ax.get_ylabel()
    matplotlib.pyplot.close("all")


def test_phase_plot_has_p10_p90_bars():
    fig = bp.plot_phases({"forward": Band(80.0, 79.0, 82.0), "backward": Band(150.0, 149.0, 151.0)}, "test")
    ax = fig.axes[0]
    segments = [seg for collection in ax.collections for seg in collection.get_segments()]
    assert sorted((round(min(s[:, 0]), 3), round(max(s[:, 0]), 3)) for s in segments) == [(79.0, 82.0), (149.0, 151.0)]
    matplotlib.pyplot.close("all")


def _solution_cells():
    return json.loads((checkout_root() / "solutions" / "10_tinyllama_baseline.ipynb").read_text())["cells"]


def test_the_notebook_prints_what_its_answers_rely_on_and_quotes_no_measured_memory():
    cells = _solution_cells()
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    markdown = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    for call in ("baseline_memory.training_fit(", "baseline_memory.loglog_slope(", "baseline_memory.sequence_terms(",
                 "baseline_memory.describe_peak_growth(", "baseline_plots.plot_activation_sweeps(",
                 "baseline_plots.plot_precisions(", "baseline_plots.describe_precisions(",
                 "baseline_plots.precision_verdicts("):
        assert call in code, call
    assert "check_faster(" not in code  # a faster sentence comes from both runs' bands
    answers = markdown[markdown.index("<!-- BEGIN ANSWER -->"):]
    quoted = re.findall(r"\d[\d.,]*\s*(?:GiB|MiB|GB)\b", answers)
    assert quoted == ["80 GB"] * len(quoted), f"an answer quotes a memory figure the run prints: {quoted}"
    assert "quadratic in the sequence" not in markdown.replace("linear plus quadratic in the sequence", "")
    assert "plt.subplots" not in code  # the figures are drawn by tinyllama.course.baseline_plots


# ------------------------------------------------------------------------------------------------
# Each exercise through its cells: the reference passes, each typical mistake fails with its own message
# ------------------------------------------------------------------------------------------------

from types import SimpleNamespace  # noqa: E402

from notebook_exercises import SolutionExercises  # noqa: E402

from tinyllama import device as dev  # noqa: E402


@pytest.fixture(scope="module")
def solution():
    return SolutionExercises("10_tinyllama_baseline")


def _run(solution, exercise, namespace, replace=None):
    """The exercise's cell (with ``replace`` planted), then its check cell."""
    solution.run(exercise, namespace, replace)


def _run_slip(solution, capsys, exercise, namespace, replace, message, others):
    """Run ``exercise`` with the mistake ``replace`` planted: its check fails, says ``message`` and none of
    the messages of the other slips (``others``)."""
    _run(solution, exercise, namespace, replace)
    shown = capsys.readouterr().out
    assert "CHECK:" in shown and "PASS" not in shown, shown
    assert message in shown, shown
    named = [text for text in others if text != message and text in shown]
    assert not named, f"the feedback names other mistakes too: {named}\n{shown}"


def _passes(solution, capsys, exercise, namespace):
    _run(solution, exercise, namespace)
    shown = capsys.readouterr().out
    assert "PASS" in shown and "CHECK:" not in shown, shown


PARAMETER_SLIPS = [  # (the solution's text, the slip, what the check must say)
    ("return 2 * vocab * hidden", "return vocab * hidden", "misses the output head lm_head"),
    ("kv_width = kv_heads * (hidden // heads)", "kv_width = hidden", "counted at full width"),
    ("+ layers * (attention + swiglu + norms) + hidden", "+ layers * (attention + swiglu + norms)",
     "misses the final RMSNorm"),
    ("swiglu = 3 * hidden * intermediate", "swiglu = 2 * hidden * intermediate", "one of the three SwiGLU matrices"),
]


def test_parameter_formula_reference_passes(solution, capsys, lenient):
    _passes(solution, capsys, "10.1", {"baseline_checks": bc})


@pytest.mark.parametrize("old, new, message", PARAMETER_SLIPS, ids=[s[1] for s in PARAMETER_SLIPS])
def test_each_parameter_slip_fails_with_its_own_message(solution, capsys, lenient, old, new, message):
    _run_slip(solution, capsys, "10.1", {"baseline_checks": bc}, (old, new), message,
              [text for *_, text in PARAMETER_SLIPS])


FLOPS_SLIPS = [
    ("attention = 3 * config.num_layers * 2 * (2 * seq_len * h)", "attention = 0",
     "the attention products are missing"),
    ("attention = 3 * config.num_layers * 2 * (2 * seq_len * h)", "attention = 3 * config.num_layers * 2 * (seq_len * h)",
     "only half of the attention square"),
    ("return 6 * matmul_params + attention", "return 2 * matmul_params + attention / 3", "a forward pass only"),
    ("return 6 * matmul_params + attention", "return 4 * matmul_params + attention * 2 / 3",
     "your count is twice the forward"),
    (" + config.vocab_size * h\n", "\n", "the output head is missing"),
    ("2 * h * h + 2 * h * kv + 3", "2 * h * h + 2 * h * h + 3", "counted at full width"),
    ("return 6 * matmul_params + attention", "return 6 * config.num_parameters() + attention",
     "6N with N = all parameters"),
]


def test_flops_formula_reference_passes(solution, capsys, lenient):
    _passes(solution, capsys, "10.2", {"baseline_checks": bc})


@pytest.mark.parametrize("old, new, message", FLOPS_SLIPS, ids=[s[1] for s in FLOPS_SLIPS])
def test_each_flops_slip_fails_with_its_own_message(solution, capsys, lenient, old, new, message):
    _run_slip(solution, capsys, "10.2", {"baseline_checks": bc}, (old, new), message, [text for *_, text in FLOPS_SLIPS])


RATIO_SLIPS = [
    ("1.0", "one matmul per forward matmul"),
    ("3.0", "a whole training step"),
    ("0.5", "that is forward / backward"),
    ("1 / 3", "the forward's share of the step"),
    ("200", "a percentage"),
    ("None", "write the ratio you expect as a number"),
]


def test_backward_ratio_reference_passes_and_its_check_cell_shows_no_answer(solution, capsys, lenient):
    _passes(solution, capsys, "10.3", {"baseline_checks": bc})
    cells = solution.nb.cells
    check = next(cells[i].source for i in range(solution.found["10.3"][0] + 1, len(cells))
                 if cells[i].cell_type == "code")
    assert "2.0" not in check and "1.9" not in check and "dx = dy" not in check  # the answer is in the module


@pytest.mark.parametrize("value, message", RATIO_SLIPS, ids=[s[0] for s in RATIO_SLIPS])
def test_each_backward_ratio_slip_fails_with_its_own_message(solution, capsys, lenient, value, message):
    _run_slip(solution, capsys, "10.3", {"baseline_checks": bc}, ("= 2.0", f"= {value}"), message,
              [text for _, text in RATIO_SLIPS])


ACTIVATION_SLIPS = [
    (" + batch * config.num_heads * seq * seq", "", "the softmax output is missing"),
    ("batch * config.num_heads * seq * seq", "batch * config.num_kv_heads * seq * seq",
     "counts one S x S matrix per key/value head"),
    ("batch * config.num_heads * seq * seq", "config.num_heads * seq * seq", "the S^2 term has no batch factor"),
    ("10 * batch * seq * h", "(8 * h + 2 * config.kv_dim) * batch * seq", "K and V are counted at kv_heads * head_dim"),
    (" + 4 * batch * seq * i", "", "the SwiGLU tensors of width intermediate are missing"),
    (" + batch * seq * config.vocab_size", "", "the loss's log-softmax is missing"),
    ("config.num_layers * per_layer", "per_layer", "counted for one layer"),
    ("return 4 * (", "return 2 * (", "your count is half"),
    ("return 4 * (", "return 1 * (", "your count is a quarter"),
]


def test_activation_formula_reference_passes(solution, capsys, lenient):
    _passes(solution, capsys, "10.5", {"baseline_checks": bc})


@pytest.mark.parametrize("old, new, message", ACTIVATION_SLIPS, ids=[s[2][:30] for s in ACTIVATION_SLIPS])
def test_each_activation_slip_fails_with_its_own_message(solution, capsys, lenient, old, new, message):
    _run_slip(solution, capsys, "10.5", {"baseline_checks": bc}, (old, new), message,
              [text for *_, text in ACTIVATION_SLIPS])


def test_every_activation_slip_is_caught_by_the_checks_cases():
    """Each listed slip is off by more than the check's 10% somewhere in its cases (else it would pass)."""
    cases = bc.ACTIVATION_CASES + bc.SYNTHETIC_ACTIVATION_CASES
    points = [(bc.shape_config(shape, max_seq), b, s) for shape, max_seq, pts in cases for b, s in pts]
    for text, slip in bc.ACTIVATION_SLIPS:
        assert any(abs(slip(c, b, s) / bc.measured_activation_bytes(c, b, s) - 1) > 0.10 for c, b, s in points), text
    for c, b, s in points:  # and the reference is well within it
        assert abs(bc.reference_activation_bytes(c, b, s) / bc.measured_activation_bytes(c, b, s) - 1) < 0.03


def _fits_namespace():
    config = get_preset("ci").model
    model = build("v1", config)
    return {"baseline_checks": bc, "bench": bench, "dev": dev, "torch": torch, "sweep_config": config,
            "sweep_model": model, "trainer": bench.TrainingStep(model, "fp32", torch.device("cpu")), "seq_len": 16,
            "device": torch.device("cpu"), "profile": SimpleNamespace(baseline_batch_sizes=(2, 4))}


FITS_SLIPS = [
    ("        trainer.optimizer.zero_grad(set_to_none=True)\n", "", "still hold a gradient"),
    ("set_to_none=True", "set_to_none=False", "hold a gradient of zeros"),
    ("except torch.OutOfMemoryError:", "except ValueError:", "let the out-of-memory error escape"),
    ("        return False\n", "        pass\n", "returned None after an out-of-memory error"),
    ("        return True\n", "        pass\n", "did not return True for a batch that fits"),
]


def test_fits_reference_passes(solution, capsys, lenient):
    _passes(solution, capsys, "10.8", _fits_namespace())


@pytest.mark.parametrize("old, new, message", FITS_SLIPS, ids=[s[2] for s in FITS_SLIPS])
def test_each_fits_slip_fails_with_its_own_message(solution, capsys, lenient, old, new, message):
    _run_slip(solution, capsys, "10.8", _fits_namespace(), (old, new), message, [text for *_, text in FITS_SLIPS])
