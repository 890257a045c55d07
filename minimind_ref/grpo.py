"""Reinforcement learning with verifiable rewards (chapter 12): GRPO as upstream's
``trainer/train_grpo.py`` and ``trainer/rollout_engine.py`` do it (jingyaogong/minimind at d65ef2c).

One GRPO step, for ``B`` prompts and ``G = num_generations`` sampled completions each
(``N = B * G`` rows, completions ``R`` tokens long after padding):

1. the *rollout*: sample ``G`` completions per prompt (temperature 0.8, as upstream) with the
   policy that samples, and keep its log-probabilities of the sampled tokens,
   ``old_per_token_logps`` (no gradient);
2. score every completion with a *verifiable* reward (is the sum right?);
3. ``group_advantages``: each reward relative to its own group, ``(r - mean) / (std + 1e-4)``
   with the population std, once (``d65ef2c:trainer/train_grpo.py:121-124``; c090b69 used the sample
   std, clamped to +-10 and normalised a second time over the batch,
   ``c090b69:trainer/train_grpo.py:133-137``: ``C090B69_ADVANTAGES``);
4. ``per_token_logps`` of the completion tokens under the policy being trained (with gradient)
   and under the frozen reference (without);
5. ``grpo_loss``, per token, with ``ratio = exp(lp - old)`` and ``k3 = exp(ref - lp) - (ref - lp) - 1``
   (an estimate of KL(pi || pi_ref)):

   * ``loss_type="cispo"`` (d65ef2c's default; MiniMax-M1's CISPO): ``-(min(ratio, epsilon_high).detach()
     * A * lp - beta * k3)``: the ratio, clamped above at ``epsilon_high`` and detached, weighs a
     REINFORCE term, so every token keeps a gradient;
   * ``loss_type="grpo"`` (PPO's clipped surrogate): ``-(min(ratio * A, clip(ratio, 1 - epsilon, 1 +
     epsilon) * A) - beta * k3)``: a token whose ratio left the clip range in the advantage's
     direction gets no gradient;

   averaged over each completion's ``completion_mask`` (up to and including its first end
   marker), then over rows.

The ratio differs from 1 only when the policy that sampled is not the policy being trained.
Upstream's default torch rollout engine (``d65ef2c:trainer/train_grpo.py:240``) samples with the
policy itself (``d65ef2c:trainer/rollout_engine.py:75-88``: ratio 1 in value at every step); its
SGLang engine serves a copy that ``update_policy`` refreshes every ``save_interval`` steps
(``d65ef2c:trainer/train_grpo.py:193``), so the copy lags and the ratio and the clipping act. ``GRPOObjective``
does the same with ``sync_every``: the sampling copy is refreshed every ``sync_every`` steps
(1: it is the policy). c090b69 had no old log-probabilities at all: its ratio was
``exp(lp - lp.detach())`` (``c090b69:trainer/train_grpo.py:146``), which is ``grpo_loss(lp,
lp.detach(), ..., loss_type="grpo")``. c090b69's reward was a reward model (InternLM2-1.8B-reward)
plus, for reasoning models, format terms (``c090b69:trainer/train_grpo.py:27-92``); d65ef2c's is the
same reward model plus terms for the reply's length, its thinking block and repeated 3-grams
(``d65ef2c:trainer/train_grpo.py:31-68``); the course's reward is verifiable (``sum_reward``), which
needs no second model.

Shapes: rewards and advantages ``[N]``; completion ids, masks and per-token log-probabilities
``[N, R]``; the loss a scalar.

* ``group_advantages``, ``completion_mask``, ``per_token_logps``, ``grpo_loss``: upstream's
  computations (``per_token_logps`` is the rollout engine's ``compute_per_token_logps``);
* ``per_token_kl``: the k3 estimator alone;
* ``sum_reward`` (the course's verifiable reward) and ``format_reward`` (c090b69's reward for
  ``<think>...</think><answer>...</answer>`` replies, 0.5 for the pattern plus 0.25 per tag
  counted once);
* ``RLPromptDataset``: ``chat_data.rl_prompts`` records (upstream's ``rlaif`` layout);
* ``sample_completions``: step 1; ``GRPOObjective``: steps 1-5 as an objective of
  ``minimind_ref.train``'s loop, holding the frozen reference and the sampling copy.

Deliberate difference from upstream: upstream batches prompts of different lengths with left
padding. Here each prompt's ``G`` completions share one unpadded prompt, so no padding is
attended to; with one prompt per batch the two are the same computation.
"""

from __future__ import annotations

import copy
import math
import numbers
import re
import warnings
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

from .datafiles import JsonlRecords
from .sft import IM_END, _special_id, encode_chat

if TYPE_CHECKING:  # pragma: no cover
    from .train import RunData, TrainConfig, TrainResult  # noqa: F401

REDUCTIONS = ("sequence", "token")
LOSS_TYPES = ("cispo", "grpo")
#: c090b69's advantages: the sample std, clamped to +-10, then normalised again over the batch.
C090B69_ADVANTAGES: Dict[str, Any] = {"unbiased": True, "clamp": 10.0, "normalize_batch": True}
# c090b69's format reward (args.reasoning == 1): the whole reply must match one of these (re.S)
THINK_PATTERNS = (r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$",
                  r"^<think>\n.*?\n</think>\n\n<answer>\n.*?\n</answer>$")
THINK_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def _check_beta(beta: Any) -> None:
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta < 0:
        raise ValueError(f"beta must be a number >= 0 and finite (the KL penalty's weight; upstream's default is 0.1), got {beta!r}.")


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


def _check_advantage_options(eps: Any, unbiased: Any, clamp: Any, normalize_batch: Any) -> None:
    """``group_advantages``' options, checked where they enter (the function and ``GRPOObjective``)."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"eps must be a finite number > 0 (it keeps (r - mean) / (std + eps) finite for a group of "
                         f"equal rewards; upstream uses 1e-4), got {eps!r}: 0 gives NaN there, and a negative eps "
                         "flips the advantages' signs.")
    if clamp is not None and (isinstance(clamp, bool) or not isinstance(clamp, (int, float)) or not clamp > 0):
        raise ValueError(f"clamp must be None (no clamping) or a number > 0 (the advantages are clamped to "
                         f"[-clamp, clamp]; c090b69 uses 10), got {clamp!r}: 0 would zero every advantage, a negative clamp "
                         "set every one to -clamp.")
    for name, value in (("unbiased", unbiased), ("normalize_batch", normalize_batch)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}.")


def _check_clip(loss_type: Any, epsilon: Any, epsilon_high: Any) -> None:
    """``grpo_loss``' clipping settings, checked where they enter (the function and ``GRPOObjective``)."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES} (upstream's --loss_type), got {loss_type!r}.")
    _check_number("epsilon", epsilon, "a number > 0 (PPO's clip range is [1 - epsilon, 1 + epsilon]; upstream: 0.2; "
                  "0 clips every ratio to 1)")
    _check_number("epsilon_high", epsilon_high, "a number > 0 (CISPO's upper bound on the ratio; upstream: 5.0; 0 "
                  "would make every token's weight, and so the policy gradient, 0)")


# ---------------------------------------------------------------------- upstream's computations
def group_advantages(rewards: torch.Tensor, num_generations: int, eps: float = 1e-4, unbiased: bool = False,
                     clamp: Optional[float] = None, normalize_batch: bool = False) -> torch.Tensor:
    """Group-relative advantages ``[N]`` from rewards ``[N]`` (rows grouped ``num_generations``
    at a time, as sampled): ``(r - group mean) / (group std + eps)`` with the population std
    (``unbiased=False``), as d65ef2c does. A group whose rewards are all equal gets advantage 0:
    it carries no signal. ``C090B69_ADVANTAGES`` (``unbiased=True, clamp=10,
    normalize_batch=True``) is c090b69's recipe: the sample std, the result clamped to
    ``+-clamp``, then ``(a - a.mean()) / (a.std() + 1e-8)`` over the whole batch. ``eps`` must be
    > 0 and ``clamp`` None or > 0 (``ValueError``)."""
    _check_advantage_options(eps, unbiased, clamp, normalize_batch)
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"rewards must be a 1-D torch.Tensor, got {type(rewards).__name__}.")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [batch * num_generations], got shape {tuple(rewards.shape)}.")
    if isinstance(num_generations, bool) or not isinstance(num_generations, int) or num_generations < 2:
        raise ValueError(f"num_generations must be an int >= 2 (a group needs a spread), got {num_generations!r}.")
    if not bool(torch.isfinite(rewards.float()).all()):
        raise ValueError(f"rewards must be finite numbers; got {rewards.tolist()[:8]}: the reward function returned NaN "
                         "or inf.")
    if rewards.numel() % num_generations:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of num_generations={num_generations}; "
                         "pass the rewards of whole groups, in sampling order.")
    grouped = rewards.float().view(-1, num_generations)
    mean = grouped.mean(dim=1).repeat_interleave(num_generations)
    std = grouped.std(dim=1, unbiased=unbiased).repeat_interleave(num_generations)
    advantages = (rewards.float() - mean) / (std + eps)
    if clamp is not None:
        advantages = torch.clamp(advantages, -clamp, clamp)
    if normalize_batch:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    return advantages


def completion_mask(completion_ids: torch.Tensor, eos_token_id: int, pad_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``[N, R]`` int mask: 1 up to and including each row's first ``eos_token_id``; a row with
    no end marker is kept whole (upstream's rule). ``pad_mask`` ``[N, R]`` (d65ef2c's rollout
    ``completion_mask``: 0 where an engine padded a shorter completion) is and-ed in, and an end
    marker under padding does not count."""
    if not isinstance(completion_ids, torch.Tensor) or completion_ids.dim() != 2:
        raise ValueError(f"completion_ids must be a tensor [rows, completion_length], got "
                         f"{tuple(completion_ids.shape) if isinstance(completion_ids, torch.Tensor) else type(completion_ids).__name__}.")
    if isinstance(eos_token_id, bool) or not isinstance(eos_token_id, int):
        raise TypeError(f"eos_token_id must be an int token id, got {eos_token_id!r} ({type(eos_token_id).__name__}).")
    is_eos = completion_ids == eos_token_id
    if pad_mask is not None:
        if pad_mask.shape != completion_ids.shape:
            raise ValueError(f"pad_mask must have the shape of completion_ids {tuple(completion_ids.shape)}, got "
                             f"{tuple(pad_mask.shape)}.")
        if pad_mask.dtype != torch.bool and not bool(((pad_mask == 0) | (pad_mask == 1)).all()):
            raise ValueError(f"pad_mask must hold 0 (padding) and 1 (a real token) only, got values "
                             f"{pad_mask.unique().tolist()[:6]}.")
        is_eos = is_eos & pad_mask.bool()
    length = completion_ids.size(1)
    eos_idx = torch.full((completion_ids.size(0),), length - 1, dtype=torch.long, device=completion_ids.device)
    has_eos = is_eos.any(dim=1)
    eos_idx[has_eos] = is_eos.int().argmax(dim=1)[has_eos]
    positions = torch.arange(length, device=completion_ids.device).expand(completion_ids.size(0), -1)
    mask = positions <= eos_idx.unsqueeze(1)
    if pad_mask is not None:
        mask = mask & pad_mask.bool()
    return mask.int()


def per_token_logps(model: torch.nn.Module, input_ids: torch.Tensor, n_keep: int) -> torch.Tensor:
    """``[N, n_keep]``: the log-probability of each of the last ``n_keep`` tokens of
    ``input_ids`` ``[N, P + R]`` given the tokens before it (upstream's
    ``compute_per_token_logps``: the model computes only the last ``n_keep + 1`` positions' logits)."""
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


def _check_number(name: str, value: Any, allowed: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be {allowed}, got {value!r}.")


def _check_mask(completion_mask: torch.Tensor) -> torch.Tensor:
    """``completion_mask`` as a bool tensor; values other than 0 and 1 are a ``ValueError`` (a 0.5
    would weigh a token, a -1 flip its sign), as in ``dpo.sequence_log_probs``."""
    if completion_mask.dtype != torch.bool and not bool(((completion_mask == 0) | (completion_mask == 1)).all()):
        raise ValueError(f"completion_mask must hold 0 and 1 only (1 where a completion token counts), got values "
                         f"{completion_mask.unique().tolist()[:6]}.")
    return completion_mask.bool()


def _check_finite_where(name: str, values: torch.Tensor, mask: torch.Tensor, fix: str) -> None:
    bad = mask & ~torch.isfinite(values)
    if bool(bad.any()):
        row, col = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} is {float(values[row, col])} at row {row}, token {col}, a position the mask counts "
                         f"({int(bad.sum())} such position(s)); {fix}")


def grpo_loss(per_token_logps: torch.Tensor, old_per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor,
              advantages: torch.Tensor, completion_mask: torch.Tensor, beta: float, loss_type: str = "cispo",
              epsilon: float = 0.2, epsilon_high: float = 5.0, reduction: str = "sequence") -> torch.Tensor:
    """Upstream's policy loss (scalar; d65ef2c ``train_grpo.py``), see the module docstring.

    ``per_token_logps`` (policy, with gradient), ``old_per_token_logps`` (the rollout's, detached
    here), ``ref_per_token_logps`` (the reference) and ``completion_mask`` are ``[N, R]``,
    ``advantages`` ``[N]``. ``loss_type="cispo"`` (default) clamps the ratio above at
    ``epsilon_high`` and detaches it; ``"grpo"`` is PPO's clip to ``[1 - epsilon, 1 + epsilon]``.
    ``reduction="sequence"`` (upstream) averages over each row's masked tokens (a row with an
    empty mask contributes 0), then over rows; ``"token"`` averages over all masked tokens of the
    batch at once, so long completions weigh more.

    Checked: ``completion_mask`` holds 0 and 1 only, ``advantages`` are finite, and the rollout's
    and the reference's log-probabilities are finite where the mask counts (``ValueError``: their
    NaN is not the learning rate's doing). Positions the mask leaves out are selected away, never
    multiplied by 0, so a NaN or -inf there changes neither the loss nor its gradient."""
    _check_clip(loss_type, epsilon, epsilon_high)
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}.")
    _check_beta(beta)
    shape = per_token_logps.shape
    if old_per_token_logps.shape != shape or ref_per_token_logps.shape != shape or completion_mask.shape != shape:
        raise ValueError("per_token_logps, old_per_token_logps, ref_per_token_logps and completion_mask must have the "
                         f"same shape [rows, completion_length]; got {tuple(shape)}, {tuple(old_per_token_logps.shape)}, "
                         f"{tuple(ref_per_token_logps.shape)} and {tuple(completion_mask.shape)}.")
    if advantages.shape != shape[:1]:
        raise ValueError(f"advantages must be [rows] = {tuple(shape[:1])}, got {tuple(advantages.shape)}.")
    if not bool(torch.isfinite(advantages).all()):
        raise ValueError(f"advantages must be finite, got {advantages.tolist()[:8]}: check the rewards and "
                         "group_advantages' eps.")
    keep = _check_mask(completion_mask)
    _check_finite_where("old_per_token_logps", old_per_token_logps.detach(), keep,
                        "the rollout policy's log-probabilities must be finite where the loss counts them.")
    _check_finite_where("ref_per_token_logps", ref_per_token_logps.detach(), keep,
                        "the reference model's log-probabilities must be finite where the loss counts them (do its "
                        "weights hold NaN or inf?).")
    zero = torch.zeros((), dtype=per_token_logps.dtype, device=per_token_logps.device)
    # select, don't multiply: a NaN at a left-out position would survive "* 0" (NaN * 0 = NaN), in the
    # loss and in its gradient
    lp, old, ref = (torch.where(keep, t, zero) for t in (per_token_logps, old_per_token_logps.detach(),
                                                          ref_per_token_logps))
    kl = per_token_kl(lp, ref)
    ratio = torch.exp(lp - old)
    adv = advantages.unsqueeze(1)
    if loss_type == "cispo":
        per_token = -(torch.clamp(ratio, max=epsilon_high).detach() * adv * lp - beta * kl)
    else:
        clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon)
        per_token = -(torch.min(ratio * adv, clipped * adv) - beta * kl)
    per_token = torch.where(keep, per_token, zero)
    counts = keep.to(per_token.dtype)
    if reduction == "token":
        return per_token.sum() / counts.sum().clamp_min(1.0)
    return (per_token.sum(dim=1) / counts.sum(dim=1).clamp_min(1.0)).mean()


def clip_fraction(per_token_logps: torch.Tensor, old_per_token_logps: torch.Tensor, advantages: torch.Tensor,
                  completion_mask: torch.Tensor, loss_type: str = "cispo", epsilon: float = 0.2,
                  epsilon_high: float = 5.0) -> torch.Tensor:
    """Share of the masked tokens whose ratio the loss clips: for ``"grpo"``, where PPO's min picks
    the clipped term and the token gets no gradient (ratio above ``1 + epsilon`` with a positive
    advantage, or below ``1 - epsilon`` with a negative one); for ``"cispo"``, where the ratio is
    above ``epsilon_high`` (the token keeps its gradient, with a capped weight)."""
    _check_clip(loss_type, epsilon, epsilon_high)
    mask = _check_mask(completion_mask)
    ratio = torch.exp(per_token_logps.detach() - old_per_token_logps.detach())
    adv = advantages.unsqueeze(1)
    if loss_type == "cispo":
        clipped = ratio > epsilon_high
    else:
        clipped = ((ratio > 1 + epsilon) & (adv > 0)) | ((ratio < 1 - epsilon) & (adv < 0))
    return (clipped & mask).float().sum() / mask.float().sum().clamp_min(1.0)


# ---------------------------------------------------------------------- verifiable rewards
def _texts(**texts: Any) -> None:
    for name, value in texts.items():
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str (the decoded text), got {type(value).__name__}.")


def sum_reward(reply: str, answer: str) -> float:
    """1.0 when the reply is the whole right answer (``37+45=082``, whitespace stripped), else 0."""
    _texts(reply=reply, answer=answer)
    return float(reply.strip() == answer.strip())


def format_reward(reply: str) -> float:
    """Upstream's reasoning-format reward: 0.5 if the whole reply is ``<think>\\n...\\n</think>\\n
    <answer>\\n...\\n</answer>`` (one blank line allowed between the blocks), plus 0.25 for each
    of the four tags that occurs exactly once (at most 1.5)."""
    _texts(reply=reply)
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
                    or turns[-1].get("role") != "assistant" or not isinstance(turns[-1].get("content"), str)):
                raise ValueError(f"record {i} must be {{'conversations': [...prompt turns, "
                                 "{'role': 'assistant', 'content': reference answer (a str)}]}.")
        # a file's records (datafiles.JsonlRecords, upstream's rlaif.jsonl) stay on disk, read when a batch needs them
        self.records = records if isinstance(records, JsonlRecords) else list(records)

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
    c090b69 calls ``generate(do_sample=True, temperature=0.8)`` (``c090b69:trainer/train_grpo.py:107-109``),
    the ``generate`` of ``transformers``' ``GenerationMixin`` (MiniMind2 has none of its own), which
    under transformers 4.57 also keeps ``GenerationConfig``'s default ``top_k=50``; d65ef2c's torch
    rollout engine calls MiniMind's own ``generate`` at temperature 0.8, whose defaults keep top-k 50
    and top-p 0.85 (``d65ef2c:model/model_minimind.py:257 "top_p=0.85, top_k=50"``). Returns ``{"input_ids": [G, P + R], "completion_ids":
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

    Per batch: the rollout (``num_generations`` completions per prompt sampled by the sampling
    policy, and its ``old_per_token_logps``), rewards ``reward_fn(reply, answer)`` (default
    ``sum_reward``), ``group_advantages`` (d65ef2c's, or ``advantages=C090B69_ADVANTAGES``),
    per-token log-probabilities of the policy (with gradient) and of the frozen reference, and
    ``grpo_loss`` (+ the MoE balancing loss, 0 for dense models). The sampling policy is a copy of
    the policy refreshed every ``sync_every`` calls (1: the policy itself, as upstream's torch
    rollout engine; more: a lagging copy, as its SGLang engine between ``update_policy`` calls).
    ``ref_model=None`` drops the KL term (``beta`` must then be 0).

    Metrics (detached): ``grpo_loss``, ``aux_loss``, ``reward`` (mean), ``accuracy`` (share of
    completions with reward >= 1), ``completion_length`` (mean tokens, end marker included),
    ``stop_rate`` (completions that emitted the end marker), ``kl`` (mean k3 over the completion
    tokens), ``ratio_mean`` / ``ratio_max`` (of ``exp(lp - old)`` over the completion tokens),
    ``clip_fraction`` (``grpo.clip_fraction``), ``zero_std_groups`` (share of groups whose
    rewards were all equal: no signal) and ``tokens`` (completion tokens in the loss)."""

    def __init__(self, ref_model: Optional[torch.nn.Module], tokenizer: Any, num_generations: int = 6,
                 max_new_tokens: int = 16, beta: float = 0.1, temperature: float = 0.8,
                 reward_fn: Callable[[str, str], float] = sum_reward, loss_type: str = "cispo", epsilon: float = 0.2,
                 epsilon_high: float = 5.0, advantages: Optional[Dict[str, Any]] = None, reduction: str = "sequence",
                 sync_every: int = 1, seed: int = 0) -> None:
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}.")
        _check_clip(loss_type, epsilon, epsilon_high)
        _check_beta(beta)
        if ref_model is None and beta != 0:
            raise ValueError(f"beta={beta} needs a reference model for the KL term; pass ref_model or set beta=0.")
        if isinstance(num_generations, bool) or not isinstance(num_generations, int) or num_generations < 2:
            raise ValueError(f"num_generations must be an int >= 2, got {num_generations!r}.")
        if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
            raise ValueError(f"sync_every must be an int >= 1 (1: sample with the policy itself), got {sync_every!r}.")
        if advantages is not None and not isinstance(advantages, dict):
            raise TypeError(f"advantages must be a dict of group_advantages' options (e.g. grpo.C090B69_ADVANTAGES) or "
                            f"None, got {type(advantages).__name__}.")
        unknown = set(advantages or {}) - {"eps", "unbiased", "clamp", "normalize_batch"}
        if unknown:
            raise ValueError(f"advantages takes group_advantages' options (eps, unbiased, clamp, normalize_batch), "
                             f"got {sorted(unknown)}.")
        _check_advantage_options(**{"eps": 1e-4, "unbiased": False, "clamp": None, "normalize_batch": False,
                                    **(advantages or {})})
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
        self.loss_type, self.epsilon, self.epsilon_high = loss_type, float(epsilon), float(epsilon_high)
        self.advantages, self.reduction, self.sync_every = dict(advantages or {}), reduction, sync_every
        self.end = _special_id(tokenizer, IM_END)
        self.generator = torch.Generator().manual_seed(seed)
        self.rollout_model: Optional[torch.nn.Module] = None
        self.calls = 0
        self.last_samples: List[Dict[str, Any]] = []

    def _generator_for(self, device: torch.device) -> torch.Generator:
        if self.generator.device != device:
            self.generator = torch.Generator(device=device).manual_seed(int(torch.randint(0, 2**31 - 1, (1,),
                                                                                          generator=self.generator)))
        return self.generator

    def sampling_policy(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model that samples this call: ``model`` itself when ``sync_every == 1``, else a copy
        refreshed from ``model`` every ``sync_every`` calls (``update_policy``)."""
        if self.sync_every == 1:
            return model
        if self.rollout_model is None or self.calls % self.sync_every == 0:
            if self.rollout_model is None:
                self.rollout_model = copy.deepcopy(model).requires_grad_(False)
            else:
                self.rollout_model.load_state_dict(model.state_dict())
        return self.rollout_model

    def __call__(self, model: torch.nn.Module, batch: Sequence[Dict[str, Any]]) -> Dict[str, torch.Tensor]:
        from .dpo import check_reference

        check_reference(model, self.ref_model)
        device = next(model.parameters()).device
        generator = self._generator_for(device)
        sampler = self.sampling_policy(model)
        self.calls += 1
        was_training = sampler.training
        sampler.eval()
        groups, rewards, texts = [], [], []
        try:
            for record in batch:
                turns = record["conversations"]
                sample = sample_completions(sampler, self.tokenizer, turns[:-1], self.num_generations,
                                            self.max_new_tokens, self.temperature, generator)
                groups.append(sample)
                texts.extend(sample["texts"])
                rewards.extend(_checked_reward(self.reward_fn(t, turns[-1]["content"]), t, self.reward_fn)
                               for t in sample["texts"])
        finally:
            sampler.train(was_training)
        reward_t = torch.tensor(rewards, dtype=torch.float32, device=device)
        advantages = group_advantages(reward_t, self.num_generations, **self.advantages)
        width = max(g["completion_ids"].size(1) for g in groups)
        lps, old_lps, ref_lps, masks, aux = [], [], [], [], torch.zeros((), device=device)
        for g in groups:
            x = F.pad(g["input_ids"], (0, width - g["completion_ids"].size(1)), value=self.end)
            out_lp, out_aux = _logps_and_aux(model, x, width)
            if sampler is model:  # the rollout's own log-probabilities: the same weights, the same numbers
                old_lps.append(out_lp.detach())
            else:
                with torch.no_grad():
                    old_lps.append(per_token_logps(sampler, x, width))
            lps.append(out_lp)
            aux = aux + out_aux / len(groups)
            if self.ref_model is not None:
                if next(self.ref_model.parameters()).device != device:
                    self.ref_model.to(device)
                with torch.no_grad():
                    ref_lps.append(per_token_logps(self.ref_model, x, width))
            masks.append(completion_mask(x[:, -width:], self.end))
        lp, old_lp = torch.cat(lps), torch.cat(old_lps)
        ref_lp = torch.cat(ref_lps) if ref_lps else lp.detach()
        mask = torch.cat(masks)
        loss = grpo_loss(lp, old_lp, ref_lp, advantages, mask, self.beta, self.loss_type, self.epsilon,
                         self.epsilon_high, self.reduction)
        with torch.no_grad():
            m = mask.float()
            kl = (per_token_kl(lp.detach(), ref_lp) * m).sum() / m.sum().clamp_min(1.0)
            ratio = torch.exp(lp.detach() - old_lp)
            ratio_mean = (ratio * m).sum() / m.sum().clamp_min(1.0)
            ratio_max = (ratio * m).max()
            clipped = clip_fraction(lp, old_lp, advantages, mask, self.loss_type, self.epsilon, self.epsilon_high)
            spread = reward_t.view(-1, self.num_generations).std(dim=1)
        self.last_samples = [{"text": t, "reward": r, "advantage": float(a)} for t, r, a in zip(texts, rewards, advantages)]
        stopped = torch.cat([(g["completion_ids"] == self.end).any(dim=1) for g in groups]).float()
        return {"loss": loss + aux, "grpo_loss": loss.detach(), "aux_loss": aux.detach(), "reward": reward_t.mean(),
                "accuracy": (reward_t >= 1).float().mean(), "completion_length": m.sum(dim=1).mean(),
                "stop_rate": stopped.mean(), "kl": kl, "ratio_mean": ratio_mean, "ratio_max": ratio_max,
                "clip_fraction": clipped, "zero_std_groups": (spread == 0).float().mean(), "tokens": m.sum()}


class Rehearsal:
    """An objective with rehearsal: ``objective(model, batch)`` plus ``weight`` times the
    next-token loss on ``batch_size`` rows drawn from ``dataset`` (an ``sft.SFTDataset`` of
    chapter 09's conversations; labels -100 where no loss counts), drawn with its own seeded
    generator, so the objective's own draws are the same as without it. Logged as
    ``rehearsal_loss``. The reward of chapter 12 looks only at sums; the rehearsal keeps the
    replies it never looks at (refusals, "who are you?") near what SFT taught, as chapter 10's
    rehearsal does for LoRA."""

    def __init__(self, objective: Callable[..., Dict[str, torch.Tensor]], dataset: Any, batch_size: int = 4,
                 weight: float = 1.0, seed: int = 0) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1 (conversations rehearsed per step), got {batch_size!r}.")
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight) or weight < 0:
            raise ValueError(f"weight must be a finite number >= 0 (the rehearsal loss's weight), got {weight!r}.")
        if not callable(objective):
            raise TypeError(f"objective must be a callable objective(model, batch) -> {{'loss': ...}}, got "
                            f"{type(objective).__name__}.")
        if not (hasattr(dataset, "__len__") and callable(getattr(dataset, "batch", None))):
            raise TypeError(f"dataset must be a dataset with batch(indices) -> (x, y), such as sft.SFTDataset(records, "
                            f"tokenizer), got {type(dataset).__name__}: wrap the conversations in an SFTDataset.")
        if not len(dataset):
            raise ValueError("the rehearsal dataset is empty: give it conversations to rehearse.")
        self.objective, self.dataset, self.batch_size, self.weight = objective, dataset, batch_size, float(weight)
        self.generator = torch.Generator().manual_seed(seed)

    def __getattr__(self, name: str) -> Any:  # the wrapped objective's state (last_samples, calls, ...)
        if name == "objective":
            raise AttributeError(name)
        return getattr(self.objective, name)

    def __call__(self, model: torch.nn.Module, batch: Any) -> Dict[str, torch.Tensor]:
        metrics = self.objective(model, batch)
        if not isinstance(metrics, dict) or not isinstance(metrics.get("loss"), torch.Tensor):
            got = type(metrics).__name__ if not isinstance(metrics, dict) else f"a dict with keys {sorted(metrics)}"
            raise TypeError(f"the objective Rehearsal wraps must return a dict with 'loss' (a scalar tensor) and other "
                            f"metrics, got {got}.")
        metrics = dict(metrics)
        device = next(model.parameters()).device
        idx = torch.randint(len(self.dataset), (self.batch_size,), generator=self.generator)
        x, y = (t.to(device) for t in self.dataset.batch(idx))
        rehearsal = model(x, labels=y).loss
        metrics["loss"] = metrics["loss"] + self.weight * rehearsal
        metrics["rehearsal_loss"] = rehearsal.detach()
        return metrics


# ---------------------------------------------------------------------- training and the grpo stage
GRPO_CONFIG = "ch12_grpo"
# the shipped stage's GRPO settings (the loop's settings are configs/ch12_grpo.json)
# ``rehearsal``: chapter 09 conversations rehearsed per step (``Rehearsal``, weight ``rehearsal_weight``). The
# reward looks only at sums, and the KL term only at the sums' completions: without rehearsal, 5 of the
# 10 runs of seeds 0-4 on both float paths ended with the refusals or "who are you?" at 0 %.
STAGE_SETTINGS: Dict[str, Any] = {"num_generations": 6, "max_new_tokens": 16, "beta": 0.1, "temperature": 0.8,
                                  "loss_type": "cispo", "epsilon": 0.2, "epsilon_high": 5.0, "sync_every": 1,
                                  "reduction": "sequence", "n_train": 2000, "rehearsal": 4, "rehearsal_weight": 1.0}
REHEARSAL_CONVERSATIONS = 1000  # the pool the rehearsal draws from (chapter 09's training split, the run's seed)


def rl_data(n_train: int = 2000, seed: int = 0) -> "RunData":
    """``chat_data.rl_prompts`` (training split) as a ``train.RunData`` of ``RLPromptDataset``."""
    from . import chat_data
    from .train import RunData

    return RunData(None, RLPromptDataset(chat_data.rl_prompts(n_train, seed, "train")), None, [])


@torch.no_grad()
def heldout_accuracy(model: torch.nn.Module, tokenizer: Any, n: Optional[int] = None, seed: int = 0,
                     max_new_tokens: int = 16, n_samples: int = 4, temperature: float = 0.8,
                     records: Optional[Sequence[Dict[str, Any]]] = None) -> Dict[str, float]:
    """Greedy replies to held-out sum prompts (default ``chat_data.heldout_rl_prompts()``: 200
    distinct held-out problems in held-out phrasings; ``n``: the first ``n`` of them):
    ``accuracy`` (``sum_reward``), ``stop_rate`` and ``length`` (mean reply tokens); and, with
    ``n_samples``, ``sampled_accuracy``: the mean reward of ``n_samples`` replies per prompt
    sampled at ``temperature`` (what GRPO maximises; seeded by ``seed``, so deterministic on one
    machine)."""
    from . import chat_data
    from .sft import generate_replies

    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
        raise ValueError(f"n must be None (every held-out prompt) or an int >= 0 (the first n; 0: all), got {n!r}.")
    records = list(records) if records is not None else chat_data.heldout_rl_prompts()
    records = records[:n] if n else records
    if not records:
        raise ValueError("heldout_accuracy needs at least one record to score.")
    count = len(records)
    was_training = model.training
    model.eval()
    try:
        replies = generate_replies(model, tokenizer, [r["conversations"][:-1] for r in records],
                                   max_new_tokens=max_new_tokens)
        scores = [sum_reward(r["text"], rec["conversations"][-1]["content"]) for r, rec in zip(replies, records)]
        out = {"accuracy": sum(scores) / count, "stop_rate": sum(r["stopped"] for r in replies) / count,
               "length": sum(len(r["ids"]) for r in replies) / count}
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
               num_generations: int = 6, max_new_tokens: int = 16, beta: float = 0.1, temperature: float = 0.8,
               loss_type: str = "cispo", epsilon: float = 0.2, epsilon_high: float = 5.0,
               advantages: Optional[Dict[str, Any]] = None, reduction: str = "sequence", sync_every: int = 1,
               reward_fn: Callable[[str, str], float] = sum_reward, n_train: int = 2000, seed: int = 0,
               n_heldout: Optional[int] = 100, data: "Optional[RunData]" = None, rehearsal: int = 0,
               rehearsal_weight: float = 1.0, **train_kwargs: Any) -> "TrainResult":
    """GRPO with ``minimind_ref.train``'s loop; ``model`` (the policy) is trained in place.
    ``cfg.batch_size`` counts prompts (``batch_size * num_generations`` completions per step).
    ``ref_model``: ``"copy"`` (default) freezes a copy of ``model`` first, as upstream does; a
    module is used as given; ``None`` drops the KL term (``beta`` must be 0). Every
    ``cfg.eval_every`` steps the default evaluation logs ``heldout_accuracy`` on the first
    ``n_heldout`` held-out prompts (``history["eval_accuracy"]``, ``eval_stop_rate``,
    ``eval_length``, ``eval_sampled_accuracy``; ``n_heldout=0``: no evaluation). ``rehearsal``: that
    many of chapter 09's conversations (``REHEARSAL_CONVERSATIONS`` of them, drawn with ``seed``)
    rehearsed per step with weight ``rehearsal_weight`` (``Rehearsal``; 0: none)."""
    from .dpo import check_reference, freeze_reference
    from .train import TrainConfig, train

    check_reference(model, ref_model)
    if n_heldout is not None and (isinstance(n_heldout, bool) or not isinstance(n_heldout, int) or n_heldout < 0):
        raise ValueError(f"n_heldout must be None or an int >= 0 (held-out prompts per evaluation; 0: none), got "
                         f"{n_heldout!r}.")
    cfg = cfg if cfg is not None else TrainConfig.from_json(GRPO_CONFIG)
    if isinstance(ref_model, str):
        if ref_model != "copy":
            raise ValueError(f"ref_model must be 'copy', a model, or None (no KL term), got {ref_model!r}.")
        ref_model = freeze_reference(model)
    data = data if data is not None else rl_data(n_train, seed)
    objective = GRPOObjective(ref_model, tokenizer, num_generations=num_generations, max_new_tokens=max_new_tokens,
                              beta=beta, temperature=temperature, reward_fn=reward_fn, loss_type=loss_type,
                              epsilon=epsilon, epsilon_high=epsilon_high, advantages=advantages, reduction=reduction,
                              sync_every=sync_every, seed=seed)
    loop_objective: Callable[..., Dict[str, torch.Tensor]] = objective
    if rehearsal:
        from . import chat_data
        from .sft import SFTDataset

        with warnings.catch_warnings():  # chapter 09's conversations at chapter 09's length: its truncation warning,
            warnings.simplefilter("ignore")  # said there, would repeat at every GRPO run
            pool = SFTDataset(chat_data.sft_conversations(REHEARSAL_CONVERSATIONS, seed=seed, split="train"), tokenizer,
                              max_length=256, seed=seed, empty_think_ratio=1.0)
        loop_objective = Rehearsal(objective, pool, rehearsal, rehearsal_weight, seed)

    def evaluate(policy: torch.nn.Module, step: int) -> Dict[str, float]:
        return heldout_accuracy(policy, tokenizer, n_heldout, seed, max_new_tokens) if n_heldout else {}

    train_kwargs.setdefault("evaluate", evaluate)
    result = train(cfg, model=model, data=data, objective=loop_objective, **train_kwargs)
    result.objective = objective  # type: ignore[attr-defined]
    return result


def build_stage(parent: torch.nn.Module, tokenizer: Any, seed: int = 0) -> "tuple[torch.nn.Module, Dict[str, Any], Any]":
    """The shipped ``grpo`` stage: ``train_grpo`` on its parent stage with ``GRPO_CONFIG`` and
    ``STAGE_SETTINGS`` (``python -m minimind_ref.stages rebuild grpo``); ``seed`` draws the
    prompts, orders the batches and seeds the sampler (the shipped stage: 0)."""
    from .dpo import freeze_reference
    from .train import TrainConfig

    s = STAGE_SETTINGS
    cfg = TrainConfig.from_json(GRPO_CONFIG).replace(progress=False, out_dir=None, seed=seed)
    ref = freeze_reference(parent)
    before = heldout_accuracy(parent, tokenizer, None, 0, s["max_new_tokens"])
    keys = ("num_generations", "max_new_tokens", "beta", "temperature", "loss_type", "epsilon", "epsilon_high",
            "sync_every", "reduction", "n_train", "rehearsal", "rehearsal_weight")
    result = train_grpo(parent, tokenizer, cfg, ref_model=ref, seed=seed, n_heldout=0, log=lambda line: None,
                        **{k: s[k] for k in keys})
    after = heldout_accuracy(result.model, tokenizer, None, 0, s["max_new_tokens"])
    h = result.history
    k = min(10, len(h["reward"]))
    extra = {"recipe": "minimind_ref.grpo:build_stage", "command": "python -m minimind_ref.stages rebuild grpo",
             "train_config": cfg.to_dict(), "grpo_settings": dict(s), "seed": seed,
             "metrics": {"first_reward_mean10": sum(h["reward"][:k]) / k, "final_reward_mean10": sum(h["reward"][-k:]) / k,
                         "final_kl_mean10": sum(h["kl"][-k:]) / k,
                         "heldout_accuracy_before": before["accuracy"], "heldout_accuracy_after": after["accuracy"],
                         "heldout_stop_rate_after": after["stop_rate"], "heldout_length_after": after["length"],
                         "heldout_sampled_accuracy_before": before["sampled_accuracy"],
                         "heldout_sampled_accuracy_after": after["sampled_accuracy"]},
             # the run's curves (a few kB), plotted by chapter 12
             "history": {key: [round(float(v), 5) for v in h[key]] for key in
                         ("step", "reward", "kl", "completion_length", "zero_std_groups", "grpo_loss", "ratio_mean",
                          "clip_fraction")}}
    return result.model, extra, tokenizer
