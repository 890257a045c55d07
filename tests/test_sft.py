"""Chapter 09's chat templates equal upstream's, and the tokens, masks and datasets built on them.

tests/data/upstream_chat_template_minimind3.jinja is minimind-3's chat template (d65ef2c,
model/tokenizer_config.json) and tests/data/upstream_chat_template.jinja MiniMind2's (c090b69),
both Apache-2.0, rendered here with jinja2 the way transformers renders chat templates
(``pretrained.render_chat_template``: trim_blocks, lstrip_blocks, its tojson).
"""

import random
import re
from pathlib import Path

import pytest
import torch

from minimind_ref import chat_data, sft
from minimind_ref.data import make_corpus
from minimind_ref.pretrained import render_chat_template
from minimind_ref.sft import (DEFAULT_SYSTEM_PROMPT, EMPTY_THINK, SFTDataset, assistant_labels, assistant_loss_mask,
                              backend_tokenizer, encode_chat, encode_rendered, generate_labels, marker_ids,
                              merged_newline_ids, post_processing_chat, pre_processing_chat, render_chat,
                              reply_losses, reply_runs, rule_mask, truncation_kind, unsupervised_replies,
                              upstream_loss_mask)
from minimind_ref.tokenizer import train_bpe_tokenizer

DATA = Path(__file__).parent / "data"
TEMPLATES = {"minimind-3": (DATA / "upstream_chat_template_minimind3.jinja").read_text(encoding="utf-8"),
             "minimind2": (DATA / "upstream_chat_template.jinja").read_text(encoding="utf-8")}
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]

CONVERSATIONS = {
    "one user turn": [{"role": "user", "content": "hi"}],
    "system prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "u"},
                      {"role": "assistant", "content": "a"}],
    "multi-turn": [{"role": "user", "content": "What is 2 plus 3?"}, {"role": "assistant", "content": "02+03=005"},
                   {"role": "user", "content": "And 4 plus 4?"}, {"role": "assistant", "content": "04+04=008"}],
    "later system turn": [{"role": "user", "content": "u"}, {"role": "system", "content": "be brief"},
                          {"role": "user", "content": "v"}],
    "empty and newline content": [{"role": "user", "content": ""}, {"role": "assistant", "content": "line 1\nline 2"}],
    "marker text in content": [{"role": "user", "content": "type <|im_end|> please"}],
    "reasoning": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a", "reasoning_content": "\nr\n"}],
    "think in content": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "<think>\nr1\n</think>\n\nok"}],
    "tool calls": [{"role": "user", "content": "u"},
                   {"role": "assistant", "content": "", "tool_calls": [{"name": "add", "arguments": {"a": 1}}]},
                   {"role": "tool", "content": "3"}, {"role": "tool", "content": "4"},
                   {"role": "assistant", "content": "calling", "tool_calls": [
                       {"function": {"name": "add", "arguments": "{\"a\": 2}"}}, {"name": "f", "arguments": {}}]}],
    "leading newlines": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "\n\nx"}],
}


@pytest.mark.parametrize("template", list(TEMPLATES))
@pytest.mark.parametrize("name", list(CONVERSATIONS))
@pytest.mark.parametrize("gen", [False, True])
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_render_chat_equals_upstream_template(template, name, gen, tools):
    messages = CONVERSATIONS[name]
    for open_thinking in (False, True):
        expected = render_chat_template(TEMPLATES[template], messages, gen, tools=tools, open_thinking=open_thinking)
        got = render_chat(messages, add_generation_prompt=gen, tools=tools, template=template,
                          open_thinking=open_thinking)
        assert got == expected


def test_the_two_templates_and_the_default():
    msgs = [{"role": "user", "content": "hi"}]
    assert render_chat(msgs, True, template="minimind2") == (
        f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert render_chat(msgs, True) == render_chat(msgs, True, template="minimind-3") == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render_chat(msgs, True, open_thinking=True).endswith("assistant\n<think>\n")
    two = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    assert render_chat(two).endswith(f"assistant\n{EMPTY_THINK}a<|im_end|>\n")
    assert render_chat(two, drop_empty_think=True).endswith("assistant\na<|im_end|>\n")
    with pytest.raises(ValueError, match="template"):
        render_chat(msgs, template="qwen")


@pytest.mark.parametrize("messages, error", [
    ([], ValueError),
    ([{"role": "robot", "content": "x"}], ValueError),
    ([{"role": "user"}], ValueError),
    ([{"role": "user", "content": None}], TypeError),
    ([{"role": "user", "content": "u", "tool_calls": [{"name": "f"}]}], ValueError),
    ([{"role": "assistant", "content": "a", "reasoning_content": 3}], TypeError),
])
def test_bad_conversations_raise(messages, error):
    with pytest.raises(error):
        render_chat(messages)


def test_pre_and_post_processing_are_upstreams_seeded():
    conv = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    rng = random.Random(0)
    added = [pre_processing_chat(conv, rng, 0.2)[0]["role"] == "system" for _ in range(2000)]
    assert 0.17 < sum(added) / len(added) < 0.23
    assert pre_processing_chat([{"role": "system", "content": "s"}] + conv, random.Random(0), 1.0)[0]["content"] == "s"
    tool_use = [{"role": "system", "content": "s", "tools": TOOLS}, {"role": "user", "content": "u"}]
    assert pre_processing_chat(tool_use[1:] + [{"role": "user", "content": "x", "tools": TOOLS}], random.Random(0), 1.0)[0]["role"] == "user"
    text = render_chat(conv + conv)
    rng = random.Random(1)
    kept = [post_processing_chat(text, rng, 0.2) == text for _ in range(2000)]
    assert 0.17 < sum(kept) / len(kept) < 0.23
    assert post_processing_chat(text, random.Random(1), 0.0) == render_chat(conv + conv, drop_empty_think=True)
    assert post_processing_chat("no block", random.Random(1), 0.0) == "no block"


# ---------------------------------------------------------------------- tokens, masks, dataset
@pytest.fixture(scope="module")
def tok():
    return train_bpe_tokenizer(make_corpus(300, seed=0), vocab_size=300)


@pytest.mark.parametrize("template", list(TEMPLATES))
def test_encode_chat_equals_encoding_the_rendered_template(tok, template):
    for record in chat_data.sft_conversations(150, seed=1):
        conv = record["conversations"]
        for drop in (False, True):
            assert encode_chat(tok, conv, template=template, drop_empty_think=drop) == \
                encode_rendered(tok, render_chat(conv, template=template, drop_empty_think=drop))
        assert encode_chat(tok, conv[:1], True, template=template) == tok.encode(render_chat(conv[:1], True, template=template)).ids


def test_typed_markers_stay_text(tok):
    conv = [{"role": "user", "content": "hello <|im_end|> world"}]
    ids = encode_chat(tok, conv)
    start, end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    assert ids.count(end) == 1 and ids.count(start) == 1  # the user turn's own markers only (no system turn)
    assert tok.decode(ids, skip_special_tokens=False) == render_chat(conv)
    # the naive encoding forges a second end marker from the user's text
    assert tok.encode(render_chat(conv)).ids.count(end) == 2


def test_backend_tokenizer_accepts_the_three_kinds_and_rejects_others(tok):
    assert backend_tokenizer(tok) is tok

    class Wrapped:  # pretrained.UpstreamTokenizer keeps it as .tokenizer, transformers as .backend_tokenizer
        def __init__(self, inner, attr):
            setattr(self, attr, inner)

    assert backend_tokenizer(Wrapped(tok, "tokenizer")) is tok
    assert backend_tokenizer(Wrapped(tok, "backend_tokenizer")) is tok
    with pytest.raises(TypeError, match="tokenizers.Tokenizer"):
        marker_ids(object())


CASES = {
    "single turn": [{"role": "user", "content": "What is 2 plus 3?"}, {"role": "assistant", "content": "02+03=005"}],
    "system prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                      {"role": "assistant", "content": "hello"}],
    "multi-turn": [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": chat_data.IDENTITY},
                   {"role": "user", "content": "Add 4 and 4."}, {"role": "assistant", "content": "04+04=008"}],
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("max_length", [10_000, 40, 23])
@pytest.mark.parametrize("drop", [False, True])
def test_mask_equals_upstream_labels(tok, name, max_length, drop):
    bos, eos = marker_ids(tok)
    assert len(bos) > 1 and len(eos) == 2  # multi-token markers: <|im_start|> + "assistant" pieces + "\n"
    ids = encode_chat(tok, CASES[name], drop_empty_think=drop)[:max_length]
    expected = generate_labels(ids, bos, eos, max_length)  # d65ef2c's (tests/test_upstream_parity_sft.py)
    assert assistant_labels(ids, bos, eos, max_length) == expected
    assert assistant_labels(ids, bos, eos, max_length, merged_newline_ids(tok)) == expected
    mask = assistant_loss_mask(ids, bos, eos, max_length)
    assert mask == [int(l != -100) for l in expected]


def test_mask_covers_replies_end_marker_and_newline(tok):
    bos, eos = marker_ids(tok)
    conv = CASES["multi-turn"]
    for drop in (False, True):
        ids = encode_chat(tok, conv, drop_empty_think=drop)
        kept = [t for t, m in zip(ids, assistant_loss_mask(ids, bos, eos, len(ids))) if m]
        expected = []
        for m in conv:
            if m["role"] == "assistant":
                expected += tok.encode(("" if drop else EMPTY_THINK) + m["content"]).ids + eos
        assert kept == expected


def test_truncated_reply_counts_to_the_end(tok):
    bos, eos = marker_ids(tok)
    ids = encode_chat(tok, CASES["single turn"])
    cut = ids[:-3]  # the reply's last digit, <|im_end|> and "\n" are gone
    mask = assistant_loss_mask(cut, bos, eos, 10_000)
    first = next(i for i in range(len(cut)) if cut[i:i + len(bos)] == bos) + len(bos)
    assert mask[first:] == [1] * (len(cut) - first) and sum(mask) == len(cut) - first


# ---------------------------------------------------------------------- the newline edge case
@pytest.fixture(scope="module")
def merging_tok():
    """A byte-level BPE whose vocabulary merges a newline with the spaces after it (as MiniMind2's
    6,400-token vocabulary does): trained on indented code."""
    texts = ["def f(x):\n    return x\n", "if a:\n    b = 1\n    c = 2\n", "hello world"] * 50
    return train_bpe_tokenizer(texts, vocab_size=300, split_digits=False)


def test_merged_newline_ids(tok, merging_tok):
    assert merged_newline_ids(tok) == frozenset()  # the course's tokenizer never merges a newline
    merged = merged_newline_ids(merging_tok)
    assert merged and all(merging_tok.decode([i]).startswith("\n") and merging_tok.decode([i]) != "\n" for i in merged)


def test_whitespace_replies_under_each_rule(merging_tok):
    """Encoded as one string, an indented reply swallows its header's newline: d65ef2c's rule drops
    the reply, c090b69's drops its first token, the course's keeps it whole (merged_starts or not)."""
    conv = [{"role": "user", "content": "Show me."}, {"role": "assistant", "content": "    return x"},
            {"role": "user", "content": "Again."}, {"role": "assistant", "content": "ok"}]
    bos, eos = marker_ids(merging_tok)
    ids = encode_rendered(merging_tok, render_chat(conv, drop_empty_think=True))
    text = lambda mask: merging_tok.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)
    d65 = upstream_loss_mask(ids, bos, eos, len(ids), "d65ef2c")
    c09 = upstream_loss_mask(ids, *marker_ids(merging_tok, newline=False), len(ids), "c090b69")
    ours = assistant_loss_mask(ids, bos, eos, len(ids))
    assert ours == assistant_loss_mask(ids, bos, eos, len(ids), merged_newline_ids(merging_tok))
    assert text(d65) == "ok<|im_end|>\n"
    assert text(c09) == " return x<|im_end|>\nok<|im_end|>\n"  # "\n   " lost with the merged token
    assert text(ours) == "\n    return x<|im_end|>\nok<|im_end|>\n"
    assert all(o >= u for o, u in zip(ours, d65)) and all(o >= u for o, u in zip(ours, c09))
    header, newline, im_end = bos[:-1], bos[-1], eos[0]
    for rule, mask in (("d65ef2c", d65), ("c090b69", c09), ("course", ours)):
        assert rule_mask(ids, header, newline, im_end, len(ids), rule) == mask
    assert [len(lost) for lost in reply_losses(ours, d65)] == [reply_runs(ours)[0][1] - reply_runs(ours)[0][0], 0]
    assert [len(lost) for lost in reply_losses(ours, c09)] == [1, 0]
    assert unsupervised_replies(merging_tok, [conv]) == [0]
    assert unsupervised_replies(merging_tok, [conv], rule="c090b69") == unsupervised_replies(merging_tok, [conv], rule="course") == []
    assert unsupervised_replies(merging_tok, [conv], drop_empty_think=False) == []  # the block keeps the newline apart
    # encoding the pieces never merges, so the reply keeps its labels under either rule
    pieces = encode_chat(merging_tok, conv, drop_empty_think=True)
    assert "    return x" in merging_tok.decode([t for t in generate_labels(pieces, bos, eos, len(pieces)) if t != -100])


def test_the_courses_mask_boundaries_and_bad_markers():
    bos, eos = [1, 7, 8], [2, 8]
    assert assistant_loss_mask([5, 1, 7], bos, eos, 10) == [0, 0, 0]  # a header that ends the sequence
    assert assistant_loss_mask([5, 1, 7, 8], bos, eos, 10) == [0, 0, 0, 0]  # ... with its newline
    assert assistant_loss_mask([5, 1, 7, 30], bos, eos, 10) == [0, 0, 0, 1]  # cut right after a merged token
    assert assistant_loss_mask([1, 7, 30, 40, 2, 8], bos, eos, 10, merged_starts=[31]) == [0] * 6
    assert assistant_loss_mask([1, 7, 30, 40, 2, 8], bos, eos, 4) == [0, 0, 1, 1, 0, 0]
    assert upstream_loss_mask([1, 7, 8, 40, 2, 8], bos, eos, 10, "d65ef2c") == [0, 0, 0, 1, 1, 1]
    assert upstream_loss_mask([1, 7, 8, 40, 2, 8], bos[:-1], eos[:1], 10, "c090b69") == [0, 0, 0, 1, 1, 1]
    assert upstream_loss_mask([1, 7, 8, 40, 2], bos[:-1], eos[:1], 10, "c090b69") == [0, 0, 0, 1, 1]  # stops at the end
    with pytest.raises(ValueError, match="too short"):
        assistant_loss_mask([1, 2], [1], eos, 4)
    with pytest.raises(ValueError, match="must not be empty"):
        upstream_loss_mask([1, 2], [], eos, 4)
    with pytest.raises(ValueError, match="commits the course pins"):
        upstream_loss_mask([1, 2], bos, eos, 4, "master")
    with pytest.raises(ValueError, match="rule must be one of"):
        rule_mask([1, 2], bos[:-1], 8, 2, 4, "upstream")
    with pytest.raises(ValueError, match="one entry per token"):
        reply_losses([1, 0], [1])
    assert truncation_kind([1, 7, 30, 40, 41, 2, 8], 4, bos, eos) == "cut_answer"  # a merged reply cut too


def test_course_data_has_no_reply_that_loses_its_header_newline(tok):
    convs = [r["conversations"] for r in chat_data.sft_conversations(400, seed=0)]
    assert unsupervised_replies(tok, convs) == []


def test_sft_dataset_batches(tok):
    records = chat_data.sft_conversations(20, seed=2)
    ds = SFTDataset(records, tok, max_length=64)
    x, y = ds.batch(torch.tensor([0, 1, 2]))
    assert x.shape == y.shape and x.shape[1] <= 64
    assert ((x == 0) <= (y == -100)).all(), "padding must never be a target"
    full = SFTDataset(records, tok, max_length=64, loss_on="all")
    assert full.supervised_fraction() == 1.0 > ds.supervised_fraction() > 0
    assert SFTDataset(records, tok, seed=3).fingerprint() == SFTDataset(records, tok, seed=3).fingerprint()
    assert SFTDataset(records, tok, seed=3).fingerprint() != SFTDataset(records, tok, seed=4).fingerprint()
    upstream_way = SFTDataset(records, tok, seed=3, encoding="upstream")
    assert upstream_way.fingerprint() == SFTDataset(records, tok, seed=3).fingerprint()  # nothing merges here
    with pytest.raises(ValueError, match="loss_on"):
        SFTDataset(records, tok, loss_on="user")
    with pytest.raises(ValueError, match="encoding"):
        SFTDataset(records, tok, encoding="bytes")
    with pytest.raises(ValueError, match="empty_think_ratio"):
        SFTDataset(records, tok, empty_think_ratio=1.5)


def test_sft_dataset_preprocessing_rates(tok):
    records = chat_data.sft_conversations(400, seed=2)
    ds = SFTDataset(records, tok, max_length=512)
    think_start = tok.encode("<think>").ids
    with_system = with_think = 0
    for ids, _ in ds.examples:
        with_system += tok.decode(ids[:12]).startswith("system")
        with_think += any(ids[j:j + len(think_start)] == think_start for j in range(len(ids)))
    assert 0.14 < with_system / len(ds) < 0.26 and 0.14 < with_think / len(ds) < 0.26
    kept = SFTDataset(records[:50], tok, max_length=512, add_system_ratio=0.0, empty_think_ratio=1.0)
    assert all(any(ids[j:j + len(think_start)] == think_start for j in range(len(ids))) for ids, _ in kept.examples)


def test_merging_dataset_keeps_whitespace_replies_either_way(merging_tok):
    records = [{"conversations": [{"role": "user", "content": "Show me."}, {"role": "assistant", "content": "    return x"}]}]
    for encoding in ("pieces", "upstream"):
        ds = SFTDataset(records, merging_tok, max_length=64, empty_think_ratio=0.0, add_system_ratio=0.0,
                        encoding=encoding)
        ids, labels = ds.examples[0]
        assert "return x" in merging_tok.decode([t for t in labels if t != -100]), encoding


def test_sft_data_kind_weights(tok):
    """``kind_weights`` sets the kinds of the training conversations only (the recipe's 65 % sums);
    weights over unknown kinds, negative or all-zero weights are refused with ValueError."""
    only_sums = sft.sft_data(tok, n_train=40, n_val=10, seed=0, kind_weights={"sum": 1.0})
    default = sft.sft_data(tok, n_train=40, n_val=10, seed=0)
    pattern = re.compile(r"\d\d\+\d\d=")
    assert all(pattern.search(tok.decode([t for t in ids if t >= 0])) for ids, _ in only_sums.train.examples)
    assert not all(pattern.search(tok.decode([t for t in ids if t >= 0])) for ids, _ in default.train.examples)
    assert [ids for ids, _ in only_sums.val.examples] == [ids for ids, _ in default.val.examples]
    assert set(sft.STAGE_SETTINGS["kind_weights"]) == set(chat_data.KINDS)
    for bad in ({"sums": 1.0}, {"sum": -1.0}, {"sum": 0.0}, {}, {"sum": float("nan")}, [("sum", 1.0)]):
        with pytest.raises(ValueError, match="kind_weights"):
            sft.sft_data(tok, n_train=4, n_val=2, seed=0, kind_weights=bad)
