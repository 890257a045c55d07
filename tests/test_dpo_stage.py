"""The shipped ``dpo`` stage (chapter 11; what every stage file records: tests/test_shipped_stages.py):
its recorded metrics are consistent with each other and with a re-measurement of the shipped weights,
and (with MINIMIND_FULL=1) that its recipe reproduces it."""

import math
import os

import pytest

from minimind_ref import dpo, stages


def test_recorded_metrics_are_consistent():
    meta = stages.stage_metadata("dpo")
    m, beta = meta["metrics"], meta["dpo_settings"]["beta"]
    # the mean margin is beta times the difference of the mean changes (means are linear)
    assert m["heldout_margin"] == pytest.approx(beta * (m["heldout_chosen_change"] - m["heldout_rejected_change"]), abs=1e-6)
    assert 0.7 <= m["heldout_reward_accuracy"] <= 1.0 and m["heldout_margin"] > 0
    assert m["heldout_rejected_change"] < m["heldout_chosen_change"] <= 0.01  # the chapter's "chosen falls too"
    assert 0 <= m["heldout_mean_kl"] < 0.1  # a modest drift from the sft reference
    assert m["final_train_loss_mean20"] < math.log(2)
    ev, parent = meta["evaluate_chat"], stages.stage_metadata("sft")["evaluate_chat"]
    assert ev["stop_rate"] >= 0.95 and abs(ev["sum_accuracy"] - parent["sum_accuracy"]) <= 0.1


def test_shipped_weights_reproduce_the_recorded_preference_metrics():
    """Re-measured on the shipped (fp16-stored) weights against the shipped sft reference."""
    meta = stages.stage_metadata("dpo")
    s = meta["dpo_settings"]
    policy, tok = stages.load_stage("dpo")
    reference, _ = stages.load_stage("sft")
    data = dpo.dpo_data(tok, n_train=1, n_val=s["n_val"], seed=s["seed"], max_length=meta["train_config"]["seq_len"])
    report = dpo.preference_report(policy, reference, data.val, s["beta"], s["reduction"])
    m = meta["metrics"]
    assert abs(report["reward_accuracy"] - m["heldout_reward_accuracy"]) <= 0.05
    assert report["rejected_change"] == pytest.approx(m["heldout_rejected_change"], rel=0.1)
    assert report["margin"] == pytest.approx(m["heldout_margin"], rel=0.1)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MINIMIND_FULL", "0") != "1",
                    reason="re-runs the recipe (about half a minute on one CPU thread); the chapter re-runs it too")
def test_dpo_recipe_reproduces_the_shipped_stage():
    parent, tokenizer = stages.load_stage("sft")
    model, extra, _ = dpo.build_stage(parent, tokenizer)
    recorded = stages.stage_metadata("dpo")
    assert extra["train_config"] == recorded["train_config"] and extra["dpo_settings"] == recorded["dpo_settings"]
    assert abs(extra["metrics"]["heldout_reward_accuracy"] - recorded["metrics"]["heldout_reward_accuracy"]) <= 0.1
    assert extra["metrics"]["heldout_rejected_change"] == pytest.approx(recorded["metrics"]["heldout_rejected_change"], rel=0.3)
