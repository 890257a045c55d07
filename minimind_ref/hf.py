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
translation plus ``load_state_dict``. Not convertible: MiniMind2's MoE (Llama has no experts,
Qwen3-MoE no shared expert and another router), YaRN-scaled RoPE (transformers' YaRN computes
different frequencies and attention factor than MiniMind's), and QK-norm without Qwen3.

minimind-3 field by field (``QWEN3_FIELDS``; transformers 4.57):

==================================  ======================================  ==============================="""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

import torch

from .checkpoint import load_state_dict_strict
from .config import MiniMindConfig
from .model import MiniMindForCausalLM


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError("minimind_ref.hf needs transformers: pip install 'minimind-ref[hf]'") from err
    return transformers


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
    return tf.LlamaConfig(
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
        rope_theta=config.rope_theta,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=config.dropout,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        # MiniMind's flash_attn switch is transformers' attention implementation (sdpa or eager)
        attn_implementation="sdpa" if config.flash_attn else "eager",
    )


def to_hf_llama(model: MiniMindForCausalLM) -> Any:
    """A ``transformers.LlamaForCausalLM`` holding copies of ``model``'s weights (eval mode, same dtype)."""
    if not isinstance(model, MiniMindForCausalLM):
        raise TypeError(
            f"to_hf_llama converts a minimind_ref.MiniMindForCausalLM, got {type(model).__name__}"
            + (" (unwrap it: model.module)" if hasattr(model, "module") else "") + "."
        )
    tf = _transformers()
    hf_config = to_hf_llama_config(model.config)
    hf_config.torch_dtype = model.lm_head.weight.dtype
    return _copy_into(tf.LlamaForCausalLM, hf_config, model)


def _copy_into(cls: Any, hf_config: Any, model: MiniMindForCausalLM) -> Any:
    """A transformers ``cls`` built from ``hf_config`` on the meta device, filled with copies of
    ``model``'s weights (the same names), tied as ``model`` is, in eval mode, same dtype and device."""
    with torch.device("meta"):
        hf_model = cls(hf_config)
    hf_model = hf_model.to_empty(device=model.device)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise ValueError(f"weight names do not line up: missing {missing}, unexpected {unexpected}")
    if model.config.tie_word_embeddings:
        hf_model.tie_weights()
    rotary = hf_model.model.rotary_emb  # non-persistent RoPE buffer: recompute it after to_empty()
    inv_freq, scaling = rotary.rope_init_fn(rotary.config, model.device)
    rotary.inv_freq = inv_freq
    rotary.original_inv_freq = inv_freq
    rotary.attention_scaling = scaling
    return hf_model.to(model.lm_head.weight.dtype).eval()


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
    problems = []
    if not getattr(c, "tie_word_embeddings", False):
        problems.append("tie_word_embeddings must be True")
    if getattr(c, "attention_bias", False) or getattr(c, "mlp_bias", False):
        problems.append("attention_bias and mlp_bias must be False")
    if getattr(c, "head_dim", c.hidden_size // c.num_attention_heads) != c.hidden_size // c.num_attention_heads:
        problems.append("head_dim must equal hidden_size // num_attention_heads")
    if getattr(c, "rope_scaling", None):
        problems.append("rope_scaling must be None")
    if problems:
        raise ValueError("cannot express this Llama model as MiniMind: " + "; ".join(problems))
    config = MiniMindConfig(**{
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads, "hidden_act": c.hidden_act,
        "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta, "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id,
        "dropout": getattr(c, "attention_dropout", 0.0) or 0.0,
        "flash_attn": getattr(c, "_attn_implementation", None) != "eager",
        **config_overrides,
    })
    model = MiniMindForCausalLM(config)
    state = {k: v for k, v in hf_model.state_dict().items() if not k.endswith("inv_freq")}
    if "lm_head.weight" not in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    load_state_dict_strict(model, state)
    return model.to(next(hf_model.parameters()).device).eval()


# ---------------------------------------------------------------------- minimind-3 <-> Qwen3 / Qwen3-MoE
#: ``MiniMindConfig`` attribute -> ``Qwen3Config`` / ``Qwen3MoeConfig`` field, one to one (see the module docstring).
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
#: transformers 4.57's defaults for what a Qwen3 config.json may leave out (``Qwen3Config``, ``Qwen3MoeConfig``).
_QWEN3_DEFAULTS: Dict[str, Any] = {
    "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "tie_word_embeddings": False, "attention_dropout": 0.0,
    "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": False,
    "router_aux_loss_coef": 0.001,
}


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
    kwargs = {hf: getattr(config, ours) for ours, hf in QWEN3_FIELDS.items()}
    kwargs.update(attention_bias=False, use_sliding_window=False, sliding_window=None, rope_scaling=None)
    if not config.use_moe:
        return tf.Qwen3Config(**kwargs)
    kwargs.update({hf: getattr(config, ours) for ours, hf in QWEN3_MOE_FIELDS.items()})
    kwargs.update(decoder_sparse_step=1, mlp_only_layers=[], output_router_logits=False)
    return tf.Qwen3MoeConfig(**kwargs)


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
    dtype = model.lm_head.weight.dtype
    hf_config.dtype = dtype  # (transformers 4.57's name; torch_dtype is deprecated there)
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
    rope = raw.get("rope_parameters") or {}
    if raw.get("rope_scaling") or rope.get("rope_type", "default") != "default":
        problems.append("RoPE scaling is not converted (transformers' YaRN is not MiniMind's; upstream's converter "
                        "writes none)")
    if raw.get("model_type") == "qwen3_moe":
        if raw.get("decoder_sparse_step", 1) != 1 or raw.get("mlp_only_layers"):
            problems.append("some layers are dense (decoder_sparse_step != 1 or mlp_only_layers); minimind-3-moe has "
                            "experts in every layer")
        if raw.get("shared_expert_intermediate_size"):
            problems.append("a shared expert (minimind-3 has none)")
    return problems


def config_from_qwen3_dict(raw: Mapping[str, Any], **overrides: Any) -> MiniMindConfig:
    """minimind-3's ``MiniMindConfig`` of a Qwen3 / Qwen3-MoE config dict (``config.json`` or
    ``hf_model.config.to_dict()``). Missing fields take transformers 4.57's defaults (``_QWEN3_DEFAULTS``),
    missing token ids MiniMind's 1 and 2; ``overrides`` win. ``ValueError`` for what minimind-3 cannot
    express (``qwen3_config_problems``). Needs no transformers."""
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

    def get(key: str) -> Any:
        return raw[key] if raw.get(key) is not None else _QWEN3_DEFAULTS[key]

    heads = raw["num_attention_heads"]
    head_dim = get("head_dim")
    rope = raw.get("rope_parameters") or {}
    eos = raw.get("eos_token_id")
    eos = eos[0] if isinstance(eos, (list, tuple)) else eos
    kwargs: Dict[str, Any] = dict(
        generation="minimind-3", vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"],
        num_hidden_layers=raw["num_hidden_layers"], num_attention_heads=heads,
        num_key_value_heads=raw.get("num_key_value_heads") or heads,
        head_dim=None if head_dim * heads == raw["hidden_size"] else head_dim,  # None: hidden / heads
        hidden_act=get("hidden_act"), max_position_embeddings=get("max_position_embeddings"),
        rms_norm_eps=get("rms_norm_eps"), rope_theta=float(raw.get("rope_theta") or rope.get("rope_theta")
                                                          or _QWEN3_DEFAULTS["rope_theta"]),
        tie_word_embeddings=bool(get("tie_word_embeddings")), dropout=float(get("attention_dropout")),
        bos_token_id=1 if raw.get("bos_token_id") is None else raw["bos_token_id"],
        eos_token_id=2 if eos is None else eos,
    )
    if raw.get("intermediate_size") is not None:
        kwargs["intermediate_size"] = raw["intermediate_size"]
    if moe:
        width = get("moe_intermediate_size")
        kwargs.update(use_moe=True, n_routed_experts=get("num_experts"), num_experts_per_tok=get("num_experts_per_tok"),
                      norm_topk_prob=bool(get("norm_topk_prob")), aux_loss_alpha=float(get("router_aux_loss_coef")),
                      moe_intermediate_size=None if width == kwargs.get("intermediate_size") else width)
    kwargs.update(overrides)
    return MiniMindConfig(**kwargs)


def from_hf(hf_model: Any, **config_overrides: Any) -> MiniMindForCausalLM:
    """A ``MiniMindForCausalLM`` with the weights of ``hf_model``: ``LlamaForCausalLM`` (MiniMind2,
    ``from_hf_llama``), ``Qwen3ForCausalLM`` or ``Qwen3MoeForCausalLM`` (minimind-3). Other models are a
    ``TypeError``, Qwen3 features minimind-3 lacks a ``ValueError`` (``qwen3_config_problems``)."""
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
    config = config_from_qwen3_dict(c.to_dict(), **config_overrides)
    model = MiniMindForCausalLM(config)
    state = {k: v for k, v in hf_model.state_dict().items() if not k.endswith("inv_freq")}
    if "lm_head.weight" not in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    load_state_dict_strict(model, state)
    return model.to(next(hf_model.parameters()).device).eval()
