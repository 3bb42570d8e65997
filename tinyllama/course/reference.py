"""The reference run's figures: what each solution notebook recorded in the run that made its stored outputs.

The instructor's runner (:mod:`tinyllama.course.run_solutions`) keeps, in the metadata of every notebook
it executes (``metadata["tinyllama"]["records"]``), the records that notebook appended to the results
file during that run. With ``--update-solutions`` they are stored in ``solutions/`` together with the
outputs, so the figures a participant compares with are always those of the run whose outputs the
solution notebooks show (the reference GPU run, see ``benchmarks/gpu/solutions_gpu.sh``): one source, never a
copy that could drift. The participant copies in ``notebooks/`` do not carry them.

:func:`load_reference` reads them into the long table of :func:`tinyllama.course.results.load_results`,
so a participant's figures and the reference's line up figure by figure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, MutableMapping

import pandas as pd

from tinyllama.course.results import checkout_root, records_table

METADATA_KEY = "tinyllama"
RECORDS_KEY = "records"
# The instructor's user and host name say nothing about the figures: they are not kept in solutions/.
_PRIVATE_FIELDS = ("user", "host")


def solutions_dir(solutions: str | Path | None = None) -> Path:
    """The folder of solution notebooks: ``solutions``, else ``solutions/`` of the course checkout."""
    folder = Path(solutions) if solutions is not None else (checkout_root() or Path.cwd()) / "solutions"
    if not folder.is_dir():
        raise FileNotFoundError(f"no solution notebooks in {folder}: the reference figures are read from the course "
                                "checkout's solutions/ folder (pass solutions=... or ask your instructor where it is)")
    return folder


def attach_records(nb: MutableMapping[str, Any], records: Iterable[dict[str, Any]]) -> int:
    """Store ``records`` (entries of the results file) in the notebook's metadata, replacing those of an
    earlier run; returns how many. Called by the runner on each executed notebook."""
    kept = [{key: value for key, value in entry.items() if key not in _PRIVATE_FIELDS} for entry in records]
    metadata = nb.setdefault("metadata", {})
    section = dict(metadata.get(METADATA_KEY) or {})
    section[RECORDS_KEY] = kept
    metadata[METADATA_KEY] = section
    return len(kept)


def notebook_records(path: str | Path) -> list[dict[str, Any]]:
    """The records stored in one solution notebook's metadata (empty when its outputs predate them)."""
    # Only the metadata is needed: plain JSON, without nbformat's validation of every cell and output.
    with open(path, encoding="utf-8") as f:
        metadata = json.load(f).get("metadata") or {}
    section = metadata.get(METADATA_KEY) or {}
    records = section.get(RECORDS_KEY) or []
    return [dict(entry) for entry in records if isinstance(entry, dict) and isinstance(entry.get("figures"), dict)]


def reference_records(solutions: str | Path | None = None) -> list[dict[str, Any]]:
    """Every record stored in the solution notebooks, in course order."""
    folder = solutions_dir(solutions)
    return [entry for path in sorted(folder.glob("*.ipynb")) for entry in notebook_records(path)]


def load_reference(solutions: str | Path | None = None) -> pd.DataFrame:
    """The reference run's figures as a long table, the columns of
    :func:`tinyllama.course.results.load_results` (one row per figure)."""
    return records_table(reference_records(solutions))


def without_reference(solutions: str | Path | None = None) -> list[str]:
    """Solution notebooks (by name) whose stored outputs carry no recorded figures: run them with
    ``python -m tinyllama.course.run_solutions --notebooks NN --update-solutions``."""
    folder = solutions_dir(solutions)
    return [path.stem for path in sorted(folder.glob("*.ipynb")) if not notebook_records(path)]


def describe_run(table: pd.DataFrame) -> str:
    """One line naming the device(s), software, profile(s) and date(s) of the figures in ``table``
    (a table of :func:`load_reference` or :func:`~tinyllama.course.results.load_results`)."""
    if table.empty:
        return "no figures"

    def listed(column: str) -> str:
        values = [str(value) for value in table[column].dropna().unique()]
        return " / ".join(values) if values else "unknown"

    times = pd.to_datetime(table["time"], utc=True).dropna()
    first, last = (times.min().date(), times.max().date()) if len(times) else (None, None)
    dates = "date unknown" if first is None else (f"{first}" if first == last else f"{first} to {last}")
    return (f"{listed('device')} ({listed('backend')}), torch {listed('torch')}, triton {listed('triton')}, "
            f"profile {listed('profile')}, {dates}")

