"""minimind_ref.fast_decode: the lean batch-1 greedy decoder gives the eager generate's tokens."""

from __future__ import annotations

import pytest
import torch

import minimind_ref as mm
from minimind_ref.fast_decode import FastDecoder, fast_generate


def small_model(seed: int = 0, **overrides) -> mm.MiniMindForCausalLM:
    torch.manual_seed(seed)
    cfg = mm.MiniMindConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
                            vocab_size=300, max_position_embeddings=96, **overrides)
    return mm.MiniMindForCausalLM(cfg).eval()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("prompt_len", [1, 7, 40])
def test_same_tokens_as_eager_generate(seed, prompt_len):
    model = small_model(seed)
    prompt = torch.randint(0, 300, (1, prompt_len), generator=torch.Generator().manual_seed(seed))
    expected = model.generate(prompt, max_new_tokens=24)
    assert torch.equal(FastDecoder(model).generate(prompt, 24), expected)
    assert torch.equal(fast_generate(model, prompt, 24), expected)


def test_stops_at_eos_and_at_the_position_limit():
    model = small_model(3)
    prompt = torch.randint(0, 300, (1, 5), generator=torch.Generator().manual_seed(3))
    free = FastDecoder(model).generate(prompt, 20)
    eos = int(free[0, 9])  # the 5th generated token: stop there
    stopped = FastDecoder(model).generate(prompt, 20, eos_token_id=eos)
    first = (free[0, 5:] == eos).nonzero()[0].item()
    assert torch.equal(stopped, free[:, : 5 + first + 1])
    assert torch.equal(stopped, model.generate(prompt, max_new_tokens=20, eos_token_id=eos))
    long_prompt = torch.randint(0, 300, (1, 90), generator=torch.Generator().manual_seed(4))
    with pytest.warns(UserWarning, match="max_position_embeddings=96"):  # as generate and GraphDecoder warn
        assert FastDecoder(model).generate(long_prompt, 20).shape == (1, 96)


def test_state_dict_untouched_and_bad_input_rejected():
    model = small_model(5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    FastDecoder(model).generate(torch.tensor([[1, 2, 3]]), 4)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match=r"one sequence"):
        FastDecoder(model).generate(torch.tensor([[1, 2], [3, 4]]), 4)
    with pytest.raises(ValueError, match=r"dense models only"):
        FastDecoder(small_model(6, use_moe=True))


@pytest.mark.slow
def test_compiled_step_gives_the_same_tokens():
    model = small_model(7)
    prompt = torch.randint(0, 300, (1, 6), generator=torch.Generator().manual_seed(7))
    try:
        compiled = FastDecoder(model, compile=True).generate(prompt, 16)
    finally:
        torch._dynamo.reset()
    assert torch.equal(compiled, model.generate(prompt, max_new_tokens=16))


def test_masked_step_ignores_what_the_cache_memory_held(monkeypatch):
    """The static (compiled) step attends over the whole cache with weight 0 on unwritten positions;
    0 * NaN is NaN, so those positions must be zeros, not uninitialised memory (which once made the
    compiled step emit token 0 in CI). Here every new tensor starts as NaN, and the eager masked
    step must still give generate's tokens."""
    model = small_model(7)
    prompt = torch.randint(0, 300, (1, 6), generator=torch.Generator().manual_seed(7))
    expected = model.generate(prompt, max_new_tokens=16)
    decoder = FastDecoder(model)
    decoder._static_step = decoder._masked_step  # the compiled step's code, run eagerly
    real_empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: real_empty_like(*a, **k).fill_(float("nan")))
    assert torch.equal(decoder.generate(prompt, 16), expected)


def minimind3_model(seed: int = 0, **overrides) -> mm.MiniMindForCausalLM:
    """A small minimind-3 (QK-norm, 8:4 GQA) with random QK-norm gains, so a skipped or misplaced QK-norm shows."""
    torch.manual_seed(seed)
    cfg = mm.MiniMindConfig(generation="minimind-3", hidden_size=64, num_hidden_layers=3, vocab_size=300,
                            max_position_embeddings=96, **overrides)
    model = mm.MiniMindForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.uniform_(0.5, 2.0)
    return model


@pytest.mark.parametrize("overrides", [{}, {"head_dim": 12, "tie_word_embeddings": False}, {"num_key_value_heads": 1}],
                         ids=["minimind-3", "free head_dim, untied", "MQA"])
@pytest.mark.parametrize("prompt_len", [1, 9])
def test_minimind3_same_tokens_as_eager_generate(overrides, prompt_len):
    model = minimind3_model(1, **overrides)
    prompt = torch.randint(0, 300, (1, prompt_len), generator=torch.Generator().manual_seed(prompt_len))
    expected = model.generate(prompt, max_new_tokens=24)
    assert torch.equal(FastDecoder(model).generate(prompt, 24), expected)
    with pytest.raises(ValueError, match=r"dense models only"):
        FastDecoder(minimind3_model(2, use_moe=True))


def test_minimind3_qk_norm_is_not_skipped():
    """Dropping the QK-norm gains from the decoder changes its tokens: the test above would notice."""
    model = minimind3_model(3)
    prompt = torch.randint(0, 300, (1, 6), generator=torch.Generator().manual_seed(3))
    decoder = FastDecoder(model)
    decoder.q_norm = [torch.ones_like(w) * 4 for w in decoder.q_norm]
    assert not torch.equal(decoder.generate(prompt, 24), model.generate(prompt, max_new_tokens=24))


def test_nan_weights_are_refused_not_decoded_as_token_0():
    """NaN weights give NaN logits, whose argmax is token 0: FastDecoder refuses them, naming a tensor."""
    from minimind_ref import MiniMindConfig, MiniMindForCausalLM
    from minimind_ref.fast_decode import fast_generate

    torch.manual_seed(0)
    model = MiniMindForCausalLM(MiniMindConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                               num_key_value_heads=2, vocab_size=64)).eval()
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="NaN/inf at step 0.*mlp.down_proj.weight"):
        fast_generate(model, torch.tensor([[1, 2, 3]]), 4)
