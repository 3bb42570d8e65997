"""Checks of notebook 18's exercises (the roofline), with feedback that names the likely mistake:

- :func:`check_gemm_and_add` (18.1), :func:`check_norm_and_attention` (18.2): the intensities of four
  kernels at the model's shapes against the library's formulas (:func:`tinyllama.costs.intensity.model_kernels`),
  with the slip each typical factor points at (a multiply-add as one FLOP, elements for bytes, the output
  forgotten, the full square for the causal triangle, k and v with every query head);
- :func:`check_roof_position` (18.3): a function for the attainable rate and the bound of a kernel of
  a given intensity, against the library's rule (:func:`tinyllama.profiling.roofline.classify`) on
  intensities either side of this device's fp32 ridge and of made-up roofs (:data:`MADE_UP_ROOFS`), and
  compared with each typical mistake (:data:`ROOF_SLIPS`) on the same cases;
- :func:`check_idle_shares` (18.4): each version's idle time (step time minus device-busy time, never
  below zero) and its percent of the step, with the typical mistakes (:data:`IDLE_MS_SLIPS`,
  :data:`IDLE_PCT_SLIPS`) named where the measured times tell them apart.

The reference answers live in the solution notebook (``course.reveal("18.3")``); what the check cells
show the participant is the call, not the formula.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pandas as pd

from tinyllama.config import ModelConfig
from tinyllama.costs import intensity
from tinyllama.course.checkpoints import check_between, checkpoint
from tinyllama.course.feedback import slip_hint
from tinyllama.profiling import roofline

# ---- exercises 18.1 and 18.2: the intensities of four kernels -------------------------------------------------


def reference_intensities(config: ModelConfig, batch_size: int, seq_len: int, itemsize: int) -> pd.DataFrame:
    """The library's FLOPs, bytes and intensity of the four kernels, one row each, indexed by kernel."""
    return intensity.model_kernels(config, batch_size, seq_len, itemsize).set_index("kernel")


def check_gemm_and_add(gemm_intensity: float, add_intensity: float, config: ModelConfig, batch_size: int,
                       seq_len: int, itemsize: int) -> bool:
    """Exercise 18.1: the gate projection's and the residual add's intensities within 1% of the library's,
    with the slip a typical factor points at (half: a multiply-add as one FLOP; ``itemsize``: elements,
    not bytes; 1.5 for the add: its output forgotten)."""
    reference = reference_intensities(config, batch_size, seq_len, itemsize)
    tokens, h, inter = batch_size * seq_len, config.hidden_dim, config.intermediate_dim
    gemm_ref, add_ref = reference.loc["GEMM", "intensity"], reference.loc["element-wise", "intensity"]
    gemm_ok = check_between("GEMM intensity", gemm_intensity, 0.99 * gemm_ref, 1.01 * gemm_ref, unit="FLOP/byte",
                            hint=slip_hint(gemm_intensity, gemm_ref,
                                           [(0.5, "Half the reference: a multiply-add is two FLOPs."),
                                            (itemsize, "Elements counted, not bytes: multiply by itemsize."),
                                            ((tokens * h + h * inter + tokens * inter) / (tokens * h + h * inter),
                                             "The output (tokens x intermediate) is written too: count its bytes.")]),
                            why=f"2 x {tokens} x {h} x {inter} FLOPs over {itemsize} x ({tokens} x {h} + {h} x {inter} + "
                                f"{tokens} x {inter}) bytes: the GEMM's inputs read once, its output written once.")
    add_ok = check_between("residual add intensity", add_intensity, 0.99 * add_ref, 1.01 * add_ref, unit="FLOP/byte",
                           hint=slip_hint(add_intensity, add_ref,
                                          [(1.5, "Only the two inputs counted: the output is written too.")]),
                           why=f"one FLOP per element over {itemsize} bytes x 3 (two reads, one write) = {add_ref:.3g}.")
    return gemm_ok and add_ok


def check_norm_and_attention(norm_intensity: float, attn_intensity: float, config: ModelConfig, batch_size: int,
                             seq_len: int, itemsize: int) -> bool:
    """Exercise 18.2: RMSNorm's and the fused causal attention's intensities against the library's (the
    attention's counted over the lower triangle with its diagonal; without the diagonal, right to
    1/seq, is accepted), with the slip a typical factor points at."""
    reference = reference_intensities(config, batch_size, seq_len, itemsize)
    tokens, h = batch_size * seq_len, config.hidden_dim
    heads, kv_heads = config.num_heads, config.num_kv_heads
    norm_ref, attn_ref = reference.loc["RMSNorm", "intensity"], reference.loc["attention", "intensity"]
    unwritten = (2 * tokens * h + h) / (tokens * h + h)  # y's bytes left out
    norm_slips = [(unwritten, "y is written too: count its bytes beside x's and the weight's."),
                  (itemsize, "Elements counted, not bytes: multiply by itemsize.")]
    if abs(unwritten / itemsize - 1) <= 0.1:  # 2-byte elements: the two slips give the same factor
        norm_slips = [(itemsize, "About twice the reference: y is written too (count its bytes), or elements were "
                                 "counted, not bytes (multiply by itemsize).")]
    norm_ok = check_between("RMSNorm intensity", norm_intensity, 0.99 * norm_ref, 1.01 * norm_ref, unit="FLOP/byte",
                            hint=slip_hint(norm_intensity, norm_ref, norm_slips),
                            why=f"4 FLOPs per element over {itemsize} x (2 x {tokens} x {h} + {h}) bytes (x and y, the "
                                "weight once).")
    # seq² / 2 (the diagonal left out of the triangle's count) is right to 1/seq: accepted.
    attn_ok = check_between("attention intensity", attn_intensity, 0.99 * attn_ref * seq_len / (seq_len + 1),
                            1.01 * attn_ref, unit="FLOP/byte",
                            hint=slip_hint(attn_intensity, attn_ref,
                                           [(2 * seq_len / (seq_len + 1), "The full seq x seq square: a causal kernel "
                                                                          "computes only the lower triangle with its "
                                                                          "diagonal, seq (seq + 1) / 2 pairs."),
                                            (0.5, "Half the reference: two products, and two FLOPs per multiply-add."),
                                            ((2 * heads + 2 * kv_heads) / (4 * heads),
                                             "k and v have num_kv_heads heads, not num_heads (grouped-query attention "
                                             "reads fewer bytes)."),
                                            (0.25, "A quarter: two products of two FLOPs per multiply-add.")]),
                            why=f"4 x batch x heads x seq (seq + 1) / 2 x head_dim FLOPs (the causal triangle) over q, k, "
                                f"v, output bytes: it grows with the sequence ({seq_len}), which is why fused attention "
                                "can be compute-bound.")
    return norm_ok and attn_ok


# ---- exercise 18.3: the roof a kernel sits under -------------------------------------------------------------

# Factors of the ridge at which the cases sit: far below, near and far above it (at the ridge both answers count).
RIDGE_FACTORS = (1e-3, 0.3, 0.99, 1.01, 3.0, 1e3)

# Roofs that separate the slips where a device's own could not: a ridge below 1 FLOP/byte (the ridge upside down
# lands on the other side of 1) and one of 200 FLOP/byte (a GPU's bf16 matrix units).
MADE_UP_ROOFS = (roofline.Roofs("made-up roofs (0.5 TFLOP/s, 2 TB/s)", {"fp32": 0.5}, 2.0),
                 roofline.Roofs("made-up roofs (300 TFLOP/s, 1.5 TB/s)", {"fp32": 300.0}, 1.5))

Position = Callable[[float, float, float], Any]


def _reference_positions(intensities: list[float], roofs: roofline.Roofs) -> list[tuple[float, str]]:
    """The library's rule (:func:`~tinyllama.profiling.roofline.classify`) at ``intensities`` under ``roofs``' fp32 roof."""
    cases = pd.DataFrame({"intensity": intensities})
    fp32 = roofline.Roofs(roofs.device, {"fp32": roofs.compute("fp32")}, roofs.bandwidth_tbs)
    expected = roofline.classify(cases.assign(flops=cases["intensity"] * 1e9, bytes=1e9, time_ms=1.0,
                                              precision="fp32", flop_source="flop_counter"), fp32)
    return list(zip(expected["attainable_tflops"].astype(float), expected["bound"]))


def _bound(memory: bool) -> str:
    return "memory" if memory else "compute"


# The typical mistakes of exercise 18.3: (name, roof_position with the mistake, what to say).
ROOF_SLIPS: tuple[tuple[str, Position, str], ...] = (
    ("higher roof", lambda i, c, b: (max(i * b, c), _bound(i < c / b)),
     "your attainable rate is the higher of the two roofs; a kernel is held back by the lower one: min(intensity x "
     "bandwidth, compute roof)"),
    ("memory roof only", lambda i, c, b: (i * b, _bound(i < c / b)),
     "your attainable rate is the memory roof everywhere, so it climbs past the compute roof right of the ridge: "
     "take the lower of the two roofs"),
    ("compute roof only", lambda i, c, b: (c, _bound(i < c / b)),
     "your attainable rate is the compute roof everywhere: left of the ridge the memory roof, intensity x bandwidth, "
     "is lower (mind the units too: FLOP/byte x TB/s is already TFLOP/s, no 1e12)"),
    ("memory roof divided", lambda i, c, b: (min(i / b, c), _bound(i < c / b)),
     "your memory roof divides the intensity by the bandwidth: it is intensity x bandwidth (FLOP/byte x TB/s = "
     "TFLOP/s)"),
    ("sides swapped", lambda i, c, b: (min(i * b, c), _bound(i >= c / b)),
     "memory and compute are swapped: a kernel left of the ridge (few FLOPs per byte) is memory-bound, one right "
     "of it compute-bound"),
    ("ridge upside down", lambda i, c, b: (min(i * b, c), _bound(i < b / c)),
     "the ridge is upside down: it is compute roof / bandwidth (TFLOP/s over TB/s = FLOP/byte), not bandwidth / "
     "compute roof"),
)


def _as_position(answer: Any) -> tuple[float, str] | None:
    try:
        rate, bound = answer
        return float(rate), str(bound)
    except (TypeError, ValueError):
        return None


def _same_position(answer: tuple[float, str] | None, expected: tuple[float, str]) -> bool:
    return answer is not None and answer[1] == expected[1] and math.isclose(answer[0], expected[0], rel_tol=1e-9)


def check_roof_position(roof_position: Position, roofs: roofline.Roofs) -> bool:
    """``roof_position(intensity, compute_tflops, bandwidth_tbs)`` returns ``(attainable_tflops, bound)``
    as the library's rule does, at intensities either side of ``roofs``' fp32 ridge (:data:`RIDGE_FACTORS`)
    and of :data:`MADE_UP_ROOFS`; a wrong answer that reproduces a slip of :data:`ROOF_SLIPS` on every
    case is named. The verdict speaks of this device's roofs (the made-up ones only separate the slips)."""
    cases: list[tuple[float, float, float]] = []
    expected: list[tuple[float, str]] = []
    for case_roofs in (roofs, *MADE_UP_ROOFS):
        ridge = case_roofs.ridge("fp32")
        intensities = [ridge * factor for factor in RIDGE_FACTORS]
        cases += [(i, case_roofs.compute("fp32"), case_roofs.bandwidth_tbs) for i in intensities]
        expected += _reference_positions(intensities, case_roofs)
    wrong, answers = [], []
    for case, want in zip(cases, expected):
        try:
            raw = roof_position(*case)
        except NotImplementedError:
            raise
        except Exception as error:  # noqa: BLE001 - the participant's code: say where it failed
            answers.append(None)
            wrong.append(f"intensity {case[0]:.3g} (roofs {case[1]:.3g} TFLOP/s, {case[2]:.3g} TB/s): raised "
                         f"{type(error).__name__}: {error}")
            continue
        got = _as_position(raw)
        answers.append(got)
        if got is None:
            wrong.append(f"intensity {case[0]:.3g}: returned {raw!r}; return a pair (attainable TFLOP/s, "
                         "'memory' or 'compute')")
        elif not _same_position(got, want):
            wrong.append(f"intensity {case[0]:.3g} (roofs {case[1]:.3g} TFLOP/s, {case[2]:.3g} TB/s): yours "
                         f"{got[0]:.3g} TFLOP/s {got[1]}, expected {want[0]:.3g} TFLOP/s {want[1]}")
    slip = next((message for _, position, message in ROOF_SLIPS
                 if all(_same_position(a, position(*case)) for a, case in zip(answers, cases))), None) if wrong else None
    advice = slip or ("Is the attainable rate the lower of the two roofs, and is the ridge compute roof / bandwidth "
                      "(memory-bound below it)?")
    return checkpoint(not wrong, f"roof_position agrees with the library's rule at {len(RIDGE_FACTORS)} intensities "
                                 f"around the fp32 ridge ({roofs.ridge('fp32'):.3g} FLOP/byte)",
                      f"roof_position differs from the library at {len(wrong)} of {len(cases)} intensities: {advice}"
                      "\n  - " + "\n  - ".join(wrong[:4]))


# ---- exercise 18.4: the time the device waits -----------------------------------------------------------------

Rule = Callable[[float, float], float]  # (median step ms, busy ms) -> a figure


def idle_ms_reference(step_ms: float, busy_ms: float) -> float:
    """The reference of exercise 18.4's idle time: the step's time the device is not busy, never below zero."""
    return max(step_ms - busy_ms, 0.0)


def idle_pct_reference(step_ms: float, busy_ms: float) -> float:
    """The idle time as a percent of the step."""
    return 100 * idle_ms_reference(step_ms, busy_ms) / step_ms


NOT_BELOW_ZERO = ("the device's busy time exceeds the step's median here (a rounding, or the steps outside the "
                  "median), and yours goes below zero: the idle time is never negative, so take 0 there")

# The typical mistakes of exercise 18.4, each a rule from (median step ms, busy ms), and what to say.
IDLE_MS_SLIPS: tuple[tuple[str, Rule, str], ...] = (
    ("busy time", lambda step, busy: busy, "that is the device's busy time; the idle time is the rest of the step"),
    ("seconds", lambda step, busy: idle_ms_reference(step, busy) / 1e3, "in seconds: keep it in milliseconds"),
    ("not clamped", lambda step, busy: step - busy, NOT_BELOW_ZERO),
)
IDLE_PCT_SLIPS: tuple[tuple[str, Rule, str], ...] = (
    ("busy share", lambda step, busy: 100 * busy / step, "That is the busy share: the idle one is the rest."),
    ("fraction", lambda step, busy: idle_pct_reference(step, busy) / 100,
     "A fraction, not a percent: multiply by 100."),
    ("over the busy time", lambda step, busy: 100 * idle_ms_reference(step, busy) / busy,
     "Divided by the busy time: a share of the step is over the step's time."),
    ("milliseconds", lambda step, busy: idle_ms_reference(step, busy),
     "That is the idle time in milliseconds, not its percent of the step."),
    ("not clamped", lambda step, busy: 100 * (step - busy) / step, NOT_BELOW_ZERO),
)


def name_idle_slip(value: float, step: float, busy: float, slips: Iterable[tuple[str, Rule, str]],
                   rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> str:
    """The message of the first slip whose figure ``value`` equals (and the right answer does not), else ''."""
    for _, rule, message in slips:
        figure = rule(step, busy)
        if math.isclose(value, figure, rel_tol=rel_tol, abs_tol=abs_tol):
            return message
    return ""


def check_idle_shares(labels: Iterable[str], idle_ms: Mapping[str, float], idle_pct: Mapping[str, float],
                      step_ms: Mapping[str, Any], device_ms: Mapping[str, float]) -> bool:
    """For each version of ``labels``: ``idle_ms[label]`` is the median step time (``step_ms[label].median``)
    minus the device's busy time ``device_ms[label]``, never below zero (checked silently, named when
    wrong), and ``idle_pct[label]`` that time as a percent of the step, within half a percentage point
    (one ``PASS`` line per version). Typical mistakes are named where the measured times tell them apart."""
    ok = True
    for label in labels:
        step, busy = float(step_ms[label].median), float(device_ms[label])
        want_ms, want_pct = idle_ms_reference(step, busy), idle_pct_reference(step, busy)
        got_ms = idle_ms.get(label)
        if got_ms is None or not math.isclose(float(got_ms), want_ms, rel_tol=1e-6, abs_tol=1e-9):
            slip = "" if got_ms is None else name_idle_slip(float(got_ms), step, busy, IDLE_MS_SLIPS)
            ok &= checkpoint(False, "", f"{label}: idle_ms = {got_ms!r}, expected {want_ms:.4g} ms. "
                                        + (slip or "The idle time is the step's median time minus the device's busy "
                                                   "time per step (never below zero)."))
            continue
        got_pct = float(idle_pct[label])
        hint = "" if abs(got_pct - want_pct) <= 0.5 else name_idle_slip(got_pct, step, busy, IDLE_PCT_SLIPS)
        ok &= check_between(f"{label}: idle share of the step", got_pct, want_pct - 0.5, want_pct + 0.5, unit="%",
                            hint=hint, why=f"(step {step:.4g} ms - busy {busy:.4g} ms) / step.")
    return ok


__all__ = ["check_gemm_and_add", "check_norm_and_attention", "reference_intensities", "IDLE_MS_SLIPS", "IDLE_PCT_SLIPS", "MADE_UP_ROOFS", "RIDGE_FACTORS", "ROOF_SLIPS", "check_idle_shares",
           "check_roof_position", "idle_ms_reference", "idle_pct_reference", "name_idle_slip"]
