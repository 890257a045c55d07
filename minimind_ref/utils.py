"""Small helpers every chapter uses: device choice, seeding, default tolerances."""

from __future__ import annotations

import contextlib
import os
import platform
import random
import time
from typing import Callable, Dict, Hashable, Iterator, List, Mapping, NamedTuple, Optional, Tuple, Union

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


class HalfPrecision(NamedTuple):
    """What ``half_precision`` chose for a device: the autocast dtype (``None``: stay in fp32),
    whether training needs a gradient scaler with it, and why, in words to print."""

    dtype: Optional[torch.dtype]
    needs_scaler: bool
    reason: str


def half_precision(device: Union[str, torch.device]) -> HalfPrecision:
    """The half precision a device runs natively, for autocast (training and decoding alike).

    - ``cuda``: bf16 where the GPU has it in hardware (compute capability 8.0 or newer: A100, the
      RTX 30 series and later, H100), else fp16 with a gradient scaler (T4 and V100: fp16 tensor
      cores, no bf16). ``torch.cuda.is_bf16_supported()`` alone is not the rule: by default it
      counts emulation and answers True on a T4.
    - ``mps`` (Apple silicon): fp16 (bf16 needs macOS 14 and is not faster there); a scaler, as fp16
      on any device can underflow gradients.
    - ``cpu``: ``None``: the course's chapters and defaults stay in fp32 on a CPU (ask for bf16
      explicitly where the CPU has AVX512-BF16 or AMX).
    """
    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
        if (major, minor) >= (8, 0):
            return HalfPrecision(torch.bfloat16, False,
                                 f"bf16: {name} (compute capability {major}.{minor}) has it in hardware")
        return HalfPrecision(torch.float16, True,
                             f"fp16 with a gradient scaler: {name} (compute capability {major}.{minor}) "
                             "has no native bf16")
    if device.type == "mps":
        return HalfPrecision(torch.float16, True, "fp16 with a gradient scaler: Apple MPS")
    return HalfPrecision(None, False, f"fp32: no autocast on {device.type} by default")


def device_name(device: Union[str, torch.device]) -> str:
    """What a timing ran on, for printing next to it: the GPU's name, or the CPU's model and the
    number of threads torch uses."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        name = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as fh:
                name = next(ln for ln in fh if ln.startswith("model name")).split(":", 1)[1].strip()
        except (OSError, StopIteration):
            pass
        return f"CPU {name}, {torch.get_num_threads()} threads"
    return str(device)


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Run the block with one intra-op thread, then restore the previous count.

    For tiny CPU experiments (a few thousand parameters, many small ops): extra OpenMP threads buy
    nothing there, and on a shared machine (Colab, a laptop with other kernels busy) threads that
    spin-wait for a busy core can make a one-second cell take minutes. One thread also makes the
    float reductions independent of the machine's core count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def synchronize(device: Union[str, torch.device]) -> None:
    """Wait for queued GPU work, so a timer measures the work and not just its launch."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def time_calls(
    fns: Mapping[Hashable, Callable[[], object]],
    repeats: int = 5,
    warmup: int = 1,
    device: Union[str, torch.device] = "cpu",
) -> Dict[Hashable, List[float]]:
    """Wall-clock seconds of every call of each function, ``repeats`` samples per function.

    The functions take turns (one call of each per round), so a busy moment of the machine hits
    all of them alike and their ratios stay meaningful. Reduce the samples yourself: the median is
    robust, the minimum estimates the undisturbed time.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: Dict[Hashable, List[float]] = {key: [] for key in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            times[key].append(time.perf_counter() - start)
    return times
