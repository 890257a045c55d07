"""Chapter 03 checks: each accepts a correct answer and rejects stubs and typical wrong answers."""

from __future__ import annotations

import math

import pytest
import torch

from minimind_ref import apply_rotary_pos_emb, precompute_freqs_cis
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


def repeat_kv_own(x, n_rep):  # the learner's side (the checks switch minimind_ref's repeat_kv off)
    if n_rep == 1:
        return x
    b, t, n_kv, d = x.shape
    return x[:, :, :, None, :].expand(b, t, n_kv, n_rep, d).reshape(b, t, n_kv * n_rep, d)


def causal_ref(q_len, kv_len=None):
    kv_len = q_len if kv_len is None else kv_len
    return torch.full((q_len, kv_len), float("-inf")).triu(kv_len - q_len + 1)


def make_gqa(*, scale=True, repeat=repeat_kv_own, pad_value=-1e9, causal=causal_ref, rope_k=True,
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
        (ch03.check_repeat_kv, repeat_kv_own),
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
    ch03.check_repeat_kv(repeat_kv_own)
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
    return make_gqa()(attn, x, cos, sin, attention_mask, past_key_value)[0]


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
    (ch03.check_stable_softmax, naive_softmax, "this looks like the exponentials taken without subtracting a constant"),
    (ch03.check_stable_softmax, naive_softmax, "NaN"),
    (ch03.check_stable_softmax, softmax_wrong_axis, "this looks like a softmax over dimension 0 instead of dim=-1"),
    (ch03.check_stable_softmax, softmax_ignores_dim, "this looks like a softmax over dimension 1 instead of dim=0"),
    (ch03.check_stable_softmax, softmax_global_sum, "this looks like normalised by the sum over the whole tensor"),
    (ch03.check_stable_softmax, softmax_global_max, "this looks like the maximum of the whole tensor subtracted"),
    (ch03.check_stable_softmax, softmax_in_place, "changed its input (argument 1) in place"),
    (ch03.check_stable_softmax, softmax_no_keepdim, "raised RuntimeError"),
    (ch03.check_stable_softmax, softmax_no_keepdim, "keep the reduced dimension"),
    (ch03.check_stable_softmax, softmax_no_normalise, "this looks like the exponentials returned without dividing by their sum"),
    (ch03.check_scaled_dot_product_attention, sdpa_no_scale, "this looks like no scaling"),
    (ch03.check_scaled_dot_product_attention, sdpa_scale_by_d, "this looks like scores divided by head_dim instead of by its square root"),
    (ch03.check_scaled_dot_product_attention, sdpa_query_axis, "this looks like the softmax over the query axis"),
    (ch03.check_scaled_dot_product_attention, sdpa_ignores_mask, "this looks like the mask ignored"),
    (ch03.check_scaled_dot_product_attention, sdpa_returns_weights, "this looks like the attention weights returned"),
    (ch03.check_scaled_dot_product_attention, sdpa_k_not_transposed, "raised RuntimeError"),
    (ch03.check_scaled_dot_product_attention, sdpa_k_not_transposed, "(on q (2, 3, 5, 16), k and v (2, 3, 7, 16)"),
    (ch03.check_causal_mask, causal_off_by_one, "this looks like the diagonal hidden too"),
    (ch03.check_causal_mask, causal_top_left, "this looks like the triangle aligned top-left"),
    (ch03.check_causal_mask, causal_swapped, "this looks like the visible and hidden parts swapped"),
    (ch03.check_causal_mask, causal_finite, "this looks like a large finite negative number for the hidden keys"),
    (ch03.check_causal_mask, causal_bool, "dtype mismatch: expected torch.float32, got torch.bool"),
    (ch03.check_causal_mask, causal_ones, "this looks like a 1/0 mask"),
    (ch03.check_causal_mask, causal_no_default, "raised TypeError"),
    (ch03.check_causal_mask, causal_no_default, "kv_len is optional"),
    (ch03.check_repeat_kv, repeat_tiled, "this looks like the heads tiled"),
    (ch03.check_repeat_kv, repeat_on_wrong_axis, "this looks like the sequence axis (dim 1) repeated"),
    (ch03.check_repeat_kv, repeat_last_axis, "this looks like the last axis (head_dim) repeated"),
    (ch03.check_repeat_kv, repeat_identity, "this looks like the input returned unchanged"),
    (ch03.check_gqa_attention, make_gqa(scale=False), "this looks like no scaling of the scores by the square root of head_dim"),
    (ch03.check_gqa_attention, make_gqa(repeat=repeat_tiled), "this looks like the KV heads tiled"),
    (ch03.check_gqa_attention, make_gqa(pad_value=float("-inf")), "this looks like padding added as -inf"),
    (ch03.check_gqa_attention, make_gqa(pad_value=float("-inf")), "NaN"),
    (ch03.check_gqa_attention, make_gqa(pad_value=0.0), "this looks like the padding mask ignored"),
    # issue 44: -1e10 passed while every padding query's scores stayed below 32 in magnitude
    (ch03.check_gqa_attention, make_gqa(pad_value=-1e10), "this looks like a padding constant larger in magnitude"),
    (ch03.check_gqa_attention, make_gqa(pad_value=-1e8), "this looks like a padding constant smaller in magnitude"),
    (ch03.check_gqa_attention, make_gqa(pad_value=torch.finfo(torch.float32).min),
     "this looks like a padding constant larger in magnitude"),
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


def test_large_activation_case_keeps_its_scores_away_from_rounding_boundaries():
    """The padding case with large activations: some padding query scores a padding key above 32 in magnitude
    (so -1e10 and -1e9 give other weights), and every such score lies more than 3 from an odd multiple of 32,
    where -1e9 + score would round the other way after float noise of another CPU."""
    import math

    from minimind_ref.rope import apply_rotary_pos_emb, precompute_freqs_cis
    from minimind_ref.checks.core import seeded

    attn = ch03._small_attention(2, seed=3052)
    b, s = 2, 6
    cos, sin = (t[:s] for t in precompute_freqs_cis(16, 32))
    x = torch.randn(b, s, 64, generator=seeded(3070)) * 8
    with torch.no_grad():
        q = attn.q_proj(x).view(b, s, 4, 16)
        k = attn.k_proj(x).view(b, s, 2, 16)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        scores = q.transpose(1, 2) @ repeat_kv_own(k, 2).transpose(1, 2).transpose(-2, -1) / math.sqrt(16)
    pad_scores = torch.cat([scores[row, :, i, : i + 1].flatten() for row, pads in ((0, 4), (1, 2)) for i in range(pads)])
    assert (pad_scores.abs() > 32).any()
    distance = (pad_scores.abs() - 32) % 64
    assert torch.minimum(distance, 64 - distance).min() > 3


def test_overflow_message_names_the_fix():
    with pytest.raises(AssertionError, match="max"):
        ch03.check_stable_softmax(naive_softmax)


def test_padding_with_minus_inf_is_reported_as_nan():
    with pytest.raises(AssertionError, match="NaN"):
        ch03.check_gqa_attention(make_gqa(pad_value=float("-inf")))


# ------------------------------------------------------------------ 3.6 QK-norm in the attention forward
from torch import nn  # noqa: E402

from minimind_ref import RMSNorm  # noqa: E402


class _PerHeadNorm(nn.Module):
    """RMSNorm over head_dim with one gain per head (the planted mistake: a [heads, head_dim] weight)."""

    def __init__(self, heads, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(heads, dim))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def make_qk_attention(*, where="before", axis="head_dim", norm_q=True, norm_k=True, swap=False, gain="shared",
                      module=None):
    """A from-scratch QK-norm attention class; the keyword arguments switch in one typical mistake each.

    where: "before" / "after" RoPE / "none"; axis: "head_dim", "heads" (dim 2), "hidden" (all heads of a token
    together, with a [hidden] gain); gain: "shared" (one [head_dim] gain), "per_head", "none" (no gain);
    module: "layernorm" for nn.LayerNorm(head_dim)."""

    class QKNormAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.n_heads, self.n_kv_heads = config.num_attention_heads, config.num_key_value_heads
            self.n_rep, self.head_dim = self.n_heads // self.n_kv_heads, config.head_dim
            h, d, eps = config.hidden_size, config.head_dim, config.rms_norm_eps
            self.q_proj = nn.Linear(h, self.n_heads * d, bias=False)
            self.k_proj = nn.Linear(h, self.n_kv_heads * d, bias=False)
            self.v_proj = nn.Linear(h, self.n_kv_heads * d, bias=False)
            self.o_proj = nn.Linear(self.n_heads * d, h, bias=False)
            if module == "layernorm":
                self.q_norm, self.k_norm = nn.LayerNorm(d, eps=eps), nn.LayerNorm(d, eps=eps)
            elif gain == "per_head":
                self.q_norm, self.k_norm = _PerHeadNorm(self.n_heads, d, eps), _PerHeadNorm(self.n_kv_heads, d, eps)
            elif gain == "none":
                self.q_norm = nn.RMSNorm(d, eps=eps, elementwise_affine=False)
                self.k_norm = nn.RMSNorm(d, eps=eps, elementwise_affine=False)
            elif axis == "hidden_gain":
                self.q_norm, self.k_norm = RMSNorm(h, eps=eps), RMSNorm(h, eps=eps)
            else:
                self.q_norm, self.k_norm = RMSNorm(d, eps=eps), RMSNorm(d, eps=eps)

        def _norm(self, norm, x):
            if axis == "heads":
                return norm.weight * (x * torch.rsqrt(x.pow(2).mean(-2, keepdim=True) + norm.eps))
            if axis == "hidden":
                flat = x.flatten(-2)
                return norm.weight * (flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + norm.eps)).view_as(x)
            return norm(x)

        def normalize(self, q, k):
            qn, kn = (self.k_norm, self.q_norm) if swap else (self.q_norm, self.k_norm)
            return (self._norm(qn, q) if norm_q else q), (self._norm(kn, k) if norm_k else k)

        def forward(self, x, cos, sin, attention_mask=None, past_key_value=None):
            b, s, _ = x.shape
            q = self.q_proj(x).view(b, s, self.n_heads, self.head_dim)
            k = self.k_proj(x).view(b, s, self.n_kv_heads, self.head_dim)
            v = self.v_proj(x).view(b, s, self.n_kv_heads, self.head_dim)
            if where == "before":
                q, k = self.normalize(q, k)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            if where == "after":
                q, k = self.normalize(q, k)
            if past_key_value is not None:
                k = torch.cat([past_key_value[0], k], dim=1)
                v = torch.cat([past_key_value[1], v], dim=1)
            t = k.shape[1]
            mask = causal_ref(s, t)
            if attention_mask is not None:
                mask = mask + (1.0 - attention_mask[:, None, None, :]) * -1e9
            out = sdpa_ref(q.transpose(1, 2), repeat_kv_own(k, self.n_rep).transpose(1, 2),
                           repeat_kv_own(v, self.n_rep).transpose(1, 2), mask)
            return self.o_proj(out.transpose(1, 2).reshape(b, s, -1)), (k, v)

    return QKNormAttention


class _QKNormAttentionHidden(make_qk_attention()):
    """The planted mistake "a norm over the hidden vector": RMSNorm(hidden_size) on q_proj(x) before the view."""

    def __init__(self, config):
        super().__init__(config)
        self.q_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.k_norm = RMSNorm(config.num_key_value_heads * config.head_dim, eps=config.rms_norm_eps)


def _ref_bound(q, k):
    return math.sqrt(q.shape[0]) * q.abs().max().item() * k.abs().max().item()


def test_qk_references_pass(capsys):
    from minimind_ref.attention import qk_logit_bound
    ch03.check_qk_norm_attention(make_qk_attention())
    ch03.check_qk_logit_bound(_ref_bound)
    ch03.check_qk_logit_bound(lambda q, k: float(q.shape[0] ** 0.5 * q.abs().max() * k.abs().max()))
    out = capsys.readouterr().out
    assert out.count("✓") == 3, out
    text = str(pytest.raises(AssertionError, ch03.check_qk_logit_bound, qk_logit_bound).value)
    assert "without minimind_ref.attention.qk_logit_bound" in text, text
    text = str(pytest.raises(AssertionError, ch03.check_qk_logit_bound,
                             lambda q, k: q.shape[0] ** 0.5 * q.abs().max() * k.abs().max()).value)  # a 0-d tensor
    assert "expected a Python float, got a tensor" in text, text


@pytest.mark.parametrize("check", [ch03.check_qk_norm_attention, ch03.check_qk_logit_bound])
def test_qk_stubs_fail(check):
    with pytest.raises(AssertionError, match="not implemented"):
        check(stub)


class _StubInit(nn.Module):
    def __init__(self, config):
        raise NotImplementedError("Exercise 3.6: create the two norms")


QK_WRONG = [
    (make_qk_attention(where="after"), "this looks like the norms applied after RoPE"),
    (make_qk_attention(where="none"), "this looks like no QK-norm at all"),
    (make_qk_attention(norm_k=False), "this looks like only the queries normalized"),
    (make_qk_attention(norm_q=False), "this looks like only the keys normalized"),
    (make_qk_attention(swap=True), "this looks like q_norm and k_norm swapped"),
    (make_qk_attention(axis="heads"), "this looks like the RMS taken over the heads axis"),
    (make_qk_attention(axis="hidden"), "this looks like the RMS taken over all heads of a token together"),
    (_QKNormAttentionHidden, "this looks like a norm over the hidden size"),
    (make_qk_attention(gain="per_head"), "this looks like one gain per head"),
    (make_qk_attention(gain="none"), "this looks like q_norm without a learned gain"),
    (make_qk_attention(module="layernorm"), "this looks like LayerNorm instead of RMSNorm"),
    (_StubInit, "not implemented"),
]


@pytest.mark.parametrize("wrong, message", QK_WRONG, ids=[m[:40] for _, m in QK_WRONG])
def test_qk_norm_mistakes_are_named(wrong, message):
    with pytest.raises(AssertionError) as err:
        ch03.check_qk_norm_attention(wrong)
    text = str(err.value)
    assert message in text, text
    if "not implemented" not in message:
        assert text.startswith("[Exercise 3.6") and "hint:" in text


BOUND_WRONG = [
    (lambda q, k: q.shape[0] * q.abs().max().item() * k.abs().max().item(), "attention's division of the logits forgotten"),
    (lambda q, k: q.abs().max().item() * k.abs().max().item(), "this looks like the length of a normalized head vector taken as 1"),
    (lambda q, k: q.abs().max().item() * k.abs().max().item() / q.shape[0] ** 0.5, "taken as 1, and attention's division applied on top"),
    (lambda q, k: q.shape[0] ** 0.5, "this looks like the gains left out"),
    (lambda q, k: q.shape[0] ** 0.5 * (q * k).abs().max().item(), "the two gains multiplied coordinate by coordinate"),
    (lambda q, k: q.norm().item() * k.norm().item() / q.shape[0] ** 0.5, "the lengths (L2 norms) of the gain vectors used"),
    (lambda q, k: q.shape[0] ** 0.5 * q.abs().mean().item() * k.abs().mean().item(), "the mean size of the gains used"),
    (lambda q, k: q.shape[0] ** 0.5 * q.max().item() * k.max().item(), "without their absolute values"),
    (lambda q, k: [1.0], "expected a number (the bound), got list"),
]


@pytest.mark.parametrize("wrong, message", BOUND_WRONG, ids=[m[:40] for _, m in BOUND_WRONG])
def test_bound_mistakes_are_named(wrong, message):
    with pytest.raises(AssertionError) as err:
        ch03.check_qk_logit_bound(wrong)
    text = str(err.value)
    assert message in text, text
    assert text.startswith("[Exercise 3.7") and "hint:" in text


def test_qk_logit_bound_is_reached_and_never_exceeded():
    """minimind_ref.attention.qk_logit_bound: no input and positions exceed it, and inputs that put a whole
    head vector on the coordinates of the largest gains come within 1e-3 of it (the check's claim)."""
    from minimind_ref.attention import qk_logit_bound
    from minimind_ref.norm import RMSNorm as Norm

    d = 16
    g = torch.Generator().manual_seed(0)
    qn, kn = Norm(d, eps=1e-6), Norm(d, eps=1e-6)
    with torch.no_grad():
        qn.weight.copy_(torch.rand(d, generator=g) + 0.1)
        kn.weight.copy_(torch.rand(d, generator=g) + 0.1)
        qn.weight[3], kn.weight[3 + d // 2] = 2.0, -1.5  # the largest gains, in one rotation pair
    bound = qk_logit_bound(qn.weight.detach(), kn.weight.detach())
    cos, sin = precompute_freqs_cis(d, 4096)
    with torch.no_grad():
        x = torch.randn(1, 4096, 1, d, generator=g) * 100
        q, k = apply_rotary_pos_emb(qn(x), kn(x), cos, sin)
        scores = (q[0, :, 0] @ k[0, :, 0].T) / math.sqrt(d)
        assert scores.abs().max() < bound
        e = torch.zeros(1, 4096, 1, d)
        e[..., 3] = 1e3
        f = torch.zeros(1, 4096, 1, d)
        f[..., 3 + d // 2] = 1e3
        q, k = apply_rotary_pos_emb(qn(e), kn(f), cos, sin)
        reached = ((q[0, :, 0] @ k[0, :, 0].T) / math.sqrt(d)).abs().max().item()
    assert bound * (1 - 1e-3) < reached <= bound * (1 + 1e-6)


# ------------------------------------------------------------------ issue 44, second probe: planted mistakes
def softmax_minus_min(x, dim=-1):
    e = torch.exp(x - x.min(dim, keepdim=True).values)
    return e / e.sum(dim, keepdim=True)


def softmax_minus_mean(x, dim=-1):
    e = torch.exp(x - x.mean(dim, keepdim=True))
    return e / e.sum(dim, keepdim=True)


def softmax_max_last_axis(x, dim=-1):
    e = torch.exp(x - x.max(-1, keepdim=True).values)
    return e / e.sum(dim, keepdim=True)


def softmax_upcast_kept(x, dim=-1):
    return softmax_ref(x.float(), dim)


def softmax_float64(x, dim=-1):
    return softmax_ref(x.double(), dim)


SOFTMAX_PROBE = [
    (softmax_minus_min, "this looks like each row's minimum subtracted"),
    (softmax_minus_mean, "this looks like each row's mean subtracted"),
    (softmax_max_last_axis, "this looks like the constant taken along the last dimension whatever dim is"),
    (softmax_upcast_kept, "dtype mismatch: expected torch.float16, got torch.float32"),
    (softmax_upcast_kept, "the result keeps x's dtype"),
    (softmax_float64, "dtype mismatch: expected torch.float32, got torch.float64"),
    (softmax_float64, "the result keeps x's dtype"),
    (lambda x, dim=-1: torch.softmax(x, dim), "Exercise 3.1 asks you to build this without torch.softmax"),
    (lambda x, dim=-1: torch.nn.functional.softmax(x, dim=dim), "without torch.softmax"),
    (lambda x, dim=-1: x.softmax(dim), "without torch.softmax"),
    (lambda x, dim=-1: torch.log_softmax(x, dim).exp(), "without torch.log_softmax"),
]


@pytest.mark.parametrize("fn, message", SOFTMAX_PROBE, ids=[m[:40] for _, m in SOFTMAX_PROBE])
def test_softmax_names_the_probes_mistakes(fn, message):
    text = str(pytest.raises(AssertionError, ch03.check_stable_softmax, fn).value)
    assert message in text, text


@pytest.mark.parametrize("fn", [naive_softmax, softmax_minus_min, softmax_minus_mean, softmax_max_last_axis,
                                lambda x, dim=-1: softmax_ref(x, dim) * 1.01])
def test_softmax_hints_never_name_the_constant(fn):
    text = str(pytest.raises(AssertionError, ch03.check_stable_softmax, fn).value)
    assert "exactly 0" not in text and "the max" not in text and "maximum of each row" not in text, text


def test_softmax_accepts_logsumexp_and_an_upcast_cast_back():
    ch03.check_stable_softmax(lambda x, dim=-1: torch.exp(x - torch.logsumexp(x, dim, keepdim=True)))
    ch03.check_stable_softmax(lambda x, dim=-1: softmax_ref(x.float(), dim).to(x.dtype))


def sdpa_draft(q, k, v, mask=None):  # the notebook's draft, unchanged
    scores = q @ k.T
    if mask is not None:
        scores = scores + mask
    return softmax_ref(scores / math.sqrt(q.shape[-2]), dim=-1) @ v


def sdpa_draft_transpose_fixed(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores + mask
    return softmax_ref(scores / math.sqrt(q.shape[-2]), dim=-1) @ v


def sdpa_mask_before_scaling(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores + mask
    return softmax_ref(scores / math.sqrt(q.shape[-1]), dim=-1) @ v


def sdpa_scaled_by_keys(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(k.shape[-2])
    return softmax_ref(scores + (0 if mask is None else mask), dim=-1) @ v


SDPA_PROBE = [
    (sdpa_draft, "raised RuntimeError"),
    (sdpa_draft_transpose_fixed, "this looks like scores divided by the square root of the number of queries"),
    (sdpa_mask_before_scaling, "this looks like the mask added before the scaling"),
    (sdpa_mask_before_scaling, "a bias mask [4, 6] of small finite numbers"),
    (sdpa_scaled_by_keys, "this looks like scores divided by the square root of the number of keys"),
    (lambda q, k, v, mask=None: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask),
     "Exercise 3.2 asks you to build this without torch.nn.functional.scaled_dot_product_attention"),
]


@pytest.mark.parametrize("fn, message", SDPA_PROBE, ids=[m[:40] for _, m in SDPA_PROBE])
def test_sdpa_names_the_probes_mistakes(fn, message):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # k.T on a 4-D tensor: PyTorch's deprecation warning
        text = str(pytest.raises(AssertionError, ch03.check_scaled_dot_product_attention, fn).value)
    assert message in text, text


CAUSAL_PROBE = [
    (lambda q, kv=None: torch.full((q, q if kv is None else kv), -1e9).triu((q if kv is None else kv) - q + 1),
     "this looks like a large finite negative number for the hidden keys instead of -inf"),
    (lambda q, kv=None: torch.full((q, q if kv is None else kv), float("-inf")).tril((q if kv is None else kv) - q - 1),
     "this looks like the future visible and the past hidden"),
    (lambda q, kv=None: torch.full((q, q if kv is None else kv), float("-inf")).triu(q - (q if kv is None else kv) + 1),
     "this looks like the triangle shifted by the number of cached keys, but towards the wrong side"),
    (lambda q, kv=None: torch.full((q, q if kv is None else kv), float("-inf")).triu(1),
     "this looks like the triangle aligned top-left"),
]


@pytest.mark.parametrize("fn, message", CAUSAL_PROBE, ids=[m[15:55] for _, m in CAUSAL_PROBE])
def test_causal_mask_names_the_probes_mistakes(fn, message):
    text = str(pytest.raises(AssertionError, ch03.check_causal_mask, fn).value)
    assert message in text, text
    assert "its own included" not in text and "are the last q_len" not in text, text


def test_repeat_kv_returns_x_itself_when_nothing_repeats():
    def copies(x, n_rep):
        return repeat_kv_own(x, n_rep).clone()
    text = str(pytest.raises(AssertionError, ch03.check_repeat_kv, copies).value)
    assert "with n_rep == 1 your function returns a new tensor" in text, text
    text = str(pytest.raises(AssertionError, ch03.check_repeat_kv, ref_repeat_kv).value)
    assert "without minimind_ref.repeat_kv" in text, text


def _gqa_edit(old, new):
    """make_gqa's forward with one line of its source changed (the probe's planted mistakes of Exercise 3.5)."""
    def gqa(attn, x, cos, sin, attention_mask=None, past_key_value=None):
        b, s, _ = x.shape
        q = attn.q_proj(x).view(b, s, attn.n_heads, attn.head_dim)
        k = attn.k_proj(x).view(b, s, attn.n_kv_heads, attn.head_dim)
        v = attn.v_proj(x).view(b, s, attn.n_kv_heads, attn.head_dim)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if past_key_value is not None:
            k = torch.cat([past_key_value[0], k], dim=1)
            v = torch.cat([past_key_value[1], v], dim=1)
        mask = causal_ref(s) if old == "square" else causal_ref(s, k.shape[1])
        if attention_mask is not None:
            pad = attention_mask[:, None, :, None] if old == "pad axis" else attention_mask[:, None, None, :]
            mask = mask + (1.0 - pad) * -1e9
        out = sdpa_ref(q.transpose(1, 2), repeat_kv_own(k, attn.n_rep).transpose(1, 2),
                       repeat_kv_own(v, attn.n_rep).transpose(1, 2), mask)
        merged = out.reshape(b, s, -1) if old == "merge" else out.transpose(1, 2).reshape(b, s, -1)
        return (merged if old == "no o_proj" else attn.o_proj(merged)), (k, v)
    return gqa


GQA_PROBE = [
    (_gqa_edit("merge", None), "this looks like the heads merged without undoing the split's transpose"),
    (_gqa_edit("no o_proj", None), "this looks like o_proj left out"),
    (_gqa_edit("pad axis", None), "this looks like the padding mask laid along the queries instead of the keys"),
    (_gqa_edit("square", None), "raised RuntimeError"),
    (_gqa_edit("square", None), "this looks like the causal mask built for the new tokens only"),
    (lambda attn, x, cos, sin, attention_mask=None, past_key_value=None:
     attn(x, (cos, sin), past_key_value, use_cache=True, attention_mask=attention_mask),
     "Exercise 3.5 asks you to build this without minimind_ref.Attention's own forward"),
    (make_gqa(repeat=ref_repeat_kv), "without minimind_ref.repeat_kv"),
]


@pytest.mark.parametrize("fn, message", GQA_PROBE, ids=[m[:40] for _, m in GQA_PROBE])
def test_gqa_names_the_probes_mistakes(fn, message):
    text = str(pytest.raises(AssertionError, ch03.check_gqa_attention, fn).value)
    assert message in text, text


@pytest.mark.parametrize("fn", [make_gqa(rope_k=False), make_gqa(cache_repeated=True), make_gqa(pad_value=0.0),
                                make_gqa(pad_value=float("-inf"))])
def test_gqa_cache_and_padding_hints_never_state_the_decision(fn):
    text = str(pytest.raises(AssertionError, ch03.check_gqa_attention, fn).value)
    assert "after* RoPE" not in text and "*before* repeat_kv" not in text and "finite negative constant" not in text, text


def test_qk_norm_names_the_eps_and_refuses_the_reference():
    class DefaultEps(make_qk_attention()):
        def __init__(self, config):
            super().__init__(config)
            self.q_norm, self.k_norm = RMSNorm(config.head_dim), RMSNorm(config.head_dim)

    class TorchNorm(make_qk_attention()):
        def __init__(self, config):
            super().__init__(config)
            self.q_norm, self.k_norm = nn.RMSNorm(config.head_dim), nn.RMSNorm(config.head_dim)

    class OwnNormDefaultEps(make_qk_attention()):  # a norm without an eps attribute: the tiny case tells
        def __init__(self, config):
            super().__init__(config)
            self.q_norm, self.k_norm = _OwnNorm(config.head_dim), _OwnNorm(config.head_dim)

    from minimind_ref import Attention

    class Subclass(Attention):
        def forward(self, x, cos, sin, attention_mask=None, past_key_value=None):
            return super().forward(x, (cos, sin), past_key_value, use_cache=True, attention_mask=attention_mask)

    for cls, message in [(DefaultEps, "this looks like the norms' eps left at RMSNorm's default, 1e-5"),
                         (TorchNorm, "this looks like torch.nn.RMSNorm's default eps"),
                         (OwnNormDefaultEps, "this looks like the norms' eps left at RMSNorm's default, 1e-5"),
                         (Subclass, "Exercise 3.6 asks you to build this without minimind_ref.Attention's own forward")]:
        text = str(pytest.raises(AssertionError, ch03.check_qk_norm_attention, cls).value)
        assert message in text, (cls.__name__, text)
        assert "cache holds the keys exactly" not in text, text


class _OwnNorm(nn.Module):
    """An RMSNorm of the learner's own, eps fixed at 1e-5 and not kept as an attribute."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))


def test_ch03_names_the_probes_generic_ones():
    def sdpa_transpose_1_2(q, k, v, mask=None):
        return softmax_ref(q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]), dim=-1) @ v

    def sdpa_mask_multiplied(q, k, v, mask=None):
        w = softmax_ref(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        return (w * (mask == 0) if mask is not None else w) @ v

    class NormalizesValues(make_qk_attention()):
        def forward(self, x, cos, sin, attention_mask=None, past_key_value=None):
            from minimind_ref.checks.ch03 import _qk_variant
            return _qk_variant(self, x, cos, sin, attention_mask, past_key_value, norm_v=True)

    for check, fn, message in [
        (ch03.check_scaled_dot_product_attention, sdpa_transpose_1_2, "this looks like the keys transposed on other axes"),
        (ch03.check_scaled_dot_product_attention, sdpa_mask_multiplied,
         "this looks like the mask applied to the weights after the softmax"),
        (ch03.check_qk_norm_attention, NormalizesValues, "this looks like the values normalized too"),
        (ch03.check_qk_logit_bound, lambda q, k: float((q * k).abs().sum() / math.sqrt(q.shape[0])),
         "this looks like the products of the two gains summed coordinate by coordinate"),
        (ch03.check_stable_softmax, lambda x, dim=-1: torch.exp(x - x.max(dim).values), "this looks like the constant "
         "taken without keeping the reduced dimension"),
    ]:
        text = str(pytest.raises(AssertionError, check, fn).value)
        assert message in text, text
