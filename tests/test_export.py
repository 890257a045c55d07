"""``minimind_ref.export``: a trained checkpoint written as upstream's fp16 ``.pth`` (loads back with the
same half-precision weights) and as a transformers folder (``AutoModelForCausalLM`` gives the course's
logits within ``rtol = atol = 1e-5`` in fp32, ``AutoTokenizer`` the course tokenizer's ids); bad input
gets a clear error."""

import pytest
import torch

import minimind_ref as mm
from minimind_ref import export
from minimind_ref.tokenizer import SPECIAL_TOKENS, save_tokenizer, train_bpe_tokenizer
from minimind_ref.upstream_weights import load_pth, pth_filename

from _helpers import rand_ids, tiny_model

TOL = dict(rtol=1e-5, atol=1e-5)
TEXTS = ["the cat sat on the mat", "a dog ran to the park", "the sun is warm today", "we read a book at night"] * 8


def _minimind3(**overrides):
    """A small minimind-3 (QK-norm), its norm gains random so a lost q_norm/k_norm would show."""
    model = tiny_model(generation="minimind-3", hidden_size=64, num_attention_heads=8, num_key_value_heads=4, **overrides)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


def _tokenizer(vocab_size=280):
    return train_bpe_tokenizer(TEXTS, vocab_size=vocab_size, min_frequency=1)


@pytest.mark.parametrize("kw", [{}, {"use_moe": True, "n_routed_experts": 4, "num_experts_per_tok": 2}])
def test_write_pth_round_trip(tmp_path, kw):
    m = tiny_model(**kw)
    path = export.write_pth(m, tmp_path / "out", stage="full_sft")
    assert path.name == pth_filename("full_sft", m.config.hidden_size, m.config.use_moe)
    saved = torch.load(path, map_location="cpu", weights_only=True)
    assert set(saved) == set(m.state_dict())
    assert all(v.dtype == torch.float16 for v in saved.values())  # as upstream's trainers save
    back = load_pth(path)
    for (k, v), (k2, v2) in zip(m.state_dict().items(), back.state_dict().items()):
        assert k == k2 and torch.equal(v.half().float(), v2), k
    assert not list(path.parent.glob("*.tmp"))


def test_write_pth_unwraps_a_compiled_model(tmp_path):
    m = tiny_model()
    path = export.write_pth(torch.compile(m), tmp_path)
    assert set(torch.load(path, weights_only=True)) == set(m.state_dict())  # no _orig_mod. prefix


def test_bad_input_is_refused(tmp_path):
    m = tiny_model()
    for stage in ("", "../x", "full sft", "pre/train"):
        with pytest.raises(ValueError, match="plain name"):
            export.write_pth(m, tmp_path, stage=stage)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        export.write_pth(m, a_file)
    with pytest.raises(ValueError, match="is a file"):
        export.write_hf_folder(m, a_file)
    with pytest.raises(TypeError, match="MiniMindForCausalLM"):
        export.write_pth(torch.nn.Linear(2, 2), tmp_path)
    with pytest.raises(ValueError, match="not the tokenizer this model was trained with"):
        export.write_hf_folder(tiny_model(vocab_size=260), tmp_path / "hf", _tokenizer(280))


@pytest.mark.parametrize("generation", ["MiniMind2", "minimind-3"])
def test_hf_folder_loads_in_transformers(tmp_path, generation):
    transformers = pytest.importorskip("transformers")
    m = tiny_model(vocab_size=300) if generation == "MiniMind2" else _minimind3(vocab_size=300)
    assert m.config.generation == generation
    tok = _tokenizer()
    m.train()
    folder = export.write_hf_folder(m, tmp_path / "hf", tok)
    assert m.training  # left as it was given
    m.eval()
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = rand_ids(2, 9, vocab=300)
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, m(ids).logits, **TOL)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    text = "the cat ran to the park"
    assert hf_tok(text)["input_ids"] == tok.encode(text).ids
    assert (hf_tok.pad_token, hf_tok.bos_token, hf_tok.eos_token) == SPECIAL_TOKENS


def test_command_line(tmp_path, capsys):
    m = tiny_model(vocab_size=300)
    run = tmp_path / "run"
    run.mkdir()
    mm.save_checkpoint(m, run / "ckpt.pt")
    save_tokenizer(_tokenizer(), run / "tokenizer.json")
    assert export.main([str(run / "ckpt.pt"), "--pth", str(tmp_path / "out")]) == 0
    path = tmp_path / "out" / pth_filename("pretrain", 32)
    assert f"wrote {path}" in capsys.readouterr().out
    saved = torch.load(path, weights_only=True)
    assert saved.keys() == m.state_dict().keys()
    assert all(torch.equal(saved[k], v.half()) for k, v in m.state_dict().items())
    with pytest.raises(SystemExit):  # nothing to write
        export.main([str(run / "ckpt.pt")])
    with pytest.raises(SystemExit):  # a tokenizer that is not there
        export.main([str(run / "ckpt.pt"), "--pth", str(tmp_path / "out"), "--tokenizer", str(tmp_path / "none.json")])
    if pytest.importorskip("transformers"):
        assert export.main([str(run / "ckpt.pt"), "--hf", str(tmp_path / "hf")]) == 0
        assert (tmp_path / "hf" / "tokenizer.json").exists() and (tmp_path / "hf" / "config.json").exists()
