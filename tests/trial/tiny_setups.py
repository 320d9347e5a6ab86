"""Tiny setups shared by the trial tests: a linear model on random vectors, and a trial of the faulty workload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from autotune import yamlio
from autotune.data import load_source
from autotune.knobs.config import TrialConfig
from autotune.trial import TimingSettings, TrialSpec
from autotune.workloads.base import TrainingSetup

FAULTY = "tests.fixtures.faulty_workload:workload"
SHORT = TimingSettings(warmup_steps=1, window_s=0.2, min_window_steps=2)


def linear_setup(features: int = 4, samples: int = 32, **overrides: Any) -> TrainingSetup:
    """nn.Linear(features, 2) under cross-entropy, SGD, on `samples` random vectors; any field may be overridden."""
    model = nn.Linear(features, 2)
    fields: dict[str, Any] = {
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "dataset": torch.utils.data.TensorDataset(torch.randn(samples, features), torch.randint(0, 2, (samples,))),
        "collate_fn": None,
        "loss_fn": lambda module, batch: nn.functional.cross_entropy(module(batch[0]), batch[1]),
        "samples_in": lambda batch: int(batch[1].shape[0]),
        "audio_seconds_in": lambda batch: 0.0,
    }
    return TrainingSetup(**{**fields, **overrides})


def faulty_spec(tmp_path: Path, corpus: Path, batch: int, *, num_workers: int = 0, timing: TimingSettings = SHORT):
    """A trial of tests/fixtures/faulty_workload.py, whose behaviour is keyed by the batch size."""
    data_file = yamlio.write_json(tmp_path / "data.json", load_source(corpus).to_dict())
    return TrialSpec(
        workload=FAULTY,
        workload_options={},
        data_file=str(data_file),
        config=TrialConfig(per_device_batch_size=batch, num_workers=num_workers),
        timing=timing,
        device_type="cpu",
        result_path=str(tmp_path / "trial" / "result.json"),
    )
