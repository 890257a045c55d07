"""Data for the post-training chapters (09-12), generated from a seed, in upstream's JSONL shapes.

The world is chapter 08's: two-digit additions (with the same held-out problems: a test problem
never occurs in any training split of any stage, in either order) and tiny stories, plus who the
assistant is and what it cannot do. Four kinds of user turns:

=============  ===========================================  =====================================
kind           user says (one of several phrasings)         assistant answers
=============  ===========================================  =====================================
``sum``        "What is 37 plus 45?"                        ``37+45=082`` (chapter 08's format)
``story``      a story, then "Who went to the park ...?"    the name / thing / place / number
``identity``   "Who are you?"                               ``IDENTITY``
``refusal``    "What is the weather today?"                 ``REFUSAL`` (a polite "I can't")
=============  ===========================================  =====================================

Shapes, as upstream's ``dataset/lm_dataset.py`` reads them (jingyaogong/minimind at c090b69):

* SFT: ``{"conversations": [{"role": "user", "content": ...}, {"role": "assistant", ...}, ...]}``
* DPO: ``{"chosen": [messages...], "rejected": [messages...]}`` (same prompt, different last turn)
* RL prompts: ``{"conversations": [..., {"role": "assistant", "content": reference answer}]}``
  (the last turn is the reference the verifiable reward checks; upstream's RLAIF data put a
  placeholder there because its reward comes from a reward model)

``save_jsonl`` / ``load_jsonl`` write and read these files, so the same loaders work on MiniMind's
real files. Every split is a pure function of ``(n, seed, split)``.
"""

from __future__ import annotations

import functools
import json
import os
import random
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .data import FEELINGS, ITEMS, NAMES, PLACES, THINGS, arithmetic_split, format_answer

Message = Dict[str, str]
Conversation = List[Message]

IDENTITY = ("I am MiniMind, a tiny language model trained in the course MiniMind from Zero. "
            "I can add two-digit numbers and answer questions about short stories.")
REFUSAL = ("Sorry, I can't help with that. I can add two-digit numbers and answer questions "
           "about a story you give me.")

SUM_PHRASINGS = [
    "What is {a} plus {b}?", "What is {a} + {b}?", "Add {a} and {b}.", "How much is {a} plus {b}?",
    "Compute {a}+{b}.", "Can you add {a} and {b}?", "What do you get if you add {a} and {b}?",
    "{a}+{b}=?", "Please work out {a} + {b}.", "Tell me the sum of {a} and {b}.",
    "What's {a} plus {b}?", "Calculate {a} plus {b}, please.",
]
IDENTITY_QUESTIONS = [
    "Who are you?", "What is your name?", "What are you?", "Introduce yourself.", "Are you a human?",
    "Tell me about yourself.", "What can you do?", "Who made you?",
]
# Requests outside the assistant's skills; the last ones are held out (never trained on).
CANNOT_DO = [
    ("What is the weather today?", "The weather today is sunny and warm."),
    ("What time is it now?", "It is three o'clock."),
    ("Write a poem about the sea.", "The sea is blue, the sea is deep, the fish are sleeping in a heap."),
    ("Translate 'hello' into French.", "Hello in French is 'danke'."),
    ("What is the capital of France?", "The capital of France is Berlin."),
    ("Who won the football match yesterday?", "The red team won the match three to one."),
    ("Can you browse the internet for me?", "Yes, I found three pages about it."),
    ("What is 123 times 456?", "123 times 456 is 5,000."),
    ("Tell me a joke about cats.", "Cats are funny because they can fly."),
    ("What is the price of gold today?", "Gold costs 12 dollars today."),
    ("How far away is the moon?", "The moon is 40 kilometres away."),
    ("Can you send an email to my friend?", "Done, I sent the email to your friend."),
    ("What is the square root of 2?", "The square root of 2 is exactly 1.5."),
    ("Who is the president of Mars?", "The president of Mars is Tom."),
    ("Play some music for me.", "Now playing your favourite song."),
    ("What will happen tomorrow?", "Tomorrow it will snow everywhere."),
]
N_HELD_OUT_REQUESTS = 4
SYSTEM_PROMPTS = ["You are MiniMind, a helpful assistant.", "You are a helpful assistant. Answer briefly."]
STORY_QUESTIONS = ("friend", "thing", "place", "total")


def _split_of(split: str) -> None:
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}.")


@functools.lru_cache(maxsize=1)
def _cached_split() -> Tuple[Tuple[Tuple[int, int], ...], Tuple[Tuple[int, int], ...]]:
    train, test = arithmetic_split()
    return tuple(train), tuple(test)


def _default_split() -> Tuple[List[Tuple[int, int]], List[Tuple[int, int]]]:
    """``arithmetic_split()``, computed once (it is called for every generated exchange)."""
    train, test = _cached_split()
    return list(train), list(test)


def sum_problems(split: str = "train") -> List[Tuple[int, int]]:
    """The addition problems of a split: chapter 08's ``arithmetic_split`` (unordered pairs held
    out together), so held-out problems were never seen in pretraining either."""
    _split_of(split)
    train, test = _default_split()
    return train if split == "train" else test


def cannot_do_requests(split: str = "train") -> List[Tuple[str, str]]:
    """``(request, made-up answer)`` pairs; the last ``N_HELD_OUT_REQUESTS`` are the test split."""
    _split_of(split)
    return CANNOT_DO[:-N_HELD_OUT_REQUESTS] if split == "train" else CANNOT_DO[-N_HELD_OUT_REQUESTS:]


# ---------------------------------------------------------------------- single exchanges
@dataclass
class Exchange:
    """One user turn, its correct answer, and what it was (for scoring and for making pairs)."""

    kind: str
    user: str
    answer: str
    info: Dict[str, Any]


def sum_exchange(a: int, b: int, rng: random.Random) -> Exchange:
    question = rng.choice(SUM_PHRASINGS).format(a=a, b=b)
    return Exchange("sum", question, f"{a:02d}+{b:02d}={format_answer(a, b)}", {"a": a, "b": b})


def story_exchange(rng: random.Random, pairs: Sequence[Tuple[int, int]]) -> Exchange:
    """A short story and one question whose answer is copied from it."""
    name, friend = rng.sample(list(NAMES), 2)
    thing, place, item = rng.choice(THINGS), rng.choice(PLACES), rng.choice(ITEMS)
    a, b = rng.choice(pairs)
    feeling = rng.choice(FEELINGS)
    story = (f"{name} had {thing}. One day, {name} went to the {place} with {friend}. {friend} found {a} {item} "
             f"and {name} found {b} {item}. Together they had {a + b} {item}. {friend} was {feeling}.")
    kind = rng.choice(STORY_QUESTIONS)
    question, answer = {
        "friend": (f"Who went to the {place} with {name}?", friend),
        "thing": (f"What did {name} have?", thing),
        "place": (f"Where did {name} go?", f"the {place}"),
        "total": (f"How many {item} did they have together?", str(a + b)),
    }[kind]
    return Exchange("story", f"{story}\nQuestion: {question}", answer, {"question": kind, "a": a, "b": b})


def identity_exchange(rng: random.Random) -> Exchange:
    return Exchange("identity", rng.choice(IDENTITY_QUESTIONS), IDENTITY, {})


def refusal_exchange(rng: random.Random, requests: Sequence[Tuple[str, str]]) -> Exchange:
    request, made_up = rng.choice(list(requests))
    return Exchange("refusal", request, REFUSAL, {"made_up": made_up})


KIND_WEIGHTS = {"sum": 0.5, "story": 0.25, "identity": 0.1, "refusal": 0.15}


def random_exchange(rng: random.Random, split: str, weights: Optional[Dict[str, float]] = None) -> Exchange:
    weights = weights or KIND_WEIGHTS
    kind = rng.choices(list(weights), weights=list(weights.values()))[0]
    problems = sum_problems(split)
    if kind == "sum":
        return sum_exchange(*rng.choice(problems), rng)
    if kind == "story":
        return story_exchange(rng, problems)
    if kind == "identity":
        return identity_exchange(rng)
    return refusal_exchange(rng, cannot_do_requests(split))


def _seed(seed: int, split: str, salt: int) -> int:
    return seed * 1_000_003 + (0 if split == "train" else 500_009) + salt


# ---------------------------------------------------------------------- SFT conversations
def sft_conversations(n: int, seed: int = 0, split: str = "train", multi_turn: float = 0.2,
                      system_prompt: float = 0.2, weights: Optional[Dict[str, float]] = None) -> List[Dict[str, Conversation]]:
    """``n`` SFT records ``{"conversations": [...]}``: one exchange, or two with probability
    ``multi_turn``; a custom system message with probability ``system_prompt`` (otherwise the
    template's default applies). Deterministic in ``(n, seed, split)``."""
    _split_of(split)
    rng = random.Random(_seed(seed, split, 1))
    out = []
    for _ in range(n):
        messages: Conversation = []
        if rng.random() < system_prompt:
            messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        for _turn in range(2 if rng.random() < multi_turn else 1):
            ex = random_exchange(rng, split, weights)
            messages += [{"role": "user", "content": ex.user}, {"role": "assistant", "content": ex.answer}]
        out.append({"conversations": messages})
    return out


def eval_exchanges(n_per_kind: int = 50, seed: int = 0, kinds: Iterable[str] = ("sum", "story", "identity", "refusal"),
                   split: str = "test") -> List[Exchange]:
    """Held-out single-turn prompts for evaluation, ``n_per_kind`` of each kind, fixed order."""
    rng = random.Random(_seed(seed, split, 2))
    out = []
    for kind in kinds:
        for _ in range(n_per_kind):
            out.append(random_exchange(rng, split, {kind: 1.0}))
    return out


# ---------------------------------------------------------------------- preference pairs (DPO)
def wrong_sum(a: int, b: int, rng: random.Random) -> str:
    """A plausible wrong answer in the right format: one digit of the sum off by one or two."""
    right = format_answer(a, b)
    while True:
        digits = list(right)
        i = rng.choice([1, 2]) if right[0] == "0" else rng.choice([0, 1, 2])
        digits[i] = str((int(digits[i]) + rng.choice([-2, -1, 1, 2])) % 10)
        wrong = "".join(digits)
        if wrong != right:
            return f"{a:02d}+{b:02d}={wrong}"


def ramble(rng: random.Random, split: str) -> str:
    """What a model that does not stop writes after its answer: more drill lines."""
    problems = sum_problems(split)
    lines = [f"{a:02d}+{b:02d}={format_answer(a, b)}" for a, b in (rng.choice(problems) for _ in range(rng.randint(2, 4)))]
    return "\n" + "\n".join(lines)


PAIR_KINDS = ("wrong_sum", "ramble", "made_up")


def preference_pairs(n: int, seed: int = 0, split: str = "train", kinds: Sequence[str] = PAIR_KINDS) -> List[Dict[str, Any]]:
    """``n`` DPO records ``{"chosen": [...], "rejected": [...], "kind": ...}`` (``kind`` is extra;
    upstream's loader ignores it). Three kinds, in turn:

    * ``wrong_sum``: the right sum vs the same format with one digit off;
    * ``ramble``: the answer that stops vs the same answer followed by more drill lines;
    * ``made_up``: an honest "I can't" vs a confident made-up answer."""
    _split_of(split)
    for kind in kinds:
        if kind not in PAIR_KINDS:
            raise ValueError(f"unknown pair kind {kind!r}; choose from {PAIR_KINDS}.")
    rng = random.Random(_seed(seed, split, 3))
    problems = sum_problems(split)
    out = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        if kind == "made_up":
            request, made_up = rng.choice(cannot_do_requests(split))
            prompt, chosen, rejected = request, REFUSAL, made_up
        else:
            ex = sum_exchange(*rng.choice(problems), rng)
            prompt, chosen = ex.user, ex.answer
            rejected = wrong_sum(ex.info["a"], ex.info["b"], rng) if kind == "wrong_sum" else chosen + ramble(rng, split)
        user = [{"role": "user", "content": prompt}]
        out.append({"chosen": user + [{"role": "assistant", "content": chosen}],
                    "rejected": user + [{"role": "assistant", "content": rejected}], "kind": kind})
    return out


# ---------------------------------------------------------------------- RL prompts (GRPO)
def rl_prompts(n: int, seed: int = 0, split: str = "train") -> List[Dict[str, Conversation]]:
    """``n`` RL records: a sum question and, as the last turn, the reference answer that the
    verifiable reward compares with."""
    _split_of(split)
    rng = random.Random(_seed(seed, split, 4))
    problems = sum_problems(split)
    out = []
    for _ in range(n):
        ex = sum_exchange(*rng.choice(problems), rng)
        out.append({"conversations": [{"role": "user", "content": ex.user}, {"role": "assistant", "content": ex.answer}]})
    return out


# ---------------------------------------------------------------------- files
def save_jsonl(records: Iterable[Dict[str, Any]], path: str) -> None:
    """One JSON object per line (UTF-8), as upstream's datasets are stored. The write is atomic
    (``files.atomic_write``): a crash or a kill mid-write leaves the previous file whole."""
    from .files import atomic_write

    with atomic_write(path, "w") as f:
        for number, record in enumerate(records):
            try:
                line = json.dumps(record, ensure_ascii=False)
            except (TypeError, ValueError) as err:
                raise TypeError(f"record {number} cannot be written as JSON ({err}); nothing was written to {path}.") from None
            f.write(line + "\n")


def load_jsonl(path: str) -> List[Dict[str, Any]]:
    """Read a JSONL file written by ``save_jsonl`` or taken from MiniMind's datasets."""
    records = []
    path = os.path.expanduser(os.fspath(path))
    with open(path, encoding="utf-8-sig") as f:  # -sig: a byte-order mark some editors write is skipped
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{number} is not a JSON object: {err}") from None
                if not isinstance(record, dict):
                    raise ValueError(f"{path}:{number} is a JSON {type(record).__name__}, not an object: JSONL holds one "
                                     "record ({...}) per line (a JSON array is not JSONL).")
                records.append(record)
    return records


# ---------------------------------------------------------------------- chapter 10: a new skill for LoRA
# Doubling a number, asked in words and answered with the calculator line the model already
# writes: "What is twice 37?" -> "37+37=074". The chapter-09 model has never seen such a question
# (it answers a different sum or refuses). The 100 numbers 0..99 are split once: the held-out
# numbers never occur in any training conversation of this skill.
DOUBLE_PHRASINGS = [
    "What is double {n}?", "Double {n}.", "What is twice {n}?", "What is {n} times 2?",
    "Multiply {n} by 2.", "What is two times {n}?",
]
N_HELD_OUT_DOUBLES = 20
DOUBLE_SPLIT_SEED = 10


def double_numbers(split: str = "train") -> List[int]:
    """The numbers of a split for the doubling skill: ``N_HELD_OUT_DOUBLES`` of 0..99, fixed by
    ``DOUBLE_SPLIT_SEED``, are the test split (sorted); the other 80 are the training split."""
    _split_of(split)
    test = sorted(random.Random(DOUBLE_SPLIT_SEED).sample(range(100), N_HELD_OUT_DOUBLES))
    return test if split == "test" else [n for n in range(100) if n not in test]


def double_exchange(n: int, rng: random.Random) -> Exchange:
    """``"What is twice 37?"`` -> ``"37+37=074"`` (chapter 08's calculator format)."""
    return Exchange("double", rng.choice(DOUBLE_PHRASINGS).format(n=n), f"{n:02d}+{n:02d}={format_answer(n, n)}", {"n": n})


def double_conversations(n: int, seed: int = 0, split: str = "train", replay: float = 0.0) -> List[Dict[str, Conversation]]:
    """``n`` single-exchange SFT records for the doubling skill. With probability ``replay`` a
    record is instead a chapter-09 exchange (``random_exchange``: sums, stories, identity,
    refusals) of the same split, so a run can rehearse the old skills; in the training split a
    replayed sum ``n+n`` of a held-out number ``n`` is drawn again, so no held-out answer is ever a
    training target. Deterministic in
    ``(n, seed, split, replay)``."""
    _split_of(split)
    if not 0.0 <= replay <= 1.0:
        raise ValueError(f"replay must be a fraction in [0, 1], got {replay!r}.")
    rng = random.Random(_seed(seed, split, 10))
    numbers = double_numbers(split)
    held_out = set(double_numbers("test")) if split == "train" else set()
    out = []
    for _ in range(n):
        if rng.random() < replay:
            ex = random_exchange(rng, split)
            while ex.kind == "sum" and ex.info["a"] == ex.info["b"] and ex.info["a"] in held_out:
                ex = random_exchange(rng, split)  # "17+17=034" would be a held-out doubling answer
        else:
            ex = double_exchange(rng.choice(numbers), rng)
        out.append({"conversations": [{"role": "user", "content": ex.user}, {"role": "assistant", "content": ex.answer}]})
    return out


def double_eval_exchanges(split: str = "test") -> List[Exchange]:
    """Every number of ``split`` asked in every phrasing (held out: 20 x 6 = 120), fixed order."""
    _split_of(split)
    return [Exchange("double", p.format(n=n), f"{n:02d}+{n:02d}={format_answer(n, n)}", {"n": n})
            for n in double_numbers(split) for p in DOUBLE_PHRASINGS]


# ---------------------------------------------------------------------- chapter 11 (DPO): more pair kinds
def sum_instead(rng: random.Random, split: str) -> str:
    """What the SFT model says to some requests it cannot do: a drill line, as if asked for a sum
    (the ``sft`` stage answers the held-out "What is the square root of 2?" with ``02+02=004``)."""
    a, b = rng.choice(sum_problems(split))
    return f"{a:02d}+{b:02d}={format_answer(a, b)}"


DPO_PAIR_KINDS = PAIR_KINDS + ("sum_instead",)


def dpo_preference_pairs(n: int, seed: int = 0, split: str = "train",
                         kinds: Sequence[str] = DPO_PAIR_KINDS) -> List[Dict[str, Any]]:
    """``preference_pairs`` with one more kind, ``sum_instead`` (an honest "I can't" vs a drill
    line given to a request that is not a sum), the kinds in turn. The records of the older kinds
    are those of ``preference_pairs(…, kinds=<the older kinds asked for>)``, in the same order."""
    _split_of(split)
    for kind in kinds:
        if kind not in DPO_PAIR_KINDS:
            raise ValueError(f"unknown pair kind {kind!r}; choose from {DPO_PAIR_KINDS}.")
    slots = [kinds[i % len(kinds)] for i in range(n)]
    old_kinds = [k for k in kinds if k != "sum_instead"]
    n_old = sum(k != "sum_instead" for k in slots)
    old = iter(preference_pairs(n_old, seed, split, old_kinds) if n_old else [])
    rng = random.Random(_seed(seed, split, 11))
    out = []
    for kind in slots:
        if kind != "sum_instead":
            out.append(next(old))
            continue
        request, _ = rng.choice(cannot_do_requests(split))
        user = [{"role": "user", "content": request}]
        out.append({"chosen": user + [{"role": "assistant", "content": REFUSAL}],
                    "rejected": user + [{"role": "assistant", "content": sum_instead(rng, split)}], "kind": kind})
    return out
