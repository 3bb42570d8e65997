"""A failed exercise check stops the participant's notebook with a short message; plausibility checks on
measured results do not (outside ``WORKSHOP_STRICT``); an unanswered exercise stops with its own message;
``course.reveal`` lets the notebook go on; no wrong value reaches the record.

Three levels: the exceptions' messages; an IPython shell in this process running the cells of a small
solution notebook (fast); and a real Jupyter kernel (nbclient) running the participant's notebook 02."""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from tinyllama import course
from tinyllama.course import exercise_stop
from tinyllama.course.checkpoints import CheckpointFailed, check_between, check_faster, checkpoint
from tinyllama.course.exercise_stop import (ExerciseCheckFailed, ExerciseNotAnswered, check_cells, failing_exercise,
                                            match_exercise, unanswered)
from tinyllama.course.feedback import check_ratio
from tinyllama.course.make_notebooks import exercises, participant_notebook, raise_line, strip_solutions
from tinyllama.course.results import checkout_root

ROOT = checkout_root()
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _plain(lines: list[str]) -> str:
    return ANSI.sub("", "\n".join(lines))


@pytest.fixture
def lenient(monkeypatch):
    """A participant's environment: WORKSHOP_STRICT unset."""
    monkeypatch.delenv("WORKSHOP_STRICT", raising=False)


# --- the messages ------------------------------------------------------------------------------------------


def test_a_failed_exercise_check_renders_as_a_few_lines_not_a_traceback():
    error = ExerciseCheckFailed("matmul_tflops(4096, 1) = 68.7 TFLOP/s, expected 137.4 TFLOP/s (0.5x)\n"
                                "  - a multiply-add is 2 FLOPs", "00.1", ("matmul_tflops",))
    assert isinstance(error, CheckpointFailed)  # strict runs and tests that expect CheckpointFailed still catch it
    assert str(error).startswith("matmul_tflops(4096, 1) = 68.7")  # the check's own message, as before
    shown = _plain(error._render_traceback_())
    lines = shown.splitlines()
    assert lines[0] == "Exercise 00.1: the check failed, so the notebook stopped here."
    assert "expected 137.4 TFLOP/s" in shown and "a multiply-add is 2 FLOPs" in shown  # what is wrong
    assert "Look at your `matmul_tflops` in exercise 00.1" in shown  # what to look at
    assert 'course.reveal("00.1")' in lines[-1]  # how to go on
    assert "Traceback" not in shown and len(lines) <= 6


def test_a_failed_check_without_names_points_at_the_exercise():
    shown = _plain(ExerciseCheckFailed("wrong", "19.1")._render_traceback_())
    assert "Look at your answer to exercise 19.1" in shown and 'course.reveal("19.1")' in shown


def test_the_stub_names_its_exercise_and_how_to_go_on():
    error = unanswered("13.2")
    assert isinstance(error, ExerciseNotAnswered) and isinstance(error, NotImplementedError)
    assert str(error).startswith("Exercise 13.2 is not answered yet: write")
    assert 'course.reveal("13.2")' in str(error)
    shown = _plain(error._render_traceback_())
    assert shown.splitlines()[0] == "Exercise 13.2 is not answered yet."
    assert 'Run course.reveal("13.2")' in shown and "Traceback" not in shown
    assert "not answered yet" in str(unanswered()) and "reveal" not in str(unanswered())  # no id: nothing to reveal


def test_the_generator_writes_the_stub_through_the_course_helper():
    assert raise_line("07.2") == 'raise course.unanswered("07.2")'
    cell = "def f(x):\n    # BEGIN SOLUTION 07.2\n    # HINT: twice x\n    return 2 * x\n    # END SOLUTION\ny = f(3)"
    participant = strip_solutions(cell)
    assert 'raise course.unanswered("07.2")' in participant and "NotImplementedError" not in participant
    with pytest.raises(ExerciseNotAnswered, match=r"Exercise 07\.2 is not answered yet"):
        exec(participant, {"course": course})


def test_every_participant_stub_goes_through_the_helper():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        text = path.read_text(encoding="utf-8")
        assert "raise NotImplementedError" not in text, path.name
        for exercise in re.findall(r'raise course\.unanswered\(\\"(\d\d\.\d+)\\"\)', text):
            assert exercise.startswith(path.name[:2] + "."), (path.name, exercise)


# --- outside a kernel: as before -----------------------------------------------------------------------------


def test_outside_a_kernel_a_failed_check_prints_and_raises_only_when_strict(lenient, monkeypatch, capsys):
    assert check_between("a rate", 5.0, 0.0, 1.0) is False
    assert "CHECK: a rate = 5" in capsys.readouterr().out
    assert failing_exercise() is None
    monkeypatch.setenv("WORKSHOP_STRICT", "1")
    with pytest.raises(CheckpointFailed) as raised:
        check_between("a rate", 5.0, 0.0, 1.0)
    assert type(raised.value) is CheckpointFailed


# --- which checks are an exercise's: the real solution notebooks --------------------------------------------


@pytest.fixture(scope="module")
def index():
    return check_cells(ROOT / "solutions")


def _check_cell(index, notebook: str, exercise: str) -> str:
    for source, entries in index.items():
        for entry in entries:
            if entry.notebook.startswith(notebook) and exercise in [a.exercise for a in entry.answers]:
                return source
    raise AssertionError(f"no check cell of {exercise}")


def _line_of(source: str, text: str) -> int:
    return next(number for number, line in enumerate(source.splitlines(), 1) if text in line)


@pytest.mark.parametrize("notebook, exercise, statement, loud", [
    # the answer's own check: stops the notebook
    ("02", "02.2", "ratio_ok = check_error_ratio(predicted_error_ratio", ("02.2", ("predicted_error_ratio",))),
    ("02", "02.3", "prediction_ok = check_batch_prediction(predicted_half_batch", ("02.3", ("predicted_half_batch",))),
    ("17", "17.5", "mfu_ok = versions.check_mfu_from_tokens(mfu_from_tokens", ("17.5", ("mfu_from_tokens",))),
    # a name the exercise cell computes from the answer (gemm_intensity = gemm_flops / gemm_bytes)
    ("18", "18.1", "intensities_ok = check_gemm_and_add(gemm_intensity", ("18.1", ("add_intensity", "gemm_intensity"))),
    # a value the check cell computes from the answer before the failing line (example = torchrun_command(...))
    ("05", "05.4", 'command_ok = course.check_equal("launcher"', ("05.4", ("torchrun_command",))),
    # a model changed in place by the participant's function (repair(patient))
    ("15", "15.2", "course.checkpoint(off.empty", ("15.2", ())),
    # a check cell after a measurement cell: the first code cell after the exercise that reads its answer
    ("14", "14.5", "saved_ok = attention_checks.check_saved_predictions(",
     ("14.5", ("predicted_flash_saved", "predicted_math_saved"))),
    ("12", "12.2", "gemm_ok = check_gemm_prediction(gemm_launches", ("12.2", ("gemm_launches",))),
    # measured results in the same check cell: print only
    ("02", "02.2", "course.checkpoint(report.passed", None),
    ("02", "02.3", "bounded = course.checkpoint(all(s.bounded_by", None),
    ("17", "17.5", "mfu_plausible = versions.check_mfu_plausible", None),
])
def test_only_statements_that_use_the_answer_stop_the_notebook(index, notebook, exercise, statement, loud):
    source = _check_cell(index, notebook, exercise)
    assert match_exercise(source, _line_of(source, statement), index, notebook) == loud


def test_a_measurement_between_an_exercise_and_its_check_is_not_the_check_cell(index):
    """Exercise 14.5: the prediction, then the memory sweep (no answer read), then the check that compares the
    two. The check cell is the one that reads the answer; the sweep's own checks never stop the notebook."""
    entries = [entry for found in index.values() for entry in found
               if entry.notebook.startswith("14") and "14.5" in [a.exercise for a in entry.answers]]
    assert len(entries) == 1
    nb = nbformat.read(ROOT / "solutions" / entries[0].notebook, as_version=4)
    exercise_cell = exercises(nb, "14_flash_attention")["14.5"][0]
    sweep = nb.cells[exercise_cell + 1].source
    assert "saved_tensor_bytes" in sweep and "predicted_" not in sweep  # the measurement sits between
    assert entries[0].index == exercise_cell + 2
    assert "check_saved_predictions(predicted_math_saved" in nb.cells[entries[0].index].source
    assert match_exercise(sweep, 1, index, "14") is None


def test_a_cell_that_is_no_check_cell_never_stops(index):
    source = "rate = 5.0\ncourse.check_between('measured copy rate', rate, 0, 1)"
    assert match_exercise(source, 2, index) is None


def test_every_check_cell_precedes_the_record(index):
    """A failed check stops "Run All" before the notebook records anything: no wrong value is recorded."""
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        records = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code" and ".record(" in cell.source]
        found = exercises(nb, path.stem)
        checks = [entry.index for entries in index.values() for entry in entries if entry.notebook == path.name]
        assert records, path.name
        assert found and checks, path.name
        assert max(checks) < min(records), (path.name, checks, records)
        assert max(cell for cell, _ in found.values()) < min(records), path.name


# --- an IPython shell in this process -----------------------------------------------------------------------


DEMO_EXERCISE = '''\
def double(v):
    # BEGIN SOLUTION 98.1
    # HINT: twice the value
    return 2 * v
    # END SOLUTION

rate = 0.5'''
DEMO_CHECK = '''\
# NBVAL_CHECK_OUTPUT
measured_ok = course.check_between("measured rate", rate, 0.0, 1.0, why="a device rate")
timing_ok = course.check_ratio("double(1) / 1", [double(1.0)] * 3, [1.0] * 3, low=5.0)
double_ok = course.check_equal("double(3)", double(3), 6, hint="twice 3")
print("after the check")'''


@pytest.fixture
def shell(tmp_path, monkeypatch, lenient):
    """An IPython shell with the course imported, whose solutions are one made-up notebook (98)."""
    from IPython.core.interactiveshell import InteractiveShell

    solutions = tmp_path / "solutions"
    solutions.mkdir()
    nb = new_notebook(cells=[new_code_cell("from tinyllama import course"), new_markdown_cell("Exercise 98.1"),
                             new_code_cell(DEMO_EXERCISE), new_code_cell(DEMO_CHECK),
                             new_code_cell('session.record({"double": double(3)})')])
    nbformat.write(nb, solutions / "98_demo.ipynb")
    monkeypatch.setattr(exercise_stop, "_solutions", lambda: solutions)
    ip = InteractiveShell.instance()
    ip.run_cell("from tinyllama import course")
    participant = participant_notebook(nb, "98_demo.ipynb")
    try:
        yield ip, participant, solutions
    finally:
        InteractiveShell.clear_instance()


def test_in_a_shell_a_wrong_answer_stops_at_its_check(shell, capsys):
    ip, participant, _ = shell
    ip.run_cell("def double(v):\n    return 3 * v\nrate = 0.5")
    result = ip.run_cell(participant.cells[3].source)
    out = ANSI.sub("", capsys.readouterr().out)
    assert isinstance(result.error_in_exec, ExerciseCheckFailed) and result.error_in_exec.exercise == "98.1"
    assert "Exercise 98.1: the check failed" in out and "double(3) = 9, expected 6. twice 3" in out
    assert "Look at your `double`" in out and 'course.reveal("98.1")' in out
    assert "Traceback" not in out and "after the check" not in out  # stopped at the check, no traceback
    assert "CHECK: double(3)" not in out  # said once, in the stop message


def test_in_a_shell_measured_checks_in_an_exercise_check_cell_only_print(shell, capsys):
    ip, participant, _ = shell
    ip.run_cell("def double(v):\n    return 2 * v\nrate = 5.0")  # a right answer, an implausible measurement
    result = ip.run_cell(participant.cells[3].source)
    out = capsys.readouterr().out
    assert result.error_in_exec is None
    # the ratio uses the answer, yet it is a timing (check_ratio): the hardware decides it, it only prints
    assert "CHECK: measured rate = 5" in out and "CHECK: double(1) / 1" in out and "after the check" in out


def test_in_a_shell_an_unanswered_exercise_stops_with_its_message(shell, capsys):
    ip, participant, _ = shell
    ip.run_cell(participant.cells[2].source)  # the stub as generated
    result = ip.run_cell(participant.cells[3].source)
    out = ANSI.sub("", capsys.readouterr().out)
    assert isinstance(result.error_in_exec, ExerciseNotAnswered)
    assert "Exercise 98.1 is not answered yet." in out and 'course.reveal("98.1")' in out and "Traceback" not in out


def test_in_a_shell_reveal_lets_the_notebook_go_on(shell, capsys):
    ip, participant, solutions = shell
    ip.run_cell("def double(v):\n    return 3 * v\nrate = 0.5")
    assert isinstance(ip.run_cell(participant.cells[3].source).error_in_exec, ExerciseCheckFailed)
    ip.run_cell(f'course.reveal("98.1", solutions=__import__("pathlib").Path({str(solutions)!r}))')
    result = ip.run_cell(participant.cells[3].source)
    out = capsys.readouterr().out
    assert result.error_in_exec is None and "PASS: double(3) = 6" in out and "after the check" in out


def test_in_a_shell_checks_in_other_cells_only_print(shell, capsys):
    ip, _, _ = shell
    result = ip.run_cell('ok = course.check_equal("device count", 3, 6)\nfast = course.check_faster("v2", 2.0, 1.0)')
    assert result.error_in_exec is None
    assert capsys.readouterr().out.count("CHECK:") == 2
    assert ip.user_ns["ok"] is False


def test_in_a_shell_a_check_after_a_measurement_cell_stops(tmp_path, monkeypatch, lenient, capsys):
    """A prediction, a measurement cell, then the check of the prediction: the check stops the notebook."""
    from IPython.core.interactiveshell import InteractiveShell

    solutions = tmp_path / "solutions"
    solutions.mkdir()
    prediction = "# BEGIN SOLUTION 97.1\n# HINT: the bytes of 1000 fp32 values\npredicted_bytes = 4000\n# END SOLUTION"
    measurement = "measured_bytes = 4 * 1000\nmeasured_ok = course.check_between('measured bytes', measured_bytes, 0, 1)"
    check = "bytes_ok = course.check_close('predicted_bytes', predicted_bytes, measured_bytes)\nprint('after the check')"
    nb = new_notebook(cells=[new_code_cell("from tinyllama import course"), new_markdown_cell("Exercise 97.1"),
                             new_code_cell(prediction), new_code_cell(measurement), new_code_cell(check),
                             new_code_cell('session.record({"bytes": predicted_bytes})')])
    nbformat.write(nb, solutions / "97_demo.ipynb")
    monkeypatch.setattr(exercise_stop, "_solutions", lambda: solutions)
    ip = InteractiveShell.instance()
    try:
        ip.run_cell("from tinyllama import course\npredicted_bytes = 1000")  # a wrong prediction: elements, not bytes
        assert ip.run_cell(measurement).error_in_exec is None  # its measured check only prints
        result = ip.run_cell(check)
    finally:
        InteractiveShell.clear_instance()
    out = ANSI.sub("", capsys.readouterr().out)
    assert isinstance(result.error_in_exec, ExerciseCheckFailed) and result.error_in_exec.exercise == "97.1"
    assert "CHECK: measured bytes" in out and "after the check" not in out


# --- a real Jupyter kernel: the participant's notebook 02 ---------------------------------------------------


def test_a_kernel_stops_run_all_at_the_check_and_goes_on_after_reveal(tmp_path, lenient, monkeypatch):
    """Notebook 02's first exercise (02.1, ``unit_roundoff``) as a participant runs it in a Jupyter kernel:
    unanswered, "Run All" stops at the check with the stub's message; a wrong answer stops there with the
    check's message (later cells do not run); ``course.reveal("02.1")`` and the check passes."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    monkeypatch.setenv("WORKSHOP_PROFILE", "ci")
    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    nb = nbformat.read(ROOT / "notebooks" / "02_precision.ipynb", as_version=4)
    exercise_cell = exercises(nbformat.read(ROOT / "solutions" / "02_precision.ipynb", as_version=4), "02")["02.1"][0]
    check = exercise_cell + 1
    assert 'raise course.unanswered("02.1")' in nb.cells[exercise_cell].source
    nb.cells = nb.cells[:check + 1] + [new_code_cell('print("the next cell ran")')]  # what "Run All" would run next

    def errors(cell):
        return [o for o in cell.outputs if o.output_type == "error"]

    client = NotebookClient(nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(tmp_path)}})
    with client.setup_kernel():
        def run_all():
            for cell in nb.cells:
                if cell.cell_type == "code":
                    cell.outputs = []
            for index, cell in enumerate(nb.cells):
                try:
                    client.execute_cell(cell, index)
                except CellExecutionError:
                    return index
            return None

        assert run_all() == check
        (error,) = errors(nb.cells[check])
        assert error.ename == "ExerciseNotAnswered"
        shown = ANSI.sub("", "\n".join(error.traceback))
        assert "Exercise 02.1 is not answered yet." in shown and "Traceback" not in shown

        nb.cells[exercise_cell].source = "def unit_roundoff(mantissa_bits):\n    return 2.0 ** -mantissa_bits"  # eps
        assert run_all() == check
        (error,) = errors(nb.cells[check])
        shown = ANSI.sub("", "\n".join(error.traceback))
        assert error.ename == "ExerciseCheckFailed"
        assert shown.startswith("Exercise 02.1: the check failed, so the notebook stopped here.")
        assert "Your bound is twice the measured error" in shown  # the check's own diagnosis
        assert "Look at your `unit_roundoff`" in shown and 'Stuck? Run course.reveal("02.1")' in shown
        assert "Traceback" not in shown and len(error.traceback) < 12
        assert not nb.cells[-1].outputs  # nothing after the check ran

        nb.cells[exercise_cell].source = 'course.reveal("02.1")'
        assert run_all() is None
        text = "".join(o.get("text", "") for o in nb.cells[check].outputs)
        assert "PASS: your unit roundoff bounds every format's measured rounding error" in text
        assert nb.cells[-1].outputs[0].text == "the next cell ran\n"
