"""The checks of notebook 04 (counting FLOPs), with feedback that names the likely mistake.

- :func:`conv_inputs`: every ``Conv2d`` of a network with the shape of its input, from one forward pass on
  the ``meta`` device (no memory, no time, any batch size);
- :func:`counted_flops` / :func:`layer_work`: what ``torch.utils.flop_counter`` (and the roofline's byte
  count, :func:`tinyllama.profiling.attribution.count_operator_work`) say one layer call does;
- :func:`check_conv_flops`: a participant's ``conv2d_flops(conv, input_shape)`` against PyTorch's counter
  on every convolution of the network and on odd ones (grouped, strided, dilated, not square);
- :func:`check_rate_and_mfu`: an achieved TFLOP/s and the MFU against the measured ceiling and the datasheet;
- :func:`check_intensities`: arithmetic intensities of a convolution, a batch norm and a ReLU at the
  network's shapes, and the side of the ridge each lies on;
- :func:`check_roof_reading`: the share of the time in memory-bound layers, and the layer that loses the
  most time against its roof.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping

import pandas as pd
import torch
from torch import nn

from tinyllama.course.checkpoints import check_between, check_equal, checkpoint
from tinyllama.course.feedback import slip_hint

# Convolutions a network like ResNet does not have, each with its input shape: grouped, strided, dilated,
# padded, with a kernel that is not square, on an odd image; and a plain 1x1 on a batch of one.
ODD_CONVS: tuple[tuple[str, Callable[[], nn.Conv2d], tuple[int, int, int, int]], ...] = (
    ("grouped 3x5, stride 2x3, dilated", lambda: nn.Conv2d(12, 20, (3, 5), stride=(2, 3), padding=(1, 2), dilation=(1, 2),
                                                          groups=4, bias=False), (3, 12, 37, 29)),
    # no padding: the output size then differs from the input's even without the stride
    ("depth-wise 3x3, stride 2, no padding", lambda: nn.Conv2d(16, 16, 3, stride=2, padding=0, groups=16, bias=False),
     (2, 16, 15, 15)),
    ("1x1 on one image", lambda: nn.Conv2d(7, 9, 1, bias=False), (1, 7, 11, 13)),
)


def conv_inputs(model: nn.Module, input_shape: tuple[int, ...]) -> dict[str, tuple[nn.Conv2d, tuple[int, ...]]]:
    """Each ``nn.Conv2d`` of ``model`` by name (a copy on the ``meta`` device) with the shape of its input
    when ``model`` runs on a batch of ``input_shape``: one forward pass on ``meta`` (no memory, no time)."""
    meta = copy.deepcopy(model).to("meta").eval()
    found: dict[str, tuple[nn.Conv2d, tuple[int, ...]]] = {}

    def record(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple) -> None:  # returns None: the input goes on unchanged
            found.setdefault(name, (module, tuple(args[0].shape)))
        return hook

    hooks = [module.register_forward_pre_hook(record(name))
             for name, module in meta.named_modules() if isinstance(module, nn.Conv2d)]
    try:
        with torch.no_grad():
            meta(torch.empty(input_shape, device="meta"))
    finally:
        for hook in hooks:
            hook.remove()
    return found


def counted_flops(module: nn.Module, input_shape: tuple[int, ...]) -> int:
    """The FLOPs of ``module(x)`` for ``x`` of ``input_shape`` as ``torch.utils.flop_counter`` counts them
    (on a ``meta`` copy: nothing is computed)."""
    from torch.utils.flop_counter import FlopCounterMode

    meta = copy.deepcopy(module).to("meta").eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        meta(torch.empty(input_shape, device="meta"))
    return int(counter.get_total_flops())


def layer_work(module: nn.Module, input_shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> tuple[float, float]:
    """(FLOPs, bytes) of one call of ``module`` on an input of ``input_shape`` as the roofline counts them
    (:func:`tinyllama.profiling.attribution.count_operator_work`: PyTorch's counter for convolutions, an
    estimate per element for the rest; every input read once, every output written once), on ``meta``."""
    from tinyllama.profiling.attribution import count_operator_work

    meta = copy.deepcopy(module).to(device="meta", dtype=dtype).eval()
    x = torch.empty(input_shape, device="meta", dtype=dtype)

    def call() -> None:
        with torch.no_grad():
            meta(x)

    work = count_operator_work(call)
    return float(work["flops"].sum()), float(work["bytes"].sum())


def _conv_slips(conv: nn.Conv2d, shape: tuple[int, ...]) -> list[tuple[float, str]]:
    """Factors (yours / PyTorch's) that name a mistake in a convolution's FLOPs."""
    n, _, h, w = shape
    out_h = (h + 2 * conv.padding[0] - conv.dilation[0] * (conv.kernel_size[0] - 1) - 1) // conv.stride[0] + 1
    out_w = (w + 2 * conv.padding[1] - conv.dilation[1] * (conv.kernel_size[1] - 1) - 1) // conv.stride[1] + 1
    slips = [(0.5, "half of PyTorch's count: a multiply-add is two FLOPs (MACs x 2)."),
             (float(conv.groups), (f"{conv.groups}x too many: with groups={conv.groups} each output channel sees only "
                                  "in_channels / groups input channels.")),
             ((h * w) / (out_h * out_w), ("counted over the input's pixels: the output has "
                                         f"{out_h}x{out_w} pixels (stride, padding and dilation shrink it)."))]
    if n > 1:
        slips.append((1.0 / n, f"1/{n} of PyTorch's count: every image of the batch ({n}) is convolved."))
    return [(f, text) for f, text in slips if f != 1.0]


def conv_formula(conv: nn.Conv2d, shape: tuple[int, ...], *, flops_per_mac: int = 2, batch: bool = True,
                 groups: bool = True, stride: bool = True, padding: bool = True, dilation: bool = True,
                 floor: bool = True, output_size: bool = True, axes: tuple[int, ...] = (0, 1)) -> float:
    """A convolution's FLOPs by formula, with switches that each leave one part out (a typical mistake):
    all switches on, it is the reference count (2 FLOPs per multiply-add, no bias). The switches of the
    output size apply to ``axes`` only (0: the height, 1: the width); the other axis is computed right."""
    n, c_in, h, w = shape
    sizes = []
    for axis, (size, k, s, p, d) in enumerate(zip((h, w), conv.kernel_size, conv.stride, conv.padding, conv.dilation)):
        if axis not in axes:
            sizes.append((size + 2 * p - d * (k - 1) - 1) // s + 1)
            continue
        span = (d if dilation else 1) * (k - 1) + 1
        inner = size + (2 * p if padding else 0) - span
        step = s if stride else 1
        sizes.append((inner // step if floor else inner / step) + 1 if output_size else size)
    macs_per_output = (c_in // conv.groups if groups else c_in) * conv.kernel_size[0] * conv.kernel_size[1]
    return float(flops_per_mac * (n if batch else 1) * conv.out_channels * sizes[0] * sizes[1] * macs_per_output)


# The mistakes of exercise 04.1: the switches of :func:`conv_formula` that make each, and what it is.
CONV_SLIPS: tuple[tuple[dict, str], ...] = (
    ({"flops_per_mac": 1}, "half of PyTorch's count: a multiply-add (MAC) is two FLOPs (MACs x 2)."),
    ({"batch": False}, "every image of the batch is convolved: multiply by N."),
    ({"groups": False}, ("too many on the grouped convolutions: with groups=g each output channel sees only "
                        "in_channels / g input channels.")),
    ({"output_size": False}, ("counted over the input's pixels: the output's height and width follow from the stride, "
                             "padding and dilation (a stride of 2 halves them).")),
    ({"stride": False}, "the stride is missing from the output size: a stride of s keeps one position in s."),
    ({"padding": False}, "the padding is missing from the output size: padding p adds p rows (columns) on each side."),
    ({"dilation": False}, "the dilation is missing: a kernel of k taps with dilation d spans d (k - 1) + 1 pixels."),
    ({"floor": False}, ("the output size is a whole number: divide by the stride with //, not / (the last position "
                       "that does not fit is dropped).")),
)


def conv_slip(conv2d_flops: Callable[[nn.Conv2d, tuple[int, ...]], float],
              cases: Mapping[str, tuple[nn.Conv2d, tuple[int, ...]]]) -> str | None:
    """The mistake of :data:`CONV_SLIPS` that gives ``conv2d_flops``'s count on every case, else ``None``."""
    answers = [(conv, shape, float(conv2d_flops(conv, shape))) for conv, shape in cases.values()]
    for switches, text in CONV_SLIPS:
        sized = not switches.keys() & {"flops_per_mac", "batch", "groups"}  # a mistake in the output size
        for axes, where in (((0, 1), ""), ((0,), " (in the height)"), ((1,), " (in the width)"))[: 3 if sized else 1]:
            if all(math.isclose(yours, conv_formula(conv, shape, **switches, axes=axes), rel_tol=1e-9)
                   for conv, shape, yours in answers):
                return text[:-1] + where + "." if where else text
    return None


def check_conv_flops(conv2d_flops: Callable[[nn.Conv2d, tuple[int, ...]], float],
                     convs: Mapping[str, tuple[nn.Conv2d, tuple[int, ...]]]) -> bool:
    """``conv2d_flops(conv, input_shape)`` equals ``torch.utils.flop_counter``'s count on every convolution
    of ``convs`` (:func:`conv_inputs`) and on :data:`ODD_CONVS`; the feedback names the first layer that
    differs, by how much, and the mistake (:data:`CONV_SLIPS`) that gives the same counts on every layer,
    else the one its factor suggests."""
    cases = dict(convs) | {f"({name})": (make(), shape) for name, make, shape in ODD_CONVS}
    wrong = []
    for name, (conv, shape) in cases.items():
        try:
            yours = float(conv2d_flops(conv, shape))
        except NotImplementedError:  # an exercise not written yet: its own message says what to do
            raise
        except Exception as error:  # noqa: BLE001 - shown to the participant as feedback
            return checkpoint(False, "", f"conv2d_flops raised {type(error).__name__}: {error} on {name} "
                                         f"(input {tuple(shape)})")
        expected = counted_flops(conv, shape)
        if not math.isclose(yours, expected, rel_tol=1e-9):
            wrong.append((name, conv, shape, yours, expected))
    if not wrong:
        return checkpoint(True, f"conv2d_flops matches PyTorch's FLOP counter on all {len(convs)} convolutions of the "
                                f"network and {len(ODD_CONVS)} odd ones (grouped, strided, dilated, not square)", "")
    name, conv, shape, yours, expected = wrong[0]
    hint = conv_slip(conv2d_flops, cases)
    if hint is None:
        hint = slip_hint(yours, expected, _conv_slips(conv, shape)) if expected else ""
        wrong_names = {w[0] for w in wrong}
        single = [name for name, (_, shape) in cases.items() if shape[0] == 1]
        if (shape[0] > 1 and single and not wrong_names & set(single)
                and math.isclose(yours * shape[0], expected, rel_tol=1e-6)):
            # right on a batch of one image, 1/N of the count on a batch of N: the batch is missing
            hint = (f"1/{shape[0]} of PyTorch's count, and right on a batch of one image: every image of the batch "
                    "is convolved.")
    return checkpoint(False, "", f"conv2d_flops differs from PyTorch's counter on {len(wrong)} of {len(cases)} "
                                 f"convolutions; first {name}: {conv} on input {tuple(shape)}: yours {yours:.6g}, "
                                 f"PyTorch's {expected:.6g} FLOPs ({yours / expected:.4g}x). {hint}".rstrip())


def check_rate_and_mfu(achieved_tflops: float, mfu_measured: float, mfu_datasheet: float | None, forward_flops: float,
                       median_ms: float, batch_size: int, ceiling_tflops: float, datasheet_tflops: float | None) -> bool:
    """The achieved rate (TFLOP/s) of a forward of ``forward_flops`` in ``median_ms``, and the MFU (fractions)
    against the measured ceiling and the datasheet peak (``None`` where there is none)."""
    expected = forward_flops / (median_ms / 1e3) / 1e12
    slips = [(1e3, "1000x: the time is in milliseconds; divide by seconds."),
             (1e-3, "1/1000: the time is in milliseconds; divide by seconds."),
             (0.5, "half: a multiply-add (MAC) is two FLOPs."), (1.0 / batch_size, (f"1/{batch_size}: the FLOPs of "
                                                                   "one image over the time of the whole batch."))]
    ok = check_between("achieved rate", float(achieved_tflops), 0.99 * expected, 1.01 * expected, "TFLOP/s",
                       hint=slip_hint(float(achieved_tflops), expected, slips),
                       why=f"{forward_flops:.4g} FLOPs per forward of the batch / {median_ms:.4g} ms = {expected:.4g} TFLOP/s.")
    for name, value, roof in (("MFU against the measured ceiling", mfu_measured, ceiling_tflops),
                              ("MFU against the datasheet peak", mfu_datasheet, datasheet_tflops)):
        if roof is None:
            ok &= checkpoint(value is None, f"{name}: none (no datasheet peak for this device)",
                             f"{name}: this device has no datasheet peak; set it to None")
            continue
        mfu = expected / roof
        ok &= check_between(name, float(value), 0.99 * mfu, 1.01 * mfu,
                            hint=slip_hint(float(value), mfu, [(100.0, "a percent: write the fraction (0.4, not 40)."),
                                                               ((roof / expected) ** 2, ("the ceiling over the rate: "
                                                                                     "the other way round."))]),
                            why=f"achieved {expected:.4g} / {roof:.4g} TFLOP/s: a fraction between 0 and 1.")
    return ok


def check_intensities(yours: Mapping[str, float], reference: Mapping[str, float], itemsize: int) -> bool:
    """Intensities (FLOP/byte) by layer kind against the roofline's count of the same layers
    (:func:`layer_work`), within 2% (the per-channel vectors of a batch norm may be left out)."""
    ok = True
    hints = {"convolution": [(float(itemsize), "elements, not bytes: multiply by the bytes per element."),
                             (0.5, "half: a multiply-add is two FLOPs.")],
             "batch norm": [(0.5, "half: in eval mode a batch norm is a scale and a shift, two FLOPs per element."),
                            (2.0, "twice: did you count only the input, not the output written?"),
                            (float(itemsize), "elements, not bytes: multiply by the bytes per element.")],
             "ReLU": [(2.0, "twice: the output is written too (read once, written once)."),
                      (float(itemsize), "elements, not bytes: multiply by the bytes per element.")]}
    for kind, expected in reference.items():
        value = yours.get(kind)
        if value is None:
            ok &= checkpoint(False, "", f"no intensity for {kind!r}: set intensities[{kind!r}]")
            continue
        ok &= check_between(f"{kind} intensity", float(value), 0.98 * expected, 1.02 * expected, "FLOP/byte",
                            hint=slip_hint(float(value), expected, hints.get(kind, [])),
                            why=f"the roofline's count of the same layer: {expected:.4g} FLOP/byte.")
    return ok


def check_bounds(predicted: Mapping[str, str], intensities: Mapping[str, float], ridges: Mapping[str, float]) -> bool:
    """``predicted[kind]`` is ``"memory"`` or ``"compute"``, the side of its roof's ridge point
    (``ridges[kind]``) on which the reference intensity lies."""
    ok = True
    for kind, value in intensities.items():
        side = "compute" if value >= ridges[kind] else "memory"
        ok &= check_equal(f"{kind}: bound", predicted.get(kind), side,
                          f"its intensity {value:.3g} FLOP/byte is {'above' if side == 'compute' else 'below'} the ridge "
                          f"point {ridges[kind]:.3g} FLOP/byte of its roof")
    return ok


def check_roof_reading(memory_bound_pct: float, most_excess: str, points: pd.DataFrame) -> bool:
    """The percent of the device time of ``points`` spent in memory-bound points, and the point (operator
    and shapes) whose time exceeds its time at the roof by the most (``excess_ms``)."""
    total = points["time_ms"].sum()
    expected_pct = 100.0 * points.loc[points["bound"] == "memory", "time_ms"].sum() / total
    by_rows = 100.0 * (points["bound"] == "memory").mean()
    hint = ("the share of the rows, not of the time: weight each layer by its time_ms."
            if abs(memory_bound_pct - by_rows) < 0.5 and abs(by_rows - expected_pct) > 1 else
            slip_hint(float(memory_bound_pct), expected_pct, [(0.01, "a fraction: write it as a percent.")]))
    ok = check_between("time in memory-bound layers", float(memory_bound_pct), expected_pct - 0.5, expected_pct + 0.5, "%",
                       hint=hint, why=f"{points.loc[points['bound'] == 'memory', 'time_ms'].sum():.4g} of "
                                      f"{total:.4g} ms of device time per forward.")
    expected = points.loc[points["excess_ms"].idxmax(), "operator"]
    worst_pct = points.loc[points["pct_of_roof"].idxmin(), "operator"] if points["pct_of_roof"].notna().any() else None
    hint = ("that is the layer furthest below its roof in percent; a small layer far from its roof loses little time: "
            "look for the largest excess_ms." if most_excess == worst_pct and most_excess != expected else
            "the layer with the largest excess_ms (its time minus its time at the roof).")
    ok &= check_equal("the layer that loses the most time against its roof", most_excess, expected, hint)
    return ok
