"""Regressions: a comparison record against an earlier one, figure by figure. A timed figure is
flagged only when it moved by more than the two runs' own spread (p10..p90 of the timed steps)."""

from __future__ import annotations

from typing import Any

from tinyllama.timing import Band, verdict

# Figures with a spread (p10..p90 of the timed steps), and whether larger is better.
_TIMED_FIGURES = ("step_ms", "forward_ms", "backward_ms", "optimizer_ms")
# Peak memory has no spread: a change smaller than this is noise of the allocator.
MEMORY_TOLERANCE = 0.01


def find_regressions(baseline: Any, new: Any) -> Any:
    """Compare each figure of each run present in both records (pandas DataFrame, one row a figure).

    A timed figure is flagged ``slower``/``faster`` when the new run's p10..p90 range lies entirely
    above/below the old one's: it moved by more than the two runs' own spread. tokens/s and MFU move
    with the step time and are judged by its range; peak memory is flagged beyond 1%. A run that
    now fails its check is flagged ``fails check``. ``result.attrs["warnings"]`` says when the two
    records were taken on different devices, torch versions or problem sizes.
    """
    import pandas as pd

    old_record, new_record = (r if isinstance(r, dict) else r.record for r in (baseline, new))
    warnings = [f"{key} differs: baseline {old_record.get(key)!r}, now {new_record.get(key)!r}"
                for key in ("device", "preset", "batch_size", "seq_len")
                if old_record.get(key) != new_record.get(key)]
    old_torch, new_torch = (r.get("environment", {}).get("torch") for r in (old_record, new_record))
    if old_torch != new_torch:
        warnings.append(f"torch differs: baseline {old_torch}, now {new_torch}")
    old_runs = {r["label"]: r for r in old_record["runs"]}
    rows: list[dict[str, Any]] = []
    for run in new_record["runs"]:
        old = old_runs.get(run["label"])
        if old is None:
            rows.append(_verdict(run["label"], "run", None, None, None, "new run"))
            continue
        if run["check"] != "passed" or old["check"] != "passed":
            flag = "fails check" if run["check"] != "passed" and old["check"] == "passed" else (
                "now passes check" if run["check"] == "passed" else "not timed in either")
            rows.append(_verdict(run["label"], "check", None, None, None, flag))
            continue
        for figure in _TIMED_FIGURES:
            rows.append(_band_verdict(run["label"], figure, old, new=run, larger_is_better=False))
        for figure in ("tokens_per_s", "mfu_measured"):
            if old.get(figure) is not None and run.get(figure) is not None:
                rows.append(_band_verdict(run["label"], figure, old, new=run, larger_is_better=True))
        if old.get("peak_memory_mib") is not None and run.get("peak_memory_mib") is not None:
            a, b = old["peak_memory_mib"], run["peak_memory_mib"]
            flag = ("more memory" if b > a * (1 + MEMORY_TOLERANCE) else
                    "less memory" if b < a * (1 - MEMORY_TOLERANCE) else "within spread")
            rows.append(_verdict(run["label"], "peak_memory_mib", a, b, f"+-{100 * MEMORY_TOLERANCE:.0f}%", flag))
    for label in old_runs.keys() - {r["label"] for r in new_record["runs"]}:
        rows.append(_verdict(label, "run", None, None, None, "missing now"))
    frame = pd.DataFrame(rows, columns=["run", "figure", "baseline", "now", "change_pct", "allowed", "flag"])
    frame.attrs["warnings"] = warnings
    return frame


def _verdict(label: str, figure: str, old: float | None, new: float | None, allowed: str | None,
             flag: str) -> dict[str, Any]:
    change = 100.0 * (new / old - 1.0) if old and new is not None else None
    return {"run": label, "figure": figure, "baseline": old, "now": new, "change_pct": change,
            "allowed": allowed, "flag": flag}


def _band(run: dict[str, Any], figure: str) -> tuple[float, float, float]:
    """(value, low, high) of a figure. Step-derived figures (tokens/s, MFU) scale with 1/step time."""
    if figure in _TIMED_FIGURES:
        return run[f"{figure}_median"], run[f"{figure}_p10"], run[f"{figure}_p90"]
    value, median = run[figure], run["step_ms_median"]
    return value, value * median / run["step_ms_p90"], value * median / run["step_ms_p10"]


def _band_verdict(label: str, figure: str, old: dict[str, Any], new: dict[str, Any],
                  larger_is_better: bool) -> dict[str, Any]:
    """The course's one comparison (:func:`tinyllama.timing.verdict`) on the two records' p10..p90 bands: two
    records come from two processes, so each run's own spread is what a move must beat."""
    a, a_lo, a_hi = _band(old, figure)
    b, b_lo, b_hi = _band(new, figure)
    _, said = verdict(Band(a, a_lo, a_hi), Band(b, b_lo, b_hi), on="spread")  # "faster": the new band lies below
    flag = {"faster": "worse" if larger_is_better else "faster",
            "slower": "better" if larger_is_better else "slower"}.get(said, "within spread")
    return _verdict(label, figure, a, b, f"{a_lo:.4g}..{a_hi:.4g}", flag)


REGRESSION_FLAGS = frozenset({"slower", "worse", "more memory", "fails check", "missing now"})
