"""The inference benchmark's results as files and tables: where a results file goes (``--output-dir``)
and a pandas table of results. Appending and loading are ``tinyllama.harness.records``' (shared by both
benchmarks)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from tinyllama.harness.records import ResultsFileError, append_csv, append_json, load_json, unique_path

__all__ = ["ResultsFileError", "append_csv", "append_json", "load_json", "resolve", "results_frame", "unique_path"]


def resolve(path: str | os.PathLike[str], output_dir: str | os.PathLike[str] | None) -> Path:
    """A relative ``path`` is taken inside ``output_dir`` (the current directory when ``None``)."""
    path = Path(path).expanduser()
    if path.is_absolute() or output_dir is None:
        return path
    return Path(output_dir).expanduser() / path


def results_frame(results: Iterable[Any]):  # -> pandas.DataFrame
    """A pandas DataFrame with one row per result (``BenchmarkResult`` objects or record dicts)."""
    import pandas as pd

    rows = [r.as_record() if hasattr(r, "as_record") else dict(r) for r in results]
    return pd.DataFrame(rows)
