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


def test_the_package_may_help_the_layer_but_not_answer_the_exercises(capsys):
    """7.3 may run the layer's own dispatch (moe_infer); 7.2 and 7.4 refuse the package's answer, called directly or
    through a wrapper."""
    from minimind_ref.moe import seq_aux_loss

    def dispatch_via_module(x, experts, flat_idx, flat_weight, top_k):
        from minimind_ref import MOEFeedForward
        from minimind_ref.checks.ch07 import _config

        moe = MOEFeedForward(_config(hidden=x.shape[-1], n_experts=len(experts), top_k=top_k, n_shared=0))
        moe.experts = experts
        return moe.moe_infer(x, flat_idx, flat_weight)

    ch07.check_moe_forward(lambda moe, x: moe.moe_infer(x.view(-1, x.shape[-1]), *(
        (lambda idx, w: (idx.view(-1), w.view(-1, 1)))(*moe.gate(x)[:2]))).view(x.shape)
        + sum(e(x) for e in getattr(moe, "shared_experts", [])))
    assert capsys.readouterr().out.count("✓") == 1
    assert_names(ch07.check_dispatch, dispatch_via_module, "minimind_ref.moe.MOEFeedForward.moe_infer",
                 label=ch07.DISPATCH)
    assert_names(ch07.check_seq_aux_loss, lambda *args: seq_aux_loss(*args), "minimind_ref.moe.seq_aux_loss",
                 label=ch07.BALANCE)


def test_the_layer_itself_and_the_packages_loss_are_refused():
    assert_names(ch07.check_moe_forward, lambda moe, x: moe(x), "calls the layer itself", label=ch07.MOE)
    assert_names(ch07.check_seq_aux_loss, seq_aux_loss, "minimind_ref's own seq_aux_loss", label=ch07.BALANCE)


def dispatch_per_token(x, experts, flat_idx, flat_weight, top_k):
    out = torch.zeros_like(x)
    for slot, expert in enumerate(flat_idx.tolist()):
        out[slot // top_k] += experts[expert](x[slot // top_k : slot // top_k + 1])[0] * flat_weight[slot]
    return out


def dispatch_dense(x, experts, flat_idx, flat_weight, top_k):  # every expert on every token, masked afterwards
    out = torch.zeros_like(x)
    weight_of = torch.zeros(x.shape[0], len(experts))
    weight_of[torch.arange(flat_idx.numel()) // top_k, flat_idx] = flat_weight.view(-1)
    for i, expert in enumerate(experts):
        out += expert(x) * weight_of[:, i:i + 1]
    return out


def dispatch_runs_idle_experts(x, experts, flat_idx, flat_weight, top_k):
    out = torch.zeros_like(x)
    order = flat_idx.argsort()
    ends = flat_idx.bincount(minlength=len(experts)).cumsum(0).tolist()
    start = 0
    for i, end in enumerate(ends):  # no test for an empty run
        tokens = order[start:end] // top_k
        out.index_add_(0, tokens, experts[i](x[tokens]) * flat_weight[order[start:end]])
        start = end
    return out


@pytest.mark.parametrize("wrong, fragment", [
    (dispatch_per_token, "ran 3 times"),
    (dispatch_dense, "on every token of the batch"),
    (dispatch_runs_idle_experts, "which no token chose, was run anyway"),
])
def test_dispatch_must_run_each_expert_once_on_its_tokens(wrong, fragment):
    assert_names(ch07.check_dispatch, wrong, fragment, label=ch07.DISPATCH)


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
    (route_never_normalizes, "were not renormalized although several experts were kept"),
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
    (dispatch_wrong_token, "this looks like each slot given to the wrong token"),
    (dispatch_no_weights, "the slot weights were not applied"),
    (dispatch_overwrites, "assigned to its tokens instead of added"),
    (dispatch_weight_unsorted, "the weights read by position in the sorted run"),
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
    (seq_loss_counts_tokens_not_slots, "f_i counted per token instead of per routing slot"),
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


# ----------------------------------------------------------------- 7.5 minimind-3's MoE layer
from torch import nn  # noqa: E402

from minimind_ref import FeedForward  # noqa: E402
from minimind_ref.moe import seq_aux_loss  # noqa: E402


class MiniMind3MoE(nn.Module):
    """The notebook's solution: minimind-3's router, dispatch and router loss."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.gate = nn.Linear(config.hidden_size, config.n_routed_experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(config, config.expert_intermediate_size)
                                     for _ in range(config.n_routed_experts))
        self.aux_loss = 0.0

    def route(self, flat):
        cfg = self.config
        scores = F.softmax(self.gate(flat), dim=-1)
        weight, idx = torch.topk(scores, cfg.num_experts_per_tok, dim=-1)
        if cfg.norm_topk_prob:
            weight = weight / (weight.sum(dim=-1, keepdim=True) + 1e-20)
        return scores, weight, idx

    def mix(self, flat, weight, idx):
        y = torch.zeros_like(flat)
        for i, expert in enumerate(self.experts):
            chosen = idx == i
            rows = chosen.any(dim=-1).nonzero().flatten()
            if rows.numel():
                y = y.index_add(0, rows, expert(flat[rows]) * weight[chosen].view(-1, 1))
            elif self.training:
                y = y + 0 * sum(p.sum() for p in expert.parameters())
        return y

    def loss(self, scores, idx, batch):
        cfg = self.config
        load = F.one_hot(idx, cfg.n_routed_experts).float().mean(0)
        return (load * scores.mean(0)).sum() * cfg.n_routed_experts * cfg.aux_loss_alpha

    def forward(self, x):
        b, s, d = x.shape
        flat = x.reshape(-1, d)
        scores, weight, idx = self.route(flat)
        y = self.mix(flat, weight, idx)
        self.aux_loss = (self.loss(scores, idx, b) if self.training and self.config.aux_loss_alpha > 0
                         else scores.new_zeros(()))
        return y.view(b, s, d)


class SharedExpertLeftIn(MiniMind3MoE):
    def __init__(self, config):
        super().__init__(config)
        self.shared_experts = nn.ModuleList([FeedForward(config, config.expert_intermediate_size)])

    def forward(self, x):
        return super().forward(x) + self.shared_experts[0](x)


class AlwaysTopTwo(MiniMind3MoE):
    def route(self, flat):
        scores = F.softmax(self.gate(flat), dim=-1)
        weight, idx = torch.topk(scores, 2, dim=-1)
        return scores, weight / weight.sum(dim=-1, keepdim=True), idx


class MiniMind2Renormalization(MiniMind3MoE):
    def route(self, flat):
        cfg = self.config
        scores = F.softmax(self.gate(flat), dim=-1)
        weight, idx = torch.topk(scores, cfg.num_experts_per_tok, dim=-1)
        if cfg.num_experts_per_tok > 1 and cfg.norm_topk_prob:
            weight = weight / (weight.sum(dim=-1, keepdim=True) + 1e-20)
        return scores, weight, idx


class WeightsIgnored(MiniMind3MoE):
    def route(self, flat):
        scores, weight, idx = super().route(flat)
        return scores, torch.ones_like(weight), idx


class SequenceLevelLoss(MiniMind3MoE):
    def loss(self, scores, idx, batch):
        return seq_aux_loss(scores, idx, batch, self.config.n_routed_experts, self.config.aux_loss_alpha)


class SlotLoss(MiniMind3MoE):
    def loss(self, scores, idx, batch):
        return global_aux_loss(scores, idx, self.config.n_routed_experts, self.config.aux_loss_alpha)


class NoTimesExperts(MiniMind3MoE):
    def loss(self, scores, idx, batch):
        return super().loss(scores, idx, batch) / self.config.n_routed_experts


class NoCoefficient(MiniMind3MoE):
    def loss(self, scores, idx, batch):
        return super().loss(scores, idx, batch) / self.config.aux_loss_alpha


class UnusedExpertOutOfGraph(MiniMind3MoE):
    def mix(self, flat, weight, idx):
        y = torch.zeros_like(flat)
        for i, expert in enumerate(self.experts):
            chosen = idx == i
            rows = chosen.any(dim=-1).nonzero().flatten()
            if rows.numel():
                y = y.index_add(0, rows, expert(flat[rows]) * weight[chosen].view(-1, 1))
        return y


class LossInEvalToo(MiniMind3MoE):
    def forward(self, x):
        y = super().forward(x)
        flat = x.reshape(-1, x.shape[-1])
        scores, _, idx = self.route(flat)
        self.aux_loss = self.loss(scores, idx, x.shape[0])
        return y


class NoAuxLoss(MiniMind3MoE):
    def forward(self, x):
        y = super().forward(x)
        self.aux_loss = None
        return y


class OwnNames(MiniMind3MoE):
    def __init__(self, config):
        super().__init__(config)
        self.router = self.gate
        del self.gate

    def route(self, flat):
        self.gate = self.router
        return super().route(flat)


def test_minimind3_reference_passes(capsys):
    ch07.check_minimind3_moe(MiniMind3MoE)
    ch07.check_balanced_router_loss(lambda num_experts, top_k, coef: coef * top_k)
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line[:15] for line in lines] == ["✓ Exercise 7.5 ", "✓ Exercise 7.6 "], lines


def test_minimind3_package_layer_passes(capsys, monkeypatch):
    """minimind_ref's own layer (moe_variant='minimind-3') passes the check it is compared with (with the guard against
    handing the exercise over switched off: as a learner's answer the package's layer is refused)."""
    from minimind_ref import MOEFeedForward
    from minimind_ref.checks import delegation
    monkeypatch.setattr(delegation, "ENFORCED", False)
    ch07.check_minimind3_moe(MOEFeedForward)
    assert capsys.readouterr().out.startswith("✓ Exercise 7.5")


@pytest.mark.parametrize("check", [ch07.check_minimind3_moe, ch07.check_balanced_router_loss])
def test_minimind3_stubs_fail(check):
    with pytest.raises(AssertionError, match="not implemented yet"):
        check(stub)


@pytest.mark.parametrize("wrong, fragment", [
    (SharedExpertLeftIn, "the shared expert left in"),
    (AlwaysTopTwo, "top-2 where top-1 is asked"),
    (MiniMind2Renormalization, "the top-1 weight left unnormalized"),
    (WeightsIgnored, "every chosen expert counted with weight 1"),
    (SequenceLevelLoss, "MiniMind2's per-sequence loss"),
    (SlotLoss, "MiniMind2's global loss over routing slots"),
    (NoTimesExperts, "the factor num_experts left out"),
    (NoCoefficient, "the coefficient router_aux_loss_coef"),
    (UnusedExpertOutOfGraph, "received no gradient in training"),
    (LossInEvalToo, "in eval mode self.aux_loss must be 0"),
    (NoAuxLoss, "self.aux_loss must be a tensor"),
    (OwnNames, "do not have upstream's names"),
    (lambda config: "not a module", "must build an nn.Module"),
])
def test_minimind3_moe_mistakes_are_named(wrong, fragment):
    assert_names(ch07.check_minimind3_moe, wrong, fragment, label=ch07.MOE3)


def test_minimind3_moe_check_leaves_the_global_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    ch07.check_minimind3_moe(MiniMind3MoE)
    assert torch.equal(torch.rand(3), expected)


# ----------------------------------------------------------------- 7.6 the balanced value
@pytest.mark.parametrize("wrong, fragment", [
    (lambda num_experts, top_k, coef: coef, "MiniMind2's value at balance carried over"),
    (lambda num_experts, top_k, coef: coef * top_k / num_experts, "the factor num_experts left out"),
    (lambda num_experts, top_k, coef: coef * top_k * num_experts, "one factor num_experts too many"),
    (lambda num_experts, top_k, coef: coef * top_k * top_k, "top_k counted twice"),
    (lambda num_experts, top_k, coef: top_k, "the coefficient left out"),
    (lambda num_experts, top_k, coef: coef * (top_k + 1), "which is not the reference's: yours is larger"),
    (lambda num_experts, top_k, coef: "5e-4", "expected a number"),
])
def test_balanced_router_loss_mistakes_are_named(wrong, fragment):
    assert_names(ch07.check_balanced_router_loss, wrong, fragment, label=ch07.BALANCED)


def test_balanced_router_loss_message_neither_garbled_nor_giving_the_value():
    msg = assert_names(ch07.check_balanced_router_loss, lambda num_experts, top_k, coef: coef,
                       "MiniMind2's value at balance carried over", label=ch07.BALANCED)
    assert ", or " not in msg and "whatever k" not in msg and "sum to top_k" not in msg, msg


def seq_loss_draft(scores, topk_idx, batch, n_experts, alpha):  # the chapter's draft: two flaws
    n_tokens, top_k = topk_idx.shape
    seq_len = n_tokens // batch
    counts = F.one_hot(topk_idx.view(-1), n_experts).float().view(batch, -1, n_experts).sum(dim=1)
    f = counts * n_experts / seq_len
    p = scores.detach().view(batch, seq_len, n_experts).mean(dim=1)
    return alpha * (f * p).sum(dim=1).mean()


def test_seq_aux_loss_names_the_drafts_flaws_one_after_the_other():
    assert_names(ch07.check_seq_aux_loss, seq_loss_draft, "does not depend on `scores` through autograd",
                 label=ch07.BALANCE)

    def half_repaired(scores, topk_idx, batch, n_experts, alpha):
        n_tokens, top_k = topk_idx.shape
        seq_len = n_tokens // batch
        counts = F.one_hot(topk_idx.view(-1), n_experts).float().view(batch, -1, n_experts).sum(dim=1)
        f = counts * n_experts / seq_len
        p = scores.view(batch, seq_len, n_experts).mean(dim=1)
        return alpha * (f * p).sum(dim=1).mean()

    assert_names(ch07.check_seq_aux_loss, half_repaired, "f_i counted per token instead of per routing slot",
                 label=ch07.BALANCE)


# ---------------------------------------------------------------------- issue 44, third newcomer probe
def _route_variant(x, weight, top_k, norm_topk_prob=True, mode="softmax_of_kept"):
    logits = F.linear(x, weight)
    if mode == "softmax_of_kept":
        kept, idx = logits.topk(top_k, dim=-1)
        return idx, kept.softmax(-1)
    scores = {"logits": logits, "sigmoid": torch.sigmoid(logits)}.get(mode, logits.softmax(-1))
    w, idx = scores.topk(top_k, dim=-1, sorted=False)
    if top_k > 1 and norm_topk_prob:
        total = w.sum(-1, keepdim=True)
        w = w / (total.detach() if mode == "detached_sum" else total)
    return idx, w


@pytest.mark.parametrize("mode, fragment", [
    ("softmax_of_kept", "a softmax over the k kept logits only"),  # was named "the single top-1 weight renormalized"
    ("logits", "the router logits used as the weights, without the softmax over the experts"),
    ("sigmoid", "a sigmoid of each logit instead of a softmax over the experts"),
    ("detached_sum", "the renormalizing sum detached"),  # passed: the check compared the weights' values only
])
def test_probe3_route_mistakes_are_named_from_every_case(mode, fragment):
    assert_names(ch07.check_route, lambda *a: _route_variant(*a, mode=mode), "this looks like " + fragment,
                 label=ch07.ROUTE)


def test_probe3_route_refuses_the_package_router():
    """A MoEGate built around the given weight passed 7.1."""
    from minimind_ref import MiniMindConfig, MoEGate

    def via_gate(x, weight, top_k, norm_topk_prob=True):
        cfg = MiniMindConfig(hidden_size=x.shape[1], num_attention_heads=1, num_key_value_heads=1, use_moe=True,
                             n_routed_experts=weight.shape[0], num_experts_per_tok=top_k, norm_topk_prob=norm_topk_prob)
        gate = MoEGate(cfg).eval()
        gate.weight = nn.Parameter(weight)
        idx, w, _ = gate(x[None])
        return idx, w

    assert_names(ch07.check_route, via_gate, "your function calls minimind_ref's MoEGate", label=ch07.ROUTE)


def test_probe3_moe_forward_refuses_a_copy_of_the_definition_cell():
    """Section 4's moe_by_definition (the cell above the exercise) passed 7.3 unchanged."""
    def moe_by_definition(moe, x):
        flat = x.reshape(-1, x.shape[-1])
        idx, w, _ = moe.gate(x)
        out = torch.zeros_like(flat)
        for t in range(flat.shape[0]):
            for j in range(idx.shape[1]):
                out[t] += w[t, j] * moe.experts[int(idx[t, j])](flat[t])
            for shared in getattr(moe, "shared_experts", []):
                out[t] += shared(flat[t])
        return out.view(x.shape)

    assert_names(ch07.check_moe_forward, moe_by_definition, "runs the routed experts token by token", label=ch07.MOE)


def test_probe3_minimind3_moe_refuses_the_package_layer():
    """A subclass of MOEFeedForward passed 7.5; a wrapper around one failed for a wrong reason (its eval loss)."""
    from minimind_ref import MOEFeedForward

    class Subclass(MOEFeedForward):
        pass

    class Wrapper(nn.Module):
        def __init__(self, config):
            super().__init__()
            inner = MOEFeedForward(config)
            self.gate, self.experts, self._inner = inner.gate, inner.experts, [inner]

        def forward(self, x):
            y = self._inner[0](x)
            self.aux_loss = self._inner[0].aux_loss
            return y

    for cls in (Subclass, Wrapper):
        assert_names(ch07.check_minimind3_moe, cls, "your function calls minimind_ref's MOEFeedForward", label=ch07.MOE3)


def test_probe3_balanced_router_loss_refuses_an_evaluation_and_names_two_mistakes():
    from minimind_ref.moe import router_aux_loss

    def evaluated(num_experts, top_k, coef):
        n = num_experts * 4
        idx = torch.stack([(torch.arange(n) + j) % num_experts for j in range(top_k)], -1)
        return float(router_aux_loss(torch.full((n, num_experts), 1.0 / num_experts), idx, num_experts, coef))

    assert_names(ch07.check_balanced_router_loss, evaluated, "not to evaluate the loss on a balanced routing",
                 label=ch07.BALANCED)
    # both were named after the first wrong case alone: "the factor num_experts left out", "one factor ... too many"
    assert_names(ch07.check_balanced_router_loss, lambda E, k, c: c / k, "this looks like the value divided by top_k",
                 label=ch07.BALANCED)
    assert_names(ch07.check_balanced_router_loss, lambda E, k, c: c * E,
                 "this looks like each load_i taken as 1 whatever top_k", label=ch07.BALANCED)


def _dispatch_mistake(kind):
    def dispatch(x, experts, flat_idx, flat_weight, top_k):
        out = torch.zeros_like(x)
        order = flat_idx.argsort()
        ends = flat_idx.bincount(minlength=len(experts)).cumsum(0).tolist()
        start = 0
        for i, end in enumerate(ends):
            if end > start:
                slots = torch.arange(start, end) if kind == "positions" else order[start:end]
                tokens = slots % top_k if kind == "remainder" else slots // top_k
                weight = flat_weight[tokens] if kind == "token weight" else flat_weight[slots]
                out.index_add_(0, tokens, experts[i](x[tokens]) * weight)
            if kind != "restart":
                start = end
        return out
    return dispatch


@pytest.mark.parametrize("kind, fragment", [
    ("remainder", "each slot given to token slot % top_k"),
    ("token weight", "each slot's weight read at its token's index"),
    ("positions", "the slots taken as the positions in the sorted order"),
    ("restart", "every expert's run starting again at the first slot"),
])
def test_probe3_dispatch_mistakes_are_named(kind, fragment):
    assert_names(ch07.check_dispatch, _dispatch_mistake(kind), "this looks like " + fragment, label=ch07.DISPATCH)


def _moe_forward_mistake(kind):
    def moe_forward(moe, x):
        b, s, d = x.shape
        idx, w, _ = moe.gate(x)
        flat = x.reshape(-1, d)
        k = 2 if kind == "k=2" else moe.config.num_experts_per_tok
        y = dispatch(flat, moe.experts, idx.view(-1), w.view(-1, 1), k)
        shared = list(getattr(moe, "shared_experts", []))
        if kind == "averaged" and shared:
            y = y + sum(e(flat) for e in shared) / len(shared)
        elif kind == "weighted":
            y = y + sum(w.max(-1, keepdim=True).values * e(flat) for e in shared)
        else:
            y = y + sum(e(flat) for e in shared)
        return y.view(s, b, d).transpose(0, 1) if kind == "s, b, d" else y.view(b, s, d)
    return moe_forward


@pytest.mark.parametrize("kind, fragment", [
    ("averaged", "the shared experts' outputs averaged instead of added"),
    ("weighted", "the shared experts weighted by each token's largest routing weight"),
    ("s, b, d", "the output laid out as [s, b, d] and then transposed"),
    ("k=2", "the number of experts per token written as 2"),
])
def test_probe3_moe_forward_mistakes_are_named(kind, fragment):
    assert_names(ch07.check_moe_forward, _moe_forward_mistake(kind), "this looks like " + fragment, label=ch07.MOE)


@pytest.mark.parametrize("kind, fragment", [("p_sum", "P_i summed over the sequence's tokens instead of averaged"),
                                            ("across", "the tokens grouped into sequences as [s, b] instead of [b, s]")])
def test_probe3_seq_balance_loss_mistakes_are_named(kind, fragment):
    def loss(scores, topk_idx, batch, n_experts, alpha):
        n, k = topk_idx.shape
        s = n // batch
        if kind == "across":
            counts = F.one_hot(topk_idx.view(s, batch, k), n_experts).float().sum((0, 2))
            p = scores.view(s, batch, n_experts).mean(0)
        else:
            counts = F.one_hot(topk_idx.view(batch, s * k), n_experts).float().sum(1)
            p = scores.view(batch, s, n_experts).sum(1)
        f = counts * n_experts / (s * k)
        return alpha * (f * p).sum(1).mean()

    assert_names(ch07.check_seq_aux_loss, loss, "this looks like " + fragment, label=ch07.BALANCE)
