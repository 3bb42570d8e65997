"""The benchmark records: one JSON list of runs per topic (benchmarks/records/, and the topics notebooks read,
shipped as package data), each run saying when, where, at which commit and from which file it came; no dated
rerun files with letter suffixes; every record and history file that BENCHMARKS.md names exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tinyllama.harness.records import RUN_KEYS, append_json, load_json, packaged_record, run_record

ROOT = Path(__file__).resolve().parents[1]
RECORD_FOLDERS = [ROOT / "benchmarks" / "records", ROOT / "inference" / "data", ROOT / "tinyllama" / "course" / "data"]
RECORDS = sorted(p for folder in RECORD_FOLDERS for p in folder.glob("*.json"))
# A date with a letter after it (2026-11-23b_...) names a rerun of the same day: a diary, not a record.
LETTER_SUFFIXED = re.compile(r"\d{4}-\d{2}-\d{2}[a-z]_")


def test_there_are_records_in_every_home():
    for folder in RECORD_FOLDERS:
        assert any(folder.glob("*.json")), f"no record in {folder.relative_to(ROOT)}"


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_record_is_a_list_of_runs_with_their_origin(path):
    runs = json.loads(path.read_text())
    assert isinstance(runs, list) and runs, f"{path.name}: not a non-empty JSON list"
    for run in runs:
        missing = [key for key in (*RUN_KEYS, "topic") if key not in run]
        assert not missing, f"{path.name}: a run ({run.get('source')}) lacks {missing}"
        assert run["topic"] == path.stem, f"{path.name}: a run of topic {run['topic']!r}"
        assert "data" in run or "summary" in run, f"{path.name}: the run from {run['source']} holds nothing"
        assert isinstance(run["gpus"], int) and run["gpus"] >= 1
    sources = [run["source"] for run in runs]
    assert len(sources) == len(set(sources)), f"{path.name}: a source recorded twice"


def test_no_file_in_benchmarks_has_a_letter_suffixed_date():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks").rglob("*") if LETTER_SUFFIXED.search(p.name)]
    assert not offenders, offenders


def test_the_diary_is_gone_and_each_history_names_its_records():
    assert not (ROOT / "benchmarks" / "NOTES.md").exists()
    histories = sorted((ROOT / "benchmarks" / "history").glob("*.md"))
    assert histories
    for history in histories:
        assert "records/" in history.read_text() or "data/" in history.read_text(), f"{history.name} names no record"


def test_every_record_and_history_named_by_benchmarks_md_exists():
    text = (ROOT / "BENCHMARKS.md").read_text()
    named = set(re.findall(r"(?:benchmarks/(?:records|history|figures)|inference/data|tinyllama/course/data)/[\w.-]+",
                           text))
    assert any(n.startswith("benchmarks/records/") for n in named) and any("history" in n for n in named)
    missing = sorted(n for n in named if not (ROOT / n).exists())
    assert not missing, f"BENCHMARKS.md names files that are not there: {missing}"
    # A run is named by its source (the file it was first written as), which must be in some record.
    sources = {run["source"] for path in RECORDS for run in json.loads(path.read_text())}
    named_runs = set(re.findall(r"`(\d{4}-\d{2}-\d{2}[a-z]?_[\w.-]+\.(?:json|md|txt))`", text))
    assert named_runs and not named_runs - sources, f"runs named but not recorded: {sorted(named_runs - sources)}"


def test_each_table_of_benchmarks_md_names_its_record():
    sections = re.split(r"\n## ", (ROOT / "BENCHMARKS.md").read_text())[1:]
    without = [s.splitlines()[0] for s in sections if "|" in s and "records/" not in s and "data/" not in s]
    assert not without, f"sections with a table but no record: {without}"


def test_the_packaged_records_are_read_by_topic():
    runs = packaged_record("inference", "inference_scaling")
    assert [run["source"] for run in runs][:1] == ["2026-11-22_2xh200_inference_torchrun.json"]
    assert packaged_record("tinyllama.course", "distributed")[0]["gpus"] == 1
    with pytest.raises(FileNotFoundError, match="nothing_here"):
        packaged_record("inference", "nothing_here")


def test_a_run_appends_with_its_origin_and_unchanged_data(tmp_path):
    path = tmp_path / "topic.json"
    data = {"median_ms": 1.25, "rows": [1, 2, 3]}
    append_json(path, [run_record(data, device="NVIDIA H200", source="script.py", topic="topic")])
    append_json(path, [run_record([4.5], device="CPU", source="script.py", commit="abc1234", gpus=2, topic="topic")])
    first, second = load_json(path)
    assert first["data"] == data and first["commit"] == "unknown" and first["gpus"] == 1 and first["date"]
    assert second["commit"] == "abc1234" and second["gpus"] == 2 and second["data"] == [4.5]
