"""Notebook 19 runs on an empty results folder and on a filled one (read-only: the results file only
grows by the notebook's own record, exports get new names), and its exercise checks catch plausible
wrong answers: each check is run on the reference answer (it passes) and on one typical mistake (it
fails, under WORKSHOP_STRICT=1)."""

import json

import matplotlib
import nbformat
import pytest

from tinyllama.course import results
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
    shown = []
    namespace = {"display": lambda *objects, **_: shown.extend(objects)}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            exec(compile(cell.source, f"<cell {index}>", "exec"), namespace)
    return namespace, capsys.readouterr().out


def fill(directory, profile="ci"):
    """A results folder with a few notebooks' records, as a participant on a CPU would leave it."""
    record = lambda notebook, figures: results.record(notebook, figures, profile=profile, directory=directory, quiet=True)
    record("02_precision", {"fp16_speedup_vs_fp32": 1.2, "bf16_speedup_vs_fp32": 1.5, "fp32_speedup_vs_fp32": 1.0})
    record("10_tinyllama_baseline", {"fp32_step_ms": 900.0, "tf32_speedup": 1.0, "bf16_speedup": 1.8})
    record("10_tinyllama_baseline", {"fp32_step_ms": 950.0, "tf32_speedup": 0.99, "bf16_speedup": 1.7})
    record("12_fusion", {"speedup_both": 1.1, "v2_over_v1_fp32_eager": 1.05, "focus_setting": "fp32"})
    record("06_torch_compile", {"best_compile_speedup": 2.2, "best_compile_mode": "default", "eager_ms": 50.0})
    record("01_inference_baseline", {"fp32_throughput": 10.0})  # far below the reference: a CPU against a GPU
    return directory / results.RESULTS_FILE


def test_with_nothing_recorded_it_says_so_and_uses_the_reference(notebook, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(tmp_path))
    namespace, out = run_all(notebook[0], capsys)
    assert "You have recorded nothing yet" in out and "Nothing to export" in out
    assert namespace["nothing_recorded"] and namespace["most_different"] is None
    assert namespace["largest_gain"] == namespace["checks"]["reference (best x)"].idxmax()
    # Only the notebook's own record was written.
    [entry] = results.read_records(tmp_path)
    assert entry["notebook"] == "19_results_and_wrap_up" and entry["figures"]["used_reference_figures"] is True
    assert not (tmp_path / "exports").exists()


def test_with_records_it_compares_exports_and_keeps_everything(notebook, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(tmp_path))
    path = fill(tmp_path)
    before = path.read_bytes()
    namespace, out = run_all(notebook[0], capsys)
    assert "You recorded 16 figures from 5 notebooks" in out
    assert path.read_bytes().startswith(before) and len(path.read_bytes().splitlines()) == 7
    assert namespace["largest_gain"] == "torch.compile" and namespace["largest_gain_x"] == 2.2
    assert namespace["chain"].name == "10_tinyllama_baseline" and namespace["cumulative"] == pytest.approx(1.7)
    assert namespace["cause"] == "profile"  # ci records against the gpu reference
    csv_path, md_path = namespace["exported"]
    assert csv_path.parent == tmp_path.resolve() / "exports" and len(csv_path.read_text().splitlines()) == 1 + 16
    assert "Optimization checklist" in md_path.read_text()
    # A second run exports under a new name and leaves the first export as it was.
    first = csv_path.read_bytes()
    namespace, _ = run_all(notebook[0], capsys)
    assert namespace["exported"][0] != csv_path and csv_path.read_bytes() == first
    assert len(sorted((tmp_path / "exports").glob("*.csv"))) == 2


@pytest.fixture(scope="module")
def filled_namespace(notebook, tmp_path_factory):
    directory = tmp_path_factory.mktemp("results")
    fill(directory, profile="gpu")  # a gpu-profile record made on this CPU: the device differs, not the profile
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


@pytest.mark.parametrize("exercise, mistake", [
    ("19.1", ("best_column.idxmax()", "best_column.idxmin()")),  # the smallest effect
    ("19.1", ('checks["yours (best x)"]', 'checks["reference (best x)"]')),  # the reference's winner
    ("19.2", ("times[:-1] / times[1:]", "times[1:] / times[:-1]")),  # new over old
    ("19.2", ("float(times[0] / times[-1])", "float(sum(times[:-1] / times[1:]))")),  # speed-ups added
    ("19.2", ("float(times[0] / times[-1])", "float(times[0] / times[1])")),  # only the first step
    ("19.3", ('np.log(comparable["yours / reference"]).abs().idxmax()', 'comparable["yours / reference"].idxmax()')),
    ("19.3", ('cause = "device"', 'cause = "noise"')),  # the device differs: not noise
])
def test_mistakes_fail(notebook, filled_namespace, exercise, mistake):
    with pytest.raises(CheckpointFailed):
        _run(notebook, filled_namespace, exercise, mistake)


def test_the_participant_copy_asks_for_the_prediction():
    copy = json.loads((checkout_root() / "notebooks" / PATH.name).read_text())
    sources = ["".join(cell["source"]) for cell in copy["cells"]]
    assert any("predicted_largest = None" in source for source in sources)
    assert not any("best_column.idxmax()" in source for source in sources)
