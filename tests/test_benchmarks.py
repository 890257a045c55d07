"""The benchmark harness and the Performance page's report: tables and figures are generated from
the measured results, never typed by hand; timings are interleaved medians with their range."""

import json
import struct
from pathlib import Path

import pytest
import torch

import minimind_ref as mm
from benchmarks import common, figures, report
from benchmarks.bench_decode import loglog_slope
from benchmarks.bench_moe import SyncCounter

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(report.__file__).parent / "results"


def stats(median: float, low: float = None, high: float = None, unstable: bool = False) -> dict:
    low = median * 0.98 if low is None else low
    high = median * 1.02 if high is None else high
    return {"median_s": median, "min_s": low, "max_s": high, "repeats": 5, "spread": (high - low) / median,
            "times_s": [low, median, median, median, high], "unstable": unstable}


def r(median: float, low: float = None, high: float = None) -> dict:
    return {"median": median, "min": median * 0.95 if low is None else low, "max": median * 1.05 if high is None else high,
            "spread": 0.1}


def fake_results() -> dict:
    rows = [{"new_tokens": n, "cached": stats(n / 100), "uncached": stats(n * n / 2000), "cached_tok_s": 100.0,
             "uncached_tok_s": 2000 / n, "speedup": r(n / 20)} for n in (32, 64, 128, 256, 512)]
    return {
        "environment": {"device_name": "CPU X", "device": "cpu", "torch_threads": 2, "torch": "2.13.0",
                        "transformers": "4.57.6", "python": "3.11"},
        "date": "2026-01-01",
        "decode": {"prompt_tokens": 8, "rows": rows, "growth_cached": 1.0, "growth_uncached": 2.0},
        "hf": {"prefill_max_abs_diff": 1e-6,
               "prefill": {"tokens": 512, "ours": stats(0.1), "hf": stats(0.12), "ours_ms": 100, "hf_ms": 120, "speedup": r(1.2)},
               "decode": [{"batch": b, "prompt_tokens": p, "new_tokens": 64, "ours": stats(1), "hf": stats(1.3),
                           "ours_tok_s": 64, "hf_tok_s": 50, "speedup": r(1.3 if b == 1 else 1.1), "identical_tokens": True}
                          for p in (16, 512) for b in (1, 8)]},
        "fast": {"prompt_tokens": 16, "new_tokens": 128, "times": {}, "first_call_s": 30.0, "eager_tok_s": 50,
                 "lean_tok_s": 70, "fast_tok_s": 110, "hf_tok_s": 50, "lean_vs_eager": r(1.4), "vs_eager": r(2.2),
                 "vs_hf": r(2.2), "identical_tokens": True, "bytes_per_token": 1e8, "achieved_GBps": 11.0,
                 "read_GBps": 20.0, "read_fraction": 0.55},
        "compile": {"prompt_tokens": 16, "new_tokens": 32, "first_call_s": 40.0, "times": {}, "eager_tok_s": 50,
                    "compiled_tok_s": 55, "compiled_vs_eager": r(1.1), "identical_tokens": True},
        "threads": {"threads": [1, 2], "times": {}, "decode_tok_s": {"1": 40.0, "2": 50.0}, "decode_gain": r(1.25),
                    "prefill_gain": r(1.8), "new_tokens": 64},
        "moe": {"tokens": 1024, "times": {"dispatch": stats(0.2, 0.1, 0.3, unstable=True), "training_path": stats(0.25),
                                          "dense": stats(0.19)},
                "dispatch_ms": 200, "training_path_ms": 250, "dense_equal_active_ms": 190,
                "dispatch_vs_training": r(1.25), "dispatch_vs_dense": r(1.05), "host_syncs_per_layer": 1},
        "norm": [{"module": "m", "forward": stats(0.001), "fwd_bwd": stats(0.002), "forward_ms": 1, "fwd_bwd_ms": 2,
                  "forward_speed_vs_ours": 1, "fwd_bwd_speed_vs_ours": 1}],
        "efficiency": {"context": 512, "steps": 64, "time": stats(1.0), "tok_s": 100, "bytes_per_token": 1e8,
                       "achieved_GBps": 10, "memcpy_GBps": 20, "read_GBps": 22, "matvec_GBps": 12, "matvec_t_GBps": 14,
                       "fraction_of_memcpy": 0.5, "fraction_of_read": 0.45,
                       "profile": [{"op": "aten::mm", "share": 0.8, "calls_per_step": 40}]},
        "posttrain": {"torch_threads": 1, "stages": {s: {"stage": s, "batch_size": 4, "tokens_per_step": 1000, "step_s": stats(0.5),
                                     "tokens_per_s": 2000.0, **({"sampling_s": 0.2, "sampling_share": 0.4} if s == "grpo" else {})}
                                 for s in ("sft", "dpo", "grpo")}},
        "notebooks": {"machine": "CPU X", "date": "2026-01-01", "rows": [{"notebook": "01_x", "seconds": 10.0}]},
        "generations": fake_generations(),
    }


def fake_generations() -> dict:
    from benchmarks.bench_generations import kv_cache_table

    decode_rows = [{"model": name, "generation": gen, "hidden_size": h, "layers": layers, "kv_heads": kv, "head_dim": 64,
                    "intermediate_size": 1408, "parameters": 25e6, "time": stats(1.0), "tok_s": 128.0,
                    "kv_bytes_per_token_fp32": 8192, "measured_kv_bytes_per_token": 8192.0, "generated_tokens": 128}
                   for name, gen, h, layers, kv in (("MiniMind2-Small", "MiniMind2", 512, 8, 2),
                                                    ("minimind-3 at 512 x 8", "minimind-3", 512, 8, 4))]
    return {"torch_threads": 1, "kv_cache": kv_cache_table(),
            "decode": {"prompt_tokens": 8, "new_tokens": 128, "rows": decode_rows,
                       "speed_ratios": {"same size (512 x 8)": r(0.9)}},
            "cache_cost": {"models": ["8:2 (MiniMind2-Small)", "8:4 (same, 4 KV heads)"], "steps": 32,
                           "parameters": {"8:2 (MiniMind2-Small)": 25_829_888, "8:4 (same, 4 KV heads)": 26_354_176},
                           "rows": [{"context": 2048, "ms_per_step": {"8:2 (MiniMind2-Small)": 10.0, "8:4 (same, 4 KV heads)": 12.0},
                                     "times": {"8:2 (MiniMind2-Small)": stats(0.32), "8:4 (same, 4 KV heads)": stats(0.38, unstable=True)},
                                     "cache_mb": {"8:2 (MiniMind2-Small)": 16.8, "8:4 (same, 4 KV heads)": 33.6},
                                     "slowdown": r(1.2)}]}}


# --- the harness ---------------------------------------------------------------------------------

class FakeClock:
    """Each call to a timed function advances the clock by the next duration of that function."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_interleaved_rotates_the_order_and_takes_medians():
    clock = FakeClock()
    order = []
    durations = {"a": iter([9.0, 1.0, 2.0, 3.0, 4.0, 5.0]), "b": iter([9.0, 10.0, 30.0, 20.0, 40.0, 50.0])}

    def make(name):
        def fn():
            order.append(name)
            clock.now += next(durations[name])
        return fn

    out = common.interleaved({"a": make("a"), "b": make("b")}, repeats=5, warmup=1, clock=clock, retry=False)
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]  # warm-up, then rotating
    assert out["a"]["times_s"] == [1.0, 2.0, 3.0, 4.0, 5.0] and out["a"]["median_s"] == 3.0
    assert out["b"]["median_s"] == 30.0 and out["b"]["min_s"] == 10.0 and out["b"]["max_s"] == 50.0
    assert out["a"]["unstable"] and out["a"]["spread"] == pytest.approx(4 / 3)
    paired = common.ratio(out["b"], out["a"])  # 10/1, 30/2, 20/3, 40/4, 50/5
    assert paired["median"] == 10.0 and paired["min"] == pytest.approx(20 / 3) and paired["max"] == 15.0
    with pytest.raises(ValueError, match="at least 5"):
        common.interleaved({"a": make("a")}, repeats=3)


def test_a_wide_spread_is_measured_again_then_flagged():
    clock = FakeClock()
    noisy = iter([1.0] + [1.0, 2.0, 1.0, 1.0, 1.0] + [1.0] * 10)  # warm-up, a noisy set, then a calm one

    def fn():
        clock.now += next(noisy)

    out = common.interleaved({"x": fn}, repeats=5, clock=clock)["x"]
    assert out["remeasured"] and out["repeats"] == 10 and not out["unstable"]
    steady = iter([1.0] * 6)

    def calm():
        clock.now += next(steady)

    assert "remeasured" not in common.interleaved({"x": calm}, repeats=5, clock=clock)["x"]


def test_loglog_slope_tells_linear_from_quadratic():
    ns = [32, 64, 128, 256, 512]
    assert loglog_slope(ns, [3.0 * n for n in ns]) == pytest.approx(1.0)
    assert loglog_slope(ns, [0.5 * n * n for n in ns]) == pytest.approx(2.0)


# --- the report ----------------------------------------------------------------------------------

def test_render_covers_every_section_with_ranges_and_flags():
    text = report.render(fake_results())
    for heading in ("### Targets", "### 1.", "### 2.", "### 3.", "### 3b.", "### 3c.", "### 4.", "### 5.", "### 6.", "### 7.", "### 8.",
                    "### 9."):
        assert heading in text, heading
    assert "CPU X" in text and "n^1.00" in text and "n^2.00" in text
    assert "200.00 (100.00–300.00) (unstable)" in text  # the flagged MoE timing, with its range
    assert "1.20x (1.14–1.26)" in text  # a ratio: median (min–max) of the per-run ratios
    assert "| grpo | 4 | 1,000 |" in text and "40%" in text


def test_targets_name_the_worst_setting_and_say_met_or_not():
    res = fake_results()
    found = {t["key"]: t for t in report.targets(res)}
    assert set(found) == {key for key, *_ in report.TARGETS}
    assert found["cache_512"]["met"] and found["cache_512"]["measured"]["median"] == pytest.approx(512 / 20)
    assert not found["hf_decode"]["met"] and "batch 8" in found["hf_decode"]["where"]  # 1.1 < 1.2
    assert found["hf_prefill"]["met"] and found["moe_vs_dense"]["met"] and found["moe_vs_training"]["met"]
    assert found["fast_vs_hf"]["met"] and found["fast_bandwidth"]["met"]
    res["moe"]["dispatch_vs_dense"] = r(1.3)
    assert not next(t for t in report.targets(res) if t["key"] == "moe_vs_dense")["met"]
    del res["fast"]
    missing = next(t for t in report.targets(res) if t["key"] == "fast_vs_hf")
    assert missing["met"] is None and "not measured" in report.render(res)


def png_size(path: Path) -> tuple:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_every_figure_is_drawn_from_results(tmp_path):
    written = figures.write_all(fake_results(), tmp_path)
    assert sorted(p.name for p in written) == sorted(figures.FIGURES)
    for path in written:
        width, height = png_size(path)
        assert width > 500 and height > 250 and path.stat().st_size > 10_000


# --- what is committed ---------------------------------------------------------------------------

@pytest.mark.skipif(not (RESULTS / "results.json").exists(), reason="no benchmark results yet (run make bench)")
def test_committed_table_and_figures_come_from_the_committed_results(tmp_path):
    res = json.loads((RESULTS / "results.json").read_text())
    assert (RESULTS / "performance_table.md").read_text() == report.render(res), (
        "benchmarks/results/performance_table.md is stale: run `python -m benchmarks.report`")
    page = (ROOT / "book" / "performance.md").read_text(encoding="utf-8")
    redrawn = {p.name: p for p in figures.write_all(res, tmp_path)}
    for name in figures.FIGURES:
        committed = report.FIGURES / name
        assert committed.is_file(), f"{committed} is missing: run `python -m benchmarks.report`"
        assert f"../benchmarks/results/figures/{name}" in page, f"book/performance.md does not show {name}"
        assert png_size(committed) == png_size(redrawn[name]), f"{name} was not drawn from results.json"
    for section, _ in [("decode", 0), ("hf", 0), ("moe", 0), ("efficiency", 0)]:
        assert section in res, f"results.json has no {section} section"
    timings = [s for s in _all_timings(res)]
    assert timings and all(s["repeats"] >= common.MIN_REPEATS for s in timings)


def _all_timings(node):
    if isinstance(node, dict):
        if "median_s" in node and "times_s" in node:
            yield node
        for value in node.values():
            yield from _all_timings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _all_timings(value)


def test_sync_counter_counts_the_dispatch_sync():
    torch.manual_seed(0)
    cfg = mm.MiniMindConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, vocab_size=50, use_moe=True)
    moe = mm.MOEFeedForward(cfg).eval()
    with SyncCounter() as c, torch.inference_mode():
        moe(torch.randn(1, 6, 32))
    assert c.count == 1
    with SyncCounter() as c:
        torch.ones(2).tolist(); bool(torch.ones(()))
    assert c.count == 2


def test_generations_section_states_the_published_caches():
    """Section 9: the KV cache per token of every published config, computed from the config (minimind-3's
    8:4 GQA holds twice MiniMind2's cache per layer at 768 wide), and the decode and cache-cost tables."""
    from benchmarks.bench_generations import kv_bytes_per_token_per_layer, kv_cache_table

    rows = {row["model"]: row for row in kv_cache_table()}
    assert rows["minimind-3"]["per_layer_fp32"] == 2 * rows["MiniMind2"]["per_layer_fp32"] == 3072
    assert rows["minimind-3"]["per_token_fp32"] == rows["MiniMind2"]["per_token_fp32"]  # 8 layers vs 16
    assert rows["MiniMind2-Small"]["per_token_bf16"] == 8 * 2 * 2 * 64 * 2
    assert kv_bytes_per_token_per_layer(mm.preset("minimind-3-moe"), 2) == 2 * 4 * 96 * 2
    text = report.render(fake_results())
    assert "| minimind-3 | minimind-3 | 8 | 8 : 4 | 96 | 3,072 | 24.0 | 12.0 | 384 |" in text
    assert "relative to MiniMind2's, same size (512 x 8): 0.90x (0.85–0.95)" in text
    assert "| 2,048 | 16.8 | 33.6 | 10.00 | 12.00 (unstable) | 1.20x (1.14–1.26) |" in text


def test_measured_cache_matches_the_formula():
    from benchmarks.bench_generations import kv_bytes_per_token_per_layer, measured_cache_bytes_per_token

    torch.manual_seed(0)
    for config in (mm.MiniMindConfig(hidden_size=64, num_hidden_layers=2, num_key_value_heads=2, vocab_size=50),
                   mm.MiniMindConfig(generation="minimind-3", hidden_size=64, num_hidden_layers=2, head_dim=12,
                                     vocab_size=50)):
        model = mm.MiniMindForCausalLM(config).eval()
        expected = config.num_hidden_layers * kv_bytes_per_token_per_layer(config, 4)
        assert measured_cache_bytes_per_token(model, torch.device("cpu"), tokens=5) == expected


def test_a_merged_run_keeps_the_earlier_environment():
    from benchmarks.run import note_run

    earlier = {"environment": {"device_name": "old"}, "date": "2026-01-01", "decode": {}, "hf": {}}
    later = {"environment": {"device_name": "new"}, "date": "2026-02-02"}
    note_run(earlier, {"generations"}, later)
    assert earlier["environment"] == {"device_name": "old"} and earlier["separate_runs"] == {"generations": later}
    fresh = {"decode": {}}
    note_run(fresh, {"decode"}, later)  # nothing kept from before: this run is the run
    assert fresh["environment"] == {"device_name": "new"} and "separate_runs" not in fresh
    res = fake_results()
    res["separate_runs"] = {"generations": {"environment": {"device_name": "CPU Y", "device": "cpu", "torch": "2.13.0"},
                                            "date": "2026-02-02"}}
    text = report.render(res)
    assert "except the sections measured separately" in text and "Section `generations` was measured separately" in text
    assert "**CPU Y**" in text


# --- the device check's record and the Performance page's GPU table ------------------------------

def fake_gpu_bench() -> dict:
    from benchmarks.gpu_check import DECODE_RUNS

    paths = {"generate": {"tok_s": 150.0, "fraction_of_bound": 0.005, "identical_tokens": True, "vs_hf": 1.5,
                          "time": stats(1.0), "first_call_s": 1.0},
             "graph": {"tok_s": 3000.0, "fraction_of_bound": 0.1, "identical_tokens": False, "agreeing_new_tokens": 0.5,
                       "vs_hf": 30.0, "time": stats(0.05), "first_call_s": 2.0, "path_ran": "cuda graph"},
             "hf": {"tok_s": 100.0, "fraction_of_bound": 0.003, "identical_tokens": True, "vs_hf": 1.0,
                    "time": stats(1.5), "first_call_s": 1.0}}
    return {"dry_run": False, "tiny": False, "date": "2026-12-01", "errors": [],
            "environment": {"python": "3.12.3", "torch": "2.11.0+cu130", "transformers": "5.17.0", "tokenizers": "0.23.2",
                            "device_name": "NVIDIA H100 80GB HBM3", "cuda": "13.0"},
            "bandwidth": {"read_GBps": 3000.0, "copy_GBps": 2800.0, "mbytes": 1024},
            "decode": [{"run": DECODE_RUNS[0][0], "paths": paths, "skipped": {"upstream": "FileNotFoundError: no file"}}],
            "train": {"batch": 16, "seq_len": 512, "peak_bf16_tflops": 989.5, "skipped": {},
                      "variants": {"ours": {"losses": [8.8, 8.7, 8.6], "tokens_per_s": 1e6, "mfu": 0.39, "vs_upstream": 1.6},
                                   "upstream": {"losses": [8.8, 8.7, 8.6], "tokens_per_s": 6.25e5, "mfu": 0.24,
                                                "vs_upstream": 1.0}}}}


def test_gpu_table_without_a_record_says_nothing_was_measured():
    from benchmarks.gpu_check import render

    for record in (None, {**fake_gpu_bench(), "dry_run": True}):
        text = render(record)
        assert "No GPU figures have been measured yet" in text and "make gpu-check" in text
        assert "tokens/s" not in text


def test_gpu_table_from_a_record_names_device_versions_date_and_what_is_missing():
    from benchmarks.gpu_check import not_measured, render

    record = fake_gpu_bench()
    record["not_measured"] = not_measured(record)
    text = render(record)
    for piece in ("NVIDIA H100 80GB HBM3", "2026-12-01", "torch 2.11.0+cu130", "transformers 5.17.0", "3,000 GB/s",
                  "| minimind-3 bf16, batch 1 | `GraphDecoder` (CUDA graph) | 3,000 | 10.0% | 30.00x | no (50% of new tokens) |",
                  "| ours | 1,000,000 | 39.0% | 1.60x | 8.8000, 8.7000, 8.6000 |", "upstream (FileNotFoundError: no file)",
                  "minimind-3 bf16, batch 32: not run (the time budget ran out first)", "training step"):
        assert piece in text, piece
    assert not any("training step" in m for m in record["not_measured"])


def test_summarize_joins_bench_pytest_and_cpu_timings(tmp_path):
    from benchmarks.gpu_check import summarize

    (tmp_path / "bench.json").write_text(json.dumps(fake_gpu_bench()))
    (tmp_path / "passes.json").write_text(json.dumps([
        {"name": "installed", "status": 1, "junit": "junit-installed.xml"},
        {"name": "transformers4", "status": "not run", "reason": "10s left", "junit": "junit-transformers4.xml"}]))
    (tmp_path / "junit-installed.xml").write_text(
        '<testsuites><testsuite>'
        '<testcase classname="tests.test_gpu" name="test_chapter_runs_on_cuda[06_kv_cache.ipynb]" time="12.5">'
        '<properties><property name="cuda_seconds" value="11.0"/></properties></testcase>'
        '<testcase classname="tests.test_gpu" name="test_chapter_runs_on_cuda[08_training.ipynb]" time="180">'
        '<failure message="Failed: Timeout &gt;180.0s">...</failure></testcase>'
        '<testcase classname="tests.test_gpu" name="test_two_nccl_processes_match_one_gpu" time="0">'
        '<skipped message="DDP over nccl needs 2 or more GPUs"/></testcase>'
        '</testsuite></testsuites>')
    record = summarize(tmp_path)
    assert json.loads((tmp_path / "gpu_record.json").read_text()) == record
    installed = record["suite"][0]
    assert installed["counts"] == {"passed": 1, "failed": 1, "error": 0, "skipped": 1}
    assert "Timeout" in installed["tests"][1]["message"]
    rows = {r["chapter"]: r for r in record["chapters"]["rows"]}
    cpu = json.loads((ROOT / "book" / "notebook_timings.json").read_text())["seconds"]
    assert rows["06_kv_cache"]["cuda_s"] == 11.0 and rows["06_kv_cache"]["cuda_over_cpu"] == pytest.approx(11.0 / cpu["06_kv_cache"])
    assert rows["08_training"]["outcome"] == "failed" and rows["08_training"]["cuda_s"] is None
    assert rows["01_normalization"]["outcome"] == "not run"
    assert any("transformers4: not run (10s left)" in m for m in record["not_measured"])


def test_peak_table_and_mfu():
    from benchmarks.gpu_check import mfu, peak_bf16_tflops

    assert peak_bf16_tflops("NVIDIA H100 80GB HBM3") == peak_bf16_tflops("NVIDIA H200") == 989.5
    assert peak_bf16_tflops("NVIDIA H100 PCIe") == 756.5 and peak_bf16_tflops("NVIDIA H100 NVL") == 835.5
    assert peak_bf16_tflops("NVIDIA A100-SXM4-80GB") == 312.0 and peak_bf16_tflops("NVIDIA L4") == 121.0
    assert peak_bf16_tflops("NVIDIA L40S") == 362.05 and peak_bf16_tflops("NVIDIA A10G") is None
    assert peak_bf16_tflops("Tesla T4") is None and mfu(10, 1.0, None) is None
    assert mfu(64_000_000, 1e6, 989.5) == pytest.approx(6 * 64e6 * 1e6 / 989.5e12)


def test_committed_gpu_table_comes_from_the_committed_record():
    from benchmarks.gpu_check import RECORD, TABLE, render

    record = json.loads(RECORD.read_text()) if RECORD.exists() else None
    assert TABLE.read_text(encoding="utf-8") == render(record), (
        "benchmarks/results/gpu_table.md is stale: run `python -m benchmarks.gpu_check report`")
    page = (ROOT / "book" / "performance.md").read_text(encoding="utf-8")
    assert "../benchmarks/results/gpu_table.md" in page
    if record is not None:  # a committed record is a GPU run's, never a dry run's
        assert record["dry_run"] is False and record["environment"]["device_name"]


def test_gpu_benchmarks_dry_run_on_the_cpu():
    """The device check's benchmarks on tiny models without CUDA: the CPU fallbacks give generate's
    tokens, what needs a GPU (or minutes of compilation) is listed as skipped, the losses agree."""
    from benchmarks.gpu_check import DECODE_RUNS, decode_ladder, training

    cpu = torch.device("cpu")
    rows = []
    decode_ladder(cpu, 1e10, None, True, lambda: None, rows, [DECODE_RUNS[0], DECODE_RUNS[3]])
    first, compiled = rows
    assert {"generate", "static_eager", "graph"} <= set(first["paths"]) and "upstream" in first["skipped"]
    assert first["paths"]["graph"]["path_ran"] == "eager"  # no CUDA: the eager fallback
    assert all(e["identical_tokens"] for e in first["paths"].values())
    assert set(compiled["skipped"]) == {"fast_compiled", "graph_compiled"}
    train = training(cpu, None, tiny=True, peak=None)
    assert set(train["variants"]) == {"ours"} and set(train["skipped"]) == {"ours_compiled", "upstream"}
    assert train["losses_agree"] and train["variants"]["ours"]["tokens_per_s"] > 0


def test_gpu_check_script_is_valid_bash_with_the_promised_flags():
    import subprocess

    script = ROOT / "tools" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    for flag in ("-m gpu", "-v", "--timeout", "--durations=0", "--junitxml", "gpu_check.log", "summarize"):
        assert flag in text, flag


def test_summarize_keeps_what_a_stopped_pass_finished(tmp_path):
    """A pass stopped by the time budget writes no junit file: the outcomes come from its -v lines in the
    log, and the chapters it finished from chapters.jsonl (written as each chapter ends)."""
    from benchmarks.gpu_check import summarize

    (tmp_path / "bench.json").write_text(json.dumps(fake_gpu_bench()))
    (tmp_path / "passes.json").write_text(json.dumps([{"name": "installed", "status": 137, "junit": "junit-installed.xml"}]))
    (tmp_path / "gpu_check.log").write_text(
        "== 3. GPU suite\n   pass installed (transformers, tokenizers: 5.17.0 0.23.2), 200s\n"
        "[gw0] [ 10%] PASSED tests/test_gpu.py::test_chapter_runs_on_cuda[02_rope.ipynb] \n"
        "[gw1] [ 20%] FAILED tests/test_gpu.py::test_fp32_training_on_cuda_equals_cpu \n"
        "!!! KeyboardInterrupt !!!\n== 4. GPU suite, transformers 4.57.6\n")
    (tmp_path / "chapters.jsonl").write_text(json.dumps({"chapter": "02_rope", "outcome": "passed", "cuda_seconds": 9.5,
                                                         "pass": "installed"}) + "\n")
    record = summarize(tmp_path)
    suite = record["suite"][0]
    assert suite["counts"] == {"passed": 1, "failed": 1, "error": 0, "skipped": 0} and suite["results_from"].startswith("log")
    rows = {r["chapter"]: r for r in record["chapters"]["rows"]}
    assert rows["02_rope"]["cuda_s"] == 9.5 and rows["02_rope"]["outcome"] == "passed"
    assert rows["03_attention"]["outcome"] == "not run"
