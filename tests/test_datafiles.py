"""Upstream's data files at full size (minimind_ref.datafiles, minimind_ref.token_cache and TrainConfig.data on a file).

* Wrong formats are refused with the file and line named (a .jsonl whose lines lack "text", SFT
  or DPO records given as pretraining data, a .txt that holds JSON lines, a .json file, bad JSON,
  bytes that are not UTF-8), also when the error lies in a later chunk of a parallel run.
* The windows of a tokenized file equal a reference tokenization: ``data.encode_documents`` of the
  same documents cut by ``data.PackedDataset`` (exactly, token for token), in one process and in a
  pool of processes over many chunks.
* The cache is keyed by the file's bytes and the tokenizer: a second run finds it; another file, an
  edited file or another tokenizer is tokenized again; a folder left incomplete is rebuilt.
* A resumed run sees the same batches (exactly) and refuses a file that changed.
* Slow: two gloo processes under torchrun on a .jsonl follow one process (rtol = atol = 1e-5 on
  the losses, 1e-4 on the weights, as tests/test_ddp.py argues); a generated file of about 200 MB
  trains with bounded memory (peak RSS growth of the training process and of each tokenizing
  worker under 1 GB, measured in a subprocess).
"""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from minimind_ref import data as D
from minimind_ref import datafiles as F
from minimind_ref import token_cache as T
from minimind_ref.chat_data import save_jsonl
from minimind_ref.tokenizer import load_tokenizer, save_tokenizer, train_bpe_tokenizer
from minimind_ref.train import TrainConfig, build_data, train

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "minimind_ref" / "configs" / "tiny_test.json"


@pytest.fixture(scope="module")
def docs():
    corpus = D.make_corpus(400, seed=5)
    corpus[7] = "a literal <|im_end|> inside a text stays text"  # encode_documents' rule, kept in the cache
    corpus[8] = "中文也可以：你好，世界。"
    return corpus


@pytest.fixture(scope="module")
def tok(docs):
    return train_bpe_tokenizer(docs, vocab_size=300)


def _jsonl(path, docs):
    save_jsonl([{"text": d} for d in docs], str(path))
    return str(path)


def _windows(ds):
    return ds.batch(torch.arange(len(ds)))[0]


# ---------------------------------------------------------------------- formats
def test_data_format_by_name():
    assert F.data_format("a/pretrain_hq.jsonl") == "jsonl"
    assert F.data_format("b.PARQUET") == "parquet"
    assert F.data_format("c.txt") == F.data_format("notes") == "text"
    with pytest.raises(ValueError, match=r"\.json file.*\.jsonl"):
        F.data_format("d.json")


@pytest.mark.parametrize("line, message", [
    ('{"content": "hi"}', r"bad\.jsonl:3 has no 'text' \(its keys: 'content'\)"),
    ('{"conversations": [{"role": "user", "content": "hi"}]}', r"bad\.jsonl:3 has no 'text'.*SFT or RLAIF format"),
    ('{"chosen": [], "rejected": []}', r"bad\.jsonl:3 has no 'text'.*DPO format"),
    ('{"text": 5}', r"bad\.jsonl:3: 'text' must be a string, got int"),
    ('{"text": "cut', r"bad\.jsonl:3 is not valid JSON"),
    ('["text"]', r"bad\.jsonl:3 is a JSON list, not an object"),
])
def test_malformed_pretraining_lines_are_named_by_file_and_line(tmp_path, tok, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "one"}\n\n' + line + '\n{"text": "four"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        T.prepare_token_cache(str(path), tok, str(tmp_path / "cache"), workers=1, progress=False)
    with pytest.raises(ValueError, match=message):
        list(F.iter_texts(str(path)))
    assert not [p for p in (tmp_path / "cache").iterdir() if p.is_dir()], "no cache is written for a bad file"


def test_not_utf8_line(tmp_path, tok):
    path = tmp_path / "latin.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"latin\.jsonl:2 is not UTF-8"):
        T.prepare_token_cache(str(path), tok, str(tmp_path / "cache"), workers=1, progress=False)


def test_error_in_a_later_chunk_names_its_line_in_a_parallel_run(tmp_path, tok, docs):
    lines = [json.dumps({"text": d}) for d in docs]
    lines[350] = json.dumps({"txt": "wrong key"})
    path = tmp_path / "late.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"late\.jsonl:351 has no 'text'"):
        T.prepare_token_cache(str(path), tok, str(tmp_path / "cache"), workers=2, progress=False, chunk_bytes=4096)


def test_a_text_file_that_holds_json_lines_is_refused(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text('{"text": "Once upon a time"}\n{"text": "The end."}\n', encoding="utf-8")
    cfg = TrainConfig.from_json(str(TINY)).replace(data=str(path))
    with pytest.raises(ValueError, match=r"looks like JSON lines .*'text'.*Name the file \.jsonl"):
        build_data(cfg)
    parquet_named_txt = tmp_path / "p.txt"
    parquet_named_txt.write_bytes(b"PAR1\x00\x00")
    with pytest.raises(ValueError, match="Parquet file"):
        build_data(cfg.replace(data=str(parquet_named_txt)))


def test_an_empty_file_is_refused(tmp_path, tok):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="holds no document"):
        T.prepare_token_cache(str(path), tok, str(tmp_path / "cache"), workers=1, progress=False)


def test_config_checks_the_data_options():
    with pytest.raises(ValueError, match="data_workers=-1"):
        TrainConfig(data_workers=-1)
    with pytest.raises(ValueError, match="data_cache=3"):
        TrainConfig(data_cache=3)


# ---------------------------------------------------------------------- windows equal a reference tokenization
@pytest.mark.parametrize("workers, chunk_bytes", [(1, None), (2, 2048)])
def test_cached_windows_equal_the_reference_tokenization(tmp_path, docs, tok, workers, chunk_bytes):
    path = _jsonl(tmp_path / "docs.jsonl", docs)
    cache = T.prepare_token_cache(path, tok, str(tmp_path / "cache"), workers=workers, progress=False,
                                  chunk_bytes=chunk_bytes)
    assert cache.tokens.dtype == np.uint16 and cache.n_docs == len(docs)
    reference = D.encode_documents(tok, docs)
    assert torch.equal(torch.from_numpy(np.asarray(cache.tokens, dtype=np.int64)), reference)
    train_w, val_w = T.split_windows(cache, 32, n_val_docs=15)  # 15 <= 400 // 20: the last 15 documents
    assert torch.equal(_windows(train_w), D.PackedDataset(D.encode_documents(tok, docs[:-15]), 32).data)
    assert torch.equal(_windows(val_w), D.PackedDataset(D.encode_documents(tok, docs[-15:]), 32).data)
    x, y = train_w.batch(torch.tensor([3, 0, 3]))
    assert x.dtype == torch.long and x.shape == (3, 32) and torch.equal(x, y) and torch.equal(x[0], x[2])


def test_build_data_on_a_jsonl_file_trains_its_tokenizer_on_the_training_documents(tmp_path, docs):
    path = _jsonl(tmp_path / "docs.jsonl", docs)
    cfg = TrainConfig.from_json(str(TINY)).replace(data=path, data_cache=str(tmp_path / "cache"), n_val_docs=15)
    run = build_data(cfg)
    reference_tok = train_bpe_tokenizer(docs[:-15], vocab_size=cfg.vocab_size, split_digits=cfg.split_digits)
    assert run.tokenizer.to_str() == reference_tok.to_str()
    assert torch.equal(_windows(run.train), D.PackedDataset(D.encode_documents(reference_tok, docs[:-15]), cfg.seq_len).data)
    assert run.test_problems == []


def test_token_dtype_follows_the_vocabulary():
    assert T.token_dtype(6400) == np.uint16 and T.token_dtype(65536) == np.uint16
    assert T.token_dtype(65537) == np.uint32 and T.token_dtype(151_665) == np.uint32


@pytest.mark.skipif(not __import__("importlib").util.find_spec("pyarrow"), reason="pyarrow is not installed")
def test_parquet_gives_the_same_windows_as_jsonl(tmp_path, docs, tok):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": docs, "id": list(range(len(docs)))}), path, row_group_size=64)
    cache = T.prepare_token_cache(str(path), tok, str(tmp_path / "cache"), workers=2, progress=False)
    assert torch.equal(torch.from_numpy(np.asarray(cache.tokens, dtype=np.int64)), D.encode_documents(tok, docs))
    pq.write_table(pa.table({"body": docs}), tmp_path / "other.parquet")
    with pytest.raises(ValueError, match="no 'text' column"):
        T.prepare_token_cache(str(tmp_path / "other.parquet"), tok, str(tmp_path / "cache"), progress=False)


# ---------------------------------------------------------------------- the cache's key
def test_cache_hits_and_misses(tmp_path, docs, tok):
    root = str(tmp_path / "cache")
    path = _jsonl(tmp_path / "docs.jsonl", docs)
    first = T.prepare_token_cache(path, tok, root, workers=1, progress=False)
    stamp = os.stat(os.path.join(first.folder, "tokens.bin")).st_mtime_ns
    lines = []
    again = T.prepare_token_cache(path, tok, root, workers=1, progress=False, log=lines.append)
    assert again.folder == first.folder and "tokenized before" in lines[0]
    assert os.stat(os.path.join(again.folder, "tokens.bin")).st_mtime_ns == stamp, "a hit must not rewrite the tokens"
    # the same bytes under another name: the same cache (keyed by content, not by path)
    copy = _jsonl(tmp_path / "copy.jsonl", docs)
    assert T.prepare_token_cache(copy, tok, root, workers=1, progress=False).folder == first.folder
    # an edited file: tokenized again
    _jsonl(tmp_path / "docs.jsonl", docs[:-1] + ["a new last document"])
    edited = T.prepare_token_cache(path, tok, root, workers=1, progress=False)
    assert edited.folder != first.folder and edited.n_docs == len(docs)
    assert torch.equal(torch.from_numpy(np.asarray(edited.tokens, dtype=np.int64)),
                       D.encode_documents(tok, docs[:-1] + ["a new last document"]))
    # another tokenizer: tokenized again
    other_tok = train_bpe_tokenizer(docs, vocab_size=280)
    other = T.prepare_token_cache(copy, other_tok, root, workers=1, progress=False)
    assert other.folder not in (first.folder, edited.folder)
    assert torch.equal(torch.from_numpy(np.asarray(other.tokens, dtype=np.int64)), D.encode_documents(other_tok, docs))
    # the same tokenizer loaded from its file has the same digest
    save_tokenizer(tok, tmp_path / "tok.json")
    assert T.tokenizer_digest(load_tokenizer(tmp_path / "tok.json")) == T.tokenizer_digest(tok)
    # a folder without its meta.json (a run killed while writing) is rebuilt
    os.remove(os.path.join(first.folder, "meta.json"))
    rebuilt = T.prepare_token_cache(copy, tok, root, workers=1, progress=False)
    assert rebuilt.folder == first.folder and os.path.exists(os.path.join(first.folder, "meta.json"))
    assert not [p for p in os.listdir(root) if p.startswith(".minimind_chunks_")], "scratch chunks are removed"


# ---------------------------------------------------------------------- resuming and the post-training readers
def test_a_resumed_run_sees_the_same_batches_and_refuses_a_changed_file(tmp_path, docs):
    from minimind_ref.train import lm_objective

    path = _jsonl(tmp_path / "docs.jsonl", docs)
    cfg = TrainConfig.from_json(str(TINY)).replace(data=path, data_cache=str(tmp_path / "cache"), n_val_docs=15,
                                                   max_steps=6, eval_every=3)
    seen = {"straight": [], "resumed": []}

    def recording(name):
        def objective(model, batch):
            if model.training:  # the evaluation uses the objective too
                seen[name].append(batch[0].clone())
            return lm_objective(model, batch)
        return objective

    straight = train(cfg.replace(out_dir=str(tmp_path / "a")), objective=recording("straight"))
    train(cfg.replace(out_dir=str(tmp_path / "b")), objective=recording("resumed"), stop_at=3)
    resumed = train(cfg.replace(out_dir=str(tmp_path / "b"), resume="auto"), objective=recording("resumed"))
    assert len(seen["straight"]) == len(seen["resumed"]) == 6
    assert all(torch.equal(a, b) for a, b in zip(seen["straight"], seen["resumed"]))
    assert len({tuple(b.flatten().tolist()) for b in seen["straight"]}) == 6, "six different batches"
    assert resumed.history["loss"] == straight.history["loss"]
    _jsonl(tmp_path / "docs.jsonl", docs[::-1])  # the same path, other bytes
    with pytest.raises(ValueError, match="training data differ"):
        train(cfg.replace(out_dir=str(tmp_path / "b"), resume="auto"))


def test_jsonl_records_stream_and_name_bad_lines(tmp_path):
    from minimind_ref import chat_data

    sft = chat_data.sft_conversations(5, seed=1)
    path = tmp_path / "sft.jsonl"
    save_jsonl(sft, str(path))
    records = F.JsonlRecords(str(path), "sft")
    assert len(records) == 5 and records[3] == sft[3] and records[-1] == sft[-1] and list(records) == sft
    with pytest.raises(IndexError):
        records[5]
    text = path.read_text(encoding="utf-8").splitlines()
    text.insert(2, "")
    text[3] = json.dumps({"conversations": [{"role": "robot", "content": "hi"}]})
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    records = F.JsonlRecords(str(path), "sft")
    assert len(records) == 5 and records[0] == sft[0]
    with pytest.raises(ValueError, match=r"sft\.jsonl:4: conversations\[0\] has role 'robot'"):
        records[2]
    with pytest.raises(ValueError, match=r"sft\.jsonl:4"):
        records.validate()
    dpo_path = tmp_path / "dpo.jsonl"
    dpo_path.write_text(json.dumps({"chosen": [{"role": "user", "content": "q"}]}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"dpo\.jsonl:1 has no 'rejected'"):
        F.JsonlRecords(str(dpo_path), "dpo")[0]
    rl_path = tmp_path / "rl.jsonl"
    rl_path.write_text(json.dumps({"conversations": [{"role": "user", "content": "q"}]}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"rl\.jsonl:1: the last turn of an RLAIF record is the assistant's"):
        F.JsonlRecords(str(rl_path), "rlaif")[0]
    pre = tmp_path / "pre.jsonl"
    pre.write_text('{"text": "hello"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"pre\.jsonl:1 has no 'conversations'.*'text': pretraining data"):
        F.JsonlRecords(str(pre), "sft")[0]


def test_post_training_datasets_read_upstreams_files_through_the_reader(tmp_path):
    from minimind_ref import chat_data, grpo
    from minimind_ref.dpo import DPODataset
    from minimind_ref.sft import SFTDataset

    tok = train_bpe_tokenizer([m["content"] for r in chat_data.sft_conversations(200, seed=0) for m in r["conversations"]],
                              vocab_size=400)
    sft = chat_data.sft_conversations(12, seed=2)
    save_jsonl(sft, str(tmp_path / "sft.jsonl"))
    from_file = SFTDataset(F.JsonlRecords(str(tmp_path / "sft.jsonl"), "sft"), tok, max_length=256)
    assert from_file.fingerprint() == SFTDataset(sft, tok, max_length=256).fingerprint()
    pairs = chat_data.preference_pairs(6, seed=2)
    save_jsonl(pairs, str(tmp_path / "dpo.jsonl"))
    assert DPODataset(F.JsonlRecords(str(tmp_path / "dpo.jsonl"), "dpo"), tok, 256).fingerprint() == \
        DPODataset(pairs, tok, 256).fingerprint()
    prompts = chat_data.rl_prompts(7, seed=2)
    save_jsonl(prompts, str(tmp_path / "rl.jsonl"))
    rl = grpo.RLPromptDataset(F.JsonlRecords(str(tmp_path / "rl.jsonl"), "rlaif"))
    assert len(rl) == 7 and rl.batch([4, 1]) == [prompts[4], prompts[1]]
    assert isinstance(rl.records, F.JsonlRecords), "the records stay on disk, read when a batch needs them"
    assert isinstance(from_file.examples, F.RecordStore), "a file's encodings stay on disk"
    torch.testing.assert_close(from_file.batch([5, 0]), SFTDataset(sft, tok, max_length=256).batch([5, 0]), rtol=0, atol=0)


def test_record_store_is_a_list_of_examples_on_disk():
    store, plain = F.RecordStore(2), []
    rng = random.Random(0)
    for n in range(3000):  # past one flush of the write buffer
        item = ([rng.randrange(-100, 70_000) for _ in range(rng.randrange(0, 60))], [n, -n])
        store.append(item)
        plain.append(item)
    store.extend([([], [])])
    plain.append(([], []))
    assert len(store) == len(plain) and store[-1] == ([], []) and store[1234] == plain[1234]
    assert list(store) == [tuple(x) for x in plain]
    with pytest.raises(IndexError):
        store[len(plain)]
    with pytest.raises(ValueError, match="2 fields got an example of 1"):
        store.append(([1],))


# ---------------------------------------------------------------------- slow: processes and size
def _run(args, env, timeout=600):
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, args))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.slow
def test_two_gloo_processes_on_a_jsonl_file_match_one_process(tmp_path, docs, tok):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    path = _jsonl(tmp_path / "docs.jsonl", docs)
    save_tokenizer(tok, tmp_path / "tok.json")
    common = ["--config", str(TINY), "--set", "device=\"cpu\"", f"data={json.dumps(path)}", "n_val_docs=15",
              f"tokenizer={json.dumps(str(tmp_path / 'tok.json'))}", "data_workers=2"]
    _run([sys.executable, "-m", "minimind_ref.train", *common, f"out_dir={json.dumps(str(tmp_path / 'single'))}",
          f"data_cache={json.dumps(str(tmp_path / 'cache1'))}", "--history", str(tmp_path / "single.json")], env)
    # its own cache folder: the first process tokenizes while the second waits, then reads what it made
    out = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "-m", "minimind_ref.train", *common, f"out_dir={json.dumps(str(tmp_path / 'ddp'))}",
                f"data_cache={json.dumps(str(tmp_path / 'cache2'))}", "--history", str(tmp_path / "ddp.json")], env)
    assert "x2 processes" in out
    h1 = json.loads((tmp_path / "single.json").read_text())["history"]
    h2 = json.loads((tmp_path / "ddp.json").read_text())["history"]
    assert h1["step"] == h2["step"] == list(range(8))
    torch.testing.assert_close(torch.tensor(h2["loss"]), torch.tensor(h1["loss"]), rtol=1e-5, atol=1e-5)
    w1 = torch.load(tmp_path / "single" / "ckpt.pt", weights_only=True)["state_dict"]
    w2 = torch.load(tmp_path / "ddp" / "ckpt.pt", weights_only=True)["state_dict"]
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-4, msg=k)
    (c1,), (c2,) = ([p for p in (tmp_path / c).iterdir() if p.is_dir()] for c in ("cache1", "cache2"))
    assert c1.name == c2.name and (c1 / "tokens.bin").read_bytes() == (c2 / "tokens.bin").read_bytes()


MEMORY_SCRIPT = r"""
import json, resource, sys
def rss_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
from minimind_ref.train import TrainConfig, train
from minimind_ref.tokenizer import load_tokenizer
cfg = TrainConfig.from_json(sys.argv[1]).replace(data=sys.argv[2], tokenizer=sys.argv[3], data_cache=sys.argv[4],
                                                 data_workers=2, max_steps=4, eval_every=0, n_val_docs=50)
load_tokenizer(sys.argv[3]).encode("warm up")
base = rss_mib()
result = train(cfg)
print(json.dumps({"base_mib": base, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "worker_peak_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                  "windows": len(result.data.train), "loss": result.history["loss"]}))
"""


def write_big_jsonl(path, megabytes, seed=0):
    """About ``megabytes`` MiB of {"text": ...} lines, fast: 2,000 lines of words drawn from 16 long
    made-up words (few pre-tokens per byte, so a small tokenizer gets through them quickly), repeated."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(12, 40))) for _ in range(16)]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(20, 200))) for _ in range(2000)]
    lines = [json.dumps({"text": t}) + "\n" for t in texts]
    block = "".join(lines).encode()
    with open(path, "wb") as f:
        for _ in range(-(-(megabytes << 20) // len(block))):
            f.write(block)
    return texts


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_200_mb_jsonl_trains_with_bounded_memory(tmp_path):
    path = tmp_path / "big.jsonl"
    texts = write_big_jsonl(path, 200)
    save_tokenizer(train_bpe_tokenizer(texts[:300], vocab_size=1024), tmp_path / "tok.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = _run([sys.executable, "-c", MEMORY_SCRIPT, str(TINY), str(path), str(tmp_path / "tok.json"),
                str(tmp_path / "cache")], env)
    got = json.loads(out.strip().splitlines()[-1])
    assert os.path.getsize(path) >= 200 << 20
    assert got["windows"] > 100_000 and len(got["loss"]) == 4
    assert got["peak_mib"] - got["base_mib"] < 1024, f"the training process grew by more than 1 GiB: {got}"
    assert got["worker_peak_mib"] < 1024, f"a tokenizing worker used more than 1 GiB: {got}"


def test_the_command_line_fills_the_cache(tmp_path, docs, tok, capsys):
    path = _jsonl(tmp_path / "docs.jsonl", docs)
    save_tokenizer(tok, tmp_path / "tok.json")
    assert T.main([path, "--tokenizer", str(tmp_path / "tok.json"), "--cache", str(tmp_path / "cache"), "--workers", "1"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["n_docs"] == len(docs) and summary["n_tokens"] == len(D.encode_documents(tok, docs))
    cfg = TrainConfig.from_json(str(TINY)).replace(data=path, tokenizer=str(tmp_path / "tok.json"),
                                                   data_cache=str(tmp_path / "cache"))
    build_data(cfg.replace(progress=True))
    assert "tokenized before" in capsys.readouterr().out, "the run finds the tokens the command prepared"
    (tmp_path / "bad.jsonl").write_text('{"txt": 1}\n', encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        T.main([str(tmp_path / "bad.jsonl"), "--tokenizer", str(tmp_path / "tok.json"), "--cache", str(tmp_path / "cache")])
    assert exit_info.value.code == 2 and "bad.jsonl:1 has no 'text'" in capsys.readouterr().err
