"""MiniMindConfig: every size and switch of a MiniMind2 model, validated up front.

The keyword names and defaults are upstream's (jingyaogong/minimind, MiniMind2), so a
``config.json`` written by upstream can be passed as ``MiniMindConfig(**json.load(f))``.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Dict, Optional

#: Activation names the feed-forward layers understand (see ``ffn.ACTIVATIONS``).
SUPPORTED_ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "relu")
#: Gate scoring functions the MoE router understands (upstream supports only softmax).
SUPPORTED_SCORING = ("softmax",)

#: The YaRN settings upstream uses when ``inference_rope_scaling=True``.
YARN_ROPE_SCALING: Dict[str, Any] = {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 16,
    "original_max_position_embeddings": 2048,
    "attention_factor": 1.0,
    "type": "yarn",
}

# Keys that Hugging Face writes into config.json files; accepted and ignored.
_HF_KEYS = {
    "architectures", "auto_map", "model_type", "torch_dtype", "dtype", "transformers_version",
    "tie_word_embeddings", "rope_scaling", "head_dim", "use_cache", "pad_token_id",
    "_name_or_path", "return_dict", "output_hidden_states", "output_attentions",
}


def default_intermediate_size(hidden_size: int) -> int:
    """SwiGLU width rule: 8/3 of the hidden size, rounded up to a multiple of 64.

    ``64 * ceil(int(8 * hidden_size / 3) / 64)``; 512 -> 1408, 640 -> 1728, 768 -> 2048.
    """
    return 64 * math.ceil(int(hidden_size * 8 / 3) / 64)


class MiniMindConfig:
    """Hyper-parameters of a MiniMind2 model.

    Defaults describe MiniMind2-Small (26M): hidden 512, 8 layers, 8 query heads, 2 KV heads.
    Invalid combinations raise ``ValueError`` with the fix in the message.
    """

    def __init__(
        self,
        dropout: float = 0.0,
        bos_token_id: int = 1,
        eos_token_id: int = 2,
        hidden_act: str = "silu",
        hidden_size: int = 512,
        intermediate_size: Optional[int] = None,
        max_position_embeddings: int = 32768,
        num_attention_heads: int = 8,
        num_hidden_layers: int = 8,
        num_key_value_heads: int = 2,
        vocab_size: int = 6400,
        rms_norm_eps: float = 1e-05,
        rope_theta: float = 1000000.0,
        inference_rope_scaling: bool = False,
        flash_attn: bool = True,
        # Mixture of experts (ignored unless use_moe=True)
        use_moe: bool = False,
        num_experts_per_tok: int = 2,
        n_routed_experts: int = 4,
        n_shared_experts: int = 1,
        scoring_func: str = "softmax",
        aux_loss_alpha: float = 0.01,
        seq_aux: bool = True,
        norm_topk_prob: bool = True,
        **kwargs: Any,
    ) -> None:
        self.dropout = dropout
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.hidden_act = hidden_act
        self.hidden_size = hidden_size
        self.intermediate_size = (
            default_intermediate_size(hidden_size) if intermediate_size is None else intermediate_size
        )
        self.max_position_embeddings = max_position_embeddings
        self.num_attention_heads = num_attention_heads
        self.num_hidden_layers = num_hidden_layers
        # upstream: None means "as many KV heads as query heads" (plain multi-head attention)
        self.num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        self.vocab_size = vocab_size
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.inference_rope_scaling = inference_rope_scaling
        self.rope_scaling = dict(YARN_ROPE_SCALING) if inference_rope_scaling else None
        self.flash_attn = flash_attn
        self.use_moe = use_moe
        self.num_experts_per_tok = num_experts_per_tok
        self.n_routed_experts = n_routed_experts
        self.n_shared_experts = n_shared_experts
        self.scoring_func = scoring_func
        self.aux_loss_alpha = aux_loss_alpha
        self.seq_aux = seq_aux
        self.norm_topk_prob = norm_topk_prob

        unknown = sorted(set(kwargs) - _HF_KEYS)
        if unknown:
            warnings.warn(
                f"MiniMindConfig ignores unknown keyword(s) {unknown}; check the spelling "
                "(accepted names are upstream's, e.g. hidden_size, num_key_value_heads).",
                stacklevel=2,
            )
        self.extra_kwargs = dict(kwargs)
        self.validate()

    # ------------------------------------------------------------------ derived sizes
    @property
    def head_dim(self) -> int:
        """Width of one attention head: ``hidden_size // num_attention_heads``."""
        return self.hidden_size // self.num_attention_heads

    @property
    def n_rep(self) -> int:
        """How many query heads share one key/value head (1 = MHA, num_heads = MQA)."""
        return self.num_attention_heads // self.num_key_value_heads

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad field and how to fix it."""
        positive = {
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "intermediate_size": self.intermediate_size,
        }
        if self.use_moe:
            positive.update(n_routed_experts=self.n_routed_experts, num_experts_per_tok=self.num_experts_per_tok)
        for name, value in positive.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads}); pick a head count that divides it, "
                f"e.g. {_divisors_near(self.hidden_size, self.num_attention_heads)}."
            )
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be divisible by "
                f"num_key_value_heads ({self.num_key_value_heads}): each KV head serves a whole group "
                f"of query heads. Valid choices: {_divisors(self.num_attention_heads)}."
            )
        if self.head_dim % 2 != 0:
            raise ValueError(
                f"head_dim = hidden_size / num_attention_heads = {self.head_dim} must be even, "
                "because RoPE rotates dimensions in pairs."
            )
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise ValueError(
                f"unknown hidden_act {self.hidden_act!r}; choose one of {SUPPORTED_ACTIVATIONS}."
            )
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}.")
        if self.rms_norm_eps <= 0:
            raise ValueError(f"rms_norm_eps must be positive, got {self.rms_norm_eps!r}.")
        if self.rope_theta <= 0:
            raise ValueError(f"rope_theta must be positive, got {self.rope_theta!r}.")
        if self.use_moe:
            if self.scoring_func not in SUPPORTED_SCORING:
                raise ValueError(
                    f"unknown scoring_func {self.scoring_func!r}; MiniMind's router supports {SUPPORTED_SCORING}."
                )
            if self.num_experts_per_tok > self.n_routed_experts:
                raise ValueError(
                    f"num_experts_per_tok ({self.num_experts_per_tok}) cannot exceed n_routed_experts "
                    f"({self.n_routed_experts})."
                )
            if not isinstance(self.n_shared_experts, int) or self.n_shared_experts < 0:
                raise ValueError(f"n_shared_experts must be an integer >= 0, got {self.n_shared_experts!r}.")
            if self.aux_loss_alpha < 0:
                raise ValueError(f"aux_loss_alpha must be >= 0, got {self.aux_loss_alpha!r}.")

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> Dict[str, Any]:
        """The constructor's keyword arguments, so ``MiniMindConfig(**c.to_dict()) == c``."""
        keys = (
            "dropout", "bos_token_id", "eos_token_id", "hidden_act", "hidden_size", "intermediate_size",
            "max_position_embeddings", "num_attention_heads", "num_hidden_layers", "num_key_value_heads",
            "vocab_size", "rms_norm_eps", "rope_theta", "inference_rope_scaling", "flash_attn", "use_moe",
            "num_experts_per_tok", "n_routed_experts", "n_shared_experts", "scoring_func", "aux_loss_alpha",
            "seq_aux", "norm_topk_prob",
        )
        return {k: getattr(self, k) for k in keys}

    def replace(self, **changes: Any) -> "MiniMindConfig":
        """A copy with some fields changed (validated again)."""
        d = self.to_dict()
        if "hidden_size" in changes and "intermediate_size" not in changes:
            d["intermediate_size"] = None  # recompute the 8/3 rule for the new width
        d.update(changes)
        return MiniMindConfig(**d)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MiniMindConfig) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"MiniMindConfig({body})"


def _divisors(n: int) -> list:
    return [d for d in range(1, n + 1) if n % d == 0]


def _divisors_near(n: int, target: int) -> list:
    return sorted(_divisors(n), key=lambda d: abs(d - target))[:3]


# ---------------------------------------------------------------------- published presets
def minimind2_small(**overrides: Any) -> MiniMindConfig:
    """MiniMind2-Small, 26M parameters: hidden 512, 8 layers."""
    return MiniMindConfig(**{"hidden_size": 512, "num_hidden_layers": 8, **overrides})


def minimind2(**overrides: Any) -> MiniMindConfig:
    """MiniMind2, 104M parameters: hidden 768, 16 layers."""
    return MiniMindConfig(**{"hidden_size": 768, "num_hidden_layers": 16, **overrides})


def minimind2_moe(**overrides: Any) -> MiniMindConfig:
    """MiniMind2-MoE, 145M parameters: hidden 640, 8 layers, 1 shared + 4 routed experts (top-2)."""
    return MiniMindConfig(**{"hidden_size": 640, "num_hidden_layers": 8, "use_moe": True, **overrides})


#: Name -> factory for the published sizes.
PRESETS = {
    "MiniMind2-Small": minimind2_small,
    "MiniMind2": minimind2,
    "MiniMind2-MoE": minimind2_moe,
}


def preset(name: str, **overrides: Any) -> MiniMindConfig:
    """Config of a published model by name (see ``PRESETS``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {list(PRESETS)}.")
    return PRESETS[name](**overrides)
