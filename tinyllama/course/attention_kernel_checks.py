"""The check of notebook 14's own Triton flash-attention forward (the participant writes its inner loop).

- :func:`tiled_attention` is the kernel's algorithm in PyTorch, block by block in fp32, with the typical
  mistakes of the inner loop (:data:`SLIPS`) planted on request: the check compares a wrong result with
  each of them, so its message names the likely mistake instead of only "differs";
- :func:`random_attention_inputs` draws fresh q, k, v (grouped-query heads) for one case;
- :func:`check_attention_kernel` runs a participant's launcher ``attention(q, k, v, causal=..., block_m=...,
  block_n=...)`` against attention written out in fp32 on sequence lengths that are not multiples of the
  blocks, causal and not, with its tensors guarded (:mod:`tinyllama.course.guards`), and passes only if
  every case agrees.

On a CPU the kernel runs through Triton's interpreter in fp32 (the interpreter has no bf16 dot
products); on a GPU it is compiled and checked in bf16, with bf16's tolerance.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Iterable, Sequence

import torch

from tinyllama.course.checkpoints import checkpoint
from tinyllama.course.feedback import compare_outputs
from tinyllama.course.guards import STORE_HINT, Guards

# A case: (batch, query heads, key/value heads, sequence, head dimension).
Case = tuple[int, int, int, int, int]
CASES: tuple[Case, ...] = ((1, 2, 1, 100, 64), (2, 2, 2, 37, 32))

# The inner loop's typical mistakes, each with what it looks like and where to look.
SLIPS: dict[str, str] = {
    "no_acc_rescale": "acc is not rescaled when the running maximum grows: multiply it by exp(m_i - m_new) "
                      "(per row, [:, None]) before adding this block's p @ v.",
    "no_l_rescale": "l_i is not rescaled when the running maximum grows: the old sum was taken against the old "
                    "maximum; multiply it by exp(m_i - m_new) before adding this block's row sums.",
    "no_causal_mask": "the causal mask is missing: on the diagonal block a query sees keys after it. Keep only "
                      "the scores where the query row (offs_m) is at or after the key column.",
    "strict_causal_mask": "the causal mask is off by one: a query must see its own key (row >= column, not >), "
                          "else the first row sees no key at all and its 0/0 is NaN.",
    "no_scale": "the softmax scale is missing: multiply the scores q k^T by sm_scale (1/sqrt(head_dim)) before "
                "the maximum and the exponentials.",
    "no_end_mask": "keys past the end of the sequence are not masked: their loads give zeros, so their scores are "
                   "0, not -inf, and they add exp(0 - m) to the sum. Mask the scores with in_seq (all keys, "
                   "causal or not).",
    "masked_to_zero": "masked scores are set to 0 instead of -inf: exp(0 - m) is not 0, so masked keys still add "
                      "to l_i. Use float(\"-inf\") in tl.where.",
}

GENERAL_HINT = ("What to look at: the scores (q k^T times sm_scale), the masks (in_seq for keys past the end; "
                "row >= column under the causal mask; masked scores -inf), the new maximum m_new, then l_i and acc "
                "both rescaled by exp(m_i - m_new) before this block's terms are added, and m_i = m_new at the end.")


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """atol/rtol of the check: fp32 differs from the reference only by the order of the additions; bf16
    rounds the inputs, the probabilities before the second matmul and the output (8 significant bits)."""
    return dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


def random_attention_inputs(case: Case, dtype: torch.dtype, device: torch.device | str,
                            generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh q (batch, heads, seq, d), k and v (batch, kv_heads, seq, d) of standard normal values."""
    b, h, kvh, s, d = case
    return tuple(torch.randn(b, n, s, d, generator=generator).to(device, dtype) for n in (h, kvh, kvh))


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, block_m: int, block_n: int,
                    slips: Iterable[str] = ()) -> torch.Tensor:
    """What the notebook's kernel computes, in fp32 on the CPU, block by block in the kernel's order: key
    blocks of ``block_n`` (zero-padded past the end, as the masked loads give them) up to the diagonal
    block's end (causal) or the sequence's; with the mistakes named in ``slips`` (keys of :data:`SLIPS`)."""
    slips = set(slips)
    unknown = slips - set(SLIPS)
    if unknown:
        raise ValueError(f"unknown slip(s) {sorted(unknown)}: choose from {sorted(SLIPS)}")
    batch, heads, seq, d = q.shape
    groups = heads // k.shape[1]
    q = q.detach().float().cpu()
    k = k.detach().float().cpu().repeat_interleave(groups, dim=1)
    v = v.detach().float().cpu().repeat_interleave(groups, dim=1)
    padded = math.ceil(seq / block_n) * block_n  # the key blocks' loads: zeros past the end
    k = torch.cat([k, k.new_zeros(batch, heads, padded - seq, d)], dim=2)
    v = torch.cat([v, v.new_zeros(batch, heads, padded - seq, d)], dim=2)
    scale = 1.0 if "no_scale" in slips else 1.0 / math.sqrt(d)
    masked = 0.0 if "masked_to_zero" in slips else float("-inf")
    out = torch.empty(batch, heads, seq, d)
    for start_m in range(0, seq, block_m):
        rows = torch.arange(start_m, min(start_m + block_m, seq))
        q_tile = q[:, :, rows]
        m = torch.full((batch, heads, len(rows)), float("-inf"))
        l = torch.zeros(batch, heads, len(rows))
        acc = torch.zeros(batch, heads, len(rows), d)
        hi = min(start_m + block_m, seq) if causal else seq
        for start_n in range(0, hi, block_n):
            cols = torch.arange(start_n, start_n + block_n)
            s = q_tile @ k[:, :, cols].transpose(-1, -2) * scale
            keep = torch.ones(len(rows), block_n, dtype=torch.bool)
            if "no_end_mask" not in slips:
                keep &= cols[None, :] < seq
            if causal and "no_causal_mask" not in slips:
                after = rows[:, None] - cols[None, :]  # >= 0: the key is at or before the query
                keep &= (after > 0) if "strict_causal_mask" in slips else (after >= 0)
            s = torch.where(keep, s, torch.tensor(masked))
            m_new = torch.maximum(m, s.amax(dim=-1))
            alpha = torch.exp(m - m_new)
            p = torch.exp(s - m_new[..., None])
            l = (l if "no_l_rescale" in slips else l * alpha) + p.sum(dim=-1)
            acc = (acc if "no_acc_rescale" in slips else acc * alpha[..., None]) + p @ v[:, :, cols]
            m = m_new
        out[:, :, rows] = acc / l[..., None]
    return out


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Attention written out in fp32 on the CPU: softmax(q k^T / sqrt(d) [causal]) v, grouped-query heads."""
    from tinyllama.kernels.flash_attention import flash_attention_reference  # the course's reference

    return flash_attention_reference(q.detach().float().cpu(), k.detach().float().cpu(), v.detach().float().cpu(),
                                     causal=causal)


def _same(actual: torch.Tensor, expected: torch.Tensor, tol: dict[str, float]) -> bool:
    return actual.shape == expected.shape and torch.allclose(actual, expected, equal_nan=True, **tol)


def diagnose(actual: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, block_m: int,
             block_n: int, tol: dict[str, float]) -> list[str]:
    """The slips (one, else two together) whose result ``actual`` reproduces, among those that change the
    result of this case; empty when none does."""
    actual = actual.detach().float().cpu()
    correct = tiled_attention(q, k, v, causal, block_m, block_n)
    singles = {name: tiled_attention(q, k, v, causal, block_m, block_n, (name,)) for name in SLIPS}
    visible = [name for name, result in singles.items() if not _same(result, correct, tol)]
    for name in visible:
        if _same(actual, singles[name], tol):
            return [name]
    for pair in itertools.combinations(visible, 2):
        if _same(actual, tiled_attention(q, k, v, causal, block_m, block_n, pair), tol):
            return list(pair)
    return []


def check_attention_kernel(attention: Callable[..., torch.Tensor], device: torch.device | str, dtype: torch.dtype,
                           block_m: int, block_n: int, cases: Sequence[Case] = CASES, seed: int | None = None,
                           guard: bool = True) -> bool:
    """Run ``attention(q, k, v, causal=..., block_m=..., block_n=...)`` (a launcher of the participant's
    kernel) on fresh random inputs of every case, causal and full, against attention written out in fp32;
    pass only if every result is within the dtype's tolerance. A wrong result is compared with each
    typical mistake of the inner loop (:data:`SLIPS`) and the message names the one it reproduces, with
    where the result differs. ``guard``: run the kernel on guarded tensors, so that a load or store past
    the end of a tensor is named (see :mod:`tinyllama.course.guards`) instead of crashing."""
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    generator = torch.Generator().manual_seed(seed)
    tol = tolerance(dtype)
    failures: list[str] = []
    named: list[str] = []
    for case, causal in itertools.product(cases, (True, False)):
        q, k, v = random_attention_inputs(case, dtype, device, generator)
        label = f"{'causal' if causal else 'full'} attention, (batch, heads, kv_heads, seq, d) = {case}"
        guards = Guards(attention) if guard else None
        try:
            if guards is None:
                actual = attention(q, k, v, causal=causal, block_m=block_m, block_n=block_n)
            else:
                gq, gk, gv = guards.inputs((q, k, v))
                with guards:
                    actual = attention(gq, gk, gv, causal=causal, block_m=block_m, block_n=block_n)
        except NotImplementedError:  # an exercise not written yet: its own message says what to do
            raise
        except Exception as error:  # the participant's kernel failed to compile or run: say where, briefly
            found = guards.findings() if guards is not None else []
            failures.extend(f"{label}: {text}" for text in found)
            if not (found and STORE_HINT in str(error)):
                text = str(error).strip().splitlines()
                failures.append(f"{label}: the kernel raised {type(error).__name__}: {text[-1] if text else ''}"
                                " (in tl.dot both operands need one dtype: p.to(v.dtype); block shapes must be "
                                "powers of two)")
            continue
        expected = reference_attention(q, k, v, causal)
        if guards is not None:  # past an end, even if right; NaN from an input's guard in the result (a GPU's only sign)
            found = (guards.findings((actual.float().cpu(),), (expected,)) if isinstance(actual, torch.Tensor)
                     else guards.findings())
            failures.extend(f"{label}: {text}" for text in found)
        if not isinstance(actual, torch.Tensor):
            failures.append(f"{label}: the launcher returned {type(actual).__name__}, not the output tensor")
            continue
        mismatch = compare_outputs(actual.float().cpu(), expected, name=label, **tol)
        if mismatch.ok:
            continue
        if mismatch.problem:
            slips, why = [], ""
        elif bool(torch.isnan(actual).all()):  # no block ever added to l_i: acc / l_i is 0 / 0 in every row
            slips, why = [], " Every element is NaN: l_i is still 0 at the end (0 / 0): does the loop body update l_i?"
        else:
            slips = diagnose(actual, q, k, v, causal, block_m, block_n, tol)
            why = " It matches the loop with " + " and ".join(f"[{s}]" for s in slips) + "." if slips else ""
        named.extend(s for s in slips if s not in named)
        failures.append(mismatch.describe() + why)
    shown = ", ".join(str(c) for c in cases)
    if not failures:
        return checkpoint(True, f"your attention kernel agrees with attention written out in fp32 (causal and full, "
                                f"(batch, heads, kv_heads, seq, d) = {shown}, blocks {block_m} x {block_n}, fresh "
                                "random inputs)", "")
    advice = [f"  [{s}] {SLIPS[s]}" for s in named] or [f"  {GENERAL_HINT}"]
    message = (f"your attention kernel differs from the reference in {len(failures)} case(s) (seed {seed}, blocks "
               f"{block_m} x {block_n}):\n  - " + "\n  - ".join(failures) + "\n" + "\n".join(advice))
    return checkpoint(False, "", message)
