"""Checkpoints print PASS/CHECK with a reason, return a bool, and raise under WORKSHOP_STRICT=1."""

import math

import pytest
import torch

from tinyllama.course import checkpoints as cp


@pytest.fixture(autouse=True)
def lenient(monkeypatch):
    monkeypatch.delenv("WORKSHOP_STRICT", raising=False)


def test_checkpoint_passes_and_fails_with_reason(capsys):
    assert cp.checkpoint(True, "all good", "look again") is True
    assert cp.checkpoint(False, "all good", "look again") is False
    assert capsys.readouterr().out == "PASS: all good\nCHECK: look again\n"


def test_strict_mode_raises_only_on_failure(monkeypatch):
    monkeypatch.setenv("WORKSHOP_STRICT", "1")
    assert cp.checkpoint(True, "ok", "bad") is True
    with pytest.raises(cp.CheckpointFailed, match="bad"):
        cp.checkpoint(False, "ok", "bad")


def test_check_between_names_the_side(capsys):
    assert cp.check_between("rate", 5.0, 1.0, 10.0, "TB/s")
    assert not cp.check_between("rate", 12.0, 1.0, 10.0, "TB/s", hint="the timing is wrong")
    assert not cp.check_between("rate", 0.5, 1.0, 10.0)
    assert not cp.check_between("rate", math.nan, 1.0, 10.0)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("PASS: rate = 5 TB/s is plausible")
    assert out[1] == ("CHECK: rate = 12 TB/s is above the plausible range 1 .. 10 TB/s (1.2x above the bound). "
                      "the timing is wrong")
    assert "is below the plausible range" in out[2] and out[3].startswith("CHECK")


def test_check_close_and_equal():
    assert cp.check_close("loss", 6.93, math.log(1000), rel_tol=0.01)
    assert not cp.check_close("loss", 942.0, math.log(1000), rel_tol=0.01)
    assert not cp.check_close("loss", math.nan, 1.0)
    assert cp.check_equal("parameters", 1234, 1234)
    assert not cp.check_equal("parameters", 1234, 1235)


def test_check_faster(capsys):
    assert cp.check_faster("compiled", new_ms=5.0, old_ms=10.0, min_speedup=1.5)
    assert not cp.check_faster("compiled", new_ms=9.0, old_ms=10.0, min_speedup=1.5)
    assert "1.11x" in capsys.readouterr().out


def test_check_allclose(capsys):
    a = torch.randn(5, 7)
    assert cp.check_allclose("output", a + 1e-9, a)
    assert not cp.check_allclose("output", a + 1e-2, a, rtol=1e-4, atol=1e-4)
    assert not cp.check_allclose("output", a[:, :6], a)
    out = capsys.readouterr().out
    assert "largest difference 0.01" in out and "shape (5, 6) differs from the reference (5, 7)" in out
