"""Hugging Face folders and config dicts of both transformers major versions (4.57 and 5.x).

Fixtures, each made by a tool with transformers' or upstream's own code:

* ``tests/data/hf_folders/transformers{4,5}/``: Llama, Qwen3 and Qwen3-MoE folders written by
  transformers' own ``save_pretrained`` in each major version, with transformers' logits
  (``tools/hf_folder_fixtures.py``);
* ``tests/data/upstream_minimind3_files/`` and ``..._transformers5/``: the folders upstream's
  ``scripts/convert_model.py`` (d65ef2c) writes under transformers 4.57.6 and 5.24.0, with upstream's
  logits (``tools/upstream_files_minimind3.py``).

Every folder loads with ``minimind_ref.load_hf_dir`` (no transformers) in whichever environment runs the
tests, and with the installed transformers + ``from_hf`` where that transformers reads the folder
correctly; where it does not (transformers 4 reading a folder written by 5), ``from_hf`` refuses the
misread model with the reason. Logits are compared in fp32 at ``rtol = atol = 1e-5`` (float rounding of
differently ordered sums; the files hold fp16 values, computed in fp32 on both sides).
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings

import pytest
import torch

import minimind_ref as mm
from minimind_ref import hf as H
from minimind_ref import pretrained as P

import _upstream_files as U
from _helpers import rand_ids, tiny_model

TOL = dict(rtol=1e-5, atol=1e-5)
HF_FOLDERS = U.DATA / "hf_folders"
WRITERS = ("transformers4", "transformers5")
FAMILIES = ("llama", "qwen3", "qwen3_moe")
UPSTREAM = {"transformers4": U.DATA / "upstream_minimind3_files",
            "transformers5": U.DATA / "upstream_minimind3_files_transformers5"}
REFERENCES = {w: torch.load(HF_FOLDERS / w / "reference.pt", weights_only=True) for w in WRITERS}
UPSTREAM_REFERENCES = {w: torch.load(d / "reference.pt", weights_only=True) for w, d in UPSTREAM.items()}


def installed_major():
    transformers = pytest.importorskip("transformers")
    return int(transformers.__version__.split(".")[0])


def no_missing_field_warnings(fn, *args, **kwargs):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    assert not [w for w in seen if "config has no" in str(w.message)], [str(w.message) for w in seen]
    return result


# ---------------------------------------------------------------------- the fixtures are what they claim
def test_fixtures_come_from_both_major_versions():
    for writer in WRITERS:
        major = writer[-1]
        assert REFERENCES[writer]["transformers"].startswith(major + ".")
        assert UPSTREAM_REFERENCES[writer]["note"].split("transformers ")[1].startswith(major + ".")
    # what tells the two apart in the files: the RoPE field and the expert count's name
    t4 = json.loads((HF_FOLDERS / "transformers4" / "qwen3_moe" / "config.json").read_text())
    t5 = json.loads((HF_FOLDERS / "transformers5" / "qwen3_moe" / "config.json").read_text())
    assert (t4["num_experts"], t4["rope_theta"]) == (4, 1e6) and "num_local_experts" not in t4
    assert (t5["num_local_experts"], t5["rope_parameters"]["rope_theta"]) == (4, 1e6) and "num_experts" not in t5
    assert "rope_theta" not in t5
    up5 = json.loads((UPSTREAM["transformers5"] / "minimind-3-moe-tiny" / "config.json").read_text())
    assert up5["num_local_experts"] == 4 and up5["rope_theta"] == 1e6 and "rope_parameters" not in up5  # the converter's rewrite
    assert not any(HF_FOLDERS.rglob("*.py")) and not any(UPSTREAM["transformers5"].rglob("*.py"))


# ---------------------------------------------------------------------- folders written by transformers' save_pretrained
@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("family", FAMILIES)
def test_folder_written_by_transformers_loads_without_transformers(writer, family):
    case = REFERENCES[writer]["families"][family]
    model = no_missing_field_warnings(P.load_hf_dir, HF_FOLDERS / writer / family)
    c = model.config
    assert (c.rope_theta, c.tie_word_embeddings, c.qk_norm) == (1e6, True, family != "llama")
    assert c.generation == ("MiniMind2" if family == "llama" else "minimind-3")
    assert c.head_dim == {"llama": 8, "qwen3": 12, "qwen3_moe": 8}[family]
    if family == "qwen3_moe":
        assert (c.n_routed_experts, c.num_experts_per_tok, c.norm_topk_prob, c.expert_intermediate_size) == (4, 1, True, 48)
    with torch.no_grad():
        torch.testing.assert_close(model(case["input_ids"]).logits, case["logits"], **TOL)


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("family", FAMILIES)
def test_folder_written_by_transformers_loads_in_the_installed_transformers(writer, family):
    """transformers from_pretrained + from_hf: the stored logits. transformers 4 misreads folders written by
    5 (rope_parameters, num_local_experts): then from_hf refuses with the reason."""
    transformers = pytest.importorskip("transformers")
    folder = HF_FOLDERS / writer / family
    case = REFERENCES[writer]["families"][family]
    if installed_major() < 5 <= int(writer[-1]):
        raw = transformers.AutoConfig.from_pretrained(folder).to_dict()
        parse = H.config_from_llama_dict if family == "llama" else H.config_from_qwen3_dict
        with pytest.raises(ValueError, match="transformers 4 does not read .*load_hf_dir"):
            parse(raw)
        if family != "qwen3_moe":  # (the MoE does not even load there: 128 experts' router against 4 rows)
            theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
            with pytest.raises(ValueError, match="rope_parameters"):
                H.from_hf(theirs)
        return
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ours = no_missing_field_warnings(H.from_hf, theirs)
    assert ours.config == P.load_hf_dir(folder).config
    with torch.no_grad():
        torch.testing.assert_close(theirs(case["input_ids"]).logits, case["logits"], **TOL)
        torch.testing.assert_close(ours(case["input_ids"]).logits, case["logits"], **TOL)


# ---------------------------------------------------------------------- folders written by upstream's converter
UPSTREAM_FOLDERS = [(w, f, n) for w, ref in UPSTREAM_REFERENCES.items() for n, c in sorted(ref["cases"].items())
                    for f in c["folders"]]


@pytest.mark.parametrize("writer, folder, name", UPSTREAM_FOLDERS)
def test_upstream_converter_folders_of_both_versions_give_upstreams_logits(writer, folder, name):
    case = UPSTREAM_REFERENCES[writer]["cases"][name]
    model = no_missing_field_warnings(P.load_hf_dir, UPSTREAM[writer] / folder)
    assert model.config.generation == "minimind-3" and model.config.n_routed_experts == 4
    with torch.no_grad():
        torch.testing.assert_close(model(case["input_ids"]).logits, case["logits"], **TOL)
    if "transformers_logits" in case["folders"][folder]:  # the converter's own check under that version
        torch.testing.assert_close(case["folders"][folder]["transformers_logits"], case["logits"], **TOL)


@pytest.mark.parametrize("writer, folder, name", [c for c in UPSTREAM_FOLDERS if "layout" not in c[1]])
def test_upstream_converter_folders_in_the_installed_transformers(writer, folder, name):
    transformers = pytest.importorskip("transformers")
    path = UPSTREAM[writer] / folder
    case = UPSTREAM_REFERENCES[writer]["cases"][name]
    if installed_major() < 5 <= int(writer[-1]) and name == "moe":  # num_local_experts only
        with pytest.raises(ValueError, match="num_local_experts.*load_hf_dir"):
            H.config_from_qwen3_dict(transformers.AutoConfig.from_pretrained(path).to_dict())
        return
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ours = H.from_hf(theirs)
    with torch.no_grad():
        torch.testing.assert_close(ours(case["input_ids"]).logits, case["logits"], **TOL)


# ---------------------------------------------------------------------- the installed transformers writes, both read
def minimind3(**overrides):
    return U.random_model(mm.MiniMindConfig(**{"generation": "minimind-3", "hidden_size": 32, "num_hidden_layers": 2,
                                                "vocab_size": 61, "max_position_embeddings": 64, **overrides}), seed=5)


ROUND_TRIPS = {
    "minimind-3": lambda: minimind3(),
    "minimind-3-moe, top-2": lambda: minimind3(use_moe=True, num_experts_per_tok=2, moe_intermediate_size=24),
    "minimind-3 untied, free head_dim": lambda: minimind3(tie_word_embeddings=False, head_dim=6),
    "MiniMind2": lambda: tiny_model(),
    "MiniMind2 + QK-norm": lambda: tiny_model(qk_norm=True),
    "MiniMind2 + QK-norm, MoE with minimind-3's router": lambda: tiny_model(
        qk_norm=True, use_moe=True, moe_variant="minimind-3", n_shared_experts=0),
    "minimind-3 without QK-norm (a Llama)": lambda: minimind3(qk_norm=False),
    "MiniMind2 + QK-norm, minimind-3's cast order": lambda: tiny_model(qk_norm=True, rms_norm_cast_after_weight=True),
}


@pytest.mark.parametrize("name", list(ROUND_TRIPS))
def test_round_trip_through_a_saved_folder(name, tmp_path):
    """to_hf -> save_pretrained (the installed transformers) -> load_hf_dir and from_pretrained + from_hf: the
    config it started with (the switches a family cannot hold travel as minimind_switches) and its logits."""
    transformers = pytest.importorskip("transformers")
    model = ROUND_TRIPS[name]().eval()
    H.to_hf(model).save_pretrained(tmp_path)
    ids = rand_ids(2, 7)
    for back in (no_missing_field_warnings(P.load_hf_dir, tmp_path),
                 H.from_hf(transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32))):
        assert back.config == model.config
        with torch.no_grad():
            torch.testing.assert_close(back(ids).logits, model(ids).logits, **TOL)


@pytest.mark.parametrize("name", list(ROUND_TRIPS))
def test_round_trip_keeps_every_switch_in_memory(name):
    """Issue 38 item 9: to_hf -> from_hf returns the switches it started with, flash_attn=False included."""
    pytest.importorskip("transformers")
    model = ROUND_TRIPS[name]()
    model = mm.MiniMindForCausalLM(model.config.replace(flash_attn=False)).eval()
    back = H.from_hf(H.to_hf(model))
    assert back.config == model.config and not back.config.flash_attn
    for (k1, v1), (k2, v2) in zip(model.state_dict().items(), back.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2), k1


def test_switches_are_recorded_only_where_the_family_cannot_hold_them():
    pytest.importorskip("transformers")
    assert getattr(H.to_hf(minimind3()).config, H.SWITCHES_KEY, None) is None
    assert getattr(H.to_hf(tiny_model()).config, H.SWITCHES_KEY, None) is None
    record = getattr(H.to_hf(tiny_model(qk_norm=True)).config, H.SWITCHES_KEY)
    assert record == {"generation": "MiniMind2", "rms_norm_cast_after_weight": False, "ffn_dropout": True}
    hf = H.to_hf(tiny_model(qk_norm=True))
    delattr(hf.config, H.SWITCHES_KEY)  # a plain Qwen3 is minimind-3
    assert H.from_hf(hf).config.generation == "minimind-3"


# ---------------------------------------------------------------------- config dicts: contradictions, missing fields
def qwen3_moe_dict():
    return json.loads((UPSTREAM["transformers4"] / "minimind-3-moe-tiny" / "config.json").read_text())


@pytest.mark.parametrize("bad, match", [
    ({"num_local_experts": 8}, "num_experts=4 and num_local_experts=8"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}, r"rope_theta=1000000.0 and rope_parameters"),
    ({H.SWITCHES_KEY: {"generation": "MiniMind3"}}, "generation"),
    ({H.SWITCHES_KEY: {"ffn_dropout": "yes"}}, "ffn_dropout"),
    ({H.SWITCHES_KEY: {"qk_norm": False}}, "minimind_switches must be a dict with the keys"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}}, "RoPE scaling"),
])
def test_self_contradictory_or_unknown_qwen3_fields_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        P.config_from_hf({**qwen3_moe_dict(), **bad})


def test_both_spellings_agreeing_are_fine():
    raw = {**qwen3_moe_dict(), "num_local_experts": 4, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    assert no_missing_field_warnings(P.config_from_hf, raw) == P.config_from_hf(qwen3_moe_dict())
    del raw["num_experts"], raw["rope_theta"]  # transformers 5's spelling alone
    config = no_missing_field_warnings(P.config_from_hf, raw)
    assert (config.n_routed_experts, config.rope_theta) == (4, 1e6)  # not transformers' default 128 / 10000


def test_llama_rope_theta_contradiction_is_refused():
    raw = json.loads((HF_FOLDERS / "transformers4" / "llama" / "config.json").read_text())
    raw["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}
    with pytest.raises(ValueError, match="rope_theta=1000000.0 and rope_parameters"):
        P.config_from_hf(raw)
    del raw["rope_theta"]
    assert P.config_from_hf(raw).rope_theta == 5e5
    del raw["rope_parameters"]
    with pytest.warns(UserWarning, match="has no rope_theta"):
        assert P.config_from_hf(raw).rope_theta == 10000.0


@pytest.mark.parametrize("field, default", [("head_dim", 4), ("rope_theta", 10000.0), ("tie_word_embeddings", False),
                                            ("norm_topk_prob", False)])
def test_a_qwen3_moe_config_missing_a_field_warns_naming_it(field, default):
    """Issue 38 item 8: upstream's converter always writes these; a config without one gets transformers'
    default (Qwen3-MoE's head_dim: hidden / heads) and a warning naming the field and the value taken."""
    raw = {k: v for k, v in qwen3_moe_dict().items() if k != field}
    with pytest.warns(UserWarning, match=rf"has no {field}: .*took {default!r}") as seen:
        config = P.config_from_hf(raw)
    assert len([w for w in seen if "has no" in str(w.message)]) == 1
    value = {"head_dim": config.head_dim, "rope_theta": config.rope_theta,
             "tie_word_embeddings": config.tie_word_embeddings, "norm_topk_prob": config.norm_topk_prob}[field]
    assert value == default


def test_a_dense_qwen3_config_missing_head_dim_takes_128_with_a_warning():
    raw = json.loads((UPSTREAM["transformers4"] / "minimind-3-tiny" / "config.json").read_text())
    raw.pop("head_dim")
    with pytest.warns(UserWarning, match="has no head_dim: .*took 128"):
        assert P.config_from_hf(raw).head_dim == 128


def edited_folder(src, dest, drop=(), state_edit=None):
    shutil.copytree(src, dest)
    raw = json.loads((dest / "config.json").read_text())
    for key in drop:
        raw.pop(key)
    (dest / "config.json").write_text(json.dumps(raw))
    if state_edit is not None:
        from safetensors.torch import load_file, save_file

        state = state_edit(load_file(str(dest / "model.safetensors")))
        save_file({k: v.contiguous() for k, v in state.items()}, str(dest / "model.safetensors"))
    return dest


def test_missing_fields_the_weights_contradict_are_refused(tmp_path):
    dense = UPSTREAM["transformers4"] / "minimind-3-tiny"  # head_dim 4, tied: no lm_head.weight in the file
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=r"no head_dim, so transformers takes 128, but the weights' q_norm has 4 .*"
                                             r"\"head_dim\": 4"):
            P.load_hf_dir(edited_folder(dense, tmp_path / "a", drop=["head_dim"]))
        with pytest.raises(ValueError, match="no tie_word_embeddings, so transformers takes false .* no lm_head.weight"):
            P.load_hf_dir(edited_folder(dense, tmp_path / "b", drop=["tie_word_embeddings"]))
    assert not seen, [str(w.message) for w in seen]  # refused, not warned about first


def test_missing_fields_the_weights_agree_with_load_with_a_warning(tmp_path):
    case = UPSTREAM_REFERENCES["transformers4"]["cases"]["moe"]
    moe = edited_folder(UPSTREAM["transformers4"] / "minimind-3-moe-tiny", tmp_path / "moe", drop=["head_dim"])
    with pytest.warns(UserWarning, match="has no head_dim"):
        model = P.load_hf_dir(moe)  # Qwen3-MoE's default is hidden / heads = 4, what q_norm says
    with torch.no_grad():
        torch.testing.assert_close(model(case["input_ids"]).logits, case["logits"], **TOL)
    case = UPSTREAM_REFERENCES["transformers4"]["cases"]["dense"]
    untied = edited_folder(UPSTREAM["transformers4"] / "minimind-3-tiny", tmp_path / "untied", drop=["tie_word_embeddings"],
                           state_edit=lambda s: {**s, "lm_head.weight": s["model.embed_tokens.weight"].clone()})
    with pytest.warns(UserWarning, match="has no tie_word_embeddings"):
        model = P.load_hf_dir(untied)
    assert not model.config.tie_word_embeddings  # transformers' default, as transformers loads the folder
    with torch.no_grad():
        torch.testing.assert_close(model(case["input_ids"]).logits, case["logits"], **TOL)


# ---------------------------------------------------------------------- fused experts
def test_fused_and_per_expert_layouts_are_one_state():
    state = minimind3(use_moe=True, num_experts=3, moe_intermediate_size=24).state_dict()
    fused = H.fuse_experts(state)
    gate_up = fused["model.layers.1.mlp.experts.gate_up_proj"]
    assert gate_up.shape == (3, 48, 32) and fused["model.layers.1.mlp.experts.down_proj"].shape == (3, 32, 24)
    assert torch.equal(gate_up[2, :24], state["model.layers.1.mlp.experts.2.gate_proj.weight"])  # gate rows first
    assert torch.equal(gate_up[2, 24:], state["model.layers.1.mlp.experts.2.up_proj.weight"])
    assert not any(".experts.0." in k for k in fused) and "model.layers.1.mlp.gate.weight" in fused
    back = H.split_fused_experts(fused)
    assert sorted(back) == sorted(state) and all(torch.equal(back[k], state[k]) for k in state)


def test_a_folder_with_fused_experts_loads(tmp_path):
    case = UPSTREAM_REFERENCES["transformers4"]["cases"]["moe"]
    src = UPSTREAM["transformers4"] / "minimind-3-moe-tiny"
    model = P.load_hf_dir(edited_folder(src, tmp_path / "fused", state_edit=H.fuse_experts))
    with torch.no_grad():
        torch.testing.assert_close(model(case["input_ids"]).logits, case["logits"], **TOL)

    def both(state):
        return {**state, **{k: v for k, v in H.fuse_experts(state).items() if ".experts." in k}}

    with pytest.raises(ValueError, match="stored twice: per expert and inside a fused tensor"):
        P.load_hf_dir(edited_folder(src, tmp_path / "both", state_edit=both))
    bad = {"model.layers.0.mlp.experts.gate_up_proj": torch.zeros(4, 7, 32)}
    with pytest.raises(ValueError, match=r"\[experts, 2 \* expert width, hidden\]"):
        H.split_fused_experts(bad)


# ---------------------------------------------------------------------- warnings from the package's own calls
def test_no_deprecation_warnings_from_the_package():
    """No Python warning and no transformers log line saying 'deprecated' while converting both ways (the
    capture is proven by a planted deprecated call first: setting torch_dtype)."""
    transformers = pytest.importorskip("transformers")
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    library = logging.getLogger("transformers")
    library.addHandler(handler)
    try:
        def deprecations(fn):
            transformers.utils.logging.warning_once.cache_clear()  # transformers says each warning once per process
            records.clear()
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                fn()
            said = [str(w.message) for w in seen] + [r.getMessage() for r in records]
            return [m for m in said if "deprecat" in m.lower()]

        planted = transformers.LlamaConfig(vocab_size=8, hidden_size=8, num_attention_heads=2, num_hidden_layers=1)
        assert deprecations(lambda: setattr(planted, "torch_dtype", torch.float32))  # the capture sees one
        for make in (tiny_model, minimind3, lambda: minimind3(use_moe=True), lambda: tiny_model(qk_norm=True)):
            model = make()
            assert deprecations(lambda: H.from_hf(H.to_hf(model))) == []
    finally:
        library.removeHandler(handler)


# ---------------------------------------------------------------------- make bench's transformers sections
def test_benchmark_sections_that_use_transformers_run(monkeypatch):
    """benchmarks.bench_hf and bench_fast (make bench) on a tiny model with the installed transformers: same
    tokens as minimind_ref, prefill logits within float rounding (the compiled path and the bandwidth probe,
    which do not touch transformers, are replaced by their eager / fixed stand-ins to keep this quick)."""
    pytest.importorskip("transformers")
    from benchmarks import bench_fast, bench_hf
    from minimind_ref.fast_decode import FastDecoder

    def tiny(device):
        return tiny_model(vocab_size=61).to(device)

    for module in (bench_hf, bench_fast):
        monkeypatch.setattr(module, "small_model", tiny)
    monkeypatch.setattr(bench_fast, "FastDecoder", lambda model, compile=False: FastDecoder(model))
    monkeypatch.setattr(bench_fast, "bandwidths", lambda device, repeats: {"read_GBps": 1.0})
    cpu = torch.device("cpu")
    res = bench_hf.compare(cpu, prefill_len=16, decode_tokens=4, batches=(1, 2), prompt_lens=(3,), repeats=5,
                           prefill_repeats=5)
    assert res["prefill_max_abs_diff"] < 1e-4 and all(row["identical_tokens"] for row in res["decode"])
    assert bench_fast.fast_decode(cpu, prompt_len=3, new_tokens=4, repeats=5)["identical_tokens"]


# ---------------------------------------------------------------------- what the chapters say about transformers' generate()
def _processors_built(transformers, **settings):
    """The logits processors transformers' generate() builds for ``settings`` (class names, in order)."""
    from transformers.generation import utils

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)).eval()
    built, original = [], utils.GenerationMixin._get_logits_processor

    def record(self, *args, **kwargs):
        processors = original(self, *args, **kwargs)
        built.extend(processors)
        return processors

    utils.GenerationMixin._get_logits_processor = record
    try:
        model.generate(torch.tensor([[1, 2]]), max_new_tokens=1, pad_token_id=0, **settings)
    finally:
        utils.GenerationMixin._get_logits_processor = original
    return built


def test_generate_samples_as_the_chapters_say():
    """Chapter 06: minimind_ref.generation applies the penalty, the temperature, top-k and top-p in the order
    of transformers' generate() and with the same results (top-p's boundary included); chapter 12: a
    sampling generate() without top_k keeps the 50 most likely tokens. Checked on the installed
    transformers (4.57 in the pinned passes, the newest in make test-current)."""
    transformers = pytest.importorskip("transformers")
    from minimind_ref import generation as G

    built = _processors_built(transformers, do_sample=True, temperature=0.7, top_k=10, top_p=0.9, repetition_penalty=1.3)
    assert [type(p).__name__ for p in built] == ["RepetitionPenaltyLogitsProcessor", "TemperatureLogitsWarper",
                                                 "TopKLogitsWarper", "TopPLogitsWarper"]
    defaults = _processors_built(transformers, do_sample=True, temperature=0.8)
    assert [p.top_k for p in defaults if type(p).__name__ == "TopKLogitsWarper"] == [50]
    g = torch.Generator().manual_seed(0)
    logits, previous = torch.randn(4, 64, generator=g) * 3, torch.randint(0, 64, (4, 9), generator=g)
    theirs = transformers.LogitsProcessorList([
        transformers.RepetitionPenaltyLogitsProcessor(1.3), transformers.TemperatureLogitsWarper(0.7),
        transformers.TopKLogitsWarper(10), transformers.TopPLogitsWarper(0.9)])(previous, logits.clone())
    ours = G.next_token_logits(logits, previous, temperature=0.7, top_k=10, top_p=0.9, repetition_penalty=1.3)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    torch.testing.assert_close(ours[~torch.isinf(ours)], theirs[~torch.isinf(theirs)], rtol=1e-6, atol=1e-6)
    # top-p's boundary on probabilities exact in binary: the more likely tokens sum to exactly top_p
    boundary = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]]))
    kept_theirs = ~torch.isinf(transformers.TopPLogitsWarper(0.75)(previous[:1], boundary.clone()))
    assert torch.equal(kept_theirs, ~torch.isinf(G.top_p_filter(boundary, 0.75)))
    assert kept_theirs.tolist() == [[True, True, False, False]]
