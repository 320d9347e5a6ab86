"""Each rank's share of an epoch, epochs cycled for a trial, and the batch accounting check."""

from __future__ import annotations

import pytest
import torch

from autotune.data.batching import LengthSortedBatchSampler
from autotune.trial.sampling import CycledEpochs, EpochAccounting, count_epoch, rank_indices


@pytest.mark.parametrize(("size", "world_size"), [(64, 1), (64, 2), (10, 4), (7, 3)])
def test_ranks_share_an_epoch_without_overlap_beyond_padding(size, world_size):
    shares = [rank_indices(size, rank=r, world_size=world_size, seed=3, epoch=1) for r in range(world_size)]
    dealt = [index for share in shares for index in share]
    assert set(dealt) == set(range(size))  # every sample reaches some rank
    assert len(dealt) - size < world_size  # padding repeats fewer samples than there are ranks
    assert {len(share) for share in shares} == {-(-size // world_size)}
    assert rank_indices(size, rank=0, world_size=world_size, seed=3, epoch=2) != shares[0] or size < 3


def test_cycled_epochs_run_on_until_the_trial_has_its_batches_and_refuse_an_empty_epoch():
    epochs: list[int] = []

    def make_epoch(epoch: int) -> list[list[int]]:
        epochs.append(epoch)
        return [[epoch, 0], [epoch, 1]]

    assert list(CycledEpochs(make_epoch, 5)) == [[0, 0], [0, 1], [1, 0], [1, 1], [2, 0]]
    assert epochs == [0, 1, 2] and len(CycledEpochs(make_epoch, 5)) == 5
    with pytest.raises(ValueError, match="smaller than one per-device batch"):
        list(CycledEpochs(lambda epoch: [], 3))


def _accounting(dataset_size: int, world_size: int, batch: int, batches: int) -> EpochAccounting:
    return EpochAccounting(
        dataset_size=dataset_size,
        world_size=world_size,
        per_device_batch_size=batch,
        batches_per_rank=(batches,) * world_size,
        samples_per_rank=(batches * batch,) * world_size,
        largest_batch=batch,
    )


def test_accounting_accepts_drop_last_rounding_and_catches_a_double_split():
    # 1,000 samples, 4 ranks, 32 per device: 250 per rank -> 7 full batches each, 896 samples (drop_last).
    assert _accounting(1000, 4, 32, 7).mismatch() is None
    assert _accounting(1000, 1, 32, 31).mismatch() is None
    # The split applied twice: each rank batches 1000 / 4 / 4 = 62 samples -> 1 batch.
    message = _accounting(1000, 4, 32, 1).mismatch()
    assert message is not None and "1 batches per epoch per rank x 4 ranks" in message and "1000" in message
    assert "more than once" in message
    # A dataset smaller than one batch cannot be checked: said as such, not as a sharding bug.
    small = _accounting(8, 1, 16, 0)
    assert small.mismatch() is None and "fewer than the per-device batch of 16" in small.to_dict()["unchecked"]
    # No split at all: every rank trains on the whole dataset.
    assert "not at all" in (_accounting(1000, 4, 32, 31).mismatch() or "")


def test_length_sorted_batches_cover_one_epoch_of_a_share_exactly_once():
    frames = [50 * (i % 7 + 1) for i in range(40)]
    share = list(range(1, 40, 2))
    for size in ({"batch_size": 3}, {"max_frames_in_batch": 700}):
        sampler = LengthSortedBatchSampler(
            frames, num_batches=None, generator=torch.Generator().manual_seed(0), indices=share, sort_size=8, **size
        )
        batches = list(sampler)
        assert sorted(i for batch in batches for i in batch) == share  # the last short batch is kept, as WeNet does
        assert count_epoch(batches)[1] == len(share)
    assert len(LengthSortedBatchSampler(frames, num_batches=None, generator=torch.Generator(), batch_size=3)) == 14
