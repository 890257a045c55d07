"""The machinery behind every exercise check.

A check runs the learner's code on inputs it generates, compares with ``minimind_ref`` and either
prints one ``✓`` line or raises ``AssertionError`` with: which exercise, what was expected, what
was got, and a hint. Comparisons go type -> shape -> dtype -> values, so the first message is
the most useful one.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, Optional, Tuple

import torch

from ..utils import default_tolerance


class ExerciseError(AssertionError):
    """Raised by every check; an ``AssertionError`` so plain ``assert``-based tooling sees it."""


def seeded(seed: int) -> torch.Generator:
    """A CPU generator of its own, so a check never disturbs the notebook's random stream."""
    return torch.Generator().manual_seed(seed)


def fail(name: str, what: str, hint: Optional[str] = None) -> None:
    """Raise the check failure ``[name] what`` (plus the hint)."""
    msg = f"[{name}] {what}"
    if hint:
        msg += f"\n  hint: {hint}"
    raise ExerciseError(msg)


def check_close(
    got: Any,
    expected: torch.Tensor,
    name: str = "check",
    hint: Optional[str] = None,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
    check_dtype: bool = True,
) -> None:
    """Assert ``got`` equals ``expected`` within tolerance, with a learner-friendly message.

    Default tolerances come from ``minimind_ref.utils.default_tolerance`` for the expected
    tensor's device and dtype (fp32 on CPU: rtol = atol = 1e-5). Reports the max abs difference
    and the first mismatching index.
    """
    if not isinstance(got, torch.Tensor):
        fail(name, f"expected a torch.Tensor, got {type(got).__name__}: {got!r:.80}", hint)
    if tuple(got.shape) != tuple(expected.shape):
        fail(name, f"shape mismatch: expected {tuple(expected.shape)}, got {tuple(got.shape)}", hint)
    if check_dtype and got.dtype != expected.dtype:
        fail(name, f"dtype mismatch: expected {expected.dtype}, got {got.dtype}", hint)
    d_rtol, d_atol = default_tolerance(expected.device, expected.dtype)
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    g = got.detach().to(device=expected.device, dtype=torch.float64)
    e = expected.detach().to(torch.float64)
    nan_g, nan_e = torch.isnan(g), torch.isnan(e)
    inf_any = torch.isinf(g) | torch.isinf(e)
    finite = ~(nan_g | nan_e | inf_any)
    diff = torch.where(finite, (g - e).abs(), torch.zeros_like(g))
    bad = (nan_g != nan_e)  # NaN where none is expected, or a missing NaN
    bad |= inf_any & ~(nan_g | nan_e) & (g != e)  # infinities must match exactly (e.g. masked logits)
    bad |= finite & (diff > atol + rtol * e.abs())
    if bool(bad.any()):
        idx = tuple(int(i) for i in torch.nonzero(bad)[0])
        max_diff = float(diff[finite].max()) if bool(finite.any()) else float("nan")
        fail(
            name,
            f"values differ at {int(bad.sum())} of {bad.numel()} positions (rtol={rtol:g}, atol={atol:g}); "
            f"max abs diff {max_diff:.3g}; first at index {idx}: expected {float(e[idx]):.6g}, got {float(g[idx]):.6g}",
            hint,
        )


def check_equal(got: Any, expected: Any, name: str = "check", hint: Optional[str] = None) -> None:
    """Exact equality for non-tensor answers (counts, shapes, ints)."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape or not torch.equal(got.to(expected.device), expected):
            fail(name, f"expected {expected.tolist()!r:.200}, got {got.tolist() if isinstance(got, torch.Tensor) else got!r:.200}", hint)
        return
    if got != expected:
        fail(name, f"expected {expected!r}, got {got!r}", hint)


def expect_pair(got: Any, name: str, what: str) -> Tuple[Any, Any]:
    """Unpack a learner's ``(a, b)`` result, failing clearly when it is not a pair."""
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(name, f"expected a pair ({what}), got {type(got).__name__}: {got!r:.80}", "end with `return a, b`.")
    return got[0], got[1]


@contextlib.contextmanager
def exercise(name: str) -> Iterator[None]:
    """Turn a ``NotImplementedError`` (the student-edition stub) into a clear failing check."""
    try:
        yield
    except NotImplementedError as err:
        raise ExerciseError(f"[{name}] not implemented yet: {err}. Replace the stub with your code and run the cell again.") from None


def call(fn: Callable[..., Any], *args: Any, name: str = "check", **kwargs: Any) -> Any:
    """Call the learner's function; stubs and crashes become check failures that say so."""
    with exercise(name):
        try:
            return fn(*args, **kwargs)
        except NotImplementedError:
            raise
        except ExerciseError:
            raise
        except Exception as err:  # the learner's code raised: report it as part of the check
            raise ExerciseError(f"[{name}] your function raised {type(err).__name__}: {err}") from err


def passed(name: str, detail: str = "") -> None:
    """Print the success line."""
    print(f"✓ {name} passed" + (f": {detail}" if detail else ""))


def check(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator for a check function: converts stubs into failures and prints ``✓`` on success
    (the decorated function should return an optional detail string)."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> None:
            with exercise(name):
                detail = fn(*args, **kwargs)
            passed(name, detail or "")

        return inner

    return wrap
