"""Benchmark 3: the fast decode path (``minimind_ref.fast_decode``) against the eager ``generate``
and transformers' ``generate()``: batch 1, greedy, interleaved, tokens identical to the eager
path's. Two variants: ``FastDecoder(model)`` (re-laid-out weights, a straight-line step) and
``FastDecoder(model, compile=True)`` (the same step with static shapes through ``torch.compile``;
its first call, compilation included, is timed on its own). Its bandwidth: the bytes a step reads
over the time per token, against the read bandwidth measured in the same run.
"""

from __future__ import annotations

import time
from typing import Dict

import torch

from minimind_ref.fast_decode import FastDecoder

from .bench_decode import bandwidths
from .common import interleaved, ratio, small_model, sync


def fast_decode(device: torch.device, prompt_len: int = 16, new_tokens: int = 128, repeats: int = 5) -> Dict[str, object]:
    from minimind_ref.hf import to_hf_llama

    model = small_model(device)
    hf = to_hf_llama(model)
    fast = FastDecoder(model)
    compiled = FastDecoder(model, compile=True)
    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(2)).to(device)
    outs = {}
    start = time.perf_counter()
    outs["compiled"] = compiled.generate(prompt, new_tokens)
    sync(device)
    first_call_s = time.perf_counter() - start

    def eager() -> None:
        outs["eager"] = model.generate(prompt, max_new_tokens=new_tokens)
        sync(device)

    def lean() -> None:
        outs["fast"] = fast.generate(prompt, new_tokens)
        sync(device)

    def comp() -> None:
        outs["compiled"] = compiled.generate(prompt, new_tokens)
        sync(device)

    def theirs() -> None:
        outs["hf"] = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        sync(device)

    t = interleaved({"eager": eager, "fast": lean, "compiled": comp, "hf": theirs}, repeats=repeats)
    torch._dynamo.reset()
    bytes_per_token = compiled.bytes_per_token(prompt_len + new_tokens // 2)
    read = bandwidths(device, repeats=repeats)["read_GBps"]
    best = "compiled"
    achieved = bytes_per_token / (t[best]["median_s"] / new_tokens) / 1e9
    return {
        "prompt_tokens": prompt_len,
        "new_tokens": new_tokens,
        "times": t,
        "first_call_s": first_call_s,
        "eager_tok_s": new_tokens / t["eager"]["median_s"],
        "lean_tok_s": new_tokens / t["fast"]["median_s"],
        "fast_tok_s": new_tokens / t[best]["median_s"],
        "hf_tok_s": new_tokens / t["hf"]["median_s"],
        "lean_vs_eager": ratio(t["eager"], t["fast"]),
        "vs_eager": ratio(t["eager"], t[best]),
        "vs_hf": ratio(t["hf"], t[best]),
        "identical_tokens": all(torch.equal(outs[k], outs["eager"]) for k in ("fast", "compiled", "hf")),
        "bytes_per_token": bytes_per_token,
        "achieved_GBps": achieved,
        "read_GBps": read,
        "read_fraction": achieved / read,
    }
