"""MiniMindConfig: every size and switch of a MiniMind model, both generations, validated up front.

Upstream (jingyaogong/minimind) has shipped two generations from one ``model/model_minimind.py``:

* **MiniMind2** (commit c090b69, January 2026; the course's main thread), and
* **minimind-3** (pinned at d65ef2c; its models released 2026-04-01 according to upstream's README):
  Qwen3's architecture in miniature.

Here both are one ``MiniMindConfig``. Every difference is a switch (``qk_norm``, ``head_dim``,
``tie_word_embeddings``, the FFN width rule, ``moe_variant``, ...) and ``generation`` only picks
the defaults of those switches, so ``MiniMindConfig(generation="minimind-3", **kwargs)`` is
upstream's d65ef2c ``MiniMindConfig(**kwargs)`` and plain ``MiniMindConfig(**kwargs)`` is
c090b69's. The keyword names are upstream's at both commits (d65ef2c's ``num_experts`` and
``router_aux_loss_coef`` are accepted as the names of ``n_routed_experts`` and
``aux_loss_alpha``), so a ``config.json`` written by upstream can be passed as
``MiniMindConfig(**json.load(f))`` (with ``generation="minimind-3"`` for a minimind-3 file).
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
    "use_cache", "pad_token_id",
    "_name_or_path", "return_dict", "output_hidden_states", "output_attentions",
}
_BOOL_FIELDS = ("inference_rope_scaling", "flash_attn", "use_moe", "seq_aux", "norm_topk_prob", "qk_norm",
                "tie_word_embeddings", "rms_norm_cast_after_weight", "ffn_dropout")

#: The two generations upstream has shipped (its own spellings).
GENERATIONS = ("MiniMind2", "minimind-3")
#: How the routed experts are gated, weighted and load-balanced (see ``moe.py``).
MOE_VARIANTS = GENERATIONS


class _GenerationDefault:
    """Marks a keyword whose default depends on ``generation`` (see ``GENERATION_DEFAULTS``)."""

    def __repr__(self) -> str:
        return "<generation default>"


_DEFAULT: Any = _GenerationDefault()


def default_intermediate_size(hidden_size: int) -> int:
    """MiniMind2's SwiGLU width rule: 8/3 of the hidden size, rounded up to a multiple of 64.

    ``64 * ceil(int(8 * hidden_size / 3) / 64)``; 512 -> 1408, 640 -> 1728, 768 -> 2048.
    (c090b69, ``model/model_minimind.py``: ``FeedForward.__init__``.)
    """
    return 64 * math.ceil(int(hidden_size * 8 / 3) / 64)


def minimind3_intermediate_size(hidden_size: int) -> int:
    """minimind-3's width rule: pi times the hidden size, rounded up to a multiple of 64.

    ``ceil(hidden_size * pi / 64) * 64``; 512 -> 1664, 768 -> 2432.
    (d65ef2c, ``model/model_minimind.py``: ``MiniMindConfig.__init__``.)
    """
    return math.ceil(hidden_size * math.pi / 64) * 64


#: The defaults each generation gives the switches it differs in (everything else is shared).
#: MiniMind2: c090b69 ``MiniMindConfig``; minimind-3: d65ef2c ``MiniMindConfig``.
GENERATION_DEFAULTS: Dict[str, Dict[str, Any]] = {
    "MiniMind2": dict(
        hidden_size=512, num_key_value_heads=2, rms_norm_eps=1e-05, qk_norm=False,
        rms_norm_cast_after_weight=False, ffn_dropout=True, num_experts_per_tok=2, n_shared_experts=1,
        n_routed_experts=4, aux_loss_alpha=0.01, moe_variant="MiniMind2",
    ),
    "minimind-3": dict(
        hidden_size=768, num_key_value_heads=4, rms_norm_eps=1e-06, qk_norm=True,
        rms_norm_cast_after_weight=True, ffn_dropout=False, num_experts_per_tok=1, n_shared_experts=0,
        n_routed_experts=4, aux_loss_alpha=5e-4, moe_variant="minimind-3",
    ),
}
#: The FFN width rule of each generation.
WIDTH_RULES = {"MiniMind2": default_intermediate_size, "minimind-3": minimind3_intermediate_size}
#: d65ef2c's keyword -> the field it names here (c090b69's name).
UPSTREAM_ALIASES = {"num_experts": "n_routed_experts", "router_aux_loss_coef": "aux_loss_alpha"}


class MiniMindConfig:
    """Hyper-parameters of a MiniMind model (MiniMind2 or minimind-3).

    Defaults describe MiniMind2-Small (26M): hidden 512, 8 layers, 8 query heads, 2 KV heads.
    ``generation="minimind-3"`` switches the defaults to d65ef2c's (hidden 768, 8 layers, 8 query
    heads : 4 KV heads, QK-norm, FFN width ``ceil(hidden * pi / 64) * 64``, eps 1e-6; MoE of 4
    experts, top-1, no shared expert, router loss 5e-4). Any switch can be set by hand in either
    generation (``MiniMindConfig(qk_norm=True)`` is MiniMind2 with QK-norm).

    The switches in which the generations differ:

    ==============================  ==============  ==============  =========================================
    field                           MiniMind2       minimind-3      what it does
    ==============================  ==============  ==============  =========================================
    ``num_key_value_heads``         2               4               GQA: 8 query heads share them
    ``head_dim``                    hidden / heads  hidden / heads  width of one head (minimind-3: any value)
    ``qk_norm``                     False           True            RMSNorm over head_dim on q and k, pre-RoPE
    ``intermediate_size``           8/3 rule        pi rule         SwiGLU width (``WIDTH_RULES``)
    ``rms_norm_eps``                1e-5            1e-6            RMSNorm epsilon
    ``rms_norm_cast_after_weight``  False           True            cast to the input dtype after the gain
    ``ffn_dropout``                 True            False           dropout on the FFN output
    ``tie_word_embeddings``         True            True            lm_head shares the embedding matrix
    ``moe_variant``                 MiniMind2       minimind-3      router, top-k weights, aux loss (moe.py)
    ``num_experts_per_tok``         2               1               top-k
    ``n_shared_experts``            1               0               experts every token uses
    ``aux_loss_alpha``              0.01            5e-4            load-balancing coefficient
    ``seq_aux``                     True            (none)          MiniMind2 router: per-sequence loss
    ==============================  ==============  ==============  =========================================

    A value of the wrong type raises ``TypeError``, an invalid value or combination ``ValueError``;
    both name the field and say what to pass instead.

    ``rope_scaling`` is derived, as upstream derives it, never taken from the caller
    (``YARN_ROPE_SCALING`` when ``inference_rope_scaling=True``, else ``None``); passing it with
    the derived value (a ``config.json`` written by upstream does) is fine, a different one is
    ignored with a warning (set ``config.rope_scaling`` after construction to try other YaRN
    settings). ``head_dim`` is a field of minimind-3 (d65ef2c); MiniMind2 (c090b69) derives it,
    so there a value other than ``hidden_size // num_attention_heads`` is a ``ValueError``.
    """

    def __init__(
        self,
        dropout: float = 0.0,
        bos_token_id: int = 1,
        eos_token_id: int = 2,
        hidden_act: str = "silu",
        hidden_size: int = _DEFAULT,
        intermediate_size: Optional[int] = None,
        max_position_embeddings: int = 32768,
        num_attention_heads: int = 8,
        num_hidden_layers: int = 8,
        num_key_value_heads: Optional[int] = _DEFAULT,
        vocab_size: int = 6400,
        rms_norm_eps: float = _DEFAULT,
        rope_theta: float = 1000000.0,
        inference_rope_scaling: bool = False,
        flash_attn: bool = True,
        # minimind-3's switches (MiniMind2 leaves them off)
        generation: str = "MiniMind2",
        head_dim: Optional[int] = None,
        qk_norm: bool = _DEFAULT,
        tie_word_embeddings: bool = True,
        rms_norm_cast_after_weight: bool = _DEFAULT,
        ffn_dropout: bool = _DEFAULT,
        # Mixture of experts (ignored unless use_moe=True)
        use_moe: bool = False,
        num_experts_per_tok: int = _DEFAULT,
        n_routed_experts: int = _DEFAULT,
        n_shared_experts: int = _DEFAULT,
        scoring_func: str = "softmax",
        aux_loss_alpha: float = _DEFAULT,
        seq_aux: bool = _DEFAULT,
        norm_topk_prob: bool = True,
        moe_intermediate_size: Optional[int] = None,
        moe_variant: str = _DEFAULT,
        **kwargs: Any,
    ) -> None:
        if generation not in GENERATIONS:
            raise ValueError(f"unknown generation {generation!r}; choose one of {GENERATIONS} (upstream's spellings).")
        self.generation = generation
        given = dict(hidden_size=hidden_size, num_key_value_heads=num_key_value_heads, rms_norm_eps=rms_norm_eps,
                     qk_norm=qk_norm, rms_norm_cast_after_weight=rms_norm_cast_after_weight, ffn_dropout=ffn_dropout,
                     num_experts_per_tok=num_experts_per_tok, n_shared_experts=n_shared_experts,
                     aux_loss_alpha=aux_loss_alpha, seq_aux=seq_aux, moe_variant=moe_variant,
                     n_routed_experts=n_routed_experts)
        for alias, field in UPSTREAM_ALIASES.items():  # d65ef2c's names for two c090b69 fields
            if alias in kwargs:
                value = kwargs.pop(alias)
                if given[field] is not _DEFAULT and given[field] != value:
                    raise ValueError(f"{alias}={value!r} and {field}={given[field]!r} name the same field "
                                     f"(d65ef2c's and c090b69's spelling) but disagree; pass one of them.")
                given[field] = value
        defaults = GENERATION_DEFAULTS[generation]
        v = {k: (defaults[k] if val is _DEFAULT else val) for k, val in given.items() if k != "seq_aux"}
        # MiniMind2's router has a per-sequence loss by default; minimind-3's router has no such option
        v["seq_aux"] = (v["moe_variant"] == "MiniMind2") if seq_aux is _DEFAULT else seq_aux

        self.dropout = dropout
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.hidden_act = hidden_act
        self.hidden_size = v["hidden_size"]
        self.intermediate_size = (
            _width(generation, self.hidden_size) if intermediate_size is None else intermediate_size
        )
        self.max_position_embeddings = max_position_embeddings
        self.num_attention_heads = num_attention_heads
        self.num_hidden_layers = num_hidden_layers
        # upstream: None means "as many KV heads as query heads" (plain multi-head attention)
        kv = v["num_key_value_heads"]
        self.num_key_value_heads = num_attention_heads if kv is None else kv
        self.vocab_size = vocab_size
        self.rms_norm_eps = v["rms_norm_eps"]
        self.rope_theta = rope_theta
        self.inference_rope_scaling = inference_rope_scaling
        self.rope_scaling = dict(YARN_ROPE_SCALING) if inference_rope_scaling is True else None
        self.flash_attn = flash_attn
        self._head_dim = head_dim
        self.qk_norm = v["qk_norm"]
        self.tie_word_embeddings = tie_word_embeddings
        self.rms_norm_cast_after_weight = v["rms_norm_cast_after_weight"]
        self.ffn_dropout = v["ffn_dropout"]
        self.use_moe = use_moe
        self.num_experts_per_tok = v["num_experts_per_tok"]
        self.n_routed_experts = v["n_routed_experts"]
        self.n_shared_experts = v["n_shared_experts"]
        self.scoring_func = scoring_func
        self.aux_loss_alpha = v["aux_loss_alpha"]
        self.seq_aux = v["seq_aux"]
        self.norm_topk_prob = norm_topk_prob
        self.moe_intermediate_size = moe_intermediate_size
        self.moe_variant = v["moe_variant"]

        self._check_derived_keywords(kwargs)
        unknown = sorted(set(kwargs) - _HF_KEYS - {"rope_scaling"})
        if unknown:
            warnings.warn(
                f"MiniMindConfig ignores unknown keyword(s) {unknown}; check the spelling "
                "(accepted names are upstream's, e.g. hidden_size, num_key_value_heads).",
                stacklevel=2,
            )
        self.extra_kwargs = dict(kwargs)
        self.validate()

    def _check_derived_keywords(self, kwargs: Dict[str, Any]) -> None:
        """``rope_scaling`` given as a keyword: fine when it agrees with what MiniMind derives, a warning
        when it does not."""
        if "rope_scaling" in kwargs and kwargs["rope_scaling"] != self.rope_scaling:
            warnings.warn(
                f"MiniMindConfig ignores rope_scaling={kwargs['rope_scaling']!r}: as in upstream MiniMind it is "
                f"derived from inference_rope_scaling ({self.inference_rope_scaling!r} gives "
                f"{self.rope_scaling!r}). Pass inference_rope_scaling=True for upstream's YaRN settings, or set "
                "config.rope_scaling = {...} after construction to try others.",
                stacklevel=3,
            )

    # ------------------------------------------------------------------ derived sizes
    @property
    def head_dim(self) -> int:
        """Width of one attention head: the ``head_dim`` field, by default ``hidden_size // num_attention_heads``."""
        if self._head_dim is not None:
            return self._head_dim
        heads = self.num_attention_heads
        return self.hidden_size // heads if _is_int(heads) and heads > 0 and _is_int(self.hidden_size) else 0

    @property
    def n_rep(self) -> int:
        """How many query heads share one key/value head (1 = MHA, num_heads = MQA)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def expert_intermediate_size(self) -> int:
        """Width of one routed or shared expert: ``moe_intermediate_size``, else ``intermediate_size``."""
        return self.intermediate_size if self.moe_intermediate_size is None else self.moe_intermediate_size

    @property
    def num_experts(self) -> int:
        """d65ef2c's name for ``n_routed_experts``."""
        return self.n_routed_experts

    @property
    def router_aux_loss_coef(self) -> float:
        """d65ef2c's name for ``aux_loss_alpha``."""
        return self.aux_loss_alpha

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
        if self._head_dim is None and self.hidden_size % self.num_attention_heads != 0:
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
        if self._head_dim is not None:
            if not _is_int(self._head_dim) or self._head_dim <= 0:
                raise ValueError(f"head_dim must be a positive integer or None (= hidden_size // num_attention_heads), "
                                 f"got {self._head_dim!r}.")
            derived = self.hidden_size // self.num_attention_heads
            if self.generation == "MiniMind2" and self._head_dim != derived:
                raise ValueError(
                    f"head_dim={self._head_dim!r} disagrees with hidden_size // num_attention_heads = "
                    f"{self.hidden_size!r} // {self.num_attention_heads!r} = {derived!r}: MiniMind2 (c090b69) derives "
                    "head_dim from those two. Drop head_dim, change num_attention_heads (or hidden_size) so that they "
                    "give it, or pass generation='minimind-3', whose head_dim is a free field (d65ef2c)."
                )
        if self.head_dim % 2 != 0:
            what = "head_dim" if self._head_dim is not None else "head_dim = hidden_size / num_attention_heads"
            raise ValueError(f"{what} = {self.head_dim} must be even, because RoPE rotates dimensions in pairs.")
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise ValueError(
                f"unknown hidden_act {self.hidden_act!r}; choose one of {SUPPORTED_ACTIVATIONS}."
            )
        _check_number("dropout", self.dropout, "e.g. 0.0 or 0.1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}.")
        usual_eps = GENERATION_DEFAULTS[self.generation]["rms_norm_eps"]
        _check_number("rms_norm_eps", self.rms_norm_eps, f"upstream uses {usual_eps}")
        if self.rms_norm_eps <= 0:
            raise ValueError(f"rms_norm_eps must be positive (upstream uses {usual_eps}), got {self.rms_norm_eps!r}.")
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
        if self.moe_variant not in MOE_VARIANTS:
            raise ValueError(f"unknown moe_variant {self.moe_variant!r}; choose one of {MOE_VARIANTS} "
                             "(MiniMind2's router of c090b69 or minimind-3's of d65ef2c; see minimind_ref/moe.py).")
        if self.moe_variant == "minimind-3" and self.seq_aux:
            raise ValueError("seq_aux=True is MiniMind2's per-sequence load-balancing loss; minimind-3's router "
                             "(moe_variant='minimind-3') has one batch-level loss. Drop seq_aux, or pass "
                             "moe_variant='MiniMind2'.")
        if self.moe_intermediate_size is not None and (not _is_int(self.moe_intermediate_size)
                                                       or self.moe_intermediate_size <= 0):
            raise ValueError(f"moe_intermediate_size must be a positive integer or None (= intermediate_size), "
                             f"got {self.moe_intermediate_size!r}.")
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
            name = "aux_loss_alpha" if self.moe_variant == "MiniMind2" else "router_aux_loss_coef (aux_loss_alpha)"
            usual = GENERATION_DEFAULTS[self.moe_variant]["aux_loss_alpha"]
            _check_number(name, self.aux_loss_alpha, f"upstream uses {usual}")
            if self.aux_loss_alpha < 0:
                raise ValueError(f"{name} must be >= 0, got {self.aux_loss_alpha!r}.")

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> Dict[str, Any]:
        """The constructor's keyword arguments, so ``MiniMindConfig(**c.to_dict()) == c``."""
        keys = (
            "dropout", "bos_token_id", "eos_token_id", "hidden_act", "hidden_size", "intermediate_size",
            "max_position_embeddings", "num_attention_heads", "num_hidden_layers", "num_key_value_heads",
            "vocab_size", "rms_norm_eps", "rope_theta", "inference_rope_scaling", "flash_attn", "use_moe",
            "num_experts_per_tok", "n_routed_experts", "n_shared_experts", "scoring_func", "aux_loss_alpha",
            "seq_aux", "norm_topk_prob", "generation", "qk_norm", "tie_word_embeddings",
            "rms_norm_cast_after_weight", "ffn_dropout", "moe_intermediate_size", "moe_variant",
        )
        d = {k: getattr(self, k) for k in keys}
        d["head_dim"] = self._head_dim  # None: derived from hidden_size and the head count
        return d

    def to_upstream_dict(self) -> Dict[str, Any]:
        """The keyword arguments of upstream's own ``MiniMindConfig`` of this generation (c090b69's
        names for MiniMind2, d65ef2c's for minimind-3): what its ``config.json`` holds."""
        d = self.to_dict()
        shared = ("dropout", "bos_token_id", "eos_token_id", "hidden_act", "hidden_size", "intermediate_size",
                  "max_position_embeddings", "num_attention_heads", "num_hidden_layers", "num_key_value_heads",
                  "vocab_size", "rms_norm_eps", "rope_theta", "inference_rope_scaling", "flash_attn", "use_moe",
                  "num_experts_per_tok", "norm_topk_prob")
        out = {k: d[k] for k in shared}
        if self.generation == "MiniMind2":
            out.update({k: d[k] for k in ("n_routed_experts", "n_shared_experts", "scoring_func", "aux_loss_alpha",
                                          "seq_aux")})
        else:
            out.update(head_dim=self.head_dim, tie_word_embeddings=self.tie_word_embeddings,
                       num_experts=self.n_routed_experts, moe_intermediate_size=self.expert_intermediate_size,
                       router_aux_loss_coef=self.aux_loss_alpha)
        out["rope_scaling"] = self.rope_scaling
        return out

    def replace(self, **changes: Any) -> "MiniMindConfig":
        """A copy with some fields changed (validated again). A new ``hidden_size`` recomputes the
        FFN width by the generation's rule (unless ``intermediate_size`` is given too); a new
        ``generation`` resets the switches it decides (``GENERATION_DEFAULTS``, sizes kept) unless
        they are given too."""
        d = self.to_dict()
        if "generation" in changes:
            for key in GENERATION_DEFAULTS["MiniMind2"]:
                if key != "hidden_size" and key not in changes:
                    d.pop(key, None)
            if "seq_aux" not in changes:
                d.pop("seq_aux")
            if "intermediate_size" not in changes:
                d["intermediate_size"] = None
        if "hidden_size" in changes and "intermediate_size" not in changes:
            d["intermediate_size"] = None  # recompute the width rule for the new width
        d.update(changes)
        return MiniMindConfig(**d)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MiniMindConfig) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"MiniMindConfig({body})"


def _width(generation: str, hidden_size: Any) -> Any:
    """The FFN width of ``generation`` for ``hidden_size`` (left as is when it is not a positive int,
    so ``validate`` reports the bad ``hidden_size`` itself)."""
    return WIDTH_RULES[generation](hidden_size) if _is_int(hidden_size) and hidden_size > 0 else hidden_size


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


def minimind3(**overrides: Any) -> MiniMindConfig:
    """minimind-3, 64M parameters (63,912,192): hidden 768, 8 layers, QK-norm, 8:4 GQA (d65ef2c).

    ``overrides`` take upstream's d65ef2c keyword names (``num_experts``, ``router_aux_loss_coef``, ...)."""
    return MiniMindConfig(**{"generation": "minimind-3", "hidden_size": 768, "num_hidden_layers": 8, **overrides})


def minimind3_moe(**overrides: Any) -> MiniMindConfig:
    """minimind-3-moe, 198M parameters of which 64M active (198,416,640): minimind-3 with 4 routed
    experts, top-1, no shared expert (d65ef2c)."""
    return MiniMindConfig(**{"generation": "minimind-3", "hidden_size": 768, "num_hidden_layers": 8,
                             "use_moe": True, **overrides})


#: Name -> factory for the published sizes.
PRESETS = {
    "MiniMind2-Small": minimind2_small,
    "MiniMind2": minimind2,
    "MiniMind2-MoE": minimind2_moe,
    "minimind-3": minimind3,
    "minimind-3-moe": minimind3_moe,
}


def preset(name: str, **overrides: Any) -> MiniMindConfig:
    """Config of a published model by name (see ``PRESETS``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {list(PRESETS)}.")
    return PRESETS[name](**overrides)
