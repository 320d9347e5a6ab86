"""Which samples each rank trains on, epoch after epoch, and the check that an epoch adds up to the dataset.

Every rank draws its share of an epoch as torch's DistributedSampler deals it (a seeded permutation, padded to a
multiple of the world size, every world_size-th index), then batches it: shuffled batches of the per-device batch
size (the last short one dropped, as the recipes' drop_last=True), or the workload's own length-sorted batches.
A trial cycles epochs inside one batch sampler, so one DataLoader iterator (and one set of workers) runs the whole
trial however small the corpus; what a new epoch costs is measured at an epoch end after the window
(CycledEpochs.end_epoch, trial/epoch_boundary.py) and charged per epoch.

The accounting check counts what each rank really yields for one epoch and compares the sum over ranks with the
dataset size: a per-rank split applied twice (the 1/N^2 batches-per-epoch bug) can never pass it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from autotune.knobs.config import TrialConfig
    from autotune.workloads.base import TrainingSetup

__all__ = ["EpochAccounting", "CycledEpochs", "rank_indices", "epoch_batches", "epoch_size", "count_epoch"]


def rank_indices(dataset_size: int, *, rank: int, world_size: int, seed: int, epoch: int) -> list[int]:
    """This rank's dataset indices for one epoch, exactly as DistributedSampler(shuffle=True) deals them."""
    # torch types the dataset as a Dataset, but DistributedSampler only takes its len(): a range serves
    sampler: torch.utils.data.DistributedSampler[int] = torch.utils.data.DistributedSampler(
        range(dataset_size),  # type: ignore[arg-type]
        num_replicas=world_size,
        rank=rank,
        shuffle=True,
        seed=seed,
        drop_last=False,
    )
    sampler.set_epoch(epoch)
    return list(sampler)


def epoch_size(setup: TrainingSetup, config: TrialConfig, world_size: int) -> int:
    """Samples one epoch deals over all ranks: the dataset's size, or what the workload's own sampler deals where it
    drops or repeats items by design (TrainingSetup.samples_per_epoch)."""
    if setup.samples_per_epoch is not None:
        return setup.samples_per_epoch(config, world_size)
    return len(setup.dataset)  # type: ignore[arg-type]


def epoch_batches(
    setup: TrainingSetup,
    config: TrialConfig,
    *,
    rank: int,
    world_size: int,
    seed: int,
    epoch: int,
    fill: bool = True,
) -> Iterable[list[int]]:
    """One epoch of this rank's batches (lists of dataset indices).

    With fill, a share smaller than one batch (a small data list, a smoke test) is repeated until it fills one, so
    the trial still measures what a step of this batch costs; without it the epoch is exactly what training gets.
    """
    indices = rank_indices(len(setup.dataset), rank=rank, world_size=world_size, seed=seed, epoch=epoch)  # type: ignore[arg-type]
    if fill and indices and len(indices) < config.per_device_batch_size:
        indices = indices * -(-config.per_device_batch_size // len(indices))
    if setup.batch_sampler_factory is not None:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        return setup.batch_sampler_factory(config, generator, indices)
    size = config.per_device_batch_size
    return [indices[start : start + size] for start in range(0, len(indices) - size + 1, size)]


class CycledEpochs(torch.utils.data.Sampler[list[int]]):
    """A batch sampler running epoch after epoch until it has yielded total_batches batches, or until told to end
    (end_epoch): then the loader's iterator runs out as at the end of a real epoch, and a new one starts afresh."""

    def __init__(self, make_epoch: Callable[[int], Iterable[list[int]]], total_batches: int) -> None:
        self.make_epoch, self.total_batches = make_epoch, total_batches
        self.ending = False

    def __len__(self) -> int:
        return self.total_batches

    def end_epoch(self) -> None:
        """Yield nothing more: the loader hands out the batches its workers hold and then stops, as an epoch ends
        (trial/epoch_boundary.py). The next iteration (the loader's next epoch) yields again."""
        self.ending = True

    def __iter__(self) -> Iterator[list[int]]:
        self.ending = False  # runs at the new iteration's first request, after the previous one ended
        produced, epoch = 0, 0
        while produced < self.total_batches:
            before = produced
            for batch in self.make_epoch(epoch):
                if self.ending:
                    return
                yield batch
                produced += 1
                if produced >= self.total_batches:
                    return
            if produced == before:
                raise ValueError(
                    "an epoch gave this rank no batch: its share of the data is smaller than one per-device batch; "
                    "use a smaller batch, fewer devices or more data"
                )
            epoch += 1


@dataclass(frozen=True, kw_only=True, slots=True)
class EpochAccounting:
    """What each rank yields in one epoch, against the dataset size.

    Correct data parallelism deals every sample to exactly one rank per epoch, so the samples summed over ranks equal
    the dataset size, up to DistributedSampler's padding (fewer than world_size repeated samples) and the samples a
    rank drops with its last short batch (fewer than one batch per rank).
    """

    dataset_size: int
    world_size: int
    per_device_batch_size: int
    batches_per_rank: tuple[int, ...]
    samples_per_rank: tuple[int, ...]
    largest_batch: int
    buckets: dict[str, Any] | None = None  # the epoch's duration buckets and their batch sizes (data/buckets.py)

    @property
    def samples_total(self) -> int:
        return sum(self.samples_per_rank)

    @property
    def checkable(self) -> bool:
        """Every rank has at least one batch per epoch (else the data list is smaller than a batch per rank)."""
        return min(self.batches_per_rank) > 0

    def unchecked_reason(self) -> str:
        share = -(-self.dataset_size // self.world_size)
        where = f"each of {self.world_size} ranks gets {share} of them" if self.world_size > 1 else "one rank has all"
        return (
            f"no full batch in an epoch: the dataset has {self.dataset_size} samples ({where}), fewer than the "
            f"per-device batch of {self.per_device_batch_size}; measured on repeated samples, accounting not checked"
        )

    def mismatch(self) -> str | None:
        """None when the epoch adds up (or cannot be checked: fewer samples than a batch), else one line."""
        if not self.checkable:
            return None
        low = self.dataset_size - self.world_size * max(self.largest_batch, 1)
        high = self.dataset_size + self.world_size - 1
        if low < self.samples_total <= high:
            return None
        batches = "/".join(str(count) for count in sorted(set(self.batches_per_rank)))
        return (
            f"batch accounting: {batches} batches per epoch per rank x {self.world_size} ranks "
            f"(per-device batch {self.per_device_batch_size}) cover {self.samples_total} samples per epoch, but the "
            f"dataset has {self.dataset_size} (expected {max(low + 1, 0)}..{high}): the data is split across ranks "
            f"{'more than once' if self.samples_total < self.dataset_size else 'not at all'}"
        )

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "dataset_size": self.dataset_size,
            "world_size": self.world_size,
            "batches_per_epoch_per_rank": list(self.batches_per_rank),
            "samples_per_epoch": self.samples_total,
        }
        if not self.checkable:
            data["unchecked"] = self.unchecked_reason()
        if self.buckets is not None:
            data["buckets"] = self.buckets
        return data


def count_epoch(
    batches: Iterable[list[int]], item_audio_s: Sequence[float] | None = None
) -> tuple[int, int, int, float]:
    """(batches, samples, largest batch, seconds of audio) of one epoch, by iterating it: what a rank really yields,
    not its len(). The audio is summed from item_audio_s (each dataset item's), 0.0 without it."""
    count = samples = largest = 0
    audio_s = 0.0
    for batch in batches:
        count, samples, largest = count + 1, samples + len(batch), max(largest, len(batch))
        if item_audio_s is not None:
            audio_s += sum(item_audio_s[index] for index in batch)
    return count, samples, largest, audio_s
