"""Checks for chapter 04 · Feed-forward (SwiGLU).

Each ``check_*`` runs the learner's function on inputs it makes itself (with its own random
generator, so the notebook's random stream is untouched), compares with PyTorch or
``minimind_ref`` and prints one ``✓`` line, or raises ``AssertionError`` saying what was expected,
what came back and what to try.

    from minimind_ref.checks import ch04
    ch04.check_silu(silu)
    ch04.check_silu_grad(silu_grad)
    ch04.check_swiglu_ffn(swiglu_ffn)
    ch04.check_intermediate_size(intermediate_size)
"""

from __future__ import annotations

import operator
from typing import Callable

import torch
import torch.nn.functional as F

from ..config import MiniMindConfig, default_intermediate_size
from ..ffn import FeedForward
from .core import ExerciseError, call, check, check_close, check_equal, seeded

__all__ = ["check_silu", "check_silu_grad", "check_swiglu_ffn", "check_intermediate_size"]


def _inputs(seed: int):
    g = seeded(seed)
    edge = torch.tensor([0.0, 1.0, -1.0, -1.2785, 3.0, -3.0, 20.0, -20.0, 100.0, -100.0])
    return [
        ("random values [5, 7]", torch.randn(5, 7, generator=g) * 3),
        ("a batch of vectors [2, 3, 16]", torch.randn(2, 3, 16, generator=g)),
        ("edge values 0, ±1, ±3, ±20, ±100 and the minimum near -1.28", edge),
        ("float64 input", torch.randn(6, generator=g, dtype=torch.float64) * 4),
    ]


# ----------------------------------------------------------------------------- 4.1 SiLU
@check("silu")
def check_silu(fn: Callable[[torch.Tensor], torch.Tensor]) -> str:
    """``fn(x)`` must equal ``F.silu(x)`` = x * sigmoid(x), elementwise, keeping shape and dtype."""
    name = "silu"
    for label, x in _inputs(401):
        before = x.clone()
        expected = F.silu(before)
        got = call(fn, x, name=name)
        if isinstance(got, torch.Tensor) and torch.equal(got, torch.sigmoid(x)) and not torch.equal(got, F.silu(x)):
            raise ExerciseError(f"[{name}] you returned sigmoid(x); SiLU multiplies it by x.\n"
                                "  hint: silu(x) = x * sigmoid(x) = x / (1 + exp(-x)).")
        if not torch.equal(x, before):
            raise ExerciseError(f"[{name}] your function changed its input in place.\n"
                                "  hint: build a new tensor (x * torch.sigmoid(x)) instead of x.mul_(...).")
        check_close(got, expected, name=f"{name} ({label})",
                    hint="silu(x) = x * sigmoid(x) = x / (1 + exp(-x)); negative inputs give small "
                         "negative outputs (the minimum is about -0.28 near x = -1.28), not 0 as in ReLU.")
    return "x * sigmoid(x), shape and dtype kept, fine at ±100"


# ----------------------------------------------------------------------------- 4.2 SiLU gradient
@check("silu_grad")
def check_silu_grad(fn: Callable[[torch.Tensor], torch.Tensor]) -> str:
    """``fn(x)`` must equal d silu / dx, as autograd computes it."""
    name = "silu_grad"
    for label, x in _inputs(402):
        xr = x.clone().requires_grad_(True)
        (expected,) = torch.autograd.grad(F.silu(xr).sum(), xr)
        got = call(fn, x.clone(), name=name)
        check_close(got, expected, name=f"{name} ({label})",
                    hint="product rule on x * s with s = sigmoid(x) and ds/dx = s * (1 - s): "
                         "silu'(x) = s + x * s * (1 - s) = s * (1 + x * (1 - s)). It is 0.5 at x = 0, "
                         "slightly above 1 for large x and slightly negative for x below about -1.28.")
    return "s * (1 + x * (1 - s)) equals autograd's gradient"


# ----------------------------------------------------------------------------- 4.3 SwiGLU forward
@check("swiglu_ffn")
def check_swiglu_ffn(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(x, w_gate, w_up, w_down)`` must equal ``minimind_ref.FeedForward`` with those weights.

    Weights use ``nn.Linear``'s layout ``[out_features, in_features]``: ``w_gate`` and ``w_up`` are
    ``[intermediate, hidden]``, ``w_down`` is ``[hidden, intermediate]``.
    """
    name = "swiglu_ffn"
    g = seeded(403)
    hint = ("down( silu(x @ w_gate.T) * (x @ w_up.T) ) with down(z) = z @ w_down.T: the SiLU goes on the "
            "gate branch only, the up branch stays linear, and the product is elementwise.")
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
        got = call(fn, x.clone(), w_gate, w_up, w_down, name=name)
        if isinstance(got, torch.Tensor) and got.shape == expected.shape:
            swapped = F.linear(F.silu(F.linear(x, w_up)) * F.linear(x, w_gate), w_down)
            if torch.allclose(got, swapped, atol=1e-5) and not torch.allclose(got, expected, atol=1e-5):
                raise ExerciseError(f"[{name}] gate and up are swapped: you applied SiLU to x @ w_up.T.\n"
                                    f"  hint: {hint}")
        check_close(got, expected, name=f"{name} (hidden {hidden}, intermediate {inter}, x {tuple(x.shape)})",
                    hint=hint)
    return "equals minimind_ref.FeedForward for 1-D, 2-D and 3-D inputs"


# ----------------------------------------------------------------------------- 4.4 intermediate size
@check("intermediate_size")
def check_intermediate_size(fn: Callable[[int], int]) -> str:
    """``fn(hidden_size)`` must equal ``minimind_ref.config.default_intermediate_size``."""
    name = "intermediate_size"
    hint = ("64 * ceil(int(8 * hidden / 3) / 64): take 8/3 of the width, drop the fraction, then round UP "
            "to the next multiple of 64 (math.ceil, not // or round). For 512: int(1365.33) = 1365 -> 1408.")
    sizes = [512, 640, 768, 24, 48, 64, 96, 100, 128, 200, 256, 1024, 2048, 4096] + list(range(8, 1025, 8))
    for h in sizes:
        got = call(fn, h, name=name)
        if isinstance(got, bool) or not isinstance(got, int):
            try:
                operator.index(got)
            except TypeError:
                raise ExerciseError(f"[{name}] expected an int for hidden_size={h}, got {type(got).__name__} {got!r}.\n"
                                    "  hint: math.ceil returns an int; wrap a float result in int(...).") from None
            got = operator.index(got)
        check_equal(got, default_intermediate_size(h), name=f"{name} (hidden_size={h})", hint=hint)
    return f"matches the 8/3-rounded-up-to-64 rule for {len(sizes)} widths (512 -> 1408, 640 -> 1728, 768 -> 2048)"
