"""An epoch's rate from a window over a stretch of WeNet's length-sorted batches (trial/epoch_mix.py).

The batches are the real sampler's (autotune/data/batching.py) over 1-5 s clips; a step's time follows a known cost
model, so the epoch's true rate is known exactly and each estimate can be held to it.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from autotune.data.batching import LengthSortedBatchSampler
from autotune.knobs.config import TrialConfig
from autotune.trial.epoch_mix import EpochMix, epoch_mix_factor
from autotune.trial.window_record import WindowMeasurement

_RNG = random.Random(0)
DURATIONS = [_RNG.uniform(1.0, 5.0) for _ in range(4000)]  # WeNet issue #2661's 1-5 s clips


def _epoch(**size: int) -> list[list[int]]:
    frames = [int(d * 100) for d in DURATIONS]
    return list(LengthSortedBatchSampler(frames, num_batches=None, generator=torch.Generator().manual_seed(1), **size))


STATIC = _epoch(batch_size=8)
DYNAMIC = _epoch(max_frames_in_batch=4000)


def _costs(batches: list[list[int]], per_step: float, per_audio_s: float, per_sample: float) -> list[float]:
    return [per_step + per_audio_s * sum(DURATIONS[i] for i in batch) + per_sample * len(batch) for batch in batches]


def _mix(batches: list[list[int]]) -> EpochMix:
    return EpochMix(
        batches=len(batches),
        samples=sum(len(batch) for batch in batches),
        audio_s=sum(DURATIONS[i] for batch in batches for i in batch),
    )


def _window(batches: list[list[int]], start: int, steps: int) -> tuple[list[list[int]], list[int], list[float]]:
    window = batches[start : start + steps]
    return window, [len(batch) for batch in window], [sum(DURATIONS[i] for i in batch) for batch in window]


@pytest.mark.parametrize(
    ("batches", "cost", "window_off"),
    [
        (STATIC, (0.0, 0.1, 0.0), True),  # compute on the frames: a static batch of short clips is cheap
        (STATIC, (0.2, 0.05, 0.0), True),  # a launch cost per step and the frames
        (DYNAMIC, (0.05, 0.0, 0.02), True),  # per step and per utterance (files): a batch of short clips is dear
        (DYNAMIC, (0.1, 0.02, 0.01), True),  # all three
        (STATIC, (0.3, 0.0, 0.0), False),  # host-bound, every step alike: the window's rate is the epoch's already
        (DYNAMIC, (0.0, 0.0, 0.02), False),  # per utterance alone: so is it
    ],
    ids=["static-frames", "static-step+frames", "dynamic-step+utterance", "dynamic-all", "static-step", "dynamic-utt"],
)
def test_a_short_stretch_of_sorted_batches_is_priced_at_the_epochs_mix(batches, cost, window_off):
    epoch_rate = sum(len(batch) for batch in batches) / sum(_costs(batches, *cost))
    window, samples, audio = _window(batches, start=0, steps=14)  # a sort window's first batches: short clips
    times = _costs(window, *cost)
    window_rate = sum(samples) / sum(times)
    factor = epoch_mix_factor(times, samples, audio, _mix(batches))
    assert window_rate * factor == pytest.approx(epoch_rate, rel=1e-6)
    # the window alone was off by more than a machine's noise, or exact already (then the factor kept it)
    assert (abs(window_rate / epoch_rate - 1) > 0.05) == window_off


def test_noisy_steps_still_land_nearer_the_epochs_rate_than_the_window_alone():
    rng = random.Random(5)
    cost = (0.05, 0.06, 0.004)
    epoch_rate = sum(len(batch) for batch in STATIC) / sum(_costs(STATIC, *cost))
    raw, corrected = [], []
    for _ in range(200):
        window, samples, audio = _window(STATIC, start=rng.randrange(0, 400), steps=rng.randrange(8, 40))
        times = [t * rng.lognormvariate(0.0, 0.05) for t in _costs(window, *cost)]  # 5% per step, as a loaded CPU
        rate = sum(samples) / sum(times)
        raw.append(abs(math.log(rate / epoch_rate)))
        corrected.append(abs(math.log(rate * epoch_mix_factor(times, samples, audio, _mix(STATIC)) / epoch_rate)))
    assert statistics.fmean(corrected) < 0.25 * statistics.fmean(raw)
    assert statistics.fmean(raw) > 0.1


def test_the_factor_stays_between_what_each_plain_cost_model_says():
    rng = random.Random(8)
    mix = _mix(DYNAMIC)
    for _ in range(100):
        window, samples, audio = _window(DYNAMIC, start=rng.randrange(0, 200), steps=rng.randrange(3, 30))
        times = [rng.uniform(0.1, 1.0) for _ in window]  # no model at all: the fit is poor
        factor = epoch_mix_factor(times, samples, audio, mix)
        plain = [
            (mix.samples / mix.batches) / (sum(samples) / len(window)),  # per step
            (mix.samples / mix.audio_s) / (sum(samples) / sum(audio)),  # per audio second
            1.0,  # per sample
        ]
        assert min(plain) - 1e-9 <= factor <= max(plain) + 1e-9


def test_alike_batches_or_nothing_to_judge_change_nothing():
    mix = EpochMix(batches=100, samples=800, audio_s=2400.0)
    times, samples, audio = [0.5, 0.6, 0.4, 0.55], [8, 8, 8, 8], [24.0, 24.0, 24.0, 24.0]  # 3-s crops: the epoch's mix
    assert epoch_mix_factor(times, samples, audio, mix) == pytest.approx(1.0)
    assert epoch_mix_factor(times, samples, audio, None) == 1.0
    assert epoch_mix_factor(times[:1], samples[:1], audio[:1], mix) == 1.0  # one step
    assert epoch_mix_factor(times, samples, [0.0] * 4, mix) == 1.0  # no audio counted
    assert epoch_mix_factor(times, samples, audio, EpochMix(batches=0, samples=0, audio_s=0.0)) == 1.0


def test_gradient_accumulation_is_fitted_over_whole_optimiser_steps():
    window, samples, audio = _window(STATIC, start=3, steps=24)
    # every 4th batch also steps the optimiser: 0.4 s more
    times = [t + (0.4 if (i + 1) % 4 == 0 else 0.0) for i, t in enumerate(_costs(window, 0.0, 0.1, 0.0))]
    epoch_time = sum(_costs(STATIC, 0.0, 0.1, 0.0)) + 0.4 * (len(STATIC) / 4)
    epoch_rate = sum(len(batch) for batch in STATIC) / epoch_time
    factor = epoch_mix_factor(times, samples, audio, _mix(STATIC), block_steps=4)
    assert sum(samples) / sum(times) * factor == pytest.approx(epoch_rate, rel=0.01)


def test_a_slow_cpu_window_of_two_optimiser_steps_is_fitted_step_by_step():
    """The conformer's recipe on this CPU: 8 window steps of a batch of 16 at 6.4 s, gradient accumulation of 4. In
    blocks of 4 the window is two rows, which fit one cost term only, and the per-step one (the epoch's rate exactly,
    at a static batch) explained them best: the baseline read its short-clip window as the epoch (factor 1.0) while
    a seed with 12 steps was priced 0.81, and the run's speedup came out 22% under the neutral timer's. Timed step by
    step (each CPU step's time is its own) the same window is priced at the epoch's mix."""
    cost = (3.0, 0.07, 0.0)  # a step's fixed part and its frames, as a CPU conformer step
    window, samples, audio = _window(STATIC, start=0, steps=8)  # a sort window's first batches: short clips
    times = [t + (0.2 if (i + 1) % 4 == 0 else 0.0) for i, t in enumerate(_costs(window, *cost))]  # the update
    epoch_time = sum(_costs(STATIC, *cost)) + 0.2 * len(STATIC) / 4
    epoch_rate = sum(len(batch) for batch in STATIC) / epoch_time
    window_rate = sum(samples) / sum(times)
    assert window_rate / epoch_rate > 1.1  # the short clips' window alone reads fast
    in_blocks = epoch_mix_factor(times, samples, audio, _mix(STATIC), block_steps=4)
    assert in_blocks == pytest.approx(1.0)  # what the baseline read
    alone = epoch_mix_factor(times, samples, audio, _mix(STATIC), block_steps=4, steps_timed_alone=True)
    assert window_rate * alone == pytest.approx(epoch_rate, rel=1e-6)  # the update a cost of its own
    # a window that ends mid-way through an optimiser step is fitted over its whole ones
    nine = _window(STATIC, start=0, steps=9)
    ninth = _costs(nine[0], *cost)[-1]
    assert epoch_mix_factor(
        [*times, ninth], nine[1], nine[2], _mix(STATIC), block_steps=4, steps_timed_alone=True
    ) == pytest.approx(alone)


def test_noisy_short_windows_under_accumulation_land_nearer_the_epoch_step_by_step_than_in_blocks():
    """Windows of 8 steps (2 optimiser steps of 4 batches) anywhere in the sorted epoch, 5% noise per step: priced
    step by step they land nearer the epoch's rate than the window alone; in blocks of 4, farther."""
    rng = random.Random(3)
    cost, update_s = (1.0, 0.05, 0.05), 0.1
    epoch_rate = sum(len(b) for b in STATIC) / (sum(_costs(STATIC, *cost)) + update_s * len(STATIC) / 4)
    errors: dict[str, list[float]] = {"window": [], "blocks": [], "alone": []}
    for _ in range(200):
        window, samples, audio = _window(STATIC, start=rng.randrange(0, len(STATIC) - 8), steps=8)
        times = [
            t * rng.lognormvariate(0.0, 0.05) + (update_s if (i + 1) % 4 == 0 else 0.0)
            for i, t in enumerate(_costs(window, *cost))
        ]
        rate = sum(samples) / sum(times)
        blocks = epoch_mix_factor(times, samples, audio, _mix(STATIC), block_steps=4)
        alone = epoch_mix_factor(times, samples, audio, _mix(STATIC), block_steps=4, steps_timed_alone=True)
        for name, factor in (("window", 1.0), ("blocks", blocks), ("alone", alone)):
            errors[name].append(abs(math.log(rate * factor / epoch_rate)))
    mean = {name: statistics.fmean(values) for name, values in errors.items()}
    assert mean["alone"] < 0.6 * mean["window"] and mean["blocks"] > mean["window"]


def test_the_objective_and_audio_rate_carry_the_epochs_mix():
    window, samples, audio = _window(STATIC, start=9, steps=14)
    times = _costs(window, 0.0, 0.1, 0.0)
    measured = WindowMeasurement(
        samples=sum(samples),
        audio_s=sum(audio),
        window_s=sum(times),
        step_times_s=times,
        step_samples=samples,
        step_audio_s=audio,
    )
    config = TrialConfig(per_device_batch_size=8)
    mix = _mix(STATIC)
    summary = measured.summary(len(DURATIONS), config, mix=mix)
    epoch_rate = mix.samples / sum(_costs(STATIC, 0.0, 0.1, 0.0))
    assert summary["samples_per_second"] == pytest.approx(epoch_rate, rel=1e-6)
    assert summary["window_samples_per_second"] == pytest.approx(sum(samples) / sum(times))  # what budgets price
    assert summary["epoch_mix_factor"] == pytest.approx(epoch_rate / summary["window_samples_per_second"])
    # time per audio second is the same everywhere under this model: the epoch's audio rate is the window's
    assert summary["audio_seconds_per_second"] == pytest.approx(sum(audio) / sum(times), rel=1e-6)
    unmixed = measured.summary(len(DURATIONS), config)
    assert unmixed["epoch_mix_factor"] is None
    assert unmixed["samples_per_second"] == pytest.approx(sum(samples) / sum(times))


def _six_window_steps(workload: str, options: dict, data, folder):
    """A real trial subprocess of `workload` on `data`: one warm-up step, then a window of six, on this CPU."""
    from autotune import yamlio
    from autotune.trial import TimingSettings, TrialSpec, launch

    spec = TrialSpec(
        workload=workload,
        workload_options=options,
        data_file=str(yamlio.write_json(folder / "data.json", data.to_dict())),
        config=TrialConfig(per_device_batch_size=2, num_workers=0),
        timing=TimingSettings(warmup_steps=1, window_s=0.01, min_window_steps=6, max_window_steps=6, min_timed_share=0),
        device_type="cpu",
        result_path=str(folder / "trial" / "result.json"),
    )
    result = launch(spec, workdir=folder / "trial", timeout_s=180)
    assert result.status == "ok", result.log_tail
    return result


def test_a_conformer_trial_reports_its_epochs_mix_and_a_speaker_trial_has_none(tmp_path, tiny_corpus):
    """Real trial subprocesses: the conformer's objective is its window's rate times the factor, its audio rate the
    objective times the epoch's own audio per sample; CAM++'s crops are alike, so nothing is priced."""
    from autotune import workloads
    from autotune.data import generate_corpus

    corpus = generate_corpus(
        tmp_path / "corpus", n_speakers=2, files_per_speaker=12, min_duration_s=1.0, max_duration_s=5.0, seed=4
    )
    data = workloads.get("conformer").load_data(str(corpus))
    small = {"output_size": 64, "attention_heads": 2, "linear_units": 128, "num_blocks": 2, "decoder_blocks": 1}
    (tmp_path / "asr").mkdir()
    result = _six_window_steps("conformer", {"model": small}, data, tmp_path / "asr")
    assert result.window_steps == 6 and result.epoch_mix_factor is not None
    assert result.samples_per_second == pytest.approx(result.window_samples_per_second * result.epoch_mix_factor)
    audio_per_sample = sum(u.duration_s for u in data.utterances) / len(data.utterances)  # 1-5 s: WeNet keeps all
    assert result.audio_seconds_per_second == pytest.approx(result.samples_per_second * audio_per_sample)

    (tmp_path / "cam").mkdir()
    crops = _six_window_steps("cam++", {}, workloads.get("cam++").load_data(str(tiny_corpus)), tmp_path / "cam")
    assert crops.epoch_mix_factor is None
