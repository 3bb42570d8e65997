"""Where the memory of a training step goes.

Three views, from the simplest to the most detailed:

- :func:`memory_breakdown`: parameters, gradients, optimizer state and the activations autograd saves
  for the backward, counted from the tensors themselves (exact, on every device);
- :func:`phase_memory`: what the GPU allocator holds after forward, backward and optimizer, and the
  peak inside each phase (``torch.cuda`` statistics; HIP on ROCm builds);
- :func:`memory_timeline` (PyTorch profiler, every device) and :func:`memory_snapshot` (the GPU
  allocator's history, for https://pytorch.org/memory_viz) over one step, with plots.

A "step" here is ``tinyllama.harness.bench.TrainingStep`` (anything called as ``step(inputs, targets, timer=)``
that marks the phases ``forward``, ``backward`` and ``optimizer`` on the timer).
"""

from __future__ import annotations

import json
import pickle
import tempfile
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch

from tinyllama import device as dev
from tinyllama.costs.anatomy import saved_for_backward
from tinyllama.profiling.torch_profiler import activities

MIB = 2**20


class _PhaseProbe:
    """Stands in for ``tinyllama.timing.PhaseTimer``: calls ``on_mark(phase)`` at every phase mark."""

    def __init__(self, on_mark: Callable[[str], None]) -> None:
        self.on_mark = on_mark

    def start(self) -> None:  # the PhaseTimer interface
        pass

    def mark(self, phase: str) -> None:
        self.on_mark(phase)

    def stop(self) -> dict[str, float]:
        return {}


def _device_of(step: Any) -> torch.device:
    return getattr(step, "device", None) or dev.get_device()


def memory_breakdown(step: Any, inputs: torch.Tensor, targets: torch.Tensor) -> pd.DataFrame:
    """The memory one training step needs, by kind, counted from the tensors (any device).

    Rows: ``parameters``, ``gradients`` (after backward), ``optimizer state`` (after the step; AdamW
    keeps two moments per parameter), ``activations saved for backward`` (what autograd keeps from the
    forward, each storage counted once, parameters excluded). Columns ``kind``, ``mib``, ``tensors``.
    Runs one full training step (the model's weights change).
    """
    model = step.model
    params = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    found: dict[str, tuple[float, int]] = {}

    def on_mark(phase: str) -> None:
        if phase == "backward":
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            found["gradients"] = (sum(g.numel() * g.element_size() for g in grads) / MIB, len(grads))
        elif phase == "optimizer":
            state = [t for s in step.optimizer.state.values() for t in s.values()
                     if torch.is_tensor(t) and t.dim() > 0]
            found["optimizer state"] = (sum(t.numel() * t.element_size() for t in state) / MIB, len(state))

    with saved_for_backward(exclude=model.parameters()) as saved:
        step(inputs, targets, timer=_PhaseProbe(on_mark))
    rows = [
        {"kind": "parameters", "mib": sum(params.values()) / MIB, "tensors": len(params)},
        {"kind": "gradients", "mib": found.get("gradients", (0.0, 0))[0], "tensors": found.get("gradients", (0, 0))[1]},
        {"kind": "optimizer state", "mib": found.get("optimizer state", (0.0, 0))[0],
         "tensors": found.get("optimizer state", (0, 0))[1]},
        {"kind": "activations saved for backward", "mib": sum(t.nbytes for t in saved.values()) / MIB,
         "tensors": len(saved)},
    ]
    return pd.DataFrame(rows)


def phase_memory(step: Any, inputs: torch.Tensor, targets: torch.Tensor, warmup: int = 1) -> pd.DataFrame:
    """Allocator memory per phase of one training step, after ``warmup`` steps (the first step also
    creates the optimizer state).

    Columns: ``phase`` (``start``, ``forward``, ``backward``, ``optimizer``), ``allocated_mib`` at its
    end, ``peak_mib`` inside it. On a CPU PyTorch keeps no allocator statistics: the values are NaN and
    ``frame.attrs["note"]`` says to use :func:`memory_breakdown` or :func:`memory_timeline` instead.
    """
    device = _device_of(step)
    for _ in range(warmup):
        step(inputs, targets)
    if device.type != "cuda":
        frame = pd.DataFrame({"phase": ["start", "forward", "backward", "optimizer"],
                              "allocated_mib": float("nan"), "peak_mib": float("nan")})
        frame.attrs["note"] = ("no allocator statistics on the CPU: memory_breakdown() counts the tensors, "
                               "memory_timeline() shows them over the step")
        return frame
    dev.synchronize(device)
    dev.reset_peak_memory(device)
    start = dev.memory_stats(device)
    rows = [{"phase": "start", "allocated_mib": start.current_bytes / MIB, "peak_mib": start.peak_bytes / MIB}]

    def on_mark(phase: str) -> None:
        dev.synchronize(device)
        stats = dev.memory_stats(device)
        rows.append({"phase": phase, "allocated_mib": stats.current_bytes / MIB, "peak_mib": stats.peak_bytes / MIB})
        dev.reset_peak_memory(device)

    step(inputs, targets, timer=_PhaseProbe(on_mark))
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------------
# Timelines
# --------------------------------------------------------------------------------------------------

# The profiler's memory categories in the order of its JSON export (column 0 is unused there).
_TIMELINE_CATEGORIES = ["parameter", "optimizer state", "input", "temporary", "activation", "gradient",
                        "autograd detail", "unknown"]


def _timeline_categories() -> list[str]:
    try:
        from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX

        ordered = sorted(_CATEGORY_TO_INDEX, key=_CATEGORY_TO_INDEX.get)
        return [("unknown" if c is None else c.name.lower().replace("_", " ")) for c in ordered]
    except (ImportError, AttributeError):
        return list(_TIMELINE_CATEGORIES)


def memory_timeline(step_fn: Callable[[], Any], *, device: torch.device | str | None = None,
                    warmup: int = 1) -> pd.DataFrame:
    """Memory by category over one call of ``step_fn()`` (after ``warmup`` calls), from the PyTorch
    profiler's memory profile: ``time_ms`` and one column per category (parameter, optimizer state,
    input, temporary, activation, gradient, autograd detail, unknown), in MiB.

    Works on CPU and GPU; raises ``RuntimeError`` where this PyTorch lacks ``export_memory_timeline``.
    """
    from torch.profiler import profile

    device = dev.get_device(None if device is None else str(device))
    for _ in range(warmup):
        step_fn()
    dev.synchronize(device)
    with profile(activities=activities(device), record_shapes=True, profile_memory=True, with_stack=True) as prof:
        step_fn()
        dev.synchronize(device)
    if not hasattr(prof, "export_memory_timeline"):
        raise RuntimeError(f"torch {torch.__version__} has no profiler memory timeline: use memory_breakdown()")
    name = str(device) if device.type == "cpu" or device.index is not None else f"cuda:{torch.cuda.current_device()}"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "timeline.json"
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # deprecated in favour of the CUDA-only snapshot
            prof.export_memory_timeline(str(path), device=name)
        times, sizes = json.loads(path.read_text())
    categories = _timeline_categories()
    frame = pd.DataFrame([row[1:1 + len(categories)] for row in sizes], columns=categories) / MIB
    times = pd.Series(times, dtype="float64")
    first = times[times > 0].min() if (times > 0).any() else 0.0
    frame.insert(0, "time_ms", (times.clip(lower=first) - first) / 1e3)
    return frame


def plot_memory_timeline(frame: pd.DataFrame, path: str | Path | None = None, title: str = "") -> Any:
    """A stacked area plot of :func:`memory_timeline`'s categories; saved to ``path`` if given.
    Returns the matplotlib figure."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    columns = [c for c in frame.columns if c != "time_ms" and frame[c].abs().max() > 0]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.stackplot(frame["time_ms"], *[frame[c].clip(lower=0) for c in columns], labels=columns, step="post")
    ax.set_xlabel("time in the step (ms)")
    ax.set_ylabel("memory (MiB)")
    ax.set_title(title or "Memory over one training step, by category")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def memory_snapshot(step_fn: Callable[[], Any], *, device: torch.device | str | None = None, warmup: int = 1,
                    path: str | Path | None = None, max_entries: int = 200_000) -> dict[str, Any]:
    """The GPU caching allocator's history over one call of ``step_fn()``: every allocation and free
    with its stack. Saves it to ``path`` (a ``.pickle`` to drop on https://pytorch.org/memory_viz; an
    existing file is never overwritten: a number is added to the name) and returns the snapshot.

    Needs a GPU (raises ``tinyllama.device.DeviceUnavailable`` on a CPU: use :func:`memory_timeline`).
    """
    device = dev.get_device(None if device is None else str(device))
    record = getattr(torch.cuda.memory, "_record_memory_history", None)
    if device.type != "cuda" or record is None:
        raise dev.DeviceUnavailable("the allocator snapshot records the GPU's caching allocator and needs a GPU: "
                                    "on the CPU use memory_timeline() or memory_breakdown()")
    for _ in range(warmup):
        step_fn()
    dev.synchronize(device)
    record(max_entries=max_entries)
    try:
        step_fn()
        dev.synchronize(device)
        snapshot = torch.cuda.memory._snapshot()
    finally:
        record(enabled=None)
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        n = 1
        while path.exists():
            path = path.with_name(f"{path.stem.split('.')[0]}-{n}{path.suffix}")
            n += 1
        with open(path, "wb") as f:
            pickle.dump(snapshot, f)
    return snapshot


def snapshot_timeline(snapshot: dict[str, Any], device_index: int = 0) -> pd.DataFrame:
    """Allocated memory over time from a :func:`memory_snapshot`: columns ``time_ms`` (or the event
    number where this torch records no times), ``allocated_mib`` (everything allocated, including what
    existed before the step: parameters, optimizer state) and ``action``."""
    traces = snapshot.get("device_traces", [])
    if device_index >= len(traces) or not traces[device_index]:
        raise ValueError("the snapshot holds no allocator events for this device: was anything run on it?")
    # The trace holds changes; the segments hold what is allocated at the end. Together: the start.
    at_end = sum(block["size"] for segment in snapshot.get("segments", [])
                 if segment.get("device", device_index) == device_index
                 for block in segment.get("blocks", []) if block.get("state") == "active_allocated")
    change = 0
    rows = []
    events = traces[device_index]
    t0 = events[0].get("time_us", 0)
    for i, event in enumerate(events):
        action = event.get("action")
        if action not in ("alloc", "free_completed"):
            continue
        change += event["size"] if action == "alloc" else -event["size"]
        time = (event["time_us"] - t0) / 1e3 if "time_us" in event else float(i)
        rows.append({"time_ms": time, "change": change, "action": action})
    frame = pd.DataFrame(rows)
    start = at_end - (frame["change"].iloc[-1] if len(frame) else 0)
    frame["allocated_mib"] = (start + frame.pop("change")) / MIB
    return frame[["time_ms", "allocated_mib", "action"]]


def plot_snapshot_timeline(frame: pd.DataFrame, path: str | Path | None = None, title: str = "") -> Any:
    """Allocated memory over the step from :func:`snapshot_timeline`; saved to ``path`` if given."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    ax.step(frame["time_ms"], frame["allocated_mib"], where="post")
    peak = frame["allocated_mib"].idxmax()
    ax.annotate(f"peak {frame['allocated_mib'][peak]:,.0f} MiB", (frame["time_ms"][peak], frame["allocated_mib"][peak]),
                textcoords="offset points", xytext=(5, 5))
    ax.set_xlabel("time in the step (ms)")
    ax.set_ylabel("allocated (MiB)")
    ax.set_title(title or "GPU memory allocated over one training step")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def output_sizes(model: torch.nn.Module, inputs: Any) -> pd.DataFrame:
    """The output of every leaf module of ``model`` in one forward pass (inference mode): ``module``
    (its qualified name), ``shape``, ``dtype``, ``mib`` (bytes of the tensor), in call order. These
    are the activations a training step would keep for its backward; inference frees each one as soon
    as the next layers have read it."""
    rows: list[dict[str, Any]] = []
    hooks = []

    def record(name: str) -> Callable[..., None]:
        def hook(_module: torch.nn.Module, _args: Any, output: Any) -> None:
            if torch.is_tensor(output):
                rows.append({"module": name, "shape": tuple(output.shape), "dtype": str(output.dtype).replace("torch.", ""),
                             "mib": output.numel() * output.element_size() / MIB})
        return hook

    for name, module in model.named_modules():
        if not any(True for _ in module.children()):
            hooks.append(module.register_forward_hook(record(name)))
    try:
        with torch.inference_mode():
            model(inputs)
    finally:
        for handle in hooks:
            handle.remove()
    return pd.DataFrame(rows, columns=["module", "shape", "dtype", "mib"])
