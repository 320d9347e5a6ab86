"""The study: baseline first, an Optuna search, confirmation of the leaders, a winner chosen on medians."""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from autotune import storage
from autotune.errors import WorkloadError
from autotune.knobs.config import TrialConfig
from autotune.search.budget import Budget, BudgetPlan, PlanState, Stage
from autotune.search.candidates import Candidate, TrialRecord, config_key, config_params, pick_winner
from autotune.search.in_flight import InFlight, Started, measure, on_node, tell
from autotune.search.pruning import Pruner
from autotune.search.reattach import orphan_waiting, trial_folder
from autotune.search.reporting import Reporter, SilentReporter
from autotune.search.room import Room
from autotune.search.samplers import grid_points
from autotune.search.seeds import admissible, backed_off, measured_before, on_free_cores, rejected_reason
from autotune.search.settings import STORAGE_FAILED, TunerSettings, TuningOutcome
from autotune.space.search_space import SearchSpace
from autotune.trial import TrialResult, TrialSpec, launch

__all__ = ["Tuner"]

logger = logging.getLogger(__name__)


class Tuner:
    """Runs one tuning session against an Optuna study.

    Args:
        study: the Optuna study (maximising samples per second).
        space: the search space for this machine.
        make_spec: turns a TrialConfig and a result path into a TrialSpec.
        settings: counts, budget and timing.
        workdir: where trial folders go; a successful trial's folder is removed, a failed one's log is kept.
        reporter: progress callbacks.
        world_size: devices per trial.
        global_batch_size: held fixed (--global-batch): each config accumulates gradients over
            global_batch_size / (per-device batch x world_size) micro-batches; None = no accumulation.
        workload_knobs: workload knobs among the space's parameters.
        strict_baseline: stop with a WorkloadError when the baseline raises (plugins: a bug, not a configuration).
        warm_start: (role, parameters) to measure right after the baseline, before the search: a rerun's previous
            winner (role "previous", always among the confirmed) and its best neighbours (role "warm").
        rejected_precisions: precisions the AMP check rejected, and compile modes (by compile_modes.check_label),
            with the reason: a trial with one is recorded as status "precision" (infeasible to Optuna) without
            being launched.
        preload_probe: says whether the best configuration so far is worth measuring with its decoded audio
            preloaded into RAM (it waits for data and the corpus fits the RAM budget); if so, the search's last trial
            (role "preload") measures it. None: never.
        launcher: runs one trial; None: trial.launch (a real subprocess). The replay benchmark
            (benchmarks/replay.py) passes recorded measurements instead, with a clock that their wall times advance.
        clock: seconds, for the budget.
        closing_trials: trials the run measures after this search within the same budget (the runner's compute-only
            ceiling of the winner): time for them is kept free, as for confirmation.
        before: stages the run went through before the trials (the AMP check), with the seconds they took, for the
            plan; settings.budget_s is what is left of the run's budget after them.
        step_estimate: what a configuration's step should take before any trial measured one (run/preflight.py
            baseline_step_estimate), None where unknown: a budget that cannot measure the baseline is refused before it.
    """

    def __init__(
        self,
        *,
        study: optuna.Study,
        space: SearchSpace,
        make_spec: Callable[[TrialConfig, str], TrialSpec],
        settings: TunerSettings,
        workdir: Path,
        reporter: Reporter | None = None,
        world_size: int = 1,
        global_batch_size: int | None = None,
        workload_knobs: tuple[str, ...] = (),
        strict_baseline: bool = False,
        warm_start: tuple[tuple[str, dict[str, Any]], ...] = (),
        rejected_precisions: dict[str, str] | None = None,
        preload_probe: Callable[[TrialRecord], bool] | None = None,
        launcher: Callable[..., TrialResult] | None = None,
        clock: Callable[[], float] = time.monotonic,
        closing_trials: int = 0,
        before: tuple[Stage, ...] = (),
        step_estimate: Callable[[TrialConfig], float | None] | None = None,
    ) -> None:
        self.preload_probe, self.step_estimate = preload_probe, step_estimate
        self.study, self.space, self.make_spec, self.settings = study, space, make_spec, settings
        self.rejected_precisions = dict(rejected_precisions or {})  # by the AMP check: precision -> why
        self.workdir, self.reporter = workdir, reporter or SilentReporter()
        self.world_size, self.workload_knobs, self.strict_baseline = world_size, workload_knobs, strict_baseline
        self.global_batch_size = global_batch_size
        self.warm_start = list(warm_start)
        # The drift check's configuration: every record of it is marked, the baseline's too where it is the recipe's
        previous = next((params for role, params in self.warm_start if role == "previous"), None)
        self.previous_key = None if previous is None else config_key(self._config({**space.fixed, **previous}))
        # A cold TPE study starts from the space's expert seeds; a rerun's previous winner is better knowledge, and
        # random and grid searches stay unseeded (they are the comparisons).
        cold = not self.warm_start and settings.sampler == "tpe" and len(study.trials) == 0
        free = None if settings.free_cores is None else max(1, settings.free_cores // world_size)
        seeds = on_free_cores(admissible(space.seeds, self.rejected_precisions), space, free)
        self.seeds = [("seed", seed) for seed in seeds] if cold else []
        self.records: list[TrialRecord] = []
        self.launcher = launcher or launch
        self.closing_trials, self.before = closing_trials, before
        spent_before_s = sum(stage.spent_s for stage in before)
        self.budget = Budget(
            settings.budget_s,
            settings.timing,
            clock=clock,
            spent_before_s=spent_before_s,
            closing_trials=closing_trials,
        )
        self.room = Room(self.budget, settings, self.records)  # the leaders and the room kept for them
        self.skipped: list[str] = []  # seeds there was no room for

    def elapsed_s(self) -> float:
        return self.budget.elapsed_s()

    def _config(self, params: dict[str, Any]) -> TrialConfig:
        config = TrialConfig.from_params(params, world_size=self.world_size, workload_knobs=self.workload_knobs)
        if self.global_batch_size is None:
            return config
        # The space only offers per-device batches that divide the global batch (space/fit.py fit_global_batch).
        accum = max(1, self.global_batch_size // (config.per_device_batch_size * self.world_size))
        return TrialConfig.from_dict({**config.to_dict(), "grad_accum_steps": accum})

    def _run_one(self, role: str, params: dict[str, Any] | None = None, window_s: float | None = None) -> TrialRecord:
        return self._run_started(self._start(role, params, window_s))

    def _run_started(self, started: Started) -> TrialRecord:
        try:
            result = self._measure(started)
        except BaseException:
            self._fail(started.trial)
            raise
        return self._finish(started, result)

    def _start(self, role: str, params: dict[str, Any] | None, window_s: float | None = None) -> Started:
        """Ask the study for a trial and specify it, with a window of at least window_s where given (a long run's
        confirmation); from here on it is RUNNING in the study: whatever stops this run tells it FAIL."""
        trial = storage.ask_trial(self.study, params)  # race-free on a study shared with other runs
        try:
            values = self.space.suggest(trial)
            config = self._config({**values, **{k: v for k, v in (params or {}).items() if k not in values}})
            self.reporter.trial_started(trial.number, role, config)
            folder = trial_folder(trial, self.workdir, self.launcher)
            trial.set_user_attr(storage.FOLDER_ATTR, str(folder))
            pruner = Pruner(self.best(), self.settings) if role == "search" and self.settings.prune else None
            spec = self.make_spec(config, str(folder / "result.json"))
            if window_s is not None:
                spec = dataclasses.replace(spec, timing=dataclasses.replace(spec.timing, window_at_least_s=window_s))
        except BaseException:
            self._fail(trial)
            raise
        return Started(trial=trial, role=role, config=config, folder=folder, spec=spec, pruner=pruner)

    def _measure(self, started: Started) -> TrialResult:
        """The trial's result; in a thread of its own when trials run side by side (search/in_flight.py), where it only
        reads the records (for the budget's room to measure an erratic trial again), which the main thread appends
        to."""
        rejected = self._rejected(started.config)
        if rejected is not None:  # infeasible unlaunched: the AMP check said so
            return TrialResult(status="precision", reason=rejected)
        with storage.heartbeat(self.study, started.trial):
            return self._launch(started.spec, started.folder, started.pruner)

    def _fail(self, trial: optuna.Trial) -> None:
        try:
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        except Exception as error:  # the storage itself failed: the next run fails and retries the trial
            logger.warning("trial #%d could not be marked failed (%s)", trial.number, type(error).__name__)

    def _finish(self, started: Started, result: TrialResult) -> TrialRecord:
        """Record a measured trial: in the run, in the study, to the reporter and the plan (the main thread only)."""
        record = TrialRecord(number=started.trial.number, role=started.role, config=started.config, result=result)
        record.previous_winner = record.key == self.previous_key
        self.records.append(record)  # measured: it counts in this run even if the storage fails to record it
        try:
            tell(self.study, started, record)
        finally:
            self.reporter.trial_finished(record, self.best())
        if result.feasible:
            shutil.rmtree(started.folder, ignore_errors=True)
        self._plan_changed()
        return record

    def _rejected(self, config: TrialConfig) -> str | None:
        return rejected_reason(self.rejected_precisions, config)

    def _launch(self, spec: TrialSpec, folder: Path, pruner: Pruner | None) -> TrialResult:
        # --budget is a ceiling: a trial still running when it ends (a machine that got loaded) is stopped there.
        left_s = self.budget.left_s()
        timeout_s = self.settings.trial_timeout_s if left_s is None else min(self.settings.trial_timeout_s, left_s)
        room = lambda wall_s: self.budget.fits(wall_s, keep_s=self._closing_s())  # noqa: E731
        cut = timeout_s < self.settings.trial_timeout_s
        return measure(self.launcher, spec, folder, pruner, timeout_s=timeout_s, cut_by_budget=cut, room=room)

    def best(self) -> TrialRecord | None:
        return self.room.best()

    def _closing_s(self) -> float:
        return self.room.closing_s()

    def _queued_s(self, params: dict[str, Any]) -> float:
        return self.budget.queued_s(self._config({**self.space.fixed, **params}), self.records)

    def _preload_point(self) -> dict[str, Any] | None:
        """The best configuration so far with its audio preloaded, where the probe says it is worth a trial."""
        best = self.best()
        if self.preload_probe is None or best is None or any(r.config.preload_audio for r in self.records):
            return None
        return {**config_params(best.config, self.space), "preload_audio": True} if self.preload_probe(best) else None

    def run(self) -> TuningOutcome:
        """Baseline, warm start, search until the trial count or budget is spent, confirm the leaders, pick the winner.

        Ctrl-C ends the current trial (told FAIL, so the study stays consistent), skips confirmation and returns the
        best measured so far with stopped_by "interrupted"; with nothing measured yet, it propagates. A storage that
        fails mid-run (a full disk, a database gone) ends the run the same way, with stopped_by STORAGE_FAILED: what
        was measured is still this run's to write.
        """
        failure = ""
        try:
            stopped_by = self._search()
            confirmed = self.room.confirm(self._confirm_one)
        except KeyboardInterrupt:
            if not self.records:
                raise
            logger.warning("interrupted: choosing among the %d trials measured so far", len(self.records))
            stopped_by, confirmed = "interrupted", self.room.unconfirmed()
        except storage.storage_failures() as error:
            if not self.records:
                raise
            failure = storage.describe_failure(error)
            logger.warning("the study's storage failed (%s): choosing among the trials measured so far", failure)
            stopped_by, confirmed = STORAGE_FAILED, self.room.unconfirmed()
        winner, winner_reason = pick_winner(
            [c for c in confirmed.finalists if c.feasible], confirmed.estimates, by=confirmed.basis
        )
        baseline = next((record for record in self.records if record.role == "baseline"), None)
        return TuningOutcome(
            records=list(self.records),
            baseline=self.room.candidates().get(config_key(baseline.config)) if baseline else None,
            winner=winner,
            stopped_by=stopped_by,
            elapsed_s=self.elapsed_s(),
            confirmed=confirmed.leaders,
            winner_reason=winner_reason,
            failure=failure,
            plan=self.plan(),
            set_aside=confirmed.set_aside,
            skipped=list(self.skipped),
        )

    def _search(self) -> str:
        """The baseline, then the warm start (or a cold study's seeds), then the sampler's (or the grid's) points;
        returns what stopped it. A queued trial needs room only for itself and the closing trials: it comes before
        confirmation, which is kept room for only once there is something to compare (search/budget.py). A budget
        that cannot hold one honest measurement is refused before the baseline (Budget.check_fits_one)."""
        baseline_config = self._config({**self.space.fixed, **self.space.baseline})
        step_s = self.step_estimate(baseline_config) if self.step_estimate else None
        if step_s is not None:
            logger.info("the baseline's step should take about %.2f s here (the AMP check's fp32 steps)", step_s)
        self.budget.check_fits_one(step_s)
        self._plan_changed()
        baseline = self._run_one("baseline", dict(self.space.baseline))
        if self.strict_baseline and baseline.result.status == "error":
            # An exception (not OOM, not a signal) in the recipe's own configuration is the workload's bug.
            log = self.workdir / f"trial-{baseline.number:04d}" / "trial.log"
            raise WorkloadError(f"the workload failed its first training step: {baseline.result.reason} (log: {log})")
        if self.settings.parallel == 1:
            return self._search_loop(None)
        flight = InFlight(self.settings.parallel, self._measure, getattr(self.launcher, "stop", None))
        try:
            stopped_by = self._search_loop(flight)
            while len(flight):  # what is in flight ends before confirmation, which compares like with like
                self._back_off(self._finish(*flight.next_done()))
            return stopped_by
        except BaseException:  # Ctrl-C, a storage failure: every job in flight is cancelled, its trial told FAIL
            for started, ended in flight.cancel_all():
                self._finish(started, ended) if isinstance(ended, TrialResult) else self._fail(started.trial)
            raise
        finally:
            flight.close()

    def _search_loop(self, flight: InFlight | None) -> str:
        """The search after the baseline; with trials in flight (--parallel), each next trial is chosen when one of
        theirs ended and left its node free, from every record so far. A trial in flight runs beside the others, so
        the budget's room for the next one is its own cost (it ends on its node when it ends); the trial count
        counts each trial as it starts, so none is counted twice and no more than --trials run."""
        grid = grid_points(self.space, self.settings.seed) if self.settings.sampler == "grid" else None
        queue = self.warm_start or self.seeds
        launched, unlaunched = 1, 0
        while launched < self.settings.trials:
            while flight is not None and flight.full:
                self._back_off(self._finish(*flight.next_done()))
            if orphan_waiting(self.study, self.launcher):
                started = self._begin("search", None, flight)  # Optuna's queue hands out the waiting retry
            elif queue:
                role, params = queue.pop(0)
                if self._measured(role, params):
                    continue
                # a queued trial may be the winner, the closing ceiling only explains one: it keeps no room for it
                if not self.budget.fits(self._queued_s(params)):
                    if not self._last_chance(role, params):
                        self._skip(role, params)
                        continue
                started = self._begin(role, params, flight)
            elif not self.room.search_fits():
                return "budget"
            elif (launched == self.settings.trials - 1 or not self.room.search_fits(spare_trials=1)) and (
                point := self._preload_point()
            ) is not None:
                started = self._begin("preload", point, flight)  # the search's last trial: the best so far, preloaded
            elif grid is not None and not grid:
                return "grid exhausted"
            else:
                started = self._begin("search", grid.pop(0) if grid is not None else None, flight)
            # A precision the AMP check rejected costs no measuring time, so it does not use up a trial; the sampler
            # learns to avoid it (value 0), and a space that offers nothing else cannot loop forever.
            if self._rejected(started.config) is None:
                launched += 1
            elif (unlaunched := unlaunched + 1) >= max(self.settings.trials, 10):
                return "rejected precisions"
        return "trials"

    def _begin(self, role: str, params: dict[str, Any] | None, flight: InFlight | None) -> Started:
        """Start a trial: put in flight, or (alone, or a rejected precision, which runs nothing) measured now."""
        started = self._start(role, params)
        if flight is None or self._rejected(started.config) is not None:
            self._back_off(self._run_started(started))
        else:
            flight.start(started)
        return started

    def _back_off(self, record: TrialRecord) -> None:
        """A seed out of memory is queued again, checkpointed or at half its batch (seeds.py backed_off)."""
        retry = backed_off(self.space, record)
        if retry is not None and self._measured_as(retry) is None:
            self.seeds.insert(0, ("seed", retry))

    def _measured(self, role: str, params: dict[str, Any]) -> bool:
        """Whether a queued configuration was measured in this run already (seeds.py measured_before); confirmation
        re-measures it if it leads (a previous winner always)."""
        if (measured := self._measured_as(params)) is not None:
            what = f"{role} {measured.config.short()} is not measured twice: trial #{measured.number} ({measured.role})"
            logger.warning("%s measured the same configuration", what)
            self._plan_changed()
        return measured is not None

    def _measured_as(self, params: dict[str, Any]) -> TrialRecord | None:
        return measured_before(self.records, self._config({**self.space.fixed, **params}))

    def _last_chance(self, role: str, params: dict[str, Any]) -> bool:
        """Whether a queued trial that may not end in time runs anyway (Budget.last_chance); a trial still running
        when the budget ends is stopped there (_launch)."""
        left, cost = self.budget.left_s(), self._queued_s(params)
        if not self.budget.last_chance(cost, len({config_key(r.config) for r in self.records if r.result.feasible})):
            return False
        logger.warning(
            "%s %s runs with %.0f s left although it may need %.0f s: nothing but the baseline is measured yet; "
            "it is stopped when --budget ends",
            role,
            self._config({**self.space.fixed, **params}).short(),
            left,
            cost,
        )
        return True

    def _skip(self, role: str, params: dict[str, Any]) -> None:
        """Say that a queued trial found no room, and the whole run's --budget that would have held it: what the run
        spent so far (what came before the trials included) and the trial's estimate (a seed's rests on the trials
        measured so far, the baseline's precision where nothing else is measured: an upper bound for a faster seed)."""
        config = self._config({**self.space.fixed, **params})
        left, cost = self.budget.left_s() or 0.0, self._queued_s(params)
        would = math.ceil((self.budget.spent_before_s + self.budget.elapsed_s() + cost) / 60.0)
        why = (
            f"{role} {config.short()} skipped: no room left in --budget ({left:.0f} s left, it should take about "
            f"{cost:.0f} s; a --budget of {would}m would hold it)"
        )
        logger.warning(why)
        self.skipped.append(why)
        self._plan_changed()

    def _confirm_one(self, leader: Candidate, window_s: float | None = None) -> None:
        with on_node(self.launcher, leader):  # where it was first measured (--executor slurm)
            self._run_one("confirm", config_params(leader.config, self.space), window_s)

    def plan(self) -> BudgetPlan:
        """What the run intends for the rest of its budget, from the trials measured so far (search/budget.py)."""
        queue = [(role, params) for role, params in self.warm_start or self.seeds if self._measured_as(params) is None]
        counted = sum(r.role != "confirm" and r.result.status != "precision" for r in self.records)
        state = PlanState(
            queued_s=tuple(self._queued_s(params) for _, params in queue),
            skipped=len(self.skipped),
            confirmations=self.room.confirmations(),
            searches_left=max(0, self.settings.trials - counted - len(queue)),
            reserve_s=self.room.reserve_s(),
            closing_s=self._closing_s(),
        )
        return self.budget.plan(self.records, state, self.before)

    def _plan_changed(self) -> None:
        self.reporter.plan_changed(self.plan())
