"""The training loop of every stage (pretraining, SFT, LoRA, DPO, GRPO), its pieces, and a
command line that also runs under torchrun.

    python -m minimind_ref.train --config ch08_cpu            # a config shipped with the package
    python -m minimind_ref.train --config my_run.json --set max_steps=100 lr=1e-3
    torchrun --standalone --nproc_per_node 2 -m minimind_ref.train --config ch08_cpu

One optimizer step (``train_step``)::

    loss = cross_entropy(shifted logits, shifted labels) (+ MoE auxiliary loss)
    loss.backward(); clip_grad_norm_(max_norm); AdamW.step(); zero_grad()

with the learning rate set before every step by ``lr_at`` (linear warmup, then cosine decay to
``min_lr``). On a CUDA GPU that supports it the forward pass runs under bf16 autocast (weights and
optimizer stay fp32). Under ``torchrun`` every process trains a slice of the global batch inside
``DistributedDataParallel`` (``nccl`` on GPUs, ``gloo`` on CPUs), which averages the gradients,
so N processes with batch B/N follow the same trajectory as one process with batch B.

Checkpoints are ``save_checkpoint`` files (``minimind_ref.load_checkpoint`` reads them) whose
``extra`` holds the step, the optimizer state, the loss history and the RNG state, so a resumed
run continues the same loss curve. Needs the optional dependencies ``tokenizers`` and ``tqdm``.

Fine-tuning stages reuse the same loop through hooks (``train(cfg, objective=..., data=...)``): an
*objective* maps ``(model, batch)`` to ``{"loss": ..., metrics}``; ``minimind_ref.sft``,
``lora``, ``dpo`` and ``grpo`` provide theirs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from . import data as data_mod
from .checkpoint import _torch_load, check_metadata, check_weights, load_state_dict_strict, save_checkpoint
from .config import MiniMindConfig
from .files import DIGEST_KEY, remove_stale_temporaries
from .model import MiniMindForCausalLM
from .tokenizer import BOS_ID, EOS_ID, PAD_ID, load_tokenizer, save_tokenizer, train_bpe_tokenizer

CHECKPOINT_NAME = "ckpt.pt"
TOKENIZER_NAME = "tokenizer.json"


# ---------------------------------------------------------------------- configuration
CONFIG_DIR = Path(__file__).with_name("configs")
# Options a resumed run may change; any other difference from the checkpoint's run is an error.
# lr, min_lr and grad_clip may change: resuming with a lower learning rate is the way out of a divergence.
RESUMABLE_CHANGES = frozenset({"eval_every", "eval_batches", "eval_problems", "log_every", "save_every", "out_dir",
                               "resume", "device", "dtype", "progress", "deterministic", "lr", "min_lr", "grad_clip"})


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass
class TrainConfig:
    """Everything a run needs; a JSON file with any subset of these keys is a config file.

    Every value is checked when the config is made: a wrong type or an out-of-range value raises
    ``ValueError`` naming the option, the value and what is allowed."""

    # data: "generated" (stories + addition drills, see minimind_ref.data) or a path to a .txt file
    data: str = "generated"
    n_docs: int = 20000
    n_val_docs: int = 400
    story_fraction: float = 0.5
    data_seed: int = 0
    # tokenizer: a tokenizer.json to load, or None to train a byte-level BPE on the training text
    tokenizer: Optional[str] = None
    vocab_size: int = 1024
    split_digits: bool = True
    # model: MiniMindConfig keyword arguments (vocab_size comes from the tokenizer)
    model: Dict[str, Any] = field(default_factory=lambda: {
        "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 2, "max_position_embeddings": 512,
    })
    seq_len: int = 128
    # optimization
    batch_size: int = 32  # global: split evenly across processes
    max_steps: int = 400
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 20
    weight_decay: float = 0.01
    betas: Tuple[float, float] = (0.9, 0.95)
    grad_clip: Optional[float] = 1.0  # max global gradient norm; None: no clipping
    # evaluation, logging, checkpoints
    eval_every: int = 100
    eval_batches: int = 4
    eval_problems: int = 100  # held-out addition problems solved at each evaluation (generated data)
    log_every: int = 50
    save_every: int = 0  # 0: save only at the end (when out_dir is set)
    out_dir: Optional[str] = None
    resume: Optional[str] = None  # a checkpoint path, or "auto": out_dir/ckpt.pt if it exists
    # execution
    device: str = "auto"  # "auto" (cuda > mps > cpu), or a torch device string
    dtype: str = "auto"  # "auto" (bf16 autocast on CUDA GPUs that support it), "float32", "bfloat16"
    seed: int = 0
    progress: bool = True  # tqdm bar on the first process
    deterministic: bool = False  # torch.use_deterministic_algorithms(True)

    def __post_init__(self) -> None:
        def bad(option: str, value: Any, allowed: str) -> None:
            raise ValueError(f"training option {option}={value!r} is invalid: {allowed}.")

        for name in ("n_docs", "n_val_docs", "batch_size", "max_steps", "eval_batches", "seq_len", "vocab_size"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                bad(name, v, "expected a whole number >= 1")
        if self.seq_len < 2:
            bad("seq_len", self.seq_len, "a window needs at least 2 tokens (one input and the token it predicts)")
        for name in ("data_seed", "seed", "warmup_steps", "eval_every", "eval_problems", "log_every", "save_every"):
            v = getattr(self, name)
            if not _is_int(v) or v < 0:
                bad(name, v, "expected a whole number >= 0")
        if not _is_number(self.lr) or self.lr <= 0:
            bad("lr", self.lr, "expected a positive finite number such as 3e-3")
        if not _is_number(self.min_lr) or not 0 <= self.min_lr <= self.lr:
            bad("min_lr", self.min_lr, f"expected a number between 0 and lr={self.lr!r}")
        if not _is_number(self.weight_decay) or self.weight_decay < 0:
            bad("weight_decay", self.weight_decay, "expected a number >= 0")
        if not _is_number(self.story_fraction) or not 0 <= self.story_fraction <= 1:
            bad("story_fraction", self.story_fraction, "expected a number between 0 and 1")
        betas = tuple(self.betas) if isinstance(self.betas, (list, tuple)) else None
        if betas is None or len(betas) != 2 or not all(_is_number(b) and 0 <= b < 1 for b in betas):
            bad("betas", self.betas, "expected two numbers in [0, 1), e.g. [0.9, 0.95]")
        self.betas = betas  # type: ignore[assignment]
        if self.grad_clip is not None and not (isinstance(self.grad_clip, (int, float)) and not isinstance(self.grad_clip, bool)
                                               and self.grad_clip > 0 and not math.isnan(self.grad_clip)):
            bad("grad_clip", self.grad_clip, "expected a positive number (the largest allowed gradient norm), or null "
                "for no clipping; 0 would zero every update and a negative value would reverse it")
        for name in ("data", "device", "dtype"):
            if not isinstance(getattr(self, name), str):
                bad(name, getattr(self, name), "expected a string")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            bad("dtype", self.dtype, "expected 'auto', 'float32' or 'bfloat16'")
        for name in ("tokenizer", "out_dir", "resume"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                bad(name, v, "expected a path (string) or null")
        for name in ("split_digits", "progress", "deterministic"):
            if not isinstance(getattr(self, name), bool):
                bad(name, getattr(self, name), "expected true or false")
        if not isinstance(self.model, dict):
            bad("model", self.model, "expected a mapping of MiniMindConfig keyword arguments")

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names - {"_comment"})
        if unknown:
            raise ValueError(f"unknown training option(s) {unknown}; valid: {sorted(names)}.")
        d = {k: v for k, v in d.items() if k in names}
        if "model" in d:
            if not isinstance(d["model"], dict):
                raise ValueError(f"training option model={d['model']!r} is invalid: expected a mapping of MiniMindConfig keyword arguments.")
            d["model"] = {**cls().model, **d["model"]}
        return cls(**d)

    @classmethod
    def from_json(cls, path: str) -> "TrainConfig":
        """Read a config file: a path, or the name of a config shipped with the package
        (``"ch08_cpu"``, ``"ch08_gpu"``, ``"tiny_test"``; see ``named_configs()``)."""
        return cls.from_dict(_read_config_file(path))

    def to_dict(self) -> Dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    def replace(self, **changes: Any) -> "TrainConfig":
        return TrainConfig.from_dict({**self.to_dict(), **changes})


def named_configs() -> List[str]:
    """Names of the configs shipped in ``minimind_ref/configs/`` (usable as ``--config NAME``)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def _read_config_file(path_or_name: str) -> Dict[str, Any]:
    path = Path(path_or_name)
    if not path.is_file():
        shipped = CONFIG_DIR / f"{path_or_name}.json"
        if path.suffix or not shipped.is_file():
            raise FileNotFoundError(f"no config file {path_or_name!r}; give a path to a JSON file or one of the "
                                    f"shipped configs: {', '.join(named_configs())}.")
        path = shipped
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON (UTF-8): {err}") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path} must hold a JSON object of training options, got {type(d).__name__}.")
    return d


# ---------------------------------------------------------------------- the pieces
def lr_at(step: int, max_steps: int, warmup_steps: int, max_lr: float, min_lr: float) -> float:
    """Learning rate of optimizer step ``step`` (0-based).

    * warmup, ``step < warmup_steps``: linear, ``max_lr * (step + 1) / warmup_steps``;
    * then cosine from ``max_lr`` down to ``min_lr``: with
      ``progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)`` (capped at 1),
      ``min_lr + 0.5 * (max_lr - min_lr) * (1 + cos(pi * progress))``.
    """
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def causal_lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mean next-token cross-entropy: ``logits[:, t]`` predicts ``input_ids[:, t+1]``; targets
    where ``attention_mask`` is 0 (padding) are left out of both the sum and the count.

    ``logits`` ``[b, s, vocab]``, ``input_ids`` and ``attention_mask`` ``[b, s]``. Equal to
    ``model(input_ids, labels=input_ids.masked_fill(attention_mask == 0, -100)).loss``."""
    labels = input_ids if attention_mask is None else input_ids.masked_fill(attention_mask == 0, -100)
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=-100
    )


# An objective turns (model, batch) into a dict of scalar tensors: "loss" is what the optimizer
# minimises (it must carry gradients); every other entry is a detached metric that the loop logs
# (history[name]). An optional "tokens" entry counts the supervised targets of the batch: when it
# is 0 the step is skipped (no update, counted in history["skipped"]) instead of stepping on a
# loss that has no data behind it.
Objective = Callable[[torch.nn.Module, Any], Dict[str, torch.Tensor]]


def lm_objective(model: torch.nn.Module, batch: Tuple[torch.Tensor, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Next-token prediction: ``batch = (input_ids, labels)``, labels -100 where no loss counts.

    ``loss = out.loss + out.aux_loss`` (the MoE load-balancing term, 0 for dense models), as
    upstream's trainers add them; ``aux_loss`` is logged separately."""
    input_ids, labels = batch
    out = model(input_ids, labels=labels)
    return {"loss": out.loss + out.aux_loss, "aux_loss": out.aux_loss.detach(),
            "tokens": (labels[:, 1:] != -100).sum()}


def _check_finite(name: str, value: torch.Tensor, what: str) -> None:
    if not bool(torch.isfinite(value).all()):
        raise FloatingPointError(f"{name} is {float(value)} {what}; the weights were NOT updated. Lower the learning "
                                 "rate (or check the data and the model's inputs) and resume from the last checkpoint.")


def objective_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    objective: Objective = lm_objective,
    max_grad_norm: Optional[float] = 1.0,
    autocast: Optional[Callable[[], Any]] = None,
) -> Dict[str, torch.Tensor]:
    """One optimizer step on any objective; returns its metrics (detached) plus ``grad_norm``.

    Forward (under ``autocast()`` if given) -> ``objective(model, batch)["loss"]`` -> backward ->
    clip the global gradient norm to ``max_grad_norm`` (None: no clipping) -> ``optimizer.step()``
    -> ``zero_grad``. A non-finite loss or gradient norm raises ``FloatingPointError`` *before*
    the update, so the weights (and any checkpoint saved later) stay finite. A batch whose
    ``tokens`` metric is 0 is skipped: no update, ``skipped`` = 1 in the metrics.
    ``max_grad_norm`` must be None or a positive number (a negative one would reverse the update)."""
    if max_grad_norm is not None and (isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, (int, float))
                                      or math.isnan(max_grad_norm) or max_grad_norm <= 0):
        raise ValueError(f"max_grad_norm={max_grad_norm!r} is invalid: expected a positive number (the largest allowed "
                         "gradient norm) or None for no clipping; 0 would zero every update and a negative value would "
                         "reverse it (gradient ascent).")
    with (autocast() if autocast is not None else contextlib.nullcontext()):
        metrics = objective(model, batch)
    if not isinstance(metrics, dict) or not isinstance(metrics.get("loss"), torch.Tensor) or metrics["loss"].numel() != 1:
        got = type(metrics).__name__ if not isinstance(metrics, dict) else f"a dict with keys {sorted(metrics)}"
        raise TypeError(f"the objective must return a dict with 'loss' (a scalar tensor) and other metrics, got {got}.")
    loss = metrics["loss"]
    if "tokens" in metrics and int(metrics["tokens"]) == 0:
        optimizer.zero_grad(set_to_none=True)
        out = {k: v.detach() for k, v in metrics.items()}
        out.update(grad_norm=torch.tensor(0.0), skipped=torch.tensor(1.0))
        return out
    _check_finite("the loss", loss.detach(), "before the update")
    if not loss.requires_grad:
        raise ValueError("the objective's loss carries no gradient (computed under torch.no_grad() or detached?), so "
                         "the optimizer could not learn from it; return the loss as computed from the model's outputs.")
    loss.backward()
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, math.inf if max_grad_norm is None else max_grad_norm)
    if not bool(torch.isfinite(grad_norm)):
        optimizer.zero_grad(set_to_none=True)
        _check_finite("the gradient norm", grad_norm, "before the update")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    out = {k: v.detach() for k, v in metrics.items()}
    out.update(grad_norm=grad_norm.detach(), skipped=torch.tensor(0.0))
    return out


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    max_grad_norm: Optional[float] = 1.0,
    autocast: Optional[Callable[[], Any]] = None,
) -> Dict[str, torch.Tensor]:
    """One pretraining step (``objective_step`` with ``lm_objective``); returns detached
    ``{"loss", "aux_loss", "grad_norm", ...}``. ``loss`` is ``out.loss + out.aux_loss``, what was
    minimised; ``grad_norm`` is the norm before clipping (what ``clip_grad_norm_`` returns)."""
    return objective_step(model, optimizer, (input_ids, labels), lm_objective, max_grad_norm, autocast)


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over every trainable parameter (the tied embedding/head once), as upstream MiniMind
    does; frozen parameters (``requires_grad=False``, e.g. under LoRA) are left out."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameter (every requires_grad is False): was it frozen as a "
                         "reference (DPOObjective / GRPOObjective freeze the ref_model they are given, so the policy "
                         "itself must not be passed as its own reference) or by mark_only_lora_trainable? Train a model "
                         "whose parameters have requires_grad=True.")
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)


def move_to(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor inside (tuples, lists, dicts) moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        return type(batch)(move_to(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: move_to(v, device) for k, v in batch.items()}
    return batch


@torch.no_grad()
def evaluate_objective(model: torch.nn.Module, dataset: Any, objective: Objective, batch_size: int, n_batches: int,
                       device: torch.device, autocast: Optional[Callable[[], Any]] = None) -> Dict[str, float]:
    """Every metric of ``objective`` averaged (weighted by batch size) over the first
    ``n_batches * batch_size`` items of ``dataset``, in eval mode and without gradients."""
    was_training = model.training
    model.eval()
    totals: Dict[str, float] = {}
    count = 0
    try:
        n = min(len(dataset), n_batches * batch_size)
        for start in range(0, n, batch_size):
            idx = torch.arange(start, min(n, start + batch_size))
            with (autocast() if autocast is not None else contextlib.nullcontext()):
                metrics = objective(model, move_to(dataset.batch(idx), device))
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + float(v) * len(idx)
            count += len(idx)
    finally:
        model.train(was_training)
    return {k: v / max(1, count) for k, v in totals.items()}


@torch.no_grad()
def evaluate_loss(model: torch.nn.Module, dataset: data_mod.PackedDataset, batch_size: int, n_batches: int,
                  device: torch.device, autocast: Optional[Callable[[], Any]] = None) -> float:
    """Mean next-token loss on the first ``n_batches * batch_size`` windows of ``dataset``."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        n = min(len(dataset), n_batches * batch_size)
        for start in range(0, n, batch_size):
            x, y = dataset.batch(torch.arange(start, min(n, start + batch_size)))
            x, y = x.to(device), y.to(device)
            with (autocast() if autocast is not None else contextlib.nullcontext()):
                loss = model(x, labels=y).loss
            total += float(loss) * x.shape[0]
            count += x.shape[0]
    finally:
        model.train(was_training)
    return total / max(1, count)


@torch.no_grad()
def solve_problems(model: torch.nn.Module, tokenizer, problems: Sequence[Tuple[int, int]], device: torch.device,
                   max_new_tokens: int = 5, batch_size: int = 256) -> List[str]:
    """Greedy answers of the model to ``"aa+bb="`` prompts (each prompt starts with ``<|im_start|>``);
    the text generated up to the first newline or end token. Prompts are batched by length, so
    no padding is needed."""
    from .generation import generate

    prompts = [[BOS_ID] + tokenizer.encode(data_mod.format_problem(a, b, answer=False)).ids for a, b in problems]
    answers: List[str] = [""] * len(prompts)
    by_len: Dict[int, List[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    for idx in by_len.values():
        for start in range(0, len(idx), batch_size):
            chunk = idx[start : start + batch_size]
            x = torch.tensor([prompts[i] for i in chunk], device=device)
            out = generate(model, x, max_new_tokens=max_new_tokens, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
            for row, i in zip(out[:, x.shape[1] :].tolist(), chunk):
                if EOS_ID in row:  # everything after the end token is padding
                    row = row[: row.index(EOS_ID)]
                answers[i] = tokenizer.decode(row).split("\n")[0].strip()
    return answers


def arithmetic_accuracy(model: torch.nn.Module, tokenizer, problems: Sequence[Tuple[int, int]], device: torch.device) -> float:
    """Fraction of ``problems`` whose greedy answer is exactly the sum as the drills write it
    (``data.format_answer``: three digits, ``"052"``)."""
    if not problems:
        return float("nan")
    answers = solve_problems(model, tokenizer, problems, device)
    return sum(ans == data_mod.format_answer(a, b) for ans, (a, b) in zip(answers, problems)) / len(problems)


def sample_text(model: torch.nn.Module, tokenizer, prompt: str = "", max_new_tokens: int = 60,
                temperature: float = 0.8, top_k: int = 20, seed: int = 0, device: Optional[torch.device] = None) -> str:
    """A sampled continuation of ``prompt`` (after ``<|im_start|>``), decoded up to ``<|im_end|>``."""
    from .generation import generate

    device = device or next(model.parameters()).device
    x = torch.tensor([[BOS_ID] + tokenizer.encode(prompt).ids], device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    out = generate(model, x, max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature, top_k=top_k,
                   eos_token_id=EOS_ID, generator=g)[0, 1:].tolist()
    if EOS_ID in out:
        out = out[: out.index(EOS_ID)]
    return tokenizer.decode(out)


# ---------------------------------------------------------------------- data for a run
@dataclass
class RunData:
    """A run's tokenizer, datasets and held-out problems (``build_data`` makes one for
    pretraining; the post-training chapters build theirs from their own datasets).

    ``train`` (and ``val``, if given) is any dataset with ``len()`` and ``batch(indices)``
    returning what the run's objective takes (pretraining: ``(input_ids, labels)``)."""

    tokenizer: Any
    train: Any
    val: Any = None
    test_problems: List[Tuple[int, int]] = field(default_factory=list)


def data_fingerprint(dataset: Any) -> Optional[str]:
    """A short hash of a dataset's content (``dataset.fingerprint()`` if it has one, else the
    bytes of its ``data`` tensor), stored in checkpoints so a resumed run can tell it is being
    given the same data. None when the dataset offers neither."""
    import hashlib

    if hasattr(dataset, "fingerprint"):
        return str(dataset.fingerprint())
    tensor = getattr(dataset, "data", None)
    if isinstance(tensor, torch.Tensor):
        return hashlib.sha256(tensor.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]
    return None


def build_data(cfg: TrainConfig, tokenizer=None) -> RunData:
    """Documents -> tokenizer (loaded from ``cfg.tokenizer``, given, or trained) -> packed datasets."""
    if cfg.data == "generated":
        train_pairs, test_pairs = data_mod.arithmetic_split()
        train_docs = data_mod.make_corpus(cfg.n_docs, seed=cfg.data_seed, story_fraction=cfg.story_fraction, pairs=train_pairs)
        val_docs = data_mod.make_corpus(cfg.n_val_docs, seed=cfg.data_seed + 1, story_fraction=cfg.story_fraction, pairs=test_pairs)
    else:
        docs = data_mod.read_text_documents(cfg.data)
        n_val = max(1, len(docs) // 20)
        train_docs, val_docs, test_pairs = docs[:-n_val], docs[-n_val:], []
    if tokenizer is None:
        tokenizer = load_tokenizer(cfg.tokenizer) if cfg.tokenizer else train_bpe_tokenizer(
            train_docs, vocab_size=cfg.vocab_size, split_digits=cfg.split_digits)
    train = data_mod.PackedDataset(data_mod.encode_documents(tokenizer, train_docs), cfg.seq_len)
    val = data_mod.PackedDataset(data_mod.encode_documents(tokenizer, val_docs), cfg.seq_len)
    return RunData(tokenizer, train, val, list(test_pairs))


def build_model(cfg: TrainConfig, vocab_size: int) -> MiniMindForCausalLM:
    """A ``MiniMindForCausalLM`` from ``cfg.model`` with the tokenizer's vocabulary size."""
    return MiniMindForCausalLM(MiniMindConfig(**{**cfg.model, "vocab_size": vocab_size}))


# ---------------------------------------------------------------------- distributed helpers
def dist_info() -> Tuple[int, int, int]:
    """``(rank, world_size, local_rank)`` from torchrun's environment (``(0, 1, 0)`` without it)."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def _init_distributed(device: torch.device) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")


def resolve_device(cfg: TrainConfig, local_rank: int = 0, world_size: int = 1) -> torch.device:
    if cfg.device != "auto":
        dev = torch.device(cfg.device)
    elif torch.cuda.is_available():
        dev = torch.device("cuda")
    elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available() and world_size == 1:
        dev = torch.device("mps")
    else:
        dev = torch.device("cpu")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local_rank if world_size > 1 else torch.cuda.current_device())
    return dev


def autocast_for(cfg: TrainConfig, device: torch.device) -> Optional[Callable[[], Any]]:
    """A zero-argument autocast context factory, or None for plain fp32."""
    if cfg.dtype == "float32":
        return None
    if cfg.dtype == "bfloat16":
        return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if cfg.dtype != "auto":
        raise ValueError(f"dtype must be 'auto', 'float32' or 'bfloat16', got {cfg.dtype!r}.")
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return lambda: torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return None


# ---------------------------------------------------------------------- the loop
@dataclass
class TrainResult:
    """What ``train`` returns. ``history`` is deterministic for a given config and machine;
    ``tokens_per_s`` and ``seconds`` are timings."""

    model: MiniMindForCausalLM
    tokenizer: Any
    history: Dict[str, List[float]]
    step: int
    tokens_per_s: float
    seconds: float
    checkpoint: Optional[str] = None
    data: Optional[RunData] = None


def _new_history() -> Dict[str, List[float]]:
    return {k: [] for k in ("step", "loss", "aux_loss", "lr", "grad_norm", "skipped", "eval_step", "eval_loss", "eval_acc")}


def _rng_state(device: torch.device) -> Dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _write_json_atomic(path: str, obj: Any) -> None:
    from .files import write_json

    write_json(path, obj)


def _truncation_line(counts: Dict[str, int]) -> str:
    from .sft import truncation_note

    return truncation_note(counts, "examples", counts.get("max_length", "?"), bool(counts.get("dropped")))


def _resume_path(cfg: TrainConfig) -> Optional[str]:
    if cfg.resume is None:
        return None
    if cfg.resume == "auto":
        if not cfg.out_dir:
            raise ValueError("resume='auto' looks for ckpt.pt in out_dir, but out_dir is not set; set out_dir to the "
                             "run's folder, or give resume the path of a checkpoint.")
        candidate = os.path.join(cfg.out_dir, CHECKPOINT_NAME)
        if os.path.exists(candidate):
            return candidate
        # a run killed after its first periodic save, before the next step could vouch for it
        return candidate + ".pending" if os.path.exists(candidate + ".pending") else None
    if os.path.isdir(cfg.resume):
        raise IsADirectoryError(f"resume={cfg.resume!r} is a folder: give the checkpoint file in it (e.g. "
                                f"{os.path.join(cfg.resume, CHECKPOINT_NAME)}), or resume='auto' with out_dir set to it.")
    if not os.path.isfile(cfg.resume):
        raise FileNotFoundError(f"resume={cfg.resume!r}: no such checkpoint file.")
    return cfg.resume


def _load_resume_blob(path: str) -> Dict[str, Any]:
    try:  # weights only, with checkpoint.py's messages (a pickle that would build objects is refused)
        blob = _torch_load(path, map_location="cpu")
    except ValueError as err:
        raise ValueError(f"cannot resume: {err}") from None
    if not (isinstance(blob, dict) and isinstance(blob.get("extra"), dict) and "optimizer" in blob["extra"]
            and isinstance(blob.get("state_dict"), dict)):
        raise ValueError(f"cannot resume from {path}: it holds weights but no training state (optimizer, step); "
                         "load it with load_checkpoint and start a new run instead.")
    try:  # the digests save_checkpoint recorded, and finite weights (the checks of every loader)
        check_weights(blob["state_dict"], path, digest=blob.get(DIGEST_KEY))
        check_metadata(blob, path)
    except ValueError as err:
        raise ValueError(f"cannot resume: {err}") from None
    return blob


def _check_resumable(cfg: TrainConfig, previous: Dict[str, Any], path: str) -> None:
    """The new config may differ from the checkpoint's run only in RESUMABLE_CHANGES."""
    now = cfg.to_dict()
    before = TrainConfig.from_dict(previous).to_dict() if previous else now
    different = [k for k in now if k not in RESUMABLE_CHANGES and now[k] != before.get(k)]
    if different:
        detail = "; ".join(f"{k}: checkpoint {before.get(k)!r}, now {now[k]!r}" for k in different)
        raise ValueError(f"cannot resume from {path}: the run was made with other settings ({detail}). Use the "
                         "checkpoint's settings (its train_config.json), or start a new run in another out_dir.")


def _lm_eval(cfg: TrainConfig, data: RunData, objective: Objective, device: torch.device,
             autocast: Optional[Callable[[], Any]]) -> Callable[[torch.nn.Module, int], Dict[str, float]]:
    """The default evaluation: the objective's mean loss on ``data.val`` and, for generated
    data, the greedy accuracy on the held-out additions."""

    def evaluate(model: torch.nn.Module, step: int) -> Dict[str, float]:
        out: Dict[str, float] = {}
        if data.val is not None and len(data.val):
            out["loss"] = evaluate_objective(model, data.val, objective, cfg.batch_size, cfg.eval_batches, device,
                                             autocast)["loss"]
        if cfg.eval_problems and data.test_problems:
            out["acc"] = arithmetic_accuracy(model, data.tokenizer, data.test_problems[: cfg.eval_problems], device)
        return out

    return evaluate


def train(
    cfg: TrainConfig,
    model: Optional[MiniMindForCausalLM] = None,
    data: Optional[RunData] = None,
    stop_at: Optional[int] = None,
    log: Optional[Callable[[str], None]] = None,
    objective: Optional[Objective] = None,
    evaluate: Optional[Callable[[torch.nn.Module, int], Dict[str, float]]] = None,
    lr_schedule: Optional[Callable[[int, int, int, float, float], float]] = None,
    step_fn: Optional[Callable[..., Any]] = None,
) -> TrainResult:
    """Train (or resume) according to ``cfg`` and return the model and its history.

    One loop for every stage of the course (pretraining, SFT, LoRA, DPO, GRPO); what differs is
    passed in:

    * ``model`` / ``data``: use these instead of building them from ``cfg`` (an ablated model,
      data already built, a fine-tuning dataset);
    * ``objective(model, batch) -> {"loss": ..., other metrics}`` (default ``lm_objective``);
    * ``evaluate(model, step) -> {name: float}``, run every ``cfg.eval_every`` steps and logged
      as ``history["eval_<name>"]`` (default: the objective's loss on ``data.val`` and, for
      generated data, held-out addition accuracy);
    * ``lr_schedule(step, max_steps, warmup_steps, max_lr, min_lr)`` (default ``lr_at``);
    * ``step_fn(model, optimizer, batch, max_grad_norm) -> loss`` (a float, or a dict with
      ``"loss"``): your own optimizer step instead of ``objective_step`` (chapter 08 trains with
      the learner's ``training_step``); it runs under the run's autocast.

    ``stop_at``: stop after this many steps although the schedule is planned for
    ``cfg.max_steps`` (to simulate an interruption). ``log``: where progress lines go (default:
    ``print`` on the first process). Under torchrun (``WORLD_SIZE`` > 1) the process group is
    created here if needed.

    Safety: resuming checks the checkpoint's settings, tokenizer, data fingerprint and weight
    digest *before* anything in ``out_dir`` is written (``lr``, ``min_lr`` and ``grad_clip`` may
    change: resuming with a lower learning rate is the way out of a divergence). A non-finite loss
    or gradient raises ``FloatingPointError`` before the update, naming the checkpoint kept. A
    periodic checkpoint (``save_every``) goes to ``ckpt.pt.pending`` and replaces ``ckpt.pt`` only
    once the next step's loss, computed on its weights, is finite, so a diverging update never
    reaches ``ckpt.pt``; a next-token loss above 2 ln(vocab_size) is logged as a divergence
    warning. The data's truncation counts and the number of skipped steps are logged when not 0,
    and a run whose every step was skipped is a ``ValueError``. Every file is written atomically.
    """
    if stop_at is not None and (isinstance(stop_at, bool) or not isinstance(stop_at, int) or stop_at < 1):
        raise ValueError(f"stop_at={stop_at!r} is invalid: expected a whole number >= 1 (the step to stop after), or None.")
    expanded = {k: os.path.expanduser(v) for k, v in (("out_dir", cfg.out_dir), ("resume", cfg.resume))
                if v not in (None, "auto") and v != os.path.expanduser(v)}
    if expanded:  # '~' means the home folder, as in a shell
        cfg = cfg.replace(**expanded)
    if cfg.out_dir and os.path.exists(cfg.out_dir) and not os.path.isdir(cfg.out_dir):
        raise ValueError(f"out_dir={cfg.out_dir!r} is a file, not a folder: the run writes ckpt.pt, tokenizer.json and "
                         "train_config.json into out_dir. Give a folder (it is created if needed).")
    rank, world, local_rank = dist_info()
    device = resolve_device(cfg, local_rank, world)
    if world > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        _init_distributed(device)
    is_main = rank == 0
    if log is None:
        log = print if is_main else (lambda s: None)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(cfg.seed)
    objective = objective or lm_objective
    lr_schedule = lr_schedule or lr_at

    # ---- what are we resuming? (read only: nothing is written before every check has passed)
    resume = _resume_path(cfg)
    blob = None
    if resume:
        blob = _load_resume_blob(resume)
        _check_resumable(cfg, blob["extra"].get("train_config", {}), resume)

    # ---- data and tokenizer (a resumed run reuses its own tokenizer file; a new one trains it
    # once, on the first process, and shares it through the file)
    if data is None:
        tokenizer = None
        run_tokenizer = os.path.join(cfg.out_dir, TOKENIZER_NAME) if cfg.out_dir else None
        if resume and not cfg.tokenizer and run_tokenizer and os.path.exists(run_tokenizer):
            tokenizer = load_tokenizer(run_tokenizer)
        if tokenizer is None and world > 1 and not cfg.tokenizer:
            import torch.distributed as dist

            if cfg.out_dir is None:
                raise ValueError("distributed runs need out_dir (or a tokenizer file) to share the tokenizer.")
            if is_main:
                data = build_data(cfg)
                os.makedirs(cfg.out_dir, exist_ok=True)
                save_tokenizer(data.tokenizer, run_tokenizer)
            dist.barrier()
            if not is_main:
                data = build_data(cfg, tokenizer=load_tokenizer(run_tokenizer))
        else:
            data = build_data(cfg, tokenizer)
    tokenizer = data.tokenizer
    if not len(data.train):
        raise ValueError("the training dataset is empty (0 examples): nothing to train on. Check the data you built "
                         "(n_train, the records, drop_truncated).")
    fingerprint = data_fingerprint(data.train)
    if blob is not None:
        saved = blob["extra"].get("data_fingerprint")
        if saved is not None and fingerprint is not None and saved != fingerprint:
            raise ValueError(f"cannot resume from {resume}: the training data differ from the data of that run "
                             "(another corpus, tokenizer or seq_len). Resume with the run's own data and tokenizer "
                             "(out_dir/tokenizer.json), or start a new run in another out_dir.")

    # ---- model, optimizer, resume
    if model is None:
        torch.manual_seed(cfg.seed)
        model = build_model(cfg, tokenizer.get_vocab_size())
    model.to(device).train()
    optimizer = make_optimizer(model, cfg)
    history = _new_history()
    start_step = 0
    if blob is not None:
        state = {k: v for k, v in blob["state_dict"].items() if not k.endswith(("freqs_cos", "freqs_sin"))}
        load_state_dict_strict(model, state)
        extra = blob["extra"]
        optimizer.load_state_dict(extra["optimizer"])
        start_step = int(extra["step"])
        history = {k: list(v) for k, v in extra["history"].items()}
        torch.set_rng_state(extra["rng"]["torch"])
        if device.type == "cuda" and "cuda" in extra["rng"]:
            torch.cuda.set_rng_state(extra["rng"]["cuda"], device)
        log(f"resumed from {resume} at step {start_step}")
        if stop_at is not None and stop_at <= start_step:
            raise ValueError(f"stop_at={stop_at} is not after step {start_step}, where {resume} resumes the run: give a "
                             "later step (or None to run to max_steps).")

    # ---- every check passed: now the run folder may be written
    if cfg.out_dir and is_main:
        os.makedirs(cfg.out_dir, exist_ok=True)
        tok_path = os.path.join(cfg.out_dir, TOKENIZER_NAME)
        if hasattr(tokenizer, "save") and not (resume and os.path.exists(tok_path)):
            save_tokenizer(tokenizer, tok_path)  # atomic
        _write_json_atomic(os.path.join(cfg.out_dir, "train_config.json"), cfg.to_dict())
        stale = os.path.join(cfg.out_dir, CHECKPOINT_NAME + ".pending")
        if os.path.exists(stale) and not (resume and os.path.abspath(resume) == os.path.abspath(stale)):
            os.remove(stale)  # left by a run killed before the next step could vouch for it
        remove_stale_temporaries(cfg.out_dir, CHECKPOINT_NAME + ".pending")  # ... or while writing it

    raw_model = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    autocast = autocast_for(cfg, device)
    evaluate = evaluate or _lm_eval(cfg, data, objective, device, autocast)
    end_step = cfg.max_steps if stop_at is None else min(stop_at, cfg.max_steps)
    n_train = len(data.train)

    ckpt_file = os.path.join(cfg.out_dir, CHECKPOINT_NAME) if cfg.out_dir else None
    pending_file = ckpt_file + ".pending" if ckpt_file else None
    kept_step = start_step if blob is not None else None  # the step ckpt.pt holds (None: no checkpoint yet)
    pending_step: Optional[int] = None  # the step ckpt.pt.pending holds
    if resume and pending_file and os.path.abspath(resume) == os.path.abspath(pending_file):
        kept_step, pending_step = None, start_step  # resumed from an unvouched save: kept once a step's loss is finite

    def checkpoint(step: int, pending: bool = False) -> Optional[str]:
        """Save the run at ``step`` (atomically). ``pending``: to ckpt.pt.pending, which becomes ckpt.pt
        only after the next step's loss, computed on these weights, is finite (``promote``)."""
        nonlocal kept_step, pending_step
        if not (cfg.out_dir and is_main):
            return None
        extra = {"step": step, "optimizer": optimizer.state_dict(), "history": history,
                 "train_config": cfg.to_dict(), "rng": _rng_state(device), "data_fingerprint": fingerprint}
        for name, tensor in raw_model.state_dict().items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise FloatingPointError(f"not saving step {step}: weight {name} is not finite; the previous "
                                         f"checkpoint in {cfg.out_dir} is kept.")
        # a LoRA run resumes with its adapters (allow_lora)
        save_checkpoint(raw_model, pending_file if pending else ckpt_file, extra=extra, allow_lora=True)
        if pending:
            pending_step = step
            return None
        kept_step, pending_step = step, None
        if os.path.exists(pending_file):
            os.remove(pending_file)
        return ckpt_file

    def promote() -> Optional[str]:
        """The pending checkpoint's weights gave a finite loss: it becomes ckpt.pt."""
        nonlocal kept_step, pending_step
        if pending_step is None:
            return ckpt_path
        os.replace(pending_file, ckpt_file)
        kept_step, pending_step = pending_step, None
        return ckpt_file

    def diverged(err: FloatingPointError, step: int) -> FloatingPointError:
        """The loop's message for a non-finite loss or gradient: what was kept, and how to go on."""
        if pending_step is not None:
            os.remove(pending_file)  # its weights are the ones that just gave the non-finite value
        what = str(err).split(";")[0].replace(f" at step {step}", "")
        if kept_step is not None and kept_step == step:
            where = (f"The last checkpoint, {ckpt_file} (step {kept_step}), holds the weights that give this value (the "
                     "run that saved it ended on a diverging update): start again from an earlier copy, or from "
                     "scratch, with a lower learning rate.")
        elif kept_step is not None:
            where = (f"The last checkpoint, {ckpt_file}, holds step {kept_step}, whose weights still gave a finite loss "
                     "(later saves were not kept). Resume it with a lower learning rate: train(cfg.replace(lr=..., "
                     "resume='auto')), or --set resume=auto lr=... on the command line (lr, min_lr and grad_clip may "
                     "change on resume).")
        elif cfg.out_dir:
            where = ("No checkpoint of this run is kept: the first one saved would already hold weights that give this "
                     "value. Start the run again with a lower learning rate (or a smaller grad_clip).")
        else:
            where = "Start the run again with a lower learning rate (or a smaller grad_clip); set out_dir to keep checkpoints."
        return FloatingPointError(f"{what} at step {step}; the weights were NOT updated. {where}")

    def run_eval(step: int) -> None:
        metrics = evaluate(raw_model, step)
        history["eval_step"].append(step)
        for k in set(metrics) | {"loss", "acc"}:
            history.setdefault(f"eval_{k}", []).append(float(metrics.get(k, float("nan"))))
        parts = [f"{k} {v:.4f}" if k != "acc" else f"held-out accuracy {v:.1%}" for k, v in metrics.items()
                 if not (isinstance(v, float) and math.isnan(v))]
        log(f"eval step {step}: " + ", ".join(parts))

    bar = None
    if cfg.progress and is_main:
        from tqdm.auto import tqdm

        bar = tqdm(total=end_step, initial=start_step, desc="train", unit="step", dynamic_ncols=True)
        log = bar.write if log is print else log

    for what, dataset in (("training", data.train), ("validation", data.val)):
        counts = getattr(dataset, "truncation", None)  # SFTDataset / DPODataset: what max_length cut away
        if is_main and isinstance(counts, dict) and (counts.get("no_answer") or counts.get("cut_answer")):
            log(f"note: {what} data: " + _truncation_line(counts))
    train_seconds, t0 = 0.0, time.perf_counter()
    tokens_seen = 0
    tokens_per_s = 0.0
    ckpt_path = None
    # next-token losses above 2 ln(vocab) (twice the loss of guessing uniformly) mean a diverging run
    vocab = getattr(getattr(raw_model, "config", None), "vocab_size", None)
    blowup = 2 * math.log(vocab) if objective is lm_objective and step_fn is None and isinstance(vocab, int) else None
    if start_step == 0 and cfg.eval_every and not history["eval_step"] and is_main:
        run_eval(0)
    for step in range(start_step, end_step):
        lr = lr_schedule(step, cfg.max_steps, cfg.warmup_steps, cfg.lr, cfg.min_lr)
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr >= 0):
            raise ValueError(f"the learning-rate schedule returned {lr!r} at step {step}; it must be a finite number >= 0.")
        for group in optimizer.param_groups:
            group["lr"] = lr
        idx = data_mod.shard(data_mod.global_batch_indices(n_train, cfg.batch_size, step, cfg.seed), rank, world)
        batch = move_to(data.train.batch(idx), device)
        tic = time.perf_counter()
        try:
            if step_fn is not None:
                with (autocast() if autocast is not None else contextlib.nullcontext()):
                    got = step_fn(model, optimizer, batch, cfg.grad_clip)
                metrics = dict(got) if isinstance(got, dict) else {"loss": got}
                metrics = {k: torch.as_tensor(float(v)) for k, v in metrics.items()}
                metrics.setdefault("grad_norm", torch.tensor(float("nan")))
                _check_finite("the loss", metrics["loss"], f"at step {step}")
            else:
                metrics = objective_step(model, optimizer, batch, objective, cfg.grad_clip, autocast)
                if world > 1 and float(metrics.get("skipped", 0.0)):
                    raise RuntimeError("a distributed step had no supervised token on one process.")
        except FloatingPointError as err:
            raise diverged(err, step) from None
        if not float(metrics.get("skipped", 0.0)):
            ckpt_path = promote()  # this step's loss was computed on the pending checkpoint's weights
        names = sorted(k for k in metrics if k not in ("grad_norm", "skipped"))
        values = torch.stack([metrics[k].float().to(device) for k in names])
        if world > 1:  # the global mean, as one process with the whole batch would log it
            import torch.distributed as dist

            dist.all_reduce(values)
            values = values / world
        values = values.tolist()  # synchronizes the device, so the timing below is honest
        train_seconds += time.perf_counter() - tic
        first = batch[0] if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor) else None
        tokens_seen += (first.numel() * world) if first is not None else cfg.batch_size * cfg.seq_len
        tokens_per_s = tokens_seen / max(train_seconds, 1e-9)
        logged = dict(zip(names, values))
        history["step"].append(step)
        history["lr"].append(lr)
        history["grad_norm"].append(float(metrics["grad_norm"]))
        history["skipped"].append(float(metrics.get("skipped", 0.0)))
        for k in set(history) - {"step", "lr", "grad_norm", "skipped"} - {h for h in history if h.startswith("eval_")}:
            if k not in logged:
                history[k].append(0.0 if k == "aux_loss" else float("nan"))
        for k, v in logged.items():
            history.setdefault(k, [float("nan")] * (len(history["step"]) - 1)).append(v)
        loss_f = logged["loss"]
        if blowup is not None and loss_f > blowup and is_main:
            log(f"warning: the loss at step {step + 1} is {loss_f:.4g}, more than twice ln(vocab_size) = {blowup / 2:.2f} "
                "(the loss of guessing uniformly): the run is diverging. Lower the learning rate (a run resumes with "
                "another lr).")
            blowup = None  # said once
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss_f:.3f}", tok_s=f"{tokens_per_s:,.0f}")
        if cfg.log_every and (step + 1) % cfg.log_every == 0:
            log(f"step {step + 1}/{cfg.max_steps} | loss {loss_f:.4f} | lr {lr:.2e} | {tokens_per_s:,.0f} tok/s")
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.max_steps) and is_main:
            run_eval(step + 1)
        if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < end_step:
            checkpoint(step + 1, pending=True)  # kept once the next step's loss is finite
    if bar is not None:
        bar.close()
    skipped = int(sum(history["skipped"][len(history["skipped"]) - (end_step - start_step):])) if end_step > start_step else 0
    if end_step > start_step and skipped == end_step - start_step:
        if pending_step is not None:
            os.remove(pending_file)
        raise ValueError(
            f"every one of the {skipped} steps was skipped: no batch held a supervised token (every label was -100), "
            "so the weights did not change. For chat data the prompts probably fill max_length (see the dataset's "
            "truncation counts and warning): raise max_length (seq_len), shorten the prompts, or check the labels."
        )
    if skipped and is_main:
        log(f"note: {skipped} of {end_step - start_step} steps were skipped: their batches held no supervised token "
            "(every label -100), so they changed nothing.")
    if cfg.out_dir and end_step > start_step:
        ckpt_path = checkpoint(end_step)
    return TrainResult(raw_model, tokenizer, history, end_step, tokens_per_s, time.perf_counter() - t0, ckpt_path, data)


# ---------------------------------------------------------------------- command line
def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def config_from_args(argv: Optional[Sequence[str]] = None) -> Tuple[TrainConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="python -m minimind_ref.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="a JSON file with TrainConfig fields (missing keys keep their defaults), or the name "
                   f"of a config shipped with the package: {', '.join(named_configs())}")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="override options, values parsed as JSON: --set max_steps=100 model.hidden_size=256")
    p.add_argument("--stop-at", type=int, default=None, help="stop after this step (the schedule still plans max_steps)")
    p.add_argument("--history", default=None, help="write the loss history (JSON) to this file")
    args = p.parse_args(argv)
    if args.history and os.path.isdir(os.path.expanduser(args.history)):
        p.error(f"--history {args.history} is a folder; give a file name, e.g. {os.path.join(args.history, 'history.json')}")
    try:
        d = TrainConfig().to_dict()
        if args.config:
            d = TrainConfig.from_json(args.config).to_dict()
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep:
                p.error(f"--set expects KEY=VALUE, got {item!r}")
            if key.startswith("model."):
                d["model"][key[len("model."):]] = _parse_value(value)
            else:
                d[key] = _parse_value(value)
        return TrainConfig.from_dict(d), args
    except (ValueError, FileNotFoundError) as err:
        p.error(str(err))  # exits with status 2 and the message, not a traceback
        raise  # unreachable: p.error exits


def main(argv: Optional[Sequence[str]] = None) -> int:
    cfg, args = config_from_args(argv)
    rank, world, _ = dist_info()
    try:
        result = train(cfg, stop_at=args.stop_at)
        if rank == 0:
            h = result.history
            print(f"done: step {result.step}, last loss {h['loss'][-1]:.4f}, {result.tokens_per_s:,.0f} tok/s "
                  f"(x{world} processes), {result.seconds:.1f} s" + (f", checkpoint {result.checkpoint}" if result.checkpoint else ""))
            if args.history:
                from .files import write_json

                write_json(args.history, {"history": h, "step": result.step, "world_size": world,
                                          "tokens_per_s": result.tokens_per_s}, indent=None)
    finally:
        if world > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
