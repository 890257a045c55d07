import math

import pytest
import torch
import torch.nn.functional as F

import minimind_ref as mm

from _helpers import rand_ids, tiny_config, tiny_model


def test_forward_shapes_and_output_fields():
    m = tiny_model()
    ids = rand_ids(2, 9)
    out = m(ids, use_cache=True)
    assert out.logits.shape == (2, 9, 61)
    assert out.hidden_states.shape == (2, 9, 32)
    assert out.loss is None and float(out.aux_loss) == 0.0
    assert len(out.past_key_values) == 2
    k, v = out.past_key_values[0]
    assert k.shape == v.shape == (2, 9, 2, 8)  # [batch, seq, n_kv_heads, head_dim]
    assert out["logits"] is out.logits


def test_logits_to_keep():
    m = tiny_model()
    ids = rand_ids(2, 9)
    full = m(ids).logits
    torch.testing.assert_close(m(ids, logits_to_keep=1).logits, full[:, -1:])
    torch.testing.assert_close(m(ids, logits_to_keep=3).logits, full[:, -3:])


def test_loss_is_shifted_cross_entropy_with_ignore_index():
    m = tiny_model()
    ids = rand_ids(2, 9)
    labels = ids.clone(); labels[0, 4] = -100
    out = m(ids, labels=labels)
    manual = F.cross_entropy(out.logits[:, :-1].reshape(-1, 61), labels[:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, manual)


def test_initial_loss_is_about_ln_vocab():
    torch.manual_seed(0)
    m = mm.MiniMindForCausalLM(tiny_config(vocab_size=512)).eval()
    ids = rand_ids(4, 32, vocab=512)
    loss = m(ids, labels=ids).loss.item()
    assert abs(loss - math.log(512)) < 0.5


def test_tied_weights():
    m = tiny_model()
    assert m.model.embed_tokens.weight is m.lm_head.weight
    with torch.no_grad():
        m.lm_head.weight[3, 0] = 123.0
    assert m.model.embed_tokens.weight[3, 0] == 123.0


@pytest.mark.parametrize("kw", [{}, {"use_moe": True}, {"flash_attn": False}, {"num_key_value_heads": 1}])
def test_cached_decode_equals_full_forward(kw):
    m = tiny_model(**kw)
    ids = rand_ids(3, 12)
    full = m(ids).logits
    out = m(ids[:, :5], use_cache=True)
    pieces, past = [out.logits], out.past_key_values
    for t in range(5, 12):
        out = m(ids[:, t : t + 1], past_key_values=past, use_cache=True)
        pieces.append(out.logits); past = out.past_key_values
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=1e-4, atol=1e-5)
    # chunked prefill with a cache (explicit path, causal mask offset)
    out = m(ids[:, :4], use_cache=True)
    out2 = m(ids[:, 4:], past_key_values=out.past_key_values, use_cache=True)
    torch.testing.assert_close(out2.logits, full[:, 4:], rtol=1e-4, atol=1e-5)


def test_left_padding_matches_upstream_semantics():
    # positions come from the cache length, not from the mask: a left-padded row is NOT equal to the
    # unpadded row at shifted positions (upstream behaviour), but padding never leaks NaNs.
    m = tiny_model()
    ids = rand_ids(2, 8)
    mask = torch.ones(2, 8, dtype=torch.long); mask[1, :3] = 0
    out = m(ids, attention_mask=mask).logits
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0], m(ids[:1]).logits[0], rtol=1e-5, atol=1e-5)  # unpadded row unchanged


def test_determinism():
    a = tiny_model(seed=3)(rand_ids(2, 7)).logits
    b = tiny_model(seed=3)(rand_ids(2, 7)).logits
    assert torch.equal(a, b)


def test_gradients_flow_to_every_parameter():
    m = tiny_model().train()
    ids = rand_ids(2, 8)
    m(ids, labels=ids).loss.backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize(
    "make_input, error, fragment",
    [
        (lambda: torch.tensor([[1, 2, 61]]), ValueError, "outside the vocabulary"),
        (lambda: torch.tensor([[-1, 2]]), ValueError, "outside the vocabulary"),
        (lambda: torch.zeros(1, 65, dtype=torch.long), ValueError, "max_position_embeddings=64"),
        (lambda: torch.zeros(1, 4), TypeError, "integer token ids"),
        (lambda: torch.zeros(4, dtype=torch.long), ValueError, r"\[batch, seq_len\]"),
        (lambda: [[1, 2]], TypeError, "torch.Tensor"),
        (lambda: torch.zeros(1, 0, dtype=torch.long), ValueError, "empty"),
    ],
)
def test_bad_inputs_raise_clear_errors(make_input, error, fragment):
    with pytest.raises(error, match=fragment):
        tiny_model()(make_input())


def test_cache_past_position_limit():
    m = tiny_model()
    out = m(torch.zeros(1, 64, dtype=torch.long), use_cache=True)
    with pytest.raises(ValueError, match="positions 64..64 exceed"):
        m(torch.zeros(1, 1, dtype=torch.long), past_key_values=out.past_key_values, use_cache=True)


def test_bad_mask_and_cache_lengths():
    m = tiny_model()
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        m(rand_ids(2, 5), attention_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="past_key_values has 1 entries"):
        m(rand_ids(1, 2), past_key_values=[None])
    with pytest.raises(ValueError, match="labels must have the shape"):
        m(rand_ids(1, 5), labels=rand_ids(1, 4))


def test_state_dict_keys_are_upstreams():
    m = mm.MiniMindForCausalLM(tiny_config(use_moe=True, n_shared_experts=1))
    keys = set(m.state_dict())
    for k in [
        "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
        "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
        "model.layers.1.mlp.gate.weight", "model.layers.1.mlp.experts.3.gate_proj.weight",
        "model.layers.1.mlp.experts.0.up_proj.weight", "model.layers.1.mlp.experts.0.down_proj.weight",
        "model.layers.1.mlp.shared_experts.0.down_proj.weight",
    ]:
        assert k in keys, k
    assert not any("freqs" in k for k in keys)  # RoPE tables are non-persistent buffers


def test_bf16_forward_runs():
    m = tiny_model().to(torch.bfloat16)
    out = m(rand_ids(1, 6)).logits
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
