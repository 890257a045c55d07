"""A trained checkpoint out of the course: a folder ``transformers`` loads, and upstream's ``.pth``.

    python -m minimind_ref.export out/pretrain_minimind2_small/ckpt.pt --hf out/minimind2-small-hf
    python -m minimind_ref.export out/pretrain_minimind2_small/ckpt.pt --pth out/ --stage pretrain

* ``--hf DIR`` (``write_hf_folder``): ``hf.to_hf(model).save_pretrained(DIR)``: ``LlamaForCausalLM``
  for MiniMind2, ``Qwen3ForCausalLM`` (or ``Qwen3MoeForCausalLM``) for minimind-3, the same weights,
  so ``AutoModelForCausalLM.from_pretrained(DIR)`` gives the course's logits (``tests/test_hf.py``:
  1e-5 in fp32); plus the run's tokenizer as ``tokenizer.json`` and a ``tokenizer_config.json``
  naming its special tokens (``<|im_start|>`` begins, ``<|im_end|>`` ends, ``<|endoftext|>`` pads), so
  ``AutoTokenizer.from_pretrained(DIR)`` loads it. For chatting through ``apply_chat_template``, copy
  upstream's ``model/tokenizer_config.json`` over it: that file holds the chat template.
* ``--pth DIR`` (``write_pth``): upstream's weight file, the fp16 state dict its trainers save,
  named ``{stage}_{hidden}[_moe].pth`` (``c090b69:trainer/train_pretrain.py:61-65``), with upstream's
  keys (the course kept them). Upstream's ``eval_llm.py`` loads such a file with ``strict=True``
  (``c090b69:eval_llm.py:22-23``) and its next trainer starts from it (``--from_weight pretrain``).

Needs ``transformers`` for ``--hf`` (``pip install minimind-ref[hf]``); ``--pth`` needs only torch.
The checkpoint is any file ``load_checkpoint`` reads (a run's ``ckpt.pt``, an upstream ``.pth``); the
tokenizer is ``--tokenizer``, else the ``tokenizer.json`` the run saved beside its checkpoint.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch

from .checkpoint import load_checkpoint
from .files import write_json
from .model import MiniMindForCausalLM
from .tokenizer import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, load_tokenizer, save_tokenizer
from .upstream_weights import pth_filename

PathLike = Union[str, "os.PathLike[str]"]

#: What a stage name may hold: upstream's ``--save_weight`` prefixes are plain names (``pretrain``,
#: ``full_sft``, ``dpo``, ``grpo``, ...), and the file name is built from it.
STAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]*")


def _unwrapped(model: Any) -> MiniMindForCausalLM:
    model = getattr(model, "module", model)  # DistributedDataParallel
    model = getattr(model, "_orig_mod", model)  # torch.compile
    if not isinstance(model, MiniMindForCausalLM):
        raise TypeError(f"expected a minimind_ref.MiniMindForCausalLM, got {type(model).__name__}.")
    return model


def write_pth(model: Any, folder: PathLike, stage: str = "pretrain") -> Path:
    """Upstream's ``{stage}_{hidden}[_moe].pth`` in ``folder``: ``{key: tensor.half().cpu()}`` of the
    model's state dict, as upstream's trainers save it; returns the file's path."""
    if not isinstance(stage, str) or not STAGE_NAME.fullmatch(stage):
        raise ValueError(f"stage={stage!r}: give a plain name such as pretrain or full_sft (letters, digits, _), the "
                         "prefix upstream's trainers put before _{hidden}.pth (their --save_weight).")
    model = _unwrapped(model)
    folder = Path(os.path.expanduser(os.fspath(folder)))
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file; --pth takes the folder the .pth file is written into (upstream's out/).")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / pth_filename(stage, model.config.hidden_size, model.config.use_moe)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({k: v.detach().half().cpu() for k, v in model.state_dict().items()}, tmp)
    os.replace(tmp, path)
    return path


def write_hf_folder(model: Any, folder: PathLike, tokenizer: Optional[Any] = None) -> Path:
    """``folder`` holding the model as a transformers model (``hf.to_hf``, ``save_pretrained``, in fp32:
    a half-precision model is converted in place) and, when given, the tokenizer (``tokenizer.json`` and
    a ``tokenizer_config.json`` of its special tokens)."""
    from .hf import to_hf

    model = _unwrapped(model)
    folder = Path(os.path.expanduser(os.fspath(folder)))
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file; --hf takes a folder (created if needed).")
    if tokenizer is not None and tokenizer.get_vocab_size() > model.config.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.get_vocab_size()} tokens but the model's vocabulary holds "
                         f"{model.config.vocab_size}: it is not the tokenizer this model was trained with.")
    was_training = model.training
    hf_model = to_hf(model.float().eval())  # fp32 weights, as a checkpoint holds them
    model.train(was_training)
    folder.mkdir(parents=True, exist_ok=True)
    hf_model.save_pretrained(folder)
    if tokenizer is not None:
        save_tokenizer(tokenizer, folder / "tokenizer.json")
        pad, bos, eos = (SPECIAL_TOKENS[i] for i in (PAD_ID, BOS_ID, EOS_ID))
        write_json(folder / "tokenizer_config.json", {
            "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos, "pad_token": pad,
            "unk_token": pad, "add_bos_token": False, "add_eos_token": False,
            "model_max_length": model.config.max_position_embeddings, "clean_up_tokenization_spaces": False})
    return folder


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minimind_ref.export", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a run's ckpt.pt (or any file minimind_ref.load_checkpoint reads)")
    p.add_argument("--hf", metavar="DIR", help="write a transformers model folder here")
    p.add_argument("--pth", metavar="DIR", help="write upstream's {stage}_{hidden}.pth into this folder")
    p.add_argument("--stage", default="pretrain", help="the .pth file's prefix, upstream's --save_weight (default: pretrain; "
                   "full_sft for an SFT model)")
    p.add_argument("--tokenizer", help="tokenizer.json (default: the one the run saved beside its checkpoint)")
    args = p.parse_args(argv)
    if not args.hf and not args.pth:
        p.error("say what to write: --hf DIR, --pth DIR, or both")
    try:
        model = load_checkpoint(args.checkpoint)
        tokenizer_path = args.tokenizer or os.path.join(os.path.dirname(os.path.abspath(args.checkpoint)), "tokenizer.json")
        tokenizer = load_tokenizer(tokenizer_path) if os.path.exists(tokenizer_path) else None
        if args.tokenizer and tokenizer is None:
            raise FileNotFoundError(f"no tokenizer file {args.tokenizer}")
        if args.pth:
            print(f"wrote {write_pth(model, args.pth, args.stage)}")
        if args.hf:
            print(f"wrote {write_hf_folder(model, args.hf, tokenizer)}" + ("" if tokenizer is not None else
                  f" (no tokenizer: none at {tokenizer_path}; give --tokenizer)"))
    except (ValueError, FileNotFoundError, TypeError) as err:
        p.error(str(err))
    return 0


if __name__ == "__main__":
    sys.exit(main())
