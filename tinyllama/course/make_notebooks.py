"""Generate the participant notebooks (``notebooks/``) from the solution notebooks (``solutions/``).

A solution notebook is the one source. In its code cells, the lines between ``# BEGIN SOLUTION`` and
``# END SOLUTION`` are the exercise; one or more ``# HINT: ...`` lines inside the block say what to
write. The participant's copy gets, at the same indentation::

    # TODO: <hint>
    raise NotImplementedError("exercise: write the code the TODO above describes")

Markdown cells do the same with ``<!-- BEGIN SOLUTION -->``, ``<!-- HINT: ... -->`` and
``<!-- END SOLUTION -->`` (for answers to questions), giving ``*TODO: <hint>*``. The participant's
copy has no outputs, no execution counts and no nbval markers.

    python -m tinyllama.course.make_notebooks           # write notebooks/
    python -m tinyllama.course.make_notebooks --check   # exit 1 when notebooks/ is out of date
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import nbformat

from tinyllama.course.results import checkout_root

RAISE_LINE = 'raise NotImplementedError("exercise: write the code the TODO above describes")'
NBVAL_MARKER = re.compile(r"^\s*#\s*(NBVAL_[A-Z_]+|PYTEST_VALIDATE_IGNORE_OUTPUT)\s*$")


class MarkerError(ValueError):
    """Solution markers that do not pair up, or a block without a hint."""


def _code_todo(indent: str, hints: list[str]) -> list[str]:
    return [f"{indent}# TODO: {hint}" for hint in hints] + [indent + RAISE_LINE]


def _markdown_todo(indent: str, hints: list[str]) -> list[str]:
    return [f"{indent}*TODO: {' '.join(hints)}*"]


@dataclass(frozen=True)
class _Markers:
    """How one cell type marks a solution block, and what replaces it."""

    begin: re.Pattern[str]
    end: re.Pattern[str]
    hint: re.Pattern[str]
    todo: Callable[[str, list[str]], list[str]]
    strip_nbval: bool


CODE = _Markers(re.compile(r"^\s*#\s*BEGIN SOLUTION\s*$"), re.compile(r"^\s*#\s*END SOLUTION\s*$"),
                re.compile(r"^\s*#\s*HINT:\s*(.*?)\s*$"), _code_todo, strip_nbval=True)
MARKDOWN = _Markers(re.compile(r"^\s*<!--\s*BEGIN SOLUTION\s*-->\s*$"),
                    re.compile(r"^\s*<!--\s*END SOLUTION\s*-->\s*$"),
                    re.compile(r"^\s*<!--\s*HINT:\s*(.*?)\s*-->\s*$"), _markdown_todo, strip_nbval=False)


def strip_solutions(source: str, markers: _Markers = CODE, where: str = "cell") -> str:
    """``source`` with every solution block replaced by its TODO (and, for code, nbval markers removed)."""
    out: list[str] = []
    inside_since: int | None = None
    indent = ""
    hints: list[str] = []
    for number, line in enumerate(source.splitlines(), start=1):
        if markers.begin.match(line):
            if inside_since is not None:
                raise MarkerError(f"{where}, line {number}: BEGIN SOLUTION inside the block opened on line "
                                  f"{inside_since}; close it with END SOLUTION first")
            inside_since, indent, hints = number, line[: len(line) - len(line.lstrip())], []
        elif markers.end.match(line):
            if inside_since is None:
                raise MarkerError(f"{where}, line {number}: END SOLUTION without a BEGIN SOLUTION")
            if not hints:
                raise MarkerError(f"{where}, line {inside_since}: the solution block has no HINT line; add one "
                                  "that tells the participant what to write")
            out.extend(markers.todo(indent, hints))
            inside_since = None
        elif inside_since is not None:
            hint = markers.hint.match(line)
            if hint:
                hints.append(hint.group(1))
        elif markers.strip_nbval and NBVAL_MARKER.match(line):
            continue
        else:
            out.append(line)
    if inside_since is not None:
        raise MarkerError(f"{where}, line {inside_since}: BEGIN SOLUTION is never closed with END SOLUTION")
    return "\n".join(out)


def participant_notebook(solution: nbformat.NotebookNode, name: str = "notebook") -> nbformat.NotebookNode:
    """The participant's version of a solution notebook (a new object; ``solution`` is unchanged)."""
    nb = copy.deepcopy(solution)
    for index, cell in enumerate(nb.cells):
        where = f"{name}, cell {index}"
        if cell.cell_type == "code":
            cell.source = strip_solutions(cell.source, CODE, where)
            cell.outputs = []
            cell.execution_count = None
        elif cell.cell_type == "markdown":
            cell.source = strip_solutions(cell.source, MARKDOWN, where)
        for key in ("execution", "collapsed", "scrolled"):
            cell.metadata.pop(key, None)
    # Keep only metadata that does not depend on where the solution was last executed, so that
    # storing fresh outputs in a solution does not make its participant copy out of date.
    nb.metadata = nbformat.from_dict({
        "kernelspec": solution.metadata.get("kernelspec", {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                                           "language": "python"}),
        "language_info": {"name": "python"},
        "tinyllama_course": {"generated_from": f"solutions/{name}",
                             "note": "generated by python -m tinyllama.course.make_notebooks: edit the solution"},
    })
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    """The file content of ``nb``: validated, in Jupyter's own layout, ending with a newline."""
    nbformat.validate(nb)
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def generate(solutions: Path, notebooks: Path) -> dict[Path, str]:
    """Participant file path -> content, for every ``*.ipynb`` in ``solutions``."""
    sources = sorted(solutions.glob("*.ipynb"))
    if not sources:
        raise FileNotFoundError(f"no solution notebooks in {solutions}")
    return {notebooks / path.name: render(participant_notebook(nbformat.read(path, as_version=4), path.name))
            for path in sources}


def stale(solutions: Path, notebooks: Path) -> list[str]:
    """What is out of date in ``notebooks`` (empty when it matches ``solutions``)."""
    expected = generate(solutions, notebooks)
    problems = []
    for path, text in expected.items():
        if not path.exists():
            problems.append(f"{path.name}: missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{path.name}: differs from its solution")
    for path in sorted(notebooks.glob("*.ipynb")):
        if path not in expected:
            problems.append(f"{path.name}: has no solution notebook")
    return problems


def main(argv: list[str] | None = None) -> int:
    root = checkout_root() or Path.cwd()
    parser = argparse.ArgumentParser(prog="python -m tinyllama.course.make_notebooks", description=__doc__.split("\n")[0])
    parser.add_argument("--solutions", type=Path, default=root / "solutions", help="solution notebooks (default: %(default)s)")
    parser.add_argument("--notebooks", type=Path, default=root / "notebooks", help="participant notebooks (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when notebooks/ is out of date")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = stale(args.solutions, args.notebooks)
            for problem in problems:
                print(f"out of date: {args.notebooks}/{problem}", file=sys.stderr)
            if problems:
                print("run `python -m tinyllama.course.make_notebooks` and commit notebooks/", file=sys.stderr)
                return 1
            print(f"{args.notebooks} is up to date with {args.solutions}")
            return 0
        files = generate(args.solutions, args.notebooks)
    except (MarkerError, FileNotFoundError, nbformat.ValidationError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    args.notebooks.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        changed = not path.exists() or path.read_text(encoding="utf-8") != text
        if changed:
            path.write_text(text, encoding="utf-8")
        print(f"{'wrote    ' if changed else 'unchanged'} {path}")
    for path in sorted(args.notebooks.glob("*.ipynb")):
        if path not in files:
            print(f"warning: {path} has no solution notebook (left as it is)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
