"""Tried and not kept: ``torch.compile`` of the whole model, used by the eager ``generate``.

The KV cache grows by one position every step, so the compiled graph sees a new sequence length
every call (``dynamic=True`` asks inductor for shape-generic kernels). Measured: the time of the
first compiled ``generate`` (compilation included) and the interleaved speed of the compiled and
the eager model afterwards, batch 1, greedy, same tokens required.
"""

from __future__ import annotations

import time
from typing import Dict

import torch

from minimind_ref.generation import generate

from .common import interleaved, ratio, small_model, sync


def compiled_generate(device: torch.device, prompt_len: int = 16, new_tokens: int = 32, repeats: int = 5) -> Dict[str, object]:
    model = small_model(device)
    compiled = torch.compile(model, dynamic=True)
    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(3)).to(device)
    outs = {}
    start = time.perf_counter()
    outs["compiled"] = generate(compiled, prompt, max_new_tokens=new_tokens)
    sync(device)
    first_call_s = time.perf_counter() - start

    def eager() -> None:
        outs["eager"] = model.generate(prompt, max_new_tokens=new_tokens)
        sync(device)

    def comp() -> None:
        outs["compiled"] = generate(compiled, prompt, max_new_tokens=new_tokens)
        sync(device)

    t = interleaved({"eager": eager, "compiled": comp}, repeats=repeats)
    torch._dynamo.reset()
    return {
        "prompt_tokens": prompt_len,
        "new_tokens": new_tokens,
        "first_call_s": first_call_s,
        "times": t,
        "eager_tok_s": new_tokens / t["eager"]["median_s"],
        "compiled_tok_s": new_tokens / t["compiled"]["median_s"],
        "compiled_vs_eager": ratio(t["eager"], t["compiled"]),
        "identical_tokens": bool(torch.equal(outs["eager"], outs["compiled"])),
    }
