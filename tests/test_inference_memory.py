"""The memory budget, the budgeted largest-batch search and the TF32 helpers of ``inference``."""

import pytest
import torch

import inference
from inference import precision, sweep
from inference.benchmark import BenchmarkResult
from inference.config import BenchmarkConfig, ConfigError
from inference.memory import LiveBytesBudget, OutOfMemoryError, memory_budget
from tinyllama import device as dev

MIB = 2**20


def test_live_bytes_count_what_is_alive_once():
    with LiveBytesBudget(100 * MIB) as budget:
        a = torch.empty(MIB, dtype=torch.uint8)
        view = a[: MIB // 2].view(torch.int16)  # a view: the same storage, not counted again
        del a, view
        b = torch.empty(2 * MIB, dtype=torch.uint8)  # the first one is freed: peak 2 MiB, not 3
        torch.add(b, 1)  # a temporary, freed at once
    assert budget.peak_bytes == 4 * MIB  # b and the temporary were alive together
    del b


def test_live_bytes_raise_out_of_memory_past_the_budget():
    with pytest.raises(OutOfMemoryError, match="memory budget"):
        with LiveBytesBudget(3 * MIB):
            kept = [torch.empty(MIB, dtype=torch.uint8) for _ in range(4)]  # noqa: F841
    assert dev.is_out_of_memory(OutOfMemoryError("out of memory (memory budget)"))


def test_memory_budget_rejects_nonsense():
    with pytest.raises(ValueError, match="positive"):
        with memory_budget("cpu", 0):
            pass
    with pytest.raises(ValueError, match="caching allocator"):
        with dev.cap_memory("cpu", MIB):
            pass


def _megabyte_per_sample(config: BenchmarkConfig) -> BenchmarkResult:
    """A pretend benchmark: one MiB of activations per sample, plus a fixed 1.5 MiB of 'weights'."""
    try:
        weights = torch.empty(3 * MIB // 2, dtype=torch.uint8)
        activations = torch.empty(config.batch_size * MIB, dtype=torch.uint8)
    except OutOfMemoryError as error:  # as run_benchmark reports it
        raise inference.OutOfMemoryError(config.batch_size, str(error)) from None
    del weights, activations
    return "ran"  # type: ignore[return-value]


def test_budgeted_search_finds_the_budgets_limit_and_says_so():
    config = BenchmarkConfig(network="resnet18", batch_size=2, device="cpu", progress=False)
    found = sweep.find_max_batch_size(config, limit=1024, runner=_megabyte_per_sample,
                                      memory_budget_bytes=12 * MIB)
    assert (found.max_batch_size, found.first_failing) == (10, 11)  # 1.5 + 10 <= 12 < 1.5 + 11
    assert found.bounded_by == "memory budget" and found.result == "ran"
    assert "bounded by the memory budget: batch 11 ran out of memory" in found.describe()
    coarse = sweep.find_max_batch_size(config, limit=1024, runner=_megabyte_per_sample,
                                       memory_budget_bytes=100 * MIB, resolution=1 / 8, benchmark_largest=False)
    assert 88 <= coarse.max_batch_size <= 98 and coarse.result is None
    assert len(coarse.probes) < len(sweep.find_max_batch_size(
        config, limit=1024, runner=_megabyte_per_sample, memory_budget_bytes=100 * MIB, benchmark_largest=False).probes)


def test_unbudgeted_search_that_meets_no_limit_says_the_batch_limit_bounded_it():
    config = BenchmarkConfig(network="resnet18", batch_size=2, device="cpu", progress=False)
    found = sweep.find_max_batch_size(config, limit=16, runner=_megabyte_per_sample, benchmark_largest=False)
    assert found.max_batch_size == 16 and found.bounded_by == "batch limit"
    assert "the largest batch is not known" in found.describe()
    with pytest.raises(ConfigError, match="positive"):
        sweep.find_max_batch_size(config, runner=_megabyte_per_sample, memory_budget_bytes=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="caps a GPU's allocator")
def test_cap_memory_raises_on_the_gpu_and_restores_the_cap():
    device = torch.device("cuda")
    with dev.cap_memory(device, 256 * MIB):
        small = torch.empty(64 * MIB, dtype=torch.uint8, device=device)
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(512 * MIB, dtype=torch.uint8, device=device)
        del small
    big = torch.empty(512 * MIB, dtype=torch.uint8, device=device)  # the cap is gone
    del big


def test_round_to_mantissa_rounds_like_the_16_bit_casts():
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(0))
    x = x[x.abs() > 1e-3]  # normal numbers in fp16 too (below 6.1e-5 it has fewer bits)
    for bits, cast in ((10, torch.float16), (7, torch.bfloat16)):
        rounded = precision.round_to_mantissa(x, bits)
        # Casts round exact ties to even, round_to_mantissa away from zero: compare everything else.
        drop = 23 - bits
        tie = (x.view(torch.int32) & ((1 << drop) - 1)) == (1 << (drop - 1))
        assert torch.equal(rounded[~tie], x.to(cast).float()[~tie])
        assert float(((rounded - x).abs() / x.abs()).max()) <= 2.0 ** -(bits + 1)
        assert (rounded.view(torch.int32) & ((1 << (23 - bits)) - 1)).eq(0).all()
    assert torch.equal(precision.round_to_mantissa(x, 23), x)
    assert precision.round_to_mantissa(torch.tensor([1.9999999]), 10).item() == 2.0  # the carry into the exponent
    with pytest.raises(TypeError):
        precision.round_to_mantissa(x.double(), 10)


def test_tf32_mode_sets_both_flags_and_restores_them():
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    with precision.tf32_mode(not before[0]):
        assert torch.backends.cudnn.allow_tf32 is (not before[0])
        assert torch.backends.cuda.matmul.allow_tf32 is (not before[0])
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == before


def test_ran_as_names_tf32_where_it_was_allowed():
    assert inference.ran_as("fp32", {"tf32_conv": True, "tf32_matmul": False, "backend": "cuda"}) == \
        "convolutions in TF32, storage fp32"
    assert "matmuls" in inference.ran_as("fp32", {"tf32_conv": True, "tf32_matmul": True, "backend": "cuda"})
    assert inference.ran_as("fp32", {"tf32_conv": False, "tf32_matmul": False, "backend": "cpu"}) == "fp32 throughout"
    assert "TF32 off" in inference.ran_as("fp32", {"tf32_conv": False, "tf32_matmul": False, "backend": "cuda"})
    assert "ROCm" in inference.ran_as("fp32", {"tf32_conv": True, "backend": "rocm"})
    assert inference.ran_as("fp16", {}) == "fp16 weights and activations"


def test_the_command_line_searches_within_a_budget(capsys, tmp_path):
    from inference import cli

    code = cli.main(["--network", "squeezenet1_0", "--input-size", "32", "--batch-size", "2", "--iterations", "1",
                     "--warmup", "1", "--device", "cpu", "--quiet", "--max-batch", "--memory-budget-gib",
                     str(6 / 1024), "--output-dir", str(tmp_path)])
    assert code == 0
    assert "bounded by the memory budget" in capsys.readouterr().out
