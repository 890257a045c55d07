"""Checks for chapter 03 · Attention and GQA.

Each ``check_*`` runs the learner's function on inputs it makes itself (with its own random
generator, so the notebook's random stream is untouched), compares with PyTorch or
``minimind_ref`` and prints one ``✓`` line, or raises ``AssertionError`` saying what was expected,
what came back and what to try.

    from minimind_ref.checks import ch03
    ch03.check_stable_softmax(stable_softmax)
    ch03.check_scaled_dot_product_attention(scaled_dot_product_attention)
    ch03.check_causal_mask(causal_mask)
    ch03.check_repeat_kv(repeat_kv)
    ch03.check_gqa_attention(gqa_attention)
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..attention import Attention
from ..attention import repeat_kv as _ref_repeat_kv
from ..config import MiniMindConfig
from ..rope import precompute_freqs_cis
from .core import ExerciseError, call, check, check_close, seeded

__all__ = [
    "check_stable_softmax",
    "check_scaled_dot_product_attention",
    "check_causal_mask",
    "check_repeat_kv",
    "check_gqa_attention",
]


def _require_finite(got: torch.Tensor, name: str, what: str, hint: str) -> None:
    if isinstance(got, torch.Tensor) and not bool(torch.isfinite(got).all()):
        bad = int((~torch.isfinite(got)).sum())
        raise ExerciseError(f"[{name}] {what}: {bad} of {got.numel()} values are NaN or inf.\n  hint: {hint}")


# ----------------------------------------------------------------------------- 3.1 softmax
@check("stable_softmax")
def check_stable_softmax(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(x, dim=-1)`` must equal ``torch.softmax(x, dim)``, also for logits in the thousands."""
    name = "stable_softmax"
    g = seeded(301)
    cases = [
        ("random logits, dim=-1", torch.randn(4, 7, generator=g) * 3, -1),
        ("random logits, dim=0", torch.randn(5, 3, generator=g) * 3, 0),
        ("a batch of rows [2, 3, 6]", torch.randn(2, 3, 6, generator=g), -1),
    ]
    for label, x, dim in cases:
        got = call(fn, x.clone(), dim=dim, name=name)
        check_close(got, torch.softmax(x, dim=dim), name=f"{name} ({label})",
                    hint="exp(x - max) / sum(exp(x - max)) along `dim`; keepdim=True keeps the shapes broadcastable.")

    big = torch.tensor([[1000.0, 1001.0, 1002.0], [-1000.0, -1001.0, -1002.0], [88.0, 89.0, 90.0]])
    got = call(fn, big.clone(), dim=-1, name=name)
    _require_finite(got, name, "logits like [1000, 1001, 1002] gave a non-finite result",
                    "exp(1000) overflows float32 (anything above about 88.7 does). Subtract the row maximum "
                    "first: softmax(x) = softmax(x - max(x)), and then the largest exponent is exp(0) = 1.")
    check_close(got, torch.softmax(big, dim=-1), name=f"{name} (large logits)",
                hint="subtract x.max(dim, keepdim=True).values before exp.")

    masked = torch.randn(3, 5, generator=g)
    masked[0, 3:] = float("-inf")
    masked[2, :4] = float("-inf")
    got = call(fn, masked.clone(), dim=-1, name=name)
    check_close(got, torch.softmax(masked, dim=-1), name=f"{name} (rows with -inf, as a mask makes them)",
                hint="-inf entries must get weight exactly 0; the others still sum to 1.")
    return "matches torch.softmax, no overflow at logits of 1000"


# ----------------------------------------------------------------------------- 3.2 SDPA
@check("scaled_dot_product_attention")
def check_scaled_dot_product_attention(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(q, k, v, mask=None)`` must equal ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask)``
    for an additive float mask (0 = visible, -inf = hidden)."""
    name = "scaled_dot_product_attention"
    g = seeded(302)
    causal5 = torch.full((5, 5), float("-inf")).triu(1)
    cases = [
        ("no mask, head_dim 16", (2, 3, 5, 5, 16), None),
        ("no mask, head_dim 64, 4 queries over 9 keys", (1, 2, 4, 9, 64), None),
        ("additive causal mask [5, 5]", (2, 2, 5, 5, 8), causal5),
    ]
    for label, (b, h, s, t, d), mask in cases:
        q = torch.randn(b, h, s, d, generator=g)
        k = torch.randn(b, h, t, d, generator=g)
        v = torch.randn(b, h, t, d, generator=g)
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        args = (q.clone(), k.clone(), v.clone())
        got = call(fn, *args, mask=None if mask is None else mask.clone(), name=name)
        check_close(got, expected, name=f"{name} ({label})",
                    hint="softmax((q @ k.transpose(-2, -1)) / sqrt(d) + mask, dim=-1) @ v with d = q.shape[-1]; "
                         "did you forget the 1/sqrt(d), or take the softmax over the query axis?")
    return "matches torch.nn.functional.scaled_dot_product_attention"


# ----------------------------------------------------------------------------- 3.3 causal mask
def _expected_causal(q_len: int, kv_len: int) -> torch.Tensor:
    return torch.full((q_len, kv_len), float("-inf")).triu(kv_len - q_len + 1)


@check("causal_mask")
def check_causal_mask(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(q_len, kv_len=None)`` -> float32 ``[q_len, kv_len]``: 0 where key ``j`` is visible to
    query ``i`` (``j <= i + kv_len - q_len``), ``-inf`` elsewhere."""
    name = "causal_mask"
    hint = ("query i sits at absolute position i + (kv_len - q_len) (the cached tokens come first); it sees key j "
            "when j <= that position. Without a cache that is j <= i: the diagonal itself is visible. "
            "torch.triu(torch.full(..., float('-inf')), diagonal=...) builds it.")
    for q_len, kv_len in [(1, None), (2, None), (5, None), (3, 7), (1, 9)]:
        got = call(fn, q_len, name=name) if kv_len is None else call(fn, q_len, kv_len, name=name)
        t = q_len if kv_len is None else kv_len
        label = f"q_len={q_len}" + ("" if kv_len is None else f", kv_len={kv_len}")
        expected = _expected_causal(q_len, t)
        check_close(got, expected, name=f"{name} ({label})", hint=hint)
        hidden = torch.isinf(expected)
        if not bool((got[hidden] == float("-inf")).all()):  # check_close gives -inf an infinite tolerance
            raise ExerciseError(
                f"[{name} ({label})] hidden positions must hold -inf (exp(-inf) = 0 exactly), got values like "
                f"{float(got[hidden][got[hidden] != float('-inf')][0]):g}.\n  hint: use float('-inf') for masked entries.")
    return "0 on and below the (bottom-right aligned) diagonal, -inf above"


# ----------------------------------------------------------------------------- 3.4 repeat_kv
@check("repeat_kv")
def check_repeat_kv(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(x, n_rep)``: ``[b, t, n_kv, d] -> [b, t, n_kv * n_rep, d]``, output head ``j`` = KV head ``j // n_rep``."""
    name = "repeat_kv"
    g = seeded(304)
    for b, t, n_kv, d, n_rep in [(2, 5, 2, 4, 4), (1, 3, 4, 8, 2), (2, 3, 2, 6, 1), (1, 4, 1, 4, 8), (1, 2, 3, 2, 3)]:
        x = torch.randn(b, t, n_kv, d, generator=g)
        got = call(fn, x.clone(), n_rep, name=name)
        check_close(got, _ref_repeat_kv(x, n_rep), name=f"{name} (x {tuple(x.shape)}, n_rep={n_rep})",
                    hint="each KV head is repeated n_rep times *in a row*: heads [a, b] with n_rep=2 become "
                         "[a, a, b, b] (like torch.repeat_interleave on dim 2), not [a, b, a, b] (x.repeat). "
                         "Query heads g*n_rep .. g*n_rep + n_rep - 1 share KV head g.")
    return "head j of the output is KV head j // n_rep"


# ----------------------------------------------------------------------------- 3.5 GQA forward
def _small_attention(n_kv_heads: int, seed: int) -> Attention:
    cfg = MiniMindConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=n_kv_heads,
                         num_hidden_layers=1, vocab_size=32, max_position_embeddings=64)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        attn = Attention(cfg)
    return attn.eval()


def _compare_gqa(fn, attn, x, cos, sin, mask, past, label: str, hint: str) -> None:
    name = "gqa_attention"
    with torch.no_grad():
        expected, present = attn(x, (cos, sin), past_key_value=past, use_cache=True, attention_mask=mask)
        got = call(fn, attn, x.clone(), cos, sin, attention_mask=None if mask is None else mask.clone(),
                   past_key_value=past, name=name)
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise ExerciseError(f"[{name}] expected a tuple (output, (k, v)), got {type(got).__name__}.\n"
                            "  hint: return out, (k, v) where k, v are the cache tensors [b, t, n_kv_heads, head_dim].")
    out, kv = got
    _require_finite(out, name, f"{label}: the output", hint)
    check_close(out, expected, name=f"{name} ({label}, output)", hint=hint)
    if not (isinstance(kv, (tuple, list)) and len(kv) == 2):
        raise ExerciseError(f"[{name}] ({label}) the second return value must be the pair (k, v), got {type(kv).__name__}.")
    kv_hint = ("the cache holds keys and values *after* RoPE (keys) and *before* repeat_kv, shaped [b, t, n_kv_heads, "
               "head_dim], with the past entries first (torch.cat on dim 1).")
    check_close(kv[0], present[0], name=f"{name} ({label}, cached k)", hint=kv_hint)
    check_close(kv[1], present[1], name=f"{name} ({label}, cached v)", hint=kv_hint)


@check("gqa_attention")
def check_gqa_attention(fn: Callable[..., tuple]) -> str:
    """``fn(attn, x, cos, sin, attention_mask=None, past_key_value=None) -> (out, (k, v))`` must equal
    ``attn(x, (cos, sin), past_key_value, use_cache=True, attention_mask=attention_mask)`` for MHA, GQA
    and MQA layers, full prefill (the reference's SDPA path), padding and a KV cache (its explicit path)."""
    g = seeded(305)
    base_hint = ("project with attn.q_proj/k_proj/v_proj, view as [b, s, heads, head_dim], apply RoPE "
                 "(apply_rotary_pos_emb), append the cache, repeat_kv, transpose to [b, heads, s, head_dim], "
                 "softmax(q k^T / sqrt(head_dim) + causal + padding) v, merge heads, attn.o_proj.")
    pad_hint = ("padding is additive: scores + (1 - mask[:, None, None, :]) * -1e9. With -inf instead, a query that "
                "sees only padding gets a row of -inf and softmax returns NaN.")
    cache_hint = ("with a cache of length p, the s new queries sit at positions p .. p+s-1: keys = cat(past, new) on "
                  "dim 1, and new query i may see every cached key and new keys 0..i (causal mask over the last s "
                  "key columns only, bottom-right aligned).")
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
