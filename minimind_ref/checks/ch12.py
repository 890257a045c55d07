"""Checks for chapter 12 (GRPO): group-relative advantages (c090b69's two normalisations and
d65ef2c's one), the completion mask, the policy losses (value and gradient): c090b69's, PPO's clip
with a rollout's old log-probabilities, and CISPO (d65ef2c's default); and choosing the group size
from a measured success rate.

Each check runs the learner's function on inputs it generates (a group whose rewards are all
equal, rows without an end marker, tokens after the end marker, several betas) and compares
with ``minimind_ref.grpo``; a mismatch names the known mistake it matches when it can.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import torch

from .. import grpo as ref_grpo
from .core import call, check, check_close, fail, seeded, solution


# ---------------------------------------------------------------------- 12.1 advantages
def _rewards_case(seed: int, groups: int, size: int, flat_group: bool) -> torch.Tensor:
    """Rewards of 0, 0.25, ..., 1.5 with a spread in every group but (optionally) the last; a group
    of 102 or more with one success reaches the +-10 clamp ((G - 1) / sqrt(G) > 10)."""
    g = seeded(seed)
    rewards = torch.randint(0, 2, (groups, size), generator=g).float()
    rewards[:, 0], rewards[:, 1] = 1.0, 0.0  # every group has a spread ...
    rewards = rewards + 0.25 * torch.randint(0, 3, (groups, size), generator=g).float()
    if flat_group:
        rewards[-1] = 1.0  # ... except this one: no signal
    return rewards.flatten()


def _lone_success_case(size: int) -> torch.Tensor:
    """Two groups of ``size``: the first has one reward 1 and the others 0, whose z-score is
    (G - 1) / sqrt(G), above 10 for G >= 102, so upstream's clamp acts; the second is half 1, half 0
    (z-scores near +-1). Two groups of different shapes keep the clamp visible after the batch
    normalisation (a batch of two distinct values would standardise to the same numbers either way)."""
    rewards = torch.zeros(2, size)
    rewards[0, 3] = 1.0
    rewards[1, 1::2] = 1.0
    return rewards.flatten()


solution("12.1", "g = rewards.view(-1, G); a = ((rewards - g.mean(1).repeat_interleave(G)) / "
                 "(g.std(1).repeat_interleave(G) + 1e-4)).clamp(-10, 10); return (a - a.mean()) / (a.std() + 1e-8)")


@check("Exercise 12.1 group_advantages")
def check_group_advantages(group_advantages: Callable[..., Any]) -> str:
    """``group_advantages(rewards [N], num_generations) -> [N]``: c090b69's two normalisations
    (per group with the unbiased std, + 1e-4, clamped to +-10; then over the whole batch, + 1e-8);
    ``check_advantages_once`` checks d65ef2c's."""
    name = "Exercise 12.1 group_advantages"
    cases = [(_rewards_case(seed + 1, groups, size, flat), size,
              f"{groups} group(s) of {size}" + (", the last group's rewards all equal" if flat else ""))
             for seed, (groups, size, flat) in enumerate([(3, 4, True), (2, 8, False), (4, 2, False), (1, 6, False)])]
    lone = 128
    cases.append((_lone_success_case(lone), lone, f"2 groups of {lone}, one of them with a single success (its "
                  f"z-score is {(lone - 1) / lone ** 0.5:.1f}: the clamp acts)"))
    for rewards, size, case in cases:
        got = call(group_advantages, rewards.clone(), size, name=name, case=case, check_inputs=True)
        expected = ref_grpo.group_advantages(rewards, size, **ref_grpo.C090B69_ADVANTAGES)
        grouped = rewards.view(-1, size)
        mean = grouped.mean(1).repeat_interleave(size)
        std = grouped.std(1).repeat_interleave(size)

        def batch_norm(a: torch.Tensor) -> torch.Tensor:
            return (a - a.mean()) / (a.std() + 1e-8)

        mistakes: Dict[str, Any] = {
            "the clamp to [-10, 10] left out (upstream clamps the group z-scores before the batch normalisation)":
                lambda: batch_norm((rewards - mean) / (std + 1e-4)),
            "only the per-group normalisation: upstream normalises the advantages again over the whole batch":
                lambda: torch.clamp((rewards - mean) / (std + 1e-4), -10, 10),
            "one mean and std over the whole batch instead of per group (no groups: plain reward normalisation)":
                lambda: batch_norm(torch.clamp((rewards - rewards.mean()) / (rewards.std() + 1e-4), -10, 10)),
            "rewards minus the group mean, not divided by the group std":
                lambda: batch_norm(rewards - mean),
            "the group statistics taken over the wrong axis (view(num_generations, -1): rows are grouped "
            "num_generations at a time, in sampling order)":
                lambda: batch_norm(torch.clamp((rewards - rewards.view(size, -1).mean(0).repeat(size))
                                               / (rewards.view(size, -1).std(0).repeat(size) + 1e-4), -10, 10)),
        }
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and bool(torch.isnan(got).any()):
            fail(name, f"your advantages have NaN ({case})",
                 "A group whose rewards are all equal has std 0: (r - mean) / std is 0 / 0. Upstream keeps the "
                 "denominator away from 0 with a small constant, so that group gets advantage 0 (no signal).")
        check_close(got, expected, name=name, rtol=1e-5, atol=1e-5, check_dtype=False, mistakes=mistakes, case=case,
                    hint="two normalisations, as the chapter lists them: first each group's z-score (the rows of "
                         "one prompt sit next to each other; torch's default, unbiased std), then the whole batch "
                         "again; mind the constants that keep each denominator away from 0 and the clamp.")
    return "groups of 2 to 128, a group with no spread, a lone success the clamp cuts"


# ---------------------------------------------------------------------- 12.2 completion mask
def _completion_case(seed: int, rows: int, length: int, eos: int) -> torch.Tensor:
    """Rows with the end marker at various places, tokens (not only the marker) after it, a
    second marker later in one row, and one row without a marker."""
    g = seeded(seed)
    ids = torch.randint(eos + 1, eos + 20, (rows, length), generator=g)
    for r in range(rows - 1):
        ids[r, int(torch.randint(0, length, (1,), generator=g))] = eos
    ids[0, 0] = eos  # stops at once: the mask keeps only the marker
    ids[1, -1] = eos  # a second marker after the first
    return ids


solution("12.2", "is_eos = ids == eos; idx = torch.full((N,), R); has = is_eos.any(1); "
                 "idx[has] = is_eos.int().argmax(1)[has]; return (torch.arange(R) <= idx[:, None]).int()")


@check("Exercise 12.2 completion_mask")
def check_completion_mask(completion_mask: Callable[..., Any]) -> str:
    """``completion_mask(completion_ids [N, R], eos_token_id) -> [N, R]`` (int): 1 up to and
    including each row's first end marker; a row without one is kept whole (upstream)."""
    name = "Exercise 12.2 completion_mask"
    for seed, (rows, length, eos) in enumerate([(5, 9, 2), (4, 6, 7), (3, 12, 0)]):
        ids = _completion_case(seed + 1, rows, length, eos)
        case = f"{rows} rows of {length} tokens, end marker id {eos}"
        got = call(completion_mask, ids.clone(), eos, name=name, case=case, check_inputs=True)
        expected = ref_grpo.completion_mask(ids, eos)
        pos = torch.arange(length).expand(rows, -1)
        first = (ids == eos).int().argmax(1, keepdim=True)
        has = (ids == eos).any(1, keepdim=True)
        last = length - 1 - (ids == eos).int().flip(1).argmax(1, keepdim=True)
        mistakes: Dict[str, Any] = {
            "the end marker itself left out (positions < first marker): upstream keeps it, so the model learns to stop":
                lambda: torch.where(has, pos < first, torch.ones_like(pos, dtype=torch.bool)).int(),
            "a row without an end marker masked to its first token only (argmax of an all-zero row is 0): "
            "upstream keeps such a row whole":
                lambda: (pos <= first).int(),
            "every token that is not the end marker (ids != eos): tokens after the first marker count, the marker does not":
                lambda: (ids != eos).int(),
            "up to the last end marker instead of the first":
                lambda: torch.where(has, pos <= last, torch.ones_like(pos, dtype=torch.bool)).int(),
        }
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and got.dtype == torch.bool:
            got = got.int()
        check_close(got, expected, name=name, rtol=0, atol=0, check_dtype=False, mistakes=mistakes, case=case,
                    hint="find each row's first end marker; the mask is 1 up to and including it. Mind the rows "
                         "without a marker: argmax of an all-zero row is 0.")
    return "markers first, last, repeated and missing"


# ---------------------------------------------------------------------- 12.3 the loss
def _loss_case(seed: int, rows: int, length: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = seeded(seed)
    ref = -torch.rand(rows, length, generator=g) * 3
    lp = ref + 0.5 * torch.randn(rows, length, generator=g)
    adv = torch.randn(rows, generator=g)
    mask = torch.zeros(rows, length, dtype=torch.int)
    for r in range(rows):
        mask[r, : int(torch.randint(1, length + 1, (1,), generator=g))] = 1
    return lp, ref, adv, mask


solution("12.3", "kl = torch.exp(ref - lp) - (ref - lp) - 1; t = -(torch.exp(lp - lp.detach()) * adv[:, None] "
                 "- beta * kl); return ((t * mask).sum(1) / mask.sum(1)).mean()")


def _gradient_mistakes(forms: Dict[str, Callable[[torch.Tensor], torch.Tensor]], lp: torch.Tensor
                       ) -> Dict[str, Callable[[], torch.Tensor]]:
    """For ``check_close``'s ``mistakes``: each planted loss form's gradient with respect to a fresh
    gradient-tracking copy of ``lp`` (zeros where the form does not depend on it)."""
    out: Dict[str, Callable[[], torch.Tensor]] = {}
    for k, f in forms.items():
        p = lp.clone().requires_grad_(True)
        loss = f(p)
        out[k] = (lambda loss=loss, p=p: torch.autograd.grad(loss, p, allow_unused=True)[0]
                  if loss.requires_grad else torch.zeros_like(lp))
    return out


@check("Exercise 12.3 grpo_loss")
def check_grpo_loss(grpo_loss: Callable[..., Any]) -> str:
    """``grpo_loss(per_token_logps, ref_per_token_logps, advantages, completion_mask, beta)``:
    c090b69's loss (ratio ``exp(lp - lp.detach())``; d65ef2c's ``grpo_loss(lp, lp.detach(), ...,
    loss_type="grpo")``), value and gradient with respect to ``per_token_logps``."""
    name = "Exercise 12.3 grpo_loss"
    for seed, (rows, length, beta) in enumerate([(4, 7, 0.04), (6, 5, 0.5), (3, 9, 0.0), (5, 8, 2.0)]):
        lp, ref, adv, mask = _loss_case(seed + 1, rows, length)
        case = f"{rows} completions, beta={beta}, unequal lengths"
        pol = lp.clone().requires_grad_(True)
        got = call(grpo_loss, pol, ref.clone(), adv.clone(), mask.clone(), beta, name=name, case=case,
                   check_inputs=True)
        if not isinstance(got, torch.Tensor) or got.dim() != 0:
            fail(name, f"expected a scalar tensor, got {type(got).__name__} {tuple(getattr(got, 'shape', ()))} ({case})",
                 "average over each completion's masked tokens, then over the completions.")
        m = mask.float()

        def kl(p: torch.Tensor) -> torch.Tensor:
            return torch.exp(ref - p) - (ref - p) - 1

        def seq(t: torch.Tensor) -> torch.Tensor:
            return ((t * m).sum(1) / m.sum(1)).mean()

        def ratio(p: torch.Tensor) -> torch.Tensor:
            return torch.exp(p - p.detach())

        forms: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
            "the KL term with the wrong sign (-(ratio * A + beta * kl)): the penalty must be subtracted from the objective":
                lambda p: seq(-(ratio(p) * adv[:, None] + beta * kl(p))),
            "the KL estimator the other way round (d = lp - ref): k3 estimates KL(pi || pi_ref) with d = ref - lp":
                lambda p: seq(-(ratio(p) * adv[:, None] - beta * (torch.exp(p - ref) - (p - ref) - 1))),
            "one average over all masked tokens of the batch (token-level): upstream averages per completion, then over completions":
                lambda p: ((-(ratio(p) * adv[:, None] - beta * kl(p))) * m).sum() / m.sum(),
            "no mask: tokens after the end marker counted":
                lambda p: (-(ratio(p) * adv[:, None] - beta * kl(p))).mean(),
            "the objective maximised as a loss (missing the minus sign in front)":
                lambda p: seq(ratio(p) * adv[:, None] - beta * kl(p)),
            "exp(lp - lp) or exp(0): the ratio must be exp(lp - lp.detach()), whose value is 1 but whose gradient is the policy gradient":
                lambda p: seq(-(torch.ones_like(p) * adv[:, None] - beta * kl(p))),
        }
        expected = ref_grpo.grpo_loss(lp, lp.detach(), ref, adv, mask, beta, loss_type="grpo")
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and bool(torch.isnan(got)):
            fail(name, f"your loss is NaN ({case})", "divide each completion's masked sum by its mask's sum.")
        mistakes = {k: (lambda f=f: f(lp).detach()) for k, f in forms.items()}
        check_close(got.detach(), expected, name=name, rtol=1e-5, atol=1e-6, check_dtype=False, mistakes=mistakes,
                    case=case, hint="the per-token term of the chapter's loss (the policy-gradient ratio times the "
                    "advantage, minus beta times k3); average over each completion's mask, then over completions.")
        if not got.requires_grad:
            fail(name, f"your loss has no gradient with respect to per_token_logps ({case})",
                 "do not detach lp or call .item(): the loss must stay in the graph. Only the ratio's denominator is detached.")
        (grad,) = torch.autograd.grad(got, pol, allow_unused=True)
        if grad is None:
            fail(name, f"your loss does not depend on per_token_logps: its gradient with respect to them is None "
                 f"({case}); was lp detached (.detach(), .item(), torch.tensor(...)) on the way?",
                 "compute the loss from per_token_logps itself; only the ratio's denominator is detached.")
        p2 = lp.clone().requires_grad_(True)
        (expected_grad,) = torch.autograd.grad(ref_grpo.grpo_loss(p2, p2.detach(), ref, adv, mask, beta, loss_type="grpo"), p2)
        grad_mistakes = _gradient_mistakes(forms, lp)
        check_close(grad, expected_grad, name=name + " (gradient)", rtol=1e-5, atol=1e-6, check_dtype=False,
                    mistakes=grad_mistakes, case=case,
                    hint="the value can be right while the gradient is not: the advantage term's gradient is "
                         "-A * grad lp / |mask| per token, which needs exp(lp - lp.detach()), not a constant 1.")
    return "value and gradient, beta from 0 to 2"



# ---------------------------------------------------------------------- 12.4 d65ef2c's advantages
solution("12.4", "g = rewards.view(-1, G); return (rewards - g.mean(1).repeat_interleave(G)) / "
                 "(g.std(1, unbiased=False).repeat_interleave(G) + 1e-4)")


@check("Exercise 12.4 group_advantages (d65ef2c)")
def check_advantages_once(group_advantages: Callable[..., Any]) -> str:
    """``group_advantages(rewards [N], num_generations) -> [N]``: d65ef2c's one normalisation,
    ``(r - group mean) / (group std + 1e-4)`` with the population std (``unbiased=False``), no
    clamp, no second normalisation over the batch."""
    name = "Exercise 12.4 group_advantages (d65ef2c)"
    for seed, (groups, size, flat) in enumerate([(3, 6, True), (2, 8, False), (4, 2, False), (1, 6, False)]):
        rewards = _rewards_case(seed + 21, groups, size, flat)
        case = f"{groups} group(s) of {size}" + (", the last group's rewards all equal" if flat else "")
        got = call(group_advantages, rewards.clone(), size, name=name, case=case, check_inputs=True)
        expected = ref_grpo.group_advantages(rewards, size)
        grouped = rewards.view(-1, size)
        mean = grouped.mean(1).repeat_interleave(size)
        pop = grouped.std(1, unbiased=False).repeat_interleave(size)
        sample = grouped.std(1).repeat_interleave(size)
        mistakes: Dict[str, Any] = {
            "the sample std (unbiased, divides by G - 1): d65ef2c takes the population std (unbiased=False)":
                lambda: (rewards - mean) / (sample + 1e-4),
            "a second normalisation over the whole batch (c090b69's recipe: sample std, clamp to +-10, then "
            "(a - a.mean()) / a.std()): d65ef2c normalises once":
                lambda: ref_grpo.group_advantages(rewards, size, **ref_grpo.C090B69_ADVANTAGES),
            "rewards minus the group mean, not divided by the group std": lambda: rewards - mean,
        }
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and bool(torch.isnan(got).any()):
            fail(name, f"your advantages have NaN ({case})",
                 "A group whose rewards are all equal has std 0: add 1e-4 to the std, so that group gets advantage 0.")
        check_close(got, expected, name=name, rtol=1e-5, atol=1e-5, check_dtype=False, mistakes=mistakes, case=case,
                    hint="view(-1, num_generations): one row per group; mean and std(unbiased=False) per row, "
                         "repeat_interleave back to [N]; (r - mean) / (std + 1e-4), and nothing more.")
    return "groups of 2 to 8, a group with no spread"


# ---------------------------------------------------------------------- 12.5 / 12.6 PPO's clip and CISPO
def _ratio_case(seed: int, rows: int, length: int) -> Tuple[torch.Tensor, ...]:
    """``(lp, old, ref, adv, mask)`` with ratios ``exp(lp - old)`` from about 0.2 to 5 and beyond."""
    lp, ref, adv, mask = _loss_case(seed, rows, length)
    g = seeded(seed + 50)
    old = lp + 0.8 * torch.randn(rows, length, generator=g)
    return lp, old, ref, adv, mask


def _check_policy_loss(fn: Callable[..., Any], name: str, loss_type: str) -> str:
    for seed, (rows, length, beta, eps, eps_high) in enumerate([(4, 7, 0.1, 0.2, 5.0), (6, 5, 0.0, 0.1, 1.5),
                                                                  (3, 9, 0.5, 0.3, 2.0), (5, 8, 0.04, 0.2, 5.0)]):
        lp, old, ref, adv, mask = _ratio_case(seed + 31, rows, length)
        knob = eps if loss_type == "grpo" else eps_high
        case = f"{rows} completions, beta={beta}, {'epsilon' if loss_type == 'grpo' else 'epsilon_high'}={knob}"
        pol = lp.clone().requires_grad_(True)
        got = call(fn, pol, old.clone(), ref.clone(), adv.clone(), mask.clone(), beta, knob, name=name, case=case)
        if not isinstance(got, torch.Tensor) or got.dim() != 0:
            fail(name, f"expected a scalar tensor, got {type(got).__name__} {tuple(getattr(got, 'shape', ()))} ({case})",
                 "average over each completion's masked tokens, then over the completions.")

        def loss(p: torch.Tensor, lt: str = loss_type, e: float = eps, eh: float = eps_high,
                 b: float = beta, o: torch.Tensor = old) -> torch.Tensor:
            return ref_grpo.grpo_loss(p, o, ref, adv, mask, b, loss_type=lt, epsilon=e, epsilon_high=eh)

        m = mask.float()
        seq = lambda t: ((t * m).sum(1) / m.sum(1).clamp_min(1)).mean()  # noqa: E731
        kl = lambda p: torch.exp(ref - p) - (ref - p) - 1  # noqa: E731
        ratio = lambda p: torch.exp(p - old)  # noqa: E731
        a = adv[:, None]
        if loss_type == "grpo":
            forms: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
                "max instead of min of the two surrogates: PPO keeps the smaller (pessimistic) one":
                    lambda p: seq(-(torch.max(ratio(p) * a, torch.clamp(ratio(p), 1 - eps, 1 + eps) * a) - beta * kl(p))),
                "only the clipped term (clamp(ratio) * A): the min with the unclipped term is what lets a ratio "
                "move back towards 1":
                    lambda p: seq(-(torch.clamp(ratio(p), 1 - eps, 1 + eps) * a - beta * kl(p))),
                "no clipping at all (ratio * A)": lambda p: seq(-(ratio(p) * a - beta * kl(p))),
                "the ratio against the current policy (exp(lp - lp.detach())): the old log-probabilities come from "
                "the rollout, so the ratio differs from 1":
                    lambda p: loss(p, o=p.detach()),
                "CISPO's clamped, detached ratio times the log-probability: that is loss_type='cispo'":
                    lambda p: loss(p, lt="cispo", eh=eps_high),
                "the ratio the other way round (exp(old - lp))":
                    lambda p: seq(-(torch.min(torch.exp(old - p) * a, torch.clamp(torch.exp(old - p), 1 - eps, 1 + eps) * a)
                                    - beta * kl(p))),
            }
            hint = ("ratio = exp(lp - old); per token -(min(ratio * A, clamp(ratio, 1 - eps, 1 + eps) * A) - beta * k3); "
                    "average over each row's mask (count clamped at 1), then over rows.")
        else:
            forms = {
                "the ratio not detached: CISPO's weight carries no gradient, only log pi does":
                    lambda p: seq(-(torch.clamp(ratio(p), max=eps_high) * a * p - beta * kl(p))),
                "the ratio clamped on both sides (PPO's [1 - eps, 1 + eps]): CISPO only caps it above at epsilon_high":
                    lambda p: seq(-(torch.clamp(ratio(p), 1 - 0.2, eps_high).detach() * a * p - beta * kl(p))),
                "no cap on the ratio (exp(lp - old) as it is)": lambda p: seq(-(ratio(p).detach() * a * p - beta * kl(p))),
                "the ratio left out (A * lp, plain REINFORCE)": lambda p: seq(-(a * p - beta * kl(p))),
                "PPO's clipped surrogate: that is loss_type='grpo'": lambda p: loss(p, lt="grpo", e=0.2),
                "the KL term with the wrong sign": lambda p: seq(-(torch.clamp(ratio(p), max=eps_high).detach() * a * p
                                                                   + beta * kl(p))),
            }
            hint = ("ratio = exp(lp - old); per token -(clamp(ratio, max=epsilon_high).detach() * A * lp - beta * k3); "
                    "average over each row's mask, then over rows.")
        expected = loss(lp.detach())
        mistakes = {k: (lambda f=f: f(lp).detach()) for k, f in forms.items()}
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and bool(torch.isnan(got)):
            fail(name, f"your loss is NaN ({case})", "divide each completion's masked sum by its mask's sum.")
        check_close(got.detach(), expected, name=name, rtol=1e-5, atol=1e-6, check_dtype=False, mistakes=mistakes,
                    case=case, hint=hint)
        if not got.requires_grad:
            fail(name, f"your loss has no gradient with respect to per_token_logps ({case})",
                 "do not detach lp or call .item(): the loss must stay in the graph.")
        (grad,) = torch.autograd.grad(got, pol)
        p2 = lp.clone().requires_grad_(True)
        (expected_grad,) = torch.autograd.grad(loss(p2), p2)
        grad_mistakes = _gradient_mistakes(forms, lp)
        check_close(grad, expected_grad, name=name + " (gradient)", rtol=1e-5, atol=1e-6, check_dtype=False,
                    mistakes=grad_mistakes, case=case, hint="the value can be right while the gradient is not: "
                    "which factors are detached decides the gradient.")
    return "value and gradient, ratios from 0.2 to 5, beta from 0 to 0.5"


solution("12.5", "r = torch.exp(lp - old); t = -(torch.min(r * adv[:, None], r.clamp(1 - eps, 1 + eps) * "
                 "adv[:, None]) - beta * (torch.exp(ref - lp) - (ref - lp) - 1)); "
                 "return ((t * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()")
solution("12.6", "w = torch.exp(lp - old).clamp(max=eps_high).detach(); t = -(w * adv[:, None] * lp - beta * "
                 "(torch.exp(ref - lp) - (ref - lp) - 1)); return ((t * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()")


@check("Exercise 12.5 ppo_clip_loss")
def check_ppo_clip_loss(ppo_clip_loss: Callable[..., Any]) -> str:
    """``ppo_clip_loss(per_token_logps, old_per_token_logps, ref_per_token_logps, advantages,
    completion_mask, beta, epsilon)``: d65ef2c's ``--loss_type grpo`` (``grpo.grpo_loss(...,
    loss_type="grpo")``), value and gradient."""
    return _check_policy_loss(ppo_clip_loss, "Exercise 12.5 ppo_clip_loss", "grpo")


@check("Exercise 12.6 cispo_loss")
def check_cispo_loss(cispo_loss: Callable[..., Any]) -> str:
    """``cispo_loss(per_token_logps, old_per_token_logps, ref_per_token_logps, advantages,
    completion_mask, beta, epsilon_high)``: d65ef2c's default ``--loss_type cispo``
    (``grpo.grpo_loss(..., loss_type="cispo")``), value and gradient."""
    return _check_policy_loss(cispo_loss, "Exercise 12.6 cispo_loss", "cispo")


# ---------------------------------------------------------------------- 12.7 choosing the group size
def no_signal_probability_reference(p: float, group_size: int) -> float:
    """Chance that a group of ``group_size`` samples with success probability ``p`` (a 0/1 reward)
    has all-equal rewards, so its advantages are all 0: ``p**G + (1 - p)**G``."""
    return p ** group_size + (1 - p) ** group_size


def smallest_group_reference(p: float, max_no_signal: float, largest: int = 64) -> int:
    """The smallest group size ``G >= 2`` whose no-signal chance is at most ``max_no_signal``."""
    for g in range(2, largest + 1):
        if no_signal_probability_reference(p, g) <= max_no_signal:
            return g
    return largest


solution("12.7", "return next(G for G in range(2, 65) if p**G + (1 - p)**G <= max_no_signal)")


@check("Exercise 12.7 smallest_group")
def check_smallest_group(smallest_group: Callable[..., Any]) -> str:
    """``smallest_group(p, max_no_signal) -> int``: given a measured success rate ``p`` of the
    sampled replies, the smallest group size ``G >= 2`` for which a group's rewards are all equal
    (no signal: every advantage 0) with probability at most ``max_no_signal``."""
    name = "Exercise 12.7 smallest_group"
    cases = [(0.5, 0.1), (0.9, 0.2), (0.1, 0.5), (0.45, 0.05), (0.97, 0.5), (0.3, 0.3)]
    for p, limit in cases:
        case = f"p={p}, max_no_signal={limit}"
        got = call(smallest_group, p, limit, name=name, case=case)
        expected = smallest_group_reference(p, limit)
        if isinstance(got, bool) or not isinstance(got, int):
            fail(name, f"expected an int group size, got {type(got).__name__} {got!r} ({case})", "return the G itself.")
        if got == expected:
            continue
        mistakes = {
            "only the all-wrong case counted ((1 - p)**G): a group where every sample is right carries no signal "
            "either": next((g for g in range(2, 65) if (1 - p) ** g <= limit), 64),
            "the chance that at least one sample differs taken for the no-signal chance":
                next((g for g in range(2, 65) if 1 - no_signal_probability_reference(p, g) <= limit), 64),
            "one more than needed (the first G that satisfies the bound is the answer)": expected + 1,
        }
        seen = [k for k, v in mistakes.items() if v == got]
        fail(name, f"expected {expected}, got {got} ({case})" + (f"; this looks like {seen[0]}" if seen else ""),
             "a group of G 0/1 rewards is all equal when all G samples are right (p**G) or all wrong ((1 - p)**G); "
             "try G = 2, 3, ... until p**G + (1 - p)**G <= max_no_signal.")
    return f"{len(cases)} success rates and bounds"
