"""The participant notebooks are generated from the solutions, and the committed ones are current."""

import shutil

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from tinyllama import course
from tinyllama.course import make_notebooks as mk
from tinyllama.course.results import checkout_root

ROOT = checkout_root()
SOLUTIONS, NOTEBOOKS = ROOT / "solutions", ROOT / "notebooks"

SOLUTION_CELL = '''\
# NBVAL_CHECK_OUTPUT
def tokens_per_second(batch, seq_len, step_ms):
    """Throughput of one training step."""
    # BEGIN SOLUTION
    # HINT: divide the tokens of one batch by the step time in seconds
    tokens = batch * seq_len
    return tokens / (step_ms / 1e3)
    # END SOLUTION

# BEGIN SOLUTION
# HINT: call tokens_per_second for batch 8, sequence 128 and 21.7 ms
# HINT: and store it in `rate`
rate = tokens_per_second(8, 128, 21.7)
# END SOLUTION
print(rate)'''


def test_solution_blocks_become_todos_at_their_indentation():
    out = mk.strip_solutions(SOLUTION_CELL)
    assert "NBVAL" not in out and "tokens = batch" not in out and "rate = tokens_per_second" not in out
    assert "    # TODO: divide the tokens of one batch by the step time in seconds\n    " + mk.RAISE_LINE in out
    assert "# TODO: call tokens_per_second for batch 8, sequence 128 and 21.7 ms\n# TODO: and store it in `rate`\n" \
           + mk.RAISE_LINE in out
    assert out.startswith("def tokens_per_second") and out.endswith("print(rate)")
    compile(out, "participant cell", "exec")  # still valid Python: the function body is not empty
    namespace: dict = {"course": course}  # the notebook's first cell imports it
    with pytest.raises(NotImplementedError, match="exercise"):
        exec(out, namespace)


def test_markdown_answers_are_replaced():
    source = "**Question.** Why?\n<!-- BEGIN SOLUTION -->\n<!-- HINT: one sentence -->\nBecause of bandwidth.\n<!-- END SOLUTION -->"
    assert mk.strip_solutions(source, mk.MARKDOWN) == "**Question.** Why?\n*TODO: one sentence*"


@pytest.mark.parametrize("source, match", [
    ("# BEGIN SOLUTION\n# HINT: x\n# BEGIN SOLUTION\n# END SOLUTION", "line 3: BEGIN SOLUTION inside the block opened on line 1"),
    ("x = 1\n# END SOLUTION", "line 2: END SOLUTION without a BEGIN SOLUTION"),
    ("# BEGIN SOLUTION\nx = 1\n# END SOLUTION", "line 1: the solution block has no HINT"),
    ("# BEGIN SOLUTION\n# HINT: x\nx = 1", "line 1: BEGIN SOLUTION is never closed"),
])
def test_broken_markers_are_reported_with_their_line(source, match):
    with pytest.raises(mk.MarkerError, match=match):
        mk.strip_solutions(source, where="nb, cell 3")


def _solution_notebook():
    cell = new_code_cell(SOLUTION_CELL, execution_count=4,
                         outputs=[new_output("stream", name="stdout", text="47188.9\n")])
    cell.metadata["execution"] = {"iopub.status.idle": "2026-01-01T00:00:00Z"}
    cell.metadata["tags"] = ["exercise"]
    return new_notebook(cells=[new_markdown_cell("# Title\n**Learning objectives**"), cell],
                        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                                  "language_info": {"name": "python", "version": "3.12.3"},
                                  "widgets": {"state": {}}})


def test_participant_notebook_has_no_outputs_and_stable_metadata():
    solution = _solution_notebook()
    participant = mk.participant_notebook(solution, "01_x.ipynb")
    code = participant.cells[1]
    assert code.outputs == [] and code.execution_count is None and "execution" not in code.metadata
    assert code.metadata["tags"] == ["exercise"] and code.id == solution.cells[1].id
    assert "TODO" in code.source
    assert participant.metadata.language_info == {"name": "python"} and "widgets" not in participant.metadata
    assert solution.cells[1].outputs and "BEGIN SOLUTION" in solution.cells[1].source  # solution untouched
    # Fresh outputs and another Python version in the solution leave the participant file unchanged.
    solution.cells[1].outputs = []
    solution.metadata.language_info["version"] = "3.11.9"
    assert mk.render(mk.participant_notebook(solution, "01_x.ipynb")) == mk.render(participant)


def test_committed_participant_notebooks_are_up_to_date():
    assert sorted(p.name for p in SOLUTIONS.glob("*.ipynb")) == sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    problems = mk.stale(SOLUTIONS, NOTEBOOKS)
    assert problems == [], f"{problems}: run `python -m tinyllama.course.make_notebooks`"


def test_check_mode_finds_stale_missing_and_orphan_notebooks(tmp_path, capsys):
    solutions, notebooks = tmp_path / "solutions", tmp_path / "notebooks"
    solutions.mkdir()
    nbformat.write(_solution_notebook(), solutions / "01_x.ipynb")
    args = ["--solutions", str(solutions), "--notebooks", str(notebooks)]
    assert mk.main(args + ["--check"]) == 1
    assert "01_x.ipynb: missing" in capsys.readouterr().err
    assert mk.main(args) == 0 and mk.main(args + ["--check"]) == 0

    changed = nbformat.read(solutions / "01_x.ipynb", as_version=4)
    changed.cells[0].source += "\nA new sentence."
    nbformat.write(changed, solutions / "01_x.ipynb")
    shutil.copy(notebooks / "01_x.ipynb", notebooks / "99_orphan.ipynb")
    assert mk.main(args + ["--check"]) == 1
    err = capsys.readouterr().err
    assert "01_x.ipynb: differs from its solution" in err and "99_orphan.ipynb: has no solution notebook" in err


def test_generator_reports_broken_markers_without_traceback(tmp_path, capsys):
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    nb = new_notebook(cells=[new_code_cell("# BEGIN SOLUTION\nx = 1\n# END SOLUTION")])
    nbformat.write(nb, solutions / "05_bad.ipynb")
    assert mk.main(["--solutions", str(solutions), "--notebooks", str(tmp_path / "nb")]) == 2
    assert "05_bad.ipynb, cell 0, line 1: the solution block has no HINT" in capsys.readouterr().err


def test_environment_check_runs_to_its_verdict_with_nothing_filled_in():
    """Its exercises are skeletons (a function that returns None, a dict of None) whose checks say "not
    answered yet": a participant's Run All reaches the verdict, as the browser test expects."""
    participant = nbformat.read(NOTEBOOKS / "00_environment_check.ipynb", as_version=4)
    sources = "\n".join(cell.source for cell in participant.cells)
    assert "NotImplementedError" not in sources
