"""The chapter-07 checks accept the reference solutions, reject the stubs, and name every planted
mistake (in-place edits included), with the hint before the line that says how to ask for a solution."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minimind_ref.checks import ch07
from minimind_ref.moe import global_aux_loss


# ----------------------------------------------------------------- reference solutions (as in the notebook)
def route(x, weight, top_k, norm_topk_prob=True):
    scores = F.linear(x, weight).softmax(dim=-1)
    topk_weight, topk_idx = torch.topk(scores, k=top_k, dim=-1, sorted=False)
    if top_k > 1 and norm_topk_prob:
        topk_weight = topk_weight / (topk_weight.sum(dim=-1, keepdim=True) + 1e-20)
    return topk_idx, topk_weight


def dispatch(x, experts, flat_idx, flat_weight, top_k):
    out = torch.zeros_like(x)
    order = flat_idx.argsort()
    ends = flat_idx.bincount(minlength=len(experts)).cumsum(0).tolist()
    token_of_slot = order // top_k
    start = 0
    for i, end in enumerate(ends):
        if end > start:
            tokens = token_of_slot[start:end]
            y = experts[i](x[tokens]) * flat_weight[order[start:end]]
            out.index_add_(0, tokens, y)
        start = end
    return out


def moe_forward(moe, x):
    b, s, d = x.shape
    topk_idx, topk_weight, _ = moe.gate(x)
    y = dispatch(x.view(-1, d), moe.experts, topk_idx.view(-1), topk_weight.view(-1, 1), moe.config.num_experts_per_tok)
    y = y.view(b, s, d)
    for expert in getattr(moe, "shared_experts", []):
        y = y + expert(x)
    return y


def seq_balance_loss(scores, topk_idx, batch, n_experts, alpha):
    n_tokens, top_k = topk_idx.shape
    seq_len = n_tokens // batch
    one_hot = F.one_hot(topk_idx.view(batch, seq_len * top_k), n_experts).float()
    f = one_hot.mean(dim=1) * n_experts
    p = scores.view(batch, seq_len, n_experts).mean(dim=1)
    return alpha * (f * p).sum(dim=1).mean()


# ----------------------------------------------------------------- stubs and wrong versions
def stub(*args, **kwargs):
    raise NotImplementedError("Exercise 7.x: implement me")


def route_normalizes_top1(x, weight, top_k, norm_topk_prob=True):
    scores = F.linear(x, weight).softmax(dim=-1)
    topk_weight, topk_idx = torch.topk(scores, k=top_k, dim=-1)
    if norm_topk_prob:  # wrong: also renormalizes a single weight to 1.0
        topk_weight = topk_weight / topk_weight.sum(dim=-1, keepdim=True)
    return topk_idx, topk_weight


def route_never_normalizes(x, weight, top_k, norm_topk_prob=True):
    scores = F.linear(x, weight).softmax(dim=-1)
    topk_weight, topk_idx = torch.topk(scores, k=top_k, dim=-1)
    return topk_idx, topk_weight


def route_topk_of_logits(x, weight, top_k, norm_topk_prob=True):
    logits = F.linear(x, weight)  # wrong: weights are raw logits, not probabilities
    topk_weight, topk_idx = torch.topk(logits, k=top_k, dim=-1)
    return topk_idx, topk_weight


def _route_dim0(x, weight, top_k, norm_topk_prob):
    scores = F.linear(x, weight).softmax(dim=0)  # wrong axis
    topk_weight, topk_idx = torch.topk(scores, k=top_k, dim=-1)
    if top_k > 1 and norm_topk_prob:
        topk_weight = topk_weight / topk_weight.sum(dim=-1, keepdim=True)
    return topk_idx, topk_weight


def dispatch_wrong_token(x, experts, flat_idx, flat_weight, top_k):
    out = torch.zeros_like(x)
    order = flat_idx.argsort()
    ends = flat_idx.bincount(minlength=len(experts)).cumsum(0).tolist()
    start = 0
    for i, end in enumerate(ends):
        if end > start:
            slots = order[start:end]
            tokens = slots % x.shape[0]  # wrong: slot j belongs to token j // top_k
            out.index_add_(0, tokens, experts[i](x[tokens]) * flat_weight[slots])
        start = end
    return out


def dispatch_no_weights(x, experts, flat_idx, flat_weight, top_k):
    return dispatch(x, experts, flat_idx, torch.ones_like(flat_weight), top_k)


def dispatch_overwrites(x, experts, flat_idx, flat_weight, top_k):
    out = torch.zeros_like(x)
    order = flat_idx.argsort()
    ends = flat_idx.bincount(minlength=len(experts)).cumsum(0).tolist()
    start = 0
    for i, end in enumerate(ends):
        if end > start:
            tokens = order[start:end] // top_k
            out[tokens] = experts[i](x[tokens]) * flat_weight[order[start:end]]  # wrong: = instead of +=
        start = end
    return out


def moe_forward_no_shared(moe, x):
    b, s, d = x.shape
    topk_idx, topk_weight, _ = moe.gate(x)
    y = dispatch(x.view(-1, d), moe.experts, topk_idx.view(-1), topk_weight.view(-1, 1), moe.config.num_experts_per_tok)
    return y.view(b, s, d)


def moe_forward_first_shared_only(moe, x):
    y = moe_forward_no_shared(moe, x)
    if hasattr(moe, "shared_experts"):
        y = y + moe.shared_experts[0](x)
    return y


def moe_forward_uniform_weights(moe, x):
    b, s, d = x.shape
    topk_idx, topk_weight, _ = moe.gate(x)
    k = moe.config.num_experts_per_tok
    y = dispatch(x.view(-1, d), moe.experts, topk_idx.view(-1), torch.full_like(topk_weight.view(-1, 1), 1.0 / k), k)
    y = y.view(b, s, d)
    for expert in getattr(moe, "shared_experts", []):
        y = y + expert(x)
    return y


def seq_loss_without_n_experts(scores, topk_idx, batch, n_experts, alpha):
    return seq_balance_loss(scores, topk_idx, batch, n_experts, alpha) / n_experts


def seq_loss_is_global(scores, topk_idx, batch, n_experts, alpha):
    return global_aux_loss(scores, topk_idx, n_experts, alpha)


def seq_loss_detached(scores, topk_idx, batch, n_experts, alpha):
    return seq_balance_loss(scores.detach(), topk_idx, batch, n_experts, alpha)


def seq_loss_counts_tokens_not_slots(scores, topk_idx, batch, n_experts, alpha):
    n_tokens, top_k = topk_idx.shape
    seq_len = n_tokens // batch
    one_hot = F.one_hot(topk_idx.view(batch, seq_len * top_k), n_experts).float()
    f = one_hot.sum(dim=1) / seq_len * n_experts  # wrong: divides by s instead of s*k
    p = scores.view(batch, seq_len, n_experts).mean(dim=1)
    return alpha * (f * p).sum(dim=1).mean()


def route_sorted_pair_swapped(x, weight, top_k, norm_topk_prob=True):
    idx, w = route(x, weight, top_k, norm_topk_prob)
    return w, idx


def route_smallest(x, weight, top_k, norm_topk_prob=True):
    scores = F.linear(x, weight).softmax(dim=-1)
    topk_weight, topk_idx = torch.topk(scores, k=top_k, dim=-1, largest=False)
    return topk_idx, topk_weight


def route_renormalizes_always(x, weight, top_k, norm_topk_prob=True):
    scores = F.linear(x, weight).softmax(dim=-1)
    topk_weight, topk_idx = torch.topk(scores, k=top_k, dim=-1)
    if top_k > 1:  # ignores norm_topk_prob=False
        topk_weight = topk_weight / topk_weight.sum(dim=-1, keepdim=True)
    return topk_idx, topk_weight


def route_float_ids(x, weight, top_k, norm_topk_prob=True):
    idx, w = route(x, weight, top_k, norm_topk_prob)
    return idx.float(), w


def dispatch_weight_unsorted(x, experts, flat_idx, flat_weight, top_k):
    out = torch.zeros_like(x)
    order = flat_idx.argsort()
    ends = flat_idx.bincount(minlength=len(experts)).cumsum(0).tolist()
    start = 0
    for i, end in enumerate(ends):
        if end > start:
            tokens = order[start:end] // top_k
            out.index_add_(0, tokens, experts[i](x[tokens]) * flat_weight[start:end])  # wrong: unsorted weights
        start = end
    return out


def dispatch_slot_as_token(x, experts, flat_idx, flat_weight, top_k):
    out = torch.zeros_like(x)
    order = flat_idx.argsort()
    ends = flat_idx.bincount(minlength=len(experts)).cumsum(0).tolist()
    start = 0
    for i, end in enumerate(ends):
        if end > start:
            tokens = order[start:end]  # wrong: a slot index is not a token index
            out.index_add_(0, tokens, experts[i](x[tokens]) * flat_weight[tokens])
        start = end
    return out


def dispatch_in_place(x, experts, flat_idx, flat_weight, top_k):
    y = dispatch(x, experts, flat_idx, flat_weight, top_k)
    x.copy_(y)  # reuses the input as the output buffer
    return x


def moe_forward_unreshaped(moe, x):
    b, s, d = x.shape
    topk_idx, topk_weight, _ = moe.gate(x)
    y = dispatch(x.view(-1, d), moe.experts, topk_idx.view(-1), topk_weight.view(-1, 1), moe.config.num_experts_per_tok)
    for expert in getattr(moe, "shared_experts", []):
        y = y + expert(x.view(-1, d))
    return y


def moe_forward_ignores_weights(moe, x):
    b, s, d = x.shape
    topk_idx, topk_weight, _ = moe.gate(x)
    k = moe.config.num_experts_per_tok
    y = dispatch(x.view(-1, d), moe.experts, topk_idx.view(-1), torch.ones_like(topk_weight.view(-1, 1)), k).view(b, s, d)
    for expert in getattr(moe, "shared_experts", []):
        y = y + expert(x)
    return y


def moe_forward_shared_on_output(moe, x):
    y = moe_forward_no_shared(moe, x)
    return y + sum(expert(y) for expert in getattr(moe, "shared_experts", []))


def moe_forward_in_place(moe, x):
    y = moe_forward(moe, x)
    return x.copy_(y)


def seq_loss_without_alpha(scores, topk_idx, batch, n_experts, alpha):
    return seq_balance_loss(scores, topk_idx, batch, n_experts, 1.0)


def seq_loss_summed(scores, topk_idx, batch, n_experts, alpha):
    return seq_balance_loss(scores, topk_idx, batch, n_experts, alpha) * batch


def seq_loss_keepdim(scores, topk_idx, batch, n_experts, alpha):
    return seq_balance_loss(scores, topk_idx, batch, n_experts, alpha).reshape(1)


def seq_loss_in_place(scores, topk_idx, batch, n_experts, alpha):
    scores.data.clamp_(min=1e-3)  # "stabilizes" the caller's scores
    return seq_balance_loss(scores, topk_idx, batch, n_experts, alpha)


def assert_names(check, fn, *fragments, label):
    """The check fails; its message carries the exercise label, each fragment, and the hint before the
    line that says how to ask for a solution."""
    with pytest.raises(AssertionError) as err:
        check(fn)
    msg = str(err.value)
    assert msg.startswith(f"[{label}"), msg
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in:\n{msg}"
    if "hint:" in msg:
        assert msg.index("hint:") < msg.index("show_solution("), msg
    return msg


# ----------------------------------------------------------------- tests
def test_reference_solutions_pass(capsys):
    ch07.check_route(route)
    ch07.check_dispatch(dispatch)
    ch07.check_moe_forward(moe_forward)
    ch07.check_seq_aux_loss(seq_balance_loss)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("✓ Exercise 7.") for line in lines), lines


def test_reference_module_methods_pass(capsys):
    """The package's own code passes too (moe_infer as the dispatch, the module as the forward)."""
    from minimind_ref.moe import seq_aux_loss

    def dispatch_via_module(x, experts, flat_idx, flat_weight, top_k):
        from minimind_ref import MOEFeedForward
        from minimind_ref.checks.ch07 import _config

        moe = MOEFeedForward(_config(hidden=x.shape[-1], n_experts=len(experts), top_k=top_k, n_shared=0))
        moe.experts = experts
        return moe.moe_infer(x, flat_idx, flat_weight)

    ch07.check_dispatch(dispatch_via_module)
    ch07.check_moe_forward(lambda moe, x: moe(x))
    ch07.check_seq_aux_loss(seq_aux_loss)
    assert capsys.readouterr().out.count("✓") == 3


def test_checks_leave_the_global_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    ch07.check_route(route)
    ch07.check_dispatch(dispatch)
    ch07.check_moe_forward(moe_forward)
    ch07.check_seq_aux_loss(seq_balance_loss)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("check", [ch07.check_route, ch07.check_dispatch, ch07.check_moe_forward, ch07.check_seq_aux_loss])
def test_stub_fails(check):
    with pytest.raises(AssertionError, match="not implemented yet"):
        check(stub)


@pytest.mark.parametrize("wrong, fragment", [
    (route_normalizes_top1, "the single top-1 weight was renormalized"),
    (route_never_normalizes, "were not renormalized although top_k > 1"),
    (route_renormalizes_always, "renormalized although norm_topk_prob=False"),
    (route_topk_of_logits, "raw router logits"),
    (_route_dim0, "softmax over the tokens (dim=0)"),
    (route_smallest, "the k smallest scores"),
    (route_sorted_pair_swapped, "the wrong way round"),
    (route_float_ids, "topk_idx must be a LongTensor"),
    (lambda x, w, k, n: route(x, w, k, n)[0], "expected a tuple"),
])
def test_route_mistakes_are_named(wrong, fragment):
    assert_names(ch07.check_route, wrong, fragment, label=ch07.ROUTE)


@pytest.mark.parametrize("wrong, fragment", [
    (dispatch_wrong_token, "slot j given to token j % n"),
    (dispatch_no_weights, "the slot weights were not applied"),
    (dispatch_overwrites, "assigned to its tokens instead of added"),
    (dispatch_weight_unsorted, "unsorted slot order"),
    (dispatch_slot_as_token, "your function raised IndexError"),
    (dispatch_in_place, "changed its input (argument 1) in place"),
])
def test_dispatch_mistakes_are_named(wrong, fragment):
    assert_names(ch07.check_dispatch, wrong, fragment, label=ch07.DISPATCH)


@pytest.mark.parametrize("wrong, fragment", [
    (moe_forward_no_shared, "the shared experts were left out"),
    (moe_forward_first_shared_only, "only the first shared expert"),
    (moe_forward_uniform_weights, "replaced by 1/k"),
    (moe_forward_ignores_weights, "the routing weights were ignored"),
    (moe_forward_unreshaped, "not reshaped back to x.shape ([b, s, d])"),
    (moe_forward_shared_on_output, "applied to the routed output"),
    (moe_forward_in_place, "changed its input (argument 2) in place"),
])
def test_moe_forward_mistakes_are_named(wrong, fragment):
    assert_names(ch07.check_moe_forward, wrong, fragment, label=ch07.MOE)


@pytest.mark.parametrize("wrong, fragment", [
    (seq_loss_without_n_experts, "not multiplied by n_experts"),
    (seq_loss_is_global, "the global form"),
    (seq_loss_counts_tokens_not_slots, "divided by seq_len instead of seq_len * top_k"),
    (seq_loss_without_alpha, "alpha was left out"),
    (seq_loss_summed, "summed instead of averaged"),
    (seq_loss_detached, "does not depend on `scores` through autograd"),
    (seq_loss_keepdim, "return a 0-d tensor"),
    (seq_loss_in_place, "changed its input (argument 1) in place"),
])
def test_seq_aux_loss_mistakes_are_named(wrong, fragment):
    assert_names(ch07.check_seq_aux_loss, wrong, fragment, label=ch07.BALANCE)


def test_learner_exception_is_reported_with_the_case():
    def broken(*args):
        raise RuntimeError("boom")

    assert_names(ch07.check_dispatch, broken, "RuntimeError: boom", "(on n_experts=", label=ch07.DISPATCH)
