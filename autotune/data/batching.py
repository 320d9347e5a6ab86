"""Length-sorted batching as WeNet's dataset pipeline: shuffle, sort within windows, then static or dynamic batches.

WeNet (``wenet/dataset/dataset.py``) shuffles (shuffle_size 1500), sorts windows of sort_size (500) utterances by
frame count, and batches the sorted stream: ``static`` takes batch_size consecutive items, ``dynamic`` packs items
while the padded batch (longest item x count) stays within ``max_frames_in_batch`` (``DynamicBatchWindow``). Sorting
keeps padding small, which is much of why a static batch of 16 costs what it costs; a plain random batch would pad
far more. Here the stream is a fresh permutation per epoch, sorted per window: one epoch (``num_batches=None``; the
trial cycles epochs itself) or as many batches as asked, over every item or over one rank's share (``indices``).
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
        num_batches: batches to yield (``len``), the stream running over as many epochs as that takes; None = exactly
            one epoch (one pass over ``indices``, the last batch kept even when short, as WeNet keeps it).
        generator: seeds the per-epoch permutations.
        batch_size: static batching: items per batch.
        max_frames_in_batch: dynamic batching: the padded-frame budget of a batch. An item longer than the budget
            on its own forms a batch alone, as in WeNet.
        sort_size: items sorted together (WeNet's sort_conf.sort_size).
        indices: the dataset indices to draw from (one rank's share under data parallelism); default every item.
    """

    def __init__(
        self,
        frames: Sequence[int],
        *,
        num_batches: int | None,
        generator: torch.Generator,
        batch_size: int | None = None,
        max_frames_in_batch: int | None = None,
        sort_size: int = 500,
        indices: Sequence[int] | None = None,
    ) -> None:
        if (batch_size is None) == (max_frames_in_batch is None):
            raise ValueError("give exactly one of batch_size (static) and max_frames_in_batch (dynamic)")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_frames_in_batch is not None and max_frames_in_batch < 1:
            raise ValueError(f"max_frames_in_batch must be >= 1, got {max_frames_in_batch}")
        self.indices = tuple(range(len(frames))) if indices is None else tuple(indices)
        if not self.indices or sort_size < 1:
            raise ValueError("need at least one item and sort_size >= 1")
        self.frames = tuple(frames)
        self.num_batches = num_batches
        self.generator = generator
        self.batch_size = batch_size
        self.max_frames_in_batch = max_frames_in_batch
        self.sort_size = sort_size

    def __len__(self) -> int:
        if self.num_batches is not None:
            return self.num_batches
        if self.batch_size is not None:
            return -(-len(self.indices) // self.batch_size)
        raise TypeError("a dynamic batch epoch has no length before it is packed")

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._static() if self.batch_size is not None else self._dynamic()
        return itertools.islice(batches, self.num_batches) if self.num_batches is not None else batches

    def _stream(self) -> Iterator[int]:
        """Indices: each epoch a permutation, sorted by frames within windows of sort_size; endless unless one epoch."""
        while True:
            order = torch.randperm(len(self.indices), generator=self.generator).tolist()
            for start in range(0, len(order), self.sort_size):
                window = [self.indices[position] for position in order[start : start + self.sort_size]]
                yield from sorted(window, key=self.frames.__getitem__)
            if self.num_batches is None:
                return

    def _static(self) -> Iterator[list[int]]:
        stream = self._stream()
        assert self.batch_size is not None
        while batch := list(itertools.islice(stream, self.batch_size)):
            yield batch

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
        if batch:
            yield batch
