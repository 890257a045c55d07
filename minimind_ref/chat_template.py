"""MiniMind's chat templates in Python, and a conversation turned into token ids: this module owns
what a rendered conversation looks like (``render_chat``, ``chat_segments``), upstream's seeded
preprocessing of SFT conversations (``pre_processing_chat``, ``post_processing_chat``) and the
encoding that keeps markers and text apart (``encode_chat``, ``encode_rendered``, ``marker_ids``).
Which tokens the loss counts is ``loss_mask``'s; the dataset and training are ``sft``'s, which
re-exports every name here.

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
"""

from __future__ import annotations

import json
import random
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

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
