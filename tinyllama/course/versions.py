"""Notebook 17 (V1-V4 side by side): the runs of the comparison, the tables read from its record,
the predictions of notebook 11 turned into one prediction per version, and the checks of the
notebook's exercises (each names the likely mistake).

- :func:`version_runs`: the run specs of ``tinyllama.harness.compare`` for V1-V4 (eager, and replayed from
  CUDA graphs where asked);
- :func:`correctness_table`, :func:`version_table`: one row per check, one row per version;
- :data:`VERSION_REMEDIES`, :func:`notebook_11_predictions`, :func:`version_predictions`: which of
  notebook 11's remedies each version applies, and the combined prediction;
- :func:`check_combined_speedup` (17.1), :func:`check_tolerance_shares` (17.2), :func:`check_worst_run`
  (17.3), :func:`check_flops_per_token` (17.4), :func:`check_mfu_from_tokens` (17.5),
  :func:`check_host_shares` (17.6): the exercises' checks; :func:`check_mfu_plausible`: an MFU is a
  fraction of the ceiling.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Mapping

import pandas as pd
import torch

from tinyllama.config import ModelConfig, get_preset
from tinyllama.costs import flops as model_flops
from tinyllama.course.checkpoints import check_between, checkpoint
from tinyllama.course.feedback import check_function, slip_hint
from tinyllama.course.results import latest
from tinyllama.harness.comparison.parity import TOLERANCES
from tinyllama.harness.comparison.runs import parse_run
from tinyllama.models import model_class

VERSIONS = ("v1", "v2", "v3", "v4")
BASELINE = "v1:fp32"  # the README's headline: every speed-up of `compare` is over V1 in fp32

# The remedies of notebook 11 each version applies (V3: fused projections, Triton RMSNorm, RoPE and
# SwiGLU, Triton flash attention; V4: fused projections, SDPA's flash attention, torch.compile).
VERSION_REMEDIES: dict[str, tuple[str, ...]] = {
    "v2": ("fused_projections",),
    "v3": ("fused_projections", "fused_kernels", "flash_attention"),
    "v4": ("fused_projections", "flash_attention", "compile"),
}
REMEDIES = ("fused_projections", "fused_kernels", "flash_attention", "compile")


def version_runs(precision: str, graphs: bool) -> list[str]:
    """V1 in fp32 (the baseline), then V1-V4 at ``precision`` with eager steps, then (``graphs``) the
    same four with each training step replayed from CUDA graphs (``cuda_graph=1``). With ``graphs`` the
    eager runs say ``cuda_graph=0`` where the version replays by default (V4 as shipped), so that the eager
    row is eager on a GPU too."""
    def eager(version: str) -> str:
        explicit = graphs and model_class(version).graphed_step
        return f"{version}[cuda_graph=0]:{precision}" if explicit else f"{version}:{precision}"

    runs = [BASELINE] + [eager(v) for v in VERSIONS if f"{v}:{precision}" != BASELINE]
    if graphs:
        runs += [f"{v}[cuda_graph=1]:{precision}" for v in VERSIONS]
    return runs


def _row(record: Mapping[str, Any], version: str, precision: str, graphed: bool) -> dict[str, Any] | None:
    for run in record["runs"]:
        spec = parse_run(run["label"])
        replayed = bool(run.get("cuda_graph", spec.cuda_graph))  # what ran: a version's default resolved
        if (spec.version, spec.precision, replayed) == (version, precision, graphed) and not spec.model_options:
            return run
    return None


def correctness_table(record: Mapping[str, Any]) -> pd.DataFrame:
    """One row per run and checked precision: the relative errors of the logits, the loss and the worst
    parameter's gradient against V1 in fp32, with the tolerance of that precision, and the verdict."""
    rows = []
    for run in record["runs"]:
        for suffix, checked in (("", "fp32"), ("_own_precision", run["precision"])):
            if f"check_logits_error{suffix}" not in run or (suffix and checked == "fp32"):
                continue
            tolerance = TOLERANCES[checked]
            rows.append({"run": run["label"], "checked at": checked,
                         "logits error": run[f"check_logits_error{suffix}"],
                         "loss error": run[f"check_loss_error{suffix}"],
                         "gradient error": run[f"check_gradient_error{suffix}"],
                         "logits tolerance": tolerance.logits, "loss tolerance": tolerance.loss,
                         "gradient tolerance": tolerance.gradients, "check": run["check"]})
    return pd.DataFrame(rows).set_index(["run", "checked at"])


def version_table(record: Mapping[str, Any], precision: str) -> pd.DataFrame:
    """One row per version at ``precision``: eager and graph-replayed step times (median, p10, p90),
    tokens/s, peak memory, MFU against the measured ceiling, and speed-ups over V1 at the same
    precision and over V1 in fp32 (eager steps). Missing figures (no graph replay) are NaN."""
    baseline = _row(record, "v1", "fp32", False)
    same = _row(record, "v1", precision, False)
    rows = {}
    for version in VERSIONS:
        eager, graphed = _row(record, version, precision, False), _row(record, version, precision, True)
        row: dict[str, float] = {}
        for kind, run in (("eager", eager), ("graphed", graphed)):
            timed = run is not None and run.get("check") == "passed"
            for key, column in (("step_ms_median", "ms"), ("step_ms_p10", "p10"), ("step_ms_p90", "p90"),
                                ("tokens_per_s", "tokens/s"), ("mfu_measured", "MFU"),
                                ("peak_memory_mib", "peak MiB")):
                value = run.get(key) if timed else None
                row[f"{kind} {column}"] = math.nan if value is None else float(value)
        for name, base in ((f"speed-up over V1 {precision}", same), ("speed-up over V1 fp32", baseline)):
            ok = base is not None and base.get("check") == "passed" and not math.isnan(row["eager ms"])
            row[name] = base["step_ms_median"] / row["eager ms"] if ok else math.nan
        rows[version] = row
    return pd.DataFrame.from_dict(rows, orient="index")


# ------------------------------------------------------------------------------------------------
# Predictions
# ------------------------------------------------------------------------------------------------


def notebook_11_predictions(directory: str | None = None) -> dict[str, float]:
    """The step speed-ups of the four remedies that notebook 11 recorded (empty when it never ran, or
    ran with another results directory)."""
    found = {name: latest(f"predicted_speedup_{name}", notebook="11_finding_bottlenecks", directory=directory)
             for name in REMEDIES}
    return {name: float(value) for name, value in found.items() if value is not None}


def version_predictions(remedy_speedups: Mapping[str, float],
                        combine: Callable[[torch.Tensor], Any]) -> dict[str, float | None]:
    """Each version's predicted speed-up over V1: ``combine`` of the predicted speed-ups of the remedies
    it applies (:data:`VERSION_REMEDIES`); ``None`` where one of them was not predicted, or where the
    remedies together would save the whole step or more (they overlap: no finite prediction)."""
    out: dict[str, float | None] = {}
    for version, remedies in VERSION_REMEDIES.items():
        value = None
        if all(r in remedy_speedups for r in remedies):
            value = float(combine(torch.tensor([float(remedy_speedups[r]) for r in remedies], dtype=torch.float64)))
        out[version] = value if value is not None and math.isfinite(value) and value > 0 else None
    return out


def _combined_reference(speedups: torch.Tensor) -> torch.Tensor:
    saved = (1.0 - 1.0 / speedups).sum()
    return 1.0 / (1.0 - saved)


def _combined_inputs(shape: tuple[int, ...]) -> tuple[torch.Tensor]:
    # Each remedy saves up to 1/(n+1) of the step, so that together they never save all of it.
    saved = torch.rand(shape, dtype=torch.float64) * 0.95 / (shape[0] + 1)
    return (1.0 / (1.0 - saved),)


# The typical mistakes of exercise 17.1, each a way to combine speed-ups, and what to say about it.
COMBINE_SLIPS: tuple[tuple[str, Callable[[torch.Tensor], torch.Tensor], str], ...] = (
    ("product", lambda s: s.prod(),
     "Your answer multiplies the speed-ups: that holds only when each remedy was measured on the step the previous "
     "one left. Here each saves a share of V1's step: 1.25x saves 20%, 2x saves 50%, together 70%, so the step runs "
     "1/0.3 = 3.33x faster, not 2.5x."),
    ("sum", lambda s: s.sum(),
     "Your answer adds the speed-ups: speed-ups do not add, the time each remedy saves does (1.25x saves 20% of V1's "
     "step, 2x saves 50%)."),
    ("gains added", lambda s: 1.0 + (s - 1.0).sum(),
     "Your answer adds the gains (S - 1): a speed-up S saves 1 - 1/S of V1's step, not S - 1 (2x saves half the "
     "step, not all of it). Add those savings and invert the time that is left."),
    ("largest only", lambda s: 1.0 / (1.0 - (1.0 - 1.0 / s).max()),
     "Your answer counts only the remedy that saves most: each remedy saves its own part of the step, so add the "
     "savings of all of them."),
    ("time left", lambda s: 1.0 - (1.0 - 1.0 / s).sum(),
     "Your answer is the new step time as a fraction of V1's (what is left after the savings); the speed-up is its "
     "inverse, V1's step over the new one."),
    ("savings", lambda s: (1.0 - 1.0 / s).sum(),
     "Your answer is the share of V1's step the remedies save together; the speed-up is 1 / (1 - that share)."),
)

# Remedies on which every slip above differs from the answer and from the others.
COMBINE_EXAMPLES: tuple[tuple[float, ...], ...] = ((1.25, 2.0), (1.1, 1.3, 1.2), (1.05,))


def _as_float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):  # a tensor of several elements, None, a string
        return None


def name_combine_slip(combined_speedup: Callable[[torch.Tensor], Any]) -> str | None:
    """The message of the slip of :data:`COMBINE_SLIPS` that ``combined_speedup`` reproduces on every
    remedy set of :data:`COMBINE_EXAMPLES` (where it is wrong), else ``None``."""
    answers = []
    for example in COMBINE_EXAMPLES:
        try:
            answers.append(_as_float(combined_speedup(torch.tensor(example, dtype=torch.float64))))
        except NotImplementedError:
            raise
        except Exception:  # noqa: BLE001 - the participant's code: check_function reports the error itself
            return None
    for _, slip, message in COMBINE_SLIPS:
        expected = [float(slip(torch.tensor(example, dtype=torch.float64))) for example in COMBINE_EXAMPLES]
        if all(a is not None and math.isclose(a, e, rel_tol=1e-6) for a, e in zip(answers, expected)):
            return message
    return None


def check_combined_speedup(combined_speedup: Callable[[torch.Tensor], Any]) -> bool:
    """``combined_speedup(speedups)``: the step speed-up of remedies that touch disjoint parts of the
    step, each measured (or predicted) alone against the same baseline; on random remedies, with the
    typical mistake it reproduces (:data:`COMBINE_SLIPS`, tried on :data:`COMBINE_EXAMPLES`) named."""
    slip = name_combine_slip(combined_speedup)
    return check_function("combined_speedup", combined_speedup, _combined_reference, _combined_inputs,
                          shapes=[(1,), (2,), (3,), (4,)], atol=0.0, rtol=1e-9,
                          hint=slip or "Each speed-up was predicted against the same V1 step: turn each into the time "
                                       "it saves (a fraction of V1's step), add the savings, and turn the new step "
                                       "time back into a speed-up.")


# ------------------------------------------------------------------------------------------------
# FLOPs per token and MFU
# ------------------------------------------------------------------------------------------------

_FLOP_SLIPS = [
    (1 / 3, "a third of the expected value: only the forward pass? The backward does twice the forward's matmul work"),
    (1 / 2, "half the expected value: multiply-adds counted as one FLOP? Each is two"),
    (1 / 6, "a sixth of the expected value: forward only, and multiply-adds instead of FLOPs"),
]


def check_flops_per_token(flops_per_token: Callable[[ModelConfig, int], float]) -> bool:
    """``flops_per_token(config, seq_len)`` against the model FLOPs of a training step per token
    (``tinyllama.costs.flops.training_flops`` / tokens) for every preset, at sequence lengths that are not
    powers of two."""
    problems = []
    for name in ("ci", "tiny", "medium", "large"):
        config = get_preset(name).model
        for seq_len in (12, 500, 1000):
            expected = model_flops.training_flops(config, 1, seq_len) / seq_len
            got = float(flops_per_token(config, seq_len))
            if not math.isclose(got, expected, rel_tol=1e-9):
                hint = slip_hint(got, expected, _FLOP_SLIPS)
                if not hint:
                    attention = 12 * config.num_layers * config.hidden_dim * seq_len
                    hint = ("the attention products are missing (they grow with the sequence length)"
                            if math.isclose(got, expected - attention, rel_tol=1e-9) else
                            "compare your formula term by term with tinyllama/costs/flops.py")
                problems.append(f"preset {name}, seq {seq_len}: {got:.6g}, expected {expected:.6g} ({hint})")
    return checkpoint(not problems, "flops_per_token matches the model FLOPs per token of every preset and sequence length",
                      f"flops_per_token is off in {len(problems)} case(s):\n  - " + "\n  - ".join(problems[:4]))


def _mfu_reference(tokens_per_s: float, flops_per_token: float, ceiling_tflops: float) -> float:
    return tokens_per_s * flops_per_token / (ceiling_tflops * 1e12)


# The typical mistakes of exercise 17.5, each an MFU from (tokens/s, FLOPs per token, ceiling), and what to say.
MFU_SLIPS: tuple[tuple[str, Callable[[float, float, float], float], str], ...] = (
    ("percent", lambda t, f, c: 100 * _mfu_reference(t, f, c),
     "100x the expected value: a percentage where a fraction was asked for"),
    ("tera", lambda t, f, c: t * f / c,
     "1e12 times the expected value: the ceiling is in TFLOP/s; multiply it by 1e12 for FLOP/s"),
    ("giga", lambda t, f, c: t * f / (c * 1e9),
     "1000x the expected value: a TFLOP/s is 1e12 FLOP/s, not 1e9"),
    ("backward again", lambda t, f, c: 3 * _mfu_reference(t, f, c),
     "3x the expected value: flops_per_token already counts the whole training step (forward and backward, "
     "exercise 17.4); do not multiply by 3 again"),
    ("six again", lambda t, f, c: 6 * _mfu_reference(t, f, c),
     "6x the expected value: flops_per_token is already the FLOPs of a training step per token; the 6 of "
     "'6 x parameters' is in it"),
    ("upside down", lambda t, f, c: c * 1e12 / (t * f),
     "upside down: the ceiling over the achieved rate; the MFU is the achieved FLOP/s over the ceiling's"),
)

# Made-up runs (tokens/s, FLOPs per token, ceiling TFLOP/s, a label) that separate every slip from the answer: an
# MFU of about 0.3 and one of 0.01, where a percentage, a factor 3 or 6 and the inverse all differ.
MFU_CASES: tuple[tuple[float, float, float, str], ...] = (
    (150_000.0, 1.5e9, 750.0, "a made-up run: 150,000 tokens/s, 1.5 GFLOP per token, 750 TFLOP/s ceiling"),
    (2_000.0, 2.4e8, 48.0, "a made-up run: 2,000 tokens/s, 0.24 GFLOP per token, 48 TFLOP/s ceiling"),
)


def name_mfu_slip(results: list[tuple[float, float, float, float]]) -> str | None:
    """The message of the slip of :data:`MFU_SLIPS` that the answers reproduce on every case of
    ``results`` ((tokens/s, FLOPs per token, ceiling, the answer) each), else ``None``."""
    for _, slip, message in MFU_SLIPS:
        if all(math.isclose(got, slip(t, f, c), rel_tol=1e-6) for t, f, c, got in results):
            return message
    return None


def check_mfu_from_tokens(mfu_from_tokens: Callable[[float, float, float], float], record: Mapping[str, Any],
                          flops_per_token: float) -> bool:
    """``mfu_from_tokens(tokens_per_s, flops_per_token, ceiling_tflops)`` for every timed run of the
    comparison, against the MFU ``compare`` computed from the step time (the two must agree), and on the
    made-up runs of :data:`MFU_CASES`; a wrong answer that reproduces a typical mistake (:data:`MFU_SLIPS`)
    is named."""
    cases = [(t, f, c, label) for t, f, c, label in MFU_CASES]
    expected = [_mfu_reference(t, f, c) for t, f, c, _ in MFU_CASES]
    checked = 0
    for run in record["runs"]:
        if run.get("check") != "passed" or run.get("mfu_measured") is None:
            continue
        checked += 1
        cases.append((run["tokens_per_s"], flops_per_token, run["ceiling_tflops"], run["label"]))
        expected.append(run["mfu_measured"])
    if not checked:
        return checkpoint(False, "", "no run of the comparison has a measured MFU: was a ceiling passed to compare?")
    problems, results = [], []
    for (tokens, per_token, ceiling, label), want in zip(cases, expected):
        try:
            got = float(mfu_from_tokens(tokens, per_token, ceiling))
        except NotImplementedError:
            raise
        except Exception as error:  # noqa: BLE001 - the participant's code: say where it failed
            problems.append(f"{label}: raised {type(error).__name__}: {error}")
            continue
        results.append((tokens, per_token, ceiling, got))
        if not math.isclose(got, want, rel_tol=1e-6):
            problems.append(f"{label}: {got:.4g}, expected {want:.4g}")
    why = name_mfu_slip(results) if problems and len(results) == len(cases) else None
    return checkpoint(not problems, f"mfu_from_tokens agrees with compare's MFU for all {checked} timed runs "
                                    "(tokens/s x FLOPs per token = the step's FLOPs / step time)",
                      f"mfu_from_tokens is off for {len(problems)} of {len(cases)} runs (made-up ones included): "
                      + (why or "the MFU is the achieved FLOP/s (tokens/s x FLOPs per token) over the ceiling's "
                                "FLOP/s, as a fraction") + "\n  - " + "\n  - ".join(problems))


# ------------------------------------------------------------------------------------------------
# The host's share
# ------------------------------------------------------------------------------------------------


def check_host_shares(host_shares: Callable[[pd.Series, pd.Series], pd.Series]) -> bool:
    """``host_shares(eager_ms, graphed_ms)`` (Series by version) is 1 - graphed / eager element by
    element, on random step times (the feedback names the likely mistake)."""
    generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))  # fresh times each run
    graphed = pd.Series((torch.rand(4, generator=generator, dtype=torch.float64) * 200 + 5).tolist(), index=VERSIONS)
    eager = graphed * pd.Series((1 + torch.rand(4, generator=generator, dtype=torch.float64) * 2).tolist(),
                                index=VERSIONS)
    expected = 1.0 - graphed / eager
    problems = []
    got = host_shares(eager, graphed)
    if not isinstance(got, pd.Series) or list(got.index) != list(VERSIONS):
        problems.append(f"host_shares returned {type(got).__name__}; return a Series indexed by version like its inputs")
    else:
        if not all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(got, expected)):
            first = float(got.iloc[0]), float(expected.iloc[0])
            e, g = float(eager.iloc[0]), float(graphed.iloc[0])
            why = ("a factor of 100: a fraction, not a percentage" if math.isclose(first[0], 100 * first[1], rel_tol=1e-6)
                   else "that is the GPU's share of the eager step; the host's is the rest"
                   if math.isclose(first[0], 1 - first[1], rel_tol=1e-6)
                   else "divide by the eager step (the whole), not the GPU time"
                   if math.isclose(first[0], (e - g) / g, rel_tol=1e-6)
                   else "the host's share is the part of the eager step that the graph-replayed time does not cover")
            problems.append(f"v1: eager {e:.4g} ms, graphed {g:.4g} ms: share {first[0]:.4g}, expected {first[1]:.4g} ({why})")
    return checkpoint(not problems, "host_shares agrees with the rule on random eager/graphed times of four versions",
                      "\n  - ".join(["the host shares are not right:", *problems]))


# ------------------------------------------------------------------------------------------------
# Reading the correctness table
# ------------------------------------------------------------------------------------------------

ERRORS = ("logits", "loss", "gradient")


def _tolerance_reference(table: pd.DataFrame) -> pd.Series:
    return pd.concat([table[f"{e} error"] / table[f"{e} tolerance"] for e in ERRORS], axis=1).max(axis=1)


def example_correctness_table() -> pd.DataFrame:
    """A table where the largest error is not the one closest to its tolerance: an fp32 run near its
    (tight) tolerance beside bf16 runs with larger errors far inside their (loose) ones; in one bf16 row
    the loss is the check nearest its tolerance and the logits have the largest error (so that neither
    the gradient's share alone nor the largest error over the largest tolerance passes for the answer)."""
    rows = [("v2:fp32", "fp32", 9e-5, 2e-6, 3e-4), ("v3:bf16", "fp32", 1e-6, 1e-7, 2e-6),
            ("v3:bf16", "bf16", 8e-3, 1e-3, 2e-2), ("v4:bf16", "bf16", 2e-2, 4e-3, 9e-2),
            ("v1:bf16", "bf16", 3e-2, 1.5e-2, 2e-2)]
    frame = pd.DataFrame([{"run": r, "checked at": p, "logits error": a, "loss error": b, "gradient error": c,
                           "logits tolerance": TOLERANCES[p].logits, "loss tolerance": TOLERANCES[p].loss,
                           "gradient tolerance": TOLERANCES[p].gradients, "check": "passed"}
                          for r, p, a, b, c in rows])
    return frame.set_index(["run", "checked at"])


def _errors(table: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([table[f"{e} error"] for e in ERRORS], axis=1)


def _tolerances(table: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([table[f"{e} tolerance"] for e in ERRORS], axis=1)


def _shares(table: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([table[f"{e} error"] / table[f"{e} tolerance"] for e in ERRORS], axis=1)


# The typical mistakes of exercise 17.2, each a Series per row computed from the table, and what to say.
SHARE_SLIPS: tuple[tuple[str, Callable[[pd.DataFrame], pd.Series], str], ...] = (
    ("largest error", lambda t: _errors(t).max(axis=1),
     "these are the largest errors themselves: divide each by its own tolerance first"),
    ("largest over largest", lambda t: _errors(t).max(axis=1) / _tolerances(t).max(axis=1),
     "that is the largest error over the largest tolerance: divide each error by its own tolerance (the loss's by "
     "the loss tolerance), then take the largest of the three shares"),
    ("mean", lambda t: _shares(t).mean(axis=1),
     "that is the mean of the three shares: a row is as close to failing as its worst check, so take the largest"),
    ("sum", lambda t: _shares(t).sum(axis=1),
     "that is the sum of the three shares: a row is as close to failing as its worst check, so take the largest"),
    ("upside down", lambda t: (_tolerances(t).to_numpy() / _errors(t).to_numpy()).max(axis=1),
     "upside down: tolerance / error; the share is error / tolerance (1.0 = exactly at the tolerance)"),
    ("gradient only", lambda t: t["gradient error"] / t["gradient tolerance"],
     "only the gradient's share: take the largest of the logits', the loss's and the gradient's shares"),
    ("percent", lambda t: 100 * _shares(t).max(axis=1),
     "a percentage: give the share as a fraction (1.0 = exactly at the tolerance)"),
)


def name_share_slip(got: pd.Series, table: pd.DataFrame) -> str | None:
    """The message of the slip of :data:`SHARE_SLIPS` whose values ``got`` (one per row of ``table``)
    equals, else ``None``."""
    for _, slip, message in SHARE_SLIPS:
        expected = [float(x) for x in slip(table)]
        if all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15) for a, b in zip(got, expected)):
            return message
    return None


def check_tolerance_shares(share_of_tolerance: Callable[[pd.DataFrame], pd.Series], table: pd.DataFrame) -> bool:
    """``share_of_tolerance(table)``: for each row, the largest of error / tolerance over logits, loss
    and gradients; on the measured table and on :func:`example_correctness_table`, whose rows separate
    the right answer from each typical mistake (:data:`SHARE_SLIPS`), which the feedback names."""
    problems = []
    for name, frame in (("your comparison's table", table), ("the example table", example_correctness_table())):
        expected = _tolerance_reference(frame)
        try:
            got = share_of_tolerance(frame)
        except NotImplementedError:
            raise
        except Exception as error:  # noqa: BLE001 - the participant's code: say where it failed
            problems.append(f"{name}: raised {type(error).__name__}: {error}")
            continue
        if not isinstance(got, pd.Series) or len(got) != len(expected):
            size = f" of length {len(got)}" if hasattr(got, "__len__") else ""
            problems.append(f"{name}: returned {type(got).__name__}{size} for {len(expected)} rows; return a Series "
                            "with one number per row (the largest over the three columns of shares: axis=1)")
            continue
        got = pd.Series(list(got), index=expected.index, dtype=float)
        if not all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15) for a, b in zip(got, expected)):
            why = name_share_slip(got, frame) or ("take each error over its own tolerance (logits, loss, gradient), "
                                                  "then the largest of the three")
            worst = (got - expected).abs().idxmax()
            problems.append(f"{name}, row {worst}: {got[worst]:.4g}, expected {expected[worst]:.4g} ({why})")
    return checkpoint(not problems, "share_of_tolerance gives each row's largest error as a share of its tolerance",
                      "\n  - ".join(["share_of_tolerance is off:", *problems]))


def check_worst_run(worst_run: str, within: bool, table: pd.DataFrame) -> bool:
    """The run named as the one closest to its tolerance, and whether every run is within it."""
    shares = _tolerance_reference(table)
    expected_run, expected_within = shares.idxmax()[0], bool((shares <= 1.0).all())
    ok = worst_run == expected_run and bool(within) == expected_within
    return checkpoint(ok, f"{worst_run} uses the largest share of its tolerance ({shares.max():.3g}); "
                          f"{'every run is' if expected_within else 'not every run is'} within its tolerance",
                      f"worst_run = {worst_run!r}, within = {within!r}; expected {expected_run!r} (largest share of its "
                      f"tolerance, {shares.max():.3g}) and {expected_within} (every share <= 1?)")


def check_mfu_plausible(name: str, mfu: float) -> bool:
    """A measured MFU is a fraction between 0 and 1 (above 1 the timing or the ceiling is wrong)."""
    return check_between(name, float(mfu), 1e-6, 1.0,
                         why="A fraction of the measured matmul ceiling: above 1 the step would beat the device's own "
                             "best matrix multiply, so the timing or the FLOP count is wrong.")
