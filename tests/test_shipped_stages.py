"""Every shipped post-training stage (chapters 09-12) loads weights-only and records the recipe that
made it: its parent, the command that rebuilds it, the config file and the stage's settings as they
are now (else: rebuild it), and the held-out evaluation of the stage report. What each stage's
metrics must say is in its own test file (tests/test_<stage>_stage.py)."""

import json

import pytest
import torch

from minimind_ref import dpo, grpo, lora, sft, stages
from minimind_ref.model import MiniMindForCausalLM
from minimind_ref.train import CONFIG_DIR, TrainConfig

# stage: (parent, the recipe's module, its loop config, the key of its own settings in the file or None,
#         whether it records one training loss per step)
RECIPES = {
    "sft": ("base", sft, sft.SFT_CONFIG, "sft_settings", True),
    "lora": ("sft", lora, lora.LORA_CONFIG, "lora_settings", True),
    "dpo": ("sft", dpo, dpo.DPO_CONFIG, "dpo_settings", False),
    "grpo": ("sft", grpo, grpo.GRPO_CONFIG, "grpo_settings", False),
}


@pytest.mark.parametrize("name", list(RECIPES))
def test_shipped_stage_loads_weights_only_and_records_its_recipe(name):
    parent, module, config_name, settings_key, has_loss_history = RECIPES[name]
    blob = torch.load(stages.stage_path(name), map_location="cpu", weights_only=True)
    extra = blob["extra"]
    assert extra["stage"] == name and extra["parent"] == parent == stages.STAGE_INFO[name].parent
    assert extra["command"] == f"python -m minimind_ref.stages rebuild {name}"
    assert extra["seed"] == 0 and extra["seconds"] > 0
    assert extra["recipe"] == stages.RECIPES[name] == f"{module.__name__}:build_stage"
    raw = json.loads((CONFIG_DIR / f"{config_name}.json").read_text())
    cfg = TrainConfig.from_json(config_name)
    assert cfg.max_steps == raw["max_steps"] and cfg.lr == raw["lr"]
    shipped_config = {k: v for k, v in raw.items() if not k.startswith("_")}
    assert all(extra["train_config"][k] == v for k, v in shipped_config.items() if k != "progress"), (
        f"{name}.pt was made with another config than minimind_ref/configs/{config_name}.json: rebuild it")
    if settings_key is not None:
        assert extra[settings_key] == module.STAGE_SETTINGS, f"{name}.pt was made with other STAGE_SETTINGS: rebuild it"
    if has_loss_history:
        assert len(extra["loss_history"]) == cfg.max_steps
    assert set(stages.METRICS) <= set(extra["evaluate_chat"])
    model, _ = stages.load_stage(name)
    assert type(model) is MiniMindForCausalLM and not model.training
    assert next(model.parameters()).dtype == torch.float32
    assert stages.stage_path(name).stat().st_size < 1.5e6
