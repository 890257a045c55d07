"""Checks for chapter 03 · Attention and GQA.

Each check compares the learner's function with PyTorch (``F.scaled_dot_product_attention``) and
``minimind_ref`` (``Attention``, ``repeat_kv``) on inputs it makes itself, and reports as
``minimind_ref.checks`` describes.

    from minimind_ref.checks import ch03
    ch03.check_stable_softmax(stable_softmax)
    ch03.check_scaled_dot_product_attention(scaled_dot_product_attention)
    ch03.check_causal_mask(causal_mask)
    ch03.check_repeat_kv(repeat_kv)
    ch03.check_gqa_attention(gqa_attention)
    ch03.check_qk_norm_attention(QKNormAttention)
    ch03.check_qk_logit_bound(qk_logit_bound)
"""

from __future__ import annotations

import math
import sys
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from ..attention import Attention
from ..attention import repeat_kv as _ref_repeat_kv
from ..config import MiniMindConfig
from ..rope import apply_rotary_pos_emb, precompute_freqs_cis
from .core import (Outcome, Shortcut, as_number, call, check, check_close, check_numbers, fail, refused, seeded,
                   solution)

__all__ = [
    "check_stable_softmax",
    "check_scaled_dot_product_attention",
    "check_causal_mask",
    "check_repeat_kv",
    "check_gqa_attention",
    "check_qk_norm_attention",
    "check_qk_logit_bound",
]


# ----------------------------------------------------------------------------- 3.1 softmax
_SM_WHOLE = "the maximum of the whole tensor subtracted instead of each row's (rows far below it underflow to 0 / 0)"
_SM_LAST = "the constant taken along the last dimension whatever dim is (along dim it then differs from row to row)"
_SM_MIN = "each row's minimum subtracted (the largest exponent can then still overflow)"
_SM_MEAN = "each row's mean subtracted (the largest exponent can then still overflow)"
_SM_NONE = "the exponentials taken without subtracting a constant (they overflow to inf, and inf / inf is NaN)"
_SM_HINTS = {
    _SM_WHOLE: ("one row's logits may all lie far below another row's: what do its exponentials become, and what is "
                "its denominator then? The constant is chosen per row."),
    _SM_LAST: "the case asks for a softmax along dim=0: along which dimension must each constant be taken?",
    _SM_MIN: ("run yours on the check's row [-1000, 0, 100, 1000]: which exponent is then the largest, and does it "
              "fit in float32 (section 2 printed the limit)?"),
    _SM_MEAN: ("run yours on a row whose logits are spread over thousands: which exponent is then the largest, and does "
               "it fit in float32 (section 2 printed the limit)?"),
    _SM_NONE: "section 2 shows why a constant can be taken out of the logits: the check's rows of ±1000 need one.",
}
_SM_DTYPE = ("the result keeps x's dtype (the attention that follows runs in it): if a step computes in another dtype, "
             "come back to x's at the end.")


def _softmax_mistakes(x: torch.Tensor, dim: int) -> Dict[str, Callable[[], torch.Tensor]]:
    def normalise(e: torch.Tensor, d: int) -> torch.Tensor:
        return e / e.sum(d, keepdim=True)

    other = 0 if (dim % x.dim()) != 0 else x.dim() - 1
    return {
        _SM_NONE: lambda: normalise(torch.exp(x), dim),
        _SM_WHOLE: lambda: normalise(torch.exp(x - x.max()), dim),
        _SM_LAST: lambda: normalise(torch.exp(x - x.max(-1, keepdim=True).values), dim),
        _SM_MIN: lambda: normalise(torch.exp(x - x.min(dim, keepdim=True).values), dim),
        _SM_MEAN: lambda: normalise(torch.exp(x - x.mean(dim, keepdim=True)), dim),
        f"a softmax over dimension {other} instead of dim={dim}":
            lambda: normalise(torch.exp(x - x.max(other, keepdim=True).values), other),
        "normalised by the sum over the whole tensor instead of along dim":
            lambda: torch.exp(x - x.max()) / torch.exp(x - x.max()).sum(),
        "the shifted logits returned without the exponential": lambda: x - x.max(dim, keepdim=True).values,
        "the exponentials returned without dividing by their sum": lambda: torch.exp(x - x.max(dim, keepdim=True).values),
    }


def _softmax_shortcuts() -> list:
    import torch.nn.functional as F_

    return [Shortcut("torch.softmax", (torch, "softmax"), (torch.Tensor, "softmax"), (F_, "softmax"),
                     (torch.special, "softmax"), (torch.nn.Softmax, "forward")),
            Shortcut("torch.log_softmax", (torch, "log_softmax"), (torch.Tensor, "log_softmax"), (F_, "log_softmax"),
                     (torch.special, "log_softmax"), (torch.nn.LogSoftmax, "forward"))]


solution("3.1", "e = torch.exp(x - x.max(dim=dim, keepdim=True).values); return e / e.sum(dim=dim, keepdim=True)")


@check("Exercise 3.1 stable_softmax", shown=True,
       why="one entry of a softmax of random logits, whose entries the message does not show")
def check_stable_softmax(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(x, dim=-1)`` must equal ``torch.softmax(x, dim)``, also for logits in the thousands, in x's dtype
    (float32, float16, bfloat16), and leave ``x`` unchanged; torch's softmax and log_softmax are switched off while
    ``fn`` runs."""
    name = "Exercise 3.1 stable_softmax"
    hint = ("section 2 shows why a constant can be taken out of the logits without changing the result; the check's "
            "rows of ±1000 show what the constant must prevent: an exponent that overflows, and a denominator that "
            "underflows to 0. Compare your constant with the case the check names.")
    crash = ("dim may be any axis (0, -1, ...): reduce along it and keep the reduced dimension (the reductions have an "
             "argument for it), so the result broadcasts against x.")
    refuse_hint = "build it from exponentials and a sum, as section 2 writes the softmax."
    g = seeded(301)
    big = torch.tensor([[1000.0, 1001.0, 1002.0], [-1000.0, -1001.0, -1002.0], [88.0, 89.0, 90.0]])
    masked = torch.randn(3, 5, generator=g)
    masked[0, 3:] = float("-inf")
    masked[2, :4] = float("-inf")
    spread = torch.tensor([[-1000.0, 0.0, 100.0, 1000.0], [5.0, -2.0, 1.0, 0.5]])
    cases = [
        ("random logits [4, 7], dim=-1", torch.randn(4, 7, generator=g) * 3, -1),
        ("random logits [5, 3], dim=0", torch.randn(5, 3, generator=g) * 3, 0),
        ("a batch of rows [2, 3, 6], dim=-1", torch.randn(2, 3, 6, generator=g), -1),
        ("logits [[1000, 1001, 1002], [-1000, -1001, -1002], [88, 89, 90]], dim=-1", big, -1),
        ("logits spread over thousands [[-1000, 0, 100, 1000], [5, -2, 1, 0.5]], dim=-1", spread, -1),
        ("rows with -inf entries (as a mask makes them), dim=-1", masked, -1),
        ("float16 logits [3, 8], dim=-1", (torch.randn(3, 8, generator=g) * 2).half(), -1),
        ("bfloat16 logits [2, 3, 5], dim=1", (torch.randn(2, 3, 5, generator=g) * 2).bfloat16(), 1),
    ]
    # a softmax computed in float16 or bfloat16 itself (x - c rounded, then its exponential) differs from torch's,
    # which computes in float32 inside, by a few of the dtype's roundings: the tolerance allows that, the dtype is exact
    tolerances = {torch.float16: 1e-2, torch.bfloat16: 5e-2}
    for label, x, dim in cases:
        no_keepdim = {"the constant taken without keeping the reduced dimension":
                      lambda x=x, dim=dim: torch.exp(x - x.max(dim).values)}
        with refused(name, fn, _softmax_shortcuts(), refuse_hint):
            got = call(fn, x, dim=dim, name=name, case=label, hint=crash, check_inputs=True, crash_mistakes=no_keepdim)
        expected = torch.softmax(x, dim=dim)
        tol = tolerances.get(x.dtype)
        wrong_dtype = isinstance(got, torch.Tensor) and got.dtype != expected.dtype
        check_close(got, expected, name=name, case=label, hint=_SM_DTYPE if wrong_dtype else hint, rtol=tol, atol=tol,
                    mistakes=_softmax_mistakes(x, dim), mistake_hints=_SM_HINTS)
    return "matches torch.softmax along any dim, in x's dtype, no overflow at logits in the thousands"


# ----------------------------------------------------------------------------- 3.2 SDPA
_SDPA_TRANSPOSED = "the keys transposed on other axes than their last two (a batch of heads has more than two axes)"


_SDPA_QUERIES = "scores divided by the square root of the number of queries instead of head_dim"
_SDPA_KEYS = "scores divided by the square root of the number of keys instead of head_dim"
_SDPA_MASK_FIRST = "the mask added before the scaling (the scaling then divides the mask too)"
_SDPA_DRAFT = "the draft's scaling and mask both still there"
_SDPA_HINTS = {
    _SDPA_QUERIES: ("section 3 found what the scores are divided by: which number of the draft stands for it, and is it "
                    "the same number when the queries are not as many as the head is wide?"),
    _SDPA_KEYS: ("section 3 found what the scores are divided by: which size of q, k or v is it, whatever the number "
                 "of queries and keys?"),
    _SDPA_MASK_FIRST: ("a mask is a bias on the scores: try one of small finite numbers against "
                       "F.scaled_dot_product_attention, adding it before and after the scaling."),
    _SDPA_TRANSPOSED: ("print the shape of what your code multiplies q with, for this case: which two axes of the keys "
                       "must trade places, whatever comes before them?"),
    _SDPA_DRAFT: ("two inputs show the draft's two remaining mistakes: fewer queries than the head is wide, and a mask "
                  "of small finite numbers; try each against F.scaled_dot_product_attention."),
    "the softmax over the query axis (dim=-2) instead of the key axis":
        "each query's weights are a distribution over the keys: along which axis of the scores do the keys lie?",
}


def _sdpa_mistakes(q, k, v, mask) -> Dict[str, Callable[[], torch.Tensor]]:
    d = q.shape[-1]
    scores = q @ k.transpose(-2, -1)
    add = 0 if mask is None else mask
    return {
        "no scaling of the scores (the division by the square root of head_dim is missing)":
            lambda: torch.softmax(scores + add, -1) @ v,
        "scores divided by head_dim instead of by its square root": lambda: torch.softmax(scores / d + add, -1) @ v,
        "scores multiplied by the square root of head_dim instead of divided by it":
            lambda: torch.softmax(scores * math.sqrt(d) + add, -1) @ v,
        _SDPA_QUERIES: lambda: torch.softmax(scores / math.sqrt(q.shape[-2]) + add, -1) @ v,
        _SDPA_KEYS: lambda: torch.softmax(scores / math.sqrt(k.shape[-2]) + add, -1) @ v,
        _SDPA_MASK_FIRST: lambda: torch.softmax((scores + add) / math.sqrt(d), -1) @ v,
        _SDPA_DRAFT: lambda: torch.softmax((scores + add) / math.sqrt(q.shape[-2]), -1) @ v,
        "the softmax over the query axis (dim=-2) instead of the key axis":
            lambda: torch.softmax(scores / math.sqrt(d) + add, -2) @ v,
        "the mask ignored": lambda: torch.softmax(scores / math.sqrt(d), -1) @ v,
        "the mask added after the softmax": lambda: (torch.softmax(scores / math.sqrt(d), -1) + add) @ v,
        "the mask applied to the weights after the softmax (the hidden keys zeroed, the others not renormalized)":
            lambda: (torch.softmax(scores / math.sqrt(d), -1) * (add == 0)) @ v,
        "the attention weights returned instead of the weighted sum of the values": lambda: torch.softmax(scores / math.sqrt(d) + add, -1),
    }


def _sdpa_crashes(q, k, v) -> Dict[str, list]:
    """The mistakes of Exercise 3.2 that crash on these inputs, to name a crash by the error it raises."""
    return {_SDPA_TRANSPOSED: [lambda: q @ k.T, lambda: q @ k.transpose(1, 2), lambda: q @ k.transpose(0, 1)]}


solution("3.2", "scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]); if mask is not None: scores = scores + mask; "
                "return stable_softmax(scores, dim=-1) @ v")


@check("Exercise 3.2 scaled_dot_product_attention", shown=True,
       why="one entry of attention over random tensors, whose entries the message does not show")
def check_scaled_dot_product_attention(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(q, k, v, mask=None)`` must equal ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask)``
    for an additive float mask (0 = visible, -inf = hidden, other values a bias on the scores), with any leading
    axes and fewer queries than keys; PyTorch's fused attention is switched off while ``fn`` runs."""
    name = "Exercise 3.2 scaled_dot_product_attention"
    hint = ("compare with the formula of section 1 and the scaling of section 3 on the case the check names: which "
            "scores, scaled by what, where the mask enters, along which axis the softmax runs, and what it weights.")
    crash = ("q is [..., s, d] and k, v are [..., t, d]: the scores of s queries against t keys are [..., s, t]; print "
             "the shapes of what your code multiplies for this case (there may be fewer queries than keys, several "
             "leading axes, and mask may be None).")
    refuse_hint = "build it from section 1's formula with your stable_softmax; PyTorch's kernel is the reference."
    shortcuts = [Shortcut("torch.nn.functional.scaled_dot_product_attention",
                          (F, "scaled_dot_product_attention"))]
    g = seeded(302)
    causal5 = torch.full((5, 5), float("-inf")).triu(1)
    distance = (torch.arange(4)[:, None] - torch.arange(6)[None, :]).abs().float()
    cases = [
        ("no mask, head_dim 16, 5 queries over 7 keys", (2, 3, 5, 7, 16), None),
        ("no mask, head_dim 64, 4 queries over 9 keys", (1, 2, 4, 9, 64), None),
        ("an additive causal mask [5, 5] (0 and -inf)", (2, 2, 5, 5, 8), causal5),
        ("a bias mask [4, 6] of small finite numbers (-0.5 times the distance of query and key)", (2, 2, 4, 6, 8),
         -0.5 * distance),
    ]
    for label, (b, h, s, t, d), mask in cases:
        q = torch.randn(b, h, s, d, generator=g)
        k = torch.randn(b, h, t, d, generator=g)
        v = torch.randn(b, h, t, d, generator=g)
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        case = f"q {tuple(q.shape)}, k and v {tuple(k.shape)}, {label}"
        with refused(name, fn, shortcuts, refuse_hint):
            got = call(fn, q, k, v, mask=mask, name=name, case=case, hint=crash, check_inputs=True,
                       crash_mistakes=_sdpa_crashes(q, k, v), crash_hints=_SDPA_HINTS)
        check_close(got, expected, name=name, case=case, hint=hint,
                    mistakes=_sdpa_mistakes(q, k, v, mask), mistake_hints=_SDPA_HINTS)
    # the leading axes are "...": no batch axis at all (q [heads, s, d]) is an input too
    q, k, v = (torch.randn(3, n, 8, generator=g) for n in (4, 6, 6))
    case = "q (3, 4, 8), k and v (3, 6, 8): no batch axis, 4 queries over 6 keys"
    with refused(name, fn, shortcuts, refuse_hint):
        got = call(fn, q, k, v, mask=None, name=name, case=case, hint=crash, check_inputs=True,
                   crash_mistakes=_sdpa_crashes(q, k, v), crash_hints=_SDPA_HINTS)
    check_close(got, F.scaled_dot_product_attention(q, k, v), name=name, case=case, hint=hint,
                mistakes=_sdpa_mistakes(q, k, v, None), mistake_hints=_SDPA_HINTS)
    return ("matches torch.nn.functional.scaled_dot_product_attention: any leading axes, fewer queries than keys, "
            "causal and bias masks")


# ----------------------------------------------------------------------------- 3.3 causal mask
def _expected_causal(q_len: int, kv_len: int) -> torch.Tensor:
    return torch.full((q_len, kv_len), float("-inf")).triu(kv_len - q_len + 1)


_CM_TOP_LEFT = "the triangle aligned top-left, ignoring the cached keys in front of the queries"
_CM_DIAGONAL = "the diagonal hidden too (each query must see its own key)"
_CM_SHIFTED = "the triangle shifted by the number of cached keys, but towards the wrong side"
_CM_HINTS = {
    _CM_TOP_LEFT: ("the case has cached keys in front of the new queries (kv_len minus q_len of them): at which "
                   "absolute position does the first new query sit, and which positions may it read?"),
    _CM_DIAGONAL: "which key may a token always read, whatever else is hidden?",
    _CM_SHIFTED: ("the case has cached keys in front of the new queries (kv_len minus q_len of them): at which absolute "
                  "position does the first new query sit? Draw this case by hand and compare it with yours row by row."),
    "the visible and hidden parts swapped (the lower triangle masked)":
        "a token reads the past, never the future: which side of the diagonal is the future?",
    "the future visible and the past hidden (the triangle the wrong way round)":
        "a token reads the past, never the future: which side of the diagonal is the future?",
}


def _causal_mistakes(q_len: int, kv_len: int) -> Dict[str, Callable[[], torch.Tensor]]:
    full = torch.full((q_len, kv_len), float("-inf"))
    return {
        _CM_DIAGONAL: lambda: full.triu(kv_len - q_len),
        _CM_TOP_LEFT: lambda: full.triu(1),
        _CM_SHIFTED: lambda: full.triu(q_len - kv_len + 1),
        "the visible and hidden parts swapped (the lower triangle masked)": lambda: full.tril(kv_len - q_len),
        "the future visible and the past hidden (the triangle the wrong way round)":
            lambda: full.tril(kv_len - q_len - 1),
        "a 1/0 mask (1 = visible) instead of an additive 0/-inf one":
            lambda: torch.ones(q_len, kv_len).tril(kv_len - q_len),
    }


solution("3.3", "kv_len = q_len if kv_len is None else kv_len; return torch.triu(torch.full((q_len, kv_len), "
                "float('-inf')), diagonal=kv_len - q_len + 1)")


@check("Exercise 3.3 causal_mask", shown=True,
       why="a mask entry is 0 or -inf: it tells where the mask is wrong, the case names the shape")
def check_causal_mask(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(q_len, kv_len=None)`` -> float32 ``[q_len, kv_len]``: 0 where key ``j`` is visible to
    query ``i`` (``j <= i + kv_len - q_len``), ``-inf`` elsewhere."""
    name = "Exercise 3.3 causal_mask"
    hint = ("draw the case the check names by hand (the exercise's second hint does it for causal_mask(2, 5)) and "
            "compare it with yours row by row: where does each new query sit, and which keys may it read?")
    for q_len, kv_len in [(5, None), (1, None), (2, None), (3, 7), (1, 9)]:
        t = q_len if kv_len is None else kv_len
        label = f"causal_mask({q_len})" if kv_len is None else f"causal_mask({q_len}, {kv_len})"
        args = (q_len,) if kv_len is None else (q_len, kv_len)
        got = call(fn, *args, name=name, case=label,
                   hint="kv_len is optional: causal_mask(q_len) alone means as many keys as queries (give kv_len a "
                        "default of None).")
        expected = _expected_causal(q_len, t)
        hidden = torch.isinf(expected)
        if isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(expected.shape) and got.is_floating_point() \
                and bool((got[~hidden] == 0).all()) and bool(hidden.any()):
            finite = got[hidden][got[hidden] != float("-inf")]
            if finite.numel() and bool((finite < -1e3).all()):
                fail(name, f"this looks like a large finite negative number for the hidden keys instead of -inf: got "
                     f"values like {float(finite[0]):g} (on {label})",
                     "a finite number leaves a hidden key a weight that is tiny but not exactly 0, and a row of them "
                     "rounds differently: section 4 says which value removes a key exactly.")
        wrong_dtype = isinstance(got, torch.Tensor) and got.dtype != expected.dtype
        check_close(got, expected, name=name, case=label, mistakes=_causal_mistakes(q_len, t), mistake_hints=_CM_HINTS,
                    hint=("the mask is added to float32 scores: which dtype must it have, and which two values (a "
                          "bool mask cannot be added)?") if wrong_dtype else hint)
        finite = got[hidden][got[hidden] != float("-inf")]
        if finite.numel():  # check_close lets a large negative pass as "close" to -inf only via the inf check
            fail(name, f"hidden positions must hold -inf (exp(-inf) = 0 exactly), got values like {float(finite[0]):g} "
                 f"(on {label})", "use float('-inf') for the masked entries.")
    return "0 on and below the (bottom-right aligned) diagonal, -inf above"


# ----------------------------------------------------------------------------- 3.4 repeat_kv
def _repeat_mistakes(x: torch.Tensor, n_rep: int) -> Dict[str, Callable[[], torch.Tensor]]:
    return {
        "the heads tiled ([a, b, a, b]: the whole set repeated), which is not the order PyTorch's enable_gqa uses":
            lambda: x.repeat(1, 1, n_rep, 1),
        "the sequence axis (dim 1) repeated instead of the heads axis (dim 2)":
            lambda: torch.repeat_interleave(x, n_rep, dim=1),
        "the last axis (head_dim) repeated instead of the heads axis (dim 2)":
            lambda: torch.repeat_interleave(x, n_rep, dim=3),
        "the input returned unchanged": lambda: x.clone(),
    }


solution("3.4", "x itself where nothing repeats (n_rep of 1); else torch.repeat_interleave(x, n_rep, dim=2), or "
                "x[:, :, :, None, :].expand(b, t, n_kv, n_rep, d).reshape(b, t, n_kv * n_rep, d)")


@check("Exercise 3.4 repeat_kv", shown=True,
       why="one entry of random tensors, repeated: nothing to read back beyond the layout")
def check_repeat_kv(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(x, n_rep)``: ``[b, t, n_kv, d] -> [b, t, n_kv * n_rep, d]``, output head ``j`` = KV head ``j // n_rep``
    (the grouping of ``F.scaled_dot_product_attention(..., enable_gqa=True)``)."""
    name = "Exercise 3.4 repeat_kv"
    hint = ("compare with the KV head PyTorch's kernel gives each query head with enable_gqa=True: give every KV head "
            "values that say which head it is, and read which one each query head returns.")
    g = seeded(304)
    shortcuts = [Shortcut("minimind_ref.repeat_kv", (sys.modules[_ref_repeat_kv.__module__], "repeat_kv"))]
    for b, t, n_kv, d, n_rep in [(2, 5, 2, 4, 4), (1, 3, 4, 8, 2), (2, 3, 2, 6, 1), (1, 4, 1, 4, 8), (1, 2, 3, 2, 3)]:
        x = torch.randn(b, t, n_kv, d, generator=g)
        case = f"x {tuple(x.shape)}, n_rep={n_rep}"
        with refused(name, fn, shortcuts, "find the order by experiment, as the exercise asks; minimind_ref's "
                     "repeat_kv is the reference."):
            got = call(fn, x, n_rep, name=name, case=case, check_inputs=True,
                       hint="x is [batch, t, n_kv_heads, head_dim] (the cache layout); the heads are dim 2.")
        check_close(got, _ref_repeat_kv(x, n_rep), name=name, case=case, hint=hint,
                    mistakes=_repeat_mistakes(x, n_rep))
        if n_rep == 1 and got is not x:
            fail(name, f"with n_rep == 1 your function returns a new tensor; the contract asks for x itself there (on "
                 f"{case}): a copy of every cached key and value that changes nothing",
                 "nothing is repeated when n_rep is 1: what is the cheapest result then?")
    return "head j of the output is KV head j // n_rep; x itself when n_rep == 1"


# ----------------------------------------------------------------------------- 3.5 GQA forward
def _repeat(z: torch.Tensor, n_rep: int) -> torch.Tensor:
    """repeat_kv for the mistakes' variants (a copy of its own: a learner's wrong version built on them runs while the
    check switches minimind_ref's repeat_kv off)."""
    return torch.repeat_interleave(z, n_rep, dim=2)


def _small_attention(n_kv_heads: int, seed: int) -> Attention:
    cfg = MiniMindConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=n_kv_heads,
                         num_hidden_layers=1, vocab_size=32, max_position_embeddings=64)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        attn = Attention(cfg)
    return attn.eval()


def _gqa_variant(attn, x, cos, sin, mask, past, *, scale=True, tiled=False, pad_value=-1e9, causal="bottom-right",
                 rope_q=True, rope_k=True, use_past=True, cache_repeated=False, merge="transpose", o_proj=True,
                 pad_axis="keys") -> Tuple[torch.Tensor, Tuple]:
    """The exercise's forward with one typical mistake switched in (the defaults are the right answer)."""
    b, s, _ = x.shape
    q = attn.q_proj(x).view(b, s, attn.n_heads, attn.head_dim)
    k = attn.k_proj(x).view(b, s, attn.n_kv_heads, attn.head_dim)
    v = attn.v_proj(x).view(b, s, attn.n_kv_heads, attn.head_dim)
    q_rot, k_rot = apply_rotary_pos_emb(q, k, cos, sin)
    q, k = (q_rot if rope_q else q), (k_rot if rope_k else k)
    if past is not None and use_past:
        k = torch.cat([past[0], k], dim=1)
        v = torch.cat([past[1], v], dim=1)
    t = k.shape[1]
    rep = (lambda z: z.repeat(1, 1, attn.n_rep, 1)) if tiled else (lambda z: _repeat(z, attn.n_rep))
    kr, vr = rep(k), rep(v)
    full = torch.full((s, t), float("-inf"))
    allowed = {"bottom-right": full.triu(t - s + 1), "top-left": full.triu(1), "diagonal hidden": full.triu(t - s),
               "none": torch.zeros(s, t), "square": torch.full((s, s), float("-inf")).triu(1)}[causal]
    scores = q.transpose(1, 2) @ kr.transpose(1, 2).transpose(-2, -1)
    if scale:
        scores = scores / math.sqrt(attn.head_dim)
    scores = scores + allowed
    if mask is not None and pad_value is not None:
        m = mask[:, None, None, :] if pad_axis == "keys" else mask[:, None, :, None]
        if pad_axis == "keys" and m.shape[-1] != t:  # the cache ignored: the mask is longer than the keys
            m = m[..., -t:]
        scores = scores + (1.0 - m) * pad_value
    out = torch.softmax(scores, dim=-1) @ vr.transpose(1, 2)
    out = out.transpose(1, 2).reshape(b, s, -1) if merge == "transpose" else out.reshape(b, s, -1)
    out = attn.o_proj(out) if o_proj else out
    return out, ((kr, vr) if cache_repeated else (k, v))


_GQA_TOP_LEFT = "the causal triangle aligned top-left (with a cache, the new queries sit after the cached positions)"
_GQA_MERGE = "the heads merged without undoing the split's transpose (section 6 merges in two steps)"
_GQA_NO_O = "o_proj left out (the merged heads go through o_proj, section 6)"
_GQA_PAD_AXIS = "the padding mask laid along the queries instead of the keys"
_GQA_PAD_INF = ("padding added as -inf (0 times -inf is NaN where the mask is 1, and a query that sees only padding "
                "gets a row of -inf, whose softmax is NaN)")
_GQA_SQUARE = "the causal mask built for the new tokens only, without columns for the cached keys"
_GQA_MISTAKES = {
    "no scaling of the scores by the square root of head_dim": dict(scale=False),
    "the KV heads tiled (x.repeat) instead of repeated in a row (repeat_kv)": dict(tiled=True),
    _GQA_PAD_INF: dict(pad_value=float("-inf")),
    "the padding mask ignored": dict(pad_value=None),
    "a padding constant larger in magnitude than section 5's (-1e10, float32's lowest number, ...): where a padding "
    "query's scores pass 32 in magnitude, the rounding next to the constant (section 5) changes its weights":
        dict(pad_value=-1e10),
    "a padding constant smaller in magnitude than section 5's (-1e8, ...): the rounding next to the constant "
    "(section 5) changes a padding query's weights": dict(pad_value=-1e8),
    _GQA_TOP_LEFT: dict(causal="top-left"),
    "the diagonal hidden (a query must see its own key)": dict(causal="diagonal hidden"),
    "no causal mask": dict(causal="none"),
    "RoPE applied to q only (the keys need it too)": dict(rope_k=False),
    "RoPE applied to k only (the queries need it too)": dict(rope_q=False),
    "the cache ignored (past keys and values not put in front of the new ones)": dict(use_past=False),
    _GQA_MERGE: dict(merge="reshape"),
    _GQA_NO_O: dict(o_proj=False),
    _GQA_PAD_AXIS: dict(pad_axis="queries"),
}
_GQA_HINTS = {
    _GQA_SQUARE: ("with a cache of p positions the scores have a column for every key, cached ones included: print "
                  "the shapes of your scores and of your causal mask for this case (Exercise 3.3 takes two lengths)."),
    _GQA_MERGE: "print the shape after each step of your merge and compare with section 6's trace, step by step.",
    _GQA_NO_O: "section 6's trace ends with one more step after the merge: compare yours with it.",
    _GQA_PAD_AXIS: ("a pad position must not be read by anyone: is it a row or a column of the scores, and along "
                    "which axis does your mask vary?"),
    _GQA_PAD_INF: ("a query that sees only padding: what does its row of scores become with your constant, and its "
                   "softmax? Section 5 measured it."),
    "the padding mask ignored": "the case has padding: section 5 shows how MiniMind puts it into the scores.",
    _GQA_TOP_LEFT: ("with a cache of p positions, at which absolute positions do the new queries sit (Exercise 3.3)? "
                    "Print your mask's shape and rows for this case."),
    "the KV heads tiled (x.repeat) instead of repeated in a row (repeat_kv)":
        "section 7 decided which KV head each query head reads: use your repeat_kv of Exercise 3.4.",
    "the cache ignored (past keys and values not put in front of the new ones)":
        "the case has a cache of p positions: where do its keys and values go in this call?",
}


def _gqa_output_mistakes(attn, x, cos, sin, mask, past) -> Dict[str, Callable[[], torch.Tensor]]:
    def thunk(kwargs):
        def compute() -> torch.Tensor:
            with torch.no_grad():
                return _gqa_variant(attn, x, cos, sin, mask, past, **kwargs)[0]
        return compute
    return {description: thunk(kwargs) for description, kwargs in _GQA_MISTAKES.items()}


def _gqa_shortcuts() -> list:
    return [Shortcut("minimind_ref.Attention's own forward", (Attention, "forward"), (Attention, "_sdpa"),
                     (Attention, "_explicit")),
            Shortcut("minimind_ref.repeat_kv", (sys.modules[_ref_repeat_kv.__module__], "repeat_kv")),
            Shortcut("torch.nn.functional.scaled_dot_product_attention", (F, "scaled_dot_product_attention"))]


_KV_BEFORE_ROPE = "keys cached before RoPE"
_KV_REPEATED = "the repeated keys/values cached (after repeat_kv: n_heads instead of n_kv_heads)"
_KV_NEW_ONLY = "only the new positions cached (the past entries must come first)"
_KV_HINTS = {
    _KV_BEFORE_ROPE: ("the next call rotates only its own new keys, by their positions: what must already have been "
                      "done to the keys it finds in the cache?"),
    _KV_REPEATED: "section 7 measured how many heads the real cache keeps: compare the shape of yours.",
    _KV_NEW_ONLY: "the next call needs every earlier position's keys and values, not only this call's.",
}


def _compare_gqa(fn, attn, x, cos, sin, mask, past, label: str, hint: str) -> None:
    name = "Exercise 3.5 gqa_attention"
    with torch.no_grad():
        expected, present = attn(x, (cos, sin), past_key_value=past, use_cache=True, attention_mask=mask)
        with refused(name, fn, _gqa_shortcuts(),
                     "build the forward from the projections and your own pieces of sections 4 to 7; attn's own "
                     "forward is the reference the check compares with."):
            got = call(fn, attn, x, cos, sin, mask, past, name=name, case=label, check_inputs=True,
                       hint="x is [b, s, hidden]; cos, sin are [s, head_dim]; attention_mask is [b, past and new "
                            "positions] or None; past_key_value is (k, v), each [b, p, n_kv_heads, head_dim], or None. "
                            "Print the shapes of your scores and of every mask you add to them for this case. Create "
                            "masks on x.device.",
                       crash_mistakes={_GQA_SQUARE: lambda: _gqa_variant(attn, x, cos, sin, mask, past, causal="square")},
                       crash_hints=_GQA_HINTS)
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        fail(name, f"expected a tuple (output, (k, v)), got {type(got).__name__} (on {label})",
             "return out, (k, v) where k, v are the cache tensors [b, t, n_kv_heads, head_dim].")
    out, kv = got
    check_close(out, expected, name=name, case=f"{label}, the output", hint=hint,
                mistakes=_gqa_output_mistakes(attn, x, cos, sin, mask, past), mistake_hints=_GQA_HINTS)
    if not (isinstance(kv, (tuple, list)) and len(kv) == 2):
        fail(name, f"the second return value must be the pair (k, v), got {type(kv).__name__} (on {label})",
             "return out, (k, v).")
    kv_hint = ("the cache is what the next call reads back as its past: compare each axis of yours (batch, positions, "
               "heads, head_dim) and what has been done to the keys with what that call expects to find.")
    with torch.no_grad():
        repeated = _gqa_variant(attn, x, cos, sin, mask, past, cache_repeated=True)[1]
        no_rope = _gqa_variant(attn, x, cos, sin, mask, past, rope_k=False)[1]
        no_past = _gqa_variant(attn, x, cos, sin, mask, past, use_past=False)[1]
    for i, what in enumerate(("k", "v")):
        check_close(kv[i], present[i], name=name, case=f"{label}, the cached {what}", hint=kv_hint,
                    mistakes={_KV_REPEATED: repeated[i], _KV_BEFORE_ROPE: no_rope[i], _KV_NEW_ONLY: no_past[i]},
                    mistake_hints=_KV_HINTS)


solution("3.5", "project with attn.q_proj/k_proj/v_proj and view as [b, s, heads, head_dim]; apply_rotary_pos_emb(q, k, "
                "cos, sin); put the past k, v in front (torch.cat on dim 1); keep that pair for the cache; repeat_kv; "
                "transpose to [b, heads, ., head_dim]; mask = causal_mask(s, p + s) (+ (1 - attention_mask[:, None, None, "
                ":]) * -1e9); scaled_dot_product_attention; merge the heads; attn.o_proj.")


@check("Exercise 3.5 gqa_attention", shown=True,
       why="one entry of an attention layer's output on random weights and inputs")
def check_gqa_attention(fn: Callable[..., tuple]) -> str:
    """``fn(attn, x, cos, sin, attention_mask=None, past_key_value=None) -> (out, (k, v))`` must equal
    ``attn(x, (cos, sin), past_key_value, use_cache=True, attention_mask=attention_mask)`` for MHA, GQA
    and MQA layers, full prefill (the reference's SDPA path), padding and a KV cache (its explicit path)."""
    g = seeded(305)
    base_hint = ("follow section 6's trace step by step on this case (print every shape), and compare each step with "
                 "the piece of sections 4 to 7 it uses: RoPE on what, the KV heads each query head reads, the scaling, "
                 "the masks, the merge.")
    pad_hint = ("compare how padding enters your scores with section 5's cell, on this batch padded on the left: "
                "which constant, where the mask is 0, along which axis.")
    cache_hint = ("with a cache of p positions, the s new queries come after them (Exercise 3.3): print which keys "
                  "each new query of this case may read in your mask, and compare with where it sits.")
    b, p, s = 2, 5, 6
    cos_all, sin_all = precompute_freqs_cis(16, 32)
    for n_kv, kind in [(2, "GQA 4 query heads / 2 KV heads"), (1, "MQA"), (4, "MHA")]:
        attn = _small_attention(n_kv, seed=3050 + n_kv)
        x = torch.randn(b, s, 64, generator=g)
        cos, sin = cos_all[:s], sin_all[:s]
        _compare_gqa(fn, attn, x, cos, sin, None, None, f"{kind}, full prefill", base_hint)
        ones = torch.ones(b, s)
        _compare_gqa(fn, attn, x, cos, sin, ones, None, f"{kind}, all-ones mask", base_hint)
        mask = torch.ones(b, s)
        mask[0, :3] = 0  # left padding: queries 0..2 of row 0 see only padding
        mask[1, :1] = 0
        _compare_gqa(fn, attn, x, cos, sin, mask, None, f"{kind}, left-padded batch", pad_hint)
        if n_kv != 2:
            continue
        # large activations: some padding queries score padding keys above 32 in magnitude, where -1e9 + score no
        # longer rounds to -1e9 (section 5) and another padding constant gives other weights; every such score lies
        # more than 3 from a rounding boundary (tests/test_checks_ch03.py), so no float noise can flip it
        big = torch.randn(b, s, 64, generator=seeded(3070)) * 8
        mask = torch.ones(b, s)
        mask[0, :4] = 0
        mask[1, :2] = 0
        _compare_gqa(fn, attn, big, cos, sin, mask, None, f"{kind}, left-padded batch with large activations (padding "
                     "queries score padding keys above 32 in magnitude)", pad_hint)
        # a KV cache of p tokens, then one new token (decode) and then three new tokens (chunked prefill)
        with torch.no_grad():
            _, past = attn(torch.randn(b, p, 64, generator=g), (cos_all[:p], sin_all[:p]), use_cache=True)
        for n_new in (1, 3):
            x_new = torch.randn(b, n_new, 64, generator=g)
            cos, sin = cos_all[p:p + n_new], sin_all[p:p + n_new]
            _compare_gqa(fn, attn, x_new, cos, sin, None, past, f"{kind}, cache of {p} + {n_new} new", cache_hint)
        mask = torch.ones(b, p + 3)
        mask[1, :2] = 0
        _compare_gqa(fn, attn, x_new, cos, sin, mask, past, f"{kind}, cache + padding mask", cache_hint + " " + pad_hint)
    return "MHA, GQA and MQA; prefill, padding and KV-cache cases equal minimind_ref.Attention"


# ----------------------------------------------------------------------------- 3.6 QK-norm in the forward
def _qk_config(head_dim: Optional[int]) -> MiniMindConfig:
    """A small minimind-3 layer: 4 query heads, 2 KV heads, QK-norm (eps 1e-6); head_dim may differ from
    hidden_size / heads, as minimind-3 allows."""
    return MiniMindConfig(generation="minimind-3", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=head_dim, num_hidden_layers=1, vocab_size=32, max_position_embeddings=64)


def _qk_reference(cfg: MiniMindConfig, seed: int) -> Attention:
    """``minimind_ref.Attention`` with QK-norm and gains that are neither 1 nor equal across dimensions
    (a norm placed after RoPE, or a gain per head, gives other numbers only then)."""
    g = seeded(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        attn = Attention(cfg)
    with torch.no_grad():
        attn.q_norm.weight.copy_(torch.rand(cfg.head_dim, generator=g) * 1.5 + 0.25)
        attn.k_norm.weight.copy_(torch.rand(cfg.head_dim, generator=g) * 1.5 + 0.25)
    return attn.eval()


def _norm_over(x: torch.Tensor, gain: torch.Tensor, eps: float, axis: str) -> torch.Tensor:
    """RMS-normalize ``x`` [b, s, heads, head_dim] over one axis, then apply the [head_dim] gain."""
    if axis == "head_dim":
        return gain * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    if axis == "heads":
        return gain * (x * torch.rsqrt(x.pow(2).mean(-2, keepdim=True) + eps))
    flat = x.flatten(-2)  # "hidden": all heads of the token together
    return gain * (flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + eps)).view_as(x)


def _qk_variant(attn: Attention, x, cos, sin, mask, past, *, where: str = "before", axis: str = "head_dim",
                norm_q: bool = True, norm_k: bool = True, swap: bool = False,
                eps: Optional[float] = None, norm_v: bool = False) -> Tuple[torch.Tensor, Tuple]:
    """The QK-norm forward with one typical mistake switched in (the defaults are the right answer)."""
    b, s, _ = x.shape
    q = attn.q_proj(x).view(b, s, attn.n_heads, attn.head_dim)
    k = attn.k_proj(x).view(b, s, attn.n_kv_heads, attn.head_dim)
    v = attn.v_proj(x).view(b, s, attn.n_kv_heads, attn.head_dim)
    gq, gk = attn.q_norm.weight, attn.k_norm.weight
    if swap:
        gq, gk = gk, gq
    eps = attn.q_norm.eps if eps is None else eps

    def normalize(q, k):
        return (_norm_over(q, gq, eps, axis) if norm_q else q), (_norm_over(k, gk, eps, axis) if norm_k else k)

    if where == "before":
        q, k = normalize(q, k)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    if where == "after":
        q, k = normalize(q, k)
    if norm_v:
        v = _norm_over(v, gk, eps, "head_dim")
    if past is not None:
        k = torch.cat([past[0], k], dim=1)
        v = torch.cat([past[1], v], dim=1)
    t = k.shape[1]
    scores = q.transpose(1, 2) @ _repeat(k, attn.n_rep).transpose(1, 2).transpose(-2, -1)
    scores = scores / math.sqrt(attn.head_dim) + torch.full((s, t), float("-inf")).triu(t - s + 1)
    if mask is not None:
        scores = scores + (1.0 - mask[:, None, None, :]) * -1e9
    out = torch.softmax(scores, dim=-1) @ _repeat(v, attn.n_rep).transpose(1, 2)
    return attn.o_proj(out.transpose(1, 2).reshape(b, s, -1)), (k, v)


_QK_EPS_DEFAULT = ("the norms' eps left at RMSNorm's default, 1e-5, instead of the configuration's rms_norm_eps "
                   "(minimind-3's is smaller)")
_QK_EPS_TORCH = ("torch.nn.RMSNorm's default eps (None: the machine epsilon of the input's dtype) instead of the "
                 "configuration's rms_norm_eps")
_QK_MISTAKES = {
    "the norms applied after RoPE: their gains then multiply rotated coordinates, and a score depends on the two "
    "positions themselves, not only on their offset": dict(where="after"),
    "no QK-norm at all": dict(where="none"),
    "only the queries normalized (the keys need k_norm too)": dict(norm_k=False),
    "only the keys normalized (the queries need q_norm too)": dict(norm_q=False),
    "q_norm and k_norm swapped (q_norm's gain on the keys, k_norm's on the queries)": dict(swap=True),
    "the RMS taken over the heads axis (dim 2) instead of over each head's head_dim values": dict(axis="heads"),
    "the RMS taken over all heads of a token together (the whole projection) instead of over each head":
        dict(axis="hidden"),
    _QK_EPS_DEFAULT: dict(eps=1e-5),
    _QK_EPS_TORCH: dict(eps=torch.finfo(torch.float32).eps),
    "the values normalized too (QK-norm normalizes the queries and the keys only)": dict(norm_v=True),
}
_QK_EPS_HINT = "the exercise's bullet says which eps the two norms take: compare your norms' eps with it."


def _qk_output_mistakes(attn, x, cos, sin, mask, past, which: int) -> Dict[str, Callable[[], torch.Tensor]]:
    def thunk(kwargs):
        def compute() -> torch.Tensor:
            with torch.no_grad():
                out, (k, v) = _qk_variant(attn, x, cos, sin, mask, past, **kwargs)
            return (out, k, v)[which]
        return compute
    return {description: thunk(kwargs) for description, kwargs in _QK_MISTAKES.items()}


def _qk_structure(layer: Any, ref: Attention, cfg: MiniMindConfig, name: str) -> None:
    """Compare the learner's parameters with ``ref``'s, naming the structural mistakes, then load ``ref``'s."""
    hint = ("q_norm and k_norm are RMSNorm modules with a learned gain (eps from the config); decide how many values "
            "each one normalizes at a time: that is its width.")
    if not isinstance(layer, torch.nn.Module):
        fail(name, f"QKNormAttention(config) must build an nn.Module, got {type(layer).__name__}", hint)
    got = {k: tuple(v.shape) for k, v in layer.state_dict().items()}
    d, heads, kv, hidden = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
    for key, n in (("q_norm.weight", heads), ("k_norm.weight", kv)):
        module = key.split(".")[0]
        if key not in got:
            if not isinstance(getattr(layer, module, None), torch.nn.Module):
                fail(name, f"the layer has no {module} module (no parameter {key}) (on head_dim={d})", hint)
            fail(name, f"this looks like {module} without a learned gain: the state dict has no {key} (a norm "
                 f"built with elementwise_affine=False, or a bare function) (on head_dim={d})", hint)
        shape = got[key]
        if shape == (d,):
            continue
        if shape == (hidden,) and hidden == n * d:
            what = f"this looks like a norm over the hidden size, or one gain per head: {module}.weight has shape [{hidden}]"
        elif shape in ((n, d), (n * d,)):
            what = f"this looks like one gain per head: {module}.weight has shape {list(shape)}"
        elif shape == (hidden,):
            what = f"this looks like a norm over the hidden size: {module}.weight has shape [{hidden}]"
        else:
            what = f"{module}.weight has shape {list(shape)}, which is not the width of what QK-norm normalizes"
        fail(name, f"{what} (on head_dim={d})", hint)
    for module in ("q_norm", "k_norm"):
        if not hasattr(getattr(layer, module), "eps"):
            continue  # a norm of the learner's own: the case with tiny activations tells its eps
        eps = getattr(layer, module).eps
        if eps is None or not isinstance(eps, (int, float)) or not math.isclose(eps, cfg.rms_norm_eps, rel_tol=1e-6):
            label = (_QK_EPS_TORCH if eps is None else _QK_EPS_DEFAULT if isinstance(eps, (int, float)) and
                     math.isclose(eps, 1e-5) else f"{module}.eps = {eps!r}, not the configuration's rms_norm_eps")
            fail(name, f"this looks like {label} (on head_dim={d})", _QK_EPS_HINT)
    extra = sorted(set(got) - set(ref.state_dict()))
    if any(k.startswith(("q_norm.", "k_norm.")) and k.endswith("bias") for k in extra):
        fail(name, f"this looks like LayerNorm instead of RMSNorm: the norms have a bias ({', '.join(extra)})", hint)
    try:
        layer.load_state_dict(ref.state_dict(), strict=True)
    except Exception as err:  # missing or unexpected keys, other shapes: say which
        fail(name, f"the layer's parameters are not those of minimind_ref.Attention(qk_norm=True): "
             f"{str(err).splitlines()[0]:.300} (on head_dim={d})",
             "keep q_proj, k_proj, v_proj, o_proj as given and add exactly q_norm and k_norm.")
    layer.eval()


solution("3.6", "in __init__: self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps) and the same for k_norm; in "
                "forward, after the view into heads and before RoPE: q, k = self.q_norm(q), self.k_norm(k)")


@check("Exercise 3.6 QKNormAttention", shown=True,
       why="one entry of an attention layer's output on random weights, inputs and gains")
def check_qk_norm_attention(cls: Callable[..., Any]) -> str:
    """``cls(config)`` must build a layer with ``minimind_ref.Attention(qk_norm=True)``'s parameters
    (``q_norm.weight`` and ``k_norm.weight`` of ``[head_dim]``), and ``layer(x, cos, sin,
    attention_mask=None, past_key_value=None) -> (out, (k, v))`` must equal the reference for
    prefill, padding and a KV cache, with gains that are not all equal."""
    name = "Exercise 3.6 QKNormAttention"
    hint = ("decide, for each of the two norms, which vectors it sees (one head's) and where in the forward it acts, "
            "relative to the split into heads and to RoPE: the order must keep chapter 02's relative-position property "
            "whatever the gains are.")
    crash = ("QKNormAttention(config) builds the layer; layer(x, cos, sin, attention_mask, past_key_value) returns "
             "(out, (k, v)); x is [b, s, hidden], q and k are [b, s, heads, head_dim] after the view.")
    g = seeded(306)
    b, p = 2, 5
    for head_dim in (None, 24):
        cfg = _qk_config(head_dim)
        d = cfg.head_dim
        ref = _qk_reference(cfg, seed=3060 + d)
        with torch.random.fork_rng(devices=[]):
            layer = call(cls, cfg, name=name, case=f"QKNormAttention(config) with head_dim={d}", hint=crash)
        _qk_structure(layer, ref, cfg, name)
        cos_all, sin_all = precompute_freqs_cis(d, 32)
        scenarios = [("full prefill", torch.randn(b, 6, 64, generator=g), None, None)]
        if head_dim is None:
            padded = torch.ones(b, 6)
            padded[0, :2] = 0
            scenarios.append(("left-padded batch", torch.randn(b, 6, 64, generator=g), padded, None))
            with torch.no_grad():
                _, past = ref(torch.randn(b, p, 64, generator=g), (cos_all[:p], sin_all[:p]), use_cache=True)
            scenarios += [("cache of 5 + 1 new token", torch.randn(b, 1, 64, generator=g), None, past),
                          ("cache of 5 + 3 new tokens", torch.randn(b, 3, 64, generator=g), None, past),
                          ("tiny activations (queries and keys of RMS about 1e-3, where eps matters)",
                           torch.randn(b, 6, 64, generator=g) * 2e-3, None, None)]
        for label, x, mask, past in scenarios:
            start = 0 if past is None else past[0].shape[1]
            cos, sin = cos_all[start:start + x.shape[1]], sin_all[start:start + x.shape[1]]
            case = f"head_dim={d}, {label}"
            with torch.no_grad():
                expected, present = ref(x, (cos, sin), past, use_cache=True, attention_mask=mask)
                with refused(name, layer, [Shortcut("minimind_ref.Attention's own forward", (Attention, "forward"),
                                                    (Attention, "_sdpa"), (Attention, "_explicit"))],
                             "write the forward yourself (the part after the norms is given in the stub); "
                             "minimind_ref.Attention is the reference the check compares with."):
                    got = call(layer, x, cos, sin, mask, past, name=name, case=case, hint=crash, check_inputs=True)
            if not (isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(got[1], (tuple, list))
                    and len(got[1]) == 2):
                fail(name, f"expected (output, (k, v)), got {type(got).__name__} (on {case})", "return out, (k, v).")
            out, (k, v) = got
            eps_hints = {_QK_EPS_DEFAULT: _QK_EPS_HINT, _QK_EPS_TORCH: _QK_EPS_HINT}
            check_close(out, expected, name=name, case=f"{case}, the output", hint=hint,
                        mistakes=_qk_output_mistakes(ref, x, cos, sin, mask, past, 0), mistake_hints=eps_hints)
            check_close(k, present[0], name=name, case=f"{case}, the cached keys",
                        hint=("the cache holds the keys exactly as attention uses them: compare each step your keys "
                              "go through (the norm and its eps, RoPE) with the output's."),
                        mistakes=_qk_output_mistakes(ref, x, cos, sin, mask, past, 1), mistake_hints=eps_hints)
            check_close(v, present[1], name=name, case=f"{case}, the cached values",
                        hint="the values are not normalized: only queries and keys are.")
    return "q_norm and k_norm over head_dim, before RoPE; prefill, padding and KV cache equal minimind_ref.Attention"


# ----------------------------------------------------------------------------- 3.7 the logit bound
def _bound_gains(seed: int) -> list:
    """Gain pairs whose largest entries sit in one RoPE pair (the same index, or i and i + d/2), where
    the bound is reached; signs and sizes vary."""
    g = seeded(seed)
    cases = []
    for d, same_index, q_peak, k_peak in [(16, True, 2.0, 1.5), (96, False, 3.0, 0.5), (8, True, -1.75, 2.5),
                                           (64, False, 1.25, -3.0)]:
        q = torch.rand(d, generator=g) * 0.9 + 0.05
        k = torch.rand(d, generator=g) * 0.9 + 0.05
        i = int(torch.randint(0, d // 2, (1,), generator=g))
        q[i] = q_peak
        k[i if same_index else i + d // 2] = k_peak
        cases.append((f"head_dim {d}, largest gains {q_peak:g} (q, index {i}) and {k_peak:g} (k, index "
                      f"{i if same_index else i + d // 2})", q, k))
    ones = torch.ones(96)
    cases.append(("head_dim 96, every gain 1 (as at initialization)", ones, ones.clone()))
    return cases


_B_LENGTH = ("try a normalized head vector with all its length on one coordinate: how long can it be after the gain, "
             "and which gain decides it?")
_B_HINTS = {
    "the two gains multiplied coordinate by coordinate":
        ("RoPE rotates every pair of coordinates: after it, can a query's coordinate meet a key's coordinate at "
         "another index than its own?"),
    "the lengths (L2 norms) of the gain vectors used": _B_LENGTH,
    "the products of the two gains summed coordinate by coordinate":
        ("RoPE rotates every pair of coordinates: after it, can a query's coordinate meet a key's coordinate at "
         "another index than its own?"),
    "the mean size of the gains used": _B_LENGTH,
    "the length of a normalized head vector taken as 1":
        "compute the length of RMSNorm's output (before the gain) for a vector of your choice of head_dim values.",
    "the length of a normalized head vector taken as 1, and attention's division applied on top":
        "compute the length of RMSNorm's output (before the gain) for a vector of your choice of head_dim values.",
    "attention's division of the logits forgotten": "a logit is the score attention puts into the softmax: section 3.",
}


def _bound_mistakes(q: torch.Tensor, k: torch.Tensor) -> Dict[str, float]:
    d = q.shape[0]
    qm, km = q.abs().max().item(), k.abs().max().item()
    return {
        "attention's division of the logits forgotten": qm * km * d,
        "the length of a normalized head vector taken as 1": qm * km,
        "the length of a normalized head vector taken as 1, and attention's division applied on top": qm * km / math.sqrt(d),
        "the gains left out (they stretch the normalized vectors)": math.sqrt(d),
        "the two gains multiplied coordinate by coordinate": math.sqrt(d) * (q * k).abs().max().item(),
        "the products of the two gains summed coordinate by coordinate": (q * k).abs().sum().item() / math.sqrt(d),
        "the lengths (L2 norms) of the gain vectors used": q.norm().item() * k.norm().item() / math.sqrt(d),
        "the mean size of the gains used": math.sqrt(d) * q.abs().mean().item() * k.abs().mean().item(),
        "the largest gains taken without their absolute values (a negative gain of large size counts too)":
            math.sqrt(d) * q.max().item() * k.max().item(),
    }


solution("3.7", "return math.sqrt(d) * q_gain.abs().max().item() * k_gain.abs().max().item() with d = q_gain.shape[0]: "
                "|RMSNorm(x)| < sqrt(d) before the gain, the gain stretches it by at most max|g|, RoPE keeps lengths, "
                "and Cauchy-Schwarz bounds the dot product")


@check("Exercise 3.7 qk_logit_bound", shown=False,
       why="the bound is a closed form of the gains; the expected value next to the gains the case names would give "
           "the formula away")
def check_qk_logit_bound(fn: Callable[..., Any]) -> str:
    """``fn(q_gain, k_gain) -> float``: the largest ``|q . k| / sqrt(head_dim)`` QK-norm allows, which
    ``minimind_ref.attention.qk_logit_bound`` derives; checked on gains where that bound is reached
    (their largest entries in one RoPE pair), so it is the only right answer there."""
    from ..attention import qk_logit_bound as reference

    name = "Exercise 3.7 qk_logit_bound"
    hint = ("follow one head vector through the layer: how long can it be after the normalization, before the "
            "gain? What can the gain do to that length, and RoPE? Then bound the dot product by the two lengths, and "
            "scale it as attention does.")
    outcomes = []
    for label, q, k in _bound_gains(307):
        with refused(name, fn, [Shortcut("minimind_ref.attention.qk_logit_bound",
                                         (sys.modules[reference.__module__], "qk_logit_bound"))],
                     "derive the bound, as the exercise asks; minimind_ref's is the reference."):
            got = call(fn, q.clone(), k.clone(), name=name, case=label, check_inputs=True,
                       hint="q_gain and k_gain are 1-D tensors of head_dim values (q_norm.weight and k_norm.weight).")
        if isinstance(got, torch.Tensor):
            fail(name, f"expected a Python float, got a tensor (on {label}): the exercise returns the bound as a "
                 "float, a number the cells after it compare and print", "a one-element tensor converts to a Python "
                 "float (tensor.item() does it).")
        got = as_number(got, name, label, integer=False, what="the bound")
        outcomes.append(Outcome(label, got, reference(q, k), _bound_mistakes(q, k)))
    check_numbers(name, outcomes, hint, rel_tol=1e-5, mistake_hints=_B_HINTS)
    values = [o.got for o in outcomes]
    return f"the bound is sqrt(head_dim) times the largest gains; every gain 1 at head_dim 96 gives {values[-1]:.2f}"
