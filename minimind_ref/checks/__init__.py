"""Exercise checks. ``core`` holds the machinery; ``chNN`` the checks of chapter NN.

Usage in a notebook::

    from minimind_ref.checks import ch01
    ch01.check_rms_norm(rms_norm)

A failing check names the mistake it saw and gives a hint; for a worked solution, ask::

    minimind_ref.checks.show_solution("1.1")
"""

from .core import (ExerciseError, Outcome, as_number, call, check, check_close, check_equal, check_numbers, diagnose,
                   exercise, expect_pair, expected_values, fail, passed, seeded, show_solution, solution)

__all__ = [
    "ExerciseError", "Outcome", "as_number", "call", "check", "check_close", "check_equal", "check_numbers", "diagnose",
    "exercise", "expect_pair", "expected_values", "fail", "passed", "seeded", "show_solution", "solution",
]
