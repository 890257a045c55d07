"""Exercise checks. ``core`` holds the machinery; ``chNN`` the checks of chapter NN.

Usage in a notebook::

    from minimind_ref.checks import ch01
    ch01.check_rms_norm(rms_norm)

Each ``check_*`` runs the learner's function on inputs it makes itself (with its own random
generator, so the notebook's random stream is untouched), compares the result with PyTorch or
``minimind_ref`` and prints one ``✓`` line, or raises ``AssertionError`` saying on which input it
failed, which known mistake the result matches when it recognises one (computed on the same input),
what was expected or which way the result is off, a hint about the bug, and last the line that
says how to see a worked solution. The chapters' modules say only what their checks compare with.

A failing check names the mistake it saw and gives a hint; for a worked solution, ask::

    minimind_ref.checks.show_solution("1.1")
"""

from .core import (ExerciseError, Outcome, as_number, call, check, check_close, check_equal, check_numbers, diagnose,
                   exercise, expect_pair, expected_values, fail, passed, seeded, show_solution, solution)

__all__ = [
    "ExerciseError", "Outcome", "as_number", "call", "check", "check_close", "check_equal", "check_numbers", "diagnose",
    "exercise", "expect_pair", "expected_values", "fail", "passed", "seeded", "show_solution", "solution",
]
