"""The compute-only ceiling: batches collated once, kept on the device and cycled; FLOPs counted after the window."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from autotune.knobs.config import TrialConfig
from autotune.trial import launch
from autotune.trial.compute_only import in_memory_batches
from tests.trial.tiny_setups import faulty_spec, linear_setup


def test_a_few_batches_are_collated_once_and_cycled():
    setup = linear_setup(samples=40)
    config = TrialConfig(per_device_batch_size=5, num_workers=3, persistent_workers=True)
    batches = in_memory_batches(setup, config, device=torch.device("cpu"), seed=0, count=3)
    first = [next(batches) for _ in range(6)]
    assert all(first[i] is first[i + 3] for i in range(3)) and first[0][0].shape == (5, 4)


def test_a_ceiling_trial_measures_without_a_data_pipeline_and_counts_flops(tmp_path: Path, tiny_corpus: Path):
    spec = faulty_spec(tmp_path, tiny_corpus, 5, num_workers=1)
    result = launch(
        dataclasses.replace(spec, compute_only=True, count_flops=True), workdir=tmp_path / "t", timeout_s=120
    )
    assert result.status == "ok", result.log_tail
    assert result.flops_per_sample == 64  # Linear(8, 2): forward 2*8*2 and the weight gradient as much again
    assert result.window_samples_per_second > 0 and result.data_wait_fraction < 0.5
