"""The SFT loss masks: which tokens of an encoded conversation the loss counts. This module owns
the course's mask (``assistant_loss_mask``, ``assistant_labels``), upstream's two rules exactly
(``upstream_loss_mask``, ``generate_labels``, ``rule_mask``), the comparison of the rules per reply
(``reply_runs``, ``reply_losses``, ``unsupervised_replies``, ``merged_newline_ids``) and the token
data of upstream's real tokenizers they are measured on (``upstream_sft_tokens``). The templates and
the encoding are ``chat_template``'s; ``sft`` re-exports every name here.

``assistant_loss_mask`` marks the tokens the loss counts: after each ``<|im_start|>assistant\\n``
up to and including the next ``<|im_end|>\\n``, as d65ef2c's ``generate_labels`` does. When a
conversation is encoded as one string (upstream's way) and a reply begins with whitespace, the
byte-level BPE of both upstream tokenizers merges the header's newline into the reply's first token
(``"\\n   "``); then d65ef2c's marker no longer matches and its rule drops the whole reply, and
c090b69's rule (markers without the newline, counting from ``start + 1``) drops that first token.
The course's mask counts from the merged token, so every reply is supervised whole; the two
upstream rules are here too, exactly (``upstream_loss_mask`` / ``generate_labels`` with
``commit``), and ``upstream_sft_tokens`` holds the ids of both commits' real tokenizers that
chapter 09 measures them on.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

from .chat_template import Message, _plain_ids, backend_tokenizer, encode_rendered, marker_ids, render_chat


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
    for name, ids in (("bos_ids", bos), ("eos_ids", eos)):
        if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
            raise TypeError(f"{name} must be token ids (ints), as marker_ids(tokenizer) gives them; got {ids!r:.80}.")
    if need_header and len(bos) < 2:
        raise ValueError(f"bos_ids must be the ids of <|im_start|>assistant\\n: the header's tokens, then the newline "
                         f"(marker_ids(tokenizer)); got {bos}, too short to hold both.")
    if need_header and len(eos) < 2:
        raise ValueError(f"eos_ids must be the ids of <|im_end|>\\n, the end marker then the newline (marker_ids(tokenizer)); "
                         f"got {eos}, a single id: c090b69's markers (marker_ids(tokenizer, newline=False)), with which "
                         "this mask would read the token after <|im_start|> as the header's newline and shift every "
                         "supervised position by one. Pass marker_ids(tokenizer), or use upstream_loss_mask(..., "
                         "commit='c090b69') for c090b69's own rule.")
    return bos, eos


def _check_max_length(max_length: Any) -> None:
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be a whole number >= 1 (the sequence length the mask is cut to), got "
                         f"{max_length!r}: with it nothing would be supervised.")


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
    after the header as a merged newline (without it, any token other than the newline is).

    ``max_length`` must be >= 1, and ``eos_ids`` two ids or more: c090b69's single ``<|im_end|>``
    (``marker_ids(tokenizer, newline=False)``) is refused, since with its markers every supervised
    position would shift by one."""
    _check_max_length(max_length)
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
    _check_max_length(max_length)
    ids = list(input_ids)
    bos, eos = _markers(bos_ids, eos_ids, need_header=False)
    if (commit == "c090b69") != (len(eos) == 1):  # each commit's markers: <|im_end|> alone at c090b69, then "\n"
        raise ValueError(f"commit={commit!r} takes that commit's markers, marker_ids(tokenizer, newline="
                         f"{commit == 'd65ef2c'}) (eos_ids {'<|im_end|> alone' if commit == 'c090b69' else '<|im_end|> then the newline'}); "
                         f"got eos_ids {eos}: the other commit's, which would shift every label by one.")
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
