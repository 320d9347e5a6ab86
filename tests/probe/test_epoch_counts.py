"""What one epoch of a rank holds, read from the DataLoader's lengths without iterating it (probe/readback.py)."""

from __future__ import annotations

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from autotune.probe.readback import LoaderSeen

DATA = list(range(100))


class BatchListSampler(BatchSampler):
    """Amphion's VariableSampler (models/base/base_sampler.py at d3de90f), as its NS2 trainer builds it: a
    BatchSampler of batch size 1 over a sampler of precomputed batches, yielding one whole batch at a time."""

    def __init__(self, batches: list[list[int]], drop_last: bool) -> None:
        self.data_list = batches
        super().__init__(RandomSampler(batches), 1, drop_last)

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield from (self.data_list[index] for index in self.sampler)


def _epoch(loader: DataLoader) -> dict:
    return LoaderSeen.of(loader, "train.py:1").epoch


def test_a_plain_loader_counts_its_samples_and_batches() -> None:
    epoch = _epoch(DataLoader(DATA, batch_size=8, shuffle=True))
    assert (epoch["dataset_size"], epoch["batches_per_epoch"], epoch["samples_per_epoch"]) == (100, 13, 100)
    dropped = _epoch(DataLoader(DATA, batch_size=8, drop_last=True))
    assert (dropped["batches_per_epoch"], dropped["samples_per_epoch"]) == (12, 96)


def test_a_batch_sampler_handing_out_whole_batches_counts_the_samples_in_them_not_the_batches() -> None:
    """Amphion's NS2 trainer: 125 batches of 8 a rank were read as 125 samples, 1/8 of the rank's share, and the
    trial was refused as sharded twice. The batches' own list gives the samples, without drawing a random number."""
    batches = [DATA[start : start + 8] for start in range(0, 96, 8)] + [DATA[96:]]
    loader = DataLoader(DATA, batch_sampler=BatchListSampler(batches, drop_last=False), collate_fn=lambda items: items)
    state = torch.random.get_rng_state()
    epoch = _epoch(loader)
    assert torch.equal(state, torch.random.get_rng_state())
    assert (epoch["batches_per_epoch"], epoch["samples_per_epoch"]) == (13, 100)
    assert sum(len(batch) for batch in loader) == 100  # what an epoch really yields


def test_a_batch_sampler_of_unknown_batches_is_left_unchecked_rather_than_misread() -> None:
    class Opaque(BatchSampler):
        def __init__(self) -> None:
            super().__init__(SequentialSampler(range(13)), 1, False)

        def __iter__(self):  # type: ignore[no-untyped-def]
            yield from ([index * 8 + offset for offset in range(8) if index * 8 + offset < 100] for index in range(13))

    epoch = _epoch(DataLoader(DATA, batch_sampler=Opaque(), collate_fn=lambda items: items))
    assert epoch["batches_per_epoch"] == 13 and epoch["samples_per_epoch"] is None


def test_torchs_own_batch_sampler_of_one_counts_samples_as_batches() -> None:
    epoch = _epoch(DataLoader(DATA, batch_sampler=BatchSampler(SequentialSampler(DATA), 1, False)))
    assert (epoch["batches_per_epoch"], epoch["samples_per_epoch"]) == (100, 100)
