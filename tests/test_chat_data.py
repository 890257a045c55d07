"""The post-training data: deterministic, held-out splits that never leak (into any stage's training,
chapter 08's pretraining included), upstream's JSONL shapes."""

import re

import pytest

from minimind_ref import chat_data as cd
from minimind_ref.data import arithmetic_split, make_corpus
from minimind_ref.train import TrainConfig

HELD_OUT_SUMS = {p for a, b in arithmetic_split()[1] for p in ((a, b), (b, a))}


def _users(records):
    for record in records:
        for side in ("conversations", "chosen", "rejected"):
            for m in record.get(side, []):
                yield m["role"], m["content"]


def training_texts():
    """Every text any stage trains on, as the shipped recipes draw them (several seeds)."""
    texts = []
    for seed in (0, 1, 2):
        texts += [c for _, c in _users(cd.sft_conversations(1500, seed=seed))]
        texts += [c for _, c in _users(cd.dpo_preference_pairs(600, seed=seed))]
        texts += [c for _, c in _users(cd.rl_prompts(600, seed=seed))]
        texts += [c for _, c in _users(cd.double_conversations(1500, seed=seed, replay=0.5))]
    return texts


@pytest.fixture(scope="module")
def trained():
    return training_texts()


@pytest.fixture(scope="module")
def pretraining_corpus():
    cfg = TrainConfig.from_json("ch08_cpu")
    return make_corpus(cfg.n_docs, seed=cfg.data_seed, story_fraction=cfg.story_fraction, pairs=arithmetic_split()[0])


def test_held_out_sets_are_large_and_distinct():
    sizes = {kind: len(cd.heldout_exchanges(kind)) for kind in cd.KINDS}
    assert sizes["sum"] >= 200 and sizes["refusal"] >= 40 and sizes["identity"] >= 20 and sizes["story"] >= 50
    for kind in cd.KINDS:
        users = [cd.normalized(ex.user) for ex in cd.heldout_exchanges(kind)]
        assert len(set(users)) == len(users), kind
    pairs = [(ex.info["a"], ex.info["b"]) for ex in cd.heldout_exchanges("sum")]
    assert len({tuple(sorted(p)) for p in pairs}) == len(pairs) == 200  # 200 distinct problems, not reorderings
    assert cd.heldout_exchanges("sum") == cd.heldout_exchanges("sum")


def test_held_out_sums_never_occur_in_any_training_text_in_either_order(trained, pretraining_corpus):
    for text in trained:
        assert not cd.sums_in(text) & HELD_OUT_SUMS, text
    drills = {(int(a), int(b)) for doc in pretraining_corpus for a, b in re.findall(r"(\d\d)\+(\d\d)=", doc)}
    stories = {(int(a), int(b)) for doc in pretraining_corpus for a, b in re.findall(r"found (\d+) \w+ and \w+ found (\d+)", doc)}
    assert not (drills | stories) & HELD_OUT_SUMS
    for ex in cd.heldout_exchanges("sum"):
        assert (ex.info["a"], ex.info["b"]) in HELD_OUT_SUMS and cd.sums_in(ex.user) == {(ex.info["a"], ex.info["b"])}


def test_held_out_phrasings_and_prompts_never_occur_in_training(trained):
    trained_norm = {cd.normalized(t) for t in trained}
    for kind in ("identity", "refusal"):
        for ex in cd.heldout_exchanges(kind):
            assert cd.normalized(ex.user) not in trained_norm, ex.user
    # no training prompt is a held-out sum phrasing (with any numbers), no held-out prompt a training one
    pattern = lambda phrasings: re.compile("|".join("(?:" + re.escape(p).replace(re.escape("{a}"), r"\d+")
                                                    .replace(re.escape("{b}"), r"\d+") + ")" for p in phrasings))
    held_out, training = pattern(cd.SUM_PHRASINGS_TEST), pattern(cd.SUM_PHRASINGS)
    assert not any(held_out.fullmatch(t) for t in trained)
    assert not any(training.fullmatch(ex.user) for ex in cd.heldout_exchanges("sum"))
    assert not set(cd.SUM_PHRASINGS) & set(cd.SUM_PHRASINGS_TEST)
    assert not set(cd.IDENTITY_QUESTIONS) & set(cd.IDENTITY_QUESTIONS_TEST)
    assert not set(cd.STORY_QUESTION_PHRASINGS["train"].values()) & set(cd.STORY_QUESTION_PHRASINGS["test"].values())
    train_templates = {t for t, _, _ in cd.CANNOT_DO_TEMPLATES["train"]}
    assert not train_templates & {t for t, _, _ in cd.CANNOT_DO_TEMPLATES["test"]}


def test_held_out_stories_are_never_trained_on(trained):
    trained_set = set(trained)
    for ex in cd.heldout_exchanges("story"):
        story = ex.user.split("\nQuestion:")[0]
        assert not any(story in t for t in trained_set if "Question:" in t)
        assert (ex.info["a"], ex.info["b"]) in HELD_OUT_SUMS


def test_held_out_doubling_numbers_never_appear_doubled_in_any_training_text(trained, pretraining_corpus):
    test = cd.double_numbers("test")
    assert test and not set(test) & set(cd.double_numbers("train"))
    assert sorted(test + cd.double_numbers("train")) == list(range(100))
    for n in test:
        line = f"{n:02d}+{n:02d}="
        assert not any(line in doc for doc in pretraining_corpus), f"{line} occurs in chapter 08's corpus"
        assert not any(line in t for t in trained), f"{line} occurs in a training text"
        assert not any((n, n) in cd.sums_in(t) for t in trained)
    exchanges = cd.double_eval_exchanges("test")
    assert len(exchanges) == len(test) * (len(cd.DOUBLE_PHRASINGS) + len(cd.DOUBLE_PHRASINGS_TEST))
    assert len({ex.user for ex in exchanges}) == len(exchanges)


def test_splits_are_deterministic():
    assert cd.sft_conversations(50, seed=3) == cd.sft_conversations(50, seed=3)
    assert cd.sft_conversations(50, seed=3) != cd.sft_conversations(50, seed=4)
    assert cd.double_conversations(50, seed=3, replay=0.5) == cd.double_conversations(50, seed=3, replay=0.5)


def test_test_split_uses_held_out_problems():
    for ex in cd.eval_exchanges(30, kinds=("sum",)):
        assert (ex.info["a"], ex.info["b"]) in HELD_OUT_SUMS


def test_shapes_are_upstreams():
    sft = cd.sft_conversations(10, seed=0)[0]
    assert set(sft) == {"conversations"} and sft["conversations"][-1]["role"] == "assistant"
    for pair in cd.preference_pairs(6, seed=0):
        assert pair["chosen"][:-1] == pair["rejected"][:-1] and pair["chosen"][-1] != pair["rejected"][-1]
        assert pair["chosen"][-1]["role"] == pair["rejected"][-1]["role"] == "assistant"
    rl = cd.rl_prompts(3, seed=0)[0]["conversations"]
    assert rl[-1]["role"] == "assistant" and re.fullmatch(r"\d\d\+\d\d=\d\d\d", rl[-1]["content"])
    assert len(cd.heldout_rl_prompts()) == 200


def test_wrong_sums_are_wrong_and_well_formed():
    import random

    rng = random.Random(0)
    for a, b in arithmetic_split()[0][:300]:
        wrong = cd.wrong_sum(a, b, rng)
        assert re.fullmatch(r"\d\d\+\d\d=\d\d\d", wrong) and int(wrong[-3:]) != a + b


def test_jsonl_roundtrip(tmp_path):
    records = cd.preference_pairs(5, seed=1)
    cd.save_jsonl(records, str(tmp_path / "dpo.jsonl"))
    assert cd.load_jsonl(str(tmp_path / "dpo.jsonl")) == records
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\nnot json\n', encoding="utf-8")
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        cd.load_jsonl(str(tmp_path / "bad.jsonl"))


def test_bad_arguments():
    with pytest.raises(ValueError, match="split"):
        cd.sft_conversations(3, split="dev")
    with pytest.raises(ValueError, match="pair kind"):
        cd.preference_pairs(3, kinds=("nope",))
    with pytest.raises(ValueError, match="kind"):
        cd.heldout_exchanges("poem")
