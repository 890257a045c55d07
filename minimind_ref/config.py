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

# Keys that Hugging Face writes into config.json files; accepted and ignored. (``rope_scaling`` and
# ``head_dim`` are also accepted, but checked: see ``MiniMindConfig.__init__``.)
_HF_KEYS = {
    "architectures", "auto_map", "model_type", "torch_dtype", "dtype", "transformers_version",
    "tie_word_embeddings", "use_cache", "pad_token_id",
    "_name_or_path", "return_dict", "output_hidden_states", "output_attentions",
}
_BOOL_FIELDS = ("inference_rope_scaling", "flash_attn", "use_moe", "seq_aux", "norm_topk_prob")


def default_intermediate_size(hidden_size: int) -> int:
    """SwiGLU width rule: 8/3 of the hidden size, rounded up to a multiple of 64.

    ``64 * ceil(int(8 * hidden_size / 3) / 64)``; 512 -> 1408, 640 -> 1728, 768 -> 2048.
    """
    return 64 * math.ceil(int(hidden_size * 8 / 3) / 64)


class MiniMindConfig:
    """Hyper-parameters of a MiniMind2 model.

    Defaults describe MiniMind2-Small (26M): hidden 512, 8 layers, 8 query heads, 2 KV heads.
    A value of the wrong type raises ``TypeError``, an invalid value or combination ``ValueError``;
    both name the field and say what to pass instead.

    Two Hugging Face keys are derived, as upstream derives them, never taken from the caller:
    ``rope_scaling`` (``YARN_ROPE_SCALING`` when ``inference_rope_scaling=True``, else ``None``) and
    ``head_dim`` (``hidden_size // num_attention_heads``). Passing either with the value MiniMind
    derives anyway (a ``config.json`` written by upstream does) is fine; a different
    ``rope_scaling`` is ignored with a warning (set ``config.rope_scaling`` after construction
    to try other YaRN settings) and a different ``head_dim`` is a ``ValueError``.
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

        self._check_derived_keywords(kwargs)
        unknown = sorted(set(kwargs) - _HF_KEYS - {"rope_scaling", "head_dim"})
        if unknown:
            warnings.warn(
                f"MiniMindConfig ignores unknown keyword(s) {unknown}; check the spelling "
                "(accepted names are upstream's, e.g. hidden_size, num_key_value_heads).",
                stacklevel=2,
            )
        self.extra_kwargs = dict(kwargs)
        self.validate()

    def _check_derived_keywords(self, kwargs: Dict[str, Any]) -> None:
        """``rope_scaling`` / ``head_dim`` given as keywords: fine when they agree with what MiniMind
        derives, a warning (``rope_scaling``) or an error (``head_dim``) when they do not."""
        if "rope_scaling" in kwargs and kwargs["rope_scaling"] != self.rope_scaling:
            warnings.warn(
                f"MiniMindConfig ignores rope_scaling={kwargs['rope_scaling']!r}: as in upstream MiniMind it is "
                f"derived from inference_rope_scaling ({self.inference_rope_scaling!r} gives "
                f"{self.rope_scaling!r}). Pass inference_rope_scaling=True for upstream's YaRN settings, or set "
                "config.rope_scaling = {...} after construction to try others.",
                stacklevel=3,
            )
        if "head_dim" in kwargs and kwargs["head_dim"] is not None:
            head_dim = kwargs["head_dim"]
            heads = self.num_attention_heads
            derived = self.hidden_size // heads if _is_int(heads) and heads > 0 and _is_int(self.hidden_size) else None
            if head_dim != derived:
                raise ValueError(
                    f"head_dim={head_dim!r} disagrees with hidden_size // num_attention_heads = "
                    f"{self.hidden_size!r} // {heads!r} = {derived!r}: MiniMind derives head_dim from those two. "
                    "Drop head_dim, or change num_attention_heads (or hidden_size) so that they give it."
                )

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
        """Raise ``TypeError`` (wrong type) or ``ValueError`` (bad value) naming the field and the fix."""
        for name in _BOOL_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__}).")
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
        _check_number("dropout", self.dropout, "e.g. 0.0 or 0.1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}.")
        _check_number("rms_norm_eps", self.rms_norm_eps, "upstream uses 1e-05")
        if self.rms_norm_eps <= 0:
            raise ValueError(f"rms_norm_eps must be positive (upstream uses 1e-05), got {self.rms_norm_eps!r}.")
        _check_number("rope_theta", self.rope_theta, "upstream uses 1e6 = 1000000.0")
        if self.rope_theta <= 1:
            raise ValueError(
                f"rope_theta must be > 1 (the base of the RoPE frequencies; upstream uses 1e6), got {self.rope_theta!r}."
            )
        for name in ("bos_token_id", "eos_token_id"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 0):
                raise ValueError(f"{name} must be a token id (an integer >= 0) or None, got {value!r}.")
        if self.rope_scaling is not None:
            validate_rope_scaling(self.rope_scaling)
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
            _check_number("aux_loss_alpha", self.aux_loss_alpha, "upstream uses 0.01")
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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_number(name: str, value: Any, example: str) -> None:
    """``TypeError`` unless ``value`` is a real number (not a bool, not a string); ``ValueError``
    if it is NaN or infinite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number ({example}), got {value!r} ({type(value).__name__}).")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number ({example}), got {value!r}.")


def validate_rope_scaling(rope_scaling: Any) -> None:
    """Check a YaRN dict (keys as in ``YARN_ROPE_SCALING``; missing keys take upstream's defaults).

    ``factor`` > 0, ``original_max_position_embeddings`` a positive integer, ``beta_fast`` and
    ``beta_slow`` > 0 and ``attention_factor`` > 0, all finite: anything else would give NaN or
    meaningless RoPE tables.
    """
    if not isinstance(rope_scaling, dict):
        raise TypeError(
            f"rope_scaling must be a dict like YARN_ROPE_SCALING or None, got {type(rope_scaling).__name__}."
        )
    kind = rope_scaling.get("type", rope_scaling.get("rope_type", "yarn"))
    if kind != "yarn":
        raise ValueError(f"rope_scaling type {kind!r} is not supported; MiniMind implements 'yarn' only.")
    for key in ("factor", "beta_fast", "beta_slow", "attention_factor"):
        if key in rope_scaling:
            _check_number(f"rope_scaling[{key!r}]", rope_scaling[key], f"upstream uses {YARN_ROPE_SCALING[key]}")
            if rope_scaling[key] <= 0:
                raise ValueError(
                    f"rope_scaling[{key!r}] must be > 0 (upstream uses {YARN_ROPE_SCALING[key]}), got {rope_scaling[key]!r}."
                )
    orig = rope_scaling.get("original_max_position_embeddings", 2048)
    if not _is_int(orig) or orig <= 0:
        raise ValueError(
            f"rope_scaling['original_max_position_embeddings'] must be a positive integer (upstream uses 2048), got {orig!r}."
        )


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
