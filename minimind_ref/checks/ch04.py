"""Checks for chapter 04 · Feed-forward (SwiGLU).

Each check compares the learner's function with PyTorch (``F.silu``, autograd) and ``minimind_ref``
(``FeedForward``, ``default_intermediate_size``) on inputs it makes itself, and reports as
``minimind_ref.checks`` describes.

    from minimind_ref.checks import ch04
    ch04.check_silu(silu)
    ch04.check_silu_grad(silu_grad)
    ch04.check_swiglu_ffn(swiglu_ffn)
    ch04.check_intermediate_size(intermediate_size)
    ch04.check_minimind3_ffn(minimind3_ffn)
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

from ..config import MiniMindConfig, default_intermediate_size
from ..ffn import FeedForward
from .core import Outcome, Shortcut, as_number, call, check, check_close, check_numbers, fail, refused, seeded, solution

__all__ = ["check_silu", "check_silu_grad", "check_swiglu_ffn", "check_intermediate_size", "check_minimind3_ffn"]


def _inputs(seed: int):
    g = seeded(seed)
    edge = torch.tensor([0.0, 1.0, -1.0, -1.2785, 3.0, -3.0, 20.0, -20.0, 90.0, -90.0])
    return [
        ("random values [5, 7]", torch.randn(5, 7, generator=g) * 3),
        ("a batch of vectors [2, 3, 16]", torch.randn(2, 3, 16, generator=g)),
        ("the float32 values 0, ±1, ±3, ±20, ±90 and -1.2785 (near the minimum)", edge),
        ("float64 input", torch.randn(6, generator=g, dtype=torch.float64) * 4),
    ]


# ----------------------------------------------------------------------------- the package's width rules, switched off
def _width_rules_refused(name: str, fn: Callable[..., object]):
    """While the learner's function runs, ``minimind_ref``'s width rules refuse (``core.refused``): the exercise
    asks for the rule to be derived, and ``MiniMindConfig(...).intermediate_size``, ``config.WIDTH_RULES`` or
    ``config.default_intermediate_size`` would hand it over, also when imported by name before the check runs."""
    from .. import config

    return refused(name, fn, [Shortcut("minimind_ref's width rules", (config, "default_intermediate_size"),
                                       (config, "minimind3_intermediate_size"))],
                   "derive the width, as the exercise asks: MiniMindConfig's intermediate_size, WIDTH_RULES and their "
                   "functions are the reference the check compares with.")


_SILU_SHORTCUTS = [Shortcut("torch.nn.functional.silu", (F, "silu")), Shortcut("torch.nn.SiLU", (torch.nn.SiLU, "forward"))]


def _autograd_shortcuts() -> list:
    places = [(torch.autograd, "grad"), (torch.autograd, "backward"), (torch.Tensor, "backward")]
    func = getattr(torch, "func", None)
    if func is not None:
        places += [(func, n) for n in ("grad", "grad_and_value", "vjp", "jvp", "jacrev", "jacfwd", "hessian")
                   if hasattr(func, n)]
    functional = getattr(torch.autograd, "functional", None)
    if functional is not None:
        places += [(functional, n) for n in ("jacobian", "vjp", "jvp", "vhp", "hvp", "hessian") if hasattr(functional, n)]
    return [Shortcut("autograd", *places)]


# ----------------------------------------------------------------------------- 4.1 SiLU
def _silu_mistakes(x: torch.Tensor) -> Dict[str, Callable[[], torch.Tensor]]:
    return {
        "the sigmoid alone (not multiplied by x)": lambda: torch.sigmoid(x),
        "ReLU (SiLU is smooth and slightly negative for x < 0)": lambda: torch.relu(x),
        "GELU (x * Phi(x), a different gate)": lambda: F.gelu(x),
        "the sign inside the sigmoid flipped": lambda: x * torch.sigmoid(-x),
        "x times one minus the sigmoid": lambda: x * (1 - torch.sigmoid(x)),
        _SILU_EXP_UP: lambda: x * torch.exp(x) / (1 + torch.exp(x)),
    }


_SILU_EXP_UP = ("the sigmoid written with e^x over 1 + e^x: e^x overflows to inf for large positive x in float32, and "
                "inf / inf is NaN")
_SILU_DRAFT = "the draft's x / (1 + exp(-x)), whose gradient at x = -90 is NaN in float32"
_SILU_WHERE = ("two formulas joined by torch.where, each safe on its own side: autograd differentiates both branches "
               "everywhere, and the one torch.where does not pick overflows there")
_SILU_HINTS = {
    _SILU_WHERE: ("print each intermediate result of both branches at x = -90 and x = 90: which one overflows, and "
                  "does torch.where keep its gradient out?"),
    _SILU_EXP_UP: "print each intermediate result of your formula at the largest input the case names: which one "
                  "overflows?",
    _SILU_DRAFT: ("print each intermediate result of the draft at x = -90: one overflows to inf, and autograd "
                  "multiplies it by a zero on the way back."),
}


def _grad_at(fn_out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    (grad,) = torch.autograd.grad(fn_out.sum(), x)
    return grad


def _exp_form_grad(x: torch.Tensor) -> torch.Tensor:
    xr = x.clone().requires_grad_(True)
    return _grad_at(xr / (1 + torch.exp(-xr)), xr)


def _two_branch_grad(x: torch.Tensor) -> torch.Tensor:
    xr = x.clone().requires_grad_(True)
    return _grad_at(torch.where(xr >= 0, xr / (1 + torch.exp(-xr)), xr * torch.exp(xr) / (1 + torch.exp(xr))), xr)


solution("4.1", "return x * torch.sigmoid(x)")


@check("Exercise 4.1 silu", shown=False,
       why="the edge case names its inputs (0, 1, -1, ...): SiLU's value at a named input is the formula evaluated "
           "there")
def check_silu(fn: Callable[[torch.Tensor], torch.Tensor]) -> str:
    """``fn(x)`` must equal ``F.silu(x)`` = x * sigmoid(x), elementwise, keeping shape and dtype,
    without changing ``x``; and autograd must differentiate it as it does ``F.silu`` (finite
    gradients at ±90 in float32, where e^90 overflows). ``F.silu`` and ``nn.SiLU`` are switched off while ``fn`` runs."""
    name = "Exercise 4.1 silu"
    hint = ("compare with SiLU's definition in section 2's table and its shape in the figure: its value at 0, for "
            "large positive x (close to x) and for very negative x (close to 0, slightly negative).")
    refuse_hint = "write SiLU with tensor operations; F.silu is the reference the check compares with."
    for label, x in _inputs(401):
        with refused(name, fn, _SILU_SHORTCUTS, refuse_hint):
            got = call(fn, x, name=name, case=label, check_inputs=True,
                       hint="x can have any shape; torch functions such as torch.sigmoid and torch.exp work elementwise.")
        check_close(got, F.silu(x), name=name, case=label, hint=hint, mistakes=_silu_mistakes(x),
                    mistake_hints=_SILU_HINTS)
    # The gradient through the learner's function: a formula can be right in value and still give
    # autograd an inf / inf (x / (1 + exp(-x)) at x = -90 in float32: exp(90) overflows).
    for label, x in _inputs(401)[2:3]:
        xr = x.clone().requires_grad_(True)
        expected = _grad_at(F.silu(xr), xr)
        xg = x.clone().requires_grad_(True)
        with refused(name, fn, _SILU_SHORTCUTS, refuse_hint):
            out = call(fn, xg, name=name, case=f"{label}, with requires_grad")
        if not isinstance(out, torch.Tensor) or not out.requires_grad:
            fail(name, f"the result does not depend on x through autograd (on {label}, with requires_grad): "
                 "a model could not learn through it", "compute with torch operations on x (no .detach(), .item() "
                 "or numpy), so that the gradient flows.")
        got_grad = _grad_at(out, xg)
        bad = [float(v) for v, gr in zip(x.tolist(), got_grad.tolist()) if not math.isfinite(gr)]
        where = " and ".join(f"x = {v:g}" for v in sorted(set(bad))) or "some inputs"
        check_close(got_grad, expected, name=name, case=f"the gradient autograd computes through your silu, {label}",
                    hint=(f"the values are right but the gradient is not finite at {where}: autograd differentiates "
                          "every intermediate result of your formula (in a branch torch.where does not pick, too): "
                          "print them there and find the one that overflows to inf."),
                    mistakes={_SILU_DRAFT: lambda: _exp_form_grad(x), _SILU_WHERE: lambda: _two_branch_grad(x)},
                    mistake_hints=_SILU_HINTS)
    return "shape and dtype kept, finite value and gradient at ±90"


# ----------------------------------------------------------------------------- 4.2 SiLU gradient
def _silu_grad_mistakes(x: torch.Tensor) -> Dict[str, Callable[[], torch.Tensor]]:
    s = torch.sigmoid(x)
    return {
        "the sigmoid alone (the product rule's second term is missing)": lambda: s,
        "the derivative of the sigmoid alone (not of x times the sigmoid)": lambda: s * (1 - s),
        "SiLU itself, not its derivative": lambda: x * s,
        "the sigmoid's derivative taken as the sigmoid squared": lambda: s + x * s * s,
        "a factor of the sigmoid missing in the product rule's second term": lambda: s + x * (1 - s),
        "the product rule's first term taken as 1 instead of the sigmoid": lambda: 1 + x * s * (1 - s),
        "the product rule's first term left out (only x times the sigmoid's derivative)": lambda: x * s * (1 - s),
        "the sign of the product rule's second term flipped": lambda: s * (1 - x * (1 - s)),
        "the derivative written with exponentials: right on paper, but inf / inf = NaN at x = -90 in float32 "
        "(the exponential of 90 overflows); write it with the sigmoid":
            lambda: (1 + torch.exp(-x) + x * torch.exp(-x)) / (1 + torch.exp(-x)) ** 2,
    }


solution("4.2", "s = torch.sigmoid(x); return s * (1 + x * (1 - s))   # = s + x * s * (1 - s)")


@check("Exercise 4.2 silu_grad", shown=False,
       why="the edge case names its inputs: the derivative's value at a named input is the formula evaluated there")
def check_silu_grad(fn: Callable[[torch.Tensor], torch.Tensor]) -> str:
    """``fn(x)`` must equal d silu / dx, as autograd computes it, and leave ``x`` unchanged; autograd is switched off
    while ``fn`` runs."""
    name = "Exercise 4.2 silu_grad"
    hint = ("SiLU is a product of x and the sigmoid of x: differentiate it with the product rule, and write the "
            "sigmoid's own derivative in terms of the sigmoid. The result is 0.5 at x = 0 and close to 1 for large x.")
    for label, x in _inputs(402):
        xr = x.clone().requires_grad_(True)
        expected = _grad_at(F.silu(xr), xr)
        with refused(name, fn, _autograd_shortcuts(), "derive the derivative on paper, as the exercise asks, and write "
                     "the formula with tensor operations; autograd is the reference the check compares with."):
            got = call(fn, x, name=name, case=label, check_inputs=True,
                       hint="compute the derivative with tensor operations on x (no autograd needed).")
        check_close(got, expected, name=name, case=label, hint=hint, mistakes=_silu_grad_mistakes(x))
    return "equals autograd's gradient, finite at ±90"


# ----------------------------------------------------------------------------- 4.3 SwiGLU forward
def _swiglu_mistakes(x, w_gate, w_up, w_down) -> Dict[str, Callable[[], torch.Tensor]]:
    def lin(v, w):
        return F.linear(v, w)

    return {
        "gate and up swapped (SiLU on the up branch)": lambda: lin(F.silu(lin(x, w_up)) * lin(x, w_gate), w_down),
        "SiLU on both branches (the up branch stays linear)":
            lambda: lin(F.silu(lin(x, w_gate)) * F.silu(lin(x, w_up)), w_down),
        "no activation (a bilinear FFN: SiLU belongs on the gate branch)": lambda: lin(lin(x, w_gate) * lin(x, w_up), w_down),
        "ReLU instead of SiLU on the gate": lambda: lin(F.relu(lin(x, w_gate)) * lin(x, w_up), w_down),
        "SiLU applied to the product instead of the gate": lambda: lin(F.silu(lin(x, w_gate) * lin(x, w_up)), w_down),
        "the up branch left out (only the gate, through SiLU, projected down)": lambda: lin(F.silu(lin(x, w_gate)), w_down),
        "the gate branch left out (only the up branch, through SiLU, projected down)":
            lambda: lin(F.silu(lin(x, w_up)), w_down),
        "the two branches added instead of multiplied": lambda: lin(F.silu(lin(x, w_gate)) + lin(x, w_up), w_down),
        "the down projection left out": lambda: F.silu(lin(x, w_gate)) * lin(x, w_up),
        _FFN_LEFT: lambda: w_down @ (F.silu(w_gate @ x) * (w_up @ x)),
    }


_FFN_LEFT = ("the weights applied from the left, as to one column vector: with a batch of as many tokens as features "
             "it runs, and mixes the tokens")
_FFN_IN_OUT = ("the weights multiplied as if stored [in_features, out_features] (nn.Linear stores [out_features, "
               "in_features])")
_FFN_DOT_T = ("x turned with .T to apply the weights from the left: .T reverses every axis, which transposes a batch "
              "of tokens only when it has two axes")
_FFN_DOWN = "w_down multiplied as if stored [in_features, out_features], the other two right"
_FFN_HINTS = {
    _FFN_IN_OUT: "print the shapes of x and of w_gate for this case: which axis of each must meet in the product?",
    _FFN_DOWN: "print the shapes of the gated product and of w_down for this case: which axes must meet?",
    _FFN_DOT_T: ("this case has more than one leading axis: print the shape of x turned your way, then ask which "
                 "product applies the weights to the last axis of x whatever comes before it."),
    _FFN_LEFT: ("this case holds several tokens, one per row of x: which numbers does your product combine, and which "
                "product gives every token its own row of m values?"),
    "gate and up swapped (SiLU on the up branch)": "section 3's formula names the branch that goes through SiLU.",
}


solution("4.3", "return (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T   # or F.linear(x, w) for x @ w.T")


@check("Exercise 4.3 swiglu_ffn", shown=True, why="one entry of the FFN's output on random weights and inputs")
def check_swiglu_ffn(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(x, w_gate, w_up, w_down)`` must equal ``minimind_ref.FeedForward`` with those weights.

    Weights use ``nn.Linear``'s layout ``[out_features, in_features]``: ``w_gate`` and ``w_up`` are
    ``[intermediate, hidden]``, ``w_down`` is ``[hidden, intermediate]``.
    """
    name = "Exercise 4.3 swiglu_ffn"
    g = seeded(403)
    hint = ("compare with section 3's formula: which branch goes through SiLU, how the two branches combine, and the "
            "projection back to hidden.")
    crash = ("the weights are in nn.Linear's layout [out_features, in_features]: w_gate and w_up are [intermediate, "
             "hidden] and x is [..., hidden], one token per row; print the shapes of what your code multiplies for "
             "this case.")
    refuse = [Shortcut("minimind_ref.FeedForward", (FeedForward, "forward"))]
    for hidden, inter, shape in [(32, 96, (2, 5)), (48, 128, (7,)), (16, 64, ()), (16, 48, (16,))]:
        cfg = MiniMindConfig(hidden_size=hidden, intermediate_size=inter, num_attention_heads=4,
                             num_key_value_heads=2, num_hidden_layers=1, vocab_size=32)
        ref = FeedForward(cfg)
        with torch.no_grad():
            for p in ref.parameters():
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
        x = torch.randn(*shape, hidden, generator=g)
        with torch.no_grad():
            expected = ref(x)
        w_gate, w_up, w_down = (ref.gate_proj.weight.detach().clone(), ref.up_proj.weight.detach().clone(),
                                ref.down_proj.weight.detach().clone())
        case = f"x {tuple(x.shape)}, w_gate and w_up {tuple(w_gate.shape)}, w_down {tuple(w_down.shape)}"
        with refused(name, fn, refuse, "write the FFN from its three weight matrices; minimind_ref.FeedForward is the "
                     "reference the check compares with."):
            got = call(fn, x, w_gate, w_up, w_down, name=name, case=case, hint=crash, check_inputs=True,
                       crash_mistakes={_FFN_LEFT: lambda: w_down @ (F.silu(w_gate @ x) * (w_up @ x)),
                                       _FFN_DOT_T: lambda: (w_down @ (F.silu(w_gate @ x.T) * (w_up @ x.T))).T,
                                       _FFN_IN_OUT: lambda: (F.silu(x @ w_gate) * (x @ w_up)) @ w_down,
                                       _FFN_DOWN: lambda: (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down},
                       crash_hints=_FFN_HINTS)
        check_close(got, expected, name=name, case=case, hint=hint, mistake_hints=_FFN_HINTS,
                    mistakes=_swiglu_mistakes(x, w_gate, w_up, w_down))
    return "equals minimind_ref.FeedForward for one token and batches of 1-D, 2-D and 3-D leading shape"


# ----------------------------------------------------------------------------- 4.4 intermediate size
def _size_mistakes(h: int) -> Dict[str, int]:
    base = int(8 * h / 3)
    return {
        "rounding down to a multiple of 64 instead of up": 64 * (base // 64),
        "rounding to the nearest multiple of 64 instead of up": 64 * round(base / 64),
        "eight thirds of the width without rounding to a multiple of 64": base,
        "four times the width (the classic FFN's width; SwiGLU has three matrices, not two)": 4 * h,
        "parity with the two matrices of the 4x FFN counted as one (half its weights)": 64 * math.ceil(4 * h / 3 / 64),
        "parity solved for three matrices of the 4x FFN's width (the 4x FFN has two)": 64 * math.ceil(4 * h / 64),
        "rounding up to a multiple of 256 (Llama's multiple_of) instead of 64": 256 * math.ceil(base / 256),
        "one multiple of 64 too many where the width already is a multiple of 64": 64 * (base // 64 + 1),
        "eight thirds of the width rounded up to a whole number, not to a multiple of 64": math.ceil(8 * h / 3),
    }


solution("4.4", "return 64 * math.ceil(int(8 * hidden_size / 3) / 64)   # parity 3 * h * m = 8 * h * h gives m = 8h/3; "
                "the smallest multiple of 64 at or above it")


@check("Exercise 4.4 intermediate_size", shown=False,
       why="the width is a closed form of hidden_size, which the case names")
def check_intermediate_size(fn: Callable[[int], int]) -> str:
    """``fn(hidden_size)`` must equal ``minimind_ref.config.default_intermediate_size`` (the package's width rules
    are switched off while ``fn`` runs: the exercise derives the width from parameter parity)."""
    name = "Exercise 4.4 intermediate_size"
    hint = ("count the weights of both FFNs without biases (a 4x FFN: two matrices; SwiGLU: three of h x m), ask for "
            "at least the same number, then take the smallest multiple of 64 that satisfies it.")
    sizes = [512, 640, 768, 24, 48, 64, 96, 100, 128, 200, 256, 1024, 2048, 4096] + list(range(8, 1025, 8))
    outcomes = []
    for h in sizes:
        case = f"hidden_size={h}"
        expected = default_intermediate_size(h)
        with _width_rules_refused(name, fn):
            got = call(fn, h, name=name, case=case, hint="hidden_size is a Python int; derive the width from it.")
        got = as_number(got, name, case, integer=True, what="a width")
        outcomes.append(Outcome(case, got, expected, _size_mistakes(h)))
    check_numbers(name, outcomes, hint)
    return f"the smallest multiple of 64 at parity, for {len(sizes)} widths (512 -> 1408, 640 -> 1728, 768 -> 2048)"


# ----------------------------------------------------------------------------- 4.5 minimind-3's width
def _pi_width_mistakes(h: int) -> Dict[str, int]:
    return {
        "h times pi truncated to a whole number before rounding up to a multiple of 64 (a product that lands just "
        "above a multiple of 64 then rounds to that multiple instead of the next one)": math.ceil(int(h * math.pi) / 64) * 64,
        "pi approximated as 3.14": math.ceil(h * 3.14 / 64) * 64,
        "pi approximated as 22/7": math.ceil(h * 22 / 7 / 64) * 64,
        "pi approximated as 3.142": math.ceil(h * 3.142 / 64) * 64,
        "pi approximated as 3.1416": math.ceil(h * 3.1416 / 64) * 64,
        "rounding h times pi to the nearest multiple of 64 instead of up": round(h * math.pi / 64) * 64,
        "rounding h times pi down to a multiple of 64 instead of up": math.floor(h * math.pi / 64) * 64,
        "MiniMind2's 8/3 rule instead of minimind-3's": default_intermediate_size(h),
        "pi taken as 3": math.ceil(3 * h / 64) * 64,
        "h times pi rounded up to a whole number but not to a multiple of 64": math.ceil(h * math.pi),
        "h times pi truncated to a whole number, not rounded up to a multiple of 64": int(h * math.pi),
        "rounding up to a multiple of 256 instead of 64": math.ceil(h * math.pi / 256) * 256,
        "rounding up to a multiple of 128 instead of 64": math.ceil(h * math.pi / 128) * 128,
        "a multiplier of 3.25 (the ratio of one pair, 1664 / 512, not the rule behind all three)":
            math.ceil(h * 3.25 / 64) * 64,
        "a multiplier of 3.2 (the ratio of one pair, 2048 / 640, not the rule behind all three)":
            math.ceil(h * 3.2 / 64) * 64,
        "a multiplier of 2432 / 768 (the ratio of one pair, not the rule behind all three)":
            math.ceil(h * 2432 / 768 / 64) * 64,
    }


def _fitted_multiplier(widths: List[Outcome], hs: List[int]) -> Dict[int, int]:
    """Where the learner's widths are those of one constant multiplier c (rounded up to a multiple of 64) that is
    none of the named ones, the widths that c gives, by hidden size, with c in the description; else {}."""
    lo, hi = 0.0, math.inf
    for o, h in zip(widths, hs):
        w = o.got
        if not isinstance(w, int) or w <= 0 or w % 64:
            return {}
        lo, hi = max(lo, (w - 64) / h), min(hi, w / h)
    if not lo < hi:
        return {}
    c = (lo + hi) / 2
    given = {h: math.ceil(h * c / 64) * 64 for h in hs}
    if any(given[h] != o.got for o, h in zip(widths, hs)):
        return {}
    return given


def _same_width(mistake, got) -> bool:
    return isinstance(mistake, int) and mistake == got


def _ffn_param_mistakes(h: int, m: int, layers: int) -> Dict[str, int]:
    return {
        "two matrices per layer: a SwiGLU FFN has three, gate_proj, up_proj and down_proj": 2 * h * m * layers,
        "one layer's FFN only (a dense model has one FFN in each of its num_hidden_layers blocks)": 3 * h * m,
        "one matrix per layer": h * m * layers,
        "the parameters of MiniMind2's 8/3 width": 3 * h * default_intermediate_size(h) * layers,
        "a bias on every matrix (MiniMind's FFN projections have bias=False)": (3 * h * m + 2 * m + h) * layers,
        "the 4x-wide two-matrix FFN that MiniMind2's 8/3 rule matches, not the pi width": 8 * h * h * layers,
    }


def _ffn_config(h: int, layers: int) -> MiniMindConfig:
    # head_dim is a free field in minimind-3, so any width builds (the FFN does not depend on the heads)
    return MiniMindConfig(generation="minimind-3", hidden_size=h, num_hidden_layers=layers, num_attention_heads=8,
                          num_key_value_heads=4, head_dim=16, vocab_size=64, max_position_embeddings=64)


solution("4.5", "width = math.ceil(hidden_size * math.pi / 64) * 64; "
                "return width, 3 * hidden_size * width * num_hidden_layers")


@check("Exercise 4.5 minimind3_ffn", shown=False,
       why="the width and the count are closed forms of the case's two numbers; section 8 gives three widths to "
           "derive the rule from, the check gives no more")
def check_minimind3_ffn(fn: Callable[[int, int], tuple]) -> str:
    """``fn(hidden_size, num_hidden_layers) -> (intermediate_size, ffn_parameters)`` for a dense
    minimind-3 model: the width ``minimind_ref.config.minimind3_intermediate_size`` gives and the
    FFN parameters counted in the model such a config builds (``minimind_ref.parameter_breakdown``
    for the published and a few other sizes; one ``FeedForward`` per block for a sweep of widths,
    among them widths where h * pi lands less than 1 above a multiple of 64 and where 3.14, 3.142 or 3.1416
    and pi round differently). The package's width rules are switched off while ``fn`` runs: the exercise derives the rule."""
    from ..config import minimind3_intermediate_size
    from ..params import parameter_breakdown

    name = "Exercise 4.5 minimind3_ffn"
    width_hint = ("your rule must give section 8's three widths and every width in between: check at which multiple "
                  "of 64 each one lands, and which way the product is rounded to get there.")
    param_hint = ("count the weights of one FFN from its matrices (how many, of which shape, with or without bias), "
                  "then say how many FFNs a dense model of num_hidden_layers blocks has.")
    models = [(768, 8), (512, 8), (640, 8), (1024, 16), (256, 4), (96, 2), (100, 3), (1080, 2)]
    sweep = [(h, 1) for h in list(range(64, 2049, 64)) + [41, 102, 163, 204, 550, 774, 856, 1528, 1589]
             if h not in (256, 512, 640, 768, 1024)]
    widths, counts = [], []
    for h, layers in models + sweep:
        case = f"hidden_size={h}, num_hidden_layers={layers}"
        with _width_rules_refused(name, fn):
            got = call(fn, h, layers, name=name, case=case, hint="both arguments are Python ints; return a pair of "
                       "ints, derived from them.")
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            fail(name, f"expected a pair (intermediate_size, ffn_parameters), got {type(got).__name__}: {got!r:.80} "
                 f"(on {case})", "return the width and the count together, as a tuple of two ints.")
        width = as_number(got[0], f"{name} (intermediate_size)", case, integer=True, what="intermediate_size")
        params = as_number(got[1], f"{name} (ffn_parameters)", case, integer=True, what="ffn_parameters")
        expected_width = minimind3_intermediate_size(h)
        widths.append(Outcome(case, width, expected_width, _pi_width_mistakes(h)))
        if (h, layers) in models:  # the whole model, counted
            expected_params = parameter_breakdown(_ffn_config(h, layers))["ffn"]
        else:  # one block's FFN, counted, times the blocks
            with torch.device("meta"):
                expected_params = sum(p.numel() for p in FeedForward(_ffn_config(h, layers)).parameters()) * layers
        counts.append(Outcome(case, params, expected_params, _ffn_param_mistakes(h, expected_width, layers)
                              if width == expected_width else {}))
    hs = [h for h, _ in models + sweep]
    named = any(all(_same_width(o.mistakes.get(d), o.got) for o in widths) for d in widths[0].mistakes)
    fitted = {} if named else _fitted_multiplier(widths, hs)
    if fitted:  # a constant that fits the learner's widths: name it, with the constant the widths allow
        lo = max((o.got - 64) / h for o, h in zip(widths, hs))
        hi = min(o.got / h for o, h in zip(widths, hs))
        label = (f"a constant multiplier between {lo:.4f} and {hi:.4f} (rounded up to a multiple of 64): it reproduces "
                 "some of section 8's pairs, but not the rule behind every width")
        for o, h in zip(widths, hs):
            o.mistakes[label] = fitted[h]
    check_numbers(f"{name} (intermediate_size)", widths, width_hint)
    check_numbers(f"{name} (ffn_parameters)", counts, param_hint)
    return (f"minimind-3 (hidden 768, 8 layers): width {widths[0].got}, {counts[0].got:,} FFN parameters; "
            f"{len(widths)} configurations match minimind_ref")
