"""What the AMP check and the device's memory leave of the seeds: a seed whose precision or compile mode the check
rejected never runs, a seed out of memory is tried again with checkpointing or at half its batch, and nothing queued
is measured twice.

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

__all__ = ["rejected_reason", "admissible", "backed_off", "measured_before"]


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
