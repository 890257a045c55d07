"""A training run's state on disk, and what keeps it safe: what a run resumes from
(``ResumeState``), which checkpoint is kept (``CheckpointPolicy``), and what the loop says when the
loss or the gradient stops being finite (``DivergenceGuard``).

The run folder (``out_dir``) holds ``ckpt.pt`` (a ``checkpoint.save_checkpoint`` file whose
``extra`` is ``training_state``: the step, the optimizer state, the loss history, the RNG state, the
config and a fingerprint of the data), ``tokenizer.json`` and ``train_config.json``.

* Resuming (``resume="auto"`` or a path) reads and checks everything *before* anything in
  ``out_dir`` is written: the checkpoint's digest and finite weights, its settings (only
  ``RESUMABLE_CHANGES`` may differ: ``lr``, ``min_lr`` and ``grad_clip`` among them, since resuming
  with a lower learning rate is the way out of a divergence) and its data fingerprint.
* A periodic save (``save_every``) goes to ``ckpt.pt.pending`` and replaces ``ckpt.pt`` only once
  the next step's loss, computed on its weights, is finite (``CheckpointPolicy.promote``), so a
  diverging update never reaches ``ckpt.pt``. Every file is written atomically.
* A non-finite loss or gradient norm raises ``FloatingPointError`` before the update
  (``check_finite``); ``DivergenceGuard`` turns it into a message naming the checkpoint kept and
  how to go on, and warns once when a next-token loss exceeds 2 ln(vocab_size).
* Under fp16 a gradient scaler multiplies the loss by a large scale (65,536 at first) so that small
  gradients survive fp16; a gradient that overflows makes it skip that update and halve the scale.
  Such a skip is the scaler working, not a divergence (``check_scaler_overflow``): only a gradient
  that is not finite at a scale of 1 or less (no scaling left to blame) stops the run. A checkpoint
  keeps the scaler's state, so a resumed run continues with the same scale.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from .checkpoint import _torch_load, check_metadata, check_weights, load_state_dict_strict, save_checkpoint
from .files import DIGEST_KEY, remove_stale_temporaries, write_json
from .tokenizer import save_tokenizer

CHECKPOINT_NAME = "ckpt.pt"
TOKENIZER_NAME = "tokenizer.json"
# Options a resumed run may change; any other difference from the checkpoint's run is an error.
# lr, min_lr and grad_clip may change: resuming with a lower learning rate is the way out of a divergence.
# compile changes how the steps run, not what they compute.
RESUMABLE_CHANGES = frozenset({"eval_every", "eval_batches", "eval_problems", "log_every", "save_every", "out_dir",
                               "resume", "device", "dtype", "progress", "deterministic", "lr", "min_lr", "grad_clip",
                               "compile"})

History = Dict[str, List[float]]

# Where the token cache is and how many processes fill it change nothing a run computes.
RESUMABLE_CHANGES = RESUMABLE_CHANGES | {"data_cache", "data_workers"}


# ---------------------------------------------------------------------- resuming
def resume_path(cfg: Any) -> Optional[str]:
    """The checkpoint ``cfg.resume`` names (``"auto"``: ``out_dir/ckpt.pt``, or the pending save a
    killed run left, or None when neither exists); None when the run does not resume."""
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


def load_resume_blob(path: str) -> Dict[str, Any]:
    """The checkpoint at ``path`` as saved, after the checks of every loader (weights only, the
    recorded digests, finite weights) and that it holds a training state to resume."""
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


def check_resumable(cfg: Any, previous: Dict[str, Any], path: str) -> None:
    """The new config may differ from the checkpoint's run (``previous``, its config as a dict)
    only in RESUMABLE_CHANGES."""
    now = cfg.to_dict()
    before = type(cfg).from_dict(previous).to_dict() if previous else now
    derived = {"max_steps"} if now.get("epochs") is not None and now.get("epochs") == before.get("epochs") else set()
    # (a run given epochs stores the max_steps it derived from its data; the data are checked by their fingerprint)
    different = [k for k in now if k not in RESUMABLE_CHANGES | derived and now[k] != before.get(k)]
    if different:
        detail = "; ".join(f"{k}: checkpoint {before.get(k)!r}, now {now[k]!r}" for k in different)
        raise ValueError(f"cannot resume from {path}: the run was made with other settings ({detail}). Use the "
                         "checkpoint's settings (its train_config.json), or start a new run in another out_dir.")


def training_state(step: int, optimizer: torch.optim.Optimizer, history: History, cfg: Any, device: torch.device,
                   fingerprint: Optional[str], scaler: Optional[Any] = None) -> Dict[str, Any]:
    """What a checkpoint of the run holds besides the weights (its ``extra``), all that
    ``ResumeState.restore`` needs to continue the same loss curve: with gradient accumulation the
    micro-batch the next step starts at (``micro_step``), and under fp16 the gradient scaler's state."""
    rng = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(device)
    state = {"step": step, "optimizer": optimizer.state_dict(), "history": history, "train_config": cfg.to_dict(),
             "rng": rng, "data_fingerprint": fingerprint}
    accumulation = getattr(cfg, "accumulation_steps", 1)
    if accumulation != 1:
        state["micro_step"] = step * accumulation
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    return state


@dataclass
class ResumeState:
    """What a run resumes from: the checkpoint ``path`` and its contents ``blob`` (both None for a
    new run). Reading and checking it writes nothing."""

    path: Optional[str] = None
    blob: Optional[Dict[str, Any]] = None

    @classmethod
    def find(cls, cfg: Any) -> "ResumeState":
        """The checkpoint ``cfg.resume`` names, loaded and checked against ``cfg``'s settings."""
        path = resume_path(cfg)
        if not path:
            return cls()
        blob = load_resume_blob(path)
        check_resumable(cfg, blob["extra"].get("train_config", {}), path)
        return cls(path, blob)

    def resumes_from(self, path: Optional[str]) -> bool:
        """Whether the run resumes from the file at ``path``."""
        return bool(self.path and path) and os.path.abspath(self.path) == os.path.abspath(path)

    def check_data(self, fingerprint: Optional[str]) -> None:
        """The training data must be those of the checkpoint's run (when both fingerprints are known)."""
        saved = self.blob["extra"].get("data_fingerprint") if self.blob is not None else None
        if saved is not None and fingerprint is not None and saved != fingerprint:
            raise ValueError(f"cannot resume from {self.path}: the training data differ from the data of that run "
                             "(another corpus, tokenizer or seq_len). Resume with the run's own data and tokenizer "
                             "(out_dir/tokenizer.json), or start a new run in another out_dir.")

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
                log: Callable[[str], None], stop_at: Optional[int] = None,
                scaler: Optional[Any] = None) -> Optional[Tuple[int, History]]:
        """Load the checkpoint's weights, optimizer state, RNG state and (when both the run and the
        checkpoint have one) gradient scaler state into the run; returns ``(step, history)`` to
        continue from, or None for a new run. ``stop_at`` must come later. A checkpoint's
        ``micro_step`` must be where its step's micro-batches start (``step * accumulation_steps``)."""
        if self.blob is None:
            return None
        state = {k: v for k, v in self.blob["state_dict"].items() if not k.endswith(("freqs_cos", "freqs_sin"))}
        load_state_dict_strict(model, state)
        extra = self.blob["extra"]
        optimizer.load_state_dict(extra["optimizer"])
        step = int(extra["step"])
        accumulation = int(extra.get("train_config", {}).get("accumulation_steps", 1))
        if int(extra.get("micro_step", step * accumulation)) != step * accumulation:
            raise ValueError(f"cannot resume from {self.path}: it records micro-batch {extra['micro_step']} at step {step}, "
                             f"but with accumulation_steps={accumulation} step {step} starts at micro-batch "
                             f"{step * accumulation}; the file was edited or written by another program.")
        if scaler is not None and isinstance(extra.get("scaler"), dict):
            scaler.load_state_dict(extra["scaler"])
        history = {k: list(v) for k, v in extra["history"].items()}
        torch.set_rng_state(extra["rng"]["torch"])
        if device.type == "cuda" and "cuda" in extra["rng"]:
            torch.cuda.set_rng_state(extra["rng"]["cuda"], device)
        log(f"resumed from {self.path} at step {step}")
        if stop_at is not None and stop_at <= step:
            raise ValueError(f"stop_at={stop_at} is not after step {step}, where {self.path} resumes the run: give a "
                             "later step (or None to run to max_steps).")
        return step, history


def prepare_run_folder(cfg: Any, tokenizer: Any, resume: ResumeState) -> None:
    """Write ``out_dir`` once every check has passed: the tokenizer (a resumed run keeps its own),
    ``train_config.json``; and remove what a killed run left (a pending save nothing vouched for,
    unless the run resumes from it, and half-written temporaries)."""
    os.makedirs(cfg.out_dir, exist_ok=True)
    tok_path = os.path.join(cfg.out_dir, TOKENIZER_NAME)
    if hasattr(tokenizer, "save") and not (resume.path and os.path.exists(tok_path)):
        save_tokenizer(tokenizer, tok_path)  # atomic
    write_json(os.path.join(cfg.out_dir, "train_config.json"), cfg.to_dict())
    stale = os.path.join(cfg.out_dir, CHECKPOINT_NAME + ".pending")
    if os.path.exists(stale) and not resume.resumes_from(stale):
        os.remove(stale)  # left by a run killed before the next step could vouch for it
    remove_stale_temporaries(cfg.out_dir, CHECKPOINT_NAME + ".pending")  # ... or while writing it


# ---------------------------------------------------------------------- which checkpoint is kept
class CheckpointPolicy:
    """The run's checkpoints: ``save(step)`` writes ``out_dir/ckpt.pt``; ``save(step, pending=True)``
    (the periodic saves) writes ``ckpt.pt.pending``, which ``promote()`` makes ``ckpt.pt`` once a
    step's loss computed on its weights was finite. ``kept_step`` is the step ``ckpt.pt`` holds (None:
    no checkpoint yet), ``pending_step`` the step of the pending save. Only the first process
    writes, and only with an ``out_dir``."""

    def __init__(self, out_dir: Optional[str], is_main: bool, model: torch.nn.Module,
                 state: Callable[[int], Dict[str, Any]], resume: ResumeState, start_step: int) -> None:
        self.out_dir, self.writes, self.model, self.state = out_dir, bool(out_dir) and is_main, model, state
        self.file = os.path.join(out_dir, CHECKPOINT_NAME) if out_dir else None
        self.pending_file = self.file + ".pending" if self.file else None
        self.kept_step: Optional[int] = start_step if resume.blob is not None else None
        self.pending_step: Optional[int] = None
        if resume.resumes_from(self.pending_file):  # an unvouched save: kept once a step's loss is finite
            self.kept_step, self.pending_step = None, start_step

    def save(self, step: int, pending: bool = False) -> Optional[str]:
        """Save the run at ``step`` (atomically) with ``state(step)``; returns the path of ``ckpt.pt``
        (None for a pending save, or when this process does not write)."""
        if not self.writes:
            return None
        extra = self.state(step)
        for name, tensor in self.model.state_dict().items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise FloatingPointError(f"not saving step {step}: weight {name} is not finite; the previous "
                                         f"checkpoint in {self.out_dir} is kept.")
        # a LoRA run resumes with its adapters (allow_lora)
        save_checkpoint(self.model, self.pending_file if pending else self.file, extra=extra, allow_lora=True)
        if pending:
            self.pending_step = step
            return None
        self.kept_step, self.pending_step = step, None
        if os.path.exists(self.pending_file):
            os.remove(self.pending_file)
        return self.file

    def promote(self) -> None:
        """The pending checkpoint's weights gave a finite loss: it becomes ckpt.pt."""
        if self.pending_step is None:
            return
        os.replace(self.pending_file, self.file)
        self.kept_step, self.pending_step = self.pending_step, None

    def discard_pending(self) -> None:
        """Remove the pending save (its weights are the ones that just failed)."""
        if self.pending_step is not None:
            os.remove(self.pending_file)


# ---------------------------------------------------------------------- divergence
def check_finite(name: str, value: torch.Tensor, what: str) -> None:
    """``FloatingPointError`` naming ``name`` when ``value`` is not finite (checked before an update)."""
    if not bool(torch.isfinite(value).all()):
        raise FloatingPointError(f"{name} is {float(value)} {what}; the weights were NOT updated. Lower the learning "
                                 "rate (or check the data and the model's inputs) and resume from the last checkpoint.")


def check_scaler_overflow(grad_norm: torch.Tensor, scale: float) -> None:
    """The rule for an update the fp16 gradient scaler skipped (its gradient was not finite at
    ``scale``): an overflow while ``scale`` > 1 is the scaler's business (it halves the scale and the
    run goes on; the loop counts it in ``history["scaler_skipped"]``); at a scale of 1 or less the
    gradient itself is not finite, which is a divergence: ``FloatingPointError``."""
    if scale <= 1.0:
        raise FloatingPointError(f"the gradient norm is {float(grad_norm)} before the update, at a loss scale of {scale:g} "
                                 "(the fp16 gradient scaler has no scaling left to blame); the weights were NOT updated. "
                                 "Lower the learning rate, or train in bf16 or fp32, and resume from the last checkpoint.")


class DivergenceGuard:
    """What the loop does about a diverging run. ``watching(step)``: a ``FloatingPointError`` of the
    step (non-finite loss or gradient, raised before the update) becomes the loop's message, which
    names the checkpoint kept and how to go on (the pending save, whose weights gave the value, is
    removed). ``check_loss``: a loss above ``ceiling`` (for next-token losses 2 ln(vocab_size), twice
    the loss of guessing uniformly; None: no warning) is logged once as a warning."""

    def __init__(self, checkpoints: CheckpointPolicy, ceiling: Optional[float] = None) -> None:
        self.checkpoints, self.ceiling = checkpoints, ceiling

    @contextlib.contextmanager
    def watching(self, step: int) -> Iterator[None]:
        """Around step ``step``'s update: its ``FloatingPointError`` becomes ``stopped(err, step)``."""
        try:
            yield
        except FloatingPointError as err:
            raise self.stopped(err, step) from None

    def stopped(self, err: FloatingPointError, step: int) -> FloatingPointError:
        """The loop's message for a non-finite loss or gradient: what was kept, and how to go on."""
        ck = self.checkpoints
        ck.discard_pending()  # its weights are the ones that just gave the non-finite value
        what = str(err).split(";")[0].replace(f" at step {step}", "")
        if ck.kept_step is not None and ck.kept_step == step:
            where = (f"The last checkpoint, {ck.file} (step {ck.kept_step}), holds the weights that give this value (the "
                     "run that saved it ended on a diverging update): start again from an earlier copy, or from "
                     "scratch, with a lower learning rate.")
        elif ck.kept_step is not None:
            where = (f"The last checkpoint, {ck.file}, holds step {ck.kept_step}, whose weights still gave a finite loss "
                     "(later saves were not kept). Resume it with a lower learning rate: train(cfg.replace(lr=..., "
                     "resume='auto')), or --set resume=auto lr=... on the command line (lr, min_lr and grad_clip may "
                     "change on resume).")
        elif ck.out_dir:
            where = ("No checkpoint of this run is kept: the first one saved would already hold weights that give this "
                     "value. Start the run again with a lower learning rate (or a smaller grad_clip).")
        else:
            where = "Start the run again with a lower learning rate (or a smaller grad_clip); set out_dir to keep checkpoints."
        return FloatingPointError(f"{what} at step {step}; the weights were NOT updated. {where}")

    def check_loss(self, loss: float, step: int, log: Callable[[str], None]) -> None:
        """Warn (once) when step ``step``'s loss is above the ceiling."""
        if self.ceiling is not None and loss > self.ceiling:
            log(f"warning: the loss at step {step + 1} is {loss:.4g}, more than twice ln(vocab_size) = {self.ceiling / 2:.2f} "
                "(the loss of guessing uniformly): the run is diverging. Lower the learning rate (a run resumes with "
                "another lr).")
            self.ceiling = None  # said once


def next_token_ceiling(model: torch.nn.Module) -> Optional[float]:
    """2 ln(vocab_size) of ``model.config`` (None when the model does not say its vocabulary)."""
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    return 2 * math.log(vocab) if isinstance(vocab, int) else None
