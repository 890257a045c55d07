"""The Performance page's table is generated from the measured results, never typed by hand."""

import json
from pathlib import Path

import pytest

from benchmarks import report
from benchmarks.bench_moe import SyncCounter

import minimind_ref as mm
import torch

RESULTS = Path(report.__file__).parent / "results"


@pytest.mark.skipif(not (RESULTS / "results.json").exists(), reason="no benchmark results yet (run make bench)")
def test_performance_table_is_generated_from_results():
    res = json.loads((RESULTS / "results.json").read_text())
    assert (RESULTS / "performance_table.md").read_text() == report.render(res), (
        "benchmarks/results/performance_table.md is stale: run `python -m benchmarks.report`"
    )


def test_render_covers_every_section():
    fake = {
        "environment": {"device_name": "CPU X", "device": "cpu", "torch_threads": 2, "torch": "2.13.0",
                        "transformers": "4.57.6", "python": "3.11"},
        "date": "2026-01-01",
        "decode": [{"new_tokens": 128, "cached_tok_s": 100.0, "uncached_tok_s": 10.0, "speedup": 10.0}],
        "hf": {"prefill_max_abs_diff": 1e-6, "prefill": {"tokens": 512, "ours_ms": 10, "hf_ms": 12, "speedup": 1.2},
               "decode": [{"batch": 1, "prompt_tokens": 16, "new_tokens": 64, "ours_tok_s": 1, "hf_tok_s": 1, "speedup": 1.0, "identical_tokens": True}]},
        "moe": {"tokens": 1024, "dispatch_ms": 1, "training_path_ms": 2, "dense_equal_active_ms": 1,
                "dispatch_vs_training": 2, "dispatch_vs_dense": 1, "host_syncs_per_layer": 1},
        "norm": [{"module": "m", "forward_ms": 1, "fwd_bwd_ms": 2, "forward_speed_vs_ours": 1, "fwd_bwd_speed_vs_ours": 1}],
        "efficiency": {"context": 512, "tok_s": 100, "bytes_per_token": 1e8, "achieved_GBps": 10, "memcpy_GBps": 20,
                       "fraction_of_memcpy": 0.5},
        "notebooks": [{"notebook": "01_x.ipynb", "seconds": 10.0, "passed": True}],
    }
    text = report.render(fake)
    for heading in ("### 1.", "### 2.", "### 3.", "### 4.", "### 5.", "### 6."):
        assert heading in text
    assert "10.0x" in text and "CPU X" in text


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
