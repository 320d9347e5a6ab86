"""Peak memory of a trial: what the device held at its peak on a GPU, the process tree's resident memory on a CPU.

On CUDA the peak is the caching allocator's peak of reserved memory plus what the device already held outside the
allocator when tracking started (the CUDA context, cuBLAS and NCCL buffers, other processes on the same GPU). The
allocated peak (max_memory_allocated) counts tensors only: it leaves out the allocator's cached and fragmented
segments, which variable-length ASR batches make large, and the context's few hundred MiB, so a configuration could
pass the headroom gate by that figure and still run out of memory in training.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import torch

from autotune.machine_load import process_tree

__all__ = ["PeakMemory", "process_tree_rss_bytes", "available_memory_bytes"]

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

    On CUDA: the allocator's reserved peak plus the memory held outside the allocator at start (module docstring),
    against the device's total memory. On a CPU: the process tree's RSS, sampled by a background thread, against the
    memory that was available when the trial started plus what the trial already held then.
    """

    def __init__(self, device: torch.device, interval_s: float = 0.1) -> None:
        self.device = device
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.outside_allocator_bytes = 0  # CUDA: held on the device but not by torch's caching allocator
        if device.type == "cuda":
            self.capacity_bytes = int(torch.cuda.get_device_properties(device).total_memory)
        else:
            self.capacity_bytes = available_memory_bytes() + process_tree_rss_bytes()

    def start(self) -> None:
        """Start tracking from zero (called before the first training step)."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            free, total = torch.cuda.mem_get_info(self.device)
            self.outside_allocator_bytes = max(0, int(total) - int(free) - int(torch.cuda.memory_reserved(self.device)))
            return
        self.peak_bytes = process_tree_rss_bytes()
        if self._thread is None:
            self._thread = threading.Thread(target=self._poll, name="autotune-rss", daemon=True)
            self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak_bytes = max(self.peak_bytes, process_tree_rss_bytes())

    def sample(self) -> int:
        """Take a last reading and return the peak so far."""
        if self.device.type == "cuda":
            reserved = int(torch.cuda.max_memory_reserved(self.device))
            self.peak_bytes = max(self.peak_bytes, reserved + self.outside_allocator_bytes)
        else:
            self.peak_bytes = max(self.peak_bytes, process_tree_rss_bytes())
        return self.peak_bytes

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
