"""A new epoch's cost, measured at a real epoch end, and an objective that a plain loop over real epochs reproduces.

On an H200 (benchmarks/gpu_proof.md#results) the full run's winner, CAM++ at batch 512 with 16 persistent workers, was
reported at 1,334 samples/s; a plain load_config loop over the 2,000-utterance default corpus (three steps an epoch) ran
at 691: persistent workers were charged nothing per epoch, but every epoch's first batch still waits for a worker to
prepare it. Here the same shape on a CPU: a loop that never waits in steady state (prefetching hides the batches'
preparation), short epochs, a batch that takes a worker longer than a step.
"""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from autotune.knobs.config import TrialConfig
from autotune.knobs.dataloader import dataloader_kwargs
from autotune.knobs.precision import PrecisionSettings
from autotune.trial.epoch_boundary import epoch_boundary_s, worth_measuring
from autotune.trial.loader import build_loader
from autotune.trial.loop import measure
from autotune.trial.memory import PeakMemory
from autotune.trial.spec import TimingSettings
from autotune.workloads.base import TrainingSetup

ITEM_S = 0.02  # a worker prepares a batch of 8 in 0.16 s
STEP_S = 0.12  # a training step; two workers make a batch every 0.08 s, so the loop never waits in steady state
EPOCH = 24  # three steps an epoch


class _SlowItems(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return EPOCH

    def __getitem__(self, index: int):
        time.sleep(ITEM_S)
        return torch.ones(4) * index, index % 2


def _setup() -> TrainingSetup:
    model = nn.Linear(4, 2)

    def loss_fn(module: nn.Module, batch):
        time.sleep(STEP_S)
        return nn.functional.cross_entropy(module(batch[0]), batch[1])

    return TrainingSetup(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        dataset=_SlowItems(),
        collate_fn=None,
        loss_fn=loss_fn,
        samples_in=lambda batch: int(batch[1].shape[0]),
        audio_seconds_in=lambda batch: 0.0,
    )


def _plain_loop_rate(setup: TrainingSetup, config: TrialConfig, epochs: int) -> float:
    """What a user's loop gets: DataLoader(**dataloader_kwargs) over real epochs, after one epoch of warm-up."""
    loader = torch.utils.data.DataLoader(setup.dataset, shuffle=True, **dataloader_kwargs(config))
    samples, started = 0, 0.0
    for epoch in range(epochs + 1):
        if epoch == 1:
            started, samples = time.perf_counter(), 0
        for batch in loader:
            setup.loss_fn(setup.model, batch).backward()
            samples += int(batch[1].shape[0])
    return samples / (time.perf_counter() - started)


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "restarted"])
def test_the_objective_is_what_a_plain_loop_over_real_epochs_gets(persistent: bool) -> None:
    config = TrialConfig(per_device_batch_size=8, num_workers=2, prefetch_factor=2, persistent_workers=persistent)
    setup = _setup()
    loader = build_loader(setup, config, total_batches=400, seed=0)
    batches = iter(loader)
    memory = PeakMemory(torch.device("cpu"))
    timing = TimingSettings(warmup_steps=3, window_s=1.5, min_window_steps=10)
    try:
        window = measure(
            setup,
            batches,
            config=config,
            timing=timing,
            precision=PrecisionSettings(precision="fp32", device_type="cpu"),
            device=torch.device("cpu"),
            memory=memory,
        )
    finally:
        memory.stop()
    steps = len(window.step_times_s)
    assert window.data_wait_s / steps < 0.01  # steady state never waited: prefetching hid the preparation
    epoch_s = EPOCH / (window.samples / window.window_s)
    assert worth_measuring(num_workers=2, loader_start_s=window.loader_start_s, epoch_s=epoch_s)
    boundary = epoch_boundary_s(loader, batches, steady_wait_s=window.data_wait_s / steps)
    assert boundary >= 8 * ITEM_S * 0.9  # at least one batch's preparation by one worker
    assert next(iter(loader))[1].shape[0] == 8  # the loader goes on, in a new epoch
    unmeasured = window.summary(EPOCH, config)["samples_per_second"]
    window.epoch_boundary_s = boundary
    objective = window.summary(EPOCH, config)["samples_per_second"]
    plain = _plain_loop_rate(_setup(), config, epochs=8)
    assert objective == pytest.approx(plain, rel=0.15)
    if persistent:  # before: the window's rate, as if an epoch cost nothing; the plain loop is a third slower
        assert unmeasured == pytest.approx(window.samples / window.window_s)
        assert unmeasured > 1.25 * plain


def test_a_long_epoch_or_a_loader_without_workers_is_not_measured() -> None:
    assert not worth_measuring(num_workers=0, loader_start_s=5.0, epoch_s=10.0)  # a step prepares its own batch
    assert not worth_measuring(num_workers=4, loader_start_s=2.0, epoch_s=3600.0)  # at most 0.06% of an epoch
    assert worth_measuring(num_workers=16, loader_start_s=2.8, epoch_s=1.5)  # the H200's default corpus


def test_a_new_epoch_of_a_data_bound_loader_costs_little() -> None:
    """Workers that are the pace anyway (the loop waited for every batch) only restart in step at a new epoch."""
    config = TrialConfig(per_device_batch_size=8, num_workers=2, prefetch_factor=2, persistent_workers=True)
    loader = build_loader(_setup(), config, total_batches=400, seed=0)
    batches = iter(loader)
    for _ in range(6):
        next(batches)  # consumed at once: each worker's batch (0.16 s) is the wait, 0.08 s a batch per worker
    bound = epoch_boundary_s(loader, batches, steady_wait_s=0.08)
    assert bound < 0.5 * 8 * ITEM_S


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "restarted"])
def test_a_trial_on_a_small_corpus_charges_the_new_epoch_it_measured(tmp_path, tiny_corpus, persistent: bool) -> None:
    """A real trial subprocess whose epoch is a few steps: the loader's cold start is far above 1% of an epoch, so the
    trial measures a new epoch after its window and its objective (samples_per_second) pays it once per epoch."""
    import dataclasses

    from autotune.trial import launch
    from tests.trial.tiny_setups import faulty_spec

    spec = faulty_spec(tmp_path, tiny_corpus, 5, num_workers=2)
    config = dataclasses.replace(spec.config, persistent_workers=persistent)
    result = launch(dataclasses.replace(spec, config=config), workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == "ok", result.reason
    assert result.epoch_boundary_s is not None  # measured after the window, persistent workers too
    epoch = result.epoch_accounting["dataset_size"]
    expected = epoch / (epoch / result.window_samples_per_second + result.epoch_boundary_s)
    assert result.samples_per_second == pytest.approx(expected)
    if not persistent:  # new worker processes: the first batch of the epoch is always a wait
        assert result.epoch_boundary_s > 0 and result.samples_per_second < result.window_samples_per_second
    # Persistent workers resume at once: their new epoch costs the loop what its first batches took beyond the window's
    # mean wait per step, which a window that waited now and then can make nothing (the measure is clamped at 0).
