"""The planner (``python -m minimind_ref.plan``): its activation count equals what torch saves, its
precision rule is ``utils.half_precision``'s, its peak is within 20 % of a measured one on this CPU,
and it refuses bad input.

The measured peak: a subprocess builds the run's model and optimizer and runs two optimizer steps;
the growth of its peak resident memory (``ru_maxrss``) over the memory before the model existed is
compared with ``plan_memory(...).peak``. glibc's allocator is told to hand every block of 64 KiB or
more straight back to the system when torch frees it (``MALLOC_MMAP_THRESHOLD_``): by default it
keeps freed blocks in its heap, and the resident memory then measures glibc's cache as well as the
tensors alive (measured here: estimates 15-21 % under the default heap's peak, 3-5 % under the
tensors').
"""

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minimind_ref import MiniMindConfig, MiniMindForCausalLM, utils
from minimind_ref.params import count_parameters
from minimind_ref.plan import (GPUS, activation_bytes, find_gpu, gpu_precision, main, plan_memory, plan_time,
                               train_flops_per_token)
from minimind_ref.train import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def _saved_bytes(mc, batch, seq_len, dtype=None, math_path=False):
    """Bytes of the tensors a forward pass saves for backward (each storage once; parameters,
    buffers and, under autocast, the half copies of the weights left out)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    model = MiniMindForCausalLM(mc).train()
    skip = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    weight_shapes = {s for m in model.modules() if isinstance(m, torch.nn.Linear)
                     for s in (tuple(m.weight.shape), tuple(m.weight.shape)[::-1])}  # saved as W or its transpose
    seen = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        is_half_weight = dtype is not None and t.dtype == dtype and tuple(t.shape) in weight_shapes  # (no activation has these shapes here)
        if key not in skip and not is_half_weight:
            seen[key] = t.untyped_storage().nbytes()
        return t

    x = torch.randint(0, mc.vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(1))
    cast = torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()
    path = sdpa_kernel(SDPBackend.MATH) if math_path else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), cast, path:
        model(x, labels=x)
    return sum(seen.values())


@pytest.mark.parametrize("generation", ["MiniMind2", "minimind-3"])
@pytest.mark.parametrize("dtype, attention", [(None, "fused"), (None, "math"), (torch.bfloat16, "fused")])
def test_the_activation_count_is_what_torch_saves(generation, dtype, attention):
    mc = MiniMindConfig(generation=generation, hidden_size=128, num_hidden_layers=2, vocab_size=500,
                        max_position_embeddings=128)
    for batch, seq_len in ((2, 48), (3, 64)):
        got = _saved_bytes(mc, batch, seq_len, dtype, attention == "math")
        est = activation_bytes(mc, batch, seq_len, 4 if dtype is None else 2, attention)
        # the few bytes apart are the loss's scalars
        assert abs(est - got) <= 64, (generation, dtype, attention, batch, seq_len, est, got)


def test_the_matrices_a_token_multiplies_are_the_parameters_but_the_norms():
    mc = MiniMindConfig(generation="MiniMind2", hidden_size=512, num_hidden_layers=8)
    norms = sum(p.numel() for n, p in MiniMindForCausalLM(mc).named_parameters() if "norm" in n)
    flops = train_flops_per_token(mc, 340)
    assert flops == 6 * (count_parameters(mc) - norms) + 6 * 8 * 340 * 512


@pytest.mark.parametrize("name", sorted(GPUS))
def test_the_planners_precision_is_half_precisions_rule(monkeypatch, name):
    gpu = GPUS[name]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: gpu.capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: gpu.name)
    rule = utils.half_precision("cuda")
    assert gpu_precision("auto", gpu) == (rule.dtype, rule.needs_scaler), name
    assert gpu_precision("float32", gpu) == (None, False) and gpu_precision("float16", gpu) == (torch.float16, True)


def test_a_plan_adds_its_parts():
    cfg = TrainConfig.from_json("pretrain_minimind2_small")
    t4 = plan_memory(cfg, "cuda", 1, find_gpu("T4"))
    a100 = plan_memory(cfg, "cuda", 1, find_gpu("a100"))
    assert t4.precision == "fp16 autocast + gradient scaler" and t4.attention == "math"
    assert a100.precision == "bf16 autocast" and a100.attention == "fused"
    assert t4.parameters == count_parameters(MiniMindConfig(**{**cfg.model, "vocab_size": 6400})) == 25_829_888
    p = t4.parts
    assert t4.backward_peak == (p["weights (fp32)"] + p["AdamW moments (2 x fp32)"] + p["gradients (fp32)"]
                                + p["half-precision weight copies (autocast)"] + p["activations saved for backward"]
                                + p["loss backward buffers"])  # accumulating: earlier micro-batches' gradients held
    single = plan_memory(cfg.replace(accumulation_steps=1), "cuda", 1, find_gpu("T4"))
    assert single.backward_peak == t4.backward_peak - p["gradients (fp32)"]
    eight = plan_memory(cfg.replace(batch_size=256), "cuda", 8, find_gpu("H100"))
    assert eight.micro_batch == 32 and eight.parts["DDP gradient buckets"] == 4 * eight.parameters
    assert plan_memory(cfg.replace(batch_size=16), "cuda", 1, find_gpu("T4")).peak < t4.peak


def test_bad_input_is_refused_clearly(capsys):
    cfg = TrainConfig.from_json("pretrain_minimind2_small")
    with pytest.raises(ValueError, match="unknown GPU 'V100': the planner knows T4"):
        find_gpu("V100")
    with pytest.raises(ValueError, match="does not split evenly over 3 processes"):
        plan_memory(cfg, "cuda", 3, find_gpu("T4"))
    with pytest.raises(ValueError, match="gpus must be a whole number >= 1"):
        plan_memory(cfg, "cuda", 0, find_gpu("T4"))
    with pytest.raises(ValueError, match="MoE model's routing"):
        plan_memory(cfg.replace(model={**cfg.model, "use_moe": True}), "cpu")
    with pytest.raises(ValueError, match="tokens_per_s must be a positive number"):
        plan_time(cfg, 0.0, "stated")
    for argv, fragment in ((["--gpu", "V100"], "unknown GPU"), (["--gpu", "T4", "--gpus", "0"], "--gpus: expected a positive"),
                           (["--gpu", "T4", "--set", "batch_size=0"], "batch_size=0 is invalid"),
                           (["--config", "pretrain_minimind2_small"], "say where the run goes"),
                           (["--gpu", "T4", "--mfu", "1.5"], "at most 1"),
                           (["--gpu", "T4", "--measure"], "--measure runs here"),
                           *([(["--device", "cuda"], "no CUDA GPU on this machine")] if not torch.cuda.is_available() else [])):
        with pytest.raises(SystemExit) as exit_info:
            main(["--config", "pretrain_minimind2_small", *argv])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert fragment in err and "Traceback" not in err, (argv, err)


def test_the_command_states_memory_and_time(capsys):
    assert main(["--config", "pretrain_minimind2_small", "--gpu", "T4", "--epoch-tokens", "1000000000"]) == 0
    out = capsys.readouterr().out
    assert "fp16 autocast + gradient scaler" in out and "fits: peak" in out and "90% of the T4's 16 GB" in out
    assert "a bound no run reaches" in out and "optimizer steps)" in out
    assert main(["--config", "pretrain_minimind2_small", "--gpu", "T4", "--set", "batch_size=512"]) == 0
    assert "does NOT fit" in capsys.readouterr().out


def _measured_growth(changes):
    script = r"""
import gc, json, os, resource, sys, torch
torch.set_num_threads(1)
from minimind_ref.train import TrainConfig, accumulation_step, build_model, make_optimizer, precision_for
from minimind_ref.plan import plan_memory
def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
cfg = TrainConfig.from_json("pretrain_minimind2_small").replace(**json.loads(sys.argv[1]))
dev = torch.device("cpu")
precision = precision_for(cfg, dev)
small = cfg.replace(model={**cfg.model, "hidden_size": 64, "num_hidden_layers": 1})
model = build_model(small, cfg.vocab_size)  # load the kernels and threads a step uses, on a tiny model
x = torch.randint(0, cfg.vocab_size, (2, 16))
accumulation_step(model, make_optimizer(model, small), [(x, x)] * 2, autocast=precision.autocast(dev),
                  scaler=precision.grad_scaler(dev))
del model, x
gc.collect()
before = rss()
x = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.seq_len))
model = build_model(cfg, cfg.vocab_size)
optimizer = make_optimizer(model, cfg)
scaler = precision.grad_scaler(dev)
for _ in range(2):
    accumulation_step(model, optimizer, [(x, x)] * cfg.accumulation_steps, max_grad_norm=cfg.grad_clip,
                      autocast=precision.autocast(dev), scaler=scaler)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"measured": peak - before, "estimate": plan_memory(cfg, "cpu").peak}))
"""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(changes)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm and glibc's MALLOC_MMAP_THRESHOLD_")
@pytest.mark.parametrize("changes", [
    {"batch_size": 4, "seq_len": 128, "accumulation_steps": 1, "dtype": "float32"},
    {"batch_size": 4, "seq_len": 128, "accumulation_steps": 2, "dtype": "bfloat16"},
])
def test_the_estimate_is_within_20_percent_of_the_measured_peak(changes):
    got = _measured_growth(changes)
    ratio = got["estimate"] / got["measured"]
    assert 0.8 <= ratio <= 1.2, (changes, got, ratio)
