"""The timed training loop of one trial: warm-up excluded, a timed window, every cost of a real step included."""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from autotune.trial import distributed
from autotune.trial.distributed import Forward, RankInfo
from autotune.trial.memory import PeakMemory
from autotune.trial.precision import PrecisionSettings
from autotune.trial.sampling import CycledEpochs, epoch_batches
from autotune.trial.scaler import SkipCountingScaler
from autotune.trial.spec import TimingConfig, TrialConfig
from autotune.workloads.base import TrainingSetup

__all__ = ["NonFiniteLossError", "WindowMeasurement", "build_loader", "measure", "throughput_cv"]

logger = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite: this configuration does not train."""


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
    step_times_s: list[float] = field(default_factory=list)
    step_samples: list[int] = field(default_factory=list)
    step_audio_s: list[float] = field(default_factory=list)
    scaler_skip_fraction: float | None = None  # fp16: optimiser steps GradScaler skipped in the window

    def _step_work(self) -> list[float]:
        """Work per step for the stability measure: seconds of audio where the workload counts them (utterances of
        different lengths are different work), else samples."""
        audio = self.step_audio_s
        return audio if audio and len(audio) == len(self.step_samples) and min(audio) > 0 else list(self.step_samples)

    def summary(self, dataset_size: int, config: TrialConfig) -> dict[str, Any]:
        """Throughput and step-time statistics; the objective amortises loader start-up over an epoch."""
        window_rate = self.samples / self.window_s
        # Without persistent workers every epoch pays the worker start-up again; a trial sees one epoch-start.
        restart_s = self.loader_start_s if config.num_workers > 0 and not config.persistent_workers else 0.0
        epoch_samples = max(dataset_size, 1)
        epoch_rate = epoch_samples / (epoch_samples / window_rate + restart_s)
        times = sorted(self.step_times_s)
        mean = statistics.fmean(times)
        return {
            "samples_per_second": epoch_rate,
            "window_samples_per_second": window_rate,
            "audio_seconds_per_second": self.audio_s / self.window_s * (epoch_rate / window_rate),
            "step_time_median_s": statistics.median(times),
            "step_time_p90_s": times[min(len(times) - 1, math.ceil(0.9 * len(times)) - 1)],
            "step_time_cv": statistics.pstdev(times) / mean if mean > 0 else 0.0,
            "throughput_cv": throughput_cv(self.step_times_s, self._step_work()),
            "data_wait_fraction": self.data_wait_s / self.window_s,
            "window_steps": len(times),
            "window_s": self.window_s,
            "warmup_s": self.warmup_s,
            "warmup_steps": self.warmup_steps,
            "loader_start_s": self.loader_start_s,
            "scaler_skip_fraction": self.scaler_skip_fraction,
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


def build_loader(
    setup: TrainingSetup,
    config: TrialConfig,
    *,
    total_batches: int,
    seed: int,
    rank: RankInfo | None = None,
) -> torch.utils.data.DataLoader[Any]:
    """A DataLoader as the user's training would build it, with this rank's share of each epoch.

    Its batch sampler runs epoch after epoch (trial/sampling.py) until the trial has all its batches, so the timed
    window measures steady state however small the corpus; epoch-boundary costs are accounted for separately
    (WindowMeasurement.summary).
    """
    rank = rank or RankInfo()

    def make_epoch(epoch: int) -> Any:
        return epoch_batches(setup, config, rank=rank.rank, world_size=rank.world_size, seed=seed, epoch=epoch)

    kwargs: dict[str, Any] = {}
    if config.num_workers > 0:
        kwargs = {"prefetch_factor": config.prefetch_factor or 2, "persistent_workers": config.persistent_workers}
    return torch.utils.data.DataLoader(
        setup.dataset,
        batch_sampler=CycledEpochs(make_epoch, total_batches),
        num_workers=config.num_workers,
        pin_memory=config.pin_memory,
        collate_fn=setup.collate_fn,
        **kwargs,
    )


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Stepper:
    """Training steps as the user's loop runs them: autocast forward, scaled backward, and an optimiser step every
    grad_accum_steps micro-batches (gradients all-reduced only on that last micro-batch under DDP)."""

    def __init__(self, setup: TrainingSetup, forward: Forward, precision: PrecisionSettings, accum_steps: int):
        self.setup, self.forward, self.precision, self.accum_steps = setup, forward, precision, max(1, accum_steps)
        self.scaler = SkipCountingScaler(precision.grad_scaler())
        self.micro_batches = 0
        self.losses: list[torch.Tensor] = []

    @property
    def at_step_boundary(self) -> bool:
        return self.micro_batches % self.accum_steps == 0

    def __call__(self, batch: Any) -> None:
        steps_now = (self.micro_batches + 1) % self.accum_steps == 0
        with contextlib.nullcontext() if steps_now else self.forward.accumulating():
            with self.precision.autocast():
                loss = self.forward(batch)
            self.scaler.scale(loss / self.accum_steps if self.accum_steps > 1 else loss).backward()
        self.micro_batches += 1
        if steps_now:
            self.scaler.step(self.setup.optimizer)
            self.scaler.update()
            self.setup.optimizer.zero_grad(set_to_none=True)
        self.losses.append(loss.detach())


def _check_finite(losses: list[torch.Tensor], phase: str) -> None:
    # One sync for many steps: checking every step would add a device round trip to each.
    if losses and not bool(torch.isfinite(torch.stack([loss.float() for loss in losses])).all()):
        raise NonFiniteLossError(f"loss became non-finite during {phase}")
    losses.clear()


def _settled(step_times_s: list[float], tolerance_fraction: float) -> bool:
    """The last two warm-up steps took about the same time: start-up costs are behind us."""
    last, before = step_times_s[-1], step_times_s[-2] if len(step_times_s) > 1 else float("inf")
    return max(last, before) <= (1.0 + tolerance_fraction) * min(last, before)


def measure(
    setup: TrainingSetup,
    batches: Iterator[Any],
    *,
    config: TrialConfig,
    timing: TimingConfig,
    precision: PrecisionSettings,
    device: torch.device,
    memory: PeakMemory,
    forward: Forward | None = None,
    on_window_start: Callable[[], None] = lambda: None,
    on_progress: Callable[[str, float, float], None] = lambda phase, rate, elapsed_s: None,
) -> WindowMeasurement:
    """Warm up, then time a window of full training steps (data wait, host-to-device copy, forward, backward, step).

    On one device the window runs for timing.window_s seconds. Across ranks every rank must run the same number of
    steps (DDP's all-reduce would wait forever for a rank that stopped), so warm-up ends when all ranks have settled,
    and the window's step count is fixed in advance from the slowest rank's warm-up; ranks meet at both edges.
    """
    forward = forward or Forward(setup.model, setup.loss_fn, device)
    step = _Stepper(setup, forward, precision, config.grad_accum_steps)
    non_blocking = config.pin_memory and device.type == "cuda"
    result = WindowMeasurement()
    memory.start()  # from the first step: warm-up peaks (cuDNN autotuning, allocator growth) are real peaks too
    started = time.perf_counter()
    warmup_times: list[float] = []
    while True:
        step_started = time.perf_counter()
        batch = next(batches)
        if not warmup_times:
            result.loader_start_s = time.perf_counter() - started
        step(setup.batch_to_device(batch, device, non_blocking))
        _synchronize(device)  # warm-up only: each step's time must be its own to tell when they settle
        warmup_times.append(time.perf_counter() - step_started)
        if len(warmup_times) > 1:  # the first step carries start-up costs; later ones project the rate
            on_progress("warmup", setup.samples_in(batch) / warmup_times[-1], time.perf_counter() - started)
        if len(warmup_times) >= timing.warmup_steps and step.at_step_boundary:
            done = len(warmup_times) >= timing.max_warmup_steps or _settled(warmup_times, timing.warmup_settle_fraction)
            if distributed.all_agree(done, device):  # every rank warms up for the same number of steps
                break
    _check_finite(step.losses, "warm-up")
    result.warmup_s = time.perf_counter() - started
    result.warmup_steps = len(warmup_times)
    window_steps = _agreed_window_steps(warmup_times, timing, step.accum_steps, device)
    distributed.barrier(device)
    step.scaler.start_window()
    on_window_start()
    window_start = last = time.perf_counter()
    while True:
        batch = next(batches)
        fetched = time.perf_counter()
        result.data_wait_s += fetched - last
        step(setup.batch_to_device(batch, device, non_blocking))
        result.step_samples.append(setup.samples_in(batch))
        result.step_audio_s.append(setup.audio_seconds_in(batch))
        result.samples += result.step_samples[-1]
        result.audio_s += result.step_audio_s[-1]
        now = time.perf_counter()
        result.step_times_s.append(now - last)
        last = now
        steps = len(result.step_times_s)
        on_progress("window", result.samples / (now - window_start), now - window_start)
        if window_steps is not None:
            window_done = steps >= window_steps
        else:
            timed_out = now - window_start >= timing.window_s and steps >= timing.min_window_steps
            window_done = step.at_step_boundary and (timed_out or steps >= timing.max_window_steps)
        if window_done:
            break
    _synchronize(device)
    distributed.barrier(device)
    result.window_s = time.perf_counter() - window_start
    _check_finite(step.losses, "the timed window")
    result.scaler_skip_fraction = step.scaler.window_skip_fraction()
    memory.sample()
    return result


def _agreed_window_steps(
    warmup_times: list[float], timing: TimingConfig, accum_steps: int, device: torch.device
) -> int | None:
    """Across ranks, the window's step count (the same on every rank); None on one device (the window is timed)."""
    if distributed.world_size() == 1:
        return None
    settled_step_s = distributed.max_over_ranks(statistics.median(warmup_times[-2:]), device)
    steps = math.ceil(timing.window_s / max(settled_step_s, 1e-6))
    steps = min(max(steps, timing.min_window_steps), timing.max_window_steps)
    return math.ceil(steps / accum_steps) * accum_steps
