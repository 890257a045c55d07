"""Chapter 05 checks: the reference passes, the stub and typical mistakes fail."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minimind_ref import count_parameters
from minimind_ref.checks import ch05


# ----------------------------------------------------------------------------- reference answers
def block_forward(block, h, position_embeddings):
    h = h + block.self_attn(block.input_layernorm(h), position_embeddings)[0]
    return h + block.mlp(block.post_attention_layernorm(h))


def count_dense_parameters(config, tie_word_embeddings=True):
    h, L, V = config.hidden_size, config.num_hidden_layers, config.vocab_size
    hd = config.head_dim
    attn = h * config.num_attention_heads * hd * 2 + h * config.num_key_value_heads * hd * 2
    ffn = 3 * h * config.intermediate_size
    per_layer = attn + ffn + 2 * h
    return V * h + L * per_layer + h + (0 if tie_word_embeddings else V * h)


def tie_weights(model):
    model.model.embed_tokens.weight = model.lm_head.weight


def shifted_cross_entropy(logits, labels):
    V = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1), ignore_index=-100)


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise 5.x: implement me")


# ----------------------------------------------------------------------------- passes
@pytest.mark.parametrize("check, fn", [
    (ch05.check_block_forward, block_forward),
    (ch05.check_block_forward, lambda block, h, pe: block(h, pe)[0]),
    (ch05.check_count_parameters, count_dense_parameters),
    (ch05.check_tie_weights, tie_weights),
    (ch05.check_shifted_cross_entropy, shifted_cross_entropy),
])
def test_reference_passes(check, fn, capsys):
    check(fn)
    assert capsys.readouterr().out.startswith("✓")


# ----------------------------------------------------------------------------- stubs fail
@pytest.mark.parametrize("check", [ch05.check_block_forward, ch05.check_count_parameters, ch05.check_tie_weights,
                                   ch05.check_shifted_cross_entropy])
def test_stub_fails(check):
    with pytest.raises(AssertionError, match="not implemented"):
        check(stub)


# ----------------------------------------------------------------------------- wrong answers fail
def post_norm(block, h, pe):
    h = block.input_layernorm(h + block.self_attn(h, pe)[0])
    return block.post_attention_layernorm(h + block.mlp(h))


def no_residual(block, h, pe):
    h = block.self_attn(block.input_layernorm(h), pe)[0]
    return block.mlp(block.post_attention_layernorm(h))


def residual_of_normed(block, h, pe):
    n = block.input_layernorm(h)
    h = n + block.self_attn(n, pe)[0]
    n = block.post_attention_layernorm(h)
    return n + block.mlp(n)


def one_norm_twice(block, h, pe):
    h = h + block.self_attn(block.input_layernorm(h), pe)[0]
    return h + block.mlp(block.input_layernorm(h))


def parallel_block(block, h, pe):  # GPT-J style: both sub-layers read the same input
    return h + block.self_attn(block.input_layernorm(h), pe)[0] + block.mlp(block.post_attention_layernorm(h))


def returns_tuple(block, h, pe):
    return block(h, pe)


def count_tied_twice(config, tie_word_embeddings=True):
    return count_dense_parameters(config, tie_word_embeddings=False)


def count_ignores_tying(config, tie_word_embeddings=True):
    return count_dense_parameters(config, tie_word_embeddings=True)


def count_no_norms(config, tie_word_embeddings=True):
    return count_dense_parameters(config, tie_word_embeddings) - (2 * config.num_hidden_layers + 1) * config.hidden_size


def count_mha_kv(config, tie_word_embeddings=True):
    h, L = config.hidden_size, config.num_hidden_layers
    return count_dense_parameters(config, tie_word_embeddings) + L * 2 * h * (
        config.num_attention_heads - config.num_key_value_heads) * config.head_dim


def count_ffn_4x(config, tie_word_embeddings=True):
    h, L = config.hidden_size, config.num_hidden_layers
    return count_dense_parameters(config, tie_word_embeddings) - L * 3 * h * config.intermediate_size + L * 8 * h * h


def tie_wrong_direction(model):
    model.lm_head.weight = model.model.embed_tokens.weight


def tie_by_copy(model):
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(model.lm_head.weight)


def tie_by_clone(model):
    model.model.embed_tokens.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())


def unshifted(logits, labels):
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100)


def shifted_backwards(logits, labels):
    V = logits.shape[-1]
    return F.cross_entropy(logits[:, 1:].reshape(-1, V), labels[:, :-1].reshape(-1), ignore_index=-100)


def mean_over_ignored_too(logits, labels):
    V = logits.shape[-1]
    lab = labels[:, 1:].reshape(-1)
    per = F.cross_entropy(logits[:, :-1].reshape(-1, V), lab, ignore_index=-100, reduction="none")
    return per.mean()


def sum_not_mean(logits, labels):
    V = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1), ignore_index=-100,
                           reduction="sum")


def per_position(logits, labels):
    V = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1), ignore_index=-100,
                           reduction="none")


def no_ignore_index(logits, labels):
    V = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].clamp(min=0).reshape(-1))


@pytest.mark.parametrize("check, fn, message", [
    (ch05.check_block_forward, post_norm, "block_forward"),
    (ch05.check_block_forward, no_residual, "block_forward"),
    (ch05.check_block_forward, residual_of_normed, "block_forward"),
    (ch05.check_block_forward, one_norm_twice, "block_forward"),
    (ch05.check_block_forward, parallel_block, "block_forward"),
    (ch05.check_block_forward, returns_tuple, "tuple"),
    (ch05.check_count_parameters, count_tied_twice, "vocab_size \\* hidden_size"),
    (ch05.check_count_parameters, count_ignores_tying, "vocab_size \\* hidden_size"),
    (ch05.check_count_parameters, count_no_norms, "RMSNorm gains"),
    (ch05.check_count_parameters, count_mha_kv, "count_parameters"),
    (ch05.check_count_parameters, count_ffn_4x, "count_parameters"),
    (ch05.check_count_parameters, lambda c, tie_word_embeddings=True: float(count_dense_parameters(c, tie_word_embeddings)),
     "expected an int"),
    (ch05.check_tie_weights, tie_wrong_direction, "embedding's old values"),
    (ch05.check_tie_weights, tie_by_copy, "two different Parameter objects \\(with equal values"),
    (ch05.check_tie_weights, tie_by_clone, "two different Parameter objects"),
    (ch05.check_tie_weights, lambda model: None, "two different Parameter objects"),
    (ch05.check_shifted_cross_entropy, unshifted, "shifted_cross_entropy"),
    (ch05.check_shifted_cross_entropy, shifted_backwards, "shifted_cross_entropy"),
    (ch05.check_shifted_cross_entropy, mean_over_ignored_too, "shifted_cross_entropy"),
    (ch05.check_shifted_cross_entropy, sum_not_mean, "shifted_cross_entropy"),
    (ch05.check_shifted_cross_entropy, per_position, "scalar"),
    (ch05.check_shifted_cross_entropy, no_ignore_index, "shifted_cross_entropy"),
])
def test_wrong_answers_fail(check, fn, message):
    with pytest.raises(AssertionError, match=message):
        check(fn)


def test_count_parameters_reference_matches_published_sizes():
    from minimind_ref import minimind2, minimind2_small
    assert count_dense_parameters(minimind2_small()) == count_parameters(minimind2_small()) == 25_829_888
    assert count_dense_parameters(minimind2()) == count_parameters(minimind2()) == 104_030_976
