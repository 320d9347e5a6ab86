"""The trial child: build the workload, run the timed loop, classify what went wrong, answer with JSON."""

from __future__ import annotations

import logging
import re
import time
import traceback
from typing import Any

from autotune.trial.spec import PROGRESS_SUFFIX, TrialResult, TrialSpec

__all__ = ["run_trial", "classify_exception"]

logger = logging.getLogger(__name__)

_WORKER_SIGNAL = re.compile(r"DataLoader worker \(pid \d+\) is killed by signal: (.+?)\.?\s*$", re.MULTILINE)
_WORKER_DIED = re.compile(r"DataLoader worker \(pid\(s\) [\d, ]+\) exited unexpectedly")


def classify_exception(error: BaseException) -> tuple[str, str]:
    """Status and one-line reason for an exception raised by a trial."""
    import torch

    from autotune.trial.loop import NonFiniteLossError
    from autotune.trial.signals import describe_signal_name

    lines = str(error).strip().splitlines() or [""]
    # An exception from a DataLoader worker arrives wrapped: "Caught X in DataLoader worker...\nOriginal Traceback"
    first_line = (lines[-1] if "Original Traceback" in str(error) else lines[0])[:300]
    if isinstance(error, torch.OutOfMemoryError):
        return "oom", f"out of memory: {first_line}"
    if isinstance(error, NonFiniteLossError):
        return "nonfinite", first_line
    worker_signal = _WORKER_SIGNAL.search(str(error))
    if worker_signal:
        return "signal", f"a DataLoader worker was killed: {describe_signal_name(worker_signal.group(1))}"
    if _WORKER_DIED.search(str(error)):
        return "signal", "a DataLoader worker exited unexpectedly (killed by a signal or crashed)"
    return "error", f"{type(error).__name__}: {first_line}"


def _measure(spec: TrialSpec, started: float) -> dict[str, Any]:
    import torch

    from autotune import workloads, yamlio
    from autotune.data import DataSource
    from autotune.trial.loop import build_loader, measure
    from autotune.trial.memory import PeakMemory
    from autotune.trial.precision import PrecisionSettings
    from autotune.workloads.base import WorkloadContext

    config, timing = spec.config, spec.timing
    if config.intra_op_threads is not None:
        torch.set_num_threads(config.intra_op_threads)
    torch.manual_seed(spec.seed)
    device = torch.device("cuda", 0) if spec.device_type == "cuda" else torch.device("cpu")
    precision = PrecisionSettings(
        precision=config.precision, device_type=device.type, cudnn_benchmark=config.cudnn_benchmark
    )
    precision.apply_backend_flags()
    workload = workloads.get(spec.workload)
    data = DataSource.from_dict(yamlio.read_json(spec.data_file))
    context = WorkloadContext(
        data=data, config=config, options={**workload.options, **spec.workload_options}, device=device
    )
    setup = workload.build(context)
    setup.model.to(device).train()
    total_batches = max(timing.warmup_steps, timing.max_warmup_steps) + timing.max_window_steps + 1
    loader = build_loader(setup, config, total_batches=total_batches, seed=spec.seed)
    memory = PeakMemory(device)
    telemetry = _telemetry_for(device)
    setup_s = time.perf_counter() - started
    batches = iter(loader)
    try:
        window = measure(
            setup,
            batches,
            config=config,
            timing=timing,
            precision=precision,
            device=device,
            memory=memory,
            on_window_start=telemetry.start if telemetry else lambda: None,
            on_progress=ProgressWriter(spec.result_path + PROGRESS_SUFFIX),
        )
    finally:
        memory.stop()
        gpu = telemetry.stop() if telemetry else {}
        # Shut the workers down now (persistent ones too), so nothing outlives the measurement.
        del batches
        loader = None  # noqa: F841
    summary = window.summary(len(setup.dataset), config)  # type: ignore[arg-type]
    summary.update(setup_s=setup_s, peak_memory_bytes=memory.peak_bytes, memory_capacity_bytes=memory.capacity_bytes)
    return {**summary, **gpu}


class ProgressWriter:
    """Tells the parent how the trial is going (for pruning), at most twice a second, through a small JSON file."""

    def __init__(self, path: str, interval_s: float = 0.5) -> None:
        self.path, self.interval_s, self._last = path, interval_s, 0.0

    def __call__(self, phase: str, samples_per_second: float, elapsed_s: float) -> None:
        from autotune import yamlio

        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            yamlio.write_json(
                self.path, {"phase": phase, "samples_per_second": samples_per_second, "elapsed_s": elapsed_s}
            )


def _telemetry_for(device: Any) -> Any:
    """NVML sampling of the trial's own GPU, found by UUID (NVML ignores CUDA_VISIBLE_DEVICES)."""
    if device.type != "cuda":
        return None
    import torch

    from autotune.telemetry import GpuTelemetry, nvml_uuid

    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return GpuTelemetry(nvml_uuid(uuid)) if uuid is not None else None


def _gate(result: TrialResult, spec: TrialSpec) -> TrialResult:
    """Apply the stability gates to a measured trial."""
    timing = spec.timing
    if result.peak_memory_bytes and result.memory_capacity_bytes:
        limit = (1.0 - timing.memory_headroom_fraction) * result.memory_capacity_bytes
        if result.peak_memory_bytes > limit:
            result.status = "headroom"
            result.reason = (
                f"peak memory {result.peak_memory_bytes / 2**30:.2f} GiB leaves less than "
                f"{timing.memory_headroom_fraction:.0%} of {result.memory_capacity_bytes / 2**30:.2f} GiB free"
            )
            return result
    if timing.max_step_time_cv is not None and (result.step_time_cv or 0.0) > timing.max_step_time_cv:
        result.status = "unstable"
        result.reason = f"step times vary too much (CV {result.step_time_cv:.2f} > {timing.max_step_time_cv:.2f})"
    return result


def run_trial(spec: TrialSpec, started: float | None = None) -> TrialResult:
    """Run one trial in this process and return its result; never raises for a failing configuration."""
    started = time.perf_counter() if started is None else started
    try:
        summary = _measure(spec, started)
    except Exception as error:  # every failure of a configuration is data for the study
        status, reason = classify_exception(error)
        logger.error("trial failed (%s): %s", status, reason)
        return TrialResult(status=status, reason=reason, log_tail=traceback.format_exc()[-4000:])
    result = TrialResult.from_dict({"status": "ok", "all_losses_finite": True, **summary})
    return _gate(result, spec)
