"""Data for the post-training chapters (09-12), generated from a seed, in upstream's JSONL shapes.

The world is chapter 08's: two-digit additions and tiny stories, plus who the assistant is and
what it cannot do. Four kinds of user turns:

=============  ===========================================  =====================================
kind           user says (one of several phrasings)         assistant answers
=============  ===========================================  =====================================
``sum``        "What is 37 plus 45?"                        ``37+45=082`` (chapter 08's format)
``story``      a story, then "Who went to the park ...?"    the name / thing / place / number
``identity``   "Who are you?"                               ``IDENTITY``
``refusal``    "What is the weather in Oslo today?"         ``REFUSAL`` (a polite "I can't")
=============  ===========================================  =====================================

**Held out means held out.** Every kind has a ``"test"`` split that no stage ever trains on,
chapter 08's pretraining included:

* sums: chapter 08's held-out problems (``data.arithmetic_split``: unordered pairs, so neither
  ``a+b`` nor ``b+a`` ever occurs in any training text), asked in phrasings no training split uses;
* stories: built around held-out problems (so no held-out story text occurs in training), asked
  with question phrasings of their own;
* identity: ``IDENTITY_QUESTIONS_TEST``, paraphrases no training split uses;
* refusals: ``cannot_do_requests("test")``, requests from templates no training split uses;
* chapter 10's doubling skill: the numbers whose doubling ``n+n=2n`` never occurs in chapter 08's
  corpus (the doubles among the held-out problems), asked in every phrasing.

``heldout_exchanges(kind)`` lists each kind's fixed held-out evaluation set (distinct prompts).

Shapes, as upstream's ``dataset/lm_dataset.py`` reads them (jingyaogong/minimind):

* SFT: ``{"conversations": [{"role": "user", "content": ...}, {"role": "assistant", ...}, ...]}``
* DPO: ``{"chosen": [messages...], "rejected": [messages...]}`` (same prompt, different last turn)
* RL prompts: ``{"conversations": [..., {"role": "assistant", "content": reference answer}]}``
  (the last turn is the reference the verifiable reward checks; upstream's RLAIF data leave it
  blank because the policy samples the reply during training (``d65ef2c:README_en.md:479``), and
  its reward model needs no reference answer)

``save_jsonl`` / ``load_jsonl`` write and read these files, so the same loaders work on MiniMind's
real files (``load_jsonl`` reads a file whole; for upstream's files at full size,
``datafiles.JsonlRecords(path, "sft" | "dpo" | "rlaif")`` reads one record at a time and checks
each, naming the file and line of a malformed one). Every split is a pure function of
``(n, seed, split)``.
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .data import FEELINGS, ITEMS, NAMES, PLACES, THINGS, arithmetic_split, format_answer

Message = Dict[str, str]
Conversation = List[Message]
SPLITS = ("train", "test")
KINDS = ("sum", "story", "identity", "refusal")

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
# held out: no training split uses these
SUM_PHRASINGS_TEST = [
    "What is the sum of {a} and {b}?", "Add up {a} and {b}.", "{a} plus {b} is how much?",
    "Could you add {a} to {b}?", "Find {a} + {b}.", "How much do {a} and {b} make together?",
    "Work out {a} plus {b}.", "I need {a} + {b}.",
]
IDENTITY_QUESTIONS = [
    "Who are you?", "What is your name?", "What are you?", "Introduce yourself.", "Are you a human?",
    "Tell me about yourself.", "What can you do?", "Who made you?",
]
# held out: paraphrases no training split uses
IDENTITY_QUESTIONS_TEST = [
    "What should I call you?", "Which model am I talking to?", "Are you a robot?", "What kind of program are you?",
    "Who built you?", "What do you know how to do?", "Tell me who you are.", "Describe yourself.",
    "Do you have a name?", "Who am I talking to?", "Are you a person or a machine?", "What are your skills?",
    "Please introduce yourself.", "What can you help me with?", "Who created you?", "What is your purpose?",
    "Say who you are.", "Hello, who is this?", "Are you an AI?", "What are you good at?", "Who trained you?",
    "Give me a short introduction of yourself.",
]

# Requests outside the assistant's skills, each with a confident made-up answer (the rejected side
# of a DPO pair). A template and its fillers give many distinct requests; the test split's
# templates are never used by a training split.
_CITIES = ("Paris", "London", "Tokyo", "Cairo", "Lima", "Oslo", "Delhi", "Rome")
_TOPICS = ("the sea", "the moon", "winter", "a garden", "the city", "friendship")
_LANGUAGES = ("French", "German", "Spanish", "Japanese", "Italian")
_WORDS = ("hello", "thank you", "good night", "apple", "book")
_COUNTRIES = ("France", "Japan", "Brazil", "Kenya", "Canada", "Norway")
_THINGS = ("gold", "bread", "oil", "coffee", "silver", "rice")
_PEOPLE = ("my friend", "my teacher", "my brother", "my boss", "Anna")
_SPORTS = ("football", "tennis", "basketball", "hockey")
_ANIMALS = ("cats", "dogs", "ducks", "horses", "fish")
_ROOMS = ("kitchen", "bedroom", "garage", "living room", "office")
_HOURS = ("six", "seven", "eight", "nine", "ten")
_GENRES = ("jazz", "rock", "classical", "pop")
_FAR = ("the moon", "the sun", "Mars", "the nearest star", "the ocean floor")

CANNOT_DO_TEMPLATES: Dict[str, List[Tuple[str, str, Sequence[str]]]] = {
    "train": [
        ("What is the weather in {x} today?", "The weather in {x} is sunny and warm today.", _CITIES),
        ("What time is it in {x} now?", "It is three o'clock in {x}.", _CITIES[:6]),
        ("Write a poem about {x}.", "Oh {x}, so blue and deep, the fish are sleeping in a heap.", _TOPICS),
        ("Translate '{x}' into French.", "'{x}' in French is 'danke'.", _WORDS),
        ("What is the capital of {x}?", "The capital of {x} is Berlin.", _COUNTRIES),
        ("Who won the {x} match yesterday?", "The red team won the {x} match three to one.", _SPORTS),
        ("Can you send an email to {x}?", "Done, I sent the email to {x}.", _PEOPLE),
        ("What is the price of {x} today?", "{X} costs 12 dollars today.", _THINGS),
        ("Tell me a joke about {x}.", "{X} are funny because they can fly.", _ANIMALS),
        ("How far away is {x}?", "{X} is 40 kilometres away.", _FAR),
        ("Play some {x} music for me.", "Now playing your favourite {x} song.", _GENRES),
        ("Can you browse the internet for {x}?", "Yes, I found three pages about {x}.", _TOPICS[:4]),
    ],
    "test": [
        ("Will it rain in {x} tomorrow?", "Yes, it will rain all day in {x} tomorrow.", _CITIES[:6]),
        ("Book a table for two at a restaurant in {x}.", "Your table in {x} is booked for eight o'clock.", _CITIES[2:7]),
        ("Compose a song about {x}.", "La la la, {x}, la la la.", _TOPICS[:5]),
        ("How do you say 'good morning' in {x}?", "In {x} you say 'blimp'.", _LANGUAGES),
        ("Who is the president of {x}?", "The president of {x} is Tom.", _COUNTRIES[:5]),
        ("Set an alarm for {x} o'clock.", "Your alarm is set for {x} o'clock.", _HOURS),
        ("Turn on the lights in the {x}.", "The lights in the {x} are on now.", _ROOMS),
        ("What is the latest news about {x}?", "Today {x} was in the news three times.", _SPORTS),
        ("Draw a picture of {x}.", "Here is a picture of {x}: [picture].", _ANIMALS),
        ("Call {x} for me.", "I am calling {x} now.", _PEOPLE[:4]),
    ],
}
STORY_QUESTIONS = ("friend", "thing", "place", "total")
STORY_QUESTION_PHRASINGS: Dict[str, Dict[str, str]] = {
    "train": {"friend": "Who went to the {place} with {name}?", "thing": "What did {name} have?",
              "place": "Where did {name} go?", "total": "How many {item} did they have together?"},
    "test": {"friend": "Who was with {name} at the {place}?", "thing": "What did {name} own?",
             "place": "Where did {name} and {friend} go?", "total": "How many {item} did they find in all?"},
}
SYSTEM_PROMPTS = ["You are MiniMind, a helpful assistant.", "You are a helpful assistant. Answer briefly."]


def _split_of(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}.")


def _check_count(n: Any, name: str = "n") -> None:
    """How many records to make: an int >= 0 (a negative count made an empty list without a word)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{name} must be an int >= 0 (how many records to make), got {n!r}.")


@functools.lru_cache(maxsize=1)
def _cached_split() -> Tuple[Tuple[Tuple[int, int], ...], Tuple[Tuple[int, int], ...]]:
    train, test = arithmetic_split()
    return tuple(train), tuple(test)


def sum_problems(split: str = "train") -> List[Tuple[int, int]]:
    """The addition problems of a split: chapter 08's ``arithmetic_split`` (unordered pairs held
    out together), so held-out problems were never seen in pretraining either."""
    _split_of(split)
    train, test = _cached_split()
    return list(train if split == "train" else test)


def sum_phrasings(split: str = "train") -> List[str]:
    """The phrasings of sum questions of a split (the test split's are never trained on)."""
    _split_of(split)
    return list(SUM_PHRASINGS if split == "train" else SUM_PHRASINGS_TEST)


def identity_questions(split: str = "train") -> List[str]:
    """The identity questions of a split (the test split's paraphrases are never trained on)."""
    _split_of(split)
    return list(IDENTITY_QUESTIONS if split == "train" else IDENTITY_QUESTIONS_TEST)


@functools.lru_cache(maxsize=2)
def _requests(split: str) -> Tuple[Tuple[str, str], ...]:
    out = []
    for request, made_up, fillers in CANNOT_DO_TEMPLATES[split]:
        for x in fillers:
            out.append((request.format(x=x), made_up.format(x=x, X=x[:1].upper() + x[1:])))
    return tuple(out)


def cannot_do_requests(split: str = "train") -> List[Tuple[str, str]]:
    """``(request, made-up answer)`` pairs of a split, all distinct; the test split's come from
    templates no training split uses (``CANNOT_DO_TEMPLATES``)."""
    _split_of(split)
    return list(_requests(split))


# ---------------------------------------------------------------------- single exchanges
@dataclass
class Exchange:
    """One user turn, its correct answer, and what it was (for scoring and for making pairs)."""

    kind: str
    user: str
    answer: str
    info: Dict[str, Any]


def sum_exchange(a: int, b: int, rng: random.Random, split: str = "train") -> Exchange:
    question = rng.choice(sum_phrasings(split)).format(a=a, b=b)
    return Exchange("sum", question, f"{a:02d}+{b:02d}={format_answer(a, b)}", {"a": a, "b": b})


def story_exchange(rng: random.Random, pairs: Sequence[Tuple[int, int]], split: str = "train",
                   question: Optional[str] = None) -> Exchange:
    """A short story and one question whose answer is copied from it."""
    name, friend = rng.sample(list(NAMES), 2)
    thing, place, item = rng.choice(THINGS), rng.choice(PLACES), rng.choice(ITEMS)
    a, b = rng.choice(pairs)
    feeling = rng.choice(FEELINGS)
    story = (f"{name} had {thing}. One day, {name} went to the {place} with {friend}. {friend} found {a} {item} "
             f"and {name} found {b} {item}. Together they had {a + b} {item}. {friend} was {feeling}.")
    kind = question or rng.choice(STORY_QUESTIONS)
    asked = STORY_QUESTION_PHRASINGS[split][kind].format(place=place, name=name, friend=friend, item=item)
    answer = {"friend": friend, "thing": thing, "place": f"the {place}", "total": str(a + b)}[kind]
    return Exchange("story", f"{story}\nQuestion: {asked}", answer, {"question": kind, "a": a, "b": b})


def identity_exchange(rng: random.Random, split: str = "train") -> Exchange:
    return Exchange("identity", rng.choice(identity_questions(split)), IDENTITY, {})


def refusal_exchange(rng: random.Random, requests: Sequence[Tuple[str, str]]) -> Exchange:
    request, made_up = rng.choice(list(requests))
    return Exchange("refusal", request, REFUSAL, {"made_up": made_up})


KIND_WEIGHTS = {"sum": 0.5, "story": 0.25, "identity": 0.1, "refusal": 0.15}


def random_exchange(rng: random.Random, split: str, weights: Optional[Dict[str, float]] = None) -> Exchange:
    weights = weights or KIND_WEIGHTS
    kind = rng.choices(list(weights), weights=list(weights.values()))[0]
    problems = sum_problems(split)
    if kind == "sum":
        return sum_exchange(*rng.choice(problems), rng, split)
    if kind == "story":
        return story_exchange(rng, problems, split)
    if kind == "identity":
        return identity_exchange(rng, split)
    if kind == "refusal":
        return refusal_exchange(rng, cannot_do_requests(split))
    raise ValueError(f"unknown kind {kind!r}; the kinds are {KINDS}.")


def _seed(seed: int, split: str, salt: int) -> int:
    return seed * 1_000_003 + (0 if split == "train" else 500_009) + salt


# ---------------------------------------------------------------------- SFT conversations
def sft_conversations(n: int, seed: int = 0, split: str = "train", multi_turn: float = 0.2,
                      system_prompt: float = 0.0, weights: Optional[Dict[str, float]] = None) -> List[Dict[str, Conversation]]:
    """``n`` SFT records ``{"conversations": [...]}``: one exchange, or two with probability
    ``multi_turn``; a custom system message with probability ``system_prompt`` (default 0:
    ``sft.SFTDataset`` adds them as upstream's ``pre_processing_chat`` does). Deterministic in
    ``(n, seed, split)``."""
    _check_count(n)
    _split_of(split)
    rng = random.Random(_seed(seed, split, 1))
    out = []
    for _ in range(n):
        messages: Conversation = []
        if system_prompt and rng.random() < system_prompt:
            messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        for _turn in range(2 if rng.random() < multi_turn else 1):
            ex = random_exchange(rng, split, weights)
            messages += [{"role": "user", "content": ex.user}, {"role": "assistant", "content": ex.answer}]
        out.append({"conversations": messages})
    return out


def eval_exchanges(n_per_kind: int = 50, seed: int = 0, kinds: Iterable[str] = KINDS,
                   split: str = "test") -> List[Exchange]:
    """Single-turn prompts of ``split``, ``n_per_kind`` of each kind drawn at random (repeats
    possible), fixed order. The stage report uses ``heldout_exchanges`` (distinct prompts)."""
    rng = random.Random(_seed(seed, split, 2))
    out = []
    for kind in kinds:
        for _ in range(n_per_kind):
            out.append(random_exchange(rng, split, {kind: 1.0}))
    return out


N_HELDOUT = {"sum": 200, "story": 80}


@functools.lru_cache(maxsize=8)
def _heldout(kind: str) -> Tuple[Exchange, ...]:
    rng = random.Random(_seed(0, "test", 20 + KINDS.index(kind)))
    if kind == "sum":
        unordered = sorted({(min(a, b), max(a, b)) for a, b in sum_problems("test")})
        rng.shuffle(unordered)
        phrasings = sum_phrasings("test")
        out = []
        for n, (a, b) in enumerate(unordered[: N_HELDOUT["sum"]]):
            a, b = (a, b) if rng.random() < 0.5 else (b, a)
            out.append(Exchange("sum", phrasings[n % len(phrasings)].format(a=a, b=b),
                                f"{a:02d}+{b:02d}={format_answer(a, b)}", {"a": a, "b": b}))
        return tuple(out)
    if kind == "story":
        problems, out, seen = sum_problems("test"), [], set()
        while len(out) < N_HELDOUT["story"]:
            ex = story_exchange(rng, problems, "test", STORY_QUESTIONS[len(out) % len(STORY_QUESTIONS)])
            if ex.user not in seen:
                seen.add(ex.user)
                out.append(ex)
        return tuple(out)
    if kind == "identity":
        return tuple(Exchange("identity", q, IDENTITY, {}) for q in IDENTITY_QUESTIONS_TEST)
    if kind == "refusal":
        return tuple(Exchange("refusal", r, REFUSAL, {"made_up": m}) for r, m in cannot_do_requests("test"))
    raise ValueError(f"unknown kind {kind!r}; the kinds are {KINDS}.")


def heldout_exchanges(kind: str) -> List[Exchange]:
    """The fixed held-out evaluation set of a kind, distinct prompts never trained on by any stage:
    ``sum`` 200 held-out problems (one per unordered pair) in held-out phrasings; ``story`` 80
    stories around held-out problems, the four question kinds in turn, held-out question
    phrasings; ``identity`` every held-out paraphrase; ``refusal`` every held-out request."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; the kinds are {KINDS}.")
    return list(_heldout(kind))


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
    _check_count(n)
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
            ex = sum_exchange(*rng.choice(problems), rng, split)
            prompt, chosen = ex.user, ex.answer
            rejected = wrong_sum(ex.info["a"], ex.info["b"], rng) if kind == "wrong_sum" else chosen + ramble(rng, split)
        user = [{"role": "user", "content": prompt}]
        out.append({"chosen": user + [{"role": "assistant", "content": chosen}],
                    "rejected": user + [{"role": "assistant", "content": rejected}], "kind": kind})
    return out


# ---------------------------------------------------------------------- RL prompts (GRPO)
def rl_prompts(n: int, seed: int = 0, split: str = "train") -> List[Dict[str, Conversation]]:
    """``n`` RL records: a sum question and, as the last turn, the reference answer that the
    verifiable reward compares with (problems and phrasings of ``split``)."""
    _check_count(n)
    _split_of(split)
    rng = random.Random(_seed(seed, split, 4))
    problems = sum_problems(split)
    out = []
    for _ in range(n):
        ex = sum_exchange(*rng.choice(problems), rng, split)
        out.append({"conversations": [{"role": "user", "content": ex.user}, {"role": "assistant", "content": ex.answer}]})
    return out


def heldout_rl_prompts() -> List[Dict[str, Conversation]]:
    """``heldout_exchanges("sum")`` as RL records (200 distinct held-out problems)."""
    return [{"conversations": [{"role": "user", "content": ex.user}, {"role": "assistant", "content": ex.answer}]}
            for ex in heldout_exchanges("sum")]


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


def _numbered_lines(f: Any, path: str) -> Any:
    """``enumerate(f, 1)``, with a ``ValueError`` naming the file and the line when it is not UTF-8."""
    number = 0
    while True:
        try:
            line = f.readline()
        except UnicodeDecodeError as err:
            raise ValueError(f"{path} is not UTF-8 text (near line {number + 1}: {err.reason}; Latin-1 or another encoding?): "
                             "JSONL files are UTF-8; re-save it as UTF-8.") from None
        if not line:
            return
        number += 1
        yield number, line


def load_jsonl(path: str) -> List[Dict[str, Any]]:
    """Read a JSONL file written by ``save_jsonl`` or taken from MiniMind's datasets."""
    records = []
    path = os.path.expanduser(os.fspath(path))
    with open(path, encoding="utf-8-sig") as f:  # -sig: a byte-order mark some editors write is skipped
        for number, line in _numbered_lines(f, path):
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
# writes: "What is twice 37?" -> "37+37=074". The chapter-09 model has never seen such a question.
# The held-out numbers are the doubles among chapter 08's held-out problems: their line "n+n=2n"
# never occurs in the pretraining corpus (nor in any other training text); every other number of
# 0..99 trains the skill. Training uses DOUBLE_PHRASINGS; the held-out evaluation asks every
# held-out number in those and in DOUBLE_PHRASINGS_TEST (never trained on).
DOUBLE_PHRASINGS = [
    "What is double {n}?", "Double {n}.", "What is twice {n}?", "What is {n} times 2?",
    "Multiply {n} by 2.", "What is two times {n}?",
]
DOUBLE_PHRASINGS_TEST = [
    "What do you get if you double {n}?", "Twice {n} is how much?", "Please double {n}.",
    "What is {n} doubled?", "Give me two times {n}.", "How much is double {n}?",
]


def double_numbers(split: str = "train") -> List[int]:
    """The numbers of a split for the doubling skill: ``"test"`` = the ``n`` with ``(n, n)`` among
    chapter 08's held-out problems (never written ``n+n=2n`` in any training text, pretraining
    included), sorted; ``"train"`` = the rest of 0..99."""
    _split_of(split)
    test = sorted(a for a, b in sum_problems("test") if a == b)
    return test if split == "test" else [n for n in range(100) if n not in test]


def double_exchange(n: int, rng: random.Random, phrasings: Sequence[str] = DOUBLE_PHRASINGS) -> Exchange:
    """``"What is twice 37?"`` -> ``"37+37=074"`` (chapter 08's calculator format)."""
    return Exchange("double", rng.choice(list(phrasings)).format(n=n), f"{n:02d}+{n:02d}={format_answer(n, n)}",
                    {"n": n})


def double_conversations(n: int, seed: int = 0, split: str = "train", replay: float = 0.0) -> List[Dict[str, Conversation]]:
    """``n`` single-exchange SFT records for the doubling skill. With probability ``replay`` a
    record is instead a chapter-09 exchange (``random_exchange``: sums, stories, identity,
    refusals) of the same split, so a run can rehearse the old skills. The training split's sums
    never hold a held-out double (they are chapter 08's training problems). Deterministic in
    ``(n, seed, split, replay)``."""
    _check_count(n)
    _split_of(split)
    if not 0.0 <= replay <= 1.0:
        raise ValueError(f"replay must be a fraction in [0, 1], got {replay!r}.")
    rng = random.Random(_seed(seed, split, 10))
    numbers = double_numbers(split)
    phrasings = DOUBLE_PHRASINGS if split == "train" else DOUBLE_PHRASINGS + DOUBLE_PHRASINGS_TEST
    out = []
    for _ in range(n):
        ex = random_exchange(rng, split) if rng.random() < replay else double_exchange(rng.choice(numbers), rng, phrasings)
        out.append({"conversations": [{"role": "user", "content": ex.user}, {"role": "assistant", "content": ex.answer}]})
    return out


def double_eval_exchanges(split: str = "test") -> List[Exchange]:
    """Every number of ``split`` asked in every phrasing (``"test"``: the held-out numbers in the
    training and the held-out phrasings), fixed order."""
    _split_of(split)
    phrasings = DOUBLE_PHRASINGS + DOUBLE_PHRASINGS_TEST if split == "test" else DOUBLE_PHRASINGS
    return [Exchange("double", p.format(n=n), f"{n:02d}+{n:02d}={format_answer(n, n)}", {"n": n})
            for n in double_numbers(split) for p in phrasings]


# ---------------------------------------------------------------------- chapter 11 (DPO): more pair kinds
def sum_instead(rng: random.Random, split: str) -> str:
    """What the SFT model says to some requests it cannot do: a drill line, as if asked for a sum."""
    a, b = rng.choice(sum_problems(split))
    return f"{a:02d}+{b:02d}={format_answer(a, b)}"


DPO_PAIR_KINDS = PAIR_KINDS + ("sum_instead",)


def dpo_preference_pairs(n: int, seed: int = 0, split: str = "train",
                         kinds: Sequence[str] = DPO_PAIR_KINDS) -> List[Dict[str, Any]]:
    """``preference_pairs`` with one more kind, ``sum_instead`` (an honest "I can't" vs a drill
    line given to a request that is not a sum), the kinds in turn. The records of the older kinds
    are those of ``preference_pairs(…, kinds=<the older kinds asked for>)``, in the same order."""
    _check_count(n)
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


# ---------------------------------------------------------------------- what a text contains
_SUM_RE = re.compile(r"(\d+)\s*(?:\+|plus|and|to)\s*(\d+)")


def sums_in(text: str) -> set:
    """Every ``(a, b)`` a text writes as a sum (``37+45``, ``37 plus 45``, ``37 and 45``,
    ``37 to 45``), in the order written; for the disjointness tests."""
    return {(int(a), int(b)) for a, b in _SUM_RE.findall(text)}


def normalized(text: str) -> str:
    """Lower case, letters and digits only: two phrasings that differ only in punctuation,
    spacing or case are the same prompt."""
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()
