"""What a run's result says beside its measurements: minutes per epoch and the learning-rate advice."""

from __future__ import annotations

from autotune.knobs.config import TrialConfig
from autotune.result.measurements import NOT_MEASURED, Measurements
from autotune.run.conclusion import learning_rate_advice, predict_epoch
from autotune.trial.run_length import RunLength

WINNER = Measurements(status="ok", samples_per_second=100.0, audio_seconds_per_second=400.0, measurements=3)
BASELINE = Measurements(status="ok", samples_per_second=50.0, audio_seconds_per_second=200.0, measurements=1)


def test_an_epoch_is_the_data_list_the_samples_asked_for_or_hours_of_audio():
    listed = predict_epoch(WINNER, BASELINE, data_samples=60_000, epoch_samples=None, epoch_hours=None, devices=2)
    assert listed == {
        "samples": 60_000,
        "samples_from": "the data list (one sample per entry)",
        "devices": 2,
        "baseline_minutes": 20.0,
        "winner_minutes": 10.0,
    }
    asked = predict_epoch(WINNER, BASELINE, data_samples=60_000, epoch_samples=120_000, epoch_hours=None, devices=1)
    assert (asked["samples"], asked["samples_from"], asked["winner_minutes"]) == (120_000, "--epoch-samples", 20.0)
    hours = predict_epoch(WINNER, NOT_MEASURED, data_samples=60_000, epoch_samples=None, epoch_hours=10.0, devices=1)
    assert hours["audio_hours"] == 10.0 and "samples" not in hours
    assert hours["winner_minutes"] == 1.5 and hours["baseline_minutes"] is None  # 36000 s of audio at 400 s/s


def test_a_changed_global_batch_comes_with_the_linear_scaling_rule():
    baseline = TrialConfig(per_device_batch_size=32, world_size=2)
    winner = TrialConfig(per_device_batch_size=64, world_size=2)
    advice = learning_rate_advice(winner, baseline, global_batch=None, lr=0.2)
    assert advice is not None and advice.startswith("the global batch changes from the baseline's 64 to 128 (64 per")
    assert "multiply the learning rate by 2 (lr 0.2 -> 0.4)" in advice and "--global-batch 64" in advice
    assert learning_rate_advice(winner, baseline, global_batch=64, lr=0.2) is None  # held fixed by the user
    assert learning_rate_advice(winner, None, global_batch=None, lr=0.2) is None
    assert learning_rate_advice(baseline, baseline, global_batch=None, lr=0.2) is None


def test_a_new_epoch_that_weighs_on_a_small_corpus_is_said_and_a_light_one_is_not():
    from autotune.run.conclusion import epoch_start_note
    from autotune.search.candidates import TrialRecord
    from autotune.trial import TrialResult

    def record(boundary_s):
        result = TrialResult(
            status="ok",
            samples_per_second=691.0,
            window_samples_per_second=1334.0,
            epoch_boundary_s=boundary_s,
            epoch_accounting={"dataset_size": 2000},
        )
        return TrialRecord(number=1, role="seed", config=TrialConfig(per_device_batch_size=512), result=result)

    # The H200's winner on the default corpus: 1.5 s of steps an epoch, then a 1.4-s wait for the next one's batch.
    note = epoch_start_note([record(1.4)], RunLength())
    assert note is not None and note.startswith("a new epoch's first batch waits 1.40 s")
    assert "48% of each 2.9-s epoch of this data, charged" in note and "steady 1,334.0 samples/s" in note
    assert epoch_start_note([record(0.01)], RunLength()) is None  # under 1% of an epoch
    assert epoch_start_note([record(None)], RunLength()) is None  # not measured: a long epoch
    # The synthetic stand-in with no epoch given: measured, said, not charged, and how to have it charged.
    stand_in = epoch_start_note([record(1.4)], RunLength(per_epoch_costs=False))
    assert stand_in is not None and "not charged in samples_per_second" in stand_in
    assert "(48% of each)" in stand_in and "--epoch-samples N" in stand_in
    # The user's epoch (--epoch-samples): its share is what the note weighs; a long one needs no note.
    assert epoch_start_note([record(1.4)], RunLength(epoch_samples=1_000_000)) is None
    short = epoch_start_note([record(1.4)], RunLength(epoch_samples=4000))
    assert short is not None and "epoch of --epoch-samples, charged" in short
