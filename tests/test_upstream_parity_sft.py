"""The SFT labels of both pinned upstream commits, on ids of their real tokenizers.

``tests/data/upstream_sft_labels.json`` and the package data it refers to
(``minimind_ref/reference_outputs/upstream_sft_tokens.json``, read by ``sft.upstream_sft_tokens``)
were made by ``tools/upstream_sft_tokens.py`` (its docstring says how) from upstream's own files,
read with git at c090b69 and at d65ef2c: ``model/tokenizer.json`` and ``model/tokenizer_config.json``
(tokenizing and the chat template through transformers' ``AutoTokenizer``) and ``dataset/lm_dataset.py``
(``SFTDataset.generate_labels`` with the markers its ``__init__`` computes, and d65ef2c's
``pre_processing_chat`` / ``post_processing_chat``). For every conversation of the package data,
each encoding and three ``max_length`` values (padded; cut inside the last reply; cut right after
the token that follows the last assistant header) the fixture holds the spans where that commit's
``generate_labels`` sets a label. Nothing of upstream's code or tokenizers is in the repository.
"""

import json
from pathlib import Path

import pytest
from tokenizers.decoders import ByteLevel

from minimind_ref import sft

DATA = sft.upstream_sft_tokens()
FIXTURE = json.loads((Path(__file__).parent / "data" / "upstream_sft_labels.json").read_text(encoding="utf-8"))
RECORDS = [dict(zip(FIXTURE["fields"], r)) for r in FIXTURE["records"]]
ENCODINGS = [(key, name) for key in ("c090b69", "d65ef2c kept", "d65ef2c dropped", "d65ef2c upstream")
             for name in ["sample"] + (list(DATA["examples"]) if key != "d65ef2c upstream" else [])]


def full_ids(encoding, conversation):
    if isinstance(conversation, str):
        return DATA["examples"][conversation]["ids"][encoding]
    return DATA["sample"]["ids"][encoding][conversation]


def all_ids(encoding, name):
    return [DATA["examples"][name]["ids"][encoding]] if name != "sample" else DATA["sample"]["ids"][encoding]


def conversations(encoding, name):
    """The messages as that encoding rendered them (d65ef2c's own draws may have put a system prompt first)."""
    if name != "sample":
        return [DATA["examples"][name]["conversation"]]
    convs = DATA["sample"]["conversations"]
    if encoding != "d65ef2c upstream":
        return convs
    return [([{"role": "system", "content": s}] if s else []) + c for c, s in zip(convs, DATA["sample"]["system_upstream"])]


def markers(commit):
    e = DATA["commits"][commit]
    return e["header_ids"], e["newline_id"], e["im_end_id"]


def test_the_fixture_covers_both_commits_every_encoding_and_the_cuts():
    assert FIXTURE["command"] == DATA["command"] == "python tools/upstream_sft_tokens.py --upstream /path/to/minimind"
    keys = {(r["commit"], r["encoding"]) for r in RECORDS}
    assert keys == {("c090b69", "c090b69"), ("d65ef2c", "d65ef2c kept"), ("d65ef2c", "d65ef2c dropped"),
                    ("d65ef2c", "d65ef2c upstream")}
    assert len({r["max_length"] for r in RECORDS}) > 20 and any(r["n_real"] < len(full_ids(r["encoding"], r["conversation"]))
                                                               for r in RECORDS)
    assert len(DATA["sample"]["conversations"]) == 80


def test_each_commits_markers_are_its_sftdataset_markers():
    """c090b69 searches <|im_start|>assistant and <|im_end|>; d65ef2c adds the newline to both."""
    for commit, newline in (("c090b69", False), ("d65ef2c", True)):
        header, nl, im_end = markers(commit)
        e = DATA["commits"][commit]
        assert e["bos_id"] == header + ([nl] if newline else []) and e["eos_id"] == [im_end] + ([nl] if newline else [])
        assert e["tokens"][nl] == "Ċ" and e["tokens"][im_end] == "<|im_end|>" and header[0] == 1
    assert DATA["commits"]["c090b69"]["header_ids"] != DATA["commits"]["d65ef2c"]["header_ids"]  # two vocabularies


@pytest.mark.parametrize("encoding", sorted({r["encoding"] for r in RECORDS}))
def test_generate_labels_equals_upstreams(encoding):
    for r in RECORDS:
        if r["encoding"] == encoding:
            _check_record(r)


def _check_record(r):
    e = DATA["commits"][r["commit"]]
    ids = full_ids(r["encoding"], r["conversation"])[: r["max_length"]]
    assert len(ids) == r["n_real"]
    ids = ids + [e["pad_id"]] * (r["max_length"] - len(ids))  # upstream pads to max_length before labelling
    expected = [-100] * len(ids)
    for a, b in r["label_spans"]:
        expected[a:b] = ids[a:b]
    assert sft.generate_labels(ids, e["bos_id"], e["eos_id"], r["max_length"], r["commit"]) == expected
    assert sft.upstream_loss_mask(ids, e["bos_id"], e["eos_id"], r["max_length"], r["commit"]) == \
        [int(v != -100) for v in expected]
    header, nl, im_end = markers(r["commit"])
    assert sft.rule_mask(ids, header, nl, im_end, r["max_length"], r["commit"]) == [int(v != -100) for v in expected]


def _text(commit, ids):
    tokens = DATA["commits"][commit]["tokens"]
    return ByteLevel().decode([tokens[i] for i in ids])


def _reply_text(commit, message, dropped):
    if commit == "c090b69":
        return message["content"] + "<|im_end|>\n"
    return ("" if dropped else "<think>\n\n</think>\n\n") + message["content"].lstrip("\n") + "<|im_end|>\n"


@pytest.mark.parametrize("encoding, name", ENCODINGS)
def test_the_courses_mask_supervises_every_reply_whole_on_both_real_tokenizers(encoding, name):
    """Every reply of every conversation, whitespace-led or not, with the empty blocks kept or dropped:
    the course's mask counts exactly the reply, its <|im_end|> and the newline after it."""
    commit = encoding.split()[0]
    header, nl, im_end = markers(commit)
    drops = DATA["sample"]["dropped_upstream"] if encoding == "d65ef2c upstream" else None
    for n, (ids, conv) in enumerate(zip(all_ids(encoding, name), conversations(encoding, name))):
        course = sft.rule_mask(ids, header, nl, im_end, len(ids), "course")
        assert course == sft.assistant_loss_mask(ids, header + [nl], [im_end, nl], len(ids))
        dropped = drops[n] if drops is not None else encoding.endswith("dropped")
        replies = [_reply_text(commit, m, dropped) for m in conv if m["role"] == "assistant"]
        runs = sft.reply_runs(course)
        assert len(runs) == len(replies), (encoding, name, n)
        merged = set(DATA["commits"][commit]["merged_newline_ids"])
        for (a, b), reply in zip(runs, replies):
            # a token that swallowed the header's newline is counted with it: the run starts with that newline
            text = _text(commit, ids[a:b])
            assert text == reply or (ids[a] in merged and text == "\n" + reply), (encoding, name, n, text, reply)


@pytest.mark.parametrize("encoding, name", ENCODINGS)
def test_the_course_equals_d65ef2c_where_its_marker_matches_and_c090b69_but_for_the_merged_token(encoding, name):
    commit = encoding.split()[0]
    header, nl, im_end = markers(commit)
    merged = set(DATA["commits"][commit]["merged_newline_ids"])
    for ids in all_ids(encoding, name):
        course = sft.rule_mask(ids, header, nl, im_end, len(ids), "course")
        other = sft.rule_mask(ids, header, nl, im_end, len(ids), commit)
        for lost in sft.reply_losses(course, other):
            if commit == "c090b69":  # c090b69 skips the token after the header: the newline, or the merged token
                assert lost == [] or (len(lost) == 1 and ids[lost[0]] in merged and ids[lost[0] - len(header):lost[0]] == header)
            else:  # d65ef2c loses a reply whole (its marker is missing) or not at all
                assert lost == [] or ids[lost[0]] in merged
        assert all(c >= o for c, o in zip(course, other))  # the course never drops what upstream counts
        # every token after a header is the newline or a token that swallowed it (the course's assumption)
        starts = [j + len(header) for j in range(len(ids) - len(header)) if ids[j:j + len(header)] == header]
        assert all(ids[j] == nl or ids[j] in merged for j in starts)


def test_what_each_commit_loses_on_whitespace_led_replies():
    """The chapter's story, measured: c090b69 loses only the merged first token of some replies;
    d65ef2c loses nothing while the empty thinking block stays and whole replies once it is dropped."""
    lost = {}
    for encoding in ("c090b69", "d65ef2c kept", "d65ef2c dropped", "d65ef2c upstream"):
        commit = encoding.split()[0]
        header, nl, im_end = markers(commit)
        whole = first = 0
        for ids in DATA["sample"]["ids"][encoding]:
            course = sft.rule_mask(ids, header, nl, im_end, len(ids), "course")
            other = sft.rule_mask(ids, header, nl, im_end, len(ids), commit)
            for (a, b), lost_positions in zip(sft.reply_runs(course), sft.reply_losses(course, other)):
                whole += len(lost_positions) == b - a
                first += 0 < len(lost_positions) < b - a
        lost[encoding] = (whole, first)
    assert lost["c090b69"][0] == 0 and lost["c090b69"][1] > 0
    assert lost["d65ef2c kept"] == (0, 0)
    assert lost["d65ef2c dropped"][0] > lost["d65ef2c upstream"][0] > 0 and lost["d65ef2c dropped"][1] == 0
    ratio = sum(DATA["sample"]["dropped_upstream"]) / len(DATA["sample"]["dropped_upstream"])
    assert 0.65 < ratio < 0.95  # post_processing_chat drops the blocks with probability 0.8
