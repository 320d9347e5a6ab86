"""What the AMP check, the device's memory and a busy machine leave of the seeds: a seed whose precision or compile
mode the check rejected never runs, a seed out of memory is tried again with checkpointing or at half its batch, a seed
that trains on every core of a busy machine trains on the cores the others left, and nothing queued is measured twice.

These are the rules alone, one home each; the tuner (tuner.py) calls them with its state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from autotune.knobs.checkpointing import KNOB as CHECKPOINTING
from autotune.knobs.compile_modes import OFF, check_label
from autotune.knobs.config import TrialConfig
from autotune.search.candidates import TrialRecord, config_key, config_params
from autotune.space.fit import smaller_batch
from autotune.space.search_space import SearchSpace

__all__ = ["THREADS", "rejected_reason", "admissible", "backed_off", "measured_before", "on_free_cores"]

THREADS = "intra_op_threads"


def rejected_reason(rejected: Mapping[str, str], config: TrialConfig) -> str | None:
    """Why the AMP check rejected this configuration's precision or compile mode (labels by compile_modes.check_label);
    None if it did not: such a trial is recorded as status "precision" without being launched."""
    return rejected.get(config.precision) or rejected.get(check_label(config.compile))


def measured_before(records: Iterable[TrialRecord], config: TrialConfig) -> TrialRecord | None:
    """This run's first measurement of the configuration, if any: a queued point (a seed, a previous winner that is
    the recipe's own configuration, a backed-off retry) is not measured twice."""
    key = config_key(config)
    return next((record for record in records if record.key == key), None)


def admissible(seeds: Iterable[Mapping[str, Any]], rejected: Mapping[str, str]) -> list[dict[str, Any]]:
    """The seeds whose precision and compile mode the AMP check did not reject."""
    return [
        dict(seed)
        for seed in seeds
        if seed.get("precision") not in rejected and check_label(seed.get("compile", OFF)) not in rejected
    ]


def on_free_cores(
    seeds: Iterable[Mapping[str, Any]], space: SearchSpace, free_cores: int | None
) -> list[dict[str, Any]]:
    """On a busy machine (free_cores: the cores a rank's share of the machine has left, run/preflight.py adapt), the
    seeds that train on every core the space offers train on the free ones instead; None: the seeds as written."""
    searched = next((param for param in space.params if param.name == THREADS), None)
    if free_cores is None or searched is None:
        return [dict(seed) for seed in seeds]
    every, least = searched.distribution.high, searched.distribution.low  # type: ignore[attr-defined]
    threads = max(least, min(free_cores, every))
    return [{**seed, THREADS: threads} if seed.get(THREADS) == every else dict(seed) for seed in seeds]


def backed_off(space: SearchSpace, record: TrialRecord) -> dict[str, Any] | None:
    """A seed that did not fit the device's memory is tried next at half its batch (as Lightning's batch-size finder
    backs off): seeds are written for large GPUs; on a smaller one their other settings are still a good guess.
    Where the space searches activation checkpointing and the seed ran without it, the same batch with it comes
    first: trading recomputation for memory is what can keep the batch (knobs/checkpointing.py). None: nothing to
    retry."""
    if record.role != "seed" or record.result.status not in ("oom", "headroom"):
        return None
    point = config_params(record.config, space)
    return checkpointed_instead(space, point) or smaller_batch(space, point)


def checkpointed_instead(space: SearchSpace, point: dict[str, Any]) -> dict[str, Any] | None:
    """The point with checkpointing on, for one that ran out of memory without it; None where the space does not
    search the knob or the point already checkpointed (or runs the recipe's own, unset)."""
    searched = next((param for param in space.params if param.name == CHECKPOINTING), None)
    if searched is None or point.get(CHECKPOINTING) is not False or True not in searched.distribution.choices:  # type: ignore[attr-defined]
        return None
    return {**point, CHECKPOINTING: True}
