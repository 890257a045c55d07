"""Timing and environment helpers shared by the benchmarks.

Every figure we publish is a ratio of two timings taken in the same run on the same machine, or a
rate with its device and versions recorded next to it. Timings are medians of at least five
repetitions after a warm-up; the systems being compared run **interleaved** (A B C, B C A, C A B,
...), so a slow spell of the machine hits all of them alike, and each ratio is also computed per
repetition (the i-th run of A against the i-th run of B) to give its spread. A figure whose
spread, ``(max - min) / median``, exceeds ``SPREAD_LIMIT`` is measured again with twice the
repetitions; if it is still above, it is flagged (``"unstable": True``) and the page says so.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Callable, Dict, List, Mapping, Optional

import torch

from minimind_ref.utils import device_name, synchronize

#: A figure whose (max - min) / median is above this is re-measured, then flagged.
SPREAD_LIMIT = 0.10
#: The fewest timed repetitions behind any published figure.
MIN_REPEATS = 5

sync = synchronize


def summarize(times: List[float]) -> Dict[str, object]:
    """Median, min, max and spread of a list of timings (seconds)."""
    median = statistics.median(times)
    return {"median_s": median, "min_s": min(times), "max_s": max(times), "repeats": len(times),
            "spread": (max(times) - min(times)) / median if median > 0 else 0.0, "times_s": list(times)}


def ratio(numerator: Mapping[str, object], denominator: Mapping[str, object]) -> Dict[str, float]:
    """``numerator / denominator`` per repetition of two interleaved timings: the median and range
    of the paired ratios (a speed-up of B over A is ``ratio(time_A, time_B)``)."""
    pairs = [a / b for a, b in zip(numerator["times_s"], denominator["times_s"])]
    median = statistics.median(pairs)
    return {"median": median, "min": min(pairs), "max": max(pairs),
            "spread": (max(pairs) - min(pairs)) / median if median > 0 else 0.0}


def _interleaved_once(fns: Mapping[str, Callable[[], object]], repeats: int, warmup: int,
                      clock: Callable[[], float]) -> Dict[str, List[float]]:
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: Dict[str, List[float]] = {name: [] for name in names}
    for rep in range(repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:  # rotate the order: no system always runs first
            start = clock()
            fns[name]()
            times[name].append(clock() - start)
    return times


def interleaved(fns: Mapping[str, Callable[[], object]], repeats: int = MIN_REPEATS, warmup: int = 1,
                clock: Callable[[], float] = time.perf_counter, retry: bool = True) -> Dict[str, Dict[str, object]]:
    """Time each ``fns[name]()`` ``repeats`` times, interleaved, after ``warmup`` rounds.

    The callers synchronize the device inside each function. When a timing's spread exceeds
    ``SPREAD_LIMIT`` the whole set is measured again with twice the repetitions (``retry``) and the
    set with the smaller worst spread is kept; a timing still above the limit is flagged
    ``"unstable": True``.
    """
    if repeats < MIN_REPEATS:
        raise ValueError(f"repeats={repeats}: every published figure is a median of at least {MIN_REPEATS} runs")
    first = {name: summarize(t) for name, t in _interleaved_once(fns, repeats, warmup, clock).items()}
    result = first
    if retry and max(s["spread"] for s in first.values()) > SPREAD_LIMIT:
        second = {name: summarize(t) for name, t in _interleaved_once(fns, 2 * repeats, 0, clock).items()}
        if max(s["spread"] for s in second.values()) < max(s["spread"] for s in first.values()):
            result = second
        for stats in result.values():
            stats["remeasured"] = True
    for stats in result.values():
        stats["unstable"] = stats["spread"] > SPREAD_LIMIT
    return result


def timeit(fn: Callable[[], object], repeats: int = MIN_REPEATS, warmup: int = 1) -> Dict[str, object]:
    """One function on its own (``interleaved`` with a single entry)."""
    return interleaved({"fn": fn}, repeats=repeats, warmup=warmup)["fn"]


def small_model(device: torch.device):
    """MiniMind2-Small with the random weights of seed 0, in eval mode: the model every decode
    benchmark times (the same weights in each, so their figures can be compared)."""
    import minimind_ref as mm

    torch.manual_seed(0)
    return mm.MiniMindForCausalLM(mm.minimind2_small()).to(device).eval()


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


def flag(stats: Optional[Mapping[str, object]]) -> str:
    """`` (unstable)`` for a flagged timing, else nothing (used by the report)."""
    return " (unstable)" if stats and stats.get("unstable") else ""
