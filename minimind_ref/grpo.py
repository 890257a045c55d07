"""Reinforcement learning with verifiable rewards (chapter 12): GRPO as upstream's
``trainer/train_grpo.py`` does it (jingyaogong/minimind at c090b69).

One GRPO step, for ``B`` prompts and ``G = num_generations`` sampled completions each
(``N = B * G`` rows, completions ``R`` tokens long after padding):

1. sample ``G`` completions per prompt (temperature 0.8, as upstream) with the KV-cache generator;
2. score every completion with a *verifiable* reward (is the sum right? is the format right?);
3. ``group_advantages``: each reward relative to its own group, ``(r - mean) / (std + 1e-4)``
   clamped to +-10, then normalised again over the whole batch (upstream does both);
4. ``per_token_logps`` of the completion tokens under the policy (with gradient) and under the
   frozen reference (without);
5. ``grpo_loss``: ``-(exp(lp - lp.detach()) * A - beta * k3)`` per token, where
   ``k3 = exp(ref - lp) - (ref - lp) - 1`` estimates KL(pi || pi_ref); averaged over each
   completion's ``completion_mask`` (up to and including its first end marker), then over rows.

``exp(lp - lp.detach())`` is 1 in value; its gradient is ``grad lp``, so the loss's gradient is
the policy gradient ``-A * grad log pi``. With one optimiser step per batch of samples the
PPO-style ratio is always 1, which is why upstream has no clipping.

Shapes: rewards and advantages ``[N]``; completion ids, masks and per-token log-probabilities
``[N, R]``; the loss a scalar.

* ``group_advantages``, ``completion_mask``, ``per_token_logps``, ``grpo_loss``: upstream's
  computations (``per_token_logps`` is upstream's inner ``get_per_token_logps``);
* ``per_token_kl``: the k3 estimator alone;
* ``sum_reward`` (the course's verifiable reward) and ``format_reward`` (upstream's reward for
  ``<think>...</think><answer>...</answer>`` replies, 0.5 for the pattern plus 0.25 per tag
  counted once);
* ``RLPromptDataset``: ``chat_data.rl_prompts`` records (upstream's ``rlaif`` layout);
* ``sample_completions``: step 1; ``GRPOObjective``: steps 1-5 as an objective of
  ``minimind_ref.train``'s loop, holding the frozen reference.

Deliberate difference from upstream: upstream batches prompts of different lengths with left
padding and lets the policy attend to the padding (it passes no attention mask). Here each
prompt's ``G`` completions share one unpadded prompt, so no padding is attended to; with one
prompt per batch the two are the same computation.
"""

from __future__ import annotations

import math
import numbers
import re
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

from .sft import IM_END, _special_id, encode_chat

if TYPE_CHECKING:  # pragma: no cover
    from .train import RunData, TrainConfig, TrainResult  # noqa: F401

REDUCTIONS = ("sequence", "token")
# upstream's format reward (args.reasoning == 1): the whole reply must match one of these (re.S)
THINK_PATTERNS = (r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$",
                  r"^<think>\n.*?\n</think>\n\n<answer>\n.*?\n</answer>$")
THINK_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def _check_beta(beta: Any) -> None:
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta < 0:
        raise ValueError(f"beta must be a number >= 0 and finite (the KL penalty's weight; upstream uses 0.02), got {beta!r}.")


def _checked_reward(value: Any, reply: str, reward_fn: Callable[..., Any]) -> float:
    """``value`` (what ``reward_fn`` returned for ``reply``) as a float, or a clear error."""
    name = getattr(reward_fn, "__name__", type(reward_fn).__name__)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if not isinstance(value, numbers.Real):  # bool counts (True = 1.0)
        raise TypeError(f"the reward function {name} returned {value!r} ({type(value).__name__}) for the reply {reply!r:.60}; "
                        "it must return a number (e.g. 1.0 for a right answer, 0.0 otherwise).")
    if not math.isfinite(value):
        raise ValueError(f"the reward function {name} returned {value!r} for the reply {reply!r:.60}; rewards must be "
                         "finite numbers (a NaN or inf reward makes every advantage NaN).")
    return float(value)


# ---------------------------------------------------------------------- upstream's computations
def group_advantages(rewards: torch.Tensor, num_generations: int, eps: float = 1e-4, clamp: float = 10.0,
                     normalize_batch: bool = True) -> torch.Tensor:
    """Group-relative advantages ``[N]`` from rewards ``[N]`` (rows grouped ``num_generations``
    at a time, as sampled): ``clamp((r - group mean) / (group std + eps), -clamp, clamp)`` with
    the unbiased std, then, if ``normalize_batch`` (upstream), ``(a - a.mean()) / (a.std() +
    1e-8)`` over the whole batch. A group whose rewards are all equal gets advantage 0 before the
    second normalisation: it carries no signal."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [batch * num_generations], got shape {tuple(rewards.shape)}.")
    if not isinstance(num_generations, int) or num_generations < 2:
        raise ValueError(f"num_generations must be an int >= 2 (a group needs a spread), got {num_generations!r}.")
    if not bool(torch.isfinite(rewards.float()).all()):
        raise ValueError(f"rewards must be finite numbers; got {rewards.tolist()[:8]}: the reward function returned NaN "
                         "or inf.")
    if rewards.numel() % num_generations:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of num_generations={num_generations}; "
                         "pass the rewards of whole groups, in sampling order.")
    grouped = rewards.float().view(-1, num_generations)
    mean = grouped.mean(dim=1).repeat_interleave(num_generations)
    std = grouped.std(dim=1).repeat_interleave(num_generations)
    advantages = torch.clamp((rewards.float() - mean) / (std + eps), -clamp, clamp)
    if normalize_batch:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    return advantages


def completion_mask(completion_ids: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """``[N, R]`` int mask: 1 up to and including each row's first ``eos_token_id``; a row with
    no end marker is kept whole (upstream's rule)."""
    if completion_ids.dim() != 2:
        raise ValueError(f"completion_ids must be [rows, completion_length], got shape {tuple(completion_ids.shape)}.")
    is_eos = completion_ids == eos_token_id
    length = completion_ids.size(1)
    eos_idx = torch.full((completion_ids.size(0),), length, dtype=torch.long, device=completion_ids.device)
    has_eos = is_eos.any(dim=1)
    eos_idx[has_eos] = is_eos.int().argmax(dim=1)[has_eos]
    positions = torch.arange(length, device=completion_ids.device).expand(completion_ids.size(0), -1)
    return (positions <= eos_idx.unsqueeze(1)).int()


def per_token_logps(model: torch.nn.Module, input_ids: torch.Tensor, n_keep: int) -> torch.Tensor:
    """``[N, n_keep]``: the log-probability of each of the last ``n_keep`` tokens of
    ``input_ids`` ``[N, P + R]`` given the tokens before it (upstream's ``get_per_token_logps``:
    the model computes only the last ``n_keep + 1`` positions' logits)."""
    if not 0 < n_keep < input_ids.size(1):
        raise ValueError(f"n_keep must be between 1 and the sequence length - 1 = {input_ids.size(1) - 1}, got {n_keep}.")
    return _logps_and_aux(model, input_ids, n_keep)[0]


def _logps_and_aux(model: torch.nn.Module, input_ids: torch.Tensor, n_keep: int) -> "tuple[torch.Tensor, torch.Tensor]":
    """``per_token_logps`` and the forward's MoE balancing loss (0 for dense models)."""
    if input_ids.is_inference():
        input_ids = input_ids.detach().clone()
    out = model(input_ids, logits_to_keep=n_keep + 1)
    logits = out.logits[:, :-1, :]
    targets = input_ids[:, -n_keep:]
    logps = torch.gather(logits.float().log_softmax(dim=-1), 2, targets.unsqueeze(-1)).squeeze(-1)
    return logps, out.aux_loss


def per_token_kl(per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor) -> torch.Tensor:
    """The k3 estimator of KL(pi || pi_ref) per token: ``exp(d) - d - 1`` with ``d = ref - lp``;
    always >= 0, and its mean over tokens sampled from pi is an unbiased estimate of the KL."""
    d = ref_per_token_logps - per_token_logps
    return torch.exp(d) - d - 1


def grpo_loss(per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor, advantages: torch.Tensor,
              completion_mask: torch.Tensor, beta: float, reduction: str = "sequence") -> torch.Tensor:
    """Upstream's GRPO loss (scalar): per token ``-(exp(lp - lp.detach()) * A - beta * k3)``;
    ``reduction="sequence"`` (upstream) averages over each row's masked tokens, then over rows;
    ``"token"`` (what several later implementations do) averages over all masked tokens of the
    batch at once, so long completions weigh more. A row with an empty mask contributes 0."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}.")
    _check_beta(beta)
    if per_token_logps.shape != ref_per_token_logps.shape or per_token_logps.shape != completion_mask.shape:
        raise ValueError("per_token_logps, ref_per_token_logps and completion_mask must have the same shape "
                         f"[rows, completion_length]; got {tuple(per_token_logps.shape)}, "
                         f"{tuple(ref_per_token_logps.shape)} and {tuple(completion_mask.shape)}.")
    if advantages.shape != per_token_logps.shape[:1]:
        raise ValueError(f"advantages must be [rows] = {tuple(per_token_logps.shape[:1])}, got {tuple(advantages.shape)}.")
    kl = per_token_kl(per_token_logps, ref_per_token_logps)
    ratio = torch.exp(per_token_logps - per_token_logps.detach())
    per_token = -(ratio * advantages.unsqueeze(1) - beta * kl)
    mask = completion_mask.to(per_token.dtype)
    if reduction == "token":
        return (per_token * mask).sum() / mask.sum().clamp_min(1.0)
    return ((per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)).mean()


# ---------------------------------------------------------------------- verifiable rewards
def sum_reward(reply: str, answer: str) -> float:
    """1.0 when the reply is the whole right answer (``37+45=082``, whitespace stripped), else 0."""
    return float(reply.strip() == answer.strip())


def format_reward(reply: str) -> float:
    """Upstream's reasoning-format reward: 0.5 if the whole reply is ``<think>\\n...\\n</think>\\n
    <answer>\\n...\\n</answer>`` (one blank line allowed between the blocks), plus 0.25 for each
    of the four tags that occurs exactly once (at most 1.5)."""
    pattern = 0.5 if any(re.match(p, reply, re.S) for p in THINK_PATTERNS) else 0.0
    return pattern + sum(0.25 for tag in THINK_TAGS if reply.count(tag) == 1)


# ---------------------------------------------------------------------- data and sampling
class RLPromptDataset:
    """RL records ``{"conversations": [..., {"role": "assistant", "content": answer}]}``
    (``chat_data.rl_prompts``; upstream's ``rlaif`` files have the same layout): the turns before
    the last are the prompt, the last assistant turn the reference answer the reward checks.
    ``batch(indices)`` returns the records themselves (the objective samples from them)."""

    def __init__(self, records: Sequence[Dict[str, Any]]) -> None:
        for i, record in enumerate(records):
            turns = record.get("conversations") if isinstance(record, dict) else None
            if (not isinstance(turns, (list, tuple)) or len(turns) < 2 or not all(isinstance(t, dict) for t in turns)
                    or turns[-1].get("role") != "assistant"):
                raise ValueError(f"record {i} must be {{'conversations': [...prompt turns, "
                                 "{'role': 'assistant', 'content': reference answer}]}.")
        self.records = list(records)

    def __len__(self) -> int:
        return len(self.records)

    def batch(self, indices: Any) -> List[Dict[str, Any]]:
        return [self.records[int(i)] for i in indices]


@torch.no_grad()
def sample_completions(model: torch.nn.Module, tokenizer: Any, prompt: Sequence[Dict[str, str]], num_generations: int,
                       max_new_tokens: int, temperature: float = 0.8,
                       generator: Optional[torch.Generator] = None) -> Dict[str, Any]:
    """``num_generations`` sampled replies to one conversation ``prompt``, drawn from the whole
    temperature-scaled distribution (no top-k, no top-p). Upstream's ``trainer/train_grpo.py`` at
    c090b69 calls ``generate(do_sample=True, temperature=0.8)``, which under transformers 4.57 also
    keeps ``GenerationConfig``'s default ``top_k=50``. Returns ``{"input_ids": [G, P + R], "completion_ids":
    [G, R], "texts": [G] (decoded up to the end marker), "prompt_length": P}``; rows that stop
    early are padded with the end marker."""
    from .generation import generate

    device = next(model.parameters()).device
    end = _special_id(tokenizer, IM_END)
    ids = encode_chat(tokenizer, prompt, add_generation_prompt=True)
    x = torch.tensor([ids] * num_generations, device=device)
    out = generate(model, x, max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature,
                   eos_token_id=end, pad_token_id=end, generator=generator)
    completion = out[:, len(ids):]
    texts = []
    for row in completion.tolist():
        texts.append(tokenizer.decode(row[: row.index(end)] if end in row else row))
    return {"input_ids": out, "completion_ids": completion, "texts": texts, "prompt_length": len(ids)}


class GRPOObjective:
    """GRPO as an objective for ``minimind_ref.train``: ``objective(model, batch) -> metrics``
    where ``batch`` is a list of RL records (``RLPromptDataset.batch``).

    Per batch: sample ``num_generations`` completions per prompt (the policy, no gradient),
    reward them with ``reward_fn(reply, answer)`` (default ``sum_reward``), ``group_advantages``,
    per-token log-probabilities of the policy (with gradient) and of the frozen reference, and
    ``grpo_loss`` (+ the MoE balancing loss, 0 for dense models). ``ref_model=None`` drops the KL
    term (``beta`` must then be 0).

    Metrics (detached): ``grpo_loss``, ``aux_loss``, ``reward`` (mean), ``accuracy`` (share of
    completions with reward >= 1), ``completion_length`` (mean tokens, end marker included),
    ``stop_rate`` (completions that emitted the end marker), ``kl`` (mean k3 over the completion
    tokens), ``zero_std_groups`` (share of groups whose rewards were all equal: no signal) and
    ``tokens`` (completion tokens in the loss)."""

    def __init__(self, ref_model: Optional[torch.nn.Module], tokenizer: Any, num_generations: int = 8,
                 max_new_tokens: int = 24, beta: float = 0.02, temperature: float = 0.8,
                 reward_fn: Callable[[str, str], float] = sum_reward, normalize_batch: bool = True,
                 reduction: str = "sequence", seed: int = 0) -> None:
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}.")
        _check_beta(beta)
        if ref_model is None and beta != 0:
            raise ValueError(f"beta={beta} needs a reference model for the KL term; pass ref_model or set beta=0.")
        if isinstance(num_generations, bool) or not isinstance(num_generations, int) or num_generations < 2:
            raise ValueError(f"num_generations must be an int >= 2, got {num_generations!r}.")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1 (the longest completion sampled), got {max_new_tokens!r}.")
        if (isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature)
                or temperature <= 0):
            raise ValueError(f"temperature must be a finite number > 0 (upstream samples at 0.8), got {temperature!r}.")
        if not callable(reward_fn):
            raise TypeError(f"reward_fn must be a function (reply, answer) -> float, got {type(reward_fn).__name__}.")
        if ref_model is not None:
            ref_model.eval()
            ref_model.requires_grad_(False)
        self.ref_model, self.tokenizer = ref_model, tokenizer
        self.num_generations, self.max_new_tokens = num_generations, max_new_tokens
        self.beta, self.temperature, self.reward_fn = float(beta), temperature, reward_fn
        self.normalize_batch, self.reduction = normalize_batch, reduction
        self.end = _special_id(tokenizer, IM_END)
        self.generator = torch.Generator().manual_seed(seed)
        self.last_samples: List[Dict[str, Any]] = []

    def _generator_for(self, device: torch.device) -> torch.Generator:
        if self.generator.device != device:
            self.generator = torch.Generator(device=device).manual_seed(int(torch.randint(0, 2**31 - 1, (1,),
                                                                                          generator=self.generator)))
        return self.generator

    def __call__(self, model: torch.nn.Module, batch: Sequence[Dict[str, Any]]) -> Dict[str, torch.Tensor]:
        from .dpo import check_reference

        check_reference(model, self.ref_model)
        device = next(model.parameters()).device
        generator = self._generator_for(device)
        groups, rewards, texts = [], [], []
        for record in batch:
            turns = record["conversations"]
            sample = sample_completions(model, self.tokenizer, turns[:-1], self.num_generations, self.max_new_tokens,
                                        self.temperature, generator)
            groups.append(sample)
            texts.extend(sample["texts"])
            rewards.extend(_checked_reward(self.reward_fn(t, turns[-1]["content"]), t, self.reward_fn)
                           for t in sample["texts"])
        reward_t = torch.tensor(rewards, dtype=torch.float32, device=device)
        advantages = group_advantages(reward_t, self.num_generations, normalize_batch=self.normalize_batch)
        width = max(g["completion_ids"].size(1) for g in groups)
        lps, ref_lps, masks, aux = [], [], [], torch.zeros((), device=device)
        for g in groups:
            x = F.pad(g["input_ids"], (0, width - g["completion_ids"].size(1)), value=self.end)
            out_lp, out_aux = _logps_and_aux(model, x, width)
            lps.append(out_lp)
            aux = aux + out_aux / len(groups)
            if self.ref_model is not None:
                if next(self.ref_model.parameters()).device != device:
                    self.ref_model.to(device)
                with torch.no_grad():
                    ref_lps.append(per_token_logps(self.ref_model, x, width))
            masks.append(completion_mask(x[:, -width:], self.end))
        lp = torch.cat(lps)
        ref_lp = torch.cat(ref_lps) if ref_lps else lp.detach()
        mask = torch.cat(masks)
        loss = grpo_loss(lp, ref_lp, advantages, mask, self.beta, self.reduction)
        with torch.no_grad():
            m = mask.float()
            kl = (per_token_kl(lp.detach(), ref_lp) * m).sum() / m.sum().clamp_min(1.0)
            spread = reward_t.view(-1, self.num_generations).std(dim=1)
        self.last_samples = [{"text": t, "reward": r, "advantage": float(a)} for t, r, a in zip(texts, rewards, advantages)]
        stopped = torch.cat([(g["completion_ids"] == self.end).any(dim=1) for g in groups]).float()
        return {"loss": loss + aux, "grpo_loss": loss.detach(), "aux_loss": aux.detach(), "reward": reward_t.mean(),
                "accuracy": (reward_t >= 1).float().mean(), "completion_length": m.sum(dim=1).mean(),
                "stop_rate": stopped.mean(), "kl": kl, "zero_std_groups": (spread == 0).float().mean(),
                "tokens": m.sum()}


# ---------------------------------------------------------------------- training and the grpo stage
GRPO_CONFIG = "ch12_grpo"
# the shipped stage's GRPO settings (the loop's settings are configs/ch12_grpo.json)
STAGE_SETTINGS: Dict[str, Any] = {"num_generations": 8, "max_new_tokens": 16, "beta": 0.04, "temperature": 0.8,
                                  "reduction": "sequence", "normalize_batch": True, "n_train": 2000,
                                  "n_heldout": 100, "seed": 0}


def rl_data(n_train: int = 2000, seed: int = 0) -> "RunData":
    """``chat_data.rl_prompts`` (training split) as a ``train.RunData`` of ``RLPromptDataset``."""
    from . import chat_data
    from .train import RunData

    return RunData(None, RLPromptDataset(chat_data.rl_prompts(n_train, seed, "train")), None, [])


@torch.no_grad()
def heldout_accuracy(model: torch.nn.Module, tokenizer: Any, n: int = 100, seed: int = 0,
                     max_new_tokens: int = 16, n_samples: int = 4, temperature: float = 0.8) -> Dict[str, float]:
    """Greedy replies to ``n`` held-out sum prompts (``chat_data.rl_prompts(n, seed, "test")``):
    ``accuracy`` (``sum_reward``), ``stop_rate`` and ``length`` (mean reply tokens); and, with
    ``n_samples``, ``sampled_accuracy``: the mean reward of ``n_samples`` replies per prompt
    sampled at ``temperature`` (what GRPO maximises; seeded, so deterministic on one machine)."""
    from . import chat_data
    from .sft import generate_replies

    records = chat_data.rl_prompts(n, seed, "test")
    was_training = model.training
    model.eval()
    try:
        replies = generate_replies(model, tokenizer, [r["conversations"][:-1] for r in records],
                                   max_new_tokens=max_new_tokens)
        scores = [sum_reward(r["text"], rec["conversations"][-1]["content"]) for r, rec in zip(replies, records)]
        out = {"accuracy": sum(scores) / n, "stop_rate": sum(r["stopped"] for r in replies) / n,
               "length": sum(len(r["ids"]) for r in replies) / n}
        if n_samples:
            g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed + 1)
            convs = [r["conversations"][:-1] for r in records for _ in range(n_samples)]
            sampled = generate_replies(model, tokenizer, convs, max_new_tokens=max_new_tokens, do_sample=True,
                                       temperature=temperature, generator=g)
            answers = [r["conversations"][-1]["content"] for r in records for _ in range(n_samples)]
            out["sampled_accuracy"] = sum(sum_reward(r["text"], a) for r, a in zip(sampled, answers)) / len(convs)
    finally:
        model.train(was_training)
    return out


def train_grpo(model: torch.nn.Module, tokenizer: Any, cfg: "Optional[TrainConfig]" = None, ref_model: Any = "copy",
               num_generations: int = 8, max_new_tokens: int = 16, beta: float = 0.04, temperature: float = 0.8,
               normalize_batch: bool = True, reduction: str = "sequence", reward_fn: Callable[[str, str], float] = sum_reward,
               n_train: int = 2000, seed: int = 0, n_heldout: int = 100, data: "Optional[RunData]" = None,
               **train_kwargs: Any) -> "TrainResult":
    """GRPO with ``minimind_ref.train``'s loop; ``model`` (the policy) is trained in place.
    ``cfg.batch_size`` counts prompts (``batch_size * num_generations`` completions per step).
    ``ref_model``: ``"copy"`` (default) freezes a copy of ``model`` first, as upstream does; a
    module is used as given; ``None`` drops the KL term (``beta`` must be 0). Every
    ``cfg.eval_every`` steps the default evaluation logs ``heldout_accuracy`` on ``n_heldout``
    held-out prompts (``history["eval_accuracy"]``, ``eval_stop_rate``, ``eval_length``)."""
    from .dpo import check_reference, freeze_reference
    from .train import TrainConfig, train

    check_reference(model, ref_model)
    cfg = cfg if cfg is not None else TrainConfig.from_json(GRPO_CONFIG)
    if isinstance(ref_model, str):
        if ref_model != "copy":
            raise ValueError(f"ref_model must be 'copy', a model, or None (no KL term), got {ref_model!r}.")
        ref_model = freeze_reference(model)
    data = data if data is not None else rl_data(n_train, seed)
    objective = GRPOObjective(ref_model, tokenizer, num_generations=num_generations, max_new_tokens=max_new_tokens,
                              beta=beta, temperature=temperature, reward_fn=reward_fn, normalize_batch=normalize_batch,
                              reduction=reduction, seed=seed)

    def evaluate(policy: torch.nn.Module, step: int) -> Dict[str, float]:
        return heldout_accuracy(policy, tokenizer, n_heldout, seed, max_new_tokens) if n_heldout else {}

    train_kwargs.setdefault("evaluate", evaluate)
    result = train(cfg, model=model, data=data, objective=objective, **train_kwargs)
    result.objective = objective  # type: ignore[attr-defined]
    return result


def build_stage(parent: torch.nn.Module, tokenizer: Any) -> "tuple[torch.nn.Module, Dict[str, Any], Any]":
    """The shipped ``grpo`` stage: ``train_grpo`` on its parent stage with ``GRPO_CONFIG`` and
    ``STAGE_SETTINGS`` (``python -m minimind_ref.stages rebuild grpo``)."""
    from .dpo import freeze_reference
    from .train import TrainConfig

    s = STAGE_SETTINGS
    cfg = TrainConfig.from_json(GRPO_CONFIG).replace(progress=False, out_dir=None)
    ref = freeze_reference(parent)
    before = heldout_accuracy(parent, tokenizer, s["n_heldout"], s["seed"], s["max_new_tokens"])
    result = train_grpo(parent, tokenizer, cfg, ref_model=ref, num_generations=s["num_generations"],
                        max_new_tokens=s["max_new_tokens"], beta=s["beta"], temperature=s["temperature"],
                        normalize_batch=s["normalize_batch"], reduction=s["reduction"], n_train=s["n_train"],
                        seed=s["seed"], n_heldout=s["n_heldout"], log=lambda line: None)
    after = heldout_accuracy(result.model, tokenizer, s["n_heldout"], s["seed"], s["max_new_tokens"])
    h = result.history
    k = min(10, len(h["reward"]))
    extra = {"recipe": "minimind_ref.grpo:build_stage", "command": "python -m minimind_ref.stages rebuild grpo",
             "train_config": cfg.to_dict(), "grpo_settings": dict(s),
             "metrics": {"first_reward_mean10": sum(h["reward"][:k]) / k, "final_reward_mean10": sum(h["reward"][-k:]) / k,
                         "final_kl_mean10": sum(h["kl"][-k:]) / k,
                         "heldout_accuracy_before": before["accuracy"], "heldout_accuracy_after": after["accuracy"],
                         "heldout_stop_rate_after": after["stop_rate"], "heldout_length_after": after["length"],
                         "heldout_sampled_accuracy_before": before["sampled_accuracy"],
                         "heldout_sampled_accuracy_after": after["sampled_accuracy"]},
             # the run's curves (a few kB), plotted by chapter 12
             "history": {key: [round(float(v), 5) for v in h[key]] for key in
                         ("step", "reward", "kl", "completion_length", "zero_std_groups", "grpo_loss", "eval_step",
                          "eval_accuracy", "eval_sampled_accuracy")}}
    return result.model, extra, tokenizer
