"""What bounds the winner, data pipeline or compute, and the next thing to try: from its measured figures alone.

The evidence is what the trials measured: the share of the window the step waited for its next batch (data-wait
fraction), the winner's throughput as a fraction of the compute-only ceiling (pipeline efficiency: the same step on
batches already in memory), GPU utilisation from NVML, the fraction of the device's dense peak, and memory headroom.
A step that waits for data, or runs well below its own ceiling, is bound by the data pipeline; otherwise by compute.
The suggestions follow the seed cases: more workers, decoded audio preloaded into RAM when the corpus fits a memory
budget, faster storage when it does not; for compute, an autocast precision the search did not cover, a larger
batch while memory allows and the search has not already measured one (LargerBatches), more devices.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.data.pcm import pcm_bytes_of_seconds
from autotune.knobs.precision import TORCH_DEFAULT_FP32

if TYPE_CHECKING:
    from autotune.knobs.config import TrialConfig
    from autotune.machine.hardware import Hardware
    from autotune.result.measurements import Measurements

__all__ = ["DiagnosisSettings", "Diagnosis", "LargerBatches", "diagnose", "decoded_audio_bytes"]

DATA_BOUND, COMPUTE_BOUND, UNKNOWN = "data pipeline", "compute", "unknown"


@dataclass(frozen=True, kw_only=True, slots=True)
class DiagnosisSettings:
    """Thresholds of the diagnosis."""

    max_data_wait_fraction: float = 0.10  # a step waiting longer than this for data is data-bound
    min_pipeline_efficiency: float = 0.85  # end to end below this share of the compute-only ceiling is data-bound
    min_gpu_utilization_percent: float = 80.0
    preload_memory_fraction: float = 0.25  # decoded audio may take this share of host RAM
    low_memory_use_fraction: float = 0.5  # peak memory below this share of the device: room for a larger batch


@dataclass(frozen=True, kw_only=True, slots=True)
class Diagnosis:
    """What bounds the winner, the measured evidence, and what to try next (most promising first)."""

    bound: str  # "data pipeline" | "compute" | "unknown"
    evidence: tuple[str, ...]
    next: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"bound": self.bound, "evidence": list(self.evidence), "next": list(self.next)}


@dataclass(frozen=True, kw_only=True, slots=True)
class LargerBatches:
    """What the run learned about batches larger than the winner's, at the winner's precision (and threads, on a CPU).

    A larger batch is worth suggesting only where the search could not have measured one: the space offers none above
    the winner's, or the budget ran out before one was tried. Where larger batches were measured and lost, or ran out
    of memory, the suggestion would send the user to re-measure what the run already did.
    """

    knob: str  # the knob that sets the batch: per_device_batch_size, or a workload's (max_frames_in_batch)
    winner_value: int
    largest_offered: int | None  # the space's largest value of the knob; None when the search does not vary it
    best_measured: tuple[str, float, int] | None = None  # the fastest: (configuration, median samples/s, windows)
    pruned: int = 0  # larger ones stopped early as far slower than the best so far
    out_of_memory: tuple[str, ...] = ()  # larger ones rejected for memory (oom, headroom): their configurations


def decoded_audio_bytes(data: dict[str, Any]) -> int | None:
    """Bytes of the whole list's audio decoded to 16-bit PCM (from DataSource.describe()), None when unknown."""
    hours = data.get("total_audio_hours")
    if not hours:
        return None
    rate = max(data.get("sample_rates") or [16000])
    measured, total = data.get("n_utterances") or 0, data.get("n_utterances_total") or 0
    scale = total / measured if measured and total > measured else 1.0  # a sampled list stands for the whole
    return pcm_bytes_of_seconds(hours * 3600 * scale, rate)  # as data/preload.py stores it


def _data_evidence(winner: Measurements, compute: dict[str, Any], settings: DiagnosisSettings) -> list[str]:
    found = []
    wait = winner.data_wait_fraction
    if wait is not None and wait > settings.max_data_wait_fraction:
        limit = settings.max_data_wait_fraction
        found.append(f"the step waited for data {wait:.0%} of the timed window (above {limit:.0%})")
    efficiency = compute.get("pipeline_efficiency")
    if efficiency is not None and efficiency < settings.min_pipeline_efficiency:
        found.append(
            f"end to end it runs at {efficiency:.0%} of its compute-only ceiling "
            f"({compute.get('ceiling_samples_per_second')} samples/s on batches already in memory)"
        )
    return found


def _larger_batch_evidence(winner: Measurements, larger: LargerBatches | None) -> list[str]:
    """What the search measured above the winner's batch: why a larger batch is not the next thing to try."""
    if larger is None:
        return []
    found = []
    if larger.best_measured is not None:
        config, rate, windows = larger.best_measured
        versus = winner.samples_per_second
        against = f" against the winner's {versus:.3g}" if versus else ""
        found.append(
            f"larger batches were measured: the fastest, {config}, ran {rate:.3g} samples/s (median of {windows})"
            f"{against}"
        )
    if larger.pruned:
        found.append(f"{larger.pruned} configuration(s) with a larger batch were stopped early as far slower")
    if larger.out_of_memory:
        shown = ", ".join(larger.out_of_memory[:3]) + (", ..." if len(larger.out_of_memory) > 3 else "")
        found.append(f"larger batches ran out of memory or headroom: {shown}")
    return found


def _compute_evidence(winner: Measurements, compute: dict[str, Any]) -> list[str]:
    found = []
    wait, efficiency = winner.data_wait_fraction, compute.get("pipeline_efficiency")
    if wait is not None:
        found.append(f"the step waited for data only {wait:.0%} of the timed window")
    if efficiency is not None and efficiency >= 1.0:
        # The ceiling is one window and the winner a median of several: above 100% is noise, not a faster pipeline.
        found.append(f"end to end it runs at its compute-only ceiling (measured {efficiency:.0%}: above 100% is noise)")
    elif efficiency is not None:
        found.append(f"end to end it runs at {efficiency:.0%} of its compute-only ceiling")
    fraction = compute.get("fraction_of_peak")
    if fraction is not None:
        found.append(f"it reaches {fraction:.0%} of the device's dense peak at its precision")
    return found


def _data_next(config: TrialConfig, hardware: Hardware, data: dict[str, Any], settings: DiagnosisSettings) -> list[str]:
    steps = []
    cores = hardware.cpu_cores
    if hardware.device_type == "cpu":
        threads = config.intra_op_threads or cores
        steps.append(
            f"rebalance DataLoader workers ({config.num_workers}) against intra-op threads ({threads}): decoding and "
            f"training share the {cores} CPU cores"
        )
    elif config.num_workers < cores:
        steps.append(f"more DataLoader workers (now {config.num_workers}; this machine has {cores} CPU cores)")
    decoded, budget = decoded_audio_bytes(data), settings.preload_memory_fraction * hardware.memory_bytes
    if config.preload_audio:
        pass  # already preloaded: no storage reads or decoding per step left to remove
    elif decoded is not None and budget and decoded <= budget:
        steps.append(
            f"preload the decoded audio into RAM (~{decoded / 2**30:.1f} GiB as 16-bit PCM, within the "
            f"{budget / 2**30:.0f} GiB budget of {settings.preload_memory_fraction:.0%} of RAM): no decoding or "
            "storage reads per step"
        )
    elif decoded is not None:
        steps.append(
            f"faster local storage (NVMe) or precomputed features: the decoded corpus (~{decoded / 2**30:.0f} GiB) "
            f"is larger than the {budget / 2**30:.0f} GiB RAM budget for preloading"
        )
    if hardware.device_type == "cuda" and not config.pin_memory:
        steps.append("pin_memory=True, so host-to-device copies run asynchronously")
    return steps


def _compute_knobs(config: TrialConfig) -> str:
    threads = f" with {config.intra_op_threads} intra-op thread(s)" if config.intra_op_threads is not None else ""
    return f"{config.precision}{threads}"


def _compute_next(
    winner: Measurements,
    config: TrialConfig,
    hardware: Hardware,
    searched_precisions: Collection[str],
    rejected_precisions: Collection[str],
    settings: DiagnosisSettings,
    larger: LargerBatches | None,
) -> list[str]:
    steps = []
    if config.precision in ("fp32", TORCH_DEFAULT_FP32, "tf32"):
        untried = [
            p
            for p in ("bf16", "fp16", "tf32")
            if p in hardware.supported_precisions() and p not in searched_precisions and p not in rejected_precisions
        ]
        if untried:
            steps.append(f"{untried[0]} (the search covered {', '.join(sorted(searched_precisions)) or 'no other'})")
    peak, capacity = winner.peak_memory_bytes, winner.memory_capacity_bytes
    if peak and capacity and peak < settings.low_memory_use_fraction * capacity:
        memory = f"peak memory is {peak / capacity:.0%} of the device"
        if larger is None or larger.largest_offered is None:
            steps.append(f"a larger per-device batch where the recipe allows it ({memory})")
        elif larger.best_measured is None and not larger.pruned and not larger.out_of_memory:
            if larger.largest_offered > larger.winner_value:
                steps.append(
                    f"a larger {larger.knob} ({memory}): the space offers up to {larger.largest_offered}, but this run "
                    f"measured none above {larger.winner_value} at {_compute_knobs(config)} (a longer --budget or "
                    "more --trials would)"
                )
            else:
                steps.append(
                    f"a larger {larger.knob} than the space's largest ({larger.winner_value}) where the recipe allows "
                    f"it ({memory}): add larger choices to the search space"
                )
    devices = hardware.device_count if hardware.device_type == "cuda" else 1
    if config.world_size < devices:
        steps.append(f"more devices: {config.world_size} of this machine's {devices} GPUs trained (--devices)")
    else:
        steps.append("more devices (data parallel across machines): the training step itself is the limit here")
    return steps


def diagnose(
    winner: Measurements,
    *,
    config: TrialConfig,
    hardware: Hardware,
    data: dict[str, Any],
    compute: dict[str, Any] | None = None,
    searched_precisions: Collection[str] = (),
    rejected_precisions: Collection[str] = (),
    larger_batches: LargerBatches | None = None,
    settings: DiagnosisSettings = DiagnosisSettings(),  # noqa: B008 - frozen
) -> Diagnosis:
    """Say what bounds the winner and what to try next.

    Args:
        winner: the winner's measurements (summarise_measurements: data_wait_fraction, gpu_utilization_percent,
            peak_memory_bytes, memory_capacity_bytes, ...).
        config: the winner's configuration.
        hardware: the machine.
        data: DataSource.describe() of the data measured on.
        compute: pipeline_efficiency, ceiling_samples_per_second, fraction_of_peak where measured.
        searched_precisions: the precisions the search space offered.
        rejected_precisions: precisions the AMP check rejected.
        larger_batches: what the search measured above the winner's batch (None: unknown, so a larger batch is
            suggested whenever memory allows).
        settings: thresholds.
    """
    compute = compute or {}
    if winner.data_wait_fraction is None and compute.get("pipeline_efficiency") is None:
        return Diagnosis(bound=UNKNOWN, evidence=("no data-wait or ceiling measurement",), next=())
    evidence = _data_evidence(winner, compute, settings)
    utilisation = winner.gpu_utilization_percent
    low_utilisation = utilisation is not None and utilisation < settings.min_gpu_utilization_percent
    if evidence:
        if low_utilisation:
            evidence.append(f"the GPU was busy {utilisation:.0f}% of the time")
        steps = _data_next(config, hardware, data, settings)
        return Diagnosis(bound=DATA_BOUND, evidence=tuple(evidence), next=tuple(steps))
    evidence = _compute_evidence(winner, compute) + _larger_batch_evidence(winner, larger_batches)
    if low_utilisation:
        evidence.append(
            f"GPU utilisation is {utilisation:.0f}% without waiting for data: host-side overhead between small "
            "kernels (a larger batch or torch.compile helps)"
        )
    steps = _compute_next(winner, config, hardware, searched_precisions, rejected_precisions, settings, larger_batches)
    return Diagnosis(bound=COMPUTE_BOUND, evidence=tuple(evidence), next=tuple(steps))
