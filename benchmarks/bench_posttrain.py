"""Benchmark: the time of one optimizer step of each post-training stage (SFT, DPO, GRPO), and
the share of a GRPO step spent sampling the group completions.

Each stage is set up as its shipped recipe trains it (``minimind_ref.stages.RECIPES``): the model
is the stage's parent checkpoint (``stages.STAGE_INFO``: base -> sft, sft -> dpo, sft -> grpo),
the loop's settings are the stage's config file (``minimind_ref/configs/ch09_sft.json``,
``ch11_dpo.json``, ``ch12_grpo.json``), the objective's settings are the module's
``STAGE_SETTINGS`` (DPO, GRPO), the data are built by the stage's own data function, and one step
is ``minimind_ref.train.objective_step`` with ``make_optimizer``'s AdamW, the learning rate of
``lr_at`` and the run's autocast, as ``minimind_ref.train.train`` runs it. The batch is the
recipe's first batch (``data.global_batch_indices(n, batch_size, step=0, seed)``), used for the
warm-up step and for every timed step, so every timed SFT and DPO step does the same work (their
batches pad to the longest row, so another batch would have another width); a GRPO step samples
fresh completions every time (the objective's seeded generator moves on and the policy changes
after each update), so its completion lengths, and so its token count, can differ between steps.

``tokens_per_step`` counts the tokens that enter every forward pass of the step, read from the
inputs of the forward calls themselves (a forward pre-hook on each model): the policy's forward
with gradient (``policy``), the frozen reference's (``reference``, DPO and GRPO) and, for GRPO,
the policy's forwards while sampling (``sampling``: each group's prompt once, then one token per
row per decoding step, with the KV cache). Padding counts: the model processes it.

    python -m benchmarks.bench_posttrain            # prints the result as JSON
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import statistics
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch

from minimind_ref import data as data_mod
from minimind_ref import dpo, grpo, sft, stages
from minimind_ref.train import TrainConfig, autocast_for, lr_at, make_optimizer, move_to, objective_step
from minimind_ref.utils import device_name, synchronize

STAGES = ("sft", "dpo", "grpo")
QUICK_REPEATS = 2


# ---------------------------------------------------------------------- measuring tools
@contextlib.contextmanager
def timed_sampler(device: torch.device) -> Iterator[List[float]]:
    """Replace ``minimind_ref.grpo.sample_completions`` (the function ``GRPOObjective`` looks up
    at every call to sample a group) with a wrapper that adds each call's wall time to the list
    this yields; the original function is put back on exit, also after an error."""
    original = grpo.sample_completions
    seconds: List[float] = []

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        synchronize(device)
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            synchronize(device)
            seconds.append(time.perf_counter() - start)

    grpo.sample_completions = timed
    try:
        yield seconds
    finally:
        grpo.sample_completions = original


@contextlib.contextmanager
def forward_token_counter(policy: torch.nn.Module, reference: Optional[torch.nn.Module]) -> Iterator[Dict[str, int]]:
    """Count the input tokens of every forward call: the policy's with gradient (``policy``) and
    without (``sampling``: generation runs under ``no_grad``), the reference's (``reference``).
    Yields the running counts (a dict the caller may reset); the hooks are removed on exit."""
    counts = {"policy": 0, "reference": 0, "sampling": 0}

    def hook(kind: Optional[str]) -> Callable[..., None]:
        def count(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            input_ids = args[0] if args else kwargs["input_ids"]
            key = kind or ("policy" if torch.is_grad_enabled() else "sampling")
            counts[key] += int(input_ids.numel())
        return count

    handles = [policy.register_forward_pre_hook(hook(None), with_kwargs=True)]
    if reference is not None:
        handles.append(reference.register_forward_pre_hook(hook("reference"), with_kwargs=True))
    try:
        yield counts
    finally:
        for h in handles:
            h.remove()


def _summary(times: List[float]) -> Dict[str, float]:
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "repeats": len(times)}


# ---------------------------------------------------------------------- the stages, as their recipes build them
def _setup_sft(device: torch.device) -> Dict[str, Any]:
    # sft.build_stage: the base stage, TrainConfig.from_json(sft.SFT_CONFIG) (configs/ch09_sft.json:
    # batch_size 16, seq_len 256 = the conversation max_length), train_sft's data sft_data(n_train=4000,
    # seed=0), objective lm_objective (the train loop's default; SFTDataset's labels carry the mask)
    from minimind_ref.train import lm_objective

    cfg = TrainConfig.from_json(sft.SFT_CONFIG)
    model, tok = stages.load_stage(stages.STAGE_INFO["sft"].parent, device)
    data = sft.sft_data(tok, n_train=4000, n_val=1, seed=0, max_length=cfg.seq_len)
    return {"cfg": cfg, "model": model, "reference": None, "dataset": data.train, "objective": lm_objective,
            "settings": {"config": sft.SFT_CONFIG, "seq_len": cfg.seq_len, "n_train": 4000, "loss_on": "assistant"}}


def _setup_dpo(device: torch.device) -> Dict[str, Any]:
    # dpo.build_stage: the sft stage, TrainConfig.from_json(dpo.DPO_CONFIG) (configs/ch11_dpo.json:
    # batch_size 8 pairs = 16 rows, seq_len 256), dpo.STAGE_SETTINGS (beta 0.15, reduction "sum",
    # n_train 1000 generated pairs; the own-reply pairs are left out here: they need sampling first),
    # seed 0, the reference a frozen copy of the parent, objective DPOObjective
    s = dpo.STAGE_SETTINGS
    cfg = TrainConfig.from_json(dpo.DPO_CONFIG)
    model, tok = stages.load_stage(stages.STAGE_INFO["dpo"].parent, device)
    reference = dpo.freeze_reference(model)
    data = dpo.dpo_data(tok, n_train=s["n_train"], n_val=1, seed=0, max_length=cfg.seq_len,
                        empty_think_ratio=s["empty_think_ratio"])
    objective = dpo.DPOObjective(reference, beta=s["beta"], reduction=s["reduction"])
    return {"cfg": cfg, "model": model, "reference": reference, "dataset": data.train, "objective": objective,
            "settings": {"config": dpo.DPO_CONFIG, "seq_len": cfg.seq_len,
                         **{k: s[k] for k in ("beta", "reduction", "n_train")}}}


def _setup_grpo(device: torch.device) -> Dict[str, Any]:
    # grpo.build_stage: the sft stage, TrainConfig.from_json(grpo.GRPO_CONFIG) (configs/ch12_grpo.json:
    # batch_size 4 prompts), grpo.STAGE_SETTINGS (6 completions per prompt = 24 rows, up to 16 new
    # tokens, beta 0.1, temperature 0.8, CISPO, sequence reduction, n_train 2000), seed 0, the
    # reference a frozen copy of the parent, objective GRPOObjective as train_grpo builds it
    s = grpo.STAGE_SETTINGS
    cfg = TrainConfig.from_json(grpo.GRPO_CONFIG)
    model, tok = stages.load_stage(stages.STAGE_INFO["grpo"].parent, device)
    reference = dpo.freeze_reference(model)
    data = grpo.rl_data(s["n_train"], 0)
    objective = grpo.GRPOObjective(reference, tok, num_generations=s["num_generations"],
                                   max_new_tokens=s["max_new_tokens"], beta=s["beta"], temperature=s["temperature"],
                                   reward_fn=grpo.sum_reward, loss_type=s["loss_type"], epsilon=s["epsilon"],
                                   epsilon_high=s["epsilon_high"], sync_every=s["sync_every"],
                                   reduction=s["reduction"], seed=0)
    return {"cfg": cfg, "model": model, "reference": reference, "dataset": data.train, "objective": objective,
            "settings": {"config": grpo.GRPO_CONFIG,
                         **{k: s[k] for k in ("num_generations", "max_new_tokens", "beta", "temperature",
                                              "loss_type", "reduction", "n_train")}}}


SETUPS: Dict[str, Callable[[torch.device], Dict[str, Any]]] = {"sft": _setup_sft, "dpo": _setup_dpo, "grpo": _setup_grpo}


def _stage_steps(name: str, device: torch.device, repeats: int) -> Dict[str, Any]:
    """Warm-up step, then ``repeats`` timed optimizer steps of one stage, all on the recipe's
    first batch (see the module docstring)."""
    torch.manual_seed(0)
    setup = SETUPS[name](device)
    cfg, model, reference, objective = setup["cfg"], setup["model"], setup["reference"], setup["objective"]
    cfg = cfg.replace(device=str(device), progress=False, out_dir=None)
    torch.manual_seed(cfg.seed)  # as train() seeds before its loop
    model.to(device).train()
    optimizer = make_optimizer(model, cfg)
    autocast = autocast_for(cfg, device)
    dataset = setup["dataset"]
    idx = data_mod.global_batch_indices(len(dataset), cfg.batch_size, 0, cfg.seed)
    batch = move_to(dataset.batch(idx), device)

    step_times: List[float] = []
    sampling_times: List[float] = []
    tokens_each: List[Dict[str, int]] = []
    with timed_sampler(device) as sampled, forward_token_counter(model, reference) as counts:
        for step in range(1 + repeats):  # step 0 is the warm-up, not reported
            lr = lr_at(step, cfg.max_steps, cfg.warmup_steps, cfg.lr, cfg.min_lr)
            for group in optimizer.param_groups:
                group["lr"] = lr
            sampled.clear()
            for k in counts:
                counts[k] = 0
            synchronize(device)
            start = time.perf_counter()
            metrics = objective_step(model, optimizer, batch, objective, cfg.grad_clip, autocast)
            loss = float(metrics["loss"])  # reads the result back: the step is finished
            synchronize(device)
            seconds = time.perf_counter() - start
            if float(metrics.get("skipped", 0.0)) or not math.isfinite(loss):
                raise RuntimeError(f"{name}: step {step} did not update the model (loss {loss}); nothing to time.")
            if step == 0:
                continue
            step_times.append(seconds)
            sampling_times.append(sum(sampled))
            tokens_each.append(dict(counts))

    totals = [sum(t.values()) for t in tokens_each]
    tokens_per_step = statistics.median(totals)
    step_s = _summary(step_times)
    rows = int(idx.numel()) * (2 if name == "dpo" else 1) * (setup["settings"].get("num_generations", 1))
    result: Dict[str, Any] = {
        "stage": name,
        "parent": stages.STAGE_INFO[name].parent,
        "params": sum(p.numel() for p in model.parameters()),
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "batch_size": cfg.batch_size,
        "rows": rows,
        "settings": setup["settings"],
        "lr_first_timed_step": lr_at(1, cfg.max_steps, cfg.warmup_steps, cfg.lr, cfg.min_lr),
        "tokens_per_step": tokens_per_step,
        "tokens_each_step": tokens_each,
        "step_s": step_s,
        "tokens_per_s": tokens_per_step / step_s["median_s"],
    }
    if name == "grpo":
        result["sampling_s"] = statistics.median(sampling_times)
        result["sampling_share"] = statistics.median(s / t for s, t in zip(sampling_times, step_times))
    return result


def posttrain_steps(device: torch.device, repeats: int = 5, quick: bool = False) -> Dict[str, Any]:
    """Time one optimizer step of SFT, DPO and GRPO as the course's recipes train them.

    ``repeats`` timed steps per stage after one warm-up step (``quick``: ``QUICK_REPEATS``). Runs
    with the thread count the caller set. Returns ``{"device", "device_name", "torch_threads",
    "repeats", "stages": {name: {...}}}`` where each stage has ``stage``, ``parent``, ``params``,
    ``batch_size`` (the config's: conversations, pairs, prompts), ``rows`` (sequences per policy
    forward), ``tokens_per_step`` (median over the timed steps), ``tokens_each_step`` (per step,
    split into policy / reference / sampling), ``step_s`` (median/min/max seconds) and
    ``tokens_per_s`` (= ``tokens_per_step / step_s["median_s"]``); GRPO adds ``sampling_s``
    (median seconds per step spent in ``sample_completions``) and ``sampling_share`` (median over
    steps of sampling time / step time)."""
    device = torch.device(device)
    if quick:
        repeats = QUICK_REPEATS
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a whole number >= 1 (timed steps per stage), got {repeats!r}.")
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        results = {name: _stage_steps(name, device, repeats) for name in STAGES}
    return {"device": str(device), "device_name": device_name(device), "torch_threads": torch.get_num_threads(),
            "repeats": repeats, "stages": results}


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    from minimind_ref.utils import pick_device

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default=None)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    print(json.dumps(posttrain_steps(pick_device(args.device), args.repeats, args.quick), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
