"""Generate the participant notebooks (``notebooks/``) from the solution notebooks (``solutions/``).

A solution notebook is the one source. In its code cells, the lines between ``# BEGIN SOLUTION 13.2``
and ``# END SOLUTION`` are exercise 13.2 (the number before the dot is the notebook's). An id-less
``# BEGIN SOLUTION`` marks what is not an exercise to reveal: a prediction cell, whose participant copy
keeps a ``# PARTICIPANT: predicted = None`` line. One or more ``# HINT: ...`` lines inside
the block say what to write. The participant's copy gets, at the same indentation::

    # TODO: <hint>
    raise course.unanswered("13.2")

(:func:`tinyllama.course.exercise_stop.unanswered`: the notebook stops there with a short message that
says to write the answer or run ``course.reveal("13.2")``, not a traceback)

or, when the block has ``# PARTICIPANT: <code>`` lines (a skeleton, e.g. inside a Triton kernel where
``raise`` cannot compile), the TODO lines followed by that code. A hint that gives the answer away is
refused: the generator fails when a line of the solution still appears in the participant's cell
(in a hint, or anywhere else in it), so a participant is never handed the line they should write.
:func:`tinyllama.course.reveal.reveal` loads the solution block of one exercise for a participant
who is stuck.

Markdown cells do the same with ``<!-- BEGIN SOLUTION -->``, ``<!-- HINT: ... -->`` and
``<!-- END SOLUTION -->`` (the participant writes an answer), giving ``*TODO: <hint>*``; the answers
to a notebook's questions go between ``<!-- BEGIN ANSWER -->`` and ``<!-- END ANSWER -->`` and are
removed from the participant's copy. The participant's copy has no outputs, no execution counts and
no nbval markers.

Every notebook, solution and participant copy, runs in the course's Jupyter kernel and its first code
cell starts with the course's import guard (both from :mod:`tinyllama.course.jupyter_setup`): the
generator writes them into the participant copies and into the solutions themselves (metadata and
the guard's lines only; stored outputs are kept), so a notebook added later gets them too.

    python -m tinyllama.course.make_notebooks           # write notebooks/ (and the kernel into solutions/)
    python -m tinyllama.course.make_notebooks --check   # exit 1 when notebooks/ or solutions/ is out of date
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

from tinyllama.course.jupyter_setup import IMPORT_GUARD, KERNELSPEC
from tinyllama.course.results import checkout_root

RAISE_LINE = "raise course.unanswered()"  # an exercise without an id (see raise_line)
NBVAL_MARKER = re.compile(r"^\s*#\s*(NBVAL_[A-Z_]+|PYTEST_VALIDATE_IGNORE_OUTPUT)\s*$")
EXERCISE_ID = re.compile(r"\d\d\.\d+")
# The import guard at the top of a first code cell, whatever its message says (the generator rewrites it).
GUARD = re.compile(r"\Atry:\n    from tinyllama import course\nexcept ImportError as error:\n"
                   r"(?:[ \t].*\n)*?[ \t].*\bfrom error[ \t]*(?:\n|\Z)")
BARE_IMPORT = re.compile(r"^from tinyllama import course[ \t]*(?:\n|\Z)", re.MULTILINE)
# Solution lines shorter than this (``return y``, ``)``) are too generic to count as a give-away.
MIN_LEAK_LENGTH = 12


class MarkerError(ValueError):
    """Solution markers that do not pair up, a block without a hint, or a hint that gives the answer."""


def raise_line(exercise: str | None) -> str:
    """The line that stands in a participant's cell for the code they write: it raises
    :class:`~tinyllama.course.exercise_stop.ExerciseNotAnswered` (a ``NotImplementedError``), whose
    message names the exercise and ``course.reveal``. The notebook's first cell imports ``course``."""
    if exercise is None:
        return RAISE_LINE
    return f'raise course.unanswered("{exercise}")'


def _code_todo(indent: str, hints: list[str], exercise: str | None = None,
               skeleton: list[str] | None = None) -> list[str]:
    todo = [f"{indent}# TODO: {hint}" for hint in hints]
    if skeleton:
        return todo + [indent + line for line in skeleton]
    return todo + [indent + raise_line(exercise)]


def _markdown_todo(indent: str, hints: list[str], exercise: str | None = None,
                   skeleton: list[str] | None = None) -> list[str]:
    return [f"{indent}*TODO: {' '.join(hints)}*"]


@dataclass(frozen=True)
class _Markers:
    """How one cell type marks a solution block, and what replaces it."""

    begin: re.Pattern[str]
    end: re.Pattern[str]
    hint: re.Pattern[str]
    todo: Callable[..., list[str]]
    strip_nbval: bool
    skeleton: re.Pattern[str] | None = None
    answer_begin: re.Pattern[str] | None = None
    answer_end: re.Pattern[str] | None = None


CODE = _Markers(re.compile(r"^\s*#\s*BEGIN SOLUTION(?:\s+(?P<id>\S+))?\s*$"),
                re.compile(r"^\s*#\s*END SOLUTION\s*$"),
                re.compile(r"^\s*#\s*HINT:\s*(.*?)\s*$"), _code_todo, strip_nbval=True,
                skeleton=re.compile(r"^\s*#\s*PARTICIPANT:\s?(.*?)\s*$"))
MARKDOWN = _Markers(re.compile(r"^\s*<!--\s*BEGIN SOLUTION(?:\s+(?P<id>\S+))?\s*-->\s*$"),
                    re.compile(r"^\s*<!--\s*END SOLUTION\s*-->\s*$"),
                    re.compile(r"^\s*<!--\s*HINT:\s*(.*?)\s*-->\s*$"), _markdown_todo, strip_nbval=False,
                    answer_begin=re.compile(r"^\s*<!--\s*BEGIN ANSWER\s*-->\s*$"),
                    answer_end=re.compile(r"^\s*<!--\s*END ANSWER\s*-->\s*$"))


@dataclass
class Block:
    """One solution block of a cell: its exercise id (or ``None``), and the solution's own lines."""

    exercise: str | None
    first_line: int
    lines: list[str]


def _normalise(line: str) -> str:
    return " ".join(line.split())


def _leaks(blocks: list[Block], participant: str, solution_outside: str, where: str) -> None:
    """Raise when a solution line (not a comment, not trivial, not shown outside its block in the
    solution cell anyway) still appears anywhere in the participant's cell, hints included."""
    shown = _normalise(participant)
    for block in blocks:
        for line in block.lines:
            text = _normalise(line)
            if len(text) < MIN_LEAK_LENGTH or text.startswith("#") or text in solution_outside:
                continue
            if text in shown:
                label = f"exercise {block.exercise}" if block.exercise else "the solution block"
                raise MarkerError(
                    f"{where}: {label} (opened on line {block.first_line}) gives its answer away: the "
                    f"solution line {text!r} still appears in the participant's cell; rewrite the HINT "
                    "to describe the goal, not the line")


def split_blocks(source: str, markers: _Markers = CODE, where: str = "cell") -> tuple[str, list[Block]]:
    """The participant's version of ``source`` and the solution blocks it replaced.

    Every solution block becomes its TODO (and, for code, nbval markers are removed); answer blocks
    are dropped. Raises :class:`MarkerError` for markers that do not pair up, a block without a hint,
    or an exercise id that is not of the form ``NN.k``.
    """
    out: list[str] = []
    blocks: list[Block] = []
    inside_since: int | None = None
    answer_since: int | None = None
    indent = ""
    hints: list[str] = []
    skeleton: list[str] = []
    exercise: str | None = None
    body: list[str] = []
    for number, line in enumerate(source.splitlines(), start=1):
        begin = markers.begin.match(line)
        if markers.answer_begin is not None and markers.answer_begin.match(line):
            if answer_since is not None or inside_since is not None:
                raise MarkerError(f"{where}, line {number}: BEGIN ANSWER inside another block; close it first")
            answer_since = number
        elif markers.answer_end is not None and markers.answer_end.match(line):
            if answer_since is None:
                raise MarkerError(f"{where}, line {number}: END ANSWER without a BEGIN ANSWER")
            answer_since = None
        elif answer_since is not None:
            continue
        elif begin:
            if inside_since is not None:
                raise MarkerError(f"{where}, line {number}: BEGIN SOLUTION inside the block opened on line "
                                  f"{inside_since}; close it with END SOLUTION first")
            exercise = begin.group("id")
            if exercise is not None and not EXERCISE_ID.fullmatch(exercise):
                raise MarkerError(f"{where}, line {number}: exercise id {exercise!r} is not of the form NN.k "
                                  "(notebook number, dot, exercise number), e.g. 13.2")
            inside_since, indent, hints, skeleton, body = number, line[: len(line) - len(line.lstrip())], [], [], []
        elif markers.end.match(line):
            if inside_since is None:
                raise MarkerError(f"{where}, line {number}: END SOLUTION without a BEGIN SOLUTION")
            if not hints:
                raise MarkerError(f"{where}, line {inside_since}: the solution block has no HINT line; add one "
                                  "that tells the participant what to write")
            out.extend(markers.todo(indent, hints, exercise, skeleton))
            blocks.append(Block(exercise, inside_since, body))
            inside_since = None
        elif inside_since is not None:
            hint = markers.hint.match(line)
            part = markers.skeleton.match(line) if markers.skeleton is not None else None
            if hint:
                hints.append(hint.group(1))
            elif part:
                skeleton.append(part.group(1))
            else:
                body.append(line)
        elif markers.strip_nbval and NBVAL_MARKER.match(line):
            continue
        else:
            out.append(line)
    if inside_since is not None:
        raise MarkerError(f"{where}, line {inside_since}: BEGIN SOLUTION is never closed with END SOLUTION")
    if answer_since is not None:
        raise MarkerError(f"{where}, line {answer_since}: BEGIN ANSWER is never closed with END ANSWER")
    return "\n".join(out), blocks


def strip_solutions(source: str, markers: _Markers = CODE, where: str = "cell") -> str:
    """``source`` with every solution block replaced by its TODO (and, for code, nbval markers removed).

    A participant cell that still contains a line of its solution (typically a hint that spells the
    answer) raises :class:`MarkerError`.
    """
    participant, blocks = split_blocks(source, markers, where)
    if blocks:
        outside, inside = [], False
        for line in source.splitlines():
            if markers.begin.match(line):
                inside = True
            elif markers.end.match(line):
                inside = False
            elif not inside and not line.lstrip().startswith("#"):  # a comment restating the answer leaks it
                outside.append(line)
        _leaks(blocks, participant, _normalise("\n".join(outside)), where)
    return participant


def exercises(nb: nbformat.NotebookNode, name: str = "notebook") -> dict[str, tuple[int, Block]]:
    """Exercise id -> (cell index, solution block) of a solution notebook; ids must be unique and
    carry the notebook's number (``13.2`` in ``13_triton_basics``)."""
    found: dict[str, tuple[int, Block]] = {}
    number = Path(name).name[:2]
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        _, blocks = split_blocks(cell.source, CODE, f"{name}, cell {index}")
        for block in blocks:
            if block.exercise is None:
                continue
            if block.exercise in found:
                raise MarkerError(f"{name}, cell {index}: exercise {block.exercise} is already defined in cell "
                                  f"{found[block.exercise][0]}; give each exercise its own id")
            if number.isdigit() and not block.exercise.startswith(number + "."):
                raise MarkerError(f"{name}, cell {index}: exercise {block.exercise} does not carry the notebook's "
                                  f"number {number} (write {number}.k)")
            found[block.exercise] = (index, block)
    return found


def with_course_kernel(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb``, changed in place and returned, with the course's kernel in its metadata and the course's
    import guard at the top of its first code cell (replacing an older guard or a bare
    ``from tinyllama import course``). Outputs are not touched: the guard prints nothing when it passes."""
    nb.metadata["kernelspec"] = nbformat.from_dict(dict(KERNELSPEC))
    first = next((cell for cell in nb.cells if cell.cell_type == "code"), None)
    if first is not None:
        if GUARD.match(first.source):
            first.source = GUARD.sub(lambda _: IMPORT_GUARD, first.source, count=1)
        else:
            rest = BARE_IMPORT.sub("", first.source, count=1).lstrip("\n")
            first.source = IMPORT_GUARD + ("\n" + rest if rest else "")
    return nb


def participant_notebook(solution: nbformat.NotebookNode, name: str = "notebook") -> nbformat.NotebookNode:
    """The participant's version of a solution notebook (a new object; ``solution`` is unchanged)."""
    nb = with_course_kernel(copy.deepcopy(solution))
    exercises(solution, name)  # ids unique and numbered after the notebook
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
        "kernelspec": dict(KERNELSPEC),
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


def solution_updates(solutions: Path) -> dict[Path, str]:
    """Solution file path -> its content with the course's kernel and import guard, for every solution
    that lacks them (see :func:`with_course_kernel`)."""
    updates = {}
    for path in sorted(solutions.glob("*.ipynb")):
        text = path.read_text(encoding="utf-8")
        fixed = render(with_course_kernel(nbformat.reads(text, as_version=4)))
        if fixed != text:
            updates[path] = fixed
    return updates


def stale(solutions: Path, notebooks: Path) -> list[str]:
    """What is out of date in ``notebooks`` and ``solutions`` (empty when all is current)."""
    expected = generate(solutions, notebooks)
    problems = [f"{path.parent.name}/{path.name}: lacks the course's kernel or import guard"
                for path in solution_updates(solutions)]
    for path, text in expected.items():
        if not path.exists():
            problems.append(f"{notebooks.name}/{path.name}: missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{notebooks.name}/{path.name}: differs from its solution")
    for path in sorted(notebooks.glob("*.ipynb")):
        if path not in expected:
            problems.append(f"{notebooks.name}/{path.name}: has no solution notebook")
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
                print(f"out of date: {problem}", file=sys.stderr)
            if problems:
                print("run `python -m tinyllama.course.make_notebooks` and commit notebooks/ and solutions/",
                      file=sys.stderr)
                return 1
            print(f"{args.notebooks} is up to date with {args.solutions}")
            return 0
        fixed = solution_updates(args.solutions)
        files = generate(args.solutions, args.notebooks)
    except (MarkerError, FileNotFoundError, nbformat.ValidationError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for path, text in fixed.items():
        path.write_text(text, encoding="utf-8")
        print(f"kernel   {path} (the course's kernel and import guard; outputs kept)")
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
