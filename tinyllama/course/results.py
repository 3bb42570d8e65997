"""The results tracker: every notebook records what it measured, and nothing recorded is lost.

Each call to :func:`record` appends one JSON line to ``results.jsonl`` in the participant's own
results directory: ``$WORKSHOP_RESULTS_DIR`` if set, else ``~/tinyllama-workshop-results``. Many
users share one checkout on a hub, so a directory inside the checkout is refused. Records are only
ever appended; :func:`load_results` reads them all into a DataFrame for the final dashboard.
"""

from __future__ import annotations

import datetime as _dt
import functools
import getpass
import json
import math
import numbers
import os
import platform
import subprocess
import warnings
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from tinyllama import device as dev

ENV_VARIABLE = "WORKSHOP_RESULTS_DIR"
RUN_ID_VARIABLE = "WORKSHOP_RUN_ID"  # set by the instructor runner, to find the records of one run
DEFAULT_DIRNAME = "tinyllama-workshop-results"
RESULTS_FILE = "results.jsonl"

Figure = float | int | str | bool | None


def checkout_root() -> Path | None:
    """The course checkout this package was imported from, or ``None`` when it is installed
    somewhere else (for example in site-packages)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").exists() or (root / ".git").exists() else None


def results_dir(directory: str | os.PathLike[str] | None = None, create: bool = True) -> Path:
    """Where this user's results go: ``directory``, else ``$WORKSHOP_RESULTS_DIR``, else
    ``~/tinyllama-workshop-results``.

    Raises ``ValueError`` when the directory lies inside the course checkout: the checkout is shared
    by everyone on a hub, and results written there would be mixed up or lost with the next update.
    """
    chosen = directory or os.environ.get(ENV_VARIABLE, "").strip() or Path.home() / DEFAULT_DIRNAME
    path = Path(chosen).expanduser().resolve()
    root = checkout_root()
    if root is not None and path.is_relative_to(root):
        raise ValueError(
            f"results directory {path} is inside the course checkout {root}, which other users share: "
            f"set {ENV_VARIABLE} to a directory of your own (for example ~/{DEFAULT_DIRNAME})"
        )
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def _clean_figure(name: str, value: Any) -> Figure:
    """A JSON-safe figure: Python numbers (numpy and 0-d torch values converted), strings, bools."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()  # numpy scalar or 0-d tensor
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"figure {name!r} is {value}: record only finite numbers (was the "
                             "measurement run? a division by a zero time?)")
        return value
    raise TypeError(f"figure {name!r} has type {type(value).__name__}: record numbers, strings or "
                    "booleans (one figure per name; call .item() on a tensor)")


# A figure's p10-p90 band: a (low, high) pair, or any object with .p10 and .p90 (timing.Stats, timing.Band;
# not imported here, so recording needs no timing code).
SpreadLike = Any


def spread_of(name: str, spread: SpreadLike) -> tuple[float, float]:
    """``spread`` as a ``(low, high)`` pair of finite floats: a pair as given, or the ``p10`` and ``p90``
    of a :class:`tinyllama.timing.Stats` or :class:`~tinyllama.timing.Band`. Raises ``ValueError`` for
    anything else, or a band whose low end lies above its high end."""
    if hasattr(spread, "p10") and hasattr(spread, "p90"):
        pair: Any = (spread.p10, spread.p90)
    elif isinstance(spread, (tuple, list)) and len(spread) == 2:
        pair = spread
    else:
        raise ValueError(f"spread of {name!r} is {spread!r}: give (p10, p90) or the Stats / Band of its timing")
    low, high = (_clean_figure(name, value) for value in pair)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)):
        raise ValueError(f"spread of {name!r} is {spread!r}: its two ends must be numbers")
    if low > high:
        raise ValueError(f"spread of {name!r} runs from {low} down to {high}: give (low, high), p10 before p90")
    return float(low), float(high)


def _clean_spreads(spreads: Mapping[str, SpreadLike], figures: Mapping[str, Figure]) -> dict[str, list[float]]:
    bands: dict[str, list[float]] = {}
    for name, spread in spreads.items():
        name = str(name)
        value = figures.get(name)
        if name not in figures:
            raise ValueError(f"spread given for {name!r}, which is not among the recorded figures "
                             f"({', '.join(sorted(figures)) or 'none'})")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"spread given for {name!r}, whose value {value!r} is not a number")
        bands[name] = list(spread_of(name, spread))
    return bands


COMMIT_VARIABLE = "WORKSHOP_COMMIT"


@functools.lru_cache(maxsize=1)
def course_commit() -> str | None:
    """The commit of the course code that runs: ``$WORKSHOP_COMMIT`` where set (a copy of the tree whose
    ``.git`` is not its own, as on a lent GPU machine), else the checkout's ``HEAD``, with ``-dirty`` when
    its tracked files differ from it; ``None`` outside a git checkout."""
    if os.environ.get(COMMIT_VARIABLE, "").strip():
        return os.environ[COMMIT_VARIABLE].strip()
    root = checkout_root()
    if root is None or not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=root,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container user without a passwd entry
        return str(os.getuid())


def record(
    notebook: str,
    figures: Mapping[str, Any],
    *,
    profile: str | None = None,
    device: str | None = None,
    notes: str | None = None,
    directory: str | os.PathLike[str] | None = None,
    quiet: bool = False,
    spreads: Mapping[str, SpreadLike] | None = None,
) -> Path:
    """Append one record of ``figures`` measured in ``notebook`` to the results file.

    The record is stamped with the date, the user, the profile, the course's commit
    (:func:`course_commit`), and
    :func:`tinyllama.device.environment_summary` (back end, device, versions). Returns the file.

    ``spreads`` gives, for timed figures, the p10-p90 band of the samples behind them: a ``(low, high)``
    pair, or the :class:`tinyllama.timing.Stats` / :class:`tinyllama.timing.Band` itself. Two runs'
    figures then agree when their bands overlap (:mod:`tinyllama.course.drift`), not within a fixed
    tolerance. Each name must be a numeric figure of ``figures``.
    """
    if not notebook:
        raise ValueError("name the notebook the figures come from, e.g. record('01_inference_baseline', {...})")
    if not figures:
        raise ValueError("no figures to record: pass a dict such as {'throughput_img_s': 1234.5}")
    cleaned = {str(name): _clean_figure(str(name), value) for name, value in figures.items()}
    bands = _clean_spreads(spreads or {}, cleaned)
    entry = {
        "time": _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds"),
        "notebook": notebook,
        "profile": profile,
        "user": _user(),
        "host": platform.node(),
        "run_id": os.environ.get(RUN_ID_VARIABLE) or None,
        "commit": course_commit(),
        "notes": notes,
        "environment": dev.environment_summary(device),
        "figures": cleaned,
    }
    if bands:  # absent, not empty, where none is given: records written before spreads existed look the same
        entry["spreads"] = bands
    path = results_dir(directory) / RESULTS_FILE
    line = json.dumps(entry, sort_keys=False) + "\n"
    # One write on a file opened for appending: earlier records are never touched, and two kernels
    # of the same user appending at once do not interleave within a line.
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
    if not quiet:
        print(f"Recorded {len(cleaned)} figure(s) from {notebook} in {path}")
    return path


def read_records(directory: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """Every record in the results file, oldest first. A damaged line is skipped with a warning
    (and left in the file), so one bad line never hides the others."""
    path = results_dir(directory, create=False) / RESULTS_FILE
    if not path.exists():
        return []
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                if not isinstance(entry, dict) or not isinstance(entry.get("figures"), dict):
                    raise ValueError("not a record")
            except ValueError:
                warnings.warn(f"{path}:{number} is not a valid record and was skipped (it stays in the file)",
                              stacklevel=2)
                continue
            records.append(entry)
    return records


# commit, spread_low and spread_high come last: records written before them read as missing values.
COLUMNS = ["time", "notebook", "figure", "value", "profile", "backend", "device", "torch", "triton",
           "user", "host", "run_id", "notes", "commit", "spread_low", "spread_high"]


def load_results(directory: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """All recorded figures as a long table: one row per figure, with the record's time, notebook,
    profile, back end, device, versions and commit, and the figure's p10-p90 spread where one was
    recorded (``spread_low``, ``spread_high``). Empty (with the same columns) when nothing is recorded.

    ``df.pivot_table(index="notebook", columns="figure", values="value", aggfunc="last")`` gives the
    latest value of each figure per notebook.
    """
    return records_table(read_records(directory))


def records_table(records: list[dict[str, Any]]) -> pd.DataFrame:
    """Records (as :func:`read_records` returns them) as the long table of :func:`load_results`."""
    rows = []
    for entry in records:
        environment = entry.get("environment") or {}
        spreads = entry.get("spreads") or {}
        for figure, value in entry["figures"].items():
            low, high = spreads.get(figure) or (None, None)
            rows.append({
                "time": entry.get("time"), "notebook": entry.get("notebook"), "figure": figure,
                "value": value, "profile": entry.get("profile"), "backend": environment.get("backend"),
                "device": environment.get("device"), "torch": environment.get("torch"),
                "triton": environment.get("triton"), "user": entry.get("user"), "host": entry.get("host"),
                "run_id": entry.get("run_id"), "notes": entry.get("notes"), "commit": entry.get("commit"),
                "spread_low": low, "spread_high": high,
            })
    table = pd.DataFrame(rows, columns=COLUMNS)
    table["time"] = pd.to_datetime(table["time"], utc=True)
    return table


def latest(figure: str, notebook: str | None = None, default: Any = None,
           directory: str | os.PathLike[str] | None = None) -> Any:
    """The most recently recorded value of ``figure`` (from ``notebook`` if given), else ``default``:
    how a later notebook reads a prediction or a measurement recorded in an earlier one."""
    for entry in reversed(read_records(directory)):
        if notebook is not None and entry.get("notebook") != notebook:
            continue
        if figure in entry["figures"]:
            return entry["figures"][figure]
    return default
