"""Checks for chapter 02 — Rotary position embedding (with YaRN).

Each check runs the learner's function on inputs it generates and compares the result with
``minimind_ref.rope``:

* ``check_rotate_half(fn)``              ``fn(x) -> [-x2, x1]`` (half-split layout)
* ``check_precompute_freqs_cis(fn)``     ``fn(dim, end, rope_base) -> (cos, sin)``, no scaling
* ``check_apply_rotary_pos_emb(fn)``     ``fn(q, k, cos, sin) -> (q_rot, k_rot)``
* ``check_yarn_frequencies(fn)``         ``fn(dim, end, rope_base, rope_scaling) -> freqs [dim // 2]``
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch

from .. import rope
from ..config import YARN_ROPE_SCALING
from .core import ExerciseError, call, check, check_close, expect_pair, seeded

__all__ = [
    "check_rotate_half",
    "check_precompute_freqs_cis",
    "check_apply_rotary_pos_emb",
    "check_yarn_frequencies",
    "reference_yarn_frequencies",
]


# --------------------------------------------------------------------------- rotate_half
@check("rotate_half")
def check_rotate_half(fn: Callable[[torch.Tensor], torch.Tensor]) -> str:
    """``fn(x)`` must equal ``minimind_ref.rope.rotate_half(x)`` on several shapes and dtypes."""
    name = "rotate_half"
    shapes = [(2,), (8,), (3, 6), (2, 5, 4, 64), (1, 3, 2, 96)]
    for n, shape in enumerate(shapes):
        x = torch.randn(shape, generator=seeded(100 + n))
        x_before = x.clone()
        got = call(fn, x, name=name)
        check_close(
            got, rope.rotate_half(x), name=f"{name} on shape {shape}",
            hint="split the last dimension into halves x1 = x[..., :d/2], x2 = x[..., d/2:] and return "
            "cat([-x2, x1]); the minus sign goes on the SECOND half, and pairs are (x[i], x[i + d/2]), "
            "not neighbours (x[2i], x[2i+1]).",
        )
        if not torch.equal(x, x_before):
            raise ExerciseError(f"[{name}] your function changed its input in place; return a new tensor instead.")
    x = torch.randn(2, 3, 16, generator=seeded(7)).to(torch.bfloat16)
    check_close(call(fn, x, name=name), rope.rotate_half(x), name=f"{name} in bfloat16",
                hint="keep the input's dtype (torch.cat of slices does that).")
    return f"{len(shapes) + 1} shapes/dtypes match minimind_ref.rope.rotate_half"


# --------------------------------------------------------------------------- precompute_freqs_cis
_TABLE_CASES = [
    # (dim, end, rope_base)
    (64, 2048, 1e6),
    (64, 8192, 1e6),
    (96, 300, 1e6),
    (8, 17, 10000.0),
    (2, 5, 10000.0),
    (16, 1, 500.0),
]


@check("precompute_freqs_cis")
def check_precompute_freqs_cis(fn: Callable[..., Any]) -> str:
    """``fn(dim, end, rope_base)`` must return ``(cos, sin)`` equal to ``minimind_ref``'s tables."""
    name = "precompute_freqs_cis"
    for dim, end, base in _TABLE_CASES:
        case = f"{name}(dim={dim}, end={end}, rope_base={base:g})"
        cos, sin = expect_pair(call(fn, dim, end, base, name=name), case, "cos, sin")
        ref_cos, ref_sin = rope.precompute_freqs_cis(dim, end, base)
        # Equivalent formulas for rope_base ** (-2i/dim) differ in the last fp32 bits of a frequency,
        # and the angle m * freq multiplies that by the position: the tolerance grows with ``end``
        # (4e-4 at 2,048 positions, 1.6e-3 at 8,192), still far below what any layout or formula
        # mistake produces (differences of order 1).
        atol = max(1e-5, 2e-7 * end)
        hint = ("freqs[i] = rope_base ** (-2i / dim) for i = 0 .. dim/2 - 1 (the exponent is 2i/dim, "
                "i.e. torch.arange(0, dim, 2) / dim), angles = outer(arange(end), freqs) in float32, and each "
                "table is cat([cos(angles), cos(angles)], -1) — the halves are repeated, not interleaved.")
        check_close(cos, ref_cos, name=f"{case}: cos", hint=hint, rtol=0, atol=atol)
        check_close(sin, ref_sin, name=f"{case}: sin", hint=hint, rtol=0, atol=atol)
    return f"{len(_TABLE_CASES)} (dim, end, rope_base) cases match minimind_ref.rope.precompute_freqs_cis"


# --------------------------------------------------------------------------- apply_rotary_pos_emb
@check("apply_rotary_pos_emb")
def check_apply_rotary_pos_emb(fn: Callable[..., Any]) -> str:
    """``fn(q, k, cos, sin)`` must rotate ``q`` ``[b, s, h, d]`` and ``k`` ``[b, s, kv, d]`` like
    ``minimind_ref`` does, for tables sliced at a start position and in bfloat16."""
    name = "apply_rotary_pos_emb"
    cases = [
        # (batch, seq, heads, kv_heads, dim, start_pos, dtype)
        (2, 7, 8, 2, 64, 0, torch.float32),
        (1, 5, 4, 4, 96, 1000, torch.float32),
        (3, 1, 2, 1, 8, 31, torch.float32),
        (1, 6, 8, 2, 64, 0, torch.bfloat16),
    ]
    for n, (b, s, h, kv, d, start, dtype) in enumerate(cases):
        g = seeded(200 + n)
        q = torch.randn(b, s, h, d, generator=g).to(dtype)
        k = torch.randn(b, s, kv, d, generator=g).to(dtype)
        cos, sin = rope.precompute_freqs_cis(d, start + s, 1e6)
        cos, sin = cos[start:start + s], sin[start:start + s]
        case = f"{name} with q {tuple(q.shape)}, k {tuple(k.shape)}, positions {start}..{start + s - 1}, {dtype}"
        got_q, got_k = expect_pair(call(fn, q, k, cos, sin, name=name), case, "q_embed, k_embed")
        ref_q, ref_k = rope.apply_rotary_pos_emb(q, k, cos, sin)
        hint = ("x_embed = x * cos + rotate_half(x) * sin, with cos/sin unsqueezed to [seq, 1, dim] so they "
                "broadcast over heads; cast the results back to q.dtype / k.dtype.")
        check_close(got_q, ref_q, name=f"{case}: q", hint=hint)
        check_close(got_k, ref_k, name=f"{case}: k", hint=hint)
    return f"{len(cases)} cases (GQA shapes, offset positions, bfloat16) match minimind_ref"


# --------------------------------------------------------------------------- YaRN frequencies
def reference_yarn_frequencies(dim: int, end: int, rope_base: float = 1e6,
                               rope_scaling: Optional[Dict[str, Any]] = None) -> torch.Tensor:
    """The frequencies ``minimind_ref.rope.precompute_freqs_cis`` uses, shape ``[dim // 2]``, fp32."""
    return rope.scaled_frequencies(dim, end, rope_base, rope_scaling)[0]


_YARN_CASES = [
    # (dim, end, rope_base, rope_scaling)
    (64, 32768, 1e6, dict(YARN_ROPE_SCALING)),
    (64, 2048, 1e6, dict(YARN_ROPE_SCALING)),   # end == original_max: no scaling
    (64, 1000, 1e6, dict(YARN_ROPE_SCALING)),   # shorter than original_max: no scaling
    (64, 2049, 1e6, dict(YARN_ROPE_SCALING)),   # one past: scaling on
    (96, 32768, 1e6, dict(YARN_ROPE_SCALING)),
    (64, 8192, 1e4, {"factor": 4, "original_max_position_embeddings": 1024, "beta_fast": 16, "beta_slow": 2}),
    (32, 4096, 1e6, None),
]


@check("yarn_frequencies")
def check_yarn_frequencies(fn: Callable[..., Any]) -> str:
    """``fn(dim, end, rope_base, rope_scaling)`` must return the (possibly YaRN-scaled)
    frequencies ``[dim // 2]`` that ``minimind_ref`` uses to build its tables."""
    name = "yarn_frequencies"
    for dim, end, base, scaling in _YARN_CASES:
        case = f"{name}(dim={dim}, end={end}, rope_base={base:g}, rope_scaling={scaling})"
        got = call(fn, dim, end, base, scaling, name=name)
        expected = reference_yarn_frequencies(dim, end, base, scaling)
        hint = ("start from freqs = rope_base ** (-2i/dim); if rope_scaling is given AND "
                "end / original_max_position_embeddings > 1, compute the ramp gamma (0 for fast pairs, 1 for "
                "slow ones, yarn_ramp(dim, rope_base, original_max, beta_fast, beta_slow)) and return "
                "freqs * ((1 - gamma) + gamma / factor); otherwise return freqs unchanged.")
        check_close(got, expected, name=case, hint=hint)
    return f"{len(_YARN_CASES)} cases (scaling on, off at end <= original_max, other settings) match minimind_ref"
