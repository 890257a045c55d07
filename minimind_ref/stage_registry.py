"""The shipped stages' registry: which stages exist (``STAGES``), each one's file, parent
stage, chapter and description (``STAGE_INFO``), the stages the seeded rebuild trains
(``SEEDED_STAGES``) and the record's seeds and float paths (``DEFAULT_SEEDS``,
``FLOAT_PATHS``), the recipe that makes each (``RECIPES``, ``"module:function"`` strings
imported at run time) and where the files live (``CHECKPOINT_DIR``, ``TOKENIZER_FILE``,
``SEEDS_FILE``). Data only: loading, saving and rebuilding the files is ``stages``', which
re-exports every name here; the report over seeds (``stage_report``) reads the stages' order
and parents from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

CHECKPOINT_DIR = Path(__file__).with_name("checkpoints")
TOKENIZER_FILE = CHECKPOINT_DIR / "tokenizer.json"
STAGES = ("base", "sft", "lora", "dpo", "grpo")
SEEDS_FILE = CHECKPOINT_DIR / "stage_seeds.json"
SEEDED_STAGES = ("sft", "lora", "dpo", "grpo")
RECORD_VERSION = 2  # 2: every run under every float path (stages -> seed -> path); 1 had one path
#: The float paths the record holds: ``native`` (the CPU's own SIMD kernels, ATEN_CPU_CAPABILITY
#: unset) and ``default`` (``ATEN_CPU_CAPABILITY=default``: no AVX2/AVX-512 kernels). ``avx2`` and
#: ``avx512`` may be named too (a CPU that has them). The variable must be set before torch is
#: imported, so every path runs in a process of its own.
FLOAT_PATHS = ("native", "default")
KNOWN_PATHS = ("native", "default", "avx2", "avx512")
CAPABILITY_ENV = "ATEN_CPU_CAPABILITY"
DEFAULT_SEEDS = (0, 1, 2, 3, 4)


@dataclass
class Stage:
    """How a stage's model is made and loaded."""

    name: str
    file: str
    parent: Optional[str]
    chapter: str
    description: str


STAGE_INFO: Dict[str, Stage] = {
    "base": Stage("base", "base.pt", None, "08", "chapter 08's pretraining run (config ch08_cpu)"),
    "sft": Stage("sft", "sft.pt", "base", "09", "supervised fine-tuning on generated conversations"),
    "lora": Stage("lora", "lora.pt", "sft", "10", "the SFT model with a LoRA adapter merged in"),
    "dpo": Stage("dpo", "dpo.pt", "sft", "11", "DPO on generated preference pairs"),
    "grpo": Stage("grpo", "grpo.pt", "sft", "12", "GRPO with a verifiable reward (sums)"),
}


# Each stage's recipe: "module:function" taking (parent model or None, tokenizer or None) and
# returning (model, extra, tokenizer). The recipe lives with the stage's chapter code.
RECIPES: Dict[str, str] = {
    "base": "minimind_ref.stages:build_base",
    "sft": "minimind_ref.sft:build_stage",
    "lora": "minimind_ref.lora:build_stage",
    "dpo": "minimind_ref.dpo:build_stage",
    "grpo": "minimind_ref.grpo:build_stage",
}
