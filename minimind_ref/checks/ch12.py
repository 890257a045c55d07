"""Checks for chapter 12 (GRPO): the factor between c090b69's two normalisations of the advantages and
d65ef2c's one (12.1, predicted and measured), the completion mask, c090b69's policy loss (debugged from a
draft; value and gradient), d65ef2c's advantages (predicted on a group with a lone success, then
implemented), which tokens PPO's clip silences (checked with autograd), CISPO (d65ef2c's default; which
factors carry the gradient; value and gradient), and choosing the group size from a measured success rate.

Each check runs the learner's function on inputs it generates (a group whose rewards are all
equal, rows without an end marker, tokens after the end marker, several betas) and compares
with ``minimind_ref.grpo``; a mismatch names the known mistake it matches when it can.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import torch

import math

from .. import grpo as ref_grpo
from .core import ExerciseError, Outcome, _on, as_number, call, check, check_close, check_numbers, fail, seeded, solution
from .delegation import forbid, guarded
from .diagnosis import close_tensors, explaining


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


def rescale_factor_reference(num_groups: int, groups_with_spread: int, group_size: int) -> float:
    """The factor between c090b69's advantages and d65ef2c's on a batch of ``num_groups`` groups of ``group_size``
    rewards, ``groups_with_spread`` of them not all equal (no clamp acting, the small constants left out).

    Each group's z-scores have mean 0, so the batch mean is 0, and sum of squares ``G`` with the population std
    (0 in a group without a spread): the batch's unbiased variance is ``k G / (N - 1)``, and dividing by its root
    rescales every advantage by ``sqrt((N - 1) / (k G))``. The group std's own factor (unbiased or not) cancels:
    the batch normalisation divides any common factor out."""
    n = num_groups * group_size
    return math.sqrt((n - 1) / (groups_with_spread * group_size))


solution("12.1", "n = num_groups * group_size; return math.sqrt((n - 1) / (groups_with_spread * group_size))")


def _measured_factor(num_groups: int, groups_with_spread: int, group_size: int, seed: int) -> float:
    """c090b69's advantages over d65ef2c's (``grpo.group_advantages``) on random rewards of that shape: rewards of 0,
    0.25, ..., 1.5 with a spread in the first ``groups_with_spread`` groups, all equal (each group its own value) in
    the others, in shuffled group order; measured on the largest advantage."""
    g = seeded(seed)
    rewards = torch.randint(0, 7, (num_groups, group_size), generator=g).float() / 4
    for k in range(num_groups):
        if k < groups_with_spread:
            rewards[k, 0], rewards[k, 1] = 1.5, 0.0
        else:
            rewards[k] = rewards[k, 0]
    rewards = rewards[torch.randperm(num_groups, generator=g)].flatten()
    once = ref_grpo.group_advantages(rewards, group_size)
    twice = ref_grpo.group_advantages(rewards, group_size, **ref_grpo.C090B69_ADVANTAGES)
    at = int(once.abs().argmax())
    return float(twice[at] / once[at])


def _rescale_mistakes(num_groups: int, k: int, size: int) -> Dict[str, float]:
    n = num_groups * size
    return {
        "every group counted, those without a spread too": math.sqrt((n - 1) / (num_groups * size)),
        "the batch's std taken as the population std": math.sqrt(n / (k * size)),
        "the factor upside down": math.sqrt(k * size / (n - 1)),
        "a variance where a standard deviation belongs (no square root)": (n - 1) / (k * size),
        "the unbiased group std's own factor kept": math.sqrt((n - 1) / (k * (size - 1))),
        "only the factor between a group's unbiased and population std": math.sqrt(size / (size - 1)),
    }


def _rescale_cases() -> list:
    """(num_groups, groups_with_spread, group_size): every group with a spread and few of them, small and larger
    groups, pairs of 2; none large enough for the clamp to act."""
    return [(3, 1, 4), (5, 2, 6), (2, 2, 16), (8, 5, 2), (6, 6, 3), (10, 1, 4), (4, 3, 8),
            # batches of 10^12 rewards and more: no simulation reaches them, only the rule
            (10**6, 3 * 10**5, 10**6), (2 * 10**9, 10**9, 1000)]


MEASURED_UP_TO = 10**6  # rewards in a batch the check measures with grpo.group_advantages; larger ones the rule answers
# measuring the factor (the package's normalisation, a simulation's standard deviations) answers nothing
MEASURING = "the exercise asks you to predict the factor from the three numbers, not to measure it on rewards"


@check("Exercise 12.1 rescale_factor", shown=False,
       why="the factor is a closed form of the case's three numbers: the measured value next to them would be the answer")
def check_rescale_factor(rescale_factor: Callable[..., Any]) -> str:
    """``rescale_factor(num_groups, groups_with_spread, group_size) -> float``: predict by how much c090b69's two
    normalisations scale d65ef2c's advantages on such a batch. The check measures the factor with
    ``grpo.group_advantages`` on random rewards of each shape (relative tolerance 1e-3: the constants 1e-4 and 1e-8
    in the denominators move it a little)."""
    name = "Exercise 12.1 rescale_factor"
    learner = guarded(rescale_factor, name, [
        forbid("minimind_ref.grpo.group_advantages", ref_grpo.group_advantages, reason=MEASURING),
        forbid("a standard deviation of rewards (torch.std, torch.var)", torch.std, torch.var, torch.std_mean,
               torch.var_mean, torch.Tensor.std, torch.Tensor.var, reason=MEASURING),
        forbid("ch12.rescale_factor_reference", rescale_factor_reference)])
    outcomes = []
    for seed, (groups, k, size) in enumerate(_rescale_cases()):
        case = f"{groups:,} groups of {size:,}, {k:,} of them with a spread"
        got = call(learner, groups, k, size, name=name, case=case)
        got = as_number(got, name, case, integer=False, what="the factor")
        expected = (_measured_factor(groups, k, size, seed) if groups * size <= MEASURED_UP_TO
                    else rescale_factor_reference(groups, k, size))
        outcomes.append(Outcome(case, got, expected, _rescale_mistakes(groups, k, size)))
    check_numbers(name, outcomes, hint="after the first normalisation, what are the mean and the sum of squares of the "
                  "advantages of one group, with a spread and without one? The second normalisation divides by the "
                  "standard deviation of the batch.", rel_tol=1e-3)
    return f"{len(outcomes)} batches of 2 to 2e9 groups, predicted, and measured where a batch fits in memory"


# ---------------------------------------------------------------------- 12.2 completion mask
def _completion_case(seed: int, rows: int, length: int, eos: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(completion_ids, pad_mask)``: rows with the end marker at various places and tokens (not only the marker)
    after it; a row that stops at once; a second marker later in a row; a row without a marker; and rows a rollout
    engine padded to the batch's width with the end marker itself (``pad_mask`` 0 there): one that stopped before
    its padding, one cut by the engine with no marker of its own, whose padding holds markers all the same."""
    g = seeded(seed)
    ids = torch.randint(eos + 1, eos + 20, (rows, length), generator=g)
    pad = torch.ones(rows, length, dtype=torch.long)
    for r in range(rows - 1):
        ids[r, int(torch.randint(0, length, (1,), generator=g))] = eos
    ids[0, 0] = eos  # stops at once: the mask keeps only the marker
    ids[1, -1] = eos  # a second marker after the first
    # row 2: stopped at a marker, then padded (with the marker id) by the engine
    stop = length // 2
    ids[2, :stop] = torch.randint(eos + 1, eos + 20, (stop,), generator=g)
    ids[2, stop] = eos
    ids[2, stop + 1:], pad[2, stop + 1:] = eos, 0
    # the last row: cut by the engine without a marker of its own, padded with markers
    cut = length - 3
    ids[-1, :cut] = torch.randint(eos + 1, eos + 20, (cut,), generator=g)
    ids[-1, cut:], pad[-1, cut:] = eos, 0
    return ids, pad


def _completion_mistakes(ids: torch.Tensor, pad: torch.Tensor, eos: int) -> Dict[str, Any]:
    rows, length = ids.shape
    pos = torch.arange(length).expand(rows, -1)
    real = pad.bool()

    def first_of(is_eos: torch.Tensor, default: int) -> torch.Tensor:
        first = torch.full((rows, 1), default, dtype=torch.long)
        has = is_eos.any(1)
        first[has, 0] = is_eos.int().argmax(1)[has]
        return first

    right_eos = (ids == eos) & real
    first = first_of(right_eos, length - 1)
    last = length - 1 - right_eos.int().flip(1).argmax(1, keepdim=True)
    has = right_eos.any(1, keepdim=True)
    return {
        "the end marker itself left out": torch.where(has, pos < first, real) & real,
        "a row without an end marker masked to its first token only": (pos <= right_eos.int().argmax(1, keepdim=True)) & real,
        "every token that is not the end marker": (ids != eos) & real,
        "up to the last end marker instead of the first": torch.where(has, pos <= last, real) & real,
        "the rollout's padding counted, with the end marker it holds taken for a stop":
            pos <= first_of(ids == eos, length - 1),
        "the rollout's padding counted where a row has no end marker of its own": torch.where(has, pos <= first, True),
    }


solution("12.2", "is_eos = (ids == eos) & pad_mask.bool(); idx = torch.full((N,), R - 1); has = is_eos.any(1); "
                 "idx[has] = is_eos.int().argmax(1)[has]; return ((torch.arange(R) <= idx[:, None]) & "
                 "pad_mask.bool()).int()")


@check("Exercise 12.2 completion_mask", shown=True, why="a mask entry is 0 or 1: it tells where the mask is wrong")
def check_completion_mask(completion_mask: Callable[..., Any]) -> str:
    """``completion_mask(completion_ids [N, R], eos_token_id, pad_mask [N, R]) -> [N, R]`` (int): d65ef2c's mask,
    1 on every token the policy generated up to and including its first end marker, an end marker under the
    rollout's padding (``pad_mask`` 0) not counting as one (``grpo.completion_mask(..., pad_mask)``)."""
    name = "Exercise 12.2 completion_mask"
    hint = ("for each row, which tokens did the policy generate, and where did it stop? Mind the rows that never stop "
            "and the positions the rollout padded.")
    cases = []
    got_all = []
    for seed, (rows, length, eos) in enumerate([(5, 9, 2), (4, 6, 7), (4, 12, 0)]):
        ids, pad = _completion_case(seed + 1, rows, length, eos)
        case = f"{rows} rows of {length} tokens, end marker id {eos}, the last rows padded"
        got = call(guarded(completion_mask, name, {"minimind_ref.grpo.completion_mask": ref_grpo.completion_mask}),
                   ids.clone(), eos, pad.clone(), name=name, case=case, check_inputs=True, hint=hint)
        expected = ref_grpo.completion_mask(ids, eos, pad)
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and got.dtype not in (torch.int32, torch.int64):
            fail(name, f"expected an int mask, got dtype {got.dtype}{_on(case)}",
                 "the loss multiplies by the mask and sums it: return it as int, as upstream does.")
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape:  # type and shape, as check_close says them
            check_close(got, expected, name=name, rtol=0, atol=0, check_dtype=False, case=case, hint=hint)
        cases.append({"ids": ids, "pad": pad, "eos": eos, "case": case})
        got_all.append(got)
    expected_all = [ref_grpo.completion_mask(c["ids"], c["eos"], c["pad"]) for c in cases]
    same = close_tensors(0.0, 0.0)
    wrong = next((n for n in range(len(cases)) if not same(got_all[n], expected_all[n])), None)
    if wrong is not None:
        mistakes = _completion_mistakes(cases[0]["ids"], cases[0]["pad"], cases[0]["eos"])
        seen = explaining({d: (lambda c, d=d: _completion_mistakes(c["ids"], c["pad"], c["eos"])[d].int())
                           for d in mistakes}, cases, got_all, expected_all, wrong, same)
        check_close(got_all[wrong], expected_all[wrong], name=name, rtol=0, atol=0, check_dtype=False,
                    mistakes={seen: got_all[wrong]} if seen else None, case=cases[wrong]["case"], hint=hint)
    return "markers first, last, repeated and missing; rows padded by the rollout, with and without their own marker"


# ---------------------------------------------------------------------- 12.3 the loss
def _loss_nan(case: str) -> Tuple[str, str]:
    """What ``check_close`` says of c090b69's loss that is NaN (``nan=``); its cases have no empty mask."""
    return (f"your loss is NaN ({case})", "every completion of these cases has tokens that count: look for a "
            "division by something that can be 0, or an exp that overflows.")


def _cispo_nan(case: str) -> Tuple[str, str]:
    """What ``check_close`` says of a CISPO loss that is NaN: an empty completion's 0 / 0."""
    return (f"your loss is NaN ({case}); one completion of this case has no token that counts",
            "a completion whose mask is empty has no mean: its masked sum and its count are both 0. The exercise asks "
            "for a loss to which it contributes 0, without changing any other completion's mean.")


def grpo_loss_draft(per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor, advantages: torch.Tensor,
                    completion_mask: torch.Tensor, beta: float) -> torch.Tensor:
    """The chapter's draft of Exercise 12.3, with its two mistakes (the ratio's detached part in the numerator, so
    the gradient points the other way; k3 of the reverse KL)."""
    ratio = torch.exp(per_token_logps.detach() - per_token_logps)
    d = per_token_logps - ref_per_token_logps
    kl = torch.exp(d) - d - 1
    per_token = -(ratio * advantages[:, None] - beta * kl)
    m = completion_mask.float()
    return ((per_token * m).sum(dim=1) / m.sum(dim=1)).mean()


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


@check("Exercise 12.3 grpo_loss", shown=True,
       why="a loss over random log-probabilities: nothing to read the formula back from")
def check_grpo_loss(grpo_loss: Callable[..., Any]) -> str:
    """``grpo_loss(per_token_logps, ref_per_token_logps, advantages, completion_mask, beta)``:
    c090b69's loss (ratio ``exp(lp - lp.detach())``; d65ef2c's ``grpo_loss(lp, lp.detach(), ...,
    loss_type="grpo")``), value and gradient with respect to ``per_token_logps``."""
    name = "Exercise 12.3 grpo_loss"
    for seed, (rows, length, beta) in enumerate([(4, 7, 0.04), (6, 5, 0.5), (3, 9, 0.0), (5, 8, 2.0)]):
        lp, ref, adv, mask = _loss_case(seed + 1, rows, length)
        case = f"{rows} completions, beta={beta}, unequal lengths"
        pol = lp.clone().requires_grad_(True)
        got = call(guarded(grpo_loss, name, {"minimind_ref.grpo.grpo_loss": ref_grpo.grpo_loss,
                                             "minimind_ref.grpo.per_token_kl": ref_grpo.per_token_kl}),
                   pol, ref.clone(), adv.clone(), mask.clone(), beta, name=name, case=case,
                   check_inputs=True, hint="per_token_logps is [N, R], advantages [N]: one advantage per completion, "
                   "for every token of its row.")
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
            "the KL term with the wrong sign":
                lambda p: seq(-(ratio(p) * adv[:, None] + beta * kl(p))),
            "a KL term that differs from section 4's once the policy has moved away from the reference, as one of "
            "the draft's two mistakes gives (look at the k3 term)":
                lambda p: seq(-(ratio(p) * adv[:, None] - beta * (torch.exp(p - ref) - (p - ref) - 1))),
            "k1, the plain log-ratio, where section 4 has k3": lambda p: seq(-(ratio(p) * adv[:, None] - beta * (p - ref))),
            "one average over all masked tokens of the batch instead of per completion":
                lambda p: ((-(ratio(p) * adv[:, None] - beta * kl(p))) * m).sum() / m.sum(),
            "no mask: tokens after the end marker counted":
                lambda p: (-(ratio(p) * adv[:, None] - beta * kl(p))).mean(),
            "the objective maximised as a loss, without the minus sign in front":
                lambda p: seq(ratio(p) * adv[:, None] - beta * kl(p)),
            "a ratio detached as a whole, a constant 1 without a gradient":
                lambda p: seq(-(torch.ones_like(p) * adv[:, None] - beta * kl(p))),
            "a gradient of the opposite sign under a value that is right, as one of the draft's two mistakes gives "
            "(look at the ratio)":
                lambda p: seq(-(torch.exp(p.detach() - p) * adv[:, None] - beta * kl(p))),
        }
        expected = ref_grpo.grpo_loss(lp, lp.detach(), ref, adv, mask, beta, loss_type="grpo")
        mistakes = {k: (lambda f=f: f(lp).detach()) for k, f in forms.items()}
        check_close(got.detach(), expected, name=name, rtol=1e-5, atol=1e-6, check_dtype=False, mistakes=mistakes,
                    case=case, hint="compare each factor of your loss with section 4's formula, the k3 term "
                    "included; average over each completion's mask, then over completions.",
                    nan=_loss_nan(case))
        if not got.requires_grad:
            fail(name, f"your loss has no gradient with respect to per_token_logps ({case})",
                 "do not detach lp or call .item(): the loss must stay in the graph. Only the ratio's denominator is detached.")
        (grad,) = torch.autograd.grad(got, pol, allow_unused=True)
        if grad is None:
            fail(name, f"your loss does not depend on per_token_logps: its gradient with respect to them is None "
                 f"({case}); was lp detached on the way (a detach, an item, a new tensor made from it)?",
                 "compute the loss from per_token_logps itself; only the ratio's denominator is detached.")
        p2 = lp.clone().requires_grad_(True)
        (expected_grad,) = torch.autograd.grad(ref_grpo.grpo_loss(p2, p2.detach(), ref, adv, mask, beta, loss_type="grpo"), p2)
        grad_mistakes = _gradient_mistakes(forms, lp)
        check_close(grad, expected_grad, name=name + " (gradient)", rtol=1e-5, atol=1e-6, check_dtype=False,
                    mistakes=grad_mistakes, case=case,
                    hint="the value can be right while the gradient is not: write the gradient each factor of your "
                         "loss gives one token, and compare it with section 4's.")
    return "value and gradient, beta from 0 to 2"


# ---------------------------------------------------------------------- 12.4 a lone success's advantage
solution("12.4", "mean = 1 / G; population std = sqrt(mean * (1 - mean)); return ((1 - mean) / std, -mean / std), "
                 "which is (sqrt(G - 1), -1 / sqrt(G - 1)) up to the 1e-4")


def _lone_success_group(size: int) -> torch.Tensor:
    rewards = torch.zeros(size)
    rewards[size // 2] = 1.0
    return rewards


def lone_success_reference(size: int, eps: float = 1e-4) -> Tuple[float, float]:
    """d65ef2c's advantages of the one success and of each failure in a group of ``size`` 0/1 rewards with one
    success: the group's z-score with the population std and ``eps`` in the denominator (``eps=0``: the closed
    form ``sqrt(G - 1)``, ``-1 / sqrt(G - 1)``)."""
    mean = 1.0 / size
    std = math.sqrt(mean * (1 - mean))
    return (1 - mean) / (std + eps), -mean / (std + eps)


def _lone_mistakes(size: int, success: bool) -> Dict[str, Any]:
    """What each planted prediction gives for the success (``success``) or a failure of a group of ``size``."""
    mean = 1.0 / size
    pop = math.sqrt(mean * (1 - mean))
    sample = pop * math.sqrt(size / (size - 1))
    pick = (lambda a, b: a) if success else (lambda a, b: b)
    return {
        "the sample std (c090b69's, the unbiased one)": pick((1 - mean) / sample, -mean / sample),
        "c090b69's clamp to +-10 kept": pick(min((1 - mean) / pop, 10.0), -mean / pop),
        "the rewards minus the group mean, not divided by the std": pick(1 - mean, -mean),
        "the success's and a failure's advantages swapped": pick(-mean / pop, (1 - mean) / pop),
        "a failure's advantage without its minus sign": pick((1 - mean) / pop, mean / pop),
        "a failure's advantage taken as minus the success's": pick((1 - mean) / pop, -(1 - mean) / pop),
        "the group size where one less than it belongs": pick(math.sqrt(size), -1 / math.sqrt(size)),
        "the 1e-4 added under the square root, to the variance": pick((1 - mean) / math.sqrt(pop ** 2 + 1e-4),
                                                                   -mean / math.sqrt(pop ** 2 + 1e-4)),
    }


# what would answer 12.4 without any of the work, or measure the prediction instead of making it
PREDICTING = "the exercise asks you to predict the advantages from the group size, not to measure them on rewards"
ADVANTAGE_FUNCTIONS = [forbid("minimind_ref.grpo.group_advantages", ref_grpo.group_advantages, reason=PREDICTING),
                       forbid("a standard deviation of rewards (torch.std, torch.var)", torch.std, torch.var,
                              torch.std_mean, torch.var_mean, torch.Tensor.std, torch.Tensor.var, reason=PREDICTING),
                       forbid("ch12.lone_success_reference", lone_success_reference)]
LONE_SIZES = (4, 2, 5, 16, 128, 10**6, 10**12)  # 10**6 and 10**12: no group of rewards reaches them, only the rule
LONE_MEASURED_UP_TO = 4096


@check("Exercise 12.4 lone_success_advantages", shown=False,
       why="the lone success's advantage is a closed form of the group size the case names")
def check_lone_success(lone_success_advantages: Callable[..., Any]) -> str:
    """``lone_success_advantages(group_size) -> (success, failure)``: d65ef2c's advantage of the one success and of
    each failure in a group of ``group_size`` 0/1 rewards with exactly one success, compared with
    ``minimind_ref.grpo.group_advantages`` on groups of 2 to 128, and with its rule (the z-score with the population
    std and 1e-4 in the denominator) on groups no tensor could hold; a closed form that leaves out the 1e-4 passes
    (relative tolerance 2e-3 on the small groups; on the large ones, where the 1e-4 matters, either). A function
    that measures the advantages (the package's normalisation, a standard deviation of rewards) is refused."""
    name = "Exercise 12.4 lone_success_advantages"
    hint = ("the group's mean and population std follow from G alone when one reward is 1 and the others 0; put them "
            "into d65ef2c's normalisation (section 2 says what it keeps of c090b69's and what it drops).")
    outcomes_s, outcomes_f = [], []
    # a group of 4 first: with 2 (one success, one failure) the two advantages are 1 and -1, and a failure without
    # its sign cannot be told from the two swapped
    for size in LONE_SIZES:
        case = f"a group of {size:,} with one success"
        got = call(guarded(lone_success_advantages, name, ADVANTAGE_FUNCTIONS, case=case, hint=hint), size, name=name,
                   case=case, hint="group_size is an int; return the success's advantage and a failure's, as a pair "
                   "of floats.")
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            fail(name, f"expected a pair (the success's advantage, a failure's), got {type(got).__name__}: {got!r:.80} "
                 f"(on {case})", "return the two advantages together, as a tuple of two floats.")
        success_got = as_number(got[0], name, case, integer=False, what="the success's advantage")
        failure_got = as_number(got[1], name, case, integer=False, what="a failure's advantage")
        if size <= LONE_MEASURED_UP_TO:
            adv = ref_grpo.group_advantages(_lone_success_group(size), size)
            success, failure = float(adv[size // 2]), float(adv[0])
        else:  # the rule, with the 1e-4 or without it, whichever the learner's prediction is nearer
            with_eps, without = lone_success_reference(size), lone_success_reference(size, eps=0.0)
            near = min((with_eps, without), key=lambda ref: abs(success_got - ref[0]) + abs(failure_got - ref[1]))
            success, failure = near
        outcomes_s.append(Outcome(case, success_got, success, _lone_mistakes(size, True)))
        outcomes_f.append(Outcome(case, failure_got, failure, _lone_mistakes(size, False)))
    check_numbers(f"{name} (the success's advantage)", outcomes_s, hint, rel_tol=2e-3)
    check_numbers(f"{name} (a failure's advantage)", outcomes_f, hint, rel_tol=2e-3)
    return "groups of 2 to 10^12 with one success, the small ones measured on grpo.group_advantages"


# ---------------------------------------------------------------------- 12.5 / 12.6 PPO's clip and CISPO
def _ratio_case(seed: int, rows: int, length: int) -> Tuple[torch.Tensor, ...]:
    """``(lp, old, ref, adv, mask)`` with ratios ``exp(lp - old)`` from about 0.2 to 5 and beyond."""
    lp, ref, adv, mask = _loss_case(seed, rows, length)
    g = seeded(seed + 50)
    old = lp + 0.8 * torch.randn(rows, length, generator=g)
    return lp, old, ref, adv, mask


def _check_cispo_loss(fn: Callable[..., Any], name: str) -> str:
    """CISPO's value and gradient (``grpo.grpo_loss(..., loss_type="cispo")``), with ratios far from 1."""
    for seed, (rows, length, beta, eps_high) in enumerate([(4, 7, 0.1, 5.0), (6, 5, 0.0, 1.5), (3, 9, 0.5, 2.0),
                                                           (5, 8, 0.04, 5.0)]):
        lp, old, ref, adv, mask = _ratio_case(seed + 31, rows, length)
        if seed == 1:
            mask[2] = 0  # a completion without a token that counts: its count is clamped at 1, its loss is 0
        case = f"{rows} completions, beta={beta}, epsilon_high={eps_high}" + (", one row's mask empty" if seed == 1 else "")
        pol = lp.clone().requires_grad_(True)
        got = call(guarded(fn, name, {"minimind_ref.grpo.grpo_loss": ref_grpo.grpo_loss,
                                      "minimind_ref.grpo.per_token_kl": ref_grpo.per_token_kl}),
                   pol, old.clone(), ref.clone(), adv.clone(), mask.clone(), beta, eps_high, name=name, case=case)
        if not isinstance(got, torch.Tensor) or got.dim() != 0:
            fail(name, f"expected a scalar tensor, got {type(got).__name__} {tuple(getattr(got, 'shape', ()))} ({case})",
                 "average over each completion's masked tokens, then over the completions.")

        def loss(p: torch.Tensor, lt: str = "cispo", e: float = 0.2, eh: float = eps_high,
                 b: float = beta, o: torch.Tensor = old) -> torch.Tensor:
            return ref_grpo.grpo_loss(p, o, ref, adv, mask, b, loss_type=lt, epsilon=e, epsilon_high=eh)

        m = mask.float()
        seq = lambda t: ((t * m).sum(1) / m.sum(1).clamp_min(1)).mean()  # noqa: E731
        kl = lambda p: torch.exp(ref - p) - (ref - p) - 1  # noqa: E731
        ratio = lambda p: torch.exp(p - old)  # noqa: E731
        a = adv[:, None]
        w = lambda p: torch.clamp(ratio(p), max=eps_high).detach()  # noqa: E731
        token_level = lambda t: (t * m).sum() / m.sum().clamp_min(1)  # noqa: E731
        kept = m.sum(1) > 0
        forms: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
            "the weight's gradient kept: the capped ratio carries the policy's gradient too":
                lambda p: seq(-(torch.clamp(ratio(p), max=eps_high) * a * p - beta * kl(p))),
            "the ratio clamped from below as well as capped above":
                lambda p: seq(-(torch.clamp(ratio(p), 1 - 0.2, eps_high).detach() * a * p - beta * kl(p))),
            "no cap on the ratio": lambda p: seq(-(ratio(p).detach() * a * p - beta * kl(p))),
            "the ratio left out (plain REINFORCE)": lambda p: seq(-(a * p - beta * kl(p))),
            "PPO's clipped surrogate: that is loss_type='grpo'": lambda p: loss(p, lt="grpo", e=0.2),
            "the capped ratio times the advantage, without log pi":
                lambda p: seq(-(torch.clamp(ratio(p), max=eps_high) * a - beta * kl(p))),
            "the KL term with the wrong sign": lambda p: seq(-(w(p) * a * p + beta * kl(p))),
            "a KL term that differs from k3 once the policy has moved away from the reference":
                lambda p: seq(-(w(p) * a * p - beta * (torch.exp(p - ref) - (p - ref) - 1))),
            "one average over all masked tokens of the batch instead of per completion":
                lambda p: token_level(-(w(p) * a * p - beta * kl(p))),
            "the ratio upside down, the sampler's probability over the policy's":
                lambda p: seq(-(torch.clamp(torch.exp(old - p), max=eps_high).detach() * a * p - beta * kl(p))),
            "the completions without a token that counts left out of the mean over completions":
                lambda p: ((-(w(p) * a * p - beta * kl(p)) * m).sum(1)[kept] / m.sum(1)[kept]).mean(),
        }
        hint = ("write each token's gradient for your loss and compare it with the one the exercise asks for: the "
                "capped weight times the advantage times the gradient of log pi, plus the k3 term's.")
        expected = loss(lp.detach())
        mistakes = {k: (lambda f=f: f(lp).detach()) for k, f in forms.items()}
        check_close(got.detach(), expected, name=name, rtol=1e-5, atol=1e-6, check_dtype=False, mistakes=mistakes,
                    case=case, hint=hint, nan=_cispo_nan(case))
        if not got.requires_grad:
            fail(name, f"your loss has no gradient with respect to per_token_logps ({case})",
                 "the loss must stay in the graph: some factor of each token's term has to carry the gradient.")
        (grad,) = torch.autograd.grad(got, pol)
        p2 = lp.clone().requires_grad_(True)
        (expected_grad,) = torch.autograd.grad(loss(p2), p2)
        grad_mistakes = _gradient_mistakes(forms, lp)
        check_close(grad, expected_grad, name=name + " (gradient)", rtol=1e-5, atol=1e-6, check_dtype=False,
                    mistakes=grad_mistakes, case=case, hint="the value can be right while the gradient is not: "
                    "write the gradient your loss gives one token, factor by factor.")
    return "value and gradient, ratios from 0.2 to 5, beta from 0 to 0.5"


solution("12.6", "w = torch.exp(lp - old).clamp(max=eps_high).detach(); t = -(w * adv[:, None] * lp - beta * "
                 "(torch.exp(ref - lp) - (ref - lp) - 1)); return ((t * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()")


solution("12.5", "a = advantages[:, None]; flows = ((a > 0) & (ratio <= 1 + epsilon)) | ((a < 0) & (ratio >= 1 - "
                 "epsilon)); return ~flows")


def _surrogate_zero_grad(ratio: torch.Tensor, adv: torch.Tensor, eps: float) -> torch.Tensor:
    """Where PPO's per-token surrogate ``min(r A, clamp(r, 1 - eps, 1 + eps) A)`` (as ``minimind_ref.grpo.grpo_loss``
    writes it) has zero gradient with respect to the ratio, measured with autograd."""
    r = ratio.clone().requires_grad_(True)
    a = adv[:, None].expand_as(r)
    torch.min(r * a, torch.clamp(r, 1 - eps, 1 + eps) * a).sum().backward()
    return r.grad == 0


def _silenced_cases() -> list:
    """(label, ratio [N, R], advantages [N], epsilon): ratios on both sides of the clip, exactly on its two ends,
    advantages of both signs and a group with advantage 0 (all its rewards equal)."""
    g = seeded(125)
    cases = []
    for eps in (0.25, 0.5):
        ends = torch.tensor([1 - eps, 1 + eps, 1.0, 1 - 2 * eps / 5, 1 + 2 * eps / 5, 0.2, 3.0, 1 + eps * 1.5])
        ratio = torch.stack([ends, ends.flip(0), ends, ends.roll(3)])
        adv = torch.tensor([1.5, -0.75, 0.0, -2.0])
        cases.append((f"ratios on and around both ends of the clip, epsilon={eps}, advantages of both signs and 0",
                      ratio, adv, eps))
    for eps in (0.2, 0.1):
        ratio = torch.exp(0.6 * torch.randn(6, 9, generator=g))
        adv = torch.randn(6, generator=g)
        adv[2] = 0.0
        cases.append((f"6 completions, random ratios from about 0.2 to 5, epsilon={eps}", ratio, adv, eps))
    return cases


def _silenced_mistakes(ratio: torch.Tensor, adv: torch.Tensor, eps: float) -> Dict[str, Any]:
    a = adv[:, None]
    pos, neg, zero = a > 0, a < 0, (a == 0).expand_as(ratio)
    above, below = ratio > 1 + eps, ratio < 1 - eps
    right = (pos & above) | (neg & below) | zero
    return {
        "only the tokens past the upper end counted, whatever the advantage's sign": (pos & above) | zero,
        "only the tokens past the lower end counted, whatever the advantage's sign": (neg & below) | zero,
        "the two ends swapped between the signs of the advantage": (pos & below) | (neg & above) | zero,
        "every token outside the clip's range counted, whatever the advantage's sign": above | below | zero,
        "the ends of the clip counted as outside it": (pos & (ratio >= 1 + eps)) | (neg & (ratio <= 1 - eps)) | zero,
        "the tokens with advantage 0 left out": right & ~zero,
        "the tokens that keep their gradient returned instead of the silenced ones": ~right,
    }


STATING = "the exercise asks you to state the rule, not to measure the surrogate's gradient"
# what would answer 12.5, or measure the rule instead of stating it: the package's loss, autograd, and the min the
# surrogate takes (the rule needs only comparisons; a clamp may state it, so the clamp stays free)
CLIP_FUNCTIONS = [forbid("minimind_ref.grpo.grpo_loss", ref_grpo.grpo_loss),
                  forbid("minimind_ref.grpo.clip_fraction", ref_grpo.clip_fraction),
                  forbid("autograd (backward, torch.autograd.grad, torch.enable_grad)", torch.Tensor.backward,
                         torch.autograd.backward, torch.autograd.grad, torch.enable_grad, torch.set_grad_enabled,
                         reason=STATING),
                  forbid("the surrogate's min (torch.min, torch.minimum)", torch.min, torch.minimum, torch.Tensor.min,
                         torch.Tensor.minimum, reason=STATING)]
NO_AUTOGRAD = ("ratio is [N, R], advantages [N] (one per completion), epsilon a float; return a bool tensor [N, R]. The "
               "check calls your function without autograd and refuses one that evaluates the surrogate: it must state "
               "the rule, not measure it.")


@check("Exercise 12.5 silenced_by_clip", shown=True,
       why="a mask entry is True or False: it tells which token is wrong, not the rule")
def check_silenced_by_clip(silenced_by_clip: Callable[..., Any]) -> str:
    """``silenced_by_clip(ratio [N, R], advantages [N], epsilon) -> bool [N, R]``: True for the tokens whose
    gradient through PPO's clipped surrogate ``min(ratio * A, clamp(ratio, 1 - epsilon, 1 + epsilon) * A)`` is
    zero, as autograd measures it (on ratios exactly at both ends of the clip, too); and, on the same rule, the
    tokens of ``minimind_ref.grpo.grpo_loss(loss_type="grpo", beta=0)`` whose gradient is zero."""
    name = "Exercise 12.5 silenced_by_clip"
    hint = ("write the surrogate's gradient with respect to the ratio for each case: the sign of A decides which "
            "term the min keeps on which side of the clip, and at the clip's ends the two terms are equal.")
    for label, ratio, adv, eps in _silenced_cases():
        with torch.no_grad():  # the rule, not a measurement: the learner's function runs without autograd
            got = call(guarded(silenced_by_clip, name, CLIP_FUNCTIONS, case=label, hint=NO_AUTOGRAD), ratio.clone(),
                       adv.clone(), eps, name=name, case=label, check_inputs=True, hint=NO_AUTOGRAD)
        expected = _surrogate_zero_grad(ratio, adv, eps)
        if isinstance(got, torch.Tensor) and got.dtype != torch.bool and got.shape == expected.shape:
            fail(name, f"expected a bool tensor, got dtype {got.dtype} ({label})",
                 "return the comparison's result itself, True where a token is silenced.")
        check_close(got, expected, name=name, rtol=0, atol=0, mistakes=_silenced_mistakes(ratio, adv, eps), case=label,
                    hint=hint)
    # the same rule on the chapter's loss: beta = 0, the ratio exp(lp - old), autograd through grpo_loss
    lp, old, ref, adv, mask = _ratio_case(seed=61, rows=5, length=8)
    mask = torch.ones_like(mask)
    adv[1] = 0.0
    p = lp.clone().requires_grad_(True)
    ref_grpo.grpo_loss(p, old, ref, adv, mask, 0.0, loss_type="grpo", epsilon=0.2).backward()
    label = "grpo_loss(loss_type='grpo', beta=0, epsilon=0.2): tokens whose gradient is zero"
    ratio = torch.exp(lp - old)
    with torch.no_grad():
        got = call(guarded(silenced_by_clip, name, CLIP_FUNCTIONS, case=label, hint=NO_AUTOGRAD), ratio.clone(),
                   adv.clone(), 0.2, name=name, case=label, check_inputs=True, hint=NO_AUTOGRAD)
    check_close(got, p.grad == 0, name=name, rtol=0, atol=0, mistakes=_silenced_mistakes(ratio, adv, 0.2), case=label,
                hint=hint)
    return "on both ends of the clip and around them, both signs of the advantage and 0, and on grpo_loss's gradient"


@check("Exercise 12.6 cispo_loss", shown=True,
       why="a loss over random log-probabilities: nothing to read the formula back from")
def check_cispo_loss(cispo_loss: Callable[..., Any]) -> str:
    """``cispo_loss(per_token_logps, old_per_token_logps, ref_per_token_logps, advantages,
    completion_mask, beta, epsilon_high)``: d65ef2c's default ``--loss_type cispo``
    (``grpo.grpo_loss(..., loss_type="cispo")``), value and gradient."""
    return _check_cispo_loss(cispo_loss, "Exercise 12.6 cispo_loss")


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


def _group_cases() -> list:
    """(p, max_no_signal): p != 0.5, so that counting only the all-right or
    only the all-wrong groups, and one more than needed, give different answers; and two bounds that a group size
    meets exactly (0.25**2 + 0.75**2 = 0.625, 0.75**3 + 0.25**3 = 0.4375, exact in binary), where "at most" and
    "below" differ; a bound every group meets (the answer is the smallest size, 2) and one no group of up to 64
    meets (the answer is 64)."""
    return [(0.25, 0.625), (0.75, 0.4375), (0.9, 0.2), (0.1, 0.5), (0.3, 0.3), (0.45, 0.05), (0.97, 0.5), (0.6, 0.1),
            # near p = 1/2 both outcomes count about as much: counting only the likelier one answers too small a group
            (0.5, 0.25), (0.55, 0.2), (0.4, 0.15),
            (0.3, 1.0), (0.99, 0.5)]  # every group size is enough (G = 2); none up to 64 is (64)


def _first_group(condition) -> int:
    return next((g for g in range(2, 65) if condition(g)), 64)


@check("Exercise 12.7 smallest_group", shown=False, why="the group size is a closed form of the case's two numbers")
def check_smallest_group(smallest_group: Callable[..., Any]) -> str:
    """``smallest_group(p, max_no_signal) -> int``: given a measured success rate ``p`` of the
    sampled replies, the smallest group size ``G >= 2`` for which a group's rewards are all equal
    (no signal: every advantage 0) with probability at most ``max_no_signal``."""
    name = "Exercise 12.7 smallest_group"
    learner = guarded(smallest_group, name, {"ch12.no_signal_probability_reference": no_signal_probability_reference,
                                             "ch12.smallest_group_reference": smallest_group_reference})
    hint = ("work out the chance that all G rewards of a group are equal from p, then take the first G >= 2 for which "
            "that chance is within the bound.")
    outcomes = []
    for p, limit in _group_cases():
        case = f"p={p}, max_no_signal={limit}"
        got = call(learner, p, limit, name=name, case=case)
        if got is None:
            fail(name, f"your function returned None ({case}): every case has a group size for an answer",
                 "look at the case named above: is it one where no group of up to 64 is enough? A function that "
                 "reaches its end without a return statement returns None.")
        got = as_number(got, name, case, integer=True, what="a group size")
        expected = smallest_group_reference(p, limit)
        fits_64 = any(no_signal_probability_reference(p, g) <= limit for g in range(2, 65))
        mistakes = {
            "only the all-wrong case counted":
                _first_group(lambda g: (1 - p) ** g <= limit),
            "only the all-right case counted":
                _first_group(lambda g: p ** g <= limit),
            "only the likelier of the two outcomes counted":
                _first_group(lambda g: max(p, 1 - p) ** g <= limit),
            "the chance that at least one sample differs taken for the no-signal chance":
                _first_group(lambda g: 1 - no_signal_probability_reference(p, g) <= limit),
            "the chance of a signal compared with the bound, where the chance of none belongs":
                _first_group(lambda g: 1 - no_signal_probability_reference(p, g) >= limit),
            "one more than needed": expected + 1 if expected < 64 else None,
            "the answer when no group of up to 64 is enough off by one": 65 if not fits_64 else None,
            "the bound taken as strict": _first_group(lambda g: no_signal_probability_reference(p, g) < limit),
            "a group of 1 allowed": next((g for g in range(1, 65) if no_signal_probability_reference(p, g) <= limit), 64),
            "no cap at 64": next(g for g in range(2, 10_000) if no_signal_probability_reference(p, g) <= limit),
        }
        outcomes.append(Outcome(case, got, expected, mistakes))
    check_numbers(name, outcomes, hint)
    return f"{len(outcomes)} success rates and bounds, two of them met exactly"
