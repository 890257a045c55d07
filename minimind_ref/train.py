"""Pretraining MiniMind: the loop, its pieces, and a command line that also runs under torchrun.

    python -m minimind_ref.train --config configs/ch08_cpu.json
    python -m minimind_ref.train --config configs/ch08_cpu.json --set max_steps=100 lr=1e-3
    torchrun --standalone --nproc_per_node 2 -m minimind_ref.train --config configs/ch08_cpu.json

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
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from . import data as data_mod
from .checkpoint import load_state_dict_strict, save_checkpoint
from .config import MiniMindConfig
from .model import MiniMindForCausalLM
from .tokenizer import BOS_ID, EOS_ID, PAD_ID, load_tokenizer, save_tokenizer, train_bpe_tokenizer

CHECKPOINT_NAME = "ckpt.pt"
TOKENIZER_NAME = "tokenizer.json"


# ---------------------------------------------------------------------- configuration
@dataclass
class TrainConfig:
    """Everything a run needs; a JSON file with any subset of these keys is a config file."""

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
    grad_clip: float = 1.0
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

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names - {"_comment"})
        if unknown:
            raise ValueError(f"unknown training option(s) {unknown}; valid: {sorted(names)}.")
        d = {k: v for k, v in d.items() if k in names}
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        if "model" in d:
            d["model"] = {**cls().model, **d["model"]}
        return cls(**d)

    @classmethod
    def from_json(cls, path: str) -> "TrainConfig":
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    def to_dict(self) -> Dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    def replace(self, **changes: Any) -> "TrainConfig":
        return TrainConfig.from_dict({**self.to_dict(), **changes})


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


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    max_grad_norm: float = 1.0,
    autocast: Optional[Callable[[], Any]] = None,
) -> Dict[str, torch.Tensor]:
    """One optimizer step; returns ``{"loss", "aux_loss", "grad_norm"}`` (detached tensors).

    Forward (under ``autocast()`` if given) -> ``loss = out.loss + out.aux_loss`` (the auxiliary
    load-balancing loss is 0 for dense models) -> backward -> clip the global gradient norm to
    ``max_grad_norm`` -> ``optimizer.step()`` -> ``zero_grad``. ``grad_norm`` is the norm before
    clipping (what ``clip_grad_norm_`` returns)."""
    with (autocast() if autocast is not None else contextlib.nullcontext()):
        out = model(input_ids, labels=labels)
        loss = out.loss + out.aux_loss
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": out.loss.detach(), "aux_loss": out.aux_loss.detach(), "grad_norm": grad_norm.detach()}


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over every parameter (the tied embedding/head once), as upstream MiniMind does."""
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)


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
    """A run's tokenizer, datasets and held-out problems (``build_data`` makes one)."""

    tokenizer: Any
    train: data_mod.PackedDataset
    val: data_mod.PackedDataset
    test_problems: List[Tuple[int, int]]


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
    return {k: [] for k in ("step", "loss", "aux_loss", "lr", "grad_norm", "eval_step", "eval_loss", "eval_acc")}


def _rng_state(device: torch.device) -> Dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def train(
    cfg: TrainConfig,
    model: Optional[MiniMindForCausalLM] = None,
    data: Optional[RunData] = None,
    stop_at: Optional[int] = None,
    log: Optional[Callable[[str], None]] = None,
) -> TrainResult:
    """Train (or resume) according to ``cfg`` and return the model and its history.

    ``model``/``data``: use these instead of building them from ``cfg`` (e.g. an ablated model,
    or data already built). ``stop_at``: stop after this many steps although the schedule is
    planned for ``cfg.max_steps`` (to simulate an interruption). ``log``: where progress lines go
    (default: ``print`` on the first process; lines appear every ``cfg.log_every`` steps).
    Under torchrun (``WORLD_SIZE`` > 1) the process group is created here if needed.
    """
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

    # ---- data and tokenizer (trained once, by the first process, then shared through the file)
    if data is None:
        tokenizer = None
        if world > 1 and not cfg.tokenizer:
            import torch.distributed as dist

            if cfg.out_dir is None:
                raise ValueError("distributed runs need out_dir (or a tokenizer file) to share the tokenizer.")
            path = os.path.join(cfg.out_dir, TOKENIZER_NAME)
            if is_main:
                data = build_data(cfg)
                save_tokenizer(data.tokenizer, path)
            dist.barrier()
            if not is_main:
                data = build_data(cfg, tokenizer=load_tokenizer(path))
        else:
            data = build_data(cfg, tokenizer)
    tokenizer = data.tokenizer
    if cfg.out_dir and is_main:
        os.makedirs(cfg.out_dir, exist_ok=True)
        save_tokenizer(tokenizer, os.path.join(cfg.out_dir, TOKENIZER_NAME))
        with open(os.path.join(cfg.out_dir, "train_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg.to_dict(), f, indent=2)

    # ---- model, optimizer, resume
    if model is None:
        torch.manual_seed(cfg.seed)
        model = build_model(cfg, tokenizer.get_vocab_size())
    model.to(device).train()
    optimizer = make_optimizer(model, cfg)
    history = _new_history()
    start_step = 0
    resume = cfg.resume
    if resume == "auto":
        candidate = os.path.join(cfg.out_dir or ".", CHECKPOINT_NAME)
        resume = candidate if os.path.exists(candidate) else None
    if resume:
        blob = torch.load(resume, map_location="cpu", weights_only=True)
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

    raw_model = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    autocast = autocast_for(cfg, device)
    end_step = cfg.max_steps if stop_at is None else min(stop_at, cfg.max_steps)
    n_train = len(data.train)

    def checkpoint(step: int) -> Optional[str]:
        if not (cfg.out_dir and is_main):
            return None
        path = os.path.join(cfg.out_dir, CHECKPOINT_NAME)
        extra = {"step": step, "optimizer": optimizer.state_dict(), "history": history,
                 "train_config": cfg.to_dict(), "rng": _rng_state(device)}
        save_checkpoint(raw_model, path + ".tmp", extra=extra)
        os.replace(path + ".tmp", path)  # never leave a half-written checkpoint behind
        return path

    def run_eval(step: int) -> None:
        loss = evaluate_loss(raw_model, data.val, cfg.batch_size, cfg.eval_batches, device, autocast)
        acc = float("nan")
        if cfg.eval_problems and data.test_problems:
            acc = arithmetic_accuracy(raw_model, tokenizer, data.test_problems[: cfg.eval_problems], device)
        history["eval_step"].append(step)
        history["eval_loss"].append(loss)
        history["eval_acc"].append(acc)
        log(f"eval step {step}: val loss {loss:.4f}" + ("" if math.isnan(acc) else f", held-out accuracy {acc:.1%}"))

    bar = None
    if cfg.progress and is_main:
        from tqdm.auto import tqdm

        bar = tqdm(total=end_step, initial=start_step, desc="train", unit="step", dynamic_ncols=True)
        log = bar.write if log is print else log

    tokens_per_step = cfg.batch_size * cfg.seq_len
    train_seconds, t0 = 0.0, time.perf_counter()
    tokens_per_s = 0.0
    ckpt_path = None
    if start_step == 0 and cfg.eval_every and not history["eval_step"]:
        run_eval(0)
    for step in range(start_step, end_step):
        lr = lr_at(step, cfg.max_steps, cfg.warmup_steps, cfg.lr, cfg.min_lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        idx = data_mod.shard(data_mod.global_batch_indices(n_train, cfg.batch_size, step, cfg.seed), rank, world)
        x, y = data.train.batch(idx)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        tic = time.perf_counter()
        out = train_step(model, optimizer, x, y, cfg.grad_clip, autocast)
        loss, aux = out["loss"], out["aux_loss"]
        if world > 1:  # the global mean, as one process with the whole batch would log it
            import torch.distributed as dist

            both = torch.stack([loss.float(), aux.float()])
            dist.all_reduce(both)
            loss, aux = both / world
        loss_f = float(loss)  # synchronizes the device, so the timing below is honest
        train_seconds += time.perf_counter() - tic
        done = step + 1 - start_step
        tokens_per_s = done * tokens_per_step / max(train_seconds, 1e-9)
        history["step"].append(step)
        history["loss"].append(loss_f)
        history["aux_loss"].append(float(aux))
        history["lr"].append(lr)
        history["grad_norm"].append(float(out["grad_norm"]))
        if not math.isfinite(loss_f):
            raise FloatingPointError(f"loss became {loss_f} at step {step}; lower the learning rate or check the data.")
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss_f:.3f}", tok_s=f"{tokens_per_s:,.0f}")
        if cfg.log_every and (step + 1) % cfg.log_every == 0:
            log(f"step {step + 1}/{cfg.max_steps} | loss {loss_f:.4f} | lr {lr:.2e} | {tokens_per_s:,.0f} tok/s")
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.max_steps) and is_main:
            run_eval(step + 1)
        if cfg.save_every and (step + 1) % cfg.save_every == 0:
            ckpt_path = checkpoint(step + 1)
    if bar is not None:
        bar.close()
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
    p.add_argument("--config", help="JSON file with TrainConfig fields (missing keys keep their defaults)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="override options, values parsed as JSON: --set max_steps=100 model.hidden_size=256")
    p.add_argument("--stop-at", type=int, default=None, help="stop after this step (the schedule still plans max_steps)")
    p.add_argument("--history", default=None, help="write the loss history (JSON) to this file")
    args = p.parse_args(argv)
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
                with open(args.history, "w", encoding="utf-8") as f:
                    json.dump({"history": h, "step": result.step, "world_size": world,
                               "tokens_per_s": result.tokens_per_s}, f)
    finally:
        if world > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
