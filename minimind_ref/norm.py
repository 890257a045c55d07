"""RMSNorm: scale each vector to unit root-mean-square, then by a learned gain.

    y = weight * x / sqrt(mean(x**2, dim=-1) + eps)

Shapes: x is ``[..., dim]``; ``weight`` is ``[dim]``; the output has x's shape.
"""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square layer normalization (Zhang & Sennrich, 2019), as in MiniMind2.

    The statistics are computed in fp32 (``x.float()``) and the normalized value is cast back to
    the input dtype *before* the gain is applied, exactly like upstream. So a bf16 input with an
    fp32 weight returns fp32, and a module converted with ``.to(torch.bfloat16)`` returns bf16.
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(f"RMSNorm expects a last dimension of {self.dim}, got input of shape {tuple(x.shape)}.")
        return self.weight * self._norm(x.float()).type_as(x)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"
