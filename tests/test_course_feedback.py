"""The exercise checks catch the mistakes participants make and say where to look."""

import math

import pytest
import torch

from tinyllama import course
from tinyllama.course import checkpoints as cp
from tinyllama.course.feedback import compare_outputs, ratio_with_spread

SHAPES = [(3, 5), (7, 100), (33, 257)]


@pytest.fixture(autouse=True)
def lenient(monkeypatch):
    """Checks print here; under WORKSHOP_STRICT=1 (set by `course.sh test`) they would raise."""
    monkeypatch.delenv("WORKSHOP_STRICT", raising=False)


def _rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _inputs(shape):
    return torch.randn(shape), torch.rand(shape[-1]) + 0.5


def test_a_correct_function_passes_on_odd_shapes(capsys):
    assert course.check_function("rms_norm", lambda x, w: _rms_norm(x.clone(), w), _rms_norm, _inputs, SHAPES)
    assert capsys.readouterr().out.startswith("PASS: rms_norm agrees with the reference")


def test_a_factor_off_is_named(capsys):
    assert not course.check_function("rms_norm", lambda x, w: 2 * _rms_norm(x, w), _rms_norm, _inputs, SHAPES)
    out = capsys.readouterr().out
    assert "CHECK: rms_norm differs from the reference on 3 check(s)" in out
    assert "2 x the reference everywhere" in out


def test_a_forgotten_square_root_is_caught_but_not_called_a_constant_factor(capsys):
    def no_sqrt(x, w, eps=1e-6):
        return x / (x.pow(2).mean(-1, keepdim=True) + eps) * w
    assert not course.check_function("rms_norm", no_sqrt, _rms_norm, _inputs, SHAPES)
    out = capsys.readouterr().out
    assert "elements" in out and "are off" in out and "x the reference everywhere" not in out


def test_a_wrong_mask_points_at_the_tail_columns():
    expected = torch.randn(7, 100)
    actual = expected.clone()
    actual[:, 64:] = 0.0  # a block of 64 with the tail never written
    mismatch = compare_outputs(actual, expected, 1e-5, 1e-5, "y")
    assert not mismatch.ok
    assert mismatch.worst_index[1] >= 64 and mismatch.share_off == pytest.approx(36 / 100, abs=0.02)
    assert "columns 64..99 of 100" in mismatch.describe()


def test_a_transposed_result_is_named_by_shape_and_by_value():
    expected = torch.randn(5, 9)
    assert "transposed" in compare_outputs(expected.t(), expected).describe()
    square = torch.randn(6, 6)
    described = compare_outputs(square.t(), square).describe()
    assert "equals the reference transposed" in described


def test_nan_counts_as_off_and_is_explained():
    expected = torch.randn(4, 10)
    actual = expected.clone()
    actual[2, 3] = math.nan
    mismatch = compare_outputs(actual, expected)
    assert not mismatch.ok and mismatch.off == 1 and mismatch.worst_index == (2, 3)
    assert "NaN or inf" in mismatch.describe()


def test_every_shape_gets_fresh_inputs_and_the_notebook_generator_is_untouched():
    seen = []
    torch.manual_seed(123)
    before = torch.get_rng_state()
    course.check_function("identity", lambda x: x, lambda x: x,
                          lambda shape: seen.append(torch.randn(shape)) or (seen[-1],), [(4,), (4,)], seed=7)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(seen[0], seen[1])  # one seed per check, named in its feedback to reproduce it


def test_a_crash_in_the_candidate_is_reported_per_shape(capsys):
    def broken(x, w):
        raise IndexError("block out of range")
    assert not course.check_function("rms_norm", broken, _rms_norm, _inputs, [(2, 3)])
    assert "shape (2, 3): IndexError: block out of range" in capsys.readouterr().out


def test_an_unwritten_exercise_is_not_hidden_as_a_mismatch():
    def todo(x, w):
        raise NotImplementedError("exercise 13.2")
    with pytest.raises(NotImplementedError):
        course.check_function("rms_norm", todo, _rms_norm, _inputs, [(2, 3)])


def test_strict_mode_fails_the_notebook(monkeypatch):
    monkeypatch.setenv("WORKSHOP_STRICT", "1")
    with pytest.raises(cp.CheckpointFailed, match="differs from the reference"):
        course.check_function("rms_norm", lambda x, w: x, _rms_norm, _inputs, [(2, 3)])


def test_check_between_gives_the_factor_and_the_reason(capsys):
    assert not cp.check_between("FLOPs per token", 6e9, 1e6, 1e7, why="6 x parameters for a training step")
    out = capsys.readouterr().out
    assert "(600x above the bound)" in out and "6 x parameters" in out


def test_ratio_uses_medians_and_reports_the_spread(capsys):
    slow, fast = [10.0, 11.0, 10.5, 30.0], [5.0, 5.1, 4.9, 5.0]
    lo, ratio, hi = ratio_with_spread(slow, fast)
    assert ratio == pytest.approx(10.75 / 5.0) and lo < ratio < hi
    assert course.check_ratio("speed-up", slow, fast, 1.5, 3.0)
    assert not course.check_ratio("speed-up", fast, slow, 1.5)
    out = capsys.readouterr().out
    assert "PASS: speed-up = 2.15" in out and "CHECK: speed-up = 0.465" in out


def test_prediction_is_compared_and_never_fails(capsys, monkeypatch):
    monkeypatch.setenv("WORKSHOP_STRICT", "1")
    assert course.compare_prediction("backward / forward", 2.0, 4.1) == pytest.approx(2.05)
    assert course.compare_prediction("backward / forward", None, 4.1) is None
    out = capsys.readouterr().out
    assert "2.05x your prediction" in out and "no prediction was written" in out


def test_an_output_never_written_is_called_all_zeros_not_a_factor():
    described = compare_outputs(torch.zeros(3, 7), torch.randn(3, 7)).describe()
    assert "all zeros" in described and "x the reference everywhere" not in described


def test_a_ratio_on_the_other_side_of_one_is_called_out(capsys):
    course.compare_prediction("gate/up fusion speed-up", 1.05, 0.96, "x")
    course.compare_prediction("QKV fusion speed-up", 1.05, 1.03, "x")
    out = capsys.readouterr().out.splitlines()
    assert "the opposite of your prediction" in out[0] and "close to your prediction" in out[1]
