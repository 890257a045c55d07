"""Hugging Face interop, both generations: a dense MiniMind2 model *is* a Llama model with tied
embeddings, and a minimind-3 model *is* a Qwen3 (dense) or Qwen3-MoE model.

    hf_model = to_hf(model)              # LlamaForCausalLM (MiniMind2), Qwen3ForCausalLM or
                                         # Qwen3MoeForCausalLM (minimind-3), same weights
    model = from_hf(hf_model)            # and back
    to_hf_llama(model), from_hf_llama(hf_model)   # the MiniMind2 path by name

Needs the optional extra ``pip install minimind-ref[hf]`` (``transformers``). The state-dict
keys are identical (upstream kept transformers' names: d65ef2c's ``scripts/convert_model.py``
loads its ``.pth`` into ``Qwen3ForCausalLM`` with ``strict=True``,
``d65ef2c:scripts/convert_model.py:81``), so conversion is a config
translation plus ``load_state_dict`` (and, for a live transformers-5 Qwen3-MoE, fusing the experts).
Not convertible: MiniMind2's MoE (Llama has no experts,
Qwen3-MoE no shared expert and another router), YaRN-scaled RoPE (transformers' YaRN computes
different frequencies and attention factor than MiniMind's), and QK-norm without Qwen3.

minimind-3 field by field (``QWEN3_FIELDS``, ``QWEN3_MOE_FIELDS``):

==================================  ======================================  ======================================
``MiniMindConfig`` (d65ef2c names)  ``Qwen3Config`` / ``Qwen3MoeConfig``    note
==================================  ======================================  ======================================
``head_dim``                        ``head_dim``                            a free field in both (transformers'
                                                                            default: 128 for Qwen3, hidden / heads
                                                                            for Qwen3-MoE; always written)
``qk_norm=True``                    (always)                                Qwen3Attention: ``q_norm``/``k_norm``
                                                                            over head_dim, after the projection,
                                                                            before RoPE, as in minimind-3
``rms_norm_eps``                    ``rms_norm_eps``                        1e-6 in both
``rms_norm_cast_after_weight``      (none)                                  Qwen3RMSNorm casts *before* the gain
                                                                            (MiniMind2's order): same in fp32,
                                                                            rounding differs in bf16/fp16
``tie_word_embeddings``             ``tie_word_embeddings``                 transformers' default is false
``rope_theta``                      ``rope_theta`` (4.x), its key in        no scaling (``rope_type`` default)
                                    ``rope_parameters`` (5.x)
``flash_attn``                      ``attn_implementation``                 ``"sdpa"`` / ``"eager"``
``num_experts`` (n_routed_experts)  ``num_experts`` (4.x),                  both spellings read; both present
                                    ``num_local_experts`` (5.x)             and different is an error
``num_experts_per_tok``             ``num_experts_per_tok``                 top-k
``norm_topk_prob``                  ``norm_topk_prob``                      transformers' default is false; both
                                                                            renormalize even for k = 1
``moe_intermediate_size``           ``moe_intermediate_size``               width of every expert
``router_aux_loss_coef``            ``router_aux_loss_coef``                same name; the *loss* differs: Qwen3-MoE
                                                                            averages loads over all layers before
                                                                            the product, minimind-3 sums per layer
``mlp.experts.{e}.gate_proj`` ...   4.x: the same keys; 5.x (live model):   ``fuse_experts`` /
                                    two fused 3-D parameters                ``split_fused_experts`` (a folder
                                    ``experts.gate_up_proj`` (gate rows     may hold either layout; transformers
                                    first) and ``experts.down_proj``        5 saves per-expert keys)
every layer MoE                     ``decoder_sparse_step=1``,
                                    ``mlp_only_layers=[]``
``n_shared_experts=0``              (no shared expert)                      refused when > 0
(full causal attention)             ``use_sliding_window=False``,           Qwen3 can slide a window over some
                                    ``layer_types`` all ``full_attention``  layers; refused when it would
``dropout``                         ``attention_dropout``                   training only; MiniMind's also drops
                                                                            residuals and embeddings
==================================  ======================================  ======================================

With the same weights the logits agree to float rounding in fp32 (``tests/test_hf.py``: 1e-5);
Qwen3-MoE picks its top-k in sorted order and sums in that order (the same experts).

A family implies the switches no Llama or Qwen3 config has a field for: Llama is MiniMind2's
(``generation="MiniMind2"``, RMSNorm cast before the gain, dropout on the FFN output), Qwen3
minimind-3's (cast after the gain, no FFN dropout). A model whose switches differ (MiniMind2 with
``qk_norm=True`` converted to Qwen3, minimind-3 without QK-norm converted to Llama) carries them in
the transformers config as ``minimind_switches`` (``SWITCHES_KEY``; ``save_pretrained`` writes it
into ``config.json``), and ``from_hf`` / ``load_hf_dir`` give them back, so the round trip
returns the config it started with.

Tested with transformers 4.57.6 (the pinned environment of ``make test``) and the newest release
(``make test-current``; 5.24.0 on 2026-11-27). What changed in 5.x and how this module reads both:
``rope_theta`` moved into ``rope_parameters`` (and the config's ``rope_scaling`` attribute became
that dict), the Qwen3-MoE expert count is written ``num_local_experts``, the experts of a live
Qwen3-MoE model are fused, the rotary module lost ``rope_init_fn`` (the copy rebuilds the module
instead), and ``torch_dtype`` became ``dtype`` (4.57 knows both; only ``dtype`` is used here).
Transformers 4.57 itself misreads folders written by 5.x: it ignores ``rope_parameters`` (a Llama or
Qwen3 folder then runs with its default ``rope_theta`` of 10000, other logits) and ``num_local_experts``
(a Qwen3-MoE folder fails with a size mismatch: it builds 128 experts). ``minimind_ref.load_hf_dir``
reads such folders in either environment (it needs no transformers), and ``from_hf`` refuses a model so
misread, saying why (its config then holds both spellings with different values). Folders written by
upstream's converter under transformers 5 have ``rope_theta`` (the converter rewrites it) but
``num_local_experts`` for the MoE.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from .checkpoint import load_state_dict_strict
from .config import GENERATIONS, MiniMindConfig
from .model import MiniMindForCausalLM


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError("minimind_ref.hf needs transformers: pip install 'minimind-ref[hf]'") from err
    return transformers


def _major(tf: Any) -> int:
    return int(str(tf.__version__).split(".")[0])


def _rope_kwargs(tf: Any, theta: float) -> Dict[str, Any]:
    """Unscaled RoPE in the installed transformers' own spelling (5.x: ``rope_parameters``)."""
    if _major(tf) >= 5:
        return {"rope_parameters": {"rope_type": "default", "rope_theta": float(theta)}}
    return {"rope_theta": float(theta), "rope_scaling": None}


# ---------------------------------------------------------------------- what a family implies
#: The switches each transformers family implies and has no config field for (see the module docstring).
FAMILY_SWITCHES: Dict[str, Dict[str, Any]] = {
    "llama": {"generation": "MiniMind2", "rms_norm_cast_after_weight": False, "ffn_dropout": True},
    "qwen3": {"generation": "minimind-3", "rms_norm_cast_after_weight": True, "ffn_dropout": False},
}
#: The transformers-config key that carries switches which differ from the family's.
SWITCHES_KEY = "minimind_switches"


def _switches_record(config: MiniMindConfig, family: str) -> Optional[Dict[str, Any]]:
    """``config``'s switches when they differ from what ``family`` implies, else ``None``."""
    implied = FAMILY_SWITCHES[family]
    mine = {k: getattr(config, k) for k in implied}
    return None if mine == implied else mine


def _recorded_switches(raw: Mapping[str, Any], family: str) -> Dict[str, Any]:
    """The switches of a config dict: the family's, or those ``SWITCHES_KEY`` records (checked)."""
    implied = FAMILY_SWITCHES[family]
    record = raw.get(SWITCHES_KEY)
    if record is None:
        return dict(implied)
    if not isinstance(record, Mapping) or set(record) - set(implied):
        raise ValueError(f"config field {SWITCHES_KEY} must be a dict with the keys {sorted(implied)} "
                         f"(what minimind_ref.hf.to_hf writes), got {record!r}.")
    out = {**implied, **record}
    if out["generation"] not in GENERATIONS:
        raise ValueError(f"{SWITCHES_KEY}['generation'] must be one of {GENERATIONS}, got {out['generation']!r}.")
    for key in ("rms_norm_cast_after_weight", "ffn_dropout"):
        if not isinstance(out[key], bool):
            raise ValueError(f"{SWITCHES_KEY}[{key!r}] must be true or false, got {out[key]!r}.")
    return out


def _set_switches(hf_config: Any, config: MiniMindConfig, family: str) -> Any:
    record = _switches_record(config, family)
    if record is not None:
        setattr(hf_config, SWITCHES_KEY, record)
    return hf_config


# ---------------------------------------------------------------------- RoPE fields of either major version
def rope_theta_of(raw: Mapping[str, Any]) -> Optional[float]:
    """The RoPE base of a config dict: ``rope_theta`` (transformers 4, upstream's converter) or
    ``rope_parameters["rope_theta"]`` (transformers 5); ``None`` when neither is there. Both, and
    different, is a ``ValueError``."""
    rope = _rope_parameters(raw)
    top, nested = raw.get("rope_theta"), rope.get("rope_theta")
    if top is not None and nested is not None and float(top) != float(nested):
        raise ValueError(
            f"the config gives rope_theta={top!r} and rope_parameters['rope_theta']={nested!r}: two values for one field "
            "(transformers 4 writes the first, transformers 5 the second). "
            + ("transformers 4 does not read rope_parameters, so a folder written by transformers 5 loads there with its "
               "default rope_theta of 10000 (and other logits): load the folder with minimind_ref.load_hf_dir (no "
               "transformers needed), or use transformers >= 5. " if float(top) == _QWEN3_DEFAULTS["rope_theta"] else "")
            + "Keep the value the model was trained with and delete the other.")
    theta = top if top is not None else nested
    return None if theta is None else float(theta)


def _rope_parameters(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    rope = raw.get("rope_parameters") or {}
    if not isinstance(rope, Mapping):
        raise ValueError(f"rope_parameters must be a dict (transformers 5's RoPE settings), got {rope!r}.")
    if isinstance(rope.get("full_attention"), Mapping):  # transformers 5's per-layer-type form
        rope = rope["full_attention"]
    return rope


def rope_is_scaled(raw: Mapping[str, Any]) -> bool:
    """True when a config dict asks for RoPE scaling: a ``rope_scaling`` or ``rope_parameters`` whose
    type is not ``"default"`` (transformers 5 writes ``rope_parameters`` with ``rope_type: default``
    for plain RoPE, and its config objects answer ``rope_scaling`` with that same dict)."""
    for rope in (raw.get("rope_scaling"), _rope_parameters(raw)):
        if isinstance(rope, Mapping) and rope and rope.get("rope_type", rope.get("type", "default")) != "default":
            return True
        if rope and not isinstance(rope, Mapping):
            return True
    return False


# ---------------------------------------------------------------------- MoE experts: per-expert or fused
_FUSED_GATE_UP, _FUSED_DOWN = ".mlp.experts.gate_up_proj", ".mlp.experts.down_proj"


def split_fused_experts(state: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """transformers 5's fused Qwen3-MoE experts (``mlp.experts.gate_up_proj`` ``[E, 2 * I, H]``, gate rows
    first, and ``mlp.experts.down_proj`` ``[E, H, I]``) as MiniMind's per-expert keys
    (``mlp.experts.{e}.gate_proj.weight`` ``[I, H]``, ``up_proj``, ``down_proj``); other keys unchanged."""
    out: Dict[str, torch.Tensor] = {k: v for k, v in state.items() if not k.endswith((_FUSED_GATE_UP, _FUSED_DOWN))}
    split: Dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.endswith(_FUSED_GATE_UP):
            prefix = key[: -len("gate_up_proj")]
            if value.dim() != 3 or value.shape[1] % 2:
                raise ValueError(f"{key} has shape {tuple(value.shape)}; transformers 5's fused experts are "
                                 "[experts, 2 * expert width, hidden] (gate rows, then up rows).")
            width = value.shape[1] // 2
            for e in range(value.shape[0]):
                split[f"{prefix}{e}.gate_proj.weight"] = value[e, :width]
                split[f"{prefix}{e}.up_proj.weight"] = value[e, width:]
        elif key.endswith(_FUSED_DOWN):
            prefix = key[: -len("down_proj")]
            if value.dim() != 3:
                raise ValueError(f"{key} has shape {tuple(value.shape)}; transformers 5's fused experts' down_proj is "
                                 "[experts, hidden, expert width].")
            for e in range(value.shape[0]):
                split[f"{prefix}{e}.down_proj.weight"] = value[e]
    twice = sorted(set(split) & set(out))
    if twice:
        raise ValueError(f"{twice[0]} is stored twice: per expert and inside a fused tensor (mlp.experts.gate_up_proj / "
                         "down_proj); a folder holds one layout or the other.")
    out.update(split)
    return out


def check_fused_experts(state: Mapping[str, torch.Tensor], config: MiniMindConfig, source: Any) -> None:
    """``ValueError`` naming the fused key (``mlp.experts.gate_up_proj`` / ``down_proj``) whose shape is not
    what ``config`` says: ``[experts, 2 * expert width, hidden]`` and ``[experts, hidden, expert width]``.
    A tensor with the last two dimensions swapped is called transposed, one with another first dimension
    another expert count. ``source`` names the folder. (Checked before ``split_fused_experts``, whose
    per-expert keys the file does not hold.)"""
    n, hidden, width = config.n_routed_experts, config.hidden_size, config.expert_intermediate_size
    for key, value in state.items():
        if key.endswith(_FUSED_GATE_UP):
            want, layout = (n, 2 * width, hidden), "[experts, 2 * expert width, hidden] (gate rows, then up rows)"
        elif key.endswith(_FUSED_DOWN):
            want, layout = (n, hidden, width), "[experts, hidden, expert width]"
        else:
            continue
        got = tuple(value.shape)
        if got == want:
            continue
        if len(got) == 3 and got[1:] == want[1:]:
            why = (f"it holds {got[0]} experts, the config {n} (num_experts / num_local_experts): set the count the "
                   "weights hold")
        elif len(got) == 3 and got[0] == n and got[1:] == want[:0:-1]:
            why = (f"its last two dimensions are swapped ({got[1]} x {got[2]} instead of {want[1]} x {want[2]}): "
                   "transposed when it was written; transformers 5 stores it as " + layout)
        else:
            why = f"expected {want}, the layout {layout} with the config's sizes"
        raise ValueError(f"{source}: the fused expert tensor {key} has shape {got}: {why}.")


def fuse_experts(state: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """MiniMind's per-expert keys as transformers 5's fused Qwen3-MoE parameters (``split_fused_experts``
    undone); other keys unchanged."""
    out: Dict[str, torch.Tensor] = {}
    experts: Dict[str, Dict[int, Dict[str, torch.Tensor]]] = {}
    for key, value in state.items():
        head, sep, tail = key.partition(".mlp.experts.")
        parts = tail.split(".")
        if sep and len(parts) == 3 and parts[0].isdigit() and parts[2] == "weight":
            experts.setdefault(head + sep, {}).setdefault(int(parts[0]), {})[parts[1]] = value
        else:
            out[key] = value
    for prefix, per_expert in experts.items():
        order = sorted(per_expert)
        if order != list(range(len(order))):
            raise ValueError(f"{prefix}: expert numbers {order} are not 0..{len(order) - 1}.")
        rows = [per_expert[e] for e in order]
        out[prefix + "gate_up_proj"] = torch.stack([torch.cat([r["gate_proj"], r["up_proj"]], dim=0) for r in rows])
        out[prefix + "down_proj"] = torch.stack([r["down_proj"] for r in rows])
    return out


# ---------------------------------------------------------------------- MiniMind2 <-> Llama
def to_hf_llama_config(config: MiniMindConfig) -> Any:
    """The ``transformers.LlamaConfig`` that describes the same dense network."""
    if config.use_moe:
        raise ValueError("MoE models have no Llama equivalent; to_hf_llama supports dense MiniMind models only.")
    if config.qk_norm:
        raise ValueError("qk_norm=True (minimind-3) has no Llama equivalent: Llama does not normalize queries and keys. "
                         "Use minimind_ref.hf.to_hf, which converts minimind-3 to transformers' Qwen3ForCausalLM.")
    if not config.tie_word_embeddings:
        raise ValueError("tie_word_embeddings=False: the Llama path is MiniMind2's, whose head is the embedding. "
                         "Use minimind_ref.hf.to_hf (Qwen3 keeps an untied head) with qk_norm=True, or tie the weights.")
    if config.rope_scaling is not None:
        raise ValueError(
            "YaRN-scaled RoPE (inference_rope_scaling=True) is not converted: transformers' YaRN uses a different "
            "frequency ramp and attention factor. Convert the model with inference_rope_scaling=False."
        )
    tf = _transformers()
    hf_config = tf.LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        hidden_act=config.hidden_act,
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=config.dropout,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        # MiniMind's flash_attn switch is transformers' attention implementation (sdpa or eager)
        attn_implementation="sdpa" if config.flash_attn else "eager",
        **_rope_kwargs(tf, config.rope_theta),
    )
    return _set_switches(hf_config, config, "llama")


def to_hf_llama(model: MiniMindForCausalLM) -> Any:
    """A ``transformers.LlamaForCausalLM`` holding copies of ``model``'s weights (eval mode, same dtype)."""
    if not isinstance(model, MiniMindForCausalLM):
        raise TypeError(
            f"to_hf_llama converts a minimind_ref.MiniMindForCausalLM, got {type(model).__name__}"
            + (" (unwrap it: model.module)" if hasattr(model, "module") else "") + "."
        )
    tf = _transformers()
    hf_config = to_hf_llama_config(model.config)
    hf_config.dtype = model.lm_head.weight.dtype  # (torch_dtype is deprecated since transformers 4.56)
    return _copy_into(tf.LlamaForCausalLM, hf_config, model)


def _copy_into(cls: Any, hf_config: Any, model: MiniMindForCausalLM) -> Any:
    """A transformers ``cls`` built from ``hf_config`` on the meta device, filled with copies of
    ``model``'s weights (the same names; experts fused where the installed transformers fuses them),
    tied as ``model`` is, in eval mode, same dtype and device."""
    with torch.device("meta"):
        hf_model = cls(hf_config)
    hf_model = hf_model.to_empty(device=model.device)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if any(k.endswith(_FUSED_GATE_UP) for k in hf_model.state_dict()):  # transformers 5's Qwen3-MoE
        state = fuse_experts(state)
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise ValueError(f"weight names do not line up: missing {missing}, unexpected {unexpected}")
    if model.config.tie_word_embeddings:
        hf_model.tie_weights()
    # The RoPE tables are non-persistent buffers that to_empty() left uninitialised: build the rotary
    # module again from the config (both major versions take the config as the first argument).
    rotary = hf_model.model.rotary_emb
    hf_model.model.rotary_emb = type(rotary)(hf_model.config).to(model.device)
    persistent = set(hf_model.state_dict())
    stale = [name for name, _ in hf_model.named_buffers() if name not in persistent and "rotary_emb." not in name]
    if stale:  # pragma: no cover - a transformers release with another non-persistent buffer
        raise ValueError(f"{cls.__name__} has buffers this copy does not fill: {stale}.")
    return hf_model.to(model.lm_head.weight.dtype).eval()


def config_from_llama_dict(raw: Mapping[str, Any], **overrides: Any) -> MiniMindConfig:
    """MiniMind2's ``MiniMindConfig`` of a Llama config dict (``config.json`` of either transformers major
    version, or ``hf_model.config.to_dict()``), with transformers' defaults for what is missing
    (``rope_theta`` 10000, with a warning; ``hidden_act`` silu, ...). A Llama that MiniMind cannot express
    (biases, ``head_dim`` other than hidden / heads, RoPE scaling) is a ``ValueError`` listing why. The
    tie of the head is the caller's (a folder's weights, or ``from_hf_llama``). Needs no transformers."""
    needed = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    missing = [k for k in needed if k not in raw]
    if missing:
        raise ValueError(f"Llama config.json lacks {missing}; it cannot describe a MiniMind2 model.")
    heads = raw["num_attention_heads"]
    problems = []
    if raw.get("attention_bias") or raw.get("mlp_bias"):
        problems.append("attention_bias/mlp_bias must be false")
    if raw.get("head_dim") not in (None, raw["hidden_size"] // heads):
        problems.append(f"head_dim {raw['head_dim']} must equal hidden_size / num_attention_heads")
    if rope_is_scaled(raw):
        problems.append("RoPE scaling is not supported (MiniMind2 folders have none)")
    if (raw.get("pretraining_tp") or 1) != 1:
        problems.append("pretraining_tp must be 1")
    if problems:
        raise ValueError("cannot express this Llama config as MiniMind2: " + "; ".join(problems) + ".")
    theta = rope_theta_of(raw)
    if theta is None:
        theta = 10000.0
        _warn_missing("Llama", [("rope_theta", theta)])
    switches = _recorded_switches(raw, "llama")
    eos = raw.get("eos_token_id", 2)
    kwargs: Dict[str, Any] = dict(
        vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"], intermediate_size=raw["intermediate_size"],
        num_hidden_layers=raw["num_hidden_layers"], num_attention_heads=heads,
        num_key_value_heads=raw.get("num_key_value_heads") or heads, hidden_act=raw.get("hidden_act") or "silu",
        max_position_embeddings=raw.get("max_position_embeddings") or 2048,
        rms_norm_eps=raw.get("rms_norm_eps") or 1e-6, rope_theta=theta,
        bos_token_id=1 if raw.get("bos_token_id") is None else raw["bos_token_id"],
        eos_token_id=2 if eos is None else (eos[0] if isinstance(eos, (list, tuple)) else eos),
        dropout=float(raw.get("attention_dropout") or 0.0), qk_norm=False, **switches,
    )
    kwargs.update(overrides)
    return MiniMindConfig(**kwargs)


def _warn_missing(family: str, fields: List[Tuple[str, Any]]) -> None:
    if fields:
        said = ", ".join(f"{name} (took {value!r})" for name, value in fields)
        warnings.warn(
            f"the {family} config has no {', '.join(name for name, _ in fields)}: loaded with transformers' default "
            f"{said}, which may not be what the model was trained with (upstream's convert_model.py always writes "
            "these fields). Add them to config.json to silence this warning.", UserWarning, stacklevel=3)


def _attn_flash(c: Any) -> bool:
    """MiniMind's ``flash_attn`` of a live transformers config (anything but eager attention)."""
    return getattr(c, "_attn_implementation", None) != "eager"


def from_hf_llama(hf_model: Any, **config_overrides: Any) -> MiniMindForCausalLM:
    """A ``MiniMindForCausalLM`` with the weights of a Llama model whose shape MiniMind can express
    (tied embeddings, no biases, head_dim = hidden / heads, no RoPE scaling). Any other model
    (GPT-2, Mistral, a bare ``LlamaModel`` without its head, ...) is a ``TypeError`` naming it."""
    c = getattr(hf_model, "config", None)
    model_type = getattr(c, "model_type", None)
    if model_type != "llama" or not hasattr(hf_model, "lm_head"):
        what = type(hf_model).__name__ + (f" (model_type {model_type!r})" if model_type else "")
        raise TypeError(
            f"from_hf_llama converts a transformers LlamaForCausalLM only, got {what}; other architectures "
            "(GPT-2's learned positions and LayerNorm, for one) cannot be expressed as MiniMind."
        )
    raw = c.to_dict()
    if not raw.get("tie_word_embeddings", False):
        raise ValueError("cannot express this Llama model as MiniMind: tie_word_embeddings must be True (MiniMind2's "
                         "head is its embedding).")
    config = config_from_llama_dict(raw, **{"flash_attn": _attn_flash(c), **config_overrides})
    return _load_hf_state(config, hf_model)


def _load_hf_state(config: MiniMindConfig, hf_model: Any) -> MiniMindForCausalLM:
    model = MiniMindForCausalLM(config)
    state = {k: v for k, v in split_fused_experts(hf_model.state_dict()).items() if not k.endswith("inv_freq")}
    if "lm_head.weight" not in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    load_state_dict_strict(model, state)
    return model.to(next(hf_model.parameters()).device).eval()


# ---------------------------------------------------------------------- minimind-3 <-> Qwen3 / Qwen3-MoE
#: ``MiniMindConfig`` attribute -> ``Qwen3Config`` / ``Qwen3MoeConfig`` field, one to one (see the module
#: docstring; ``rope_theta`` is spelled by ``_rope_kwargs`` for the installed transformers).
QWEN3_FIELDS: Dict[str, str] = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "intermediate_size": "intermediate_size",
    "num_hidden_layers": "num_hidden_layers", "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_key_value_heads", "head_dim": "head_dim", "hidden_act": "hidden_act",
    "max_position_embeddings": "max_position_embeddings", "rms_norm_eps": "rms_norm_eps", "rope_theta": "rope_theta",
    "tie_word_embeddings": "tie_word_embeddings", "dropout": "attention_dropout",
    "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
}
#: The MoE fields of ``Qwen3MoeConfig`` (minimind-3's MoE, d65ef2c names in brackets).
QWEN3_MOE_FIELDS: Dict[str, str] = {
    "n_routed_experts": "num_experts", "num_experts_per_tok": "num_experts_per_tok",
    "expert_intermediate_size": "moe_intermediate_size", "norm_topk_prob": "norm_topk_prob",
    "aux_loss_alpha": "router_aux_loss_coef",
}
#: transformers' defaults (4.57 and 5.x agree) for what a Qwen3 config.json may leave out
#: (``Qwen3Config``, ``Qwen3MoeConfig``; a Qwen3-MoE without ``head_dim`` uses hidden / heads).
_QWEN3_DEFAULTS: Dict[str, Any] = {
    "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "tie_word_embeddings": False, "attention_dropout": 0.0,
    "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": False,
    "router_aux_loss_coef": 0.001,
}
#: Fields upstream's ``convert_torch2transformers`` (d65ef2c) always writes and whose transformers default
#: changes the logits: a config without one loads with a warning naming it (``qwen3_defaults_against_weights``
#: refuses where the weights contradict the default).
QWEN3_WARN_IF_MISSING = ("head_dim", "rope_theta", "tie_word_embeddings", "norm_topk_prob")


def qwen3_problems(config: MiniMindConfig) -> List[str]:
    """What a Qwen3 / Qwen3-MoE model cannot express of ``config`` (an empty list: convertible)."""
    problems = []
    if not config.qk_norm:
        problems.append("qk_norm=False (Qwen3 always normalizes queries and keys; a dense MiniMind2 model is a "
                        "Llama: to_hf_llama)")
    if config.rope_scaling is not None:
        problems.append("YaRN-scaled RoPE (inference_rope_scaling=True): transformers' YaRN uses a different frequency "
                        "ramp and attention factor; convert with inference_rope_scaling=False")
    if config.use_moe and config.n_shared_experts > 0:
        problems.append(f"n_shared_experts={config.n_shared_experts} (Qwen3-MoE has no shared expert; minimind-3 "
                        "has none either)")
    if config.use_moe and config.moe_variant != "minimind-3":
        problems.append("moe_variant='MiniMind2' (its router leaves a single top-1 weight unnormalized and has "
                        "another load-balancing loss); Qwen3-MoE's router is minimind-3's: moe_variant='minimind-3'")
    return problems


def to_hf_qwen3_config(config: MiniMindConfig) -> Any:
    """The ``transformers.Qwen3Config`` (dense) or ``Qwen3MoeConfig`` (MoE) of a minimind-3 config, field by
    field (``QWEN3_FIELDS``, ``QWEN3_MOE_FIELDS``); a ``ValueError`` lists what Qwen3 cannot express."""
    problems = qwen3_problems(config)
    if problems:
        raise ValueError("cannot express this model as Qwen3: " + "; ".join(problems) + ".")
    tf = _transformers()
    kwargs = {hf: getattr(config, ours) for ours, hf in QWEN3_FIELDS.items() if hf != "rope_theta"}
    kwargs.update(attention_bias=False, use_sliding_window=False, sliding_window=None,
                  attn_implementation="sdpa" if config.flash_attn else "eager", **_rope_kwargs(tf, config.rope_theta))
    if not config.use_moe:
        return _set_switches(tf.Qwen3Config(**kwargs), config, "qwen3")
    kwargs.update({hf: getattr(config, ours) for ours, hf in QWEN3_MOE_FIELDS.items()})
    kwargs.update(decoder_sparse_step=1, mlp_only_layers=[], output_router_logits=False)
    return _set_switches(tf.Qwen3MoeConfig(**kwargs), config, "qwen3")


def to_hf(model: MiniMindForCausalLM) -> Any:
    """``model`` as a transformers model with copies of its weights (eval mode, same dtype and device):
    ``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM`` for minimind-3 (``qk_norm=True``), else
    ``LlamaForCausalLM`` (``to_hf_llama``: dense MiniMind2). ``ValueError`` for what neither expresses."""
    if not isinstance(model, MiniMindForCausalLM):
        raise TypeError(
            f"to_hf converts a minimind_ref.MiniMindForCausalLM, got {type(model).__name__}"
            + (" (unwrap it: model.module)" if hasattr(model, "module") else "") + "."
        )
    if not model.config.qk_norm:
        return to_hf_llama(model)
    tf = _transformers()
    hf_config = to_hf_qwen3_config(model.config)
    hf_config.dtype = model.lm_head.weight.dtype  # (torch_dtype is deprecated since transformers 4.56)
    cls = tf.Qwen3MoeForCausalLM if model.config.use_moe else tf.Qwen3ForCausalLM
    return _copy_into(cls, hf_config, model)


def qwen3_config_problems(raw: Mapping[str, Any]) -> List[str]:
    """What minimind-3 cannot express of a Qwen3 / Qwen3-MoE config (a ``config.json`` dict)."""
    problems = []
    if raw.get("attention_bias"):
        problems.append("attention_bias must be false")
    layer_types = raw.get("layer_types") or []
    if raw.get("use_sliding_window") or any(t != "full_attention" for t in layer_types):
        problems.append("sliding-window attention (use_sliding_window / layer_types 'sliding_attention') is not "
                        "MiniMind's: every layer attends to the whole prefix")
    if rope_is_scaled(raw):
        problems.append("RoPE scaling is not converted (transformers' YaRN is not MiniMind's; upstream's converter "
                        "writes none)")
    if raw.get("model_type") == "qwen3_moe":
        if raw.get("decoder_sparse_step", 1) != 1 or raw.get("mlp_only_layers"):
            problems.append("some layers are dense (decoder_sparse_step != 1 or mlp_only_layers); minimind-3-moe has "
                            "experts in every layer")
        if raw.get("shared_expert_intermediate_size"):
            problems.append("a shared expert (minimind-3 has none)")
    return problems


def qwen3_num_experts(raw: Mapping[str, Any]) -> Optional[int]:
    """The expert count of a Qwen3-MoE config dict: ``num_experts`` (transformers 4, upstream's converter)
    or ``num_local_experts`` (transformers 5); ``None`` when neither is there. Both, and different, is a
    ``ValueError`` (transformers 4 reading a folder written by 5 keeps its default 128 beside the folder's count)."""
    old, new = raw.get("num_experts"), raw.get("num_local_experts")
    if old is not None and new is not None and old != new:
        raise ValueError(
            f"the Qwen3-MoE config gives num_experts={old!r} and num_local_experts={new!r}: two counts for one field "
            "(transformers 4 and upstream's converter write num_experts, transformers 5 num_local_experts). "
            + ("transformers 4 does not read num_local_experts, so a folder written by transformers 5 loads there with "
               "its default of 128 experts: load the folder with minimind_ref.load_hf_dir (no transformers needed), "
               "or use transformers >= 5. " if old == _QWEN3_DEFAULTS["num_experts"] else "")
            + "Keep the count that matches the weights and delete the other.")
    return old if old is not None else new


def _qwen3_head_dim_default(raw: Mapping[str, Any]) -> int:
    if raw.get("model_type") == "qwen3_moe":  # Qwen3MoeAttention: getattr(config, "head_dim", hidden // heads)
        return raw["hidden_size"] // raw["num_attention_heads"]
    return _QWEN3_DEFAULTS["head_dim"]


def qwen3_missing_fields(raw: Mapping[str, Any]) -> Dict[str, Any]:
    """The fields of ``QWEN3_WARN_IF_MISSING`` a Qwen3 config dict lacks, with the default transformers takes."""
    missing: Dict[str, Any] = {}
    for name in QWEN3_WARN_IF_MISSING:
        if name == "norm_topk_prob" and raw.get("model_type") != "qwen3_moe":
            continue
        if name == "rope_theta":
            absent = rope_theta_of(raw) is None
        else:
            absent = raw.get(name) is None
        if absent:
            missing[name] = _qwen3_head_dim_default(raw) if name == "head_dim" else _QWEN3_DEFAULTS[name]
    return missing


def qwen3_defaults_against_weights(raw: Mapping[str, Any], state: Mapping[str, torch.Tensor], source: Any) -> None:
    """``ValueError`` when a field the config leaves out takes a transformers default that the weights
    contradict: ``head_dim`` (the length of ``q_norm``) and ``tie_word_embeddings`` (false by default:
    then the weights must hold ``lm_head.weight``). ``source`` names the folder in the message."""
    if raw.get("model_type") not in ("qwen3", "qwen3_moe"):
        return
    missing = qwen3_missing_fields(raw)
    q_norm = state.get("model.layers.0.self_attn.q_norm.weight")
    if "head_dim" in missing and q_norm is not None and q_norm.shape[0] != missing["head_dim"]:
        raise ValueError(
            f"{source}: config.json has no head_dim, so transformers takes {missing['head_dim']}, but the weights' "
            f"q_norm has {q_norm.shape[0]} entries (the head width): add \"head_dim\": {q_norm.shape[0]} to config.json.")
    if "tie_word_embeddings" in missing and "lm_head.weight" not in state:
        raise ValueError(
            f"{source}: config.json has no tie_word_embeddings, so transformers takes false (an untied head), but the "
            "weights hold no lm_head.weight: the head is the embedding. Add \"tie_word_embeddings\": true to config.json.")


def config_from_qwen3_dict(raw: Mapping[str, Any], **overrides: Any) -> MiniMindConfig:
    """minimind-3's ``MiniMindConfig`` of a Qwen3 / Qwen3-MoE config dict (``config.json`` written by
    transformers 4 or 5 or by upstream's converter, or ``hf_model.config.to_dict()``). Missing fields take
    transformers' defaults (``_QWEN3_DEFAULTS``; those of ``QWEN3_WARN_IF_MISSING`` with a warning naming
    them), missing token ids MiniMind's 1 and 2; ``minimind_switches`` (written by ``to_hf``) restores a
    MiniMind2 model's switches; ``overrides`` win. ``ValueError`` for what minimind-3 cannot express
    (``qwen3_config_problems``) and for fields that contradict each other (``num_experts`` /
    ``num_local_experts``, ``rope_theta`` / ``rope_parameters``). Needs no transformers."""
    model_type = raw.get("model_type")
    if model_type not in ("qwen3", "qwen3_moe"):
        raise ValueError(f"not a Qwen3 config: model_type {model_type!r} (expected 'qwen3' or 'qwen3_moe').")
    moe = model_type == "qwen3_moe"
    needed = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"] + (
        [] if moe else ["intermediate_size"])
    missing = [k for k in needed if k not in raw]
    if missing:
        raise ValueError(f"Qwen3 config lacks {missing}; it cannot describe a minimind-3 model.")
    problems = qwen3_config_problems(raw)
    if problems:
        raise ValueError("cannot express this Qwen3 config as minimind-3: " + "; ".join(problems) + ".")
    theta = rope_theta_of(raw)
    experts = qwen3_num_experts(raw) if moe else None
    if moe and experts is None and "n_routed_experts" not in overrides:
        raise ValueError("the Qwen3-MoE config has no expert count: neither num_experts (transformers 4, upstream's "
                         "converter) nor num_local_experts (transformers 5). transformers would take its default of "
                         f"{_QWEN3_DEFAULTS['num_experts']} experts whatever the weights hold; add \"num_experts\": N "
                         "to config.json (N: the experts per layer the weights hold, "
                         "model.layers.0.mlp.experts.{e}.* or the first dimension of mlp.experts.gate_up_proj).")
    switches = _recorded_switches(raw, "qwen3")
    defaults = qwen3_missing_fields(raw)
    _warn_missing("Qwen3-MoE" if moe else "Qwen3", list(defaults.items()))

    def get(key: str) -> Any:
        if key in defaults:
            return defaults[key]
        return raw[key] if raw.get(key) is not None else _QWEN3_DEFAULTS[key]

    heads = raw["num_attention_heads"]
    head_dim = get("head_dim")
    eos = raw.get("eos_token_id")
    eos = eos[0] if isinstance(eos, (list, tuple)) else eos
    kwargs: Dict[str, Any] = dict(
        vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"],
        num_hidden_layers=raw["num_hidden_layers"], num_attention_heads=heads,
        num_key_value_heads=raw.get("num_key_value_heads") or heads,
        head_dim=None if head_dim * heads == raw["hidden_size"] else head_dim,  # None: hidden / heads
        hidden_act=get("hidden_act"), max_position_embeddings=get("max_position_embeddings"),
        rms_norm_eps=get("rms_norm_eps"), rope_theta=float(_QWEN3_DEFAULTS["rope_theta"] if theta is None else theta),
        tie_word_embeddings=bool(get("tie_word_embeddings")), dropout=float(get("attention_dropout")),
        bos_token_id=1 if raw.get("bos_token_id") is None else raw["bos_token_id"],
        eos_token_id=2 if eos is None else eos, qk_norm=True, **switches,
    )
    if raw.get("intermediate_size") is not None:
        kwargs["intermediate_size"] = raw["intermediate_size"]
    if moe:
        width = get("moe_intermediate_size")
        kwargs.update(use_moe=True, n_routed_experts=_QWEN3_DEFAULTS["num_experts"] if experts is None else experts,
                      num_experts_per_tok=get("num_experts_per_tok"), n_shared_experts=0, moe_variant="minimind-3",
                      norm_topk_prob=bool(get("norm_topk_prob")), aux_loss_alpha=float(get("router_aux_loss_coef")),
                      moe_intermediate_size=None if width == kwargs.get("intermediate_size") else width)
    kwargs.update(overrides)
    return MiniMindConfig(**kwargs)


def from_hf(hf_model: Any, **config_overrides: Any) -> MiniMindForCausalLM:
    """A ``MiniMindForCausalLM`` with the weights of ``hf_model``: ``LlamaForCausalLM`` (MiniMind2,
    ``from_hf_llama``), ``Qwen3ForCausalLM`` or ``Qwen3MoeForCausalLM`` (minimind-3; per-expert or fused
    experts). Other models are a ``TypeError``, Qwen3 features minimind-3 lacks a ``ValueError``
    (``qwen3_config_problems``)."""
    c = getattr(hf_model, "config", None)
    model_type = getattr(c, "model_type", None)
    if model_type == "llama":
        return from_hf_llama(hf_model, **config_overrides)
    if model_type not in ("qwen3", "qwen3_moe") or not hasattr(hf_model, "lm_head"):
        what = type(hf_model).__name__ + (f" (model_type {model_type!r})" if model_type else "")
        raise TypeError(
            f"from_hf converts transformers' LlamaForCausalLM (MiniMind2), Qwen3ForCausalLM and Qwen3MoeForCausalLM "
            f"(minimind-3), got {what}."
        )
    raw = c.to_dict()
    qwen3_defaults_against_weights(raw, hf_model.state_dict(), type(hf_model).__name__)
    config = config_from_qwen3_dict(raw, **{"flash_attn": _attn_flash(c), **config_overrides})
    return _load_hf_state(config, hf_model)
