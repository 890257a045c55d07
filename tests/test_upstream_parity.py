"""Parity with upstream MiniMind2.

``tests/data/upstream_reference.pt`` holds weights, inputs and outputs of upstream's
``model/model_minimind.py`` (MiniMind2; transformers 4.57.6 and torch 2.13.0 on CPU, fp32) for five
tiny configurations: dense GQA, dense MHA without SDPA, YaRN, MoE (top-2,
sequence-level aux loss) and MoE (top-1, global aux loss). We load the same weights with
``strict=True`` and compare every output at 1e-5. The outputs were made with a reconstruction of
the file and then re-run with c090b69's own file (``tools/upstream_fixtures.py --minimind2``: every
output within 1e-6), which also added ``logits_chunk``, a chunk of several tokens on a cache.
"""

from pathlib import Path

import pytest
import torch

import minimind_ref as mm

FIXTURE = torch.load(Path(__file__).parent / "data" / "upstream_reference.pt", weights_only=True)
CASES = sorted(FIXTURE["cases"])
TOL = dict(rtol=1e-5, atol=1e-5)


def _load(case):
    model = mm.MiniMindForCausalLM(mm.MiniMindConfig(**case["config"]))
    model.load_state_dict(case["state_dict"], strict=True)
    return model


@pytest.mark.parametrize("name", CASES)
def test_eval_outputs_match_upstream(name):
    case = FIXTURE["cases"][name]
    m = _load(case).eval()
    ids, mask = case["input_ids"], case["attention_mask"]
    with torch.no_grad():
        torch.testing.assert_close(m(ids).logits, case["logits"], **TOL)
        torch.testing.assert_close(m(ids, attention_mask=mask).logits, case["logits_padded"], **TOL)
        out = m(ids[:, :7], use_cache=True)
        pieces, past = [out.logits], out.past_key_values
        for t in range(7, ids.shape[1]):
            out = m(ids[:, t : t + 1], past_key_values=past, use_cache=True)
            pieces.append(out.logits); past = out.past_key_values
        torch.testing.assert_close(torch.cat(pieces, 1), case["logits_cached"], **TOL)
        torch.testing.assert_close(past[0][0], case["cache_k0"], **TOL)
        out = m(ids[:, :7], attention_mask=mask[:, :7], use_cache=True)
        out = m(ids[:, 7:], attention_mask=mask, past_key_values=out.past_key_values, use_cache=True)
        torch.testing.assert_close(out.logits, case["logits_padded_chunk"], **TOL)
        out = m(ids[:, :7], use_cache=True)  # a chunk of 5 on a cache of 7, no mask: c090b69's explicit path
        out = m(ids[:, 7:], past_key_values=out.past_key_values, use_cache=True)
        torch.testing.assert_close(out.logits, case["logits_chunk"], **TOL)


@pytest.mark.parametrize("name", CASES)
def test_training_outputs_and_gradients_match_upstream(name):
    case = FIXTURE["cases"][name]
    m = _load(case).train()
    ids = case["input_ids"]
    out = m(ids, labels=ids)
    torch.testing.assert_close(out.logits, case["train_logits"], **TOL)
    torch.testing.assert_close(out.loss, case["loss"], **TOL)
    torch.testing.assert_close(out.aux_loss.reshape(()), case["aux_loss"].reshape(()), **TOL)
    (out.loss + out.aux_loss).backward()
    grads = dict(m.named_parameters())
    assert case["grads"], "fixture holds gradients"
    for pname, expected in case["grads"].items():
        torch.testing.assert_close(grads[pname].grad, expected, **TOL, msg=lambda m, p=pname: f"{p}: {m}")


def _upstream_loss(logits, labels):
    """Upstream's loss, written out: mean cross-entropy of the shifted positions, ignore_index -100."""
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
    )


@pytest.mark.parametrize("name", CASES)
def test_named_difference_loss_without_targets(name):
    """``UPSTREAM_DIFFERENCES["loss_without_targets"]``: where some position is supervised the loss
    is upstream's (1e-5); where none is, upstream's mean is NaN and ours is 0 with zero gradients."""
    assert "loss_without_targets" in mm.model.UPSTREAM_DIFFERENCES
    case = FIXTURE["cases"][name]
    m = _load(case).train()
    ids = case["input_ids"]
    partial = ids.masked_fill(case["attention_mask"] == 0, -100)
    partial[:, : ids.shape[1] // 2] = -100
    out = m(ids, labels=partial)
    torch.testing.assert_close(out.loss, _upstream_loss(out.logits, partial), **TOL)
    none = torch.full_like(ids, -100)
    out = m(ids, labels=none)
    assert torch.isnan(_upstream_loss(out.logits, none)), "upstream's formula gives NaN here"
    assert out.loss.item() == 0.0
    out.loss.backward()
    assert all(p.grad is None or not p.grad.any() for p in m.parameters())


def c090b69_takes_the_fused_path(flash, seq_len, past_key_value, attention_mask):
    """c090b69's condition for ``F.scaled_dot_product_attention``, transcribed from
    ``c090b69:model/model_minimind.py:196 "(seq_len > 1) and (past_key_value is None)"``."""
    return bool(flash and (seq_len > 1) and (past_key_value is None)
                and (attention_mask is None or torch.all(attention_mask == 1)))


def test_fused_path_rule_is_c090b69s():
    """``Attention.uses_sdpa`` is c090b69's condition in every case (fused attention on or off, one or
    several new tokens, with or without a cache, no mask, a mask of ones, a padded mask); chunked
    prefill on a cache takes the explicit path in both and gives the full forward's logits (1e-5)."""
    cfg = mm.MiniMindConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            vocab_size=64, max_position_embeddings=32)
    attn = mm.attention.Attention(cfg)
    cache = (torch.zeros(2, 3, 2, cfg.head_dim), torch.zeros(2, 3, 2, cfg.head_dim))
    padded = torch.ones(2, 5)
    padded[0, 0] = 0
    checked = 0
    for flash in (True, False):
        attn.flash = flash
        for seq_len in (1, 5):
            for past in (None, cache):
                for mask in (None, torch.ones(2, 5), padded):
                    assert attn.uses_sdpa(seq_len, past, mask) == c090b69_takes_the_fused_path(flash, seq_len, past, mask), \
                        (flash, seq_len, past is not None, mask)
                    checked += 1
    assert checked == 24
    torch.manual_seed(0)
    m = mm.MiniMindForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = m(ids).logits[:, 4:]
        past = m(ids[:, :4], use_cache=True).past_key_values
        assert not c090b69_takes_the_fused_path(True, 3, past[0], None)
        chunk = m(ids[:, 4:], past_key_values=past, use_cache=True).logits
    torch.testing.assert_close(chunk, full, **TOL)
