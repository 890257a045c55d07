"""The one guard against a learner's function that hands its exercise to something else.

The chapters import ``minimind_ref`` to use it (``sft.render_chat`` prints the templates of chapter
09, ``grpo.group_advantages`` computes chapter 12's advantages), so the function an exercise rebuilds
is often one name away, and calling it would pass the check without any of the work. Some exercises
forbid more than the package's answer: a prediction must not be measured (autograd, a simulation's
building blocks), a count derived from a config must not build the model. Every chapter's checks
(05 to 12) use this module for it:

* ``forbid(label, *targets, reason=None)`` names what must not run inside the learner's function:
  Python functions and methods, classes (every method the class itself defines, ``__init__``
  included), and functions written in C (``torch.softmax``, ``torch.Tensor.backward``'s C parts, a
  method descriptor such as ``torch.Tensor.clamp``, which also stands for ``x.clamp`` on any tensor).
  ``label`` is the name the learner knows it by; ``reason`` is the sentence the failure gives, by
  default that it is the package's own answer. A plain mapping ``{label: target}`` is read as
  ``forbid(label, target)`` for each entry.
* ``watching(forbidden)`` is a context manager that records (``sys.setprofile``: code objects for
  Python functions, ``c_call`` events for C functions) which of them ran while the block ran, however
  they were reached: an alias, a wrapper, the module attribute, a bound method. A profile function
  that was already set keeps receiving every event.
* ``guarded(fn, name, forbidden)`` wraps the learner's function so that calling it fails the check
  ``name`` when a forbidden target ran inside it; ``call_refusing(fn, *args, forbidden=..., ...)`` is
  ``core.call`` on the guarded function.
* ``modules_built()`` records the ``nn.Module``s built while a block runs (``off_meta=True``: only
  those whose parameters were allocated, not built on the meta device); ``call_without_modules`` fails
  a derived count that builds a model or a layer.

Only what would answer the exercise is forbidden (the reference, its helpers, the check's own
``*_reference``, or the library call that would do the exercise's work); the building blocks the
exercise is about stay free. The tests of chapters 09 to 12 pass the references themselves as the
learner's function and switch the guard off (``ENFORCED = False``) except where they test it.

A library-call guard (forbidding ``torch.softmax`` in an exercise that writes softmax) is a
``forbid(...)`` entry with its own ``reason``::

    SOFTMAX = forbid("torch.softmax", torch.softmax, torch.Tensor.softmax, F.softmax,
                     reason="the exercise asks you to write softmax from exp and a sum")
    got = call_refusing(fn, x, forbidden=[SOFTMAX], name=NAME, case=case, hint=hint)
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

from torch import nn

from .core import _on, call, fail

# The tests of the checks of chapters 09 to 12 pass the reference itself, and mistakes built from it, as the
# learner's function; they switch the guard off (tests/test_checks_ch09.py ...) except where they test it.
ENFORCED = True


@dataclass(frozen=True)
class Forbidden:
    """Something that must not run inside the learner's function: ``targets`` (functions, methods, classes,
    C functions, method descriptors), known to the learner as ``label``; ``reason``: the sentence the failure
    gives after naming it (None: it is the package's own answer to the exercise)."""

    label: str
    targets: Tuple[Any, ...]
    reason: Optional[str] = None


def forbid(label: str, *targets: Any, reason: Optional[str] = None) -> Forbidden:
    """A ``Forbidden`` entry: ``label`` names ``targets`` in the failure; ``reason`` says why they are refused."""
    if not targets:
        raise ValueError(f"forbid({label!r}): give at least one function, method or class to watch for.")
    return Forbidden(label, tuple(targets), reason)


ForbiddenSpec = Union[Mapping[str, Any], Iterable[Union[Forbidden, Callable[..., Any]]]]

_DESCRIPTORS = (types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType)


def _entries(forbidden: ForbiddenSpec) -> List[Forbidden]:
    """``forbidden`` as a list of ``Forbidden``: a mapping is ``{label: target}`` with the default reason; in a
    sequence, a bare function stands for itself under its module and qualified name
    (``minimind_ref.generation.top_p_filter``)."""
    if isinstance(forbidden, Mapping):
        return [forbid(label, target) for label, target in forbidden.items()]
    out: List[Forbidden] = []
    for item in forbidden:
        if isinstance(item, Forbidden):
            out.append(item)
        else:
            module = getattr(item, "__module__", None)
            qualname = getattr(item, "__qualname__", repr(item))
            out.append(forbid(f"{module}.{qualname}" if module else qualname, item))
    return out


class _Targets:
    """The forbidden targets, compiled for the profile function: code objects, C functions, and method
    descriptors by method name."""

    def __init__(self, entries: List[Forbidden]) -> None:
        self.codes: Dict[types.CodeType, Forbidden] = {}
        self.builtins: Dict[int, Tuple[Any, Forbidden]] = {}
        self.methods: Dict[str, List[Tuple[type, Forbidden]]] = {}
        for entry in entries:
            for target in entry.targets:
                self._add(target, entry)

    def _add(self, target: Any, entry: Forbidden) -> None:
        if isinstance(target, type):  # a class: every method it defines itself (not those it inherits)
            found = False
            for attr in vars(target).values():
                if isinstance(attr, (staticmethod, classmethod)):
                    attr = attr.__func__
                if isinstance(attr, property):
                    attr = attr.fget
                if callable(attr) and hasattr(getattr(attr, "__wrapped__", attr), "__code__"):
                    self._add(attr, entry)
                    found = True
            if not found:
                raise TypeError(f"forbid({entry.label!r}): the class {target.__qualname__} defines no Python method "
                                "to watch for.")
            return
        while hasattr(target, "__wrapped__"):  # functools.wraps: the function that does the work
            target = target.__wrapped__
        if isinstance(target, functools.partial):
            target = target.func
        if isinstance(target, types.MethodType):  # a bound method: its function
            target = target.__func__
        code = getattr(target, "__code__", None)
        if isinstance(code, types.CodeType):
            self.codes[code] = entry
        elif isinstance(target, _DESCRIPTORS):  # torch.Tensor.clamp: x.clamp on any tensor as well
            self.methods.setdefault(target.__name__, []).append((target.__objclass__, entry))
        elif isinstance(target, types.BuiltinFunctionType):
            owner = getattr(target, "__self__", None)
            if owner is None or isinstance(owner, (types.ModuleType, type)):
                self.builtins[id(target)] = (target, entry)
            else:  # a C method bound to one object: that method on every object of its type
                self.methods.setdefault(target.__name__, []).append((type(owner), entry))
        else:
            raise TypeError(f"forbid({entry.label!r}): cannot watch for {target!r} ({type(target).__name__}).")

    def match(self, frame: Any, event: str, arg: Any) -> Optional[Forbidden]:
        if event == "call":
            return self.codes.get(frame.f_code)
        if event == "c_call":
            hit = self.builtins.get(id(arg))
            if hit is not None and hit[0] is arg:
                return hit[1]
            candidates = self.methods.get(getattr(arg, "__name__", ""), ())
            if candidates:
                owner = getattr(arg, "__self__", None)
                for cls, entry in candidates:
                    if owner is not None and isinstance(owner, cls):
                        return entry
        return None


@contextlib.contextmanager
def watching(forbidden: ForbiddenSpec) -> Iterator[List[Forbidden]]:
    """Record, in the order they first ran, the ``Forbidden`` entries whose targets ran while the block ran.
    A profile function set before (a debugger, a coverage tool, an outer ``watching``) keeps receiving every
    event."""
    targets = _Targets(_entries(forbidden))
    seen: List[Forbidden] = []
    previous = sys.getprofile()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" or event == "c_call":
            hit = targets.match(frame, event, arg)
            if hit is not None and hit not in seen:
                seen.append(hit)
        if previous is not None:
            previous(frame, event, arg)

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(previous)


def refuse(name: str, entry: Forbidden, case: Optional[str] = None, hint: Optional[str] = None) -> None:
    """Fail the check ``name``: the learner's function ran ``entry``."""
    if entry.reason is None:
        fail(name, f"your function calls {entry.label}{_on(case)}, the package's own answer to this exercise, so the "
             "check cannot tell your work from it",
             "write the part that function does with your own code; you may still call it outside your function to "
             "compare results.")
    fail(name, f"your function calls {entry.label}{_on(case)}; {entry.reason}", hint)


def guarded(fn: Callable[..., Any], name: str, forbidden: ForbiddenSpec, case: Optional[str] = None,
            hint: Optional[str] = None) -> Callable[..., Any]:
    """``fn`` wrapped so that calling it fails the check ``name`` when one of ``forbidden`` runs inside it
    (``ENFORCED = False`` switches the guard off). A forbidden call is reported even when ``fn`` then raises."""
    entries = _entries(forbidden)

    def inner(*args: Any, **kwargs: Any) -> Any:
        if not ENFORCED:
            return fn(*args, **kwargs)
        with watching(entries) as seen:
            try:
                result = fn(*args, **kwargs)
            except NotImplementedError:
                raise
            except Exception:
                if seen:
                    refuse(name, seen[0], case, hint)
                raise
        if seen:
            refuse(name, seen[0], case, hint)
        return result

    return inner


def call_refusing(fn: Callable[..., Any], *args: Any, forbidden: ForbiddenSpec, name: str,
                  hint: Optional[str] = None, case: Optional[str] = None, check_inputs: bool = False,
                  **kwargs: Any) -> Any:
    """``core.call(fn, *args, ...)`` with ``fn`` guarded against ``forbidden``."""
    return call(guarded(fn, name, forbidden, case=case, hint=hint), *args, name=name, hint=hint, case=case,
                check_inputs=check_inputs, **kwargs)


@contextlib.contextmanager
def modules_built(off_meta: bool = False) -> Iterator[List[str]]:
    """Record the class name of every ``nn.Module`` built while the block runs (a count derived from numbers
    builds none); ``off_meta=True``: only the modules with parameters allocated, that is built outside the meta
    device (which knows every shape and allocates nothing). The names are in the order the modules were
    begun (a model before its layers) and complete once the block has ended."""
    built: List[str] = []
    modules: List[nn.Module] = []
    original = nn.Module.__init__

    def spy(self: nn.Module, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        modules.append(self)

    nn.Module.__init__ = spy  # type: ignore[method-assign]
    try:
        yield built
    finally:
        nn.Module.__init__ = original  # type: ignore[method-assign]
        # a module's parameters exist once its __init__ has run to the end: look at them now
        built.extend(type(m).__name__ for m in modules
                     if not off_meta or any(p.device.type != "meta" for p in m.parameters()))
        modules.clear()


def call_without_modules(fn: Callable[..., Any], *args: Any, name: str, hint: Optional[str], case: str, what: str,
                         **kwargs: Any) -> Any:
    """``core.call`` for the exercises that derive a number: building a model or a layer to count or measure
    fails (``what``: what the exercise asks, "count the parameters")."""
    with modules_built() as built:
        got = call(fn, *args, name=name, hint=hint, case=case, **kwargs)
    if built:
        fail(name, f"your function built a {built[0]} (on {case}); the exercise asks you to {what} from the numbers "
             "alone, without building a model or a layer", hint)
    return got
