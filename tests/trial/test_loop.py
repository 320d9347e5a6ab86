"""The timed loop in-process: adaptive warm-up, window accounting and the epoch-amortised objective."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from autotune.trial.loop import WindowMeasurement, _settled, build_loader, measure
from autotune.trial.memory import PeakMemory
from autotune.trial.precision import PrecisionSettings
from autotune.trial.spec import TimingConfig, TrialConfig
from autotune.workloads.base import TrainingSetup


class _Clock:
    """A stand-in for time.perf_counter that only moves when a training step says so: timings are exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr("autotune.trial.loop.time", fake)
    return fake


def _setup(slow_steps: int, clock: _Clock | None = None, fast_s: float = 0.005) -> TrainingSetup:
    model = nn.Linear(4, 2)
    calls = {"n": 0}

    def loss_fn(module: nn.Module, batch):
        calls["n"] += 1
        # Start-up costs that shrink step after step (never two alike), then steady state.
        step_s = 0.2 * 0.5 ** (calls["n"] - 1) if calls["n"] <= slow_steps else fast_s
        if clock is not None:
            clock.now += step_s
        else:
            time.sleep(step_s)
        features, labels = batch
        return nn.functional.cross_entropy(module(features), labels)

    dataset = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    return TrainingSetup(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        dataset=dataset,
        collate_fn=None,
        loss_fn=loss_fn,
        samples_in=lambda batch: int(batch[1].shape[0]),
        audio_seconds_in=lambda batch: 3.0 * 4,
    )


def _measure(setup: TrainingSetup, timing: TimingConfig) -> WindowMeasurement:
    config = TrialConfig(per_device_batch_size=4)
    loader = build_loader(setup, config, total_batches=200, seed=0)
    memory = PeakMemory(torch.device("cpu"))
    try:
        return measure(
            setup,
            iter(loader),
            config=config,
            timing=timing,
            precision=PrecisionSettings(precision="fp32", device_type="cpu"),
            device=torch.device("cpu"),
            memory=memory,
        )
    finally:
        memory.stop()


def test_warm_up_goes_on_until_step_times_settle(clock):
    timing = TimingConfig(warmup_steps=2, max_warmup_steps=12, window_s=0.1, min_window_steps=3)
    result = _measure(_setup(slow_steps=5, clock=clock), timing)
    assert result.warmup_steps == 7  # the five shrinking steps, then two that agree
    assert max(result.step_times_s) == pytest.approx(0.005)  # nothing of the start-up leaked into the window


def test_warm_up_is_bounded(clock):
    timing = TimingConfig(warmup_steps=2, max_warmup_steps=4, window_s=0.1, min_window_steps=3)
    assert _measure(_setup(slow_steps=50, clock=clock), timing).warmup_steps == 4


def test_window_counts_samples_steps_and_audio():
    result = _measure(_setup(slow_steps=0), TimingConfig(warmup_steps=1, window_s=0.2, min_window_steps=5))
    steps = len(result.step_times_s)
    assert steps >= 5 and result.samples == 4 * steps and result.audio_s == 12.0 * steps
    assert result.window_s >= 0.2 and 0.0 <= result.data_wait_s < result.window_s


@pytest.mark.parametrize(("times", "settled"), [([1.0, 0.5, 0.52], True), ([1.0, 0.5], False), ([0.5], False)])
def test_settled(times, settled):
    assert _settled(times, 0.2) is settled


def test_objective_charges_worker_start_once_per_epoch_without_persistent_workers():
    window = WindowMeasurement(samples=100, audio_s=300.0, window_s=10.0, loader_start_s=5.0, step_times_s=[0.1] * 10)
    persistent = TrialConfig(per_device_batch_size=10, num_workers=2, persistent_workers=True)
    restarted = TrialConfig(per_device_batch_size=10, num_workers=2, persistent_workers=False)
    assert window.summary(1000, persistent)["samples_per_second"] == pytest.approx(10.0)
    # 1000 samples take 100 s at 10/s; a restart adds 5 s per epoch: 1000 / 105 s.
    assert window.summary(1000, restarted)["samples_per_second"] == pytest.approx(1000 / 105)
    assert window.summary(1000, restarted)["window_samples_per_second"] == pytest.approx(10.0)
