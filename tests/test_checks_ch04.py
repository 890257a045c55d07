"""Chapter 04 checks: the reference passes, the stub and typical mistakes fail."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import minimind_ref as mm
import minimind_ref.config
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


def minimind3_ffn(hidden, layers):
    width = math.ceil(hidden * math.pi / 64) * 64
    return width, 3 * hidden * width * layers


def _pi_ffn(width_rule, params_rule=lambda h, m, layers: 3 * h * m * layers):
    """A 4.5 answer built from a width rule and a parameter count (each may hold a planted mistake)."""
    def answer(hidden, layers):
        m = width_rule(hidden)
        return m, params_rule(hidden, m, layers)
    return answer


_PI = lambda h: math.ceil(h * math.pi / 64) * 64  # noqa: E731


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise 4.x: implement me")


# ----------------------------------------------------------------------------- passes
@pytest.mark.parametrize("check, fn", [
    (ch04.check_silu, silu),
    (ch04.check_silu_grad, silu_grad),
    (ch04.check_swiglu_ffn, swiglu_ffn),
    (ch04.check_swiglu_ffn, lambda x, g, u, d: (F.silu(x @ g.T) * (x @ u.T)) @ d.T),
    (ch04.check_intermediate_size, intermediate_size),
    (ch04.check_intermediate_size, lambda h: -(-(8 * h // 3) // 64) * 64),
    (ch04.check_minimind3_ffn, minimind3_ffn),
    (ch04.check_minimind3_ffn, lambda h, n: (int(-(-h * math.pi // 64)) * 64, 3 * h * n * int(-(-h * math.pi // 64)) * 64)),
])
def test_reference_passes(check, fn, capsys):
    check(fn)
    assert capsys.readouterr().out.startswith("✓")


# ----------------------------------------------------------------------------- stubs fail
@pytest.mark.parametrize("check", [ch04.check_silu, ch04.check_silu_grad, ch04.check_swiglu_ffn,
                                   ch04.check_intermediate_size, ch04.check_minimind3_ffn])
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
    (ch04.check_silu, torch.sigmoid, "this looks like the sigmoid alone"),
    (ch04.check_silu, torch.relu, "this looks like ReLU"),
    (ch04.check_silu, F.gelu, "this looks like GELU"),
    (ch04.check_silu, lambda x: x * torch.sigmoid(-x), "this looks like the sign inside the sigmoid flipped"),
    (ch04.check_silu, lambda x: x / (1 + torch.exp(x)), "this looks like the sign inside the sigmoid flipped"),
    (ch04.check_silu, lambda x: (x * torch.sigmoid(x)).float(), "dtype mismatch: expected torch.float64, got torch.float32"),
    (ch04.check_silu, _inplace_silu, "changed its input (argument 1) in place"),
    (ch04.check_silu, lambda x: (x * torch.sigmoid(x)).tolist(), "expected a torch.Tensor"),
    (ch04.check_silu, _silu_exp_form, "this looks like the draft's x / (1 + exp(-x)), whose gradient at x = -90 is NaN"),
    (ch04.check_silu, _silu_exp_form, "the gradient autograd computes through your silu"),
    (ch04.check_silu, _silu_detached, "does not depend on x through autograd"),
    # gradient: forgetting the product rule, the sigmoid's own derivative, the function itself
    (ch04.check_silu_grad, torch.sigmoid, "this looks like the sigmoid alone"),
    (ch04.check_silu_grad, lambda x: torch.sigmoid(x) * (1 - torch.sigmoid(x)), "this looks like the derivative of the sigmoid alone"),
    (ch04.check_silu_grad, F.silu, "this looks like SiLU itself"),
    (ch04.check_silu_grad, lambda x: torch.sigmoid(x) * (1 + x * torch.sigmoid(x)), "this looks like the sigmoid's derivative taken as the sigmoid squared"),
    (ch04.check_silu_grad, lambda x: torch.sigmoid(x) + x * (1 - torch.sigmoid(x)), "this looks like a factor of the sigmoid missing"),
    (ch04.check_silu_grad, _silu_grad_exp_form, "this looks like the derivative written with exponentials"),
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
    (ch04.check_swiglu_ffn, lambda x, g, u, d: (F.silu(x @ g) * (x @ u)) @ d, "print the shapes of x and of w_gate"),
    (ch04.check_swiglu_ffn, _swiglu_in_place, "changed its input (argument 2) in place"),
    # intermediate size: rounding down, to nearest, not at all, a float, 4x, Llama's 256
    (ch04.check_intermediate_size, lambda h: 64 * math.floor(int(8 * h / 3) / 64), "this looks like rounding down"),
    (ch04.check_intermediate_size, lambda h: 64 * round(int(8 * h / 3) / 64), "this looks like rounding to the nearest multiple of 64 instead of up"),
    (ch04.check_intermediate_size, lambda h: int(8 * h / 3), "this looks like eight thirds of the width without rounding"),
    (ch04.check_intermediate_size, lambda h: 64.0 * math.ceil(int(8 * h / 3) / 64), "expected an int"),
    (ch04.check_intermediate_size, lambda h: 4 * h, "this looks like four times the width"),
    (ch04.check_intermediate_size, lambda h: 256 * math.ceil(int(8 * h / 3) / 256), "this looks like rounding up to a multiple of 256"),
    (ch04.check_intermediate_size, lambda h: 64 * math.ceil(4 * h / 3 / 64), "this looks like parity with the two matrices"),
    (ch04.check_intermediate_size, lambda h: 64 * math.ceil(4 * h / 64), "this looks like parity solved for three matrices"),
    # issue 44: the package's rules do not pass the check (the exercise derives the width)
    (ch04.check_intermediate_size, lambda h: mm.MiniMindConfig(hidden_size=h).intermediate_size,
     "Exercise 4.4 asks you to build this without minimind_ref's width rules"),
    (ch04.check_intermediate_size, lambda h: mm.config.default_intermediate_size(h), "derive the width, as the exercise asks"),
    (ch04.check_intermediate_size, lambda h: 64 * (int(8 * h / 3) // 64 + 1), "one multiple of 64 too many"),
    # minimind-3's width and FFN parameters (4.5): the width rule, then the count
    (ch04.check_minimind3_ffn, _pi_ffn(lambda h: math.floor(h * math.pi / 64) * 64), "this looks like rounding h times pi down"),
    (ch04.check_minimind3_ffn, _pi_ffn(lambda h: 64 * (int(h * math.pi) // 64)), "this looks like rounding h times pi down"),
    (ch04.check_minimind3_ffn, _pi_ffn(lambda h: round(h * math.pi / 64) * 64), "this looks like rounding h times pi to the nearest"),
    (ch04.check_minimind3_ffn, _pi_ffn(intermediate_size), "this looks like MiniMind2's 8/3 rule"),
    (ch04.check_minimind3_ffn, _pi_ffn(lambda h: math.ceil(int(math.pi) * h / 64) * 64), "this looks like pi taken as 3"),
    (ch04.check_minimind3_ffn, _pi_ffn(lambda h: math.ceil(h * int(math.pi) / 64) * 64), "this looks like pi taken as 3"),
    (ch04.check_minimind3_ffn, _pi_ffn(lambda h: math.ceil(h * math.pi)), "this looks like h times pi rounded up to a whole number"),
    (ch04.check_minimind3_ffn, _pi_ffn(lambda h: int(h * math.pi)), "this looks like h times pi truncated to a whole number, not rounded up"),
    (ch04.check_minimind3_ffn, _pi_ffn(lambda h: math.ceil(h * 3.14 / 64) * 64), "this looks like pi approximated as 3.14:"),
    # issue 37: truncating h * pi to an int before rounding up is named as such, not as "pi approximated as 3.14"
    (ch04.check_minimind3_ffn, _pi_ffn(lambda h: math.ceil(int(h * math.pi) / 64) * 64),
     "this looks like h times pi truncated to a whole number before rounding up to a multiple of 64"),
    (ch04.check_minimind3_ffn, _pi_ffn(lambda h: math.ceil(h * 3.25 / 64) * 64), "this looks like a multiplier of 3.25"),
    # issue 44: a multiplier of 3.2 was reported as 3.25 (both give 2496 at hidden 768)
    (ch04.check_minimind3_ffn, _pi_ffn(lambda h: math.ceil(h * 3.2 / 64) * 64), "this looks like a multiplier of 3.2 "),
    (ch04.check_minimind3_ffn, _pi_ffn(lambda h: math.ceil(h * 2432 / 768 / 64) * 64),
     "this looks like a multiplier of 2432 / 768"),
    (ch04.check_minimind3_ffn, _pi_ffn(lambda h: math.ceil(h * 3.15 / 64) * 64), "this looks like a constant multiplier between"),
    (ch04.check_minimind3_ffn, _pi_ffn(lambda h: math.ceil(h * 3.142 / 64) * 64), "this looks like pi approximated as 3.142"),
    (ch04.check_minimind3_ffn, _pi_ffn(lambda h: math.ceil(h * 3.1416 / 64) * 64), "this looks like pi approximated as 3.1416"),
    # issue 44: WIDTH_RULES["minimind-3"] (imported by the chapter's setup cell) passed without deriving anything
    (ch04.check_minimind3_ffn, _pi_ffn(lambda h: mm.config.WIDTH_RULES["minimind-3"](h)),
     "Exercise 4.5 asks you to build this without minimind_ref's width rules"),
    (ch04.check_minimind3_ffn, _pi_ffn(lambda h: mm.MiniMindConfig(generation="minimind-3", hidden_size=h).intermediate_size),
     "derive the width, as the exercise asks"),
    (ch04.check_minimind3_ffn, _pi_ffn(lambda h: math.ceil(h * 22 / 7 / 64) * 64), "this looks like pi approximated as 22/7"),
    (ch04.check_minimind3_ffn, _pi_ffn(lambda h: math.ceil(h * math.pi / 64) * 64.0), "expected an int (intermediate_size), got float"),
    (ch04.check_minimind3_ffn, _pi_ffn(_PI, lambda h, m, n: 2 * h * m * n), "this looks like two matrices per layer"),
    (ch04.check_minimind3_ffn, _pi_ffn(_PI, lambda h, m, n: 3 * h * m), "this looks like one layer's FFN only"),
    (ch04.check_minimind3_ffn, _pi_ffn(_PI, lambda h, m, n: h * m * n), "this looks like one matrix per layer"),
    (ch04.check_minimind3_ffn, _pi_ffn(_PI, lambda h, m, n: (3 * h * m + 2 * m + h) * n), "this looks like a bias on every matrix"),
    # at hidden 768, 8h/3 = 2048 exactly, so 8 h^2 per layer is the 8/3 width's count there; over every width only
    # the 4x FFN explains it, and that is the name it gets
    (ch04.check_minimind3_ffn, _pi_ffn(_PI, lambda h, m, n: 8 * h * h * n), "this looks like the 4x-wide two-matrix FFN"),
    (ch04.check_minimind3_ffn, _pi_ffn(_PI, lambda h, m, n: 3 * h * intermediate_size(h) * n),
     "this looks like the parameters of MiniMind2's 8/3 width"),
    (ch04.check_minimind3_ffn, _pi_ffn(_PI, lambda h, m, n: 3.0 * h * m * n), "expected an int (ffn_parameters), got float"),
    (ch04.check_minimind3_ffn, lambda h, n: _PI(h), "expected a pair (intermediate_size, ffn_parameters)"),
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
    assert "got 1,344 (on hidden_size=512), which is not the reference's: yours is smaller" in text and "hint:" in text
    assert "1408" not in text and "1,408" not in text, "4.4 hides the expected width (a closed form of hidden_size)"
    assert text.index("this looks like") < text.index("hint:") < text.index('show_solution("4.4")')
    assert "math.ceil" not in text, "the solution (math.ceil) is shown only on request"


def test_width_rules_come_back_after_a_check():
    """The checks of 4.4 and 4.5 switch the package's width rules off only while the learner's function runs."""
    from minimind_ref import config

    rules = dict(config.WIDTH_RULES)
    with pytest.raises(AssertionError):
        ch04.check_minimind3_ffn(lambda h, n: (config.WIDTH_RULES["minimind-3"](h), 0))
    assert config.WIDTH_RULES == rules
    assert config.default_intermediate_size(512) == 1408 and config.minimind3_intermediate_size(768) == 2432
    assert mm.MiniMindConfig(generation="minimind-3", hidden_size=768).intermediate_size == 2432



# ----------------------------------------------------------------------------- issue 44, second probe: planted mistakes
def _silu_exp_up(x):  # NaN value at +100 (e^100 overflows)
    return x * torch.exp(x) / (1 + torch.exp(x))


def _silu_two_branch(x):  # the "stable" two-branch form: the branch torch.where does not pick still overflows
    return torch.where(x >= 0, x / (1 + torch.exp(-x)), x * torch.exp(x) / (1 + torch.exp(x)))


def _swiglu_draft(x, g, u, d):  # the notebook's draft: section 3's formula as for one column vector
    return d @ (F.silu(g @ x) * (u @ x))


def _swiglu_draft_batched(x, g, u, d):  # the draft, made to run on batches by moving the token axis: still wrong
    if x.dim() == 1:
        return _swiglu_draft(x, g, u, d)
    return _swiglu_draft(x.reshape(-1, x.shape[-1]).T, g, u, d).T.reshape(*x.shape[:-1], d.shape[0])


PROBE = [
    (ch04.check_silu, _silu_exp_up, "this looks like the sigmoid written with e^x over 1 + e^x"),
    (ch04.check_silu, _silu_two_branch, "print each intermediate result of both branches at x = -90 and x = 90"),
    (ch04.check_silu, F.silu, "Exercise 4.1 asks you to build this without torch.nn.functional.silu"),
    (ch04.check_silu, lambda x: F.silu(x), "without torch.nn.functional.silu"),
    (ch04.check_silu, torch.nn.SiLU(), "without torch.nn.SiLU"),
    (ch04.check_silu_grad, lambda x: torch.autograd.grad(F.silu(x.detach().requires_grad_()).sum(), x)[0],
     "Exercise 4.2 asks you to build this without autograd"),
    (ch04.check_silu_grad, _dsilu_backward := (lambda x: (lambda xr: (F.silu(xr).sum().backward(), xr.grad)[1])(
        x.detach().clone().requires_grad_())), "without autograd"),
    (ch04.check_swiglu_ffn, _swiglu_draft, "raised RuntimeError"),
    (ch04.check_swiglu_ffn, lambda x, g, u, d: _swiglu_draft(x.T, g, u, d).T if x.dim() == 2 else _swiglu_draft(x, g, u, d),
     "raised RuntimeError"),
    (ch04.check_swiglu_ffn, lambda x, g, u, d: mm.FeedForward(mm.MiniMindConfig(
        hidden_size=g.shape[1], intermediate_size=g.shape[0], num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=1, vocab_size=8))(x), "Exercise 4.3 asks you to build this without minimind_ref.FeedForward"),
]


@pytest.mark.parametrize("check, fn, message", PROBE, ids=[f"{c.__name__}-{m[:40]}" for c, _, m in PROBE])
def test_ch04_names_the_probes_mistakes(check, fn, message):
    text = str(pytest.raises(AssertionError, check, fn).value)
    assert message in text, text


def test_swiglu_names_weights_applied_from_the_left_where_they_run():
    def left_where_square(x, g, u, d):  # w @ x where the shapes allow it, the right answer elsewhere
        if x.dim() == 2 and x.shape[0] == x.shape[1]:
            return _swiglu_draft(x, g, u, d)
        return swiglu_ffn(x, g, u, d)
    text = str(pytest.raises(AssertionError, ch04.check_swiglu_ffn, left_where_square).value)
    assert "this looks like the weights applied from the left, as to one column vector" in text, text


def test_width_rules_imported_by_name_at_a_notebooks_top_level_are_switched_off():
    """The probe's bypass: cell 31 of the chapter imports default_intermediate_size by name."""
    namespace = {}
    exec("from minimind_ref.config import default_intermediate_size, minimind3_intermediate_size\n"
         "def intermediate_size(h):\n    return default_intermediate_size(h)\n"
         "def minimind3_ffn(h, n):\n    m = minimind3_intermediate_size(h)\n    return m, 3 * h * m * n\n", namespace)
    for check, fn in [(ch04.check_intermediate_size, namespace["intermediate_size"]),
                      (ch04.check_minimind3_ffn, namespace["minimind3_ffn"])]:
        text = str(pytest.raises(AssertionError, check, fn).value)
        assert "without minimind_ref's width rules" in text, text
    assert namespace["default_intermediate_size"](512) == 1408, "the rule is back after the check"


def test_silu_grad_pass_message_does_not_print_the_formula(capsys):
    ch04.check_silu_grad(silu_grad)
    out = capsys.readouterr().out
    assert "(1 - s)" not in out and "1 + x" not in out, out


def test_ch04_names_the_probes_generic_ones():
    for check, fn, message in [
        (ch04.check_silu, _silu_two_branch, "this looks like two formulas joined by torch.where"),
        (ch04.check_silu_grad, lambda x: x * torch.sigmoid(x) * (1 - torch.sigmoid(x)),
         "this looks like the product rule's first term left out"),
        (ch04.check_silu_grad, lambda x: torch.sigmoid(x) * (1 - x * (1 - torch.sigmoid(x))),
         "this looks like the sign of the product rule's second term flipped"),
        (ch04.check_swiglu_ffn, lambda x, g, u, d: (F.silu(x @ g) * (x @ u)) @ d,
         "this looks like the weights multiplied as if stored [in_features, out_features]"),
        (ch04.check_swiglu_ffn, lambda x, g, u, d: (F.silu(x @ g.T) * (x @ u.T)) @ d,
         "this looks like w_down multiplied as if stored [in_features, out_features]"),
        (ch04.check_swiglu_ffn, _swiglu_draft, "this looks like the weights applied from the left"),
        (ch04.check_swiglu_ffn, lambda x, g, u, d: (d @ (F.silu(g @ x.T) * (u @ x.T))).T,
         "this looks like x turned with .T to apply the weights from the left"),
        (ch04.check_intermediate_size, lambda h: 64 * math.ceil(8 * h / 3) // 64,
         "this looks like eight thirds of the width rounded up to a whole number"),
    ]:
        text = str(pytest.raises(AssertionError, check, fn).value)
        assert message in text, text
