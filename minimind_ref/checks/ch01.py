"""Checks for chapter 01 — Normalization.

Each check runs the learner's function on inputs it generates and compares the result with
``minimind_ref.RMSNorm`` or ``torch.nn.functional.layer_norm``:

* ``check_rms_norm(fn)``             ``fn(x, weight, eps=1e-5)``: the RMSNorm formula (fp32 and bf16)
* ``check_layer_norm(fn)``           ``fn(x, weight, bias, eps=1e-5)``: LayerNorm (biased variance)
* ``check_fp16_safe_rms_norm(fn)``   ``fn(x, weight, eps=1e-5)``: MiniMind's exact recipe, including
  the fp32 upcast and its dtype contract, on fp16 activations whose squares overflow fp16
* ``check_norm_count(fn)``           ``fn(model) -> int``: how many RMSNorm modules a MiniMind has
"""

from __future__ import annotations

from typing import Any, Callable, List, Tuple

import torch
import torch.nn.functional as F

from ..config import MiniMindConfig, minimind2_small
from ..model import MiniMindForCausalLM
from ..norm import RMSNorm
from .core import ExerciseError, call, check, check_close, seeded

__all__ = [
    "check_rms_norm",
    "check_layer_norm",
    "check_fp16_safe_rms_norm",
    "check_norm_count",
    "reference_rms_norm",
    "count_rmsnorm_modules",
]


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """``minimind_ref.RMSNorm`` as a function of ``(x, weight, eps)`` (the module's exact forward)."""
    norm = RMSNorm(x.shape[-1], eps=eps)
    with torch.no_grad():
        norm.weight = torch.nn.Parameter(weight.detach().clone(), requires_grad=False)
        return norm(x)


def count_rmsnorm_modules(model: torch.nn.Module) -> int:
    """The answer ``check_norm_count`` expects: modules that are ``minimind_ref.RMSNorm``."""
    return sum(isinstance(m, RMSNorm) for m in model.modules())


def _unchanged(name: str, before: torch.Tensor, after: torch.Tensor) -> None:
    if not torch.equal(before, after):
        raise ExerciseError(f"[{name}] your function changed its input in place; compute a new tensor instead "
                            "(avoid x.mul_(...), x /= ..., and so on).")


def _cases_fp32() -> List[Tuple[str, torch.Tensor, torch.Tensor, float]]:
    """(label, x, weight, eps): shapes, scales and eps values that catch the usual mistakes."""
    cases = []
    for n, shape in enumerate([(4, 16), (2, 3, 64), (1, 512), (8,), (2, 2, 2, 32)]):
        x = torch.randn(shape, generator=seeded(10 + n)) * 2.0 + 0.5  # non-zero mean: centring shows
        w = torch.rand(shape[-1], generator=seeded(20 + n)) + 0.5      # not all ones: the gain shows
        cases.append((f"shape {shape}", x, w, 1e-5))
    x = torch.randn(3, 32, generator=seeded(30))
    x[1] = 0.0  # an all-zero row: the output must be 0, not NaN
    cases.append(("a batch with an all-zero row", x, torch.rand(32, generator=seeded(31)) + 0.5, 1e-5))
    x = torch.randn(4, 64, generator=seeded(32)) * 1e-3  # mean of squares ~1e-6 < eps: eps matters
    cases.append(("tiny activations (|x| ~ 1e-3, where eps matters)", x, torch.ones(64), 1e-5))
    x = torch.randn(2, 5, 48, generator=seeded(33))
    cases.append(("eps=0.1 (the eps argument must be used)", x, torch.rand(48, generator=seeded(34)) + 0.5, 0.1))
    return cases


_RMS_HINT = ("y = weight * x / sqrt(mean(x**2, dim=-1, keepdim=True) + eps): the mean is over the LAST "
             "dimension only, eps goes INSIDE the square root, nothing is subtracted (no centring), and "
             "torch.rsqrt(v) is 1 / sqrt(v).")


# --------------------------------------------------------------------------- rms_norm
@check("Exercise 1.1 rms_norm")
def check_rms_norm(fn: Callable[..., Any]) -> str:
    """``fn(x, weight, eps)`` must equal ``minimind_ref.RMSNorm`` (fp32: rtol = atol = 1e-5; bf16
    input with a bf16 weight: a bf16 result within bf16's tolerance, 2e-2)."""
    name = "Exercise 1.1 rms_norm"
    cases = _cases_fp32()
    for label, x, w, eps in cases:
        before = x.clone()
        got = call(fn, x, w, eps=eps, name=name)
        _unchanged(name, before, x)
        check_close(got, reference_rms_norm(x, w, eps), name=f"{name} on {label}", hint=_RMS_HINT)
    # default eps: the signature says eps=1e-5
    x = torch.randn(3, 40, generator=seeded(40)) * 1e-3
    got = call(fn, x, torch.ones(40), name=name)
    check_close(got, reference_rms_norm(x, torch.ones(40), 1e-5), name=f"{name} called without eps",
                hint="give eps the default value 1e-5 (MiniMind's rms_norm_eps): def rms_norm(x, weight, eps=1e-5).")
    # bf16 in, bf16 weight: bf16 out (the formula in any precision passes at bf16 tolerance)
    xb = (torch.randn(4, 7, 128, generator=seeded(41)) * 3).to(torch.bfloat16)
    wb = (torch.rand(128, generator=seeded(42)) + 0.5).to(torch.bfloat16)
    check_close(call(fn, xb, wb, eps=1e-5, name=name), reference_rms_norm(xb, wb), name=f"{name} in bfloat16",
                hint="with a bf16 input and a bf16 weight the result should be bf16; do not return float32 "
                     "or convert the output to another dtype.")
    return f"{len(cases) + 2} cases match minimind_ref.RMSNorm (fp32 and bf16)"


# --------------------------------------------------------------------------- layer_norm
@check("Exercise 1.2 layer_norm")
def check_layer_norm(fn: Callable[..., Any]) -> str:
    """``fn(x, weight, bias, eps)`` must equal ``torch.nn.functional.layer_norm`` (fp32, 1e-5)."""
    name = "Exercise 1.2 layer_norm"
    hint = ("y = (x - mean) / sqrt(var + eps) * weight + bias, with mean and var over the LAST dimension "
            "and the BIASED variance (divide by d, not d - 1): x.var(-1, unbiased=False, keepdim=True), "
            "or ((x - mean)**2).mean(-1, keepdim=True).")
    count = 0
    for label, x, w, eps in _cases_fp32():
        b = torch.randn(x.shape[-1], generator=seeded(int(x.shape[-1]) + 50)) * 0.5
        before = x.clone()
        got = call(fn, x, w, b, eps=eps, name=name)
        _unchanged(name, before, x)
        expected = F.layer_norm(x, (x.shape[-1],), w, b, eps)
        check_close(got, expected, name=f"{name} on {label}", hint=hint)
        count += 1
    x = torch.randn(2, 24, generator=seeded(60)) * 1e-3
    w, b = torch.ones(24), torch.zeros(24)
    check_close(call(fn, x, w, b, name=name), F.layer_norm(x, (24,), w, b, 1e-5), name=f"{name} called without eps",
                hint="give eps the default value 1e-5: def layer_norm(x, weight, bias, eps=1e-5).")
    return f"{count + 1} cases match torch.nn.functional.layer_norm"


# --------------------------------------------------------------------------- fp16-safe rms_norm
@check("Exercise 1.3 rms_norm_safe")
def check_fp16_safe_rms_norm(fn: Callable[..., Any]) -> str:
    """``fn(x, weight, eps)`` must reproduce ``minimind_ref.RMSNorm`` exactly, dtype included:
    statistics in fp32, the normalized value cast back to ``x.dtype``, then times ``weight``.

    Inputs include fp16 activations of magnitude ~300 to ~3e4, whose squares overflow fp16
    (max 65504); a version without the upcast returns zeros there.
    """
    name = "Exercise 1.3 rms_norm_safe"
    hint_overflow = ("compute the statistics in float32: xf = x.float(), then xf * torch.rsqrt(xf.pow(2).mean(-1, "
                     "keepdim=True) + eps). In fp16, 300**2 = 90000 is already larger than the largest fp16 "
                     "number (65504), so x.pow(2) becomes inf and x / inf = 0.")
    hint_dtype = ("follow MiniMind's order: normalize in float32, cast that back to the input dtype "
                  "(.type_as(x) or .to(x.dtype)), THEN multiply by weight. The dtype of the result is "
                  "whatever torch's promotion of (x.dtype, weight.dtype) gives: fp16 x with an fp32 weight "
                  "-> float32; fp16 x with an fp16 weight -> float16.")
    hint_values = ("compute in float32 (xf = x.float()), normalize xf, cast the normalized value back to x.dtype "
                   "with .type_as(x), and only then multiply by weight; casting back after the multiplication, "
                   "or not at all, rounds differently from MiniMind.")
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
    for label, x, w in cases:
        before = x.clone()
        got = call(fn, x, w, eps=1e-5, name=name)
        _unchanged(name, before, x)
        expected = reference_rms_norm(x, w, 1e-5)
        if isinstance(got, torch.Tensor) and got.dtype == expected.dtype and got.is_floating_point():
            if bool(torch.isfinite(expected).all()) and bool(((got == 0).all(-1) & (expected != 0).any(-1)).any()):
                raise ExerciseError(f"[{name} on {label}] some rows came back all zeros (expected non-zero values): "
                                    f"the squares overflowed.\n  hint: {hint_overflow}")
            if bool(torch.isfinite(expected).all()) and not bool(torch.isfinite(got).all()):
                raise ExerciseError(f"[{name} on {label}] your result has inf/NaN values where the reference "
                                    f"is finite.\n  hint: {hint_overflow}")
        # the same rounding steps as the reference: at most one ulp of the output dtype apart
        tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-5}[expected.dtype]
        wrong_dtype = isinstance(got, torch.Tensor) and got.dtype != expected.dtype
        check_close(got, expected, name=f"{name} on {label}", rtol=tol, atol=tol,
                    hint=hint_dtype if wrong_dtype else hint_values)
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
    return [("MiniMind2-Small", "MiniMind2-Small", small), ("a 3-layer MiniMind", "3-layer", three),
            ("a 5-layer MiniMind-MoE", "5-layer MoE", moe)]


@check("Exercise 1.4 count_rmsnorm")
def check_norm_count(fn: Callable[[torch.nn.Module], Any]) -> str:
    """``fn(model)`` must return the number of ``minimind_ref.RMSNorm`` modules in ``model``,
    counted from the model (three differently sized models, so a hard-coded number fails)."""
    name = "Exercise 1.4 count_rmsnorm"
    hint = ("walk every sub-module with model.modules() and count those that are instances of "
            "minimind_ref.RMSNorm (not torch.nn.RMSNorm). Each block has one before attention and one "
            "before the feed-forward network; do not forget the final norm after the last block.")
    results = []
    for label, short, model in _count_models():
        got = call(fn, model, name=name)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, bool) or not isinstance(got, int):
            raise ExerciseError(f"[{name}] expected an int, got {type(got).__name__}: {got!r:.80}\n  hint: {hint}")
        expected = count_rmsnorm_modules(model)
        if got != expected:
            raise ExerciseError(f"[{name} on {label}] expected {expected} RMSNorm modules, got {got}."
                                f"\n  hint: {hint}")
        results.append(f"{short}: {got}")
    return "; ".join(results)
