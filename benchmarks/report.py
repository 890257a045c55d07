"""Turn ``results/results.json`` into ``results/performance_table.md`` (the book's Performance page
includes that file). Never edit the Markdown by hand: ``python -m benchmarks.report`` regenerates it,
and a test fails when it is out of date."""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _f(x: float, digits: int = 1) -> str:
    return f"{x:,.{digits}f}"


def render(res: dict) -> str:
    env = res["environment"]
    lines = [
        f"Measured on **{env['device_name']}** (`{env['device']}`, {env['torch_threads']} torch threads), "
        f"torch {env['torch']}, transformers {env['transformers']}, Python {env['python']}, {res['date']}. "
        "All ratios come from one run on this machine; re-run `make bench` to measure yours.",
        "",
    ]
    if "decode" in res:
        lines += ["### 1. Cached vs uncached greedy decoding (MiniMind2-Small, random weights, batch 1)", "",
                  "| new tokens | cached tok/s | uncached tok/s | speed-up |", "| ---: | ---: | ---: | ---: |"]
        for r in res["decode"]:
            lines.append(f"| {r['new_tokens']} | {_f(r['cached_tok_s'])} | {_f(r['uncached_tok_s'])} | {_f(r['speedup'])}x |")
        lines.append("")
    if "hf" in res:
        h = res["hf"]
        p = h["prefill"]
        lines += ["### 2. minimind_ref vs transformers `LlamaForCausalLM` (same weights, fp32)", "",
                  f"Prefill of {p['tokens']} tokens: minimind_ref {_f(p['ours_ms'])} ms, transformers {_f(p['hf_ms'])} ms "
                  f"(minimind_ref {_f(p['speedup'], 2)}x the speed); max abs logit difference {h['prefill_max_abs_diff']:.1e}.", "",
                  "| batch | prompt tokens | new tokens | minimind_ref tok/s | transformers tok/s | minimind_ref speed | identical tokens |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | :---: |"]
        for r in h["decode"]:
            lines.append(f"| {r['batch']} | {r['prompt_tokens']} | {r['new_tokens']} | {_f(r['ours_tok_s'])} | {_f(r['hf_tok_s'])} | "
                         f"{_f(r['speedup'], 2)}x | {'yes' if r['identical_tokens'] else 'NO'} |")
        lines.append("")
    if "moe" in res:
        m = res["moe"]
        lines += [f"### 3. MoE layer (MiniMind2-MoE sizes, {m['tokens']} tokens, inference mode)", "",
                  "| path | time (ms) |", "| --- | ---: |",
                  f"| inference dispatch (`moe_infer`) | {_f(m['dispatch_ms'], 2)} |",
                  f"| training path (repeat tokens, loop over experts) | {_f(m['training_path_ms'], 2)} |",
                  f"| dense FFN of equal active width | {_f(m['dense_equal_active_ms'], 2)} |", "",
                  f"The dispatch runs at {_f(m['dispatch_vs_training'], 2)}x the speed of the training path and takes "
                  f"{_f(m['dispatch_vs_dense'], 2)}x the time of the dense FFN. Host synchronizations per MoE layer call: "
                  f"**{m['host_syncs_per_layer']}**.", ""]
    if "norm" in res:
        lines += ["### 4. Normalization layers (input 16 x 512 x 512, fp32)", "",
                  "| module | forward (ms) | forward+backward (ms) | forward speed vs ours | fwd+bwd speed vs ours |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for r in res["norm"]:
            lines.append(f"| `{r['module']}` | {_f(r['forward_ms'], 2)} | {_f(r['fwd_bwd_ms'], 2)} | "
                         f"{_f(r['forward_speed_vs_ours'], 2)}x | {_f(r['fwd_bwd_speed_vs_ours'], 2)}x |")
        lines.append("")
    if "efficiency" in res:
        e = res["efficiency"]
        lines += ["### 5. Decode efficiency (MiniMind2-Small, batch 1)", "",
                  f"At a context of {e['context']} tokens a decode step reads {e['bytes_per_token'] / 1e6:.1f} MB "
                  f"(all weights once plus the KV cache) and runs at {_f(e['tok_s'])} tok/s, i.e. "
                  f"{_f(e['achieved_GBps'], 2)} GB/s, which is {100 * e['fraction_of_memcpy']:.0f}% of this machine's "
                  f"measured memory-copy bandwidth ({_f(e['memcpy_GBps'], 2)} GB/s).", ""]
    if "notebooks" in res:
        lines += ["### 6. Notebook suite under nbval (kernel start included)", "",
                  "| notebook | seconds | passed |", "| --- | ---: | :---: |"]
        for r in res["notebooks"]:
            lines.append(f"| {r['notebook']} | {_f(r['seconds'])} | {'yes' if r['passed'] else 'NO'} |")
        total = sum(r["seconds"] for r in res["notebooks"])
        lines += [f"| **total** | **{_f(total)}** | |", ""]
    return "\n".join(lines)


def write(res: dict) -> Path:
    out = RESULTS / "performance_table.md"
    out.write_text(render(res))
    return out


def main() -> int:
    res = json.loads((RESULTS / "results.json").read_text())
    print(f"wrote {write(res)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
