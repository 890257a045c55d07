"""Thread settings: batch-1 greedy decoding (eager and the compiled fast path) and a 512-token
prefill with 1 thread and with every core, interleaved. Decoding one sequence is a chain of small
matrix-vector products: whether a second thread helps is a property of the machine, measured here.
"""

from __future__ import annotations

import os
from typing import Dict

import torch


from .common import interleaved, ratio, small_model, sync


def thread_settings(device: torch.device, prompt_len: int = 16, new_tokens: int = 64, repeats: int = 5) -> Dict[str, object]:
    model = small_model(device)
    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(4)).to(device)
    long_prompt = torch.randint(0, model.config.vocab_size, (1, 512), generator=torch.Generator().manual_seed(5)).to(device)
    previous = torch.get_num_threads()
    many = os.cpu_count() or 1

    def with_threads(n: int, fn):
        def run() -> None:
            torch.set_num_threads(n)
            try:
                fn()
                sync(device)
            finally:
                torch.set_num_threads(previous)
        return run

    def decode() -> None:
        model.generate(prompt, max_new_tokens=new_tokens)

    def prefill() -> None:
        with torch.inference_mode():
            model(long_prompt)

    t = interleaved({"decode_1": with_threads(1, decode), f"decode_{many}": with_threads(many, decode),
                     "prefill_1": with_threads(1, prefill), f"prefill_{many}": with_threads(many, prefill)}, repeats=repeats)
    return {
        "threads": [1, many],
        "times": t,
        "decode_tok_s": {1: new_tokens / t["decode_1"]["median_s"], many: new_tokens / t[f"decode_{many}"]["median_s"]},
        "decode_gain": ratio(t["decode_1"], t[f"decode_{many}"]),
        "prefill_gain": ratio(t["prefill_1"], t[f"prefill_{many}"]),
        "new_tokens": new_tokens,
    }
