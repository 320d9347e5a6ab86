"""What a run measures around its search, and what it concludes: the parent side of "winners you can trust".

Before the search: the AMP check (trial/amp_check.py) of the space's autocast precisions. After confirmation: the
compute-only ceiling of the winner (trial/compute_only.py) with its FLOPs per sample (trial/flops.py). Then the
result's extra metrics: work per sample and achieved TFLOP/s against the device's peak, pipeline efficiency, the
per-trial overhead of process isolation, the measurement noise of repeated windows, the AMP curves, and the diagnosis
(result/diagnosis.py).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna.distributions as od

from autotune.knobs import length_batching
from autotune.knobs.compile_modes import check_label
from autotune.knobs.config import TrialConfig
from autotune.result.diagnosis import LargerBatches, diagnose
from autotune.result.sections import Metrics
from autotune.run.preload_probe import preload_report
from autotune.search.candidates import group_by_config
from autotune.trial import TrialResult, TrialSpec, launch
from autotune.trial.amp_check import (
    AUTOCAST_PRECISIONS,
    AmpCheckResult,
    AmpCheckSpec,
    amp_precisions,
    run_amp_check,
    space_compile_modes,
    space_precisions,
)
from autotune.trial.amp_curves import AmpCheckSettings
from autotune.trial.flops import achieved_tflops, peak_tflops

if TYPE_CHECKING:
    from autotune.machine.hardware import Hardware
    from autotune.result.measurements import Measurements
    from autotune.result.tuned_config import TunedConfig
    from autotune.search.settings import TunerSettings, TuningOutcome
    from autotune.space.search_space import SearchSpace

__all__ = [
    "check_precisions",
    "budget_left",
    "measure_ceiling",
    "compute_metrics",
    "overhead_metrics",
    "larger_batches",
    "noise_metrics",
    "Assessment",
    "assess",
]

logger = logging.getLogger(__name__)
MakeSpec = Callable[[TrialConfig, str], TrialSpec]
DYNAMIC_BATCH_KNOB = length_batching.FRAMES_KNOB  # a workload knob that sets the batch in frames
MEMORY_STATUSES = ("oom", "headroom")
NOISY_SPREAD_FRACTION = 0.10  # repeated windows of one configuration disagreeing more than this get a note
AMP_BUDGET_SHARE = 0.2  # of --budget the AMP check may take at most


def check_precisions(
    space: SearchSpace,
    make_spec: MakeSpec,
    settings: AmpCheckSettings | None,
    *,
    workdir: Path,
    budget_s: float | None,
    threads: int | None = None,
) -> AmpCheckResult | None:
    """Run the AMP check for the space's autocast precisions; None when it is off or there is nothing to check.

    Args:
        workdir: the run's working folder (the check works in its amp-check folder).
        budget_s: the run's --budget (None: none); the check takes at most AMP_BUDGET_SHARE of it.
        threads: intra-op threads for the check (a busy machine's free cores, as its seeds get); None: torch's own.
    """
    precisions, compiled = amp_precisions(space), space_compile_modes(space)
    if settings is None or not (precisions or compiled):
        return None
    budget = budget_s
    if budget is not None:  # a slow machine must not spend the run on it: past this it cannot judge, and says so
        limit_s = min(settings.timeout_s, max(60.0, AMP_BUDGET_SHARE * budget))
        settings = dataclasses.replace(settings, timeout_s=limit_s)
    folder = workdir / "amp-check"
    config = TrialConfig(per_device_batch_size=settings.batch_size, intra_op_threads=threads)
    trial = make_spec(config, str(folder / "result.json"))
    checked = [*precisions, *(check_label(mode) for mode in compiled)]
    logger.info("AMP check: %s against fp32 over %d steps", ", ".join(checked), settings.steps)
    spec = AmpCheckSpec(trial=trial, precisions=precisions, settings=settings, compile_modes=compiled)
    result = run_amp_check(spec, folder)
    if result.status == "ok":
        shutil.rmtree(folder, ignore_errors=True)
    elif result.status == "partial":
        logger.warning("the AMP check was cut short (%s)", result.reason)
    else:
        logger.warning("the AMP check could not judge (%s); no precision is rejected", result.reason)
    return result


def budget_left(settings: TunerSettings, amp: AmpCheckResult | None) -> TunerSettings:
    """The search's settings with the AMP check's time taken off the run's wall-clock budget."""
    if settings.budget_s is None or amp is None or not amp.wall_s:
        return settings
    return dataclasses.replace(settings, budget_s=max(1.0, settings.budget_s - amp.wall_s))


def measure_ceiling(
    outcome: TuningOutcome,
    make_spec: MakeSpec,
    workdir: Path,
    timeout_s: float,
    left_s: float | None = None,
    launcher: Callable[..., TrialResult] | None = None,
) -> TrialResult | None:
    """One compute-only trial of the winner (batches already on the device), with its FLOPs per sample counted.

    launcher: the run's executor (trial.launch when None), so that the ceiling is measured where the winner was.
    left_s: what is left of the run's budget (None: no budget). The search keeps time for this trial, but trials
    can run longer than the ones before them; a ceiling that would end past the budget is skipped, and says so.
    """
    if outcome.winner is None or outcome.stopped_by == "interrupted":
        return None
    walls = [record.result.wall_s for record in outcome.winner.records if record.result.wall_s]
    expected_s = statistics.median(walls) if walls else 0.0
    if left_s is not None and expected_s > left_s:
        reason = (
            f"no room left in --budget ({max(left_s, 0.0):.0f} s left; the winner's trials took {expected_s:.0f} s)"
        )
        logger.warning("the compute-only ceiling was not measured: %s", reason)
        return TrialResult(status="skipped", reason=reason)
    folder = workdir / "ceiling"
    spec = make_spec(outcome.winner.config, str(folder / "result.json"))
    ceiling_spec = dataclasses.replace(spec, compute_only=True, count_flops=True)
    result = (launcher or launch)(ceiling_spec, workdir=folder, timeout_s=timeout_s)
    if result.feasible:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        logger.warning("the compute-only ceiling could not be measured: %s: %s", result.status, result.reason)
    return result


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return round(numerator / denominator, 4) if numerator is not None and denominator else None


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else float(f"{value:.{digits}g}")


def compute_metrics(
    samples_per_second: float | None, ceiling: TrialResult | None, config: TrialConfig, hardware: Hardware
) -> dict[str, Any]:
    """Work per sample, achieved TFLOP/s (and share of the known peak), the ceiling and the pipeline's efficiency,
    for the winner's end-to-end samples_per_second."""
    measured = ceiling is not None and ceiling.feasible
    flops = ceiling.flops_per_sample if measured and ceiling else None
    ceiling_rate = ceiling.window_samples_per_second if measured and ceiling else None
    peak = None
    if hardware.device_type == "cuda" and hardware.gpus:
        one = peak_tflops(hardware.gpus[0].name, config.precision)
        peak = one * config.world_size if one is not None else None
    achieved = achieved_tflops(flops, samples_per_second)
    metrics: dict[str, Any] = {
        "flops_per_sample": _round(flops),
        "achieved_tflops": _round(achieved),
        "peak_tflops": peak,
        "fraction_of_peak": _ratio(achieved, peak),
        "ceiling_samples_per_second": _round(ceiling_rate, 6),
        "ceiling_tflops": _round(achieved_tflops(flops, ceiling_rate)),
        "pipeline_efficiency": _ratio(samples_per_second, ceiling_rate),
    }
    if ceiling is not None and not ceiling.feasible:
        metrics["ceiling_failed"] = f"{ceiling.status}: {ceiling.reason}"
    return metrics


def _mean(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return round(statistics.fmean(present), 3) if present else None


def overhead_metrics(outcome: TuningOutcome) -> dict[str, Any]:
    """What process isolation and careful timing cost per launched trial, and as a share of the whole run."""
    results = [record.result for record in outcome.records if record.result.wall_s is not None]
    start = [r.start_s for r in results]
    setup = [r.setup_s for r in results]
    warmup = [r.warmup_s for r in results]
    worst = [r.worst_case_s for r in results]
    spent = sum(sum(part or 0.0 for part in (r.start_s, r.setup_s, r.warmup_s, r.worst_case_s)) for r in results)
    timed = sum(r.window_s or 0.0 for r in results)
    walls = sum(r.wall_s or 0.0 for r in results)
    elapsed = outcome.elapsed_s
    return {
        "trials": len(results),
        "mean_start_s": _mean(start),  # process start and imports (python, torch, the workload)
        "mean_setup_s": _mean(setup),  # model, data and loader build
        "mean_warmup_s": _mean(warmup),
        "mean_worst_case_s": _mean(worst),
        "mean_trial_wall_s": _mean([r.wall_s for r in results]),
        "overhead_share_of_run": _ratio(spent, elapsed),
        "timed_share_of_run": _ratio(timed, elapsed),
        # The trials' wall time outside their timed windows: what a short budget must keep small (at most 25% on a
        # CPU: benchmarks/README.md#short-budgets-and-what-a-trial-costs).
        "untimed_share_of_trials": _ratio(walls - timed, walls),
    }


def noise_metrics(outcome: TuningOutcome) -> dict[str, Any]:
    """How far repeated windows of one configuration disagreed in this run: the smallest difference it resolves."""
    spreads = [
        candidate.spread_fraction
        for candidate in group_by_config(outcome.records).values()
        if candidate.feasible and len(candidate.values) > 1
    ]
    return {
        "configurations": len(spreads),  # measured more than once (the confirmed leaders, a repeated search point)
        "median_spread_fraction": round(statistics.median(spreads), 4) if spreads else None,
        "max_spread_fraction": round(max(spreads), 4) if spreads else None,
    }


def _noise_note(noise: dict[str, Any]) -> str | None:
    median = noise["median_spread_fraction"]
    if median is None or median <= NOISY_SPREAD_FRACTION:
        return None
    return (
        f"repeated windows of one configuration disagreed by {median:.0%} (median over {noise['configurations']} "
        f"re-measured configurations, up to {noise['max_spread_fraction']:.0%}): differences smaller than that are "
        "not resolved on this machine; tune it when it is quiet, or lengthen --window"
    )


def _batch_of(config: TrialConfig, knob: str) -> int | None:
    """The configuration's value of the knob that sets the batch; None where that knob does not set its batch."""
    dynamic = config.workload_knobs.get(DYNAMIC_BATCH_KNOB)
    if knob == DYNAMIC_BATCH_KNOB:
        return dynamic
    return None if dynamic is not None else config.per_device_batch_size


def _largest_offered(space: SearchSpace, knob: str) -> int | None:
    """The search space's largest value of a batch knob; None when the search does not vary it."""
    distribution = next((param.distribution for param in space.params if param.name == knob), None)
    if isinstance(distribution, od.CategoricalDistribution):
        numbers = [choice for choice in distribution.choices if isinstance(choice, int)]
        return max(numbers) if len(numbers) > 1 else None
    if isinstance(distribution, od.IntDistribution) and distribution.high > distribution.low:
        return distribution.high
    return None


def larger_batches(outcome: TuningOutcome, space: SearchSpace, config: TrialConfig) -> LargerBatches:
    """What the run measured above the winner's batch at the winner's precision, intra-op threads and activation
    checkpointing (diagnosis.LargerBatches): a larger batch measured on one thread says nothing about it on two, nor
    one out of memory unchecked about it checkpointed."""
    knob = DYNAMIC_BATCH_KNOB if DYNAMIC_BATCH_KNOB in config.workload_knobs else "per_device_batch_size"
    winner_value = _batch_of(config, knob) or 0
    above = group_by_config(
        record
        for record in outcome.records
        if (value := _batch_of(record.config, knob)) is not None
        and value > winner_value
        and record.config.precision == config.precision
        and record.config.intra_op_threads == config.intra_op_threads  # on a CPU, threads outweigh the batch
        # Checkpointing changes the memory per sample: a batch out of memory without it may fit with it.
        and record.config.activation_checkpointing == config.activation_checkpointing
    )
    feasible = [candidate for candidate in above.values() if candidate.feasible]
    best = max(feasible, key=lambda candidate: candidate.median, default=None)
    statuses = [{record.result.status for record in candidate.records} for candidate in above.values()]
    return LargerBatches(
        knob=knob,
        winner_value=winner_value,
        largest_offered=_largest_offered(space, knob),
        best_measured=(best.config.short(), best.median, len(best.values)) if best else None,
        pruned=sum(1 for status in statuses if "pruned" in status),
        out_of_memory=tuple(
            candidate.config.short()
            for candidate, status in zip(above.values(), statuses, strict=True)
            if status & set(MEMORY_STATUSES)
        ),
    )


def _unjudged_winner_precision(amp: AmpCheckResult, config: TrialConfig) -> str | None:
    """A note where the winner trains in a precision the AMP check did not judge (its time ran out on a short --budget
    on a slow or busy machine, or it failed): nothing said the winner's loss follows fp32's. The run keeps it (a
    precision is rejected only on a verdict); the user is told before a long run rests on it."""
    if amp.status == "ok" or config.precision not in AUTOCAST_PRECISIONS or config.precision in amp.final:
        return None  # judged (accepted: a rejected precision cannot win), or fp32 / tf32, which need no check
    verdict = next((v for v in amp.verdicts if v.precision == config.precision), None)
    strayed = (
        f" (its loss strayed {verdict.max_deviation_fraction:.0%} from fp32's over the check's steps; how far fp32 "
        "itself strays was not measured)"
        if verdict is not None and verdict.max_deviation_fraction is not None
        else ""
    )
    if amp.status == "partial":
        return (
            f"the winner trains in {config.precision}, which the AMP check had no time to judge{strayed}: before a "
            f"long run, judge it with a longer --budget (the check gets {AMP_BUDGET_SHARE:.0%} of it) or compare its "
            "first steps' loss with fp32's"
        )
    return (
        f"the winner trains in {config.precision}, which the AMP check could not judge (above): before a long run, "
        "compare its first steps' loss with fp32's"
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Assessment:
    """The result's assessment sections (compute, overhead, noise, amp_check, preload, diagnosis) and the notes
    they call for, in the order the result YAML lists them."""

    metrics: Metrics
    notes: tuple[str, ...] = ()

    def applied_to(self, tuned: TunedConfig) -> TunedConfig:
        """A new result with these sections after its own metrics and these notes after its own."""
        return dataclasses.replace(tuned, metrics={**tuned.metrics, **self.metrics}, notes=[*tuned.notes, *self.notes])


def assess(
    winner: Measurements,
    config: TrialConfig,
    *,
    hardware: Hardware,
    data: dict[str, Any],
    space: SearchSpace,
    outcome: TuningOutcome,
    ceiling: TrialResult | None,
    amp: AmpCheckResult | None,
) -> Assessment:
    """Compute, overhead, noise, AMP-check and diagnosis sections for the winner's result, and their notes.

    Args:
        winner: the winner's summarised measurements; config: its configuration.
        hardware, data, space: the run's machine, its data (DataSource.describe()) and its search space.
    """
    metrics: Metrics = {}
    notes: list[str] = []
    # A compiled winner's objective carries its compile, charged over the run: the pipeline's efficiency against the
    # ceiling (itself a steady window) compares steady states, or compiling would read as a slow data pipeline.
    steady = winner.steady_samples_per_second or winner.samples_per_second
    metrics["compute"] = compute_metrics(steady, ceiling, config, hardware)
    metrics["overhead"] = overhead_metrics(outcome)
    metrics["noise"] = noise_metrics(outcome)
    if noise_note := _noise_note(metrics["noise"]):
        notes.append(noise_note)
    rejected = amp.rejected() if amp else {}
    if amp is not None:
        metrics["amp_check"] = amp.report()
        notes.extend(rejected.values())
        if amp.status == "partial":
            notes.append(f"the AMP check was cut short: {amp.reason}")
        elif amp.status != "ok":
            notes.append(f"the AMP check could not judge: {amp.reason}")
        if unjudged := _unjudged_winner_precision(amp, config):
            notes.append(unjudged)
    metrics["preload"], preload_note = preload_report(outcome)
    if preload_note:
        notes.append(preload_note)
    metrics["diagnosis"] = diagnose(
        winner,
        config=config,
        hardware=hardware,
        data=data,
        compute=metrics["compute"],
        searched_precisions=space_precisions(space),
        rejected_precisions=tuple(rejected),
        larger_batches=larger_batches(outcome, space, config),
    ).to_dict()
    return Assessment(metrics=metrics, notes=tuple(notes))
