"""Notebook 13 (Triton basics): the cost helpers it uses, and that each exercise's check catches a
plausible wrong answer; every exercise of the solution notebook can be revealed and runs. The backward
exercises (13.6 the gradient formula, 13.7 the autograd Function): the reference passes, each typical
mistake fails with its own message, gradcheck runs, and the trained-parameters lesson holds."""

import pytest
import torch
import triton
import triton.language as tl
from notebook_exercises import SolutionExercises, run_source

from tinyllama import course
from tinyllama import kernels as library
from tinyllama.costs import kernel_costs
from tinyllama.course import backward_checks, guards, triton_basics_checks
from tinyllama.course.checkpoints import CheckpointFailed
from tinyllama.course.exercise_stop import check_cells, match_exercise
from tinyllama.course.results import checkout_root
from tinyllama.course.reveal import reveal
from tinyllama.kernels import rmsnorm_reference

pytestmark = pytest.mark.usefixtures("lenient")

SHAPES = [(3, 5), (7, 100), (33, 257)]


# ---- the library helpers --------------------------------------------------------------------------

def test_rmsnorm_bytes_reads_x_and_weight_and_writes_y():
    assert kernel_costs.rmsnorm_forward_bytes(8192, 1024, 2) == 2 * 8192 * 1024 * 2 + 1024 * 2
    assert kernel_costs.rmsnorm_forward_bytes(7, 100, 2, weight_itemsize=4) == 2 * 700 * 2 + 400
    with pytest.raises(ValueError):
        kernel_costs.rmsnorm_forward_bytes(-1, 100, 2)


def test_bandwidth_and_launch_bound_units():
    assert kernel_costs.achieved_tbs(3e12, 1000.0) == pytest.approx(3.0)
    assert kernel_costs.launch_bound_bytes(20.0, 3.0) == pytest.approx(60e6)
    with pytest.raises(ValueError, match="synchronize"):
        kernel_costs.achieved_tbs(1e6, 0.0)


def test_host_time_per_call_and_device_time_on_the_cpu():
    x = torch.randn(64)
    # 15 repeats: medians that a loaded machine's occasional stall (a few of the samples) cannot move
    cost = kernel_costs.host_us_per_call(lambda: x.sum(), "cpu", calls=20, repeat=15, warmup=1)
    assert cost.calls == 20 and cost.host_us.n == 15 and 0 < cost.host_us.median <= cost.wall_us.median
    assert cost.host_bound  # on the CPU the host does the work: nothing runs after the loop
    assert kernel_costs.device_ms(lambda: x.sum(), "cpu", warmup=1, repeat=3).n == 3
    with pytest.raises(ValueError):
        kernel_costs.host_us_per_call(lambda: None, "cpu", calls=0)


def _rows(shape):  # as the notebook's check makes them: views whose rows lie width + 3 apart
    rows, width = shape
    return torch.randn(rows, width + 3)[:, :width], 1 + 0.1 * torch.randn(width)


# ---- the solution notebook: every exercise can be revealed ---------------------------------------------

def test_every_exercise_reveals_and_its_kernels_run(capsys):
    namespace = {"torch": torch, "triton": triton, "tl": tl}
    for exercise in ("13.1", "13.2", "13.3", "13.4", "13.6", "13.7"):
        assert reveal(exercise, namespace)
    assert reveal("13.5", run=False)  # needs the notebook's measurements to run
    x, y = torch.randn(1000), torch.randn(1000)
    assert torch.equal(namespace["add"](x, y), x + y)
    rows, weight = _rows((5, 100))
    assert torch.allclose(namespace["my_rmsnorm"](rows, weight), rmsnorm_reference(rows, weight), atol=1e-5)
    gate_up = torch.randn(3, 2 * 37)
    assert torch.allclose(namespace["my_swiglu"](gate_up[:, :37], gate_up[:, 37:]),
                          torch.nn.functional.silu(gate_up[:, :37]) * gate_up[:, 37:], atol=1e-5)
    assert namespace["rmsnorm_bytes"](7, 100, 4) == kernel_costs.rmsnorm_forward_bytes(7, 100, 4)
    x = rows.clone().requires_grad_()
    namespace["MyRMSNorm"].apply(x, weight, 1e-5).sum().backward()
    assert torch.allclose(x.grad, namespace["rmsnorm_backward"](torch.ones_like(rows), rows, weight, 1e-5)[0])


# ---- exercises 13.6 and 13.7: RMSNorm's backward, as a formula and as an autograd Function ---------------------

class _CI:
    triton_check_shapes = ((3, 5), (7, 100), (33, 257))


@pytest.fixture(scope="module")
def solution():
    return SolutionExercises("13_triton_basics")


def _namespace(solution):
    """The names the backward exercises use, with the notebook's forward kernel (13.2) defined."""
    namespace = {"torch": torch, "triton": triton, "tl": tl, "course": course, "backward_checks": backward_checks,
                 "library": library, "device": torch.device("cpu"), "DTYPES": {"fp32": torch.float32},
                 "profile": _CI}
    solution.run("13.2", namespace, check=False)
    return namespace


def test_the_backward_reference_answers_pass(solution, capsys):
    namespace = _namespace(solution)
    solution.run("13.6", namespace)
    solution.run("13.7", namespace)
    shown = capsys.readouterr().out
    assert "CHECK:" not in shown
    assert "PASS: rmsnorm_backward agrees with PyTorch's autograd" in shown and "gradcheck on 3 x 37" in shown
    assert "PASS: a small model whose norms use MyRMSNorm: 5 of 5 parameters trained" in shown
    assert "PASS: MyRMSNorm: y, dx and dweight agree with tinyllama's RMSNorm" in shown


FORMULA_SLIPS = [  # (the solution's line, the slip, what the check must say)
    ("dweight = (dy * xhat).reshape(-1, x.shape[-1]).sum(dim=0)", "dweight = dy * xhat",
     "dweight has shape (3, 37) where the weight has (37,)"),  # not summed over the rows
    ("dweight = (dy * xhat).reshape(-1, x.shape[-1]).sum(dim=0)", "dweight = (dy * xhat).sum(dim=0)",
     "dweight has shape (5, 19) where the weight has (19,)"),  # summed over the batch only, not the sequence
    ("dx = rstd * (g - xhat * (g * xhat).mean(dim=-1, keepdim=True))", "dx = rstd * g",
     "dx lacks the mean term"),
    ("return dx, dweight", "return dx, None", "dweight is None"),
    ("mean(dim=-1, keepdim=True) + eps)", "mean(dim=-1, keepdim=True) + 1e-6)",
     "yours equals the gradient with an eps of 1e-5 or less"),  # a hard-coded eps
    ("torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)", "torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True)) + eps",
     "yours adds eps after the root"),
    ("(g * xhat).mean(dim=-1, keepdim=True)", "(g * xhat).sum(dim=-1, keepdim=True)",
     "sums g * xhat over the row where it should average it"),
    ("g = dy * weight", "g = dy", "dx ignores the weight"),
    ("dweight = (dy * xhat)", "dweight = (dy * x)", "dweight sums dy * x:"),
]


@pytest.mark.parametrize("old, new, message", FORMULA_SLIPS, ids=[slip[1] for slip in FORMULA_SLIPS])
def test_each_formula_slip_fails_with_its_own_message(solution, capsys, old, new, message):
    namespace = _namespace(solution)
    solution.run("13.6", namespace, (old, new))
    shown = capsys.readouterr().out
    assert "CHECK: rmsnorm_backward is wrong" in shown and "PASS" not in shown
    assert message in shown
    others = [text for _, _, text in FORMULA_SLIPS if text != message and text in shown]
    assert not others, f"the feedback names other mistakes too: {others}"


FUNCTION_SLIPS = [
    ("return dx.to(x.dtype), dweight.to(weight.dtype), None", "return dx.to(x.dtype), None, None",
     "only 3 of 5 parameters receive a gradient (missing: norm1.weight, norm2.weight)",
     "your backward returns None (or zeros) for the weight"),
    ("ctx.save_for_backward(x, weight)", "ctx.save_for_backward(my_rmsnorm(x, weight, eps), weight)",
     "MyRMSNorm differs from tinyllama's RMSNorm", "computed the gradients from the output y, not the input x"),
    ("rmsnorm_backward(dy, x, weight, ctx.eps)", "rmsnorm_backward(dy, x, weight, 1e-5)",
     "x of shape (4, 11) (eps not negligible", "where the forward got 0.1: keep the forward's eps on ctx"),
    ("return dx.to(x.dtype), dweight.to(weight.dtype), None", "return None, dweight.to(weight.dtype), None",
     "only 2 of 5 parameters receive a gradient", "Nothing before a norm learns"),
    ("return dx.to(x.dtype), dweight.to(weight.dtype), None", "return dx.to(x.dtype), dweight.to(weight.dtype)",
     "returned an incorrect number of gradients (expected 3, got 2)", "(dx, dweight, None for eps)"),
]


@pytest.mark.parametrize("old, new, where, message", FUNCTION_SLIPS, ids=[slip[1] for slip in FUNCTION_SLIPS])
def test_each_function_slip_fails_with_its_own_message(solution, capsys, old, new, where, message):
    namespace = _namespace(solution)
    solution.run("13.6", namespace, check=False)
    solution.run("13.7", namespace, (old, new))
    shown = capsys.readouterr().out
    assert "CHECK:" in shown and "PASS: MyRMSNorm" not in shown
    assert where in shown and message in shown
    others = [text for _, _, _, text in FUNCTION_SLIPS if text != message and text in shown]
    assert not others, f"the feedback names other mistakes too: {others}"


def _formula_slip(name):
    return next(slip.grads for slip in backward_checks.FORMULA_SLIPS if slip.name == name)


def test_gradcheck_runs_in_float64_and_names_the_wrong_gradient(solution, capsys):
    namespace = _namespace(solution)
    solution.run("13.6", namespace, check=False)
    answer = namespace["rmsnorm_backward"]
    assert backward_checks.gradcheck_backward(answer) is None
    assert backward_checks.gradcheck_backward(backward_checks.reference_grads) is None
    assert backward_checks.gradcheck_backward(_formula_slip("no mean term")) == "dx"
    assert backward_checks.gradcheck_backward(_formula_slip("dweight from x")) == "dweight"
    # With no value comparisons at all, the check still fails a wrong formula: through gradcheck alone.
    assert not backward_checks.check_rmsnorm_backward(_formula_slip("no mean term"), cases=())
    assert "gradcheck (float64, x of shape (3, 37)): dx differs from the finite differences" in capsys.readouterr().out


def test_every_slip_differs_from_the_right_answer_on_the_checks_cases():
    """The cases separate each listed slip from the answer (else the check could not catch it)."""
    for slip in backward_checks.FORMULA_SLIPS + backward_checks.FUNCTION_SLIPS:
        caught = False
        for number, case in enumerate(backward_checks.FORMULA_CASES):
            x, weight, dy = backward_checks.make_inputs(case, seed=number)
            right = backward_checks.reference_grads(dy, x, weight, case.eps)
            wrong = slip.grads(dy, x, weight, case.eps)
            caught |= any(w.shape != r.shape or not torch.allclose(w, r, rtol=1e-3, atol=1e-3 * r.abs().max())
                          for w, r in zip(wrong, right))
        assert caught, slip.name


def test_a_kernel_without_a_function_trains_only_what_follows_the_last_norm(solution):
    namespace = _namespace(solution)
    solution.run("13.6", namespace, check=False)
    solution.run("13.7", namespace, check=False)
    bare = backward_checks.trained_parameters(namespace["my_rmsnorm"])
    assert bare.trained == ["head.weight"] and "only 1 of 5 parameters receive a gradient" in bare.verdict

    class WeightForgotten(namespace["MyRMSNorm"]):
        @staticmethod
        def backward(ctx, dy):
            return namespace["MyRMSNorm"].backward(ctx, dy)[0], None, None

    forgotten = backward_checks.trained_parameters(WeightForgotten.apply)
    assert forgotten.untrained == ["norm1.weight", "norm2.weight"] and forgotten.verdict
    yours = backward_checks.trained_parameters(namespace["MyRMSNorm"].apply)
    assert not yours.untrained and not yours.verdict and yours.summary == "5 of 5 parameters trained"


@pytest.mark.parametrize("exercise, call, names", [
    ("13.6", "check_rmsnorm_backward(rmsnorm_backward", ("rmsnorm_backward",)),
    ("13.7", "check_rmsnorm_function(MyRMSNorm", ("MyRMSNorm",)),
])
def test_a_failed_backward_check_stops_the_participants_notebook(solution, exercise, call, names):
    """The check cell is the exercise's (the first code cell after it), and its failing call uses the answer."""
    index = check_cells(checkout_root() / "solutions")
    source = solution.check_source(exercise)
    line = next(number for number, text in enumerate(source.splitlines(), 1) if call in text)
    assert match_exercise(source, line, index, "13_triton_basics") == (exercise, names)


def _with_pytorch_forward(function):
    """``function`` with tinyllama's PyTorch RMSNorm as its forward (saving what the solution saves): its
    backward in bf16 without the Triton interpreter."""

    class PyTorchForward(function):
        @staticmethod
        def forward(ctx, x, weight, eps):
            ctx.save_for_backward(x, weight)
            ctx.eps = eps
            return library.rmsnorm_reference(x, weight, eps)

    return PyTorchForward


def test_the_function_check_allows_bf16_rounding_and_still_names_a_slip(solution, capsys):
    namespace = _namespace(solution)
    solution.run("13.6", namespace, check=False)
    solution.run("13.7", namespace, check=False)
    right = _with_pytorch_forward(namespace["MyRMSNorm"])
    assert backward_checks.check_rmsnorm_function(right, library.rmsnorm_reference, "cpu", [torch.bfloat16],
                                                  _CI.triton_check_shapes + ((4099, 1000),), seed=5)
    solution.run("13.7", namespace, ("rmsnorm_backward(dy, x, weight, ctx.eps)",
                                     "rmsnorm_backward(dy, x, weight, 1e-5)"), check=False)
    wrong = _with_pytorch_forward(namespace["MyRMSNorm"])
    assert not backward_checks.check_rmsnorm_function(wrong, library.rmsnorm_reference, "cpu", [torch.bfloat16],
                                                      _CI.triton_check_shapes, seed=5)
    assert "bfloat16, x of shape (4, 11)" in capsys.readouterr().out


@pytest.mark.gpu
def test_the_solution_function_passes_in_bf16_and_fp32_on_the_gpu(solution):
    namespace = _namespace(solution)
    namespace["device"] = torch.device("cuda")
    solution.run("13.6", namespace, check=False)
    solution.run("13.7", namespace, check=False)
    assert backward_checks.check_rmsnorm_function(namespace["MyRMSNorm"], library.rmsnorm_reference, "cuda",
                                                  [torch.bfloat16, torch.float32], _CI.triton_check_shapes
                                                  + ((4099, 1000),))


# ---- a missing mask in the participant's kernel: named through the interpreter and on a GPU -------------------

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")


def _add_check(solution, replace=None):
    """Exercise 13.1's solution cell (with ``replace``) and its check cell (the next code cell), on DEVICE in fp32."""
    namespace = {"torch": torch, "triton": triton, "tl": tl, "course": course, "device": DEVICE,
                 "DTYPES": {"fp32": torch.float32}, "profile": _CI, "triton_basics_checks": triton_basics_checks}
    return solution.run("13.1", namespace, replace)


ADD_UNMASKED = {
    "x only": [("x = tl.load(X + offsets, mask=in_range)", "x = tl.load(X + offsets)")],
    "both loads": [("x = tl.load(X + offsets, mask=in_range)", "x = tl.load(X + offsets)"),
                   ("y = tl.load(Y + offsets, mask=in_range)", "y = tl.load(Y + offsets)")],
}


@pytest.mark.parametrize("loads", sorted(ADD_UNMASKED))
def test_an_unmasked_load_whose_lanes_the_store_drops_is_named(solution, monkeypatch, loads):
    # The masked store drops the lanes past n, so the result is right: through the interpreter the load is seen
    # as it happens, on a GPU in the compiled kernel's Triton IR. Either way the check fails and names the load.
    monkeypatch.setenv("WORKSHOP_STRICT", "1")
    namespace = {"torch": torch, "triton": triton, "tl": tl, "course": course, "device": DEVICE,
                 "DTYPES": {"fp32": torch.float32}, "profile": _CI, "triton_basics_checks": triton_basics_checks}
    with pytest.raises(CheckpointFailed, match=r"read.*past .*end.*is every tl\.load masked") as failed:
        solution.run("13.1", namespace, ADD_UNMASKED[loads])
    if ON_GPU:
        assert "`x = tl.load(X + offsets)` (line" in str(failed.value)


def test_the_reference_add_passes_its_check_on_this_device(solution, monkeypatch):
    monkeypatch.setenv("WORKSHOP_STRICT", "1")
    assert _add_check(solution)["verdicts"]["add_kernel"]


@pytest.mark.gpu
def test_on_the_gpu_the_compiled_kernels_ir_names_the_unmasked_load(solution):
    namespace = {"torch": torch, "triton": triton, "tl": tl}
    solution.run("13.1", namespace, ADD_UNMASKED["x only"][0], check=False)
    x, y = (torch.randn(700, device="cuda") for _ in range(2))
    g = guards.Guards(namespace["add"])
    gx, gy = g.inputs((x, y))
    with g:
        out = namespace["add"](gx, gy)
    torch.cuda.synchronize()
    assert torch.equal(out, x + y)  # right: the store dropped the lanes the load read past the end
    assert "add_kernel" in g.compiled
    found = g.findings((out,), (x + y,))
    assert len(found) == 1 and "`x = tl.load(X + offsets)`" in found[0] and guards.LOAD_HINT in found[0], found


TTIR_SAMPLE = '''#loc = loc("/cell.py":2:1)
module {
  tt.func public @add_kernel(%X: !tt.ptr<f32> loc("X"(#loc)), %OUT: !tt.ptr<f32> loc("OUT"(#loc))) {
    %x_5 = tt.load %x_4 : tensor<1024x!tt.ptr<f32>> loc(#loc18)
    %x_7 = tt.load %x_6, %x_4 : tensor<1024x!tt.ptr<f32>> loc(#loc19)
    %w = tt.load %x_6, %x_4, %cst evictionPolicy = evict_last : tensor<1024x!tt.ptr<f32>> loc(#loc19)
    %s = tt.load %Y : !tt.ptr<f32> loc(#loc20)
    %b = tt.load %bp {boundaryCheck = array<i32: 0>} : !tt.ptr<tensor<64xf32>> loc(#loc20)
    tt.store %1, %3 : tensor<1024x!tt.ptr<f32>> loc(#loc10)
    tt.store %1, %3, %x_4 : tensor<1024x!tt.ptr<f32>> loc(#loc10)
  } loc(#loc)
} loc(#loc)
#loc6 = loc("/cell.py":7:8)
#loc10 = loc("/cell.py":9:4)
#loc18 = loc("x"(#loc6))
#loc19 = loc("/cell.py":8:8)
#loc20 = loc("/cell.py":10:8)
'''


def test_the_ir_reader_finds_blocks_of_pointers_without_a_mask():
    found = guards.unmasked_accesses(TTIR_SAMPLE, "add_kernel")
    assert found == [guards.UnmaskedAccess("load", "add_kernel", "/cell.py", 7),
                     guards.UnmaskedAccess("store", "add_kernel", "/cell.py", 9)]  # scalar and block-pointer loads pass
    assert guards.unmasked_accesses("") == []


def test_the_ir_reader_reads_the_ir_this_triton_compiles():
    # Triton's NVIDIA back end lowers to its IR without a GPU: the reader must understand what it prints.
    try:
        from triton._C.libtriton import ir
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from triton.compiler.compiler import make_backend

        target = GPUTarget("cuda", 90, 32)
        backend = make_backend(target)
        options = backend.parse_options({})
    except Exception as error:  # noqa: BLE001 - another Triton's internals: the sample test above still runs
        pytest.skip(f"this Triton's compiler API differs: {error}")

    from triton.runtime.jit import JITFunction

    kernel = JITFunction(_add_maybe_masked)  # compiled, also where @triton.jit would pick the interpreter

    def ttir(masked):
        source = ASTSource(kernel, signature={"X": "*fp32", "OUT": "*fp32", "n": "i32", "BLOCK": "constexpr",
                                              "MASKED": "constexpr"},
                           constexprs={"BLOCK": 1024, "MASKED": masked})
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        module = source.make_ir(target, options, backend.get_codegen_implementation(options),
                                backend.get_module_map(), context)
        stages = {}
        backend.add_stages(stages, options, source.language)
        return str(stages["ttir"](module, {}))

    try:
        masked, unmasked = ttir(True), ttir(False)
    except Exception as error:  # noqa: BLE001
        pytest.skip(f"this Triton cannot lower to its IR here: {error}")
    assert guards.unmasked_accesses(masked, "k") == []
    found = guards.unmasked_accesses(unmasked, "k")
    assert [a.kind for a in found] == ["load"]
    assert found[0].source() == "x = tl.load(X + offsets)"


def _add_maybe_masked(X, OUT, n, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if MASKED:
        x = tl.load(X + offsets, mask=offsets < n)
    else:
        x = tl.load(X + offsets)
    tl.store(OUT + offsets, x + 1.0, mask=offsets < n)


# ---- exercises 13.1-13.5 through the notebook's own check cells: the reference passes, each slip its own message ----

def _forward_namespace():
    """What the notebook defines before the forward exercises, at the ci sizes, in fp32 on this CPU or GPU."""
    import pandas as pd

    return {"torch": torch, "triton": triton, "tl": tl, "course": course, "library": library, "pd": pd,
            "kernel_costs": kernel_costs, "triton_basics_checks": triton_basics_checks, "device": DEVICE,
            "DTYPES": {"fp32": torch.float32}, "TIMED": "fp32", "profile": _CI_FORWARD, "on_gpu": False,
            "ROWS": 64, "HIDDEN": 96, "copy_tbs": 3.0, "verdicts": {}}


class _CI_FORWARD(_CI):
    tinyllama_preset = "ci"


def _run_forward(solution, exercise, replacements=(), namespace=None):
    """The solution cell of ``exercise`` with every (old, new) of ``replacements`` applied, then its check cell
    (for 13.2 and 13.3 the cell that checks the kernel)."""
    namespace = _forward_namespace() if namespace is None else namespace
    return solution.run(exercise, namespace, list(replacements) or None)


def _slip_messages(slips):
    return triton_basics_checks.slips_by_name(slips)


def _only(shown, message, messages):
    assert message in shown, shown
    others = [text for text in messages.values() if text != message and text in shown]
    assert not others, f"the feedback names other mistakes too: {others}"


ADD_SLIPS = [  # (the solution's line, the slip, the slip's name; None: the guards' own sentence)
    ("offsets = pid * BLOCK + tl.arange(0, BLOCK)", "offsets = tl.arange(0, BLOCK)", "offsets without the block's start"),
    ("y = tl.load(Y + offsets", "y = tl.load(X + offsets", "x loaded twice"),
    ("tl.store(OUT + offsets, x + y,", "tl.store(OUT + offsets, x * y,", "x times y"),
    ("tl.store(OUT + offsets, x + y, mask=in_range)", "tl.store(OUT + offsets, x + y)", None),
]


@pytest.mark.parametrize("old, new, slip", ADD_SLIPS, ids=[s[1] for s in ADD_SLIPS])
def test_each_add_slip_fails_with_its_own_message(solution, capsys, old, new, slip):
    namespace = _run_forward(solution, "13.1", [(old, new)])
    shown = capsys.readouterr().out
    assert namespace["verdicts"]["add_kernel"] is False and "CHECK: add_kernel (fp32) differs" in shown
    messages = _slip_messages(triton_basics_checks.ADD_SLIPS)
    if slip is None:  # a store past the end: stopped by the guards, which name the store
        assert guards.STORE_HINT in shown
        assert not [text for text in messages.values() if text in shown]
    else:
        _only(shown, messages[slip], messages)


RMSNORM_SLIPS = [
    ("/ N + eps", "/ BLOCK_N + eps", "mean over BLOCK_N"),
    ("X + row * stride_x + cols", "X + row * N + cols", "rows N apart"),
    ("y = x * rstd * w", "y = x * rstd", "no weight"),
    ("tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)", "1.0 / (tl.sum(x * x, axis=0) / N + eps)", "no root"),
]


@pytest.mark.parametrize("old, new, slip", RMSNORM_SLIPS, ids=[s[2] for s in RMSNORM_SLIPS])
def test_each_rmsnorm_slip_fails_with_its_own_message(solution, capsys, old, new, slip):
    namespace = _run_forward(solution, "13.2", [(old, new)])
    shown = capsys.readouterr().out
    assert namespace["verdicts"]["rmsnorm_kernel"] is False and "CHECK: rmsnorm_kernel (fp32) differs" in shown
    _only(shown, _slip_messages(triton_basics_checks.RMSNORM_SLIPS)[slip],
          _slip_messages(triton_basics_checks.RMSNORM_SLIPS))


SWIGLU_SLIPS = [
    ([("out = g * tl.sigmoid(g) * u", "out = u * tl.sigmoid(u) * g")], "gate and up swapped"),
    ([("out = g * tl.sigmoid(g) * u", "out = tl.sigmoid(g) * u")], "sigmoid, not silu"),
    ([("G + row * stride_g", "G + row * stride_out"), ("U + row * stride_u", "U + row * stride_out")], "rows F apart"),
]


@pytest.mark.parametrize("replacements, slip", SWIGLU_SLIPS, ids=[s[1] for s in SWIGLU_SLIPS])
def test_each_swiglu_slip_fails_with_its_own_message(solution, capsys, replacements, slip):
    namespace = _forward_namespace()
    run_source(solution.check_source("13.2").split("verdicts[")[0], namespace)  # TOLERANCE, defined by 13.2's check
    namespace = _run_forward(solution, "13.3", replacements, namespace)
    shown = capsys.readouterr().out
    assert namespace["verdicts"]["swiglu_kernel"] is False and "CHECK: swiglu_kernel (fp32) differs" in shown
    _only(shown, _slip_messages(triton_basics_checks.SWIGLU_SLIPS)[slip],
          _slip_messages(triton_basics_checks.SWIGLU_SLIPS))


def test_the_forward_reference_answers_pass_with_the_output_the_notebook_stored(solution, capsys):
    namespace = _forward_namespace()
    for exercise in ("13.1", "13.2", "13.3", "13.4"):
        _run_forward(solution, exercise, namespace=namespace)
    namespace["launch"] = namespace["pd"].DataFrame({"implementation": ["yours"], "host us": [20.0],
                                                     "device us": [5.0], "MiB": [0.1]})
    _run_forward(solution, "13.5", namespace=namespace)
    shown = capsys.readouterr().out
    assert "CHECK" not in shown and all(namespace["verdicts"].values()) and namespace["bytes_ok"] and namespace["launch_ok"]
    # What the check cells print on success is what check_function and check_between printed before (stored outputs).
    assert "PASS: rmsnorm_kernel (fp32) agrees with the reference on fresh random inputs of shapes (3, 5)" in shown
    assert "PASS: rmsnorm_bytes(8192, 1024, 2) = 3.356e+07 bytes is plausible" in shown
    assert "PASS: launch_bound_mib = 57.22 MiB is plausible (between 56.65 and 57.79 MiB). bytes = launch time" in shown


BYTES_SLIPS = [
    ("return 2 * rows * width * itemsize + width * itemsize", "return rows * width * itemsize + width * itemsize",
     "write forgotten"),
    ("return 2 * rows * width * itemsize + width * itemsize", "return 2 * rows * width + width", "elements, not bytes"),
    ("return 2 * rows * width * itemsize + width * itemsize", "return 3 * rows * width * itemsize", "weight per row"),
    ("return 2 * rows * width * itemsize + width * itemsize", "return 2 * rows * width * itemsize", "weight forgotten"),
    ("return 2 * rows * width * itemsize + width * itemsize", "return 2 * (2 * rows * width * itemsize + width * itemsize)",
     "read and write each"),
]


@pytest.mark.parametrize("old, new, slip", BYTES_SLIPS, ids=[s[2] for s in BYTES_SLIPS])
def test_each_bytes_slip_fails_with_its_own_message(solution, capsys, old, new, slip):
    namespace = _run_forward(solution, "13.4", [(old, new)])
    shown = capsys.readouterr().out
    assert namespace["bytes_ok"] is False and "CHECK: rmsnorm_bytes(" in shown
    _only(shown, _slip_messages(triton_basics_checks.BYTES_SLIPS)[slip],
          _slip_messages(triton_basics_checks.BYTES_SLIPS))


LAUNCH_ANSWER = "launch_bound_mib = my_launch_us * 1e-6 * copy_tbs * 1e12 / 2**20"
LAUNCH_SLIPS = [
    ("launch_bound_mib = my_launch_us * copy_tbs * 1e12 / 2**20", "microseconds unconverted"),
    ("launch_bound_mib = my_launch_us * 1e-6 * copy_tbs / 2**20", "TB/s unconverted"),
    ("launch_bound_mib = my_launch_us * copy_tbs / 2**20", "both units unconverted"),
    ("launch_bound_mib = my_launch_us * 1e-6 * copy_tbs * 1e12 / 1e6", "MB, not MiB"),
    ("launch_bound_mib = my_launch_us * 1e-6 * copy_tbs * 1e12 / 2**30", "GiB, not MiB"),
]


@pytest.mark.parametrize("new, slip", LAUNCH_SLIPS, ids=[s[1] for s in LAUNCH_SLIPS])
def test_each_launch_bound_slip_fails_with_its_own_message(solution, capsys, new, slip):
    namespace = _forward_namespace()
    namespace["launch"] = namespace["pd"].DataFrame({"implementation": ["yours"], "host us": [20.0],
                                                     "device us": [5.0], "MiB": [0.1]})
    _run_forward(solution, "13.5", [(LAUNCH_ANSWER, new)], namespace=namespace)
    shown = capsys.readouterr().out
    assert namespace["launch_ok"] is False and "CHECK: launch_bound_mib = " in shown
    _only(shown, _slip_messages(triton_basics_checks.LAUNCH_SLIPS)[slip],
          _slip_messages(triton_basics_checks.LAUNCH_SLIPS))
