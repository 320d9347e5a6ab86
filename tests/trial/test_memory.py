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
        monkeypatch.setattr(
            cuda, "memory_stats", lambda device: {"reserved_bytes.all.peak": self.peak_reserved, "num_alloc_retries": 0}
        )
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
    fake.peak_allocated = 60 * GIB  # fragmented variable-length batches: cached segments held at the step's end
    fake.peak_reserved = fake.reserved = 70 * GIB
    memory.step_done()
    assert memory.sample() == 70 * GIB + GIB // 2  # not the 60 GiB of tensors: 88% of the device, not 75%
    fake.reserved = 10 * GIB
    assert memory.sample() == 70 * GIB + GIB // 2  # a peak stays a peak
    memory.stop()


def test_the_cuda_peak_is_read_at_steps_ends_where_a_search_s_workspace_is_gone(monkeypatch):
    """As on an H200 (benchmarks/results/gpu_proof-h200.md): cuDNN's benchmark search took the free device for a
    moment (an allocator peak of 137.8 GiB at CAM++ batch 256) and emptied the cache after it, while the steady window
    held 25 GB. What the allocator holds at a step's end is the step's need; a shape first met later searches again."""
    fake = FakeCuda()
    fake.install(monkeypatch)
    memory = PeakMemory(torch.device("cuda", 0))
    memory.start()
    fake.peak_reserved = 78 * GIB  # inside the first step: the search's workspace...
    fake.in_use = 20 * GIB
    fake.empty_cache()  # ...gone with the cache emptied after it
    fake.reserved = 24 * GIB  # the rest of the step grew the cache again
    fake.context = 3 * GIB // 2  # cuDNN's and cuBLAS's handles, kernels loaded lazily: outside the allocator
    memory.step_done()  # the first step's end
    fake.peak_reserved, fake.reserved = 79 * GIB, 21 * GIB  # a new shape, searched, in a later step
    memory.step_done()  # within STEP_READ_INTERVAL_S of the last: not read (a low reading changes nothing anyway)
    assert memory.sample() == 24 * GIB + 3 * GIB // 2  # the context read now, not only at start
    assert memory.allocator_peak_bytes == 79 * GIB + 3 * GIB // 2  # kept beside it, not judged
    fake.reserved = 30 * GIB  # a step that really needs more: the cache keeps it to the step's end
    assert memory.sample() == 30 * GIB + 3 * GIB // 2  # a reading is a step's end too
    memory.stop()


def test_a_cpu_peak_needs_no_step_readings():
    memory = PeakMemory(torch.device("cpu"))
    memory.start()
    before = memory.sample()
    memory.step_done()  # nothing: a thread polls the resident memory
    assert memory.sample() >= before > 0 and memory.allocator_peak_bytes is None
    memory.stop()


def test_the_cpu_peak_is_the_process_trees_resident_memory():
    memory = PeakMemory(torch.device("cpu"), interval_s=0.01)
    memory.start()
    held = torch.ones(64 * 2**20 // 4)  # 64 MiB touched
    peak = memory.sample()
    memory.stop()
    assert peak >= 64 * 2**20 and memory.capacity_bytes > peak
    del held
