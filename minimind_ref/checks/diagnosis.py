"""Which known mistake explains a learner's results on every case of an exercise, not only on the first wrong one.

A check that compares case by case and names the first mistake whose output matches the failing case can
misname: on one case several mistakes give the same output (a conversation whose first message is a user
message gets no default system prompt both from a template that never adds one and from one that looks at
every message). ``explaining`` runs the learner's function on every case first, then names the first
mistake whose outputs equal the learner's on **every** case (and differ from the reference's on the first
wrong one); only when none does, the one mistake, if there is exactly one, that matches the first wrong case.
``core.check_numbers`` does the same for numbers; this module serves the checks that compare strings, lists
and tensors.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

import torch


def same_value(a: Any, b: Any) -> bool:
    """Equality that never raises (strings, lists of ints, ...)."""
    try:
        return bool(a == b)
    except Exception:  # values that cannot be compared are not equal
        return False


def close_tensors(rtol: float, atol: float) -> Callable[[Any, Any], bool]:
    """A comparison for ``explaining``: two tensors of one shape, equal within ``rtol`` / ``atol`` (NaN = NaN)."""
    def same(a: Any, b: Any) -> bool:
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape:
            return False
        x, y = a.detach().cpu().double(), b.detach().cpu().double()  # CPU first: MPS has no float64
        return bool((torch.isclose(x, y, rtol=rtol, atol=atol) | (torch.isnan(x) & torch.isnan(y))).all())

    return same


def explaining(mistakes: Mapping[str, Callable[[Any], Any]], cases: Sequence[Any], got: Sequence[Any],
               expected: Sequence[Any], wrong: int, same: Callable[[Any, Any], bool] = same_value) -> Optional[str]:
    """The description of the mistake that explains the learner's results ``got`` on every one of ``cases``.

    ``mistakes`` maps a description to ``f(case)``, what that mistake outputs on a case; ``expected`` holds the
    reference's outputs and ``wrong`` is the index of the first case the learner got wrong. Where a mistake
    does not apply (its ``f`` returns None or raises), the learner's result must be the reference's."""
    def value(f: Callable[[Any], Any], case: Any) -> Any:
        try:
            return f(case)
        except Exception:  # a mistake that cannot be computed for this case matches nothing
            return None

    here = []
    for description, f in mistakes.items():
        outputs = [value(f, c) for c in cases]
        if outputs[wrong] is None or same(outputs[wrong], expected[wrong]):
            continue
        if all(same(g, e) if o is None else same(o, g) for o, g, e in zip(outputs, got, expected)):
            return description
        if same(outputs[wrong], got[wrong]):
            here.append(description)
    return here[0] if len(here) == 1 else None
