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


# ---------------------------------------------------------------------- the two generations
def test_generation_picks_the_defaults_of_its_switches():
    """``generation`` sets defaults only: minimind-3's are d65ef2c's, and each switch can be set by hand."""
    m3 = mm.MiniMindConfig(generation="minimind-3")
    assert (m3.hidden_size, m3.num_key_value_heads, m3.rms_norm_eps, m3.qk_norm) == (768, 4, 1e-6, True)
    assert m3.intermediate_size == math.ceil(768 * math.pi / 64) * 64 == 2432
    assert (m3.num_experts_per_tok, m3.n_shared_experts, m3.aux_loss_alpha, m3.seq_aux, m3.moe_variant) == (
        1, 0, 5e-4, False, "minimind-3")
    qk = mm.MiniMindConfig(qk_norm=True)  # MiniMind2 with QK-norm switched on
    assert qk.qk_norm and qk.generation == "MiniMind2" and qk.num_key_value_heads == 2
    assert mm.MiniMindConfig(moe_variant="minimind-3").seq_aux is False  # the variant has no per-sequence loss


def test_upstream_d65ef2c_names_are_accepted():
    c = mm.MiniMindConfig(generation="minimind-3", num_experts=8, router_aux_loss_coef=0.02, use_moe=True)
    assert (c.n_routed_experts, c.num_experts, c.aux_loss_alpha, c.router_aux_loss_coef) == (8, 8, 0.02, 0.02)
    with pytest.raises(ValueError, match="name the same field"):
        mm.MiniMindConfig(num_experts=8, n_routed_experts=4)
    up = mm.preset("minimind-3-moe").to_upstream_dict()
    assert (up["num_experts"], up["router_aux_loss_coef"], up["moe_intermediate_size"], up["head_dim"]) == (4, 5e-4, 2432, 96)
    assert "n_shared_experts" not in up and "n_shared_experts" in mm.preset("MiniMind2-MoE").to_upstream_dict()


def test_head_dim_is_free_in_minimind3_only():
    c = mm.MiniMindConfig(generation="minimind-3", hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    assert c.head_dim == 16
    model = mm.MiniMindForCausalLM(c.replace(vocab_size=32, num_hidden_layers=1))
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (64, 48)
    with pytest.raises(ValueError, match="generation='minimind-3'"):
        mm.MiniMindConfig(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    with pytest.raises(ValueError, match="must be even"):
        mm.MiniMindConfig(generation="minimind-3", head_dim=15)


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(generation="minimind3"), "unknown generation"),
    (dict(moe_variant="qwen"), "unknown moe_variant"),
    (dict(moe_variant="minimind-3", seq_aux=True), "seq_aux=True is MiniMind2's"),
    (dict(moe_intermediate_size=0), "moe_intermediate_size"),
    (dict(generation="minimind-3", use_moe=True, router_aux_loss_coef=-1.0), "router_aux_loss_coef"),
])
def test_invalid_generation_switches(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        mm.MiniMindConfig(**kwargs)
    with pytest.raises(TypeError, match="qk_norm must be True or False"):
        mm.MiniMindConfig(qk_norm="yes")


def test_replace_follows_the_generation():
    m3 = mm.preset("minimind-3")
    assert m3.replace(hidden_size=512).intermediate_size == math.ceil(512 * math.pi / 64) * 64  # pi rule kept
    assert mm.MiniMindConfig(**m3.to_dict()) == m3
    back = m3.replace(generation="MiniMind2")  # switches reset to MiniMind2's, the width follows its rule
    assert (back.qk_norm, back.num_key_value_heads, back.intermediate_size, back.hidden_size) == (
        False, 2, default_intermediate_size(768), 768)
    assert mm.preset("MiniMind2").replace(generation="minimind-3").qk_norm
