"""Supervised fine-tuning (chapter 09): MiniMind's chat template, the assistant-only loss, and
chatting with the model.

``render_chat`` renders a conversation exactly as upstream's ``model/tokenizer_config.json`` chat
template does (jingyaogong/minimind at c090b69), without the tool-call branches::

    <|im_start|>system\\n{system prompt, default "You are a helpful assistant"}<|im_end|>\\n
    <|im_start|>user\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n{content}<|im_end|>\\n
    ...
    <|im_start|>assistant\\n                      (add_generation_prompt=True)
"""

from __future__ import annotations

from typing import Dict, List, Sequence

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
