"""Arithmetic intensity (FLOP per byte) of the kernels a TinyLLaMA step is made of, from their shapes.

Each function gives the work of one forward kernel at the least traffic it can have: every input read
once and every output written once (no cache reuse counted, nothing re-read). FLOPs are two per
multiply-add, and they are the work the kernel *does*: a fused causal attention skips the masked tiles, so
it is counted over the lower triangle of the ``seq x seq`` scores with its diagonal
(:func:`tinyllama.costs.flops.causal_pairs`), as the roofline's per-operator counts do
(:mod:`tinyllama.profiling.attribution`). The model FLOPs of :mod:`tinyllama.costs.flops` (MFU) keep the full
square, the work of the model's function as V1 computes it. :func:`model_kernels` lists the four kinds at
a model's shapes; the roofline (:mod:`tinyllama.profiling.roofline`) says on which side of the ridge point
each one lies.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from tinyllama.config import ModelConfig
from tinyllama.costs.flops import causal_pairs
from tinyllama.costs.kernel_costs import rmsnorm_forward_bytes

# FLOPs per element of an RMSNorm forward: square, add to the sum, scale by 1/rms, multiply by the weight
# (the square root and the division happen once per row and are not counted).
RMSNORM_FLOPS_PER_ELEMENT = 4


@dataclass(frozen=True)
class KernelWork:
    """FLOPs and bytes of one kernel; ``intensity`` is their ratio."""

    name: str
    flops: int
    bytes: int

    @property
    def intensity(self) -> float:
        """FLOP per byte moved."""
        return self.flops / self.bytes


def _positive(**sizes: int) -> None:
    bad = {k: v for k, v in sizes.items() if v <= 0}
    if bad:
        raise ValueError(f"sizes must be positive: {bad}")


def gemm_work(m: int, n: int, k: int, itemsize: int) -> KernelWork:
    """``(m x k) @ (k x n)``: 2 m n k FLOPs; reads A and B, writes C, ``itemsize`` bytes each element."""
    _positive(m=m, n=n, k=k, itemsize=itemsize)
    return KernelWork("GEMM", 2 * m * n * k, itemsize * (m * k + k * n + m * n))


def elementwise_work(numel: int, itemsize: int, inputs: int = 2, flops_per_element: int = 1) -> KernelWork:
    """An element-wise operator over ``numel`` elements (``a + b``: two inputs, one FLOP each): reads every
    input, writes one output."""
    _positive(numel=numel, itemsize=itemsize, inputs=inputs, flops_per_element=flops_per_element)
    return KernelWork("element-wise", flops_per_element * numel, itemsize * numel * (inputs + 1))


def rmsnorm_work(rows: int, width: int, itemsize: int, weight_itemsize: int | None = None) -> KernelWork:
    """RMSNorm forward over ``rows`` rows of ``width``: :data:`RMSNORM_FLOPS_PER_ELEMENT` FLOPs per element;
    bytes as :func:`tinyllama.costs.kernel_costs.rmsnorm_forward_bytes` (x read, weight read, y written)."""
    _positive(rows=rows, width=width, itemsize=itemsize)
    return KernelWork("RMSNorm", RMSNORM_FLOPS_PER_ELEMENT * rows * width,
                      rmsnorm_forward_bytes(rows, width, itemsize, weight_itemsize))


def attention_work(batch: int, heads: int, kv_heads: int, seq: int, head_dim: int, itemsize: int,
                   causal: bool = True) -> KernelWork:
    """A fused (flash) attention forward: ``scores = q k^T`` and ``probs @ v``, 2 x 2 x head_dim FLOPs per
    query-key pair and query head, over the pairs the kernel computes: ``causal`` (the model's attention),
    the lower triangle with its diagonal, ``seq (seq + 1) / 2`` pairs (a causal flash kernel skips the
    tiles above it); else the full ``seq x seq`` square. Reads q, k and v (``kv_heads`` heads for k and v),
    writes the output. The scores never leave the chip: that is what the fusion buys."""
    _positive(batch=batch, heads=heads, kv_heads=kv_heads, seq=seq, head_dim=head_dim, itemsize=itemsize)
    pairs = causal_pairs(seq, seq) if causal else seq * seq
    flops = 4 * batch * heads * pairs * head_dim
    nbytes = itemsize * batch * seq * head_dim * (2 * heads + 2 * kv_heads)
    return KernelWork("attention", flops, nbytes)


def model_kernels(config: ModelConfig, batch: int, seq: int, itemsize: int) -> pd.DataFrame:
    """The four kinds of kernel at ``config``'s shapes, one forward each: the gate projection (a GEMM of
    ``batch * seq`` tokens, ``hidden -> intermediate``), the residual add (``hidden`` per token), an RMSNorm
    of the hidden states and the fused causal attention of one layer (:func:`attention_work`: the lower
    triangle of the scores). Columns ``kernel``, ``shape``, ``flops``,
    ``bytes``, ``intensity``."""
    tokens = batch * seq
    h = config.hidden_dim
    rows = [
        (gemm_work(tokens, config.intermediate_dim, h, itemsize), f"{tokens} x {h} @ {h} x {config.intermediate_dim}"),
        (elementwise_work(tokens * h, itemsize), f"{tokens} x {h} + {tokens} x {h}"),
        (rmsnorm_work(tokens, h, itemsize), f"{tokens} rows of {h}"),
        (attention_work(batch, config.num_heads, config.num_kv_heads, seq, config.head_dim, itemsize),
         f"batch {batch}, {config.num_heads} heads ({config.num_kv_heads} K/V), seq {seq} causal, head {config.head_dim}"),
    ]
    return pd.DataFrame([{"kernel": w.name, "shape": shape, "flops": w.flops, "bytes": w.bytes,
                          "intensity": w.intensity} for w, shape in rows])
