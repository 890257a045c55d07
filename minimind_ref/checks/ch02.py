"""Checks for chapter 02 — Rotary position embedding (with YaRN).

Each check runs the learner's function on inputs it generates and compares the result with
``minimind_ref.rope``. A failure names the input it failed on and, when the result equals a known
mistake computed on the same input, that mistake; then a hint about it, and the line that says how to see a worked solution (``show_solution``) last:

* ``check_rotate_half(fn)``              ``fn(x)``: the vector that, times the sines, completes the rotation
  of every pair ``(x[i], x[i + d/2])`` (half-split layout)
* ``check_precompute_freqs_cis(fn)``     ``fn(dim, end, rope_base) -> (cos, sin)``, no scaling; the chapter's
  draft has three mistakes, and a failure names the ones left
* ``check_apply_rotary_pos_emb(fn)``     ``fn(q, k, cos, sin) -> (q_rot, k_rot)``
* ``check_yarn_ramp(fn)``                ``fn(dim, rope_base, original_max, beta_fast, beta_slow) -> gamma
  [dim // 2]``: YaRN's ramp, whose ends the learner derives from the frequencies
* ``check_to_half_split(fn)``            ``fn(weights, head_dim) -> weights``: an interleaved-layout
  attention layer converted to MiniMind's half-split RoPE (MiniMind2, and minimind-3 with QK-norm)
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Dict, Optional

import torch

from .. import rope
from ..attention import Attention
from ..config import YARN_ROPE_SCALING
from .core import Shortcut, call, check, check_close, expect_pair, fail, refused, seeded, solution

__all__ = [
    "check_rotate_half",
    "check_precompute_freqs_cis",
    "check_apply_rotary_pos_emb",
    "check_yarn_ramp",
    "check_to_half_split",
    "reference_yarn_frequencies",
]


def _halves(x: torch.Tensor):
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]


def _interleaved_rotate(x: torch.Tensor) -> torch.Tensor:
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


# --------------------------------------------------------------------------- rotate_half
def _rotate_mistakes(x: torch.Tensor) -> Dict[str, Callable[[], torch.Tensor]]:
    x1, x2 = _halves(x)
    return {
        "a rotation the other way (the minus sign on the other member of each pair)": lambda: torch.cat((x2, -x1), -1),
        "no minus sign (a reflection, not a rotation)": lambda: torch.cat((x2, x1), -1),
        "the halves not swapped (each member of a pair stays in its own half)": lambda: torch.cat((-x1, x2), -1),
        "neighbours paired (x[2i], x[2i+1]): the interleaved layout of the paper, not MiniMind's half-split one":
            lambda: _interleaved_rotate(x),
        "the input returned unchanged": lambda: x.clone(),
        "the halves taken along the first dimension instead of the last (a pair is (x[i], x[i + d/2]) along the "
        "last one)": lambda: torch.cat([-x.chunk(2, dim=0)[1], x.chunk(2, dim=0)[0]], dim=0),
        "the two halves joined along the first dimension instead of the last": lambda: torch.cat((-x2, x1), dim=0),
    }


solution("2.1", "half = x.shape[-1] // 2; return torch.cat((-x[..., half:], x[..., :half]), dim=-1)")


@check("Exercise 2.1 rotate_half", shown=True,
       why="one entry of the result on random tensors, whose entries the message does not show")
def check_rotate_half(fn: Callable[[torch.Tensor], torch.Tensor]) -> str:
    """``fn(x)`` must equal ``minimind_ref.rope.rotate_half(x)`` (the vector that, times the sines, turns
    ``x * cos`` into the rotation of every half-split pair) on several shapes and dtypes, and leave ``x``
    unchanged."""
    name = "Exercise 2.1 rotate_half"
    hint = ("write section 3's R(alpha) applied to one pair (x[i], x[i + d/2]): the sine term of each member comes "
            "from which member of the pair, and with which sign? rotate_half(x) puts those terms where x has the "
            "members.")
    shapes = [(2,), (8,), (3, 6), (2, 5, 4, 64), (1, 3, 2, 96)]
    shortcuts = [Shortcut("minimind_ref.rope.rotate_half", (rope, "rotate_half"))]
    refuse_hint = "derive it from section 3's matrix, as the exercise asks; minimind_ref's is the reference."
    for n, shape in enumerate(shapes):
        x = torch.randn(shape, generator=seeded(100 + n))
        case = f"x of shape {shape}"
        with refused(name, fn, shortcuts, refuse_hint):
            got = call(fn, x, name=name, case=case, check_inputs=True,
                       hint="cut the last dimension into its two halves by slicing, and join the pieces along that "
                            "dimension.")
        check_close(got, rope.rotate_half(x), name=name, case=case, hint=hint,
                    mistakes=_rotate_mistakes(x))
    x = torch.randn(2, 3, 16, generator=seeded(7)).to(torch.bfloat16)
    with refused(name, fn, shortcuts, refuse_hint):
        got = call(fn, x, name=name, case="a bfloat16 x", check_inputs=True)
    check_close(got, rope.rotate_half(x), name=name, case="a bfloat16 x", mistakes=_rotate_mistakes(x),
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


def _tables(freqs: torch.Tensor, positions: torch.Tensor, interleave: bool = False):
    angles = torch.outer(positions.float(), freqs)
    if interleave:
        return torch.cos(angles).repeat_interleave(2, -1), torch.sin(angles).repeat_interleave(2, -1)
    return torch.cat([torch.cos(angles)] * 2, -1), torch.cat([torch.sin(angles)] * 2, -1)


_DRAFT_BUGS = {  # the three mistakes of the chapter's draft precompute_freqs_cis_draft
    "exponent": "the exponent of pair i taken as i/dim instead of 2i/dim (the frequencies fall too slowly)",
    "positions": "positions starting at 1 instead of 0 (row 0 must rotate nothing)",
    "interleave": "each angle repeated in place ([a0, a0, a1, a1, ...]: the interleaved layout) instead of filling "
                  "the two halves alike, so the two members of a half-split pair get different angles",
}


def _draft_tables(dim: int, end: int, base: float, bugs) -> tuple:
    """The tables with some of the draft's mistakes left in (none: the right tables)."""
    exponent = torch.arange(dim // 2).float() if "exponent" in bugs else torch.arange(0, dim, 2)[: dim // 2].float()
    freqs = 1.0 / (base ** (exponent / dim))
    pos = torch.arange(1, end + 1) if "positions" in bugs else torch.arange(end)
    return _tables(freqs, pos, interleave="interleave" in bugs)


def _table_mistakes(dim: int, end: int, base: float, which: int) -> Dict[str, Callable[[], torch.Tensor]]:
    """What the usual wrong tables look like (``which`` 0 = cos, 1 = sin): the draft's mistakes, every
    combination of them (a failure names the ones left), then the other usual ones."""
    i2 = torch.arange(0, dim, 2)[: dim // 2].float()
    freqs = 1.0 / (base ** (i2 / dim))
    pos = torch.arange(end)
    out: Dict[str, Callable[[], torch.Tensor]] = {}
    names = list(_DRAFT_BUGS)
    for size in (3, 2, 1):
        for bugs in itertools.combinations(names, size):
            if size == 3:
                label = "the draft unchanged: all three of its mistakes are still there"
            else:
                label = " and ".join(_DRAFT_BUGS[b] for b in bugs)
                if size == 2:
                    label = f"two of the draft's mistakes still there: {label}"
            out[label] = (lambda bugs=bugs: _draft_tables(dim, end, base, bugs)[which])
    out.update({
        "the exponent's sign flipped (the frequencies must fall from 1 towards 1/rope_base, not grow)":
            lambda: _tables(base ** (i2 / dim), pos)[which],
        "half-width tables [end, dim // 2] (each table repeats its angles for the second half)":
            lambda: _tables(freqs, pos)[which][:, : dim // 2],
        "cos and sin swapped": lambda: _tables(freqs, pos)[1 - which],
        "positions 0 .. end (one row too many)": lambda: _tables(freqs, torch.arange(end + 1))[which],
    })
    return out


solution("2.2", "freqs = 1.0 / rope_base ** (torch.arange(0, dim, 2).float() / dim); angles = torch.outer(torch.arange("
                "end).float(), freqs); cos = torch.cat([angles.cos(), angles.cos()], -1), and the same for sin.")


@check("Exercise 2.2 precompute_freqs_cis", shown=True,
       why="one entry of a cos/sin table; section 4 states the frequencies, the exercise is about the draft's mistakes")
def check_precompute_freqs_cis(fn: Callable[..., Any]) -> str:
    """``fn(dim, end, rope_base)`` must return ``(cos, sin)`` equal to ``minimind_ref``'s tables."""
    name = "Exercise 2.2 precompute_freqs_cis"
    hint = ("run rope_properties on your function: each property that fails points at one part of the tables (the "
            "exponent of each pair against section 4's formula, which positions the rows stand for, and which "
            "columns of a row must hold the same angle for a half-split pair).")
    shortcuts = [Shortcut("minimind_ref.rope.precompute_freqs_cis", (rope, "precompute_freqs_cis")),
                 Shortcut("minimind_ref.rope.rope_frequencies", (rope, "rope_frequencies")),
                 Shortcut("minimind_ref.rope.scaled_frequencies", (rope, "scaled_frequencies"))]
    refuse_hint = ("fix the draft's own lines: the frequencies are one of the things to get right, so compute them "
                   "with section 4's formula; minimind_ref's tables are the reference.")
    for dim, end, base in _TABLE_CASES:
        case = f"precompute_freqs_cis(dim={dim}, end={end}, rope_base={base:g})"
        with refused(name, fn, shortcuts, refuse_hint):
            got = call(fn, dim, end, base, name=name, case=case,
                       hint="the arguments are plain Python numbers: dim and end are ints, rope_base a float.")
        cos, sin = expect_pair(got, name, "cos, sin")
        ref_cos, ref_sin = rope.precompute_freqs_cis(dim, end, base)
        # Equivalent formulas for rope_base ** (-2i/dim) differ in the last fp32 bits of a frequency,
        # and the angle m * freq multiplies that by the position: the tolerance grows with ``end``
        # (4e-4 at 2,048 positions, 1.6e-3 at 8,192), still far below what any layout or formula
        # mistake produces (differences of order 1).
        atol = max(1e-5, 2e-7 * end)
        dtype_hint = "the tables are float32: compute the angles in float32."
        for which, (got_t, ref_t, label) in enumerate(((cos, ref_cos, "cos"), (sin, ref_sin, "sin"))):
            wrong_dtype = isinstance(got_t, torch.Tensor) and got_t.dtype != ref_t.dtype
            check_close(got_t, ref_t, name=name, case=f"the {label} table of {case}", rtol=0, atol=atol,
                        hint=dtype_hint if wrong_dtype else hint,
                        mistakes=_table_mistakes(dim, end, base, which))
    return f"{len(_TABLE_CASES)} (dim, end, rope_base) cases match minimind_ref.rope.precompute_freqs_cis"


# --------------------------------------------------------------------------- apply_rotary_pos_emb
def _apply_mistakes(q, k, cos, sin, which: int) -> Dict[str, Callable[[], torch.Tensor]]:
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    x = (q, k)[which]

    def out(v: torch.Tensor) -> torch.Tensor:
        return v.to(x.dtype)

    return {
        "the sine term subtracted (a rotation by minus the angle)":
            lambda: out(x * c - rope.rotate_half(x) * s),
        "the interleaved rotate_half (neighbours paired) with the half-split tables":
            lambda: out(x * c + _interleaved_rotate(x) * s),
        "this tensor returned without rotation": lambda: x.clone(),
        "cos and sin swapped": lambda: out(x * s + rope.rotate_half(x) * c),
        "every position rotated by the first row's angles": lambda: out(x * c[:1] + rope.rotate_half(x) * s[:1]),
        "the tables lined up with the heads axis instead of the sequence axis (row t must rotate every head of "
        "token t)": lambda: out(x * cos[None] + rope.rotate_half(x) * sin[None]),
    }


solution("2.3", "cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [seq, 1, head_dim]: broadcast over the heads; "
                "q_embed = (q * cos + rotate_half(q) * sin).to(q.dtype), the same for k.")


@check("Exercise 2.3 apply_rotary_pos_emb", shown=True,
       why="one entry of the rotation of random tensors, whose entries the message does not show")
def check_apply_rotary_pos_emb(fn: Callable[..., Any]) -> str:
    """``fn(q, k, cos, sin)`` must rotate ``q`` ``[b, s, h, d]`` and ``k`` ``[b, s, kv, d]`` like
    ``minimind_ref`` does, for tables sliced at a start position, in bfloat16, and with as many positions
    as heads (a table broadcast over the wrong axis then runs), and leave the inputs unchanged."""
    name = "Exercise 2.3 apply_rotary_pos_emb"
    cases = [
        # (batch, seq, heads, kv_heads, dim, start_pos, dtype)
        (2, 7, 8, 2, 64, 3, torch.float32),
        (1, 5, 4, 4, 96, 1000, torch.float32),
        (3, 1, 2, 1, 8, 31, torch.float32),
        (1, 6, 8, 2, 64, 0, torch.bfloat16),
        (2, 4, 4, 4, 16, 9, torch.float32),  # as many positions as heads: a table lined up with the heads runs
    ]
    hint = ("compare with section 5's rotation: which table multiplies which term, and how row t of the tables lines "
            "up with sequence position t, the same for every batch entry and every head; q and k both rotate.")
    crash_hint = ("a size mismatch means cos/sin [seq, head_dim] do not line up with q [batch, seq, heads, "
                  "head_dim]: broadcasting pairs the axes from the right, so say which axis of q the tables' rows "
                  "belong to.")
    for n, (b, s, h, kv, d, start, dtype) in enumerate(cases):
        g = seeded(200 + n)
        q = torch.randn(b, s, h, d, generator=g).to(dtype)
        k = torch.randn(b, s, kv, d, generator=g).to(dtype)
        cos, sin = rope.precompute_freqs_cis(d, start + s, 1e6)
        cos, sin = cos[start:start + s], sin[start:start + s]
        case = f"q {tuple(q.shape)}, k {tuple(k.shape)}, cos/sin {tuple(cos.shape)} (positions {start}..{start + s - 1}), {dtype}"
        with refused(name, fn, [Shortcut("minimind_ref.rope.apply_rotary_pos_emb", (rope, "apply_rotary_pos_emb"))],
                     "write it with your rotate_half, as section 5 rotates one vector; minimind_ref's is the reference."):
            got = call(fn, q, k, cos, sin, name=name, case=case, hint=crash_hint, check_inputs=True)
        got_q, got_k = expect_pair(got, name, "q_embed, k_embed")
        ref_q, ref_k = rope.apply_rotary_pos_emb(q, k, cos, sin)
        for which, (got_t, ref_t, label) in enumerate(((got_q, ref_q, "q"), (got_k, ref_k, "k"))):
            wrong_dtype = isinstance(got_t, torch.Tensor) and got_t.dtype != ref_t.dtype
            check_close(got_t, ref_t, name=name, case=f"the {label} result for {case}",
                        hint=("the tables are float32, so the products come out float32: cast each result back to "
                              "its input's dtype.") if wrong_dtype else hint,
                        mistakes=_apply_mistakes(q, k, cos, sin, which))
    return f"{len(cases)} cases (GQA shapes, offset positions, bfloat16) match minimind_ref"


# --------------------------------------------------------------------------- YaRN frequencies
def reference_yarn_frequencies(dim: int, end: int, rope_base: float = 1e6,
                               rope_scaling: Optional[Dict[str, Any]] = None) -> torch.Tensor:
    """The frequencies ``minimind_ref.rope.precompute_freqs_cis`` uses, shape ``[dim // 2]``, fp32."""
    return rope.scaled_frequencies(dim, end, rope_base, rope_scaling)[0]


_RAMP_CASES = [
    # (dim, rope_base, original_max, beta_fast, beta_slow); every fractional end lies at least 0.01 from a
    # whole index, so float32 and float64 arithmetic round them alike (tests/test_checks_ch02.py checks it)
    (64, 1e6, 2048, 32, 1),       # MiniMind2-Small with MiniMind's settings: low 5, high 14
    (96, 1e6, 2048, 32, 1),       # MiniMind2 and minimind-3
    (80, 1e6, 2048, 32, 1),       # MiniMind2-MoE
    (64, 1e4, 1024, 16, 2),       # other base, length and betas
    (128, 5e5, 4096, 32, 1.5),    # a fractional beta
    (32, 1e4, 64, 32, 1),         # the fast end falls below pair 0: low is clamped to 0
    (16, 1e4, 180_000, 32, 1),    # the slow end falls past the last pair: high is clamped to dim // 2 - 1
    (48, 1e6, 8192, 64, 4),
    (64, 1e6, 160_000_000, 32, 1),  # both ends past the last pair: they meet at pair 31, the ramp is 0 everywhere
    (32, 1e4, 64, 64, 16),          # both ends before pair 0: they meet at pair 0, the ramp is 0 there and 1 after
]


def _ramp_index(dim: int, base: float, original_max: float, turns: float, *, two_pi: bool = True,
                exponent: float = 2.0) -> float:
    """The fractional pair index that makes ``turns`` turns in ``original_max`` positions (a mistake switched in
    by ``two_pi=False``, turns counted in radians, or ``exponent=1``, frequencies base ** (-i/dim))."""
    per_turn = 2 * math.pi if two_pi else 1.0
    return dim * math.log(original_max / (turns * per_turn)) / (exponent * math.log(base))


def _ramp_variant(dim: int, base: float, original_max: float, beta_fast: float, beta_slow: float, *,
                  two_pi: bool = True, exponent: float = 2.0, rounding: str = "outward", clamp_ends: bool = True,
                  clamp_ramp: bool = True, reverse: bool = False, swap_betas: bool = False,
                  guard: bool = True) -> torch.Tensor:
    """YaRN's ramp with one typical mistake switched in (the defaults are the right answer; ``guard=False``
    divides by the distance of the two ends as it is, also where they meet or cross)."""
    if swap_betas:
        beta_fast, beta_slow = beta_slow, beta_fast
    lo_i = _ramp_index(dim, base, original_max, beta_fast, two_pi=two_pi, exponent=exponent)
    hi_i = _ramp_index(dim, base, original_max, beta_slow, two_pi=two_pi, exponent=exponent)
    lo, hi = {"outward": (math.floor(lo_i), math.ceil(hi_i)), "inward": (math.ceil(lo_i), math.floor(hi_i)),
              "nearest": (round(lo_i), round(hi_i)), "none": (lo_i, hi_i)}[rounding]
    if clamp_ends:
        lo, hi = max(lo, 0), min(hi, dim // 2 - 1)
    ramp = (torch.arange(dim // 2).float() - lo) / (max(hi - lo, 0.001) if guard else float(hi - lo))
    if clamp_ramp:
        ramp = torch.clamp(ramp, 0, 1)
    return 1 - ramp if reverse else ramp


_RAMP_SWAPPED = "beta_fast and beta_slow swapped (beta_fast, the larger number of turns, sets the low end)"
_RAMP_UNGUARDED = ("the distance between the two ends used as the divisor where the ends meet (it is 0 there, and 0 / 0 "
                   "is NaN)")
_RAMP_HINTS = {
    _RAMP_UNGUARDED: ("the exercise says what the ramp is where its two ends meet or cross: make your division defined "
                      "there, and check that case's values against that description."),
    _RAMP_SWAPPED: "which end does a pair that turns many times belong to: the fast one or the slow one?",
    _RAMP_SWAPPED + ", the ends then crossed": "which end does a pair that turns many times belong to: the fast one or "
                                               "the slow one?",
}
_RAMP_MISTAKES = {
    "the turns of a pair counted in radians (a turn is 2 pi radians)": dict(two_pi=False),
    "the pair index solved from base ** (-i/dim) instead of section 4's frequencies (pair i has the exponent -2i/dim)":
        dict(exponent=1.0),
    "the fractional ends rounded inward (low up, high down) instead of outward": dict(rounding="inward"),
    "the fractional ends rounded to the nearest index instead of outward (low down, high up)": dict(rounding="nearest"),
    "the fractional ends not rounded to whole pair indices": dict(rounding="none"),
    "the ends not clamped to the pairs that exist (low no lower than the first pair, high no higher than the last)":
        dict(clamp_ends=False),
    "the ramp not clamped to [0, 1] outside its two ends": dict(clamp_ramp=False),
    "the ramp reversed (1 for the fast pairs, 0 for the slow ones)": dict(reverse=True),
    _RAMP_SWAPPED: dict(swap_betas=True, guard=False),
    _RAMP_SWAPPED + ", the ends then crossed": dict(swap_betas=True),
    _RAMP_UNGUARDED: dict(guard=False),
}


def _ramp_mistakes(case) -> Dict[str, Callable[[], torch.Tensor]]:
    def thunk(kwargs):
        return lambda: _ramp_variant(*case, **kwargs)
    return {description: thunk(kwargs) for description, kwargs in _RAMP_MISTAKES.items()}


def reference_yarn_frequencies(dim: int, end: int, rope_base: float = 1e6,
                               rope_scaling: Optional[Dict[str, Any]] = None) -> torch.Tensor:
    """The frequencies ``minimind_ref.rope.precompute_freqs_cis`` uses, shape ``[dim // 2]``, fp32."""
    return rope.scaled_frequencies(dim, end, rope_base, rope_scaling)[0]


solution("2.4", "def index_for(turns): return dim * math.log(original_max / (turns * 2 * math.pi)) / (2 * math.log("
                "rope_base)); low = max(math.floor(index_for(beta_fast)), 0); high = min(math.ceil(index_for("
                "beta_slow)), dim // 2 - 1); return torch.clamp((torch.arange(dim // 2).float() - low) / max(high - "
                "low, 0.001), 0, 1)   # pair i makes original_max * theta_i / (2 pi) turns; solved for i")


@check("Exercise 2.4 yarn_ramp", shown=True,
       why="one value of the ramp, between 0 and 1; the exercise is about the two ends, which the message does not "
           "show")
def check_yarn_ramp(fn: Callable[..., Any]) -> str:
    """``fn(dim, rope_base, original_max, beta_fast, beta_slow)`` must return YaRN's ramp, ``[dim // 2]``
    float32 values in [0, 1], equal to ``minimind_ref.rope.yarn_ramp``: 0 up to the pair index that makes
    ``beta_fast`` turns in ``original_max`` positions (rounded down), 1 from the one that makes ``beta_slow``
    turns (rounded up), linear in between, the ends clamped to the pairs that exist; where the two ends meet (both
    past the last pair, or both before the first), a step: 0 up to the pair where they meet, 1 after it."""
    name = "Exercise 2.4 yarn_ramp"
    shortcuts = [Shortcut("minimind_ref.rope.yarn_ramp", (rope, "yarn_ramp")),
                 Shortcut("minimind_ref.rope.scaled_frequencies", (rope, "scaled_frequencies")),
                 Shortcut("minimind_ref.rope.precompute_freqs_cis", (rope, "precompute_freqs_cis"))]
    refuse_hint = "derive the two ends from section 4's frequencies, as the exercise asks; minimind_ref's is the reference."
    hint = ("section 4 gives pair i's frequency and its period: from them, how many turns pair i makes in "
            "original_max positions; set that equal to a number of turns and solve for i. Then the two ends are "
            "whole indices, rounded as section 9 says and kept within the pairs that exist.")
    for case in _RAMP_CASES:
        dim, base, original_max, beta_fast, beta_slow = case
        label = (f"yarn_ramp(dim={dim}, rope_base={base:g}, original_max={original_max}, beta_fast={beta_fast:g}, "
                 f"beta_slow={beta_slow:g})")
        with refused(name, fn, shortcuts, refuse_hint):
            got = call(fn, dim, base, original_max, beta_fast, beta_slow, name=name, case=label,
                       hint="the arguments are plain Python numbers; return a tensor of dim // 2 values.")
        expected = rope.yarn_ramp(dim, base, original_max, beta_fast, beta_slow)
        wrong_dtype = isinstance(got, torch.Tensor) and got.dtype != expected.dtype
        check_close(got, expected, name=name, case=label, mistakes=_ramp_mistakes(case), mistake_hints=_RAMP_HINTS,
                    hint="the ramp is float32, like the frequencies it scales." if wrong_dtype else hint)
    return (f"{len(_RAMP_CASES)} settings (MiniMind's, other widths, bases and betas, ends clamped, ends that meet) "
            "match minimind_ref")


# --------------------------------------------------------------------------- 2.5 an interleaved checkpoint
def _layout_config(qk_norm: bool, head_dim: int):
    from ..config import MiniMindConfig

    if qk_norm:  # minimind-3: QK-norm, a free head_dim, 4 query heads : 2 KV heads
        return MiniMindConfig(generation="minimind-3", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=head_dim, num_hidden_layers=1, vocab_size=32, max_position_embeddings=64)
    return MiniMindConfig(hidden_size=4 * head_dim, num_attention_heads=4, num_key_value_heads=2,
                          num_hidden_layers=1, vocab_size=32, max_position_embeddings=64)


def _rope_interleaved(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """The paper's RoPE: pair (x[2i], x[2i+1]) rotated by position * theta_i. ``x`` [b, s, heads, d]."""
    freqs = rope.rope_frequencies(x.shape[-1], base)
    angles = torch.outer(positions.float(), freqs)[None, :, None, :]  # [1, s, 1, d/2]
    even, odd = x[..., 0::2], x[..., 1::2]
    rotated = (even * angles.cos() - odd * angles.sin(), odd * angles.cos() + even * angles.sin())
    return torch.stack(rotated, dim=-1).flatten(-2)


def _interleaved_attention(weights: Dict[str, torch.Tensor], cfg, x: torch.Tensor) -> torch.Tensor:
    """The output of the interleaved-layout layer these weights come from (causal, GQA, no cache)."""
    import math

    b, s, _ = x.shape
    d, h, kv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    q = (x @ weights["q_proj.weight"].T).view(b, s, h, d)
    k = (x @ weights["k_proj.weight"].T).view(b, s, kv, d)
    v = (x @ weights["v_proj.weight"].T).view(b, s, kv, d)
    if "q_norm.weight" in weights:
        eps = cfg.rms_norm_eps
        q = weights["q_norm.weight"] * (q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + eps))
        k = weights["k_norm.weight"] * (k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps))
    positions = torch.arange(s)
    q, k = _rope_interleaved(q, positions, cfg.rope_theta), _rope_interleaved(k, positions, cfg.rope_theta)
    k, v = (t.repeat_interleave(h // kv, dim=2) for t in (k, v))
    scores = q.transpose(1, 2) @ k.permute(0, 2, 3, 1) / math.sqrt(d)
    scores = scores + torch.full((s, s), float("-inf")).triu(1)
    out = torch.softmax(scores, -1) @ v.transpose(1, 2)
    return out.transpose(1, 2).reshape(b, s, h * d) @ weights["o_proj.weight"].T


def _run_half_split(weights: Dict[str, torch.Tensor], cfg, x: torch.Tensor) -> torch.Tensor:
    """``minimind_ref.Attention`` (half-split RoPE) loaded strictly with ``weights``, on ``x``."""
    with torch.device("meta"):
        attn = Attention(cfg)
    attn = attn.to_empty(device="cpu")
    attn.load_state_dict(weights, strict=True)
    cos, sin = rope.precompute_freqs_cis(cfg.head_dim, x.shape[1], cfg.rope_theta)
    with torch.no_grad():
        return attn.eval()(x, (cos, sin))[0]


def _reorder(weights: Dict[str, torch.Tensor], d: int, *, perm: str = "per_head", names=("q", "k"),
             gains: str = "permuted", extra=(), k_as_q: bool = False) -> Dict[str, torch.Tensor]:
    """The conversion with one typical mistake switched in (the defaults are the right answer)."""
    half = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
    order = half if perm != "inverse" else torch.argsort(half)
    out = dict(weights)
    for n in names:
        w = weights[f"{n}_proj.weight"]
        if perm == "whole_matrix":
            rows = w.shape[0]
            out[f"{n}_proj.weight"] = w[torch.cat([torch.arange(0, rows, 2), torch.arange(1, rows, 2)])]
        elif perm == "columns":
            out[f"{n}_proj.weight"] = w.reshape(w.shape[0], -1, d)[:, :, order].reshape(w.shape)
        else:
            out[f"{n}_proj.weight"] = w.view(-1, d, w.shape[-1])[:, order].reshape(w.shape)
    for n in ("q", "k"):
        if f"{n}_norm.weight" in weights and gains != "kept":
            out[f"{n}_norm.weight"] = weights[f"{n}_norm.weight"][order]
    if k_as_q:  # k_proj cut into as many row groups as q_proj has heads
        w, n_q = weights["k_proj.weight"], weights["q_proj.weight"].shape[0] // d
        part = w.shape[0] // n_q
        out["k_proj.weight"] = w.reshape(n_q, part, w.shape[-1])[:, torch.cat(
            [torch.arange(0, part, 2), torch.arange(1, part, 2)])].reshape(w.shape)
    for n in extra:  # tensors that must not change
        w = weights[f"{n}_proj.weight"]
        out[f"{n}_proj.weight"] = w.view(-1, d, w.shape[-1])[:, order].reshape(w.shape) if n == "v" else w[:, torch.cat(
            [torch.arange(j * d, (j + 1) * d)[order] for j in range(w.shape[1] // d)])]
    return out


_LAYOUT_MISTAKES = {
    "the weights returned unchanged (the interleaved pairs then meet the half-split rotation)": None,
    "the rows permuted over the whole projection at once (all heads are stacked in q_proj and k_proj: each head "
    "needs its own permutation)": dict(perm="whole_matrix"),
    "the inverse permutation (each head's rows moved the other way)":
        dict(perm="inverse"),
    "the columns of q_proj and k_proj permuted instead of their rows (a projection's rows produce the query's and "
    "key's dimensions)": dict(perm="columns"),
    "only q_proj converted (the keys are rotated too)": dict(names=("q",)),
    "only k_proj converted (the queries are rotated too)": dict(names=("k",)),
    "q_norm and k_norm left as they were (their gains multiply the same dimensions the rows of q_proj and "
    "k_proj produce, so they move with them)": dict(gains="kept"),
    "v_proj permuted as well (values are not rotated: permuting them changes what o_proj reads)":
        dict(extra=("v",)),
    "o_proj's columns permuted (o_proj reads the values, which RoPE never touches)": dict(extra=("o",)),
    "k_proj cut into as many heads as q_proj (it holds num_key_value_heads heads of head_dim rows each)":
        dict(k_as_q=True),
}


def _layout_mistakes(weights, cfg, x) -> Dict[str, Callable[[], torch.Tensor]]:
    def thunk(kwargs):
        def compute() -> torch.Tensor:
            converted = dict(weights) if kwargs is None else _reorder(weights, cfg.head_dim, **kwargs)
            return _run_half_split(converted, cfg, x)
        return compute
    return {description: thunk(kwargs) for description, kwargs in _LAYOUT_MISTAKES.items()}


solution("2.5", "perm = torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)]); out = dict(weights); "
                "for q_proj and k_proj: out[name] = w.view(-1, head_dim, w.shape[1])[:, perm].reshape(w.shape); for "
                "q_norm and k_norm (if present): out[name] = weights[name][perm]; v_proj and o_proj unchanged")


@check("Exercise 2.5 to_half_split", shown=True,
       why="one entry of an attention layer's output on random weights and inputs")
def check_to_half_split(fn: Callable[..., Any]) -> str:
    """``fn(weights, head_dim) -> dict``: an interleaved-layout layer's weights (the keys of
    ``minimind_ref.Attention``'s state dict) converted so that ``minimind_ref.Attention`` (half-split
    RoPE) loaded with them computes what the interleaved layer computed; with and without QK-norm."""
    name = "Exercise 2.5 to_half_split"
    hint = ("section 6 permutes the rows of one head's W_q and W_k; a layer stacks its heads in q_proj and k_proj, "
            "and a minimind-3 layer also multiplies every query and key dimension by its own gain (QK-norm). "
            "Go through the six tensors and decide for each whether RoPE's pairing touches it.")
    g = seeded(205)
    for qk_norm, head_dim in [(False, 16), (True, 24), (True, 8)]:
        cfg = _layout_config(qk_norm, head_dim)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(2050 + head_dim)
            weights = {k: v.detach().clone() for k, v in Attention(cfg).state_dict().items()}
        if qk_norm:
            weights["q_norm.weight"] = torch.rand(head_dim, generator=g) * 1.5 + 0.25
            weights["k_norm.weight"] = torch.rand(head_dim, generator=g) * 1.5 + 0.25
        x = torch.randn(2, 7, cfg.hidden_size, generator=g)
        kind = (f"a minimind-3 layer with QK-norm, head_dim {head_dim}" if qk_norm
                else f"a MiniMind2 layer, head_dim {head_dim}") + f", {cfg.num_attention_heads} query heads sharing " \
            f"{cfg.num_key_value_heads} KV heads"
        got = call(fn, weights, head_dim, name=name, case=kind, check_inputs=True,
                   hint="weights maps state-dict keys ('q_proj.weight', ...) to tensors; return a new dict.")
        if not isinstance(got, dict):
            fail(name, f"expected a dict of weights, got {type(got).__name__} (on {kind})", "return a new dict.")
        if set(got) != set(weights) or any(tuple(got[k].shape) != tuple(weights[k].shape) for k in weights):
            fail(name, f"the converted dict must have the same keys and shapes as the input (on {kind}); got keys "
                 f"{sorted(got)} with shapes {[tuple(got[k].shape) for k in sorted(got)]}"[:400],
                 "return a new dict with every key of the input, each tensor converted to its own shape.")
        with torch.no_grad():
            expected = _interleaved_attention(weights, cfg, x)
        try:
            out = _run_half_split(got, cfg, x)
        except Exception as err:  # wrong dtypes and the like
            fail(name, f"minimind_ref.Attention could not run with your weights: {type(err).__name__}: {err} "
                 f"(on {kind})"[:400], hint)
        check_close(out, expected, name=name, case=f"{kind}, the layer's output", hint=hint, rtol=1e-4, atol=1e-5,
                    mistakes=_layout_mistakes(weights, cfg, x))
    return "MiniMind2 and minimind-3 layers (QK-norm gains included) compute what the interleaved layer computed"
