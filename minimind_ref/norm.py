"""RMSNorm: scale each vector to unit root-mean-square, then by a learned gain.

    y = weight * x / sqrt(mean(x**2, dim=-1) + eps)

Shapes: x is ``[..., dim]``; ``weight`` is ``[dim]``; the output has x's shape.
"""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square layer normalization (Zhang & Sennrich, 2019), as in MiniMind.

    The statistics are computed in fp32 (``x.float()``). Where the cast back happens is the one
    difference between the generations:

    * MiniMind2 (c090b69, ``cast_after_weight=False``): the normalized value is cast back to the
      input dtype *before* the gain is applied, ``weight * norm(x.float()).type_as(x)``
      (``c090b69:model/model_minimind.py:105-106``); so a bf16
      input with an fp32 weight returns fp32 (a module converted to bf16 returns bf16).
    * minimind-3 (d65ef2c, ``cast_after_weight=True``): the gain is applied in fp32 and the product
      is cast, ``(weight * norm(x.float())).type_as(x)`` (``d65ef2c:model/model_minimind.py:59-60``); the
      output always has the input's dtype.

    In fp32 the two are identical.
    """

    def __init__(self, dim: int, eps: float = 1e-5, cast_after_weight: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.cast_after_weight = cast_after_weight
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(f"RMSNorm expects a last dimension of {self.dim}, got input of shape {tuple(x.shape)}.")
        if self.cast_after_weight:
            return (self.weight * self._norm(x.float())).type_as(x)
        return self.weight * self._norm(x.float()).type_as(x)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}" + (", cast_after_weight=True" if self.cast_after_weight else "")
