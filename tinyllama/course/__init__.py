"""The notebook infrastructure of the course: size profiles, the results tracker, shared-GPU
manners, checkpoints, and the tools that generate participant notebooks and run the solutions.

Writing a notebook (``solutions/NN_name.ipynb`` is the one source):

- first cell: markdown with the title and **Learning objectives**; then short background;
- first code cell: ``session = course.start("NN_name")`` -- it prints the profile (``gpu``/``ci``), the
  device the hub assigned and a busy-GPU warning; take every size from ``session.profile``;
- exercises: the solution between ``# BEGIN SOLUTION`` and ``# END SOLUTION`` with one or more
  ``# HINT: ...`` lines inside; ``python -m tinyllama.course.make_notebooks`` writes ``notebooks/``;
- checkpoints: ``course.check_close(...)``, ``course.check_between(...)``, ``course.checkpoint(...)``
  print PASS/CHECK and fail the notebook under ``WORKSHOP_STRICT=1`` (CI, instructor runs);
- mark cells whose output is a fact, the same on a GPU and a CPU (counts, correctness checks,
  configuration tables), with ``# NBVAL_CHECK_OUTPUT``; measured numbers go in other cells;
- end with a "Record your result" step, ``session.record({...})``, and ``session.finish(globals())``;
- store outputs from a clean run: ``python -m tinyllama.course.run_solutions --notebooks NN
  --update-solutions`` (the reference outputs come from a GPU run at the ``gpu`` profile).
"""

from tinyllama.course.checkpoints import (check_allclose, check_between, check_close, check_equal,
                                          check_faster, checkpoint)
from tinyllama.course.profile import PROFILES, Profile, get_profile, select_profile
from tinyllama.course.results import load_results, record, results_dir
from tinyllama.course.session import Session, start

__all__ = ["PROFILES", "Profile", "Session", "check_allclose", "check_between", "check_close", "check_equal",
           "check_faster", "checkpoint", "get_profile", "load_results", "record", "results_dir",
           "select_profile", "start"]
