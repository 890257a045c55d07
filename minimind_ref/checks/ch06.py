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
from typing import Callable, Dict, Optional, Tuple

import torch

from ..config import MiniMindConfig, minimind2, minimind2_small, preset
from ..params import count_parameters

from ..generation import apply_repetition_penalty as _ref_repetition_penalty
from ..generation import top_p_filter as _ref_top_p_filter
from ..rope import precompute_freqs_cis
from ..cache import GrowingKV, append_kv, preallocate
from .delegation import call_refusing, forbid
from .core import (ExerciseError, Outcome, _matches, as_number, call, check, check_close, check_numbers, expect_pair, fail,
                   seeded, solution)

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


# ----------------------------------------------------------------------------- all cases at once
def _explaining(outcomes) -> Optional[str]:
    """The one mistake whose output equals the learner's on every case (where a mistake does not
    apply to a case, the learner's result must be right there), or None. ``outcomes`` holds
    ``(got, expected, mistakes)`` per case, ``mistakes`` mapping a description to a tensor or a
    zero-argument function (as ``core.check_close`` takes them)."""
    if not outcomes:
        return None
    names = []
    for description in outcomes[0][2]:
        fits = True
        for got, expected, mistakes in outcomes:
            candidate = _resolve(mistakes.get(description), got)
            target = expected if candidate is None else candidate
            if not (isinstance(got, torch.Tensor) and _matches(got, target, 1e-5, 1e-5)):
                fits = False
                break
        if fits:
            names.append(description)
    return names[0] if len(names) == 1 else None


def _resolve(candidate, got):
    """A mistake's output on one case: called when it is a function; when it is a list (the same mistake computed in
    the orders a learner may write it, which round differently at a boundary), the one that equals ``got``, else the
    first."""
    if callable(candidate):
        try:
            candidate = candidate()
        except Exception:  # a mistake that cannot be computed for this input matches nothing
            return None
    if isinstance(candidate, list):
        for option in candidate:
            if isinstance(got, torch.Tensor) and _matches(got, option, 1e-5, 1e-5):
                return option
        return candidate[0] if candidate else None
    return candidate


def _named(seen, mistakes, got):
    """The ``mistakes`` argument of ``check_close`` for the mistake ``seen`` explains (None: none does)."""
    return {seen: _resolve(mistakes[seen], got)} if seen else None


def _first_wrong(outcomes, **tolerance):
    """Index of the first case whose result differs from the reference (None when all agree)."""
    for i, (got, expected, _) in enumerate(outcomes):
        if not (isinstance(got, torch.Tensor) and got.shape == expected.shape and _matches(got, expected, **tolerance)):
            return i
    return None


# ----------------------------------------------------------------------------- 6.1 cache update
def _write_variant(buffers, past_len, new, *, at=None, ret="prefix", dim=1):
    """What a mistaken update leaves in one buffer and returns: ``buffers`` is a copy the variant may write."""
    end = past_len + new.shape[1]
    start = past_len if at is None else at
    index = [slice(None)] * 4
    index[dim] = slice(start, start + new.shape[dim])
    try:
        buffers[tuple(index)] = new
    except RuntimeError:
        return None
    if ret == "prefix":
        return buffers[:, :end]
    if ret == "whole":
        return buffers
    if ret == "new":
        return new
    if ret == "past":
        return buffers[:, :past_len]
    raise ValueError(ret)


def _cache_mistakes(buffer: torch.Tensor, past_len: int, new: torch.Tensor, other_expected: torch.Tensor):
    """Wrong results for one of the two caches (keys or values); ``other_expected`` is the other one."""
    def variant(**kw):
        return lambda: _write_variant(buffer.clone(), past_len, new, **kw)

    past = buffer[:, :past_len]
    mistakes = {
        "keys and values swapped (each buffer must receive its own tensors)": other_expected,
        "the new keys written into the value buffer and the new values into the key buffer":
            torch.cat([past, other_expected[:, past_len:]], dim=1),
        "the newest position left out of what is returned": lambda: variant()()[:, :-1],
        "the new positions written at the start of the buffer, over the cached ones (they go after them)":
            variant(at=0),
        "the new positions written one place too far (position past_len is the first free one)":
            variant(at=past_len + 1),
        "the new positions written one place too early, over the last cached one": variant(at=past_len - 1),
        "the whole buffer returned, unfilled positions included (the attention must see only the filled ones)":
            variant(ret="whole"),
        "only the new positions returned (the attention must see every position so far)": variant(ret="new"),
        "only the cached positions returned (the new ones must be seen too)": variant(ret="past"),
    }
    for dim, what in ((2, "head"), (3, "head_dim")):
        mistakes[f"the new positions written along dim {dim}, the {what} axis, instead of the sequence axis (dim 1)"] = \
            variant(dim=dim)
    return mistakes


solution("6.1", "k_buffer, v_buffer = buffer; end = past_len + k_new.shape[1]; k_buffer[:, past_len:end] = k_new; "
                "v_buffer[:, past_len:end] = v_new; return k_buffer[:, :end], v_buffer[:, :end]")

_CACHE_NAN = ("your result holds NaN: the check fills the free part of each buffer with NaN, so your result includes "
              "positions that hold nothing yet, or the new keys and values did not land where you read them",
              "the first past_len positions of a buffer are the cache; compare where your function writes with where "
              "it reads")


def _shares_memory(view: torch.Tensor, buffer: torch.Tensor) -> bool:
    return view.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()


# the package's own cache buffers answer the exercise
CACHE_ITSELF = [forbid("minimind_ref.cache's GrowingKV", GrowingKV), forbid("minimind_ref.cache.append_kv", append_kv),
                forbid("minimind_ref.cache.preallocate", preallocate)]


@check(CACHE, shown=True, why="the cache entries are random tensors the check made, not shown in the message")
def check_update_cache(fn: Callable[..., Tuple[torch.Tensor, torch.Tensor]]) -> str:
    """``fn(buffer, past_len, k_new, v_new) -> (k, v)``: ``buffer`` is a pair of
    ``[batch, max_len, n_kv_heads, head_dim]`` buffers whose first ``past_len`` positions hold the cache;
    the new positions are written after them, and ``(k, v)`` are views of the filled part."""
    hint = ("the sequence axis of a buffer is dim 1, as in the cache layout of section 4: the first past_len positions "
            "are the cache, the next new_len belong to this step; the attention must get every filled position, read "
            "from the buffer itself")
    g = seeded(601)
    # (batch, past_len, new_len, n_kv_heads, head_dim, max_len): new_len differs from batch and n_kv_heads where it
    # can, so that a wrong axis shows
    cases = [(2, 0, 5, 3, 8, 12), (2, 2, 3, 2, 4, 9), (3, 5, 1, 2, 8, 16), (1, 1, 1, 2, 4, 4), (3, 7, 2, 4, 6, 9),
             (2, 6, 4, 3, 4, 10)]
    results = []
    for b, past_len, new_len, h, d, max_len in cases:
        k_new = torch.randn(b, new_len, h, d, generator=g)
        v_new = torch.randn(b, new_len, h, d, generator=g)
        buffers = []
        for _ in range(2):
            buf = torch.full((b, max_len, h, d), float("nan"))
            buf[:, :past_len] = torch.randn(b, past_len, h, d, generator=g)
            buffers.append(buf)
        before = [buf.clone() for buf in buffers]
        exp_k = torch.cat([before[0][:, :past_len], k_new], dim=1)
        exp_v = torch.cat([before[1][:, :past_len], v_new], dim=1)
        case = f"past_len={past_len}, new_len={new_len}, batch {b}, {h} kv heads, buffers of {max_len} positions"
        got = call_refusing(fn, (buffers[0], buffers[1]), past_len, k_new.clone(), v_new.clone(),
                            forbidden=CACHE_ITSELF, name=CACHE, hint=hint, case=case)
        got_k, got_v = expect_pair(got, CACHE, "k, v")
        results.append((case, buffers, before, past_len, k_new, v_new, exp_k, exp_v, got_k, got_v))
    for which, name, expected_at, got_at, new_at, other in (("keys", f"{CACHE}: keys", 6, 8, 4, 7),
                                                             ("values", f"{CACHE}: values", 7, 9, 5, 6)):
        outcomes = [(r[got_at], r[expected_at],
                     _cache_mistakes(r[2][0 if which == "keys" else 1], r[3], r[new_at], r[other])) for r in results]
        first = _first_wrong(outcomes, rtol=0, atol=0)
        if first is None:
            continue
        seen = _explaining(outcomes)
        got, expected, mistakes = outcomes[first]
        check_close(got, expected, name=name, hint=hint, case=results[first][0], rtol=0, atol=0,
                    mistakes=_named(seen, mistakes, got), nan=None if seen else _CACHE_NAN)
    for case, buffers, before, past_len, k_new, v_new, exp_k, exp_v, got_k, got_v in results:
        end = past_len + k_new.shape[1]
        for (cached, fresh, buffer_name, yours), buf, old, new, view in (
                (("the cached keys", "the new keys", "the key buffer", "your keys"), buffers[0], before[0], k_new, got_k),
                (("the cached values", "the new values", "the value buffer", "your values"), buffers[1], before[1], v_new,
                 got_v)):
            if not torch.equal(buf[:, :past_len], old[:, :past_len]):
                fail(CACHE, f"{cached} in the buffer changed (on {case}); a step must leave the positions it did not "
                     "compute as they are", hint)
            if not torch.equal(buf[:, past_len:end], new):
                fail(CACHE, f"your result is right, but {fresh} were not written into the buffer (on {case}): the next "
                     "step reads the cache from the buffer and would not find them", hint)
            if not bool(torch.isnan(buf[:, end:]).all()):
                fail(CACHE, f"your function wrote into the free part of {buffer_name}, after the new positions "
                     f"(on {case})", hint)
            if not _shares_memory(view, buf):
                fail(CACHE, f"{yours} are a copy, not a view of the buffer (on {case}): copying the cache at every "
                     "step is exactly what the buffer is there to avoid",
                     "return the filled part of the buffer itself; a slice of a tensor shares its memory, while "
                     "concatenating or cloning makes a new tensor")
    return "the new keys and values written after the cached ones, the filled part returned as views of the buffers"


# ----------------------------------------------------------------------------- 6.2 RoPE offset
solution("6.2", "end = past_len + n_new; if end > cos.shape[0]: raise ValueError(...); "
                "return cos[past_len:end], sin[past_len:end]")


def _rope_mistakes(table: torch.Tensor, other: torch.Tensor, past_len: int, n_new: int) -> Dict[str, torch.Tensor]:
    return {
        "positions restarting at 0 at every step (rows 0 .. n_new - 1): the new tokens are not at the start":
            table[:n_new],
        "an off-by-one start (the rows begin one position after the first new token's)":
            table[past_len + 1:past_len + 1 + n_new],
        "an off-by-one start, one row early (the rows begin at the last cached position)":
            table[max(past_len - 1, 0):max(past_len - 1, 0) + n_new],
        "the rows of the cached positions before the new ones (ending at past_len, not starting there)":
            table[max(past_len - n_new, 0):past_len],
        "every row up to the last new position instead of only the new tokens' rows":
            table[:past_len + n_new],
        "cos and sin swapped": other[past_len:past_len + n_new],
        "the last n_new rows of the table instead of the new tokens' rows": table[-n_new:],
    }


@check(ROPE, shown=True, why="one entry of a cos/sin table the exercise hands over itself")
def check_rope_for_new_tokens(fn: Callable[..., Tuple[torch.Tensor, torch.Tensor]]) -> str:
    """``fn(cos, sin, past_len, n_new) -> (cos_new, sin_new)``: the rows of the precomputed tables
    for the absolute positions of the new tokens, and a ``ValueError`` when they do not all fit."""
    hint = ("row r of the tables is the rotation of absolute position r; in a full forward over the whole sequence, "
            "where do this step's tokens sit?")
    end = 64
    cos, sin = precompute_freqs_cis(dim=16, end=end, rope_base=1e6)
    fitting = [(0, 6), (6, 1), (7, 1), (17, 3), (40, 1), (63, 1), (60, 4)]
    outcomes = {"cos": [], "sin": []}
    for past_len, n_new in fitting:
        case = f"past_len={past_len}, n_new={n_new}, tables of {end} positions"
        try:
            fn(cos.clone(), sin.clone(), past_len, n_new)
        except ValueError:
            fail(ROPE, f"your function refused new tokens that fit (on {case}): the tables have rows for positions "
                 f"0 to {end - 1}, and these tokens need none beyond them",
                 "compare the last position the new tokens need with the last position the tables hold: is the "
                 "comparison at the boundary the right one?")
        except (NotImplementedError, ExerciseError):
            raise
        except Exception:  # reported with its case by call() below
            pass
        got = call(fn, cos.clone(), sin.clone(), past_len, n_new, name=ROPE, hint=hint, case=case, check_inputs=True)
        got_cos, got_sin = expect_pair(got, ROPE, "cos_new, sin_new")
        outcomes["cos"].append((got_cos, cos[past_len:past_len + n_new], _rope_mistakes(cos, sin, past_len, n_new)))
        outcomes["sin"].append((got_sin, sin[past_len:past_len + n_new], _rope_mistakes(sin, cos, past_len, n_new)))
    for which, results in outcomes.items():
        first = _first_wrong(results, rtol=0, atol=0)
        if first is not None:
            seen = _explaining(results)
            got, expected, mistakes = results[first]
            past_len, n_new = fitting[first]
            check_close(got, expected, name=f"{ROPE}: {which}", hint=hint, rtol=0, atol=0,
                        case=f"past_len={past_len}, n_new={n_new}, tables of {end} positions",
                        mistakes=_named(seen, mistakes, got))
    too_far = [(64, 1), (63, 2), (62, 3), (70, 1)]
    for past_len, n_new in too_far:
        case = f"past_len={past_len}, n_new={n_new}, tables of {end} positions"
        try:
            got = fn(cos.clone(), sin.clone(), past_len, n_new)
        except ValueError:
            continue
        except (NotImplementedError, ExerciseError):
            raise
        except Exception as err:  # the learner's code raised something else
            fail(ROPE, f"your function raised {type(err).__name__}: {err} (on {case}); new tokens that do not fit in "
                 "the tables should raise a ValueError that says so",
                 "check the fit yourself before you slice, and raise ValueError with a message a caller can act on")
        rows = got[0].shape[0] if isinstance(got, (tuple, list)) and got and isinstance(got[0], torch.Tensor) else None
        what = f"a result with {rows} rows for n_new={n_new}" if rows is not None else "a result"
        fail(ROPE, f"the new tokens do not all fit in the tables (on {case}), but your function returned {what} instead "
             "of raising: a slice past the end of a tensor is silently cut short",
             "compare the last position the new tokens need with the last position the tables hold, and raise a "
             "ValueError when it is past it")
    return "new tokens get the rows of their own positions; past the end of the tables, a ValueError"


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

    def ascending():
        up_logits, up_idx = torch.sort(logits, descending=False, dim=-1)
        p = up_logits.softmax(-1)
        remove_up = p.cumsum(-1) - p >= top_p
        return logits.masked_fill(remove_up.scatter(-1, up_idx, remove_up), inf)

    def ref():
        return _ref_top_p_filter(logits, top_p)

    def crossing_dropped():  # sorted then softmax, or softmax then sorted: they round differently at top_p = 1
        other = logits.softmax(-1).sort(dim=-1, descending=True).values
        return [back(probs.cumsum(-1) > top_p), back(other.cumsum(-1) > top_p)]

    def batch_axis():
        p, i = logits.softmax(0).sort(dim=-1, descending=True)
        remove = (p.cumsum(-1) - p) >= top_p
        return logits.masked_fill(remove.scatter(-1, i, remove), inf)

    def gathered_back():
        remove = before >= top_p
        return logits.masked_fill(remove.gather(-1, idx), inf)

    return {
        "the token whose probability crosses top_p is dropped (it belongs to the nucleus: without it the kept "
        "mass is still below top_p)": crossing_dropped,
        "the crossing token is dropped whenever more than one token is kept": lambda: back(
            (probs.cumsum(-1) > top_p) & (torch.arange(probs.shape[-1]) > 0)),
        "a token is kept although the more likely tokens before it already sum to exactly top_p (at that point "
        "the nucleus is complete)": lambda: back(before > top_p),
        "the mask was computed in sorted order but applied in vocabulary order (it must be scattered back to the "
        "positions the sort came from)": lambda: logits.masked_fill(before >= top_p, inf),
        "the cumulative sum was taken in vocabulary order instead of from the most likely token down": unsorted,
        "the tokens sorted from the least likely up (the nucleus is built from the most likely token down)": ascending,
        "removed tokens set to 0 instead of -inf (a logit of 0 still gets probability after the softmax)":
            lambda: torch.nan_to_num(ref(), neginf=0.0),
        "probabilities returned instead of logits (the filter maps logits to logits)":
            lambda: ref().softmax(-1),
        "nothing removed (the logits came back unchanged)": logits,
        "the cumulative sum taken over the logits instead of the probabilities":
            lambda: back(sorted_logits.cumsum(-1) - sorted_logits >= top_p),
        "the softmax taken over the batch axis instead of over each row's vocabulary": batch_axis,
        "the mask carried back to vocabulary order with a gather by the sort's indices": gathered_back,
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
    if fn is _ref_top_p_filter:
        fail(TOP_P, "this is minimind_ref's own top_p_filter, not yours",
             "write the filter yourself from the definition of the nucleus")
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
    outcomes = []
    for case, logits, p in cases:
        expected = _ref_top_p_filter(logits.clone(), p)
        got = call_refusing(fn, logits.clone(), p, forbidden=[_ref_top_p_filter], name=TOP_P, hint=hint, case=case,
                             check_inputs=True)
        outcomes.append((got, expected, _top_p_mistakes(logits, p)))
    first = _first_wrong(outcomes, rtol=1e-5, atol=1e-5)
    if first is not None:
        seen = _explaining(outcomes)
        got, expected, mistakes = outcomes[first]
        check_close(got, expected, name=TOP_P, hint=hint, case=cases[first][0],
                    mistakes=_named(seen, mistakes, got))
    return "the nucleus (threshold-crossing token included, boundary exact) is kept, the rest is -inf"


# ----------------------------------------------------------------------------- 6.4 repetition penalty
def _penalty_mistakes(logits: torch.Tensor, prev: torch.Tensor, penalty: float) -> Dict[str, Callable[[], torch.Tensor]]:
    counts = torch.zeros_like(logits).scatter_add(1, prev, torch.ones(prev.shape, dtype=logits.dtype))

    def per_occurrence():
        return torch.where(logits > 0, logits / penalty ** counts, logits * penalty ** counts)

    def on_seen(values):
        return logits.scatter(1, prev, values(logits.gather(1, prev)))

    def all_rows_ids():
        ids = prev.reshape(1, -1).expand(logits.shape[0], -1)
        seen = logits.gather(1, ids)
        return logits.scatter(1, ids, torch.where(seen > 0, seen / penalty, seen * penalty))

    return {
        "CTRL's rule as the draft applies it: every seen logit divided by the penalty (a negative one then moves "
        "towards 0, which makes its token MORE likely), and a repeated id divided once per occurrence":
            lambda: logits / penalty ** counts,
        "negative logits divided by the penalty, which moves them towards 0 and makes those tokens MORE likely":
            lambda: on_seen(lambda s: s / penalty),
        "a repeated id penalized once per occurrence (a token that was seen is penalized once)": per_occurrence,
        "the two cases reversed (positive logits multiplied, negative ones divided)":
            lambda: on_seen(lambda s: torch.where(s > 0, s * penalty, s / penalty)),
        "the penalty subtracted instead of dividing or multiplying": lambda: on_seen(lambda s: s - penalty),
        "each seen logit lowered by (penalty - 1) times its size":
            lambda: on_seen(lambda s: s - s.abs() * (penalty - 1)),
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
    if fn is _ref_repetition_penalty:
        fail(PENALTY, "this is minimind_ref's own apply_repetition_penalty, not yours",
             "write the penalty yourself from the properties the exercise lists")
    g = seeded(604)
    cases = []
    for b, vocab, t, penalty in [(2, 20, 6, 1.3), (3, 50, 10, 2.0), (1, 12, 8, 1.1), (2, 16, 5, 0.8), (2, 10, 4, 1.0)]:
        logits = torch.randn(b, vocab, generator=g) * 2
        prev = torch.randint(0, vocab, (b, t), generator=g)
        prev[:, -1] = prev[:, 0]  # a repeated id: it must be penalized once, not twice
        cases.append((f"batch {b}, vocab {vocab}, {t} previous ids with a repeat, penalty {penalty}", logits, prev, penalty))
    outcomes = []
    for case, logits, prev, penalty in cases:
        expected = _ref_repetition_penalty(logits.clone(), prev.clone(), penalty)
        got = call_refusing(fn, logits.clone(), prev.clone(), penalty, forbidden=[_ref_repetition_penalty],
                             name=PENALTY, hint=hint, case=case, check_inputs=True)
        outcomes.append((got, expected, _penalty_mistakes(logits, prev, penalty)))
    first = _first_wrong(outcomes, rtol=1e-5, atol=1e-5)
    if first is not None:
        seen = _explaining(outcomes)
        got, expected, mistakes = outcomes[first]
        check_close(got, expected, name=PENALTY, hint=hint, case=cases[first][0],
                    mistakes=_named(seen, mistakes, got))
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
