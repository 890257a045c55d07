"""Saving and loading weights: upstream ``.pth`` state dicts and the course's own checkpoints.

Upstream MiniMind saves a bare state dict (often in fp16), e.g. ``full_sft_512.pth``. The course
saves ``{"format": "minimind_ref", "config": {...}, "state_dict": {...}, "extra": {...}}`` so the
config travels with the weights. ``load_checkpoint`` reads both.

Three promises:

* **Atomic saves.** ``save_checkpoint`` writes a temporary file next to the target, flushes it to
  disk and renames it over the target (``os.replace``). A crash or a kill mid-write leaves the
  previous checkpoint intact (at worst a hidden ``.NAME.*.tmp`` file stays behind).
* **Nothing non-finite.** A NaN or inf weight (or optimizer tensor in ``extra``) is refused at
  save time and reported at load time, naming the tensor.
* **Verified.** ``save_checkpoint`` records the SHA-256 of the weights (``files.weights_digest``);
  ``load_checkpoint`` (and resuming, and the stage files) recompute it and refuse a file whose
  weights changed since (flipped bytes, a tensor edited by hand). Files written before the digest
  existed, and upstream's bare state dicts, have none and load as before.
  ``check_weights`` is the one validation every loader runs (``load_checkpoint``, ``load_pth``,
  ``load_hf_dir``, ``load_lora``, resume, stage files): the digest, then finite values.
* **Weights only.** Every file is read with ``torch.load(..., weights_only=True)``: tensors,
  numbers, strings and containers, never arbitrary Python objects (unpickling those can run
  code). ``save_checkpoint`` therefore refuses ``extra`` values that could not be read back
  that way.
"""

from __future__ import annotations

import collections
import os
import pickle
import re
import warnings
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple, Union

import numpy as np
import torch

from .config import YARN_ROPE_SCALING, MiniMindConfig, validate_rope_scaling
from .files import DIGEST_KEY, META_DIGEST_KEY, expand, meta_digest, save_torch, weights_digest
from .model import MiniMindForCausalLM

FORMAT = "minimind_ref"
PathLike = Union[str, "os.PathLike[str]"]

#: Types ``torch.load(weights_only=True)`` reads back as they were saved (containers checked inside).
_PLAIN_TYPES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)


# ---------------------------------------------------------------------- saving
def save_checkpoint(model: MiniMindForCausalLM, path: PathLike, extra: Optional[Dict[str, Any]] = None,
                    allow_lora: bool = False) -> None:
    """Save weights and config (plus ``extra``: the step, the optimizer state, a loss history...).

    ``model`` may be wrapped (``DistributedDataParallel``, ``torch.compile``): the inner model is
    saved, under its own key names. The write is atomic (see the module docstring); the folder is
    created if needed.

    ``extra`` may hold what weights-only loading reads back: tensors, Python numbers (NaN too),
    strings, bytes, None, dtypes, devices, and lists, tuples, sets and dicts of those. NumPy
    scalars are stored as the equal Python number, other dict types as plain dicts
    (``OrderedDict`` is kept). Anything else (a NumPy array, a custom object) is a ``TypeError``
    that names where it sits in ``extra``.

    Raises ``ValueError`` (and writes nothing) when a floating-point tensor of the model or of
    ``extra`` holds NaN or inf: a diverged run must not overwrite a good checkpoint; and when the
    model carries unmerged LoRA adapters, which ``load_checkpoint`` could not rebuild (merge them, or
    ``save_lora`` them). ``allow_lora=True`` keeps them: the training loop's resume files do, since
    resuming loads them into the same adapted model.
    """
    model = _unwrap(model)
    if extra is not None and not isinstance(extra, dict):
        raise TypeError(f"extra must be a dict (or None), got {type(extra).__name__}.")
    state_dict = model.state_dict()
    adapters = [k for k in state_dict if ".lora." in k]
    if adapters and not allow_lora:
        raise ValueError(
            f"the model carries unmerged LoRA adapters ({len(adapters)} tensors, e.g. {adapters[0]!r}), which a "
            "MiniMindForCausalLM file cannot hold: merge them first (lora.merge_lora(model)) to save the whole model, "
            "or save the adapters alone with lora.save_lora(model, path)."
        )
    bad = _first_nonfinite(state_dict.items())
    if bad is not None:
        name, count = bad
        raise ValueError(
            f"refusing to save {os.fspath(path)}: model tensor {name!r} holds {count} NaN/inf value(s) "
            "(the run has diverged: lower the learning rate or check the data); the previous file is kept."
        )
    extra = _clean(extra or {}, "extra")
    config = _config_dict(model.config)
    blob = {"format": FORMAT, "config": config, "state_dict": state_dict, "extra": extra,
            DIGEST_KEY: weights_digest(state_dict), META_DIGEST_KEY: meta_digest({"config": config, "extra": extra})}
    _atomic_save(blob, path)


def _derived_rope_scaling(config: MiniMindConfig) -> Any:
    return dict(YARN_ROPE_SCALING) if config.inference_rope_scaling else None


def _config_dict(config: MiniMindConfig) -> Dict[str, Any]:
    """``config.to_dict()``, plus ``rope_scaling`` when it was set by hand (the constructor derives
    it from ``inference_rope_scaling``, so ``to_dict`` leaves it out and a custom one was lost)."""
    d = config.to_dict()
    if config.rope_scaling != _derived_rope_scaling(config):
        d["rope_scaling"] = dict(config.rope_scaling) if config.rope_scaling is not None else None
    return d


def _config_from_dict(d: Mapping[str, Any], overrides: Mapping[str, Any]) -> MiniMindConfig:
    """The config a file recorded (``_config_dict``), with ``overrides``; a hand-set ``rope_scaling`` is restored."""
    d = dict(d)
    if "inference_rope_scaling" in overrides and "rope_scaling" not in overrides:
        d.pop("rope_scaling", None)  # the caller chose the derived setting
    d.update(overrides)
    has_scaling = "rope_scaling" in d
    scaling = d.pop("rope_scaling", None)
    config = MiniMindConfig(**d)
    if has_scaling and scaling != config.rope_scaling:
        if scaling is not None:
            validate_rope_scaling(scaling)
        config.rope_scaling = scaling
    return config


def _unwrap(model: Any) -> Any:
    """The model inside ``DistributedDataParallel`` (``.module``) or ``torch.compile`` (``._orig_mod``)."""
    for _ in range(8):
        if hasattr(model, "config") and isinstance(model, torch.nn.Module):
            break
        inner = getattr(model, "_orig_mod", None)
        if inner is None:
            inner = getattr(model, "module", None)
        if not isinstance(inner, torch.nn.Module):
            break
        model = inner
    if not (isinstance(model, torch.nn.Module) and hasattr(getattr(model, "config", None), "to_dict")):
        raise TypeError(
            f"save_checkpoint saves a MiniMindForCausalLM (a module with a MiniMindConfig), got {type(model).__name__}."
        )
    return model


def _atomic_save(obj: Any, path: PathLike) -> None:
    """``torch.save`` to a temporary file in the target's folder, fsync, then ``os.replace``
    (``files.atomic_write``: a kill leaves the previous file, a full disk is a clear ``OSError``)."""
    save_torch(obj, path)


def _first_nonfinite(items: Iterable[Tuple[str, Any]]) -> Optional[Tuple[str, int]]:
    """``(name, count)`` of the first floating-point tensor with NaN/inf entries, else ``None``."""
    for name, value in items:
        if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()):
            finite = torch.isfinite(value)
            if not bool(finite.all()):
                return name, int((~finite).sum())
    return None


def _clean(value: Any, where: str) -> Any:
    """``value`` in a form weights-only loading reads back, or a ``TypeError`` naming ``where``."""
    if isinstance(value, torch.Tensor):
        bad = _first_nonfinite([(where, value)])
        if bad is not None:
            raise ValueError(f"refusing to save: {where} holds {bad[1]} NaN/inf value(s) (the run has diverged?).")
        return value
    if isinstance(value, np.generic):
        return _clean(value.item(), where)  # NumPy scalar -> the equal Python number
    if isinstance(value, np.ndarray):
        raise TypeError(
            f"{where} is a NumPy array, which weights-only loading cannot read back; store "
            "torch.as_tensor(x) or x.tolist() instead."
        )
    if isinstance(value, _PLAIN_TYPES) and type(value) in _PLAIN_TYPES:
        return value
    if isinstance(value, dict):
        cls = collections.OrderedDict if isinstance(value, collections.OrderedDict) else dict
        return cls((_clean_key(k, where), _clean(v, f"{where}[{k!r}]")) for k, v in value.items())
    if type(value) in (list, tuple, set):
        return type(value)(_clean(v, f"{where}[{i}]") for i, v in enumerate(value))
    raise TypeError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which weights-only loading cannot read "
        "back; store only tensors, numbers, strings, None and lists/tuples/dicts of them "
        "(e.g. convert it with str(x), float(x) or x.tolist())."
    )


def _clean_key(key: Any, where: str) -> Any:
    if isinstance(key, np.generic):
        return key.item()
    if type(key) in (str, int, float, bool, type(None)) or (type(key) is tuple and all(type(k) in (str, int) for k in key)):
        return key
    raise TypeError(f"{where} has a key {key!r} of type {type(key).__name__}; use str or int keys.")


# ---------------------------------------------------------------------- reading a file
def _torch_load(path: PathLike, map_location: Union[str, torch.device]) -> Any:
    """``torch.load(weights_only=True)`` with one-line errors for files that are not checkpoints."""
    path = expand(path)
    if isinstance(map_location, str):
        try:
            torch.device(map_location)
        except RuntimeError:
            raise ValueError(f"map_location={map_location!r} is not a device: use 'cpu', 'cuda', 'cuda:0' or 'mps' (or a "
                             "torch.device).") from None
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a folder; pass the checkpoint file in it, e.g. {os.path.join(path, 'ckpt.pt')}.")
    if os.path.getsize(path) == 0:
        raise ValueError(f"{path} is not a checkpoint: the file is empty (0 bytes; an interrupted copy or save?).")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except (PermissionError, FileNotFoundError, IsADirectoryError, MemoryError):
        raise  # the system's own message says it best
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        if found:  # a real pickle that wants to build a Python object: refuse, never run it
            raise ValueError(
                f"{path} holds a Python object ({found.group(1)}) besides tensors, numbers and containers; "
                "minimind_ref reads weights only and will not unpickle it, because unpickling can run code. "
                "Use files written by minimind_ref (save_checkpoint, save_lora) or a torch.save of plain tensors, such as torch.save(model.state_dict(), path)."
            ) from None
        raise ValueError(f"{path} is not a checkpoint: {_NOT_TORCH_SAVE}") from None
    except (EOFError, KeyError, ValueError, UnicodeDecodeError, OSError):  # truncated, random bytes, text, ...
        raise ValueError(f"{path} is not a checkpoint: {_NOT_TORCH_SAVE}") from None
    except RuntimeError as err:
        if any(word in str(err) for word in ("PytorchStreamReader", "zip archive", "archive is corrupted")):
            raise ValueError(f"{path} is not a checkpoint: {_NOT_TORCH_SAVE}") from None
        raise  # e.g. map_location: a real checkpoint that cannot go where it was asked


_NOT_TORCH_SAVE = "its bytes are not a complete torch.save file (truncated, corrupted, or another format)."


# ---------------------------------------------------------------------- config from shapes
def _weight(state_dict: Mapping[str, Any], key: str, needed_for: str) -> torch.Tensor:
    if key not in state_dict:
        raise ValueError(
            f"state dict has no {key!r} (needed for {needed_for}); not a MiniMind state dict, or a "
            f"partial one. First keys: {list(state_dict)[:5]}."
        )
    tensor = state_dict[key]
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 2:
        raise ValueError(f"{key!r} must be a 2-D weight matrix, got {getattr(tensor, 'shape', type(tensor).__name__)}.")
    return tensor


def infer_config(state_dict: Mapping[str, torch.Tensor], *, source: PathLike = "the state dict",
                 **overrides: Any) -> MiniMindConfig:
    """Rebuild a config from the tensor shapes of an upstream state dict; ``overrides`` win.

    **Read from the shapes:** ``vocab_size``, ``hidden_size``, ``num_hidden_layers``,
    ``intermediate_size``, ``use_moe``, ``n_routed_experts``, ``n_shared_experts``, and the key/value
    width ``num_key_value_heads * head_dim``.

    **Not in the shapes**, so given in ``overrides`` or assumed:

    * ``num_attention_heads``: ``q_proj`` is ``[hidden, hidden]`` whatever the head count. Given
      ``num_attention_heads`` (or ``num_key_value_heads``), the other follows from the key/value
      width. Given neither, upstream's 8 heads / 2 KV heads are assumed only when the width is
      that layout's (``k_proj`` rows = ``hidden_size / 4``); any other width fits several head
      counts, and a ``ValueError`` asks for ``num_attention_heads``. (A model with another head
      count whose width happens to equal ``hidden_size / 4``, e.g. 4 heads with 1 KV head, cannot
      be told apart from upstream's: pass its config.)
    * ``num_experts_per_tok`` (MoE top-k): the weights of a top-1 and a top-2 MoE are alike, so a
      MoE state dict needs it (upstream's MiniMind2-MoE uses 2).
    * everything without a tensor (``rope_theta``, ``max_position_embeddings``, ``rms_norm_eps``,
      ``hidden_act``, ``norm_topk_prob``, ``aux_loss_alpha``, ...): upstream's defaults.

    **The generation is read from the keys.** A state dict with ``self_attn.q_norm.weight`` is
    minimind-3's (d65ef2c: only its ``Attention`` has QK-norm), and then the shapes say more:
    ``head_dim`` is the length of ``q_norm``, the head counts are ``q_proj`` rows / ``head_dim``
    and ``k_proj`` rows / ``head_dim`` (no assumption needed), experts come without shared ones,
    and only the MoE top-k is still not in the weights (minimind-3-moe uses 1). Without ``q_norm``
    it is MiniMind2's (c090b69).

    **The head, in both generations:** ``head_tying``'s rule. No ``lm_head.weight``, or one equal
    to the embedding, is a tied model; a head of its own (it shares at most 1 % of its entries
    with the embedding) an untied one (``tie_word_embeddings=False``); a head equal to the
    embedding in most entries but not all is a ``ValueError`` asking for ``tie_word_embeddings``.
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"infer_config reads a state dict (a mapping of names to tensors), got {type(state_dict).__name__}.")
    overrides = dict(overrides)
    vocab_size, hidden_size = _weight(state_dict, "model.embed_tokens.weight", "vocab_size and hidden_size").shape
    layers = {int(k.split(".")[2]) for k in state_dict if k.startswith("model.layers.") and k.split(".")[2].isdigit()}
    if not layers or layers != set(range(len(layers))):
        raise ValueError(f"state dict layers must be numbered 0..N-1 under 'model.layers.', found {sorted(layers)[:10]}.")
    kv_width = _weight(state_dict, "model.layers.0.self_attn.k_proj.weight", "num_key_value_heads").shape[0]
    minimind3 = _QK_NORM_KEY in state_dict
    if minimind3:
        heads, kv_heads, head_dim = _infer_heads_qk_norm(state_dict, overrides.pop("num_attention_heads", None),
                                                         overrides.pop("num_key_value_heads", None))
    else:
        heads, kv_heads = _infer_heads(hidden_size, kv_width, overrides.pop("num_attention_heads", None),
                                       overrides.pop("num_key_value_heads", None))
    use_moe = any(".mlp.experts." in k for k in state_dict)
    if use_moe:
        ffn_key = "model.layers.0.mlp.experts.0.gate_proj.weight"
        n_routed = len({k.split(".")[5] for k in state_dict if k.startswith("model.layers.0.mlp.experts.")})
        n_shared = len({k.split(".")[5] for k in state_dict if k.startswith("model.layers.0.mlp.shared_experts.")})
        if "num_experts_per_tok" not in overrides:
            raise ValueError(
                f"this is a MoE state dict ({n_routed} routed experts), and how many experts each token uses "
                "(top-k) is not in the weights: pass num_experts_per_tok (upstream's MiniMind2-MoE uses 2, "
                "minimind-3-moe 1)."
            )
    else:
        ffn_key = "model.layers.0.mlp.gate_proj.weight"
        n_routed, n_shared = (4, 0) if minimind3 else (4, 1)
    kwargs: Dict[str, Any] = dict(
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=len(layers),
        num_attention_heads=heads, num_key_value_heads=kv_heads,
        intermediate_size=_weight(state_dict, ffn_key, "intermediate_size").shape[0], use_moe=use_moe,
        n_routed_experts=n_routed, n_shared_experts=n_shared,
    )
    kwargs["tie_word_embeddings"] = head_tying(state_dict, overrides.pop("tie_word_embeddings", None), source,
                                               forced=True)
    if minimind3:
        kwargs.update(generation="minimind-3",
                      head_dim=None if head_dim * heads == hidden_size else head_dim)  # None: the default rule
        if use_moe:  # the experts' width is moe_intermediate_size; the dense width (unused) keeps its rule
            rule = MiniMindConfig(generation="minimind-3", hidden_size=hidden_size).intermediate_size
            width = kwargs.pop("intermediate_size")
            kwargs["moe_intermediate_size"] = None if width == rule else width
    kwargs.update(overrides)
    return MiniMindConfig(**kwargs)


#: Only minimind-3's attention (d65ef2c) has this key; MiniMind2's (c090b69) has no QK-norm.
_QK_NORM_KEY = "model.layers.0.self_attn.q_norm.weight"


def _infer_heads_qk_norm(state_dict: Mapping[str, Any], heads: Optional[int],
                         kv_heads: Optional[int]) -> Tuple[int, int, int]:
    """``(num_attention_heads, num_key_value_heads, head_dim)`` of a minimind-3 state dict: ``q_norm``
    is ``[head_dim]``, ``q_proj`` ``[heads * head_dim, hidden]``, ``k_proj`` ``[kv_heads * head_dim, hidden]``."""
    q_norm = state_dict[_QK_NORM_KEY]
    if not isinstance(q_norm, torch.Tensor) or q_norm.dim() != 1:
        raise ValueError(f"{_QK_NORM_KEY!r} must be a 1-D gain of head_dim values, got "
                         f"{getattr(q_norm, 'shape', type(q_norm).__name__)}.")
    head_dim = q_norm.shape[0]
    q_rows = _weight(state_dict, "model.layers.0.self_attn.q_proj.weight", "num_attention_heads").shape[0]
    kv_rows = _weight(state_dict, "model.layers.0.self_attn.k_proj.weight", "num_key_value_heads").shape[0]
    if head_dim == 0 or q_rows % head_dim or kv_rows % head_dim:
        raise ValueError(f"q_proj ({q_rows} rows) and k_proj ({kv_rows} rows) are not whole heads of q_norm's "
                         f"head_dim {head_dim}; not a minimind-3 state dict, or a damaged one.")
    found = (q_rows // head_dim, kv_rows // head_dim)
    for name, given, value in (("num_attention_heads", heads, found[0]), ("num_key_value_heads", kv_heads, found[1])):
        if given is not None and given != value:
            raise ValueError(f"{name}={given!r} disagrees with the weights: q_norm gives head_dim {head_dim}, so "
                             f"the projections hold {value} such heads. Drop {name} (minimind-3's shapes hold it).")
    return found[0], found[1], head_dim


def _infer_heads(hidden: int, kv_width: int, heads: Optional[int], kv_heads: Optional[int]) -> Tuple[int, int]:
    """``(num_attention_heads, num_key_value_heads)`` from the widths and what the caller gave."""
    fix = "pass the model's num_attention_heads (and num_key_value_heads), or load with its config"
    if heads is not None:
        if not isinstance(heads, int) or heads <= 0 or hidden % heads:
            raise ValueError(f"num_attention_heads={heads!r} does not divide hidden_size {hidden}.")
        head_dim = hidden // heads
        if kv_width % head_dim:
            raise ValueError(
                f"the shapes do not fit num_attention_heads={heads}: k_proj has {kv_width} rows, not a multiple of "
                f"head_dim = {hidden} // {heads} = {head_dim}; {fix}."
            )
        if kv_heads is not None and kv_heads * head_dim != kv_width:
            raise ValueError(
                f"num_key_value_heads={kv_heads} with head_dim {head_dim} gives {kv_heads * head_dim} k_proj rows, "
                f"the weights have {kv_width}; {fix}."
            )
        return heads, kv_width // head_dim
    if kv_heads is not None:
        if not isinstance(kv_heads, int) or kv_heads <= 0 or kv_width % kv_heads or hidden % (kv_width // kv_heads):
            raise ValueError(
                f"the shapes do not fit num_key_value_heads={kv_heads!r}: k_proj has {kv_width} rows for hidden_size "
                f"{hidden}; {fix}."
            )
        return hidden // (kv_width // kv_heads), kv_heads
    if hidden % 8 == 0 and kv_width == 2 * (hidden // 8):
        return 8, 2  # upstream's layout (8 query heads, 2 KV heads): assumed, as upstream's scripts do
    raise ValueError(
        f"the head count is not in the weights: k_proj has {kv_width} rows for hidden_size {hidden}, which is not "
        f"upstream's layout (8 heads, 2 KV heads: {hidden // 4} rows) and fits several head counts; {fix}."
    )


# ---------------------------------------------------------------------- tied or untied head
#: A stored ``lm_head.weight`` is a head of its own (an untied model's) when at most this share of
#: its entries equals the embedding's: an independently trained head shares (almost) none. A head
#: equal to the embedding in more entries, but not in all, is a tied model's copy that was changed
#: (a damaged file, an edit) or an untied head barely trained: the weights do not say which.
UNTIED_MAX_SHARED = 0.01

_HEAD_KEY, _EMBED_KEY = "lm_head.weight", "model.embed_tokens.weight"


def head_tying(state_dict: Mapping[str, Any], declared: Optional[bool] = None, source: PathLike = "the state dict",
               declared_by: str = "tie_word_embeddings", forced: bool = False) -> bool:
    """Whether the model of ``state_dict`` ties ``lm_head`` to the embedding: one rule for every
    loader (bare state dicts, ``load_checkpoint``, ``.pth`` files, Hugging Face folders) and both
    generations.

    ``declared`` is what a config says (``None``: nothing says it, as for a bare state dict or
    ``.pth``); ``declared_by`` names it in messages; ``forced`` marks the caller's own keyword
    ``tie_word_embeddings=...``. What the weights say wins when it is unambiguous:

    ==============================  ==========  ==========================  ============================
    stored ``lm_head.weight``       nothing     declared tied               declared untied
                                    declared
    ==============================  ==========  ==========================  ============================
    none                            tied        tied                        ``ValueError`` (no head)
    equal to the embedding          tied        tied                        untied (a copy; honoured)
    its own matrix (<= 1 % equal)   untied      ``ValueError`` (forced:     untied
                                                tied, warns: head dropped)
    a changed copy (> 1 % equal)    ValueError  ValueError (forced: tied,   untied
                                                warns: head dropped)
    ==============================  ==========  ==========================  ============================

    A ``ValueError`` says what to pass; nothing ever replaces a trained head with the embedding,
    or unties a model, without a word."""
    if declared is not None and not isinstance(declared, bool):
        raise TypeError(f"tie_word_embeddings must be True, False or None (read it from the weights), got {declared!r}.")
    source = os.fspath(source)
    embed, head = state_dict.get(_EMBED_KEY), state_dict.get(_HEAD_KEY)
    if not isinstance(head, torch.Tensor):
        if declared is False:
            raise ValueError(f"{source} holds no {_HEAD_KEY}, so its head is the embedding (a tied model), but "
                             f"{declared_by} says tie_word_embeddings=False. Load it tied (tie_word_embeddings=True, or "
                             "leave it out).")
        return True
    if not isinstance(embed, torch.Tensor) or head.shape != embed.shape:
        return False if declared is None else declared  # the shapes are checked when the weights load
    equal = head == embed
    n_equal, n = int(equal.sum()), equal.numel()
    if n_equal == n:
        return True if declared is None else declared
    if declared is False:
        return False
    largest = float((head.float() - embed.float()).abs().max())
    what = (f"{source}: {_HEAD_KEY} differs from {_EMBED_KEY} in {n - n_equal:,} of {n:,} entries (largest |difference| "
            f"{largest:.3g})")
    if declared is True and forced:
        warnings.warn(f"{what}; tie_word_embeddings=True makes the embedding the head too, so the stored head is "
                      "dropped.", stacklevel=3)
        return True
    keep_head = "pass tie_word_embeddings=False to load it untied, with its own head"
    if declared is True:
        raise ValueError(f"{what}, but {declared_by} says tie_word_embeddings=True: loading it tied would replace the "
                         f"trained head with the embedding. If the model was trained with an untied head, {keep_head}; "
                         "to use the embedding for both, pass tie_word_embeddings=True yourself (the stored head is "
                         "dropped, with a warning).")
    if n_equal > UNTIED_MAX_SHARED * n:
        raise ValueError(f"{what}, but equals it in the other {n_equal:,}: a tied model's head that was changed (a "
                         "damaged file, an edit) or an untied head barely trained; the weights do not say which. If "
                         f"the model has an untied head, {keep_head}; if it is a tied model, pass "
                         "tie_word_embeddings=True (the embedding becomes the head; the stored one is dropped).")
    return False


def tied_state(state_dict: Mapping[str, torch.Tensor], tied: bool, source: PathLike = "the state dict"
               ) -> Dict[str, torch.Tensor]:
    """``state_dict`` as a model with ``tie_word_embeddings=tied`` loads it (after ``head_tying``):
    tied, ``lm_head.weight`` is the embedding (filled in when missing: transformers drops the tied
    duplicate from safetensors); untied, the stored head must be there."""
    state = dict(state_dict)
    if tied and _EMBED_KEY in state:
        state[_HEAD_KEY] = state[_EMBED_KEY]
    elif not tied and _HEAD_KEY not in state:
        raise ValueError(f"{os.fspath(source)}: the config says tie_word_embeddings=False, but there is no {_HEAD_KEY}.")
    return state


# ---------------------------------------------------------------------- loading
def check_weights(state_dict: Mapping[str, torch.Tensor], source: PathLike, check_finite: bool = True,
                  digest: Optional[str] = None) -> None:
    """The checks every loader runs on the weights it read, whatever the file format.

    * ``digest`` (the ``weights_sha256`` a ``save_checkpoint`` file recorded; ``None`` for files
      without one): the weights must hash to it, else the file was changed after it was saved;
    * ``check_finite``: no NaN or inf in any floating-point tensor.

    Raises ``ValueError`` naming ``source`` (and the tensor)."""
    if digest is not None:
        if not isinstance(digest, str) or weights_digest(state_dict) != digest:
            raise ValueError(
                f"{os.fspath(source)} is damaged: its weights do not match the SHA-256 digest recorded when it was "
                "saved (flipped bytes on the disk, an incomplete copy, or tensors edited by hand). Use another copy, "
                "or save or rebuild it again."
            )
    if check_finite:
        bad = _first_nonfinite(state_dict.items())
        if bad is not None:
            raise ValueError(
                f"{os.fspath(source)} holds non-finite weights: {bad[0]!r} has {bad[1]} NaN/inf value(s) (saved from a "
                "diverged run?); pass check_finite=False to load it anyway for inspection."
            )


def check_metadata(blob: Mapping[str, Any], source: PathLike) -> None:
    """A ``save_checkpoint`` file's config and ``extra`` must match the ``meta_sha256`` it recorded
    (files without one pass): a changed number there (a flipped byte, a hand edit) would change
    the model or the figures it reports without a word."""
    recorded = blob.get(META_DIGEST_KEY)
    if recorded is not None and recorded != meta_digest({"config": blob.get("config"), "extra": blob.get("extra")}):
        raise ValueError(
            f"{os.fspath(source)} is damaged: its config or metadata do not match the SHA-256 digest recorded when it "
            "was saved (flipped bytes on the disk, an incomplete copy, or values edited by hand). Use another copy, or "
            "save or rebuild it again."
        )


def tokenizer_size(tokenizer: Any) -> int:
    """How many ids ``tokenizer`` can produce (``get_vocab_size()`` or ``len()``)."""
    if hasattr(tokenizer, "get_vocab_size"):
        return int(tokenizer.get_vocab_size())
    return len(tokenizer)


def check_tokenizer_fits(config: MiniMindConfig, tokenizer: Any, source: PathLike = "the model") -> None:
    """A model and a tokenizer belong together when every id the tokenizer produces has a row in
    the embedding and the embedding is not bigger than the tokenizer rounded up to a multiple of
    128 (room some models keep for padding); MiniMind's are equal (6,400). ``ValueError`` otherwise:
    the ids would mean other tokens, or index past the embedding."""
    n = tokenizer_size(tokenizer)
    vocab = config.vocab_size
    if n > vocab or vocab > -(-n // 128) * 128:
        raise ValueError(
            f"{os.fspath(source)} has a vocabulary of {vocab} tokens but the tokenizer has {n}: they were not trained "
            "together (token ids would mean other tokens"
            + (", and some would index past the embedding" if n > vocab else "")
            + "). Use the tokenizer that was saved with these weights."
        )


def load_state_dict_strict(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """``load_state_dict(strict=True)`` with a readable ``ValueError`` listing every missing key,
    unexpected key and shape mismatch (and a hint), instead of PyTorch's RuntimeError."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    mismatched = [
        f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in expected
        if k in state_dict and tuple(state_dict[k].shape) != tuple(expected[k].shape)
    ]
    head, embed = state_dict.get(_HEAD_KEY), state_dict.get(_EMBED_KEY)
    model_head = getattr(getattr(model, "lm_head", None), "weight", None)
    model_embed = getattr(getattr(getattr(model, "model", None), "embed_tokens", None), "weight", None)
    if (model_head is not None and model_head is model_embed and isinstance(head, torch.Tensor)
            and isinstance(embed, torch.Tensor) and head.shape == embed.shape and not torch.equal(head, embed)):
        raise ValueError(f"the model ties lm_head to the embedding (one matrix), but the state dict's {_HEAD_KEY} and "
                         f"{_EMBED_KEY} differ: loading would keep one and silently drop the other. Build the model "
                         "with tie_word_embeddings=False to keep both (load_checkpoint says what the file holds).")
    if missing or unexpected or mismatched:
        lines = ["the checkpoint does not match the model:"]
        for title, items in (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", mismatched)):
            if items:
                shown = ", ".join(items[:8]) + (f", ... ({len(items)} in all)" if len(items) > 8 else "")
                lines.append(f"  {title}: {shown}")
        if any(".lora." in k for k in unexpected):
            lines.append("  hint: the file holds unmerged LoRA adapters (a LoRA run's checkpoint, or a file saved before "
                         "save_checkpoint refused them): apply_lora(model, rank) with the file's rank first; to resume "
                         "the run, pass that model to train(); to keep the result, merge_lora(model) and save that.")
        elif any(".mlp.experts." in k for k in unexpected) or any(".mlp.experts." in k for k in missing):
            lines.append("  hint: one side is a MoE model; set use_moe to match the checkpoint.")
        else:
            lines.append("  hint: build the model from the checkpoint's config (load_checkpoint does this) "
                         "or fix hidden_size / num_hidden_layers / num_key_value_heads.")
        raise ValueError("\n".join(lines))
    model.load_state_dict(state_dict, strict=True)


def load_checkpoint(
    path: PathLike,
    config: Optional[MiniMindConfig] = None,
    map_location: Union[str, torch.device] = "cpu",
    dtype: Optional[torch.dtype] = torch.float32,
    check_finite: bool = True,
    **config_overrides: Any,
) -> MiniMindForCausalLM:
    """Load a model from an upstream ``.pth`` state dict or a ``save_checkpoint`` file.

    The config comes from ``config`` if given, else from the file (course format), else it is
    inferred from the tensor shapes (upstream format; see ``infer_config`` for what shapes cannot
    tell); ``config_overrides`` change single fields of it. Weights are cast to ``dtype``
    (upstream ships fp16); pass ``dtype=None`` to keep them. The model is returned in eval mode.

    A file that is not a checkpoint (empty, truncated, random bytes) or that holds Python objects
    besides tensors is a one-line ``ValueError``; nothing in it is ever executed. A file whose
    weights no longer match the digest ``save_checkpoint`` recorded is a ``ValueError``. Weights holding
    NaN or inf are a ``ValueError`` naming the tensor; ``check_finite=False`` loads them anyway
    (to inspect a diverged model).
    """
    if config is not None and not isinstance(config, MiniMindConfig):
        raise TypeError(f"config must be a MiniMindConfig, got {type(config).__name__}.")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating-point torch.dtype (torch.float32, torch.bfloat16, ...) or None, got "
                        f"{dtype!r}: weights cast to it would lose their fractions.")
    blob = _torch_load(path, map_location)
    declared_by = "the config you passed" if config is not None else f"the config saved in {os.fspath(path)}"
    if "tie_word_embeddings" in config_overrides:
        declared_by = "your tie_word_embeddings"
    if isinstance(blob, dict) and blob.get("format") == FORMAT:
        if not isinstance(blob.get("state_dict"), dict) or not isinstance(blob.get("config"), dict):
            raise ValueError(f"{os.fspath(path)} is a damaged minimind_ref checkpoint: its 'state_dict' or 'config' is missing.")
        state_dict = blob["state_dict"]
        check_metadata(blob, path)
        if config is None:
            config = _config_from_dict(blob["config"], config_overrides)
        elif config_overrides:
            config = config.replace(**config_overrides)
    elif isinstance(blob, dict) and blob and all(isinstance(v, torch.Tensor) for v in blob.values()):
        if all(".lora." in k or k in ("lora_scale", "lora_base_sample") for k in blob):  # lora.SCALE_KEY, lora.BASE_KEY
            raise ValueError(f"{os.fspath(path)} holds LoRA adapters only (a save_lora file), not a model: apply_lora("
                             "model, rank) to the model they were trained on, then lora.load_lora(model, path).")
        state_dict = blob
        if config is None:  # infer_config applies head_tying's rule (the weights decide, or the keyword)
            config = infer_config(state_dict, source=path, **config_overrides)
            declared_by = None
        elif config_overrides:
            config = config.replace(**config_overrides)
    else:
        raise ValueError(f"{os.fspath(path)} is neither an upstream MiniMind state dict nor a minimind_ref checkpoint.")
    check_weights(state_dict, path, check_finite, blob.get(DIGEST_KEY) if blob.get("format") == FORMAT else None)
    if declared_by is not None:  # a config says tied or untied: it must agree with the weights (head_tying)
        head_tying(state_dict, config.tie_word_embeddings, path, declared_by,
                   forced="tie_word_embeddings" in config_overrides)
    state_dict = tied_state(state_dict, config.tie_word_embeddings, path)
    # RoPE tables are recomputed, never loaded (upstream marks them non-persistent)
    state_dict = {k: v for k, v in state_dict.items() if not k.endswith(("freqs_cos", "freqs_sin"))}
    if dtype is not None:
        state_dict = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state_dict.items()}
    model = MiniMindForCausalLM(config)
    load_state_dict_strict(model, state_dict)
    return model.to(map_location).eval()


# ---------------------------------------------------------------------- upstream's outputs, shipped
#: Outputs of upstream's own code that ship with the package (``tools/upstream_fixtures.py --example``).
REFERENCE_OUTPUTS_DIR = Path(__file__).with_name("reference_outputs")


def upstream_reference_outputs(name: str = "upstream_minimind3") -> Dict[str, Any]:
    """A small file made by running upstream's own code, shipped as package data.

    ``"upstream_minimind3"`` (made from upstream's ``model/model_minimind.py`` at d65ef2c): ``cases``
    maps ``"minimind-3"`` (dense) and ``"minimind-3-moe"`` to ``{"config": upstream's keyword
    arguments, "state_dict": fp16 weights with upstream's keys, "input_ids": [2, 10], "logits":
    upstream's fp32 eval logits [2, 10, vocab], "greedy_ids" / "greedy_penalty_ids": [2, 18], the ids
    plus 8 tokens from upstream's own greedy ``generate``, repetition penalty 1.0 / 1.3}`` (tiny models with minimind-3's head layout and
    width rule); ``parameter_counts`` holds what upstream's code counts for its two default
    configurations; ``note`` says how the file was made. Read with ``weights_only=True``."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name must be the name of a shipped file (e.g. 'upstream_minimind3'), got {name!r}.")
    path = REFERENCE_OUTPUTS_DIR / f"{name}.pt"
    if not path.is_file():
        shipped = sorted(p.stem for p in REFERENCE_OUTPUTS_DIR.glob("*.pt"))
        raise ValueError(f"no shipped reference outputs named {name!r}; available: {shipped}.")
    return _torch_load(path, "cpu")
