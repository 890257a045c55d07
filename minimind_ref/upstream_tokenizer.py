"""Upstream's tokenizer folder and chat template, read without ``transformers``: ``tokenizer.json``
+ ``tokenizer_config.json`` (+ ``chat_template.jinja`` when transformers saved the template
separately, + ``special_tokens_map.json``), as every MiniMind2 / minimind-3 model folder and
upstream's ``model/`` hold them. This module owns ``load_tokenizer_dir`` and the
``UpstreamTokenizer`` it returns (``encode``/``decode``/``apply_chat_template`` as transformers'
fast tokenizer calls them, the special tokens checked against the vocabulary),
``render_chat_template`` (a Hugging Face chat template rendered as transformers renders it) and
``tokenizer_folder_generation`` (which generation's tokenizer a folder holds). Finding a folder
and downloading one is ``pretrained``'s.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import torch

from .files import read_json
from .tokenizer import read_tokenizer_file

PathLike = Union[str, "os.PathLike[str]"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
OPTIONAL_TOKENIZER_FILES = ("chat_template.jinja", "special_tokens_map.json")


@functools.lru_cache(maxsize=8)
def _compiled_template(template: str):
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as err:
        raise ImportError("rendering a chat template needs jinja2: pip install jinja2") from err
    import datetime

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(template)


def render_chat_template(template: str, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False,
                         **kwargs: Any) -> str:
    """Render a Hugging Face chat template as ``transformers`` does: a sandboxed jinja2 environment
    with ``trim_blocks`` and ``lstrip_blocks``, its ``tojson`` filter, ``raise_exception`` and
    ``strftime_now``, called with ``messages``, ``tools=None``, ``documents=None``,
    ``add_generation_prompt`` and ``kwargs`` (e.g. ``enable_thinking``, the special tokens)."""
    kwargs.setdefault("tools", None)
    kwargs.setdefault("documents", None)
    return _compiled_template(template).render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                                **kwargs)


class UpstreamTokenizer:
    """Upstream's tokenizer as ``transformers.PreTrainedTokenizerFast`` would read it, minus transformers.

    ``tokenizer`` is the ``tokenizers.Tokenizer`` (byte-level BPE, 6,400 tokens for MiniMind2);
    ``encode``/``decode`` mirror transformers' calls; ``chat_template`` and
    ``apply_chat_template`` render the folder's template. The special tokens (``bos_token``
    ``<|im_start|>`` = 1, ``eos_token`` ``<|im_end|>`` = 2, ``pad_token`` ``<|endoftext|>`` = 0 in
    MiniMind2) come from ``tokenizer_config.json`` and are checked against ``tokenizer.json``.
    """

    SPECIAL_ATTRIBUTES = ("bos_token", "eos_token", "unk_token", "pad_token")

    def __init__(self, tokenizer: Any, config: Mapping[str, Any], chat_template: Optional[str] = None,
                 special_tokens_map: Optional[Mapping[str, Any]] = None, source: str = "") -> None:
        self.tokenizer = tokenizer
        self.config = dict(config)
        self.chat_template = chat_template
        self.source = source
        extra = dict(special_tokens_map or {})
        self.special_tokens: Dict[str, str] = {}
        for attr in self.SPECIAL_ATTRIBUTES:
            value = self.config.get(attr, extra.get(attr))
            if isinstance(value, Mapping):
                value = value.get("content")
            if value is not None:
                self.special_tokens[attr] = str(value)
        for index, entry in (self.config.get("added_tokens_decoder") or {}).items():
            content = entry.get("content") if isinstance(entry, Mapping) else entry
            if tokenizer.token_to_id(content) != int(index):
                raise ValueError(
                    f"{source}: tokenizer_config.json gives {content!r} the id {index}, tokenizer.json gives it "
                    f"{tokenizer.token_to_id(content)}; the two files do not belong together."
                )
        for attr, token in self.special_tokens.items():
            if tokenizer.token_to_id(token) is None:
                raise ValueError(f"{source}: the {attr} {token!r} is not in the vocabulary of tokenizer.json.")

    def _id(self, attr: str) -> Optional[int]:
        token = self.special_tokens.get(attr)
        return None if token is None else self.tokenizer.token_to_id(token)

    @property
    def bos_token_id(self) -> Optional[int]:
        return self._id("bos_token")

    @property
    def eos_token_id(self) -> Optional[int]:
        return self._id("eos_token")

    @property
    def pad_token_id(self) -> Optional[int]:
        return self._id("pad_token")

    @property
    def unk_token_id(self) -> Optional[int]:
        return self._id("unk_token")

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        """Token ids of ``text`` (special-token strings in it become their ids, as in transformers)."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}.")
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` (a list or a 1-D tensor). An id outside the vocabulary is a ``ValueError``
        (the ``tokenizers`` library would skip it without a word)."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        ids = [int(i) for i in ids]
        n = len(self)
        outside = [i for i in ids if not 0 <= i < n]
        if outside:
            raise ValueError(f"token id(s) {outside[:5]} are outside this tokenizer's vocabulary [0, {n - 1}]: ids of "
                             "another tokenizer, or of a model with a larger vocabulary?")
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False,
                            tokenize: bool = False, **kwargs: Any) -> Union[str, List[int]]:
        """The folder's chat template rendered for ``messages`` (``tokenize=True``: its ids, a list, as
        transformers 4 returns them; transformers 5 returns a ``BatchEncoding`` whose ``input_ids`` is that list).

        ``kwargs`` reach the template as variables, as in transformers: ``tools=[...]`` (both
        generations' templates list them in the system turn), ``open_thinking=True`` (minimind-3,
        d65ef2c: the generation prompt opens a ``<think>`` block instead of an empty one),
        ``enable_thinking=False`` (MiniMind2's c090b69 template). Messages may carry
        ``tool_calls`` and, for minimind-3, ``reasoning_content``."""
        if not self.chat_template:
            raise ValueError(f"{self.source}: this tokenizer has no chat template (no chat_template in "
                             "tokenizer_config.json and no chat_template.jinja).")
        template_kwargs = {**self.special_tokens, "additional_special_tokens":
                           list(self.config.get("additional_special_tokens") or []), **kwargs}
        text = render_chat_template(self.chat_template, messages, add_generation_prompt, **template_kwargs)
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def __repr__(self) -> str:
        return (f"UpstreamTokenizer({len(self)} tokens, bos={self.bos_token_id}, eos={self.eos_token_id}, "
                f"pad={self.pad_token_id}, chat_template={'yes' if self.chat_template else 'no'})")


def load_tokenizer_dir(folder: PathLike) -> UpstreamTokenizer:
    """Read ``tokenizer.json`` + ``tokenizer_config.json`` (and ``chat_template.jinja``, which takes
    priority over the config's ``chat_template`` as in transformers) with the ``tokenizers`` library."""
    folder = Path(folder)
    if folder.is_file():
        folder = folder.parent
    missing = [name for name in TOKENIZER_FILES if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} lacks {', '.join(missing)}: upstream's tokenizer is tokenizer.json + "
                                "tokenizer_config.json (in every MiniMind2 model folder and in upstream's model/).")
    try:
        import tokenizers  # noqa: F401
    except ImportError as err:
        raise ImportError("reading tokenizer.json needs the 'tokenizers' package: pip install tokenizers") from err
    tokenizer = read_tokenizer_file(folder / "tokenizer.json")
    config = read_json(folder / "tokenizer_config.json", "tokenizer_config.json")
    template = config.get("chat_template")
    if isinstance(template, list):  # transformers' legacy form for several named templates
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        try:
            template = jinja_file.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"{jinja_file} is not UTF-8 text ({err.reason} at byte {err.start}): a damaged file?") from None
    special_map = folder / "special_tokens_map.json"
    special = read_json(special_map, "special_tokens_map.json") if special_map.is_file() else None
    return UpstreamTokenizer(tokenizer, config, template, special, source=str(folder))


def tokenizer_folder_generation(folder: PathLike) -> str:
    """``"minimind-3"`` for a tokenizer folder whose ``tokenizer_config.json`` lists minimind-3's added
    tokens (``<tool_call>``, ``<think>``, ...: ``trainer/train_tokenizer.py`` at d65ef2c), else ``"MiniMind2"``
    (c090b69's has only ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``). A file that is not valid
    JSON is a ``ValueError`` naming it (not a tokenizer of the other generation)."""
    config = read_json(Path(folder) / "tokenizer_config.json", "tokenizer_config.json")
    if not isinstance(config, dict):
        raise ValueError(f"{Path(folder) / 'tokenizer_config.json'} is not a valid tokenizer_config.json: it holds a "
                         f"{type(config).__name__}, not a JSON object.")
    added = config.get("added_tokens_decoder") or {}
    contents = {entry.get("content") if isinstance(entry, Mapping) else entry for entry in added.values()}
    return "minimind-3" if {"<tool_call>", "<think>"} <= contents else "MiniMind2"
