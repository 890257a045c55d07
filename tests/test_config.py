import math
import warnings

import pytest
import torch

import minimind_ref as mm
from minimind_ref.config import default_intermediate_size


def test_defaults_are_upstreams():
    c = mm.MiniMindConfig()
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (512, 8, 8, 2)
    assert (c.vocab_size, c.max_position_embeddings, c.rms_norm_eps, c.rope_theta) == (6400, 32768, 1e-5, 1e6)
    assert c.rope_scaling is None and c.flash_attn and c.hidden_act == "silu" and c.dropout == 0.0
    assert (c.bos_token_id, c.eos_token_id) == (1, 2)
    assert (c.use_moe, c.num_experts_per_tok, c.n_routed_experts, c.n_shared_experts) == (False, 2, 4, 1)
    assert (c.scoring_func, c.aux_loss_alpha, c.seq_aux, c.norm_topk_prob) == ("softmax", 0.01, True, True)
    assert c.head_dim == 64 and c.n_rep == 4


def test_yarn_dict():
    c = mm.MiniMindConfig(inference_rope_scaling=True)
    assert c.rope_scaling == {"beta_fast": 32, "beta_slow": 1, "factor": 16,
                              "original_max_position_embeddings": 2048, "attention_factor": 1.0, "type": "yarn"}


@pytest.mark.parametrize("hidden", [64, 128, 256, 512, 640, 768, 1024, 100])
def test_intermediate_rule(hidden):
    expected = 64 * math.ceil(int(8 * hidden / 3) / 64)
    assert default_intermediate_size(hidden) == expected
    assert mm.MiniMindConfig(hidden_size=hidden, num_attention_heads=2 if hidden == 100 else 8).intermediate_size == expected
    assert expected % 64 == 0 and expected >= int(8 * hidden / 3)


def test_known_widths():
    assert [default_intermediate_size(h) for h in (512, 640, 768)] == [1408, 1728, 2048]


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(hidden_size=500, num_attention_heads=8), "divisible by num_attention_heads"),
        (dict(num_attention_heads=8, num_key_value_heads=3), "divisible by"),
        (dict(hidden_act="swish2"), "unknown hidden_act"),
        (dict(use_moe=True, scoring_func="sigmoid"), "unknown scoring_func"),
        (dict(hidden_size=0), "hidden_size must be a positive integer"),
        (dict(num_hidden_layers=-1), "num_hidden_layers must be a positive integer"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(max_position_embeddings=0), "max_position_embeddings"),
        (dict(intermediate_size=0), "intermediate_size"),
        (dict(use_moe=True, n_routed_experts=0), "n_routed_experts"),
        (dict(use_moe=True, num_experts_per_tok=5, n_routed_experts=4), "cannot exceed"),
        (dict(hidden_size=24, num_attention_heads=8), "must be even"),
        (dict(dropout=1.5), "dropout"),
        (dict(rms_norm_eps=0.0), "rms_norm_eps"),
    ],
)
def test_invalid_configs_raise_clear_errors(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        mm.MiniMindConfig(**kwargs)


def test_kv_heads_none_means_mha():
    c = mm.MiniMindConfig(num_key_value_heads=None)
    assert c.num_key_value_heads == c.num_attention_heads and c.n_rep == 1


def test_unknown_keyword_warns_but_hf_keys_do_not():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mm.MiniMindConfig(architectures=["MiniMindForCausalLM"], torch_dtype="float32", model_type="minimind")
    with pytest.warns(UserWarning, match="hiden_size"):
        mm.MiniMindConfig(hiden_size=3)


def test_roundtrip_and_replace():
    c = mm.minimind2_moe()
    assert mm.MiniMindConfig(**c.to_dict()) == c
    d = c.replace(hidden_size=768)
    assert d.hidden_size == 768 and d.intermediate_size == default_intermediate_size(768) and d.use_moe


@pytest.mark.parametrize("name, total", [("MiniMind2-Small", 25_829_888), ("MiniMind2", 104_030_976), ("MiniMind2-MoE", 145_029_760)])
def test_presets_reproduce_published_sizes(name, total):
    # The published totals are external facts (upstream README / model cards): the code must reproduce them.
    cfg = mm.preset(name)
    assert mm.count_parameters(cfg) == total
    assert sum(mm.parameter_breakdown(cfg).values()) == total


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset"):
        mm.preset("MiniMind3")


def test_active_parameters_moe():
    cfg = mm.minimind2_moe()
    b = mm.parameter_breakdown(cfg)
    active = mm.active_parameters(cfg)
    assert active == mm.count_parameters(cfg) - b["moe_routed_experts"] // 2  # top-2 of 4 experts
    assert mm.active_parameters(mm.minimind2_small()) == mm.count_parameters(mm.minimind2_small())


def test_count_parameters_counts_tied_weights_once():
    torch.manual_seed(0)
    m = mm.MiniMindForCausalLM(mm.MiniMindConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, vocab_size=50))
    assert m.model.embed_tokens.weight is m.lm_head.weight
    naive = sum(p.numel() for _, p in m.named_parameters(remove_duplicate=False))
    assert mm.count_parameters(m) == naive - 50 * 32
    assert "lm_head.weight" in m.state_dict() and "model.embed_tokens.weight" in m.state_dict()
