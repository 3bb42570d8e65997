"""``course.reveal("13.2")``: the reference answer of one exercise, for a participant who is stuck.

The answer lives in the solution notebook (``solutions/13_*.ipynb``, between ``# BEGIN SOLUTION 13.2``
and ``# END SOLUTION``). :func:`reveal` prints that block and runs the whole solution cell in the
notebook's namespace, so the names the exercise defines (a function, a kernel, a variable) exist and
the rest of the notebook runs. The participant's own attempt is not touched.
"""

from __future__ import annotations

import linecache
import sys
import textwrap
from pathlib import Path
from typing import Any, MutableMapping

import nbformat

from tinyllama.course.results import checkout_root


def solution_notebook(exercise: str, solutions: Path | None = None) -> Path:
    """The solution notebook that holds ``exercise`` (``"13.2"`` -> ``solutions/13_*.ipynb``)."""
    from tinyllama.course.make_notebooks import EXERCISE_ID  # not at import: `python -m` runs that module

    if not EXERCISE_ID.fullmatch(str(exercise)):
        raise ValueError(f"exercise id {exercise!r} is not of the form NN.k, e.g. course.reveal('13.2')")
    folder = solutions or ((checkout_root() or Path.cwd()) / "solutions")
    matches = sorted(folder.glob(f"{exercise[:2]}_*.ipynb"))
    if not matches:
        raise FileNotFoundError(f"no solution notebook for exercise {exercise} in {folder}: the course checkout's "
                                "solutions/ folder is needed (ask your instructor where the course is installed)")
    return matches[0]


def _runnable(source: str) -> str:
    """Cell source as Python: IPython magics turned into calls when IPython is there."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        return source
    return TransformerManager().transform_cell(source)


def run_cell(source: str, namespace: MutableMapping[str, Any], filename: str) -> None:
    """``exec`` a notebook cell's source in ``namespace`` under ``filename``, registered with ``linecache`` as a
    notebook kernel does: a compiled ``@triton.jit`` reads its function's source from there (the Triton
    interpreter does not, so without it a cell runs on a CPU and fails on a GPU)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)


def reveal(exercise: str, namespace: MutableMapping[str, Any] | None = None, run: bool = True,
           solutions: Path | None = None) -> str:
    """Show the reference answer of ``exercise`` and, with ``run``, execute its solution cell in
    ``namespace`` (default: the calling notebook's globals). Returns the answer's code."""
    from tinyllama.course.make_notebooks import exercises

    path = solution_notebook(exercise, solutions)
    nb = nbformat.read(path, as_version=4)
    found = exercises(nb, path.stem)
    if exercise not in found:
        known = ", ".join(sorted(found)) or "none"
        raise KeyError(f"{path.name} has no exercise {exercise} (its exercises: {known})")
    index, block = found[exercise]
    answer = textwrap.dedent("\n".join(block.lines)).strip("\n")
    print(f"Reference answer of exercise {exercise} ({path.name}, cell {index}):\n")
    print(textwrap.indent(answer, "    "))
    if run:
        target = namespace if namespace is not None else sys._getframe(1).f_globals
        run_cell(_runnable(nb.cells[index].source), target, f"<solution of exercise {exercise}>")
        print(f"\nThe solution cell of exercise {exercise} has run: its names are defined; go on with the next cell.")
    return answer
