"""tinyllama.profiling.attention: SDPA with grouped-query heads, the backend it picks, and what attention
keeps for the backward."""

import pytest
import torch

from tinyllama.kernels import flash_attention_reference
from tinyllama.profiling.attention import (backend_from_operators, peak_memory_bytes, saved_tensor_bytes, sdpa,
                                           sdpa_backend)


def _qkv(heads=4, kv_heads=2, seq=37, head_dim=16, grad=False):
    g = torch.Generator().manual_seed(seq)
    make = lambda h: torch.randn(2, h, seq, head_dim, generator=g).requires_grad_(grad)  # noqa: E731
    return make(heads), make(kv_heads), make(kv_heads)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("backend", [None, "math"])
def test_sdpa_matches_the_reference_with_grouped_heads(causal, backend):
    q, k, v = _qkv()
    torch.testing.assert_close(sdpa(q, k, v, causal, backend), flash_attention_reference(q, k, v, causal),
                               atol=1e-5, rtol=1e-5)


def test_unknown_backend_is_named():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="unknown SDPA backend"):
        sdpa(q, k, v, backend="fastest")


def test_backend_names_come_from_the_operator():
    assert backend_from_operators(["aten::scaled_dot_product_attention",
                                   "aten::_scaled_dot_product_cudnn_attention"]) == (
        "cuDNN", "aten::_scaled_dot_product_cudnn_attention")
    assert backend_from_operators(["aten::_scaled_dot_product_flash_attention_for_cpu"])[0] == "flash (CPU)"
    assert backend_from_operators(["aten::_scaled_dot_product_efficient_attention"])[0] == "memory-efficient"
    assert backend_from_operators(["aten::matmul"])[0] == "unknown"


def test_sdpa_backend_on_this_machine():
    q, k, v = _qkv(grad=True)
    assert sdpa_backend(q, k, v, backend="math").backend == "math"
    if not torch.cuda.is_available():
        assert sdpa_backend(q, k, v).backend in ("flash (CPU)", "math")
    assert q.grad is None


def test_saved_bytes_grow_with_the_square_of_the_sequence_for_the_math_path():
    def saved(seq):
        q, k, v = _qkv(seq=seq, grad=True)
        return saved_tensor_bytes(lambda: flash_attention_reference(q, k, v))

    small, large = saved(64), saved(128)
    probabilities = 2 * 4 * 128 * 128 * 4  # batch, heads, seq^2, fp32
    assert probabilities <= large < 1.5 * probabilities
    assert 3.0 < large / small < 4.0  # quadratic, with a linear part (q, k, v)


def test_peak_memory_is_none_on_the_cpu():
    assert peak_memory_bytes(lambda: torch.ones(10), "cpu") is None
