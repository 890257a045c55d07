"""Benchmark 4: our RMSNorm vs torch.nn.RMSNorm vs torch.nn.LayerNorm (forward, and forward+backward)."""

from __future__ import annotations

from typing import Dict, List

import torch

import minimind_ref as mm

from .common import interleaved, sync


def norms(device: torch.device, shape=(16, 512, 512), repeats: int = 20) -> List[Dict[str, object]]:
    dim = shape[-1]
    modules = {
        "minimind_ref.RMSNorm": mm.RMSNorm(dim),
        "torch.nn.RMSNorm": torch.nn.RMSNorm(dim, eps=1e-5),
        "torch.nn.LayerNorm": torch.nn.LayerNorm(dim, eps=1e-5),
    }
    x = torch.randn(*shape, device=device)
    forward, forward_backward = {}, {}
    for name, module in modules.items():
        module = module.to(device)

        def fwd(module=module) -> None:
            with torch.no_grad():
                module(x)
            sync(device)

        xg = x.clone().requires_grad_(True)

        def fwd_bwd(module=module, xg=xg) -> None:
            module(xg).sum().backward()
            sync(device)

        forward[name], forward_backward[name] = fwd, fwd_bwd
    f = interleaved(forward, repeats=repeats)
    fb = interleaved(forward_backward, repeats=max(5, repeats // 2))
    rows = [{"module": name, "forward": f[name], "fwd_bwd": fb[name], "forward_ms": 1e3 * f[name]["median_s"],
             "fwd_bwd_ms": 1e3 * fb[name]["median_s"]} for name in modules]
    ours = rows[0]
    for row in rows:
        row["forward_speed_vs_ours"] = ours["forward_ms"] / row["forward_ms"]
        row["fwd_bwd_speed_vs_ours"] = ours["fwd_bwd_ms"] / row["fwd_bwd_ms"]
    return rows
