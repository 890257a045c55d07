"""minimind_ref.pretrained with minimind-3's files (d65ef2c), tested offline on synthetic copies.

The tokenizer folder is ``tests/_upstream_files.write_tokenizer_minimind3``: a small byte-level BPE
trained as upstream's ``trainer/train_tokenizer.py`` (101d7df) trains minimind-3's, with its 36
added tokens, saved with upstream's ``model/tokenizer_config.json`` and its chat template. Our
loader must encode, decode and render that template exactly as ``transformers.AutoTokenizer``
does (string and id equality, no tolerance).

No test touches the network: ``no_network`` (autouse) makes every socket connection fail.
"""

from __future__ import annotations

import json
import socket

import pytest

from minimind_ref import pretrained as P

import _upstream_files as U


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any attempt to open a network connection fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a test tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.delenv("MINIMIND_WEIGHTS", raising=False)
    monkeypatch.delenv("MINIMIND_DOWNLOAD", raising=False)
    monkeypatch.delenv("MINIMIND_REAL_WEIGHTS", raising=False)


# ---------------------------------------------------------------------- the tokenizer
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "查询天气",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {"a": {"type": "integer"}}}},
]

#: Conversations that reach every branch of minimind-3's chat template.
CONVERSATIONS = {
    "one user turn": [{"role": "user", "content": "hi"}],
    "system prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "u"},
                      {"role": "assistant", "content": "a"}],
    "multi-turn": [{"role": "user", "content": "What is 12 plus 30?"}, {"role": "assistant", "content": "42"},
                   {"role": "user", "content": "长江有多长？"}, {"role": "assistant", "content": "约6300公里。"}],
    "reasoning_content": [{"role": "user", "content": "q"},
                          {"role": "assistant", "content": "\nthe answer", "reasoning_content": "\nthink hard\n\n"}],
    "think block in content": [{"role": "user", "content": "q"},
                               {"role": "assistant", "content": "<think>\nstep 1\nstep 2\n</think>\n\nfinal"}],
    "think block without newlines": [{"role": "user", "content": "q"},
                                     {"role": "assistant", "content": "pre<think>r</think>post"}],
    "tool calls and responses": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Weather in Beijing, and 1 + 2?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "北京"}}},
            {"type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
        {"role": "tool", "content": '{"temperature": 21}'},
        {"role": "tool", "content": "3"},
        {"role": "assistant", "content": "21度；3。", "reasoning_content": "both tools answered"}],
    "tool call with content": [
        {"role": "user", "content": "add"},
        {"role": "assistant", "content": "Let me add.", "tool_calls": [{"name": "add", "arguments": {"a": 1}}]}],
    "tool response typed by the user": [{"role": "user", "content": "<tool_response>x</tool_response>"},
                                        {"role": "user", "content": "y"}],
    "later system turn": [{"role": "user", "content": "u"}, {"role": "system", "content": "be brief"},
                          {"role": "user", "content": "v"}],
    "content not a string": [{"role": "user", "content": "u"}, {"role": "assistant", "content": None}],
}
#: The template's switches: tools, the generation prompt, and open_thinking (on, off, absent).
TEMPLATE_KWARGS = [
    {}, {"add_generation_prompt": True}, {"add_generation_prompt": True, "open_thinking": True},
    {"add_generation_prompt": True, "open_thinking": False}, {"open_thinking": True},
    {"tools": TOOLS}, {"tools": TOOLS, "add_generation_prompt": True, "open_thinking": True},
]


@pytest.fixture(scope="module")
def m3_tokenizer_dir(tmp_path_factory):
    return U.write_tokenizer_minimind3(tmp_path_factory.mktemp("minimind3_tokenizer"))


def test_files_are_upstreams_format(m3_tokenizer_dir):
    """tokenizer.json as upstream's trainer leaves it; tokenizer_config.json is upstream's file (101d7df)."""
    data = json.loads((m3_tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    assert [(t["id"], t["content"], t["special"]) for t in data["added_tokens"]] == [
        (i, tok, i < 21) for i, tok in enumerate(U.ADDED_MINIMIND3)]
    assert data["pre_tokenizer"] == {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                     "use_regex": True}
    assert data["decoder"]["type"] == "ByteLevel" and data["normalizer"] is None and data["post_processor"] is None
    config = json.loads((m3_tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["chat_template"] == U.CHAT_TEMPLATE_MINIMIND3
    assert len(config["additional_special_tokens"]) == 20 and config["model_max_length"] == 131072
    assert U.ADDED_MINIMIND3[21] == "<tool_call>" and U.ADDED_MINIMIND3[25:27] == ("<think>", "</think>")
    assert U.ADDED_MINIMIND3[-1] == "<|buffer9|>" and len(U.ADDED_MINIMIND3) == 36


def test_specials_and_round_trip(m3_tokenizer_dir):
    tok = P.load_tokenizer_dir(m3_tokenizer_dir)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 0)
    assert len(tok) == U.len_vocab_minimind3()
    assert tok.chat_template == U.CHAT_TEMPLATE_MINIMIND3
    for text in U.TEXTS_MINIMIND3 + ["mixed 中文 and English, tabs\tand\nnewlines  ", "unseen: ☃ ñ 😀"]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
    assert tok.encode("<think>x</think>")[0] == 25 and tok.encode("<think>x</think>")[-1] == 26
    assert tok.encode("<tool_call>") == [21] and tok.encode("<|buffer9|>") == [35]
    # <think> and <tool_call> are added tokens but not special: skip_special_tokens keeps them
    ids = tok.encode("<|im_start|>assistant\n<think>\nr\n</think>\n\nok<|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nr\n</think>\n\nok"


def test_chat_template_switches(m3_tokenizer_dir):
    """What the template does with each switch, stated without transformers."""
    tok = P.load_tokenizer_dir(m3_tokenizer_dir)
    hi = CONVERSATIONS["one user turn"]
    assert tok.apply_chat_template(hi) == "<|im_start|>user\nhi<|im_end|>\n"  # no default system prompt
    closed = tok.apply_chat_template(hi, add_generation_prompt=True)
    assert closed.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tok.apply_chat_template(hi, add_generation_prompt=True, open_thinking=False) == closed
    assert tok.apply_chat_template(hi, add_generation_prompt=True, open_thinking=True).endswith(
        "<|im_start|>assistant\n<think>\n")
    text = tok.apply_chat_template(CONVERSATIONS["reasoning_content"])
    assert text.endswith("<|im_start|>assistant\n<think>\nthink hard\n</think>\n\nthe answer<|im_end|>\n")
    same = tok.apply_chat_template([CONVERSATIONS["reasoning_content"][0],
                                    {"role": "assistant", "content": "<think>\nthink hard\n</think>\n\nthe answer"}])
    assert same == text, "a <think> block in the content renders as reasoning_content does"
    text = tok.apply_chat_template(CONVERSATIONS["tool calls and responses"], tools=TOOLS)
    assert text.startswith("<|im_start|>system\nYou can call tools.\n\n# Tools\n")
    assert '\n{"type": "function", "function": {"name": "get_weather", "description": "查询天气"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "北京"}}\n</tool_call>\n<tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\n{\"temperature\": 21}\n</tool_response>\n<tool_response>\n3\n" \
           "</tool_response><|im_end|>\n" in text
    ids = tok.apply_chat_template(hi, add_generation_prompt=True, open_thinking=True, tokenize=True)
    assert ids[-2:] == [25, tok.encode("\n")[0]] and ids[0] == tok.bos_token_id


@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_tokenizer_agrees_with_transformers(m3_tokenizer_dir, name):
    """Rendered text, token ids and decoded text equal AutoTokenizer's for every switch."""
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoTokenizer.from_pretrained(m3_tokenizer_dir)
    ours = P.load_tokenizer_dir(m3_tokenizer_dir)
    assert (theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id, len(theirs)) == (
        ours.bos_token_id, ours.eos_token_id, ours.pad_token_id, len(ours))
    messages = CONVERSATIONS[name]
    for kwargs in TEMPLATE_KWARGS:
        text = ours.apply_chat_template(messages, **kwargs)
        assert text == theirs.apply_chat_template(messages, tokenize=False, **kwargs), kwargs
        ids = ours.apply_chat_template(messages, tokenize=True, **kwargs)
        assert ids == theirs.apply_chat_template(messages, tokenize=True, **kwargs), kwargs
        assert ids == theirs(text)["input_ids"]
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
