"""tinyllama.data: a deterministic corpus from the standard library, byte tokens, windows, and a loader
whose batches do not depend on its number of workers; on this text the loss falls."""

import pytest
import torch

from tinyllama.data import ByteTokenizer, TokenWindows, build_corpus, make_loader, stdlib_files, validation_batches
from tinyllama.harness.bench import run_benchmark


@pytest.fixture(scope="module")
def corpus():
    return build_corpus(2**19, seed=0)


def test_the_corpus_is_real_source_deterministic_for_a_seed_and_sized(corpus):
    assert len(stdlib_files()) > 100
    again, other = build_corpus(2**19, seed=0), build_corpus(2**19, seed=1)
    assert again.train == corpus.train and again.validation == corpus.validation
    assert other.train != corpus.train  # the seed chooses the files
    total = len(corpus.train) + len(corpus.validation)
    assert 2**19 * 0.95 <= total <= 2**19 + 16
    assert 0.03 < len(corpus.validation) / total < 0.07
    text = corpus.train.decode("utf-8", errors="replace")
    assert text.count("def ") > 50 and text.count("import ") > 10  # Python source, not noise


def test_byte_tokens_round_trip_and_windows_shift_by_one():
    tokenizer = ByteTokenizer()
    text = "def f(x):\n    return 'é' * x\n"
    ids = tokenizer.encode(text)
    assert ids.dtype == torch.int64 and int(ids.max()) < tokenizer.vocab_size and tokenizer.decode(ids) == text
    windows = TokenWindows(text.encode() * 3, seq_len=8)
    inputs, targets = windows[2]
    assert inputs.shape == targets.shape == (8,)
    assert torch.equal(inputs[1:], targets[:-1])  # next-token targets
    assert len(windows) == (len(text.encode()) * 3 - 9) // 8 + 1
    with pytest.raises(ValueError, match="fewer than one window"):
        TokenWindows(b"short", seq_len=8)


def test_a_loader_with_workers_yields_the_same_batches_as_one_without(corpus):
    windows = TokenWindows(corpus.train, seq_len=32)
    single = make_loader(windows, 4, num_workers=0, seed=3)
    workers = make_loader(windows, 4, num_workers=2, prefetch_factor=2, seed=3)
    first = [b for b, _ in zip(single, range(12))]
    second = [b for b, _ in zip(workers, range(12))]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, second))
    other_seed = next(iter(make_loader(windows, 4, seed=4)))
    assert not torch.equal(other_seed[0], first[0][0])
    held_out = validation_batches(corpus, 32, 4, 3)
    assert len(held_out) == 3 and held_out[0][0].shape == (4, 32)


def test_the_loss_falls_on_real_text(corpus):
    torch.manual_seed(0)
    loader = make_loader(TokenWindows(corpus.train, seq_len=32), 4, seed=0)
    result = run_benchmark("v1", "ci", batch_size=4, seq_len=32, num_steps=25, warmup_steps=0, loader=loader,
                           lr=3e-3, vocab_size=256, progress=False)
    first, last = result.losses[0], sum(result.losses[-5:]) / 5
    assert first == pytest.approx(torch.log(torch.tensor(256.0)).item(), abs=0.3)  # untrained: uniform over bytes
    assert last < first - 1.0, f"the loss fell only from {first:.2f} to {last:.2f}"
    assert result.data_ms is not None and result.data_source == "DataLoader"
