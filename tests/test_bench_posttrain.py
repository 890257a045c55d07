"""The post-training step benchmark (benchmarks/bench_posttrain.py) measures what it says: three
stages, finite positive times, a sampling share strictly between 0 and 1, tokens/s consistent
with its own parts, and the GRPO sampler put back afterwards. No timing value is asserted."""

import math

import pytest
import torch

from benchmarks import bench_posttrain
from minimind_ref import grpo, stages
from minimind_ref.utils import single_thread


@pytest.mark.slow
def test_posttrain_steps_structure_and_sampler_restored():
    original = grpo.sample_completions
    with single_thread():  # tiny models: one thread is fast and unaffected by other jobs on the machine
        res = bench_posttrain.posttrain_steps(torch.device("cpu"), quick=True)
    # the patched sampler is gone: the module (where GRPOObjective looks it up) has the original again
    assert grpo.sample_completions is original
    assert res["device"] == "cpu" and res["device_name"] and res["repeats"] == bench_posttrain.QUICK_REPEATS
    assert set(res["stages"]) == {"sft", "dpo", "grpo"}
    params = sum(p.numel() for p in stages.load_stage("sft")[0].parameters())
    for name, r in res["stages"].items():
        assert r["stage"] == name and r["parent"] == stages.STAGE_INFO[name].parent
        assert r["params"] == r["trainable_params"] == params  # full fine-tuning of the same architecture
        assert r["batch_size"] >= 1 and r["rows"] >= r["batch_size"]
        s = r["step_s"]
        assert s["repeats"] == bench_posttrain.QUICK_REPEATS
        for key in ("median_s", "min_s", "max_s"):
            assert math.isfinite(s[key]) and s[key] > 0, (name, key, s)
        assert s["min_s"] <= s["median_s"] <= s["max_s"]
        assert len(r["tokens_each_step"]) == s["repeats"]
        totals = sorted(sum(t.values()) for t in r["tokens_each_step"])
        assert r["tokens_per_step"] > 0 and totals[0] <= r["tokens_per_step"] <= totals[-1]
        assert math.isclose(r["tokens_per_s"], r["tokens_per_step"] / s["median_s"], rel_tol=1e-9)
    for t in res["stages"]["sft"]["tokens_each_step"]:
        assert t["reference"] == 0 and t["sampling"] == 0 and t["policy"] > 0
    for t in res["stages"]["dpo"]["tokens_each_step"]:  # the reference reads exactly the policy's batch
        assert t["reference"] == t["policy"] > 0 and t["sampling"] == 0
    g = res["stages"]["grpo"]
    for t in g["tokens_each_step"]:
        assert t["reference"] == t["policy"] > 0 and t["sampling"] > 0
    assert 0 < g["sampling_share"] < 1
    # every step's sampling time is part of its step time, so the medians keep that order
    assert 0 < g["sampling_s"] < g["step_s"]["median_s"]
    assert "sampling_s" not in res["stages"]["sft"] and "sampling_s" not in res["stages"]["dpo"]

    # the sampler is restored after an error inside the block too
    with pytest.raises(RuntimeError, match="boom"):
        with bench_posttrain.timed_sampler(torch.device("cpu")):
            assert grpo.sample_completions is not original
            raise RuntimeError("boom")
    assert grpo.sample_completions is original
