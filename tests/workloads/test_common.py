"""Shared workload pieces: which dataset items make the worst-case (most expensive padded) batch."""

from __future__ import annotations

from autotune.workloads.common import longest_batch, longest_indices

FRAMES = (146, 98, 166, 155, 142, 161)
TOKENS = (5, 4, 9, 8, 10, 7)


def test_the_longest_items_make_the_batch() -> None:
    assert longest_indices(3, FRAMES) == [2, 5, 3]
    assert longest_indices(10, FRAMES) == [2, 5, 3, 0, 4, 1]  # a batch limit past the corpus takes all of it


def test_the_longest_in_a_second_length_is_swapped_in_for_the_shortest() -> None:
    chosen = longest_indices(3, FRAMES, TOKENS)
    assert chosen == [2, 5, 4]  # 4 has the most tokens; 3 (the third most frames) makes room
    assert max(FRAMES[i] for i in chosen) == max(FRAMES) and max(TOKENS[i] for i in chosen) == max(TOKENS)
    assert longest_indices(1, FRAMES, TOKENS) == [2]  # one item: the primary length wins
    assert longest_indices(3, FRAMES, FRAMES) == [2, 5, 3]  # already there: nothing swapped


def test_longest_batch_collates_the_items() -> None:
    items = [f"item{i}" for i in range(len(FRAMES))]
    assert longest_batch(items, tuple, 2, FRAMES) == ("item2", "item5")
