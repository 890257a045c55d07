"""Checks for chapter 08 (Train your MiniMind): a BPE merge, the shifted loss with padding
ignored, the learning-rate schedule and one training step with gradient clipping.

Each check runs the learner's function on inputs it generates and compares with the reference in
``minimind_ref.tokenizer`` / ``minimind_ref.train``.
"""

from __future__ import annotations

import copy
import math
import random
from typing import Any, Callable

import torch

from ..config import MiniMindConfig
from ..model import MiniMindForCausalLM
from ..tokenizer import merge_pair as ref_merge_pair
from ..train import causal_lm_loss as ref_causal_lm_loss
from ..train import lr_at as ref_lr_at
from ..train import train_step as ref_train_step
from .core import call, check, check_close, fail


# ---------------------------------------------------------------------- 8.1 BPE merge
@check("Exercise 8.1 merge_pair")
def check_merge_pair(merge_pair: Callable[..., Any]) -> str:
    """``merge_pair(ids, pair, new_id)`` must equal ``minimind_ref.tokenizer.merge_pair``."""
    name = "Exercise 8.1 merge_pair"
    rng = random.Random(0)
    cases = [
        ([1, 2, 3, 1, 2], (1, 2), 99),
        ([5, 5, 5], (5, 5), 9),          # overlapping: only the first two merge
        ([5, 5, 5, 5], (5, 5), 9),
        ([1, 2], (2, 1), 7),            # no occurrence
        ([], (1, 2), 7),                # empty input
        ([3], (3, 3), 7),
        ([1, 2, 1, 2, 2, 1], (2, 1), 300),
    ]
    cases += [([rng.randrange(4) for _ in range(rng.randrange(2, 30))], (rng.randrange(4), rng.randrange(4)), 256)
              for _ in range(50)]
    for ids, pair, new_id in cases:
        got = call(merge_pair, list(ids), pair, new_id, name=name)
        expected = ref_merge_pair(ids, pair, new_id)
        if got is None or list(got) != expected:
            fail(name, f"merge_pair({ids}, {pair}, {new_id}): expected {expected}, got {got}",
                  "scan left to right; when ids[i], ids[i+1] equal the pair, append new_id and jump by 2, "
                  "else append ids[i] and move by 1. Merged pairs never overlap.")
        if ids != list(ids):
            fail(name, "the input list was modified", "build a new list instead of editing ids in place.")
    return f"{len(cases)} cases, overlaps and edge cases included"


# ---------------------------------------------------------------------- 8.2 shifted loss
@check("Exercise 8.2 causal_lm_loss")
def check_causal_lm_loss(causal_lm_loss: Callable[..., Any]) -> str:
    """``causal_lm_loss(logits, input_ids, attention_mask)``: mean next-token cross-entropy over
    positions whose *target* is a real token."""
    name = "Exercise 8.2 causal_lm_loss"
    g = torch.Generator().manual_seed(8)
    vocab = 11
    masks = [
        torch.ones(3, 7, dtype=torch.long),                                    # no padding
        torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5]),          # right padding
        torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7, [0] * 5 + [1] * 2]),      # left padding
    ]
    for mask in masks:
        logits = torch.randn(3, 7, vocab, generator=g) * 3
        ids = torch.randint(3, vocab, (3, 7), generator=g).masked_fill(mask == 0, 0)
        got = call(causal_lm_loss, logits.clone(), ids.clone(), mask.clone(), name=name)
        expected = ref_causal_lm_loss(logits, ids, mask)
        if isinstance(got, torch.Tensor) and got.dim() != 0:
            fail(name, f"expected a scalar (0-d tensor), got shape {tuple(got.shape)}",
                  "F.cross_entropy averages for you (reduction='mean'); do not return per-token losses.")
        check_close(got, expected, name=name, rtol=1e-5, atol=1e-6,
                    hint="logits[:, :-1] predict input_ids[:, 1:]; a target that is padding (attention_mask 0 at "
                         "the *target* position) is set to -100 and ignored, so it counts in neither the sum nor "
                         "the mean.")
    return "no padding, right padding and left padding"


# ---------------------------------------------------------------------- 8.3 schedule
@check("Exercise 8.3 lr_at")
def check_lr_at(lr_at: Callable[..., Any]) -> str:
    """``lr_at(step, max_steps, warmup_steps, max_lr, min_lr)`` must equal ``minimind_ref.train.lr_at``."""
    name = "Exercise 8.3 lr_at"
    settings = [(100, 10, 1e-3, 1e-4), (400, 20, 3e-3, 3e-4), (50, 0, 1.0, 0.0), (30, 30, 2e-3, 2e-4), (7, 1, 5e-4, 5e-4)]
    n = 0
    for max_steps, warmup, hi, lo in settings:
        for step in list(range(0, max_steps + 5)):
            got = call(lr_at, step, max_steps, warmup, hi, lo, name=name)
            expected = ref_lr_at(step, max_steps, warmup, hi, lo)
            n += 1
            try:
                ok = math.isclose(float(got), expected, rel_tol=1e-9, abs_tol=1e-12)
            except (TypeError, ValueError):
                ok = False
            if not ok:
                phase = "warmup" if step < warmup else ("after max_steps" if step >= max_steps else "cosine decay")
                fail(name, f"lr_at(step={step}, max_steps={max_steps}, warmup_steps={warmup}, max_lr={hi}, "
                            f"min_lr={lo}) ({phase}): expected {expected!r}, got {got!r}",
                      "warmup: max_lr * (step + 1) / warmup_steps (so step 0 is not 0); then "
                      "progress = min(1, (step - warmup_steps) / max(1, max_steps - warmup_steps)) and "
                      "min_lr + 0.5 * (max_lr - min_lr) * (1 + cos(pi * progress)).")
    return f"{n} steps over {len(settings)} schedules"


# ---------------------------------------------------------------------- 8.4 training step
def _tiny_model(use_moe: bool, seed: int) -> MiniMindForCausalLM:
    torch.manual_seed(seed)
    cfg = MiniMindConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=40, max_position_embeddings=64, use_moe=use_moe, aux_loss_alpha=0.5)
    return MiniMindForCausalLM(cfg).train()


@check("Exercise 8.4 training_step")
def check_training_step(training_step: Callable[..., Any]) -> str:
    """``training_step(model, optimizer, input_ids, labels, max_grad_norm)`` runs one step and
    returns the cross-entropy loss; after two calls the weights must equal the reference's."""
    name = "Exercise 8.4 training_step"
    g = torch.Generator().manual_seed(84)
    for use_moe in (False, True):
        mine = _tiny_model(use_moe, 1)
        ref = copy.deepcopy(mine)
        # plain SGD: the update is proportional to the gradient, so every mistake shows up in the weights
        opt_mine = torch.optim.SGD(mine.parameters(), lr=0.5)
        opt_ref = torch.optim.SGD(ref.parameters(), lr=0.5)
        kind = "MoE" if use_moe else "dense"
        for step in range(2):
            x = torch.randint(0, 40, (2, 12), generator=g)
            got = call(training_step, mine, opt_mine, x, x, 0.1, name=name)
            out = ref_train_step(ref, opt_ref, x, x, 0.1)
            if isinstance(got, torch.Tensor):
                got = got.detach().float().reshape(()) if got.numel() == 1 else got
            elif isinstance(got, (int, float)):
                got = torch.tensor(float(got))
            check_close(got, (out["loss"] - out["aux_loss"]).float(), name=name, rtol=1e-5, atol=1e-6,
                        hint="return the cross-entropy loss of this batch (out.loss), as a float or 0-d tensor.")
            for (pname, p_mine), p_ref in zip(mine.named_parameters(), ref.parameters()):
                if not torch.allclose(p_mine, p_ref, rtol=1e-5, atol=1e-6):
                    diff = float((p_mine - p_ref).detach().abs().max())
                    moe_hint = (" For a MoE model the loss to minimize is out.loss + out.aux_loss (the router's "
                                "load-balancing term).") if "gate" in pname else ""
                    fail(name, f"{kind} model, after step {step + 1}: parameter {pname} differs from the reference "
                                f"(max abs diff {diff:.3g})",
                          "order: loss = out.loss + out.aux_loss; loss.backward(); "
                          "torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm); optimizer.step(); "
                          "optimizer.zero_grad() (without it the next step adds old gradients)." + moe_hint)
    return "dense and MoE models, two steps each, clipping active"
