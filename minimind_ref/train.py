"""The training loop of every stage (pretraining, SFT, LoRA, DPO, GRPO), its pieces, and a
command line that also runs under torchrun.

    python -m minimind_ref.train --config ch08_cpu            # a config shipped with the package
    python -m minimind_ref.train --config my_run.json --set max_steps=100 lr=1e-3
    torchrun --standalone --nproc_per_node 2 -m minimind_ref.train --config ch08_cpu

One optimizer step (``train_step``)::

    loss = cross_entropy(shifted logits, shifted labels) (+ MoE auxiliary loss)
    loss.backward(); clip_grad_norm_(max_norm); AdamW.step(); zero_grad()

with the learning rate set before every step by ``lr_at`` (linear warmup, then cosine decay to
``min_lr``). With ``accumulation_steps`` k the step runs k micro-batches, each loss scaled by 1/k,
before its one clip and update (``accumulation_step``). ``dtype="auto"`` picks the precision with
``utils.half_precision``: bf16 autocast on GPUs that have bf16 in hardware, fp16 autocast with a
gradient scaler on the others (the T4), fp32 on a CPU (weights and optimizer stay fp32 under
autocast); ``compile=True`` runs the steps through ``torch.compile``. Under ``torchrun`` every
process trains a slice of the global batch inside ``DistributedDataParallel`` (``nccl`` on GPUs,
``gloo`` on CPUs), which averages the gradients, so N processes with batch B/N follow the same
trajectory as one process with batch B. Upstream's recipes are shipped as configs
(``pretrain_minimind2_small``, ``sft_minimind2_small``, ``pretrain_minimind3``, ``sft_minimind3``);
``python -m minimind_ref.plan`` says whether a run fits a GPU and how long it takes.

``train`` is the loop: prepare (processes, resume state, data, model, optimizer), then for each
step batch -> objective -> update -> log, evaluate, checkpoint, then finish. What it delegates
lives with the concept: ``distributed`` (processes and device under torchrun) and ``run_state``
(what a run resumes from, which checkpoint is kept, what a diverging run is told). Checkpoints are
``save_checkpoint`` files (``minimind_ref.load_checkpoint`` reads them) whose ``extra`` holds the
step, the optimizer state, the loss history and the RNG state, so a resumed run continues the same
loss curve. Needs the optional dependencies ``tokenizers`` and ``tqdm``.

Fine-tuning stages reuse the same loop through hooks (``train(cfg, objective=..., data=...)``): an
*objective* maps ``(model, batch)`` to ``{"loss": ..., metrics}``; ``minimind_ref.sft``,
``lora``, ``dpo`` and ``grpo`` provide theirs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from . import data as data_mod
from . import datafiles, token_cache
from .config import MiniMindConfig
from .distributed import Processes, dist_info, resolve_device, setup_processes  # noqa: F401  (also train's names)
from .model import MiniMindForCausalLM
from .run_state import (CHECKPOINT_NAME, RESUMABLE_CHANGES, TOKENIZER_NAME, CheckpointPolicy,  # noqa: F401
                        DivergenceGuard, ResumeState, check_finite, check_scaler_overflow, next_token_ceiling,
                        prepare_run_folder, training_state)
from .run_state import load_resume_blob as _load_resume_blob  # noqa: F401  (tests/test_bad_input.py)
from .tokenizer import BOS_ID, EOS_ID, PAD_ID, load_tokenizer, save_tokenizer, train_bpe_tokenizer
from .truncation import truncation_note

# ---------------------------------------------------------------------- configuration
CONFIG_DIR = Path(__file__).with_name("configs")


#: The precisions a run can ask for (``TrainConfig.dtype``); see ``precision_for``.
DTYPES = ("auto", "float32", "bfloat16", "float16")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass
class TrainConfig:
    """Everything a run needs; a JSON file with any subset of these keys is a config file.

    Every value is checked when the config is made: a wrong type or an out-of-range value raises
    ``ValueError`` naming the option, the value and what is allowed. Keys that start with ``_``
    (``_comment``, and a recipe's ``_upstream`` notes) are comments: read and ignored.

    The loop's options beyond one step on one batch (all off by default; the chapters use none):

    * ``accumulation_steps`` (k): gradient accumulation. ``batch_size`` is one *micro-batch* (the
      global one, split across processes); an optimizer step runs k of them, each loss scaled by
      1/k, then clips and steps once, so it sees ``k * batch_size`` sequences. The schedule, the
      step numbers, ``max_steps``, ``log_every``, ``eval_every`` and ``save_every`` count optimizer
      steps. Micro-batch ``m = step * k + i`` is ``data.global_batch_indices(..., m, ...)``: the k
      micro-batches of a step are exactly the batch of ``k * batch_size`` one step without
      accumulation would take. Under ``torchrun`` the first k - 1 skip DDP's gradient all-reduce
      (``no_sync``).
    * ``epochs``: when set, ``max_steps`` is derived from the training set:
      ``ceil(epochs * len(train) / (batch_size * accumulation_steps))`` (upstream's recipes
      count epochs).
    * ``dtype``: ``"auto"`` asks ``utils.half_precision(device)``: bf16 autocast on GPUs that have
      it in hardware (compute capability 8.0+), fp16 autocast with a gradient scaler on the others
      (the T4) and on Apple MPS, fp32 on a CPU. ``"float32"``, ``"bfloat16"`` and ``"float16"``
      force one (fp16 always with a ``torch.amp.GradScaler``). Weights and optimizer state stay
      fp32 under autocast. The scaler's skipped updates (a gradient overflowed fp16) are counted in
      ``history["scaler_skipped"]`` beside ``history["loss_scale"]``, and are not a divergence.
    * ``compile``: ``torch.compile`` the model for the training steps (evaluation and checkpoints
      use the eager module, which shares its weights).

    **Data.** ``data="generated"`` builds chapter 08's corpus (``n_docs``, ``n_val_docs``,
    ``story_fraction``, ``data_seed``). A ``.jsonl`` file of upstream's pretraining lines
    (``{"text": ...}``, as ``pretrain_hq.jsonl``) or a ``.parquet`` file with a ``text`` column is
    tokenized once, by ``data_workers`` processes, into a cache under ``data_cache``, keyed by the
    SHA-256 of the file and of the tokenizer (``minimind_ref.token_cache``); runs then read their
    windows from the memory-mapped token file, so memory stays flat whatever the file's size, and a
    second run (or every process of a ``torchrun`` run after the first) finds the tokens ready. Its
    last ``min(n_val_docs, 5 %)`` documents are the validation set. Give ``tokenizer`` (upstream's
    ``model/tokenizer.json``) for a real run: without it a BPE tokenizer of ``vocab_size`` is trained
    on the file's training documents first. Any other path is a plain-text file, read whole
    (``data.read_text_documents``); a ``.txt`` that holds JSON lines is refused rather than trained
    on as text. Documents are framed ``[bos] text [eos]`` and packed into windows of ``seq_len``
    tokens, nothing padded, whatever the source; the batches of a step are a function of ``seed``
    and the step alone (``data.global_batch_indices``), so a resumed run sees the same batches and
    each ``torchrun`` process reads only its own share of them."""

    # data: "generated" (stories + addition drills, see minimind_ref.data), or a path to a data file:
    # * upstream's pretraining JSON lines (.jsonl, one {"text": ...} per line, e.g. pretrain_hq.jsonl) or
    #   a .parquet file with a "text" column (needs pyarrow): tokenized once, in parallel, into a cache
    #   (minimind_ref.token_cache) and trained from a memory-mapped token file, so memory stays flat
    #   whatever the file's size; its last min(n_val_docs, 5 %) documents are held out for validation;
    # * any other file is plain text, read whole (data.read_text_documents: documents at blank lines),
    #   its last 5 % of documents held out; a .txt that holds JSON lines is refused.
    data: str = "generated"
    n_docs: int = 20000  # generated data: documents in the training corpus
    n_val_docs: int = 400  # generated data: the validation corpus; a .jsonl/.parquet file: documents held out
    story_fraction: float = 0.5
    data_seed: int = 0
    data_cache: Optional[str] = None  # the token cache's folder (None: $MINIMIND_CACHE or ~/.cache/minimind_ref)/tokens
    data_workers: int = 0  # processes that tokenize a data file (0: one per CPU, at most 16)
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
    batch_size: int = 32  # global: split evenly across processes; one micro-batch when accumulating
    accumulation_steps: int = 1  # micro-batches per optimizer step (gradient accumulation)
    max_steps: int = 400  # optimizer steps
    epochs: Optional[float] = None  # when set: max_steps = ceil(epochs * len(train) / (batch_size * accumulation_steps))
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
    dtype: str = "auto"  # "auto" (utils.half_precision: bf16, fp16 + scaler, or fp32), "float32", "bfloat16", "float16"
    compile: bool = False  # torch.compile the model for the training steps
    seed: int = 0
    progress: bool = True  # tqdm bar on the first process
    deterministic: bool = False  # torch.use_deterministic_algorithms(True)

    def __post_init__(self) -> None:
        def bad(option: str, value: Any, allowed: str) -> None:
            raise ValueError(f"training option {option}={value!r} is invalid: {allowed}.")

        for name in ("n_docs", "n_val_docs", "batch_size", "accumulation_steps", "max_steps", "eval_batches", "seq_len",
                     "vocab_size"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                bad(name, v, "expected a whole number >= 1")
        if self.seq_len < 2:
            bad("seq_len", self.seq_len, "a window needs at least 2 tokens (one input and the token it predicts)")
        for name in ("data_seed", "seed", "warmup_steps", "eval_every", "eval_problems", "log_every", "save_every",
                     "data_workers"):
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
        if self.dtype not in DTYPES:
            bad("dtype", self.dtype, "expected 'auto', 'float32', 'bfloat16' or 'float16'")
        if self.epochs is not None and not (_is_number(self.epochs) and self.epochs > 0):
            bad("epochs", self.epochs, "expected a positive number of passes over the training set, or null (then "
                "max_steps says how long the run is)")
        for name in ("tokenizer", "out_dir", "resume", "data_cache"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                bad(name, v, "expected a path (string) or null")
        for name in ("split_digits", "progress", "deterministic", "compile"):
            if not isinstance(getattr(self, name), bool):
                bad(name, getattr(self, name), "expected true or false")
        if not isinstance(self.model, dict):
            bad("model", self.model, "expected a mapping of MiniMindConfig keyword arguments")

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in set(d) - names if not (isinstance(k, str) and k.startswith("_")))
        if unknown:
            raise ValueError(f"unknown training option(s) {unknown}; valid: {sorted(names)} (keys that start with _ "
                             "are comments).")
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
Evaluate = Callable[[torch.nn.Module, int], Dict[str, float]]  # (model, step) -> {name: value}
Schedule = Callable[[int, int, int, float, float], float]  # lr_at's signature
StepFn = Callable[..., Any]  # (model, optimizer, batch, max_grad_norm) -> loss, or {"loss": ..., metrics}


def lm_objective(model: torch.nn.Module, batch: Tuple[torch.Tensor, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Next-token prediction: ``batch = (input_ids, labels)``, labels -100 where no loss counts.

    ``loss = out.loss + out.aux_loss`` (the MoE load-balancing term, 0 for dense models), as
    upstream's trainers add them; ``aux_loss`` is logged separately."""
    input_ids, labels = batch
    out = model(input_ids, labels=labels)
    return {"loss": out.loss + out.aux_loss, "aux_loss": out.aux_loss.detach(),
            "tokens": (labels[:, 1:] != -100).sum()}


def objective_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    objective: Objective = lm_objective,
    max_grad_norm: Optional[float] = 1.0,
    autocast: Optional[Callable[[], Any]] = None,
    scaler: Optional["torch.amp.GradScaler"] = None,
) -> Dict[str, torch.Tensor]:
    """One optimizer step on any objective; returns its metrics (detached) plus ``grad_norm``.

    Forward (under ``autocast()`` if given) -> ``objective(model, batch)["loss"]`` -> backward ->
    clip the global gradient norm to ``max_grad_norm`` (None: no clipping) -> ``optimizer.step()``
    -> ``zero_grad``. A non-finite loss or gradient norm raises ``FloatingPointError`` *before*
    the update, so the weights (and any checkpoint saved later) stay finite. A batch whose
    ``tokens`` metric is 0 is skipped: no update, ``skipped`` = 1 in the metrics.
    ``max_grad_norm`` must be None or a positive number (a negative one would reverse the update).
    With a gradient ``scaler`` (fp16), see ``accumulation_step``."""
    return accumulation_step(model, optimizer, [batch], objective, max_grad_norm, autocast, scaler)


def accumulation_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[Any],
    objective: Objective = lm_objective,
    max_grad_norm: Optional[float] = 1.0,
    autocast: Optional[Callable[[], Any]] = None,
    scaler: Optional["torch.amp.GradScaler"] = None,
) -> Dict[str, torch.Tensor]:
    """One optimizer step on k micro-batches (gradient accumulation, as upstream's trainers do it,
    ``c090b69:trainer/train_pretrain.py:32-46``): each micro-batch's loss is scaled by 1/k and
    back-propagated, the gradients add up, then one clip and one optimizer step. With k = 1 this
    is ``objective_step`` (the loss is not rescaled). For a loss that is a mean over a fixed number
    of tokens per micro-batch (packed pretraining windows) the step equals one step on the k
    micro-batches concatenated; where micro-batches hold different numbers of supervised tokens
    (chat data) each micro-batch weighs 1/k, as upstream's ``loss / args.accumulation_steps``.

    Under ``DistributedDataParallel`` the first k - 1 micro-batches run inside ``model.no_sync()``:
    their gradients stay local and the last backward all-reduces the sum once.

    ``scaler`` (a ``torch.amp.GradScaler``, for fp16 autocast): the losses are scaled before
    backward, the gradients unscaled before clipping (``grad_norm`` is the true norm), and
    ``scaler.step`` skips the update when a gradient overflowed; the metrics then carry
    ``scaler_skipped`` = 1 and ``loss_scale`` (the scale the step used). A skipped update is the
    scaler doing its work, not a divergence (``run_state.check_scaler_overflow``): only a gradient
    that is not finite at a scale of 1 or less raises ``FloatingPointError``.

    Metrics: every entry averaged over the micro-batches that held supervised tokens (``tokens``
    summed); ``skipped`` = 1 when none did (no update)."""
    if max_grad_norm is not None and (isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, (int, float))
                                      or math.isnan(max_grad_norm) or max_grad_norm <= 0):
        raise ValueError(f"max_grad_norm={max_grad_norm!r} is invalid: expected a positive number (the largest allowed "
                         "gradient norm) or None for no clipping; 0 would zero every update and a negative value would "
                         "reverse it (gradient ascent).")
    k = len(micro_batches)
    if k < 1:
        raise ValueError("accumulation_step needs at least one micro-batch.")
    parts: List[Tuple[Dict[str, torch.Tensor], bool]] = []  # (metrics, back-propagated)
    try:
        for i, batch in enumerate(micro_batches):
            local = k > 1 and i < k - 1 and hasattr(model, "no_sync")  # DDP: all-reduce only on the last
            with (model.no_sync() if local else contextlib.nullcontext()):
                parts.append(_micro_backward(model, batch, objective, autocast, scaler, k))
    except FloatingPointError:
        optimizer.zero_grad(set_to_none=True)  # gradients of earlier micro-batches must not leak into a resumed step
        raise
    used = [m for m, backed in parts if backed]
    out = _merge_metrics([m for m, _ in parts] if not used else used, parts)
    if not used:
        optimizer.zero_grad(set_to_none=True)
        out.update(grad_norm=torch.tensor(0.0), skipped=torch.tensor(1.0))
        if scaler is not None:
            out.update(scaler_skipped=torch.tensor(0.0), loss_scale=torch.tensor(float(scaler.get_scale())))
        return out
    if scaler is not None:
        scaler.unscale_(optimizer)
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, math.inf if max_grad_norm is None else max_grad_norm)
    if scaler is None:
        if not bool(torch.isfinite(grad_norm)):
            optimizer.zero_grad(set_to_none=True)
            check_finite("the gradient norm", grad_norm, "before the update")
        optimizer.step()
    else:
        scale = float(scaler.get_scale())
        scaler.step(optimizer)  # skipped when unscale_ found an inf or nan
        scaler.update()  # halves the scale after an overflow, doubles it after growth_interval clean steps
        overflowed = float(scaler.get_scale()) < scale
        if overflowed:
            optimizer.zero_grad(set_to_none=True)
            check_scaler_overflow(grad_norm, scale)
        out.update(scaler_skipped=torch.tensor(float(overflowed)), loss_scale=torch.tensor(scale))
    optimizer.zero_grad(set_to_none=True)
    out.update(grad_norm=grad_norm.detach(), skipped=torch.tensor(0.0))
    return out


def _micro_backward(model: torch.nn.Module, batch: Any, objective: Objective, autocast: Optional[Callable[[], Any]],
                    scaler: Optional["torch.amp.GradScaler"], k: int) -> Tuple[Dict[str, torch.Tensor], bool]:
    """Forward and backward of one micro-batch (its loss scaled by 1/k); ``(metrics, back-propagated)``:
    a batch whose ``tokens`` metric is 0 is not back-propagated."""
    with (autocast() if autocast is not None else contextlib.nullcontext()):
        metrics = objective(model, batch)
    if not isinstance(metrics, dict) or not isinstance(metrics.get("loss"), torch.Tensor) or metrics["loss"].numel() != 1:
        got = type(metrics).__name__ if not isinstance(metrics, dict) else f"a dict with keys {sorted(metrics)}"
        raise TypeError(f"the objective must return a dict with 'loss' (a scalar tensor) and other metrics, got {got}.")
    loss = metrics["loss"]
    if "tokens" in metrics and int(metrics["tokens"]) == 0:
        return metrics, False
    check_finite("the loss", loss.detach(), "before the update")
    if not loss.requires_grad:
        raise ValueError("the objective's loss carries no gradient (computed under torch.no_grad() or detached?), so "
                         "the optimizer could not learn from it; return the loss as computed from the model's outputs.")
    if k > 1:
        loss = loss / k
    (scaler.scale(loss) if scaler is not None else loss).backward()
    return metrics, True


def _merge_metrics(chosen: List[Dict[str, torch.Tensor]], parts: List[Tuple[Dict[str, torch.Tensor], bool]]
                   ) -> Dict[str, torch.Tensor]:
    """One step's metrics from its micro-batches' (detached): one micro-batch's as they are; else each
    metric's mean over ``chosen`` and ``tokens`` summed over all of them."""
    if len(parts) == 1:
        return {k: v.detach() for k, v in parts[0][0].items()}
    out: Dict[str, torch.Tensor] = {}
    for key in dict.fromkeys(k for m in chosen for k in m):
        values = [m[key].detach().float() for m in chosen if key in m]
        out[key] = torch.stack(values).mean()
    if any("tokens" in m for m, _ in parts):
        out["tokens"] = torch.stack([m["tokens"].detach() for m, _ in parts if "tokens" in m]).sum()
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
    """Documents -> tokenizer (loaded from ``cfg.tokenizer``, given, or trained) -> packed datasets.

    A ``.jsonl`` or ``.parquet`` file goes through the token cache (``token_cache.prepare_token_cache``:
    tokenized once, in ``cfg.data_workers`` processes) and its windows are read from the memory-mapped
    tokens (``token_cache.TokenWindows``); the same windows ``encode_documents`` and ``PackedDataset``
    would make of its documents. A tokenizer trained here sees the file's training documents streamed."""
    if cfg.data != "generated" and datafiles.data_format(cfg.data) != "text":
        return _file_data(cfg, tokenizer)
    if cfg.data == "generated":
        train_pairs, test_pairs = data_mod.arithmetic_split()
        train_docs = data_mod.make_corpus(cfg.n_docs, seed=cfg.data_seed, story_fraction=cfg.story_fraction, pairs=train_pairs)
        val_docs = data_mod.make_corpus(cfg.n_val_docs, seed=cfg.data_seed + 1, story_fraction=cfg.story_fraction, pairs=test_pairs)
    else:
        datafiles.check_text_file(cfg.data)  # JSON lines or a binary file named .txt: refused, not trained on
        docs = data_mod.read_text_documents(cfg.data)
        n_val = max(1, len(docs) // 20)
        train_docs, val_docs, test_pairs = docs[:-n_val], docs[-n_val:], []
    if tokenizer is None:
        tokenizer = load_tokenizer(cfg.tokenizer) if cfg.tokenizer else train_bpe_tokenizer(
            train_docs, vocab_size=cfg.vocab_size, split_digits=cfg.split_digits)
    train = data_mod.PackedDataset(data_mod.encode_documents(tokenizer, train_docs), cfg.seq_len)
    val = data_mod.PackedDataset(data_mod.encode_documents(tokenizer, val_docs), cfg.seq_len)
    return RunData(tokenizer, train, val, list(test_pairs))


def _file_data(cfg: TrainConfig, tokenizer=None) -> RunData:
    """``build_data`` for a ``.jsonl`` / ``.parquet`` pretraining file: tokenizer, then the token cache,
    then windows of its training and validation documents, read from the memory map."""
    if tokenizer is None and cfg.tokenizer:
        tokenizer = load_tokenizer(cfg.tokenizer)
    first = dist_info()[0] == 0  # the process that logs (the others find the cache it made)
    if tokenizer is None:  # trained on the training documents, streamed (the held-out ones left out)
        n_docs = datafiles.count_documents(cfg.data)
        n_train = n_docs - token_cache.validation_documents(n_docs, cfg.n_val_docs)
        if cfg.progress and first:
            print(f"training a {cfg.vocab_size}-token BPE tokenizer on the {n_train:,} training documents of {cfg.data} "
                  "(give tokenizer=..., e.g. upstream's model/tokenizer.json, to use one instead)")
        tokenizer = train_bpe_tokenizer(itertools.islice(datafiles.iter_texts(cfg.data), n_train),
                                        vocab_size=cfg.vocab_size, split_digits=cfg.split_digits)
    cache = token_cache.prepare_token_cache(cfg.data, tokenizer, cfg.data_cache, cfg.data_workers,
                                          progress=cfg.progress and first, log=print if cfg.progress and first else None)
    train, val = token_cache.split_windows(cache, cfg.seq_len, cfg.n_val_docs)
    return RunData(tokenizer, train, val, [])


def build_model(cfg: TrainConfig, vocab_size: int) -> MiniMindForCausalLM:
    """A ``MiniMindForCausalLM`` from ``cfg.model`` with the tokenizer's vocabulary size."""
    return MiniMindForCausalLM(MiniMindConfig(**{**cfg.model, "vocab_size": vocab_size}))


# ---------------------------------------------------------------------- precision
@dataclass(frozen=True)
class Precision:
    """How a run computes: the autocast ``dtype`` (None: plain fp32), whether its updates go
    through a gradient scaler (fp16), and why, in words to print."""

    dtype: Optional[torch.dtype]
    scaler: bool
    reason: str

    def autocast(self, device: torch.device) -> Optional[Callable[[], Any]]:
        """A zero-argument autocast context factory for ``device``, or None for plain fp32."""
        if self.dtype is None:
            return None
        dtype = self.dtype
        return lambda: torch.autocast(device_type=device.type, dtype=dtype)

    def grad_scaler(self, device: torch.device) -> Optional["torch.amp.GradScaler"]:
        """A fresh ``torch.amp.GradScaler`` for ``device`` when the precision needs one (fp16)."""
        return torch.amp.GradScaler(device.type) if self.scaler else None


def precision_for(cfg: TrainConfig, device: torch.device) -> Precision:
    """The precision of ``cfg.dtype`` on ``device``: ``"auto"`` follows ``utils.half_precision``
    (bf16 where the GPU has it in hardware, fp16 with a scaler on older GPUs and MPS, fp32 on a
    CPU); ``"float16"`` always trains with a gradient scaler."""
    if cfg.dtype == "float32":
        return Precision(None, False, "fp32: asked for (dtype='float32')")
    if cfg.dtype == "bfloat16":
        return Precision(torch.bfloat16, False, "bf16 autocast: asked for (dtype='bfloat16')")
    if cfg.dtype == "float16":
        return Precision(torch.float16, True, "fp16 autocast with a gradient scaler: asked for (dtype='float16')")
    if cfg.dtype != "auto":
        raise ValueError(f"dtype must be one of {', '.join(map(repr, DTYPES))}, got {cfg.dtype!r}.")
    from .utils import half_precision

    chosen = half_precision(device)
    return Precision(chosen.dtype, chosen.needs_scaler, chosen.reason)


def autocast_for(cfg: TrainConfig, device: torch.device) -> Optional[Callable[[], Any]]:
    """A zero-argument autocast context factory, or None for plain fp32 (``precision_for``'s)."""
    return precision_for(cfg, device).autocast(device)


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


def train(cfg: TrainConfig, model: Optional[MiniMindForCausalLM] = None, data: Optional[RunData] = None,
          stop_at: Optional[int] = None, log: Optional[Callable[[str], None]] = None,
          objective: Optional[Objective] = None, evaluate: Optional[Evaluate] = None,
          lr_schedule: Optional[Schedule] = None, step_fn: Optional[StepFn] = None) -> TrainResult:
    """Train (or resume) according to ``cfg``; returns the model and its history. One loop for every
    stage of the course (pretraining, SFT, LoRA, DPO, GRPO); what differs is passed in:

    * ``model`` / ``data``: used instead of building them from ``cfg``;
    * ``objective(model, batch) -> {"loss": ..., other metrics}`` (default ``lm_objective``);
    * ``evaluate(model, step) -> {name: float}`` every ``cfg.eval_every`` steps, into ``history["eval_<name>"]``
      (default: the objective's loss on ``data.val`` and, for generated data, held-out addition accuracy);
    * ``lr_schedule(step, max_steps, warmup_steps, max_lr, min_lr)`` (default ``lr_at``);
    * ``step_fn(model, optimizer, batch, max_grad_norm) -> loss`` (or ``{"loss": ...}``): your own step
      instead of ``objective_step``, under the run's autocast (chapter 08's ``training_step``).

    ``stop_at``: stop after this step (the schedule still plans ``cfg.max_steps``); ``log``: where lines go
    (default: ``print`` on the first process). Processes: ``distributed``; resume, checkpoints: ``run_state``.
    ``cfg.accumulation_steps``, ``cfg.dtype`` (``precision_for``) and ``cfg.compile`` apply to every
    objective alike; a ``step_fn`` makes its own update, so it takes neither accumulation nor fp16's scaler."""
    cfg = _checked_config(cfg, stop_at)
    procs = setup_processes(cfg)  # rank, world size, device (and the process group under torchrun)
    log = log if log is not None else (print if procs.is_main else _silent)
    _seed_run(cfg)
    objective, lr_schedule = objective or lm_objective, lr_schedule or lr_at
    resume = ResumeState.find(cfg)  # read and checked; nothing is written yet
    data = data if data is not None else _run_data(cfg, resume, procs)
    fingerprint = _check_train_data(data, resume)
    cfg = _steps_from_epochs(cfg, data)  # epochs, when given, set max_steps
    precision = _run_precision(cfg, procs, step_fn, log)  # autocast dtype, and a gradient scaler for fp16
    scaler = precision.grad_scaler(procs.device)
    model = _model_for_run(model, cfg, data.tokenizer, procs.device)
    optimizer = make_optimizer(model, cfg)
    start_step, history = resume.restore(model, optimizer, procs.device, log, stop_at, scaler) or (0, _new_history())
    if cfg.out_dir and procs.is_main:  # every check passed: now the run folder may be written
        prepare_run_folder(cfg, data.tokenizer, resume)
    raw_model, model = model, procs.wrap(_compiled(model, cfg))
    autocast = precision.autocast(procs.device)
    evaluate = evaluate or _lm_eval(cfg, data, objective, procs.device, autocast)
    end_step = cfg.max_steps if stop_at is None else min(stop_at, cfg.max_steps)
    checkpoints = CheckpointPolicy(cfg.out_dir, procs.is_main, raw_model, lambda step: training_state(
        step, optimizer, history, cfg, procs.device, fingerprint, scaler), resume, start_step)
    guard = DivergenceGuard(checkpoints, _loss_ceiling(raw_model, objective, step_fn, procs))
    progress = _Progress(cfg, procs, log, start_step, end_step)
    _note_truncation(data, progress.log, procs.is_main)
    if start_step == 0 and cfg.eval_every and not history["eval_step"] and procs.is_main:
        _evaluate(evaluate, raw_model, 0, history, progress.log)
    for step in range(start_step, end_step):
        lr = _set_lr(optimizer, lr_schedule, cfg, step)
        batches = _micro_batches(data.train, cfg, step, procs)  # accumulation_steps of them
        with progress.timing(batches):  # the step's seconds and tokens: the run's throughput
            with guard.watching(step):  # a non-finite loss or gradient: stop before the update
                metrics = _update(model, optimizer, batches, objective, step_fn, cfg, autocast, scaler, procs, step)
            if not float(metrics.get("skipped", 0.0)):
                checkpoints.promote()  # this step's loss was computed on the pending checkpoint's weights
            logged = _record_step(history, step, lr, metrics, procs)  # synchronizes the device
        guard.check_loss(logged["loss"], step, progress.log)
        progress.step_done(step, logged["loss"], lr)
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.max_steps) and procs.is_main:
            _evaluate(evaluate, raw_model, step + 1, history, progress.log)
        if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < end_step:
            checkpoints.save(step + 1, pending=True)  # kept once the next step's loss is finite
    progress.close()
    _check_skipped(history, start_step, end_step, checkpoints, progress.log, procs.is_main)
    _note_scaler(history, start_step, end_step, progress.log, procs.is_main)
    path = checkpoints.save(end_step) if end_step > start_step else None
    return TrainResult(raw_model, data.tokenizer, history, end_step, progress.tokens_per_s, progress.seconds(), path, data)


# ---------------------------------------------------------------------- the loop's pieces, in the order it uses them
def _checked_config(cfg: TrainConfig, stop_at: Optional[int]) -> TrainConfig:
    """``cfg`` with ``~`` in ``out_dir`` and ``resume`` meaning the home folder, as in a shell; a bad
    ``stop_at`` or an ``out_dir`` that is a file is a ``ValueError``."""
    if stop_at is not None and (isinstance(stop_at, bool) or not isinstance(stop_at, int) or stop_at < 1):
        raise ValueError(f"stop_at={stop_at!r} is invalid: expected a whole number >= 1 (the step to stop after), or None.")
    expanded = {k: os.path.expanduser(v) for k, v in (("out_dir", cfg.out_dir), ("resume", cfg.resume))
                if v not in (None, "auto") and v != os.path.expanduser(v)}
    if expanded:
        cfg = cfg.replace(**expanded)
    if cfg.out_dir and os.path.exists(cfg.out_dir) and not os.path.isdir(cfg.out_dir):
        raise ValueError(f"out_dir={cfg.out_dir!r} is a file, not a folder: the run writes ckpt.pt, tokenizer.json and "
                         "train_config.json into out_dir. Give a folder (it is created if needed).")
    return cfg


def _steps_from_epochs(cfg: TrainConfig, data: "RunData") -> TrainConfig:
    """``cfg`` with ``max_steps`` derived from ``cfg.epochs`` (when set) and the training set's size:
    ``ceil(epochs * len(train) / (batch_size * accumulation_steps))`` optimizer steps."""
    if cfg.epochs is None:
        return cfg
    steps = max(1, math.ceil(cfg.epochs * len(data.train) / (cfg.batch_size * cfg.accumulation_steps)))
    return cfg.replace(max_steps=steps)


def _run_precision(cfg: TrainConfig, procs: Processes, step_fn: Optional[StepFn], log: Callable[[str], None]) -> Precision:
    """``precision_for`` the run's device, checked against the options that cannot go with it: a
    ``step_fn`` does its own optimizer step, so it cannot accumulate gradients or go through a
    gradient scaler (``"auto"`` then trains in fp32 where it would have picked fp16)."""
    precision = precision_for(cfg, procs.device)
    if step_fn is None:
        return precision
    if cfg.accumulation_steps != 1:
        raise ValueError(f"accumulation_steps={cfg.accumulation_steps} cannot be combined with step_fn, which makes its "
                         "own optimizer step on each batch; pass an objective instead (train(cfg, objective=...)), or "
                         "set accumulation_steps=1.")
    if precision.scaler and cfg.dtype != "auto":
        raise ValueError("dtype='float16' trains through a gradient scaler, which cannot wrap step_fn's own optimizer "
                         "step; pass an objective instead, or choose dtype 'bfloat16' or 'float32'.")
    if precision.scaler:
        if procs.is_main:
            log(f"note: dtype='auto' would pick {precision.reason}; step_fn makes its own optimizer step, which the "
                "scaler cannot wrap, so this run trains in fp32.")
        return Precision(None, False, "fp32: step_fn cannot go through a gradient scaler")
    return precision


def _compiled(model: torch.nn.Module, cfg: TrainConfig) -> torch.nn.Module:
    """``torch.compile(model)`` when ``cfg.compile`` (the compiled module shares the model's
    parameters; evaluation and checkpoints use the eager one), else ``model`` itself."""
    return torch.compile(model) if cfg.compile else model


def _silent(line: str) -> None:
    """The log of every process but the first."""


def _seed_run(cfg: TrainConfig) -> None:
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(cfg.seed)


def _run_data(cfg: TrainConfig, resume: ResumeState, procs: Processes) -> RunData:
    """``build_data`` for a run: a resumed run reuses its own tokenizer file. In a distributed run the
    first process builds first (it trains the tokenizer, if there is none to load, and shares it through
    ``out_dir``; it tokenizes a data file into the token cache) while the others wait; then they load
    the tokenizer and find the tokens cached (``token_cache``: a cache folder shared by the processes)."""
    tokenizer = None
    run_tokenizer = os.path.join(cfg.out_dir, TOKENIZER_NAME) if cfg.out_dir else None
    if resume.path and not cfg.tokenizer and run_tokenizer and os.path.exists(run_tokenizer):
        tokenizer = load_tokenizer(run_tokenizer)
    if procs.world <= 1:
        return build_data(cfg, tokenizer)
    shared = tokenizer is None and not cfg.tokenizer  # trained here, shared through out_dir
    if shared and cfg.out_dir is None:
        raise ValueError("distributed runs need out_dir (or a tokenizer file) to share the tokenizer.")
    if procs.is_main:
        data = build_data(cfg, tokenizer)
        if shared:
            os.makedirs(cfg.out_dir, exist_ok=True)
            save_tokenizer(data.tokenizer, run_tokenizer)
    procs.barrier()
    if procs.is_main:
        return data
    return build_data(cfg, tokenizer=load_tokenizer(run_tokenizer) if shared else tokenizer)


def _check_train_data(data: RunData, resume: ResumeState) -> Optional[str]:
    """The training set's fingerprint, after checking that there is something to train on and that
    a resumed run gets its own data."""
    if not len(data.train):
        raise ValueError("the training dataset is empty (0 examples): nothing to train on. Check the data you built "
                         "(n_train, the records, drop_truncated).")
    fingerprint = data_fingerprint(data.train)
    resume.check_data(fingerprint)
    return fingerprint


def _model_for_run(model: Optional[torch.nn.Module], cfg: TrainConfig, tokenizer: Any, device: torch.device) -> Any:
    """The given model, or a new one drawn with ``cfg.seed``; on ``device``, in training mode."""
    if model is None:
        torch.manual_seed(cfg.seed)
        model = build_model(cfg, tokenizer.get_vocab_size())
    model.to(device).train()
    return model


def _loss_ceiling(model: torch.nn.Module, objective: Objective, step_fn: Optional[StepFn], procs: Processes) -> Optional[float]:
    """The loss above which the first process warns that the run diverges: 2 ln(vocab_size) for the
    plain next-token loss, None (no warning) for any other objective or step."""
    return next_token_ceiling(model) if objective is lm_objective and step_fn is None and procs.is_main else None


def _new_history() -> Dict[str, List[float]]:
    return {k: [] for k in ("step", "loss", "aux_loss", "lr", "grad_norm", "skipped", "eval_step", "eval_loss", "eval_acc")}


def _lm_eval(cfg: TrainConfig, data: RunData, objective: Objective, device: torch.device,
             autocast: Optional[Callable[[], Any]]) -> Evaluate:
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


class _Progress:
    """The run's log lines, its tqdm bar (first process, ``cfg.progress``) and its throughput (tokens
    per second of training steps; the clock starts when the object is made)."""

    def __init__(self, cfg: TrainConfig, procs: Processes, log: Callable[[str], None], start_step: int, end_step: int):
        self.cfg, self.world, self.bar, self.log = cfg, procs.world, None, log
        if cfg.progress and procs.is_main:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=end_step, initial=start_step, desc="train", unit="step", dynamic_ncols=True)
            self.log = self.bar.write if log is print else log
        self.train_seconds, self.tokens_seen, self.tokens_per_s, self.t0 = 0.0, 0, 0.0, time.perf_counter()

    @contextlib.contextmanager
    def timing(self, batches: Sequence[Any]) -> Iterator[None]:
        """Count the time the block takes as training time on ``batches`` (the step's micro-batches,
        each this process's slice of a global batch)."""
        tic = time.perf_counter()
        yield
        self.train_seconds += time.perf_counter() - tic
        for batch in batches:
            first = batch[0] if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor) else None
            self.tokens_seen += (first.numel() * self.world) if first is not None else self.cfg.batch_size * self.cfg.seq_len
        self.tokens_per_s = self.tokens_seen / max(self.train_seconds, 1e-9)

    def step_done(self, step: int, loss: float, lr: float) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{self.tokens_per_s:,.0f}")
        if self.cfg.log_every and (step + 1) % self.cfg.log_every == 0:
            self.log(f"step {step + 1}/{self.cfg.max_steps} | loss {loss:.4f} | lr {lr:.2e} | {self.tokens_per_s:,.0f} tok/s")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def seconds(self) -> float:
        return time.perf_counter() - self.t0


def _note_truncation(data: RunData, log: Callable[[str], None], is_main: bool) -> None:
    """Say what ``max_length`` cut away from the data (``SFTDataset`` / ``DPODataset`` count it)."""
    for what, dataset in (("training", data.train), ("validation", data.val)):
        counts = getattr(dataset, "truncation", None)
        if is_main and isinstance(counts, dict) and (counts.get("no_answer") or counts.get("cut_answer")):
            note = truncation_note(counts, "examples", counts.get("max_length", "?"), bool(counts.get("dropped")))
            log(f"note: {what} data: " + note)


def _evaluate(evaluate: Evaluate, model: torch.nn.Module, step: int,
              history: Dict[str, List[float]], log: Callable[[str], None]) -> None:
    """Run ``evaluate`` at ``step``, record it as ``history["eval_<name>"]`` and log it."""
    metrics = evaluate(model, step)
    history["eval_step"].append(step)
    for k in set(metrics) | {"loss", "acc"}:
        history.setdefault(f"eval_{k}", []).append(float(metrics.get(k, float("nan"))))
    parts = [f"{k} {v:.4f}" if k != "acc" else f"held-out accuracy {v:.1%}" for k, v in metrics.items()
             if not (isinstance(v, float) and math.isnan(v))]
    log(f"eval step {step}: " + ", ".join(parts))


def _set_lr(optimizer: torch.optim.Optimizer, lr_schedule: Schedule, cfg: TrainConfig, step: int) -> float:
    """Set the learning rate of ``step`` from the schedule (which must give a finite number >= 0)."""
    lr = lr_schedule(step, cfg.max_steps, cfg.warmup_steps, cfg.lr, cfg.min_lr)
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr >= 0):
        raise ValueError(f"the learning-rate schedule returned {lr!r} at step {step}; it must be a finite number >= 0.")
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def _batch(dataset: Any, cfg: TrainConfig, step: int, procs: Processes) -> Any:
    """This process's slice of step ``step``'s global batch (a function of the step alone, so a
    resumed run sees the same batches), on the run's device."""
    idx = data_mod.shard(data_mod.global_batch_indices(len(dataset), cfg.batch_size, step, cfg.seed), procs.rank, procs.world)
    return move_to(dataset.batch(idx), procs.device)


def _micro_batches(dataset: Any, cfg: TrainConfig, step: int, procs: Processes) -> List[Any]:
    """The ``accumulation_steps`` micro-batches of optimizer step ``step``: micro-batch
    ``step * accumulation_steps + i`` of the run's batch order (``_batch``), so they are the samples
    one step of ``accumulation_steps * batch_size`` would take, and a resumed run sees them again."""
    k = cfg.accumulation_steps
    return [_batch(dataset, cfg, step * k + i, procs) for i in range(k)]


def _update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: List[Any], objective: Objective,
            step_fn: Optional[StepFn], cfg: TrainConfig, autocast: Optional[Callable[[], Any]],
            scaler: Optional["torch.amp.GradScaler"], procs: Processes, step: int) -> Dict[str, torch.Tensor]:
    """One optimizer step on the step's micro-batches: ``accumulation_step``, or the caller's
    ``step_fn`` on the one batch (its loss checked to be finite); the metrics as tensors."""
    if step_fn is None:
        metrics = accumulation_step(model, optimizer, batches, objective, cfg.grad_clip, autocast, scaler)
        if procs.world > 1 and float(metrics.get("skipped", 0.0)):
            raise RuntimeError("a distributed step had no supervised token on one process.")
        return metrics
    with (autocast() if autocast is not None else contextlib.nullcontext()):
        got = step_fn(model, optimizer, batches[0], cfg.grad_clip)
    metrics = dict(got) if isinstance(got, dict) else {"loss": got}
    metrics = {k: torch.as_tensor(float(v)) for k, v in metrics.items()}
    metrics.setdefault("grad_norm", torch.tensor(float("nan")))
    check_finite("the loss", metrics["loss"], f"at step {step}")
    return metrics


def _record_step(history: Dict[str, List[float]], step: int, lr: float, metrics: Dict[str, torch.Tensor],
                 procs: Processes) -> Dict[str, float]:
    """Append the step to ``history`` (its metrics averaged over the processes; a metric this step
    lacks is nan, ``aux_loss`` 0) and return the logged metrics."""
    names = sorted(k for k in metrics if k not in ("grad_norm", "skipped"))
    values = procs.mean(torch.stack([metrics[k].float().to(procs.device) for k in names]))
    logged = dict(zip(names, values.tolist()))  # .tolist() synchronizes the device
    history["step"].append(step)
    history["lr"].append(lr)
    history["grad_norm"].append(float(metrics["grad_norm"]))
    history["skipped"].append(float(metrics.get("skipped", 0.0)))
    for k in set(history) - {"step", "lr", "grad_norm", "skipped"} - {h for h in history if h.startswith("eval_")}:
        if k not in logged:
            history[k].append(0.0 if k == "aux_loss" else float("nan"))
    for k, v in logged.items():
        history.setdefault(k, [float("nan")] * (len(history["step"]) - 1)).append(v)
    return logged


def _check_skipped(history: Dict[str, List[float]], start_step: int, end_step: int, checkpoints: CheckpointPolicy,
                   log: Callable[[str], None], is_main: bool) -> None:
    """A run whose every step was skipped (no supervised token) is a ``ValueError``; some skipped
    steps are logged."""
    skipped = int(sum(history["skipped"][len(history["skipped"]) - (end_step - start_step):])) if end_step > start_step else 0
    if end_step > start_step and skipped == end_step - start_step:
        checkpoints.discard_pending()
        raise ValueError(
            f"every one of the {skipped} steps was skipped: no batch held a supervised token (every label was -100), "
            "so the weights did not change. For chat data the prompts probably fill max_length (see the dataset's "
            "truncation counts and warning): raise max_length (seq_len), shorten the prompts, or check the labels."
        )
    if skipped and is_main:
        log(f"note: {skipped} of {end_step - start_step} steps were skipped: their batches held no supervised token "
            "(every label -100), so they changed nothing.")


def _note_scaler(history: Dict[str, List[float]], start_step: int, end_step: int, log: Callable[[str], None],
                 is_main: bool) -> None:
    """Say how many updates the fp16 gradient scaler skipped in this run (overflows, not a divergence)."""
    skipped = history.get("scaler_skipped", [])[len(history["step"]) - (end_step - start_step):] if end_step > start_step else []
    n = int(sum(v for v in skipped if v == v))
    if n and is_main:
        scales = history.get("loss_scale", [])
        log(f"note: the fp16 gradient scaler skipped {n} of {end_step - start_step} updates (a gradient overflowed fp16; "
            f"it then halves its scale, last {scales[-1]:g}): normal in the first steps, while it finds its scale.")


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
        return config_with_overrides(args.config, args.set), args
    except (ValueError, FileNotFoundError) as err:
        p.error(str(err))  # exits with status 2 and the message, not a traceback
        raise  # unreachable: p.error exits


def config_with_overrides(config: Optional[str], overrides: Sequence[str] = ()) -> TrainConfig:
    """The command lines' config: ``config`` (a file or a shipped name; None: the defaults) with
    ``KEY=VALUE`` overrides, values parsed as JSON (``model.KEY`` sets a model option). A bad value
    is the ``ValueError`` of ``TrainConfig``'s checks."""
    d = TrainConfig.from_json(config).to_dict() if config else TrainConfig().to_dict()
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        if key.startswith("model."):
            d["model"][key[len("model."):]] = _parse_value(value)
        else:
            d[key] = _parse_value(value)
    return TrainConfig.from_dict(d)


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
