"""Where a training run executes: its processes under ``torchrun`` and its device.

``torchrun --nproc_per_node N -m minimind_ref.train`` starts N copies of the run; each reads its
``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` from the environment (``dist_info``), picks its device
(``resolve_device``: ``cuda:LOCAL_RANK`` on a GPU machine), joins the process group (``nccl`` on
GPUs, ``gloo`` on CPUs) and wraps the model in ``DistributedDataParallel``, which averages the
gradients. ``setup_processes`` does all of that once and returns a ``Processes``: what the loop
asks of the other processes (wrap the model, wait, average the logged metrics). A plain run is one
process: rank 0 of 1, and every method is a no-op.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Tuple

import torch


def dist_info() -> Tuple[int, int, int]:
    """``(rank, world_size, local_rank)`` from torchrun's environment (``(0, 1, 0)`` without it)."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def _init_distributed(device: torch.device) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")


def resolve_device(cfg: Any, local_rank: int = 0, world_size: int = 1) -> torch.device:
    """The device of ``cfg.device`` (``"auto"``: cuda > mps > cpu; mps only for a single process);
    a CUDA device without an index becomes this process's GPU."""
    if cfg.device != "auto":
        dev = torch.device(cfg.device)
    elif torch.cuda.is_available():
        dev = torch.device("cuda")
    elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available() and world_size == 1:
        dev = torch.device("mps")
    else:
        dev = torch.device("cpu")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local_rank if world_size > 1 else torch.cuda.current_device())
    return dev


@dataclass(frozen=True)
class Processes:
    """This process's place in the run: ``rank`` of ``world`` processes, on ``device``."""

    rank: int
    world: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """The first process: the one that logs, evaluates and writes the run's files."""
        return self.rank == 0

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` inside ``DistributedDataParallel`` when there are several processes."""
        if self.world <= 1:
            return model
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def barrier(self) -> None:
        """Wait until every process gets here."""
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """The mean of ``values`` over the processes (as one process with the whole batch would log it)."""
        if self.world <= 1:
            return values
        import torch.distributed as dist

        dist.all_reduce(values)
        return values / self.world


def setup_processes(cfg: Any) -> Processes:
    """Who and where this process is (``dist_info``, ``resolve_device``); under torchrun
    (``WORLD_SIZE`` > 1) it selects its GPU and joins the process group if that is not done yet."""
    rank, world, local_rank = dist_info()
    device = resolve_device(cfg, local_rank, world)
    if world > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        _init_distributed(device)
    return Processes(rank, world, device)
