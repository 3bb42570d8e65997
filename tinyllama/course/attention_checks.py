"""The checks of notebook 14's PyTorch exercises: the online softmax (14.2), the tiled attention forward
(14.3) and the prediction of the bytes each attention keeps for its backward (14.5). (The Triton kernel of
14.4 has its own module, :mod:`tinyllama.course.attention_kernel_checks`.)

Each function is run against PyTorch's answer on fresh random inputs by
:func:`tinyllama.course.feedback.check_kernel`, which first compares a wrong result with each
typical mistake (a :class:`~tinyllama.course.feedback.Slip`: the same algorithm with one thing
wrong, computed here on the same inputs) and names the one it reproduces. A prediction is compared with
the measurement, and a prediction off by a typical mistake's factor is named.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import torch

from tinyllama.course.checkpoints import check_between, checkpoint
from tinyllama.course.feedback import Slip, check_kernel

# ---- 14.2: the online softmax -----------------------------------------------------------------------------------


def online_softmax_model(x: torch.Tensor, tile: int, slip: str = "") -> torch.Tensor:
    """The online softmax over the last dimension of ``x`` (rows, n), one tile of columns at a time, with the
    mistake ``slip`` ("no_l_rescale", "no_max", "m_not_kept") planted."""
    rows, n = x.shape
    m = torch.full((rows,), float("-inf"), dtype=x.dtype)
    l = torch.zeros(rows, dtype=x.dtype)
    for start in range(0, n, tile):
        block = x[:, start:start + tile]
        m_new = torch.maximum(m, block.amax(dim=1))
        terms = torch.exp(block) if slip == "no_max" else torch.exp(block - m_new[:, None])
        l = (l if slip == "no_l_rescale" else l * torch.exp(m - m_new)) + terms.sum(dim=1)
        if slip != "m_not_kept":
            m = m_new
    return torch.exp(x - m[:, None]) / l[:, None]


SOFTMAX_SLIPS: tuple[Slip, ...] = (
    Slip("no_l_rescale", "the old sum l is not rescaled when the maximum grows: it was summed against the old "
                         "maximum; multiply it by exp(m - m_new) before adding this tile's sum.",
         function=lambda x, tile: online_softmax_model(x, tile, "no_l_rescale")),
    Slip("no_max", "the exponentials are taken without subtracting the running maximum: exp of scores in the tens "
                   "overflows (inf, then NaN), and l no longer matches exp(x - m) at the end. Use "
                   "exp(block - m_new[:, None]).",
         function=lambda x, tile: online_softmax_model(x, tile, "no_max")),
    Slip("m_not_kept", "the running maximum is never kept: m stays -inf, so every tile's rescaling factor is 0 and "
                       "the final exp(x - m) is inf. End the tile with m = m_new.",
         function=lambda x, tile: online_softmax_model(x, tile, "m_not_kept")),
)
SOFTMAX_HINT = ("NaN or inf: is the maximum subtracted before exp? A constant factor per row: is the old sum rescaled "
                "by exp(m - m_new)? Wrong only in the last columns: does the last, shorter tile count?")
SOFTMAX_SHAPES = ((1, 1), (3, 37), (2, 100), (4, 257))


def check_online_softmax(online_softmax: Callable[[torch.Tensor, int], torch.Tensor], tile: int) -> bool:
    """Exercise 14.2: ``online_softmax(x, tile)`` against ``torch.softmax`` on rows of values in the tens."""
    slips = [Slip(s.name, s.message, function=lambda x, model=s.function: model(x, tile)) for s in SOFTMAX_SLIPS]
    return check_kernel(f"online_softmax with tiles of {tile}", lambda x: online_softmax(x, tile),
                        lambda x: torch.softmax(x, dim=-1), lambda shape: (30 * torch.randn(*shape),), SOFTMAX_SHAPES,
                        slips, SOFTMAX_HINT, atol=1e-6, rtol=1e-4, guard=False)


# ---- 14.3: tiled attention ---------------------------------------------------------------------------------------

def tiled_attention_model(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, block_m: int = 32,
                          block_n: int = 24, slip: str = "") -> torch.Tensor:
    """The notebook's tiled forward in fp32, with the mistake ``slip`` (a key of :data:`TILED_SLIPS`) planted."""
    batch, heads, seq, d = q.shape
    kv_heads = k.shape[1]
    groups = heads // kv_heads
    scale = 1.0 if slip == "no_scale" else 1.0 / math.sqrt(d)
    out = torch.empty(q.shape, dtype=torch.float32)
    for h in range(heads):
        kv = h % kv_heads if slip == "kv_interleaved" else h // groups
        for start_m in range(0, seq, block_m):
            stop_m = min(start_m + block_m, seq)
            rows = torch.arange(start_m, stop_m)
            q_tile = q[:, h, start_m:stop_m].float()
            m = torch.full((batch, len(rows)), float("-inf"))
            l = torch.zeros(batch, len(rows))
            acc = torch.zeros(batch, len(rows), d)
            end = (start_m + 1 if slip == "loop_ends_early" else stop_m) if causal else seq
            for start_n in range(0, end, block_n):
                stop_n = min(start_n + block_n, end)
                cols = torch.arange(start_n, stop_n)
                s = q_tile @ k[:, kv, start_n:stop_n].float().transpose(-1, -2) * scale
                if causal:
                    future = (cols[None, None, :] >= rows[None, :, None] if slip == "diagonal_masked"
                              else cols[None, None, :] > rows[None, :, None])
                    s = s.masked_fill(future, float("-inf"))
                m_new = torch.maximum(m, s.amax(dim=-1))
                alpha = torch.exp(m - m_new)
                p = torch.exp(s - m_new[..., None])
                l = (l if slip == "no_l_rescale" else l * alpha) + p.sum(dim=-1)
                acc = (acc if slip == "no_acc_rescale" else acc * alpha[..., None]) + p @ v[:, kv, start_n:stop_n].float()
                m = m_new
            out[:, h, start_m:stop_m] = acc / l[..., None]
    return out.to(q.dtype)


TILED_SLIPS: dict[str, str] = {
    "kv_interleaved": "some query heads read the wrong key/value head: query heads share them in consecutive "
                      "groups, kv = h // groups (not h % kv_heads).",
    "loop_ends_early": "with the causal mask the key loop stops too early: a query block needs every key up to its "
                       "last row, end = stop_m (the keys of the rows after the first are missing).",
    "diagonal_masked": "the causal mask hides the diagonal too: a query sees its own key. Mask only the columns "
                       "greater than the row (>, not >=); else the first row sees nothing and is NaN.",
    "no_acc_rescale": "acc is not rescaled when the maximum grows: multiply it by exp(m - m_new) (alpha[..., None]) "
                      "before adding this tile's p @ v.",
    "no_l_rescale": "l is not rescaled when the maximum grows: multiply it by exp(m - m_new) before adding this "
                    "tile's row sums.",
    "no_scale": "the scores are not scaled: multiply q k^T by scale = 1/sqrt(d) before the maximum and the "
                "exponentials.",
}
TILED_HINT = ("Wrong only in some heads (dim 1): the key/value head of a query head. Wrong above the diagonal or in "
              "the first rows: the mask or the end of the key loop. A factor: the scale or l's rescaling.")


def check_tiled_attention(tiled_attention: Callable[..., torch.Tensor],
                          make_inputs: Callable[[tuple[int, ...]], Sequence[torch.Tensor]],
                          shapes: Iterable[tuple[int, ...]]) -> bool:
    """Exercise 14.3: ``tiled_attention(q, k, v, causal)`` against attention written out in fp32, causal and
    full, on grouped-query shapes (batch, heads, kv_heads, seq, d) whose lengths are not multiples of the tiles."""
    from tinyllama.kernels import flash_attention_reference

    shapes = list(shapes)
    ok = True
    for causal in (True, False):
        slips = [Slip(name, message, function=lambda q, k, v, name=name, causal=causal:
                      tiled_attention_model(q, k, v, causal, slip=name)) for name, message in TILED_SLIPS.items()]
        ok &= check_kernel(f"tiled_attention (causal={causal})",
                           lambda q, k, v, causal=causal: tiled_attention(q, k, v, causal),
                           lambda q, k, v, causal=causal: flash_attention_reference(q, k, v, causal), make_inputs,
                           shapes, slips, TILED_HINT, atol=1e-5, rtol=1e-4, guard=False)
    return ok


# ---- 14.5: the bytes kept for the backward, predicted ------------------------------------------------------------

Shape5 = tuple[int, int, int, int, int, int]  # batch, heads, kv_heads, head_dim, element bytes, sequence


def math_saved(b: int, h: int, kv: int, d: int, e: int, s: int) -> float:
    """The S^2 part the math path keeps: one fp32 probability per (query, key) pair, head and batch entry."""
    return b * h * s * s * 4


def flash_saved(b: int, h: int, kv: int, d: int, e: int, s: int) -> float:
    """What the flash kernel saves: q and out (heads), k and v (kv_heads), and one fp32 lse per row and head."""
    return e * b * s * d * (2 * h + 2 * kv) + 4 * b * h * s


MATH_SLIPS: dict[str, tuple[Callable[..., float], str]] = {
    "kv_heads": (lambda b, h, kv, d, e, s: b * kv * s * s * 4,
                 "you counted the key/value heads: every query head has its own probabilities (heads, not kv_heads)."),
    "input_bytes": (lambda b, h, kv, d, e, s: b * h * s * s * e,
                    "you counted the probabilities at the inputs' element size: the math path computes in fp32, 4 "
                    "bytes each."),
    "not_squared": (lambda b, h, kv, d, e, s: b * h * s * 4,
                    "your count grows with S, not S^2: there is one probability per (query, key) pair."),
    "no_batch": (lambda b, h, kv, d, e, s: h * s * s * 4, "you left out the batch: every sequence has its own matrix."),
    "mib": (lambda b, h, kv, d, e, s: b * h * s * s * 4 / 2**20,
            "your prediction is in MiB: give bytes (the cell converts to MiB when it prints)."),
}
FLASH_SLIPS: dict[str, tuple[Callable[..., float], str]] = {
    "kv_as_heads": (lambda b, h, kv, d, e, s: e * b * s * d * 4 * h + 4 * b * h * s,
                    "you counted k and v with every query head: they have kv_heads heads (grouped-query attention)."),
    "no_out": (lambda b, h, kv, d, e, s: e * b * s * d * (h + 2 * kv) + 4 * b * h * s,
               "you left out the output: the backward needs out (it is saved with q, k, v and lse)."),
    "fp32_inputs": (lambda b, h, kv, d, e, s: 4 * b * s * d * (2 * h + 2 * kv) + 4 * b * h * s,
                    "you counted q, k, v and out in fp32: they are saved in the inputs' dtype, element bytes each."),
    "no_batch": (lambda b, h, kv, d, e, s: e * s * d * (2 * h + 2 * kv) + 4 * h * s,
                 "you left out the batch: every tensor saved has a batch dimension."),
    "mib": (lambda b, h, kv, d, e, s: flash_saved(b, h, kv, d, e, s) / 2**20,
            "your prediction is in MiB: give bytes (the cell converts to MiB when it prints)."),
}
MATH_WHY = ("the fp32 probabilities, batch x heads x S^2 x 4 bytes, are nearly all of it at long sequences; the fp32 "
            "copies of q, k, v and the boolean mask add the rest.")
FLASH_WHY = "q and out (heads), k and v (kv_heads) in the input dtype, plus one fp32 lse per row and head."


def _saved_check(name: str, predicted: float | None, measured: float, low: float, high: float, why: str,
                 slips: dict[str, tuple[Callable[..., float], str]], right: float, shape: Shape5) -> bool:
    if predicted is None or not isinstance(predicted, (int, float)) or not predicted > 0:
        return checkpoint(False, "", f"{name}: write your prediction in bytes (a positive number), got {predicted!r}")
    ratio = measured / predicted
    if low <= ratio <= high:
        return check_between(name, ratio, low, high, why=why)
    matched = [message for model, message in slips.values()
               if not math.isclose(model(*shape), right, rel_tol=0.02) and math.isclose(predicted, model(*shape),
                                                                                        rel_tol=0.02)]
    # At some shapes two mistakes give the same number (batch 2 and kv_heads = heads / 2): name each then.
    said = (matched[0] if len(matched) == 1 else
            "it equals more than one typical mistake here: " + " Or: ".join(matched) if matched else "")
    return checkpoint(False, "", f"{name} = {ratio:.4g} is outside the plausible range {low:.4g} .. {high:.4g}: "
                                 + (said or "count what the backward keeps, in bytes: " + why))


def check_saved_predictions(predicted_math: float | None, predicted_flash: float | None, measured_math: float,
                            measured_flash: float, batch: int, heads: int, kv_heads: int, head_dim: int, element: int,
                            seq: int) -> bool:
    """Exercise 14.5: each prediction against the bytes measured for the backward (measured / predicted within a
    range); a prediction off by a typical mistake is named."""
    shape = (batch, heads, kv_heads, head_dim, element, seq)
    ok = _saved_check("math path: measured / predicted saved bytes", predicted_math, measured_math, 0.6, 1.7, MATH_WHY,
                      MATH_SLIPS, math_saved(*shape), shape)
    return ok & _saved_check("flash: measured / predicted saved bytes", predicted_flash, measured_flash, 0.8, 1.25,
                             FLASH_WHY, FLASH_SLIPS, flash_saved(*shape), shape)
