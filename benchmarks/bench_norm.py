"""Benchmark 4: our RMSNorm vs torch.nn.RMSNorm vs torch.nn.LayerNorm (forward, and forward+backward)."""

from __future__ import annotations

from typing import Dict, List

import torch

import minimind_ref as mm

from .common import sync, timeit


def norms(device: torch.device, shape=(16, 512, 512), repeats: int = 20) -> List[Dict[str, float]]:
    dim = shape[-1]
    modules = {
        "minimind_ref.RMSNorm": mm.RMSNorm(dim),
        "torch.nn.RMSNorm": torch.nn.RMSNorm(dim, eps=1e-5),
        "torch.nn.LayerNorm": torch.nn.LayerNorm(dim, eps=1e-5),
    }
    x = torch.randn(*shape, device=device)
    rows = []
    base = None
    for name, module in modules.items():
        module = module.to(device)

        def fwd() -> None:
            with torch.no_grad():
                module(x)
            sync(device)

        xg = x.clone().requires_grad_(True)

        def fwd_bwd() -> None:
            module(xg).sum().backward()
            sync(device)

        f = timeit(fwd, repeats=repeats)["median_s"]
        fb = timeit(fwd_bwd, repeats=max(5, repeats // 2))["median_s"]
        base = base or f
        rows.append({"module": name, "forward_ms": 1e3 * f, "fwd_bwd_ms": 1e3 * fb})
    ours = rows[0]
    for row in rows:
        row["forward_speed_vs_ours"] = ours["forward_ms"] / row["forward_ms"]
        row["fwd_bwd_speed_vs_ours"] = ours["fwd_bwd_ms"] / row["fwd_bwd_ms"]
    return rows
