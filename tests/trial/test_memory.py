"""Peak memory against capacity: what the device really held on CUDA (faked here), the process tree on a CPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from autotune.trial.memory import PeakMemory

GIB = 2**30


class FakeCuda:
    """torch.cuda's memory queries for one 80 GiB device: a 0.5 GiB context, then an allocator that caches."""

    def __init__(self) -> None:
        self.reserved, self.peak_reserved, self.peak_allocated, self.context = 2 * GIB, 2 * GIB, 1 * GIB, GIB // 2
        self.resets = 0
        self.in_use = GIB  # what live tensors (and their blocks) hold

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=80 * GIB))
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", self.reset)
        monkeypatch.setattr(cuda, "mem_get_info", lambda device: (80 * GIB - self.context - self.reserved, 80 * GIB))
        monkeypatch.setattr(cuda, "memory_reserved", lambda device: self.reserved)
        monkeypatch.setattr(cuda, "max_memory_reserved", lambda device: self.peak_reserved)
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda device: self.peak_allocated)
        monkeypatch.setattr(cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(cuda, "empty_cache", self.empty_cache)

    def empty_cache(self) -> None:
        self.reserved = self.in_use  # the cached, unused blocks go back to the device

    def reset(self, device: torch.device) -> None:
        self.resets += 1
        self.peak_reserved, self.peak_allocated = self.reserved, 0


def test_the_cuda_peak_is_reserved_memory_plus_what_the_allocator_does_not_hold(monkeypatch):
    fake = FakeCuda()
    fake.install(monkeypatch)
    memory = PeakMemory(torch.device("cuda", 0))
    assert memory.capacity_bytes == 80 * GIB
    memory.start()
    assert fake.resets == 1 and memory.outside_allocator_bytes == GIB // 2  # the context, measured at start
    fake.peak_allocated, fake.peak_reserved = 60 * GIB, 70 * GIB  # fragmented variable-length batches: cached segments
    assert memory.sample() == 70 * GIB + GIB // 2  # not the 60 GiB of tensors: 88% of the device, not 75%
    fake.peak_reserved = 10 * GIB
    assert memory.sample() == 70 * GIB + GIB // 2  # a peak stays a peak
    memory.stop()


def test_the_cuda_peak_restarts_after_warm_up_without_the_search_s_workspace(monkeypatch):
    """As on an H200 (benchmarks/results/gpu_proof-h200.md): cuDNN's benchmark search took the free device for a
    moment (a reserved peak of 137.8 GiB at CAM++ batch 256) while the steady window held 25 GB."""
    fake = FakeCuda()
    fake.install(monkeypatch)
    memory = PeakMemory(torch.device("cuda", 0))
    memory.start()
    fake.peak_reserved = fake.reserved = 78 * GIB  # the search's workspace, freed into the cache
    fake.in_use = 20 * GIB
    fake.context = 3 * GIB // 2  # cuDNN's and cuBLAS's handles, kernels loaded lazily: outside the allocator
    warmup_peak = memory.sample()
    assert warmup_peak == 78 * GIB + 3 * GIB // 2  # the context read now, not only at start
    memory.drop_cache()
    assert fake.reserved == 20 * GIB
    fake.reserved = fake.peak_reserved = 24 * GIB  # the step after it grew the working set again
    memory.restart()
    assert fake.peak_reserved == 24 * GIB and memory.peak_bytes == 0
    fake.peak_reserved = 25 * GIB  # the window's own peak
    assert memory.sample() == 25 * GIB + 3 * GIB // 2
    memory.stop()


def test_a_cpu_peak_has_no_restart():
    memory = PeakMemory(torch.device("cpu"))
    assert not memory.restarts_on_cuda
    memory.start()
    before = memory.sample()
    memory.drop_cache()
    memory.restart()  # nothing: resident memory has no search to leave out
    assert memory.sample() >= before > 0
    memory.stop()


def test_the_cpu_peak_is_the_process_trees_resident_memory():
    memory = PeakMemory(torch.device("cpu"), interval_s=0.01)
    memory.start()
    held = torch.ones(64 * 2**20 // 4)  # 64 MiB touched
    peak = memory.sample()
    memory.stop()
    assert peak >= 64 * 2**20 and memory.capacity_bytes > peak
    del held
