"""Exercise checks. ``core`` holds the machinery; ``chNN`` the checks of chapter NN.

Usage in a notebook::

    from minimind_ref.checks import ch01
    ch01.check_rms_norm(rms_norm)
"""

from .core import (ExerciseError, call, check, check_close, check_equal, diagnose, exercise, expect_pair, fail, passed,
                   seeded)

__all__ = [
    "ExerciseError", "call", "check", "check_close", "check_equal", "diagnose", "exercise", "expect_pair", "fail", "passed", "seeded",
]
