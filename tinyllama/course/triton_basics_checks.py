"""The checks of notebook 13's forward exercises: the vector add (13.1), the RMSNorm kernel (13.2), the
SwiGLU kernel (13.3), the bytes an RMSNorm moves (13.4) and the launch-bound size (13.5).

Each kernel goes through the kit's :func:`~tinyllama.course.feedback.check_kernel`: run against PyTorch's
answer on fresh random inputs (shapes that are not powers of two, guarded tensors), a wrong result compared
first with each typical mistake (a :class:`~tinyllama.course.feedback.Slip` computed in PyTorch on the same
inputs), the mistake it reproduces named in the feedback, else a general hint. This module holds the
exercises' slips and hints. A formula (13.4, 13.5) is compared with its slips the same way, as numbers
(:class:`~tinyllama.course.feedback.NumberSlip`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from tinyllama.course.checkpoints import check_between, checkpoint
from tinyllama.course.feedback import (
    NumberSlip,
    Slip,
    check_kernel,
    name_number_slip,
    tensors_close,
)

Shape = tuple[int, ...]


# ---- 13.1: the vector add ---------------------------------------------------------------------------------------

ADD_BLOCK = 1024  # the launcher's default block


def _first_block_only(actual: torch.Tensor, inputs: tuple, expected: torch.Tensor) -> bool:
    n = expected.numel()
    if n <= ADD_BLOCK or actual.shape != expected.shape:
        return False
    head = tensors_close(actual[:ADD_BLOCK], expected[:ADD_BLOCK], 0.0, 2**-7)
    return head and not tensors_close(actual[ADD_BLOCK:], expected[ADD_BLOCK:], 0.0, 2**-7)


ADD_SLIPS: tuple[Slip, ...] = (
    Slip("offsets without the block's start",
         "only the first BLOCK elements are right: every program works on the same offsets. The offsets are this "
         "program's first element, pid * BLOCK, plus tl.arange(0, BLOCK).", matches=_first_block_only),
    Slip("x loaded twice", "the result is x + x: the second load reads X where it should read Y.",
         function=lambda x, y: x + x),
    Slip("x times y", "the result is x * y: the kernel must store the sum x + y.", function=lambda x, y: x * y),
)
ADD_HINT = "Wrong elements only at the end: the mask. Everything wrong: the offsets."


def check_add(add: Callable[..., Any], make_inputs: Callable[[Shape], Sequence[Any]], lengths: Iterable[Shape],
              dtype: torch.dtype, name: str) -> bool:
    """Exercise 13.1: ``add(x, y)`` equals ``torch.add`` (fp32 exactly, bf16 to one rounding step)."""
    return check_kernel(f"add_kernel ({name})", add, torch.add, make_inputs, lengths, ADD_SLIPS, ADD_HINT,
                        atol=0.0, rtol=0.0 if dtype == torch.float32 else 2**-7)


# ---- 13.2: RMSNorm ----------------------------------------------------------------------------------------------

def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float, denominator: int | None = None, root: bool = True,
         use_weight: bool = True) -> torch.Tensor:
    x32 = x.float()
    mean = x32.pow(2).sum(dim=-1, keepdim=True) / (denominator or x.shape[-1])
    scale = torch.rsqrt(mean + eps) if root else 1.0 / (mean + eps)
    y = x32 * scale * (weight.float() if use_weight else 1.0)
    return y.to(x.dtype)


def _rows_width_apart(x: torch.Tensor) -> torch.Tensor:
    """What a kernel reads that takes row i at i * N: the storage under x, rows packed end to end."""
    rows, width = x.reshape(-1, x.shape[-1]).shape
    return torch.as_strided(x, (rows, width), (width, 1), x.storage_offset())


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


RMSNORM_SLIPS: tuple[Slip, ...] = (
    Slip("mean over BLOCK_N",
         "the mean of the squares divides by BLOCK_N (the width rounded up to a power of two): the padded lanes are "
         "zeros, not elements. Divide the sum by N.",
         function=lambda x, w, eps=1e-5: _rms(x, w, eps, denominator=_next_power_of_2(x.shape[-1]))),
    Slip("rows N apart",
         "rows after the first are read from the wrong place: row i starts at i * stride_x (x is a view whose "
         "rows lie further apart than N), not at i * N.",
         function=lambda x, w, eps=1e-5: _rms(_rows_width_apart(x), w, eps)),
    Slip("no weight", "the result lacks the weight: multiply the normalised row by w (loaded with the same mask).",
         function=lambda x, w, eps=1e-5: _rms(x, w, eps, use_weight=False)),
    Slip("no root",
         "the row is divided by its mean square, not by its root: rstd = tl.rsqrt(mean of the squares + eps).",
         function=lambda x, w, eps=1e-5: _rms(x, w, eps, root=False)),
)
RMSNORM_HINT = ("A constant factor everywhere: the mean (over N?) or the root. Wrong rows after the first: the row "
                "stride. NaN: a load without a mask, or without other=0.")


def check_rmsnorm(my_rmsnorm: Callable[..., Any], make_inputs: Callable[[Shape], Sequence[Any]],
                  shapes: Iterable[Shape], name: str, atol: float, rtol: float) -> bool:
    """Exercise 13.2: ``my_rmsnorm(x, weight)`` against the library's PyTorch RMSNorm."""
    from tinyllama.kernels import rmsnorm_reference

    return check_kernel(f"rmsnorm_kernel ({name})", my_rmsnorm, rmsnorm_reference, make_inputs, shapes,
                        RMSNORM_SLIPS, RMSNORM_HINT, atol=atol, rtol=rtol)


# ---- 13.3: SwiGLU -----------------------------------------------------------------------------------------------

def _silu_times(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    g, u = gate.float(), up.float()
    return (g * torch.sigmoid(g) * u).to(gate.dtype)


SWIGLU_SLIPS: tuple[Slip, ...] = (
    Slip("gate and up swapped", "the result is silu(up) * gate: the activation applies to the gate, silu(gate) * up.",
         function=lambda gate, up: _silu_times(up, gate)),
    Slip("sigmoid, not silu", "the result is sigmoid(gate) * up: silu(g) is g * sigmoid(g).",
         function=lambda gate, up: (torch.sigmoid(gate.float()) * up.float()).to(gate.dtype)),
    Slip("rows F apart",
         "rows after the first are read from the wrong place: gate and up are halves of one tensor, so their rows "
         "lie 2F apart (stride_g, stride_u), not F (the output's stride).",
         function=lambda gate, up: _silu_times(_rows_width_apart(gate), _rows_width_apart(up))),
)
SWIGLU_HINT = ("Wrong columns at the end of a row: the mask. Wrong rows: a row stride (gate and up rows are 2F apart). "
               "Everything off: silu is g * sigmoid(g).")


def check_swiglu(my_swiglu: Callable[..., Any], make_inputs: Callable[[Shape], Sequence[Any]],
                 shapes: Iterable[Shape], name: str, atol: float, rtol: float) -> bool:
    """Exercise 13.3: ``my_swiglu(gate, up)`` against ``silu(gate) * up``."""
    from tinyllama.kernels import swiglu_reference

    return check_kernel(f"swiglu_kernel ({name})", my_swiglu, swiglu_reference, make_inputs, shapes, SWIGLU_SLIPS,
                        SWIGLU_HINT, atol=atol, rtol=rtol)


# ---- 13.4 and 13.5: numbers ----------------------------------------------------------------------------------------

BYTES_SLIPS: tuple[NumberSlip, ...] = (
    NumberSlip("write forgotten", lambda r, w, i: r * w * i + w * i,
               "you counted x and the weight but not y: the kernel writes y, rows x width elements, once."),
    NumberSlip("elements, not bytes", lambda r, w, i: 2 * r * w + w,
               "you counted elements, not bytes: multiply by itemsize."),
    NumberSlip("weight per row", lambda r, w, i: 3 * r * w * i,
               "you counted the weight once per row: every program reads it, but memory moves it once (it stays in "
               "the cache); count it once, width elements."),
    NumberSlip("weight forgotten", lambda r, w, i: 2 * r * w * i,
               "you left out the weight: it is read once, width elements of itemsize bytes (it shows on a narrow "
               "tensor)."),
    NumberSlip("read and write each", lambda r, w, i: 2 * (2 * r * w * i + w * i),
               "you counted every element read and written: x is only read, y only written, each once."),
)
BYTES_CASES = ((8192, 1024, 2), (7, 100, 4))
BYTES_WHY = ("x is read once and y written once (rows x width each), the weight read once; the statistics a backward "
             "would keep are not counted. A factor of 2 off: read or write forgotten; of itemsize: elements instead "
             "of bytes.")


def check_rmsnorm_bytes(rmsnorm_bytes: Callable[[int, int, int], float]) -> bool:
    """Exercise 13.4: ``rmsnorm_bytes(rows, width, itemsize)`` on a wide bf16 case and a narrow fp32 one (where
    the weight is 7% of the bytes); a wrong formula is named among :data:`BYTES_SLIPS`."""
    from tinyllama.costs.kernel_costs import rmsnorm_forward_bytes

    answers: dict[tuple[int, int, int], float] = {}
    ok = True
    for case in BYTES_CASES:
        try:
            answers[case] = float(rmsnorm_bytes(*case))
        except NotImplementedError:
            raise
        except Exception as error:  # noqa: BLE001 - say what the participant's function raised
            ok &= checkpoint(False, "", f"rmsnorm_bytes{case} raised {type(error).__name__}: {error}")
    # The slip whose formula gives every answer (one case alone can leave two slips within 0.1% of each other).
    rights = {case: rmsnorm_forward_bytes(*case) for case in answers}
    slip = next((s for s in BYTES_SLIPS
                 if any(not math.isclose(s.value(*case), rights[case], rel_tol=1e-3) for case in answers)
                 and all(math.isclose(answers[case], s.value(*case), rel_tol=1e-3) for case in answers)), None)
    for case, answer in answers.items():
        rows, width, itemsize = case
        expected = rights[case]
        label = f"rmsnorm_bytes({rows}, {width}, {itemsize})"
        if math.isclose(answer, expected, rel_tol=1e-3):
            ok &= check_between(label, answer, expected * 0.999, expected * 1.001, unit="bytes", why=BYTES_WHY)
            continue
        said = slip.message if slip else ("count the bytes read and written, each element of memory once, "
                                          "itemsize bytes an element")
        factor = f"{answer / expected:.3g}x the fewest bytes" if expected and answer else "wrong"
        ok &= checkpoint(False, "", f"{label} = {answer:.6g} bytes is {factor}: {said}")
    return ok


LAUNCH_SLIPS: tuple[NumberSlip, ...] = (
    NumberSlip("microseconds unconverted", lambda us, tbs: us * tbs * 1e12 / 2**20,
               "it is 1e6 times too large: the launch time is in microseconds; multiply it by 1e-6 to get seconds."),
    NumberSlip("TB/s unconverted", lambda us, tbs: us * 1e-6 * tbs / 2**20,
               "it is 1e12 times too small: TB/s is 1e12 bytes per second; multiply copy_tbs by 1e12."),
    NumberSlip("both units unconverted", lambda us, tbs: us * tbs / 2**20,
               "it is 1e6 times too small: neither unit is converted (microseconds to seconds: 1e-6; TB/s to bytes "
               "per second: 1e12)."),
    NumberSlip("MB, not MiB", lambda us, tbs: us * 1e-6 * tbs * 1e12 / 1e6,
               "it is 1.049 times too large: that is MB (1e6 bytes); a MiB is 2**20 bytes."),
    NumberSlip("GiB, not MiB", lambda us, tbs: us * 1e-6 * tbs * 1e12 / 2**30,
               "it is 1024 times too small: that is GiB; a MiB is 2**20 bytes."),
)
LAUNCH_WHY = ("bytes = launch time x bandwidth; a factor near 1e6 or 1e12 is a unit (us, TB/s) left unconverted, 1.05 "
              "is MB instead of MiB.")


def check_launch_bound(launch_bound_mib: float, launch_us: float, copy_tbs: float) -> bool:
    """Exercise 13.5: the MiB that take ``launch_us`` microseconds at ``copy_tbs`` TB/s; a wrong value is named
    among :data:`LAUNCH_SLIPS` (units left unconverted, MB for MiB)."""
    from tinyllama.costs.kernel_costs import launch_bound_bytes

    expected = launch_bound_bytes(launch_us, copy_tbs) / 2**20
    value = float(launch_bound_mib)
    if math.isfinite(value) and math.isclose(value, expected, rel_tol=0.01):
        return check_between("launch_bound_mib", value, expected * 0.99, expected * 1.01, unit="MiB", why=LAUNCH_WHY)
    slip = name_number_slip(value, LAUNCH_SLIPS, (launch_us, copy_tbs), expected, 0.005)
    said = slip.message if slip else ("set the time at the copy ceiling, bytes / bandwidth, equal to the launch "
                                      "time and solve for the bytes, in MiB")
    ratio = f" ({value / expected:.3g}x the expected value)" if expected and value else ""
    return checkpoint(False, "", f"launch_bound_mib = {value:.4g} MiB{ratio}: {said}")


def slips_by_name(slips: Iterable[Slip | NumberSlip]) -> Mapping[str, str]:
    """``{name: message}`` of ``slips`` (the tests look messages up by name)."""
    return {slip.name: slip.message for slip in slips}
