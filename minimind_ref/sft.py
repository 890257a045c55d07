"""Supervised fine-tuning (chapter 09): MiniMind's chat template, the assistant-only loss, and
chatting with the model.

``render_chat`` renders a conversation exactly as upstream's ``model/tokenizer_config.json`` chat
template does (jingyaogong/minimind at c090b69), without the tool-call branches::

    <|im_start|>system\\n{system prompt, default "You are a helpful assistant"}<|im_end|>\\n
    <|im_start|>user\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n{content}<|im_end|>\\n
    ...
    <|im_start|>assistant\\n                      (add_generation_prompt=True)

``encode_chat`` turns a conversation into token ids: the markers become the special ids and the
message text is encoded as plain text, so a user who types ``<|im_end|>`` gets those characters,
never the end-of-turn token (for ordinary text the ids equal ``tokenizer.encode(render_chat(...))``,
which is what upstream's ``SFTDataset`` does). ``assistant_loss_mask`` marks the tokens the loss
counts, as upstream's ``generate_labels`` / ``generate_loss_mask`` (``dataset/lm_dataset.py``) do:
every assistant reply, its ``<|im_end|>`` and the newline after it. ``SFTDataset`` gives
``(input_ids, labels)`` batches for ``minimind_ref.train`` (the objective is the ordinary
next-token loss: the labels carry the mask), and ``chat`` talks to a model with the KV cache.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import torch

if TYPE_CHECKING:  # pragma: no cover
    from .train import RunData

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
ROLES = ("system", "user", "assistant")

Message = Dict[str, str]


def _validate(messages: Sequence[Message]) -> None:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts.")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ValueError(f"message {i} must be a dict with 'role' and 'content', got {message!r:.80}.")
        if message["role"] not in ROLES:
            raise ValueError(f"message {i} has role {message['role']!r}; MiniMind's template (without tools) knows "
                             f"{', '.join(ROLES)}.")
        if not isinstance(message["content"], str):
            raise TypeError(f"message {i}: content must be a string, got {type(message['content']).__name__}.")


def render_chat(messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
    """The prompt string upstream's chat template renders for ``messages`` (no tools).

    A first ``system`` message replaces the default system prompt; a ``system`` message later in
    the conversation is rendered like a user turn, as upstream does. ``add_generation_prompt``
    appends ``<|im_start|>assistant\\n`` so the model writes the next assistant turn.
    (Upstream's template silently drops messages of unknown roles and renders non-string content
    as ''; here both are errors.)"""
    _validate(messages)
    parts: List[str] = []
    if messages[0]["role"] == "system":
        parts.append(f"{IM_START}system\n{messages[0]['content']}{IM_END}\n")
    else:
        parts.append(f"{IM_START}system\n{DEFAULT_SYSTEM_PROMPT}{IM_END}\n")
    for i, message in enumerate(messages):
        if i == 0 and message["role"] == "system":
            continue
        parts.append(f"{IM_START}{message['role']}\n{message['content']}{IM_END}\n")
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts)


# ---------------------------------------------------------------------- tokens
def _plain_ids(tokenizer: Any, text: str) -> List[int]:
    """Ids of ``text`` with special-token parsing off (``<|im_end|>`` typed in text stays text)."""
    if not text:
        return []
    previous = getattr(tokenizer, "encode_special_tokens", None)
    if previous is None:
        raise TypeError("encode_chat needs a tokenizers.Tokenizer (from minimind_ref.tokenizer or tokenizer.json).")
    tokenizer.encode_special_tokens = True
    try:
        return list(tokenizer.encode(text).ids)
    finally:
        tokenizer.encode_special_tokens = previous


def _special_id(tokenizer: Any, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ValueError(f"the tokenizer has no special token {token}; MiniMind's tokenizers have "
                         "<|endoftext|>, <|im_start|>, <|im_end|> at ids 0, 1, 2.")
    return token_id


def encode_chat(tokenizer: Any, messages: Sequence[Message], add_generation_prompt: bool = False) -> List[int]:
    """Token ids of ``render_chat(messages, add_generation_prompt)``, built piece by piece: the
    markers ``<|im_start|>`` / ``<|im_end|>`` are the special ids, everything else (roles, the
    message text, newlines) is encoded as plain text. The pieces meet at newlines, where a
    byte-level pre-tokenizer splits anyway, so ordinary conversations get the same ids as
    encoding the rendered string; text that imitates a marker cannot forge one."""
    _validate(messages)
    start, end = _special_id(tokenizer, IM_START), _special_id(tokenizer, IM_END)
    turns: List[Tuple[str, str]] = []
    if messages[0]["role"] == "system":
        turns.append(("system", messages[0]["content"]))
        rest = messages[1:]
    else:
        turns.append(("system", DEFAULT_SYSTEM_PROMPT))
        rest = messages
    turns += [(m["role"], m["content"]) for m in rest]
    ids: List[int] = []
    for role, content in turns:
        ids += [start] + _plain_ids(tokenizer, f"{role}\n") + _plain_ids(tokenizer, content) + [end]
        ids += _plain_ids(tokenizer, "\n")
    if add_generation_prompt:
        ids += [start] + _plain_ids(tokenizer, "assistant\n")
    return ids


def marker_ids(tokenizer: Any) -> Tuple[List[int], List[int]]:
    """``(bos_ids, eos_ids)``: the ids of ``<|im_start|>assistant\\n`` and of ``<|im_end|>\\n``,
    the markers upstream's ``SFTDataset`` searches for (``self.bos_id`` / ``self.eos_id``)."""
    bos = [_special_id(tokenizer, IM_START)] + _plain_ids(tokenizer, "assistant\n")
    eos = [_special_id(tokenizer, IM_END)] + _plain_ids(tokenizer, "\n")
    return bos, eos


def assistant_loss_mask(input_ids: Sequence[int], bos_ids: Sequence[int], eos_ids: Sequence[int], max_length: int) -> List[int]:
    """1 where the loss counts, else 0; ``len(input_ids)`` entries.

    Upstream's rule (``generate_labels`` / ``generate_loss_mask`` at c090b69): find each
    ``bos_ids`` (``<|im_start|>assistant\\n``); counting starts at the first token after it and
    runs to the end of the next ``eos_ids`` (``<|im_end|>\\n``) inclusive, so the reply, its end
    marker and the newline after it count; a reply cut off before its end marker counts to the
    end of the sequence; nothing at or past ``max_length`` counts. System and user turns, the
    ``assistant`` header and padding never count."""
    ids, bos, eos = list(input_ids), list(bos_ids), list(eos_ids)
    if not bos or not eos:
        raise ValueError("bos_ids and eos_ids must not be empty (see marker_ids).")
    mask = [0] * len(ids)
    i = 0
    while i < len(ids):
        if ids[i:i + len(bos)] == bos:
            start = i + len(bos)
            end = start
            while end < len(ids) and ids[end:end + len(eos)] != eos:
                end += 1
            for j in range(start, min(end + len(eos), max_length, len(ids))):
                mask[j] = 1
            i = end + len(eos) if end < len(ids) else len(ids)
        else:
            i += 1
    return mask


def assistant_labels(input_ids: Sequence[int], bos_ids: Sequence[int], eos_ids: Sequence[int], max_length: int) -> List[int]:
    """The SFT labels: the token id where ``assistant_loss_mask`` is 1, else -100 (ignored)."""
    mask = assistant_loss_mask(input_ids, bos_ids, eos_ids, max_length)
    return [t if m else -100 for t, m in zip(input_ids, mask)]


def _check_max_length(max_length: Any) -> None:
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length must be a whole number >= 2 (one input and the token it predicts), "
                         f"got {max_length!r}.")


def has_reply(messages: Sequence[Message]) -> bool:
    """Whether a conversation holds an assistant reply (something SFT can learn; an empty reply
    still teaches its ``<|im_end|>``)."""
    return any(m.get("role") == "assistant" for m in messages if isinstance(m, dict))


# ---------------------------------------------------------------------- truncation
TRUNCATION_KINDS = ("no_answer", "cut_answer")


def truncation_kind(ids: Sequence[int], max_length: int, bos_ids: Sequence[int], eos_ids: Sequence[int]) -> Optional[str]:
    """What cutting ``ids`` (one encoded conversation) to ``max_length`` tokens costs its answers:

    * ``None``: nothing of an assistant reply is lost (it fits, or the cut falls outside the replies);
    * ``"no_answer"``: the conversation has a reply, but none of its tokens is left (the prompt
      alone fills ``max_length``): the example teaches nothing;
    * ``"cut_answer"``: the last reply left runs into the cut without its ``<|im_end|>``: trained
      so, the model learns to go on where it should stop."""
    if len(ids) <= max_length:
        return None
    full = assistant_loss_mask(ids, bos_ids, eos_ids, len(ids))
    cut = list(ids[:max_length])
    if any(full) and not any(full[:max_length]):
        return "no_answer"
    bos, end = list(bos_ids), eos_ids[0]
    starts = [i for i in range(len(cut) - len(bos) + 1) if cut[i:i + len(bos)] == bos]
    if starts:
        reply = cut[starts[-1] + len(bos):]
        if reply and end not in reply:
            return "cut_answer"
    return None


def truncation_note(counts: Dict[str, int], what: str, max_length: Any, dropped: bool) -> str:
    """One sentence about ``counts`` (``{"examples": n, "no_answer": a, "cut_answer": b}``)."""
    parts = []
    if counts.get("no_answer"):
        parts.append(f"{counts['no_answer']} lost their whole answer (the prompt alone fills max_length={max_length})")
    if counts.get("cut_answer"):
        parts.append(f"{counts['cut_answer']} lost the end of an answer with its <|im_end|> at max_length={max_length} "
                     "(trained so, a model learns not to stop)")
    fix = ("they were left out (drop_truncated=True)" if dropped else
           "raise max_length, shorten them, or pass drop_truncated=True to leave them out")
    return f"of {counts.get('examples', 0)} {what}, {' and '.join(parts)}; {fix}."


# ---------------------------------------------------------------------- dataset
class SFTDataset:
    """Conversations (upstream's ``{"conversations": [...]}`` records) as ``(input_ids, labels)``.

    Like upstream's ``SFTDataset``: the conversation is rendered with the chat template, cut to
    ``max_length`` tokens on the right, and labelled with ``assistant_labels``. ``loss_on="all"``
    is the ablation of chapter 09: every real token counts (system and user turns too).
    ``batch(indices)`` pads on the right with ``pad_id`` (labels -100) to the longest row of the
    batch rather than to ``max_length``: the causal mask keeps right padding from changing any
    real position, so the loss is the same and short batches are cheaper.

    Truncation is counted, never silent (upstream's is): ``self.truncation`` holds how many
    conversations lost their whole answer (``no_answer``) or the end of one with its
    ``<|im_end|>`` (``cut_answer``, see ``truncation_kind``), and a warning says so when any did;
    ``drop_truncated=True`` leaves those conversations out. Conversations without an assistant
    reply are listed in ``self.no_reply``, with a warning. A dataset in which no token is
    supervised is a ``ValueError``.
    """

    def __init__(self, records: Sequence[Dict[str, Any]], tokenizer: Any, max_length: int = 256,
                 loss_on: str = "assistant", pad_id: int = 0, drop_truncated: bool = False) -> None:
        if loss_on not in ("assistant", "all"):
            raise ValueError(f"loss_on must be 'assistant' or 'all', got {loss_on!r}.")
        _check_max_length(max_length)
        bos, eos = marker_ids(tokenizer)
        self.max_length, self.loss_on, self.pad_id = max_length, loss_on, pad_id
        self.examples: List[Tuple[List[int], List[int]]] = []
        self.truncation: Dict[str, int] = {"examples": 0, "no_answer": 0, "cut_answer": 0, "dropped": 0,
                                         "max_length": max_length}
        self.truncated: List[int] = []  # indices (in ``records``) of the conversations counted there
        self.no_reply: List[int] = []  # indices of conversations without an assistant reply (nothing to learn)
        for n, record in enumerate(records):
            if not isinstance(record, dict) or "conversations" not in record:
                raise ValueError(f"record {n} has no 'conversations' key (upstream's SFT format): {record!r:.100}")
            full = encode_chat(tokenizer, record["conversations"])
            if loss_on == "assistant" and not has_reply(record["conversations"]):
                self.no_reply.append(n)
            self.truncation["examples"] += 1
            kind = truncation_kind(full, max_length, bos, eos)
            if kind is not None:
                self.truncation[kind] += 1
                self.truncated.append(n)
                if drop_truncated:
                    self.truncation["dropped"] += 1
                    continue
            ids = full[:max_length]
            labels = assistant_labels(ids, bos, eos, max_length) if loss_on == "assistant" else list(ids)
            self.examples.append((ids, labels))
        if self.truncated:
            warnings.warn("SFTDataset: " + truncation_note(self.truncation, "conversations", max_length, drop_truncated),
                          stacklevel=2)
        if self.no_reply and len(self.no_reply) < self.truncation["examples"]:
            warnings.warn(f"SFTDataset: {len(self.no_reply)} of {self.truncation['examples']} conversations have no "
                          f"assistant reply (first: record {self.no_reply[0]}), so no token of theirs is supervised; "
                          "SFT records end with the assistant's turn.", stacklevel=2)
        if self.truncation["examples"] and not any(l != -100 for _, labels in self.examples for l in labels):
            raise ValueError(
                f"no token of the {self.truncation['examples']} conversation(s) is supervised"
                + (f" ({len(self.examples)} left after drop_truncated)" if drop_truncated else "")
                + ": every assistant reply is missing or was cut away at max_length="
                f"{max_length}, so training would change nothing. Give conversations that end with an assistant turn, "
                "or raise max_length."
            )

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        ids, labels = self.examples[i]
        return torch.tensor(ids), torch.tensor(labels)

    def batch(self, indices: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        rows = [self.examples[int(i)] for i in indices]
        width = max(len(ids) for ids, _ in rows)
        x = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        y = torch.full((len(rows), width), -100, dtype=torch.long)
        for r, (ids, labels) in enumerate(rows):
            x[r, : len(ids)] = torch.tensor(ids)
            y[r, : len(labels)] = torch.tensor(labels)
        return x, y

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for ids, labels in self.examples:
            h.update(str((ids, labels)).encode())
        return h.hexdigest()[:16]

    def supervised_fraction(self) -> float:
        """Share of the real tokens whose loss counts."""
        total = sum(len(ids) for ids, _ in self.examples)
        return sum(sum(l != -100 for l in labels) for _, labels in self.examples) / max(1, total)


# ---------------------------------------------------------------------- chatting
@torch.no_grad()
def generate_replies(model: torch.nn.Module, tokenizer: Any, conversations: Sequence[Sequence[Message]],
                     max_new_tokens: int = 48, do_sample: bool = False, temperature: float = 1.0, top_k: int = 0,
                     top_p: float = 1.0, generator: Optional[torch.Generator] = None,
                     batch_size: int = 128) -> List[Dict[str, Any]]:
    """The model's next assistant turn for every conversation, with the KV cache.

    Returns, per conversation, ``{"text", "ids", "stopped"}``: the decoded reply, its token ids
    up to (not including) ``<|im_end|>``, and whether the model emitted ``<|im_end|>`` within
    ``max_new_tokens``. Prompts of equal length are batched together (no padding needed)."""
    from .generation import generate

    device = next(model.parameters()).device
    end = _special_id(tokenizer, IM_END)
    prompts = [encode_chat(tokenizer, conv, add_generation_prompt=True) for conv in conversations]
    by_len: Dict[int, List[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    results: List[Dict[str, Any]] = [{} for _ in prompts]
    for length in sorted(by_len):
        idx = by_len[length]
        for start in range(0, len(idx), batch_size):
            chunk = idx[start : start + batch_size]
            x = torch.tensor([prompts[i] for i in chunk], device=device)
            out = generate(model, x, max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature,
                           top_k=top_k, top_p=top_p, eos_token_id=end, pad_token_id=end, generator=generator)
            for row, i in zip(out[:, length:].tolist(), chunk):
                stopped = end in row
                reply = row[: row.index(end)] if stopped else row
                results[i] = {"text": tokenizer.decode(reply), "ids": reply, "stopped": stopped}
    return results


def chat(model: torch.nn.Module, tokenizer: Any, messages: Sequence[Message], max_new_tokens: int = 64,
         do_sample: bool = False, temperature: float = 0.85, top_p: float = 0.85, seed: Optional[int] = None) -> str:
    """The model's reply to ``messages`` (rendered with the chat template and the generation
    prompt, decoded up to ``<|im_end|>``). Greedy by default; ``do_sample=True`` samples with
    upstream's ``eval_llm.py`` defaults (temperature 0.85, top-p 0.85)."""
    generator = None
    if do_sample:
        generator = torch.Generator(device=next(model.parameters()).device).manual_seed(0 if seed is None else seed)
    return generate_replies(model, tokenizer, [messages], max_new_tokens, do_sample, temperature, 0, top_p,
                            generator)[0]["text"]


# ---------------------------------------------------------------------- the SFT stage
SFT_CONFIG = "ch09_sft"  # minimind_ref/configs/ch09_sft.json: the chapter's run and the shipped `sft` stage


def sft_data(tokenizer: Any, n_train: int = 4000, n_val: int = 200, seed: int = 0, max_length: int = 256,
             loss_on: str = "assistant") -> "RunData":
    """Generated conversations (``chat_data.sft_conversations``) as a ``train.RunData``: the
    training split and a held-out validation split, both ``SFTDataset``."""
    from . import chat_data
    from .train import RunData

    train_set = SFTDataset(chat_data.sft_conversations(n_train, seed=seed, split="train"), tokenizer, max_length, loss_on)
    val_set = SFTDataset(chat_data.sft_conversations(n_val, seed=seed, split="test"), tokenizer, max_length, loss_on)
    return RunData(tokenizer, train_set, val_set, [])


def train_sft(model: torch.nn.Module, tokenizer: Any, cfg: Any = None, loss_on: str = "assistant",
              n_train: int = 4000, seed: int = 0, **train_kwargs: Any) -> Any:
    """Supervised fine-tuning with ``minimind_ref.train``'s loop: the objective is the ordinary
    next-token loss (``lm_objective``); the labels of ``SFTDataset`` make it count only the
    assistant's tokens (or every token, ``loss_on="all"``). ``model`` is trained in place.
    Returns the ``TrainResult``."""
    from .train import TrainConfig, train

    cfg = cfg if cfg is not None else TrainConfig.from_json(SFT_CONFIG)
    data = sft_data(tokenizer, n_train=n_train, seed=seed, max_length=cfg.seq_len, loss_on=loss_on)
    return train(cfg, model=model, data=data, **train_kwargs)


def build_stage(parent: torch.nn.Module, tokenizer: Any) -> Tuple[torch.nn.Module, Dict[str, Any], Any]:
    """The shipped ``sft`` stage: ``train_sft`` on the ``base`` stage with ``SFT_CONFIG``
    (``python -m minimind_ref.stages rebuild sft``)."""
    from .train import TrainConfig

    cfg = TrainConfig.from_json(SFT_CONFIG).replace(progress=False, out_dir=None)
    result = train_sft(parent, tokenizer, cfg, log=lambda line: None)
    extra = {"recipe": "minimind_ref.sft:build_stage", "command": "python -m minimind_ref.stages rebuild sft",
             "train_config": cfg.to_dict(), "metrics": {"final_train_loss_mean20": sum(result.history["loss"][-20:]) / 20,
                                                        "final_val_loss": result.history["eval_loss"][-1]},
             "loss_history": [round(v, 4) for v in result.history["loss"]]}
    return result.model, extra, tokenizer
