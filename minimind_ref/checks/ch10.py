"""Checks for chapter 10 (LoRA): the adapted layer's forward, counting the parameters upstream's
``apply_lora`` adds, turning a merged adapter up or down without the frozen weight, which layers get an adapter in a given
layout (minimind-3's free ``head_dim`` included), and upstream's fp16 file-to-file merge.

Each check runs the learner's function on inputs it makes itself and compares with
``minimind_ref.lora`` (upstream's ``model/model_lora.py``: ``y = W x + B(A(x))``, adapters on
every square ``nn.Linear``); a mismatch names the known mistake it matches when it can.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List

import torch
import torch.nn.functional as F
from torch import nn

from .. import lora as ref_lora
from ..config import MiniMindConfig, preset
from .core import ExerciseError, Outcome, as_number, call, check, check_close, check_numbers, fail, seeded, solution
from .delegation import forbid, guarded, modules_built
from .diagnosis import close_tensors, explaining


def _model_class():
    from ..model import MiniMindForCausalLM

    return MiniMindForCausalLM


def _macs(fn: Callable[[], Any]) -> int:
    """Multiply-adds of the matrix products ``fn`` runs (``torch.utils.flop_counter``: mm, addmm, bmm ...)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops() // 2


# ---------------------------------------------------------------------- 10.1 the adapted layer
def _forward_cases() -> List[Dict[str, Any]]:
    out = []
    # few tokens beside wide layers and a small rank: then the thin path is the cheapest, and any order that forms
    # an [out, in] product costs more (with n tokens that happens below n = in * out / (in + out))
    for n, (batch, d_in, d_out, rank, scale) in enumerate([((2, 3), 32, 32, 3, 1.0), ((2, 5), 48, 40, 4, 2.0),
                                                            ((4,), 24, 20, 2, 1.0), ((1,), 64, 64, 8, 0.5)]):
        g = seeded(200 + n)
        out.append({"x": torch.randn(*batch, d_in, generator=g), "weight": torch.randn(d_out, d_in, generator=g) * 0.3,
                    "A": torch.randn(rank, d_in, generator=g) * 0.3, "B": torch.randn(d_out, rank, generator=g) * 0.3,
                    "scale": scale, "case": f"x {tuple(batch) + (d_in,)}, W [{d_out}, {d_in}], rank {rank}, scale {scale}"})
    return out


def lora_forward_reference(x: torch.Tensor, weight: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                           scale: float = 1.0) -> torch.Tensor:
    """``x W^T + scale * (x A^T) B^T``: what ``minimind_ref.lora``'s adapted ``nn.Linear`` computes."""
    return F.linear(x, weight) + scale * F.linear(F.linear(x, A), B)


def _forward_mistakes(x, weight, A, B, scale) -> Dict[str, Callable[[], torch.Tensor]]:
    rank = A.shape[0]
    return {
        "the frozen path left out (the layer's output is W x PLUS the adapter's B A x)":
            lambda: scale * F.linear(F.linear(x, A), B),
        "the scale ignored": lambda: F.linear(x, weight) + F.linear(F.linear(x, A), B),
        "the whole output scaled, the frozen layer's part too":
            lambda: scale * (F.linear(x, weight) + F.linear(F.linear(x, A), B)),
        "the adapter divided by its rank (PEFT's alpha / r; upstream's LoRA has no such factor)":
            lambda: F.linear(x, weight) + scale / rank * F.linear(F.linear(x, A), B),
        "W not transposed": lambda: x @ weight + scale * F.linear(F.linear(x, A), B),
        "A and B not transposed": lambda: F.linear(x, weight) + scale * (x @ B @ A),
    }


solution("10.1", "F.linear(x, weight) + scale * F.linear(F.linear(x, A), B)")


def _order_costs(x: torch.Tensor, weight: torch.Tensor, A: torch.Tensor, B: torch.Tensor) -> Dict[str, int]:
    """Multiply-adds of the orders a learner may choose, on this case (the right one is not among them)."""
    return {
        "the two factors multiplied together first, an [out, in] matrix built on every call, then applied to x":
            _macs(lambda: F.linear(x, weight) + F.linear(x, B @ A)),
        "the adapter folded into the weight on every call (W plus the product of the factors, then one product "
        "with x)":
            _macs(lambda: F.linear(x, weight + B @ A)),
    }


# what would answer 10.1 without any of the work: the course's adapted layer and the check's own reference
FORWARD_FUNCTIONS = [forbid("minimind_ref.lora.LoRA", ref_lora.LoRA), forbid("minimind_ref.lora.apply_lora", ref_lora.apply_lora),
                     forbid("minimind_ref.lora.merge_lora", ref_lora.merge_lora),
                     forbid("ch10.lora_forward_reference", lora_forward_reference)]


@check("Exercise 10.1 lora_forward", shown=True,
       why="one entry of an adapted layer's output on random weights and inputs")
def check_lora_forward(lora_forward: Callable[..., Any]) -> str:
    """``lora_forward(x [..., in], weight [out, in], A [rank, in], B [out, rank], scale)`` must equal
    ``x W^T + scale * B(A(x))`` within rtol = atol = 1e-5, leaving its inputs unchanged."""
    name = "Exercise 10.1 lora_forward"
    cases = _forward_cases()
    for c in cases:
        x, weight, A, B, scale, case = c["x"], c["weight"], c["A"], c["B"], c["scale"], c["case"]
        learner = guarded(lora_forward, name, FORWARD_FUNCTIONS)
        got = call(learner, x.clone(), weight.clone(), A.clone(), B.clone(), scale, name=name, case=case,
                   check_inputs=True, hint="two paths added: the frozen layer and the adapter.")
        check_close(got, lora_forward_reference(x, weight, A, B, scale), name=name, case=case, rtol=1e-5, atol=1e-5,
                    mistakes=_forward_mistakes(x, weight, A, B, scale),
                    hint="an nn.Linear with weight W [out, in] multiplies x by W transposed; A is [rank, in], B is "
                         "[out, rank], and the output of the side path is scaled.")
        needed = _macs(lambda: lora_forward_reference(x, weight, A, B, scale))
        spent = _macs(lambda: learner(x.clone(), weight.clone(), A.clone(), B.clone(), scale))
        if spent > needed:
            seen = next((d for d, cost in _order_costs(x, weight, A, B).items() if cost == spent), None)
            fail(name, (f"this looks like {seen}: " if seen else "")
                 + f"your forward is right but takes {spent / needed:.2f} times the multiply-adds the adapted layer needs "
                 f"on this input ({case}; {x.numel() // x.shape[-1]} tokens)",
                 "count, for n tokens, the multiply-adds of each order of the products, as a product of n, in, out "
                 "and the rank, and compare them for this case.")
    return (f"{len(cases)} layers (square and rectangular W, batched x, one token, scale 0.5 to 2), rtol = atol = "
            "1e-5, and no more multiply-adds than the layer needs")


# ---------------------------------------------------------------------- 10.3 a merged adapter turned up or down
def merge_weight_reference(weight: torch.Tensor, A: torch.Tensor, B: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``W + scale * B @ A`` as a new tensor: what ``minimind_ref.lora.merge_lora`` folds into each layer."""
    return weight + scale * (B @ A)


def rescale_merged_reference(merged: torch.Tensor, A: torch.Tensor, B: torch.Tensor, old_scale: float,
                             new_scale: float) -> torch.Tensor:
    """The weight of a layer merged at ``new_scale``, from the same layer merged at ``old_scale`` (``merged = W +
    old_scale * B @ A``) without ``W``: ``merged + (new_scale - old_scale) * B @ A``, a new tensor."""
    return merged + (new_scale - old_scale) * (B @ A)


def _rescale_cases() -> List[Dict[str, Any]]:
    out = []
    # the first case moves the scale up from 1: no two mistakes give one result there (turning the adapter off,
    # from 1 to 0, comes last: there "nothing changed" and "the new update added on top" coincide)
    # ... and a last case that keeps the scale: the weight is unchanged, and still a new tensor
    forward = _forward_cases()
    for c, (old, new) in zip(forward + forward[1:2], [(1.0, 2.5), (0.5, 1.5), (2.0, -1.0), (1.0, 0.0), (2.0, 2.0)]):
        merged = merge_weight_reference(c["weight"], c["A"], c["B"], old)
        out.append(dict(c, merged=merged, old=old, new=new,
                        case=c["case"].split(", scale")[0] + f", merged at scale {old}, wanted at scale {new}"))
    return out


def _rescale_mistakes(merged, A, B, old, new) -> Dict[str, Callable[[], torch.Tensor]]:
    rank = A.shape[0]
    return {
        "the update at the new scale added to the merged weight, which already holds the old one":
            lambda: merged + new * (B @ A),
        "the merged weight multiplied by the ratio of the scales, the frozen weight in it too":
            lambda: merged * (new / old),
        "the update at the old scale taken out but none put back at the new one": lambda: merged - old * (B @ A),
        "the difference of the scales the other way round": lambda: merged + (old - new) * (B @ A),
        "the ratio of the scales minus one taken as the update's factor":
            lambda: merged + (new / old - 1) * (B @ A),
        "the two scales added": lambda: merged + (old + new) * (B @ A),
        "the update transposed": lambda: merged + (new - old) * (B @ A).T,
        "the update divided by the rank": lambda: merged + (new - old) / rank * (B @ A),
        "the merged weight returned unchanged": lambda: merged.clone(),
    }


solution("10.3", "merged + (new_scale - old_scale) * (B @ A)")


@check("Exercise 10.3 rescale_merged", shown=True, why="one entry of a rescaled random weight")
def check_rescale_merged(rescale_merged: Callable[..., Any]) -> str:
    """``rescale_merged(merged [out, in], A [rank, in], B [out, rank], old_scale, new_scale)``: the weight of the
    layer merged at ``new_scale``, from the layer merged at ``old_scale`` without its frozen weight; a new tensor
    (rtol = atol = 1e-5) whose layer equals the adapted layer at ``new_scale`` on inputs."""
    name = "Exercise 10.3 rescale_merged"
    hint = ("write what the merged weight holds, as a sum, at the old scale and at the new one, and compare the two "
            "sums term by term.")
    forbidden = [forbid("minimind_ref.lora.merge_lora", ref_lora.merge_lora),
                 forbid("minimind_ref.lora.apply_lora", ref_lora.apply_lora),
                 forbid("minimind_ref.lora.LoRA", ref_lora.LoRA),
                 forbid("ch10.rescale_merged_reference", rescale_merged_reference),
                 forbid("ch10.merge_weight_reference", merge_weight_reference)]
    cases = _rescale_cases()
    got_all: List[torch.Tensor] = []
    for c in cases:
        merged, A, B, old, new, case = c["merged"], c["A"], c["B"], c["old"], c["new"], c["case"]
        given = merged.clone()
        try:
            got = call(guarded(rescale_merged, name, forbidden, case=case, hint=hint), given, A.clone(),
                       B.clone(), old, new, name=name, case=case, check_inputs=True,
                       hint="return a new tensor; do not add into the merged weight in place.")
        except ExerciseError:
            if any(not torch.allclose(g, rescale_merged_reference(d["merged"], d["A"], d["B"], d["old"], d["new"]),
                                      rtol=1e-5, atol=1e-5) for g, d in zip(got_all, cases)):
                cases = cases[:len(got_all)]  # an earlier case is wrong already: explain that one
                break
            raise
        if not isinstance(got, torch.Tensor) or got.shape != merged.shape:  # type and shape first, as check_close does
            check_close(got, rescale_merged_reference(merged, A, B, old, new), name=name, case=case,
                        mistakes=_rescale_mistakes(merged, A, B, old, new), hint=hint)
        if got.numel() and got.data_ptr() == given.data_ptr():
            fail(name, f"your function returned the merged weight it was given (the same storage), not a new tensor "
                       f"({case})", "the caller keeps the weight it passed: return a tensor of your own, whatever "
                                    "the two scales are.")
        got_all.append(got)
    expected = [rescale_merged_reference(c["merged"], c["A"], c["B"], c["old"], c["new"]) for c in cases]
    same = close_tensors(1e-5, 1e-5)
    wrong = next((n for n in range(len(cases)) if not same(got_all[n], expected[n])), None)
    if wrong is not None:
        mistakes = _rescale_mistakes(cases[0]["merged"], cases[0]["A"], cases[0]["B"], 1.0, 2.0)
        seen = explaining({d: (lambda c, d=d: _rescale_mistakes(c["merged"], c["A"], c["B"], c["old"], c["new"])[d]())
                           for d in mistakes}, cases, got_all, expected, wrong, same)
        check_close(got_all[wrong], expected[wrong], name=name, case=cases[wrong]["case"], rtol=1e-5, atol=1e-5,
                    mistakes={seen: got_all[wrong]} if seen else None, hint=hint)
    for c, got in zip(cases, got_all):
        x = c["x"]
        if not torch.allclose(F.linear(x, got), lora_forward_reference(x, c["weight"], c["A"], c["B"], c["new"]),
                              rtol=1e-4, atol=1e-4):
            fail(name, f"the rescaled layer's output differs from the adapted layer's at the new scale ({c['case']})",
                 hint)
    return (f"{len(cases)} layers (square and rectangular), scales up, down, to 0, below it and kept, rtol = atol = 1e-5, "
            "merged layer = adapted layer at the new scale, inputs unchanged")


# ---------------------------------------------------------------------- 10.2 counting adapter parameters
def lora_parameter_count_reference(config: MiniMindConfig, rank: int) -> int:
    """Parameters ``apply_lora(model, rank)`` adds to ``MiniMindForCausalLM(config)``: ``rank *
    (in + out)`` for every square ``nn.Linear`` (counted on a model built on the meta device)."""
    from ..model import MiniMindForCausalLM

    with torch.device("meta"):
        model = MiniMindForCausalLM(config)
    return sum(rank * (m.in_features + m.out_features) for m in model.modules()
               if isinstance(m, nn.Linear) and m.weight.shape[0] == m.weight.shape[1])


def _count_cases() -> List[Dict[str, Any]]:
    course = MiniMindConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                            vocab_size=512, intermediate_size=384)
    full_kv = MiniMindConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                             vocab_size=300)
    # MiniMind2-Small first: with its 8 layers, forgetting the layer count and counting half the
    # adapters give different numbers (with the course model's 2 layers they coincide)
    return [
        {"config": preset("MiniMind2-Small"), "rank": 16, "case": "MiniMind2-Small, rank 16"},
        {"config": course, "rank": 8, "case": "the course model (hidden 128, 2 layers, 8 heads, 2 KV heads), rank 8"},
        {"config": preset("MiniMind2-MoE"), "rank": 4, "case": "MiniMind2-MoE, rank 4"},
        {"config": full_kv, "rank": 2, "case": "hidden 64, 3 layers, 4 heads and 4 KV heads"},
    ]


def _count_mistakes(config: MiniMindConfig, rank: int) -> Dict[str, int]:
    h, layers = config.hidden_size, config.num_hidden_layers
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    right = lora_parameter_count_reference(config, rank)
    inter = config.intermediate_size
    square_kv = kv == h
    return {
        "the layer count left out (one block counted; the model has num_hidden_layers of them)": right // layers,
        "only each adapter's A counted, not its B": right // 2,
        "only q_proj adapted in each block": layers * rank * 2 * h,
        "k_proj and v_proj never counted, also where they are square": layers * 2 * rank * 2 * h,
        "k_proj and v_proj counted as square whatever their shape": layers * 4 * rank * 2 * h,
        "k_proj and v_proj given adapters whatever their shape, at their own width":
            layers * rank * (2 * 2 * h + 2 * (h + kv)),
        "the MLP counted too": right + layers * 3 * rank * (h + inter),
        "a full matrix per adapter instead of its two low-rank factors": layers * (2 + 2 * square_kv) * h * h,
        "the rank squared in each adapter": layers * (2 + 2 * square_kv) * (rank * rank + h * rank),
    }


solution("10.2", "h = config.hidden_size; kv = config.num_key_value_heads * (h // config.num_attention_heads); "
                 "per_layer = 2 + (2 if kv == h else 0); return config.num_hidden_layers * per_layer * rank * 2 * h")


@check("Exercise 10.2 lora_parameter_count", shown=False,
       why="the count is a closed form of the config's fields and the rank, which the case names")
def check_lora_parameter_count(lora_parameter_count: Callable[..., Any]) -> str:
    """``lora_parameter_count(config, rank)`` must return, as an int, the number of parameters
    upstream's ``apply_lora`` adds to ``MiniMindForCausalLM(config)``."""
    name = "Exercise 10.2 lora_parameter_count"
    cases = _count_cases()
    hint = ("an adapter on a [d_out, d_in] layer has A [rank, d_in] and B [d_out, rank], and upstream adapts only "
            "the square nn.Linear layers: which layers of a block are square for this config, and how many blocks are "
            "there?")
    outcomes = []
    for c in cases:
        config, rank, case = c["config"], c["rank"], c["case"]
        got = call(guarded(lora_parameter_count, name, [
                       forbid("minimind_ref.lora.apply_lora", ref_lora.apply_lora),
                       forbid("MiniMindForCausalLM", _model_class(), reason="the exercise asks you to count from the "
                              "config's numbers, without building the model"),
                       forbid("ch10.lora_parameter_count_reference", lora_parameter_count_reference)], case=case, hint=hint),
                   config, rank, name=name, case=case,
                   hint="use config.hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads.")
        if isinstance(got, float) and got.is_integer():
            got = int(got)
        got = as_number(got, name, case, integer=True, what="a number of parameters")
        outcomes.append(Outcome(case, got, lora_parameter_count_reference(config, rank), _count_mistakes(config, rank)))
    check_numbers(name, outcomes, hint)
    return f"{len(cases)} configs (the course model, MiniMind2-Small, MiniMind2-MoE, full KV heads)"


# ---------------------------------------------------------------------- 10.4 which layers get an adapter
def adapted_layers_reference(config: MiniMindConfig) -> List[str]:
    """Names of the modules ``apply_lora`` adapts in ``MiniMindForCausalLM(config)`` (every square
    ``nn.Linear``), in ``named_modules`` order (built on the meta device)."""
    from ..model import MiniMindForCausalLM

    with torch.device("meta"):
        model = MiniMindForCausalLM(config)
    return [name for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and m.weight.shape[0] == m.weight.shape[1]]


def _layer_cases() -> List[Dict[str, Any]]:
    small = dict(hidden_size=64, num_hidden_layers=2, vocab_size=97, max_position_embeddings=64)
    return [
        {"config": MiniMindConfig(num_attention_heads=8, num_key_value_heads=2, **small),
         "case": "MiniMind2 layout (8 heads, 2 KV heads)"},
        {"config": MiniMindConfig(generation="minimind-3", num_attention_heads=8, num_key_value_heads=4, **small),
         "case": "minimind-3 layout (8 heads, 4 KV heads, head_dim = hidden / heads)"},
        {"config": MiniMindConfig(generation="minimind-3", num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                                  **small), "case": "minimind-3 with head_dim 24 (4 heads x 24 = 96 != hidden 64)"},
        {"config": MiniMindConfig(num_attention_heads=4, num_key_value_heads=4, **small),
         "case": "4 heads and 4 KV heads"},
        {"config": MiniMindConfig(generation="minimind-3", num_attention_heads=4, num_key_value_heads=2, use_moe=True,
                                  moe_intermediate_size=64, **small),
         "case": "minimind-3 MoE whose experts' width equals hidden"},
    ]


solution("10.4", "with torch.device('meta'): m = MiniMindForCausalLM(config); return [n for n, x in "
                 "m.named_modules() if isinstance(x, nn.Linear) and x.weight.shape[0] == x.weight.shape[1]]")


@check("Exercise 10.4 adapted_layers", shown=False,
       why="the missing names would be the answer for the case's config: only their number is shown")
def check_adapted_layers(adapted_layers: Callable[..., Any]) -> str:
    """``adapted_layers(config) -> list of module names``: the modules of
    ``MiniMindForCausalLM(config)`` that upstream's ``apply_lora`` gives an adapter (every
    ``nn.Linear`` whose weight is square), derived from the config's shapes."""
    name = "Exercise 10.4 adapted_layers"
    cases = _layer_cases()
    for c in cases:
        config, case = c["config"], c["case"]
        with modules_built(off_meta=True) as allocated:
            got = call(guarded(adapted_layers, name, {"minimind_ref.lora.apply_lora": ref_lora.apply_lora,
                                                      "minimind_ref.lora.lora_modules": ref_lora.lora_modules,
                                                      "ch10.adapted_layers_reference": adapted_layers_reference}),
                       config, name=name, case=case)
        if allocated:
            fail(name, f"your function built a {allocated[0]} whose weights are allocated ({case}); the exercise asks "
                 "you to find the layers without allocating a model's weights",
                 "the meta device (chapter 05) knows every shape and allocates nothing.")
        if not isinstance(got, (list, tuple)) or not all(isinstance(n, str) for n in got):
            fail(name, f"expected a list of module names, got {got!r:.80} ({case})",
                 "return names such as 'model.layers.0.self_attn.q_proj'.")
        expected = adapted_layers_reference(config)
        got_set, want = set(got), set(expected)
        if got_set == want and len(got) == len(expected):
            continue
        extra, missing = sorted(got_set - want), sorted(want - got_set)
        if got_set == {n[len("model."):] for n in want if n.startswith("model.")} and got_set:
            fail(name, f"this looks like the names taken inside the decoder, without the 'model.' that "
                 f"MiniMindForCausalLM puts before them: {len(missing)} names differ ({case})",
                 "a name is the dotted path of the module from the MiniMindForCausalLM itself, the whole model.")
        what = f"names that get no adapter listed: {extra[:3]}" if extra else ""
        what += ("; " if what and missing else "") + (f"{len(missing)} adapted layers missing from your list" if missing
                                                      else "")
        hints = []
        if any(n.endswith(("k_proj", "v_proj")) for n in extra):
            hints.append("k_proj and v_proj map hidden to the KV heads' width: square only with as many KV heads as "
                         "query heads")
        if any(n.endswith(("q_proj", "o_proj")) for n in extra):
            hints.append("q_proj maps hidden to the query heads' width: with a free head_dim (minimind-3) that need not "
                         "equal hidden")
        if any(n == "lm_head" for n in extra):
            hints.append("lm_head maps hidden to the vocabulary: not square")
        if any("mlp" in n for n in missing + extra):
            hints.append("an MLP projection is square only when its width equals hidden (an expert can be)")
        fail(name, f"{what or 'the right names, but some twice'} ({case})",
             "; ".join(hints) or "work out each projection's shape from the config (queries, keys and values, output, "
             "the MLP or the experts) and keep the square ones; a name is the dotted path of the module in the model.")
    return f"{len(cases)} layouts (MiniMind2, minimind-3, a free head_dim, full KV heads, MoE)"


# ---------------------------------------------------------------------- 10.5 upstream's fp16 merge
def merge_file_reference(state_dict: Dict[str, torch.Tensor], adapters: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Upstream's ``merge_lora`` (d65ef2c) on state dicts: every tensor in fp16, and for each
    adapted layer ``W.half() + (B @ A).half()`` (the product in the weights' own dtype, then cast)."""
    out = {k: v.half() for k, v in state_dict.items()}
    for key in adapters:
        if key.endswith(".lora.A.weight"):
            layer = key[: -len(".lora.A.weight")]
            out[f"{layer}.weight"] = state_dict[f"{layer}.weight"].half() + (
                adapters[f"{layer}.lora.B.weight"] @ adapters[key]).half()
    return out


solution("10.5", "out = {k: v.half() for k, v in state_dict.items()}; for each layer with an adapter: "
                 "out[layer + '.weight'] = state_dict[layer + '.weight'].half() + (B @ A).half()")


@check("Exercise 10.5 merge_file", shown=True,
       why="one fp16 entry of a merged random weight: the rounding order is not in it")
def check_merge_file(merge_file: Callable[..., Any]) -> str:
    """``merge_file(state_dict, adapters) -> state dict``: what upstream's ``merge_lora(model,
    lora_path, save_path)`` writes, from the base model's fp32 ``state_dict`` and the adapters
    (``{'<layer>.lora.A.weight': [r, in], '<layer>.lora.B.weight': [out, r]}``): every key of
    ``state_dict`` and no adapter key, in fp16, ``W.half() + (B @ A).half()`` for the adapted layers."""
    name = "Exercise 10.5 merge_file"
    from ..model import MiniMindForCausalLM

    for seed, rank in ((1, 16), (2, 4)):
        torch.manual_seed(seed)
        model = ref_lora.apply_lora(MiniMindForCausalLM(MiniMindConfig(hidden_size=32, num_hidden_layers=2,
                                                                        num_attention_heads=4, num_key_value_heads=2,
                                                                        vocab_size=61)), rank=rank)
        g = seeded(seed)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if ".lora." in n:
                    p.copy_(0.3 * torch.randn(p.shape, generator=g))
        full = model.state_dict()
        base = {k: v.clone() for k, v in full.items() if ".lora." not in k}
        adapters = {k: v.clone() for k, v in full.items() if ".lora." in k}
        case = f"a 2-layer model, rank {rank}"
        got = call(guarded(merge_file, name, {"minimind_ref.lora.merge_lora": ref_lora.merge_lora,
                                              "minimind_ref.lora.load_lora": ref_lora.load_lora,
                                              "ch10.merge_file_reference": merge_file_reference}),
                   {k: v.clone() for k, v in base.items()}, {k: v.clone() for k, v in adapters.items()},
                   name=name, case=case, check_inputs=True)
        if not isinstance(got, dict):
            fail(name, f"expected a dict of tensors, got {type(got).__name__} ({case})", "return the merged state dict.")
        expected = merge_file_reference(base, adapters)
        if set(got) != set(expected):
            extra, missing = sorted(set(got) - set(expected)), sorted(set(expected) - set(got))
            fail(name, f"the keys differ ({case}): extra {extra[:2]}, missing {missing[:2]}",
                 "keep every key of the base state dict (both tied keys too) and drop the adapters' '.lora.' keys.")
        for key, want in expected.items():
            layer = key[: -len(".weight")]
            if isinstance(got[key], torch.Tensor) and got[key].dtype != want.dtype:
                where = ("an adapted layer's merged weight" if f"{layer}.lora.A.weight" in adapters
                         else "the tensors without an adapter")
                fail(name, f"this looks like {where} left in {got[key].dtype}: tensor {key} ({case})",
                     "compare the dtypes of the tensors in the file upstream's merge wrote (the cell before the "
                     "exercise) with yours, an adapted layer's and any other.")
            mistakes = {}
            if f"{layer}.lora.A.weight" in adapters:
                A, B, W = adapters[f"{layer}.lora.A.weight"], adapters[f"{layer}.lora.B.weight"], base[key]
                mistakes = {
                    "the sum formed in fp32 and rounded to fp16 once (upstream rounds at another point)":
                        lambda W=W, A=A, B=B: (W + B @ A).half(),
                    "the two factors multiplied in the wrong order (B is [out, r], A is [r, in])":
                        lambda W=W, A=A, B=B: W.half() + (A.T @ B.T).half() if A.shape[0] == B.shape[1] else None,
                    "the adapter's two factors rounded to fp16 before they are multiplied (upstream rounds at another "
                    "point)": lambda W=W, A=A, B=B: W.half() + (B.half().float() @ A.half().float()).half(),
                    "the sum formed in fp32 from the fp16-rounded product (upstream rounds at another point)":
                        lambda W=W, A=A, B=B: (W + (B @ A).half().float()).half(),
                    "the adapter left out (the merged file holds the adapted layer)": lambda W=W: W.half(),
                }
            check_close(got[key], want, name=name, rtol=0, atol=0, mistakes=mistakes, case=f"{case}; tensor {key}",
                        hint="compare each road with the file upstream's merge wrote (the cell before the exercise), or "
                             "read d65ef2c's merge_lora: which tensors are rounded to fp16, and whether the sum is "
                             "formed before or after that rounding.")
    return "two models, ranks 16 and 4, bit for bit"


def check_all(lora_forward: Callable[..., Any], lora_parameter_count: Callable[..., Any],
              rescale_merged: Callable[..., Any]) -> None:
    check_lora_forward(lora_forward)
    check_lora_parameter_count(lora_parameter_count)
    check_rescale_merged(rescale_merged)
