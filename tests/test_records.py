"""Saved results are only ever appended to."""

import json

import pytest

from tinyllama.harness.records import append_json, load_json


def test_records_are_appended_and_nothing_is_left_behind(tmp_path):
    path = tmp_path / "runs.json"
    append_json(path, [{"run": 1}])
    append_json(path, [{"run": 2}, {"run": 3}])
    assert [r["run"] for r in load_json(path)] == [1, 2, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.json"]  # no temporary files


def test_a_file_that_is_not_a_list_is_left_untouched(tmp_path):
    path = tmp_path / "notes.json"
    path.write_text('{"mine": true}')
    with pytest.raises(ValueError, match="not a list"):
        append_json(path, [{"run": 1}])
    assert json.loads(path.read_text()) == {"mine": True}
    broken = tmp_path / "broken.json"
    broken.write_text("{oops")
    with pytest.raises(ValueError, match="not valid JSON"):
        append_json(broken, [{"run": 1}])
    assert broken.read_text() == "{oops"


def test_a_missing_file_has_no_records(tmp_path):
    assert load_json(tmp_path / "nothing.json") == []
