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

The request goes through ``generation.check_decoding_request`` (the checks ``generate`` makes:
``max_new_tokens``, token ids, the position limit and its warning), the prompt through the model
in eval mode (``generation.eval_mode``: a model left in train mode does not decode with dropout),
and NaN/inf logits raise ``FloatingPointError`` as ``generate``'s do (at once on the first step,
from a flag read at the end on later steps), so no token chosen from them is returned. The copy of
the weights is brought up to date when the model's change (``WeightsWatch``; ``refresh``).

Shapes: ``input_ids`` ``[1, s]`` -> ``[1, s + n]``.
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from .generation import (check_decoding_request, check_first_logits, eval_mode, flag_nonfinite, raise_if_nonfinite,
                         warn_position_limit)
from .model import MiniMindForCausalLM


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, cast_after_weight: bool) -> torch.Tensor:
    """``RMSNorm.forward`` as a function over the last dimension (statistics in float32; the cast back
    after the gain when ``cast_after_weight``, minimind-3, else before it, MiniMind2)."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if cast_after_weight:  # minimind-3 (d65ef2c): the gain in fp32, then the cast
        return (weight * normed).type_as(x)
    return weight * normed.type_as(x)


class WeightsWatch:
    """Whether a model's weights changed since a decoder copied them (``FastDecoder``, ``GraphDecoder``).

    A decoder lays the weights out once (fused, transposed copies), so a change to the model's
    weights afterwards (an optimizer step, ``load_state_dict``, an edit under ``torch.no_grad()``,
    ``model.to(...)``) would leave it decoding the old weights. ``changed()`` compares, for every
    parameter and buffer, what it recorded at the last ``reset()``:

    * the layout: which tensor object, its storage address (``data_ptr``), shape, dtype, device; a
      difference means tensors were replaced (``"layout"``: lay out again);
    * the version counter autograd keeps (``tensor._version``), which every in-place operation
      bumps, and a sample of ``SAMPLE`` evenly spaced values of each tensor, compared bit for bit,
      which also catches edits through ``.data`` (they bypass the version counter); a difference
      means new values in the same tensors (``"values"``: copy them).

    Cheap: no pass over the weights, one small gather per tensor. An edit through ``.data`` of
    values between the sampled positions alone goes unnoticed; call the decoder's ``refresh(force=True)``
    after such an edit."""

    SAMPLE = 64

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.reset()

    def _tensors(self) -> List[torch.Tensor]:
        return [t for _, t in self.model.named_parameters()] + [t for _, t in self.model.named_buffers()]

    @staticmethod
    def _version(t: torch.Tensor) -> Optional[int]:
        try:
            return t._version
        except RuntimeError:  # an inference tensor keeps no version counter: the sample decides
            return None

    def _state(self) -> Tuple[tuple, tuple, torch.Tensor]:
        tensors = self._tensors()
        layout = tuple((id(t), t.data_ptr(), tuple(t.shape), t.dtype, t.device) for t in tensors)
        versions = tuple(self._version(t) for t in tensors)
        with torch.no_grad():
            parts = [t.detach().reshape(-1)[:: max(1, t.numel() // self.SAMPLE)].float() for t in tensors if t.numel()]
            sample = torch.cat([p.to(parts[0].device) for p in parts]).view(torch.int32) if parts else torch.zeros(0)
        return layout, versions, sample

    def reset(self) -> None:
        """Record the model's weights as they are now."""
        self._layout, self._versions, self._sample = self._state()

    def changed(self) -> Optional[str]:
        """``None`` (unchanged since ``reset``), ``"values"`` or ``"layout"``."""
        layout, versions, sample = self._state()
        if layout != self._layout:
            return "layout"
        if versions != self._versions or not torch.equal(sample, self._sample):
            return "values"
        return None


class FastDecoder:
    """Greedy decoding of one sequence with fused, transposed weights and a static cache."""

    def __init__(self, model: MiniMindForCausalLM, compile: bool = False) -> None:
        """``compile=True``: the decode step goes through ``torch.compile`` (inductor) with static
        shapes: attention runs over the whole static cache with positions after the current one
        masked, so one compiled graph serves every step (compiled again for a new capacity)."""
        if not isinstance(model, MiniMindForCausalLM):
            raise TypeError(f"FastDecoder decodes a minimind_ref MiniMindForCausalLM, got {type(model).__name__}.")
        if model.config.use_moe:
            raise ValueError("FastDecoder supports dense models only (use_moe=False); use model.generate for MoE models.")
        self.model = model
        self.compiled = bool(compile)
        self._lay_out()
        self._watch = WeightsWatch(model)

    def _lay_out(self) -> None:
        """Read the config and lay the weights out for decoding (the fused, transposed copies)."""
        model = self.model
        config = model.config
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
            self.qkv_t, self.o_t, self.gate_up_t, self.down_t, self.head_t = self._copies()
            self.norm_attn = [layer.input_layernorm.weight for layer in inner.layers]
            self.norm_ffn = [layer.post_attention_layernorm.weight for layer in inner.layers]
            self.norm_final = inner.norm.weight
            # minimind-3's QK-norm gains ([head_dim] each), None without QK-norm (MiniMind2)
            self.q_norm = [layer.self_attn.q_norm.weight if config.qk_norm else None for layer in inner.layers]
            self.k_norm = [layer.self_attn.k_norm.weight if config.qk_norm else None for layer in inner.layers]
        self.cos, self.sin = inner.freqs_cos, inner.freqs_sin
        self.act = inner.layers[0].mlp.act_fn
        self.intermediate = self.down_t[0].shape[0]
        self._static_step = (torch.compile(self._masked_step, fullgraph=True, dynamic=False) if self.compiled
                             else None)

    def _copies(self) -> Tuple[List[torch.Tensor], List[torch.Tensor], List[torch.Tensor], List[torch.Tensor],
                               torch.Tensor]:
        """The model's weights as this decoder reads them: per layer q/k/v fused and transposed, o
        transposed, gate/up fused and transposed, down transposed; the output head transposed."""
        qkv_t, o_t, gate_up_t, down_t = [], [], [], []
        for layer in self.model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv_t.append(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).t().contiguous())
            o_t.append(attn.o_proj.weight.t().contiguous())
            gate_up_t.append(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).t().contiguous())
            down_t.append(mlp.down_proj.weight.t().contiguous())
        return qkv_t, o_t, gate_up_t, down_t, self.model.lm_head.weight.t().contiguous()

    def refresh(self, force: bool = False) -> Optional[str]:
        """Bring the decoding copy up to date with the model's weights, if they changed since it was
        made (``WeightsWatch``; ``force``: copy them whatever it says). Called by every ``generate``.
        Returns what was done: None (nothing changed), ``"values"`` (new values copied into the
        same tensors) or ``"layout"`` (tensors replaced: laid out again)."""
        change = "values" if force else self._watch.changed()
        if change is None:
            return None
        with torch.no_grad():
            mine = [*self.qkv_t, *self.o_t, *self.gate_up_t, *self.down_t, self.head_t]
            qkv_t, o_t, gate_up_t, down_t, head_t = self._copies()
            fresh = [*qkv_t, *o_t, *gate_up_t, *down_t, head_t]
            same_shapes = len(mine) == len(fresh) and all(
                a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and not a.is_inference()
                for a, b in zip(mine, fresh))
            if change == "values" and same_shapes:
                for a, b in zip(mine, fresh):
                    a.copy_(b)
            else:
                change = "layout"
                self._lay_out()
        self._watch.reset()
        return change

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
        ``pos`` and attention covers the whole cache with later positions masked. Returns the logits ``[vocab]``."""
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
        return (self._rms(h, self.norm_final) @ self.head_t)[0]

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, eos_token_id: Optional[int] = None) -> torch.Tensor:
        """Greedy: up to ``max_new_tokens`` tokens after ``input_ids`` ``[1, s]`` (``generate``'s checks,
        its position limit and warning, its ``eos_token_id``: one id, the sequence ends after it)."""
        steps = check_decoding_request(self.model, input_ids, max_new_tokens, eos_token_id)
        if input_ids.shape[0] != 1:
            raise ValueError(f"FastDecoder decodes one sequence: input_ids must be [1, s], got {tuple(input_ids.shape)}.")
        self.refresh()
        limit = self.config.max_position_embeddings
        if steps == 0:
            warn_position_limit("FastDecoder.generate", steps, max_new_tokens, limit)
            return input_ids
        with torch.inference_mode():
            out, ended = self._generate(input_ids, steps, eos_token_id)
        if not ended:
            warn_position_limit("FastDecoder.generate", steps, max_new_tokens, limit)
        return out

    def _generate(self, input_ids: torch.Tensor, steps: int, eos_token_id: Optional[int]
                  ) -> Tuple[torch.Tensor, bool]:
        """The tokens ``[1, s + n]`` and whether the end token stopped them."""
        prompt_len = input_ids.shape[1]
        with eval_mode(self.model):  # the prompt through the ordinary forward, dropout off
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
        check_first_logits(self.model, out.logits[:, -1])  # NaN weights: argmax would give token 0 forever
        token = out.logits[0, -1].argmax()
        nonfinite = torch.zeros(1, dtype=torch.bool, device=device)  # read once at the end (no host read per token)
        scale = 1.0 / math.sqrt(self.head_dim)
        q_size, kv_size = self.q_size, self.kv_size
        n, ended = 0, False
        for n in range(1, steps + 1):
            pos = prompt_len + n - 1
            tokens[pos] = token
            ended = eos_token_id is not None and int(token) == eos_token_id
            if n == steps or ended:
                break
            if self._static_step is not None:
                logits = self._static_step(token, torch.tensor(pos, device=device), keys, values)
            else:
                h = self.embed[token].unsqueeze(0)  # [1, hidden]
                for i in range(len(self.qkv_t)):
                    qkv = self._rms(h, self.norm_attn[i]) @ self.qkv_t[i]  # [1, q + 2 kv]
                    q, k = self._qk_norm(qkv[0, :q_size].view(self.n_heads, self.head_dim),
                                         qkv[0, q_size:q_size + kv_size].view(self.n_kv_heads, self.head_dim), i)
                    q, k = self._rope(q, pos), self._rope(k, pos)
                    keys[i][:, pos] = k
                    values[i][:, pos] = qkv[0, q_size + kv_size:].view(self.n_kv_heads, self.head_dim)
                    scores = (q.view(self.n_kv_heads, self.n_rep, self.head_dim)
                              @ keys[i][:, :pos + 1].transpose(1, 2)) * scale
                    weights = F.softmax(scores.float(), dim=-1).type_as(q)
                    attn = (weights @ values[i][:, :pos + 1]).view(1, q_size)
                    h = h + attn @ self.o_t[i]
                    gate_up = self._rms(h, self.norm_ffn[i]) @ self.gate_up_t[i]
                    h = h + (self.act(gate_up[:, :self.intermediate]) * gate_up[:, self.intermediate:]) @ self.down_t[i]
                logits = (self._rms(h, self.norm_final) @ self.head_t)[0]
            nonfinite = flag_nonfinite(nonfinite, logits.unsqueeze(0))
            token = logits.argmax()
        raise_if_nonfinite(self.model, nonfinite)  # no token chosen from NaN logits is returned
        return tokens[: prompt_len + n].unsqueeze(0), ended


def fast_generate(model: MiniMindForCausalLM, input_ids: torch.Tensor, max_new_tokens: int,
                  eos_token_id: Optional[int] = None, compile: bool = False) -> torch.Tensor:
    """``FastDecoder(model, compile).generate(...)``: greedy, batch 1 (the weights are re-laid out
    each call; keep a ``FastDecoder`` to decode several prompts with one model)."""
    return FastDecoder(model, compile=compile).generate(input_ids, max_new_tokens, eos_token_id)
