"""Saving results without losing earlier ones: JSON files hold a list that only grows."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping


def append_json_records(path: str | os.PathLike[str], records: Iterable[Mapping[str, Any]]) -> Path:
    """Append ``records`` to the JSON list in ``path`` (created if missing) and return the path.

    An existing file that is not a JSON list is left untouched and a ``ValueError`` says so. The new
    file is written beside the old one and renamed over it, so an interrupted write loses nothing.
    """
    path = Path(path)
    existing: list[Any] = []
    if path.exists() and path.stat().st_size:
        try:
            existing = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} exists but is not valid JSON ({error}); choose another file") from None
        if not isinstance(existing, list):
            raise ValueError(f"{path} holds a JSON {type(existing).__name__}, not a list; choose another file")
    existing.extend(dict(r) for r in records)
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


def load_json_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records saved in ``path`` by ``append_json_records`` (a list; empty if the file is missing)."""
    path = Path(path)
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return data if isinstance(data, list) else [data]
