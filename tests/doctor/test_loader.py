"""What a DataLoader holds at once, measured on the workload's own batches, against /dev/shm and the open-file
limit."""

from __future__ import annotations

import resource
from collections import namedtuple

import pytest

from autotune.doctor import DoctorRequest, Verdict, loader_checks
from autotune.doctor.loader import batch_size_of
from autotune.knobs.config import TrialConfig
from tests.doctor.conftest import one, run_checks, write_result

# 3D-Speaker's fbank of a 3 s crop: 1 + (48000 - 400) // 160 = 298 frames x 80 bins, float32; an int64 label.
CAMPP_ITEM_BYTES = 298 * 80 * 4 + 8
Usage = namedtuple("Usage", "total used free")


def test_batch_sizes_count_every_tensor_of_a_nested_batch() -> None:
    import torch

    batch = {"feats": torch.zeros(2, 3), "lengths": [torch.zeros(4, dtype=torch.int64)], "keys": ["a", "b"]}
    assert batch_size_of(batch) == (2 * 3 * 4 + 4 * 8, 2)


def test_shm_need_is_measured_on_the_workloads_own_batch(no_nvml) -> None:
    request = DoctorRequest(model="cam++", per_device_batch_size=32, num_workers=3, prefetch_factor=4)
    found = one("loader.shm", request)
    data = found.data
    assert data["batch_bytes"] == 32 * CAMPP_ITEM_BYTES
    assert data["tensors_per_batch"] == 2
    assert data["shm_need_bytes"] == (3 * 4 + 1) * 32 * CAMPP_ITEM_BYTES  # one process: no GPU here
    assert "cam++'s recipe baseline with per_device_batch_size=32, num_workers=3, prefetch_factor=4" in found.value


def test_workers_without_a_prefetch_factor_use_the_dataloaders_default(no_nvml) -> None:
    data = one("loader.shm", DoctorRequest(model="cam++", per_device_batch_size=8, num_workers=1)).data
    assert data["prefetch_factor"] == 2
    assert data["shm_need_bytes"] == (1 * 2 + 1) * 8 * CAMPP_ITEM_BYTES


def test_a_loader_without_workers_needs_no_shm(no_nvml) -> None:
    found = one("loader.shm", DoctorRequest(model="cam++", per_device_batch_size=8, num_workers=0))
    assert found.verdict is Verdict.OK and found.data["shm_need_bytes"] == 0


def test_the_result_winners_loader_is_sized_for_every_process(no_nvml, tmp_path) -> None:
    config = TrialConfig(per_device_batch_size=16, num_workers=2, prefetch_factor=3, world_size=2)
    found = one("loader.shm", DoctorRequest(result=str(write_result(tmp_path, config))))
    assert found.data["ranks"] == 2
    assert found.data["shm_need_bytes"] == 2 * (2 * 3 + 1) * 16 * CAMPP_ITEM_BYTES
    assert "the --result's winner" in found.value


def test_preloaded_audio_counts_in_shared_memory(no_nvml, tmp_path) -> None:
    config = TrialConfig(per_device_batch_size=8, num_workers=0, preload_audio=True)
    found = one("loader.shm", DoctorRequest(result=str(write_result(tmp_path, config))))
    assert found.data["preload_bytes"] == int(0.5 * 3600 * 16000) * 2  # the result's 0.5 h as 16-bit PCM
    assert found.data["shm_need_bytes"] == found.data["preload_bytes"]


@pytest.mark.parametrize(
    ("free_bytes", "verdict"), [(2**40, Verdict.OK), (6 * 2**20, Verdict.WARN), (2 * 2**20, Verdict.FAIL)]
)
def test_shm_verdict_against_what_is_free(no_nvml, monkeypatch, free_bytes, verdict) -> None:
    monkeypatch.setattr(loader_checks.shutil, "disk_usage", lambda path: Usage(2**40, 0, free_bytes))
    request = DoctorRequest(model="cam++", per_device_batch_size=8, num_workers=2, prefetch_factor=2)
    found = one("loader.shm", request)  # needs 5 x 8 x 95 KiB = 3.6 MiB
    assert found.verdict is verdict
    if verdict is Verdict.FAIL:
        assert "--shm-size=1g" in found.fix


def test_shm_without_a_model_says_what_to_pass(no_nvml) -> None:
    found = one("loader.shm")
    assert found.verdict is Verdict.INFO
    assert "--model" in found.fix


def test_the_estimate_is_made_once_for_both_checks(no_nvml, monkeypatch) -> None:
    from autotune.doctor import loader

    calls = []
    real = loader._estimate
    monkeypatch.setattr(loader, "_estimate", lambda context: calls.append(1) or real(context))
    run_checks(DoctorRequest(model="cam++", per_device_batch_size=4), ["loader.shm", "loader.open_files"])
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("limits", "verdict"),
    [((65536, 65536), Verdict.OK), ((1024, 65536), Verdict.WARN), ((100, 100), Verdict.FAIL)],
    ids=["high", "low-soft-raisable", "below-need"],
)
def test_open_file_limit_against_the_descriptors_in_flight(no_nvml, monkeypatch, limits, verdict) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda kind: limits)
    found = one("loader.open_files", DoctorRequest(model="cam++", per_device_batch_size=4, num_workers=4))
    assert found.verdict is verdict
    assert found.data["need"] == 256 + (4 * 2 + 1) * 2
    if verdict is not Verdict.OK:
        assert "ulimit -n" in found.fix


class _CountingDataset:
    """Counts items fetched by the DataLoader's workers, across processes."""

    def __init__(self, counter) -> None:
        self.counter = counter

    def __len__(self) -> int:
        return 100

    def __getitem__(self, index: int) -> int:
        with self.counter.get_lock():
            self.counter.value += 1
        return index


def test_workers_keep_prefetch_factor_batches_each_in_flight_as_the_estimate_assumes() -> None:
    """torch's DataLoader, not a belief about it: untouched, 2 workers with prefetch_factor 3 produce 6 batches."""
    import multiprocessing
    import time

    import torch

    from autotune.doctor.loader import LoaderEstimate

    counter = multiprocessing.get_context("fork").Value("i", 0)
    loader = torch.utils.data.DataLoader(
        _CountingDataset(counter), batch_size=1, num_workers=2, prefetch_factor=3, multiprocessing_context="fork"
    )
    iterator = iter(loader)
    deadline = time.monotonic() + 20
    while counter.value < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # nothing more comes while nothing is consumed
    assert counter.value == 6
    next(iterator)  # the batch being trained on frees a slot: one more is fetched
    time.sleep(0.5)
    assert counter.value == 7
    del iterator
    config = TrialConfig(per_device_batch_size=1, num_workers=2, prefetch_factor=3)
    estimate = LoaderEstimate(
        config=config, config_from="", ranks=1, batch_bytes=1, tensors_per_batch=1, measured_on=""
    )
    assert estimate.batches_in_flight == 6 + 1


def test_data_the_workload_cannot_use_is_said_not_raised(no_nvml, tmp_path) -> None:
    from autotune.data.synth import generate_corpus

    corpus = generate_corpus(tmp_path / "c", n_speakers=1, files_per_speaker=1, min_duration_s=1.0, max_duration_s=1.0)
    for name in ("text", "data.list"):  # a folder of audio alone: no transcripts for ASR
        (corpus / name).unlink()
    found = one("loader.shm", DoctorRequest(model="conformer", data=str(corpus)))
    assert found.verdict is Verdict.INFO
    assert "its batches cannot be built" in found.value and "transcript" in found.value
