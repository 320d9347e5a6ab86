"""The study: baseline first, an Optuna search, confirmation of the leaders, a winner chosen on medians."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from autotune import storage
from autotune.budget import Budget, BudgetPlan, PlanState, Stage
from autotune.candidates import Candidate, TrialRecord, config_key, config_params, group_by_config, leaders, pick_winner
from autotune.confirmation import LONG_CONFIRM_SHARE, LONG_LEADERS, Confirmation, is_long
from autotune.errors import WorkloadError
from autotune.pruning import Pruner
from autotune.reporting import Reporter, SilentReporter
from autotune.samplers import grid_points, make_sampler
from autotune.space import SearchSpace
from autotune.space_fit import smaller_batch
from autotune.trial import TimingSettings, TrialConfig, TrialResult, TrialSpec, launch

__all__ = [
    "TunerSettings",
    "TrialRecord",
    "Candidate",
    "TuningOutcome",
    "Reporter",
    "Tuner",
    "make_sampler",
    "config_params",
    "pick_winner",
]

logger = logging.getLogger(__name__)
STORAGE_FAILED = "storage failure"  # TuningOutcome.stopped_by when the machine failed the study mid-run
FEASIBILITY = "infeasible"  # the constraint told to Optuna: > 0 means the configuration cannot be used
# A queued trial runs, with nothing but the baseline measured, while this share of its estimated cost is left
# (Tuner._last_chance): on a loaded 2-core machine a 5-min run measured the baseline (147 s) and skipped both seeds
# with 90 s left, ending at 2.4 min with the recipe as its winner.
LAST_CHANCE_SHARE = 0.5


@dataclass(frozen=True, kw_only=True, slots=True)
class TunerSettings:
    """How long and how carefully to search."""

    trials: int = 24
    budget_s: float | None = None
    sampler: str = "tpe"  # tpe | random | grid
    seed: int = 0
    confirm_top_k: int = 3
    confirm_repeats: int = 2
    trial_timeout_s: float = 300.0
    timing: TimingSettings = field(default_factory=TimingSettings)
    prune: bool = True
    prune_window_fraction: float = 0.5  # stop a search trial running below this share of the best so far...
    prune_warmup_fraction: float = 0.25  # ...or, from its warm-up steps, projected below this share


@dataclass(kw_only=True, slots=True)
class TuningOutcome:
    """What a run found."""

    records: list[TrialRecord]
    baseline: Candidate | None
    winner: Candidate | None
    stopped_by: str
    elapsed_s: float
    confirmed: list[Candidate] = field(default_factory=list)
    winner_reason: str = ""
    failure: str = ""  # with stopped_by STORAGE_FAILED: what failed (a full disk, a database gone)
    plan: BudgetPlan | None = None  # the budget plan as the run left it


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
        rejected_precisions: precisions the AMP check rejected, with the reason: a trial with one is recorded as
            status "precision" (infeasible to Optuna) without being launched.
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
    ) -> None:
        self.preload_probe = preload_probe
        self.study, self.space, self.make_spec, self.settings = study, space, make_spec, settings
        self.rejected_precisions = dict(rejected_precisions or {})  # by the AMP check: precision -> why
        self.workdir, self.reporter = workdir, reporter or SilentReporter()
        self.world_size, self.workload_knobs, self.strict_baseline = world_size, workload_knobs, strict_baseline
        self.global_batch_size = global_batch_size
        self.warm_start = list(warm_start)
        # A cold TPE study starts from the space's expert seeds; a rerun's previous winner is better knowledge, and
        # random and grid searches stay unseeded (they are the comparisons).
        cold = not self.warm_start and settings.sampler == "tpe" and len(study.trials) == 0
        seeds = [seed for seed in space.seeds if seed.get("precision") not in self.rejected_precisions]
        self.seeds = [("seed", dict(seed)) for seed in seeds] if cold else []
        self.records: list[TrialRecord] = []
        self.launcher, self.closing_trials, self.before = launcher, closing_trials, before
        spent_before_s = sum(stage.spent_s for stage in before)
        self.budget = Budget(
            settings.budget_s,
            settings.timing,
            clock=clock,
            spent_before_s=spent_before_s,
            closing_trials=closing_trials,
        )
        self.skipped: list[str] = []  # seeds there was no room for

    def elapsed_s(self) -> float:
        return self.budget.elapsed_s()

    def _config(self, params: dict[str, Any]) -> TrialConfig:
        config = TrialConfig.from_params(params, world_size=self.world_size, workload_knobs=self.workload_knobs)
        if self.global_batch_size is None:
            return config
        # The space only offers per-device batches that divide the global batch (space._fit_global_batch).
        accum = max(1, self.global_batch_size // (config.per_device_batch_size * self.world_size))
        return TrialConfig.from_dict({**config.to_dict(), "grad_accum_steps": accum})

    def _run_one(self, role: str, params: dict[str, Any] | None = None) -> TrialRecord:
        trial = storage.ask_trial(self.study, params)  # race-free on a study shared with other runs
        try:  # from here on the trial is RUNNING in the study: whatever stops this run tells it FAIL
            values = self.space.suggest(trial)
            config = self._config({**values, **{k: v for k, v in (params or {}).items() if k not in values}})
            self.reporter.trial_started(trial.number, role, config)
            folder = self.workdir / f"trial-{trial.number:04d}"
            pruner = Pruner(self.best(), self.settings) if role == "search" and self.settings.prune else None
            spec = self.make_spec(config, str(folder / "result.json"))
            if config.precision in self.rejected_precisions:  # infeasible without launching: the AMP check said so
                result = TrialResult(status="precision", reason=self.rejected_precisions[config.precision])
            else:
                with storage.heartbeat(self.study, trial):
                    result = self._launch(spec, folder, pruner)
        except BaseException:
            try:
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            except Exception as error:  # the storage itself failed: the next run fails and retries the trial
                logger.warning("trial #%d could not be marked failed (%s)", trial.number, type(error).__name__)
            raise
        record = TrialRecord(number=trial.number, role=role, config=config, result=result)
        self.records.append(record)  # measured: it counts in this run even if the storage fails to record it
        try:
            self._tell(trial, record, pruner)
        finally:
            self.reporter.trial_finished(record, self.best())
        if result.feasible:
            shutil.rmtree(folder, ignore_errors=True)
        self._plan_changed()
        return record

    def _launch(self, spec: TrialSpec, folder: Path, pruner: Pruner | None) -> TrialResult:
        """Launch a trial; one whose throughput was erratic is measured once more, and only a second erratic window
        condemns it (a passing load on a shared machine must not; a configuration that stalls does it again).

        A window other processes disturbed (trial/child.py's gate) is kept as it is, not retried at once into the same
        load: a disturbed leader is re-measured in confirmation, interleaved with the others."""
        # --budget is a ceiling: a trial still running when it ends (a machine that got loaded) is stopped there.
        left_s = self.budget.left_s()
        timeout_s = self.settings.trial_timeout_s if left_s is None else min(self.settings.trial_timeout_s, left_s)
        launch_trial = self.launcher or launch  # looked up per call: tests replace trial.launch in this module
        result = launch_trial(spec, workdir=folder, timeout_s=max(timeout_s, 1.0), should_prune=pruner)
        if result.status == "timeout" and timeout_s < self.settings.trial_timeout_s:
            result.reason = f"stopped when --budget ran out, after {timeout_s:.0f} s"
        if result.disturbed:
            logger.warning("%s: %s", spec.config.short(), result.reason)
        if result.status != "erratic":
            return result
        if not self.budget.fits(result.wall_s or 0.0, keep_s=self._closing_s()):
            result.reason += "; no room left in --budget to measure it again"
            return result
        logger.warning("%s: %s; measuring it once more", spec.config.short(), result.reason)
        retry_spec = dataclasses.replace(spec, result_path=str(folder / "retry" / "result.json"))
        retry = launch_trial(retry_spec, workdir=folder / "retry", timeout_s=timeout_s, should_prune=pruner)
        retry.wall_s = (retry.wall_s or 0.0) + (result.wall_s or 0.0)
        if retry.status == "erratic":
            retry.reason = f"{retry.reason}, and CV {result.throughput_cv:.2f} in the first window"
        return retry

    def _tell(self, trial: optuna.Trial, record: TrialRecord, pruner: Pruner | None) -> None:
        """Record the trial in the study. If another run has meanwhile failed it as stale (this run's heartbeat went
        unheard, e.g. the database was unreachable), the study keeps that verdict; this run keeps its measurement."""
        result = record.result
        try:
            trial.set_user_attr("role", record.role)
            trial.set_user_attr("config", record.config.to_dict())
            trial.set_user_attr("result", {k: v for k, v in result.to_dict().items() if k != "log_tail"})
            if result.status == "pruned" and pruner is not None:
                # Optuna's samplers read a pruned trial through its last intermediate value.
                trial.report(pruner.last_rate, step=0)
                self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            else:
                trial.set_constraint(FEASIBILITY, 0.0 if result.feasible else 1.0)
                self.study.tell(trial, record.value)
        except (RuntimeError, ValueError) as error:
            state = self.study._storage.get_trial(trial._trial_id).state  # noqa: SLF001 - no public accessor
            if not state.is_finished():
                raise
            logger.warning(
                "trial #%d was marked %s by another run while this one measured it (%s); its result counts in "
                "this run only",
                trial.number,
                state.name,
                error,
            )

    def best(self) -> TrialRecord | None:
        feasible = [record for record in self.records if record.result.feasible]
        return max(feasible, key=lambda record: record.value, default=None)

    def _closing_s(self) -> float:
        return self.budget.closing_s(self.records, self.best())

    def _reserve_s(self) -> float:
        share = LONG_CONFIRM_SHARE if self._long() else None
        return self.budget.reserve_s(self._candidates().values(), self._leaders(), self._rounds(), share=share)

    def _long(self) -> bool:  # long enough for sequential halving of more leaders (confirmation.is_long)
        trials, budget_s = (self.settings.trials if self.settings.confirm_top_k > 0 else 0), self.settings.budget_s
        return is_long(trials=trials, budget_s=budget_s, trial_s=self.budget.costs.search_trial_s(self.records))

    def _rounds(self) -> int:
        return self.settings.confirm_repeats if self.settings.confirm_top_k > 0 else 0

    def _queued_s(self, params: dict[str, Any]) -> float:
        return self.budget.queued_s(self._config({**self.space.fixed, **params}), self.records)

    def _search_fits(self, spare_trials: int = 0) -> bool:
        """Another search trial (and spare_trials more) should end before the room kept for confirmation and the
        closing trials. The budget is a ceiling (a job's time limit on a cluster), not the last moment to start."""
        cost = (1 + spare_trials) * self.budget.costs.search_trial_s(self.records)
        return self.budget.fits(cost, keep_s=self._reserve_s() + self._closing_s())

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
            confirmed, finalists = self._confirm()
        except KeyboardInterrupt:
            if not self.records:
                raise
            logger.warning("interrupted: choosing among the %d trials measured so far", len(self.records))
            stopped_by, confirmed = "interrupted", self._leaders()
            finalists = confirmed
        except storage.storage_failures() as error:
            if not self.records:
                raise
            failure = storage.describe_failure(error)
            logger.warning("the study's storage failed (%s): choosing among the trials measured so far", failure)
            stopped_by, confirmed = STORAGE_FAILED, self._leaders()
            finalists = confirmed
        winner, winner_reason = pick_winner([c for c in finalists if c.feasible])
        baseline = next((record for record in self.records if record.role == "baseline"), None)
        return TuningOutcome(
            records=list(self.records),
            baseline=self._candidates().get(config_key(baseline.config)) if baseline else None,
            winner=winner,
            stopped_by=stopped_by,
            elapsed_s=self.elapsed_s(),
            confirmed=confirmed,
            winner_reason=winner_reason,
            failure=failure,
            plan=self.plan(),
        )

    def _search(self) -> str:
        """The baseline, then the warm start (or a cold study's seeds), then the sampler's (or the grid's) points;
        returns what stopped it. A queued trial needs room only for itself and the closing trials: it comes before
        confirmation, which is kept room for only once there is something to compare (budget.py)."""
        self._plan_changed()
        baseline = self._run_one("baseline", dict(self.space.baseline))
        if self.strict_baseline and baseline.result.status == "error":
            # An exception (not OOM, not a signal) in the recipe's own configuration is the workload's bug.
            log = self.workdir / f"trial-{baseline.number:04d}" / "trial.log"
            raise WorkloadError(f"the workload failed its first training step: {baseline.result.reason} (log: {log})")
        grid = grid_points(self.space, self.settings.seed) if self.settings.sampler == "grid" else None
        queue = self.warm_start or self.seeds
        launched, unlaunched = 1, 0
        while launched < self.settings.trials:
            if queue:
                role, params = queue.pop(0)
                if not self.budget.fits(self._queued_s(params), keep_s=self._closing_s()):
                    if not self._last_chance(role, params):
                        self._skip(role, params)
                        continue
                record = self._run_one(role, params)
                self._back_off(record)
            elif not self._search_fits():
                return "budget"
            elif (launched == self.settings.trials - 1 or not self._search_fits(spare_trials=1)) and (
                point := self._preload_point()
            ) is not None:
                record = self._run_one("preload", point)  # the search's last trial: the best so far, preloaded
            elif grid is not None and not grid:
                return "grid exhausted"
            else:
                record = self._run_one("search", grid.pop(0) if grid is not None else None)
            # A precision the AMP check rejected costs no measuring time, so it does not use up a trial; the sampler
            # learns to avoid it (value 0), and a space that offers nothing else cannot loop forever.
            if record.result.status != "precision":
                launched += 1
            elif (unlaunched := unlaunched + 1) >= max(self.settings.trials, 10):
                return "rejected precisions"
        return "trials"

    def _back_off(self, record: TrialRecord) -> None:
        """A seed that did not fit the device's memory is tried next at half its batch (as Lightning's batch-size finder
        backs off): seeds are written for large GPUs; on a smaller one their other settings are still a good guess."""
        if record.role != "seed" or record.result.status not in ("oom", "headroom"):
            return
        smaller = smaller_batch(self.space, config_params(record.config, self.space))
        measured = {config_key(r.config) for r in self.records}
        if smaller is not None and config_key(self._config(smaller)) not in measured:
            self.seeds.insert(0, ("seed", smaller))

    def _last_chance(self, role: str, params: dict[str, Any]) -> bool:
        """Whether a queued trial that may not end in time runs anyway: only while nothing but the baseline has been
        measured (skipping it leaves the recipe as the winner and the rest of the budget unused) and while at least
        LAST_CHANCE_SHARE of its estimate is left. Its estimate then rests on the baseline's precision and batch, and
        a seed is chosen to be faster; a trial still running when the budget ends is stopped there (_launch)."""
        if len({config_key(r.config) for r in self.records if r.result.feasible}) > 1:
            return False
        left, cost = self.budget.left_s(), self._queued_s(params)
        if left is None or left < LAST_CHANCE_SHARE * cost:
            return False
        config = self._config({**self.space.fixed, **params})
        logger.warning(
            "%s %s runs with %.0f s left although it may need %.0f s: nothing but the baseline is measured yet; "
            "it is stopped when --budget ends",
            role,
            config.short(),
            left,
            cost,
        )
        return True

    def _skip(self, role: str, params: dict[str, Any]) -> None:
        config = self._config({**self.space.fixed, **params})
        left = self.budget.left_s() or 0.0
        why = f"{role} {config.short()} skipped: no room left in --budget ({left:.0f} s left)"
        logger.warning(why)
        self.skipped.append(why)
        self._plan_changed()

    def _candidates(self) -> dict[str, Candidate]:
        return group_by_config(self.records)

    def _leaders(self) -> list[Candidate]:
        top_k = max(LONG_LEADERS, self.settings.confirm_top_k) if self._long() else self.settings.confirm_top_k
        return leaders(self._candidates().values(), top_k)

    def _confirm(self) -> tuple[list[Candidate], list[Candidate]]:
        """Re-measure the leaders, interleaved, so that one lucky or unlucky window cannot crown a winner; returns every
        leader as re-measured and the finalists the winner is chosen among (confirmation.py)."""
        leaders = self._leaders()
        confirmation = Confirmation(
            measure=lambda leader: self._run_one("confirm", config_params(leader.config, self.space)),
            candidates=self._candidates,
            cost_s=lambda leader: self.budget.costs.of(leader.config, self.records) or 0.0,
            left_s=lambda: None if (left := self.budget.left_s()) is None else left - self._closing_s(),
        )
        if self._long() and len(leaders) > 1:
            time_s = min(LONG_CONFIRM_SHARE * (self.settings.budget_s or 0.0), confirmation.left_s() or 0.0)
            confirmed = confirmation.halving(leaders, time_s)
        else:
            confirmed = confirmation.uniform(leaders, self._rounds())
        return confirmed.leaders, confirmed.finalists

    def plan(self) -> BudgetPlan:
        """What the run intends for the rest of its budget, from the trials measured so far (budget.py)."""
        queue = self.warm_start or self.seeds
        comparable = self.budget.comparable(self._candidates().values())
        counted = sum(r.role != "confirm" and r.result.status != "precision" for r in self.records)
        reserve_s, trial_s = self._reserve_s(), self.budget.costs.search_trial_s(self.records)
        # a long run's halving: as many trials as its room holds (_long() implies a measured trial_s)
        confirmations = int(reserve_s // trial_s) if self._long() else len(self._leaders()) * self._rounds()
        state = PlanState(
            queued_s=tuple(self._queued_s(params) for _, params in queue),
            skipped=len(self.skipped),
            confirmations=confirmations if comparable else 0,
            searches_left=max(0, self.settings.trials - counted - len(queue)),
            reserve_s=reserve_s,
            closing_s=self._closing_s(),
        )
        return self.budget.plan(self.records, state, self.before)

    def _plan_changed(self) -> None:
        self.reporter.plan_changed(self.plan())
