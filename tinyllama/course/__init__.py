"""The notebook infrastructure of the course: size profiles, the results tracker, shared-GPU
manners, checkpoints, and the tools that generate participant notebooks and run the solutions.

A notebook begins with ``session = course.start("NN_name")`` and ends with
``session.record({...})`` and ``session.finish(globals())``.
"""

from tinyllama.course.checkpoints import (check_allclose, check_between, check_close, check_equal,
                                          check_faster, checkpoint)
from tinyllama.course.profile import PROFILES, Profile, get_profile, select_profile
from tinyllama.course.results import load_results, record, results_dir
from tinyllama.course.session import Session, start

__all__ = ["PROFILES", "Profile", "Session", "check_allclose", "check_between", "check_close", "check_equal",
           "check_faster", "checkpoint", "get_profile", "load_results", "record", "results_dir",
           "select_profile", "start"]
