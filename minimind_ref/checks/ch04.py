"""Checks for chapter 04 · Feed-forward (SwiGLU).

Each ``check_*`` runs the learner's function on inputs it makes itself (with its own random
generator, so the notebook's random stream is untouched), compares with PyTorch or
``minimind_ref`` and prints one ``✓`` line, or raises ``AssertionError`` saying on which input it
failed, which known mistake the result matches (computed on the same input), a hint about it,
and the line that says how to see a worked solution last.

    from minimind_ref.checks import ch04
    ch04.check_silu(silu)
    ch04.check_silu_grad(silu_grad)
    ch04.check_swiglu_ffn(swiglu_ffn)
    ch04.check_intermediate_size(intermediate_size)
"""

from __future__ import annotations

import math
import operator
from typing import Callable, Dict

import torch
import torch.nn.functional as F

from ..config import MiniMindConfig, default_intermediate_size
from ..ffn import FeedForward
from .core import call, check, check_close, check_equal, fail, seeded, solution

__all__ = ["check_silu", "check_silu_grad", "check_swiglu_ffn", "check_intermediate_size"]


def _inputs(seed: int):
    g = seeded(seed)
    edge = torch.tensor([0.0, 1.0, -1.0, -1.2785, 3.0, -3.0, 20.0, -20.0, 100.0, -100.0])
    return [
        ("random values [5, 7]", torch.randn(5, 7, generator=g) * 3),
        ("a batch of vectors [2, 3, 16]", torch.randn(2, 3, 16, generator=g)),
        ("the float32 values 0, ±1, ±3, ±20, ±100 and -1.2785 (near the minimum)", edge),
        ("float64 input", torch.randn(6, generator=g, dtype=torch.float64) * 4),
    ]


# ----------------------------------------------------------------------------- 4.1 SiLU
def _silu_mistakes(x: torch.Tensor) -> Dict[str, Callable[[], torch.Tensor]]:
    return {
        "sigmoid(x) alone (SiLU multiplies it by x)": lambda: torch.sigmoid(x),
        "ReLU (SiLU is smooth and slightly negative for x < 0)": lambda: torch.relu(x),
        "GELU (x * Phi(x), a different gate)": lambda: F.gelu(x),
        "x * sigmoid(-x) (the sign inside the sigmoid)": lambda: x * torch.sigmoid(-x),
        "x * (1 - sigmoid(x))": lambda: x * (1 - torch.sigmoid(x)),
    }


def _grad_at(fn_out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    (grad,) = torch.autograd.grad(fn_out.sum(), x)
    return grad


def _exp_form_grad(x: torch.Tensor) -> torch.Tensor:
    xr = x.clone().requires_grad_(True)
    return _grad_at(xr / (1 + torch.exp(-xr)), xr)


solution("4.1", "return x * torch.sigmoid(x)")


@check("Exercise 4.1 silu")
def check_silu(fn: Callable[[torch.Tensor], torch.Tensor]) -> str:
    """``fn(x)`` must equal ``F.silu(x)`` = x * sigmoid(x), elementwise, keeping shape and dtype,
    without changing ``x``; and autograd must differentiate it as it does ``F.silu`` (finite
    gradients at ±100 in float32)."""
    name = "Exercise 4.1 silu"
    hint = ("SiLU is x times the sigmoid of x: a soft switch, close to x for large x and close to 0 (slightly "
            "negative) for very negative x.")
    for label, x in _inputs(401):
        got = call(fn, x, name=name, case=label, check_inputs=True,
                   hint="x can have any shape; torch functions such as torch.sigmoid and torch.exp work elementwise.")
        check_close(got, F.silu(x), name=name, case=label, hint=hint, mistakes=_silu_mistakes(x))
    # The gradient through the learner's function: a formula can be right in value and still give
    # autograd an inf / inf (x / (1 + exp(-x)) at x = -100 in float32: exp(100) overflows).
    for label, x in _inputs(401)[2:3]:
        xr = x.clone().requires_grad_(True)
        expected = _grad_at(F.silu(xr), xr)
        xg = x.clone().requires_grad_(True)
        out = call(fn, xg, name=name, case=f"{label}, with requires_grad")
        if not isinstance(out, torch.Tensor) or not out.requires_grad:
            fail(name, f"the result does not depend on x through autograd (on {label}, with requires_grad): "
                 "a model could not learn through it", "compute with torch operations on x (no .detach(), .item() "
                 "or numpy), so that the gradient flows.")
        got_grad = _grad_at(out, xg)
        check_close(got_grad, expected, name=name, case=f"the gradient autograd computes through your silu, {label}",
                    hint=("the value is right but its gradient is not: the formula overflows inside, e.g. exp(-x) is "
                          "inf at x = -100 in float32, and autograd then computes inf / inf = NaN. torch.sigmoid is "
                          "written to avoid that."),
                    mistakes={"x / (1 + exp(-x)), whose gradient at x = -100 is inf / inf = NaN in float32":
                              lambda: _exp_form_grad(x)})
    return "x * sigmoid(x), shape and dtype kept, finite value and gradient at ±100"


# ----------------------------------------------------------------------------- 4.2 SiLU gradient
def _silu_grad_mistakes(x: torch.Tensor) -> Dict[str, Callable[[], torch.Tensor]]:
    s = torch.sigmoid(x)
    return {
        "sigmoid(x) alone (the product rule's second term, x * sigmoid'(x), is missing)": lambda: s,
        "sigmoid'(x) = s * (1 - s) alone (the derivative of the sigmoid, not of x * sigmoid(x))": lambda: s * (1 - s),
        "SiLU itself (x * sigmoid(x)), not its derivative": lambda: x * s,
        "s + x * s * s (sigmoid'(x) is s * (1 - s), not s * s)": lambda: s + x * s * s,
        "s + x * (1 - s) (a factor s missing in the second term)": lambda: s + x * (1 - s),
        "1 + x * s * (1 - s) (the first term should be s, not 1)": lambda: 1 + x * s * (1 - s),
        "(1 + e + x e) / (1 + e)**2 with e = exp(-x): right on paper, but inf / inf = NaN at x = -100 in float32 "
        "(exp(100) overflows); write it with torch.sigmoid":
            lambda: (1 + torch.exp(-x) + x * torch.exp(-x)) / (1 + torch.exp(-x)) ** 2,
    }


solution("4.2", "s = torch.sigmoid(x); return s * (1 + x * (1 - s))   # = s + x * s * (1 - s)")


@check("Exercise 4.2 silu_grad")
def check_silu_grad(fn: Callable[[torch.Tensor], torch.Tensor]) -> str:
    """``fn(x)`` must equal d silu / dx, as autograd computes it, and leave ``x`` unchanged."""
    name = "Exercise 4.2 silu_grad"
    hint = ("SiLU is a product, x times sigmoid(x): differentiate it with the product rule, and write the sigmoid's "
            "own derivative in terms of the sigmoid. The result is 0.5 at x = 0 and close to 1 for large x.")
    for label, x in _inputs(402):
        xr = x.clone().requires_grad_(True)
        expected = _grad_at(F.silu(xr), xr)
        got = call(fn, x, name=name, case=label, check_inputs=True,
                   hint="compute the derivative with tensor operations on x (no autograd needed).")
        check_close(got, expected, name=name, case=label, hint=hint, mistakes=_silu_grad_mistakes(x))
    return "s * (1 + x * (1 - s)) equals autograd's gradient"


# ----------------------------------------------------------------------------- 4.3 SwiGLU forward
def _swiglu_mistakes(x, w_gate, w_up, w_down) -> Dict[str, Callable[[], torch.Tensor]]:
    def lin(v, w):
        return F.linear(v, w)

    return {
        "gate and up swapped (SiLU on x @ w_up.T)": lambda: lin(F.silu(lin(x, w_up)) * lin(x, w_gate), w_down),
        "SiLU on both branches (the up branch stays linear)":
            lambda: lin(F.silu(lin(x, w_gate)) * F.silu(lin(x, w_up)), w_down),
        "no activation (a bilinear FFN: SiLU belongs on the gate branch)": lambda: lin(lin(x, w_gate) * lin(x, w_up), w_down),
        "ReLU instead of SiLU on the gate": lambda: lin(F.relu(lin(x, w_gate)) * lin(x, w_up), w_down),
        "SiLU applied to the product instead of the gate": lambda: lin(F.silu(lin(x, w_gate) * lin(x, w_up)), w_down),
        "the up branch left out (down(silu(gate(x))))": lambda: lin(F.silu(lin(x, w_gate)), w_down),
        "the gate branch left out (down(silu(up(x))))": lambda: lin(F.silu(lin(x, w_up)), w_down),
        "the two branches added instead of multiplied": lambda: lin(F.silu(lin(x, w_gate)) + lin(x, w_up), w_down),
        "the down projection left out": lambda: F.silu(lin(x, w_gate)) * lin(x, w_up),
    }


solution("4.3", "return (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T   # or F.linear(x, w) for x @ w.T")


@check("Exercise 4.3 swiglu_ffn")
def check_swiglu_ffn(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(x, w_gate, w_up, w_down)`` must equal ``minimind_ref.FeedForward`` with those weights.

    Weights use ``nn.Linear``'s layout ``[out_features, in_features]``: ``w_gate`` and ``w_up`` are
    ``[intermediate, hidden]``, ``w_down`` is ``[hidden, intermediate]``.
    """
    name = "Exercise 4.3 swiglu_ffn"
    g = seeded(403)
    hint = ("two projections of the same x to the intermediate width, a gate (through SiLU) and an up branch (no "
            "activation), multiplied elementwise, then projected back down to hidden.")
    crash = ("the weights are in nn.Linear's layout [out_features, in_features]: w_gate and w_up are [intermediate, "
             "hidden], so x [..., hidden] times a weight needs the transpose (x @ w.T, or F.linear(x, w)).")
    for hidden, inter, shape in [(32, 96, (2, 5)), (48, 128, (7,)), (16, 64, ())]:
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
        got = call(fn, x, w_gate, w_up, w_down, name=name, case=case, hint=crash, check_inputs=True)
        check_close(got, expected, name=name, case=case, hint=hint,
                    mistakes=_swiglu_mistakes(x, w_gate, w_up, w_down))
    return "equals minimind_ref.FeedForward for 1-D, 2-D and 3-D inputs"


# ----------------------------------------------------------------------------- 4.4 intermediate size
def _size_mistakes(h: int) -> Dict[str, int]:
    base = int(8 * h / 3)
    return {
        "rounding down to a multiple of 64 (// 64, math.floor, or round() for this width) instead of up": 64 * (base // 64),
        "rounding to the nearest multiple of 64 instead of up": 64 * round(base / 64),
        "8h/3 without rounding to a multiple of 64": base,
        "4h (the classic FFN width; SwiGLU's three matrices need 8h/3 for the same parameters)": 4 * h,
        "rounding up to a multiple of 256 (Llama's multiple_of) instead of 64": 256 * math.ceil(base / 256),
        "8h/3 rounded up to a multiple of 64 plus one more 64 (ceil of an exact multiple)": 64 * (base // 64 + 1),
    }


solution("4.4", "return 64 * math.ceil(int(8 * hidden_size / 3) / 64)")


@check("Exercise 4.4 intermediate_size")
def check_intermediate_size(fn: Callable[[int], int]) -> str:
    """``fn(hidden_size)`` must equal ``minimind_ref.config.default_intermediate_size``."""
    name = "Exercise 4.4 intermediate_size"
    hint = ("take 8/3 of the width, drop the fraction, then round UP to the next multiple of 64; a width that is "
            "already a multiple of 64 stays as it is (768 -> 2048).")
    sizes = [512, 640, 768, 24, 48, 64, 96, 100, 128, 200, 256, 1024, 2048, 4096] + list(range(8, 1025, 8))
    for h in sizes:
        case = f"hidden_size={h}"
        got = call(fn, h, name=name, case=case, hint="hidden_size is a Python int.")
        if isinstance(got, bool) or not isinstance(got, int):
            try:
                got = operator.index(got)
            except TypeError:
                fail(name, f"expected an int for hidden_size={h}, got {type(got).__name__} {got!r}",
                     "math.ceil returns an int; wrap a float result in int(...).")
        check_equal(got, default_intermediate_size(h), name=name, case=case, hint=hint,
                    mistakes=_size_mistakes(h))
    return f"matches the 8/3-rounded-up-to-64 rule for {len(sizes)} widths (512 -> 1408, 640 -> 1728, 768 -> 2048)"
