"""The Triton flash attention against attention written out in PyTorch: output, log-sum-exp, and the
gradients of q, k and v, causal and not, with grouped-query heads.

On a CPU the kernels run in Triton's interpreter at small shapes (sequence lengths 1, 17, 33, 64
cross block boundaries: the interpreter uses 16- and 32-wide blocks); with a GPU the same tests run
compiled at the workshop's shapes.
"""

import importlib

import pytest
import torch

from conftest import DEVICE

from tinyllama import device as dev
from tinyllama.kernels import KernelMismatch, _triton, flash_attention, flash_attention_reference
from tinyllama.kernels._triton import MAX_GRID_Y, compare_with_reference, max_relative_error, use_tensor_descriptors
from tinyllama.kernels.flash_attention import flash_attention_forward, log_sum_exp_reference

# (batch, heads, kv_heads, seq, head_dim)
SHAPES = ([(2, 8, 4, 512, 128), (1, 8, 4, 1000, 64), (2, 4, 1, 257, 128), (1, 8, 8, 2048, 64)]
          if DEVICE == "cuda"
          else [(1, 2, 1, 1, 16), (2, 4, 2, 17, 32), (1, 4, 4, 33, 64), (1, 4, 2, 64, 16)])
DTYPES = [torch.float32, torch.bfloat16]


def _qkv(shape, dtype, seed):
    batch, heads, kv_heads, seq, head_dim = shape
    g = torch.Generator().manual_seed(seed)

    def make(h):
        return torch.randn(batch, h, seq, head_dim, generator=g).to(DEVICE, dtype).requires_grad_()

    return make(heads), make(kv_heads), make(kv_heads)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_causal_forward_and_gradients_match_the_reference(shape, dtype):
    q, k, v = _qkv(shape, dtype, seed=shape[3])
    errors = compare_with_reference(flash_attention, flash_attention_reference, [q, k, v], ["q", "k", "v"],
                                    causal=True)
    assert set(errors) == {"out", "dq", "dk", "dv"}


@pytest.mark.parametrize("shape", SHAPES[1:3], ids=str)
def test_full_attention_matches_the_reference(shape):
    q, k, v = _qkv(shape, torch.bfloat16, seed=7)
    compare_with_reference(flash_attention, flash_attention_reference, [q, k, v], ["q", "k", "v"], causal=False)


def test_half_precision():
    q, k, v = _qkv(SHAPES[1], torch.float16, seed=8)
    compare_with_reference(flash_attention, flash_attention_reference, [q, k, v], ["q", "k", "v"])


def test_a_given_scale_matches_the_reference():
    """The forward keeps its running maximum in scaled units (the row maximum times the scale). Large
    raw scores with a small scale give ordinary probabilities; a maximum kept unscaled there would
    push every exp2 below the smallest float (0 / 0, a NaN output)."""
    q, k, v = _qkv(SHAPES[1], torch.float32, seed=14)
    q, k = (q.detach() * 5).requires_grad_(), (k.detach() * 5).requires_grad_()
    for causal in (True, False):
        compare_with_reference(flash_attention, flash_attention_reference, [q, k, v], ["q", "k", "v"],
                               causal=causal, sm_scale=0.01)


@pytest.mark.parametrize("causal", [True, False])
def test_saved_log_sum_exp(causal):
    q, k, v = _qkv(SHAPES[1], torch.float32, seed=9)
    _, lse = flash_attention_forward(q.detach(), k.detach(), v.detach(), causal)
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3]
    assert max_relative_error(lse, log_sum_exp_reference(q.detach(), k.detach(), causal)) < 1e-5


def test_strided_layouts():
    """q, k, v as views of one (batch, seq, heads + 2 kv_heads, head_dim) projection, the way a fused
    QKV matmul lays them out, and a head dimension that is not contiguous (a transposed view) with a
    transposed upstream gradient. A launcher that assumed contiguous (batch, heads, seq, head_dim)
    memory would read other heads' values and fail."""
    batch, heads, kv_heads, seq, head_dim = SHAPES[1]
    g = torch.Generator().manual_seed(10)
    fused = torch.randn(batch, seq, heads + 2 * kv_heads, head_dim, generator=g).to(DEVICE).requires_grad_()
    q, k, v = fused.split([heads, kv_heads, kv_heads], dim=2)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    assert not q.is_contiguous() and q.stride(-1) == 1
    compare_with_reference(flash_attention, flash_attention_reference, [q, k, v], ["q", "k", "v"])

    def transposed(h):
        return torch.randn(batch, h, head_dim, seq, generator=g).to(DEVICE).requires_grad_().transpose(-1, -2)

    q, k, v = transposed(heads), transposed(kv_heads), transposed(kv_heads)
    assert q.stride(-1) != 1
    grad_out = torch.randn(batch, heads, head_dim, seq, generator=g).to(DEVICE).transpose(-1, -2)
    compare_with_reference(flash_attention, flash_attention_reference, [q, k, v], ["q", "k", "v"], grad_out=grad_out)


def test_output_is_stored_as_batch_seq_heads():
    """So that merging the heads for the output projection is a view, not a copy."""
    q, k, v = _qkv(SHAPES[1], torch.float32, seed=11)
    out = flash_attention(q, k, v)
    batch, heads, seq, head_dim = out.shape
    merged = out.transpose(1, 2).reshape(batch, seq, heads * head_dim)
    assert merged.data_ptr() == out.data_ptr() and out.transpose(1, 2).is_contiguous()


def test_future_keys_do_not_change_the_past():
    q, k, v = _qkv(SHAPES[1], torch.float32, seed=12)
    seq = q.shape[2]
    out = flash_attention(q, k, v)
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[:, :, seq // 2:] += 1.0
    v2[:, :, seq // 2:] -= 1.0
    out2 = flash_attention(q, k2, v2)
    assert torch.equal(out[:, :, : seq // 2], out2[:, :, : seq // 2])
    assert not torch.allclose(out[:, :, seq // 2:], out2[:, :, seq // 2:])


def test_a_wrong_result_is_caught():
    """Sharing key/value heads the wrong way round (head h reading kv head h % kv_heads instead of
    h // group) must be rejected."""
    q, k, v = _qkv(SHAPES[1], torch.float32, seed=13)

    def wrong_grouping(q, k, v, causal):
        groups = q.shape[1] // k.shape[1]
        return flash_attention(q, k.repeat(1, groups, 1, 1), v.repeat(1, groups, 1, 1), causal)

    with pytest.raises(KernelMismatch):
        compare_with_reference(wrong_grouping, flash_attention_reference, [q, k, v], ["q", "k", "v"], causal=True)


def test_bad_inputs_give_a_clear_error():
    q = torch.randn(1, 4, 8, 16, device=DEVICE)
    with pytest.raises(ValueError, match="evenly"):
        flash_attention(q, torch.randn(1, 3, 8, 16, device=DEVICE), torch.randn(1, 3, 8, 16, device=DEVICE))
    with pytest.raises(ValueError, match="head_dim 24"):
        x = torch.randn(1, 2, 8, 24, device=DEVICE)
        flash_attention(x, x, x)
    with pytest.raises(ValueError, match="4-D"):
        flash_attention(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="sm_scale must be positive"):
        flash_attention(q, q, q, sm_scale=-0.25)
    # the grid's second axis counts sequence blocks: a sequence past it is refused before any allocation
    huge = torch.zeros(1, 1, 1, 16, device=DEVICE).expand(1, 1, 16 * MAX_GRID_Y + 1, 16)
    with pytest.raises(ValueError, match="too long"):
        flash_attention(huge, huge, huge)


# ------------------------------------------------------------------------------------------------
# The tensor-descriptor (TMA) path: the same kernels reading their tiles through descriptors
# ------------------------------------------------------------------------------------------------

needs_descriptors = pytest.mark.skipif(DEVICE == "cuda" and not dev.has_tensor_memory_accelerator(DEVICE),
                                       reason="this GPU has no tensor memory accelerator")


@needs_descriptors
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", SHAPES[1:3], ids=str)
def test_tensor_descriptor_path_matches_the_reference(monkeypatch, shape, causal):
    """Forced on (the interpreter executes descriptors too): rows past the end of the sequence must
    read as zeros and never be written, the grouped key/value heads must be found by index."""
    monkeypatch.setattr(_triton, "TENSOR_DESCRIPTORS", True)
    q, k, v = _qkv(shape, torch.float32, seed=14)
    compare_with_reference(flash_attention, flash_attention_reference, [q, k, v], ["q", "k", "v"], causal=causal)


def test_tensor_descriptors_only_where_the_device_and_the_strides_allow(monkeypatch):
    """TMA addresses 16-byte aligned memory with 16-byte multiple strides and a unit last stride;
    anything else must go to the pointer loads. A device without TMA never gets descriptors."""
    x = torch.randn(2, 4, 33, 16)
    assert not dev.has_tensor_memory_accelerator("cpu")
    monkeypatch.setattr(_triton, "TENSOR_DESCRIPTORS", None)  # decide, as TINYLLAMA_TENSOR_DESCRIPTORS=auto does
    monkeypatch.setattr(_triton, "_TMA_DEVICES", {x.device: False})
    assert not use_tensor_descriptors(x)
    monkeypatch.setattr(_triton, "_TMA_DEVICES", {x.device: True})
    assert use_tensor_descriptors(x, x.transpose(1, 2))  # any strides that are 16-byte multiples
    wide = torch.randn(2 * 4 * 33 * 16 + 1)
    assert not use_tensor_descriptors(x, wide[1:].view(2, 4, 33, 16))  # starts 4 bytes off
    assert not use_tensor_descriptors(torch.randn(2, 4, 33, 19)[..., :16])  # rows 76 bytes apart
    assert not use_tensor_descriptors(x.transpose(-1, -2))  # last stride not 1


def test_warp_specialized_candidates_need_tensor_descriptors(monkeypatch):
    """A warp-specialized tile is only tried where the tiles come through descriptors (Triton
    specializes the loads' warps on TMA copies); fp32 inputs never get 16-bit tiles."""
    fa = importlib.import_module("tinyllama.kernels.flash_attention")
    tiles = [fa._Tile(128, 64, 8, 3), fa._Tile(128, 64, 8, 3, ws=True), fa._Tile(32, 16, 4, 2, fp32=True)]
    made = [t.config() for t in tiles]
    for tile, config in zip(tiles, made):
        monkeypatch.setitem(fa._TILES, id(config), tile)

    def kept(dtype, tma):
        args = {"Q": torch.empty(1, dtype=dtype), "N_CTX": 1000}
        return [(c.kwargs["BLOCK_M"], c.kwargs["WS"]) for c in fa._prune(made, args, HEAD_DIM=128, TMA=tma)]

    assert kept(torch.bfloat16, tma=False) == [(128, False)]
    assert kept(torch.bfloat16, tma=True) == [(128, False), (128, True)]
    assert kept(torch.float32, tma=True) == [(32, False)]
