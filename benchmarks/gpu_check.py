"""The GPU benchmarks of the device check (``tools/gpu_check.sh``), its record, and the record's table.

    python -m benchmarks.gpu_check bench --out DIR [--upstream FILE] [--quick]   # decode ladder, training step
    python -m benchmarks.gpu_check summarize --out DIR                         # bench + pytest results -> record
    python -m benchmarks.gpu_check report [--record FILE]                      # the Performance page's GPU table

``bench`` writes ``DIR/bench.json`` after every measurement (a run cut short keeps what it measured):

1. **Bandwidth**: a read-only sum over 1 GiB (``bench_decode.bandwidths``), the bound of a decode step.
2. **The decode ladder**, greedy unless named sampled, random weights (seed 0), every path timed
   interleaved (``benchmarks.common.interleaved``, 5 repetitions): ``generate`` (the readable loop),
   ``FastDecoder`` (fused, transposed weights; batch 1), ``FastDecoder(compile=True)``,
   ``GraphDecoder(cuda_graph=False)`` (the static step without a graph), ``GraphDecoder`` (the step
   replayed as a CUDA graph), ``GraphDecoder(compile=True)`` (inductor's fused kernels in the graph),
   transformers' ``generate()`` on the same weights (``minimind_ref.hf.to_hf``) and upstream
   d65ef2c's own ``generate`` (its ``model/model_minimind.py``, read from ``--upstream`` at run
   time). Each path's tokens are compared with ``generate``'s. The bound: the bytes a step reads
   (``GraphDecoder.bytes_per_token``) over the measured read bandwidth.
3. **One training step** of minimind-3, batch 16 x 512 tokens, bf16 autocast, AdamW, gradient
   clipping at 1.0 (upstream's ``trainer/train_pretrain.py`` step at d65ef2c): the package's model
   with fused AdamW and SDPA, the same compiled (``torch.compile``), and upstream d65ef2c's class
   loaded with the same weights and its trainer's plain ``optim.AdamW``. Tokens per second and the
   model FLOPs utilisation, ``6 * parameters * tokens/s`` over the GPU's dense bf16 peak
   (``PEAK_BF16_TFLOPS``; attention's own FLOPs are not counted); the first three steps' losses of
   every variant from the same weights and batches, within bf16 tolerance of each other.

Without CUDA (the dry run) the same code runs on tiny configurations on the CPU; the paths that
need a GPU are listed as skipped with the reason, and the record says ``"dry_run": true``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
#: Where a committed record lives (package data: chapter 06 reads it too) and the table the page includes.
RECORD = ROOT / "minimind_ref" / "reference_outputs" / "gpu_record.json"
TABLE = ROOT / "benchmarks" / "results" / "gpu_table.md"
CPU_TIMINGS = ROOT / "book" / "notebook_timings.json"

#: Dense bf16 tensor-core peak in TFLOP/s, from NVIDIA's datasheets (the figures without sparsity,
#: i.e. half the "with sparsity" ones), matched against ``torch.cuda.get_device_name()`` in order.
PEAK_BF16_TFLOPS = [
    (r"H200 NVL", 835.5), (r"H200", 989.5),
    (r"H100 NVL", 835.5), (r"H100 PCIe", 756.5), (r"H100", 989.5),  # "NVIDIA H100 80GB HBM3" is the SXM part
    (r"A100", 312.0), (r"L40S", 362.05), (r"\bL4\b", 121.0), (r"\bA10\b", 125.0),
]


def peak_bf16_tflops(device_name: str) -> Optional[float]:
    """The dense bf16 peak of a GPU by name, or None for a GPU the table does not list (then no MFU)."""
    for pattern, peak in PEAK_BF16_TFLOPS:
        if re.search(pattern, device_name):
            return peak
    return None


def mfu(parameters: int, tokens_per_s: float, peak_tflops: Optional[float]) -> Optional[float]:
    """Model FLOPs utilisation: ``6 * parameters * tokens/s`` (forward and backward of every weight)
    over the peak; None without a peak."""
    if not peak_tflops:
        return None
    return 6 * parameters * tokens_per_s / (peak_tflops * 1e12)


def environment(device: torch.device) -> Dict[str, Any]:
    from minimind_ref.utils import device_name

    env: Dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "device": str(device), "device_name": device_name(device),
                           "cpu": device_name("cpu"), "platform": platform.platform()}
    for name in ("transformers", "tokenizers", "huggingface_hub"):
        try:
            env[name] = __import__(name).__version__
        except Exception:  # not installed, or broken: the record says so
            env[name] = None
    return env


# --- timing ------------------------------------------------------------------------------------

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device) -> Callable[[], Any]:
    def run() -> Any:
        out = fn()
        _sync(device)
        return out
    return run


def _first_call(fn: Callable[[], Any], device: torch.device) -> float:
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


# --- the decode ladder -------------------------------------------------------------------------

#: name, preset, dtype, batch, prompt tokens, new tokens, paths (in ladder order). In the order of
#: priority: a run cut short by the check's time budget keeps the rows measured before the cut.
DECODE_RUNS = [
    ("minimind-3 bf16, batch 1", "minimind-3", "bfloat16", 1, 32, 128,
     ["generate", "fast", "static_eager", "graph", "hf", "upstream"]),
    ("minimind-3 bf16, batch 32", "minimind-3", "bfloat16", 32, 32, 128, ["generate", "graph", "hf"]),
    ("minimind-3 fp32, batch 1", "minimind-3", "float32", 1, 32, 128, ["generate", "fast", "graph", "hf"]),
    ("minimind-3 bf16, batch 1, compiled", "minimind-3", "bfloat16", 1, 32, 128, ["graph", "fast_compiled", "graph_compiled"]),
    ("minimind-3 bf16, batch 32, compiled", "minimind-3", "bfloat16", 32, 32, 128, ["graph", "graph_compiled"]),
    ("minimind-3 bf16, batch 1, sampled", "minimind-3", "bfloat16", 1, 32, 128, ["generate", "graph", "upstream"]),
    ("minimind-3-moe bf16, batch 1", "minimind-3-moe", "bfloat16", 1, 32, 128, ["generate", "graph"]),
    ("minimind-3-moe bf16, batch 32", "minimind-3-moe", "bfloat16", 32, 32, 128, ["generate", "graph"]),
    ("MiniMind2-Small bf16, batch 1", "MiniMind2-Small", "bfloat16", 1, 32, 128, ["generate", "fast", "graph", "hf"]),
]
#: The training step is measured after this many decode rows (the rest are less central).
TRAIN_AFTER = 3
#: The sampling settings of the sampled run: upstream d65ef2c ``generate``'s defaults.
SAMPLED = dict(do_sample=True, temperature=0.85, top_k=50, top_p=0.85)
#: The dry run's tiny stand-in for every preset (the same layout switches, a few thousand parameters each).
TINY = dict(hidden_size=64, num_hidden_layers=2, vocab_size=320, max_position_embeddings=128)
NEEDS_COMPILE = {"fast_compiled", "graph_compiled"}  # measured on a GPU only: minutes of compilation on a CPU


def build_model(preset_name: str, dtype: str, device: torch.device, tiny: bool) -> "torch.nn.Module":
    import minimind_ref as mm

    torch.manual_seed(0)
    config = mm.preset(preset_name, **(TINY if tiny else {}))
    return mm.MiniMindForCausalLM(config).to(device=device, dtype=getattr(torch, dtype)).eval()


def load_upstream(path: Optional[str]):
    """Upstream's ``model/model_minimind.py`` (d65ef2c), imported from ``path`` (never committed here)."""
    if not path:
        raise FileNotFoundError("no --upstream file given (make gpu-wheels extracts d65ef2c:model/model_minimind.py)")
    import importlib.util

    spec = importlib.util.spec_from_file_location("upstream_model_minimind_d65ef2c", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def upstream_model(upstream, model: "torch.nn.Module") -> "torch.nn.Module":
    """Upstream's ``MiniMindForCausalLM`` with ``model``'s configuration and weights (same dtype and device)."""
    c = model.config
    config = upstream.MiniMindConfig(
        hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers, use_moe=c.use_moe, vocab_size=c.vocab_size,
        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
        intermediate_size=c.intermediate_size, max_position_embeddings=c.max_position_embeddings,
        rope_theta=c.rope_theta, num_experts=c.n_routed_experts, num_experts_per_tok=c.num_experts_per_tok,
        moe_intermediate_size=c.expert_intermediate_size, flash_attn=c.flash_attn)
    theirs = upstream.MiniMindForCausalLM(config)
    theirs.load_state_dict(model.state_dict(), strict=True)
    return theirs.to(device=model.device, dtype=model.lm_head.weight.dtype).eval()


def decode_paths(model, prompt: torch.Tensor, new: int, paths: List[str], sampled: bool, upstream_file: Optional[str],
                 device: torch.device) -> tuple:
    """``{path: zero-argument function returning the tokens}`` and ``{path: why it was skipped}``."""
    from minimind_ref.fast_decode import FastDecoder
    from minimind_ref.graph_decode import GraphDecoder

    settings = SAMPLED if sampled else {}
    fns: Dict[str, Callable[[], torch.Tensor]] = {}
    skipped: Dict[str, str] = {}
    decoders: Dict[str, Any] = {}
    batch = prompt.shape[0]
    for path in paths:
        try:
            if path in NEEDS_COMPILE and device.type != "cuda":
                raise RuntimeError("torch.compile is measured on the GPU only (minutes of compilation on a CPU)")
            if path in ("fast", "fast_compiled") and (batch != 1 or model.config.use_moe or sampled):
                raise RuntimeError("FastDecoder decodes one sequence of a dense model, greedily")
            if path == "generate":
                fns[path] = lambda: model.generate(prompt, max_new_tokens=new, **settings)
            elif path in ("fast", "fast_compiled"):
                fast = FastDecoder(model, compile=path == "fast_compiled")
                fns[path] = lambda fast=fast: fast.generate(prompt, new)
            elif path in ("static_eager", "graph", "graph_compiled"):
                decoder = GraphDecoder(model, cuda_graph=False if path == "static_eager" else None,
                                       compile=path == "graph_compiled")
                fns[path] = lambda d=decoder: d.generate(prompt, new, **settings)
                decoders[path] = decoder
            elif path == "hf":
                from minimind_ref.hf import to_hf

                hf = to_hf(model)
                mask = torch.ones_like(prompt)
                fns[path] = lambda hf=hf: hf.generate(prompt, attention_mask=mask, max_new_tokens=new,
                                                      min_new_tokens=new, pad_token_id=0,
                                                      **(settings or dict(do_sample=False)))
            elif path == "upstream":
                theirs = upstream_model(load_upstream(upstream_file), model)
                up = dict(temperature=1.0, top_k=0, top_p=1.0, do_sample=False) if not sampled else dict(SAMPLED)
                fns[path] = lambda t=theirs: t.generate(prompt, max_new_tokens=new, eos_token_id=None, **up)
        except Exception as err:  # recorded, not fatal: the other paths are still measured
            skipped[path] = f"{type(err).__name__}: {err}"[:300]
    return fns, skipped, decoders


def decode_ladder(device: torch.device, bandwidth: float, upstream_file: Optional[str], tiny: bool,
                  save: Callable[[], None], rows: List[Dict[str, Any]], runs: List[tuple]) -> None:
    from minimind_ref.graph_decode import GraphDecoder
    from minimind_ref.params import count_parameters

    from .common import interleaved

    for name, preset_name, dtype, batch, prompt_len, new, paths in runs:
        if tiny:
            prompt_len, new, batch = 8, 8, min(batch, 4)
        row: Dict[str, Any] = {"run": name, "preset": preset_name, "dtype": dtype, "batch": batch,
                               "prompt_tokens": prompt_len, "new_tokens": new, "tiny": tiny, "paths": {}, "skipped": {}}
        rows.append(row)
        try:
            model = build_model(preset_name, dtype, device, tiny)
            row["parameters"] = count_parameters(model)
            row["bytes_per_token"] = GraphDecoder(model).bytes_per_token(prompt_len + new // 2, batch=batch)
            row["bound_tok_s"] = batch * bandwidth / row["bytes_per_token"]  # every row's token per step
            prompt = torch.randint(0, model.config.vocab_size, (batch, prompt_len),
                                   generator=torch.Generator().manual_seed(1)).to(device)
            fns, row["skipped"], decoders = decode_paths(model, prompt, new, paths, "sampled" in name, upstream_file,
                                                         device)
            outs: Dict[str, torch.Tensor] = {}
            for path, fn in list(fns.items()):  # first calls: capture, compilation, lazy initialisation
                try:
                    torch.manual_seed(2)
                    row["paths"][path] = {"first_call_s": _first_call(lambda: outs.__setitem__(path, fn()), device)}
                except Exception as err:
                    row["skipped"][path] = f"{type(err).__name__}: {err}"[:300]
                    del fns[path]
            save()
            timed = {path: _timed(fn, device) for path, fn in fns.items()}
            times = interleaved(timed, repeats=5, warmup=0, retry=False)
            reference = outs.get("generate")
            for path, stats in times.items():
                entry = row["paths"][path]
                entry.update(time=stats, tok_s=batch * new / stats["median_s"])
                entry["fraction_of_bound"] = entry["tok_s"] / row["bound_tok_s"]
                if path in decoders:  # what GraphDecoder ran: "cuda graph", or the fallback off CUDA
                    entry["path_ran"] = decoders[path].last_path
                if reference is not None and "sampled" not in name:
                    got = outs[path][:, :reference.shape[1]].to(reference.device)
                    entry["identical_tokens"] = bool(torch.equal(got, reference))
                    entry["agreeing_new_tokens"] = float((got[:, prompt_len:] == reference[:, prompt_len:]).float().mean())
            hf = row["paths"].get("hf")
            for path, entry in row["paths"].items():
                if hf and "tok_s" in entry and "tok_s" in hf:
                    entry["vs_hf"] = entry["tok_s"] / hf["tok_s"]
            del model, fns, timed, outs
        except Exception as err:
            row["error"] = f"{type(err).__name__}: {err}"[:500]
            traceback.print_exc()
        finally:
            torch._dynamo.reset()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        save()
        print(f"decode: {name} done", flush=True)


# --- one training step -------------------------------------------------------------------------

def train_step(model, optimizer, ids: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Upstream's pretraining step (d65ef2c ``trainer/train_pretrain.py``): bf16 autocast, loss plus the
    router's aux loss, backward, clip the gradient norm at 1.0, AdamW step, gradients set to None."""
    with torch.autocast(device.type, dtype=torch.bfloat16):
        out = model(ids, labels=ids)
        loss = out.loss + out.aux_loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def training(device: torch.device, upstream_file: Optional[str], tiny: bool, peak: Optional[float]) -> Dict[str, Any]:
    import minimind_ref as mm
    from minimind_ref.params import count_parameters

    from .common import interleaved

    batch, seq, steps_per_call = (2, 32, 1) if tiny else (16, 512, 2)
    torch.manual_seed(0)
    config = mm.preset("minimind-3", **(TINY if tiny else {}))
    base = mm.MiniMindForCausalLM(config)
    parameters = count_parameters(base)
    data = torch.randint(0, config.vocab_size, (8, batch, seq), generator=torch.Generator().manual_seed(3)).to(device)
    res: Dict[str, Any] = {"preset": "minimind-3", "tiny": tiny, "batch": batch, "seq_len": seq,
                           "tokens_per_step": batch * seq, "parameters": parameters, "peak_bf16_tflops": peak,
                           "variants": {}, "skipped": {}}
    variants: Dict[str, Any] = {}

    def ours(compiled: bool):
        model = mm.MiniMindForCausalLM(config).to(device)
        model.load_state_dict(base.state_dict())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
        return (torch.compile(model) if compiled else model), opt

    builders = {"ours": lambda: ours(False), "ours_compiled": lambda: ours(True)}
    builders["upstream"] = lambda: _upstream_for_training(upstream_file, base, device)
    for name, build in builders.items():
        try:
            if name == "ours_compiled" and device.type != "cuda":
                raise RuntimeError("torch.compile is measured on the GPU only (minutes of compilation on a CPU)")
            variants[name] = build()
        except Exception as err:
            res["skipped"][name] = f"{type(err).__name__}: {err}"[:300]
    for name, (model, opt) in variants.items():  # the same weights and batches: the losses must agree
        start = time.perf_counter()
        losses = [float(train_step(model, opt, data[i], device)) for i in range(3)]
        _sync(device)
        res["variants"][name] = {"losses": losses, "first_steps_s": time.perf_counter() - start}
    counter = {"i": 3}

    def runner(model, opt):
        def run() -> None:
            for _ in range(steps_per_call):
                train_step(model, opt, data[counter["i"] % len(data)], device)
                counter["i"] += 1
            _sync(device)
        return run

    times = interleaved({n: runner(*mo) for n, mo in variants.items()}, repeats=5, warmup=1, retry=False)
    for name, stats in times.items():
        entry = res["variants"][name]
        entry["time"] = stats
        entry["step_s"] = stats["median_s"] / steps_per_call
        entry["tokens_per_s"] = batch * seq / entry["step_s"]
        entry["mfu"] = mfu(parameters, entry["tokens_per_s"], peak) if device.type == "cuda" else None
    ref = res["variants"].get("ours", {}).get("losses")
    for name, entry in res["variants"].items():
        if ref is not None:
            entry["max_loss_difference_vs_ours"] = max(abs(a - b) for a, b in zip(entry["losses"], ref))
        if "upstream" in res["variants"] and "tokens_per_s" in entry:
            entry["vs_upstream"] = entry["tokens_per_s"] / res["variants"]["upstream"]["tokens_per_s"]
    # bf16 keeps 8 significant bits; the same weights and batches in another kernel order stay within this
    res["loss_tolerance"] = 0.05
    res["losses_agree"] = all(e.get("max_loss_difference_vs_ours", 0.0) <= res["loss_tolerance"]
                              for e in res["variants"].values())
    return res


def _upstream_for_training(upstream_file: Optional[str], base, device: torch.device):
    theirs = upstream_model(load_upstream(upstream_file), base).to(device).train()
    return theirs, torch.optim.AdamW(theirs.parameters(), lr=1e-4)  # upstream's trainer: optim.AdamW(params, lr)


# --- the commands ------------------------------------------------------------------------------

def bench(out_dir: Path, upstream_file: Optional[str], quick: bool) -> Dict[str, Any]:
    from .bench_decode import bandwidths

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tiny = quick or device.type != "cuda"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench.json"
    res: Dict[str, Any] = {"dry_run": device.type != "cuda", "tiny": tiny, "environment": environment(device),
                           "date": datetime.date.today().isoformat(), "decode": [], "errors": []}
    save = lambda: path.write_text(json.dumps(res, indent=1) + "\n")  # noqa: E731
    save()
    try:
        res["bandwidth"] = bandwidths(device, mbytes=64 if tiny else 1024)
        res["bandwidth"] = {k: v for k, v in res["bandwidth"].items() if k.endswith("GBps") or k == "mbytes"}
    except Exception as err:
        res["errors"].append(f"bandwidth: {type(err).__name__}: {err}")
    read = res.get("bandwidth", {}).get("read_GBps", float("nan")) * 1e9
    save()
    peak = peak_bf16_tflops(res["environment"]["device_name"]) if device.type == "cuda" else None
    jobs = [("decode", lambda: decode_ladder(device, read, upstream_file, tiny, save, res["decode"], DECODE_RUNS[:TRAIN_AFTER])),
            ("train", lambda: res.__setitem__("train", training(device, upstream_file, tiny, peak))),
            ("decode", lambda: decode_ladder(device, read, upstream_file, tiny, save, res["decode"], DECODE_RUNS[TRAIN_AFTER:]))]
    for section, run in jobs:
        try:
            run()
        except Exception as err:
            res["errors"].append(f"{section}: {type(err).__name__}: {err}"[:500])
            traceback.print_exc()
        save()
        print(f"bench: {section} done", flush=True)
    return res


def _junit(path: Path) -> List[Dict[str, Any]]:
    """Per test: name, outcome, seconds, message, and the properties a test recorded (record_property)."""
    if not path.exists():
        return []
    tests = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (node.get("message") or "")[:400]
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        tests.append({"test": f"{case.get('classname', '')}::{case.get('name')}", "outcome": outcome,
                      "seconds": float(case.get("time") or 0.0), "message": message, "properties": props})
    return tests


_VERBOSE = re.compile(r"(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) (tests/\S+::\S+)")


def _verbose_lines(log: str, pass_name: str) -> List[Dict[str, Any]]:
    """The outcome of each test from pytest's ``-v`` lines of one pass in the log (no times, no properties)."""
    start = log.find(f"pass {pass_name} (")
    if start < 0:
        return []
    end = log.find("   pass ", start + 1)
    outcomes: Dict[str, str] = {}
    for word, test in _VERBOSE.findall(log[start:end if end > 0 else len(log)]):
        outcomes[test] = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "SKIPPED": "skipped"}.get(word, word.lower())
    return [{"test": test.replace("/", ".").replace(".py::", "::"), "outcome": outcome, "seconds": None, "message": "",
             "properties": {}} for test, outcome in outcomes.items()]


def summarize(out_dir: Path) -> Dict[str, Any]:
    """``bench.json``, the pytest passes' junit files and their exit statuses -> ``gpu_record.json``."""
    bench_path = out_dir / "bench.json"
    record: Dict[str, Any] = json.loads(bench_path.read_text()) if bench_path.exists() else {"errors": ["no bench.json"]}
    passes = json.loads((out_dir / "passes.json").read_text()) if (out_dir / "passes.json").exists() else []
    record["suite"] = []
    log = (out_dir / "gpu_check.log").read_text(encoding="utf-8", errors="replace") if (out_dir / "gpu_check.log").exists() else ""
    for p in passes:
        tests, source = _junit(out_dir / p["junit"]), "junit"
        if not tests and p.get("status") != "not run":  # stopped before pytest wrote its junit file: the -v lines
            tests, source = _verbose_lines(log, p["name"]), "log (no junit file: the pass was stopped)"
        counts = {o: sum(t["outcome"] == o for t in tests) for o in ("passed", "failed", "error", "skipped")}
        record["suite"].append({**p, "counts": counts, "tests": tests, "results_from": source})
    cpu = json.loads(CPU_TIMINGS.read_text()) if CPU_TIMINGS.exists() else {"seconds": {}, "machine": {}}
    logged = {}
    if (out_dir / "chapters.jsonl").exists():  # written as each chapter ends (tests/test_gpu.py)
        for line in (out_dir / "chapters.jsonl").read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            logged.setdefault(entry["chapter"], entry)  # the first pass's
    chapters = []
    first = record["suite"][0]["tests"] if record["suite"] else []
    for name, cpu_s in sorted(cpu["seconds"].items()):
        test = next((t for t in first if f"[{name}.ipynb]" in t["test"]), None)
        cuda_s = float(test["properties"]["cuda_seconds"]) if test and "cuda_seconds" in test.get("properties", {}) else None
        outcome = test["outcome"] if test else "not run"
        if name in logged and (cuda_s is None or outcome == "not run"):
            cuda_s = cuda_s if cuda_s is not None else (logged[name]["cuda_seconds"] if logged[name]["outcome"] == "passed" else None)
            outcome = logged[name]["outcome"] if outcome == "not run" else outcome
        chapters.append({"chapter": name, "cpu_s": cpu_s, "cuda_s": cuda_s, "outcome": outcome,
                         "cuda_over_cpu": cuda_s / cpu_s if cuda_s and cpu_s else None})
    record["chapters"] = {"cpu_machine": cpu.get("machine", {}), "rows": chapters}
    record["not_measured"] = not_measured(record)
    (out_dir / "gpu_record.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def not_measured(record: Dict[str, Any]) -> List[str]:
    """Every figure the record lacks, in words (the dry run lacks every GPU figure)."""
    missing = []
    if record.get("dry_run", True):
        missing.append("every GPU figure: this record is a dry run without CUDA (tiny models on the CPU)")
    measured = {row["run"] for row in record.get("decode", [])}
    missing += [f"decode {run[0]}: not run (the time budget ran out first)" for run in DECODE_RUNS if run[0] not in measured]
    for row in record.get("decode", []):
        for path, why in row.get("skipped", {}).items():
            missing.append(f"decode {row['run']}: {path} ({why})")
        if row.get("error"):
            missing.append(f"decode {row['run']}: {row['error']}")
    train = record.get("train", {})
    for name, why in train.get("skipped", {}).items():
        missing.append(f"training step: {name} ({why})")
    if not train:
        missing.append("training step: not run")
    for p in record.get("suite", []):
        if p.get("status") == "not run":
            missing.append(f"pytest pass {p['name']}: not run ({p.get('reason', '')})")
    return missing


# --- the Performance page's table --------------------------------------------------------------

PATH_NAMES = {"generate": "`generate`", "fast": "`FastDecoder`", "fast_compiled": "`FastDecoder(compile=True)`",
              "static_eager": "`GraphDecoder`, no graph", "graph": "`GraphDecoder` (CUDA graph)",
              "graph_compiled": "`GraphDecoder(compile=True)`", "hf": "transformers `generate()`",
              "upstream": "upstream d65ef2c `generate`"}


def render(record: Optional[Dict[str, Any]]) -> str:
    """The GPU section's tables from a record; without one (or from a dry run), what is missing and how to measure it."""
    if not record or record.get("dry_run", True):
        return ("**No GPU figures have been measured yet**: the repository holds no record of a run on a GPU "
                "(`minimind_ref/reference_outputs/gpu_record.json`). On a machine with a CUDA GPU, "
                "`make gpu-check` runs the GPU test suite and these benchmarks and writes the record; copy it "
                "there and run `python -m benchmarks.gpu_check report` to fill this section.\n")
    env = record["environment"]
    lines = [f"Measured on **{env['device_name']}** on {record['date']}: Python {env['python']}, torch {env['torch']}, "
             f"transformers {env['transformers']}, tokenizers {env['tokenizers']} (`make gpu-check`). Every figure "
             "below comes from that one run; ratios are taken within it.", ""]
    bw = record.get("bandwidth", {})
    if bw:
        lines += [f"Read bandwidth (a sum over {bw['mbytes']} MiB): {bw['read_GBps']:,.0f} GB/s.", ""]
    lines += ["| run | path | tokens/s | of the bandwidth bound | vs transformers | same tokens as `generate` |",
              "| --- | --- | ---: | ---: | ---: | --- |"]
    for row in record.get("decode", []):
        for path, e in row.get("paths", {}).items():
            if "tok_s" not in e:
                continue
            vs = f"{e['vs_hf']:.2f}x" if "vs_hf" in e else "–"
            same = {True: "yes", False: f"no ({e.get('agreeing_new_tokens', 0):.0%} of new tokens)"}.get(
                e.get("identical_tokens"), "–")
            lines.append(f"| {row['run']} | {PATH_NAMES.get(path, path)} | {e['tok_s']:,.0f} | "
                         f"{e['fraction_of_bound']:.1%} | {vs} | {same} |")
    train = record.get("train", {})
    if train.get("variants"):
        lines += ["", f"One training step of minimind-3, batch {train['batch']} x {train['seq_len']} tokens, bf16 "
                  f"autocast, AdamW (dense bf16 peak of this GPU: {train['peak_bf16_tflops']} TFLOP/s):", "",
                  "| model | tokens/s | MFU | vs upstream | losses of the first 3 steps |", "| --- | ---: | ---: | ---: | --- |"]
        for name, e in train["variants"].items():
            m = f"{e['mfu']:.1%}" if e.get("mfu") is not None else "–"
            vs = f"{e['vs_upstream']:.2f}x" if "vs_upstream" in e else "–"
            lines.append(f"| {name} | {e.get('tokens_per_s', float('nan')):,.0f} | {m} | {vs} | "
                         + ", ".join(f"{x:.4f}" for x in e["losses"]) + " |")
    rows = record.get("chapters", {}).get("rows", [])
    if rows:
        machine = record["chapters"].get("cpu_machine", {}).get("device", "the CPU of book/notebook_timings.json")
        lines += ["", f"The chapters, *Restart & Run All*: seconds on CUDA in this run (pytest workers sharing the GPU) "
                  f"beside the seconds on {machine} (`make timings`, another machine and day):", "",
                  "| chapter | CPU s | CUDA s | result on CUDA |", "| --- | ---: | ---: | --- |"]
        for r in rows:
            cuda = f"{r['cuda_s']:.1f}" if r["cuda_s"] is not None else "–"
            lines.append(f"| {r['chapter']} | {r['cpu_s']:.1f} | {cuda} | {r['outcome']} |")
    missing = record.get("not_measured", [])
    if missing:
        lines += ["", "Not measured in this run:", ""] + [f"- {m}" for m in missing]
    return "\n".join(lines) + "\n"


def report(record_path: Path = RECORD, table: Path = TABLE) -> Path:
    record = json.loads(record_path.read_text()) if record_path.exists() else None
    table.parent.mkdir(parents=True, exist_ok=True)
    table.write_text(render(record), encoding="utf-8")
    return table


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--upstream", default=os.environ.get("MINIMIND_UPSTREAM_MODEL"))
    b.add_argument("--quick", action="store_true", help="tiny models even on a GPU (to try the harness)")
    s = sub.add_parser("summarize")
    s.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("report")
    r.add_argument("--record", type=Path, default=RECORD)
    args = parser.parse_args(argv)
    if args.command == "bench":
        bench(args.out, args.upstream, args.quick)
    elif args.command == "summarize":
        record = summarize(args.out)
        print(json.dumps({k: record.get(k) for k in ("dry_run", "environment")}, indent=1))
        for p in record["suite"]:
            print(f"pytest pass {p['name']}: {p.get('status')} {p['counts']}")
        print("not measured:\n  " + "\n  ".join(record["not_measured"]))
    else:
        print(f"wrote {report(args.record)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
