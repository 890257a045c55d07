"""The shipped record of the longer post-training runs (minimind_ref/posttrain_experiments.py):
its structure, one entry per run of ``RUNS`` and nothing else, each run's settings equal to the
stage's recipe plus the change it names, the recipe runs agreeing with the shipped stages, and
clear errors for a bad run name. Nothing here trains (a run takes minutes): the record is read."""

from __future__ import annotations

import math

import pytest

from minimind_ref import dpo, grpo, posttrain_experiments as px, stages
from minimind_ref.train import TrainConfig

CONFIGS = {"dpo": dpo.DPO_CONFIG, "grpo": grpo.GRPO_CONFIG}
SETTINGS = {"dpo": dpo.STAGE_SETTINGS, "grpo": grpo.STAGE_SETTINGS}


@pytest.fixture(scope="module")
def record():
    return px.load_record()


def test_record_structure(record):
    assert record["command"] == px.COMMAND
    assert record["torch"].startswith("2.") and record["machine"]
    assert record["parent"]["stage"] == "sft"
    assert record["parent"]["evaluate_chat"] == stages.stage_metadata("sft")["evaluate_chat"]


def test_every_run_is_recorded_and_nothing_else(record):
    assert set(record["runs"]) == set(px.RUNS), (
        f"record and RUNS disagree: missing {sorted(set(px.RUNS) - set(record['runs']))}, "
        f"extra {sorted(set(record['runs']) - set(px.RUNS))}; run `{px.COMMAND} NAME` or trim RUNS")


@pytest.mark.parametrize("name", sorted(px.RUNS))
def test_run_matches_its_spec_and_the_stage_recipe(record, name):
    spec, run = px.RUNS[name], record["runs"][name]
    stage = spec["stage"]
    assert (run["stage"], run["chapter"], run["seed"], run["changes"], run["question"]) == (
        stage, spec["chapter"], spec["seed"], spec["changes"], spec["question"])
    own, cfg_changes = px._split(spec["changes"], SETTINGS[stage])
    assert run["settings"] == {**SETTINGS[stage], **own}, "settings = the stage recipe plus the named change"
    expected_cfg = TrainConfig.from_json(CONFIGS[stage]).replace(progress=False, out_dir=None, seed=spec["seed"],
                                                                 **cfg_changes).to_dict()
    # a record made before an option was added holds no value for it: read back, it has the default
    assert TrainConfig.from_dict(run["train_config"]).to_dict() == expected_cfg
    if "lr" in spec["changes"]:
        assert math.isclose(run["train_config"]["min_lr"], spec["changes"]["lr"] / 10)
    assert run["seconds"] > 0
    after = run["after"]
    assert 0 <= after["sum_accuracy"] <= 1 and after["sum_n"] == 200


@pytest.mark.parametrize("name", sorted(n for n, s in px.RUNS.items() if s["stage"] == "grpo"))
def test_grpo_run_fields(record, name):
    run = record["runs"][name]
    steps = run["train_config"]["max_steps"]
    curve = run["curve"]
    blocks = math.ceil(steps / px.BLOCK)
    for key in ("step", "reward", "kl", "ratio_mean", "ratio_max", "clip_fraction", "zero_std_groups",
                "completion_length"):
        assert len(curve[key]) == blocks, key
    assert curve["step"][-1] == steps - 1  # steps count from 0
    assert len(curve["eval_step"]) == len(curve["eval_accuracy"]) == len(curve["eval_sampled_accuracy"])
    assert curve["eval_accuracy"][-1] == run["heldout"]["after"]["accuracy"]  # the last check is the final model
    assert run["exact_kl"] >= 0 and all(0 <= c <= 1 for c in curve["clip_fraction"])
    if run["settings"]["sync_every"] == 1:  # the policy samples: the ratio is 1, nothing is clipped
        assert max(curve["clip_fraction"]) == 0 and set(curve["ratio_mean"]) == {1.0}
    # every run starts from the same sft model, measured the same way
    assert run["heldout"]["before"] == record["runs"]["grpo_recipe"]["heldout"]["before"]


def test_recipe_runs_repeat_the_shipped_stages(record):
    """The recipe runs start as the shipped stages did (the same data, seed and first steps). The
    GRPO run is not bit-identical to the stage: its curves agree to about 1e-5 over the first steps
    and then drift apart (sampling amplifies float rounding), ending within the 3-seed range."""
    g = record["runs"]["grpo_recipe"]
    meta = stages.stage_metadata("grpo")
    metrics = meta["metrics"]
    assert g["heldout"]["before"]["accuracy"] == metrics["heldout_accuracy_before"]
    assert math.isclose(g["first_reward_mean10"], metrics["first_reward_mean10"], abs_tol=1e-6)
    first_block = sum(meta["history"]["reward"][:px.BLOCK]) / px.BLOCK
    assert math.isclose(g["curve"]["reward"][0], first_block, abs_tol=1e-4)
    seeds = stages.seed_values(stages.load_seed_records(), "grpo", "sum_accuracy")
    assert min(seeds) <= g["after"]["sum_accuracy"] <= max(seeds)
    d, shipped = record["runs"]["dpo_recipe"]["after"], stages.stage_metadata("dpo")["evaluate_chat"]
    assert abs(d["sum_accuracy"] - shipped["sum_accuracy"]) <= 0.01
    assert math.isclose(d["preference_margin"], shipped["preference_margin"], rel_tol=1e-3)


def test_bad_run_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown experiment 'grpo_nope'.*the runs are: .*grpo_recipe"):
        px.run_experiment("grpo_nope")
    with pytest.raises(ValueError, match=r"unknown experiments \['grpo_nope'\]"):
        px.run_experiments(["grpo_nope"], out=None)
    with pytest.raises(ValueError, match="unknown experiments"):
        px.main(["grpo_nope"])


def test_bad_setting_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown settings \['not_a_setting'\]"):
        px._split({"not_a_setting": 1}, grpo.STAGE_SETTINGS)


def test_missing_record_says_how_to_make_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="run `python -m minimind_ref.posttrain_experiments`"):
        px.load_record(tmp_path / "none.json")


@pytest.mark.parametrize("name", ["grpo_recipe", "grpo_no_rehearsal", "grpo_beta_0"])
def test_a_grpo_run_trains_with_every_setting_of_the_recipe(name, monkeypatch):
    """Every key of grpo.STAGE_SETTINGS reaches train_grpo, changed only where the run says (a run once
    dropped the rehearsal silently). Stopped before the first step."""
    seen = {}

    class Stop(Exception):
        pass

    def capture(policy, tok, cfg, **kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(grpo, "train_grpo", capture)
    parent, tok = stages.load_stage("sft")
    with pytest.raises(Stop):
        px._run_grpo(px.RUNS[name], parent, tok, {})
    want = {**grpo.STAGE_SETTINGS, **px.RUNS[name]["changes"]}
    assert {k: seen[k] for k in grpo.STAGE_SETTINGS} == want
