"""Confirmation: the leaders re-measured, interleaved, before the winner is chosen on medians.

Two ways, by how many trials the run can afford:

- **Uniform** (a short run, as a CPU's few-minute budget or the default 24 trials): the top three re-measured twice
  each. A short budget is better spent finding candidates than re-measuring them, and it has no trials to spare.
- **Sequential halving** (a run whose budget and --trials hold LONG_RUN_TRIALS search trials or more, as a GPU run's
  hour): LONG_LEADERS leaders and LONG_CONFIRM_SHARE of the budget; each round spends an equal share of that time on
  the leaders still in it and keeps the better half by median, until two remain (Karnin, Koren and Somekh, "Almost
  optimal exploration in multi-armed bandits", ICML 2013: the fixed-budget best-arm identification of this shape).
  Why: on benchmarks/simulate.py's data-bound conformer (5% window noise; many configurations within a few per cent
  of the best) every search measured a configuration within 2% of the best, but its single window was often 5-7%
  low, out of the top three, and three windows per leader cannot separate 2-3% (a median of three has ~3.6% standard
  error). Re-measuring more leaders and spending the windows where the race is close took the share of searches
  within 2% of the best from 56% to about 85% (benchmarks/results/simulate-confirmation.md).

Once confirmation has re-measured leaders enough to know the window noise (pooling.MIN_REPEAT_DF), a long run's
halving keeps, and the winner rule chooses, by each leader's pooled estimate: its own windows and its neighbours'
(pooling.py). A short run stays on medians. Either way the winner's reported speed stays the median of its own windows.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune.candidates import Candidate, Estimates, config_key, score
from autotune.pooling import pooled_estimates

__all__ = [
    "LONG_RUN_TRIALS",
    "LONG_CONFIRM_SHARE",
    "LONG_LEADERS",
    "Confirmation",
    "Confirmed",
    "halving_rounds",
    "keep_better_half",
]

logger = logging.getLogger(__name__)

LONG_RUN_TRIALS = 40  # search trials a run must hold (by --budget and --trials) before confirmation takes a share
LONG_CONFIRM_SHARE = 0.45  # of the budget, for a long run's confirmation (simulate.py: 40-50% alike, 25% too little)
LONG_LEADERS = 8  # a long run's leaders: the best configuration's one search window is often 5-7% low


def is_long(*, trials: int, budget_s: float | None, trial_s: float) -> bool:
    """Whether a run holds LONG_RUN_TRIALS search trials of trial_s, by --trials and by --budget (then confirmation
    takes LONG_CONFIRM_SHARE of the budget for sequential halving); a shorter run keeps three leaders twice, every
    trial it can spare going to the search. The default 24 trials is never long, whatever the budget."""
    return budget_s is not None and trial_s > 0 and trials >= LONG_RUN_TRIALS and budget_s >= LONG_RUN_TRIALS * trial_s


def halving_rounds(leaders: int) -> int:
    """Rounds of sequential halving until two leaders remain in the last: 8 -> 4 -> 2 is three rounds."""
    return max(1, math.ceil(math.log2(max(leaders, 2))))


def keep_better_half(candidates: Sequence[Candidate], estimates: Estimates = None) -> list[Candidate]:
    """The better half (rounded up) by pooled estimate where there is one (pooling.py), else by median; and a rerun's
    previous winner whatever its rank (the drift check compares the median of its measurements, so it stays
    re-measured)."""
    ranked = sorted(candidates, key=lambda c: -score(c, estimates))
    kept = ranked[: max(1, math.ceil(len(ranked) / 2))]
    return kept + [c for c in ranked if c not in kept and c.is_previous]


@dataclass(frozen=True, kw_only=True, slots=True)
class Confirmed:
    """Every leader as re-measured (for the report), those the winner is chosen among, and the pooled estimates
    it is chosen by (None: by median)."""

    leaders: list[Candidate]
    finalists: list[Candidate]
    estimates: Estimates = None


class Confirmation:
    """Re-measures leaders through the tuner's callbacks.

    Args:
        measure: runs one confirmation trial of a candidate.
        candidates: every configuration measured so far, by config_key (fresh after each trial).
        cost_s: a candidate's estimated trial cost (a trial starts only if it should end within left_s).
        left_s: seconds the budget has left, less the closing trials; None: no budget.
    """

    def __init__(
        self,
        *,
        measure: Callable[[Candidate], object],
        candidates: Callable[[], dict[str, Candidate]],
        cost_s: Callable[[Candidate], float],
        left_s: Callable[[], float | None],
    ) -> None:
        self.measure, self.candidates, self.cost_s, self.left_s = measure, candidates, cost_s, left_s

    def _fresh(self, leaders: Sequence[Candidate]) -> list[Candidate]:
        by_key = self.candidates()
        return [by_key[config_key(leader.config)] for leader in leaders]

    def _each(self, leaders: Sequence[Candidate]) -> bool:
        """Re-measure each in turn while it fits; whether all were."""
        for leader in leaders:
            left_s = self.left_s()
            if left_s is not None and self.cost_s(leader) > left_s:
                logger.warning("budget spent during confirmation; the winner rests on fewer measurements")
                return False
            self.measure(leader)
        return True

    def uniform(self, leaders: list[Candidate], rounds: int) -> Confirmed:
        """Each leader re-measured `rounds` times, interleaved; then one more round for the leaders with a window
        other processes disturbed (trial/child.py): their median then rests on more windows, from other minutes of
        the load."""
        if self._each([leader for _ in range(rounds) for leader in leaders]) and rounds:
            disturbed = [c for c in self._fresh(leaders) if any(r.result.disturbed for r in c.records)]
            self._each(disturbed)
        confirmed = self._fresh(leaders)
        return Confirmed(leaders=confirmed, finalists=confirmed)

    def halving(self, leaders: list[Candidate], time_s: float) -> Confirmed:
        """Sequential halving within time_s: each round spends an equal share of the time left on the leaders still
        in it (at least one window each, interleaved), then keeps the better half by median."""
        survivors, rounds = list(leaders), halving_rounds(len(leaders))
        started_left_s = self.left_s() or 0.0
        for done in range(rounds):
            left_s = time_s - (started_left_s - (self.left_s() or 0.0))  # of confirmation's time
            cost_s = sum(self.cost_s(c) for c in survivors)
            repeats = max(1, int(left_s / (rounds - done) // cost_s)) if cost_s > 0 else 1
            complete = self._each([c for _ in range(repeats) for c in survivors])
            survivors = self._fresh(survivors)
            if not complete:
                break
            if done < rounds - 1:
                survivors = keep_better_half(survivors, self._pooled())
        return Confirmed(leaders=self._fresh(leaders), finalists=self._fresh(survivors), estimates=self._pooled())

    def _pooled(self) -> Estimates:
        return pooled_estimates(list(self.candidates().values()))
