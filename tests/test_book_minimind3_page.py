"""The numbers of book/minimind2_to_minimind3.md ("MiniMind2 → minimind-3") come from minimind_ref.

A book page cannot run code, so every count the page states (parameters, widths, cache bytes,
adapter sizes) is recomputed here and must appear in the page exactly as written; and every
thousands-separated number on the page must be one of them, so a number typed by hand (or left
behind by a change to the package) fails this test. Settings the page quotes from upstream (learning
rates, β, published sizes) are upstream's and are not recomputed; the generation defaults it quotes
are checked against ``minimind_ref.config.GENERATION_DEFAULTS``, which the parity tests tie to
upstream's code at c090b69 and d65ef2c.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import torch

import minimind_ref as mm
from minimind_ref.config import GENERATION_DEFAULTS, WIDTH_RULES, preset
from minimind_ref.lora import apply_lora, lora_modules
from minimind_ref.moe import router_aux_loss, seq_aux_loss
from minimind_ref.params import active_parameters, count_parameters

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "book" / "minimind2_to_minimind3.md").read_text(encoding="utf-8")

#: The sizes upstream's README publishes for each model (its model table, `d65ef2c:README_en.md:574-580`).
PUBLISHED = {"MiniMind2-Small": "26M", "MiniMind2": "104M", "MiniMind2-MoE": "145M",
             "minimind-3": "64M", "minimind-3-moe": "198M / A64M"}
BYTES_PER_VALUE = 2  # the page states the cache in fp16 / bf16


@functools.lru_cache(maxsize=None)
def kv_cache_bytes_per_token(name: str, **overrides) -> int:
    """Bytes of the KV cache the model ``preset(name, **overrides)`` returns for one token, at 2 bytes
    a value. The vocabulary, the FFN and the RoPE table's length do not enter the cache: they are
    made small so the model builds quickly."""
    small = preset(name, **overrides).replace(vocab_size=64, intermediate_size=64, max_position_embeddings=64, use_moe=False)
    model = mm.MiniMindForCausalLM(small).eval()
    with torch.no_grad():
        out = model(torch.zeros(1, 1, dtype=torch.long), use_cache=True)
    return sum(k.numel() + v.numel() for k, v in out.past_key_values) * BYTES_PER_VALUE


def attention_parameters(config: mm.MiniMindConfig) -> int:
    """Parameters of one layer's attention (projections, and QK-norm's gains when present)."""
    with torch.device("meta"):
        model = mm.MiniMindForCausalLM(config)
    return sum(p.numel() for p in model.model.layers[0].self_attn.parameters())


def lora_adapter(config: mm.MiniMindConfig, rank: int):
    """(adapter parameters, names of the adapted projections) of ``apply_lora(model, rank)``."""
    with torch.device("meta"):
        model = mm.MiniMindForCausalLM(config)
    apply_lora(model, rank=rank)
    count = sum(p.numel() for name, p in model.named_parameters() if ".lora." in name)
    return count, sorted({name.rsplit(".", 1)[-1] for name, _ in lora_modules(model)})


def sizes_row(name: str) -> str:
    c = preset(name)
    return (f"| {name} | {c.hidden_size} | {c.num_hidden_layers} | {c.num_attention_heads} : {c.num_key_value_heads} "
            f"| {c.head_dim} | {c.expert_intermediate_size:,} | {count_parameters(c):,} | {active_parameters(c):,} "
            f"| {PUBLISHED[name]} | {kv_cache_bytes_per_token(name):,} bytes |")


@pytest.fixture(scope="module")
def computed() -> dict:
    """Every count the page states, by what it is."""
    m3 = preset("minimind-3")
    m3_two_kv = preset("minimind-3", num_key_value_heads=2)
    lora_small, lora_small_targets = lora_adapter(preset("MiniMind2-Small"), rank=8)
    lora_m3, lora_m3_targets = lora_adapter(m3, rank=16)
    assert lora_small_targets == lora_m3_targets == ["o_proj", "q_proj"], "the page says LoRA adapts q_proj and o_proj"
    values = {
        "vocabulary": m3.vocab_size,
        "MiniMind2 width at 768": WIDTH_RULES["MiniMind2"](768),
        "minimind-3 width at 768": WIDTH_RULES["minimind-3"](768),
        "attention per layer, 8:4": attention_parameters(m3),
        "attention per layer, 8:2": attention_parameters(m3_two_kv),
        "minimind-3 with 2 KV heads": count_parameters(m3_two_kv),
        "cache with 2 KV heads": kv_cache_bytes_per_token("minimind-3", num_key_value_heads=2),
        "QK-norm gains": m3.num_hidden_layers * 2 * m3.head_dim,
        "LoRA rank 8, MiniMind2-Small": lora_small,
        "LoRA rank 16, minimind-3": lora_m3,
    }
    for name in PUBLISHED:
        c = preset(name)
        values[f"{name} parameters"] = count_parameters(c)
        values[f"{name} active"] = active_parameters(c)
        values[f"{name} FFN width"] = c.expert_intermediate_size
        values[f"{name} cache"] = kv_cache_bytes_per_token(name)
    return values


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_sizes_table_rows_are_computed(name):
    row = sizes_row(name)
    assert row in PAGE, f"the sizes table's row for {name} should read, as minimind_ref computes it:\n{row}"


def test_upstreams_parameter_counts():
    """The counts upstream's own code gives (tests/test_upstream_parity*.py load its state dicts strictly)."""
    assert [count_parameters(preset(n)) for n in PUBLISHED] == [25_829_888, 104_030_976, 145_029_760,
                                                                63_912_192, 198_416_640]


def test_stated_counts_appear_in_the_page(computed):
    stated = {
        "MiniMind2 width at 768": "`64 * ceil(int(8 * hidden / 3) / 64)` in `FeedForward.__init__`: {:,} at hidden 768",
        "minimind-3 width at 768": "`ceil(hidden * pi / 64) * 64` in `MiniMindConfig.__init__`: {:,} at hidden 768",
        "MiniMind2-MoE FFN width": "every expert is `intermediate_size` wide ({:,} in MiniMind2-MoE)",
        "minimind-3-moe FFN width": "by default `intermediate_size` ({:,} in minimind-3-moe)",
        "attention per layer, 8:4": "one layer's attention has {:,} parameters",
        "attention per layer, 8:2": "with 2 KV heads it would have {:,}",
        "minimind-3 with 2 KV heads": "and the model {:,}\nparameters in all",
        "minimind-3 parameters": "parameters in all instead of {:,}",
        "cache with 2 KV heads": "its cache would be {:,} bytes per token",
        "minimind-3 cache": "bytes per token instead of {:,}",
        "QK-norm gains": "QK-norm itself adds {:,} parameters",
        "LoRA rank 8, MiniMind2-Small": "{:,} adapter parameters in MiniMind2-Small",
        "LoRA rank 16, minimind-3": "{:,} adapter parameters in minimind-3",
        "vocabulary": "| vocabulary | {:,} tokens, byte-level BPE | {:,} tokens",
    }
    for key, template in stated.items():
        text = template.format(computed[key], computed[key])
        assert " ".join(text.split()) in " ".join(PAGE.split()), f"{key}: the page should say {text!r}"
    # "both keep 12,288 bytes per token": minimind-3 (8 layers, 4 KV heads) and MiniMind2 (16 layers, 2 KV heads)
    assert computed["minimind-3 cache"] == computed["MiniMind2 cache"] == 12_288
    assert "both keep 12,288 bytes per\ntoken" in PAGE or "both keep 12,288 bytes per token" in PAGE
    assert computed["minimind-3 with 2 KV heads"] < computed["minimind-3 parameters"]


def test_every_grouped_number_on_the_page_is_computed(computed):
    """A number with thousands separators on the page is one of the counts above (none typed by hand)."""
    known = {f"{v:,}" for v in computed.values()}
    found = set(re.findall(r"(?<![\d,])\d{1,3}(?:,\d{3})+(?![\d,])", PAGE))
    assert found and found <= known, f"numbers on the page that minimind_ref does not compute: {sorted(found - known)}"


def test_balanced_router_losses_are_the_coefficients():
    """The page: MiniMind2's per-sequence loss is 0.01 and minimind-3's 5e-4 when perfectly balanced."""
    experts, tokens = 4, 8
    scores = torch.full((tokens, experts), 1.0 / experts)
    top1 = torch.arange(tokens).remainder(experts).view(tokens, 1)  # every expert chosen equally often
    top2 = torch.stack([top1[:, 0], (top1[:, 0] + 1) % experts], dim=1)
    alpha = GENERATION_DEFAULTS["MiniMind2"]["aux_loss_alpha"]
    coef = GENERATION_DEFAULTS["minimind-3"]["aux_loss_alpha"]
    torch.testing.assert_close(seq_aux_loss(scores, top2, batch=2, n_experts=experts, alpha=alpha),
                               torch.tensor(alpha), rtol=1e-6, atol=0.0)
    torch.testing.assert_close(router_aux_loss(scores, top1, n_experts=experts, coef=coef),
                               torch.tensor(coef), rtol=1e-6, atol=0.0)
    assert (alpha, coef) == (0.01, 5e-4)
    assert "0.01 when perfectly balanced" in PAGE and "5e-4 when perfectly balanced at top 1" in PAGE


def test_quoted_generation_defaults_match_the_package():
    """The defaults the page quotes for each commit are minimind_ref's for that generation."""
    old, new = GENERATION_DEFAULTS["MiniMind2"], GENERATION_DEFAULTS["minimind-3"]
    quoted = [
        (old["rms_norm_eps"], "`rms_norm_eps=1e-05`"), (new["rms_norm_eps"], "`rms_norm_eps=1e-6`"),
        (old["num_key_value_heads"], "(`num_key_value_heads=2`)"), (new["num_key_value_heads"], "defaults to 4"),
        (old["num_experts_per_tok"], "`num_experts_per_tok=2`"), (new["num_experts_per_tok"], "`num_experts_per_tok=1`"),
        (old["n_shared_experts"], "`n_shared_experts=1`"), (old["n_routed_experts"], "`n_routed_experts=4`"),
        (new["n_routed_experts"], "`num_experts=4`"),
        (old["aux_loss_alpha"], "`aux_loss_alpha=0.01`"), (new["aux_loss_alpha"], "`router_aux_loss_coef=5e-4`"),
    ]
    for value, text in quoted:
        assert text in PAGE, f"the page should quote {text}"
        number = float(re.search(r"(\d+(?:\.\d+)?(?:e-?\d+)?)\D*$", text).group(1))
        assert value == number, f"{text} on the page, but minimind_ref's default is {value}"
    assert new["n_shared_experts"] == 0 and new["qk_norm"] and not old["qk_norm"]


def test_the_page_is_in_the_reference_part_after_the_package_page():
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    reference = next(part for part in toc["parts"] if part["caption"] == "Reference")
    files = [entry["file"] for entry in reference["chapters"]]
    assert files.index("book/minimind2_to_minimind3") == files.index("book/minimind_ref") + 1
