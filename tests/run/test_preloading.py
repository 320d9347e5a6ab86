"""The preload probe's decision and its report."""

from __future__ import annotations

import pytest

from autotune.knobs.config import TrialConfig
from autotune.result.diagnosis import DiagnosisSettings
from autotune.run.plan import RunRequest
from autotune.run.preload_probe import preload_probe, preload_report
from autotune.search.candidates import Candidate, TrialRecord
from autotune.search.settings import TuningOutcome
from autotune.trial.spec import TrialResult

GIB = 2**30


def _plan(model: str = "cam++", hours: float = 1.0, memory_bytes: int = 16 * GIB, world_size: int = 1):
    """What the probe is given of the run's plan."""
    data = {"total_audio_hours": hours, "sample_rates": [16000]}
    return {"model": model, "data": data, "world_size": world_size, "memory_bytes": memory_bytes}


def _record(number: int, config: TrialConfig, rate: float | None, wait: float = 0.3, **extra) -> TrialRecord:
    status = "ok" if rate else "oom"
    result = TrialResult(status=status, samples_per_second=rate, data_wait_fraction=wait, reason="", **extra)
    return TrialRecord(number=number, role="search", config=config, result=result)


def test_the_probe_runs_only_for_a_data_bound_config_of_a_corpus_that_fits():
    # One hour of 16 kHz audio is ~110 MiB as 16-bit PCM: within a quarter of 16 GiB, not of 256 MiB.
    worth_it = preload_probe(**_plan())
    config = TrialConfig(per_device_batch_size=8)
    assert worth_it(_record(0, config, 10.0, wait=0.3))
    assert not worth_it(_record(0, config, 10.0, wait=0.02))
    assert preload_probe(**_plan(memory_bytes=256 * 2**20)) is None
    assert preload_probe(**_plan(hours=15.0, world_size=2)) is not None  # 2 x 1.6 GiB within 4 GiB
    assert preload_probe(**_plan(hours=15.0, world_size=4)) is None  # every rank holds its own copy
    assert preload_probe(**_plan(model="my.pkg:factory")) is None  # a plugin's dataset may ignore the flag
    strict = preload_probe(**_plan(), settings=DiagnosisSettings(max_data_wait_fraction=0.5))
    assert not strict(_record(0, config, 10.0, wait=0.3))


def test_the_report_compares_the_preloaded_config_with_the_same_config_reading_per_item():
    plain = TrialConfig(per_device_batch_size=8, num_workers=1)
    preloaded = TrialConfig(per_device_batch_size=8, num_workers=1, preload_audio=True)
    records = [
        _record(0, plain, 10.0),
        _record(1, plain, 12.0),
        _record(2, TrialConfig(per_device_batch_size=16), 30.0),
        _record(3, preloaded, 16.5, preload_s=4.0),
    ]
    winner = Candidate(config=preloaded, records=[records[3]])
    outcome = TuningOutcome(records=records, baseline=None, winner=winner, stopped_by="trials", elapsed_s=1.0)
    report, note = preload_report(outcome)
    assert report["gain_fraction"] == 0.5 and report["without_preload_samples_per_second"] == 11.0
    assert report["preload_s"] == 4.0 and "+50%" in note and "the winner preloads it" in note


def test_a_failed_or_absent_probe_is_reported_as_such():
    plain = TrialConfig(per_device_batch_size=8)
    outcome = TuningOutcome(records=[_record(0, plain, 10.0)], baseline=None, winner=None, stopped_by="t", elapsed_s=1)
    assert preload_report(outcome) == (None, None)
    failed = _record(1, TrialConfig(per_device_batch_size=8, preload_audio=True), None)
    failed.result.reason = "out of memory"
    outcome.records.append(failed)
    report, note = preload_report(outcome)
    assert report["status"] == "oom" and note.endswith("failed: out of memory")


@pytest.mark.slow
def test_a_real_run_measures_its_best_config_preloaded_and_reports_it(tmp_path, tiny_corpus, monkeypatch):
    """cam++ for real: the baseline, then (the probe told to find any wait worth it) the same config preloaded."""
    from autotune import load_config
    from autotune.run import preload_probe as preloading
    from autotune.run import runner
    from autotune.search.settings import TunerSettings
    from autotune.trial import TimingSettings

    real_probe = preloading.preload_probe
    monkeypatch.setattr(
        runner.preloading,
        "preload_probe",
        lambda **plan: real_probe(**plan, settings=DiagnosisSettings(max_data_wait_fraction=-1)),
    )
    space_file = tmp_path / "space.yaml"  # the recipe's own baseline takes minutes per step on a CPU
    space_file.write_text(
        "params:\n  num_workers: {type: int, low: 0, high: 1}\n"
        "fixed: {per_device_batch_size: 4, precision: fp32, intra_op_threads: 1}\nbaseline: {num_workers: 1}\n"
    )
    request = RunRequest(
        model="cam++",
        data=str(tiny_corpus),
        space=str(space_file),
        results_dir=str(tmp_path / "results"),
        device="cpu",
        workload_options={"crop_s": 0.5},
        settings=TunerSettings(trials=2, confirm_top_k=0, timing=TimingSettings(warmup_steps=1, window_s=0.3)),
        warm_start=False,
        compute_ceiling=False,
        amp_check=None,
    )
    report = runner.execute(runner.prepare(request))
    baseline, preloaded = report.outcome.records
    assert baseline.result.status == "ok", baseline.result.reason
    assert (baseline.role, preloaded.role) == ("baseline", "preload")
    assert preloaded.config == TrialConfig.from_dict({**baseline.config.to_dict(), "preload_audio": True})
    assert preloaded.result.status == "ok" and 0 < preloaded.result.preload_s < preloaded.result.setup_s
    tuned = load_config(report.result_path)
    measured = tuned.metrics["preload"]
    assert measured["without_preload_samples_per_second"] == round(baseline.value, 3)
    assert measured["gain_fraction"] is not None and any("preloading the decoded audio" in n for n in tuned.notes)
    assert tuned.config.preload_audio == (preloaded.value > baseline.value)
