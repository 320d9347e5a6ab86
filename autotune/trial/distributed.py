"""Data-parallel trials: one process per device, torch.distributed (NCCL on CUDA, gloo on a CPU), DDP.

The launcher (trial/launch.py) starts the ranks with torchrun's environment contract (RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT); this module turns that into a process group, wraps the model, and gives the
timed loop the few collectives it needs so that every rank runs exactly the same number of steps. With one device
everything here is a no-op and no process group is created.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["RankInfo", "start", "stop", "world_size", "Forward", "all_gather", "all_agree", "max_over_ranks", "barrier"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RankInfo:
    """Where this process stands in a trial: its rank, the number of ranks, and its device index on this host."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_environment(cls) -> RankInfo:
        env = os.environ
        rank, world_size = int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1))
        return cls(rank=rank, world_size=world_size, local_rank=int(env.get("LOCAL_RANK", 0)))

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def start(info: RankInfo, device: torch.device, timeout_s: float) -> None:
    """Join the trial's process group; a peer that never arrives or dies fails collectives within timeout_s."""
    if not info.distributed:
        return
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    extra: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(
        backend, rank=info.rank, world_size=info.world_size, timeout=dt.timedelta(seconds=timeout_s), **extra
    )


def stop() -> None:
    """Leave the process group cleanly (only after a successful trial: a failed peer would make this wait)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _initialised() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    """Ranks in this trial (1 without a process group)."""
    import torch.distributed as dist

    return dist.get_world_size() if _initialised() else 1


def _tensor(values: list[float], device: torch.device) -> torch.Tensor:
    # NCCL only reduces device tensors; gloo reduces CPU tensors.
    return torch.tensor(values, dtype=torch.float64, device=device if device.type == "cuda" else "cpu")


def all_agree(flag: bool, device: torch.device) -> bool:
    """True when every rank says True (the same answer on every rank)."""
    if not _initialised():
        return flag
    import torch.distributed as dist

    value = _tensor([1.0 if flag else 0.0], device)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item() > 0.5)


def max_over_ranks(value: float, device: torch.device) -> float:
    if not _initialised():
        return value
    import torch.distributed as dist

    tensor = _tensor([value], device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def barrier(device: torch.device) -> None:
    """Every rank reaches this point before any goes on (the timed window's edges)."""
    if _initialised():
        all_agree(True, device)  # a reduction is a barrier that works the same on NCCL and gloo


def all_gather(value: Any) -> list[Any]:
    """Every rank's value, in rank order, on every rank (small picklable objects: per-rank summaries)."""
    if not _initialised():
        return [value]
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


class _LossModule(nn.Module):
    """The model with its loss function as forward, so that DDP sees the whole training computation."""

    def __init__(self, model: nn.Module, loss_fn: Callable[[nn.Module, Any], torch.Tensor]) -> None:
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, batch: Any) -> torch.Tensor:
        return self.loss_fn(self.model, batch)


class Forward:
    """batch -> loss, through DistributedDataParallel when the trial has several ranks.

    Workloads write loss_fn(model, batch) and may call submodules directly (model["embedder"](...)); DDP only
    synchronises gradients for computation that runs through its own forward, so the loss function itself becomes
    the forward of a thin wrapper module. find_unused_parameters is the workload's (TrainingSetup): DDP's search,
    every step, for parameters a step leaves without a gradient, which a recipe that has them must turn on.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[[nn.Module, Any], torch.Tensor],
        device: torch.device,
        *,
        find_unused_parameters: bool = False,
    ):
        self._model, self._loss_fn = model, loss_fn
        self._ddp: nn.Module | None = None
        if _initialised():
            from torch.nn.parallel import DistributedDataParallel

            ids = [device.index] if device.type == "cuda" else None
            self._ddp = DistributedDataParallel(
                _LossModule(model, loss_fn), device_ids=ids, find_unused_parameters=find_unused_parameters
            )

    def __call__(self, batch: Any) -> torch.Tensor:
        return self._ddp(batch) if self._ddp is not None else self._loss_fn(self._model, batch)

    @contextlib.contextmanager
    def accumulating(self) -> Iterator[None]:
        """A micro-batch whose gradients are only accumulated: no all-reduce until the last one (DDP's no_sync)."""
        if self._ddp is None:
            yield
            return
        with self._ddp.no_sync():  # type: ignore[operator]
            yield
