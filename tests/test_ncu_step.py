"""ncu on a training step (``tinyllama.profiling.ncu_step``, used by benchmarks/gpu/profiling_gpu.py), run
against a stand-in ncu that writes a sample in ncu's format."""

import stat
import sys
from pathlib import Path

import pytest

from tinyllama.profiling.ncu_step import KNOWN_GEMM, profile_step_with_ncu

DATA = Path(__file__).parent / "data"


def _fake_ncu(folder: Path, body: str) -> None:
    script = folder / "ncu"
    script.write_text(f"#!{sys.executable}\nimport shutil, sys\nargs = sys.argv[1:]\n"
                      "if args == ['--version']:\n    print('Version 2024.3.0.0'); sys.exit(0)\n" + body + "\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_ncu_results_are_read_and_the_known_gemm_checked(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # Writes the sample where --log-file points; fails like an old ncu when asked for tensor counters.
    _fake_ncu(bin_dir, f"""
metrics = args[args.index('--metrics') + 1]
if 'sm__ops_path_tensor' in metrics:
    print('==ERROR== Failed to find metric sm__ops_path_tensor_src_bf16_dst_fp32.sum'); sys.exit(1)
assert '--profile-from-start' in args and args[args.index('--launch-count') + 1] == '7'
shutil.copy({str(DATA / 'ncu_details.csv')!r}, args[args.index('--log-file') + 1])
""")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    out = tmp_path / "out"
    out.mkdir()
    result = profile_step_with_ncu("v1", "ci", "bf16", 7, out, timeout_s=60)
    assert "Failed to find metric" in result["tensor_counters_error"]  # first try, with tensor counters
    assert (out / "ncu_v1.csv").exists() and result["kernels_profiled"] == 3
    gemm = result["known_gemm"]
    assert gemm["counted_flops"] == 2 * 2048**3 + 2 * 4_194_304  # the sample's GEMM is 2048^3
    assert gemm["ratio"] == pytest.approx((2 * 2048**3 + 2 * 4_194_304) / (2 * KNOWN_GEMM**3))
    assert len(result["points"]) == 2  # the step's kernels, after the GEMM


def test_a_failing_ncu_is_reported_with_its_message(tmp_path, monkeypatch):
    _fake_ncu(tmp_path, "print('==ERROR== ERR_NVGPUCTRPERM - The user does not have permission'); sys.exit(1)")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    with pytest.raises(RuntimeError, match="ERR_NVGPUCTRPERM"):
        profile_step_with_ncu("v1", "ci", "bf16", 5, tmp_path, timeout_s=60)


def test_the_kernels_that_take_the_time_are_selected_and_the_known_gemm_profiled_apart(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    # The known GEMM's run: the whole range, no kernel filter; the step's run: the kernel filter, the step alone.
    _fake_ncu(bin_dir, f"""
with open({str(calls)!r}, 'a') as f:
    f.write(' '.join(args) + '\\n')
part = args[args.index('--part') + 1]
if part == 'gemm':
    assert '--kernel-name' not in args
else:
    assert part == 'step' and args[args.index('--launch-count') + 1] == '7'
    assert args[args.index('--kernel-name') + 1] == 'regex:^(cunn_SoftMaxForward|vectorized_elementwise_kernel)$'
shutil.copy({str(DATA / 'ncu_details.csv')!r}, args[args.index('--log-file') + 1])
""")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    kernels = ["void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)",
               "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float *, const float *, int)"]
    result = profile_step_with_ncu("v1", "ci", "bf16", 7, tmp_path, timeout_s=60, kernels=kernels)
    lines = calls.read_text().splitlines()
    assert len(lines) == 2 and "--part gemm" in lines[0] and "--part step" in lines[1]
    assert result["selected"] == kernels and "regex:" in result["command"]
    assert result["known_gemm"]["counted_flops"] == 2 * 2048**3 + 2 * 4_194_304  # the GEMM run's largest kernel
    assert len(result["points"]) == 3  # every launch of the step's run is the step's
