"""A real study over a workload that fails on purpose: every failure is recorded and the study goes on."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune import load_config
from autotune.run import runner
from autotune.run.plan import RunRequest
from autotune.search.settings import TunerSettings
from autotune.trial import TimingSettings
from tests.fixtures.tuners import cam_tuner as _cam_tuner

FIXTURES = Path(__file__).parents[1] / "fixtures"


@pytest.mark.slow
def test_study_survives_every_kind_of_failure(tmp_path, tiny_corpus):
    settings = TunerSettings(
        trials=7,
        prune=False,  # this test is about failures; a noisy tiny trial must not be pruned instead
        sampler="grid",
        confirm_top_k=1,
        confirm_repeats=1,
        trial_timeout_s=15,
        # Short windows (no share rule): the hanging configuration must time out at 15 s, the others must not,
        # even on a loaded machine whose calibration doubles the windows.
        timing=TimingSettings(warmup_steps=1, window_s=0.5, min_window_steps=2, min_timed_share=0.0),
    )
    request = RunRequest(
        model="tests.fixtures.faulty_workload:workload",
        data=str(tiny_corpus),
        space=str(FIXTURES / "faulty_space.yaml"),
        results_dir=str(tmp_path / "results"),
        device="cpu",
        settings=settings,
    )
    report = runner.execute(runner.prepare(request))

    statuses = {record.config.per_device_batch_size: record.result.status for record in report.outcome.records}
    assert statuses == {1: "oom", 2: "nonfinite", 3: "timeout", 4: "signal", 5: "ok", 6: "signal"}
    assert report.outcome.records[0].role == "baseline" and report.outcome.records[0].config.per_device_batch_size == 5
    assert report.tuned.config.per_device_batch_size == 5
    assert report.tuned.metrics["winner"]["measurements"] == 3  # baseline, its grid visit, one confirmation

    # Optuna saw infeasible configurations as COMPLETE trials with a positive constraint, not as FAIL.
    study = optuna.load_study(study_name=report.plan.study_name, storage=report.plan.storage_url)
    assert all(trial.state == optuna.trial.TrialState.COMPLETE for trial in study.trials)
    infeasible = [t for t in study.trials if t.user_attrs["result"]["status"] != "ok"]
    assert len(infeasible) == 5 and all(t.constraints["infeasible"] > 0 for t in infeasible)

    # The result reads back; failed trials keep their logs for the user, successful ones leave nothing behind.
    assert load_config(report.result_path).config.per_device_batch_size == 5
    logs = sorted(report.plan.workdir.glob("trial-*/trial.log"))
    assert len(logs) == 5


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])  # Ctrl-C; a batch job's time limit or `kill`
def test_ctrl_c_ends_the_trial_writes_the_best_so_far_and_leaves_the_study_consistent(
    tiny_corpus, tmp_path, signal_name
):
    import signal

    from optuna.trial import TrialState

    from tests.fixtures.runs import all_trials, run_args, sqlite_url, start, wait_for

    results = tmp_path / "results"
    url, log = sqlite_url(results), tmp_path / "run.log"
    process = start(run_args(tiny_corpus, results, "--trials", "3"), log)

    def second_trial_running() -> bool:
        states = {t.number: t.state for t in all_trials(url)} if (results / "studies.db").exists() else {}
        return states.get(0) == TrialState.COMPLETE and states.get(1) == TrialState.RUNNING

    wait_for(second_trial_running, "trial 1 to run")
    process.send_signal(getattr(signal, signal_name))
    assert process.wait(timeout=60) == 130, log.read_text()
    output = " ".join(log.read_text().split())
    assert "interrupted; best so far written" in output
    (path,) = (results / "faulty").glob("*.yaml")
    assert load_config(path).search["stopped_by"] == "interrupted"
    states = {t.number: t.state for t in all_trials(url)}
    assert states == {0: TrialState.COMPLETE, 1: TrialState.FAIL}  # the stopped trial is told, nothing left RUNNING


def test_a_cold_study_measures_the_seeds_right_after_the_baseline_and_a_rerun_does_not(tmp_path, tiny_corpus):
    space_file = tmp_path / "space.yaml"
    space_file.write_text(
        "params:\n  per_device_batch_size: {type: categorical, choices: [5, 7]}\n"
        "fixed: {num_workers: 0}\nbaseline: {per_device_batch_size: 5}\n"
        "seeds: [{per_device_batch_size: 5}, {per_device_batch_size: 7}]\n"
    )

    def run(trials: int):
        settings = TunerSettings(
            trials=trials, prune=False, confirm_top_k=0, timing=TimingSettings(warmup_steps=1, window_s=0.2)
        )
        request = RunRequest(
            model="tests.fixtures.faulty_workload:workload",
            data=str(tiny_corpus),
            space=str(space_file),
            results_dir=str(tmp_path / "results"),
            device="cpu",
            settings=settings,
            warm_start=False,
            compute_ceiling=False,
        )
        records = runner.execute(runner.prepare(request)).outcome.records
        return [(record.role, record.config.per_device_batch_size) for record in records]

    # The seed equal to the baseline is not measured twice.
    assert run(3)[:2] == [("baseline", 5), ("seed", 7)]
    assert all(role != "seed" for role, _ in run(2))  # the study has trials now: no seeds


def _record_launches(monkeypatch) -> list:
    """Trials 'launched' at 10 samples/s, their configurations recorded in the list returned."""
    from autotune.trial import TrialResult, TrialSpec

    launched: list = []

    def fake_launch(spec: TrialSpec, **kwargs) -> TrialResult:
        launched.append(spec.config)
        return TrialResult(status="ok", samples_per_second=10.0)

    monkeypatch.setattr("autotune.search.tuner.launch", fake_launch)
    return launched


def test_a_precision_the_amp_check_rejected_is_infeasible_without_a_launch(tmp_path, monkeypatch, cpu_hardware):
    launched = _record_launches(monkeypatch)
    study = optuna.create_study(direction="maximize")
    rejected = {"bf16": "bf16 rejected by the AMP check: its loss curve strays 40%"}
    tuner = _cam_tuner(tmp_path, cpu_hardware, study=study, rejected_precisions=rejected)
    params = {"per_device_batch_size": 16, "num_workers": 0, "intra_op_threads": 1}
    rejected = tuner._run_one("search", {**params, "precision": "bf16"})
    measured = tuner._run_one("search", {**params, "precision": "fp32"})
    assert rejected.result.status == "precision" and "strays 40%" in rejected.result.reason
    assert measured.result.status == "ok" and [config.precision for config in launched] == ["fp32"]
    first = study.trials[0]
    assert first.state == optuna.trial.TrialState.COMPLETE and first.constraints == {"infeasible": 1.0}


def test_a_compile_mode_the_amp_check_rejected_is_infeasible_without_a_launch(tmp_path, monkeypatch, cpu_hardware):
    launched = _record_launches(monkeypatch)
    rejected = {"compile=dynamic": "compile=dynamic rejected by the AMP check: its loss curve strays 60%"}
    tuner = _cam_tuner(tmp_path, cpu_hardware, rejected_precisions=rejected)
    params = {"per_device_batch_size": 16, "num_workers": 0, "intra_op_threads": 1, "precision": "fp32"}
    refused = tuner._run_one("search", {**params, "compile": "dynamic"})
    measured = tuner._run_one("search", {**params, "compile": "default"})
    assert refused.result.status == "precision" and "strays 60%" in refused.result.reason
    assert measured.result.status == "ok" and [config.compile for config in launched] == ["default"]


def test_a_seed_that_runs_out_of_memory_is_tried_next_at_half_its_batch(tmp_path, monkeypatch):
    from autotune.trial import TrialResult, TrialSpec
    from tests.conftest import make_cuda

    def fake_launch(spec: TrialSpec, **kwargs) -> TrialResult:
        if spec.config.per_device_batch_size > 128:  # a GPU smaller than the seeds were written for
            return TrialResult(status="oom", reason="CUDA out of memory", wall_s=1.0)
        return TrialResult(status="ok", samples_per_second=float(spec.config.per_device_batch_size), wall_s=10.0)

    monkeypatch.setattr("autotune.search.tuner.launch", fake_launch)
    settings = TunerSettings(trials=7, confirm_top_k=0)
    outcome = _cam_tuner(tmp_path, make_cuda(capability=(7, 0)), settings).run()  # a V100: fp16, no bf16
    seeds = [(r.config.per_device_batch_size, r.config.precision, r.result.status) for r in outcome.records[1:6]]
    # 512 does not fit, 256 neither, 128 does; the second seed (256, fp32) backs off too
    assert seeds == [
        (512, "fp16", "oom"),
        (256, "fp16", "oom"),
        (128, "fp16", "ok"),
        (256, "fp32", "oom"),
        (128, "fp32", "ok"),
    ]
    assert [r.role for r in outcome.records] == ["baseline", "seed", "seed", "seed", "seed", "seed", "search"]


def test_a_grid_over_a_conditional_space_measures_each_configuration_once(tmp_path, monkeypatch, cpu_hardware):
    """CAM++'s CPU space has prefetch and persistence only with workers. The grid once walked the plain product of
    every knob, so each configuration without workers came up 16 times, carrying a prefetch depth it cannot use."""
    from autotune.knobs.config import TrialConfig
    from autotune.search.candidates import config_key
    from autotune.trial import TrialResult, TrialSpec

    launched: list[TrialConfig] = []

    def fake_launch(spec: TrialSpec, **kwargs) -> TrialResult:
        launched.append(spec.config)
        return TrialResult(status="ok", samples_per_second=10.0)

    monkeypatch.setattr("autotune.search.tuner.launch", fake_launch)
    settings = TunerSettings(trials=1000, sampler="grid", confirm_top_k=0, prune=False)
    # The optimizer kernel is pinned: an unconditional knob would only triple the grid and this test's time.
    outcome = _cam_tuner(tmp_path, cpu_hardware, settings, pinned={"optimizer_impl": "default"}).run()
    assert outcome.stopped_by == "grid exhausted"
    searched = [config for config, record in zip(launched, outcome.records, strict=True) if record.role == "search"]
    assert len(searched) == 4 * 2 * 2 * (1 + 2 * 8 * 2)  # the whole space, see test_space
    assert len({config_key(config) for config in searched}) == len(searched)
    assert all(config.prefetch_factor is None for config in searched if config.num_workers == 0)


def test_trials_with_a_rejected_precision_do_not_use_up_the_trial_count_and_seeds_avoid_it(
    tmp_path, monkeypatch, cpu_hardware
):
    from autotune import space
    from autotune.knobs.config import TrialConfig
    from autotune.search.tuner import Tuner
    from autotune.trial import TrialResult, TrialSpec

    launched: list[TrialConfig] = []

    def fake_launch(spec: TrialSpec, **kwargs) -> TrialResult:
        launched.append(spec.config)
        return TrialResult(status="ok", samples_per_second=10.0 + len(launched))

    monkeypatch.setattr("autotune.search.tuner.launch", fake_launch)
    cam = space.load(space.space_path("cam++"), cpu_hardware)
    assert any(seed.get("precision") == "bf16" for seed in cam.seeds)

    def tuner(sampler: str) -> Tuner:
        settings = TunerSettings(trials=6, sampler=sampler, seed=3, confirm_top_k=0, prune=False)
        return _cam_tuner(tmp_path, cpu_hardware, settings, rejected_precisions={"bf16": "rejected"})

    assert all(seed[1].get("precision") != "bf16" for seed in tuner("tpe").seeds)
    outcome = tuner("random").run()
    statuses = [record.result.status for record in outcome.records]
    assert statuses.count("precision") >= 1 and outcome.stopped_by == "trials"
    assert len(launched) == 6 and all(config.precision == "fp32" for config in launched)


def test_a_trial_another_run_failed_meanwhile_keeps_the_studys_verdict_and_this_runs_measurement(caplog, tmp_path):
    """If a run's heartbeat went unheard (database unreachable), another run may fail its trial as stale; telling
    Optuna the result must not crash the measuring run."""
    from autotune.knobs.config import TrialConfig
    from autotune.search.candidates import TrialRecord
    from autotune.search.in_flight import Started, tell
    from autotune.trial import TrialResult

    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)  # the other run's verdict
    measured = TrialResult(status="ok", samples_per_second=3.0)
    config = TrialConfig(per_device_batch_size=5)
    record = TrialRecord(number=trial.number, role="search", config=config, result=measured)
    started = Started(trial=trial, role="search", config=config, folder=tmp_path, spec=None, pruner=None)  # type: ignore[arg-type]
    tell(study, started, record)
    assert study.trials[0].state == optuna.trial.TrialState.FAIL
    assert "marked FAIL by another run" in caplog.text


@pytest.mark.parametrize(("second_cv", "status"), [(0.05, "ok"), (0.4, "erratic")])
def test_an_erratic_window_is_measured_once_more_and_only_a_second_one_condemns(
    tmp_path, monkeypatch, cpu_hardware, second_cv, status
):
    from autotune.trial import TrialResult, TrialSpec

    windows = iter([0.6, second_cv])
    result_paths: list[str] = []

    def fake_launch(spec: TrialSpec, **kwargs) -> TrialResult:
        result_paths.append(spec.result_path)
        cv = next(windows)
        if cv > 0.25:
            return TrialResult(status="erratic", reason=f"CV {cv:.2f} > 0.25", throughput_cv=cv, wall_s=10.0)
        return TrialResult(status="ok", samples_per_second=10.0, throughput_cv=cv, wall_s=10.0)

    monkeypatch.setattr("autotune.search.tuner.launch", fake_launch)
    tuner = _cam_tuner(tmp_path, cpu_hardware)
    record = tuner._run_one("search", {"per_device_batch_size": 16, "num_workers": 0, "precision": "fp32"})
    assert record.result.status == status and record.result.wall_s == 20.0
    assert len(result_paths) == 2 and result_paths[0] != result_paths[1]  # a retry never reads the first's result
    if status == "erratic":
        assert "CV 0.40" in record.result.reason and "CV 0.60 in the first window" in record.result.reason


def test_a_window_other_processes_disturbed_is_kept_and_not_retried_into_the_same_load(
    tmp_path, monkeypatch, cpu_hardware
):
    from autotune.trial import TrialResult, TrialSpec

    launched: list[str] = []

    def fake_launch(spec: TrialSpec, **kwargs) -> TrialResult:
        launched.append(spec.result_path)
        return TrialResult(
            status="ok", samples_per_second=9.0, throughput_cv=0.5, others_cpu_fraction=0.6, disturbed=True, wall_s=10.0
        )

    monkeypatch.setattr("autotune.search.tuner.launch", fake_launch)
    record = _cam_tuner(tmp_path, cpu_hardware)._run_one("seed", {"per_device_batch_size": 32, "num_workers": 0})
    assert record.result.feasible and record.result.disturbed and len(launched) == 1


def test_the_last_search_trial_measures_the_best_so_far_with_its_audio_preloaded(tmp_path, monkeypatch, cpu_hardware):
    from autotune.knobs.config import TrialConfig
    from autotune.trial import TrialResult, TrialSpec

    launched: list[TrialConfig] = []

    def fake_launch(spec: TrialSpec, **kwargs) -> TrialResult:
        launched.append(spec.config)
        rate = 20.0 if spec.config.preload_audio else 10.0 + len(launched)
        return TrialResult(status="ok", samples_per_second=rate, data_wait_fraction=0.4, wall_s=1.0)

    monkeypatch.setattr("autotune.search.tuner.launch", fake_launch)
    asked: list[float] = []

    def probe(record) -> bool:
        asked.append(record.value)
        return record.result.data_wait_fraction > 0.1

    settings = TunerSettings(trials=5, sampler="random", confirm_top_k=1, confirm_repeats=1, prune=False)
    tuner = _cam_tuner(tmp_path, cpu_hardware, settings, preload_probe=probe)
    outcome = tuner.run()
    roles = [record.role for record in outcome.records]
    assert roles == ["baseline", "search", "search", "search", "preload", "confirm"]
    best_before = max(outcome.records[:4], key=lambda record: record.value)
    preloaded = outcome.records[4].config
    assert preloaded.preload_audio and preloaded == TrialConfig.from_dict(
        {**best_before.config.to_dict(), "preload_audio": True}
    )
    assert asked == [best_before.value]  # asked once, at the last slot
    assert outcome.winner.config.preload_audio and outcome.records[5].config.preload_audio  # confirmation keeps it


@pytest.mark.parametrize("closing_trials", [0, 1])
def test_the_budget_is_a_ceiling_for_the_search_its_confirmation_and_the_closing_trials(
    tmp_path, cpu_hardware, closing_trials
):
    """Every trial takes 17 s of a 100-s budget. A trial starts only if it ends in time, with a quarter of the budget
    (here one 17-s confirmation) kept, and time for the trials the run measures afterwards (the ceiling)."""
    from autotune.trial import TrialResult

    now = [0.0]

    def launcher(spec, **kwargs) -> TrialResult:
        now[0] += 17.0
        return TrialResult(status="ok", samples_per_second=10.0 + now[0], wall_s=17.0)

    settings = TunerSettings(trials=100, budget_s=100.0, confirm_top_k=1, confirm_repeats=1, prune=False)
    tuner = _cam_tuner(
        tmp_path, cpu_hardware, settings, launcher=launcher, clock=lambda: now[0], closing_trials=closing_trials
    )
    outcome = tuner.run()
    roles = [record.role for record in outcome.records]
    assert outcome.stopped_by == "budget" and roles[-1] == "confirm"
    assert outcome.elapsed_s + closing_trials * 17.0 <= 100.0
    # Without a closing trial: baseline, both seeds, a search trial and a confirmation (85 s). With one, the search
    # trial gives way (68 s, and 17 s for the ceiling).
    assert roles == ["baseline", "seed", "seed"] + (["confirm"] if closing_trials else ["search", "confirm"])
    assert outcome.elapsed_s + (1 + closing_trials) * 17.0 > 100.0  # it stopped because no further trial fits
