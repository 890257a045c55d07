"""Chapter 05 checks: the reference passes, the stub fails, and every planted mistake fails with a
message that names it (the solution only on request)."""

from __future__ import annotations

import math

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


def loss_at_initialization(vocab_size, hidden_size):
    return math.log(vocab_size) + 1 / 6


def loss_at_initialization_from_the_uniform(vocab_size, hidden_size):
    """The same prediction written out: the variance of U(-b, b) is b^2 / 3, summed over hidden_size products."""
    bound = 1 / math.sqrt(hidden_size)
    return math.log(vocab_size) + hidden_size * bound ** 2 / 3 / 2


def minimind3_parameters(hidden_size, num_hidden_layers, use_moe=False, vocab_size=6400):
    h, L = hidden_size, num_hidden_layers
    d = h // 8
    width = math.ceil(h * math.pi / 64) * 64
    ffn = 4 * 3 * h * width + 4 * h if use_moe else 3 * h * width
    return L * (2 * h * 8 * d + 2 * h * 4 * d + 2 * d + 2 * h + ffn) + vocab_size * h + h


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise 5.x: implement me")


# ----------------------------------------------------------------------------- passes
@pytest.mark.parametrize("check, fn", [
    (ch05.check_block_forward, block_forward),
    (ch05.check_count_parameters, count_dense_parameters),
    (ch05.check_tie_weights, tie_weights),
    (ch05.check_loss_at_initialization, loss_at_initialization),
    (ch05.check_loss_at_initialization, loss_at_initialization_from_the_uniform),
    (ch05.check_minimind3_parameters, minimind3_parameters),
])
def test_reference_passes(check, fn, capsys):
    check(fn)
    out = capsys.readouterr().out
    assert out.startswith("✓ Exercise 5."), out


# ----------------------------------------------------------------------------- stubs fail
@pytest.mark.parametrize("check", [ch05.check_block_forward, ch05.check_count_parameters, ch05.check_tie_weights,
                                   ch05.check_loss_at_initialization, ch05.check_minimind3_parameters])
def test_stub_fails(check):
    with pytest.raises(AssertionError, match="not implemented"):
        check(stub)


def test_checks_leave_the_global_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    ch05.check_block_forward(block_forward)
    ch05.check_tie_weights(tie_weights)
    ch05.check_loss_at_initialization(loss_at_initialization)
    assert torch.equal(torch.rand(3), expected)


def assert_names(check, fn, *fragments, label):
    """The check fails; its message carries the exercise label, each fragment, and the hint before the
    line that says how to ask for a solution."""
    with pytest.raises(AssertionError) as err:
        check(fn)
    msg = str(err.value)
    assert msg.startswith(f"[{label}]"), msg
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in:\n{msg}"
    if "hint:" in msg:
        assert msg.index("hint:") < msg.index("show_solution("), msg
    return msg


# ----------------------------------------------------------------------------- 5.1 wrong blocks
def post_norm(block, h, pe):
    a = block.input_layernorm(h + block.self_attn(h, pe)[0])
    return block.post_attention_layernorm(a + block.mlp(a))


def no_residual(block, h, pe):
    a = block.self_attn(block.input_layernorm(h), pe)[0]
    return block.mlp(block.post_attention_layernorm(a))


def residual_of_normed(block, h, pe):
    n = block.input_layernorm(h)
    a = n + block.self_attn(n, pe)[0]
    n = block.post_attention_layernorm(a)
    return n + block.mlp(n)


def one_norm_twice(block, h, pe):
    h = h + block.self_attn(block.input_layernorm(h), pe)[0]
    return h + block.mlp(block.input_layernorm(h))


def swapped_norms(block, h, pe):
    h = h + block.self_attn(block.post_attention_layernorm(h), pe)[0]
    return h + block.mlp(block.input_layernorm(h))


def parallel_block(block, h, pe):  # GPT-J style: both sub-layers read the same input
    return h + block.self_attn(block.input_layernorm(h), pe)[0] + block.mlp(block.post_attention_layernorm(h))


def attention_only(block, h, pe):
    return h + block.self_attn(block.input_layernorm(h), pe)[0]


def ffn_only(block, h, pe):
    return h + block.mlp(block.post_attention_layernorm(h))


def normalized_output(block, h, pe):
    h = h + block.self_attn(block.input_layernorm(h), pe)[0]
    return block.post_attention_layernorm(h + block.mlp(block.post_attention_layernorm(h)))


def in_place_residual(block, h, pe):
    h += block.self_attn(block.input_layernorm(h), pe)[0]
    h += block.mlp(block.post_attention_layernorm(h))
    return h


def returns_tuple(block, h, pe):
    h = h + block.self_attn(block.input_layernorm(h), pe)[0]
    return h + block.mlp(block.post_attention_layernorm(h)), None


def crashes(block, h, pe):
    return block.self_attn(block.input_layernorm(h))[0]  # forgot position_embeddings


@pytest.mark.parametrize("fn, fragment", [
    (post_norm, "post-norm"),
    (no_residual, "no residual connection"),
    (residual_of_normed, "output to the normalized copy"),
    (one_norm_twice, "input_layernorm used before both sub-layers"),
    (swapped_norms, "the two norms swapped"),
    (parallel_block, "a parallel block"),
    (attention_only, "the FFN half is missing"),
    (ffn_only, "the attention half is missing"),
    (normalized_output, "the block output is normalized"),
    (in_place_residual, "changed its input (argument 2) in place"),
    (returns_tuple, "you returned a tuple"),
    (crashes, "your function raised TypeError"),
    (lambda block, h, pe: block(h, pe)[0], "calls the block itself"),
])
def test_block_mistakes_are_named(fn, fragment):
    assert_names(ch05.check_block_forward, fn, fragment, "(on hidden 64", label=ch05.BLOCK)


def test_block_hint_comes_before_how_to_ask():
    msg = assert_names(ch05.check_block_forward, post_norm, "hint:", 'show_solution("5.1")', label=ch05.BLOCK)
    assert "input_layernorm(h)" not in msg, "the message must not hand out the code"


# ----------------------------------------------------------------------------- 5.2 wrong tying
def tie_wrong_direction(model):
    model.lm_head.weight = model.model.embed_tokens.weight


def tie_by_copy(model):
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(model.lm_head.weight)


def tie_by_clone(model):
    model.model.embed_tokens.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())


def tie_with_a_tensor(model):
    model.model.embed_tokens.weight = model.lm_head.weight.data  # a plain tensor, not a Parameter


def tie_modules(model):
    model.model.embed_tokens = model.lm_head  # a Linear where the model needs an Embedding


@pytest.mark.parametrize("fn, fragment", [
    (tie_wrong_direction, "wrong direction"),
    (tie_wrong_direction, "far too large"),
    (tie_by_copy, "tying by copying values"),
    (tie_by_clone, "tying by copying values"),
    (lambda model: None, "nothing was tied"),
    (tie_with_a_tensor, "your function raised TypeError: cannot assign"),
    (tie_modules, "no longer runs"),
])
def test_tie_mistakes_are_named(fn, fragment):
    assert_names(ch05.check_tie_weights, fn, fragment, label=ch05.TIE)


# ----------------------------------------------------------------------------- 5.3 wrong counts
def count_tied_twice(config, tie_word_embeddings=True):
    return count_dense_parameters(config, tie_word_embeddings=False)


def count_ignores_tying(config, tie_word_embeddings=True):
    return count_dense_parameters(config, tie_word_embeddings=True)


def count_no_norms(config, tie_word_embeddings=True):
    return count_dense_parameters(config, tie_word_embeddings) - (2 * config.num_hidden_layers + 1) * config.hidden_size


def count_no_final_norm(config, tie_word_embeddings=True):
    return count_dense_parameters(config, tie_word_embeddings) - config.hidden_size


def count_one_norm_per_layer(config, tie_word_embeddings=True):
    return count_dense_parameters(config, tie_word_embeddings) - config.num_hidden_layers * config.hidden_size


def count_mha_kv(config, tie_word_embeddings=True):
    h, L = config.hidden_size, config.num_hidden_layers
    return count_dense_parameters(config, tie_word_embeddings) + L * 2 * h * (
        config.num_attention_heads - config.num_key_value_heads) * config.head_dim


def count_two_matrix_ffn(config, tie_word_embeddings=True):
    return count_dense_parameters(config, tie_word_embeddings) - config.num_hidden_layers * config.hidden_size * config.intermediate_size


def count_ffn_4x(config, tie_word_embeddings=True):
    h, L = config.hidden_size, config.num_hidden_layers
    return count_dense_parameters(config, tie_word_embeddings) - L * 3 * h * config.intermediate_size + L * 8 * h * h


def count_no_o_proj(config, tie_word_embeddings=True):
    h, L = config.hidden_size, config.num_hidden_layers
    return count_dense_parameters(config, tie_word_embeddings) - L * h * config.num_attention_heads * config.head_dim


def count_no_embedding(config, tie_word_embeddings=True):
    return count_dense_parameters(config, tie_word_embeddings) - config.vocab_size * config.hidden_size


def count_off_by_some(config, tie_word_embeddings=True):
    return count_dense_parameters(config, tie_word_embeddings) + 7


@pytest.mark.parametrize("fn, fragment", [
    (count_tied_twice, "the tied matrix counted twice"),
    (count_ignores_tying, "the untied head left out"),
    (count_no_norms, "the RMSNorm gains left out"),
    (count_no_final_norm, "the final norm left out"),
    (count_one_norm_per_layer, "one RMSNorm per layer"),
    (count_mha_kv, "k_proj and v_proj sized like q_proj"),
    (count_two_matrix_ffn, "the FFN counted with two matrices"),
    (count_ffn_4x, "4x-wide two-matrix MLP"),
    (count_no_o_proj, "the o_proj matrix left out"),
    (count_no_embedding, "the embedding matrix left out"),
    (count_off_by_some, "which is not the reference's: yours is larger"),
    (lambda c, tie_word_embeddings=True: float(count_dense_parameters(c, tie_word_embeddings)), "expected an int"),
    (lambda c: count_dense_parameters(c), "your function raised TypeError"),
    (lambda c, tie_word_embeddings=True: count_parameters(c) + (0 if tie_word_embeddings else c.vocab_size * c.hidden_size),
     "your function built a MiniMindForCausalLM"),
])
def test_count_mistakes_are_named(fn, fragment):
    assert_names(ch05.check_count_parameters, fn, fragment, label="Exercise 5.3 count_dense_parameters")


def test_count_parameters_reference_matches_upstreams_code():
    """25,829,888 and 104,030,976 are what upstream's model/model_minimind.py builds (tied matrix once)."""
    from minimind_ref import minimind2, minimind2_small
    assert count_dense_parameters(minimind2_small()) == count_parameters(minimind2_small()) == 25_829_888
    assert count_dense_parameters(minimind2()) == count_parameters(minimind2()) == 104_030_976


# ----------------------------------------------------------------------------- 5.4 wrong predictions
def init_with_variance(variance, base=math.e, half=True):
    def fn(vocab_size, hidden_size):
        v = variance(hidden_size) if callable(variance) else variance
        return math.log(vocab_size, base) + (v / 2 if half else v)
    return fn


def init_measured(vocab_size, hidden_size):  # builds a model and measures: not a prediction
    from minimind_ref import MiniMindConfig, MiniMindForCausalLM
    model = MiniMindForCausalLM(MiniMindConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                               num_key_value_heads=2, vocab_size=vocab_size))
    ids = torch.randint(0, vocab_size, (2, 8))
    return model(ids, labels=ids).loss.item()


@pytest.mark.parametrize("fn, fragment", [
    (lambda V, h: math.log(V), "the logits taken as all equal"),
    (init_with_variance(1.0), "a unit variance for the logits"),
    (init_with_variance(lambda h: float(h)), "the embedding's initialization used for the head"),
    (init_with_variance(lambda h: 1 / (3 * h)), "the variance of one head entry used for a whole logit"),
    (init_with_variance(1 / 12), "taken from its half-width"),
    (init_with_variance(1 / 3, half=False), "the whole variance of the logits added instead of half"),
    (lambda V, h: math.log(V) - 1 / 6, "the spread subtracted"),
    (init_with_variance(1 / 3, base=2), "a logarithm to another base"),
    (init_with_variance(math.sqrt(1 / 3)), "the standard deviation of the logits used"),
    (lambda V, h: math.log(V) + 0.2, "yours is larger than the reference's"),
    (init_measured, "your function built a"),
    (lambda V, h: torch.tensor([1.0, 2.0]), "expected a number"),
])
def test_init_loss_mistakes_are_named(fn, fragment):
    assert_names(ch05.check_loss_at_initialization, fn, fragment, label=ch05.LOSS)


def test_init_loss_rule_predicts_a_fresh_model():
    """The prediction is what a fresh minimind_ref model measures on random tokens (large vocabularies, where a
    target rarely appears earlier in its window)."""
    from minimind_ref import MiniMindConfig, MiniMindForCausalLM
    for vocab, hidden in ((6400, 128), (4000, 64)):
        torch.manual_seed(0)
        model = MiniMindForCausalLM(MiniMindConfig(hidden_size=hidden, num_hidden_layers=2, num_attention_heads=8,
                                                   num_key_value_heads=2, vocab_size=vocab)).eval()
        ids = torch.randint(0, vocab, (16, 64), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            measured = model(ids, labels=ids).loss.item()
        assert abs(measured - loss_at_initialization(vocab, hidden)) < 0.02, (vocab, hidden, measured)


# ----------------------------------------------------------------------------- 5.5 minimind-3's count
def _m3_plus(delta):
    """minimind-3's count plus ``delta(h, L, V, d, width, use_moe)``."""
    def fn(hidden_size, num_hidden_layers, use_moe=False, vocab_size=6400):
        h, L, V = hidden_size, num_hidden_layers, vocab_size
        width = math.ceil(h * math.pi / 64) * 64
        return minimind3_parameters(h, L, use_moe, V) + delta(h, L, V, h // 8, width, use_moe)
    return fn


def m3_minimind2_layout(hidden_size, num_hidden_layers, use_moe=False, vocab_size=6400):
    h, d = hidden_size, hidden_size // 8
    return minimind3_parameters(h, num_hidden_layers, use_moe, vocab_size) - num_hidden_layers * 2 * h * 2 * d


def m3_eight_thirds(hidden_size, num_hidden_layers, use_moe=False, vocab_size=6400):
    h, L = hidden_size, num_hidden_layers
    d, width = h // 8, 64 * math.ceil(int(8 * h / 3) / 64)
    ffn = 4 * 3 * h * width + 4 * h if use_moe else 3 * h * width
    return L * (2 * h * 8 * d + 2 * h * 4 * d + 2 * d + 2 * h + ffn) + vocab_size * h + h


def m3_the_published_number(hidden_size, num_hidden_layers, use_moe=False, vocab_size=6400):
    return 198_416_640 if use_moe else 63_912_192


def m3_built(hidden_size, num_hidden_layers, use_moe=False, vocab_size=6400):  # counts a model instead of deriving
    from minimind_ref import MiniMindConfig
    return count_parameters(MiniMindConfig(generation="minimind-3", hidden_size=hidden_size, use_moe=use_moe,
                                           num_hidden_layers=num_hidden_layers, vocab_size=vocab_size,
                                           head_dim=hidden_size // 8))


@pytest.mark.parametrize("fn, fragment", [
    (m3_minimind2_layout, "MiniMind2's 2 KV heads"),
    (m3_eight_thirds, "MiniMind2's 8/3 width rule"),
    (_m3_plus(lambda h, L, V, d, w, moe: -L * 2 * d), "the QK-norm gains left out"),
    (_m3_plus(lambda h, L, V, d, w, moe: L * 10 * d), "QK-norm gains counted per head"),
    (_m3_plus(lambda h, L, V, d, w, moe: L * 2 * (h - d)), "QK-norm gains of hidden_size values"),
    (_m3_plus(lambda h, L, V, d, w, moe: V * h), "the tied matrix counted twice"),
    (_m3_plus(lambda h, L, V, d, w, moe: -V * h), "the embedding matrix left out"),
    (_m3_plus(lambda h, L, V, d, w, moe: -2 * L * h), "the block norms left out"),
    (_m3_plus(lambda h, L, V, d, w, moe: -h), "the final norm left out"),
    (_m3_plus(lambda h, L, V, d, w, moe: L * 3 * h * w if moe else 0), "a shared expert added"),
    (_m3_plus(lambda h, L, V, d, w, moe: -L * 4 * h if moe else 0), "the router left out"),
    (_m3_plus(lambda h, L, V, d, w, moe: -L * 9 * h * w if moe else 0), "only the expert a token uses counted"),
    (m3_the_published_number, "which is not the reference's"),
    # issue 37: widths that 8 heads of hidden_size // 8 do not fill (260, 1012) catch q_proj/o_proj as hidden x hidden
    (lambda hidden_size, num_hidden_layers, use_moe=False, vocab_size=6400:
         minimind3_parameters(hidden_size, num_hidden_layers, use_moe, vocab_size)
         + num_hidden_layers * 2 * hidden_size * (hidden_size - 8 * (hidden_size // 8)),
     "this looks like q_proj and o_proj counted as hidden x hidden"),
    (lambda hidden_size, num_hidden_layers, use_moe=False, vocab_size=6400:
         minimind3_parameters(hidden_size, num_hidden_layers, use_moe, vocab_size)
         + num_hidden_layers * 2 * hidden_size * (hidden_size // 2 - 4 * (hidden_size // 8)),
     "this looks like k_proj and v_proj counted as hidden x hidden / 2"),
    (_m3_plus(lambda h, L, V, d, w, moe: 0.5), "expected an int"),
    (lambda hidden_size, num_hidden_layers: 0, "your function raised TypeError"),
    (m3_built, "your function built a MiniMindForCausalLM"),
])
def test_count3_mistakes_are_named(fn, fragment):
    assert_names(ch05.check_minimind3_parameters, fn, fragment, label="Exercise 5.5 minimind3_parameters")


def test_count3_reference_matches_upstreams_code():
    """63,912,192 and 198,416,640: upstream's own count of its default configurations (the shipped file)."""
    from minimind_ref.checkpoint import upstream_reference_outputs
    counts = upstream_reference_outputs()["parameter_counts"]
    assert minimind3_parameters(768, 8) == counts["minimind-3"] == 63_912_192
    assert minimind3_parameters(768, 8, use_moe=True) == counts["minimind-3-moe"] == 198_416_640


# ---------------------------------------------------------------------- issue 44, third newcomer probe
from _helpers import check_fails  # noqa: E402
def _count_with(attn):
    def count(config, tie_word_embeddings=True):
        h, L, nh, nkv, hd, inter, V = (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
                                       config.num_key_value_heads, config.head_dim, config.intermediate_size,
                                       config.vocab_size)
        return V * h + L * (attn(h, nh, nkv, hd) + 3 * h * inter + 2 * h) + h + (0 if tie_word_embeddings else V * h)
    return count


def test_probe3_count_with_q_and_o_as_hidden_squared_is_caught():
    """Probe 3: q_proj and o_proj counted hidden x hidden passed 5.3 (every config had heads x head_dim = hidden)."""
    check_fails(ch05.check_count_parameters, _count_with(lambda h, nh, nkv, hd: 2 * h * h + 2 * h * nkv * hd),
                "this looks like q_proj and o_proj counted as hidden x hidden")
    check_fails(ch05.check_count_parameters, _count_with(lambda h, nh, nkv, hd: 2 * h * nh * hd + 2 * h * nkv),
                "this looks like k_proj and v_proj counted as hidden x num_key_value_heads")


def _minimind3_with_head_dim(head_dim):
    def count(hidden_size, num_hidden_layers, use_moe=False, vocab_size=6400):
        h, L, V = hidden_size, num_hidden_layers, vocab_size
        d = head_dim(h)
        m = 64 * math.ceil(math.pi * h / 64)
        attn = 2 * h * 8 * d + 2 * h * 4 * d + 2 * d
        ffn = (4 * 3 * h * m + 4 * h) if use_moe else 3 * h * m
        return int(V * h + L * (attn + ffn + 2 * h) + h)
    return count


@pytest.mark.parametrize("head_dim, fragment", [
    (lambda h: round(h / 8), "head_dim rounded to the nearest whole number"),  # passed: 260 and 1012 round to even
    (lambda h: math.ceil(h / 8), "head_dim rounded up"),
    (lambda h: h / 8, "head_dim kept as a fraction"),
])
def test_probe3_minimind3_head_dim_rounding_is_caught_and_named(head_dim, fragment):
    check_fails(ch05.check_minimind3_parameters, _minimind3_with_head_dim(head_dim), "this looks like " + fragment)


def test_probe3_minimind3_width_rule_message_does_not_state_the_rule():
    """The 8/3 rule's message stated minimind-3's width rule (chapter 04's Exercise 4.5) in words."""
    def eight_thirds(hidden_size, num_hidden_layers, use_moe=False, vocab_size=6400):
        h, L, V = hidden_size, num_hidden_layers, vocab_size
        d, m = h // 8, 64 * math.ceil(8 * h / 3 / 64)
        ffn = (4 * 3 * h * m + 4 * h) if use_moe else 3 * h * m
        return V * h + L * (2 * h * 8 * d + 2 * h * 4 * d + 2 * d + ffn + 2 * h) + h

    message = check_fails(ch05.check_minimind3_parameters, eight_thirds, "this looks like MiniMind2's 8/3 width rule")
    assert "pi" not in message and "multiple of 64" not in message


def test_probe3_loss_at_initialization_refuses_a_simulation():
    """Sampling the initialization with torch.rand and measuring the logits' spread was caught only by its noise."""
    def simulated(vocab_size, hidden_size):
        g = torch.Generator().manual_seed(0)
        head = (torch.rand(vocab_size, hidden_size, generator=g) * 2 - 1) / hidden_size ** 0.5
        x = torch.randn(256, hidden_size, generator=g)
        x = x / x.pow(2).mean(-1, keepdim=True).sqrt()
        return math.log(vocab_size) + (x @ head.T).var().item() / 2

    check_fails(ch05.check_loss_at_initialization, simulated, "your function calls random draws",
                "not to measure it on random draws")


@pytest.mark.parametrize("missing, fragment", [("second", "the FFN's output not added to the stream"),
                                               ("first", "the attention's output not added to the stream")])
def test_probe3_block_without_one_residual_is_named(missing, fragment):
    def block_forward(block, h, pe):
        a = block.self_attn(block.input_layernorm(h), pe)[0]
        a = a if missing == "first" else h + a
        y = block.mlp(block.post_attention_layernorm(a))
        return y if missing == "second" else a + y

    check_fails(ch05.check_block_forward, block_forward, "this looks like " + fragment)
