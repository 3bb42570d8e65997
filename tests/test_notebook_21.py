"""Notebook 21's checks (tinyllama.course.distributed_checks) pass the reference answers of the solution
notebook and fail the typical wrong ones, with the cause named."""

import sys

import nbformat
import pytest

from tinyllama.course.distributed_checks import (check_communication_formula, check_state_formula,
                                                 check_torchrun_command)
from tinyllama.course.make_notebooks import exercises
from tinyllama.course.results import checkout_root

PATH = checkout_root() / "solutions" / "21_distributed_training.ipynb"


@pytest.fixture(scope="module")
def answers():
    """The solution's functions of exercises 21.1 and 21.2, run from the notebook's own cells."""
    nb = nbformat.read(PATH, as_version=4)
    found = exercises(nb, PATH.stem)
    namespace: dict = {}
    for exercise in ("21.1", "21.2"):
        exec(nb.cells[found[exercise][0]].source, namespace)
    return namespace


@pytest.fixture(autouse=True)
def lenient(monkeypatch):
    monkeypatch.setenv("WORKSHOP_STRICT", "0")


def test_reference_answers_pass(answers):
    assert check_state_formula(answers["state_bytes_per_gpu"])
    assert check_communication_formula(answers["bytes_sent_per_step"])


@pytest.mark.parametrize("wrong, cause", [
    (lambda n, s, w: 12 * n if s == "ddp" else 12 * n / w, "buckets (4 more) are missing"),
    (lambda n, s, w: 16 * n if s == "ddp" else 12 * n, "divide by the world size"),
    (lambda n, s, w: 16 * n / w, "DDP does not shard"),
    (lambda n, s, w: 16 * n if s == "ddp" else 16 * n / w, "FSDP2 keeps no gradient buckets"),
])
def test_wrong_memory_formulas_fail_with_the_cause(wrong, cause, capsys):
    assert not check_state_formula(wrong)
    assert cause in capsys.readouterr().out


@pytest.mark.parametrize("wrong, cause", [
    (lambda n, s, w: (2 if s == "ddp" else 3) * 4 * n if w > 1 else 0, "(N-1)/N of the buffer"),
    (lambda n, s, w: 2 * (w - 1) / w * 4 * n, "FSDP2 makes three"),
    (lambda n, s, w: (2 if s == "ddp" else 3) * (w - 1) / w * 4 * n + (4 * n if w == 1 else 0), "one rank alone"),
])
def test_wrong_communication_formulas_fail_with_the_cause(wrong, cause, capsys):
    assert not check_communication_formula(wrong)
    assert cause in capsys.readouterr().out


def _argv(k=2, batch=8, module="tinyllama.distributed"):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(k), "-m", module,
            "--batch-size", str(batch), "--json", "runs.json"]


def test_torchrun_command_check(capsys):
    assert check_torchrun_command(_argv(), processes=2, per_gpu_batch=4)
    assert not check_torchrun_command(_argv(batch=4), processes=2, per_gpu_batch=4)
    assert "global batch" in capsys.readouterr().out
    assert not check_torchrun_command(_argv(k=1), processes=2, per_gpu_batch=4)
    assert "--nproc-per-node must be 2" in capsys.readouterr().out
    assert not check_torchrun_command(_argv()[:-2], processes=2, per_gpu_batch=4)
    assert "--json" in capsys.readouterr().out
