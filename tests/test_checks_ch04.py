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


def _silu_exp_form(x):  # right values, NaN gradient at -100 in float32
    return x / (1 + torch.exp(-x))


def _silu_detached(x):
    return torch.from_numpy((x * torch.sigmoid(x)).detach().numpy())


def _silu_grad_exp_form(x):
    e = torch.exp(-x)
    return (1 + e + x * e) / (1 + e) ** 2


def _silu_grad_in_place(x):
    s = torch.sigmoid(x)
    return x.mul_(1 - s).add_(1).mul_(s)


def _swiglu_in_place(x, g, u, d):
    out = swiglu_ffn(x, g, u, d)
    g.zero_()
    return out


# (check, wrong answer, text the failure must contain: the named mistake, or the failing input)
WRONG = [
    (ch04.check_silu, torch.sigmoid, "this looks like sigmoid(x) alone"),
    (ch04.check_silu, torch.relu, "this looks like ReLU"),
    (ch04.check_silu, F.gelu, "this looks like GELU"),
    (ch04.check_silu, lambda x: x * torch.sigmoid(-x), "this looks like x * sigmoid(-x)"),
    (ch04.check_silu, lambda x: x / (1 + torch.exp(x)), "this looks like x * sigmoid(-x)"),
    (ch04.check_silu, lambda x: (x * torch.sigmoid(x)).float(), "dtype mismatch: expected torch.float64, got torch.float32"),
    (ch04.check_silu, _inplace_silu, "changed its input (argument 1) in place"),
    (ch04.check_silu, lambda x: (x * torch.sigmoid(x)).tolist(), "expected a torch.Tensor"),
    (ch04.check_silu, _silu_exp_form, "this looks like x / (1 + exp(-x)), whose gradient at x = -100 is inf / inf = NaN"),
    (ch04.check_silu, _silu_exp_form, "the gradient autograd computes through your silu"),
    (ch04.check_silu, _silu_detached, "does not depend on x through autograd"),
    # gradient: forgetting the product rule, the sigmoid's own derivative, the function itself
    (ch04.check_silu_grad, torch.sigmoid, "this looks like sigmoid(x) alone"),
    (ch04.check_silu_grad, lambda x: torch.sigmoid(x) * (1 - torch.sigmoid(x)), "this looks like sigmoid'(x) = s * (1 - s) alone"),
    (ch04.check_silu_grad, F.silu, "this looks like SiLU itself"),
    (ch04.check_silu_grad, lambda x: torch.sigmoid(x) * (1 + x * torch.sigmoid(x)), "this looks like s + x * s * s"),
    (ch04.check_silu_grad, lambda x: torch.sigmoid(x) + x * (1 - torch.sigmoid(x)), "this looks like s + x * (1 - s)"),
    (ch04.check_silu_grad, _silu_grad_exp_form, "this looks like (1 + e + x e) / (1 + e)**2"),
    (ch04.check_silu_grad, _silu_grad_exp_form, "NaN"),
    (ch04.check_silu_grad, _silu_grad_in_place, "changed its input (argument 1) in place"),
    # SwiGLU: gate/up swapped, activation on the wrong branch / both / none, ReLU instead of SiLU
    (ch04.check_swiglu_ffn, lambda x, g, u, d: swiglu_ffn(x, u, g, d), "this looks like gate and up swapped"),
    (ch04.check_swiglu_ffn, lambda x, g, u, d: F.linear(F.silu(F.linear(x, g)) * F.silu(F.linear(x, u)), d),
     "this looks like SiLU on both branches"),
    (ch04.check_swiglu_ffn, lambda x, g, u, d: F.linear(F.linear(x, g) * F.linear(x, u), d), "this looks like no activation"),
    (ch04.check_swiglu_ffn, lambda x, g, u, d: F.linear(F.relu(F.linear(x, g)) * F.linear(x, u), d),
     "this looks like ReLU instead of SiLU"),
    (ch04.check_swiglu_ffn, lambda x, g, u, d: F.linear(F.silu(F.linear(x, g) * F.linear(x, u)), d),
     "this looks like SiLU applied to the product"),
    (ch04.check_swiglu_ffn, lambda x, g, u, d: F.linear(F.silu(F.linear(x, g)), d), "this looks like the up branch left out"),
    (ch04.check_swiglu_ffn, lambda x, g, u, d: F.linear(F.silu(F.linear(x, g)) + F.linear(x, u), d),
     "this looks like the two branches added instead of multiplied"),
    (ch04.check_swiglu_ffn, lambda x, g, u, d: F.silu(F.linear(x, g)) * F.linear(x, u), "this looks like the down projection left out"),
    (ch04.check_swiglu_ffn, lambda x, g, u, d: (F.silu(x @ g) * (x @ u)) @ d, "mat1 and mat2 shapes cannot be multiplied"),
    (ch04.check_swiglu_ffn, lambda x, g, u, d: (F.silu(x @ g) * (x @ u)) @ d, "(on x (2, 5, 32), w_gate and w_up (96, 32)"),
    (ch04.check_swiglu_ffn, lambda x, g, u, d: (F.silu(x @ g) * (x @ u)) @ d, "x @ w.T"),
    (ch04.check_swiglu_ffn, _swiglu_in_place, "changed its input (argument 2) in place"),
    # intermediate size: rounding down, to nearest, not at all, a float, 4x, Llama's 256
    (ch04.check_intermediate_size, lambda h: 64 * math.floor(int(8 * h / 3) / 64), "this looks like rounding down"),
    (ch04.check_intermediate_size, lambda h: 64 * round(int(8 * h / 3) / 64), "round() for this width"),
    (ch04.check_intermediate_size, lambda h: int(8 * h / 3), "this looks like 8h/3 without rounding"),
    (ch04.check_intermediate_size, lambda h: 64.0 * math.ceil(int(8 * h / 3) / 64), "expected an int"),
    (ch04.check_intermediate_size, lambda h: 4 * h, "this looks like 4h"),
    (ch04.check_intermediate_size, lambda h: 256 * math.ceil(int(8 * h / 3) / 256), "this looks like rounding up to a multiple of 256"),
    (ch04.check_intermediate_size, lambda h: 64 * (int(8 * h / 3) // 64 + 1), "plus one more 64"),
]


@pytest.mark.parametrize("check, fn, message", WRONG, ids=[f"{c.__name__}-{m[:40]}" for c, _, m in WRONG])
def test_wrong_answers_fail_naming_the_mistake(check, fn, message):
    with pytest.raises(AssertionError) as err:
        check(fn)
    text = str(err.value)
    assert message in text, text
    assert text.startswith("[Exercise 4.")


def test_failure_messages_carry_a_hint_and_how_to_ask_last():
    with pytest.raises(AssertionError) as err:
        ch04.check_intermediate_size(lambda h: 64 * (int(8 * h / 3) // 64))
    text = str(err.value)
    assert "expected 1408, got 1344" in text and "hint:" in text
    assert text.index("this looks like") < text.index("hint:") < text.index('show_solution("4.4")')
    assert "math.ceil" not in text, "the solution (math.ceil) is shown only on request"
