"""The trial's DataLoader: built from the one set of keyword arguments a result hands over (knobs/dataloader.py),
with a batch sampler that deals this rank's share of each epoch in place of batch_size and drop_last."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.knobs.dataloader import BATCHING_KWARGS, dataloader_kwargs

if TYPE_CHECKING:
    import torch

    from autotune.knobs.config import TrialConfig
    from autotune.trial.distributed import RankInfo
    from autotune.workloads.base import TrainingSetup

__all__ = ["build_loader"]


def build_loader(
    setup: TrainingSetup,
    config: TrialConfig,
    *,
    total_batches: int,
    seed: int,
    rank: RankInfo | None = None,
) -> torch.utils.data.DataLoader[Any]:
    """A DataLoader as the user's training would build it (dataloader_kwargs), with this rank's share of each epoch.

    Its batch sampler runs epoch after epoch (trial/sampling.py) until the trial has all its batches, so the timed
    window measures steady state however small the corpus; a new epoch's cost is measured after the window
    (trial/epoch_boundary.py) and charged per epoch (trial/window_record.py WindowMeasurement.summary).
    """
    import torch

    from autotune.trial.distributed import RankInfo
    from autotune.trial.sampling import CycledEpochs, epoch_batches

    rank = rank or RankInfo()

    def make_epoch(epoch: int) -> Any:
        return epoch_batches(setup, config, rank=rank.rank, world_size=rank.world_size, seed=seed, epoch=epoch)

    kwargs = {key: value for key, value in dataloader_kwargs(config).items() if key not in BATCHING_KWARGS}
    return torch.utils.data.DataLoader(
        setup.dataset,
        batch_sampler=CycledEpochs(make_epoch, total_batches),
        collate_fn=setup.collate_fn,
        **kwargs,
    )
