"""Vendor profilers: detection, command lines and the parsers, on sample files in the documented formats."""

import os
import stat
import sys
from pathlib import Path

import pandas as pd
import pytest

from tinyllama.profiling import vendor

DATA = Path(__file__).parent / "data"
GEMM_FLOPS = 2 * 2048**3
GEMM_BYTES_MB = 16.78 + 8.39


# --- detection -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("NVIDIA (R) Nsight Compute Command Line Profiler\nCopyright (c) 2018-2024 NVIDIA Corporation\n"
     "Version 2024.1.1.0 (build 33998838) (public-release)", "2024.1.1.0"),
    ("NVIDIA Nsight Systems version 2024.2.1.106-242134037904v0", "2024.2.1.106"),
    ("rocprofv3 version: 0.6.0", "0.6.0"),
    ("rocprofiler-compute version: 3.1.0 (release)", "3.1.0"),
    ("[rocprof-sys-sample] v1.0.0 (rev: abc, compiler: GNU v11.4.0)", "1.0.0"),
    ("no version here", None),
])
def test_versions_are_read_from_the_tools_banners(text, expected):
    assert vendor.parse_version(text) == expected


def _fake_tool(folder: Path, name: str, output: str, status: int = 0) -> None:
    script = folder / name
    script.write_text(f"#!/bin/sh\necho '{output}'\nexit {status}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_detection_reports_version_path_and_missing_tools(tmp_path, monkeypatch):
    _fake_tool(tmp_path, "ncu", "Copyright (c) 2018-2024 NVIDIA\nVersion 2024.3.2.0 (build 1)")
    _fake_tool(tmp_path, "nsys", "nsys: error while loading shared libraries", status=127)
    monkeypatch.setenv("PATH", str(tmp_path))
    table = vendor.detect_tools().set_index("tool")
    assert list(table.index) == list(vendor.TOOLS)
    assert table.loc["ncu", "available"] and table.loc["ncu", "version"] == "2024.3.2.0"
    assert table.loc["ncu", "path"] == str(tmp_path / "ncu")
    # present but broken: found, not available, and the error is kept
    assert not table.loc["nsys", "available"] and "shared libraries" in table.loc["nsys", "message"]
    assert not table.loc["rocprofv3", "available"]
    assert "not found" in table.loc["rocprofv3", "message"] and "ROCm" in table.loc["rocprofv3", "message"]
    with pytest.raises(ValueError, match="unknown profiler"):
        vendor.detect_tool("vtune")


# --- command lines ---------------------------------------------------------------------------------

TARGET = ["python", "-m", "tinyllama.harness.bench", "--preset", "tiny", "--num-steps", "5"]


def test_rocm_commands_follow_the_workshop(tmp_path):
    stats = vendor.build_command("kernel_stats", TARGET, tmp_path, backend="rocm", check=False)
    assert stats.tool == "rocprofv3"
    assert stats.argv[:1] == ["rocprofv3"] and {"--stats", "--kernel-trace", "--truncate-kernels"} <= set(stats.argv)
    assert stats.argv[stats.argv.index("--") + 1:] == TARGET
    timeline = vendor.build_command("timeline", TARGET, tmp_path, backend="rocm", check=False)
    assert "--runtime-trace" in timeline.argv and timeline.argv[timeline.argv.index("--output-format") + 1] == "pftrace"
    roof = vendor.build_command("roofline", TARGET, tmp_path, backend="rocm", check=False)
    assert roof.argv[:2] == ["rocprof-compute", "profile"] and "--roof-only" in roof.argv
    assert roof.then[0][:2] == ["rocprof-compute", "analyze"]
    system = vendor.build_command("timeline", TARGET, tmp_path, backend="rocm", tool="rocprof-sys", check=False)
    assert system.argv[0] == "rocprof-sys-sample" and system.env["ROCPROFSYS_OUTPUT_PATH"] == str(tmp_path)
    assert system.shell().startswith("ROCPROFSYS_OUTPUT_PATH=")


def test_the_workshop_run_is_the_benchmark_with_this_python(tmp_path):
    target = vendor.bench_target("v4", "medium", "bf16", 3)
    assert target[0] == sys.executable and target[1:3] == ["-m", "tinyllama.harness.bench"]
    assert target[target.index("--version") + 1] == "v4" and target[target.index("--num-steps") + 1] == "3"
    cmd = vendor.build_command("kernel_stats", target, tmp_path, backend="rocm", check=False)
    assert cmd.argv[cmd.argv.index("--") + 1:] == target


def test_cuda_commands_limit_ncu_and_chain_nsys_stats(tmp_path):
    roof = vendor.build_command("roofline", TARGET, tmp_path, backend="cuda", check=False, launch_skip=3,
                                launch_count=7, profiler_range=True)
    argv = roof.argv
    assert argv[0] == "ncu" and argv[argv.index("--launch-count") + 1] == "7" and argv[argv.index("--launch-skip") + 1] == "3"
    assert "--profile-from-start" in argv and argv[-len(TARGET):] == TARGET
    metrics = argv[argv.index("--metrics") + 1].split(",")
    assert set(vendor.NCU_ROOFLINE_METRICS) <= set(metrics) and "--csv" in argv
    stats = vendor.build_command("kernel_stats", TARGET, tmp_path, backend="cuda", check=False)
    assert stats.tool == "nsys" and stats.then[0][:4] == ["nsys", "stats", "--report", "cuda_gpu_kern_sum"]
    assert " && nsys stats " in stats.shell()
    custom = vendor.build_command("roofline", TARGET, tmp_path, backend="cuda", check=False, metrics=["a.sum"])
    assert custom.argv[custom.argv.index("--metrics") + 1] == "a.sum"


def _info(name, available):
    return vendor.ToolInfo(name, vendor.TOOLS[name].vendor, f"/usr/bin/{name}" if available else None, "1.0",
                           available, "ok" if available else f"{name} not found on PATH")


def test_a_missing_tool_is_named_and_a_working_one_preferred(tmp_path):
    tools = {"nsys": _info("nsys", False), "ncu": _info("ncu", True)}
    # the lent NVIDIA machines have ncu but no working nsys: kernel statistics fall back to ncu
    cmd = vendor.build_command("kernel_stats", TARGET, tmp_path, backend="cuda", tools=tools)
    assert cmd.tool == "ncu" and "gpu__time_duration.sum" in cmd.argv
    with pytest.raises(vendor.ProfilerNotFoundError, match=r"needs nsys.*PyTorch profiler"):
        vendor.build_command("timeline", TARGET, tmp_path, backend="cuda", tools=tools)
    with pytest.raises(vendor.ProfilerNotFoundError, match="rocprof-compute"):
        vendor.build_command("roofline", TARGET, tmp_path, backend="rocm",
                             tools={"rocprof-compute": _info("rocprof-compute", False)})
    with pytest.raises(vendor.ProfilerNotFoundError, match="no GPU"):
        vendor.build_command("kernel_stats", TARGET, tmp_path, backend="cpu")
    with pytest.raises(ValueError, match="unknown profiling task"):
        vendor.build_command("flamegraph", TARGET, tmp_path, backend="cuda", check=False)
    with pytest.raises(ValueError, match="nothing to profile"):
        vendor.build_command("roofline", [], tmp_path, backend="cuda", check=False)


def test_a_failing_run_says_why(tmp_path):
    cmd = vendor.ProfilerCommand("timeline", "fake", [sys.executable, "-c", "print('==ERROR== ERR_NVGPUCTRPERM'); raise SystemExit(3)"], "")
    with pytest.raises(RuntimeError, match=r"exit status 3[\s\S]*ERR_NVGPUCTRPERM"):
        cmd.run()


# --- parsers ---------------------------------------------------------------------------------------

def test_rocprofv3_kernel_stats(tmp_path):
    table = vendor.read_rocprofv3_kernel_stats(DATA / "rocprofv3_kernel_stats.csv")
    assert tuple(table.columns) == vendor.KERNEL_COLUMNS and len(table) == 5
    assert table["total_ns"].is_monotonic_decreasing
    top = table.iloc[0]
    assert top["kernel"].startswith("Cijk_") and top["calls"] == 480 and top["total_ns"] == 52_838_400
    assert top["mean_ns"] == pytest.approx(top["total_ns"] / top["calls"])
    assert table["percent"].sum() == pytest.approx(100.0, abs=0.1)
    # a folder as rocprofv3 -d writes it is searched for the file
    nested = tmp_path / "host" / "1234"
    nested.mkdir(parents=True)
    (nested / "1234_kernel_stats.csv").write_text((DATA / "rocprofv3_kernel_stats.csv").read_text())
    assert vendor.read_rocprofv3_kernel_stats(tmp_path).equals(table)


def test_nsys_kernel_summary_skips_progress_lines_and_thousands_separators():
    table = vendor.read_nsys_kernel_summary(DATA / "nsys_cuda_gpu_kern_sum.csv")
    assert tuple(table.columns) == vendor.KERNEL_COLUMNS and len(table) == 4
    gemm = table.iloc[0]
    assert "gemm" in gemm["kernel"] and gemm["total_ns"] == 5_850_000 and gemm["calls"] == 50
    assert gemm["mean_ns"] == 117_000 and gemm["percent"] == 58.5
    assert table.set_index("calls").loc[400, "total_ns"] == 1_730_000


def test_ncu_details_page_is_one_row_per_launch_in_base_units():
    frame = vendor.read_ncu_csv(DATA / "ncu_details.csv")
    assert list(frame["id"]) == [0, 1, 2]
    gemm = frame.iloc[0]
    assert gemm["gpu__time_duration.sum"] == pytest.approx(30_720)  # 30.72 usecond
    assert gemm["dram__bytes_read.sum"] == pytest.approx(16.78e6)  # 16.78 Mbyte
    assert gemm["sm__ops_path_tensor_src_bf16_dst_fp32.sum"] == GEMM_FLOPS  # "17,179,869,184"
    assert frame.attrs["units"]["gpu__time_duration.sum"] == "nsecond"
    assert frame.attrs["units"]["dram__bytes_read.sum"] == "byte"
    assert gemm["block_size"] == "(384, 1, 1)"


def test_ncu_raw_page_gives_the_same_numbers():
    details = vendor.read_ncu_csv(DATA / "ncu_details.csv")
    raw = vendor.read_ncu_csv((DATA / "ncu_raw.csv").read_text())  # text works as well as a path
    shared = [c for c in raw.columns if c.startswith(("dram__", "gpu__", "sm__"))]
    assert len(shared) == 7 and "CC" not in raw.columns
    for column in shared:
        assert raw[column].tolist() == pytest.approx(details[column].tolist()), column


def test_ncu_points_and_kernel_statistics():
    points = vendor.ncu_roofline_points(vendor.read_ncu_csv(DATA / "ncu_details.csv")).set_index("id")
    gemm, add, softmax = points.loc[0], points.loc[1], points.loc[2]
    assert gemm["flops"] == GEMM_FLOPS + 2 * 4_194_304  # tensor ops + FFMA (2 FLOPs each)
    assert gemm["dram_bytes"] == pytest.approx(GEMM_BYTES_MB * 1e6)
    assert gemm["tflops"] == pytest.approx(gemm["flops"] / 30.72e-6 / 1e12)
    assert add["intensity"] == pytest.approx(16_777_216 / 201.33e6)  # one add per 12 bytes
    assert softmax["flops"] == 8_388_608 * (1 + 1 + 2)
    assert points.attrs["tensor_counters"] == ["sm__ops_path_tensor_src_bf16_dst_fp32.sum"]
    stats = vendor.ncu_kernel_stats(vendor.read_ncu_csv(DATA / "ncu_details.csv"))
    assert tuple(stats.columns) == vendor.KERNEL_COLUMNS and stats["total_ns"].sum() == pytest.approx(129_280)
    with pytest.raises(ValueError, match="gpu__time_duration"):
        vendor.ncu_kernel_stats(stats.rename(columns={"total_ns": "x"}))


def test_rocprof_compute_roofline_and_counters():
    roof = vendor.read_rocprof_compute_roofline(DATA / "rocprof_compute_roofline.csv").iloc[0]
    assert roof["hbm_tbs"] == pytest.approx(4.3) and roof["mfma_bf16_tflops"] == pytest.approx(1041.0)
    assert roof["fp32_tflops"] == pytest.approx(81.7)
    points = vendor.rocprof_compute_points(vendor.read_rocprof_compute_pmc(DATA / "rocprof_compute_pmc_perf.csv"))
    gemm = points.set_index("calls").loc[2]  # two dispatches of the GEMM
    assert gemm["flops"] == 2 * GEMM_FLOPS and gemm["time_ns"] == 80_000
    assert gemm["hbm_bytes"] == 2 * (2048 * 2048 * 2 * 2 + 2048 * 2048 * 2)  # A, B read; C written
    add = points.set_index("calls").loc[1]
    assert add["intensity"] == pytest.approx(1 / 12)
    assert add["tbs"] == pytest.approx((2**27 + 2**26) / 50e-6 / 1e12)


def test_parsers_refuse_other_files_with_a_reason(tmp_path):
    with pytest.raises(ValueError, match="not a rocprofv3 kernel_stats.csv"):
        vendor.read_rocprofv3_kernel_stats(DATA / "rocprof_compute_pmc_perf.csv")
    with pytest.raises(ValueError, match="no CSV header"):
        vendor.read_ncu_csv(DATA / "rocprofv3_kernel_stats.csv")
    with pytest.raises(FileNotFoundError, match="kernel_stats.csv"):
        vendor.read_rocprofv3_kernel_stats(tmp_path)
    with pytest.raises(ValueError, match="HBMBw"):
        vendor.read_rocprof_compute_roofline(DATA / "rocprofv3_kernel_stats.csv")


@pytest.mark.skipif(os.environ.get("PATH") is None, reason="needs PATH")
def test_this_machine_is_described_even_without_any_tool():
    table = vendor.detect_tools()
    assert set(table.columns) >= {"tool", "vendor", "available", "version", "path", "purpose", "message"}
    assert all(table.loc[~table["available"], "message"].str.len() > 0)


def test_a_run_past_its_time_limit_is_stopped_with_its_children(tmp_path):
    pid_file = tmp_path / "child.pid"
    cmd = vendor.ProfilerCommand("timeline", "fake", ["sh", "-c", f"sleep 60 & echo $! > {pid_file}; wait"], "")
    with pytest.raises(RuntimeError, match="did not finish within 1 s"):
        cmd.run(timeout_s=1)
    child = int(pid_file.read_text())
    import time

    for _ in range(50):  # the killed child may take a moment to be reaped
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{child}/stat").exists() and Path(f"/proc/{child}/stat").read_text().split()[2] == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail("the profiled program kept running after the time limit")


def test_ncu_commands_take_the_selection_and_the_clocks(tmp_path):
    options = ["--profile-from-start", "off", "--launch-count", "60"]
    cmd = vendor.build_command("kernel_stats", TARGET, tmp_path, backend="cuda", tool="ncu", check=False,
                               selection=options, clock_control="none")
    argv = cmd.argv
    assert argv[argv.index("--profile-from-start") + 1] == "off" and "--launch-skip" not in argv
    assert argv[argv.index("--clock-control") + 1] == "none"
    assert argv[-len(TARGET):] == TARGET
    with pytest.raises(ValueError, match="not an option"):
        vendor.build_command("kernel_stats", TARGET, tmp_path, backend="cuda", tool="ncu", check=False,
                             selection=["--launch-cout", "5"])
    with pytest.raises(ValueError, match="clock_control"):
        vendor.build_command("kernel_stats", TARGET, tmp_path, backend="cuda", tool="ncu", check=False,
                             clock_control="boost")


def test_a_fake_ncu_run_is_read_back(tmp_path, monkeypatch):
    # An ncu stand-in that writes the documented CSV to --log-file, as the notebook's run reads it.
    sample = DATA / "ncu_details.csv"
    script = tmp_path / "ncu"
    script.write_text("#!/bin/sh\nwhile [ $# -gt 0 ]; do if [ \"$1\" = --log-file ]; then cp "
                      f"'{sample}' \"$2\"; fi; shift; done\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    cmd = vendor.build_command("kernel_stats", ["true"], tmp_path, backend="cuda", tool="ncu", check=False,
                               selection=["--profile-from-start", "off", "--launch-count", "2"])
    cmd.run(timeout_s=30)
    frame = vendor.read_ncu_csv(cmd.outputs)
    assert len(frame) > 0 and "gpu__time_duration.sum" in frame


# --- counters: what limits a kernel ------------------------------------------------------------------

def test_the_counters_command_asks_ncu_for_the_documented_metrics_on_the_raw_page(tmp_path):
    cmd = vendor.build_command("counters", TARGET, tmp_path, backend="cuda", tool="ncu", check=False,
                               selection=["--profile-from-start", "off", "--launch-count", "12"],
                               kernel_regex=vendor.ncu_kernel_regex(["void cudnn::bn_fw_inf_1C11_kernel_NCHW<float>(int)",
                                                                     "sm90_xmma_gemm_f32f32_tf32f32"]))
    argv = cmd.argv
    assert argv[argv.index("--page") + 1] == "raw" and "--csv" in argv and "--section" not in argv
    assert argv[argv.index("--metrics") + 1].split(",") == list(vendor.NCU_COUNTER_METRICS)
    assert argv[argv.index("--kernel-name") + 1] == "regex:^(bn_fw_inf_1C11_kernel_NCHW|sm90_xmma_gemm_f32f32_tf32f32)$"
    assert argv[argv.index("--launch-count") + 1] == "12" and argv[-len(TARGET):] == TARGET


def test_the_rocprof_compute_counters_run_analyzes_each_kernel(tmp_path):
    cmd = vendor.build_command("counters", TARGET, tmp_path, backend="rocm", check=False, kernels=3, name="r50")
    assert cmd.argv[:2] == ["rocprof-compute", "profile"] and cmd.argv[cmd.argv.index("--") + 1:] == TARGET
    assert len(cmd.then) == 3
    for k, step in enumerate(cmd.then):
        assert step[:2] == ["rocprof-compute", "analyze"] and step[step.index("-k") + 1] == str(k)
        assert step[step.index("-b") + 1] == "2" and step[step.index("--save-dfs") + 1] == str(tmp_path / "r50" / f"sol_kernel_{k}")
    with pytest.raises(ValueError, match="kernels"):
        vendor.build_command("counters", TARGET, tmp_path, backend="rocm", check=False, kernels=0)


def test_ncu_counters_per_launch_and_per_kernel():
    launches = vendor.ncu_counters(vendor.read_ncu_csv(DATA / "ncu_counters.csv"))
    assert list(launches["id"]) == [0, 1, 2, 3, 4, 5] and list(launches.columns[2:]) == list(vendor.COUNTER_COLUMNS)
    bn = launches.iloc[0]
    assert bn["duration_ns"] == 60_000 and bn["dram_bytes_per_s"] == pytest.approx(4.1e12)
    assert bn["registers_per_thread"] == 32 and bn["theoretical_occupancy_pct"] == 100
    # memory_pct is the busier of the memory system and DRAM
    assert launches.iloc[4]["memory_pct"] == 82.0 and launches.iloc[4]["dram_pct"] == 25.0
    table = vendor.kernel_counters(launches)
    bn = table.iloc[0]  # the longest in total: two launches
    assert "bn_fw_inf" in bn["kernel"]
    assert bn["launches"] == 2 and bn["total_ns"] == 80_000
    # time-weighted: the 60 us launch counts three times the 20 us one
    assert bn["dram_pct"] == pytest.approx((86.2 * 60 + 80.2 * 20) / 80)
    assert bn["dram_bytes_per_s"] == pytest.approx((4.1e12 * 60 + 3.8e12 * 20) / 80)
    assert list(table["limiter"]) == ["memory", "compute", "memory", "memory", "latency"]


@pytest.mark.parametrize("sm, memory, expected", [
    (28.5, 86.2, "memory"),  # batch norm: memory busy, SMs idle
    (78.4, 45.1, "compute"),  # a GEMM
    (25.0, 35.0, "latency"),  # neither above 60%, though memory is ahead
    (70.0, 70.0, "memory"),  # a tie goes to memory
    (88.0, 72.0, "compute"),  # both busy, SMs ahead
    (float("nan"), 65.0, "memory"),  # a missing counter counts as 0
])
def test_the_limiter_rule(sm, memory, expected):
    assert vendor.limiter(sm, memory) == expected


def test_counter_selection_reaches_every_kernel_within_the_limit():
    names = ["void bn_fw<1>(int)", "void gemm_a<1>(int)"]
    order = ["void bn_fw<1>(int)", "void relu<1>(int)", "void bn_fw<1>(int)", "void bn_fw<1>(int)", "void gemm_a<1>(int)",
             "void bn_fw<1>(int)", "void gemm_a<1>(int)", "void gemm_a<1>(int)"]
    timed = pd.DataFrame({"kernel": order, "range": "timed", "index": range(len(order))})
    options, selected = vendor.counter_selection(timed, names, limit=50)
    assert options == ["--profile-from-start", "off", "--launch-count", "6"]  # 2 of each; relu not matched
    assert list(selected["index"]) == [0, 2, 3, 4, 5, 6]
    options, selected = vendor.counter_selection(timed, names, limit=3)
    assert options[-1] == "3" and len(selected) == 3
    with pytest.raises(ValueError, match="no kernel names"):
        vendor.ncu_kernel_regex([])


def test_rocprof_compute_speed_of_light_in_the_same_columns():
    folders = sorted((DATA / "rocprof_compute_sol").glob("sol_kernel_*"))
    sol = vendor.read_rocprof_compute_sol(folders[0])
    assert sol.loc["VALU Utilization", "Pct of Peak"] == 21.4 and pd.isna(sol.loc["LDS Bank Conflicts/Access", "Avg"])
    table = vendor.rocprof_compute_counters(folders).set_index("kernel")
    bn, gemm = table.loc["MIOpenBatchNormFwdInferSpatialEst"], table.iloc[1]
    assert bn["dram_pct"] == pytest.approx(51.14 + 25.57)  # HBM read + write against the HBM peak
    assert bn["dram_bytes_per_s"] == pytest.approx((2710.4 + 1355.2) * 1e9)
    assert bn["achieved_occupancy_pct"] == 74.12 and bn["launches"] == 53 and bn["duration_ns"] == 47_000
    assert bn["limiter"] == "memory"
    assert gemm["sm_pct"] == 71.8 and gemm["limiter"] == "compute"  # MFMA busier than VALU
    with pytest.raises(ValueError, match="speed-of-light"):
        vendor.read_rocprof_compute_sol(DATA / "rocprofv3_kernel_stats.csv")


def test_recorded_counters_read_with_their_description(tmp_path):
    frame, meta = vendor.recorded_counters(DATA / "ncu_counters.csv")
    assert len(frame) == 6 and meta["device"] == "sample"
    with pytest.raises(FileNotFoundError, match="no recorded counters"):
        vendor.recorded_counters(tmp_path / "missing.csv")
    with pytest.raises(ValueError, match="lack"):
        vendor.ncu_counters(vendor.read_ncu_csv(DATA / "ncu_details.csv").drop(columns="gpu__time_duration.sum"))
