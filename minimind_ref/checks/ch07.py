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
"""

from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F

from ..config import MiniMindConfig
from ..moe import MOEFeedForward, MoEGate, global_aux_loss, seq_aux_loss
from .core import call, check, check_close, diagnose, fail, solution

__all__ = ["check_route", "check_dispatch", "check_moe_forward", "check_seq_aux_loss"]


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


def _route_weight_mistakes(x: torch.Tensor, weight: torch.Tensor, top_k: int, norm: bool) -> Dict[str, object]:
    """Wrong top-k weights, ordered by expert id like the comparison."""
    logits = F.linear(x, weight)
    probs = logits.softmax(dim=-1)
    w, idx = torch.topk(probs, k=top_k, dim=-1)
    lw = logits.gather(-1, idx)
    renorm = w / w.sum(dim=-1, keepdim=True)
    out = {}
    if top_k == 1 and norm:
        out["the single top-1 weight was renormalized to 1.0 (upstream leaves it as is, or the router would get no "
            "gradient)"] = renorm
    if top_k > 1 and norm:
        out["the k weights were not renormalized although top_k > 1 and norm_topk_prob=True"] = w
    if not norm:
        out["the weights were renormalized although norm_topk_prob=False"] = renorm
    out["raw router logits instead of softmax probabilities"] = lw
    out["softmax over the tokens (dim=0) instead of over the experts"] = logits.softmax(dim=0).gather(-1, idx)
    return {k: _sort_by_expert(idx, v)[1] for k, v in out.items()}


solution("7.1", "scores = F.linear(x, weight).softmax(dim=-1); topk_weight, topk_idx = torch.topk(scores, k=top_k, "
                "dim=-1, sorted=False); if top_k > 1 and norm_topk_prob: topk_weight = topk_weight / "
                "(topk_weight.sum(dim=-1, keepdim=True) + 1e-20)")


@check(ROUTE)
def check_route(route: Callable[..., Tuple[torch.Tensor, torch.Tensor]]) -> str:
    """``route(x [n, d], weight [E, d], top_k, norm_topk_prob) -> (topk_idx [n, k], topk_weight [n, k])``."""
    g = torch.Generator().manual_seed(71)
    hint = ("each token's scores are a probability distribution over the experts; keep the k best experts, and "
            "rescale their k weights to sum to 1 only when that is asked for and there is more than one of them")
    cases: List[Tuple[int, int, bool]] = [(4, 2, True), (4, 1, True), (8, 2, False), (6, 3, True), (4, 4, True), (5, 1, False)]
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
        out = call(route, x.clone(), weight.clone(), top_k, norm, name=ROUTE, hint=hint, case=case, check_inputs=True)
        if not (isinstance(out, tuple) and len(out) == 2):
            fail(ROUTE, f"expected a tuple (topk_idx, topk_weight), got {type(out).__name__} (on {case})",
                 "end with `return topk_idx, topk_weight`")
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
        gi, gw = _sort_by_expert(idx, w.detach() if isinstance(w, torch.Tensor) else w)
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
        check_close(gw, rw, name=f"{ROUTE}: topk_weight", hint=hint, case=case,
                    mistakes=_route_weight_mistakes(x, weight, top_k, norm))
    return f"{len(cases)} routing cases (top-1, top-k, k = E, with and without renormalization) match MoEGate"


# ---------------------------------------------------------------------------------- 7.2
def _routing(g: torch.Generator, n: int, n_experts: int, top_k: int, skip_expert: int = -1) -> Tuple[torch.Tensor, torch.Tensor]:
    """Distinct experts per token (as top-k gives), optionally never using ``skip_expert``."""
    pool = [e for e in range(n_experts) if e != skip_expert]
    rows = [torch.tensor(pool)[torch.randperm(len(pool), generator=g)[:top_k]] for _ in range(n)]
    idx = torch.stack(rows)
    w = torch.rand(n, top_k, generator=g) + 0.1
    return idx, w


def _dispatch_variant(x, experts, flat_idx, flat_weight, top_k, token_of=None, weight_of=None, add=True):
    """The sorted dispatch with one step swapped out (for naming mistakes)."""
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
        start = end
    return out


def _dispatch_mistakes(x, experts, flat_idx, flat_weight, top_k) -> Dict[str, Callable[[], torch.Tensor]]:
    n = x.shape[0]
    args = (x, experts, flat_idx, flat_weight, top_k)
    return {
        "slot j given to token j % n instead of j // top_k (the k slots of one token sit next to each other)":
            lambda: _dispatch_variant(*args, token_of=lambda s, a, b: s % n),
        "the slot weights were not applied": lambda: _dispatch_variant(*args, weight_of=lambda s, a, b: torch.ones_like(flat_weight[s])),
        "an expert's output is assigned to its tokens instead of added (a token routed to several experts must get "
        "the sum of their outputs)": lambda: _dispatch_variant(*args, add=False),
        "the weights were read in unsorted slot order (flat_weight[start:end]) instead of for the sorted slots "
        "themselves": lambda: _dispatch_variant(*args, weight_of=lambda s, a, b: flat_weight[a:b]),
        "each token's output uses the weight of its token row instead of its slot":
            lambda: _dispatch_variant(*args, weight_of=lambda s, a, b: flat_weight.view(-1, top_k)[s // top_k, :1]),
    }


solution("7.2", "order = flat_idx.argsort(); ends = flat_idx.bincount(minlength=len(experts)).cumsum(0); for each "
                "expert i with a non-empty run order[start:end]: tokens = order[start:end] // top_k, "
                "y = experts[i](x[tokens]) * flat_weight[order[start:end]], out.index_add_(0, tokens, y)")


@check(DISPATCH)
def check_dispatch(dispatch: Callable[..., torch.Tensor]) -> str:
    """``dispatch(x [n, d], experts, flat_idx [n*k], flat_weight [n*k, 1], top_k) -> [n, d]``; the
    inputs are left unchanged."""
    g = torch.Generator().manual_seed(72)
    hint = ("every slot j carries one (token, expert, weight) triple; after sorting the slots by expert, keep track of "
            "which token and which weight each sorted slot came from, and remember that a token owns top_k slots")
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
        with torch.no_grad():
            got = call(dispatch, x.clone(), moe.experts, flat_idx.clone(), flat_w.clone(), top_k, name=DISPATCH,
                       hint=hint, case=case, check_inputs=True)
            check_close(got, expected, name=DISPATCH, hint=hint, case=case,
                        mistakes=_dispatch_mistakes(x, moe.experts, flat_idx, flat_w, top_k))
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
    if len(shared) > 1:
        out["only the first shared expert was added (add every one of moe.shared_experts)"] = \
            lambda: plus_shared(routed(), experts=shared[:1])
    if shared:
        out["the shared experts were applied to the routed output instead of to x"] = \
            lambda: (lambda y: y + sum(e(y) for e in shared))(routed().view(b, s, d))
    return out


solution("7.3", "topk_idx, topk_weight, _ = moe.gate(x); y = dispatch(x.view(-1, d), moe.experts, topk_idx.view(-1), "
                "topk_weight.view(-1, 1), moe.config.num_experts_per_tok).view(b, s, d); then for every expert in "
                "getattr(moe, 'shared_experts', []): y = y + expert(x)")


@check(MOE)
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
            got = call(moe_forward, moe, x.clone(), name=MOE, hint=hint, case=case, check_inputs=True)
            check_close(got, expected, name=MOE, hint=hint, case=case, mistakes=_moe_mistakes(moe, x))
    return f"{len(cases)} layers (0, 1 and 2 shared experts; top-1..3) match MOEFeedForward in eval mode"


# ---------------------------------------------------------------------------------- 7.4
def _balance_mistakes(scores, topk_idx, batch, n_experts, alpha) -> Dict[str, Callable[[], torch.Tensor]]:
    n_tokens, top_k = topk_idx.shape
    seq_len = n_tokens // batch

    def seq(f_scale=1.0, reduce="mean", use_alpha=True):
        share = F.one_hot(topk_idx.view(batch, seq_len * top_k), n_experts).float().mean(dim=1) * f_scale
        p = scores.view(batch, seq_len, n_experts).mean(dim=1)
        per_seq = (share * n_experts * p).sum(dim=1)
        total = per_seq.mean() if reduce == "mean" else per_seq.sum()
        return total * (alpha if use_alpha else 1.0)

    return {
        "f_i was not multiplied by n_experts (perfect balance must give alpha, not alpha / n_experts)":
            lambda: seq() / n_experts,
        "the loss was computed over the whole batch at once (the global form); this one is per sequence, then "
        "averaged": lambda: global_aux_loss(scores, topk_idx, n_experts, alpha),
        "f_i was divided by seq_len instead of seq_len * top_k (count slots, not tokens)": lambda: seq(f_scale=top_k),
        "alpha was left out": lambda: seq(use_alpha=False),
        "the per-sequence losses were summed instead of averaged over the batch": lambda: seq(reduce="sum"),
    }


solution("7.4", "f = F.one_hot(topk_idx.view(b, s * k), E).float().mean(dim=1) * E; P = scores.view(b, s, E).mean(dim=1); "
                "loss = alpha * (f * P).sum(dim=1).mean()")


@check(BALANCE)
def check_seq_aux_loss(seq_balance_loss: Callable[..., torch.Tensor]) -> str:
    """``seq_balance_loss(scores [b*s, E], topk_idx [b*s, k], batch, n_experts, alpha) -> scalar``,
    value and gradient w.r.t. ``scores`` equal to ``minimind_ref.moe.seq_aux_loss``."""
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
        got = call(seq_balance_loss, got_in, topk_idx.clone(), batch, n_experts, alpha, name=BALANCE, hint=hint,
                   case=case, check_inputs=True)
        if isinstance(got, torch.Tensor) and got.numel() == 1 and got.dim() > 0:
            fail(BALANCE, f"return a 0-d tensor (a scalar), got shape {tuple(got.shape)} (on {case})",
                 "reduce to a single number with .mean()/.sum() instead of keeping a dimension of size 1")
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
