"""Every solution notebook follows the course's standard shape, and its stored outputs come from one
clean run from top to bottom."""

import re

import nbformat
import pytest

from tinyllama.course.results import checkout_root

SOLUTIONS = sorted((checkout_root() / "solutions").glob("*.ipynb"))


def test_there_are_solution_notebooks():
    assert [path.name for path in SOLUTIONS][:1] == ["00_environment_check.ipynb"]


@pytest.fixture(params=SOLUTIONS, ids=lambda path: path.stem)
def notebook(request):
    return request.param.stem, nbformat.read(request.param, as_version=4)


def _code(nb):
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def test_name_is_numbered(notebook):
    name, _ = notebook
    assert re.fullmatch(r"\d\d_[a-z0-9_]+", name)


def test_starts_with_learning_objectives(notebook):
    _, nb = notebook
    assert nb.cells[0].cell_type == "markdown" and "Learning objectives" in nb.cells[0].source


def test_first_code_cell_starts_a_session_named_after_the_file(notebook):
    name, nb = notebook
    assert f'course.start("{name}")' in _code(nb)[0].source


def test_has_checkpoints_a_record_step_and_a_finish(notebook):
    _, nb = notebook
    code = "\n".join(cell.source for cell in _code(nb))
    markdown = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")
    assert re.search(r"course\.(check\w*|checkpoint)\(", code)
    assert "session.record(" in code and "Record your result" in markdown
    assert "session.finish(globals())" in _code(nb)[-1].source


def test_has_a_plot_and_a_compared_cell(notebook):
    _, nb = notebook
    outputs = [output for cell in _code(nb) for output in cell.outputs]
    assert any("image/png" in output.get("data", {}) for output in outputs), "plots are shown inline"
    assert any("# NBVAL_CHECK_OUTPUT" in cell.source for cell in _code(nb)), "at least one fact is compared"


def test_stored_outputs_come_from_one_clean_run(notebook):
    _, nb = notebook
    counts = [cell.execution_count for cell in _code(nb)]
    assert counts == list(range(1, len(counts) + 1)), "run the notebook top to bottom in a fresh kernel"
    errors = [output for cell in _code(nb) for output in cell.outputs if output.output_type == "error"]
    assert not errors
    texts = "".join(output.get("text", "") for cell in _code(nb) for output in cell.outputs)
    assert "CHECK:" not in texts, "a checkpoint failed in the stored run"
