"""Host time per launch of each Triton kernel of V3, beside a plain Triton launch.

    python -m tinyllama.harness.launch_costs            # on a GPU; about 20 s after autotuning

Every launcher (``rmsnorm_forward``, ``flash_attention_backward``, ...) is called back to back at a
small shape of the medium model (64 tokens: the device finishes each kernel before the host has
issued the next, so the host's time is what is measured), after warm-up (compilation, autotuning),
in ``repeat`` rounds that each time every call once (median and spread over the rounds,
``tinyllama.costs.kernel_costs.host_us_per_call``). Each is measured
two ways: ``remembered`` (the project's :class:`~tinyllama.kernels._triton.Launcher`: the autotuner's
choice and the compiled binary remembered per key, launched directly) and ``triton`` (the same
launchers through Triton's own path, ``kernel[grid](...)``: autotuner lookup and argument binding on
every call, as a plain ``@triton.autotune`` kernel is launched). The yardsticks: a plain launch of a
three-argument Triton kernel without autotuner, and PyTorch's ``F.rms_norm``. ``us_per_launch`` is the
call's host time over the kernels it launches (the attention backward launches two); ``vs_plain``
and ``vs_rms_norm`` are that over each yardstick's, from the same run (the hosts of the lent H200
machines differed by up to 2x between runs, the ratios far less: run ``2026-11-23f_h200_issue21.md`` of ``benchmarks/records/launch_costs.json``).

On a CPU the kernels run in Triton's interpreter: the numbers are the interpreter's.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable

import pandas as pd
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tinyllama import device as dev
from tinyllama.config import ModelConfig, get_preset
from tinyllama.costs.kernel_costs import host_us_per_call
from tinyllama.kernels._triton import triton_launch_path
from tinyllama.kernels.flash_attention import flash_attention_backward, flash_attention_forward
from tinyllama.kernels.rmsnorm import rmsnorm_backward, rmsnorm_forward
from tinyllama.kernels.rope import rope_forward
from tinyllama.kernels.swiglu import swiglu_backward, swiglu_forward
from tinyllama.models import v1_baseline as v1
from tinyllama.timing import summarize

TARGET_US_PER_LAUNCH = 25.0  # issue 21: remembered launches at most this much host time each
# The two yardsticks, measured in the same run as our launchers.
PLAIN = "plain Triton kernel (3 arguments, no autotuner)"
TORCH = "F.rms_norm (PyTorch)"
COLUMNS = ["call", "launches", "path", "host_us_median", "host_us_p10", "host_us_p90", "us_per_launch",
           "host_bound", "vs_plain", "vs_rms_norm"]  # the last two: us_per_launch over each yardstick's


@triton.jit
def _plain_kernel(X, N, BLOCK: tl.constexpr):
    """The smallest useful kernel: the yardstick of a plain Triton launch (no autotuner, 3 arguments)."""
    offs = tl.arange(0, BLOCK)
    tl.store(X + offs, tl.load(X + offs, mask=offs < N, other=0.0) + 1.0, mask=offs < N)


def launch_calls(config: ModelConfig, dtype: torch.dtype, device: torch.device,
                 tokens: int = 64) -> list[tuple[str, int, bool, Callable[[], object]]]:
    """``(name, kernel launches per call, one of ours, call)`` at ``tokens`` tokens of ``config``'s shapes."""
    c = config
    g = torch.Generator().manual_seed(0)

    def randn(*shape: int, kind: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device, kind)

    x, w = randn(tokens, c.hidden_dim), 1 + 0.1 * randn(c.hidden_dim, kind=torch.float32)
    y, rstd = rmsnorm_forward(x, w, c.norm_eps)
    dweight_sum = torch.zeros(c.hidden_dim, dtype=torch.float32, device=device)
    tables = v1.RotaryEmbedding(c.head_dim, c.max_seq_len, c.rope_theta).to(device)
    q = randn(1, c.num_heads, tokens, c.head_dim)
    k, v = randn(1, c.num_kv_heads, tokens, c.head_dim), randn(1, c.num_kv_heads, tokens, c.head_dim)
    out, lse = flash_attention_forward(q, k, v)
    gate_up = randn(tokens, 2 * c.intermediate_dim)
    gate, up = gate_up.chunk(2, dim=-1)
    dact = randn(tokens, c.intermediate_dim)
    plain = torch.zeros(16, device=device)
    calls: list[tuple[str, int, bool, Callable[[], object]]] = [
        (PLAIN, 1, False,
         lambda: _plain_kernel[(1,)](plain, 16, BLOCK=16)),
        ("rmsnorm_forward", 1, True, lambda: rmsnorm_forward(x, w, c.norm_eps)),
        ("rmsnorm_backward", 1, True, lambda: rmsnorm_backward(y, x, w, rstd, dweight_sum=dweight_sum)),
        ("rope_forward", 1, True, lambda: rope_forward(q, tables.cos, tables.sin)),
        ("swiglu_forward", 1, True, lambda: swiglu_forward(gate, up)),
        ("swiglu_backward", 1, True, lambda: swiglu_backward(dact, gate, up)),
        ("flash_attention_forward", 1, True, lambda: flash_attention_forward(q, k, v)),
        ("flash_attention_backward", 2, True, lambda: flash_attention_backward(out, q, k, v, out, lse)),
    ]
    if hasattr(F, "rms_norm"):
        calls.append((TORCH, 1, False, lambda: F.rms_norm(x, (c.hidden_dim,), w.to(dtype), c.norm_eps)))
    return calls


def measure_launch_costs(preset: str = "medium", dtype: torch.dtype = torch.bfloat16,
                         device: torch.device | None = None, calls: int = 200, repeat: int = 7,
                         tokens: int = 64) -> pd.DataFrame:
    """Host microseconds per call and per launch of each launcher, remembered and through Triton's
    path, beside a plain Triton launch and ``F.rms_norm`` (see the module docstring).

    The measurements are interleaved: each of the ``repeat`` rounds times every call once, so that a
    change in the host's speed during the run (the lent GPU machines' hosts vary by 2x between runs)
    touches every row alike. ``vs_plain`` and ``vs_rms_norm`` divide each row's ``us_per_launch`` by the
    two yardsticks' medians of the same run: figures that hold from one host to another where the
    microseconds do not."""
    device = device or dev.get_device()
    if device.type == "cpu":
        calls, repeat = min(calls, 3), min(repeat, 2)  # the interpreter: seconds per call
    measured = []  # (name, launches, path, call, samples of host us, wall-clock bound flags)
    for name, launches, ours, call in launch_calls(get_preset(preset).model, dtype, device, tokens):
        for path in (("remembered", "triton") if ours else ("-",)):
            measured.append((name, launches, path, call, [], []))
    for round_ in range(repeat):
        for name, launches, path, call, host, bound in measured:
            with triton_launch_path() if path == "triton" else contextlib.nullcontext():
                cost = host_us_per_call(call, device, calls=calls, repeat=1, warmup=3 if round_ == 0 else 0)
            host.append(cost.host_us.median)
            bound.append(cost.host_bound)
    rows = []
    for name, launches, path, call, host, bound in measured:
        stats = summarize(host)
        rows.append({"call": name, "launches": launches, "path": path, "host_us_median": stats.median,
                     "host_us_p10": stats.p10, "host_us_p90": stats.p90, "us_per_launch": stats.median / launches,
                     "host_bound": sum(bound) > len(bound) / 2})
    frame = pd.DataFrame(rows, columns=COLUMNS[:-2])
    for column, yardstick in (("vs_plain", PLAIN), ("vs_rms_norm", TORCH)):
        base = frame.loc[frame["call"] == yardstick, "us_per_launch"]
        frame[column] = frame["us_per_launch"] / base.iloc[0] if len(base) else float("nan")
    return frame


def check_target(frame: pd.DataFrame) -> dict[str, object]:
    """Issue 21's target: every remembered launch at most ``TARGET_US_PER_LAUNCH`` us of host time."""
    ours = frame[frame["path"] == "remembered"]
    worst = ours.loc[ours["us_per_launch"].idxmax()]
    relative = (f" ({worst['vs_rms_norm']:.2f}x an F.rms_norm call of the same run)"
                if pd.notna(worst.get("vs_rms_norm")) else "")
    return {"target": f"host time per launch (remembered) <= {TARGET_US_PER_LAUNCH:g} us",
            "measured": f"worst {worst['call']}: {worst['us_per_launch']:.1f} us per launch{relative}",
            "met": bool(worst["us_per_launch"] <= TARGET_US_PER_LAUNCH)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="medium")
    parser.add_argument("--dtype", default="bf16", choices=["fp32", "bf16", "fp16"])
    args = parser.parse_args(argv)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    frame = measure_launch_costs(args.preset, dtype)
    print(frame.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    print(check_target(frame))
    return 0


if __name__ == "__main__":
    sys.exit(main())
