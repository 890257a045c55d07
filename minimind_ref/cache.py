"""The KV cache format, and an optional preallocated cache that appends in place.

Public format (upstream's): a list with one ``(k, v)`` per layer, each ``[batch, t, n_kv_heads,
head_dim]``; the next call concatenates the new keys/values after them (``torch.cat`` copies the
whole cache every step). ``GrowingKV`` is still exactly such a ``(k, v)`` tuple, but its tensors are
views into buffers allocated once for the longest sequence, so appending is a write of the new
positions only. Values are identical either way; only the copying differs.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

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
