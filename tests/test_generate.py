"""Generation with a KV cache computes what recomputing the whole sequence computes, in every version.

The reference is each model's own forward over the whole sequence at every step (``use_cache=False``).
The mutation tests at the end show that the equality check has teeth: a cache written one slot off, or
decode tokens rotated as if at position 0, make it fail.
"""

import json

import pytest
import torch
from conftest import GPU
from table_cells import table_rows

import tinyllama.generation.cache as cache_module
from tinyllama.config import get_preset
from tinyllama.generation import (
    CachedDecoder,
    KVCache,
    Recompute,
    Sampling,
    cast_for_inference,
    check_generation,
    decode_bytes,
    decode_flops,
    decode_loop,
    generate,
    teacher_forced_logits,
)
from tinyllama.generation.benchmark import check_init_std, summary_table
from tinyllama.harness.generate import main
from tinyllama.harness.records import markdown_table
from tinyllama.models import VERSIONS, build, model_class, transfer_weights

CONFIG = get_preset("ci").model
PROMPT_LEN, NEW_TOKENS = 11, 6  # not powers of two
ATOL = 1e-4  # fp32: the cached and the recomputed logits differ by rounding only (about 1e-6)


def _uncompiled(version: str) -> dict[str, bool]:
    """V2/V3/V4 built without torch.compile (as tests/test_parity.py does): the cache path never runs
    the compiled blocks, and the no-cache reference would compile for every new length on the CPU."""
    return {"compile": False} if "compile" in model_class(version).switch_names else {}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The ci model's matmuls (batch 3 x hidden 64) gain nothing from a second thread, and while another
    process keeps the other core busy, OpenMP's waiting made them 30x slower here. Restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def v1_model():
    torch.manual_seed(0)
    model = build("v1", CONFIG)
    model.reset_parameters(check_init_std(CONFIG))  # attention far from uniform: positions matter
    return model.eval()


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(0, CONFIG.vocab_size, (3, PROMPT_LEN), generator=torch.Generator().manual_seed(1))


def _model(v1_model, version):
    torch.manual_seed(1)  # a different initialisation: only the transfer can make them agree
    return transfer_weights(v1_model, build(version, CONFIG, **_uncompiled(version))).eval()


@torch.no_grad()
def assert_cache_matches_reference(model, prompt, new_tokens, static=False):
    """Greedy tokens with the cache equal the tokens of the no-cache reference (the model's own forward
    over the whole sequence at every step), and the cached logits equal the reference's: at every prompt
    position (prefill) and at every generated position (decode, fed the reference's tokens)."""
    batch, length = prompt.shape
    capacity = length + new_tokens
    seen = []  # the logits the reference chose each token from

    def pick(logits):
        seen.append(logits.clone())
        return logits.argmax(dim=-1)

    expected = decode_loop(Recompute(model, batch, capacity), prompt, new_tokens, pick)
    assert torch.equal(expected, generate(model, prompt, new_tokens, use_cache=False))
    tokens = generate(model, prompt, new_tokens, runner=CachedDecoder(model, batch, capacity, static=static))
    assert torch.equal(tokens, expected), f"cached tokens {tokens.tolist()} != recomputed {expected.tolist()}"
    prefill = CachedDecoder(model, batch, capacity, static=static).prefill(prompt, all_logits=True)
    torch.testing.assert_close(prefill, model(prompt), rtol=0, atol=ATOL)
    decoded = teacher_forced_logits(CachedDecoder(model, batch, capacity, static=static), prompt, expected)
    torch.testing.assert_close(decoded, torch.stack(seen, dim=1), rtol=0, atol=ATOL)
    return expected


# ------------------------------------------------------------------------------------------------
# The cache computes the model's function
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_cached_generation_equals_recomputation_in_every_version(v1_model, prompt, version, device):
    """Tokens and logits at every position, each version with its own kernels (V3: Triton RMSNorm and
    SwiGLU with the cache; flash attention in its reference, whose Triton interpreter costs about a
    second per forward on a CPU: there V3 gets 2 x 7 prompt tokens and 4 new ones)."""
    model, prompt = _model(v1_model, version).to(device), prompt.to(device)
    if version == "v3" and not GPU:
        assert_cache_matches_reference(model, prompt[:2, :7], 4)
    else:
        assert_cache_matches_reference(model, prompt, NEW_TOKENS)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_static_decode_step_computes_the_same(v1_model, prompt, version, device):
    """The step that torch.compile and CUDA graphs use: all cache slots read, the unwritten ones masked."""
    assert_cache_matches_reference(_model(v1_model, version).to(device), prompt.to(device), NEW_TOKENS, static=True)


@pytest.mark.parametrize("length", [1, 5, 13])
def test_prompt_lengths(v1_model, length):
    prompt = torch.randint(0, CONFIG.vocab_size, (2, length), generator=torch.Generator().manual_seed(length))
    assert_cache_matches_reference(v1_model, prompt, 9)


def test_each_sequence_of_a_batch_is_generated_as_if_alone(v1_model, prompt):
    together = generate(v1_model, prompt, NEW_TOKENS)
    for row in range(prompt.shape[0]):
        alone = generate(v1_model, prompt[row:row + 1], NEW_TOKENS)
        assert torch.equal(alone[0], together[row]), f"sequence {row} depends on the others in its batch"
    assert len({tuple(t) for t in together.tolist()}) > 1  # the sequences really differ


def test_sampled_decoding_is_reproducible_and_differs_from_greedy(v1_model, prompt):
    def sample(seed, use_cache=True, **options):
        return generate(v1_model, prompt, 12, greedy=False, generator=torch.Generator().manual_seed(seed),
                        use_cache=use_cache, **options)

    first = sample(5)
    assert torch.equal(first, sample(5))
    assert torch.equal(first, sample(5, use_cache=False))  # same logits, same draws
    assert not torch.equal(first, sample(6))
    assert not torch.equal(first, generate(v1_model, prompt, 12))
    assert torch.equal(sample(5, top_k=1), generate(v1_model, prompt, 12))  # top-1 sampling is greedy
    limited = sample(7, top_k=3, temperature=0.7)
    assert limited.min() >= 0 and limited.max() < CONFIG.vocab_size
    with pytest.raises(ValueError, match="temperature"):
        Sampling(greedy=False, temperature=0.0)


# ------------------------------------------------------------------------------------------------
# The cache itself
# ------------------------------------------------------------------------------------------------


@torch.no_grad()
def test_the_cache_is_written_exactly_at_the_fed_positions(v1_model, prompt):
    """NaN everywhere first: after a prefill of L and n decode steps, slots 0..L+n-1 hold numbers and
    the others still NaN. An eager step never reads a slot after its position (else the logits would be NaN)."""
    steps = 4
    decoder = CachedDecoder(v1_model, prompt.shape[0], CONFIG.max_seq_len)
    decoder.cache.k.fill_(float("nan"))
    decoder.cache.v.fill_(float("nan"))
    tokens = generate(v1_model, prompt, steps + 1, runner=decoder)  # the last token is never fed back
    written = ~decoder.cache.k.isnan().any(dim=(0, 1, 2, 4))
    assert written.tolist() == [p < PROMPT_LEN + steps for p in range(CONFIG.max_seq_len)]
    assert torch.equal(written, ~decoder.cache.v.isnan().any(dim=(0, 1, 2, 4)))
    assert torch.equal(tokens, generate(v1_model, prompt, steps + 1, use_cache=False))
    # The keys of layer 0 are the model's own, rotated to their absolute positions.
    sequence = torch.cat([prompt, tokens[:, :-1]], dim=1)
    layer = v1_model.layers[0]
    _, keys, values = layer.attn.project_qkv(layer.attn_norm(v1_model.embed(sequence)))
    torch.testing.assert_close(decoder.cache.k[0, :, :, :sequence.shape[1]], keys, rtol=0, atol=1e-5)
    torch.testing.assert_close(decoder.cache.v[0, :, :, :sequence.shape[1]], values, rtol=0, atol=1e-5)


@torch.no_grad()
def test_the_static_step_masks_slots_not_written_yet(v1_model, prompt):
    """Large finite garbage in the free slots (NaN would poison even masked products) changes nothing."""
    decoder = CachedDecoder(v1_model, prompt.shape[0], PROMPT_LEN + NEW_TOKENS, static=True)
    decoder.cache.k.fill_(1e4)
    decoder.cache.v.fill_(-1e4)
    assert torch.equal(generate(v1_model, prompt, NEW_TOKENS, runner=decoder), generate(v1_model, prompt, NEW_TOKENS))


@torch.no_grad()
def test_a_cache_writer_replaces_the_write_and_the_default_is_in_place(v1_model, prompt):
    """``cache_writer`` (notebook 22's seam) is called for every layer of every forward with one layer's cache;
    a writer that writes the same slots gives the same tokens, and one that writes a slot late does not."""
    calls = []

    def same(cache_k, cache_v, positions, k, v):
        calls.append((tuple(cache_k.shape), positions.tolist()))
        cache_k[:, :, positions] = k
        cache_v[:, :, positions] = v

    expected = generate(v1_model, prompt, NEW_TOKENS, use_cache=False)
    decoder = CachedDecoder(v1_model, prompt.shape[0], PROMPT_LEN + NEW_TOKENS, cache_writer=same)
    assert torch.equal(generate(v1_model, prompt, NEW_TOKENS, runner=decoder), expected)
    shape = (prompt.shape[0], CONFIG.num_kv_heads, PROMPT_LEN + NEW_TOKENS, CONFIG.head_dim)
    assert calls[0] == (shape, list(range(PROMPT_LEN)))  # the prefill, layer 0
    assert len(calls) == CONFIG.num_layers * NEW_TOKENS and calls[-1] == (shape, [PROMPT_LEN + NEW_TOKENS - 2])

    def late(cache_k, cache_v, positions, k, v):
        same(cache_k, cache_v, (positions + 1).clamp(max=cache_k.shape[2] - 1), k, v)

    decoder = CachedDecoder(v1_model, prompt.shape[0], PROMPT_LEN + NEW_TOKENS, cache_writer=late)
    assert not check_generation(decoder, v1_model, prompt, NEW_TOKENS, "fp32").passed
    default = CachedDecoder(v1_model, prompt.shape[0], PROMPT_LEN + NEW_TOKENS)
    assert default.cache.writer is None and cache_module.KVCache.write.__doc__  # the default: write_in_place
    k = torch.zeros(1, 1, 4, 2)
    cache_module.write_in_place(k, k.clone(), torch.tensor([2]), torch.ones(1, 1, 1, 2), torch.ones(1, 1, 1, 2))
    assert k[0, 0, :, 0].tolist() == [0, 0, 1, 0]


def test_cache_shape_dtype_and_size():
    cache = KVCache.allocate(CONFIG, batch=3, capacity=20, dtype=torch.bfloat16, device="cpu")
    assert cache.k.shape == (CONFIG.num_layers, 3, CONFIG.num_kv_heads, 20, CONFIG.head_dim) == cache.v.shape
    assert cache.k.dtype == torch.bfloat16 and cache.capacity == 20
    assert cache.nbytes == 2 * 2 * 3 * 2 * 20 * 16 * 2  # k and v, layers, batch, kv heads, slots, head_dim, bytes


def test_a_cache_beyond_max_seq_len_and_a_position_outside_it_are_refused(v1_model, prompt):
    with pytest.raises(ValueError, match="max_seq_len"):
        CachedDecoder(v1_model, 1, CONFIG.max_seq_len + 1)
    with pytest.raises(ValueError, match="max_seq_len"):
        generate(v1_model, prompt, CONFIG.max_seq_len)
    with pytest.raises(ValueError, match="outside the cache"):
        CachedDecoder(v1_model, 3, 8).decode(prompt[:, 0], 8)
    if not GPU:
        with pytest.raises(ValueError, match="GPU"):
            CachedDecoder(v1_model, 1, 8, cuda_graph=True)


# ------------------------------------------------------------------------------------------------
# Bytes and FLOPs of a decode step
# ------------------------------------------------------------------------------------------------


def test_decode_bytes_against_a_hand_count():
    # ci: vocab 128, hidden 64, 2 layers, 4 heads of 16, 2 K/V heads (kv_dim 32), intermediate 160.
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 160 + 2 * 64  # q, k+v, o, gate/up/down, 2 norms
    weights = 2 * per_layer + 64 + 128 * 64 + 3 * 64  # layers, final norm, lm head, 3 embedding rows
    assert weights == 94720
    assert weights == sum(p.numel() for p in build("v1", CONFIG).parameters()) - 128 * 64 + 3 * 64
    cache = 2 * 2 * 3 * 32 * (10 + 1)  # K and V, layers, batch, kv_dim, 10 positions read + 1 written
    assert decode_bytes(CONFIG, 3, 10, torch.float32) == 4 * (weights + cache) == 395_776
    assert decode_bytes(CONFIG, 3, 10, "bf16") == 2 * (weights + cache)


@torch.no_grad()
def test_decode_flops_against_a_hand_count_and_the_flop_counter(v1_model, prompt):
    from torch.utils.flop_counter import FlopCounterMode

    matmul_weights = 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 160) + 128 * 64  # layers, lm head
    attention = 2 * 4 * 3 * 10 * 64  # layers, q k^T and probs v at 2 FLOPs each, batch, context, heads x head_dim
    assert decode_flops(CONFIG, 3, 10) == 2 * matmul_weights * 3 + attention == 580_608
    decoder = CachedDecoder(v1_model, 3, 16)
    decoder.prefill(prompt[:, :9])
    with FlopCounterMode(display=False) as counter:
        decoder.decode(prompt[:, 9], 9)  # the token at position 9 attends to 10 positions
    assert counter.get_total_flops() == decode_flops(CONFIG, 3, 10)


# ------------------------------------------------------------------------------------------------
# The check before timing, and the command line
# ------------------------------------------------------------------------------------------------


def test_the_check_passes_in_fp32_and_within_tolerance_in_bf16(v1_model, prompt):
    model = _model(v1_model, "v2")
    fp32 = check_generation(CachedDecoder(model, 3, 20), v1_model, prompt, 8, "fp32")
    assert fp32.passed and fp32.first_divergence is None and fp32.logits_error < 1e-5, fp32.summary()
    cast_for_inference(model, "bf16")
    bf16 = check_generation(CachedDecoder(model, 3, 20), v1_model, prompt, 8, "bf16")
    assert bf16.passed and 1e-4 < bf16.logits_error < bf16.tolerance, bf16.summary()  # it really ran in bf16
    assert model.layers[0].attn.rope.cos.dtype == torch.float32  # the rotary tables stay fp32


def test_the_command_line_checks_times_and_records(tmp_path, capsys):
    out = tmp_path / "runs.json"
    flags = ["--preset", "ci", "--version", "v2", "--batch-size", "2", "--prompt-len", "9", "--new-tokens", "5",
             "--warmup-steps", "1", "--num-steps", "3", "--device", "cpu", "--quiet", "--json", str(out)]
    assert main([*flags, "--check"]) == 0
    assert main([*flags, "--no-cache", "--precision", "bf16"]) == 0
    printed = capsys.readouterr().out
    assert "check passed (fp32" in printed and "greedy tokens identical" in printed
    assert "ms/token" in printed and "GB/s" in printed and "of the measured copy bandwidth" in printed
    cached, recomputed = json.loads(out.read_text())
    assert cached["mode"] == "cache eager" and recomputed["mode"] == "no cache"
    assert cached["decode_ms_n"] == 3 and cached["decode_ms_median"] > 0 and cached["prefill_ms_median"] > 0
    assert cached["decode_bytes"] == pytest.approx(decode_bytes(CONFIG, 2, 9 + 5 / 2, torch.float32))
    assert cached["achieved_gbs"] == pytest.approx(cached["decode_bytes"] / cached["decode_ms_median"] / 1e6)
    assert cached["copy_fraction"] == pytest.approx(cached["achieved_gbs"] / cached["copy_gbs"])
    assert recomputed["decode_bytes"] == pytest.approx(cached["decode_bytes"] / 2)  # bf16
    table = markdown_table(summary_table([cached, recomputed]))  # the GPU script's summary
    header, rule, first, second = table_rows(table)
    assert header[:5] == ["preset", "version", "precision", "mode", "batch"] and header[-1] == "% of copy GB/s"
    assert first[:5] == ["ci", "v2", "fp32", "cache eager", "2"] and second[3] == "no cache"
    assert rule[0].startswith(":") and all(cell.endswith(":") for cell in rule[4:])  # numbers right-aligned


@pytest.mark.parametrize("args, message", [
    (["--preset", "gigantic"], "unknown preset"),
    (["--preset", "ci", "--batch-size", "0"], "at least 1"),
    (["--preset", "ci", "--prompt-len", "120", "--new-tokens", "16"], "exceed max_seq_len 128"),
    (["--preset", "ci", "--precision", "fp16"], "unknown precision"),
    (["--preset", "ci", "--version", "v9"], "unknown version"),
    (["--preset", "ci", "--no-cache", "--compile"], "cached decode step"),
    pytest.param(["--preset", "ci", "--cuda-graphs"], "needs a GPU",
                 marks=pytest.mark.skipif(GPU, reason="the message of a machine without a GPU")),
])
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    assert main([*args, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_the_command_line_refuses_to_time_a_wrong_cache(monkeypatch, capsys):
    monkeypatch.setattr(cache_module, "rotary_rows", _rotate_decode_tokens_at_position_0)
    assert main(["--preset", "ci", "--batch-size", "2", "--new-tokens", "5", "--check", "--device", "cpu",
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "check FAILED (fp32" in err and "not timed" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------------------
# The equality check has teeth
# ------------------------------------------------------------------------------------------------

_rotary_rows = cache_module.rotary_rows
_write = cache_module.KVCache.write


def _rotate_decode_tokens_at_position_0(rope, positions, dtype):
    return _rotary_rows(rope, positions * 0 if positions.numel() == 1 else positions, dtype)


def _write_one_slot_later(self, layer, positions, k, v):
    _write(self, layer, (positions + 1).clamp(max=self.capacity - 1), k, v)


@pytest.mark.parametrize("name, target, mutant", [
    ("RoPE at position 0 for decode tokens", "rotary_rows", _rotate_decode_tokens_at_position_0),
    ("cache positions off by one", "write", _write_one_slot_later),
])
def test_the_equality_check_catches_a_broken_cache(monkeypatch, v1_model, prompt, name, target, mutant):
    if target == "rotary_rows":
        monkeypatch.setattr(cache_module, "rotary_rows", mutant)
    else:
        monkeypatch.setattr(cache_module.KVCache, "write", mutant)
    with pytest.raises(AssertionError):
        assert_cache_matches_reference(v1_model, prompt, NEW_TOKENS)
    check = check_generation(CachedDecoder(v1_model, 3, 20), v1_model, prompt, 8, "fp32")
    assert not check.passed and check.logits_error > 0.1, check.summary()


# ------------------------------------------------------------------------------------------------
# GPU: the compiled and graphed step
# ------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["v1", "v3", "v4"])
@pytest.mark.parametrize("compile", [False, True])
def test_cuda_graph_and_compiled_steps_match_the_reference(v1_model, prompt, version, compile):
    reference = transfer_weights(v1_model, build("v1", CONFIG)).cuda().eval()
    model = _model(v1_model, version).cuda()
    prompt = prompt.cuda()
    for precision in ("fp32", "bf16"):
        cast_for_inference(model, precision)
        decoder = CachedDecoder(model, 3, PROMPT_LEN + 12, compile=compile, cuda_graph=True)
        check = check_generation(decoder, reference, prompt, 12, precision)
        assert check.passed, check.summary()
        again = check_generation(decoder, reference, prompt, 12, precision)  # replays the same graph
        assert again.passed and decoder._graph is not None, again.summary()
