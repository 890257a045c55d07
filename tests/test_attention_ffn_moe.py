
import pytest
import torch
import torch.nn.functional as F

import minimind_ref as mm
from minimind_ref.moe import global_aux_loss, seq_aux_loss

from _helpers import tiny_config


def _attn(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = tiny_config(**kw)
    return mm.Attention(cfg).eval(), cfg


def _pos(cfg, start, n):
    cos, sin = mm.precompute_freqs_cis(cfg.head_dim, 64, cfg.rope_theta)
    return cos[start : start + n], sin[start : start + n]


def test_repeat_kv_layout():
    x = torch.arange(2 * 3 * 2 * 4, dtype=torch.float32).view(2, 3, 2, 4)
    y = mm.repeat_kv(x, 3)
    assert y.shape == (2, 3, 6, 4)
    for head in range(6):
        assert torch.equal(y[:, :, head], x[:, :, head // 3])
    assert mm.repeat_kv(x, 1) is x


def test_sdpa_and_explicit_paths_agree():
    attn, cfg = _attn()
    x = torch.randn(2, 9, cfg.hidden_size)
    pos = _pos(cfg, 0, 9)
    assert attn.uses_sdpa(9, None, None)
    y_sdpa, _ = attn(x, pos)
    attn.flash = False
    assert not attn.uses_sdpa(9, None, None)
    y_explicit, _ = attn(x, pos)
    torch.testing.assert_close(y_sdpa, y_explicit, rtol=1e-5, atol=1e-6)


def test_path_choice_matches_upstream_rule():
    attn, cfg = _attn()
    ones = torch.ones(2, 5)
    padded = ones.clone(); padded[0, 0] = 0
    cache = (torch.zeros(2, 3, 2, cfg.head_dim), torch.zeros(2, 3, 2, cfg.head_dim))
    assert attn.uses_sdpa(5, None, None) and attn.uses_sdpa(5, None, ones)
    assert not attn.uses_sdpa(1, None, None)  # one new token
    assert not attn.uses_sdpa(5, cache, None)  # chunked prefill with a cache
    assert not attn.uses_sdpa(5, None, padded)  # padding


def test_gqa_with_nrep_1_is_mha():
    attn, cfg = _attn(num_key_value_heads=4)
    assert attn.n_rep == 1
    x = torch.randn(1, 6, cfg.hidden_size)
    pos = _pos(cfg, 0, 6)
    y, _ = attn(x, pos)
    # plain multi-head attention written with PyTorch's SDPA on the same projections
    q = attn.q_proj(x).view(1, 6, 4, cfg.head_dim)
    k = attn.k_proj(x).view(1, 6, 4, cfg.head_dim)
    v = attn.v_proj(x).view(1, 6, 4, cfg.head_dim)
    q, k = mm.apply_rotary_pos_emb(q, k, *pos)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    torch.testing.assert_close(y, attn.o_proj(o.transpose(1, 2).reshape(1, 6, -1)), rtol=1e-5, atol=1e-6)


def test_padding_semantics_all_padding_query_is_finite():
    attn, cfg = _attn()
    x = torch.randn(1, 4, cfg.hidden_size)
    mask = torch.tensor([[0, 0, 1, 1]])
    y, _ = attn(x, _pos(cfg, 0, 4), attention_mask=mask)
    assert torch.isfinite(y).all()  # -1e9, not -inf: no NaN for the query that sees only padding


def test_cache_shapes_and_incremental_equivalence():
    attn, cfg = _attn()
    x = torch.randn(2, 7, cfg.hidden_size)
    full, _ = attn(x, _pos(cfg, 0, 7))
    out, cache = attn(x[:, :4], _pos(cfg, 0, 4), use_cache=True)
    assert cache[0].shape == (2, 4, cfg.num_key_value_heads, cfg.head_dim)
    outs = [out]
    for t in range(4, 7):
        o, cache = attn(x[:, t : t + 1], _pos(cfg, t, 1), past_key_value=cache, use_cache=True)
        outs.append(o)
    assert cache[0].shape[1] == 7
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-5)


def test_feedforward_is_swiglu_and_token_independent():
    torch.manual_seed(0)
    cfg = tiny_config()
    ffn = mm.FeedForward(cfg)
    x = torch.randn(2, 5, cfg.hidden_size)
    expected = ffn.down_proj(F.silu(ffn.gate_proj(x)) * ffn.up_proj(x))
    torch.testing.assert_close(ffn(x), expected)
    x2 = x.clone(); x2[:, 1:] = torch.randn_like(x2[:, 1:])
    torch.testing.assert_close(ffn(x2)[:, 0], ffn(x)[:, 0])


@pytest.mark.parametrize("top_k, seq_aux", [(2, True), (2, False), (1, True), (1, False), (3, True)])
def test_moe_training_path_equals_inference_path(top_k, seq_aux):
    torch.manual_seed(top_k)
    cfg = tiny_config(use_moe=True, num_experts_per_tok=top_k, n_routed_experts=4, seq_aux=seq_aux)
    moe = mm.MOEFeedForward(cfg)
    x = torch.randn(3, 8, cfg.hidden_size)
    moe.train(); y_train = moe(x)
    moe.eval(); y_infer = moe(x)
    torch.testing.assert_close(y_train, y_infer, rtol=1e-5, atol=1e-6)
    assert float(moe.aux_loss) == 0.0  # eval: no auxiliary loss


def test_moe_matches_dense_definition():
    torch.manual_seed(0)
    cfg = tiny_config(use_moe=True, num_experts_per_tok=2, n_routed_experts=4, n_shared_experts=1)
    moe = mm.MOEFeedForward(cfg).eval()
    x = torch.randn(2, 6, cfg.hidden_size)
    flat = x.view(-1, cfg.hidden_size)
    scores = F.linear(flat, moe.gate.weight).softmax(-1)
    w, idx = scores.topk(2, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    expected = torch.stack([
        sum(w[t, j] * moe.experts[int(idx[t, j])](flat[t]) for j in range(2)) + moe.shared_experts[0](flat[t])
        for t in range(flat.shape[0])
    ]).view_as(x)
    torch.testing.assert_close(moe(x), expected, rtol=1e-5, atol=1e-6)


def test_top1_weight_not_renormalized():
    torch.manual_seed(0)
    cfg = tiny_config(use_moe=True, num_experts_per_tok=1)
    gate = mm.MoEGate(cfg)
    x = torch.randn(1, 5, cfg.hidden_size)
    _, w, _ = gate(x)
    assert torch.all(w < 1.0)  # the raw softmax probability, not 1


def test_aux_losses_hand_computed():
    # 1 sequence, 2 tokens, 2 experts, top-1: token0 -> expert0 (p=.75), token1 -> expert0 (p=.6)
    scores = torch.tensor([[0.75, 0.25], [0.6, 0.4]])
    idx = torch.tensor([[0], [0]])
    # f = share * n_experts = [2, 0]; P = mean probs = [0.675, 0.325]; loss = alpha * 2 * 0.675
    torch.testing.assert_close(seq_aux_loss(scores, idx, batch=1, n_experts=2, alpha=0.1), torch.tensor(0.1 * 2 * 0.675))
    torch.testing.assert_close(global_aux_loss(scores, idx, n_experts=2, alpha=0.1), torch.tensor(0.1 * 2 * 0.675))
    # perfectly balanced routing with uniform probabilities gives exactly alpha
    uni = torch.full((4, 4), 0.25)
    torch.testing.assert_close(global_aux_loss(uni, torch.arange(4).view(4, 1), 4, 0.01), torch.tensor(0.01))


def test_seq_and_global_aux_differ_across_sequences():
    # sequence 0 sends everything to expert 0, sequence 1 to expert 1: globally balanced, per sequence not
    scores = torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.1, 0.9], [0.1, 0.9]])
    idx = torch.tensor([[0], [0], [1], [1]])
    s = seq_aux_loss(scores, idx, batch=2, n_experts=2, alpha=1.0)
    g = global_aux_loss(scores, idx, n_experts=2, alpha=1.0)
    torch.testing.assert_close(s, torch.tensor(1.8)); torch.testing.assert_close(g, torch.tensor(1.0))


def test_unused_experts_get_zero_gradients():
    torch.manual_seed(0)
    cfg = tiny_config(use_moe=True, num_experts_per_tok=1, n_routed_experts=4)
    moe = mm.MOEFeedForward(cfg).train()
    with torch.no_grad():  # force every token to expert 0
        moe.gate.weight.zero_(); moe.gate.weight[0] = 5.0
    x = torch.ones(1, 3, cfg.hidden_size)
    moe(x).sum().backward()
    for i in range(1, 4):
        for p in moe.experts[i].parameters():
            assert p.grad is not None and torch.count_nonzero(p.grad) == 0
    assert any(torch.count_nonzero(p.grad) > 0 for p in moe.experts[0].parameters())


def test_moe_inference_has_no_grad_and_one_host_sync(monkeypatch):
    torch.manual_seed(0)
    cfg = tiny_config(use_moe=True)
    moe = mm.MOEFeedForward(cfg).eval()
    calls = []
    real_cpu = torch.Tensor.cpu
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self, *a, **k: calls.append(1) or real_cpu(self, *a, **k))
    y = moe(torch.randn(2, 5, cfg.hidden_size, requires_grad=True))
    assert len(calls) == 1
    # only the shared expert is differentiable in eval; the routed part ran under no_grad
    assert y.requires_grad


@pytest.mark.parametrize("n_kv_heads, flash", [(2, True), (4, False), (1, True)])
def test_attention_maps_reproduce_each_layers_output(n_kv_heads, flash):
    """``attention_maps``: rows sum to 1, nothing above the diagonal, and maps @ V through o_proj
    equals what each layer's attention returned in the forward pass (1e-5)."""
    from minimind_ref.attention import Attention, attention_maps, repeat_kv

    torch.manual_seed(0)
    cfg = mm.MiniMindConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=n_kv_heads,
                            vocab_size=50, max_position_embeddings=64, flash_attn=flash)
    model = mm.MiniMindForCausalLM(cfg).eval()
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    seen = []
    hooks = [m.register_forward_hook(lambda mod, args, out: seen.append((args[0], out[0])))
             for m in model.modules() if isinstance(m, Attention)]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    maps = attention_maps(model, ids)
    assert len(maps) == cfg.num_hidden_layers and maps[0].shape == (2, 4, 9, 9)
    attns = [m for m in model.modules() if isinstance(m, Attention)]
    for p, attn, (x, out) in zip(maps, attns, seen):
        torch.testing.assert_close(p.sum(-1), torch.ones(2, 4, 9), rtol=1e-5, atol=1e-5)
        assert (p.triu(1) == 0).all()
        v = repeat_kv(attn.v_proj(x).view(2, 9, n_kv_heads, 16), attn.n_rep).transpose(1, 2)
        mixed = (p @ v).transpose(1, 2).reshape(2, 9, 64)
        torch.testing.assert_close(attn.o_proj(mixed), out, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------- minimind-3's switches
def test_qk_norm_normalizes_each_head_before_rope():
    """With qk_norm every query/key head has unit RMS (times the gain) before rotation; RoPE keeps
    norms, so the cached keys have RMS = the gain's, whatever the input scale."""
    torch.manual_seed(0)
    cfg = mm.MiniMindConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, qk_norm=True, vocab_size=16)
    attn = mm.Attention(cfg)
    x = 50 * torch.randn(2, 5, 32)
    cos, sin = mm.precompute_freqs_cis(cfg.head_dim, 16, cfg.rope_theta)
    _, (k, _) = attn(x, (cos[:5], sin[:5]), use_cache=True)
    rms = k.pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones_like(rms), rtol=1e-4, atol=1e-4)
    assert set(dict(attn.named_parameters())) >= {"q_norm.weight", "k_norm.weight"}
    assert "q_norm.weight" not in dict(mm.Attention(cfg.replace(qk_norm=False)).named_parameters())


def test_rms_norm_cast_order_of_each_generation():
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    assert mm.RMSNorm(8)(x).dtype == torch.float32  # MiniMind2: fp32 gain after the cast promotes
    assert mm.RMSNorm(8, cast_after_weight=True)(x).dtype == torch.bfloat16  # minimind-3: cast last
    y = torch.randn(4, 8)
    torch.testing.assert_close(mm.RMSNorm(8)(y), mm.RMSNorm(8, cast_after_weight=True)(y), rtol=0, atol=0)


def test_router_aux_loss_is_k_times_the_global_one():
    from minimind_ref.moe import global_aux_loss, router_aux_loss

    g = torch.Generator().manual_seed(0)
    scores = torch.softmax(torch.randn(30, 5, generator=g), -1)
    for k in (1, 2, 3):
        idx = scores.topk(k, dim=-1).indices
        torch.testing.assert_close(router_aux_loss(scores, idx, 5, 0.1), k * global_aux_loss(scores, idx, 5, 0.1),
                                   rtol=1e-6, atol=1e-7)


def test_top1_weight_is_renormalized_in_minimind3_only():
    """MiniMind2 leaves a single top-1 weight as the router probability; minimind-3's norm_topk_prob
    divides it by itself, so the output is the expert's output unscaled."""
    torch.manual_seed(0)
    base = dict(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, intermediate_size=32, use_moe=True,
                num_experts_per_tok=1, n_shared_experts=0)
    x = torch.randn(1, 6, 16)
    for variant, renormalized in (("MiniMind2", False), ("minimind-3", True)):
        moe = mm.MOEFeedForward(mm.MiniMindConfig(moe_variant=variant, **base)).eval()
        with torch.no_grad():
            flat = x.view(-1, 16)
            probs = torch.softmax(flat @ moe.gate.weight.T, -1)
            top = probs.argmax(-1)
            plain = torch.stack([moe.experts[int(e)](flat[i]) for i, e in enumerate(top)])
            weight = torch.ones_like(probs.max(-1).values) if renormalized else probs.max(-1).values
            torch.testing.assert_close(moe(x).view(-1, 16), plain * weight[:, None], rtol=1e-5, atol=1e-6)
