"""minimind_ref.graph_decode on the CPU: the static-shape decoder gives generate's greedy tokens,
samples from generate's distributions, falls back cleanly without CUDA and rejects bad input.

The CUDA graph itself is exercised by tests/test_gpu.py (skipped without a GPU). Here the same
step runs eagerly and, in the slow test, with the static shapes the graph records (attention over
the whole capacity, the position in a tensor) through ``torch.compile`` on the CPU.
"""

from __future__ import annotations

import math

import pytest
import torch

import minimind_ref as mm
from minimind_ref.fast_decode import FastDecoder
from minimind_ref.generation import next_token_logits
from minimind_ref.graph_decode import GraphDecoder, Sampling, _State, count_ops, graph_generate
from test_fast_decode import minimind3_model, small_model

VOCAB = 300


def model_of(generation: str, seed: int = 0, **overrides) -> mm.MiniMindForCausalLM:
    """test_fast_decode's small models: MiniMind2 (8:2 heads), or minimind-3 with random QK-norm gains."""
    return (small_model if generation == "MiniMind2" else minimind3_model)(seed, **overrides)


def prompt(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


GENERATIONS = ["MiniMind2", "minimind-3"]
MOE = {"MiniMind2": dict(use_moe=True), "minimind-3": dict(use_moe=True),
       "minimind-3 top-2 unnormalised": dict(use_moe=True, num_experts_per_tok=2, norm_topk_prob=False)}


# --- greedy: generate's tokens -----------------------------------------------------------------

@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("batch,length", [(1, 1), (1, 9), (3, 6)])
def test_greedy_tokens_equal_generate(generation, batch, length):
    model = model_of(generation, seed=length)
    ids = prompt(batch, length, seed=batch * 10 + length)
    expected = model.generate(ids, max_new_tokens=24)
    decoder = GraphDecoder(model)
    assert torch.equal(decoder.generate(ids, 24), expected)
    assert decoder.last_path == "eager" and not decoder.cuda_graph  # the CPU fallback
    assert torch.equal(graph_generate(model, ids, 24), expected)


@pytest.mark.parametrize("generation", GENERATIONS)
def test_left_padded_batch_equals_generate(generation):
    model = model_of(generation, seed=4)
    ids = prompt(3, 7, seed=4)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[2, :1] = 0
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=20)
    assert torch.equal(GraphDecoder(model).generate(ids, 20, attention_mask=mask), expected)


@pytest.mark.parametrize("variant", sorted(MOE))
@pytest.mark.parametrize("batch", [1, 4])
def test_moe_greedy_equals_generate(variant, batch):
    """Batch 1 gathers each row's experts (k < experts); batch 4 runs every expert on every row."""
    generation = "MiniMind2" if variant == "MiniMind2" else "minimind-3"
    model = model_of(generation, seed=batch, **MOE[variant])
    ids = prompt(batch, 5, seed=batch)
    expected = model.generate(ids, max_new_tokens=16)
    assert torch.equal(GraphDecoder(model).generate(ids, 16), expected)


def test_untied_head_and_free_head_dim():
    model = model_of("minimind-3", seed=2, head_dim=12, tie_word_embeddings=False, num_key_value_heads=1)
    ids = prompt(2, 4, seed=2)
    assert torch.equal(GraphDecoder(model).generate(ids, 16), model.generate(ids, max_new_tokens=16))


def test_repetition_penalty_and_eos_as_generate():
    model = model_of("minimind-3", seed=5)
    ids = prompt(2, 6, seed=5)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    kw = dict(max_new_tokens=30, attention_mask=mask, repetition_penalty=1.3)
    free = model.generate(ids, **kw)
    eos = int(free[0, 6 + 4])  # row 0's 5th new token
    expected = model.generate(ids, eos_token_id=eos, pad_token_id=7, **kw)
    got = GraphDecoder(model).generate(ids, eos_token_id=eos, pad_token_id=7, **kw)
    assert torch.equal(got, expected)
    assert torch.equal(GraphDecoder(model).generate(ids, **kw), free)


def test_stops_at_the_position_limit_with_a_warning():
    model = model_of("MiniMind2", seed=6)
    ids = prompt(1, 90, seed=6)
    with pytest.warns(UserWarning, match="max_position_embeddings=96"):
        out = GraphDecoder(model).generate(ids, 20)
    assert out.shape == (1, 96)
    with pytest.warns(UserWarning):
        assert torch.equal(out, model.generate(ids, max_new_tokens=20))


def test_same_speed_path_as_fast_decoder_gives_its_tokens():
    """Batch 1, greedy: FastDecoder's tokens (both are generate's)."""
    model = model_of("minimind-3", seed=8)
    ids = prompt(1, 12, seed=8)
    assert torch.equal(GraphDecoder(model).generate(ids, 32), FastDecoder(model).generate(ids, 32))


# --- sampling ----------------------------------------------------------------------------------

def test_top_k_1_sampling_is_greedy_and_a_generator_makes_it_reproducible():
    model = model_of("minimind-3", seed=9)
    ids = prompt(2, 5, seed=9)
    decoder = GraphDecoder(model)
    assert torch.equal(decoder.generate(ids, 16, do_sample=True, top_k=1), model.generate(ids, max_new_tokens=16))
    a = decoder.generate(ids, 16, do_sample=True, temperature=1.5, generator=torch.Generator().manual_seed(3))
    b = decoder.generate(ids, 16, do_sample=True, temperature=1.5, generator=torch.Generator().manual_seed(3))
    c = decoder.generate(ids, 16, do_sample=True, temperature=1.5, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_sampled_tokens_follow_generates_distribution():
    """The first sampled token of 4,000 rows against generate's filtered distribution for that prompt:
    every draw lies in the filtered support, and the frequencies match the probabilities within five
    standard errors (a wrong temperature or filter moves some frequency by far more)."""
    model = model_of("minimind-3", seed=10)
    ids = prompt(1, 4, seed=10).repeat(4000, 1)
    settings = dict(temperature=0.7, top_k=20, top_p=0.9)
    with torch.no_grad():
        logits = model(ids[:1]).logits[:, -1]
    probs = next_token_logits(logits, **settings).softmax(-1)[0].double()
    first = GraphDecoder(model).generate(ids, 1, do_sample=True, generator=torch.Generator().manual_seed(0),
                                         **settings)[:, -1]
    freq = torch.bincount(first, minlength=VOCAB).double() / len(first)
    assert (probs[first] > 0).all(), "a token outside the top-k / top-p support was drawn"
    se = (probs * (1 - probs) / len(first)).sqrt()
    assert ((freq - probs).abs() <= 5 * se + 1e-12).all(), (freq - probs).abs().max()
    assert (probs > 0).sum() > 1, "the test needs a distribution with more than one token"


def test_sampling_settings_are_applied_like_generates():
    """One sampling step's processors, on fixed logits: the race picks argmax(p / E) over the same p."""
    torch.manual_seed(0)
    model = model_of("MiniMind2", seed=11)
    decoder = GraphDecoder(model)
    st = _State(decoder, batch=4, capacity=8)
    logits = torch.randn(4, VOCAB) * 3
    prev = torch.randint(0, VOCAB, (4, 6))
    st.seen.scatter_(1, prev, True)
    s = Sampling(do_sample=True, temperature=0.8, top_k=30, top_p=0.8, repetition_penalty=1.2)
    p = next_token_logits(logits, prev, 0.8, 30, 0.8, 1.2).softmax(-1)
    race = torch.empty_like(p).exponential_(generator=torch.Generator().manual_seed(1))
    got = decoder._pick(logits, st, s, torch.Generator().manual_seed(1))
    assert torch.equal(got, (p / race).argmax(-1))


# --- what the graph records: the static step ---------------------------------------------------

@pytest.mark.parametrize("generation", GENERATIONS)
def test_static_step_equals_the_eager_step(generation):
    """The step a graph records (position in a tensor, attention over the whole capacity with later
    positions masked) gives the eager step's tokens, run here without a graph."""
    model = model_of(generation, seed=12)
    ids = prompt(2, 5, seed=12)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    decoder = GraphDecoder(model)
    expected = decoder.generate(ids, 12, attention_mask=mask)
    with torch.no_grad():
        out = model(ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
        st = _State(decoder, batch=2, capacity=32)  # more room than needed, as a rounded-up graph capacity
        s = Sampling()
        decoder._load_prompt(st, ids, mask, out.past_key_values)
        st.token.copy_(decoder._pick(out.logits[:, -1], st, s, None))
        st.sequence[:, 5] = st.token
        st.pos.fill_(5)
        for _ in range(11):
            decoder._static_step(st, s)
    assert torch.equal(st.sequence[:, :17], expected)


@pytest.mark.parametrize("check_every", [1, 4, 16])
def test_static_loop_stops_at_eos_as_generate(check_every):
    """The loop a graph runs (static buffers reused across calls, the finished flags read every
    ``check_every`` steps, the extra steps cut off), here with the uncompiled static step."""
    model = model_of("MiniMind2", seed=17)
    ids = prompt(3, 5, seed=17)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    free = model.generate(ids, attention_mask=mask, max_new_tokens=30)
    decoder = GraphDecoder(model, capacity_multiple=16, check_every=check_every)
    decoder.compiled = True  # the static path, with _step_fn still the plain static step
    for eos in (int(free[0, 5 + 3]), int(free[2, 5 + 20]), None):
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=30, eos_token_id=eos)
        assert torch.equal(decoder.generate(ids, 30, attention_mask=mask, eos_token_id=eos), expected), eos
        assert decoder.last_path == "compiled"
    assert len(decoder._graphs) == 3  # buffers per setting (two end tokens, none), each of capacity 48
    decoder.clear()
    assert not decoder._graphs


@pytest.mark.slow
def test_compiled_static_step_gives_the_same_tokens():
    """compile=True on the CPU: no graph, the compiled static step is called once per token, with
    generate's tokens; a generator of one's own falls back to the eager step."""
    torch.manual_seed(13)  # one layer: compiles faster, the same code
    model = mm.MiniMindForCausalLM(mm.MiniMindConfig(generation="minimind-3", hidden_size=64, num_hidden_layers=1,
                                                     vocab_size=VOCAB, max_position_embeddings=96)).eval()
    ids = prompt(2, 6, seed=13)
    decoder = GraphDecoder(model, compile=True, capacity_multiple=32)
    try:
        assert torch.equal(decoder.generate(ids, 10), model.generate(ids, max_new_tokens=10))
        assert decoder.last_path == "compiled"
        decoder.generate(ids, 4, do_sample=True, generator=torch.Generator().manual_seed(0))
        assert decoder.last_path == "eager"
    finally:
        torch._dynamo.reset()


# --- fallbacks, bookkeeping, bad input -------------------------------------------------------------

def test_cuda_graph_demanded_off_cuda_is_a_clear_error():
    model = model_of("MiniMind2")
    with pytest.raises(ValueError, match=r"cuda_graph=True needs the model on a CUDA device"):
        GraphDecoder(model, cuda_graph=True)
    assert GraphDecoder(model, cuda_graph=False).cuda_graph is False


@pytest.mark.parametrize("bad,error,match", [
    (dict(input_ids=torch.tensor([1, 2, 3])), ValueError, r"\[batch, seq_len\]"),
    (dict(input_ids=torch.zeros(1, 0, dtype=torch.long)), ValueError, r"at least one token"),
    (dict(max_new_tokens=-1), ValueError, r"max_new_tokens"),
    (dict(max_new_tokens=2.5), TypeError, r"max_new_tokens"),
    (dict(temperature=0.0), ValueError, r"temperature"),
    (dict(top_p=1.5), ValueError, r"top_p"),
    (dict(top_k=-2), ValueError, r"top_k"),
    (dict(eos_token_id=VOCAB), ValueError, r"eos_token_id"),
    (dict(attention_mask=torch.tensor([[1, 0, 1]])), ValueError, r"pad on the left"),
])
def test_bad_input_is_rejected(bad, error, match):
    model = model_of("MiniMind2")
    kwargs = dict(input_ids=torch.tensor([[1, 2, 3]]), max_new_tokens=4)
    kwargs.update(bad)
    with pytest.raises(error, match=match):
        GraphDecoder(model).generate(**kwargs)


def test_bad_construction_is_rejected():
    with pytest.raises(TypeError, match="MiniMindForCausalLM"):
        GraphDecoder(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="capacity_multiple"):
        GraphDecoder(model_of("MiniMind2"), capacity_multiple=0)


def test_model_and_its_mode_untouched():
    model = model_of("minimind-3", seed=14)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    GraphDecoder(model).generate(prompt(1, 3, seed=14), 4)
    assert model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(GraphDecoder(model).generate(prompt(1, 3, 1), 0), prompt(1, 3, 1))


def test_bytes_per_token_counts_every_matrix_once():
    model = model_of("minimind-3", seed=15)
    decoder = GraphDecoder(model)
    weights = sum(p.numel() * 4 for n, p in model.named_parameters() if p.dim() == 2)  # the tied matrix once
    cache = 2 * 3 * 10 * model.config.num_key_value_heads * model.config.head_dim * 4
    assert decoder.bytes_per_token(context=10) == weights + cache
    moe = GraphDecoder(model_of("minimind-3", use_moe=True))  # 4 experts, top-1: batch 1 reads one expert per layer
    expert = sum(p.numel() * 4 for p in moe.model.model.layers[0].mlp.experts[0].parameters())
    cfg = moe.config
    kv_per_row = 2 * cfg.num_hidden_layers * 10 * cfg.num_key_value_heads * cfg.head_dim * 4
    # batch 4, top-1: every one of the 4 experts per layer (3 more than batch 1), and 3 more rows of cache
    assert moe.bytes_per_token(10, batch=4) - moe.bytes_per_token(10, batch=1) == 3 * 3 * expert + 3 * kv_per_row


def test_count_ops_counts_kernels_not_views():
    x = torch.ones(4, 4)
    counts = count_ops(lambda: (x.view(16) + 1).t().mul(2).sum())
    assert counts == {"add": 1, "mul": 1, "sum": 1}, counts
    model = model_of("minimind-3", seed=16)
    step = sum(count_ops(lambda: model.generate(prompt(1, 4, 0), max_new_tokens=1)).values())
    assert step > 8 * model.config.num_hidden_layers and math.isfinite(step)
