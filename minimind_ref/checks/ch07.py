"""Checks for chapter 07 (mixture of experts).

Every check builds the matching ``minimind_ref`` module (``MoEGate``, ``MOEFeedForward``,
``seq_aux_loss``) on several random cases, edge cases included (top-1 routing, experts that get
no token, several shared experts, sequences routed differently), and compares the learner's
function with it.

    from minimind_ref.checks import ch07
    ch07.check_route(route)
    ch07.check_dispatch(dispatch)
    ch07.check_moe_forward(moe_forward)
    ch07.check_seq_aux_loss(seq_balance_loss)
"""

from __future__ import annotations

from typing import Callable, List, Tuple

import torch

from ..config import MiniMindConfig
from ..moe import MOEFeedForward, MoEGate, seq_aux_loss
from .core import ExerciseError, call, check, check_close, check_equal

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
@check("Exercise 7.1 route")
def check_route(route: Callable[..., Tuple[torch.Tensor, torch.Tensor]]) -> str:
    """``route(x [n, d], weight [E, d], top_k, norm_topk_prob) -> (topk_idx [n, k], topk_weight [n, k])``."""
    name = "Exercise 7.1 route"
    g = torch.Generator().manual_seed(71)
    cases: List[Tuple[int, int, bool]] = [(4, 2, True), (4, 1, True), (8, 2, False), (6, 3, True), (4, 4, True), (5, 1, False)]
    for n_experts, top_k, norm in cases:
        n, d = 12, 16
        x = torch.randn(n, d, generator=g)
        cfg = _config(hidden=d, n_experts=n_experts, top_k=top_k, norm=norm)
        gate = MoEGate(cfg).eval()
        with torch.no_grad():
            gate.weight.copy_(torch.randn(n_experts, d, generator=g) * 0.5)
        ref_idx, ref_w, _ = gate(x.view(1, n, d))
        out = call(route, x.clone(), gate.weight.detach().clone(), top_k, norm, name=name)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ExerciseError(f"[{name}] expected a tuple (topk_idx, topk_weight), got {type(out).__name__}")
        idx, w = out
        case = f"(n_experts={n_experts}, top_k={top_k}, norm_topk_prob={norm})"
        if not isinstance(idx, torch.Tensor) or idx.dtype != torch.long:
            raise ExerciseError(f"[{name}] {case}: topk_idx must be a LongTensor (torch.topk's indices), got {getattr(idx, 'dtype', type(idx))}")
        check_equal(tuple(idx.shape), (n, top_k), name=f"{name} {case} topk_idx shape", hint="one row per token, k expert ids per row")
        ri, rw = _sort_by_expert(ref_idx, ref_w)
        gi, gw = _sort_by_expert(idx, w.detach() if isinstance(w, torch.Tensor) else w)
        check_equal(gi, ri, name=f"{name} {case} chosen experts",
                    hint="softmax the logits x @ weight.T over the experts, then keep the k largest scores per token")
        hint = "renormalize the k weights to sum to 1 only when top_k > 1 and norm_topk_prob is True; a single (top-1) weight stays the raw softmax score"
        if top_k == 1 and norm:
            hint = "top-1 weights are NOT renormalized (upstream leaves a single weight as is: it would always be 1.0 and the router would get no gradient)"
        elif not norm:
            hint = "norm_topk_prob=False: return the raw softmax scores of the chosen experts"
        check_close(gw, rw, name=f"{name} {case} topk_weight", hint=hint)
    return f"{len(cases)} routing cases (top-1, top-k, k = E, with and without renormalization) match MoEGate"


# ---------------------------------------------------------------------------------- 7.2
def _routing(g: torch.Generator, n: int, n_experts: int, top_k: int, skip_expert: int = -1) -> Tuple[torch.Tensor, torch.Tensor]:
    """Distinct experts per token (as top-k gives), optionally never using ``skip_expert``."""
    pool = [e for e in range(n_experts) if e != skip_expert]
    rows = [torch.tensor(pool)[torch.randperm(len(pool), generator=g)[:top_k]] for _ in range(n)]
    idx = torch.stack(rows)
    w = torch.rand(n, top_k, generator=g) + 0.1
    return idx, w


@check("Exercise 7.2 dispatch")
def check_dispatch(dispatch: Callable[..., torch.Tensor]) -> str:
    """``dispatch(x [n, d], experts, flat_idx [n*k], flat_weight [n*k, 1], top_k) -> [n, d]``."""
    name = "Exercise 7.2 dispatch"
    g = torch.Generator().manual_seed(72)
    cases = [(4, 2, -1), (4, 1, -1), (4, 2, 3), (6, 3, 0), (5, 2, 2)]
    for n_experts, top_k, skip in cases:
        n, d = 10, 16
        torch.manual_seed(720 + n_experts + top_k)
        moe = MOEFeedForward(_config(hidden=d, n_experts=n_experts, top_k=top_k, n_shared=0)).eval()
        x = torch.randn(n, d, generator=g)
        idx, w = _routing(g, n, n_experts, top_k, skip)
        flat_idx, flat_w = idx.view(-1), w.view(-1, 1)
        expected = moe.moe_infer(x, flat_idx, flat_w)
        with torch.no_grad():
            got = call(dispatch, x.clone(), moe.experts, flat_idx.clone(), flat_w.clone(), top_k, name=name)
        case = f"(n_experts={n_experts}, top_k={top_k}{', one expert unused' if skip >= 0 else ''})"
        hint = ("slot j of the flattened routing belongs to token j // top_k: sort the slots by expert, run each "
                "expert once on its tokens, multiply by the slot weights and scatter-add into row j // top_k")
        check_close(got, expected, name=f"{name} {case}", hint=hint)
    return f"{len(cases)} routings (top-1..3, an expert with no token) match MOEFeedForward.moe_infer"


# ---------------------------------------------------------------------------------- 7.3
@check("Exercise 7.3 moe_forward")
def check_moe_forward(moe_forward: Callable[..., torch.Tensor]) -> str:
    """``moe_forward(moe: MOEFeedForward, x [b, s, d]) -> [b, s, d]``, equal to ``moe.eval()(x)``."""
    name = "Exercise 7.3 moe_forward"
    g = torch.Generator().manual_seed(73)
    cases = [(4, 2, 1), (4, 1, 1), (4, 2, 0), (6, 2, 2), (3, 3, 1)]
    for n_experts, top_k, n_shared in cases:
        torch.manual_seed(730 + 7 * n_experts + top_k + n_shared)
        moe = MOEFeedForward(_config(hidden=16, n_experts=n_experts, top_k=top_k, n_shared=n_shared)).eval()
        x = torch.randn(2, 5, 16, generator=g)
        with torch.no_grad():
            expected = moe(x)
            got = call(moe_forward, moe, x.clone(), name=name)
        case = f"(n_experts={n_experts}, top_k={top_k}, n_shared_experts={n_shared})"
        hint = ("gate -> dispatch the routed experts -> reshape to x.shape -> add every shared expert's output "
                "(shared experts see every token, with weight 1)")
        check_close(got, expected, name=f"{name} {case}", hint=hint)
    return f"{len(cases)} layers (0, 1 and 2 shared experts; top-1..3) match MOEFeedForward in eval mode"


# ---------------------------------------------------------------------------------- 7.4
@check("Exercise 7.4 seq_balance_loss")
def check_seq_aux_loss(seq_balance_loss: Callable[..., torch.Tensor]) -> str:
    """``seq_balance_loss(scores [b*s, E], topk_idx [b*s, k], batch, n_experts, alpha) -> scalar``,
    value and gradient w.r.t. ``scores`` equal to ``minimind_ref.moe.seq_aux_loss``."""
    name = "Exercise 7.4 seq_balance_loss"
    g = torch.Generator().manual_seed(74)
    cases = [(2, 6, 4, 2, 0.1), (3, 5, 4, 1, 0.01), (1, 8, 8, 2, 1.0), (4, 4, 3, 3, 0.5)]
    for batch, seq, n_experts, top_k, alpha in cases:
        # each sequence gets its own bias, so sequences are routed differently (seq-level != global)
        logits = torch.randn(batch, seq, n_experts, generator=g) + 3.0 * torch.randn(batch, 1, n_experts, generator=g)
        scores = logits.view(-1, n_experts).softmax(-1)
        topk_idx = scores.topk(top_k, dim=-1).indices
        ref_in = scores.clone().requires_grad_(True)
        expected = seq_aux_loss(ref_in, topk_idx, batch, n_experts, alpha)
        expected.backward()
        got_in = scores.clone().requires_grad_(True)
        got = call(seq_balance_loss, got_in, topk_idx.clone(), batch, n_experts, alpha, name=name)
        case = f"(batch={batch}, seq_len={seq}, n_experts={n_experts}, top_k={top_k}, alpha={alpha})"
        if isinstance(got, torch.Tensor) and got.numel() == 1 and got.dim() > 0:
            raise ExerciseError(f"[{name}] {case}: return a 0-d tensor (a scalar), got shape {tuple(got.shape)}")
        hint = ("per sequence: f_i = n_experts * (slots routed to expert i) / (seq_len * top_k), "
                "P_i = mean router probability of expert i over the sequence; loss = alpha * mean over sequences of sum_i f_i * P_i "
                "(perfect balance gives exactly alpha)")
        check_close(got, expected.detach(), name=f"{name} {case} value", hint=hint)
        if not got.requires_grad:
            raise ExerciseError(f"[{name}] {case}: the loss does not depend on `scores` through autograd; "
                                "compute P_i from `scores` (the counts f_i carry no gradient, P_i does)")
        got.backward()
        if got_in.grad is None:
            raise ExerciseError(f"[{name}] {case}: no gradient reached `scores`")
        check_close(got_in.grad, ref_in.grad, name=f"{name} {case} gradient w.r.t. scores",
                    hint="the gradient flows only through P_i (mean of the scores per sequence); f_i is a count")
    return f"{len(cases)} batches (value and gradient, sequences routed differently) match seq_aux_loss"
