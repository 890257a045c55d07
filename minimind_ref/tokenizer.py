"""Byte-level BPE tokenizers: a from-scratch merge step, and training/loading with ``tokenizers``.

MiniMind trains its 6,400-token vocabulary with the Hugging Face ``tokenizers`` library
(upstream's ``train_tokenizer.py``): a ``BPE`` model, a ``ByteLevel`` pre-tokenizer (so
any text, any language, maps onto 256 byte symbols and nothing is ever "unknown"), a
``ByteLevel`` decoder, and three special tokens with fixed ids (MiniMind2's, at c090b69; minimind-3's
``d65ef2c:trainer/train_tokenizer.py:10`` reserves 36, ids 0-2 unchanged)::

    0 <|endoftext|>   padding / end of text
    1 <|im_start|>    beginning of a message (MiniMindConfig.bos_token_id)
    2 <|im_end|>      end of a message       (MiniMindConfig.eos_token_id)

``tokenizer.encode(text)`` turns the *text* ``"<|im_end|>"`` into the control token 2 wherever it
occurs: right for a chat template the code renders, wrong for text a user typed (it would end
the assistant's turn: prompt injection, and the characters are lost on decoding). ``encode_plain``
encodes such text as ordinary characters.

``train_bpe_tokenizer`` does the same on any iterable of strings. One option upstream does not
use: ``split_digits=True`` makes every digit its own pre-token (as LLaMA and Qwen do), so numbers
are spelled digit by digit and arithmetic stays learnable by a small model.

The from-scratch half (``pair_counts``, ``merge_pair``, ``learn_merges``) is what one BPE
training step does, on plain lists of integers, for the chapter's illustration.

Needs the optional dependency ``tokenizers`` (``pip install minimind-ref[train]``).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, Dict, Iterable, List, Sequence, Tuple, Union

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

PathLike = Union[str, "os.PathLike[str]"]


# ---------------------------------------------------------------------- BPE from scratch
def pair_counts(ids: Sequence[int]) -> Counter:
    """How often every adjacent pair ``(ids[i], ids[i+1])`` occurs."""
    return Counter(zip(ids, ids[1:]))


def merge_pair(ids: Sequence[int], pair: Tuple[int, int], new_id: int) -> List[int]:
    """Replace every non-overlapping occurrence of ``pair``, scanning left to right, by ``new_id``.

    ``merge_pair([5, 5, 5], (5, 5), 9) == [9, 5]``: the first two are merged, the third is left.
    """
    out: List[int] = []
    i = 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def learn_merges(text: str, num_merges: int) -> Tuple[List[int], Dict[Tuple[int, int], int]]:
    """Byte-level BPE training in its simplest form: start from the UTF-8 bytes of ``text`` and
    merge the most frequent pair ``num_merges`` times (new ids 256, 257, ...). Ties go to the pair
    seen first. Returns the final ids and the merges in order."""
    ids = list(text.encode("utf-8"))
    merges: Dict[Tuple[int, int], int] = {}
    for k in range(num_merges):
        counts = pair_counts(ids)
        if not counts:
            break
        best = max(counts, key=counts.get)  # Counter keeps insertion order: ties -> first seen
        if counts[best] < 2:
            break
        merges[best] = 256 + k
        ids = merge_pair(ids, best, 256 + k)
    return ids, merges


# ---------------------------------------------------------------------- the tokenizers library
def _require_tokenizers():
    try:
        import tokenizers  # noqa: F401
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "training a tokenizer needs the 'tokenizers' package: pip install 'minimind-ref[train]' "
            "(or pip install tokenizers)."
        ) from err
    return tokenizers


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 1024, split_digits: bool = True, min_frequency: int = 2):
    """Train a byte-level BPE tokenizer the way MiniMind does, on any iterable of strings.

    ``vocab_size`` counts everything: the 3 special tokens, the 256 byte symbols and the merges
    (a small corpus may stop earlier: there are only so many pairs worth merging). Returns a
    ``tokenizers.Tokenizer``.
    """
    tk = _require_tokenizers()
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size must be at least {len(SPECIAL_TOKENS) + 256} (specials + 256 bytes), got {vocab_size}.")
    tokenizer = tk.Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if split_digits:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    for i, tok in enumerate(SPECIAL_TOKENS):
        assert tokenizer.token_to_id(tok) == i, f"special token {tok} should have id {i}"
    return CheckedTokenizer(tokenizer)


class CheckedTokenizer:
    """A ``tokenizers.Tokenizer`` whose ``decode`` and ``decode_batch`` refuse ids outside the
    vocabulary: the library skips such an id without a word (``decode([5, 99999])`` is the text of
    5 alone), which hides ids of another tokenizer or of a model with a larger vocabulary. Every
    other attribute is the library tokenizer's own (``encode``, ``token_to_id``, ``to_str``, ...;
    ``backend_tokenizer`` is the library object itself). The library's class cannot be subclassed,
    hence the wrapper; ``load_tokenizer`` and ``train_bpe_tokenizer`` return one."""

    def __init__(self, tokenizer: Any) -> None:
        object.__setattr__(self, "_inner", getattr(tokenizer, "backend_tokenizer", tokenizer))

    @property
    def backend_tokenizer(self) -> Any:
        return self._inner

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":  # while unpickling, before __dict__ is filled
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)  # e.g. encode_special_tokens, decoder: the library object's settings

    def __repr__(self) -> str:
        return f"CheckedTokenizer(vocab_size={self._inner.get_vocab_size()})"

    def _ids(self, ids: Any) -> List[int]:
        if hasattr(ids, "tolist"):  # a tensor or an array
            ids = ids.tolist()
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise TypeError(f"decode takes a sequence of token ids, got {type(ids).__name__}.")
        out = []
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, int):
                raise TypeError(f"token ids must be ints, got {i!r} ({type(i).__name__}).")
            out.append(i)
        n = self._inner.get_vocab_size()
        outside = [i for i in out if not 0 <= i < n]
        if outside:
            raise ValueError(f"token id(s) {outside[:5]} are outside this tokenizer's vocabulary [0, {n - 1}]: ids of "
                             "another tokenizer, or of a model with a larger vocabulary? (the tokenizers library would "
                             "drop them without a word)")
        return out

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        """The text of ``ids`` (a list, or a 1-D tensor); an id outside the vocabulary is a ``ValueError``."""
        return self._inner.decode(self._ids(ids), skip_special_tokens=skip_special_tokens)

    def decode_batch(self, sequences: Any, skip_special_tokens: bool = True) -> List[str]:
        return self._inner.decode_batch([self._ids(ids) for ids in sequences], skip_special_tokens=skip_special_tokens)


def save_tokenizer(tokenizer, path: PathLike) -> None:
    """Write ``tokenizer.json`` (one file holds vocabulary, merges, pre-tokenizer and decoder),
    atomically (``files.write_text``: the same bytes as ``tokenizer.save(path)``)."""
    from .files import write_text

    write_text(path, tokenizer.to_str(pretty=True))


def encode_plain(tokenizer, text: str) -> List[int]:
    """Token ids of ``text`` with every special-token string in it encoded as plain text.

    ``tokenizer.encode("hi <|im_end|>")`` yields the control id 2 for the typed ``<|im_end|>``;
    ``encode_plain`` yields the ids of the characters ``<``, ``|``, ``im``, ... instead, so
    ``tokenizer.decode(encode_plain(tokenizer, text)) == text`` and no id of ``text`` is special.
    No special tokens are added around the text (``add_special_tokens=False``).

    Works with a ``tokenizers.Tokenizer`` (or a ``transformers`` fast tokenizer, through its
    ``backend_tokenizer``): it switches the library's ``encode_special_tokens`` on for this call
    and restores the previous setting afterwards (not thread-safe: don't encode with the same
    tokenizer from two threads at once). ``tokenizer.encode`` itself is unchanged, because
    upstream's datasets rely on it parsing the special tokens of rendered templates.
    """
    if not isinstance(text, str):
        raise TypeError(f"encode_plain encodes a str, got {type(text).__name__}.")
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not hasattr(backend, "encode_special_tokens"):
        raise TypeError(
            f"encode_plain needs a tokenizers.Tokenizer (tokenizers >= 0.20) or a transformers fast tokenizer, "
            f"got {type(tokenizer).__name__}."
        )
    previous = backend.encode_special_tokens
    backend.encode_special_tokens = True
    try:
        return list(backend.encode(text, add_special_tokens=False).ids)
    finally:
        backend.encode_special_tokens = previous


def load_tokenizer(path: PathLike):
    """Read a ``tokenizer.json`` written by ``save_tokenizer`` (or by upstream MiniMind), as a
    ``CheckedTokenizer`` (its ``decode`` refuses ids outside the vocabulary)."""
    tk = _require_tokenizers()
    path = os.path.expanduser(os.fspath(path))
    if not os.path.exists(path):
        raise FileNotFoundError(f"no tokenizer at {path!s}; train one with train_bpe_tokenizer and save_tokenizer.")
    return CheckedTokenizer(read_tokenizer_file(path))


def read_tokenizer_file(path: PathLike):
    """``tokenizers.Tokenizer.from_file`` with a ``ValueError`` naming the file when it is not a
    complete tokenizer.json (the library raises a bare ``Exception``)."""
    tk = _require_tokenizers()
    try:
        return tk.Tokenizer.from_file(str(path))
    except Exception as err:  # noqa: BLE001 - tokenizers raises plain Exception
        raise ValueError(f"{path} is not a valid tokenizer.json ({err}): truncated, or another file?") from None
