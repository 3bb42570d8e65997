"""A stuck participant gets the solution's answer of one exercise, and the notebook goes on."""

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from tinyllama import course
from tinyllama.course import make_notebooks as mk
from tinyllama.course.results import latest, record
from tinyllama.course.reveal import reveal

KERNEL_CELL = '''\
import math

def bytes_moved(rows, cols, element_size):
    """Bytes one RMSNorm forward reads and writes."""
    # BEGIN SOLUTION 13.2
    # HINT: the input is read once, the output written once, the weight read once
    # HINT: (multiply element counts by the element size)
    total = (2 * rows * cols + cols) * element_size
    return total
    # END SOLUTION

answer = bytes_moved(3, 5, 4)'''


@pytest.fixture
def solutions(tmp_path):
    nb = new_notebook(cells=[new_markdown_cell("# 13\n**Learning objectives**"), new_code_cell("x = 1"),
                             new_code_cell(KERNEL_CELL)])
    nbformat.write(nb, tmp_path / "13_triton_basics.ipynb")
    return tmp_path


def test_reveal_shows_the_answer_and_defines_its_names(solutions, capsys):
    namespace: dict = {}
    code = reveal("13.2", namespace, solutions=solutions)
    assert code.splitlines() == ["total = (2 * rows * cols + cols) * element_size", "return total"]
    assert namespace["answer"] == (2 * 3 * 5 + 5) * 4 == namespace["bytes_moved"](3, 5, 4)
    assert "Reference answer of exercise 13.2 (13_triton_basics.ipynb, cell 2)" in capsys.readouterr().out


def test_reveal_defaults_to_the_callers_globals(solutions):
    reveal("13.2", solutions=solutions)
    assert globals()["answer"] == 140


def test_reveal_names_what_exists_when_the_id_is_wrong(solutions):
    with pytest.raises(KeyError, match=r"no exercise 13\.7 \(its exercises: 13\.2\)"):
        reveal("13.7", {}, solutions=solutions)
    with pytest.raises(ValueError, match="form NN.k"):
        reveal("thirteen", {}, solutions=solutions)
    with pytest.raises(FileNotFoundError, match="no solution notebook for exercise 14.1"):
        reveal("14.1", {}, solutions=solutions)


def test_the_participant_cell_says_how_to_reveal():
    out = mk.strip_solutions(KERNEL_CELL)
    assert 'course.unanswered("13.2")' in out and "total =" not in out
    with pytest.raises(NotImplementedError, match=r'Exercise 13\.2 .* course\.reveal\("13\.2"\)'):
        exec(out, {"course": course})


def test_a_hint_that_spells_the_answer_is_refused():
    leaky = KERNEL_CELL.replace("# HINT: (multiply element counts by the element size)",
                                "# HINT: total = (2 * rows * cols + cols) * element_size")
    with pytest.raises(mk.MarkerError, match="exercise 13.2 .* gives its answer away"):
        mk.strip_solutions(leaky, where="13_x, cell 2")


def test_a_solution_line_left_outside_the_block_is_refused_unless_it_is_the_cells_own_line():
    leaky = KERNEL_CELL.replace("answer = bytes_moved(3, 5, 4)",
                                "# total = (2 * rows * cols + cols) * element_size")
    with pytest.raises(mk.MarkerError, match="gives its answer away"):
        mk.strip_solutions(leaky)
    shared = "# BEGIN SOLUTION 10.1\n# HINT: count the tokens\ntokens = batch * seq_len\n# END SOLUTION\n" \
             "print(tokens)"
    assert mk.strip_solutions(shared).endswith("print(tokens)")  # short or shared lines are no give-away


def test_skeleton_lines_replace_the_raise():
    source = ("def kernel(x):\n    # BEGIN SOLUTION 13.1\n    # HINT: load the block, masked\n"
              "    # PARTICIPANT: y = x  # replace with your code\n    y = tl.load(x_ptr + offsets, mask=mask)\n"
              "    # END SOLUTION\n    return y")
    out = mk.strip_solutions(source)
    assert out == ("def kernel(x):\n    # TODO: load the block, masked\n    y = x  # replace with your code\n"
                   "    return y")


def test_answers_to_questions_are_removed():
    source = "**Q1.** Why is the backward twice the forward?\n<!-- BEGIN ANSWER -->\nTwo GEMMs per GEMM.\n<!-- END ANSWER -->"
    assert mk.strip_solutions(source, mk.MARKDOWN) == "**Q1.** Why is the backward twice the forward?"


def test_exercise_ids_are_unique_and_carry_the_notebook_number(tmp_path):
    nb = new_notebook(cells=[new_code_cell(KERNEL_CELL), new_code_cell(KERNEL_CELL)])
    with pytest.raises(mk.MarkerError, match="13.2 is already defined in cell 0"):
        mk.exercises(nb, "13_triton_basics.ipynb")
    with pytest.raises(mk.MarkerError, match="does not carry the notebook's number 14"):
        mk.exercises(new_notebook(cells=[new_code_cell(KERNEL_CELL)]), "14_flash_attention.ipynb")


def test_latest_reads_what_an_earlier_notebook_recorded(tmp_path):
    record("11_finding_bottlenecks", {"predicted_fusion_speedup": 1.3}, directory=tmp_path, quiet=True)
    record("11_finding_bottlenecks", {"predicted_fusion_speedup": 1.1}, directory=tmp_path, quiet=True)
    assert latest("predicted_fusion_speedup", "11_finding_bottlenecks", directory=tmp_path) == 1.1
    assert latest("missing", default="none", directory=tmp_path) == "none"
