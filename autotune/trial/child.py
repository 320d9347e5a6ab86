"""The trial child: build the workload, run the timed loop, classify what went wrong, answer with JSON."""

from __future__ import annotations

import logging
import os
import re
import time
import traceback
from typing import TYPE_CHECKING, Any

from autotune.machine.cpu_load import BUSY_OTHERS_FRACTION
from autotune.trial.distributed import RankInfo
from autotune.trial.run_length import RunLength
from autotune.trial.scaler import skip_gate_reason
from autotune.trial.spec import LAUNCHED_AT_ENV, PROGRESS_SUFFIX, TrialResult, TrialSpec

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from autotune.trial.loop import RateSpan

__all__ = ["run_trial", "classify_exception"]

logger = logging.getLogger(__name__)

_WORKER_SIGNAL = re.compile(r"DataLoader worker \(pid \d+\) is killed by signal: (.+?)\.?\s*$", re.MULTILINE)
_WORKER_DIED = re.compile(r"DataLoader worker \(pid\(s\) [\d, ]+\) exited unexpectedly")
# Out of memory as CUDA libraries report it, not as torch.OutOfMemoryError: a cuBLAS or cuDNN workspace that could
# not be allocated, or the CUDA runtime's own allocation error (raised as a plain RuntimeError / AcceleratorError).
_LIBRARY_OOM = re.compile(r"CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|CUDA error: out of memory")


def classify_exception(error: BaseException) -> tuple[str, str]:
    """Status and one-line reason for an exception raised by a trial."""
    import torch

    from autotune.trial.loop import BudgetStopped, NonFiniteLossError
    from autotune.trial.signals import describe_signal_name

    lines = str(error).strip().splitlines() or [""]
    # An exception from a DataLoader worker arrives wrapped: "Caught X in DataLoader worker...\nOriginal Traceback"
    first_line = (lines[-1] if "Original Traceback" in str(error) else lines[0])[:300]
    if isinstance(error, torch.OutOfMemoryError) or _LIBRARY_OOM.search(str(error)):
        return "oom", f"out of memory: {first_line}"
    if isinstance(error, NonFiniteLossError):
        return "nonfinite", first_line
    if isinstance(error, BudgetStopped):
        return "stopped", first_line
    if isinstance(error, EpochAccountingError):
        return "accounting", first_line
    worker_signal = _WORKER_SIGNAL.search(str(error))
    if worker_signal:
        return "signal", f"a DataLoader worker was killed: {describe_signal_name(worker_signal.group(1))}"
    if _WORKER_DIED.search(str(error)):
        return "signal", "a DataLoader worker exited unexpectedly (killed by a signal or crashed)"
    return "error", f"{type(error).__name__}: {first_line}"


def _measure(spec: TrialSpec, started: float, rank: RankInfo) -> dict[str, Any]:
    from autotune.knobs import compile_modes
    from autotune.knobs.precision import fp32_math
    from autotune.knobs.process import apply_process_settings
    from autotune.trial import distributed, interconnect
    from autotune.trial.compute_only import in_memory_batches
    from autotune.trial.flops import count_flops_per_sample
    from autotune.trial.loader import build_loader
    from autotune.trial.loop import measure
    from autotune.trial.memory import PeakMemory
    from autotune.trial.process import TrialProcess
    from autotune.trial.steady import planned_batches
    from autotune.trial.worst_case import WorstCaseScan, release_freed_memory, scan_worst_case

    config, timing = spec.config, spec.timing
    process = TrialProcess.open(spec, rank)
    device = process.device
    precision = process.precision(config)
    apply_process_settings(config, precision)  # threads and backend flags, as load_config's apply_backend_flags()
    distributed.start(rank, device, spec.collective_timeout_s)
    # The float32 maths this trial ran (fp32-default: whatever this torch defaults to); TF32 exists only on CUDA.
    math = fp32_math() if device.type == "cuda" else None
    setup = process.build(config)
    compile_modes.apply(setup.model, config.compile)  # in place: the optimiser and DDP see the same parameters
    accounting, mix = _check_epoch_accounting(setup, config, rank, spec.seed)
    total_batches = planned_batches(timing, config.grad_accum_steps)
    loader: DataLoader[Any] | None  # None once measured: its workers shut down
    loader = build_loader(setup, config, total_batches=total_batches, seed=spec.seed, rank=rank)
    forward = distributed.Forward(
        setup.model, setup.loss_fn, device, find_unused_parameters=setup.find_unused_parameters
    )
    memory = PeakMemory(device)
    telemetry = _telemetry_for(device)
    if telemetry:
        telemetry.open()  # NVML's start-up now, not at the window's edge where the ranks meet
    setup_s = time.perf_counter() - started
    scan = WorstCaseScan()
    if timing.worst_case_scan:  # the most expensive batches first: an OOM there fails the trial before warm-up
        scan = scan_worst_case(setup, config, forward=forward, precision=precision, device=device)
        release_freed_memory(device)
    if spec.compute_only:  # the ceiling: a few batches already on the device, no DataLoader in the window
        batches = in_memory_batches(setup, config, device=device, seed=spec.seed, rank=rank)
    else:
        batches = iter(loader)
    flops = None
    gpu: dict[str, float | int | None] = {}  # GpuTelemetry.stop()'s summary
    progress = ProgressWriter(spec.result_path + PROGRESS_SUFFIX, scale=rank.world_size) if rank.rank == 0 else None
    try:
        window = measure(
            setup,
            batches,
            config=config,
            timing=timing,
            precision=precision,
            device=device,
            memory=memory,
            forward=forward,
            spent_before_s=_spent_since_launch(started),
            on_window_start=telemetry.start if telemetry else lambda: None,
            on_progress=progress or (lambda phase, rate, elapsed_s, span: None),
            stop_by=None if rank.distributed else _stop_by(spec),
        )
        gpu = telemetry.stop() if telemetry else {}  # the window's figures: not the FLOP counting's below
        # A window the budget cut is written at once: the budget's kill follows (counting FLOPs is slow, and an epoch
        # boundary's wait may take an epoch's batches)
        if spec.count_flops and not window.cut_by_budget:  # after the window: counting is slow
            flops = count_flops_per_sample(setup, next(batches), precision, device)
        if not spec.compute_only and not window.cut_by_budget:
            samples = _epoch_samples(setup, config, rank)
            window.epoch_boundary_s = _epoch_boundary(loader, batches, window, config, samples)
    finally:
        memory.stop()
        if telemetry:
            telemetry.stop()  # a trial that failed in its window still closes NVML
        # Shut the workers down now (persistent ones too), so nothing outlives the measurement.
        del batches
        loader = None  # noqa: F841
    summary = window.summary(_objective_epoch(setup, config, rank, spec.run_length), config, spec.run_length, mix=mix)
    summary.update(setup_s=setup_s, preload_s=setup.preload_s, memory_capacity_bytes=memory.capacity_bytes)
    summary.update(flops_per_sample=flops)
    summary.update(scan.summary(), peak_memory_bytes=max(memory.peak_bytes, scan.peak_memory_bytes))
    summary.update(allocator_peak_memory_bytes=memory.allocator_peak_bytes, cuda_alloc_retries=memory.alloc_retries)
    own = {**summary, **gpu, "samples": window.samples, "audio_s": window.audio_s, "host": interconnect.rank_host()}
    summaries = distributed.all_gather(own)
    distributed.stop()
    combined = combine_rank_summaries(summaries, device_type=device.type)
    if rank.distributed:  # where the ranks ran and how they talked (trial/interconnect.py)
        hosts = [item["host"] for item in summaries]
        combined.update(nodes=len(set(hosts)), hosts=hosts, interconnect=interconnect.facts(device.type))
    return {**combined, "world_size": rank.world_size, "epoch_accounting": accounting.to_dict(), "fp32_math": math}


def _epoch_samples(setup: Any, config: Any, rank: RankInfo) -> int:
    """This rank's share of an epoch."""
    from autotune.trial.sampling import epoch_size

    return max(1, epoch_size(setup, config, rank.world_size) // rank.world_size)


def _objective_epoch(setup: Any, config: Any, rank: RankInfo, run: RunLength) -> int:
    """This rank's share of the epoch the objective charges over: the user's where given, else the data's."""
    if run.epoch_samples is not None:
        return max(1, run.epoch_samples // rank.world_size)
    return _epoch_samples(setup, config, rank)


def _epoch_boundary(loader: Any, batches: Any, window: Any, config: Any, samples: int) -> float | None:
    """A new epoch's extra wait, where it could matter (trial/epoch_boundary.py); None where it was not measured."""
    from autotune.trial import epoch_boundary

    steps = max(1, len(window.step_times_s))
    epoch_s = samples / max(window.samples / max(window.window_s, 1e-9), 1e-9)
    if not epoch_boundary.worth_measuring(
        num_workers=config.num_workers, loader_start_s=window.loader_start_s, epoch_s=epoch_s
    ):
        return None
    return epoch_boundary.epoch_boundary_s(loader, batches, steady_wait_s=window.data_wait_s / steps)


def _stop_by(spec: TrialSpec) -> float | None:
    """When the run's --budget ends this trial, on this process's perf_counter clock; None where it sets no end."""
    if spec.window_deadline_unix_s is None:
        return None
    return time.perf_counter() + (spec.window_deadline_unix_s - time.time())


def _spent_since_launch(started: float) -> float:
    """Seconds since the parent launched this process (start, imports, setup): the window is measured against them."""
    launched_at = os.environ.get(LAUNCHED_AT_ENV)
    return max(0.0, time.time() - float(launched_at)) if launched_at else time.perf_counter() - started


class EpochAccountingError(RuntimeError):
    """The ranks' epochs do not add up to the dataset: the data is split wrongly across ranks."""


def _check_epoch_accounting(setup: Any, config: Any, rank: RankInfo, seed: int) -> tuple[Any, Any]:
    """Count this rank's first epoch, gather every rank's count, and fail the trial if they do not add up. Also this
    rank's epoch mix (trial/epoch_mix.py) where the workload's items differ in length; None otherwise."""
    from autotune.trial import distributed
    from autotune.trial.epoch_mix import EpochMix
    from autotune.trial.sampling import EpochAccounting, count_epoch, epoch_batches, epoch_size

    batches = epoch_batches(setup, config, rank=rank.rank, world_size=rank.world_size, seed=seed, epoch=0, fill=False)
    own = count_epoch(batches, setup.item_audio_s)
    counts = distributed.all_gather(own)
    accounting = EpochAccounting(
        dataset_size=epoch_size(setup, config, rank.world_size),
        world_size=rank.world_size,
        per_device_batch_size=config.per_device_batch_size,
        batches_per_rank=tuple(count[0] for count in counts),
        samples_per_rank=tuple(count[1] for count in counts),
        largest_batch=max(count[2] for count in counts),
        buckets=plan.to_dict() if (plan := getattr(batches, "plan", None)) is not None else None,
    )
    mismatch = accounting.mismatch()
    if mismatch:
        raise EpochAccountingError(mismatch)
    mix = None
    if setup.item_audio_s is not None and accounting.checkable:  # a share smaller than a batch is measured repeated
        mix = EpochMix(batches=own[0], samples=own[1], audio_s=own[3])
    return accounting, mix


# A rank's raw figures that the trial's are combined from (throughput, other processes' CPU share): no result field.
_RANK_ONLY = ("samples", "audio_s", "host", "window_cpu_busy_s", "window_cpu_own_s", "window_cpu_capacity_s")


def combine_rank_summaries(summaries: list[dict[str, Any]], *, device_type: str) -> dict[str, Any]:
    """One trial's figures from every rank's: throughput summed over the shared window, the worst rank elsewhere.

    Ranks met at both edges of the window, so the trial's window is the longest rank's and its throughput is all
    samples over that window. Step times, data wait and set-up are the slowest rank's (it sets the pace); peak
    memory is per device on a GPU (the fullest one) and summed on a CPU (the ranks share the machine's RAM).
    """
    if len(summaries) == 1:
        return {key: value for key, value in summaries[0].items() if key not in _RANK_ONLY}
    per_rank = [item["samples"] / item["window_s"] for item in summaries]

    def largest(key: str) -> Any:
        values = [item[key] for item in summaries if item.get(key) is not None]
        return max(values) if values else None

    def mean(key: str) -> Any:
        values = [item[key] for item in summaries if item.get(key) is not None]
        return sum(values) / len(values) if values else None

    window_s = largest("window_s")
    window_rate = sum(item["samples"] for item in summaries) / window_s
    # Each rank's objective already amortises its loader start-up over its share of an epoch; keep the worst.
    epoch_factor = min(item["samples_per_second"] / item["window_samples_per_second"] for item in summaries)
    combined = {key: largest(key) for key in summaries[0] if key not in _RANK_ONLY}
    combined.update(
        samples_per_second=window_rate * epoch_factor,
        window_samples_per_second=window_rate,
        # each rank's audio per sample over its epoch (its window's where it counted no epoch mix)
        audio_seconds_per_second=window_rate
        * epoch_factor
        * sum(item["audio_seconds_per_second"] for item in summaries)
        / sum(item["samples_per_second"] for item in summaries),
        window_steps=summaries[0]["window_steps"],
        per_rank_samples_per_second=per_rank,
        gpu_utilization_percent=mean("gpu_utilization_percent"),
        gpu_power_watts=mean("gpu_power_watts"),
    )
    combined["others_cpu_fraction"] = _others_across_ranks(summaries)
    held = [item.get("worst_case_optimizer_state_held") for item in summaries]
    combined["worst_case_optimizer_state_held"] = all(held) if None not in held else None  # every rank's, not any
    if device_type != "cuda":
        combined["peak_memory_bytes"] = sum(item["peak_memory_bytes"] or 0 for item in summaries)
    else:
        combined["memory_capacity_bytes"] = min(item["memory_capacity_bytes"] for item in summaries)
    return combined


def _others_across_ranks(summaries: list[dict[str, Any]]) -> float | None:
    """Other processes' share of the CPUs during the shared window: every rank's process tree is ours, not other."""
    # Each rank's figure (seconds), or None where it had none: then the check below returns before any arithmetic
    busy: list[Any] = [item.get("window_cpu_busy_s") for item in summaries]
    own: list[Any] = [item.get("window_cpu_own_s") for item in summaries]
    capacity: list[Any] = [item.get("window_cpu_capacity_s") for item in summaries]
    if None in busy or None in own or None in capacity or not max(capacity):
        return None
    return min(1.0, max(0.0, (max(busy) - sum(own)) / max(capacity)))


class ProgressWriter:
    """Tells the parent how the trial is going (for pruning), at most twice a second, through a small JSON file.

    With the span a rate covers (trial/loop.py RunningRates) the reading says which steps those are (after_steps,
    steps, seconds) and the share of the CPUs other processes took meanwhile, so that the pruner holds it to the bar
    those steps deserve (search/pruning.py). A writer without one (own training's probe) writes the rate alone.
    """

    def __init__(self, path: str, interval_s: float = 0.5, scale: int = 1) -> None:
        self.path, self.interval_s, self._last = path, interval_s, 0.0
        self.scale = scale  # rank 0 speaks for all ranks: its rate times the world size

    def __call__(self, phase: str, samples_per_second: float, elapsed_s: float, span: RateSpan | None = None) -> None:
        from autotune import yamlio

        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            rate = samples_per_second * self.scale
            reading: dict[str, Any] = {"phase": phase, "samples_per_second": rate, "elapsed_s": elapsed_s}
            if span is not None:
                reading.update(after_steps=span.after_steps, steps=span.steps, seconds=span.seconds)
                reading.update(others_cpu_fraction=self._others(span))
            yamlio.write_json(self.path, reading)

    def _others(self, span: RateSpan) -> float | None:
        """Other processes' share of the CPUs over the span; None across ranks (rank 0's process tree is not the
        trial's: the other ranks would count as other processes)."""
        from autotune.machine.cpu_load import cpu_sample, others_fraction

        if self.scale > 1 or span.since is None:
            return None
        return others_fraction(span.since, cpu_sample())


def _telemetry_for(device: Any) -> Any:
    """NVML sampling of the trial's own GPU, found by UUID (NVML ignores CUDA_VISIBLE_DEVICES)."""
    if device.type != "cuda":
        return None
    import torch

    from autotune.machine.telemetry import GpuTelemetry, nvml_uuid

    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return GpuTelemetry(nvml_uuid(uuid)) if uuid is not None else None


def _gate(result: TrialResult, spec: TrialSpec) -> TrialResult:
    """Apply the stability gates to a measured trial."""
    timing = spec.timing
    if result.peak_memory_bytes and result.memory_capacity_bytes:
        memory_limit = (1.0 - timing.memory_headroom_fraction) * result.memory_capacity_bytes
        if result.peak_memory_bytes > memory_limit:
            result.status = "headroom"
            result.reason = (
                f"peak memory {result.peak_memory_bytes / 2**30:.2f} GiB leaves less than "
                f"{timing.memory_headroom_fraction:.0%} of {result.memory_capacity_bytes / 2**30:.2f} GiB free"
            )
            return result
    limit = timing.max_throughput_cv
    if limit is not None and result.throughput_cv is not None and result.throughput_cv > limit:
        others = result.others_cpu_fraction
        if others is not None and others >= BUSY_OTHERS_FRACTION:
            # Someone else's job, not the configuration: kept as a measurement, flagged, and the tuner re-measures it
            # later among the leaders instead of condemning it (or retrying it at once, into the same load).
            result.disturbed = True
            result.reason = (
                f"throughput varied across the window (CV {result.throughput_cv:.2f} over its quarters) while other "
                f"processes took {others:.0%} of the CPU: disturbed, not erratic"
            )
            return result
        result.status = "erratic"
        result.reason = (
            f"throughput varies too much across the window (CV {result.throughput_cv:.2f} over its quarters > "
            f"{limit:.2f})"
        )
        return result
    skipped = skip_gate_reason(result.scaler_skip_fraction, timing.max_scaler_skip_fraction)
    if skipped:
        result.status, result.reason = "unstable", skipped
    return result


def run_trial(spec: TrialSpec, started: float | None = None, rank: RankInfo | None = None) -> TrialResult:
    """Run one trial (this rank's part of it) in this process and return its result; never raises for a failing
    configuration. Under several ranks only rank 0's result speaks for the trial, unless another rank fails."""
    started = time.perf_counter() if started is None else started
    rank = rank or RankInfo()
    try:
        summary = _measure(spec, started, rank)
    except Exception as error:  # every failure of a configuration is data for the study
        status, reason = classify_exception(error)
        if rank.distributed:
            reason = f"rank {rank.rank} of {rank.world_size}: {reason}"
        logger.error("trial failed (%s): %s", status, reason)
        # a trial the budget stopped says what its steps took: the run's error names the budget that would measure it
        step_s = getattr(error, "step_s", None) if status == "stopped" else None
        return TrialResult(
            status=status, reason=reason, step_time_median_s=step_s, log_tail=traceback.format_exc()[-4000:]
        )
    result = TrialResult.from_dict({"status": "ok", "all_losses_finite": True, **summary})
    return _gate(result, spec)
