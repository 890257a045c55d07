"""Chapter 11 checks accept the reference and reject stubs and the common mistakes, naming each."""

import math
import re

import pytest
import torch
import torch.nn.functional as F

from minimind_ref import dpo
from minimind_ref.checks import ch11, delegation
from minimind_ref.checks.core import ExerciseError

from _helpers import check_fails


@pytest.fixture(autouse=True)
def _references_may_be_called(monkeypatch):
    """These tests pass the package's own functions, and mistakes built from them, as the learner's:
    the delegation guard is off here except in the tests of the guard."""
    monkeypatch.setattr(delegation, "ENFORCED", False)


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise 11.x: stub")


def mean_loss(ref, pol, mask, beta):
    """c090b69's dpo_loss (exercise 11.3): the per-token mean."""
    return dpo.dpo_loss(ref, pol, mask, beta, reduction="mean")


def token_lp(logits, labels):
    return F.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)


# ---------------------------------------------------------------------- 11.1
def seq_reference(logits, labels, mask):
    return dpo.sequence_log_probs(dpo.logits_to_log_probs(logits, labels), mask, "mean")


def test_sequence_log_probs_reference_passes(capsys):
    ch11.check_sequence_log_probs(seq_reference)
    assert capsys.readouterr().out.startswith("✓")


SEQ_MISTAKES = {
    "the masked sum, not the mean": lambda lo, la, m: (token_lp(lo, la) * m).sum(1),
    "the mean over every position": lambda lo, la, m: token_lp(lo, la).mean(1),
    "divided by the whole row length": lambda lo, la, m: (token_lp(lo, la) * m).sum(1) / m.shape[1],
    "raw logits gathered without log_softmax":
        lambda lo, la, m: (lo.gather(-1, la[..., None]).squeeze(-1) * m).sum(1) / m.sum(1).clamp_min(1e-8),
    "probabilities (softmax) averaged":
        lambda lo, la, m: (F.softmax(lo, -1).gather(-1, la[..., None]).squeeze(-1) * m).sum(1) / m.sum(1).clamp_min(1e-8),
    "the mask shifted by one position":
        lambda lo, la, m: (token_lp(lo, la)[:, 1:] * m[:, :-1]).sum(1) / m[:, :-1].sum(1).clamp_min(1e-8),
    "one count for the whole batch": lambda lo, la, m: (token_lp(lo, la) * m).sum(1) / m.sum(),
    "NaN for a sequence whose mask is all zeros": lambda lo, la, m: (token_lp(lo, la) * m).sum(1) / m.sum(1),
}


@pytest.mark.parametrize("message", list(SEQ_MISTAKES))
def test_sequence_log_probs_names_the_mistake(message):
    with pytest.raises(ExerciseError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ch11.check_sequence_log_probs(SEQ_MISTAKES[message])


def test_sequence_log_probs_rejects_stub_and_in_place_edits():
    with pytest.raises(ExerciseError, match="not implemented"):
        ch11.check_sequence_log_probs(stub)

    def edits_mask(logits, labels, mask):
        mask[:, 0] = 1
        return seq_reference(logits, labels, mask)

    with pytest.raises(ExerciseError, match="in place"):
        ch11.check_sequence_log_probs(edits_mask)


# ---------------------------------------------------------------------- 11.2
def test_dpo_loss_reference_passes(capsys):
    ch11.check_dpo_loss(mean_loss)
    assert capsys.readouterr().out.startswith("✓")


def _seq(lp, mask):
    m = mask.float()
    return (lp * m).sum(1) / m.sum(1).clamp_min(1e-8)


def loss_from(fn):
    def loss(ref, pol, mask, beta):
        r, p = _seq(ref, mask), _seq(pol, mask)
        b = r.shape[0] // 2
        return fn(r, p, b, beta)
    return loss


LOSS_MISTAKES = {
    "a margin of the opposite sign": loss_from(lambda r, p, b, beta: (-F.logsigmoid(beta * ((p[b:] - p[:b]) - (r[b:] - r[:b])))).mean()),
    "the reference terms left out": loss_from(lambda r, p, b, beta: (-F.logsigmoid(beta * (p[:b] - p[b:]))).mean()),
    "the reference added instead of subtracted":
        loss_from(lambda r, p, b, beta: (-F.logsigmoid(beta * ((p[:b] - p[b:]) + (r[:b] - r[b:])))).mean()),
    "a margin that compares other rows than the pairs":
        loss_from(lambda r, p, b, beta: (-F.logsigmoid(beta * ((p[0::2] - p[1::2]) - (r[0::2] - r[1::2])))).mean()),
    "beta outside the log-sigmoid":
        loss_from(lambda r, p, b, beta: (-beta * F.logsigmoid((p[:b] - p[b:]) - (r[:b] - r[b:]))).mean()),
    "the minus sign of -logsigmoid missing":
        loss_from(lambda r, p, b, beta: F.logsigmoid(beta * ((p[:b] - p[b:]) - (r[:b] - r[b:]))).mean()),
    "summed over the pairs": loss_from(lambda r, p, b, beta: (-F.logsigmoid(beta * ((p[:b] - p[b:]) - (r[:b] - r[b:])))).sum()),
    "the paper's summed sequence log-probabilities": lambda ref, pol, mask, beta: dpo.dpo_loss(ref, pol, mask, beta),
}


@pytest.mark.parametrize("message", list(LOSS_MISTAKES))
def test_dpo_loss_names_the_mistake(message):
    with pytest.raises(ExerciseError, match=message):
        ch11.check_dpo_loss(LOSS_MISTAKES[message])


def test_dpo_loss_rejects_stub_detached_nan_and_per_pair():
    with pytest.raises(ExerciseError, match="not implemented"):
        ch11.check_dpo_loss(stub)
    with pytest.raises(ExerciseError, match="no gradient"):
        ch11.check_dpo_loss(lambda ref, pol, mask, beta: mean_loss(ref, pol.detach(), mask, beta))

    def no_clamp(ref, pol, mask, beta):
        m = mask.float()
        r, p = (ref * m).sum(1) / m.sum(1), (pol * m).sum(1) / m.sum(1)
        b = r.shape[0] // 2
        return (-F.logsigmoid(beta * ((p[:b] - p[b:]) - (r[:b] - r[b:])))).mean()

    with pytest.raises(ExerciseError, match="NaN"):
        ch11.check_dpo_loss(no_clamp)
    with pytest.raises(ExerciseError, match="scalar"):
        ch11.check_dpo_loss(lambda ref, pol, mask, beta: dpo.dpo_pair_stats(ref, pol, mask, beta, "mean")["loss"])


# ---------------------------------------------------------------------- 11.4 the margin a loss means
def test_margin_at_loss_reference_passes_and_gives_the_loss_back(capsys):
    ch11.check_margin_at_loss(ch11.margin_at_loss_reference)
    assert capsys.readouterr().out.startswith("✓")
    for loss, beta in ch11._margin_cases():  # the closed form is the loss of section 2 inverted: measured here
        margin = ch11.margin_at_loss_reference(loss, beta)
        ref, pol = torch.zeros(2, 1, dtype=torch.float64), torch.tensor([[margin], [0.0]], dtype=torch.float64)
        got = float(dpo.dpo_loss(ref, pol, torch.ones(2, 1, dtype=torch.float64), beta, reduction="sum"))
        assert abs(got - loss) < 1e-12, (loss, beta, got)


def test_margin_at_loss_accepts_another_way_to_write_it(capsys):
    import math

    ch11.check_margin_at_loss(lambda loss, beta: (-loss - math.log(1 - math.exp(-loss))) / beta)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize("description", list(ch11._margin_mistakes(0.3, 0.15)))
def test_margin_at_loss_names_each_mistake(description):
    def planted(loss, beta):
        value = ch11._margin_mistakes(loss, beta)[description]
        return value if value is not None else math.log(-1.0)  # where the mistake cannot be computed, it crashes

    message = check_fails(ch11.check_margin_at_loss, planted, "this looks like " + description)
    assert "yours is" in message  # which way it is off, never the margin


def test_margin_at_loss_rejects_stub_and_non_numbers():
    check_fails(ch11.check_margin_at_loss, stub, "11.4", "not implemented")
    check_fails(ch11.check_margin_at_loss, lambda loss, beta: "7", "expected a number")


# ---------------------------------------------------------------------- 11.3 the draft
def test_dpo_loss_names_the_draft_left_as_it_stands():
    check_fails(ch11.check_dpo_loss, ch11.dpo_loss_draft, "this looks like the draft as it stands")


def test_the_draft_stays_at_ln2_when_the_policy_moves_towards_the_chosen_replies():
    """What the chapter shows of the draft before the exercise: ln 2 at the start (right), and ln 2 still
    when the policy gives every chosen reply more log-probability (wrong: it should fall)."""
    import math

    ref, _, mask = ch11._log_probs_case(5, 4, 9, empty_row=False)  # an even number of pairs, as in the chapter
    toward = ref + 0.1 * mask * (torch.arange(8) < 4)[:, None]
    assert abs(float(ch11.dpo_loss_draft(ref, ref.clone(), mask, 0.15)) - math.log(2)) < 1e-6
    assert abs(float(ch11.dpo_loss_draft(ref, toward, mask, 0.15)) - math.log(2)) < 1e-6
    assert float(mean_loss(ref, toward, mask, 0.15)) < math.log(2) - 1e-3


@pytest.mark.parametrize("check, delegate", [
    (ch11.check_sequence_log_probs, lambda lg, lb, m: dpo.sequence_log_probs(dpo.logits_to_log_probs(lg, lb), m, "mean")),
    (ch11.check_dpo_loss, mean_loss),
    (ch11.check_gradient_ratio, lambda c, r, red: ch11._measured_ratio(c, r, red)),
])
def test_a_function_that_calls_the_package_answer_fails(monkeypatch, check, delegate):
    monkeypatch.setattr(delegation, "ENFORCED", True)
    if check is ch11.check_gradient_ratio:  # measuring a prediction is refused for its own reason
        check_fails(check, delegate, "your function calls minimind_ref.dpo.dpo_loss", "not to measure it on a loss")
    else:
        check_fails(check, delegate, "your function calls minimind_ref.dpo.", "the package's own answer to this exercise")


# ---------------------------------------------------------------------- 11.4
def shift_reference(ids, mask):
    ids, mask = torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)
    return ids[:-1], ids[1:], mask[1:]


def test_shift_reference_passes(capsys):
    ch11.check_shift_example(shift_reference)
    assert capsys.readouterr().out.startswith("✓")


def shift_mask_unshifted(ids, mask):
    x, y, _ = shift_reference(ids, mask)
    return x, y, torch.tensor(mask[:-1])


def shift_swapped(ids, mask):
    x, y, m = shift_reference(ids, mask)
    return y, x, m


def shift_float_mask(ids, mask):
    x, y, m = shift_reference(ids, mask)
    return x, y, m.float()


@pytest.mark.parametrize("wrong, message", [
    (shift_mask_unshifted, "the mask cut at its end"),
    (lambda ids, mask: shift_reference(ids, mask)[:2] + (torch.tensor(mask[:-1]) & torch.tensor(mask[1:]),),
     "at its own position and at the one before"),
    (lambda ids, mask: shift_reference(ids, mask)[:2] + (torch.tensor(mask[:-1]) | torch.tensor(mask[1:]),),
     "at its own position or at the one before"),
    (shift_swapped, "inputs and targets the other way round"),
    (shift_float_mask, "torch.long"),
    (lambda ids, mask: shift_reference(ids, mask)[:2], "three tensors"),
    (stub, "not implemented"),
])
def test_shift_names_the_mistake(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        ch11.check_shift_example(wrong)


# ---------------------------------------------------------------------- cases the newcomer's review planted
def _upstream_loss(ref, pol, mask, beta):
    m = mask.float()
    r, p = (ref * m).sum(1) / m.sum(1).clamp_min(1e-8), (pol * m).sum(1) / m.sum(1).clamp_min(1e-8)
    b = r.shape[0] // 2
    return (-F.logsigmoid(beta * ((p[:b] - p[b:]) - (r[:b] - r[b:])))).mean()


def test_dpo_loss_with_policy_and_reference_swapped_names_both_readings():
    """(policy, reference) swapped gives the same number as (chosen, rejected) swapped: the margin's
    sign reversed. The message names what both give and where to look, not which of the two it is (one of them
    is a mistake of the draft the learner debugs)."""
    msg = check_fails(ch11.check_dpo_loss, lambda ref, pol, mask, beta: _upstream_loss(pol, ref, mask, beta),
                      "a margin of the opposite sign", "look at what is subtracted from what")
    assert msg.startswith("[Exercise 11.3 dpo_loss]"), msg


def test_dpo_loss_cut_from_the_policy_says_so_not_nonetype():
    """A loss with the right value that requires grad but is not connected to policy_log_probs (the
    policy detached and re-wrapped) used to end in "got NoneType"."""
    def rewrapped(ref, pol, mask, beta):
        return torch.tensor(float(_upstream_loss(ref, pol.detach(), mask, beta)), requires_grad=True)

    msg = check_fails(ch11.check_dpo_loss, rewrapped, "does not depend on policy_log_probs", "detached")
    assert "NoneType" not in msg, msg


@pytest.mark.parametrize("argument", ["ref_log_probs", "mask"])
def test_dpo_loss_rejects_in_place_edits_of_its_inputs(argument):
    def edits(ref, pol, mask, beta):
        if argument == "mask":
            mask[:, 0] = 1
        else:
            ref.mul_(mask)
        return _upstream_loss(ref, pol, mask, beta)

    check_fails(ch11.check_dpo_loss, edits, "changed its input", "in place")


def test_the_exercises_are_numbered_in_the_order_the_chapter_asks_for_them():
    import inspect

    source = inspect.getsource(ch11)
    names = re.findall(r'@check\("Exercise (11\.\d) ([^"]+)"[,)]', source)  # the name, then the declaration or the end
    assert names == [("11.1", "sequence_log_probs"), ("11.2", "shift_example"), ("11.3", "dpo_loss"),
                     ("11.4", "margin_at_loss"), ("11.5", "gradient_ratio")], names


# ---------------------------------------------------------------------- 11.5 the length effect
def test_gradient_ratio_reference_passes_and_mistakes_are_named(capsys):
    ch11.check_gradient_ratio(ch11.gradient_ratio_reference)
    assert capsys.readouterr().out.startswith("✓")
    with pytest.raises(ExerciseError, match="not implemented"):
        ch11.check_gradient_ratio(stub)
    with pytest.raises(ExerciseError, match="this looks like the lengths the wrong way round"):
        ch11.check_gradient_ratio(lambda c, r, red: 1.0 if red == "sum" else c / r)
    with pytest.raises(ExerciseError, match="this looks like a length effect under the sum"):
        ch11.check_gradient_ratio(lambda c, r, red: r / c)
    with pytest.raises(ExerciseError, match="this looks like no length effect under the mean"):
        ch11.check_gradient_ratio(lambda c, r, red: 1.0)
    with pytest.raises(ExerciseError, match="this looks like the two reductions swapped"):
        ch11.check_gradient_ratio(lambda c, r, red: 1.0 if red == "mean" else r / c)
    with pytest.raises(ExerciseError, match="expected a number"):
        ch11.check_gradient_ratio(lambda c, r, red: "1")
    with pytest.raises(ExerciseError) as err:  # the measured ratio is the answer: it is not shown
        ch11.check_gradient_ratio(lambda c, r, red: 2.5)
    assert "yours is" in str(err.value) and "measured" not in str(err.value) and "0.25" not in str(err.value)


# ---------------------------------------------------------------------- issue 44, the second newcomer probe
# The mistakes a newcomer planted in chapter 11's exercises that the checks passed, debugged for the learner or
# left unnamed, as a learner writes them; each message must name the mistake (a debug exercise's message says
# where the draft's remaining mistake shows, not what it is).
def _seq_lp(axis=-1, again=False, batch_mean=False):
    def sequence_log_probs(logits, labels, mask):
        if again:
            lp = logits[:, :-1].log_softmax(-1).gather(-1, labels[:, 1:].unsqueeze(-1)).squeeze(-1)
            m = mask[:, 1:].float()
        else:
            lp = logits.log_softmax(axis).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
            m = mask.float()
        if batch_mean:
            return lp[mask.bool()].mean().expand(lp.shape[0]).clone()
        return (lp * m).sum(1) / m.sum(1).clamp_min(1e-8)
    return sequence_log_probs


@pytest.mark.parametrize("fn, fragment", [
    (_seq_lp(axis=1), "log_softmax taken over the sequence instead of over the vocabulary"),
    (_seq_lp(again=True), "logits and labels shifted once more against each other"),
    (_seq_lp(batch_mean=True), "one mean for the whole batch, the same for every row"),
])
def test_probe_sequence_log_probs_mistakes_are_named(fn, fragment):
    check_fails(ch11.check_sequence_log_probs, fn, "this looks like " + fragment)


def test_probe_sequence_log_probs_may_not_gather_with_the_package(monkeypatch):
    monkeypatch.setattr(delegation, "ENFORCED", True)

    def half_handed_over(logits, labels, mask):
        lp = dpo.logits_to_log_probs(logits, labels)
        return (lp * mask).sum(1) / mask.sum(1).clamp_min(1e-8)

    check_fails(ch11.check_sequence_log_probs, half_handed_over, "your function calls minimind_ref.dpo.logits_to_log_probs")


@pytest.mark.parametrize("fn, fragment", [
    (lambda ids, mask: (torch.tensor(ids[:-1]), torch.tensor(ids[1:]), torch.tensor(mask)), "the mask not shifted at all"),
    (lambda ids, mask: (list(ids[:-1]), list(ids[1:]), list(mask[1:])), "the inputs, targets and mask returned as Python lists"),
])
def test_probe_shift_example_mistakes_are_named(fn, fragment):
    message = check_fails(ch11.check_shift_example, fn, "this looks like " + fragment)
    assert "goes with the targets" not in message


def _probe_dpo(split="halves", sign=1, use_beta=True, lengths="own"):
    def dpo_loss(ref_log_probs, policy_log_probs, mask, beta):
        n = mask.sum(dim=1).clamp_min(1e-8) if lengths == "own" else mask.shape[1]
        ref = (ref_log_probs * mask).sum(dim=1) / n
        policy = (policy_log_probs * mask).sum(dim=1) / n
        B = ref.shape[0] // 2
        if split == "halves":
            margin = (policy[:B] - policy[B:]) - (ref[:B] - ref[B:])
        else:
            margin = (policy[0::2] - policy[1::2]) - (ref[0::2] - ref[1::2])
        return (-F.logsigmoid((beta if use_beta else 1.0) * sign * margin)).mean()
    return dpo_loss


@pytest.mark.parametrize("fn, fragment", [
    (_probe_dpo(split="neighbours"), "a margin that compares other rows than the pairs"),
    (_probe_dpo(sign=-1), "a margin of the opposite sign"),
    (_probe_dpo(use_beta=False), "beta left out"),
    (_probe_dpo(lengths="padded"), "each reply's log-probability divided by the padded row length"),
])
def test_probe_dpo_loss_mistakes_are_named(fn, fragment):
    message = check_fails(ch11.check_dpo_loss, fn, "this looks like " + fragment)
    # the draft's mistakes are located, not spelled out with their fix
    assert "instead of rows i and i + B" not in message and "the policy's margin minus the reference's" not in message


def test_probe_dpo_loss_may_not_build_on_the_packages_pieces(monkeypatch):
    monkeypatch.setattr(delegation, "ENFORCED", True)

    def from_pieces(ref_log_probs, policy_log_probs, mask, beta):
        r = dpo.implicit_rewards(dpo.sequence_log_probs(policy_log_probs, mask, "mean"),
                                 dpo.sequence_log_probs(ref_log_probs, mask, "mean"), beta)
        B = r.shape[0] // 2
        return (-F.logsigmoid(r[:B] - r[B:])).mean()

    check_fails(ch11.check_dpo_loss, from_pieces, "your function calls minimind_ref.dpo.sequence_log_probs")


@pytest.mark.parametrize("fn, fragment", [
    (lambda loss, beta: float(-torch.log(torch.exp(torch.tensor(loss, dtype=torch.float32)) - 1) / beta),
     "the margin computed in float32"),
    (lambda loss, beta: -math.log(loss) / beta, "the loss taken for the pair's probability itself"),
    (lambda loss, beta: math.log(loss / (1 - loss)) / beta, "the loss undone as the logit of the pair's probability"),
])
def test_probe_margin_at_loss_mistakes_are_named(fn, fragment):
    message = check_fails(ch11.check_margin_at_loss, fn, "this looks like " + fragment)
    assert "loss=0.6931," not in message  # ln 2 is named as such


@pytest.mark.parametrize("fn, fragment", [
    (lambda c, r, red: -1.0 if red == "sum" else -r / c, "a signed ratio"),
    (lambda c, r, red: 1.0 if red == "sum" else (r / c) ** 2, "the ratio squared"),
    (lambda c, r, red: 1 if red == "sum" else r // c, "the lengths divided as integers"),
])
def test_probe_gradient_ratio_mistakes_are_named(fn, fragment):
    check_fails(ch11.check_gradient_ratio, fn, "this looks like " + fragment)


def measured_with_own_loss(chosen_length, rejected_length, reduction):
    """Measuring the ratio with a loss of one's own and autograd, instead of predicting it."""
    T = max(chosen_length, rejected_length)
    mask = torch.zeros(2, T)
    mask[0, :chosen_length], mask[1, :rejected_length] = 1, 1
    pol = torch.zeros(2, T, requires_grad=True)
    s = (pol * mask).sum(1)
    if reduction == "mean":
        s = s / mask.sum(1)
    (-F.logsigmoid(0.1 * (s[0] - s[1]))).backward()
    return float(pol.grad[0, 0].abs() / pol.grad[1, 0].abs())


def test_probe_gradient_ratio_refuses_a_measurement(monkeypatch):
    monkeypatch.setattr(delegation, "ENFORCED", True)
    check_fails(ch11.check_gradient_ratio, measured_with_own_loss, "your function calls a log-sigmoid",
                "not to measure it on a loss")
    # and no measurement reaches the longest replies the check asks about
    assert max(max(c, r) for c, r, _ in ch11._ratio_cases()) > 10**11


def test_gradient_ratio_written_with_a_sigmoid_is_not_refused(monkeypatch):
    """A prediction that writes the gradient's sigmoid factor out (sigma(0) = 1/2 on both replies) states the rule;
    only a log-sigmoid loss, autograd or the package's loss measure it."""
    monkeypatch.setattr(delegation, "ENFORCED", True)

    def with_the_factor(chosen_length, rejected_length, reduction):
        factor = torch.sigmoid(torch.tensor(0.0))  # the same on the chosen and the rejected token
        ratio = 1.0 if reduction == "sum" else rejected_length / chosen_length
        return float(factor * ratio / factor)

    ch11.check_gradient_ratio(with_the_factor)
