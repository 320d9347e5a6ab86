"""Peak memory of a trial: what the device held at its peak on a GPU, the process tree's resident memory on a CPU.

On CUDA the peak is what the caching allocator held reserved, at its most, plus what the device held outside the
allocator (the CUDA context, cuBLAS and NCCL buffers, other processes on the same GPU). The allocated peak
(max_memory_allocated) counts tensors only: it leaves out the allocator's cached and fragmented segments, which
variable-length ASR batches make large, and the context's few hundred MiB, so a configuration could pass the headroom
gate by that figure and still run out of memory in training.

What the device holds outside the allocator is read at start and again at each reading, and the larger counts: the
context grows after start (CUDA loads kernels lazily, cuDNN and cuBLAS create their handles on first use), and the
start's reading alone fell short of NVML's figure on a GPU (benchmarks/gpu_proof.md#results, peak_memory).

The allocator's own peak is not training's under cudnn.benchmark: for each new input shape cuDNN's search
(pytorch/pytorch aten/src/ATen/native/cudnn/Conv_v8.cpp at 06ca69ca4e9b, generate_and_filter_plans and run_single_conv:
read, not run) allocates one workspace as large as its largest candidate needs, up to all the device has free, times its
candidates, and empties the cache after it. The reserved peak then reads most of the device while the steady window uses
a fraction of it, and every configuration with cudnn.benchmark would fail the headroom gate (what a GPU read:
benchmarks/gpu_proof.md#results, full_run and oom_study). So on CUDA the peak is read at the end of each training step
(`step_done`): the caching allocator gives nothing back between steps except through emptyCache (the search's own) or an
OOM retry, so what it holds reserved at a step's end is at least what the step needed at its peak, and a search's
workspace is gone by then. A step that searched mid-way (its cache emptied after its peak) reads low instead, never
high: for a fixed shape only the first steps search, and where shapes vary the worst-case scan (trial/worst_case.py)
trains its worst batches a second time, searches done, so the largest shapes are read exactly.
"""

from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path

import torch

from autotune.machine.cpu_load import process_tree

__all__ = ["PeakMemory", "process_tree_rss_bytes", "available_memory_bytes"]

# memory_reserved() builds the allocator's statistics (tens of microseconds): read at most this often at steps' ends
STEP_READ_INTERVAL_S = 0.01
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss_bytes(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return 0


def process_tree_rss_bytes(pid: int | None = None) -> int:
    """Resident memory of a process and all its descendants (DataLoader workers included), from /proc.

    Shared pages (torch's libraries mapped into each forked worker) are counted once per process, as the kernel's
    RSS does, so this is an upper bound of what the tree really holds.
    """
    return sum(_rss_bytes(member) for member in process_tree(pid))


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (what can still be used without swapping), or 0 when unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


class PeakMemory:
    """Tracks peak memory over the timed window and knows the device's capacity.

    On CUDA: the most the allocator held reserved at a step's end (`step_done`; module docstring) plus the most memory
    held outside the allocator, against the device's total memory; the allocator's own peak is kept beside it
    (`allocator_peak_bytes`, with cuDNN's searches in it: not judged). On a CPU: the process tree's RSS, sampled by a
    background thread, against the memory that was available when the trial started plus what the trial already
    held then.
    """

    def __init__(self, device: torch.device, interval_s: float = 0.1) -> None:
        self.device = device
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.outside_allocator_bytes = 0  # CUDA: held on the device but not by torch's caching allocator
        self.reserved_peak_bytes = 0  # CUDA: the most reserved at a step's end
        self.allocator_peak_bytes: int | None = None  # CUDA: the allocator's own peak + outside (searches in it)
        self.alloc_retries: int | None = None  # CUDA: cudaMalloc retried after freeing the cache (a search does)
        self._last_read_s = -math.inf
        if device.type == "cuda":
            self.capacity_bytes = int(torch.cuda.get_device_properties(device).total_memory)
        else:
            self.capacity_bytes = available_memory_bytes() + process_tree_rss_bytes()

    def start(self) -> None:
        """Start tracking from zero (called before the first training step)."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.outside_allocator_bytes = self._outside_allocator_now()
            return
        self.peak_bytes = process_tree_rss_bytes()
        if self._thread is None:
            self._thread = threading.Thread(target=self._poll, name="autotune-rss", daemon=True)
            self._thread.start()

    def step_done(self) -> None:
        """A training step's Python returned: on CUDA read what the allocator holds now (host-side bookkeeping: no
        sync, no driver call; at most every STEP_READ_INTERVAL_S, so that a fast step's window does not pay for it).
        Nothing on a CPU, whose thread polls."""
        if self.device.type == "cuda" and time.perf_counter() - self._last_read_s >= STEP_READ_INTERVAL_S:
            self._read_reserved()

    def _read_reserved(self) -> None:
        self._last_read_s = time.perf_counter()
        self.reserved_peak_bytes = max(self.reserved_peak_bytes, int(torch.cuda.memory_reserved(self.device)))

    def _outside_allocator_now(self) -> int:
        free, total = torch.cuda.mem_get_info(self.device)
        return max(0, int(total) - int(free) - int(torch.cuda.memory_reserved(self.device)))

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak_bytes = max(self.peak_bytes, process_tree_rss_bytes())

    def sample(self) -> int:
        """Take a last reading (on CUDA a step's end too) and return the peak so far."""
        if self.device.type == "cuda":
            self._read_reserved()
            self.outside_allocator_bytes = max(self.outside_allocator_bytes, self._outside_allocator_now())
            self.peak_bytes = self.reserved_peak_bytes + self.outside_allocator_bytes
            stats = torch.cuda.memory_stats(self.device)
            allocator = int(stats.get("reserved_bytes.all.peak", 0)) + self.outside_allocator_bytes
            self.allocator_peak_bytes = max(self.allocator_peak_bytes or 0, allocator)
            self.alloc_retries = int(stats.get("num_alloc_retries", 0))
        else:
            self.peak_bytes = max(self.peak_bytes, process_tree_rss_bytes())
        return self.peak_bytes

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
