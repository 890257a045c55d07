"""The course model at every stage (base, SFT, LoRA, DPO, GRPO), and the one held-out evaluation
that the stage report runs on each of them.

The post-training chapters start from checkpoints the course's own code made: chapter 08's
pretraining config gives ``base``, chapter 09's SFT run on ``base`` gives ``sft``, and so on. The
files ship with the package (``minimind_ref/checkpoints/``, fp16 weights as upstream saves them,
plus the tokenizer), each with the config, command and metrics that produced it, so a chapter
runs standalone and ``python -m minimind_ref.stages rebuild`` re-creates them.

``evaluate_chat(model, tokenizer)`` is the stage report's measurement, on held-out data only
(``minimind_ref.chat_data``, test split):

* ``sum_accuracy``: whole answers exactly right on held-out additions asked in chat (greedy);
* ``stop_rate``: replies that end with ``<|im_end|>`` within the token budget (all prompt kinds);
* ``preference_accuracy``: held-out preference pairs whose chosen reply has the higher mean
  log-probability per token (the quantity upstream's DPO compares);
* ``mean_length``: average reply length in tokens (up to ``<|im_end|>`` or the budget);
* per-kind accuracies for the other prompts (stories, identity, refusals) as extras.

    python -m minimind_ref.stages report            # the table, as markdown (re-evaluates every stage)
    python -m minimind_ref.stages report --recorded # the same, from the figures the shipped files recorded
    python -m minimind_ref.stages rebuild [stage]   # re-create shipped checkpoints
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from . import chat_data
from .checkpoint import _torch_load, check_metadata, check_tokenizer_fits, check_weights
from .files import DIGEST_KEY, weights_digest
from .sft import assistant_loss_mask, encode_chat, generate_replies, marker_ids

CHECKPOINT_DIR = Path(__file__).with_name("checkpoints")
TOKENIZER_FILE = CHECKPOINT_DIR / "tokenizer.json"
STAGES = ("base", "sft", "lora", "dpo", "grpo")
METRICS = ("sum_accuracy", "stop_rate", "preference_accuracy", "mean_length")
EVAL_MAX_NEW_TOKENS = 128  # the identity reply is 97 tokens and the refusal 69 with the course tokenizer


# ---------------------------------------------------------------------- evaluation
@torch.no_grad()
def mean_logprobs(model: torch.nn.Module, tokenizer: Any, conversations: Sequence[Sequence[Dict[str, str]]],
                  batch_size: int = 64) -> torch.Tensor:
    """Per conversation, the mean log-probability per token of its assistant tokens (the reply,
    ``<|im_end|>`` and the newline after it: upstream's loss mask), ``[n]`` float32."""
    device = next(model.parameters()).device
    bos, eos = marker_ids(tokenizer)
    encoded = [encode_chat(tokenizer, c) for c in conversations]
    out = []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(encoded), batch_size):
            rows = encoded[start : start + batch_size]
            width = max(len(r) for r in rows)
            x = torch.zeros(len(rows), width, dtype=torch.long)
            m = torch.zeros(len(rows), width)
            for i, ids in enumerate(rows):
                x[i, : len(ids)] = torch.tensor(ids)
                m[i, : len(ids)] = torch.tensor(assistant_loss_mask(ids, bos, eos, width), dtype=torch.float)
            x, m = x.to(device), m.to(device)
            logp = F.log_softmax(model(x).logits[:, :-1].float(), dim=-1).gather(-1, x[:, 1:, None]).squeeze(-1)
            mask = m[:, 1:]
            out.append((logp * mask).sum(1) / mask.sum(1).clamp_min(1.0))
    finally:
        model.train(was_training)
    return torch.cat(out).cpu()


def score_reply(exchange: chat_data.Exchange, reply: str) -> bool:
    """Whether a reply is the whole right answer (exact, after stripping whitespace)."""
    return reply.strip() == exchange.answer.strip()


def evaluate_chat(model: torch.nn.Module, tokenizer: Any, n_per_kind: int = 50, n_pairs: int = 150,
                  max_new_tokens: int = EVAL_MAX_NEW_TOKENS, seed: int = 0) -> Dict[str, float]:
    """The stage report's held-out evaluation of one model (greedy decoding; see the module
    docstring for the metrics). Deterministic for a given model and machine."""
    exchanges = chat_data.eval_exchanges(n_per_kind, seed=seed)
    conversations = [[{"role": "user", "content": ex.user}] for ex in exchanges]
    replies = generate_replies(model, tokenizer, conversations, max_new_tokens=max_new_tokens)
    metrics: Dict[str, float] = {}
    for kind in ("sum", "story", "identity", "refusal"):
        scored = [score_reply(ex, r["text"]) for ex, r in zip(exchanges, replies) if ex.kind == kind]
        if scored:
            metrics[f"{kind}_accuracy"] = sum(scored) / len(scored)
    metrics["stop_rate"] = sum(r["stopped"] for r in replies) / len(replies)
    metrics["mean_length"] = sum(len(r["ids"]) for r in replies) / len(replies)
    pairs = chat_data.preference_pairs(n_pairs, seed=seed, split="test")
    chosen = mean_logprobs(model, tokenizer, [p["chosen"] for p in pairs])
    rejected = mean_logprobs(model, tokenizer, [p["rejected"] for p in pairs])
    metrics["preference_accuracy"] = float((chosen > rejected).float().mean())
    return metrics


# ---------------------------------------------------------------------- shipped checkpoints
@dataclass
class Stage:
    """How a stage's model is made and loaded."""

    name: str
    file: str
    parent: Optional[str]
    chapter: str
    description: str


STAGE_INFO: Dict[str, Stage] = {
    "base": Stage("base", "base.pt", None, "08", "chapter 08's pretraining run (config ch08_cpu)"),
    "sft": Stage("sft", "sft.pt", "base", "09", "supervised fine-tuning on generated conversations"),
    "lora": Stage("lora", "lora.pt", "sft", "10", "the SFT model with a LoRA adapter merged in"),
    "dpo": Stage("dpo", "dpo.pt", "sft", "11", "DPO on generated preference pairs"),
    "grpo": Stage("grpo", "grpo.pt", "sft", "12", "GRPO with a verifiable reward (sums)"),
}


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
# Each stage's recipe: "module:function" taking (parent model or None, tokenizer or None) and
# returning (model, extra, tokenizer). The recipe lives with the stage's chapter code.
RECIPES: Dict[str, str] = {
    "base": "minimind_ref.stages:build_base",
    "sft": "minimind_ref.sft:build_stage",
    "lora": "minimind_ref.lora:build_stage",
    "dpo": "minimind_ref.dpo:build_stage",
    "grpo": "minimind_ref.grpo:build_stage",
}


def build_base(parent: Optional[torch.nn.Module] = None, tokenizer: Any = None) -> Tuple[torch.nn.Module, Dict[str, Any], Any]:
    """The ``base`` stage: chapter 08's pretraining run, ``python -m minimind_ref.train --config
    ch08_cpu`` (the tokenizer is trained on the run's corpus and ships beside the weights)."""
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


def rebuild(name: str, log: Callable[[str], None] = print) -> Path:
    """Re-create a shipped stage from its parent with its recipe, evaluate it, save it."""
    import importlib
    import time

    from .tokenizer import save_tokenizer

    if name not in RECIPES:
        raise ValueError(f"no recipe for stage {name!r} yet; recipes exist for {', '.join(RECIPES)}.")
    parent_name = STAGE_INFO[name].parent
    parent, tokenizer = load_stage(parent_name) if parent_name else (None, None)
    module, function = RECIPES[name].split(":")
    start = time.perf_counter()
    model, extra, tokenizer = getattr(importlib.import_module(module), function)(parent, tokenizer)
    seconds = time.perf_counter() - start
    if parent_name is None:
        save_tokenizer(tokenizer, TOKENIZER_FILE)
    extra = {**extra, "stage": name, "parent": parent_name, "evaluate_chat": evaluate_chat(model, tokenizer),
             "torch": str(torch.__version__)}
    path = save_stage(model, name, extra)
    log(f"rebuilt {name} in {seconds:.0f} s -> {path}")
    return path


# ---------------------------------------------------------------------- the report
def stage_rows(stages: Sequence[str] = STAGES, evaluate: Callable[..., Dict[str, float]] = evaluate_chat) -> List[Dict[str, Any]]:
    """One row per available stage: its name, chapter and ``evaluate_chat`` metrics."""
    rows = []
    for name in stages:
        if not stage_path(name).is_file():
            continue
        model, tokenizer = load_stage(name)
        rows.append({"stage": name, "chapter": STAGE_INFO[name].chapter, **evaluate(model, tokenizer)})
    return rows


def recorded_rows(stages: Sequence[str] = STAGES) -> List[Dict[str, Any]]:
    """The same rows as ``stage_rows``, from the ``evaluate_chat`` figures each shipped file
    recorded when ``rebuild`` made it (no model is run; equal to ``stage_rows`` on the machine
    that built the files)."""
    rows = []
    for name in stages:
        if stage_path(name).is_file():
            figures = stage_metadata(name).get("evaluate_chat")
            if not isinstance(figures, dict) or not set(METRICS) <= set(figures):
                raise ValueError(f"{stage_path(name)} records no evaluate_chat figures (or not all of {', '.join(METRICS)}): "
                                 "it was not made by `python -m minimind_ref.stages rebuild`. Run the report without "
                                 "--recorded, or rebuild the stage.")
            rows.append({"stage": name, "chapter": STAGE_INFO[name].chapter, **figures})
    return rows


def render_markdown(rows: Sequence[Dict[str, Any]]) -> str:
    """The stage report as a markdown table (percentages with one decimal, length in tokens)."""
    header = ("| stage | chapter | whole-answer accuracy (held-out sums) | stops at `<\\|im_end\\|>` | "
              "preference accuracy | mean reply length (tokens) |")
    lines = [header, "| --- | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['stage']} | {r['chapter']} | {100 * r['sum_accuracy']:.1f}% | {100 * r['stop_rate']:.1f}% | "
                     f"{100 * r['preference_accuracy']:.1f}% | {r['mean_length']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minimind_ref.stages", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="evaluate every shipped stage and print (or write) the markdown table")
    rep.add_argument("--out", default=None, help="write the table to this file instead of printing it")
    rep.add_argument("--recorded", action="store_true",
                     help="use the figures each shipped file recorded when it was built instead of re-evaluating")
    reb = sub.add_parser("rebuild", help="re-create shipped stage checkpoints with their recipes (in stage order)")
    reb.add_argument("stages", nargs="*", default=None, help=f"stages to rebuild (default: all of {', '.join(RECIPES)})")
    args = p.parse_args(argv)
    if args.command == "rebuild":
        for name in args.stages or [s for s in STAGES if s in RECIPES]:
            rebuild(name)
    if args.command == "report":
        with torch.inference_mode(False):
            table = render_markdown(recorded_rows() if args.recorded else stage_rows())
        if args.out:
            from .files import write_text

            write_text(args.out, table)  # atomic
        else:
            print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
