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
  higher log-probability than the reference's own reply (``win_rate_n`` such prompts). The
  prompts and the rejected replies are the reference's: the same model has another win rate
  against another lineage's SFT model.

Deterministic up to ties. Greedy decoding and the log-probability comparisons are exact functions
of the weights, but two CPUs (or ``ATEN_CPU_CAPABILITY=default``) round differently, by about
1e-4 nats. A greedy reply that a step decided by less than ``GREEDY_TIE_MARGIN`` could score the
other way on another machine (``greedy_near_ties``: a right reply with any near tie, a wrong one
whose right token came that close where it went wrong, a stop decided that closely), and so could
a win-rate pair whose two sums are within ``WIN_TIE_MARGIN``: ``<kind>_near_ties``,
``stop_near_ties`` and ``win_near_ties`` count them, and ``stage_report.metric_interval`` widens a
proportion's 95 % Wilson interval (``wilson_interval``, from its count: the finite set of held-out
prompts) by them. Claims over seeds and float paths compare these intervals.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from . import chat_data
from .sft import assistant_loss_mask, encode_chat, generate_replies, marker_ids, merged_newline_ids

EVAL_MAX_NEW_TOKENS = 128  # the identity reply is 97 tokens and the refusal 69 with the course tokenizer
# Float rounding between CPUs moves a summed log-probability and the gap between two logits far less than
# these margins (benchmarks/results/float_paths.json, made by `python -m benchmarks.float_paths`: native vs
# ATEN_CPU_CAPABILITY=default on the shipped stages); decisions closer than them are counted as near ties.
GREEDY_TIE_MARGIN = 0.01  # logits: a greedy step whose top two logits are closer could pick the other token
WIN_TIE_MARGIN = 0.01  # nats: a win-rate pair whose two summed log-probabilities are closer could flip
Z_95 = 1.959963984540054  # the normal quantile of a two-sided 95 % interval



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


@torch.no_grad()
def greedy_near_ties(model: torch.nn.Module, tokenizer: Any, conversations: Sequence[Sequence[Dict[str, str]]],
                     replies: Sequence[Dict[str, Any]], answers: Sequence[str], margin: float = GREEDY_TIE_MARGIN,
                     batch_size: int = 64) -> Tuple[List[bool], List[bool]]:
    """Which greedy replies (``generate_replies``) another float path could score differently, to
    first order: ``(score, stop)``, one bool per conversation.

    * ``score``: for a reply that is right (``score_reply`` against ``answers``), some step's top two
      logits lie within ``margin`` (any other token makes it wrong); for a wrong one, at the first
      token where it leaves the right answer, the right token's logit lies within ``margin`` of the
      chosen one (the only tie that could make it right).
    * ``stop``: for a reply that stopped, ``<|im_end|>`` won its step by less than ``margin``; for
      one that did not, ``<|im_end|>`` came within ``margin`` of the chosen token at some step.

    The replies are re-read in one forward pass (teacher forcing), the same logits up to float
    rounding. Ties that would only change a reply after another tie are not counted."""
    from .chat_template import IM_END, _plain_ids, _special_id

    device = next(model.parameters()).device
    eos = _special_id(tokenizer, IM_END)
    rows, starts = [], []
    for conv, reply in zip(conversations, replies):
        prompt = encode_chat(tokenizer, conv, add_generation_prompt=True)
        rows.append(prompt + list(reply["ids"]) + ([eos] if reply["stopped"] else []))
        starts.append(len(prompt))
    score, stop = [], []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            width = max(len(r) for r in chunk)
            x = torch.zeros(len(chunk), width, dtype=torch.long)
            for i, ids in enumerate(chunk):
                x[i, : len(ids)] = torch.tensor(ids)
            logits = model(x.to(device)).logits.float().cpu()
            for i, ids in enumerate(chunk):
                n = start + i
                first = starts[n] - 1  # the position that predicted the reply's first token
                chosen = ids[starts[n]:]
                steps = logits[i, first : first + len(chosen)]  # [generated tokens, vocab]
                if not chosen:
                    score.append(False)
                    stop.append(False)
                    continue
                top2 = steps.topk(2, dim=-1).values
                gaps = top2[:, 0] - top2[:, 1]
                picked = steps.gather(-1, torch.tensor(chosen)[:, None]).squeeze(-1)
                if score_reply_text(replies[n]["text"], answers[n]):
                    score.append(bool((gaps < margin).any()))
                else:
                    target = _plain_ids(tokenizer, answers[n].strip()) + [eos]
                    j = next((t for t, (c, a) in enumerate(zip(chosen, target)) if c != a), None)
                    score.append(j is not None and bool(picked[j] - steps[j, target[j]] < margin))
                if replies[n]["stopped"]:
                    stop.append(bool(gaps[-1] < margin))
                else:
                    stop.append(bool((picked - steps[:, eos] < margin).any()))
    finally:
        model.train(was_training)
    return score, stop


def wilson_interval(successes: float, n: float, z: float = Z_95) -> Tuple[float, float]:
    """The Wilson score interval of a proportion ``successes / n`` (95 % with the default ``z``):
    where the share would lie on another draw of ``n`` prompts of the same kind. ``(0, 1)`` for
    ``n == 0``.

    ``n``: a whole number >= 0 (a count of prompts); ``successes``: a finite number in ``[0, n]``;
    ``z``: a finite number > 0. Anything else (NaN, inf, a bool, a string, ``z <= 0``, which would
    put the lower end above the upper) is a ``ValueError``/``TypeError`` naming the argument."""
    for name, value in (("successes", successes), ("n", n), ("z", z)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"wilson_interval: {name} must be a number, got {value!r} ({type(value).__name__}).")
        if not math.isfinite(value):
            raise ValueError(f"wilson_interval: {name} must be finite, got {value!r}.")
    if n < 0 or n != int(n):
        raise ValueError(f"wilson_interval: n must be a whole number >= 0 (a count of prompts), got {n!r}.")
    if not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: need 0 <= successes <= n, got successes={successes!r}, n={n!r}.")
    if z <= 0:
        raise ValueError(f"wilson_interval: z must be > 0 (1.96 for 95 %), got {z!r}.")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def score_reply_text(reply: str, answer: str) -> bool:
    """Whether ``reply`` is the whole ``answer`` (exact, after stripping whitespace)."""
    return reply.strip() == answer.strip()


def score_reply(exchange: chat_data.Exchange, reply: str) -> bool:
    """Whether a reply is the whole right answer (exact, after stripping whitespace)."""
    return score_reply_text(reply, exchange.answer)


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
    Deterministic for a given model and machine; on another float path up to the near ties it
    counts (``<kind>_near_ties``, ``stop_near_ties``, ``win_near_ties``: see the module docstring).
    The counts (``<kind>_n``, ``stop_n``, ``win_rate_n``) give each share its interval
    (``stage_report.metric_interval``)."""
    if reference is not None and not (isinstance(reference, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in reference.items())):
        raise TypeError(f"reference must map each held-out prompt to the reference model's reply (a dict of str to "
                        f"str, as reference_replies returns), got {type(reference).__name__}.")
    prompts = heldout_prompts(n_per_kind)
    conversations = [[{"role": "user", "content": ex.user}] for ex in prompts]
    replies = generate_replies(model, tokenizer, conversations, max_new_tokens=max_new_tokens)
    near, near_stop = greedy_near_ties(model, tokenizer, conversations, replies, [ex.answer for ex in prompts])
    metrics: Dict[str, float] = {}
    chat = [(ex, r, t) for ex, r, t in zip(prompts, replies, near_stop) if ex.kind != "double"]
    for kind in chat_data.KINDS + ("double",):
        scored = [(score_reply(ex, r["text"]), len(r["ids"]), t) for ex, r, t in zip(prompts, replies, near)
                  if ex.kind == kind]
        metrics[f"{kind}_accuracy"] = sum(ok for ok, _, _ in scored) / len(scored)
        metrics[f"{kind}_n"] = float(len(scored))
        metrics[f"{kind}_length"] = sum(n for _, n, _ in scored) / len(scored)
        metrics[f"{kind}_near_ties"] = float(sum(t for _, _, t in scored))
    metrics["stop_rate"] = sum(r["stopped"] for _, r, _ in chat) / len(chat)
    metrics["stop_n"] = float(len(chat))
    metrics["stop_near_ties"] = float(sum(t for _, _, t in chat))
    metrics["mean_length"] = sum(len(r["ids"]) for _, r, _ in chat) / len(chat)
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
            metrics["win_near_ties"] = float(((c - r).abs() < WIN_TIE_MARGIN).sum())
    return metrics

