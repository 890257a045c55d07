"""Counting parameters: totals (tied weights once), per-component breakdowns, active parameters."""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, Union

import torch
from torch import nn

from .config import MiniMindConfig


def _as_model(model_or_config: Union[nn.Module, MiniMindConfig]) -> nn.Module:
    if isinstance(model_or_config, MiniMindConfig):
        from .model import MiniMindForCausalLM

        with torch.device("meta"):  # shapes only, no memory, no initialisation cost
            return MiniMindForCausalLM(model_or_config)
    if not isinstance(model_or_config, nn.Module):
        hint = f" (for a preset: count_parameters(preset({model_or_config!r})))" if isinstance(model_or_config, str) else ""
        raise TypeError(f"expected a model (nn.Module) or a MiniMindConfig, got {type(model_or_config).__name__}{hint}.")
    return model_or_config


def count_parameters(model_or_config: Union[nn.Module, MiniMindConfig], trainable_only: bool = False) -> int:
    """Number of distinct parameters; a tied matrix (embedding = lm_head) counts once.

    Accepts a model or a ``MiniMindConfig`` (then built on the meta device, allocating nothing).
    """
    model = _as_model(model_or_config)
    seen = set()
    total = 0
    for p in model.parameters():  # nn.Module.parameters() already yields each tensor once
        if id(p) in seen or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        total += p.numel()
    return total


def parameter_breakdown(model_or_config: Union[nn.Module, MiniMindConfig]) -> Dict[str, int]:
    """Parameters per component of a MiniMind model, summing to ``count_parameters``.

    Keys: ``embedding`` (shared with the tied lm_head), ``attention`` (the four projections),
    ``ffn`` (dense FFNs), ``moe_routed_experts``, ``moe_shared_experts``, ``moe_gate``, ``norms``
    (every RMSNorm gain, QK-norm's included), ``lm_head`` (only when untied).
    """
    model = _as_model(model_or_config)
    out: "OrderedDict[str, int]" = OrderedDict(
        (k, 0) for k in ("embedding", "attention", "ffn", "moe_routed_experts", "moe_shared_experts", "moe_gate", "norms", "lm_head")
    )
    seen = set()
    for name, p in model.named_parameters(remove_duplicate=True):
        if id(p) in seen:
            continue
        seen.add(id(p))
        if "embed_tokens" in name:
            key = "embedding"
        elif name.startswith("lm_head"):
            key = "lm_head"
        elif "norm" in name.rsplit(".", 2)[-2]:  # the layer norms, the final norm and QK-norm's q_norm/k_norm
            key = "norms"
        elif ".self_attn." in name:
            key = "attention"
        elif ".mlp.experts." in name:
            key = "moe_routed_experts"
        elif ".mlp.shared_experts." in name:
            key = "moe_shared_experts"
        elif ".mlp.gate." in name:
            key = "moe_gate"
        elif ".mlp." in name:
            key = "ffn"
        else:  # pragma: no cover - a new module type
            raise KeyError(f"unclassified parameter {name}")
        out[key] += p.numel()
    return dict(out)


def active_parameters(model_or_config: Union[nn.Module, MiniMindConfig]) -> int:
    """Parameters used for one token: everything except the routed experts a token skips
    (a token runs ``num_experts_per_tok`` of ``n_routed_experts``). Equals the total for dense models."""
    model = _as_model(model_or_config)
    cfg = model.config
    total = count_parameters(model)
    if not cfg.use_moe:
        return total
    routed = parameter_breakdown(model)["moe_routed_experts"]
    return total - routed + routed * cfg.num_experts_per_tok // cfg.n_routed_experts
