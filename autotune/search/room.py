"""What the rest of a run's budget must keep, asked of the trials measured so far: who the leaders are, how
confirmation will re-measure them (three twice, or sequential halving on a long run: search/confirmation.py), the room
kept for that and for the closing trials, and whether another search trial fits before it.

The Tuner asks these questions before every trial and for its plan; they read only the settings, the budget and the
records, never the study or the search, so they live here rather than in the Tuner's loop.
"""

from __future__ import annotations

from collections.abc import Callable

from autotune.search.budget import Budget
from autotune.search.candidates import Candidate, TrialRecord, group_by_config, leaders
from autotune.search.confirmation import (
    LONG_CONFIRM_SHARE,
    LONG_LEADERS,
    LONGEST_WINDOW_FACTOR,
    TIMEOUT_SHARE,
    Confirmation,
    Confirmed,
    is_long,
)
from autotune.search.settings import TunerSettings

__all__ = ["Room"]


class Room:
    """The budget's questions about the records so far.

    Args:
        budget: the run's budget (its clock, costs and closing trials).
        settings: the run's settings (trial count, budget, confirmation's top_k and repeats).
        records: the run's records, the Tuner's own list (appended to as trials end).
    """

    def __init__(self, budget: Budget, settings: TunerSettings, records: list[TrialRecord]) -> None:
        self.budget, self.settings, self.records = budget, settings, records

    def candidates(self) -> dict[str, Candidate]:
        return group_by_config(self.records)

    def best(self) -> TrialRecord | None:
        feasible = [record for record in self.records if record.result.feasible]
        return max(feasible, key=lambda record: record.value, default=None)

    def closing_s(self) -> float:
        return self.budget.closing_s(self.records, self.best())

    def long(self) -> bool:
        """Long enough for sequential halving of more leaders (confirmation.is_long)."""
        trials, budget_s = (self.settings.trials if self.settings.confirm_top_k > 0 else 0), self.settings.budget_s
        return is_long(trials=trials, budget_s=budget_s, trial_s=self.budget.costs.search_trial_s(self.records))

    def rounds(self) -> int:
        return self.settings.confirm_repeats if self.settings.confirm_top_k > 0 else 0

    def leaders(self) -> list[Candidate]:
        top_k = max(LONG_LEADERS, self.settings.confirm_top_k) if self.long() else self.settings.confirm_top_k
        return leaders(self.candidates().values(), top_k)

    def reserve_s(self) -> float:
        share = LONG_CONFIRM_SHARE if self.long() else None
        return self.budget.reserve_s(self.candidates().values(), self.leaders(), self.rounds(), share=share)

    def search_fits(self, spare_trials: int = 0) -> bool:
        """Another search trial (and spare_trials more) should end before the room kept for confirmation and the
        closing trials. The budget is a ceiling (a job's time limit on a cluster), not the last moment to start."""
        cost = (1 + spare_trials) * self.budget.costs.search_trial_s(self.records)
        return self.budget.fits(cost, keep_s=self.reserve_s() + self.closing_s())

    def confirmations(self) -> int:
        """Confirmation trials planned: a long run's halving as many as its room holds in its rounds (long() implies
        a measured search trial), else each leader `rounds` times; none until two configurations can be compared."""
        if not self.budget.comparable(self.candidates().values()):
            return 0
        if self.long():
            return self._confirmation(lambda leader, window_s: None).planned(self.leaders(), self.reserve_s())
        return len(self.leaders()) * self.rounds()

    def unconfirmed(self) -> Confirmed:
        """The leaders as they stand, the winner chosen among them by median (a run cut short before confirmation)."""
        leaders = self.leaders()
        return Confirmed(leaders=leaders, finalists=leaders)

    def longest_window_s(self) -> float:
        """The longest window a long run's confirmation asks of a trial (confirmation.LONGEST_WINDOW_FACTOR)."""
        return LONGEST_WINDOW_FACTOR * self.settings.timing.max_window_s

    def confirm(self, measure: Callable[[Candidate, float | None], object]) -> Confirmed:
        """Re-measure the leaders through measure, interleaved, so that one lucky or unlucky window cannot crown a
        winner; returns every leader as re-measured, the finalists the winner is chosen among and how
        (search/confirmation.py)."""
        leaders, confirmation = self.leaders(), self._confirmation(measure)
        if self.long() and len(leaders) > 1:
            time_s = min(LONG_CONFIRM_SHARE * (self.settings.budget_s or 0.0), confirmation.left_s() or 0.0)
            return confirmation.halving(leaders, time_s)
        return confirmation.uniform(leaders, self.rounds())

    def _confirmation(self, measure: Callable[[Candidate, float | None], object]) -> Confirmation:
        return Confirmation(
            measure=measure,
            candidates=self.candidates,
            cost_s=lambda leader: self.budget.costs.of(leader.config, self.records) or 0.0,
            left_s=lambda: None if (left := self.budget.left_s()) is None else left - self.closing_s(),
            longest_window_s=self.longest_window_s() if self.long() else None,
            longest_trial_s=TIMEOUT_SHARE * self.settings.trial_timeout_s,
        )
