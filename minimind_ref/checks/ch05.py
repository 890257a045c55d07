"""Checks for chapter 05 · Assembling MiniMind.

Each check compares the learner's function with ``minimind_ref`` (``MiniMindBlock``,
``MiniMindForCausalLM``, ``count_parameters``) on inputs it makes itself, or (Exercise 5.4) with the
loss that section 8's rule gives, and reports as ``minimind_ref.checks`` describes. The counting and
predicting exercises refuse a function that builds a model or a layer (``delegation.call_without_modules``).

    from minimind_ref.checks import ch05
    ch05.check_block_forward(block_forward)                # Exercise 5.1
    ch05.check_tie_weights(tie_weights)                    # Exercise 5.2
    ch05.check_count_parameters(count_dense_parameters)    # Exercise 5.3
    ch05.check_loss_at_initialization(loss_at_initialization)  # Exercise 5.4
    ch05.check_minimind3_parameters(minimind3_parameters)  # Exercise 5.5
"""

from __future__ import annotations

import math
import operator
from typing import Callable, Dict

import torch
import torch.nn.functional as F
from torch import nn

from ..config import MiniMindConfig, default_intermediate_size, minimind2, minimind2_small
from ..model import MiniMindBlock, MiniMindForCausalLM
from ..params import count_parameters
from ..rope import precompute_freqs_cis
from .core import Outcome, as_number, call, check, check_close, check_numbers, fail, seeded, solution
from . import delegation
from .delegation import call_refusing, call_without_modules, forbid, refuse, watching

__all__ = ["check_block_forward", "check_tie_weights", "check_count_parameters", "check_loss_at_initialization",
           "check_minimind3_parameters"]

BLOCK = "Exercise 5.1 block_forward"
TIE = "Exercise 5.2 tie_weights"
COUNT = "Exercise 5.3 count_dense_parameters"
LOSS = "Exercise 5.4 loss_at_initialization"
COUNT3 = "Exercise 5.5 minimind3_parameters"


def _small(**kw) -> MiniMindConfig:
    base = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=97, max_position_embeddings=64)
    base.update(kw)
    return MiniMindConfig(**base)


def _randomize(module: nn.Module, g: torch.Generator) -> None:
    """Random weights everywhere, norm gains included (all-ones gains hide norm mix-ups)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


# ----------------------------------------------------------------------------- 5.1 block forward
BLOCK_ITSELF = forbid("the block itself, which runs MiniMindBlock.forward", MiniMindBlock.forward,
                      reason="the exercise asks you to build its output from its four sub-modules")


def _block_mistakes(block: MiniMindBlock, h: torch.Tensor, pe) -> Dict[str, Callable[[], torch.Tensor]]:
    """What the usual wrong blocks output on the same input (evaluated only when needed)."""
    n1, n2, mlp = block.input_layernorm, block.post_attention_layernorm, block.mlp

    def attn(x):
        return block.self_attn(x, pe)[0]

    def post_norm():
        a = n1(h + attn(h))
        return n2(a + mlp(a))

    def no_residual():
        return mlp(n2(attn(n1(h))))

    def residual_of_normed():
        x = n1(h)
        a = x + attn(x)
        y = n2(a)
        return y + mlp(y)

    def one_norm_twice():
        a = h + attn(n1(h))
        return a + mlp(n1(a))

    def swapped_norms():
        a = h + attn(n2(h))
        return a + mlp(n1(a))

    def parallel():
        return h + attn(n1(h)) + mlp(n2(h))

    def attention_only():
        return h + attn(n1(h))

    def no_second_residual():
        a = h + attn(n1(h))
        return mlp(n2(a))

    def no_first_residual():
        a = attn(n1(h))
        return a + mlp(n2(a))

    def ffn_only():
        return h + mlp(n2(h))

    def normalized_output():
        a = h + attn(n1(h))
        return n2(a + mlp(n2(a)))

    return {
        "post-norm: the norm is applied to the sum h + sub-layer(h); MiniMind normalizes only the "
        "sub-layer's input and leaves h itself alone": post_norm,
        "no residual connection: the sub-layer output replaces h instead of being added to it": no_residual,
        "the residual adds the sub-layer output to the normalized copy instead of to h": residual_of_normed,
        "input_layernorm used before both sub-layers (the FFN has its own norm, post_attention_layernorm)":
            one_norm_twice,
        "the two norms swapped (input_layernorm belongs to the attention, post_attention_layernorm to the FFN)":
            swapped_norms,
        "a parallel block: the FFN reads the block's input, but in MiniMind it reads h after the attention "
        "residual": parallel,
        "the FFN's output not added to the stream (the second residual connection is missing)": no_second_residual,
        "the attention's output not added to the stream (the first residual connection is missing)": no_first_residual,
        "the FFN half is missing (only h + attention)": attention_only,
        "the attention half is missing (only h + FFN)": ffn_only,
        "the block output is normalized (the stream is normalized only once, after the last block)":
            normalized_output,
    }


solution("5.1", "h = h + block.self_attn(block.input_layernorm(h), position_embeddings)[0], then "
                "h = h + block.mlp(block.post_attention_layernorm(h)); return h")


@check(BLOCK, shown=True, why="one entry of a block's output on random weights and inputs")
def check_block_forward(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(block, h, position_embeddings)`` must equal ``MiniMindBlock.forward(h, pe)[0]`` and
    leave ``h`` unchanged.

    ``block`` has upstream's sub-modules: ``input_layernorm``, ``self_attn`` (returns
    ``(out, present)``), ``post_attention_layernorm``, ``mlp``.
    """
    g = seeded(501)
    hint = ("check the three properties of the exercise one by one: what each sub-layer reads, which norm belongs to "
            "which sub-layer, and what each sub-layer's output is added to")
    for cfg, shape in [(_small(), (2, 7)), (_small(num_key_value_heads=1, hidden_size=48), (1, 12))]:
        with torch.random.fork_rng(devices=[]):
            block = MiniMindBlock(0, cfg).eval()
        _randomize(block, g)
        cos, sin = precompute_freqs_cis(cfg.head_dim, end=cfg.max_position_embeddings)
        pe = (cos[: shape[1]], sin[: shape[1]])
        h = torch.randn(*shape, cfg.hidden_size, generator=g) * 2
        case = f"hidden {cfg.hidden_size}, h of shape {tuple(h.shape)}"
        with torch.no_grad():
            expected, _ = block(h.clone(), pe)
            got = call_refusing(fn, block, h.clone(), pe, forbidden=[BLOCK_ITSELF], name=BLOCK, hint=hint, case=case,
                                check_inputs=True)
            if isinstance(got, tuple):
                fail(BLOCK, f"you returned a tuple of {len(got)} (on {case}); return only the new hidden states",
                     "self_attn returns (output, kv_cache): use its first element, and return h alone")
            check_close(got, expected, name=BLOCK, hint=hint, case=case,
                        mistakes=_block_mistakes(block, h, pe))
    return "pre-norm residual block equals minimind_ref.MiniMindBlock"


# ----------------------------------------------------------------------------- 5.2 weight tying
solution("5.2", "assign the head's Parameter to the embedding: model.model.embed_tokens.weight = model.lm_head.weight")


@check(TIE, shown=True,
       why="the check compares objects and counts a tied model's parameters, which the exercise states")
def check_tie_weights(fn: Callable[[nn.Module], object]) -> str:
    """``fn(model)`` must make ``model.model.embed_tokens`` and ``model.lm_head`` share one Parameter,
    the head's: after the call, both are the head's original matrix (as upstream ties them)."""
    hint = ("the embedding and the head must hold the very same Parameter object (one tensor, one gradient), "
            "not two tensors that happen to hold equal numbers today")
    direction = ("compare how large a fresh model's logits come out with each of the two initializations the cell "
                 "before the exercise measured")
    g = seeded(503)
    cfg = _small()
    with torch.random.fork_rng(devices=[]):
        model = MiniMindForCausalLM(cfg)
    _randomize(model, g)
    with torch.no_grad():  # untie: give the embedding its own, different matrix
        model.model.embed_tokens.weight = nn.Parameter(torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g))
    head_before = model.lm_head.weight.detach().clone()
    emb_before = model.model.embed_tokens.weight.detach().clone()
    n_before = count_parameters(model)
    call(fn, model, name=TIE, hint=hint, case="a 2-layer model whose embedding and head differ")
    emb = getattr(getattr(model.model, "embed_tokens", None), "weight", None)
    head = getattr(getattr(model, "lm_head", None), "weight", None)
    if not isinstance(emb, nn.Parameter) or not isinstance(head, nn.Parameter):
        fail(TIE, "model.model.embed_tokens.weight and model.lm_head.weight must both still be nn.Parameter "
             f"objects; got {type(emb).__name__} and {type(head).__name__}", hint)
    if emb is not head:
        if emb.shape == head.shape and torch.equal(emb.detach(), head.detach()):
            what = ("this looks like tying by copying values: embed_tokens.weight and lm_head.weight are two "
                    "different Parameter objects with equal values right now; the first optimizer step would "
                    "make them differ")
        elif torch.equal(emb.detach(), emb_before) and torch.equal(head.detach(), head_before):
            what = "nothing was tied: embed_tokens.weight and lm_head.weight are still two different Parameter objects"
        else:
            what = "embed_tokens.weight and lm_head.weight are two different Parameter objects"
        fail(TIE, what, hint)
    if not torch.equal(head.detach(), head_before):
        if torch.equal(head.detach(), emb_before):
            what = ("this looks like tying in the wrong direction: the two now share one matrix, but it holds the "
                    "embedding's initial values, so a fresh model's logits come out far too large")
        else:
            what = "the two share one matrix, but it holds neither the head's values nor the embedding's"
        fail(TIE, what, direction)
    n_after = count_parameters(model)
    if n_before - n_after != cfg.vocab_size * cfg.hidden_size:
        fail(TIE, f"tying should remove exactly vocab_size * hidden_size = {cfg.vocab_size * cfg.hidden_size:,} "
             f"parameters; the count went from {n_before:,} to {n_after:,}", hint)
    keys = set(model.state_dict())
    if not {"model.embed_tokens.weight", "lm_head.weight"} <= keys:
        fail(TIE, "the state dict lost a key; expected both model.embed_tokens.weight and lm_head.weight", hint)
    ids = torch.randint(0, cfg.vocab_size, (2, 6), generator=g)
    try:
        out = model(ids, labels=ids)
        out.loss.backward()
    except Exception as err:  # the learner replaced a module by something the model cannot run
        fail(TIE, f"the tied model no longer runs: {type(err).__name__}: {err}", hint)
    if head.grad is None:
        fail(TIE, "no gradient reached the shared matrix", hint)
    return f"one shared matrix, {cfg.vocab_size * cfg.hidden_size:,} parameters saved, both state-dict keys kept"


# ----------------------------------------------------------------------------- 5.3 parameter count
def _untied_count(cfg: MiniMindConfig) -> int:
    with torch.device("meta"):
        model = MiniMindForCausalLM(cfg)
        model.model.embed_tokens.weight = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))
    return count_parameters(model)


def _count_mistakes(cfg: MiniMindConfig, tied: bool, expected: int) -> Dict[str, int]:
    """What the usual wrong formulas give for ``cfg`` (description -> count)."""
    h, L, V, m = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.intermediate_size
    d, nq, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    mistakes = {}
    if tied:
        mistakes["the tied matrix counted twice (with tie_word_embeddings=True the embedding and the head are one "
                 "vocab x hidden matrix)"] = expected + V * h
        mistakes["the embedding matrix left out"] = expected - V * h
    else:
        mistakes["the untied head left out (tie_word_embeddings=False adds a second vocab x hidden matrix)"] = expected - V * h
        mistakes["the untied head counted twice"] = expected + V * h
    mistakes.update({
        "the RMSNorm gains left out (two per layer plus the final one, hidden parameters each)": expected - (2 * L + 1) * h,
        "the final norm left out (one more RMSNorm after the last layer)": expected - h,
        "one RMSNorm per layer instead of two (a block has input_layernorm and post_attention_layernorm)": expected - L * h,
        "k_proj and v_proj sized like q_proj (they have num_key_value_heads heads, not num_attention_heads)":
            expected + 2 * L * h * (nq - nkv) * d,
        "the FFN counted with two matrices (SwiGLU has three: gate_proj, up_proj and down_proj)": expected - L * h * m,
        "the FFN counted as a 4x-wide two-matrix MLP instead of from intermediate_size":
            expected - L * 3 * h * m + L * 8 * h * h,
        "the o_proj matrix left out (attention has four projections: q, k, v and o)": expected - L * h * nq * d,
        "q_proj and o_proj counted as hidden x hidden": expected + L * 2 * h * (h - nq * d),
        "k_proj and v_proj counted as hidden x num_key_value_heads":
            expected - L * 2 * h * nkv * (d - 1),
    })
    return mistakes


solution("5.3", "per layer: q and o are hidden x (heads * head_dim), k and v hidden x (kv_heads * head_dim), the FFN "
                "3 * hidden * intermediate, two norms of hidden; plus the embedding vocab * hidden, the final norm "
                "hidden, and a second vocab * hidden only when the head is NOT tied")


@check(COUNT, shown=False, why="the count is a closed form of the config's fields, which the case names")
def check_count_parameters(fn: Callable[..., int]) -> str:
    """``fn(config, tie_word_embeddings=True)`` must equal the number of parameters of a dense
    MiniMind built from ``config`` (with an untied head when ``tie_word_embeddings=False``)."""
    hint = ("count one layer matrix by matrix from each weight's shape, multiply by the number of layers, then add "
            "what sits outside the layers; every Linear here is bias-free and every RMSNorm has one gain per "
            "hidden unit")
    configs = [
        ("MiniMind2-Small", minimind2_small()),
        ("MiniMind2", minimind2()),
        ("small, GQA 4/2", _small()),
        ("small, MQA, odd vocab", _small(num_key_value_heads=1, vocab_size=1001, num_hidden_layers=3)),
        ("small, MHA, custom intermediate", _small(num_key_value_heads=4, intermediate_size=100, hidden_size=96)),
        # 4 heads of 24 = 96 channels at hidden 64: minimind-3's head_dim is a field of its own (QK-norm switched off,
        # so the layers hold what a MiniMind2 block holds)
        ("small, head_dim 24 set apart from hidden_size // num_attention_heads",
         _small(generation="minimind-3", qk_norm=False, head_dim=24, intermediate_size=160)),
    ]
    outcomes = []
    for label, cfg in configs:
        for tied in (True, False):
            expected = count_parameters(cfg) if tied else _untied_count(cfg)
            case = f"{label}, tie_word_embeddings={tied}"
            got = call_without_modules(fn, cfg, tie_word_embeddings=tied, name=COUNT, hint=hint, case=case,
                                        what="derive the count")
            got = as_number(got, COUNT, case, integer=True, what="a number of parameters")
            outcomes.append(Outcome(case, got, expected, _count_mistakes(cfg, tied, expected)))
    check_numbers(COUNT, outcomes, hint)
    return (f"matches minimind_ref.count_parameters for {len(configs)} configs, tied and untied (MiniMind2-Small: "
            "25,829,888)")


# ----------------------------------------------------------------------------- 5.4 the loss at initialization
def _rule(vocab: int, variance: float) -> float:
    """Section 8's rule for independent Gaussian logits of this variance: ln V + sigma^2 / 2."""
    return math.log(vocab) + variance / 2


def _init_loss(vocab: int, hidden: int) -> float:
    """The rule's value for a fresh MiniMind: the final norm's output has a mean square of 1 (gains start at 1), and
    a head entry is uniform on +-1/sqrt(hidden), of variance 1/(3 hidden): a logit sums hidden such products."""
    return _rule(vocab, hidden * (1.0 / (3 * hidden)))


def _init_loss_mistakes(vocab: int, hidden: int) -> Dict[str, float]:
    return {
        "the logits taken as all equal at initialization (their spread adds to the loss)": math.log(vocab),
        "a unit variance for the logits (the head's entries are far smaller than 1)": _rule(vocab, 1.0),
        "the embedding's initialization used for the head (the tie keeps the other one, Exercise 5.2)":
            _rule(vocab, float(hidden)),
        "the variance of one head entry used for a whole logit (a logit sums hidden_size products)":
            _rule(vocab, 1.0 / (3 * hidden)),
        "the variance of the uniform initialization taken from its half-width as if it were its full width":
            _rule(vocab, 1.0 / 12),
        "the whole variance of the logits added instead of half of it": math.log(vocab) + 1.0 / 3,
        "the spread subtracted (random logits make the expected loss larger than a uniform guess, not smaller)":
            math.log(vocab) - 1.0 / 6,
        "a logarithm to another base (the loss is in nats, the natural logarithm)": math.log2(vocab) + 1.0 / 6,
        "the standard deviation of the logits used where the rule has their variance": _rule(vocab, math.sqrt(1.0 / 3)),
    }


solution("5.4", "math.log(vocab_size) + 1 / 6: the final norm's output has a mean square of 1, a head entry is uniform "
                "on +-1/sqrt(hidden_size) with variance 1 / (3 * hidden_size), so a logit (a sum of hidden_size "
                "products) has variance 1/3 whatever the width, and sigma^2 / 2 = 1/6")


# a prediction needs no random draws: sampling the initialization and measuring the logits' spread is a measurement
SIMULATING = [forbid("random draws (torch.rand, torch.randn, torch.randint, Tensor.uniform_, Tensor.normal_, nn.init)",
                     torch.rand, torch.randn, torch.randint, torch.rand_like, torch.randn_like, torch.normal,
                     torch.Tensor.uniform_, torch.Tensor.normal_, nn.init.uniform_, nn.init.normal_,
                     nn.init.kaiming_uniform_, nn.init.xavier_uniform_,
                     reason="the exercise asks you to predict the loss from the initialization's numbers, not to "
                            "measure it on random draws")]


@check(LOSS, shown=False, why="the prediction is a closed form of the case's two numbers")
def check_loss_at_initialization(fn: Callable[..., float]) -> str:
    """``fn(vocab_size, hidden_size) -> float``: the next-token loss of a freshly initialized MiniMind (tied head, the
    head's initialization kept), predicted with section 8's rule from the spread of the logits at initialization."""
    hint = ("a logit is the dot product of the final norm's output with one row of the head's matrix: work out its "
            "variance from how the two are initialized, then use the rule of section 8")
    cases = [(6400, 128), (6400, 512), (6400, 768), (1000, 64), (50_000, 1024), (97, 32)]
    outcomes = []
    for vocab, hidden in cases:
        case = f"vocab_size={vocab}, hidden_size={hidden}"
        with watching(SIMULATING) as drawn:  # a model built is named first: it draws its initialization too
            got = call_without_modules(fn, vocab, hidden, name=LOSS, hint=hint, case=case, what="predict the loss")
        if drawn and delegation.ENFORCED:
            refuse(LOSS, drawn[0], case, hint)
        got = as_number(got, LOSS, case, integer=False, what="a loss in nats")
        outcomes.append(Outcome(case, got, _init_loss(vocab, hidden), _init_loss_mistakes(vocab, hidden)))
    check_numbers(LOSS, outcomes, hint, abs_tol=1e-3)
    return (f"{len(cases)} vocabularies and widths: the loss of a fresh model is ln V plus a term the width does not "
            "change")


# ----------------------------------------------------------------------------- 5.5 minimind-3's count
def _minimind3_config(hidden: int, layers: int, use_moe: bool, vocab: int) -> MiniMindConfig:
    # upstream's default head_dim, hidden_size // 8, given explicitly: minimind_ref asks for it when 8 heads do not
    # divide the width (upstream's MiniMindConfig takes the quotient without asking)
    return MiniMindConfig(generation="minimind-3", hidden_size=hidden, num_hidden_layers=layers, use_moe=use_moe,
                          vocab_size=vocab, head_dim=hidden // 8)


def _count3_mistakes(cfg: MiniMindConfig, expected: int) -> Dict[str, int]:
    """What the plausible wrong derivations of minimind-3's count give (description -> count)."""
    h, L, V, m = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.intermediate_size
    d, nq, nkv, E = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.n_routed_experts
    ffns = E if cfg.use_moe else 1  # FFN-shaped blocks per layer
    narrow = default_intermediate_size(h)
    mistakes = {
        "q_proj and o_proj counted as hidden x hidden (8 heads of head_dim values need not fill the width)":
            expected + L * 2 * h * (h - nq * d),
        "k_proj and v_proj counted as hidden x hidden / 2 (4 KV heads of head_dim values need not be half the width)":
            expected + L * 2 * h * (h // 2 - nkv * d),
        "every projection counted from hidden_size instead of from the heads (q_proj and o_proj hidden x hidden, k_proj "
        "and v_proj hidden x hidden / 2)": expected + L * 2 * h * (h - nq * d) + L * 2 * h * (h // 2 - nkv * d),
        "MiniMind2's 2 KV heads (minimind-3's 8 query heads share 4 KV heads, so k_proj and v_proj are twice as "
        "wide)": expected - L * 2 * h * (nkv - 2) * d,
        "MiniMind2's 8/3 width rule for the FFN (minimind-3 has its own, chapter 04's Exercise 4.5; the switch table's "
        "cell imports it as WIDTH_RULES)":
            expected - L * ffns * 3 * h * (m - narrow),
        "the QK-norm gains left out (minimind-3 normalizes queries and keys, and each RMSNorm has a gain)":
            expected - L * 2 * d,
        "QK-norm gains counted per head (one q_norm and one k_norm per layer, each of head_dim values, shared by all "
        "heads)": expected + L * (nq + nkv - 2) * d,
        "QK-norm gains of hidden_size values (they normalize one head, head_dim values)": expected + L * 2 * (h - d),
        "the tied matrix counted twice (minimind-3 ties the head to the embedding by default, "
        "tie_word_embeddings=True)": expected + V * h,
        "the embedding matrix left out": expected - V * h,
        "the block norms left out (two RMSNorm gains of hidden_size per layer)": expected - 2 * L * h,
        "the final norm left out": expected - h,
    }
    def with_head_dim(other: float) -> int:  # the count with another head width: q, o, k, v and the QK-norm gains
        return int(expected + L * (2 * h * (nq + nkv) + 2) * (other - d))

    mistakes["head_dim rounded up where hidden_size / 8 has a fraction (the exercise's head_dim drops it)"] = \
        with_head_dim(-(-h // 8))
    mistakes["head_dim rounded to the nearest whole number (the exercise's head_dim drops the fraction)"] = \
        with_head_dim(round(h / 8))
    mistakes["head_dim kept as a fraction (hidden_size / 8 need not be a whole number of channels)"] = \
        with_head_dim(h / 8)
    if cfg.use_moe:
        mistakes.update({
            "a shared expert added (MiniMind2's MoE has one; minimind-3 removed it)": expected + L * 3 * h * m,
            "the router left out (one hidden_size-vector per expert in every layer)": expected - L * h * E,
            "only the expert a token uses counted (that is the active count; the model stores every expert)":
                expected - L * (E - 1) * 3 * h * m,
        })
    return mistakes


solution("5.5", "h, L = hidden_size, num_hidden_layers; d = h // 8; width = ceil(h * pi / 64) * 64; per layer: "
                "2 * h * 8 * d (q, o) + 2 * h * 4 * d (k, v) + 2 * d (q_norm, k_norm) + 2 * h (block norms) + FFN, "
                "where FFN = 3 * h * width dense, or 4 * 3 * h * width + 4 * h (experts, router) with use_moe; "
                "total = L * per layer + vocab_size * h (tied) + h (final norm)")


@check(COUNT3, shown=False, why="the count is a closed form of the case's four numbers")
def check_minimind3_parameters(fn: Callable[..., int]) -> str:
    """``fn(hidden_size, num_hidden_layers, use_moe=False, vocab_size=6400)`` must equal the parameter count of
    upstream's minimind-3 (d65ef2c defaults) of that width and depth: the published sizes (63,912,192 dense,
    198,416,640 with experts, as upstream's code counts them) and other widths, depths and vocabularies."""
    hint = ("go through the rows in which minimind-3's defaults differ from MiniMind2's and decide for each whether it "
            "changes a weight's shape or adds a weight; keep what MiniMind2 and minimind-3 share (8 query heads, the "
            "head width derived from hidden_size as the exercise says, tied head, two norms per block and a final "
            "one), and take each weight's shape from the heads, not from hidden_size alone")
    # 260, 1012 and 262 are not multiples of 8: 8 heads of head_dim values then do not fill the width, so q_proj and
    # o_proj are not hidden x hidden, and k_proj, v_proj not hidden x hidden / 2
    cases = [(768, 8, False, 6400), (768, 8, True, 6400), (512, 8, False, 6400), (640, 4, True, 6400),
             (256, 3, False, 1000), (1024, 2, True, 997), (260, 2, False, 512), (1012, 3, True, 6400),
             (262, 2, True, 512)]  # 262 / 8 = 32.75: rounding to the nearest gives 33, the exercise's head_dim 32
    outcomes = []
    for hidden, layers, use_moe, vocab in cases:
        cfg = _minimind3_config(hidden, layers, use_moe, vocab)
        expected = count_parameters(cfg)
        case = f"hidden_size={hidden}, num_hidden_layers={layers}, use_moe={use_moe}, vocab_size={vocab}"
        got = call_without_modules(fn, hidden, layers, use_moe=use_moe, vocab_size=vocab, name=COUNT3, hint=hint,
                                    case=case, what="derive the count")
        got = as_number(got, COUNT3, case, integer=True, what="a number of parameters")
        outcomes.append(Outcome(case, got, expected, _count3_mistakes(cfg, expected)))
    check_numbers(COUNT3, outcomes, hint)
    return f"{len(cases)} sizes, dense and MoE, match upstream's count (minimind-3: 63,912,192; minimind-3-moe: 198,416,640)"
