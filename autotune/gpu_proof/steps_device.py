"""Proof steps on the device's accounting: NVML telemetry and the fraction of the datasheet peak during a timed
window, autotune's CUDA peak memory against NVML's used memory, and NCCL collectives with DDP."""

from __future__ import annotations

import os
import time
from typing import Any

from autotune.gpu_proof.campplus import LossModule, build_campplus, campplus_loss, random_fbank_batch
from autotune.gpu_proof.registry import Proven, StepContext, step, synchronize

__all__ = ["PEAK_MATMUL_SIZE"]

PEAK_MATMUL_SIZE = 8192
WINDOW_S = 5.0
GIB = 2**30


def _gpu_name(device: Any) -> str:
    import torch

    return torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else "cpu"


def _telemetry(device: Any) -> Any:
    import torch

    from autotune.machine.telemetry import GpuTelemetry, nvml_uuid

    uuid = nvml_uuid(torch.cuda.get_device_properties(device).uuid) if torch.device(device).type == "cuda" else "none"
    return GpuTelemetry(uuid, interval_s=0.1)


@step(
    "telemetry", "NVML telemetry and the fraction of the datasheet peak over a timed bf16 window", budget_s=60, min_s=15
)
def telemetry(context: StepContext) -> Proven:
    import torch

    from autotune.trial.flops import peak_tflops

    device = torch.device(context.device)
    size = context.sized(PEAK_MATMUL_SIZE, 128)
    a, b = (torch.randn(size, size, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    sampler = _telemetry(device)
    sampler.open()  # NVML's start-up stays outside the window, as in a trial
    synchronize(device)
    sampler.start()
    started, calls = time.perf_counter(), 0
    while time.perf_counter() - started < context.sized(int(WINDOW_S), 1):
        for _ in range(10):
            a @ b
        calls += 10
        synchronize(device)
    elapsed = time.perf_counter() - started
    summary = sampler.stop()
    achieved = 2 * size**3 * calls / elapsed / 1e12
    peak = peak_tflops(_gpu_name(device), "bf16")
    numbers = {
        **summary,
        "telemetry_unavailable": sampler.unavailable_reason,
        "achieved_tflops": achieved,
        "peak_tflops": peak,
        "fraction_of_peak": achieved / peak if peak else None,
        "window_s": elapsed,
    }
    fraction = numbers["fraction_of_peak"]
    passed = (
        (summary["gpu_utilization_percent"] or 0) >= 50
        and summary["gpu_memory_used_bytes"] is not None
        and summary["gpu_power_watts"] is not None
        and fraction is not None
        and 0.2 <= fraction <= 1.05
    )
    return Proven(
        passed=passed,
        numbers=numbers,
        notes=[
            f"bf16 {PEAK_MATMUL_SIZE}^3 matmuls for {WINDOW_S:g} s, NVML sampled every 0.1 s by autotune's "
            "GpuTelemetry (the trials' sampler); passing needs utilisation >= 50%, memory and power read, and "
            "achieved TFLOP/s between 20% and 105% of autotune's peak table for this GPU (above it: the table is "
            "wrong for this GPU)",
        ],
    )


def _nvml_used(device: Any) -> tuple[int | None, int | None]:
    """(device memory used, this process's memory) from NVML; None where it does not say."""
    import torch

    from autotune.machine.telemetry import nvml_uuid

    try:
        import pynvml as nvml
    except ImportError:
        return None, None
    if torch.device(device).type != "cuda":
        return None, None
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(nvml_uuid(torch.cuda.get_device_properties(device).uuid).encode())
        used = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
        mine = None
        try:
            for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if process.pid == os.getpid() and process.usedGpuMemory is not None:
                    mine = int(process.usedGpuMemory)
        except nvml.NVMLError:
            pass
        return used, mine
    finally:
        nvml.nvmlShutdown()


@step("peak_memory", "autotune's CUDA peak memory against NVML's used memory", budget_s=60, min_s=15)
def peak_memory(context: StepContext) -> Proven:
    import torch

    from autotune.trial.memory import PeakMemory

    device = torch.device(context.device)
    tracker = PeakMemory(device)
    tracker.start()
    model, optimizer = build_campplus(device, 1000)
    features, labels = random_fbank_batch(device, context.sized(128, 2), 1000, frames=context.sized(298, 64))
    campplus_loss(model, features, labels).backward()
    optimizer.step()
    held = torch.empty(context.sized(4 * GIB, 2**20), dtype=torch.uint8, device=device).fill_(1)  # a known block
    synchronize(device)
    peak = tracker.sample()
    used, mine = _nvml_used(device)
    numbers: dict[str, Any] = {
        "autotune_peak_bytes": peak,
        "outside_allocator_bytes": tracker.outside_allocator_bytes,
        "nvml_device_used_bytes": used,
        "nvml_process_used_bytes": mine,
        "held_bytes": int(held.numel()),
    }
    if device.type == "cuda":
        numbers["max_memory_allocated_bytes"] = int(torch.cuda.max_memory_allocated(device))
        numbers["max_memory_reserved_bytes"] = int(torch.cuda.max_memory_reserved(device))
    gap = abs(peak - used) / used if used else None
    numbers["gap_fraction"] = gap
    return Proven(
        passed=gap is not None and gap < 0.05,
        numbers=numbers,
        notes=[
            "a CAM++ step at batch 128 and a 4 GiB block, all still held when both are read: autotune's peak "
            "(what the allocator holds reserved at a step's end + the most the device held outside it) must be "
            "within 5% of NVML's used memory of the device; max_memory_allocated alone leaves out the allocator's "
            "cache and the context",
        ],
    )


def _ranks(rank: int, world_size: int, port: int, device_type: str, answers: Any) -> None:
    import datetime as dt

    import torch
    import torch.distributed as dist

    device = torch.device(f"cuda:{rank}") if device_type == "cuda" else torch.device("cpu")
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type != "cuda":
        # The CPU rehearsal's ranks share the cores, as torchrun's would (it sets OMP_NUM_THREADS=1 for several
        # processes): ranks that each take every core spin against each other.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    extra: dict[str, Any] = {"device_id": device} if device_type == "cuda" else {}
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=dt.timedelta(seconds=60),
        **extra,
    )
    try:
        tensor = torch.full((64 * 2**20 if device_type == "cuda" else 2**16,), float(rank + 1), device=device)
        dist.all_reduce(tensor)
        synchronize(device)
        started = time.perf_counter()
        for _ in range(5):
            dist.all_reduce(tensor)
        synchronize(device)
        seconds = (time.perf_counter() - started) / 5
        expected = sum(range(1, world_size + 1)) * world_size**5
        model, optimizer = build_campplus(device, 100)
        wrapped = LossModule(model)
        ddp = torch.nn.parallel.DistributedDataParallel(wrapped, device_ids=[rank] if device_type == "cuda" else None)
        features, labels = random_fbank_batch(device, 2, 100, frames=64, seed=rank)
        loss = ddp(features, labels)
        loss.backward()
        optimizer.step()
        dist.barrier()
        if rank == 0:
            answers.put(
                {
                    "backend": backend,
                    "all_reduce_correct": bool(torch.all(tensor == expected)),
                    "all_reduce_256mib_s": seconds,
                    "ddp_loss_finite": bool(torch.isfinite(loss)),
                }
            )
    finally:
        dist.destroy_process_group()


@step(
    "nccl",
    "NCCL collectives and a DDP step on every visible GPU (one rank on a one-GPU machine)",
    budget_s=90,
    min_s=20,
)
def nccl(context: StepContext) -> Proven:
    import torch
    import torch.multiprocessing as mp

    from autotune.trial.launch import free_port

    world_size = max(1, min(2, torch.cuda.device_count())) if context.device == "cuda" else 2
    answers = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(
        _ranks, args=(world_size, free_port(), context.device, answers), nprocs=world_size, start_method="spawn"
    )
    numbers = {"world_size": world_size, **answers.get()}
    if context.device == "cuda":
        numbers["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    return Proven(
        passed=numbers["all_reduce_correct"] and numbers["ddp_loss_finite"],
        numbers=numbers,
        notes=[
            "`autotune run --devices 1` creates no process group (one rank needs none; trial/distributed.py), so "
            "NCCL is proven here directly: a process group on every visible GPU (at most 2), six all-reduces of 256 "
            "MiB checked for the right sum, and a DDP-wrapped CAM++ step",
        ],
    )
