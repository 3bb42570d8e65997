"""Notebook 21's data parallelism by hand: the participant's gradient all-reduce, checked against torch's
``DistributedDataParallel`` on two gloo processes, and timed against it on two GPUs.

The participant writes, in the notebook, ``train_step(model, optimizer, inputs, targets)`` (exercise
21.4: the backward, then every gradient all-reduced and divided by the world size) and
``overlap_gradients(model)`` (21.5: a post-accumulate-grad hook on every parameter starts an async
all-reduce as soon as that gradient exists; the ``finish`` it returns waits and divides).

- :func:`check_train_step` and :func:`check_overlap` run the function on two CPU processes with gloo
  (:mod:`tinyllama.course.hand_ddp_ranks`), a few steps of the ``ci`` TinyLLaMA on disjoint halves of
  each batch, beside DDP from the same seed on the same halves. They pass only when the gradients before
  every optimizer step and the final weights equal DDP's within fp32 rounding, every async all-reduce
  was waited for, and (21.5) the all-reduces started during the backward. A failure names the likely
  mistake (:data:`SLIPS`): from the recorded collectives (what was all-reduced, when, waited or not) and
  from how the gradients differ (a factor of the world size, this rank's own gradient, ...).
- :func:`time_data_parallel` (two or more GPUs) times the naive step, the overlapped one and DDP with
  NCCL, per step with device events after a warm-up, and compares them with
  :func:`tinyllama.timing.verdict`.

The rank processes are fresh Python interpreters started with ``subprocess``, and the participant's
functions travel to them as source text (:func:`ship`). Why not fork the notebook's kernel, as the
tests of ``tinyllama.harness.distributed`` fork pytest: a forked child cannot use CUDA once the parent has (a
notebook on a GPU has), and forking a kernel that runs several threads (Jupyter's) may deadlock the
child. Why not ``multiprocessing``'s spawn: it pickles the function by reference, and a function defined
in a notebook cell cannot be imported by name in another process.
"""

from __future__ import annotations

import inspect
import os
import pickle
import re
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from tinyllama.course.checkpoints import checkpoint
from tinyllama.course.feedback import compare_outputs
from tinyllama.course.results import checkout_root

WORLD = 2
# The check's run: the ci model, 2 sequences a rank, 3 steps (a mistake that shows from the second step
# on, such as handles kept from the step before, needs at least two).
CHECK_RUN = dict(preset="ci", version="v2", per_rank_batch=2, seq_len=32, steps=3, warmup=0, seed=5, lr=1e-2,
                 precision="fp32", model_options={"sdpa": True})
# A collective that waits longer than this for the other rank has lost it (a collective on one rank only).
COLLECTIVE_TIMEOUT_S = 20.0
GRAD_TOL = dict(atol=1e-6, rtol=1e-5)  # two ranks: the sum and the halving are exact, the order of DDP's is not
WEIGHT_TOL = dict(atol=1e-6, rtol=1e-5)

# The typical mistakes, as edits (old, new) of the solution notebook's answer, and the words of the
# message each must produce. tests/test_notebook_21.py plants each one and expects its message.
SLIPS: dict[str, dict[str, Any]] = {
    "no_divide": {"exercise": "21.4", "edits": [("        param.grad /= world\n", "")],
                  "says": "sums over the ranks, not the means"},
    "before_backward": {"exercise": "21.4",
                        "edits": [("    loss.backward()\n    world", "    world"),
                                  ("        param.grad /= world\n", "        param.grad /= world\n    loss.backward()\n")],
                        "says": "before loss.backward()"},
    "loss_instead": {"exercise": "21.4",
                     "edits": [("    loss.backward()\n", ""),
                               ("    for param in model.parameters():\n        dist.all_reduce(param.grad)\n"
                                "        param.grad /= world\n",
                                "    dist.all_reduce(loss)\n    (loss / world).backward()\n")],
                     "says": "you all-reduced the loss"},
    "one_rank": {"exercise": "21.4",
                 "edits": [("        dist.all_reduce(param.grad)\n",
                            "        if dist.get_rank() == 0:\n            dist.all_reduce(param.grad)\n")],
                 "says": "a different number of times"},
    "parameters": {"exercise": "21.4",
                   "edits": [("        dist.all_reduce(param.grad)\n        param.grad /= world\n",
                              "        dist.all_reduce(param.data)\n        param.data /= world\n")],
                   "says": "all-reduced the parameters"},
    "wrong_event": {"exercise": "21.5", "edits": [("register_post_accumulate_grad_hook", "register_hook")],
                    "says": "before the gradient was accumulated"},
    "no_wait": {"exercise": "21.5", "edits": [("            handle.wait()\n", "")], "says": "not waited for"},
    "not_overlapped": {"exercise": "21.5",
                       "edits": [("dist.all_reduce(param.grad, async_op=True)", "None"),
                                 ("            handle.wait()\n", "            dist.all_reduce(param.grad)\n")],
                       "says": "nothing overlaps"},
    "handles_kept": {"exercise": "21.5", "edits": [("        handles.clear()\n", "")], "says": "waited again"},
}


def plant(source: str, slip: str) -> str:
    """``source`` (the solution cell of the slip's exercise) with the mistake ``slip`` of :data:`SLIPS` made."""
    for old, new in SLIPS[slip]["edits"]:
        if old not in source:
            raise ValueError(f"slip {slip}: {old!r} is not in the answer; update SLIPS with the solution")
        source = source.replace(old, new, 1)
    return source


# ------------------------------------------------------------------------------------------------
# Shipping the participant's function to the rank processes
# ------------------------------------------------------------------------------------------------


class ShipError(ValueError):
    """The function uses something of the notebook that cannot be sent to another process."""


def _solution_source(function: Callable[..., Any]) -> str | None:
    """The source of a function that ``course.reveal`` defined (its code says ``<solution of exercise
    21.4>``): the definition of that name in the solution notebook's cell."""
    found = re.fullmatch(r"<solution of exercise (\d\d\.\d+)>", function.__code__.co_filename)
    if not found:
        return None
    import ast

    import nbformat

    from tinyllama.course.make_notebooks import exercises
    from tinyllama.course.reveal import solution_notebook

    path = solution_notebook(found.group(1))
    nb = nbformat.read(path, as_version=4)
    cell = nb.cells[exercises(nb, path.stem)[found.group(1)][0]].source
    for node in ast.parse(cell).body:
        if isinstance(node, ast.FunctionDef) and node.name == function.__name__:
            return ast.get_source_segment(cell, node)
    return None


def _source(function: Callable[..., Any]) -> str:
    try:
        return textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        text = _solution_source(function)
        if text is None:
            raise ShipError(f"the source of {function.__name__} cannot be read: define it in a notebook cell") from None
        return text


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def ship(function: Callable[..., Any]) -> dict[str, Any]:
    """``function`` as the rank processes rebuild it: its source text, the modules and importable objects
    it uses by name, plain values it reads from the notebook, and the sources of the notebook's own
    functions it calls."""
    if not callable(function) or not hasattr(function, "__code__"):
        raise ShipError(f"expected your function, got {type(function).__name__}")
    shipped: dict[str, Any] = {"name": function.__name__, "sources": [], "modules": {}, "objects": {}, "values": {}}
    pending, seen = [function], set()
    while pending:
        current = pending.pop()
        if current.__name__ in seen:
            continue
        seen.add(current.__name__)
        if current.__code__.co_freevars:
            raise ShipError(f"{current.__name__} is defined inside another function (it uses its "
                            f"{', '.join(current.__code__.co_freevars)}): define it at the top level of a cell")
        shipped["sources"].insert(0, _source(current))
        for name in sorted(_global_names(current.__code__)):
            if name in shipped["modules"] or name in shipped["objects"] or name in shipped["values"] or name in seen:
                continue
            if name not in current.__globals__ or name in ("torch", "dist", "lm_loss", "course"):
                continue  # a builtin, an attribute name, or what every rank has anyway
            value = current.__globals__[name]
            module = getattr(value, "__module__", None)
            if isinstance(value, types.ModuleType):
                shipped["modules"][name] = value.__name__
            elif isinstance(value, types.FunctionType) and (module in (None, "__main__", "__participant__")
                                                            or module.startswith("<")):
                pending.append(value)  # another function of the notebook: send its source too
            elif module and not module.startswith(("__main__", "<")) and hasattr(value, "__qualname__"):
                shipped["objects"][name] = (module, value.__qualname__)
            else:
                try:
                    pickle.dumps(value)
                except Exception:  # noqa: BLE001 - anything that does not pickle cannot travel
                    raise ShipError(f"{function.__name__} uses the notebook's `{name}` ({type(value).__name__}), "
                                    "which cannot be sent to the rank processes: compute it inside the function "
                                    "(dist.get_world_size(), dist.get_rank())") from None
                shipped["values"][name] = value
    return shipped


def _unanswered(function: Callable[..., Any], exercise: str) -> None:
    """An exercise cell still as generated: say so (``course.unanswered``) before starting any process."""
    try:
        source = _source(function)
    except ShipError:
        return
    if "course.unanswered(" in source:
        from tinyllama.course.exercise_stop import unanswered

        raise unanswered(exercise)


# ------------------------------------------------------------------------------------------------
# Starting the ranks
# ------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Launch:
    """What the rank processes left: each rank's report (``None`` for a rank that left none) and the
    tail of its output."""

    reports: list[dict[str, Any] | None]
    outputs: list[str]
    seconds: float
    timed_out: bool = False


# The rank processes load tinyllama/course/hand_ddp_ranks.py as a module of its own: importing it as
# tinyllama.course.hand_ddp_ranks would first run the package's __init__ (nbformat, pandas, the results
# tracker), seconds of CPU time per rank that the ranks never use.
_RANK_LOADER = ("import importlib.util, sys; "
                f"spec = importlib.util.spec_from_file_location('hand_ddp_ranks', {str(Path(__file__).with_name('hand_ddp_ranks.py'))!r}); "
                "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); "
                "sys.exit(module.main(sys.argv[1:]))")


def launch(job: dict[str, Any], timeout_s: float = 180.0) -> Launch:
    """Run ``job`` on ``job["world_size"]`` fresh processes, each running :mod:`tinyllama.course.hand_ddp_ranks`."""
    world = job["world_size"]
    with tempfile.TemporaryDirectory(prefix="hand-ddp-") as folder:
        job_path = Path(folder) / "job.pt"
        torch.save(job, job_path)
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1"}
        root = checkout_root()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root or ""), env.get("PYTHONPATH", "")) if p)
        if job["backend"] == "gloo":
            env["CUDA_VISIBLE_DEVICES"] = ""  # CPU ranks: keep them off the GPUs this kernel may use
        logs = [open(Path(folder) / f"rank{r}.log", "w+") for r in range(world)]
        began = time.perf_counter()
        processes = [subprocess.Popen([sys.executable, "-c", _RANK_LOADER, str(job_path), str(r)],
                                      env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world)},
                                      stdout=logs[r], stderr=subprocess.STDOUT) for r in range(world)]
        timed_out = False
        for p in processes:
            try:
                p.wait(timeout=max(1.0, timeout_s - (time.perf_counter() - began)))
            except subprocess.TimeoutExpired:
                timed_out = True
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
        outputs = []
        for log in logs:
            log.seek(0)
            outputs.append(log.read()[-3000:])
            log.close()
        reports = [torch.load(Path(folder) / f"rank{r}.pt", weights_only=False)
                   if (Path(folder) / f"rank{r}.pt").exists() else None for r in range(world)]
    return Launch(reports, outputs, time.perf_counter() - began, timed_out)


# ------------------------------------------------------------------------------------------------
# What went wrong
# ------------------------------------------------------------------------------------------------


@dataclass
class Verdict:
    """The check of one candidate: ``ok``, and the message (what passed, or the likely mistake first)."""

    name: str
    ok: bool
    message: str
    problems: list[str] = field(default_factory=list)


def _flat(grads: dict[str, torch.Tensor | None], names: list[str]) -> torch.Tensor:
    return torch.cat([torch.zeros(0) if grads.get(n) is None else grads[n].double().flatten() for n in names])


def _factor(actual: torch.Tensor, expected: torch.Tensor) -> float | None:
    """``c`` when ``actual`` is ``c x expected`` everywhere (to 1e-6 of its size), else ``None``."""
    if actual.shape != expected.shape or not float((expected * expected).sum()):
        return None
    c = float((actual * expected).sum() / (expected * expected).sum())
    residual = float(((actual - c * expected) ** 2).sum() / (expected * expected).sum())
    return c if residual < 1e-8 else None


MESSAGES = {
    "none_before": ("param.grad is None where you all-reduce it, before loss.backward() of the step: the backward "
                    "creates the gradients (zero_grad set them to None). All-reduce them after the backward."),
    "before_backward": ("all-reduces ran before loss.backward() finished, on gradients that did not exist yet: "
                        "call loss.backward() first, then all-reduce every param.grad."),
    "wrong_event": ("your hook ran before the gradient was accumulated into param.grad: Tensor.register_hook calls "
                    "it with the incoming gradient, before it is stored, so param.grad is not this step's gradient "
                    "yet (None at the first step). Register the hook with register_post_accumulate_grad_hook, which "
                    "calls it with the parameter once param.grad holds this step's gradient."),
    "parameters": ("you all-reduced the parameters (param or param.data), not their gradients: before "
                   "optimizer.step() every rank has the same weights already, so averaging them changes nothing, "
                   "and each rank then steps with its own gradient. All-reduce param.grad."),
    "loss": ("you all-reduced the loss, not the gradients: the loss only reports; optimizer.step() reads param.grad, "
             "and that stayed each rank's own, so the ranks drift apart. Run the backward on this rank's loss, "
             "then all-reduce every param.grad and divide by the world size."),
    "no_wait": ("{count} async all-reduce(s) were not waited for before optimizer.step(): with async_op=True "
                "dist.all_reduce returns at once and the sum arrives later, so the optimizer may read a gradient "
                "that is not reduced yet (or half reduced). In finish(), call handle.wait() on every handle "
                "before dividing."),
    "no_divide": ("the gradients of step {step} are {factor:.3g} x DDP's, the world size: they are the sums over "
                  "the ranks, not the means. Divide each reduced gradient by dist.get_world_size()."),
    "divided_again": ("the gradients of step {step} are {factor:.3g} x DDP's (step {previous} was right): gradients "
                      "of the earlier steps are waited for and divided again. Empty the list of handles at the end "
                      "of finish(), so that each step waits only for its own."),
    "handles_kept": ("finish() of step {later} waited again for all-reduces started in step {step}, and divided "
                     "those parameters' gradients again (this step's gradients by now, some before their own "
                     "all-reduce had finished). Empty the list of handles at the end of finish(), so that each step "
                     "waits only for its own."),
    "own": ("the gradients of the first step are this rank's own: they were never exchanged with the other rank. "
            "All-reduce every param.grad after the backward."),
    "own_divided": ("the gradients of the first step are this rank's own divided by the world size: the division "
                    "happened, but no sum over the ranks reached param.grad."),
    "not_overlapped": ("all {count} all-reduces of a step started after the backward (in finish()): the result is "
                       "right, but nothing overlaps with the backward's computation, so the communication adds to "
                       "the step. Start each gradient's all-reduce from its hook, during the backward."),
    "synchronous": ("the all-reduces started in your hook are synchronous (async_op=False): the backward waits at "
                    "every parameter for its all-reduce, so nothing overlaps. Pass async_op=True and keep the "
                    "handle for finish()."),
    "avg": ("gloo has no ReduceOp.AVG (only NCCL has): all-reduce with the default op (a sum), then divide by "
            "dist.get_world_size()."),
    "ranks_differ": ("the two ranks end step {step} with different gradients: every rank must hold the same "
                     "averaged gradient before optimizer.step()."),
    "mismatch": ("the gradients before optimizer.step() of step {step} differ from DDP's: {detail}"),
}


def _one_rank_message(counts: list[int]) -> str:
    shown = ", ".join(f"rank {r}: {c}" for r, c in enumerate(counts))
    return (f"the ranks called dist.all_reduce a different number of times ({shown}): a collective completes "
            "only when every rank calls it, in the same order, so one that a single rank calls (under `if rank == "
            "0`, or any condition that differs between the ranks) waits for the other until it times out. Every "
            "rank must all-reduce every gradient.")


def diagnose(name: str, kind: str, launch_result: Launch, world: int = WORLD) -> Verdict:
    """The verdict on candidate ``name`` (kind ``"step"`` or ``"overlap"``) from the ranks' reports."""
    reports = launch_result.reports
    if any(r is None or name not in r["candidates"] for r in reports):
        stopped = next((r.get("stopped_after") for r in reports if r is not None and r.get("stopped_after")), None)
        if stopped is not None and stopped != name:
            return Verdict(name, False, f"not checked: the ranks lost step with each other in {stopped}")
        tails = "\n".join(f"  rank {r}: " + "\n    ".join(text.strip().splitlines()[-6:])
                          for r, text in enumerate(launch_result.outputs))
        why = "did not finish within the time limit (a hang?)" if launch_result.timed_out else "stopped"
        return Verdict(name, False, f"the rank processes {why}; their last lines:\n{tails}")
    mine = [r["candidates"][name] for r in reports]
    reference = reports[0]["reference"]
    names = list(reference["weights"])
    calls = [c for m in mine for c in m["calls"]]
    counts = [len(m["calls"]) for m in mine]
    problems: list[str] = []
    if len(set(counts)) > 1:
        problems.append(_one_rank_message(counts))
    kinds = {c["kind"] for c in calls}
    if "parameter" in kinds:
        problems.append(MESSAGES["parameters"])
    if "graph tensor" in kinds:
        problems.append(MESSAGES["loss"])
    none_calls = [c for c in calls if c["kind"] == "none"]
    if any(c["kind"] == "not yet accumulated" and c["phase"] != "after backward" for c in calls) or any(
            c["phase"] == "during backward" for c in none_calls):
        problems.append(MESSAGES["wrong_event"])
    if any(c["phase"] == "before backward" for c in none_calls):
        problems.append(MESSAGES["none_before"])
    elif any(c["phase"] == "before backward" and c["kind"] in ("gradient", "not yet accumulated", "other")
             for c in calls):
        problems.append(MESSAGES["before_backward"])
    errors = [(r, m["error"]) for r, m in enumerate(mine) if m["error"] is not None]
    if errors and not problems:
        rank, error = errors[0]
        if "AVG" in error["message"]:
            problems.append(MESSAGES["avg"])
        else:
            problems.append(f"your {name} raised an error on rank {rank} ({error['phase']} of step {error['step']}): "
                            f"{error['message']}")
    stale = [c for c in calls if c.get("waited_later") is not None]
    if stale and not problems:
        problems.append(MESSAGES["handles_kept"].format(later=stale[0]["waited_later"], step=stale[0]["step"]))
    unwaited = max((sum(m["unwaited"]) for m in mine), default=0)
    if unwaited and not problems:
        problems.append(MESSAGES["no_wait"].format(count=unwaited))
    if kind == "overlap" and not problems:
        during = [c for c in mine[0]["calls"] if c["phase"] == "during backward"]
        if not during and mine[0]["calls"]:
            steps = max(1, len(mine[0]["grads"]))
            problems.append(MESSAGES["not_overlapped"].format(count=len(mine[0]["calls"]) // steps))
        elif during and not any(c["async"] for c in during):
            problems.append(MESSAGES["synchronous"])
    detail = ""
    if not problems:
        problems += _numeric(mine, reports, reference, names, world)
    if not problems:
        worst = max(compare_outputs(m["weights"][n], reference["weights"][n], **WEIGHT_TOL).worst_error
                    for m in mine for n in names)
        during = sum(1 for c in mine[0]["calls"] if c["phase"] == "during backward")
        steps = len(mine[0]["grads"])
        detail = (f"your {name} trains like DDP on {world} gloo processes: the gradients before each of the "
                  f"{steps} optimizer steps and the final weights agree (largest weight difference {worst:.2g}); "
                  f"{len(mine[0]['calls']) // max(steps, 1)} all-reduces a step"
                  + (f", {during // max(steps, 1)} of them started during the backward" if kind == "overlap" else ""))
        return Verdict(name, True, detail)
    return Verdict(name, False, problems[0], problems)


def _numeric(mine: list[dict[str, Any]], reports: list[dict[str, Any]], reference: dict[str, Any],
             names: list[str], world: int) -> list[str]:
    """The gradients step by step, then the final weights, against DDP's."""
    steps = len(reference["grads"])
    optimizer_steps = len(mine[0]["grads"])
    if optimizer_steps != steps:
        return [f"optimizer.step() ran {optimizer_steps} times in {steps} steps: call it once a step, after the "
                "gradients are averaged"]
    previous_ok = None
    for step in range(steps):
        expected = _flat(reports[0]["reference"]["grads"][step], names)
        actual = [_flat(m["grads"][step], names) for m in mine]
        if any(a.shape != expected.shape for a in actual):
            missing = [n for n in names if mine[0]["grads"][step].get(n) is None]
            return [f"before optimizer.step() of step {step}, {len(missing)} parameter(s) have no gradient "
                    f"(e.g. {missing[0]}): run loss.backward() before the step"]
        if any(not torch.allclose(a, actual[0], **GRAD_TOL) for a in actual[1:]):
            return [MESSAGES["ranks_differ"].format(step=step)]
        mismatch = compare_outputs(actual[0], expected, name=f"gradients of step {step}", **GRAD_TOL)
        if mismatch.ok:
            previous_ok = step
            continue
        factor = _factor(actual[0], expected)
        if factor is not None and abs(factor - world) < 1e-3 * world:
            return [MESSAGES["no_divide"].format(step=step, factor=factor)]
        if factor is not None and previous_ok is not None and factor < 1:
            return [MESSAGES["divided_again"].format(step=step, factor=factor, previous=previous_ok)]
        if step == 0:
            local = _flat(reports[0]["reference"]["local_first_step"], names)
            if torch.allclose(actual[0], local, **GRAD_TOL):
                return [MESSAGES["own"]]
            if torch.allclose(actual[0], local / world, **GRAD_TOL):
                return [MESSAGES["own_divided"]]
        return [MESSAGES["mismatch"].format(step=step, detail=mismatch.describe())]
    for n in names:
        mismatch = compare_outputs(mine[0]["weights"][n], reference["weights"][n], name=n, **WEIGHT_TOL)
        if not mismatch.ok:
            return [f"the gradients matched DDP's, but the final weights do not: {mismatch.describe()}"]
    return []


# ------------------------------------------------------------------------------------------------
# The checks
# ------------------------------------------------------------------------------------------------


def _job(mode: str, candidates: dict[str, dict[str, Any]], backend: str = "gloo", **run: Any) -> dict[str, Any]:
    return {"mode": mode, "world_size": WORLD, "backend": backend, "timeout_s": COLLECTIVE_TIMEOUT_S,
            "candidates": candidates, **{**CHECK_RUN, **run}}


def evaluate(candidates: dict[str, tuple[str, Callable[..., Any]]], timeout_s: float = 240.0) -> dict[str, Verdict]:
    """Check several candidates ``{label: (kind, function)}`` in one launch of the ranks (each beside the
    same DDP run), kind ``"step"`` (a ``train_step``) or ``"overlap"`` (an ``overlap_gradients``). The
    ranks stop at the first candidate after which their collectives no longer pair up."""
    shipped = {}
    for label, (kind, function) in candidates.items():
        shipped[label] = {**ship(function), "kind": kind}
    result = launch(_job("check", shipped), timeout_s)
    return {label: diagnose(label, kind, result) for label, (kind, _) in candidates.items()}


def _check(function: Callable[..., Any], kind: str, exercise: str) -> bool:
    _unanswered(function, exercise)
    try:
        verdict = evaluate({function.__name__: (kind, function)})[function.__name__]
    except ShipError as error:
        return checkpoint(False, "", str(error))
    if not verdict.ok and len(verdict.problems) > 1:
        verdict.message += "\n  Also: " + "\n  Also: ".join(verdict.problems[1:3])
    return checkpoint(verdict.ok, verdict.message, verdict.message)


def check_train_step(train_step: Callable[..., Any]) -> bool:
    """Exercise 21.4: ``train_step(model, optimizer, inputs, targets)`` on two gloo processes trains like DDP."""
    return _check(train_step, "step", "21.4")


def check_overlap(overlap_gradients: Callable[..., Any]) -> bool:
    """Exercise 21.5: ``overlap_gradients(model)`` (hooks, then ``finish()``) trains like DDP, with every
    all-reduce started during the backward and waited for before the optimizer step."""
    return _check(overlap_gradients, "overlap", "21.5")


# ------------------------------------------------------------------------------------------------
# Timing on GPUs
# ------------------------------------------------------------------------------------------------


def time_data_parallel(train_step: Callable[..., Any], overlap_gradients: Callable[..., Any], *, preset: str,
                       per_gpu_batch: int, seq_len: int, precision: str = "bf16", steps: int = 40, warmup: int = 5,
                       version: str = "v2", model_options: dict[str, Any] | None = None,
                       timeout_s: float = 480.0) -> dict[str, Any]:
    """Time DDP, ``train_step`` (naive) and ``overlap_gradients`` on 2 GPUs with NCCL: per step, device
    events, after ``warmup`` steps; a step's time is the slowest rank's. Returns ``{"ms": {label: [..]},
    "weights_differ": {label: ...}, "seconds": ...}``: the milliseconds of each timed step ("ddp", "naive",
    "overlapped"), and how far the final weights of the two by hand are from DDP's after the same steps, as
    a share of the largest change DDP's steps made to a weight (bf16 kernels may differ in rounding: a few
    percent at most)."""
    if torch.cuda.device_count() < WORLD:
        raise RuntimeError(f"timing needs {WORLD} GPUs; {torch.cuda.device_count()} visible")
    shipped = {"naive": {**ship(train_step), "kind": "step"}, "overlapped": {**ship(overlap_gradients), "kind": "overlap"}}
    job = _job("time", shipped, backend="nccl", preset=preset, per_rank_batch=per_gpu_batch, seq_len=seq_len,
               precision=precision, steps=steps, warmup=warmup, version=version, lr=3e-4,
               model_options=dict(model_options or {}), timeout_s=120.0)
    result = launch(job, timeout_s)
    if any(r is None for r in result.reports):
        tails = "\n".join(f"rank {r}: " + "\n  ".join(t.strip().splitlines()[-8:]) for r, t in enumerate(result.outputs))
        raise RuntimeError(f"the timing run failed:\n{tails}")
    reports = result.reports
    ms = {label: [max(values) for values in zip(*(r[label]["ms"] for r in reports))] for label in reports[0]}
    differ = {label: max(r[label]["weights_differ"] for r in reports) for label in ("naive", "overlapped")}
    return {"ms": ms, "weights_differ": differ, "seconds": result.seconds}
