"""Training data for the capstone: a corpus the project generates itself, and packed datasets.

The generated corpus mixes two kinds of documents, both deterministic functions of a seed:

* **stories**: tiny templated stories ("Once upon a time, Mia had a blue kite. ...") - enough
  repeated words for BPE to learn merges and for the model to learn grammar-like structure;
* **drills**: lines of two-digit addition, in fixed width: ``"37+45=082"``, ``"07+05=012"``.

The addition problems are split once into a training and a held-out test set
(``arithmetic_split``), by unordered pair: ``a+b`` and ``b+a`` fall on the same side. Test
problems never appear in the training corpus (neither in drills nor inside stories, in either
order), so accuracy on them measures a learned skill, not memorization.

Any text file works instead: ``read_text_documents(path)`` splits it into documents at blank
lines. ``encode_documents`` turns documents into one token stream (``<|im_start|> doc <|im_end|>``
per document, as MiniMind's pretraining samples are framed) and ``PackedDataset`` cuts the stream
into equal windows, so no position is padding. ``global_batch_indices`` picks the examples of a
step from ``(seed, step)`` alone, which makes resuming and multi-process training exact.
"""

from __future__ import annotations

import numbers
import os
import random
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from .tokenizer import BOS_ID, EOS_ID

Problem = Tuple[int, int]

# ---------------------------------------------------------------------- arithmetic
def arithmetic_split(max_operand: int = 99, test_fraction: float = 0.05, seed: int = 1234) -> Tuple[List[Problem], List[Problem]]:
    """All problems ``a+b`` with ``0 <= a, b <= max_operand``, split into ``(train, test)``.

    The split holds out **unordered** pairs: ``a+b`` and ``b+a`` are always on the same side, so
    a model cannot pass a test problem by having learned its swapped twin. The unordered pairs are
    shuffled with ``seed`` and taken for the test set until it holds at least ``test_fraction`` of
    all problems; both lists come back shuffled. Deterministic."""
    unordered = [(a, b) for a in range(max_operand + 1) for b in range(a, max_operand + 1)]
    rng = random.Random(seed)
    rng.shuffle(unordered)
    n_total = (max_operand + 1) ** 2
    n_test_target = max(1, int(round(n_total * test_fraction)))
    test: List[Problem] = []
    k = 0
    while len(test) < n_test_target:
        a, b = unordered[k]
        test.extend([(a, b)] if a == b else [(a, b), (b, a)])
        k += 1
    train = [p for a, b in unordered[k:] for p in ([(a, b)] if a == b else [(a, b), (b, a)])]
    rng.shuffle(test)
    rng.shuffle(train)
    return train, test


def format_problem(a: int, b: int, answer: bool = True) -> str:
    """Fixed width, like a calculator display: ``"07+45=052"`` (or the prompt ``"07+45="`` with
    ``answer=False``). Every digit keeps its place, which makes the carry easier to learn."""
    return f"{a:02d}+{b:02d}=" + (format_answer(a, b) if answer else "")


def format_answer(a: int, b: int) -> str:
    """The answer as the drills write it: ``"052"`` for 7+45."""
    return f"{a + b:03d}"


# ---------------------------------------------------------------------- stories
NAMES = {"Tom": "he", "Mia": "she", "Sam": "he", "Lily": "she", "Ben": "he", "Anna": "she",
         "Max": "he", "Zoe": "she", "Leo": "he", "Emma": "she", "Jack": "he", "Lucy": "she"}
THINGS = ["a red ball", "a small dog", "a blue kite", "a big box", "a green frog", "a little cat",
          "a yellow hat", "a toy car", "a shiny stone", "a funny book"]
PLACES = ["park", "garden", "house", "forest", "beach", "school", "river", "farm"]
ITEMS = ["apples", "cookies", "eggs", "shells", "coins", "flowers", "stars", "cards"]
FEELINGS = ["happy", "sad", "excited", "tired", "surprised", "proud"]
WEATHER = ["The sun was warm.", "It was a rainy day.", "The sky was blue.", "The wind was cold.",
           "Snow covered the ground.", "Birds were singing in the trees."]
FOODS = ["cake", "bread", "soup", "rice", "fish", "pancakes", "cherries", "milk"]
ENDINGS = ["The end.", "And they lived happily ever after.", "It was the best day ever."]


def make_story(rng: random.Random, pairs: Sequence[Problem]) -> str:
    """One templated story; its one sum uses a problem from ``pairs`` (the training problems)."""
    name, friend = rng.sample(list(NAMES), 2)
    he = NAMES[name]
    thing, place, item = rng.choice(THINGS), rng.choice(PLACES), rng.choice(ITEMS)
    a, b = rng.choice(pairs)
    sentences = [f"Once upon a time, {name} had {thing}."]
    if rng.random() < 0.5:
        sentences.append(rng.choice(WEATHER))
    sentences.append(f"{he.capitalize()} liked to play with it at the {place}.")
    sentences.append(f"One day, {name} went to the {place} with {friend}.")
    if rng.random() < 0.7:
        sentences.append(f"{friend} found {a} {item} and {name} found {b} {item}. Together they had {a + b} {item}.")
    if rng.random() < 0.4:
        sentences.append(f"They sang a song and ate some {rng.choice(FOODS)}.")
    feeling = rng.choice(FEELINGS)
    sentences.append(f"{friend} was very {feeling}, and {name} was {feeling} too.")
    if rng.random() < 0.3:
        sentences.append(f"At night, {name} went to bed and dreamed about {'his' if he == 'he' else 'her'} friend.")
    sentences.append(rng.choice(ENDINGS))
    return " ".join(sentences)


def make_drill(rng: random.Random, pairs: Sequence[Problem], lines: int = 8) -> str:
    """``lines`` addition problems with their answers, one per line."""
    return "\n".join(format_problem(*rng.choice(pairs)) for _ in range(lines))


def make_corpus(n_docs: int = 20000, seed: int = 0, story_fraction: float = 0.5,
                pairs: Optional[Sequence[Problem]] = None) -> List[str]:
    """``n_docs`` documents (stories and drills, shuffled), deterministic in ``seed``.

    ``pairs`` are the addition problems allowed in it (default: the training half of
    ``arithmetic_split()``, so the held-out problems never occur)."""
    if pairs is None:
        pairs = arithmetic_split()[0]
    rng = random.Random(seed)
    return [make_story(rng, pairs) if rng.random() < story_fraction else make_drill(rng, pairs) for _ in range(n_docs)]


def read_text_documents(path: str, min_chars: int = 1) -> List[str]:
    """Documents of any UTF-8 text file: paragraphs separated by blank lines (a file without
    blank lines is one document per line). A file in another encoding is a ``ValueError`` naming
    it (a byte-order mark is skipped)."""
    try:
        with open(os.path.expanduser(os.fspath(path)), encoding="utf-8-sig") as f:
            text = f.read()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start}; Latin-1 or another encoding?): "
                         "re-save it as UTF-8, e.g. iconv -f latin1 -t utf-8 in > out.") from None
    blocks = [b.strip() for b in text.split("\n\n")]
    if len(blocks) <= 1:
        blocks = [line.strip() for line in text.splitlines()]
    docs = [b for b in blocks if len(b) >= min_chars]
    if not docs:
        raise ValueError(f"{path} holds no text.")
    return docs


# ---------------------------------------------------------------------- tokens and datasets
def encode_documents(tokenizer, docs: Iterable[str], bos_id: int = BOS_ID, eos_id: int = EOS_ID) -> torch.Tensor:
    """One long token stream: ``[bos] doc_1 [eos] [bos] doc_2 [eos] ...`` as a 1-D ``torch.long``.

    A document's text is encoded as plain text: a literal ``<|im_end|>`` in it stays those
    characters (``tokenizer.encode_special_tokens``), so only the framing ids are special. With a
    tokenizer that cannot do that, a document whose text encodes to a framing id is a ``ValueError``."""
    docs = list(docs)
    previous = getattr(tokenizer, "encode_special_tokens", None)
    if previous is not None:
        tokenizer.encode_special_tokens = True
    try:
        encodings = tokenizer.encode_batch(docs)
    finally:
        if previous is not None:
            tokenizer.encode_special_tokens = previous
    ids: List[int] = []
    for n, enc in enumerate(encodings):
        if previous is None and {bos_id, eos_id} & set(enc.ids):
            raise ValueError(f"document {n} contains the text of a special token (ids {bos_id}/{eos_id}, e.g. "
                             f"'<|im_end|>'): {docs[n][:60]!r}; this tokenizer cannot encode it as plain text.")
        ids.append(bos_id)
        ids.extend(enc.ids)
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.long)


class PackedDataset(torch.utils.data.Dataset):
    """Non-overlapping windows of ``seq_len`` tokens of a stream. Item ``i`` is
    ``(input_ids, labels)`` with ``labels == input_ids``: the model shifts them (position ``t``
    predicts token ``t+1``), so a window of ``seq_len`` tokens trains ``seq_len - 1`` predictions.
    The last partial window is dropped; nothing is padding."""

    def __init__(self, stream: torch.Tensor, seq_len: int) -> None:
        if not isinstance(stream, torch.Tensor):
            raise TypeError(f"stream must be a 1-D torch.Tensor of token ids, got {type(stream).__name__}.")
        if stream.dim() != 1:
            raise ValueError(f"stream must be 1-D, got shape {tuple(stream.shape)}.")
        if isinstance(seq_len, bool) or not isinstance(seq_len, numbers.Integral) or seq_len < 2:
            raise ValueError(f"seq_len must be an int >= 2 (a window of seq_len tokens trains seq_len - 1 "
                             f"predictions), got {seq_len!r}.")
        seq_len = int(seq_len)
        n = stream.numel() // seq_len
        if n == 0:
            raise ValueError(f"the stream has {stream.numel()} tokens, fewer than one window of seq_len={seq_len}.")
        self.seq_len = seq_len
        self.data = stream[: n * seq_len].view(n, seq_len)

    def __len__(self) -> int:
        return self.data.shape[0]

    def __getitem__(self, i):
        x = self.data[i]
        return x, x

    def batch(self, indices: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, labels)`` of the rows ``indices``, both ``[len(indices), seq_len]``."""
        x = self.data[indices]
        return x, x


_PERMS: Dict[Tuple[int, int, int], torch.Tensor] = {}


def _epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    key = (n, seed, epoch)
    if key not in _PERMS:
        # a run needs one or two epochs' permutations at a time; a large dataset's (8 bytes a window)
        # must not pile up over a long run
        if len(_PERMS) > 64 or sum(p.numel() for p in _PERMS.values()) + n > 1 << 24:
            _PERMS.clear()
        g = torch.Generator().manual_seed(seed * 100_003 + epoch)
        _PERMS[key] = torch.randperm(n, generator=g)
    return _PERMS[key]


def global_batch_indices(n: int, batch_size: int, step: int, seed: int = 0) -> torch.Tensor:
    """Indices of the ``batch_size`` examples of optimizer step ``step`` (0-based).

    Sample ``g = step * batch_size + j`` is example ``perm_e[g % n]`` of epoch ``e = g // n``, with
    a fresh permutation per epoch drawn from ``(seed, e)``. No sampler state: a resumed run and
    every process of a distributed run compute the same batch from the step number alone."""
    for name, value, low in (("n", n, 1), ("batch_size", batch_size, 1), ("step", step, 0)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            raise ValueError(f"{name} must be an int >= {low}" + (" (the dataset is empty)" if name == "n" else "")
                             + f", got {value!r}.")
    g = torch.arange(step * batch_size, (step + 1) * batch_size)
    epochs, pos = g // n, g % n
    out = torch.empty(batch_size, dtype=torch.long)
    for e in epochs.unique().tolist():
        sel = epochs == e
        out[sel] = _epoch_permutation(n, seed, e)[pos[sel]]
    return out


def shard(indices: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This process's contiguous share of a global batch (``len(indices)`` must divide evenly)."""
    if len(indices) % world_size != 0:
        raise ValueError(f"global batch {len(indices)} is not divisible by world size {world_size}.")
    per = len(indices) // world_size
    return indices[rank * per : (rank + 1) * per]
