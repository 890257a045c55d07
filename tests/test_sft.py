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
