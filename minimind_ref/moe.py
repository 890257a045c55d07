"""Mixture-of-experts feed-forward layer, in both of upstream's variants (``config.moe_variant``).

* **MiniMind2** (c090b69, DeepSeekMoE-style): a router (``MoEGate``) scores every token against
  ``n_routed_experts`` experts with a softmax, keeps the top ``k`` (renormalized to sum to 1 when
  k > 1 and ``norm_topk_prob``), and the token's output is the weighted sum of those experts'
  outputs plus the output of every shared expert. Load balancing: ``seq_aux_loss`` or
  ``global_aux_loss``, coefficient ``aux_loss_alpha`` (0.01). Two code paths: ``moe_train``
  (differentiable) and ``moe_infer`` (sorted dispatch, no gradients) in eval.
* **minimind-3** (d65ef2c, Qwen3-MoE-style): the router is a plain ``nn.Linear`` (``gate``);
  softmax, top ``k`` (1 by default), and with ``norm_topk_prob`` the weights are renormalized
  *even for k = 1* (so a single expert's weight is 1 and the task loss sends the router no
  gradient through it); no shared expert by default; load balancing ``router_aux_loss``,
  coefficient ``router_aux_loss_coef`` (5e-4); one dispatch loop with ``index_add_`` in training
  and in eval.

Shapes: x ``[b, s, hidden]``; router scores ``[b*s, n_experts]``; top-k indices and weights
``[b*s, k]``; output ``[b, s, hidden]``.
"""

from __future__ import annotations

import math
from typing import Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from .config import MiniMindConfig
from .ffn import FeedForward


def seq_aux_loss(scores: torch.Tensor, topk_idx: torch.Tensor, batch: int, n_experts: int, alpha: float) -> torch.Tensor:
    """Sequence-level load-balancing loss.

    For every sequence, ``f_i`` = fraction of its ``s*k`` routing slots that went to expert ``i``,
    times ``n_experts``; ``P_i`` = the sequence's mean router probability for expert ``i``.
    Loss = ``alpha * mean_over_sequences(sum_i f_i * P_i)``; it is ``alpha`` when perfectly balanced.

    ``scores``: ``[b*s, E]``; ``topk_idx``: ``[b*s, k]``.
    """
    seq_len = scores.shape[0] // batch
    top_k = topk_idx.shape[-1]
    idx = topk_idx.view(batch, -1)
    counts = torch.zeros(batch, n_experts, device=scores.device)
    counts.scatter_add_(1, idx, torch.ones(batch, seq_len * top_k, device=scores.device))
    f = counts.div_(seq_len * top_k / n_experts)
    p = scores.view(batch, seq_len, -1).mean(dim=1)
    return (f * p).sum(dim=1).mean() * alpha


def global_aux_loss(scores: torch.Tensor, topk_idx: torch.Tensor, n_experts: int, alpha: float) -> torch.Tensor:
    """Batch-level (global) load-balancing loss (Switch Transformer form): ``alpha * sum_i f_i * P_i``
    with ``f_i = n_experts * share of all routing slots`` and ``P_i`` the mean router probability."""
    share = F.one_hot(topk_idx.view(-1), num_classes=n_experts).float().mean(0)
    return (scores.mean(0) * share * n_experts).sum() * alpha


def router_aux_loss(scores: torch.Tensor, topk_idx: torch.Tensor, n_experts: int, coef: float) -> torch.Tensor:
    """minimind-3's load-balancing loss (``d65ef2c:model/model_minimind.py:171-173``; Qwen3-MoE's form):
    ``coef * n_experts * sum_i load_i * P_i``, where ``load_i`` is the fraction of tokens that chose
    expert ``i`` in any of their ``k`` slots (the loads sum to ``k``) and ``P_i`` the mean router
    probability. It is ``coef * k`` when perfectly balanced; for ``k = 1`` it equals
    ``global_aux_loss`` with the same coefficient, for ``k > 1`` it is ``k`` times it.

    ``scores``: ``[n, E]``; ``topk_idx``: ``[n, k]``."""
    load = F.one_hot(topk_idx, n_experts).float().mean(0)  # [k, E]: share of tokens per slot and expert
    return (load * scores.mean(0)).sum() * n_experts * coef


class MoEGate(nn.Module):
    """Router: softmax over experts, top-k selection, optional renormalization, auxiliary loss."""

    def __init__(self, config: MiniMindConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.n_routed_experts = config.n_routed_experts
        self.scoring_func = config.scoring_func
        self.alpha = config.aux_loss_alpha
        self.seq_aux = config.seq_aux
        self.norm_topk_prob = config.norm_topk_prob
        self.weight = nn.Parameter(torch.empty(self.n_routed_experts, config.hidden_size))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, hidden_states: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, Union[torch.Tensor, float]]:
        """Returns ``(topk_idx [b*s, k], topk_weight [b*s, k], aux_loss)``; aux_loss is 0 in eval."""
        batch, seq_len, hidden = hidden_states.shape
        flat = hidden_states.view(-1, hidden)
        logits = F.linear(flat, self.weight)
        if self.scoring_func != "softmax":
            raise ValueError(f"unsupported scoring function for MoE gating: {self.scoring_func!r}")
        scores = logits.softmax(dim=-1)
        topk_weight, topk_idx = torch.topk(scores, k=self.top_k, dim=-1, sorted=False)
        if self.top_k > 1 and self.norm_topk_prob:  # upstream: a single weight is left as is
            topk_weight = topk_weight / (topk_weight.sum(dim=-1, keepdim=True) + 1e-20)

        if self.training and self.alpha > 0.0:
            if self.seq_aux:
                aux_loss = seq_aux_loss(scores, topk_idx, batch, self.n_routed_experts, self.alpha)
            else:
                aux_loss = global_aux_loss(scores, topk_idx, self.n_routed_experts, self.alpha)
        else:
            aux_loss = scores.new_zeros(())
        return topk_idx, topk_weight, aux_loss


class MOEFeedForward(nn.Module):
    """Routed experts + shared experts; the router and dispatch of ``config.moe_variant``.

    MiniMind2 (c090b69) has two code paths:

    * training (``module.train()``): every token is repeated ``k`` times and each expert runs on
      the copies routed to it; differentiable, and experts that got no token still receive a
      (zero) gradient.
    * inference (``module.eval()``): ``moe_infer`` sorts the routing slots by expert, runs each
      expert once on its contiguous slice and scatter-adds the weighted outputs (no gradients).

    minimind-3 (d65ef2c) has one, ``dispatch``, in both modes (see the module docstring).
    Experts are ``config.expert_intermediate_size`` wide (``moe_intermediate_size``).
    """

    def __init__(self, config: MiniMindConfig) -> None:
        super().__init__()
        self.config = config
        width = config.expert_intermediate_size
        if config.moe_variant == "minimind-3":
            self.gate = nn.Linear(config.hidden_size, config.n_routed_experts, bias=False)
        self.experts = nn.ModuleList([FeedForward(config, width) for _ in range(config.n_routed_experts)])
        if config.moe_variant == "MiniMind2":
            self.gate = MoEGate(config)
        if config.n_shared_experts > 0:
            self.shared_experts = nn.ModuleList([FeedForward(config, width) for _ in range(config.n_shared_experts)])
        self.aux_loss: Union[torch.Tensor, float] = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        orig_shape = x.shape
        if self.config.moe_variant == "minimind-3":
            y, aux_loss = self.dispatch(x)
        else:
            topk_idx, topk_weight, aux_loss = self.gate(x)
            flat = x.view(-1, x.shape[-1])
            flat_topk_idx = topk_idx.view(-1)
            if self.training:
                y = self.moe_train(flat, flat_topk_idx, topk_weight).view(*orig_shape)
            else:
                y = self.moe_infer(flat, flat_topk_idx, topk_weight.view(-1, 1)).view(*orig_shape)
        if self.config.n_shared_experts > 0:
            for expert in self.shared_experts:
                y = y + expert(identity)
        self.aux_loss = aux_loss
        return y

    def dispatch(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """minimind-3's router and dispatch (``d65ef2c:model/model_minimind.py:156-176``), in training and
        eval alike. ``x`` ``[b, s, hidden]`` -> ``(y [b, s, hidden], aux_loss [])``.

        Each expert runs once on the tokens that chose it and its weighted output is added to their
        rows with ``index_add_`` (a token picks an expert at most once, so one row per token). An
        expert no token chose is kept in the graph in training (a zero term), so every parameter
        gets a (zero) gradient."""
        cfg = self.config
        batch, seq_len, hidden = x.shape
        x_flat = x.reshape(-1, hidden)
        scores = F.softmax(self.gate(x_flat), dim=-1)  # [n, E]
        topk_weight, topk_idx = torch.topk(scores, k=cfg.num_experts_per_tok, dim=-1, sorted=False)
        if cfg.norm_topk_prob:  # also for k = 1: the single weight becomes w / (w + 1e-20) = 1
            topk_weight = topk_weight / (topk_weight.sum(dim=-1, keepdim=True) + 1e-20)
        y = torch.zeros_like(x_flat)
        for i, expert in enumerate(self.experts):
            chosen = topk_idx == i  # [n, k]
            if chosen.any():
                token_idx = chosen.any(dim=-1).nonzero().flatten()
                weight = topk_weight[chosen].view(-1, 1)  # row order = token order
                y.index_add_(0, token_idx, (expert(x_flat[token_idx]) * weight).to(y.dtype))
            elif self.training:
                y[0, 0] += 0 * sum(p.sum() for p in expert.parameters())
        if self.training and cfg.aux_loss_alpha > 0:
            aux_loss = router_aux_loss(scores, topk_idx, cfg.n_routed_experts, cfg.aux_loss_alpha)
        else:
            aux_loss = scores.new_zeros(())
        return y.view(batch, seq_len, hidden), aux_loss

    def moe_train(self, x: torch.Tensor, flat_topk_idx: torch.Tensor, topk_weight: torch.Tensor) -> torch.Tensor:
        """Training path. ``x`` ``[n, hidden]``, ``flat_topk_idx`` ``[n*k]``, ``topk_weight`` ``[n, k]``."""
        x = x.repeat_interleave(self.config.num_experts_per_tok, dim=0)  # slot j belongs to token j // k
        y = torch.empty_like(x)
        for i, expert in enumerate(self.experts):
            chosen = flat_topk_idx == i
            expert_out = expert(x[chosen])
            if expert_out.shape[0] > 0:
                y[chosen] = expert_out.to(y.dtype)
            else:  # keep the unused expert in the graph so DDP/optimizers see a zero gradient
                y[chosen] = expert_out.to(y.dtype) + 0 * sum(p.sum() for p in expert.parameters())
        y = (y.view(*topk_weight.shape, -1) * topk_weight.unsqueeze(-1)).sum(dim=1)
        return y

    @torch.no_grad()
    def moe_infer(self, x: torch.Tensor, flat_expert_indices: torch.Tensor, flat_expert_weights: torch.Tensor) -> torch.Tensor:
        """Inference dispatch. ``x`` ``[n, hidden]``; indices ``[n*k]``; weights ``[n*k, 1]``.

        Exactly one host synchronization per call: the per-expert slot counts are computed on the
        device (a scatter-add, unlike ``bincount`` which must first read the largest index back to
        size its output) and copied to the host once, to slice the sorted slots.
        """
        expert_cache = torch.zeros_like(x)
        order = flat_expert_indices.argsort()
        counts = torch.zeros(len(self.experts), dtype=torch.long, device=x.device)
        counts.scatter_add_(0, flat_expert_indices, torch.ones_like(flat_expert_indices))
        ends = counts.cumsum(0).cpu().numpy()  # the one device -> host transfer (numpy: no torch call)
        token_of_slot = order // self.config.num_experts_per_tok
        start = 0
        for i, end in enumerate(ends):
            if start == end:
                continue
            tokens = token_of_slot[start:end]
            expert_out = self.experts[i](x.index_select(0, tokens)).to(expert_cache.dtype)
            expert_out.mul_(flat_expert_weights[order[start:end]])
            # one row per token (top-k experts are distinct): the same sums as upstream's scatter_add_
            # over a [tokens, hidden] copy of the indices, without materializing that copy
            expert_cache.index_add_(0, tokens, expert_out)
            start = end
        return expert_cache
