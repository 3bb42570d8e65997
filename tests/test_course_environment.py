"""The checks of notebook 00: profilers found on PATH, rates judged against datasheet peaks,
correctness against float64, and the overall verdict."""

import stat

import pytest
import torch

from tinyllama import device as dev
from tinyllama.costs.ceilings import Ceiling
from tinyllama.course import environment as env
from tinyllama.course.profile import PROFILES
from tinyllama.timing import summarize


def _fake_tools(tmp_path, *names):
    for name in names:
        path = tmp_path / name
        path.write_text("#!/bin/sh\nexit 0\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_vendor_profilers_are_found_on_path(monkeypatch, tmp_path):
    _fake_tools(tmp_path, "ncu", "rocprof-sys-run")
    monkeypatch.setenv("PATH", str(tmp_path))
    found = env.find_vendor_profilers()
    assert set(found) == {"rocprofv3", "rocprof-sys", "rocprof-compute", "nsys", "ncu"}
    assert found["ncu"] == str(tmp_path / "ncu") and found["rocprof-sys"] == str(tmp_path / "rocprof-sys-run")
    assert found["nsys"] is None and found["rocprofv3"] is None


def test_profiler_checks_follow_the_back_end(monkeypatch, tmp_path):
    _fake_tools(tmp_path, "ncu")
    monkeypatch.setenv("PATH", str(tmp_path))
    cuda = {c.name: c.status for c in env.check_profilers("cuda")}
    assert cuda == {"torch.profiler": "PASS", "nsys": "WARN", "ncu": "PASS"}
    rocm = {c.name: c.status for c in env.check_profilers("rocm")}
    assert rocm == {"torch.profiler": "PASS", "rocprofv3": "WARN", "rocprof-sys": "WARN", "rocprof-compute": "WARN"}
    assert all(c.status == "PASS" for c in env.check_profilers("cpu"))


def _ceiling(kind, precision, value, size=8192):
    return Ceiling(kind, precision, value, "TFLOP/s" if kind == "matmul" else "TB/s", size, summarize([1.0]))


@pytest.mark.parametrize("value, status", [(600.0, "PASS"), (50.0, "WARN"), (2000.0, "FAIL"), (0.0, "FAIL")])
def test_matmul_rate_is_judged_against_the_datasheet_peak(monkeypatch, value, status):
    monkeypatch.setattr(env.dev, "device_peaks", lambda device=None: dev.lookup_peaks("NVIDIA H100 80GB HBM3"))
    check = env.check_matmul_rate(_ceiling("matmul", "bf16", value), torch.device("cpu"))
    assert check.status == status, check
    assert "989.4" in check.detail or status == "FAIL"


def test_copy_rate_above_bandwidth_means_wrong_timing(monkeypatch):
    monkeypatch.setattr(env.dev, "device_peaks", lambda device=None: dev.lookup_peaks("NVIDIA H200"))
    check = env.check_copy_rate(_ceiling("copy", "any", 9.0, size=2**30), torch.device("cpu"))
    assert check.status == "FAIL" and "timing is wrong" in check.detail
    assert env.check_copy_rate(_ceiling("copy", "any", 3.9, 2**30), torch.device("cpu")).status == "PASS"


def test_rate_without_a_peak_passes_when_positive():
    check = env.check_matmul_rate(_ceiling("matmul", "fp32", 0.1, 256), torch.device("cpu"))
    assert check.status == "PASS" and "no datasheet peak" in check.detail


@pytest.mark.parametrize("precision", list(env.MATMUL_TOLERANCE))
def test_matmul_is_correct_on_the_cpu_within_its_tolerance(precision):
    assert env.matmul_relative_error(precision, torch.device("cpu")) < env.MATMUL_TOLERANCE[precision]


def test_tolerances_tell_precisions_apart():
    # bf16 really rounds: its error would fail the fp32 tolerance, so the fp32 check can catch a
    # device that silently computes fp32 products in a lower precision.
    assert env.matmul_relative_error("bf16", torch.device("cpu")) > env.MATMUL_TOLERANCE["fp32"]
    with pytest.raises(ValueError, match="unknown precision"):
        env.matmul_relative_error("int8", torch.device("cpu"))


def test_copy_is_exact_on_the_cpu():
    assert env.copy_is_exact(torch.device("cpu"))


def test_missing_or_old_packages(monkeypatch):
    versions = {"torch": "2.4.1", "deepspeed": None, "torchvision": None}
    monkeypatch.setattr(env, "package_version", lambda name: versions.get(name, "9.9"))
    status = {c.name: c.status for c in env.check_packages()}
    assert status["torch"] == "FAIL" and status["torchvision"] == "FAIL"
    assert status["deepspeed"] == "WARN" and status["triton"] == "PASS"


def test_installed_versions_are_read():
    assert env.package_version("torch") == torch.__version__
    assert env.package_version("surely-not-installed-package") is None


def test_memory_check_on_the_cpu():
    assert env.check_memory(PROFILES["ci"], torch.device("cpu")).status == "PASS"


def test_verdict():
    ok = env.Check("torch", "PASS", "2.6")
    warn = env.Check("nsys", "WARN", "missing")
    fail = env.Check("matmul", "FAIL", "too fast")
    assert env.verdict([ok, warn, fail], backend="cuda")[0] == "FAIL"
    assert "fix matmul" in env.verdict([ok, fail], backend="cpu")[1]
    assert env.verdict([ok], backend="cpu") == ("WARN", env.verdict([ok], backend="cpu")[1])
    assert "ci profile only" in env.verdict([ok], backend="cpu")[1]
    assert env.verdict([ok, warn], backend="rocm")[0] == "WARN"
    assert env.verdict([ok], backend="cuda") == ("PASS", "READY: every check passed.")
    table = env.checks_table([ok, warn])
    assert list(table.columns) == ["check", "verdict", "detail"] and list(table.verdict) == ["PASS", "WARN"]
