"""A failed exercise check, or an exercise not answered yet, stops the participant's notebook.

In a Jupyter (IPython) kernel a failed check of an exercise raises :class:`ExerciseCheckFailed`, so
"Run All" stops at that check instead of carrying a wrong value into later cells and into the
participant's records; an exercise cell left as generated raises :class:`ExerciseNotAnswered`
(``raise course.unanswered("13.2")``, the line :mod:`tinyllama.course.make_notebooks` writes). Both
show a few lines (which exercise, what is wrong, what to look at, ``course.reveal("13.2")``) instead
of a traceback, through IPython's ``_render_traceback_``.

Which failed checks are an exercise's? A checkpoint that fails (:func:`tinyllama.course.checkpoints.checkpoint`)
asks :func:`failing_exercise`: the notebook cell that called it must be the check cell of an exercise
(in its solution notebook, the first code cell after the exercise's cell that reads a name of the answer,
usually the next one: a measurement may run between a prediction and its check; recognised by its source),
and the statement of that cell that made the failing call must use a name the exercise's answer
defines (the function or variable the participant wrote). A plausibility check on a measured result
(a device rate, a timing ratio, a measured correctness) is not the participant's answer: it prints
``CHECK: ...`` and stops the notebook only under ``WORKSHOP_STRICT=1``, so a participant on unusual
hardware is never stopped by it.
"""

from __future__ import annotations

import ast
import json
import linecache
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import FrameType
from typing import Any

from tinyllama.course.checkpoints import CheckpointFailed

RED, BOLD, RESET = "\x1b[31m", "\x1b[1m", "\x1b[0m"


def _reveal_call(exercise: str) -> str:
    return f'course.reveal("{exercise}")'


class ExerciseNotAnswered(NotImplementedError):
    """An exercise cell still holds its ``# TODO`` stub. A ``NotImplementedError``, so the course's
    checks let it through unchanged (an unwritten exercise is not a wrong answer)."""

    def __init__(self, exercise: str | None = None) -> None:
        self.exercise = exercise
        if exercise is None:
            text = "This exercise is not answered yet: write the code the TODO above describes"
        else:
            text = (f"Exercise {exercise} is not answered yet: write the code the TODO lines of its cell describe, "
                    f"or run {_reveal_call(exercise)} to load the reference answer")
        super().__init__(text)

    def _render_traceback_(self) -> list[str]:
        """What IPython shows instead of a traceback."""
        if self.exercise is None:
            return [f"{RED}{BOLD}{self}.{RESET}"]
        return [f"{RED}{BOLD}Exercise {self.exercise} is not answered yet.{RESET}",
                "  Write the code that the TODO lines of its cell describe (the hints above it help), then run the "
                "cell again.",
                f"  Stuck? Run {_reveal_call(self.exercise)} in a new cell: it loads the reference answer and "
                "defines its names, and the notebook goes on."]


def unanswered(exercise: str | None = None) -> ExerciseNotAnswered:
    """The exception a generated exercise stub raises: ``raise course.unanswered("13.2")``."""
    return ExerciseNotAnswered(exercise)


class ExerciseCheckFailed(CheckpointFailed):
    """The check of ``exercise`` failed in the participant's notebook. ``str()`` is the check's own
    message (as for :class:`CheckpointFailed`); IPython shows :meth:`_render_traceback_`."""

    def __init__(self, message: str, exercise: str, names: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.exercise = exercise
        self.names = names

    def _render_traceback_(self) -> list[str]:
        """What IPython shows instead of a traceback: which exercise, what is wrong, where to look,
        and how to go on."""
        lines = [f"{RED}{BOLD}Exercise {self.exercise}: the check failed, so the notebook stopped here.{RESET}"]
        lines += ["  " + line for line in str(self).splitlines()]
        yours = " and ".join(f"`{name}`" for name in self.names)
        where = f"your {yours} in exercise {self.exercise}" if yours else f"your answer to exercise {self.exercise}"
        lines.append(f"  Look at {where}: fix it, run its cell, then run this check again.")
        lines.append(f"  Stuck? Run {_reveal_call(self.exercise)} in a new cell: it loads the reference answer, "
                     "then run this check and go on.")
        return lines


# --- which exercise a failing check belongs to -------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """What exercise ``exercise`` defines: ``shown``, the names the participant writes (a function, the
    variables its block assigns at the top of its cell), and ``names``, those with everything its cell
    computes from them (loop variables and locals of the block included)."""

    exercise: str
    shown: frozenset[str]
    names: frozenset[str]


@dataclass(frozen=True)
class CheckCell:
    """The check cell of one or more exercises (``answers``) in a solution notebook."""

    notebook: str
    index: int
    answers: tuple[Answer, ...]


def _normalise(source: str) -> str:
    """Cell source for comparison: nbval markers, blank lines and trailing spaces dropped."""
    from tinyllama.course.make_notebooks import NBVAL_MARKER

    return "\n".join(line.rstrip() for line in source.splitlines() if line.strip() and not NBVAL_MARKER.match(line))


def _bound_names(node: ast.AST) -> set[str]:
    """Names an assignment, loop, definition or import binds."""
    names: set[str] = set()
    targets: list[ast.AST] = []
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        names.add(node.name)
    elif isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
        targets = [node.target]
    elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        targets = [node.target]
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
        targets = [node.optional_vars]
    for target in targets:
        names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _reads(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _target_names(target: ast.AST) -> set[str]:
    """Names a target rebinds: ``x`` and ``x, y`` do; ``table[key]`` and ``obj.attr`` change an object
    whose other contents are not the answer's."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return {name for element in target.elts for name in _target_names(element)}
    return set()


def _base_name(target: ast.AST) -> str | None:
    """``table`` for ``table[key]``, ``obj`` for ``obj.attr``, ``x`` for ``x``."""
    while isinstance(target, (ast.Subscript, ast.Attribute, ast.Starred)):
        target = target.value
    return target.id if isinstance(target, ast.Name) else None


def _outside_definitions(node: ast.AST):
    """``node`` and what it contains, without descending into functions, classes and lambdas."""
    yield node
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)) and not isinstance(
            node, ast.Module):
        return
    for child in ast.iter_child_nodes(node):
        yield from _outside_definitions(child)


def derived_names(statements: list[ast.stmt], names: set[str] | frozenset[str]) -> set[str]:
    """``names`` and the names computed from them by ``statements`` (in order): a variable assigned
    from them, a function or lambda that uses them, a loop variable over them, and a variable passed to
    a function of theirs (which may change it: ``repair(model)``)."""
    derived = set(names)
    for statement in statements:
        for node in _outside_definitions(statement):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if _reads(node) & derived:
                    derived.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
                value = node.value
                if value is None or not _reads(value) & derived:
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                derived |= {name for target in targets for name in _target_names(target)}
                if isinstance(value, ast.Call) and _reads(value.func) & derived:
                    derived |= {a.id for a in value.args if isinstance(a, ast.Name)}
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                if _reads(node.iter) & derived:
                    derived |= _target_names(node.target)
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                if _reads(node.value.func) & derived:
                    derived |= {a.id for a in node.value.args if isinstance(a, ast.Name)}
    return derived


def answer_names(source: str, first_line: int, exercise: str = "") -> Answer:
    """What the solution block that opens on line ``first_line`` of ``source`` (its ``# BEGIN
    SOLUTION`` line) defines: the function or class it sits in, else the names its top-level lines bind
    (``shown``); with every name its lines bind and what the rest of the cell computes from them
    (:func:`derived_names`)."""
    from tinyllama.course.make_notebooks import CODE
    from tinyllama.course.reveal import _runnable

    lines = source.splitlines()
    last = next((number for number in range(first_line + 1, len(lines) + 1)
                 if CODE.end.match(lines[number - 1])), len(lines))
    try:
        tree = ast.parse(_runnable(source))
    except SyntaxError:
        return Answer(exercise, frozenset(), frozenset())
    names: set[str] = set()
    for node in ast.walk(tree):
        line = getattr(node, "lineno", None)
        if line is not None and first_line < line < last:
            names |= _bound_names(node)
    around = {node.name for node in tree.body  # the definition the block is the body of (a function to complete)
              if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
              and node.lineno < first_line <= (node.end_lineno or node.lineno)}
    shown = around or {name for node in tree.body if first_line < node.lineno < last
                       and not isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.If, ast.Try))
                       for name in _bound_names(node)}
    if not shown:  # a block inside a loop that fills a table: the table (``idle_pct[label] = ...``)
        shown = {_base_name(target) for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AugAssign))
                 and first_line < node.lineno < last
                 for target in (node.targets if isinstance(node, ast.Assign) else [node.target])} - {None}
    return Answer(exercise, frozenset(shown), frozenset(derived_names(tree.body, names | around)))


def _cell_reads(source: str) -> set[str]:
    """The names a cell's code reads (none when it does not parse: a cell of shell commands)."""
    from tinyllama.course.reveal import _runnable

    try:
        return _reads(ast.parse(_runnable(source)))
    except SyntaxError:
        return set()


def _check_cell_index(cells: list, cell: int, exercise_cells: set[int], answer: Answer) -> int | None:
    """The index of the check cell of the exercise in cell ``cell``: the first code cell after it that reads a
    name its answer defines, before the next exercise's cell (a measurement may run between the answer and its
    check, as in a prediction that the check compares with what was measured); where no such cell is found, the
    first code cell after it. ``None`` when that is another exercise's cell."""
    code = [i for i in range(cell + 1, len(cells)) if cells[i].cell_type == "code"]
    if not code or code[0] in exercise_cells:
        return None
    if answer.names:
        for index in code:
            if index in exercise_cells:
                break
            if _cell_reads(cells[index].source) & answer.names:
                return index
    return code[0]


def check_cell(nb: Any, found: dict[str, tuple[int, Any]], exercise: str) -> int | None:
    """The index of the check cell of ``exercise`` in ``nb`` (see :func:`_check_cell_index`), where ``found``
    maps the notebook's exercises to their cells as ``make_notebooks.exercises`` gives them."""
    cell, block = found[exercise]
    answer = answer_names(nb.cells[cell].source, block.first_line, exercise)
    return _check_cell_index(nb.cells, cell, {index for index, _ in found.values()}, answer)


def check_cells(solutions: Path) -> dict[str, list[CheckCell]]:
    """Normalised source of every exercise's check cell in ``solutions/*.ipynb`` -> where it is and
    which exercises it checks (see :func:`_check_cell_index`)."""
    import nbformat

    from tinyllama.course.make_notebooks import exercises

    index: dict[str, list[CheckCell]] = {}
    for path in sorted(solutions.glob("*.ipynb")):
        # Read without validating the stored outputs (seconds for all notebooks): only the sources matter here.
        nb = nbformat.from_dict(json.loads(path.read_text(encoding="utf-8")))
        for cell in nb.cells:
            cell.source = "".join(cell.source) if isinstance(cell.source, list) else cell.source
        found = exercises(nb, path.stem)
        checked: dict[int, list[Answer]] = {}
        for exercise, (cell, block) in sorted(found.items(), key=lambda item: item[1][0]):
            after = check_cell(nb, found, exercise)
            if after is not None:
                checked.setdefault(after, []).append(answer_names(nb.cells[cell].source, block.first_line, exercise))
        for cell, answers in checked.items():
            entry = CheckCell(path.name, cell, tuple(answers))
            index.setdefault(_normalise(nb.cells[cell].source), []).append(entry)
    return index


@lru_cache(maxsize=4)
def _cached_check_cells(solutions: Path, stamp: tuple[float, ...]) -> dict[str, list[CheckCell]]:
    return check_cells(solutions)


def _solutions() -> Path | None:
    from tinyllama.course.results import checkout_root

    folder = (checkout_root() or Path.cwd()) / "solutions"
    return folder if folder.is_dir() else None


def _cell_frame(frame: FrameType | None) -> FrameType | None:
    """The frame of the notebook cell's own code (top level of a cell run by IPython), or ``None``
    outside an IPython kernel or shell."""
    if "IPython" not in sys.modules:  # not in a kernel: nothing to stop
        return None
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return None
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is shell.user_global_ns:
            return frame
        frame = frame.f_back
    return None


def _statement_names(source: str, line: int) -> tuple[set[str], list[ast.stmt]]:
    """The names used by the statement on ``line`` of ``source`` (the innermost one there) and by the
    headers of the loops, conditions and ``with`` blocks around it (a loop variable stands for what it
    iterates over); and the statements that ran before it, at its level and the levels around it."""
    tree = ast.parse(source)
    names: set[str] = set()
    before: list[ast.stmt] = []
    body: list[ast.stmt] = tree.body
    while True:
        here = next((s for s in body if s.lineno <= line <= (s.end_lineno or s.lineno)), None)
        if here is None:
            return names, before
        before += [s for s in body if (s.end_lineno or s.lineno) < here.lineno]
        inner = [getattr(here, field, None) for field in ("body", "orelse", "finalbody", "handlers")]
        statements = [s for block in inner if isinstance(block, list) for s in block if isinstance(s, ast.stmt)]
        handlers = [s for block in inner if isinstance(block, list) for h in block
                    if isinstance(h, ast.ExceptHandler) for s in h.body]
        nested = [s for s in statements + handlers if s.lineno <= line <= (s.end_lineno or s.lineno)]
        if isinstance(here, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or not nested:
            own = {name for node in ast.walk(here) if isinstance(node, ast.comprehension)  # its own loop variables
                   for name in _target_names(node.target)}
            return names | (_reads(here) - own), before
        for header in ("test", "iter", "items", "subject"):  # the compound statement's own header
            part = getattr(here, header, None)
            for piece in part if isinstance(part, list) else [part] if part is not None else []:
                names |= _reads(piece)
        body = statements + handlers


def match_exercise(cell_source: str, line: int, index: dict[str, list[CheckCell]],
                   notebook: str | None = None) -> tuple[str, tuple[str, ...]] | None:
    """(exercise id, the answer's names the statement uses) when line ``line`` of the cell
    ``cell_source`` is a statement of an exercise's check cell that uses that exercise's answer;
    ``None`` otherwise. ``notebook`` (the session's name) picks among check cells of the same source."""
    entries = index.get(_normalise(cell_source), [])
    if not entries:
        return None
    if notebook:
        entries = sorted(entries, key=lambda e: not e.notebook.startswith(notebook))
    used, before = _statement_names(cell_source, line)
    answers = entries[0].answers
    for answer in answers:
        derived = derived_names(before, answer.names)  # what the check cell computed from it before this line
        if used & derived:
            shown = used & answer.shown or (answer.shown if len(answer.shown) <= 3 else used & answer.names)
            return answer.exercise, tuple(sorted(shown)) if len(shown) <= 3 else ()
    if all(not answer.names for answer in answers):  # nothing tells the answer's statements: the cell is the check
        return answers[0].exercise, tuple(sorted(answers[0].shown)) if len(answers[0].shown) <= 3 else ()
    return None


def failing_exercise(frame: FrameType | None = None) -> tuple[str, tuple[str, ...]] | None:
    """The exercise whose check is failing now, from the notebook cell being run (see the module's
    text), or ``None``: outside an IPython kernel, in a cell that is no exercise's check cell, or in a
    statement of it that checks a measured result rather than the answer. Never raises."""
    try:
        cell = _cell_frame(frame if frame is not None else sys._getframe(1))
        if cell is None:
            return None
        source = "".join(linecache.getlines(cell.f_code.co_filename))
        solutions = _solutions()
        if not source or solutions is None:
            return None
        stamp = tuple(path.stat().st_mtime for path in sorted(solutions.glob("*.ipynb")))
        session = cell.f_globals.get("session")
        notebook = getattr(session, "notebook", None)
        return match_exercise(source, cell.f_lineno, _cached_check_cells(solutions, stamp),
                              notebook if isinstance(notebook, str) else None)
    except Exception:  # noqa: BLE001 - telling the exercise is a courtesy: a failure here must not hide the check's
        return None
