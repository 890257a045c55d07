"""Chapter 06 checks: each accepts correct answers, rejects the stub, and names every planted mistake
(in-place edits and the boundary cases included), with the hint before the line that says how to ask
for a solution."""

from __future__ import annotations

import math

import pytest
import torch

from minimind_ref import count_parameters
from minimind_ref.checks import ch06
from minimind_ref.generation import apply_repetition_penalty as ref_repetition_penalty
from minimind_ref.generation import top_p_filter as ref_top_p_filter


# ------------------------------------------------------------------ reference answers
def update_cache_ref(buffer, past_len, k_new, v_new):
    k_buffer, v_buffer = buffer
    end = past_len + k_new.shape[1]
    k_buffer[:, past_len:end] = k_new
    v_buffer[:, past_len:end] = v_new
    return k_buffer[:, :end], v_buffer[:, :end]


def update_cache_copy_(buffer, past_len, k_new, v_new):
    """Another way: copy_ into the free slots, then narrow (a view too)."""
    out = []
    for buf, new in zip(buffer, (k_new, v_new)):
        buf.narrow(1, past_len, new.shape[1]).copy_(new)
        out.append(buf.narrow(1, 0, past_len + new.shape[1]))
    return tuple(out)


def rope_ref(cos, sin, past_len, n_new):
    if past_len + n_new > cos.shape[0]:
        raise ValueError(f"positions up to {past_len + n_new - 1} do not fit in {cos.shape[0]} rows")
    return cos[past_len:past_len + n_new], sin[past_len:past_len + n_new]


def top_p_ref(logits, top_p):
    """A from-scratch nucleus filter (not the package's code): sort, cumsum, shift by one."""
    sorted_logits, idx = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    remove_sorted = probs.cumsum(-1) - probs >= top_p
    remove = torch.zeros_like(remove_sorted).scatter(-1, idx, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def top_p_hf_style(logits, top_p):
    """Hugging Face's formulation: sort ascending, drop the tail whose mass is <= 1 - top_p."""
    sorted_logits, idx = logits.sort(dim=-1, descending=False)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    remove_sorted = cum <= (1 - top_p)
    remove_sorted[..., -1:] = False
    remove = remove_sorted.scatter(-1, idx, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def repetition_ref(logits, previous_ids, penalty):
    seen = logits.gather(1, previous_ids)
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.scatter(1, previous_ids, seen)


def repetition_loop(logits, previous_ids, penalty):
    """A per-row loop over the *set* of seen ids: correct too."""
    out = logits.clone()
    for row in range(logits.shape[0]):
        for tok in set(previous_ids[row].tolist()):
            x = out[row, tok]
            out[row, tok] = x / penalty if x > 0 else x * penalty
    return out


def longest_context_ref(config, memory_bytes, bytes_per_value=2, batch=1):
    weights = count_parameters(config) * bytes_per_value
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * bytes_per_value * batch
    return max(0, (memory_bytes - weights) // per_token)


def longest_context_loop(config, memory_bytes, bytes_per_value=2, batch=1):
    """Count tokens up from 0 in big strides, then small ones: the same number another way."""
    free = memory_bytes - count_parameters(config) * bytes_per_value
    per_layer_token = 2 * config.num_key_value_heads * config.head_dim * bytes_per_value
    per_token = per_layer_token * config.num_hidden_layers * batch
    n = 0
    for stride in (10 ** 6, 10 ** 4, 10 ** 2, 1):
        while (n + stride) * per_token <= free:
            n += stride
    return n


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise 6.x: implement me")


@pytest.mark.parametrize(
    "check, answer",
    [
        (ch06.check_update_cache, update_cache_ref),
        (ch06.check_update_cache, update_cache_copy_),
        (ch06.check_rope_for_new_tokens, rope_ref),
        (ch06.check_top_p_filter, top_p_ref),
        (ch06.check_top_p_filter, top_p_hf_style),
        (ch06.check_repetition_penalty, repetition_ref),
        (ch06.check_repetition_penalty, repetition_loop),
        (ch06.check_longest_context, longest_context_ref),
        (ch06.check_longest_context, longest_context_loop),
    ],
)
def test_reference_passes(check, answer, capsys):
    check(answer)
    assert capsys.readouterr().out.startswith("✓")


def test_checks_leave_the_global_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    ch06.check_update_cache(update_cache_ref)
    ch06.check_top_p_filter(top_p_ref)
    ch06.check_repetition_penalty(repetition_ref)
    assert torch.equal(torch.rand(3), expected)


# ------------------------------------------------------------------ stubs fail
@pytest.mark.parametrize(
    "check",
    [ch06.check_update_cache, ch06.check_rope_for_new_tokens, ch06.check_top_p_filter, ch06.check_repetition_penalty,
     ch06.check_longest_context],
)
def test_stub_fails(check):
    with pytest.raises(AssertionError, match="not implemented"):
        check(stub)


def assert_names(check, fn, *fragments, label):
    """The check fails; its message carries the exercise label, each fragment, and the hint before the
    line that says how to ask for a solution."""
    with pytest.raises(AssertionError) as err:
        check(fn)
    msg = str(err.value)
    assert msg.startswith(f"[{label}"), msg
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in:\n{msg}"
    if "hint:" in msg:
        assert msg.index("hint:") < msg.index("show_solution("), msg
    return msg


# ------------------------------------------------------------------ 6.1 wrong caches
def cache_written_at(offset):
    def fn(buffer, past_len, k_new, v_new):
        start = max(past_len + offset, 0) if offset != "zero" else 0
        end = past_len + k_new.shape[1]
        buffer[0][:, start:start + k_new.shape[1]] = k_new
        buffer[1][:, start:start + v_new.shape[1]] = v_new
        return buffer[0][:, :end], buffer[1][:, :end]
    return fn


def cache_whole_buffer(buffer, past_len, k_new, v_new):
    update_cache_ref(buffer, past_len, k_new, v_new)
    return buffer


def cache_only_new(buffer, past_len, k_new, v_new):
    update_cache_ref(buffer, past_len, k_new, v_new)
    return k_new, v_new


def cache_only_past(buffer, past_len, k_new, v_new):
    update_cache_ref(buffer, past_len, k_new, v_new)
    return buffer[0][:, :past_len], buffer[1][:, :past_len]


def cache_swaps_kv(buffer, past_len, k_new, v_new):
    k, v = update_cache_ref(buffer, past_len, k_new, v_new)
    return v, k


def cache_cat(buffer, past_len, k_new, v_new):  # right values, but the buffer is never written
    return torch.cat([buffer[0][:, :past_len], k_new], dim=1), torch.cat([buffer[1][:, :past_len], v_new], dim=1)


def cache_copy(buffer, past_len, k_new, v_new):
    k, v = update_cache_ref(buffer, past_len, k_new, v_new)
    return k.clone(), v.clone()


def cache_head_axis(buffer, past_len, k_new, v_new):
    end = past_len + k_new.shape[1]
    buffer[0][:, :, past_len:past_len + k_new.shape[2]] = k_new
    buffer[1][:, :, past_len:past_len + v_new.shape[2]] = v_new
    return buffer[0][:, :end], buffer[1][:, :end]


def cache_writes_everything(buffer, past_len, k_new, v_new):  # fills the free part with zeros first
    for buf in buffer:
        buf[:, past_len:] = 0
    return update_cache_ref(buffer, past_len, k_new, v_new)


def cache_returns_one(buffer, past_len, k_new, v_new):
    return update_cache_ref(buffer, past_len, k_new, v_new)[0]


@pytest.mark.parametrize("fn, fragment", [
    (cache_written_at("zero"), "written at the start of the buffer"),
    (cache_written_at(-1), "one place too early"),
    (cache_whole_buffer, "the whole buffer returned"),
    (cache_only_new, "only the new positions returned"),
    (cache_only_past, "only the cached positions returned"),
    (cache_swaps_kv, "keys and values swapped"),
    (cache_cat, "were not written into the buffer"),
    (cache_copy, "a copy, not a view of the buffer"),
    (cache_writes_everything, "wrote into the free part"),
    (cache_returns_one, "expected a pair (k, v), got Tensor"),
])
def test_cache_mistakes_are_named(fn, fragment):
    assert_names(ch06.check_update_cache, fn, fragment, label=ch06.CACHE)


def test_cache_off_by_one_writes_are_reported_with_their_case():
    assert_names(ch06.check_update_cache, cache_written_at(1), "(on past_len=", label=ch06.CACHE)
    assert_names(ch06.check_update_cache, cache_head_axis, "(on past_len=", label=ch06.CACHE)


# ------------------------------------------------------------------ 6.2 wrong RoPE rows
def rope_offset_zero(cos, sin, past_len, n_new):
    return cos[:n_new], sin[:n_new]


def rope_off_by_one(cos, sin, past_len, n_new):
    return cos[past_len + 1:past_len + 1 + n_new], sin[past_len + 1:past_len + 1 + n_new]


def rope_ends_at_past_len(cos, sin, past_len, n_new):
    return cos[max(past_len - n_new, 0):past_len], sin[max(past_len - n_new, 0):past_len]


def rope_whole_prefix(cos, sin, past_len, n_new):
    return cos[:past_len + n_new], sin[:past_len + n_new]


def rope_swapped(cos, sin, past_len, n_new):
    return sin[past_len:past_len + n_new], cos[past_len:past_len + n_new]


def rope_last_rows(cos, sin, past_len, n_new):
    return cos[-n_new:], sin[-n_new:]


def rope_no_limit(cos, sin, past_len, n_new):
    return cos[past_len:past_len + n_new], sin[past_len:past_len + n_new]


def rope_limit_off_by_one(cos, sin, past_len, n_new):
    if past_len + n_new >= cos.shape[0]:
        raise ValueError("does not fit")
    return cos[past_len:past_len + n_new], sin[past_len:past_len + n_new]


def rope_index_error(cos, sin, past_len, n_new):
    if past_len + n_new > cos.shape[0]:
        raise IndexError("past the end")
    return cos[past_len:past_len + n_new], sin[past_len:past_len + n_new]


@pytest.mark.parametrize("fn, fragment", [
    (rope_no_limit, "instead of raising: a slice past the end of a tensor is silently cut short"),
    (rope_limit_off_by_one, "refused new tokens that fit"),
    (rope_index_error, "should raise a ValueError"),
])
def test_rope_limit_mistakes_are_named(fn, fragment):
    assert_names(ch06.check_rope_for_new_tokens, fn, fragment, label=ch06.ROPE)


@pytest.mark.parametrize("fn, fragment", [
    (rope_offset_zero, "positions restarting at 0"),
    (rope_off_by_one, "an off-by-one start"),
    (rope_ends_at_past_len, "ending at past_len, not starting there"),
    (rope_whole_prefix, "every row up to the last new position"),
    (rope_swapped, "cos and sin swapped"),
    (rope_last_rows, "the last n_new rows of the table"),
])
def test_rope_mistakes_are_named(fn, fragment):
    assert_names(ch06.check_rope_for_new_tokens, fn, fragment, label=ch06.ROPE)


# ------------------------------------------------------------------ 6.3 wrong nucleus filters
def top_p_drops_crossing(logits, top_p):
    """Keeps only tokens whose cumulative probability is <= top_p: the crossing token is dropped."""
    sorted_logits, idx = logits.sort(dim=-1, descending=True)
    remove_sorted = sorted_logits.softmax(-1).cumsum(-1) > top_p
    remove = remove_sorted.scatter(-1, idx, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def top_p_drops_crossing_keeps_first(logits, top_p):
    sorted_logits, idx = logits.sort(dim=-1, descending=True)
    remove_sorted = sorted_logits.softmax(-1).cumsum(-1) > top_p
    remove_sorted[..., 0] = False
    remove = remove_sorted.scatter(-1, idx, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def top_p_strict_boundary(logits, top_p):
    """`before > top_p`: keeps a token whose more likely tokens already sum to exactly top_p."""
    sorted_logits, idx = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    remove_sorted = probs.cumsum(-1) - probs > top_p
    return logits.masked_fill(remove_sorted.scatter(-1, idx, remove_sorted), float("-inf"))


def top_p_unsorted(logits, top_p):
    """Cumulative sum in vocabulary order instead of probability order."""
    probs = logits.softmax(-1)
    return logits.masked_fill(probs.cumsum(-1) - probs >= top_p, float("-inf"))


def top_p_mask_in_sorted_order(logits, top_p):
    """Forgets to scatter the mask back to vocabulary order."""
    sorted_logits, _ = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    return logits.masked_fill(probs.cumsum(-1) - probs >= top_p, float("-inf"))


def top_p_zero_instead_of_minus_inf(logits, top_p):
    return torch.nan_to_num(top_p_ref(logits, top_p), neginf=0.0)


def top_p_returns_probs(logits, top_p):
    return top_p_ref(logits, top_p).softmax(-1)


def top_p_in_place(logits, top_p):
    return logits.masked_fill_(~torch.isfinite(top_p_ref(logits, top_p)), float("-inf"))


def top_p_crashes_on_batches(logits, top_p):
    sorted_logits, idx = logits.sort(descending=True)
    probs = sorted_logits.softmax(-1)
    keep = int(((probs.cumsum(-1) - probs) < top_p).sum())  # one count for the whole batch
    return logits.masked_fill(torch.ones_like(logits, dtype=torch.bool).scatter(-1, idx[:, :keep], False), float("-inf"))


def top_p_ascending(logits, top_p):
    """Sorts ascending: on the boundary case it removes nothing, elsewhere it removes the most likely tokens."""
    sorted_logits, idx = logits.sort(dim=-1, descending=False)
    probs = sorted_logits.softmax(-1)
    remove_sorted = probs.cumsum(-1) - probs >= top_p
    return logits.masked_fill(remove_sorted.scatter(-1, idx, remove_sorted), float("-inf"))


def test_an_ascending_sort_is_not_reported_as_nothing_removed():
    msg = assert_names(ch06.check_top_p_filter, top_p_ascending, "sorted from the least likely up", label=ch06.TOP_P)
    assert "nothing removed" not in msg


@pytest.mark.parametrize("check, fn", [
    (ch06.check_top_p_filter, ref_top_p_filter),
    (ch06.check_top_p_filter, lambda logits, top_p: ref_top_p_filter(logits, top_p)),
    (ch06.check_repetition_penalty, ref_repetition_penalty),
    (ch06.check_repetition_penalty, lambda logits, ids, penalty: ref_repetition_penalty(logits, ids, penalty)),
])
def test_the_packages_own_functions_are_refused(check, fn):
    """The package's function, called directly or through a wrapper, is not an answer."""
    with pytest.raises(AssertionError, match="minimind_ref's own|the package's own answer to this exercise"):
        check(fn)


@pytest.mark.parametrize("fn, fragment", [
    (top_p_drops_crossing, "the token whose probability crosses top_p is dropped"),
    (top_p_drops_crossing_keeps_first, "the crossing token is dropped whenever more than one token is kept"),
    (top_p_strict_boundary, "sum to exactly top_p"),
    (top_p_unsorted, "cumulative sum was taken in vocabulary order"),
    (top_p_mask_in_sorted_order, "scattered back"),
    (top_p_zero_instead_of_minus_inf, "removed tokens set to 0 instead of -inf"),
    (top_p_returns_probs, "probabilities returned instead of logits"),
    (lambda logits, top_p: logits, "nothing removed"),
    (top_p_ascending, "sorted from the least likely up"),
    (top_p_in_place, "changed its input (argument 1) in place"),
])
def test_top_p_mistakes_are_named(fn, fragment):
    assert_names(ch06.check_top_p_filter, fn, fragment, label=ch06.TOP_P)


def test_top_p_boundary_is_the_case_that_fails():
    """[.5, .25, .125, .125] (shuffled) with top_p 0.75: minimind_ref keeps 2 tokens; `before > top_p` keeps 3."""
    msg = assert_names(ch06.check_top_p_filter, top_p_strict_boundary, "2 tokens are kept in each row", label=ch06.TOP_P)
    assert "expected -inf" in msg


def test_top_p_missing_scatter_is_not_reported_as_a_zero_difference():
    msg = assert_names(ch06.check_top_p_filter, top_p_mask_in_sorted_order, "this looks like", label=ch06.TOP_P)
    assert "max abs diff 0" not in msg


def test_top_p_unknown_mistake_still_reports_the_case():
    assert_names(ch06.check_top_p_filter, top_p_crashes_on_batches, "(on ", "hint:", label=ch06.TOP_P)


# ------------------------------------------------------------------ 6.4 wrong penalties
def repetition_divides_all(logits, previous_ids, penalty):
    return logits.scatter(1, previous_ids, logits.gather(1, previous_ids) / penalty)


def repetition_per_occurrence(logits, previous_ids, penalty):
    out = logits.clone()
    for row in range(logits.shape[0]):
        for tok in previous_ids[row].tolist():
            x = out[row, tok]
            out[row, tok] = x / penalty if x > 0 else x * penalty
    return out


def repetition_reversed(logits, previous_ids, penalty):
    seen = logits.gather(1, previous_ids)
    return logits.scatter(1, previous_ids, torch.where(seen > 0, seen * penalty, seen / penalty))


def repetition_subtracts(logits, previous_ids, penalty):
    return logits.scatter(1, previous_ids, logits.gather(1, previous_ids) - penalty)


def repetition_every_token(logits, previous_ids, penalty):
    return torch.where(logits > 0, logits / penalty, logits * penalty)


def repetition_all_rows(logits, previous_ids, penalty):
    out = logits.clone()
    for tok in set(previous_ids.flatten().tolist()):  # every row's ids, in every row
        out[:, tok] = torch.where(out[:, tok] > 0, out[:, tok] / penalty, out[:, tok] * penalty)
    return out


def repetition_last_only(logits, previous_ids, penalty):
    return repetition_ref(logits, previous_ids[:, -1:], penalty)


def repetition_in_place(logits, previous_ids, penalty):
    seen = logits.gather(1, previous_ids)
    return logits.scatter_(1, previous_ids, torch.where(seen > 0, seen / penalty, seen * penalty))


def repetition_in_place_loop(logits, previous_ids, penalty):
    for row in range(logits.shape[0]):
        for tok in set(previous_ids[row].tolist()):
            x = logits[row, tok]
            logits[row, tok] = x / penalty if x > 0 else x * penalty
    return logits


def repetition_ctrl_draft(logits, previous_ids, penalty):  # the chapter's draft: CTRL as written, per occurrence
    out = logits.clone()
    for row in range(logits.shape[0]):
        for token in previous_ids[row].tolist():
            out[row, token] = out[row, token] / penalty
    return out


@pytest.mark.parametrize("fn, fragment", [
    (repetition_ctrl_draft, "CTRL's rule as the draft applies it"),
    (repetition_divides_all, "negative logits divided by the penalty"),
    (repetition_per_occurrence, "penalized once per occurrence"),
    (repetition_reversed, "the two cases reversed"),
    (repetition_subtracts, "the penalty subtracted"),
    (repetition_every_token, "every token penalized"),
    (repetition_all_rows, "the ids of every row penalized in every row"),
    (repetition_last_only, "only the last previous token penalized"),
    (lambda logits, previous_ids, penalty: logits, "nothing changed"),
    (repetition_in_place, "changed its input (argument 1) in place"),
    (repetition_in_place_loop, "changed its input (argument 1) in place"),
])
def test_penalty_mistakes_are_named(fn, fragment):
    assert_names(ch06.check_repetition_penalty, fn, fragment, label=ch06.PENALTY)


# ------------------------------------------------------------------ 6.5 wrong context lengths
def _ctx(per_token=None, weights=None, rounding=lambda a, d: a // d, clamp=True):
    """longest_context with one ingredient replaced: per_token(cfg, b, batch), weights(cfg, b)."""
    def fn(config, memory_bytes, bytes_per_value=2, batch=1):
        b = bytes_per_value
        w = count_parameters(config) * b if weights is None else weights(config, b)
        pt = (2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * b * batch
              if per_token is None else per_token(config, b, batch))
        n = rounding(memory_bytes - w, pt)
        return max(0, n) if clamp else n
    return fn


@pytest.mark.parametrize("fn, fragment", [
    (_ctx(per_token=lambda c, b, n: c.num_hidden_layers * c.num_key_value_heads * c.head_dim * b * n), "keys only"),
    (_ctx(per_token=lambda c, b, n: 2 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * b * n),
     "num_attention_heads used for the cache"),
    (_ctx(per_token=lambda c, b, n: 2 * c.num_hidden_layers * 2 * c.head_dim * b * n), "MiniMind2's 2 KV heads"),
    (_ctx(per_token=lambda c, b, n: 2 * c.num_hidden_layers * c.num_key_value_heads
          * (c.hidden_size // c.num_attention_heads) * b * n), "hidden_size // num_attention_heads used as head_dim"),
    (_ctx(per_token=lambda c, b, n: 2 * c.num_key_value_heads * c.head_dim * b * n), "one layer's cache"),
    (_ctx(weights=lambda c, b: 0), "the weights left out"),
    (_ctx(per_token=lambda c, b, n: 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * b), "the batch left out"),
    (_ctx(rounding=lambda a, d: math.ceil(a / d)), "rounded up"),
    (_ctx(weights=lambda c, b: count_parameters(c) * 4), "the weights counted at 4 bytes"),
    (_ctx(weights=lambda c, b: (count_parameters(c) + c.vocab_size * c.hidden_size) * b), "counted twice"),
    (_ctx(clamp=False), "a negative length"),
    (lambda config, memory_bytes, bytes_per_value=2, batch=1: float(longest_context_ref(config, memory_bytes,
                                                                                        bytes_per_value, batch)),
     "expected an int"),
    (lambda config, memory_bytes, bytes_per_value=2, batch=1: longest_context_ref(config, memory_bytes) + 1,
     "which is not the reference's: yours is larger"),
    (lambda config, memory_bytes: 0, "your function raised TypeError"),
])
def test_context_mistakes_are_named(fn, fragment):
    assert_names(ch06.check_longest_context, fn, fragment, label="Exercise 6.5 longest_context")


# ---------------------------------------------------------------------- issue 44, third newcomer probe
from _helpers import check_fails  # noqa: E402


def test_probe3_update_cache_refuses_the_package_buffers():
    """GrowingKV(...).append and append_kv on a GrowingKV passed 6.1."""
    from minimind_ref.cache import GrowingKV, append_kv

    def growing(buffer, past_len, k_new, v_new):
        out = GrowingKV(buffer[0], buffer[1], past_len).append(k_new, v_new)
        return out[0], out[1]

    for fn in (growing, lambda b, p, k, v: tuple(append_kv(GrowingKV(b[0], b[1], p), k, v))):
        check_fails(ch06.check_update_cache, fn, "your function calls minimind_ref.cache's GrowingKV")


@pytest.mark.parametrize("kind, fragment", [
    ("swapped writes", "the new keys written into the value buffer and the new values into the key buffer"),
    ("newest dropped", "the newest position left out of what is returned"),
])
def test_probe3_update_cache_mistakes_are_named(kind, fragment):
    def update(buffer, past_len, k_new, v_new):
        kb, vb = buffer
        end = past_len + k_new.shape[1]
        if kind == "swapped writes":
            vb[:, past_len:end], kb[:, past_len:end] = k_new, v_new
            return kb[:, :end], vb[:, :end]
        kb[:, past_len:end], vb[:, past_len:end] = k_new, v_new
        return kb[:, :end - 1], vb[:, :end - 1]

    check_fails(ch06.check_update_cache, update, "this looks like " + fragment)


def test_probe3_rope_rows_one_early_are_named():
    def early(cos, sin, past_len, n_new):
        if past_len + n_new > cos.shape[0]:
            raise ValueError("too long")
        start = max(past_len - 1, 0)
        return cos[start:start + n_new], sin[start:start + n_new]

    check_fails(ch06.check_rope_for_new_tokens, early, "this looks like an off-by-one start, one row early")


def _top_p(mode):
    def top_p_filter(logits, top_p):
        if mode == "logits":
            sp, si = logits.sort(-1, descending=True)
        else:
            sp, si = logits.softmax(0 if mode == "batch" else -1).sort(-1, descending=True)
        keep = sp.cumsum(-1) <= top_p if mode == "crossing" else (sp.cumsum(-1) - sp) < top_p
        keep = keep.gather(-1, si) if mode == "gather" else torch.zeros_like(keep).scatter(-1, si, keep)
        return logits.masked_fill(~keep, float("-inf"))
    return top_p_filter


@pytest.mark.parametrize("mode, fragment", [
    # softmax first, then sorted: at top_p = 1 its cumulative sum rounds differently from the check's own
    ("crossing", "the token whose probability crosses top_p is dropped"),
    ("logits", "the cumulative sum taken over the logits instead of the probabilities"),
    ("batch", "the softmax taken over the batch axis"),
    ("gather", "the mask carried back to vocabulary order with a gather"),
])
def test_probe3_top_p_mistakes_are_named(mode, fragment):
    check_fails(ch06.check_top_p_filter, _top_p(mode), "this looks like " + fragment)


def test_probe3_repetition_penalty_proportional_to_size_is_named():
    def proportional(logits, previous_ids, penalty):
        seen = logits.gather(1, previous_ids)
        return logits.scatter(1, previous_ids, seen - seen.abs() * (penalty - 1))

    check_fails(ch06.check_repetition_penalty, proportional,
                "this looks like each seen logit lowered by (penalty - 1) times its size")
