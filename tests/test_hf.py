"""Interop with transformers' Llama (optional extra ``hf``; the test environment installs it)."""

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
