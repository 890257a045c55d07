"""The longer post-training runs behind chapters 11 and 12, and their shipped record.

Chapters 11 (DPO) and 12 (GRPO) state what happens over a whole run when one setting changes:
c090b69's per-token mean instead of d65ef2c's sum, a higher learning rate, no KL term, another
group size, a sampler that lags behind the policy, twice the steps. One such run takes half a
minute (DPO) to five minutes (GRPO) on one CPU thread, more than a chapter's time budget, so they
are run once by::

    python -m minimind_ref.posttrain_experiments              # every run in RUNS (about half an hour)
    python -m minimind_ref.posttrain_experiments grpo_beta_0  # some of them, merged into the record

and recorded in ``checkpoints/posttrain_experiments.json`` (``RECORD_FILE``), which the chapters
read and print (``load_record``). Every run starts from the shipped ``sft`` stage (the seed-0
lineage of ``stage_seeds.json``), takes the shipped stage's recipe (``dpo.STAGE_SETTINGS`` with
``configs/ch11_dpo.json``, or ``grpo.STAGE_SETTINGS`` with ``configs/ch12_grpo.json``) and changes
only what ``RUNS[name]["changes"]`` names (a key of the stage settings, or of ``TrainConfig``:
``lr`` also sets ``min_lr`` to a tenth of it, as the recipes do). ``seed`` draws the data and the
samples; the ``*_recipe`` runs change nothing, and ``dpo_recipe`` / ``grpo_recipe`` (seed 0)
reproduce the shipped stages (``tests/test_posttrain_experiments.py`` checks it against the stage
record), so every run is a one-setting change of a known model. One seed per setting, except
``dpo_recipe`` (seeds 0, 1, 2, all from the same ``sft`` model: the spread a chapter compares a
one-seed change with); for GRPO that spread is the stage record (``stage_seeds.json``: five
seeds on two float paths), whose seed 0 on the native path is ``grpo_recipe`` (not bit for bit:
the stage trained from the ``sft`` model in memory, the record from the shipped fp16 file). The
GRPO runs are the ones chapter 12 prints (a run takes one to three minutes on one thread, so the
list is kept to those).

What a run records (``run_experiment``): its settings, the seconds it took (one thread, the
machine named in ``torch``/``machine``), ``after``: ``stages.evaluate_chat`` of the trained model
(with the ``sft`` model's replies as the win-rate reference), and

* DPO: ``preference``: ``dpo.preference_report`` on the held-out pairs (summed log-probabilities,
  whatever the run's reduction, so that runs compare) with ``dpo.mean_kl``; ``curve``: the
  training loss and the KL per step, as means over blocks of ``BLOCK`` steps;
* GRPO: ``heldout``: ``grpo.heldout_accuracy`` on the 200 held-out sums before and after (greedy,
  and 4 samples per prompt at temperature 0.8); ``exact_kl``: ``heldout_kl``, the exact
  KL(pi || pi_ref) per completion token on held-out prompts; ``curve``: reward, k3 KL, ratio
  (mean, and max per block), clip fraction, groups with no spread and completion length as block
  means, and the held-out greedy / sampled accuracy every ``cfg.eval_every`` steps.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from . import chat_data, dpo, grpo, stages
from .sft import IM_END, _special_id
from .utils import single_thread

RECORD_FILE = stages.CHECKPOINT_DIR / "posttrain_experiments.json"
COMMAND = "python -m minimind_ref.posttrain_experiments"
BLOCK = 10  # curves are stored as means over blocks of this many steps

#: name -> {"stage": "dpo" | "grpo", "chapter", "seed", "changes": {setting: value}, "question"}
RUNS: Dict[str, Dict[str, Any]] = {}


def _run(name: str, stage: str, question: str, seed: int = 0, **changes: Any) -> None:
    RUNS[name] = {"stage": stage, "chapter": 11 if stage == "dpo" else 12, "seed": seed, "changes": changes,
                  "question": question}


for _s in (0, 1, 2):
    _run(f"dpo_recipe_seed{_s}" if _s else "dpo_recipe", "dpo",
         "the shipped recipe" + (f", seed {_s}" if _s else " (the shipped dpo stage)"), _s)
_run("dpo_mean", "dpo", "c090b69's per-token mean instead of the sum, at the recipe's learning rate", reduction="mean")
_run("dpo_lr2e-4", "dpo", "twice the recipe's learning rate", lr=2e-4)
_run("dpo_mean_lr2e-4", "dpo", "the mean at twice the learning rate", reduction="mean", lr=2e-4)
_run("dpo_lr5e-4", "dpo", "five times the recipe's learning rate", lr=5e-4)
_run("dpo_no_own_pairs", "dpo", "only the generated pairs, none of the sft model's own wrong replies", n_own_prompts=0)
_run("grpo_recipe", "grpo", "the shipped recipe (the shipped grpo stage)")
_run("grpo_lr2e-3", "grpo", "four times the recipe's learning rate", lr=2e-3)
_run("grpo_beta_0", "grpo", "no KL term (beta 0)", beta=0.0)
_run("grpo_no_rehearsal", "grpo", "no rehearsal of chapter 09's conversations (rehearsal 0)", rehearsal=0)
_run("grpo_beta_0_no_rehearsal", "grpo", "neither the KL term nor the rehearsal", beta=0.0, rehearsal=0)
_run("grpo_sync8_ppo_lr2e-3", "grpo", "a sampler refreshed every 8 steps at four times the learning rate, PPO's clip",
     sync_every=8, loss_type="grpo", lr=2e-3)
_run("grpo_sync8_cispo_lr2e-3", "grpo", "a sampler refreshed every 8 steps at four times the learning rate, CISPO",
     sync_every=8, lr=2e-3)
_run("grpo_800_steps", "grpo", "twice the steps (the same schedule shape)", max_steps=800)
_run("grpo_group_2", "grpo", "groups of 2 (12 prompts per step: the same 24 completions)", num_generations=2,
     batch_size=12)

def _block_means(values: Sequence[float], block: int = BLOCK, reduce: Callable[[List[float]], float] = None
                 ) -> List[float]:
    reduce = reduce or (lambda v: sum(v) / len(v))
    return [round(float(reduce(list(values[i:i + block]))), 5) for i in range(0, len(values), block)]


def _split(changes: Dict[str, Any], settings: Dict[str, Any]) -> "tuple[Dict[str, Any], Dict[str, Any]]":
    """``changes`` as (stage-setting changes, TrainConfig changes); ``lr`` brings ``min_lr = lr / 10``."""
    from .train import TrainConfig

    fields = set(TrainConfig().to_dict())
    own = {k: v for k, v in changes.items() if k in settings or k == "advantages"}
    cfg = {k: v for k, v in changes.items() if k not in own}
    unknown = set(cfg) - fields
    if unknown:
        raise ValueError(f"unknown settings {sorted(unknown)}: a change names a stage setting ({', '.join(settings)}) "
                         "or a TrainConfig field.")
    if "lr" in cfg and "min_lr" not in cfg:
        cfg["min_lr"] = cfg["lr"] / 10
    return own, cfg


@torch.no_grad()
def heldout_kl(model: torch.nn.Module, ref_model: torch.nn.Module, tokenizer: Any, n_prompts: int = 50,
               n_samples: int = 4, max_new_tokens: int = 16, seed: int = 0) -> float:
    """The exact KL(pi || pi_ref) per completion token, summed over the whole vocabulary at every
    position of ``n_samples`` completions that ``model`` samples (temperature 1, its own
    distribution) for each of the first ``n_prompts`` held-out sum prompts. Unlike the k3 figures
    the training loop logs (one sampled token per position, at temperature 0.8), this is the
    drift itself."""
    end = _special_id(tokenizer, IM_END)
    g = torch.Generator().manual_seed(seed)
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        for rec in chat_data.heldout_rl_prompts()[:n_prompts]:
            s = grpo.sample_completions(model, tokenizer, rec["conversations"][:-1], n_samples, max_new_tokens,
                                        temperature=1.0, generator=g)
            n_keep = s["completion_ids"].size(1)
            mask = grpo.completion_mask(s["completion_ids"], end).bool()
            logp = model(s["input_ids"], logits_to_keep=n_keep + 1).logits[:, :-1].float().log_softmax(-1)
            logq = ref_model(s["input_ids"], logits_to_keep=n_keep + 1).logits[:, :-1].float().log_softmax(-1)
            per_position = (logp.exp() * (logp - logq)).sum(-1)
            total += float(per_position[mask].sum())
            count += int(mask.sum())
    finally:
        model.train(was_training)
    return total / max(count, 1)


def _run_dpo(spec: Dict[str, Any], parent: torch.nn.Module, tok: Any, reference: Dict[str, str]) -> Dict[str, Any]:
    from .train import TrainConfig

    own_changes, cfg_changes = _split(spec["changes"], dpo.STAGE_SETTINGS)
    s = {**dpo.STAGE_SETTINGS, **own_changes}
    seed = spec["seed"]
    cfg = TrainConfig.from_json(dpo.DPO_CONFIG).replace(progress=False, out_dir=None, seed=seed, **cfg_changes)
    policy = copy.deepcopy(parent)
    ref = dpo.freeze_reference(parent)
    start = time.perf_counter()
    own = dpo.own_reply_pairs(parent, tok, s["n_own_prompts"], seed, temperature=s["own_temperature"]) \
        if s["n_own_prompts"] else []
    data = dpo.dpo_data(tok, n_train=s["n_train"], n_val=s["n_val"], seed=seed, max_length=cfg.seq_len,
                        extra_pairs=own, empty_think_ratio=s["empty_think_ratio"])
    result = dpo.train_dpo(policy, tok, cfg, beta=s["beta"], reduction=s["reduction"], ref_model=ref, data=data,
                           log=lambda line: None)
    seconds = time.perf_counter() - start
    preference = dpo.preference_report(result.model, ref, data.val, s["beta"], "sum")
    preference["mean_kl"] = dpo.mean_kl(result.model, ref, data.val)
    with torch.no_grad():  # per kind of pair: how far each side's summed log-probability moved
        (pc, pr), (rc, rr) = dpo.pair_log_probs(result.model, data.val, "sum"), dpo.pair_log_probs(ref, data.val, "sum")
    for kind in sorted({k for k in data.val.kinds if k is not None}):
        idx = torch.tensor([k == kind for k in data.val.kinds])
        preference[f"chosen_change_{kind}"] = float((pc - rc)[idx].mean())
        preference[f"rejected_change_{kind}"] = float((pr - rr)[idx].mean())
    h = result.history
    return {"settings": s, "train_config": cfg.to_dict(), "seconds": round(seconds, 1), "own_pairs": len(own),
            "after": stages.evaluate_chat(result.model, tok, reference), "preference": preference,
            "curve": {"step": _block_means(h["step"], reduce=max), "dpo_loss": _block_means(h["dpo_loss"]),
                      "kl": _block_means(h["kl"])}}


def _run_grpo(spec: Dict[str, Any], parent: torch.nn.Module, tok: Any, reference: Dict[str, str]) -> Dict[str, Any]:
    from .train import TrainConfig

    own_changes, cfg_changes = _split(spec["changes"], grpo.STAGE_SETTINGS)
    s = {**grpo.STAGE_SETTINGS, **own_changes}
    seed = spec["seed"]
    cfg = TrainConfig.from_json(grpo.GRPO_CONFIG).replace(progress=False, out_dir=None, seed=seed, **cfg_changes)
    policy = copy.deepcopy(parent)
    ref = dpo.freeze_reference(parent)
    keys = tuple(grpo.STAGE_SETTINGS) + ("advantages",)  # every setting of the recipe, the rehearsal included
    start = time.perf_counter()
    # n_heldout: the held-out check every cfg.eval_every steps (its sampling has its own generator,
    # so the training run is the same as build_stage's, which checks nothing while it trains)
    result = grpo.train_grpo(policy, tok, cfg, ref_model=ref, seed=seed, n_heldout=len(chat_data.heldout_rl_prompts()),
                             log=lambda line: None, **{k: s[k] for k in keys if k in s})
    seconds = time.perf_counter() - start
    h = result.history
    before = grpo.heldout_accuracy(parent, tok, None, 0, s["max_new_tokens"])
    after = grpo.heldout_accuracy(result.model, tok, None, 0, s["max_new_tokens"])
    curve = {"step": _block_means(h["step"], reduce=max), "ratio_max": _block_means(h["ratio_max"], reduce=max)}
    for key in ("reward", "kl", "ratio_mean", "clip_fraction", "zero_std_groups", "completion_length"):
        curve[key] = _block_means(h[key])
    for key in ("eval_step", "eval_accuracy", "eval_sampled_accuracy"):
        curve[key] = [round(float(v), 5) for v in h[key]]
    settings = {k: v for k, v in s.items()}
    return {"settings": settings, "train_config": cfg.to_dict(), "seconds": round(seconds, 1),
            "heldout": {"before": before, "after": after}, "exact_kl": heldout_kl(result.model, ref, tok),
            "first_reward_mean10": sum(h["reward"][:10]) / 10, "final_reward_mean10": sum(h["reward"][-10:]) / 10,
            "final_kl_mean10": sum(h["kl"][-10:]) / 10,
            "after": stages.evaluate_chat(result.model, tok, reference), "curve": curve}


def run_experiment(name: str, parent: Optional[torch.nn.Module] = None, tokenizer: Any = None,
                   reference: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Run ``RUNS[name]`` from the shipped ``sft`` stage (or ``parent``) on one thread and return
    its record (see the module docstring)."""
    if name not in RUNS:
        raise ValueError(f"unknown experiment {name!r}; the runs are: {', '.join(RUNS)}.")
    spec = RUNS[name]
    if parent is None:
        parent, tokenizer = stages.load_stage("sft")
    with single_thread():
        if reference is None:
            reference = stages.reference_replies(parent, tokenizer)
        out = (_run_dpo if spec["stage"] == "dpo" else _run_grpo)(spec, parent, tokenizer, reference)
    return {"stage": spec["stage"], "chapter": spec["chapter"], "seed": spec["seed"], "question": spec["question"],
            "changes": {k: v for k, v in spec["changes"].items()}, **out}


def load_record(path: Optional[Path] = None) -> Dict[str, Any]:
    """The shipped record of the runs (``{"command", "torch", "machine", "parent", "runs": {name: ...}}``).
    A file that is not such a record (not JSON, or another command's record, such as the LoRA rank
    sweep's) is a ``ValueError`` naming it."""
    from .files import expand, read_json

    path = Path(expand(path)) if path is not None else RECORD_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no experiment record at {path}: run `{COMMAND}`.")
    return check_record(read_json(path, "experiment record"), path)


def check_record(record: Any, path: Any) -> Dict[str, Any]:
    """``record`` when it is one this command wrote: ``command`` is ``COMMAND`` and every run is a
    dict with its ``stage`` ("dpo" or "grpo"); else a ``ValueError`` naming ``path`` and what it is."""
    what = f"{path} is not a record of `{COMMAND}`"
    if not isinstance(record, dict):
        raise ValueError(f"{what}: it holds a {type(record).__name__}, not a JSON object.")
    if record.get("command") != COMMAND:
        raise ValueError(f"{what}: its command is {record.get('command')!r} (another command's record, such as "
                         "`python -m minimind_ref.lora sweep`'s?). Merge only records this command wrote.")
    runs = record.get("runs")
    if not isinstance(runs, dict):
        raise ValueError(f"{what}: it has no 'runs' object.")
    for name, run in runs.items():
        if not isinstance(run, dict) or run.get("stage") not in ("dpo", "grpo"):
            raise ValueError(f"{what}: its run {name!r} is not a DPO or GRPO run of this command (no 'stage').")
    return record


def run_experiments(names: Optional[Sequence[str]] = None, out: Optional[Path] = RECORD_FILE,
                    log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Run the named experiments (default: all of ``RUNS``) and merge them into the record at
    ``out`` (written after every run, atomically). The names, and ``out`` (writable, and a record
    of this command if it exists), are checked before the first run."""
    from .files import check_writable, write_text

    names = list(names) if names else list(RUNS)
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        raise ValueError(f"unknown experiments {unknown}; the runs are: {', '.join(RUNS)}.")
    if out is not None:
        out = Path(check_writable(out, "the record (--out)"))
    record = load_record(out) if out is not None and out.is_file() else {"runs": {}}
    parent, tokenizer = stages.load_stage("sft")
    record.update({"command": COMMAND, "torch": str(torch.__version__), "machine": platform.machine(),
                   "parent": {"stage": "sft", "evaluate_chat": stages.stage_metadata("sft")["evaluate_chat"]}})
    with single_thread():
        reference = stages.reference_replies(parent, tokenizer)
    for name in names:
        run = run_experiment(name, parent, tokenizer, reference)
        record["runs"][name] = run
        log(f"{name}: {run['seconds']:.0f} s; sums {run['after']['sum_accuracy']:.3f}, "
            f"mean length {run['after']['mean_length']:.1f}")
        if out is not None:
            write_text(out, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help=f"runs to (re-)run (default: all {len(RUNS)})")
    p.add_argument("--out", default=str(RECORD_FILE), help="the record to merge the runs into")
    p.add_argument("--list", action="store_true", help="list the runs and what each one changes")
    p.add_argument("--merge", nargs="+", default=None, metavar="RECORD",
                   help="merge the runs of other record files (made by this command) into --out, and run nothing")
    args = p.parse_args(argv)
    if args.list:
        for name, spec in RUNS.items():
            print(f"{name:28s} seed {spec['seed']}  {spec['changes'] or 'no change'}: {spec['question']}")
        return 0
    if args.merge:
        from .files import check_writable, write_text

        if args.names:
            p.error(f"--merge runs nothing, so the run names {args.names} would be ignored; give one or the other.")
        try:
            out = Path(check_writable(args.out, "--out"))
        except OSError as err:
            p.error(str(err))
        record = load_record(out) if out.is_file() else {"command": COMMAND, "runs": {}}
        parts = [load_record(Path(other)) for other in args.merge]  # every part checked before anything is written
        for part in parts:
            record.update({k: v for k, v in part.items() if k not in ("runs", "command")})
            record["runs"].update(part["runs"])
        write_text(out, json.dumps(record, indent=1, sort_keys=True) + "\n")
        return 0
    from .files import check_writable

    try:
        check_writable(args.out, "--out")
    except OSError as err:  # before the first run, not after it
        p.error(str(err))
    run_experiments(args.names, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
