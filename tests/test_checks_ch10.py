"""Chapter 10 checks accept the reference and reject stubs and the common mistakes, naming each."""

import pytest
import torch
import torch.nn.functional as F

from _helpers import check_fails, stub
from minimind_ref import lora
from minimind_ref.checks import ch10, delegation


@pytest.fixture(autouse=True)
def _references_may_be_called(monkeypatch):
    """These tests pass the check's own references, and mistakes built from them, as the learner's:
    the delegation guard is off here except in the tests of the guard."""
    monkeypatch.setattr(delegation, "ENFORCED", False)


def _apply_and_list(config):
    from minimind_ref.model import MiniMindForCausalLM

    with torch.device("meta"):
        return [name for name, _ in lora.lora_modules(lora.apply_lora(MiniMindForCausalLM(config), rank=2))]


@pytest.mark.parametrize("check, delegate, words", [
    (ch10.check_lora_forward, ch10.lora_forward_reference, "ch10.lora_forward_reference"),
    (ch10.check_rescale_merged, ch10.rescale_merged_reference, "ch10.rescale_merged_reference"),
    (ch10.check_lora_forward, lambda x, W, A, B, s=1.0: F.linear(x, W) + _lora_module(A, B, s)(x), "minimind_ref.lora.LoRA"),
    (ch10.check_lora_parameter_count, lambda c, r: ch10.lora_parameter_count_reference(c, r), "ch10.lora_parameter_count_reference"),
    (ch10.check_lora_parameter_count, lambda c, r: 2 * r * len(_apply_and_list(c)) * c.hidden_size, "MiniMindForCausalLM"),
    (ch10.check_adapted_layers, _apply_and_list, "minimind_ref.lora.apply_lora"),
    (ch10.check_merge_file, ch10.merge_file_reference, "ch10.merge_file_reference"),
])
def test_a_function_that_calls_the_package_answer_fails(monkeypatch, check, delegate, words):
    monkeypatch.setattr(delegation, "ENFORCED", True)
    if words == "MiniMindForCausalLM":  # building the model is refused for its own reason
        check_fails(check, delegate, "your function calls MiniMindForCausalLM", "without building the model")
    else:
        check_fails(check, delegate, "your function calls " + words, "the package's own answer to this exercise")


def _lora_module(A, B, scale):
    module = lora.LoRA(A.shape[1], B.shape[0], rank=A.shape[0], scale=scale)
    with torch.no_grad():
        module.A.weight.copy_(A)
        module.B.weight.copy_(B)
    return module


# ---------------------------------------------------------------------- 10.1: the order of the products
@pytest.mark.parametrize("order, words", [
    (lambda x, W, A, B, s=1.0: F.linear(x, W) + s * F.linear(x, B @ A), "the two factors multiplied together first"),
    (lambda x, W, A, B, s=1.0: F.linear(x, W + s * (B @ A)), "the adapter folded into the weight on every call"),
])
def test_lora_forward_names_an_order_that_builds_an_out_by_in_matrix(order, words):
    """Issue 44: the value of every order is right; the multiply-adds tell them apart."""
    check_fails(ch10.check_lora_forward, order, "this looks like " + words, "times the multiply-adds")


def test_lora_forward_accepts_the_thin_path_written_any_way(capsys):
    ch10.check_lora_forward(lambda x, W, A, B, s=1.0: x @ W.T + ((x @ A.T) * s) @ B.T)
    ch10.check_lora_forward(lambda x, W, A, B, s=1.0: torch.einsum("...i,oi->...o", x, W)
                            + s * torch.einsum("...r,or->...o", torch.einsum("...i,ri->...r", x, A), B))
    assert capsys.readouterr().out.count("✓") == 2


def _mistake_fn(mistakes_of, description):
    """A learner function that makes exactly the planted mistake ``description`` on every case."""
    return lambda *args: mistakes_of(*args)[description]()


# ---------------------------------------------------------------------- 10.1
def test_lora_forward_reference_passes(capsys):
    ch10.check_lora_forward(ch10.lora_forward_reference)
    assert capsys.readouterr().out.startswith("✓")


def test_lora_forward_rejects_stub():
    check_fails(ch10.check_lora_forward, stub, "10.1", "not implemented")


FORWARD_MISTAKES = list(ch10._forward_mistakes(*[torch.zeros(1, 1)] * 4, 1.0))


@pytest.mark.parametrize("description", FORWARD_MISTAKES)
def test_lora_forward_names_each_mistake(description):
    check_fails(ch10.check_lora_forward, _mistake_fn(ch10._forward_mistakes, description), "this looks like " + description)


def test_lora_forward_rejects_in_place_edits():
    def edits(x, weight, A, B, scale=1.0):
        weight.add_(scale * B @ A)
        return F.linear(x, weight)

    check_fails(ch10.check_lora_forward, edits, "in place")


# ---------------------------------------------------------------------- 10.3 (a merged adapter turned up or down)
def test_rescale_merged_reference_passes(capsys):
    ch10.check_rescale_merged(ch10.rescale_merged_reference)
    assert capsys.readouterr().out.startswith("✓")


def test_rescale_merged_rejects_stub():
    check_fails(ch10.check_rescale_merged, stub, "10.3", "not implemented")


RESCALE_MISTAKES = list(ch10._rescale_mistakes(*[torch.ones(1, 1)] * 3, 1.0, 2.0))


@pytest.mark.parametrize("description", RESCALE_MISTAKES)
def test_rescale_merged_names_each_mistake(description):
    check_fails(ch10.check_rescale_merged, _mistake_fn(ch10._rescale_mistakes, description), "this looks like " + description)


def test_rescale_merged_rejects_adding_in_place_and_undoes_a_merge():
    def in_place(merged, A, B, old, new):
        return merged.add_((new - old) * (B @ A))

    check_fails(ch10.check_rescale_merged, in_place, "in place")

    def same_when_kept(merged, A, B, old, new):  # issue 44 (probe 4): right values, but the caller's own tensor
        return merged if new == old else merged + (new - old) * (B @ A)

    check_fails(ch10.check_rescale_merged, same_when_kept, "not a new tensor")
    # scale 0 gives the frozen weight back: a merge can be undone with the adapter kept
    W, A, B = torch.randn(6, 5), torch.randn(2, 5), torch.randn(6, 2)
    torch.testing.assert_close(ch10.rescale_merged_reference(ch10.merge_weight_reference(W, A, B, 1.0), A, B, 1.0, 0.0),
                               W, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------- 10.2 (count)
def test_lora_parameter_count_reference_passes(capsys):
    ch10.check_lora_parameter_count(ch10.lora_parameter_count_reference)
    assert capsys.readouterr().out.startswith("✓")


def test_lora_parameter_count_rejects_stub():
    check_fails(ch10.check_lora_parameter_count, stub, "10.2", "not implemented")


COUNT_MISTAKES = list(ch10._count_mistakes(ch10._count_cases()[0]["config"], 8))


@pytest.mark.parametrize("description", COUNT_MISTAKES)
def test_lora_parameter_count_names_each_mistake(description):
    check_fails(ch10.check_lora_parameter_count, lambda config, rank: ch10._count_mistakes(config, rank)[description],
           "this looks like " + description)


def test_lora_parameter_count_rejects_non_int():
    check_fails(ch10.check_lora_parameter_count, lambda config, rank: "8192", "expected an int")


def test_reference_count_matches_apply_lora_on_a_real_model():
    from minimind_ref.config import MiniMindConfig
    from minimind_ref.lora import apply_lora, lora_modules
    from minimind_ref.model import MiniMindForCausalLM

    for kv in (2, 8):
        config = MiniMindConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=kv,
                                vocab_size=100, intermediate_size=192)
        model = apply_lora(MiniMindForCausalLM(config), rank=3)
        added = sum(p.numel() for _, layer in lora_modules(model) for p in layer.lora.parameters())
        assert ch10.lora_parameter_count_reference(config, 3) == added


def test_lora_parameter_count_names_a_forgotten_layer_count():
    """The newcomer's slip: the right count for one block, never multiplied by the layers. With the
    course model's 2 layers it equals "half the count"; the check starts with an 8-layer model, so
    it names the layer count, not q_proj or A."""
    def one_block(config, rank):
        h = config.hidden_size
        kv = config.num_key_value_heads * (h // config.num_attention_heads)
        return (2 + (2 if kv == h else 0)) * rank * 2 * h

    msg = check_fails(ch10.check_lora_parameter_count, one_block, "the layer count left out", "MiniMind2-Small")
    assert "only q_proj" not in msg, msg


# ---------------------------------------------------------------------- 10.4 / 10.5
def test_adapted_layers_reference_passes_and_mistakes_fail_with_hints(capsys):
    from minimind_ref.checks import ch10

    ch10.check_adapted_layers(ch10.adapted_layers_reference)
    assert capsys.readouterr().out.startswith("✓")
    check_fails(ch10.check_adapted_layers, stub, "10.4", "not implemented")

    def q_and_o_always(config):
        return [f"model.layers.{i}.self_attn.{p}" for i in range(config.num_hidden_layers) for p in ("q_proj", "o_proj")]

    check_fails(ch10.check_adapted_layers, q_and_o_always, "free head_dim")
    with_kv = lambda c: [n.replace("q_proj", p) for n in ch10.adapted_layers_reference(c) for p in ("q_proj", "k_proj")]
    check_fails(ch10.check_adapted_layers, with_kv, "k_proj and v_proj")
    check_fails(ch10.check_adapted_layers, lambda c: ch10.adapted_layers_reference(c) + ["lm_head"], "lm_head")
    check_fails(ch10.check_adapted_layers, lambda c: "q_proj", "expected a list of module names")


def test_merge_file_reference_passes_and_mistakes_are_named(capsys):
    from minimind_ref.checks import ch10

    ch10.check_merge_file(ch10.merge_file_reference)
    assert capsys.readouterr().out.startswith("✓")
    check_fails(ch10.check_merge_file, stub, "10.5", "not implemented")

    def fp32_sum(state, adapters):
        out = {k: v.half() for k, v in state.items()}
        for k in adapters:
            if k.endswith(".lora.A.weight"):
                layer = k[: -len(".lora.A.weight")]
                out[f"{layer}.weight"] = (state[f"{layer}.weight"] + adapters[f"{layer}.lora.B.weight"] @ adapters[k]).half()
        return out

    check_fails(ch10.check_merge_file, fp32_sum, "this looks like the sum formed in fp32 and rounded to fp16 once")

    def factors_rounded(state, adapters):
        return ch10.merge_file_reference(state, {k: v.half().float() for k, v in adapters.items()})

    check_fails(ch10.check_merge_file, factors_rounded, "this looks like the adapter's two factors rounded to fp16")
    check_fails(ch10.check_merge_file, lambda s, a: {k: v.half() for k, v in s.items()}, "this looks like the adapter left out")
    check_fails(ch10.check_merge_file, lambda s, a: {**ch10.merge_file_reference(s, a), **a}, "the keys differ")


def test_adapted_layers_names_duplicates():
    from minimind_ref.checks import ch10

    check_fails(ch10.check_adapted_layers, lambda c: ch10.adapted_layers_reference(c) * 2, "some twice")


# ---------------------------------------------------------------------- issue 44, the second newcomer probe
# The mistakes a newcomer planted in chapter 10's exercises that the checks passed or left unnamed, as a learner
# writes them; each message must name the mistake.
def test_probe_lora_forward_mistakes_are_named(monkeypatch):
    check_fails(ch10.check_lora_forward, lambda x, W, A, B, s=1.0: s * (F.linear(x, W) + F.linear(F.linear(x, A), B)),
                "this looks like the whole output scaled, the frozen layer's part too")
    monkeypatch.setattr(delegation, "ENFORCED", True)

    def through_apply_lora(x, W, A, B, s=1.0):
        holder = torch.nn.Module()
        holder.lin = torch.nn.Linear(W.shape[1], W.shape[0], bias=False)
        if W.shape[0] != W.shape[1]:
            return F.linear(x, W) + s * F.linear(F.linear(x, A), B)
        lora.apply_lora(holder, rank=A.shape[0])
        return F.linear(x, W) + s * F.linear(F.linear(x, A), B)

    check_fails(ch10.check_lora_forward, through_apply_lora, "your function calls minimind_ref.lora.apply_lora")


def _probe_count(per_block=None, adapter=None, kv_adapted=False):
    def count(config, rank):
        H, L = config.hidden_size, config.num_hidden_layers
        kv = config.num_key_value_heads * H // config.num_attention_heads
        if kv_adapted:
            return L * rank * (2 * (H + H) + 2 * (H + kv))
        blocks = per_block if per_block is not None else 2 + (2 if config.num_key_value_heads == config.num_attention_heads else 0)
        return L * blocks * (adapter(rank, H) if adapter else rank * (H + H))
    return count


@pytest.mark.parametrize("fn, fragment", [
    (_probe_count(per_block=2), "k_proj and v_proj never counted, also where they are square"),
    (_probe_count(kv_adapted=True), "k_proj and v_proj given adapters whatever their shape"),
    (_probe_count(adapter=lambda r, H: r * r + H * r), "the rank squared in each adapter"),
    (_probe_count(adapter=lambda r, H: r * H), "only each adapter's A counted"),
])
def test_probe_lora_parameter_count_mistakes_are_named(fn, fragment):
    message = check_fails(ch10.check_lora_parameter_count, fn, "this looks like " + fragment)
    assert "square too" not in message  # the case no longer names the decision


@pytest.mark.parametrize("fn, fragment", [
    (lambda m, A, B, old, new: m.clone(), "the merged weight returned unchanged"),
    (lambda m, A, B, old, new: m + (new + old) * (B @ A), "the two scales added"),
    (lambda m, A, B, old, new: m + (new - old) * (A.T @ B.T), "the update transposed"),
])
def test_probe_rescale_merged_mistakes_are_named(fn, fragment):
    check_fails(ch10.check_rescale_merged, fn, "this looks like " + fragment)


def test_probe_adapted_layers_allocation_and_prefix_are_named():
    from minimind_ref.model import MiniMindForCausalLM

    def allocated(config):
        model = MiniMindForCausalLM(config)
        return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m.weight.shape[0] == m.weight.shape[1]]

    check_fails(ch10.check_adapted_layers, allocated, "your function built a MiniMindForCausalLM whose weights are allocated")

    def inner_names(config):
        with torch.device("meta"):
            model = MiniMindForCausalLM(config)
        return [n for n, m in model.model.named_modules()
                if isinstance(m, torch.nn.Linear) and m.weight.shape[0] == m.weight.shape[1]]

    check_fails(ch10.check_adapted_layers, inner_names, "this looks like the names taken inside the decoder")


def test_probe_merge_file_fp32_tensors_are_named():
    def kept_fp32(state, adapters):
        out = ch10.merge_file_reference(state, adapters)
        return {k: (v if f"{k[:-len('.weight')]}.lora.A.weight" in adapters else state[k]) for k, v in out.items()}

    check_fails(ch10.check_merge_file, kept_fp32, "this looks like the tensors without an adapter left in torch.float32")
