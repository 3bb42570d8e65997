"""Notebook 21's checks (tinyllama.course.distributed_checks) pass the reference answers of the solution
notebook and fail the typical wrong ones, with the cause named."""

import sys

import nbformat
import pytest

from tinyllama.course.distributed_checks import check_communication_formula, check_state_formula, check_torchrun_command
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


def _argv(k=2, batch=8, module="tinyllama.harness.distributed"):
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


# ---- 21.4 and 21.5: data parallelism by hand, against DDP on two gloo processes ------------------------

import linecache  # noqa: E402

import torch.distributed as dist  # noqa: E402

from tinyllama import course  # noqa: E402
from tinyllama.course import hand_ddp  # noqa: E402
from tinyllama.course.exercise_stop import ExerciseNotAnswered  # noqa: E402
from tinyllama.course.make_notebooks import strip_solutions  # noqa: E402
from tinyllama.models import lm_loss  # noqa: E402

KINDS = {"21.4": ("step", "train_step"), "21.5": ("overlap", "overlap_gradients")}


def _define(source: str, name: str, label: str):
    """Run a cell's source as a notebook would, so that ``inspect.getsource`` finds it (IPython keeps every
    cell in linecache under a file name of its own)."""
    filename = f"<test cell {label}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": "__main__", "dist": dist, "lm_loss": lm_loss, "course": course}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]


def _cell(exercise: str) -> str:
    nb = nbformat.read(PATH, as_version=4)
    return nb.cells[exercises(nb, PATH.stem)[exercise][0]].source


def _candidate(exercise: str, slip: str | None = None):
    kind, name = KINDS[exercise]
    source = _cell(exercise) if slip is None else hand_ddp.plant(_cell(exercise), slip)
    return kind, _define(source, name, slip or exercise)


@pytest.fixture(scope="module")
def verdicts():
    """Every slip of hand_ddp.SLIPS and both references, checked in three launches of the two ranks: the
    slip that hangs one rank runs alone, since the ranks stop after it."""
    hanging = {"one_rank"}
    groups = [{"21.4": _candidate("21.4"), "21.5": _candidate("21.5")}
              | {slip: _candidate(spec["exercise"], slip) for slip, spec in hand_ddp.SLIPS.items() if slip not in hanging},
              {slip: _candidate(hand_ddp.SLIPS[slip]["exercise"], slip) for slip in hanging}]
    found = {}
    for group in groups:
        found.update(hand_ddp.evaluate(group))
    return found


@pytest.mark.parametrize("exercise", ["21.4", "21.5"])
def test_the_reference_trains_like_ddp_on_gloo(verdicts, exercise):
    verdict = verdicts[exercise]
    assert verdict.ok, verdict.message
    assert "trains like DDP" in verdict.message


def test_the_timing_job_times_ddp_and_both_answers_in_turns_on_the_same_batches():
    """The GPU timing's rank side, run on two gloo processes: every run gets its warm-up and its timed steps,
    and (in fp32, one pass each over the same batches) both references end at DDP's weights."""
    shipped = {"naive": {**hand_ddp.ship(_candidate("21.4")[1]), "kind": "step"},
               "overlapped": {**hand_ddp.ship(_candidate("21.5")[1]), "kind": "overlap"}}
    result = hand_ddp.launch(hand_ddp._job("time", shipped, steps=4, warmup=1), timeout_s=240)
    assert all(report is not None for report in result.reports), result.outputs
    for report in result.reports:
        assert {label: len(values["ms"]) for label, values in report.items()} == {"ddp": 4, "naive": 4,
                                                                                   "overlapped": 4}
        assert report["naive"]["weights_differ"] < 1e-3 and report["overlapped"]["weights_differ"] < 1e-3


@pytest.mark.parametrize("slip", sorted(hand_ddp.SLIPS))
def test_each_slip_fails_with_its_own_message(verdicts, slip):
    verdict = verdicts[slip]
    assert not verdict.ok
    assert hand_ddp.SLIPS[slip]["says"] in verdict.message, verdict.message
    others = [name for name, spec in hand_ddp.SLIPS.items() if name != slip and spec["says"] in verdict.message]
    assert not others, f"{slip}'s message also reads like {others}: {verdict.message}"


def test_the_checks_follow_their_exercises_and_reveal_works():
    nb = nbformat.read(PATH, as_version=4)
    found = exercises(nb, PATH.stem)
    for exercise, call in (("21.4", "check_train_step(train_step)"), ("21.5", "check_overlap(overlap_gradients)")):
        index = found[exercise][0]
        after = next(cell for cell in nb.cells[index + 1:] if cell.cell_type == "code")
        assert call in after.source  # the first code cell after the exercise is its check
    namespace = {"dist": dist, "lm_loss": lm_loss, "course": course}
    course.reveal("21.4", namespace)
    course.reveal("21.5", namespace)
    # A revealed function has no file of its own: its source comes from the solution notebook.
    assert "dist.all_reduce(param.grad)" in hand_ddp.ship(namespace["train_step"])["sources"][0]
    assert "register_post_accumulate_grad_hook" in hand_ddp.ship(namespace["overlap_gradients"])["sources"][0]


@pytest.mark.parametrize("exercise, check", [("21.4", hand_ddp.check_train_step), ("21.5", hand_ddp.check_overlap)])
def test_an_unanswered_exercise_says_so_before_starting_any_process(exercise, check):
    kind, name = KINDS[exercise]
    stub = _define(strip_solutions(_cell(exercise)), name, f"stub {exercise}")
    with pytest.raises(ExerciseNotAnswered, match=exercise.replace(".", r"\.")):
        check(stub)


def test_a_function_that_uses_what_cannot_travel_is_refused_with_a_message():
    source = "import threading\nlock = threading.Lock()\n\ndef train_step(model, optimizer, inputs, targets):\n    with lock:\n        pass\n"
    with pytest.raises(hand_ddp.ShipError, match="`lock`"):
        hand_ddp.ship(_define(source, "train_step", "lock"))
    lock = __import__("threading").Lock()

    def train_step(model, optimizer, inputs, targets):
        with lock:
            pass

    with pytest.raises(hand_ddp.ShipError, match="inside another function"):
        hand_ddp.ship(train_step)
    shipped = hand_ddp.ship(_candidate("21.4")[1])
    assert shipped["name"] == "train_step" and not shipped["values"]


# ---- 21.6: the ZeRO memory formula, part by part ---------------------------------------------------

from tinyllama.course.zero_checks import check_zero_formula  # noqa: E402

_SHARDED_FROM = {"parameters": 3, "gradients": 2, "master weights": 1, "optimizer moments": 1}
_BYTES = {"parameters": 2, "gradients": 2, "master weights": 4, "optimizer moments": 8}


def _zero(bytes_=_BYTES, sharded_from=_SHARDED_FROM, divide_at_stage0=False):
    def formula(p, stage, n):
        return {part: bytes_[part] * p / (n if stage >= sharded_from[part] or (divide_at_stage0 and stage == 0) else 1)
                for part in bytes_}
    return formula


def test_the_zero_reference_passes():
    nb = nbformat.read(PATH, as_version=4)
    namespace: dict = {}
    exec(nb.cells[exercises(nb, PATH.stem)["21.6"][0]].source, namespace)
    assert check_zero_formula(namespace["zero_bytes_per_rank"])
    assert check_zero_formula(_zero())


@pytest.mark.parametrize("wrong, cause", [
    (_zero(bytes_={**_BYTES, "master weights": 0}), "the fp32 master copy is missing"),
    (_zero(bytes_={**_BYTES, "optimizer moments": 4}), "AdamW keeps two moments"),
    (_zero(sharded_from={**_SHARDED_FROM, "parameters": 1}), "stage 1 keeps the whole parameters on every rank"),
    (_zero(divide_at_stage0=True), "stage 0 (plain DDP) shards nothing"),
    (_zero(sharded_from={**_SHARDED_FROM, "gradients": 3}), "stage 2 shards the gradients"),
    (_zero(bytes_={**_BYTES, "parameters": 4, "gradients": 4}), "are bf16: 2 bytes a parameter"),
])
def test_each_wrong_zero_formula_fails_with_its_own_cause(wrong, cause, capsys):
    assert not check_zero_formula(wrong)
    out = capsys.readouterr().out
    assert cause in out, out
    others = [c for c in ("master copy is missing", "two moments", "shards nothing", "are bf16")
              if c not in cause and c in out]
    assert not others, out


def test_a_zero_formula_that_returns_a_number_is_told_to_return_the_parts(capsys):
    assert not check_zero_formula(lambda p, stage, n: 16 * p)
    assert "return a dict with the keys" in capsys.readouterr().out
