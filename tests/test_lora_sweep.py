"""Chapter 10's rank-sweep record (``minimind_ref/checkpoints/lora_sweep.json``, made by
``python -m minimind_ref.lora sweep --seeds 0``): its shape, its parameter counts (computed here,
not typed), the loader's error, and ``rank_sweep`` itself on stubbed training and evaluation."""
import json

import pytest
import torch

from minimind_ref import lora, stages
from minimind_ref.model import MiniMindForCausalLM


def test_shipped_record_has_every_run_and_metric():
    record = lora.load_sweep()
    assert record["command"].startswith("python -m minimind_ref.lora sweep --seeds ")
    seeds = [str(s) for s in record["seeds"]]
    assert seeds and record["command"].endswith(",".join(seeds))
    assert set(record["runs"]) == {name for name, _, _ in lora.SWEEP_RUNS}
    assert record["settings"]["runs"] == [list(r) for r in lora.SWEEP_RUNS]
    assert record["settings"]["config"] == lora.LORA_CONFIG
    for name, runs in record["runs"].items():
        assert sorted(runs) == sorted(seeds), name
        for run in runs.values():
            assert set(run["metrics"]) == set(lora.SWEEP_METRICS), name
            for metric, value in run["metrics"].items():
                if metric != "preference_margin":
                    assert 0.0 <= value <= 1.0, (name, metric, value)


def test_shipped_record_trainable_counts_match_the_model():
    record = lora.load_sweep()
    config = stages.load_stage("sft")[0].config
    with torch.device("meta"):
        total = sum(p.numel() for p in MiniMindForCausalLM(config).parameters())
    for name, rank, _ in lora.SWEEP_RUNS:
        if rank is None:
            want = total
        else:
            with torch.device("meta"):
                adapted = lora.apply_lora(MiniMindForCausalLM(config), rank=rank)
            want = sum(p.numel() for _, m in lora.lora_modules(adapted) for p in m.lora.parameters())
        for run in record["runs"][name].values():
            assert run["trainable"] == want, name


def test_load_sweep_names_the_command_when_the_record_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="minimind_ref.lora sweep"):
        lora.load_sweep(str(tmp_path / "missing.json"))


def test_rank_sweep_writes_a_record_for_every_run(tmp_path, monkeypatch):
    calls = []

    def fake_train(model, tokenizer, cfg, rank=16, replay=0.5, n_train=3000, seed=0, full=False, **kw):
        calls.append((rank, replay, full, seed, cfg.max_steps))
        if full:
            for p in model.parameters():
                p.requires_grad_(True)
        else:
            lora.apply_lora(model, rank=rank)
            lora.mark_only_lora_trainable(model)

    metrics = {k: 0.5 for k in lora.SWEEP_METRICS}
    monkeypatch.setattr(lora, "train_lora", fake_train)
    monkeypatch.setattr(stages, "evaluate_chat", lambda model, tokenizer: dict(metrics, extra=1.0))
    threads = torch.get_num_threads()
    out = tmp_path / "sweep.json"
    record = lora.rank_sweep(seeds=(3,), out=str(out), log=lambda line: None)
    assert torch.get_num_threads() == threads
    assert json.loads(out.read_text()) == json.loads(json.dumps(record))
    assert [(r, rep, full) for r, rep, full, _, _ in calls] == [
        (rank or 1, replay, rank is None) for _, rank, replay in lora.SWEEP_RUNS]
    assert all(seed == 3 for *_, seed, _ in calls)
    assert record["command"] == "python -m minimind_ref.lora sweep --seeds 3"
    for name, rank, _ in lora.SWEEP_RUNS:
        run = record["runs"][name]["3"]
        assert run["metrics"] == metrics
        assert (run["trainable"] > 100_000) == (rank is None)
