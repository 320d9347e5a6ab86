"""Per-length-bucket batches: the plan's boundaries and sizes, the sampler's epochs, and the same batches as WeNet's
and lhotse's own bucketing on the same lengths."""

from __future__ import annotations

import collections
import json
import random

import pytest

from autotune.data.buckets import BucketBatchSampler, BucketPlan, bucket_of, equal_frame_boundaries, plan_buckets
from tests.exports.common import RECIPES

_RNG = random.Random(0)
FRAMES = [_RNG.randint(100, 1500) for _ in range(200)]
PLAN = plan_buckets(FRAMES, num_buckets=8, max_frames_in_batch=12000, scaling=1.5)


def _items(batches: list[list[int]]) -> list[int]:
    return sorted(index for batch in batches for index in batch)


def test_sizes_follow_the_budget_and_the_exponent() -> None:
    flat = plan_buckets(FRAMES, num_buckets=8, max_frames_in_batch=12000, scaling=1.0)
    # exponent 1: WeNet's dynamic budget in every bucket (padded frames of each bucket's longest batch within it)
    pairs = zip(flat.batch_sizes, flat.longest, strict=True)
    assert all(n * longest <= 12000 < (n + 1) * longest for n, longest in pairs)
    square = plan_buckets(FRAMES, num_buckets=8, max_frames_in_batch=12000, scaling=2.0)
    # exponent 2: each bucket's batch holds about the attention memory (n * L^2) of the longest bucket's
    top = square.batch_sizes[-1] * square.longest[-1] ** 2
    pairs = zip(square.batch_sizes, square.longest, strict=True)
    assert all(0.8 * top <= n * longest**2 <= 1.25 * top for n, longest in pairs)
    assert square.batch_sizes[0] > PLAN.batch_sizes[0] > flat.batch_sizes[0] and flat.batch_sizes[-1] == 12000 // 1500
    assert len(PLAN.boundaries) == 7 and all(bucket_of(f, PLAN.boundaries) < 8 for f in FRAMES)
    assert BucketPlan.from_dict(PLAN.to_dict()) == PLAN


def test_bad_plans_are_refused() -> None:
    with pytest.raises(ValueError, match="one batch size >= 1 per bucket"):
        BucketPlan(boundaries=(10,), batch_sizes=(4,))
    with pytest.raises(ValueError, match="increase"):
        BucketPlan(boundaries=(10, 5), batch_sizes=(4, 2, 1))
    with pytest.raises(ValueError, match="bucket_scaling"):
        plan_buckets(FRAMES, num_buckets=4, max_frames_in_batch=1000, scaling=9.0)


def test_few_distinct_lengths_make_no_empty_bucket() -> None:
    plan = plan_buckets([300] * 50 + [900] * 5, num_buckets=8, max_frames_in_batch=3000, scaling=1.0)
    assert plan.boundaries == (900,) and plan.batch_sizes == (10, 3)


def test_every_item_once_per_epoch_shuffled_and_deterministic() -> None:
    sampler = BucketBatchSampler(FRAMES, PLAN, seed=3)
    first = list(sampler)
    assert _items(first) == list(range(200)) and len(sampler) == len(first)
    assert all(len({bucket_of(FRAMES[i], PLAN.boundaries) for i in batch}) == 1 for batch in first)
    assert list(BucketBatchSampler(FRAMES, PLAN, seed=3)) == first  # the seed decides the epoch
    sampler.set_epoch(1)
    second = list(sampler)
    assert _items(second) == list(range(200)) and second != first  # a fresh shuffle each epoch
    assert list(BucketBatchSampler(FRAMES, PLAN, seed=4)) != first
    again = BucketBatchSampler(FRAMES, PLAN, seed=3)
    assert list(again) == first and list(again) == second  # without set_epoch each pass draws the next epoch


@pytest.mark.parametrize("world_size", [2, 3, 7])
def test_ranks_get_the_same_number_of_batches_and_each_item_once(world_size: int) -> None:
    ranks = range(world_size)
    per_rank = [list(BucketBatchSampler(FRAMES, PLAN, seed=1, rank=r, world_size=world_size)) for r in ranks]
    assert len({len(batches) for batches in per_rank}) == 1  # no rank waits at the epoch's end
    assert _items([batch for batches in per_rank for batch in batches]) == list(range(200))
    assert all(len(batch) <= max(PLAN.batch_sizes) for batches in per_rank for batch in batches)


def test_fewer_items_than_ranks_repeat_as_distributed_sampler_pads() -> None:
    plan = BucketPlan(boundaries=(), batch_sizes=(4,))
    per_rank = [list(BucketBatchSampler([10], plan, rank=r, world_size=3)) for r in range(3)]
    assert per_rank == [[[0]], [[0]], [[0]]]


def test_batches_are_wenets_bucket_batches_on_the_same_order() -> None:
    """WeNet's batch_type bucket (BucketBySequenceLengthDataPipe, run at the recorded commit on this plan's
    bucket_boundaries and bucket_batch_sizes, over the items in the order our epoch draws them) forms the same
    batches: ours only shuffle their order."""
    recorded = json.loads((RECIPES / "wenet_bucket_batches.json").read_text())
    assert recorded["source"]["commit"].startswith("0154699")
    frames = recorded["frames"]
    plan = plan_buckets(frames, num_buckets=6, max_frames_in_batch=16000, scaling=1.5)
    conf = recorded["batch_conf"]
    assert (list(plan.boundaries), list(plan.batch_sizes)) == (conf["bucket_boundaries"], conf["bucket_batch_sizes"])
    sampler = BucketBatchSampler(frames, plan, seed=recorded["seed"])
    sampler.set_epoch(recorded["epoch"])
    assert sorted(map(tuple, sampler)) == sorted(map(tuple, recorded["batches"]))


def test_boundaries_and_batches_are_lhotses() -> None:
    """lhotse's estimate_duration_buckets gives the same boundaries; its DynamicBucketingSampler with a fixed batch
    size per bucket (NeMo's OOMptimizer output) forms the same kind of batches: one bucket each, the same number
    of batches of each size per bucket, every item once."""
    lhotse = pytest.importorskip("lhotse")
    from lhotse.dataset.sampling.dynamic_bucketing import (
        DynamicBucketingSampler,
        FixedBucketBatchSizeConstraint,
        estimate_duration_buckets,
    )
    from lhotse.testing.dummies import dummy_cut

    assert lhotse.__version__.startswith("1.33")
    cuts = lhotse.CutSet.from_cuts(dummy_cut(i, duration=f / 100) for i, f in enumerate(FRAMES))
    bins = estimate_duration_buckets(cuts, num_buckets=8)
    assert [round(b * 100) for b in bins] == equal_frame_boundaries(FRAMES, 8) == list(PLAN.boundaries)
    # lhotse's constraint buckets are upper bounds (length <= bin): our `length < boundary` is `<= boundary - 0.5`
    upper = [(b - 0.5) / 100 for b in PLAN.boundaries] + [max(FRAMES) / 100]
    constraint = FixedBucketBatchSizeConstraint(max_seq_len_buckets=upper, batch_sizes=list(PLAN.batch_sizes))
    with pytest.warns(UserWarning, match="eagerly read CutSet"):
        sampler = DynamicBucketingSampler(cuts, constraint=constraint, duration_bins=upper, shuffle=True, seed=0)
    ids = {cut.id: index for index, cut in enumerate(cuts)}
    theirs = [[ids[cut.id] for cut in batch] for batch in sampler]
    ours = list(BucketBatchSampler(FRAMES, PLAN, seed=0))

    def kinds(batches: list[list[int]]) -> collections.Counter[tuple[int, int]]:
        assert all(len({bucket_of(FRAMES[i], PLAN.boundaries) for i in batch}) == 1 for batch in batches)
        return collections.Counter((bucket_of(FRAMES[batch[0]], PLAN.boundaries), len(batch)) for batch in batches)

    assert _items(theirs) == _items(ours) == list(range(200))
    assert kinds(theirs) == kinds(ours)
