"""Checks for chapter 05 · Assembling MiniMind.

Each ``check_*`` runs the learner's function on inputs it makes itself (with its own random
generator, so the notebook's random stream is untouched), compares with ``minimind_ref`` and
prints one ``✓`` line, or raises ``AssertionError`` saying what was expected, what came back and
what to try.

    from minimind_ref.checks import ch05
    ch05.check_block_forward(block_forward)
    ch05.check_count_parameters(count_dense_parameters)
    ch05.check_tie_weights(tie_weights)
    ch05.check_shifted_cross_entropy(shifted_cross_entropy)
"""

from __future__ import annotations

import operator
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..config import MiniMindConfig, minimind2, minimind2_small
from ..model import MiniMindBlock, MiniMindForCausalLM
from ..params import count_parameters
from ..rope import precompute_freqs_cis
from .core import ExerciseError, call, check, check_close, check_equal, seeded

__all__ = ["check_block_forward", "check_count_parameters", "check_tie_weights", "check_shifted_cross_entropy"]


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
@check("block_forward")
def check_block_forward(fn: Callable[..., torch.Tensor]) -> str:
    """``fn(block, h, position_embeddings)`` must equal ``MiniMindBlock.forward(h, pe)[0]``.

    ``block`` has upstream's sub-modules: ``input_layernorm``, ``self_attn`` (returns
    ``(out, present)``), ``post_attention_layernorm``, ``mlp``.
    """
    name = "block_forward"
    g = seeded(501)
    hint = ("pre-norm: h = h + self_attn(input_layernorm(h), position_embeddings)[0], then "
            "h = h + mlp(post_attention_layernorm(h)). Normalize the *input* of each sub-layer and add its "
            "output to the un-normalized residual stream; never normalize the sum.")
    for cfg, shape in [(_small(), (2, 7)), (_small(num_key_value_heads=1, hidden_size=48), (1, 12))]:
        block = MiniMindBlock(0, cfg).eval()
        _randomize(block, g)
        cos, sin = precompute_freqs_cis(cfg.head_dim, end=cfg.max_position_embeddings)
        pe = (cos[: shape[1]], sin[: shape[1]])
        h = torch.randn(*shape, cfg.hidden_size, generator=g) * 2
        with torch.no_grad():
            expected, _ = block(h.clone(), pe)
            got = call(fn, block, h.clone(), pe, name=name)
        if isinstance(got, tuple):
            raise ExerciseError(f"[{name}] you returned a tuple of {len(got)}; return only the new hidden states.\n"
                                "  hint: self_attn returns (output, kv_cache); take [0] of it, and return h alone.")
        check_close(got, expected, name=f"{name} (hidden {cfg.hidden_size}, h {tuple(h.shape)})", hint=hint)
    return "pre-norm residual block equals minimind_ref.MiniMindBlock"


# ----------------------------------------------------------------------------- 5.2 parameter count
def _untied_count(cfg: MiniMindConfig) -> int:
    with torch.device("meta"):
        model = MiniMindForCausalLM(cfg)
        model.model.embed_tokens.weight = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))
    return count_parameters(model)


@check("count_parameters")
def check_count_parameters(fn: Callable[..., int]) -> str:
    """``fn(config, tie_word_embeddings=True)`` must equal the number of parameters of a dense
    MiniMind built from ``config`` (with an untied head when ``tie_word_embeddings=False``)."""
    name = "count_parameters"
    hint = ("per layer: q/o are hidden x (heads * head_dim), k/v hidden x (kv_heads * head_dim), the FFN "
            "3 * hidden * intermediate, two RMSNorm gains of hidden; plus the embedding vocab * hidden, the "
            "final norm hidden, and a second vocab * hidden only when the head is NOT tied.")
    configs = [
        ("MiniMind2-Small", minimind2_small()),
        ("MiniMind2", minimind2()),
        ("small, GQA 4/2", _small()),
        ("small, MQA, odd vocab", _small(num_key_value_heads=1, vocab_size=1001, num_hidden_layers=3)),
        ("small, MHA, custom intermediate", _small(num_key_value_heads=4, intermediate_size=100, hidden_size=96)),
    ]
    for label, cfg in configs:
        for tied in (True, False):
            expected = count_parameters(cfg) if tied else _untied_count(cfg)
            got = call(fn, cfg, tie_word_embeddings=tied, name=name)
            if isinstance(got, bool) or not isinstance(got, int):
                try:
                    got = operator.index(got)
                except TypeError:
                    raise ExerciseError(f"[{name}] expected an int, got {type(got).__name__} {got!r}.\n"
                                        "  hint: use integer arithmetic (//, *), or int(...) at the end.") from None
            if got != expected:
                diff = got - expected
                extra = ""
                if abs(diff) == cfg.vocab_size * cfg.hidden_size:
                    extra = " (off by exactly vocab_size * hidden_size: the embedding/lm_head matrix)"
                elif abs(diff) == (2 * cfg.num_hidden_layers + 1) * cfg.hidden_size:
                    extra = " (off by exactly the RMSNorm gains: 2 per layer + the final one)"
                raise ExerciseError(f"[{name}] {label}, tie_word_embeddings={tied}: expected {expected:,}, got "
                                    f"{got:,}, a difference of {diff:+,}{extra}.\n  hint: {hint}")
    return "matches minimind_ref.count_parameters for 5 configs, tied and untied (MiniMind2-Small: 25,829,888)"


# ----------------------------------------------------------------------------- 5.3 weight tying
@check("tie_weights")
def check_tie_weights(fn: Callable[[nn.Module], object]) -> str:
    """``fn(model)`` must make ``model.model.embed_tokens`` and ``model.lm_head`` share one Parameter,
    the head's: after the call, both are the head's original matrix (as upstream ties them)."""
    name = "tie_weights"
    hint = ("assign the Parameter object itself, not its values: model.model.embed_tokens.weight = "
            "model.lm_head.weight. Copying (.data.copy_, clone) gives two matrices that drift apart in training.")
    g = seeded(503)
    cfg = _small()
    model = MiniMindForCausalLM(cfg)
    _randomize(model, g)
    with torch.no_grad():  # untie: give the embedding its own, different matrix
        model.model.embed_tokens.weight = nn.Parameter(torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g))
    head_before = model.lm_head.weight.detach().clone()
    n_before = count_parameters(model)
    call(fn, model, name=name)
    emb, head = model.model.embed_tokens.weight, model.lm_head.weight
    if emb is not head:
        same_values = emb.shape == head.shape and torch.equal(emb.detach(), head.detach())
        raise ExerciseError(
            f"[{name}] embed_tokens.weight and lm_head.weight are two different Parameter objects"
            + (" (with equal values right now)" if same_values else "") + f".\n  hint: {hint}")
    if not torch.equal(head.detach(), head_before):
        raise ExerciseError(
            f"[{name}] the two are shared, but the shared matrix is the embedding's old values, not the head's.\n"
            "  hint: as upstream does, the head's matrix wins: model.model.embed_tokens.weight = model.lm_head.weight "
            "(not the other way round).")
    n_after = count_parameters(model)
    check_equal(n_before - n_after, cfg.vocab_size * cfg.hidden_size, name=f"{name} (parameters saved)", hint=hint)
    keys = set(model.state_dict())
    if not {"model.embed_tokens.weight", "lm_head.weight"} <= keys:
        raise ExerciseError(f"[{name}] the state dict lost a key; expected both model.embed_tokens.weight and "
                            f"lm_head.weight.\n  hint: {hint}")
    # one optimizer step through the embedding changes the head too
    ids = torch.randint(0, cfg.vocab_size, (2, 6), generator=g)
    out = model(ids, labels=ids)
    out.loss.backward()
    if head.grad is None or emb.grad is None:
        raise ExerciseError(f"[{name}] no gradient reached the shared matrix.\n  hint: {hint}")
    return f"one shared matrix, {cfg.vocab_size * cfg.hidden_size:,} parameters saved, both state-dict keys kept"


# ----------------------------------------------------------------------------- 5.4 shifted loss
@check("shifted_cross_entropy")
def check_shifted_cross_entropy(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> str:
    """``fn(logits [b, s, V], labels [b, s])`` must equal MiniMind's next-token loss: position ``i``
    predicts ``labels[i + 1]``; label ``-100`` is ignored; mean over the remaining positions."""
    name = "shifted_cross_entropy"
    hint = ("drop the last position of the logits and the first of the labels: "
            "F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1), ignore_index=-100).")
    g = seeded(504)
    # against the reference model's own loss
    cfg = _small()
    torch.manual_seed(504)
    model = MiniMindForCausalLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (3, 9), generator=g)
    labels = ids.clone()
    labels[0, :3] = -100  # e.g. a prompt that is not trained on
    labels[2, -2:] = -100  # e.g. padding
    with torch.no_grad():
        out = model(ids, labels=labels)
    got = call(fn, out.logits, labels, name=name)
    if isinstance(got, torch.Tensor) and got.shape != ():
        raise ExerciseError(f"[{name}] expected a scalar (shape ()), got shape {tuple(got.shape)}.\n  hint: {hint}")
    check_close(got, out.loss, name=f"{name} (MiniMindForCausalLM's loss, labels with -100)", hint=hint)
    # random logits, several shapes, with and without ignored labels
    for b, s, v, n_ignored in [(2, 5, 11, 0), (1, 2, 7, 0), (4, 16, 33, 10)]:
        logits = torch.randn(b, s, v, generator=g) * 3
        labels = torch.randint(0, v, (b, s), generator=g)
        if n_ignored:
            flat = labels.view(-1)
            flat[torch.randperm(flat.numel(), generator=g)[:n_ignored]] = -100
        expected = F.cross_entropy(logits[:, :-1].reshape(-1, v), labels[:, 1:].reshape(-1), ignore_index=-100)
        got = call(fn, logits.clone(), labels.clone(), name=name)
        check_close(got, expected, name=f"{name} (logits {tuple(logits.shape)}, {n_ignored} labels -100)", hint=hint)
    return "position i predicts label i+1, -100 ignored, equals MiniMindForCausalLM's loss"
