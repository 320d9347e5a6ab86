"""A space's knobs checked against what the workload's pipeline can run, before any trial: feature placements it
has, activation checkpointing only where its framework has the switch (knobs/feature_device.py,
knobs/checkpointing.py say why)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import MISSING, fields
from typing import TYPE_CHECKING

from autotune.errors import SpaceError
from autotune.knobs.checkpointing import KNOB as CHECKPOINTING
from autotune.knobs.config import TrialConfig
from autotune.knobs.feature_device import KNOB as FEATURE_DEVICE

if TYPE_CHECKING:
    from autotune.space.search_space import SearchSpace

__all__ = ["REQUIRED_KNOBS", "check_checkpointing", "check_complete", "check_feature_device", "feature_device_values"]


# The TrialConfig fields without a default (per_device_batch_size): every configuration a run measures needs one.
REQUIRED_KNOBS = tuple(
    item.name for item in fields(TrialConfig) if item.default is MISSING and item.default_factory is MISSING
)


def check_complete(space: SearchSpace, origin: str) -> None:
    """Refuse, before any trial, a space that neither searches nor fixes a knob every configuration needs.

    Raises:
        SpaceError: one line naming the knob.
    """
    for name in REQUIRED_KNOBS:
        if name not in space.fixed and all(param.name != name for param in space.params):
            raise SpaceError(
                f"{origin}: the space neither searches nor fixes {name}, which every configuration needs; add it "
                "under params (or fixed)"
            )


def feature_device_values(space: SearchSpace) -> set[str]:
    """Every feature_device value a loaded space can hand a trial: its choices, fixed value, baseline and seeds."""
    values: set[str | None] = set()
    for param in space.params:
        if param.name == FEATURE_DEVICE:
            values.update(getattr(param.distribution, "choices", ()))
    for mapping in (space.fixed, space.baseline, *space.seeds):
        values.add(mapping.get(FEATURE_DEVICE))
    return {value for value in values if value is not None}


def check_feature_device(space: SearchSpace, workload: str, supported: Iterable[str], origin: str) -> None:
    """Refuse, before any trial, a space naming a placement the workload's pipeline cannot run.

    Raises:
        SpaceError: one line naming the value, the workload and what it can run.
    """
    supported = tuple(supported)
    unknown = sorted(str(value) for value in feature_device_values(space) if value not in supported)
    if not unknown:
        return
    if not supported:
        raise SpaceError(
            f"{origin}: {FEATURE_DEVICE} {unknown[0]!r}: {workload} has no feature placement to choose (see "
            "autotune/knobs/feature_device.py); remove feature_device from the space"
        )
    raise SpaceError(
        f"{origin}: {FEATURE_DEVICE} {unknown[0]!r} is not a placement {workload} can run; "
        f"it runs {', '.join(supported)}"
    )


def _named(space: SearchSpace) -> bool:
    searched = any(param.name == CHECKPOINTING for param in space.params)
    return searched or space.fixed.get(CHECKPOINTING) is not None


def check_checkpointing(space: SearchSpace, workload: str, has_switch: bool, origin: str) -> None:
    """Refuse, in one line, a space that names the knob for a workload that has no faithful switch for it, or that
    searches it without saying the recipe's value in its baseline.

    The baseline must be the recipe as it trains, and the space loader cannot know it (CAM++'s recipe checkpoints,
    the conformer's does not): without a value it would take the distribution's first choice, and the speedup would be
    measured against a configuration the recipe never runs.

    Raises:
        SpaceError: either of the above.
    """
    if not has_switch and _named(space):
        raise SpaceError(
            f"{origin}: activation_checkpointing does not apply to {workload} (only where its framework has the "
            "switch: cam++'s memory_efficient, the conformer's gradient_checkpointing); remove it from the space"
        )
    searched = any(param.name == CHECKPOINTING for param in space.params)
    device_baseline = (space.source.get(space.device_type) or {}).get("baseline") or {}
    if searched and CHECKPOINTING not in (space.source.get("baseline") or {}) and CHECKPOINTING not in device_baseline:
        raise SpaceError(
            f"{origin}: the space searches activation_checkpointing but its baseline does not say the recipe's value: "
            "add it under baseline (cam++'s recipe: true, memory_efficient; the conformer's: false)"
        )
