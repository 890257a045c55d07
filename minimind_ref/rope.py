"""Rotary position embedding (RoPE, Su et al. 2021) with optional YaRN scaling (Peng et al. 2023).

Each head vector of width ``dim`` is split into two halves ``[x1, x2]`` (the "half-split" layout
used by MiniMind, Llama and Hugging Face); pair ``i`` is ``(x1[i], x2[i])`` and is rotated by the
angle ``position * freq[i]`` with ``freq[i] = rope_base ** (-2i / dim)``.

Shapes: ``precompute_freqs_cis`` returns ``cos, sin`` of shape ``[end, dim]``;
``apply_rotary_pos_emb`` takes ``q, k`` of shape ``[batch, seq, heads, dim]`` and ``cos, sin`` of
shape ``[seq, dim]`` (with the default ``unsqueeze_dim=1``).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from .config import validate_rope_scaling


def rope_frequencies(dim: int, rope_base: float = 1e6) -> torch.Tensor:
    """The ``dim // 2`` rotation frequencies ``rope_base ** (-2i/dim)`` in radians per position, fp32."""
    if dim % 2 != 0:
        raise ValueError(f"RoPE needs an even head dimension, got dim={dim}.")
    return 1.0 / (rope_base ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))


def yarn_ramp(dim: int, rope_base: float, original_max: int, beta_fast: float, beta_slow: float) -> torch.Tensor:
    """YaRN's per-frequency ramp ``gamma`` in [0, 1], shape ``[dim // 2]``.

    ``gamma = 0`` keeps a frequency (fast dimensions that rotate many times within the trained
    length), ``gamma = 1`` divides it by the scaling factor (slow dimensions), linear in between.
    The boundaries are the dimensions whose wavelength fits ``beta_fast`` resp. ``beta_slow``
    full turns into ``original_max`` positions.
    """

    def inv_dim(turns: float) -> float:
        return (dim * math.log(original_max / (turns * 2 * math.pi))) / (2 * math.log(rope_base))

    low = max(math.floor(inv_dim(beta_fast)), 0)
    high = min(math.ceil(inv_dim(beta_slow)), dim // 2 - 1)
    return torch.clamp((torch.arange(dim // 2).float() - low) / max(high - low, 0.001), 0, 1)


def scaled_frequencies(
    dim: int,
    end: int,
    rope_base: float = 1e6,
    rope_scaling: Optional[dict] = None,
) -> Tuple[torch.Tensor, float]:
    """The ``dim // 2`` frequencies a table of ``end`` positions uses, and the attention factor.

    Without ``rope_scaling`` (a YaRN dict), or when ``end <= original_max_position_embeddings``,
    these are the plain ``rope_frequencies`` and the factor is 1 (YaRN's ``attention_factor`` still
    applies when a dict is given). Otherwise each frequency is scaled by
    ``(1 - gamma) + gamma / factor`` with ``gamma = yarn_ramp(...)``.
    """
    freqs = rope_frequencies(dim, rope_base)
    if rope_scaling is None:
        return freqs, 1.0
    validate_rope_scaling(rope_scaling)  # a factor <= 0 (or NaN) would give NaN tables
    orig_max = rope_scaling.get("original_max_position_embeddings", 2048)
    factor = rope_scaling.get("factor", 16)
    attn_factor = rope_scaling.get("attention_factor", 1.0)
    if end / orig_max > 1.0:
        ramp = yarn_ramp(dim, rope_base, orig_max, rope_scaling.get("beta_fast", 32.0), rope_scaling.get("beta_slow", 1.0))
        freqs = freqs * (1 - ramp + ramp / factor)
    return freqs, attn_factor


def precompute_freqs_cis(
    dim: int,
    end: int = int(32 * 1024),
    rope_base: float = 1e6,
    rope_scaling: Optional[dict] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Cos and sin tables for positions ``0 .. end-1``, each ``[end, dim]`` in fp32.

    The frequencies come from ``scaled_frequencies`` (YaRN-scaled when asked and ``end`` exceeds
    the original length); both tables are multiplied by its attention factor. The two halves of
    the last dimension are identical (half-split layout).
    """
    freqs, attn_factor = scaled_frequencies(dim, end, rope_base, rope_scaling)
    positions = torch.arange(end, device=freqs.device)
    angles = torch.outer(positions, freqs).float()  # [end, dim // 2]
    cos = torch.cat([torch.cos(angles), torch.cos(angles)], dim=-1) * attn_factor
    sin = torch.cat([torch.sin(angles), torch.sin(angles)], dim=-1) * attn_factor
    return cos, sin


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last dimension: a 90-degree turn of every pair."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary_pos_emb(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    unsqueeze_dim: int = 1,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys: ``x * cos + rotate_half(x) * sin``.

    ``q``: ``[batch, seq, n_heads, dim]``, ``k``: ``[batch, seq, n_kv_heads, dim]``,
    ``cos``/``sin``: ``[seq, dim]``; ``unsqueeze_dim=1`` inserts the head axis so they broadcast.
    Outputs keep the input dtypes.
    """
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed.to(q.dtype), k_embed.to(k.dtype)
