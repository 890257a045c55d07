"""Chapter 01 checks: the notebook's solutions pass, its student stubs and typical mistakes fail
with a message that says what was wrong."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable, Dict

import nbformat
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minimind_ref as mm
from minimind_ref.checks import ch01
from minimind_ref.checks.core import ExerciseError, show_solution

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "01_normalization.ipynb"

CHECKS: Dict[str, Callable] = {
    "rms_norm": ch01.check_rms_norm,
    "layer_norm": ch01.check_layer_norm,
    "rms_norm_safe": ch01.check_fp16_safe_rms_norm,
    "count_rmsnorm": ch01.check_norm_count,
    "rmsnorm_parameters": ch01.check_norm_parameters,
}


def _make_student():
    spec = importlib.util.spec_from_file_location("make_student", ROOT / "tools" / "make_student.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _solution_functions(student: bool = False) -> Dict[str, Callable]:
    """Execute the notebook's exercise cells (solutions, or the student edition's stubs)."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    if student:
        nb = _make_student().student_notebook(nb, chapter="01")
    namespace = {"torch": torch, "nn": nn, "F": F, "RMSNorm": mm.RMSNorm}
    count = 0
    for cell in nb.cells:
        if cell.cell_type == "code" and "hide-input" in cell.metadata.get("tags", []):
            exec(compile(cell.source, "<exercise cell>", "exec"), namespace)
            count += 1
    assert count == len(CHECKS), f"expected {len(CHECKS)} exercise cells in {NOTEBOOK.name}, found {count}"
    return {name: namespace[name] for name in CHECKS}


@pytest.fixture(scope="module")
def solutions() -> Dict[str, Callable]:
    return _solution_functions()


@pytest.fixture(scope="module")
def stubs() -> Dict[str, Callable]:
    return _solution_functions(student=True)


# --------------------------------------------------------------------------- the notebook's own answers
@pytest.mark.parametrize("name", list(CHECKS))
def test_notebook_solution_passes(name, solutions, capsys):
    CHECKS[name](solutions[name])
    assert capsys.readouterr().out.startswith("✓ Exercise 1.")


@pytest.mark.parametrize("name", list(CHECKS))
def test_student_stub_fails_with_not_implemented(name, stubs):
    with pytest.raises(AssertionError, match="not implemented yet"):
        CHECKS[name](stubs[name])


def test_reference_helpers_agree_with_minimind_ref():
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    w = torch.rand(64) + 0.5
    norm = mm.RMSNorm(64)
    with torch.no_grad():
        norm.weight.copy_(w)
    torch.testing.assert_close(ch01.reference_rms_norm(x, w), norm(x), rtol=0, atol=0)
    assert ch01.reference_rms_norm(x, w).dtype == torch.float32  # bf16 x, fp32 weight -> fp32
    model = mm.MiniMindForCausalLM(mm.minimind2_small(vocab_size=64, max_position_embeddings=64))
    assert ch01.count_rmsnorm_modules(model) == 2 * 8 + 1


# --------------------------------------------------------------------------- wrong rms_norm
def rms_ok(x, w, eps=1e-5):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rms_no_eps(x, w, eps=1e-5):
    return w * x / x.pow(2).mean(-1, keepdim=True).sqrt()


def rms_eps_outside(x, w, eps=1e-5):
    return w * x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps)


def rms_ignores_eps_argument(x, w, eps=1e-5):
    return rms_ok(x, w, 1e-5)


def rms_centred(x, w, eps=1e-5):  # LayerNorm without bias, not RMSNorm
    xc = x - x.mean(-1, keepdim=True)
    return w * xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps)


def rms_sum_not_mean(x, w, eps=1e-5):
    return w * x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def rms_wrong_dim(x, w, eps=1e-5):
    return w * x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + eps)


def rms_no_weight(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rms_no_keepdim(x, w, eps=1e-5):
    return w * x * torch.rsqrt(x.pow(2).mean(-1) + eps)


def rms_always_fp32(x, w, eps=1e-5):
    return rms_ok(x.float(), w.float(), eps)


def rms_in_place(x, w, eps=1e-5):
    return x.mul_(torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).mul_(w)


def rms_no_default_eps(x, w, eps):
    return rms_ok(x, w, eps)


def rms_returns_numpy(x, w, eps=1e-5):
    return rms_ok(x, w, eps).numpy()


def rms_no_sqrt(x, w, eps=1e-5):
    return w * x / (x.pow(2).mean(-1, keepdim=True) + eps)


def rms_weight_edited_in_place(x, w, eps=1e-5):
    w.clamp_(min=0.6)  # edits the caller's weight
    return rms_ok(x, w, eps)


# (mistake, text the failure must contain: the named mistake or the input it crashed on)
RMS_MISTAKES = [
    (rms_no_eps, "this looks like eps left out"),
    (rms_no_eps, "NaN"),
    (rms_eps_outside, "this looks like eps added outside the square root"),
    (rms_ignores_eps_argument, "this looks like the eps argument ignored"),
    (rms_centred, "this looks like the mean subtracted first"),
    (rms_sum_not_mean, "this looks like the sum of squares instead of their mean"),
    (rms_wrong_dim, "this looks like the mean over the first dimension"),
    (rms_no_weight, "this looks like the gain (weight) left out"),
    (rms_no_sqrt, "this looks like the square root left out"),
    (rms_no_keepdim, "raised RuntimeError"),
    (rms_no_keepdim, "(on x of shape (4, 16))"),
    (rms_no_keepdim, "lost its last dimension: keep that dimension"),
    (rms_always_fp32, "dtype mismatch: expected torch.bfloat16, got torch.float32"),
    (rms_in_place, "changed its input (argument 1) in place"),
    (rms_weight_edited_in_place, "changed its input (argument 2) in place"),
    (rms_no_default_eps, "raised TypeError"),
    (rms_no_default_eps, "give eps the default value 1e-5"),
    (rms_returns_numpy, "expected a torch.Tensor"),
]


@pytest.mark.parametrize("fn, message", RMS_MISTAKES, ids=lambda v: getattr(v, "__name__", str(v)[:30]))
def test_rms_norm_rejects(fn, message):
    with pytest.raises(AssertionError) as info:
        ch01.check_rms_norm(fn)
    text = str(info.value)
    assert message in text, text
    assert text.startswith("[Exercise 1.1 rms_norm]") and "hint:" in text


def test_rms_norm_failure_message_names_the_mistake_then_hint_then_how_to_ask(capsys):
    with pytest.raises(AssertionError) as info:
        ch01.check_rms_norm(rms_eps_outside)
    text = str(info.value)
    assert "expected" in text and "got" in text
    assert text.index("this looks like") < text.index("hint:") < text.index('show_solution("1.1")')
    assert "keepdim=True" not in text and "sqrt(" not in text, "the message names the mistake and hints; the solution only on request"
    show_solution("1.1")
    assert "keepdim=True" in capsys.readouterr().out


# --------------------------------------------------------------------------- wrong layer_norm
def ln_ok(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def ln_unbiased(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(x.var(-1, keepdim=True) + eps) * w + b


def ln_no_centring(x, w, b, eps=1e-5):
    return rms_ok(x, w, eps) + b


def ln_no_bias(x, w, b, eps=1e-5):
    return ln_ok(x, w, b, eps) - b


def ln_no_weight(x, w, b, eps=1e-5):
    return ln_ok(x, torch.ones_like(w), b, eps)


def ln_eps_outside(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    return (x - mean) / (x.std(-1, unbiased=False, keepdim=True) + eps) * w + b


def ln_bias_before_scale(x, w, b, eps=1e-5):
    return (ln_ok(x, torch.ones_like(w), b, eps)) * w


def ln_ignores_eps_argument(x, w, b, eps=1e-5):
    return ln_ok(x, w, b, 1e-5)


def ln_weight_bias_swapped(x, w, b, eps=1e-5):
    return ln_ok(x, b, w, eps)


def ln_no_sqrt(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    return (x - mean) / (var + eps) * w + b


def ln_numerator_not_centred(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    return x / torch.sqrt(var + eps) * w + b


def ln_in_place(x, w, b, eps=1e-5):
    x -= x.mean(-1, keepdim=True)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w + b


def ln_no_keepdim(x, w, b, eps=1e-5):
    mean = x.mean(-1)
    return (x - mean) * w + b


def ln_no_default_eps(x, w, b, eps):
    return ln_ok(x, w, b, eps)


LN_MISTAKES = [
    (ln_unbiased, "this looks like the unbiased variance"),
    (ln_no_centring, "this looks like no centring"),
    (ln_no_bias, "this looks like the bias left out"),
    (ln_no_weight, "this looks like the gain (weight) left out"),
    (ln_eps_outside, "this looks like eps added outside the square root"),
    (ln_eps_outside, "tiny activations"),
    (ln_bias_before_scale, "this looks like the bias added before the scaling by the gain"),
    (ln_ignores_eps_argument, "this looks like the eps argument ignored"),
    (ln_weight_bias_swapped, "this looks like weight and bias swapped"),
    (ln_no_sqrt, "this looks like the square root left out"),
    (ln_numerator_not_centred, "this looks like the mean subtracted inside the variance but not from x itself"),
    (ln_in_place, "changed its input (argument 1) in place"),
    (ln_no_keepdim, "raised RuntimeError"),
    (ln_no_keepdim, "lost its last dimension: keep that dimension"),
    (ln_no_default_eps, "give eps the default value 1e-5"),
]


@pytest.mark.parametrize("fn, message", LN_MISTAKES, ids=lambda v: getattr(v, "__name__", str(v)[:30]))
def test_layer_norm_rejects(fn, message):
    with pytest.raises(AssertionError) as info:
        ch01.check_layer_norm(fn)
    text = str(info.value)
    assert message in text, text
    assert text.startswith("[Exercise 1.2 layer_norm]") and "hint:" in text


def test_layer_norm_accepts_torch_var_unbiased_false():
    def ln_var(x, w, b, eps=1e-5):
        mean = x.mean(-1, keepdim=True)
        return (x - mean) * torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + eps) * w + b
    ch01.check_layer_norm(ln_var)


# --------------------------------------------------------------------------- wrong rms_norm_safe
def safe_ok(x, w, eps=1e-5):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x)


def safe_cast_after_weight(x, w, eps=1e-5):  # returns x.dtype even with an fp32 weight
    xf = x.float()
    return (w.float() * xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def safe_never_casts_back(x, w, eps=1e-5):  # fp32 statistics, but no rounding to x.dtype
    xf = x.float()
    return (w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(torch.promote_types(x.dtype, w.dtype))


def safe_fp32_output(x, w, eps=1e-5):
    xf = x.float()
    return w.float() * xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def safe_prescaled_but_wrong_eps(x, w, eps=1e-5):  # divides by max|x| first but forgets to rescale eps
    s = x.abs().amax(-1, keepdim=True).clamp_min(1)
    xs = x / s
    return w * (xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + eps))


def safe_upcasts_in_place(x, w, eps=1e-5):
    if x.dtype == torch.float32:
        x.mul_(1.0).add_(0.0)
        x[..., 0] = x[..., 0] + 1.0  # an edit the check must notice
    return safe_ok(x, w, eps)


def safe_half_overflow_nan(x, w, eps=1e-5):  # no upcast, and the division by inf done as x * (1 / sqrt(inf)) - inf
    ms = x.pow(2).mean(-1, keepdim=True)
    return w * (x / ms.sqrt() * 1.0 + 0 * ms)


SAFE_MISTAKES = [
    (rms_ok, "all zeros"),                       # Exercise 1.1's formula in fp16: squares overflow
    (rms_ok, "65504"),
    (safe_cast_after_weight, "dtype mismatch: expected torch.float32, got torch.float16"),
    (safe_never_casts_back, "this looks like the normalized value never cast back to x.dtype"),
    (safe_fp32_output, "dtype mismatch: expected torch.float16, got torch.float32"),
    (safe_prescaled_but_wrong_eps, "values differ"),
    (safe_upcasts_in_place, "changed its input (argument 1) in place"),
    (safe_half_overflow_nan, "inf/NaN"),
]


@pytest.mark.parametrize("fn, message", SAFE_MISTAKES, ids=lambda v: getattr(v, "__name__", str(v)[:30]))
def test_fp16_safe_rms_norm_rejects(fn, message):
    with pytest.raises(AssertionError) as info:
        ch01.check_fp16_safe_rms_norm(fn)
    text = str(info.value)
    assert message in text, text
    assert text.startswith("[Exercise 1.3 rms_norm_safe]") and "hint:" in text


def test_fp16_overflow_message_names_the_cause():
    with pytest.raises(AssertionError) as info:
        ch01.check_fp16_safe_rms_norm(rms_ok)
    assert "65504" in str(info.value) and "larger range" in str(info.value)


def test_fp16_safe_accepts_to_dtype_spelling():
    def safe_to(x, w, eps=1e-5):
        xf = x.to(torch.float32)
        normed = xf / torch.sqrt(xf.square().mean(-1, keepdim=True) + eps)
        return w * normed.to(x.dtype)
    ch01.check_fp16_safe_rms_norm(safe_to)


# --------------------------------------------------------------------------- wrong counts
def count_ok(model):
    return sum(isinstance(m, mm.RMSNorm) for m in model.modules())


COUNT_MISTAKES = [
    (lambda model: 17, "this looks like the same number for every model"),          # hard-coded MiniMind2-Small
    (lambda model: 16, "this looks like the two norms of each block without the final norm"),
    (lambda model: 2 * model.config.num_hidden_layers, "without the final norm"),    # same, computed
    (lambda model: model.config.num_hidden_layers + 1, "this looks like one norm per block plus the final norm"),
    (lambda model: sum(isinstance(m, nn.RMSNorm) for m in model.modules()), "this looks like a test for torch.nn.RMSNorm"),
    # the draft of the notebook, unchanged, and each of its two mistakes alone (issue 44: a debug exercise)
    (lambda model: sum(isinstance(m, nn.RMSNorm) for m in model.children()), "this looks like the draft unchanged"),
    (lambda model: sum(isinstance(m, mm.RMSNorm) for m in model.children()),
     "this looks like a walk over the top-level children only"),
    (lambda model: sum(isinstance(m, nn.LayerNorm) for m in model.modules()), "got 0 (on MiniMind2-Small)"),
    (lambda model: len(list(model.children())), "this looks like a count of the model's top-level children"),
    (lambda model: len(list(model.modules())), "this looks like a count of every module"),
    (lambda model: float(count_ok(model)), "expected an int (a number of modules), got float"),
    (lambda model: str(count_ok(model)), "expected an int"),
    (lambda model: model.num_norms, "raised AttributeError"),
]


@pytest.mark.parametrize("fn, message", COUNT_MISTAKES, ids=[m for _, m in COUNT_MISTAKES])
def test_norm_count_rejects(fn, message):
    with pytest.raises(AssertionError) as info:
        ch01.check_norm_count(fn)
    text = str(info.value)
    assert message in text, text
    assert text.startswith("[Exercise 1.4 count_rmsnorm]")


def test_norm_count_containers_need_a_count_from_the_modules():
    """A counter right on the MiniMind models that reads ``model.config`` fails on the containers with
    a message that says what the argument may be."""
    def from_config(model):
        return 2 * model.config.num_hidden_layers + 1
    text = str(pytest.raises(ExerciseError, ch01.check_norm_count, from_config).value)
    assert "raised AttributeError" in text and "one without a config too" in text, text


def test_norm_count_accepts_a_tensor_scalar_and_named_modules():
    ch01.check_norm_count(lambda model: torch.tensor(count_ok(model)))
    ch01.check_norm_count(lambda model: len([n for n, m in model.named_modules() if type(m) is mm.RMSNorm]))


def test_check_errors_are_exercise_errors():
    with pytest.raises(ExerciseError):
        ch01.check_rms_norm(rms_no_eps)


# --------------------------------------------------------------------------- 1.5 norm parameters from the config
def _blocks(c):
    return (2 * c.num_hidden_layers + 1) * c.hidden_size


NORM_PARAM_MISTAKES = [
    (lambda c: _blocks(c), "without QK-norm's q_norm and k_norm gains"),
    (lambda c: _blocks(c) + 2 * c.num_hidden_layers * c.head_dim, "QK-norm counted although this config has qk_norm=False"),
    (lambda c: _blocks(c) + (c.num_hidden_layers * (c.num_attention_heads + c.num_key_value_heads) * c.head_dim
                            if c.qk_norm else 0), "one QK-norm gain per head"),
    (lambda c: _blocks(c) + (2 * c.num_hidden_layers * c.hidden_size if c.qk_norm else 0), "QK-norm gains of hidden_size values"),
    # issue 44: one gain per query head in both norms was named "hidden_size values" while every config had
    # num_attention_heads * head_dim == hidden_size; head_dim from the quotient passed
    (lambda c: _blocks(c) + (2 * c.num_hidden_layers * c.num_attention_heads * c.head_dim if c.qk_norm else 0),
     "one gain per query head in both QK-norms"),
    (lambda c: _blocks(c) + (2 * c.num_hidden_layers * (c.hidden_size // c.num_attention_heads) if c.qk_norm else 0),
     "head_dim taken as hidden_size divided by the number of heads"),
    (lambda c: _blocks(c) + (c.num_hidden_layers * c.head_dim if c.qk_norm else 0), "only q_norm counted"),
    (lambda c: 2 * c.num_hidden_layers * c.hidden_size + (2 * c.num_hidden_layers * c.head_dim if c.qk_norm else 0),
     "the final norm (model.norm) left out"),
    (lambda c: (c.num_hidden_layers + 1) * c.hidden_size + (2 * c.num_hidden_layers * c.head_dim if c.qk_norm else 0),
     "one norm per block plus the final one"),
    (lambda c: 33, "got 33 (on minimind-3 (hidden 768, 8 layers, head_dim 96, QK-norm)), which is not the reference's: yours is smaller"),  # the module count of Exercise 1.4
    (lambda c: float(_blocks(c)), "expected an int (a number of parameters), got float"),
]


@pytest.mark.parametrize("fn, message", NORM_PARAM_MISTAKES, ids=[m[:40] for _, m in NORM_PARAM_MISTAKES])
def test_norm_parameters_rejects(fn, message):
    with pytest.raises(ExerciseError) as err:
        ch01.check_norm_parameters(fn)
    text = str(err.value)
    assert message in text, text
    assert text.startswith("[Exercise 1.5") and "hint:" in text


# --------------------------------------------------------------------------- issue 44, second probe: planted mistakes
def rms_draft(x, w, eps=1e-5):  # the notebook's draft, unchanged
    return w * x / (x.pow(2).mean().sqrt() + eps)


def rms_whole_tensor_mean(x, w, eps=1e-5):  # the draft with eps fixed: one statistic for the whole tensor
    return w * x * torch.rsqrt(x.pow(2).mean() + eps)


def rms_upcast(x, w, eps=1e-5):  # MiniMind's recipe: float32 statistics, back to x's dtype (1.1 asks for x's dtype)
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x)


def rms_clamp_eps(x, w, eps=1e-5):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True).clamp_min(eps))


def rms_eps_squared(x, w, eps=1e-5):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps ** 2)


def rms_library(x, w, eps=1e-5):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def rms_torch_module(x, w, eps=1e-5):
    norm = nn.RMSNorm(x.shape[-1], eps=eps)
    with torch.no_grad():
        norm.weight.copy_(w)
    return norm(x).detach()


def rms_wraps_reference(x, w, eps=1e-5):
    return ch01.reference_rms_norm(x, w, eps)


def rms_wraps_minimind(x, w, eps=1e-5):
    norm = mm.RMSNorm(x.shape[-1], eps=eps)
    with torch.no_grad():
        norm.weight.copy_(w)
    return norm(x).detach()


def _bare_norm(h, eps=1e-5):  # section 1's helper of the notebook (PyTorch's RMS normalization, no gain)
    return F.rms_norm(h, (h.shape[-1],), eps=eps)


def rms_bare_norm_times_weight(x, w, eps=1e-5):
    return _bare_norm(x, eps) * w


RMS_PROBE_MISTAKES = [
    (rms_draft, "this looks like one statistic for the whole tensor"),
    (rms_whole_tensor_mean, "this looks like one statistic for the whole tensor"),
    (rms_upcast, "a step computed in a wider dtype"),
    (rms_clamp_eps, "this looks like eps used as a floor under the mean of squares"),
    (rms_eps_squared, "this looks like eps squared before it is added"),
    (rms_library, "Exercise 1.1 asks you to build this without torch.nn.functional.rms_norm"),
    (rms_torch_module, "Exercise 1.1 asks you to build this without torch.nn.RMSNorm"),
    (rms_wraps_reference, "without minimind_ref.checks.ch01.reference_rms_norm"),
    (rms_wraps_minimind, "Exercise 1.1 asks you to build this without minimind_ref.RMSNorm"),
    (rms_bare_norm_times_weight, "without torch.nn.functional.rms_norm"),
]


@pytest.mark.parametrize("fn, message", RMS_PROBE_MISTAKES, ids=lambda v: getattr(v, "__name__", str(v)[:30]))
def test_rms_norm_names_the_probes_mistakes(fn, message):
    text = str(pytest.raises(ExerciseError, ch01.check_rms_norm, fn).value)
    assert message in text, text
    assert text.startswith("[Exercise 1.1 rms_norm]") and "hint:" in text


def test_rms_norm_refuses_the_library_imported_by_name_in_the_notebook():
    """A name bound at a notebook's top level (``from torch.nn.functional import rms_norm``) is switched off too."""
    namespace = {"torch": torch}
    exec("from torch.nn.functional import rms_norm as library_norm\n"
         "def rms_norm(x, w, eps=1e-5):\n    return library_norm(x, (x.shape[-1],), w, eps)\n", namespace)
    text = str(pytest.raises(ExerciseError, ch01.check_rms_norm, namespace["rms_norm"]).value)
    assert "without torch.nn.functional.rms_norm" in text, text
    assert F.rms_norm(torch.ones(1, 2), (2,)).shape == (1, 2), "the library is back after the check"


def test_rms_norm_draft_hint_points_at_the_input_not_the_fix():
    text = str(pytest.raises(ExerciseError, ch01.check_rms_norm, rms_whole_tensor_mean).value)
    assert "several vectors of different sizes" in text and "keepdim" not in text, text


def ln_library(x, w, b, eps=1e-5):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def ln_torch_module(x, w, b, eps=1e-5):
    norm = nn.LayerNorm(x.shape[-1], eps=eps)
    with torch.no_grad():
        norm.weight.copy_(w)
        norm.bias.copy_(b)
    return norm(x).detach()


def ln_dim0(x, w, b, eps=1e-5):
    mean = x.mean(0, keepdim=True)
    var = (x - mean).pow(2).mean(0, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


@pytest.mark.parametrize("fn, message", [
    (ln_library, "Exercise 1.2 asks you to build this without torch.nn.functional.layer_norm"),
    (ln_torch_module, "Exercise 1.2 asks you to build this without torch.nn.LayerNorm"),
    (ln_dim0, "this looks like the statistics over the first dimension instead of the last"),
    (ln_unbiased, "measure which one torch.nn.LayerNorm takes"),
], ids=["F.layer_norm", "nn.LayerNorm", "dim 0", "unbiased hint"])
def test_layer_norm_names_the_probes_mistakes(fn, message):
    text = str(pytest.raises(ExerciseError, ch01.check_layer_norm, fn).value)
    assert message in text, text


@pytest.mark.parametrize("fn", [ln_unbiased, ln_no_bias, ln_weight_bias_swapped, ln_dim0, ln_eps_outside])
def test_layer_norm_hints_never_say_which_variance(fn):
    text = str(pytest.raises(ExerciseError, ch01.check_layer_norm, fn).value)
    import re
    assert not re.search(r"(?<!un)biased", text) and "divide by d" not in text, text


def safe_eps_hard_coded(x, w, eps=1e-5):
    return safe_ok(x, w, 1e-5)


def safe_statistic_only_in_fp32(x, w, eps=1e-5):
    ms = x.float().pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(ms + eps).to(x.dtype))


def safe_wraps_minimind(x, w, eps=1e-5):
    norm = mm.RMSNorm(x.shape[-1], eps=eps).to(w.dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
    return norm(x).detach()


@pytest.mark.parametrize("fn, message", [
    (safe_eps_hard_coded, "this looks like the eps argument ignored (always 1e-5)"),
    (safe_statistic_only_in_fp32, "this looks like the statistic computed in float32 but the division done in x's dtype"),
    (safe_wraps_minimind, "Exercise 1.3 asks you to build this without minimind_ref.RMSNorm"),
    (rms_library, "Exercise 1.3 asks you to build this without torch.nn.functional.rms_norm"),
], ids=["eps hard-coded", "statistic only in fp32", "wraps RMSNorm", "F.rms_norm"])
def test_fp16_safe_names_the_probes_mistakes(fn, message):
    text = str(pytest.raises(ExerciseError, ch01.check_fp16_safe_rms_norm, fn).value)
    assert message in text, text


def test_fp16_safe_accepts_the_learners_own_rms_norm_as_a_step():
    def safe_from_rms_norm(x, w, eps=1e-5):
        return w * rms_ok(x.float(), torch.ones(x.shape[-1]), eps).type_as(x)
    ch01.check_fp16_safe_rms_norm(safe_from_rms_norm)


def test_norm_count_names_a_walk_that_skips_the_module_itself():
    def skips_root(model):
        return sum(isinstance(m, mm.RMSNorm) for m in list(model.modules())[1:])
    text = str(pytest.raises(ExerciseError, ch01.check_norm_count, skips_root).value)
    assert "this looks like the module itself left out" in text, text


@pytest.mark.parametrize("fn", [m for m, _ in NORM_PARAM_MISTAKES[:7]])
def test_norm_parameters_messages_never_give_the_width(fn):
    text = str(pytest.raises(ExerciseError, ch01.check_norm_parameters, fn).value)
    assert "they have head_dim values" not in text and "how wide they are" not in text, text


def test_ch01_names_the_probes_generic_ones():
    text = str(pytest.raises(ExerciseError, ch01.check_norm_count,
                             lambda model: sum("norm" in n for n, _ in model.named_modules())).value)
    assert "this looks like modules counted by their names" in text, text
    text = str(pytest.raises(ExerciseError, ch01.check_rms_norm, rms_no_keepdim).value)
    assert "this looks like the mean of squares without its last dimension kept" in text, text
