"""The checks of notebook 02 (precision), with feedback that names the likely mistake.

- :func:`measured_rounding_error`: the largest relative error of rounding many random fp32 (or fp64)
  values to a format, measured by rounding them (fp16, bf16 and fp32 by PyTorch's casts, TF32 by
  :func:`inference.precision.round_to_mantissa`);
- :func:`check_unit_roundoff`: a formula for the largest relative rounding error from the mantissa
  bits, against those measurements;
- :func:`check_error_ratio`: a predicted ratio of two formats' errors on a network, against the measured one;
- :func:`check_batch_prediction`: a predicted largest 16-bit batch, against the memory-budgeted search;
- :func:`autocast_against_half`: autocast and ``.half()`` side by side (speed, memory, accuracy), with
  sentences printed from the two runs' spreads.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd
import torch

from inference.benchmark import BenchmarkResult
from inference.precision import MANTISSA_BITS, AccuracyReport, ran_as, round_to_mantissa
from tinyllama.course.checkpoints import checkpoint
from tinyllama.timing import verdict

# Peak memories within this share of each other are the same (the allocator rounds its blocks).
SAME_MEMORY = 0.01


def measured_rounding_error(fmt: str, samples: int = 1 << 20, seed: int = 0) -> float:
    """The largest ``|round(x) - x| / |x|`` over ``samples`` random values spread over six decades
    (all normal numbers in every format here), for ``fmt`` in :data:`MANTISSA_BITS`."""
    if fmt not in MANTISSA_BITS:
        raise ValueError(f"unknown format {fmt!r}: use one of {sorted(MANTISSA_BITS)}")
    generator = torch.Generator().manual_seed(seed)
    exponent = torch.rand(samples, generator=generator, dtype=torch.float64) * 6 - 3  # 1e-3 .. 1e3
    x = 10.0 ** exponent
    if fmt == "fp32":  # fp32's own rounding, measured from fp64
        return float(((x.float().double() - x).abs() / x).max())
    x = x.float()  # the other formats round fp32 values, as a cast in a network does
    rounded = {"fp16": lambda: x.half().float(), "bf16": lambda: x.bfloat16().float(),
               "tf32": lambda: round_to_mantissa(x, MANTISSA_BITS["tf32"])}[fmt]()
    return float(((rounded.double() - x.double()).abs() / x.double()).max())


# Typical wrong unit roundoffs, each as a function of the mantissa bits m, with what it says went wrong.
# The reference is 2^-(m+1): numbers between 1 and 2 are 2^-m apart, rounding moves a value by half that.
ROUNDOFF_SLIPS: tuple[tuple[str, Callable[[int], float], str], ...] = (
    ("machine epsilon", lambda m: 2.0 ** -m,
     ("Your bound is twice the measured error: 2^-m is the spacing of the numbers between 1 and 2 (machine "
     "epsilon, torch.finfo(dtype).eps). Rounding to the nearest is off by at most half of that spacing.")),
    ("halved twice", lambda m: 2.0 ** -(m + 2),
     ("Your bound is half the measured error: you halved the spacing twice. Counting the implicit leading 1 "
     "does not shrink the spacing: between 1 and 2 the numbers are still 2^-m apart, so rounding is off by "
     "at most 2^-m / 2.")),
    ("decimal digits", lambda m: 10.0 ** -m,
     ("Your bound is a power of ten: mantissa bits are binary digits, so the spacing between 1 and 2 is 2^-m, "
     "not 10^-m.")),
    ("half a decimal digit", lambda m: 0.5 * 10.0 ** -m,
     ("Your bound is half a power of ten: mantissa bits are binary digits, so the spacing between 1 and 2 is "
     "2^-m, not 10^-m.")),
    ("precedence", lambda m: 2.0 ** -m + 1,
     ("Your bound is just above 1: `2 ** -m + 1` raises first and adds 1 afterwards. Put the whole exponent in "
     "parentheses: 2 ** -(m + 1).")),
    ("exponent m - 1", lambda m: 2.0 ** -(m - 1),
     ("Your bound is 4x the measured error: the exponent is m - 1 instead of m + 1 (a spacing of 2^-m, halved, "
     "is 2^-(m+1)).")),
    ("positive exponent", lambda m: 2.0 ** (m + 1),
     ("Your bound is larger than 1: the exponent lost its minus sign. A relative error of a rounding is a "
     "small number, 2 to a negative power.")),
)


def roundoff_slip(claimed: dict[int, float]) -> str | None:
    """The typical mistake of :data:`ROUNDOFF_SLIPS` that gives ``claimed`` (mantissa bits -> bound) for
    every format, else ``None``."""
    for _, slip, text in ROUNDOFF_SLIPS:
        if all(math.isfinite(value) and math.isclose(value, slip(bits), rel_tol=1e-6) for bits, value in claimed.items()):
            return text
    return None


def check_unit_roundoff(unit_roundoff: Callable[[int], float]) -> bool:
    """``unit_roundoff(mantissa_bits)`` must bound the measured rounding error of fp32, TF32, fp16
    and bf16 from above, and by no more than 10%: the bound rounding to nearest guarantees. A wrong
    bound is compared with :data:`ROUNDOFF_SLIPS` and the mistake it matches is named."""
    rows, ok, advice, claimed_by_bits = [], True, "", {}
    for fmt, bits in MANTISSA_BITS.items():
        measured = measured_rounding_error(fmt)
        try:
            claimed = float(unit_roundoff(bits))
        except NotImplementedError:  # an exercise not written yet: its own message says what to do
            raise
        except Exception as error:  # noqa: BLE001 - shown to the participant as feedback
            return checkpoint(False, "", f"unit_roundoff({bits}) raised {type(error).__name__}: {error}; it takes the "
                                         "number of mantissa bits (an int) and returns a number")
        claimed_by_bits[bits] = claimed
        fits = measured <= claimed <= 1.1 * measured
        ok &= fits
        ratio = claimed / measured if measured else math.inf
        rows.append(f"  {fmt:5s} ({bits:2d} mantissa bits): your bound {claimed:.3g}, largest measured error "
                    f"{measured:.3g} ({ratio:.3g}x){'' if fits else '  <-- off'}")
        if not fits and not advice:
            if ratio < 1:
                advice = ("Your bound is below errors that were measured: count the implicit leading 1 and the "
                          "half spacing again.")
            else:
                advice = ("Work in powers of two: with m mantissa bits the numbers between 1 and 2 are 2^-m apart, "
                          "and rounding to the nearest moves a value by at most half of that, relative to the value.")
    if not ok:
        advice = roundoff_slip(claimed_by_bits) or advice
    print("\n".join(rows))
    return checkpoint(ok, "your unit roundoff bounds every format's measured rounding error, within 10%: "
                          "the relative error of storing a number halves with each extra mantissa bit",
                      f"your unit roundoff does not match the measured rounding errors. {advice}")


def check_error_ratio(predicted: float | None, fp16_error: float, bf16_error: float, factor: float = 2.5) -> bool:
    """The predicted bf16 / fp16 error ratio on a network within ``factor`` of the measured one. One
    random batch scatters the ratio around the rounding ratio, hence the loose band."""
    measured = bf16_error / fp16_error if fp16_error > 0 else math.inf
    if predicted is None:
        return checkpoint(False, "", f"no prediction written (predicted_error_ratio is None); measured {measured:.3g}. "
                                     "Write your prediction in the cell above and run both cells again.")
    ok = math.isfinite(predicted) and predicted > 0 and measured / factor <= predicted <= measured * factor
    return checkpoint(ok, f"predicted bf16/fp16 error ratio {predicted:.3g}, measured {measured:.3g}: within a "
                          f"factor {factor:g}, so the network's error follows the formats' rounding",
                      f"predicted bf16/fp16 error ratio {predicted:.3g}, measured {measured:.3g} (more than a factor "
                      f"{factor:g} apart). Errors scale with the unit roundoff: compare the two formats' mantissa "
                      "bits, not their total bits or their ranges.")


def check_batch_prediction(predicted: float | None, measured: int | None, fp32_largest: int | None,
                           low: float = 0.75, high: float = 1.33) -> bool:
    """The predicted largest 16-bit batch within ``[low, high]`` times the one the search found."""
    if predicted is None or measured is None:
        return checkpoint(False, "", "no prediction written (predicted_half_batch is None)" if predicted is None
                          else "the 16-bit search found no batch that fits: look at its probes above")
    ratio = predicted / measured if measured else math.inf
    ok = math.isfinite(ratio) and low <= ratio <= high
    hint = ""
    if not ok and math.isclose(predicted, fp32_largest, rel_tol=0.05):
        hint = " You predicted fp32's largest batch: a 16-bit activation takes half the bytes."
    elif not ok:
        hint = (" Split the budget into what does not grow with the batch (the weights, in the format's bytes) "
                "and what does (the activations: per sample, from fp32's largest batch, at half the bytes).")
    return checkpoint(ok, f"predicted largest 16-bit batch {predicted:.0f}, found {measured} ({ratio:.2f}x): "
                          "memory = weights + batch x activations per sample holds",
                      f"predicted largest 16-bit batch {predicted:.0f}, found {measured} ({ratio:.2f}x, outside "
                      f"{low:g}..{high:g}).{hint}")


def autocast_against_half(half: BenchmarkResult, amp: BenchmarkResult, half_report: AccuracyReport,
                          amp_report: AccuracyReport) -> tuple[pd.DataFrame, list[str]]:
    """``.half()`` (``half``: the network and its input stored in 16 bits) against autocast (``amp``:
    fp32 weights and input, 16-bit operations), timed in one process, with their accuracy against true
    fp32 on the same weights and inputs (``*_report``). Returns the side-by-side table and sentences:
    the speed verdict from the two runs' p10-p90 bands (faster, slower or within noise), the memory,
    the accuracy."""
    if half.batch_size != amp.batch_size or half.device != amp.device:
        raise ValueError("compare runs of the same batch on the same device")
    rows = {}
    for label, run, report in ((f".half() ({half.precision})", half, half_report), ("autocast (amp)", amp, amp_report)):
        rows[label] = {"computes in": ran_as(run.precision, run.environment), "ms/batch": run.ms_per_batch,
                       "p10 ms": run.timing.p10, "p90 ms": run.timing.p90, "samples/s": run.throughput,
                       "peak MiB": run.peak_memory_mib, "max rel diff vs true fp32": report.max_rel_diff}
    table = pd.DataFrame(rows).T
    ratio, speed = verdict(half.timing, amp.timing)  # half's median / amp's: above 1, autocast is faster
    band = (f"(.half() {half.timing.p10:.3g}-{half.timing.p90:.3g} ms, autocast {amp.timing.p10:.3g}-"
            f"{amp.timing.p90:.3g} ms per batch, p10-p90)")
    if speed == "within noise":
        sentences = [f"Speed: autocast and .half() are within noise of each other {band}: their p10-p90 bands overlap."]
    else:
        factor = ratio if speed == "faster" else 1 / ratio
        sentences = [f"Speed: autocast is {factor:.2f}x {speed} than .half() {band}: the bands do not overlap."]
    if half.peak_memory_mib is not None and amp.peak_memory_mib is not None:
        extra = amp.peak_memory_mib / half.peak_memory_mib - 1
        if abs(extra) <= SAME_MEMORY:
            sentences.append(f"Memory: both peak at about {half.peak_memory_mib:,.0f} MiB.")
        else:
            sentences.append(f"Memory: autocast peaks at {amp.peak_memory_mib:,.0f} MiB, .half() at "
                             f"{half.peak_memory_mib:,.0f} MiB: autocast holds {abs(extra):.0%} "
                             + ("more (it keeps the fp32 weights and input, and casts 16-bit copies of the weights "
                                "on every forward)." if extra > 0 else "less."))
    else:
        sentences.append("Memory: not tracked on this device (PyTorch keeps no memory statistics on a CPU).")
    closer = "autocast" if amp_report.max_rel_diff < half_report.max_rel_diff else ".half()"
    sentences.append(f"Accuracy against true fp32: .half() {half_report.max_rel_diff:.3g}, autocast "
                     f"{amp_report.max_rel_diff:.3g} (largest difference relative to the largest output); "
                     + ("both are equally close." if amp_report.max_rel_diff == half_report.max_rel_diff else
                        f"{closer} is closer, both within the tolerance." if half_report.passed and amp_report.passed
                        else f"{closer} is closer; not both are within the tolerance."))
    return table, sentences
