"""The post-training data: deterministic, held-out splits that never leak, upstream's JSONL shapes."""

import re

import pytest

from minimind_ref import chat_data as cd
from minimind_ref.data import arithmetic_split


def sums_in(text):
    return {(int(a), int(b)) for a, b in re.findall(r"(\d+) ?(?:\+|plus|and) ?(\d+)", text)}


def test_splits_are_deterministic_and_disjoint():
    assert cd.sft_conversations(50, seed=3) == cd.sft_conversations(50, seed=3)
    assert cd.sft_conversations(50, seed=3) != cd.sft_conversations(50, seed=4)
    train_pairs, test_pairs = arithmetic_split()
    test = set(test_pairs) | {(b, a) for a, b in test_pairs}
    for record in cd.sft_conversations(500, seed=0) + cd.rl_prompts(200, seed=0):
        for m in record["conversations"]:
            if m["role"] == "user":
                assert not (sums_in(m["content"]) & test), m["content"]
    for record in cd.preference_pairs(300, seed=0):
        assert not (sums_in(record["chosen"][0]["content"]) & test)
    held_out = {r for r, _ in cd.cannot_do_requests("test")}
    assert not held_out & {r for r, _ in cd.cannot_do_requests("train")}
    for record in cd.sft_conversations(500, seed=0):
        assert not any(m["content"] in held_out for m in record["conversations"])


def test_test_split_uses_held_out_problems():
    _, test_pairs = arithmetic_split()
    for ex in cd.eval_exchanges(30, kinds=("sum",)):
        assert (ex.info["a"], ex.info["b"]) in set(test_pairs)


def test_shapes_are_upstreams():
    sft = cd.sft_conversations(10, seed=0)[0]
    assert set(sft) == {"conversations"} and sft["conversations"][-1]["role"] == "assistant"
    for pair in cd.preference_pairs(6, seed=0):
        assert pair["chosen"][:-1] == pair["rejected"][:-1] and pair["chosen"][-1] != pair["rejected"][-1]
        assert pair["chosen"][-1]["role"] == pair["rejected"][-1]["role"] == "assistant"
    rl = cd.rl_prompts(3, seed=0)[0]["conversations"]
    assert rl[-1]["role"] == "assistant" and re.fullmatch(r"\d\d\+\d\d=\d\d\d", rl[-1]["content"])


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
