"""Correct before timed: a runner's greedy tokens and its logits against the fp32 no-cache reference."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tinyllama.config import set_matmul_precision
from tinyllama.generation.runners import Runner, Sampling, decode_loop, generate

# The largest relative logits error (worst step) that passes. fp32: rounding only (about 1e-6 measured).
# bf16 keeps weights, activations and the cache in bf16 (no fp32 residual stream, unlike training's
# autocast, whose parity tolerance is 5e-2). Measured with 512 + 32 tokens on an H200 at medium and large
# (2 seeds, batch 1 and 4): the cache's error is 0.039-0.057 (the model's own no-cache bf16 forward's is
# the same: 1.5e-2 at ci to 4.2e-2 at large on a CPU), while a cache written one slot off gives 0.20-0.30
# and decode tokens rotated as if at position 0 give 1.3-1.4. 1e-1 lies between, about 2x from each.
LOGITS_TOLERANCE = {"fp32": 1e-4, "bf16": 1e-1}


@torch.no_grad()
def teacher_forced_logits(runner: Runner, prompt: torch.Tensor, continuation: torch.Tensor) -> torch.Tensor:
    """Logits (batch, N, vocab), fp32, with which ``runner`` would choose each token of ``continuation``
    (batch, N) after ``prompt``, fed the continuation's earlier tokens instead of its own choices."""
    length = prompt.shape[1]
    steps = [runner.prefill(prompt).to(torch.float32, copy=True)]  # copies: a graph's output is reused
    for i in range(continuation.shape[1] - 1):
        steps.append(runner.decode(continuation[:, i], length + i).to(torch.float32, copy=True))
    return torch.stack(steps, dim=1)


@dataclass
class GenerationCheck:
    """A runner's greedy tokens and logits against the fp32 no-cache reference. ``logits_error``: the
    worst step's relative error (norm of the difference over the reference's norm, over batch and
    vocabulary). fp32 must give identical tokens; bf16 the logits within its tolerance (its argmax may
    flip where two logits nearly tie, after which the sequences differ: reported, not failed)."""

    precision: str
    batch: int
    new_tokens: int
    logits_error: float
    worst_step: int
    tolerance: float
    first_divergence: tuple[int, int] | None  # (step, sequence) where greedy tokens first differ

    @property
    def passed(self) -> bool:
        tokens_ok = self.first_divergence is None or self.precision != "fp32"
        return tokens_ok and self.logits_error <= self.tolerance

    def summary(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        tokens = ("greedy tokens identical" if self.first_divergence is None else
                  f"greedy tokens first differ at step {self.first_divergence[0]} of sequence {self.first_divergence[1]}")
        return (f"check {verdict} ({self.precision}, {self.batch} x {self.new_tokens} tokens against the fp32 "
                f"no-cache reference): {tokens}; logits error {self.logits_error:.1e} at step {self.worst_step} "
                f"(<= {self.tolerance:.0e})")


def first_divergence(tokens: torch.Tensor, reference: torch.Tensor) -> tuple[int, int] | None:
    """(step, sequence) of the first token that differs, or None."""
    differs = (tokens != reference).cpu()
    if not differs.any():
        return None
    step = int(differs.any(dim=0).nonzero()[0])
    return step, int(differs[:, step].nonzero()[0])


@torch.no_grad()
def check_generation(runner: Runner, reference: nn.Module, prompt: torch.Tensor, new_tokens: int,
                     precision: str) -> GenerationCheck:
    """``runner``'s greedy generation after ``prompt`` against ``reference`` (an fp32 model with the same
    weights) recomputing the whole sequence each step, and the runner's logits on the reference's tokens."""
    set_matmul_precision("fp32")
    length = prompt.shape[1]
    expected = generate(reference, prompt, new_tokens, use_cache=False)
    expected_logits = reference(torch.cat([prompt, expected], dim=1))[:, length - 1:-1].float()
    set_matmul_precision(precision)
    tokens = decode_loop(runner, prompt, new_tokens, Sampling().pick)
    logits = teacher_forced_logits(runner, prompt, expected)
    errors = ((logits - expected_logits).norm(dim=(0, 2)) / expected_logits.norm(dim=(0, 2))).tolist()
    worst = max(range(len(errors)), key=errors.__getitem__)
    return GenerationCheck(precision, prompt.shape[0], new_tokens, errors[worst], worst,
                           LOGITS_TOLERANCE[precision], first_divergence(tokens, expected))
