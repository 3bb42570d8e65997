"""Notebook 13 (Triton basics): the cost helpers it uses, and that each exercise's check catches a
plausible wrong answer; every exercise of the solution notebook can be revealed and runs."""

import pytest
import torch
import triton
import triton.language as tl

from tinyllama import course, kernel_costs
from tinyllama.course.reveal import reveal
from tinyllama.kernels import rmsnorm_reference

pytestmark = pytest.mark.usefixtures("lenient")

SHAPES = [(3, 5), (7, 100), (33, 257)]


# ---- the library helpers --------------------------------------------------------------------------

def test_rmsnorm_bytes_reads_x_and_weight_and_writes_y():
    assert kernel_costs.rmsnorm_forward_bytes(8192, 1024, 2) == 2 * 8192 * 1024 * 2 + 1024 * 2
    assert kernel_costs.rmsnorm_forward_bytes(7, 100, 2, weight_itemsize=4) == 2 * 700 * 2 + 400
    with pytest.raises(ValueError):
        kernel_costs.rmsnorm_forward_bytes(-1, 100, 2)


def test_bandwidth_and_launch_bound_units():
    assert kernel_costs.achieved_tbs(3e12, 1000.0) == pytest.approx(3.0)
    assert kernel_costs.launch_bound_bytes(20.0, 3.0) == pytest.approx(60e6)
    with pytest.raises(ValueError, match="synchronize"):
        kernel_costs.achieved_tbs(1e6, 0.0)


def test_host_time_per_call_and_device_time_on_the_cpu():
    x = torch.randn(64)
    cost = kernel_costs.host_us_per_call(lambda: x.sum(), "cpu", calls=20, repeat=3, warmup=1)
    assert cost.calls == 20 and cost.host_us.n == 3 and 0 < cost.host_us.median <= cost.wall_us.median
    assert cost.host_bound  # on the CPU the host does the work: nothing runs after the loop
    assert kernel_costs.device_ms(lambda: x.sum(), "cpu", warmup=1, repeat=3).n == 3
    with pytest.raises(ValueError):
        kernel_costs.host_us_per_call(lambda: None, "cpu", calls=0)


# ---- exercise 13.4 / 13.5: numbers off by a factor fail, and say by how much -------------------------

def _bytes_check(value, rows=8192, width=1024, itemsize=2):
    expected = kernel_costs.rmsnorm_forward_bytes(rows, width, itemsize)
    return course.check_between("rmsnorm_bytes", value, expected * 0.999, expected * 1.001, unit="bytes")


def test_bytes_check_catches_a_forgotten_write_and_elements_for_bytes(capsys):
    assert _bytes_check(kernel_costs.rmsnorm_forward_bytes(8192, 1024, 2))
    assert not _bytes_check(8192 * 1024 * 2 + 1024 * 2)  # y's write forgotten
    assert "below the bound" in capsys.readouterr().out
    assert not _bytes_check(2 * 8192 * 1024 + 1024)  # elements, not bytes
    assert not _bytes_check(2 * (2 * 8192 * 1024 * 2 + 1024 * 2))  # each element counted read and written


def test_launch_bound_check_catches_an_unconverted_unit(capsys):
    expected = kernel_costs.launch_bound_bytes(20.0, 3.0) / 2**20
    wrong = 20.0 * 3.0 / 2**20  # microseconds times TB/s, unconverted
    assert not course.check_between("launch_bound_mib", wrong, expected * 0.99, expected * 1.01)
    assert "9.9e+05x below the bound" in capsys.readouterr().out  # the bound is 1% under the answer


# ---- exercise 13.2: wrong RMSNorm kernels fail the notebook's check with a pointed note --------------

@triton.jit
def _rmsnorm_variant(X, W, Y, stride_x, stride_y, N, eps, BLOCK_N: tl.constexpr, MISTAKE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    in_row = cols < N
    if MISTAKE == 2:  # rows assumed to lie N apart
        x = tl.load(X + row * N + cols, mask=in_row, other=0.0).to(tl.float32)
    else:
        x = tl.load(X + row * stride_x + cols, mask=in_row, other=0.0).to(tl.float32)
    if MISTAKE == 1:  # mean over the padded block
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / BLOCK_N + eps)
    else:
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(W + cols, mask=in_row, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=in_row)


def _launcher(mistake):
    def run(x, weight, eps=1e-5):
        M, N = x.shape
        y = torch.empty((M, N), dtype=x.dtype)
        _rmsnorm_variant[(M,)](x, weight, y, x.stride(0), y.stride(0), N, eps, BLOCK_N=triton.next_power_of_2(N),
                               MISTAKE=mistake)
        return y
    return run


def _rows(shape):  # as the notebook's check makes them: views whose rows lie width + 3 apart
    rows, width = shape
    return torch.randn(rows, width + 3)[:, :width], 1 + 0.1 * torch.randn(width)


def test_rmsnorm_check_passes_the_right_kernel_and_names_each_mistake(capsys):
    check = lambda mistake: course.check_function("rmsnorm_kernel", _launcher(mistake), rmsnorm_reference, _rows,
                                                  SHAPES, atol=1e-5, rtol=1e-5, seed=1, guard=True)
    assert check(0)
    assert not check(1)
    assert "x the reference everywhere" in capsys.readouterr().out  # mean over BLOCK_N: a constant factor
    assert not check(2)
    assert "the wrong elements lie only in rows" in capsys.readouterr().out  # the row stride


# ---- the solution notebook: every exercise can be revealed ---------------------------------------------

def test_every_exercise_reveals_and_its_kernels_run(capsys):
    namespace = {"torch": torch, "triton": triton, "tl": tl}
    for exercise in ("13.1", "13.2", "13.3", "13.4"):
        assert reveal(exercise, namespace)
    assert reveal("13.5", run=False)  # needs the notebook's measurements to run
    x, y = torch.randn(1000), torch.randn(1000)
    assert torch.equal(namespace["add"](x, y), x + y)
    rows, weight = _rows((5, 100))
    assert torch.allclose(namespace["my_rmsnorm"](rows, weight), rmsnorm_reference(rows, weight), atol=1e-5)
    gate_up = torch.randn(3, 2 * 37)
    assert torch.allclose(namespace["my_swiglu"](gate_up[:, :37], gate_up[:, 37:]),
                          torch.nn.functional.silu(gate_up[:, :37]) * gate_up[:, 37:], atol=1e-5)
    assert namespace["rmsnorm_bytes"](7, 100, 4) == kernel_costs.rmsnorm_forward_bytes(7, 100, 4)
