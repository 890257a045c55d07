import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import minimind_ref as mm
from minimind_ref.rope import rope_frequencies, yarn_ramp


def test_rmsnorm_hand_computed():
    # x = [3, 4]: mean of squares = 12.5, rms = sqrt(12.5) (eps 0): y = x / rms
    n = mm.RMSNorm(2, eps=0.0)
    y = n(torch.tensor([[3.0, 4.0]]))
    torch.testing.assert_close(y, torch.tensor([[3 / math.sqrt(12.5), 4 / math.sqrt(12.5)]]), rtol=1e-6, atol=1e-6)
    n.weight.data = torch.tensor([2.0, -1.0])
    torch.testing.assert_close(n(torch.tensor([[3.0, 4.0]])), torch.tensor([[6 / math.sqrt(12.5), -4 / math.sqrt(12.5)]]))


def test_rmsnorm_equals_torch_rmsnorm():
    torch.manual_seed(0)
    x = torch.randn(4, 7, 48)
    ours = mm.RMSNorm(48, eps=1e-5)
    ours.weight.data.normal_()
    ref = torch.nn.RMSNorm(48, eps=1e-5)
    ref.weight.data.copy_(ours.weight.data)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-6)


def test_rmsnorm_zero_row_and_dtype_rules():
    n = mm.RMSNorm(8)
    assert torch.equal(n(torch.zeros(1, 8)), torch.zeros(1, 8))  # eps keeps it finite
    xb = torch.randn(2, 8).bfloat16()
    assert n(xb).dtype == torch.float32  # bf16 input, fp32 weight -> fp32 (upstream)
    assert n.to(torch.bfloat16)(xb).dtype == torch.bfloat16
    # the fp32 upcast avoids fp16 overflow of x**2 (300**2 > 65504)
    xh = torch.full((1, 8), 300.0, dtype=torch.float16)
    out = mm.RMSNorm(8).half()(xh)
    assert torch.isfinite(out).all() and torch.allclose(out.float(), torch.ones(1, 8), atol=1e-3)


def test_rmsnorm_wrong_width():
    with pytest.raises(ValueError, match="last dimension of 8"):
        mm.RMSNorm(8)(torch.randn(2, 9))


def test_rope_worked_example():
    # dim 4, base 1e4, position 1: freqs = [1, 1e-2]; cos = [cos1, cos.01, cos1, cos.01]
    cos, sin = mm.precompute_freqs_cis(dim=4, end=2, rope_base=1e4)
    assert cos.shape == sin.shape == (2, 4)
    torch.testing.assert_close(cos[1], torch.tensor([math.cos(1), math.cos(0.01), math.cos(1), math.cos(0.01)]))
    torch.testing.assert_close(sin[1], torch.tensor([math.sin(1), math.sin(0.01), math.sin(1), math.sin(0.01)]))
    torch.testing.assert_close(cos[0], torch.ones(4)); torch.testing.assert_close(sin[0], torch.zeros(4))
    # rotating q = [1, 0, 0, 0] at position 1: pair (q0, q2) turns by 1 rad -> [cos1, 0, sin1, 0]
    q = torch.tensor([1.0, 0, 0, 0]).view(1, 1, 1, 4)
    q_rot, _ = mm.apply_rotary_pos_emb(q, q, cos[1:2], sin[1:2])
    torch.testing.assert_close(q_rot.flatten(), torch.tensor([math.cos(1), 0, math.sin(1), 0]))


def test_rotate_half():
    x = torch.tensor([1.0, 2, 3, 4])
    assert torch.equal(mm.rotate_half(x), torch.tensor([-3.0, -4, 1, 2]))


def _rotate(x, pos, base=1e6):
    cos, sin = mm.precompute_freqs_cis(x.shape[-1], end=pos + 1, rope_base=base)
    xr, _ = mm.apply_rotary_pos_emb(x.view(1, 1, 1, -1), x.view(1, 1, 1, -1), cos[pos : pos + 1], sin[pos : pos + 1])
    return xr.flatten()


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 500), n=st.integers(0, 500), shift=st.integers(0, 500), seed=st.integers(0, 10_000))
def test_rope_relative_position_property(m, n, shift, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(16, generator=g, dtype=torch.float64), torch.randn(16, generator=g, dtype=torch.float64)
    a = _rotate(q.float(), m) @ _rotate(k.float(), n)
    b = _rotate(q.float(), m + shift) @ _rotate(k.float(), n + shift)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@settings(max_examples=25, deadline=None)
@given(pos=st.integers(0, 4000), seed=st.integers(0, 10_000))
def test_rope_preserves_norm(pos, seed):
    x = torch.randn(64, generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(_rotate(x, pos).norm(), x.norm(), rtol=1e-5, atol=1e-5)


def test_rope_output_dtype_and_unsqueeze_dim():
    cos, sin = mm.precompute_freqs_cis(8, 5)
    q = torch.randn(2, 5, 3, 8).bfloat16()
    k = torch.randn(2, 5, 1, 8).bfloat16()
    qr, kr = mm.apply_rotary_pos_emb(q, k, cos, sin)
    assert qr.dtype == kr.dtype == torch.bfloat16 and qr.shape == q.shape and kr.shape == k.shape
    # head-first layout [b, h, s, d] with unsqueeze_dim=0 gives the same numbers
    q2, k2 = mm.apply_rotary_pos_emb(q.float().transpose(1, 2), k.float().transpose(1, 2), cos, sin, unsqueeze_dim=0)
    q1, k1 = mm.apply_rotary_pos_emb(q.float(), k.float(), cos, sin)
    torch.testing.assert_close(q2.transpose(1, 2), q1); torch.testing.assert_close(k2.transpose(1, 2), k1)


def test_yarn_only_beyond_original_length():
    yarn = mm.MiniMindConfig(inference_rope_scaling=True).rope_scaling
    plain = mm.precompute_freqs_cis(64, 2048, 1e6)
    scaled_short = mm.precompute_freqs_cis(64, 2048, 1e6, yarn)  # end / orig_max == 1: unchanged
    assert torch.equal(plain[0], scaled_short[0])
    long_plain = mm.precompute_freqs_cis(64, 4096, 1e6)
    long_yarn = mm.precompute_freqs_cis(64, 4096, 1e6, yarn)
    assert not torch.equal(long_plain[0], long_yarn[0])
    ramp = yarn_ramp(64, 1e6, 2048, 32, 1)
    assert ramp[0] == 0 and ramp[-1] == 1 and torch.all(ramp[1:] >= ramp[:-1])
    # fast dimensions keep their frequency, slow ones are divided by the factor 16
    f = rope_frequencies(64, 1e6)
    scaled = f * (1 - ramp + ramp / 16)
    assert scaled[0] == f[0] and torch.isclose(scaled[-1], f[-1] / 16)


def test_yarn_attention_factor_scales_cos_and_sin():
    s = {"factor": 4, "original_max_position_embeddings": 16, "beta_fast": 32, "beta_slow": 1, "attention_factor": 1.5}
    c1, s1 = mm.precompute_freqs_cis(8, 64, 1e4, dict(s, attention_factor=1.0))
    c2, s2 = mm.precompute_freqs_cis(8, 64, 1e4, s)
    torch.testing.assert_close(c2, 1.5 * c1); torch.testing.assert_close(s2, 1.5 * s1)


def test_rope_odd_dim_rejected():
    with pytest.raises(ValueError, match="even"):
        mm.precompute_freqs_cis(7, 4)
