"""minimind_ref.pretrained with minimind-3's files (d65ef2c), tested offline on synthetic copies.

The weights are ``tests/data/upstream_minimind3_files/``, made by upstream's own code
(``tools/upstream_files_minimind3.py``: a random model of upstream's class at d65ef2c saved as its
trainers save weights, converted by its ``scripts/convert_model.py``), with upstream's logits
stored beside them; loading must give those logits within ``rtol = atol = 1e-5`` (fp32).

The tokenizer folder is ``tests/_upstream_files.write_tokenizer_minimind3``: a small byte-level BPE
trained as upstream's ``trainer/train_tokenizer.py`` (d65ef2c) trains minimind-3's, with its 36
added tokens, saved with upstream's ``model/tokenizer_config.json`` and its chat template. Our
loader must encode, decode and render that template exactly as ``transformers.AutoTokenizer``
does (string and id equality, no tolerance).

No test touches the network: ``no_network`` (autouse) makes every socket connection fail.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch

import minimind_ref as mm
from minimind_ref import pretrained as P

import _upstream_files as U
from _helpers import no_network  # noqa: F401 (autouse: no test here may use the network)


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
    """tokenizer.json as upstream's trainer leaves it; tokenizer_config.json is upstream's file (d65ef2c)."""
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


def token_ids(rendered):
    """The ids of transformers' ``apply_chat_template(tokenize=True)``: a list up to 4.57, a ``BatchEncoding``
    (``["input_ids"]``) from 5.0. ``UpstreamTokenizer`` returns the list (its documented form)."""
    return list(rendered["input_ids"]) if hasattr(rendered, "keys") else rendered


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
        assert ids == token_ids(theirs.apply_chat_template(messages, tokenize=True, **kwargs)), kwargs
        assert ids == theirs(text)["input_ids"]
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)


# ---------------------------------------------------------------------- files made by upstream's code
FILES = U.DATA / "upstream_minimind3_files"
REFERENCE = torch.load(FILES / "reference.pt", weights_only=True)
CASES = REFERENCE["cases"]
UPSTREAM_TOL = dict(rtol=1e-5, atol=1e-5)


def test_fixture_is_what_upstream_writes():
    """The .pth files are bare fp16 state dicts with both tied keys (upstream's trainers); the Qwen3
    folders are transformers' (lm_head dropped when tied); upstream's own logits of the converted
    folders equal its model's (the fixture tool stored both)."""
    for case in CASES.values():
        blob = torch.load(FILES / case["file"], weights_only=True)
        assert {v.dtype for v in blob.values()} == {torch.float16} and "lm_head.weight" in blob
        assert "model.layers.0.self_attn.q_norm.weight" in blob and not any("shared_experts" in k for k in blob)
        for folder, info in case["folders"].items():
            raw = json.loads((FILES / folder / "config.json").read_text())
            assert raw["model_type"] in {"qwen3": ("qwen3", "qwen3_moe"), "minimind": ("minimind",)}[info["kind"]]
            if "transformers_logits" in info:
                torch.testing.assert_close(info["transformers_logits"], case["logits"], **UPSTREAM_TOL)
    assert not any(FILES.rglob("model_minimind.py")), "upstream's code is not part of the repository"


@pytest.mark.parametrize("name", sorted(CASES))
def test_pth_from_upstreams_trainer_gives_upstreams_logits(name):
    case = CASES[name]
    model = P.load_pth(FILES / case["file"])
    assert model.config == mm.MiniMindConfig(generation="minimind-3", **case["config"])
    assert model.config.generation == "minimind-3" and model.config.qk_norm
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == case["config"].get("tie_word_embeddings", True)
    with torch.no_grad():
        torch.testing.assert_close(model(case["input_ids"]).logits, case["logits"], **UPSTREAM_TOL)


@pytest.mark.parametrize("folder, name", [(f, n) for n, c in sorted(CASES.items()) for f in c["folders"]])
def test_folders_from_upstreams_converter_give_upstreams_logits(folder, name):
    case = CASES[name]
    model = P.load_hf_dir(FILES / folder)
    expected = mm.MiniMindConfig(generation="minimind-3", **case["config"])
    if expected.use_moe and case["folders"][folder]["kind"] == "qwen3":
        # upstream's converter leaves transformers' default router_aux_loss_coef (0.001) in config.json
        expected = expected.replace(aux_loss_alpha=0.001)
    assert model.config == expected
    with torch.no_grad():
        torch.testing.assert_close(model(case["input_ids"]).logits, case["logits"], **UPSTREAM_TOL)


@pytest.mark.parametrize("folder", ["minimind-3-tiny", "minimind-3-moe-tiny"])
def test_qwen3_folder_agrees_with_transformers(folder):
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(FILES / folder, dtype=torch.float32).eval()
    ours = P.load_hf_dir(FILES / folder)
    ids = torch.randint(0, ours.config.vocab_size, (3, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, **UPSTREAM_TOL)


def test_same_file_name_two_generations(tmp_path):
    """full_sft_<hidden>.pth is what both trainers write: MiniMind2's 104M and minimind-3's 64M are both
    full_sft_768.pth. Each loads as its own generation, told apart by its keys and shapes."""
    minimind2 = U.random_model(U.upstream_layout(hidden_size=32), seed=3)
    old = U.save_pth(minimind2, tmp_path / "MiniMind2")
    new = tmp_path / "minimind-3" / "full_sft_32.pth"
    new.parent.mkdir()
    shutil.copy(FILES / CASES["dense"]["file"], new)
    assert old.name == new.name == "full_sft_32.pth"
    loaded_old, loaded_new = P.load_pth(old), P.load_pth(new)
    assert (loaded_old.config.generation, loaded_old.config.num_key_value_heads, loaded_old.config.qk_norm) == (
        "MiniMind2", 2, False)
    assert (loaded_new.config.generation, loaded_new.config.num_key_value_heads, loaded_new.config.qk_norm) == (
        "minimind-3", 4, True)
    ids = CASES["dense"]["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(loaded_new(ids).logits, CASES["dense"]["logits"], **UPSTREAM_TOL)
        torch.testing.assert_close(loaded_old(ids).logits, U.fp16_rounded(minimind2)(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["minimind-3", "minimind-3-moe", "MiniMind2", "MiniMind2-Small", "MiniMind2-MoE"])
def test_published_sizes_are_recognised_from_shapes(name):
    """A state dict of each published model's shapes (zero-stride tensors: no memory) gives its preset;
    the two 768-wide dense models (same file name) included."""
    config = mm.preset(name)
    with torch.device("meta"):
        shapes = mm.MiniMindForCausalLM(config).state_dict()
    state = {k: torch.zeros((), dtype=torch.float16).expand(v.shape) for k, v in shapes.items()}
    assert P.published_config(state) == config
    assert P.state_dict_generation(state) == config.generation
    assert P.pth_filename("full_sft", config.hidden_size, config.use_moe) == (
        "full_sft_768.pth" if name in ("minimind-3", "MiniMind2") else P.pth_filename("full_sft", *P.MODELS[name][:2]))
    expected = {"minimind-3": 63_912_192, "minimind-3-moe": 198_416_640, "MiniMind2": 104_030_976,
                "MiniMind2-Small": 25_829_888, "MiniMind2-MoE": 145_029_760}[name]
    assert mm.count_parameters(P.published_config(state)) == expected


def test_infer_config_reads_the_head_layout_from_qk_norm():
    state = torch.load(FILES / CASES["head_dim_untied"]["file"], weights_only=True)
    config = mm.infer_config(state)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 8)
    assert config.hidden_size // config.num_attention_heads != config.head_dim  # a free head_dim
    assert config.tie_word_embeddings is False
    with pytest.raises(ValueError, match="num_attention_heads=8 disagrees with the weights"):
        mm.infer_config(state, num_attention_heads=8)
    moe = torch.load(FILES / CASES["moe"]["file"], weights_only=True)
    with pytest.raises(ValueError, match="minimind-3-moe 1"):
        mm.infer_config(moe)
    assert mm.infer_config(moe, num_experts_per_tok=2).num_experts_per_tok == 2
    assert mm.infer_config(moe, num_experts_per_tok=1).n_shared_experts == 0
    # load_checkpoint reads an upstream .pth the same way (the course's own loader)
    loaded = mm.load_checkpoint(FILES / CASES["head_dim_untied"]["file"])
    with torch.no_grad():
        torch.testing.assert_close(loaded(CASES["head_dim_untied"]["input_ids"]).logits,
                                   CASES["head_dim_untied"]["logits"], **UPSTREAM_TOL)


def test_minimind_layout_config_keys_of_each_commit():
    """config.json of convert_torch2transformers_minimind: d65ef2c's keys make it minimind-3, c090b69's MiniMind2."""
    raw = json.loads((FILES / "minimind-3-tiny-minimind-layout" / "config.json").read_text())
    assert "num_experts" in raw and "tie_word_embeddings" not in raw  # what upstream's converter writes
    assert P.config_from_hf(raw) == mm.MiniMindConfig(generation="minimind-3", **CASES["dense"]["config"])
    minimind2 = U.minimind_config_json(U.upstream_layout())
    minimind2.pop("generation")  # c090b69's config has no generation key
    assert P.config_from_hf(minimind2).generation == "MiniMind2"


@pytest.mark.parametrize("change, message", [
    ({"use_sliding_window": True, "sliding_window": 4}, "sliding-window"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "sliding-window"),
    ({"attention_bias": True}, "attention_bias"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "RoPE scaling"),
    ({"vocab_size": None}, "lacks"),
])
def test_qwen3_config_json_that_minimind3_cannot_express(change, message):
    raw = {**json.loads((FILES / "minimind-3-tiny" / "config.json").read_text()), **change}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        P.config_from_hf(raw)


@pytest.mark.parametrize("change, message", [
    ({"mlp_only_layers": [0]}, "some layers are dense"),
    ({"decoder_sparse_step": 2}, "some layers are dense"),
])
def test_qwen3_moe_config_json_that_minimind3_cannot_express(change, message):
    raw = {**json.loads((FILES / "minimind-3-moe-tiny" / "config.json").read_text()), **change}
    with pytest.raises(ValueError, match=message):
        P.config_from_hf(raw)


# ---------------------------------------------------------------------- finding, fetching, skipping
@pytest.fixture
def tiny_published(monkeypatch):
    """Tiny synthetic models registered as 'published' ones of each generation."""
    for name, spec, generation in (("Tiny3", (32, False, 2), "minimind-3"), ("Tiny3-MoE", (32, True, 2), "minimind-3"),
                                   ("Tiny2", (32, False, 2), "MiniMind2")):
        monkeypatch.setitem(P.MODELS, name, spec)
        monkeypatch.setitem(P.MODEL_GENERATION, name, generation)
        monkeypatch.setitem(P.HUB_MODEL_REPOS, name, f"someone/{name}")


def test_hub_names_are_upstreams():
    assert P.HUB_MODEL_REPOS["minimind-3"] == "jingyaogong/minimind-3"
    assert P.HUB_MODEL_REPOS["minimind-3-moe"] == "jingyaogong/minimind-3-moe"
    assert P.HUB_PTH_REPOS == {"MiniMind2": "jingyaogong/MiniMind2-Pytorch", "minimind-3": "jingyaogong/minimind-3-pytorch"}
    assert P.HUB_TOKENIZER_REPOS["minimind-3"] == "jingyaogong/minimind-3"
    assert P.MODELS["minimind-3"] == (768, False, 8) and P.MODELS["minimind-3-moe"] == (768, True, 8)


def test_local_folder_with_both_generations(tmp_path, tiny_published):
    """One folder, MiniMind2's full_sft_32.pth and tokenizer at the top, minimind-3's in Tiny3/: each model
    finds its own file and its own tokenizer."""
    minimind2 = U.random_model(U.upstream_layout(hidden_size=32), seed=3)
    U.save_pth(minimind2, tmp_path)
    U.write_tokenizer(tmp_path)
    (tmp_path / "Tiny3").mkdir()
    shutil.copy(FILES / "full_sft_32.pth", tmp_path / "Tiny3" / "full_sft_32.pth")
    U.write_tokenizer_minimind3(tmp_path / "Tiny3")
    model, tok = P.load_pretrained("Tiny3", path=tmp_path)
    assert model.config.generation == "minimind-3" and P.tokenizer_folder_generation(tmp_path / "Tiny3") == "minimind-3"
    assert tok.encode("<think>") == [25]
    with torch.no_grad():
        torch.testing.assert_close(model(CASES["dense"]["input_ids"]).logits, CASES["dense"]["logits"], **UPSTREAM_TOL)
    model, tok = P.load_pretrained("Tiny2", path=tmp_path)
    assert model.config.generation == "MiniMind2" and P.tokenizer_folder_generation(tmp_path) == "MiniMind2"
    with pytest.raises(P.WeightsUnavailable, match="holds MiniMind2's weights.*same file names"):
        P.load_pretrained("Tiny3", path=tmp_path / "full_sft_32.pth")
    with pytest.raises(P.WeightsUnavailable, match="holds minimind-3's weights"):
        P.load_pretrained("Tiny2", path=tmp_path / "Tiny3" / "full_sft_32.pth")
    (tmp_path / "Tiny3" / "tokenizer.json").unlink()
    with pytest.raises(P.WeightsUnavailable, match="no tokenizer of that generation.*hold the other generation's"):
        P.load_pretrained("Tiny3", path=tmp_path)


def test_local_qwen3_folder(tmp_path, tiny_published):
    """`git clone https://huggingface.co/jingyaogong/minimind-3-moe` gives a Qwen3-MoE folder: found as <model>/."""
    shutil.copytree(FILES / "minimind-3-moe-tiny", tmp_path / "Tiny3-MoE")
    U.write_tokenizer_minimind3(tmp_path / "Tiny3-MoE")
    model, tok = P.load_pretrained("Tiny3-MoE", path=tmp_path)
    assert model.config.use_moe and model.config.generation == "minimind-3" and tok.eos_token_id == 2
    with torch.no_grad():
        torch.testing.assert_close(model(CASES["moe"]["input_ids"]).logits, CASES["moe"]["logits"], **UPSTREAM_TOL)


def test_download_asks_for_minimind3_repositories(tmp_path, tiny_published, monkeypatch):
    import types

    tokdir = U.write_tokenizer_minimind3(tmp_path / "tok")
    files = {("jingyaogong/minimind-3-pytorch", "full_sft_32.pth"): FILES / "full_sft_32.pth"}
    files.update({("jingyaogong/minimind-3", n): tokdir / n for n in ("tokenizer.json", "tokenizer_config.json")})
    calls = []
    hub = types.ModuleType("huggingface_hub")

    def hf_hub_download(repo_id, filename, revision=None, cache_dir=None):
        calls.append((repo_id, filename))
        if (repo_id, filename) not in files:
            raise FileNotFoundError(f"404: {repo_id}/{filename}")
        return str(files[repo_id, filename])

    hub.hf_hub_download = hf_hub_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    model, tok = P.load_pretrained("Tiny3", download=True)
    assert model.config.generation == "minimind-3" and tok.encode("<tool_call>") == [21]
    assert calls[0] == ("jingyaogong/minimind-3-pytorch", "full_sft_32.pth")
    assert {c[0] for c in calls[1:]} == {"jingyaogong/minimind-3"}


def test_load_or_skip_names_the_generation(capsys):
    assert P.load_or_skip("minimind-3") is None  # under pytest: skipped, whatever is configured
    assert capsys.readouterr().out == P.SKIP_NOTES["minimind-3"] + "\n"
    assert "minimind-3 weights not found" in P.SKIP_NOTES["minimind-3"]
    assert P.load_or_skip("MiniMind2-Small") is None
    assert capsys.readouterr().out == P.SKIP_NOTE + "\n"
