"""Benchmark 9: MiniMind2 beside minimind-3 (upstream's c090b69 and d65ef2c generations).

1. ``kv_cache_table``: bytes the KV cache holds per token, per layer and per model, for every
   published config (computed from the config: 2 tensors x KV heads x head_dim x bytes per value),
   checked against the cache a real prefill returns for the models timed below. minimind-3's 8:4
   GQA keeps 4 KV heads of 96 where MiniMind2 (768 wide) keeps 2: twice the cache per layer, and
   with half the layers the same per token.
2. ``decode_speed``: greedy decoding with the KV cache (``generate``, as benchmark 1 times it), the
   models interleaved, at comparable sizes (MiniMind2-Small and a minimind-3 of the same hidden
   size and depth) and at the published sizes (MiniMind2, 104M, 16 layers; minimind-3, 64M, 8
   layers).
3. ``cache_cost``: what the larger cache costs a decode step. MiniMind2-Small as it is (8:2) and
   the same model with 4 KV heads (8:4, the only change), one decode step at several context
   lengths, on a preallocated cache as ``generate`` uses (each repetition restarts at the same
   context, a view of the same buffers: nothing is copied).
"""

from __future__ import annotations

from typing import Dict, List

import torch

import minimind_ref as mm
from minimind_ref.cache import GrowingKV, preallocate

from .common import interleaved, ratio, sync

#: The published configs, in upstream's order (README at d65ef2c: minimind-3 first, MiniMind2 "historical").
PUBLISHED = ["minimind-3", "minimind-3-moe", "MiniMind2-Small", "MiniMind2", "MiniMind2-MoE"]


def kv_bytes_per_token_per_layer(config: mm.MiniMindConfig, bytes_per_value: int) -> int:
    """K and V of one token in one layer: ``2 * num_key_value_heads * head_dim * bytes_per_value``."""
    return 2 * config.num_key_value_heads * config.head_dim * bytes_per_value


def measured_cache_bytes_per_token(model: mm.MiniMindForCausalLM, device: torch.device, tokens: int = 16) -> float:
    """Bytes of the cache a real prefill of ``tokens`` tokens returns, per token (all layers)."""
    ids = torch.zeros(1, tokens, dtype=torch.long, device=device)
    with torch.inference_mode():
        past = model(ids, use_cache=True).past_key_values
    return sum(t.numel() * t.element_size() for pair in past for t in pair) / tokens


def kv_cache_table() -> List[Dict[str, object]]:
    rows = []
    for name in PUBLISHED:
        c = mm.preset(name)
        rows.append({
            "model": name, "generation": c.generation, "layers": c.num_hidden_layers,
            "heads": c.num_attention_heads, "kv_heads": c.num_key_value_heads, "head_dim": c.head_dim,
            "parameters": mm.count_parameters(c),
            "per_layer_fp32": kv_bytes_per_token_per_layer(c, 4),
            "per_layer_bf16": kv_bytes_per_token_per_layer(c, 2),
            "per_token_fp32": c.num_hidden_layers * kv_bytes_per_token_per_layer(c, 4),
            "per_token_bf16": c.num_hidden_layers * kv_bytes_per_token_per_layer(c, 2),
            "max_context": c.max_position_embeddings,
        })
    return rows


def _seeded(config: mm.MiniMindConfig, device: torch.device) -> mm.MiniMindForCausalLM:
    torch.manual_seed(0)
    return mm.MiniMindForCausalLM(config).to(device).eval()


def decode_models() -> Dict[str, mm.MiniMindConfig]:
    """Name -> config of the models ``decode_speed`` times (random weights, seed 0)."""
    return {
        "MiniMind2-Small": mm.preset("MiniMind2-Small"),
        "minimind-3 at 512 x 8": mm.preset("minimind-3", hidden_size=512),
        "MiniMind2": mm.preset("MiniMind2"),
        "minimind-3": mm.preset("minimind-3"),
    }


def decode_speed(device: torch.device, new_tokens: int = 128, prompt_len: int = 8, repeats: int = 5,
                 published: bool = True) -> Dict[str, object]:
    configs = decode_models()
    if not published:
        configs = {k: v for k, v in configs.items() if k in ("MiniMind2-Small", "minimind-3 at 512 x 8")}
    models = {name: _seeded(c, device) for name, c in configs.items()}
    ids = torch.randint(0, 6400, (1, prompt_len), generator=torch.Generator().manual_seed(0)).to(device)
    outs = {}

    def run(name: str):
        def fn() -> None:
            outs[name] = models[name].generate(ids, max_new_tokens=new_tokens)
            sync(device)
        return fn

    t = interleaved({name: run(name) for name in models}, repeats=repeats)
    rows = []
    for name, model in models.items():
        c = model.config
        rows.append({
            "model": name, "generation": c.generation, "hidden_size": c.hidden_size, "layers": c.num_hidden_layers,
            "kv_heads": c.num_key_value_heads, "head_dim": c.head_dim, "intermediate_size": c.intermediate_size,
            "parameters": mm.count_parameters(model), "time": t[name], "tok_s": new_tokens / t[name]["median_s"],
            "kv_bytes_per_token_fp32": c.num_hidden_layers * kv_bytes_per_token_per_layer(c, 4),
            "measured_kv_bytes_per_token": measured_cache_bytes_per_token(model, device),
            "generated_tokens": int(outs[name].shape[1] - prompt_len),
        })
    pairs = {"same size (512 x 8)": ("MiniMind2-Small", "minimind-3 at 512 x 8")}
    if published:
        pairs["published (104M vs 64M)"] = ("MiniMind2", "minimind-3")
    return {
        "prompt_tokens": prompt_len, "new_tokens": new_tokens, "rows": rows,
        # speed of minimind-3 relative to MiniMind2 (> 1: minimind-3 decodes faster)
        "speed_ratios": {label: ratio(t[old], t[new]) for label, (old, new) in pairs.items()},
    }


def cache_cost(device: torch.device, contexts: List[int], steps: int = 32, repeats: int = 5) -> Dict[str, object]:
    configs = {"8:2 (MiniMind2-Small)": mm.preset("MiniMind2-Small"),
               "8:4 (same, 4 KV heads)": mm.preset("MiniMind2-Small", num_key_value_heads=4)}
    models = {name: _seeded(c, device) for name, c in configs.items()}
    token = torch.tensor([[5]], device=device)
    rows = []
    for context in contexts:
        ids = torch.randint(0, 6400, (1, context), generator=torch.Generator().manual_seed(context)).to(device)
        buffers = {}
        for name, model in models.items():
            with torch.inference_mode():
                past = model(ids, use_cache=True).past_key_values
            buffers[name] = [(p.k_buffer, p.v_buffer) for p in preallocate(past, context + steps)]

        def run(name: str):
            def fn() -> None:
                past = [GrowingKV(k, v, context) for k, v in buffers[name]]  # back to `context` positions
                with torch.inference_mode():
                    for _ in range(steps):
                        past = models[name](token, past_key_values=past, use_cache=True, logits_to_keep=1).past_key_values
                sync(device)
            return fn

        t = interleaved({name: run(name) for name in models}, repeats=repeats)
        (small, large) = list(models)
        rows.append({
            "context": context,
            "ms_per_step": {name: 1e3 * t[name]["median_s"] / steps for name in models},
            "times": t,
            "cache_mb": {name: context * models[name].config.num_hidden_layers
                         * kv_bytes_per_token_per_layer(models[name].config, 4) / 1e6 for name in models},
            "slowdown": ratio(t[large], t[small]),  # time with 4 KV heads / time with 2
        })
    return {"models": list(models), "steps": steps, "rows": rows,
            "parameters": {name: mm.count_parameters(m) for name, m in models.items()}}


def generations(device: torch.device, quick: bool = False) -> Dict[str, object]:
    return {
        "kv_cache": kv_cache_table(),
        "decode": decode_speed(device, new_tokens=32 if quick else 128, published=not quick),
        "cache_cost": cache_cost(device, [64, 512] if quick else [64, 512, 2048]),
    }
