"""Checks for chapter 11 (DPO), in the order the chapter asks for them: the masked sequence
log-probability (11.1), the shift of a DPO example (11.2), c090b69's DPO loss (11.3: the mean per
reply token, debugged from a draft) and the margin a loss value means (11.4: the loss inverted); then
the length effect of c090b69's mean and d65ef2c's sum, predicted and measured (11.5).

Each check runs the learner's function on inputs it generates (empty masks, unequal lengths,
several betas) and compares with ``minimind_ref.dpo``; a mismatch names the known mistake it
matches when it can.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F

from .. import dpo as ref_dpo
from .core import Outcome, as_number, call, check, check_close, check_numbers, fail, seeded, solution
from .delegation import guarded


def _logits_case(seed: int, pairs: int = 3, seq: int = 9, vocab: int = 11, empty_row: bool = True
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logits [2B, T, V], labels [2B, T], mask [2B, T] long)`` with unequal reply lengths,
    replies that start after a prompt, and (optionally) one row without a supervised token."""
    g = seeded(seed)
    logits = torch.randn(2 * pairs, seq, vocab, generator=g) * 2.0
    labels = torch.randint(0, vocab, (2 * pairs, seq), generator=g)
    mask = torch.zeros(2 * pairs, seq, dtype=torch.long)
    for row in range(2 * pairs):
        start = int(torch.randint(1, seq // 2, (1,), generator=g))
        length = int(torch.randint(1, seq - start + 1, (1,), generator=g))
        mask[row, start : start + length] = 1
    if empty_row:
        mask[1] = 0
    return logits, labels, mask


def _log_probs_case(seed: int, pairs: int, seq: int, empty_row: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ref_log_probs, policy_log_probs, mask)`` ``[2B, T]`` with the policy a little away from the reference."""
    logits, labels, mask = _logits_case(seed, pairs, seq, empty_row=empty_row)
    ref = ref_dpo.logits_to_log_probs(logits, labels)
    g = seeded(seed + 100)
    policy = ref_dpo.logits_to_log_probs(logits + 0.8 * torch.randn(logits.shape, generator=g), labels)
    return ref, policy, mask


# ---------------------------------------------------------------------- 11.1 sequence log-prob
solution("11.1", "token_lp = log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1); "
                 "return (token_lp * mask).sum(1) / mask.sum(1).clamp_min(1e-8)")


@check("Exercise 11.1 sequence_log_probs", shown=True, why="one sequence log-probability of random logits")
def check_sequence_log_probs(sequence_log_probs: Callable[..., Any]) -> str:
    """``sequence_log_probs(logits, labels, mask) -> [batch]``: upstream's per-sequence
    log-probability, the mean log-probability of the labels over the masked positions (an empty
    mask gives 0)."""
    name = "Exercise 11.1 sequence_log_probs"
    cases = [("unequal reply lengths and one empty mask", _logits_case(1)),
             ("every reply the same length", _logits_case(2, empty_row=False)),
             ("one pair, long replies", _logits_case(3, pairs=1, seq=14, empty_row=False))]
    for case, (logits, labels, mask) in cases:
        got = call(guarded(sequence_log_probs, name, {"minimind_ref.dpo.sequence_log_probs": ref_dpo.sequence_log_probs}),
                   logits.clone(), labels.clone(), mask.clone(), name=name, case=case, check_inputs=True)
        token_lp = F.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
        expected = ref_dpo.sequence_log_probs(ref_dpo.logits_to_log_probs(logits, labels), mask, "mean")
        m = mask.float()
        mistakes: Dict[str, Any] = {
            "the masked sum, not the mean (the DPO paper's sum; upstream divides by the reply's length)":
                lambda: (token_lp * m).sum(1),
            "the mean over every position, padding and prompt included (the mask not applied)":
                lambda: token_lp.mean(1),
            "the masked sum divided by the whole row length instead of the number of masked tokens (upstream's "
            "loss before issue #298)":
                lambda: (token_lp * m).sum(1) / m.shape[1],
            "raw logits gathered without log_softmax": lambda: (logits.gather(-1, labels[..., None]).squeeze(-1) * m).sum(1)
            / m.sum(1).clamp_min(1e-8),
            "probabilities (softmax) averaged instead of log-probabilities":
                lambda: (F.softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1) * m).sum(1) / m.sum(1).clamp_min(1e-8),
            "the mask shifted by one position (the dataset already aligned it with the labels)":
                lambda: (token_lp[:, 1:] * m[:, :-1]).sum(1) / m[:, :-1].sum(1).clamp_min(1e-8),
            "one count for the whole batch instead of one per sequence":
                lambda: (token_lp * m).sum(1) / m.sum(),
        }
        check_close(got, expected, name=name, rtol=1e-5, atol=1e-6, check_dtype=False, mistakes=mistakes, case=case,
                    hint="each label's log-probability under the model's distribution over the vocabulary, "
                         "averaged over the positions the mask keeps: each row has its own count.",
                    nan=(f"your result has NaN for a sequence whose mask is all zeros ({case})",
                         "a row with no supervised token has no mean: its sum and its count are both 0. The exercise "
                         "asks for 0 there, without changing the mean of any other row."))
    return "unequal lengths, an empty mask, one pair"


# ---------------------------------------------------------------------- 11.2 the shift
def _shift_cases() -> List[Tuple[str, List[int], List[int]]]:
    return [
        ("a reply in the middle", [1, 5, 6, 2, 7, 1, 8, 9, 4, 2, 7], [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1]),
        ("two replies", [1, 8, 9, 3, 2, 7, 1, 8, 9, 4, 2, 7], [0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1]),
        ("a reply cut off at the end", [1, 8, 9, 3, 3, 3], [0, 0, 0, 1, 1, 1]),
        ("no reply", [1, 5, 6, 2], [0, 0, 0, 0]),
    ]


solution("11.2", "ids, mask = torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long); "
                 "return ids[:-1], ids[1:], mask[1:]")


@check("Exercise 11.2 shift_example", shown=True,
       why="the shifted ids of a case the message names are an example of the rule, not the rule")
def check_shift_example(shift_example: Callable[..., Any]) -> str:
    """``shift_example(ids, mask) -> (x, y, loss_mask)``: upstream's ``DPODataset`` shift,
    ``x = ids[:-1]``, ``y = ids[1:]``, ``loss_mask = mask[1:]`` (long tensors)."""
    name = "Exercise 11.2 shift_example"
    for case, ids, mask in _shift_cases():
        got = call(shift_example, list(ids), list(mask), name=name, case=case, check_inputs=True)
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            fail(name, f"expected three tensors (x, y, loss_mask), got {type(got).__name__} ({case})",
                 "return x, y, loss_mask")
        t_ids, t_mask = torch.tensor(ids), torch.tensor(mask)
        expected = (t_ids[:-1], t_ids[1:], t_mask[1:])
        swapped = "inputs and targets the other way round"
        mistakes = [
            {swapped: t_ids[1:], "the whole sequence as input (x = ids: the last token predicts nothing)": t_ids},
            {swapped: t_ids[:-1], "the whole sequence as target (y = ids)": t_ids},
            {"the mask cut like the inputs instead of like the targets (the loss counts where the *target* is an "
             "assistant token, so the first reply token would be missed and the token after the reply counted)":
                 t_mask[:-1]},
        ]
        for part, (g_part, e_part, label) in enumerate(zip(got, expected, ("x", "y", "loss_mask"))):
            if isinstance(g_part, torch.Tensor) and g_part.dtype != torch.long:
                fail(name, f"{label} has dtype {g_part.dtype}; upstream's dataset returns torch.long ({case})",
                     "make the tensors of dtype torch.long.")
            check_close(g_part, e_part, name=f"{name} ({label})", rtol=0, atol=0, mistakes=mistakes[part],
                        case=case, hint="position t of x predicts y[t], the token after it; loss_mask[t] says "
                                        "whether that target counts, so the mask goes with the targets.")
    return "four examples, a cut-off reply and an example without a reply included"


# ---------------------------------------------------------------------- 11.3 the loss
def dpo_loss_draft(ref_log_probs: torch.Tensor, policy_log_probs: torch.Tensor, mask: torch.Tensor,
                   beta: float) -> torch.Tensor:
    """The chapter's draft of Exercise 11.3, with its two mistakes (pairs taken as neighbouring rows; the
    reference's margin minus the policy's): it gives ln 2 when the policy is the reference, and stays there
    when the policy moves towards every chosen reply."""
    lengths = mask.sum(dim=1).clamp_min(1e-8)
    ref = (ref_log_probs * mask).sum(dim=1) / lengths
    policy = (policy_log_probs * mask).sum(dim=1) / lengths
    chosen_ref, rejected_ref = ref[0::2], ref[1::2]
    chosen, rejected = policy[0::2], policy[1::2]
    margin = (chosen_ref - rejected_ref) - (chosen - rejected)
    return (-F.logsigmoid(beta * margin)).mean()


solution("11.3", "m = mask.float(); seq = lambda lp: (lp * m).sum(1) / m.sum(1).clamp_min(1e-8); "
                 "pol, ref = seq(policy_log_probs), seq(ref_log_probs); B = pol.shape[0] // 2; "
                 "logits = (pol[:B] - pol[B:]) - (ref[:B] - ref[B:]); return -F.logsigmoid(beta * logits).mean()")


def _check_value_and_gradient(name: str, got: Any, pol: torch.Tensor, expected: torch.Tensor,
                              reference_loss: Callable[[torch.Tensor], torch.Tensor], policy: torch.Tensor,
                              mistakes: Dict[str, Any], case: str, hint: str) -> None:
    """The part 11.3 and 11.5 share: ``got`` (the learner's loss, computed from ``pol``, a
    gradient-tracking copy of ``policy``) must be a scalar equal to ``expected`` (the planted
    ``mistakes`` are named when one matches), and its gradient with respect to ``pol`` must equal
    that of ``reference_loss``."""
    if isinstance(got, torch.Tensor) and got.dim() != 0:
        fail(name, f"expected a scalar loss, got shape {tuple(got.shape)} ({case})",
             "average the per-pair losses into one number at the end.")
    check_close(got, expected, name=name, rtol=1e-5, atol=1e-6, check_dtype=False, mistakes=mistakes, case=case,
                hint=hint)
    if not got.requires_grad:
        fail(name, f"the loss carries no gradient ({case})",
             "compute it with torch operations on policy_log_probs (no .item(), .detach() or numpy).")
    got.backward()
    if pol.grad is None:
        fail(name, f"the loss does not depend on policy_log_probs: its gradient with respect to them is None "
             f"({case}); was the policy detached (.detach(), .item(), torch.tensor(...)) on the way?",
             "compute the loss from policy_log_probs itself with torch operations, so the gradient reaches it.")
    pol_ref = policy.clone().requires_grad_(True)
    reference_loss(pol_ref).backward()
    check_close(pol.grad, pol_ref.grad, name=name + " (gradient)", rtol=1e-5, atol=1e-7, case=case,
                hint="the value matches but the gradient does not: is something computed from a detached copy?")


@check("Exercise 11.3 dpo_loss", shown=True,
       why="a loss over random log-probabilities: nothing to read the formula back from")
def check_dpo_loss(dpo_loss: Callable[..., Any]) -> str:
    """``dpo_loss(ref_log_probs, policy_log_probs, mask, beta)`` must equal c090b69's ``dpo_loss``
    (the mean log-probability per reply token: ``minimind_ref.dpo.dpo_loss(..., reduction="mean")``),
    value and gradient. ``check_summed_dpo_loss`` (11.5) checks d65ef2c's sum."""
    name = "Exercise 11.3 dpo_loss"
    n = 0
    for seed, (pairs, seq, empty, beta) in enumerate([(3, 9, True, 0.1), (2, 12, False, 0.5), (4, 8, False, 2.0),
                                                      (1, 10, False, 0.1), (2, 7, True, 1.0)]):
        ref, policy, mask = _log_probs_case(seed + 10, pairs, seq, empty)
        case = f"{pairs} pair(s), beta={beta}" + (", one empty mask" if empty else "")
        pol = policy.clone().requires_grad_(True)
        got = call(guarded(dpo_loss, name, {"minimind_ref.dpo.dpo_loss": ref_dpo.dpo_loss}), ref.clone(), pol,
                   mask.clone(), beta, name=name, case=case, check_inputs=True)
        expected = ref_dpo.dpo_loss(ref, policy, mask, beta, reduction="mean")
        m = mask.float()
        seq_ref = (ref * m).sum(1) / m.sum(1).clamp_min(1e-8)
        seq_pol = (policy * m).sum(1) / m.sum(1).clamp_min(1e-8)
        b = pairs

        def from_logits(logits: torch.Tensor) -> torch.Tensor:
            return (-F.logsigmoid(beta * logits)).mean()

        mistakes: Dict[str, Any] = {
            "the margin's sign reversed: either chosen and rejected swapped (the batch holds the chosen replies "
            "first, then the rejected ones) or the policy and the reference swapped (the policy's margin minus "
            "the reference's)":
                lambda: from_logits((seq_pol[b:] - seq_pol[:b]) - (seq_ref[b:] - seq_ref[:b])),
            "the reference terms left out (ref_c - ref_r is what makes DPO relative to the starting model)":
                lambda: from_logits(seq_pol[:b] - seq_pol[b:]),
            "the reference added instead of subtracted":
                lambda: from_logits((seq_pol[:b] - seq_pol[b:]) + (seq_ref[:b] - seq_ref[b:])),
            "pairs taken as neighbouring rows (0,1), (2,3), ... instead of rows i and i + B":
                lambda: from_logits((seq_pol[0::2] - seq_pol[1::2]) - (seq_ref[0::2] - seq_ref[1::2])),
            "beta outside the log-sigmoid (it must scale the margin inside)":
                lambda: (-beta * F.logsigmoid((seq_pol[:b] - seq_pol[b:]) - (seq_ref[:b] - seq_ref[b:]))).mean(),
            "the minus sign of -logsigmoid missing":
                lambda: F.logsigmoid(beta * ((seq_pol[:b] - seq_pol[b:]) - (seq_ref[:b] - seq_ref[b:]))).mean(),
            "summed over the pairs instead of averaged":
                lambda: (-F.logsigmoid(beta * ((seq_pol[:b] - seq_pol[b:]) - (seq_ref[:b] - seq_ref[b:])))).sum(),
            "the paper's summed sequence log-probabilities (d65ef2c's default; this exercise is c090b69's mean per "
            "reply token)":
                lambda: ref_dpo.dpo_loss(ref, policy, mask, beta, reduction="sum"),
            "the draft as it stands: both of its mistakes are still there":
                lambda: dpo_loss_draft(ref, policy, mask, beta),
        }
        _check_value_and_gradient(name, got, pol, expected, lambda p: ref_dpo.dpo_loss(ref, p, mask, beta, reduction="mean"),
                                  policy, mistakes, case,
                                  hint="compare the draft with section 2's loss term by term: which rows hold the "
                                       "chosen replies, and whose preference is measured against whose.")
        n += 1
    return f"value and gradient on {n} batches, betas 0.1 to 2, empty masks included"


# ---------------------------------------------------------------------- 11.4 the margin a loss means
def margin_at_loss_reference(loss: float, beta: float) -> float:
    """The margin ``m`` (the policy's log-probability margin minus the reference's, in nats) at which one
    pair's DPO loss ``-log sigmoid(beta * m)`` equals ``loss``: ``-log(exp(loss) - 1) / beta``."""
    return -math.log(math.expm1(loss)) / beta


solution("11.4", "return -math.log(math.exp(loss) - 1) / beta")


def _margin_cases() -> List[Tuple[float, float]]:
    """(loss, beta): losses on both sides of ln 2 (a pair the policy gets wrong has a loss above it), small and
    large betas (beta = 1 would hide a forgotten beta), and a loss far below ln 2."""
    return [(0.3, 0.15), (0.05, 0.1), (1.2, 0.5), (0.6931, 2.0), (0.1, 0.15), (2.5, 0.15)]


def _margin_mistakes(loss: float, beta: float) -> Dict[str, Any]:
    exact = margin_at_loss_reference(loss, beta)
    return {
        "beta left out (the loss sees beta times the margin)": exact * beta,
        "beta multiplied instead of divided out": exact * beta * beta,
        "the sign of the margin reversed (a loss below ln 2 means the policy prefers the chosen reply more than the "
        "reference does: a positive margin)": -exact,
        "the sigmoid undone as if it were an exponential (a plain log of the pair's probability; the sigmoid's "
        "inverse is another function)": -loss / beta,
    }


@check("Exercise 11.4 margin_at_loss", shown=False,
       why="the margin is a closed form of the case's loss and beta: the value next to them would be the answer")
def check_margin_at_loss(margin_at_loss: Callable[..., Any]) -> str:
    """``margin_at_loss(loss, beta) -> float``: the margin ``m`` (the policy's log-probability margin minus the
    reference's, in nats) at which one pair's DPO loss is ``loss``; ``minimind_ref.dpo.dpo_loss`` on a pair with that
    margin gives ``loss`` back (tests/test_checks_ch11.py)."""
    name = "Exercise 11.4 margin_at_loss"
    outcomes = []
    for loss, beta in _margin_cases():
        case = f"loss={loss}, beta={beta}"
        got = call(margin_at_loss, loss, beta, name=name, case=case)
        got = as_number(got, name, case, integer=False, what="a margin in nats")
        outcomes.append(Outcome(case, got, margin_at_loss_reference(loss, beta), _margin_mistakes(loss, beta)))
    check_numbers(name, outcomes, "write one pair's loss as a function of its margin (section 2), then solve for the "
                  "margin, one step at a time.", rel_tol=1e-6, abs_tol=1e-9)
    return f"{len(outcomes)} losses on both sides of ln 2, betas 0.1 to 2"


# ---------------------------------------------------------------------- 11.5 the length effect
def gradient_ratio_reference(chosen_length: int, rejected_length: int, reduction: str) -> float:
    """At the start of DPO (policy = reference), ``|d loss / d lp|`` of one chosen token divided by
    that of one rejected token: 1 under the sum (every token weighs the same), ``rejected_length /
    chosen_length`` under the mean (each token weighs ``1 / its reply's length``)."""
    return 1.0 if reduction == "sum" else rejected_length / chosen_length


solution("11.5", "return 1.0 if reduction == 'sum' else rejected_length / chosen_length")


def _ratio_cases():
    """(chosen length, rejected length, reduction): both reductions, either reply the longer one, equal lengths,
    a one-token reply."""
    return [(2, 8, "mean"), (8, 2, "mean"), (5, 5, "mean"), (2, 8, "sum"), (9, 3, "sum"), (1, 12, "mean"),
            (7, 3, "mean"), (12, 1, "sum")]


def _measured_ratio(chosen_length: int, rejected_length: int, reduction: str) -> float:
    """|d loss / d lp| of the first chosen token over that of the first rejected token, at policy = reference,
    measured with autograd on ``minimind_ref.dpo.dpo_loss``."""
    width = max(chosen_length, rejected_length) + 2
    mask = torch.zeros(2, width)
    mask[0, 1:1 + chosen_length] = 1
    mask[1, 1:1 + rejected_length] = 1
    ref = -torch.rand(2, width, generator=seeded(chosen_length * 31 + rejected_length))
    policy = ref.clone().requires_grad_(True)
    ref_dpo.dpo_loss(ref, policy, mask, 0.15, reduction=reduction).backward()
    return float(policy.grad[0, 1].abs() / policy.grad[1, 1].abs())


@check("Exercise 11.5 gradient_ratio", shown=False,
       why="the ratio is a closed form of the case's two lengths: the measured value next to them would be the answer")
def check_gradient_ratio(gradient_ratio: Callable[..., Any]) -> str:
    """``gradient_ratio(chosen_length, rejected_length, reduction) -> float``: predict, for a pair
    whose chosen reply has ``chosen_length`` tokens and rejected reply ``rejected_length``, the
    ratio of the loss's gradient on one chosen token's log-probability to that on one rejected
    token's, at the start of training (policy = reference), under c090b69's ``"mean"`` or d65ef2c's
    ``"sum"``. The check measures it with autograd on ``minimind_ref.dpo.dpo_loss`` and compares
    (relative tolerance 1e-4)."""
    name = "Exercise 11.5 gradient_ratio"
    outcomes = []
    for chosen_length, rejected_length, reduction in _ratio_cases():
        case = f"chosen {chosen_length} tokens, rejected {rejected_length}, reduction={reduction!r}"
        got = call(guarded(gradient_ratio, name, {"minimind_ref.dpo.dpo_loss (this exercise predicts what it does)":
                                                  ref_dpo.dpo_loss}),
                   chosen_length, rejected_length, reduction, name=name, case=case)
        got = as_number(got, name, case, integer=False, what="the ratio")
        flip = chosen_length / rejected_length
        mistakes = {
            "the lengths the wrong way round (under the mean each token weighs 1 / its own reply's length, so the "
            "shorter reply's tokens get the larger gradient)": flip if reduction == "mean" else None,
            "a length effect under the sum: summed log-probabilities weigh every token the same":
                rejected_length / chosen_length if reduction == "sum" else None,
            "no length effect under the mean: each token's weight is 1 / its reply's length":
                1.0 if reduction == "mean" else None,
            "the two reductions swapped": (1.0 if reduction == "mean" else rejected_length / chosen_length),
        }
        outcomes.append(Outcome(case, got, _measured_ratio(chosen_length, rejected_length, reduction), mistakes))
    check_numbers(name, outcomes, hint="write each reply's sequence log-probability as a weighted sum of its tokens' "
                  "log-probabilities and read off one token's weight under each reduction; at policy = reference, "
                  "what multiplies the two replies' terms is the same for both.", rel_tol=1e-4)
    return f"{len(outcomes)} pairs, predicted and measured with autograd"
