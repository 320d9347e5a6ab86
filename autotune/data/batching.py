"""Length-sorted batching as WeNet's dataset pipeline: shuffle, sort within windows, then static or dynamic batches.

WeNet (``wenet/dataset/dataset.py``) shuffles (shuffle_size 1500), sorts windows of sort_size (500) utterances by
frame count, and batches the sorted stream: ``static`` takes batch_size consecutive items, ``dynamic`` packs items
while the padded batch (longest item x count) stays within ``max_frames_in_batch`` (``DynamicBatchWindow``). Sorting
keeps padding small, which is much of why a static batch of 16 costs what it costs; a plain random batch would pad
far more. Here the stream is a fresh permutation per epoch, sorted per window, repeated for as many batches as a
trial needs (so even a tiny corpus fills a timed window).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import torch

__all__ = ["LengthSortedBatchSampler"]


class LengthSortedBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Batches of dataset indices from length-sorted windows of a shuffled stream.

    Args:
        frames: each item's frame count (an upper bound where augmentation changes it), indexed like the dataset.
        num_batches: batches to yield (``len``); the stream runs over as many epochs as that takes.
        generator: seeds the per-epoch permutations.
        batch_size: static batching: items per batch.
        max_frames_in_batch: dynamic batching: the padded-frame budget of a batch. An item longer than the budget
            on its own forms a batch alone, as in WeNet.
        sort_size: items sorted together (WeNet's sort_conf.sort_size).
    """

    def __init__(
        self,
        frames: Sequence[int],
        *,
        num_batches: int,
        generator: torch.Generator,
        batch_size: int | None = None,
        max_frames_in_batch: int | None = None,
        sort_size: int = 500,
    ) -> None:
        if (batch_size is None) == (max_frames_in_batch is None):
            raise ValueError("give exactly one of batch_size (static) and max_frames_in_batch (dynamic)")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_frames_in_batch is not None and max_frames_in_batch < 1:
            raise ValueError(f"max_frames_in_batch must be >= 1, got {max_frames_in_batch}")
        if not frames or sort_size < 1:
            raise ValueError("need at least one item and sort_size >= 1")
        self.frames = tuple(frames)
        self.num_batches = num_batches
        self.generator = generator
        self.batch_size = batch_size
        self.max_frames_in_batch = max_frames_in_batch
        self.sort_size = sort_size

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._static() if self.batch_size is not None else self._dynamic()
        return itertools.islice(batches, self.num_batches)

    def _stream(self) -> Iterator[int]:
        """Endless indices: each epoch a permutation, sorted by frames within windows of sort_size."""
        while True:
            order = torch.randperm(len(self.frames), generator=self.generator).tolist()
            for start in range(0, len(order), self.sort_size):
                yield from sorted(order[start : start + self.sort_size], key=self.frames.__getitem__)

    def _static(self) -> Iterator[list[int]]:
        stream = self._stream()
        assert self.batch_size is not None
        while True:
            yield list(itertools.islice(stream, self.batch_size))

    def _dynamic(self) -> Iterator[list[int]]:
        assert self.max_frames_in_batch is not None
        batch: list[int] = []
        longest = 0
        for index in self._stream():
            frames = self.frames[index]
            if batch and max(longest, frames) * (len(batch) + 1) > self.max_frames_in_batch:
                yield batch
                batch, longest = [], 0
            batch.append(index)
            longest = max(longest, frames)
