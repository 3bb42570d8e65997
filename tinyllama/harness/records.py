"""Results files that only grow, for ``tinyllama`` and ``inference`` alike: a JSON file holds a list
that each save appends to; a CSV file gets its header once and a row per result. Nothing written
earlier is ever lost: a file that is not such a list is refused, and rows whose columns differ from
a CSV file's header go to a new file beside it (``runs-1.csv``). :func:`markdown_table` writes every
markdown table of the packages and the GPU scripts.

The benchmark records (``benchmarks/records/<topic>.json``, and the topics notebooks read, shipped as package
data: ``inference/data/``, ``tinyllama/course/data/``) are such lists, one run per entry, each with the keys of
:data:`RUN_KEYS` and the run's own ``data``; :func:`run_record` builds one, :func:`packaged_record` reads a
shipped one."""

from __future__ import annotations

import csv
import datetime as _dt
import json
import math
import numbers
import os
import re
import tempfile
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from tinyllama.config import BenchmarkError

if TYPE_CHECKING:
    import pandas as pd


class ResultsFileError(BenchmarkError, ValueError):
    """A results file exists but is not one this module can append to."""


def load_json(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records saved in ``path`` by ``append_json`` (empty if the file is missing or empty).
    Raises ``ResultsFileError`` for a file that is not a JSON list."""
    path = Path(path)
    if not path.exists() or not path.stat().st_size:
        return []
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
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
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            json.dump(existing, f, indent=1, default=str, ensure_ascii=False)
            f.write("\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


# Every run of a benchmark record names when, where, at which commit and from which script or file it came.
RUN_KEYS = ("date", "device", "gpus", "commit", "source")


def run_record(data: Any, *, device: str, source: str, commit: str | None = None, gpus: int = 1,
               date: str | None = None, **extra: Any) -> dict[str, Any]:
    """One run for a topic record: ``data`` unchanged beside the keys of :data:`RUN_KEYS` (``commit``
    ``"unknown"`` when not given, ``date`` now in UTC when not given) and any ``extra`` (``summary``, ...)."""
    return {"date": date or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "device": device,
            "gpus": int(gpus), "commit": commit or "unknown", "source": source, **extra, "data": data}


def packaged_record(package: str, topic: str) -> list[dict[str, Any]]:
    """The runs of the record ``<package>/data/<topic>.json`` shipped with the course (package data, so an
    install without the checkout has it), oldest first. ``FileNotFoundError`` names the file when it is missing."""
    resource = resources.files(package).joinpath("data", f"{topic}.json")
    if not resource.is_file():
        raise FileNotFoundError(f"the course's recorded {topic} runs are missing: {package.replace('.', '/')}/data/"
                                f"{topic}.json is not installed; reinstall the course (bash course.sh kernel)")
    runs = json.loads(resource.read_text())
    if not isinstance(runs, list):
        raise ResultsFileError(f"{package}/data/{topic}.json holds a JSON {type(runs).__name__}, not a list of runs")
    return runs


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


# A cell that reads as a number: a number, or text that starts with one ("12.3 TB/s", "45%", "1.20x", "9.8-10.2").
_NUMERIC = re.compile(r"[-+]?\.?\d[\d,.]*(e[-+]?\d+)?(?=$|[\s%x-])", re.IGNORECASE)


def markdown_table(frame: pd.DataFrame, digits: int = 3) -> str:
    """``frame`` as a GitHub markdown table, without its index, through ``DataFrame.to_markdown`` (tabulate).

    Numbers to ``digits`` significant figures (whole, with thousands separators, where that would take an
    exponent: ``12,345``), integers as they are, None and NaN blank; in text a ``|`` is escaped and a line
    break becomes a space. A column is right-aligned when each of its cells other than blank, ``-`` and
    ``n/a`` reads as a number: a number, or text that starts with one (``12.3 TB/s``, ``45%``, ``1.20x``)."""
    def cell(value: Any) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return ""
        if isinstance(value, numbers.Integral):
            return str(value)
        if isinstance(value, numbers.Real):
            text = f"{value:.{digits}g}"
            return f"{value:,.0f}" if "e+" in text else text
        return str(value).replace("|", "\\|").replace("\n", " ")

    def numeric(column: Iterable[str]) -> bool:
        shown = [v for v in column if v not in ("", "-", "n/a")]
        return bool(shown) and all(_NUMERIC.match(v) for v in shown)

    text = frame.map(cell)
    align = ["right" if numeric(text.iloc[:, i]) else "left" for i in range(text.shape[1])]
    return text.to_markdown(index=False, disable_numparse=True, colalign=align)
