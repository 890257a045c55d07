"""Benchmark 2: minimind_ref vs transformers' LlamaForCausalLM holding the same weights.

Prefill latency, then greedy decoding at batch 1 and 8 after a short and a 512-token prompt; the
two systems run interleaved, every figure is a median of at least five runs with its range, and
the tokens must be identical. ``fast=True`` adds ``minimind_ref.fast_decode`` (the compiled decode
path, same tokens) to the batch-1 settings.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import torch


from .common import interleaved, ratio, small_model, sync


def compare(device: torch.device, prefill_len: int = 512, decode_tokens: int = 64, batches: Sequence[int] = (1, 8),
            prompt_lens: Sequence[int] = (16, 512), repeats: int = 5, prefill_repeats: int = 7) -> Dict[str, object]:
    from minimind_ref.hf import to_hf_llama

    model = small_model(device)
    hf = to_hf_llama(model)
    gen = torch.Generator().manual_seed(0)
    result: Dict[str, object] = {}

    ids = torch.randint(0, model.config.vocab_size, (1, prefill_len), generator=gen).to(device)
    with torch.inference_mode():
        ours_logits = model(ids).logits
        hf_logits = hf(ids).logits
    result["prefill_max_abs_diff"] = float((ours_logits - hf_logits).abs().max())

    def prefill(m) -> None:
        with torch.inference_mode():
            m(ids)
        sync(device)

    t = interleaved({"ours": lambda: prefill(model), "hf": lambda: prefill(hf)}, repeats=prefill_repeats)
    result["prefill"] = {"tokens": prefill_len, "ours": t["ours"], "hf": t["hf"],
                         "ours_ms": 1e3 * t["ours"]["median_s"], "hf_ms": 1e3 * t["hf"]["median_s"],
                         "speedup": ratio(t["hf"], t["ours"])}

    rows: List[Dict[str, object]] = []
    for batch, prompt_len in [(b, p) for p in prompt_lens for b in batches]:
        prompt = torch.randint(0, model.config.vocab_size, (batch, prompt_len), generator=gen).to(device)
        outs = {}

        def ours() -> None:
            outs["ours"] = model.generate(prompt, max_new_tokens=decode_tokens)
            sync(device)

        def theirs() -> None:
            outs["hf"] = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=decode_tokens,
                                     min_new_tokens=decode_tokens, do_sample=False, pad_token_id=0)
            sync(device)

        t = interleaved({"ours": ours, "hf": theirs}, repeats=repeats)
        rows.append({
            "batch": batch,
            "prompt_tokens": prompt_len,
            "new_tokens": decode_tokens,
            "ours": t["ours"],
            "hf": t["hf"],
            "ours_tok_s": batch * decode_tokens / t["ours"]["median_s"],
            "hf_tok_s": batch * decode_tokens / t["hf"]["median_s"],
            "speedup": ratio(t["hf"], t["ours"]),
            "identical_tokens": bool(torch.equal(outs["ours"], outs["hf"])),
        })
    result["decode"] = rows
    return result
