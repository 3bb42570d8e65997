"""Launching the Triton kernels: the autotuner is consulted once per key, then bypassed.

``tinyllama.kernels._triton.Launcher`` remembers the configuration (and, compiled, the binary) that
the first call for a key chose. These tests watch the autotuner's ``run`` (and its pruning): a
second call with the same sizes must not enter it, a call with new sizes or a misaligned tensor must,
and every call must still give the reference's values. On a CPU they run in Triton's interpreter.
"""

import importlib

import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE

from tinyllama import kernels
from tinyllama.kernels._triton import KernelTolerance, Launcher, assert_close

rms = importlib.import_module("tinyllama.kernels.rmsnorm")
swi = importlib.import_module("tinyllama.kernels.swiglu")
rop = importlib.import_module("tinyllama.kernels.rope")
fa = importlib.import_module("tinyllama.kernels.flash_attention")

TUNED = {
    "rmsnorm": [rms._rmsnorm_fwd_kernel, rms._rmsnorm_bwd_kernel],
    "swiglu": [swi._swiglu_fwd_kernel, swi._swiglu_bwd_kernel],
    "rope": [rop._rope_kernel],
    "flash_attention": [fa._attn_fwd_kernel, fa._attn_bwd_dkdv_kernel, fa._attn_bwd_dq_kernel],
}


@pytest.fixture
def watched(monkeypatch):
    """Empty every launcher's memory and count the calls into each autotuner's ``run`` and
    ``prune_configs``, by kernel name."""
    calls: dict[str, int] = {}
    for launchers in TUNED.values():
        for launcher in launchers:
            monkeypatch.setattr(launcher, "cache", {})
            tuner = launcher.autotuner
            for method in ("run", "prune_configs"):
                original = getattr(tuner, method)

                def counting(*args, _original=original, _name=f"{launcher.name}.{method}", **kwargs):
                    calls[_name] = calls.get(_name, 0) + 1
                    return _original(*args, **kwargs)

                monkeypatch.setattr(tuner, method, counting)
    return calls


def _rmsnorm_step(rows, width, dtype=torch.float32):
    x = torch.randn(rows, width, device=DEVICE, dtype=dtype, requires_grad=True)
    w = torch.randn(width, device=DEVICE, requires_grad=True)
    y = kernels.rmsnorm(x, w)
    y.backward(torch.ones_like(y))
    # fp32 agrees to rounding; a 16-bit output may differ from the reference by one rounding step
    # (the two sum the squares in different orders), within KernelTolerance's fp16 bound
    assert_close("rmsnorm", y, kernels.rmsnorm_reference(x.detach(), w.detach()), KernelTolerance()(dtype))
    return x.grad


def _runs(calls, kernel_name):
    return calls.get(f"{kernel_name}.run", 0)


def test_second_call_with_the_same_key_skips_the_autotuner(watched):
    _rmsnorm_step(6, 40)
    fwd, bwd = (k.name for k in TUNED["rmsnorm"])
    assert _runs(watched, fwd) == 1 and _runs(watched, bwd) == 1
    before = dict(watched)
    for _ in range(3):
        _rmsnorm_step(6, 40)  # new tensors, same sizes and dtype: the same key
    assert watched == before, "a call with a remembered key went through the autotuner"
    assert rms._rmsnorm_fwd_kernel.misses >= 1


def test_a_new_key_goes_through_the_autotuner(watched):
    _rmsnorm_step(6, 40)
    fwd = rms._rmsnorm_fwd_kernel.name
    _rmsnorm_step(6, 48)  # a new width
    assert _runs(watched, fwd) == 2
    _rmsnorm_step(7, 48)  # a new row count (the autotuner's key has M too)
    assert _runs(watched, fwd) == 3
    _rmsnorm_step(7, 48, torch.float16)  # a new dtype
    assert _runs(watched, fwd) == 4


def test_a_misaligned_tensor_is_a_new_key(watched):
    """Triton compiles a separate binary for pointers not aligned to 16 bytes: a launcher that
    reused the aligned binary for them would read the wrong addresses."""
    fwd = swi._swiglu_fwd_kernel
    base = torch.randn(5, 2 * 24 + 1, device=DEVICE)
    aligned = base[:, :48]
    kernels.swiglu_packed(aligned)
    assert _runs(watched, fwd.name) == 1
    shifted = base[:, 1:49]  # 4 bytes further: not 16-byte aligned
    out = kernels.swiglu_packed(shifted)
    assert _runs(watched, fwd.name) == 2
    assert_close("swiglu", out, kernels.swiglu_packed_reference(shifted), 1e-5)


@pytest.mark.parametrize("name", sorted(TUNED))
def test_every_kernel_is_tuned_once_per_key_and_keeps_its_results(watched, name):
    g = torch.Generator().manual_seed(3)

    def step():
        if name == "rmsnorm":
            x = torch.randn(5, 24, generator=g).to(DEVICE).requires_grad_()
            w = torch.randn(24, generator=g).to(DEVICE).requires_grad_()
            return kernels.rmsnorm, kernels.rmsnorm_reference, (x, w)
        if name == "swiglu":
            gu = torch.randn(3, 5, 2 * 36, generator=g).to(DEVICE).requires_grad_()
            return kernels.swiglu_packed, kernels.swiglu_packed_reference, (gu,)
        if name == "rope":
            x = torch.randn(2, 3, 7, 16, generator=g).to(DEVICE).requires_grad_()
            angles = torch.randn(9, 8, generator=g).to(DEVICE)
            cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
            return (lambda t: kernels.rope(t, cos, sin)), (lambda t: kernels.rope_reference(t, cos, sin)), (x,)
        q = torch.randn(1, 4, 19, 16, generator=g).to(DEVICE).requires_grad_()
        k = torch.randn(1, 2, 19, 16, generator=g).to(DEVICE).requires_grad_()
        v = torch.randn(1, 2, 19, 16, generator=g).to(DEVICE).requires_grad_()
        return kernels.flash_attention, kernels.flash_attention_reference, (q, k, v)

    for call in range(3):
        fn, ref, inputs = step()
        out = fn(*inputs)
        grad = torch.randn_like(out)
        got = torch.autograd.grad(out, inputs, grad)
        exact = [t.detach().double().requires_grad_() for t in inputs]
        want_out = ref(*exact)
        want = torch.autograd.grad(want_out, exact, grad.double())
        assert_close(f"{name} output, call {call}", out, want_out, 1e-5)
        for i, (a, b) in enumerate(zip(got, want)):
            assert_close(f"{name} gradient {i}, call {call}", a, b, 1e-5)
        for launcher in TUNED[name]:
            keys = 2 if name == "rope" else 1  # the rope kernel runs forward and backward (INVERSE)
            assert _runs(watched, launcher.name) == keys, f"{launcher.name}: autotuner entered on call {call}"


def test_the_launcher_gives_what_a_plain_triton_launch_gives():
    """The remembered launch and Triton's own ``kernel[grid](...)`` write the same values."""
    out_plain, out_ours = torch.empty(3, 100, device=DEVICE), torch.empty(3, 100, device=DEVICE)
    gu = torch.randn(3, 200, device=DEVICE)
    gate, up = gu[:, :100], gu[:, 100:]
    kernel = swi._swiglu_fwd_kernel
    grid = swi._grid(3, 100)
    kernel.autotuner[grid](gate, up, out_plain, gate.stride(0), up.stride(0), 100, 3, 100)
    for _ in range(2):
        kernel(grid, gate, up, out_ours, gate.stride(0), up.stride(0), 100, 3, 100)
    torch.testing.assert_close(out_ours, out_plain, rtol=0, atol=0)


def test_a_constexpr_before_a_runtime_argument_is_refused():
    @triton.jit
    def bad(X, BLOCK: tl.constexpr, N):
        pass

    with pytest.raises(TypeError, match="constexpr"):
        Launcher(bad)


def test_launch_cost_calls_give_the_same_results_both_ways():
    """Each call the launch-cost benchmark times returns the same tensors through the remembered
    launch and through Triton's own path (what the benchmark compares is the same work)."""
    from tinyllama.config import get_preset
    from tinyllama.harness.launch_costs import launch_calls
    from tinyllama.kernels._triton import triton_launch_path

    calls = launch_calls(get_preset("ci").model, torch.float32, torch.device(DEVICE), tokens=5)
    names = [name for name, _, ours, _ in calls if ours]
    assert names == ["rmsnorm_forward", "rmsnorm_backward", "rope_forward", "swiglu_forward", "swiglu_backward",
                     "flash_attention_forward", "flash_attention_backward"]
    for name, launches, ours, call in calls:
        if not ours or name == "rmsnorm_backward":  # that one adds into a running weight-gradient sum
            continue
        remembered = call()
        with triton_launch_path():
            plain = call()
        for a, b in zip(*(r if isinstance(r, tuple) else (r,) for r in (remembered, plain))):
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_the_launch_target_is_judged_on_the_worst_remembered_launch():
    import pandas as pd

    from tinyllama.harness.launch_costs import check_target

    frame = pd.DataFrame([
        {"call": "a", "path": "remembered", "us_per_launch": 12.0},
        {"call": "b", "path": "remembered", "us_per_launch": 24.0},
        {"call": "b", "path": "triton", "us_per_launch": 80.0},
    ])
    assert check_target(frame)["met"] and "b: 24.0 us" in check_target(frame)["measured"]
    frame.loc[0, "us_per_launch"] = 26.0
    assert not check_target(frame)["met"]


def test_an_empty_launch_hook_chain_is_skipped_and_a_filled_one_kept():
    # The direct launch passes no hook (and builds no launch metadata) for an empty chain, but a
    # profiler's hook must still be called: the chain is passed on once it holds one.
    from tinyllama.kernels._triton import _hook

    assert _hook(None) is None

    def hook(metadata):
        return None

    assert _hook(hook) is hook  # a Triton whose hook is a plain function
    try:
        from triton.knobs import HookChain
    except ImportError:  # pragma: no cover - Triton < 3.5 has no chains
        return
    chain = HookChain()
    assert _hook(chain) is None
    chain.add(hook)
    assert _hook(chain) is chain


def test_launch_costs_interleave_their_rounds_and_divide_by_the_yardsticks_of_the_same_run(monkeypatch):
    # Each round times every call once (a host that slows down mid-run slows every row alike), and
    # vs_plain / vs_rms_norm are each row's time per launch over the yardsticks' of the same run.
    from tinyllama.costs.kernel_costs import LaunchCost
    from tinyllama.harness import launch_costs as lc
    from tinyllama.timing import summarize

    order = []
    host_us = {lc.PLAIN: 10.0, "ours": 30.0, lc.TORCH: 20.0}

    def fake_calls(config, dtype, device, tokens):
        return [(lc.PLAIN, 1, False, lambda: lc.PLAIN), ("ours", 2, True, lambda: "ours"),
                (lc.TORCH, 1, False, lambda: lc.TORCH)]

    def fake_cost(call, device, calls, repeat, warmup):
        name = call()
        order.append(name)
        stats = summarize([host_us[name] * (len(order) // 4 + 1)])  # the host slows down round by round
        return LaunchCost(stats, stats, calls)

    monkeypatch.setattr(lc, "launch_calls", fake_calls)
    monkeypatch.setattr(lc, "host_us_per_call", fake_cost)
    frame = lc.measure_launch_costs("ci", torch.float32, torch.device("cpu"), repeat=2)
    assert order == [lc.PLAIN, "ours", "ours", lc.TORCH] * 2  # "ours" twice: remembered, then Triton's path
    rows = frame.set_index(["call", "path"])
    assert rows.loc[(lc.PLAIN, "-"), "vs_plain"] == 1.0 and rows.loc[(lc.TORCH, "-"), "vs_rms_norm"] == 1.0
    mine = rows.loc[("ours", "remembered")]
    assert mine["us_per_launch"] == mine["host_us_median"] / 2
    assert mine["vs_plain"] == pytest.approx(mine["us_per_launch"] / rows.loc[(lc.PLAIN, "-"), "us_per_launch"])
    assert "x an F.rms_norm call of the same run" in lc.check_target(frame)["measured"]
