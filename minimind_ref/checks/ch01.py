"""Checks for chapter 01 — Normalization.

Each check runs the learner's function on inputs it generates and compares the result with
``minimind_ref.RMSNorm`` or ``torch.nn.functional.layer_norm``. A failure names the input it
failed on and, when the result equals a known mistake computed on the same input, that mistake;
then a hint about it, and the line that says how to see a worked solution (``show_solution``) last:

* ``check_rms_norm(fn)``             ``fn(x, weight, eps=1e-5)``: the RMSNorm formula (fp32 and bf16), every
  step in x's dtype (the chapter's draft has two mistakes, and a failure names the ones left)
* ``check_layer_norm(fn)``           ``fn(x, weight, bias, eps=1e-5)``: LayerNorm as PyTorch computes it
* ``check_fp16_safe_rms_norm(fn)``   ``fn(x, weight, eps=1e-5)``: MiniMind's exact recipe, including
  the fp32 upcast and its dtype contract, on fp16 activations whose squares overflow fp16
* ``check_norm_count(fn)``           ``fn(model) -> int``: how many RMSNorm modules a MiniMind has
* ``check_norm_parameters(fn)``      ``fn(config) -> int``: how many RMSNorm gain parameters a model built
  from ``config`` has (QK-norm's included), derived without building it
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F

from ..config import MiniMindConfig, minimind2_small
from ..model import MiniMindForCausalLM
from ..norm import RMSNorm
from .core import (Outcome, Shortcut, as_number, call, check, check_close, check_equal, check_numbers, fail, refused,
                   seeded, solution)

__all__ = [
    "check_rms_norm",
    "check_layer_norm",
    "check_fp16_safe_rms_norm",
    "check_norm_count",
    "check_norm_parameters",
    "reference_rms_norm",
    "count_rmsnorm_modules",
]


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """``minimind_ref.RMSNorm`` as a function of ``(x, weight, eps)`` (the module's exact forward)."""
    norm = RMSNorm(x.shape[-1], eps=eps)
    with torch.no_grad():
        norm.weight = torch.nn.Parameter(weight.detach().clone(), requires_grad=False)
        return norm(x)


def _norm_shortcuts(*extra: Shortcut) -> List[Shortcut]:
    """The normalizations a learner could call instead of writing one: PyTorch's and minimind_ref's RMSNorm."""
    out = [Shortcut("minimind_ref.RMSNorm", (RMSNorm, "forward"), (RMSNorm, "_norm")),
           Shortcut("torch.nn.RMSNorm", (torch.nn.RMSNorm, "forward")) if hasattr(torch.nn, "RMSNorm") else None,
           Shortcut("torch.nn.functional.rms_norm", (F, "rms_norm"), (torch, "rms_norm"))
           if hasattr(F, "rms_norm") else None,
           Shortcut("minimind_ref.checks.ch01.reference_rms_norm", (sys.modules[__name__], "reference_rms_norm"))]
    return [s for s in out if s is not None] + list(extra)


def count_rmsnorm_modules(model: torch.nn.Module) -> int:
    """The answer ``check_norm_count`` expects: modules that are ``minimind_ref.RMSNorm``."""
    return sum(isinstance(m, RMSNorm) for m in model.modules())


def _cases_fp32() -> List[Tuple[str, torch.Tensor, torch.Tensor, float]]:
    """(label, x, weight, eps): shapes, scales and eps values that catch the usual mistakes."""
    cases = []
    for n, shape in enumerate([(4, 16), (2, 3, 64), (1, 512), (8,), (2, 2, 2, 32)]):
        x = torch.randn(shape, generator=seeded(10 + n)) * 2.0 + 0.5  # non-zero mean: centring shows
        w = torch.rand(shape[-1], generator=seeded(20 + n)) + 0.5      # not all ones: the gain shows
        cases.append((f"x of shape {shape}", x, w, 1e-5))
    x = torch.randn(3, 32, generator=seeded(30))
    x[1] = 0.0  # an all-zero row: the output must be 0, not NaN
    cases.append(("a batch with an all-zero row", x, torch.rand(32, generator=seeded(31)) + 0.5, 1e-5))
    x = torch.randn(4, 64, generator=seeded(32)) * 1e-3  # mean of squares ~1e-6 < eps: eps matters
    cases.append(("tiny activations (|x| ~ 1e-3, where eps matters)", x, torch.ones(64), 1e-5))
    x = torch.randn(2, 5, 48, generator=seeded(33))
    cases.append(("eps=0.1 (the eps argument must be used)", x, torch.rand(48, generator=seeded(34)) + 0.5, 0.1))
    return cases


# --------------------------------------------------------------------------- rms_norm
_RMS_HINT = ("compare your steps with RMSNorm's definition in section 2 on the inputs the check names: which statistic "
             "of each vector (the last dimension) you divide by, where eps enters, and whether the gain is applied.")
solution("1.1", "weight * x / sqrt(mean(x**2, dim=-1, keepdim=True) + eps); torch.rsqrt(v) is 1 / sqrt(v) "
                "and keepdim=True keeps the reduced dimension so it broadcasts against x.")
_RMS_CRASH = ("a size mismatch usually means the mean of squares lost its last dimension: keep that dimension "
              "(the reduction has an argument for it) so the statistic broadcasts against x.")
_RMS_WHOLE = ("one statistic for the whole tensor (the mean over every value of x, all its vectors together) instead "
              "of one per vector")
_RMS_OUTSIDE = "eps added outside the square root"
_RMS_DRAFT = "the draft unchanged: both of its mistakes are still there"
_RMS_HINTS = {
    _RMS_WHOLE: ("the check's input holds several vectors of different sizes: print the RMS of each row of your output. "
                 "Section 2's formula acts on one vector, the d features of one token."),
    _RMS_DRAFT: ("two inputs show the two mistakes: several vectors of different sizes at once, and activations so small "
                 "that eps matters. Try each against torch.nn.RMSNorm and compare with section 2's formula."),
    _RMS_OUTSIDE: ("on activations this small eps decides the result: compare where it sits in section 2's formula "
                   "with where it sits in your code."),
    "the eps argument ignored (always 1e-5)": "the check passes eps=0.1: where does your function read it?",
}


def _rms_mistakes(x: torch.Tensor, w: torch.Tensor, eps: float) -> Dict[str, Callable[[], torch.Tensor]]:
    """What the usual wrong versions of Exercise 1.1 return on this input (in x's dtype, as the learner computes)."""
    def ms(v: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return v.pow(2).mean(dim, keepdim=True)

    return {  # the whole-tensor mean before the draft: on ordinary activations the two differ by less than the tolerance
        _RMS_WHOLE: lambda: w * x * torch.rsqrt(x.pow(2).mean() + eps),
        _RMS_DRAFT: lambda: w * x / (x.pow(2).mean().sqrt() + eps),
        "the eps argument ignored (always 1e-5)": lambda: w * x * torch.rsqrt(ms(x) + 1e-5),
        "eps left out (an all-zero row then divides 0 by 0)": lambda: w * x / ms(x).sqrt(),
        _RMS_OUTSIDE: lambda: w * x / (ms(x).sqrt() + eps),
        "the mean subtracted first (that is LayerNorm without a bias, not RMSNorm)":
            lambda: w * (x - x.mean(-1, keepdim=True)) * torch.rsqrt(ms(x - x.mean(-1, keepdim=True)) + eps),
        "the sum of squares instead of their mean": lambda: w * x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps),
        "the mean over the first dimension instead of the last": lambda: w * x * torch.rsqrt(ms(x, 0) + eps),
        "the gain (weight) left out": lambda: x * torch.rsqrt(ms(x) + eps),
        "the square root left out (divided by the mean of squares itself)": lambda: w * x / (ms(x) + eps),
        "eps used as a floor under the mean of squares instead of added to it": lambda: w * x * torch.rsqrt(
            ms(x).clamp_min(eps)),
        "eps squared before it is added": lambda: w * x * torch.rsqrt(ms(x) + eps ** 2),
    }


def _in_dtype_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Section 2's formula with every step in x's dtype (Exercise 1.1's contract; the statistic overflows float16
    for activations above 256)."""
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


@check("Exercise 1.1 rms_norm", shown=True,
       why="one entry of RMSNorm of random tensors, whose entries the message does not show: nothing to read the "
           "formula back from")
def check_rms_norm(fn: Callable[..., Any]) -> str:
    """``fn(x, weight, eps)`` must equal ``minimind_ref.RMSNorm`` (fp32: rtol = atol = 1e-5; bf16
    input with a bf16 weight: a bf16 result within bf16's tolerance, 2e-2), compute in ``x``'s dtype (float16
    activations whose squares overflow float16 come back as zeros, as section 3 of the chapter shows) and leave
    ``x`` alone; PyTorch's and minimind_ref's RMSNorm are switched off while ``fn`` runs."""
    name = "Exercise 1.1 rms_norm"
    shortcuts = _norm_shortcuts()
    refuse_hint = ("write section 2's formula with tensor operations; torch.nn.RMSNorm is there to test your function "
                   "against in the notebook, not to call inside it.")

    def run(*args: Any, **kwargs: Any) -> Any:
        with refused(name, fn, shortcuts, refuse_hint):
            return call(fn, *args, name=name, **kwargs)

    cases = _cases_fp32()
    for label, x, w, eps in cases:
        no_keepdim = {"the mean of squares without its last dimension kept":
                      lambda x=x, w=w, eps=eps: w * x * torch.rsqrt(x.pow(2).mean(-1) + eps)}
        got = run(x, w, eps=eps, hint=_RMS_CRASH, case=label, check_inputs=True, crash_mistakes=no_keepdim)
        check_close(got, reference_rms_norm(x, w, eps), name=name, case=label, hint=_RMS_HINT,
                    mistakes=_rms_mistakes(x, w, eps), mistake_hints=_RMS_HINTS)
    # default eps: the signature says eps=1e-5
    x = torch.randn(3, 40, generator=seeded(40)) * 1e-3
    label = "a call without eps (tiny activations)"
    got = run(x, torch.ones(40), case=label,
              hint="the exercise calls rms_norm(x, weight) without eps too: give eps the default value 1e-5 in "
                   "the signature.")
    check_close(got, reference_rms_norm(x, torch.ones(40), 1e-5), name=name, case=label,
                hint="give eps the default value 1e-5 (MiniMind's rms_norm_eps) in the signature.")
    # bf16 in, bf16 weight: bf16 out (the formula in any precision passes at bf16 tolerance)
    xb = (torch.randn(4, 7, 128, generator=seeded(41)) * 3).to(torch.bfloat16)
    wb = (torch.rand(128, generator=seeded(42)) + 0.5).to(torch.bfloat16)
    label = "bfloat16 x and weight"
    got = run(xb, wb, eps=1e-5, hint=_RMS_CRASH, case=label, check_inputs=True)
    dtype_hint = ("the result has x's dtype, and every step is computed in it: do not convert x or the result to "
                  "another dtype (section 3 uses your function to show what half precision does).")
    check_close(got, reference_rms_norm(xb, wb), name=name, case=label, mistakes=_rms_mistakes(xb, wb, 1e-5),
                hint=dtype_hint, mistake_hints=_RMS_HINTS)
    # float16 activations of size ~300: in float16 the squares overflow and the formula returns zeros, which is
    # what section 3 shows with this function (Exercise 1.3 fixes it); a version that computes in float32 hides it
    x16 = (torch.randn(3, 64, generator=seeded(43)) * 300).to(torch.float16)
    w16 = (torch.rand(64, generator=seeded(44)) + 0.5).to(torch.float16)
    label = "float16 x of magnitude ~300 and a float16 weight"
    got = run(x16, w16, eps=1e-5, hint=_RMS_CRASH, case=label, check_inputs=True)
    expected = _in_dtype_rms_norm(x16, w16, 1e-5)
    if isinstance(got, torch.Tensor) and got.dtype == torch.float16 and tuple(got.shape) == tuple(x16.shape) and \
            bool(torch.isfinite(got).all()) and bool((got != 0).any()):
        fail(name, f"your result is not what section 2's formula gives with every step in float16: there the squares "
             f"overflow float16 and the output is all zeros, yours is not (on {label}). This looks like a step "
             "computed in a wider dtype (x converted to float32, or a function that accumulates in float32)",
             "the exercise asks for every step in x's own dtype: section 3 uses your function to show what float16 "
             "does to RMSNorm, and Exercise 1.3 is where that gets fixed.")
    check_close(got, expected, name=name, case=label, hint=dtype_hint, mistakes=_rms_mistakes(x16, w16, 1e-5),
                mistake_hints=_RMS_HINTS)
    return f"{len(cases) + 3} cases match section 2's RMSNorm (fp32, bf16, and fp16 computed in fp16)"


# --------------------------------------------------------------------------- layer_norm
_LN_HINT = ("compare your steps with LayerNorm's definition in section 2 on the input the check names: what is "
            "subtracted and from what, which estimate of the variance (measure PyTorch's, as the exercise's hints "
            "say), where eps enters, and the order of the gain and the bias; every statistic is over the last "
            "dimension.")
solution("1.2", "mean = x.mean(-1, keepdim=True); var = ((x - mean)**2).mean(-1, keepdim=True) "
                "(or x.var(-1, unbiased=False, keepdim=True)); return (x - mean) / sqrt(var + eps) * weight + bias.")


_LN_CRASH = ("a size mismatch usually means the mean or the variance lost its last dimension: keep that dimension "
             "(the reductions have an argument for it) so they broadcast against x.")
_LN_UNBIASED = "the unbiased variance (divided by one less than the number of values: torch's default for var)"
_LN_HINTS = {
    _LN_UNBIASED: ("that is one of the two estimates; measure which one torch.nn.LayerNorm takes on a vector of two "
                   "features, whose variance you can compute both ways by hand."),
    "eps added outside the square root (added to the standard deviation)":
        "on tiny activations eps decides the result: compare where it sits in section 2's formula and in your code.",
    "the eps argument ignored (always 1e-5)": "the check passes eps=0.1: where does your function read it?",
    "no centring (that is RMSNorm plus a bias)": "LayerNorm re-centres before it re-scales: look at section 2's mu.",
    "the mean subtracted inside the variance but not from x itself":
        "look at the numerator of section 2's formula: what is divided by the standard deviation?",
    "the bias left out": "section 2's LayerNorm has two learned vectors: what happens to the second?",
    "the gain (weight) left out": "section 2's LayerNorm has two learned vectors: what happens to the first?",
    "the bias added before the scaling by the gain":
        "in section 2's formula, which learned vector multiplies, and is the other one multiplied by it?",
    "weight and bias swapped": "print your function's output for x = 0 and compare with section 2's formula.",
    "the square root left out (divided by the variance itself)":
        "a normalized vector has a standard deviation of about 1: print that of your output.",
    "the statistics over the first dimension instead of the last":
        "each token is normalized on its own: over which dimension do its d features lie?",
}


def _ln_mistakes(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> Dict[str, Callable[[], torch.Tensor]]:
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    xhat = (x - mean) * torch.rsqrt(var + eps)
    mean0 = x.mean(0, keepdim=True)
    var0 = (x - mean0).pow(2).mean(0, keepdim=True)
    return {
        _LN_UNBIASED: lambda: (x - mean) * torch.rsqrt(x.var(-1, keepdim=True) + eps) * w + b,
        "eps added outside the square root (added to the standard deviation)":
            lambda: (x - mean) / (var.sqrt() + eps) * w + b,
        "the eps argument ignored (always 1e-5)": lambda: (x - mean) * torch.rsqrt(var + 1e-5) * w + b,
        "no centring (that is RMSNorm plus a bias)": lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w + b,
        "the mean subtracted inside the variance but not from x itself": lambda: x * torch.rsqrt(var + eps) * w + b,
        "the bias left out": lambda: xhat * w,
        "the gain (weight) left out": lambda: xhat + b,
        "the bias added before the scaling by the gain": lambda: (xhat + b) * w,
        "weight and bias swapped": lambda: xhat * b + w,
        "the square root left out (divided by the variance itself)": lambda: (x - mean) / (var + eps) * w + b,
        "the statistics over the first dimension instead of the last":
            lambda: (x - mean0) * torch.rsqrt(var0 + eps) * w + b,
    }


def _layer_norm_shortcuts() -> List[Shortcut]:
    return [Shortcut("torch.nn.functional.layer_norm", (F, "layer_norm"), (torch, "layer_norm"),
                     (torch, "native_layer_norm")),
            Shortcut("torch.nn.LayerNorm", (torch.nn.LayerNorm, "forward"))]


@check("Exercise 1.2 layer_norm", shown=True,
       why="one entry of LayerNorm of random tensors, whose entries the message does not show")
def check_layer_norm(fn: Callable[..., Any]) -> str:
    """``fn(x, weight, bias, eps)`` must equal ``torch.nn.functional.layer_norm`` (fp32, 1e-5), which is switched off
    while ``fn`` runs (with ``torch.nn.LayerNorm``)."""
    name = "Exercise 1.2 layer_norm"
    shortcuts = _layer_norm_shortcuts()
    refuse_hint = ("write section 2's formula with tensor operations; torch.nn.LayerNorm is there to measure in the "
                   "notebook, not to call inside your function.")
    count = 0
    for label, x, w, eps in _cases_fp32():
        b = torch.randn(x.shape[-1], generator=seeded(int(x.shape[-1]) + 50)) * 0.5
        with refused(name, fn, shortcuts, refuse_hint):
            got = call(fn, x, w, b, eps=eps, name=name, hint=_LN_CRASH, case=label, check_inputs=True)
        expected = F.layer_norm(x, (x.shape[-1],), w, b, eps)
        check_close(got, expected, name=name, case=label, hint=_LN_HINT, mistakes=_ln_mistakes(x, w, b, eps),
                    mistake_hints=_LN_HINTS)
        count += 1
    x = torch.randn(2, 24, generator=seeded(60)) * 1e-3
    w, b = torch.ones(24), torch.zeros(24)
    label = "a call without eps (tiny activations)"
    with refused(name, fn, shortcuts, refuse_hint):
        got = call(fn, x, w, b, name=name, case=label,
                   hint="the exercise calls layer_norm(x, weight, bias) without eps too: give eps the default value "
                        "1e-5.")
    check_close(got, F.layer_norm(x, (24,), w, b, 1e-5), name=name, case=label,
                hint="give eps the default value 1e-5 in the signature.")
    return f"{count + 1} cases match torch.nn.functional.layer_norm"


# --------------------------------------------------------------------------- fp16-safe rms_norm
_SAFE_HINT_OVERFLOW = ("in float16, 300**2 = 90000 is already larger than the largest float16 number (65504): the "
                       "squares become inf, the mean is inf, and x / inf = 0. The squares need a dtype with a larger "
                       "range.")
_SAFE_HINT_DTYPE = ("the result's dtype follows from the dtypes that meet in your last multiplication: compare with "
                    "the table of minimind_ref.RMSNorm's dtypes above the exercise (an fp16 x with an fp32 weight "
                    "gives float32 there, with an fp16 weight float16).")
_SAFE_HINT_VALUES = ("the rounding steps must be MiniMind2's: which values are computed in which precision, and how "
                     "many times (and where) a value is rounded to x.dtype.")
solution("1.3", "xf = x.float(); normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps); "
                "return weight * normed.type_as(x).")


def _safe_mistakes(x: torch.Tensor, w: torch.Tensor, eps: float) -> Dict[str, Callable[[], torch.Tensor]]:
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return {
        "no float32 upcast (the squares computed in the input dtype)":
            lambda: w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)),
        "the statistic computed in float32 but the division done in x's dtype (the normalized value is then "
        "rounded more than once)":
            lambda: w * (x * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)),
        "the eps argument ignored (always 1e-5)":
            lambda: w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x),
        "the cast back to x.dtype done after multiplying by the weight": lambda: (w * normed).to(x.dtype),
        "the normalized value never cast back to x.dtype":
            lambda: (w * normed).to(torch.promote_types(x.dtype, w.dtype)),
        "a float32 result whatever the input dtype": lambda: w.float() * normed,
    }


@check("Exercise 1.3 rms_norm_safe", shown=True,
       why="one entry of RMSNorm of random fp16 tensors, whose entries the message does not show")
def check_fp16_safe_rms_norm(fn: Callable[..., Any]) -> str:
    """``fn(x, weight, eps)`` must reproduce ``minimind_ref.RMSNorm`` exactly, dtype included:
    statistics in fp32, the normalized value cast back to ``x.dtype``, then times ``weight``.

    Inputs include fp16 activations of magnitude ~300 to ~3e4, whose squares overflow fp16
    (max 65504); a version without the upcast returns zeros there.
    """
    name = "Exercise 1.3 rms_norm_safe"
    cases = []
    for n, (scale, shape) in enumerate([(300.0, (2, 8, 256)), (3000.0, (4, 64)), (2e4, (3, 512))]):
        x = (torch.randn(shape, generator=seeded(70 + n)) * scale).clamp(-6e4, 6e4).to(torch.float16)
        cases.append((f"float16 x of magnitude ~{scale:g}, float16 weight", x,
                      (torch.rand(shape[-1], generator=seeded(80 + n)) + 0.5).to(torch.float16)))
    x = (torch.randn(2, 3, 128, generator=seeded(75)) * 300).to(torch.float16)
    cases.append(("float16 x of magnitude ~300, float32 weight", x, torch.rand(128, generator=seeded(85)) + 0.5))
    x = (torch.randn(4, 96, generator=seeded(76)) * 5).to(torch.bfloat16)
    cases.append(("bfloat16 x, float32 weight (MiniMind's mixed-precision case)", x,
                  torch.rand(96, generator=seeded(86)) + 0.5))
    x = (torch.randn(4, 96, generator=seeded(77)) * 5).to(torch.bfloat16)
    cases.append(("bfloat16 x, bfloat16 weight", x, (torch.rand(96, generator=seeded(87)) + 0.5).to(torch.bfloat16)))
    x = torch.randn(3, 32, generator=seeded(78)) * 4 + 1
    x[0] = 0.0
    cases.append(("float32 x with an all-zero row", x, torch.rand(32, generator=seeded(88)) + 0.5))
    x = torch.randn(2, 5, 48, generator=seeded(79)) * 0.3
    cases.append(("float32 x of magnitude ~0.3, a float32 weight and eps=0.1 (the eps argument must be used)", x,
                  torch.rand(48, generator=seeded(89)) + 0.5))
    shortcuts = _norm_shortcuts()
    refuse_hint = ("write MiniMind's recipe yourself, with tensor operations (your rms_norm of Exercise 1.1 may be a "
                   "step of it): minimind_ref.RMSNorm is the reference the check compares with.")
    for label, x, w in cases:
        eps = 0.1 if "eps=0.1" in label else 1e-5
        with refused(name, fn, shortcuts, refuse_hint):
            got = call(fn, x, w, eps=eps, name=name, case=label, check_inputs=True,
                       hint="x can be float16, bfloat16 or float32 and the weight float16, bfloat16 or float32.")
        expected = reference_rms_norm(x, w, eps)
        if isinstance(got, torch.Tensor) and got.dtype == expected.dtype and got.is_floating_point():
            if bool(torch.isfinite(expected).all()) and bool(((got == 0).all(-1) & (expected != 0).any(-1)).any()):
                fail(name, f"some rows came back all zeros (expected non-zero values) (on {label}): the squares "
                     "overflowed", _SAFE_HINT_OVERFLOW)
            if bool(torch.isfinite(expected).all()) and not bool(torch.isfinite(got).all()):
                fail(name, f"your result has inf/NaN values where the reference is finite (on {label})",
                     _SAFE_HINT_OVERFLOW)
        # the same rounding steps as the reference: at most one ulp of the output dtype apart
        tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-5}[expected.dtype]
        wrong_dtype = isinstance(got, torch.Tensor) and got.dtype != expected.dtype
        check_close(got, expected, name=name, case=label, rtol=tol, atol=tol, mistakes=_safe_mistakes(x, w, eps),
                    hint=_SAFE_HINT_DTYPE if wrong_dtype else _SAFE_HINT_VALUES,
                    mistake_hints={"the eps argument ignored (always 1e-5)":
                                   "the check passes eps=0.1: where does your function read it?"})
    return f"{len(cases)} cases match minimind_ref.RMSNorm, dtypes included"


# --------------------------------------------------------------------------- counting RMSNorm modules
def _count_models() -> List[Tuple[str, str, torch.nn.Module]]:
    # The module structure does not depend on the vocabulary or the RoPE table length, so the
    # MiniMind2-Small case uses a small vocabulary to build in a fraction of a second.
    small = MiniMindForCausalLM(minimind2_small(vocab_size=64, max_position_embeddings=64))
    tiny = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                max_position_embeddings=64, intermediate_size=64)
    three = MiniMindForCausalLM(MiniMindConfig(num_hidden_layers=3, **tiny))
    moe = MiniMindForCausalLM(MiniMindConfig(num_hidden_layers=5, use_moe=True, **tiny))
    # Two small containers that tell the draft's two mistakes apart: MiniMind's norms as direct children
    # (a walk over the children alone finds them), and a torch.nn.RMSNorm nested one level down (only a
    # full walk that tests for the wrong class counts it).
    direct = torch.nn.Sequential(RMSNorm(8), RMSNorm(8))
    nested_torch = torch.nn.Sequential(torch.nn.Sequential(torch.nn.RMSNorm(8)), torch.nn.Linear(8, 8))
    return [("MiniMind2-Small", "MiniMind2-Small", small), ("a 3-layer MiniMind", "3-layer", three),
            ("a 5-layer MiniMind-MoE", "5-layer MoE", moe),
            ("nn.Sequential(RMSNorm(8), RMSNorm(8)): two of MiniMind's norms as direct children", "2 direct", direct),
            ("nn.Sequential(nn.Sequential(torch.nn.RMSNorm(8)), nn.Linear(8, 8)): PyTorch's RMSNorm, nested",
             "0 of MiniMind's", nested_torch),
            ("RMSNorm(8) on its own: a module that is itself one of MiniMind's norms", "1 on its own", RMSNorm(8))]


def _count_mistakes(model: torch.nn.Module, first_answer: Any) -> Dict[str, Any]:
    config = getattr(model, "config", None)
    layers = config.num_hidden_layers if config is not None else None

    def of(cls, walk):
        return sum(isinstance(m, cls) for m in walk())

    return {
        "the draft unchanged: it walks only the top-level children and tests for PyTorch's class":
            of(torch.nn.RMSNorm, model.children),
        "a walk over the top-level children only (the blocks' norms sit inside nested modules)":
            of(RMSNorm, model.children),
        "a test for torch.nn.RMSNorm (MiniMind's norm is its own class, minimind_ref.RMSNorm, not a subclass of "
        "PyTorch's)": of(torch.nn.RMSNorm, model.modules),
        "the same number for every model (hard-coded?)": first_answer,
        "the two norms of each block without the final norm (model.norm)": None if layers is None else 2 * layers,
        "one norm per block plus the final norm": None if layers is None else layers + 1,
        "one norm per block": layers,
        "a count of the model's top-level children": len(list(model.children())),
        "a count of every module": len(list(model.modules())),
        _COUNT_ROOT: count_rmsnorm_modules(model) - 1 if isinstance(model, RMSNorm) else None,
        "modules counted by their names (a name says where a module sits, not what it is: a container's norms are "
        "named 0, 1, ...)": sum("norm" in n.lower() for n, _ in model.named_modules()),
    }


_COUNT_ROOT = "the module itself left out (a module that is itself one of MiniMind's norms counts as one)"


solution("1.4", "sum(isinstance(m, RMSNorm) for m in model.modules()), with RMSNorm imported from minimind_ref "
                "(not torch.nn.RMSNorm).")


@check("Exercise 1.4 count_rmsnorm", shown=False,
       why="the count of a model the case names: three counts give away how the count grows with the layers")
def check_norm_count(fn: Callable[[torch.nn.Module], Any]) -> str:
    """``fn(model)`` must return the number of ``minimind_ref.RMSNorm`` modules in ``model``,
    counted from the model (three differently sized models, so a hard-coded number fails, two small
    containers that tell a walk over the children from a test for PyTorch's class, and a lone RMSNorm, which a
    walk that skips the module itself misses)."""
    name = "Exercise 1.4 count_rmsnorm"
    hint = ("compare what your counter walks over with where the norms sit (print the names of a model's modules), "
            "and the class it tests for with the type of one of MiniMind's norms; count from the model, not from "
            "the description of section 4.")
    outcomes, results, first = [], [], None
    models = _count_models()
    for index, (label, short, model) in enumerate(models[:3]):  # the MiniMind models: every counter must run on them
        got = call(fn, model, name=name, case=label, hint="the argument is an nn.Module (a MiniMindForCausalLM, or a "
                   "small container of modules).")
        got = as_number(got, name, label, integer=True, what="a number of modules")
        first = got if index == 0 else first
        outcomes.append(Outcome(label, got, count_rmsnorm_modules(model), _count_mistakes(model, first if index else None)))
        results.append(f"{short}: {got}")
    right = all(o.got == o.expected for o in outcomes)
    for label, short, model in models[3:]:  # containers without a config: they tell the draft's mistakes apart
        if right:  # a counter that is right on the models must also count here: failures are reported
            got = call(fn, model, name=name, case=label, hint="count from the modules the argument holds: the "
                       "argument may be any nn.Module, one without a config too.")
        else:  # a counter already wrong: a crash here (reading model.config) must not hide its mistake
            try:
                got = fn(model)
            except Exception:  # the models' cases alone name the mistake then
                continue
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if not right and (isinstance(got, bool) or not isinstance(got, int)):
            continue
        got = as_number(got, name, label, integer=True, what="a number of modules")
        outcomes.append(Outcome(label, got, count_rmsnorm_modules(model), _count_mistakes(model, first)))
    check_numbers(name, outcomes, hint, mistake_hints={
        _COUNT_ROOT: "print what your walk visits for a model that is a single RMSNorm: is the model itself among them?"})
    return "; ".join(results[:3])


# --------------------------------------------------------------------------- normalization parameters from a config
def _norm_param_configs() -> List[Tuple[str, MiniMindConfig]]:
    from ..config import minimind2, minimind3, minimind3_moe

    return [
        ("minimind-3 (hidden 768, 8 layers, head_dim 96, QK-norm)", minimind3()),
        ("MiniMind2-Small (hidden 512, 8 layers, no QK-norm)", minimind2_small()),
        ("MiniMind2 (hidden 768, 16 layers)", minimind2()),
        ("minimind-3-moe", minimind3_moe()),
        ("minimind-3 with head_dim=64 (12 query heads, 4 KV heads)",
         minimind3(num_attention_heads=12, num_key_value_heads=4, head_dim=64)),
        ("minimind-3 with head_dim=128 (8 query heads of 128 on a hidden size of 768, 4 KV heads)",
         minimind3(head_dim=128)),
        ("a 5-layer MiniMind2 with qk_norm=True (hidden 256, 4 heads)",
         MiniMindConfig(hidden_size=256, num_hidden_layers=5, num_attention_heads=4, qk_norm=True)),
        ("a 3-layer minimind-3 with qk_norm=False", minimind3(num_hidden_layers=3, qk_norm=False)),
    ]


def _norm_param_mistakes(c: MiniMindConfig) -> Dict[str, int]:
    """Mistake -> the count it gives on ``c`` (``check_numbers`` names the one that fits every config)."""
    h, layers, d = c.hidden_size, c.num_hidden_layers, c.head_dim
    return _norm_param_candidates(c, h, layers, d, (2 * layers + 1) * h, 2 * layers * d)


def _norm_param_candidates(c: MiniMindConfig, h: int, layers: int, d: int, blocks: int, qk: int) -> Dict[str, int]:
    """What each planted mistake counts on config ``c``; the QK-norm mistakes change only the QK-norm part
    (on a config without QK-norm they give the right count)."""
    has = bool(c.qk_norm)
    return {
        "the two norms of each block and the final norm, without QK-norm's q_norm and k_norm gains": blocks,
        "QK-norm counted although this config has qk_norm=False": blocks + qk,
        "one QK-norm gain per head": blocks + (layers * (c.num_attention_heads + c.num_key_value_heads) * d if has else 0),
        "one gain per query head in both QK-norms": blocks + (2 * layers * c.num_attention_heads * d if has else 0),
        _NP_QUOTIENT: blocks + (2 * layers * (h // c.num_attention_heads) if has else 0),
        "QK-norm gains of hidden_size values": blocks + (2 * layers * h if has else 0),
        "only q_norm counted (k_norm has a gain too)": blocks + (layers * d if has else 0),
        "the final norm (model.norm) left out": 2 * layers * h + (qk if has else 0),
        "one norm per block plus the final one": (layers + 1) * h + (qk if has else 0),
    }


_NP_QUOTIENT = ("head_dim taken as hidden_size divided by the number of heads (minimind-3's head_dim is a field of its "
                "own, and it may differ)")
_NP_GAINS = ("print the shape of q_norm's and k_norm's gains in a model built from the config the case names (on the "
             "meta device), and compare with your count of them.")
_NP_HINTS = {
    "one QK-norm gain per head": _NP_GAINS,
    "one gain per query head in both QK-norms": _NP_GAINS,
    "QK-norm gains of hidden_size values": _NP_GAINS,
    "only q_norm counted (k_norm has a gain too)": "list every RMSNorm of one attention layer: how many are there?",
    _NP_QUOTIENT: "the case sets head_dim itself: read config.head_dim rather than computing it.",
}

solution("1.5", "(2 * L + 1) * hidden_size, plus 2 * L * head_dim when config.qk_norm (L = num_hidden_layers)")


@check("Exercise 1.5 rmsnorm_parameters", shown=False,
       why="a closed form of the config's fields, which the case names: a few expected counts are enough to fit the "
           "formula")
def check_norm_parameters(fn: Callable[[MiniMindConfig], Any]) -> str:
    """``fn(config) -> int``: the number of RMSNorm gain parameters a model built from ``config`` has,
    derived from the config alone; the check counts them in the model (built on the meta device)."""
    from ..params import parameter_breakdown

    name = "Exercise 1.5 rmsnorm_parameters"
    hint = ("list every RMSNorm a model built from the case's config has (build it on the meta device and print each "
            "norm's name and the shape of its gain), then write each count from the config's fields: config.qk_norm "
            "says whether attention has norms of its own.")
    outcomes = []
    for label, config in _norm_param_configs():
        got = call(fn, config, name=name, case=label, hint="the argument is a MiniMindConfig; read its fields.")
        got = as_number(got, name, label, integer=True, what="a number of parameters")
        outcomes.append(Outcome(label, got, parameter_breakdown(config)["norms"], _norm_param_mistakes(config)))
    check_numbers(name, outcomes, hint, mistake_hints=_NP_HINTS)
    return (f"minimind-3: {outcomes[0].got:,} norm parameters; MiniMind2-Small: {outcomes[1].got:,}; {len(outcomes)} "
            "configs")
