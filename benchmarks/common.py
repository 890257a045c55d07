"""Timing and environment helpers shared by the benchmarks.

Every figure we publish is a ratio of two timings taken in the same run on the same machine, or a
rate with its device and versions recorded next to it. Timings are the median of several repeats
after a warm-up call.
"""

from __future__ import annotations

import os
import platform
import statistics
from typing import Callable, Dict

import torch

from minimind_ref.utils import device_name, synchronize, time_calls


def timeit(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> Dict[str, float]:
    """Median/min/max wall time in seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs
    (the callers synchronize the device inside ``fn``)."""
    times = time_calls({"fn": fn}, repeats=repeats, warmup=warmup)["fn"]
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "repeats": repeats}


def environment(device: torch.device) -> Dict[str, object]:
    env: Dict[str, object] = {
        "device": str(device),
        "device_name": device_name(device),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        env["transformers"] = None
    return env


sync = synchronize
