"""The instructor's command: run every solution notebook headless and summarise what they measured.

    python -m tinyllama.course.run_solutions [--profile gpu|ci] [--notebooks 00 03 ...] [--output DIR]

Each notebook runs top to bottom in a fresh kernel (nbclient) with failed checkpoints raising
(``WORKSHOP_STRICT=1``). The executed copies go to ``DIR`` (default: a new folder under the results
directory), together with ``summary.md`` and ``summary.csv``: every figure the notebooks recorded in
this run. Each executed copy keeps in its metadata the records its notebook appended in this run
(:mod:`tinyllama.course.reference`). The exit status is 1 when a notebook failed.
``--update-solutions`` stores the fresh outputs, with those records, in ``solutions/`` (how the reference
outputs and figures of a GPU run are kept); ``--store RUN`` stores those of a finished run (of a ``--twice``
run, its run ``b``), refusing a notebook whose solution changed since. ``--stale`` lists the stored
solutions whose code changed after the run their outputs came from (:mod:`tinyllama.course.stale`).

Reproducibility (:mod:`tinyllama.course.drift`): ``--against [DIR]`` compares this run's figures with
those stored in ``DIR`` (without ``DIR``: the solutions the notebooks came from, read before this run
may update them) and lists the figures that moved beyond their spread; ``--twice`` runs the notebooks
twice in two processes, each with its own results folder and compiler caches (at once where the machine
has a GPU for each, or ``--gpus-per-run N`` GPUs for each; else one after the other), and compares the
two runs. Drift makes the exit status 1, numbers refused
for another device or profile 2 (``python -m tinyllama.course.drift --force`` compares them anyway).

Each notebook runs in the kernel it names, the course's (``bash course.sh kernel`` registers it), or
in ``--kernel-name``; where the course's kernel is not registered, in Jupyter's ``python3`` kernel,
with the checkout on its ``PYTHONPATH``, and the command says so.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import nbformat
import pandas as pd
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from tqdm.auto import tqdm

from tinyllama import device as dev
from tinyllama.course import checkpoints, drift, reference, results, stale
from tinyllama.course.jupyter_setup import KERNEL_NAME, registered_kernels
from tinyllama.course.profile import ENV_VARIABLE as PROFILE_VARIABLE
from tinyllama.course.profile import select_profile
from tinyllama.harness.records import markdown_table


@dataclass
class Outcome:
    """How one notebook's run went."""

    notebook: str
    ok: bool
    seconds: float
    error: str = ""
    executed: Path | None = None


def find_notebooks(solutions: Path, selectors: list[str] | None) -> list[Path]:
    """Solution notebooks in course order; ``selectors`` pick by name or prefix (``00``, ``03_pytorch``)."""
    available = sorted(solutions.glob("*.ipynb"))
    if not available:
        raise FileNotFoundError(f"no solution notebooks in {solutions}")
    if not selectors:
        return available
    chosen: list[Path] = []
    for selector in selectors:
        stem = Path(selector).name.removesuffix(".ipynb")
        matches = [path for path in available if path.stem == stem or path.stem.startswith(stem)]
        if not matches:
            raise ValueError(f"no solution notebook matches {selector!r}: choose from "
                             f"{', '.join(path.stem for path in available)}")
        chosen.extend(path for path in matches if path not in chosen)
    return chosen


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the kernels started inside, and restore them afterwards."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# ipykernel's kernel, which Jupyter provides for the Python it runs in unless a kernel of that name is
# registered elsewhere: where a notebook's own kernel is missing, the notebooks run in this one.
FALLBACK_KERNEL = "python3"


def choose_kernel(wanted: str, available: set[str]) -> tuple[str, str]:
    """The kernel to run a notebook that names ``wanted`` in, and a note when it is another one:
    ``wanted`` where it is registered, else :data:`FALLBACK_KERNEL`. Raises ``ValueError`` when
    neither is registered."""
    if wanted in available:
        return wanted, ""
    how = ("`bash course.sh kernel` registers it" if wanted == KERNEL_NAME
           else "`jupyter kernelspec list` shows the registered ones")
    if FALLBACK_KERNEL not in available:
        raise ValueError(f"the Jupyter kernel {wanted!r} is not registered ({how}), nor is {FALLBACK_KERNEL!r}")
    return FALLBACK_KERNEL, (f"note: the Jupyter kernel {wanted!r} is not registered here ({how}): the notebooks "
                             f"run in the {FALLBACK_KERNEL!r} kernel instead, with this checkout on its PYTHONPATH")


def notebook_kernel(path: Path) -> str:
    """The name of the kernel the notebook at ``path`` names (its metadata's kernelspec)."""
    return nbformat.read(path, as_version=4).metadata.get("kernelspec", {}).get("name", FALLBACK_KERNEL)


_ANSI_COLOURS = re.compile(r"\x1b\[[0-9;]*m")


def _first_line(error: BaseException) -> str:
    text = _ANSI_COLOURS.sub("", str(error)).strip()
    # nbclient's message holds the cell source and the traceback; its last lines name the error.
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else type(error).__name__


def run_notebook(path: Path, output: Path, timeout: int, kernel_name: str | None,
                 run_id: str | None = None) -> Outcome:
    """Execute ``path`` in a fresh kernel, with cells run from its own folder; write the executed copy
    (also when it fails, so the error can be read there). With ``run_id``, the records the notebook
    appended in this run go into the copy's metadata (the reference figures of the solutions)."""
    nb = nbformat.read(path, as_version=4)
    code_cells = sum(1 for cell in nb.cells if cell.cell_type == "code")
    progress = tqdm(total=code_cells, desc=path.stem, unit="cell", leave=True)
    options: dict[str, object] = {"timeout": timeout, "record_timing": False,
                                  "resources": {"metadata": {"path": str(path.parent)}}}
    if kernel_name:
        options["kernel_name"] = kernel_name
    client = NotebookClient(nb, on_cell_executed=lambda **_: progress.update(1), **options)
    began = time.perf_counter()
    error = ""
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
        error = _first_line(exc)
    except Exception as exc:  # the kernel did not start (unknown kernel name, missing ipykernel, ...)
        error = f"{type(exc).__name__}: {_first_line(exc)}"
    finally:
        progress.close()
    if run_id is not None:
        reference.attach_records(nb, [entry for entry in results.read_records()
                                      if entry.get("run_id") == run_id and entry.get("notebook") == path.stem])
    executed = output / path.name
    nbformat.write(nb, executed)
    return Outcome(path.stem, not error, time.perf_counter() - began, error, executed)


def summarize(outcomes: list[Outcome], figures: pd.DataFrame, profile: str, output: Path) -> str:
    """Write ``summary.csv`` (every figure of the run) and ``summary.md`` (notebooks and figures);
    return the markdown."""
    figures.to_csv(output / "summary.csv", index=False)
    lines = [f"# Solution run, profile {profile}, {_dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}", ""]
    if not figures.empty:
        first = figures.iloc[0]
        lines += [f"Device: {first['device']} ({first['backend']}), torch {first['torch']}, "
                  f"triton {first['triton']}", ""]
    lines.append(markdown_table(pd.DataFrame(
        [{"notebook": o.notebook, "result": "ok" if o.ok else f"FAILED: {o.error}", "time (s)": f"{o.seconds:.1f}"}
         for o in outcomes], columns=["notebook", "result", "time (s)"])))
    lines += ["", "## Recorded figures", ""]
    lines.append("No figures were recorded." if figures.empty
                 else markdown_table(figures[["notebook", "figure", "value"]], digits=4))
    text = "\n".join(lines) + "\n"
    (output / "summary.md").write_text(text, encoding="utf-8")
    return text


def report_drift(before: drift.Run, after: drift.Run, output: Path) -> int:
    """Print the drift of ``after`` against ``before``, write it to ``drift.md`` and ``drift.csv`` in
    ``output``, and return its exit status (:attr:`tinyllama.course.drift.Drift.exit_status`)."""
    found = drift.compare(before, after)
    text = found.report()
    print(text)
    (output / "drift.md").write_text(text, encoding="utf-8")
    found.table.to_csv(output / "drift.csv", index=False)
    print(f"Drift report: {output / 'drift.md'} (every compared figure: {output / 'drift.csv'})")
    return found.exit_status


def _relay(process: subprocess.Popen[str], log: Path, name: str) -> None:
    """Copy a child run's output into its log, line by line as it comes (a run stopped by a time limit keeps
    what it printed), echoing its one-line notebook results with its name."""
    assert process.stdout is not None
    with open(log, "w", encoding="utf-8", buffering=1) as f:
        for line in process.stdout:
            f.write(line)
            if line.startswith(("ok    ", "FAILED")):
                print(f"[{name}] {line}", end="", flush=True)


def run_twice(arguments: list[str], output: Path, gpus: int, per_run: int = 1) -> int:
    """Run this command (``arguments``: its options without ``--twice`` and ``--output``) twice in two
    processes, writing to ``output/a`` and ``output/b``, each with its own results folder and its own
    compiler caches (Inductor's and Triton's: two processes writing one cache can load each other's
    half-written kernels). With ``2 * per_run`` GPUs or more, the runs go at once, each on ``per_run`` GPUs of
    its own (each sees only its own: :func:`tinyllama.device.visible_device_environment`); otherwise one after
    the other. Returns the worse of the two runs' exit statuses and the drift's."""
    at_once = gpus >= 2 * per_run
    runs = []
    for index, name in enumerate("ab"):
        folder = output / name
        folder.mkdir(parents=True, exist_ok=True)
        environment = {results.ENV_VARIABLE: str(results.results_dir(folder / "results")),
                       "TORCHINDUCTOR_CACHE_DIR": str(folder / "compiler-cache" / "inductor"),
                       "TRITON_CACHE_DIR": str(folder / "compiler-cache" / "triton"),
                       # the child imports this checkout's package, installed or not
                       "PYTHONPATH": os.pathsep.join(p for p in (str(results.checkout_root() or ""),
                                                                 os.environ.get("PYTHONPATH", "")) if p)}
        if at_once:
            environment.update(dev.visible_device_environment(index * per_run, per_run))
        runs.append((name, folder, environment))
    if at_once:
        variable = dev.visible_devices_variable()
        print(f"Two runs at once, {'one a GPU' if per_run == 1 else f'{per_run} GPUs each'}: "
              + ", ".join(f"{name} with {variable}={environment[variable]}" for name, _, environment in runs))
    else:
        print(f"{gpus} GPU(s), {per_run} a run: the two runs go one after the other.")
    statuses: dict[str, int] = {}

    def start(name: str, folder: Path,
              environment: dict[str, str]) -> tuple[subprocess.Popen[str], threading.Thread]:
        command = [sys.executable, "-m", "tinyllama.course.run_solutions", *arguments, "--output", str(folder)]
        log = output / f"{name}.log"
        print(f"[{name}] {' '.join(command[1:])}: log in {log}", flush=True)
        process = subprocess.Popen(command, env={**os.environ, **environment}, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, bufsize=1)
        relay = threading.Thread(target=_relay, args=(process, log, name), daemon=True)
        relay.start()
        return process, relay

    def finish(name: str, process: subprocess.Popen[str], relay: threading.Thread) -> None:
        statuses[name] = process.wait()
        relay.join()
        print(f"[{name}] finished with exit status {statuses[name]}", flush=True)

    if at_once:
        started = [(name, *start(name, folder, environment)) for name, folder, environment in runs]
        for name, process, relay in started:
            finish(name, process, relay)
    else:
        for name, folder, environment in runs:
            finish(name, *start(name, folder, environment))
    print()
    try:
        found = report_drift(drift.load_run(output / "a"), drift.load_run(output / "b"), output)
    except FileNotFoundError as error:
        print(f"error: no drift to compare: {error} (see the logs in {output})", file=sys.stderr)
        return 2
    return max([found, *statuses.values()])


def _first_difference(executed: Path, solution: Path) -> str | None:
    """The first cell in which an executed copy's source differs from the solution's (its id, or where the
    two part), or None where every cell is the same."""
    import nbformat

    ran, stored = (nbformat.read(path, as_version=4).cells for path in (executed, solution))
    for index, (a, b) in enumerate(zip(ran, stored)):
        if (a.cell_type, a.source) != (b.cell_type, b.source):
            return f"cell {index + 1} ({b.cell_type}, id {b.get('id', '-')})"
    return None if len(ran) == len(stored) else f"cell {min(len(ran), len(stored)) + 1} (the cell counts differ)"


def store_run(run: Path, solutions: Path, selectors: list[str] | None = None) -> int:
    """Store the executed copies of a finished run (an ``--output`` folder; of a ``--twice`` run, its run
    ``b``) in ``solutions``, outputs and records, as ``--update-solutions`` does after a run. A notebook whose
    solution changed after the run (any cell's source) is refused and left as it is: its outputs would not be
    what its code prints. Returns 1 where one was refused, else 0."""
    folder = run / "b" if (run / "b").is_dir() and not any(run.glob("[0-9][0-9]_*.ipynb")) else run
    chosen = {path.name for path in find_notebooks(solutions, selectors)} if selectors else None
    executed = [path for path in sorted(folder.glob("[0-9][0-9]_*.ipynb")) if chosen is None or path.name in chosen]
    if not executed:
        raise FileNotFoundError(f"no executed notebooks in {folder}: pass the --output folder of a finished run")
    refused = 0
    for path in executed:
        target = solutions / path.name
        differs = _first_difference(path, target) if target.exists() else "the notebook (not in the solutions)"
        if differs is not None:
            print(f"refused {path.stem}: {differs} differs from the solution's: it changed after this run; "
                  "run the notebook again", file=sys.stderr)
            refused += 1
            continue
        shutil.copyfile(path, target)
        print(f"stored  {path.stem} from {folder} into {target}")
    return 1 if refused else 0


def main(argv: list[str] | None = None) -> int:
    root = results.checkout_root() or Path.cwd()
    parser = argparse.ArgumentParser(prog="python -m tinyllama.course.run_solutions",
                                     description="Run the solution notebooks headless and summarise their figures.")
    parser.add_argument("--profile", choices=["gpu", "ci"], default=None,
                        help=f"size profile (default: ${PROFILE_VARIABLE}, else gpu with a GPU and ci without)")
    parser.add_argument("--notebooks", nargs="+", metavar="NAME", help="notebooks by name or prefix (default: all)")
    parser.add_argument("--output", type=Path, default=None,
                        help="folder for the executed copies and the summary (default: a new folder under "
                             "the results directory)")
    parser.add_argument("--solutions", type=Path, default=root / "solutions", help="default: %(default)s")
    parser.add_argument("--timeout", type=int, default=900, help="seconds one cell may take (default: %(default)s)")
    parser.add_argument("--kernel-name", default=None,
                        help=f"Jupyter kernel (default: the notebook's own, {KERNEL_NAME!r}; where that is not "
                             f"registered, {FALLBACK_KERNEL!r})")
    parser.add_argument("--update-solutions", action="store_true",
                        help="store the outputs of notebooks that ran cleanly back into the solutions")
    parser.add_argument("--against", nargs="?", type=Path, const=True, default=None, metavar="DIR",
                        help="then list the figures that moved beyond their spread against the run stored in DIR "
                             "(a solutions folder or an earlier --output); without DIR, the --solutions folder "
                             "as it was before this run")
    parser.add_argument("--store", type=Path, metavar="RUN",
                        help="run nothing: store the executed copies of a finished run (its --output folder; of a "
                             "--twice run, its run b) in the solutions, refusing any notebook changed since")
    parser.add_argument("--stale", action="store_true",
                        help="run nothing: list the solutions whose code cells changed since the commit their "
                             "outputs ran at, and the names changed since in the course files each imports")
    parser.add_argument("--twice", action="store_true",
                        help="run the notebooks twice in two processes, each with its own results folder (at once "
                             "on two GPUs where there are two, else one after the other), and list the figures "
                             "that moved between the two runs")
    parser.add_argument("--gpus-per-run", type=int, default=1, metavar="N",
                        help="with --twice: GPUs each run sees (2 for 05 and 21); the runs go at once where the "
                             "machine has twice as many (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.stale:
        try:
            if args.twice or args.update_solutions or args.against is not None or args.store is not None:
                raise ValueError("--stale runs nothing: it reads the stored solutions against git; run the other "
                                 "options without it")
            return stale.report(find_notebooks(args.solutions, args.notebooks))
        except (ValueError, FileNotFoundError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    if args.store is not None:
        try:
            if args.twice or args.update_solutions or args.against is not None:
                raise ValueError("--store runs nothing: it stores a finished run's outputs; run --twice, "
                                 "--update-solutions or --against without it")
            return store_run(args.store, args.solutions, args.notebooks)
        except (ValueError, FileNotFoundError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    try:
        if args.gpus_per_run < 1 or (args.gpus_per_run > 1 and not args.twice):
            raise ValueError("--gpus-per-run N (N of 1 or more) goes with --twice; a single run sees every GPU "
                             "of the machine (choose them with CUDA_VISIBLE_DEVICES or HIP_VISIBLE_DEVICES)")
        if args.twice and (args.update_solutions or args.against is not None):
            raise ValueError("--twice compares two fresh runs with each other: run --against or "
                             "--update-solutions separately")
        selection = select_profile(args.profile)
        notebooks = find_notebooks(args.solutions, args.notebooks)
        results_directory = results.results_dir()
        available = registered_kernels()
        if args.kernel_name is not None and args.kernel_name not in available:
            raise ValueError(f"the Jupyter kernel {args.kernel_name!r} is not registered: choose one of "
                             f"{', '.join(sorted(available))}")
        # Read before the run: with --update-solutions the run may overwrite the folder it is compared with.
        against = args.solutions if args.against is True else args.against  # a bare --against: True
        before = drift.load_run(against, [path.stem for path in notebooks]) if against is not None else None
    except (ValueError, RuntimeError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    profile = selection.profile.name
    run_id = f"{_dt.datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
    output = (args.output or results_directory / "instructor-runs" / f"{run_id}-{profile}").resolve()
    output.mkdir(parents=True, exist_ok=True)
    if args.twice:
        arguments = ["--profile", profile, "--solutions", str(args.solutions.resolve()), "--timeout",
                     str(args.timeout), "--notebooks", *(path.stem for path in notebooks)]
        arguments += ["--kernel-name", args.kernel_name] if args.kernel_name else []
        print(f"Running {len(notebooks)} notebook(s) twice; both runs and their drift go to {output}")
        try:
            return run_twice(arguments, output, dev.gpu_count(), args.gpus_per_run)
        except ValueError as error:  # a results folder the checkout holds
            print(f"error: {error}", file=sys.stderr)
            return 2
    print(selection.message())
    print(f"Running {len(notebooks)} notebook(s); executed copies and summary go to {output}")

    kernel_environment = {
        PROFILE_VARIABLE: profile,
        checkpoints.STRICT_VARIABLE: "1",
        results.RUN_ID_VARIABLE: run_id,
        results.ENV_VARIABLE: str(results_directory),
        "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p),
    }
    outcomes = []
    notes: set[str] = set()
    with _environment(kernel_environment):
        for path in notebooks:
            try:
                kernel, note = choose_kernel(args.kernel_name or notebook_kernel(path), available)
            except ValueError as error:
                print(f"error: {error}", file=sys.stderr)
                return 2
            if note and note not in notes:
                print(note, flush=True)
                notes.add(note)
            outcome = run_notebook(path, output, args.timeout, kernel, run_id)
            outcomes.append(outcome)
            print(f"{'ok    ' if outcome.ok else 'FAILED'} {outcome.notebook} ({outcome.seconds:.0f} s)"
                  + (f": {outcome.error}" if outcome.error else ""), flush=True)
            if outcome.ok and args.update_solutions and outcome.executed is not None:
                shutil.copyfile(outcome.executed, path)
                print(f"       stored the outputs in {path}")

    figures = results.load_results(results_directory)
    figures = figures[figures["run_id"] == run_id].reset_index(drop=True)
    print()
    print(summarize(outcomes, figures, profile, output))
    failed = [outcome.notebook for outcome in outcomes if not outcome.ok]
    if failed:
        print(f"{len(failed)} notebook(s) failed: {', '.join(failed)} (see the executed copies in {output})",
              file=sys.stderr)
    else:
        print(f"All {len(outcomes)} notebook(s) ran cleanly.")
    status = 1 if failed else 0
    if before is not None:
        print(f"\nAgainst {before.source}:")
        status = max(status, report_drift(before, drift.load_run(output, [path.stem for path in notebooks]), output))
    return status


if __name__ == "__main__":
    sys.exit(main())
