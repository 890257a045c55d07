"""Small helpers every chapter uses: device choice, seeding, default tolerances."""

from __future__ import annotations

import os
import random
from typing import Optional, Tuple, Union

import numpy as np
import torch


def pick_device(prefer: Optional[str] = None) -> torch.device:
    """``cuda`` if available, else ``mps`` (Apple silicon), else ``cpu``.

    ``prefer`` (or the environment variable ``MINIMIND_DEVICE``) forces a device, e.g. ``"cpu"``.
    """
    choice = prefer or os.environ.get("MINIMIND_DEVICE")
    if choice:
        return torch.device(choice)
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def seed_everything(seed: int = 0) -> torch.Generator:
    """Seed Python, NumPy and PyTorch (all devices); return a CPU ``torch.Generator`` with that seed."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    return torch.Generator().manual_seed(seed)


def default_tolerance(device: Union[str, torch.device] = "cpu", dtype: torch.dtype = torch.float32) -> Tuple[float, float]:
    """``(rtol, atol)`` for comparing a from-scratch computation with the reference.

    fp32 on CPU: 1e-5 / 1e-5. GPUs may use TF32 matmuls and other kernels: 1e-3 / 1e-3 on cuda
    and mps. Half precisions: 1e-2 (fp16) and 2e-2 (bf16).
    """
    kind = torch.device(device).type
    if dtype == torch.bfloat16:
        return 2e-2, 2e-2
    if dtype == torch.float16:
        return 1e-2, 1e-2
    if dtype == torch.float64:
        return 1e-7, 1e-7
    if kind in ("cuda", "mps"):
        return 1e-3, 1e-3
    return 1e-5, 1e-5
