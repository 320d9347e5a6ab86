"""The budget plan: what each trial should cost, what the run keeps room for, and short-budget CPU runs replayed on a
clock through the real Tuner."""

from __future__ import annotations

import re

import pytest

from autotune.knobs.config import TrialConfig
from autotune.search.budget import CONFIRM_SHARE, Budget, BudgetTooShort, TrialCosts, shortest_trial_s
from autotune.search.candidates import Candidate, TrialRecord
from autotune.search.settings import TunerSettings
from autotune.trial import TimingSettings, TrialResult
from autotune.trial.steady import expected_trial_s
from tests.fixtures.tuners import cam_tuner

FP32_64 = TrialConfig(per_device_batch_size=64, num_workers=2, prefetch_factor=2, precision="fp32", intra_op_threads=2)
BF16_32 = TrialConfig(per_device_batch_size=32, precision="bf16", intra_op_threads=2)


def _result(rate: float, wall_s: float) -> TrialResult:
    """A measured trial: a fifth of its wall time warm-up, seven tenths window."""
    return TrialResult(
        status="ok",
        samples_per_second=rate,
        window_samples_per_second=rate,
        wall_s=wall_s,
        warmup_s=0.2 * wall_s,
        window_s=0.7 * wall_s,
    )


def _record(number: int, config: TrialConfig, rate: float, wall_s: float, role: str = "search") -> TrialRecord:
    return TrialRecord(number=number, role=role, config=config, result=_result(rate, wall_s))


def test_a_configuration_costs_its_own_wall_time_once_measured_and_a_prediction_before():
    costs = TrialCosts(TimingSettings())
    baseline = _record(0, FP32_64, 4.7, 128.0, role="baseline")
    assert costs.of(FP32_64, [baseline]) == 128.0
    assert costs.of(BF16_32, []) is None  # nothing measured: no prediction
    # No bf16 measured yet: the fp32 rate predicts a 6.8-s step for 32 samples, and the rules give its trial.
    unseen = costs.of(BF16_32, [baseline])
    assert unseen is not None and 30.0 < unseen < 128.0
    seed = _record(1, BF16_32, 14.0, 25.0, role="seed")
    other_bf16 = TrialConfig(per_device_batch_size=16, precision="bf16", intra_op_threads=2)
    fixed_s = costs.fixed_s([baseline, seed])
    assert fixed_s == pytest.approx((0.1 * 128 + 0.1 * 25) / 2)  # wall less warm-up and window, median
    # bf16's own rate: a 1.14-s step for 16 samples.
    assert costs.of(other_bf16, [baseline, seed]) == pytest.approx(
        expected_trial_s(16 / 14.0, fixed_s, TimingSettings())
    )


def test_a_search_trial_costs_what_the_non_baseline_trials_did():
    costs = TrialCosts(TimingSettings())
    baseline = _record(0, FP32_64, 4.7, 128.0, role="baseline")
    assert costs.search_trial_s([baseline]) == 128.0  # nothing else measured yet
    seeds = [_record(1, BF16_32, 14.0, 25.0, "seed"), _record(2, FP32_64, 4.0, 30.0, "seed")]
    assert costs.search_trial_s([baseline, *seeds]) == 27.5


def test_confirmation_is_kept_room_for_only_once_two_configurations_can_be_compared():
    budget = Budget(400.0, TimingSettings(), clock=lambda: 0.0)
    lone = Candidate(config=FP32_64, records=[_record(0, FP32_64, 4.7, 128.0)])
    assert budget.reserve_s([lone], [lone], repeats=2) == 0.0
    seed = Candidate(config=BF16_32, records=[_record(1, BF16_32, 14.0, 20.0)])
    assert budget.reserve_s([lone, seed], [seed], repeats=2) == 40.0  # the leaders' own walls x repeats
    assert budget.reserve_s([lone, seed], [seed, lone], repeats=2) == CONFIRM_SHARE * 400.0  # at most a quarter


def _issue_run(tmp_path, hardware, budget_s: float, baseline_s: float, trial_s: float):
    """The real Tuner over CAM++'s CPU space on a clock: the recipe baseline (fp32, batch 64) at 4.7 samples/s and
    baseline_s a trial, every bf16 configuration near 14 samples/s, every other one at 8; trial_s a trial."""
    now = [0.0]

    def launcher(spec, **kwargs) -> TrialResult:
        config = spec.config
        baseline = config.precision == "fp32" and config.per_device_batch_size == 64 and config.num_workers == 2
        wall = baseline_s if baseline else trial_s
        rate = 4.7 if baseline else 14.0 + config.per_device_batch_size / 64 if config.precision == "bf16" else 8.0
        now[0] += wall
        return _result(rate, wall)

    plans = []

    class Reporter:
        def trial_started(self, *args) -> None: ...

        def trial_finished(self, *args) -> None: ...

        def machine_measured(self, *args) -> None: ...

        def plan_changed(self, plan) -> None:
            plans.append(plan)

    settings = TunerSettings(trials=24, budget_s=budget_s, prune=False)
    tuner = cam_tuner(
        tmp_path, hardware, settings, launcher=launcher, clock=lambda: now[0], closing_trials=1, reporter=Reporter()
    )
    return tuner.run(), plans


def test_the_eight_minute_run_of_issue_18_measures_its_seeds_and_confirms_leaders_not_the_lone_baseline(
    tmp_path, cpu_hardware
):
    """On a CPU with --budget 8m, 40 s of AMP check and a 128-s baseline, the run stopped after the baseline and
    re-measured it twice (the median trial, the baseline's, did not fit twice with the reserve). Now both seeds
    run first, the search fills the time, and the leaders are confirmed."""
    outcome, plans = _issue_run(tmp_path, cpu_hardware, budget_s=440.0, baseline_s=128.0, trial_s=25.0)
    roles = [record.role for record in outcome.records]
    assert roles[:3] == ["baseline", "seed", "seed"]
    assert roles.count("search") >= 3 and roles[-1] == "confirm"
    confirmed = [record for record in outcome.records if record.role == "confirm"]
    assert all(record.config.precision == "bf16" for record in confirmed)  # never the 3x slower baseline
    assert outcome.winner.config.precision == "bf16"
    # The ceiling's room is kept, and the budget is used: no room was left for one more 25-s trial.
    assert outcome.elapsed_s + 25.0 <= 440.0 and outcome.elapsed_s + 2 * 25.0 > 440.0
    first, last = plans[0], plans[-1]
    assert [stage.name for stage in first.stages] == ["baseline", "seeds", "search", "confirmation", "ceiling"]
    assert (first.stages[1].done, first.stages[1].planned) == (0, 2)  # the plan before the first trial
    assert last.stages[1].done == 2 and last.stages[3].done == len(confirmed)


def test_a_seed_without_room_is_skipped_and_said_so_and_a_lone_candidate_is_not_re_measured_for_nothing(
    tmp_path, cpu_hardware
):
    """A budget the baseline nearly fills: the seeds do not fit, so they are skipped, and the baseline is re-measured
    only if that still fits."""
    outcome, plans = _issue_run(tmp_path, cpu_hardware, budget_s=135.0, baseline_s=128.0, trial_s=25.0)
    assert [record.role for record in outcome.records] == ["baseline"]
    assert outcome.stopped_by == "budget"
    assert "2 skipped: no room" in plans[-1].describe()
    # The result says so, each with the whole run's budget that would have held it (what it spent, and its estimate)
    assert len(outcome.skipped) == 2
    for said in outcome.skipped:
        match = re.search(r"skipped: no room left in --budget \((\d+) s left, it should take about (\d+) s; a --budget "
                          r"of (\d+)m would hold it\)", said)  # fmt: skip
        assert match is not None, said
        left, cost, minutes = (int(group) for group in match.groups())
        assert cost > left and (135 - left) + cost <= 60 * minutes < (135 - left) + cost + 60


def test_with_only_the_baseline_measured_a_seed_runs_on_part_of_its_estimate_and_wins(tmp_path, cpu_hardware, caplog):
    """Measured on a loaded 2-core machine (2026-11-24): the baseline took 147 s of a 5-min run, both seeds were
    skipped with 90 s left (their estimate rests on the fp32 baseline's rate), and the run ended at 2.4 min with
    the recipe as the winner. Now the first seed runs while LAST_CHANCE_SHARE of its estimate is left (the budget
    still stops it)."""
    outcome, plans = _issue_run(tmp_path, cpu_hardware, budget_s=190.0, baseline_s=128.0, trial_s=25.0)
    roles = [record.role for record in outcome.records]
    assert roles[:2] == ["baseline", "seed"]
    assert outcome.winner.config.precision == "bf16"
    assert outcome.elapsed_s <= 190.0
    assert "nothing but the baseline is measured yet" in caplog.text


def test_a_seed_runs_in_the_room_kept_for_the_closing_ceiling(tmp_path, cpu_hardware):
    """The README's first command beside the test suite: the first bf16 seed measured 1.2 samples/s on
    the loaded machine, which priced the second out of the 304 s left once the ceiling's 184 s were kept, and the run
    ended with the recipe as its winner (1.00x). A seed may be the winner, the ceiling only explains one: seeds keep
    no room for it (the ceiling is skipped, and says so, when they leave too little)."""
    now = [0.0]

    def launcher(spec, **kwargs) -> TrialResult:
        config = spec.config
        if config.precision == "fp32":  # the baseline
            wall, rate = 60.0, 4.7
        elif config.num_workers:  # the first seed, measured while other jobs took the CPU
            wall, rate = 100.0, 1.2
        else:
            wall, rate = 40.0, 14.0
        now[0] += wall
        return _result(rate, wall)

    # After 160 s, the second seed's estimate (from the first's 1.2 samples/s) is about 100 s, the ceiling's 60 s
    settings = TunerSettings(trials=3, budget_s=290.0, prune=False)
    tuner = cam_tuner(tmp_path, cpu_hardware, settings, launcher=launcher, clock=lambda: now[0], closing_trials=1)
    outcome = tuner.run()
    assert [record.role for record in outcome.records][:3] == ["baseline", "seed", "seed"]
    assert outcome.winner.config.num_workers == 0 and outcome.winner.config.precision == "bf16"


def test_a_trial_is_stopped_when_the_budget_runs_out_however_long_its_own_timeout(tmp_path, cpu_hardware):
    now, timeouts = [0.0], []

    def launcher(spec, *, timeout_s: float, **kwargs) -> TrialResult:
        timeouts.append(timeout_s)
        if len(timeouts) == 1:  # the baseline: 30 s
            now[0] += 30.0
            return _result(4.7, 30.0)
        now[0] += timeout_s  # a machine that got loaded: the seed runs until it is stopped
        return TrialResult(status="timeout", reason="no result", wall_s=timeout_s)

    settings = TunerSettings(trials=2, budget_s=100.0, trial_timeout_s=300.0, prune=False)
    outcome = cam_tuner(tmp_path, cpu_hardware, settings, launcher=launcher, clock=lambda: now[0]).run()
    assert timeouts == [100.0, 70.0] and outcome.elapsed_s == 100.0
    assert outcome.records[1].result.reason == "stopped when --budget ran out, after 70 s"


def test_a_confirmation_window_others_disturbed_is_re_measured_at_once_and_its_pass_compares_the_quieter(
    tmp_path, cpu_hardware
):
    """Two bf16 seeds as leaders; in the confirmation pass another job takes 60% of the CPU during the first one's
    window (6 samples/s against its 15.5). It is measured again at once, quiet, and the pass compares the quieter
    window: kept, the disturbed window would have handed the run to the other seed."""
    now = [0.0]
    windows: dict[int, int] = {}

    def launcher(spec, **kwargs) -> TrialResult:
        now[0] += 20.0
        workers = spec.config.num_workers
        if spec.config.precision != "bf16":
            return _result(5.0, 20.0)
        windows[workers] = windows.get(workers, 0) + 1
        confirming = windows[workers] > 1  # each seed's first window is its search trial
        if workers == 0 and windows[workers] == 2:
            result = _result(6.0, 20.0)
            result.others_cpu_fraction = 0.6
            return result
        result = _result(15.5 if workers == 0 and confirming else 15.0, 20.0)
        result.others_cpu_fraction = 0.05
        return result

    settings = TunerSettings(trials=3, budget_s=1000.0, confirm_top_k=2, confirm_repeats=1, prune=False)
    outcome = cam_tuner(tmp_path, cpu_hardware, settings, launcher=launcher, clock=lambda: now[0]).run()
    confirms = [r.config.num_workers for r in outcome.records if r.role == "confirm"]
    assert [r.role for r in outcome.records][:3] == ["baseline", "seed", "seed"]
    assert sorted(confirms) == [0, 0, 1]  # one pass of both seeds, and the disturbed window once more in it
    assert outcome.winner is not None and outcome.winner.config.num_workers == 0
    assert outcome.winner_reason == "fastest by paired comparison over 1 pass"
    assert outcome.winner.values == [15.0, 6.0, 15.5]  # every window stays in the record and the report


def test_a_rerun_whose_previous_winner_is_the_recipe_measures_it_once_and_the_budget_goes_to_the_others(
    tmp_path, cpu_hardware, caplog
):
    """A nightly rerun (--budget 5m, halved to 2.5): the previous winner was the recipe itself, so the run
    measured the baseline, then the same configuration again as "previous" until the budget stopped it, skipped both
    bf16 neighbours, and ended with "no stable configuration" although the baseline had measured ok. Now the previous
    winner is the baseline's measurement (the drift check compares it), and the neighbour runs instead."""
    from autotune.run import drift
    from autotune.search.candidates import config_params

    now, launched = [0.0], []

    def launcher(spec, **kwargs) -> TrialResult:
        launched.append(spec.config.precision)
        now[0] += 40.0
        return _result(12.0 if spec.config.precision == "bf16" else 5.8, 40.0)

    settings = TunerSettings(trials=4, budget_s=150.0, confirm_top_k=2, confirm_repeats=1, prune=False)
    probe = cam_tuner(tmp_path / "probe", cpu_hardware, settings)
    recipe = probe._config({**probe.space.fixed, **probe.space.baseline})
    neighbour = TrialConfig.from_dict({**recipe.to_dict(), "precision": "bf16"})
    warm = (("previous", config_params(recipe, probe.space)), ("warm", config_params(neighbour, probe.space)))
    tuner = cam_tuner(tmp_path, cpu_hardware, settings, launcher=launcher, clock=lambda: now[0], warm_start=warm)
    outcome = tuner.run()
    roles = [record.role for record in outcome.records]
    assert roles[:2] == ["baseline", "warm"] and "previous" not in roles
    assert launched[:2] == ["fp32", "bf16"]
    assert outcome.winner is not None and outcome.winner.config.precision == "bf16"
    again = drift.remeasured(outcome)
    assert again is not None and again.config == recipe and again.records[0].role == "baseline"
    assert outcome.baseline is not None and outcome.baseline.is_previous
    assert f"previous {recipe.short()} is not measured twice: trial #0 (baseline) measured" in caplog.text


def test_a_trial_the_budget_stopped_does_not_condemn_its_configuration(tmp_path, cpu_hardware):
    """The baseline measured ok; its re-measurement in confirmation ran into the end of --budget. That stop says
    nothing about the configuration: the baseline stays stable and wins (such a stop once left 'no stable
    configuration', exit 1), and the study holds the stopped trial as failed, so that its samplers and the next warm
    start leave it out."""
    import optuna

    now, timeouts = [0.0], []

    def launcher(spec, *, timeout_s: float, **kwargs) -> TrialResult:
        timeouts.append(timeout_s)
        if len(timeouts) == 3:  # the baseline's confirmation: a machine that got loaded runs until it is stopped
            now[0] += timeout_s
            return TrialResult(status="timeout", reason="no result", wall_s=timeout_s)
        now[0] += 30.0
        return _result(5.0 if spec.config.precision == "bf16" else 5.8, 30.0)

    settings = TunerSettings(trials=2, budget_s=100.0, trial_timeout_s=300.0, prune=False, confirm_repeats=1)
    tuner = cam_tuner(
        tmp_path, cpu_hardware, settings, launcher=launcher, clock=lambda: now[0], seeds=[{"precision": "bf16"}]
    )
    outcome = tuner.run()
    assert [record.role for record in outcome.records] == ["baseline", "seed", "confirm"]
    stopped = outcome.records[2].result
    assert (stopped.status, stopped.reason) == ("stopped", "stopped when --budget ran out, after 40 s")
    assert outcome.winner is not None and outcome.winner.config == outcome.records[0].config
    assert outcome.winner.median == 5.8 and outcome.winner.feasible
    states = [trial.state for trial in tuner.study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE] * 2 + [optuna.trial.TrialState.FAIL]


def test_a_measurement_that_rules_a_configuration_out_still_does_whatever_else_measured_it():
    ok, oom = _record(0, FP32_64, 5.0, 60.0), _record(1, FP32_64, 0.0, 10.0)
    oom.result = TrialResult(status="oom", reason="CUDA out of memory")
    assert not Candidate(config=FP32_64, records=[ok, oom]).feasible
    pruned = _record(2, FP32_64, 0.0, 10.0)
    pruned.result = TrialResult(status="pruned", reason="below half the best")
    assert Candidate(config=FP32_64, records=[ok, pruned]).feasible
    assert not Candidate(config=FP32_64, records=[pruned]).feasible  # nothing measured ok


def test_a_budget_that_stops_every_trial_says_the_budget_was_too_short_not_that_nothing_is_stable(
    tmp_path, tiny_corpus, monkeypatch
):
    """Found trying `--budget 1s` from outside: the data preparation and the AMP check took the budget, the baseline
    was stopped at once, and the run said "no stable configuration ... tune when it is quieter", which blamed the
    configurations and the machine's load for what was the budget. A budget under a minute is now bad input (exit 2
    before anything runs, tests/cli/test_cli.py); one that still stops every trial (a slow start, a long AMP check) says
    so. The floor is lowered here so that a real CPU trial is stopped within seconds, and so is the refusal of a
    budget that cannot hold one full window (test_a_budget_that_cannot_hold_one_full_window_is_refused_before_any_trial
    below), which would catch this one before its first trial."""
    import dataclasses

    from autotune.run import runner, validation
    from autotune.search import budget
    from tests.fixtures.runs import cam_grid_request

    monkeypatch.setattr(validation, "MIN_BUDGET_S", 0.5)
    monkeypatch.setattr(budget, "shortest_trial_s", lambda timing: 0.0)
    space = "params:\n  per_device_batch_size: {type: categorical, choices: [8, 16]}\nfixed: {num_workers: 0}\n"
    request = cam_grid_request(tmp_path, tiny_corpus, space, trials=2)
    request = dataclasses.replace(request, settings=dataclasses.replace(request.settings, budget_s=1.0))
    with pytest.raises(runner.TuningFailed) as failed:
        runner.execute(runner.prepare(request))
    message = str(failed.value)
    assert message.startswith("the --budget of 1 s ran out before any configuration was measured (")
    assert "trial(s) stopped" in message and message.endswith("give a larger --budget, or --budget none")
    assert "no stable configuration" not in message and "quieter" not in message


def test_a_budget_that_cannot_hold_one_full_window_is_refused_before_any_trial_with_the_budget_that_would():
    """Before the baseline, a trials' share below the shortest honest trial (start, warm-up and a full window at a
    step too short to count) is refused with the budget that would hold one, instead of being spent on a trial the
    budget can only stop."""
    timing = TimingSettings()  # a 10-s window: 5 s of start-up, 1 s of warm-up, a 24-s window
    assert shortest_trial_s(timing) == pytest.approx(30.0, abs=0.1)
    Budget(31.0, timing, clock=lambda: 0.0).check_fits_one()  # holds one
    Budget(None, timing, clock=lambda: 0.0).check_fits_one()  # no budget
    with pytest.raises(BudgetTooShort) as refused:
        Budget(20.0, timing, clock=lambda: 0.0, spent_before_s=40.0).check_fits_one()
    message = str(refused.value)
    assert message.startswith("--budget leaves 20 s for the trials once what came before them")
    assert "at least 30 s" in message and message.endswith("give --budget 2m or more, or --budget none")


def test_a_budget_that_cannot_measure_the_recipe_at_its_estimated_step_is_refused_with_the_budget_that_would():
    """CAM++ on this 2-core CPU: the AMP check's fp32 steps put the recipe's batch of 64 at about 13 s a step, and a
    --budget of 2m left the trials 66 s after 54 s of checks. At 0.7 of that step (the estimate leaves the pipeline
    out and may be high) the least trial a budget may cut and keep is 5 + 5.5 x 9.1 = 55 s: 66 s holds that, so the
    run goes on; 50 s does not, and the message names the step and a budget holding two full measurements."""
    from autotune.search.budget import BASELINE_STEP_OPTIMISM, budget_that_holds, measurement_s
    from autotune.trial.steady import least_kept_trial_s

    timing = TimingSettings()
    least = least_kept_trial_s(BASELINE_STEP_OPTIMISM * 13.0, 5.0, timing)
    assert least == pytest.approx(5.0 + 5.5 * BASELINE_STEP_OPTIMISM * 13.0)
    Budget(66.0, timing, clock=lambda: 0.0, spent_before_s=54.0).check_fits_one(baseline_step_s=13.0)
    Budget(50.0, timing, clock=lambda: 0.0, spent_before_s=54.0).check_fits_one(baseline_step_s=None)  # no estimate
    with pytest.raises(BudgetTooShort) as refused:
        Budget(50.0, timing, clock=lambda: 0.0, spent_before_s=54.0).check_fits_one(baseline_step_s=13.0)
    message = str(refused.value)
    assert message.startswith("--budget leaves 50 s for the trials once what came before them")
    assert f"needs at least {least:.0f} s to be measured (its step should take about 13 s here" in message
    # a full measurement at 13-s steps: 5 s, a warm-up of 1.5 steps and a window of 4 (the least with a spread)
    assert measurement_s(13.0, timing) == pytest.approx(5.0 + 5.5 * 13.0)
    would = budget_that_holds(54.0, measurement_s(13.0, timing))
    assert would == 4 and message.endswith("give --budget 4m or more, or --budget none")


def test_a_small_estimated_step_refuses_no_more_than_the_shortest_trial_does():
    timing = TimingSettings()
    Budget(31.0, timing, clock=lambda: 0.0).check_fits_one(baseline_step_s=0.05)
    with pytest.raises(BudgetTooShort, match="one trial takes at least 30 s to time a full window"):
        Budget(20.0, timing, clock=lambda: 0.0).check_fits_one(baseline_step_s=0.05)


def test_the_tuner_asks_for_the_baseline_steps_estimate_before_its_first_trial(tmp_path, cpu_hardware):
    asked: list[TrialConfig] = []
    launched = []

    def estimate(config: TrialConfig) -> float:
        asked.append(config)
        return 30.0

    def launcher(spec, **kwargs) -> TrialResult:
        launched.append(spec)
        return _result(5.0, 30.0)

    settings = TunerSettings(trials=3, budget_s=60.0, prune=False)
    tuner = cam_tuner(tmp_path, cpu_hardware, settings, launcher=launcher, clock=lambda: 0.0, step_estimate=estimate)
    with pytest.raises(BudgetTooShort, match="its step should take about 30 s here"):
        tuner.run()
    assert launched == [] and len(asked) == 1
    assert asked[0].per_device_batch_size == tuner.space.baseline["per_device_batch_size"]


def test_the_tuner_launches_nothing_when_its_budget_cannot_hold_one_trial(tmp_path, cpu_hardware):
    launched = []

    def launcher(spec, **kwargs) -> TrialResult:
        launched.append(spec)
        return _result(5.0, 30.0)

    settings = TunerSettings(trials=3, budget_s=12.0, prune=False)
    tuner = cam_tuner(tmp_path, cpu_hardware, settings, launcher=launcher, clock=lambda: 0.0)
    with pytest.raises(BudgetTooShort, match="give --budget 1m or more"):
        tuner.run()
    assert launched == [] and len(tuner.study.trials) == 0  # no trial asked of the study either


def test_on_a_busy_machine_the_seeds_that_train_on_every_core_train_on_the_free_ones(tmp_path, cpu_hardware):
    """Beside two busy processes on this 2-core machine CAM++'s bf16 seed (batch 32, no workers) read 1.15 samples/s on
    both cores' threads and 4.6 on one (benchmarks/README.md#a-busy-machine): the calibration's free cores decide
    the seeds' intra-op threads; the search still offers every count."""
    from autotune.search.seeds import on_free_cores

    measured: list[TrialConfig] = []

    def launcher(spec, **kwargs) -> TrialResult:
        measured.append(spec.config)
        return _result(4.7 if spec.config.precision == "fp32" else 14.0, 20.0)

    settings = TunerSettings(trials=3, prune=False, confirm_top_k=0, free_cores=1)
    tuner = cam_tuner(tmp_path, cpu_hardware, settings, launcher=launcher)
    tuner.run()
    seeds = [record.config for record in tuner.records if record.role == "seed"]
    assert len(seeds) == 2 and all(config.intra_op_threads == 1 for config in seeds)
    assert measured[0].intra_op_threads == 2  # the baseline is the recipe's, on every core
    space = tuner.space
    assert {seed["intra_op_threads"] for seed in space.seeds} == {2}  # as the space file's `auto` gives them
    assert on_free_cores(space.seeds, space, None) == [dict(seed) for seed in space.seeds]
    assert [seed["intra_op_threads"] for seed in on_free_cores(space.seeds, space, 9)] == [2, 2]  # never above every
