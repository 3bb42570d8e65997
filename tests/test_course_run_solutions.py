"""The instructor runner executes solution notebooks in fresh kernels, keeps executed copies,
summarises the figures recorded in the run, and fails when a notebook fails."""

import json
import subprocess
import sys
import threading
import time

import nbformat
import pandas as pd
import pytest
from nbformat.v4 import new_code_cell, new_notebook
from table_cells import table_rows

from tinyllama import device as dev
from tinyllama.course import profile, reference
from tinyllama.course import run_solutions as rs

KERNELSPEC = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
KERNELSPEC_COURSE = {"name": "tinyllama-workshop", "display_name": "TinyLLaMA workshop", "language": "python"}

RECORDING_CELL = '''\
import os
from tinyllama.course import results, checkpoints
results.record("00_ok", {"answer": 42, "profile_seen": os.environ["WORKSHOP_PROFILE"],
                         "strict": checkpoints.strict()})
print("recorded")'''


@pytest.fixture
def solutions(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.delenv("WORKSHOP_PROFILE", raising=False)
    directory = tmp_path / "solutions"
    directory.mkdir()
    nbformat.write(new_notebook(cells=[new_code_cell(RECORDING_CELL)], metadata=KERNELSPEC), directory / "00_ok.ipynb")
    failing = [new_code_cell("x = 1"), new_code_cell("raise ValueError('the answer is not 41')"), new_code_cell("y = 2")]
    nbformat.write(new_notebook(cells=failing, metadata=KERNELSPEC), directory / "01_fails.ipynb")
    return directory


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_runner_executes_summarises_and_fails_on_a_failing_notebook(solutions, tmp_path, capsys):
    output = tmp_path / "run"
    code = rs.main(["--solutions", str(solutions), "--output", str(output), "--profile", "ci", "--timeout", "120"])
    assert code == 1
    ok = nbformat.read(output / "00_ok.ipynb", as_version=4)
    assert ok.cells[0].outputs[-1].text.endswith("\nrecorded\n") and ok.cells[0].execution_count == 1
    failed = nbformat.read(output / "01_fails.ipynb", as_version=4)
    assert failed.cells[1].outputs[0].output_type == "error" and failed.cells[2].execution_count is None

    summary = pd.read_csv(output / "summary.csv")
    figures = dict(zip(summary.figure, summary.value))
    # The kernel ran at the requested profile with strict checkpoints.
    assert figures == {"answer": "42", "profile_seen": "ci", "strict": "True"}
    markdown = (output / "summary.md").read_text()
    rows = table_rows(markdown)
    assert rows[0] == ["notebook", "result", "time (s)"] and [c[0] + c[-1] for c in rows[1]] == [":-", ":-", "-:"]
    assert [row[:2] for row in rows[2:4]] == [["00_ok", "ok"], ["01_fails", "FAILED: ValueError: the answer is not 41"]]
    assert ["00_ok", "answer", "42"] in rows[4:]
    assert "1 notebook(s) failed: 01_fails" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_selected_notebook_runs_cleanly_and_can_store_its_outputs(solutions, tmp_path, monkeypatch, capsys):
    # The notebook names the course's kernel, which is not registered here: it runs in python3, and says so.
    nb = nbformat.read(solutions / "00_ok.ipynb", as_version=4)
    nb.metadata.kernelspec = nbformat.from_dict(KERNELSPEC_COURSE)
    nbformat.write(nb, solutions / "00_ok.ipynb")
    monkeypatch.setattr(rs, "registered_kernels", lambda: {"python3"})
    output = tmp_path / "run"
    code = rs.main(["--solutions", str(solutions), "--output", str(output), "--profile", "ci",
                    "--notebooks", "00", "--update-solutions", "--against"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "the Jupyter kernel 'tinyllama-workshop' is not registered here (`bash course.sh kernel` registers it): " \
           "the notebooks run in the 'python3' kernel instead" in printed
    # A bare --against compares with the solutions as they were before this run updated them: no records yet.
    assert f"Against {solutions}:" in printed and "Notebooks without recorded figures in A: 00_ok" in printed
    assert "Notebooks with figures in B only: 00_ok" in printed and (output / "drift.md").exists()
    assert sorted(p.name for p in output.glob("*.ipynb")) == ["00_ok.ipynb"]
    stored = nbformat.read(solutions / "00_ok.ipynb", as_version=4)
    assert stored.cells[0].outputs[-1].text.endswith("\nrecorded\n")
    assert "execution" not in stored.cells[0].metadata  # no timing noise in stored solutions
    assert stored.metadata.kernelspec == KERNELSPEC_COURSE  # the stored notebook still names its own kernel
    # The run's records travel with the outputs: the solution's reference figures.
    [kept] = stored.metadata["tinyllama"]["records"]
    assert kept["notebook"] == "00_ok" and kept["figures"]["answer"] == 42 and "user" not in kept
    # Only this run's figures are summarised, although the results file may hold older records.
    assert len(pd.read_csv(output / "summary.csv")) == 3


def test_bad_requests_are_short_errors(solutions, capsys, monkeypatch):
    assert rs.main(["--solutions", str(solutions), "--notebooks", "07"]) == 2
    assert "no solution notebook matches '07': choose from 00_ok, 01_fails" in capsys.readouterr().err
    monkeypatch.setattr(profile.dev, "backend", lambda: "cpu")
    assert rs.main(["--solutions", str(solutions), "--profile", "gpu"]) == 2
    assert "PyTorch sees no GPU" in capsys.readouterr().err
    assert rs.main(["--solutions", str(solutions.parent / "nowhere")]) == 2
    capsys.readouterr()
    assert rs.main(["--solutions", str(solutions), "--profile", "ci", "--kernel-name", "no-such-kernel"]) == 2
    assert "the Jupyter kernel 'no-such-kernel' is not registered: choose one of" in capsys.readouterr().err


def test_a_missing_kernel_falls_back_to_python3_or_says_what_is_missing():
    assert rs.choose_kernel("tinyllama-workshop", {"tinyllama-workshop", "python3"}) == ("tinyllama-workshop", "")
    kernel, note = rs.choose_kernel("tinyllama-workshop", {"python3"})
    assert kernel == "python3" and "`bash course.sh kernel` registers it" in note
    with pytest.raises(ValueError, match="'julia' is not registered .*jupyter kernelspec list.*nor is 'python3'"):
        rs.choose_kernel("julia", set())


def test_notebooks_are_selected_by_prefix_in_course_order(solutions):
    names = lambda selectors: [p.name for p in rs.find_notebooks(solutions, selectors)]
    assert names(None) == ["00_ok.ipynb", "01_fails.ipynb"]
    assert names(["01", "00_ok.ipynb", "01_fails"]) == ["01_fails.ipynb", "00_ok.ipynb"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_against_lists_the_figures_that_moved_and_fails(solutions, tmp_path, capsys):
    stored = tmp_path / "stored"
    stored.mkdir()
    nb = new_notebook(cells=[], metadata=KERNELSPEC)
    # The same device and profile as the run (the recording cell names no profile), one figure far off.
    reference.attach_records(nb, [{"time": "2026-11-26T10:00:00+00:00", "notebook": "00_ok", "profile": None,
                                   "environment": dev.environment_summary(), "commit": "0123456789ab",
                                   "figures": {"answer": 30, "profile_seen": "ci", "strict": True}}])
    nbformat.write(nb, stored / "00_ok.ipynb")
    output = tmp_path / "run"
    code = rs.main(["--solutions", str(solutions), "--output", str(output), "--profile", "ci", "--notebooks", "00",
                    "--against", str(stored)])
    printed = capsys.readouterr().out
    assert code == 1, printed
    assert "## Moved beyond their spread (1)" in printed
    assert ["00_ok", "answer", "30", "42", "+40.0%"] in [row[:5] for row in table_rows(printed)]
    assert "Different commits, compared anyway: at 0123456789ab in A" in printed
    drift_table = pd.read_csv(output / "drift.csv").set_index("figure")
    assert drift_table.loc["answer", "status"] == "moved" and drift_table.loc["profile_seen", "status"] == "equal"


TWICE_CELL = '''\
import os, time
from tinyllama.course import results
began = time.time()
time.sleep(4)
results.record("00_ok", {"answer": 42, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "began": began,
                         "ended": time.time()})'''


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_twice_runs_at_once_one_a_gpu_each_with_its_own_results_and_compares(tmp_path, monkeypatch, capsys):
    # Two GPUs as the runner sees them; the child runs get the variable that shows each its own GPU.
    directory = tmp_path / "solutions"
    directory.mkdir()
    nbformat.write(new_notebook(cells=[new_code_cell(TWICE_CELL)], metadata=KERNELSPEC), directory / "00_ok.ipynb")
    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setattr(rs.dev, "gpu_count", lambda: 2)
    monkeypatch.setattr(rs.dev, "visible_devices_variable", lambda: "CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(rs.dev, "visible_device_environment", lambda index, count: {"CUDA_VISIBLE_DEVICES": str(index)})
    output = tmp_path / "twice"
    code = rs.main(["--solutions", str(directory), "--output", str(output), "--profile", "ci", "--twice"])
    printed = capsys.readouterr().out
    assert "Two runs at once, one a GPU: a with CUDA_VISIBLE_DEVICES=0, b with CUDA_VISIBLE_DEVICES=1" in printed
    assert "[a] ok     00_ok" in printed and "[b] ok     00_ok" in printed
    runs = {}
    for name in "ab":
        # Each run kept its records in a results folder of its own, and in its executed copy.
        lines = (output / name / "results" / "results.jsonl").read_text().splitlines()
        [entry] = [json.loads(line) for line in lines]
        assert entry["figures"] == reference.notebook_records(output / name / "00_ok.ipynb")[0]["figures"]
        runs[name] = entry["figures"]
    assert (runs["a"]["visible"], runs["b"]["visible"]) == ("0", "1")
    assert runs["a"]["began"] < runs["b"]["ended"] and runs["b"]["began"] < runs["a"]["ended"]  # at once
    # The one figure that differs between the runs is drift: the exit status says so.
    assert code == 1 and ["00_ok", "visible", "0", "1"] in [row[:4] for row in table_rows(printed)]
    assert pd.read_csv(output / "drift.csv").set_index("figure").loc["answer", "status"] == "within tolerance"


def test_twice_refuses_to_update_or_compare_with_stored_solutions(solutions, capsys):
    for extra in (["--update-solutions"], ["--against"]):
        assert rs.main(["--solutions", str(solutions), "--profile", "ci", "--twice", *extra]) == 2
        assert "--twice compares two fresh runs with each other" in capsys.readouterr().err


def test_against_a_folder_without_notebooks_is_a_short_error(solutions, tmp_path, capsys):
    assert rs.main(["--solutions", str(solutions), "--profile", "ci", "--against", str(tmp_path / "empty")]) == 2
    assert "no notebooks in" in capsys.readouterr().err


@pytest.mark.parametrize("backend, variable", [("cuda", "CUDA_VISIBLE_DEVICES"), ("rocm", "HIP_VISIBLE_DEVICES")])
def test_a_child_sees_one_gpu_through_its_vendors_variable(monkeypatch, backend, variable):
    monkeypatch.setattr(dev, "backend", lambda: backend)
    monkeypatch.setattr(dev, "gpu_count", lambda: 2)
    monkeypatch.delenv(variable, raising=False)
    assert dev.visible_device_environment(1) == {variable: "1"}
    # This process already sees a subset: the child's value replaces it, so it names the same physical GPU.
    monkeypatch.setenv(variable, "2, GPU-5d1c")
    assert dev.visible_device_environment(0) == {variable: "2"}
    assert dev.visible_device_environment(1) == {variable: "GPU-5d1c"}
    with pytest.raises(dev.DeviceUnavailable, match="GPU 2 was asked for, but this process sees 2 GPU"):
        dev.visible_device_environment(2)
    # A run of two GPUs (05, 21): the entries at those positions, in order.
    monkeypatch.setattr(dev, "gpu_count", lambda: 4)
    monkeypatch.setenv(variable, "4,5,6,7")
    assert dev.visible_device_environment(2, 2) == {variable: "6,7"}
    with pytest.raises(dev.DeviceUnavailable, match="GPUs 3-4 were asked for, but this process sees 4 GPU"):
        dev.visible_device_environment(3, 2)


def test_twice_gives_each_run_its_own_compiler_caches_and_gpus(tmp_path, monkeypatch):
    # Two runs of two GPUs each on four: each child sees its own pair and writes its own compiler caches.
    started = []

    class Child:
        stdout = iter(["ok     00_ok (1 s)\n"])

        def __init__(self, command, env, **_):
            started.append(env)

        def wait(self):
            return 0

    monkeypatch.setattr(rs.subprocess, "Popen", Child)
    monkeypatch.setattr(rs.dev, "visible_devices_variable", lambda: "CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(rs.dev, "gpu_count", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(rs, "report_drift", lambda a, b, output: 0)
    monkeypatch.setattr(rs.drift, "load_run", lambda folder: folder)
    assert rs.run_twice(["--profile", "ci"], tmp_path, gpus=4, per_run=2) == 0
    assert [env["CUDA_VISIBLE_DEVICES"] for env in started] == ["0,1", "2,3"]
    caches = {env[key] for env in started for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    assert len(caches) == 4 and all(str(tmp_path) in cache for cache in caches)


def test_gpus_per_run_goes_with_twice(solutions, capsys):
    assert rs.main(["--solutions", str(solutions), "--profile", "ci", "--gpus-per-run", "2"]) == 2
    assert "--gpus-per-run N (N of 1 or more) goes with --twice" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------
# --store: a finished run's outputs into the solutions
# --------------------------------------------------------------------------------------------------

def _notebook(path, sources, output=None):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# title")] + [nbformat.v4.new_code_cell(s) for s in sources]
    if output is not None:
        nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text=output)]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def test_store_copies_run_b_of_a_twice_run_and_refuses_a_changed_solution(tmp_path, capsys):
    solutions = tmp_path / "solutions"
    _notebook(solutions / "01_a.ipynb", ["print(1)"])
    _notebook(solutions / "02_b.ipynb", ["print(2)  # edited after the run"])
    for run in ("a", "b"):
        _notebook(tmp_path / "run" / run / "01_a.ipynb", ["print(1)"], output=f"1 from {run}\n")
        _notebook(tmp_path / "run" / run / "02_b.ipynb", ["print(2)"], output="2\n")
    before = (solutions / "02_b.ipynb").read_text()

    status = rs.main(["--solutions", str(solutions), "--store", str(tmp_path / "run")])

    assert status == 1  # one notebook refused
    stored = nbformat.read(solutions / "01_a.ipynb", as_version=4)
    assert stored.cells[1].outputs[0]["text"] == "1 from b\n"  # run b of the two
    assert (solutions / "02_b.ipynb").read_text() == before  # left as it was
    err = capsys.readouterr().err
    assert "refused 02_b: cell 2 (code" in err and "run the notebook again" in err


def test_store_picks_notebooks_and_reads_a_single_run(tmp_path):
    solutions = tmp_path / "solutions"
    _notebook(solutions / "01_a.ipynb", ["print(1)"])
    _notebook(solutions / "02_b.ipynb", ["print(2)"])
    _notebook(tmp_path / "run" / "01_a.ipynb", ["print(1)"], output="1\n")
    _notebook(tmp_path / "run" / "02_b.ipynb", ["print(2)"], output="2\n")
    assert rs.main(["--solutions", str(solutions), "--store", str(tmp_path / "run"), "--notebooks", "02"]) == 0
    assert nbformat.read(solutions / "01_a.ipynb", as_version=4).cells[1].outputs == []  # not picked
    assert nbformat.read(solutions / "02_b.ipynb", as_version=4).cells[1].outputs[0]["text"] == "2\n"


def test_store_says_what_is_wrong_with_its_input(tmp_path, capsys):
    solutions = tmp_path / "solutions"
    _notebook(solutions / "01_a.ipynb", ["print(1)"])
    (tmp_path / "empty").mkdir()
    assert rs.main(["--solutions", str(solutions), "--store", str(tmp_path / "empty")]) == 2
    assert "no executed notebooks" in capsys.readouterr().err
    assert rs.main(["--solutions", str(solutions), "--store", str(tmp_path / "empty"), "--twice"]) == 2
    assert "--store runs nothing" in capsys.readouterr().err


def test_store_refuses_a_selection_that_names_no_solution(tmp_path, capsys):
    solutions = tmp_path / "solutions"
    _notebook(solutions / "01_a.ipynb", ["print(1)"])
    _notebook(tmp_path / "run" / "01_a.ipynb", ["print(1)"], output="1\n")
    assert rs.main(["--solutions", str(solutions), "--store", str(tmp_path / "run"), "--notebooks", "07"]) == 2
    assert "no solution notebook matches '07'" in capsys.readouterr().err


def test_a_child_runs_log_holds_each_line_before_the_run_ends(tmp_path):
    # A run killed by a time limit must leave what it printed: the relay writes each line as it comes.
    process = subprocess.Popen([sys.executable, "-c", "import time; print('ok     started', flush=True); time.sleep(30)"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    log = tmp_path / "b.log"
    relay = threading.Thread(target=rs._relay, args=(process, log, "b"), daemon=True)
    relay.start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "started" not in (log.read_text() if log.exists() else ""):
            time.sleep(0.1)
        assert "ok     started" in log.read_text()
        assert process.poll() is None  # still running: the line reached the file before the end
    finally:
        process.kill()
        relay.join(timeout=10)
