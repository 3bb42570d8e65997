"""Real text to train on, with nothing to download: the source files of Python's standard library.

Every machine that runs the course has them (they are the Python that runs it), so the training data
is real text, with structure a model can learn, and costs no network access. Four pieces:

- :func:`build_corpus`: a deterministic selection of the standard library's ``.py`` files (shuffled
  by a seed, cut at a byte budget), split into a training and a validation part;
- :class:`ByteTokenizer`: one token per byte (vocabulary 256): no training, no unknown tokens, and
  every text round-trips exactly;
- :class:`TokenWindows`: a map-style ``Dataset`` of fixed-length windows over the token stream, each
  ``(inputs, targets)`` with the targets shifted by one token; tokenized when an item is read, in
  the process that reads it (a loader's worker);
- :func:`make_loader`: a ``DataLoader`` with workers, pinned memory and prefetching, whose batches
  depend only on the seed (the same with 0 or 8 workers).

The corpus is the running Python's own library, so its bytes differ between Python versions: code
and tests rely on its properties (size, determinism for a seed, a learnable structure), never on
exact tokens.
"""

from __future__ import annotations

import os
import random
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from tinyllama import device as dev

# Folders of the standard library left out: test suites (large, full of deliberately odd files),
# installed third-party packages, and the IDLE editor's icons and data.
EXCLUDED_PARTS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
SEPARATOR = b"\n\n"  # between two files of the corpus


def stdlib_root() -> Path:
    """The folder of the running Python's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The standard library's ``.py`` files (tests and third-party packages excluded), sorted by their
    path relative to ``root``, so the list is the same on every run of one Python installation."""
    root = stdlib_root() if root is None else Path(root)
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in EXCLUDED_PARTS]  # not walked at all: site-packages is large
        files.extend(Path(folder) / name for name in names if name.endswith(".py"))
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


@dataclass
class Corpus:
    """Training and validation text as bytes, and which files they came from."""

    train: bytes
    validation: bytes
    files: list[str] = field(repr=False)
    seed: int = 0

    def describe(self) -> str:
        return (f"{len(self.files)} files of Python's standard library (seed {self.seed}): "
                f"{len(self.train) / 2**20:.2f} MiB to train on, {len(self.validation) / 2**20:.2f} MiB held out")


def build_corpus(max_bytes: int = 8 * 2**20, seed: int = 0, validation_fraction: float = 0.05,
                 root: Path | None = None) -> Corpus:
    """Up to ``max_bytes`` of the standard library's source: files in an order shuffled by ``seed``,
    joined by blank lines; the last ``validation_fraction`` of the bytes is held out for validation,
    so no validation window shares text with a training one.

    Deterministic: the same Python installation and seed give the same bytes. Raises
    ``FileNotFoundError`` where the installation ships no ``.py`` sources (some minimal images keep
    only compiled files)."""
    if max_bytes < 1024:
        raise ValueError(f"max_bytes {max_bytes} is too small for a corpus: use at least 1024")
    if not 0.0 < validation_fraction < 0.5:
        raise ValueError(f"validation_fraction must be between 0 and 0.5 (got {validation_fraction})")
    root = stdlib_root() if root is None else Path(root)
    files = stdlib_files(root)
    if not files:
        raise FileNotFoundError(f"no Python source files under {root}: this Python installation ships no "
                                "standard-library sources; use a full Python (conda, pyenv, python.org, venv)")
    random.Random(seed).shuffle(files)
    chosen: list[tuple[str, bytes]] = []
    total = 0
    for path in files:
        text = path.read_bytes()
        if not text.strip():
            continue  # empty __init__.py files add nothing but separators
        take = text[: max_bytes - total]
        chosen.append((path.relative_to(root).as_posix(), take))
        total += len(take) + len(SEPARATOR)
        if total >= max_bytes:
            break
    text = SEPARATOR.join(data for _, data in chosen)
    # The last bytes are held out: no validation window shares a token with a training window.
    split = len(text) - int(len(text) * validation_fraction)
    train, validation = text[:split], text[split:]
    return Corpus(train, validation, [name for name, _ in chosen], seed)


class ByteTokenizer:
    """One token per byte of the UTF-8 encoding: token ids 0..255.

    Byte-level tokenization needs no training and has no unknown tokens; the price is longer
    sequences than a trained BPE vocabulary would give (about 3-4x on English or code).
    """

    vocab_size = 256

    def encode(self, text: str | bytes) -> torch.Tensor:
        """Token ids (int64) of ``text``."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        if not data:
            return torch.empty(0, dtype=torch.int64)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        """The text of ``ids`` (invalid UTF-8, e.g. a cut multi-byte character, shown as U+FFFD)."""
        values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        if any(not 0 <= v < 256 for v in values):
            raise ValueError("byte tokens are 0..255: these ids come from another tokenizer")
        return bytes(values).decode("utf-8", errors="replace")


class TokenWindows(Dataset):
    """Windows of ``seq_len + 1`` tokens over ``text``, ``stride`` tokens apart (default: ``seq_len``,
    windows that share only their boundary token). Item ``i`` is ``(inputs, targets)``: the window's
    first ``seq_len`` tokens and its last ``seq_len`` (next-token prediction), int64.

    The text stays bytes and each item is tokenized when it is read, so the work happens in whichever
    process reads it: the main process, or a ``DataLoader`` worker.
    """

    def __init__(self, text: bytes, seq_len: int, tokenizer: ByteTokenizer | None = None,
                 stride: int | None = None) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be at least 1 (got {seq_len})")
        self.text = bytes(text)
        self.seq_len = seq_len
        self.stride = seq_len if stride is None else stride
        if self.stride < 1:
            raise ValueError(f"stride must be at least 1 (got {self.stride})")
        self.tokenizer = tokenizer or ByteTokenizer()
        if len(self.text) < seq_len + 1:
            raise ValueError(f"the text has {len(self.text)} tokens, fewer than one window of seq_len + 1 = "
                             f"{seq_len + 1}: build a larger corpus or use a shorter sequence")

    def __len__(self) -> int:
        return (len(self.text) - self.seq_len - 1) // self.stride + 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"window {index} of {len(self)}")
        start = (index % len(self)) * self.stride
        tokens = self.tokenizer.encode(self.text[start:start + self.seq_len + 1])
        return tokens[:-1], tokens[1:]


def make_loader(dataset: Dataset, batch_size: int, *, num_workers: int = 0, pin_memory: bool | None = None,
                prefetch_factor: int | None = 2, shuffle: bool = True, seed: int = 0,
                persistent_workers: bool = False) -> DataLoader:
    """A ``DataLoader`` over ``dataset`` in batches of ``batch_size`` (the last incomplete one dropped,
    so every batch has one shape).

    The order of the items comes from a generator seeded with ``seed`` in the main process, so the
    batches are the same whatever ``num_workers`` is. ``pin_memory=None`` pins where a GPU is present
    (page-locked host memory lets the copy to the GPU run asynchronously); ``prefetch_factor`` is the
    number of batches each worker prepares ahead (used only with workers).
    """
    if batch_size < 1 or num_workers < 0:
        raise ValueError(f"need batch_size >= 1 and num_workers >= 0 (got {batch_size}, {num_workers})")
    if len(dataset) < batch_size:  # type: ignore[arg-type]
        raise ValueError(f"the dataset has {len(dataset)} items, fewer than one batch of {batch_size}: "  # type: ignore[arg-type]
                         "use a smaller batch or a larger corpus")
    if pin_memory is None:
        pin_memory = dev.backend() != "cpu"
    options: dict[str, object] = {}
    if num_workers > 0:
        options.update(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, drop_last=True, num_workers=num_workers,
                      pin_memory=pin_memory, generator=torch.Generator().manual_seed(seed), **options)


def validation_batches(corpus: Corpus, seq_len: int, batch_size: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` fixed batches of the held-out text (in order, not shuffled), for a loss that every
    configuration of a comparison is evaluated on."""
    windows = TokenWindows(corpus.validation, seq_len)
    available = len(windows) // batch_size
    if available < 1:
        raise ValueError(f"the held-out text has {len(windows)} windows of {seq_len} tokens, fewer than one batch of "
                         f"{batch_size}: build a larger corpus")
    loader = make_loader(windows, batch_size, shuffle=False, pin_memory=False)
    return [batch for batch, _ in zip(loader, range(min(count, available)))]
