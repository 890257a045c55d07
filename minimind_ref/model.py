"""The MiniMind2 decoder: pre-norm blocks, final norm and a tied language-model head.

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
from .config import MiniMindConfig
from .ffn import FeedForward
from .moe import MOEFeedForward
from .norm import RMSNorm
from .rope import precompute_freqs_cis


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
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
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
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
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
    ) -> int:
        """Validate the inputs with messages a learner can act on; return the start position."""
        if not isinstance(input_ids, torch.Tensor):
            raise TypeError(f"input_ids must be a torch.Tensor of token ids, got {type(input_ids).__name__}.")
        if input_ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            raise TypeError(
                f"input_ids must hold integer token ids (torch.long), got dtype {input_ids.dtype}; "
                "did you pass embeddings or forget .long()?"
            )
        if input_ids.dim() != 2:
            raise ValueError(
                f"input_ids must have shape [batch, seq_len], got {tuple(input_ids.shape)}; "
                "use input_ids.unsqueeze(0) for a single sequence."
            )
        if input_ids.shape[1] == 0:
            raise ValueError("input_ids is empty (seq_len 0); pass at least one token.")
        lo, hi = (int(v) for v in torch.aminmax(input_ids))
        if lo < 0 or hi >= self.vocab_size:
            bad = hi if hi >= self.vocab_size else lo
            raise ValueError(
                f"token id {bad} is outside the vocabulary [0, {self.vocab_size - 1}]; check the tokenizer "
                f"matches the model (vocab_size={self.vocab_size})."
            )
        if len(past_key_values) != len(self.layers):
            raise ValueError(
                f"past_key_values has {len(past_key_values)} entries but the model has {len(self.layers)} layers."
            )
        first = past_key_values[0]
        start_pos = first[0].shape[1] if first is not None else 0
        end = start_pos + input_ids.shape[1]
        if end > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence too long: positions {start_pos}..{end - 1} exceed max_position_embeddings="
                f"{self.config.max_position_embeddings}; truncate the input (or the cache) or build the "
                "model with a larger max_position_embeddings."
            )
        if attention_mask is not None and tuple(attention_mask.shape) != (input_ids.shape[0], end):
            raise ValueError(
                f"attention_mask must have shape [batch, cached + new tokens] = {(input_ids.shape[0], end)}, "
                f"got {tuple(attention_mask.shape)}."
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
        """Returns ``(hidden_states [b, s, hidden], presents, aux_loss)``."""
        past_key_values = list(past_key_values) if past_key_values else [None] * len(self.layers)
        start_pos = self._check_inputs(input_ids, attention_mask, past_key_values)
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


class MiniMindForCausalLM(nn.Module):
    """MiniMind2 language model: ``MiniMindModel`` + a linear head tied to the embedding."""

    def __init__(self, config: Optional[MiniMindConfig] = None) -> None:
        super().__init__()
        self.config = config or MiniMindConfig()
        self.model = MiniMindModel(self.config)
        self.lm_head = nn.Linear(self.config.hidden_size, self.config.vocab_size, bias=False)
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
        ``loss`` is the cross-entropy only; training adds ``aux_loss`` for MoE models."""
        hidden_states, presents, aux_loss = self.model(input_ids, attention_mask, past_key_values, use_cache)
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, keep, :])
        loss = None
        if labels is not None:
            if labels.shape != input_ids.shape:
                raise ValueError(f"labels must have the shape of input_ids {tuple(input_ids.shape)}, got {tuple(labels.shape)}.")
            shift_logits = logits[..., :-1, :].contiguous()
            shift_labels = labels[..., 1:].contiguous()
            loss = F.cross_entropy(
                shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1), ignore_index=-100
            )
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
