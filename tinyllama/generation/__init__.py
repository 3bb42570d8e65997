"""Text generation with TinyLLaMA: a static KV cache, prefill and decode, timed honestly.

Generating N tokens after a prompt of L tokens has two phases. *Prefill* runs the prompt through the
model once (L tokens per sequence in one forward: large matmuls, bound by arithmetic) and keeps every
layer's keys and values in a cache. *Decode* then feeds one token per sequence and step: each step
multiplies a few vectors by every weight matrix and reads the whole cache, so it is bound by memory
traffic (``decode_bytes``), not arithmetic. Without a cache every step would recompute the whole
sequence (``generate(..., use_cache=False)``, the reference).

- :mod:`~tinyllama.generation.cache`: ``KVCache`` and the cached forward (the model's own modules around
  an attention over the cache in plain PyTorch);
- :mod:`~tinyllama.generation.runners`: ``CachedDecoder`` (eager, static shapes, compiled, CUDA graph),
  ``Recompute`` (no cache), sampling and ``generate()``;
- :mod:`~tinyllama.generation.costs`: ``decode_bytes`` and ``decode_flops`` of one decode step;
- :mod:`~tinyllama.generation.check`: greedy tokens and logits against the fp32 no-cache reference;
- :mod:`~tinyllama.generation.benchmark`: prefill and decode timed apart, bandwidth against the measured
  copy bandwidth.

The command line is ``python -m tinyllama.harness.generate``.
"""

from tinyllama.generation.benchmark import GenerationResult, run_generation_benchmark, time_generation
from tinyllama.generation.cache import (
                                        KVCache,
                                        attend,
                                        cached_forward,
                                        hidden_keys,
                                        project,
                                        rotary_rows,
                                        rotate,
                                        write_in_place,
)
from tinyllama.generation.check import GenerationCheck, check_generation, first_divergence, teacher_forced_logits
from tinyllama.generation.costs import decode_bytes, decode_flops
from tinyllama.generation.runners import (
                                        DTYPES,
                                        CachedDecoder,
                                        Recompute,
                                        Runner,
                                        Sampling,
                                        cast_for_inference,
                                        decode_loop,
                                        generate,
                                        make_runner,
)

__all__ = [
    "DTYPES", "CachedDecoder", "GenerationCheck", "GenerationResult", "KVCache", "Recompute", "Runner", "Sampling",
    "attend", "cached_forward", "cast_for_inference", "check_generation", "decode_bytes", "decode_flops",
    "decode_loop", "first_divergence", "generate", "hidden_keys", "make_runner", "project", "rotary_rows", "rotate",
    "run_generation_benchmark",
    "teacher_forced_logits", "time_generation", "write_in_place",
]
