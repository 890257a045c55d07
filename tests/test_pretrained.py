"""minimind_ref.pretrained: upstream's published MiniMind2 files, tested offline on synthetic copies.

Each artifact is written in upstream's format from random weights (``tests/_upstream_files.py``
says how), loaded back, and compared with the model that wrote it. fp16 storage rounds the
weights, so the reference is the writer rounded to fp16 and back: loading is then exact, and the
logits are compared with ``rtol = atol = 0`` (same weights, same code, same process; a model kept
in fp16 computes in fp16 and is compared with ``rtol = atol = 1e-2``). The
cross-checks against ``transformers`` use its float32 tolerance ``rtol = atol = 1e-5``.

No test touches the network: ``no_network`` (autouse) makes every socket connection fail, and
the download paths run against a fake ``huggingface_hub``.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import torch

import minimind_ref as mm
from minimind_ref import pretrained as P
from minimind_ref.sft import render_chat

import _upstream_files as U
from _helpers import no_network  # noqa: F401 (autouse: no test here may use the network)

EXACT = dict(rtol=0, atol=0)
TRANSFORMERS_TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def dense():
    return U.random_model(U.upstream_layout(), seed=0)


@pytest.fixture(scope="module")
def moe():
    return U.random_model(U.upstream_layout(use_moe=True, hidden_size=64, intermediate_size=96), seed=1)


def ids_for(model, seed=0, batch=2, seq=13):
    return torch.randint(0, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(seed))


def assert_same_model(loaded, writer, dtype=torch.float32):
    """Same config, strict-equal weights, same logits as the fp16-rounded writer."""
    reference = U.fp16_rounded(writer)
    for field in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size",
                  "intermediate_size", "use_moe", "rope_theta", "rms_norm_eps"):
        assert getattr(loaded.config, field) == getattr(writer.config, field), field
    if writer.config.use_moe:
        for field in ("n_routed_experts", "n_shared_experts", "num_experts_per_tok"):
            assert getattr(loaded.config, field) == getattr(writer.config, field), field
    assert not loaded.training
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight, "tied after loading"
    ref_state = reference.state_dict()
    assert list(loaded.state_dict()) == list(ref_state)
    for key, value in loaded.state_dict().items():
        assert value.dtype == dtype, key
        torch.testing.assert_close(value.float(), ref_state[key], **EXACT)
    ids = ids_for(writer)
    with torch.no_grad():
        if dtype == torch.float32:
            torch.testing.assert_close(loaded(ids).logits, reference(ids).logits, **EXACT)
        else:  # computed in fp16 (the RoPE tables too): fp16 tolerance
            torch.testing.assert_close(loaded(ids).logits.float(), reference(ids).logits, rtol=1e-2, atol=1e-2)


# ---------------------------------------------------------------------- file names
@pytest.mark.parametrize("name, expected", [
    ("full_sft_512.pth", ("full_sft", 512, False, None)),
    ("full_sft_640_moe.pth", ("full_sft", 640, True, None)),
    ("pretrain_768.pth", ("pretrain", 768, False, None)),
    ("dpo_512.pth", ("dpo", 512, False, None)),
    ("rlhf_640_moe.pth", ("rlhf", 640, True, None)),
    ("reason_768.pth", ("reason", 768, False, None)),
    ("ppo_actor_512.pth", ("ppo_actor", 512, False, None)),
    ("grpo_768.pth", ("grpo", 768, False, None)),
    ("full_sft_512_zero.pth", ("full_sft", 512, False, "zero")),
])
def test_parse_upstream_names(name, expected):
    parsed = P.parse_pth_name(name)
    assert (parsed.stage, parsed.hidden_size, parsed.use_moe, parsed.tag) == expected
    assert parsed.filename == name


@pytest.mark.parametrize("name, message", [
    ("model.pth", "expected <stage>_<hidden>"),
    ("full_sft.pth", "expected <stage>_<hidden>"),
    ("full_sft_512.pt", "expected <stage>_<hidden>"),
    ("lora_identity_512.pth", "LoRA adapter"),
    ("full_sft_512_resume.pth", "full_sft_512.pth"),
])
def test_names_upstream_does_not_write_are_refused(name, message):
    with pytest.raises(ValueError, match=message):
        P.parse_pth_name(name)


# ---------------------------------------------------------------------- .pth files
def test_pth_dense_loads_strict_with_the_same_logits(tmp_path, dense):
    path = U.save_pth(dense, tmp_path)
    assert path.name == "full_sft_64.pth"
    blob = torch.load(path, weights_only=True)
    assert {v.dtype for v in blob.values()} == {torch.float16} and "lm_head.weight" in blob  # as upstream saves
    assert_same_model(P.load_pth(path), dense)


def test_pth_moe_loads_strict_with_the_same_logits(tmp_path, moe):
    path = U.save_pth(moe, tmp_path, stage="dpo")
    assert path.name == "dpo_64_moe.pth"
    loaded = P.load_pth(path)
    assert loaded.config.num_experts_per_tok == mm.minimind2_moe().num_experts_per_tok == 2
    assert_same_model(loaded, moe)


def test_pth_keeps_fp16_when_asked(tmp_path, dense):
    loaded = P.load_pth(U.save_pth(dense, tmp_path), dtype=None)
    assert loaded.lm_head.weight.dtype == torch.float16
    assert_same_model(loaded, dense, dtype=torch.float16)


def test_pth_published_sizes_are_the_presets(tmp_path):
    """A MiniMind2-Small-shaped file (built on the meta device, saved as zeros) loads as the preset."""
    config = mm.minimind2_small()
    with torch.device("meta"):
        shapes = mm.MiniMindForCausalLM(config).state_dict()
    state = {k: torch.zeros(v.shape, dtype=torch.float16) for k, v in shapes.items()}
    torch.save(state, tmp_path / "full_sft_512.pth")
    loaded = P.load_pth(tmp_path / "full_sft_512.pth", dtype=None)
    assert loaded.config == config
    assert mm.count_parameters(loaded) == 25_829_888


def test_pth_name_and_tensors_must_agree(tmp_path, dense, moe):
    U.save_pth(dense, tmp_path, name="full_sft_768.pth")
    with pytest.raises(ValueError, match="renamed file.*full_sft_64.pth"):
        P.load_pth(tmp_path / "full_sft_768.pth")
    U.save_pth(moe, tmp_path, name="full_sft_64.pth")
    with pytest.raises(ValueError, match="MoE"):
        P.load_pth(tmp_path / "full_sft_64.pth")


def test_pth_bad_files_are_clear_errors(tmp_path, dense):
    (tmp_path / "full_sft_64.pth").write_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 58238276\n")
    with pytest.raises(ValueError, match="Git LFS pointer"):
        P.load_pth(tmp_path / "full_sft_64.pth")
    (tmp_path / "full_sft_64.pth").write_bytes(b"\x00garbage" * 300)
    with pytest.raises(ValueError, match="could not be read"):
        P.load_pth(tmp_path / "full_sft_64.pth")
    with pytest.raises(FileNotFoundError):
        P.load_pth(tmp_path / "pretrain_64.pth")

    old = {"tok_embeddings.weight": torch.zeros(4, 4), "layers.0.attention.wq.weight": torch.zeros(4, 4)}
    torch.save(old, tmp_path / "full_sft_64.pth")
    with pytest.raises(ValueError, match="before 2025-04-26"):
        P.load_pth(tmp_path / "full_sft_64.pth")

    torch.save({"model": dense.state_dict(), "optimizer": {}, "step": 3}, tmp_path / "full_sft_64.pth")
    with pytest.raises(ValueError, match="resume"):
        P.load_pth(tmp_path / "full_sft_64.pth")

    # a tied model's head copy that was changed: refused, asking which it is (tests/test_head_tying.py: the rule)
    state = {k: v.half() for k, v in dense.state_dict().items()}
    state["lm_head.weight"] = state["lm_head.weight"].clone()
    state["lm_head.weight"][0, :3] += 1
    torch.save(state, tmp_path / "full_sft_64.pth")
    with pytest.raises(ValueError, match="the weights do not say which.*pass tie_word_embeddings=False"):
        P.load_pth(tmp_path / "full_sft_64.pth")


# ---------------------------------------------------------------------- Hugging Face folders
@pytest.mark.parametrize("weights, transformers5", [("safetensors", False), ("bin", False), ("safetensors", True)])
def test_llama_folder(tmp_path, dense, weights, transformers5):
    folder = U.save_llama_dir(dense, tmp_path / "MiniMind2-Tiny", weights=weights, transformers5=transformers5)
    assert_same_model(P.load_hf_dir(folder), dense)


def test_llama_folder_with_untied_config_but_equal_head(tmp_path, dense):
    """Some hub copies say tie_word_embeddings: false and store both (equal) matrices. Issue 38's one rule
    (checkpoint.head_tying): the folder declares untied and the weights do not contradict it, so the model
    is untied, as transformers loads it, with the same logits; tie_word_embeddings=True loads it tied. A
    head of its own in such a folder is kept (it was refused: 'MiniMind2 ties them')."""
    folder = U.save_llama_dir(dense, tmp_path / "untied", weights="bin", tie=False)
    loaded = P.load_hf_dir(folder)
    assert not loaded.config.tie_word_embeddings and loaded.lm_head.weight is not loaded.model.embed_tokens.weight
    assert_same_model(P.load_hf_dir(folder, tie_word_embeddings=True), dense)
    ids = ids_for(dense)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, P.load_hf_dir(folder, tie_word_embeddings=True)(ids).logits,
                                   rtol=0, atol=0)
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    state["lm_head.weight"] = state["lm_head.weight"] * 2
    torch.save(state, folder / "pytorch_model.bin")
    loaded = P.load_hf_dir(folder)
    assert torch.equal(loaded.lm_head.weight, state["lm_head.weight"].float())
    assert torch.equal(loaded.model.embed_tokens.weight, state["model.embed_tokens.weight"].float())


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_minimind_folder(tmp_path, dense, moe, which):
    model = {"dense": dense, "moe": moe}[which]
    folder = U.save_minimind_dir(model, tmp_path / which)
    raw = json.loads((folder / "config.json").read_text())
    assert raw["model_type"] == "minimind" and "auto_map" in raw
    assert_same_model(P.load_hf_dir(folder), model)


def test_sharded_safetensors_folder(tmp_path, dense):
    from safetensors.torch import save_file

    folder = U.save_llama_dir(dense, tmp_path / "sharded", with_tokenizer=False)
    state = torch.load(U.save_pth(dense, tmp_path / "pth"), weights_only=True)
    del state["lm_head.weight"]
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for name, part in shards.items():
        save_file({k: state[k].contiguous() for k in part}, str(folder / name))
    (folder / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": {k: name for name, part in shards.items() for k in part}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert_same_model(P.load_hf_dir(folder), dense)


def test_folder_errors(tmp_path, dense, monkeypatch):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        P.load_hf_dir(tmp_path)
    folder = U.save_llama_dir(dense, tmp_path / "m", with_tokenizer=False)
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="holds no weights"):
        P.load_hf_dir(folder)

    folder = U.save_llama_dir(dense, tmp_path / "st", with_tokenizer=False)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)  # as if safetensors were not installed
    with pytest.raises(ImportError, match="pip install safetensors"):
        P.load_hf_dir(folder)


@pytest.mark.parametrize("change, message", [
    ({"model_type": "gpt2"}, "model_type 'gpt2'"),
    ({"head_dim": 16}, "head_dim"),
    ({"attention_bias": True}, "attention_bias"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "RoPE scaling"),
    ({"dim": 512, "n_layers": 8}, "before 2025-04-26"),
])
def test_config_json_that_is_not_minimind2(dense, change, message):
    raw = {**U.llama_config_json(dense.config), **change}
    with pytest.raises(ValueError, match=message):
        P.config_from_hf(raw)


def test_config_json_layouts_give_the_same_config(dense):
    from_llama = P.config_from_hf(U.llama_config_json(dense.config))
    from_llama5 = P.config_from_hf(U.llama_config_json(dense.config, transformers5=True))
    from_minimind = P.config_from_hf(U.minimind_config_json(dense.config))
    assert from_llama == from_llama5 == from_minimind == dense.config


def test_published_minimind2_config_json():
    """The config.json of jingyaogong/MiniMind2 (as mirrored in public clones) is MiniMind2's preset."""
    published = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                 "bos_token_id": 1, "eos_token_id": 2, "head_dim": 96, "hidden_act": "silu", "hidden_size": 768,
                 "initializer_range": 0.02, "intermediate_size": 2048, "max_position_embeddings": 32768,
                 "mlp_bias": False, "model_type": "llama", "num_attention_heads": 8, "num_hidden_layers": 16,
                 "num_key_value_heads": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
                 "rope_theta": 1000000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
                 "transformers_version": "4.51.3", "use_cache": True, "vocab_size": 6400}
    assert P.config_from_hf(published) == mm.minimind2()


# ---------------------------------------------------------------------- tokenizer and chat template
CONVERSATIONS = {
    "one user turn": [{"role": "user", "content": "hi"}],
    "system prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "u"},
                      {"role": "assistant", "content": "a"}],
    "multi-turn": [{"role": "user", "content": "What is 12 plus 30?"}, {"role": "assistant", "content": "42"},
                   {"role": "user", "content": "长江有多长？"}, {"role": "assistant", "content": "约6300公里。"}],
    "later system turn": [{"role": "user", "content": "u"}, {"role": "system", "content": "be brief"},
                          {"role": "user", "content": "v"}],
    "newlines": [{"role": "user", "content": ""}, {"role": "assistant", "content": "line 1\nline 2"}],
}


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("tokenizers")
    return {"config": U.write_tokenizer(base / "config"), "jinja": U.write_tokenizer(base / "jinja", template_file=True)}


@pytest.mark.parametrize("where", ["config", "jinja"])
def test_tokenizer_specials_and_round_trip(tokenizer_dirs, where):
    tok = P.load_tokenizer_dir(tokenizer_dirs[where])
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 0)
    assert tok.special_tokens == {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                                  "unk_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    assert len(tok) == U.len_vocab()
    for text in U.TEXTS + ["mixed 中文 and English, tabs\tand\nnewlines  ", "unseen: ☃ ñ 😀"]:
        ids = tok.encode(text)
        assert all(i > 2 for i in ids), "plain text never becomes a special token"
        assert tok.decode(ids) == text
        assert tok.decode(torch.tensor(ids)) == text
    assert tok.encode("<|im_start|>user\nhi<|im_end|>")[0] == 1


@pytest.mark.parametrize("where", ["config", "jinja"])
@pytest.mark.parametrize("name", list(CONVERSATIONS))
@pytest.mark.parametrize("gen", [False, True])
def test_chat_template_renders_as_render_chat(tokenizer_dirs, where, name, gen):
    tok = P.load_tokenizer_dir(tokenizer_dirs[where])
    assert tok.chat_template == U.CHAT_TEMPLATE
    messages = CONVERSATIONS[name]
    text = tok.apply_chat_template(messages, add_generation_prompt=gen)
    assert text == render_chat(messages, add_generation_prompt=gen, template="minimind2")  # MiniMind2's folders
    ids = tok.apply_chat_template(messages, add_generation_prompt=gen, tokenize=True)
    assert ids == tok.encode(text) and ids[0] == tok.bos_token_id
    assert tok.decode(ids) == text


def test_chat_template_jinja_file_wins_over_config(tmp_path):
    folder = U.write_tokenizer(tmp_path, chat_template="{{ 'from config' }}")
    (tmp_path / "chat_template.jinja").write_text("{{ 'from file' }}")
    assert P.load_tokenizer_dir(folder).apply_chat_template([{"role": "user", "content": "x"}]) == "from file"


def test_chat_template_flags_and_tools(tokenizer_dirs):
    tok = P.load_tokenizer_dir(tokenizer_dirs["config"])
    hi = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(hi, add_generation_prompt=True, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    text = tok.apply_chat_template(hi, add_generation_prompt=True, tools=tools)
    assert text.startswith("<|im_start|>system\n# Tools") and '{"type": "function"' in text


def test_tokenizer_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer_config.json"):
        P.load_tokenizer_dir(tmp_path)
    folder = U.write_tokenizer(tmp_path / "bad")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"]["1"]["content"] = "<|im_end|>"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="do not belong together"):
        P.load_tokenizer_dir(folder)
    folder = U.write_tokenizer(tmp_path / "none", chat_template=None)
    with pytest.raises(ValueError, match="no chat template"):
        P.load_tokenizer_dir(folder).apply_chat_template([{"role": "user", "content": "x"}])


def test_old_template_is_rendered_as_written(tmp_path):
    """Before 2025-10-24 the template appended the generation prompt after every user turn; the loader
    renders whatever template the folder holds (it equals render_chat only when the prompt ends a user turn)."""
    tok = P.load_tokenizer_dir(U.write_tokenizer(tmp_path, chat_template=U.OLD_CHAT_TEMPLATE))
    hi = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(hi) == render_chat(hi, add_generation_prompt=True, template="minimind2")
    assert tok.apply_chat_template(CONVERSATIONS["later system turn"]) != render_chat(CONVERSATIONS["later system turn"],
                                                                                      template="minimind2")


# ---------------------------------------------------------------------- transformers cross-checks
def test_llama_folder_loads_in_transformers_with_the_same_logits(tmp_path, dense):
    transformers = pytest.importorskip("transformers")
    folder = U.save_llama_dir(dense, tmp_path / "llama")
    theirs = transformers.LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    ours = P.load_hf_dir(folder)
    ids = ids_for(dense)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, **TRANSFORMERS_TOL)


def test_folder_written_by_transformers_loads(tmp_path, dense):
    """The folder transformers' own save_pretrained writes, as convert_torch2transformers_llama does."""
    transformers = pytest.importorskip("transformers")
    c = dense.config
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta, tie_word_embeddings=True))
    llama.load_state_dict(dense.state_dict(), strict=False)
    llama.to(torch.float16).save_pretrained(tmp_path / "saved")
    assert_same_model(P.load_hf_dir(tmp_path / "saved"), dense)


@pytest.mark.parametrize("where", ["config", "jinja"])
def test_tokenizer_agrees_with_transformers(tokenizer_dirs, where):
    transformers = pytest.importorskip("transformers")
    theirs = transformers.PreTrainedTokenizerFast.from_pretrained(tokenizer_dirs[where])
    ours = P.load_tokenizer_dir(tokenizer_dirs[where])
    assert (theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id) == (
        ours.bos_token_id, ours.eos_token_id, ours.pad_token_id)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"x": {"type": "integer"}}}}]
    for messages in CONVERSATIONS.values():
        for kwargs in ({}, {"add_generation_prompt": True}, {"add_generation_prompt": True, "tools": tools},
                       {"add_generation_prompt": True, "enable_thinking": False}):
            assert ours.apply_chat_template(messages, **kwargs) == theirs.apply_chat_template(messages, tokenize=False,
                                                                                                **kwargs)
        text = render_chat(messages, add_generation_prompt=True, template="minimind2")
        assert ours.encode(text) == theirs(text)["input_ids"]
        assert ours.decode(ours.encode(text), skip_special_tokens=True) == theirs.decode(
            theirs(text)["input_ids"], skip_special_tokens=True)


# ---------------------------------------------------------------------- finding, fetching, skipping
@pytest.fixture
def tiny_published(monkeypatch):
    """Register the tiny synthetic model as a 'published' one, so the lookup code can be exercised."""
    monkeypatch.setitem(P.MODELS, "Tiny", (64, False, 2))
    monkeypatch.setitem(P.MODELS, "Tiny-MoE", (64, True, 2))
    monkeypatch.setitem(P.HUB_MODEL_REPOS, "Tiny", "someone/Tiny")
    monkeypatch.setitem(P.HUB_MODEL_REPOS, "Tiny-MoE", "someone/Tiny-MoE")


def test_local_folder_with_pth_and_tokenizer_in_model_subfolder(tmp_path, dense, tiny_published):
    U.save_pth(dense, tmp_path)
    U.write_tokenizer(tmp_path / "model")  # upstream's GitHub layout: model/tokenizer.json
    model, tok = P.load_pretrained("Tiny", path=tmp_path)
    assert_same_model(model, dense)
    assert tok.eos_token_id == 2


def test_local_hf_folder_and_env_variable(tmp_path, dense, moe, tiny_published, monkeypatch):
    U.save_llama_dir(dense, tmp_path / "Tiny")
    U.save_pth(moe, tmp_path / "pth", stage="full_sft")
    monkeypatch.setenv("MINIMIND_WEIGHTS", str(tmp_path))
    model, tok = P.load_pretrained("Tiny")  # full_sft: the transformers folder <model>/ serves
    assert_same_model(model, dense)
    with pytest.raises(P.WeightsUnavailable, match="dpo_64.pth"):
        P.load_pretrained("Tiny", stage="dpo")
    with pytest.raises(P.WeightsUnavailable, match="full_sft_64_moe.pth"):
        P.load_pretrained("Tiny-MoE")
    U.write_tokenizer(tmp_path / "pth")
    model, _ = P.load_pretrained("Tiny-MoE", path=tmp_path / "pth" / "full_sft_64_moe.pth")
    assert_same_model(model, moe)
    with pytest.raises(P.WeightsUnavailable, match="not Tiny's full_sft weights"):
        P.load_pretrained("Tiny", path=tmp_path / "pth" / "full_sft_64_moe.pth")


def test_weights_without_tokenizer(tmp_path, dense, tiny_published):
    U.save_pth(dense, tmp_path)
    with pytest.raises(P.WeightsUnavailable, match="no tokenizer"):
        P.load_pretrained("Tiny", path=tmp_path)


def test_nothing_configured_says_what_to_do():
    with pytest.raises(P.WeightsUnavailable, match="MINIMIND_WEIGHTS"):
        P.load_pretrained("MiniMind2-Small")
    with pytest.raises(ValueError, match="published models"):
        P.load_pretrained("MiniMind3")


def fake_hub(monkeypatch, files, calls):
    """A stand-in for huggingface_hub that serves local files and records every request."""
    hub = types.ModuleType("huggingface_hub")

    def hf_hub_download(repo_id, filename, revision=None, cache_dir=None):
        calls.append((repo_id, filename))
        if (repo_id, filename) not in files:
            raise FileNotFoundError(f"404: {repo_id}/{filename}")
        return str(files[repo_id, filename])

    def snapshot_download(repo_id, revision=None, cache_dir=None, allow_patterns=None):
        calls.append((repo_id, None))
        raise ConnectionError("offline")

    hub.hf_hub_download, hub.snapshot_download = hf_hub_download, snapshot_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)


def test_download_path_asks_for_upstream_files(tmp_path, dense, tiny_published, monkeypatch):
    weights = U.save_pth(dense, tmp_path / "hub")
    tokdir = U.write_tokenizer(tmp_path / "hub-tokenizer", template_file=True)
    files = {(P.HUB_PTH_REPO, "full_sft_64.pth"): weights}
    files.update({(P.HUB_TOKENIZER_REPO, n): tokdir / n for n in ("tokenizer.json", "tokenizer_config.json",
                                                                  "chat_template.jinja")})
    calls = []
    fake_hub(monkeypatch, files, calls)
    model, tok = P.load_pretrained("Tiny", download=True)
    assert_same_model(model, dense)
    assert tok.chat_template == U.CHAT_TEMPLATE
    assert calls[0] == ("jingyaogong/MiniMind2-Pytorch", "full_sft_64.pth")
    assert {c[0] for c in calls[1:]} == {"jingyaogong/MiniMind2-Small"}
    assert ("jingyaogong/MiniMind2-Small", "special_tokens_map.json") in calls  # optional, absent here: ignored

    calls.clear()  # in Colab, download is the default
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    P.load_pretrained("Tiny")
    assert calls[0] == ("jingyaogong/MiniMind2-Pytorch", "full_sft_64.pth")

    with pytest.raises(P.WeightsUnavailable, match="could not download jingyaogong/MiniMind2-Pytorch/dpo_64.pth"):
        P.load_pretrained("Tiny", stage="dpo")
    with pytest.raises(P.WeightsUnavailable, match="ConnectionError: offline.*local folder"):
        P.fetch("jingyaogong/MiniMind2")


def test_fetch_without_huggingface_hub(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(P.WeightsUnavailable, match=r'pip install "minimind-ref\[hub\]".*MINIMIND_WEIGHTS'):
        P.fetch("jingyaogong/MiniMind2-Pytorch", "full_sft_512.pth")


def test_real_huggingface_hub_offline_is_one_clear_error(tmp_path, monkeypatch):
    hub = pytest.importorskip("huggingface_hub")
    import huggingface_hub.constants  # noqa: F401 (a lazy submodule: alone in a process it is not loaded yet)

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", True)  # read at import time, and it may be imported
    with pytest.raises(P.WeightsUnavailable, match="could not download"):
        P.fetch("jingyaogong/MiniMind2-Pytorch", "full_sft_512.pth", cache_dir=tmp_path)


def test_load_or_skip(tmp_path, dense, tiny_published, monkeypatch, capsys):
    U.save_pth(dense, tmp_path)
    U.write_tokenizer(tmp_path)
    monkeypatch.setenv("MINIMIND_WEIGHTS", str(tmp_path))
    # under pytest (nbval kernels inherit PYTEST_VERSION) the cells skip, whatever is configured
    assert "PYTEST_VERSION" in __import__("os").environ
    assert P.load_or_skip("Tiny") is None
    assert capsys.readouterr().out == P.SKIP_NOTE + "\n"

    monkeypatch.delenv("PYTEST_VERSION")
    model, tok = P.load_or_skip("Tiny")
    assert_same_model(model, dense)
    assert capsys.readouterr().out == ""

    monkeypatch.setenv("MINIMIND_REAL_WEIGHTS", "off")
    assert P.load_or_skip("Tiny") is None
    assert capsys.readouterr().out == P.SKIP_NOTE + "\n"
    monkeypatch.delenv("MINIMIND_REAL_WEIGHTS")

    assert P.load_or_skip("Tiny-MoE") is None  # configured, but that model is not there: say so
    out = capsys.readouterr().out
    assert out.startswith("Optional cell skipped: Tiny-MoE (full_sft) is not in") and out.count("\n") == 1

    monkeypatch.delenv("MINIMIND_WEIGHTS")
    assert P.load_or_skip("Tiny") is None  # nothing configured, not in Colab: the machine-independent note
    assert capsys.readouterr().out == P.SKIP_NOTE + "\n"

    (tmp_path / "full_sft_64.pth").write_bytes(b"\x00broken" * 300)
    with pytest.raises(ValueError, match="could not be read"):  # a broken file is an error, not a skip
        P.load_or_skip("Tiny", path=tmp_path)
