"""The checks of notebook 02 (precision), with feedback that names the likely mistake.

- :func:`measured_rounding_error`: the largest relative error of rounding many random fp32 (or fp64)
  values to a format, measured by rounding them (fp16, bf16 and fp32 by PyTorch's casts, TF32 by
  :func:`inference.precision.round_to_mantissa`);
- :func:`check_unit_roundoff`: a formula for the largest relative rounding error from the mantissa
  bits, against those measurements;
- :func:`check_error_ratio`: a predicted ratio of two formats' errors on a network, against the measured one;
- :func:`check_batch_prediction`: a predicted largest 16-bit batch, against the memory-budgeted search.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from inference.precision import MANTISSA_BITS, round_to_mantissa
from tinyllama.course.checkpoints import checkpoint


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


def check_unit_roundoff(unit_roundoff: Callable[[int], float]) -> bool:
    """``unit_roundoff(mantissa_bits)`` must bound the measured rounding error of fp32, TF32, fp16
    and bf16 from above, and by no more than 10%: the bound rounding to nearest guarantees."""
    rows, ok, advice = [], True, ""
    for fmt, bits in MANTISSA_BITS.items():
        measured = measured_rounding_error(fmt)
        claimed = float(unit_roundoff(bits))
        fits = measured <= claimed <= 1.1 * measured
        ok &= fits
        ratio = claimed / measured if measured else math.inf
        rows.append(f"  {fmt:5s} ({bits:2d} mantissa bits): your bound {claimed:.3g}, largest measured error "
                    f"{measured:.3g} ({ratio:.3g}x){'' if fits else '  <-- off'}")
        if not fits and not advice:
            if math.isclose(ratio, 2.0, rel_tol=0.05):
                advice = ("Your bound is twice the measured error: that is the spacing of the numbers between 1 and "
                          "2 (machine epsilon, torch.finfo(dtype).eps). Rounding to the nearest is off by at most "
                          "half of that spacing.")
            elif ratio < 1:
                advice = ("Your bound is below errors that were measured: count the implicit leading 1 and the "
                          "half spacing again.")
            else:
                advice = ("Work in powers of two: with m mantissa bits the numbers between 1 and 2 are 2^-m apart, "
                          "and rounding to the nearest moves a value by at most half of that, relative to the value.")
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
