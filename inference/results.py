"""Recording results without ever losing one: CSV and JSON files that only grow.

A CSV file gets its header once and a row per result; a JSON file holds a list and each result is
appended to it. A file whose columns differ from the new record's (an older version of the
benchmark wrote it) is left as it is, and the rows go to a new file beside it.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from inference.config import BenchmarkError
from tinyllama.records import append_json_records


class ResultsFileError(BenchmarkError):
    """A results file exists but is not one this module can append to."""


def unique_path(path: Path) -> Path:
    """``path`` if nothing is there yet, else ``stem-1.suffix``, ``stem-2.suffix``, ..."""
    path = Path(path)
    if not path.exists():
        return path
    for n in range(1, 100_000):
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
        if not candidate.exists():
            return candidate
    raise ResultsFileError(f"too many files named like {path}")


def resolve(path: str | os.PathLike[str], output_dir: str | os.PathLike[str] | None) -> Path:
    """A relative ``path`` is taken inside ``output_dir`` (the current directory when ``None``)."""
    path = Path(path).expanduser()
    if path.is_absolute() or output_dir is None:
        return path
    return Path(output_dir).expanduser() / path


def _cell(value: Any) -> Any:
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return "" if value is None else value


def append_csv(path: str | os.PathLike[str], records: Iterable[Mapping[str, Any]]) -> Path:
    """Append ``records`` (flat dicts with the same keys) as rows; write the header only into a new
    file. Returns the file written, which differs from ``path`` when ``path``'s header differs."""
    rows = [dict(r) for r in records]
    if not rows:
        return Path(path)
    columns = list(rows[0])
    target = Path(path)
    if target.exists() and target.stat().st_size > 0:
        with target.open(newline="") as f:
            header = next(csv.reader(f), [])
        if header != columns:
            target = unique_path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    new_file = not target.exists() or target.stat().st_size == 0
    with target.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        if new_file:
            writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(v) for k, v in row.items()})
    return target


def append_json(path: str | os.PathLike[str], records: Iterable[Mapping[str, Any]]) -> Path:
    """Append ``records`` to the JSON list in ``path`` (created when missing; earlier records kept,
    the file replaced in one step). A file that is not such a list is left alone with an error."""
    try:
        return append_json_records(path, records)
    except ValueError as error:
        raise ResultsFileError(f"{error} (give another --json file)") from None


def load_json(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a results JSON file."""
    records = json.loads(Path(path).read_text())
    if not isinstance(records, list):
        raise ResultsFileError(f"{path} does not hold a list of results")
    return records


def results_frame(results: Iterable[Any]):  # -> pandas.DataFrame
    """A pandas DataFrame with one row per result (``BenchmarkResult`` objects or record dicts)."""
    import pandas as pd

    rows = [r.as_record() if hasattr(r, "as_record") else dict(r) for r in results]
    return pd.DataFrame(rows)
