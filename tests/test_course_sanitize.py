"""The nbval sanitizers remove what differs between a GPU run and a CPU run, and keep the facts."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

nbval_plugin = pytest.importorskip("nbval.plugin", reason="nbval is not installed: pip install nbval")

CONFIG = Path(__file__).with_name("nbval_sanitize.cfg")
PATTERNS = nbval_plugin.get_sanitize_patterns(CONFIG.read_text())


def sanitize(text: str) -> str:
    import re

    for regex, replace in PATTERNS:
        text = re.sub(regex, replace, text)
    return text


def test_every_section_is_read():
    assert len(PATTERNS) == CONFIG.read_text().count("\nregex: ") == 9


@pytest.mark.parametrize("gpu, cpu", [
    ("median 12.34 ms, spread 3%, 45,678.9 img/s", "median 0.98 ms, spread 15.5%, 12.3 img/s"),
    ("bf16: 701.2 TFLOP/s = 71% of the peak", "bf16: 0.3 TFLOP/s = 3% of the peak"),
    ("copy 3.94 TB/s, peak memory 1,234 MiB", "copy 0.007 TB/s, peak memory 12 MiB"),
    ("V3 is 2.95x faster", "V3 is 1.1x faster"),
    ("recorded 2026-11-22T03:09:39+00:00", "recorded 2025-01-01 10:00:00 UTC"),
    ("torch 2.5.1+rocm6.2, triton 3.1.0", "torch 2.14.1+cu130, triton 3.8.0"),
    ("on NVIDIA H100 80GB HBM3 the run", "on CPU: Intel(R) Xeon(R) Platinum 8480C the run"),
    ("on AMD Instinct MI300X, cuda:0", "on CPU: AMD EPYC, cpu"),
    ("NVIDIA H200 is idle", "CPU: Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz is idle"),
    ("saved to /home/ada/tinyllama-workshop-results/results.jsonl", "saved to /tmp/x/results.jsonl"),
    ("<Model at 0x7f3a2b1c4d50>", "<Model at 0x55d0c0ffee00>"),
])
def test_what_varies_is_sanitized_alike(gpu, cpu):
    assert sanitize(gpu) == sanitize(cpu)


@pytest.mark.parametrize("fact", [
    "V1 has 1,234,567 parameters in 12 layers",
    "FLOPs per step: 1234567890 (6 N D)",
    "a 200 x 300 matrix of 60000 elements",
    "PASS: bf16 matmul on the device matches the float64 reference",
    "hidden 1024, heads 8, kv heads 4, head_dim 128",
])
def test_facts_are_kept(fact):
    assert sanitize(fact) == fact


def test_units_survive_next_to_sanitized_numbers():
    assert sanitize("0.3 TFLOP/s and 2.1 TB/s") == "<MEASURED> TFLOP/s and <MEASURED> TB/s"


def _notebook(source: str, stored: str):
    cell = new_code_cell(source, execution_count=1, outputs=[new_output("stream", name="stdout", text=stored)])
    return new_notebook(cells=[cell], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                               "language": "python"}})


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_nbval_compares_facts_and_ignores_measurements(tmp_path):
    """End to end: stored GPU output vs a CPU run; a changed timing passes, a changed fact fails."""
    nbformat.write(_notebook('# NBVAL_CHECK_OUTPUT\nprint("parameters: 1234")\nprint("step: 0.71 ms on cpu")',
                             "parameters: 1234\nstep: 45.3 ms on NVIDIA H100 80GB HBM3\n"), tmp_path / "a_same.ipynb")
    nbformat.write(_notebook('# NBVAL_CHECK_OUTPUT\nprint("parameters: 1235")',
                             "parameters: 1234\n"), tmp_path / "b_fact_changed.ipynb")
    nbformat.write(_notebook('print("parameters: 1235")', "parameters: 1234\n"), tmp_path / "c_unmarked.ipynb")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "--nbval-sanitize-with", str(CONFIG),
         "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", str(tmp_path), "-q", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "1 failed, 2 passed" in run.stdout, run.stdout[-3000:]
    assert "FAILED b_fact_changed.ipynb::Cell 0" in run.stdout
