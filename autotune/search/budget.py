"""What a run intends to do with its budget, and what each next trial should cost: the plan, re-made after every
trial from the wall times measured so far.

A run's stages, in order: the AMP check, the baseline, the seeds (or a rerun's warm start), the search, the
confirmation of the leaders and the compute-only ceiling. `--budget` is a ceiling (a cluster job's time limit): no
trial starts that should end past it. Within it the plan follows three rules that short-budget runs on a 2-core CPU
showed were needed (benchmarks/results/budget-lab/NOTES.md):

- **Seeds before confirmation.** A seed only needs room for itself and the closing ceiling. Confirmation is kept
  room for only once there are two feasible configurations to compare: re-measuring a lone candidate while an
  unmeasured seed could run buys nothing (the 8-minute run that re-measured its baseline twice and ran no seed).
- **Each trial at its own cost.** The baseline (the recipe's batch, often the largest) is no estimate for a seed: a
  configuration measured before costs its own median wall time; one never measured costs what the window rules
  (trial/steady.py) give for the step time the measured throughput at its precision predicts for its batch; a search
  trial (its configuration unknown until asked) costs the median of the measured non-baseline trials. The run then
  uses the budget it was given instead of stopping when a baseline-sized trial no longer fits.
- **Confirmation compares leaders.** Its room is the leaders' own wall times times the repeats, at most
  CONFIRM_SHARE of the budget (a tight budget is better spent finding candidates than re-measuring them).

Two rules at the budget's edges. Before the first trial, a budget whose trials' share cannot hold one honest
measurement (shortest_trial_s: a full window by the rules, at a step too short to count) is refused with the budget
that would (Budget.check_fits_one), rather than spent on a trial the budget must stop. And a trial the budget stops
after its window timed enough keeps what it timed, a shorter window marked so (search/in_flight.py measure); the
result then says which windows were cut (cut_window_notes).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.errors import UserError
from autotune.search.candidates import Candidate, TrialRecord, config_key
from autotune.trial.steady import expected_trial_s, least_kept_trial_s

if TYPE_CHECKING:
    from autotune.knobs.config import TrialConfig
    from autotune.trial import TimingSettings

__all__ = [
    "BASELINE_STEP_OPTIMISM",
    "CONFIRM_SHARE",
    "PRIOR_FIXED_S",
    "Stage",
    "BudgetPlan",
    "BudgetTooShort",
    "PlanState",
    "TrialCosts",
    "Budget",
    "budget_that_holds",
    "cut_window_notes",
    "measurement_s",
    "shortest_trial_s",
]

CONFIRM_SHARE = 0.25  # of the budget, at most, kept for confirmation while the search runs
# A queued trial runs, with nothing but the baseline measured, while this share of its estimated cost is left
# (Budget.last_chance): skipping it would only hand back the recipe with time unused (docs/how-it-measures.md, step 3).
# Its estimate rests on the baseline's precision and threads: on a busy CPU the bf16 seeds on the free cores took
# 0.30-0.53 of it (benchmarks/README.md#a-busy-machine), and one the budget stops costs no more than the time left.
LAST_CHANCE_SHARE = 0.3
# Of the baseline's estimated step (run/preflight.py baseline_step_estimate), the least it is taken to be when a budget
# is refused: the estimate scales a small batch's compute to the recipe's and leaves the data pipeline out, and a
# CPU's step at one batch varies by a quarter between runs (benchmarks/README.md#short-budgets-and-what-a-trial-costs).
BASELINE_STEP_OPTIMISM = 0.7
PRIOR_FIXED_S = 5.0  # a trial's process start, setup and teardown before any was measured (2-core CPU: 3-4 s)
# roles whose wall time says little about a search trial's (a long run's confirmation may measure longer windows)
_NOT_ESTIMATES = ("baseline", "preload", "confirm")


class BudgetTooShort(UserError):
    """--budget leaves the trials less time than one honest measurement takes."""


def shortest_trial_s(timing: TimingSettings) -> float:
    """The least wall time any trial takes to time one full window by the rules (trial/steady.py), whatever its
    configuration: PRIOR_FIXED_S of process start and set-up, the shortest warm-up, and the window that so much
    start-up calls for, at a step too short to count (a millisecond)."""
    return expected_trial_s(1e-3, PRIOR_FIXED_S, timing)


def measurement_s(step_s: float, timing: TimingSettings) -> float:
    """What one honest measurement of a configuration whose steps take step_s should cost: a full trial by the window
    rules, and no less than the least trial whose window a budget may cut and keep (least_kept_trial_s)."""
    return max(expected_trial_s(step_s, PRIOR_FIXED_S, timing), least_kept_trial_s(step_s, PRIOR_FIXED_S, timing))


def budget_that_holds(spent_s: float, trial_s: float) -> int:
    """Whole minutes of --budget that hold what was spent before the trials and two trials of trial_s: the recipe's
    and one configuration to compare it with."""
    return math.ceil((spent_s + 2 * trial_s) / 60.0)


def cut_window_notes(records: Sequence[TrialRecord]) -> list[str]:
    """What the result should say about windows the budget cut (trial/loop.py measure): which, how long against
    what their rules asked for, and how much their throughput varied."""
    cut = [record for record in records if record.result.feasible and record.result.window_cut_by_budget]
    notes = []
    for record in cut:
        result = record.result
        spread = "" if result.throughput_cv is None else f", throughput CV {result.throughput_cv:.2f} across its parts"
        timed = f"{result.window_steps} steps over {result.window_s or 0.0:.0f} s"
        notes.append(
            f"the window of trial #{record.number} ({record.role}, {record.config.short()}) was shortened by --budget: "
            f"{timed} of the {result.window_planned_s or 0.0:.0f} s its rules asked for{spread}; a larger --budget "
            "measures it in full"
        )
    return notes


class TrialCosts:
    """Estimated wall seconds of a trial, from the trials measured so far."""

    def __init__(self, timing: TimingSettings) -> None:
        self.timing = timing

    def fixed_s(self, records: Sequence[TrialRecord]) -> float:
        """What a trial costs besides warm-up and window (process start, setup, teardown): the measured median."""
        parts = [
            r.result.wall_s - (r.result.warmup_s or 0.0) - r.result.window_s
            for r in records
            if r.result.wall_s and r.result.window_s
        ]
        return max(0.0, statistics.median(parts)) if parts else PRIOR_FIXED_S

    def of(self, config: TrialConfig, records: Sequence[TrialRecord]) -> float | None:
        """A configuration's trial: its own median wall if measured, else predicted from a similar one's
        throughput; None when nothing feasible has been measured."""
        key = config_key(config)
        own = [r for r in records if r.key == key]
        # a long run's confirmation trials may measure longer windows (search/confirmation.py): its other trials' walls
        # first
        walls = [r.result.wall_s for r in own if r.result.wall_s and r.role != "confirm"] or [
            r.result.wall_s for r in own if r.result.wall_s
        ]
        if walls:
            return statistics.median(walls)
        feasible = [r for r in records if r.result.feasible and r.result.window_samples_per_second]
        similar = [r for r in feasible if r.config.precision == config.precision] or feasible
        if not similar:
            return None
        # Samples per second per device barely depend on the batch within a space (per-sample cost), far more on
        # the precision: the step time a batch of this configuration should take.
        rate = statistics.median(
            r.result.window_samples_per_second / r.config.world_size
            for r in similar
            if r.result.window_samples_per_second  # all of them (feasible above): narrows the Optional
        )
        step_s = config.per_device_batch_size / rate  # a step of the loop is one micro-batch
        scan_s = statistics.median(r.result.worst_case_s or 0.0 for r in similar)
        return expected_trial_s(step_s, self.fixed_s(records) + scan_s, self.timing)

    def search_trial_s(self, records: Sequence[TrialRecord]) -> float:
        """A search trial, whose configuration the sampler chooses only when asked: the median measured trial that
        was not the baseline (the recipe's batch is often the space's largest), else the median of all."""
        walls = [r.result.wall_s for r in records if r.result.wall_s and r.role not in _NOT_ESTIMATES]
        walls = walls or [r.result.wall_s for r in records if r.result.wall_s]
        return statistics.median(walls) if walls else 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Stage:
    """One stage of the plan: trials done and still planned, seconds spent and still expected."""

    name: str
    done: int = 0
    planned: int = 0  # still to run (the search: as many as the time left should hold)
    spent_s: float = 0.0
    expected_s: float = 0.0  # for the planned ones
    note: str = ""

    def describe(self) -> str:
        if not self.done and not self.planned:
            return f"{self.name} {self.note or '-'}"
        count = f"{self.done}/{self.done + self.planned}" if self.planned else f"{self.done} done"
        cost = f", ~{self.expected_s:.0f} s more" if self.planned and self.expected_s else ""
        return f"{self.name} {count}{cost}" + (f" ({self.note})" if self.note else "")


@dataclass(frozen=True, kw_only=True, slots=True)
class BudgetPlan:
    """The run's intentions for its budget and how far it got: what the live display and the summary show."""

    budget_s: float | None  # of the whole run
    elapsed_s: float  # of the whole run, the time before the trials included
    stages: tuple[Stage, ...] = field(default_factory=tuple)

    def describe(self) -> str:
        if self.budget_s is None:
            head = f"{self.elapsed_s / 60:.1f} min so far (no budget)"
        else:
            head = f"{self.elapsed_s / 60:.1f} of {self.budget_s / 60:.1f} min"
        return f"plan: {head}: " + " | ".join(stage.describe() for stage in self.stages)

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget_s": self.budget_s,
            "elapsed_s": round(self.elapsed_s, 1),
            "stages": [
                {"name": s.name, "done": s.done, "planned": s.planned, "spent_s": round(s.spent_s, 1), "note": s.note}
                for s in self.stages
            ],
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanState:
    """Where the search stands, as the tuner sees it: what the plan is made from besides the records."""

    queued_s: tuple[float, ...]  # each seed (or warm-start trial) still to run, at its estimated cost
    skipped: int  # queued trials there was no room for
    confirmations: int  # re-measurements still wanted (0 until two feasible configurations can be compared)
    searches_left: int  # by --trials
    reserve_s: float  # kept for confirmation while the search runs
    closing_s: float  # kept for the trials after confirmation (the ceiling)


def _stage(name: str, records: Sequence[TrialRecord], roles: tuple[str, ...], **rest: Any) -> Stage:
    mine = [r for r in records if r.role in roles]
    return Stage(name=name, done=len(mine), spent_s=sum(r.result.wall_s or 0.0 for r in mine), **rest)


class Budget:
    """The clock and the room left: whether a trial of a given cost may start, and the plan for the rest.

    Args:
        budget_s: seconds the trials may take (the run's budget less what it spent before them); None: no limit.
        timing: the window rules, for trials not measured yet.
        clock: seconds, monotonic (the replay benchmark advances its own).
        spent_before_s: what the run spent before the trials (input checks, calibration, AMP check), for the plan.
    """

    def __init__(
        self,
        budget_s: float | None,
        timing: TimingSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        spent_before_s: float = 0.0,
        closing_trials: int = 0,
    ) -> None:
        self.budget_s, self.clock, self.spent_before_s = budget_s, clock, spent_before_s
        self.costs = TrialCosts(timing)
        self.closing_trials = closing_trials
        self._started = clock()

    def elapsed_s(self) -> float:
        return self.clock() - self._started

    def left_s(self) -> float | None:
        return None if self.budget_s is None else self.budget_s - self.elapsed_s()

    def fits(self, cost_s: float, keep_s: float = 0.0) -> bool:
        """A trial of cost_s, started now, should end with keep_s still left."""
        left = self.left_s()
        return left is None or cost_s + keep_s <= left

    def check_fits_one(self, baseline_step_s: float | None = None) -> None:
        """Before the first trial: refuse a budget whose trials' share cannot hold one honest measurement, saying
        which budget would. Such a trial could only be stopped, or give a window the budget cut; a run that could never
        measure is better refused now than after spending its budget.

        Without baseline_step_s, one honest measurement is a full window at a step too short to count
        (shortest_trial_s). With it (the step the baseline's trial should take, run/preflight.py
        baseline_step_estimate), it is the least the baseline's trial can keep even with its window cut
        (least_kept_trial_s) at BASELINE_STEP_OPTIMISM of that step, so that an estimate on the high side refuses
        nothing that could have been measured; the budget it names holds the baseline's full trial and one more.

        Raises:
            BudgetTooShort: with what the trials are left, what went before them, and the budget that would do.
        """
        left = self.left_s()
        if left is None or self.budget_s is None:
            return
        timing = self.costs.timing
        least = shortest_trial_s(timing)
        estimated = 0.0
        if baseline_step_s is not None and baseline_step_s > 0:
            estimated = least_kept_trial_s(BASELINE_STEP_OPTIMISM * baseline_step_s, PRIOR_FIXED_S, timing)
        if left >= max(least, estimated):
            return
        spent = self.spent_before_s + self.elapsed_s()
        before = f" once what came before them (input checks, data, AMP check) took {spent:.0f} s" if spent >= 1 else ""
        if estimated > least and baseline_step_s is not None:
            would = budget_that_holds(spent, measurement_s(baseline_step_s, timing))
            needs = (
                f"the recipe's configuration needs at least {estimated:.0f} s to be measured (its step should take "
                f"about {baseline_step_s:.0f} s here, by the AMP check's fp32 steps)"
            )
        else:
            would = math.ceil((spent + least) / 60.0)
            needs = f"one trial takes at least {least:.0f} s to time a full window (start, warm-up, window)"
        raise BudgetTooShort(
            f"--budget leaves {max(left, 0.0):.0f} s for the trials{before}, and {needs}: give --budget {would}m or "
            "more, or --budget none"
        )

    def last_chance(self, cost_s: float, measured_configs: int) -> bool:
        """Whether a queued trial of cost_s that may not end in time runs anyway: only while nothing but the baseline
        has been measured (measured_configs <= 1: skipping it leaves the recipe as the winner and the rest of the
        budget unused) and while at least LAST_CHANCE_SHARE of its estimate is left. Its estimate then rests on the
        baseline's precision and batch, and a seed is chosen to be faster."""
        left = self.left_s()
        return measured_configs <= 1 and left is not None and left >= LAST_CHANCE_SHARE * cost_s

    def closing_s(self, records: Sequence[TrialRecord], best: TrialRecord | None) -> float:
        """Room for the trials after confirmation (the compute-only ceiling of the winner, about the best's cost)."""
        if not self.closing_trials:
            return 0.0
        cost = self.costs.of(best.config, records) if best else None
        return self.closing_trials * (cost if cost is not None else self.costs.search_trial_s(records))

    @staticmethod
    def comparable(candidates: Iterable[Candidate]) -> bool:
        """Two feasible configurations are measured: confirmation has something to compare."""
        return sum(candidate.feasible for candidate in candidates) >= 2

    def reserve_s(
        self, candidates: Iterable[Candidate], leaders: Sequence[Candidate], repeats: int, share: float | None = None
    ) -> float:
        """Room kept for re-measuring the leaders while the search runs: their own wall times times the repeats, at
        most CONFIRM_SHARE of the budget, and none until two feasible configurations can be compared; with a share
        (a long run's sequential halving, search/confirmation.py), that share of the budget."""
        if not self.comparable(candidates) or repeats < 1:
            return 0.0
        if share is not None and self.budget_s is not None:
            return share * self.budget_s
        wanted = repeats * sum(statistics.median(r.result.wall_s or 0.0 for r in c.records) for c in leaders)
        return min(wanted, CONFIRM_SHARE * self.budget_s) if self.budget_s is not None else wanted

    def queued_s(self, config: TrialConfig, records: Sequence[TrialRecord]) -> float:
        """A queued trial (a seed, a warm start): its configuration's own estimate, else a search trial's."""
        cost = self.costs.of(config, records)
        return cost if cost is not None else self.costs.search_trial_s(records)

    def plan(self, records: Sequence[TrialRecord], state: PlanState, before: tuple[Stage, ...] = ()) -> BudgetPlan:
        """The stages with what is done and what the time left should still hold; the search gets what the queued
        trials, the confirmation room and the closing trials leave, in trials of its median cost."""
        search_s, left_s = self.costs.search_trial_s(records), self.left_s()
        searches = state.searches_left
        if left_s is not None and search_s > 0:
            room_s = left_s - sum(state.queued_s) - state.reserve_s - state.closing_s
            searches = min(searches, max(0, int(room_s // search_s)))
        confirmed = sum(r.role == "confirm" for r in records)
        stages = (
            *before,
            _stage("baseline", records, ("baseline",), planned=0 if records else 1),
            _stage(
                "seeds",
                records,
                ("seed", "warm", "previous"),
                planned=len(state.queued_s),
                expected_s=sum(state.queued_s),
                note=f"{state.skipped} skipped: no room" if state.skipped else "",
            ),
            _stage(
                "search",
                records,
                ("search", "preload"),
                planned=searches if search_s else 0,
                expected_s=searches * search_s,
                note="" if search_s else "the time the others leave",
            ),
            _stage(
                "confirmation",
                records,
                ("confirm",),
                planned=max(0, state.confirmations - confirmed),
                expected_s=state.reserve_s,
                note="" if state.confirmations else "once two configurations are measured",
            ),
            Stage(name="ceiling", planned=self.closing_trials, expected_s=state.closing_s),
        )
        total = None if self.budget_s is None else self.budget_s + self.spent_before_s
        return BudgetPlan(budget_s=total, elapsed_s=self.spent_before_s + self.elapsed_s(), stages=stages)
