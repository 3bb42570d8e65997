"""What a generation loop calls (a ``Runner``): ``CachedDecoder`` (eager, static shapes, compiled, CUDA
graph) and ``Recompute`` (no cache, the reference); sampling; ``generate()``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from tinyllama.config import ConfigError, ModelConfig, set_matmul_precision
from tinyllama.generation.cache import KVCache, cached_forward
from tinyllama.models.v1_baseline import RotaryEmbedding
from tinyllama.models.weights import unwrap
from tinyllama.timing import PhaseTimer

# Inference stores the weights and the cache in the precision's dtype (no autocast: a bf16 decode step
# reads 2 bytes per weight, which is the point of it).
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# Inductor options for the compiled decode step (see CachedDecoder).
COMPILE_OPTIONS = {"coordinate_descent_tuning": True}


class Runner(Protocol):
    """``prefill(prompt)`` gives the logits (batch, vocab) after the prompt; ``decode(tokens, p)`` feeds
    ``tokens`` (batch,) at position p and gives the logits after them. A returned tensor may be
    overwritten by the next call (a CUDA graph's output)."""

    def prefill(self, prompt: torch.Tensor) -> torch.Tensor: ...

    def decode(self, tokens: torch.Tensor, position: int) -> torch.Tensor: ...


class CachedDecoder:
    """Generation with a KV cache of ``capacity`` positions for ``batch`` sequences of ``model``.

    Decode steps come in two shapes:

    - eager (default): a step at position p attends to slots 0..p, so its shapes grow every step;
    - static (``static``, implied by ``compile`` and ``cuda_graph``): every step attends to all
      ``capacity`` slots and masks those after p, the token and the position live in device buffers,
      and the cache is updated in place: identical shapes and addresses, as ``torch.compile`` (one
      graph, ``dynamic=False``) and a CUDA graph need. It reads the whole cache every step, masked.

    ``compile`` compiles the static step; ``cuda_graph`` (GPU only) captures it at the first decode,
    after warm-up steps on a side stream, and replays it after. ``cache_writer`` replaces the cache's
    write of each layer's new keys and values (``KVCache.writer``; default ``write_in_place``).
    """

    GRAPH_WARMUP_STEPS = 2  # compilation, autotuning and the allocator settle before capture

    def __init__(self, model: nn.Module, batch: int, capacity: int, *, static: bool = False,
                 compile: bool = False, cuda_graph: bool = False,
                 cache_writer: Callable[..., None] | None = None) -> None:
        self.model = unwrap(model)
        config: ModelConfig = self.model.config
        if capacity > config.max_seq_len:
            raise ConfigError(f"a cache of {capacity} positions exceeds the model's max_seq_len {config.max_seq_len}")
        weight = self.model.lm_head.weight
        self.device = weight.device
        if cuda_graph and self.device.type != "cuda":
            raise ConfigError("CUDA graphs need a GPU (CUDA or ROCm); this model is on the CPU")
        self.batch = batch
        self.cache = KVCache.allocate(config, batch, capacity, weight.dtype, self.device, cache_writer)
        self.static = static or compile or cuda_graph
        self.cuda_graph = cuda_graph
        self._positions = torch.arange(capacity, device=self.device)  # slices of it are views: no copy, no sync
        self._tokens = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        self._position = torch.zeros(1, dtype=torch.long, device=self.device)
        self._step: Callable[..., torch.Tensor] = self.static_step
        if compile:
            # Coordinate-descent tuning lets Inductor tune the batch-1 matrix-vector products it generates
            # (gpt-fast's setting): on an H200 (torch 2.11, 2026-11-26) 1.65 -> 1.58 ms per token at
            # large and 0.75 -> 0.68 at medium, bf16, in CUDA graphs, both checked against the reference.
            self._step = torch.compile(self.static_step, dynamic=False, options=COMPILE_OPTIONS)
        self._graph: torch.cuda.CUDAGraph | None = None
        self._graph_logits: torch.Tensor | None = None

    def prefill(self, prompt: torch.Tensor, all_logits: bool = False) -> torch.Tensor:
        """Write the prompt (batch, len) into the cache at 0..len-1; the logits after its last token
        (batch, vocab), or at every position (batch, len, vocab) with ``all_logits``. Always eager:
        the prompt length varies from call to call."""
        batch, length = prompt.shape
        if batch != self.batch or length > self.cache.capacity:
            raise ValueError(f"this decoder holds {self.batch} sequences of at most {self.cache.capacity} "
                             f"positions; the prompt is {batch} x {length}")
        logits = cached_forward(self.model, self.cache, prompt, self._positions[:length], length, all_logits)
        return logits if all_logits else logits[:, -1]

    def decode(self, tokens: torch.Tensor, position: int) -> torch.Tensor:
        """Feed ``tokens`` (batch,) at ``position``; the logits (batch, vocab) after them."""
        if not 0 <= position < self.cache.capacity:
            raise ValueError(f"position {position} is outside the cache (0..{self.cache.capacity - 1})")
        if not self.static:
            return cached_forward(self.model, self.cache, tokens.view(-1, 1),
                                  self._positions[position:position + 1], position + 1)[:, -1]
        self._tokens.copy_(tokens.view(-1, 1))
        self._position.fill_(position)  # a kernel with the value as argument: no host-device sync
        if not self.cuda_graph:
            return self._step(self._tokens, self._position)
        if self._graph is None:
            self._capture()
        assert self._graph is not None and self._graph_logits is not None
        self._graph.replay()
        return self._graph_logits

    def static_step(self, tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """One decode step with static shapes, the function that is compiled and captured: ``tokens``
        (batch, 1) at ``position`` (1,), both device tensors; writes the cache in place and attends to all
        ``capacity`` slots (those after the position masked). Returns the logits (batch, vocab)."""
        return cached_forward(self.model, self.cache, tokens, position, self.cache.capacity)[:, -1]

    def _capture(self) -> None:
        """Warm up on a side stream (capture requires it), then record one step into a CUDA graph.
        Each warm-up step writes the same keys and values at the same position as the real step will."""
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(self.GRAPH_WARMUP_STEPS):
                self._step(self._tokens, self._position)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._graph_logits = self._step(self._tokens, self._position)
        self._graph = graph


class Recompute:
    """The reference without a cache: every step runs the model's own forward over the whole sequence."""

    def __init__(self, model: nn.Module, batch: int, capacity: int) -> None:
        self.model = model
        device = unwrap(model).lm_head.weight.device
        self.ids = torch.zeros(batch, capacity, dtype=torch.long, device=device)

    def prefill(self, prompt: torch.Tensor) -> torch.Tensor:
        self.ids[:, :prompt.shape[1]] = prompt
        return self.model(prompt)[:, -1]

    def decode(self, tokens: torch.Tensor, position: int) -> torch.Tensor:
        self.ids[:, position] = tokens
        return self.model(self.ids[:, :position + 1])[:, -1]


def make_runner(model: nn.Module, batch: int, capacity: int, *, use_cache: bool = True, compile: bool = False,
                cuda_graph: bool = False) -> CachedDecoder | Recompute:
    """A ``CachedDecoder`` (``compile`` / ``cuda_graph`` for its static step) or, without cache, ``Recompute``."""
    if not use_cache:
        if compile or cuda_graph:
            raise ConfigError("compile and CUDA graphs apply to the cached decode step, not to recomputation "
                              "without a cache: drop one or the other")
        return Recompute(model, batch, capacity)
    return CachedDecoder(model, batch, capacity, compile=compile, cuda_graph=cuda_graph)


def cast_for_inference(model: nn.Module, precision: str) -> nn.Module:
    """``model`` in eval mode with its weights in the precision's dtype (in place). The rotary tables stay
    fp32: every user rounds them to the activations' dtype itself, as under training's autocast."""
    if precision not in DTYPES:
        raise ConfigError(f"unknown precision {precision!r}: choose one of {', '.join(DTYPES)}")
    tables = [(m, m.cos, m.sin) for m in unwrap(model).modules() if isinstance(m, RotaryEmbedding)]
    model.to(DTYPES[precision])
    for module, cos, sin in tables:
        module.cos, module.sin = cos, sin
    set_matmul_precision(precision)  # fp32 means fp32: no TF32
    return model.eval()


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: the argmax (``greedy``), or a draw from softmax(logits /
    temperature) restricted to the ``top_k`` largest logits."""

    greedy: bool = True
    temperature: float = 1.0
    top_k: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be positive (got {self.temperature})")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be at least 1 (got {self.top_k})")

    def pick(self, logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The next token of each sequence, (batch,), from ``logits`` (batch, vocab)."""
        if self.greedy:
            return logits.argmax(dim=-1)  # ties go to the lowest index
        scores = logits.float() / self.temperature
        if self.top_k is not None and self.top_k < scores.shape[-1]:
            kth = scores.topk(self.top_k, dim=-1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        return torch.multinomial(F.softmax(scores, dim=-1), 1, generator=generator).squeeze(-1)


def decode_loop(runner: Runner, prompt: torch.Tensor, new_tokens: int,
                pick: Callable[[torch.Tensor], torch.Tensor], timer: PhaseTimer | None = None) -> torch.Tensor:
    """``new_tokens`` tokens (batch, new_tokens) after ``prompt``: one prefill, then ``new_tokens - 1``
    decode steps (the last token is never fed back, so the cache ends written at 0..L+new_tokens-2).
    Nothing here waits for the device: tokens stay on it. ``timer`` gets the marks "prefill" and "decode"."""
    batch, length = prompt.shape
    out = torch.empty(batch, new_tokens, dtype=torch.long, device=prompt.device)
    logits = runner.prefill(prompt)
    if timer:
        timer.mark("prefill")
    for i in range(new_tokens):
        token = pick(logits)
        out[:, i] = token
        if i + 1 < new_tokens:
            logits = runner.decode(token, length + i)
    if timer:
        timer.mark("decode")
    return out


@torch.no_grad()
def generate(model: nn.Module, prompt_ids: torch.Tensor, new_tokens: int, *, greedy: bool = True,
             temperature: float = 1.0, top_k: int | None = None, generator: torch.Generator | None = None,
             use_cache: bool = True, runner: Runner | None = None) -> torch.Tensor:
    """The ``new_tokens`` tokens (batch, new_tokens) that ``model`` generates after ``prompt_ids`` (batch, L).

    Greedy by default; ``greedy=False`` samples (``temperature``, ``top_k``), reproducibly given a seeded
    ``generator`` on the model's device. ``use_cache=False`` recomputes the whole sequence with the
    model's own forward at every step (the reference). ``runner`` reuses a ``CachedDecoder`` (its cache,
    compiled step or CUDA graph) instead of making one; ``model`` is then not used.
    """
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be at least 1 (got {new_tokens})")
    if runner is None:
        batch, length = prompt_ids.shape
        max_seq_len = unwrap(model).config.max_seq_len
        if length + new_tokens > max_seq_len:
            raise ValueError(f"prompt {length} + {new_tokens} new tokens exceed the model's max_seq_len {max_seq_len}")
        runner = make_runner(model, batch, length + new_tokens, use_cache=use_cache)
    sampling = Sampling(greedy, temperature, top_k)
    return decode_loop(runner, prompt_ids, new_tokens, lambda logits: sampling.pick(logits, generator))
