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
from .core import ExerciseError, Outcome, as_number, call, check, check_close, check_numbers, fail, seeded, solution
from .delegation import forbid, guarded


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
        got = call(guarded(sequence_log_probs, name, {"minimind_ref.dpo.sequence_log_probs": ref_dpo.sequence_log_probs,
                                                      "minimind_ref.dpo.logits_to_log_probs": ref_dpo.logits_to_log_probs}),
                   logits.clone(), labels.clone(), mask.clone(), name=name, case=case, check_inputs=True)
        token_lp = F.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
        expected = ref_dpo.sequence_log_probs(ref_dpo.logits_to_log_probs(logits, labels), mask, "mean")
        m = mask.float()
        lp_seq = F.log_softmax(logits, 1).gather(-1, labels[..., None]).squeeze(-1)
        lp_again = F.log_softmax(logits[:, :-1], -1).gather(-1, labels[:, 1:, None]).squeeze(-1)
        mistakes: Dict[str, Any] = {
            "the masked sum, not the mean": lambda: (token_lp * m).sum(1),
            "the mean over every position, padding and prompt included (the mask not applied)":
                lambda: token_lp.mean(1),
            "the masked sum divided by the whole row length instead of the number of masked tokens (upstream's "
            "loss before issue #298)":
                lambda: (token_lp * m).sum(1) / m.shape[1],
            "raw logits gathered without log_softmax": lambda: (logits.gather(-1, labels[..., None]).squeeze(-1) * m).sum(1)
            / m.sum(1).clamp_min(1e-8),
            "probabilities (softmax) averaged instead of log-probabilities":
                lambda: (F.softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1) * m).sum(1) / m.sum(1).clamp_min(1e-8),
            "the mask shifted by one position against the labels":
                lambda: (token_lp[:, 1:] * m[:, :-1]).sum(1) / m[:, :-1].sum(1).clamp_min(1e-8),
            "logits and labels shifted once more against each other, although they come aligned":
                lambda: (lp_again * m[:, 1:]).sum(1) / m[:, 1:].sum(1).clamp_min(1e-8),
            "log_softmax taken over the sequence instead of over the vocabulary":
                lambda: (lp_seq * m).sum(1) / m.sum(1).clamp_min(1e-8),
            "one count for the whole batch instead of one per sequence":
                lambda: (token_lp * m).sum(1) / m.sum(),
            "one mean for the whole batch, the same for every row":
                lambda: ((token_lp * m).sum() / m.sum()).expand(m.shape[0]).clone(),
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
        # two replies first: there every mask mistake below gives its own answer, so the first one a learner
        # gets wrong names the mistake (on a reply that ends the sequence, "mask[:-1]" and "both neighbours" agree)
        ("two replies", [1, 8, 9, 3, 2, 7, 1, 8, 9, 4, 2, 7], [0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1]),
        ("a reply in the middle", [1, 5, 6, 2, 7, 1, 8, 9, 4, 2, 7], [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1]),
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
            {swapped: t_ids[1:], "the whole sequence as input": t_ids},
            {swapped: t_ids[:-1], "the whole sequence as target": t_ids},
            {"the mask cut at its end": t_mask[:-1],
             "a target counted only where the mask holds at its own position and at the one before":
                 t_mask[:-1] & t_mask[1:],
             "a target counted where the mask holds at its own position or at the one before": t_mask[:-1] | t_mask[1:],
             "the mask not shifted at all": t_mask},
        ]
        if any(isinstance(part, (list, tuple)) for part in got):
            fail(name, f"this looks like the inputs, targets and mask returned as Python lists ({case})",
                 "the dataset hands the training loop tensors of dtype torch.long.")
        for part, (g_part, e_part, label) in enumerate(zip(got, expected, ("x", "y", "loss_mask"))):
            if isinstance(g_part, torch.Tensor) and g_part.dtype != torch.long:
                fail(name, f"{label} has dtype {g_part.dtype}; upstream's dataset returns torch.long ({case})",
                     "make the tensors of dtype torch.long.")
            check_close(g_part, e_part, name=f"{name} ({label})", rtol=0, atol=0, mistakes=mistakes[part],
                        case=case, hint="write out a short example by hand: the ids, then x and y under them, and "
                                        "under each target of y whether the loss must count it.")
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


# what would answer 11.3 without any of the work: the package's loss and the pieces it is made of
DPO_FUNCTIONS = {"minimind_ref.dpo.dpo_loss": ref_dpo.dpo_loss,
                 "minimind_ref.dpo.sequence_log_probs": ref_dpo.sequence_log_probs,
                 "minimind_ref.dpo.implicit_rewards": ref_dpo.implicit_rewards,
                 "minimind_ref.dpo.dpo_pair_stats": ref_dpo.dpo_pair_stats}


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
        got = call(guarded(dpo_loss, name, DPO_FUNCTIONS), ref.clone(), pol, mask.clone(), beta, name=name, case=case,
                   check_inputs=True)
        expected = ref_dpo.dpo_loss(ref, policy, mask, beta, reduction="mean")
        m = mask.float()
        seq_ref = (ref * m).sum(1) / m.sum(1).clamp_min(1e-8)
        seq_pol = (policy * m).sum(1) / m.sum(1).clamp_min(1e-8)
        b = pairs

        def from_logits(logits: torch.Tensor) -> torch.Tensor:
            return (-F.logsigmoid(beta * logits)).mean()

        padded_ref = (ref * m).sum(1) / m.shape[1]
        padded_pol = (policy * m).sum(1) / m.shape[1]
        # the draft's two mistakes, each left alone: the message says that one is still there and where it shows,
        # not which it is (the exercise is to find it)
        mistakes: Dict[str, Any] = {
            "a margin of the opposite sign, as one of the draft's two mistakes gives (look at what is subtracted "
            "from what)":
                lambda: from_logits((seq_pol[b:] - seq_pol[:b]) - (seq_ref[b:] - seq_ref[:b])),
            "a margin that compares other rows than the pairs, as one of the draft's two mistakes gives (look at "
            "which rows are set against each other)":
                lambda: from_logits((seq_pol[0::2] - seq_pol[1::2]) - (seq_ref[0::2] - seq_ref[1::2])),
            "the draft as it stands: both of its mistakes are still there":
                lambda: dpo_loss_draft(ref, policy, mask, beta),
            "the reference terms left out": lambda: from_logits(seq_pol[:b] - seq_pol[b:]),
            "the reference added instead of subtracted":
                lambda: from_logits((seq_pol[:b] - seq_pol[b:]) + (seq_ref[:b] - seq_ref[b:])),
            "beta left out": lambda: (-F.logsigmoid((seq_pol[:b] - seq_pol[b:]) - (seq_ref[:b] - seq_ref[b:]))).mean(),
            "beta outside the log-sigmoid":
                lambda: (-beta * F.logsigmoid((seq_pol[:b] - seq_pol[b:]) - (seq_ref[:b] - seq_ref[b:]))).mean(),
            "the minus sign of -logsigmoid missing":
                lambda: F.logsigmoid(beta * ((seq_pol[:b] - seq_pol[b:]) - (seq_ref[:b] - seq_ref[b:]))).mean(),
            "summed over the pairs instead of averaged":
                lambda: (-F.logsigmoid(beta * ((seq_pol[:b] - seq_pol[b:]) - (seq_ref[:b] - seq_ref[b:])))).sum(),
            "each reply's log-probability divided by the padded row length instead of its own":
                lambda: from_logits((padded_pol[:b] - padded_pol[b:]) - (padded_ref[:b] - padded_ref[b:])),
            "the paper's summed sequence log-probabilities (d65ef2c's default; this exercise is c090b69's mean)":
                lambda: ref_dpo.dpo_loss(ref, policy, mask, beta, reduction="sum"),
        }
        _check_value_and_gradient(name, got, pol, expected, lambda p: ref_dpo.dpo_loss(ref, p, mask, beta, reduction="mean"),
                                  policy, mistakes, case,
                                  hint="compare the draft with section 2's loss term by term, and with what the "
                                       "draft's printout showed it cannot see.")
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
    large betas (beta = 1 would hide a forgotten beta), ln 2 itself and a loss just above it (a margin near 0,
    where float32's rounding is larger than the margin), and losses far below ln 2."""
    return [(0.3, 0.15), (0.05, 0.1), (1.2, 0.5), (math.log(2), 2.0), (0.6932, 2.0), (0.1, 0.15), (2.5, 0.15),
            (0.001, 0.1)]


def _margin_case(loss: float, beta: float) -> str:
    return f"loss=ln 2={loss!r}, beta={beta}" if loss == math.log(2) else f"loss={loss}, beta={beta}"


def _float32_margin(loss: float, beta: float) -> float:
    t = torch.tensor(loss, dtype=torch.float32)
    return float(-torch.log(torch.exp(t) - 1) / beta)


def _margin_mistakes(loss: float, beta: float) -> Dict[str, Any]:
    exact = margin_at_loss_reference(loss, beta)
    return {
        "beta left out (the loss sees beta times the margin)": exact * beta,
        "beta multiplied instead of divided out": exact * beta * beta,
        "the sign of the margin reversed": -exact,
        "the sigmoid undone as if it were an exponential": -loss / beta,
        "the loss taken for the pair's probability itself, and only its log undone": -math.log(loss) / beta,
        "the loss undone as the logit of the pair's probability": math.log(loss / (1 - loss)) / beta if loss < 1 else None,
        "the margin computed in float32, whose rounding near ln 2 is larger than the margin itself":
            _float32_margin(loss, beta),
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
        case = _margin_case(loss, beta)
        try:
            got = call(margin_at_loss, loss, beta, name=name, case=case)
        except ExerciseError:
            # a crash on a later case (a log of a negative number) after a wrong earlier one: explain the earlier
            if any(not math.isclose(o.got, o.expected, rel_tol=1e-6, abs_tol=1e-9) for o in outcomes):
                break
            raise
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
    a one-token reply, and replies longer than any tensor could hold (their ratio follows from the rule alone;
    ``_measured_ratio`` measures the others)."""
    return [(2, 8, "mean"), (8, 2, "mean"), (5, 5, "mean"), (2, 8, "sum"), (9, 3, "sum"), (1, 12, "mean"),
            (7, 3, "mean"), (12, 1, "sum"), (3 * 10**12, 10**12, "mean"), (10**12, 7, "sum")]


MEASURED_UP_TO = 10_000  # lengths the check measures with autograd; longer ones only the rule answers


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


MEASURING = "the exercise asks you to predict the ratio from the lengths, not to measure it on a loss"
# measuring the ratio (with the package's loss, a loss of one's own, autograd) answers nothing: 11.5 predicts it
MEASURING_11_5 = [forbid("minimind_ref.dpo.dpo_loss", ref_dpo.dpo_loss, reason=MEASURING),
                  forbid("a log-sigmoid (F.logsigmoid)", F.logsigmoid, reason=MEASURING),
                  forbid("autograd (backward, torch.autograd.grad)", torch.Tensor.backward, torch.autograd.backward,
                         torch.autograd.grad, reason=MEASURING),
                  forbid("ch11.gradient_ratio_reference", gradient_ratio_reference)]
PREDICT_HINT = ("write each reply's sequence log-probability as a weighted sum of its tokens' log-probabilities and "
                "read off one token's weight under each reduction.")


@check("Exercise 11.5 gradient_ratio", shown=False,
       why="the ratio is a closed form of the case's two lengths: the measured value next to them would be the answer")
def check_gradient_ratio(gradient_ratio: Callable[..., Any]) -> str:
    """``gradient_ratio(chosen_length, rejected_length, reduction) -> float``: predict, for a pair
    whose chosen reply has ``chosen_length`` tokens and rejected reply ``rejected_length``, the
    ratio of the loss's gradient on one chosen token's log-probability to that on one rejected
    token's, at the start of training (policy = reference), under c090b69's ``"mean"`` or d65ef2c's
    ``"sum"``. The check measures it with autograd on ``minimind_ref.dpo.dpo_loss`` and compares
    (relative tolerance 1e-4); for replies too long for any tensor, only the rule answers, and a function that
    measures the ratio (a loss, a log-sigmoid or autograd inside it) is refused."""
    name = "Exercise 11.5 gradient_ratio"
    outcomes = []
    for chosen_length, rejected_length, reduction in _ratio_cases():
        case = f"chosen {chosen_length} tokens, rejected {rejected_length}, reduction={reduction!r}"
        got = call(guarded(gradient_ratio, name, MEASURING_11_5, case=case, hint=PREDICT_HINT),
                   chosen_length, rejected_length, reduction, name=name, case=case)
        got = as_number(got, name, case, integer=False, what="the ratio")
        right = gradient_ratio_reference(chosen_length, rejected_length, reduction)
        flip = chosen_length / rejected_length
        mistakes = {
            "the lengths the wrong way round under the mean": flip if reduction == "mean" else None,
            "a length effect under the sum": rejected_length / chosen_length if reduction == "sum" else None,
            "no length effect under the mean": 1.0 if reduction == "mean" else None,
            "the two reductions swapped": (1.0 if reduction == "mean" else rejected_length / chosen_length),
            "a signed ratio: the exercise compares the sizes of the two gradients": -right,
            "the ratio squared": right ** 2,
            "the lengths divided as integers, which drops the fraction":
                float(rejected_length // chosen_length) if reduction == "mean" else None,
        }
        measured = (_measured_ratio(chosen_length, rejected_length, reduction)
                    if max(chosen_length, rejected_length) <= MEASURED_UP_TO else right)
        outcomes.append(Outcome(case, got, measured, mistakes))
    check_numbers(name, outcomes, hint="write each reply's sequence log-probability as a weighted sum of its tokens' "
                  "log-probabilities and read off one token's weight under each reduction; at policy = reference, "
                  "what multiplies the two replies' terms is the same for both.", rel_tol=1e-4)
    return f"{len(outcomes)} pairs, predicted and measured with autograd, replies of up to 3e12 tokens included"
