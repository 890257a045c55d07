"""Chapter 03 checks: each accepts a correct answer and rejects stubs and typical wrong answers."""

from __future__ import annotations

import math

import pytest
import torch

from minimind_ref import apply_rotary_pos_emb
from minimind_ref import repeat_kv as ref_repeat_kv
from minimind_ref.checks import ch03


# ------------------------------------------------------------------ reference answers
def softmax_ref(x, dim=-1):
    e = torch.exp(x - x.max(dim, keepdim=True).values)
    return e / e.sum(dim, keepdim=True)


def sdpa_ref(q, k, v, mask=None, scale=True):
    scores = q @ k.transpose(-2, -1)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores + mask
    return torch.softmax(scores, dim=-1) @ v


def causal_ref(q_len, kv_len=None):
    kv_len = q_len if kv_len is None else kv_len
    return torch.full((q_len, kv_len), float("-inf")).triu(kv_len - q_len + 1)


def make_gqa(*, scale=True, repeat=ref_repeat_kv, pad_value=-1e9, causal=causal_ref, rope_k=True,
             cache_repeated=False):
    """A from-scratch GQA forward; the keyword arguments switch in one typical mistake each."""

    def gqa(attn, x, cos, sin, attention_mask=None, past_key_value=None):
        b, s, _ = x.shape
        q = attn.q_proj(x).view(b, s, attn.n_heads, attn.head_dim)
        k = attn.k_proj(x).view(b, s, attn.n_kv_heads, attn.head_dim)
        v = attn.v_proj(x).view(b, s, attn.n_kv_heads, attn.head_dim)
        q_rot, k_rot = apply_rotary_pos_emb(q, k, cos, sin)
        q, k = q_rot, (k_rot if rope_k else k)
        if past_key_value is not None:
            k = torch.cat([past_key_value[0], k], dim=1)
            v = torch.cat([past_key_value[1], v], dim=1)
        t = k.shape[1]
        kr, vr = repeat(k, attn.n_rep), repeat(v, attn.n_rep)
        mask = causal(s, t)
        if attention_mask is not None:
            mask = mask + (1.0 - attention_mask[:, None, None, :]) * pad_value
        out = sdpa_ref(q.transpose(1, 2), kr.transpose(1, 2), vr.transpose(1, 2), mask, scale=scale)
        out = attn.o_proj(out.transpose(1, 2).reshape(b, s, -1))
        return out, ((kr, vr) if cache_repeated else (k, v))

    return gqa


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise 3.x: implement me")


# ------------------------------------------------------------------ references pass
@pytest.mark.parametrize(
    "check, answer",
    [
        (ch03.check_stable_softmax, softmax_ref),
        (ch03.check_scaled_dot_product_attention, sdpa_ref),
        (ch03.check_causal_mask, causal_ref),
        (ch03.check_repeat_kv, ref_repeat_kv),
        (ch03.check_gqa_attention, make_gqa()),
    ],
)
def test_reference_passes(check, answer, capsys):
    check(answer)
    assert capsys.readouterr().out.startswith("✓")


def test_checks_leave_the_global_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    ch03.check_gqa_attention(make_gqa())
    ch03.check_repeat_kv(ref_repeat_kv)
    assert torch.equal(torch.rand(3), expected)


# ------------------------------------------------------------------ stubs fail
@pytest.mark.parametrize(
    "check",
    [ch03.check_stable_softmax, ch03.check_scaled_dot_product_attention, ch03.check_causal_mask,
     ch03.check_repeat_kv, ch03.check_gqa_attention],
)
def test_stub_fails(check):
    with pytest.raises(AssertionError, match="not implemented"):
        check(stub)


# ------------------------------------------------------------------ wrong answers fail
def naive_softmax(x, dim=-1):
    e = torch.exp(x)
    return e / e.sum(dim, keepdim=True)


def softmax_wrong_axis(x, dim=-1):
    return softmax_ref(x, dim=0)


def softmax_global_sum(x, dim=-1):
    e = torch.exp(x - x.max())  # normalises over the whole tensor, not per row
    return e / e.sum()


def causal_off_by_one(q_len, kv_len=None):  # hides the diagonal
    kv_len = q_len if kv_len is None else kv_len
    return torch.full((q_len, kv_len), float("-inf")).triu(kv_len - q_len)


def causal_top_left(q_len, kv_len=None):  # ignores the cache offset
    kv_len = q_len if kv_len is None else kv_len
    return torch.full((q_len, kv_len), float("-inf")).triu(1)


def causal_finite(q_len, kv_len=None):
    return causal_ref(q_len, kv_len).clamp(min=-1e9)


def causal_bool(q_len, kv_len=None):
    kv_len = q_len if kv_len is None else kv_len
    return torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)


def repeat_tiled(x, n_rep):
    return x.repeat(1, 1, n_rep, 1)


def repeat_on_wrong_axis(x, n_rep):
    return torch.repeat_interleave(x, n_rep, dim=1)


def softmax_global_max(x, dim=-1):
    e = torch.exp(x - x.max())
    return e / e.sum(dim, keepdim=True)


def softmax_ignores_dim(x, dim=-1):
    return softmax_ref(x, dim=-1)


def softmax_in_place(x, dim=-1):
    x.sub_(x.max(dim, keepdim=True).values)
    return softmax_ref(x, dim)


def softmax_no_keepdim(x, dim=-1):
    e = torch.exp(x - x.max(dim).values)
    return e / e.sum(dim)


def softmax_no_normalise(x, dim=-1):
    return torch.exp(x - x.max(dim, keepdim=True).values)


def sdpa_no_scale(q, k, v, mask=None):
    return sdpa_ref(q, k, v, mask, scale=False)


def sdpa_scale_by_d(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / q.shape[-1]
    return torch.softmax(scores if mask is None else scores + mask, dim=-1) @ v


def sdpa_query_axis(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores if mask is None else scores + mask, dim=-2) @ v


def sdpa_ignores_mask(q, k, v, mask=None):
    return sdpa_ref(q, k, v, None)


def sdpa_returns_weights(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores if mask is None else scores + mask, dim=-1)


def sdpa_k_not_transposed(q, k, v, mask=None):
    return torch.softmax(q @ k / math.sqrt(q.shape[-1]), dim=-1) @ v


def causal_swapped(q_len, kv_len=None):
    kv_len = q_len if kv_len is None else kv_len
    return torch.full((q_len, kv_len), float("-inf")).tril(kv_len - q_len)


def causal_ones(q_len, kv_len=None):
    kv_len = q_len if kv_len is None else kv_len
    return torch.ones(q_len, kv_len).tril(kv_len - q_len)


def causal_no_default(q_len, kv_len):
    return causal_ref(q_len, kv_len)


def repeat_last_axis(x, n_rep):
    return torch.repeat_interleave(x, n_rep, dim=3)


def repeat_identity(x, n_rep):
    return x


def gqa_returns_output_only(attn, x, cos, sin, attention_mask=None, past_key_value=None):
    return attn(x, (cos, sin), past_key_value, True, attention_mask)[0]


def gqa_edits_cache(attn, x, cos, sin, attention_mask=None, past_key_value=None):
    out = make_gqa()(attn, x, cos, sin, attention_mask, past_key_value)
    if past_key_value is not None:
        past_key_value[0].zero_()
    return out


def gqa_no_rope_q(attn, x, cos, sin, attention_mask=None, past_key_value=None):
    b, s, _ = x.shape
    zeros = torch.zeros_like(sin)
    ones = torch.ones_like(cos)
    q_plain = make_gqa()(attn, x, ones, zeros, attention_mask, past_key_value)  # noqa: F841 (exercise the path)
    return _gqa_variant_for_tests(attn, x, cos, sin, attention_mask, past_key_value, rope_q=False)


def _gqa_variant_for_tests(attn, x, cos, sin, mask, past, **kwargs):
    from minimind_ref.checks.ch03 import _gqa_variant
    return _gqa_variant(attn, x, cos, sin, mask, past, **kwargs)


def gqa_ignores_cache(attn, x, cos, sin, attention_mask=None, past_key_value=None):
    return _gqa_variant_for_tests(attn, x, cos, sin, attention_mask, past_key_value, use_past=False)


def gqa_no_causal(attn, x, cos, sin, attention_mask=None, past_key_value=None):
    return _gqa_variant_for_tests(attn, x, cos, sin, attention_mask, past_key_value, causal="none")


# (check, wrong answer, text the failure must contain: the named mistake, or the failing input)
WRONG = [
    (ch03.check_stable_softmax, naive_softmax, "this looks like exp(x) without subtracting the maximum"),
    (ch03.check_stable_softmax, naive_softmax, "NaN"),
    (ch03.check_stable_softmax, softmax_wrong_axis, "this looks like a softmax over dimension 0 instead of dim=-1"),
    (ch03.check_stable_softmax, softmax_ignores_dim, "this looks like a softmax over dimension 1 instead of dim=0"),
    (ch03.check_stable_softmax, softmax_global_sum, "this looks like normalised by the sum over the whole tensor"),
    (ch03.check_stable_softmax, softmax_global_max, "this looks like the maximum of the whole tensor subtracted"),
    (ch03.check_stable_softmax, softmax_in_place, "changed its input (argument 1) in place"),
    (ch03.check_stable_softmax, softmax_no_keepdim, "raised RuntimeError"),
    (ch03.check_stable_softmax, softmax_no_keepdim, "keepdim=True"),
    (ch03.check_stable_softmax, softmax_no_normalise, "this looks like exp(x - max) without dividing by the sum"),
    (ch03.check_scaled_dot_product_attention, sdpa_no_scale, "this looks like no scaling"),
    (ch03.check_scaled_dot_product_attention, sdpa_scale_by_d, "this looks like scores divided by d instead of sqrt(d)"),
    (ch03.check_scaled_dot_product_attention, sdpa_query_axis, "this looks like the softmax over the query axis"),
    (ch03.check_scaled_dot_product_attention, sdpa_ignores_mask, "this looks like the mask ignored"),
    (ch03.check_scaled_dot_product_attention, sdpa_returns_weights, "this looks like the attention weights returned"),
    (ch03.check_scaled_dot_product_attention, sdpa_k_not_transposed, "raised RuntimeError"),
    (ch03.check_scaled_dot_product_attention, sdpa_k_not_transposed, "(on q (2, 3, 5, 16), k and v (2, 3, 5, 16)"),
    (ch03.check_causal_mask, causal_off_by_one, "this looks like the diagonal hidden too"),
    (ch03.check_causal_mask, causal_top_left, "this looks like the triangle aligned top-left"),
    (ch03.check_causal_mask, causal_swapped, "this looks like the visible and hidden parts swapped"),
    (ch03.check_causal_mask, causal_finite, "the reference removes this entry with -inf; yours keeps a finite value"),
    (ch03.check_causal_mask, causal_bool, "dtype mismatch: expected torch.float32, got torch.bool"),
    (ch03.check_causal_mask, causal_ones, "this looks like a 1/0 mask"),
    (ch03.check_causal_mask, causal_no_default, "raised TypeError"),
    (ch03.check_causal_mask, causal_no_default, "kv_len is optional"),
    (ch03.check_repeat_kv, repeat_tiled, "this looks like the heads tiled"),
    (ch03.check_repeat_kv, repeat_on_wrong_axis, "this looks like the sequence axis (dim 1) repeated"),
    (ch03.check_repeat_kv, repeat_last_axis, "this looks like the last axis (head_dim) repeated"),
    (ch03.check_repeat_kv, repeat_identity, "this looks like the input returned unchanged"),
    (ch03.check_gqa_attention, make_gqa(scale=False), "this looks like no 1/sqrt(head_dim) scaling"),
    (ch03.check_gqa_attention, make_gqa(repeat=repeat_tiled), "this looks like the KV heads tiled"),
    (ch03.check_gqa_attention, make_gqa(pad_value=float("-inf")), "this looks like padding added as -inf"),
    (ch03.check_gqa_attention, make_gqa(pad_value=float("-inf")), "NaN"),
    (ch03.check_gqa_attention, make_gqa(pad_value=0.0), "this looks like the padding mask ignored"),
    (ch03.check_gqa_attention, make_gqa(causal=causal_top_left), "this looks like the causal triangle aligned top-left"),
    (ch03.check_gqa_attention, make_gqa(causal=causal_off_by_one), "this looks like the diagonal hidden"),
    (ch03.check_gqa_attention, gqa_no_causal, "this looks like no causal mask"),
    (ch03.check_gqa_attention, make_gqa(rope_k=False), "this looks like RoPE applied to q only"),
    (ch03.check_gqa_attention, gqa_no_rope_q, "this looks like RoPE applied to k only"),
    (ch03.check_gqa_attention, gqa_ignores_cache, "this looks like the cache ignored"),
    (ch03.check_gqa_attention, make_gqa(cache_repeated=True), "this looks like the repeated keys/values cached"),
    (ch03.check_gqa_attention, gqa_returns_output_only, "expected a tuple (output, (k, v))"),
    (ch03.check_gqa_attention, gqa_edits_cache, "changed its input (argument 6) in place"),
]


@pytest.mark.parametrize("check, wrong, message", WRONG, ids=[f"{c.__name__}-{m[:40]}" for c, _, m in WRONG])
def test_wrong_answer_fails_naming_the_mistake(check, wrong, message):
    with pytest.raises(AssertionError) as err:
        check(wrong)
    text = str(err.value)
    assert message in text, text
    assert text.startswith("[Exercise 3.") and "hint:" in text


def test_failure_names_the_mistake_before_the_hint_and_how_to_ask_last():
    with pytest.raises(AssertionError) as err:
        ch03.check_gqa_attention(make_gqa(scale=False))
    text = str(err.value)
    assert text.index("this looks like") < text.index("hint:") < text.index('show_solution("3.5")')


def test_overflow_message_names_the_fix():
    with pytest.raises(AssertionError, match="max"):
        ch03.check_stable_softmax(naive_softmax)


def test_padding_with_minus_inf_is_reported_as_nan():
    with pytest.raises(AssertionError, match="NaN"):
        ch03.check_gqa_attention(make_gqa(pad_value=float("-inf")))
