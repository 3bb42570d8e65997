"""Results files that only grow, for ``tinyllama`` and ``inference`` alike: a JSON file holds a list
that each save appends to; a CSV file gets its header once and a row per result. Nothing written
earlier is ever lost: a file that is not such a list is refused, and rows whose columns differ from
a CSV file's header go to a new file beside it (``runs-1.csv``)."""

from __future__ import annotations

import csv
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

from tinyllama.errors import BenchmarkError


class ResultsFileError(BenchmarkError, ValueError):
    """A results file exists but is not one this module can append to."""


def load_json(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records saved in ``path`` by ``append_json`` (empty if the file is missing or empty).
    Raises ``ResultsFileError`` for a file that is not a JSON list."""
    path = Path(path)
    if not path.exists() or not path.stat().st_size:
        return []
    try:
        records = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ResultsFileError(f"{path} exists but is not valid JSON ({error}); choose another file") from None
    if not isinstance(records, list):
        raise ResultsFileError(f"{path} holds a JSON {type(records).__name__}, not a list; choose another file")
    return records


def append_json(path: str | os.PathLike[str], records: Iterable[Mapping[str, Any]]) -> Path:
    """Append ``records`` to the JSON list in ``path`` (created if missing) and return the path.

    An existing file that is not a JSON list is left untouched and ``ResultsFileError`` says so. The
    new file is written beside the old one and renamed over it, so an interrupted write loses nothing.
    """
    path = Path(path)
    existing = load_json(path) + [dict(r) for r in records]
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as f:
            json.dump(existing, f, indent=1, default=str)
            f.write("\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def unique_path(path: str | os.PathLike[str]) -> Path:
    """``path`` if nothing is there yet, else ``stem-1.suffix``, ``stem-2.suffix``, ..."""
    path = Path(path)
    if not path.exists():
        return path
    for n in range(1, 100_000):
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
        if not candidate.exists():
            return candidate
    raise ResultsFileError(f"too many files named like {path}")


def _cell(value: Any) -> Any:
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=str)
    return "" if value is None else value


def append_csv(path: str | os.PathLike[str], records: Iterable[Mapping[str, Any]]) -> Path:
    """Append ``records`` (flat dicts) as rows, the columns being every key in order of appearance;
    the header goes only into a new file. Returns the file written: a new one beside ``path`` when
    ``path``'s header differs."""
    rows = [dict(r) for r in records]
    if not rows:
        return Path(path)
    columns = list(dict.fromkeys(key for row in rows for key in row))
    target = Path(path)
    if target.exists() and target.stat().st_size > 0:
        with target.open(newline="") as f:
            header = next(csv.reader(f), [])
        if header != columns:
            target = unique_path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    new_file = not target.exists() or target.stat().st_size == 0
    with target.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        if new_file:
            writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(v) for k, v in row.items()})
    return target
