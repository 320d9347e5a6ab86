"""The run's extra metrics: work per sample against known peaks, pipeline efficiency, overhead, AMP and diagnosis."""

from __future__ import annotations

import pytest

from autotune import space, workloads
from autotune.knobs.config import TrialConfig
from autotune.result.measurements import Measurements
from autotune.result.tuned_config import TunedConfig
from autotune.run import assessment
from autotune.run.plan import RunRequest
from autotune.search.candidates import Candidate, TrialRecord
from autotune.search.settings import TunerSettings, TuningOutcome
from autotune.trial import TrialResult
from autotune.trial.amp_check import AmpCheckResult
from autotune.trial.amp_curves import PrecisionVerdict
from tests.conftest import make_cpu, make_cuda

BF16 = TrialConfig(per_device_batch_size=64, num_workers=4, precision="bf16")
CEILING = TrialResult(status="ok", samples_per_second=200.0, window_samples_per_second=200.0, flops_per_sample=1e9)


def test_achieved_tflops_against_the_known_peak_and_the_ceiling():
    metrics = assessment.compute_metrics(150.0, CEILING, BF16, make_cuda())
    assert metrics["flops_per_sample"] == 1e9 and metrics["achieved_tflops"] == pytest.approx(0.15)
    assert metrics["peak_tflops"] == 312.0 and metrics["fraction_of_peak"] == pytest.approx(0.15 / 312, abs=1e-4)
    assert metrics["ceiling_tflops"] == pytest.approx(0.2) and metrics["pipeline_efficiency"] == 0.75
    on_cpu = assessment.compute_metrics(150.0, CEILING, BF16, make_cpu())
    assert on_cpu["peak_tflops"] is None and on_cpu["fraction_of_peak"] is None and on_cpu["achieved_tflops"]
    failed = TrialResult(status="oom", reason="out of memory: ...")
    unmeasured = assessment.compute_metrics(150.0, failed, BF16, make_cuda())
    assert unmeasured["pipeline_efficiency"] is None and unmeasured["ceiling_failed"].startswith("oom: out of memory")


def _record(number: int, **result) -> TrialRecord:
    return TrialRecord(number=number, role="search", config=BF16, result=TrialResult(**result))


def test_overhead_per_trial_and_share_of_the_run():
    records = [
        _record(0, status="ok", start_s=2.0, setup_s=4.0, warmup_s=1.0, worst_case_s=0.5, window_s=10.0, wall_s=18.0),
        _record(1, status="oom", start_s=3.0, setup_s=6.0, wall_s=10.0),
        _record(2, status="precision", reason="rejected, never launched"),
    ]
    outcome = TuningOutcome(records=records, baseline=None, winner=None, stopped_by="trials", elapsed_s=25.0)
    overhead = assessment.overhead_metrics(outcome)
    assert overhead["trials"] == 2 and overhead["mean_setup_s"] == 5.0 and overhead["mean_warmup_s"] == 1.0
    assert overhead["mean_start_s"] == 2.5 and overhead["mean_worst_case_s"] == 0.5
    assert overhead["mean_trial_wall_s"] == 14.0
    assert overhead["overhead_share_of_run"] == pytest.approx(16.5 / 25) and overhead["timed_share_of_run"] == 0.4
    assert overhead["untimed_share_of_trials"] == pytest.approx(1 - 10.0 / 28.0, abs=1e-4)  # a short budget's measure


def _measured(number: int, config: TrialConfig, status: str, rate: float = 0.0) -> TrialRecord:
    return TrialRecord(
        number=number, role="search", config=config, result=TrialResult(status=status, samples_per_second=rate)
    )


def test_larger_batches_are_what_the_run_measured_above_the_winner_at_its_precision(cpu_hardware):
    cam = space.load(space.space_path("cam++"), cpu_hardware)
    winner = TrialConfig(per_device_batch_size=16, precision="bf16")
    bs32 = TrialConfig(per_device_batch_size=32, num_workers=1, precision="bf16")
    records = [
        _measured(0, winner, "ok", 14.0),
        _measured(1, bs32, "ok", 15.0),
        _measured(2, bs32, "ok", 17.0),
        _measured(3, bs32, "ok", 16.0),  # median 16 of 3
        _measured(4, TrialConfig(per_device_batch_size=64, precision="bf16"), "ok", 12.0),
        _measured(5, TrialConfig(per_device_batch_size=64, precision="fp32"), "ok", 30.0),  # another precision
        _measured(6, TrialConfig(per_device_batch_size=64, num_workers=2, precision="bf16"), "pruned", 3.0),
        _measured(7, TrialConfig(per_device_batch_size=128, precision="bf16"), "oom"),
        _measured(8, TrialConfig(per_device_batch_size=8, precision="bf16"), "ok", 40.0),  # smaller
        _measured(9, TrialConfig(per_device_batch_size=64, precision="bf16", intra_op_threads=1), "ok", 50.0),
        # Checkpointing set another way: its memory per sample differs, so neither counts.
        _measured(10, TrialConfig(per_device_batch_size=256, precision="bf16", activation_checkpointing=False), "oom"),
        _measured(
            11, TrialConfig(per_device_batch_size=64, precision="bf16", activation_checkpointing=True), "ok", 60.0
        ),
    ]
    outcome = TuningOutcome(records=records, baseline=None, winner=None, stopped_by="trials", elapsed_s=1.0)
    larger = assessment.larger_batches(outcome, cam, winner)
    assert larger.knob == "per_device_batch_size" and larger.winner_value == 16
    assert larger.largest_offered == max(cam.grid()["per_device_batch_size"])
    assert larger.best_measured == (bs32.short(), 16.0, 3)  # not #9: other threads say nothing of the batch
    assert larger.pruned == 1 and larger.out_of_memory == ("bs=128 w=0 bf16",)
    nothing = assessment.larger_batches(outcome, cam, TrialConfig(per_device_batch_size=128, precision="fp16"))
    assert nothing.best_measured is None and nothing.pruned == 0 and nothing.out_of_memory == ()


def test_larger_batches_of_dynamic_batching_are_counted_in_frames(cpu_hardware):
    knobs = tuple(workloads.get("conformer").knobs)
    conformer = space.load(space.space_path("conformer"), cpu_hardware, workload_knobs=knobs)
    dynamic = TrialConfig(
        per_device_batch_size=16, workload_knobs={"batch_type": "dynamic", "max_frames_in_batch": 8000}
    )
    records = [
        _measured(0, dynamic, "ok", 5.0),
        _measured(
            1, TrialConfig(per_device_batch_size=64, workload_knobs={"batch_type": "static"}), "ok", 9.0
        ),  # not frames
        _measured(
            2,
            TrialConfig(
                per_device_batch_size=16, workload_knobs={"batch_type": "dynamic", "max_frames_in_batch": 12000}
            ),
            "ok",
            6.0,
        ),
    ]
    outcome = TuningOutcome(records=records, baseline=None, winner=None, stopped_by="trials", elapsed_s=1.0)
    larger = assessment.larger_batches(outcome, conformer, dynamic)
    assert larger.knob == "max_frames_in_batch" and larger.winner_value == 8000
    assert larger.largest_offered == max(conformer.grid()["max_frames_in_batch"])
    assert larger.best_measured == (records[2].config.short(), 6.0, 1)
    static = assessment.larger_batches(
        outcome, conformer, TrialConfig(per_device_batch_size=16, workload_knobs={"batch_type": "static"})
    )
    assert static.knob == "per_device_batch_size" and static.best_measured == (records[1].config.short(), 9.0, 1)


def test_noise_is_the_spread_of_configurations_measured_more_than_once():
    slow = TrialConfig(per_device_batch_size=32, precision="bf16")
    records = [
        _measured(0, BF16, "ok", 10.0),
        _measured(1, BF16, "ok", 12.0),
        _measured(2, BF16, "ok", 11.0),  # spread 2/11
        _measured(3, slow, "ok", 20.0),
        _measured(4, slow, "ok", 21.0),  # spread 1/20.5
        _measured(5, TrialConfig(per_device_batch_size=8), "ok", 5.0),  # once: no spread
        _measured(6, TrialConfig(per_device_batch_size=16), "ok", 5.0),
        _measured(7, TrialConfig(per_device_batch_size=16), "erratic", 1.0),  # infeasible
    ]
    outcome = TuningOutcome(records=records, baseline=None, winner=None, stopped_by="trials", elapsed_s=1.0)
    noise = assessment.noise_metrics(outcome)
    assert noise["configurations"] == 2
    assert noise["median_spread_fraction"] == pytest.approx((2 / 11 + 1 / 20.5) / 2, abs=1e-4)
    assert noise["max_spread_fraction"] == pytest.approx(2 / 11, abs=1e-4)
    assert "disagreed by 12% (median over 2 re-measured configurations, up to 18%)" in assessment._noise_note(noise)
    quiet = assessment.noise_metrics(
        TuningOutcome(records=records[3:6], baseline=None, winner=None, stopped_by="trials", elapsed_s=1.0)
    )
    assert quiet["configurations"] == 1 and assessment._noise_note(quiet) is None
    never = assessment.noise_metrics(
        TuningOutcome(records=records[5:6], baseline=None, winner=None, stopped_by="trials", elapsed_s=1.0)
    )
    assert never == {"configurations": 0, "median_spread_fraction": None, "max_spread_fraction": None}
    assert assessment._noise_note(never) is None


def test_the_amp_check_time_comes_off_the_budget():
    amp = AmpCheckResult(status="ok", wall_s=60.0)
    assert assessment.budget_left(TunerSettings(budget_s=900.0), amp).budget_s == 840.0
    assert assessment.budget_left(TunerSettings(budget_s=None), amp).budget_s is None
    assert assessment.budget_left(TunerSettings(budget_s=900.0), None).budget_s == 900.0


def test_assess_adds_every_section_and_notes_a_rejected_precision(cpu_hardware):
    winner = _record(0, status="ok", samples_per_second=100.0, data_wait_fraction=0.4, setup_s=3.0, wall_s=9.0)
    outcome = TuningOutcome(
        records=[winner],
        baseline=None,
        winner=Candidate(config=BF16, records=[winner]),
        stopped_by="trials",
        elapsed_s=20.0,
    )
    data = {"total_audio_hours": 1.0, "sample_rates": [16000], "n_utterances": 10, "n_utterances_total": 10}
    amp = AmpCheckResult(
        status="ok",
        reference_losses=[3.0, 2.0],
        verdicts=[PrecisionVerdict(precision="bf16", accepted=False, reason="bf16 rejected by the AMP check: 40%")],
    )
    tuned = TunedConfig(
        workload={},
        config=BF16,
        device_type="cpu",
        metrics={"winner": {"samples_per_second": 100.0, "data_wait_fraction": 0.4}},
        hardware={},
        data=data,
        search={},
        created="2026-01-01T00:00:00+00:00",
        autotune_version="0",
    )
    assessed = assessment.assess(
        Measurements(status="ok", samples_per_second=100.0, data_wait_fraction=0.4),
        BF16,
        hardware=cpu_hardware,
        data=data,
        space=space.load(space.space_path("cam++"), cpu_hardware),
        outcome=outcome,
        ceiling=CEILING,
        amp=amp,
    )
    assert tuned.metrics == {"winner": {"samples_per_second": 100.0, "data_wait_fraction": 0.4}} and not tuned.notes
    tuned = assessed.applied_to(tuned)  # a new result: the frozen one is left as it was
    metrics = tuned.metrics
    assert metrics["compute"]["pipeline_efficiency"] == 0.5 and metrics["overhead"]["trials"] == 1
    assert metrics["noise"]["configurations"] == 0
    assert metrics["amp_check"]["precisions"]["bf16"]["accepted"] is False
    assert metrics["diagnosis"]["bound"] == "data pipeline"
    assert "bf16 rejected by the AMP check: 40%" in tuned.notes


def test_a_winner_in_a_precision_the_amp_check_did_not_judge_says_so(cpu_hardware):
    """Beside busy processes a 5-minute run's check ran out of time before fp32's own noise floor, so bf16 (52.8% off
    fp32's curve) was neither accepted nor rejected, and won: the result says the winner's precision is unjudged."""
    winner = _record(0, status="ok", samples_per_second=100.0, data_wait_fraction=0.0, setup_s=3.0, wall_s=9.0)
    outcome = TuningOutcome(
        records=[winner], baseline=None, winner=Candidate(config=BF16, records=[winner]), stopped_by="budget",
        elapsed_s=20.0,
    )  # fmt: skip
    data = {"total_audio_hours": 1.0, "sample_rates": [16000], "n_utterances": 10, "n_utterances_total": 10}
    strays = PrecisionVerdict(precision="bf16", accepted=False, max_deviation_fraction=0.528)

    def notes(amp: AmpCheckResult, config: TrialConfig = BF16) -> tuple[str, ...]:
        return assessment.assess(
            Measurements(status="ok", samples_per_second=100.0, data_wait_fraction=0.0),
            config,
            hardware=cpu_hardware,
            data=data,
            space=space.load(space.space_path("cam++"), cpu_hardware),
            outcome=outcome,
            ceiling=CEILING,
            amp=amp,
        ).notes

    cut = AmpCheckResult(status="partial", reason="bf16 strayed", verdicts=[strays], final=[])
    unjudged = [note for note in notes(cut) if note.startswith("the winner trains in bf16")]
    assert unjudged == [
        "the winner trains in bf16, which the AMP check had no time to judge (its loss strayed 53% from fp32's over "
        "the check's steps; how far fp32 itself strays was not measured): before a long run, judge it with a longer "
        "--budget (the check gets 20% of it) or compare its first steps' loss with fp32's"
    ]
    failed = [note for note in notes(AmpCheckResult(status="error", reason="fp32 failed")) if "winner trains" in note]
    assert failed == [
        "the winner trains in bf16, which the AMP check could not judge (above): before a long run, compare its first "
        "steps' loss with fp32's"
    ]
    accepted = PrecisionVerdict(precision="bf16", accepted=True, max_deviation_fraction=0.01)
    judged_in_time = AmpCheckResult(status="partial", verdicts=[accepted], final=["bf16"])
    fp32 = TrialConfig(per_device_batch_size=64, num_workers=4, precision="fp32")
    for amp, config in ((judged_in_time, BF16), (AmpCheckResult(status="ok", verdicts=[accepted]), BF16), (cut, fp32)):
        assert not [note for note in notes(amp, config) if "winner trains" in note]


def test_a_run_checks_amp_first_measures_the_ceiling_and_explains_its_winner(tmp_path, tiny_corpus):
    import io

    from rich.console import Console

    from autotune import load_config
    from autotune.cli.display import print_summary
    from autotune.run import runner
    from autotune.trial import TimingSettings
    from autotune.trial.amp_curves import AmpCheckSettings

    space_file = tmp_path / "space.yaml"
    space_file.write_text(
        "params:\n  precision: {type: categorical, choices: [bf16, fp32]}\n"
        "fixed: {num_workers: 0, per_device_batch_size: 12}\nbaseline: {precision: fp32}\n"
    )
    request = RunRequest(
        model="tests.fixtures.faulty_workload:workload",  # batch 12: its loss is 1.5x under bf16 autocast
        data=str(tiny_corpus),
        space=str(space_file),
        results_dir=str(tmp_path / "results"),
        device="cpu",
        settings=TunerSettings(
            trials=2, sampler="grid", prune=False, confirm_top_k=0, timing=TimingSettings(warmup_steps=1, window_s=0.2)
        ),
        warm_start=False,
        amp_check=AmpCheckSettings(steps=4, batch_size=12, batches=2, smoothing_steps=2, timeout_s=120),
    )
    report = runner.execute(runner.prepare(request))
    assert [(r.config.precision, r.result.status) for r in report.outcome.records] == [
        ("fp32", "ok"),
        ("bf16", "precision"),  # never launched: the AMP check rejected bf16 before the search
        ("fp32", "ok"),  # the grid's other point; the rejected one did not use up a trial
    ]
    metrics = load_config(report.result_path).metrics
    assert metrics["amp_check"]["precisions"]["bf16"]["accepted"] is False
    assert metrics["compute"]["flops_per_sample"] == 64 and metrics["compute"]["pipeline_efficiency"] > 0
    assert metrics["overhead"]["trials"] == 2 and metrics["overhead"]["mean_setup_s"] > 0
    assert metrics["diagnosis"]["bound"] in ("data pipeline", "compute") and metrics["diagnosis"]["next"]
    console = Console(file=io.StringIO(), width=200)
    print_summary(console, report)
    shown = console.file.getvalue()  # type: ignore[attr-defined]
    assert "AMP check bf16: rejected" in shown and "bound by:" in shown and "pipeline efficiency" in shown
    assert "4 steps at learning rate 0.01)" in shown  # the fixture's constant SGD rate: no warm-up to speak of


def test_a_ceiling_that_would_end_past_the_budget_is_skipped_and_says_so(monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("the ceiling must not be launched")

    monkeypatch.setattr("autotune.run.assessment.launch", no_launch)
    winner = Candidate(config=BF16, records=[_record(3, status="ok", samples_per_second=9.0, wall_s=40.0)])
    outcome = TuningOutcome(records=winner.records, baseline=None, winner=winner, stopped_by="budget", elapsed_s=890.0)
    skipped = assessment.measure_ceiling(outcome, lambda config, path: None, None, 60.0, left_s=10.0)
    assert skipped.status == "skipped" and skipped.reason.startswith("no room left in --budget (10 s left")
    metrics = assessment.compute_metrics(9.0, skipped, BF16, make_cpu())
    assert metrics["pipeline_efficiency"] is None and metrics["ceiling_failed"].startswith("skipped: no room left")
