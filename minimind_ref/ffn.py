"""SwiGLU feed-forward network (Shazeer, 2020), applied to every token independently.

    FFN(x) = down_proj( act(gate_proj(x)) * up_proj(x) )

Shapes: x ``[..., hidden]`` -> ``[..., intermediate]`` (twice) -> ``[..., hidden]``.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .config import MiniMindConfig

#: Activation name -> function (the names Hugging Face's ACT2FN uses).
ACTIVATIONS: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class FeedForward(nn.Module):
    """Gated FFN with three bias-free projections; ``hidden_act='silu'`` makes it SwiGLU.

    ``intermediate_size`` defaults to ``config.intermediate_size`` (MoE experts pass
    ``config.expert_intermediate_size``). Dropout on the output only when ``config.ffn_dropout``
    (MiniMind2: ``c090b69:model/model_minimind.py:228-229``; minimind-3's ``FeedForward`` has none:
    ``d65ef2c:model/model_minimind.py:145-146``)."""

    def __init__(self, config: MiniMindConfig, intermediate_size: Optional[int] = None) -> None:
        super().__init__()
        width = intermediate_size or config.intermediate_size
        self.gate_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.down_proj = nn.Linear(width, config.hidden_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.dropout = nn.Dropout(config.dropout) if config.ffn_dropout else nn.Identity()
        self.act_fn = ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x)))
