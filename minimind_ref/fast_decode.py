"""A lean greedy decoder for one sequence: the same model, laid out for decoding.

``MiniMindForCausalLM.generate`` is written to be read: every module call, the public cache format
(``[batch, t, n_kv_heads, head_dim]``), padding masks, sampling filters. For batch-1 greedy decoding
on a CPU most of that is overhead around a few matrix-vector products, and ``F.linear``'s
matrix-vector kernel reads weights stored ``[out, in]`` more slowly than a product against the
transposed, ``[in, out]``, layout (measured in ``benchmarks/bench_fast.py``). ``FastDecoder`` keeps
the model's parameters and state dict untouched and builds, once, a second copy of the weights
for decoding:

* per layer, q/k/v concatenated into one ``[hidden, q + 2 kv]`` matrix and gate/up into one
  ``[hidden, 2 * intermediate]`` matrix (fused at load time, so upstream's state-dict layout is
  kept), o and down transposed, and the (tied) output head transposed;
* a static KV cache per layer, ``[n_kv_heads, capacity, head_dim]``, written in place;
* one decode step as a straight line of tensor operations (no module calls, no checks).

The arithmetic is the model's: RMSNorm in float32 (cast back before or after the gain as the
config says), QK-norm over ``head_dim`` before RoPE when ``config.qk_norm`` (minimind-3), half-split
RoPE, softmax in float32, SwiGLU; ``head_dim`` is the config's (a free field in minimind-3) and an
untied head is the model's own ``lm_head``.
Products are summed in another order than ``F.linear`` sums them, so logits differ by float
rounding (``tests/test_fast_decode.py`` bounds it) and greedy tokens agree unless two logits tie
to that precision (the benchmark checks the tokens on every run). Dense models of both generations
only; the prompt goes through the ordinary forward (prefill is not what this path speeds up).

Shapes: ``input_ids`` ``[1, s]`` -> ``[1, s + n]``.
"""

from __future__ import annotations

import math
from typing import List, Optional

import torch
import torch.nn.functional as F

from .generation import _nonfinite_logits
from .model import MiniMindForCausalLM


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, cast_after_weight: bool) -> torch.Tensor:
    """``RMSNorm.forward`` as a function over the last dimension (statistics in float32; the cast back
    after the gain when ``cast_after_weight``, minimind-3, else before it, MiniMind2)."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if cast_after_weight:  # minimind-3 (d65ef2c): the gain in fp32, then the cast
        return (weight * normed).type_as(x)
    return weight * normed.type_as(x)


class FastDecoder:
    """Greedy decoding of one sequence with fused, transposed weights and a static cache."""

    def __init__(self, model: MiniMindForCausalLM, compile: bool = False) -> None:
        """``compile=True``: the decode step goes through ``torch.compile`` (inductor) with static
        shapes: attention runs over the whole static cache with positions after the current one
        masked, so one compiled graph serves every step (compiled again for a new capacity)."""
        config = model.config
        if config.use_moe:
            raise ValueError("FastDecoder supports dense models only (use_moe=False); use model.generate for MoE models.")
        self.model = model
        self.config = config
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.n_rep = self.n_heads // self.n_kv_heads
        self.head_dim = config.head_dim  # hidden / heads, or minimind-3's free head_dim
        self.eps = config.rms_norm_eps
        self.cast_after_weight = config.rms_norm_cast_after_weight
        self.q_size = self.n_heads * self.head_dim
        self.kv_size = self.n_kv_heads * self.head_dim
        inner = model.model
        with torch.no_grad():
            self.embed = inner.embed_tokens.weight
            self.qkv_t: List[torch.Tensor] = []
            self.o_t: List[torch.Tensor] = []
            self.gate_up_t: List[torch.Tensor] = []
            self.down_t: List[torch.Tensor] = []
            self.norm_attn: List[torch.Tensor] = []
            self.norm_ffn: List[torch.Tensor] = []
            for layer in inner.layers:
                attn, mlp = layer.self_attn, layer.mlp
                self.qkv_t.append(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).t().contiguous())
                self.o_t.append(attn.o_proj.weight.t().contiguous())
                self.gate_up_t.append(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).t().contiguous())
                self.down_t.append(mlp.down_proj.weight.t().contiguous())
                self.norm_attn.append(layer.input_layernorm.weight)
                self.norm_ffn.append(layer.post_attention_layernorm.weight)
            self.norm_final = inner.norm.weight
            # minimind-3's QK-norm gains ([head_dim] each), None without QK-norm (MiniMind2)
            self.q_norm = [layer.self_attn.q_norm.weight if config.qk_norm else None for layer in inner.layers]
            self.k_norm = [layer.self_attn.k_norm.weight if config.qk_norm else None for layer in inner.layers]
            self.head_t = model.lm_head.weight.t().contiguous()
        self.cos, self.sin = inner.freqs_cos, inner.freqs_sin
        self.act = mlp.act_fn
        self.intermediate = self.down_t[0].shape[0]
        self.compiled = compile
        self._static_step = torch.compile(self._masked_step, fullgraph=True, dynamic=False) if compile else None

    def bytes_per_token(self, context: int) -> int:
        """Bytes one step reads: every decoding weight once (the embedding row aside) plus the cache."""
        weights = sum(t.numel() * t.element_size() for group in (self.qkv_t, self.o_t, self.gate_up_t, self.down_t)
                      for t in group) + self.head_t.numel() * self.head_t.element_size()
        cache = 2 * len(self.qkv_t) * context * self.kv_size * self.head_t.element_size()
        return weights + cache

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.eps, self.cast_after_weight)

    def _qk_norm(self, q: torch.Tensor, k: torch.Tensor, i: int):
        """minimind-3: each head of ``q`` ``[heads, head_dim]`` and ``k`` ``[kv_heads, head_dim]`` RMS-normalized."""
        if self.q_norm[i] is None:
            return q, k
        return self._rms(q, self.q_norm[i]), self._rms(k, self.k_norm[i])

    def _rope(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        """``x`` ``[heads, head_dim]`` at position ``pos`` (half-split rotation, as rope.py)."""
        half = self.head_dim // 2
        rotated = torch.cat((-x[:, half:], x[:, :half]), dim=-1)
        return x * self.cos[pos] + rotated * self.sin[pos]

    def _masked_step(self, token: torch.Tensor, pos: torch.Tensor, keys: List[torch.Tensor],
                     values: List[torch.Tensor]) -> torch.Tensor:
        """One decode step with static shapes (``pos`` a 0-d tensor): the new k/v are written at
        ``pos`` and attention covers the whole cache with later positions masked. Returns the next token."""
        capacity = keys[0].shape[1]
        visible = torch.arange(capacity, device=pos.device) <= pos  # [capacity]
        at = pos.view(1)  # index_select, not x[pos]: a tensor index must not become a Python int here
        cos, sin = self.cos.index_select(0, at), self.sin.index_select(0, at)
        half = self.head_dim // 2
        scale = 1.0 / math.sqrt(self.head_dim)
        h = self.embed.index_select(0, token.view(1))
        for i in range(len(self.qkv_t)):
            qkv = self._rms(h, self.norm_attn[i]) @ self.qkv_t[i]
            q = qkv[0, :self.q_size].view(self.n_heads, self.head_dim)
            k = qkv[0, self.q_size:self.q_size + self.kv_size].view(self.n_kv_heads, self.head_dim)
            q, k = self._qk_norm(q, k, i)
            q = q * cos + torch.cat((-q[:, half:], q[:, :half]), dim=-1) * sin
            k = k * cos + torch.cat((-k[:, half:], k[:, :half]), dim=-1) * sin
            keys[i].index_copy_(1, pos.view(1), k.unsqueeze(1))
            values[i].index_copy_(1, pos.view(1), qkv[0, self.q_size + self.kv_size:].view(self.n_kv_heads, 1, self.head_dim))
            scores = (q.view(self.n_kv_heads, self.n_rep, self.head_dim) @ keys[i].transpose(1, 2)) * scale
            scores = scores.masked_fill(~visible, float("-inf"))
            weights = F.softmax(scores.float(), dim=-1).type_as(q)
            h = h + (weights @ values[i]).view(1, self.q_size) @ self.o_t[i]
            gate_up = self._rms(h, self.norm_ffn[i]) @ self.gate_up_t[i]
            h = h + (self.act(gate_up[:, :self.intermediate]) * gate_up[:, self.intermediate:]) @ self.down_t[i]
        return (self._rms(h, self.norm_final) @ self.head_t)[0].argmax()

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, eos_token_id: Optional[int] = None) -> torch.Tensor:
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"FastDecoder decodes one sequence: input_ids must be [1, s], got {tuple(input_ids.shape)}.")
        prompt_len = input_ids.shape[1]
        steps = min(max_new_tokens, self.config.max_position_embeddings - prompt_len)
        if steps <= 0:
            return input_ids
        out = self.model(input_ids, use_cache=True, logits_to_keep=1)
        capacity = prompt_len + steps
        device, dtype = self.embed.device, self.embed.dtype
        # zeros, not empty: the masked (compiled) step multiplies the unwritten positions by weight 0
        keys = [torch.zeros(self.n_kv_heads, capacity, self.head_dim, device=device, dtype=dtype) for _ in self.qkv_t]
        values = [torch.zeros_like(k) for k in keys]  # zeros too: weight 0 times uninitialised memory (NaN) is NaN
        for (k, v), k_cache, v_cache in zip(out.past_key_values, keys, values):
            k_cache[:, :prompt_len] = k[0].transpose(0, 1)
            v_cache[:, :prompt_len] = v[0].transpose(0, 1)
        tokens = torch.empty(capacity, dtype=torch.long, device=device)
        tokens[:prompt_len] = input_ids[0]
        if not bool(torch.isfinite(out.logits[0, -1]).all()):  # NaN weights: argmax would give token 0 forever
            raise _nonfinite_logits(self.model, torch.ones(1, dtype=torch.bool), 0)
        token = out.logits[0, -1].argmax()
        scale = 1.0 / math.sqrt(self.head_dim)
        q_size, kv_size = self.q_size, self.kv_size
        n = 0
        for n in range(1, steps + 1):
            pos = prompt_len + n - 1
            tokens[pos] = token
            if n == steps or (eos_token_id is not None and int(token) == eos_token_id):
                break
            if self._static_step is not None:
                token = self._static_step(token, torch.tensor(pos, device=device), keys, values)
                continue
            h = self.embed[token].unsqueeze(0)  # [1, hidden]
            for i in range(len(self.qkv_t)):
                qkv = self._rms(h, self.norm_attn[i]) @ self.qkv_t[i]  # [1, q + 2 kv]
                q, k = self._qk_norm(qkv[0, :q_size].view(self.n_heads, self.head_dim),
                                     qkv[0, q_size:q_size + kv_size].view(self.n_kv_heads, self.head_dim), i)
                q, k = self._rope(q, pos), self._rope(k, pos)
                keys[i][:, pos] = k
                values[i][:, pos] = qkv[0, q_size + kv_size:].view(self.n_kv_heads, self.head_dim)
                scores = (q.view(self.n_kv_heads, self.n_rep, self.head_dim) @ keys[i][:, :pos + 1].transpose(1, 2)) * scale
                weights = F.softmax(scores.float(), dim=-1).type_as(q)
                attn = (weights @ values[i][:, :pos + 1]).view(1, q_size)
                h = h + attn @ self.o_t[i]
                gate_up = self._rms(h, self.norm_ffn[i]) @ self.gate_up_t[i]
                h = h + (self.act(gate_up[:, :self.intermediate]) * gate_up[:, self.intermediate:]) @ self.down_t[i]
            token = (self._rms(h, self.norm_final) @ self.head_t)[0].argmax()
        return tokens[: prompt_len + n].unsqueeze(0)


def fast_generate(model: MiniMindForCausalLM, input_ids: torch.Tensor, max_new_tokens: int,
                  eos_token_id: Optional[int] = None, compile: bool = False) -> torch.Tensor:
    """``FastDecoder(model, compile).generate(...)``: greedy, batch 1 (the weights are re-laid out
    each call; keep a ``FastDecoder`` to decode several prompts with one model)."""
    return FastDecoder(model, compile=compile).generate(input_ids, max_new_tokens, eos_token_id)
