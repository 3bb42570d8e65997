"""Saving results without losing earlier ones: JSON files hold a list that only grows."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable


def append_json_records(path: str | os.PathLike[str], records: Iterable[dict[str, Any]]) -> Path:
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
    existing.extend(records)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as tmp:
        json.dump(existing, tmp, indent=1, default=str)
    os.replace(tmp.name, path)
    return path


def load_json_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records saved in ``path`` by ``append_json_records`` (a list; empty if the file is missing)."""
    path = Path(path)
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return data if isinstance(data, list) else [data]
