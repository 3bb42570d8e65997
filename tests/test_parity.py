"""Every version computes V1's function: same weights, same batch -> same logits, loss and gradients.

Loops over ``tinyllama.models.VERSIONS`` (a new version joins by registering) and over every
combination of V2's switches. The mutation tests at the end show that the check has teeth: a wrong
concatenation order, a missing rotary embedding or a cut graph each make it fail.
"""

from itertools import product

import pytest
import torch

import tinyllama.models as models
from tinyllama.config import get_preset, make_config
from tinyllama.correctness import parameters_without_gradient
from tinyllama.harness.comparison.parity import TOLERANCES, ParityCheck, check_parity, reference_answer
from tinyllama.models import VERSIONS, build, lm_loss, model_class, transfer_weights, v2_fused
from tinyllama.models.v1_baseline import Attention
from tinyllama.models.weights import canonical_state_dict
from tinyllama.training import make_batches

CONFIG = get_preset("ci").model
# Larger than the 0.02 of training, so that attention is far from uniform and a wrong rotation or a
# swapped projection changes the logits by much more than rounding does.
TEST_INIT_STD = 0.1


def _variants():
    """(version, options) for every version, uncompiled; V2 in all 8 switch combinations."""
    for version in VERSIONS:
        base = {"compile": False} if "compile" in model_class(version).switch_names else {}
        if version == "v2":
            for qkv, gate_up, sdpa in product((False, True), repeat=3):
                yield version, {**base, "fuse_qkv": qkv, "fuse_gate_up": gate_up, "sdpa": sdpa}
        else:
            yield version, base


VARIANTS = list(_variants())
IDS = [f"{v}-" + ",".join(f"{k}={int(x)}" for k, x in o.items() if k != "compile") for v, o in VARIANTS]


@pytest.fixture(scope="module")
def v1_model():
    torch.manual_seed(0)
    model = build("v1", CONFIG)
    model.reset_parameters(TEST_INIT_STD)
    return model


@pytest.fixture(scope="module")
def reference(v1_model):
    inputs, targets = make_batches(CONFIG, batch_size=2, seq_len=24, count=1, seed=7)[0]
    return reference_answer(v1_model, inputs, targets)


def _with_v1_weights(v1_model, version, options):
    torch.manual_seed(1)  # a different initialisation: only the transfer can make them agree
    return transfer_weights(v1_model, build(version, CONFIG, **options))


@pytest.mark.parametrize("version,options", VARIANTS, ids=IDS)
def test_fp32_logits_and_every_gradient_agree_with_v1(v1_model, reference, version, options):
    check = check_parity(_with_v1_weights(v1_model, version, options), reference, "fp32")
    assert check.logits_error <= 1e-4, check.summary()
    assert check.loss_error <= 1e-4, check.summary()
    assert check.gradient_error <= 1e-3, check.summary()  # the worst of all parameters, fused ones split
    assert not check.without_gradient and not check.missing_parameters, check.summary()
    assert check.passed


@pytest.mark.parametrize("version,options", VARIANTS, ids=IDS)
def test_bf16_agrees_with_v1_fp32_within_bf16_tolerance(v1_model, reference, version, options):
    check = check_parity(_with_v1_weights(v1_model, version, options), reference, "bf16")
    assert check.passed, check.summary()
    assert check.logits_error > 0  # it really ran in bf16 (fp32 would match to ~1e-7)


@pytest.mark.parametrize("version,options", VARIANTS, ids=IDS)
def test_every_parameter_receives_a_nonzero_gradient(version, options):
    torch.manual_seed(0)
    model = build(version, CONFIG, **options)  # the training initialisation
    tokens = torch.randint(0, CONFIG.vocab_size, (2, 16))
    lm_loss(model(tokens), tokens).backward()
    assert parameters_without_gradient(model) == []
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_fp16_v4_agrees_within_fp16_tolerance(v1_model, reference):
    check = check_parity(_with_v1_weights(v1_model, "v4", {"compile": False}), reference, "fp16")
    assert check.passed, check.summary()


# ------------------------------------------------------------------------------------------------
# Weight transfer
# ------------------------------------------------------------------------------------------------


def test_fused_weights_are_v1_weights_concatenated_in_order(v1_model):
    v2 = _with_v1_weights(v1_model, "v2", {})
    a1, m1 = v1_model.layers[1].attn, v1_model.layers[1].mlp
    a2, m2 = v2.layers[1].attn, v2.layers[1].mlp
    assert torch.equal(a2.qkv_proj.weight, torch.cat([a1.q_proj.weight, a1.k_proj.weight, a1.v_proj.weight]))
    assert torch.equal(m2.gate_up_proj.weight, torch.cat([m1.gate_proj.weight, m1.up_proj.weight]))
    assert torch.equal(a2.o_proj.weight, a1.o_proj.weight)


def test_transfer_round_trip_through_every_version_is_exact(v1_model):
    model = v1_model
    for version, options in VARIANTS + [("v1", {})]:
        model = _with_v1_weights(model, version, options)
    start, end = canonical_state_dict(v1_model), canonical_state_dict(model)
    assert start.keys() == end.keys()
    assert all(torch.equal(start[k], end[k]) for k in start)


def test_transfer_refuses_a_model_of_another_shape(v1_model):
    other = build("v2", make_config("ci", hidden_dim=32, num_heads=4, num_kv_heads=2))
    with pytest.raises(ValueError, match="shape"):
        transfer_weights(v1_model, other)


# ------------------------------------------------------------------------------------------------
# The check fails when a version computes something else
# ------------------------------------------------------------------------------------------------


def _fails(v1_model, reference, version="v2", options=None):
    check = check_parity(_with_v1_weights(v1_model, version, options or {}), reference, "fp32")
    assert not check.passed, f"a broken model passed the check: {check.summary()}"
    return check


def test_check_catches_a_missing_rotary_embedding_on_k(v1_model, reference, monkeypatch):
    def no_rotary_on_k(self, x):
        q, k, v = self.qkv_proj(x).split([self.q_dim, self.kv_dim, self.kv_dim], dim=-1)
        q, k, v = (self.split_heads(t, h) for t, h in ((q, self.num_heads), (k, self.num_kv_heads),
                                                        (v, self.num_kv_heads)))
        return self.rope(q), k, v

    monkeypatch.setattr(v2_fused.FusedAttention, "project_qkv", no_rotary_on_k)
    assert _fails(v1_model, reference).logits_error > 100 * TOLERANCES["fp32"].logits


def test_check_catches_a_wrong_concatenation_order(v1_model, reference, monkeypatch):
    original = v2_fused.TinyLlama.fused_weights

    def k_and_v_swapped(self):
        spec = original(self)
        q, k, v = spec["attn.qkv_proj.weight"]
        return {**spec, "attn.qkv_proj.weight": [q, v, k]}

    monkeypatch.setattr(v2_fused.TinyLlama, "fused_weights", k_and_v_swapped)
    _fails(v1_model, reference)


def test_check_catches_gate_and_up_swapped(v1_model, reference, monkeypatch):
    def swapped(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(torch.nn.functional.silu(up) * gate)

    monkeypatch.setattr(v2_fused.FusedFeedForward, "forward", swapped)
    _fails(v1_model, reference)


def test_check_catches_a_cut_graph(v1_model, reference):
    """The original V3's defect: a norm whose output is detached. The forward is unchanged, but the
    norm's weight gets no gradient and the layers before it get wrong ones (only the residual path)."""
    model = _with_v1_weights(v1_model, "v4", {"compile": False})
    norm = model.layers[1].attn_norm
    norm.forward = lambda x, f=norm.forward: f(x).detach()
    check = check_parity(model, reference, "fp32")
    assert check.logits_error <= 1e-4  # the forward alone would not notice
    assert not check.passed
    assert check.without_gradient == ["layers.1.attn_norm.weight"]
    assert check.gradient_error > 0.1


def test_a_gradient_error_alone_fails_the_check():
    def check(gradient_error):
        return ParityCheck("fp32", logits_error=0.0, loss_error=0.0, gradient_error=gradient_error,
                           worst_parameter="w", without_gradient=[], missing_parameters=[],
                           tolerance=TOLERANCES["fp32"])

    assert check(0.5 * TOLERANCES["fp32"].gradients).passed
    assert not check(2 * TOLERANCES["fp32"].gradients).passed


class _DoubledGradient(torch.autograd.Function):
    """The identity forward, twice the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad


def test_check_catches_a_right_forward_with_a_doubled_backward(v1_model, reference):
    class DoubledBackward(type(v1_model)):
        def forward(self, input_ids):
            return _DoubledGradient.apply(super().forward(input_ids))

    torch.manual_seed(1)
    model = transfer_weights(v1_model, DoubledBackward(CONFIG))
    check = check_parity(model, reference, "fp32")
    assert check.logits_error <= 1e-5 and check.loss_error <= 1e-5  # the forward is right
    assert not check.passed and check.gradient_error == pytest.approx(1.0, rel=1e-3)


# ------------------------------------------------------------------------------------------------
# SDPA, switches, compile
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("native_gqa", [False, True] if v2_fused.SDPA_HAS_GQA else [False])
def test_sdpa_grouped_query_attention_matches_v1s_explicit_attention(native_gqa):
    torch.manual_seed(0)
    attention = Attention(CONFIG)
    q = torch.randn(2, CONFIG.num_heads, 20, CONFIG.head_dim, requires_grad=True)
    k = torch.randn(2, CONFIG.num_kv_heads, 20, CONFIG.head_dim, requires_grad=True)
    v = torch.randn(2, CONFIG.num_kv_heads, 20, CONFIG.head_dim, requires_grad=True)
    expected = attention.attend(q, k, v)
    got = v2_fused.causal_sdpa(q, k, v, native_gqa=native_gqa)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    weights = torch.randn_like(expected)
    grads_expected = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    grads_got = torch.autograd.grad((got * weights).sum(), (q, k, v))
    for a, b in zip(grads_got, grads_expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_switches_change_the_structure_they_name():
    plain = build("v2", CONFIG, fuse_qkv=False, fuse_gate_up=False)
    fused = build("v2", CONFIG, fuse_qkv=True, fuse_gate_up=True, sdpa=True)
    names = {n for n, _ in plain.named_parameters()}
    assert "layers.0.attn.q_proj.weight" in names and "layers.0.mlp.gate_proj.weight" in names
    fused_names = {n for n, _ in fused.named_parameters()}
    assert "layers.0.attn.qkv_proj.weight" in fused_names and "layers.0.mlp.gate_up_proj.weight" in fused_names
    assert not any(n.endswith(("q_proj.weight", "gate_proj.weight")) for n in fused_names)
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in fused.parameters())
    assert not hasattr(fused.layers[0].attn, "causal_mask")  # SDPA needs no (seq x seq) mask


@pytest.mark.parametrize("mode,marks", [("default", 0), ("reduce-overhead", 1), ("max-autotune", 1)])
def test_cuda_graph_modes_start_a_new_step_at_each_forward(monkeypatch, mode, marks):
    # CUDA graph trees must see one forward of the regionally compiled blocks as one step.
    calls = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: calls.append(1))
    model = build("v2", CONFIG, sdpa=True, compile=True, compile_mode=mode)
    tokens = torch.randint(0, CONFIG.vocab_size, (1, 8))
    with torch._dynamo.config.patch(disable=True):  # the blocks run eagerly: only the marks are tested
        model(tokens)
        model(tokens)
    assert len(calls) == 2 * marks


def test_unknown_compile_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="compile_mode.*default"):
        build("v2", CONFIG, compile=True, compile_mode="fastest")


def test_v4_asks_for_bf16_and_fused_adamw():
    cls = model_class("v4")
    assert cls.preferred_precision == "bf16" and cls.fused_optimizer is True
    assert {"v2", "v4"} <= set(models.DESCRIPTIONS) and models.transfer_weights is transfer_weights


def test_compiled_v4_matches_v1_and_keeps_its_parameter_names(v1_model, reference):
    """One compiled case on the CPU (about 15 s): regional compilation of every block."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = _with_v1_weights(v1_model, "v4", {"compile": True})
    eager = build("v4", CONFIG, compile=False)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    check = check_parity(compiled, reference, "fp32")
    assert check.passed, check.summary()
    assert counters["stats"]["unique_graphs"] == 1  # compiled once, and reused by the other block
    assert counters["stats"]["calls_captured"] > 0
    # A second model with the same switches reuses the graph (no recompilation per model, which
    # would soon reach torch.compile's recompile limit and fall back to eager in a notebook).
    again = _with_v1_weights(v1_model, "v4", {"compile": True})
    check_parity(again, reference, "fp32")
    assert counters["stats"]["unique_graphs"] == 1
