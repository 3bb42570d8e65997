"""The checks of notebook 10 (the TinyLLaMA baseline), with feedback that names the likely mistake.

- :func:`check_parameter_formula`: a parameter count written as a formula of the shape, against
  ``sum(p.numel())`` of the built V1 model, on the presets and on odd shapes (GQA, MQA, MHA);
- :func:`check_flops_formula`: training FLOPs per token, against ``FlopCounterMode`` over a V1 forward
  and backward (``tinyllama.costs.flops.counted_training_flops``);
- :func:`check_activation_formula`: bytes autograd saves for the backward, against
  :func:`tinyllama.costs.anatomy.saved_activations` on a sweep of batch sizes and sequence lengths;
- :func:`check_fits`: a ``fits(batch)`` predicate that must survive an out-of-memory and leave no
  gradients or memory behind (tested with :func:`tinyllama.costs.anatomy.pretend_out_of_memory` on every
  device, so a CPU tests it too).

Where a wrong answer differs from the reference by a recognisable part of the model (the output head,
the norms, K/V at full width, the attention products...), the feedback says which.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from tinyllama import device as dev
from tinyllama.config import ModelConfig
from tinyllama.costs import anatomy
from tinyllama.course.checkpoints import check_between, checkpoint

Shape = tuple[int, int, int, int, int, int]  # vocab, hidden, layers, heads, kv_heads, intermediate

# The presets' shapes and odd ones: grouped-query, multi-query (one K/V head), multi-head (as many K/V
# heads as query heads), sizes that are not powers of two, a single layer.
PARAMETER_SHAPES: tuple[Shape, ...] = (
    (128, 64, 2, 4, 2, 160),        # ci
    (1000, 256, 4, 8, 4, 512),      # tiny
    (1000, 1024, 12, 8, 4, 4096),   # medium
    (37, 48, 3, 6, 2, 100),         # odd sizes, GQA 3:1
    (50, 96, 1, 12, 12, 200),       # one layer, multi-head attention
    (11, 32, 5, 8, 1, 72),          # multi-query attention
)


def shape_config(shape: Sequence[int], max_seq_len: int = 1024) -> ModelConfig:
    """The ``ModelConfig`` of a (vocab, hidden, layers, heads, kv_heads, intermediate) tuple."""
    vocab, hidden, layers, heads, kv_heads, intermediate = (int(x) for x in shape)
    return ModelConfig(vocab_size=vocab, hidden_dim=hidden, num_layers=layers, num_heads=heads,
                       num_kv_heads=kv_heads, intermediate_dim=intermediate, max_seq_len=max_seq_len)


@functools.lru_cache(maxsize=64)
def built_parameter_count(config: ModelConfig) -> int:
    """``sum(p.numel())`` of V1 built with ``config`` (cached: the checks ask for each shape twice)."""
    return anatomy.built_parameter_count(config)


def _parameter_parts(c: ModelConfig) -> dict[str, int]:
    h, i, kv, layers = c.hidden_dim, c.intermediate_dim, c.kv_dim, c.num_layers
    return {"the token embedding (vocab x hidden)": c.vocab_size * h,
            "the output head lm_head (vocab x hidden; not tied to the embedding)": c.vocab_size * h,
            "the query and output projections (hidden x hidden each, every layer)": layers * 2 * h * h,
            "the key and value projections (hidden x kv_heads*head_dim each, every layer)": layers * 2 * h * kv,
            "one of the three SwiGLU matrices (gate, up, down: hidden x intermediate each)": layers * h * i,
            "the two RMSNorm weights of every layer (hidden each)": layers * 2 * h,
            "the final RMSNorm (hidden)": h}


def _parameter_explanations(c: ModelConfig) -> dict[str, int]:
    """Likely mistakes -> (reference - wrong count) for this shape."""
    out = {"the key and value projections are counted at full width: with grouped-query attention they map "
           "hidden to kv_heads * head_dim, not to hidden": -c.num_layers * 2 * c.hidden_dim * (c.hidden_dim - c.kv_dim)}
    parts = list(_parameter_parts(c).items())
    for size in (1, 2, 3):
        for combo in itertools.combinations(parts, size):
            names = " and ".join(name for name, _ in combo)
            amount = sum(n for _, n in combo)
            out[f"your count misses {names}"] = amount
            out[f"your count has {names} once too often"] = -amount
    return out


def _explain(differences: Sequence[tuple[float, dict[str, float]]]) -> str:
    """The explanations whose amount matches the difference in every case (at most two), or ""."""
    if not differences:
        return ""
    matches = [text for text in differences[0][1]
               if all(math.isclose(difference, amounts[text], rel_tol=1e-6, abs_tol=0.5)
                      for difference, amounts in differences)]
    return "; or ".join(matches[:2])  # equal-sized parts (embedding, output head) cannot be told apart


def _check_numbers(name: str, what: str, cases: Sequence[tuple[str, Callable[[], float], Callable[[], float]]],
                   explanation: str, rel_tol: float) -> bool:
    """Every case's answer equals its reference within ``rel_tol``; the feedback lists the cases."""
    wrong, errors = [], []
    for label, answer, reference in cases:
        try:
            value = float(answer())
        except NotImplementedError:
            raise
        except Exception as error:  # noqa: BLE001 - the participant's code failed: say where
            errors.append(f"{label}: {type(error).__name__}: {error}")
            continue
        expected = float(reference())
        if not (math.isfinite(value) and math.isclose(value, expected, rel_tol=rel_tol, abs_tol=0.5)):
            wrong.append(f"{label}: yours {value:,.0f}, {what} {expected:,.0f} ({value / expected:.4g}x)")
    if not wrong and not errors:
        return checkpoint(True, f"{name} equals {what} for all {len(cases)} shapes (presets and odd ones)", "")
    lines = errors + wrong
    message = (f"{name} differs from {what} in {len(lines)} of {len(cases)} cases:\n  - " + "\n  - ".join(lines)
               + (f"\n  Likely: {explanation}." if explanation else
                  "\n  No single part of the model explains the difference: write the count part by part."))
    return checkpoint(False, "", message)


def explain_parameter_difference(formula: Callable[..., float], shapes: Sequence[Shape] = PARAMETER_SHAPES) -> str:
    """What a parameter formula that is wrong on ``shapes`` probably missed or counted twice ("" when no
    single mistake explains all of them)."""
    differences = []
    for shape in shapes:
        config = shape_config(shape)
        differences.append((built_parameter_count(config) - float(formula(*shape)),
                            _parameter_explanations(config)))
    return _explain(differences)


def check_parameter_formula(formula: Callable[..., float], shapes: Sequence[Shape] = PARAMETER_SHAPES) -> bool:
    """``formula(vocab, hidden, layers, heads, kv_heads, intermediate)`` against ``sum(p.numel())`` of
    the V1 model built with that shape, for every shape (exact)."""
    try:
        explanation = explain_parameter_difference(formula, shapes)
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001 - the cases below report the error
        explanation = ""
    cases = [(f"{shape}", lambda s=shape: formula(*s), lambda s=shape: built_parameter_count(shape_config(s)))
             for shape in shapes]
    return _check_numbers("your parameter count", "sum(p.numel()) of the built V1 model", cases, explanation, 0.0)


# (shape, sequence length): odd lengths, and one long enough that attention matters.
FLOPS_CASES: tuple[tuple[Shape, int], ...] = (
    ((128, 64, 2, 4, 2, 160), 32), ((1000, 256, 4, 8, 4, 512), 128), ((1000, 1024, 12, 8, 4, 4096), 512),
    ((37, 48, 3, 6, 2, 100), 40), ((50, 96, 1, 12, 12, 200), 300), ((11, 32, 5, 8, 1, 72), 17),
)


@functools.lru_cache(maxsize=64)
def counted_flops_per_token(config: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token that ``FlopCounterMode`` counts over V1 (batch 1, meta device)."""
    from tinyllama.costs.flops import counted_training_flops

    return counted_training_flops(config, 1, seq_len) / seq_len


def _flops_explanations(c: ModelConfig, seq_len: int, reference: float) -> dict[str, float]:
    h, v, layers = c.hidden_dim, c.vocab_size, c.num_layers
    attention = 12 * layers * seq_len * h
    norms = 6 * (2 * layers * h + h)
    known = {
        "the attention products are missing (q k^T and probs @ v: 2 x 2*S*hidden FLOPs per token and layer in the "
        "forward, x3 for a training step)": attention,
        "only half of the attention square is counted: V1 masks the upper triangle but still computes it": attention / 2,
        "the embedding is counted as a matmul: it is a table lookup, no multiply": -6 * v * h,
        "the norm weights are counted as matmul parameters: they are element-wise": -norms,
        "the embedding and the norms are counted as matmul parameters (6N with N = all parameters): only "
        "parameters that take part in a matrix multiply cost 6 FLOPs per token": -(6 * v * h + norms),
        "the output head is missing: lm_head (hidden x vocab) is a matmul of its own, 6 x vocab x hidden FLOPs per "
        "token in a training step": 6 * v * h,
        "the key and value projections are counted at full width: with grouped-query attention they map hidden to "
        "kv_heads * head_dim": -6 * layers * 2 * h * (h - c.kv_dim),
    }
    forward = ("your count is a forward pass only: a training step adds the backward, which does two matmuls "
               "(input gradient, weight gradient) for every forward matmul, so a step is 3x the forward")
    out = dict(known)
    out[forward] = reference * 2 / 3
    out["your count is twice the forward: the backward does two matmuls for every forward matmul (dx = dy W^T and "
        "dW = x^T dy), each as large as the forward's, so a step is 3x the forward, not 2x"] = reference / 3
    for text, amount in known.items():  # a forward-only count with one of the mistakes above
        out[f"{forward}; and {text}"] = reference - (reference - amount) / 3
    return out


def explain_flops_difference(formula: Callable[[ModelConfig, int], float],
                             cases: Sequence[tuple[Shape, int]] = FLOPS_CASES) -> str:
    """What a per-token training FLOP formula probably got wrong ("" when no single mistake explains it)."""
    differences = []
    for shape, seq in cases:
        config = shape_config(shape, max_seq_len=max(1024, seq))
        reference = counted_flops_per_token(config, seq)
        differences.append((reference - float(formula(config, seq)), _flops_explanations(config, seq, reference)))
    return _explain(differences)


def check_flops_formula(formula: Callable[[ModelConfig, int], float],
                        cases: Sequence[tuple[Shape, int]] = FLOPS_CASES) -> bool:
    """``formula(config, seq_len)`` (training FLOPs per token) against ``FlopCounterMode`` over V1."""
    try:
        explanation = explain_flops_difference(formula, cases)
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001
        explanation = ""
    checked = []
    for shape, seq in cases:
        config = shape_config(shape, max_seq_len=max(1024, seq))
        checked.append((f"{shape} at seq {seq}", lambda c=config, s=seq: formula(c, s),
                        lambda c=config, s=seq: counted_flops_per_token(c, s)))
    return _check_numbers("your training FLOPs per token", "FlopCounterMode's count over a V1 step", checked,
                          explanation, 1e-6)


BACKWARD_RATIO_WHY = ("Each forward matmul y = x W has two of the same size in the backward: dx = dy W^T "
                      "and dW = x^T dy.")

# (predicted ratio, what it means): the slips of exercise 10.3, recognised within 5%.
BACKWARD_RATIO_SLIPS: tuple[tuple[float, str], ...] = (
    (1.0, "you gave the backward one matmul per forward matmul; it needs the gradient of both operands of y = x W, "
          "the input's (to pass on) and the weight's (to train it)"),
    (3.0, "3 is a whole training step (forward + backward) over the forward; the question asks for the backward "
          "alone"),
    (0.5, "that is forward / backward, the ratio upside down"),
    (1 / 3, "that is forward / (forward + backward), the forward's share of the step's FLOPs, upside down"),
    (200.0, "a percentage (200%) where a ratio (a plain number) was asked for"),
)


def check_backward_ratio(predicted: float | None) -> bool:
    """Exercise 10.3: the predicted backward / forward FLOP ratio lies in 1.9..2.1; a ratio that is a typical
    slip (one matmul per forward matmul, the whole step, upside down, a percentage) is named."""
    name = "your predicted backward / forward FLOP ratio"
    try:
        value = float(predicted)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return checkpoint(False, "", f"{name} is {predicted!r}: write the ratio you expect as a number")
    hint = next((text for factor, text in BACKWARD_RATIO_SLIPS if math.isclose(value, factor, rel_tol=0.05)), "")
    return check_between(name, value, 1.9, 2.1, why=BACKWARD_RATIO_WHY, hint=f"Likely: {hint}." if hint else "")


# (shape, max_seq_len, [(batch, seq), ...]): short and long sequences, so that both the per-token and
# the per-pair (S^2) terms show; batches 1..4, so that linearity in the batch shows.
ActivationCase = tuple[Shape, int, tuple[tuple[int, int], ...]]
ACTIVATION_CASES: tuple[ActivationCase, ...] = (
    ((128, 64, 2, 4, 2, 160), 512, ((1, 32), (2, 32), (4, 32), (1, 128), (1, 256), (2, 384))),
    ((37, 48, 3, 6, 2, 100), 256, ((1, 24), (3, 24), (1, 96), (2, 200))),
)
# Synthetic shapes that make slips large which are small at the shapes above: one key/value head of a wide
# hidden size with a narrow feed-forward (K and V at kv width fall short by 12%), and a vocabulary far
# larger than the rest (the loss's log-softmax). Checked after the cases above, with the same tolerance.
SYNTHETIC_ACTIVATION_CASES: tuple[ActivationCase, ...] = (
    ((16, 96, 2, 12, 1, 32), 64, ((1, 16), (2, 16), (1, 48))),
    ((2000, 32, 1, 4, 2, 64), 64, ((1, 16), (2, 24), (1, 40))),
)


def reference_activation_bytes(c: ModelConfig, batch: int, seq: int) -> float:
    """The count exercise 10.5 asks for (fp32 bytes): per layer ten ``B x S x hidden`` tensors (K and V at
    full width), four ``B x S x intermediate`` and one ``B x heads x S x S``; after the layers three
    ``B x S x hidden`` and the loss's ``B x S x vocab``. What autograd saves besides (the boolean mask,
    RMSNorm's ``1/rms``) is within 2%."""
    h = c.hidden_dim
    return 4.0 * (c.num_layers * _per_layer(c, batch, seq) + 3 * batch * seq * h + batch * seq * c.vocab_size)


def _per_layer(c: ModelConfig, batch: int, seq: int) -> float:
    """Values one layer of V1 keeps for the backward."""
    h, i = c.hidden_dim, c.intermediate_dim
    return 10 * batch * seq * h + 4 * batch * seq * i + batch * c.num_heads * seq * seq


def _square(c: ModelConfig, batch: int, seq: int, heads: int) -> float:
    return 4.0 * c.num_layers * batch * heads * seq * seq


# (what the answer got wrong, the count with that mistake): the typical slips of exercise 10.5.
ActivationSlip = tuple[str, Callable[[ModelConfig, int, int], float]]
ACTIVATION_SLIPS: tuple[ActivationSlip, ...] = (
    ("the softmax output is missing: V1 keeps one B x heads x S x S tensor per layer for the backward (the S^2 "
     "term)", lambda c, b, s: reference_activation_bytes(c, b, s) - _square(c, b, s, c.num_heads)),
    ("the S^2 term counts one S x S matrix per key/value head; V1 keeps one per query head (K and V are copied to "
     "every query head before q k^T)",
     lambda c, b, s: reference_activation_bytes(c, b, s) - _square(c, b, s, c.num_heads - c.num_kv_heads)),
    ("the S^2 term has no batch factor: every sequence of the batch has its own attention matrices",
     lambda c, b, s: reference_activation_bytes(c, b, s) - _square(c, b - 1, s, c.num_heads)),
    ("K and V are counted at kv_heads * head_dim; V1 copies them to every query head before q k^T, and the "
     "backward keeps those full-width copies",
     lambda c, b, s: reference_activation_bytes(c, b, s) - 4.0 * c.num_layers * b * s * 2 * (c.hidden_dim - c.kv_dim)),
    ("the SwiGLU tensors of width intermediate are missing (four of B x S x intermediate per layer: the gate and "
     "up outputs, silu(gate) and the product that enters down_proj)",
     lambda c, b, s: reference_activation_bytes(c, b, s) - 16.0 * c.num_layers * b * s * c.intermediate_dim),
    ("the loss's log-softmax is missing: the cross-entropy keeps a B x S x vocab tensor for its backward",
     lambda c, b, s: reference_activation_bytes(c, b, s) - 4.0 * b * s * c.vocab_size),
    ("the per-layer tensors are counted for one layer: every layer keeps its own (x num_layers)",
     lambda c, b, s: reference_activation_bytes(c, b, s) - 4.0 * (c.num_layers - 1) * _per_layer(c, b, s)),
    ("your count is half: an fp32 value takes 4 bytes (yours counts 2, as for bf16)",
     lambda c, b, s: reference_activation_bytes(c, b, s) / 2),
    ("your count is a quarter: that is a number of values; an fp32 value takes 4 bytes",
     lambda c, b, s: reference_activation_bytes(c, b, s) / 4),
)


def explain_activation_difference(formula: Callable[[ModelConfig, int, int], float],
                                  cases: Sequence[tuple[Shape, int, Sequence[tuple[int, int]]]] = (
                                      ACTIVATION_CASES + SYNTHETIC_ACTIVATION_CASES),
                                  rel_tol: float = 0.02) -> str:
    """The slip of :data:`ACTIVATION_SLIPS` that ``formula`` equals within ``rel_tol`` of the reference at
    every point of ``cases`` ("" when none does)."""
    points = [(shape_config(shape, max_seq), b, s) for shape, max_seq, pts in cases for b, s in pts]
    answers = [float(formula(c, b, s)) for c, b, s in points]
    for text, slip in ACTIVATION_SLIPS:
        wrong = [slip(c, b, s) for c, b, s in points]
        references = [reference_activation_bytes(c, b, s) for c, b, s in points]
        if all(abs(w - r) <= rel_tol * r for w, r in zip(wrong, references)):
            continue  # this slip changes nothing on these cases
        if all(abs(a - w) <= rel_tol * r for a, w, r in zip(answers, wrong, references)):
            return text
    return ""


@functools.lru_cache(maxsize=64)
def measured_activation_bytes(config: ModelConfig, batch: int, seq: int) -> int:
    """Bytes V1 (fp32, CPU) saves for the backward at this batch and sequence length."""
    from tinyllama.harness.bench import make_batches
    from tinyllama.models import build, lm_loss

    model = build("v1", config)
    inputs, targets = make_batches(config, batch, seq, count=1)[0]
    return anatomy.saved_activations(model, lambda: lm_loss(model(inputs), targets)).bytes


def check_activation_formula(formula: Callable[[ModelConfig, int, int], float],
                             cases: Sequence[tuple[Shape, int, Sequence[tuple[int, int]]]] = ACTIVATION_CASES,
                             rel_tol: float = 0.10,
                             synthetic: Sequence[tuple[Shape, int, Sequence[tuple[int, int]]]] = (
                                 SYNTHETIC_ACTIVATION_CASES)) -> bool:
    """``formula(config, batch, seq)`` (bytes saved for the backward, fp32) within ``rel_tol`` of what
    autograd saves, at every point of ``cases`` and of ``synthetic`` (shapes on which typical slips show);
    the feedback compares the per-token and per-pair coefficients and names the slip the formula equals
    (:data:`ACTIVATION_SLIPS`)."""
    problems: list[str] = []
    fits: list[str] = []
    for shape, max_seq, points in (*cases, *synthetic):
        config = shape_config(shape, max_seq)
        measured, predicted, before = [], [], len(problems)
        for batch, seq in points:
            actual = measured_activation_bytes(config, batch, seq)
            try:
                guess = float(formula(config, batch, seq))
            except NotImplementedError:
                raise
            except Exception as error:  # noqa: BLE001
                return checkpoint(False, "", f"your activation formula failed for {shape} at batch {batch}, seq "
                                             f"{seq}: {type(error).__name__}: {error}")
            measured.append((batch, seq, actual))
            predicted.append((batch, seq, guess))
            if not math.isfinite(guess) or abs(guess - actual) > rel_tol * actual:
                problems.append(f"{shape}, batch {batch}, seq {seq}: predicted {guess / 2**20:.3f} MiB, autograd "
                                f"saved {actual / 2**20:.3f} MiB ({guess / actual if actual else math.inf:.2f}x)")
        if len(problems) > before:  # this shape's coefficients, where it is off
            a_m, b_m, _ = anatomy.fit_batch_seq(measured)
            a_p, b_p, _ = anatomy.fit_batch_seq(predicted)
            fits.append(f"for {shape}: bytes per token (linear in S) predicted {a_p:,.0f}, measured {a_m:,.0f}; "
                        f"bytes per (token, token) pair (the S^2 term) predicted {b_p:,.1f}, measured {b_m:,.1f}")
    if not problems:
        total = sum(len(points) for _, _, points in cases)
        return checkpoint(True, f"your activation formula is within {rel_tol:.0%} of what autograd saves at all "
                                f"{total} (batch, seq) points of {len(cases)} model shapes", "")
    try:
        slip = explain_activation_difference(formula, (*cases, *synthetic))
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001 - the message above already says where the formula failed
        slip = ""
    advice = (f"\n  Likely: {slip}." if slip else
              "\n  A per-token term off: count the (B, S, hidden) and (B, S, intermediate) tensors the backward "
              "needs again; an S^2 term off: V1 keeps the softmax output of every head (K/V copied to all heads).")
    message = (f"your activation formula is off by more than {rel_tol:.0%} at {len(problems)} point(s):\n  - "
               + "\n  - ".join(problems[:6]) + "\n  The fitted coefficients:\n  - " + "\n  - ".join(fits) + advice)
    return checkpoint(False, "", message)


def check_fits(fits: Callable[[int], bool], model: nn.Module, batch: int,
               device: torch.device | str | None = None) -> bool:
    """``fits(batch)`` runs a step and returns True; under a pretend out-of-memory in the middle of the
    step it returns False instead of raising, with no gradient left on any parameter and (on a GPU) the
    allocated memory back where it was; and it runs again afterwards."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    try:
        if fits(batch) is not True:
            return checkpoint(False, "", f"fits({batch}) did not return True for a batch that fits: it must run one "
                                         "training step and return True when the step ran")
        with anatomy.pretend_out_of_memory(2**62) as sizing:  # how much one step produces
            fits(batch)
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001
        return checkpoint(False, "", f"fits({batch}) raised {type(error).__name__}: {error}")
    dev.synchronize(device)
    before = dev.memory_stats(device).current_bytes
    try:
        with anatomy.pretend_out_of_memory(int(sizing.allocated * 0.6)) as pretend:
            answer = fits(batch)
    except anatomy.OutOfMemoryError:
        return checkpoint(False, "", "fits() let the out-of-memory error escape: catch it (torch.OutOfMemoryError) "
                                     "and return False")
    if not pretend.raised:
        return checkpoint(False, "", "the pretend out-of-memory never struck: does fits() run a training step of the "
                                     "model it was given?")
    if answer is not False:
        return checkpoint(False, "", f"fits() returned {answer!r} after an out-of-memory error: it must return False")
    left = [name for name, p in model.named_parameters() if p.grad is not None]
    if left and all(not bool(p.grad.any()) for p in model.parameters() if p.grad is not None):
        return checkpoint(False, "", f"after the out-of-memory error {len(left)} parameter(s) hold a gradient of zeros "
                                     f"(e.g. {left[0]}): zeroing keeps the gradients' memory. Drop them instead "
                                     "(zero_grad(set_to_none=True)) before returning False")
    if left:
        return checkpoint(False, "", f"after the out-of-memory error {len(left)} parameter(s) still hold a gradient "
                                     f"(e.g. {left[0]}): the failed backward had already written them. Drop them, as "
                                     "the optimizer does after a step, before returning False")
    dev.free_memory(device)
    after = dev.memory_stats(device).current_bytes
    if before is not None and after is not None and after > before + 2**20:
        return checkpoint(False, "", f"after the out-of-memory error {(after - before) / 2**20:,.1f} MiB more are "
                                     "allocated than before the call: something of the failed step is still referenced")
    if fits(batch) is not True:
        return checkpoint(False, "", "after an out-of-memory error, fits() no longer runs a step that fits")

    return checkpoint(True, "fits() runs a step, returns False on an out-of-memory error in the middle of the backward "
                            f"and leaves no gradients behind", "")
