"""The MiniMind decoder (MiniMind2 and minimind-3): pre-norm blocks, final norm, language-model head.

    tokens [b, s] -> embed_tokens -> N x MiniMindBlock -> norm -> lm_head -> logits [b, s, vocab]

Each block:  h = h + Attention(RMSNorm(h));  h = h + FFN(RMSNorm(h)).
The KV cache is a list with one ``(k, v)`` per layer, each ``[b, t, n_kv_heads, head_dim]``; the
positions of new tokens start at the cache length ``t``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from .attention import Attention, KVCache
from .cache import check_cache
from .config import MiniMindConfig
from .ffn import FeedForward
from .moe import MOEFeedForward
from .norm import RMSNorm
from .rope import precompute_freqs_cis


#: Deliberate differences from upstream MiniMind (c090b69 and d65ef2c), by name. Everything else
#: matches upstream to float rounding (tests/test_upstream_parity.py, tests/test_upstream_parity_minimind3.py);
#: each entry is tested there too.
UPSTREAM_DIFFERENCES = {
    "loss_without_targets": (
        "a batch without any supervised position (every shifted label is -100) has loss 0 with zero "
        "gradients; upstream's mean cross-entropy divides by zero and gives NaN."
    ),
}


@dataclass
class CausalLMOutput:
    """What ``MiniMindForCausalLM.forward`` returns (field names as in Hugging Face)."""

    logits: torch.Tensor
    loss: Optional[torch.Tensor] = None
    aux_loss: Optional[torch.Tensor] = None
    past_key_values: Optional[List[Optional[KVCache]]] = None
    hidden_states: Optional[torch.Tensor] = None

    def __getitem__(self, key: str):
        return getattr(self, key)


class MiniMindBlock(nn.Module):
    """One pre-norm transformer layer: attention and FFN, each wrapped in RMSNorm + residual."""

    def __init__(self, layer_id: int, config: MiniMindConfig) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.self_attn = Attention(config)
        norm = dict(eps=config.rms_norm_eps, cast_after_weight=config.rms_norm_cast_after_weight)
        self.input_layernorm = RMSNorm(config.hidden_size, **norm)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, **norm)
        self.mlp = MOEFeedForward(config) if config.use_moe else FeedForward(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: Tuple[torch.Tensor, torch.Tensor],
        past_key_value: Optional[KVCache] = None,
        use_cache: bool = False,
        attention_mask: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, Optional[KVCache]]:
        residual = hidden_states
        attn_out, present = self.self_attn(
            self.input_layernorm(hidden_states), position_embeddings, past_key_value, use_cache, attention_mask
        )
        hidden_states = residual + attn_out
        hidden_states = hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states, present


class MiniMindModel(nn.Module):
    """Embedding, the stack of blocks and the final norm (no head). Returns hidden states."""

    def __init__(self, config: MiniMindConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config
        self.vocab_size = config.vocab_size
        self.num_hidden_layers = config.num_hidden_layers
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList([MiniMindBlock(i, config) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps,
                            cast_after_weight=config.rms_norm_cast_after_weight)
        freqs_cos, freqs_sin = precompute_freqs_cis(
            dim=config.head_dim,
            end=config.max_position_embeddings,
            rope_base=config.rope_theta,
            rope_scaling=config.rope_scaling,
        )
        self.register_buffer("freqs_cos", freqs_cos, persistent=False)
        self.register_buffer("freqs_sin", freqs_sin, persistent=False)

    def _check_inputs(
        self,
        input_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        past_key_values: Sequence[Optional[KVCache]],
        labels: Optional[torch.Tensor] = None,
    ) -> int:
        """Validate the inputs with messages a learner can act on; return the start position.

        Shapes and dtypes are checked in Python (free); the token-id range of ``input_ids`` (and of
        ``labels``, when given) needs the values, read in one ``.tolist()`` per forward.
        """
        if not isinstance(input_ids, torch.Tensor):
            raise TypeError(f"input_ids must be a torch.Tensor of token ids, got {type(input_ids).__name__}.")
        if input_ids.dtype not in (torch.int64, torch.int32):
            hint = (
                "did you pass embeddings or forget .long()?" if input_ids.is_floating_point() or input_ids.dtype == torch.bool
                else f"{input_ids.dtype} is too narrow for a vocabulary of {self.vocab_size} tokens; build the ids "
                "with dtype=torch.long (or call .long())."
            )
            raise TypeError(f"input_ids must hold integer token ids as torch.long (or torch.int32), got dtype {input_ids.dtype}; {hint}")
        if input_ids.dim() != 2:
            raise ValueError(
                f"input_ids must have shape [batch, seq_len], got {tuple(input_ids.shape)}; "
                "use input_ids.unsqueeze(0) for a single sequence."
            )
        batch, seq_len = input_ids.shape
        if batch == 0:
            raise ValueError("input_ids holds a batch of 0 sequences (shape [0, seq_len]); pass at least one row.")
        if seq_len == 0:
            raise ValueError("input_ids is empty (seq_len 0); pass at least one token.")
        start_pos = check_cache(past_key_values, self.config, batch, input_ids.device)
        end = start_pos + seq_len
        if end > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence too long: positions {start_pos}..{end - 1} exceed max_position_embeddings="
                f"{self.config.max_position_embeddings}; truncate the input (or the cache) or build the "
                "model with a larger max_position_embeddings."
            )
        if attention_mask is not None:
            if not isinstance(attention_mask, torch.Tensor):
                raise TypeError(
                    f"attention_mask must be a torch.Tensor [batch, cached + new tokens] of 1 (token) / 0 (padding), "
                    f"got {type(attention_mask).__name__}."
                )
            if tuple(attention_mask.shape) != (batch, end):
                raise ValueError(
                    f"attention_mask must have shape [batch, cached + new tokens] = {(batch, end)}, "
                    f"got {tuple(attention_mask.shape)} (1 = token, 0 = padding; MiniMind builds the causal part itself)."
                )
            if attention_mask.is_complex():
                raise TypeError(f"attention_mask must hold 0/1 values (bool, integer or float), got dtype {attention_mask.dtype}.")
        if labels is not None:
            if not isinstance(labels, torch.Tensor):
                raise TypeError(f"labels must be a torch.Tensor of token ids (-100 = ignore), got {type(labels).__name__}.")
            if labels.shape != input_ids.shape:
                raise ValueError(f"labels must have the shape of input_ids {tuple(input_ids.shape)}, got {tuple(labels.shape)}.")
            if labels.dtype not in (torch.int64, torch.int32):
                raise TypeError(
                    f"labels must hold integer token ids as torch.long (-100 = ignore), got dtype {labels.dtype}; "
                    "use input_ids (or a copy with -100 where no loss is wanted), not probabilities."
                )
        # one host read for every value check: min/max id, whether a label is out of range, whether
        # the mask holds anything but 0/1 (a 2 or a 0.5 would weigh the padding bias, not mask it)
        stats = [input_ids.min(), input_ids.max()]
        if labels is not None:
            bad = ((labels < 0) & (labels != -100)) | (labels >= self.vocab_size)
            stats.append(bad.any().to(input_ids.dtype))
        check_mask = attention_mask is not None and attention_mask.dtype != torch.bool
        if check_mask:
            stats.append(((attention_mask != 0) & (attention_mask != 1)).any().to(input_ids.dtype).to(input_ids.device))
        values = torch.stack(stats).tolist()
        if check_mask and values[-1]:
            raise ValueError(
                f"attention_mask must hold only 1 (token) and 0 (padding), got values "
                f"{attention_mask.unique().tolist()[:6]}; build it as (ids != pad_id).long() or a bool tensor."
            )
        lo, hi = values[0], values[1]
        if lo < 0 or hi >= self.vocab_size:
            bad_id = hi if hi >= self.vocab_size else lo
            raise ValueError(
                f"token id {bad_id} is outside the vocabulary [0, {self.vocab_size - 1}]; check the tokenizer "
                f"matches the model (vocab_size={self.vocab_size})."
            )
        if labels is not None and values[2]:
            raise ValueError(
                f"labels hold a value outside the vocabulary [0, {self.vocab_size - 1}] that is not the ignore "
                "index -100; use the token ids as labels and -100 for positions without a loss."
            )
        return start_pos

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        past_key_values: Optional[Sequence[Optional[KVCache]]] = None,
        use_cache: bool = False,
        **kwargs,
    ) -> Tuple[torch.Tensor, List[Optional[KVCache]], torch.Tensor]:
        """Returns ``(hidden_states [b, s, hidden], presents, aux_loss)``. A ``labels`` keyword is only
        validated here (its range check shares the one host read with ``input_ids``)."""
        if isinstance(past_key_values, torch.Tensor) or (past_key_values is not None
                                                          and not isinstance(past_key_values, (list, tuple))):
            raise TypeError(f"past_key_values must be a list with one (k, v) pair of tensors per layer (what this model "
                            f"returned with use_cache=True) or None, got a {type(past_key_values).__name__}"
                            + (f" of shape {tuple(past_key_values.shape)}" if isinstance(past_key_values, torch.Tensor)
                               else "") + ".")
        past_key_values = list(past_key_values) if past_key_values else [None] * len(self.layers)
        start_pos = self._check_inputs(input_ids, attention_mask, past_key_values, kwargs.get("labels"))
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            attention_mask = attention_mask.long()  # the padding term is (1 - mask) * -1e9
        seq_len = input_ids.shape[1]
        hidden_states = self.dropout(self.embed_tokens(input_ids))
        position_embeddings = (
            self.freqs_cos[start_pos : start_pos + seq_len],
            self.freqs_sin[start_pos : start_pos + seq_len],
        )
        presents: List[Optional[KVCache]] = []
        for layer, past_key_value in zip(self.layers, past_key_values):
            hidden_states, present = layer(
                hidden_states, position_embeddings, past_key_value=past_key_value,
                use_cache=use_cache, attention_mask=attention_mask,
            )
            presents.append(present)
        hidden_states = self.norm(hidden_states)
        aux_loss = hidden_states.new_zeros(())
        for layer in self.layers:
            if isinstance(layer.mlp, MOEFeedForward):
                aux_loss = aux_loss + layer.mlp.aux_loss
        return hidden_states, presents, aux_loss


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits[:, i]`` against ``labels[:, i + 1]``, ignoring label -100.

    ``logits`` ``[b, s, vocab]``, ``labels`` ``[b, s]``; returns a 0-d tensor. Computed as the
    summed loss over the supervised positions divided by their count (at least 1), which is
    upstream's mean whenever one position is supervised and 0 (with zero gradients, not NaN)
    when none is. No host synchronisation: the count stays on the device.
    """
    shift_logits = logits[..., :-1, :].contiguous()
    shift_labels = labels[..., 1:].contiguous().view(-1)
    total = F.cross_entropy(
        shift_logits.view(-1, shift_logits.size(-1)), shift_labels, ignore_index=-100, reduction="sum"
    )
    count = (shift_labels != -100).sum().clamp(min=1)
    return total / count


def _check_logits_to_keep(
    logits_to_keep: Union[int, torch.Tensor], input_ids: torch.Tensor, labels: Optional[torch.Tensor]
) -> Union[slice, torch.Tensor]:
    """The index that selects the kept positions, or a clear error."""
    if isinstance(logits_to_keep, torch.Tensor):
        if logits_to_keep.dim() != 1 or logits_to_keep.is_floating_point():
            raise TypeError(
                f"logits_to_keep as a tensor must be a 1-D tensor of integer positions, got shape "
                f"{tuple(logits_to_keep.shape)} and dtype {logits_to_keep.dtype}."
            )
        if labels is not None:
            raise ValueError(
                "logits_to_keep (a tensor of positions) cannot be combined with labels: the loss needs the logits of "
                "every position. Pass logits_to_keep=0 with labels."
            )
        return logits_to_keep
    if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int):
        raise TypeError(
            f"logits_to_keep must be an int (0 = all positions, k = the last k) or a 1-D tensor of positions, "
            f"got {logits_to_keep!r}."
        )
    if logits_to_keep < 0:
        raise ValueError(
            f"logits_to_keep must be >= 0 (0 = all positions, k = the last k), got {logits_to_keep}."
        )
    seq_len = input_ids.shape[-1] if isinstance(input_ids, torch.Tensor) and input_ids.dim() > 0 else 0
    if labels is not None and 0 < logits_to_keep < seq_len:
        raise ValueError(
            f"logits_to_keep={logits_to_keep} keeps only the last {logits_to_keep} of {seq_len} positions, but "
            "the loss (labels=...) needs every position. Pass logits_to_keep=0 with labels."
        )
    return slice(-logits_to_keep, None)


class MiniMindForCausalLM(nn.Module):
    """MiniMind language model: ``MiniMindModel`` + a linear head, tied to the embedding when
    ``config.tie_word_embeddings`` (always in MiniMind2; a switch in minimind-3, on by default)."""

    def __init__(self, config: Optional[MiniMindConfig] = None) -> None:
        super().__init__()
        self.config = config or MiniMindConfig()
        self.model = MiniMindModel(self.config)
        self.lm_head = nn.Linear(self.config.hidden_size, self.config.vocab_size, bias=False)
        if self.config.tie_word_embeddings:
            # Weight tying: the head's (Linear-initialised) matrix is the embedding table as well.
            self.model.embed_tokens.weight = self.lm_head.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        labels: Optional[torch.Tensor] = None,
        past_key_values: Optional[Sequence[Optional[KVCache]]] = None,
        use_cache: bool = False,
        logits_to_keep: Union[int, torch.Tensor] = 0,
        **kwargs,
    ) -> CausalLMOutput:
        """Logits for every position (or the last ``logits_to_keep``) and, with ``labels``, the
        next-token cross-entropy: position ``i`` predicts ``labels[i+1]``; label -100 is ignored.
        ``loss`` is the cross-entropy only; training adds ``aux_loss`` for MoE models.

        ``logits_to_keep``: ``0`` keeps every position, ``k > 0`` the last ``k``, a 1-D tensor the
        listed positions. A loss needs every position, so with ``labels`` only ``0`` (or a ``k``
        covering the whole sequence) is accepted.

        Difference from upstream (deliberate: ``UPSTREAM_DIFFERENCES["loss_without_targets"]``): when
        no position has a target (every shifted label is -100, e.g. an SFT batch whose answers were all truncated
        away) the loss is 0 with zero gradients; upstream's ``F.cross_entropy`` mean gives NaN.
        Otherwise the loss equals upstream's."""
        keep = _check_logits_to_keep(logits_to_keep, input_ids, labels)
        hidden_states, presents, aux_loss = self.model(
            input_ids, attention_mask, past_key_values, use_cache, labels=labels
        )
        logits = self.lm_head(hidden_states[:, keep, :])
        loss = None
        if labels is not None:
            loss = next_token_loss(logits, labels)
        return CausalLMOutput(
            logits=logits, loss=loss, aux_loss=aux_loss,
            past_key_values=presents, hidden_states=hidden_states,
        )

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def generate(self, input_ids: torch.Tensor, **kwargs) -> torch.Tensor:
        """See ``minimind_ref.generation.generate``."""
        from .generation import generate

        return generate(self, input_ids, **kwargs)
