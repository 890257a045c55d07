"""Upstream's published weight files, read without ``transformers``: the ``.pth`` state dicts
(``load_pth``: ``<stage>_<hidden>[_moe].pth``, a bare fp16 ``state_dict`` as upstream's trainers save it)
and the Hugging Face model folders (``load_hf_dir``: ``config.json`` + ``model.safetensors`` or
``pytorch_model.bin``, single or sharded, in the Llama, Qwen3 / Qwen3-MoE and MiniMind layouts
upstream's ``scripts/convert_model.py`` writes). This module owns the formats: file names
(``parse_pth_name``), what a file must hold and the clear error for what it holds instead (a Git
LFS pointer, a resume checkpoint, a LoRA adapter, MiniMind's names from before 2025-04-26), the
config read from a ``config.json`` (``config_from_hf``) or from the shapes and keys
(``published_config``, ``state_dict_generation``), and building the model strictly from them.
Which published models exist, where their files are and fetching them is ``pretrained``'s.

What is verified and what is inferred (details in the book's ``minimind_ref`` page):

* Names, fp16 storage and the tied keys of the ``.pth`` files come from upstream's trainers at
  c090b69 (``f'{save_dir}/{save_weight}_{hidden_size}{_moe}.pth'``, ``v.half()``:
  ``c090b69:trainer/train_full_sft.py:60-65``) and match the
  hub listing of ``jingyaogong/MiniMind2-Pytorch`` (``full_sft_512.pth`` 58.2 MB, HalfStorage, =
  2 bytes x 29.1M tensor entries: both tied keys stored). The head count is not in the shapes:
  8 query heads (2 KV heads) are taken from the published configs (``config.json`` of
  MiniMind2 / MiniMind2-Small: ``num_attention_heads 8``; upstream's ``eval_llm.py`` loads every
  ``.pth`` strictly into ``MiniMindConfig``'s default 8 heads); MoE top-2 likewise.
* The Llama ``config.json`` fields are those of ``jingyaogong/MiniMind2`` as mirrored in public
  clones (``LlamaForCausalLM``, ``head_dim 96``, ``rope_theta 1e6``, ``tie_word_embeddings``
  true, newer transformers: ``rope_parameters``/``dtype``); the MiniMind layout's fields are
  inferred from ``convert_model.py`` + ``MiniMindConfig`` (no published copy was found).
* minimind-3 (d65ef2c) is told from MiniMind2 by its keys and shapes, never by the file name:
  its ``full_sft_768.pth`` has the very name of MiniMind2's 104M file (both trainers write
  ``f'{save_weight}_{hidden_size}{moe_suffix}.pth'``: ``c090b69:trainer/train_full_sft.py:60-65`` and
  ``d65ef2c:trainer/train_full_sft.py:63-68``; ``v.half()`` in both). Only minimind-3's attention has
  ``q_norm``/``k_norm`` (``d65ef2c:model/model_minimind.py:104-105``), so a state dict with
  ``self_attn.q_norm.weight`` is minimind-3's, and its shapes then hold the head layout too:
  ``head_dim`` = length of ``q_norm``, query heads = ``q_proj`` rows / ``head_dim``, KV heads =
  ``k_proj`` rows / ``head_dim``; experts come without shared ones. Tied or untied head, in both
  generations and every loader: ``checkpoint.head_tying`` (a stored ``lm_head.weight`` equal to the
  embedding is tied, a head of its own untied, anything between a ``ValueError``). What no shape
  holds is the MoE top-k: 1 for minimind-3-moe, from upstream's README ("4 experts / top-1",
  its model table: ``d65ef2c:README_en.md:577``) and ``MiniMindConfig``'s default
  ``num_experts_per_tok=1`` (``d65ef2c:model/model_minimind.py:42``). ``rms_norm_eps`` (1e-6) and
  ``rope_theta`` (1e6) are d65ef2c's defaults too (``d65ef2c:model/model_minimind.py:28-29``).
* upstream's ``convert_torch2transformers`` (``d65ef2c:scripts/convert_model.py:40-96``) writes ``Qwen3Config`` /
  ``Qwen3MoeConfig`` with ``head_dim = hidden_size // num_attention_heads``,
  ``tie_word_embeddings=True``, no sliding window, and for the MoE ``num_experts``,
  ``num_experts_per_tok``, ``moe_intermediate_size``, ``norm_topk_prob``; everything else is
  transformers' default, so such a folder says ``router_aux_loss_coef: 0.001`` (transformers')
  where upstream's trainer uses 5e-4 and no ``bos_token_id``/``eos_token_id`` (read here as
  MiniMind's 1 and 2). transformers drops the tied ``lm_head.weight`` from ``model.safetensors``.
  ``convert_torch2transformers_minimind`` writes d65ef2c's ``MiniMindConfig`` keys
  (``num_experts``, ``router_aux_loss_coef``, ``head_dim``, ``moe_intermediate_size``; no
  ``tie_word_embeddings`` when it is the default true) and ``pytorch_model.bin`` with both tied keys.
* Files from before upstream's 2025-04-26 rename (keys ``tok_embeddings``, ``layers.N.attention.wq``;
  ``config.json`` with ``dim``/``n_layers``) are refused with an explanation: upstream's own code
  at c090b69 no longer loads them.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import torch

from .checkpoint import _torch_load, check_weights, head_tying, infer_config, load_state_dict_strict, tied_state
from .config import YARN_ROPE_SCALING, MiniMindConfig
from .files import read_json
from .model import MiniMindForCausalLM

PathLike = Union[str, "os.PathLike[str]"]

#: Head layout of every published MiniMind2 (not readable from the weights' shapes).
PUBLISHED_HEADS = {"num_attention_heads": 8, "num_key_value_heads": 2}
#: Experts per token of MiniMind2-MoE (not readable from the weights either).
PUBLISHED_TOP_K = 2
#: Experts per token of minimind-3-moe (README at d65ef2c: "4 experts / top-1 routing").
PUBLISHED_TOP_K_MINIMIND3 = 1

_PTH_NAME = re.compile(r"^(?P<stage>[a-z][a-z0-9_]*?)_(?P<hidden>\d+)(?P<moe>_moe)?(?:_(?P<tag>[a-z][a-z0-9]*))?\.pth$")
_LFS_POINTER = b"version https://git-lfs"


# ---------------------------------------------------------------------- .pth files
@dataclass(frozen=True)
class PthName:
    """What upstream's file name says: ``full_sft_640_moe.pth`` -> stage ``full_sft``, hidden 640, MoE."""

    stage: str
    hidden_size: int
    use_moe: bool
    tag: Optional[str] = None  # e.g. "zero" in full_sft_512_zero.pth

    @property
    def filename(self) -> str:
        return pth_filename(self.stage, self.hidden_size, self.use_moe) if self.tag is None else \
            f"{self.stage}_{self.hidden_size}{'_moe' if self.use_moe else ''}_{self.tag}.pth"


def pth_filename(stage: str, hidden_size: int, use_moe: bool = False) -> str:
    """Upstream's weight file name: ``f"{stage}_{hidden_size}{'_moe' if use_moe else ''}.pth"``."""
    return f"{stage}_{hidden_size}{'_moe' if use_moe else ''}.pth"


def parse_pth_name(filename: str) -> PthName:
    """Split an upstream weight file name; ``ValueError`` for a name upstream's trainers do not write."""
    base = os.path.basename(os.fspath(filename))
    if base.startswith("lora_"):
        raise ValueError(
            f"{base} is a LoRA adapter (only the low-rank A/B matrices), not a model: load the base model "
            "(e.g. full_sft_512.pth) and apply the adapter to it."
        )
    if base.endswith("_resume.pth"):
        raise ValueError(
            f"{base} is a training-resume checkpoint (weights + optimizer + step); load the weights file "
            f"saved next to it, {base[: -len('_resume.pth')]}.pth."
        )
    found = _PTH_NAME.match(base)
    if not found:
        raise ValueError(
            f"{base!r} is not named like upstream's weights: expected <stage>_<hidden>[_moe].pth, e.g. "
            "full_sft_512.pth (MiniMind2-Small), full_sft_768.pth (MiniMind2), full_sft_640_moe.pth (MiniMind2-MoE). "
            "For a checkpoint of this course use minimind_ref.load_checkpoint."
        )
    return PthName(found["stage"], int(found["hidden"]), bool(found["moe"]), found["tag"])


def _check_not_lfs_pointer(path: Path) -> None:
    if path.stat().st_size < 1024:
        with open(path, "rb") as f:
            if f.read(len(_LFS_POINTER)) == _LFS_POINTER:
                raise ValueError(
                    f"{path} is a Git LFS pointer (a few bytes of text), not the weights: the repository was "
                    "cloned without git-lfs. Run `git lfs install && git lfs pull` in it, or download the file."
                )


def _read_torch_file(path: Path, map_location: Union[str, torch.device]) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"no file at {path}")
    _check_not_lfs_pointer(path)
    try:  # checkpoint.py's reader: a pickle that would build Python objects is refused, never run
        return _torch_load(path, map_location)
    except ValueError as err:
        if "will not unpickle" in str(err):
            raise
        raise ValueError(
            f"{path} could not be read as a weights-only torch file (its bytes are not a complete torch.save file); "
            "an interrupted download, or not a state dict."
        ) from None


def _as_state_dict(blob: Any, source: Path) -> Dict[str, torch.Tensor]:
    """The flat ``{name: tensor}`` upstream saves, with a clear error for everything else."""
    if not isinstance(blob, Mapping) or not blob:
        raise ValueError(f"{source} does not hold a state dict (a mapping of names to tensors), got {type(blob).__name__}.")
    if "model" in blob and "optimizer" in blob:
        raise ValueError(f"{source} is a training-resume checkpoint (model + optimizer); load the plain weights file.")
    if not all(isinstance(v, torch.Tensor) for v in blob.values()):
        raise ValueError(f"{source} is not a bare state dict: some entries are not tensors (keys {list(blob)[:5]}).")
    if "tok_embeddings.weight" in blob or any(".attention.wq." in k for k in blob):
        raise ValueError(
            f"{source} uses MiniMind's names from before 2025-04-26 (tok_embeddings, layers.N.attention.wq, ...). "
            "Upstream renamed every parameter then (and changed the RoPE layout), and its own code no longer loads "
            "these files; download the current weights (Hub: jingyaogong/MiniMind2-Pytorch)."
        )
    if any("lora" in k.lower() for k in blob):
        raise ValueError(f"{source} holds LoRA adapter weights, not a whole model.")
    if "model.embed_tokens.weight" not in blob:
        raise ValueError(
            f"{source} is not a MiniMind2 state dict: no 'model.embed_tokens.weight' (first keys {list(blob)[:5]})."
        )
    return dict(blob)


_BUFFERS = ("freqs_cos", "freqs_sin", "rotary_emb.inv_freq")  # recomputed, never loaded


def _tied_or_untied(state: Dict[str, torch.Tensor], config: MiniMindConfig, source: Path,
                    declared: Optional[bool], declared_by: str, forced: bool) -> Tuple[MiniMindConfig, Dict[str, torch.Tensor]]:
    """The config and state of a file under ``checkpoint.head_tying``'s rule (the one every loader
    follows): buffers that are recomputed dropped, ``tie_word_embeddings`` as the weights say when
    they are unambiguous or as ``declared`` says when it agrees with them, else a ``ValueError``
    saying what to pass."""
    state = {k: v for k, v in state.items() if not k.endswith(_BUFFERS)}
    tied = head_tying(state, declared, source, declared_by, forced)
    if tied != config.tie_word_embeddings:
        config = config.replace(tie_word_embeddings=tied)
    return config, tied_state(state, tied, source)


def _check_dtype(dtype: Any) -> None:
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating-point torch.dtype (torch.float32, torch.bfloat16, ...) or None, got "
                        f"{dtype!r}: weights cast to it would lose their fractions.")


def _build(config: MiniMindConfig, state: Dict[str, torch.Tensor], dtype: Optional[torch.dtype],
           map_location: Union[str, torch.device], source: PathLike = "the weights",
           check_finite: bool = True) -> MiniMindForCausalLM:
    _check_dtype(dtype)
    check_weights(state, source, check_finite)  # the validation every loader runs (finite values)
    if dtype is None:  # keep the file's precision: build the model in it (load_state_dict copies into it)
        dtype = next(v.dtype for v in state.values() if v.is_floating_point())
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    model = MiniMindForCausalLM(config).to(dtype)
    load_state_dict_strict(model, state)
    return model.to(map_location).eval()


def load_pth(path: PathLike, dtype: Optional[torch.dtype] = torch.float32,
             map_location: Union[str, torch.device] = "cpu", check_finite: bool = True,
             tie_word_embeddings: Optional[bool] = None) -> MiniMindForCausalLM:
    """Load upstream's ``<stage>_<hidden>[_moe].pth`` strictly into ``MiniMindForCausalLM`` (eval mode).

    The config comes from the file name and the shapes: hidden size, MoE and the name must agree
    with the tensors; layers, vocabulary, FFN width, KV width and expert counts are read from the
    shapes. The generation comes from the keys (``q_norm``: minimind-3; see the module docstring),
    never from the name (``full_sft_768.pth`` is a file name of both). What no shape holds is the
    published models': MiniMind2's 8 query heads and MoE top-2, minimind-3-moe's top-1 (minimind-3's
    head layout is in its shapes). Weights are cast to ``dtype`` (``None`` keeps upstream's fp16).
    NaN/inf weights are a ``ValueError`` (``check_finite=False`` loads them, for inspection).
    Tied or untied head: ``checkpoint.head_tying``'s rule, as every loader (a file that stores
    both tied keys equal, as upstream's trainers do, is tied; a head of its own untied; a head
    that is neither is a ``ValueError`` asking for ``tie_word_embeddings``).
    """
    _check_dtype(dtype)
    path = Path(os.path.expanduser(os.fspath(path)))
    name = parse_pth_name(path.name)
    state = _as_state_dict(_read_torch_file(path, map_location), path)
    width = state["model.embed_tokens.weight"].shape[1]
    is_moe = any(".mlp.experts." in k for k in state)
    if width != name.hidden_size or is_moe != name.use_moe:
        what = f"hidden size {width}" + (", MoE" if is_moe else ", dense")
        raise ValueError(
            f"{path.name} names hidden size {name.hidden_size}{' and MoE' if name.use_moe else ''}, but its tensors "
            f"say {what}: a renamed file? Name it {pth_filename(name.stage, width, is_moe)}."
        )
    state = {k: v for k, v in state.items() if not k.endswith(_BUFFERS)}
    overrides = {} if tie_word_embeddings is None else {"tie_word_embeddings": tie_word_embeddings}
    config = infer_config(state, source=path, **_published_overrides(state, is_moe), **overrides)  # + the head
    return _build(config, tied_state(state, config.tie_word_embeddings, path), dtype, map_location, path, check_finite)


def published_config(state: Mapping[str, Any]) -> MiniMindConfig:
    """The config ``load_pth`` builds for an upstream state dict: ``infer_config`` with what the published
    models fix and no shape holds (MiniMind2: 8 query heads, MoE top-2; minimind-3-moe: top-1)."""
    return infer_config(state, **_published_overrides(state, any(".mlp.experts." in k for k in state)))


def state_dict_generation(state: Mapping[str, Any]) -> str:
    """``"minimind-3"`` when the state dict has QK-norm gains (only d65ef2c's attention has them),
    else ``"MiniMind2"``."""
    return "minimind-3" if "model.layers.0.self_attn.q_norm.weight" in state else "MiniMind2"


def _published_overrides(state: Mapping[str, Any], is_moe: bool) -> Dict[str, Any]:
    """What the published models fix and the shapes do not say (see the module docstring)."""
    if state_dict_generation(state) == "minimind-3":  # heads, head_dim: in the shapes
        return {"num_experts_per_tok": PUBLISHED_TOP_K_MINIMIND3} if is_moe else {}
    overrides: Dict[str, Any] = {"num_attention_heads": PUBLISHED_HEADS["num_attention_heads"]}
    if is_moe:
        overrides["num_experts_per_tok"] = PUBLISHED_TOP_K
    return overrides


# ---------------------------------------------------------------------- Hugging Face folders
def config_from_hf(raw: Mapping[str, Any]) -> MiniMindConfig:
    """The ``MiniMindConfig`` of a ``config.json`` dict, Llama or MiniMind layout.

    Llama: the fields ``convert_torch2transformers_llama`` sets, with transformers' defaults for
    what is missing (``rope_theta`` 10000, with a warning; ``tie_word_embeddings`` false); both the
    ``rope_theta`` key and transformers-5's ``rope_parameters`` are read (both, different: an error). A Llama that MiniMind
    cannot express (biases, ``head_dim`` other than hidden / heads, RoPE scaling) is a
    ``ValueError`` listing why. Qwen3 / Qwen3-MoE (minimind-3's ``convert_torch2transformers``):
    see ``_config_from_qwen3``. MiniMind: ``MiniMindConfig``'s own keys of either commit (d65ef2c's
    ``num_experts`` / ``router_aux_loss_coef`` make it a minimind-3 config); the rest
    (``auto_map``, ``torch_dtype``, ``max_seq_len``, ...) is ignored.
    """
    if not isinstance(raw, Mapping):
        raise TypeError(f"config must be a dict (the parsed config.json), got {type(raw).__name__}.")
    if "dim" in raw and "n_layers" in raw:
        raise ValueError(
            "this config.json is MiniMind's layout from before 2025-04-26 (LMConfig: dim, n_layers, n_heads); "
            "upstream's code no longer loads those models. Download the current folder from the Hub."
        )
    model_type = raw.get("model_type")
    if model_type == "llama":
        return _config_from_llama(raw)
    if model_type == "minimind":
        return _config_from_minimind(raw)
    if model_type in ("qwen3", "qwen3_moe"):
        return _config_from_qwen3(raw)
    raise ValueError(
        f"config.json has model_type {model_type!r}; MiniMind2 folders are 'llama' (convert_torch2transformers_llama) "
        "or 'minimind' (convert_torch2transformers_minimind), minimind-3 folders 'qwen3' / 'qwen3_moe' "
        "(convert_torch2transformers) or 'minimind'."
    )


def _config_from_llama(raw: Mapping[str, Any]) -> MiniMindConfig:
    """MiniMind2 from a ``LlamaConfig`` dict of either transformers major version (``minimind_ref.hf.config_from_llama_dict``)."""
    from .hf import config_from_llama_dict

    return config_from_llama_dict(raw)


def _config_from_qwen3(raw: Mapping[str, Any]) -> MiniMindConfig:
    """minimind-3 from a ``Qwen3Config`` / ``Qwen3MoeConfig`` dict written by transformers 4 or 5 or by
    upstream's converter, with transformers' defaults for what is missing (``head_dim`` 128, or hidden /
    heads for Qwen3-MoE, ``rope_theta`` 10000, ``tie_word_embeddings`` false, ``norm_topk_prob`` false:
    each with a warning naming it; ``router_aux_loss_coef`` 0.001, ``rms_norm_eps`` 1e-6) and MiniMind's
    token ids 1/2 when there are none. A Qwen3 that minimind-3 cannot express, or whose fields contradict
    each other (``num_experts`` / ``num_local_experts``), is a ``ValueError`` listing why
    (``minimind_ref.hf.config_from_qwen3_dict``)."""
    from .hf import config_from_qwen3_dict

    return config_from_qwen3_dict(raw)


def _config_from_minimind(raw: Mapping[str, Any]) -> MiniMindConfig:
    known = set(MiniMindConfig().to_dict()) | {"num_experts", "router_aux_loss_coef"}  # + d65ef2c's names
    kwargs = {k: raw[k] for k in known if k in raw}
    if "generation" not in kwargs and ("num_experts" in raw or "router_aux_loss_coef" in raw):
        kwargs["generation"] = "minimind-3"  # d65ef2c's MiniMindConfig (c090b69's has n_routed_experts)
    if kwargs.get("generation") == "minimind-3":  # d65ef2c writes its derived defaults out: keep them derived
        heads, hidden = kwargs.get("num_attention_heads", 8), kwargs.get("hidden_size", 768)
        if isinstance(heads, int) and heads > 0 and kwargs.get("head_dim") == hidden // heads:
            kwargs.pop("head_dim")
        if kwargs.get("moe_intermediate_size") is not None and kwargs.get("moe_intermediate_size") == kwargs.get(
                "intermediate_size"):
            kwargs.pop("moe_intermediate_size")
    scaling = raw.get("rope_scaling")
    if scaling and not (raw.get("inference_rope_scaling") and dict(scaling) == YARN_ROPE_SCALING):
        raise ValueError(f"config.json has rope_scaling {scaling!r}, which is not MiniMind's YaRN setting; unsupported.")
    return MiniMindConfig(**kwargs)


_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def _load_safetensors(path: Path) -> Dict[str, torch.Tensor]:
    try:
        from safetensors.torch import load_file
    except ImportError as err:
        raise ImportError(
            f"{path.name} is a safetensors file and reading it needs the 'safetensors' package: pip install safetensors "
            "(or pass a folder holding pytorch_model.bin)."
        ) from err
    _check_not_lfs_pointer(path)
    try:
        return load_file(str(path))
    except Exception as err:  # safetensors' own error type: a truncated or damaged file
        raise ValueError(f"{path} could not be read as a safetensors file ({str(err)[:120]}); an interrupted download, "
                         "or not a weights file.") from None


def read_hf_weights(folder: PathLike, map_location: Union[str, torch.device] = "cpu") -> Dict[str, torch.Tensor]:
    """The state dict of a Hugging Face model folder: ``model.safetensors`` (preferred, as in
    transformers) or ``pytorch_model.bin``, single or sharded (``*.index.json``)."""
    folder = Path(folder)
    for name in _WEIGHT_FILES:
        path = folder / name
        if not path.is_file():
            continue
        if name.endswith(".index.json"):
            index = read_json(path, "shard index (*.index.json)")
            weight_map = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(weight_map, dict) or not weight_map or not all(
                    isinstance(f, str) and f and Path(f).name == f for f in weight_map.values()):
                raise ValueError(f"{path} is not a valid shard index: it needs a 'weight_map' object mapping each "
                                 "tensor name to a shard file name in the same folder (truncated, or edited by hand?).")
            shards = sorted(set(weight_map.values()))
            missing = [s for s in shards if not (folder / s).is_file()]
            if missing:
                raise FileNotFoundError(f"{path} lists shard(s) {missing} that are not in {folder}: an incomplete "
                                        "download?")
            files = [folder / s for s in shards]
        else:
            files = [path]
        state: Dict[str, torch.Tensor] = {}
        for f in files:
            part = _load_safetensors(f) if f.suffix == ".safetensors" else _read_torch_file(f, map_location)
            if not isinstance(part, Mapping) or not all(isinstance(v, torch.Tensor) for v in part.values()):
                raise ValueError(f"{f} is not a state dict (a mapping of names to tensors).")
            state.update(part)
        return {k: v.to(map_location) for k, v in state.items()}
    raise FileNotFoundError(f"{folder} holds no weights: expected one of {', '.join(_WEIGHT_FILES)}.")


def _expert_count(state: Mapping[str, torch.Tensor]) -> Optional[int]:
    """Experts per layer of a state dict: per-expert keys (``mlp.experts.{e}.``) or fused tensors."""
    for key, value in state.items():
        if key.startswith("model.layers.0.") and key.endswith(".mlp.experts.gate_up_proj") and value.dim() == 3:
            return int(value.shape[0])
    numbers = {int(k.split(".mlp.experts.")[1].split(".")[0]) for k in state
               if k.startswith("model.layers.0.") and ".mlp.experts." in k and k.split(".mlp.experts.")[1].split(".")[0].isdigit()}
    return max(numbers) + 1 if numbers else None


def _per_expert(state: Dict[str, torch.Tensor], config: Optional[MiniMindConfig] = None,
                source: Any = "the weights") -> Dict[str, torch.Tensor]:
    """A folder's state with transformers 5's fused Qwen3-MoE experts (if any) split per expert, as
    MiniMind stores them (``minimind_ref.hf.split_fused_experts``; needs no transformers). With the
    folder's ``config``, the fused tensors' shapes are checked first (``hf.check_fused_experts``: an
    error names the fused key, not per-expert keys the folder does not hold)."""
    if not any(k.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")) for k in state):
        return state
    from .hf import check_fused_experts, split_fused_experts

    if config is not None:
        if not config.use_moe:
            fused = next(k for k in state if k.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")))
            raise ValueError(f"{source}: the weights hold fused experts ({fused}) but the config describes a dense "
                             "model: a Qwen3-MoE folder needs model_type 'qwen3_moe' in config.json.")
        check_fused_experts(state, config, source)
    return split_fused_experts(state)


def load_hf_dir(folder: PathLike, dtype: Optional[torch.dtype] = torch.float32,
                map_location: Union[str, torch.device] = "cpu", check_finite: bool = True,
                tie_word_embeddings: Optional[bool] = None) -> MiniMindForCausalLM:
    """Load a Hugging Face model folder (Llama or MiniMind layout) strictly, without transformers.
    NaN/inf weights are a ``ValueError`` (``check_finite=False`` loads them, for inspection).
    Tied or untied head: ``checkpoint.head_tying``'s rule, with ``config.json``'s
    ``tie_word_embeddings`` as the declared value when it has one (``tie_word_embeddings``
    here overrides it): a tied folder whose stored head differs from the embedding is refused,
    not silently tied (transformers would drop the stored head)."""
    _check_dtype(dtype)
    folder = Path(os.path.expanduser(os.fspath(folder)))
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(
            f"{folder} has no config.json, so it is not a Hugging Face model folder (for a .pth file use load_pth)."
        )
    raw = read_json(cfg_path, "config.json")
    with warnings.catch_warnings(record=True) as said:  # said after the weights are checked (below)
        warnings.simplefilter("always")
        try:
            config = config_from_hf(raw)
        except ValueError as err:
            if "has no expert count" not in str(err):
                raise ValueError(f"{cfg_path}: {err}") from None
            count = _expert_count(read_hf_weights(folder, map_location))
            raise ValueError(f"{cfg_path}: {err}" + (f" Here the weights hold {count} experts per layer: add "
                                                     f"\"num_experts\": {count}." if count else "")) from None
    state = _as_state_dict(_per_expert(read_hf_weights(folder, map_location), config, folder), folder)
    if raw.get("model_type") in ("qwen3", "qwen3_moe"):  # a missing field whose default the weights contradict
        from .hf import qwen3_defaults_against_weights

        qwen3_defaults_against_weights(raw, state, folder)
    for warning in said:
        warnings.warn(f"{folder}: {warning.message}", warning.category, stacklevel=2)
    declared, declared_by = raw.get("tie_word_embeddings"), f"{cfg_path}"  # a missing field declares nothing...
    if declared is None and raw.get("model_type") in ("qwen3", "qwen3_moe"):  # ...but Qwen3's default (warned above)
        declared, declared_by = config.tie_word_embeddings, f"transformers' default for {cfg_path} (it has no tie_word_embeddings)"
    if declared is not None and not isinstance(declared, bool):
        raise TypeError(f"{cfg_path}: tie_word_embeddings must be true or false (a JSON boolean), got {declared!r}.")
    if tie_word_embeddings is not None:
        declared, declared_by = tie_word_embeddings, "your tie_word_embeddings"
    config, state = _tied_or_untied(state, config, folder, declared, declared_by, forced=tie_word_embeddings is not None)
    return _build(config, state, dtype, map_location, folder, check_finite)
