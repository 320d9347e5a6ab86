"""One configuration's repeated measurements summarised: a typed value in the run, the same mapping in the result.

`summarise_measurements` turns a configuration's trial results into `Measurements` (medians with their spread);
the runner, the epoch prediction and the assessment read its fields, and `to_dict` writes the result YAML's
metrics.winner / metrics.baseline in the format results already on disk use (the same keys in the same order; a
configuration that was not measured is {status, reason}; no baseline at all is {}).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from autotune.trial.spec import TrialResult
from autotune.yamlio import from_fields

__all__ = ["NOT_MEASURED", "Measurements", "summarise_measurements", "speedup_range"]


# Figures written only where they exist (a compiled configuration's): an eager one's mapping stays what it was.
_ONLY_WHEN_SET = ("compile_s", "recompiles", "steady_samples_per_second", "epoch_start_s", "in_force", "observed")


@dataclass(frozen=True, kw_only=True, slots=True)
class Measurements:
    """Median figures over one configuration's feasible measurements, with their spread; or why there are none
    (status: the first result's failure, "missing" without results, "none" where nothing was to be measured)."""

    status: str
    reason: str = ""  # why not ok
    samples_per_second: float | None = None
    samples_per_second_min: float | None = None
    samples_per_second_max: float | None = None
    spread_fraction: float | None = None
    measurements: int = 0
    audio_seconds_per_second: float | None = None
    step_time_median_s: float | None = None
    step_time_p90_s: float | None = None
    data_wait_fraction: float | None = None
    peak_memory_bytes: int | None = None
    memory_capacity_bytes: int | None = None
    gpu_utilization_percent: float | None = None
    gpu_power_watts: float | None = None
    start_s: float | None = None
    setup_s: float | None = None
    trial_wall_s: float | None = None
    world_size: int | None = None
    per_rank_samples_per_second: list[float] | None = None
    epoch_accounting: dict[str, Any] | None = None
    fp32_math: dict[str, str] | None = None
    # torch.compile: the median seconds compiling cost beyond steady steps (charged in samples_per_second over the
    # run length), and the most recompiles any measurement met; None for an eager configuration.
    compile_s: float | None = None
    recompiles: int | None = None
    # compiled, or a new epoch's cost measured: the median window rate, neither charged
    steady_samples_per_second: float | None = None
    # A new epoch's first batch: the median extra wait a trial measured at an epoch end (trial/epoch_boundary.py),
    # charged once per epoch in samples_per_second; None where it was not measured (a long epoch, no workers)
    epoch_start_s: float | None = None
    # Your own training (--command, --lightning): each knob's verdict as the probe read it back (asked, what the
    # training ran with, in force or not, and where it was set), and every value the training ran with.
    in_force: dict[str, dict[str, Any]] | None = None
    observed: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurements:
        """Read back what to_dict wrote ({} is NOT_MEASURED).

        Raises:
            ValueError: a key that is no figure (a misspelling must not vanish), or no status.
        """
        if not data:
            return NOT_MEASURED
        if "status" not in data:
            raise ValueError(f"measurements without a status: {', '.join(sorted(data))}")
        return from_fields(cls, data)

    def to_dict(self) -> dict[str, Any]:
        """The result YAML's mapping: every figure when measured, {status, reason} when not, {} for "none"."""
        if self.status == "none":
            return {}
        if not self.ok:
            return {"status": self.status, "reason": self.reason}
        return {
            field.name: getattr(self, field.name)
            for field in fields(self)
            if field.name != "reason" and not (field.name in _ONLY_WHEN_SET and getattr(self, field.name) is None)
        }


NOT_MEASURED = Measurements(status="none")  # no baseline in this run: written as {}


def summarise_measurements(results: Sequence[TrialResult]) -> Measurements:
    """Median figures over repeated measurements of one configuration, with their spread."""
    feasible = [r for r in results if r.feasible and r.samples_per_second]
    if not feasible:
        failed = results[0] if results else None
        return Measurements(status=failed.status if failed else "missing", reason=failed.reason if failed else "")
    values = [r.samples_per_second for r in feasible if r.samples_per_second]

    def median_of(name: str) -> float | None:
        found = [getattr(r, name) for r in feasible if getattr(r, name) is not None]
        return round(statistics.median(found), 6) if found else None

    median = statistics.median(values)
    first = feasible[0]
    charged = any(r.compile_s is not None or r.epoch_boundary_s is not None for r in feasible)
    return Measurements(
        status="ok",
        samples_per_second=round(median, 3),
        samples_per_second_min=round(min(values), 3),
        samples_per_second_max=round(max(values), 3),
        spread_fraction=round((max(values) - min(values)) / median, 4) if median else None,
        measurements=len(values),
        audio_seconds_per_second=median_of("audio_seconds_per_second"),
        step_time_median_s=median_of("step_time_median_s"),
        step_time_p90_s=median_of("step_time_p90_s"),
        data_wait_fraction=median_of("data_wait_fraction"),
        peak_memory_bytes=max(r.peak_memory_bytes or 0 for r in feasible),
        memory_capacity_bytes=first.memory_capacity_bytes,
        gpu_utilization_percent=median_of("gpu_utilization_percent"),
        gpu_power_watts=median_of("gpu_power_watts"),
        start_s=median_of("start_s"),
        setup_s=median_of("setup_s"),
        trial_wall_s=median_of("wall_s"),
        world_size=first.world_size,
        per_rank_samples_per_second=first.per_rank_samples_per_second,
        epoch_accounting=first.epoch_accounting,
        fp32_math=first.fp32_math,
        compile_s=median_of("compile_s"),
        recompiles=max((r.recompiles for r in feasible if r.recompiles is not None), default=None),
        steady_samples_per_second=median_of("window_samples_per_second") if charged else None,
        epoch_start_s=median_of("epoch_boundary_s"),
        in_force=first.in_force,
        observed=first.observed,
    )


def speedup_range(winner: Measurements, baseline: Measurements) -> dict[str, Any] | None:
    """The speedup's spread: the worst and best pairings of the two configurations' measurements, and how many there
    were (a single baseline window carries this machine's noise unmeasured; the range then understates it)."""
    if not winner.ok or not baseline.ok:
        return None
    assert winner.samples_per_second_min and winner.samples_per_second_max
    assert baseline.samples_per_second_min and baseline.samples_per_second_max
    return {
        "low": round(winner.samples_per_second_min / baseline.samples_per_second_max, 3),
        "high": round(winner.samples_per_second_max / baseline.samples_per_second_min, 3),
        "winner_measurements": winner.measurements,
        "baseline_measurements": baseline.measurements,
    }
