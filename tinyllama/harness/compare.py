"""Compare TinyLLaMA versions honestly: one process, one device, the same weights and batches.

    python -m tinyllama.harness.compare --preset medium --runs v1:fp32 v2:fp32 "v2[fuse_qkv=0]:fp32" v4:bf16

For each run, in order:
1. the model is built and V1's weights are copied into it (``transfer_weights``), so every run
   computes with the same numbers;
2. it is checked against V1 at fp32 on a fresh random batch: logits, loss and the gradient of every
   parameter (fused weights split back into V1's) must agree, and every parameter must receive a
   gradient; a run at another precision is also checked at that precision, with a looser tolerance.
   A run that fails is not timed;
3. it is timed by the training benchmark (``tinyllama.harness.bench``) on batches shared by all runs;
4. with ``turns`` (``--turns``), every run that passed is built again and all of them are timed **in
   turns** (``tinyllama.harness.bench.time_steps_in_turns``: each round gives every run a few steps, in an order that
   rotates), where they fit on the device at once: whatever the host does meanwhile falls on all runs
   alike, so their ratios do not follow the host's drift. Those are then the step times, tokens/s and
   MFU of the record; the forward / backward / optimizer split and the peak memory stay those of step 3;
5. after every run was timed, the profiler counts each run's matrix-multiply (GEMM) launches in one
   training step (the evidence that a fusion really replaced several products by one), in a process
   of its own: a profiler session slows every later launch in the process that ran it.

The result is one record (device, date, torch version, every run) that prints as a table, appends to
a JSON or CSV file, plots (``plot_comparison``) and compares with an earlier record
(``find_regressions``: each figure that moved by more than the two runs' own spread is flagged).

This module runs a comparison and is its command line; the parts live in ``tinyllama.harness.comparison``
(run specs, the parity check, the record, regressions, the GPU targets) and the GEMM counts in
``tinyllama.profiling.queries``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
import time
from typing import Any, Iterable, Sequence

import torch
from torch import nn

from tinyllama import device as dev
from tinyllama.config import PRECISIONS, BenchmarkError, resolve_config
from tinyllama.correctness import CorrectnessError
from tinyllama.harness.bench import NoRoomForTurns, TurnRun, run_benchmark, time_steps_in_turns
from tinyllama.harness.cli import add_problem_size_arguments, add_run_arguments, say, shape_overrides, wide_tables
from tinyllama.harness.comparison.parity import TOLERANCES, ParityCheck, Reference, check_parity, reference_answer
from tinyllama.harness.comparison.profiles import profile_runs
from tinyllama.harness.comparison.record import RECORD_KIND, Comparison, load_record, plot_comparison
from tinyllama.harness.comparison.regressions import REGRESSION_FLAGS, find_regressions
from tinyllama.harness.comparison.runs import RUN_SETS, RunSpec, expand_runs, parse_run
from tinyllama.models import build
from tinyllama.models.weights import canonical_state_dict, from_canonical, unwrap
from tinyllama.profiling.isolated import isolated
from tinyllama.profiling.kernel_names import is_gemm_kernel
from tinyllama.training import check_cuda_graph, make_batches

__all__ = ["RECORD_KIND", "REGRESSION_FLAGS", "RUN_SETS", "TOLERANCES", "Comparison", "ParityCheck", "Reference",
           "RunSpec", "check_parity", "compare", "expand_runs", "find_regressions", "is_gemm_kernel", "load_record",
           "main", "parse_run", "plot_comparison", "reference_answer"]


def compare(
    runs: Sequence[str | RunSpec] = ("v1:fp32", "v2:fp32", "v4"),
    preset: str = "ci",
    *,
    batch_size: int | None = None,
    seq_len: int | None = None,
    num_steps: int = 10,
    warmup_steps: int = 3,
    seed: int = 0,
    device: torch.device | str | None = None,
    gemm_counts: bool = True,
    profile_runs: Sequence[str] = (),
    profile_top: int = 15,
    ceilings: dict[str, float] | None = None,
    turns: int = 0,
    steps_per_turn: int = 2,
    progress: bool = True,
    **config_overrides: Any,
) -> Comparison:
    """Check every run against V1, then time it; see the module docstring.

    ``runs``: specs such as ``"v2[fuse_qkv=0]:fp32"`` or run-set names (``RUN_SETS``).
    ``gemm_counts``: count GEMM operators and kernels per step with the profiler.
    ``profile_runs``: labels of runs whose top operations are recorded (``profile_top`` rows).
    ``ceilings``: measured matmul TFLOP/s per precision (``tinyllama.costs.ceilings``); the MFU of a run is
    also given against the ceiling of its precision. Speed-ups are against the first V1 fp32 run
    (else the first V1 run, else the first run). ``turns``: rounds of timing in turns after the runs
    (``steps_per_turn`` steps a run each round); 0 keeps each run's own timing.
    """
    if turns < 0 or steps_per_turn < 1:
        raise ValueError(f"turns must be 0 (off) or more and steps_per_turn at least 1 (got {turns}, {steps_per_turn})")
    specs = expand_runs(runs)
    device = dev.get_device(None if device is None else str(device))
    graphed = [s.label for s in specs if s.cuda_graph]  # explicitly asked for; a version's default adapts
    if graphed:  # refused before any run, rather than after V1 has been timed
        try:
            check_cuda_graph(device, warmup_steps)
        except ValueError as error:
            raise ValueError(f"{', '.join(graphed)}: {error}") from None
    profile_labels = {parse_run(r).label if isinstance(r, str) else r.label for r in profile_runs}
    config, batch_size, seq_len = resolve_config(preset, batch_size, seq_len, **config_overrides)
    overrides = {k: v for k, v in config_overrides.items() if v is not None}
    batches = make_batches(config, batch_size, seq_len, count=4, seed=seed, device=device)
    # The check uses a batch that no run trains on: fresh random inputs.
    check_inputs, check_targets = make_batches(config, batch_size, seq_len, count=1, seed=seed + 1000,
                                               device=device)[0]

    say(f"reference: V1 fp32 at preset {preset} (batch {batch_size} x seq {seq_len}) on "
         f"{dev.device_name(device)}", progress)
    torch.manual_seed(seed)
    with device:  # initialise on the device: much faster than on the host for the large presets
        reference_model = build("v1", config)
    weights = {k: v.detach().clone() for k, v in canonical_state_dict(reference_model).items()}
    reference = reference_answer(reference_model, check_inputs, check_targets)
    del reference_model

    rows: list[dict[str, Any]] = []
    for index, spec in enumerate(specs, 1):
        say(f"[{index}/{len(specs)}] {spec.label}", progress)
        began = time.perf_counter()
        row, model = _check_run(spec, config, weights, reference, device, progress)
        if model is not None:
            try:
                row.update(_time_run(spec, model, preset, batch_size, seq_len, num_steps, warmup_steps, seed,
                                     device, batches, progress, overrides))
            except (BenchmarkError, CorrectnessError) as error:
                row.update(check="failed", check_message=str(error))
                say(f"  NOT TIMED: {error}", progress)
            except Exception as error:  # noqa: BLE001 - only out-of-memory is reported and skipped
                if not dev.is_out_of_memory(error):
                    raise
                row.update(check="out of memory", check_message=f"out of memory while timing: {_oom_advice(batch_size)}")
                say(f"  NOT TIMED: {row['check_message']}", progress)
        row["run_s"] = time.perf_counter() - began
        rows.append(row)
        del model
        dev.free_memory(device)

    rounds_in_turns = 0
    if turns and sum(row["check"] == "passed" for row in rows) > 1:
        rounds_in_turns = _retime_in_turns(specs, rows, config, weights, batches, device, turns, steps_per_turn,
                                           warmup_steps, progress)
    profiles = _profile_timed_runs(specs, rows, config, weights, batches[0], device, gemm_counts, profile_labels,
                                   profile_top, progress)
    _add_ratios(rows, ceilings or {})
    record = {
        "kind": RECORD_KIND, "schema": 1,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": dev.device_name(device), "environment": dev.environment_summary(device),
        "preset": preset, "config": config.to_dict(), "batch_size": batch_size, "seq_len": seq_len,
        "num_steps": num_steps, "warmup_steps": warmup_steps, "seed": seed, "timed_in_turns": rounds_in_turns,
        "steps_per_turn": steps_per_turn if rounds_in_turns else 0,
        "ceilings_tflops": dict(ceilings or {}), "baseline_run": _baseline_label(rows),
        "runs": rows, "profiles": profiles,
    }
    return Comparison(record)


def _profile_timed_runs(specs: Sequence[RunSpec], rows: list[dict[str, Any]], config: Any,
                        weights: dict[str, torch.Tensor], batch: tuple[torch.Tensor, torch.Tensor],
                        device: torch.device, gemm_counts: bool, profile_labels: set[str], top: int,
                        progress: bool) -> dict[str, list[dict[str, Any]]]:
    """Add the GEMM counts to the timed runs' rows and return the top operations of those asked for.
    All of it is profiled after every run was timed, and in a process of its own: a profiler session
    leaves the process that ran it slower to launch kernels (see ``tinyllama.timing``)."""
    timed = [spec for spec, row in zip(specs, rows) if row["check"] == "passed"]
    wanted = [spec for spec in timed if gemm_counts or spec.label in profile_labels]
    if not wanted:
        return {}
    say(f"profiling {len(wanted)} run(s) in a separate process (GEMM counts{', top operations' if profile_labels else ''})",
        progress)
    dev.free_memory(device)
    answers = isolated(profile_runs, wanted, config, {k: v.cpu() for k, v in weights.items()},
                       tuple(t.cpu() for t in batch), str(device), gemm_counts, sorted(profile_labels), top)
    profiles: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        answer = answers.get(row["label"], {})
        if "error" in answer:
            say(f"  {row['label']}: not profiled ({answer['error']})", progress)
        row.update({k: answer[k] for k in ("gemm_ops", "gemm_kernels") if k in answer})
        if "profile" in answer:
            profiles[row["label"]] = answer["profile"]
    return profiles


def _retime_in_turns(specs: Sequence[RunSpec], rows: list[dict[str, Any]], config: Any,
                     weights: dict[str, torch.Tensor], batches: list[tuple[torch.Tensor, torch.Tensor]],
                     device: torch.device, rounds: int, per_turn: int, warmup_steps: int, progress: bool) -> int:
    """Build every run that passed again (V1's weights, the same batches) and time them all in turns
    (``bench.time_steps_in_turns``); put those step times, tokens/s and MFU into their rows. Where they do not
    fit on the device at once, every run keeps its own timing and this says so. Returns the rounds timed (0
    where they did not fit)."""
    passed = [(spec, row) for spec, row in zip(specs, rows) if row["check"] == "passed"]
    say(f"timing the {len(passed)} runs in turns: {rounds} rounds of {per_turn} steps each", progress)
    torch._dynamo.reset()  # once, before the builds: a reset between them would recompile the earlier ones mid-turn
    runs = {}
    try:
        for spec, row in passed:
            with device:
                model = build(spec.version, config, **spec.model_options)
            unwrap(model).load_state_dict(from_canonical(model, weights))
            runs[spec.label] = TurnRun(model, spec.precision, bool(row["cuda_graph"]), row.get("peak_memory_mib"))
        times = time_steps_in_turns(runs, batches, device, rounds=rounds, per_turn=per_turn, warmup_steps=warmup_steps)
    except Exception as error:  # noqa: BLE001 - no room (the models themselves, or their steps) is said, the rest re-raised
        if not isinstance(error, NoRoomForTurns) and not dev.is_out_of_memory(error):
            raise
        reason = error if isinstance(error, NoRoomForTurns) else "out of memory building every run at once"
        say(f"  not timed in turns ({reason}): each run's step times are its own, one after the other; compare "
            "fewer runs at a time for ratios that do not follow the host's drift", progress)
        return 0
    finally:
        runs.clear()
        dev.free_memory(device)
    for spec, row in passed:
        stats = times[spec.label]
        row.update(stats.as_dict(prefix="step_ms_"))
        step_s = stats.median / 1e3
        row["tokens_per_s"] = row["batch_size"] * row["seq_len"] / step_s
        row["samples_per_s"] = row["batch_size"] / step_s
        row["achieved_tflops"] = row["flops_per_step"] / step_s / 1e12
        row["mfu"] = row["achieved_tflops"] / row["peak_tflops"] if row.get("peak_tflops") else None
        say(f"  {spec.label}: {stats.median:.2f} ms/step in turns (p10 {stats.p10:.2f}, p90 {stats.p90:.2f})", progress)
    return rounds


def _oom_advice(batch_size: int) -> str:
    return f"try a smaller batch (batch_size={max(1, batch_size // 2)}) or fewer runs"


def _check_run(spec: RunSpec, config: Any, weights: dict[str, torch.Tensor], reference: Reference,
               device: torch.device, progress: bool) -> tuple[dict[str, Any], nn.Module | None]:
    """Build the run's model with V1's weights and check it; the model is ``None`` if it failed."""
    row: dict[str, Any] = {"label": spec.label, "version": spec.version, "precision": spec.precision,
                           "options": dict(spec.options)}
    began = time.perf_counter()
    compiled = False
    try:
        # A fresh compiler cache for each run (V4 compiles by default): the graphs, guards and
        # recompile counts of earlier runs in this process must neither slow this one down nor push
        # its blocks past torch.compile's recompile limit (beyond it, they would silently run eagerly).
        torch._dynamo.reset()
        with device:
            model = build(spec.version, config, **spec.model_options)
        unwrap(model).load_state_dict(from_canonical(model, weights))
        compiled = unwrap(model).compiled
        if compiled:
            say("  compiling (torch.compile: the first steps take a while)", progress)
        checks = [check_parity(model, reference, "fp32")]
        if spec.precision != "fp32":
            checks.append(check_parity(model, reference, spec.precision))
    except Exception as error:  # noqa: BLE001 - out-of-memory and compiler failures become a row
        if dev.is_out_of_memory(error):
            message = f"out of memory during the check: {_oom_advice(reference.inputs.shape[0])}"
            status = "out of memory"
        elif compiled:  # e.g. no C compiler or Triton for Inductor on this machine
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            message = f"torch.compile failed ({type(error).__name__}: {first_line}); run it without compile=1"
            status = "failed"
        else:
            raise
        say(f"  NOT TIMED: {message}", progress)
        return {**row, "check": status, "check_message": message}, None
    row["check_s"] = time.perf_counter() - began
    for check in checks:
        suffix = "" if check.precision == "fp32" else "_own_precision"
        row[f"check_logits_error{suffix}"] = check.logits_error
        row[f"check_loss_error{suffix}"] = check.loss_error
        row[f"check_gradient_error{suffix}"] = check.gradient_error
    failed = [c for c in checks if not c.passed]
    row["check"] = "failed" if failed else "passed"
    row["check_message"] = "; ".join(c.summary() for c in (failed or checks))
    say(f"  check vs V1 {'FAILED, not timed' if failed else 'passed'}: {row['check_message']}", progress)
    if failed:
        return row, None
    return row, model


def _time_run(spec: RunSpec, model: nn.Module, preset: str, batch_size: int, seq_len: int, num_steps: int,
              warmup_steps: int, seed: int, device: torch.device, batches: list[tuple[torch.Tensor, torch.Tensor]],
              progress: bool, overrides: dict[str, Any]) -> dict[str, Any]:
    result = run_benchmark(
        spec.label, preset, batch_size=batch_size, seq_len=seq_len, precision=spec.precision,
        num_steps=num_steps, warmup_steps=warmup_steps, seed=seed, device=device,
        model_options=spec.model_options, model=model, batches=batches, progress=progress,
        cuda_graph=spec.cuda_graph, **overrides,
    )
    out = result.to_dict()
    for key in ("version", "model_options"):  # the run's own fields say these already
        out.pop(key)
    out["fused_optimizer"] = unwrap(model).fused_optimizer and device.type == "cuda"
    say(f"  {result.step_ms.median:.2f} ms/step (p10 {result.step_ms.p10:.2f}, p90 {result.step_ms.p90:.2f}), "
         f"{result.tokens_per_s:,.0f} tokens/s", progress)
    return out


def _baseline_label(rows: list[dict[str, Any]]) -> str | None:
    timed = [r for r in rows if r["check"] == "passed"]
    for wanted in (lambda r: r["version"] == "v1" and r["precision"] == "fp32", lambda r: r["version"] == "v1",
                   lambda r: True):
        found = next((r for r in timed if wanted(r)), None)
        if found:
            return found["label"]
    return None


def _add_ratios(rows: list[dict[str, Any]], ceilings: dict[str, float]) -> None:
    """Speed-up over the baseline run and MFU against the measured ceiling of each run's precision."""
    base_label = _baseline_label(rows)
    base = next((r for r in rows if r["label"] == base_label), None)
    for row in rows:
        timed = row["check"] == "passed"
        row["speedup"] = base["step_ms_median"] / row["step_ms_median"] if timed and base else None
        ceiling = ceilings.get(row["precision"])
        row["ceiling_tflops"] = ceiling
        row["mfu_measured"] = row["achieved_tflops"] / ceiling if timed and ceiling else None


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------

_EPILOG = """\
run specs:  VERSION[KEY=VALUE,...][:PRECISION]
  v1:fp32                          V1 in fp32
  v4                               V4 as shipped: bf16, and on a GPU each training step replayed from CUDA graphs
  "v2[fuse_qkv=0]:fp32"            V2 without the QKV fusion (quote specs with brackets in a shell)
  "v2[sdpa=1,compile=1]:bf16"      V2 with SDPA and torch.compile
  "v4[cuda_graph=0]"                V4 with every kernel launched from Python (eager launches)
  "v2[cuda_graph=1]:bf16"           V2 with each training step replayed from CUDA graphs (GPU only)
  V2 switches: fuse_qkv, fuse_gate_up, sdpa, compile (0/1), compile_mode=default|reduce-overhead|max-autotune
  every version: cuda_graph (0/1; unset: the version's own setting, V4 replays on a GPU)
  precisions: fp32 (TF32 off), tf32, bf16 and fp16 (autocast, fp32 weights)
run sets (expand to several specs):
""" + "\n".join(f"  {name:9s} {' '.join(specs)}" for name, specs in RUN_SETS.items()) + """

Every run gets V1's weights and is checked against V1 (fp32; and at its own precision) before it
is timed; a run that fails is reported and not timed. Speed-ups are against the first V1 fp32 run.
Exit status: 0 all good, 1 a run failed its check or --baseline found a regression, 2 bad input.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tinyllama.harness.compare", epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compare TinyLLaMA versions in one process on the same weights and batches, correct first.",
    )
    parser.add_argument("--runs", nargs="+", default=["v1:fp32", "v2:fp32", "v4"], metavar="SPEC",
                        help="runs to compare (see below); default: v1:fp32 v2:fp32 v4")
    add_problem_size_arguments(parser)
    add_run_arguments(parser, per=" per run", result="record")
    parser.add_argument("--turns", type=int, default=10, metavar="ROUNDS",
                        help="after timing each run, time them all again in turns where they fit on the device at "
                             "once, ROUNDS rounds of 2 steps each in a rotating order, so that the host's drift falls "
                             "on all alike; those are the step times reported (0: each run's own steps; default 10)")
    parser.add_argument("--no-gemm-count", action="store_true", help="skip the profiler's GEMM count per run")
    parser.add_argument("--profile", nargs="*", default=[], metavar="SPEC",
                        help="record the profiler's top operations of these runs")
    parser.add_argument("--ceiling", action="append", default=[], metavar="PRECISION=TFLOPS",
                        help="a measured matmul ceiling for MFU, e.g. bf16=780 (repeatable)")
    parser.add_argument("--measure-ceiling", action="store_true",
                        help="measure the matmul ceilings of the runs' precisions first (tinyllama.costs.ceilings); "
                             "on a GPU they are measured without it")
    parser.add_argument("--csv", metavar="PATH", help="append the rows to this CSV file")
    parser.add_argument("--plot", metavar="PATH", help="save the speed-up / phase plot (png, pdf, svg)")
    parser.add_argument("--baseline", metavar="OLD.json", help="flag figures that moved beyond their spread since "
                        "the last comparison record in this file")
    return parser


def resolve_ceilings(given: dict[str, float], precisions: Iterable[str], device: torch.device,
                     measure: bool = False) -> dict[str, float]:
    """The matmul ceilings (TFLOP/s per precision) that MFU is measured against: those ``given``, and
    the runs' other precisions measured (``tinyllama.costs.ceilings``) on a GPU, or anywhere if ``measure``."""
    missing = [p for p in dict.fromkeys(precisions) if p not in given]
    if not missing or not (measure or device.type == "cuda"):
        return dict(given)
    from tinyllama.costs.ceilings import measure_matmul_tflops

    return {**{p: measure_matmul_tflops(p, device=device).value for p in missing}, **given}


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    progress = not args.quiet
    try:
        specs = expand_runs(args.runs)
        profile = [parse_run(s).label for s in args.profile]
        ceilings = dict(_parse_ceiling(c) for c in args.ceiling)
        baseline = load_record(args.baseline) if args.baseline else None
        device = dev.get_device(args.device)
        ceilings = resolve_ceilings(ceilings, [s.precision for s in specs], device, args.measure_ceiling)
        result = compare(
            specs, args.preset, batch_size=args.batch_size, seq_len=args.seq_len, num_steps=args.num_steps,
            warmup_steps=args.warmup_steps, seed=args.seed, device=args.device,
            gemm_counts=not args.no_gemm_count, profile_runs=profile, ceilings=ceilings, turns=args.turns,
            progress=progress, **shape_overrides(args),
        )
    except (ValueError, BenchmarkError, dev.DeviceUnavailable) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:
        if not dev.is_out_of_memory(error):
            raise
        print("error: out of memory for V1's reference at this size: try a smaller --batch-size or --seq-len",
              file=sys.stderr)
        return 2
    print(result)
    status = 1 if result.failed else 0
    if baseline is not None:
        regressions = result.regressions(baseline)
        for warning in regressions.attrs["warnings"]:
            print(f"warning: {warning}")
        flagged = regressions[regressions["flag"] != "within spread"]
        with wide_tables():
            print(f"\nagainst the baseline ({baseline['date']}): "
                  + ("every figure within its spread" if flagged.empty else f"\n{flagged.to_string(index=False)}"))
        status = max(status, 1 if flagged["flag"].isin(REGRESSION_FLAGS).any() else 0)
    for label, rows in result.record["profiles"].items():
        import pandas as pd

        with wide_tables():
            print(f"\ntop operations of {label}:\n{pd.DataFrame(rows).to_string(index=False)}")
    try:
        if args.json:
            print(f"appended the record to {result.save_json(args.json)}")
        if args.csv:
            print(f"appended the rows to {result.save_csv(args.csv)}")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.plot:
        result.plot().savefig(args.plot, dpi=120)
        print(f"saved the plot to {args.plot}")
    return status


def _parse_ceiling(text: str) -> tuple[str, float]:
    key, _, value = text.partition("=")
    if key not in PRECISIONS:
        raise ValueError(f"--ceiling {text!r}: write PRECISION=TFLOPS with a precision among {', '.join(PRECISIONS)}")
    try:
        return key, float(value)
    except ValueError:
        raise ValueError(f"--ceiling {text!r}: {value!r} is not a number of TFLOP/s") from None


if __name__ == "__main__":
    sys.exit(main())
