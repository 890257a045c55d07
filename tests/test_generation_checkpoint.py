import pytest
import torch

import minimind_ref as mm
from minimind_ref.generation import apply_repetition_penalty, next_token_logits, top_k_filter, top_p_filter

from _helpers import rand_ids, tiny_config, tiny_model


def _greedy_reference(model, ids, n):
    for _ in range(n):
        nxt = model(ids).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
    return ids


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_matches_naive_loop(use_cache):
    m = tiny_model()
    ids = rand_ids(2, 4)
    out = m.generate(ids, max_new_tokens=6, use_cache=use_cache)
    assert torch.equal(out, _greedy_reference(m, ids, 6))


def test_cache_on_off_same_samples():
    m = tiny_model()
    ids = rand_ids(2, 3)
    kw = dict(max_new_tokens=8, do_sample=True, temperature=0.9, top_k=20, top_p=0.9, repetition_penalty=1.2)
    a = m.generate(ids, generator=torch.Generator().manual_seed(5), use_cache=True, **kw)
    b = m.generate(ids, generator=torch.Generator().manual_seed(5), use_cache=False, **kw)
    assert torch.equal(a, b)
    c = m.generate(ids, generator=torch.Generator().manual_seed(5), use_cache=True, **kw)
    assert torch.equal(a, c)  # deterministic with a seeded generator


def test_per_row_eos_and_padding():
    m = tiny_model()
    ids = rand_ids(2, 3)
    free = m.generate(ids, max_new_tokens=6)
    eos = int(free[0, 4])  # the token row 0 emits at its second step
    out = m.generate(ids, max_new_tokens=6, eos_token_id=eos, pad_token_id=0)
    row0 = out[0, 3:].tolist()
    stop = row0.index(eos)
    assert all(t == 0 for t in row0[stop + 1 :])
    if eos not in free[1, 3:].tolist():
        assert torch.equal(out[1], free[1, : out.shape[1]])


def test_callback_streams_every_token():
    m = tiny_model()
    seen = []
    out = m.generate(rand_ids(1, 3), max_new_tokens=5, callback=lambda t: seen.append(int(t[0])))
    assert seen == out[0, 3:].tolist()


def test_left_padding_generation_runs_and_keeps_unpadded_row():
    m = tiny_model()
    ids = rand_ids(2, 6)
    mask = torch.ones(2, 6, dtype=torch.long); mask[1, :2] = 0
    out = m.generate(ids, attention_mask=mask, max_new_tokens=4)
    assert out.shape == (2, 10)
    assert torch.equal(out[0], m.generate(ids[:1], max_new_tokens=4)[0])


def test_top_k_filter():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.5]])
    out = top_k_filter(logits, 2)
    assert torch.isinf(out[0, [0, 3]]).all() and torch.equal(out[0, [1, 2]], logits[0, [1, 2]])
    assert torch.equal(top_k_filter(logits, 0), logits)


def test_top_p_filter_keeps_token_that_crosses_threshold():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = top_p_filter(probs.log(), 0.7)  # 0.5 < 0.7, 0.5 + 0.3 >= 0.7: keep two
    assert torch.isfinite(out[0, :2]).all() and torch.isinf(out[0, 2:]).all()
    out = top_p_filter(probs.log(), 0.1)  # the top token alone
    assert torch.isfinite(out[0, 0]) and torch.isinf(out[0, 1:]).all()
    with pytest.raises(ValueError):
        top_p_filter(probs, 0.0)


def test_repetition_penalty_signs():
    logits = torch.tensor([[2.0, -2.0, 1.0]])
    out = apply_repetition_penalty(logits, torch.tensor([[0, 1]]), 2.0)
    assert torch.equal(out, torch.tensor([[1.0, -4.0, 1.0]]))
    # padding positions (mask 0) do not count
    out = apply_repetition_penalty(logits, torch.tensor([[2, 0, 1]]), 2.0, mask=torch.tensor([[0, 1, 1]]))
    assert torch.equal(out, torch.tensor([[1.0, -4.0, 1.0]]))


def test_temperature_validation():
    with pytest.raises(ValueError, match="temperature"):
        next_token_logits(torch.zeros(1, 3), temperature=0.0)


def test_save_load_roundtrip(tmp_path):
    m = tiny_model(use_moe=True)
    path = tmp_path / "ckpt.pt"
    mm.save_checkpoint(m, path, extra={"step": 7})
    loaded = mm.load_checkpoint(path)
    assert loaded.config == m.config and not loaded.training
    ids = rand_ids(2, 5)
    assert torch.equal(loaded(ids).logits, m(ids).logits)
    assert loaded.model.embed_tokens.weight is loaded.lm_head.weight


def test_load_upstream_style_state_dict_fp16(tmp_path):
    m = tiny_model(num_key_value_heads=1)
    path = tmp_path / "full_sft_32.pth"
    torch.save({k: v.half() for k, v in m.state_dict().items()}, path)  # how upstream saves
    loaded = mm.load_checkpoint(path, num_attention_heads=4, max_position_embeddings=64)
    assert loaded.config.num_key_value_heads == 1 and loaded.config.hidden_size == 32
    assert loaded.config.intermediate_size == 64 and loaded.lm_head.weight.dtype == torch.float32
    ids = rand_ids(1, 5)
    torch.testing.assert_close(loaded(ids).logits, m(ids).logits, rtol=1e-2, atol=1e-2)  # fp16 rounding


def test_infer_config_moe():
    m = tiny_model(use_moe=True, n_routed_experts=3, n_shared_experts=2, num_experts_per_tok=1)
    cfg = mm.infer_config(m.state_dict(), num_attention_heads=4, num_experts_per_tok=1)
    assert (cfg.use_moe, cfg.n_routed_experts, cfg.n_shared_experts) == (True, 3, 2)


def test_mismatched_state_dict_error_lists_keys(tmp_path):
    dense = tiny_model()
    moe = mm.MiniMindForCausalLM(tiny_config(use_moe=True))
    with pytest.raises(ValueError) as err:
        mm.load_state_dict_strict(moe, dense.state_dict())
    msg = str(err.value)
    assert "missing keys" in msg and "unexpected keys" in msg and "use_moe" in msg
    wider = mm.MiniMindForCausalLM(tiny_config(hidden_size=64, intermediate_size=64))
    with pytest.raises(ValueError, match="shape mismatches: model.embed_tokens.weight"):
        mm.load_state_dict_strict(wider, dense.state_dict())


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        mm.load_checkpoint(tmp_path / "nope.pth")
    bad = tmp_path / "bad.pth"
    torch.save({"foo.weight": torch.zeros(2)}, bad)
    with pytest.raises(ValueError, match="not a MiniMind state dict"):
        mm.load_checkpoint(bad)


def test_preallocated_cache_is_the_public_format_and_same_values():
    from minimind_ref.cache import GrowingKV, preallocate

    m = tiny_model()
    ids = rand_ids(2, 9)
    out = m(ids[:, :4], use_cache=True)
    plain, grown = out.past_key_values, preallocate(out.past_key_values, capacity=9)
    for t in range(4, 9):
        o1 = m(ids[:, t : t + 1], past_key_values=plain, use_cache=True)
        o2 = m(ids[:, t : t + 1], past_key_values=grown, use_cache=True)
        assert torch.equal(o1.logits, o2.logits)
        plain, grown = o1.past_key_values, o2.past_key_values
    for (k1, v1), pair in zip(plain, grown):
        assert isinstance(pair, GrowingKV) and isinstance(pair, tuple) and len(pair) == 2
        assert torch.equal(k1, pair[0]) and torch.equal(v1, pair[1]) and pair[0].shape == (2, 9, 2, 8)
    with pytest.raises(ValueError, match="cache is full"):
        m(ids[:, :1], past_key_values=grown, use_cache=True)


def test_generate_with_and_without_preallocation_agree():
    m = tiny_model()
    ids = rand_ids(2, 4)
    assert torch.equal(m.generate(ids, max_new_tokens=7), m.generate(ids, max_new_tokens=7, preallocate_cache=False))


@pytest.mark.parametrize("overrides", [{}, {"head_dim": 12, "tie_word_embeddings": False}, {"use_moe": True}],
                         ids=["minimind-3", "free head_dim, untied", "minimind-3-moe"])
def test_minimind3_generation(overrides):
    """minimind-3 (QK-norm, 8:4 GQA, free head_dim) through the same loop: greedy equals the naive loop with and
    without the cache and the preallocated cache; sampling is the same with and without the cache."""
    torch.manual_seed(0)
    m = mm.MiniMindForCausalLM(mm.MiniMindConfig(generation="minimind-3", hidden_size=32, num_hidden_layers=2,
                                                 vocab_size=61, max_position_embeddings=64, **overrides)).eval()
    ids = rand_ids(2, 4)
    expected = _greedy_reference(m, ids, 6)
    for kw in ({"use_cache": True}, {"use_cache": False}, {"preallocate_cache": False}):
        assert torch.equal(m.generate(ids, max_new_tokens=6, **kw), expected), kw
    kw = dict(max_new_tokens=8, do_sample=True, temperature=0.9, top_k=20, top_p=0.9, repetition_penalty=1.2)
    a = m.generate(ids, generator=torch.Generator().manual_seed(5), use_cache=True, **kw)
    b = m.generate(ids, generator=torch.Generator().manual_seed(5), use_cache=False, **kw)
    assert torch.equal(a, b)
