"""Benchmarks 1 and 5: cached vs uncached greedy decoding, and decode efficiency vs memory bandwidth."""

from __future__ import annotations

from typing import Dict, List

import torch

import minimind_ref as mm

from .common import sync, timeit


def _model(device: torch.device) -> mm.MiniMindForCausalLM:
    torch.manual_seed(0)
    return mm.MiniMindForCausalLM(mm.minimind2_small()).to(device).eval()


def cached_vs_uncached(device: torch.device, lengths: List[int], prompt_len: int = 8) -> List[Dict[str, float]]:
    model = _model(device)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(0)).to(device)
    rows = []
    for n in lengths:
        outs = {}

        def run(use_cache: bool) -> None:
            outs[use_cache] = model.generate(ids, max_new_tokens=n, use_cache=use_cache)
            sync(device)

        cached = timeit(lambda: run(True), repeats=3)
        uncached = timeit(lambda: run(False), repeats=1, warmup=0)
        assert torch.equal(outs[True], outs[False]), "cached and uncached decoding must agree"
        rows.append({
            "new_tokens": n,
            "cached_tok_s": n / cached["median_s"],
            "uncached_tok_s": n / uncached["median_s"],
            "speedup": uncached["median_s"] / cached["median_s"],
        })
    return rows


def memcpy_bandwidth(device: torch.device, mbytes: int = 512) -> float:
    """Bytes moved per second by a large tensor copy (read + write counted)."""
    n = mbytes * 2**20 // 4
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)

    def copy() -> None:
        dst.copy_(src)
        sync(device)

    t = timeit(copy, repeats=5)
    return 2 * src.numel() * 4 / t["median_s"]


def decode_efficiency(device: torch.device, context: int = 512, steps: int = 64) -> Dict[str, float]:
    """Bytes a decode step must read (all weights once + the KV cache) divided by its time."""
    model = _model(device)
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (1, context), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.inference_mode():
        past = model(ids, use_cache=True).past_key_values
        token = ids[:, -1:]

        def decode_steps() -> None:
            p = past
            for _ in range(steps):
                out = model(token, past_key_values=p, use_cache=True, logits_to_keep=1)
                p = out.past_key_values
            sync(device)

        t = timeit(decode_steps, repeats=3)
    per_token_s = t["median_s"] / steps
    weight_bytes = mm.count_parameters(model) * 4
    kv_bytes = 2 * cfg.num_hidden_layers * (context + steps / 2) * cfg.num_key_value_heads * cfg.head_dim * 4
    bandwidth = memcpy_bandwidth(device)
    achieved = (weight_bytes + kv_bytes) / per_token_s
    return {
        "context": context,
        "tok_s": 1 / per_token_s,
        "bytes_per_token": weight_bytes + kv_bytes,
        "achieved_GBps": achieved / 1e9,
        "memcpy_GBps": bandwidth / 1e9,
        "fraction_of_memcpy": achieved / bandwidth,
    }
