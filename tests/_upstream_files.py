"""Synthetic stand-ins for upstream's published MiniMind2 and minimind-3 files, written the way upstream writes them.

Every builder makes a file in one of upstream's formats from random weights, so the loaders of
``minimind_ref.pretrained`` are tested without the network and without the real (large) files:

* ``save_pth``: ``torch.save({k: v.half().cpu() for k, v in state_dict.items()}, f"{stage}_{hidden}[_moe].pth")``,
  as upstream's trainers save (both tied keys stored, fp16).
* ``save_llama_dir``: what ``scripts/convert_model.py``'s ``convert_torch2transformers_llama`` leaves
  after ``LlamaForCausalLM.save_pretrained``: ``config.json`` (``model_type: llama``; the fields of
  the published ``jingyaogong/MiniMind2`` config, in transformers-4 or transformers-5 spelling) and
  ``model.safetensors`` (the tied ``lm_head.weight`` dropped, as transformers does) or
  ``pytorch_model.bin``, fp16.
* ``save_minimind_dir``: ``convert_torch2transformers_minimind``'s ``save_pretrained(safe_serialization=False)``:
  ``config.json`` with ``model_type: minimind``, ``auto_map`` and ``MiniMindConfig``'s fields, and
  ``pytorch_model.bin``.
* ``write_tokenizer``: a small byte-level BPE trained like upstream's ``train_tokenizer.py`` (specials
  ``<|endoftext|>`` 0, ``<|im_start|>`` 1, ``<|im_end|>`` 2) saved as ``tokenizer.json`` plus
  upstream's ``tokenizer_config.json`` with its chat template (``tests/data/upstream_chat_template.jinja``),
  or the template in ``chat_template.jinja`` as recent transformers save it.
* ``write_tokenizer_minimind3``: minimind-3's tokenizer folder (d65ef2c): a small byte-level BPE
  trained like ``trainer/train_tokenizer.py`` (``d65ef2c:trainer/train_tokenizer.py:28-42``: 36 added
  tokens at ids 0-35, the 21 of ``special_tokens_list`` special, ``<tool_call>`` .. ``</think>`` and
  ``<|buffer1..9|>`` not) saved as ``tokenizer.json`` plus upstream's ``model/tokenizer_config.json``
  at d65ef2c, written byte for byte as that file, with its chat template
  (``tests/data/upstream_chat_template_minimind3.jinja``, ``d65ef2c:model/tokenizer_config.json:333``:
  tools, tool calls, ``reasoning_content`` as ``<think>`` blocks, the ``open_thinking`` switch).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Optional

import torch

import minimind_ref as mm
from minimind_ref.tokenizer import train_bpe_tokenizer

DATA = Path(__file__).parent / "data"
CHAT_TEMPLATE = (DATA / "upstream_chat_template.jinja").read_text(encoding="utf-8")

#: The template upstream's tokenizer_config.json held before the 2025-10-24 update (no tools, the
#: generation prompt always appended after a user turn); still in some hub snapshots.
OLD_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set system_message = messages[0]['content'] %}"
    "{{ '<|im_start|>system\\n' + system_message + '<|im_end|>\\n' }}{% else %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}{% set content = message['content'] %}{% if message['role'] == 'user' %}"
    "{{ '<|im_start|>user\\n' + content + '<|im_end|>\\n<|im_start|>assistant\\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ content + '<|im_end|>' + '\\n' }}{% endif %}{% endfor %}"
)

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "MiniMind is a tiny language model trained from scratch.",
    "You are a helpful assistant. Answer the question briefly.",
    "长江是中国最长的河流，全长约6300公里。",
    "大熊猫主要以竹子为食。",
    "What is 12 plus 30? It is 42.",
    "def add(a, b):\n    return a + b\n",
]


def tokenizer_config(chat_template: Optional[str] = CHAT_TEMPLATE) -> dict:
    """Upstream's model/tokenizer_config.json at c090b69 (three specials at 0/1/2, no BOS/EOS added:
    ``c090b69:model/tokenizer_config.json:2-30``), plus ``extra_special_tokens: {}``, which that file
    does not have (upstream adds it for transformers 5 when it converts a model,
    ``d65ef2c:scripts/convert_model.py:30-32 "extra_special_tokens"``)."""
    special = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
    config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(i): {"content": tok, **special} for i, tok in enumerate(SPECIALS)},
        "additional_special_tokens": [],
        "bos_token": "<|im_start|>",
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "extra_special_tokens": {},
        "legacy": True,
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "sp_model_kwargs": {},
        "spaces_between_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<|endoftext|>",
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    return config


_TOKENIZER_CACHE: dict = {}


def train_tokenizer(vocab_size: int = 400):
    """A byte-level BPE trained the way upstream trains its 6,400-token one (no digit splitting)."""
    if vocab_size not in _TOKENIZER_CACHE:
        _TOKENIZER_CACHE[vocab_size] = train_bpe_tokenizer(TEXTS * 20, vocab_size=vocab_size, split_digits=False,
                                                           min_frequency=1)
    return _TOKENIZER_CACHE[vocab_size]


def write_tokenizer(folder: Path, template_file: bool = False, chat_template: str = CHAT_TEMPLATE,
                    vocab_size: int = 400) -> Path:
    """tokenizer.json + tokenizer_config.json (+ chat_template.jinja when ``template_file``)."""
    folder.mkdir(parents=True, exist_ok=True)
    train_tokenizer(vocab_size).save(str(folder / "tokenizer.json"))
    config = tokenizer_config(None if template_file else chat_template)
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8")
    if template_file:
        (folder / "chat_template.jinja").write_text(chat_template, encoding="utf-8")
    return folder


# ---------------------------------------------------------------------- minimind-3's tokenizer (d65ef2c)
CHAT_TEMPLATE_MINIMIND3 = (DATA / "upstream_chat_template_minimind3.jinja").read_text(encoding="utf-8")

#: ``d65ef2c:trainer/train_tokenizer.py:28-42``: ``special_tokens_list`` (ids 0-20, special), then
#: ``additional_tokens_list`` (21-26) and ``num_buffer = 36 - 27 = 9`` buffer tokens (27-35), not special.
SPECIALS_MINIMIND3 = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>",
)
ADDITIONAL_MINIMIND3 = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
BUFFERS_MINIMIND3 = tuple(f"<|buffer{i}|>" for i in range(1, 10))
ADDED_MINIMIND3 = SPECIALS_MINIMIND3 + ADDITIONAL_MINIMIND3 + BUFFERS_MINIMIND3  # ids 0..35

#: Conversation-like training texts (upstream trains on the joined contents of sft_t2t_mini.jsonl).
TEXTS_MINIMIND3 = TEXTS + [
    "<think>\nThe user asks for the weather, so I call the tool.\n</think>\n\nLet me check.",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Beijing"}}\n</tool_call>',
    "<tool_response>\n{\"temperature\": 21}\n</tool_response>",
    "北京今天21度，天气晴朗。",
]


def tokenizer_config_minimind3(chat_template: Optional[str] = CHAT_TEMPLATE_MINIMIND3) -> dict:
    """Upstream's model/tokenizer_config.json at d65ef2c, key for key and in its order (``json.dumps(...,
    indent=4, ensure_ascii=False)`` of it is the file, byte for byte)."""
    added = {str(i): {"content": tok, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": tok in SPECIALS_MINIMIND3} for i, tok in enumerate(ADDED_MINIMIND3)}
    config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in SPECIALS_MINIMIND3 if t != "<|endoftext|>"],
        "bos_token": "<|im_start|>",
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "legacy": True,
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "sp_model_kwargs": {},
        "spaces_between_special_tokens": False,
        "unk_token": "<|endoftext|>",
        "image_token": "<|image_pad|>",
        "audio_token": "<|audio_pad|>",
        "video_token": "<|video_pad|>",
        "vision_bos_token": "<|vision_start|>",
        "vision_eos_token": "<|vision_end|>",
        "audio_bos_token": "<|audio_start|>",
        "audio_eos_token": "<|audio_end|>",
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    return config


def train_tokenizer_minimind3(vocab_size: int = 400):
    """A byte-level BPE trained as trainer/train_tokenizer.py (d65ef2c) trains minimind-3's 6,400-token
    one: BPE + ByteLevel(add_prefix_space=False), BpeTrainer with the 36 added tokens and the byte
    alphabet (default min_frequency), a ByteLevel decoder, ``add_special_tokens(special_tokens_list)``,
    and ``special`` set to false in tokenizer.json for every added token outside that list."""
    key = ("minimind-3", vocab_size)
    if key not in _TOKENIZER_CACHE:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      special_tokens=list(ADDED_MINIMIND3))
        tokenizer.train_from_iterator(TEXTS_MINIMIND3 * 20, trainer=trainer)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.add_special_tokens(list(SPECIALS_MINIMIND3))
        data = json.loads(tokenizer.to_str())
        for entry in data["added_tokens"]:
            if entry["content"] not in SPECIALS_MINIMIND3:
                entry["special"] = False
        tokenizer = Tokenizer.from_str(json.dumps(data, ensure_ascii=False))
        for i, tok in enumerate(ADDED_MINIMIND3):
            assert tokenizer.token_to_id(tok) == i, f"{tok} should have id {i}"
        _TOKENIZER_CACHE[key] = tokenizer
    return _TOKENIZER_CACHE[key]


def write_tokenizer_minimind3(folder: Path, vocab_size: int = 400,
                              chat_template: Optional[str] = CHAT_TEMPLATE_MINIMIND3) -> Path:
    """minimind-3's tokenizer folder: tokenizer.json (indent 2, as upstream rewrites it) +
    tokenizer_config.json (indent 4, ensure_ascii=False, as upstream's trainer dumps it)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = json.loads(train_tokenizer_minimind3(vocab_size).to_str())
    (folder / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False, indent=2), encoding="utf-8")
    config = tokenizer_config_minimind3(chat_template)
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=4), encoding="utf-8")
    return folder


def len_vocab_minimind3(vocab_size: int = 400) -> int:
    return train_tokenizer_minimind3(vocab_size).get_vocab_size()


def upstream_layout(**overrides) -> mm.MiniMindConfig:
    """A tiny config with the published head layout (8 query heads, 2 KV heads), which the .pth loader
    assumes because no shape holds it."""
    base = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                vocab_size=len_vocab(), max_position_embeddings=32768)
    base.update(overrides)
    return mm.MiniMindConfig(**base)


def len_vocab(vocab_size: int = 400) -> int:
    return train_tokenizer(vocab_size).get_vocab_size()


def random_model(config: mm.MiniMindConfig, seed: int = 0) -> mm.MiniMindForCausalLM:
    """Random weights, the norm weights too (a loader that forgot them would still pass with ones)."""
    torch.manual_seed(seed)
    model = mm.MiniMindForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def fp16_rounded(model: mm.MiniMindForCausalLM) -> mm.MiniMindForCausalLM:
    """The model a fp16 file holds, back in fp32: the reference a loaded upstream file must equal."""
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.half().float())
    return rounded.eval()


def save_pth(model: mm.MiniMindForCausalLM, folder: Path, stage: str = "full_sft", name: Optional[str] = None) -> Path:
    """upstream: torch.save({k: v.half().cpu() for k, v in state_dict.items()}, f'{stage}_{hidden}{_moe}.pth')."""
    folder.mkdir(parents=True, exist_ok=True)
    c = model.config
    path = folder / (name or f"{stage}_{c.hidden_size}{'_moe' if c.use_moe else ''}.pth")
    torch.save({k: v.half().cpu() for k, v in model.state_dict().items()}, path)
    return path


def llama_config_json(config: mm.MiniMindConfig, transformers5: bool = False, tie: bool = True) -> dict:
    """config.json as LlamaForCausalLM.save_pretrained writes it for convert_torch2transformers_llama
    (field set of the published jingyaogong/MiniMind2 config; transformers 5 spells RoPE and dtype anew)."""
    out = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": config.hidden_size // config.num_attention_heads,
        "hidden_act": "silu",
        "hidden_size": config.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": config.num_attention_heads,
        "num_hidden_layers": config.num_hidden_layers,
        "num_key_value_heads": config.num_key_value_heads,
        "pretraining_tp": 1,
        "rms_norm_eps": config.rms_norm_eps,
        "tie_word_embeddings": tie,
        "use_cache": True,
        "vocab_size": config.vocab_size,
    }
    if transformers5:
        out.update({"dtype": "float16", "pad_token_id": None, "transformers_version": "5.6.2",
                    "rope_parameters": {"rope_theta": config.rope_theta, "rope_type": "default"}})
    else:
        out.update({"rope_scaling": None, "rope_theta": config.rope_theta, "torch_dtype": "float16",
                    "transformers_version": "4.51.3"})
    return dict(sorted(out.items()))


def save_llama_dir(model: mm.MiniMindForCausalLM, folder: Path, weights: str = "safetensors",
                   transformers5: bool = False, tie: bool = True, with_tokenizer: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cfg = llama_config_json(model.config, transformers5, tie)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    state = {k: v.detach().half().contiguous() for k, v in model.state_dict().items()}
    if weights == "safetensors":
        from safetensors.torch import save_file

        if tie:
            del state["lm_head.weight"]  # transformers drops the tied duplicate (safetensors forbids aliases)
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    else:
        torch.save(state, folder / "pytorch_model.bin")
    if with_tokenizer:
        write_tokenizer(folder, template_file=transformers5)
    return folder


def minimind_config_json(config: mm.MiniMindConfig) -> dict:
    """config.json of MiniMindConfig.save_pretrained after convert_torch2transformers_minimind."""
    out = dict(config.to_dict())
    out["rope_scaling"] = dict(config.rope_scaling) if config.rope_scaling else None
    out.update({
        "architectures": ["MiniMindForCausalLM"],
        "auto_map": {"AutoConfig": "model_minimind.MiniMindConfig",
                     "AutoModelForCausalLM": "model_minimind.MiniMindForCausalLM"},
        "model_type": "minimind",
        "max_seq_len": 8192,  # convert_model.py's __main__ passes it; MiniMindConfig keeps it as an extra
        "torch_dtype": "float16",
        "transformers_version": "4.57.6",
    })
    return dict(sorted(out.items()))


def save_minimind_dir(model: mm.MiniMindForCausalLM, folder: Path, with_tokenizer: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(minimind_config_json(model.config), indent=2), encoding="utf-8")
    torch.save({k: v.detach().half() for k, v in model.state_dict().items()}, folder / "pytorch_model.bin")
    if with_tokenizer:
        write_tokenizer(folder)
    return folder
