"""The course model at every stage (base, SFT, LoRA, DPO, GRPO), the one held-out evaluation that
the stage report runs on each of them, and the report over seeds.

The post-training chapters start from checkpoints the course's own code made: chapter 08's
pretraining config gives ``base``, chapter 09's SFT run on ``base`` gives ``sft``, and ``lora``,
``dpo`` and ``grpo`` start from ``sft``. The files ship with the package
(``minimind_ref/checkpoints/``, fp16 weights as upstream saves them, plus the tokenizer), each with
the config, command and metrics that produced it, so a chapter runs standalone.

This module owns the shipped files (``stage_path``, ``load_stage``, ``save_stage``,
``stage_metadata``), re-creating them (``build_base``, ``train_stage``, ``rebuild``,
``rebuild_seeds``), one report row per shipped stage (``stage_rows``, ``recorded_rows``) and the
command line. It stands on three modules, whose names are importable from here as before:
``stage_registry`` (the stages, their parents, files and recipes), ``chat_eval`` (the held-out
evaluation, ``evaluate_chat``) and ``stage_report`` (the record over seeds, the claims and the
report's rendering).

    python -m minimind_ref.stages rebuild --seeds 0,1,2   # the seeded rebuild (not part of make test)
    python -m minimind_ref.stages report --out FILE --figure PNG   # the report from the seed record
    python -m minimind_ref.stages report --evaluate       # one row per shipped stage, re-evaluated here
    python -m minimind_ref.stages rebuild [stage]         # re-create one shipped stage (seed 0)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .checkpoint import _torch_load, check_metadata, check_tokenizer_fits, check_weights
# The evaluation, the registry and the report, importable from here as before (``stages.evaluate_chat``).
from .chat_eval import (EVAL_MAX_NEW_TOKENS, evaluate_chat, heldout_prompts, mean_logprobs,  # noqa: F401
                        own_reply_pairs, reference_replies, reply_logprobs, score_reply)
from .files import DIGEST_KEY, weights_digest
from .stage_registry import (CHECKPOINT_DIR, RECIPES, SEEDED_STAGES, SEEDS_FILE, STAGE_INFO,  # noqa: F401
                             STAGES, TOKENIZER_FILE, Stage)
from .stage_report import (METRICS, REPORT_COLUMNS, REPORT_KEYS, STAGE_CLAIMS, _fmt,  # noqa: F401
                           check_claim, load_seed_records, render_markdown, render_seed_figure,
                           render_seed_report, seed_values, stage_effect)


# ---------------------------------------------------------------------- shipped checkpoints
def stage_path(name: str) -> Path:
    if name not in STAGE_INFO:
        raise ValueError(f"unknown stage {name!r}; the stages are {', '.join(STAGES)}.")
    return CHECKPOINT_DIR / STAGE_INFO[name].file


def available_stages() -> List[str]:
    return [s for s in STAGES if stage_path(s).is_file()]


def load_tokenizer() -> Any:
    """The course tokenizer every stage uses (chapter 08's, shipped with the package)."""
    from .tokenizer import load_tokenizer as _load

    return _load(TOKENIZER_FILE)


def load_stage(name: str, device: Any = "cpu") -> Tuple[torch.nn.Module, Any]:
    """``(model, tokenizer)`` of a shipped stage, the model in fp32 and eval mode."""
    from .checkpoint import load_checkpoint

    path = stage_path(name)
    if not path.is_file():
        raise FileNotFoundError(f"stage {name!r} is not shipped yet ({path.name} missing); available: "
                                f"{', '.join(available_stages()) or 'none'}. Rebuild it with "
                                f"`python -m minimind_ref.stages rebuild {name}`.")
    model, tokenizer = load_checkpoint(path, map_location=device), load_tokenizer()
    check_tokenizer_fits(model.config, tokenizer, path)
    return model, tokenizer


def stage_metadata(name: str) -> Dict[str, Any]:
    """What the shipped file records about how it was made (config, command, metrics).

    The file is verified first: read weights-only (a damaged or truncated file is a one-line
    ``ValueError``), its weights must match the digest ``save_checkpoint`` recorded, and the
    digest ``save_stage`` wrote into ``extra`` (the weights the figures were measured on) must be
    the same: recorded figures are never reported for weights they do not belong to."""
    path = stage_path(name)
    if not path.is_file():
        raise FileNotFoundError(f"stage {name!r} is not shipped yet ({path.name} missing); rebuild it with "
                                f"`python -m minimind_ref.stages rebuild {name}`.")
    blob = _torch_load(path, "cpu")
    if not (isinstance(blob, dict) and isinstance(blob.get("state_dict"), dict) and isinstance(blob.get("extra", {}), dict)):
        raise ValueError(f"{path} is not a stage file (a save_checkpoint file with weights and extra).")
    check_weights(blob["state_dict"], path, digest=blob.get(DIGEST_KEY))
    check_metadata(blob, path)
    extra = dict(blob.get("extra", {}))
    recorded = extra.get(DIGEST_KEY)
    if recorded is not None and recorded != weights_digest(blob["state_dict"]):
        raise ValueError(f"{path}: the figures it records were measured on other weights than the ones it holds (the file "
                         f"was re-saved with new weights and the old metadata); rebuild it with "
                         f"`python -m minimind_ref.stages rebuild {name}`.")
    return extra


def save_stage(model: torch.nn.Module, name: str, extra: Dict[str, Any]) -> Path:
    """Write a stage checkpoint: fp16 weights (as upstream saves them) and ``extra``, plus the
    digest of those weights in ``extra`` (see ``stage_metadata``). A weight beyond float16's range
    is a ``ValueError`` naming it (it would become inf)."""
    import copy

    from .checkpoint import save_checkpoint

    path = stage_path(name)
    for key, tensor in model.state_dict().items():  # fp16 holds magnitudes up to 65,504
        finite = tensor[torch.isfinite(tensor)] if tensor.is_floating_point() else None
        if finite is not None and finite.numel() and float(finite.abs().max()) > torch.finfo(torch.float16).max:
            raise ValueError(f"cannot save stage {name!r}: weight {key!r} holds values up to {float(finite.abs().max()):.4g}, "
                             "beyond float16's range (65,504), and stage files store fp16 weights (as upstream saves "
                             "them). Such weights are rare in a healthy run: check the run's loss; save_checkpoint keeps fp32.")
    path.parent.mkdir(parents=True, exist_ok=True)
    half = copy.deepcopy(model).to("cpu").half()
    # the digest of the weights the figures in ``extra`` belong to (stage_metadata checks it)
    extra = {**extra, DIGEST_KEY: weights_digest(half.state_dict())}
    save_checkpoint(half, str(path), extra=extra)
    return path


# ---------------------------------------------------------------------- rebuilding


def build_base(parent: Optional[torch.nn.Module] = None, tokenizer: Any = None,
               seed: int = 0) -> Tuple[torch.nn.Module, Dict[str, Any], Any]:
    """The ``base`` stage: chapter 08's pretraining run, ``python -m minimind_ref.train --config
    ch08_cpu`` (the tokenizer is trained on the run's corpus and ships beside the weights). Not
    re-run by the seeded rebuild: every lineage starts from the shipped ``base``."""
    from .train import TrainConfig, arithmetic_accuracy, train

    cfg = TrainConfig.from_json("ch08_cpu").replace(progress=False, out_dir=None)
    with torch.random.fork_rng():
        result = train(cfg, log=lambda line: None)
    acc = arithmetic_accuracy(result.model, result.tokenizer, result.data.test_problems, torch.device(cfg.device))
    extra = {"recipe": RECIPES["base"], "command": "python -m minimind_ref.train --config ch08_cpu",
             "train_config": cfg.to_dict(), "metrics": {"final_train_loss_mean20": sum(result.history["loss"][-20:]) / 20,
                                                        "final_val_loss": result.history["eval_loss"][-1],
                                                        "heldout_sum_accuracy_all": acc}}
    return result.model, extra, result.tokenizer


def _recipe(name: str) -> Callable[..., Tuple[torch.nn.Module, Dict[str, Any], Any]]:
    import importlib

    if name not in RECIPES:
        raise ValueError(f"no recipe for stage {name!r}; recipes exist for {', '.join(RECIPES)}.")
    module, function = RECIPES[name].split(":")
    return getattr(importlib.import_module(module), function)


def train_stage(name: str, parent: Optional[torch.nn.Module], tokenizer: Any, seed: int = 0
                ) -> Tuple[torch.nn.Module, Dict[str, Any], Any, float]:
    """Run a stage's recipe on a copy of ``parent`` with ``seed``: ``(model, extra, tokenizer,
    seconds)``. The parent is left as it was."""
    import copy
    import time

    start = time.perf_counter()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        parent_copy = copy.deepcopy(parent) if parent is not None else None
        model, extra, tokenizer = _recipe(name)(parent_copy, tokenizer, seed=seed)
    return model, extra, tokenizer, time.perf_counter() - start


def rebuild(name: str, log: Callable[[str], None] = print, seed: int = 0) -> Path:
    """Re-create a shipped stage from its shipped parent with its recipe, evaluate it (against the
    shipped ``sft`` stage's replies, or its own for ``sft``), save it."""
    from .tokenizer import save_tokenizer

    parent_name = STAGE_INFO[name].parent if name in STAGE_INFO else None
    parent, tokenizer = load_stage(parent_name) if parent_name else (None, None)
    model, extra, tokenizer, seconds = train_stage(name, parent, tokenizer, seed)
    if parent_name is None:
        save_tokenizer(tokenizer, TOKENIZER_FILE)
    reference = None
    if name == "sft":
        reference = reference_replies(model, tokenizer)
    elif stage_path("sft").is_file():
        reference = reference_replies(load_stage("sft")[0], tokenizer)
    extra = {**extra, "stage": name, "parent": parent_name, "seconds": round(seconds, 1),
             "evaluate_chat": evaluate_chat(model, tokenizer, reference), "torch": str(torch.__version__)}
    path = save_stage(model, name, extra)
    log(f"rebuilt {name} in {seconds:.0f} s -> {path}")
    return path


# ---------------------------------------------------------------------- seeds


def rebuild_seeds(seeds: Sequence[int] = (0, 1, 2), ship_seed: Optional[int] = 0, out: Optional[Path] = SEEDS_FILE,
                  log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Every post-training stage trained from its parent with each seed, and every model evaluated.

    Lineage ``s``: ``sft`` from the shipped ``base`` with seed ``s``; ``lora``, ``dpo`` and
    ``grpo`` from that ``sft`` model with seed ``s``. Each model gets ``evaluate_chat`` with the
    lineage's ``sft`` replies as reference (``base`` too, once per lineage). The models of seed
    ``ship_seed`` are saved as the shipped stages (None: nothing is saved). Returns (and writes to
    ``out``, JSON) ``{"seeds": [...], "stages": {stage: {seed: {"metrics": ..., "seconds": ...}}}}``."""
    import json

    base, tokenizer = load_stage("base")
    record: Dict[str, Any] = {"command": "python -m minimind_ref.stages rebuild --seeds " + ",".join(map(str, seeds)),
                              "seeds": list(seeds), "torch": str(torch.__version__),
                              "stages": {name: {} for name in ("base",) + SEEDED_STAGES}}
    for seed in seeds:
        sft_model, sft_extra, _, seconds = train_stage("sft", base, tokenizer, seed)
        reference = reference_replies(sft_model, tokenizer)
        models = {"sft": (sft_model, sft_extra, seconds)}
        for name in SEEDED_STAGES[1:]:
            model, extra, _, seconds = train_stage(name, sft_model, tokenizer, seed)
            models[name] = (model, extra, seconds)
        record["stages"]["base"][str(seed)] = {"metrics": evaluate_chat(base, tokenizer, reference), "seconds": 0.0}
        for name, (model, extra, seconds) in models.items():
            metrics = evaluate_chat(model, tokenizer, reference)
            record["stages"][name][str(seed)] = {"metrics": metrics, "seconds": round(seconds, 1),
                                                 "stage_metrics": extra.get("metrics", {})}
            log(f"seed {seed}: {name} trained in {seconds:.0f} s; " + ", ".join(
                f"{k} {metrics[k]:.3f}" for k in REPORT_KEYS if k in metrics))
            if seed == ship_seed:
                extra = {**extra, "stage": name, "parent": STAGE_INFO[name].parent, "seconds": round(seconds, 1),
                         "evaluate_chat": metrics, "torch": str(torch.__version__)}
                save_stage(model, name, extra)
        if out is not None:
            Path(out).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return record



# ---------------------------------------------------------------------- report rows
def stage_rows(stages: Sequence[str] = STAGES, evaluate: Callable[..., Dict[str, float]] = evaluate_chat) -> List[Dict[str, Any]]:
    """One row per available shipped stage: its name, chapter and ``evaluate_chat`` metrics
    (against the shipped ``sft`` stage's replies when it is shipped)."""
    reference = None
    if stage_path("sft").is_file() and evaluate is evaluate_chat:
        model, tokenizer = load_stage("sft")
        reference = reference_replies(model, tokenizer)
    rows = []
    for name in stages:
        if not stage_path(name).is_file():
            continue
        model, tokenizer = load_stage(name)
        metrics = evaluate(model, tokenizer, reference) if reference is not None else evaluate(model, tokenizer)
        rows.append({"stage": name, "chapter": STAGE_INFO[name].chapter, **metrics})
    return rows


def recorded_rows(stages: Sequence[str] = STAGES) -> List[Dict[str, Any]]:
    """The same rows as ``stage_rows``, from the ``evaluate_chat`` figures each shipped file
    recorded when it was built (no model is run)."""
    rows = []
    for name in stages:
        if stage_path(name).is_file():
            figures = stage_metadata(name).get("evaluate_chat")
            # every version of evaluate_chat records these two (base.pt keeps chapter 08's older figures)
            if not isinstance(figures, dict) or not {"sum_accuracy", "stop_rate"} <= set(figures):
                raise ValueError(f"{stage_path(name)} records no evaluate_chat figures: it was not made by "
                                 "`python -m minimind_ref.stages rebuild`. Run the report without --recorded, or "
                                 "rebuild the stage.")
            rows.append({"stage": name, "chapter": STAGE_INFO[name].chapter, **figures})
    return rows



def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minimind_ref.stages", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="render the stage report (the seeded record, or a fresh evaluation)")
    rep.add_argument("--out", default=None, help="write the table to this file instead of printing it")
    rep.add_argument("--figure", default=None, help="also draw the report's figure (PNG) to this file")
    rep.add_argument("--seeds-file", default=None, help=f"the seeded record (default {SEEDS_FILE.name} beside the checkpoints)")
    rep.add_argument("--recorded", action="store_true",
                     help="one row per shipped stage, from the figures each file recorded")
    rep.add_argument("--evaluate", action="store_true", help="one row per shipped stage, re-evaluated on this machine")
    reb = sub.add_parser("rebuild", help="re-create shipped stage checkpoints with their recipes (in stage order)")
    reb.add_argument("stages", nargs="*", default=None, help=f"stages to rebuild (default: all of {', '.join(SEEDED_STAGES)})")
    reb.add_argument("--seeds", default=None,
                     help="comma-separated seeds, e.g. 0,1,2: train every post-training stage with each (lineages "
                          "from the shipped base), record every seed's metrics, ship the first seed's models")
    args = p.parse_args(argv)
    if args.command == "rebuild":
        if args.seeds:
            try:
                seeds = [int(x) for x in args.seeds.split(",")]
            except ValueError:
                p.error(f"--seeds takes comma-separated integers, e.g. --seeds 0,1,2; got {args.seeds!r}.")
            if len(set(seeds)) != len(seeds) or min(seeds) < 0:
                p.error(f"--seeds must name each seed once, each >= 0; got {args.seeds!r}.")
            rebuild_seeds(seeds)
        else:
            for name in args.stages or list(SEEDED_STAGES):
                rebuild(name)
    if args.command == "report":
        from .files import check_writable

        for path, what in ((args.out, "--out (the report's table)"), (args.figure, "--figure (the report's PNG)")):
            if path:  # before any evaluation: a folder or an unwritable place fails now, not after minutes
                check_writable(path, what)
        with torch.inference_mode(False):
            if args.recorded or args.evaluate:
                table = render_markdown(recorded_rows() if args.recorded else stage_rows())
            else:
                records = load_seed_records(Path(args.seeds_file) if args.seeds_file else None)
                table = render_seed_report(records)
                if args.figure:
                    render_seed_figure(records, Path(args.figure))
        if args.out:
            from .files import write_text

            write_text(args.out, table)  # atomic
        else:
            print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
