"""Checks for chapter 03 · Attention and GQA.

Each ``check_*`` runs the learner's function on inputs it makes itself (with its own random
generator, so the notebook's random stream is untouched), compares with PyTorch or
``minimind_ref`` and prints one ``✓`` line, or raises ``AssertionError`` saying on which input it
failed, which known mistake the result matches (computed on the same input), a hint about it,
and the line that says how to see a worked solution last.

    from minimind_ref.checks import ch03
    ch03.check_stable_softmax(stable_softmax)
    ch03.check_scaled_dot_product_attention(scaled_dot_product_attention)
    ch03.check_causal_mask(causal_mask)
    ch03.check_repeat_kv(repeat_kv)
    ch03.check_gqa_attention(gqa_attention)
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from ..attention import Attention
from ..attention import repeat_kv as _ref_repeat_kv
from ..config import MiniMindConfig
from ..rope import apply_rotary_pos_emb, precompute_freqs_cis
from .core import call, check, check_close, fail, seeded, solution

__all__ = [
    "check_stable_softmax",
    "check_scaled_dot_product_attention",
    "check_causal_mask",
    "check_repeat_kv",
    "check_gqa_attention",
]


# ----------------------------------------------------------------------------- 3.1 softmax
def _softmax_mistakes(x: torch.Tensor, dim: int) -> Dict[str, Callable[[], torch.Tensor]]:
    def normalise(e: torch.Tensor, d: int) -> torch.Tensor:
        return e / e.sum(d, keepdim=True)

    other = 0 if (dim % x.dim()) != 0 else x.dim() - 1
    return {
        "exp(x) without subtracting the maximum (exp overflows to inf, and inf / inf is NaN)":
            lambda: normalise(torch.exp(x), dim),
        "the maximum of the whole tensor subtracted instead of each row's (rows far below it underflow to 0 / 0)":
            lambda: normalise(torch.exp(x - x.max()), dim),
        f"a softmax over dimension {other} instead of dim={dim}":
            lambda: normalise(torch.exp(x - x.max(other, keepdim=True).values), other),
        "normalised by the sum over the whole tensor instead of along dim":
            lambda: torch.exp(x - x.max()) / torch.exp(x - x.max()).sum(),
        "the shifted logits returned without exp (x - max)": lambda: x - x.max(dim, keepdim=True).values,
        "exp(x - max) without dividing by the sum": lambda: torch.exp(x - x.max(dim, keepdim=True).values),
    }


solution("3.1", "e = torch.exp(x - x.max(dim=dim, keepdim=True).values); return e / e.sum(dim=dim, keepdim=True)")


@check("Exercise 3.1 stable_softmax")
def check_stable_softmax(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(x, dim=-1)`` must equal ``torch.softmax(x, dim)``, also for logits in the thousands,
    and leave ``x`` unchanged."""
    name = "Exercise 3.1 stable_softmax"
    hint = ("softmax(x) = softmax(x - c) for any c taken along dim; with c the maximum along dim, every exponent is "
            "at most 0, so nothing overflows, and the largest term is exp(0) = 1.")
    crash = "dim may be any axis (0, -1, ...): reduce along it with keepdim=True so the result broadcasts against x."
    g = seeded(301)
    big = torch.tensor([[1000.0, 1001.0, 1002.0], [-1000.0, -1001.0, -1002.0], [88.0, 89.0, 90.0]])
    masked = torch.randn(3, 5, generator=g)
    masked[0, 3:] = float("-inf")
    masked[2, :4] = float("-inf")
    cases = [
        ("random logits [4, 7], dim=-1", torch.randn(4, 7, generator=g) * 3, -1),
        ("random logits [5, 3], dim=0", torch.randn(5, 3, generator=g) * 3, 0),
        ("a batch of rows [2, 3, 6], dim=-1", torch.randn(2, 3, 6, generator=g), -1),
        ("logits [[1000, 1001, 1002], [-1000, -1001, -1002], [88, 89, 90]], dim=-1", big, -1),
        ("rows with -inf entries (as a mask makes them), dim=-1", masked, -1),
    ]
    for label, x, dim in cases:
        got = call(fn, x, dim=dim, name=name, case=label, hint=crash, check_inputs=True)
        check_close(got, torch.softmax(x, dim=dim), name=name, case=label, hint=hint,
                    mistakes=_softmax_mistakes(x, dim))
    return "matches torch.softmax, no overflow at logits of 1000"


# ----------------------------------------------------------------------------- 3.2 SDPA
def _sdpa_mistakes(q, k, v, mask) -> Dict[str, Callable[[], torch.Tensor]]:
    d = q.shape[-1]
    scores = q @ k.transpose(-2, -1)
    add = 0 if mask is None else mask
    return {
        "no scaling (softmax(q k^T) v: the 1/sqrt(d) is missing)": lambda: torch.softmax(scores + add, -1) @ v,
        "scores divided by d instead of sqrt(d)": lambda: torch.softmax(scores / d + add, -1) @ v,
        "scores multiplied by sqrt(d) instead of divided": lambda: torch.softmax(scores * math.sqrt(d) + add, -1) @ v,
        "the softmax over the query axis (dim=-2) instead of the key axis":
            lambda: torch.softmax(scores / math.sqrt(d) + add, -2) @ v,
        "the mask ignored": lambda: torch.softmax(scores / math.sqrt(d), -1) @ v,
        "the mask added after the softmax": lambda: (torch.softmax(scores / math.sqrt(d), -1) + add) @ v,
        "the mask applied before the 1/sqrt(d) scaling (fine for -inf, but no: the mask is added to the "
        "scaled scores)": lambda: torch.softmax((scores + add) / math.sqrt(d), -1) @ v,
        "the attention weights returned instead of weights @ v": lambda: torch.softmax(scores / math.sqrt(d) + add, -1),
    }


solution("3.2", "scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]); if mask is not None: scores = scores + mask; "
                "return stable_softmax(scores, dim=-1) @ v")


@check("Exercise 3.2 scaled_dot_product_attention")
def check_scaled_dot_product_attention(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(q, k, v, mask=None)`` must equal ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask)``
    for an additive float mask (0 = visible, -inf = hidden)."""
    name = "Exercise 3.2 scaled_dot_product_attention"
    hint = ("score every query against every key (q k^T), scale by 1/sqrt(d) with d = q.shape[-1], add the mask, "
            "softmax along the keys, and take that weighted average of the values.")
    crash = ("q is [..., s, d] and k, v are [..., t, d]: the scores q @ k.transpose(-2, -1) are [..., s, t]; there may "
             "be fewer queries than keys, and mask may be None.")
    g = seeded(302)
    causal5 = torch.full((5, 5), float("-inf")).triu(1)
    cases = [
        ("no mask, head_dim 16", (2, 3, 5, 5, 16), None),
        ("no mask, head_dim 64, 4 queries over 9 keys", (1, 2, 4, 9, 64), None),
        ("an additive causal mask [5, 5] (0 and -inf)", (2, 2, 5, 5, 8), causal5),
    ]
    for label, (b, h, s, t, d), mask in cases:
        q = torch.randn(b, h, s, d, generator=g)
        k = torch.randn(b, h, t, d, generator=g)
        v = torch.randn(b, h, t, d, generator=g)
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        case = f"q {tuple(q.shape)}, k and v {tuple(k.shape)}, {label}"
        got = call(fn, q, k, v, mask=mask, name=name, case=case, hint=crash, check_inputs=True)
        check_close(got, expected, name=name, case=case, hint=hint,
                    mistakes=_sdpa_mistakes(q, k, v, mask))
    return "matches torch.nn.functional.scaled_dot_product_attention"


# ----------------------------------------------------------------------------- 3.3 causal mask
def _expected_causal(q_len: int, kv_len: int) -> torch.Tensor:
    return torch.full((q_len, kv_len), float("-inf")).triu(kv_len - q_len + 1)


def _causal_mistakes(q_len: int, kv_len: int) -> Dict[str, Callable[[], torch.Tensor]]:
    full = torch.full((q_len, kv_len), float("-inf"))
    return {
        "the diagonal hidden too (each query must see its own key: j <= i is visible)":
            lambda: full.triu(kv_len - q_len),
        "the triangle aligned top-left (query i sees keys 0..i), ignoring the kv_len - q_len cached keys in front":
            lambda: full.triu(1),
        "the visible and hidden parts swapped (the lower triangle masked)": lambda: full.tril(kv_len - q_len),
        "a 1/0 mask (1 = visible) instead of an additive 0/-inf one":
            lambda: torch.ones(q_len, kv_len).tril(kv_len - q_len),
    }


solution("3.3", "kv_len = q_len if kv_len is None else kv_len; return torch.triu(torch.full((q_len, kv_len), "
                "float('-inf')), diagonal=kv_len - q_len + 1)")


@check("Exercise 3.3 causal_mask")
def check_causal_mask(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(q_len, kv_len=None)`` -> float32 ``[q_len, kv_len]``: 0 where key ``j`` is visible to
    query ``i`` (``j <= i + kv_len - q_len``), ``-inf`` elsewhere."""
    name = "Exercise 3.3 causal_mask"
    hint = ("query i sits at absolute position i + (kv_len - q_len) (the cached keys come first) and sees every key "
            "j up to that position, its own included. Without a cache that is j <= i.")
    for q_len, kv_len in [(5, None), (1, None), (2, None), (3, 7), (1, 9)]:
        t = q_len if kv_len is None else kv_len
        label = f"causal_mask({q_len})" if kv_len is None else f"causal_mask({q_len}, {kv_len})"
        args = (q_len,) if kv_len is None else (q_len, kv_len)
        got = call(fn, *args, name=name, case=label,
                   hint="kv_len is optional: causal_mask(q_len) means kv_len = q_len (def causal_mask(q_len, kv_len=None)).")
        expected = _expected_causal(q_len, t)
        wrong_dtype = isinstance(got, torch.Tensor) and got.dtype != expected.dtype
        check_close(got, expected, name=name, case=label, mistakes=_causal_mistakes(q_len, t),
                    hint=("the mask is added to float scores, so it is a float32 tensor of 0 and float('-inf') "
                          "(a bool mask cannot be added).") if wrong_dtype else hint)
        hidden = torch.isinf(expected)
        finite = got[hidden][got[hidden] != float("-inf")]
        if finite.numel():  # check_close lets a large negative pass as "close" to -inf only via the inf check
            fail(name, f"hidden positions must hold -inf (exp(-inf) = 0 exactly), got values like {float(finite[0]):g} "
                 f"(on {label})", "use float('-inf') for the masked entries.")
    return "0 on and below the (bottom-right aligned) diagonal, -inf above"


# ----------------------------------------------------------------------------- 3.4 repeat_kv
def _repeat_mistakes(x: torch.Tensor, n_rep: int) -> Dict[str, Callable[[], torch.Tensor]]:
    return {
        "the heads tiled ([a, b, a, b]: x.repeat) instead of each repeated in a row ([a, a, b, b])":
            lambda: x.repeat(1, 1, n_rep, 1),
        "the sequence axis (dim 1) repeated instead of the heads axis (dim 2)":
            lambda: torch.repeat_interleave(x, n_rep, dim=1),
        "the last axis (head_dim) repeated instead of the heads axis (dim 2)":
            lambda: torch.repeat_interleave(x, n_rep, dim=3),
        "the input returned unchanged": lambda: x.clone(),
    }


solution("3.4", "torch.repeat_interleave(x, n_rep, dim=2), or x[:, :, :, None, :].expand(b, t, n_kv, n_rep, d)"
                ".reshape(b, t, n_kv * n_rep, d)")


@check("Exercise 3.4 repeat_kv")
def check_repeat_kv(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(x, n_rep)``: ``[b, t, n_kv, d] -> [b, t, n_kv * n_rep, d]``, output head ``j`` = KV head ``j // n_rep``."""
    name = "Exercise 3.4 repeat_kv"
    hint = ("query heads g*n_rep .. g*n_rep + n_rep - 1 share KV head g, so each KV head appears n_rep times in a row "
            "along dim 2: heads [a, b] with n_rep = 2 become [a, a, b, b].")
    g = seeded(304)
    for b, t, n_kv, d, n_rep in [(2, 5, 2, 4, 4), (1, 3, 4, 8, 2), (2, 3, 2, 6, 1), (1, 4, 1, 4, 8), (1, 2, 3, 2, 3)]:
        x = torch.randn(b, t, n_kv, d, generator=g)
        case = f"x {tuple(x.shape)}, n_rep={n_rep}"
        got = call(fn, x, n_rep, name=name, case=case, check_inputs=True,
                   hint="x is [batch, t, n_kv_heads, head_dim] (the cache layout); the heads are dim 2.")
        check_close(got, _ref_repeat_kv(x, n_rep), name=name, case=case, hint=hint,
                    mistakes=_repeat_mistakes(x, n_rep))
    return "head j of the output is KV head j // n_rep"


# ----------------------------------------------------------------------------- 3.5 GQA forward
def _small_attention(n_kv_heads: int, seed: int) -> Attention:
    cfg = MiniMindConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=n_kv_heads,
                         num_hidden_layers=1, vocab_size=32, max_position_embeddings=64)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        attn = Attention(cfg)
    return attn.eval()


def _gqa_variant(attn, x, cos, sin, mask, past, *, scale=True, tiled=False, pad_value=-1e9, causal="bottom-right",
                 rope_q=True, rope_k=True, use_past=True, cache_repeated=False) -> Tuple[torch.Tensor, Tuple]:
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
    rep = (lambda z: z.repeat(1, 1, attn.n_rep, 1)) if tiled else (lambda z: _ref_repeat_kv(z, attn.n_rep))
    kr, vr = rep(k), rep(v)
    full = torch.full((s, t), float("-inf"))
    allowed = {"bottom-right": full.triu(t - s + 1), "top-left": full.triu(1), "diagonal hidden": full.triu(t - s),
               "none": torch.zeros(s, t)}[causal]
    scores = q.transpose(1, 2) @ kr.transpose(1, 2).transpose(-2, -1)
    if scale:
        scores = scores / math.sqrt(attn.head_dim)
    scores = scores + allowed
    if mask is not None and pad_value is not None:
        m = mask[:, None, None, :]
        if m.shape[-1] != t:  # the cache ignored: the mask is longer than the keys
            m = m[..., -t:]
        scores = scores + (1.0 - m) * pad_value
    out = torch.softmax(scores, dim=-1) @ vr.transpose(1, 2)
    out = attn.o_proj(out.transpose(1, 2).reshape(b, s, -1))
    return out, ((kr, vr) if cache_repeated else (k, v))


_GQA_MISTAKES = {
    "no 1/sqrt(head_dim) scaling of the scores": dict(scale=False),
    "the KV heads tiled (x.repeat) instead of repeated in a row (repeat_kv)": dict(tiled=True),
    "padding added as -inf ((1 - mask) * -inf is 0 * -inf = NaN where mask is 1, and a query that sees only "
    "padding gets a row of -inf, whose softmax is NaN)":
        dict(pad_value=float("-inf")),
    "the padding mask ignored": dict(pad_value=None),
    "the causal triangle aligned top-left (with a cache, new query i sits at position p + i, not i)":
        dict(causal="top-left"),
    "the diagonal hidden (a query must see its own key)": dict(causal="diagonal hidden"),
    "no causal mask": dict(causal="none"),
    "RoPE applied to q only (the keys need it too)": dict(rope_k=False),
    "RoPE applied to k only (the queries need it too)": dict(rope_q=False),
    "the cache ignored (past keys and values not put in front of the new ones)": dict(use_past=False),
}


def _gqa_output_mistakes(attn, x, cos, sin, mask, past) -> Dict[str, Callable[[], torch.Tensor]]:
    def thunk(kwargs):
        def compute() -> torch.Tensor:
            with torch.no_grad():
                return _gqa_variant(attn, x, cos, sin, mask, past, **kwargs)[0]
        return compute
    return {description: thunk(kwargs) for description, kwargs in _GQA_MISTAKES.items()}


def _compare_gqa(fn, attn, x, cos, sin, mask, past, label: str, hint: str) -> None:
    name = "Exercise 3.5 gqa_attention"
    with torch.no_grad():
        expected, present = attn(x, (cos, sin), past_key_value=past, use_cache=True, attention_mask=mask)
        got = call(fn, attn, x, cos, sin, mask, past, name=name, case=label,
                   check_inputs=True,
                   hint="x is [b, s, hidden]; cos, sin are [s, head_dim]; attention_mask is [b, p + s] or None; "
                        "past_key_value is (k, v), each [b, p, n_kv_heads, head_dim], or None. Create masks on x.device.")
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        fail(name, f"expected a tuple (output, (k, v)), got {type(got).__name__} (on {label})",
             "return out, (k, v) where k, v are the cache tensors [b, t, n_kv_heads, head_dim].")
    out, kv = got
    check_close(out, expected, name=name, case=f"{label}, the output", hint=hint,
                mistakes=_gqa_output_mistakes(attn, x, cos, sin, mask, past))
    if not (isinstance(kv, (tuple, list)) and len(kv) == 2):
        fail(name, f"the second return value must be the pair (k, v), got {type(kv).__name__} (on {label})",
             "return out, (k, v).")
    kv_hint = ("the cache holds keys *after* RoPE and values, *before* repeat_kv ([b, t, n_kv_heads, head_dim], "
               "the n_kv_heads of the layer), with the p past positions first.")
    with torch.no_grad():
        repeated = _gqa_variant(attn, x, cos, sin, mask, past, cache_repeated=True)[1]
        no_rope = _gqa_variant(attn, x, cos, sin, mask, past, rope_k=False)[1]
        no_past = _gqa_variant(attn, x, cos, sin, mask, past, use_past=False)[1]
    for i, what in enumerate(("k", "v")):
        check_close(kv[i], present[i], name=name, case=f"{label}, the cached {what}", hint=kv_hint,
                    mistakes={"the repeated keys/values cached (after repeat_kv: n_heads instead of n_kv_heads)":
                              repeated[i],
                              "keys cached before RoPE": no_rope[i],
                              "only the new positions cached (the past entries must come first)": no_past[i]})


solution("3.5", "project with attn.q_proj/k_proj/v_proj and view as [b, s, heads, head_dim]; apply_rotary_pos_emb(q, k, "
                "cos, sin); put the past k, v in front (torch.cat on dim 1); keep that pair for the cache; repeat_kv; "
                "transpose to [b, heads, ., head_dim]; mask = causal_mask(s, p + s) (+ (1 - attention_mask[:, None, None, "
                ":]) * -1e9); scaled_dot_product_attention; merge the heads; attn.o_proj.")


@check("Exercise 3.5 gqa_attention")
def check_gqa_attention(fn: Callable[..., tuple]) -> str:
    """``fn(attn, x, cos, sin, attention_mask=None, past_key_value=None) -> (out, (k, v))`` must equal
    ``attn(x, (cos, sin), past_key_value, use_cache=True, attention_mask=attention_mask)`` for MHA, GQA
    and MQA layers, full prefill (the reference's SDPA path), padding and a KV cache (its explicit path)."""
    g = seeded(305)
    base_hint = ("every query head reads the KV head of its group, the scores are scaled by 1/sqrt(head_dim), and "
                 "query i sees keys 0..i (positions, RoPE applied to q and k).")
    pad_hint = ("padding is additive and finite: scores + (1 - mask) * -1e9, broadcast over heads and queries. With "
                "-inf instead, a query that sees only padding gets a row of -inf and softmax returns NaN.")
    cache_hint = ("with a cache of length p, the s new queries sit at positions p .. p+s-1: the keys are the p cached "
                  "ones followed by the new ones, and new query i may see every cached key and new keys 0..i (the "
                  "causal mask covers the last s key columns, aligned bottom-right).")
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
