"""The page "Train the real MiniMind" end to end, small: a generated file in upstream's pretraining
format (``{"text": ...}`` lines) trains with the MiniMind2-Small recipe (shrunk to a tiny model, its
accumulation and schedule kept as a recipe sets them) through the token cache, stops, resumes to the
same losses as a run that never stopped, and is exported with ``python -m minimind_ref.export``: the
transformers folder gives the checkpoint's logits (``rtol = atol = 1e-5``, fp32) and upstream's
``.pth`` holds its weights in fp16. No network, no upstream code."""

import json

import pytest
import torch

import minimind_ref as mm
from minimind_ref import data as D
from minimind_ref import export
from minimind_ref.tokenizer import save_tokenizer, train_bpe_tokenizer
from minimind_ref.train import TrainConfig, train
from minimind_ref.upstream_weights import pth_filename

TINY_MODEL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}


def test_recipe_on_a_jsonl_file_trains_resumes_and_exports(tmp_path, capsys):
    docs = D.make_corpus(300, seed=3)
    data = tmp_path / "pretrain_hq.jsonl"
    data.write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    tokenizer = tmp_path / "tokenizer.json"
    save_tokenizer(train_bpe_tokenizer(docs, vocab_size=300), tokenizer)
    recipe = TrainConfig.from_json("pretrain_minimind2_small")
    cfg = recipe.replace(data=str(data), tokenizer=str(tokenizer), vocab_size=300, data_cache=str(tmp_path / "cache"),
                         data_workers=1, model={**recipe.model, **TINY_MODEL, "max_position_embeddings": 64},
                         seq_len=32, batch_size=4, accumulation_steps=2, epochs=None, max_steps=4, n_val_docs=10,
                         device="cpu", dtype="float32", progress=False, log_every=0, save_every=0, seed=1)
    assert (cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.betas) == (recipe.lr, recipe.min_lr, 0, recipe.betas)
    quiet = dict(log=lambda line: None)
    straight = train(cfg.replace(out_dir=str(tmp_path / "straight")), **quiet)
    run = tmp_path / "run"
    train(cfg.replace(out_dir=str(run)), stop_at=2, **quiet)
    resumed = train(cfg.replace(out_dir=str(run), resume="auto"), **quiet)
    assert resumed.step == straight.step == 4
    assert resumed.history["loss"] == straight.history["loss"]  # the same batches, the same updates
    assert len(list((tmp_path / "cache").glob("**/meta.json"))) == 1  # tokenized once, read three times

    ckpt = run / "ckpt.pt"
    assert export.main([str(ckpt), "--pth", str(tmp_path / "out"), "--hf", str(tmp_path / "hf")]) == 0
    assert capsys.readouterr().out.count("wrote ") == 2
    model = mm.load_checkpoint(ckpt)
    pth = torch.load(tmp_path / "out" / pth_filename("pretrain", 32), weights_only=True)
    assert all(torch.equal(pth[k], v.half()) for k, v in model.state_dict().items())
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ids = torch.tensor([hf_tok(docs[0])["input_ids"][:20]])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)
