"""Saved results are only ever appended to; their markdown tables are all written one way."""

import json

import pandas as pd
import pytest

from tinyllama.harness.records import append_json, load_json, markdown_table


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


def test_every_markdown_table_is_written_one_way():
    frame = pd.DataFrame({"run": ["v1", "a|b"], "ms": [12.3456, float("nan")], "tokens/s": [123456.7, 999.7],
                          "batch": [8, 16], "share": ["45.1%", "-"], "note": [None, "two\nlines"]})
    # 3 significant figures, whole numbers with separators instead of an exponent, integers as they are, NaN and
    # None blank, a | escaped; text left-aligned, numbers (and text that starts with one) right-aligned.
    assert markdown_table(frame).splitlines() == [
        "| run   |   ms |   tokens/s |   batch |   share | note      |",
        "|:------|-----:|-----------:|--------:|--------:|:----------|",
        "| v1    | 12.3 |    123,457 |       8 |   45.1% |           |",
        "| a\\|b  |      |      1,000 |      16 |       - | two lines |"]
    assert markdown_table(frame, digits=4).splitlines()[2:] == [
        "| v1    | 12.35 |    123,457 |       8 |   45.1% |           |",
        "| a\\|b  |       |      999.7 |      16 |       - | two lines |"]


def test_appended_records_keep_their_text_as_written(tmp_path):
    # Records name operators and devices with non-ASCII signs ("64x3x7x7 · 64"): an append must not rewrite the
    # earlier records as escapes, or every append shows as a change to all of them.
    path = tmp_path / "runs.json"
    append_json(path, [{"layer": "aten::convolution 64x3 · 64x3"}])
    append_json(path, [{"layer": "second"}])
    text = path.read_text(encoding="utf-8")
    assert "64x3 · 64x3" in text and "\\u00b7" not in text
    assert [r["layer"] for r in load_json(path)] == ["aten::convolution 64x3 · 64x3", "second"]
