"""Hugging Face interop: a dense MiniMind2 model *is* a Llama model with tied embeddings.

    hf_model = to_hf_llama(model)        # transformers.LlamaForCausalLM, same weights
    model = from_hf_llama(hf_model)      # and back

Needs the optional extra ``pip install minimind-ref[hf]`` (``transformers``). The state-dict
keys are identical, so conversion is a config translation plus ``load_state_dict(strict=True)``.
Not convertible: MoE models (Llama has no experts) and YaRN-scaled RoPE (transformers' YaRN
computes different frequencies and attention factor than MiniMind's). ``dropout`` travels as
Llama's ``attention_dropout`` and ``flash_attn`` as the attention implementation (``sdpa`` /
``eager``), so a round trip keeps both (Llama applies dropout to the attention weights only).
"""

from __future__ import annotations

from typing import Any

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
    with torch.device("meta"):
        hf_model = tf.LlamaForCausalLM(hf_config)
    hf_model = hf_model.to_empty(device=model.device)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise ValueError(f"weight names do not line up: missing {missing}, unexpected {unexpected}")
    hf_model.tie_weights()
    # non-persistent RoPE buffer: recompute it on the real device after to_empty()
    rotary = hf_model.model.rotary_emb
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
