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


@pytest.mark.parametrize(
    "check, wrong",
    [
        (ch03.check_stable_softmax, naive_softmax),
        (ch03.check_stable_softmax, softmax_wrong_axis),
        (ch03.check_stable_softmax, softmax_global_sum),
        (ch03.check_scaled_dot_product_attention, lambda q, k, v, mask=None: sdpa_ref(q, k, v, mask, scale=False)),
        (ch03.check_scaled_dot_product_attention,
         lambda q, k, v, mask=None: torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-2) @ v),
        (ch03.check_scaled_dot_product_attention, lambda q, k, v, mask=None: sdpa_ref(q, k, v, None)),
        (ch03.check_causal_mask, causal_off_by_one),
        (ch03.check_causal_mask, causal_top_left),
        (ch03.check_causal_mask, causal_finite),
        (ch03.check_causal_mask, causal_bool),
        (ch03.check_repeat_kv, repeat_tiled),
        (ch03.check_repeat_kv, repeat_on_wrong_axis),
        (ch03.check_gqa_attention, make_gqa(scale=False)),
        (ch03.check_gqa_attention, make_gqa(repeat=repeat_tiled)),
        (ch03.check_gqa_attention, make_gqa(pad_value=float("-inf"))),
        (ch03.check_gqa_attention, make_gqa(pad_value=0.0)),
        (ch03.check_gqa_attention, make_gqa(causal=causal_top_left)),
        (ch03.check_gqa_attention, make_gqa(causal=causal_off_by_one)),
        (ch03.check_gqa_attention, make_gqa(rope_k=False)),
        (ch03.check_gqa_attention, make_gqa(cache_repeated=True)),
        (ch03.check_gqa_attention, lambda attn, x, cos, sin, attention_mask=None, past_key_value=None: attn(
            x, (cos, sin), past_key_value, True, attention_mask)[0]),
    ],
)
def test_wrong_answer_fails(check, wrong):
    with pytest.raises(AssertionError) as err:
        check(wrong)
    assert "hint" in str(err.value) or "expected" in str(err.value)


def test_overflow_message_names_the_fix():
    with pytest.raises(AssertionError, match="max"):
        ch03.check_stable_softmax(naive_softmax)


def test_padding_with_minus_inf_is_reported_as_nan():
    with pytest.raises(AssertionError, match="NaN"):
        ch03.check_gqa_attention(make_gqa(pad_value=float("-inf")))
