"""A learner's function must not hand its exercise to the package function that answers it.

The chapters import ``minimind_ref`` to use it (``sft.render_chat`` prints the templates of chapter
09, ``grpo.group_advantages`` computes chapter 12's advantages), so the function an exercise rebuilds
is often one name away, and calling it would pass the check without any of the work. ``guarded``
wraps a learner's function so that the check sees, with ``sys.setprofile``, whether one of the
exercise's forbidden functions ran while it was called, and fails naming it. Only the functions that
would answer the exercise are forbidden (the reference, its helpers, the check's own ``*_reference``);
the building blocks the exercise is about (``torch``, ``F.cross_entropy``, a model built on the meta
device) stay free.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Mapping

from .core import fail

# The tests of the checks pass the reference itself, and mistakes built from it, as the learner's function;
# they switch the guard off (tests/test_checks_ch09.py ...) except where they test it.
ENFORCED = True


def guarded(fn: Callable[..., Any], name: str, forbidden: Mapping[str, Callable[..., Any]]) -> Callable[..., Any]:
    """``fn`` wrapped so that calling it fails the check ``name`` when one of ``forbidden`` (the name a
    learner knows a function by -> the function; a class stands for its ``__init__``) runs inside it."""
    codes = {}
    for label, target in forbidden.items():
        target = getattr(target, "__init__", target) if isinstance(target, type) else target
        code = getattr(getattr(target, "__wrapped__", target), "__code__", None)
        if code is not None:
            codes[code] = label

    def inner(*args: Any, **kwargs: Any) -> Any:
        if not ENFORCED:
            return fn(*args, **kwargs)
        seen = []

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "call" and frame.f_code in codes and not seen:
                seen.append(codes[frame.f_code])

        previous = sys.getprofile()
        sys.setprofile(profile)
        try:
            result = fn(*args, **kwargs)
        finally:
            sys.setprofile(previous)
        if seen:
            fail(name, f"your function calls {seen[0]}, the package's own answer to this exercise, so the check cannot "
                 "tell your work from it",
                 "write the part that function does with your own code; you may still call it outside your function "
                 "to compare results.")
        return result

    return inner
