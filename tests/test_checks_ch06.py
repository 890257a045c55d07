"""Chapter 06 checks: each accepts a correct answer and rejects stubs and typical wrong answers."""

from __future__ import annotations

import pytest
import torch

from minimind_ref.checks import ch06
from minimind_ref.generation import apply_repetition_penalty as ref_repetition_penalty
from minimind_ref.generation import top_p_filter as ref_top_p_filter


# ------------------------------------------------------------------ reference answers
def update_cache_ref(past, k_new, v_new):
    if past is None:
        return k_new, v_new
    return torch.cat([past[0], k_new], dim=1), torch.cat([past[1], v_new], dim=1)


def rope_ref(cos, sin, past_len, n_new):
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


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise 6.x: implement me")


@pytest.mark.parametrize(
    "check, answer",
    [
        (ch06.check_update_cache, update_cache_ref),
        (ch06.check_rope_for_new_tokens, rope_ref),
        (ch06.check_top_p_filter, top_p_ref),
        (ch06.check_top_p_filter, top_p_hf_style),
        (ch06.check_top_p_filter, ref_top_p_filter),
        (ch06.check_repetition_penalty, repetition_ref),
        (ch06.check_repetition_penalty, repetition_loop),
        (ch06.check_repetition_penalty, ref_repetition_penalty),
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
    [ch06.check_update_cache, ch06.check_rope_for_new_tokens, ch06.check_top_p_filter, ch06.check_repetition_penalty],
)
def test_stub_fails(check):
    with pytest.raises(AssertionError, match="not implemented"):
        check(stub)


# ------------------------------------------------------------------ wrong answers
def cache_wrong_axis(axis):
    def fn(past, k_new, v_new):
        if past is None:
            return k_new, v_new
        return torch.cat([past[0], k_new], dim=axis), torch.cat([past[1], v_new], dim=axis)
    return fn


def cache_new_first(past, k_new, v_new):
    if past is None:
        return k_new, v_new
    return torch.cat([k_new, past[0]], dim=1), torch.cat([v_new, past[1]], dim=1)


def cache_forgets_past(past, k_new, v_new):
    return k_new, v_new


def cache_swaps_kv(past, k_new, v_new):
    k, v = update_cache_ref(past, k_new, v_new)
    return v, k


def cache_none_crashes(past, k_new, v_new):
    return torch.cat([past[0], k_new], dim=1), torch.cat([past[1], v_new], dim=1)


def rope_offset_zero(cos, sin, past_len, n_new):
    return cos[:n_new], sin[:n_new]


def rope_off_by_one(cos, sin, past_len, n_new):
    return cos[past_len + 1:past_len + 1 + n_new], sin[past_len + 1:past_len + 1 + n_new]


def rope_whole_prefix(cos, sin, past_len, n_new):
    return cos[:past_len + n_new], sin[:past_len + n_new]


def rope_swapped(cos, sin, past_len, n_new):
    return sin[past_len:past_len + n_new], cos[past_len:past_len + n_new]


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


@pytest.mark.parametrize(
    "check, wrong",
    [
        (ch06.check_update_cache, cache_wrong_axis(0)),
        (ch06.check_update_cache, cache_wrong_axis(2)),
        (ch06.check_update_cache, cache_wrong_axis(3)),
        (ch06.check_update_cache, cache_new_first),
        (ch06.check_update_cache, cache_forgets_past),
        (ch06.check_update_cache, cache_swaps_kv),
        (ch06.check_update_cache, cache_none_crashes),
        (ch06.check_rope_for_new_tokens, rope_offset_zero),
        (ch06.check_rope_for_new_tokens, rope_off_by_one),
        (ch06.check_rope_for_new_tokens, rope_whole_prefix),
        (ch06.check_rope_for_new_tokens, rope_swapped),
        (ch06.check_top_p_filter, top_p_drops_crossing),
        (ch06.check_top_p_filter, top_p_drops_crossing_keeps_first),
        (ch06.check_top_p_filter, top_p_unsorted),
        (ch06.check_top_p_filter, top_p_mask_in_sorted_order),
        (ch06.check_top_p_filter, top_p_zero_instead_of_minus_inf),
        (ch06.check_top_p_filter, lambda logits, top_p: logits),
        (ch06.check_repetition_penalty, repetition_divides_all),
        (ch06.check_repetition_penalty, repetition_per_occurrence),
        (ch06.check_repetition_penalty, repetition_reversed),
        (ch06.check_repetition_penalty, repetition_subtracts),
        (ch06.check_repetition_penalty, repetition_every_token),
        (ch06.check_repetition_penalty, lambda logits, previous_ids, penalty: logits),
    ],
)
def test_wrong_answer_fails(check, wrong):
    with pytest.raises(AssertionError) as err:
        check(wrong)
    assert "hint" in str(err.value) or "expected" in str(err.value)


def test_messages_name_the_mistake():
    with pytest.raises(AssertionError, match="crosses top_p"):
        ch06.check_top_p_filter(top_p_drops_crossing_keeps_first)
    with pytest.raises(AssertionError, match="multiply negative logits"):
        ch06.check_repetition_penalty(repetition_divides_all)
    with pytest.raises(AssertionError, match="penalized once"):
        ch06.check_repetition_penalty(repetition_per_occurrence)
    with pytest.raises(AssertionError, match="restarts at position 0"):
        ch06.check_rope_for_new_tokens(rope_offset_zero)
