"""Benchmark 2: minimind_ref vs transformers' LlamaForCausalLM holding the same weights."""

from __future__ import annotations

from typing import Dict, List

import torch

import minimind_ref as mm

from .common import sync, timeit


def compare(device: torch.device, prefill_len: int = 512, decode_tokens: int = 64, batches: List[int] = (1, 8),
            prompt_lens: List[int] = (16, 512)) -> Dict[str, object]:
    from minimind_ref.hf import to_hf_llama

    torch.manual_seed(0)
    model = mm.MiniMindForCausalLM(mm.minimind2_small()).to(device).eval()
    hf = to_hf_llama(model)
    gen = torch.Generator().manual_seed(0)
    result: Dict[str, object] = {}

    ids = torch.randint(0, 6400, (1, prefill_len), generator=gen).to(device)
    with torch.inference_mode():
        ours_logits = model(ids).logits
        hf_logits = hf(ids).logits
    result["prefill_max_abs_diff"] = float((ours_logits - hf_logits).abs().max())

    def prefill(m) -> None:
        with torch.inference_mode():
            m(ids)
        sync(device)

    t_ours = timeit(lambda: prefill(model), repeats=5)
    t_hf = timeit(lambda: prefill(hf), repeats=5)
    result["prefill"] = {"tokens": prefill_len, "ours_ms": 1e3 * t_ours["median_s"], "hf_ms": 1e3 * t_hf["median_s"],
                         "speedup": t_hf["median_s"] / t_ours["median_s"]}

    rows = []
    for batch, prompt_len in [(b, p) for p in prompt_lens for b in batches]:
        prompt = torch.randint(0, 6400, (batch, prompt_len), generator=gen).to(device)
        outs = {}

        def ours() -> None:
            outs["ours"] = model.generate(prompt, max_new_tokens=decode_tokens)
            sync(device)

        def theirs() -> None:
            outs["hf"] = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=decode_tokens,
                                     min_new_tokens=decode_tokens, do_sample=False, pad_token_id=0)
            sync(device)

        a = timeit(ours, repeats=3)
        b = timeit(theirs, repeats=3)
        rows.append({
            "batch": batch,
            "prompt_tokens": prompt_len,
            "new_tokens": decode_tokens,
            "ours_tok_s": batch * decode_tokens / a["median_s"],
            "hf_tok_s": batch * decode_tokens / b["median_s"],
            "speedup": b["median_s"] / a["median_s"],
            "identical_tokens": bool(torch.equal(outs["ours"], outs["hf"])),
        })
    result["decode"] = rows
    return result
