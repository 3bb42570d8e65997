"""Flash attention in Triton, FlashAttention-2 style: causal (or full) self-attention that never
writes the (seq x seq) score matrix to memory, with its backward.

Forward. One program takes ``BLOCK_M`` queries of one head and streams the keys and values past them
in blocks of ``BLOCK_N``, keeping a running maximum ``m`` and running sum ``l`` of the softmax
("online softmax") so that the output can be accumulated before the whole row is known. Scores are
scaled into base 2 (``exp2`` is one instruction). Key blocks entirely below the diagonal need no mask;
only the blocks on the diagonal (causal) or past the end of the sequence are masked. The forward
saves the log-sum-exp of every row, ``lse = log(sum_j exp(s_ij))``, which is all the backward needs to
rebuild the probabilities ``p_ij = exp(s_ij - lse_i)`` block by block.

Backward, with ``delta_i = sum_d dO_id * O_id``:
``dV = P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - delta)``, ``dQ = scale * dS K``, ``dK = scale * dS^T Q``.
Two kernels, as in the Triton tutorial: one program per query block accumulates dQ (and computes
delta for its rows first: it reads dO anyway, so no pre-pass launch), then one program per key block
accumulates dK and dV over all queries (and over every query head that shares this key/value head).
Neither needs atomics.

On a GPU with a Tensor Memory Accelerator (NVIDIA Hopper and later) the kernels read and write their
(rows, head_dim) tiles through tensor descriptors (``TMA``), which the copy engine serves without
address arithmetic in the threads; elsewhere (AMD, older GPUs, the interpreter) through pointers. The
two paths compute the same values (see ``tinyllama.kernels._triton.use_tensor_descriptors``).

Block order. Under the causal mask the programs' work differs: a query block sees as many keys as
precede it, a key block as many queries as follow it. A GPU starts programs in grid order as SMs
free up, so the grid puts the head on the fast axis and orders blocks heaviest first (the last query
blocks, the first key blocks): the light programs then fill the gaps at the end instead of one heavy
program running alone. On an H200 (medium shapes, S 4096) the dK/dV kernel ran one 256-thread program
per SM in two waves, and light-first order left it at about 1.5x its balanced time (simulated from
the program counts; measured in benchmarks/history/flash_attention.md).

Grouped-query attention: query head ``h`` reads key/value head ``h // (heads // kv_heads)`` by index;
K and V are never copied per query head. Tensors may have any batch, head and sequence strides (the
(batch, seq, heads, head_dim) layout of a projection's output goes straight in); a head dimension that
is not contiguous is copied first. The output is written in (batch, seq, heads, head_dim) memory
order, so that merging the heads afterwards is a free view.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tinyllama.kernels import _ops
from tinyllama.kernels._triton import (
    MAX_GRID_Y, WARP_SPECIALIZE, autotune, cdiv, check_tensors, configs, dot_precision, ensure_descriptor_memory,
    launcher, load_rows, mma, next_power_of_2, pipeline_stages, row_tiles, store_rows, unit_last_stride, upcast_dots,
    use_tensor_descriptors,
)

HEAD_DIMS = (16, 32, 64, 128)


# ------------------------------------------------------------------------------------------------
# Autotuning candidates. BLOCK_M must be a multiple of BLOCK_N in the forward and the dQ kernel (and
# the reverse in the dK/dV kernel), so that the diagonal band is a whole number of inner steps.
# Hopper-sized 16-bit tiles (128-row query blocks, 8 warps, 3-5 stages; the Triton tutorial's dK/dV
# tile of 128 keys x 32 queries). Register use, read from ptxas for sm_90a (Triton 3.8, see
# benchmarks/history/flash_attention.md): at head_dim 128 the dK/dV kernel holds two
# (BLOCK_N x 128) fp32 accumulators and is at the 255-register limit; the tiles that spill there by
# hundreds of bytes or more are offered up to head_dim 64 only, unless timed faster: the dK/dV tile
# (64 queries, 128 keys, 8 warps) spills there, and it and the 4-warp tiles of 64 keys were 7-17% faster
# than the tile the autotuner had picked from the others (H200, benchmarks/history/flash_attention.md,
# "Tiles"). Pointer loads cost more registers than tensor-descriptor loads (the addresses of a whole
# tile), up to spilling where TMA does not.
# fp32 tiles hold twice the bytes and fp32 products do not use tensor cores, so fp32 inputs get their
# own small candidates (correct, not fast: fp32 attention is there to check the model against V1,
# bf16 is for speed). Few candidates on purpose: each is compiled (seconds) and timed on first use.
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tile:
    block_m: int
    block_n: int
    warps: int
    stages: int
    ws: bool = False  # warp-specialized inner loops (only with tensor descriptors)
    max_head_dim: int = 128
    fp32: bool = False  # a candidate for fp32 inputs (else for 16-bit inputs)

    def config(self) -> triton.Config:
        return triton.Config({"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "WS": self.ws},
                             num_warps=self.warps, num_stages=pipeline_stages(self.stages))


_TILES: dict[int, _Tile] = {}  # id(config) -> the tile it was made from, for pruning


def _configs(tiles: list[_Tile], interpreter: _Tile) -> list[triton.Config]:
    made = []
    for tile in tiles:
        config = tile.config()
        _TILES[id(config)] = tile
        made.append(config)
    return configs(made, interpreter.config())


# Warp-specialized variants (``ws``) of the 8-warp tiles join only with TINYLLAMA_WARP_SPECIALIZE=1
# (Triton 3.8 fails to warp-specialize the 4-warp tiles for sm_90 with an error the autotuner does not
# catch; see ``WARP_SPECIALIZE``).
def _with_ws(tiles: list[_Tile]) -> list[_Tile]:
    extra = [replace(t, ws=True) for t in tiles if t.warps == 8 and not t.fp32]
    return tiles + extra if WARP_SPECIALIZE else tiles


_FWD = _configs(_with_ws([_Tile(128, 128, 8, 3), _Tile(128, 64, 8, 3), _Tile(128, 64, 8, 4), _Tile(64, 64, 4, 3),
                          _Tile(64, 32, 4, 4),
                          _Tile(32, 16, 4, 2, fp32=True), _Tile(32, 32, 8, 2, fp32=True)]), _Tile(32, 16, 4, 1))
_DKDV = _configs(_with_ws([_Tile(32, 128, 4, 5, max_head_dim=64), _Tile(64, 128, 8, 2), _Tile(64, 64, 4, 2),
                           _Tile(32, 64, 4, 3), _Tile(32, 128, 8, 3), _Tile(16, 128, 8, 3), _Tile(32, 64, 8, 3),
                           _Tile(16, 64, 8, 3),
                           _Tile(16, 16, 4, 2, fp32=True), _Tile(16, 32, 8, 2, fp32=True)]), _Tile(16, 32, 4, 1))
_DQ = _configs(_with_ws([_Tile(128, 32, 4, 5, max_head_dim=64), _Tile(128, 64, 8, 3), _Tile(128, 32, 8, 3),
                         _Tile(64, 64, 8, 3), _Tile(64, 32, 4, 3),
                         _Tile(16, 16, 4, 2, fp32=True), _Tile(32, 16, 4, 2, fp32=True)]), _Tile(32, 16, 4, 1))


def _prune(configs_: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """The candidates made for this input width and head dimension, no longer than the sequence."""
    fp32 = named_args["Q"].element_size() > 2
    seq = next_power_of_2(named_args["N_CTX"])
    kept = []
    for config in configs_:
        tile = _TILES.get(id(config))
        if tile is None:  # the interpreter's single candidate
            return configs_
        if (tile.fp32 == fp32 and kwargs["HEAD_DIM"] <= tile.max_head_dim and (kwargs["TMA"] or not tile.ws)
                and max(tile.block_m, tile.block_n) <= max(64, seq)):
            kept.append(config)
    return kept or [c for c in configs_ if _TILES[id(c)].fp32 == fp32 and not _TILES[id(c)].ws][-1:]


# The batch size Z is in the key (and passed, unused, to the kernels) because the best tile depends
# on how many programs fill the GPU: tuned on one sequence of one head, a tile would be chosen for
# a launch a few dozen programs wide.
_KEY = ["Z", "N_CTX", "HEAD_DIM", "CAUSAL", "GROUPS", "TMA"]
# Sizes vary from call to call; compiling a variant for each (Triton specialises integers equal to
# 1 or divisible by 16) would cost seconds each time for no gain.
_DYNAMIC = ["H", "N_CTX", "GROUPS", "Z"]


# ------------------------------------------------------------------------------------------------
# Forward
# ------------------------------------------------------------------------------------------------

LOG2E = tl.constexpr(1.4426950408889634)  # scores go to base 2: exp2 is one instruction


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_vn, offs_m, lo, hi, N_CTX, qk_scale,
               BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
               PRECISION: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr):
    """Stream key/value blocks ``[lo, hi)`` past the query block, updating the online softmax."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = load_rows(k_src, stride_kn, start_n, N_CTX, BLOCK_N, HEAD_DIM, TMA)
        qk = mma(q, tl.trans(k), tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32), PRECISION, UPCAST)
        if MASKED:
            cols = start_n + offs_n
            keep = (cols < N_CTX)[None, :]
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= cols[None, :])
            qk = tl.where(keep, qk, float("-inf"))
        # The running maximum is kept in scaled units. Scaling the row maxima rather than the whole
        # tile (the scale is positive) makes scale and shift one fused multiply-add per score, 1-4%
        # faster (H200). Every row has seen at least one unmasked key by now, so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = load_rows(v_src, stride_vn, start_n, N_CTX, BLOCK_N, HEAD_DIM, TMA)
        acc = mma(p.to(v.dtype), v, acc * alpha[:, None], PRECISION, UPCAST)
        m_i = m_new
    return acc, l_i, m_i


@launcher
@autotune(_FWD, _KEY, _prune)
@triton.jit(do_not_specialize=_DYNAMIC)
def _attn_fwd_kernel(Q, K, V, O, LSE, sm_scale,
                     stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                     stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
                     H, N_CTX, GROUPS, Z,
                     HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                     UPCAST: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Heaviest programs first (see "Block order" above): the head is the fast grid axis, and the last
    # query blocks, which see the most keys under the causal mask, come first.
    off_bh = tl.program_id(0)
    start_m = (tl.num_programs(1) - 1 - tl.program_id(1)) * BLOCK_M
    off_b = (off_bh // H).to(tl.int64)
    off_h = off_bh % H
    off_kvh = (off_h // GROUPS).to(tl.int64)
    off_h = off_h.to(tl.int64)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    q_src = row_tiles(Q + off_b * stride_qb + off_h * stride_qh, stride_qm, N_CTX, BLOCK_M, HEAD_DIM, TMA)
    k_src = row_tiles(K + off_b * stride_kb + off_kvh * stride_kh, stride_kn, N_CTX, BLOCK_N, HEAD_DIM, TMA)
    v_src = row_tiles(V + off_b * stride_vb + off_kvh * stride_vh, stride_vn, N_CTX, BLOCK_N, HEAD_DIM, TMA)
    q = load_rows(q_src, stride_qm, start_m, N_CTX, BLOCK_M, HEAD_DIM, TMA)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E
    if CAUSAL:
        unmasked_end = start_m  # key blocks wholly at or below the diagonal ...
        masked_end = tl.minimum(start_m + BLOCK_M, N_CTX)  # ... then the diagonal band
    else:
        unmasked_end = (N_CTX // BLOCK_N) * BLOCK_N  # whole key blocks, then the ragged end
        masked_end = N_CTX
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_vn, offs_m, 0, unmasked_end,
                               N_CTX, qk_scale, BLOCK_N, HEAD_DIM, False, CAUSAL, PRECISION, UPCAST, TMA, WS)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_vn, offs_m, unmasked_end,
                               masked_end, N_CTX, qk_scale, BLOCK_N, HEAD_DIM, True, CAUSAL, PRECISION, UPCAST,
                               TMA, WS)
    acc = acc / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453  # natural log-sum-exp of the scaled scores
    tl.store(LSE + off_bh.to(tl.int64) * N_CTX + offs_m, lse, mask=offs_m < N_CTX)
    o_dst = row_tiles(O + off_b * stride_ob + off_h * stride_oh, stride_om, N_CTX, BLOCK_M, HEAD_DIM, TMA)
    store_rows(o_dst, stride_om, start_m, N_CTX, acc.to(O.dtype.element_ty), BLOCK_M, HEAD_DIM, TMA)


# ------------------------------------------------------------------------------------------------
# Backward: the dQ kernel runs first and also computes delta (it reads dO anyway), which the
# dK/dV kernel then reads: no separate pre-pass launch.
# ------------------------------------------------------------------------------------------------


@triton.jit
def _dkdv_inner(dk, dv, k, v, q_src, do_src, lse_ptr, delta_ptr, stride_qm, stride_dom, offs_n, lo, hi, N_CTX,
                qk_scale, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr,
                PRECISION: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr):
    """Accumulate dK, dV of one key block over query blocks ``[lo, hi)`` of one query head.

    Works on transposed scores (keys x queries) so the key block stays the left operand.
    """
    for start_m in tl.range(lo, hi, BLOCK_M, warp_specialize=WS):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < N_CTX
        q = load_rows(q_src, stride_qm, start_m, N_CTX, BLOCK_M, HEAD_DIM, TMA)
        # Queries past the end get lse = +inf, hence probability 0.
        lse2 = tl.load(lse_ptr + offs_m, mask=row_ok, other=float("inf")) * LOG2E
        do = load_rows(do_src, stride_dom, start_m, N_CTX, BLOCK_M, HEAD_DIM, TMA)
        qk_t = mma(k, tl.trans(q), tl.zeros([k.shape[0], BLOCK_M], dtype=tl.float32), PRECISION, UPCAST)
        # Issued before the exponentials, so the tensor cores compute it while they run.
        dp_t = mma(v, tl.trans(do), tl.zeros([k.shape[0], BLOCK_M], dtype=tl.float32), PRECISION, UPCAST)
        p_t = tl.math.exp2(qk_t * qk_scale - lse2[None, :])
        if MASKED:
            p_t = tl.where(offs_m[None, :] >= offs_n[:, None], p_t, 0.0)
        dv = mma(p_t.to(do.dtype), do, dv, PRECISION, UPCAST)
        delta = tl.load(delta_ptr + offs_m, mask=row_ok, other=0.0)
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
                          H, N_CTX, GROUPS, Z,
                          HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                          UPCAST: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Heaviest programs first (see "Block order" above): the first key blocks, seen by the most queries.
    off_bkv = tl.program_id(0)
    start_n = tl.program_id(1) * BLOCK_N
    KV_HEADS = H // GROUPS
    off_b = (off_bkv // KV_HEADS).to(tl.int64)
    off_kvh = (off_bkv % KV_HEADS).to(tl.int64)

    offs_n = start_n + tl.arange(0, BLOCK_N)
    k_src = row_tiles(K + off_b * stride_kb + off_kvh * stride_kh, stride_kn, N_CTX, BLOCK_N, HEAD_DIM, TMA)
    v_src = row_tiles(V + off_b * stride_vb + off_kvh * stride_vh, stride_vn, N_CTX, BLOCK_N, HEAD_DIM, TMA)
    k = load_rows(k_src, stride_kn, start_n, N_CTX, BLOCK_N, HEAD_DIM, TMA)
    v = load_rows(v_src, stride_vn, start_n, N_CTX, BLOCK_N, HEAD_DIM, TMA)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E

    for g in range(GROUPS):  # every query head that reads this key/value head
        off_h = off_kvh * GROUPS + g
        off_bh = off_b * H + off_h
        q_src = row_tiles(Q + off_b * stride_qb + off_h * stride_qh, stride_qm, N_CTX, BLOCK_M, HEAD_DIM, TMA)
        do_src = row_tiles(DO + off_b * stride_dob + off_h * stride_doh, stride_dom, N_CTX, BLOCK_M, HEAD_DIM,
                           TMA)
        lse_ptr = LSE + off_bh * N_CTX
        delta_ptr = DELTA + off_bh * N_CTX
        if CAUSAL:
            # Queries before this key block never see it; the band on the diagonal needs the mask.
            band_end = tl.minimum(start_n + BLOCK_N, N_CTX)
            dk, dv = _dkdv_inner(dk, dv, k, v, q_src, do_src, lse_ptr, delta_ptr, stride_qm, stride_dom, offs_n,
                                 start_n, band_end, N_CTX, qk_scale, BLOCK_M, HEAD_DIM, True, PRECISION, UPCAST,
                                 TMA, WS)
            dk, dv = _dkdv_inner(dk, dv, k, v, q_src, do_src, lse_ptr, delta_ptr, stride_qm, stride_dom, offs_n,
                                 start_n + BLOCK_N, N_CTX, N_CTX, qk_scale, BLOCK_M, HEAD_DIM, False, PRECISION,
                                 UPCAST, TMA, WS)
        else:
            dk, dv = _dkdv_inner(dk, dv, k, v, q_src, do_src, lse_ptr, delta_ptr, stride_qm, stride_dom, offs_n,
                                 0, N_CTX, N_CTX, qk_scale, BLOCK_M, HEAD_DIM, False, PRECISION, UPCAST, TMA, WS)

    dk_dst = row_tiles(DK + off_b * stride_dkb + off_kvh * stride_dkh, stride_dkn, N_CTX, BLOCK_N, HEAD_DIM, TMA)
    dv_dst = row_tiles(DV + off_b * stride_dvb + off_kvh * stride_dvh, stride_dvn, N_CTX, BLOCK_N, HEAD_DIM, TMA)
    store_rows(dk_dst, stride_dkn, start_n, N_CTX, (dk * sm_scale).to(DK.dtype.element_ty), BLOCK_N, HEAD_DIM, TMA)
    store_rows(dv_dst, stride_dvn, start_n, N_CTX, dv.to(DV.dtype.element_ty), BLOCK_N, HEAD_DIM, TMA)


@triton.jit
def _dq_inner(dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_vn, offs_m, lo, hi, N_CTX, qk_scale,
              BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
              PRECISION: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr):
    """Accumulate dQ of one query block over key blocks ``[lo, hi)``."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = load_rows(k_src, stride_kn, start_n, N_CTX, BLOCK_N, HEAD_DIM, TMA)
        v = load_rows(v_src, stride_vn, start_n, N_CTX, BLOCK_N, HEAD_DIM, TMA)
        qk = mma(q, tl.trans(k), tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32), PRECISION, UPCAST)
        # Issued before the exponentials, so the tensor cores compute it while they run.
        dp = mma(do, tl.trans(v), tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32), PRECISION, UPCAST)
        p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if MASKED:
            cols = start_n + offs_n
            keep = (cols < N_CTX)[None, :]
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= cols[None, :])
            p = tl.where(keep, p, 0.0)
        ds = p * (dp - delta[:, None])
        dq = mma(ds.to(k.dtype), k, dq, PRECISION, UPCAST)
    return dq


@launcher
@autotune(_DQ, _KEY, _prune)
@triton.jit(do_not_specialize=_DYNAMIC)
def _attn_bwd_dq_kernel(Q, K, V, O, DO, LSE, DELTA, DQ, sm_scale,
                        stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                        stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
                        stride_dob, stride_doh, stride_dom, stride_dqb, stride_dqh, stride_dqm,
                        H, N_CTX, GROUPS, Z,
                        HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                        UPCAST: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Heaviest programs first (see "Block order" above): the head is the fast grid axis, and the last
    # query blocks, which see the most keys under the causal mask, come first.
    off_bh = tl.program_id(0)
    start_m = (tl.num_programs(1) - 1 - tl.program_id(1)) * BLOCK_M
    off_b = (off_bh // H).to(tl.int64)
    off_h = off_bh % H
    off_kvh = (off_h // GROUPS).to(tl.int64)
    off_h = off_h.to(tl.int64)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    row_ok = offs_m < N_CTX
    q_src = row_tiles(Q + off_b * stride_qb + off_h * stride_qh, stride_qm, N_CTX, BLOCK_M, HEAD_DIM, TMA)
    o_src = row_tiles(O + off_b * stride_ob + off_h * stride_oh, stride_om, N_CTX, BLOCK_M, HEAD_DIM, TMA)
    do_src = row_tiles(DO + off_b * stride_dob + off_h * stride_doh, stride_dom, N_CTX, BLOCK_M, HEAD_DIM, TMA)
    q = load_rows(q_src, stride_qm, start_m, N_CTX, BLOCK_M, HEAD_DIM, TMA)
    do = load_rows(do_src, stride_dom, start_m, N_CTX, BLOCK_M, HEAD_DIM, TMA)
    o = load_rows(o_src, stride_om, start_m, N_CTX, BLOCK_M, HEAD_DIM, TMA)
    # delta_i = sum_d O_id * dO_id, in fp32: this kernel's rows, saved for the dK/dV kernel.
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    rows = off_bh.to(tl.int64) * N_CTX + offs_m
    tl.store(DELTA + rows, delta, mask=row_ok)
    lse2 = tl.load(LSE + rows, mask=row_ok, other=float("inf")) * LOG2E
    k_src = row_tiles(K + off_b * stride_kb + off_kvh * stride_kh, stride_kn, N_CTX, BLOCK_N, HEAD_DIM, TMA)
    v_src = row_tiles(V + off_b * stride_vb + off_kvh * stride_vh, stride_vn, N_CTX, BLOCK_N, HEAD_DIM, TMA)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E
    if CAUSAL:
        unmasked_end = start_m
        masked_end = tl.minimum(start_m + BLOCK_M, N_CTX)
    else:
        unmasked_end = (N_CTX // BLOCK_N) * BLOCK_N
        masked_end = N_CTX
    dq = _dq_inner(dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_vn, offs_m, 0, unmasked_end, N_CTX,
                   qk_scale, BLOCK_N, HEAD_DIM, False, CAUSAL, PRECISION, UPCAST, TMA, WS)
    dq = _dq_inner(dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_vn, offs_m, unmasked_end, masked_end,
                   N_CTX, qk_scale, BLOCK_N, HEAD_DIM, True, CAUSAL, PRECISION, UPCAST, TMA, WS)
    dq_dst = row_tiles(DQ + off_b * stride_dqb + off_h * stride_dqh, stride_dqm, N_CTX, BLOCK_M, HEAD_DIM, TMA)
    store_rows(dq_dst, stride_dqm, start_m, N_CTX, (dq * sm_scale).to(DQ.dtype.element_ty), BLOCK_M, HEAD_DIM, TMA)


# ------------------------------------------------------------------------------------------------
# Launchers
# ------------------------------------------------------------------------------------------------


def _bhsd(t: torch.Tensor) -> tuple[int, int, int]:
    """Batch, head and sequence strides of a (batch, heads, seq, head_dim) tensor (one ``stride()``
    call: a launch reads eight of these, and each ``stride(i)`` costs the host as much as the tuple)."""
    return t.stride()[:3]


def _empty_bshd(batch: int, heads: int, seq: int, head_dim: int, like: torch.Tensor) -> torch.Tensor:
    """An empty (batch, heads, seq, head_dim) tensor stored as (batch, seq, heads, head_dim) (one
    ``empty_strided``: half the host time of ``empty`` and ``transpose``)."""
    return torch.empty_strided((batch, heads, seq, head_dim), (seq * heads * head_dim, head_dim, heads * head_dim, 1),
                               dtype=like.dtype, device=like.device)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *more: torch.Tensor) -> None:
    check_tensors("flash_attention", q, k, v, *more)
    qs, ks, vs = q.shape, k.shape, v.shape
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
        raise ValueError("flash_attention: q, k and v must be 4-D: (batch, heads, seq, head_dim) and "
                         "(batch, kv_heads, seq, head_dim)")
    if ks != vs:
        raise ValueError(f"flash_attention: k {tuple(ks)} and v {tuple(vs)} must have the same shape")
    (b, h, s, d), (bk, hk, sk, dk) = qs, ks
    if (b, s, d) != (bk, sk, dk):
        raise ValueError(f"flash_attention: q {tuple(qs)} and k {tuple(ks)} differ in batch, sequence "
                         "or head_dim; this is self-attention, they must agree")
    if hk == 0 or h % hk:
        raise ValueError(f"flash_attention: {h} query heads cannot share {hk} key/value heads evenly")
    if d not in HEAD_DIMS:
        raise ValueError(f"flash_attention: head_dim {d} is not supported; use one of {HEAD_DIMS}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"flash_attention: q, k, v have dtypes {q.dtype}, {k.dtype}, {v.dtype}; make them equal")
    if cdiv(s, 16) > MAX_GRID_Y:  # the grid's second axis counts blocks of at least 16 positions
        raise ValueError(f"flash_attention: a sequence of {s} positions is too long; at most {16 * MAX_GRID_Y}")


def _meta(causal: bool, *tensors: torch.Tensor) -> dict:
    """The launch's constexprs; ``TMA``: read tiles through tensor descriptors where the device and
    every tensor allow it (``use_tensor_descriptors``; the outputs this module allocates always do,
    so only the caller's tensors are passed). The tile and ``WS`` (warp-specialized loops, a
    candidate only with descriptors) come from the autotuner."""
    q = tensors[0]
    tma = use_tensor_descriptors(*tensors)
    if tma:
        ensure_descriptor_memory()
    return {"HEAD_DIM": q.shape[-1], "CAUSAL": causal, "PRECISION": dot_precision(q.dtype),
            "UPCAST": upcast_dots(q.dtype), "TMA": tma}


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
    if not sm_scale > 0:  # the forward scales row maxima, not scores: that needs a positive scale
        raise ValueError(f"flash_attention: sm_scale must be positive, got {sm_scale}")
    out = _empty_bshd(batch, heads, seq, head_dim, q)
    lse = torch.empty((batch, heads, seq), dtype=torch.float32, device=q.device)
    if out.numel():
        grid = lambda meta: (batch * heads, cdiv(seq, meta["BLOCK_M"]))  # noqa: E731
        _attn_fwd_kernel(grid, q, k, v, out, lse, sm_scale, *_bhsd(q), *_bhsd(k), *_bhsd(v), *_bhsd(out),
                         heads, seq, groups, batch, **_meta(causal, q, k, v))
    return out, lse


def flash_attention_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    causal: bool = True, sm_scale: float | None = None,
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` for the upstream gradient ``dout``; ``out`` and ``lse`` come from the forward.
    ``grads``, if given, are where to write them: tensors of q's, k's and v's shapes and dtype, any
    strides with a unit last one (for example head views of one fused gradient)."""
    _check(q, k, v, dout, out)
    q, k, v, out, dout = unit_last_stride(q), unit_last_stride(k), unit_last_stride(v), unit_last_stride(out), \
        unit_last_stride(dout)
    batch, heads, seq, head_dim = q.shape
    kv_heads = k.shape[1]
    groups = heads // kv_heads
    sm_scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    if grads is None:
        dq = _empty_bshd(batch, heads, seq, head_dim, q)
        dk = _empty_bshd(batch, kv_heads, seq, head_dim, k)
        dv = _empty_bshd(batch, kv_heads, seq, head_dim, v)
    else:
        dq, dk, dv = grads
        for name, g, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
            if g.shape != like.shape or g.dtype != like.dtype or g.stride(-1) != 1:
                raise ValueError(f"flash_attention backward: {name} must have shape {tuple(like.shape)} and dtype "
                                 f"{like.dtype} with unit last stride, got {tuple(g.shape)} {g.dtype}")
    if not dq.numel():
        return dq, dk, dv
    delta = torch.empty_like(lse)  # written by the dQ kernel, read by the dK/dV kernel
    meta = _meta(causal, q, k, v, out, dout)
    grid_q = lambda m: (batch * heads, cdiv(seq, m["BLOCK_M"]))  # noqa: E731
    _attn_bwd_dq_kernel(grid_q, q, k, v, out, dout, lse, delta, dq, sm_scale, *_bhsd(q), *_bhsd(k), *_bhsd(v),
                        *_bhsd(out), *_bhsd(dout), *_bhsd(dq), heads, seq, groups, batch, **meta)
    grid_kv = lambda m: (batch * kv_heads, cdiv(seq, m["BLOCK_N"]))  # noqa: E731
    _attn_bwd_dkdv_kernel(grid_kv, q, k, v, dout, lse, delta, dk, dv, sm_scale, *_bhsd(q), *_bhsd(k), *_bhsd(v),
                          *_bhsd(dout), *_bhsd(dk), *_bhsd(dv), heads, seq, groups, batch, **meta)
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
