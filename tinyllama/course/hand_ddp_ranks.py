"""What each rank process runs for notebook 21's data parallelism by hand (:mod:`tinyllama.course.hand_ddp`
starts them, loading this file as a module of its own; ``python -m tinyllama.course.hand_ddp_ranks JOB RANK``
does the same). It imports nothing of ``tinyllama.course``.

A job (a ``torch.save``'d dict) carries the participant's functions as source text and what to run:

- ``mode="check"``: on every rank, torch's ``DistributedDataParallel`` trains a small TinyLLaMA a few
  steps on this rank's part of each global batch (the reference); then each candidate (the participant's
  ``train_step`` or ``overlap_gradients``) trains the same model from the same seed on the same batches.
  Every ``dist.all_reduce`` a candidate calls is recorded (on what tensor, in which phase of the step,
  synchronous or not, waited for or not), the gradients are copied just before each optimizer step,
  and the final weights kept, so that the notebook's side can name the mistake, not only see it;
- ``mode="time"`` (GPUs): DDP, the naive step and the overlapped one, timed in turns (one step each, the
  order rotating) with device events after a warm-up, and their final weights.

Each rank writes ``rank{R}.pt`` into the job's folder; an exception of the participant's code is caught
and reported there, so that the notebook shows it as feedback rather than as a dead process.
"""

from __future__ import annotations

import sys
import traceback
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from tinyllama.config import autocast_context, resolve_config
from tinyllama.harness import process_group
from tinyllama.harness.distributed import SyntheticTokens, rank_loader
from tinyllama.models import build, lm_loss
from tinyllama.timing import time_in_turns

ORIGINAL_ALL_REDUCE = dist.all_reduce
ORIGINAL_BACKWARD = torch.Tensor.backward


# ------------------------------------------------------------------------------------------------
# Watching the participant's collectives
# ------------------------------------------------------------------------------------------------


class _Handle:
    """An async all-reduce's work handle that notes when it is waited for (``wait``, ``get_future``, or an
    ``is_completed`` that said yes), and a wait in a later step than the one that started it."""

    def __init__(self, work: Any, call: dict[str, Any], recorder: "Recorder") -> None:
        self._work, self._call, self._recorder = work, call, recorder

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self._call["waited"] = True
        if self._recorder.step != self._call["step"]:  # a handle of an earlier step, waited for again
            self._call.setdefault("waited_later", self._recorder.step)
        return self._work.wait(*args, **kwargs)

    def is_completed(self) -> bool:
        done = self._work.is_completed()
        self._call["waited"] = self._call["waited"] or bool(done)
        return done

    def get_future(self) -> Any:
        self._call["waited"] = True
        return self._work.get_future()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class Recorder:
    """Notes, for one model, which gradients the backward has accumulated in the current step (a
    post-accumulate hook registered before any of the participant's), and every ``dist.all_reduce`` call
    while :meth:`installed` is on."""

    def __init__(self, model: nn.Module) -> None:
        self.params = dict(model.named_parameters())
        self.ready: set[str] = set()
        self.step = -1
        self.backward_running = False
        self.calls: list[dict[str, Any]] = []
        self.grads: list[dict[str, torch.Tensor | None]] = []  # before each optimizer step
        self.unwaited: list[int] = []  # async all-reduces not waited for, at each optimizer step
        for name, param in self.params.items():
            param.register_post_accumulate_grad_hook(partial(self._accumulated, name))

    def _accumulated(self, name: str, param: torch.Tensor) -> None:
        self.ready.add(name)

    def new_step(self, step: int) -> None:
        self.step, self.ready = step, set()

    def phase(self) -> str:
        if self.backward_running:
            return "during backward"
        return "after backward" if self.ready else "before backward"

    def _classify(self, tensor: Any) -> tuple[str, str | None]:
        if not isinstance(tensor, torch.Tensor):
            return "none" if tensor is None else type(tensor).__name__, None
        pointer = tensor.data_ptr()
        for name, param in self.params.items():
            if pointer == param.data_ptr() and tensor.numel() == param.numel():
                return "parameter", name
        for name, param in self.params.items():
            grad = param.grad
            if grad is not None and pointer == grad.data_ptr() and tensor.numel() == grad.numel():
                return "gradient", name
        if tensor.requires_grad or tensor.grad_fn is not None:
            return "graph tensor", None  # the loss, or something computed from the weights
        for name, param in self.params.items():
            if tensor.shape == param.shape and name not in self.ready:
                return "not yet accumulated", name  # a gradient the backward has not stored in .grad
        return "other", None

    def all_reduce(self, tensor: Any, op: Any = dist.ReduceOp.SUM, group: Any = None, async_op: bool = False) -> Any:
        kind, name = self._classify(tensor)
        call = {"step": self.step, "phase": self.phase(), "kind": kind, "name": name, "async": bool(async_op),
                "waited": not async_op, "op": str(op),
                "numel": tensor.numel() if isinstance(tensor, torch.Tensor) else 0}
        self.calls.append(call)
        if kind == "none":
            raise TypeError(f"dist.all_reduce got None instead of a tensor ({call['phase']} of step {self.step})")
        work = ORIGINAL_ALL_REDUCE(tensor, op=op, group=group, async_op=async_op)
        return _Handle(work, call, self) if async_op else work

    def before_optimizer_step(self, *_: Any) -> None:
        self.grads.append({name: None if p.grad is None else p.grad.detach().clone()
                           for name, p in self.params.items()})
        self.unwaited.append(sum(1 for c in self.calls if c["step"] == self.step and not c["waited"]))

    def installed(self) -> "_Installed":
        return _Installed(self)


class _Installed:
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def __enter__(self) -> Recorder:
        recorder = self.recorder

        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            recorder.backward_running = True
            try:
                ORIGINAL_BACKWARD(tensor, *args, **kwargs)
            finally:
                recorder.backward_running = False

        dist.all_reduce = recorder.all_reduce  # the participant's code looks it up at each call
        torch.Tensor.backward = backward  # type: ignore[method-assign]  # to tell the phases of a step apart
        return recorder

    def __exit__(self, *_: Any) -> None:
        dist.all_reduce = ORIGINAL_ALL_REDUCE
        torch.Tensor.backward = ORIGINAL_BACKWARD  # type: ignore[method-assign]


# ------------------------------------------------------------------------------------------------
# The participant's code, from its source text
# ------------------------------------------------------------------------------------------------


def load_candidate(shipped: dict[str, Any]) -> Callable[..., Any]:
    """The participant's function, defined again here from its source text (and what it uses from the
    notebook: modules by name, plain values, and other functions' sources)."""
    import importlib

    namespace: dict[str, Any] = {"__name__": "__participant__", "torch": torch, "dist": dist, "lm_loss": lm_loss}
    for name, module in shipped["modules"].items():
        namespace[name] = importlib.import_module(module)
    for name, (module, qualname) in shipped["objects"].items():
        value: Any = importlib.import_module(module)
        for part in qualname.split("."):
            value = getattr(value, part)
        namespace[name] = value
    namespace.update(shipped["values"])
    for source in shipped["sources"]:
        exec(compile(source, f"<your {shipped['name']}>", "exec"), namespace)
    return namespace[shipped["name"]]


# ------------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------------


def _batches(job: dict[str, Any], device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    config, _, seq_len = resolve_config(job["preset"], job["per_rank_batch"], job["seq_len"])
    steps = job["warmup"] + job["steps"]
    world = dist.get_world_size()
    data = SyntheticTokens(config.vocab_size, seq_len, world * job["per_rank_batch"] * steps, seed=job["seed"])
    loader = rank_loader(data, job["per_rank_batch"], process_group.current())
    return [(x.to(device), y.to(device)) for x, y in loader][:steps]


def _model(job: dict[str, Any], device: torch.device) -> nn.Module:
    config, _, _ = resolve_config(job["preset"], job["per_rank_batch"], job["seq_len"])
    torch.manual_seed(job["seed"])  # the same initial weights on every rank and for every run
    return build(job["version"], config, **job.get("model_options", {})).to(device).train()


def _optimizer(model: nn.Module, job: dict[str, Any]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=job["lr"], weight_decay=0.0, foreach=False)


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().float().cpu().clone() for name, p in model.named_parameters()}


def _reference_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                    precision: str) -> torch.Tensor:
    optimizer.zero_grad(set_to_none=True)
    with autocast_context(precision, x.device):
        loss = lm_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def _ddp(model: nn.Module, device: torch.device) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def run_reference(job: dict[str, Any], device: torch.device, batches: list) -> dict[str, Any]:
    """DDP over the same batches: its gradients before each step and its final weights; and this rank's
    own (not averaged) gradients of the first step, to tell a missing exchange from a missing division."""
    plain = _model(job, device)
    lm_loss(plain(batches[0][0]), batches[0][1]).backward()
    local = {name: p.grad.detach().clone() for name, p in plain.named_parameters()}
    model = _model(job, device)
    ddp = _ddp(model, device)
    optimizer = _optimizer(model, job)
    grads: list[dict[str, torch.Tensor]] = []
    optimizer.register_step_pre_hook(
        lambda *_: grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()}))
    for x, y in batches:
        _reference_step(ddp, optimizer, x, y, job["precision"])
    return {"grads": grads, "weights": _weights(model), "local_first_step": local}


def _train_candidate(kind: str, function: Callable[..., Any], model: nn.Module, optimizer: torch.optim.Optimizer,
                     recorder: Recorder, batches: list, precision: str) -> None:
    """Train ``model`` with the participant's function: ``train_step(model, optimizer, inputs, targets)``
    does the whole step; ``overlap_gradients(model)`` returns ``finish``, called after the backward."""
    finish = None
    if kind == "overlap":
        finish = function(model)
        if not callable(finish):
            raise TypeError(f"overlap_gradients returned {type(finish).__name__}, not the function finish: "
                            "end it with `return finish`")
    for step, (x, y) in enumerate(batches):
        recorder.new_step(step)
        if kind == "step":
            with autocast_context(precision, x.device):
                function(model, optimizer, x, y)
            continue
        optimizer.zero_grad(set_to_none=True)
        with autocast_context(precision, x.device):
            loss = lm_loss(model(x), y)
        loss.backward()
        finish()
        optimizer.step()


def run_candidate(job: dict[str, Any], shipped: dict[str, Any], device: torch.device, batches: list) -> dict[str, Any]:
    """One candidate, recorded; an exception of the participant's code is reported, not raised."""
    model = _model(job, device)
    recorder = Recorder(model)
    optimizer = _optimizer(model, job)
    optimizer.register_step_pre_hook(recorder.before_optimizer_step)
    error = None
    with recorder.installed():
        try:
            function = load_candidate(shipped)
            _train_candidate(shipped["kind"], function, model, optimizer, recorder, batches, job["precision"])
        except Exception as exc:  # noqa: BLE001 - the participant's code: report what it raised, where
            lines = traceback.format_exception_only(type(exc), exc)
            error = {"type": type(exc).__name__, "message": "".join(lines).strip()[-600:],
                     "phase": recorder.phase(), "step": recorder.step,
                     "trace": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-2500:]}
    return {"calls": recorder.calls, "grads": recorder.grads, "unwaited": recorder.unwaited,
            "weights": _weights(model), "error": error, "steps": len(batches)}


def run_check(job: dict[str, Any], device: torch.device) -> dict[str, Any]:
    batches = _batches(job, device)
    report: dict[str, Any] = {"reference": run_reference(job, device, batches), "candidates": {}}
    # A separate group for the ranks' bookkeeping: the participant's collectives run on the default
    # group, and a rank that called more of them than another must not pair them with ours.
    side = dist.new_group(backend="gloo", timeout=timedelta(seconds=3 * job["timeout_s"]))  # outlasts a hang
    for name, shipped in job["candidates"].items():
        result = run_candidate(job, shipped, device, batches)
        report["candidates"][name] = result
        counts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(counts, len(result["calls"]), group=side)
        if len(set(counts)) > 1:  # the ranks' collectives no longer pair up: nothing after this is meaningful
            report["stopped_after"] = name
            break
    return report


# ------------------------------------------------------------------------------------------------
# Timing (GPUs)
# ------------------------------------------------------------------------------------------------


def _largest_difference(model: nn.Module, reference: dict[str, torch.Tensor], initial: dict[str, torch.Tensor]) -> float:
    """The largest difference of ``model``'s weights from ``reference``'s, as a share of the largest change the
    reference made to any weight (its training steps): 0 is the same weights; 1, as far off as a whole update."""
    diff = max(float((p.detach() - reference[n]).abs().max()) for n, p in model.named_parameters())
    update = max(float((reference[n] - initial[n]).abs().max()) for n in reference)
    return diff / update if update else diff


def run_timing(job: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """DDP and each candidate, from the same weights, each on its own pass over the same batches, timed in
    turns (:func:`tinyllama.timing.time_in_turns`, one step a turn, the order rotating): milliseconds per
    step after the warm-up, and how far each candidate's final weights are from DDP's (kept on the device)."""
    batches = _batches(job, device)
    precision = job["precision"]
    steps: dict[str, Callable[[], Any]] = {}
    models: dict[str, nn.Module] = {}
    for label, shipped in [("ddp", None), *job["candidates"].items()]:
        model = _model(job, device)
        optimizer = _optimizer(model, job)
        cursor = iter(batches)  # warm-up and timed steps: each run takes every batch once, in order
        if shipped is None:
            initial = {n: p.detach().clone() for n, p in model.named_parameters()}
            wrapped = _ddp(model, device)

            def step(x: torch.Tensor, y: torch.Tensor, wrapped: nn.Module = wrapped, optimizer: Any = optimizer) -> None:
                _reference_step(wrapped, optimizer, x, y, precision)
        elif shipped["kind"] == "step":
            function = load_candidate(shipped)

            def step(x: torch.Tensor, y: torch.Tensor, function: Any = function, model: nn.Module = model,
                     optimizer: Any = optimizer) -> None:
                with autocast_context(precision, device):
                    function(model, optimizer, x, y)
        else:
            finish = load_candidate(shipped)(model)

            def step(x: torch.Tensor, y: torch.Tensor, finish: Any = finish, model: nn.Module = model,
                     optimizer: Any = optimizer) -> None:
                optimizer.zero_grad(set_to_none=True)
                with autocast_context(precision, device):
                    loss = lm_loss(model(x), y)
                loss.backward()
                finish()
                optimizer.step()
        steps[label] = lambda step=step, cursor=cursor: step(*next(cursor))
        models[label] = model
    dist.barrier()
    samples = time_in_turns(steps, device, rounds=job["steps"], per_turn=1, warmup=job["warmup"])
    reference = {n: p.detach() for n, p in models["ddp"].named_parameters()}
    out: dict[str, Any] = {label: {"ms": ms} for label, ms in samples.items()}
    for label in job["candidates"]:
        out[label]["weights_differ"] = _largest_difference(models[label], reference, initial)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    job_path, rank = Path(args[0]), int(args[1])
    job = torch.load(job_path, weights_only=False)
    torch.set_num_threads(1)  # one core a rank: the CPU stands in for one GPU each
    device = torch.device(f"cuda:{rank}") if job["backend"] == "nccl" else torch.device("cpu")
    process_group.join(device, backend=job["backend"], rank=rank, world_size=job["world_size"],
                       timeout_s=job["timeout_s"])
    try:
        report = run_check(job, device) if job["mode"] == "check" else run_timing(job, device)
    finally:
        process_group.teardown()
    torch.save(report, job_path.parent / f"rank{rank}.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
