"""Lightning's own Trainer under the probe, with real gloo ranks that Lightning starts itself: the GPT-SoVITS epoch
(a sampler that shards by rank, sharded again by use_distributed_sampler=True: each of N ranks sees 1/N^2 of the
data) is caught and never ranked; with the fix, every rank's share adds up to the dataset."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from autotune.probe.command import TrainingCommand
from autotune.probe.launcher import CommandLauncher
from tests.probe.conftest import spec_for

pytestmark = pytest.mark.slow
pytest.importorskip("lightning")


def _run(tmp_path: Path, project: Path, *, devices: int, use_distributed_sampler: bool) -> object:
    template = (
        f"{sys.executable} train_lightning.py --config {{config}} --devices {devices} "
        f"--use-distributed-sampler {'true' if use_distributed_sampler else 'false'}"
    )
    command = TrainingCommand.checked(
        template,
        config_path=str(project / "train.yaml"),
        sets=["train.batch_size={per_device_batch_size}"],
        cwd=str(project),
    )
    spec = spec_for(tmp_path, per_device_batch_size=8)
    return CommandLauncher(command=command)(spec, workdir=tmp_path / "trial", timeout_s=240)


@pytest.mark.parametrize("devices", [2, 3])
def test_a_sampler_sharded_twice_is_caught_with_its_cause_and_fix(
    tmp_path: Path, lightning_training: Path, devices: int
) -> None:
    result = _run(tmp_path, lightning_training, devices=devices, use_distributed_sampler=True)
    assert result.status == "accounting", result.reason + result.log_tail  # type: ignore[attr-defined]
    share = 96 / devices
    per_rank = math.ceil(math.ceil(96 / devices) / devices)  # the sampler's share of its own share
    accounting = result.epoch_accounting  # type: ignore[attr-defined]
    assert accounting["world_size"] == devices and accounting["dataset_size"] == 96
    assert accounting["samples_per_epoch"] == devices * per_rank
    assert result.reason.startswith(  # type: ignore[attr-defined]
        f"each rank sees {per_rank} samples per epoch, about 1/{devices} of its share of "
        f"{share:.0f}: the data is sharded twice (the DistributedSamplerWrapper over a sampler that already shards"
    )
    assert "use_distributed_sampler=False" in result.reason  # type: ignore[attr-defined]
    assert len(result.per_rank_samples_per_second) == devices  # type: ignore[attr-defined]


def test_the_same_training_sharded_once_adds_up(tmp_path: Path, lightning_training: Path) -> None:
    result = _run(tmp_path, lightning_training, devices=2, use_distributed_sampler=False)
    assert result.status == "ok", result.reason + result.log_tail  # type: ignore[attr-defined]
    assert result.epoch_accounting["samples_per_epoch"] == 96  # type: ignore[attr-defined]
    assert result.in_force["per_device_batch_size"]["in_force"] is True  # type: ignore[attr-defined]
    assert result.observed["world_size"] == 2  # type: ignore[attr-defined]
