"""Drift between two runs of the solution notebooks: which recorded figures moved beyond their spread.

    python -m tinyllama.course.drift A B [--notebooks 16 17 ...] [--csv FILE] [--tolerance 0.1] [--force]

``A`` and ``B`` are folders of executed notebooks: a run of :mod:`tinyllama.course.run_solutions` (its
``--output`` folder) or a ``solutions/`` folder. Each executed notebook carries in its metadata the
records it appended in its run (:mod:`tinyllama.course.reference`); the two runs' figures are lined up
notebook by notebook, figure by figure, and judged by these rules:

- a stated result that is a string, a bool or empty (a verdict, "host-bound", a back end's name,
  kept / not kept) must be equal in both runs;
- a number with a recorded p10-p90 spread in both runs (``results.record(..., spreads=...)``) agrees
  when the two spreads overlap; any other number agrees within :data:`RELATIVE_TOLERANCE`;
- a figure that honestly varies with the host (launch costs, host shares, compile seconds, first
  steps, eager steps bound by Python's launches) is labelled host-sensitive in :data:`LABELS` and
  reported with its change in a section of its own, never counted as drift; the paths of files a run
  wrote are labelled run-specific and not compared;
- what a notebook states in words is compared too: the verdict words each code cell printed ("faster",
  "within noise", "host-bound", "kept", "close to your prediction", ...) must be the same in both runs,
  cell by cell (figures named ``said: <cell id>``), unless a label says why they may differ;
- figures and notebooks present in one run only are listed.

Where a notebook ran on another device or at another profile in ``A`` than in ``B``, the report says so
at the top and its numbers are not compared (``--force`` compares them anyway); different commits are
stated and compared. Exit status: 1 when a figure that is not host-sensitive moved, else 2 when numbers
were refused or the input is bad, else 0.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from tinyllama.course import reference
from tinyllama.harness.records import markdown_table

# A number without a recorded spread agrees with the other run's within this share of the larger of the two.
RELATIVE_TOLERANCE = 0.10

HOST_SENSITIVE = "host-sensitive"
RUN_SPECIFIC = "run-specific"


@dataclass(frozen=True)
class Label:
    """Figures (``figures``, a glob on the figure's name) of notebooks (``notebooks``, a glob on the
    notebook's name) whose change between two runs is not drift, and why."""

    notebooks: str
    figures: str
    why: str
    kind: str = HOST_SENSITIVE

    def matches(self, notebook: str, figure: str) -> bool:
        """Whether this label covers ``figure`` of ``notebook``."""
        return fnmatchcase(notebook, self.notebooks) and fnmatchcase(figure, self.figures)


# The one registry of figures that two honest runs may disagree on. Host-sensitive: measured on the host's
# clock or dominated by what the host does (Python, the driver's launch path, the compiler), so another
# process, another host load or another CPU moves them although the GPU work is the same; or set by the
# machine's own GPU (its clock under the power limit), which differs from chip to chip. Run-specific:
# names of what one run wrote. Everything else a notebook records must agree between two runs.
LABELS: tuple[Label, ...] = (
    # Every notebook.
    Label("*", "*host_ms*", "host (CPU) time to issue the work: Python and the driver, on the host's clock"),
    Label("*", "*host_share*", "the host's share of an eager step: the small difference of two timings, "
                               "each moved by the host's speed and load"),
    Label("*", "trace_*", "path of a trace this run wrote (its name carries the time)", RUN_SPECIFIC),
    Label("*", "*_png", "path of a picture this run wrote", RUN_SPECIFIC),
    Label("*", "export_*", "path of a file this run exported", RUN_SPECIFIC),
    # 01: the very first batch pays cuDNN's autotuning, the allocator's growth and lazy initialisation.
    Label("01_*", "first_iteration_ms", "first batch: one-time set-up work on the host (autotuning, allocation, "
                                        "lazy initialisation)"),
    Label("01_*", "flat_until_batch_size", "where the launch-bound region ends: set by the host's issue time per "
                                           "batch (7.2 and 4.5 ms on two H200 hosts, 2026-11-26/27)"),
    Label("01_*", "*_spread_pct", "the p10-p90 spread of a timing: the run-to-run noise itself"),
    # 04's batch-1 forward is launch-bound (the notebook shows it): its rate follows the host.
    Label("04_*", "*_batch[18]", "the forwards of batches 1 and 8 take about the same time, as the notebook prints: "
                                  "launch-bound, their time is the host's (batch 8: 3.3 and 5.6 ms in two runs on one "
                                  "H200 machine, 2026-11-27)"),
    # 15's V3 steps are host-bound by the notebook's own verdict (the device finishes 1.03x after the host issues).
    Label("15_*", "*_step_ms", "eager V3 step, host-bound by the notebook's own verdict: the host's issue time"),
    # The matmul rate of the run's own GPU: at its power limit each chip holds its own clock, and two H200s of one
    # machine differ beyond each one's spread.
    Label("00_*", "matmul_*_tflops", "the matmul rate of the run's own GPU, at the clock its power limit allows: two "
                                     "H200s of one machine gave fp32 50.6 and 51.0 TFLOP/s, each within 0.4% "
                                     "(2026-11-27)"),
    Label("18_*", "matmul_*_tflops", "the matmul rate of the run's own GPU, at the clock its power limit allows: two "
                                     "H200s of one machine gave bf16 725 and 751 TFLOP/s, each within 3% (2026-11-27)"),
    Label("*", "copy_tbs", "the copy bandwidth of the run's own GPU: two H200s of one machine gave 4.15 and 3.97 "
                           "TB/s, each within 1.5% (18, 2026-11-28)"),
    Label("04_*", "mfu_measured", "the achieved rate over the tf32 ceiling measured in the same run, whose own spread "
                                  "is wide (401 and 363 TFLOP/s on two H200s of one machine, spreads overlapping, "
                                  "2026-11-27); the achieved rate and the datasheet MFU are compared"),
    # 03 and 07 set host time against device time, with and without the profiler.
    Label("03_*", "cpu_ms_per_step", "host time to issue one step"),
    Label("03_*", "overhead_ratio", "host time over device time of one step"),
    Label("0[37]_*", "profiler_host_overhead", "what the profiler adds on the host, per event"),
    Label("03_*", "unprofiled_host_device_ratio", "host time over device time of one step"),
    Label("03_*", "launch_bound", "decided by the host's issue time against the device's: the fp32 step sits near "
                                  "the line (0.49 and 0.87 of the device time on two H200 hosts, 2026-11-26/27)"),
    Label("03_*", "said: 0a3f51c5", "section 4's host/device verdict reads the host's issue time against the "
                                    "device's (see launch_bound): 'the device is the limit' at 0.54 and 'at the "
                                    "threshold' at 0.77 in two runs at once on one H200 machine (2026-11-27)"),
    Label("03_*", "fp16*_ms", "an fp16 step of ResNet-50 has about as much device work (5-7 ms) as the host takes "
                              "to issue it (5.2 and 7.5 ms in two runs at once on one H200 machine, 2026-11-27): "
                              "a slower host sets its pace (channels-last 5.1 and 6.6 ms)"),
    Label("03_*", "channels_last_speedup", "ratio of two timed fp16 steps that the host can pace (see fp16*_ms); the "
                                           "profiles' work, channels_last_work_speedup, is compared"),
    Label("03_*", "profiled_device_ms", "device time per step under the profiler: the device waits for the profiled "
                                        "host (9.7 and 15.9 ms in two runs at once on one H200 machine, 2026-11-27)"),
    Label("07_*", "unprofiled_host_over_device", "host time over device time of one step"),
    Label("07_*", "said: 3d24506a", "the profiler's cost on the host and the launch-bound verdicts read the host's "
                                    "issue time, with and without the profiler (see profiler_host_overhead): "
                                    "unprofiled 6.9 and 4.4 ms, profiled 7.4 and 10.2 ms in two runs at once on "
                                    "one H200 machine (2026-11-28)"),
    # 11's bf16 V1 step is host-bound by the notebook's own verdict (as 17 finds for the same model).
    Label("11_*", "step_ms*", "eager bf16 V1 step, host-bound by the notebook's own verdict: 57.2 and 63.6 ms in two "
                              "runs at once on one H200 machine (2026-11-28)"),
    Label("11_*", "mfu", "the model's FLOPs over that eager, host-bound step (see step_ms): 22.2% and 20.2% in the "
                         "same two runs"),
    # 06 and 16 time the compiler: CPU-bound work (Dynamo, Inductor, Triton), moved by the host and its caches.
    Label("06_*", "*compile*_s_*", "compile seconds: the compiler runs on the host, and its caches may be warm"),
    Label("06_*", "compiler_startup_s", "seconds to import and start the compiler, on the host"),
    Label("06_*", "small_speedup_*", "speed-ups of the small model, whose eager step is bound by Python's launches"),
    Label("06_*", "*_compiled_speedup", "the half-precision network compiled without CUDA graphs: its kernels take "
                                        "about as long as the host takes to launch them (3.8 and 4.9 ms a batch in "
                                        "two runs on one H200 machine, 2026-11-27)"),
    Label("06_*", "said: 29a8c616", "the max-autotune prediction line reads the small model's speed-up (see "
                                    "small_speedup_*): 3.99x and 2.31x against 2.5 in two runs on one 2 x H200 "
                                    "machine (2026-11-28)"),
    Label("06_*", "said: dd917ee0", "the live compile + freeze line times ResNet-18 in fp16 at batch 64 without CUDA "
                                    "graphs, paced by the host's launches (see *_compiled_speedup): 1.63x faster and "
                                    "1.02x within noise in two runs on one 2 x H200 machine (2026-11-28)"),
    Label("16_*", "compile_s_*", "compile seconds: the compiler runs on the host, and its caches may be warm"),
    Label("16_*", "*_first_step_s", "first step: compile (cold or from the cache) plus the step, on the host's clock"),
    Label("16_*", "break_even_steps_*", "compile seconds over the per-step saving: carries the compile time's "
                                        "variation"),
    # 13 measures launches themselves.
    Label("13_*", "*launch*_us", "launch cost in microseconds: a Python call into the driver, on the host's clock"),
    Label("13_*", "launch_bound_mib", "computed from the launch cost (the copy that takes as long as one launch)"),
    # 14 times one attention call eagerly: about a millisecond, of which the launches are a visible part.
    Label("14_*", "*eager*", "one attention call timed eagerly (about 1 ms): the host's launches are part of it"),
    Label("14_*", "said: a7e3c915", "the host-versus-device table of each attention call: a row near the 5% line "
                                    "(the math path at 2048, host share 7% and 5% in two runs at once on one H200 "
                                    "machine, 2026-11-28) lands on either side of it; the eager time is the host's"),
    # Eager training steps of the medium model: the host's launches are a visible part of them, and on lent
    # hosts they moved 10-30% between machine starts (2026-11-26, H200) where CUDA-graph replays moved under 2%.
    Label("16_*", "step_ms_* eager", "eager step of the medium model: part host, 10-30% between machine starts"),
    Label("1[78]_*", "step_ms_v[1-4]", "eager bf16 step of the medium model: part host, 10-30% between machine "
                                         "starts"),
    Label("10_*", "*_speedup", "fp32's step over an eager V1 step in tf32 or bf16, which is part host (tf32: 74 and "
                               "91 ms in two runs on one H200 machine, 2026-11-27; fp32 moved 0.1%)"),
    Label("17_*", "tokens_per_s_v*", "from the eager step (see step_ms_v*)"),
    Label("17_*", "mfu_v[1-4]", "from the eager step (see step_ms_v*)"),
    Label("17_*", "speedup_v*_over_v1*", "ratio of eager steps, each moved by the host"),
    Label("18_*", "idle_*", "eager step minus the device's busy time: the host's part of the step"),
    # 20's reference (hidden 512) is launch-bound: its step, and every speed-up measured from it, follow the host.
    Label("20_*", "reference_step_ms", "the lab's reference is launch-bound at its small hidden size: host time"),
    Label("20_*", "*speedup*", "speed-ups over the launch-bound reference step"),
    Label("20_*", "final_step_ms", "eager step of the final configuration: small kernels, part host time"),
    Label("20_*", "baseline_rerun_move_pct", "how far one configuration's median moved between two phases of a run: "
                                             "the host's drift itself"),
    # 21's steps are eager steps of the medium model on each rank, and a collective waits for the later rank.
    Label("21_*", "step_ms_*", "eager steps of the medium model on each rank: part host (see 17's step_ms_v*)"),
    Label("21_*", "tokens_per_s_*", "from the eager steps (see step_ms_*)"),
    Label("21_*", "scaling_efficiency_*", "from the eager steps (see step_ms_*)"),
    Label("21_*", "baseline_tokens_per_s", "one GPU's eager steps of the medium model: part host (see 17's step_ms_v*)"),
    Label("21_*", "said: a186b4ec", "the tuning verdicts compare eager steps of the medium model (see step_ms_*) "
                                    "at the 1.10x least gain: bucket 728 MiB 1.14x / 1.02x, reshard_after_forward="
                                    "False 1.16x / 1.10x in runs on two 2 x H200 machines (2b1c905, 4f1eec2, "
                                    "2026-11-27/28)"),
    Label("21_*", "said: 00755c1d", "the hand-written data-parallel steps are eager steps of the medium model (see "
                                    "step_ms_*): the overlapped loop 0.90x 'slower' / 0.94x within noise of the naive "
                                    "one in runs on two 2 x H200 machines (2b1c905, 4f1eec2, 2026-11-27/28)"),
    # DDP's bucket all-reduces run beside the backward's kernels and share the GPU with them. In the same two runs
    # the plain all-reduce's bus bandwidth agreed within 0.5% and FSDP2's transfers within 0.1%: the link is not
    # what moved.
    Label("21_*", "transfer_ms_ddp", "DDP's all-reduces overlap the backward's kernels and move with that overlap from "
                                     "process to process: 3.63 and 4.12 ms in two runs at once on one H200 machine "
                                     "(2026-11-27), each within 0.6% over its own profiled steps"),
    Label("21_*", "communication_ms_*", "the transfer plus the wait for the later rank: the wait is the skew between "
                                        "the ranks' hosts (the transfer alone, transfer_ms_*, is compared)"),
    Label("19_*", "most_different_figure", "which stored figure differs most from this run's: follows the run's "
                                           "noise", RUN_SPECIFIC),
    # 19 counts what the results folder holds, which depends on what ran before it in that folder.
    Label("19_*", "*_recorded", "how many records the results folder holds: what ran before in it", RUN_SPECIFIC),
    # 22 decodes one token at batch 1 eagerly: hundreds of small launches, bound by the host.
    Label("22_*", "decode_*cache_eager", "eager decode of one token at batch 1: hundreds of launches for a few "
                                         "milliseconds of GPU work, bound by the host"),
    Label("22_*", "decode_*no_cache", "eager decode at batch 1 without a cache: launch-bound, like the cached one"),
    Label("22_*", "speedup_kv_cache", "ratio of two eager, launch-bound decode steps"),
    Label("22_*", "speedup_cuda_graph_decode", "an eager, launch-bound decode step over its graph replay"),
)


def label_of(notebook: str, figure: str, labels: Sequence[Label] = LABELS) -> Label | None:
    """The first label in ``labels`` covering ``figure`` of ``notebook``, or ``None`` (the figure must agree)."""
    return next((label for label in labels if label.matches(notebook, figure)), None)


@dataclass
class NotebookFigures:
    """What one notebook recorded in one run: its figures (the last value of each name), their spreads,
    and where they were measured."""

    notebook: str
    figures: dict[str, Any]
    spreads: dict[str, tuple[float, float]]
    device: str | None
    profile: str | None
    commit: str | None


@dataclass
class Run:
    """One run's recorded figures, notebook by notebook, read from a folder of executed notebooks."""

    source: Path
    notebooks: dict[str, NotebookFigures]
    without_records: list[str] = field(default_factory=list)


def _selected(stem: str, selectors: Sequence[str] | None) -> bool:
    return not selectors or any(stem == s or stem.startswith(s) for s in
                                (Path(selector).name.removesuffix(".ipynb") for selector in selectors))


def notebook_figures(notebook: str, records: Sequence[dict[str, Any]]) -> NotebookFigures:
    """One notebook's records merged: a figure recorded twice keeps its last value (and spread)."""
    figures: dict[str, Any] = {}
    spreads: dict[str, tuple[float, float]] = {}
    device = profile = commit = None
    for entry in records:
        for name, value in entry["figures"].items():
            figures[name] = value
            spreads.pop(name, None)
        for name, pair in (entry.get("spreads") or {}).items():
            if name in entry["figures"] and isinstance(pair, (list, tuple)) and len(pair) == 2:
                spreads[name] = (float(pair[0]), float(pair[1]))
        environment = entry.get("environment") or {}
        device = environment.get("device") or device
        profile = entry.get("profile") or profile
        commit = entry.get("commit") or commit
    return NotebookFigures(notebook, figures, spreads, device, profile, commit)


# What a printed sentence states as a result: the verdict words a reader acts on. The longer phrase comes
# first where one contains another ("not launch-bound", "below your prediction").
SAID_PREFIX = "said: "
_SAID = re.compile(r"the opposite of your prediction|close to your prediction|below your prediction|your prediction|"
                   r"within noise(?: of the line)?|within variation|not launch-bound|launch-bound|host-bound|"
                   r"device-bound|at the line|at the threshold|the device is the limit|the host is the limit|"
                   r"faster|slower|more than|less than|about the same|not kept|kept|PASS|FAIL|WARN", re.IGNORECASE)


def stated_words(path: str | Path) -> dict[str, str]:
    """The verdict words each code cell of an executed notebook printed, in order, as figures named
    ``said: <cell id>`` (cells that printed none are left out). Only printed text counts: tables and
    pictures carry numbers, which the recorded figures compare with their spreads."""
    with open(path, encoding="utf-8") as f:
        cells = json.load(f).get("cells") or []
    said = {}
    for index, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        text = "".join("".join(output.get("text", "")) for output in cell.get("outputs") or []
                       if output.get("output_type") == "stream")
        words = [match.group(0).lower() for match in _SAID.finditer(text)]
        if words:
            said[f"{SAID_PREFIX}{cell.get('id', index)}"] = "; ".join(words)
    return said


def load_run(folder: str | Path, notebooks: Sequence[str] | None = None) -> Run:
    """The figures recorded in the executed notebooks of ``folder`` (those ``notebooks`` name by name or
    prefix, default all), with the words each cell printed (:func:`stated_words`). Raises
    ``FileNotFoundError`` when the folder holds no notebook."""
    folder = Path(folder)
    paths = sorted(folder.glob("*.ipynb")) if folder.is_dir() else []
    if not paths:
        raise FileNotFoundError(f"no notebooks in {folder}: give a run folder of run_solutions (its --output) "
                                "or a solutions folder")
    run = Run(folder, {})
    for path in paths:
        if not _selected(path.stem, notebooks):
            continue
        records = reference.notebook_records(path)
        if records:
            run.notebooks[path.stem] = notebook_figures(path.stem, records)
            run.notebooks[path.stem].figures.update(stated_words(path))
        else:
            run.without_records.append(path.stem)
    return run


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _relative_change(a: float, b: float) -> float:
    if a == 0:
        return 0.0 if b == 0 else math.copysign(math.inf, b)
    return (b - a) / abs(a)


def judge(a: Any, b: Any, spread_a: tuple[float, float] | None, spread_b: tuple[float, float] | None,
          tolerance: float = RELATIVE_TOLERANCE) -> tuple[bool, str]:
    """Whether two runs' values of one figure agree, and by which rule (see the module's docstring)."""
    if _is_number(a) and _is_number(b):
        if spread_a is not None and spread_b is not None:
            overlap = spread_a[0] <= spread_b[1] and spread_b[0] <= spread_a[1]
            return overlap, "spreads overlap" if overlap else "spreads apart"
        agree = abs(b - a) <= tolerance * max(abs(a), abs(b))
        return agree, f"{'within' if agree else 'beyond'} {tolerance:.0%}" + ("" if spread_a is spread_b is None
                                                                            else " (a spread in one run only)")
    if type(a) is not type(b):
        return False, f"{type(a).__name__} against {type(b).__name__}"
    return a == b, "equal" if a == b else "differ"


ROW_COLUMNS = ["notebook", "figure", "status", "A", "B", "change_pct", "A_spread", "B_spread", "rule", "why"]

# Statuses of a row: the first three agree; "moved" is drift; the others are reported apart.
EQUAL, WITHIN_SPREAD, WITHIN_TOLERANCE, MOVED = "equal", "within spread", "within tolerance", "moved"
ONLY_A, ONLY_B, NOT_COMPARED = "only in A", "only in B", "not compared"


@dataclass
class Drift:
    """The comparison of two runs: one row per figure (:data:`ROW_COLUMNS`) and what the header says."""

    a: Run
    b: Run
    table: pd.DataFrame
    notes: list[str]
    refused: list[str]
    tolerance: float = RELATIVE_TOLERANCE

    def rows(self, *statuses: str) -> pd.DataFrame:
        """The rows whose status is one of ``statuses``."""
        return self.table[self.table["status"].isin(statuses)].reset_index(drop=True)

    @property
    def moved(self) -> pd.DataFrame:
        """Figures that are not host-sensitive and disagree between the runs: the drift."""
        return self.rows(MOVED)

    @property
    def exit_status(self) -> int:
        """1 when a figure moved, else 2 when numbers were refused (another device or profile), else 0."""
        return 1 if len(self.moved) else 2 if self.refused else 0

    def report(self) -> str:
        """The drift as markdown: the header, then moved, host-sensitive, one-sided and uncompared figures."""
        return render(self)


def _grouped(pairs: dict[str, tuple[Any, Any]], what: str) -> list[str]:
    """Lines naming, for each distinct (A, B) pair of ``what`` that differ, the notebooks it concerns."""
    groups: dict[tuple[Any, Any], list[str]] = defaultdict(list)
    for notebook, pair in pairs.items():
        if pair[0] != pair[1]:
            groups[pair].append(notebook.split("_")[0])
    return [f"{what} {a or 'unknown'} in A, {b or 'unknown'} in B (notebooks {' '.join(names)})"
            for (a, b), names in groups.items()]


def compare(a: Run, b: Run, tolerance: float = RELATIVE_TOLERANCE, force: bool = False,
            labels: Sequence[Label] = LABELS) -> Drift:
    """Line up ``a``'s and ``b``'s figures notebook by notebook and judge each (module docstring)."""
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance {tolerance} must be a share between 0 and 1 (0.1 is 10%)")
    common = [name for name in sorted(set(a.notebooks) | set(b.notebooks))
              if name in a.notebooks and name in b.notebooks]
    devices = {name: (a.notebooks[name].device, b.notebooks[name].device) for name in common}
    profiles = {name: (a.notebooks[name].profile, b.notebooks[name].profile) for name in common}
    commits = {name: (a.notebooks[name].commit, b.notebooks[name].commit) for name in common}
    refused = [name for name in common if len(set(devices[name])) > 1 or len(set(profiles[name])) > 1]
    notes = [f"Different device: {line}" for line in _grouped(devices, "ran on")]
    notes += [f"Different profile: {line}" for line in _grouped(profiles, "profile")]
    if refused:
        notes.append("Their numbers are compared anyway (--force): a change may be the device's or the size's."
                     if force else "Their numbers are not compared: the figures measure different things "
                                   "(--force compares them anyway); their stated results are.")
        if force:
            refused = []
    notes += [f"Different commits, compared anyway: {line}" for line in _grouped(commits, "at")]

    rows = []
    for name in common:
        left, right = a.notebooks[name], b.notebooks[name]
        for figure in list(left.figures) + [f for f in right.figures if f not in left.figures]:
            label = label_of(name, figure, labels)
            row = {"notebook": name, "figure": figure, "A": left.figures.get(figure), "B": right.figures.get(figure),
                   "A_spread": left.spreads.get(figure), "B_spread": right.spreads.get(figure),
                   "change_pct": None, "rule": "", "why": label.why if label else ""}
            if figure not in right.figures or figure not in left.figures:
                row["status"] = ONLY_A if figure not in right.figures else ONLY_B
            else:
                numbers = _is_number(row["A"]) and _is_number(row["B"])
                if numbers:
                    row["change_pct"] = 100.0 * _relative_change(row["A"], row["B"])
                if (numbers or figure.startswith(SAID_PREFIX)) and name in refused:  # words follow the device
                    row["status"], row["rule"] = NOT_COMPARED, "another device or profile"
                elif label is not None and label.kind == RUN_SPECIFIC:
                    row["status"] = RUN_SPECIFIC
                else:
                    agree, row["rule"] = judge(row["A"], row["B"], row["A_spread"], row["B_spread"], tolerance)
                    if label is not None:
                        row["status"] = HOST_SENSITIVE
                    else:
                        row["status"] = (MOVED if not agree else EQUAL if not numbers else
                                         WITHIN_SPREAD if row["rule"] == "spreads overlap" else WITHIN_TOLERANCE)
            rows.append(row)
    table = pd.DataFrame(rows, columns=ROW_COLUMNS)
    return Drift(a, b, table, notes, refused, tolerance)


# --------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------

def _spread_text(value: Any) -> Any:
    """A recorded spread ``(low, high)`` as ``[low, high]``; any other cell unchanged."""
    return f"[{value[0]:.4g}, {value[1]:.4g}]" if isinstance(value, tuple) else value


def to_markdown(frame: pd.DataFrame) -> str:
    """A GitHub markdown table of ``frame`` (:func:`tinyllama.harness.records.markdown_table`: floats to
    4 significant digits), spreads as ``[low, high]``; ``(none)`` for no rows."""
    if frame.empty:
        return "(none)"
    return markdown_table(frame.map(_spread_text), digits=4)


def _change(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    frame["change"] = [("" if c is None or (isinstance(c, float) and math.isnan(c)) else f"{c:+.1f}%")
                       for c in frame["change_pct"]]
    return frame


def describe(run: Run) -> str:
    """One line: the devices, profiles and commits of ``run``'s notebooks, with how many notebooks each."""
    def counted(values: list[Any]) -> str:
        counts = Counter(value or "unknown" for value in values)
        return ", ".join(f"{value} ({count})" if len(counts) > 1 else str(value) for value, count in counts.items())

    books = list(run.notebooks.values())
    if not books:
        return f"{run.source}: no recorded figures"
    return (f"{run.source}: {len(books)} notebook(s); device {counted([nb.device for nb in books])}; "
            f"profile {counted([nb.profile for nb in books])}; commit {counted([nb.commit for nb in books])}")


def render(drift: Drift) -> str:
    """:meth:`Drift.report`."""
    table = drift.table
    lines = ["# Drift between two runs", "", f"- A: {describe(drift.a)}", f"- B: {describe(drift.b)}"]
    lines += [f"- **{note}**" for note in drift.notes]
    moved = _change(drift.moved)
    lines += ["", f"## Moved beyond their spread ({len(moved)})", "",
              to_markdown(moved[["notebook", "figure", "A", "B", "change", "A_spread", "B_spread", "rule"]])]
    host = _change(drift.rows(HOST_SENSITIVE))
    lines += ["", f"## Host-sensitive ({len(host)}): their change is reported, not counted as drift", "",
              to_markdown(host[["notebook", "figure", "A", "B", "change", "A_spread", "B_spread", "rule", "why"]])]
    one_sided = drift.rows(ONLY_A, ONLY_B)
    lines += ["", f"## In one run only ({len(one_sided)})", "",
              to_markdown(one_sided[["notebook", "figure", "status", "A", "B"]])]
    for side, run, other in (("A", drift.a, drift.b), ("B", drift.b, drift.a)):
        alone = [name for name in run.notebooks if name not in other.notebooks]
        if alone:
            lines.append(f"\nNotebooks with figures in {side} only: {', '.join(alone)}")
        if run.without_records:
            lines.append(f"\nNotebooks without recorded figures in {side}: {', '.join(run.without_records)}")
    skipped = drift.rows(NOT_COMPARED, RUN_SPECIFIC)
    if len(skipped):
        lines += ["", f"## Not compared ({len(skipped)})", "",
                  to_markdown(_change(skipped)[["notebook", "figure", "status", "A", "B", "change", "why"]])]
    counts = Counter(table["status"])
    lines += ["", f"{len(table)} figure(s) in {table['notebook'].nunique()} notebook(s): "
              + ", ".join(f"{counts[s]} {s}" for s in (EQUAL, WITHIN_SPREAD, WITHIN_TOLERANCE, MOVED, HOST_SENSITIVE,
                                                       ONLY_A, ONLY_B, RUN_SPECIFIC, NOT_COMPARED) if counts[s])
              + f". Numbers without a spread in both runs agree within {drift.tolerance:.0%}."]
    if len(drift.moved):
        lines.append(f"{len(drift.moved)} figure(s) moved beyond their spread.")
    elif drift.refused:
        lines.append("No stated result moved; the numbers of other devices or profiles were not compared.")
    else:
        lines.append("No figure moved beyond its spread.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tinyllama.course.drift",
                                     description="List the recorded figures that moved between two runs of the "
                                                 "solution notebooks (folders of executed notebooks).")
    parser.add_argument("a", type=Path, metavar="A",
                        help="the earlier run: a run_solutions --output folder or solutions/")
    parser.add_argument("b", type=Path, metavar="B", help="the later run, compared against A")
    parser.add_argument("--notebooks", nargs="+", metavar="NAME", help="notebooks by name or prefix (default: all)")
    parser.add_argument("--tolerance", type=float, default=RELATIVE_TOLERANCE,
                        help="relative tolerance for numbers without a spread in both runs (default: %(default)s)")
    parser.add_argument("--csv", type=Path, default=None, help="also write every compared figure to this CSV file")
    parser.add_argument("--force", action="store_true",
                        help="compare numbers also where the device or the profile differ")
    args = parser.parse_args(argv)
    try:
        drift = compare(load_run(args.a, args.notebooks), load_run(args.b, args.notebooks), args.tolerance, args.force)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(drift.report())
    if args.csv is not None:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        drift.table.to_csv(args.csv, index=False)
        print(f"Every compared figure: {args.csv}")
    return drift.exit_status


if __name__ == "__main__":
    sys.exit(main())
