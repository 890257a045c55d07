"""Supervised fine-tuning (chapter 09): MiniMind's chat template, the assistant-only loss, and
chatting with the model.

Two templates, both as upstream's ``model/tokenizer_config.json`` writes them (jingyaogong/minimind):

* ``"minimind-3"`` (d65ef2c, upstream's main; the course's default): no default system prompt, and
  every assistant turn opens with a thinking block, empty when the message has no reasoning::

      <|im_start|>system\\n{system prompt, only if the conversation has one}<|im_end|>\\n
      <|im_start|>user\\n{content}<|im_end|>\\n
      <|im_start|>assistant\\n<think>\\n{reasoning}\\n</think>\\n\\n{content}<|im_end|>\\n
      <|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n          (add_generation_prompt=True)
      <|im_start|>assistant\\n<think>\\n                          (... and open_thinking=True)

* ``"minimind2"`` (c090b69): the default system prompt ``You are a helpful assistant`` when the
  conversation has none, and no thinking blocks.

Both render ``tools`` (a system block listing the functions), assistant ``tool_calls``
(``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``) and ``tool`` turns
(``<tool_response>`` blocks in a user turn) as the templates do.

Upstream's ``dataset/lm_dataset.py`` (d65ef2c) prepares each SFT conversation with
``pre_processing_chat`` (a random system prompt on 20 % of the conversations that have none) and
``post_processing_chat`` (the empty thinking blocks removed from 80 % of the rendered
conversations); both are here, seeded. ``encode_chat`` turns a conversation into ids: the markers
become the special ids and every other piece is encoded as plain text, so a user who types
``<|im_end|>`` gets those characters, never the end-of-turn token.

``assistant_loss_mask`` marks the tokens the loss counts: after each ``<|im_start|>assistant\\n``
up to and including the next ``<|im_end|>\\n``, as d65ef2c's ``generate_labels`` does. When a
conversation is encoded as one string (upstream's way) and a reply begins with whitespace, the
byte-level BPE of both upstream tokenizers merges the header's newline into the reply's first token
(``"\\n   "``); then d65ef2c's marker no longer matches and its rule drops the whole reply, and
c090b69's rule (markers without the newline, counting from ``start + 1``) drops that first token.
The course's mask counts from the merged token, so every reply is supervised whole; the two
upstream rules are here too, exactly (``upstream_loss_mask`` / ``generate_labels`` with
``commit``), and ``upstream_sft_tokens`` holds the ids of both commits' real tokenizers that
chapter 09 measures them on. ``SFTDataset`` gives ``(input_ids, labels)`` batches for
``minimind_ref.train``, and ``chat`` talks to a model with the KV cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import warnings
from typing import TYPE_CHECKING, Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

import torch

from .truncation import truncation_note

if TYPE_CHECKING:  # pragma: no cover
    from .train import RunData

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant"  # minimind2 (c090b69) only
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
THINK_START, THINK_END = "<think>", "</think>"
EMPTY_THINK = "<think>\n\n</think>\n\n"  # what post_processing_chat removes
ROLES = ("system", "user", "assistant", "tool")
TEMPLATES = ("minimind-3", "minimind2")
CHAT_TEMPLATE = "minimind-3"  # the template every stage of the course is trained and prompted with
# The system prompts pre_processing_chat draws from: the course's own (upstream's pool names minimind
# in Chinese and English; these name the course's assistant).
SYSTEM_PROMPTS = ("You are MiniMind, a helpful assistant.", "You are a helpful assistant. Answer briefly.",
                  "You are MiniMind, a tiny language model. Be precise.", "Answer the user's question.")

Message = Dict[str, Any]
Segment = Tuple[bool, str]  # (is a special marker, text)

_TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
                 "with function signatures within <tools></tools> XML tags:\n<tools>")
_TOOLS_FOOTER = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                 "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                 "<args-json-object>}\n</tool_call>")


def _tojson(value: Any) -> str:
    """The chat templates' ``tojson`` filter as transformers defines it."""
    return json.dumps(value, ensure_ascii=False)


def _template(template: Optional[str]) -> str:
    template = CHAT_TEMPLATE if template is None else template
    if template not in TEMPLATES:
        raise ValueError(f"template must be one of {TEMPLATES} (upstream's d65ef2c and c090b69 templates), got {template!r}.")
    return template


def _validate(messages: Sequence[Message]) -> None:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts.")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
            raise ValueError(f"message {i} must be a dict with 'role' and 'content', got {message!r:.80}.")
        if message["role"] not in ROLES:
            raise ValueError(f"message {i} has role {message['role']!r}; MiniMind's template knows {', '.join(ROLES)}.")
        content = message["content"]
        if not isinstance(content, str) and not (content is None and message.get("tool_calls")):
            raise TypeError(f"message {i}: content must be a string (None only beside tool_calls), got "
                            f"{type(content).__name__}.")
        calls = message.get("tool_calls")
        if calls is not None and (message["role"] != "assistant" or not isinstance(calls, (list, tuple))):
            raise ValueError(f"message {i}: tool_calls must be a list of {{'name', 'arguments'}} dicts on an assistant "
                             "message.")
        reasoning = message.get("reasoning_content")
        if reasoning is not None and not isinstance(reasoning, str):
            raise TypeError(f"message {i}: reasoning_content must be a string, got {type(reasoning).__name__}.")


def _assistant_body(message: Message, template: str, drop_empty_think: bool) -> str:
    """Everything of an assistant turn between ``assistant\\n`` and ``<|im_end|>``."""
    content = message["content"] if isinstance(message["content"], str) else ""
    text = content
    if template == "minimind-3":
        reasoning = message.get("reasoning_content")
        if not isinstance(reasoning, str):
            reasoning = ""
            if THINK_END in content:
                reasoning = content.split(THINK_END)[0].rstrip("\n").split(THINK_START)[-1].lstrip("\n")
                content = content.split(THINK_END)[-1].lstrip("\n")
        think = f"{THINK_START}\n{reasoning.strip(chr(10))}\n{THINK_END}\n\n"
        text = ("" if drop_empty_think and think == EMPTY_THINK else think) + content.lstrip("\n")
    for n, call in enumerate(message.get("tool_calls") or []):
        if (n == 0 and content) or n > 0:
            text += "\n"
        if isinstance(call, Mapping) and call.get("function"):
            call = call["function"]
        if not isinstance(call, Mapping) or "name" not in call:
            raise ValueError(f"a tool call must be a dict with 'name' and 'arguments' (or {{'function': ...}}), got {call!r:.80}.")
        arguments = call.get("arguments", {})
        text += ('<tool_call>\n{"name": "' + str(call["name"]) + '", "arguments": '
                 + (arguments if isinstance(arguments, str) else _tojson(arguments)) + "}\n</tool_call>")
    return text


def chat_segments(messages: Sequence[Message], add_generation_prompt: bool = False, tools: Optional[Sequence[Any]] = None,
                  template: Optional[str] = None, open_thinking: bool = False,
                  drop_empty_think: bool = False) -> List[Segment]:
    """The rendered conversation as ``(is_marker, text)`` pieces: ``<|im_start|>`` and ``<|im_end|>``
    are markers; a turn's header (``"user\\n"``) and its body are separate pieces, so encoding the
    pieces one by one never merges the header's newline into the body."""
    _validate(messages)
    template = _template(template)
    out: List[Segment] = []

    def turn(header: str, body: str, close: bool = True) -> None:
        out.append((True, IM_START))
        out.append((False, header))
        if body:
            out.append((False, body))
        if close:
            out.extend([(True, IM_END), (False, "\n")])

    first_is_system = messages[0]["role"] == "system"
    if tools:
        head = (messages[0]["content"] + "\n\n" if first_is_system else "") + _TOOLS_HEADER
        head += "".join("\n" + _tojson(tool) for tool in tools) + _TOOLS_FOOTER
        turn("system\n", head)
    elif first_is_system:
        turn("system\n", messages[0]["content"])
    elif template == "minimind2":
        turn("system\n", DEFAULT_SYSTEM_PROMPT)
    for i, message in enumerate(messages):
        role = message["role"]
        content = message["content"] if isinstance(message["content"], str) else ""
        if role == "user" or (role == "system" and i > 0):
            turn(f"{role}\n", content)
        elif role == "assistant":
            turn("assistant\n", _assistant_body(message, template, drop_empty_think))
        elif role == "tool":
            if i == 0 or messages[i - 1]["role"] != "tool":
                out += [(True, IM_START), (False, "user")]
            out.append((False, f"\n<tool_response>\n{content}\n</tool_response>"))
            if i == len(messages) - 1 or messages[i + 1]["role"] != "tool":
                out += [(True, IM_END), (False, "\n")]
    if add_generation_prompt:
        out += [(True, IM_START), (False, "assistant\n")]
        if template == "minimind-3":
            out.append((False, f"{THINK_START}\n" if open_thinking else EMPTY_THINK))
    return out


def render_chat(messages: Sequence[Message], add_generation_prompt: bool = False, tools: Optional[Sequence[Any]] = None,
                template: Optional[str] = None, open_thinking: bool = False, drop_empty_think: bool = False) -> str:
    """The prompt string upstream's chat template renders for ``messages``.

    ``template``: ``"minimind-3"`` (d65ef2c; default, ``CHAT_TEMPLATE``) or ``"minimind2"``
    (c090b69). ``tools``: function schemas (dicts) listed in a system block. Messages may carry
    ``tool_calls`` (assistant) and ``reasoning_content`` (assistant, minimind-3: the thinking
    block; a ``<think>...</think>`` prefix of the content is taken as reasoning too). A ``system``
    message later in the conversation is rendered like a user turn, as upstream does.
    ``add_generation_prompt`` appends ``<|im_start|>assistant\\n`` (minimind-3: and the empty
    thinking block, or ``<think>\\n`` with ``open_thinking``, upstream's switch).
    ``drop_empty_think`` renders without the empty thinking blocks, what ``post_processing_chat``
    does to 80 % of upstream's SFT conversations. (Upstream's template renders unknown roles as
    nothing and non-string content as ''; here both are errors.)"""
    return "".join(text for _, text in chat_segments(messages, add_generation_prompt, tools, template, open_thinking,
                                                     drop_empty_think))


def pre_processing_chat(conversations: Sequence[Message], rng: random.Random, add_system_ratio: float = 0.2,
                        system_prompts: Sequence[str] = SYSTEM_PROMPTS) -> List[Message]:
    """Upstream's ``pre_processing_chat`` (d65ef2c), seeded: a conversation without a system
    message gets one drawn from ``system_prompts`` with probability ``add_system_ratio``; tool-use
    conversations (a message with ``tools``) are kept as they are."""
    conversations = list(conversations)
    if any(m.get("tools") for m in conversations):
        return conversations
    if conversations and conversations[0].get("role") != "system" and rng.random() < add_system_ratio:
        return [{"role": "system", "content": rng.choice(list(system_prompts))}] + conversations
    return conversations


def post_processing_chat(prompt_content: str, rng: random.Random, empty_think_ratio: float = 0.2) -> str:
    """Upstream's ``post_processing_chat`` (d65ef2c), seeded: with probability ``1 -
    empty_think_ratio`` every empty thinking block ``<think>\\n\\n</think>\\n\\n`` is removed from
    the rendered conversation (upstream: ``random.random() > empty_think_ratio``)."""
    if EMPTY_THINK in prompt_content and rng.random() > empty_think_ratio:
        prompt_content = prompt_content.replace(EMPTY_THINK, "")
    return prompt_content


# ---------------------------------------------------------------------- tokens
def backend_tokenizer(tokenizer: Any) -> Any:
    """The ``tokenizers.Tokenizer`` behind ``tokenizer``: itself, the one inside
    ``pretrained.UpstreamTokenizer`` (``.tokenizer``), or a transformers fast tokenizer's
    ``backend_tokenizer``."""
    if hasattr(tokenizer, "encode_special_tokens") and hasattr(tokenizer, "token_to_id"):
        return tokenizer
    for attr in ("tokenizer", "backend_tokenizer"):
        inner = getattr(tokenizer, attr, None)
        if inner is not None and hasattr(inner, "encode_special_tokens") and hasattr(inner, "token_to_id"):
            return inner
    raise TypeError(f"expected a tokenizers.Tokenizer (minimind_ref.tokenizer, tokenizer.json), a "
                    f"pretrained.UpstreamTokenizer or a transformers fast tokenizer; got {type(tokenizer).__name__}.")


def _plain_ids(tokenizer: Any, text: str) -> List[int]:
    """Ids of ``text`` with special-token parsing off (``<|im_end|>`` typed in text stays text)."""
    if not text:
        return []
    backend = backend_tokenizer(tokenizer)
    previous = backend.encode_special_tokens
    backend.encode_special_tokens = True
    try:
        return list(backend.encode(text, add_special_tokens=False).ids)
    finally:
        backend.encode_special_tokens = previous


def _special_id(tokenizer: Any, token: str) -> int:
    token_id = backend_tokenizer(tokenizer).token_to_id(token)
    if token_id is None:
        raise ValueError(f"the tokenizer has no special token {token}; MiniMind's tokenizers have "
                         "<|endoftext|>, <|im_start|>, <|im_end|> at ids 0, 1, 2.")
    return token_id


def encode_chat(tokenizer: Any, messages: Sequence[Message], add_generation_prompt: bool = False,
                tools: Optional[Sequence[Any]] = None, template: Optional[str] = None, open_thinking: bool = False,
                drop_empty_think: bool = False) -> List[int]:
    """Token ids of ``render_chat(messages, ...)``, built piece by piece (``chat_segments``): the
    markers ``<|im_start|>`` / ``<|im_end|>`` are the special ids, every other piece (a turn's
    header, its body, the newline after ``<|im_end|>``) is encoded as plain text. The pieces meet
    where a byte-level pre-tokenizer splits anyway (at the markers and after a header's newline),
    so an ordinary conversation gets the ids of encoding the rendered string; text that imitates
    a marker cannot forge one, and a reply that begins with whitespace never swallows its header's
    newline."""
    start, end = _special_id(tokenizer, IM_START), _special_id(tokenizer, IM_END)
    ids: List[int] = []
    for is_marker, text in chat_segments(messages, add_generation_prompt, tools, template, open_thinking,
                                         drop_empty_think):
        ids += ([start] if text == IM_START else [end]) if is_marker else _plain_ids(tokenizer, text)
    return ids


def encode_rendered(tokenizer: Any, text: str) -> List[int]:
    """Upstream's encoding: the whole rendered string at once, special tokens parsed
    (``tokenizer(prompt).input_ids``). Merges across a header's newline can happen here."""
    return list(backend_tokenizer(tokenizer).encode(text, add_special_tokens=False).ids)


def marker_ids(tokenizer: Any, newline: bool = True) -> Tuple[List[int], List[int]]:
    """``(bos_ids, eos_ids)``: the ids of ``<|im_start|>assistant\\n`` and of ``<|im_end|>\\n``,
    the markers d65ef2c's ``SFTDataset`` searches for (``self.bos_id`` / ``self.eos_id``,
    ``d65ef2c:dataset/lm_dataset.py:65-66``) and the course's mask takes. ``newline=False``:
    c090b69's markers, ``<|im_start|>assistant`` and ``<|im_end|>``
    (``c090b69:dataset/lm_dataset.py:38-39``). Any tokenizer ``backend_tokenizer`` accepts
    (``pretrained.load_tokenizer_dir``'s too)."""
    suffix = "\n" if newline else ""
    bos = [_special_id(tokenizer, IM_START)] + _plain_ids(tokenizer, "assistant" + suffix)
    eos = [_special_id(tokenizer, IM_END)] + _plain_ids(tokenizer, suffix)
    return bos, eos


@functools.lru_cache(maxsize=16)
def _merged_newline_ids(backend_id: int, vocab: Tuple[Tuple[str, int], ...], newline: Tuple[int, ...]) -> FrozenSet[int]:
    from tokenizers.decoders import ByteLevel

    decoder = ByteLevel()
    out = set()
    for token, token_id in vocab:
        text = decoder.decode([token])
        if text.startswith("\n") and len(text) > 1 and (token_id,) != newline:
            out.add(token_id)
    return frozenset(out)


def merged_newline_ids(tokenizer: Any) -> FrozenSet[int]:
    """Ids of the tokens whose text is a newline followed by more (``"\\n "``, ``"\\n\\t"``, ...):
    the tokens that can swallow the newline of ``<|im_start|>assistant\\n`` when a reply begins
    with whitespace and the conversation is encoded as one string. Byte-level vocabularies only
    (the course's and upstream's); empty when the vocabulary has no such merge (the course's)."""
    backend = backend_tokenizer(tokenizer)
    vocab = tuple(sorted(backend.get_vocab(with_added_tokens=False).items()))
    return _merged_newline_ids(id(backend), vocab, tuple(_plain_ids(tokenizer, "\n")))


def _find(ids: Sequence[int], pattern: Sequence[int], start: int) -> int:
    """Index of the first occurrence of ``pattern`` in ``ids`` at or after ``start``, else ``len(ids)``."""
    end = start
    while end < len(ids) and list(ids[end:end + len(pattern)]) != list(pattern):
        end += 1
    return end


def _markers(bos_ids: Sequence[int], eos_ids: Sequence[int], need_header: bool) -> Tuple[List[int], List[int]]:
    bos, eos = list(bos_ids), list(eos_ids)
    if not bos or not eos:
        raise ValueError("bos_ids and eos_ids must not be empty (see marker_ids).")
    if need_header and len(bos) < 2:
        raise ValueError(f"bos_ids must be the ids of <|im_start|>assistant\\n: the header's tokens, then the newline "
                         f"(marker_ids(tokenizer)); got {bos}, too short to hold both.")
    return bos, eos


def assistant_loss_mask(input_ids: Sequence[int], bos_ids: Sequence[int], eos_ids: Sequence[int], max_length: int,
                        merged_starts: Optional[Sequence[int]] = None) -> List[int]:
    """The course's loss mask: 1 where the loss counts, else 0; ``len(input_ids)`` entries.

    ``bos_ids`` is ``<|im_start|>assistant\\n`` as ``marker_ids(tokenizer)`` gives it: the header
    ``<|im_start|>assistant`` (``bos_ids[:-1]``), then the newline (``bos_ids[-1]``); ``eos_ids``
    is ``<|im_end|>\\n``. At every header: when the newline follows, counting starts right after
    it (d65ef2c's rule, ``upstream_loss_mask(..., commit="d65ef2c")``); when another token follows,
    that token swallowed the newline (a reply that begins with whitespace, encoded as one string:
    the template always writes the newline, and a byte-level BPE merges it only forward), and
    counting starts at that token, which carries the reply's first characters. Counting runs to the
    end of the next ``eos_ids`` inclusive (the reply, ``<|im_end|>`` and the newline after it); a
    reply cut off before its end marker counts to the end of the sequence; nothing at or past
    ``max_length`` counts. System and user turns, the header, its newline and padding never count.
    So every reply is supervised, whole, on any byte-level tokenizer: the labels equal d65ef2c's
    wherever its marker matches, and c090b69's except for the merged first token it leaves out.

    ``merged_starts`` (optional, e.g. ``merged_newline_ids(tokenizer)``): accept only these tokens
    after the header as a merged newline (without it, any token other than the newline is)."""
    ids = list(input_ids)
    bos, eos = _markers(bos_ids, eos_ids, need_header=True)
    header, newline = bos[:-1], bos[-1]
    allowed = None if merged_starts is None else frozenset(merged_starts)
    mask = [0] * len(ids)
    i = 0
    while i < len(ids):
        after = i + len(header)
        if after >= len(ids) or ids[i:after] != header:  # not a header, or one that ends the sequence
            i += 1
            continue
        if ids[after] == newline:
            start = after + 1
        elif allowed is None or ids[after] in allowed:
            start = after
        else:
            i += 1
            continue
        end = _find(ids, eos, start)
        for j in range(start, min(end + len(eos), max_length, len(ids))):
            mask[j] = 1
        i = end + len(eos) if end < len(ids) else len(ids)
    return mask


UPSTREAM_RULES = ("c090b69", "d65ef2c")


def upstream_loss_mask(input_ids: Sequence[int], bos_ids: Sequence[int], eos_ids: Sequence[int], max_length: int,
                       commit: str = "d65ef2c") -> List[int]:
    """Where upstream's ``SFTDataset.generate_labels`` sets a label at ``commit`` (1), else 0, with
    that commit's markers (``marker_ids(tokenizer, newline=commit == "d65ef2c")``):

    * ``"d65ef2c"`` (``d65ef2c:dataset/lm_dataset.py:88-104``): at every full ``bos_ids``
      (``<|im_start|>assistant\\n``), from the token after it through the next ``eos_ids``
      (``<|im_end|>\\n``);
    * ``"c090b69"`` (``c090b69:dataset/lm_dataset.py:54-70``): at every ``bos_ids``
      (``<|im_start|>assistant``, no newline), from the second token after it (``start + 1``: the
      first is the header's newline) through one token past the next ``eos_ids`` (``<|im_end|>``).

    Both: the search for the end marker starts right after ``bos_ids``; a reply without an end
    marker counts to the end; nothing at or past ``max_length`` counts. Upstream pads every
    sequence to ``max_length`` first; on such input this equals upstream's exactly (the parity
    test compares it with upstream's own code on ids of both commits' real tokenizers), and on a
    shorter one it stops at the end where upstream's would index past it."""
    if commit not in UPSTREAM_RULES:
        raise ValueError(f"commit must be one of {UPSTREAM_RULES} (the commits the course pins), got {commit!r}.")
    ids = list(input_ids)
    bos, eos = _markers(bos_ids, eos_ids, need_header=False)
    skip = 1 if commit == "c090b69" else 0
    mask = [0] * len(ids)
    i = 0
    while i < len(ids):
        if ids[i:i + len(bos)] == bos:
            start = i + len(bos)
            end = _find(ids, eos, start)
            for j in range(start + skip, min(end + len(eos) + skip, max_length, len(ids))):
                mask[j] = 1
            i = end + len(eos) if end < len(ids) else len(ids)
        else:
            i += 1
    return mask


def generate_labels(input_ids: Sequence[int], bos_ids: Sequence[int], eos_ids: Sequence[int], max_length: int,
                    commit: str = "d65ef2c") -> List[int]:
    """Upstream's ``SFTDataset.generate_labels`` at ``commit`` (``upstream_loss_mask``): the token
    id where it sets a label, else -100."""
    mask = upstream_loss_mask(input_ids, bos_ids, eos_ids, max_length, commit)
    return [t if m else -100 for t, m in zip(input_ids, mask)]


def assistant_labels(input_ids: Sequence[int], bos_ids: Sequence[int], eos_ids: Sequence[int], max_length: int,
                     merged_starts: Optional[Sequence[int]] = None) -> List[int]:
    """The SFT labels: the token id where ``assistant_loss_mask`` is 1, else -100 (ignored)."""
    mask = assistant_loss_mask(input_ids, bos_ids, eos_ids, max_length, merged_starts)
    return [t if m else -100 for t, m in zip(input_ids, mask)]


def reply_runs(course_mask: Sequence[int]) -> List[Tuple[int, int]]:
    """The ``[start, stop)`` runs of 1s of ``course_mask`` (``assistant_loss_mask``'s output): one
    per assistant reply (the header between two replies never counts, so runs never touch)."""
    runs: List[Tuple[int, int]] = []
    for j, m in enumerate(course_mask):
        if m and (j == 0 or not course_mask[j - 1]):
            runs.append((j, j + 1))
        elif m:
            runs[-1] = (runs[-1][0], j + 1)
    return runs


def reply_losses(course_mask: Sequence[int], other_mask: Sequence[int]) -> List[List[int]]:
    """Per assistant reply (``reply_runs(course_mask)``), the positions the course counts and
    ``other_mask`` (an upstream rule, say) does not: ``[]`` for a reply kept whole, every position
    of the run for a reply that lost all its labels."""
    if len(course_mask) != len(other_mask):
        raise ValueError(f"the masks must have one entry per token each, got {len(course_mask)} and {len(other_mask)}.")
    return [[j for j in range(a, b) if not other_mask[j]] for a, b in reply_runs(course_mask)]


RULES = ("course",) + UPSTREAM_RULES


def rule_mask(input_ids: Sequence[int], header_ids: Sequence[int], newline_id: int, im_end_id: int, max_length: int,
              rule: str) -> List[int]:
    """``input_ids`` masked by ``rule`` with the markers it uses, built from the ids of
    ``<|im_start|>assistant`` (``header_ids``), of the newline and of ``<|im_end|>``: ``"course"``
    (``assistant_loss_mask``), ``"d65ef2c"`` or ``"c090b69"`` (``upstream_loss_mask``, with that
    commit's markers: with the newline at d65ef2c, without it at c090b69)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}.")
    header, newline = list(header_ids), [newline_id]
    if rule == "c090b69":
        return upstream_loss_mask(input_ids, header, [im_end_id], max_length, "c090b69")
    if rule == "d65ef2c":
        return upstream_loss_mask(input_ids, header + newline, [im_end_id] + newline, max_length, "d65ef2c")
    return assistant_loss_mask(input_ids, header + newline, [im_end_id] + newline, max_length)


def unsupervised_replies(tokenizer: Any, conversations: Sequence[Sequence[Message]], template: Optional[str] = None,
                         rule: str = "d65ef2c", drop_empty_think: bool = True) -> List[int]:
    """Indices of the conversations in which some assistant reply gets no label at all when the
    conversation is encoded as one string (upstream's way, ``encode_rendered``) and labelled with
    ``rule`` (``rule_mask``: ``"d65ef2c"``, ``"c090b69"`` or ``"course"``). ``drop_empty_think``
    (default): the empty thinking blocks are dropped first, as ``post_processing_chat`` does most
    of the time, so a reply follows its header directly."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}.")
    bos, eos = marker_ids(tokenizer)
    header, newline, im_end = bos[:-1], bos[-1], eos[0]
    lost = []
    for n, messages in enumerate(conversations):
        ids = encode_rendered(tokenizer, render_chat(messages, template=template, drop_empty_think=drop_empty_think))
        course = assistant_loss_mask(ids, bos, eos, len(ids))
        other = rule_mask(ids, header, newline, im_end, len(ids), rule)
        runs = reply_runs(course)
        replies = sum(m["role"] == "assistant" for m in messages)
        if len(runs) < replies or any(len(lost_j) == b - a for lost_j, (a, b) in zip(reply_losses(course, other), runs)):
            lost.append(n)
    return lost


def upstream_sft_tokens() -> Dict[str, Any]:
    """The token data chapter 09 measures upstream's rules on, made from upstream's real
    tokenizers and ``SFTDataset`` steps at c090b69 and d65ef2c by ``tools/upstream_sft_tokens.py``
    (its docstring says how; ``python tools/upstream_sft_tokens.py --upstream <a clone of
    jingyaogong/minimind>``), shipped as ``reference_outputs/upstream_sft_tokens.json``:

    * ``commits[c]``: ``bos_id`` / ``eos_id`` (the markers that commit's ``SFTDataset`` searches
      for), ``header_ids`` (``<|im_start|>assistant``), ``newline_id``, ``im_end_id``, ``pad_id``,
      ``merged_newline_ids`` (the tokens that begin with a newline and go on), ``tokens`` (id ->
      the token's byte-level string, for every id in the file) and ``blobs`` (the git blob ids of
      the files read);
    * ``examples[name]``: a conversation and its ids per encoding (``"c090b69"``, ``"d65ef2c kept"``
      and ``"d65ef2c dropped"``: with the empty thinking blocks kept or dropped);
    * ``sample``: ``conversations`` whose replies begin with whitespace (``prefixes``), their ids
      per encoding (the three above and ``"d65ef2c upstream"``: with d65ef2c's own random
      ``pre_processing_chat`` and ``post_processing_chat``, seeded), the system prompt that
      preprocessing put first (``system_upstream``, None where it added none) and whether it
      dropped the empty blocks (``dropped_upstream``)."""
    import importlib.resources

    text = importlib.resources.files(__package__).joinpath("reference_outputs", "upstream_sft_tokens.json") \
        .read_text(encoding="utf-8")
    data = json.loads(text)
    for entry in data["commits"].values():
        entry["tokens"] = {int(i): t for i, t in entry["tokens"].items()}
    return data


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
    runs = reply_runs(assistant_loss_mask(cut, bos_ids, eos_ids, max_length))
    if runs and runs[-1][1] == len(cut) and eos_ids[0] not in cut[runs[-1][0]:]:
        return "cut_answer"
    return None


# ---------------------------------------------------------------------- dataset
ENCODINGS = ("pieces", "upstream")


class SFTDataset:
    """Conversations (upstream's ``{"conversations": [...]}`` records) as ``(input_ids, labels)``.

    Like upstream's ``SFTDataset`` (d65ef2c): each conversation goes through
    ``pre_processing_chat`` (``add_system_ratio``) and is rendered with the chat template, the
    empty thinking blocks dropped with probability ``1 - empty_think_ratio``
    (``post_processing_chat``); the draws come from ``random.Random(seed)``, so the dataset is
    deterministic. The ids are cut to ``max_length`` on the right and labelled with
    ``assistant_labels`` (the course's mask: replies that begin with whitespace stay supervised
    whole, also with ``encoding="upstream"``). ``encoding="pieces"`` (default) encodes with ``encode_chat``;
    ``encoding="upstream"`` encodes the rendered string at once, as upstream does. A record whose
    first message is a system message with ``tools`` renders those tools. ``loss_on="all"`` is the
    ablation of chapter 09: every real token counts (system and user turns too).
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
                 loss_on: str = "assistant", pad_id: int = 0, template: Optional[str] = None,
                 add_system_ratio: float = 0.2, empty_think_ratio: float = 0.2, seed: int = 0,
                 encoding: str = "pieces", drop_truncated: bool = False) -> None:
        if loss_on not in ("assistant", "all"):
            raise ValueError(f"loss_on must be 'assistant' or 'all', got {loss_on!r}.")
        if encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}.")
        _check_max_length(max_length)
        for name, ratio in (("add_system_ratio", add_system_ratio), ("empty_think_ratio", empty_think_ratio)):
            if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
                raise ValueError(f"{name} must be a probability in [0, 1], got {ratio!r}.")
        bos, eos = marker_ids(tokenizer)
        rng = random.Random(seed)
        self.max_length, self.loss_on, self.pad_id, self.template = max_length, loss_on, pad_id, _template(template)
        self.examples: List[Tuple[List[int], List[int]]] = []
        self.truncation: Dict[str, int] = {"examples": 0, "no_answer": 0, "cut_answer": 0, "dropped": 0,
                                         "max_length": max_length}
        self.truncated: List[int] = []  # indices (in ``records``) of the conversations counted there
        self.no_reply: List[int] = []  # indices of conversations without an assistant reply (nothing to learn)
        for n, record in enumerate(records):
            if not isinstance(record, Mapping) or "conversations" not in record:
                raise ValueError(f"record {n} has no 'conversations' key (upstream's SFT format): {record!r:.100}")
            messages = pre_processing_chat(record["conversations"], rng, add_system_ratio)
            tools = messages[0].get("tools") if messages and messages[0].get("role") == "system" else None
            tools = json.loads(tools) if isinstance(tools, str) else tools
            rendered = render_chat(messages, tools=tools, template=self.template)
            drop = EMPTY_THINK in rendered and rng.random() > empty_think_ratio
            if encoding == "pieces":
                full = encode_chat(tokenizer, messages, tools=tools, template=self.template, drop_empty_think=drop)
            else:
                full = encode_rendered(tokenizer, render_chat(messages, tools=tools, template=self.template,
                                                              drop_empty_think=drop))
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
                     batch_size: int = 128, template: Optional[str] = None) -> List[Dict[str, Any]]:
    """The model's next assistant turn for every conversation, with the KV cache.

    Returns, per conversation, ``{"text", "ids", "stopped"}``: the decoded reply, its token ids
    up to (not including) ``<|im_end|>``, and whether the model emitted ``<|im_end|>`` within
    ``max_new_tokens``. The prompt ends with the template's generation prompt (minimind-3: the
    empty thinking block, upstream's non-thinking mode). Prompts of equal length are batched
    together (no padding needed)."""
    from .generation import generate

    device = next(model.parameters()).device
    end = _special_id(tokenizer, IM_END)
    prompts = [encode_chat(tokenizer, conv, add_generation_prompt=True, template=template) for conv in conversations]
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
# What the loop's config does not hold: the data sizes and upstream's two preprocessing ratios. The
# course keeps every empty thinking block (empty_think_ratio 1.0; upstream's 0.2 drops them from 80 % of
# the conversations): the generation prompt always ends with the empty block, and a model that saw it in
# only a fifth of its training conversations copies the numbers of a question badly after it (measured
# on this model: 13 % of 100 training sums right with the block, 63 % without it; see chapter 09).
STAGE_SETTINGS: Dict[str, Any] = {"n_train": 4000, "n_val": 200, "add_system_ratio": 0.2, "empty_think_ratio": 1.0}


def sft_data(tokenizer: Any, n_train: int = 4000, n_val: int = 200, seed: int = 0, max_length: int = 256,
             loss_on: str = "assistant", add_system_ratio: float = 0.2, empty_think_ratio: float = 0.2) -> "RunData":
    """Generated conversations (``chat_data.sft_conversations``) as a ``train.RunData``: the
    training split and a held-out validation split, both ``SFTDataset`` (upstream's
    preprocessing drawn from ``seed``)."""
    from . import chat_data
    from .train import RunData

    kw = dict(max_length=max_length, loss_on=loss_on, add_system_ratio=add_system_ratio,
              empty_think_ratio=empty_think_ratio)
    train_set = SFTDataset(chat_data.sft_conversations(n_train, seed=seed, split="train"), tokenizer, seed=seed, **kw)
    val_set = SFTDataset(chat_data.sft_conversations(n_val, seed=0, split="test"), tokenizer, seed=0, **kw)
    return RunData(tokenizer, train_set, val_set, [])


def train_sft(model: torch.nn.Module, tokenizer: Any, cfg: Any = None, loss_on: str = "assistant",
              n_train: int = 4000, seed: int = 0, **train_kwargs: Any) -> Any:
    """Supervised fine-tuning with ``minimind_ref.train``'s loop: the objective is the ordinary
    next-token loss (``lm_objective``); the labels of ``SFTDataset`` make it count only the
    assistant's tokens (or every token, ``loss_on="all"``). ``seed`` draws the training
    conversations and upstream's preprocessing; ``cfg.seed`` orders the batches. ``model`` is
    trained in place. Returns the ``TrainResult``."""
    from .train import TrainConfig, train

    cfg = cfg if cfg is not None else TrainConfig.from_json(SFT_CONFIG)
    s = STAGE_SETTINGS
    data = sft_data(tokenizer, n_train=n_train, n_val=s["n_val"], seed=seed, max_length=cfg.seq_len, loss_on=loss_on,
                    add_system_ratio=s["add_system_ratio"], empty_think_ratio=s["empty_think_ratio"])
    return train(cfg, model=model, data=data, **train_kwargs)


def build_stage(parent: torch.nn.Module, tokenizer: Any, seed: int = 0) -> Tuple[torch.nn.Module, Dict[str, Any], Any]:
    """The shipped ``sft`` stage: ``train_sft`` on the ``base`` stage with ``SFT_CONFIG`` and
    ``STAGE_SETTINGS`` (``python -m minimind_ref.stages rebuild sft``); ``seed`` draws the data and
    orders the batches (the shipped stage: 0)."""
    from .train import TrainConfig

    cfg = TrainConfig.from_json(SFT_CONFIG).replace(progress=False, out_dir=None, seed=seed)
    result = train_sft(parent, tokenizer, cfg, n_train=STAGE_SETTINGS["n_train"], seed=seed, log=lambda line: None)
    extra = {"recipe": "minimind_ref.sft:build_stage", "command": "python -m minimind_ref.stages rebuild sft",
             "train_config": cfg.to_dict(), "sft_settings": dict(STAGE_SETTINGS), "seed": seed,
             "metrics": {"final_train_loss_mean20": sum(result.history["loss"][-20:]) / 20,
                         "final_val_loss": result.history["eval_loss"][-1]},
             "loss_history": [round(v, 4) for v in result.history["loss"]]}
    return result.model, extra, tokenizer
