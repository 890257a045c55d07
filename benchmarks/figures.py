"""The Performance page's figures, drawn from ``results/results.json`` (``make bench`` writes both).

Each function takes the results and a folder, draws one figure with matplotlib (Agg, no display)
and returns the file it wrote; ``write_all`` draws every figure the results have data for. Error
bars are the min–max range of the repetitions; the dashed lines are the targets of issue 21.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

#: figure file name -> (the results key it needs, the function drawing it)
FIGURES: Dict[str, str] = {
    "decode_growth.png": "decode",
    "vs_transformers.png": "hf",
    "bandwidth.png": "efficiency",
    "moe.png": "moe",
    "posttrain.png": "posttrain",
    "notebooks.png": "notebooks",
    "generations.png": "generations",
}


def _device(res: Mapping[str, object]) -> str:
    env = res["environment"]
    name = env["device_name"]
    threads = "" if "thread" in name else f", {env['torch_threads']} threads"
    return f"{name}{threads}, {res['date']}"


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    # no timestamps or software versions in the file: the same results draw the same PNG
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def _labelled_hbars(ax, names: List[str], values: List[float], colors, fmt: str) -> None:
    """Horizontal bars, first at the top, each with its value printed at its end (``fmt``)."""
    ax.barh(range(len(values)), values, color=colors)
    for i, v in enumerate(values):
        ax.text(v, i, " " + fmt.format(v), va="center", fontsize=8)
    ax.set_yticks(range(len(values)), names, fontsize=8)
    ax.invert_yaxis()


def _range(stats: Mapping[str, float], scale: float = 1.0):
    m = stats["median_s"] * scale
    return m, [[m - stats["min_s"] * scale], [stats["max_s"] * scale - m]]


def decode_growth(res: Mapping[str, object], path: Path) -> Path:
    d = res["decode"]
    ns = [r["new_tokens"] for r in d["rows"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for key, label, marker in (("cached", "with KV cache", "o"), ("uncached", "without cache", "s")):
        rates = [n / r[key]["median_s"] for n, r in zip(ns, d["rows"])]
        low = [n / r[key]["max_s"] for n, r in zip(ns, d["rows"])]
        high = [n / r[key]["min_s"] for n, r in zip(ns, d["rows"])]
        left.errorbar(ns, rates, yerr=[[a - b for a, b in zip(rates, low)], [b - a for a, b in zip(rates, high)]],
                      marker=marker, capsize=3, label=label)
        total = [r[key]["median_s"] for r in d["rows"]]
        right.loglog(ns, total, marker=marker, label=f"{label}: time ∝ n^{d['growth_' + key]:.2f}")
    left.set_xscale("log", base=2)
    left.set_xticks(ns, [str(n) for n in ns])
    left.set_xlabel("new tokens n")
    left.set_ylabel("tokens per second")
    left.set_title("Greedy decoding speed")
    left.legend()
    right.set_xscale("log", base=2)
    right.set_xticks(ns, [str(n) for n in ns])
    right.minorticks_off()
    right.set_xlabel("new tokens n")
    right.set_ylabel("total time (s)")
    right.set_title("Growth of the total time (log-log)")
    right.legend()
    fig.suptitle(f"MiniMind2-Small, batch 1 ({_device(res)})", fontsize=9)
    return _save(fig, path)


def vs_transformers(res: Mapping[str, object], path: Path) -> Path:
    h = res["hf"]
    labels = [f"prefill\n{h['prefill']['tokens']} tok"]
    ratios = [h["prefill"]["speedup"]]
    for r in h["decode"]:
        labels.append(f"decode b={r['batch']}\nprompt {r['prompt_tokens']}")
        ratios.append(r["speedup"])
    if "fast" in res:
        labels.append(f"compiled fast path\nb=1, prompt {res['fast']['prompt_tokens']}")
        ratios.append(res["fast"]["vs_hf"])
    fig, ax = plt.subplots(figsize=(9, 4))
    xs = range(len(ratios))
    medians = [r["median"] for r in ratios]
    ax.bar(xs, medians, yerr=[[m - r["min"] for m, r in zip(medians, ratios)], [r["max"] - m for m, r in zip(medians, ratios)]],
           capsize=4, color=["#7a9cc6"] + ["#4c72b0"] * len(h["decode"]) + (["#dd8452"] if "fast" in res else []))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(1.2, color="gray", linestyle="--", linewidth=0.8, label="target 1.2x (decode)")
    if "fast" in res:
        ax.axhline(2.0, color="#dd8452", linestyle="--", linewidth=0.8, label="target 2x (fast path)")
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("speed relative to transformers (x)")
    ax.set_title(f"minimind_ref vs transformers LlamaForCausalLM, same weights ({_device(res)})", fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, path)


def bandwidth(res: Mapping[str, object], path: Path) -> Path:
    e = res["efficiency"]
    names = ["memory copy\n(read + write)", "read-only sum", "F.linear over\nthe weights", "x @ W.T over\nthe weights",
             f"eager decode step\n(context {e['context']})"]
    values = [e["memcpy_GBps"], e["read_GBps"], e["matvec_GBps"], e["matvec_t_GBps"], e["achieved_GBps"]]
    if "fast" in res:
        f = res["fast"]
        names.append(f"compiled fast decode\n(context {f['prompt_tokens']}-{f['prompt_tokens'] + f['new_tokens']})")
        values.append(res["fast"]["achieved_GBps"])
    fig, ax = plt.subplots(figsize=(8, 3.8))
    _labelled_hbars(ax, names, values, ["#999999", "#999999", "#7a9cc6", "#7a9cc6", "#4c72b0", "#dd8452"][: len(values)], "{:.1f}")
    ax.axvline(0.5 * e["read_GBps"], color="black", linestyle="--", linewidth=0.8, label="50% of read bandwidth")
    ax.set_xlabel("GB/s")
    ax.set_title(f"Batch-1 decode against the memory system ({_device(res)})", fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, path)


def moe(res: Mapping[str, object], path: Path) -> Path:
    m = res["moe"]
    names = ["inference dispatch", "training path", "dense FFN,\nequal active width"]
    keys = ["dispatch", "training_path", "dense"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for i, key in enumerate(keys):
        value, err = _range(m["times"][key], 1e3)
        ax.bar(i, value, yerr=err, capsize=4, color="#4c72b0" if i == 0 else "#999999")
    ax.set_xticks(range(3), names, fontsize=8)
    ax.set_ylabel("time per layer call (ms)")
    ax.set_title(f"MoE layer, {m['tokens']} tokens ({_device(res)})", fontsize=9)
    return _save(fig, path)


def posttrain(res: Mapping[str, object], path: Path) -> Path:
    stages = list(res["posttrain"]["stages"].values())
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for i, s in enumerate(stages):
        total = s["step_s"]["median_s"]
        sampling = s.get("sampling_s", 0.0)
        ax.bar(i, total - sampling, color="#4c72b0", label="forward + backward + update" if i == 0 else None)
        if sampling:
            ax.bar(i, sampling, bottom=total - sampling, color="#dd8452", label="sampling the group's completions")
        ax.text(i, total, f" {s['tokens_per_s']:,.0f} tok/s", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(stages)), [s["stage"].upper() for s in stages])
    ax.set_ylabel("seconds per optimizer step (median)")
    threads = res["posttrain"].get("torch_threads")
    ax.set_title(f"Post-training steps, the course's recipes ({res['environment']['device_name'].split(',')[0]}, "
                 f"{threads} thread{'s' if threads != 1 else ''} as in the chapters, {res['date']})", fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, path)


def notebooks(res: Mapping[str, object], path: Path) -> Path:
    nb = res["notebooks"]
    names = [r["notebook"] for r in nb["rows"]]
    secs = [r["seconds"] for r in nb["rows"]]
    fig, ax = plt.subplots(figsize=(8, 4))
    _labelled_hbars(ax, names, secs, "#4c72b0", "{:.0f} s")
    ax.set_xlabel("seconds, Restart & Run All")
    ax.set_title(f"The chapters ({nb['machine']}, {nb['date']})", fontsize=9)
    return _save(fig, path)


def generations(res: Mapping[str, object], path: Path) -> Path:
    """Left: KV cache per token of each published model; right: decode speed of the timed models."""
    g = res["generations"]
    run = (res.get("separate_runs") or {}).get("generations", res)
    env = run["environment"]
    colors = {"MiniMind2": "#4c72b0", "minimind-3": "#dd8452"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    kv = g["kv_cache"]
    _labelled_hbars(left, [f"{r['model']}\n{r['layers']} layers, {r['heads']}:{r['kv_heads']} heads" for r in kv],
                    [r["per_token_bf16"] / 1024 for r in kv], [colors[r["generation"]] for r in kv], "{:.0f} KB")
    left.set_xlabel("KV cache per token, bf16 (KB)")
    left.set_title("Published configs: the cache each token adds", fontsize=9)
    rows = g["decode"]["rows"]
    n = g["decode"]["new_tokens"]
    rates = [r["tok_s"] for r in rows]
    low = [n / r["time"]["max_s"] for r in rows]  # the range of the repetitions, as rates
    high = [n / r["time"]["min_s"] for r in rows]
    right.barh(range(len(rows)), rates, color=[colors[r["generation"]] for r in rows],
               xerr=[[m - a for m, a in zip(rates, low)], [b - m for m, b in zip(rates, high)]], capsize=3)
    for i, (rate, top) in enumerate(zip(rates, high)):
        right.text(top, i, f"  {rate:.1f} tok/s", va="center", fontsize=8)
    right.set_yticks(range(len(rows)), [f"{r['model']}\n{r['parameters'] / 1e6:.0f}M, {r['hidden_size']} x {r['layers']}"
                                        for r in rows], fontsize=8)
    right.invert_yaxis()
    right.set_xlim(0, max(high) * 1.3)
    right.set_xlabel("tokens per second (median, range)")
    threads = g.get("torch_threads")
    right.set_title(f"Decode speed, batch 1, {threads} torch thread{'s' if threads != 1 else ''}", fontsize=9)
    fig.suptitle(f"MiniMind2 (blue) and minimind-3 (orange), random weights ({env['device_name']}, {run['date']})", fontsize=9)
    return _save(fig, path)


DRAW: Dict[str, Callable[[Mapping[str, object], Path], Path]] = {
    "decode_growth.png": decode_growth,
    "vs_transformers.png": vs_transformers,
    "bandwidth.png": bandwidth,
    "moe.png": moe,
    "posttrain.png": posttrain,
    "notebooks.png": notebooks,
    "generations.png": generations,
}


def write_all(res: Mapping[str, object], folder: Path, only: Optional[List[str]] = None) -> List[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, key in FIGURES.items():
        if key in res and (only is None or name in only):
            written.append(DRAW[name](res, folder / name))
    return written
