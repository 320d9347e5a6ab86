"""Confirmation: three leaders twice on a short run, sequential halving of more leaders on a long one."""

from __future__ import annotations

import collections

import pytest

from autotune.knobs.config import TrialConfig
from autotune.search.candidates import Candidate, TrialRecord, config_key, group_by_config, pick_winner
from autotune.search.confirmation import (
    LONG_CONFIRM_SHARE,
    LONG_LEADERS,
    LONG_RUN_TRIALS,
    Confirmation,
    halving_rounds,
    is_long,
    keep_better_half,
)
from autotune.search.reporting import SilentReporter
from autotune.search.settings import TunerSettings
from autotune.trial import TrialResult
from tests.fixtures.tuners import cam_tuner


def _config(batch: int) -> TrialConfig:
    return TrialConfig(per_device_batch_size=batch, precision="bf16", intra_op_threads=2)


def _record(number: int, batch: int, rate: float, role: str = "search", others: float | None = None) -> TrialRecord:
    result = TrialResult(
        status="ok", samples_per_second=rate, window_samples_per_second=rate, wall_s=10.0, others_cpu_fraction=others
    )
    return TrialRecord(number=number, role=role, config=_config(batch), result=result)


def test_halving_runs_until_two_leaders_share_the_last_round():
    assert [halving_rounds(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [1, 1, 2, 2, 3, 3, 4]


def test_the_better_half_by_median_is_kept_and_a_previous_winner_whatever_its_rank():
    records = [
        _record(i, batch, rate) for i, (batch, rate) in enumerate([(8, 10.0), (16, 13.0), (32, 12.0), (64, 9.0)])
    ]
    records.append(_record(4, 64, 9.5, role="previous"))
    kept = keep_better_half(list(group_by_config(records).values()))
    assert [c.config.per_device_batch_size for c in kept] == [16, 32, 64]


def test_a_run_is_long_only_when_both_its_trials_and_its_budget_hold_enough_search_trials():
    assert is_long(trials=100, budget_s=LONG_RUN_TRIALS * 30.0, trial_s=30.0)
    assert not is_long(trials=24, budget_s=3600.0, trial_s=20.0)  # the default --trials: a CPU run as today
    assert not is_long(trials=100, budget_s=300.0, trial_s=25.0)  # a 5-minute CPU budget
    assert not is_long(trials=100, budget_s=None, trial_s=25.0)
    assert not is_long(trials=100, budget_s=3600.0, trial_s=0.0)  # nothing measured yet


class _Race:
    """Eight leaders with noise-free rates 100..93, each trial 10 s on a clock."""

    def __init__(self, budget_s: float) -> None:
        self.records = [_record(i, 8 * (i + 1), 100.0 - i) for i in range(8)]
        self.now, self.budget_s = 0.0, budget_s

    def measure(self, leader: Candidate, window_s: float | None = None) -> None:
        assert window_s is None  # records without a window's length: the trials' own rules
        self.now += 10.0
        rate = leader.records[0].value
        self.records.append(_record(len(self.records), leader.config.per_device_batch_size, rate, role="confirm"))

    def confirmation(self) -> Confirmation:
        return Confirmation(
            measure=self.measure,
            candidates=lambda: group_by_config(self.records),
            cost_s=lambda candidate: 10.0,
            left_s=lambda: self.budget_s - self.now,
        )


def test_sequential_halving_spends_an_equal_share_per_round_on_fewer_leaders_and_ends_with_the_best_two():
    race = _Race(budget_s=1000.0)
    leaders = list(group_by_config(race.records).values())
    confirmed = race.confirmation().halving(leaders, time_s=480.0)
    windows = collections.Counter(config_key(r.config) for r in race.records if r.role == "confirm")
    by_rank = [windows[config_key(c.config)] for c in leaders]
    # 160 s a round: 8 leaders x 2, then 4 x 4, then 2 x 8.
    assert by_rank == [14, 14, 6, 6, 2, 2, 2, 2]
    assert race.now == pytest.approx(480.0)
    assert [c.config.per_device_batch_size for c in confirmed.finalists] == [8, 16]
    assert len(confirmed.leaders) == 8 and all(len(c.values) > 1 for c in confirmed.leaders)


def test_sequential_halving_stops_when_the_budget_does_and_chooses_among_the_round_it_reached():
    race = _Race(budget_s=100.0)
    leaders = list(group_by_config(race.records).values())
    confirmed = race.confirmation().halving(leaders, time_s=480.0)
    assert race.now == 100.0  # ten of the first round's sixteen windows fitted: all eight are still in the race
    assert len(confirmed.finalists) == 8
    # the second pass reached two of the eight: its windows are in the report, not in the comparison
    assert confirmed.set_aside == 2
    assert [len(c.values) for c in confirmed.leaders] == [3, 3, 2, 2, 2, 2, 2, 2]
    assert [len(c.values) for c in confirmed.finalists] == [2] * 8


def test_a_pass_the_budget_cuts_short_under_someone_elses_load_does_not_crown_the_leader_it_did_not_reach():
    """The README's first command on a loaded machine: another job loaded the machine during confirmation, the two
    leaders re-measured read 2.0 and 4.7 samples/s (15.3 quiet), the budget ended before the third, measured once at
    14.4, and the medians crowned it. Compared on the same passes, the fastest stays the winner."""
    records = [_record(0, 64, 15.3), _record(1, 48, 15.2), _record(2, 32, 14.4)]
    loaded = {64: 2.0, 48: 4.7, 32: 3.0}
    now = [0.0]

    def measure(leader: Candidate, window_s: float | None) -> None:
        now[0] += 100.0
        batch = leader.config.per_device_batch_size
        records.append(_record(len(records), batch, loaded[batch], role="confirm"))

    confirmation = Confirmation(
        measure=measure,
        candidates=lambda: group_by_config(records),
        cost_s=lambda candidate: 100.0,
        left_s=lambda: 250.0 - now[0],
    )
    leaders = list(group_by_config(records).values())
    confirmed = confirmation.uniform(leaders, rounds=2)
    assert now[0] == 200.0 and confirmed.set_aside == 2
    assert [c.values for c in confirmed.leaders] == [[15.3, 2.0], [15.2, 4.7], [14.4]]
    winner, _ = pick_winner(confirmed.finalists, confirmed.estimates)
    assert winner is not None and winner.config.per_device_batch_size == 64 and winner.values == [15.3]
    # a complete pass is compared as measured, loaded or not: every leader had the same minutes
    records[3:] = []
    now[0] = 0.0
    complete = Confirmation(
        measure=measure,
        candidates=lambda: group_by_config(records),
        cost_s=lambda candidate: 100.0,
        left_s=lambda: 450.0 - now[0],
    ).uniform(leaders, rounds=2)
    assert complete.set_aside == 1  # the second pass reached the first leader only
    assert [c.values for c in complete.finalists] == [[15.3, 2.0], [15.2, 4.7], [14.4, 3.0]]


def test_a_long_run_confirms_more_leaders_by_halving_and_a_short_run_three_leaders_twice(tmp_path, cpu_hardware):
    """The real Tuner on a clock: 10-s trials whose rate grows a little with the batch and falls a little with the
    workers (all within CONTENDER_FRACTION of each other)."""
    now = [0.0]

    def launcher(spec, **kwargs) -> TrialResult:
        window_s = max(7.0, spec.timing.window_at_least_s)  # 3 s outside the window
        now[0] += 3.0 + window_s
        config = spec.config
        rate = 100.0 * (1.0 + config.per_device_batch_size / 1000) / (1.0 + config.num_workers / 50)
        return TrialResult(
            status="ok",
            samples_per_second=rate,
            window_samples_per_second=rate,
            wall_s=3.0 + window_s,
            window_s=window_s,
        )

    planned: list[int] = []  # the live display's planned confirmations, before the first one ran

    class Plans(SilentReporter):
        def plan_changed(self, plan) -> None:
            stage = next(stage for stage in plan.stages if stage.name == "confirmation")
            if stage.done == 0:
                planned.append(stage.planned)

    def confirms(settings: TunerSettings) -> tuple[collections.Counter, object]:
        now[0] = 0.0
        planned.clear()
        tuner = cam_tuner(tmp_path, cpu_hardware, settings, launcher=launcher, clock=lambda: now[0], reporter=Plans())
        outcome = tuner.run()
        timed: collections.Counter = collections.Counter()  # window seconds by configuration
        for record in outcome.records:
            if record.role == "confirm":
                timed[config_key(record.config)] += record.result.window_s
        return timed, outcome

    long_run, outcome = confirms(TunerSettings(trials=1000, budget_s=1000.0, prune=False))
    confirm_trials = [r for r in outcome.records if r.role == "confirm"]
    assert len(long_run) == LONG_LEADERS
    assert sum(r.result.wall_s for r in confirm_trials) == pytest.approx(LONG_CONFIRM_SHARE * 1000.0, abs=30.0)
    assert max(long_run.values()) > 2 * min(long_run.values())  # the leaders still in the race were measured longer
    assert outcome.winner is not None and long_run[config_key(outcome.winner.config)] == max(long_run.values())
    # 450 s in three rounds of 150, each leader's share of a round in one trial: windows of 15.75, 34.5 and 72 s
    # (3 s of each trial outside its window), where the search measured 7 s
    assert planned[-1] == len(confirm_trials) == 8 + 4 + 2
    assert max(r.result.window_s for r in confirm_trials) > 7.0

    short_run, _ = confirms(TunerSettings(trials=24, budget_s=1000.0, prune=False))
    # three leaders twice, each trial at its own 7-s window: no longer windows on a short run
    assert len(short_run) == 3 and set(short_run.values()) == {2 * 7.0} and planned[-1] == 6


def test_a_long_runs_round_measures_each_leaders_share_in_long_windows_that_never_reach_the_trial_timeout():
    """Each leader's share of a round in as few trials as the longest window allows (160 s here); a leader whose
    set-up takes 150 s (preloaded audio, a compile) would pass 180 s (TIMEOUT_SHARE of a 300-s --trial-timeout) with
    any longer window, so it is measured with its own rules' window, three times in turn."""
    records = [_record(0, 8, 100.0), _record(1, 16, 99.0)]
    records[0].result.wall_s, records[0].result.window_s = 10.0, 7.0  # 3 s outside the window
    records[1].result.wall_s, records[1].result.window_s = 157.0, 7.0  # 150 s outside it
    asked: list[tuple[int, float | None]] = []

    def measure(leader: Candidate, window_s: float | None) -> None:
        asked.append((leader.config.per_device_batch_size, window_s))
        records.append(_record(len(records), leader.config.per_device_batch_size, leader.records[0].value, "confirm"))

    confirmation = Confirmation(
        measure=measure,
        candidates=lambda: group_by_config(records),
        cost_s=lambda candidate: 10.0,
        left_s=lambda: None,
        longest_window_s=160.0,
        longest_trial_s=0.6 * 300.0,
    )
    leaders = list(group_by_config(records).values())
    assert confirmation.planned(leaders, 800.0) == 6
    confirmation.halving(leaders, time_s=800.0)  # one round: 400 s each, in three trials of at most 163 and 157 s
    assert [batch for batch, _ in asked] == [8, 16] * 3
    assert all(window == pytest.approx(400.0 / 3 - 3.0) for batch, window in asked if batch == 8)
    assert all(window is None for batch, window in asked if batch == 16)


def test_a_run_whose_confirmation_the_budget_cuts_under_load_keeps_the_fastest_and_says_why(
    tmp_path, cpu_hardware, tiny_corpus
):
    """The real Tuner on a clock: from the first re-measurement on, someone else's job makes every trial three times
    longer and five times slower, so the budget ends confirmation part-way through its first pass. The winner is the
    fastest as measured quiet, and the result says which windows were not compared."""
    from autotune.run import conclusion as run_result
    from autotune.run import runner
    from autotune.run.plan import RunRequest

    now, seen, loaded = [0.0], set(), [False]

    def launcher(spec, **kwargs) -> TrialResult:
        config = spec.config
        key = config_key(config)
        loaded[0] = loaded[0] or key in seen  # confirmation re-measures: the load begins
        seen.add(key)
        wall_s = 30.0 if loaded[0] else 10.0
        now[0] += wall_s
        rate = 100.0 * (1.0 + config.per_device_batch_size / 1000) / (1.0 + config.num_workers / 50)
        rate *= 1.0 + 0.01 * (config.precision == "bf16") + 0.002 * (config.intra_op_threads or 0)  # not tied
        rate /= 5.0 if loaded[0] else 1.0
        return TrialResult(
            status="ok", samples_per_second=rate, window_samples_per_second=rate, wall_s=wall_s, window_s=7.0
        )

    tuner = cam_tuner(
        tmp_path,
        cpu_hardware,
        TunerSettings(trials=24, budget_s=200.0, prune=False),
        launcher=launcher,
        clock=lambda: now[0],
    )
    outcome = tuner.run()
    confirms = [r for r in outcome.records if r.role == "confirm"]
    assert confirms and len(confirms) < len(outcome.confirmed)  # the first pass did not reach every leader
    quiet = {r.key: r.value for r in outcome.records if r.role != "confirm"}
    assert outcome.winner is not None and outcome.winner.values == [max(quiet.values())]
    assert outcome.set_aside == len(confirms)
    plan = runner.prepare(RunRequest(model="cam++", data=str(tiny_corpus), results_dir=str(tmp_path / "results")))
    notes = run_result.tuned_config(plan, outcome).notes
    assert any(f"its {len(confirms)} window(s), of only some of them" in note for note in notes)


def test_on_a_busy_machine_the_passes_decide_and_another_jobs_load_cannot_choose_the_winner():
    """The peers' case on a 2-core machine: the leaders' search windows came from different minutes of other jobs'
    load. In the first pass another job took 30% of the CPU during leader 64's window only (5.4 against its 9.5); in
    the second it took 30% during all three. Leader 64 is the fastest in every pass once its disturbed window is
    measured again; by medians over every window, leader 48 would win on its lucky quiet search window."""
    records = [_record(0, 64, 11.8, others=0.25), _record(1, 48, 11.0, others=0.02), _record(2, 32, 8.0, others=0.3)]
    # each leader's windows in order: the first pass (64's disturbed, then its re-measurement), the second pass
    planned = {64: [(5.4, 0.3), (9.5, 0.02), (6.0, 0.3)], 48: [(9.0, 0.02), (5.5, 0.3)], 32: [(8.5, 0.02), (5.2, 0.3)]}
    order = []

    def measure(leader: Candidate, window_s: float | None) -> None:
        batch = leader.config.per_device_batch_size
        rate, others = planned[batch].pop(0)
        order.append(batch)
        records.append(_record(len(records), batch, rate, role="confirm", others=others))

    confirmation = Confirmation(
        measure=measure, candidates=lambda: group_by_config(records), cost_s=lambda c: 10.0, left_s=lambda: None
    )
    confirmed = confirmation.uniform(list(group_by_config(records).values()), rounds=2)
    assert order == [64, 48, 32, 64, 64, 48, 32]  # the disturbed window measured again at the end of its pass
    assert all(not left for left in planned.values())
    by_median, _ = pick_winner(confirmed.finalists)
    assert by_median is not None and by_median.config.per_device_batch_size == 48
    winner, why = pick_winner(confirmed.finalists, confirmed.estimates, by=confirmed.basis)
    assert winner is not None and winner.config.per_device_batch_size == 64
    assert why == "fastest by paired comparison over 2 passes"
    assert winner.values == [11.8, 5.4, 9.5, 6.0]  # its reported speed stays the median of its own windows


def test_on_a_quiet_machine_the_medians_decide_as_before():
    records = [_record(0, 64, 10.0, others=0.01), _record(1, 48, 9.0, others=0.02)]
    follow = {64: [9.8, 10.1], 48: [9.2, 9.1]}

    def measure(leader: Candidate, window_s: float | None) -> None:
        batch = leader.config.per_device_batch_size
        records.append(_record(len(records), batch, follow[batch].pop(0), role="confirm", others=0.02))

    confirmed = Confirmation(
        measure=measure, candidates=lambda: group_by_config(records), cost_s=lambda c: 10.0, left_s=lambda: None
    ).uniform(list(group_by_config(records).values()), rounds=2)
    assert confirmed.estimates is None and len(records) == 6  # nothing re-measured, nothing paired
    winner, why = pick_winner(confirmed.finalists, confirmed.estimates, by=confirmed.basis)
    assert winner is not None and winner.config.per_device_batch_size == 64 and why == "fastest by median"
