"""Notebook 18 (the roofline): its exercise checks catch plausible wrong answers, and the library pieces it
stands on state facts that would be false if they were wrong (the intensity formulas against PyTorch's
FLOP counter, notebook 00's ceilings found only for the same device, labels kept apart, no point drawn
above its roof)."""

import json
import math

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from notebook_exercises import SolutionExercises  # noqa: E402

from tinyllama import course  # noqa: E402
from tinyllama import device as dev  # noqa: E402
from tinyllama.config import get_preset  # noqa: E402
from tinyllama.costs import intensity  # noqa: E402
from tinyllama.course import roofline_checks  # noqa: E402
from tinyllama.course.checkpoints import CheckpointFailed  # noqa: E402
from tinyllama.course.results import checkout_root  # noqa: E402
from tinyllama.profiling import roofline  # noqa: E402
from tinyllama.profiling.attribution import _signature  # noqa: E402
from tinyllama.timing import summarize  # noqa: E402

pytestmark = pytest.mark.usefixtures("strict")

PATH = checkout_root() / "solutions" / "18_roofline.ipynb"
MEDIUM = get_preset("medium")
# A device whose ridge points fall between the kernels' intensities: bf16 300 TFLOP/s, fp32 30, 1.5 TB/s.
ROOFS = roofline.Roofs("test GPU", {"fp32": 30.0, "bf16": 300.0}, 1.5)


@pytest.fixture(scope="module")
def notebook():
    return SolutionExercises(PATH.stem)


def _namespace(**extra):
    """What the exercise cells find in the notebook: the medium preset in bf16 on the test roofs."""
    namespace = {"torch": torch, "math": math, "pd": pd, "course": course, "intensity": intensity,
                 "roofline": roofline, "display": lambda *a, **k: None,
                 "check_roof_position": roofline_checks.check_roof_position,
                 "check_gemm_and_add": roofline_checks.check_gemm_and_add,
                 "check_norm_and_attention": roofline_checks.check_norm_and_attention,
                 "check_idle_shares": roofline_checks.check_idle_shares,
                 "config": MEDIUM.model, "batch_size": MEDIUM.batch_size, "seq_len": MEDIUM.seq_len, "itemsize": 2,
                 "precision": "bf16", "roofs": ROOFS, "on_gpu": True}
    namespace.update(extra)
    return namespace


def _run(notebook, exercise, replace=None, namespace=None, check=True):
    """Run the cells before ``exercise``'s solution that it needs, its solution (with ``replace`` = (old, new)
    applied) and its check cell, in ``namespace``."""
    return notebook.run(exercise, _namespace() if namespace is None else namespace, replace, check)


def _through(notebook, last):
    """A namespace in which the exercises before ``last`` ran with the reference answers."""
    namespace = _namespace()
    for exercise in ("18.1", "18.2", "18.3"):
        if exercise == last:
            break
        _run(notebook, exercise, namespace=namespace)
    return namespace


def test_the_exercises_and_their_order(notebook):
    assert notebook.ids() == ["18.1", "18.2", "18.3", "18.4"]


def test_the_reference_answers_pass(notebook):
    namespace = _through(notebook, None)
    table = namespace["mine"].set_index("kernel")
    # At the medium preset in bf16 (ridge 200 FLOP/byte here) the GEMM lies right of the ridge; the causal attention,
    # credited with the triangle it computes (about 171 FLOP/byte, half the full square's 341), left of it, as the
    # add and RMSNorm.
    assert table.loc["attention", "intensity"] == pytest.approx(341.3 * 513 / 1024, rel=1e-3)
    assert list(table["predicted_bound"]) == ["compute", "memory", "memory", "memory"]


@pytest.mark.parametrize("old, new, message", [
    ("gemm_flops = 2 * tokens * h * inter", "gemm_flops = tokens * h * inter", "a multiply-add is two FLOPs"),
    ("gemm_bytes = itemsize * (tokens * h + h * inter + tokens * inter)",
     "gemm_bytes = itemsize * (tokens * h + h * inter)", "The output (tokens x intermediate) is written too"),
    ("add_bytes = 3 * itemsize * tokens * h", "add_bytes = 2 * itemsize * tokens * h",
     "Only the two inputs counted: the output is written too"),
    ("add_bytes = 3 * itemsize * tokens * h", "add_bytes = 3 * tokens * h", "residual add intensity = 0.3333"),
    ("gemm_bytes = itemsize * (", "gemm_bytes = (", "Elements counted, not bytes"),
])
def test_gemm_and_add_mistakes_fail(notebook, old, new, message):
    with pytest.raises(CheckpointFailed, match="intensity") as failed:
        _run(notebook, "18.1", (old, new))
    assert message in str(failed.value)


@pytest.mark.parametrize("old, new, message", [
    ("norm_bytes = itemsize * (2 * tokens * h + h)", "norm_bytes = itemsize * tokens * h",
     "y is written too (count its bytes), or elements were counted"),  # y never written, 2-byte elements
    ("attn_flops = 2 * (2 * batch_size", "attn_flops = (2 * batch_size", "Half the reference: two products"),
    ("pairs = seq_len * (seq_len + 1) // 2", "pairs = seq_len * seq_len", "The full seq x seq square"),
    ("pairs = seq_len * (seq_len + 1) // 2", "pairs = seq_len * (seq_len + 1) // 4", "Half the reference"),
    ("(2 * heads + 2 * kv_heads)", "(4 * heads)", "k and v have num_kv_heads heads, not num_heads"),
    ("attn_flops = 2 * (2 * batch_size * heads * pairs * head_dim)", "attn_flops = 2 * batch_size * heads * pairs * head_dim / 2",
     "A quarter: two products of two FLOPs"),
    ("attn_bytes = itemsize * batch_size * seq_len * head_dim",
     "attn_bytes = itemsize * batch_size * seq_len * seq_len", "attention intensity = "),  # the scores counted
])
def test_norm_and_attention_mistakes_fail(notebook, old, new, message):
    namespace = _through(notebook, "18.2")
    with pytest.raises(CheckpointFailed) as failed:
        _run(notebook, "18.2", (old, new), namespace=namespace)
    assert message in str(failed.value)


def test_a_norm_without_its_output_is_named_apart_from_elements_for_bytes_at_four_bytes(notebook):
    namespace = _through(notebook, "18.2")
    namespace["itemsize"] = 4
    _run(notebook, "18.1", namespace=namespace)
    with pytest.raises(CheckpointFailed, match="y is written too: count its bytes"):
        _run(notebook, "18.2", ("norm_bytes = itemsize * (2 * tokens * h + h)", "norm_bytes = itemsize * (tokens * h + h)"),
             namespace=namespace)
    with pytest.raises(CheckpointFailed, match="Elements counted, not bytes"):
        _run(notebook, "18.2", ("norm_bytes = itemsize * (2 * tokens * h + h)", "norm_bytes = 2 * tokens * h + h"),
             namespace=namespace)


def test_the_full_square_gets_its_own_hint(notebook, capsys):
    namespace = _through(notebook, "18.2")
    with pytest.raises(CheckpointFailed):
        _run(notebook, "18.2", ("pairs = seq_len * (seq_len + 1) // 2", "pairs = seq_len * seq_len"), namespace=namespace)
    assert "The full seq x seq square" in capsys.readouterr().out


def test_the_triangle_without_its_diagonal_is_accepted(notebook):
    # seq^2 / 2 differs from seq (seq + 1) / 2 by 1/seq: "about half the square" is the lesson, not the diagonal.
    namespace = _through(notebook, "18.2")
    _run(notebook, "18.2", ("pairs = seq_len * (seq_len + 1) // 2", "pairs = seq_len * seq_len // 2"), namespace=namespace)


ROOF_SLIPS = [  # (the solution's text, the slip, what the check must say)
    ("return min(memory_roof, compute_tflops), bound", "return max(memory_roof, compute_tflops), bound",
     "the higher of the two roofs"),
    ("return min(memory_roof, compute_tflops), bound", "return memory_roof, bound",
     "the memory roof everywhere"),
    ("return min(memory_roof, compute_tflops), bound", "return compute_tflops, bound",
     "the compute roof everywhere"),
    ("memory_roof = intensity * bandwidth_tbs", "memory_roof = intensity / bandwidth_tbs",
     "divides the intensity by the bandwidth"),
    ('"compute" if intensity >= compute_tflops / bandwidth_tbs else "memory"',
     '"memory" if intensity >= compute_tflops / bandwidth_tbs else "compute"', "memory and compute are swapped"),
    # at the ridge itself both roofs are equal: > and >= are both right there
    ("intensity >= compute_tflops / bandwidth_tbs", "intensity >= bandwidth_tbs / compute_tflops",
     "the ridge is upside down"),
]


@pytest.mark.parametrize("old, new, message", ROOF_SLIPS, ids=[slip[2] for slip in ROOF_SLIPS])
def test_each_roof_position_slip_fails_with_its_own_message(notebook, old, new, message):
    namespace = _through(notebook, "18.3")
    with pytest.raises(CheckpointFailed) as failed:
        _run(notebook, "18.3", (old, new), namespace=namespace)
    text = str(failed.value)
    assert "roof_position differs from the library" in text and message in text
    others = [m for _, _, m in ROOF_SLIPS if m != message and m in text]
    assert not others, f"the feedback names other mistakes too: {others}"


def test_a_roof_position_of_no_known_kind_gets_the_general_hint(notebook):
    namespace = _through(notebook, "18.3")
    with pytest.raises(CheckpointFailed, match="Is the attainable rate the lower of the two roofs"):
        _run(notebook, "18.3", ("return min(memory_roof, compute_tflops), bound",
                                "return min(memory_roof, compute_tflops) / 2, bound"), namespace=namespace)


@pytest.mark.parametrize("roofs", [ROOFS, roofline.Roofs("ridge 1", {"fp32": 2.0}, 2.0)])
def test_the_roof_cases_separate_every_slip(roofs):
    """With the made-up roofs, each slip differs from the answer and from every other slip, even on a device
    whose fp32 ridge is 1 FLOP/byte (where the ridge upside down is the ridge)."""
    cases = []
    for case_roofs in (roofs, *roofline_checks.MADE_UP_ROOFS):
        ridge = case_roofs.ridge("fp32")
        cases += [(ridge * f, case_roofs.compute("fp32"), case_roofs.bandwidth_tbs) for f in roofline_checks.RIDGE_FACTORS]
    outcomes = {name: [rule(*case) for case in cases] for name, rule, _ in roofline_checks.ROOF_SLIPS}
    outcomes["answer"] = [(min(i * b, c), "compute" if i >= c / b else "memory") for i, c, b in cases]
    for a in outcomes:
        for b in outcomes:
            assert a == b or not all(map(roofline_checks._same_position, outcomes[a], outcomes[b])), (a, b)


def test_the_roof_check_speaks_of_this_devices_ridge(notebook, capsys):
    _through(notebook, None)
    assert "PASS: roof_position agrees with the library's rule at 6 intensities around the fp32 ridge (20 FLOP/byte)" \
        in capsys.readouterr().out


def _idle_namespace(v4_busy=38.0):
    step = {"V1": summarize([100.0, 101.0, 99.0]), "V4": summarize([40.0, 41.0, 39.0])}
    return _namespace(points={"V1": None, "V4": None}, step_ms=step, device_ms={"V1": 60.0, "V4": v4_busy},
                      predicted_device_speedup=2.0, predicted_v1_idle_pct=20.0)


def test_the_idle_share_passes(notebook, capsys):
    namespace = _run(notebook, "18.4", namespace=_idle_namespace())
    assert namespace["idle_pct"]["V1"] == pytest.approx(40.0) and namespace["idle_ok"]
    shown = capsys.readouterr().out
    assert "PASS: V1: idle share of the step = 40 % is plausible (between 39.5 and 40.5 %). (step 100 ms - busy 60 ms) " \
           "/ step." in shown and "CHECK" not in shown
    # A busy time a little above the median step (rounding): the idle time is 0, not negative.
    namespace = _run(notebook, "18.4", namespace=_idle_namespace(v4_busy=40.2))
    assert namespace["idle_ms"]["V4"] == 0.0


IDLE_PCT = "idle_pct[label] = 100 * idle_ms[label] / step_ms[label].median"
IDLE_MS = "idle_ms[label] = max(step_ms[label].median - device_ms[label], 0.0)"
IDLE_SLIPS = [  # (the solution's text, the slip, the busy time of V4, what the check must say)
    (IDLE_PCT, "idle_pct[label] = 100 * device_ms[label] / step_ms[label].median", 38.0, "That is the busy share"),
    (IDLE_PCT, "idle_pct[label] = idle_ms[label] / step_ms[label].median", 38.0, "A fraction, not a percent"),
    (IDLE_PCT, "idle_pct[label] = 100 * idle_ms[label] / device_ms[label]", 38.0, "Divided by the busy time"),
    (IDLE_PCT, "idle_pct[label] = idle_ms[label]", 38.0, "the idle time in milliseconds, not its percent"),
    (IDLE_MS, "idle_ms[label] = device_ms[label]", 38.0, "that is the device's busy time"),
    (IDLE_MS, "idle_ms[label] = (step_ms[label].median - device_ms[label]) / 1e3", 38.0, "in seconds"),
    (IDLE_MS, "idle_ms[label] = step_ms[label].median - device_ms[label]", 40.2, "the idle time is never negative"),
]


@pytest.mark.parametrize("old, new, busy, message", IDLE_SLIPS, ids=[slip[3] for slip in IDLE_SLIPS])
def test_each_idle_share_slip_fails_with_its_own_message(notebook, old, new, busy, message):
    with pytest.raises(CheckpointFailed) as failed:
        _run(notebook, "18.4", (old, new), namespace=_idle_namespace(v4_busy=busy))
    text = str(failed.value)
    assert message in text
    others = [m for _, _, _, m in IDLE_SLIPS if m != message and m in text]
    assert not others, f"the feedback names other mistakes too: {others}"


# --------------------------------------------------------------------------------------------------
# The library the notebook stands on
# --------------------------------------------------------------------------------------------------


def test_gemm_and_attention_flops_agree_with_pytorchs_counter():
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        a, b = torch.empty(37, 19), torch.empty(19, 23)
        q, k, v = torch.empty(2, 4, 33, 8), torch.empty(2, 4, 33, 8), torch.empty(2, 4, 33, 8)
    with FlopCounterMode(display=False) as counter:
        a @ b
    assert intensity.gemm_work(37, 23, 19, 4).flops == counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        scores = q @ k.transpose(-1, -2)
        scores @ v
    # Written out, the two products compute the full square (V1: the masked half is computed, then masked).
    assert intensity.attention_work(2, 4, 4, 33, 8, 4, causal=False).flops == counter.get_total_flops()


def test_causal_attention_work_is_what_the_roofline_credits_a_causal_kernel_with():
    from tinyllama.profiling.attribution import count_operator_work

    q, k, v = torch.randn(2, 4, 33, 8), torch.randn(2, 2, 33, 8), torch.randn(2, 2, 33, 8)
    work = count_operator_work(
        lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    attention = work[work["category"] == "attention"]
    expected = intensity.attention_work(2, 4, 2, 33, 8, 4).flops
    assert attention["flops"].sum() == expected == 4 * 2 * 4 * (33 * 34 // 2) * 8  # the triangle with its diagonal
    assert expected < intensity.attention_work(2, 4, 2, 33, 8, 4, causal=False).flops


def test_model_kernels_bytes_and_the_attention_of_the_model_count():
    from tinyllama.costs import flops

    config, batch, seq = MEDIUM.model, MEDIUM.batch_size, MEDIUM.seq_len
    table = intensity.model_kernels(config, batch, seq, 2).set_index("kernel")
    tokens = batch * seq
    assert table.loc["element-wise", "bytes"] == 3 * 2 * tokens * config.hidden_dim
    assert table.loc["RMSNorm", "bytes"] == 2 * (2 * tokens * config.hidden_dim + config.hidden_dim)
    # The model count (MFU) credits attention with the full square, per layer; the fused causal kernel of the
    # exercise does the lower triangle with its diagonal: (seq + 1) / (2 seq) of it.
    attention_per_layer = (flops.forward_flops(config, batch, seq)
                           - 2 * flops.matmul_parameters(config) * tokens) / config.num_layers
    assert table.loc["attention", "flops"] == attention_per_layer * (seq + 1) / (2 * seq)
    with pytest.raises(ValueError):
        intensity.gemm_work(0, 1, 1, 2)


def _write_record(directory, device_name, profile, figures, notebook="00_environment_check"):
    entry = {"time": "2026-11-23T07:00:00+00:00", "notebook": notebook, "profile": profile,
             "environment": {"device": device_name}, "figures": figures}
    with open(directory / "results.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")


def test_device_ceilings_reads_notebook_00_only_for_this_device_and_size(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(tmp_path))
    profile = course.PROFILES["ci"]
    here = dev.device_name(torch.device("cpu"))
    figures = {"matmul_fp32_tflops": 1.5, "matmul_bf16_tflops": 2.5, "matmul_size": profile.matmul_size,
               "copy_tbs": 0.25}
    _write_record(tmp_path, here, "ci", figures)
    found = course.device_ceilings("cpu", profile, ("fp32", "bf16"), quiet=True)
    assert found.recorded and found.roofs.compute_tflops == {"fp32": 1.5, "bf16": 2.5} and found.copy_tbs == 0.25
    assert "notebook 00" in found.source
    # A later record of another device, or at another matrix size, is not this device's.
    _write_record(tmp_path, "NVIDIA H200", "ci", {**figures, "copy_tbs": 4.0})
    _write_record(tmp_path, here, "ci", {**figures, "matmul_size": 2 * profile.matmul_size, "copy_tbs": 9.0})
    assert course.device_ceilings("cpu", profile, ("fp32",), quiet=True).copy_tbs == 0.25


def test_device_ceilings_measures_when_nothing_fits(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(tmp_path))
    profile = course.PROFILES["ci"]
    _write_record(tmp_path, "NVIDIA H200", "ci", {"matmul_fp32_tflops": 50.0, "matmul_size": profile.matmul_size,
                                                   "copy_tbs": 4.0})
    found = course.device_ceilings("cpu", profile, ("fp32",))
    assert not found.recorded and found.copy_tbs != 4.0 and found.roofs.compute("fp32") > 0
    assert "notebook 00 recorded none on this device" in capsys.readouterr().out
    with pytest.raises(ValueError):
        course.device_ceilings("cpu", profile, ("fp8",))


def _crowded_points(label):
    rows = [{"operator": f"aten::op{i}", "category": "element-wise", "flops": 1e9 * (1 + 0.01 * i), "bytes": 4e9,
             "time_ms": 10.0 * (1 + 0.01 * i), "precision": "fp32", "flop_source": "estimate"} for i in range(6)]
    rows.append({"operator": "aten::mm", "category": "GEMM (projections)", "flops": 1e12, "bytes": 2e9, "time_ms": 5.0,
                 "precision": "bf16", "flop_source": "flop_counter"})
    frame = roofline.classify(pd.DataFrame(rows), ROOFS)
    frame.insert(0, "label", label)
    return frame


def test_plot_labels_do_not_overlap_even_for_crowded_points():
    import matplotlib.pyplot as plt

    fig, (ax, _) = plt.subplots(1, 2, figsize=(12, 6))
    roofline.plot_roofline({"V1": _crowded_points("V1"), "V4": _crowded_points("V4")}, ROOFS, ax=ax, top=6)
    assert roofline.overlapping_labels(fig) == []
    assert sum(t.get_visible() and bool(t.get_text()) for t in ax.texts) >= 4  # labels were placed, not all hidden
    plt.close(fig)


def test_a_point_above_its_roof_is_refused_by_the_strict_plot():
    frame = _crowded_points("V1")
    frame.loc[0, "time_ms"] = 1e-4  # 1 GFLOP in 0.1 us: far above any roof
    assert list(roofline.check_physical(frame, ROOFS)["operator"]) == ["aten::op0"]
    with pytest.raises(roofline.AboveRoofError):
        roofline.plot_roofline({"V1": frame}, ROOFS, strict=True)


def test_call_signatures_without_dtypes_keep_the_tensor_shapes():
    # An older profiler records shapes but no dtypes: scalars and tensor lists have no plain shape.
    assert _signature([[4, 8], [], [[1, 2], [3]], [8, 2]], None) == ((4, 8), (8, 2))
    assert _signature([[4, 8], [8]], ["float", "Scalar"]) == ((4, 8),)
    assert _signature(None, None) is None


def test_vendor_roofline_without_the_tool_runs_nothing_and_gives_the_commands(tmp_path, monkeypatch):
    from tinyllama.profiling import vendor
    from tinyllama.profiling import vendor_roofline as vr

    result = vr.vendor_roofline("v1", "ci", "fp32", 5, tmp_path) if dev.backend() == "cpu" else None
    if result is not None:
        assert not result.ran and result.tool is None and "no GPU" in result.reason
    # A GPU machine without ncu: nothing runs, the reason names the tool, the command is there to copy.
    monkeypatch.setattr(vr.dev, "backend", lambda: "cuda")
    monkeypatch.setattr(vendor, "detect_tool", lambda name, timeout_s=30.0: vendor.ToolInfo(
        name, "cuda", None, None, False, f"{name} not found on PATH"))
    result = vr.vendor_roofline("v1", "medium", "bf16", 7, tmp_path)
    assert (result.tool, result.ran) == ("ncu", False) and "ncu not found" in result.reason
    assert "--launch-count 7" in result.commands["cuda"]
    assert "ncu_step --version v1 --preset medium" in result.commands["cuda"]
    assert result.commands["rocm"].startswith("rocprof-compute profile") and "--roof-only" in result.commands["rocm"]
