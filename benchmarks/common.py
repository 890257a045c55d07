"""Timing and environment helpers shared by the benchmarks.

Every figure we publish is a ratio of two timings taken in the same run on the same machine, or a
rate with its device and versions recorded next to it. Timings are the median of several repeats
after a warm-up call.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Callable, Dict, List

import torch


def timeit(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> Dict[str, float]:
    """Median/min/max wall time in seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times: List[float] = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "repeats": repeats}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def environment(device: torch.device) -> Dict[str, object]:
    env: Dict[str, object] = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
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


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
