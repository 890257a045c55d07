"""Chapter 04 checks: the reference passes, the stub and typical mistakes fail."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from minimind_ref.checks import ch04
from minimind_ref.config import default_intermediate_size


# ----------------------------------------------------------------------------- reference answers
def silu(x):
    return x * torch.sigmoid(x)


def silu_grad(x):
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s))


def swiglu_ffn(x, w_gate, w_up, w_down):
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def intermediate_size(hidden):
    return 64 * math.ceil(int(8 * hidden / 3) / 64)


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise 4.x: implement me")


# ----------------------------------------------------------------------------- passes
@pytest.mark.parametrize("check, fn", [
    (ch04.check_silu, silu),
    (ch04.check_silu, F.silu),
    (ch04.check_silu, lambda x: x / (1 + torch.exp(-x))),
    (ch04.check_silu_grad, silu_grad),
    (ch04.check_swiglu_ffn, swiglu_ffn),
    (ch04.check_swiglu_ffn, lambda x, g, u, d: (F.silu(x @ g.T) * (x @ u.T)) @ d.T),
    (ch04.check_intermediate_size, intermediate_size),
    (ch04.check_intermediate_size, default_intermediate_size),
    (ch04.check_intermediate_size, lambda h: -(-(8 * h // 3) // 64) * 64),
])
def test_reference_passes(check, fn, capsys):
    check(fn)
    assert capsys.readouterr().out.startswith("✓")


# ----------------------------------------------------------------------------- stubs fail
@pytest.mark.parametrize("check", [ch04.check_silu, ch04.check_silu_grad, ch04.check_swiglu_ffn,
                                   ch04.check_intermediate_size])
def test_stub_fails(check):
    with pytest.raises(AssertionError, match="not implemented"):
        check(stub)


# ----------------------------------------------------------------------------- wrong answers fail
def _inplace_silu(x):
    return x.mul_(torch.sigmoid(x.clone()))


@pytest.mark.parametrize("check, fn, message", [
    (ch04.check_silu, torch.sigmoid, "sigmoid"),
    (ch04.check_silu, torch.relu, "silu"),
    (ch04.check_silu, F.gelu, "silu"),
    (ch04.check_silu, lambda x: (x * torch.sigmoid(x)).float(), "dtype"),
    (ch04.check_silu, _inplace_silu, "in place"),
    (ch04.check_silu, lambda x: (x * torch.sigmoid(x)).tolist(), "torch.Tensor"),
    # gradient: forgetting the product rule, the sigmoid's own derivative, the function itself
    (ch04.check_silu_grad, torch.sigmoid, "silu_grad"),
    (ch04.check_silu_grad, lambda x: torch.sigmoid(x) * (1 - torch.sigmoid(x)), "silu_grad"),
    (ch04.check_silu_grad, F.silu, "silu_grad"),
    (ch04.check_silu_grad, lambda x: torch.sigmoid(x) * (1 + x * torch.sigmoid(x)), "silu_grad"),
    # SwiGLU: gate/up swapped, activation on the wrong branch / both / none, ReLU instead of SiLU
    (ch04.check_swiglu_ffn, lambda x, g, u, d: swiglu_ffn(x, u, g, d), "swapped"),
    (ch04.check_swiglu_ffn, lambda x, g, u, d: F.linear(F.silu(F.linear(x, g)) * F.silu(F.linear(x, u)), d), "swiglu"),
    (ch04.check_swiglu_ffn, lambda x, g, u, d: F.linear(F.linear(x, g) * F.linear(x, u), d), "swiglu"),
    (ch04.check_swiglu_ffn, lambda x, g, u, d: F.linear(F.relu(F.linear(x, g)) * F.linear(x, u), d), "swiglu"),
    (ch04.check_swiglu_ffn, lambda x, g, u, d: F.linear(F.silu(F.linear(x, g) * F.linear(x, u)), d), "swiglu"),
    (ch04.check_swiglu_ffn, lambda x, g, u, d: F.linear(F.silu(F.linear(x, g)), d), "swiglu"),
    (ch04.check_swiglu_ffn, lambda x, g, u, d: (F.silu(x @ g) * (x @ u)) @ d, "raised"),
    # intermediate size: rounding down, to nearest, not at all, a float, 4x
    (ch04.check_intermediate_size, lambda h: 64 * math.floor(int(8 * h / 3) / 64), "intermediate_size"),
    (ch04.check_intermediate_size, lambda h: 64 * round(int(8 * h / 3) / 64), "intermediate_size"),
    (ch04.check_intermediate_size, lambda h: int(8 * h / 3), "intermediate_size"),
    (ch04.check_intermediate_size, lambda h: 64.0 * math.ceil(int(8 * h / 3) / 64), "expected an int"),
    (ch04.check_intermediate_size, lambda h: 4 * h, "intermediate_size"),
])
def test_wrong_answers_fail(check, fn, message):
    with pytest.raises(AssertionError, match=message):
        check(fn)


def test_failure_messages_carry_a_hint():
    with pytest.raises(AssertionError) as err:
        ch04.check_intermediate_size(lambda h: 64 * (int(8 * h / 3) // 64))
    text = str(err.value)
    assert "expected 1408, got 1344" in text and "hint:" in text and "ceil" in text
