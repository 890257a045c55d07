"""The benchmark beside upstream's trainer (benchmarks/bench_upstream_trainer.py), without upstream: its
reading of a record (step times, useful tokens per second, the loss at upstream's tokens, per-round
ratios, bf16 against fp32 within the seed noise, the goals), the page's table and figure, the
synthetic file in upstream's format, and the refusal of a checkout that is not at a pinned commit.
No timing is measured; the records here are made up so every figure can be worked out by hand."""

import json

import pytest

from benchmarks import bench_upstream_trainer as B


def _run(step_s, loss, useful, seed, rnd):
    return {"step_s": list(step_s), "loss": list(loss), "useful_tokens": list(useful), "cpu_s": list(step_s),
            "seed": seed, "round": rnd, "parameters": 1000}


def _record():
    """Two rounds; upstream 2 s a step on 1,000 useful tokens, the course's fp32 2 s on 2,000 tokens,
    bf16 1 s (round 0) and 1.25 s (round 1), compiled 1.6 s; 4 steps, the first one warm-up."""
    up = [_run([9, 2, 2, 2], [5, 4, 3, 2], [1000] * 4, 42, r) for r in (0, 1)]
    fp32 = [_run([9, 2, 2, 2], [5.0, 3.0, 2.0, 1.0 + r], [2000] * 4, r, r) for r in (0, 1)]
    bf16 = [_run([9, 1 + r / 4, 1 + r / 4, 1 + r / 4], [5.0, 3.0, 2.0, 1.1 + r], [2000] * 4, r, r) for r in (0, 1)]
    comp = [_run([30, 1.6, 1.6, 1.6], [5.0, 3.0, 2.0, 3.0 + r], [2000] * 4, r, r) for r in (0, 1)]
    env = {"device_name": "a CPU", "cpu_count": 2, "threads": 2, "cpu_flags": ["avx512_bf16", "avx512f"],
           "native_bf16": True, "torch_cpu_capability": "AVX512", "python": "3.11", "torch": "2.13.0",
           "upstream_env": {"transformers": "4.57.6", "datasets": "3.6.0"}, "load_average_at_start": [0.5, 0.5, 0.5]}
    settings = {"batch": 8, "seq_len": 340, "steps": 4, "warmup": 1, "rounds": 2, "threads": 2, "accumulation_steps": 1}
    entry = {"model": dict(B.MODELS["c090b69"]), "rows": {"texts": 10, "mean_tokens": 300.0, "padding_share": 0.3,
                                                          "cut_share": 0.2},
             "runs": {"upstream": up, "course_fp32": fp32, "course_bf16": bf16, "course_bf16_compiled": comp},
             "load_average_after_rounds": [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]}
    return {"date": "2026-11-29", "environment": env, "settings": settings, "commits": {"c090b69": entry}}


def test_summarize_run_skips_warmup_and_counts_useful_tokens():
    s = B.summarize_run(_run([9, 2, 4, 2], [1] * 4, [100, 200, 300, 400], 0, 0), warmup=1)
    assert s["step_s"] == 2  # median of 2, 4, 2
    assert s["tokens_per_s"] == pytest.approx(300 / 2)  # mean tokens of steps 1..3 over the median step


def test_loss_at_tokens_takes_the_last_fifth():
    run = _run([1] * 5, [5, 4, 3, 2, 1], [100] * 5, 0, 0)
    assert B.loss_at_tokens(run, 500) == 1  # only the step ending at 500 lies in (400, 500]
    assert B.loss_at_tokens(run, 1000) == 1  # past the run's end: its last step
    ten = _run([1] * 10, list(range(10, 0, -1)), [100] * 10, 0, 0)
    assert B.loss_at_tokens(ten, 1000) == pytest.approx(1.5)  # the steps ending at 900 and 1,000: (800, 1000]
    with pytest.raises(ValueError, match="first step"):
        B.loss_at_tokens(run, 50)


def test_summarize_commit_ratios_choice_goals_and_bf16_match():
    rec = _record()
    s = B.summarize_commit(rec["commits"]["c090b69"], warmup=1, last=1)
    up, bf = s["variants"]["upstream"], s["variants"]["course_bf16"]
    assert s["useful_tokens"] == 4000 and up["tokens_per_s"]["median"] == 500
    assert bf["step_speedup"] == {"median": 1.8, "min": 1.6, "max": 2.0}
    assert bf["tokens_speedup"]["min"] == pytest.approx(3.2) and bf["tokens_speedup"]["max"] == pytest.approx(4.0)
    assert s["variants"]["course_fp32"]["step_speedup"]["median"] == 1.0
    assert s["chosen"] == "course_bf16"  # 1.125 s against 1.6 s
    assert (bf["fastest_step_s"], bf["fastest_step_speedup"]) == (1, 2.0)  # round 0's 1 s against upstream's 2 s
    assert s["variants"]["course_bf16_compiled"]["fastest_step_speedup"] == pytest.approx(1.25)
    assert s["goals"] == {"tokens_speedup_2x": True, "step_speedup_1_4x": True, "loss_matched": True}
    match = s["bf16_vs_fp32"]
    assert match["seed_noise"] == 1.0  # fp32's last loss: 1.0 (seed 0), 2.0 (seed 1)
    assert match["variants"]["course_bf16"]["max_abs"] == pytest.approx(0.1)
    assert not match["variants"]["course_bf16_compiled"]["within_noise"]  # 2.0 apart: outside the noise
    # the loss is read where upstream's run ends: 4,000 useful tokens, the course's second step
    assert s["variants"]["course_fp32"]["loss_at_upstream_tokens"]["median"] == 3.0


def test_one_seed_has_no_noise_and_no_match_claim():
    rec = _record()
    entry = rec["commits"]["c090b69"]
    entry["runs"] = {v: runs[:1] for v, runs in entry["runs"].items()}
    s = B.summarize_commit(entry, warmup=1)
    assert s["bf16_vs_fp32"]["seed_noise"] is None
    assert s["goals"]["loss_matched"] is False


def test_render_and_report(tmp_path):
    assert "No comparison" in B.render(None)
    text = B.render(_record())
    for label in B.LABELS.values():
        assert f"| {label}" in text
    assert "native bf16: yes" in text and "(chosen)" in text and "met" in text
    assert "1.80x (1.60–2.00)" in text and "| 1.00 | 2.00x |" in text
    assert "load average" in text
    path = tmp_path / "trial.json"
    path.write_text(json.dumps(_record()))
    table = B.report(path)
    assert table == tmp_path / "trial.md" and table.read_text() == text
    assert (tmp_path / "trial.png").stat().st_size > 0  # a trial leaves the page's files alone


def test_synthetic_jsonl_is_upstreams_format(tmp_path):
    path = tmp_path / "p.jsonl"
    texts = B.synthetic_jsonl(path, n_docs=50, seed=1)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [{"text": t} for t in texts]
    assert len(texts) == 50 and len(set(texts)) > 40
    assert B.synthetic_jsonl(tmp_path / "q.jsonl", n_docs=50, seed=1) == texts  # seeded


def test_checkout_must_be_at_a_pinned_commit(tmp_path):
    with pytest.raises(ValueError, match="not a checkout"):
        B.identify_checkout(tmp_path)
    for rel in B.UPSTREAM_FILES["c090b69"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("edited")
    with pytest.raises(ValueError, match="neither pinned commit.*trainer/train_pretrain.py"):
        B.identify_checkout(tmp_path)


def test_native_bf16_rule():
    assert B.native_bf16(["avx512_bf16"]) and B.native_bf16(["amx_bf16"])
    assert not B.native_bf16(["avx512f", "avx2"])


@pytest.mark.parametrize("record_path", list(B.PAGE_FILES), ids=lambda p: p.name)
def test_the_page_shows_the_table_rendered_from_the_committed_record(record_path):
    table, figure = B.PAGE_FILES[record_path]
    if not record_path.exists() and not table.exists() and record_path != B.RECORD:
        pytest.skip(f"no {record_path.name} recorded")
    page = (B.ROOT / "book" / "performance.md").read_text(encoding="utf-8")
    assert f"../benchmarks/results/{table.name}" in page
    record = json.loads(record_path.read_text()) if record_path.exists() else None
    assert table.read_text(encoding="utf-8") == B.render(record), (
        f"{table.name} is stale: run `python -m benchmarks.bench_upstream_trainer report --record {record_path}`")
    if record:
        assert figure.is_file() and f"../benchmarks/results/figures/{figure.name}" in page
        for commit, entry in record["commits"].items():
            assert entry["upstream_files"] == B.UPSTREAM_FILES[commit]
            runs = entry["runs"]
            assert set(runs) == set(record["settings"]["variants"]) and "upstream" in runs
            for variant, rs in runs.items():
                assert len(rs) == record["settings"]["rounds"]
                for run in rs:
                    assert len(run["step_s"]) == len(run["loss"]) == len(run["useful_tokens"]) == record["settings"]["steps"]
                    assert all(t > 0 for t in run["step_s"])
