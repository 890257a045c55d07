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
import torch.nn.functional as F

from ..config import MiniMindConfig
from ..model import MiniMindForCausalLM
from ..tokenizer import merge_pair as ref_merge_pair
from ..train import causal_lm_loss as ref_causal_lm_loss
from ..train import lr_at as ref_lr_at
from ..train import train_step as ref_train_step
from .delegation import call_refusing
from .diagnosis import close_tensors, explaining
from .core import ExerciseError, _direction, _expect, call, check, check_close, fail, shows_expected, solution


# ---------------------------------------------------------------------- 8.1 BPE merge
def _merge_overlapping(ids, pair, new_id):
    out = []
    for i in range(len(ids)):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == tuple(pair):
            out.append(new_id)
        elif not (i > 0 and (ids[i - 1], ids[i]) == tuple(pair)):
            out.append(ids[i])
    return out


def _merge_first_only(ids, pair, new_id):
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == tuple(pair):
            return list(ids[:i]) + [new_id] + list(ids[i + 2:])
    return list(ids)


def _merge_scan(ids, pair, new_id, stop=1, look=1, step_after_merge=2):
    """The left-to-right scan with one of its bounds or steps changed (the mistakes below)."""
    out, i = [], 0
    while i < len(ids) - (stop - 1):
        if i + look < len(ids) and (ids[i], ids[i + 1]) == tuple(pair):
            out.append(new_id)
            i += step_after_merge
        else:
            out.append(ids[i])
            i += 1
    return out


def _merge_right_to_left(ids, pair, new_id):
    out, i = [], len(ids) - 1
    while i >= 0:
        if i >= 1 and (ids[i - 1], ids[i]) == tuple(pair):
            out.append(new_id)
            i -= 2
        else:
            out.append(ids[i])
            i -= 1
    return out[::-1]


def _merge_either_order(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) in (tuple(pair), tuple(pair)[::-1]):
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


MERGE_MISTAKES = {
    "merging overlapping occurrences (a token was used by two merges, so decoding would give it back twice)":
        _merge_overlapping,
    "merging only the first occurrence (every occurrence must be replaced)": _merge_first_only,
    "dropping the last token when it is not part of a merge (the scan stops one position early)":
        lambda ids, pair, new_id: _merge_scan(ids, pair, new_id, stop=2),
    "a pair at the very end of the list left unmerged (the look at the next token stops one position early)":
        lambda ids, pair, new_id: _merge_scan(ids, pair, new_id, look=2),
    "the pair's second token kept next to new_id (the two tokens of a merged pair become one)":
        lambda ids, pair, new_id: _merge_scan(ids, pair, new_id, step_after_merge=1),
    "the token after a merged pair skipped (after a merge the scan goes on with the very next token)":
        lambda ids, pair, new_id: _merge_scan(ids, pair, new_id, step_after_merge=3),
    "scanning from right to left (the merge loop and tokenizers go from the left)": _merge_right_to_left,
    "the pair matched in either order (a pair is ordered: its first token, then its second)":
        lambda ids, pair, new_id: _merge_either_order(ids, pair, new_id),
}


def _explaining(mistakes, cases, results):
    """The one mistake that reproduces the learner's result on every case, or None."""
    fits = [d for d, f in mistakes.items()
            if all(f(list(ids), pair, new_id) == got for (ids, pair, new_id), got in zip(cases, results))]
    return fits[0] if len(fits) == 1 else None


solution("8.1", "out, i = [], 0; while i < len(ids): if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair: "
                "out.append(new_id); i += 2; else: out.append(ids[i]); i += 1; return out")

MERGE = "Exercise 8.1 merge_pair"


@check(MERGE, shown=True,
       why="the merged list of a case the message names is an example of the rule, not the loop that implements it")
def check_merge_pair(merge_pair: Callable[..., Any]) -> str:
    """``merge_pair(ids, pair, new_id)`` must equal ``minimind_ref.tokenizer.merge_pair`` and
    return a new list, leaving ``ids`` unchanged."""
    name = MERGE
    if merge_pair is ref_merge_pair:
        fail(name, "this is minimind_ref's own merge_pair, not yours",
             "write the merge yourself from the two properties of the exercise")
    rng = random.Random(0)
    cases = [
        ([1, 2, 3, 1, 2, 4], (1, 2), 99),     # two occurrences, neither at an end of the list
        ([5, 5, 5], (5, 5), 9),               # overlapping
        ([5, 5, 5, 5], (5, 5), 9),
        ([1, 2], (2, 1), 7),                  # no occurrence
        ([], (1, 2), 7),                      # empty input
        ([3], (3, 3), 7),
        ([4, 1, 2], (1, 2), 256),             # the only occurrence ends the list
        ([1, 2, 7, 7], (1, 2), 256),          # the only occurrence starts the list
        ([1, 2, 1, 2, 2, 1], (2, 1), 300),
        ([4, 1, 2, 7], (1, 2), 256),          # the last token is not part of a merge
        ([6, 1, 2, 1, 2], (1, 2), 300),       # two occurrences, the second at the end
    ]
    cases += [([rng.randrange(4) for _ in range(rng.randrange(2, 30))], (rng.randrange(4), rng.randrange(4)), 256)
              for _ in range(50)]
    hint = ("decode your result (each id as the bytes it stands for) and compare with the input; go through a case "
            "by hand, from left to right, and look at the first and the last positions")
    results = []
    for ids, pair, new_id in cases:
        case = f"merge_pair({ids}, {pair}, {new_id})"
        got = call_refusing(merge_pair, list(ids), pair, new_id, forbidden=(ref_merge_pair,), name=name, case=case,
                             check_inputs=True, hint=hint)
        if got is None:
            fail(name, f"{case} returned None", "build the merged list and return it (did you forget `return`?).")
        try:
            results.append(list(got))
        except TypeError:
            fail(name, f"{case} returned a {type(got).__name__}, not a list of ids", "return the merged ids as a list.")
    wrong = [(c, got) for c, got in zip(cases, results) if got != ref_merge_pair(*c)]
    if wrong:
        (ids, pair, new_id), got = wrong[0]
        seen = _explaining(MERGE_MISTAKES, cases, results)
        fail(name, (f"this looks like {seen}: " if seen else "") +
             f"merge_pair({ids}, {pair}, {new_id}): expected {ref_merge_pair(ids, pair, new_id)}, got {got} "
             f"({len(wrong)} of {len(cases)} cases differ)", hint)
    return f"{len(cases)} cases, overlaps and both ends of the list included, input left unchanged"


# ---------------------------------------------------------------------- 8.2 shifted loss
def _ce(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def _loss_mistakes(logits, ids, mask):
    per = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none")
    return {
        "no shift (position t is compared with token t, which it can see, instead of token t + 1)":
            lambda: _ce(logits, ids.masked_fill(mask == 0, -100)),
        "padding counted as targets (the padded targets are not set to -100)":
            lambda: _ce(logits[:, :-1], ids[:, 1:]),
        "the mask applied to the predicting position instead of the target":
            lambda: _ce(logits[:, :-1], ids[:, 1:].masked_fill(mask[:, :-1] == 0, -100)),
        "padded terms zeroed but the mean taken over every position":
            lambda: (per * mask[:, 1:].reshape(-1)).sum() / per.numel(),
        "the shift in the wrong direction (each position scored against the token before it)":
            lambda: _ce(logits[:, 1:], ids[:, :-1].masked_fill(mask[:, :-1] == 0, -100)),
        "a term kept only when both its predicting position and its target are real":
            lambda: _ce(logits[:, :-1], ids[:, 1:].masked_fill((mask[:, :-1] == 0) | (mask[:, 1:] == 0), -100)),
        "each row averaged on its own, then the rows averaged":
            lambda: ((per.view(ids.shape[0], -1) * mask[:, 1:]).sum(1) / mask[:, 1:].sum(1)).mean(),
        "the kept terms summed instead of averaged": lambda: (per * mask[:, 1:].reshape(-1)).sum(),
    }


solution("8.2", "labels = input_ids.masked_fill(attention_mask == 0, -100); compare logits[:, :-1] with "
                "labels[:, 1:] in F.cross_entropy(..., ignore_index=-100).")


@check("Exercise 8.2 causal_lm_loss", shown=True,
       why="a loss over random logits: nothing to read the formula back from")
def check_causal_lm_loss(causal_lm_loss: Callable[..., Any]) -> str:
    """``causal_lm_loss(logits, input_ids, attention_mask)``: mean next-token cross-entropy over
    positions whose *target* is a real token."""
    name = "Exercise 8.2 causal_lm_loss"
    if causal_lm_loss is ref_causal_lm_loss:
        fail(name, "this is minimind_ref's own causal_lm_loss, not yours",
             "write the loss yourself from the contract of the exercise")
    g = torch.Generator().manual_seed(8)
    vocab = 11
    masks = {
        "no padding": torch.ones(3, 7, dtype=torch.long),
        "right padding": torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5]),
        "left padding": torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7, [0] * 5 + [1] * 2]),
    }
    hint = ("write out the terms of one padded row, each a predicting position and its target, and mark the ones "
            "upstream's labels remove; a removed term leaves both the sum and the count.")
    outcomes, cases = [], []
    for label, mask in masks.items():
        logits = torch.randn(3, 7, vocab, generator=g) * 3
        ids = torch.randint(3, vocab, (3, 7), generator=g).masked_fill(mask == 0, 0)
        case = f"a batch with {label}, logits [3, 7, {vocab}]"
        got = call_refusing(causal_lm_loss, logits.clone(), ids.clone(), mask.clone(), forbidden=(ref_causal_lm_loss,),
                             name=name, case=case, check_inputs=True,
                   hint="logits is [batch, seq, vocab] and input_ids [batch, seq]: the cross-entropy compares one row "
                        "of vocab scores with one target id per term.")
        expected = ref_causal_lm_loss(logits, ids, mask)
        if isinstance(got, torch.Tensor) and got.dim() != 0:
            fail(name, f"expected a scalar (0-d tensor), got shape {tuple(got.shape)} ({case})",
                 "F.cross_entropy averages for you (reduction='mean'); do not return per-token losses.")
        outcomes.append((got, expected, _loss_mistakes(logits, ids, mask)))
        cases.append(case)
    same = close_tensors(1e-5, 1e-6)
    wrong = [i for i, (got, expected, _) in enumerate(outcomes)
             if not (isinstance(got, torch.Tensor) and same(got.reshape(()), expected))]
    if wrong:
        first = wrong[0]
        mistakes = outcomes[first][2]
        computed = [{d: f() for d, f in m.items()} for _, _, m in outcomes]
        seen = explaining({d: (lambda i, d=d: computed[i][d]) for d in mistakes}, list(range(len(outcomes))),
                          [got.detach().reshape(()) if isinstance(got, torch.Tensor) else got for got, _, _ in outcomes],
                          [e for _, e, _ in outcomes], first, same=same)
        got, expected, _ = outcomes[first]
        check_close(got, expected, name=name, rtol=1e-5, atol=1e-6, case=cases[first],
                    mistakes={seen: computed[first][seen]} if seen else None, hint=hint)
    return "no padding, right padding and left padding"


# ---------------------------------------------------------------------- 8.3 schedule
def _warmup(step, warmup, hi):
    return hi * (step + 1) / warmup


def _decay(s, T, w, hi, lo, shape, cap=True):
    """The schedule with the decay phase's formula replaced by ``shape(progress, hi, lo)``; the warmup and every
    step after max_steps as the reference has them (``cap=False``: the progress goes on past 1)."""
    if s < w:
        return _warmup(s, w, hi)
    progress = (s - w) / max(1, T - w)
    if s > T and cap:
        return ref_lr_at(s, T, w, hi, lo)
    return shape(min(1.0, progress) if cap else progress, hi, lo)


# each description with the variants a learner writes for it (the steps after max_steps kept at min_lr, or the
# phase's formula carried on there); the mistake is named when one of them explains every schedule
LR_MISTAKES = [
    ("a warmup that starts at 0 (step 0 would not move the weights)",
     lambda s, T, w, hi, lo: hi * s / w if s < w else ref_lr_at(s, T, w, hi, lo)),
    ("a cosine that decays to 0 instead of to min_lr",
     lambda s, T, w, hi, lo: _decay(s, T, w, hi, lo, lambda p, hi, lo: 0.5 * hi * (1 + math.cos(math.pi * p)))),
    ("a cosine that decays to 0 instead of to min_lr",
     lambda s, T, w, hi, lo: _warmup(s, w, hi) if s < w else
     0.5 * hi * (1 + math.cos(math.pi * min(1.0, (s - w) / max(1, T - w))))),
    ("progress not capped at 1 (after max_steps the rate climbs back up)",
     lambda s, T, w, hi, lo: _warmup(s, w, hi) if s < w else
     lo + 0.5 * (hi - lo) * (1 + math.cos(math.pi * (s - w) / max(1, T - w)))),
    ("a cosine over all steps that ignores the warmup offset (progress = step / max_steps)",
     lambda s, T, w, hi, lo: _warmup(s, w, hi) if s < w else
     lo + 0.5 * (hi - lo) * (1 + math.cos(math.pi * min(1.0, s / max(1, T))))),
    ("a warmup that reaches max_lr one step late (the last warmup step, warmup_steps - 1, is already at max_lr)",
     lambda s, T, w, hi, lo: hi * (s + 1) / (w + 1) if s < w else ref_lr_at(s, T, w, hi, lo)),
    ("the progress through the decay measured over max_steps instead of over the decay phase's own length",
     lambda s, T, w, hi, lo: _warmup(s, w, hi) if s < w else
     lo + 0.5 * (hi - lo) * (1 + math.cos(math.pi * min(1.0, (s - w) / max(1, T))))),
    ("upstream MiniMind's own schedule (a cosine from lr down to a tenth of it, no warmup) instead of the exercise's",
     lambda s, T, w, hi, lo: hi * (0.1 + 0.45 * (1 + math.cos(math.pi * s / T)))),
    ("the cosine's own range (from 1 down to -1) not mapped onto the range from max_lr down to min_lr",
     lambda s, T, w, hi, lo: _decay(s, T, w, hi, lo, lambda p, hi, lo: lo + (hi - lo) * math.cos(math.pi * p))),
    ("the cosine's own range (from 1 down to -1) not mapped onto the range from max_lr down to min_lr",
     lambda s, T, w, hi, lo: _decay(s, T, w, hi, lo, lambda p, hi, lo: hi * math.cos(math.pi * p))),
    ("a quarter period of the cosine instead of half a period (the rate must reach min_lr at max_steps)",
     lambda s, T, w, hi, lo: _decay(s, T, w, hi, lo, lambda p, hi, lo: lo + (hi - lo) * math.cos(math.pi / 2 * p))),
    ("step max_steps run at min_lr in a schedule without a decay phase (step warmup_steps runs at max_lr, even when "
     "it is max_steps)",
     lambda s, T, w, hi, lo: lo if s >= T and s >= w else ref_lr_at(s, T, w, hi, lo)),
]


solution("8.3", "warmup: max_lr * (step + 1) / warmup_steps; then progress = min(1, (step - warmup_steps) / "
                "max(1, max_steps - warmup_steps)) and min_lr + 0.5 * (max_lr - min_lr) * (1 + cos(pi * progress)).")


@check("Exercise 8.3 lr_at", shown=False,
       why="the rate at a step is a closed form of the step and the settings the case names")
def check_lr_at(lr_at: Callable[..., Any]) -> str:
    """``lr_at(step, max_steps, warmup_steps, max_lr, min_lr)`` must equal ``minimind_ref.train.lr_at``
    on whole schedules (relative tolerance 1e-9)."""
    name = "Exercise 8.3 lr_at"
    if lr_at is ref_lr_at:
        fail(name, "this is minimind_ref's own lr_at (the setup of an older edition imported it), not yours",
             "write the schedule yourself from the properties the exercise lists")
    settings = [(100, 10, 1e-3, 1e-4), (400, 20, 3e-3, 3e-4), (50, 0, 1.0, 0.0), (30, 30, 2e-3, 2e-4), (7, 1, 5e-4, 5e-4),
                (4, 3, 2e-3, 1e-3)]
    n = 0

    def same(a, b):
        try:
            return all(math.isclose(float(x), y, rel_tol=1e-9, abs_tol=1e-15) for x, y in zip(a, b))
        except (TypeError, ValueError):
            return False

    runs = []  # (settings, steps, got, expected) of every schedule, up to the first that raises after a wrong one
    for max_steps, warmup, hi, lo in settings:
        steps = list(range(0, max_steps + 5))
        case = f"max_steps={max_steps}, warmup_steps={warmup}, max_lr={hi}, min_lr={lo}"
        expected = [ref_lr_at(s, max_steps, warmup, hi, lo) for s in steps]
        try:
            got = [call_refusing(lr_at, s, max_steps, warmup, hi, lo, forbidden=(ref_lr_at,), name=name,
                                  case=f"step={s}, {case}",
                                  hint="after the warmup you need the progress through the decay phase; mind a decay "
                                       "phase of zero steps.") for s in steps]
        except ExerciseError:
            if any(not same(r[2], r[3]) for r in runs):
                break  # an earlier schedule is already wrong: report that one, with what explains it
            raise
        n += len(steps)
        runs.append(((max_steps, warmup, hi, lo), steps, got, expected))
    bad_runs = [r for r in runs if not same(r[2], r[3])]
    if bad_runs:
        (max_steps, warmup, hi, lo), steps, got, expected = bad_runs[0]
        case = f"max_steps={max_steps}, warmup_steps={warmup}, max_lr={hi}, min_lr={lo}"

        def schedule(f, r):
            try:
                return [f(s, *r[0]) for s in r[1]]
            except (ArithmeticError, ValueError):
                return None

        seen = next((d for d, f in LR_MISTAKES
                     if all((v := schedule(f, r)) is not None and same(r[2], v) for r in runs)
                     and not same(schedule(f, bad_runs[0]) or [], expected)), None)
        if seen is None:  # none explains every schedule: the one mistake, if only one, that explains this one
            here = {d for d, f in LR_MISTAKES if (v := schedule(f, bad_runs[0])) is not None and same(got, v)
                    and not same(v, expected)}
            seen = here.pop() if len(here) == 1 else None
        bad = [i for i, s in enumerate(steps) if not same([got[i]], [expected[i]])]
        worst = max(bad, key=lambda i: abs(float(got[i]) - expected[i]) if isinstance(got[i], (int, float)) else math.inf)
        s = steps[worst]
        phase = "warmup" if s < warmup else ("after max_steps" if s >= max_steps else "cosine decay")
        value = float(got[worst]) if isinstance(got[worst], (int, float)) else None
        if shows_expected(name) or value is None:
            what = f"expected {expected[worst]!r}, got {got[worst]!r}"
        else:
            what = f"got {got[worst]!r}: {_direction(value, expected[worst])}"
        _expect(expected[worst])
        fail(name, (f"this looks like {seen}. " if seen else "") +
             f"With {case}, {len(bad)} of {len(steps)} steps differ; the largest difference is at step {s} "
             f"({phase}): {what}",
             "check the three phases separately: step 0 of the warmup, the first step after it (max_lr), and the "
             "last steps (min_lr, and it must stay there after max_steps).")
    return f"every step of {len(settings)} schedules ({n} steps)"


# ---------------------------------------------------------------------- 8.4 training step
def _tiny_model(use_moe: bool, seed: int) -> MiniMindForCausalLM:
    torch.manual_seed(seed)
    cfg = MiniMindConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=40, max_position_embeddings=64, use_moe=use_moe, aux_loss_alpha=0.5)
    return MiniMindForCausalLM(cfg).train()


def _step_variant(aux: bool = True, clip: str = "before", zero: bool = True, clip_norm=None):
    """The reference step with known mistakes planted: the aux loss left out (``aux=False``), clipping
    ``"none"`` or ``"after"`` the optimizer's step, gradients never cleared (``zero=False``), or a fixed
    ``clip_norm``."""
    def step(model, optimizer, x, y, max_norm):
        out = model(x, labels=y)
        loss = out.loss + out.aux_loss if aux else out.loss
        loss.backward()
        norm = max_norm if clip_norm is None else clip_norm
        if clip == "before":
            torch.nn.utils.clip_grad_norm_(model.parameters(), norm)
        elif clip == "value":
            torch.nn.utils.clip_grad_value_(model.parameters(), norm)
        elif clip == "each":
            for p in model.parameters():
                torch.nn.utils.clip_grad_norm_([p], norm)
        optimizer.step()
        if clip == "after":
            torch.nn.utils.clip_grad_norm_(model.parameters(), norm)
        if zero:
            optimizer.zero_grad()
        return out.loss.item()
    return step


_UNCLIPPED = ("gradients applied unclipped: no clipping, or the clipping done after the optimizer's step (the update "
              "already used the full-size gradients)")
_CLIP_AFTER = "the clipping done after the optimizer's step (the update used the full-size gradients)"
_NO_ZERO = "gradients never cleared (the second step added the first step's gradients again)"
_NO_AUX = "the MoE auxiliary loss left out (only out.loss was minimised, the router got no balancing gradient)"


def _step_mistakes():
    """(description, variant) for every mix of the draft's three flaws, single flaws first, then the fixed clip norm."""
    out = []
    for n_flaws in (1, 2, 3):
        for aux in (True, False):
            for clip in ("before", "none", "after"):
                for zero in (True, False):
                    flaws = (not aux) + (clip != "before") + (not zero)
                    if flaws != n_flaws or (clip == "none" and not zero):
                        continue  # no clipping and clipping after the step without clearing differ: keep "after"
                    parts = []
                    if clip != "before":
                        parts.append(_UNCLIPPED if zero else _CLIP_AFTER)
                    if not zero:
                        parts.append(_NO_ZERO)
                    if not aux:
                        parts.append(_NO_AUX)
                    out.append(("; and ".join(parts), dict(aux=aux, clip=clip, zero=zero)))
    out.append(("clipping to a fixed norm of 1.0 instead of max_grad_norm", dict(clip_norm=1.0)))
    out.append(("every gradient entry clipped on its own to max_grad_norm, instead of the norm of all the gradients "
                "together", dict(clip="value")))
    out.append(("each parameter's gradient clipped to max_grad_norm on its own, instead of the norm of all the "
                "gradients together", dict(clip="each")))
    return out


solution("8.4", "loss = out.loss + out.aux_loss; loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(), "
                "max_grad_norm); optimizer.step(); optimizer.zero_grad().")


@check("Exercise 8.4 training_step", shown=True,
       why="the message shows the weights' difference after two steps, not their values")
def check_training_step(training_step: Callable[..., Any]) -> str:
    """``training_step(model, optimizer, input_ids, labels, max_grad_norm)`` runs one step and
    returns the cross-entropy loss; after two calls the weights must equal the reference's."""
    name = "Exercise 8.4 training_step"
    returned_tensor = ""
    for use_moe in (True, False):  # the MoE model first: it tells every flaw of the draft apart
        kind = "MoE" if use_moe else "dense"
        batches = [torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(84 + i)) for i in range(2)]

        def run(step_fn, reference=False):
            model = _tiny_model(use_moe, 1)
            # plain SGD: the update is proportional to the gradient, so every mistake shows up in the weights
            opt = torch.optim.SGD(model.parameters(), lr=0.5)
            losses, totals = [], []
            for x in batches:
                if reference:
                    out = ref_train_step(model, opt, x, x, 0.1)  # its "loss" is what was minimised: CE + aux
                    losses.append(float(out["loss"] - out["aux_loss"]))
                    totals.append(float(out["loss"]))
                else:
                    losses.append(step_fn(model, opt, x, x, 0.1))
            return model, (losses, totals)

        mine = _tiny_model(use_moe, 1)
        opt_mine = torch.optim.SGD(mine.parameters(), lr=0.5)
        ref, (ref_losses, ref_totals) = run(None, reference=True)
        got_losses, left_behind = [], None
        for i, x in enumerate(batches):
            got = call_refusing(training_step, mine, opt_mine, x, x, 0.1, forbidden=(ref_train_step,), name=name,
                                 case=f"the {kind} model, step {i + 1}",
                                 hint="for each call of the draft, ask what it needs to have happened before it and "
                                      "what it changes.")
            kept = [pname for pname, p in mine.named_parameters() if p.grad is not None and bool(p.grad.any())]
            if kept and left_behind is None:
                left_behind = (i + 1, kept)
            if isinstance(got, torch.Tensor) and not returned_tensor:
                returned_tensor = f"the {kind} model, step {i + 1}"
            if isinstance(got, torch.Tensor):
                got = got.detach().float().reshape(()) if got.numel() == 1 else got
            elif isinstance(got, (int, float)):
                got = torch.tensor(float(got))
            got_losses.append(got)

        def check_loss(i):
            check_close(got_losses[i], torch.tensor(ref_losses[i]), name=name, rtol=1e-5, atol=1e-6,
                        case=f"the {kind} model, step {i + 1}",
                        mistakes={"returning the total minimised loss (the cross-entropy plus the MoE auxiliary term) "
                                  "instead of the cross-entropy":
                                  torch.tensor(ref_totals[i])} if use_moe else None,
                        hint="return the cross-entropy of this batch (out.loss) as a float or a 0-d tensor: the MoE "
                             "auxiliary term is minimised too, but it is not the loss you report.")

        # step 1's loss comes before any update; step 2's depends on the update, which is judged first
        check_loss(0)
        differs = [(pname, float((a - b).detach().abs().max())) for (pname, a), b in zip(mine.named_parameters(), ref.parameters())
                   if not torch.allclose(a, b, rtol=1e-5, atol=1e-6)]
        if differs:
            seen = None
            for description, flaws in _step_mistakes():
                model, _ = run(_step_variant(**flaws))
                if all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(mine.parameters(), model.parameters())):
                    seen = description
                    break
            pname, diff = differs[0]
            fail(name, (f"this looks like {seen}. " if seen else "") +
                 f"{kind} model, after two steps: {len(differs)} parameters differ from the reference "
                 f"(first {pname}, max abs diff {diff:.3g})",
                 "compare what the optimizer applied at each step with what clipping promises (a bounded update) and "
                 "with the loss the step must minimise; PyTorch keeps adding new gradients into .grad.")
        if left_behind is not None:  # the updates were right, so .grad was cleared, only at the wrong time
            step, kept = left_behind
            fail(name, f"this looks like the gradients cleared at the start of the step instead of after it: after your "
                 f"step returned ({kind} model, step {step}), .grad still held gradients ({len(kept)} parameters, "
                 f"first {kept[0]}); the step must leave nothing in .grad for the next one (the cell after the exercise "
                 "measures that too)",
                 "for each call of the draft, ask what it needs to have happened before it and what it changes.")
        check_loss(1)
    if returned_tensor:
        fail(name, f"your step returns the loss as a tensor (on {returned_tensor}); the exercise asks for a Python float: "
             "a tensor that requires grad keeps the whole graph of the step alive for as long as the caller holds it",
             "return the number itself, detached from autograd")
    return "MoE and dense models, two steps each, clipping active"
