"""Confirmation: the leaders re-measured, interleaved, before the winner is chosen on medians.

Two ways, by how many trials the run can afford:

- **Uniform** (a short run, as a CPU's few-minute budget or the default 24 trials): the top three re-measured twice
  each. A short budget is better spent finding candidates than re-measuring them, and it has no trials to spare.
- **Sequential halving** (a run whose budget and --trials hold LONG_RUN_TRIALS search trials or more, as a GPU run's
  hour): LONG_LEADERS leaders and LONG_CONFIRM_SHARE of the budget; each round spends an equal share of that time on
  the leaders still in it and keeps the better half by median, until two remain (Karnin, Koren and Somekh, "Almost
  optimal exploration in multi-armed bandits", ICML 2013: the fixed-budget best-arm identification of this shape).
  Why: where many configurations lie within a few per cent of the best (a data-bound model), the search measures a
  configuration close to the best, but its single window is often low enough to leave it out of the top three, and
  three windows per leader cannot separate 2-3%. Re-measuring more leaders and spending the windows where the race is
  close picks the best more often (the simulated conformer: docs/how-it-measures.md, step 7, and
  benchmarks/README.md#search-at-gpu-scale-simulated).

A leader's share of a halving round goes to as few trials as the longest window allows (LONGEST_WINDOW_FACTOR):
each trial pays start-up and warm-up again, while a GPU window's noise is white (it falls with the window's length:
benchmarks/README.md#short-budgets-and-what-a-trial-costs), so one window twice as long is worth two.
Interleaving stays: every round measures every leader still in it, and a round whose share holds more than the
longest window measures each leader more than once, in turn. Windows then differ in length, and count by it
(candidates.weighted_logs).

Once confirmation has re-measured leaders enough to know the window noise (pooling.MIN_REPEAT_DF), a long run's
halving keeps, and the winner rule chooses, by each leader's pooled estimate: its own windows and its neighbours'
(search/pooling.py). A short run stays on medians. Either way the winner's reported speed stays the median of its own
windows.

Confirmation measures in passes, every leader still in the race once, in turn. A pass the budget cuts short (trials
longer than planned, as under someone else's load) is set aside: its windows stay in the records and the report, but
the finalists are compared, and the winner summarised, without them. They came from minutes the leaders it did not
reach were never measured in: under someone else's load they pull exactly the leaders it reached down, and could
crown one it did not (the case: docs/how-it-measures.md, step 7; tests/search/test_confirmation.py replays it).

On a busy machine (other processes took a share of the CPU in some leader's window: machine/cpu_load.py) the passes
are what makes leaders comparable, so they are compared as a paired design, each pass a block. A window in which
others took BUSY_OTHERS_FRACTION more of the CPU than in the pass's quietest (or which the trial found disturbed) is
re-measured at once, at the end of its pass, and the pass compares the quieter of the two: a window that measured
someone else's job is replaced, not kept. Then each leader's rate in a pass is taken relative to the pass's
geometric mean, and a short run's winner is chosen by the median of those (the "paired comparison"): a load that
lasts a pass falls on every leader alike and cancels, where medians over windows from different minutes would let it
choose the winner. The search's own windows, each from other minutes, are not compared; the winner's reported speed
stays the median of its own windows.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune.machine.cpu_load import BUSY_OTHERS_FRACTION
from autotune.search.candidates import Candidate, Estimates, TrialRecord, config_key, score
from autotune.search.pooling import pooled_estimates

__all__ = [
    "LONG_RUN_TRIALS",
    "LONG_CONFIRM_SHARE",
    "LONG_LEADERS",
    "LONGEST_WINDOW_FACTOR",
    "TIMEOUT_SHARE",
    "Confirmation",
    "Confirmed",
    "halving_rounds",
    "keep_better_half",
    "paired_estimates",
]

logger = logging.getLogger(__name__)

LONG_RUN_TRIALS = 40  # search trials a run must hold (by --budget and --trials) before confirmation takes a share
# Of the budget, for a long run's confirmation: less leaves the halving too few windows, more starves the search
# (benchmarks/README.md#search-at-gpu-scale-simulated).
LONG_CONFIRM_SHARE = 0.45
LONG_LEADERS = 8  # a long run's leaders: the best configuration's one search window is often low, out of the top three
# A long run's confirmation window is at most this many of the search's longest (TimingSettings.max_window_s: 160 s
# on a GPU's 40): a per-trial part of the noise, which no window length averages, is then still sampled twice by the
# last round; the cap costs the simulated conformer next to nothing
# (benchmarks/README.md#search-at-gpu-scale-simulated).
LONGEST_WINDOW_FACTOR = 4.0
# ...and the whole trial at most this share of --trial-timeout, start-up and warm-up included (180 of the default
# 300 s): a leader whose set-up is long (preloaded audio, a compile) gets a shorter window, never a timeout.
TIMEOUT_SHARE = 0.6


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
    """Every leader as re-measured (for the report), those the winner is chosen among (without the windows of a pass
    the budget cut short: set_aside of them), and the estimates it is chosen by (None: by median), named by basis."""

    leaders: list[Candidate]
    finalists: list[Candidate]
    estimates: Estimates = None
    set_aside: int = 0
    basis: str = "pooled estimate"


class Confirmation:
    """Re-measures leaders through the tuner's callbacks.

    Args:
        measure: runs one confirmation trial of a candidate, with a window of at least the given seconds (None: the
            trial's own rules).
        candidates: every configuration measured so far, by config_key (fresh after each trial).
        cost_s: a candidate's estimated trial cost (a trial starts only if it should end within left_s).
        left_s: seconds the budget has left, less the closing trials; None: no budget.
        longest_window_s: the longest window a halving round may ask of a trial; None: the trial's own rules alone.
        longest_trial_s: the longest a trial asked for a window may take, start-up and warm-up included.
    """

    def __init__(
        self,
        *,
        measure: Callable[[Candidate, float | None], object],
        candidates: Callable[[], dict[str, Candidate]],
        cost_s: Callable[[Candidate], float],
        left_s: Callable[[], float | None],
        longest_window_s: float | None = None,
        longest_trial_s: float = math.inf,
    ) -> None:
        self.measure, self.candidates, self.cost_s, self.left_s = measure, candidates, cost_s, left_s
        self.longest_window_s, self.longest_trial_s = longest_window_s, longest_trial_s
        self.set_aside: set[int] = set()  # record numbers of a pass the budget cut short (_each)
        self.passes: list[dict[str, list[int]]] = []  # each complete pass: config_key -> its record numbers in it

    def _fresh(self, leaders: Sequence[Candidate], *, compared: bool = False) -> list[Candidate]:
        by_key = self._compared() if compared else self.candidates()
        return [by_key[config_key(leader.config)] for leader in leaders]

    def _each(self, passes: Sequence[Sequence[tuple[Candidate, float | None]]]) -> bool:
        """Re-measure each pass's leaders in turn while they fit; whether all were. A pass the budget cuts short is set
        aside (compared): it measured some of the leaders and not the others, so its windows would be compared with
        none of the same minutes, and under someone else's load they pull exactly the leaders it measured down. A
        complete pass re-measures its disturbed windows (_remeasure_disturbed) and is kept for the paired comparison."""
        for trials in passes:
            before = self._numbers()
            measured: dict[str, list[int]] = {}
            for leader, window_s in trials:
                if not self._fits(leader, window_s):
                    cut = self._numbers() - before
                    self.set_aside |= cut
                    logger.warning(
                        "budget spent during confirmation; the winner rests on fewer measurements%s",
                        f" (the {len(cut)} window(s) of a pass that did not reach every leader are not compared)"
                        if cut
                        else "",
                    )
                    return False
                self._measure_into(measured, leader, window_s)
            self._remeasure_disturbed(trials, measured)
            self.passes.append(measured)
        return True

    def _fits(self, leader: Candidate, window_s: float | None) -> bool:
        left_s = self.left_s()
        parts = None if window_s is None else _parts_s(leader)
        cost_s = self.cost_s(leader) if parts is None else parts[0] + max(parts[1], window_s or 0.0)
        return left_s is None or cost_s <= left_s

    def _measure_into(self, measured: dict[str, list[int]], leader: Candidate, window_s: float | None) -> None:
        before = self._numbers()
        self.measure(leader, window_s)
        measured.setdefault(config_key(leader.config), []).extend(sorted(self._numbers() - before))

    def _remeasure_disturbed(
        self, trials: Sequence[tuple[Candidate, float | None]], measured: dict[str, list[int]]
    ) -> None:
        """Each leader whose window in this pass others disturbed beyond the pass's quietest is measured once more, at
        once, while the budget holds: the pass then compares its quieter window (_pass_values), not the load."""
        records = self._records(measured)
        if not records:
            return
        quietest = min(_others(record) for record in records.values())
        for leader, window_s in trials:
            mine = [records[number] for number in measured.get(config_key(leader.config), []) if number in records]
            if len(mine) != 1 or not _disturbed(mine[0], quietest):
                continue
            if not self._fits(leader, window_s):
                return
            logger.info(
                "re-measuring %s: other processes took %.0f%% of the CPU in its window, %.0f%% in its pass's quietest",
                leader.config.short(),
                100 * _others(mine[0]),
                100 * quietest,
            )
            self._measure_into(measured, leader, window_s)

    def _records(self, numbers: dict[str, list[int]]) -> dict[int, TrialRecord]:
        wanted = {number for group in numbers.values() for number in group}
        return {r.number: r for c in self.candidates().values() for r in c.records if r.number in wanted}

    def _numbers(self) -> set[int]:
        return {record.number for candidate in self.candidates().values() for record in candidate.records}

    def planned(self, leaders: Sequence[Candidate], time_s: float) -> int:
        """The trials halving would run in time_s, every round spending its share (the live display's plan)."""
        survivors, rounds, count = list(leaders), halving_rounds(len(leaders)), 0
        for _ in range(rounds):
            count += sum(len(trials) for trials in self._round(survivors, time_s / rounds))
            survivors = survivors[: math.ceil(len(survivors) / 2)]
        return count

    def _round(self, survivors: Sequence[Candidate], share_s: float) -> list[list[tuple[Candidate, float | None]]]:
        """A halving round's trials within share_s, interleaved in passes of every survivor once: each survivor's part
        of it in as few trials as the longest window allows, at least one trial each; without a longest window (or a
        survivor's measured parts), as many of its usual trials as fit."""
        known = [parts for c in survivors if (parts := _parts_s(c)) is not None]
        if self.longest_window_s is None or len(known) < len(survivors):
            cost_s = sum(self.cost_s(c) for c in survivors)
            repeats = max(1, int(share_s // cost_s)) if cost_s > 0 else 1
            return [[(c, None) for c in survivors] for _ in range(repeats)]
        slot_s = share_s / len(survivors)
        longest = [min(self.longest_window_s, self.longest_trial_s - fixed_s) for fixed_s, _ in known]
        trials = max(
            1,
            max(
                math.ceil(slot_s / (fixed_s + max(cap_s, own_s)))
                for (fixed_s, own_s), cap_s in zip(known, longest, strict=True)
            ),
        )
        windows = [
            wanted if (wanted := min(cap_s, slot_s / trials - fixed_s)) > own_s else None
            for (fixed_s, own_s), cap_s in zip(known, longest, strict=True)
        ]
        return [list(zip(survivors, windows, strict=True)) for _ in range(trials)]

    def uniform(self, leaders: list[Candidate], rounds: int) -> Confirmed:
        """Each leader re-measured `rounds` times, interleaved (a disturbed window once more, in its pass: _each); the
        winner chosen by median, or on a busy machine by the paired comparison of the complete passes."""
        self._each([[(leader, None) for leader in leaders] for _ in range(rounds)])
        confirmed = self._confirmed(leaders, leaders, estimates=False)
        feasible = [c for c in confirmed.finalists if c.feasible]
        estimates, passes = paired_estimates(feasible, self.passes, self._compared())
        if estimates is None:
            return confirmed
        return Confirmed(
            leaders=confirmed.leaders,
            finalists=confirmed.finalists,
            estimates=estimates,
            set_aside=confirmed.set_aside,
            basis=f"paired comparison over {passes} pass{'' if passes == 1 else 'es'}",
        )

    def halving(self, leaders: list[Candidate], time_s: float) -> Confirmed:
        """Sequential halving within time_s: each round spends an equal share of the time left on the leaders still
        in it (at least one trial each, interleaved: _round), then keeps the better half by median."""
        survivors, rounds = list(leaders), halving_rounds(len(leaders))
        started_left_s = self.left_s() or 0.0
        for done in range(rounds):
            left_s = time_s - (started_left_s - (self.left_s() or 0.0))  # of confirmation's time
            complete = self._each(self._round(survivors, left_s / (rounds - done)))
            survivors = self._fresh(survivors)
            if not complete:
                break
            if done < rounds - 1:
                survivors = keep_better_half(survivors, self._pooled())
        return self._confirmed(leaders, survivors, estimates=True)

    def _confirmed(self, leaders: Sequence[Candidate], finalists: Sequence[Candidate], *, estimates: bool) -> Confirmed:
        """Every leader with all its windows (the report's), the finalists without those set aside (_each), and the
        pooled estimates of those compared (a long run's)."""
        return Confirmed(
            leaders=self._fresh(leaders),
            finalists=self._fresh(finalists, compared=True),
            estimates=self._pooled() if estimates else None,
            set_aside=len(self.set_aside),
        )

    def _pooled(self) -> Estimates:
        return pooled_estimates(list(self._compared().values()))

    def _compared(self) -> dict[str, Candidate]:
        """Every configuration measured so far, without the windows set aside (_each)."""
        by_key = self.candidates()
        if not self.set_aside:
            return by_key
        return {
            key: Candidate(config=c.config, records=[r for r in c.records if r.number not in self.set_aside])
            for key, c in by_key.items()
        }


def _parts_s(candidate: Candidate) -> tuple[float, float] | None:
    """A candidate's trials as measured: the median time outside the window (start, set-up, warm-up, teardown) and its
    shortest window, the one its own rules give; None before a trial with both was measured."""
    timed = [r.result for r in candidate.records if r.result.feasible and r.result.wall_s and r.result.window_s]
    if not timed:
        return None
    outside = statistics.median(max(0.0, (r.wall_s or 0.0) - (r.window_s or 0.0)) for r in timed)
    return outside, min(r.window_s or 0.0 for r in timed)


def _others(record: TrialRecord) -> float:
    """Other processes' share of the CPU during the record's window (0 where unknown: a GPU's ranks)."""
    return record.result.others_cpu_fraction or 0.0


def _disturbed(record: TrialRecord, quietest: float) -> bool:
    """Disturbed beyond the pass: the trial found its window disturbed, or others took BUSY_OTHERS_FRACTION more of the
    CPU in it than in the pass's quietest window."""
    return record.result.disturbed or _others(record) - quietest >= BUSY_OTHERS_FRACTION


def _busy(candidates: Sequence[Candidate]) -> bool:
    """Whether other processes took a busy share of the CPU in any of these candidates' windows."""
    return any(r.result.disturbed or _others(r) >= BUSY_OTHERS_FRACTION for c in candidates for r in c.records)


def _pass_values(
    candidates: Sequence[Candidate], passes: Sequence[dict[str, list[int]]], compared: dict[str, Candidate]
) -> list[dict[str, float]]:
    """Each complete pass as each candidate's rate in it: its quietest feasible window there (a re-measured disturbed
    window is replaced by the quieter). A pass is complete when every candidate has a feasible window in it."""
    by_number = {r.number: r for c in compared.values() for r in c.records}
    keys = [config_key(c.config) for c in candidates]
    values = []
    for measured in passes:
        rates = {}
        for key in keys:
            feasible = [by_number[n] for n in measured.get(key, []) if n in by_number and by_number[n].result.feasible]
            if feasible and (quietest := min(feasible, key=_others)).value > 0:
                rates[key] = quietest.value
        if len(rates) == len(keys):
            values.append(rates)
    return values


def paired_estimates(
    candidates: Sequence[Candidate], passes: Sequence[dict[str, list[int]]], compared: dict[str, Candidate]
) -> tuple[Estimates, int]:
    """On a busy machine, each candidate's rate relative to the others in the same passes: per complete pass its log
    rate less the pass's mean (the load of that pass cancels), the median over passes, scaled back to samples/s by the
    candidates' geometric mean of medians (only the ranking is used; the reported speed stays each one's median).
    Returns the estimates and the complete passes they rest on; None on a quiet machine, for fewer than two
    candidates, or without a complete pass: then the medians decide."""
    if len(candidates) < 2 or not _busy(candidates):
        return None, 0
    values = _pass_values(candidates, passes, compared)
    if not values:
        return None, 0
    keys = [config_key(c.config) for c in candidates]
    relative: dict[str, list[float]] = {key: [] for key in keys}
    for rates in values:
        mean = statistics.fmean(math.log(rates[key]) for key in keys)
        for key in keys:
            relative[key].append(math.log(rates[key]) - mean)
    medians = [math.log(c.median) for c in candidates if c.median > 0]
    scale = statistics.fmean(medians) if medians else 0.0
    return {key: math.exp(scale + statistics.median(relative[key])) for key in keys}, len(values)
