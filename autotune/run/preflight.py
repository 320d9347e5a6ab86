"""What a run does before its first trial, and what it leaves the trials: who else uses the machine (and what that
changes), the AMP check, and the budget left once both and the input checks are done.

`--budget` is the whole run's (a cluster job's time limit): the input checks, the data, the calibration and the AMP
check come off it, and the trials get the rest (search/budget.py plans it).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.knobs import compile_modes
from autotune.knobs.length_batching import FRAMES_KNOB as DYNAMIC_BATCH_KNOB
from autotune.machine import cpu_load as machine_load
from autotune.run import assessment
from autotune.search.budget import Stage
from autotune.search.seeds import THREADS

if TYPE_CHECKING:
    from autotune.knobs.config import TrialConfig
    from autotune.result.tuned_config import TunedConfig
    from autotune.run.plan import RunPlan
    from autotune.search.candidates import TrialRecord
    from autotune.search.reporting import Reporter
    from autotune.search.settings import TunerSettings
    from autotune.trial import TrialSpec
    from autotune.trial.amp_check import AmpCheckResult

__all__ = [
    "Preflight",
    "adapt",
    "baseline_step_estimate",
    "check_precisions",
    "load_notes",
    "measure_machine",
    "record",
]


@dataclass(kw_only=True, slots=True)
class Preflight:
    """The run before its trials: the settings the trials get, and what was measured to decide them."""

    settings: TunerSettings  # adapted to the machine's load; after check_precisions, budget_s is the trials' share
    load: machine_load.MachineLoad
    adaptations: list[str]
    amp: AmpCheckResult | None = None
    stages: tuple[Stage, ...] = ()  # for the budget plan: what came before the trials and what it took


def measure_machine(settings: TunerSettings, reporter: Reporter | None) -> Preflight:
    """Calibrate the machine's load before anything of ours runs on it, adapt the settings, and say so."""
    load = machine_load.measure_load()
    adapted, changes = adapt(settings, load)
    if reporter is not None:
        reporter.machine_measured(load.describe() + "".join(f"; {change}" for change in changes), load.busy)
    return Preflight(settings=adapted, load=load, adaptations=changes)


def check_precisions(
    preflight: Preflight, plan: RunPlan, make_spec: Callable[[TrialConfig, str], TrialSpec]
) -> Preflight:
    """The AMP check; then the trials' budget is the run's less everything so far (checks, data, calibration, AMP)."""
    setup_s = time.monotonic() - plan.started_s
    request = plan.request
    # On a busy CPU the check trains on the free cores, as the seeds do (adapt): on every core its steps crawl.
    threads = preflight.settings.free_cores if any(p.name == THREADS for p in plan.space.params) else None
    amp = assessment.check_precisions(
        plan.space,
        make_spec,
        request.amp_check,
        workdir=plan.workdir,
        budget_s=request.settings.budget_s,
        threads=threads,
    )
    settings = assessment.budget_left(preflight.settings, amp)
    if settings.budget_s is not None:
        settings = dataclasses.replace(settings, budget_s=max(1.0, settings.budget_s - setup_s))
    stages = [Stage(name="set-up", done=1, spent_s=setup_s)]
    if amp is not None:
        stages.append(Stage(name="AMP check", done=1, spent_s=amp.wall_s or 0.0))
    return dataclasses.replace(preflight, settings=settings, amp=amp, stages=tuple(stages))


def baseline_step_estimate(
    amp: AmpCheckResult | None, device_type: str
) -> Callable[[TrialConfig], float | None] | None:
    """What a configuration's training step should take, from the AMP check's fp32 steps, for the budget's check
    before the first trial (search/budget.py Budget.check_fits_one); None where the check cannot say.

    On a CPU a step's compute grows with its batch about in proportion (CAM++ fp32 on 2 cores: 0.13-0.15 s a sample at
    a batch of 4 and 16, 0.20 at 64), so the check's step at its small batch, scaled to the configuration's, is its
    compute; the data pipeline only adds to it. Only for fp32 configurations of a fixed batch in eager mode: an
    accelerator's small batch is latency, not compute, and autocast, torch.compile or a batch counted in frames step at
    another cost per sample.
    """
    batch = (amp.settings.get("batch_size") if amp is not None else None) or 0
    if amp is None or amp.fp32_step_s is None or batch <= 0 or device_type != "cpu":
        return None
    step_s = amp.fp32_step_s

    def estimate(config: TrialConfig) -> float | None:
        if (
            config.precision != "fp32"
            or config.compile != compile_modes.OFF
            or DYNAMIC_BATCH_KNOB in config.workload_knobs
        ):
            return None
        return step_s * config.per_device_batch_size / batch

    return estimate


def record(preflight: Preflight, tuned: TunedConfig, records: list[TrialRecord]) -> TunedConfig:
    """The result with the machine's load and what it changed (search.machine_load, and notes where it mattered)."""
    load = {**preflight.load.to_dict(), "adapted": preflight.adaptations}
    notes = load_notes(preflight.load, preflight.adaptations, records)
    return dataclasses.replace(tuned, search={**tuned.search, "machine_load": load}, notes=[*tuned.notes, *notes])


def adapt(settings: TunerSettings, load: machine_load.MachineLoad) -> tuple[TunerSettings, list[str]]:
    """The run's settings for the machine as calibrated, and what was changed (for the output and the YAML).

    A busy machine gets windows BUSY_WINDOW_FACTOR times longer: a slow stretch of someone else's job averages out over
    more of the window. Its seeds that train on every core (intra-op threads `auto`) train on the cores the others
    left: intra-op threads wait for each other at every parallel region, so one preempted by another job stalls all of
    them, and a step on more threads than free cores runs several times slower than on the free ones
    (benchmarks/README.md#a-busy-machine). The search still tries every thread count. What a busy machine does to a
    window is judged per window, busy or not at the start: one that varied while other processes took the CPU is kept
    as disturbed rather than condemned as erratic (trial/child.py), and confirmation re-measures a window disturbed
    beyond its pass and compares leaders pass by pass (search/confirmation.py). The trial counts depend on what was
    measured, not on the calibration, so a run's plan does not change with the load of the minute it started in.
    """
    if not load.busy:
        return settings, []
    timing = dataclasses.replace(settings.timing, window_s=settings.timing.window_s * machine_load.BUSY_WINDOW_FACTOR)
    changes = [f"busy: windows of at least {timing.window_s:g} s instead of {settings.timing.window_s:g}"]
    adapted = dataclasses.replace(settings, timing=timing)
    if load.free_cores < load.cores:
        adapted = dataclasses.replace(adapted, free_cores=load.free_cores)
        changes.append(
            f"the seeds that train on every core train on the {load.free_cores} of {load.cores} the others left"
        )
    return adapted, changes


def load_notes(load: machine_load.MachineLoad, changes: Sequence[str], records: Sequence[TrialRecord]) -> list[str]:
    """What the result should say about the machine it was measured on: busy at the start, windows disturbed."""
    said = []
    if load.busy:
        said.append(f"the machine was busy when the run started ({load.describe()}); {'; '.join(changes)}")
    disturbed = [record for record in records if record.result.disturbed]
    if disturbed:
        said.append(
            f"{len(disturbed)} window(s) varied while other processes took at least "
            f"{machine_load.BUSY_OTHERS_FRACTION:.0%} of the CPU: kept as measurements (not rejected as erratic) and "
            "judged by the median with the leaders' re-measurements; tune on a quiet machine to be sure"
        )
    return said
