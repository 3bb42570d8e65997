"""The notebook infrastructure of the course: size profiles, the results tracker, shared-GPU
manners, checkpoints, and the tools that generate participant notebooks and run the solutions.

Writing a notebook (``solutions/NN_name.ipynb`` is the one source):

- first cell: markdown with the title and **Learning objectives**; then short background;
- first code cell: ``session = course.start("NN_name")`` -- it prints the profile (``gpu``/``ci``), the
  device the hub assigned and a busy-GPU warning; take every size from ``session.profile``. The
  generator puts the import guard above it and names the course's kernel in the notebook's metadata
  (:mod:`tinyllama.course.jupyter_setup`): write neither by hand;
- exercises: the solution between ``# BEGIN SOLUTION NN.k`` and ``# END SOLUTION`` with one or more
  ``# HINT: ...`` lines inside that describe the goal, never the line (the generator refuses a hint
  that gives the answer away); ``python -m tinyllama.course.make_notebooks`` writes ``notebooks/``.
  Answers to questions go between ``<!-- BEGIN ANSWER -->`` and ``<!-- END ANSWER -->``. A stuck
  participant runs ``course.reveal("NN.k")``;
- after each exercise a check with specific feedback: ``course.check_function`` (a function or kernel
  against its reference on fresh random inputs, odd shapes included), ``course.check_between`` (a number
  in its expected range, with ``why``), ``course.check_ratio`` (two timed series), and
  ``course.compare_prediction`` (a prediction beside the measurement); ``course.checkpoint(...)``
  for anything else. Checks print PASS/CHECK and fail the notebook under ``WORKSHOP_STRICT=1``; in a
  participant's kernel a failed check of the exercise's answer stops the notebook there
  (:mod:`tinyllama.course.exercise_stop`: put the check in the first code cell after the exercise's, and
  let its check statement use the names the exercise defines);
- this device's roofs (matmul per precision, copy) as notebook 00 recorded them: ``course.device_ceilings``;
- mark cells whose output is a fact, the same on a GPU and a CPU (counts, correctness checks,
  configuration tables), with ``# NBVAL_CHECK_OUTPUT``; measured numbers go in other cells;
- end with a "Record your result" step, ``session.record({...})``, and ``session.finish(globals())``;
- store outputs from a clean run: ``python -m tinyllama.course.run_solutions --notebooks NN
  --update-solutions`` (the reference outputs come from a GPU run at the ``gpu`` profile); ``--stale``
  lists the solutions whose code changed after the run their outputs came from (:mod:`.stale`).
"""

from tinyllama.course.checkpoints import (check_allclose, check_between, check_close, check_equal,
                                          check_faster, checkpoint)
from tinyllama.course.device_ceilings import DeviceCeilings, device_ceilings
from tinyllama.course.exercise_stop import ExerciseCheckFailed, ExerciseNotAnswered, unanswered
from tinyllama.course.feedback import (Mismatch, check_function, check_ratio, compare_outputs, compare_prediction,
                                       ratio_with_spread)
from tinyllama.course.profile import PROFILES, Profile, get_profile, select_profile
from tinyllama.course.results import latest, load_results, record, results_dir
from tinyllama.course.reveal import reveal
from tinyllama.course.session import Session, start

from tinyllama import lazy_exports

# What notebooks import from this package beyond the names above, and the module that holds each: imported on
# first use (tinyllama.lazy_exports), so importing the package stays cheap and a module can move with one line here.
_LAZY: dict[str, str] = {
    "check_break_even": ".break_even_checks", "check_break_even_steps": ".break_even_checks",
    "check_backend_reader": ".compile_checks", "check_operator_fates": ".compile_checks",
    "describe_break_even": ".compile_checks", "format_duration": ".compile_checks",
    "check_serving_seconds": ".compile_mode_checks", "check_speedup_predictions": ".compile_mode_checks",
    "Case": ".diagnosis", "check_cases": ".diagnosis", "check_layout": ".diagnosis",
    "check_communication_formula": ".distributed_checks", "check_state_formula": ".distributed_checks",
    "check_torchrun_command": ".distributed_checks",
    "LAUNCH_BOUND_SHARE": ".fusion_checks", "check_fused_qkv": ".fusion_checks",
    "check_gemm_prediction": ".fusion_checks", "check_host_share": ".fusion_checks",
    "check_strided_timing": ".fusion_checks", "fusion_effects": ".fusion_checks", "fusion_label": ".fusion_checks",
    "fusion_runs": ".fusion_checks", "launch_verdict": ".fusion_checks",
    "setting_launch_verdict": ".fusion_checks", "JUDGED_ON_REPLAY": ".fusion_checks",
    "check_batch_prediction": ".precision_checks", "check_error_ratio": ".precision_checks",
    "check_unit_roundoff": ".precision_checks",
    "check_gemm_and_add": ".roofline_checks", "check_idle_shares": ".roofline_checks",
    "check_norm_and_attention": ".roofline_checks", "check_roof_position": ".roofline_checks",
    "check_zero_formula": ".zero_checks",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
__all__ = ["PROFILES", "DeviceCeilings", "ExerciseCheckFailed", "ExerciseNotAnswered", "Mismatch", "Profile", "Session", "check_allclose", "check_between", "check_close",
           "check_equal", "check_faster", "check_function", "check_ratio", "checkpoint", "compare_outputs",
           "compare_prediction", "device_ceilings", "get_profile", "latest", "load_results", "ratio_with_spread", "record",
           "results_dir", "reveal", "select_profile", "start", "unanswered",
]
