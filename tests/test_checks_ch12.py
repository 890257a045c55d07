"""Chapter 12 checks accept the reference and reject stubs and the common mistakes, naming each."""

import pytest
import torch

from _helpers import check_fails, stub
from minimind_ref import grpo
from minimind_ref.checks import ch12


# ---------------------------------------------------------------------- 12.1
def test_group_advantages_reference_passes(capsys):
    ch12.check_group_advantages(grpo.group_advantages)
    assert capsys.readouterr().out.startswith("✓")


def _batch(a):
    return (a - a.mean()) / (a.std() + 1e-8)


def _grouped(r, g, unbiased=True):
    x = r.view(-1, g)
    return x.mean(1).repeat_interleave(g), x.std(1, unbiased=unbiased).repeat_interleave(g)


ADV_MISTAKES = {
    "only the per-group normalisation": lambda r, g: grpo.group_advantages(r, g, normalize_batch=False),
    "one mean and std over the whole batch": lambda r, g: _batch(((r - r.mean()) / (r.std() + 1e-4)).clamp(-10, 10)),
    "not divided by the group std": lambda r, g: _batch(r - _grouped(r, g)[0]),
    "the group statistics taken over the wrong axis":
        lambda r, g: _batch(((r - r.view(g, -1).mean(0).repeat(g)) / (r.view(g, -1).std(0).repeat(g) + 1e-4)).clamp(-10, 10)),
    "your advantages have NaN": lambda r, g: _batch((r - _grouped(r, g)[0]) / _grouped(r, g)[1]),
}


@pytest.mark.parametrize("message", list(ADV_MISTAKES))
def test_group_advantages_names_the_mistake(message):
    check_fails(ch12.check_group_advantages, ADV_MISTAKES[message], message)


def test_group_advantages_rejects_stub_and_in_place_edits():
    check_fails(ch12.check_group_advantages, stub, "not implemented")

    def edits(rewards, g):
        rewards.sub_(rewards.mean())
        return grpo.group_advantages(rewards, g)

    check_fails(ch12.check_group_advantages, edits, "in place")


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
    ch12.check_grpo_loss(grpo.grpo_loss)
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
    "one average over all masked tokens of the batch": lambda lp, ref, a, m, b: grpo.grpo_loss(lp, ref, a, m, b, "token"),
    "no mask": lambda lp, ref, a, m, b: (-(_ratio(lp) * a[:, None] - b * _k3(lp, ref))).mean(),
    "missing the minus sign": lambda lp, ref, a, m, b: -grpo.grpo_loss(lp, ref, a, m, b),
    "exp(lp - lp) or exp(0)": lambda lp, ref, a, m, b: _seq(-(torch.exp(lp - lp) * a[:, None] - b * _k3(lp, ref)), m),
    "has no gradient": lambda lp, ref, a, m, b: grpo.grpo_loss(lp.detach(), ref, a, m, b),
}


@pytest.mark.parametrize("message", list(LOSS_MISTAKES))
def test_grpo_loss_names_the_mistake(message):
    check_fails(ch12.check_grpo_loss, LOSS_MISTAKES[message], message)


def test_grpo_loss_rejects_stub_and_non_scalars():
    check_fails(ch12.check_grpo_loss, stub, "not implemented")
    check_fails(ch12.check_grpo_loss, lambda lp, ref, a, m, b: -(lp * a[:, None]), "scalar")


# ---------------------------------------------------------------------- cases the newcomer's review planted
def _no_clamp(r, g):
    mean, std = _grouped(r, g)
    return _batch((r - mean) / (std + 1e-4))


def test_group_advantages_without_the_clamp_is_caught_where_the_clamp_acts():
    """With 0/1 rewards in small groups the clamp never acts ((G - 1) / sqrt(G) <= 10 for G < 102):
    the check includes a group of 128 with one success, whose z-score the clamp cuts."""
    msg = check_fails(ch12.check_group_advantages, _no_clamp, "the clamp to [-10, 10] left out", "groups of 128")
    assert "the clamp acts" in msg


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
        return grpo.grpo_loss(lp, ref, a, m, b)

    check_fails(ch12.check_grpo_loss, edits, "changed its input", "in place")


def test_grpo_loss_cut_from_the_policy_says_so():
    def rewrapped(lp, ref, a, m, b):
        return torch.tensor(float(grpo.grpo_loss(lp.detach(), ref, a, m, b)), requires_grad=True)

    msg = check_fails(ch12.check_grpo_loss, rewrapped, "does not depend on per_token_logps")
    assert "RuntimeError" not in msg and "NoneType" not in msg, msg
