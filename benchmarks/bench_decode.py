"""Benchmarks 1 and 5: cached vs uncached greedy decoding, and what bounds a decode step.

1. ``cached_vs_uncached``: greedy decoding of n new tokens with and without the KV cache,
   interleaved, for several n; the growth of the total time with n (a log-log slope: about 1 with
   the cache, towards 2 without it, where step i recomputes all i positions).
2. ``decode_efficiency``: the bytes a batch-1 decode step must read (every weight once plus the KV
   cache) over its time, against this machine's measured memory bandwidth (a copy, a read-only
   sum) and against the kernel that does most of the step, a matrix-vector product over the
   model's own weight matrices (each read once from memory, as in decoding); plus the share of
   a step's CPU time each operator takes (torch.profiler), the profile behind the numbers.
"""

from __future__ import annotations

import math
from typing import Dict, List

import torch
import torch.nn.functional as F

import minimind_ref as mm

from .common import interleaved, ratio, small_model, sync


def loglog_slope(xs: List[float], ys: List[float]) -> float:
    """Least-squares slope of log(y) against log(x): 1 for linear growth, 2 for quadratic."""
    lx = [math.log(x) for x in xs]
    ly = [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def cached_vs_uncached(device: torch.device, lengths: List[int], prompt_len: int = 8, repeats: int = 5) -> Dict[str, object]:
    model = small_model(device)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(0)).to(device)
    rows = []
    for n in lengths:
        outs = {}

        def run(use_cache: bool) -> None:
            outs[use_cache] = model.generate(ids, max_new_tokens=n, use_cache=use_cache)
            sync(device)

        t = interleaved({"cached": lambda: run(True), "uncached": lambda: run(False)}, repeats=repeats)
        assert torch.equal(outs[True], outs[False]), "cached and uncached decoding must agree"
        rows.append({
            "new_tokens": n,
            "cached": t["cached"],
            "uncached": t["uncached"],
            "cached_tok_s": n / t["cached"]["median_s"],
            "uncached_tok_s": n / t["uncached"]["median_s"],
            "speedup": ratio(t["uncached"], t["cached"]),
        })
    ns = [r["new_tokens"] for r in rows]
    return {
        "prompt_tokens": prompt_len,
        "rows": rows,
        "growth_cached": loglog_slope(ns, [r["cached"]["median_s"] for r in rows]),
        "growth_uncached": loglog_slope(ns, [r["uncached"]["median_s"] for r in rows]),
    }


def bandwidths(device: torch.device, mbytes: int = 512, repeats: int = 5) -> Dict[str, object]:
    """Memory bandwidth two ways: a tensor copy (bytes read + bytes written) and a read-only sum."""
    n = mbytes * 2**20 // 4
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)

    def copy() -> None:
        dst.copy_(src)
        sync(device)

    def read() -> None:
        src.sum()
        sync(device)

    t = interleaved({"copy": copy, "read": read}, repeats=repeats)
    return {"copy_GBps": 2 * n * 4 / t["copy"]["median_s"] / 1e9, "read_GBps": n * 4 / t["read"]["median_s"] / 1e9,
            "copy": t["copy"], "read": t["read"], "mbytes": mbytes}


def matvec_bandwidth(model: mm.MiniMindForCausalLM, device: torch.device, repeats: int = 5) -> Dict[str, object]:
    """One token through every weight matrix of the model once (the matrix-vector products of a
    batch-1 decode step, without anything else), bytes of the weights / time, two ways:
    ``F.linear(x, W)`` with ``W`` stored ``[out, in]`` (the model's layout) and ``x @ W_t`` with the
    transpose stored contiguous, ``[in, out]`` (``minimind_ref.fast_decode``'s layout)."""
    weights = [m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.Linear)]
    transposed = [w.t().contiguous() for w in weights]
    inputs = {w.shape[1]: torch.randn(1, w.shape[1], device=device) for w in weights}

    def linear() -> None:
        with torch.inference_mode():
            for w in weights:
                F.linear(inputs[w.shape[1]], w)
        sync(device)

    def transposed_product() -> None:
        with torch.inference_mode():
            for w in transposed:
                inputs[w.shape[0]] @ w
        sync(device)

    t = interleaved({"linear": linear, "transposed": transposed_product}, repeats=repeats)
    total = sum(w.numel() * w.element_size() for w in weights)
    return {"bytes": total, "GBps": total / t["linear"]["median_s"] / 1e9,
            "transposed_GBps": total / t["transposed"]["median_s"] / 1e9, "times": t}


def step_profile(model: mm.MiniMindForCausalLM, token: torch.Tensor, past, steps: int = 16) -> List[Dict[str, object]]:
    """Share of the self CPU time of ``steps`` decode steps per operator (the five largest)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        p = past
        for _ in range(steps):
            p = model(token, past_key_values=p, use_cache=True, logits_to_keep=1).past_key_values
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:5]
    return [{"op": e.key, "share": e.self_cpu_time_total / total, "calls_per_step": e.count / steps} for e in top]


def decode_efficiency(device: torch.device, context: int = 512, steps: int = 64, repeats: int = 5) -> Dict[str, object]:
    """Bytes a decode step must read (all weights once + the KV cache) divided by its time."""
    model = small_model(device)
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (1, context), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.inference_mode():
        past = model(ids, use_cache=True).past_key_values
    token = ids[:, -1:]

    def decode_steps() -> None:
        with torch.inference_mode():
            p = past
            for _ in range(steps):
                p = model(token, past_key_values=p, use_cache=True, logits_to_keep=1).past_key_values
        sync(device)

    t = interleaved({"decode": decode_steps}, repeats=repeats)["decode"]
    per_token_s = t["median_s"] / steps
    weight_bytes = mm.count_parameters(model) * 4
    kv_bytes = 2 * cfg.num_hidden_layers * (context + steps / 2) * cfg.num_key_value_heads * cfg.head_dim * 4
    achieved = (weight_bytes + kv_bytes) / per_token_s / 1e9
    bw = bandwidths(device, repeats=repeats)
    matvec = matvec_bandwidth(model, device, repeats=repeats)
    return {
        "context": context,
        "steps": steps,
        "time": t,
        "tok_s": 1 / per_token_s,
        "bytes_per_token": weight_bytes + kv_bytes,
        "achieved_GBps": achieved,
        "memcpy_GBps": bw["copy_GBps"],
        "read_GBps": bw["read_GBps"],
        "matvec_GBps": matvec["GBps"],
        "matvec_t_GBps": matvec["transposed_GBps"],
        "fraction_of_memcpy": achieved / bw["copy_GBps"],
        "fraction_of_read": achieved / bw["read_GBps"],
        "bandwidth_runs": {"copy": bw["copy"], "read": bw["read"], **{f"matvec_{k}": v for k, v in matvec["times"].items()}},
        "profile": step_profile(model, token, past) if device.type == "cpu" else [],
    }
