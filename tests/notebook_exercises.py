"""Run one exercise of a solution notebook in a test: its solution cell (optionally with a planted
mistake) and the check cell after it, in a namespace the test provides.

Each ``tests/test_notebook_NN.py`` uses this to show that the reference answer passes its check and
that a typical wrong answer fails it (under ``WORKSHOP_STRICT=1``, see the ``strict`` fixture)."""

from __future__ import annotations

import hashlib
from typing import Sequence, Union

import nbformat

from tinyllama.course.exercise_stop import check_cell
from tinyllama.course.make_notebooks import exercises
from tinyllama.course.results import checkout_root
from tinyllama.course.reveal import run_cell


# A planted mistake: one (old, new) pair, several applied in order, or none.
Replacements = Union[tuple[str, str], Sequence[tuple[str, str]], None]


def run_source(source: str, namespace: dict) -> None:
    """Run a cell's source as the notebook kernel would (:func:`tinyllama.course.reveal.run_cell`), under a
    file name of its own: a planted mistake is another source, so another name."""
    run_cell(source, namespace, f"<cell {hashlib.sha1(source.encode()).hexdigest()[:12]}>")


class SolutionExercises:
    """The exercises of ``solutions/<stem>.ipynb``: ``found`` maps an exercise id ("16.2") to its cell."""

    def __init__(self, stem: str) -> None:
        path = checkout_root() / "solutions" / f"{stem}.ipynb"
        self.nb = nbformat.read(path, as_version=4)
        self.found = exercises(self.nb, stem)

    def ids(self) -> list[str]:
        """The exercise ids in notebook order."""
        return sorted(self.found, key=lambda exercise: self.found[exercise][0])

    def source(self, exercise: str, replace: Replacements = None) -> str:
        """The solution cell of ``exercise``, with ``replace`` applied: one (old, new) pair or a sequence of
        them, in order (each old must occur)."""
        source = self.nb.cells[self.found[exercise][0]].source
        pairs = [] if replace is None else [replace] if isinstance(replace[0], str) else list(replace)
        for old, new in pairs:
            assert old in source, f"the mistake's anchor {old!r} is not in the solution of {exercise}"
            source = source.replace(old, new)
        return source

    def check_source(self, exercise: str) -> str:
        """The check cell of ``exercise``, by the course's one rule (``exercise_stop.check_cell``: the first
        code cell after the solution that reads a name the answer defines)."""
        index = check_cell(self.nb, self.found, exercise)
        assert index is not None, f"exercise {exercise} has no check cell of its own"
        return self.nb.cells[index].source

    def run(self, exercise: str, namespace: dict, replace: Replacements = None, check: bool = True) -> dict:
        """Execute the solution of ``exercise`` (with ``replace``, see :meth:`source`) and, if ``check``, its
        check cell, in ``namespace``; return the namespace."""
        run_source(self.source(exercise, replace), namespace)
        if check:
            run_source(self.check_source(exercise), namespace)
        return namespace
