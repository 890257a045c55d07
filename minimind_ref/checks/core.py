"""The machinery behind every exercise check.

A check runs the learner's code on inputs it generates, compares with ``minimind_ref`` and either
prints one ``✓`` line or raises ``AssertionError`` with: which exercise, what was expected, what
was got, the known mistake that output matches (when one does), and a hint. Comparisons go type ->
shape -> dtype -> values, so the first message is the most useful one.

A failure never shows the answer. Each chapter's module registers one worked solution per exercise
(``solution("9.1", "...")``), and a failing check ends with one line saying how to ask for it::

    minimind_ref.checks.show_solution("9.1")

What a failure may show (CONTRIBUTING.md, "Checks"): what went wrong and where to look, never how to
write it. No code, no formula of the answer, and a value of the reference only where the learner
cannot read the answer back from it: each exercise declares which with ``expected_values("9.1",
shown=..., why=...)``; ``check_close``, ``check_equal`` and ``check_numbers`` then show the
reference's values, or only which way the learner's result is off.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import operator
import re
from typing import Any, Callable, Dict, Iterator, Mapping, NoReturn, Optional, Sequence, Tuple

import torch

from ..i18n import translate as _t
from ..utils import default_tolerance


class ExerciseError(AssertionError):
    """Raised by every check; an ``AssertionError`` so plain ``assert``-based tooling sees it."""


def seeded(seed: int) -> torch.Generator:
    """A CPU generator of its own, so a check never disturbs the notebook's random stream."""
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------------------------
# Worked solutions: registered by the chapters' modules, shown only on request
# --------------------------------------------------------------------------------------------

_SOLUTIONS: Dict[str, str] = {}
_NUMBER = re.compile(r"^(\d+)\.(\d+)$")
_NAMED = re.compile(r"\bExercise (\d+\.\d+)\b")


def solution(number: str, recipe: str) -> str:
    """Register the worked solution of Exercise ``number`` ("9.1"), which ``show_solution`` prints
    when a learner asks for it; a failing check only says how to ask. Returns ``recipe``."""
    if not isinstance(number, str) or not _NUMBER.match(number):
        raise ValueError(f"solution: the exercise number must be a string like '9.1', got {number!r}.")
    _SOLUTIONS[number] = recipe
    return recipe


# --------------------------------------------------------------------------------------------
# Which values of the reference a failure may show
# --------------------------------------------------------------------------------------------

_VALUES: Dict[str, Tuple[bool, str]] = {}


def expected_values(number: str, shown: bool, why: str) -> None:
    """Declare whether a failure of Exercise ``number`` may show the reference's values.

    ``shown=True`` where a value cannot be inverted into the answer (one entry of a function of random
    tensors whose entries the message does not show, a loss over random logits); ``shown=False`` where
    it can (a count or a bound that is a closed form of the inputs the case names: from a few such
    values a formula can be fitted). ``why`` says which, for the reader of the check and for the
    registry test (tests/test_checks_core.py). An exercise that declares nothing shows values."""
    if not isinstance(number, str) or not _NUMBER.match(number):
        raise ValueError(f"expected_values: the exercise number must be a string like '9.1', got {number!r}.")
    if not isinstance(why, str) or not why.strip():
        raise ValueError(f"expected_values: say why Exercise {number}'s values may or may not be shown (why=...).")
    _VALUES[number] = (bool(shown), why)


def shows_expected(name: str) -> bool:
    """Whether a failure of the check called ``name`` may show the reference's values."""
    number = exercise_number(name)
    return _VALUES.get(number, (True, ""))[0] if number else True


# What the reference expected at the last failure, for the test that guards the messages
# (tests/conftest.py): a failure of an exercise declared ``shown=False`` must not contain it.
_last_expected: list = []


def exercise_number(name: str) -> Optional[str]:
    """``"9.1"`` for a check name such as ``"Exercise 9.1 render_chat (gradient)"``, else None."""
    found = _NAMED.search(name) if isinstance(name, str) else None
    return found.group(1) if found else None


def _lookup(number: Any) -> Tuple[str, str]:
    """(number, recipe) for ``show_solution``'s argument, importing the chapter's checks if needed."""
    text = str(number).strip() if isinstance(number, (str, float)) else None
    found = _NUMBER.match(text) if text else None
    if not found:
        raise ValueError(f"show_solution: give the exercise number as a string, e.g. show_solution(\"9.1\"); "
                         f"got {number!r}.")
    text = f"{int(found.group(1))}.{int(found.group(2))}"
    if text not in _SOLUTIONS:
        try:
            importlib.import_module(f"{__package__}.ch{int(found.group(1)):02d}")
        except ModuleNotFoundError:
            pass
    if text not in _SOLUTIONS:
        chapter = sorted((n for n in _SOLUTIONS if n.split(".")[0] == found.group(1).lstrip("0")),
                         key=lambda n: int(n.split(".")[1]))
        known = ", ".join(chapter) if chapter else "none"
        raise ValueError(f"show_solution: no exercise {text} (this chapter's exercises: {known}).")
    return text, _SOLUTIONS[text]


def show_solution(number: Any) -> None:
    """Print the worked solution of Exercise ``number`` (``"9.1"``), in the learner's language.

    Try the failure's hint first: the solution is one way to write the exercise, in a line or two."""
    text, recipe = _lookup(number)
    print(_t(f"Exercise {text}, one way to write it:") + "\n    " + _t(recipe))


def _ask_line(name: str) -> Optional[str]:
    number = exercise_number(name)
    if number is None or number not in _SOLUTIONS:
        return None
    return _t(f"stuck? minimind_ref.checks.show_solution(\"{number}\") prints a solution")


def fail(name: str, what: str, hint: Optional[str] = None) -> NoReturn:
    """Raise the check failure ``[name] what``, then the hint about the mistake, then (last) the
    line that says how to see a worked solution (``show_solution``). Every part is shown in the
    learner's language (``minimind_ref.i18n``; English unless chosen otherwise)."""
    _fail(name, _t(what), hint)


def _fail(name: str, what: str, hint: Optional[str]) -> NoReturn:
    """``fail`` for a ``what`` already in the learner's language (this module builds some from parts)."""
    msg = f"[{_t(name)}] {what}"
    if hint:
        msg += "\n  " + _t(f"hint: {hint}")
    ask = _ask_line(name)
    if ask:
        msg += "\n  " + ask
    _last_expected.clear()
    raise ExerciseError(msg)


def _expect(*values: Any) -> None:
    """Record what the reference expected, just before a comparison fails (see ``_last_expected``)."""
    _last_expected[:] = list(values)


def _direction(got: float, expected: float) -> str:
    """Which way a learner's number is off, for a failure that does not show the reference's."""
    if got > expected:
        return _t("yours is larger than the reference's")
    return _t("yours is smaller than the reference's")


def _on(case: Optional[str]) -> str:
    return _t(f" (on {case})") if case else ""


def _fmt_index(idx: Tuple[int, ...]) -> str:
    return "" if not idx else _t(f" at index {idx}")


def _matches(got: torch.Tensor, candidate: Any, rtol: float, atol: float) -> bool:
    if callable(candidate):
        try:
            candidate = candidate()
        except Exception:  # a mistake that cannot even be computed for this input matches nothing
            return False
    if not isinstance(candidate, torch.Tensor) or tuple(candidate.shape) != tuple(got.shape):
        return False
    if candidate.dtype != got.dtype:  # the mistake computes another dtype: not what the learner did
        return False
    g = got.detach().cpu().to(torch.float64)  # compared on the CPU (MPS has no float64): moved first, then widened
    c = candidate.detach().cpu().to(torch.float64)
    both_nan = torch.isnan(g) & torch.isnan(c)
    close = torch.isclose(g, c, rtol=rtol, atol=atol) | both_nan
    return bool(close.all())


def diagnose(
    got: torch.Tensor,
    mistakes: Optional[Mapping[str, Any]],
    rtol: float,
    atol: float,
    expected: Optional[torch.Tensor] = None,
) -> Optional[str]:
    """The description of the first known mistake whose output ``got`` equals, or None.

    ``mistakes`` maps a description ("normalised without eps") to the tensor that mistake
    produces on the same input, or to a zero-argument function computing it (evaluated lazily).
    A mistake must produce ``got``'s dtype; with ``expected`` given, a mistake whose output is
    itself within tolerance of ``expected`` is skipped (on this input it cannot explain a failure)."""
    for description, candidate in (mistakes or {}).items():
        if callable(candidate):
            try:
                candidate = candidate()
            except Exception:  # a mistake that cannot even be computed for this input matches nothing
                continue
        if expected is not None and isinstance(candidate, torch.Tensor) and _matches(candidate, expected, rtol, atol):
            continue
        if _matches(got, candidate, rtol, atol):
            return description
    return None


def check_close(
    got: Any,
    expected: torch.Tensor,
    name: str = "check",
    hint: Optional[str] = None,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
    check_dtype: bool = True,
    mistakes: Optional[Mapping[str, Any]] = None,
    case: Optional[str] = None,
    nan: Optional[Tuple[str, str]] = None,
    mistake_hints: Optional[Mapping[str, str]] = None,
) -> None:
    """Assert ``got`` equals ``expected`` within tolerance, with a learner-friendly message.

    Order of the comparison: type, shape, dtype, NaN, infinities, then values. Default
    tolerances come from ``minimind_ref.utils.default_tolerance`` for the expected tensor's device
    and dtype (fp32 on CPU: rtol = atol = 1e-5). A mismatch names, when it can, the known mistake
    (``mistakes``: description -> what that mistake outputs) that produces exactly ``got``; then it
    reports the first mismatching index (with the reference's value there when the exercise shows
    values, ``expected_values``; otherwise which way the learner's value is off) and the hint; the
    last line says how to see a solution. ``case`` says which input failed ("batch 2, padded on the left").
    ``nan``: ``(message, hint)`` in the exercise's own words for a result of the right shape that holds
    NaN (an empty mask divided by its zero count, a group without spread), said before the dtype and
    the values are compared. ``mistake_hints``: mistake description -> the hint to give instead of
    ``hint`` when that mistake is the one named (a hint about that mistake, never its fix).
    """
    if not isinstance(got, torch.Tensor):
        fail(name, f"expected a torch.Tensor, got {type(got).__name__}: {got!r:.80}{_on(case)}", hint)
    d_rtol, d_atol = default_tolerance(expected.device, expected.dtype)
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    if tuple(got.shape) != tuple(expected.shape):
        seen = diagnose(got, mistakes, rtol, atol, expected)
        what = _t(f"shape mismatch: expected {tuple(expected.shape)}, got {tuple(got.shape)}{_on(case)}")
        _fail(name, (_t(f"this looks like {seen}: ") if seen else "") + what, _hint_for(seen, hint, mistake_hints))
    if nan is not None and bool(torch.isnan(got).any()):
        fail(name, *nan)
    if check_dtype and got.dtype != expected.dtype:
        fail(name, f"dtype mismatch: expected {expected.dtype}, got {got.dtype}{_on(case)}", hint)
    g = got.detach().cpu().to(torch.float64)  # compared on the CPU (MPS has no float64): moved first, then widened
    e = expected.detach().cpu().to(torch.float64)
    nan_g, nan_e = torch.isnan(g), torch.isnan(e)
    inf_g, inf_e = torch.isinf(g), torch.isinf(e)
    finite = ~(nan_g | nan_e | inf_g | inf_e)
    diff = torch.where(finite, (g - e).abs(), torch.zeros_like(g))
    bad_nan = nan_g != nan_e
    bad_inf = (inf_g | inf_e) & ~(nan_g | nan_e) & (g != e)
    bad_val = finite & (diff > atol + rtol * e.abs())
    if not bool((bad_nan | bad_inf | bad_val).any()):
        return
    seen = diagnose(got, mistakes, rtol, atol, expected)
    prefix = _t(f"this looks like {seen}. ") if seen else ""
    hint = _hint_for(seen, hint, mistake_hints)
    scalar = g.dim() == 0
    show = shows_expected(name)
    _expect(*(e.flatten()[:4096].tolist()))
    if bool(bad_nan.any()):
        idx = tuple(int(i) for i in torch.nonzero(bad_nan)[0]) if not scalar else ()
        n = int(bad_nan.sum())
        if bool((nan_g & ~nan_e).any()):
            if show:
                what = _t(f"your result has NaN at {n} of {g.numel()} positions{_fmt_index(idx)} where the reference is "
                          f"{float(e[idx]):.6g}{_on(case)}. NaN comes from 0/0, inf - inf, or the sqrt/log of a negative "
                          "number or zero somewhere in the computation")
            else:
                what = _t(f"your result has NaN at {n} of {g.numel()} positions{_fmt_index(idx)} where the reference is "
                          f"a number{_on(case)}. NaN comes from 0/0, inf - inf, or the sqrt/log of a negative number or "
                          "zero somewhere in the computation")
        else:
            what = _t(f"expected NaN{_fmt_index(idx)}, got {float(g[idx]):.6g}{_on(case)}")
        _fail(name, prefix + what, hint)
    if bool(bad_inf.any()):
        idx = tuple(int(i) for i in torch.nonzero(bad_inf)[0]) if not scalar else ()
        n = int(bad_inf.sum())
        if show:
            what = _t(f"infinities differ at {n} of {g.numel()} positions; first{_fmt_index(idx) or ''}: "
                      f"expected {float(e[idx]):.6g}, got {float(g[idx]):.6g}{_on(case)}")
        else:
            what = _t(f"infinities differ at {n} of {g.numel()} positions; first{_fmt_index(idx) or ''}: "
                      f"got {float(g[idx]):.6g}{_on(case)}")
        if bool(torch.isinf(e[idx])) and not bool(torch.isinf(g[idx])):
            what += _t(" (the reference removes this entry with -inf; yours keeps a finite value)")
        elif bool(torch.isinf(g[idx])) and not bool(torch.isinf(e[idx])):
            what += _t(" (yours removes or overflows an entry the reference keeps finite)")
        _fail(name, prefix + what, hint)
    if scalar:
        if show:
            what = _t(f"expected {float(e):.6g}, got {float(g):.6g} (difference {float(diff):.3g}, tolerance "
                      f"rtol={rtol:g}, atol={atol:g}){_on(case)}")
        else:
            what = _t(f"got {float(g):.6g}, not the reference's value within rtol={rtol:g}, atol={atol:g}{_on(case)}: "
                      f"{_direction(float(g), float(e))}")
        _fail(name, prefix + what, hint)
    idx = tuple(int(i) for i in torch.nonzero(bad_val)[0])
    max_diff = float(diff[finite].max())
    if show:
        what = _t(f"values differ at {int(bad_val.sum())} of {bad_val.numel()} positions (rtol={rtol:g}, atol={atol:g}); "
                  f"max abs diff {max_diff:.3g}; first at index {idx}: expected {float(e[idx]):.6g}, got {float(g[idx]):.6g}"
                  f"{_on(case)}")
    else:
        what = _t(f"values differ at {int(bad_val.sum())} of {bad_val.numel()} positions (rtol={rtol:g}, atol={atol:g}); "
                  f"first at index {idx}: got {float(g[idx]):.6g}{_on(case)}, {_direction(float(g[idx]), float(e[idx]))}")
    _fail(name, prefix + what, hint)


def _hint_for(seen: Optional[str], hint: Optional[str], mistake_hints: Optional[Mapping[str, str]]) -> Optional[str]:
    """The hint about the mistake named (``mistake_hints[seen]``) where there is one, else the general ``hint``."""
    if seen is not None and mistake_hints and seen in mistake_hints:
        return mistake_hints[seen]
    return hint


def _same_value(a: Any, b: Any, rel_tol: float, abs_tol: float) -> bool:
    """Numbers compared with a tolerance (0 and 0: exactly); anything else with ``==``."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        return math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=abs_tol)
    try:
        return bool(a == b)
    except Exception:  # values that cannot be compared are not equal
        return False


def _value_of(candidate: Any) -> Any:
    if callable(candidate):
        try:
            return candidate()
        except Exception:  # a mistake that cannot be computed for this input matches nothing
            return None
    return candidate


def _render(value: Any) -> str:
    """A learner's or the reference's value as a failure shows it (ints with thousands separators)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{value!r:.200}"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.6g}"


def check_equal(
    got: Any,
    expected: Any,
    name: str = "check",
    hint: Optional[str] = None,
    mistakes: Optional[Mapping[str, Any]] = None,
    case: Optional[str] = None,
    mistake_hints: Optional[Mapping[str, str]] = None,
) -> None:
    """Exact equality for non-tensor answers (counts, shapes, ints).

    ``mistakes`` maps a description to the value that mistake produces for this input (or a
    zero-argument function computing it); a mismatch names the first one equal to ``got``, then
    gives the hint. The reference's value is shown only where the exercise allows it
    (``expected_values``); otherwise the failure says which way a number is off."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape or not torch.equal(got.to(expected.device), expected):
            _expect(*expected.flatten()[:4096].tolist())
            if shows_expected(name):
                fail(name, f"expected {expected.tolist()!r:.200}, got "
                     f"{got.tolist() if isinstance(got, torch.Tensor) else got!r:.200}{_on(case)}", hint)
            fail(name, f"got {got.tolist() if isinstance(got, torch.Tensor) else got!r:.200}, not the reference's "
                 f"result{_on(case)}", hint)
        return
    if got != expected:
        seen = None
        for description, candidate in (mistakes or {}).items():
            candidate = _value_of(candidate)
            if candidate is None or isinstance(candidate, torch.Tensor) or type(candidate) is not type(got):
                continue
            if candidate == got and candidate != expected:
                seen = description
                break
        _fail_value(name, got, expected, seen, case, _hint_for(seen, hint, mistake_hints))


def _fail_value(name: str, got: Any, expected: Any, seen: Optional[str], case: Optional[str],
                hint: Optional[str], unit: str = "") -> NoReturn:
    """The failure of a value comparison: the mistake it looks like, then the reference's value or,
    where the exercise hides it, which way the learner's number is off."""
    prefix = _t(f"this looks like {seen}: ") if seen else ""
    _expect(expected)
    if shows_expected(name):
        what = _t(f"expected {_render(expected)}{unit}, got {_render(got)}{unit}{_on(case)}")
    elif isinstance(got, (int, float)) and isinstance(expected, (int, float)) and not isinstance(got, bool):
        what = _t(f"got {_render(got)}{unit}{_on(case)}, which is not the reference's: "
                  f"{_direction(float(got), float(expected))}")
    else:
        what = _t(f"got {_render(got)}{_on(case)}, which is not the reference's")
    _fail(name, prefix + what, hint)


class Outcome:
    """One case of a numeric exercise: what the learner returned, what the reference gives, and what
    each known mistake gives on that case (a value, a zero-argument function, or None where the
    mistake does not apply)."""

    def __init__(self, case: str, got: Any, expected: Any, mistakes: Optional[Mapping[str, Any]] = None) -> None:
        self.case, self.got, self.expected, self.mistakes = case, got, expected, dict(mistakes or {})


def as_number(got: Any, name: str, case: Optional[str], integer: bool, what: str = "a number") -> Any:
    """The learner's result as a Python int (``integer``) or float, failing clearly otherwise
    (a one-element tensor is accepted; a bool is not a number here)."""
    value = got
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if integer:
        try:
            if isinstance(value, bool):
                raise TypeError
            return operator.index(value)
        except TypeError:
            fail(name, f"expected an int ({what}), got {type(got).__name__}: {got!r:.80}{_on(case)}",
                 "the result is a whole number: keep to integer arithmetic, or convert the result with int(...).")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(name, f"expected a number ({what}), got {type(got).__name__}: {got!r:.80}{_on(case)}",
             "return a Python float (tensor.item() turns a one-element tensor into one).")
    return float(value)


def check_numbers(name: str, outcomes: Sequence[Outcome], hint: Optional[str] = None, rel_tol: float = 0.0,
                  abs_tol: float = 0.0, unit: str = "", mistake_hints: Optional[Mapping[str, str]] = None) -> None:
    """Compare a numeric exercise over all its cases at once, and name the mistake that explains them all.

    Every ``Outcome`` holds the learner's (already coerced, ``as_number``) and the reference's value.
    The failure reports the first case that differs. A mistake is named only when it reproduces the
    learner's result on every case (where the mistake does not apply, the learner's result must then be
    right): one wrong case is often explained by several mistakes, all of them together by one. Where the
    exercise hides the reference's values (``expected_values``), the failure says which way the number is off.
    ``mistake_hints``: mistake description -> the hint given instead of ``hint`` when that mistake is named."""
    wrong = [o for o in outcomes if not _same_value(o.got, o.expected, rel_tol, abs_tol)]
    if not wrong:
        return
    first = wrong[0]
    names: list = []
    for description in first.mistakes:
        fits = True
        for o in outcomes:
            value = _value_of(o.mistakes.get(description))
            if value is None:
                fits = _same_value(o.got, o.expected, rel_tol, abs_tol)
            else:
                fits = _same_value(o.got, value, rel_tol, abs_tol)
            if not fits:
                break
        if fits and not _same_value(_value_of(first.mistakes[description]), first.expected, rel_tol, abs_tol):
            names.append(description)
    if not names:  # no mistake explains every case: one that alone explains the first wrong case
        here = [d for d, v in first.mistakes.items() if (value := _value_of(v)) is not None
                and _same_value(first.got, value, rel_tol, abs_tol) and not _same_value(value, first.expected, rel_tol, abs_tol)]
        names = here if len(here) == 1 else []
    seen = None
    if len(names) == 1:
        seen = names[0]
        hint = _hint_for(seen, hint, mistake_hints)
    elif len(names) > 1:
        seen = _t(f"{names[0]}, or {names[1]}")
    _fail_value(name, first.got, first.expected, seen, first.case, hint, unit)


def expect_pair(got: Any, name: str, what: str) -> Tuple[Any, Any]:
    """Unpack a learner's ``(a, b)`` result, failing clearly when it is not a pair."""
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(name, f"expected a pair ({what}), got {type(got).__name__}: {got!r:.80}",
             "return the two results together, as a tuple of two.")
    return got[0], got[1]


@contextlib.contextmanager
def exercise(name: str) -> Iterator[None]:
    """Turn a ``NotImplementedError`` (the student-edition stub) into a clear failing check."""
    try:
        yield
    except NotImplementedError as err:
        raise ExerciseError(_t(f"[{name}] not implemented yet: {err}. Replace the stub with your code and run the cell "
                               "again.")) from None


class _Plain:
    """A snapshot of an immutable value (number, string, tuple of such), compared with ``==``."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _snapshot(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, list):
        return [_snapshot(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_snapshot(v) for v in value)
    if isinstance(value, dict):
        return {k: _snapshot(v) for k, v in value.items()}
    if isinstance(value, (int, float, str, bool)):
        return _Plain(value)
    return None


def _same(before: Any, after: Any) -> bool:
    if before is None:
        return True
    if isinstance(before, torch.Tensor):
        return isinstance(after, torch.Tensor) and before.shape == after.shape and bool(
            torch.equal(before.nan_to_num(0.0) if before.is_floating_point() else before,
                        after.detach().nan_to_num(0.0) if after.is_floating_point() else after.detach()))
    if isinstance(before, (list, tuple)):
        return isinstance(after, type(before)) and len(before) == len(after) and all(
            _same(b, a) for b, a in zip(before, after))
    if isinstance(before, dict):
        return isinstance(after, dict) and before.keys() == after.keys() and all(_same(before[k], after[k]) for k in before)
    if isinstance(before, _Plain):
        return bool(before.value == after)
    return True


def call(
    fn: Callable[..., Any],
    *args: Any,
    name: str = "check",
    hint: Optional[str] = None,
    case: Optional[str] = None,
    check_inputs: bool = False,
    crash_mistakes: Optional[Mapping[str, Callable[[], Any]]] = None,
    crash_hints: Optional[Mapping[str, str]] = None,
    **kwargs: Any,
) -> Any:
    """Call the learner's function; stubs and crashes become check failures that say so.

    A crash is reported with the input that caused it (``case``) and the ``hint``.
    ``check_inputs=True``: tensors, lists and dicts passed in must come back unchanged (an
    exercise that asks for a *new* tensor or list fails when the function edits its input).
    ``crash_mistakes``: mistake description -> a zero-argument function doing that mistake on the same input (or a
    list of such functions, its ways of writing it); a crash that raises what one of them raises (the same exception type and message) is named as that mistake,
    with its hint from ``crash_hints`` where there is one."""
    before = [_snapshot(a) for a in args] if check_inputs else []
    with exercise(name):
        try:
            result = fn(*args, **kwargs)
        except NotImplementedError:
            raise
        except ExerciseError:
            raise
        except Exception as err:  # the learner's code raised: report it as part of the check
            seen = _crash_like(err, crash_mistakes)
            what = _t(f"your function raised {type(err).__name__}: {err}{_on(case)}")
            _fail(name, (_t(f"this looks like {seen}: ") if seen else "") + what, _hint_for(seen, hint, crash_hints))
    for position, (snap, arg) in enumerate(zip(before, args)):
        if not _same(snap, arg):
            fail(name, f"your function changed its input (argument {position + 1}) in place{_on(case)}; the exercise "
                 "asks you to return a new result and leave the input as it was",
                 "build a new list or tensor, or work on a copy of the argument, instead of assigning into it.")
    return result


def _crash_like(err: BaseException, crash_mistakes: Optional[Mapping[str, Callable[[], Any]]]) -> Optional[str]:
    """The first mistake (``call``'s ``crash_mistakes``) that raises the same exception as the learner's code."""
    import warnings

    for description, thunks in (crash_mistakes or {}).items():
        for thunk in (thunks if isinstance(thunks, (list, tuple)) else [thunks]):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # PyTorch's deprecation warnings of the mistake, not the learner's
                    thunk()
            except Exception as other:  # the mistake crashes too: the same way?
                if type(other) is type(err) and str(other) == str(err):
                    return description
    return None


def passed(name: str, detail: str = "") -> None:
    """Print the success line (in the learner's language, ``minimind_ref.i18n``)."""
    print(_t(f"✓ {name} passed: {detail}") if detail else _t(f"✓ {name} passed"))


def check(name: str, shown: Optional[bool] = None,
          why: Optional[str] = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator for a check function: converts stubs into failures and prints ``✓`` on success
    (the decorated function should return an optional detail string). ``shown`` and ``why``, when
    given, are the exercise's ``expected_values`` declaration (the exercise is the one ``name``
    names), made where the check is defined."""
    if shown is not None or why is not None:
        number = exercise_number(name)
        if number is None or shown is None:
            raise ValueError(f"check: declaring which values a failure may show needs a name like 'Exercise 9.1 "
                             f"...' and both shown=True/False and why=..., got name={name!r}, shown={shown!r}.")
        expected_values(number, shown, why)

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> None:
            with exercise(name):
                detail = fn(*args, **kwargs)
            passed(name, detail or "")

        return inner

    return wrap


# --------------------------------------------------------------------------------------------
# Shortcuts an exercise asks the learner to do without (the library call it is about)
# --------------------------------------------------------------------------------------------

class Shortcut:
    """One call an exercise asks the learner not to use while building the thing it is about: how a
    failure names it (``label``, e.g. ``"torch.softmax"``) and where it lives (``(owner, attribute)``
    pairs: a module and a function name, or a class and a method name). ``refused`` switches every
    place off while the learner's function runs."""

    def __init__(self, label: str, *places: Tuple[Any, str]) -> None:
        if not places or any(not (isinstance(p, tuple) and len(p) == 2 and isinstance(p[1], str)) for p in places):
            raise ValueError(f"Shortcut {label!r}: give one or more (owner, attribute name) pairs.")
        self.label, self.places = label, tuple(places)

    def originals(self) -> list:
        """The objects the places hold now (the ones a learner's code may have bound to other names)."""
        return [getattr(owner, attr) for owner, attr in self.places if hasattr(owner, attr)]


_REFUSALS: Dict[int, Tuple[str, str, Optional[str]]] = {}
_REFUSAL_COUNTER = [0]


def _refusal(key: int) -> NoReturn:
    """What a switched-off shortcut does when called: fail the check that switched it off."""
    name, label, hint = _REFUSALS[key]
    number = exercise_number(name) or "?"
    fail(name, f"Exercise {number} asks you to build this without {label}, and your code calls it (the check "
         f"switches {label} off while your function runs)", hint)


def _raiser(key: int) -> Callable[..., Any]:
    def refused_call(*args: Any, **kwargs: Any) -> NoReturn:
        _refusal(key)
    return refused_call


_KEY_MARK = -4242424242  # the constant of _refused_template that _raiser_code replaces with a refusal's key


def _refused_template(*args: Any, **kwargs: Any) -> NoReturn:
    """The code every switched-off Python function runs instead of its own (``_raiser_code``): it imports this
    module by name, so it works from inside any module's globals."""
    __import__("minimind_ref.checks.core", fromlist=("_refusal",))._refusal(-4242424242)


def _raiser_code(key: int) -> Any:
    """A code object that fails the check ``key`` from inside any module, put in place of a Python function's own
    code: every name bound to that function, wherever, then refuses."""
    code = _refused_template.__code__
    consts = tuple(key if c == _KEY_MARK else __name__ if c == "minimind_ref.checks.core" else c
                   for c in code.co_consts)
    return code.replace(co_consts=consts)


def _namespaces(fn: Any) -> list:
    """The dicts a learner's callable reads names from: the globals of its function (or of a class's methods,
    or of a module instance's forward), which in a notebook are the notebook's namespace."""
    seen, out = set(), []
    todo = [fn]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, functools.partial):
            todo.append(obj.func)
        elif hasattr(obj, "__func__"):
            todo.append(obj.__func__)
        elif isinstance(obj, type):
            todo.extend(v for v in vars(obj).values() if callable(v) or isinstance(v, (staticmethod, classmethod)))
        elif isinstance(obj, (staticmethod, classmethod)):
            todo.append(obj.__func__)
        elif hasattr(obj, "__globals__") and isinstance(obj.__globals__, dict):
            if all(obj.__globals__ is not d for d in out):
                out.append(obj.__globals__)
        elif not isinstance(obj, type) and hasattr(type(obj), "forward"):
            todo.append(type(obj))
    return out


@contextlib.contextmanager
def refused(name: str, fn: Any, shortcuts: Sequence[Shortcut], hint: Optional[str] = None) -> Iterator[None]:
    """While the block runs, every ``Shortcut`` fails the check ``name`` when called: "Exercise N.M asks you to
    build this without <label>, and your code calls it", then ``hint``. Wrap only the learner's call in it
    (the reference is computed outside).

    The places are switched off as attributes (``torch.softmax``, ``F.silu``, ``Attention.forward``, so a
    subclass's ``super().forward`` is refused too); a Python function without a closure also gets a code that
    refuses, so a name bound to it anywhere (``from minimind_ref.config import default_intermediate_size``
    at a notebook's top level, a dict of rules) refuses; and the learner's own namespaces (``fn``'s globals,
    a notebook's namespace) have any other name bound to a shortcut (a builtin such as ``torch.softmax``
    imported by name) switched off too. ``fn`` itself being a shortcut (``silu = F.silu``) fails at once.
    Everything is put back when the block ends, also after a failure."""
    keyed = []
    for shortcut in shortcuts:
        _REFUSAL_COUNTER[0] += 1
        key = _REFUSAL_COUNTER[0]
        _REFUSALS[key] = (name, shortcut.label, hint)
        keyed.append((key, shortcut))
    originals = {id(obj): key for key, s in keyed for obj in s.originals()}
    target = fn.func if isinstance(fn, functools.partial) else getattr(fn, "__func__", fn)
    if id(target) in originals:
        key = originals[id(target)]
        try:
            _refusal(key)
        finally:
            _REFUSALS.pop(key, None)
    attributes: list = []   # (owner, attr, had it in its own dict, the old value)
    codes: list = []        # (function, its own code)
    bindings: list = []     # (namespace, name, the old value)
    try:
        for key, shortcut in keyed:
            raiser = _raiser(key)
            for owner, attr in shortcut.places:
                own = vars(owner) if hasattr(owner, "__dict__") else {}
                if not hasattr(owner, attr):
                    continue
                value = getattr(owner, attr)
                if isinstance(value, type(_raiser)) and not value.__code__.co_freevars and \
                        all(value is not f for f, _ in codes):
                    codes.append((value, value.__code__))
                    value.__code__ = _raiser_code(key)
                attributes.append((owner, attr, attr in own, own.get(attr)))
                setattr(owner, attr, staticmethod(raiser) if isinstance(own.get(attr), staticmethod) else raiser)
        for namespace in _namespaces(fn):
            for var, value in list(namespace.items()):
                key = originals.get(id(value))
                if key is not None and all(value is not f for f, _ in codes):
                    bindings.append((namespace, var, value))
                    namespace[var] = _raiser(key)
        yield
    finally:
        for namespace, var, value in reversed(bindings):
            namespace[var] = value
        for owner, attr, had, value in reversed(attributes):
            if had:
                setattr(owner, attr, value)
            else:
                delattr(owner, attr)
        for function, code in reversed(codes):
            function.__code__ = code
        for key, _ in keyed:
            _REFUSALS.pop(key, None)
