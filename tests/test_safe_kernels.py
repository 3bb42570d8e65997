"""Issue 32, safe kernels: ``check_function(..., guard=True)`` runs a participant's Triton kernel so that a
missing mask gives a message naming the load or the store, instead of a crash (the interpreter writing
into the heap) or an illegal address (a poisoned CUDA context).

On the CPU the kernels run through the interpreter, in fp32, where every load and store is also checked
as it happens; ``guards_only`` runs the same checks with what a GPU run has, the guarded buffers alone."""

import functools

import pytest
import torch
import triton
import triton.language as tl

from tinyllama import course
from tinyllama.course import feedback, guards
from tinyllama.kernels import INTERPRET, rmsnorm_reference

pytestmark = pytest.mark.usefixtures("lenient")
# The kernel tests below launch on CPU tensors: they need the interpreter (the GPU test is the last one).
interpreted = pytest.mark.skipif(not INTERPRET, reason="runs Triton kernels through the interpreter, on the CPU")

LENGTHS = [(15,), (700,), (8481,)]  # the ci profile's check lengths: none a multiple of the block
ROWS = [(3, 5), (7, 100), (33, 257)]


@triton.jit
def _add(X, Y, OUT, n, BLOCK: tl.constexpr, MASK_LOADS: tl.constexpr, MASK_STORE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_range = offsets < n
    if MASK_LOADS:
        x = tl.load(X + offsets, mask=in_range)
        y = tl.load(Y + offsets, mask=in_range)
    else:
        x = tl.load(X + offsets)
        y = tl.load(Y + offsets)
    if MASK_STORE:
        tl.store(OUT + offsets, x + y, mask=in_range)
    else:
        tl.store(OUT + offsets, x + y)


def _adder(mask_loads=True, mask_store=True):
    def add(x, y, block=1024):  # as notebook 13's launcher: the output from torch.empty_like, n the true length
        out = torch.empty_like(x)
        _add[(triton.cdiv(x.numel(), block),)](x, y, out, x.numel(), BLOCK=block, MASK_LOADS=mask_loads,
                                               MASK_STORE=mask_store)
        return out
    return add


@triton.jit
def _rmsnorm(X, W, Y, stride_x, stride_y, N, eps, BLOCK_N: tl.constexpr, MASK_LOAD: tl.constexpr,
             MASK_STORE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    in_row = cols < N
    if MASK_LOAD:
        x = tl.load(X + row * stride_x + cols, mask=in_row, other=0.0).to(tl.float32)
    else:  # the lanes past N read whatever follows the row
        x = tl.load(X + row * stride_x + cols).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(W + cols, mask=in_row, other=0.0).to(tl.float32)
    if MASK_STORE:
        tl.store(Y + row * stride_y + cols, x * rstd * w, mask=in_row)
    else:
        tl.store(Y + row * stride_y + cols, x * rstd * w)


def _row_norm(mask_load=True, mask_store=True):
    def my_rmsnorm(x, weight, eps=1e-5):  # as notebook 13's launcher: one program per row, torch.empty output
        M, N = x.shape
        y = torch.empty((M, N), dtype=x.dtype, device=x.device)
        _rmsnorm[(M,)](x, weight, y, x.stride(0), y.stride(0), N, eps, BLOCK_N=triton.next_power_of_2(N),
                       MASK_LOAD=mask_load, MASK_STORE=mask_store)
        return y
    return my_rmsnorm


def _vectors(device="cpu"):
    return lambda shape: [torch.randn(shape, device=device) for _ in range(2)]


def _rows(device="cpu"):
    def make(shape):  # as notebook 13's check: views whose rows lie width + 3 apart
        rows, width = shape
        return torch.randn(rows, width + 3, device=device)[:, :width], 1 + 0.1 * torch.randn(width, device=device)
    return make


@pytest.fixture(params=["interpreter", "guards_only"])
def watch(request, monkeypatch):
    """Each check twice: with the interpreter's per-access check, and with the guards alone (a GPU's view)."""
    if request.param == "guards_only":
        monkeypatch.setattr(feedback, "Guards", functools.partial(guards.Guards, watch_interpreter=False))
    return request.param


def _check_add(kernel, device="cpu"):
    return course.check_function("add_kernel", kernel, torch.add, _vectors(device), LENGTHS, atol=0.0, rtol=0.0,
                                 seed=3, guard=True)


def _check_rows(kernel, device="cpu"):
    return course.check_function("rmsnorm_kernel", kernel, rmsnorm_reference, _rows(device), ROWS, atol=1e-5,
                                 rtol=1e-5, seed=3, guard=True)


def _heap_still_sound():
    """Memory that a stray store would have corrupted still allocates, computes and frees."""
    chunks = [torch.randn(n) for n in (7, 1000, 100_000) for _ in range(20)]
    assert all(torch.isfinite(c).all() for c in chunks)


def _interpreter_unpatched():
    from triton.runtime.interpreter import interpreter_builder
    return not {"create_masked_load", "create_masked_store"} & set(vars(interpreter_builder))


@interpreted
def test_the_reference_add_kernel_passes(watch, capsys):
    assert _check_add(_adder())
    assert capsys.readouterr().out.startswith("PASS: add_kernel agrees")


@interpreted
def test_a_store_without_mask_is_named_not_a_crash(watch, capsys):
    assert not _check_add(_adder(mask_store=False))
    out = capsys.readouterr().out
    assert "outside the tensor `add` made with torch.empty_like (up to 1,009 elements past its end)" in out
    assert "is every tl.store masked (mask=offsets < n)?" in out
    assert "tl.load" not in out
    assert _interpreter_unpatched()
    _heap_still_sound()


@interpreted
def test_loads_without_mask_are_named(capsys):
    # The store's mask drops the lanes past the end, so only the interpreter's check sees these loads;
    # on a GPU they read the guard and change nothing (see test_the_load_guard_...).
    assert not _check_add(_adder(mask_loads=False))
    out = capsys.readouterr().out
    assert "your kernel read outside `x` (up to 1,009 elements past its end)" in out
    assert "outside `y`" in out and "is every tl.load masked (mask=offsets < n, other=0.0)?" in out
    assert "tl.store masked" not in out
    _heap_still_sound()


@interpreted
def test_no_mask_at_all_names_loads_and_store(watch, capsys):
    assert not _check_add(_adder(mask_loads=False, mask_store=False))
    out = capsys.readouterr().out
    assert "is every tl.store masked" in out
    _heap_still_sound()


@interpreted
def test_the_reference_row_kernel_passes(watch, capsys):
    assert _check_rows(_row_norm())
    assert capsys.readouterr().out.startswith("PASS: rmsnorm_kernel agrees")


@interpreted
def test_a_row_load_without_column_mask_is_named(watch, capsys):
    assert not _check_rows(_row_norm(mask_load=False))
    out = capsys.readouterr().out
    assert "is every tl.load masked (mask=offsets < n, other=0.0)?" in out
    if watch == "interpreter":  # the last row reads past the end of x
        assert "your kernel read outside `x` (up to 255 elements past its end)" in out  # 257 -> 512 lanes
    else:  # every row reads the NaN between the rows of x: the whole result is NaN
        assert "8,481 elements are NaN where the reference is finite" in out
    assert "tl.store masked" not in out
    _heap_still_sound()


@interpreted
def test_a_row_store_without_column_mask_is_named(watch, capsys):
    assert not _check_rows(_row_norm(mask_store=False))
    out = capsys.readouterr().out
    assert "outside the tensor `my_rmsnorm` made with torch.empty (up to 255 elements past its end)" in out
    assert "is every tl.store masked" in out and "tl.load masked" not in out
    _heap_still_sound()


def test_guard_changes_nothing_for_a_pytorch_function_or_the_reference(capsys):
    seen = []

    def reference(x, y):
        seen.append(x.untyped_storage().nbytes() == x.numel() * 4)  # the reference gets the inputs as made
        return x + y

    def candidate(x, y):
        out = torch.empty_like(x)
        torch.add(x, y, out=out)
        return out.clone()

    assert course.check_function("add", candidate, reference, _vectors(), LENGTHS, atol=0.0, rtol=0.0, guard=True)
    assert all(seen) and _interpreter_unpatched()


@pytest.mark.gpu
def test_on_the_gpu_missing_masks_are_named_and_the_context_survives(capsys):
    assert _check_add(_adder(), "cuda") and _check_rows(_row_norm(), "cuda")
    capsys.readouterr()
    assert not _check_add(_adder(mask_store=False), "cuda")
    assert "is every tl.store masked (mask=offsets < n)?" in capsys.readouterr().out
    # Right result (the store drops the lanes read from the guard), but the compiled kernel's IR shows the loads.
    assert not _check_add(_adder(mask_loads=False), "cuda")
    assert "has no mask" in capsys.readouterr().out
    assert not _check_rows(_row_norm(mask_load=False), "cuda")
    assert "has no mask" in capsys.readouterr().out  # from the IR; the NaN it read reaches the result too
    assert not _check_add(_adder(mask_loads=False, mask_store=False), "cuda")
    assert "is every tl.store masked" in capsys.readouterr().out
    torch.cuda.synchronize()  # an illegal address would raise here, and in every CUDA call after it
    x = torch.arange(1000.0, device="cuda")
    assert float((x * 2).sum()) == 999_000.0
