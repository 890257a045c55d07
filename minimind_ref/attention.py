"""Grouped-query attention (GQA) with rotary positions, optional QK-norm and a key/value cache.

Shapes (b = batch, s = new tokens, t = cached + new tokens):
    x            [b, s, hidden]
    q            [b, s, n_heads, head_dim]
    k, v         [b, s, n_kv_heads, head_dim]   (the cache stores this layout, concatenated on dim 1)
    attention_mask (padding) [b, t], 1 = real token, 0 = padding
    output       [b, s, hidden]
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .config import MiniMindConfig
from .cache import append_kv
from .norm import RMSNorm
from .rope import apply_rotary_pos_emb

KVCache = Tuple[torch.Tensor, torch.Tensor]

# PyTorch 2.5 added grouped-query support to scaled_dot_product_attention.
_SDPA_HAS_GQA = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Repeat each KV head ``n_rep`` times: ``[b, t, n_kv, d] -> [b, t, n_kv * n_rep, d]``.

    Head ``j`` of the output is KV head ``j // n_rep``, so query heads ``g*n_rep .. g*n_rep+n_rep-1``
    share KV head ``g``.
    """
    batch, seq_len, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return (
        x[:, :, :, None, :]
        .expand(batch, seq_len, n_kv_heads, n_rep, head_dim)
        .reshape(batch, seq_len, n_kv_heads * n_rep, head_dim)
    )


def qk_logit_bound(q_gain: torch.Tensor, k_gain: torch.Tensor) -> float:
    """The largest ``|q . k| / sqrt(head_dim)`` a layer with QK-norm can produce, from its two gains.

    ``q_gain`` and ``k_gain`` are the ``[head_dim]`` weights of ``q_norm`` and ``k_norm``. RMSNorm
    scales each head vector ``u`` to a mean square ``ms / (ms + eps) < 1``, so ``|u|^2 < head_dim``;
    the gain multiplies coordinate ``i`` by ``g_i``, so ``|g * u| < max|g| sqrt(head_dim)``; RoPE
    rotates pairs of coordinates and keeps the length. Cauchy-Schwarz then gives
    ``|q . k| / sqrt(d) < sqrt(d) max|g_q| max|g_k|`` for any input scale and any two positions.
    The bound is approached (large inputs, all of a vector on one coordinate) when the largest gains
    sit in the same rotation pair, ``i`` and ``i + d/2``, or at the same index.
    """
    if q_gain.dim() != 1 or q_gain.shape != k_gain.shape:
        raise ValueError(f"qk_logit_bound expects two gains of shape [head_dim], got {tuple(q_gain.shape)} and "
                         f"{tuple(k_gain.shape)} (the weights of Attention.q_norm and Attention.k_norm).")
    head_dim = q_gain.shape[0]
    return math.sqrt(head_dim) * q_gain.abs().max().item() * k_gain.abs().max().item()


def _propagate_nan(out: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``out`` [b, s, hidden] (the attention's projected output) with every position whose query ``q``
    [b, h, s, d] holds NaN/inf (in any head) made NaN: adds ``0 * (max - min)`` of that position's
    queries (in float32, so no finite row overflows), which is 0 (``out`` unchanged, bit for bit) for
    a finite position and NaN otherwise. Two reductions over ``q``, no host read, no gradient (the
    term is detached). Applied after ``o_proj``, whose output no later operation saves for the
    backward pass, so training keeps no extra activation."""
    q = q.detach()
    spread = q.amax(dim=(1, 3)).float() - q.amin(dim=(1, 3)).float()  # [b, s]
    return out + (spread * 0).to(out.dtype).unsqueeze(-1)


class Attention(nn.Module):
    """Causal multi-head attention with ``n_kv_heads`` shared key/value heads.

    With ``config.qk_norm`` (minimind-3: ``d65ef2c:model/model_minimind.py:117 "self.q_norm(xq), self.k_norm(xk)"``) every query and key head is
    RMS-normalized over its ``head_dim`` right after the projection and before RoPE, by
    ``q_norm`` / ``k_norm`` (one gain of ``head_dim`` values each, shared by all heads): the
    attention logits are then bounded by the gains, whatever the scale of the residual stream.

    Two computational paths give the same result (to float rounding), chosen as upstream chooses
    them:

    * **SDPA** (``F.scaled_dot_product_attention``, fused): when ``config.flash_attn`` is on, more
      than one new token arrives, there is no cache, and the mask is absent or all ones. This is
      upstream's rule at both commits (``c090b69:model/model_minimind.py:196 "past_key_value is None"``;
      ``d65ef2c:model/model_minimind.py:125 "not self.is_causal or past_key_value is None"``, with
      ``is_causal`` always true, ``d65ef2c:model/model_minimind.py:99``): SDPA's
      ``is_causal=True`` is only right when queries and keys have the same length, so several new
      tokens on top of a cache (chunked prefill) take the explicit path.
    * **explicit**: ``softmax(q k^T / sqrt(d) + causal + padding) v`` written out, used for every
      decode step, chunked prefill with a cache and padded batches. Padding is additive
      ``(1 - mask) * -1e9`` (so a query that sees only padding gets near-uniform weights, not NaN).
    """

    def __init__(self, config: MiniMindConfig) -> None:
        super().__init__()
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.n_rep = self.n_heads // self.n_kv_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, config.hidden_size, bias=False)
        self.qk_norm = config.qk_norm
        if self.qk_norm:
            norm = dict(eps=config.rms_norm_eps, cast_after_weight=config.rms_norm_cast_after_weight)
            self.q_norm = RMSNorm(self.head_dim, **norm)
            self.k_norm = RMSNorm(self.head_dim, **norm)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout
        self.flash = hasattr(F, "scaled_dot_product_attention") and config.flash_attn

    def uses_sdpa(self, seq_len: int, past_key_value: Optional[KVCache], attention_mask: Optional[torch.Tensor]) -> bool:
        """Upstream's rule for taking the fused path, the same at c090b69 and d65ef2c (see the class docstring)."""
        return bool(
            self.flash
            and seq_len > 1
            and past_key_value is None
            and (attention_mask is None or torch.all(attention_mask == 1))
        )

    def forward(
        self,
        x: torch.Tensor,
        position_embeddings: Tuple[torch.Tensor, torch.Tensor],
        past_key_value: Optional[KVCache] = None,
        use_cache: bool = False,
        attention_mask: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, Optional[KVCache]]:
        batch, seq_len, _ = x.shape
        q = self.q_proj(x).view(batch, seq_len, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(batch, seq_len, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).view(batch, seq_len, self.n_kv_heads, self.head_dim)
        if self.qk_norm:  # minimind-3: normalize each head's query and key, before RoPE
            q, k = self.q_norm(q), self.k_norm(k)

        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)

        kv = append_kv(past_key_value, k, v)  # cached positions first, then the new ones
        k, v = kv
        present = kv if use_cache else None

        q = q.transpose(1, 2)  # [b, heads, s, d]
        fused = self.uses_sdpa(seq_len, past_key_value, attention_mask)
        out = self._sdpa(q, k, v) if fused else self._explicit(q, k, v, seq_len, attention_mask)
        out = self.o_proj(out.transpose(1, 2).reshape(batch, seq_len, -1))
        if fused:
            out = _propagate_nan(out, q)
        return self.resid_dropout(out), present

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Fused causal attention. ``q`` [b, h, s, d]; ``k, v`` [b, s, n_kv, d]. PyTorch >= 2.5 maps query
        heads to their KV head itself (``enable_gqa``), so the repeated K/V are never materialized.

        A query row holding NaN makes every score of that row NaN, and the CPU's fused kernel treats
        such a row as fully masked and returns zeros for it: NaN weights in ``q_proj`` would give
        finite logits (the explicit path, and SDPA's math backend, give NaN). ``forward`` puts the NaN
        back after ``o_proj`` (``_propagate_nan``), so a broken model shows as NaN logits on every path."""
        dropout_p = self.dropout if self.training else 0.0
        if self.n_rep > 1 and _SDPA_HAS_GQA:
            out = F.scaled_dot_product_attention(
                q, k.transpose(1, 2), v.transpose(1, 2), dropout_p=dropout_p, is_causal=True, enable_gqa=True
            )
        else:
            out = F.scaled_dot_product_attention(q, repeat_kv(k, self.n_rep).transpose(1, 2),
                                                 repeat_kv(v, self.n_rep).transpose(1, 2), dropout_p=dropout_p,
                                                 is_causal=True)
        return out

    def _explicit(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_len: int, attention_mask: Optional[torch.Tensor]
    ) -> torch.Tensor:
        """``softmax(q k^T / sqrt(d) + causal + padding) v`` written out. ``q`` [b, h, s, d]; ``k, v``
        [b, t, n_kv, d] (cached + new); returns [b, h, s, d].

        The ``n_rep`` query heads of a group share one K/V head, so instead of repeating K and V
        (``repeat_kv``) we stack each group's queries as extra rows: one matmul per KV head gives
        the same scores without copying the cache ``n_rep`` times.
        """
        batch, n_heads, _, head_dim = q.shape
        t = k.shape[1]
        q_groups = q.reshape(batch, self.n_kv_heads, self.n_rep * seq_len, head_dim)
        k = k.transpose(1, 2)  # [b, n_kv, t, d]
        v = v.transpose(1, 2)
        scores = (q_groups @ k.transpose(-2, -1)) / math.sqrt(head_dim)
        scores = scores.view(batch, n_heads, seq_len, t)  # [b, h, s, t]
        if seq_len > 1:  # new token i may not see new tokens after i (a single token sees everything)
            causal = torch.triu(torch.full((seq_len, seq_len), float("-inf"), device=scores.device), diagonal=1)
            scores[:, :, :, -seq_len:] += causal
        if attention_mask is not None:
            scores = scores + (1.0 - attention_mask.unsqueeze(1).unsqueeze(2)) * -1e9
        weights = self.attn_dropout(F.softmax(scores.float(), dim=-1).type_as(q))
        out = weights.view(batch, self.n_kv_heads, self.n_rep * seq_len, t) @ v
        return out.view(batch, n_heads, seq_len, head_dim)


@torch.no_grad()
def attention_maps(model: nn.Module, input_ids: torch.Tensor) -> list:
    """The causal attention probabilities of every layer, for looking at (chapter 03's heatmaps).

    ``input_ids`` ``[b, s]`` -> a list with one ``[b, n_heads, s, s]`` tensor per layer (each row
    sums to 1; row ``i`` is what position ``i`` attends to). The model runs once; a pre-hook on
    each layer's ``self_attn`` takes its input and position tables, and the probabilities are
    recomputed from them in float32 (query heads matched to their key/value head), so the fused
    path, which never forms them, needs no change."""
    captured: list = []
    attns = [m for m in model.modules() if isinstance(m, Attention)]
    hooks = [a.register_forward_pre_hook(lambda mod, args: captured.append((mod, args[0], args[1]))) for a in attns]
    try:
        model(input_ids)
    finally:
        for h in hooks:
            h.remove()
    maps = []
    for attn, x, (cos, sin) in captured:
        batch, seq_len, _ = x.shape
        q = attn.q_proj(x).view(batch, seq_len, attn.n_heads, attn.head_dim)
        k = attn.k_proj(x).view(batch, seq_len, attn.n_kv_heads, attn.head_dim)
        if attn.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k = repeat_kv(k, attn.n_rep)
        scores = q.transpose(1, 2).float() @ k.permute(0, 2, 3, 1).float() / math.sqrt(attn.head_dim)
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=x.device).triu(1)
        maps.append(F.softmax(scores.masked_fill(causal, float("-inf")), dim=-1))
    return maps
