"""Chapter 12 checks accept the reference and reject stubs and the common mistakes, naming each."""

import math

import pytest
import torch

from _helpers import check_fails, stub
from minimind_ref import grpo
from minimind_ref.checks import ch12, delegation


@pytest.fixture(autouse=True)
def _references_may_be_called(monkeypatch):
    """These tests pass the package's own functions, and mistakes built from them, as the learner's:
    the delegation guard is off here except in the tests of the guard."""
    monkeypatch.setattr(delegation, "ENFORCED", False)


def c090b69_advantages(r, g, **kwargs):
    """c090b69's advantages: grpo.group_advantages with C090B69_ADVANTAGES."""
    return grpo.group_advantages(r, g, **{**grpo.C090B69_ADVANTAGES, **kwargs})


def c090b69_loss(lp, ref, a, m, b, reduction="sequence"):
    """c090b69's loss (exercise 12.3): PPO-clip with the current policy as the old one."""
    return grpo.grpo_loss(lp, lp.detach(), ref, a, m, b, loss_type="grpo", reduction=reduction)


def _grouped(r, g, unbiased=True):
    x = r.view(-1, g)
    return x.mean(1).repeat_interleave(g), x.std(1, unbiased=unbiased).repeat_interleave(g)


# ---------------------------------------------------------------------- 12.1 the factor between the normalisations
def test_rescale_factor_reference_passes_and_equals_the_measured_factor(capsys):
    ch12.check_rescale_factor(ch12.rescale_factor_reference)
    assert capsys.readouterr().out.startswith("✓")
    for seed, (groups, k, size) in enumerate(ch12._rescale_cases()):
        measured = ch12._measured_factor(groups, k, size, seed)
        assert abs(measured / ch12.rescale_factor_reference(groups, k, size) - 1) < 1e-3


def test_rescale_factor_matches_the_chapters_batch():
    """Chapter 12's batch of section 2: 4 groups of 8, one of them flat, factor 1.137."""
    rewards = torch.tensor([1, 0, 1, 1, 0, 1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0,
                            1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0, 1, 0, 1, 0], dtype=torch.float)
    scale = float(c090b69_advantages(rewards, 8)[0] / grpo.group_advantages(rewards, 8)[0])
    assert abs(scale - ch12.rescale_factor_reference(4, 3, 8)) < 1e-3


@pytest.mark.parametrize("description", list(ch12._rescale_mistakes(4, 3, 8)))
def test_rescale_factor_names_each_mistake(description):
    msg = check_fails(ch12.check_rescale_factor, lambda n, k, g: ch12._rescale_mistakes(n, k, g)[description],
                      "this looks like " + description)
    assert "yours is" in msg  # which way it is off, never the factor


def test_rescale_factor_rejects_stub_non_numbers_and_measuring(monkeypatch):
    check_fails(ch12.check_rescale_factor, stub, "12.1", "not implemented")
    check_fails(ch12.check_rescale_factor, lambda n, k, g: "1.1", "expected a number")
    monkeypatch.setattr(delegation, "ENFORCED", True)
    check_fails(ch12.check_rescale_factor, lambda n, k, g: ch12._measured_factor(n, k, g, 0),
                "your function calls minimind_ref.grpo.group_advantages")


# ---------------------------------------------------------------------- 12.2
def test_completion_mask_reference_passes(capsys):
    ch12.check_completion_mask(grpo.completion_mask)
    assert capsys.readouterr().out.startswith("✓")


def _first(ids, eos):
    return (ids == eos).int().argmax(1, keepdim=True), (ids == eos).any(1, keepdim=True)


def _pos(ids):
    return torch.arange(ids.size(1)).expand(ids.size(0), -1)


MASK_MISTAKES = {
    "the end marker itself left out":
        lambda ids, eos: torch.where(_first(ids, eos)[1], _pos(ids) < _first(ids, eos)[0], torch.ones_like(ids, dtype=torch.bool)).int(),
    "a row without an end marker masked to its first token only": lambda ids, eos: (_pos(ids) <= _first(ids, eos)[0]).int(),
    "every token that is not the end marker": lambda ids, eos: (ids != eos).int(),
    "up to the last end marker instead of the first":
        lambda ids, eos: torch.where(_first(ids, eos)[1],
                                     _pos(ids) <= ids.size(1) - 1 - (ids == eos).int().flip(1).argmax(1, keepdim=True),
                                     torch.ones_like(ids, dtype=torch.bool)).int(),
}


@pytest.mark.parametrize("message", list(MASK_MISTAKES))
def test_completion_mask_names_the_mistake(message):
    check_fails(ch12.check_completion_mask, MASK_MISTAKES[message], message)


def test_completion_mask_rejects_stub_and_accepts_a_bool_mask():
    check_fails(ch12.check_completion_mask, stub, "not implemented")
    ch12.check_completion_mask(lambda ids, eos: grpo.completion_mask(ids, eos).bool())


# ---------------------------------------------------------------------- 12.3
def test_grpo_loss_reference_passes(capsys):
    ch12.check_grpo_loss(c090b69_loss)
    assert capsys.readouterr().out.startswith("✓")


def _k3(lp, ref):
    return torch.exp(ref - lp) - (ref - lp) - 1


def _seq(t, m):
    m = m.float()
    return ((t * m).sum(1) / m.sum(1)).mean()


def _ratio(lp):
    return torch.exp(lp - lp.detach())


LOSS_MISTAKES = {
    "the KL term with the wrong sign": lambda lp, ref, a, m, b: _seq(-(_ratio(lp) * a[:, None] + b * _k3(lp, ref)), m),
    "the KL estimator the other way round": lambda lp, ref, a, m, b: _seq(-(_ratio(lp) * a[:, None] - b * _k3(ref, lp)), m),
    "one average over all masked tokens of the batch": lambda lp, ref, a, m, b: c090b69_loss(lp, ref, a, m, b, "token"),
    "no mask": lambda lp, ref, a, m, b: (-(_ratio(lp) * a[:, None] - b * _k3(lp, ref))).mean(),
    "missing the minus sign": lambda lp, ref, a, m, b: -c090b69_loss(lp, ref, a, m, b),
    "a constant ratio of 1": lambda lp, ref, a, m, b: _seq(-(torch.exp(lp - lp) * a[:, None] - b * _k3(lp, ref)), m),
    "has no gradient": lambda lp, ref, a, m, b: c090b69_loss(lp.detach(), ref, a, m, b),
}


@pytest.mark.parametrize("message", list(LOSS_MISTAKES))
def test_grpo_loss_names_the_mistake(message):
    check_fails(ch12.check_grpo_loss, LOSS_MISTAKES[message], message)


def test_grpo_loss_rejects_stub_and_non_scalars():
    check_fails(ch12.check_grpo_loss, stub, "not implemented")
    check_fails(ch12.check_grpo_loss, lambda lp, ref, a, m, b: -(lp * a[:, None]), "scalar")


# ---------------------------------------------------------------------- cases the newcomer's review planted
@pytest.mark.parametrize("argument", ["ref", "advantages", "mask"])
def test_grpo_loss_rejects_in_place_edits_of_its_inputs(argument):
    def edits(lp, ref, a, m, b):
        if argument == "ref":
            ref.clamp_(max=0.0)
            ref[0, 0] -= 1.0
        elif argument == "advantages":
            a.clamp_(-1.0, 1.0)
        else:
            m[:, -1] = 1
        return c090b69_loss(lp, ref, a, m, b)

    check_fails(ch12.check_grpo_loss, edits, "changed its input", "in place")


def test_grpo_loss_cut_from_the_policy_says_so():
    def rewrapped(lp, ref, a, m, b):
        return torch.tensor(float(c090b69_loss(lp.detach(), ref, a, m, b)), requires_grad=True)

    msg = check_fails(ch12.check_grpo_loss, rewrapped, "does not depend on per_token_logps")
    assert "RuntimeError" not in msg and "NoneType" not in msg, msg


# ---------------------------------------------------------------------- 12.4 d65ef2c's advantages, predicted then written
def lone_success(group_size):
    """The closed form: mean 1/G, population std sqrt(G - 1) / G."""
    return math.sqrt(group_size - 1), -1 / math.sqrt(group_size - 1)


def test_advantages_once_reference_passes_and_mistakes_are_named(capsys):
    ch12.check_advantages_once(grpo.group_advantages, lone_success)
    assert capsys.readouterr().out.startswith("✓")
    check_fails(lambda f: ch12.check_advantages_once(f, lone_success), stub, "12.4", "not implemented")
    check_fails(lambda f: ch12.check_advantages_once(grpo.group_advantages, f), stub, "12.4", "not implemented")
    once = lambda f: ch12.check_advantages_once(f, lone_success)  # noqa: E731
    check_fails(once, lambda r, g: grpo.group_advantages(r, g, unbiased=True), "this looks like the sample std")
    check_fails(once, c090b69_advantages, "this looks like a second normalisation")
    check_fails(once, lambda r, g: grpo.group_advantages(r, g, normalize_batch=True), "this looks like a second normalisation")
    check_fails(once, lambda r, g: r - _grouped(r, g)[0], "not divided by the group std")
    check_fails(once, lambda r, g: (r - _grouped(r, g)[0]) / _grouped(r, g, False)[1], "NaN")
    check_fails(once, lambda r, g: (r - r.mean()) / (r.std(unbiased=False) + 1e-4),
                "this looks like one mean and std over the whole batch")


PREDICTION_MISTAKES = {
    "this looks like the sample std": lambda g: ((g - 1) / math.sqrt(g), -1 / math.sqrt(g)),
    "this looks like c090b69's clamp to +-10 kept": lambda g: (min(math.sqrt(g - 1), 10.0), -1 / math.sqrt(g - 1)),
    "this looks like the rewards minus the group mean, not divided by the std": lambda g: (1 - 1 / g, -1 / g),
    "this looks like the success's and a failure's advantages swapped":
        lambda g: (-1 / math.sqrt(g - 1), math.sqrt(g - 1)),
    "this looks like a failure's advantage taken as minus the success's": lambda g: (math.sqrt(g - 1), -math.sqrt(g - 1)),
    "expected a pair": lambda g: math.sqrt(g - 1),
}


@pytest.mark.parametrize("message", list(PREDICTION_MISTAKES))
def test_lone_success_prediction_names_the_mistake(message):
    msg = check_fails(lambda f: ch12.check_advantages_once(grpo.group_advantages, f), PREDICTION_MISTAKES[message],
                      message)
    assert "11.2" not in msg and "11.3" not in msg  # the predicted value of G = 128 (sqrt(127)) is not shown


# ---------------------------------------------------------------------- 12.5 which tokens the clip silences
def silenced(ratio, adv, eps):
    a = adv[:, None]
    return ((a > 0) & (ratio > 1 + eps)) | ((a < 0) & (ratio < 1 - eps)) | (a == 0)


def test_silenced_reference_passes(capsys):
    ch12.check_silenced_by_clip(silenced)
    assert capsys.readouterr().out.startswith("✓")
    check_fails(ch12.check_silenced_by_clip, stub, "12.5", "not implemented")


SILENCED_MISTAKES = {
    "only the tokens past the upper end counted": lambda r, a, e: ((a[:, None] > 0) & (r > 1 + e)) | (a[:, None] == 0),
    "only the tokens past the lower end counted": lambda r, a, e: ((a[:, None] < 0) & (r < 1 - e)) | (a[:, None] == 0),
    "the two ends swapped between the signs": lambda r, a, e: ((a[:, None] > 0) & (r < 1 - e)) | ((a[:, None] < 0) & (r > 1 + e))
    | (a[:, None] == 0),
    "every token outside the clip's range": lambda r, a, e: (r > 1 + e) | (r < 1 - e) | (a[:, None] == 0),
    # issue 37: the ends of the clip themselves (ratio exactly 1 + epsilon, 1 - epsilon) tell > from >=
    "the ends of the clip counted as outside it": lambda r, a, e: ((a[:, None] > 0) & (r >= 1 + e))
    | ((a[:, None] < 0) & (r <= 1 - e)) | (a[:, None] == 0),
    "the tokens with advantage 0 left out": lambda r, a, e: ((a[:, None] > 0) & (r > 1 + e)) | ((a[:, None] < 0) & (r < 1 - e)),
    "the tokens that keep their gradient returned": lambda r, a, e: ~silenced(r, a, e),
    "expected a bool tensor": lambda r, a, e: silenced(r, a, e).float(),
}


@pytest.mark.parametrize("message", list(SILENCED_MISTAKES))
def test_silenced_names_the_mistake(message):
    check_fails(ch12.check_silenced_by_clip, SILENCED_MISTAKES[message], message)


# ---------------------------------------------------------------------- 12.6 CISPO
def ppo_clip(lp, old, ref, a, m, b, eps):
    return grpo.grpo_loss(lp, old, ref, a, m, b, loss_type="grpo", epsilon=eps)


def cispo(lp, old, ref, a, m, b, eps_high):
    return grpo.grpo_loss(lp, old, ref, a, m, b, loss_type="cispo", epsilon_high=eps_high)


def test_cispo_loss_reference_passes_and_mistakes_are_named(capsys):
    ch12.check_cispo_loss(cispo)
    assert capsys.readouterr().out.startswith("✓")
    check_fails(ch12.check_cispo_loss, stub, "12.6", "not implemented")
    seq = lambda t, m: ((t * m).sum(1) / m.sum(1).clamp_min(1)).mean()  # noqa: E731
    attached = lambda lp, old, ref, a, m, b, e: seq(-(torch.clamp(torch.exp(lp - old), max=e) * a[:, None] * lp
                                                      - b * _k3(lp, ref)), m.float())
    check_fails(ch12.check_cispo_loss, attached, "the ratio not detached")
    reinforce = lambda lp, old, ref, a, m, b, e: seq(-(a[:, None] * lp - b * _k3(lp, ref)), m.float())
    check_fails(ch12.check_cispo_loss, reinforce, "this looks like the ratio left out")
    check_fails(ch12.check_cispo_loss, lambda lp, old, ref, a, m, b, e: ppo_clip(lp, old, ref, a, m, b, 0.2),
                "this looks like PPO's clipped surrogate")
    check_fails(ch12.check_cispo_loss, lambda lp, old, ref, a, m, b, e: cispo(lp, old, ref, a, m, b, 1e9),
                "this looks like no cap on the ratio")


# ---------------------------------------------------------------------- 12.7 the group size
def _first_group(condition):
    return next((g for g in range(2, 65) if condition(g)), 64)


GROUP_MISTAKES = {
    "this looks like only the all-wrong case counted": lambda p, lim: _first_group(lambda g: (1 - p) ** g <= lim),
    # issue 37: p != 0.5, so only the all-right case is told from only the all-wrong one and from one more than needed
    "this looks like only the all-right case counted": lambda p, lim: _first_group(lambda g: p ** g <= lim),
    "this looks like one more than needed": lambda p, lim: ch12.smallest_group_reference(p, lim) + 1,
    # issue 37: a bound met exactly tells "<=" from "<"
    "this looks like the bound taken as strict": lambda p, lim: _first_group(lambda g: p ** g + (1 - p) ** g < lim),
    "this looks like the chance that at least one sample differs": lambda p, lim: _first_group(lambda g: 1 - p ** g - (1 - p) ** g <= lim),
    "this looks like a group of 1 allowed": lambda p, lim: next(g for g in range(1, 65) if p ** g + (1 - p) ** g <= lim)
    if lim >= 1 else ch12.smallest_group_reference(p, lim),
    "this looks like no cap at 64": lambda p, lim: next(g for g in range(2, 10_000) if p ** g + (1 - p) ** g <= lim),
    "expected an int": lambda p, lim: float(ch12.smallest_group_reference(p, lim)),
}


def test_smallest_group_reference_passes(capsys):
    ch12.check_smallest_group(ch12.smallest_group_reference)
    assert capsys.readouterr().out.startswith("✓")
    check_fails(ch12.check_smallest_group, stub, "12.7", "not implemented")


@pytest.mark.parametrize("message", list(GROUP_MISTAKES))
def test_smallest_group_names_the_mistake(message):
    msg = check_fails(ch12.check_smallest_group, GROUP_MISTAKES[message], message)
    assert "expected 2" not in msg and "expected 3" not in msg, "12.7 hides the group size"


# ---------------------------------------------------------------------- issue 44: drafts, signs, clamps, NaN, None
def test_grpo_loss_names_each_mistake_of_the_draft():
    """The draft of the chapter has two mistakes; the check names the one left (the value shows the k3 term's, the
    gradient the ratio's)."""
    check_fails(ch12.check_grpo_loss, ch12.grpo_loss_draft, "this looks like the KL estimator the other way round")
    check_fails(ch12.check_grpo_loss, lambda lp, ref, a, m, b: _draft_with(lp, ref, a, m, b, ratio_right=True),
                "this looks like the KL estimator the other way round")
    check_fails(ch12.check_grpo_loss, lambda lp, ref, a, m, b: _draft_with(lp, ref, a, m, b, kl_right=True),
                "(gradient)", "this looks like the ratio's detached part and live part the other way round")


def _draft_with(lp, ref, a, m, b, ratio_right=False, kl_right=False):
    ratio = torch.exp(lp - lp.detach()) if ratio_right else torch.exp(lp.detach() - lp)
    d = (ref - lp) if kl_right else (lp - ref)
    per_token = -(ratio * a[:, None] - b * (torch.exp(d) - d - 1))
    m = m.float()
    return ((per_token * m).sum(1) / m.sum(1)).mean()


def test_the_grpo_draft_reverses_the_gradient_at_the_first_step():
    lp, _, adv, mask = ch12._loss_case(3, 4, 6)
    adv = adv - adv.mean()
    p1, p2 = lp.clone().requires_grad_(True), lp.clone().requires_grad_(True)
    ch12.grpo_loss_draft(p1, lp, adv, mask, 0.1).backward()
    c090b69_loss(p2, lp, adv, mask, 0.1).backward()
    torch.testing.assert_close(p1.grad, -p2.grad)


def test_lone_success_names_a_failure_without_its_sign():
    """Issue 44: a dropped sign was called "swapped" (a group of 2 cannot tell them apart; the check starts with 4)."""
    msg = check_fails(lambda f: ch12.check_advantages_once(grpo.group_advantages, f),
                      lambda g: (math.sqrt(g - 1), 1 / math.sqrt(g - 1)), "this looks like a failure's advantage without "
                      "its minus sign")
    assert "swapped" not in msg


def test_advantages_once_names_the_clamp_kept():
    """Issue 44: c090b69's clamp kept passed while the groups stopped at 8; a lone success in a group of 128 is
    above 10."""
    check_fails(lambda f: ch12.check_advantages_once(f, lone_success), lambda r, g: grpo.group_advantages(r, g, clamp=10.0),
                "this looks like c090b69's clamp to +-10 kept", "groups of 128")


def test_silenced_by_clip_that_measures_with_autograd_is_told_to_state_the_rule():
    def measured(ratio, adv, eps):
        r = ratio.clone().requires_grad_(True)
        a = adv[:, None].expand_as(r)
        torch.min(r * a, torch.clamp(r, 1 - eps, 1 + eps) * a).sum().backward()
        return r.grad == 0

    check_fails(ch12.check_silenced_by_clip, measured, "your function raised", "without autograd")


def test_cispo_nan_hint_does_not_recommend_the_division_that_makes_it():
    """Issue 44: the hint for an empty mask recommended dividing by the mask's sum, the very 0 / 0."""
    def no_clamp(lp, old, ref, a, m, b, e):
        w = torch.exp(lp - old).clamp(max=e).detach()
        t = -(w * a[:, None] * lp - b * _k3(lp, ref))
        m = m.float()
        return ((t * m).sum(1) / m.sum(1)).mean()

    msg = check_fails(ch12.check_cispo_loss, no_clamp, "NaN", "one completion of this case has no token that counts")
    assert "divide each completion's masked sum by its mask's sum" not in msg


def test_smallest_group_without_the_fallback_says_none_not_int():
    """Issue 44: a missing fallback (None when no group of up to 64 is enough) was sent to int(...)."""
    def no_fallback(p, limit):
        for g in range(2, 65):
            if p ** g + (1 - p) ** g <= limit:
                return g

    msg = check_fails(ch12.check_smallest_group, no_fallback, "returned None", "p=0.99")
    assert "int(" not in msg


@pytest.mark.parametrize("check, delegate", [
    (ch12.check_completion_mask, grpo.completion_mask),
    (ch12.check_grpo_loss, c090b69_loss),
    (lambda f: ch12.check_advantages_once(f, lone_success), grpo.group_advantages),
    (ch12.check_silenced_by_clip, lambda r, a, e: grpo.clip_fraction(r.log(), torch.zeros_like(r), a,
                                                                      torch.ones_like(r), "grpo", e) * 0 + silenced(r, a, e)),
    (ch12.check_cispo_loss, cispo),
])
def test_a_function_that_calls_the_package_answer_fails(monkeypatch, check, delegate):
    monkeypatch.setattr(delegation, "ENFORCED", True)
    check_fails(check, delegate, "your function calls minimind_ref.grpo.", "the package's own answer to this exercise")
