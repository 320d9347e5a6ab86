"""What a trial's timed window measured, and the statistics its result carries: throughput, its objective over the
run, step times, the spread of its parts (the stability gate), other processes' share of the CPUs."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from autotune.knobs import compile_modes
from autotune.knobs.config import TrialConfig
from autotune.machine.cpu_load import CpuSample, others_fraction
from autotune.trial.compile_watch import CompileCost
from autotune.trial.epoch_mix import EpochMix, epoch_mix_factor
from autotune.trial.run_length import RunLength, run_rate

__all__ = ["MIN_STABILITY_PART_S", "WindowMeasurement", "cpu_share", "step_work", "throughput_cv"]


@dataclass(kw_only=True, slots=True)
class WindowMeasurement:
    """Raw numbers of the timed window."""

    samples: int = 0
    audio_s: float = 0.0
    window_s: float = 0.0
    data_wait_s: float = 0.0
    warmup_s: float = 0.0
    warmup_steps: int = 0
    loader_start_s: float = 0.0
    epoch_boundary_s: float | None = None  # a new epoch's extra wait, measured after the window (epoch_boundary.py)
    step_times_s: list[float] = field(default_factory=list)
    step_samples: list[int] = field(default_factory=list)
    step_audio_s: list[float] = field(default_factory=list)
    scaler_skip_fraction: float | None = None  # fp16: optimiser steps GradScaler skipped in the window
    trimmed_steps: int = 0  # window steps that turned out to be warm-up (hindsight; counted in warmup_steps)
    cpu: tuple[CpuSample, CpuSample] | None = None  # at the window's edges: who else used the CPUs meanwhile
    compile: CompileCost = field(default_factory=CompileCost)  # the steps that compiled (none when eager)
    warmup_first_steps_s: list[float] = field(default_factory=list)  # where start-up went: the first warm-up steps
    cut_by_budget: bool = False  # the run's --budget ended the window before its rules did (trial/loop.py)
    planned_s: float | None = None  # ...and the window the rules asked for then
    steps_timed_alone: bool = False  # each step's time is its own (one CPU rank): trial/epoch_mix.py fits them so

    def summary(
        self, dataset_size: int, config: TrialConfig, run: RunLength | None = None, *, mix: EpochMix | None = None
    ) -> dict[str, Any]:
        """Throughput and step-time statistics; the objective prices the epoch's own mix of batches where items
        differ in length (mix: trial/epoch_mix.py) and charges the one-off costs over the run (loader start-up each
        epoch, compiling once: trial/run_length.py)."""
        window_rate = self.samples / self.window_s
        mix_factor = (
            epoch_mix_factor(
                self.step_times_s,
                self.step_samples,
                self.step_audio_s,
                mix,
                block_steps=config.grad_accum_steps,
                steps_timed_alone=self.steps_timed_alone,
            )
            if mix is not None
            else None
        )
        # What each epoch pays at its start (trial/epoch_boundary.py): measured where it can matter; elsewhere the
        # workers' cold start without persistent workers (a trial sees one), nothing with them.
        restart_s = self.epoch_boundary_s
        if restart_s is None:
            restart_s = self.loader_start_s if config.num_workers > 0 and not config.persistent_workers else 0.0
        if run is not None and not run.per_epoch_costs:  # the stand-in corpus: measured, reported, not charged
            restart_s = 0.0
        compiled = self.compile.summary(self.step_times_s) if config.compile != compile_modes.OFF else {}
        compile_s = float(compiled.get("compile_s", 0.0))
        mixed_rate = window_rate * (mix_factor or 1.0)
        epoch_rate = run_rate(mixed_rate, dataset_size, restart_s, compile_s, run or RunLength())
        # seconds of audio per sample: the epoch's where its mix was counted, else the window's
        audio_per_sample = self.audio_s / self.samples
        if mix is not None and mix.usable():
            audio_per_sample = mix.audio_s / mix.samples
        times = sorted(self.step_times_s)
        mean = statistics.fmean(times)
        return {
            "samples_per_second": epoch_rate,
            "window_samples_per_second": window_rate,
            "epoch_mix_factor": mix_factor,
            "audio_seconds_per_second": epoch_rate * audio_per_sample,
            "step_time_median_s": statistics.median(times),
            "step_time_p90_s": times[min(len(times) - 1, math.ceil(0.9 * len(times)) - 1)],
            "step_time_cv": statistics.pstdev(times) / mean if mean > 0 else 0.0,
            "throughput_cv": throughput_cv(self.step_times_s, step_work(self.step_samples, self.step_audio_s)),
            "data_wait_fraction": self.data_wait_s / self.window_s,
            "window_steps": len(times),
            "window_s": self.window_s,
            "warmup_s": self.warmup_s,
            "warmup_steps": self.warmup_steps,
            "loader_start_s": self.loader_start_s,
            "epoch_boundary_s": self.epoch_boundary_s,
            "scaler_skip_fraction": self.scaler_skip_fraction,
            "trimmed_steps": self.trimmed_steps,
            "window_cut_by_budget": self.cut_by_budget,
            "window_planned_s": self.planned_s,
            "warmup_first_steps_s": [round(value, 4) for value in self.warmup_first_steps_s],
            **compiled,
            **cpu_share(self.cpu),
        }


def step_work(samples: list[int], audio_s: list[float]) -> list[float] | list[int]:
    """Work per step for the stability measures: seconds of audio where the workload counts them (utterances of
    different lengths are different work), else samples."""
    return audio_s if audio_s and len(audio_s) == len(samples) and min(audio_s) > 0 else list(samples)


def cpu_share(cpu: tuple[CpuSample, CpuSample] | None) -> dict[str, Any]:
    """Other processes' share of the CPUs during the window, and the raw seconds that several ranks' shares are
    combined from (trial/child.py combine_rank_summaries: each rank's own tree is "other" to the rest)."""
    if cpu is None:
        return {"others_cpu_fraction": None}
    before, after = cpu
    busy = None if before.busy_s is None or after.busy_s is None else after.busy_s - before.busy_s
    own = None if before.own_s is None or after.own_s is None else after.own_s - before.own_s
    return {
        "others_cpu_fraction": others_fraction(before, after),
        "window_cpu_busy_s": busy,
        "window_cpu_own_s": own,
        "window_cpu_capacity_s": (after.at_s - before.at_s) * after.cpus,
    }


MIN_STABILITY_PART_S = 1.0  # shorter parts measure the OS scheduler on a shared machine, not the configuration


def throughput_cv(step_times_s: list[float], step_work: list[float] | list[int], parts: int = 4) -> float | None:
    """Coefficient of variation of the throughput (work per second: samples, or seconds of audio) over consecutive
    parts of the window (quarters by default).

    This is what makes a configuration erratic: throughput that stalls or drifts within the window. Single steps vary
    for healthy reasons that a per-step CV cannot tell from trouble: batches of different lengths, and a data-bound
    loader whose workers deliver batches in bursts (one step waits, the next ones find their batch ready). Summed
    over a few steps and a second or more those even out; stalls do not. None when the window cannot be cut into at
    least two parts of two steps and MIN_STABILITY_PART_S each.
    """
    parts = min(parts, len(step_times_s) // 2, int(sum(step_times_s) / MIN_STABILITY_PART_S))
    if parts < 2 or len(step_work) != len(step_times_s):
        return None
    bounds = [round(i * len(step_times_s) / parts) for i in range(parts + 1)]
    rates = []
    for start, stop in zip(bounds, bounds[1:], strict=False):
        seconds = sum(step_times_s[start:stop])
        rates.append(sum(step_work[start:stop]) / seconds if seconds > 0 else 0.0)
    mean = statistics.fmean(rates)
    return statistics.pstdev(rates) / mean if mean > 0 else None
