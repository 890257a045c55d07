"""Make the minimind-3 parity fixture from upstream's own model code (run by hand, never by the tests).

    python tools/upstream_fixtures.py --upstream /path/to/minimind   # a checkout of jingyaogong/minimind at d65ef2c
    # writes tests/data/upstream_reference_minimind3.pt
    python tools/upstream_fixtures.py --upstream /path/to/minimind --example
    # writes minimind_ref/reference_outputs/upstream_minimind3.pt (package data, chapter 05)

It imports upstream's ``model/model_minimind.py`` from the checkout (it needs ``transformers``:
the project's ``.venv`` has 4.57.6), builds small models of upstream's own ``MiniMindForCausalLM``
for a few configurations, gives every parameter random values (norm gains included, so a missing
gain would show), runs them and stores weights, inputs and outputs. ``tests/test_upstream_parity_minimind3.py``
loads the same weights into ``minimind_ref`` with ``strict=True`` and compares every output at 1e-5.
Upstream's code itself is not part of this repository.

``--example`` writes the small file that ships with the package instead (``EXAMPLE_OUT``, read by
``minimind_ref.checkpoint.upstream_reference_outputs``): two tiny models with minimind-3's layout
(``EXAMPLE_CASES``: 8 query heads sharing 4 KV heads, QK-norm, the pi width rule; one dense, one
with 4 experts, top-1), their weights stored in fp16 (the model ran on the fp16-rounded values, so
the file loses nothing), a batch of token ids, upstream's logits in eval mode, and the parameter
counts upstream's code gives its two published configurations (``MiniMindConfig()`` and
``MiniMindConfig(use_moe=True)``, counted on the meta device). Chapter 05 loads the weights into
``minimind_ref`` with ``strict=True`` and compares the logits.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any, Dict

import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "upstream_reference_minimind3.pt"
EXAMPLE_OUT = ROOT / "minimind_ref" / "reference_outputs" / "upstream_minimind3.pt"

#: name -> keyword arguments of upstream's d65ef2c ``MiniMindConfig`` (its own names).
_SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=61,
              max_position_embeddings=64)
CASES: Dict[str, Dict[str, Any]] = {
    "dense": dict(_SMALL),
    "dense_default_heads": dict(_SMALL, hidden_size=64, num_attention_heads=8, num_key_value_heads=4, intermediate_size=64),
    "dense_head_dim_untied_noflash": dict(_SMALL, head_dim=12, tie_word_embeddings=False, flash_attn=False),
    "yarn": dict(_SMALL, max_position_embeddings=4096, inference_rope_scaling=True),
    "moe_top1": dict(_SMALL, use_moe=True, router_aux_loss_coef=0.1, moe_intermediate_size=32),
    "moe_top2_unnormalized": dict(_SMALL, use_moe=True, num_experts_per_tok=2, norm_topk_prob=False,
                                  moe_intermediate_size=48, num_experts=5),
    "moe_default_coef": dict(_SMALL, hidden_size=16, num_attention_heads=2, num_key_value_heads=1, use_moe=True),
}


#: The package example: minimind-3's head layout and width rule at a tiny size (upstream's keyword names).
_TINY3 = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4, vocab_size=64,
              max_position_embeddings=64)
EXAMPLE_CASES: Dict[str, Dict[str, Any]] = {
    "minimind-3": dict(_TINY3),
    "minimind-3-moe": dict(_TINY3, use_moe=True, moe_intermediate_size=64),
}


def load_upstream(checkout: Path):
    """Upstream's ``model/model_minimind.py`` as a module."""
    path = checkout / "model" / "model_minimind.py"
    spec = importlib.util.spec_from_file_location("upstream_model_minimind", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def randomize(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Every parameter random: matrices N(0, 0.2^2), norm gains 1 + N(0, 0.3^2)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(1 + 0.3 * noise if name.endswith("norm.weight") else 0.2 * noise)


def run_case(upstream, kwargs: Dict[str, Any], seed: int) -> Dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    config = upstream.MiniMindConfig(**kwargs)
    model = upstream.MiniMindForCausalLM(config)
    randomize(model, g)
    vocab = kwargs["vocab_size"]
    ids = torch.randint(0, vocab, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # row 1 padded on the left
    mask[2, -2:] = 0  # row 2 padded on the right
    out: Dict[str, Any] = {"config": dict(kwargs), "input_ids": ids, "attention_mask": mask}
    out["state_dict"] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    model.eval()
    with torch.no_grad():
        res = model(ids, labels=ids)
        out["logits"], out["eval_loss"], out["eval_aux_loss"] = res.logits, res.loss, res.aux_loss
        out["logits_padded"] = model(ids, attention_mask=mask).logits
        out["logits_keep3"] = model(ids, logits_to_keep=3).logits
        out["logits_keep_positions"] = model(ids, logits_to_keep=torch.tensor([0, 5, 11])).logits
        res = model(ids[:, :7], use_cache=True)
        pieces, past = [res.logits], res.past_key_values
        for t in range(7, ids.shape[1]):
            res = model(ids[:, t:t + 1], past_key_values=past, use_cache=True)
            pieces.append(res.logits)
            past = res.past_key_values
        out["logits_cached"] = torch.cat(pieces, 1)
        out["cache_k0"], out["cache_v1"] = past[0][0], past[-1][1]
        res = model(ids[:, :7], attention_mask=mask[:, :7], use_cache=True)
        res = model(ids[:, 7:], attention_mask=mask, past_key_values=res.past_key_values, use_cache=True)
        out["logits_padded_chunk"] = res.logits

    model.zero_grad()
    res = model(ids, labels=ids)  # eval mode, with gradients (upstream's eval path keeps the graph)
    res.loss.backward()
    if kwargs.get("use_moe"):  # (a dense model's eval gradients are its training ones)
        out["eval_grads"] = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}

    model.train()
    model.zero_grad()
    labels = ids.masked_fill(mask == 0, -100)
    res = model(ids, attention_mask=mask, labels=labels)
    out["train_logits"], out["loss"], out["aux_loss"] = res.logits, res.loss, res.aux_loss
    (res.loss + res.aux_loss).backward()
    out["grads"] = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
    return out


def run_example(upstream, kwargs: Dict[str, Any], seed: int) -> Dict[str, Any]:
    """A package example: fp16-rounded random weights, a batch of ids, upstream's eval logits (fp32)."""
    g = torch.Generator().manual_seed(seed)
    model = upstream.MiniMindForCausalLM(upstream.MiniMindConfig(**kwargs))
    randomize(model, g)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())  # the stored fp16 values are exactly the ones the model ran on
    ids = torch.randint(0, kwargs["vocab_size"], (2, 10), generator=g)
    model.eval()
    with torch.no_grad():
        logits = model(ids).logits
    state = {k: v.detach().half().clone() for k, v in model.state_dict().items()}
    return {"config": dict(kwargs), "state_dict": state, "input_ids": ids, "logits": logits}


def published_counts(upstream) -> Dict[str, int]:
    """Parameters of upstream's two default configurations, tied weights once, built on the meta device."""
    counts = {}
    for name, kwargs in (("minimind-3", {}), ("minimind-3-moe", {"use_moe": True})):
        with torch.device("meta"):
            model = upstream.MiniMindForCausalLM(upstream.MiniMindConfig(**kwargs))
        counts[name] = sum(p.numel() for p in model.parameters())
    return counts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--upstream", required=True, type=Path, help="a checkout of jingyaogong/minimind at d65ef2c")
    p.add_argument("--out", type=Path, default=None, help=f"default {OUT} ({EXAMPLE_OUT} with --example)")
    p.add_argument("--example", action="store_true", help="write the package example (chapter 05) instead")
    args = p.parse_args(argv)
    upstream = load_upstream(args.upstream)
    import transformers

    if args.example:
        out = args.out or EXAMPLE_OUT
        cases = {name: run_example(upstream, kwargs, seed) for seed, (name, kwargs) in enumerate(EXAMPLE_CASES.items())}
        note = (f"Made by tools/upstream_fixtures.py --example with upstream minimind-3 (model/model_minimind.py, "
                f"d65ef2c), transformers {transformers.__version__}, torch {torch.__version__}, CPU: weights fp16, "
                f"logits fp32 (eval mode), parameter counts of MiniMindConfig() and MiniMindConfig(use_moe=True).")
        out.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"cases": cases, "parameter_counts": published_counts(upstream), "note": note}, out)
        print(f"wrote {out} ({len(cases)} cases): {note}")
        return 0

    cases = {name: run_case(upstream, kwargs, seed) for seed, (name, kwargs) in enumerate(CASES.items())}
    note = (f"Outputs of upstream minimind-3 (model/model_minimind.py, d65ef2c) with transformers "
            f"{transformers.__version__}, torch {torch.__version__} on CPU, fp32; made by tools/upstream_fixtures.py.")
    out = args.out or OUT
    torch.save({"cases": cases, "note": note}, out)
    print(f"wrote {out} ({len(cases)} cases): {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
