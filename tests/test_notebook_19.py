"""Notebook 19 runs on an empty results folder and on a filled one (read-only: the results file only
grows by the notebook's own record, exports get new names), reads the records of the labs (20, 21) into
its checklist, and its exercise checks catch plausible wrong answers: each check is run on the reference
answer (it passes) and on typical mistakes (each fails, under WORKSHOP_STRICT=1, with its own message)."""

import json

import matplotlib
import nbformat
import pytest

from tinyllama.course import dashboard, results
from tinyllama.course.checkpoints import CheckpointFailed
from tinyllama.course.make_notebooks import exercises
from tinyllama.course.results import checkout_root

matplotlib.use("Agg")
PATH = checkout_root() / "solutions" / "19_results_and_wrap_up.ipynb"


@pytest.fixture(autouse=True)
def ci_profile(strict, monkeypatch):
    monkeypatch.setenv("WORKSHOP_PROFILE", "ci")
    monkeypatch.delenv("WORKSHOP_RUN_ID", raising=False)


@pytest.fixture(scope="module")
def notebook():
    nb = nbformat.read(PATH, as_version=4)
    return nb, exercises(nb, PATH.stem)


def run_all(nb, capsys):
    """Execute every code cell in one namespace, as a kernel would; returns the namespace and the output."""
    namespace = {"display": lambda *objects, **_: None}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            exec(compile(cell.source, f"<cell {index}>", "exec"), namespace)
    return namespace, capsys.readouterr().out


STEPS_17 = {"precision": "bf16", "step_ms_v1_fp32": 240.0, "step_ms_v1": 64.0, "step_ms_v2": 66.0, "step_ms_v3": 35.0,
            "step_ms_v4": 30.0, "step_ms_v1_graphed": 55.0, "step_ms_v2_graphed": 55.0, "step_ms_v3_graphed": 22.5,
            "step_ms_v4_graphed": 23.0, "speedup_v4_over_v1_fp32": 8.0}


def fill(directory, profile="gpu"):
    """A results folder as an instructor's GPU run leaves it: 02, 06, 16, 17, then the labs 20 and 21."""
    record = lambda notebook, figures: results.record(notebook, figures, profile=profile, directory=directory, quiet=True)
    # 02's fp16 speed-up far below the reference's: the figure farthest from it
    record("02_precision", {"fp16_speedup_vs_fp32": 0.05, "bf16_speedup_vs_fp32": 1.3, "fp32_speedup_vs_fp32": 1.0,
                            "fp32_computes_in": "convolutions in TF32"})
    record("06_torch_compile", {"speedup_default": 2.0, "speedup_reduce-overhead": 2.02, "eager_ms": 95.0})
    record("16_sdpa_and_compile", {"precision": "bf16", "step_ms_V4 eager": 44.0, "step_ms_V4 compiled (default)": 26.5,
                                   "step_ms_V4 compiled + whole-step graphs": 23.3})
    record("17_version_comparison", STEPS_17)
    record("20_finetuning_lab", {"speedup_micro-batch": 7.8, "speedup_precision": 1.0, "speedup_checkpointing_off": 1.5,
                                 "speedup_attention_kernel": 1.2, "cumulative_speedup": 14.0})
    record("21_distributed_training", {"processes": 2, "distributed_device": "cuda", "preset": "medium",
                                       "baseline_tokens_per_s": 180e3, "tokens_per_s_ddp": 270e3,
                                       "tokens_per_s_fsdp": 150e3})
    return directory / results.RESULTS_FILE


def test_with_nothing_recorded_it_says_so_and_uses_the_reference(notebook, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(tmp_path))
    namespace, out = run_all(notebook[0], capsys)
    assert "You have recorded nothing yet" in out and "Nothing to export" in out
    assert namespace["nothing_recorded"] and namespace["most_different"] is None
    assert namespace["chain"].attrs["notebook"] == "17_version_comparison"  # the reference's chain
    # Only the notebook's own record was written.
    [entry] = results.read_records(tmp_path)
    assert entry["notebook"] == "19_results_and_wrap_up" and entry["figures"]["used_reference_figures"] is True
    assert not (tmp_path / "exports").exists()


def test_with_records_it_reads_the_labs_compares_exports_and_keeps_everything(notebook, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(tmp_path))
    path = fill(tmp_path)
    before = path.read_bytes()
    namespace, out = run_all(notebook[0], capsys)
    assert "You recorded 33 figures from 6 notebooks" in out
    assert path.read_bytes().startswith(before) and len(path.read_bytes().splitlines()) == 7
    checks = namespace["checks"].set_index(["optimization", "notebook"])
    # The labs join the checklist: 20's kept changes and 21's scaling, each from its own pair.
    assert checks.loc[("Gradient checkpointing off", "20"), "yours"] == dashboard.KEPT
    assert checks.loc[("Mixed precision (bf16/fp16)", "20"), "yours"] == dashboard.NOT_KEPT
    ddp = checks.xs("21", level="notebook").loc["Several GPUs (data parallel)"]
    assert list(ddp["yours (x)"]) == pytest.approx([1.5, 150 / 180])
    # torch.compile is credited by 16's pair, never by 17's V4 over V1 fp32.
    assert checks.loc[("torch.compile", "16"), "yours (x)"] == pytest.approx(44.0 / 26.5)
    assert not (namespace["checks"]["yours (x)"] == 8.0).any()
    chain = namespace["chain"]
    assert list(chain.index) == ["V1 fp32", "V1 bf16", "V2 bf16", "V3 bf16", "V4 bf16", "V4 bf16 graphed"]
    assert namespace["cumulative"] == pytest.approx(240 / 23)
    assert "within run-to-run variation: V2 bf16" in out
    csv_path, md_path = namespace["exported"]
    assert csv_path.parent == tmp_path.resolve() / "exports" and len(csv_path.read_text().splitlines()) == 1 + 33
    assert "Optimization checklist (controlled pairs)" in md_path.read_text()
    # A second run exports under a new name and leaves the first export as it was.
    first = csv_path.read_bytes()
    namespace, _ = run_all(notebook[0], capsys)
    assert namespace["exported"][0] != csv_path and csv_path.read_bytes() == first
    assert len(sorted((tmp_path / "exports").glob("*.csv"))) == 2


def test_against_the_reference_records_in_solutions(notebook, tmp_path, monkeypatch, capsys):
    """The stored reference run gives a chain and a checklist without a borrowed figure."""
    from tinyllama.course import reference
    ref = reference.load_reference()
    ref = ref[ref.notebook != PATH.stem]
    checks = dashboard.checklist(ref.iloc[:0], ref)
    figures = dashboard.by_notebook(ref)
    rows = checks.set_index(["optimization", "notebook"])
    if "17_version_comparison" in figures and "step_ms_v1_fp32" in figures["17_version_comparison"]:
        v17 = figures["17_version_comparison"]
        assert rows.loc[("Fused projections (V2)", "17"), "reference (x)"].iloc[0] == \
            pytest.approx(v17["step_ms_v1"] / v17["step_ms_v2"])
        assert not (checks["reference (x)"] == v17.get("speedup_v4_over_v1_fp32")).any()
        assert len(dashboard.version_chain(ref)) >= 5
    for verdict, factor in zip(checks["reference"], checks["reference (x)"]):
        assert verdict in (dashboard.FASTER, dashboard.SLOWER, dashboard.WITHIN, dashboard.KEPT, dashboard.NOT_KEPT) \
            or verdict.startswith("not "), verdict


@pytest.fixture(scope="module")
def filled_namespace(notebook, tmp_path_factory):
    directory = tmp_path_factory.mktemp("results")
    fill(directory)  # gpu-profile records, read on this CPU: the device differs, not the profile
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WORKSHOP_RESULTS_DIR", str(directory))
        patch.setenv("WORKSHOP_PROFILE", "ci")
        namespace = {"display": lambda *objects, **_: None}
        for index, cell in enumerate(notebook[0].cells):
            if cell.cell_type == "code" and "session.finish" not in cell.source:
                exec(compile(cell.source, f"<cell {index}>", "exec"), namespace)
    return namespace


def _run(notebook, namespace, exercise, replace=None):
    nb, found = notebook
    index, _ = found[exercise]
    source = nb.cells[index].source
    if replace is not None:
        assert replace[0] in source, f"the mistake's anchor {replace[0]!r} is not in the solution of {exercise}"
        source = source.replace(*replace)
    scope = dict(namespace)
    exec(source, scope)
    exec(nb.cells[index + 1].source, scope)
    return scope


def test_the_reference_answers_pass(notebook, filled_namespace):
    assert set(notebook[1]) == {"19.1", "19.2", "19.3"}
    for exercise in ("19.1", "19.2", "19.3"):
        _run(notebook, filled_namespace, exercise)
    assert _run(notebook, filled_namespace, "19.3")["cause"] == "device"


@pytest.mark.parametrize("exercise, mistake, message", [
    # 19.1: the largest ratio (everything changes), compile together with graphs, two processes, precision + fusion
    ("19.1", ('"torch.compile": "B"', '"torch.compile": "A"'),
     r"A changes precision, projections, kernels and compile together; 8x credits all of them"),
    ("19.1", ('"torch.compile": "B"', '"torch.compile": "D"'), r"D changes compile and graphs together"),
    ("19.1", ('"torch.compile": "B"', '"torch.compile": "G"'), r"timed by notebooks 16 and 17, in two processes"),
    ("19.1", ('"Fused projections (V2)": "C"', '"Fused projections (V2)": "H"'),
     r"H changes precision and projections together"),
    ("19.1", ('"Mixed precision (bf16/fp16)": "E"', '"Mixed precision (bf16/fp16)": "B"'),
     r"does not change the precision at all"),
    ("19.1", ('"torch.compile": "B"', '"torch.compile": None'), r"torch.compile: choose a comparison"),
    # 19.2: new over old, each stage over the first, no tolerance, a slow-down within variation called slower,
    # a tolerance that is linear on the slow side, a fixed 15%
    ("19.2", ("speedup = old / new", "speedup = new / old"), r"50 -> 48 -> 30 ms .*returned \[\(0\.5"),
    ("19.2", ("for old, new in zip(times[:-1], times[1:]):", "for old, new in zip([times[0]] * len(times), times[1:]):"),
     r"100 -> 50 -> 48 -> 30 ms .*returned \[\(2\.0, 'faster'\), \(2\.08"),
    ("19.2", ("if speedup > 1 + variation:", "if speedup > 1:"), r"100 -> 99 -> 101 ms"),
    ("19.2", ("elif speedup < 1 / (1 + variation):", "elif speedup < 1:"),
     r"a step 4% slower is within run-to-run variation too"),
    ("19.2", ("elif speedup < 1 / (1 + variation):", "elif speedup < 1 - variation:"),
     r"100 -> 116 ms .*the new time is 1.16 times the old"),
    ("19.2", ("if speedup > 1 + variation:", "if speedup > 1.15:"), r"use the variation you are given"),
    # 19.3: the largest ratio only, noise although the device differs, software before device, profile that is equal
    ("19.3", ('np.log(comparable["yours / reference"]).abs().idxmax()', 'comparable["yours / reference"].idxmax()'),
     r"You took the largest ratio"),
    ("19.3", ('cause = "device"', 'cause = "noise"'), r"cause = 'noise': rule the causes out in order; the device differs"),
    ("19.3", ('elif mine_row.device != ref_row.device:', 'elif False:'),
     r"cause = 'software': rule the causes out in order; the device differs"),
    ("19.3", ('cause = "device"', 'cause = "profile"'), r"cause = 'profile': yours and the reference's profile are the same"),
])
def test_mistakes_fail_with_their_own_message(notebook, filled_namespace, exercise, mistake, message):
    with pytest.raises(CheckpointFailed, match=message):
        _run(notebook, filled_namespace, exercise, mistake)


def test_the_participant_copy_asks_for_the_prediction_and_shows_no_answer():
    copy = json.loads((checkout_root() / "notebooks" / PATH.name).read_text())
    sources = ["".join(cell["source"]) for cell in copy["cells"]]
    assert any("predicted_largest_step = None" in source for source in sources)
    assert not any('"torch.compile": "B"' in source for source in sources)
    assert not any("elif speedup < 1 / (1 + variation):" in source for source in sources)
    assert not any("BEGIN ANSWER" in source for source in sources)
    for cell in copy["cells"]:  # every code cell of the participant's copy compiles (a skeleton, not a broken dict)
        if cell["cell_type"] == "code":
            compile("".join(cell["source"]), PATH.name, "exec")
