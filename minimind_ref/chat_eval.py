"""The held-out chat evaluation: what the stage report measures on every stage's model. This
module owns the measurement (``evaluate_chat``), its prompts (``heldout_prompts``, all held out),
the scoring of a reply (``score_reply``), the log-probabilities of assistant replies
(``reply_logprobs``, ``mean_logprobs``) and the reference model's replies the win rate is
measured against (``reference_replies``, ``own_reply_pairs``). Which models are measured, and
the report, are ``stages``' and ``stage_report``'s; ``stages`` re-exports every name here.

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
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from . import chat_data
from .sft import assistant_loss_mask, encode_chat, generate_replies, marker_ids, merged_newline_ids

EVAL_MAX_NEW_TOKENS = 128  # the identity reply is 97 tokens and the refusal 69 with the course tokenizer


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
            sums.append(torch.where(mask.bool(), logp, torch.zeros_like(logp)).sum(1).cpu())  # select: -inf stays out
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
    if reference is not None and not (isinstance(reference, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in reference.items())):
        raise TypeError(f"reference must map each held-out prompt to the reference model's reply (a dict of str to "
                        f"str, as reference_replies returns), got {type(reference).__name__}.")
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
