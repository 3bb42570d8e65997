"""The V1 baseline computes what a LLaMA decoder should."""

import math

import pytest
import torch
import torch.nn.functional as F

from tinyllama.config import get_preset
from tinyllama.models import VERSIONS, build, lm_loss
from tinyllama.models.v1_baseline import RMSNorm, RotaryEmbedding


@pytest.fixture
def config():
    return get_preset("ci").model


def test_logits_have_the_vocabulary_shape_and_the_input_dtype(config):
    model = build("v1", config)
    tokens = torch.randint(0, config.vocab_size, (3, 17))
    logits = model(tokens)
    assert logits.shape == (3, 17, config.vocab_size) and logits.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(tokens).dtype == torch.bfloat16


def test_initial_loss_is_close_to_uniform_guessing(config):
    torch.manual_seed(0)
    model = build("v1", get_preset("tiny").model)
    tokens = torch.randint(0, 1000, (2, 64))
    loss = lm_loss(model(tokens), tokens).item()
    assert abs(loss - math.log(1000)) < 0.3


def test_weights_are_initialised_with_std_0_02(config):
    model = build("v1", get_preset("tiny").model)
    std = model.layers[0].mlp.up_proj.weight.std().item()
    assert std == pytest.approx(0.02, rel=0.05)
    assert torch.equal(model.layers[0].attn_norm.weight, torch.ones_like(model.layers[0].attn_norm.weight))


def test_attention_is_causal(config):
    """Changing a later token must not change the logits at earlier positions."""
    model = build("v1", config).eval()
    tokens = torch.randint(0, config.vocab_size, (1, 12))
    changed = tokens.clone()
    changed[0, 8] = (changed[0, 8] + 1) % config.vocab_size
    a, b = model(tokens), model(changed)
    assert torch.allclose(a[:, :8], b[:, :8], atol=1e-6)
    assert not torch.allclose(a[:, 8:], b[:, 8:], atol=1e-4)


def test_attention_matches_pytorch_sdpa_reference(config):
    model = build("v1", config).eval()
    attn = model.layers[0].attn
    x = torch.randn(2, 10, config.hidden_dim)
    q, k, v = attn.project_qkv(x)
    groups = config.num_heads // config.num_kv_heads
    expected = F.scaled_dot_product_attention(
        q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), is_causal=True)
    assert torch.allclose(attn.attend(q, k, v), expected, atol=1e-5)


def test_rmsnorm_matches_its_definition():
    norm = RMSNorm(8, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.arange(1.0, 9.0))
    x = torch.randn(4, 8)
    expected = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * norm.weight
    assert torch.allclose(norm(x), expected, atol=1e-6)


def test_rotary_embedding_preserves_norms_and_encodes_relative_position():
    rope = RotaryEmbedding(head_dim=16, max_seq_len=32)
    q = torch.randn(1, 1, 1, 16).expand(1, 1, 32, 16)
    k = torch.randn(1, 1, 1, 16).expand(1, 1, 32, 16)
    rq, rk = rope(q), rope(k)
    assert torch.allclose(rq.norm(dim=-1), q.norm(dim=-1), atol=1e-5)
    # <rot(q, m), rot(k, n)> depends only on m - n.
    d1 = (rq[0, 0, 5] * rk[0, 0, 2]).sum()
    d2 = (rq[0, 0, 20] * rk[0, 0, 17]).sum()
    assert torch.allclose(d1, d2, atol=1e-4)


def test_one_step_trains_every_parameter(config):
    torch.manual_seed(0)
    model = build("v1", config)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, config.vocab_size, (2, 16))
    lm_loss(model(tokens), tokens).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    optimizer.step()
    for name, p in model.named_parameters():
        assert not torch.equal(p, before[name]), f"{name} did not change"


def test_registry_lists_v1_and_refuses_unknown_versions(config):
    assert "v1" in VERSIONS
    with pytest.raises(ValueError, match="unknown version 'v9'"):
        build("v9", config)


def test_sequences_longer_than_the_config_are_refused(config):
    model = build("v1", config)
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        model(torch.zeros(1, config.max_seq_len + 1, dtype=torch.long))
