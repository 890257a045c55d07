"""The course model at every stage (base, SFT, LoRA, DPO, GRPO), the one held-out evaluation that
the stage report runs on each of them, and the report over seeds.

The post-training chapters start from checkpoints the course's own code made: chapter 08's
pretraining config gives ``base``, chapter 09's SFT run on ``base`` gives ``sft``, and ``lora``,
``dpo`` and ``grpo`` start from ``sft``. The files ship with the package
(``minimind_ref/checkpoints/``, fp16 weights as upstream saves them, plus the tokenizer), each with
the config, command and metrics that produced it, so a chapter runs standalone.

``evaluate_chat(model, tokenizer, reference)`` is the stage report's measurement, on held-out
prompts only (``chat_data.heldout_exchanges``: distinct prompts no stage trained on), greedy:

* ``<kind>_accuracy`` for ``sum`` (200 held-out problems), ``story`` (80), ``identity`` (22
  paraphrases), ``refusal`` (49 requests) and chapter 10's ``double`` (36), with the counts
  ``<kind>_n`` and the mean reply length ``<kind>_length``;
* ``stop_rate`` and ``mean_length`` (tokens up to ``<|im_end|>`` or the budget) over the chat prompts;
* ``preference_accuracy`` (held-out pairs whose chosen reply has the higher mean log-probability
  per token; near 100 % for any chat model, since the rejected replies are easy to tell) and
  ``preference_margin`` (the mean gap of the summed log-probabilities, chosen minus rejected: it
  keeps moving when the accuracy cannot);
* ``win_rate``: on the held-out prompts the ``reference`` model (the report uses the lineage's
  SFT model) answers wrongly, the share where the evaluated model gives the right answer a
  higher log-probability than the reference's own reply (``win_rate_n`` such prompts).

The report is over seeds: ``python -m minimind_ref.stages rebuild --seeds 0,1,2`` trains every
post-training stage from its parent with each seed (lineages from the shipped ``base``),
evaluates every model, records each seed's metrics in ``checkpoints/stage_seeds.json`` and ships
the first seed's models. ``render_seed_report`` shows mean and range per cell and marks the
changes that exceed the seed range; ``stage_effect`` / ``check_claim`` let a chapter (or a test)
state a stage's effect only if the record supports it.

    python -m minimind_ref.stages rebuild --seeds 0,1,2   # the seeded rebuild (not part of make test)
    python -m minimind_ref.stages report --out FILE --figure PNG   # the report from the seed record
    python -m minimind_ref.stages report --evaluate       # one row per shipped stage, re-evaluated here
    python -m minimind_ref.stages rebuild [stage]         # re-create one shipped stage (seed 0)
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
from .sft import assistant_loss_mask, encode_chat, generate_replies, marker_ids, merged_newline_ids

CHECKPOINT_DIR = Path(__file__).with_name("checkpoints")
TOKENIZER_FILE = CHECKPOINT_DIR / "tokenizer.json"
STAGES = ("base", "sft", "lora", "dpo", "grpo")
EVAL_MAX_NEW_TOKENS = 128  # the identity reply is 97 tokens and the refusal 69 with the course tokenizer


# ---------------------------------------------------------------------- evaluation
@torch.no_grad()
def reply_logprobs(model: torch.nn.Module, tokenizer: Any, conversations: Sequence[Sequence[Dict[str, str]]],
                   batch_size: int = 64) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per conversation, ``(sum, count)``: the summed log-probability of its assistant tokens (the
    reply, ``<|im_end|>`` and the newline after it: upstream's loss mask) and their number,
    ``[n]`` float32 each. ``sum / count`` is the mean per token."""
    device = next(model.parameters()).device
    bos, eos = marker_ids(tokenizer)
    merged = merged_newline_ids(tokenizer)
    encoded = [encode_chat(tokenizer, c) for c in conversations]
    sums, counts = [], []
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
                m[i, : len(ids)] = torch.tensor(assistant_loss_mask(ids, bos, eos, width, merged), dtype=torch.float)
            x, m = x.to(device), m.to(device)
            logp = F.log_softmax(model(x).logits[:, :-1].float(), dim=-1).gather(-1, x[:, 1:, None]).squeeze(-1)
            mask = m[:, 1:]
            sums.append((logp * mask).sum(1).cpu())
            counts.append(mask.sum(1).cpu())
    finally:
        model.train(was_training)
    return torch.cat(sums), torch.cat(counts)


def mean_logprobs(model: torch.nn.Module, tokenizer: Any, conversations: Sequence[Sequence[Dict[str, str]]],
                  batch_size: int = 64) -> torch.Tensor:
    """Per conversation, the mean log-probability per assistant token (``reply_logprobs``), ``[n]``."""
    total, count = reply_logprobs(model, tokenizer, conversations, batch_size)
    return total / count.clamp_min(1.0)


def score_reply(exchange: chat_data.Exchange, reply: str) -> bool:
    """Whether a reply is the whole right answer (exact, after stripping whitespace)."""
    return reply.strip() == exchange.answer.strip()


def heldout_prompts(n_per_kind: Optional[int] = None) -> List[chat_data.Exchange]:
    """Every prompt the stage report asks (all held out): ``chat_data.heldout_exchanges`` of each
    kind, then chapter 10's doubling prompts (``chat_data.double_eval_exchanges("test")``);
    ``n_per_kind``: only the first ``n_per_kind`` of each (a quicker, noisier look for a chapter)."""
    if n_per_kind is not None and (isinstance(n_per_kind, bool) or not isinstance(n_per_kind, int) or n_per_kind < 1):
        raise ValueError(f"n_per_kind must be a whole number >= 1 (or None: every held-out prompt), got {n_per_kind!r}.")
    out: List[chat_data.Exchange] = []
    for kind in chat_data.KINDS:
        out += chat_data.heldout_exchanges(kind)[:n_per_kind]
    return out + chat_data.double_eval_exchanges("test")[:n_per_kind]


def reference_replies(model: torch.nn.Module, tokenizer: Any,
                      max_new_tokens: int = EVAL_MAX_NEW_TOKENS) -> Dict[str, str]:
    """A model's greedy replies to the report's held-out prompts, ``{user prompt: reply}``: what
    ``evaluate_chat(..., reference=...)`` pits the evaluated model's answers against."""
    prompts = heldout_prompts()
    replies = generate_replies(model, tokenizer, [[{"role": "user", "content": ex.user}] for ex in prompts],
                               max_new_tokens=max_new_tokens)
    return {ex.user: r["text"] for ex, r in zip(prompts, replies)}


def own_reply_pairs(exchanges: Sequence[chat_data.Exchange], replies: Dict[str, str]) -> List[Dict[str, Any]]:
    """DPO-shaped pairs ``{"chosen": right answer, "rejected": the reference's reply}`` for every
    exchange whose reference reply (``replies[exchange.user]``) is wrong."""
    out = []
    for ex in exchanges:
        reply = replies.get(ex.user)
        if reply is None or score_reply(ex, reply):
            continue
        user = [{"role": "user", "content": ex.user}]
        out.append({"chosen": user + [{"role": "assistant", "content": ex.answer}],
                    "rejected": user + [{"role": "assistant", "content": reply}], "kind": ex.kind})
    return out


def evaluate_chat(model: torch.nn.Module, tokenizer: Any, reference: Optional[Dict[str, str]] = None,
                  n_pairs: int = 160, max_new_tokens: int = EVAL_MAX_NEW_TOKENS,
                  n_per_kind: Optional[int] = None) -> Dict[str, float]:
    """The stage report's held-out evaluation of one model (greedy decoding; see the module
    docstring for the metrics). ``reference``: another model's ``reference_replies`` (the
    report passes the SFT model's of the same seed) for ``win_rate``. ``n_per_kind`` and
    ``n_pairs`` evaluate on the first prompts / pairs only (the report uses them all).
    Deterministic for a given model and machine."""
    prompts = heldout_prompts(n_per_kind)
    replies = generate_replies(model, tokenizer, [[{"role": "user", "content": ex.user}] for ex in prompts],
                               max_new_tokens=max_new_tokens)
    metrics: Dict[str, float] = {}
    chat = [(ex, r) for ex, r in zip(prompts, replies) if ex.kind != "double"]
    for kind in chat_data.KINDS + ("double",):
        scored = [(score_reply(ex, r["text"]), len(r["ids"])) for ex, r in zip(prompts, replies) if ex.kind == kind]
        metrics[f"{kind}_accuracy"] = sum(ok for ok, _ in scored) / len(scored)
        metrics[f"{kind}_n"] = float(len(scored))
        metrics[f"{kind}_length"] = sum(n for _, n in scored) / len(scored)
    metrics["stop_rate"] = sum(r["stopped"] for _, r in chat) / len(chat)
    metrics["mean_length"] = sum(len(r["ids"]) for _, r in chat) / len(chat)
    pairs = chat_data.dpo_preference_pairs(n_pairs, seed=0, split="test")
    chosen, n_chosen = reply_logprobs(model, tokenizer, [p["chosen"] for p in pairs])
    rejected, n_rejected = reply_logprobs(model, tokenizer, [p["rejected"] for p in pairs])
    metrics["preference_accuracy"] = float((chosen / n_chosen > rejected / n_rejected).float().mean())
    metrics["preference_margin"] = float((chosen - rejected).mean())
    metrics["preference_n"] = float(len(pairs))
    if reference is not None:
        own = own_reply_pairs(prompts, reference)
        metrics["win_rate_n"] = float(len(own))
        if own:
            c, _ = reply_logprobs(model, tokenizer, [p["chosen"] for p in own])
            r, _ = reply_logprobs(model, tokenizer, [p["rejected"] for p in own])
            metrics["win_rate"] = float((c > r).float().mean())
            metrics["win_margin"] = float((c - r).mean())
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
SEEDS_FILE = CHECKPOINT_DIR / "stage_seeds.json"
SEEDED_STAGES = ("sft", "lora", "dpo", "grpo")


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


def load_seed_records(path: Optional[Path] = None) -> Dict[str, Any]:
    """The seeded rebuild's record (``rebuild_seeds``), shipped beside the checkpoints."""
    import json

    path = Path(path) if path is not None else SEEDS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no seed record at {path}: run `python -m minimind_ref.stages rebuild --seeds 0,1,2`.")
    return json.loads(path.read_text(encoding="utf-8"))


def seed_values(records: Dict[str, Any], stage: str, metric: str) -> List[float]:
    """The values of ``metric`` for ``stage`` over the recorded seeds (in seed order)."""
    per_seed = records["stages"].get(stage, {})
    if not per_seed:
        raise ValueError(f"the seed record has no stage {stage!r}; it has {', '.join(records['stages'])}.")
    out = []
    for seed in sorted(per_seed, key=int):
        metrics = per_seed[seed]["metrics"]
        if metric not in metrics:
            raise ValueError(f"the seed record of {stage!r} has no metric {metric!r}; it has {', '.join(sorted(metrics))}.")
        out.append(float(metrics[metric]))
    return out


def stage_effect(stage: str, metric: str, records: Optional[Dict[str, Any]] = None,
                 parent: Optional[str] = None) -> Dict[str, Any]:
    """How ``stage`` changed ``metric`` relative to its parent stage (or ``parent``), over the
    recorded seeds: ``mean`` / ``parent_mean`` / ``change`` (child mean - parent mean),
    ``range`` / ``parent_range`` (min, max) and ``direction``: ``"up"`` when every seed of the
    stage lies above every seed of the parent (the ranges do not overlap), ``"down"`` in the
    opposite case, ``"within range"`` when the ranges overlap."""
    records = records if records is not None else load_seed_records()
    parent = parent or STAGE_INFO[stage].parent
    if parent is None:
        raise ValueError(f"stage {stage!r} has no parent to compare with; pass parent=...")
    child, before = seed_values(records, stage, metric), seed_values(records, parent, metric)
    if min(child) > max(before):
        direction = "up"
    elif max(child) < min(before):
        direction = "down"
    else:
        direction = "within range"
    return {"stage": stage, "parent": parent, "metric": metric, "mean": sum(child) / len(child),
            "parent_mean": sum(before) / len(before), "change": sum(child) / len(child) - sum(before) / len(before),
            "range": (min(child), max(child)), "parent_range": (min(before), max(before)), "direction": direction,
            "seeds": len(child)}


def check_claim(stage: str, metric: str, claim: str, records: Optional[Dict[str, Any]] = None,
                parent: Optional[str] = None) -> str:
    """Assert that the recorded seeds support a chapter's claim about a stage's effect, and return
    it as a sentence. ``claim``: ``"up"`` / ``"down"`` (beyond the seed range) or ``"within
    range"`` (no change beyond it). Raises ``AssertionError`` naming the recorded figures
    otherwise, so a chapter cannot state an effect the report does not show."""
    if claim not in ("up", "down", "within range"):
        raise ValueError(f"claim must be 'up', 'down' or 'within range', got {claim!r}.")
    e = stage_effect(stage, metric, records, parent)
    fmt = _fmt(metric)
    sentence = (f"{e['stage']} vs {e['parent']}, {metric}: {fmt(e['parent_mean'])} -> {fmt(e['mean'])} "
                f"(seed ranges {fmt(e['parent_range'][0])}-{fmt(e['parent_range'][1])} and "
                f"{fmt(e['range'][0])}-{fmt(e['range'][1])}, {e['seeds']} seeds): {e['direction']}")
    assert e["direction"] == claim, f"the recorded seeds do not show '{claim}': {sentence}"
    return sentence


# ---------------------------------------------------------------------- the report
#: the stage report's columns: (metric, header, "pct" or "num")
REPORT_COLUMNS: Tuple[Tuple[str, str, str], ...] = (
    ("sum_accuracy", "held-out sums", "pct"),
    ("story_accuracy", "stories", "pct"),
    ("identity_accuracy", "identity", "pct"),
    ("refusal_accuracy", "refusals", "pct"),
    ("double_accuracy", "doubling (ch. 10)", "pct"),
    ("stop_rate", "stops at `<\\|im_end\\|>`", "pct"),
    ("preference_margin", "preference margin (nats)", "num"),
    ("win_rate", "wins vs SFT's replies", "pct"),
    ("mean_length", "reply length (tokens)", "num"),
)
REPORT_KEYS = tuple(c[0] for c in REPORT_COLUMNS)
METRICS = REPORT_KEYS

#: What the chapters state about each stage's effect, as ``(stage, metric, "up" | "down" | "within
#: range")`` against the stage's parent over the recorded seeds (``check_claim``). tests/test_stage_report.py
#: checks every entry against the shipped record; a chapter that states an effect adds it here.
STAGE_CLAIMS: List[Tuple[str, str, str]] = [
    # chapter 09: base -> sft
    ("sft", "sum_accuracy", "up"), ("sft", "identity_accuracy", "up"), ("sft", "refusal_accuracy", "up"),
    ("sft", "stop_rate", "up"), ("sft", "preference_margin", "up"), ("sft", "story_accuracy", "within range"),
    # chapter 10: sft -> lora (the new skill, and what it costs)
    ("lora", "double_accuracy", "up"), ("lora", "sum_accuracy", "down"), ("lora", "preference_margin", "down"),
    ("lora", "refusal_accuracy", "within range"), ("lora", "identity_accuracy", "within range"),
    ("lora", "stop_rate", "within range"),
    # chapter 11: sft -> dpo (preferences move, refusals are kept)
    ("dpo", "preference_margin", "up"), ("dpo", "win_rate", "up"), ("dpo", "refusal_accuracy", "within range"),
    ("dpo", "sum_accuracy", "within range"), ("dpo", "mean_length", "within range"),
    # chapter 12: sft -> grpo (a greedy gain on held-out sums)
    ("grpo", "sum_accuracy", "up"), ("grpo", "win_rate", "up"), ("grpo", "refusal_accuracy", "within range"),
    ("grpo", "stop_rate", "within range"),
]


def _fmt(metric: str) -> Callable[[float], str]:
    kind = dict((k, t) for k, _, t in REPORT_COLUMNS).get(metric, "pct" if "accuracy" in metric or "rate" in metric else "num")
    return (lambda v: f"{100 * v:.1f}%") if kind == "pct" else (lambda v: f"{v:.1f}")


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


def render_markdown(rows: Sequence[Dict[str, Any]]) -> str:
    """One value per stage and column (e.g. ``stage_rows``), as a markdown table."""
    header = "| stage | chapter | " + " | ".join(h for _, h, _ in REPORT_COLUMNS) + " |"
    lines = [header, "| --- | --- |" + " ---: |" * len(REPORT_COLUMNS)]
    for r in rows:
        cells = [_fmt(k)(r[k]) if k in r else "–" for k in REPORT_KEYS]
        lines.append(f"| {r['stage']} | {r['chapter']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_seed_report(records: Dict[str, Any]) -> str:
    """The stage report over seeds, as markdown: per stage and column the mean and, below it, the
    range (min-max) over the seeds; ▲ / ▼ where every seed of a stage lies above / below every
    seed of its parent stage (``stage_effect``); then the number of held-out prompts per column."""
    seeds = records["seeds"]
    header = "| stage | chapter | " + " | ".join(h for _, h, _ in REPORT_COLUMNS) + " |"
    lines = [header, "| --- | --- |" + " ---: |" * len(REPORT_COLUMNS)]
    for name in STAGES:
        if not records["stages"].get(name):
            continue
        cells = []
        for key in REPORT_KEYS:
            if key == "win_rate" and name == "base":  # against the SFT model's wrong replies: SFT's measure
                cells.append("–")
                continue
            try:
                values = seed_values(records, name, key)
            except ValueError:
                cells.append("–")
                continue
            fmt = _fmt(key)
            mark = ""
            own = key == "win_rate" and name == "sft"  # its own replies are the reference: low by construction
            if STAGE_INFO[name].parent and records["stages"].get(STAGE_INFO[name].parent) and not own:
                try:
                    direction = stage_effect(name, key, records)["direction"]
                    mark = {"up": " ▲", "down": " ▼"}.get(direction, "")
                except ValueError:
                    pass
            mean = sum(values) / len(values)
            cells.append(f"{fmt(mean)}{mark}<br>({fmt(min(values))}–{fmt(max(values))})")
        lines.append(f"| {name} | {STAGE_INFO[name].chapter} | " + " | ".join(cells) + " |")
    first = records["stages"]["sft"][str(seeds[0])]["metrics"] if records["stages"].get("sft") else {}
    counts = {"sum_accuracy": "sum_n", "story_accuracy": "story_n", "identity_accuracy": "identity_n",
              "refusal_accuracy": "refusal_n", "double_accuracy": "double_n", "preference_margin": "preference_n",
              "win_rate": "win_rate_n"}
    n_cells = [f"{int(first[counts[k]])}" if k in counts and counts[k] in first else "" for k in REPORT_KEYS]
    lines.append("| held-out prompts | | " + " | ".join(n_cells) + " |")
    legend = (f"\nMean over {len(seeds)} seeds ({', '.join(map(str, seeds))}), range (min–max) below it. "
              "▲ / ▼: every seed of the stage lies above / below every seed of its parent stage (`base` for "
              "`sft`, `sft` for the others). `base` is one model (chapter 08's), evaluated once per lineage. The win "
              "rate is measured on the held-out prompts the lineage's SFT model answers wrongly, against that "
              "model's own replies (so `sft`'s own win rate is low by construction, and the number of such "
              f"prompts varies by seed; seed {seeds[0]}'s count is shown).\n")
    return "\n".join(lines) + "\n" + legend


def render_seed_figure(records: Dict[str, Any], path: Path) -> Path:
    """The report's figure: per stage, the mean of each accuracy column with its seed range."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    columns = [(k, h) for k, h, t in REPORT_COLUMNS if t == "pct"]
    names = [n for n in STAGES if records["stages"].get(n)]
    fig, ax = plt.subplots(figsize=(10, 4.2))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        means, lows, highs = [], [], []
        for key, _ in columns:
            if key == "win_rate" and name == "base":  # as in the table: the SFT model's measure
                means.append(float("nan"))
                lows.append(0.0)
                highs.append(0.0)
                continue
            v = seed_values(records, name, key)
            m = sum(v) / len(v)
            means.append(100 * m)
            lows.append(100 * (m - min(v)))
            highs.append(100 * (max(v) - m))
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(columns))]
        ax.bar(xs, means, width, yerr=[lows, highs], capsize=2, label=name)
    ax.set_xticks(range(len(columns)))
    ax.set_xticklabels([h.replace("`<\\|im_end\\|>`", "<|im_end|>") for _, h in columns], fontsize=8)
    ax.set_ylabel("% of held-out prompts")
    ax.set_ylim(0, 105)
    ax.set_title(f"The stage report: mean and range over {len(records['seeds'])} seeds")
    ax.legend(ncol=len(names), fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
            rebuild_seeds([int(x) for x in args.seeds.split(",")])
        else:
            for name in args.stages or list(SEEDED_STAGES):
                rebuild(name)
    if args.command == "report":
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
