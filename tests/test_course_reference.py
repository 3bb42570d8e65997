"""The reference figures: the runner keeps each notebook's records in its metadata, the solutions carry
them, the participant copies do not, and they load into the same table as a participant's results."""

import re

import nbformat
import pandas as pd
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from tinyllama.course import reference, results
from tinyllama.course.make_notebooks import participant_notebook


def _entry(notebook, figures, time="2026-11-23T07:00:00+00:00", device="NVIDIA H200"):
    return {"time": time, "notebook": notebook, "profile": "gpu", "user": "instructor", "host": "node7",
            "run_id": "run-1", "notes": None, "figures": figures,
            "environment": {"backend": "cuda", "device": device, "torch": "2.11.0", "triton": "3.6.0"}}


def test_attached_records_load_as_the_results_table_without_user_or_host(tmp_path):
    nb = new_notebook(cells=[new_code_cell("x = 1")])
    assert reference.attach_records(nb, [_entry("00_a", {"copy_tbs": 4.1, "verdict": "PASS"})]) == 1
    nbformat.write(nb, tmp_path / "00_a.ipynb")
    nbformat.write(new_notebook(cells=[new_code_cell("y = 2")]), tmp_path / "01_b.ipynb")
    nb = new_notebook(cells=[])
    reference.attach_records(nb, [_entry("02_c", {"speedup": 2.0}, time="2026-11-24T01:00:00+00:00")])
    nbformat.write(nb, tmp_path / "02_c.ipynb")

    records = reference.reference_records(tmp_path)
    assert [r["notebook"] for r in records] == ["00_a", "02_c"]
    assert all("user" not in r and "host" not in r for r in records)
    table = reference.load_reference(tmp_path)
    assert list(table.columns) == results.COLUMNS and len(table) == 3
    assert table.set_index("figure").loc["copy_tbs", "value"] == 4.1
    assert reference.without_reference(tmp_path) == ["01_b"]
    line = reference.describe_run(table)
    assert "NVIDIA H200 (cuda)" in line and "torch 2.11.0" in line and "2026-11-23 to 2026-11-24" in line


def test_attaching_again_replaces_the_earlier_runs_records():
    nb = new_notebook(cells=[])
    reference.attach_records(nb, [_entry("00_a", {"x": 1})])
    reference.attach_records(nb, [_entry("00_a", {"x": 2})])
    assert [r["figures"]["x"] for r in nb.metadata["tinyllama"]["records"]] == [2]


def test_a_missing_solutions_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="solutions"):
        reference.load_reference(tmp_path / "nowhere")
    assert reference.describe_run(reference.load_reference(tmp_path)) == "no figures"


def test_the_participant_copy_does_not_carry_the_reference_records():
    nb = new_notebook(cells=[new_code_cell("x = 1")])
    reference.attach_records(nb, [_entry("00_a", {"x": 1})])
    assert "tinyllama" not in participant_notebook(nb, "00_a").metadata


def test_the_course_solutions_carry_the_records_of_the_run_their_outputs_show():
    table = reference.load_reference()
    assert not table.empty and pd.api.types.is_datetime64_any_dtype(table["time"])
    assert table[table.notebook < "16"]["profile"].eq("gpu").all()  # 00-15: the reference GPU run
    for path in reference.solutions_dir().glob("*.ipynb"):
        records = reference.notebook_records(path)
        # Every stored record names the notebook it sits in, and the profile its outputs were made at.
        assert {r["notebook"] for r in records} <= {path.stem}
        outputs = (o for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code" for o in c.outputs)
        first = next(outputs, None)
        if first is None:  # not run yet: no records either
            assert not records, path.name
            continue
        shown = re.search(r"Profile: (\w+)", first.get("text", ""))
        assert shown and {r["profile"] for r in records} <= {shown.group(1)}, path.name
