"""minimind_ref.lora against upstream's model/model_lora.py (c090b69) and its file format.

Upstream's code is not importable here: where a test needs upstream's behaviour (which layers get
adapters, how upstream writes and reads a LoRA file) the rule is written out in the test, after
upstream's apply_lora, save_lora and load_lora at c090b69.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import minimind_ref as mm
from minimind_ref.lora import LoRA, apply_lora, load_lora, lora_modules, mark_only_lora_trainable, merge_lora, save_lora

sys.path.insert(0, str(Path(__file__).parent))
from _helpers import rand_ids, tiny_model  # noqa: E402

EXACT = dict(rtol=0.0, atol=0.0)
MERGE_TOL = dict(rtol=1e-5, atol=1e-5)  # merging reorders float sums: W x + B(A x) vs (W + B A) x


def _trained_adapters(model: nn.Module, seed: int = 1) -> nn.Module:
    """Give every adapter non-zero A and B, as training would (so the adapters change the output)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, layer in lora_modules(model):
            for p in layer.lora.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def _upstream_square_linear_names(model: nn.Module) -> list:
    """Upstream's apply_lora rule, written out: every nn.Linear whose weight is square."""
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear) and m.weight.shape[0] == m.weight.shape[1]]


def _upstream_save(model: nn.Module, path: Path) -> None:
    """Upstream's save_lora, written out: ``{f'{name}.lora.{k}': v}`` for each module with ``.lora``."""
    raw = getattr(model, "_orig_mod", model)
    state = {}
    for name, module in raw.named_modules():
        if hasattr(module, "lora"):
            clean = name[7:] if name.startswith("module.") else name
            state.update({f"{clean}.lora.{k}": v for k, v in module.lora.state_dict().items()})
    torch.save(state, path)


def _upstream_load(model: nn.Module, path: Path) -> None:
    """Upstream's load_lora, written out: strip ``module.``, then per module filter by ``f'{name}.lora.'``."""
    state = torch.load(path, map_location="cpu")
    state = {(k[7:] if k.startswith("module.") else k): v for k, v in state.items()}
    for name, module in model.named_modules():
        if hasattr(module, "lora"):
            lora_state = {k.replace(f"{name}.lora.", ""): v for k, v in state.items() if f"{name}.lora." in k}
            module.lora.load_state_dict(lora_state)


# ---------------------------------------------------------------------- the adapter itself
def test_lora_init_and_shapes():
    torch.manual_seed(0)
    lora = LoRA(64, 48, rank=4)
    assert lora.A.weight.shape == (4, 64) and lora.B.weight.shape == (48, 4)
    assert lora.A.bias is None and lora.B.bias is None
    assert torch.count_nonzero(lora.B.weight) == 0
    assert abs(lora.A.weight.std().item() - 0.02) < 0.005  # N(0, 0.02), 256 draws
    assert lora(torch.randn(3, 5, 64)).shape == (3, 5, 48)


def test_fresh_adapters_change_nothing():
    model = tiny_model()
    ids = rand_ids(2, 7)
    before = model(ids).logits
    apply_lora(model, rank=4)
    torch.testing.assert_close(model(ids).logits, before, **EXACT)  # B = 0: difference exactly 0


def test_adapters_go_on_square_linears_like_upstream():
    for overrides in ({}, {"use_moe": True}):
        model = tiny_model(**overrides)
        expected = _upstream_square_linear_names(model)
        apply_lora(model, rank=4)
        assert [name for name, _ in lora_modules(model)] == expected
        # hidden 32 with 4 heads / 2 KV heads: q_proj and o_proj are square, k/v, MLP, lm_head are not
        assert {name.split(".")[-1] for name in expected} == {"q_proj", "o_proj"}
        assert len(expected) == 2 * model.config.num_hidden_layers


def test_minimind2_small_gets_adapters_on_q_and_o_proj():
    with torch.device("meta"):  # shapes only, no memory
        model = mm.MiniMindForCausalLM(mm.minimind2_small())
        apply_lora(model, rank=8)
    names = [name for name, _ in lora_modules(model)]
    assert names == [f"model.layers.{i}.self_attn.{p}" for i in range(8) for p in ("q_proj", "o_proj")]
    adapter_params = sum(p.numel() for _, layer in lora_modules(model) for p in layer.lora.parameters())
    assert adapter_params == 16 * 8 * (512 + 512)  # 16 layers adapted, rank 8, A [8, 512] + B [512, 8]


def test_apply_twice_and_bad_rank_are_refused():
    model = apply_lora(tiny_model(), rank=2)
    with pytest.raises(ValueError, match="already has LoRA adapters"):
        apply_lora(model, rank=2)
    for rank in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="rank must be a positive int"):
            apply_lora(tiny_model(), rank=rank)
    with pytest.raises(ValueError, match="scale must be a finite number"):
        apply_lora(tiny_model(), rank=2, scale=float("nan"))


# ---------------------------------------------------------------------- training touches only the adapters
def test_only_adapters_train():
    model = apply_lora(tiny_model(), rank=4).train()
    n = mark_only_lora_trainable(model)
    adapter_names = {n for n, _ in model.named_parameters() if ".lora." in n}
    assert n == sum(p.numel() for name, p in model.named_parameters() if name in adapter_names)
    assert {name for name, p in model.named_parameters() if p.requires_grad} == adapter_names
    base = {k: v.clone() for k, v in model.state_dict().items() if ".lora." not in k}
    adapters = {k: v.clone() for k, v in model.state_dict().items() if ".lora." in k}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    ids = rand_ids(2, 9)
    model(ids, labels=ids).loss.backward()
    opt.step()
    after = model.state_dict()
    for k, v in base.items():
        torch.testing.assert_close(after[k], v, **EXACT)  # no base weight moved
    assert all(not torch.equal(after[k], v) for k, v in adapters.items() if k.endswith("B.weight"))


def test_mark_only_lora_trainable_needs_adapters():
    with pytest.raises(ValueError, match="apply_lora"):
        mark_only_lora_trainable(tiny_model())


# ---------------------------------------------------------------------- the file format, both ways
def test_upstream_file_loads_with_ours(tmp_path):
    source = _trained_adapters(apply_lora(tiny_model(), rank=4))
    path = tmp_path / "lora_identity_32.pth"
    _upstream_save(source, path)
    target = apply_lora(tiny_model(), rank=4)
    load_lora(target, path)
    ids = rand_ids(2, 7)
    torch.testing.assert_close(target(ids).logits, source(ids).logits, **EXACT)
    assert not torch.equal(source(ids).logits, tiny_model()(ids).logits), "the adapters must matter for this test"


def test_our_file_is_upstreams_format(tmp_path):
    source = _trained_adapters(apply_lora(tiny_model(), rank=4))
    path = tmp_path / "lora.pth"
    save_lora(source, path)
    state = torch.load(path, weights_only=True)
    names = [name for name, _ in lora_modules(source)]
    # the adapters under upstream's keys, and our record of the base (a key upstream's load_lora skips: no ".lora.")
    assert sorted(state) == sorted([f"{n}.lora.{k}" for n in names for k in ("A.weight", "B.weight")] + ["lora_base_sample"])
    assert "model.layers.0.self_attn.q_proj.lora.A.weight" in state
    assert all(v.dtype == torch.float16 for v in state.values()), "upstream's save_lora writes fp16"
    target = apply_lora(tiny_model(), rank=4)
    _upstream_load(target, path)
    halved = copy.deepcopy(source)
    with torch.no_grad():
        for _, layer in lora_modules(halved):
            for p in layer.lora.parameters():
                p.copy_(p.half().float())
    ids = rand_ids(2, 7)
    torch.testing.assert_close(target(ids).logits, halved(ids).logits, **EXACT)  # the fp16 values, exactly
    assert [p.name for p in tmp_path.iterdir()] == ["lora.pth"], "no temporary file left behind"


def test_module_prefixed_keys_load(tmp_path):
    source = _trained_adapters(apply_lora(tiny_model(), rank=4))
    state = {f"module.{k}": v for k, v in source.state_dict().items() if ".lora." in k}  # saved from a DDP wrapper
    torch.save(state, tmp_path / "ddp.pth")
    target = apply_lora(tiny_model(), rank=4)
    load_lora(target, tmp_path / "ddp.pth")
    ids = rand_ids(1, 6)
    torch.testing.assert_close(target(ids).logits, source(ids).logits, **EXACT)


def test_deepcopy_keeps_its_own_adapters():
    model = apply_lora(tiny_model(), rank=4)
    twin = copy.deepcopy(model)
    _trained_adapters(twin)
    ids = rand_ids(1, 6)
    torch.testing.assert_close(model(ids).logits, tiny_model()(ids).logits, **EXACT)  # the original is untouched
    assert not torch.allclose(twin(ids).logits, model(ids).logits), "the copy must run its own adapters"


# ---------------------------------------------------------------------- merge
def test_merge_gives_a_plain_model_with_the_same_logits(tmp_path):
    model = _trained_adapters(apply_lora(tiny_model(), rank=4))
    ids = rand_ids(2, 7)
    with_adapters = model(ids).logits
    assert merge_lora(model) is model
    assert not lora_modules(model) and not any(".lora." in k for k in model.state_dict())
    torch.testing.assert_close(model(ids).logits, with_adapters, **MERGE_TOL)
    plain = mm.MiniMindForCausalLM(model.config).eval()
    plain.load_state_dict(model.state_dict(), strict=True)
    torch.testing.assert_close(plain(ids).logits, with_adapters, **MERGE_TOL)
    assert not torch.allclose(with_adapters, tiny_model()(ids).logits, **MERGE_TOL), "the adapters must matter for this test"


def test_merge_folds_b_times_a():
    model = _trained_adapters(apply_lora(tiny_model(), rank=4))
    layer = model.model.layers[0].self_attn.q_proj
    expected = layer.weight + layer.lora.B.weight @ layer.lora.A.weight
    merge_lora(model)
    torch.testing.assert_close(layer.weight, expected, rtol=1e-6, atol=1e-7)
    assert "forward" not in layer.__dict__, "the Linear's own forward is back"


def test_merge_without_adapters_is_refused():
    with pytest.raises(ValueError, match="no LoRA adapters to merge"):
        merge_lora(tiny_model())


# ---------------------------------------------------------------------- bad files (more in test_bad_input.py)
def test_rank_mismatch_names_key_and_rank(tmp_path):
    save_lora(apply_lora(tiny_model(), rank=4), tmp_path / "r4.pth")
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.q_proj\.lora\.A\.weight.*apply_lora\(model, rank=4\)"):
        load_lora(apply_lora(tiny_model(), rank=8), tmp_path / "r4.pth")


def test_other_depth_names_the_missing_key(tmp_path):
    save_lora(apply_lora(tiny_model(num_hidden_layers=1), rank=4), tmp_path / "one_layer.pth")
    with pytest.raises(ValueError, match=r"no adapter 'model\.layers\.1\.self_attn\.q_proj\.lora\.A\.weight'"):
        load_lora(apply_lora(tiny_model(), rank=4), tmp_path / "one_layer.pth")
    save_lora(apply_lora(tiny_model(num_hidden_layers=3), rank=4), tmp_path / "three_layers.pth")
    with pytest.raises(ValueError, match=r"model\.layers\.2\.self_attn\.q_proj\.lora\.A\.weight', which the model lacks"):
        load_lora(apply_lora(tiny_model(), rank=4), tmp_path / "three_layers.pth")


def test_load_into_model_without_adapters_says_apply_lora(tmp_path):
    save_lora(apply_lora(tiny_model(), rank=4), tmp_path / "a.pth")
    with pytest.raises(ValueError, match=r"call apply_lora\(model, rank=4\)"):
        load_lora(tiny_model(), tmp_path / "a.pth")


def test_full_checkpoint_is_not_a_lora_file(tmp_path):
    torch.save(tiny_model().state_dict(), tmp_path / "full.pth")
    with pytest.raises(ValueError, match="not LoRA adapters.*load_checkpoint"):
        load_lora(apply_lora(tiny_model(), rank=4), tmp_path / "full.pth")


def test_non_finite_adapters_are_refused(tmp_path):
    model = apply_lora(tiny_model(), rank=4)
    save_lora(model, tmp_path / "good.pth")
    with torch.no_grad():
        model.model.layers[1].self_attn.o_proj.lora.B.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.o_proj\.lora\.B\.weight"):
        save_lora(model, tmp_path / "good.pth")
    load_lora(apply_lora(tiny_model(), rank=4), tmp_path / "good.pth")  # the previous file is intact
    _upstream_save(model, tmp_path / "nan.pth")
    with pytest.raises(ValueError, match="NaN/inf"):
        load_lora(apply_lora(tiny_model(), rank=4), tmp_path / "nan.pth")


def test_save_without_adapters_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no LoRA adapters to save"):
        save_lora(tiny_model(), tmp_path / "x.pth")
    assert not (tmp_path / "x.pth").exists()


def test_scale_is_folded_into_the_merge():
    """The course's ``scale`` option (upstream has none: 1) multiplies the path and the merged update."""
    ids = rand_ids(2, 7)
    half = _trained_adapters(apply_lora(tiny_model(), rank=4, scale=0.5))
    full = _trained_adapters(apply_lora(tiny_model(), rank=4))
    base = tiny_model()(ids).logits
    assert not torch.allclose(half(ids).logits, full(ids).logits, **MERGE_TOL)
    with_adapters = half(ids).logits
    torch.testing.assert_close(merge_lora(half)(ids).logits, with_adapters, **MERGE_TOL)
    assert not torch.allclose(with_adapters, base, **MERGE_TOL)


def test_upstreams_default_rank_and_pefts_alpha():
    model = apply_lora(tiny_model())
    layers = lora_modules(model)
    assert {layer.lora.rank for _, layer in layers} == {16} and {layer.lora.scale for _, layer in layers} == {1.0}
    scaled = apply_lora(tiny_model(), rank=8, alpha=16)
    assert {layer.lora.scale for _, layer in lora_modules(scaled)} == {2.0}
    with pytest.raises(ValueError, match="not both"):
        apply_lora(tiny_model(), rank=8, alpha=16, scale=3.0)
    with pytest.raises(ValueError, match="alpha"):
        apply_lora(tiny_model(), rank=8, alpha=float("inf"))


def test_upstreams_file_to_file_merge(tmp_path):
    source = _trained_adapters(apply_lora(tiny_model(), rank=4))
    save_lora(source, tmp_path / "lora.pth")
    target = apply_lora(tiny_model(), rank=4)
    merge_lora(target, tmp_path / "lora.pth", tmp_path / "merged.pth")
    merged = torch.load(tmp_path / "merged.pth", weights_only=True)
    assert lora_modules(target) and all(".lora." not in k for k in merged)
    assert all(v.dtype == torch.float16 for v in merged.values())
    plain = tiny_model()
    plain.load_state_dict({k: v.float() for k, v in merged.items()}, strict=True)
    ids = rand_ids(2, 7)
    torch.testing.assert_close(plain(ids).logits, target(ids).logits, rtol=0, atol=5e-3)  # fp16 weights
    with pytest.raises(ValueError, match="both"):
        merge_lora(target, tmp_path / "lora.pth")
