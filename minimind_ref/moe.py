"""Mixture-of-experts feed-forward layer as in MiniMind2-MoE (DeepSeekMoE-style).

A router (``MoEGate``) scores every token against ``n_routed_experts`` experts with a softmax,
keeps the top ``k`` (optionally renormalized to sum to 1 when k > 1), and the token's output is the
weighted sum of those experts' outputs plus the output of every shared expert.

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
    """Routed experts + shared experts, with upstream's two code paths.

    * training (``module.train()``): every token is repeated ``k`` times and each expert runs on
      the copies routed to it; differentiable, and experts that got no token still receive a
      (zero) gradient.
    * inference (``module.eval()``): ``moe_infer`` sorts the routing slots by expert, runs each
      expert once on its contiguous slice and scatter-adds the weighted outputs (no gradients).
    """

    def __init__(self, config: MiniMindConfig) -> None:
        super().__init__()
        self.config = config
        self.experts = nn.ModuleList([FeedForward(config) for _ in range(config.n_routed_experts)])
        self.gate = MoEGate(config)
        if config.n_shared_experts > 0:
            self.shared_experts = nn.ModuleList([FeedForward(config) for _ in range(config.n_shared_experts)])
        self.aux_loss: Union[torch.Tensor, float] = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        orig_shape = x.shape
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
