"""Make minimind-3's file fixtures with upstream's own code (run by hand, never by the tests).

    python tools/upstream_files_minimind3.py --upstream /path/to/minimind   # a checkout at d65ef2c
    # writes tests/data/upstream_minimind3_files/
    .venv-t5/bin/python tools/upstream_files_minimind3.py --upstream /path/to/minimind --converted-only \
        --out tests/data/upstream_minimind3_files_transformers5
    # the same conversions under transformers 5 (an environment with it, e.g. transformers 5.24.0):
    # only the converted folders and reference.pt (the .pth files are the same bytes as above)

What upstream does, done with upstream's code (``model/model_minimind.py`` and
``scripts/convert_model.py`` of the checkout; they need ``transformers``, the project's ``.venv``
has 4.57.6):

1. builds a small random ``MiniMindForCausalLM`` of upstream's class for each case of ``CASES``
   (upstream's own ``MiniMindConfig`` keywords);
2. saves it as upstream's trainers save weights (``trainer/train_pretrain.py`` and the other
   trainers at d65ef2c: ``torch.save({k: v.half().cpu() for k, v in state_dict.items()},
   f'{save_dir}/{save_weight}_{hidden_size}{moe_suffix}.pth')``);
3. converts the dense and the MoE file with ``scripts/convert_model.py``'s
   ``convert_torch2transformers`` (``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM`` folders) and the
   dense file with ``convert_torch2transformers_minimind`` (MiniMind's own layout), setting the
   module global ``lm_config`` as its ``__main__`` does and running from a ``scripts/`` folder whose
   ``../model/`` holds the test tokenizer (``tests/_upstream_files.write_tokenizer_minimind3``);
   the tokenizer files the converter copies into each folder are then deleted (the tests write
   the same deterministic tokenizer again where they need one), and so is the copy of upstream's
   ``model_minimind.py`` that ``register_for_auto_class`` puts into the MiniMind-layout folder
   (upstream's code is not part of this repository);
4. loads every ``.pth`` back into upstream's model (fp16 values, computed in fp32) and stores its
   logits for fixed token ids in ``reference.pt``, with transformers' logits of each converted
   folder beside them.

``tests/test_pretrained_minimind3.py`` loads the files with ``minimind_ref`` and compares with the
stored logits at 1e-5. Upstream's code itself is not part of this repository.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict

import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "upstream_minimind3_files"
sys.path.insert(0, str(ROOT / "tests"))

import _upstream_files as U  # noqa: E402
from upstream_fixtures import load_module, randomize, save_reference  # noqa: E402 (tools/, beside this file)

#: name -> (upstream MiniMindConfig keywords, what to convert). The vocabulary is the test tokenizer's.
_V = U.len_vocab_minimind3()
CASES: Dict[str, Dict[str, Any]] = {
    # the published layout (8 query heads : 4 KV heads, QK-norm, pi-rule width, tied), tiny
    "dense": dict(config=dict(hidden_size=32, num_hidden_layers=2, vocab_size=_V), convert=("qwen3", "minimind")),
    # minimind-3-moe's router (4 experts, top-1, no shared expert), narrower experts
    "moe": dict(config=dict(hidden_size=32, num_hidden_layers=2, vocab_size=_V, use_moe=True, moe_intermediate_size=64),
                convert=("qwen3",)),
    # what only the .pth can hold: a free head_dim and an untied head (the converter fixes
    # head_dim = hidden / heads and tie_word_embeddings = True)
    "head_dim_untied": dict(config=dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=8, tie_word_embeddings=False, vocab_size=_V),
                            convert=()),
}
FOLDERS = {("dense", "qwen3"): "minimind-3-tiny", ("moe", "qwen3"): "minimind-3-moe-tiny",
           ("dense", "minimind"): "minimind-3-tiny-minimind-layout"}
#: What the converter copies next to the weights and the fixture leaves out (see the docstring).
LEFT_OUT = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
            "vocab.json", "merges.txt", "model_minimind.py")


@contextlib.contextmanager
def working_dir(path: Path):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--upstream", required=True, type=Path, help="a checkout of jingyaogong/minimind at d65ef2c")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--converted-only", action="store_true",
                   help="write the converted folders and reference.pt only (the .pth files go to a scratch folder)")
    args = p.parse_args(argv)
    checkout = args.upstream.resolve()
    upstream = load_module(checkout / "model" / "model_minimind.py", "model.model_minimind")
    import transformers

    converter = load_module(checkout / "scripts" / "convert_model.py", "upstream_convert_model")
    out = args.out.resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    reference: Dict[str, Any] = {"cases": {}}
    with tempfile.TemporaryDirectory(prefix="minimind_fixture_") as scratch:
        scratch = Path(scratch)
        U.write_tokenizer_minimind3(scratch / "model")  # what '../model/' holds for the converter
        (scratch / "scripts").mkdir()
        for seed, (name, case) in enumerate(CASES.items()):
            kwargs = case["config"]
            g = torch.Generator().manual_seed(100 + seed)
            config = upstream.MiniMindConfig(**kwargs)
            model = upstream.MiniMindForCausalLM(config)
            randomize(model, g)
            # the trainers' save (train_pretrain.py, train_full_sft.py, ... at d65ef2c)
            moe_suffix = "_moe" if config.use_moe else ""
            pth = (scratch if args.converted_only else out) / f"full_sft_{config.hidden_size}{moe_suffix}.pth"
            state_dict = model.state_dict()
            torch.save({k: v.half().cpu() for k, v in state_dict.items()}, pth)
            # upstream's model on the file's (fp16) values, computed in fp32
            loaded = upstream.MiniMindForCausalLM(upstream.MiniMindConfig(**kwargs))
            loaded.load_state_dict({k: v.float() for k, v in torch.load(pth, weights_only=True).items()}, strict=True)
            loaded.eval()
            ids = torch.randint(0, kwargs["vocab_size"], (2, 8), generator=g)
            with torch.no_grad():
                logits = loaded(ids).logits
            entry: Dict[str, Any] = {"config": dict(kwargs), "file": pth.name, "input_ids": ids, "logits": logits,
                                     "folders": {}}
            for kind in case["convert"]:
                folder = out / FOLDERS[name, kind]
                converter.lm_config = config  # a module global, as in the converter's __main__
                with working_dir(scratch / "scripts"):
                    if kind == "qwen3":
                        converter.convert_torch2transformers(str(pth), str(folder))
                    else:
                        converter.convert_torch2transformers_minimind(str(pth), str(folder))
                for left_out in LEFT_OUT:
                    (folder / left_out).unlink(missing_ok=True)
                if kind == "qwen3":
                    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
                    with torch.no_grad():
                        hf_logits = hf(ids).logits
                    entry["folders"][folder.name] = {"kind": kind, "transformers_logits": hf_logits}
                else:
                    entry["folders"][folder.name] = {"kind": kind}
            reference["cases"][name] = entry
    reference["transformers"] = transformers.__version__
    reference["note"] = (
        f"Upstream minimind-3 (model/model_minimind.py and scripts/convert_model.py, d65ef2c) with transformers "
        f"{transformers.__version__}, torch {torch.__version__} on CPU; logits in fp32 from the fp16 files; "
        "made by tools/upstream_files_minimind3.py.")
    save_reference(out, reference)
    return 0


if __name__ == "__main__":
    sys.exit(main())
