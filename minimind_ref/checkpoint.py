"""Saving and loading weights: upstream ``.pth`` state dicts and the course's own checkpoints.

Upstream MiniMind saves a bare state dict (often in fp16), e.g. ``full_sft_512.pth``. The course
saves ``{"format": "minimind_ref", "config": {...}, "state_dict": {...}, "extra": {...}}`` so the
config travels with the weights. ``load_checkpoint`` reads both.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional, Union

import torch

from .config import MiniMindConfig
from .model import MiniMindForCausalLM

FORMAT = "minimind_ref"
PathLike = Union[str, "os.PathLike[str]"]


def save_checkpoint(model: MiniMindForCausalLM, path: PathLike, extra: Optional[Dict[str, Any]] = None) -> None:
    """Save weights and config (plus anything JSON-like in ``extra``, e.g. the step or optimizer)."""
    torch.save(
        {"format": FORMAT, "config": model.config.to_dict(), "state_dict": model.state_dict(), "extra": extra or {}},
        path,
    )


def infer_config(state_dict: Mapping[str, torch.Tensor], **overrides: Any) -> MiniMindConfig:
    """Rebuild a config from the tensor shapes of an upstream state dict.

    Shapes fix hidden size, vocabulary, layers, KV width, FFN width and expert counts. The head
    count and ``num_experts_per_tok`` cannot be read from shapes: upstream's values (8 heads,
    top-2) are assumed unless given in ``overrides``.
    """
    if "model.embed_tokens.weight" not in state_dict:
        raise ValueError(
            "not a MiniMind state dict: key 'model.embed_tokens.weight' is missing "
            f"(first keys: {list(state_dict)[:5]})."
        )
    vocab_size, hidden_size = state_dict["model.embed_tokens.weight"].shape
    layers = {int(k.split(".")[2]) for k in state_dict if k.startswith("model.layers.")}
    num_attention_heads = overrides.pop("num_attention_heads", 8)
    head_dim = hidden_size // num_attention_heads
    kv_width = state_dict["model.layers.0.self_attn.k_proj.weight"].shape[0]
    use_moe = any(".mlp.experts." in k for k in state_dict)
    if use_moe:
        ffn_key = "model.layers.0.mlp.experts.0.gate_proj.weight"
        n_routed = len({int(k.split(".")[5]) for k in state_dict if k.startswith("model.layers.0.mlp.experts.")})
        n_shared = len({int(k.split(".")[5]) for k in state_dict if k.startswith("model.layers.0.mlp.shared_experts.")})
    else:
        ffn_key = "model.layers.0.mlp.gate_proj.weight"
        n_routed, n_shared = 4, 1
    kwargs: Dict[str, Any] = dict(
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=len(layers),
        num_attention_heads=num_attention_heads, num_key_value_heads=kv_width // head_dim,
        intermediate_size=state_dict[ffn_key].shape[0], use_moe=use_moe,
        n_routed_experts=n_routed, n_shared_experts=n_shared,
    )
    kwargs.update(overrides)
    return MiniMindConfig(**kwargs)


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
    if missing or unexpected or mismatched:
        lines = ["the checkpoint does not match the model:"]
        for title, items in (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", mismatched)):
            if items:
                shown = ", ".join(items[:8]) + (f", ... ({len(items)} in all)" if len(items) > 8 else "")
                lines.append(f"  {title}: {shown}")
        if any(".mlp.experts." in k for k in unexpected) or any(".mlp.experts." in k for k in missing):
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
    **config_overrides: Any,
) -> MiniMindForCausalLM:
    """Load a model from an upstream ``.pth`` state dict or a ``save_checkpoint`` file.

    The config comes from ``config`` if given, else from the file (course format), else it is
    inferred from the tensor shapes (upstream format). Weights are cast to ``dtype`` (upstream
    ships fp16); pass ``dtype=None`` to keep them. The model is returned in eval mode.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path!s}")
    blob = torch.load(path, map_location=map_location, weights_only=True)
    if isinstance(blob, dict) and blob.get("format") == FORMAT:
        state_dict = blob["state_dict"]
        config = config or MiniMindConfig(**{**blob["config"], **config_overrides})
    elif isinstance(blob, dict) and all(isinstance(v, torch.Tensor) for v in blob.values()):
        state_dict = blob
        config = config or infer_config(state_dict, **config_overrides)
    else:
        raise ValueError(f"{path!s} is neither an upstream MiniMind state dict nor a minimind_ref checkpoint.")
    # RoPE tables are recomputed, never loaded (upstream marks them non-persistent)
    state_dict = {k: v for k, v in state_dict.items() if not k.endswith(("freqs_cos", "freqs_sin"))}
    if dtype is not None:
        state_dict = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state_dict.items()}
    model = MiniMindForCausalLM(config)
    load_state_dict_strict(model, state_dict)
    return model.to(map_location).eval()
