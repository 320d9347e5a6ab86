"""Search spaces: Optuna's vocabulary in YAML, conditions as data, filtered to what this hardware supports.

A space file looks like::

    workload: cam++
    params:
      per_device_batch_size: {type: categorical, choices: [32, 64, 128, 256]}
      num_workers: {type: int, low: 0, high: auto}
      prefetch_factor: {type: int, low: 1, high: 8, when: {num_workers: {at_least: 1}}}
      precision: {type: categorical, choices: [fp32, tf32, bf16, fp16]}
    fixed: {cudnn_benchmark: true}
    baseline: {per_device_batch_size: 256, num_workers: 16, precision: fp32}
    cpu: {params: {per_device_batch_size: {type: categorical, choices: [8, 16, 32]}}}

A space may build on another (`extends: cam++`, or a shared base such as `extends: shared/core`) and say only what
differs; autotune.space.files reads the file and merges the chain (its docstring states the rules).

`high: auto` means the CPU cores one rank of a trial may use (the machine's cores divided by the devices per trial).
`recipe_batch: global` says the baseline's per_device_batch_size is the recipe's GLOBAL batch (3D-Speaker divides its
batch_size by the world size), so with several devices the baseline gets its share; the default `per_device` keeps
it per device (WeNet, SpeechBrain). `when` holds conditions that are data, never code: a key is
`device` or an earlier parameter; a value is a scalar (equals), a list (one of), or a mapping with `at_least`,
`at_most`, `equals` or `one_of`. `fixed` may also hold `grad_accum_steps`, the recipe's gradient accumulation
(WeNet's accum_grad), which every configuration keeps: the search varies how the recipe is fed, not how often it
steps (`--global-batch` replaces it with what the held global batch needs). `from_dict` is the one function from a
mapping to a SearchSpace (it reads files only for an `extends`); fitting the recipe's values (baseline, seeds,
`auto`, batches per device) into this machine's space is `autotune.space.fit`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna.distributions as od

from autotune.errors import SpaceError
from autotune.knobs.precision import TORCH_DEFAULT_FP32
from autotune.space.conditions import holds
from autotune.space.files import DEVICE_SECTIONS, SECTIONS, SPACES_DIR, read, resolve
from autotune.space.fit import adapt_baseline, baseline_per_device, fit_global_batch, fit_seeds
from autotune.space.params import (
    CORE_PARAMS,
    Param,
    build_param,
    check_fixed,
    check_name,
    check_runs_here,
    check_seeds,
    check_values,
    left_out,
    numeric_values,
)

if TYPE_CHECKING:
    import optuna

    from autotune.machine.hardware import Hardware

__all__ = ["SearchSpace", "from_dict", "load", "space_path"]

# A grid (and the configurations it enumerates) is built in memory: an int range past this is a mistake, not a grid.
MAX_GRID_VALUES = 10_000
MAX_GRID_POINTS = 100_000
_TOP_LEVEL_KEYS = set(SECTIONS)
_DEVICE_SECTION_KEYS = set(DEVICE_SECTIONS)


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpace:
    """A validated space, already filtered to one machine."""

    workload: str
    params: tuple[Param, ...]
    fixed: dict[str, Any]
    baseline: dict[str, Any]
    device_type: str
    source: dict[str, Any] = field(default_factory=dict)  # the mapping it was built from, for the result file
    baseline_notes: tuple[str, ...] = ()
    space_notes: tuple[str, ...] = ()  # values the file names that this machine's space leaves out, and why
    seeds: tuple[dict[str, Any], ...] = ()  # expert starting points measured before the sampler's own

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """Ask the trial for every knob that applies, in declaration order; fixed values fill in the rest."""
        values: dict[str, Any] = {}
        for param in self.params:
            if param.applies(values, self.device_type):
                values[param.name] = _suggest(trial, param)
        return {**self.fixed, **values}

    def grid(self) -> dict[str, list[Any]]:
        """Every value of every knob, for the grid search: finite knobs of at most MAX_GRID_VALUES values each
        (counted before anything is listed: a range of 10**12 is refused, not built)."""
        for name, count in self._value_counts().items():
            if count > MAX_GRID_VALUES:
                raise SpaceError(
                    f"parameter {name!r} has {count:,} values, too many for a grid search (at most "
                    f"{MAX_GRID_VALUES:,}); give it a step or fewer choices, or use --sampler tpe"
                )
        grid: dict[str, list[Any]] = {}
        for param in self.params:
            dist = param.distribution
            if isinstance(dist, od.CategoricalDistribution):
                grid[param.name] = list(dist.choices)
            else:
                assert isinstance(dist, od.IntDistribution)
                grid[param.name] = list(range(dist.low, dist.high + 1, dist.step))
        return grid

    def _value_counts(self) -> dict[str, int]:
        """How many values each knob takes, counted without listing them."""
        counts: dict[str, int] = {}
        for param in self.params:
            dist = param.distribution
            if isinstance(dist, od.CategoricalDistribution):
                counts[param.name] = len(dist.choices)
            elif isinstance(dist, od.IntDistribution) and not dist.log:
                counts[param.name] = (dist.high - dist.low) // dist.step + 1
            else:
                raise SpaceError(f"parameter {param.name!r} is not finite; a grid search needs choices or int steps")
        return counts

    def iter_points(self) -> Iterator[dict[str, Any]]:
        """Every distinct configuration of a finite space, as suggest() would return it, one at a time: a knob whose
        `when` fails is left out rather than multiplied in."""
        grid = self.grid()

        def extend(point: dict[str, Any], index: int) -> Iterator[dict[str, Any]]:
            if index == len(self.params):
                yield {**self.fixed, **point}
                return
            param = self.params[index]
            if not param.applies(point, self.device_type):
                yield from extend(point, index + 1)
                return
            for value in grid[param.name]:
                yield from extend({**point, param.name: value}, index + 1)

        return extend({}, 0)

    def points(self, *, limit: int | None = MAX_GRID_POINTS) -> list[dict[str, Any]]:
        """Every distinct configuration (iter_points), listed; more than `limit` is a one-line SpaceError, so that a
        grid search over a space too large to walk is refused before it starts (None: no limit, for benchmarks that
        evaluate a whole shipped space)."""
        points: list[dict[str, Any]] = []
        for point in self.iter_points():
            if limit is not None and len(points) == limit:
                raise SpaceError(
                    f"the space has more than {limit:,} configurations, too many for a grid search; narrow it or "
                    "use --sampler tpe"
                )
            points.append(point)
        return points

    def size(self) -> int | None:
        """Number of distinct configurations, ignoring conditions (None when continuous)."""
        try:
            return math.prod(self._value_counts().values())
        except SpaceError:
            return None


def _suggest(trial: optuna.Trial, param: Param) -> Any:
    dist = param.distribution
    if isinstance(dist, od.CategoricalDistribution):
        return trial.suggest_categorical(param.name, list(dist.choices))
    if isinstance(dist, od.IntDistribution):
        return trial.suggest_int(param.name, dist.low, dist.high, step=dist.step, log=dist.log)
    assert isinstance(dist, od.FloatDistribution)
    return trial.suggest_float(param.name, dist.low, dist.high, step=dist.step, log=dist.log)


def space_path(name: str) -> Path:
    """The built-in space file of a workload, by workload name or file name."""
    return SPACES_DIR / (name if name.endswith(".yaml") else f"{name}.yaml")


def load(
    path: str | Path,
    hardware: Hardware,
    *,
    workload_knobs: tuple[str, ...] = (),
    world_size: int = 1,
    global_batch_size: int | None = None,
) -> SearchSpace:
    """Read and validate a space file for this hardware (its `extends` chain merged in: autotune.space.files); every
    problem is a one-line SpaceError."""
    return from_dict(
        read(path),
        hardware,
        workload_knobs=workload_knobs,
        origin=str(path),
        world_size=world_size,
        global_batch_size=global_batch_size,
    )


def from_dict(
    data: dict[str, Any],
    hardware: Hardware,
    *,
    workload_knobs: tuple[str, ...] = (),
    origin: str = "search space",
    world_size: int = 1,
    global_batch_size: int | None = None,
) -> SearchSpace:
    """Turn a space mapping into a SearchSpace for this hardware.

    Args:
        data: the parsed YAML mapping; an `extends` in it names a built-in space or a .yaml file relative to the
            current folder (autotune.space.files).
        hardware: the machine; drops options it does not support and resolves `auto`.
        workload_knobs: knob names the workload adds to the core ones.
        origin: where the mapping came from, named in error messages.
        world_size: devices (ranks) per trial: `auto` becomes one rank's share of the cores, and a global recipe
            batch is divided among them.
        global_batch_size: held fixed (--global-batch): only per-device batches that divide it over world_size
            devices remain, the rest made up by gradient accumulation.
    """
    data = resolve(data, origin=origin, folder=Path.cwd())
    # `auto` means the cores one rank may use: ranks on one machine share its cores.
    hardware = replace(hardware, cpu_cores=max(1, hardware.cpu_cores // world_size))
    unknown = set(data) - _TOP_LEVEL_KEYS
    if unknown:
        raise SpaceError(f"{origin}: unknown top-level key {sorted(unknown)[0]!r}; expected {sorted(_TOP_LEVEL_KEYS)}")
    for key in ("workload", "description"):  # copied into every result: text, never a structure
        if key in data and not isinstance(data[key], str):
            raise SpaceError(f"{origin}: '{key}' must be text, got {type(data[key]).__name__}")
    device_type = hardware.device_type
    merged = _merge_device_section(data, device_type, origin)
    known = {**CORE_PARAMS, **{name: object for name in workload_knobs}}
    raw_params = merged.get("params")
    if not isinstance(raw_params, dict) or not raw_params:
        raise SpaceError(f"{origin}: 'params' must be a non-empty mapping of parameter name to distribution")
    params: list[Param] = []
    for name, spec in raw_params.items():
        check_name(name, known, origin)
        earlier = {p.name: numeric_values(p.distribution) for p in params}
        param = build_param(name, spec, hardware, origin, earlier=earlier)
        if param is not None:
            params.append(param)
    if global_batch_size is not None:
        params = [fit_global_batch(param, global_batch_size, world_size, origin) for param in params]
    fixed = check_fixed(merged.get("fixed") or {}, known, origin)
    if fixed.get("precision") == TORCH_DEFAULT_FP32 and TORCH_DEFAULT_FP32 not in hardware.supported_precisions():
        fixed["precision"] = "fp32"  # no TF32 here: torch's defaults are strict fp32 (fit.py _same_maths)
    if "precision" in fixed and fixed["precision"] not in hardware.supported_precisions():
        raise SpaceError(
            f"{origin}: fixed precision {fixed['precision']!r} does not run on this hardware ({hardware.describe()})"
        )
    check_runs_here(fixed, device_type, origin)
    raw_baseline = check_values(merged.get("baseline") or {}, known, origin, "baseline")
    raw_baseline, device_notes = baseline_per_device(
        raw_baseline,
        merged.get("recipe_batch", "per_device"),
        world_size,
        global_batch_size,
        origin,
        accumulates=fixed.get("grad_accum_steps", 1) > 1,
    )
    space = SearchSpace(
        workload=str(merged.get("workload", "")),
        params=tuple(params),
        fixed=fixed,
        baseline={},
        device_type=device_type,
        source=copy.deepcopy(data),
    )
    baseline, notes = adapt_baseline(space, raw_baseline)
    return SearchSpace(
        workload=space.workload,
        params=space.params,
        fixed=fixed,
        baseline=baseline,
        device_type=device_type,
        source=space.source,
        baseline_notes=(*device_notes, *notes),
        space_notes=_left_out_notes(raw_params, device_type),
        seeds=fit_seeds(check_seeds(merged.get("seeds"), known, origin), space, baseline, hardware),
    )


def _left_out_notes(raw_params: dict[str, Any], device_type: str) -> tuple[str, ...]:
    """Why choices of the searched knobs were left out on this device (params.left_out)."""
    notes: list[str] = []
    for name, spec in raw_params.items():
        if not isinstance(spec, dict) or spec.get("type") != "categorical":
            continue
        if holds(device_type, (spec.get("when") or {}).get("device", device_type)):
            notes += left_out(name, list(spec.get("choices") or []), device_type).values()
    return tuple(notes)


def _merge_device_section(data: dict[str, Any], device_type: str, origin: str) -> dict[str, Any]:
    merged = {key: copy.deepcopy(value) for key, value in data.items() if key not in ("cpu", "cuda")}
    section = data.get(device_type) or {}
    if not isinstance(section, dict) or set(section) - _DEVICE_SECTION_KEYS:
        raise SpaceError(f"{origin}: '{device_type}' must be a mapping with only params, fixed, baseline and seeds")
    for key, value in section.items():
        if key == "seeds":
            merged[key] = value  # a device's own seeds replace the general ones
            continue
        if not isinstance(value, dict):
            raise SpaceError(f"{origin}: '{device_type}.{key}' must be a mapping")
        merged[key] = {**(merged.get(key) or {}), **value}
    return merged
