"""The timed training loop of one trial: warm-up excluded, a timed window, every cost of a real step included."""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from autotune.trial.memory import PeakMemory
from autotune.trial.precision import PrecisionSettings
from autotune.trial.spec import TimingConfig, TrialConfig
from autotune.workloads.base import TrainingSetup

__all__ = ["NonFiniteLossError", "WindowMeasurement", "build_loader", "measure"]

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
            "data_wait_fraction": self.data_wait_s / self.window_s,
            "window_steps": len(times),
            "window_s": self.window_s,
            "warmup_s": self.warmup_s,
            "warmup_steps": self.warmup_steps,
            "loader_start_s": self.loader_start_s,
        }


def build_loader(
    setup: TrainingSetup, config: TrialConfig, *, total_batches: int, seed: int
) -> torch.utils.data.DataLoader[Any]:
    """A DataLoader as the user's training would build it, sampling enough batches for the whole trial.

    Sampling with replacement keeps one 'epoch' running for the trial however small the corpus, so the timed
    window measures steady state; epoch-boundary costs are accounted for separately (WindowMeasurement.summary).
    """
    generator = torch.Generator().manual_seed(seed)
    kwargs: dict[str, Any] = {}
    if config.num_workers > 0:
        kwargs = {"prefetch_factor": config.prefetch_factor or 2, "persistent_workers": config.persistent_workers}
    if setup.batch_sampler_factory is not None:  # the workload batches by length itself
        kwargs["batch_sampler"] = setup.batch_sampler_factory(config, total_batches, generator)
    else:
        kwargs["batch_size"], kwargs["drop_last"] = config.per_device_batch_size, True
        num_samples = total_batches * config.per_device_batch_size
        kwargs["sampler"] = torch.utils.data.RandomSampler(
            setup.dataset, replacement=True, num_samples=num_samples, generator=generator
        )
    return torch.utils.data.DataLoader(
        setup.dataset,
        num_workers=config.num_workers,
        pin_memory=config.pin_memory,
        collate_fn=setup.collate_fn,
        **kwargs,
    )


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _train_step(
    setup: TrainingSetup, batch: Any, precision: PrecisionSettings, scaler: Any, losses: list[torch.Tensor]
) -> None:
    with precision.autocast():
        loss = setup.loss_fn(setup.model, batch)
    scaler.scale(loss).backward()
    scaler.step(setup.optimizer)
    scaler.update()
    setup.optimizer.zero_grad(set_to_none=True)
    losses.append(loss.detach())


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
    on_window_start: Callable[[], None] = lambda: None,
    on_progress: Callable[[str, float, float], None] = lambda phase, rate, elapsed_s: None,
) -> WindowMeasurement:
    """Warm up, then time a window of full training steps (data wait, host-to-device copy, forward, backward, step)."""
    scaler = precision.grad_scaler()
    non_blocking = config.pin_memory and device.type == "cuda"
    result = WindowMeasurement()
    losses: list[torch.Tensor] = []
    memory.start()  # from the first step: warm-up peaks (cuDNN autotuning, allocator growth) are real peaks too
    started = time.perf_counter()
    warmup_times: list[float] = []
    while True:
        step_started = time.perf_counter()
        batch = next(batches)
        if not warmup_times:
            result.loader_start_s = time.perf_counter() - started
        _train_step(setup, setup.batch_to_device(batch, device, non_blocking), precision, scaler, losses)
        _synchronize(device)  # warm-up only: each step's time must be its own to tell when they settle
        warmup_times.append(time.perf_counter() - step_started)
        if len(warmup_times) > 1:  # the first step carries start-up costs; later ones project the rate
            on_progress("warmup", setup.samples_in(batch) / warmup_times[-1], time.perf_counter() - started)
        if len(warmup_times) >= timing.max_warmup_steps or (
            len(warmup_times) >= timing.warmup_steps and _settled(warmup_times, timing.warmup_settle_fraction)
        ):
            break
    _check_finite(losses, "warm-up")
    result.warmup_s = time.perf_counter() - started
    result.warmup_steps = len(warmup_times)
    on_window_start()
    window_start = last = time.perf_counter()
    while True:
        batch = next(batches)
        fetched = time.perf_counter()
        result.data_wait_s += fetched - last
        _train_step(setup, setup.batch_to_device(batch, device, non_blocking), precision, scaler, losses)
        result.samples += setup.samples_in(batch)
        result.audio_s += setup.audio_seconds_in(batch)
        now = time.perf_counter()
        result.step_times_s.append(now - last)
        last = now
        steps = len(result.step_times_s)
        on_progress("window", result.samples / (now - window_start), now - window_start)
        window_done = now - window_start >= timing.window_s and steps >= timing.min_window_steps
        if steps >= timing.max_window_steps or window_done:
            break
    _synchronize(device)
    result.window_s = time.perf_counter() - window_start
    _check_finite(losses, "the timed window")
    memory.sample()
    return result
