"""Checks for chapter 07 (mixture of experts).

Every check builds the matching ``minimind_ref`` module (``MoEGate``, ``MOEFeedForward``,
``seq_aux_loss``) on several random cases, edge cases included (top-1 routing, experts that get
no token, several shared experts, sequences routed differently), and compares the learner's
function with it. A failure names the mistake it recognised (when it recognises one), then gives a
hint about the bug, and last the line that says how to see a worked solution. The checks build their modules under
``torch.random.fork_rng``, so the notebook's random stream is untouched.

    from minimind_ref.checks import ch07
    ch07.check_route(route)
    ch07.check_dispatch(dispatch)
    ch07.check_moe_forward(moe_forward)
    ch07.check_seq_aux_loss(seq_balance_loss)
    ch07.check_minimind3_moe(MiniMind3MoE)            # Exercise 7.5
    ch07.check_balanced_router_loss(balanced_router_loss)  # Exercise 7.6
"""

from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import MiniMindConfig
from ..moe import MOEFeedForward, MoEGate, global_aux_loss, router_aux_loss, seq_aux_loss
from .delegation import call_refusing, call_without_modules, forbid, guarded
from .diagnosis import close_tensors, explaining
from .core import Outcome, as_number, call, check, check_close, check_numbers, diagnose, fail, solution

__all__ = ["check_route", "check_dispatch", "check_moe_forward", "check_seq_aux_loss", "check_minimind3_moe",
           "check_balanced_router_loss"]

# 7.3 builds the layer's output from its parts: running the layer itself answers it
LAYER_ITSELF = forbid("the layer itself, which runs MOEFeedForward.forward", MOEFeedForward.forward,
                      reason="the exercise asks you to build its output from its parts")
# 7.5 rebuilds minimind-3's layer: the package's MoE layer, router and losses answer it
MOE3_PARTS = [forbid("minimind_ref's MOEFeedForward", MOEFeedForward), forbid("minimind_ref's MoEGate", MoEGate),
              forbid("minimind_ref.moe.router_aux_loss", router_aux_loss)]


def _config(hidden: int = 16, n_experts: int = 4, top_k: int = 2, n_shared: int = 1, norm: bool = True, alpha: float = 0.1) -> MiniMindConfig:
    return MiniMindConfig(
        hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=2, num_key_value_heads=1,
        use_moe=True, n_routed_experts=n_experts, num_experts_per_tok=top_k, n_shared_experts=n_shared,
        norm_topk_prob=norm, aux_loss_alpha=alpha,
    )


def _sort_by_expert(idx: torch.Tensor, weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-k is computed with ``sorted=False``: compare the chosen sets, ordered by expert id."""
    order = idx.argsort(dim=-1)
    return idx.gather(-1, order), weight.gather(-1, order)


# ---------------------------------------------------------------------------------- 7.1
ROUTE = "Exercise 7.1 route"
DISPATCH = "Exercise 7.2 dispatch"
MOE = "Exercise 7.3 moe_forward"
BALANCE = "Exercise 7.4 seq_balance_loss"
MOE3 = "Exercise 7.5 MiniMind3MoE"
BALANCED = "Exercise 7.6 balanced_router_loss"


def _route_rule(w: torch.Tensor, top_k: int, norm: bool) -> torch.Tensor:
    """MiniMind2's rule on kept weights ``w`` [n, k]: rescaled to sum to 1 only when top_k > 1 and norm."""
    return w / (w.sum(dim=-1, keepdim=True) + 1e-20) if top_k > 1 and norm else w


def _route_weight_mistakes(x: torch.Tensor, weight: torch.Tensor, top_k: int, norm: bool) -> Dict[str, object]:
    """Wrong top-k weights, ordered by expert id like the comparison; None where a mistake changes nothing of
    its own (there the learner's weights must be the reference's). The same keys on every case, so that the
    mistake that explains every case is found (``diagnosis.explaining``)."""
    logits = F.linear(x, weight)
    probs = logits.softmax(dim=-1)
    w, idx = torch.topk(probs, k=top_k, dim=-1)
    lw = logits.gather(-1, idx)
    renorm = w / w.sum(dim=-1, keepdim=True)
    out = {
        "the single top-1 weight was renormalized to 1.0 (upstream leaves it as is, or the router would get no "
        "gradient)": renorm if top_k == 1 and norm else None,
        "a softmax over the k kept logits only, which rescales the kept weights whatever top_k and norm_topk_prob "
        "are": lw.softmax(dim=-1),
        "the k weights were not renormalized although several experts were kept and norm_topk_prob=True":
            w if top_k > 1 and norm else None,
        "the weights were renormalized although norm_topk_prob=False": renorm if not norm and top_k > 1 else None,
        "raw router logits instead of softmax probabilities": lw,
        "the router logits used as the weights, without the softmax over the experts": _route_rule(lw, top_k, norm),
        "a sigmoid of each logit instead of a softmax over the experts":
            _route_rule(torch.sigmoid(lw), top_k, norm),
        "softmax over the tokens (dim=0) instead of over the experts": logits.softmax(dim=0).gather(-1, idx),
    }
    return {k: (None if v is None else _sort_by_expert(idx, v)[1]) for k, v in out.items()}


def _route_grad_mistakes(x: torch.Tensor, weight: torch.Tensor, top_k: int, norm: bool,
                         upstream: torch.Tensor) -> Dict[str, torch.Tensor]:
    """The router weight's gradient of ``(sorted weights * upstream).sum()`` under the mistakes that keep the weights'
    values right."""
    def grad(detach_sum: bool) -> torch.Tensor:
        wt = weight.clone().requires_grad_(True)
        kept, idx = torch.topk(F.linear(x, wt).softmax(dim=-1), k=top_k, dim=-1, sorted=False)
        if top_k > 1 and norm:
            total = kept.sum(dim=-1, keepdim=True)
            kept = kept / ((total.detach() if detach_sum else total) + 1e-20)
        (_sort_by_expert(idx, kept)[1] * upstream).sum().backward()
        return wt.grad

    if not (top_k > 1 and norm):
        return {}
    return {"the renormalizing sum detached (the router then gets no gradient through it)": grad(True)}


# the package's router answers the exercise
ROUTER_ITSELF = forbid("minimind_ref's MoEGate", MoEGate)


solution("7.1", "scores = F.linear(x, weight).softmax(dim=-1); topk_weight, topk_idx = torch.topk(scores, k=top_k, "
                "dim=-1, sorted=False); if top_k > 1 and norm_topk_prob: topk_weight = topk_weight / "
                "(topk_weight.sum(dim=-1, keepdim=True) + 1e-20)")


@check(ROUTE, shown=True, why="the experts and weights of random tokens under a random router")
def check_route(route: Callable[..., Tuple[torch.Tensor, torch.Tensor]]) -> str:
    """``route(x [n, d], weight [E, d], top_k, norm_topk_prob) -> (topk_idx [n, k], topk_weight [n, k])``."""
    g = torch.Generator().manual_seed(71)
    hint = ("compare with the gate of this chapter: over which axis the scores are a distribution, which experts a "
            "token keeps, and when (and when not) the kept weights are rescaled")
    cases: List[Tuple[int, int, bool]] = [(4, 2, True), (4, 1, True), (8, 2, False), (6, 3, True), (4, 4, True), (5, 1, False)]
    runs = []
    for n_experts, top_k, norm in cases:
        n, d = 12, 16
        x = torch.randn(n, d, generator=g)
        cfg = _config(hidden=d, n_experts=n_experts, top_k=top_k, norm=norm)
        with torch.random.fork_rng(devices=[]):
            gate = MoEGate(cfg).eval()
        with torch.no_grad():
            gate.weight.copy_(torch.randn(n_experts, d, generator=g) * 0.5)
        weight = gate.weight.detach().clone()
        ref_idx, ref_w, _ = gate(x.view(1, n, d))
        case = f"n_experts={n_experts}, top_k={top_k}, norm_topk_prob={norm}"
        out = call_refusing(route, x.clone(), weight.clone(), top_k, norm, forbidden=[ROUTER_ITSELF], name=ROUTE,
                            hint=hint, case=case, check_inputs=True)
        if not (isinstance(out, tuple) and len(out) == 2):
            fail(ROUTE, f"expected a tuple (topk_idx, topk_weight), got {type(out).__name__} (on {case})",
                 "return the expert ids and their weights together, the ids first")
        idx, w = out
        if isinstance(idx, torch.Tensor) and isinstance(w, torch.Tensor) and w.dtype == torch.long and idx.is_floating_point():
            fail(ROUTE, f"the pair is the wrong way round: return (topk_idx, topk_weight), got (weights, ids) (on {case})",
                 "torch.topk returns (values, indices); the exercise returns the indices first")
        if not isinstance(idx, torch.Tensor) or idx.dtype != torch.long:
            fail(ROUTE, f"topk_idx must be a LongTensor of expert ids (torch.topk's indices), got "
                 f"{getattr(idx, 'dtype', type(idx).__name__)} (on {case})", hint)
        if tuple(idx.shape) != (n, top_k):
            fail(ROUTE, f"topk_idx has shape {tuple(idx.shape)}, expected {(n, top_k)}: one row per token, k expert ids "
                 f"per row (on {case})", hint)
        ri, rw = _sort_by_expert(ref_idx, ref_w)
        if not isinstance(w, torch.Tensor) or tuple(w.shape) != (n, top_k):
            check_close(w, rw, name=f"{ROUTE}: topk_weight", hint=hint, case=case)
        gi, gw = _sort_by_expert(idx, w.detach())
        if not torch.equal(gi, ri):
            logits = F.linear(x, weight)
            chosen = {
                "softmax over the tokens (dim=0) instead of over the experts": logits.softmax(dim=0).topk(top_k, dim=-1).indices,
                "the k smallest scores instead of the k largest": logits.topk(top_k, dim=-1, largest=False).indices,
            }
            seen = diagnose(gi, {k: v.sort(dim=-1).values for k, v in chosen.items()}, 0, 0)
            rows = int((gi != ri).any(dim=-1).sum())
            fail(ROUTE, (f"this looks like {seen}: " if seen else "") + f"different experts chosen for {rows} of {n} "
                 f"tokens (on {case}); first: token {int((gi != ri).any(dim=-1).nonzero()[0])} expected "
                 f"{ri[(gi != ri).any(dim=-1)][0].tolist()}, got {gi[(gi != ri).any(dim=-1)][0].tolist()}", hint)
        runs.append((case, x, weight, top_k, norm, gate, gw, rw.detach(), _route_weight_mistakes(x, weight, top_k, norm)))
    same = close_tensors(1e-5, 1e-5)
    wrong = [i for i, r in enumerate(runs) if not same(r[6], r[7])]
    if wrong:
        first = wrong[0]
        mistakes = runs[first][8]
        seen = explaining({d: (lambda i, d=d: runs[i][8][d]) for d in mistakes}, list(range(len(runs))),
                          [r[6] for r in runs], [r[7] for r in runs], first, same=same)
        check_close(runs[first][6], runs[first][7], name=f"{ROUTE}: topk_weight", hint=hint, case=runs[first][0],
                    mistakes={seen: mistakes[seen]} if seen else None)
    # the weights must carry the router's gradient as MoEGate's do (the chapter's layer trains through them)
    for case, x, weight, top_k, norm, gate, _, _, _ in runs:
        upstream = torch.randn(x.shape[0], top_k, generator=g)
        gate.zero_grad()
        ref_idx, ref_w, _ = gate(x.view(1, *x.shape))
        (_sort_by_expert(ref_idx, ref_w)[1] * upstream).sum().backward()
        wt = weight.clone().requires_grad_(True)
        idx, w = call_refusing(route, x.clone(), wt, top_k, norm, forbidden=[ROUTER_ITSELF], name=ROUTE, hint=hint,
                               case=case)
        if not w.requires_grad:
            fail(ROUTE, f"your weights carry no gradient back to the router's weight (on {case}): the router learns "
                 "from the task loss only through them", "keep the whole computation, from weight to the kept "
                 "weights, differentiable")
        (_sort_by_expert(idx, w)[1] * upstream).sum().backward()
        check_close(wt.grad if wt.grad is not None else torch.zeros_like(wt), gate.weight.grad,
                    name=f"{ROUTE}: the router weight's gradient", case=case,
                    hint="the router learns through the kept weights: every step from weight to them must stay in "
                         "the graph", mistakes=_route_grad_mistakes(x, weight, top_k, norm, upstream))
    return f"{len(cases)} routing cases (top-1, top-k, k = E, with and without renormalization) match MoEGate"


# ---------------------------------------------------------------------------------- 7.2
def _routing(g: torch.Generator, n: int, n_experts: int, top_k: int, skip_expert: int = -1) -> Tuple[torch.Tensor, torch.Tensor]:
    """Distinct experts per token (as top-k gives), optionally never using ``skip_expert``."""
    pool = [e for e in range(n_experts) if e != skip_expert]
    rows = [torch.tensor(pool)[torch.randperm(len(pool), generator=g)[:top_k]] for _ in range(n)]
    idx = torch.stack(rows)
    w = torch.rand(n, top_k, generator=g) + 0.1
    return idx, w


def _dispatch_variant(x, experts, flat_idx, flat_weight, top_k, token_of=None, weight_of=None, add=True,
                      restart=False):
    """The sorted dispatch with one step swapped out (for naming mistakes); ``restart``: every run starts at the first
    slot of the sorted order (the start of a run never moved on)."""
    out = torch.zeros_like(x)
    order = flat_idx.argsort()
    ends = flat_idx.bincount(minlength=len(experts)).cumsum(0).tolist()
    start = 0
    for i, end in enumerate(ends):
        if end > start:
            slots = order[start:end]
            tokens = token_of(slots, start, end) if token_of else slots // top_k
            w = weight_of(slots, start, end) if weight_of else flat_weight[slots]
            y = experts[i](x[tokens]) * w
            if add:
                out.index_add_(0, tokens, y)
            else:
                out[tokens] = y
        start = 0 if restart else end
    return out


def _dispatch_mistakes(x, experts, flat_idx, flat_weight, top_k) -> Dict[str, Callable[[], torch.Tensor]]:
    n = x.shape[0]
    args = (x, experts, flat_idx, flat_weight, top_k)
    return {
        "each slot given to the wrong token (the k slots of one token sit next to each other, token by token)":
            lambda: _dispatch_variant(*args, token_of=lambda s, a, b: s % n),
        "the slot weights were not applied": lambda: _dispatch_variant(*args, weight_of=lambda s, a, b: torch.ones_like(flat_weight[s])),
        "an expert's output is assigned to its tokens instead of added (a token routed to several experts must get "
        "the sum of their outputs)": lambda: _dispatch_variant(*args, add=False),
        "the weights read by position in the sorted run instead of for the slots themselves": lambda: _dispatch_variant(*args, weight_of=lambda s, a, b: flat_weight[a:b]),
        "each token's output uses the weight of its token row instead of its slot":
            lambda: _dispatch_variant(*args, weight_of=lambda s, a, b: flat_weight.view(-1, top_k)[s // top_k, :1]),
        "each slot given to token slot % top_k": lambda: _dispatch_variant(*args, token_of=lambda s, a, b: s % top_k),
        "each slot's weight read at its token's index instead of at the slot's":
            lambda: _dispatch_variant(*args, weight_of=lambda s, a, b: flat_weight[s // top_k]),
        "the slots taken as the positions in the sorted order instead of the slot ids the sort returned":
            lambda: _dispatch_variant(*args, token_of=lambda s, a, b: torch.arange(a, b) // top_k,
                                      weight_of=lambda s, a, b: flat_weight[a:b]),
        "every expert's run starting again at the first slot of the sorted order":
            lambda: _dispatch_variant(*args, restart=True),
    }


solution("7.2", "order = flat_idx.argsort(); ends = flat_idx.bincount(minlength=len(experts)).cumsum(0); for each "
                "expert i with a non-empty run order[start:end]: tokens = order[start:end] // top_k, "
                "y = experts[i](x[tokens]) * flat_weight[order[start:end]], out.index_add_(0, tokens, y)")


class _Counted(nn.Module):
    """An expert that records the rows of every call (the dispatch must run each expert once, on its tokens)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.rows: List[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rows.append(int(x.shape[0]) if x.dim() >= 2 else 1)
        return self.inner(x)


def _check_calls(experts: nn.ModuleList, flat_idx: torch.Tensor, n: int, case: str, hint: str,
                 name: str = DISPATCH) -> None:
    """Each expert ran at most once, on exactly as many rows as it has slots; an expert without slots did not run."""
    for i, expert in enumerate(experts):
        slots = int((flat_idx == i).sum())
        if slots == 0 and expert.rows:
            fail(name, f"expert {i}, which no token chose, was run anyway (on {case}); an expert without tokens "
                 "does not run at all", hint)
        if len(expert.rows) > 1:
            fail(name, f"expert {i} ran {len(expert.rows)} times (on {case}); each expert runs once, on all of its "
                 "tokens together", hint)
        if expert.rows and expert.rows[0] != slots:
            what = ("on every token of the batch (its output masked afterwards)" if expert.rows[0] == n
                    else f"on {expert.rows[0]} rows")
            fail(name, f"expert {i} ran {what} (on {case}), while the tokens that chose it number {slots}; an "
                 "expert runs on exactly the tokens that chose it", hint)


@check(DISPATCH, shown=True, why="one entry of the dispatched output of random tokens and experts")
def check_dispatch(dispatch: Callable[..., torch.Tensor]) -> str:
    """``dispatch(x [n, d], experts, flat_idx [n*k], flat_weight [n*k, 1], top_k) -> [n, d]``; the
    inputs are left unchanged."""
    g = torch.Generator().manual_seed(72)
    hint = ("every slot carries one (token, expert, weight) triple, and a token owns top_k neighbouring slots (section "
            "5); go expert by expert: which rows does your code run it on, with which weights, and where do the "
            "results go?")
    cases = [(4, 2, -1), (4, 1, -1), (4, 2, 3), (6, 3, 0), (5, 2, 2)]
    for n_experts, top_k, skip in cases:
        n, d = 10, 16
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(720 + n_experts + top_k)
            moe = MOEFeedForward(_config(hidden=d, n_experts=n_experts, top_k=top_k, n_shared=0)).eval()
        x = torch.randn(n, d, generator=g)
        idx, w = _routing(g, n, n_experts, top_k, skip)
        flat_idx, flat_w = idx.view(-1), w.view(-1, 1)
        expected = moe.moe_infer(x, flat_idx, flat_w)
        case = f"n_experts={n_experts}, top_k={top_k}{', one expert unused' if skip >= 0 else ''}"
        counted = nn.ModuleList(_Counted(e) for e in moe.experts)
        with torch.no_grad():
            got = call_refusing(dispatch, x.clone(), counted, flat_idx.clone(), flat_w.clone(), top_k,
                                 forbidden=[MOEFeedForward.moe_infer, MOEFeedForward.moe_train], name=DISPATCH,
                                 hint=hint, case=case, check_inputs=True)
            check_close(got, expected, name=DISPATCH, hint=hint, case=case,
                        mistakes=_dispatch_mistakes(x, moe.experts, flat_idx, flat_w, top_k))
        _check_calls(counted, flat_idx, n, case, hint)
    return f"{len(cases)} routings (top-1..3, an expert with no token) match MOEFeedForward.moe_infer"


# ---------------------------------------------------------------------------------- 7.3
def _moe_mistakes(moe: MOEFeedForward, x: torch.Tensor) -> Dict[str, Callable[[], torch.Tensor]]:
    b, s, d = x.shape
    k = moe.config.num_experts_per_tok
    shared = list(getattr(moe, "shared_experts", []))

    def routed(weights=None):
        idx, w, _ = moe.gate(x)
        w = w if weights is None else weights(w)
        return moe.moe_infer(x.view(-1, d), idx.view(-1), w.reshape(-1, 1))

    def plus_shared(y, experts=shared, on=None):
        y = y.view(b, s, d)
        for e in experts:
            y = y + e(x if on is None else on)
        return y

    out = {
        "the shared experts were left out (they see every token, with weight 1)": lambda: routed().view(b, s, d),
        "the routing weights were replaced by 1/k": lambda: plus_shared(routed(lambda w: torch.full_like(w, 1.0 / k))),
        "the routing weights were ignored (every chosen expert counted with weight 1)":
            lambda: plus_shared(routed(torch.ones_like)),
        "the output was not reshaped back to x.shape ([b, s, d])":
            lambda: routed() + sum(e(x.view(-1, d)) for e in shared),
    }
    out["the number of experts per token written as 2 instead of read from the layer's config"] = \
        lambda: plus_shared(_dispatch_variant(x.view(-1, d), moe.experts, moe.gate(x)[0].view(-1),
                                              moe.gate(x)[1].reshape(-1, 1), 2))
    out["the output laid out as [s, b, d] and then transposed, instead of viewed as x's [b, s, d]"] = \
        lambda: (routed() + sum(e(x.view(-1, d)) for e in shared)).view(s, b, d).transpose(0, 1)
    if shared:
        out["the shared experts weighted by each token's largest routing weight"] = \
            lambda: routed().view(b, s, d) + moe.gate(x)[1].max(-1).values.view(b, s, 1) * sum(e(x) for e in shared)
    if len(shared) > 1:
        out["the shared experts' outputs averaged instead of added"] = \
            lambda: routed().view(b, s, d) + sum(e(x) for e in shared) / len(shared)
        out["only the first shared expert was added (add every one of moe.shared_experts)"] = \
            lambda: plus_shared(routed(), experts=shared[:1])
    if shared:
        out["the shared experts were applied to the routed output instead of to x"] = \
            lambda: (lambda y: y + sum(e(y) for e in shared))(routed().view(b, s, d))
    return out


solution("7.3", "topk_idx, topk_weight, _ = moe.gate(x); y = dispatch(x.view(-1, d), moe.experts, topk_idx.view(-1), "
                "topk_weight.view(-1, 1), moe.config.num_experts_per_tok).view(b, s, d); then for every expert in "
                "getattr(moe, 'shared_experts', []): y = y + expert(x)")


@check(MOE, shown=True, why="one entry of an MoE layer's output on random weights and inputs")
def check_moe_forward(moe_forward: Callable[..., torch.Tensor]) -> str:
    """``moe_forward(moe: MOEFeedForward, x [b, s, d]) -> [b, s, d]``, equal to ``moe.eval()(x)``."""
    g = torch.Generator().manual_seed(73)
    hint = ("the layer's output is the routed mixture of the chosen experts (with their routing weights), laid out "
            "like x, plus the output of every shared expert on x")
    cases = [(4, 2, 1), (4, 1, 1), (4, 2, 0), (6, 2, 2), (3, 3, 1)]
    for n_experts, top_k, n_shared in cases:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(730 + 7 * n_experts + top_k + n_shared)
            moe = MOEFeedForward(_config(hidden=16, n_experts=n_experts, top_k=top_k, n_shared=n_shared)).eval()
        x = torch.randn(2, 5, 16, generator=g)
        case = f"n_experts={n_experts}, top_k={top_k}, n_shared_experts={n_shared}"
        with torch.no_grad():
            expected = moe(x)

            experts = moe.experts
            moe.experts = nn.ModuleList(_Counted(e) for e in experts)  # each routed expert's calls and rows
            try:
                got = call_refusing(moe_forward, moe, x.clone(), forbidden=[LAYER_ITSELF], name=MOE,
                                    hint=hint, case=case, check_inputs=True)
                counted = moe.experts
            finally:
                moe.experts = experts
            check_close(got, expected, name=MOE, hint=hint, case=case, mistakes=_moe_mistakes(moe, x))
            flat_idx = moe.gate(x)[0].reshape(-1)
            if any(len(e.rows) > 1 and max(e.rows) == 1 for e in counted):
                fail(MOE, f"your function runs the routed experts token by token (on {case}), as section 4's "
                     "moe_by_definition does; the exercise builds the layer from your dispatch, which runs each expert "
                     "once on all of its tokens", hint)
            _check_calls(counted, flat_idx, flat_idx.numel() // top_k, case, hint, name=MOE)
    return f"{len(cases)} layers (0, 1 and 2 shared experts; top-1..3) match MOEFeedForward in eval mode"


# ---------------------------------------------------------------------------------- 7.4
def _balance_mistakes(scores, topk_idx, batch, n_experts, alpha) -> Dict[str, Callable[[], torch.Tensor]]:
    n_tokens, top_k = topk_idx.shape
    seq_len = n_tokens // batch

    def seq(f_scale=1.0, reduce="mean", use_alpha=True, p_sum=False, across=False):
        if across:  # the tokens grouped as [s, b]: a "sequence" takes one token of every real one
            idx = topk_idx.view(seq_len, batch, top_k).transpose(0, 1).reshape(batch, seq_len * top_k)
            probs = scores.view(seq_len, batch, n_experts).transpose(0, 1)
        else:
            idx, probs = topk_idx.view(batch, seq_len * top_k), scores.view(batch, seq_len, n_experts)
        share = F.one_hot(idx, n_experts).float().mean(dim=1) * f_scale
        p = probs.sum(dim=1) if p_sum else probs.mean(dim=1)
        per_seq = (share * n_experts * p).sum(dim=1)
        total = per_seq.mean() if reduce == "mean" else per_seq.sum()
        return total * (alpha if use_alpha else 1.0)

    return {
        "f_i was not multiplied by n_experts (perfect balance must give alpha, not alpha / n_experts)":
            lambda: seq() / n_experts,
        "the loss was computed over the whole batch at once (the global form); this one is per sequence, then "
        "averaged": lambda: global_aux_loss(scores, topk_idx, n_experts, alpha),
        "f_i counted per token instead of per routing slot (a token has top_k slots)": lambda: seq(f_scale=top_k),
        "alpha was left out": lambda: seq(use_alpha=False),
        "the per-sequence losses were summed instead of averaged over the batch": lambda: seq(reduce="sum"),
        "P_i summed over the sequence's tokens instead of averaged": lambda: seq(p_sum=True),
        "the tokens grouped into sequences as [s, b] instead of [b, s]": lambda: seq(across=True),
    }


solution("7.4", "f = F.one_hot(topk_idx.view(b, s * k), E).float().mean(dim=1) * E; P = scores.view(b, s, E).mean(dim=1); "
                "loss = alpha * (f * P).sum(dim=1).mean()")


@check(BALANCE, shown=True, why="a loss over random router scores: nothing to read the formula back from")
def check_seq_aux_loss(seq_balance_loss: Callable[..., torch.Tensor]) -> str:
    """``seq_balance_loss(scores [b*s, E], topk_idx [b*s, k], batch, n_experts, alpha) -> scalar``,
    value and gradient w.r.t. ``scores`` equal to ``minimind_ref.moe.seq_aux_loss``."""
    if seq_balance_loss is seq_aux_loss:
        fail(BALANCE, "this is minimind_ref's own seq_aux_loss, not yours",
             "repair the draft, or write the loss yourself from section 8's definition")
    g = torch.Generator().manual_seed(74)
    hint = ("work sequence by sequence: f_i is expert i's share of that sequence's routing slots, scaled so an even "
            "load gives 1, P_i its mean router probability over the sequence; perfect balance gives exactly alpha")
    cases = [(3, 5, 4, 1, 0.01), (2, 6, 4, 2, 0.1), (1, 8, 8, 2, 1.0), (4, 4, 3, 3, 0.5)]
    for batch, seq, n_experts, top_k, alpha in cases:
        # each sequence gets its own bias, so sequences are routed differently (seq-level != global)
        logits = torch.randn(batch, seq, n_experts, generator=g) + 3.0 * torch.randn(batch, 1, n_experts, generator=g)
        scores = logits.view(-1, n_experts).softmax(-1)
        topk_idx = scores.topk(top_k, dim=-1).indices
        ref_in = scores.clone().requires_grad_(True)
        expected = seq_aux_loss(ref_in, topk_idx, batch, n_experts, alpha)
        expected.backward()
        got_in = scores.clone().requires_grad_(True)
        case = f"batch={batch}, seq_len={seq}, n_experts={n_experts}, top_k={top_k}, alpha={alpha}"
        got = call_refusing(seq_balance_loss, got_in, topk_idx.clone(), batch, n_experts, alpha,
                             forbidden=[seq_aux_loss], name=BALANCE, hint=hint, case=case, check_inputs=True)
        if isinstance(got, torch.Tensor) and got.numel() == 1 and got.dim() > 0:
            fail(BALANCE, f"return a 0-d tensor (a scalar), got shape {tuple(got.shape)} (on {case})",
                 "reduce to a single number instead of keeping a dimension of size 1")
        check_close(got, expected.detach(), name=f"{BALANCE}: value", hint=hint, case=case,
                    mistakes=_balance_mistakes(scores, topk_idx, batch, n_experts, alpha))
        if not got.requires_grad:
            fail(BALANCE, f"the loss does not depend on `scores` through autograd (on {case})",
                 "compute P_i from `scores` itself (no .detach(), .item() or .numpy() on the way); the counts f_i "
                 "carry no gradient, P_i does")
        got.backward()
        if got_in.grad is None:
            fail(BALANCE, f"no gradient reached `scores` (on {case})", "compute P_i from the `scores` you were given")
        check_close(got_in.grad, ref_in.grad, name=f"{BALANCE}: gradient w.r.t. scores", case=case,
                    hint="the gradient flows only through P_i (the mean of the scores per sequence); f_i is a count")
    return f"{len(cases)} batches (value and gradient, sequences routed differently) match seq_aux_loss"


# ---------------------------------------------------------------------------------- 7.5
def _config3(hidden: int, n_experts: int, top_k: int, coef: float, norm: bool = True, width: int = None) -> MiniMindConfig:
    return MiniMindConfig(generation="minimind-3", hidden_size=hidden, intermediate_size=2 * hidden,
                          num_attention_heads=2, num_key_value_heads=1, use_moe=True, n_routed_experts=n_experts,
                          num_experts_per_tok=top_k, norm_topk_prob=norm, aux_loss_alpha=coef,
                          moe_intermediate_size=width)


def _twin(ref: MOEFeedForward, **changes) -> MOEFeedForward:
    """``ref``'s weights in a layer whose config differs by ``changes`` (for the planted mistakes)."""
    other = MOEFeedForward(ref.config.replace(**changes)).train(ref.training)
    other.load_state_dict(ref.state_dict(), strict=True)
    return other


def _moe3_output_mistakes(ref: MOEFeedForward, x: torch.Tensor) -> Dict[str, Callable[[], torch.Tensor]]:
    cfg = ref.config
    k, E = cfg.num_experts_per_tok, cfg.n_routed_experts
    out = {}
    for other_k in (1, 2):
        if other_k != k and other_k <= E:
            out[f"top-{other_k} where top-{k} is asked (read config.num_experts_per_tok)"] = \
                (lambda kk=other_k: _twin(ref, num_experts_per_tok=kk)(x))
    if cfg.norm_topk_prob:
        what = ("the top-1 weight left unnormalized (MiniMind2's rule renormalizes only when k > 1; minimind-3's "
                "norm_topk_prob renormalizes for any k, so a single weight becomes exactly 1)") if k == 1 else \
            "the top-k weights not renormalized although config.norm_topk_prob is True"
        out[what] = lambda: _twin(ref, norm_topk_prob=False)(x)
    else:
        out["the weights renormalized although config.norm_topk_prob is False"] = \
            lambda: _twin(ref, norm_topk_prob=True)(x)
    out["every chosen expert counted with weight 1 (the weights multiply the experts' outputs)"] = \
        lambda: _ones_weighted(ref, x)
    return out


def _ones_weighted(ref: MOEFeedForward, x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    idx = F.softmax(ref.gate(flat), dim=-1).topk(ref.config.num_experts_per_tok, dim=-1).indices
    y = torch.zeros_like(flat)
    for i, expert in enumerate(ref.experts):
        rows = (idx == i).any(dim=-1).nonzero().flatten()
        if rows.numel():
            y.index_add_(0, rows, expert(flat[rows]))
    return y.view(x.shape)


def _moe3_aux_mistakes(ref: MOEFeedForward, x: torch.Tensor, aux: torch.Tensor) -> Dict[str, Callable[[], torch.Tensor]]:
    cfg = ref.config
    E, k, coef = cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.aux_loss_alpha
    flat = x.reshape(-1, x.shape[-1])
    scores = F.softmax(ref.gate(flat), dim=-1)
    idx = scores.topk(k, dim=-1).indices
    return {
        "MiniMind2's per-sequence loss (seq_aux_loss); minimind-3 computes one loss over all the tokens of the batch":
            lambda: seq_aux_loss(scores, idx, x.shape[0], E, coef),
        "MiniMind2's global loss over routing slots (global_aux_loss: each slot is 1/(n*k) of the load); "
        "minimind-3's load_i is the share of tokens that chose expert i, so the loads sum to k":
            lambda: global_aux_loss(scores, idx, E, coef),
        "the factor num_experts left out": lambda: aux / E,
        "the coefficient router_aux_loss_coef (config.aux_loss_alpha) left out": lambda: aux / coef,
    }


solution("7.5", "__init__: self.config = config; self.gate = nn.Linear(config.hidden_size, config.n_routed_experts, "
                "bias=False); self.experts = nn.ModuleList(FeedForward(config, config.expert_intermediate_size) for each "
                "expert); forward: scores = softmax(gate(x_flat)); topk_weight, topk_idx = topk(scores, k); if "
                "norm_topk_prob: topk_weight /= topk_weight.sum(-1, keepdim=True) + 1e-20; for each expert i: rows = "
                "(topk_idx == i).any(-1).nonzero().flatten(); y.index_add_(0, rows, expert(x_flat[rows]) * "
                "topk_weight[topk_idx == i].view(-1, 1)); in training an expert without rows adds 0 * sum(p.sum() for p "
                "in expert.parameters()) to y; self.aux_loss = coef * E * (one_hot(topk_idx, E).float().mean(0) * "
                "scores.mean(0)).sum() in training (coef > 0), else 0")


def _moe3_cases(g: torch.Generator):
    """(description, config, x, gate scale): top-1 and top-2, unnormalized, an expert without tokens."""
    return [
        ("4 experts, top-1, router_aux_loss_coef 0.1", _config3(16, 4, 1, 0.1), torch.randn(2, 6, 16, generator=g), 1.0),
        ("5 experts of width 24, top-2, coef 0.05", _config3(16, 5, 2, 0.05, width=24),
         torch.randn(3, 4, 16, generator=g), 1.0),
        ("4 experts, top-2, norm_topk_prob=False, coef 0.1", _config3(16, 4, 2, 0.1, norm=False),
         torch.randn(2, 5, 16, generator=g), 1.0),
        ("3 experts, top-1, a router that sends no token to one expert, coef 0.1", _config3(12, 3, 1, 0.1),
         torch.randn(2, 4, 12, generator=g), 0.0),
    ]


@check(MOE3, shown=True, why="one entry of an MoE layer's output, its loss and gradients on random weights")
def check_minimind3_moe(cls: Callable[..., nn.Module]) -> str:
    """``cls(config)`` must be minimind-3's MoE layer: upstream's state-dict keys (``gate.weight``, ``experts.{i}.*``),
    ``forward(x [b, s, d]) -> [b, s, d]`` equal to ``minimind_ref.MOEFeedForward`` with ``moe_variant="minimind-3"``
    in training and in eval, ``self.aux_loss`` (minimind-3's router loss in training, 0 in eval), the same gradients,
    and a (zero) gradient for an expert no token chose."""
    g = torch.Generator().manual_seed(75)
    hint = ("minimind-3's layer is a linear router with a softmax over the experts, the top k of them per token with "
            "weights renormalized whenever norm_topk_prob is set (for k = 1 too), the weighted outputs of the chosen "
            "experts and nothing else, and one load-balancing loss over all the tokens of the batch")
    cases = _moe3_cases(g)
    for case, cfg, x, gate_scale in cases:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(750 + cfg.n_routed_experts + cfg.num_experts_per_tok)
            ref = MOEFeedForward(cfg).train()
            with torch.no_grad():
                for name, p in ref.named_parameters():
                    p.copy_(torch.randn(p.shape) * (0.5 if name == "gate.weight" else 0.3))
                if gate_scale == 0.0:  # expert 0 wins every token: experts 1, 2 get none
                    ref.gate.weight.zero_()
                    ref.gate.weight[0] = 5.0 * x.reshape(-1, x.shape[-1]).mean(0) / x.reshape(-1, x.shape[-1]).mean(0).norm()
                    x = x * 0.1 + x.reshape(-1, x.shape[-1]).mean(0) * 3
            mod = call_refusing(cls, cfg, forbidden=MOE3_PARTS, name=MOE3, hint=hint, case=case)
        if not isinstance(mod, nn.Module):
            fail(MOE3, f"MiniMind3MoE(config) must build an nn.Module, got {type(mod).__name__} (on {case})",
                 "define a class that subclasses torch.nn.Module and builds its layers in __init__")
        got_keys, ref_keys = set(mod.state_dict()), set(ref.state_dict())
        if got_keys != ref_keys:
            extra, missing = sorted(got_keys - ref_keys), sorted(ref_keys - got_keys)
            if any("shared" in key for key in extra):
                what = (f"this looks like the shared expert left in: your layer has {', '.join(extra[:3])}; minimind-3 "
                        "removed MiniMind2's shared expert")
            else:
                what = (f"your layer's weights do not have upstream's names (on {case}): unexpected {extra[:4]}, "
                        f"missing {missing[:4]}")
            fail(MOE3, what, "name the router gate (an nn.Linear) and the experts experts, an nn.ModuleList of "
                             "minimind_ref.FeedForward built with config.expert_intermediate_size; no other weights")
        try:
            mod.load_state_dict(ref.state_dict(), strict=True)
        except RuntimeError as err:
            fail(MOE3, f"upstream's weights do not fit your layer (on {case}): {str(err).splitlines()[-1].strip()}",
                 "the router maps hidden_size to n_routed_experts without a bias; each expert is as wide as "
                 "config.expert_intermediate_size")
        mod.train()
        weights = torch.randn(x.shape, generator=g)
        x_ref, x_got = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        expected = ref(x_ref)
        got = call_refusing(mod, x_got, forbidden=MOE3_PARTS, name=MOE3, hint=hint, case=f"{case}, training mode")
        with torch.no_grad():
            check_close(got, expected.detach(), name=f"{MOE3}: output", hint=hint, case=f"{case}, training mode",
                        mistakes=_moe3_output_mistakes(ref, x))
        aux = getattr(mod, "aux_loss", None)
        if not isinstance(aux, torch.Tensor):
            fail(MOE3, f"after a training-mode forward, self.aux_loss must be a tensor (the router loss), got "
                 f"{type(aux).__name__} (on {case})", "store the loss on the module in forward: self.aux_loss = ...")
        with torch.no_grad():
            check_close(aux.reshape(()).detach(), ref.aux_loss.detach(), name=f"{MOE3}: aux_loss", case=case,
                        hint="load_i is the share of tokens that chose expert i in any of their k slots, P_i the mean "
                             "router probability of expert i over all tokens; scale by num_experts and the coefficient",
                        mistakes=_moe3_aux_mistakes(ref, x, ref.aux_loss.detach()))
        (expected * weights).sum().add(ref.aux_loss).backward()
        (got * weights).sum().add(aux.reshape(())).backward()
        for (name, p_ref), (_, p_got) in zip(ref.named_parameters(), mod.named_parameters()):
            if p_got.grad is None:
                fail(MOE3, f"{name} received no gradient in training (on {case})",
                     "an expert that no token chose must stay in the graph through a term whose value is zero (as "
                     "upstream does), so every parameter gets a gradient")
            check_close(p_got.grad, p_ref.grad, name=f"{MOE3}: gradient of {name}", case=case,
                        hint="the router's gradient comes from the weighted outputs (when they are not all 1) and from "
                             "the balance loss; keep the whole computation differentiable")
        mod.eval(), ref.eval()
        with torch.no_grad():
            check_close(call_refusing(mod, x.clone(), forbidden=MOE3_PARTS, name=MOE3, hint=hint,
                                      case=f"{case}, eval mode"), ref(x),
                        name=f"{MOE3}: output in eval mode", hint=hint, case=case)
            aux_eval = getattr(mod, "aux_loss", None)
            if not isinstance(aux_eval, (torch.Tensor, float, int)) or float(aux_eval) != 0.0:
                fail(MOE3, f"in eval mode self.aux_loss must be 0, got {aux_eval!r:.40} (on {case})",
                     "compute the balance loss only when self.training is True (and the coefficient is > 0)")
    return (f"{len(cases)} layers (top-1 and top-2, unnormalized weights, an expert without tokens) equal minimind-3's "
            "MOEFeedForward: output, router loss and gradients in training, output and zero loss in eval")


# ---------------------------------------------------------------------------------- 7.6
def _perfectly_balanced(n_experts: int, top_k: int, repeats: int = 3) -> Tuple[torch.Tensor, torch.Tensor]:
    """Uniform router probabilities and a routing where every expert is chosen by the same share of tokens."""
    n = n_experts * repeats
    idx = torch.stack([(torch.arange(n) + j) % n_experts for j in range(top_k)], dim=-1)
    return torch.full((n, n_experts), 1.0 / n_experts), idx


solution("7.6", "at perfect balance every load_i is top_k / num_experts and every P_i is 1 / num_experts, so "
                "coef * num_experts * sum_i load_i * P_i = coef * top_k")


EVALUATE = "the exercise asks you to derive the value at balance, not to evaluate the loss on a balanced routing"
# evaluating the loss on a routing built for it answers nothing: 7.6 derives the value
EVALUATING = [forbid("minimind_ref.moe's router losses (router_aux_loss, global_aux_loss, seq_aux_loss)",
                     router_aux_loss, global_aux_loss, seq_aux_loss, reason=EVALUATE),
              forbid("a tensor built to evaluate the loss (torch.tensor, torch.full, torch.ones, torch.arange, F.one_hot)",
                     torch.tensor, torch.full, torch.ones, torch.zeros, torch.arange, torch.eye, torch.rand, torch.randn,
                     torch.empty, F.one_hot, reason=EVALUATE)]


@check(BALANCED, shown=False, why="the value is a closed form of the case's three numbers")
def check_balanced_router_loss(fn: Callable[..., float]) -> str:
    """``fn(num_experts, top_k, coef) -> float``: the value of minimind-3's router loss when the routing is perfectly
    balanced (every expert chosen by the same share of tokens, uniform router probabilities)."""
    hint = ("write what load_i and P_i are when every expert gets the same share of the tokens' choices and the router "
            "is uniform, then put them into minimind-3's router loss as this chapter defines it")
    cases = [(4, 1, 5e-4), (4, 2, 5e-4), (8, 2, 0.01), (8, 3, 0.1), (5, 5, 1.0), (16, 4, 0.02), (6, 4, 0.3)]
    outcomes = []
    for n_experts, top_k, coef in cases:
        scores, idx = _perfectly_balanced(n_experts, top_k)
        expected = float(router_aux_loss(scores, idx, n_experts, coef))
        case = f"num_experts={n_experts}, top_k={top_k}, coef={coef:g}"
        got = call_without_modules(guarded(fn, BALANCED, EVALUATING, case=case, hint=hint), n_experts, top_k, coef,
                                   name=BALANCED, hint=hint, case=case, what="derive the value")
        got = as_number(got, BALANCED, case, integer=False, what="the loss")
        mistakes = {
            "MiniMind2's value at balance carried over; minimind-3's load_i is a share of the tokens, not of the "
            "routing slots, so work out again what each load_i is when every expert is chosen equally often": coef,
            "the factor num_experts left out": expected / n_experts,
            "one factor num_experts too many": expected * n_experts,
            "top_k counted twice (each load_i holds it already)": expected * top_k,
            "the coefficient left out": expected / coef,
            "the value divided by top_k": coef / top_k,
            "each load_i taken as 1 whatever top_k": coef * n_experts,
        }
        outcomes.append(Outcome(case, got, expected, mistakes))
    check_numbers(BALANCED, outcomes, hint, rel_tol=1e-6, abs_tol=1e-12)
    return (f"{len(cases)} cases: at perfect balance minimind-3's router loss is coef * top_k (5e-4 at top-1, 1e-3 at top-2 with "
            "upstream's coefficient)")
