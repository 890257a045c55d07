"""Benchmark 3: the MoE layer's inference dispatch vs its training path vs a dense FFN of equal
active size (interleaved, medians with their range), and the host synchronizations per MoE layer
call. ``dispatch_vs_training`` is the dispatch's speed relative to the training path (> 1: faster);
``dispatch_vs_dense`` is its time relative to the dense FFN (1.0: no routing overhead)."""

from __future__ import annotations

from typing import Dict

import torch

import minimind_ref as mm

from .common import interleaved, ratio, sync


class SyncCounter:
    """Counts the points where the host would wait for the device: ``Tensor.cpu``, ``.item``,
    ``.tolist`` and Python ``bool``/``int``/``index`` conversions of tensors. Reading a tensor that
    an earlier ``.cpu()`` already brought to the host is not counted again."""

    NAMES = ("cpu", "item", "tolist", "__bool__", "__int__", "__index__")

    def __init__(self) -> None:
        self.count = 0
        self._saved = {}
        self._on_host = set()

    def __enter__(self) -> "SyncCounter":
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original

            def wrapper(t, *a, _orig=original, _name=name, **k):
                if id(t) not in self._on_host:
                    self.count += 1
                out = _orig(t, *a, **k)
                if _name == "cpu":
                    self._on_host.add(id(out))
                return out

            setattr(torch.Tensor, name, wrapper)
        return self

    def __exit__(self, *exc) -> None:
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)


def moe_layer(device: torch.device, tokens: int = 1024, repeats: int = 7) -> Dict[str, object]:
    torch.manual_seed(0)
    cfg = mm.minimind2_moe()
    moe = mm.MOEFeedForward(cfg).to(device)
    # dense FFN doing the same work per token: k routed experts + the shared ones, fused in width
    active_width = cfg.intermediate_size * (cfg.num_experts_per_tok + cfg.n_shared_experts)
    dense = mm.FeedForward(cfg, intermediate_size=active_width).to(device).eval()
    x = torch.randn(1, tokens, cfg.hidden_size, device=device)

    def infer() -> None:
        with torch.inference_mode():
            moe.eval()(x)
        sync(device)

    def train_path() -> None:
        with torch.inference_mode():
            moe.train()(x)
        sync(device)

    def dense_ffn() -> None:
        with torch.inference_mode():
            dense(x)
        sync(device)

    t = interleaved({"dispatch": infer, "training_path": train_path, "dense": dense_ffn}, repeats=repeats)
    moe.eval()
    with SyncCounter() as counter, torch.inference_mode():
        moe(x)
    return {
        "tokens": tokens,
        "times": t,
        "dispatch_ms": 1e3 * t["dispatch"]["median_s"],
        "training_path_ms": 1e3 * t["training_path"]["median_s"],
        "dense_equal_active_ms": 1e3 * t["dense"]["median_s"],
        "dispatch_vs_training": ratio(t["training_path"], t["dispatch"]),
        "dispatch_vs_dense": ratio(t["dispatch"], t["dense"]),
        "host_syncs_per_layer": counter.count,
    }
