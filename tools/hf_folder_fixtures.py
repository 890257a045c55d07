"""Folders written by transformers' own ``save_pretrained``, one set per major version (run by hand,
never by the tests).

    .venv/bin/python tools/hf_folder_fixtures.py      # transformers 4.57.x: tests/data/hf_folders/transformers4/
    .venv-t5/bin/python tools/hf_folder_fixtures.py   # transformers 5.x:    tests/data/hf_folders/transformers5/

For each family minimind_ref converts (``llama``: a dense MiniMind2-shaped ``LlamaForCausalLM`` with tied
embeddings; ``qwen3``: a minimind-3-shaped ``Qwen3ForCausalLM``, tied; ``qwen3_moe``: a
``Qwen3MoeForCausalLM`` with minimind-3-moe's router, 4 experts, top-1, renormalized) it builds the
model with transformers' own classes (not with ``minimind_ref.hf``), gives every parameter random values
(norm gains included, rounded to fp16), saves it with ``save_pretrained`` in fp16 (as upstream's converter
saves) and stores transformers' fp32 logits of those values for fixed token ids in ``reference.pt``. ``tests/test_hf_files.py`` loads every folder of both versions with
``minimind_ref.load_hf_dir`` (no transformers) and with the installed transformers + ``from_hf``, and
compares with those logits, so a folder written by one major version is proven to load in the other.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any, Dict

import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "hf_folders"
sys.path.insert(0, str(ROOT / "tools"))

from upstream_fixtures import save_reference  # noqa: E402 (tools/, beside this file)

_SHAPE = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False)
#: family -> (transformers class names, config keywords); rope_theta is added in each version's spelling.
FAMILIES: Dict[str, Dict[str, Any]] = {
    "llama": dict(config="LlamaConfig", model="LlamaForCausalLM",
                  kwargs=dict(_SHAPE, intermediate_size=96, head_dim=8, mlp_bias=False, bos_token_id=1, eos_token_id=2)),
    "qwen3": dict(config="Qwen3Config", model="Qwen3ForCausalLM",
                  kwargs=dict(_SHAPE, intermediate_size=128, head_dim=12, use_sliding_window=False, sliding_window=None)),
    "qwen3_moe": dict(config="Qwen3MoeConfig", model="Qwen3MoeForCausalLM",
                      kwargs=dict(_SHAPE, intermediate_size=128, head_dim=8, num_experts=4, num_experts_per_tok=1,
                                  moe_intermediate_size=48, norm_topk_prob=True, decoder_sparse_step=1,
                                  mlp_only_layers=[], use_sliding_window=False, sliding_window=None)),
}
THETA = 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="default: tests/data/hf_folders/transformers<major>")
    args = p.parse_args(argv)
    import transformers

    major = int(transformers.__version__.split(".")[0])
    out = (args.out or OUT / f"transformers{major}").resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    rope = ({"rope_parameters": {"rope_type": "default", "rope_theta": THETA}} if major >= 5
            else {"rope_theta": THETA, "rope_scaling": None})
    reference: Dict[str, Any] = {"families": {}}
    for seed, (family, spec) in enumerate(FAMILIES.items()):
        g = torch.Generator().manual_seed(200 + seed)
        config = getattr(transformers, spec["config"])(**spec["kwargs"], **rope)
        model = getattr(transformers, spec["model"])(config).eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.copy_(1 + 0.3 * torch.randn(param.shape, generator=g))
                elif name != "lm_head.weight":  # tied: the embedding's values
                    param.copy_(0.2 * torch.randn(param.shape, generator=g))
                param.copy_(param.half().float())  # the values the fp16 file holds
        ids = torch.randint(0, config.vocab_size, (2, 9), generator=g)
        with torch.no_grad():
            logits = model(ids).logits
        model.half().save_pretrained(out / family)
        reference["families"][family] = {"input_ids": ids, "logits": logits}
    reference["transformers"] = transformers.__version__
    reference["note"] = (f"Folders written by transformers {transformers.__version__}'s save_pretrained (torch "
                         f"{torch.__version__}, CPU, fp16 files); fp32 logits from transformers; made by tools/hf_folder_fixtures.py.")
    save_reference(out, reference)
    return 0


if __name__ == "__main__":
    sys.exit(main())
