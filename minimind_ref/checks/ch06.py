"""Checks for chapter 06 · KV cache and generation.

Each check compares the learner's function with ``minimind_ref`` (``count_parameters``,
``generation.top_p_filter``, ``generation.apply_repetition_penalty``, ``rope``) on inputs it makes
itself, and reports as ``minimind_ref.checks`` describes.

    from minimind_ref.checks import ch06
    ch06.check_update_cache(update_cache)                    # Exercise 6.1
    ch06.check_rope_for_new_tokens(rope_for_new_tokens)      # Exercise 6.2
    ch06.check_top_p_filter(top_p_filter)                    # Exercise 6.3
    ch06.check_repetition_penalty(apply_repetition_penalty)  # Exercise 6.4
    ch06.check_longest_context(longest_context)              # Exercise 6.5
"""

from __future__ import annotations

import math
import operator
from typing import Callable, Dict, Tuple

import torch

from ..config import MiniMindConfig, minimind2, minimind2_small, preset
from ..params import count_parameters

from ..generation import apply_repetition_penalty as _ref_repetition_penalty
from ..generation import top_p_filter as _ref_top_p_filter
from ..rope import precompute_freqs_cis
from .core import Outcome, as_number, call, check, check_close, check_numbers, expect_pair, fail, seeded, solution

__all__ = [
    "check_update_cache",
    "check_rope_for_new_tokens",
    "check_top_p_filter",
    "check_repetition_penalty",
    "check_longest_context",
]

CACHE = "Exercise 6.1 update_cache"
ROPE = "Exercise 6.2 rope_for_new_tokens"
TOP_P = "Exercise 6.3 top_p_filter"
PENALTY = "Exercise 6.4 apply_repetition_penalty"
CONTEXT = "Exercise 6.5 longest_context"


# ----------------------------------------------------------------------------- 6.1 cache update
def _cache_mistakes(past, new: torch.Tensor, other_expected: torch.Tensor) -> Dict[str, object]:
    """Wrong versions of one of the two caches (keys or values); ``other_expected`` is the other one."""
    mistakes: Dict[str, object] = {"keys and values swapped (each cache must grow with its own tensors)": other_expected}
    if past is None:
        return mistakes
    old = past
    for dim, what in ((0, "batch"), (2, "head"), (3, "head_dim")):
        if old.shape[:dim] + old.shape[dim + 1:] == new.shape[:dim] + new.shape[dim + 1:]:
            mistakes[f"concatenated on dim {dim}, the {what} axis, instead of the sequence axis (dim 1)"] = \
                (lambda d=dim: torch.cat([old, new], dim=d))
    mistakes["the new positions put before the cached ones (the oldest position comes first)"] = lambda: torch.cat([new, old], dim=1)
    mistakes["the cached positions dropped (only the new keys/values returned)"] = new
    mistakes["the new positions never added (the cache returned unchanged)"] = old
    return mistakes


solution("6.1", "past is None: return (k_new, v_new); otherwise return (torch.cat([past_k, k_new], dim=1), "
                "torch.cat([past_v, v_new], dim=1))")


@check(CACHE, shown=True, why="the cache entries are random tensors the check made, not shown in the message")
def check_update_cache(fn: Callable[..., Tuple[torch.Tensor, torch.Tensor]]) -> str:
    """``fn(past, k_new, v_new) -> (k, v)``: ``past`` is ``None`` or a ``(k, v)`` pair of
    ``[batch, past_len, n_kv_heads, head_dim]``; the new keys/values go *after* the cached ones on
    the sequence axis (dim 1)."""
    hint = ("the cache holds every position so far, oldest first, in the layout [batch, seq, n_kv_heads, head_dim]; "
            "a step adds new positions along the sequence axis and leaves the other axes alone. On the first call "
            "there is nothing cached (past is None)")
    g = seeded(601)
    # (batch, past_len, new_len, n_kv_heads, head_dim); past_len 0 means past=None
    cases = [(2, 0, 5, 2, 8), (2, 2, 2, 2, 2), (2, 5, 1, 2, 8), (1, 1, 1, 2, 4), (3, 7, 2, 4, 6)]
    for b, past_len, new_len, h, d in cases:
        k_new = torch.randn(b, new_len, h, d, generator=g)
        v_new = torch.randn(b, new_len, h, d, generator=g)
        past = None
        if past_len:
            past = (torch.randn(b, past_len, h, d, generator=g), torch.randn(b, past_len, h, d, generator=g))
        exp_k = k_new if past is None else torch.cat([past[0], k_new], dim=1)
        exp_v = v_new if past is None else torch.cat([past[1], v_new], dim=1)
        arg_past = None if past is None else (past[0].clone(), past[1].clone())
        case = (f"past=None, {new_len} new positions" if past is None else
                f"past_len={past_len}, new={new_len}, batch={b}, kv_heads={h}")
        got = call(fn, arg_past, k_new.clone(), v_new.clone(), name=CACHE, hint=hint, case=case, check_inputs=True)
        got_k, got_v = expect_pair(got, CACHE, "k, v")
        check_close(got_k, exp_k, name=f"{CACHE}: keys", hint=hint, case=case, rtol=0, atol=0,
                    mistakes=_cache_mistakes(None if past is None else past[0], k_new, exp_v))
        check_close(got_v, exp_v, name=f"{CACHE}: values", hint=hint, case=case, rtol=0, atol=0,
                    mistakes=_cache_mistakes(None if past is None else past[1], v_new, exp_k))
    return "new keys and values appended after the cached ones on dim 1"


# ----------------------------------------------------------------------------- 6.2 RoPE offset
solution("6.2", "return cos[past_len : past_len + n_new], sin[past_len : past_len + n_new]")


@check(ROPE, shown=True, why="one entry of a cos/sin table the exercise hands over itself")
def check_rope_for_new_tokens(fn: Callable[..., Tuple[torch.Tensor, torch.Tensor]]) -> str:
    """``fn(cos, sin, past_len, n_new) -> (cos_new, sin_new)``: the rows of the precomputed tables
    for the absolute positions ``past_len .. past_len + n_new - 1``."""
    hint = ("row r of the tables is the rotation of absolute position r, and the new tokens come right after the "
            "past_len cached ones")
    cos, sin = precompute_freqs_cis(dim=16, end=64, rope_base=1e6)
    cases = [(0, 6), (6, 1), (7, 1), (17, 3), (40, 1), (63, 1)]
    for past_len, n_new in cases:
        case = f"past_len={past_len}, n_new={n_new}"
        got = call(fn, cos.clone(), sin.clone(), past_len, n_new, name=ROPE, hint=hint, case=case, check_inputs=True)
        got_cos, got_sin = expect_pair(got, ROPE, "cos_new, sin_new")
        for which, got_t, table, other in (("cos", got_cos, cos, sin), ("sin", got_sin, sin, cos)):
            mistakes = {
                "positions restarting at 0 at every step (rows 0 .. n_new - 1): the new tokens are not at the start":
                    table[:n_new],
                "an off-by-one start (rows from past_len + 1): the first new token is at position past_len itself":
                    table[past_len + 1:past_len + 1 + n_new],
                "the rows of the cached positions before the new ones (ending at past_len, not starting there)":
                    table[max(past_len - n_new, 0):past_len],
                "every row up to the last new position instead of only the new tokens' rows":
                    table[:past_len + n_new],
                "cos and sin swapped": other[past_len:past_len + n_new],
                "the last n_new rows of the table instead of the new tokens' rows": table[-n_new:],
            }
            check_close(got_t, table[past_len:past_len + n_new], name=f"{ROPE}: {which}", hint=hint,
                        case=case, rtol=0, atol=0, mistakes=mistakes)
    return "new tokens get the rows of positions past_len .. past_len + n_new - 1"


# ----------------------------------------------------------------------------- 6.3 top-p
def _top_p_mistakes(logits: torch.Tensor, top_p: float) -> Dict[str, Callable[[], torch.Tensor]]:
    """The usual wrong nucleus filters, on the same input."""
    sorted_logits, idx = torch.sort(logits, descending=True, dim=-1)
    probs = sorted_logits.softmax(-1)
    before = probs.cumsum(-1) - probs
    inf = float("-inf")

    def back(remove_sorted):  # a mask in sorted order -> vocabulary order
        return logits.masked_fill(remove_sorted.scatter(-1, idx, remove_sorted), inf)

    def unsorted():
        p = logits.softmax(-1)
        return logits.masked_fill(p.cumsum(-1) - p >= top_p, inf)

    def ref():
        return _ref_top_p_filter(logits, top_p)

    return {
        "the token whose probability crosses top_p is dropped (it belongs to the nucleus: without it the kept "
        "mass is still below top_p)": lambda: back(probs.cumsum(-1) > top_p),
        "the crossing token is dropped whenever more than one token is kept": lambda: back(
            (probs.cumsum(-1) > top_p) & (torch.arange(probs.shape[-1]) > 0)),
        "a token is kept although the more likely tokens before it already sum to exactly top_p (at that point "
        "the nucleus is complete)": lambda: back(before > top_p),
        "the mask was computed in sorted order but applied in vocabulary order (it must be scattered back to the "
        "positions the sort came from)": lambda: logits.masked_fill(before >= top_p, inf),
        "the cumulative sum was taken in vocabulary order instead of from the most likely token down": unsorted,
        "removed tokens set to 0 instead of -inf (a logit of 0 still gets probability after the softmax)":
            lambda: torch.nan_to_num(ref(), neginf=0.0),
        "probabilities returned instead of logits (the filter maps logits to logits)":
            lambda: ref().softmax(-1),
        "nothing removed (the logits came back unchanged)": logits,
    }


solution("6.3", "sorted_logits, sorted_idx = torch.sort(logits, descending=True, dim=-1); probs = sorted_logits.softmax(-1); "
                "remove = (probs.cumsum(-1) - probs) >= top_p; return logits.masked_fill(remove.scatter(-1, sorted_idx, "
                "remove), float('-inf'))")


@check(TOP_P, shown=True, why="one filtered logit of random logits; -inf or the logit itself, the rule is not in it")
def check_top_p_filter(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(logits [b, vocab], top_p) -> logits`` with the tokens outside the nucleus set to
    ``-inf``, equal to ``minimind_ref.generation.top_p_filter``; ``logits`` is left unchanged."""
    hint = ("compare with this chapter's nucleus: in which order the tokens are counted, which token completes the "
            "nucleus, what happens when the mass reaches top_p exactly, and where in the vocabulary each removed "
            "token's -inf goes")
    g = seeded(603)
    peaked = torch.tensor([[6.0, 1.0, 0.5, 0.0, -1.0, -2.0]])  # top token alone has ~0.98 of the mass
    # exact binary fractions, shuffled: the mass before a token hits top_p exactly (the boundary)
    boundary = torch.tensor([[0.125, 0.5, 0.125, 0.25], [0.0625, 0.25, 0.5, 0.1875]]).log()
    cases = [
        ("probabilities [.125, .5, .125, .25] and [.0625, .25, .5, .1875], top_p=0.75: in both rows the mass before "
         "the 3rd most likely token is exactly 0.75, so 2 tokens are kept in each row", boundary, 0.75),
        ("random [4, 40], top_p=0.9", torch.randn(4, 40, generator=g) * 2, 0.9),
        ("random [4, 40], top_p=0.5", torch.randn(4, 40, generator=g) * 2, 0.5),
        ("random [3, 25], top_p=0.95", torch.randn(3, 25, generator=g), 0.95),
        ("random [2, 30], top_p=0.3", torch.randn(2, 30, generator=g) * 3, 0.3),
        ("peaked row, top_p=0.5 (only the top token is kept)", peaked, 0.5),
        ("random [2, 10], top_p=0.05 (smaller than the top probability)", torch.randn(2, 10, generator=g), 0.05),
        ("random [2, 12], top_p=1.0 (keeps everything)", torch.randn(2, 12, generator=g), 1.0),
    ]
    for case, logits, p in cases:
        expected = _ref_top_p_filter(logits.clone(), p)
        got = call(fn, logits.clone(), p, name=TOP_P, hint=hint, case=case, check_inputs=True)
        check_close(got, expected, name=TOP_P, hint=hint, case=case, mistakes=_top_p_mistakes(logits, p))
    return "the nucleus (threshold-crossing token included, boundary exact) is kept, the rest is -inf"


# ----------------------------------------------------------------------------- 6.4 repetition penalty
def _penalty_mistakes(logits: torch.Tensor, prev: torch.Tensor, penalty: float) -> Dict[str, Callable[[], torch.Tensor]]:
    def per_occurrence():
        counts = torch.zeros_like(logits).scatter_add(1, prev, torch.ones(prev.shape, dtype=logits.dtype))
        return torch.where(logits > 0, logits / penalty ** counts, logits * penalty ** counts)

    def on_seen(values):
        return logits.scatter(1, prev, values(logits.gather(1, prev)))

    def all_rows_ids():
        ids = prev.reshape(1, -1).expand(logits.shape[0], -1)
        seen = logits.gather(1, ids)
        return logits.scatter(1, ids, torch.where(seen > 0, seen / penalty, seen * penalty))

    return {
        "negative logits divided by the penalty, which moves them towards 0 and makes those tokens MORE likely":
            lambda: on_seen(lambda s: s / penalty),
        "a repeated id penalized once per occurrence (a token that was seen is penalized once)": per_occurrence,
        "the two cases reversed (positive logits multiplied, negative ones divided)":
            lambda: on_seen(lambda s: torch.where(s > 0, s * penalty, s / penalty)),
        "the penalty subtracted instead of dividing or multiplying": lambda: on_seen(lambda s: s - penalty),
        "every token penalized, not only the ones that occur in previous_ids":
            lambda: torch.where(logits > 0, logits / penalty, logits * penalty),
        "the ids of every row penalized in every row (each row has its own previous_ids)": all_rows_ids,
        "only the last previous token penalized": lambda: _ref_repetition_penalty(logits, prev[:, -1:], penalty),
        "nothing changed (the logits came back unchanged)": logits,
    }


solution("6.4", "seen = logits.gather(1, previous_ids); seen = torch.where(seen > 0, seen / penalty, seen * penalty); "
                "return logits.scatter(1, previous_ids, seen)")


@check(PENALTY, shown=True, why="one penalized logit of random logits, whose entries the message does not show")
def check_repetition_penalty(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(logits [b, vocab], previous_ids [b, t], penalty) -> logits``, equal to
    ``minimind_ref.generation.apply_repetition_penalty`` (without a mask); ``logits`` is left unchanged."""
    hint = ("only the tokens that occur in the row's own previous_ids change, each once however often it occurred, "
            "and the change must make each of them less likely whatever the sign of its logit")
    g = seeded(604)
    cases = []
    for b, vocab, t, penalty in [(2, 20, 6, 1.3), (3, 50, 10, 2.0), (1, 12, 8, 1.1), (2, 16, 5, 0.8), (2, 10, 4, 1.0)]:
        logits = torch.randn(b, vocab, generator=g) * 2
        prev = torch.randint(0, vocab, (b, t), generator=g)
        prev[:, -1] = prev[:, 0]  # a repeated id: it must be penalized once, not twice
        cases.append((f"batch {b}, vocab {vocab}, {t} previous ids with a repeat, penalty {penalty}", logits, prev, penalty))
    for case, logits, prev, penalty in cases:
        expected = _ref_repetition_penalty(logits.clone(), prev.clone(), penalty)
        got = call(fn, logits.clone(), prev.clone(), penalty, name=PENALTY, hint=hint, case=case, check_inputs=True)
        mistakes = _penalty_mistakes(logits, prev, penalty) if not math.isclose(penalty, 1.0) else None
        check_close(got, expected, name=PENALTY, hint=hint, case=case, mistakes=mistakes)
    return "seen tokens: positive logits / penalty, negative logits * penalty, each once"


# ----------------------------------------------------------------------------- 6.5 longest context
GiB, MiB = 2 ** 30, 2 ** 20


def _context(cfg: MiniMindConfig, memory: int, b: int, batch: int, n_kv: int = None, head_dim: int = None,
             factor: int = 2, layers: int = None, weights: int = None, rounding=operator.floordiv) -> int:
    """The answer, with any of its ingredients replaced (the mistakes below are built from it)."""
    n_kv = cfg.num_key_value_heads if n_kv is None else n_kv
    head_dim = cfg.head_dim if head_dim is None else head_dim
    layers = cfg.num_hidden_layers if layers is None else layers
    weights = count_parameters(cfg) * b if weights is None else weights
    per_token = factor * layers * n_kv * head_dim * b * batch
    return max(0, rounding(memory - weights, per_token))


def _context_mistakes(cfg: MiniMindConfig, memory: int, b: int, batch: int) -> Dict[str, int]:
    weights = count_parameters(cfg) * b
    ceil = lambda a, d: -(-a // d)  # noqa: E731
    mistakes = {
        "keys only (the cache stores a key AND a value per position, KV head and layer)":
            _context(cfg, memory, b, batch, factor=1),
        "num_attention_heads used for the cache (the cache holds the KV heads only; that is MHA's cache)":
            _context(cfg, memory, b, batch, n_kv=cfg.num_attention_heads),
        "MiniMind2's 2 KV heads assumed (read num_key_value_heads from the config: minimind-3 has 4)":
            _context(cfg, memory, b, batch, n_kv=2),
        "hidden_size // num_attention_heads used as head_dim (use config.head_dim: minimind-3 may set it apart)":
            _context(cfg, memory, b, batch, head_dim=cfg.hidden_size // cfg.num_attention_heads),
        "one layer's cache (every layer keeps its own keys and values)": _context(cfg, memory, b, batch, layers=1),
        "the weights left out of the budget (they sit in the same memory)": _context(cfg, memory, b, batch, weights=0),
        "the batch left out (each sequence of the batch has its own cache)": _context(cfg, memory, b, 1),
        "rounded up (the last, partial token does not fit; round down)":
            _context(cfg, memory, b, batch, rounding=ceil),
        "the weights counted at 4 bytes whatever bytes_per_value says":
            _context(cfg, memory, b, batch, weights=count_parameters(cfg) * 4),
        "the tied embedding/head matrix counted twice in the weights":
            _context(cfg, memory, b, batch, weights=weights + cfg.vocab_size * cfg.hidden_size * b),
        "a negative length when even the weights do not fit (the answer is then 0)":
            (memory - weights) // (2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * b * batch),
    }
    return mistakes


solution("6.5", "weights = count_parameters(config) * bytes_per_value; per_token = 2 * config.num_hidden_layers * "
                "config.num_key_value_heads * config.head_dim * bytes_per_value * batch; "
                "return max(0, (memory_bytes - weights) // per_token)")


@check(CONTEXT, shown=False, why="the length is a closed form of the config and the budget, which the case names")
def check_longest_context(fn: Callable[..., int]) -> str:
    """``fn(config, memory_bytes, bytes_per_value=2, batch=1) -> int``: the longest context (tokens per sequence)
    whose weights plus the KV cache of ``batch`` sequences fit in ``memory_bytes``, every value stored with
    ``bytes_per_value`` bytes; 0 when the weights alone do not fit."""
    hint = ("the memory holds the weights once and, for every sequence of the batch and every position, what each "
            "layer's attention keeps for later steps; count that per token from the config, then see how many "
            "whole tokens fit in what the weights leave")
    cases = [
        ("MiniMind2, fp16, 1 GiB", minimind2(), GiB, 2, 1),
        ("minimind-3, fp16, 1 GiB", preset("minimind-3"), GiB, 2, 1),
        ("minimind-3, fp32, 4 GiB, batch 8", preset("minimind-3"), 4 * GiB, 4, 8),
        ("MiniMind2-Small, fp16, 256 MiB, batch 4", minimind2_small(), 256 * MiB, 2, 4),
        ("minimind-3-moe, fp16, 512 MiB", preset("minimind-3-moe"), 512 * MiB, 2, 1),
        ("minimind-3 with head_dim 96 at hidden 256, fp16, 100 MiB, batch 3",
         MiniMindConfig(generation="minimind-3", hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=96), 100 * MiB, 2, 3),
        ("minimind-3, fp16, 100 MB (less than its weights)", preset("minimind-3"), 100_000_000, 2, 1),
    ]
    outcomes = []
    for case, cfg, memory, b, batch in cases:
        got = call(fn, cfg, memory, bytes_per_value=b, batch=batch, name=CONTEXT, hint=hint, case=case)
        got = as_number(got, CONTEXT, case, integer=True, what="a number of tokens")
        outcomes.append(Outcome(case, got, _context(cfg, memory, b, batch), _context_mistakes(cfg, memory, b, batch)))
    check_numbers(CONTEXT, outcomes, hint, unit=" tokens")
    m3, m2 = _context(preset("minimind-3"), GiB, 2, 1), _context(minimind2(), GiB, 2, 1)
    return f"7 budgets; in 1 GiB at fp16, minimind-3 holds {m3:,} tokens of context, MiniMind2 {m2:,}"
