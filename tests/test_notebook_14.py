"""Notebook 14's exercise checks catch plausible wrong answers: each check cell of the solution notebook is
run on the reference answer (it passes) and on an answer with one typical mistake (it fails, under
WORKSHOP_STRICT=1). The Triton exercise (14.4) runs through Triton's interpreter here, in fp32."""

import math

import pytest
import torch
import triton
import triton.language as tl

from notebook_exercises import SolutionExercises, run_source
from tinyllama import course
from tinyllama.course import attention_checks, attention_kernel_checks
from tinyllama.course.checkpoints import CheckpointFailed
from tinyllama.course.reveal import reveal
from tinyllama.course.results import checkout_root
from tinyllama.kernels import flash_attention_reference

pytestmark = pytest.mark.usefixtures("strict")

PATH = checkout_root() / "solutions" / "14_flash_attention.ipynb"


@pytest.fixture(scope="module")
def notebook():
    return SolutionExercises(PATH.stem)


def _run(notebook, exercise, replace=None, setup=""):
    """Run the solution cell of ``exercise`` (with ``replace`` = (old, new) applied) and its check cell."""
    namespace = {"torch": torch, "math": math, "course": course, "flash_attention_reference": flash_attention_reference,
                 "attention_checks": attention_checks}
    run_source(setup, namespace)
    notebook.run(exercise, namespace, replace)


def test_the_reference_answers_pass(notebook):
    assert set(notebook.found) == {"14.1", "14.2", "14.3", "14.4", "14.5"}
    for exercise in ("14.1", "14.2", "14.3"):
        _run(notebook, exercise)


@pytest.mark.parametrize("mistake", [
    ("S * S * 4", "S * 4"),  # bytes of one row, not of the matrix
    ("B * H * S * S * 2", "H * S * S * 2"),  # the batch forgotten
    ("intensity_naive = attention_flops / naive_bytes", "intensity_naive = attention_flops / fused_bytes"),  # no S^2 traffic
])
def test_score_bytes_and_intensity_mistakes_fail(notebook, mistake):
    with pytest.raises(CheckpointFailed):
        _run(notebook, "14.1", mistake)


def test_intensity_without_the_two_flops_per_multiply_add_passes_only_within_the_range(notebook):
    with pytest.raises(CheckpointFailed):  # intensity of written-out attention counted per byte of S, not S^2
        _run(notebook, "14.1", ("naive_bytes = 2 * (4 * B * H * S * D + 4 * B * H * S * S)",
                                 "naive_bytes = 2 * (4 * B * H * S * D + 4 * B * H * S)"))


SOFTMAX_SLIPS = [  # (the solution's line, the slip, the slip's name in attention_checks.SOFTMAX_SLIPS)
    ("l * torch.exp(m - m_new)", "l", "no_l_rescale"),  # the old sum not rescaled
    ("torch.exp(block - m_new[:, None])", "torch.exp(block)", "no_max"),  # no maximum subtracted: overflow
    ("m = m_new", "pass", "m_not_kept"),  # the running maximum never kept
]


def _only(message, named, messages):
    assert messages[named] in message, message
    others = [name for name, text in messages.items() if name != named and text in message]
    assert not others, f"the feedback names other mistakes too: {others}"


@pytest.mark.parametrize("old, new, slip", SOFTMAX_SLIPS, ids=[s[2] for s in SOFTMAX_SLIPS])
def test_each_online_softmax_slip_fails_with_its_own_message(notebook, old, new, slip):
    with pytest.raises(CheckpointFailed) as failed:
        _run(notebook, "14.2", (old, new))
    assert "online_softmax with tiles of 16 differs from the reference" in str(failed.value)
    _only(str(failed.value), slip, {s.name: s.message for s in attention_checks.SOFTMAX_SLIPS})


TILED_SLIPS = [
    ("kv = h // groups", "kv = h % k.shape[1]", "kv_interleaved"),  # grouped heads interleaved, not consecutive
    ("end = stop_m if causal else seq", "end = start_m + 1 if causal else seq", "loop_ends_early"),
    ("cols[None, None, :] > rows[None, :, None]", "cols[None, None, :] >= rows[None, :, None]", "diagonal_masked"),
    ("acc = acc * alpha[..., None] + p @ v_tile", "acc = acc + p @ v_tile", "no_acc_rescale"),
    ("l = l * alpha + p.sum(dim=-1)", "l = l + p.sum(dim=-1)", "no_l_rescale"),
    ("s = q_tile @ k_tile.transpose(-1, -2) * scale", "s = q_tile @ k_tile.transpose(-1, -2)", "no_scale"),
]


@pytest.mark.parametrize("old, new, slip", TILED_SLIPS, ids=[s[2] for s in TILED_SLIPS])
def test_each_tiled_attention_slip_fails_with_its_own_message(notebook, old, new, slip):
    with pytest.raises(CheckpointFailed) as failed:
        _run(notebook, "14.3", (old, new))
    _only(str(failed.value), slip, attention_checks.TILED_SLIPS)


def test_the_models_of_the_pytorch_exercises_are_right_without_a_slip():
    x = 30 * torch.randn(3, 37)
    assert torch.allclose(attention_checks.online_softmax_model(x, 7), torch.softmax(x, -1), atol=1e-6, rtol=1e-4)
    q, k, v = torch.randn(2, 4, 37, 16), torch.randn(2, 2, 37, 16), torch.randn(2, 2, 37, 16)
    for causal in (True, False):
        assert torch.allclose(attention_checks.tiled_attention_model(q, k, v, causal),
                              flash_attention_reference(q, k, v, causal), atol=1e-5, rtol=1e-4)


# ---- exercise 14.5: the prediction cell and the check after the measurement ----------------------------------

# A GPU-like shape (batch 3, 8 heads sharing 2 key/value heads of 64, bf16) where every slip shows with a factor of
# its own (the notebook's batch 2 and 8 / 4 heads give three slips one factor: the message then names each), "measured"
# bytes as the recorder finds them: the S^2 probabilities plus the fp32 copies of q, k, v (math path), and what the
# flash Function saves.
SHAPE = dict(batch=3, heads=8, kv_heads=2, head_dim=64, element=2, S_pred=1024)
MATH_MEASURED = (attention_checks.math_saved(3, 8, 2, 64, 2, 1024) + 4 * 3 * 1024 * 64 * (8 + 2 + 2))
FLASH_MEASURED = attention_checks.flash_saved(3, 8, 2, 64, 2, 1024)


def _memory_check(notebook, replace=None):
    import pandas as pd

    namespace = {"torch": torch, "math": math, "course": course, "attention_checks": attention_checks,
                 "profile": type("P", (), {"attention_predict_seq": SHAPE["S_pred"]}), **SHAPE}
    notebook.run("14.5", namespace, replace, check=False)
    namespace["memory"] = pd.DataFrame({"math path saved": [MATH_MEASURED], "flash (ours) saved": [FLASH_MEASURED]},
                                       index=[SHAPE["S_pred"]])
    namespace["on_gpu"] = False
    check = notebook.found["14.5"][0] + 2  # the measurement runs between the prediction and its check
    run_source(notebook.nb.cells[check].source, namespace)
    return namespace


def test_the_memory_prediction_passes_its_check(notebook, capsys):
    assert _memory_check(notebook)["saved_ok"]
    shown = capsys.readouterr().out
    assert "PASS: math path: measured / predicted saved bytes = " in shown and "CHECK" not in shown
    assert "PASS: flash: measured / predicted saved bytes = 1 is plausible" in shown


MATH_ANSWER = "predicted_math_saved = batch * heads * S_pred * S_pred * 4"
FLASH_ANSWER = "(2 * heads + 2 * kv_heads)"
MEMORY_SLIPS = [
    (MATH_ANSWER, "predicted_math_saved = batch * kv_heads * S_pred * S_pred * 4", attention_checks.MATH_SLIPS, "kv_heads"),
    (MATH_ANSWER, "predicted_math_saved = batch * heads * S_pred * S_pred * element", attention_checks.MATH_SLIPS,
     "input_bytes"),
    (MATH_ANSWER, "predicted_math_saved = batch * heads * S_pred * 4", attention_checks.MATH_SLIPS, "not_squared"),
    (MATH_ANSWER, "predicted_math_saved = heads * S_pred * S_pred * 4", attention_checks.MATH_SLIPS, "no_batch"),
    (MATH_ANSWER, "predicted_math_saved = batch * heads * S_pred * S_pred * 4 / 2**20", attention_checks.MATH_SLIPS,
     "mib"),
    (FLASH_ANSWER, "(4 * heads)", attention_checks.FLASH_SLIPS, "kv_as_heads"),
    (FLASH_ANSWER, "(heads + 2 * kv_heads)", attention_checks.FLASH_SLIPS, "no_out"),
    ("(element * batch * S_pred", "(4 * batch * S_pred", attention_checks.FLASH_SLIPS, "fp32_inputs"),
]


@pytest.mark.parametrize("old, new, slips, slip", MEMORY_SLIPS, ids=[f"{s[3]}-{i}" for i, s in enumerate(MEMORY_SLIPS)])
def test_each_memory_prediction_slip_fails_with_its_own_message(notebook, old, new, slips, slip):
    with pytest.raises(CheckpointFailed) as failed:
        _memory_check(notebook, (old, new))
    _only(str(failed.value), slip, {name: message for name, (_, message) in slips.items()})


def test_where_two_slips_give_one_number_the_message_names_both():
    # The notebook's gpu shape: batch 2 and kv_heads = heads / 2, so forgetting the batch and counting kv_heads agree.
    with pytest.raises(CheckpointFailed) as failed:
        attention_checks.check_saved_predictions(8 * 4096**2 * 4, 1.0e8, 2 * 8 * 4096**2 * 4, 1.0e8, 2, 8, 4, 128, 2,
                                                 4096)
    message = str(failed.value)
    assert "more than one typical mistake" in message
    assert attention_checks.MATH_SLIPS["no_batch"][1] in message and attention_checks.MATH_SLIPS["kv_heads"][1] in message


# ---- exercise 14.4: the inner loop of the notebook's own Triton forward, in the interpreter -----------------

# On a CPU the kernel runs through the interpreter in fp32; on a GPU (the same tests, run there) compiled, in bf16.
ON_GPU = torch.cuda.is_available()
DEVICE, DTYPE = (torch.device("cuda"), torch.bfloat16) if ON_GPU else (torch.device("cpu"), torch.float32)


def _kernel_namespace():
    # What the notebook defines before the exercise cell.
    return {"torch": torch, "math": math, "triton": triton, "tl": tl, "on_gpu": ON_GPU, "device": DEVICE,
            "dtype": DTYPE, "attention_kernel_checks": attention_kernel_checks}


def test_the_kernel_exercise_sits_in_its_loop_and_its_check_follows(notebook):
    source = notebook.source("14.4")
    assert "@triton.jit" in source and "for start_n in range(0, hi, BLOCK_N):" in source
    assert "mask=in_seq[:, None], other=0.0" in source  # the frame's key/value loads are masked
    assert "check_attention_kernel(my_attention" in notebook.check_source("14.4")


def test_the_reference_loop_passes_at_lengths_that_are_not_multiples_of_the_block(notebook):
    namespace = notebook.run("14.4", _kernel_namespace())
    assert namespace["own_kernel_ok"] is True
    assert 100 % namespace["BLOCK_M"] and 37 % namespace["BLOCK_N"]
    q, k, v = (torch.randn(1, n, 45, 32).to(DEVICE, DTYPE) for n in (4, 2, 2))  # grouped-query heads, a ragged block
    for causal in (True, False):
        assert torch.allclose(namespace["my_attention"](q, k, v, causal=causal).float(),
                              flash_attention_reference(q, k, v, causal=causal).float(),
                              **attention_kernel_checks.tolerance(DTYPE))


KERNEL_SLIPS = {
    "no_acc_rescale": ("acc = acc * alpha[:, None] + ", "acc = acc + "),
    "no_l_rescale": ("l_i = l_i * alpha + ", "l_i = l_i + "),
    "no_causal_mask": ("keep = keep & (offs_m[:, None] >= cols[None, :])", "keep = keep"),
    "strict_causal_mask": ("offs_m[:, None] >= cols[None, :]", "offs_m[:, None] > cols[None, :]"),
    "no_scale": ("tl.dot(q, tl.trans(k)) * sm_scale", "tl.dot(q, tl.trans(k))"),
    "no_end_mask": ("keep = in_seq[None, :]", "keep = offs_n[None, :] >= 0"),
    "masked_to_zero": ('tl.where(keep, qk, float("-inf"))', "tl.where(keep, qk, 0.0)"),
}


@pytest.mark.parametrize("slip", sorted(KERNEL_SLIPS))
def test_each_slip_in_the_loop_fails_with_its_own_message(notebook, slip):
    with pytest.raises(CheckpointFailed) as failed:
        notebook.run("14.4", _kernel_namespace(), KERNEL_SLIPS[slip])
    message = str(failed.value)
    assert f"[{slip}] {attention_kernel_checks.SLIPS[slip]}" in message
    others = set(attention_kernel_checks.SLIPS) - {slip} - ({"no_end_mask"} if slip == "masked_to_zero" else set())
    assert not [other for other in others if f"[{other}]" in message]  # the message names this mistake alone


def test_an_unwritten_loop_body_says_nothing_was_accumulated(notebook):
    source = notebook.source("14.4")
    begin, end = source.index("        # BEGIN SOLUTION 14.4"), source.index("        # END SOLUTION")
    namespace = _kernel_namespace()
    run_source(source[:begin] + "        pass\n" + source[source.index("\n", end) + 1:], namespace)
    with pytest.raises(CheckpointFailed, match="Every element is NaN: l_i is still 0"):
        run_source(notebook.check_source("14.4"), namespace)


UNMASKED_LOADS = {
    # k's lanes past the end give scores that tl.where drops: the result is right, only the load itself is wrong
    "k": ("k = tl.load(k_ptrs + cols[:, None] * stride_kn, mask=in_seq[:, None], other=0.0)",
          "k = tl.load(k_ptrs + cols[:, None] * stride_kn)"),
    # v's lanes past the end meet p = 0, and 0 x NaN (the guard) is NaN: the result shows it
    "v": ("v = tl.load(v_ptrs + cols[:, None] * stride_kn, mask=in_seq[:, None], other=0.0)",
          "v = tl.load(v_ptrs + cols[:, None] * stride_kn)"),
}


@pytest.mark.parametrize("tensor", sorted(UNMASKED_LOADS))
def test_an_unmasked_load_in_the_frame_is_named_not_a_crash(notebook, tensor):
    # Through the interpreter every load is checked as it happens; on a GPU the compiled kernel's Triton IR
    # is read (a tt.load of a block of pointers without a mask), so the same message comes on both.
    with pytest.raises(CheckpointFailed, match=r"read.*past .*end.*is every tl.load masked") as failed:
        notebook.run("14.4", _kernel_namespace(), UNMASKED_LOADS[tensor])
    if ON_GPU:
        # The source line as written, its trailing comment included.
        assert f"`{tensor} = tl.load({tensor}_ptrs + cols[:, None] * stride_kn)" in str(failed.value)
        assert "has no mask" in str(failed.value)


@pytest.mark.gpu
def test_on_the_gpu_an_unmasked_load_whose_result_is_right_is_still_named(notebook):
    namespace = notebook.run("14.4", _kernel_namespace(), UNMASKED_LOADS["k"], check=False)
    q, k, v = (torch.randn(1, n, 100, 32, device="cuda", dtype=torch.bfloat16) for n in (2, 1, 1))
    guards = attention_kernel_checks.Guards(namespace["my_attention"])
    gq, gk, gv = guards.inputs((q, k, v))
    with guards:
        out = namespace["my_attention"](gq, gk, gv, causal=False)
    torch.cuda.synchronize()
    # The result is right (the lanes past the end are dropped by tl.where), yet the load is named from the IR.
    assert torch.allclose(out.float(), flash_attention_reference(q, k, v, causal=False).float(), atol=2e-2, rtol=2e-2)
    assert guards.compiled, "no compiled kernel was recorded: JITFunction.run did not return one on this Triton"
    found = guards.findings()
    assert any("has no mask" in text and "is every tl.load masked" in text and "k_ptrs" in text for text in found), found


def test_the_model_of_the_loop_is_the_reference_without_slips_and_refuses_unknown_ones():
    q, k, v = (torch.randn(2, n, 53, 16) for n in (4, 2, 2))
    for causal in (True, False):
        assert torch.allclose(attention_kernel_checks.tiled_attention(q, k, v, causal, 32, 16),
                              flash_attention_reference(q, k, v, causal=causal), atol=1e-5, rtol=1e-4)
    # Where a slip cannot show, it changes nothing: keys past the end are masked by the causal mask anyway.
    assert torch.allclose(attention_kernel_checks.tiled_attention(q, k, v, True, 32, 16, ("no_end_mask",)),
                          flash_attention_reference(q, k, v, causal=True), atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="unknown slip"):
        attention_kernel_checks.tiled_attention(q, k, v, True, 32, 16, ("no_mask",))


@pytest.mark.skipif(ON_GPU, reason="@triton.jit compiles from the source file; reveal() runs the cell from a string")
def test_the_kernel_exercise_reveals_and_runs_in_the_interpreter(capsys):
    namespace = _kernel_namespace()
    assert "tl.dot(p.to(v.dtype), v)" in reveal("14.4", namespace)
    q, k, v = (torch.randn(1, n, 70, 32) for n in (2, 1, 1))
    assert torch.allclose(namespace["my_attention"](q, k, v), flash_attention_reference(q, k, v), atol=1e-5,
                          rtol=1e-4)
