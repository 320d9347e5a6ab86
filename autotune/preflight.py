"""What a run does before its first trial, and what it leaves the trials: who else uses the machine (and what that
changes), the AMP check, and the budget left once both and the input checks are done.

`--budget` is the whole run's (a cluster job's time limit): the input checks, the data, the calibration and the AMP
check come off it, and the trials get the rest (budget.py plans it).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune import assessment, machine_load
from autotune.budget import Stage

if TYPE_CHECKING:
    from autotune.reporting import Reporter
    from autotune.results import TunedConfig
    from autotune.run_plan import RunPlan
    from autotune.trial import TrialConfig, TrialSpec
    from autotune.trial.amp_check import AmpCheckResult
    from autotune.tuner import TrialRecord, TunerSettings

__all__ = ["Preflight", "measure_machine", "check_precisions", "record"]


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
    load = machine_load.calibrate()
    adapted, changes = machine_load.adapt(settings, load)
    if reporter is not None:
        reporter.machine_measured(load.describe() + "".join(f"; {change}" for change in changes), load.busy)
    return Preflight(settings=adapted, load=load, adaptations=changes)


def check_precisions(
    preflight: Preflight, plan: RunPlan, make_spec: Callable[[TrialConfig, str], TrialSpec]
) -> Preflight:
    """The AMP check; then the trials' budget is the run's less everything so far (checks, data, calibration, AMP)."""
    setup_s = time.monotonic() - plan.started_s
    request = plan.request
    amp = assessment.check_precisions(
        plan.space, make_spec, request.amp_check, workdir=plan.workdir, budget_s=request.settings.budget_s
    )
    settings = assessment.budget_left(preflight.settings, amp)
    if settings.budget_s is not None:
        settings = dataclasses.replace(settings, budget_s=max(1.0, settings.budget_s - setup_s))
    stages = [Stage(name="set-up", done=1, spent_s=setup_s)]
    if amp is not None:
        stages.append(Stage(name="AMP check", done=1, spent_s=amp.wall_s or 0.0))
    return dataclasses.replace(preflight, settings=settings, amp=amp, stages=tuple(stages))


def record(preflight: Preflight, tuned: TunedConfig, records: list[TrialRecord]) -> TunedConfig:
    """The result with the machine's load and what it changed (search.machine_load, and notes where it mattered)."""
    load = {**preflight.load.to_dict(), "adapted": preflight.adaptations}
    notes = machine_load.notes(preflight.load, preflight.adaptations, records)
    return dataclasses.replace(tuned, search={**tuned.search, "machine_load": load}, notes=[*tuned.notes, *notes])
