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
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from ..attention import Attention
from ..attention import repeat_kv as _ref_repeat_kv
from ..config import MiniMindConfig
from ..rope import apply_rotary_pos_emb, precompute_freqs_cis
from .core import Outcome, as_number, call, check, check_close, check_numbers, fail, seeded, solution

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
def _softmax_mistakes(x: torch.Tensor, dim: int) -> Dict[str, Callable[[], torch.Tensor]]:
    def normalise(e: torch.Tensor, d: int) -> torch.Tensor:
        return e / e.sum(d, keepdim=True)

    other = 0 if (dim % x.dim()) != 0 else x.dim() - 1
    return {
        "the exponentials taken without subtracting the maximum (they overflow to inf, and inf / inf is NaN)":
            lambda: normalise(torch.exp(x), dim),
        "the maximum of the whole tensor subtracted instead of each row's (rows far below it underflow to 0 / 0)":
            lambda: normalise(torch.exp(x - x.max()), dim),
        f"a softmax over dimension {other} instead of dim={dim}":
            lambda: normalise(torch.exp(x - x.max(other, keepdim=True).values), other),
        "normalised by the sum over the whole tensor instead of along dim":
            lambda: torch.exp(x - x.max()) / torch.exp(x - x.max()).sum(),
        "the shifted logits returned without the exponential": lambda: x - x.max(dim, keepdim=True).values,
        "the exponentials returned without dividing by their sum": lambda: torch.exp(x - x.max(dim, keepdim=True).values),
    }


solution("3.1", "e = torch.exp(x - x.max(dim=dim, keepdim=True).values); return e / e.sum(dim=dim, keepdim=True)")


@check("Exercise 3.1 stable_softmax", shown=True,
       why="one entry of a softmax of random logits, whose entries the message does not show")
def check_stable_softmax(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(x, dim=-1)`` must equal ``torch.softmax(x, dim)``, also for logits in the thousands,
    and leave ``x`` unchanged."""
    name = "Exercise 3.1 stable_softmax"
    hint = ("section 2 shows why any constant can be taken out of the logits without changing the result; choose one "
            "that leaves no exponent above 0 and one exponent at exactly 0, take it along dim, row by row, and keep "
            "the -inf entries' weight at 0.")
    crash = ("dim may be any axis (0, -1, ...): reduce along it and keep the reduced dimension (the reductions have an "
             "argument for it), so the result broadcasts against x.")
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
        "no scaling of the scores (the division by the square root of head_dim is missing)":
            lambda: torch.softmax(scores + add, -1) @ v,
        "scores divided by head_dim instead of by its square root": lambda: torch.softmax(scores / d + add, -1) @ v,
        "scores multiplied by the square root of head_dim instead of divided by it":
            lambda: torch.softmax(scores * math.sqrt(d) + add, -1) @ v,
        "the softmax over the query axis (dim=-2) instead of the key axis":
            lambda: torch.softmax(scores / math.sqrt(d) + add, -2) @ v,
        "the mask ignored": lambda: torch.softmax(scores / math.sqrt(d), -1) @ v,
        "the mask added after the softmax": lambda: (torch.softmax(scores / math.sqrt(d), -1) + add) @ v,
        "the mask added before the scaling (the mask is added to the scaled scores)": lambda: torch.softmax((scores + add) / math.sqrt(d), -1) @ v,
        "the attention weights returned instead of the weighted sum of the values": lambda: torch.softmax(scores / math.sqrt(d) + add, -1),
    }


solution("3.2", "scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]); if mask is not None: scores = scores + mask; "
                "return stable_softmax(scores, dim=-1) @ v")


@check("Exercise 3.2 scaled_dot_product_attention", shown=True,
       why="one entry of attention over random tensors, whose entries the message does not show")
def check_scaled_dot_product_attention(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(q, k, v, mask=None)`` must equal ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask)``
    for an additive float mask (0 = visible, -inf = hidden)."""
    name = "Exercise 3.2 scaled_dot_product_attention"
    hint = ("compare with the formula of section 1 and the scaling of section 3: which scores, scaled by what, where "
            "the mask enters, along which axis the softmax runs, and what it weights.")
    crash = ("q is [..., s, d] and k, v are [..., t, d]: the scores of s queries against t keys are [..., s, t]; there "
             "may be fewer queries than keys, and mask may be None.")
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
    # the leading axes are "...": no batch axis at all (q [heads, s, d]) is an input too
    q, k, v = (torch.randn(3, n, 8, generator=g) for n in (4, 6, 6))
    case = "q (3, 4, 8), k and v (3, 6, 8): no batch axis, 4 queries over 6 keys"
    got = call(fn, q, k, v, mask=None, name=name, case=case, hint=crash, check_inputs=True)
    check_close(got, F.scaled_dot_product_attention(q, k, v), name=name, case=case, hint=hint,
                mistakes=_sdpa_mistakes(q, k, v, None))
    return "matches torch.nn.functional.scaled_dot_product_attention, with and without a batch axis"


# ----------------------------------------------------------------------------- 3.3 causal mask
def _expected_causal(q_len: int, kv_len: int) -> torch.Tensor:
    return torch.full((q_len, kv_len), float("-inf")).triu(kv_len - q_len + 1)


def _causal_mistakes(q_len: int, kv_len: int) -> Dict[str, Callable[[], torch.Tensor]]:
    full = torch.full((q_len, kv_len), float("-inf"))
    return {
        "the diagonal hidden too (each query must see its own key)":
            lambda: full.triu(kv_len - q_len),
        "the triangle aligned top-left, ignoring the cached keys in front of the queries":
            lambda: full.triu(1),
        "the visible and hidden parts swapped (the lower triangle masked)": lambda: full.tril(kv_len - q_len),
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
    hint = ("with a cache the q_len queries are the last q_len of the kv_len positions (the cached keys come "
            "first); a query sees every key up to its own position, its own included.")
    for q_len, kv_len in [(5, None), (1, None), (2, None), (3, 7), (1, 9)]:
        t = q_len if kv_len is None else kv_len
        label = f"causal_mask({q_len})" if kv_len is None else f"causal_mask({q_len}, {kv_len})"
        args = (q_len,) if kv_len is None else (q_len, kv_len)
        got = call(fn, *args, name=name, case=label,
                   hint="kv_len is optional: causal_mask(q_len) alone means as many keys as queries (give kv_len a "
                        "default of None).")
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
        "the heads tiled ([a, b, a, b]: the whole set repeated), which is not the order PyTorch's enable_gqa uses":
            lambda: x.repeat(1, 1, n_rep, 1),
        "the sequence axis (dim 1) repeated instead of the heads axis (dim 2)":
            lambda: torch.repeat_interleave(x, n_rep, dim=1),
        "the last axis (head_dim) repeated instead of the heads axis (dim 2)":
            lambda: torch.repeat_interleave(x, n_rep, dim=3),
        "the input returned unchanged": lambda: x.clone(),
    }


solution("3.4", "torch.repeat_interleave(x, n_rep, dim=2), or x[:, :, :, None, :].expand(b, t, n_kv, n_rep, d)"
                ".reshape(b, t, n_kv * n_rep, d)")


@check("Exercise 3.4 repeat_kv", shown=True,
       why="one entry of random tensors, repeated: nothing to read back beyond the layout")
def check_repeat_kv(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(x, n_rep)``: ``[b, t, n_kv, d] -> [b, t, n_kv * n_rep, d]``, output head ``j`` = KV head ``j // n_rep``
    (the grouping of ``F.scaled_dot_product_attention(..., enable_gqa=True)``)."""
    name = "Exercise 3.4 repeat_kv"
    hint = ("compare with the KV head PyTorch's kernel gives each query head with enable_gqa=True: give every KV head "
            "values that say which head it is, and read which one each query head returns.")
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
    "no scaling of the scores by the square root of head_dim": dict(scale=False),
    "the KV heads tiled (x.repeat) instead of repeated in a row (repeat_kv)": dict(tiled=True),
    "padding added as -inf (0 times -inf is NaN where the mask is 1, and a query that sees only padding gets a row "
    "of -inf, whose softmax is NaN)":
        dict(pad_value=float("-inf")),
    "the padding mask ignored": dict(pad_value=None),
    "a padding constant larger in magnitude than section 5's (-1e10, float32's lowest number, ...): where a padding "
    "query's scores pass 32 in magnitude, the rounding next to the constant (section 5) changes its weights":
        dict(pad_value=-1e10),
    "a padding constant smaller in magnitude than section 5's (-1e8, ...): the rounding next to the constant "
    "(section 5) changes a padding query's weights": dict(pad_value=-1e8),
    "the causal triangle aligned top-left (with a cache, the new queries sit after the cached positions)":
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
                   hint="x is [b, s, hidden]; cos, sin are [s, head_dim]; attention_mask is [b, past and new positions] or None; "
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


@check("Exercise 3.5 gqa_attention", shown=True,
       why="one entry of an attention layer's output on random weights and inputs")
def check_gqa_attention(fn: Callable[..., tuple]) -> str:
    """``fn(attn, x, cos, sin, attention_mask=None, past_key_value=None) -> (out, (k, v))`` must equal
    ``attn(x, (cos, sin), past_key_value, use_cache=True, attention_mask=attention_mask)`` for MHA, GQA
    and MQA layers, full prefill (the reference's SDPA path), padding and a KV cache (its explicit path)."""
    g = seeded(305)
    base_hint = ("every query head reads the KV head of its group, the scores are scaled as in Exercise 3.2, and a "
                 "query sees the keys up to its own position (RoPE applied to q and k).")
    pad_hint = ("padding enters the scores additively, as section 5's finite negative constant where the mask is 0, "
                "broadcast over heads and queries; with -inf instead, a query that sees only padding gets a row of -inf "
                "and the softmax returns NaN, and another finite constant rounds a large score differently.")
    cache_hint = ("with a cache of p positions, the s new queries come after them: the keys are the p cached ones "
                  "followed by the new ones, and a new query may see every cached key and the new keys up to its own "
                  "position (the causal mask covers the last s key columns, aligned bottom-right).")
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
                norm_q: bool = True, norm_k: bool = True, swap: bool = False) -> Tuple[torch.Tensor, Tuple]:
    """The QK-norm forward with one typical mistake switched in (the defaults are the right answer)."""
    b, s, _ = x.shape
    q = attn.q_proj(x).view(b, s, attn.n_heads, attn.head_dim)
    k = attn.k_proj(x).view(b, s, attn.n_kv_heads, attn.head_dim)
    v = attn.v_proj(x).view(b, s, attn.n_kv_heads, attn.head_dim)
    gq, gk = attn.q_norm.weight, attn.k_norm.weight
    if swap:
        gq, gk = gk, gq
    eps = attn.q_norm.eps

    def normalize(q, k):
        return (_norm_over(q, gq, eps, axis) if norm_q else q), (_norm_over(k, gk, eps, axis) if norm_k else k)

    if where == "before":
        q, k = normalize(q, k)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    if where == "after":
        q, k = normalize(q, k)
    if past is not None:
        k = torch.cat([past[0], k], dim=1)
        v = torch.cat([past[1], v], dim=1)
    t = k.shape[1]
    scores = q.transpose(1, 2) @ _ref_repeat_kv(k, attn.n_rep).transpose(1, 2).transpose(-2, -1)
    scores = scores / math.sqrt(attn.head_dim) + torch.full((s, t), float("-inf")).triu(t - s + 1)
    if mask is not None:
        scores = scores + (1.0 - mask[:, None, None, :]) * -1e9
    out = torch.softmax(scores, dim=-1) @ _ref_repeat_kv(v, attn.n_rep).transpose(1, 2)
    return attn.o_proj(out.transpose(1, 2).reshape(b, s, -1)), (k, v)


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
}


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
                          ("cache of 5 + 3 new tokens", torch.randn(b, 3, 64, generator=g), None, past)]
        for label, x, mask, past in scenarios:
            start = 0 if past is None else past[0].shape[1]
            cos, sin = cos_all[start:start + x.shape[1]], sin_all[start:start + x.shape[1]]
            case = f"head_dim={d}, {label}"
            with torch.no_grad():
                expected, present = ref(x, (cos, sin), past, use_cache=True, attention_mask=mask)
                got = call(layer, x, cos, sin, mask, past, name=name, case=case, hint=crash, check_inputs=True)
            if not (isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(got[1], (tuple, list))
                    and len(got[1]) == 2):
                fail(name, f"expected (output, (k, v)), got {type(got).__name__} (on {case})", "return out, (k, v).")
            out, (k, v) = got
            check_close(out, expected, name=name, case=f"{case}, the output", hint=hint,
                        mistakes=_qk_output_mistakes(ref, x, cos, sin, mask, past, 0))
            check_close(k, present[0], name=name, case=f"{case}, the cached keys",
                        hint="the cache holds the keys exactly as attention uses them.",
                        mistakes=_qk_output_mistakes(ref, x, cos, sin, mask, past, 1))
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


def _bound_mistakes(q: torch.Tensor, k: torch.Tensor) -> Dict[str, float]:
    d = q.shape[0]
    qm, km = q.abs().max().item(), k.abs().max().item()
    return {
        "attention's division of the logits forgotten (one factor of head_dim too many)": qm * km * d,
        "the length of a normalized head vector taken as 1 (it is not: count what the normalization leaves)": qm * km,
        "the length of a normalized head vector taken as 1, and attention's division applied on top": qm * km / math.sqrt(d),
        "the gains left out (they stretch the normalized vectors)": math.sqrt(d),
        "the two gains multiplied coordinate by coordinate (that holds only where q and k meet at the same coordinate; "
        "RoPE rotates each pair, so q's largest coordinate can meet k's largest at another one)":
            math.sqrt(d) * (q * k).abs().max().item(),
        "the lengths of the gain vectors used (a normalized vector can put all its length on one coordinate: what "
        "counts is the largest gain)": q.norm().item() * k.norm().item() / math.sqrt(d),
        "the mean size of the gains used (the largest ones count)":
            math.sqrt(d) * q.abs().mean().item() * k.abs().mean().item(),
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
        got = call(fn, q.clone(), k.clone(), name=name, case=label, check_inputs=True,
                   hint="q_gain and k_gain are 1-D tensors of head_dim values (q_norm.weight and k_norm.weight).")
        got = as_number(got, name, label, integer=False, what="the bound")
        outcomes.append(Outcome(label, got, reference(q, k), _bound_mistakes(q, k)))
    check_numbers(name, outcomes, hint, rel_tol=1e-5)
    values = [o.got for o in outcomes]
    return f"the bound is sqrt(head_dim) times the largest gains; every gain 1 at head_dim 96 gives {values[-1]:.2f}"
