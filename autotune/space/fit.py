"""Fitting values into one machine's search space: the recipe's baseline, seeds, `auto` and the global batch.

`autotune.space.search_space` parses a space file into distributions; this module decides which concrete values a run
starts from on this machine. A recipe written for other hardware may name a value the machine does not offer (bf16 on an
old GPU, 16 workers on 8 cores): it is moved to the nearest offered value, with a note saying so, rather than rejected.
Seeds name preference lists (`[bf16, fp32]`: the first this machine offers), `auto` is one rank's share of the
cores, and with several devices the recipe's batch becomes one device's share of it.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import optuna.distributions as od

from autotune.errors import SpaceError
from autotune.knobs import length_batching
from autotune.knobs.declarations import TORCH_DEFAULTS
from autotune.knobs.precision import TORCH_DEFAULT_FP32

if TYPE_CHECKING:
    from autotune.machine.hardware import Hardware
    from autotune.space.params import Param
    from autotune.space.search_space import SearchSpace

__all__ = [
    "RECIPE_BATCH",
    "adapt_baseline",
    "baseline_per_device",
    "contains",
    "fit_global_batch",
    "fit_seeds",
    "resolve_auto",
    "smaller_batch",
]

RECIPE_BATCH = ("per_device", "global")
# Knobs that size a device's batch: in samples, or in frames (WeNet's dynamic batches); the first that applies counts.
BATCH_KNOBS = ("per_device_batch_size", length_batching.FRAMES_KNOB)


def contains(distribution: od.BaseDistribution, value: Any) -> bool:
    """Whether a distribution can produce this value."""
    if isinstance(distribution, od.CategoricalDistribution):
        return any(type(value) is type(choice) and value == choice for choice in distribution.choices)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if not distribution.low <= value <= distribution.high:  # type: ignore[attr-defined]
        return False
    if isinstance(distribution, od.IntDistribution):
        return isinstance(value, int) and (value - distribution.low) % distribution.step == 0
    return True


def resolve_auto(value: Any, hardware: Hardware) -> Any:
    """`auto` as the CPU cores one rank may use (`hardware` already holds one rank's share); other values as given."""
    return hardware.cpu_cores if value == "auto" else value


def fit_seeds(
    entries: list[dict[str, Any]], space: SearchSpace, baseline: dict[str, Any], hardware: Hardware
) -> tuple[dict[str, Any], ...]:
    """Seeds as points of this machine's space: `auto` resolved, a list value taken as an order of preference (the
    first this machine offers), values fitted to the nearest allowed one; duplicates and the baseline dropped.

    Args:
        entries: the space file's seeds, already checked to name known knobs.
        space: this machine's space (its baseline not yet set).
        baseline: the fitted baseline, which a seed would only measure again.
        hardware: one rank's share of the machine, for `auto`.
    """
    distributions = {param.name: param.distribution for param in space.params}
    seeds: list[dict[str, Any]] = []
    for entry in entries:
        wanted: dict[str, Any] = {}
        for name, value in entry.items():
            choices = value if isinstance(value, list) else [value]
            choices = [resolve_auto(choice, hardware) for choice in choices]
            offered = [c for c in choices if name not in distributions or contains(distributions[name], c)]
            wanted[name] = (offered or choices)[0]
        point, _ = adapt_baseline(space, wanted)
        if point != baseline and point not in seeds:
            seeds.append(point)
    return tuple(seeds)


def smaller_batch(space: SearchSpace, point: dict[str, Any]) -> dict[str, Any] | None:
    """The point with its batch halved (the largest value the space offers at or below half), for a configuration
    that ran out of the device's memory; None when the space offers nothing smaller or the point has no batch knob."""
    for param in space.params:
        if param.name not in BATCH_KNOBS or param.name not in point or not param.applies(point, space.device_type):
            continue
        dist = param.distribution
        if isinstance(dist, od.CategoricalDistribution):
            offered = [c for c in dist.choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
        elif isinstance(dist, od.IntDistribution) and not dist.log:
            offered = list(range(dist.low, dist.high + 1, dist.step))
        else:
            offered = [value for value in (point[param.name] // 2,) if contains(dist, value)]
        smaller = [value for value in offered if value <= point[param.name] / 2]
        return {**point, param.name: max(smaller)} if smaller else None
    return None


def fit_global_batch(param: Param, global_batch_size: int, world_size: int, origin: str) -> Param:
    """Keep only per-device batches b with b x world_size dividing the global batch (the rest is accumulation)."""
    if param.name != "per_device_batch_size":
        return param
    dist = param.distribution
    if isinstance(dist, od.CategoricalDistribution):
        candidates = list(dist.choices)
        offered = str(candidates)
    else:  # a range may be huge (1..10**12): only divisors of the global batch can qualify, so list those
        candidates = [b for b in _divisors(global_batch_size) if contains(dist, b)]
        offered = f"{dist.low}..{dist.high}"  # type: ignore[attr-defined]
    valid = [b for b in candidates if isinstance(b, int) and global_batch_size % (b * world_size) == 0]
    if not valid:
        raise SpaceError(
            f"{origin}: no per_device_batch_size in the space ({offered}) times {world_size} device(s) divides "
            f"--global-batch {global_batch_size}; choose a global batch that is a multiple of one of them"
        )
    return replace(param, distribution=od.CategoricalDistribution(valid))


def _divisors(number: int) -> list[int]:
    """The divisors of a positive integer, ascending, in O(sqrt(number))."""
    small = [d for d in range(1, math.isqrt(number) + 1) if number % d == 0]
    return sorted({*small, *(number // d for d in small)})


def baseline_per_device(
    baseline: dict[str, Any],
    recipe_batch: Any,
    world_size: int,
    global_batch_size: int | None,
    origin: str,
    *,
    accumulates: bool = False,
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The recipe's batch as one device's share: of --global-batch when given, of a global recipe batch otherwise.

    A recipe that accumulates gradients (`accumulates`) keeps its own per-device batch under --global-batch when that
    batch times the devices divides it: the rest is accumulation, as the recipe makes up its global batch.
    """
    if recipe_batch not in RECIPE_BATCH:
        raise SpaceError(f"{origin}: recipe_batch must be one of {list(RECIPE_BATCH)}, got {recipe_batch!r}")
    recipe = baseline.get("per_device_batch_size")
    if recipe is None:
        return baseline, ()
    if global_batch_size is not None and accumulates and global_batch_size % (recipe * world_size) == 0:
        steps = global_batch_size // (recipe * world_size)
        return baseline, (
            f"per_device_batch_size: the recipe's {recipe} kept; --global-batch {global_batch_size} over "
            f"{world_size} device(s) -> {steps} accumulation step(s)",
        )
    if global_batch_size is not None:
        share = max(1, global_batch_size // world_size)
        note = f"per_device_batch_size: --global-batch {global_batch_size} over {world_size} device(s) -> {share}"
    elif recipe_batch == "global" and world_size > 1:
        share = max(1, recipe // world_size)
        note = f"per_device_batch_size: the recipe's global batch {recipe} over {world_size} devices -> {share}"
    else:
        return baseline, ()
    return {**baseline, "per_device_batch_size": share}, (note,)


def adapt_baseline(space: SearchSpace, recipe: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Fit the recipe's configuration into this machine's space, saying what had to change and why.

    Knobs the recipe does not set get what an untouched training script gets, so that the sampler never picks
    them for the baseline.
    """
    baseline: dict[str, Any] = {}
    notes: list[str] = []
    for param in space.params:
        if not param.applies(baseline, space.device_type):
            continue
        wanted = recipe.get(param.name)
        if wanted is None:  # a recipe that sets no precision runs torch's defaults
            default = TORCH_DEFAULTS.get(param.name, getattr(param.distribution, "high", None))
            wanted = default if param.name != "precision" else TORCH_DEFAULT_FP32
        if not isinstance(param.distribution, od.CategoricalDistribution) and (
            isinstance(wanted, bool) or not isinstance(wanted, (int, float))
        ):
            raise SpaceError(
                f"{param.name}: {wanted!r} in the baseline or a seed is not a number, but the space searches it"
            )
        value = _nearest(param.distribution, wanted)
        if param.name in recipe and value != wanted and not _same_maths(param.name, wanted, value):
            notes.append(f"{param.name}: recipe {wanted!r} -> {value!r} (outside this machine's space)")
        baseline[param.name] = value
    searched = {param.name for param in space.params}
    for name in recipe:
        if name not in searched and name not in space.fixed:
            notes.append(f"{name}: recipe {recipe[name]!r} does not apply to this device")
    return {**space.fixed, **baseline}, tuple(notes)


def _same_maths(name: str, wanted: Any, value: Any) -> bool:
    """fp32-default is strict fp32 where the hardware has no TF32 (hardware.supported_precisions), and foreach is
    torch's default optimizer where the space leaves it out for that (optimizer_kernels.offered): no adaptation."""
    if name == "optimizer_impl":
        return {wanted, value} == {"foreach", "default"}
    return name == "precision" and {wanted, value} == {TORCH_DEFAULT_FP32, "fp32"}


def _nearest(distribution: od.BaseDistribution, wanted: Any) -> Any:
    if contains(distribution, wanted):
        return wanted
    if isinstance(distribution, od.CategoricalDistribution):
        numeric = [c for c in distribution.choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
        if numeric and isinstance(wanted, (int, float)):
            return min(numeric, key=lambda c: (abs(c - wanted), -c))
        return "fp32" if "fp32" in distribution.choices else distribution.choices[0]
    low, high = distribution.low, distribution.high  # type: ignore[attr-defined]
    if isinstance(distribution, od.IntDistribution):
        clamped = min(max(int(wanted), low), high)
        return low + (clamped - low) // distribution.step * distribution.step
    return float(min(max(wanted, low), high))
