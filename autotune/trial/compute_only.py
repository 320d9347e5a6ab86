"""The compute-only ceiling: the same model, batch and precision, on batches already on the device.

A trial with ``TrialSpec.compute_only`` collates a few batches in its own process (no DataLoader workers, no
decoding during the window), moves them to the device once and cycles them through the timed loop. What it
measures is what the training step alone can do: the ceiling of the end-to-end figure. The winner's throughput as a
fraction of it is the data pipeline's efficiency (1.0: data loading costs the step nothing).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from autotune.knobs.config import TrialConfig
    from autotune.trial.distributed import RankInfo
    from autotune.workloads.base import TrainingSetup

__all__ = ["in_memory_batches", "IN_MEMORY_BATCHES"]

IN_MEMORY_BATCHES = 4  # several, so a length-varying workload does not time one lucky shape


def in_memory_batches(
    setup: TrainingSetup,
    config: TrialConfig,
    *,
    device: torch.device,
    seed: int,
    rank: RankInfo | None = None,
    count: int = IN_MEMORY_BATCHES,
) -> Iterator[Any]:
    """`count` batches collated here (workers 0), moved to the device once, then repeated for ever."""
    from autotune.trial.loader import build_loader

    host_config = dataclasses.replace(config, num_workers=0, pin_memory=False)
    loader = build_loader(setup, host_config, total_batches=count, seed=seed, rank=rank)
    batches = [setup.batch_to_device(batch, device, False) for batch in itertools.islice(loader, count)]
    if not batches:
        raise RuntimeError("the data yielded no batch for the compute-only ceiling")
    return itertools.cycle(batches)
