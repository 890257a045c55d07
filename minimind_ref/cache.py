"""The KV cache format, and an optional preallocated cache that appends in place.

Public format (upstream's): a list with one ``(k, v)`` per layer, each ``[batch, t, n_kv_heads,
head_dim]``; the next call concatenates the new keys/values after them (``torch.cat`` copies the
whole cache every step). ``GrowingKV`` is still exactly such a ``(k, v)`` tuple, but its tensors are
views into buffers allocated once for the longest sequence, so appending is a write of the new
positions only. Values are identical either way; only the copying differs.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch


class GrowingKV(tuple):
    """A ``(k, v)`` pair viewing the first ``length`` positions of preallocated buffers
    ``[batch, capacity, n_kv_heads, head_dim]``."""

    k_buffer: torch.Tensor
    v_buffer: torch.Tensor

    def __new__(cls, k_buffer: torch.Tensor, v_buffer: torch.Tensor, length: int) -> "GrowingKV":
        pair = super().__new__(cls, (k_buffer[:, :length], v_buffer[:, :length]))
        pair.k_buffer, pair.v_buffer = k_buffer, v_buffer
        return pair

    @property
    def capacity(self) -> int:
        return self.k_buffer.shape[1]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> "GrowingKV":
        """Write ``k, v`` ``[batch, s, n_kv_heads, head_dim]`` after the cached positions."""
        start = self[0].shape[1]
        end = start + k.shape[1]
        if end > self.capacity:
            raise ValueError(f"preallocated KV cache is full: {end} positions needed, capacity {self.capacity}.")
        self.k_buffer[:, start:end] = k
        self.v_buffer[:, start:end] = v
        return GrowingKV(self.k_buffer, self.v_buffer, end)


def append_kv(past: Optional[Tuple[torch.Tensor, torch.Tensor]], k: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Cached keys/values followed by the new ones, along the sequence axis (dim 1)."""
    if past is None:
        return k, v
    if isinstance(past, GrowingKV):
        return past.append(k, v)
    return torch.cat([past[0], k], dim=1), torch.cat([past[1], v], dim=1)


def preallocate(past_key_values: Sequence[Tuple[torch.Tensor, torch.Tensor]], capacity: int) -> List[GrowingKV]:
    """Copy an ordinary cache into buffers with room for ``capacity`` positions."""
    out = []
    for k, v in past_key_values:
        batch, length, n_kv_heads, head_dim = k.shape
        k_buf = k.new_empty(batch, capacity, n_kv_heads, head_dim)
        v_buf = v.new_empty(batch, capacity, n_kv_heads, head_dim)
        k_buf[:, :length] = k
        v_buf[:, :length] = v
        out.append(GrowingKV(k_buf, v_buf, length))
    return out


def check_cache(past_key_values: Sequence[Any], config: Any, batch: int, device: torch.device) -> int:
    """Check a cache against the model and the new tokens; return its length ``t`` (0 if empty).

    ``past_key_values`` holds one entry per layer: all ``None`` (no cache yet) or all ``(k, v)``
    pairs shaped ``[batch, t, n_kv_heads, head_dim]`` with the same ``t``. Only shapes, devices and
    types are read (no values), so this costs no device synchronisation.
    """
    n_layers, n_kv, head_dim = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
    if len(past_key_values) != n_layers:
        raise ValueError(
            f"past_key_values has {len(past_key_values)} entries but the model has {n_layers} layers; pass the "
            "past_key_values returned by this model (use_cache=True)."
        )
    if all(entry is None for entry in past_key_values):
        return 0
    length = None
    for i, entry in enumerate(past_key_values):
        if entry is None:
            raise ValueError(f"past_key_values[{i}] is None while other layers have a cache; pass every layer's (k, v) or none.")
        if not isinstance(entry, (tuple, list)) or len(entry) != 2 or not all(isinstance(t, torch.Tensor) for t in entry):
            raise TypeError(
                f"past_key_values[{i}] must be a (k, v) pair of tensors [batch, t, n_kv_heads, head_dim], "
                f"got {type(entry).__name__}; pass the past_key_values this model returned."
            )
        k, v = entry
        expected = (batch, k.shape[1] if k.dim() == 4 else "t", n_kv, head_dim)
        if k.dim() != 4 or k.shape != v.shape or (k.shape[0], k.shape[2], k.shape[3]) != (batch, n_kv, head_dim):
            hint = ""
            if k.dim() == 4 and (k.shape[1], k.shape[3]) == (n_kv, head_dim) and k.shape[2] != n_kv:
                hint = (" It looks like the [batch, kv_heads, t, head_dim] layout (Hugging Face's); MiniMind stores "
                        "[batch, t, kv_heads, head_dim]: use k.transpose(1, 2), v.transpose(1, 2).")
            elif k.dim() == 4 and k.shape[0] != batch:
                hint = f" The cache was built for a batch of {k.shape[0]}, the input has {batch} rows."
            elif k.dim() == 4:
                hint = " The cache comes from a model with another num_key_value_heads or head size."
            raise ValueError(
                f"past_key_values[{i}] has k {tuple(k.shape)} and v {tuple(v.shape)}, expected both "
                f"[batch, t, n_kv_heads, head_dim] = {expected}.{hint}"
            )
        if length is None:
            length = k.shape[1]
        elif k.shape[1] != length:
            raise ValueError(
                f"cache layers have different lengths: layer 0 holds {length} positions, layer {i} holds "
                f"{k.shape[1]}; every layer must cache the same tokens."
            )
        if k.device != device or v.device != device:
            raise ValueError(f"past_key_values[{i}] is on {k.device}, the input on {device}; move them to one device.")
    return int(length)
