"""The feature_device knob in the conformer workload: with `device` the workers deliver speed-perturbed waveforms,
the batches by frames are the ones the workers' features would get, the step computes fbank and SpecAugment, and a
real trial subprocess trains with it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autotune import space, workloads
from autotune.data.asr_features import frame_lengths
from autotune.knobs.config import TrialConfig
from autotune.machine.hardware import probe
from autotune.space.knob_checks import check_feature_device as check_space
from autotune.space.knob_checks import feature_device_values as space_values
from autotune.trial.loader import build_loader
from tests.workloads.short_trial import run_two_steps
from tests.workloads.test_asr_workload import SMALL_MODEL, _setup, conformer, corpus  # noqa: F401 - fixtures

DYNAMIC = {"batch_type": "dynamic", "max_frames_in_batch": 400}
BUCKET = {"batch_type": "bucket", "max_frames_in_batch": 600, "num_buckets": 3, "bucket_scaling": 2.0}


def test_the_conformer_runs_both_placements_and_a_space_naming_them_is_accepted(
    conformer: workloads.Workload,  # noqa: F811
    tmp_path: Path,
) -> None:
    assert conformer.feature_devices == ("workers", "device")  # the recipe's placement first
    path = tmp_path / "space.yaml"
    path.write_text("extends: conformer\nfixed:\n  feature_device: device\n")
    loaded = space.load(path, probe("cpu"), workload_knobs=tuple(conformer.knobs))  # on a CPU too, when named
    assert space_values(loaded) == {"device"}
    check_space(loaded, "conformer", conformer.feature_devices, str(path))  # accepted, not refused


@pytest.mark.parametrize("knobs", [DYNAMIC, BUCKET], ids=["dynamic", "bucket"])
def test_batches_by_frames_are_the_same_when_the_workers_return_waveforms(
    conformer: workloads.Workload,  # noqa: F811
    corpus: Path,  # noqa: F811
    knobs: dict,
) -> None:
    """The samplers read the dataset's frame counts (from the durations, at the slowest speed), not the items: both
    placements batch the same items, and the frames the step computes are within those counts; the worst-case
    batches (the memory probe) are the same items at the slowest speed, with as many frames."""
    setups = {}
    for placement in ("workers", "device"):
        config = TrialConfig(per_device_batch_size=2, workload_knobs=knobs, feature_device=placement)
        setups[placement] = _setup(conformer, corpus, config)
    workers, device = setups["workers"], setups["device"]
    assert workers.dataset.max_frames == device.dataset.max_frames  # type: ignore[attr-defined]
    batches = {
        label: list(setup.batch_sampler_factory(config, torch.Generator().manual_seed(0), list(range(6))))  # type: ignore[misc]
        for label, setup in setups.items()
    }
    assert batches["workers"] == batches["device"] and len(batches["device"]) > 1
    frames = device.dataset.max_frames  # type: ignore[attr-defined]
    for batch in build_loader(device, config, total_batches=len(batches["device"]), seed=0):
        lengths = frame_lengths(batch["sample_lengths"], device.dataset.fbank)  # type: ignore[attr-defined]
        assert int(lengths.max()) * len(lengths) <= max(int(knobs["max_frames_in_batch"]), max(frames))
    worst_workers = workers.worst_case_batches(config)  # type: ignore[misc]
    worst_device = device.worst_case_batches(config)  # type: ignore[misc]
    fbank = device.dataset.fbank  # type: ignore[attr-defined]
    assert [batch["feat_lengths"].tolist() for batch in worst_workers] == [
        frame_lengths(batch["sample_lengths"], fbank).tolist() for batch in worst_device
    ]


def test_the_step_feeds_the_model_float32_features_of_the_batch(
    conformer: workloads.Workload,  # noqa: F811
    corpus: Path,  # noqa: F811
) -> None:
    config = TrialConfig(per_device_batch_size=3, feature_device="device")
    setup = _setup(conformer, corpus, config)
    batch = next(iter(build_loader(setup, config, total_batches=1, seed=0)))
    assert set(batch) == {"waveforms", "sample_lengths", "tokens", "token_lengths", "durations_s"}
    assert setup.samples_in(batch) == 3
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    setup.model.encoder.register_forward_pre_hook(lambda module, args: seen.append(args))  # type: ignore[union-attr]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = setup.loss_fn(setup.model, batch)
    feats, lengths = seen[0]
    assert feats.dtype == torch.float32 and feats.shape == (3, int(lengths.max()), 80)
    assert torch.equal(lengths, frame_lengths(batch["sample_lengths"], setup.dataset.fbank))  # type: ignore[attr-defined]
    assert bool((feats == 0).all(dim=2).any())  # SpecAugment's time bands, drawn in the step
    assert bool(torch.isfinite(loss))


@pytest.mark.slow
def test_device_features_train_in_a_trial_subprocess(corpus: Path, tmp_path: Path) -> None:  # noqa: F811
    data = workloads.get("conformer").load_data(str(corpus))
    config = TrialConfig(per_device_batch_size=2, num_workers=1, feature_device="device", workload_knobs=DYNAMIC)
    result = run_two_steps("conformer", data, {"model": SMALL_MODEL}, config, tmp_path)
    assert result.samples_per_second and result.samples_per_second > 0
    assert result.audio_seconds_per_second and result.audio_seconds_per_second > result.samples_per_second
