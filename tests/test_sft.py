"""Chapter 09's chat template equals upstream's (jingyaogong/minimind c090b69, model/tokenizer_config.json).

tests/data/upstream_chat_template.jinja is upstream's chat_template string (Apache-2.0), rendered
here with jinja2 the way transformers renders chat templates (trim_blocks, lstrip_blocks).
"""

from pathlib import Path

import jinja2.sandbox
import pytest

from minimind_ref.sft import DEFAULT_SYSTEM_PROMPT, render_chat

TEMPLATE = (Path(__file__).parent / "data" / "upstream_chat_template.jinja").read_text(encoding="utf-8")


def upstream_render(messages, add_generation_prompt=False, **kwargs):
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(TEMPLATE).render(messages=messages, add_generation_prompt=add_generation_prompt, **kwargs)


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
}


@pytest.mark.parametrize("name", list(CONVERSATIONS))
@pytest.mark.parametrize("gen", [False, True])
def test_render_chat_equals_upstream_template(name, gen):
    messages = CONVERSATIONS[name]
    assert render_chat(messages, add_generation_prompt=gen) == upstream_render(messages, add_generation_prompt=gen)


def test_default_system_prompt_and_generation_prompt():
    text = render_chat([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert text == (f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                    "<|im_start|>assistant\n")


@pytest.mark.parametrize("messages, error", [
    ([], ValueError),
    ([{"role": "tool", "content": "x"}], ValueError),
    ([{"role": "user"}], ValueError),
    ([{"role": "user", "content": None}], TypeError),
])
def test_bad_conversations_raise(messages, error):
    with pytest.raises(error):
        render_chat(messages)


# ---------------------------------------------------------------------- tokens, masks, dataset
import torch  # noqa: E402

from minimind_ref import chat_data  # noqa: E402
from minimind_ref.data import make_corpus  # noqa: E402
from minimind_ref.sft import (SFTDataset, assistant_labels, assistant_loss_mask, encode_chat,  # noqa: E402
                              marker_ids)
from minimind_ref.tokenizer import train_bpe_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return train_bpe_tokenizer(make_corpus(300, seed=0), vocab_size=300)


def upstream_generate_labels(input_ids, bos_id, eos_id, max_length):
    """Upstream's SFTDataset.generate_labels at c090b69 (dataset/lm_dataset.py), transcribed."""
    labels = [-100] * len(input_ids)
    i = 0
    while i < len(input_ids):
        if input_ids[i:i + len(bos_id)] == bos_id:
            start = i + len(bos_id)
            end = start
            while end < len(input_ids):
                if input_ids[end:end + len(eos_id)] == eos_id:
                    break
                end += 1
            for j in range(start, min(end + len(eos_id), max_length)):
                labels[j] = input_ids[j]
            i = end + len(eos_id) if end < len(input_ids) else len(input_ids)
        else:
            i += 1
    return labels


def test_encode_chat_equals_encoding_the_rendered_template(tok):
    for record in chat_data.sft_conversations(200, seed=1):
        conv = record["conversations"]
        assert encode_chat(tok, conv) == tok.encode(render_chat(conv)).ids
        assert encode_chat(tok, conv[:1], add_generation_prompt=True) == tok.encode(render_chat(conv[:1], True)).ids


def test_typed_markers_stay_text(tok):
    conv = [{"role": "user", "content": "hello <|im_end|> world"}]
    ids = encode_chat(tok, conv)
    start, end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    assert ids.count(end) == 2 and ids.count(start) == 2  # the system and user turns' own markers only
    assert tok.decode(ids, skip_special_tokens=False) == render_chat(conv)
    # the naive encoding forges a third end marker from the user's text
    assert tok.encode(render_chat(conv)).ids.count(end) == 3


CASES = {
    "single turn": [{"role": "user", "content": "What is 2 plus 3?"}, {"role": "assistant", "content": "02+03=005"}],
    "system prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                      {"role": "assistant", "content": "hello"}],
    "multi-turn": [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": chat_data.IDENTITY},
                   {"role": "user", "content": "Add 4 and 4."}, {"role": "assistant", "content": "04+04=008"}],
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("max_length", [10_000, 40, 23])
def test_mask_equals_upstream_labels(tok, name, max_length):
    bos, eos = marker_ids(tok)
    assert len(bos) > 1 and len(eos) == 2  # multi-token markers: <|im_start|> + "assistant" pieces + "\n"
    ids = encode_chat(tok, CASES[name])[:max_length]
    expected = upstream_generate_labels(ids, bos, eos, max_length)
    assert assistant_labels(ids, bos, eos, max_length) == expected
    mask = assistant_loss_mask(ids, bos, eos, max_length)
    assert mask == [int(l != -100) for l in expected]


def test_mask_covers_replies_end_marker_and_newline(tok):
    bos, eos = marker_ids(tok)
    conv = CASES["multi-turn"]
    ids = encode_chat(tok, conv)
    kept = [t for t, m in zip(ids, assistant_loss_mask(ids, bos, eos, len(ids))) if m]
    expected = []
    for m in conv:
        if m["role"] == "assistant":
            expected += tok.encode(m["content"]).ids + eos
    assert kept == expected


def test_truncated_reply_counts_to_the_end(tok):
    bos, eos = marker_ids(tok)
    ids = encode_chat(tok, CASES["single turn"])
    cut = ids[:-3]  # the reply's last digit, <|im_end|> and "\n" are gone
    mask = assistant_loss_mask(cut, bos, eos, 10_000)
    first = next(i for i in range(len(cut)) if cut[i:i + len(bos)] == bos) + len(bos)
    assert mask[first:] == [1] * (len(cut) - first) and sum(mask) == len(cut) - first


def test_sft_dataset_batches(tok):
    records = chat_data.sft_conversations(20, seed=2)
    ds = SFTDataset(records, tok, max_length=64)
    x, y = ds.batch(torch.tensor([0, 1, 2]))
    assert x.shape == y.shape and x.shape[1] <= 64
    assert ((x == 0) <= (y == -100)).all(), "padding must never be a target"
    full = SFTDataset(records, tok, max_length=64, loss_on="all")
    assert full.supervised_fraction() == 1.0 > ds.supervised_fraction() > 0
    with pytest.raises(ValueError, match="loss_on"):
        SFTDataset(records, tok, loss_on="user")
