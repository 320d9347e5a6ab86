"""Per-length-bucket batch sizes: duration buckets from the data, each with its own batch size (batch_type bucket).

Dynamic batching (batching.py) packs every batch to one padded-frame budget, sized for the longest utterances. A
short utterance's batch could hold far more: attention memory grows with the square of the length and the fixed
per-step cost is paid once a batch, so one budget for every length leaves the short batches small. NeMo's
OOMptimizer finds the largest batch per duration bucket (its reported gain: docs/how-it-measures.md) and lhotse's
DynamicBucketingSampler batches by it; WeNet has the same mode (batch_conf batch_type bucket, with
bucket_boundaries and bucket_batch_sizes: wenet/dataset/dataset.py, datapipes.py BucketBySequenceLengthDataPipe).

How the sizes are chosen. Searching one batch size per bucket would multiply the space by the number of buckets.
NeMo probes each bucket's longest item for the largest batch that fits (a memory search per bucket), which finds the
largest *safe* batch but not the fastest one, costs probes in every trial, and has nothing to find on a CPU (no OOM
there). Here the search keeps two numbers: the frame budget of the longest bucket (max_frames_in_batch, as dynamic
batching) and a scaling exponent `bucket_scaling` (alpha). A bucket whose longest item has L_b frames takes

    n_b = floor(budget / L_max * (L_max / L_b) ** alpha)

items: alpha 1 is WeNet's dynamic budget per bucket (padded frames constant), alpha 2 keeps n_b * L_b^2 (attention
memory) constant, so short buckets take many more items. Memory is then checked the way the OOMptimizer checks it,
in every trial: the worst-case scan (trial/worst_case.py) trains each bucket's longest items at that bucket's batch
before warm-up, so a plan whose any bucket does not fit fails at once as "oom", and the search backs off (the seeds'
halving of max_frames_in_batch halves every bucket). On a CPU the same plan is measured for throughput only.

Boundaries are the data's own: bins of equal total frames (lhotse's estimate_duration_buckets rule, checked against
lhotse's own function in tests), the bucket of an item the first boundary it is below (WeNet's and lhotse's rule).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["BucketPlan", "BucketBatchSampler", "bucket_of", "equal_frame_boundaries", "plan_buckets", "worst_batches"]

SEED_STRIDE = 1_000_003  # the epoch's generator seed is seed * SEED_STRIDE + epoch, as trial/sampling.py seeds it


def equal_frame_boundaries(frames: Sequence[int], num_buckets: int) -> list[int]:
    """At most num_buckets - 1 boundaries splitting the lengths into bins of about equal total frames.

    Walking the sorted lengths, a new bucket starts at the first length after the running total passed an equal
    share (lhotse's estimate_duration_buckets rule), except that repeated lengths never leave a bucket empty (lhotse
    then repeats the boundary). Bucket i holds the
    lengths below boundaries[i] and at or above boundaries[i - 1].
    """
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
    ordered = sorted(frames)
    share = sum(ordered) / num_buckets
    boundaries: list[int] = []
    total = 0
    for length in ordered:
        if total > share and length > (boundaries[-1] if boundaries else ordered[0]):  # no bucket left empty
            boundaries.append(length)
            total = 0
        total += length
    return boundaries[: num_buckets - 1]


def bucket_of(length: int, boundaries: Sequence[int]) -> int:
    """The bucket index of a length: the first boundary it is below (the last bucket holds the rest)."""
    return bisect.bisect_right(boundaries, length)


@dataclass(frozen=True, kw_only=True, slots=True)
class BucketPlan:
    """Duration buckets and each one's batch size: what the result records and the exports hand over.

    Attributes:
        boundaries: frame counts where each next bucket starts (WeNet's bucket_boundaries, len(batch_sizes) - 1).
        batch_sizes: items per batch in each bucket (WeNet's bucket_batch_sizes).
        longest: the longest item of each bucket in the data the plan was made from (frames).
    """

    boundaries: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    longest: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.batch_sizes) != len(self.boundaries) + 1 or min(self.batch_sizes, default=0) < 1:
            raise ValueError(
                f"a bucket plan needs one batch size >= 1 per bucket ({len(self.boundaries) + 1}), got "
                f"{list(self.batch_sizes)}"
            )
        if list(self.boundaries) != sorted(set(self.boundaries)):
            raise ValueError(f"bucket boundaries must increase, got {list(self.boundaries)}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "bucket_boundaries": list(self.boundaries),
            "bucket_batch_sizes": list(self.batch_sizes),
            "bucket_longest_frames": list(self.longest),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BucketPlan:
        return cls(
            boundaries=tuple(int(b) for b in data["bucket_boundaries"]),
            batch_sizes=tuple(int(n) for n in data["bucket_batch_sizes"]),
            longest=tuple(int(n) for n in data.get("bucket_longest_frames") or ()),
        )


def plan_buckets(frames: Sequence[int], *, num_buckets: int, max_frames_in_batch: int, scaling: float) -> BucketPlan:
    """The buckets of these lengths and each one's batch: n_b = budget / L_max * (L_max / L_b) ** scaling (module
    docstring), at least one item.

    Raises:
        ValueError: no lengths, a budget below one frame, or a scaling outside [0, 4].
    """
    if not frames:
        raise ValueError("need at least one item to make buckets")
    if max_frames_in_batch < 1:
        raise ValueError(f"max_frames_in_batch must be >= 1, got {max_frames_in_batch}")
    if not 0.0 <= scaling <= 4.0:
        raise ValueError(f"bucket_scaling must be within 0..4, got {scaling}")
    boundaries = equal_frame_boundaries(frames, num_buckets)
    longest = [0] * (len(boundaries) + 1)
    for length in frames:
        bucket = bucket_of(length, boundaries)
        longest[bucket] = max(longest[bucket], length)
    top = max(longest)
    sizes = [max(1, math.floor(max_frames_in_batch / top * (top / max(length, 1)) ** scaling)) for length in longest]
    return BucketPlan(boundaries=tuple(boundaries), batch_sizes=tuple(sizes), longest=tuple(longest))


def worst_batches(frames: Sequence[int], plan: BucketPlan) -> list[list[int]]:
    """Each bucket's costliest batch, longest bucket first: its batch size of its longest items (its longest item
    repeated where the bucket has fewer), the probe NeMo's OOMptimizer runs per bucket."""
    members: list[list[int]] = [[] for _ in plan.batch_sizes]
    for index, length in enumerate(frames):
        members[bucket_of(length, plan.boundaries)].append(index)
    batches = []
    for bucket, size in reversed(list(zip(members, plan.batch_sizes, strict=True))):
        if bucket:
            longest = sorted(bucket, key=lambda index: -frames[index])[:size]
            batches.append(longest + [longest[0]] * (size - len(longest)))
    return batches


class BucketBatchSampler(torch.utils.data.Sampler[list[int]]):
    """One epoch of length-bucketed batches, shuffled per epoch, each rank its share of whole batches.

    Each epoch: a seeded permutation of the items; each item to its bucket; each bucket cut into batches of its
    size in that order (its last batch short); all batches shuffled together. Every rank forms the same batches
    (the generator is the same on every rank) and takes every world_size-th: the same number of batches on every
    rank, so no rank waits at the end of an epoch. Where the batch count does not divide by world_size, the largest
    trailing batches are split in two until it does, so every item is still trained exactly once per epoch (an item
    is repeated only when an epoch has fewer items than ranks, as DistributedSampler pads).

    Args:
        frames: each item's length (frames), indexed like the dataset.
        plan: the buckets and their batch sizes (plan_buckets, or a result's batch section).
        seed: the epochs' seed; set_epoch(e) picks the epoch, as DistributedSampler (each pass moves on to the next).
        rank, world_size: this process and the ranks; default torch.distributed's where initialised, else 0 and 1.
        generator: draw this epoch from it instead of (seed, epoch) (a trial's per-epoch generator).
        indices: the dataset indices to batch (default every item).
    """

    def __init__(
        self,
        frames: Sequence[int],
        plan: BucketPlan,
        *,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        generator: torch.Generator | None = None,
        indices: Sequence[int] | None = None,
    ) -> None:
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if world_size is None:
            world_size = torch.distributed.get_world_size() if distributed else 1
        if rank is None:
            rank = torch.distributed.get_rank() if distributed else 0
        self.rank, self.world_size = rank, world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not within world_size {self.world_size}")
        self.frames = tuple(frames)
        self.indices = tuple(range(len(self.frames))) if indices is None else tuple(indices)
        if not self.indices:
            raise ValueError("need at least one item")
        self.plan, self.seed, self.epoch, self.generator = plan, seed, 0, generator

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self._epoch_batches(self._generator())) // self.world_size

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._epoch_batches(self._generator())[self.rank :: self.world_size]
        # The next pass draws the next epoch unless set_epoch says otherwise: Lightning calls set_epoch only on a
        # batch sampler's inner sampler, and a loop that never calls it must not repeat one epoch's order forever.
        self.epoch += 1
        yield from batches

    def _generator(self) -> torch.Generator:
        if self.generator is not None:  # len() and iter() must draw the same epoch: copy the state, not the object
            copy = torch.Generator()
            copy.set_state(self.generator.get_state())
            return copy
        return torch.Generator().manual_seed(self.seed * SEED_STRIDE + self.epoch)

    def _epoch_batches(self, generator: torch.Generator) -> list[list[int]]:
        """Every rank's batches of this epoch, in order, their count a multiple of world_size."""
        order = torch.randperm(len(self.indices), generator=generator).tolist()
        buckets: list[list[int]] = [[] for _ in self.plan.batch_sizes]
        for position in order:
            index = self.indices[position]
            buckets[bucket_of(self.frames[index], self.plan.boundaries)].append(index)
        batches = [
            bucket[start : start + size]
            for bucket, size in zip(buckets, self.plan.batch_sizes, strict=True)
            for start in range(0, len(bucket), size)
        ]
        shuffled = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
        return _even_out(shuffled, self.world_size)


def _even_out(batches: list[list[int]], world_size: int) -> list[list[int]]:
    """The batches, their count made a multiple of world_size: the largest of the last round split in two (each
    item still once), or, with too few items to split, the first batches repeated (DistributedSampler's padding)."""
    batches, padded = list(batches), 0
    while len(batches) % world_size:
        tail_start = len(batches) - len(batches) % world_size
        splittable = [i for i in range(tail_start, len(batches)) if len(batches[i]) > 1]
        if not splittable:
            batches.append(list(batches[padded]))
            padded += 1
            continue
        largest = max(splittable, key=lambda i: len(batches[i]))
        batch = batches.pop(largest)
        half = (len(batch) + 1) // 2
        batches[largest:largest] = [batch[:half], batch[half:]]
    return batches
