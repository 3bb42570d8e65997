"""Flash attention in Triton, FlashAttention-2 style: causal (or full) self-attention that never
writes the (seq x seq) score matrix to memory, with its backward.

Forward. One program takes ``BLOCK_M`` queries of one head and streams the keys and values past them
in blocks of ``BLOCK_N``, keeping a running maximum ``m`` and running sum ``l`` of the softmax
("online softmax") so that the output can be accumulated before the whole row is known. Scores are
scaled into base 2 (``exp2`` is one instruction). Key blocks entirely below the diagonal need no mask;
only the blocks on the diagonal (causal) or past the end of the sequence are masked. The forward
saves the log-sum-exp of every row, ``lse = log(sum_j exp(s_ij))``, which is all the backward needs to
rebuild the probabilities ``p_ij = exp(s_ij - lse_i)`` block by block.

Backward, with ``delta_i = sum_d dO_id * O_id`` (a small pre-pass):
``dV = P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - delta)``, ``dQ = scale * dS K``, ``dK = scale * dS^T Q``.
Two kernels, as in the Triton tutorial: one program per key block accumulates dK and dV over all
queries (and over every query head that shares this key/value head), one program per query block
accumulates dQ. Neither needs atomics.

Grouped-query attention: query head ``h`` reads key/value head ``h // (heads // kv_heads)`` by index;
K and V are never copied per query head. Tensors may have any batch, head and sequence strides (the
(batch, seq, heads, head_dim) layout of a projection's output goes straight in); a head dimension that
is not contiguous is copied first. The output is written in (batch, seq, heads, head_dim) memory
order, so that merging the heads afterwards is a free view.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tinyllama.kernels import _ops
from tinyllama.kernels._triton import (
    MAX_GRID_Y, autotune, check_tensors, configs, dot_precision, launcher, mma, pipeline_stages, unit_last_stride,
    upcast_dots,
)

HEAD_DIMS = (16, 32, 64, 128)


# ------------------------------------------------------------------------------------------------
# Autotuning candidates. BLOCK_M must be a multiple of BLOCK_N in the forward and the dQ kernel (and
# the reverse in the dK/dV kernel), so that the diagonal band is a whole number of inner steps.
# The 16-bit candidates compile for sm_90 (Triton 3.8) without spilling registers at the head
# dimensions they are allowed for. fp32 tiles hold twice the bytes and fp32 products do not use
# tensor cores, so fp32 inputs get their own small candidates (correct, not fast: fp32 attention
# is there to check the model against V1, bf16 is for speed).
# Few candidates on purpose: each is compiled (seconds) and timed on first use of a shape.
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tile:
    block_m: int
    block_n: int
    warps: int
    stages: int
    max_head_dim: int = 128
    fp32: bool = False  # a candidate for fp32 inputs (else for 16-bit inputs)

    def config(self) -> triton.Config:
        return triton.Config({"BLOCK_M": self.block_m, "BLOCK_N": self.block_n}, num_warps=self.warps,
                             num_stages=pipeline_stages(self.stages))


_TILES: dict[int, _Tile] = {}  # id(config) -> the tile it was made from, for pruning


def _configs(tiles: list[_Tile], interpreter: _Tile) -> list[triton.Config]:
    made = []
    for tile in tiles:
        config = tile.config()
        _TILES[id(config)] = tile
        made.append(config)
    return configs(made, interpreter.config())


_FWD = _configs([_Tile(128, 128, 8, 3, max_head_dim=64), _Tile(128, 64, 8, 3), _Tile(128, 32, 8, 3),
                 _Tile(64, 64, 4, 3), _Tile(64, 32, 4, 4),
                 _Tile(32, 16, 4, 2, fp32=True), _Tile(32, 32, 8, 2, fp32=True)], _Tile(32, 16, 4, 1))
_DKDV = _configs([_Tile(32, 128, 8, 3, max_head_dim=64), _Tile(64, 128, 8, 2, max_head_dim=64),
                  _Tile(16, 128, 8, 3), _Tile(32, 64, 8, 3), _Tile(16, 64, 8, 3),
                  _Tile(16, 16, 4, 2, fp32=True), _Tile(16, 32, 8, 2, fp32=True)], _Tile(16, 32, 4, 1))
_DQ = _configs([_Tile(128, 64, 8, 3), _Tile(128, 32, 8, 3), _Tile(64, 64, 8, 3), _Tile(64, 32, 4, 3),
                _Tile(16, 16, 4, 2, fp32=True), _Tile(32, 16, 4, 2, fp32=True)], _Tile(32, 16, 4, 1))


def _prune(configs_: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """The candidates made for this input width and head dimension, no longer than the sequence."""
    fp32 = named_args["Q"].element_size() > 2
    seq = triton.next_power_of_2(named_args["N_CTX"])
    kept = []
    for config in configs_:
        tile = _TILES.get(id(config))
        if tile is None:  # the interpreter's single candidate
            return configs_
        if tile.fp32 == fp32 and kwargs["HEAD_DIM"] <= tile.max_head_dim and max(tile.block_m, tile.block_n) <= max(64, seq):
            kept.append(config)
    return kept or [c for c in configs_ if _TILES[id(c)].fp32 == fp32][-1:]


_KEY = ["N_CTX", "HEAD_DIM", "CAUSAL", "GROUPS"]
# Sizes vary from call to call; compiling a variant for each (Triton specialises integers equal to
# 1 or divisible by 16) would cost seconds each time for no gain.
_DYNAMIC = ["H", "N_CTX", "GROUPS"]


# ------------------------------------------------------------------------------------------------
# Forward
# ------------------------------------------------------------------------------------------------


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n, lo, hi, N_CTX, qk_scale,
               BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
               PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Stream key/value blocks ``[lo, hi)`` past the query block, updating the online softmax."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        in_seq = cols < N_CTX
        k = tl.load(k_ptrs + start_n * stride_kn, mask=in_seq[:, None], other=0.0)
        qk = mma(q, tl.trans(k), tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32), PRECISION, UPCAST)
        qk = qk * qk_scale
        if MASKED:
            keep = in_seq[None, :]
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= cols[None, :])
            qk = tl.where(keep, qk, float("-inf"))
        # Every row has seen at least one unmasked key by now, so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptrs + start_n * stride_vn, mask=in_seq[:, None], other=0.0)
        acc = mma(p.to(v.dtype), v, acc * alpha[:, None], PRECISION, UPCAST)
        m_i = m_new
    return acc, l_i, m_i


@launcher
@autotune(_FWD, _KEY, _prune)
@triton.jit(do_not_specialize=_DYNAMIC)
def _attn_fwd_kernel(Q, K, V, O, LSE, sm_scale,
                     stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                     stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
                     H, N_CTX, GROUPS,
                     HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                     UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    off_bh = tl.program_id(1)
    off_b = (off_bh // H).to(tl.int64)
    off_h = off_bh % H
    off_kvh = (off_h // GROUPS).to(tl.int64)
    off_h = off_h.to(tl.int64)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :]
    k_ptrs = K + off_b * stride_kb + off_kvh * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :]
    v_ptrs = V + off_b * stride_vb + off_kvh * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :]
    row_ok = offs_m < N_CTX
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # scores in base 2
    if CAUSAL:
        unmasked_end = start_m  # key blocks wholly at or below the diagonal ...
        masked_end = tl.minimum(start_m + BLOCK_M, N_CTX)  # ... then the diagonal band
    else:
        unmasked_end = (N_CTX // BLOCK_N) * BLOCK_N  # whole key blocks, then the ragged end
        masked_end = N_CTX
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n,
                               0, unmasked_end, N_CTX, qk_scale, BLOCK_N, False, CAUSAL, PRECISION, UPCAST)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n,
                               unmasked_end, masked_end, N_CTX, qk_scale, BLOCK_N, True, CAUSAL, PRECISION,
                               UPCAST)
    acc = acc / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453  # natural log-sum-exp of the scaled scores
    tl.store(LSE + off_bh.to(tl.int64) * N_CTX + offs_m, lse, mask=row_ok)
    o_ptrs = O + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :]
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None])


# ------------------------------------------------------------------------------------------------
# Backward
# ------------------------------------------------------------------------------------------------


@launcher
@triton.jit(do_not_specialize=_DYNAMIC[:2])
def _bwd_preprocess_kernel(O, DO, DELTA, stride_ob, stride_oh, stride_om, stride_dob, stride_doh, stride_dom,
                           H, N_CTX, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """delta_i = sum_d O_id * dO_id, in fp32."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    off_bh = tl.program_id(1)
    off_b = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_CTX
    o = tl.load(O + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
                mask=row_ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :],
                 mask=row_ok[:, None], other=0.0).to(tl.float32)
    tl.store(DELTA + off_bh.to(tl.int64) * N_CTX + offs_m, tl.sum(o * do, axis=1), mask=row_ok)


@triton.jit
def _dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptr, delta_ptr, stride_qm, stride_dom, offs_n, lo, hi, N_CTX,
                qk_scale, BLOCK_M: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr,
                UPCAST: tl.constexpr):
    """Accumulate dK, dV of one key block over query blocks ``[lo, hi)`` of one query head.

    Works on transposed scores (keys x queries) so the key block stays the left operand.
    """
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < N_CTX
        q = tl.load(q_ptrs + start_m * stride_qm, mask=row_ok[:, None], other=0.0)
        do = tl.load(do_ptrs + start_m * stride_dom, mask=row_ok[:, None], other=0.0)
        # Queries past the end get lse = +inf, hence probability 0.
        lse2 = tl.load(lse_ptr + offs_m, mask=row_ok, other=float("inf")) * 1.4426950408889634
        delta = tl.load(delta_ptr + offs_m, mask=row_ok, other=0.0)
        qk_t = mma(k, tl.trans(q), tl.zeros([k.shape[0], BLOCK_M], dtype=tl.float32), PRECISION, UPCAST)
        p_t = tl.math.exp2(qk_t * qk_scale - lse2[None, :])
        if MASKED:
            p_t = tl.where(offs_m[None, :] >= offs_n[:, None], p_t, 0.0)
        dv = mma(p_t.to(do.dtype), do, dv, PRECISION, UPCAST)
        dp_t = mma(v, tl.trans(do), tl.zeros([k.shape[0], BLOCK_M], dtype=tl.float32), PRECISION, UPCAST)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = mma(ds_t.to(q.dtype), q, dk, PRECISION, UPCAST)
    return dk, dv


@launcher
@autotune(_DKDV, _KEY, _prune)
@triton.jit(do_not_specialize=_DYNAMIC)
def _attn_bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, sm_scale,
                          stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                          stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
                          stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                          H, N_CTX, GROUPS,
                          HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                          UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    off_bkv = tl.program_id(1)
    KV_HEADS = H // GROUPS
    off_b = off_bkv // KV_HEADS
    off_kvh = off_bkv % KV_HEADS

    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    key_ok = offs_n < N_CTX
    kv_off_k = off_b.to(tl.int64) * stride_kb + off_kvh.to(tl.int64) * stride_kh
    kv_off_v = off_b.to(tl.int64) * stride_vb + off_kvh.to(tl.int64) * stride_vh
    k = tl.load(K + kv_off_k + offs_n[:, None] * stride_kn + offs_d[None, :], mask=key_ok[:, None], other=0.0)
    v = tl.load(V + kv_off_v + offs_n[:, None] * stride_vn + offs_d[None, :], mask=key_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634

    for g in range(GROUPS):  # every query head that reads this key/value head
        off_h = off_kvh * GROUPS + g
        off_bh = (off_b * H + off_h).to(tl.int64)
        q_ptrs = (Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
                  + offs_m[:, None] * stride_qm + offs_d[None, :])
        do_ptrs = (DO + off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh
                   + offs_m[:, None] * stride_dom + offs_d[None, :])
        lse_ptr = LSE + off_bh * N_CTX
        delta_ptr = DELTA + off_bh * N_CTX
        if CAUSAL:
            # Queries before this key block never see it; the band on the diagonal needs the mask.
            band_end = tl.minimum(start_n + BLOCK_N, N_CTX)
            dk, dv = _dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptr, delta_ptr, stride_qm, stride_dom,
                                 offs_n, start_n, band_end, N_CTX, qk_scale, BLOCK_M, True, PRECISION, UPCAST)
            dk, dv = _dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptr, delta_ptr, stride_qm, stride_dom,
                                 offs_n, start_n + BLOCK_N, N_CTX, N_CTX, qk_scale, BLOCK_M, False, PRECISION,
                                 UPCAST)
        else:
            dk, dv = _dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptr, delta_ptr, stride_qm, stride_dom,
                                 offs_n, 0, N_CTX, N_CTX, qk_scale, BLOCK_M, False, PRECISION, UPCAST)

    dk = dk * sm_scale
    dk_ptrs = (DK + off_b.to(tl.int64) * stride_dkb + off_kvh.to(tl.int64) * stride_dkh
               + offs_n[:, None] * stride_dkn + offs_d[None, :])
    dv_ptrs = (DV + off_b.to(tl.int64) * stride_dvb + off_kvh.to(tl.int64) * stride_dvh
               + offs_n[:, None] * stride_dvn + offs_d[None, :])
    tl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=key_ok[:, None])
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=key_ok[:, None])


@triton.jit
def _dq_inner(dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n, lo, hi, N_CTX,
              qk_scale, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
              PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Accumulate dQ of one query block over key blocks ``[lo, hi)``."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        in_seq = cols < N_CTX
        k = tl.load(k_ptrs + start_n * stride_kn, mask=in_seq[:, None], other=0.0)
        v = tl.load(v_ptrs + start_n * stride_vn, mask=in_seq[:, None], other=0.0)
        qk = mma(q, tl.trans(k), tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32), PRECISION, UPCAST)
        p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if MASKED:
            keep = in_seq[None, :]
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= cols[None, :])
            p = tl.where(keep, p, 0.0)
        dp = mma(do, tl.trans(v), tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32), PRECISION, UPCAST)
        ds = p * (dp - delta[:, None])
        dq = mma(ds.to(k.dtype), k, dq, PRECISION, UPCAST)
    return dq


@launcher
@autotune(_DQ, _KEY, _prune)
@triton.jit(do_not_specialize=_DYNAMIC)
def _attn_bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, sm_scale,
                        stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                        stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
                        stride_dqb, stride_dqh, stride_dqm,
                        H, N_CTX, GROUPS,
                        HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                        UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    off_bh = tl.program_id(1)
    off_b = (off_bh // H).to(tl.int64)
    off_h = off_bh % H
    off_kvh = (off_h // GROUPS).to(tl.int64)
    off_h = off_h.to(tl.int64)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_CTX
    q = tl.load(Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :],
                 mask=row_ok[:, None], other=0.0)
    lse2 = tl.load(LSE + off_bh.to(tl.int64) * N_CTX + offs_m, mask=row_ok, other=float("inf")) * 1.4426950408889634
    delta = tl.load(DELTA + off_bh.to(tl.int64) * N_CTX + offs_m, mask=row_ok, other=0.0)
    k_ptrs = K + off_b * stride_kb + off_kvh * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :]
    v_ptrs = V + off_b * stride_vb + off_kvh * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :]
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    if CAUSAL:
        unmasked_end = start_m
        masked_end = tl.minimum(start_m + BLOCK_M, N_CTX)
    else:
        unmasked_end = (N_CTX // BLOCK_N) * BLOCK_N
        masked_end = N_CTX
    dq = _dq_inner(dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n, 0, unmasked_end,
                   N_CTX, qk_scale, BLOCK_N, False, CAUSAL, PRECISION, UPCAST)
    dq = _dq_inner(dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n, unmasked_end,
                   masked_end, N_CTX, qk_scale, BLOCK_N, True, CAUSAL, PRECISION, UPCAST)
    dq = dq * sm_scale
    dq_ptrs = DQ + off_b * stride_dqb + off_h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :]
    tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


# ------------------------------------------------------------------------------------------------
# Launchers
# ------------------------------------------------------------------------------------------------


def _bhsd(t: torch.Tensor) -> tuple[int, int, int]:
    """Batch, head and sequence strides of a (batch, heads, seq, head_dim) tensor (one ``stride()``
    call: a launch reads eight of these, and each ``stride(i)`` costs the host as much as the tuple)."""
    return t.stride()[:3]


def _empty_bshd(batch: int, heads: int, seq: int, head_dim: int, like: torch.Tensor) -> torch.Tensor:
    """An empty (batch, heads, seq, head_dim) tensor stored as (batch, seq, heads, head_dim)."""
    return torch.empty((batch, seq, heads, head_dim), dtype=like.dtype, device=like.device).transpose(1, 2)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    check_tensors("flash_attention", q, k, v)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("flash_attention: q, k and v must be 4-D: (batch, heads, seq, head_dim) and "
                         "(batch, kv_heads, seq, head_dim)")
    if k.shape != v.shape:
        raise ValueError(f"flash_attention: k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    (b, h, s, d), (bk, hk, sk, dk) = q.shape, k.shape
    if (b, s, d) != (bk, sk, dk):
        raise ValueError(f"flash_attention: q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch, sequence "
                         "or head_dim; this is self-attention, they must agree")
    if hk == 0 or h % hk:
        raise ValueError(f"flash_attention: {h} query heads cannot share {hk} key/value heads evenly")
    if d not in HEAD_DIMS:
        raise ValueError(f"flash_attention: head_dim {d} is not supported; use one of {HEAD_DIMS}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"flash_attention: q, k, v have dtypes {q.dtype}, {k.dtype}, {v.dtype}; make them equal")
    if b * h > MAX_GRID_Y:
        raise ValueError(f"flash_attention: batch x heads = {b * h} exceeds {MAX_GRID_Y}; split the batch")


def _meta(q: torch.Tensor, causal: bool) -> dict:
    return {"HEAD_DIM": q.shape[-1], "CAUSAL": causal, "PRECISION": dot_precision(q.dtype),
            "UPCAST": upcast_dots(q.dtype)}


def flash_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, sm_scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)``: attention output (shape of ``q``, stored as (batch, seq, heads, head_dim)) and
    the fp32 log-sum-exp of each query's scaled scores, shape (batch, heads, seq)."""
    _check(q, k, v)
    q, k, v = unit_last_stride(q), unit_last_stride(k), unit_last_stride(v)
    batch, heads, seq, head_dim = q.shape
    groups = heads // k.shape[1]
    sm_scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    out = _empty_bshd(batch, heads, seq, head_dim, q)
    lse = torch.empty((batch, heads, seq), dtype=torch.float32, device=q.device)
    if out.numel():
        grid = lambda meta: (triton.cdiv(seq, meta["BLOCK_M"]), batch * heads)  # noqa: E731
        _attn_fwd_kernel(grid, q, k, v, out, lse, sm_scale, *_bhsd(q), *_bhsd(k), *_bhsd(v), *_bhsd(out),
                               heads, seq, groups, **_meta(q, causal))
    return out, lse


def flash_attention_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    causal: bool = True, sm_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` for the upstream gradient ``dout``; ``out`` and ``lse`` come from the forward."""
    _check(q, k, v)
    check_tensors("flash_attention backward", dout, out)
    q, k, v, out, dout = (unit_last_stride(t) for t in (q, k, v, out, dout))
    batch, heads, seq, head_dim = q.shape
    kv_heads = k.shape[1]
    groups = heads // kv_heads
    sm_scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    dq = _empty_bshd(batch, heads, seq, head_dim, q)
    dk = _empty_bshd(batch, kv_heads, seq, head_dim, k)
    dv = _empty_bshd(batch, kv_heads, seq, head_dim, v)
    if not dq.numel():
        return dq, dk, dv
    delta = torch.empty_like(lse)
    pre_block = 64
    _bwd_preprocess_kernel((triton.cdiv(seq, pre_block), batch * heads), out, dout, delta, *_bhsd(out), *_bhsd(dout),
                           heads, seq, HEAD_DIM=head_dim, BLOCK_M=pre_block)
    meta = _meta(q, causal)
    grid_kv = lambda m: (triton.cdiv(seq, m["BLOCK_N"]), batch * kv_heads)  # noqa: E731
    _attn_bwd_dkdv_kernel(grid_kv, q, k, v, dout, lse, delta, dk, dv, sm_scale, *_bhsd(q), *_bhsd(k), *_bhsd(v),
                                   *_bhsd(dout), *_bhsd(dk), *_bhsd(dv), heads, seq, groups, **meta)
    grid_q = lambda m: (triton.cdiv(seq, m["BLOCK_M"]), batch * heads)  # noqa: E731
    _attn_bwd_dq_kernel(grid_q, q, k, v, dout, lse, delta, dq, sm_scale, *_bhsd(q), *_bhsd(k), *_bhsd(v),
                                *_bhsd(dout), *_bhsd(dq), heads, seq, groups, **meta)
    return dq, dk, dv


class FlashAttentionFunction(torch.autograd.Function):
    """Autograd wrapper: saves q, k, v, the output and the log-sum-exp (not the probabilities)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale):  # type: ignore[override]
        with _ops.named("flash_attention_forward"):
            out, lse = flash_attention_forward(q, k, v, causal, sm_scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.sm_scale = causal, sm_scale
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        with _ops.named("flash_attention_backward"):
            dq, dk, dv = flash_attention_backward(dout, q, k, v, out, lse, ctx.causal, ctx.sm_scale)
        return dq, dk, dv, None, None


# The operators tinyllama::flash_attention_forward and tinyllama::flash_attention_backward (see
# tinyllama.kernels._ops): what torch.compile, FlopCounterMode and the profiler see.


def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                sm_scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    return flash_attention_forward(q, k, v, causal, sm_scale)


def _backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, causal: bool,
                 sm_scale: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return flash_attention_backward(dout, q, k, v, out, lse, causal, sm_scale)


forward_op = _ops.register(
    "flash_attention_forward", _forward_op,
    schema="(Tensor q, Tensor k, Tensor v, bool causal, float? sm_scale) -> (Tensor, Tensor)")
backward_op = _ops.register(
    "flash_attention_backward", _backward_op,
    schema="(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool causal, float? sm_scale)"
           " -> (Tensor, Tensor, Tensor)")


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, causal, sm_scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.sm_scale = causal, sm_scale


def _op_backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.tinyllama.flash_attention_backward(dout, q, k, v, out, lse, ctx.causal, ctx.sm_scale)
    return dq, dk, dv, None, None


forward_op.register_autograd(_op_backward, setup_context=_setup_context)


def _expanded(q_shape, kv_shape) -> tuple[int, ...]:
    """Key/value shape with as many heads as the queries (grouped-query heads are read, not copied,
    but every query head does its products with them; older torch's formulas want equal heads)."""
    return (*q_shape[:2], *kv_shape[2:])


def _forward_flops(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    # SDPA's formula: the products of the whole score matrix, causal or not (as FlopCounterMode
    # counts PyTorch's own attention), so V3's count equals V1's and V4's.
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(q_shape, _expanded(q_shape, k_shape), _expanded(q_shape, v_shape))


def _backward_flops(dout_shape, q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(dout_shape, q_shape, _expanded(q_shape, k_shape), _expanded(q_shape, v_shape))


_ops.register_flops(forward_op, _forward_flops)
_ops.register_flops(backward_op, _backward_flops)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                    sm_scale: float | None = None) -> torch.Tensor:
    """``softmax(q k^T * sm_scale [+ causal mask]) v`` without materialising the scores, differentiable
    in q, k and v.

    q: (batch, heads, seq, head_dim); k, v: (batch, kv_heads, seq, head_dim) with ``heads`` a multiple
    of ``kv_heads`` (grouped-query attention). ``sm_scale`` defaults to ``1 / sqrt(head_dim)``.
    Eager calls go straight to the autograd Function; traced or counted ones through the
    operator ``torch.ops.tinyllama.flash_attention_forward`` (see ``tinyllama.kernels._ops``).
    """
    if _ops.dispatch_through_ops():
        return torch.ops.tinyllama.flash_attention_forward(q, k, v, causal, sm_scale)[0]
    return FlashAttentionFunction.apply(q, k, v, causal, sm_scale)


def _reference_scores(q: torch.Tensor, k: torch.Tensor, causal: bool, sm_scale: float | None) -> torch.Tensor:
    """Scaled (and causally masked) fp32 scores, key/value heads repeated for their query heads."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    scores = (q.float() @ k.float().transpose(-2, -1)) * scale
    if causal:
        seq = q.shape[-2]
        future = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(diagonal=1)
        scores = scores.masked_fill(future, float("-inf"))
    return scores


def flash_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                              sm_scale: float | None = None) -> torch.Tensor:
    """The same function in plain PyTorch, materialising the scores in fp32 (the V1 model's way)."""
    probs = F.softmax(_reference_scores(q, k, causal, sm_scale), dim=-1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    return (probs @ v.float()).to(q.dtype)


def log_sum_exp_reference(q: torch.Tensor, k: torch.Tensor, causal: bool = True,
                          sm_scale: float | None = None) -> torch.Tensor:
    """``logsumexp`` of each query's scaled (and masked) scores: what the forward saves."""
    return torch.logsumexp(_reference_scores(q, k, causal, sm_scale), dim=-1)
