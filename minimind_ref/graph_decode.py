"""Decoding that is not launch-bound: a static KV cache, a decode step of fixed shapes, a CUDA graph.

Where a batch-1 decode step spends its time. The step reads every weight once (minimind-3: 64M
parameters, 128 MB in bf16) and does about two floating-point operations per weight, so if only
the work counted it would take as long as the memory needs to deliver those bytes: the
**bandwidth bound**, ``bytes_per_token / memory bandwidth`` (``GraphDecoder.bytes_per_token``).
But the step is also a few hundred separate operators (``count_ops`` counts them), and on a GPU
each one is a **kernel launch**: the host runs Python, the dispatcher and the driver for every
operator, microseconds each, while the kernel itself, on a model this small, finishes in about as
long. The GPU then waits for the host: the step is *launch-bound*, and its time is the number of
operators times the host's cost per operator, whatever the GPU.

What a CUDA graph removes. ``torch.cuda.CUDAGraph`` records the kernels one step launches (each
with its arguments: fixed tensor addresses, fixed shapes) and ``graph.replay()`` submits all of
them with one call. Python, the dispatcher and the per-kernel launch work of the step are gone;
what remains is the kernels' own time on the GPU. ``compile=True`` also runs the step through
``torch.compile`` (inductor) before capturing it, which fuses the many small elementwise
operators into fewer kernels, so fewer and larger kernels are replayed.

What a graph needs, and how this decoder provides it:

* **a static KV cache**: per layer one key and one value buffer ``[b, n_kv_heads, capacity,
  head_dim]``, allocated once; a step writes its key and value at position ``pos`` with
  ``index_copy_`` (``pos`` is a 0-d tensor on the device, so the same recorded kernels serve
  every position);
* **fixed shapes**: attention covers the whole capacity, ``scores [b, n_kv, n_rep, capacity]``,
  with the positions after ``pos`` masked with ``-inf`` (weight exactly 0) and the left padding of
  the prompt with ``-1e9``, as ``generate`` masks it;
* **state in buffers**: the step reads the current token ``[b]`` and position from buffers and
  writes the next token, the next position, the finished flags ``[b]`` and the sequence ``[b,
  capacity]`` back, so ``n`` replays decode ``n`` tokens without the host; the host looks at the
  finished flags every ``check_every`` steps (one synchronisation) to stop at the end-of-sequence
  token;
* **sampling on the device**: temperature, top-k, top-p and the repetition penalty (a ``[b,
  vocab]`` mask of the tokens seen) as in ``minimind_ref.generation``, then a draw by the
  exponential race, ``argmax(p / E)`` with ``E ~ Exp(1)`` drawn independently per token (token
  ``i`` wins with probability ``p_i``; no host-side ``multinomial``). Sampled sequences are draws
  from the same distributions as ``generate``'s, not the same draws.

MoE layers keep static shapes too: the router picks ``k`` experts per row (``topk``, a fixed
``k``); with fewer routing slots than experts (``b * k < n_experts``, e.g. batch 1) each row's
``k`` experts' weights are gathered, ``[b, k, hidden, 2 * inter]``, and applied with one batched
product; with more, every expert runs on every row and the routing weights (0 for an expert not
chosen) combine them. Either way there is no host synchronisation and no shape that depends on the
routing (``MOEFeedForward``'s dispatch needs both).

On the CPU (or with ``cuda_graph=False``) there is no graph: the same step runs eagerly, attention
sliced to the filled positions, with the weights laid out as ``fast_decode.FastDecoder`` lays them
out (q/k/v and gate/up fused, every matrix transposed to ``[in, out]``), which is what makes a
matrix-vector product fast on a CPU. Greedy tokens equal ``generate``'s in float32 (the products
are summed in another order, so logits differ by rounding and tokens agree unless two logits tie
to that precision; ``tests/test_graph_decode.py``).

The request goes through ``generation.check_decoding_request`` (``generate``'s checks and its
position-limit warning), the prompt through the model in eval mode (``generation.eval_mode``),
and a step whose logits are NaN/inf sets a flag on the device that is read once at the end (the
first step's are checked at once), so, as with ``generate``, no token chosen from them is returned:
a ``FloatingPointError``. The decoding copy of the weights is brought up to date when the model's
change (``fast_decode.WeightsWatch``; ``refresh``).

Shapes: ``input_ids [b, s]`` (``attention_mask [b, s]``, left padding) -> ``[b, s + n]``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from .fast_decode import WeightsWatch, rms_norm
from .ffn import ACTIVATIONS
from .generation import (check_decoding_request, check_first_logits, eval_mode, raise_if_nonfinite, top_k_filter,
                         top_p_filter, warn_position_limit)
from .model import MiniMindForCausalLM


@dataclass(frozen=True)
class Sampling:
    """How a step picks its token (hashable: one captured graph per setting)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    eos_token_id: Optional[int] = None
    pad_token_id: int = 0


class _Layer:
    """One block's weights, laid out for decoding (transposed to ``[in, out]``, q/k/v and gate/up fused)."""

    def __init__(self, block: torch.nn.Module, config: Any) -> None:
        attn, mlp = block.self_attn, block.mlp
        self.qkv_t = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).t().contiguous()
        self.o_t = attn.o_proj.weight.t().contiguous()
        self.norm_attn = block.input_layernorm.weight
        self.norm_ffn = block.post_attention_layernorm.weight
        self.q_norm = attn.q_norm.weight if config.qk_norm else None
        self.k_norm = attn.k_norm.weight if config.qk_norm else None
        self.moe = bool(config.use_moe)
        if not self.moe:
            self.gate_up_t, self.down_t = _fused_ffn(mlp)
            return
        router = mlp.gate.weight  # [E, hidden]: nn.Linear (minimind-3) or MoEGate.weight (MiniMind2)
        self.router_t = router.t().contiguous()
        fused = [_fused_ffn(expert) for expert in mlp.experts]
        self.experts_gate_up = torch.stack([gu for gu, _ in fused])  # [E, hidden, 2 * inter]
        self.experts_down = torch.stack([d for _, d in fused])  # [E, inter, hidden]
        self.shared = [_fused_ffn(expert) for expert in getattr(mlp, "shared_experts", [])]

    def tensors(self) -> List[torch.Tensor]:
        """Every matrix a step reads in full (for the bytes-per-token bound)."""
        out = [self.qkv_t, self.o_t]
        if self.moe:
            out += [self.router_t, self.experts_gate_up, self.experts_down] + [t for pair in self.shared for t in pair]
        else:
            out += [self.gate_up_t, self.down_t]
        return out


def _fused_ffn(ffn: torch.nn.Module) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(gate_up_t [hidden, 2 * inter], down_t [inter, hidden])`` of a ``FeedForward``."""
    return (torch.cat([ffn.gate_proj.weight, ffn.up_proj.weight]).t().contiguous(),
            ffn.down_proj.weight.t().contiguous())


class _State:
    """The buffers one decode run lives in (fixed addresses: what a captured graph reads and writes)."""

    def __init__(self, decoder: "GraphDecoder", batch: int, capacity: int) -> None:
        d = decoder
        kw = dict(device=d.device, dtype=d.dtype)
        # zeros, not empty: a masked position gets weight 0, and 0 * NaN of uninitialised memory would be NaN
        self.keys = [torch.zeros(batch, d.n_kv_heads, capacity, d.head_dim, **kw) for _ in d.layers]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.bias = torch.zeros(batch, capacity, device=d.device)  # -1e9 at prompt padding, as generate's mask
        self.padded = False
        self.sequence = torch.zeros(batch, capacity, dtype=torch.long, device=d.device)
        self.token = torch.zeros(batch, dtype=torch.long, device=d.device)
        self.pos = torch.zeros((), dtype=torch.long, device=d.device)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=d.device)
        self.nonfinite = torch.zeros(batch, dtype=torch.bool, device=d.device)  # rows with NaN/inf logits at a step
        self.seen = torch.zeros(batch, d.config.vocab_size, dtype=torch.bool, device=d.device)
        self.positions = torch.arange(capacity, device=d.device)
        self.batch, self.capacity = batch, capacity


class GraphDecoder:
    """Greedy and sampled decoding of a batch with a static KV cache, replayed as a CUDA graph on a GPU.

    ``GraphDecoder(model)`` keeps the model untouched and builds a decoding copy of its weights once.
    ``cuda_graph``: ``None`` (default) captures graphs when the model is on a CUDA device and runs
    the step eagerly elsewhere; ``True`` demands a graph (a ``ValueError`` off CUDA); ``False``
    never captures. ``compile=True`` passes the static step through ``torch.compile`` (on a GPU: fused
    kernels, then the graph; without a graph the compiled step is called once per token; the first
    call compiles, tens of seconds). The capacity of a static cache is rounded up to a multiple of
    ``capacity_multiple`` so that one graph (or compiled step) serves many lengths; the buffers and
    graphs are kept per (batch, capacity, sampling settings) until ``clear()``. Without a graph and
    without ``compile`` the step runs eagerly, attention sliced to the filled positions.
    """

    def __init__(self, model: MiniMindForCausalLM, cuda_graph: Optional[bool] = None, compile: bool = False,
                 capacity_multiple: int = 256, check_every: int = 16) -> None:
        if not isinstance(model, MiniMindForCausalLM):
            raise TypeError(f"GraphDecoder decodes a minimind_ref MiniMindForCausalLM, got {type(model).__name__}.")
        for name, value in (("capacity_multiple", capacity_multiple), ("check_every", check_every)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
        self.model = model
        self.cuda_graph_setting, self.compiled = cuda_graph, bool(compile)
        self.capacity_multiple, self.check_every = capacity_multiple, check_every
        self._graphs: Dict[Tuple[int, int, Sampling], Tuple[Any, _State]] = {}
        self._lay_out()
        self._watch = WeightsWatch(model)
        self.last_path = ""  # what the last generate() ran: "cuda graph", "compiled cuda graph", "compiled", "eager"

    def _lay_out(self) -> None:
        """Read the config and the device, lay the weights out for decoding, drop captured graphs."""
        model, config = self.model, self.model.config
        self.config = config
        self.device = model.device
        cuda_graph = self.cuda_graph_setting
        if cuda_graph is None:
            cuda_graph = self.device.type == "cuda"
        if cuda_graph and self.device.type != "cuda":
            raise ValueError(f"cuda_graph=True needs the model on a CUDA device, it is on {self.device}; move it with "
                             "model.cuda(), or leave cuda_graph=None to decode eagerly here.")
        self.cuda_graph = bool(cuda_graph)
        self.n_heads, self.n_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.n_rep, self.head_dim = self.n_heads // self.n_kv_heads, config.head_dim
        self.q_size, self.kv_size = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.eps, self.cast_after_weight = config.rms_norm_eps, config.rms_norm_cast_after_weight
        self.act = ACTIVATIONS[config.hidden_act]
        self.top_k_experts = config.num_experts_per_tok
        self.n_experts = config.n_routed_experts
        # MiniMind2 renormalises the top-k weights only for k > 1; minimind-3 whenever norm_topk_prob
        self.renormalise = config.norm_topk_prob and (config.moe_variant == "minimind-3" or self.top_k_experts > 1)
        inner = model.model
        with torch.no_grad():
            self.embed = inner.embed_tokens.weight
            self.dtype = self.embed.dtype
            self.layers = [_Layer(block, config) for block in inner.layers]
            self.norm_final = inner.norm.weight
            self.head_t = model.lm_head.weight.t().contiguous()
        self.cos, self.sin = inner.freqs_cos, inner.freqs_sin
        self._step_fn: Callable[..., None] = (torch.compile(self._static_step, fullgraph=True, dynamic=False)
                                              if self.compiled else self._static_step)
        self._graphs.clear()

    def refresh(self, force: bool = False) -> Optional[str]:
        """Bring the decoding copy up to date with the model's weights, if they changed since it was
        made (``fast_decode.WeightsWatch``; ``force``: copy them whatever it says). Called by every
        ``generate``. New values are copied into the same tensors, so captured graphs stay valid
        (``"values"``); replaced tensors (a new device or dtype, ``load_state_dict(assign=True)``)
        mean a new layout and the graphs are dropped (``"layout"``). None: nothing changed."""
        change = "values" if force else self._watch.changed()
        if change is None:
            return None
        with torch.no_grad():
            mine = [t for layer in self.layers for t in layer.tensors()] + [self.head_t]
            fresh_layers = [_Layer(block, self.model.config) for block in self.model.model.layers]
            fresh = [t for layer in fresh_layers for t in layer.tensors()] + [self.model.lm_head.weight.t().contiguous()]
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

    # --- bookkeeping ---------------------------------------------------------------------------

    def bytes_per_token(self, context: int, batch: int = 1) -> int:
        """Bytes one decode step reads at least: every matrix of the step once (an MoE model's
        experts: the ``k`` chosen per row, at most all of them), the tied head once, and the cache
        of ``batch`` rows of ``context`` positions. Divided by the memory bandwidth it bounds the
        time of a step from below (the embedding row and the norms' gains are left out)."""
        total = self.head_t.numel() * self.head_t.element_size()
        for layer in self.layers:
            for t in layer.tensors():
                size = t.numel() * t.element_size()
                if layer.moe and t is not layer.router_t and t.dim() == 3:  # stacked experts: those used
                    size = size * min(self.n_experts, batch * self.top_k_experts) // self.n_experts
                total += size
        cache = 2 * len(self.layers) * batch * context * self.kv_size * self.embed.element_size()
        return total + cache

    def clear(self) -> None:
        """Drop the captured graphs and their buffers (their memory goes back to the allocator)."""
        self._graphs.clear()

    # --- one step ------------------------------------------------------------------------------

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.eps, self.cast_after_weight)

    def _ffn(self, x: torch.Tensor, gate_up_t: torch.Tensor, down_t: torch.Tensor) -> torch.Tensor:
        gate_up = x @ gate_up_t
        inter = down_t.shape[-2]
        return (self.act(gate_up[..., :inter]) * gate_up[..., inter:]) @ down_t

    def _moe(self, x: torch.Tensor, layer: _Layer) -> torch.Tensor:
        """``x [b, hidden]`` through the routed experts (and the shared ones), static shapes."""
        scores = F.softmax(x @ layer.router_t, dim=-1)  # [b, E]
        weight, chosen = torch.topk(scores, k=self.top_k_experts, dim=-1, sorted=False)  # [b, k]
        if self.renormalise:
            weight = weight / (weight.sum(dim=-1, keepdim=True) + 1e-20)
        if x.shape[0] * self.top_k_experts < self.n_experts:  # few slots: gather each row's k experts
            inner = self._ffn(x[:, None, None, :], layer.experts_gate_up[chosen], layer.experts_down[chosen])
            y = (inner.squeeze(2) * weight.unsqueeze(-1)).sum(dim=1)  # [b, k, hidden] -> [b, hidden]
        else:  # every expert on every row, combined by the routing weights (0 where not chosen)
            every = self._ffn(x.unsqueeze(0), layer.experts_gate_up, layer.experts_down)  # [E, b, hidden]
            dense_weight = torch.zeros_like(scores).scatter(1, chosen, weight)  # [b, E]
            y = (every * dense_weight.t().unsqueeze(-1)).sum(dim=0)
        for gate_up_t, down_t in layer.shared:
            y = y + self._ffn(x, gate_up_t, down_t)
        return y

    def _forward(self, st: _State, pos: Any, length: Optional[int]) -> torch.Tensor:
        """Logits ``[b, vocab]`` of the tokens in ``st.token`` at position ``pos``, their keys and
        values written into the cache. ``length=None``: static shapes (``pos`` a 0-d tensor,
        attention over the whole capacity, later positions masked); else eager (``pos`` an int,
        attention over the first ``length = pos + 1`` positions)."""
        b, d = st.batch, self.head_dim
        half = d // 2
        if length is None:
            at = pos.view(1)
            cos, sin = self.cos.index_select(0, at), self.sin.index_select(0, at)  # [1, d]
            bias = st.bias.masked_fill(st.positions > pos, float("-inf"))  # [b, capacity]
        else:
            cos, sin = self.cos[pos], self.sin[pos]
            bias = st.bias[:, :length]
        bias = bias.view(b, 1, 1, -1)
        h = self.embed.index_select(0, st.token)  # [b, hidden]
        for i, layer in enumerate(self.layers):
            qkv = self._rms(h, layer.norm_attn) @ layer.qkv_t  # [b, q + 2 kv]
            q = qkv[:, :self.q_size].view(b, self.n_heads, d)
            k = qkv[:, self.q_size:self.q_size + self.kv_size].view(b, self.n_kv_heads, d)
            v = qkv[:, self.q_size + self.kv_size:].view(b, self.n_kv_heads, d)
            if layer.q_norm is not None:  # minimind-3: each head's query and key normalised before RoPE
                q, k = self._rms(q, layer.q_norm), self._rms(k, layer.k_norm)
            q = (q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin).to(qkv.dtype)
            k = (k * cos + torch.cat((-k[..., half:], k[..., :half]), dim=-1) * sin).to(qkv.dtype)
            keys, values = st.keys[i], st.values[i]
            if length is None:
                keys.index_copy_(2, at, k.unsqueeze(2))
                values.index_copy_(2, at, v.unsqueeze(2))
            else:
                keys[:, :, pos] = k
                values[:, :, pos] = v
                keys, values = keys[:, :, :length], values[:, :, :length]
            scores = (q.view(b, self.n_kv_heads, self.n_rep, d) @ keys.transpose(-1, -2)) / math.sqrt(d)
            scores = scores.float()
            if length is None or st.padded:
                scores = scores + bias
            weights = F.softmax(scores, dim=-1).type_as(q)  # [b, n_kv, n_rep, t]
            h = h + (weights @ values).view(b, self.q_size) @ layer.o_t
            x = self._rms(h, layer.norm_ffn)
            h = h + (self._moe(x, layer) if layer.moe else self._ffn(x, layer.gate_up_t, layer.down_t))
        return self._rms(h, self.norm_final) @ self.head_t

    def _pick(self, logits: torch.Tensor, st: _State, s: Sampling, generator: Optional[torch.Generator]) -> torch.Tensor:
        """The next token of every row ``[b]``: ``generation.sample_next_token``'s processors, then
        argmax (greedy) or the exponential race (sampling), then the end-of-sequence bookkeeping. Rows
        whose logits are NaN/inf (and not finished) set ``st.nonfinite``, read once at the end."""
        bad = ~torch.isfinite(logits).all(dim=-1)  # generation.flag_nonfinite, in place (a graph writes its buffers)
        st.nonfinite |= bad & ~st.finished if s.eos_token_id is not None else bad
        if s.repetition_penalty != 1.0:
            logits = logits.float()
            logits = torch.where(st.seen, torch.where(logits > 0, logits / s.repetition_penalty,
                                                      logits * s.repetition_penalty), logits)
        if s.do_sample:
            logits = logits.float() / s.temperature
            logits = top_p_filter(top_k_filter(logits, s.top_k), s.top_p)
            probs = F.softmax(logits, dim=-1)
            token = (probs / torch.empty_like(probs).exponential_(generator=generator)).argmax(dim=-1)
        else:
            token = logits.argmax(dim=-1)
        if s.eos_token_id is not None:
            token = torch.where(st.finished, torch.full_like(token, s.pad_token_id), token)
            st.finished |= token == s.eos_token_id
        if s.repetition_penalty != 1.0:
            st.seen.scatter_(1, token.unsqueeze(1), True)
        return token

    def _static_step(self, st: _State, s: Sampling) -> None:
        """One decode step on the buffers alone (what a graph records): read ``st.token`` at
        ``st.pos``, write the next token at ``st.pos + 1``, advance ``st.pos``."""
        token = self._pick(self._forward(st, st.pos, None), st, s, None)
        st.sequence.index_copy_(1, (st.pos + 1).view(1), token.unsqueeze(1))
        st.token.copy_(token)
        st.pos.add_(1)

    def _eager_step(self, st: _State, s: Sampling, pos: int, generator: Optional[torch.Generator]) -> None:
        token = self._pick(self._forward(st, pos, pos + 1), st, s, generator)
        st.sequence[:, pos + 1] = token
        st.token = token

    def _capture(self, st: _State, s: Sampling) -> Any:
        """Warm the step up on a side stream (cuBLAS handles, compilation), then record it once."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(3):
                self._step_fn(st, s)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._step_fn(st, s)
        return graph

    # --- the loop ------------------------------------------------------------------------------

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int = 32, attention_mask: Optional[torch.Tensor] = None,
                 do_sample: bool = False, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 repetition_penalty: float = 1.0, eos_token_id: Optional[int] = None,
                 pad_token_id: Optional[int] = None, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``generate``'s arguments and result: up to ``max_new_tokens`` tokens after ``input_ids``
        ``[b, s]`` (``attention_mask`` 1 for tokens, 0 for left padding); returns ``[b, s + n]``.
        ``generator`` seeds the sampling draws; a CUDA graph draws from the device's default
        generator (seed it with ``torch.manual_seed``), so with a ``generator`` on a GPU the step
        runs eagerly (``last_path`` says which path ran)."""
        steps = check_decoding_request(self.model, input_ids, max_new_tokens, eos_token_id, pad_token_id, attention_mask,
                                       temperature, top_k, top_p, repetition_penalty)
        self.refresh()
        limit = self.config.max_position_embeddings
        if steps == 0:
            warn_position_limit("GraphDecoder.generate", steps, max_new_tokens, limit)
            return input_ids
        pad = pad_token_id if pad_token_id is not None else (eos_token_id if eos_token_id is not None else 0)
        s = Sampling(bool(do_sample), float(temperature), int(top_k), float(top_p), float(repetition_penalty),
                     eos_token_id, pad)
        static = (self.cuda_graph or self.compiled) and generator is None and steps > 1
        # the static buffers outlive the call (and a graph records them): ordinary tensors, under no_grad;
        # the eager path's live for one call, under inference_mode (less bookkeeping per operator)
        with torch.no_grad() if static else torch.inference_mode():
            out = self._generate(input_ids, attention_mask, steps, s, generator, static)
        if out.shape[1] - input_ids.shape[1] == steps and not (
                eos_token_id is not None and bool((out[:, input_ids.shape[1]:] == eos_token_id).any(dim=1).all())):
            warn_position_limit("GraphDecoder.generate", steps, max_new_tokens, limit)  # the limit, not the end token
        return out

    def _generate(self, input_ids: torch.Tensor, mask: Optional[torch.Tensor], steps: int, s: Sampling,
                  generator: Optional[torch.Generator], static: bool) -> torch.Tensor:
        batch, prompt_len = input_ids.shape
        with eval_mode(self.model):  # the prefill, dropout off
            out = self.model(input_ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
        check_first_logits(self.model, out.logits[:, -1])  # NaN weights: stop before the first token
        graph = None
        if static:  # buffers (and a graph) per batch, rounded-up capacity and settings, kept for the next call
            limit = self.config.max_position_embeddings
            capacity = min(-(-(prompt_len + steps) // self.capacity_multiple) * self.capacity_multiple, limit)
            key = (batch, capacity, s)
            if key not in self._graphs:
                st = _State(self, batch, capacity)
                self._graphs[key] = (self._capture(st, s) if self.cuda_graph else None, st)
            graph, st = self._graphs[key]
        else:
            st = _State(self, batch, prompt_len + steps)
        self._load_prompt(st, input_ids, mask, out.past_key_values)
        st.token.copy_(self._pick(out.logits[:, -1], st, s, generator))  # the first new token, from the prefill
        st.sequence[:, prompt_len] = st.token
        st.pos.fill_(prompt_len)
        check = self.check_every if static else 1
        for n in range(1, steps):  # step n feeds the token at position prompt_len + n - 1
            if s.eos_token_id is not None and (n - 1) % check == 0 and bool(st.finished.all()):
                break
            if graph is not None:
                graph.replay()  # the whole step: one call
            elif static:
                self._step_fn(st, s)  # the compiled static step, launched from Python (no CUDA graph)
            else:
                self._eager_step(st, s, prompt_len + n - 1, generator)
        self.last_path = {(True, True): "compiled cuda graph", (True, False): "cuda graph",
                          (False, True): "compiled", (False, False): "eager"}[(graph is not None, static)]
        raise_if_nonfinite(self.model, st.nonfinite)  # no token chosen from NaN/inf logits is returned
        return self._result(st, prompt_len, steps, s)

    def _load_prompt(self, st: _State, input_ids: torch.Tensor, mask: Optional[torch.Tensor], cache: list) -> None:
        """The prefill's cache, the prompt and its padding into the buffers; everything after them reset."""
        prompt_len = input_ids.shape[1]
        for (k, v), k_buf, v_buf in zip(cache, st.keys, st.values):  # [b, t, n_kv, d] -> [b, n_kv, t, d]
            k_buf[:, :, :prompt_len] = k.transpose(1, 2)
            v_buf[:, :, :prompt_len] = v.transpose(1, 2)
            k_buf[:, :, prompt_len:] = 0
            v_buf[:, :, prompt_len:] = 0
        st.sequence.zero_()
        st.sequence[:, :prompt_len] = input_ids
        st.bias.zero_()
        st.padded = mask is not None
        if mask is not None:
            st.bias[:, :prompt_len] = (1.0 - mask.float()) * -1e9
        st.finished.zero_()
        st.nonfinite.zero_()
        st.seen.zero_()
        real = input_ids if mask is None else torch.where(mask.bool(), input_ids, input_ids[:, -1:])
        st.seen.scatter_(1, real, True)  # the last prompt token is real (left padding), so it stands in for padding

    @staticmethod
    def _result(st: _State, prompt_len: int, steps: int, s: Sampling) -> torch.Tensor:
        """The prompt and the generated tokens; with an end-of-sequence token, cut where every row has
        emitted it, as ``generate`` stops (a graph may have run a few steps past that point)."""
        new = st.sequence[:, prompt_len:prompt_len + steps]
        n = steps
        if s.eos_token_id is not None:
            hit = new == s.eos_token_id
            if bool(hit.any(dim=1).all()):
                n = int(hit.int().argmax(dim=1).max()) + 1
        return st.sequence[:, :prompt_len + n].clone()


def graph_generate(model: MiniMindForCausalLM, input_ids: torch.Tensor, max_new_tokens: int = 32,
                   **kwargs: Any) -> torch.Tensor:
    """``GraphDecoder(model).generate(input_ids, max_new_tokens, **kwargs)`` (the weights are laid out
    again, and on a GPU a graph captured, at every call: keep a ``GraphDecoder`` to decode often)."""
    return GraphDecoder(model).generate(input_ids, max_new_tokens, **kwargs)


#: Where the record of the device check's GPU run ships (``make gpu-check``; benchmarks/gpu_check.py).
GPU_RECORD = Path(__file__).parent / "reference_outputs" / "gpu_record.json"


def gpu_record() -> Optional[Dict[str, Any]]:
    """The shipped record of a GPU run of the device check, or None while none has been committed
    (a dry run's record without CUDA does not count: it holds no GPU figure)."""
    if not GPU_RECORD.is_file():
        return None
    record = json.loads(GPU_RECORD.read_text(encoding="utf-8"))
    return None if record.get("dry_run", True) else record


def count_ops(fn: Callable[[], Any]) -> Dict[str, int]:
    """The operators ``fn()`` runs, by name, counted below autograd (``TorchDispatchMode``): composite
    operators are decomposed into those that do the work (``linear`` into a matrix product, a ``.to``
    of the same dtype into nothing, whether ``fn`` runs under ``no_grad`` or ``inference_mode``), and
    views and other metadata-only operators are left out. On a GPU, roughly the kernels it launches."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counts: Dict[str, int] = {}
    composite = torch._C.DispatchKey.CompositeImplicitAutograd

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.has_kernel_for_dispatch_key(composite):
                with self:
                    out = func.decompose(*args, **kwargs)
                if out is not NotImplemented:
                    return out
            name = func.overloadpacket.__name__
            if not func.is_view and name not in _NO_KERNEL:
                counts[name] = counts.get(name, 0) + 1
            return func(*args, **kwargs)

    with _Count():
        fn()
    return counts


#: Operators that launch no kernel: they only read or set metadata (or allocate).
_NO_KERNEL = {"detach", "_unsafe_view", "_reshape_alias", "size", "stride", "sym_size", "sym_stride", "is_same_size",
              "lift_fresh", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "set_"}
