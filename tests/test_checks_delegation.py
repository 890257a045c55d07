"""checks.delegation: the one guard every chapter's checks use against a learner's function that hands its
exercise to the package (or measures a prediction): what it sees, however the forbidden function is reached."""

import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from _helpers import check_fails
from minimind_ref.checks import delegation
from minimind_ref.checks.core import ExerciseError, check
from minimind_ref.checks.delegation import call_refusing, forbid, guarded, modules_built, watching


def answer(x):
    """Stands for the package's own answer to an exercise."""
    return x * 2


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return x * self.w


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(2, 2)


def _seen(fn, forbidden):
    with watching(forbidden) as seen:
        fn()
    return [entry.label for entry in seen]


def test_python_functions_are_seen_however_they_are_reached():
    alias = answer
    wrapper = lambda x: alias(x)  # noqa: E731
    assert _seen(lambda: wrapper(1), {"answer": answer}) == ["answer"]
    assert _seen(lambda: 1 + 1, {"answer": answer}) == []


def test_a_class_stands_for_every_method_it_defines():
    x = torch.ones(3)
    assert _seen(lambda: Layer(), [forbid("Layer", Layer)]) == ["Layer"]
    layer = Layer()
    assert _seen(lambda: layer(x), [forbid("Layer", Layer)]) == ["Layer"]  # forward through nn.Module.__call__
    assert _seen(lambda: nn.Linear(2, 2), [forbid("Layer", Layer)]) == []  # nn.Module's own methods are not it


def test_c_functions_and_method_descriptors_are_seen():
    """A library-call guard: torch.softmax (a C function), F.softmax (Python) and x.softmax (a method descriptor,
    bound to any tensor) are all one forbidden entry."""
    softmax = forbid("softmax", torch.softmax, F.softmax, torch.Tensor.softmax, reason="write it from exp and a sum")
    x = torch.randn(4)
    assert _seen(lambda: torch.softmax(x, 0), [softmax]) == ["softmax"]
    assert _seen(lambda: F.softmax(x, 0), [softmax]) == ["softmax"]
    assert _seen(lambda: x.softmax(0), [softmax]) == ["softmax"]
    assert _seen(lambda: x.exp() / x.exp().sum(), [softmax]) == []


def test_autograd_is_seen_through_backward_and_grad():
    entry = forbid("autograd", torch.Tensor.backward, torch.autograd.grad, torch.enable_grad)
    x = torch.ones(2, requires_grad=True)
    assert _seen(lambda: (x * 2).sum().backward(), [entry]) == ["autograd"]
    assert _seen(lambda: torch.autograd.grad((x * 3).sum(), x), [entry]) == ["autograd"]

    def under_enable_grad():
        with torch.no_grad():
            with torch.enable_grad():
                pass

    assert _seen(under_enable_grad, [entry]) == ["autograd"]


def test_an_earlier_profile_function_keeps_its_events():
    events = []

    def outer(frame, event, arg):
        events.append(event)

    previous = sys.getprofile()
    sys.setprofile(outer)
    try:
        with watching({"answer": answer}) as seen:
            answer(1)
        assert sys.getprofile() is outer
    finally:
        sys.setprofile(previous)
    assert seen and "call" in events


def test_guarded_names_the_entry_and_its_reason_even_when_the_function_then_fails():
    @check("Exercise 99.1 demo")
    def check_demo(fn):
        return call_refusing(fn, 3, forbidden=[forbid("the demo's answer", answer, reason="write it yourself")],
                             name="Exercise 99.1 demo", case="a case")

    check_fails(check_demo, lambda x: answer(x) + 1, "your function calls the demo's answer (on a case); write it yourself")

    def calls_then_raises(x):
        answer(x)
        raise ValueError("later")

    check_fails(check_demo, calls_then_raises, "your function calls the demo's answer")
    with pytest.raises(ExerciseError, match="the package's own answer to this exercise"):
        guarded(lambda x: answer(x), "Exercise 99.1 demo", {"answer": answer})(1)


def test_the_guard_can_be_switched_off(monkeypatch):
    monkeypatch.setattr(delegation, "ENFORCED", False)
    assert guarded(lambda x: answer(x), "Exercise 99.1 demo", {"answer": answer})(2) == 4


def test_modules_built_and_allocated():
    with modules_built() as built:
        nn.Linear(2, 2)
    assert built == ["Linear"]
    with modules_built(off_meta=True) as allocated:
        with torch.device("meta"):
            Outer()
    assert allocated == []
    with modules_built(off_meta=True) as allocated:
        Outer()
    assert allocated == ["Outer", "Linear"]  # a model before the layers its __init__ builds


def test_forbid_needs_a_target_it_can_watch():
    with pytest.raises(ValueError):
        forbid("nothing")
    with pytest.raises(TypeError):
        _seen(lambda: None, [forbid("a number", 3)])
