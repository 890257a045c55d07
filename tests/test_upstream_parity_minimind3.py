"""Parity with upstream minimind-3 (d65ef2c), as ``test_upstream_parity.py`` is with MiniMind2 (c090b69).

``tests/data/upstream_reference_minimind3.pt`` holds weights, inputs and outputs of upstream's own
``model/model_minimind.py`` at d65ef2c (its model code is that of 393e387; transformers 4.57.6,
torch 2.13.0, CPU, fp32), made by ``tools/upstream_fixtures.py`` from a checkout of upstream, for
seven small configurations given in upstream's own keyword names: dense (two head layouts), a free
``head_dim`` with untied embeddings and no SDPA, YaRN, and MoE (top-1 with a large router loss,
top-2 unnormalized over 5 narrower experts, and the default coefficient). Each case's weights are
random, norm gains included. We build ``MiniMindConfig(generation="minimind-3", **upstream_kwargs)``,
load the weights with ``strict=True`` and compare every output at 1e-5.
"""

from pathlib import Path

import pytest
import torch

import minimind_ref as mm

FIXTURE = torch.load(Path(__file__).parent / "data" / "upstream_reference_minimind3.pt", weights_only=True)
CASES = sorted(FIXTURE["cases"])
MOE_CASES = [name for name in CASES if FIXTURE["cases"][name]["config"].get("use_moe")]
TOL = dict(rtol=1e-5, atol=1e-5)


def _load(case) -> mm.MiniMindForCausalLM:
    model = mm.MiniMindForCausalLM(mm.MiniMindConfig(generation="minimind-3", **case["config"]))
    model.load_state_dict(case["state_dict"], strict=True)
    return model


def test_fixture_covers_the_switches():
    """The cases exercise what differs from MiniMind2 (otherwise the parity below proves less)."""
    configs = [FIXTURE["cases"][n]["config"] for n in CASES]
    assert any(c.get("head_dim") for c in configs) and any(c.get("tie_word_embeddings") is False for c in configs)
    assert {c.get("num_experts_per_tok", 1) for c in configs if c.get("use_moe")} == {1, 2}
    assert any(c.get("norm_topk_prob") is False for c in configs) and any(c.get("inference_rope_scaling") for c in configs)
    for name in CASES:
        keys = FIXTURE["cases"][name]["state_dict"]
        assert "model.layers.0.self_attn.q_norm.weight" in keys and not any("shared_experts" in k for k in keys)


@pytest.mark.parametrize("name", CASES)
def test_eval_outputs_match_upstream(name):
    case = FIXTURE["cases"][name]
    m = _load(case).eval()
    ids, mask = case["input_ids"], case["attention_mask"]
    with torch.no_grad():
        out = m(ids, labels=ids)
        torch.testing.assert_close(out.logits, case["logits"], **TOL)
        torch.testing.assert_close(out.loss, case["eval_loss"], **TOL)
        torch.testing.assert_close(out.aux_loss.reshape(()), case["eval_aux_loss"].reshape(()), **TOL)
        torch.testing.assert_close(m(ids, attention_mask=mask).logits, case["logits_padded"], **TOL)
        torch.testing.assert_close(m(ids, logits_to_keep=3).logits, case["logits_keep3"], **TOL)
        torch.testing.assert_close(m(ids, logits_to_keep=torch.tensor([0, 5, 11])).logits,
                                   case["logits_keep_positions"], **TOL)
        out = m(ids[:, :7], use_cache=True)
        pieces, past = [out.logits], out.past_key_values
        for t in range(7, ids.shape[1]):
            out = m(ids[:, t : t + 1], past_key_values=past, use_cache=True)
            pieces.append(out.logits)
            past = out.past_key_values
        torch.testing.assert_close(torch.cat(pieces, 1), case["logits_cached"], **TOL)
        torch.testing.assert_close(past[0][0], case["cache_k0"], **TOL)
        torch.testing.assert_close(past[-1][1], case["cache_v1"], **TOL)
        out = m(ids[:, :7], attention_mask=mask[:, :7], use_cache=True)
        out = m(ids[:, 7:], attention_mask=mask, past_key_values=out.past_key_values, use_cache=True)
        torch.testing.assert_close(out.logits, case["logits_padded_chunk"], **TOL)


@pytest.mark.parametrize("name", CASES)
def test_training_outputs_and_gradients_match_upstream(name):
    """Training mode with a padded batch: logits, loss, aux_loss and the gradients of loss + aux_loss."""
    case = FIXTURE["cases"][name]
    m = _load(case).train()
    ids, mask = case["input_ids"], case["attention_mask"]
    out = m(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
    torch.testing.assert_close(out.logits, case["train_logits"], **TOL)
    torch.testing.assert_close(out.loss, case["loss"], **TOL)
    torch.testing.assert_close(out.aux_loss.reshape(()), case["aux_loss"].reshape(()), **TOL)
    (out.loss + out.aux_loss).backward()
    grads = dict(m.named_parameters())
    assert set(case["grads"]) == {k for k, p in grads.items() if p.grad is not None}
    for pname, expected in case["grads"].items():
        torch.testing.assert_close(grads[pname].grad, expected, **TOL, msg=lambda msg, p=pname: f"{p}: {msg}")


@pytest.mark.parametrize("name", MOE_CASES)
def test_moe_eval_keeps_the_graph_like_upstream(name):
    """minimind-3's MoE runs one dispatch in training and eval, so gradients flow in eval too."""
    case = FIXTURE["cases"][name]
    m = _load(case).eval()
    m(case["input_ids"], labels=case["input_ids"]).loss.backward()
    grads = dict(m.named_parameters())
    for pname, expected in case["eval_grads"].items():
        torch.testing.assert_close(grads[pname].grad, expected, **TOL, msg=lambda msg, p=pname: f"{p}: {msg}")


def test_presets_count_upstreams_parameters():
    """minimind-3 and minimind-3-moe at d65ef2c's defaults: 63,912,192 and 198,416,640 parameters
    (published as 64M and 198M-A64M); one token uses about 64M of the MoE's."""
    assert mm.count_parameters(mm.preset("minimind-3")) == 63_912_192
    moe = mm.preset("minimind-3-moe")
    assert mm.count_parameters(moe) == 198_416_640
    assert round(mm.active_parameters(moe) / 1e6) == 64


def test_minimind3_defaults_are_d65ef2cs():
    c = mm.preset("minimind-3")
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (768, 8, 8, 4, 96)
    assert (c.intermediate_size, c.rms_norm_eps, c.qk_norm, c.tie_word_embeddings) == (2432, 1e-6, True, True)
    m = mm.preset("minimind-3-moe")
    assert (m.num_experts, m.num_experts_per_tok, m.n_shared_experts, m.router_aux_loss_coef, m.norm_topk_prob) == (4, 1, 0, 5e-4, True)
    assert m.expert_intermediate_size == 2432
    over = mm.preset("minimind-3-moe", num_experts_per_tok=2, norm_topk_prob=False, num_experts=8)
    assert (over.num_experts_per_tok, over.norm_topk_prob, over.n_routed_experts) == (2, False, 8)


def test_shipped_example_matches_upstream():
    """The package's own copy of upstream outputs (chapter 05 loads it outside the repository)."""
    from minimind_ref.checkpoint import upstream_reference_outputs

    example = upstream_reference_outputs("upstream_minimind3")
    assert set(example["cases"]) == {"minimind-3", "minimind-3-moe"}
    for name, count in example["parameter_counts"].items():
        assert mm.count_parameters(mm.preset(name)) == count
    for name, case in example["cases"].items():
        cfg = mm.MiniMindConfig(generation="minimind-3", **case["config"])
        assert cfg.num_key_value_heads == 4 and cfg.qk_norm and cfg.use_moe == (name == "minimind-3-moe")
        assert all(v.dtype == torch.float16 for v in case["state_dict"].values())
        model = mm.MiniMindForCausalLM(cfg).eval()
        model.load_state_dict({k: v.float() for k, v in case["state_dict"].items()}, strict=True)
        with torch.no_grad():
            torch.testing.assert_close(model(case["input_ids"]).logits, case["logits"], **TOL)
        # upstream's own greedy generate loop: the same tokens (the penalty changes them, so it is exercised)
        for key, penalty in (("greedy_ids", 1.0), ("greedy_penalty_ids", 1.3)):
            out = mm.generate(model, case["input_ids"], max_new_tokens=8, do_sample=False, repetition_penalty=penalty)
            assert torch.equal(out, case[key]), (name, key)
        assert not torch.equal(case["greedy_ids"], case["greedy_penalty_ids"])


@pytest.mark.parametrize("name", ["nope", "../tests/data/upstream_reference", 3])
def test_shipped_example_bad_name(name):
    from minimind_ref.checkpoint import upstream_reference_outputs

    with pytest.raises(ValueError, match="upstream_minimind3"):
        upstream_reference_outputs(name)
