"""Chapter 02 checks: the reference passes, stubs and typical mistakes fail with a clear message."""

from __future__ import annotations

import math

import pytest
import torch

from minimind_ref import rope
from minimind_ref.checks import ch02
from minimind_ref.checks.core import ExerciseError
from minimind_ref.config import YARN_ROPE_SCALING


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise 2.x: implement me")


# The learner's side of the checks: own copies of the reference functions (the checks switch minimind_ref's
# off while the learner's function runs, so a wrong version built on them would only be refused).
def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _apply_rotary(q, k, cos, sin, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return (q * cos + _rotate_half(q) * sin).to(q.dtype), (k * cos + _rotate_half(k) * sin).to(k.dtype)


# --------------------------------------------------------------------------- wrong versions
def rotate_half_wrong_sign(x):
    half = x.shape[-1] // 2
    return torch.cat((x[..., half:], -x[..., :half]), dim=-1)


def rotate_half_no_sign(x):
    half = x.shape[-1] // 2
    return torch.cat((x[..., half:], x[..., :half]), dim=-1)


def rotate_half_interleaved(x):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def rotate_half_in_place(x):
    out = _rotate_half(x)
    x.zero_()
    return out


def freqs_ok(dim, base):
    return 1.0 / (base ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))


def tables_from(freqs, end, interleave=False):
    angles = torch.outer(torch.arange(end).float(), freqs)
    if interleave:
        return torch.cos(angles).repeat_interleave(2, -1), torch.sin(angles).repeat_interleave(2, -1)
    return torch.cat([torch.cos(angles)] * 2, -1), torch.cat([torch.sin(angles)] * 2, -1)


def precompute_ok(dim, end, base):
    return tables_from(freqs_ok(dim, base), end)


def precompute_other_formula(dim, end, base):
    # base ** (-2i/dim) computed another way: equal up to fp32 rounding, must pass.
    freqs = torch.exp(-torch.arange(0, dim, 2).float() / dim * torch.log(torch.tensor(float(base))))
    return tables_from(freqs, end)


def precompute_exponent_i_over_dim(dim, end, base):
    return tables_from(1.0 / (base ** (torch.arange(0, dim // 2).float() / dim)), end)


def precompute_exponent_dim(dim, end, base):
    return tables_from(1.0 / (base ** (torch.arange(0, dim // 2).float() * dim)), end)


def precompute_interleaved(dim, end, base):
    return tables_from(freqs_ok(dim, base), end, interleave=True)


def precompute_half_width(dim, end, base):
    angles = torch.outer(torch.arange(end).float(), freqs_ok(dim, base))
    return torch.cos(angles), torch.sin(angles)


def precompute_swapped(dim, end, base):
    cos, sin = precompute_ok(dim, end, base)
    return sin, cos


def precompute_off_by_one(dim, end, base):
    angles = torch.outer(torch.arange(1, end + 1).float(), freqs_ok(dim, base))
    return torch.cat([torch.cos(angles)] * 2, -1), torch.cat([torch.sin(angles)] * 2, -1)


def precompute_float64(dim, end, base):
    cos, sin = precompute_ok(dim, end, base)
    return cos.double(), sin.double()


def apply_ok_low_precision(q, k, cos, sin):
    # computes in q's dtype (bf16 tables): a legitimate variant, must pass.
    cos, sin = cos.unsqueeze(1).to(q.dtype), sin.unsqueeze(1).to(q.dtype)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def apply_minus(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return ((q * cos - _rotate_half(q) * sin).to(q.dtype), (k * cos - _rotate_half(k) * sin).to(k.dtype))


def apply_interleaved(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return ((q * cos + rotate_half_interleaved(q) * sin).to(q.dtype),
            (k * cos + rotate_half_interleaved(k) * sin).to(k.dtype))


def apply_q_only(q, k, cos, sin):
    q2, _ = _apply_rotary(q, k, cos, sin)
    return q2, k


def apply_no_cast(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def apply_first_row_only(q, k, cos, sin):
    # every token rotated by the first row's angles (positions ignored within the chunk)
    return _apply_rotary(q, k, cos[:1].expand_as(cos), sin[:1].expand_as(sin))


def _unused_apply_unsqueeze_0(q, k, cos, sin):
    # broadcasting over the wrong axis: crashes (or silently misaligns) instead of covering the heads
    return _apply_rotary(q, k, cos, sin, unsqueeze_dim=0)


def ramp_ok(dim, base, original_max, beta_fast, beta_slow):
    return ch02._ramp_variant(dim, base, original_max, beta_fast, beta_slow)  # the defaults are the right answer


def ramp_float32_index(dim, base, original_max, beta_fast, beta_slow):
    # the fractional ends computed in float32 tensors: far enough from whole indices, must pass
    def index_for(turns):
        t = torch.tensor(float(original_max) / (turns * 2 * math.pi))
        return float(dim * torch.log(t) / (2 * torch.log(torch.tensor(float(base)))))
    low = max(math.floor(index_for(beta_fast)), 0)
    high = min(math.ceil(index_for(beta_slow)), dim // 2 - 1)
    return torch.clamp((torch.arange(dim // 2).float() - low) / max(high - low, 0.001), 0, 1)


def ramp_variant(**kwargs):
    return lambda *args: ch02._ramp_variant(*args, **kwargs)


# --------------------------------------------------------------------------- tests
CHECKS = {
    "rotate_half": (ch02.check_rotate_half, _rotate_half),
    "precompute": (ch02.check_precompute_freqs_cis, precompute_ok),
    "apply": (ch02.check_apply_rotary_pos_emb, _apply_rotary),
    "yarn_ramp": (ch02.check_yarn_ramp, ramp_ok),
}


@pytest.mark.parametrize("key", sorted(CHECKS))
def test_reference_passes(key, capsys):
    check_fn, good = CHECKS[key]
    check_fn(good)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize("key", sorted(CHECKS))
def test_stub_fails_with_not_implemented(key):
    check_fn, _ = CHECKS[key]
    with pytest.raises(AssertionError, match="not implemented yet"):
        check_fn(stub)


def test_ramp_with_float32_ends_passes():
    ch02.check_yarn_ramp(ramp_float32_index)


@pytest.mark.parametrize("case", ch02._RAMP_CASES)
def test_ramp_cases_keep_their_ends_away_from_whole_indices(case):
    """float32 and float64 arithmetic must round every fractional end alike: at least 0.01 from a whole index."""
    dim, base, original_max, beta_fast, beta_slow = case
    for turns in (beta_fast, beta_slow):
        v = ch02._ramp_index(dim, base, original_max, turns)
        assert min(v - math.floor(v), math.ceil(v) - v) > 0.01, (case, turns, v)


def test_ramp_cases_clamp_both_ends_somewhere():
    lows = [ch02._ramp_index(d, b, L, bf) for d, b, L, bf, _ in ch02._RAMP_CASES]
    highs = [ch02._ramp_index(d, b, L, bs) - (d // 2 - 1) for d, b, L, _, bs in ch02._RAMP_CASES]
    assert min(lows) < 0 and max(highs) > 0


@pytest.mark.parametrize("good", [precompute_other_formula])
def test_equivalent_precompute_passes(good):
    ch02.check_precompute_freqs_cis(good)


def test_apply_in_low_precision_passes():
    ch02.check_apply_rotary_pos_emb(apply_ok_low_precision)


def rotate_half_halves_not_swapped(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., :half], x[..., half:]), dim=-1)


def rotate_half_float32(x):
    return _rotate_half(x).float()


def precompute_positive_exponent(dim, end, base):
    return tables_from(base ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim), end)


def precompute_one_row_too_many(dim, end, base):
    return tables_from(freqs_ok(dim, base), end + 1)


def apply_no_unsqueeze(q, k, cos, sin):
    return (q * cos + _rotate_half(q) * sin).to(q.dtype), (k * cos + _rotate_half(k) * sin).to(k.dtype)


def apply_swapped_tables(q, k, cos, sin):
    return _apply_rotary(q, k, sin, cos)


def apply_in_place(q, k, cos, sin):
    q_rot, k_rot = _apply_rotary(q, k, cos, sin)
    q.copy_(q_rot)
    return q, k_rot


def apply_returns_one(q, k, cos, sin):
    return _apply_rotary(q, k, cos, sin)[0]


def precompute_draft(dim, end, base):  # the chapter's draft, unchanged
    freqs = 1.0 / base ** (torch.arange(dim // 2) / dim)
    angles = torch.outer(torch.arange(1, end + 1), freqs)
    return angles.cos().repeat_interleave(2, dim=-1), angles.sin().repeat_interleave(2, dim=-1)


def precompute_draft_layout_fixed(dim, end, base):  # the draft with its layout fixed: two mistakes left
    freqs = 1.0 / base ** (torch.arange(dim // 2) / dim)
    angles = torch.outer(torch.arange(1, end + 1), freqs)
    return torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)


def apply_heads_axis(q, k, cos, sin):  # the tables broadcast against the heads axis: runs when seq == heads
    return ((q * cos[None] + _rotate_half(q) * sin[None]).to(q.dtype),
            (k * cos[None] + _rotate_half(k) * sin[None]).to(k.dtype))


def apply_heads_axis_guarded(q, k, cos, sin):  # the same mistake, where it runs at all
    if q.shape[1] == q.shape[2] == k.shape[2]:
        return apply_heads_axis(q, k, cos, sin)
    return _apply_rotary(q, k, cos, sin)


def ramp_float64(*args):
    return ramp_ok(*args).double()


# (check, wrong answer, text the failure must contain: the named mistake, or the failing input)
WRONG = [
    (ch02.check_rotate_half, rotate_half_wrong_sign, "this looks like a rotation the other way"),
    (ch02.check_rotate_half, rotate_half_no_sign, "this looks like no minus sign"),
    (ch02.check_rotate_half, rotate_half_halves_not_swapped, "this looks like the halves not swapped"),
    (ch02.check_rotate_half, rotate_half_interleaved, "this looks like neighbours paired"),
    (ch02.check_rotate_half, rotate_half_in_place, "changed its input (argument 1) in place"),
    (ch02.check_rotate_half, lambda x: x, "this looks like the input returned unchanged"),
    (ch02.check_rotate_half, rotate_half_float32, "dtype mismatch: expected torch.bfloat16"),
    (ch02.check_precompute_freqs_cis, precompute_exponent_i_over_dim, "this looks like the exponent of pair i taken as i/dim instead of 2i/dim"),
    (ch02.check_precompute_freqs_cis, precompute_positive_exponent, "this looks like the exponent's sign flipped"),
    (ch02.check_precompute_freqs_cis, precompute_exponent_dim, "values differ"),
    (ch02.check_precompute_freqs_cis, precompute_interleaved, "this looks like each angle repeated in place"),
    (ch02.check_precompute_freqs_cis, precompute_half_width, "this looks like half-width tables"),
    (ch02.check_precompute_freqs_cis, precompute_swapped, "this looks like cos and sin swapped"),
    (ch02.check_precompute_freqs_cis, precompute_off_by_one, "this looks like positions starting at 1"),
    (ch02.check_precompute_freqs_cis, precompute_one_row_too_many, "this looks like positions 0 .. end (one row too many)"),
    (ch02.check_precompute_freqs_cis, precompute_float64, "dtype mismatch: expected torch.float32, got torch.float64"),
    (ch02.check_precompute_freqs_cis, precompute_draft, "this looks like the draft unchanged"),
    (ch02.check_precompute_freqs_cis, precompute_draft_layout_fixed, "this looks like two of the draft's mistakes still "
     "there: the exponent of pair i taken as i/dim instead of 2i/dim (the frequencies fall too slowly) and positions "
     "starting at 1 instead of 0"),
    (ch02.check_precompute_freqs_cis, lambda dim, end, base: precompute_ok(dim, end, base)[0], "expected a pair (cos, sin)"),
    (ch02.check_apply_rotary_pos_emb, apply_minus, "this looks like the sine term subtracted"),
    (ch02.check_apply_rotary_pos_emb, apply_interleaved, "this looks like the interleaved rotate_half"),
    (ch02.check_apply_rotary_pos_emb, apply_q_only, "this looks like this tensor returned without rotation"),
    (ch02.check_apply_rotary_pos_emb, apply_q_only, "(on the k result for q"),
    (ch02.check_apply_rotary_pos_emb, apply_no_cast, "dtype mismatch: expected torch.bfloat16, got torch.float32"),
    (ch02.check_apply_rotary_pos_emb, apply_first_row_only, "this looks like every position rotated by the first row's angles"),
    (ch02.check_apply_rotary_pos_emb, apply_swapped_tables, "this looks like cos and sin swapped"),
    (ch02.check_apply_rotary_pos_emb, apply_heads_axis, "raised RuntimeError"),
    (ch02.check_apply_rotary_pos_emb, apply_heads_axis, "broadcasting pairs the axes from the right"),
    (ch02.check_apply_rotary_pos_emb, apply_heads_axis_guarded, "this looks like the tables lined up with the heads axis"),
    (ch02.check_apply_rotary_pos_emb, apply_no_unsqueeze, "raised RuntimeError"),
    (ch02.check_apply_rotary_pos_emb, apply_no_unsqueeze, "(on q (2, 7, 8, 64)"),
    (ch02.check_apply_rotary_pos_emb, apply_in_place, "changed its input (argument 1) in place"),
    (ch02.check_apply_rotary_pos_emb, apply_returns_one, "expected a pair (q_embed, k_embed)"),
    (ch02.check_yarn_ramp, ramp_variant(two_pi=False), "this looks like the turns of a pair counted in radians"),
    (ch02.check_yarn_ramp, ramp_variant(exponent=1.0), "this looks like the pair index solved from base ** (-i/dim)"),
    (ch02.check_yarn_ramp, ramp_variant(rounding="inward"), "this looks like the fractional ends rounded inward"),
    (ch02.check_yarn_ramp, ramp_variant(rounding="nearest"), "this looks like the fractional ends rounded to the nearest"),
    (ch02.check_yarn_ramp, ramp_variant(rounding="none"), "this looks like the fractional ends not rounded"),
    (ch02.check_yarn_ramp, ramp_variant(clamp_ends=False), "this looks like the ends not clamped"),
    (ch02.check_yarn_ramp, ramp_variant(clamp_ramp=False), "this looks like the ramp not clamped to [0, 1]"),
    (ch02.check_yarn_ramp, ramp_variant(reverse=True), "this looks like the ramp reversed"),
    (ch02.check_yarn_ramp, ramp_variant(swap_betas=True), "this looks like beta_fast and beta_slow swapped"),
    (ch02.check_yarn_ramp, ramp_float64, "dtype mismatch: expected torch.float32, got torch.float64"),
    (ch02.check_yarn_ramp, lambda *args: ramp_ok(*args)[1:], "shape mismatch"),
]


@pytest.mark.parametrize("check_fn, wrong, message", WRONG, ids=[f"{c.__name__}-{m[:40]}" for c, _, m in WRONG])
def test_wrong_versions_fail_naming_the_mistake(check_fn, wrong, message, capsys):
    with pytest.raises(AssertionError) as info:
        check_fn(wrong)
    assert isinstance(info.value, ExerciseError)
    text = str(info.value)
    assert message in text, text
    assert text.startswith("[Exercise 2.") and "hint:" in text
    assert "✓" not in capsys.readouterr().out


def test_wrong_version_message_names_expected_and_hint():
    with pytest.raises(AssertionError) as info:
        ch02.check_precompute_freqs_cis(precompute_exponent_i_over_dim)
    msg = str(info.value)
    assert "expected" in msg and "hint:" in msg and "the exponent of each pair" in msg
    assert "rope_base **" not in msg and "arange(" not in msg
    assert msg.index("this looks like") < msg.index("hint:") < msg.index('show_solution("2.2")')
    assert "rope_properties" in msg


def test_crash_in_learner_code_is_reported():
    def boom(x):
        raise RuntimeError("shape mismatch somewhere")

    with pytest.raises(AssertionError, match="raised RuntimeError"):
        ch02.check_rotate_half(boom)


@pytest.mark.parametrize("end", [1000, 2048, 2049, 32768])
@pytest.mark.parametrize("scaling", [None, dict(YARN_ROPE_SCALING),
                                     {"factor": 4, "original_max_position_embeddings": 1024, "beta_fast": 16,
                                      "beta_slow": 2, "attention_factor": 1.0}])
def test_reference_yarn_frequencies_build_the_reference_tables(end, scaling):
    """The check's expected frequencies are exactly the ones inside rope.precompute_freqs_cis."""
    freqs = ch02.reference_yarn_frequencies(64, end, 1e6, scaling)
    angles = torch.outer(torch.arange(end, dtype=torch.float32), freqs)
    cos, sin = rope.precompute_freqs_cis(64, end, 1e6, scaling)
    assert torch.equal(cos, torch.cat([torch.cos(angles)] * 2, -1))
    assert torch.equal(sin, torch.cat([torch.sin(angles)] * 2, -1))


# --------------------------------------------------------------------------- 2.5 an interleaved checkpoint
def _perm(d):
    return torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])


def to_half_split(weights, head_dim, *, per_head=True, inverse=False, names=("q", "k"), gains=True, extra=()):
    """The conversion; the keyword arguments switch in one typical mistake each."""
    order = torch.argsort(_perm(head_dim)) if inverse else _perm(head_dim)
    out = dict(weights)
    for n in names:
        w = weights[f"{n}_proj.weight"]
        if per_head:
            out[f"{n}_proj.weight"] = w.view(-1, head_dim, w.shape[-1])[:, order].reshape(w.shape)
        else:
            out[f"{n}_proj.weight"] = w[_perm(w.shape[0])]
    if gains:
        for n in ("q", "k"):
            if f"{n}_norm.weight" in weights:
                out[f"{n}_norm.weight"] = weights[f"{n}_norm.weight"][order]
    for n in extra:
        w = weights[f"{n}_proj.weight"]
        out[f"{n}_proj.weight"] = w.view(-1, head_dim, w.shape[-1])[:, order].reshape(w.shape)
    return out


def to_half_split_index_copy(weights, head_dim):  # another correct way: build the row index once
    rows = lambda w: torch.cat([j * head_dim + _perm(head_dim) for j in range(w.shape[0] // head_dim)])  # noqa: E731
    out = {k: v.clone() for k, v in weights.items()}
    for n in ("q_proj.weight", "k_proj.weight"):
        out[n] = weights[n][rows(weights[n])]
    for n in ("q_norm.weight", "k_norm.weight"):
        if n in weights:
            out[n] = weights[n][_perm(head_dim)]
    return out


def to_half_split_in_place(weights, head_dim):
    converted = to_half_split(weights, head_dim)
    weights["q_proj.weight"].copy_(converted["q_proj.weight"])
    return converted


def to_half_split_k_with_q_heads(weights, head_dim):  # the KV heads reshaped as if there were as many as query heads
    out = to_half_split(weights, head_dim)
    w = weights["k_proj.weight"]
    n_q = weights["q_proj.weight"].shape[0] // head_dim
    out["k_proj.weight"] = w.reshape(n_q, -1, w.shape[-1])[:, _perm(w.shape[0] // n_q)].reshape(w.shape)
    return out


def test_to_half_split_references_pass(capsys):
    ch02.check_to_half_split(to_half_split)
    ch02.check_to_half_split(to_half_split_index_copy)
    assert capsys.readouterr().out.count("✓ Exercise 2.5") == 2


def test_to_half_split_stub_fails():
    with pytest.raises(AssertionError, match="not implemented yet"):
        ch02.check_to_half_split(stub)


HALF_SPLIT_WRONG = [
    (lambda w, d: dict(w), "this looks like the weights returned unchanged"),
    (lambda w, d: to_half_split(w, d, per_head=False), "this looks like the rows permuted over the whole projection"),
    (lambda w, d: to_half_split(w, d, inverse=True), "this looks like the inverse permutation"),
    (lambda w, d: to_half_split(w, d, names=("q",)), "this looks like only q_proj converted"),
    (lambda w, d: to_half_split(w, d, names=("k",)), "this looks like only k_proj converted"),
    (lambda w, d: to_half_split(w, d, gains=False), "this looks like q_norm and k_norm left as they were"),
    (lambda w, d: to_half_split(w, d, extra=("v",)), "this looks like v_proj permuted as well"),
    (to_half_split_in_place, "changed its input (argument 1) in place"),
    (lambda w, d: [to_half_split(w, d)], "expected a dict of weights"),
    (lambda w, d: {k: v for k, v in to_half_split(w, d).items() if "norm" not in k}, "the same keys and shapes"),
    (to_half_split_k_with_q_heads, "this looks like k_proj cut into as many heads as q_proj"),
]


@pytest.mark.parametrize("wrong, message", HALF_SPLIT_WRONG, ids=[m[:40] for _, m in HALF_SPLIT_WRONG])
def test_to_half_split_mistakes_are_named(wrong, message):
    with pytest.raises(AssertionError) as err:
        ch02.check_to_half_split(wrong)
    text = str(err.value)
    assert message in text, text
    assert text.startswith("[Exercise 2.5") and "hint:" in text


# --------------------------------------------------------------------------- issue 44, second probe: planted mistakes
def _probe_index(dim, base, original_max, turns):
    return dim * math.log(original_max / (2 * math.pi * turns)) / (2 * math.log(base))


def ramp_no_guard(dim, base, original_max, beta_fast, beta_slow):  # 0 / 0 where the two ends meet
    low = max(math.floor(_probe_index(dim, base, original_max, beta_fast)), 0)
    high = min(math.ceil(_probe_index(dim, base, original_max, beta_slow)), dim // 2 - 1)
    return ((torch.arange(dim // 2).float() - low) / (high - low)).clamp(0, 1)


def ramp_betas_swapped(dim, base, original_max, beta_fast, beta_slow):  # the probe's version of the swap
    low = max(math.floor(_probe_index(dim, base, original_max, beta_slow)), 0)
    high = min(math.ceil(_probe_index(dim, base, original_max, beta_fast)), dim // 2 - 1)
    if high == low:
        high += 0.001
    return ((torch.arange(dim // 2).float() - low) / (high - low)).clamp(0, 1)


@pytest.mark.parametrize("check_fn, wrong, message", [
    (ch02.check_rotate_half, rope.rotate_half, "Exercise 2.1 asks you to build this without minimind_ref.rope.rotate_half"),
    (ch02.check_rotate_half, lambda x: rope.rotate_half(x), "without minimind_ref.rope.rotate_half"),
    (ch02.check_precompute_freqs_cis, lambda d, e, b: rope.precompute_freqs_cis(d, e, b),
     "Exercise 2.2 asks you to build this without minimind_ref.rope.precompute_freqs_cis"),
    (ch02.check_precompute_freqs_cis, lambda d, e, b: tables_from(rope.rope_frequencies(d, b), e),
     "Exercise 2.2 asks you to build this without minimind_ref.rope.rope_frequencies"),
    (ch02.check_apply_rotary_pos_emb, rope.apply_rotary_pos_emb,
     "Exercise 2.3 asks you to build this without minimind_ref.rope.apply_rotary_pos_emb"),
    (ch02.check_yarn_ramp, rope.yarn_ramp, "Exercise 2.4 asks you to build this without minimind_ref.rope.yarn_ramp"),
    (ch02.check_yarn_ramp, ramp_no_guard, "this looks like the distance between the two ends used as the divisor where "
     "the ends meet"),
    (ch02.check_yarn_ramp, ramp_no_guard, "the exercise says what the ramp is where its two ends meet"),
    (ch02.check_yarn_ramp, ramp_betas_swapped, "this looks like beta_fast and beta_slow swapped"),
], ids=["rotate_half itself", "rotate_half wrapped", "precompute", "rope_frequencies", "apply", "yarn_ramp",
        "ends meet", "ends meet hint", "betas swapped"])
def test_ch02_names_the_probes_mistakes(check_fn, wrong, message):
    text = str(pytest.raises(ExerciseError, check_fn, wrong).value)
    assert message in text, text


def test_ch02_refuses_the_reference_imported_by_name_at_a_notebooks_top_level():
    namespace = {}
    exec("from minimind_ref.rope import apply_rotary_pos_emb as apply_ref\n"
         "def apply_rotary_pos_emb(q, k, cos, sin):\n    return apply_ref(q, k, cos, sin)\n", namespace)
    text = str(pytest.raises(ExerciseError, ch02.check_apply_rotary_pos_emb, namespace["apply_rotary_pos_emb"]).value)
    assert "without minimind_ref.rope.apply_rotary_pos_emb" in text, text
    q = torch.randn(1, 2, 1, 4)
    cos, sin = rope.precompute_freqs_cis(4, 2)
    torch.testing.assert_close(namespace["apply_ref"](q, q, cos, sin)[0], _apply_rotary(q, q, cos, sin)[0])


def test_the_ramp_where_the_ends_meet_is_the_step_the_exercise_describes():
    assert rope.yarn_ramp(64, 1e6, 160_000_000, 32, 1).eq(0).all()
    assert rope.yarn_ramp(32, 1e4, 64, 64, 16).tolist() == [0.0] + [1.0] * 15


def test_ch02_names_the_probes_generic_ones():
    def chunk_dim0(x):
        x1, x2 = x.chunk(2, dim=0)
        return torch.cat([-x2, x1], dim=0)

    def cat_dim0(x):
        h = x.shape[-1] // 2
        return torch.cat([-x[..., h:], x[..., :h]], dim=0)

    def columns_permuted(weights, head_dim):
        perm = torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])
        out = {k: v.clone() for k, v in weights.items()}
        for key in ("q_proj.weight", "k_proj.weight"):
            w = weights[key]
            out[key] = w.reshape(w.shape[0], -1, head_dim)[:, :, perm].reshape(w.shape).clone()
        return out

    for check, fn, message in [
        (ch02.check_rotate_half, chunk_dim0, "this looks like the halves taken along the first dimension"),
        (ch02.check_rotate_half, cat_dim0, "this looks like the two halves joined along the first dimension"),
        (ch02.check_to_half_split, columns_permuted, "this looks like the columns of q_proj and k_proj permuted"),
    ]:
        text = str(pytest.raises(AssertionError, check, fn).value)
        assert message in text, text
