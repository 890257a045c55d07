"""The shipped ``sft`` stage (chapter 09): it is a useful assistant on held-out prompts in phrasings
it never saw and ``base`` is not, a re-evaluation of the shipped weights gives the recorded figures,
and (with MINIMIND_FULL=1) its recipe reproduces it. What every stage file records, and that it
loads weights-only: tests/test_shipped_stages.py; the effects over seeds: tests/test_stage_report.py."""

import os

import pytest

from minimind_ref import sft, stages
from minimind_ref.train import TrainConfig

RECIPE_TOLERANCE = 0.15  # greedy whole-answer accuracies of a re-run vs the shipped file (CPU float rounding)
REEVALUATION_TOLERANCE = 0.03  # the same weights on another machine: a borderline greedy token may flip


@pytest.fixture(scope="module")
def reevaluated():
    model, tokenizer = stages.load_stage("sft")
    return stages.evaluate_chat(model, tokenizer, stages.reference_replies(model, tokenizer))


def test_sft_stage_is_a_useful_assistant_and_base_is_not():
    recorded = stages.stage_metadata("sft")["evaluate_chat"]
    assert recorded["sum_accuracy"] >= 0.3 and recorded["refusal_accuracy"] >= 0.6 and recorded["stop_rate"] >= 0.95
    records = stages.load_seed_records()
    for path in records["paths"]:
        base = stages.run_metrics(records, "base", records["seeds"][0], path)
        assert all(base[f"{k}_accuracy"] == 0 for k in ("sum", "story", "identity", "refusal", "double"))


def test_shipped_weights_give_the_recorded_figures(reevaluated):
    recorded = stages.stage_metadata("sft")["evaluate_chat"]
    for k in ("sum_accuracy", "identity_accuracy", "refusal_accuracy", "stop_rate", "preference_accuracy"):
        assert abs(reevaluated[k] - recorded[k]) <= REEVALUATION_TOLERANCE, (k, reevaluated[k], recorded[k])
    assert reevaluated["preference_margin"] == pytest.approx(recorded["preference_margin"], rel=0.02)


def test_the_stage_was_trained_with_minimind3s_template():
    meta = stages.stage_metadata("sft")
    assert meta["sft_settings"] == sft.STAGE_SETTINGS and sft.CHAT_TEMPLATE == "minimind-3"


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MINIMIND_FULL", "0") != "1",
                    reason="re-runs the 1000-step recipe (about 5 minutes on one CPU thread); set MINIMIND_FULL=1")
def test_sft_recipe_reproduces_the_shipped_stage():
    parent, tokenizer = stages.load_stage("base")
    model, extra, _ = sft.build_stage(parent, tokenizer, seed=0)
    got = stages.evaluate_chat(model, tokenizer)
    recorded = stages.stage_metadata("sft")
    assert extra["train_config"] == TrainConfig.from_dict(recorded["train_config"]).to_dict()
    for k in ("sum_accuracy", "stop_rate", "identity_accuracy", "refusal_accuracy"):
        assert abs(got[k] - recorded["evaluate_chat"][k]) <= RECIPE_TOLERANCE, (k, got[k], recorded["evaluate_chat"][k])
    assert abs(extra["metrics"]["final_val_loss"] - recorded["metrics"]["final_val_loss"]) < 0.05
