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
        if groups * size > ch12.MEASURED_UP_TO:  # no simulation reaches these: only the rule answers them
            continue
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
                "your function calls minimind_ref.grpo.group_advantages", "not to measure it")


# ---------------------------------------------------------------------- 12.2 (d65ef2c's mask, with the rollout's padding)
def test_completion_mask_reference_passes(capsys):
    ch12.check_completion_mask(grpo.completion_mask)
    assert capsys.readouterr().out.startswith("✓")


COMPLETION_MISTAKES = list(ch12._completion_mistakes(*ch12._completion_case(1, 5, 9, 2), 2))


@pytest.mark.parametrize("message", COMPLETION_MISTAKES)
def test_completion_mask_names_the_mistake(message):
    check_fails(ch12.check_completion_mask, lambda ids, eos, pad: ch12._completion_mistakes(ids, pad, eos)[message].int(),
                "this looks like " + message)


def test_completion_mask_rejects_stub_and_masks_that_are_not_int():
    check_fails(ch12.check_completion_mask, stub, "not implemented")
    check_fails(ch12.check_completion_mask, lambda ids, eos, pad: grpo.completion_mask(ids, eos, pad).bool(),
                "expected an int mask", "torch.bool")
    check_fails(ch12.check_completion_mask, lambda ids, eos, pad: grpo.completion_mask(ids, eos, pad).float(),
                "expected an int mask", "torch.float32")


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
    "a KL term that differs from section 4's once the policy has moved away": lambda lp, ref, a, m, b: _seq(-(_ratio(lp) * a[:, None] - b * _k3(ref, lp)), m),
    "k1, the plain log-ratio": lambda lp, ref, a, m, b: _seq(-(_ratio(lp) * a[:, None] - b * (lp - ref)), m),
    "one average over all masked tokens of the batch": lambda lp, ref, a, m, b: c090b69_loss(lp, ref, a, m, b, "token"),
    "no mask": lambda lp, ref, a, m, b: (-(_ratio(lp) * a[:, None] - b * _k3(lp, ref))).mean(),
    "without the minus sign in front": lambda lp, ref, a, m, b: -c090b69_loss(lp, ref, a, m, b),
    "a ratio detached as a whole": lambda lp, ref, a, m, b: _seq(-(torch.exp(lp - lp) * a[:, None] - b * _k3(lp, ref)), m),
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


# ---------------------------------------------------------------------- 12.4 a lone success's advantages, predicted
def lone_success(group_size):
    """The closed form: mean 1/G, population std sqrt(G - 1) / G."""
    return math.sqrt(group_size - 1), -1 / math.sqrt(group_size - 1)


def test_lone_success_reference_and_closed_form_pass(capsys):
    ch12.check_lone_success(lone_success)
    ch12.check_lone_success(ch12.lone_success_reference)  # the 1e-4 kept passes too
    assert capsys.readouterr().out.count("✓") == 2
    check_fails(ch12.check_lone_success, stub, "12.4", "not implemented")
    for size in (3, 8, 100):  # the reference is d65ef2c's normalisation
        adv = grpo.group_advantages(ch12._lone_success_group(size), size)
        assert abs(ch12.lone_success_reference(size)[0] - float(adv[size // 2])) < 1e-4
        assert abs(ch12.lone_success_reference(size)[1] - float(adv[0])) < 1e-4


PREDICTION_MISTAKES = {
    "this looks like the sample std": lambda g: ((g - 1) / math.sqrt(g), -1 / math.sqrt(g)),
    "this looks like c090b69's clamp to +-10 kept": lambda g: (min(math.sqrt(g - 1), 10.0), -1 / math.sqrt(g - 1)),
    "this looks like the rewards minus the group mean, not divided by the std": lambda g: (1 - 1 / g, -1 / g),
    "this looks like the success's and a failure's advantages swapped":
        lambda g: (-1 / math.sqrt(g - 1), math.sqrt(g - 1)),
    "this looks like a failure's advantage taken as minus the success's": lambda g: (math.sqrt(g - 1), -math.sqrt(g - 1)),
    "this looks like the group size where one less than it belongs": lambda g: (math.sqrt(g), -1 / math.sqrt(g)),
    "this looks like the 1e-4 added under the square root": lambda g: (
        (1 - 1 / g) / math.sqrt((1 / g) * (1 - 1 / g) + 1e-4), -(1 / g) / math.sqrt((1 / g) * (1 - 1 / g) + 1e-4)),
    "expected a pair": lambda g: math.sqrt(g - 1),
}


@pytest.mark.parametrize("message", list(PREDICTION_MISTAKES))
def test_lone_success_prediction_names_the_mistake(message):
    msg = check_fails(ch12.check_lone_success, PREDICTION_MISTAKES[message], message)
    assert "11.2" not in msg and "11.3" not in msg  # the predicted value of G = 128 (sqrt(127)) is not shown


def test_lone_success_refuses_a_measurement(monkeypatch):
    """Issue 44 (probe 2): the advantages are predicted from G (groups up to 10^12); measuring them is refused."""
    monkeypatch.setattr(delegation, "ENFORCED", True)

    def measured(group_size):
        r = torch.zeros(group_size)
        r[0] = 1.0
        a = (r - r.mean()) / (r.std(unbiased=False) + 1e-4)
        return float(a[0]), float(a[1])

    check_fails(ch12.check_lone_success, measured, "your function calls a standard deviation of rewards",
                "not to measure them")
    assert max(ch12.LONE_SIZES) >= 10**12


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
    check_fails(ch12.check_cispo_loss, attached, "the weight's gradient kept")
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
    "this looks like one more than needed": lambda p, lim: ch12.smallest_group_reference(p, lim) + 1
    if ch12.smallest_group_reference(p, lim) < 64 else 64,
    "this looks like the answer when no group of up to 64 is enough off by one":
        lambda p, lim: ch12.smallest_group_reference(p, lim) if any(p ** g + (1 - p) ** g <= lim for g in range(2, 65)) else 65,
    "this looks like only the likelier of the two outcomes counted":
        lambda p, lim: _first_group(lambda g: max(p, 1 - p) ** g <= lim),
    "this looks like the chance of a signal compared with the bound":
        lambda p, lim: _first_group(lambda g: 1 - p ** g - (1 - p) ** g >= lim),
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
    check_fails(ch12.check_grpo_loss, ch12.grpo_loss_draft, "this looks like a KL term that differs",
                "one of the draft's two mistakes", "look at the k3 term")
    msg = check_fails(ch12.check_grpo_loss, lambda lp, ref, a, m, b: _draft_with(lp, ref, a, m, b, ratio_right=True),
                      "this looks like a KL term that differs", "look at the k3 term")
    assert "reference's log-probability minus the policy's" not in msg  # where the mistake is, not what the fix is
    msg = check_fails(ch12.check_grpo_loss, lambda lp, ref, a, m, b: _draft_with(lp, ref, a, m, b, kl_right=True),
                      "(gradient)", "this looks like a gradient of the opposite sign", "look at the ratio")
    assert "detached part and live part" not in msg and "which part of it is detached" not in msg


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
    msg = check_fails(ch12.check_lone_success, lambda g: (math.sqrt(g - 1), 1 / math.sqrt(g - 1)),
                      "this looks like a failure's advantage without its minus sign")
    assert "swapped" not in msg


def test_lone_success_names_the_clamp_kept():
    """Issue 44: c090b69's clamp kept passed while the groups stopped at 8; a lone success in a group of 128 is
    above 10."""
    check_fails(ch12.check_lone_success, lambda g: (min(math.sqrt(g - 1), 10.0), -1 / math.sqrt(g - 1)),
                "this looks like c090b69's clamp to +-10 kept", "a group of 128")


def test_silenced_by_clip_that_measures_with_autograd_is_told_to_state_the_rule():
    def measured(ratio, adv, eps):
        r = ratio.clone().requires_grad_(True)
        a = adv[:, None].expand_as(r)
        torch.min(r * a, torch.clamp(r, 1 - eps, 1 + eps) * a).sum().backward()
        return r.grad == 0

    check_fails(ch12.check_silenced_by_clip, measured, "your function raised", "without autograd")


def test_silenced_by_clip_refuses_a_measurement_under_enable_grad(monkeypatch):
    """Issue 44 (probe 2): measuring with autograd inside torch.enable_grad() passed; it is refused, and so is
    evaluating the surrogate itself (its min); a rule written with a clamp stays free."""
    monkeypatch.setattr(delegation, "ENFORCED", True)

    def measured(ratio, adv, eps):
        with torch.enable_grad():
            r = ratio.detach().clone().requires_grad_(True)
            a = adv[:, None].expand_as(r)
            torch.min(r * a, torch.clamp(r, 1 - eps, 1 + eps) * a).sum().backward()
        return r.grad == 0

    check_fails(ch12.check_silenced_by_clip, measured, "your function calls autograd", "state the rule")

    def finite_differences(ratio, adv, eps):
        a = adv[:, None]
        f = lambda r: torch.min(r * a, torch.clamp(r, 1 - eps, 1 + eps) * a)  # noqa: E731
        return (f(ratio + 1e-3) - f(ratio - 1e-3)) == 0

    check_fails(ch12.check_silenced_by_clip, finite_differences, "your function calls the surrogate's min")

    def with_a_clamp(ratio, adv, eps):  # a rule, written with a clamp: allowed
        a = adv[:, None]
        outside_up, outside_down = ratio.clamp(max=1 + eps) < ratio, ratio.clamp(min=1 - eps) > ratio
        return ((a > 0) & outside_up) | ((a < 0) & outside_down) | (a == 0)

    ch12.check_silenced_by_clip(with_a_clamp)


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
    (ch12.check_lone_success, lambda g: tuple(float(v) for v in grpo.group_advantages(ch12._lone_success_group(g), g)[[g // 2, 0]])),
    (ch12.check_silenced_by_clip, lambda r, a, e: grpo.clip_fraction(r.log(), torch.zeros_like(r), a,
                                                                      torch.ones_like(r), "grpo", e) * 0 + silenced(r, a, e)),
    (ch12.check_cispo_loss, cispo),
])
def test_a_function_that_calls_the_package_answer_fails(monkeypatch, check, delegate):
    monkeypatch.setattr(delegation, "ENFORCED", True)
    if check is ch12.check_lone_success:  # measuring a prediction is refused for its own reason
        check_fails(check, delegate, "your function calls minimind_ref.grpo.group_advantages", "not to measure them")
    else:
        check_fails(check, delegate, "your function calls minimind_ref.grpo.", "the package's own answer to this exercise")


# ---------------------------------------------------------------------- issue 44, the second newcomer probe
# The mistakes a newcomer planted in chapter 12's exercises that the checks passed, misnamed or left unnamed, as a
# learner writes them; each message must name the mistake.
def test_probe_rescale_factor_only_the_groups_factor_is_named():
    check_fails(ch12.check_rescale_factor, lambda n, k, g: math.sqrt(g / (g - 1)),
                "this looks like only the factor between a group's unbiased and population std")


def test_probe_rescale_factor_refuses_a_simulation(monkeypatch):
    """A simulation of both normalisations with the learner's own torch code passed; it is refused, and the check
    asks about batches no simulation reaches."""
    monkeypatch.setattr(delegation, "ENFORCED", True)

    def simulated(num_groups, groups_with_spread, group_size):
        r = torch.zeros(num_groups, group_size)
        r[:groups_with_spread, 0] = 1.0
        once = (r - r.mean(1, keepdim=True)) / r.std(1, unbiased=False, keepdim=True).clamp_min(1e-30)
        a = ((r - r.mean(1, keepdim=True)) / r.std(1, keepdim=True).clamp_min(1e-30)).flatten()
        return float(((a - a.mean()) / a.std())[0] / once.flatten()[0])

    check_fails(ch12.check_rescale_factor, simulated, "your function calls a standard deviation of rewards")
    assert max(n * g for n, _, g in ch12._rescale_cases()) >= 10**12


def test_probe_grpo_loss_wrong_axis_is_pointed_at():
    def wrong_axis(lp, ref, a, m, b):
        per_token = -(torch.exp(lp - lp.detach()) * a[None, :] - b * _k3(lp, ref))
        return _seq(per_token, m)

    check_fails(ch12.check_grpo_loss, wrong_axis, "one advantage per completion")


@pytest.mark.parametrize("fn, fragment", [
    (lambda lp, old, ref, a, m, b, e: ((-(torch.clamp(torch.exp(lp - old), max=e) * a[:, None] - b * _k3(lp, ref))
                                        * m).sum(1) / m.sum(1).clamp_min(1)).mean(),
     "the capped ratio times the advantage, without log pi"),
    (lambda lp, old, ref, a, m, b, e: ((-(torch.clamp(torch.exp(lp - old), max=e).detach() * a[:, None] * lp
                                          - b * _k3(ref, lp))) * m).sum(1).div(m.sum(1).clamp_min(1)).mean(),
     "a KL term that differs from k3"),
    (lambda lp, old, ref, a, m, b, e: (((-(torch.clamp(torch.exp(lp - old), max=e).detach() * a[:, None] * lp
                                           - b * _k3(lp, ref))) * m).sum() / m.sum().clamp_min(1)),
     "one average over all masked tokens of the batch instead of per completion"),
    (lambda lp, old, ref, a, m, b, e: ((-(torch.clamp(torch.exp(old - lp), max=e).detach() * a[:, None] * lp
                                          - b * _k3(lp, ref))) * m).sum(1).div(m.sum(1).clamp_min(1)).mean(),
     "the ratio upside down"),
])
def test_probe_cispo_loss_mistakes_are_named(fn, fragment):
    msg = check_fails(ch12.check_cispo_loss, lambda lp, old, ref, a, m, b, e: fn(lp, old, ref, a, m.float(), b, e),
                      "this looks like " + fragment)
    assert "only log pi does" not in msg


def test_probe_cispo_loss_empty_rows_dropped_is_named():
    def dropped(lp, old, ref, a, m, b, e):
        m = m.float()
        t = -(torch.clamp(torch.exp(lp - old), max=e).detach() * a[:, None] * lp - b * _k3(lp, ref))
        keep = m.sum(1) > 0
        return ((t * m).sum(1)[keep] / m.sum(1)[keep]).mean()

    check_fails(ch12.check_cispo_loss, dropped, "this looks like the completions without a token that counts left out")


@pytest.mark.parametrize("fn, fragment", [
    (lambda p, b: max(2, min(64, math.ceil(math.log(b) / math.log(max(p, 1 - p))))) if b < 1 else 2,
     "only the likelier of the two outcomes counted"),
    (lambda p, b: next((g for g in range(2, 65) if p ** g + (1 - p) ** g <= b), 65),
     "the answer when no group of up to 64 is enough off by one"),
    (lambda p, b: next((g for g in range(2, 65) if 1 - p ** g - (1 - p) ** g >= b), 64),
     "the chance of a signal compared with the bound"),
])
def test_probe_smallest_group_mistakes_are_named(fn, fragment):
    msg = check_fails(ch12.check_smallest_group, fn, "this looks like " + fragment)
    assert "one more than needed" not in msg
