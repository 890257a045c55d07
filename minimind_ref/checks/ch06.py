"""Checks for chapter 06 · KV cache and generation.

Each ``check_*`` runs the learner's function on inputs it makes itself (with its own random
generator, so the notebook's random stream is untouched), compares with ``minimind_ref`` and prints
one ``✓`` line, or raises ``AssertionError`` saying what was expected, what came back and what to try.

    from minimind_ref.checks import ch06
    ch06.check_update_cache(update_cache)                  # Exercise 6.1
    ch06.check_rope_for_new_tokens(rope_for_new_tokens)    # Exercise 6.2
    ch06.check_top_p_filter(top_p_filter)                  # Exercise 6.3
    ch06.check_repetition_penalty(apply_repetition_penalty)  # Exercise 6.4
"""

from __future__ import annotations

from typing import Callable, Tuple

import torch

from ..generation import apply_repetition_penalty as _ref_repetition_penalty
from ..generation import top_p_filter as _ref_top_p_filter
from ..rope import precompute_freqs_cis
from .core import ExerciseError, call, check, check_close, expect_pair, seeded

__all__ = [
    "check_update_cache",
    "check_rope_for_new_tokens",
    "check_top_p_filter",
    "check_repetition_penalty",
]


def _call(fn: Callable, *args, name: str, label: str, hint: str):
    """``call`` plus the case and the hint when the learner's function raises."""
    try:
        return call(fn, *args, name=name)
    except ExerciseError as err:
        if "not implemented yet" in str(err):
            raise
        raise ExerciseError(f"{err} (case: {label})\n  hint: {hint}") from None


# ----------------------------------------------------------------------------- 6.1 cache update
@check("update_cache")
def check_update_cache(fn: Callable[..., Tuple[torch.Tensor, torch.Tensor]]) -> str:
    """``fn(past, k_new, v_new) -> (k, v)``: ``past`` is ``None`` or a ``(k, v)`` pair of
    ``[batch, past_len, n_kv_heads, head_dim]``; the new keys/values go *after* the cached ones on
    the sequence axis (dim 1)."""
    name = "update_cache"
    hint = ("keys and values are [batch, seq, n_kv_heads, head_dim]; the cache grows along the sequence "
            "axis: torch.cat([past_k, k_new], dim=1) (old positions first). With past=None return (k_new, v_new).")
    g = seeded(601)
    # (batch, past_len, new_len, n_kv_heads, head_dim); past_len 0 means past=None
    cases = [(2, 0, 5, 2, 8), (2, 5, 1, 2, 8), (1, 1, 1, 2, 4), (3, 7, 2, 4, 6), (2, 2, 2, 2, 2)]
    for b, past_len, new_len, h, d in cases:
        k_new = torch.randn(b, new_len, h, d, generator=g)
        v_new = torch.randn(b, new_len, h, d, generator=g)
        past = None
        if past_len:
            past = (torch.randn(b, past_len, h, d, generator=g), torch.randn(b, past_len, h, d, generator=g))
        exp_k = k_new if past is None else torch.cat([past[0], k_new], dim=1)
        exp_v = v_new if past is None else torch.cat([past[1], v_new], dim=1)
        arg_past = None if past is None else (past[0].clone(), past[1].clone())
        label = f"past_len={past_len}, new={new_len}, batch={b}, kv_heads={h}"
        got = _call(fn, arg_past, k_new.clone(), v_new.clone(), name=name, label=label, hint=hint)
        got_k, got_v = expect_pair(got, name, "(k, v)")
        check_close(got_k, exp_k, name=f"{name}: keys ({label})", hint=hint, rtol=0, atol=0)
        check_close(got_v, exp_v, name=f"{name}: values ({label})",
                    hint=hint + " Keys and values are separate caches: do not mix them up.", rtol=0, atol=0)
    return "new keys and values appended after the cached ones on dim 1"


# ----------------------------------------------------------------------------- 6.2 RoPE offset
@check("rope_for_new_tokens")
def check_rope_for_new_tokens(fn: Callable[..., Tuple[torch.Tensor, torch.Tensor]]) -> str:
    """``fn(cos, sin, past_len, n_new) -> (cos_new, sin_new)``: the rows of the precomputed tables
    for the absolute positions ``past_len .. past_len + n_new - 1``."""
    name = "rope_for_new_tokens"
    hint = ("the new tokens sit after the cached ones: their positions are past_len, past_len + 1, ..., "
            "past_len + n_new - 1, so take rows cos[past_len : past_len + n_new] (same for sin).")
    cos, sin = precompute_freqs_cis(dim=16, end=64, rope_base=1e6)
    cases = [(0, 6), (6, 1), (7, 1), (17, 3), (40, 1), (63, 1)]
    for past_len, n_new in cases:
        label = f"past_len={past_len}, n_new={n_new}"
        got = _call(fn, cos.clone(), sin.clone(), past_len, n_new, name=name, label=label, hint=hint)
        got_cos, got_sin = expect_pair(got, name, "(cos, sin)")
        extra = ""
        if isinstance(got_cos, torch.Tensor) and got_cos.shape == (n_new, 16) and past_len > 0:
            if torch.equal(got_cos, cos[:n_new]):
                extra = " Your rows are the ones for positions 0.. : every step restarts at position 0."
        check_close(got_cos, cos[past_len:past_len + n_new], name=f"{name}: cos ({label})",
                    hint=hint + extra, rtol=0, atol=0)
        check_close(got_sin, sin[past_len:past_len + n_new], name=f"{name}: sin ({label})",
                    hint=hint + extra, rtol=0, atol=0)
    return "new tokens get the rows of positions past_len .. past_len + n_new - 1"


# ----------------------------------------------------------------------------- 6.3 top-p
@check("top_p_filter")
def check_top_p_filter(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(logits [b, vocab], top_p) -> logits`` with the tokens outside the nucleus set to
    ``-inf``, equal to ``minimind_ref.generation.top_p_filter``."""
    name = "top_p_filter"
    hint = ("sort descending, softmax, cumulative sum. Keep a token if the probability of all *more likely* "
            "tokens is still below top_p (cumsum - p < top_p): the token that crosses the threshold is kept, "
            "and so is the most likely token. Removed tokens get -inf at their original positions.")
    g = seeded(603)
    peaked = torch.tensor([[6.0, 1.0, 0.5, 0.0, -1.0, -2.0]])  # top token alone has ~0.98 of the mass
    cases = [
        ("random [4, 40], top_p=0.9", torch.randn(4, 40, generator=g) * 2, 0.9),
        ("random [4, 40], top_p=0.5", torch.randn(4, 40, generator=g) * 2, 0.5),
        ("random [3, 25], top_p=0.95", torch.randn(3, 25, generator=g), 0.95),
        ("random [2, 30], top_p=0.3", torch.randn(2, 30, generator=g) * 3, 0.3),
        ("peaked row, top_p=0.5 (only the top token is kept)", peaked, 0.5),
        ("random [2, 10], top_p=0.05 (smaller than the top probability)", torch.randn(2, 10, generator=g), 0.05),
        ("random [2, 12], top_p=1.0 (keeps everything)", torch.randn(2, 12, generator=g), 1.0),
    ]
    for label, logits, p in cases:
        expected = _ref_top_p_filter(logits.clone(), p)
        got = _call(fn, logits.clone(), p, name=name, label=label, hint=hint)
        if isinstance(got, torch.Tensor) and got.shape == expected.shape:
            kept_got, kept_exp = int(torch.isfinite(got).sum()), int(torch.isfinite(expected).sum())
            if kept_got != kept_exp:
                extra = ""
                if kept_got == kept_exp - expected.shape[0]:
                    extra = " You keep one token too few per row: the token whose probability crosses top_p belongs to the nucleus."
                elif kept_got == 0 or bool((~torch.isfinite(got)).all(-1).any()):
                    extra = " A row lost every token: the most likely token must always survive."
                raise ExerciseError(f"[{name}] ({label}) expected {kept_exp} tokens kept (finite) over the {expected.shape[0]} rows, "
                                   f"got {kept_got}.{extra}\n  hint: {hint}")
        check_close(got, expected, name=f"{name} ({label})", hint=hint)
    return "the nucleus (threshold-crossing token included) is kept, the rest is -inf"


# ----------------------------------------------------------------------------- 6.4 repetition penalty
@check("repetition_penalty")
def check_repetition_penalty(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(logits [b, vocab], previous_ids [b, t], penalty) -> logits``, equal to
    ``minimind_ref.generation.apply_repetition_penalty`` (without a mask)."""
    name = "repetition_penalty"
    hint = ("for every token id that occurs in previous_ids (once, however often it occurs): a positive logit "
            "is divided by the penalty, a negative one multiplied by it, so both become less likely. Other "
            "tokens are untouched. gather -> torch.where(x > 0, x / penalty, x * penalty) -> scatter.")
    g = seeded(604)
    cases = []
    for b, vocab, t, penalty in [(2, 20, 6, 1.3), (3, 50, 10, 2.0), (1, 12, 8, 1.1), (2, 16, 5, 0.8), (2, 10, 4, 1.0)]:
        logits = torch.randn(b, vocab, generator=g) * 2
        prev = torch.randint(0, vocab, (b, t), generator=g)
        prev[:, -1] = prev[:, 0]  # a repeated id: it must be penalized once, not twice
        cases.append((f"batch {b}, vocab {vocab}, {t} previous ids, penalty {penalty}", logits, prev, penalty))
    for label, logits, prev, penalty in cases:
        expected = _ref_repetition_penalty(logits.clone(), prev.clone(), penalty)
        got = _call(fn, logits.clone(), prev.clone(), penalty, name=name, label=label, hint=hint)
        extra = ""
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and penalty != 1.0:
            seen = torch.zeros_like(logits, dtype=torch.bool).scatter(1, prev, True)
            neg = seen & (logits < 0)
            divided = torch.where(neg, logits / penalty, expected)
            counts = torch.zeros_like(logits).scatter_add(1, prev, torch.ones(prev.shape, dtype=logits.dtype))
            per_occurrence = torch.where(logits > 0, logits / penalty ** counts, logits * penalty ** counts)
            if bool(neg.any()) and torch.allclose(got[neg], divided[neg]):
                extra = (" Negative logits were divided by the penalty, which moves them towards 0 and makes the "
                         "token MORE likely; multiply negative logits instead.")
            elif torch.allclose(got, per_occurrence) and not torch.allclose(got, expected):
                extra = " Some logits were penalized twice: a repeated id must be penalized once."
        check_close(got, expected, name=f"{name} ({label})", hint=hint + extra)
    return "seen tokens: positive logits / penalty, negative logits * penalty, each once"
