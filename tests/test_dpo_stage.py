"""The shipped ``dpo`` stage (chapter 11; what every stage file records: tests/test_shipped_stages.py;
its effects over seeds: tests/test_stage_report.py): its recorded metrics are consistent with each
other and with a re-measurement of the shipped weights, and (with MINIMIND_FULL=1) its recipe
reproduces it."""

import math
import os

import pytest

from minimind_ref import dpo, stages
from minimind_ref.train import TrainConfig


def test_recorded_metrics_are_consistent():
    meta = stages.stage_metadata("dpo")
    m, s = meta["metrics"], meta["dpo_settings"]
    assert s == dpo.STAGE_SETTINGS and s["reduction"] == "sum" and s["beta"] == 0.15
    # the mean margin is beta times the difference of the mean changes (means are linear)
    assert m["heldout_margin"] == pytest.approx(s["beta"] * (m["heldout_chosen_change"] - m["heldout_rejected_change"]),
                                                abs=1e-5)
    assert 0.7 <= m["heldout_reward_accuracy"] <= 1.0 and m["heldout_margin"] > 0
    assert m["heldout_rejected_change"] < m["heldout_chosen_change"]
    assert 0 <= m["heldout_mean_kl"] < 0.1  # a modest drift from the sft reference
    assert m["final_train_loss_mean20"] < math.log(2)
    assert m["own_pairs"] > 0 and m["train_pairs"] == s["n_train"] + m["own_pairs"]
    ev, parent = meta["evaluate_chat"], stages.stage_metadata("sft")["evaluate_chat"]
    assert ev["stop_rate"] >= 0.9 and ev["refusal_accuracy"] >= parent["refusal_accuracy"] - 0.1


def test_shipped_weights_reproduce_the_recorded_preference_metrics():
    """Re-measured on the shipped (fp16-stored) weights against the shipped sft reference."""
    meta = stages.stage_metadata("dpo")
    s = meta["dpo_settings"]
    policy, tok = stages.load_stage("dpo")
    reference, _ = stages.load_stage("sft")
    data = dpo.dpo_data(tok, n_train=0, n_val=s["n_val"], seed=0, max_length=meta["train_config"]["seq_len"],
                        empty_think_ratio=s["empty_think_ratio"])
    report = dpo.preference_report(policy, reference, data.val, s["beta"], s["reduction"])
    m = meta["metrics"]
    assert abs(report["reward_accuracy"] - m["heldout_reward_accuracy"]) <= 0.05
    assert report["rejected_change"] == pytest.approx(m["heldout_rejected_change"], rel=0.1)
    assert report["margin"] == pytest.approx(m["heldout_margin"], rel=0.1)


def test_own_reply_pairs_reject_what_the_model_said():
    model, tok = stages.load_stage("sft")
    pairs = dpo.own_reply_pairs(model, tok, 30, seed=3)
    assert pairs and all(p["chosen"][:-1] == p["rejected"][:-1] for p in pairs)
    assert all(p["chosen"][-1]["content"] != p["rejected"][-1]["content"] for p in pairs)
    assert all(p["kind"].startswith("own_") for p in pairs)
    assert pairs == dpo.own_reply_pairs(model, tok, 30, seed=3)  # seeded


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MINIMIND_FULL", "0") != "1",
                    reason="re-runs the recipe (about a minute on one CPU thread)")
def test_dpo_recipe_reproduces_the_shipped_stage():
    parent, tokenizer = stages.load_stage("sft")
    model, extra, _ = dpo.build_stage(parent, tokenizer, seed=0)
    recorded = stages.stage_metadata("dpo")
    assert extra["train_config"] == TrainConfig.from_dict(recorded["train_config"]).to_dict() and extra["dpo_settings"] == recorded["dpo_settings"]
    assert abs(extra["metrics"]["heldout_reward_accuracy"] - recorded["metrics"]["heldout_reward_accuracy"]) <= 0.1
    assert extra["metrics"]["heldout_rejected_change"] == pytest.approx(recorded["metrics"]["heldout_rejected_change"], rel=0.3)
