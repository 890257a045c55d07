"""Turn ``results/results.json`` into ``results/performance_table.md`` and the figures in
``results/figures/`` (the book's Performance page includes both). Never edit them by hand:
``python -m benchmarks.report`` regenerates them, and a test fails when the table is out of date.

Every timing is printed as its median with the range of its repetitions; a ratio as the median of
the per-repetition ratios with their range. A timing whose spread stayed above 10% after a
re-measurement carries "(unstable)".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List, Mapping, Optional

from .common import SPREAD_LIMIT

RESULTS = Path(__file__).resolve().parent / "results"
FIGURES = RESULTS / "figures"

#: The targets of issue 21, as (key, description, threshold, direction); evaluated by ``targets``.
TARGETS = [
    ("cache_512", "cached / uncached decode time at 512 new tokens", 10.0, ">="),
    ("hf_decode", "minimind_ref / transformers decode speed, every batch and prompt setting", 1.2, ">="),
    ("hf_prefill", "minimind_ref / transformers prefill speed (512 tokens)", 1.0, ">="),
    ("moe_vs_dense", "MoE dispatch time / dense FFN of equal active width", 1.1, "<="),
    ("moe_vs_training", "MoE dispatch speed / training path speed", 1.0, ">="),
    ("fast_vs_hf", "fast decode path / transformers generate() speed, batch 1", 2.0, ">="),
    ("fast_bandwidth", "fast decode path's bytes read / measured read bandwidth", 0.5, ">="),
]


def _f(x: float, digits: int = 1) -> str:
    return f"{x:,.{digits}f}"


def timing(stats: Mapping[str, object], scale: float = 1e3, digits: int = 1) -> str:
    """``median (min–max)`` of a timing, in ms by default, with its flag."""
    text = f"{_f(stats['median_s'] * scale, digits)} ({_f(stats['min_s'] * scale, digits)}–{_f(stats['max_s'] * scale, digits)})"
    return text + (" (unstable)" if unstable(stats) else "")


def unstable(stats: Mapping[str, object]) -> bool:
    """Flagged by the harness, or (for timings taken elsewhere) a spread above ``SPREAD_LIMIT``."""
    if "unstable" in stats:
        return bool(stats["unstable"])
    return (stats["max_s"] - stats["min_s"]) / stats["median_s"] > SPREAD_LIMIT


def times(r: Mapping[str, object], digits: int = 2) -> str:
    """A ratio: ``median x (min–max)``."""
    return f"{_f(r['median'], digits)}x ({_f(r['min'], digits)}–{_f(r['max'], digits)})"


def targets(res: Mapping[str, object]) -> List[Dict[str, object]]:
    """Every target with its measured value (the worst case where a target covers several
    settings), whether it is met, and the range of the measurement."""
    out: List[Dict[str, object]] = []

    def add(key: str, measured: Optional[Mapping[str, float]], where: str = "") -> None:
        _, text, threshold, direction = next(t for t in TARGETS if t[0] == key)
        if measured is None:
            out.append({"key": key, "target": text, "threshold": threshold, "direction": direction,
                        "measured": None, "met": None, "where": "not measured"})
            return
        value = measured["median"]
        met = value >= threshold if direction == ">=" else value <= threshold
        out.append({"key": key, "target": text, "threshold": threshold, "direction": direction, "measured": measured,
                    "met": met, "where": where})

    decode = res.get("decode")
    row = next((r for r in decode["rows"] if r["new_tokens"] == 512), None) if decode else None
    add("cache_512", row["speedup"] if row else None, "512 new tokens")
    hf = res.get("hf")
    if hf:
        worst = min(hf["decode"], key=lambda r: r["speedup"]["median"])
        add("hf_decode", worst["speedup"], f"lowest: batch {worst['batch']}, {worst['prompt_tokens']}-token prompt")
        add("hf_prefill", hf["prefill"]["speedup"], f"{hf['prefill']['tokens']} tokens")
    else:
        add("hf_decode", None)
        add("hf_prefill", None)
    moe = res.get("moe")
    add("moe_vs_dense", moe["dispatch_vs_dense"] if moe else None, f"{moe['tokens']} tokens" if moe else "")
    add("moe_vs_training", moe["dispatch_vs_training"] if moe else None, f"{moe['tokens']} tokens" if moe else "")
    fast = res.get("fast")
    add("fast_vs_hf", fast["vs_hf"] if fast else None, f"batch 1, {fast['prompt_tokens']}-token prompt" if fast else "")
    if fast:
        share = fast["read_fraction"]
        add("fast_bandwidth", {"median": share, "min": share, "max": share}, "batch 1")
    else:
        add("fast_bandwidth", None)
    return out


def _targets_table(res: Mapping[str, object]) -> List[str]:
    lines = ["### Targets", "", "| target | needed | measured: median (range) | met |", "| --- | ---: | ---: | :---: |"]
    for t in targets(res):
        needed = f"{t['direction']} {t['threshold']:g}"
        if t["measured"] is None:
            lines.append(f"| {t['target']} | {needed} | not measured | – |")
            continue
        m = t["measured"]
        value = (f"{_f(100 * m['median'], 0)}%" if t["key"] == "fast_bandwidth"
                 else f"{times(m)}")
        lines.append(f"| {t['target']} ({t['where']}) | {needed} | {value} | {'yes' if t['met'] else '**no**'} |")
    return lines + [""]


def render(res: Mapping[str, object]) -> str:
    env = res["environment"]
    lines = [
        f"Measured on **{env['device_name']}** (`{env['device']}`, {env['torch_threads']} torch threads), "
        f"torch {env['torch']}, transformers {env['transformers']}, Python {env['python']}, {res['date']}. "
        "Timings: median (min–max) of at least five interleaved runs; ratios: median (min–max) of the "
        "per-run ratios. All from one run of `make bench` on this machine"
        + (", except the sections measured separately (below)" if res.get("separate_runs") else "")
        + "; re-run it to measure yours.",
        "",
    ]
    for section, run in sorted((res.get("separate_runs") or {}).items()):
        e = run["environment"]
        lines += [f"Section `{section}` was measured separately with `python -m benchmarks.run --only {section} --merge`: "
                  f"**{e['device_name']}** (`{e['device']}`), torch {e['torch']}, {run['date']}.", ""]
    lines += _targets_table(res)
    if "decode" in res:
        d = res["decode"]
        lines += ["### 1. Cached vs uncached greedy decoding (MiniMind2-Small, random weights, batch 1)", "",
                  f"After a {d['prompt_tokens']}-token prompt. The total time grows as n^{_f(d['growth_cached'], 2)} "
                  f"with the cache and as n^{_f(d['growth_uncached'], 2)} without it (log-log slopes over the "
                  "lengths below; 1 is linear, 2 quadratic).", "",
                  "| new tokens | cached tok/s | uncached tok/s | cached time (ms) | uncached time (ms) | speed-up |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in d["rows"]:
            lines.append(f"| {r['new_tokens']} | {_f(r['cached_tok_s'])} | {_f(r['uncached_tok_s'])} | "
                         f"{timing(r['cached'], digits=0)} | {timing(r['uncached'], digits=0)} | {times(r['speedup'], 1)} |")
        lines.append("")
    if "hf" in res:
        h = res["hf"]
        p = h["prefill"]
        lines += ["### 2. minimind_ref vs transformers `LlamaForCausalLM` (same weights, fp32)", "",
                  f"Prefill of {p['tokens']} tokens: minimind_ref {timing(p['ours'])} ms, transformers {timing(p['hf'])} ms: "
                  f"minimind_ref runs at {times(p['speedup'])} the speed; max abs logit difference "
                  f"{h['prefill_max_abs_diff']:.1e}.", "",
                  "| batch | prompt tokens | new tokens | minimind_ref tok/s | transformers tok/s | minimind_ref speed | identical tokens |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | :---: |"]
        for r in h["decode"]:
            lines.append(f"| {r['batch']} | {r['prompt_tokens']} | {r['new_tokens']} | {_f(r['ours_tok_s'])} | {_f(r['hf_tok_s'])} | "
                         f"{times(r['speedup'])} | {'yes' if r['identical_tokens'] else 'NO'} |")
        lines.append("")
    if "fast" in res:
        f = res["fast"]
        lines += ["### 3. The fast decode path (`minimind_ref.fast_decode`, batch 1)", "",
                  f"{f['new_tokens']} new tokens after a {f['prompt_tokens']}-token prompt, greedy (the prompt's prefill "
                  f"included). Eager `generate`: {_f(f['eager_tok_s'])} tok/s; `FastDecoder(model)`: {_f(f['lean_tok_s'])} tok/s "
                  f"({times(f['lean_vs_eager'])} the eager speed); `FastDecoder(model, compile=True)`: {_f(f['fast_tok_s'])} tok/s "
                  f"({times(f['vs_eager'])} the eager speed, {times(f['vs_hf'])} transformers', whose `generate()` ran at "
                  f"{_f(f['hf_tok_s'])} tok/s). Its first call, compilation included, took {_f(f['first_call_s'])} s (less when inductor's on-disk "
                  f"cache holds the kernels from an earlier run). "
                  f"Same tokens as the eager path (all four): **{'yes' if f['identical_tokens'] else 'NO'}**. "
                  f"The compiled path reads {f['bytes_per_token'] / 1e6:.1f} MB per token: {_f(f['achieved_GBps'], 2)} GB/s, "
                  f"{100 * f['read_fraction']:.0f}% of the read bandwidth measured in the same run ({_f(f['read_GBps'], 2)} GB/s).",
                  ""]
    if "compile" in res:
        c = res["compile"]
        lines += ["### 3b. Tried and not kept: `torch.compile` of the whole model (`dynamic=True`)", "",
                  f"The first compiled `generate` ({c['new_tokens']} new tokens, compilation included) took "
                  f"{_f(c['first_call_s'])} s. Afterwards the compiled model decoded at {_f(c['compiled_tok_s'])} tok/s "
                  f"and the eager one at {_f(c['eager_tok_s'])} tok/s: the compiled model runs at "
                  f"{times(c['compiled_vs_eager'])} the eager speed; same tokens: "
                  f"**{'yes' if c['identical_tokens'] else 'NO'}**.", ""]
    if "threads" in res:
        th = res["threads"]
        one, many = th["threads"]
        rate = {int(k): v for k, v in th["decode_tok_s"].items()}
        lines += [f"### 3c. Thread settings (1 thread vs {many})", "",
                  f"Batch-1 greedy decoding of {th['new_tokens']} tokens: {_f(rate[one])} tok/s with {one} thread, "
                  f"{_f(rate[many])} tok/s with {many} ({times(th['decode_gain'])} the speed). A 512-token prefill with "
                  f"{many} threads runs at {times(th['prefill_gain'])} the speed of one thread. The benchmarks above use "
                  "torch's default thread count.", ""]
    if "moe" in res:
        m = res["moe"]
        t = m["times"]
        lines += [f"### 4. MoE layer (MiniMind2-MoE sizes, {m['tokens']} tokens, inference mode)", "",
                  "| path | time (ms) |", "| --- | ---: |",
                  f"| inference dispatch (`moe_infer`) | {timing(t['dispatch'], digits=2)} |",
                  f"| training path (repeat tokens, loop over experts) | {timing(t['training_path'], digits=2)} |",
                  f"| dense FFN of equal active width | {timing(t['dense'], digits=2)} |", "",
                  f"The dispatch runs at {times(m['dispatch_vs_training'])} the speed of the training path and takes "
                  f"{times(m['dispatch_vs_dense'])} the time of the dense FFN. Host synchronizations per MoE layer call: "
                  f"**{m['host_syncs_per_layer']}**.", ""]
    if "norm" in res:
        lines += ["### 5. Normalization layers (input 16 x 512 x 512, fp32)", "",
                  "| module | forward (ms) | forward+backward (ms) | forward speed vs ours | fwd+bwd speed vs ours |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for r in res["norm"]:
            lines.append(f"| `{r['module']}` | {timing(r['forward'], digits=2)} | {timing(r['fwd_bwd'], digits=2)} | "
                         f"{_f(r['forward_speed_vs_ours'], 2)}x | {_f(r['fwd_bwd_speed_vs_ours'], 2)}x |")
        lines.append("")
    if "efficiency" in res:
        e = res["efficiency"]
        lines += ["### 6. What bounds a decode step (MiniMind2-Small, batch 1)", "",
                  f"At a context of {e['context']} tokens a decode step reads {e['bytes_per_token'] / 1e6:.1f} MB "
                  f"(all weights once plus the KV cache) and runs at {_f(e['tok_s'])} tok/s, i.e. "
                  f"{_f(e['achieved_GBps'], 2)} GB/s: {100 * e['fraction_of_read']:.0f}% of this machine's measured read "
                  f"bandwidth ({_f(e['read_GBps'], 2)} GB/s, a sum over 512 MB) and {100 * e['fraction_of_memcpy']:.0f}% of its "
                  f"copy bandwidth ({_f(e['memcpy_GBps'], 2)} GB/s, read + write). The kernel that does most of the "
                  f"work, `F.linear` of one token through each of the model's weight matrices, alone reaches "
                  f"{_f(e['matvec_GBps'], 2)} GB/s; the same products against the transposed weights (`x @ W.T` "
                  f"stored contiguous, the fast path's layout) reach {_f(e['matvec_t_GBps'], 2)} GB/s.", ""]
        if e.get("profile"):
            lines += ["| operator | share of a decode step's CPU time | calls per step |", "| --- | ---: | ---: |"]
            for p in e["profile"]:
                lines.append(f"| `{p['op']}` | {100 * p['share']:.0f}% | {_f(p['calls_per_step'], 0)} |")
            lines.append("")
    if "posttrain" in res:
        pt = res["posttrain"]
        threads = pt.get("torch_threads")
        lines += ["### 7. Post-training steps (the course's recipes, chapters 09, 11 and 12)", "",
                  f"One optimizer step with {threads} torch thread{'s' if threads != 1 else ''}, as the chapters train "
                  "these small models; the same batch every step (GRPO samples new completions each time).", "",
                  "| stage | batch | tokens per step | step time (ms) | tokens/s | sampling share |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for r in pt["stages"].values():
            share = f"{100 * r['sampling_share']:.0f}%" if "sampling_share" in r else "–"
            lines.append(f"| {r['stage']} | {r['batch_size']} | {int(r['tokens_per_step']):,} | {timing(r['step_s'], digits=0)} | "
                         f"{_f(r['tokens_per_s'], 0)} | {share} |")
        lines.append("")
    if "notebooks" in res:
        nb = res["notebooks"]
        total = sum(r["seconds"] for r in nb["rows"])
        lines += ["### 8. The chapters (Restart & Run All, from `make timings`)", "",
                  f"One timed run per chapter on {nb['machine']}, {nb['date']} (`book/notebook_timings.json`); "
                  f"{_f(total)} s in all.", ""]
    if "generations" in res:
        lines += _generations(res["generations"])
    return "\n".join(lines)


def _generations(g: Mapping[str, object]) -> List[str]:
    """Section 9: MiniMind2 (c090b69) beside minimind-3 (d65ef2c)."""
    threads = g.get("torch_threads")
    lines = ["### 9. MiniMind2 and minimind-3 (upstream's c090b69 and d65ef2c generations)", "",
             "KV cache per token, from each published config (2 tensors x KV heads x head_dim x bytes per value); "
             "the decode runs below check it against the cache a real prefill returns.", "",
             "| model | generation | layers | query : KV heads | head_dim | per layer, fp32 (bytes) | per token, fp32 (KB) "
             "| per token, bf16 (KB) | full 32,768-token context, bf16 (MB) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in g["kv_cache"]:
        lines.append(f"| {r['model']} | {r['generation']} | {r['layers']} | {r['heads']} : {r['kv_heads']} | {r['head_dim']} | "
                     f"{r['per_layer_fp32']:,} | {r['per_token_fp32'] / 1024:,.1f} | {r['per_token_bf16'] / 1024:,.1f} | "
                     f"{r['per_token_bf16'] * r['max_context'] / 2**20:,.0f} |")
    d = g["decode"]
    lines += ["", f"Greedy decoding with the KV cache (`generate`), {d['new_tokens']} new tokens after a prompt of {d['prompt_tokens']} "
              f"tokens, batch 1, random weights, fp32, {threads} torch thread{'s' if threads != 1 else ''}, the models interleaved.", "",
              "| model | generation | hidden x layers | KV heads x head_dim | FFN width | parameters | tok/s | time (ms) "
              "| KV cache per token (KB, fp32; measured) |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in d["rows"]:
        lines.append(f"| {r['model']} | {r['generation']} | {r['hidden_size']} x {r['layers']} | {r['kv_heads']} x {r['head_dim']} | "
                     f"{r['intermediate_size']:,} | {r['parameters'] / 1e6:.1f}M | {_f(r['tok_s'])} | {timing(r['time'], digits=0)} | "
                     f"{r['kv_bytes_per_token_fp32'] / 1024:,.1f} ({r['measured_kv_bytes_per_token'] / 1024:,.1f}) |")
    lines += [""] + [f"minimind-3's decoding speed relative to MiniMind2's, {label}: {times(v)}." for label, v in d["speed_ratios"].items()]
    c = g["cache_cost"]
    small, large = c["models"]
    lines += ["", f"The cost of the larger cache: MiniMind2-Small as it is ({small.split(' ')[0]}) and with 4 KV heads "
              f"({large.split(' ')[0]}, the only change; {c['parameters'][large] - c['parameters'][small]:,} more parameters, "
              f"in k_proj and v_proj), one decode step at each context length ({c['steps']} steps per timing, "
              "preallocated cache).", "",
              f"| context | cache, {small} (MB) | cache, {large} (MB) | {small} (ms/step) | {large} (ms/step) | time ratio 8:4 / 8:2 |",
              "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in c["rows"]:
        ms = r["ms_per_step"]
        lines.append(f"| {r['context']:,} | {r['cache_mb'][small]:.1f} | {r['cache_mb'][large]:.1f} | {_f(ms[small], 2)}"
                     f"{' (unstable)' if unstable(r['times'][small]) else ''} | {_f(ms[large], 2)}"
                     f"{' (unstable)' if unstable(r['times'][large]) else ''} | {times(r['slowdown'])} |")
    return lines + [""]


def write(res: Mapping[str, object]) -> Path:
    out = RESULTS / "performance_table.md"
    out.write_text(render(res))
    return out


def main() -> int:
    from . import figures

    res = json.loads((RESULTS / "results.json").read_text())
    print(f"wrote {write(res)}")
    for path in figures.write_all(res, FIGURES):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
