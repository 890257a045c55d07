"""The training code of chapter 08: corpus, tokenizer, schedule, loss, loop, checkpoints, CLI."""

import json
import math
import re
from pathlib import Path

import pytest
import torch

from minimind_ref import MiniMindConfig, MiniMindForCausalLM, load_checkpoint
from minimind_ref import data as D
from minimind_ref.tokenizer import BOS_ID, EOS_ID, SPECIAL_TOKENS, learn_merges, load_tokenizer, merge_pair, save_tokenizer, train_bpe_tokenizer
from minimind_ref.train import (TrainConfig, build_data, build_model, causal_lm_loss, config_from_args, lr_at, main, solve_problems,
                                train)

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "minimind_ref" / "configs" / "tiny_test.json"


def tiny(**changes):
    return TrainConfig.from_json(str(TINY)).replace(**changes)


@pytest.fixture(scope="module")
def tiny_data():
    return build_data(tiny())


# ---------------------------------------------------------------------- corpus
def test_arithmetic_split_is_disjoint_and_deterministic():
    train_pairs, test_pairs = D.arithmetic_split()
    assert len(train_pairs) + len(test_pairs) == 100 * 100
    assert not set(train_pairs) & set(test_pairs)
    assert D.arithmetic_split() == (train_pairs, test_pairs)
    assert 500 <= len(test_pairs) <= 501  # 5%, rounded up to whole unordered pairs
    # unordered pairs are held out together: no test problem has its swapped twin in training
    train = set(train_pairs)
    assert not any((b, a) in train for a, b in test_pairs)


def test_corpus_never_shows_a_test_problem():
    train_pairs, test_pairs = D.arithmetic_split()
    test = set(test_pairs)
    docs = D.make_corpus(2000, seed=3)
    assert docs == D.make_corpus(2000, seed=3)
    seen = 0
    for doc in docs:
        for a, b, c in re.findall(r"(\d+)\+(\d+)=(\d+)", doc):
            assert (int(a), int(b)) not in test and int(a) + int(b) == int(c)
            seen += 1
        for a, b, c in re.findall(r"found (\d+) \w+ and \w+ found (\d+) \w+\. Together they had (\d+)", doc):
            assert (int(a), int(b)) not in test and int(a) + int(b) == int(c)
            seen += 1
    assert seen > 5000


def test_read_text_documents(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("first para\nline two\n\nsecond para\n\n\n", encoding="utf-8")
    assert D.read_text_documents(str(p)) == ["first para\nline two", "second para"]
    p.write_text("a\nb\nc\n", encoding="utf-8")
    assert D.read_text_documents(str(p)) == ["a", "b", "c"]


def test_global_batch_indices_cover_each_epoch_and_shard():
    n, b = 10, 4
    seen = torch.cat([D.global_batch_indices(n, b, s, seed=1) for s in range(5)])  # 20 samples = 2 epochs
    assert sorted(seen[:10].tolist()) == list(range(10)) and sorted(seen[10:].tolist()) == list(range(10))
    assert torch.equal(D.global_batch_indices(n, b, 3, seed=1), seen[12:16])
    g = D.global_batch_indices(n, b, 2, seed=1)
    assert torch.equal(torch.cat([D.shard(g, r, 2) for r in range(2)]), g)
    with pytest.raises(ValueError):
        D.shard(g, 0, 3)


def test_packed_dataset():
    ds = D.PackedDataset(torch.arange(10), 3)
    assert len(ds) == 3 and ds[1][0].tolist() == [3, 4, 5]
    x, y = ds.batch(torch.tensor([2, 0]))
    assert x.tolist() == [[6, 7, 8], [0, 1, 2]] and torch.equal(x, y)


# ---------------------------------------------------------------------- tokenizer
def test_merge_pair_and_learn_merges():
    assert merge_pair([5, 5, 5], (5, 5), 9) == [9, 5]
    assert merge_pair([1, 2, 3, 1, 2], (1, 2), 7) == [7, 3, 7]
    ids, merges = learn_merges("aaabdaaabac", 3)
    assert list(merges.values()) == [256, 257, 258]
    assert len(ids) < len("aaabdaaabac")
    # undoing the merges gives the bytes back
    inverse = {v: k for k, v in merges.items()}
    def expand(t):
        return [t] if t < 256 else expand(inverse[t][0]) + expand(inverse[t][1])
    assert bytes(sum((expand(t) for t in ids), [])).decode() == "aaabdaaabac"


def test_bpe_tokenizer_roundtrip(tmp_path):
    docs = D.make_corpus(300, seed=0)
    tok = train_bpe_tokenizer(docs, vocab_size=320)
    assert tok.get_vocab_size() <= 320
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    text = "Once upon a time, Mia had 12+34=46 ünïcode ✓"
    enc = tok.encode(text)
    assert tok.decode(enc.ids) == text  # byte-level: nothing is unknown
    assert [tok.id_to_token(i) for i in tok.encode("1234").ids] == ["1", "2", "3", "4"]  # digits split
    save_tokenizer(tok, tmp_path / "tok" / "tokenizer.json")
    again = load_tokenizer(tmp_path / "tok" / "tokenizer.json")
    assert again.encode(text).ids == enc.ids
    # training is deterministic
    assert train_bpe_tokenizer(docs, vocab_size=320).get_vocab() == tok.get_vocab()
    with pytest.raises(ValueError):
        train_bpe_tokenizer(docs, vocab_size=100)


# ---------------------------------------------------------------------- schedule and loss
def test_lr_schedule_shape():
    lrs = [lr_at(s, 100, 10, 1e-3, 1e-4) for s in range(120)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lrs[100] == pytest.approx(1e-4) and lrs[119] == pytest.approx(1e-4)
    assert lr_at(0, 10, 0, 1.0, 0.0) == pytest.approx(1.0)


def test_causal_lm_loss_matches_model_loss():
    torch.manual_seed(0)
    model = MiniMindForCausalLM(MiniMindConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                               num_key_value_heads=2, vocab_size=50, max_position_embeddings=32))
    ids = torch.randint(3, 50, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    out = model(ids, labels=ids.masked_fill(mask == 0, -100))
    torch.testing.assert_close(causal_lm_loss(out.logits, ids, mask), out.loss)
    torch.testing.assert_close(causal_lm_loss(out.logits, ids), model(ids, labels=ids).loss)


# ---------------------------------------------------------------------- the loop
def test_config_json_and_overrides(tmp_path):
    cfg, _ = config_from_args(["--config", str(TINY), "--set", "max_steps=3", "model.hidden_size=64", "out_dir=x"])
    assert cfg.max_steps == 3 and cfg.model["hidden_size"] == 64 and cfg.out_dir == "x"
    assert cfg.model["num_hidden_layers"] == 2  # untouched keys survive
    with pytest.raises(ValueError, match="unknown training option"):
        TrainConfig.from_dict({"max_step": 3})
    for path in sorted((ROOT / "minimind_ref" / "configs").glob("*.json")):
        TrainConfig.from_json(str(path))  # every shipped config parses


def test_training_lowers_the_loss(tiny_data):
    cfg = tiny(max_steps=30, eval_every=30)
    res = train(cfg, data=tiny_data)
    h = res.history
    assert len(h["loss"]) == 30 and h["step"] == list(range(30))
    assert h["loss"][0] == pytest.approx(math.log(tiny_data.tokenizer.get_vocab_size()), abs=0.7)
    assert sum(h["loss"][-5:]) / 5 < h["loss"][0] - 1.5, h["loss"]
    assert h["lr"][-1] == pytest.approx(lr_at(29, 30, cfg.warmup_steps, cfg.lr, cfg.min_lr))
    assert h["eval_step"] == [0, 30] and h["eval_loss"][1] < h["eval_loss"][0]
    assert all(math.isfinite(g) for g in h["grad_norm"])
    answers = solve_problems(res.model, tiny_data.tokenizer, [(1, 2), (10, 20), (3, 4)], torch.device("cpu"))
    assert len(answers) == 3 and all(isinstance(a, str) for a in answers)


def test_resume_continues_the_same_run(tmp_path, tiny_data):
    """N steps straight == N/2 steps, checkpoint, resume, N/2 more: same losses and same weights
    (bit for bit on CPU: the data order depends only on the step and the optimizer state is restored)."""
    cfg = tiny(max_steps=8)
    straight = train(cfg.replace(out_dir=str(tmp_path / "a")), data=tiny_data)
    first = train(cfg.replace(out_dir=str(tmp_path / "b")), data=tiny_data, stop_at=4)
    assert first.step == 4 and len(first.history["loss"]) == 4
    resumed = train(cfg.replace(out_dir=str(tmp_path / "b"), resume="auto"), data=tiny_data)
    assert resumed.history["step"] == list(range(8))
    assert resumed.history["loss"] == straight.history["loss"]
    assert resumed.history["eval_loss"] == straight.history["eval_loss"]
    for (k, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)
    # the checkpoint is an ordinary save_checkpoint file
    loaded = load_checkpoint(tmp_path / "b" / "ckpt.pt")
    x = torch.tensor([[BOS_ID, 5, 6, 7]])
    torch.testing.assert_close(loaded(x).logits, resumed.model.eval()(x).logits)


def test_moe_run_adds_the_aux_loss(tiny_data):
    cfg = tiny(max_steps=3, eval_every=0, model={"use_moe": True, "n_routed_experts": 4, "num_experts_per_tok": 2})
    res = train(cfg, data=tiny_data)
    assert all(a > 0 for a in res.history["aux_loss"])


def test_cli_on_a_text_file(tmp_path, capsys):
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(f"The cat number {i} sat on the mat and looked at the dog." for i in range(300)), encoding="utf-8")
    hist = tmp_path / "h.json"
    rc = main(["--config", str(TINY), "--set", f"data={json.dumps(str(text))}", f"out_dir={json.dumps(str(tmp_path / 'run'))}",
               "max_steps=4", "eval_every=2", "--history", str(hist)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "done: step 4" in out and "held-out accuracy" not in out  # no arithmetic on a text file
    h = json.loads(hist.read_text())["history"]
    assert len(h["loss"]) == 4
    for name in ("ckpt.pt", "tokenizer.json", "train_config.json"):
        assert (tmp_path / "run" / name).exists()
    assert load_checkpoint(tmp_path / "run" / "ckpt.pt").config.vocab_size == load_tokenizer(tmp_path / "run" / "tokenizer.json").get_vocab_size()


def test_special_ids_frame_documents(tiny_data):
    stream = tiny_data.train.data.view(-1)
    assert int((stream == BOS_ID).sum()) > 0 and int((stream == EOS_ID).sum()) > 0
    assert int(stream.max()) < tiny_data.tokenizer.get_vocab_size()


# ---------------------------------------------------------------------- hooks, validation, safe resume
def test_named_configs_are_shipped_in_the_package():
    from minimind_ref.train import named_configs

    assert {"ch08_cpu", "ch08_gpu", "tiny_test"} <= set(named_configs())
    assert TrainConfig.from_json("tiny_test") == TrainConfig.from_json(str(TINY))
    with pytest.raises(FileNotFoundError, match="shipped configs: .*tiny_test"):
        TrainConfig.from_json("no_such_config")


@pytest.mark.parametrize("changes, fragment", [
    ({"grad_clip": -1}, "grad_clip=-1"),
    ({"grad_clip": 0}, "0 would zero every update"),
    ({"seq_len": 1}, "at least 2 tokens"),
    ({"lr": "abc"}, "lr='abc'"),
    ({"lr": float("nan")}, "positive finite number"),
    ({"max_steps": 0}, "max_steps=0"),
    ({"min_lr": 1.0}, "between 0 and lr"),
    ({"betas": [0.9]}, "two numbers"),
    ({"dtype": "fp16"}, "'auto', 'float32', 'bfloat16' or 'float16'"),
    ({"accumulation_steps": 0}, "accumulation_steps=0"),
    ({"epochs": 0}, "positive number of passes"),
    ({"compile": "yes"}, "compile='yes'"),
    ({"batch_size": 2.5}, "whole number"),
])
def test_invalid_training_settings_are_refused(changes, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        tiny(**changes)


def test_cli_reports_bad_values_without_a_traceback(capsys):
    for bad in (["lr=abc"], ["max_steps=0"]):
        with pytest.raises(SystemExit) as exit_info:
            config_from_args(["--config", "tiny_test", "--set", *bad])
        assert exit_info.value.code == 2
        assert "is invalid" in capsys.readouterr().err


def test_divergence_never_reaches_a_checkpoint(tmp_path, tiny_data):
    run = tmp_path / "run"
    train(tiny(max_steps=2, eval_every=0, out_dir=str(run)), data=tiny_data)
    good = torch.load(run / "ckpt.pt", weights_only=True)["state_dict"]
    with pytest.raises(FloatingPointError, match="NOT updated"):
        train(tiny(max_steps=6, lr=1e9, min_lr=0.0, warmup_steps=0, eval_every=0, save_every=1, grad_clip=None,
                   out_dir=str(tmp_path / "diverged")), data=tiny_data)
    saved = tmp_path / "diverged" / "ckpt.pt"
    if saved.exists():  # steps before the divergence may have been saved: they are finite
        assert all(torch.isfinite(t).all() for t in torch.load(saved, weights_only=True)["state_dict"].values())
    assert all(torch.isfinite(t).all() for t in good.values())


def test_resume_auto_needs_out_dir(tiny_data):
    with pytest.raises(ValueError, match="out_dir is not set"):
        train(tiny(resume="auto"), data=tiny_data)


def test_resume_refuses_other_settings_before_writing_anything(tmp_path, tiny_data):
    run = tmp_path / "run"
    train(tiny(max_steps=4, out_dir=str(run)), data=tiny_data, stop_at=2)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    with pytest.raises(ValueError, match=r"other settings \(model:"):
        train(tiny(max_steps=4, out_dir=str(run), resume="auto", model={"hidden_size": 64}))
    with pytest.raises(ValueError, match="n_docs: checkpoint 300, now 301"):
        train(tiny(max_steps=4, out_dir=str(run), resume="auto", n_docs=301))
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before, "a refused resume must not touch the run folder"


def test_resume_reuses_the_runs_tokenizer_and_refuses_other_data(tmp_path, tiny_data):
    run = tmp_path / "run"
    cfg = tiny(max_steps=4, out_dir=str(run))
    train(cfg, stop_at=2)
    tok_before = (run / "tokenizer.json").read_bytes()
    resumed = train(cfg.replace(resume="auto"))  # builds its data with the run's own tokenizer file
    assert resumed.step == 4 and (run / "tokenizer.json").read_bytes() == tok_before
    other = build_data(tiny(n_docs=200))
    train(cfg.replace(out_dir=str(tmp_path / "run2")), data=tiny_data, stop_at=2)
    with pytest.raises(ValueError, match="training data differ"):
        train(cfg.replace(out_dir=str(tmp_path / "run2"), resume="auto", n_docs=300), data=other)


def test_hooks_objective_schedule_and_step_fn(tiny_data):
    from minimind_ref.train import lm_objective

    seen = []

    def objective(model, batch):
        out = lm_objective(model, batch)
        out["double"] = 2 * out["loss"].detach()
        return out

    res = train(tiny(max_steps=3, eval_every=0), data=tiny_data, objective=objective,
                lr_schedule=lambda step, *_: 1e-3 * (step + 1))
    assert res.history["lr"] == pytest.approx([1e-3, 2e-3, 3e-3])
    assert res.history["double"] == pytest.approx([2 * v for v in res.history["loss"]])

    def step_fn(model, optimizer, batch, max_grad_norm):
        seen.append(max_grad_norm)
        out = model(batch[0], labels=batch[1])
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return out.loss.item()

    res = train(tiny(max_steps=2, eval_every=0), data=tiny_data, step_fn=step_fn)
    assert seen == [1.0, 1.0] and len(res.history["loss"]) == 2 and math.isnan(res.history["grad_norm"][0])


def test_a_batch_without_supervised_tokens_is_skipped(tiny_data):
    from minimind_ref.train import RunData

    class NoTargets:
        """Batches whose labels are all -100 for the first ``empty`` calls."""

        def __init__(self, base, empty):
            self.base, self.empty = base, empty

        def __len__(self):
            return len(self.base)

        def batch(self, idx):
            x, y = self.base.batch(idx)
            self.empty -= 1
            return (x, torch.full_like(x, -100)) if self.empty >= 0 else (x, y)

    model = build_model(tiny(), tiny_data.tokenizer.get_vocab_size())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lines = []
    res = train(tiny(max_steps=2, eval_every=0), model=model,
                data=RunData(tiny_data.tokenizer, NoTargets(tiny_data.train, 1)), log=lines.append)
    assert res.history["skipped"] == [1.0, 0.0]
    assert any("1 of 2 steps were skipped" in line for line in lines), lines
    assert not all(torch.equal(before[k], v) for k, v in res.model.state_dict().items())
    # every step skipped: an error, not a run that returns the weights unchanged
    model = build_model(tiny(), tiny_data.tokenizer.get_vocab_size())
    with pytest.raises(ValueError, match="every one of the 2 steps was skipped"):
        train(tiny(max_steps=2, eval_every=0), model=model, data=RunData(tiny_data.tokenizer, NoTargets(tiny_data.train, 2)),
              log=lines.append)
