"""``run_solutions --stale`` (tinyllama.course.stale): which stored solutions hold code that is not what ran.

Each test builds a small git checkout of its own: a course package (a lazy table, a relative import, a
module reached only through another) and a stored solution whose records name the commit it ran at.
"""

import ast
import json
import subprocess
from pathlib import Path

import nbformat
import pytest

from tinyllama.course import run_solutions, stale

FILES = {
    "tinyllama/__init__.py": "",
    "tinyllama/course/__init__.py": ('from tinyllama.course.base import helper\n\n'
                                     '_LAZY = {"lazy_check": ".lazy_mod", "thing": ".other_mod:thing"}\n'),
    "tinyllama/course/base.py": "LIMIT = 2\n\n\ndef helper():\n    return LIMIT\n",
    "tinyllama/course/lazy_mod.py": "from .deep import deep_fn\n\n\ndef lazy_check():\n    return deep_fn()\n",
    "tinyllama/course/deep.py": "def deep_fn():\n    return 3\n\n\ndef unused_fn():\n    return 4\n",
    "tinyllama/course/other_mod.py": "def thing():\n    return 5\n",
    "tinyllama/unused.py": "def nobody():\n    return 6\n",
}
CELLS = [
    ("markdown", "m1", "# A notebook"),
    ("code", "c1", "%matplotlib inline\nimport tinyllama.course as course\nfrom tinyllama.course import lazy_check"),
    ("code", "c2", "!ls\nprint(course.helper(), lazy_check())"),
]


def _git(root: Path, *arguments: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *arguments], cwd=root, check=True,
                          capture_output=True, text=True).stdout.strip()


def _notebook(commit: str | None, cells=CELLS) -> nbformat.NotebookNode:
    records = [{"commit": commit, "notebook": "01_x", "figures": {}}] if commit is not False else []
    return nbformat.from_dict({
        "cells": [{"cell_type": kind, "id": cell_id, "metadata": {}, "source": source,
                   **({"outputs": [], "execution_count": None} if kind == "code" else {})}
                  for kind, cell_id, source in cells],
        "metadata": {"tinyllama": {"records": records}}, "nbformat": 4, "nbformat_minor": 5})


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def checkout(tmp_path) -> tuple[Path, str]:
    """A checkout whose solution 01_x ran at the returned commit and was stored in the commit after it."""
    root = tmp_path / "checkout"
    root.mkdir()
    _git(root, "init", "-q")
    for relative, text in FILES.items():
        _write(root, relative, text)
    _write(root, "solutions/01_x.ipynb", json.dumps(_notebook("0000000")))  # the outputs of an older run
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "code")
    ran_at = _git(root, "rev-parse", "--short", "HEAD")
    _write(root, "solutions/01_x.ipynb", json.dumps(_notebook(ran_at)))  # the run at ran_at, stored
    _git(root, "commit", "-q", "-am", "stored")
    return root, ran_at


def _solution(root: Path) -> Path:
    return root / "solutions" / "01_x.ipynb"


def test_a_solution_stored_from_its_own_code_is_up_to_date(checkout, capsys):
    root, ran_at = checkout
    found = stale.staleness(_solution(root), root)
    assert (found.commit, found.cells, found.files, found.problem, found.stale) == (ran_at, [], {}, None, False)
    assert stale.report([_solution(root)], root) == 0
    assert "Every solution's code cells are the ones that ran" in capsys.readouterr().out


def test_a_code_cell_edited_after_the_run_makes_the_solution_stale(checkout, capsys):
    root, ran_at = checkout
    edited = [*CELLS[:2], ("code", "c2", "print(course.helper() + 1)"), ("code", "c3", "x = 1")]
    _write(root, "solutions/01_x.ipynb", json.dumps(_notebook(ran_at, edited)))
    found = stale.staleness(_solution(root), root)
    assert found.stale and found.cells == ["c2", "c3"]
    assert stale.report([_solution(root)], root) == 1
    out = capsys.readouterr().out
    assert "cells changed: c2, c3" in out and "run them again (--notebooks 01)" in out


def test_a_markdown_edit_leaves_the_outputs_as_they_are(checkout):
    root, ran_at = checkout
    edited = [("markdown", "m1", "# Another title"), *CELLS[1:]]
    _write(root, "solutions/01_x.ipynb", json.dumps(_notebook(ran_at, edited)))
    assert stale.staleness(_solution(root), root).cells == []


def test_changed_names_in_the_files_a_notebook_reaches_are_listed_and_others_are_not(checkout, capsys):
    root, _ = checkout
    _write(root, "tinyllama/course/deep.py", "def deep_fn():\n    return 30\n\n\ndef unused_fn():\n    return 4\n")
    _write(root, "tinyllama/course/base.py", "LIMIT = 3\n\n\ndef helper():\n    return LIMIT\n")
    _write(root, "tinyllama/unused.py", "def nobody():\n    return 60\n")  # not imported by the notebook
    _write(root, "tinyllama/course/other_mod.py", "def thing():\n    return 50\n")  # lazy, never asked for
    found = stale.staleness(_solution(root), root)
    assert not found.stale  # its cells are what ran: listed for the reader, not counted
    assert found.files == {"tinyllama/course/base.py": ["LIMIT"], "tinyllama/course/deep.py": ["deep_fn"]}
    assert stale.report([_solution(root)], root) == 0
    assert "changed since in tinyllama/course/deep.py: deep_fn" in capsys.readouterr().out


def test_the_import_closure_follows_lazy_names_attributes_relative_imports_and_packages(checkout):
    root, _ = checkout
    reached = stale.reached_files(nbformat.read(_solution(root), as_version=4), root)
    assert reached == {"tinyllama/__init__.py", "tinyllama/course/__init__.py", "tinyllama/course/base.py",
                       "tinyllama/course/lazy_mod.py", "tinyllama/course/deep.py"}
    attribute_only = _notebook(None, [("code", "c1", "import tinyllama.course as course\ncourse.thing()")])
    assert "tinyllama/course/other_mod.py" in stale.reached_files(attribute_only, root)


@pytest.mark.parametrize(("source", "expected"), [
    ("def deep_fn():\n    return 30\n\n\ndef unused_fn():\n    return 4\n", ["deep_fn"]),
    ("import os\n\n\ndef deep_fn():\n    return 3\n\n\ndef unused_fn():\n    return 4\n", ["(module level)"]),
    ("def deep_fn():\n    return 3\n", ["unused_fn"]),  # deleted: named from the commit's side
    ('"""Words."""\n\n\ndef deep_fn():\n    return 3\n\n\ndef unused_fn():\n    return 4\n', ["(docstring)"]),
])
def test_changed_names_come_from_the_lines_git_diff_names(checkout, source, expected):
    root, ran_at = checkout
    _write(root, "tinyllama/course/deep.py", source)
    assert stale.changed_names(root, ran_at, "tinyllama/course/deep.py") == expected


def test_a_file_added_since_is_named_as_new(checkout):
    root, ran_at = checkout
    _write(root, "tinyllama/course/fresh.py", "X = 1\n")
    _git(root, "add", "-A")
    assert stale.changed_names(root, ran_at, "tinyllama/course/fresh.py") == ["(new file)"]


@pytest.mark.parametrize(("commit", "problem"), [
    (False, "name no commit"),
    ("1234567-dirty", "uncommitted changes"),
    ("abcdef0", "git does not know commit abcdef0"),
])
def test_a_solution_whose_run_cannot_be_placed_is_reported_and_counted(checkout, commit, problem, capsys):
    root, _ = checkout
    _write(root, "solutions/01_x.ipynb", json.dumps(_notebook(commit)))
    found = stale.staleness(_solution(root), root)
    assert found.stale and problem in found.problem
    assert stale.report([_solution(root)], root) == 1
    assert "cannot tell" in capsys.readouterr().out


def test_a_cell_that_is_not_python_is_named():
    notebook = _notebook(None, [("code", "c9", "print(")])
    with pytest.raises(ValueError, match="cell c9 is not Python"):
        stale.notebook_sources(notebook)
    assert isinstance(stale.notebook_sources(_notebook(None))[0], ast.Module)


def test_the_instructor_command_lists_stale_solutions_and_refuses_to_mix_it_with_a_run(checkout, capsys):
    root, _ = checkout
    assert run_solutions.main(["--stale", "--solutions", str(root / "solutions")]) == 0
    assert "01_x" in capsys.readouterr().out
    assert run_solutions.main(["--stale", "--twice"]) == 2
    assert "--stale runs nothing" in capsys.readouterr().err


def test_an_import_added_since_an_earlier_report_in_the_same_process_is_followed(checkout):
    root, _ = checkout
    assert stale.staleness(_solution(root), root).files == {}
    _write(root, "tinyllama/course/lazy_mod.py",
           "from .deep import deep_fn\nfrom .other_mod import thing\n\n\n"
           "def lazy_check():\n    return deep_fn() + thing()\n")
    _write(root, "tinyllama/course/other_mod.py", "def thing():\n    return 50\n")
    assert stale.staleness(_solution(root), root).files == {
        "tinyllama/course/lazy_mod.py": ["lazy_check", "(module level)"], "tinyllama/course/other_mod.py": ["thing"]}
