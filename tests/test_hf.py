"""Interop with transformers (optional extra ``hf``; the test environment installs it): MiniMind2 <->
``LlamaForCausalLM``, minimind-3 <-> ``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM``. Same weights give
the same logits within ``rtol = atol = 1e-5`` in fp32 (float rounding of differently ordered sums)."""

import pytest
import torch

import minimind_ref as mm

transformers = pytest.importorskip("transformers")
from minimind_ref.hf import from_hf_llama, to_hf_llama  # noqa: E402

from _helpers import rand_ids, tiny_model  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw", [{}, {"num_key_value_heads": 4}, {"num_key_value_heads": 1}])
def test_same_logits_fp32(kw):
    m = tiny_model(**kw)
    hf = to_hf_llama(m)
    assert isinstance(hf, transformers.LlamaForCausalLM)
    assert hf.model.embed_tokens.weight.data_ptr() == hf.lm_head.weight.data_ptr()  # tied
    ids = rand_ids(2, 11)
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, m(ids).logits, **TOL)


def test_same_greedy_generation():
    m = tiny_model()
    hf = to_hf_llama(m)
    ids = rand_ids(2, 5)
    ours = m.generate(ids, max_new_tokens=12)
    theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                         min_new_tokens=12, pad_token_id=0, eos_token_id=None)
    assert torch.equal(ours, theirs)


def test_round_trip():
    m = tiny_model()
    back = from_hf_llama(to_hf_llama(m), max_position_embeddings=64)
    assert back.config == m.config
    for (k1, v1), (k2, v2) in zip(m.state_dict().items(), back.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2)


def test_unconvertible_models_raise():
    with pytest.raises(ValueError, match="MoE"):
        to_hf_llama(tiny_model(use_moe=True))
    with pytest.raises(ValueError, match="YaRN"):
        to_hf_llama(mm.MiniMindForCausalLM(mm.MiniMindConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                                             vocab_size=61, inference_rope_scaling=True,
                                                             max_position_embeddings=4096)))
    hf = to_hf_llama(tiny_model())
    hf.config.tie_word_embeddings = False
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        from_hf_llama(hf)


# ---------------------------------------------------------------------- minimind-3 <-> Qwen3 / Qwen3-MoE
from minimind_ref.hf import from_hf, rope_is_scaled, rope_theta_of, to_hf, to_hf_qwen3_config  # noqa: E402


def minimind3(seed: int = 0, **overrides) -> mm.MiniMindForCausalLM:
    """A small minimind-3 (8 query heads : 4 KV heads, QK-norm) with random norm gains (ones would hide a
    misplaced or missing q_norm/k_norm)."""
    base = dict(generation="minimind-3", hidden_size=64, num_hidden_layers=2, vocab_size=61, max_position_embeddings=64)
    base.update(overrides)
    torch.manual_seed(seed)
    model = mm.MiniMindForCausalLM(mm.MiniMindConfig(**base)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


MINIMIND3_CASES = {
    "dense": {},
    "free head_dim, untied": dict(head_dim=12, tie_word_embeddings=False),
    "MQA": dict(num_key_value_heads=1),
    "MoE top-1 (minimind-3-moe)": dict(use_moe=True, moe_intermediate_size=48),
    "MoE top-2, normalized": dict(use_moe=True, num_experts_per_tok=2, num_experts=5),
    "MoE top-2, unnormalized": dict(use_moe=True, num_experts_per_tok=2, norm_topk_prob=False),
}


@pytest.mark.parametrize("name", list(MINIMIND3_CASES))
def test_minimind3_same_logits_as_qwen3_fp32(name):
    m = minimind3(**MINIMIND3_CASES[name])
    hf = to_hf(m)
    expected = transformers.Qwen3MoeForCausalLM if m.config.use_moe else transformers.Qwen3ForCausalLM
    assert type(hf) is expected
    tied = hf.model.embed_tokens.weight.data_ptr() == hf.lm_head.weight.data_ptr()
    assert tied == m.config.tie_word_embeddings
    ids = rand_ids(3, 13)
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, m(ids).logits, **TOL)
        mask = torch.ones_like(ids)
        mask[0, :4] = 0  # left padding: both mask the padded keys (additive -1e9 here, -inf/min there)
        torch.testing.assert_close(hf(ids, attention_mask=mask).logits[:, 4:], m(ids, attention_mask=mask).logits[:, 4:],
                                   **TOL)


@pytest.mark.parametrize("name", list(MINIMIND3_CASES))
def test_minimind3_round_trip(name):
    m = minimind3(**MINIMIND3_CASES[name])
    back = from_hf(to_hf(m))
    assert back.config == m.config
    assert list(back.state_dict()) == list(m.state_dict())
    for (k1, v1), (k2, v2) in zip(m.state_dict().items(), back.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2), k1


def test_minimind3_same_greedy_generation():
    m = minimind3()
    hf = to_hf(m)
    ids = rand_ids(2, 5)
    ours = m.generate(ids, max_new_tokens=12)
    theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                         min_new_tokens=12, pad_token_id=0, eos_token_id=None)
    assert torch.equal(ours, theirs)


def test_qwen3_config_mapping():
    """Each minimind-3 field lands in the Qwen3 field of the same meaning (the table in minimind_ref.hf)."""
    c = mm.preset("minimind-3-moe", head_dim=80, tie_word_embeddings=False, num_experts_per_tok=2,
                  norm_topk_prob=False, moe_intermediate_size=1024)
    q = to_hf_qwen3_config(c)
    assert isinstance(q, transformers.Qwen3MoeConfig)
    assert (q.head_dim, q.num_attention_heads, q.num_key_value_heads, q.rms_norm_eps) == (80, 8, 4, 1e-6)
    raw = q.to_dict()  # RoPE: rope_theta + rope_scaling=None (transformers 4), rope_parameters (5)
    assert (q.tie_word_embeddings, rope_theta_of(raw), rope_is_scaled(raw), q.attention_bias) == (False, 1e6, False, False)
    assert raw.get("rope_scaling") is None and raw.get("rope_parameters", {}).get("rope_type", "default") == "default"
    assert (q.num_experts, q.num_experts_per_tok, q.norm_topk_prob, q.moe_intermediate_size) == (4, 2, False, 1024)
    assert (q.router_aux_loss_coef, q.decoder_sparse_step, q.mlp_only_layers) == (5e-4, 1, [])
    assert not q.use_sliding_window and q.sliding_window is None
    assert getattr(q, "layer_types", None) in (None, ["full_attention"] * 8)
    dense = to_hf_qwen3_config(mm.preset("minimind-3"))
    assert isinstance(dense, transformers.Qwen3Config) and not isinstance(dense, transformers.Qwen3MoeConfig)
    assert dense.layer_types == ["full_attention"] * 8  # Qwen3 can slide a window over layers; not here
    assert (dense.head_dim, dense.intermediate_size, dense.tie_word_embeddings) == (96, 2432, True)


def test_qwen3_attention_is_minimind3s():
    """Qwen3's q_norm/k_norm act over head_dim right after the projection and before RoPE, as minimind-3's:
    a model whose only non-trivial weights are the QK-norm gains tells a different placement apart."""
    m = minimind3()
    hf = to_hf(m)
    attention = hf.model.layers[0].self_attn
    assert attention.q_norm.weight.shape == (m.config.head_dim,) and attention.sliding_window is None
    assert attention.scaling == m.config.head_dim ** -0.5
    with torch.no_grad():
        m.model.layers[0].self_attn.q_norm.weight.mul_(3.0)
    hf = to_hf(m)
    ids = rand_ids(1, 9)
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, m(ids).logits, **TOL)


def test_what_qwen3_cannot_express_is_refused():
    with pytest.raises(ValueError, match="n_shared_experts=1"):
        to_hf(minimind3(use_moe=True, n_shared_experts=1))
    with pytest.raises(ValueError, match="moe_variant='MiniMind2'"):
        to_hf(minimind3(use_moe=True, moe_variant="MiniMind2"))
    with pytest.raises(ValueError, match="YaRN"):
        to_hf(minimind3(inference_rope_scaling=True, max_position_embeddings=4096))
    with pytest.raises(ValueError, match="MoE"):  # MiniMind2's MoE: neither Llama nor Qwen3-MoE
        to_hf(tiny_model(use_moe=True))
    with pytest.raises(ValueError, match="qk_norm=True.*Qwen3ForCausalLM"):
        to_hf_llama(minimind3())
    assert isinstance(to_hf(tiny_model()), transformers.LlamaForCausalLM)  # MiniMind2 dense: the Llama path
    hf = to_hf(minimind3(num_hidden_layers=2))
    hf.config.layer_types = ["full_attention", "sliding_attention"]
    with pytest.raises(ValueError, match="sliding-window"):
        from_hf(hf)
    with pytest.raises(TypeError, match="Qwen3ForCausalLM"):
        from_hf(transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=61)))
