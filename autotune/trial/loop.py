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

from autotune.knobs import compile_modes
from autotune.knobs.config import TrialConfig
from autotune.knobs.precision import PrecisionSettings
from autotune.machine.cpu_load import CpuSample, cpu_sample
from autotune.trial import distributed, steady
from autotune.trial.compile_watch import CompileWatch
from autotune.trial.distributed import Forward
from autotune.trial.memory import PeakMemory
from autotune.trial.scaler import SkipCountingScaler
from autotune.trial.spec import TimingSettings
from autotune.trial.window_record import WindowMeasurement, step_work, throughput_cv
from autotune.workloads.base import TrainingSetup

__all__ = [
    "BudgetStopped",
    "NonFiniteLossError",
    "RateSpan",
    "RunningRates",
    "Stepper",
    "check_finite",
    "measure",
    "synchronize",
]

logger = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite: this configuration does not train."""


class BudgetStopped(RuntimeError):
    """The run's --budget ended the window before it had timed enough to keep: the trial says nothing about its
    configuration (status "stopped"), only what its steps took, for the budget that would measure it."""

    def __init__(self, message: str, step_s: float | None = None) -> None:
        super().__init__(message)
        self.step_s = step_s


FIRST_STEPS_KEPT = 4  # warm-up steps whose times a result keeps: where a trial's start-up went


@dataclass(kw_only=True, slots=True)
class RateSpan:
    """Steps after the trial's first `after_steps` (compiling steps left out): how many, their seconds and samples,
    and the CPUs' use when they began (other processes' share over them: machine/cpu_load.py)."""

    after_steps: int
    since: CpuSample | None
    steps: int = 0
    seconds: float = 0.0
    samples: int = 0

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def add(self, step_s: float, samples: int) -> None:
        self.steps, self.seconds, self.samples = self.steps + 1, self.seconds + step_s, self.samples + samples


ProgressCallback = Callable[[str, float, float, RateSpan], None]  # phase, samples/s, elapsed_s, the steps it covers


class RunningRates:
    """What the parent's pruner is told as the steps come (search/pruning.py judges it): never a rate over the
    trial's first step. A warm-up reading covers the steps after the trial's first STARTUP_STEPS (trial/steady.py)
    once two of them ran, else the steps after the first; a window reading covers the window's steps after the first
    STARTUP_STEPS of the trial (on a CPU the window may begin at the second step). Each reading says which steps it
    covers, so that the pruner holds it to the bar those steps deserve."""

    def __init__(self, report: ProgressCallback) -> None:
        self.report = report
        self.steps = 0  # the trial's steps so far, compiling ones left out
        self.marks: list[RateSpan] = []  # after the first step, after the second
        self.window: RateSpan | None = None
        self.in_window = False

    def start_window(self, since: CpuSample) -> None:
        self.in_window = True
        if self.steps >= steady.STARTUP_STEPS:
            self.window = RateSpan(after_steps=self.steps, since=since)

    def step(self, phase: str, step_s: float, samples: int, elapsed_s: float) -> None:
        """One step ended (not a compiling one): tell the parent the reading for this phase."""
        for span in [*self.marks, *([self.window] if self.window else [])]:
            span.add(step_s, samples)
        self.steps += 1
        if self.steps <= steady.STARTUP_STEPS:  # a mark costs a /proc read: twice a trial, between steps
            self.marks.append(RateSpan(after_steps=self.steps, since=cpu_sample()))
            if self.in_window and self.steps == steady.STARTUP_STEPS:
                self.window = RateSpan(after_steps=self.steps, since=self.marks[-1].since)
        reading = self._reading(phase)
        if reading is not None:
            self.report(phase, reading.samples_per_second, elapsed_s, reading)

    def _reading(self, phase: str) -> RateSpan | None:
        if phase == "window":
            return self.window if self.window and self.window.steps else None
        settled = [span for span in self.marks if span.after_steps >= steady.STARTUP_STEPS and span.steps >= 2]
        started = [span for span in self.marks if span.steps >= 1]
        return (settled or started)[-1] if settled or started else None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stepper:
    """Training steps as the user's loop runs them: autocast forward, scaled backward, and an optimiser step every
    grad_accum_steps micro-batches (gradients all-reduced only on that last micro-batch under DDP)."""

    def __init__(
        self,
        setup: TrainingSetup,
        forward: Forward,
        precision: PrecisionSettings,
        accum_steps: int,
        *,
        non_blocking: bool = False,
    ):
        self.setup, self.forward, self.precision, self.accum_steps = setup, forward, precision, max(1, accum_steps)
        self.non_blocking = non_blocking  # host-to-device copies of pinned batches (CUDA)
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


def check_finite(losses: list[torch.Tensor], phase: str) -> None:
    # One sync for many steps: checking every step would add a device round trip to each.
    if losses and not bool(torch.isfinite(torch.stack([loss.float() for loss in losses])).all()):
        raise NonFiniteLossError(f"loss became non-finite during {phase}")
    losses.clear()


@dataclass(kw_only=True, slots=True)
class _Window:
    """The timed window's steps as they come, and where steady state starts in them (hindsight, trial/steady.py)."""

    hindsight: bool
    spent_before_s: float  # process start and setup, before warm-up
    warmup: WindowMeasurement  # warm-up's seconds and steps so far
    timing: TimingSettings
    accum_steps: int = 1  # a trimmed front ends on an optimiser step, as warm-up does
    times_s: list[float] = field(default_factory=list)
    waits_s: list[float] = field(default_factory=list)
    samples_per_step: list[int] = field(default_factory=list)
    audio_per_step: list[float] = field(default_factory=list)
    front: int = 0  # steps before this index turned out to be warm-up
    seconds: float = 0.0  # of the steps from front on
    samples: int = 0
    compiled_steps: int = 0  # steps that compiled (a new shape): run, but out of the window (trial/compile_watch.py)
    compiled_s: float = 0.0

    @property
    def steps_run(self) -> int:
        """Steps this rank ran in the window, compiling ones included (ranks must run the same number)."""
        return len(self.times_s) + self.compiled_steps

    def add_compiled(self, step_s: float) -> None:
        self.compiled_steps += 1
        self.compiled_s += step_s

    def add(self, step_s: float, wait_s: float, samples: int, audio_s: float) -> None:
        self.times_s.append(step_s)
        self.waits_s.append(wait_s)
        self.samples_per_step.append(samples)
        self.audio_per_step.append(audio_s)
        self.seconds += step_s
        self.samples += samples

    def done(self) -> bool:
        """Long enough by the rules, and (with hindsight) steady from its front on; else the front moves on."""
        steps, timing = len(self.times_s) - self.front, self.timing
        if steps >= timing.max_window_steps:
            return True
        if steps < timing.min_window_steps or self.seconds < self.target_s():
            return False
        if not self.hindsight or not self._may_trim(sum(self.times_s[: self.front])):
            return True
        front = self._transient_front()
        if front <= 0:
            return True
        self._trim(front)
        return False

    def cut_short(self) -> bool:
        """The run's budget ends the window now: a transient front is trimmed as done() would (where what is left
        still has a spread); whether what is left is worth keeping: its spread can be measured (throughput_cv: two
        parts of two steps and MIN_STABILITY_PART_S each, the least the stability gate can judge)."""
        if self.hindsight and self._may_trim(sum(self.times_s[: self.front])):
            front = self._transient_front()
            if front > 0 and self._spread_measurable(self.front + front):
                self._trim(front)
        return self._spread_measurable(self.front)

    def target_s(self) -> float:
        """The window the rules ask for now (trial/steady.py window_target_s)."""
        trimmed_s = sum(self.times_s[: self.front])
        return steady.window_target_s(self.spent_before_s + self.warmup.warmup_s + trimmed_s, self.timing)

    def _spread_measurable(self, start: int) -> bool:
        work = step_work(self.samples_per_step[start:], self.audio_per_step[start:])
        return throughput_cv(self.times_s[start:], work) is not None

    def _transient_front(self) -> int:
        """Leading window steps (from the front on) that still belong to warm-up, by steady.transient_front."""
        timing, steps = self.timing, len(self.times_s) - self.front
        work = step_work(self.samples_per_step[self.front :], self.audio_per_step[self.front :])
        front = steady.transient_front(self.times_s[self.front :], work, timing.steady_tolerance_fraction)
        # Warm-up, trimmed fronts included, stops at max_warmup_steps: a front found past it is trimmed only up to it.
        # The trial's DataLoader holds that many warm-up batches and no more (steady.planned_batches): a whole front
        # of a fast step, then a window to max_window_steps, ran it dry (StopIteration) on a loaded machine.
        front = min(front, timing.max_warmup_steps - self.warmup.warmup_steps - self.front)
        return min(math.ceil(front / self.accum_steps) * self.accum_steps, steps - self.accum_steps)

    def _trim(self, front: int) -> None:
        for moved in range(self.front, self.front + front):
            self.seconds -= self.times_s[moved]
            self.samples -= self.samples_per_step[moved]
        self.front += front

    def _may_trim(self, trimmed_s: float) -> bool:
        timing = self.timing
        steps = self.warmup.warmup_steps + self.front
        return steps < timing.max_warmup_steps and self.warmup.warmup_s + trimmed_s < timing.max_warmup_s

    def fill(self, result: WindowMeasurement, elapsed_s: float, cpu: tuple[CpuSample, CpuSample]) -> None:
        """The window's figures into result; a trimmed front goes to warm-up."""
        front = self.front
        trimmed_s = sum(self.times_s[:front])
        result.warmup_s += trimmed_s
        result.warmup_steps += front
        result.trimmed_steps = front
        result.window_s = elapsed_s - trimmed_s - self.compiled_s
        result.step_times_s = self.times_s[front:]
        result.step_samples = self.samples_per_step[front:]
        result.step_audio_s = self.audio_per_step[front:]
        result.samples = sum(result.step_samples)
        result.audio_s = sum(result.step_audio_s)
        result.data_wait_s = sum(self.waits_s[front:])
        result.cpu = cpu


def measure(
    setup: TrainingSetup,
    batches: Iterator[Any],
    *,
    config: TrialConfig,
    timing: TimingSettings,
    precision: PrecisionSettings,
    device: torch.device,
    memory: PeakMemory,
    forward: Forward | None = None,
    spent_before_s: float = 0.0,
    on_window_start: Callable[[], None] = lambda: None,
    on_progress: ProgressCallback = lambda phase, rate, elapsed_s, span: None,
    stop_by: float | None = None,
) -> WindowMeasurement:
    """Warm up, then time a window of full training steps (data wait, host-to-device copy, forward, backward, step).

    The rules are trial/steady.py's: warm-up and window in seconds with steps as floors, the window long enough to be
    at least timing.min_timed_share of the trial (spent_before_s: what the trial spent before this call, its process
    start and setup). On one CPU rank steadiness is judged with hindsight: the window trims a front that ran at
    another rate than the rest. Across ranks every rank must run the same number of steps (DDP's all-reduce would
    wait forever for a rank that stopped), so warm-up ends when all ranks have settled, and the window's step count
    is fixed in advance from the slowest rank's warm-up; ranks meet at both edges.

    stop_by: when the run's --budget ends this trial (time.perf_counter() seconds, its result's writing already
    allowed for): on one device the window then ends at the last optimiser step that fits and keeps what it timed
    (_budget_ends_window). Across ranks it is not used: ranks that fixed their step count cannot stop apart, and the
    budget's kill stops them as before.
    """
    forward = forward or Forward(
        setup.model, setup.loss_fn, device, find_unused_parameters=setup.find_unused_parameters
    )
    non_blocking = config.pin_memory and device.type == "cuda"
    step = Stepper(setup, forward, precision, config.grad_accum_steps, non_blocking=non_blocking)
    watch = CompileWatch(compiling=config.compile != compile_modes.OFF)
    # One CPU rank: every step's time is its own (nothing runs asynchronously), so the window can judge its own front,
    # and the epoch's mix can be fitted step by step (trial/epoch_mix.py).
    alone = device.type == "cpu" and distributed.world_size() == 1
    result = WindowMeasurement(compile=watch.cost, steps_timed_alone=alone)
    hindsight = timing.trim_transient and alone
    memory.start()  # from the first step: on CUDA read at each step's end (trial/memory.py), cuDNN's searches gone
    rates = RunningRates(on_progress)
    warmup_times = _warm_up(
        setup,
        batches,
        step,
        device,
        result,
        rates,
        timing=timing,
        settle=not hindsight,
        watch=watch,
        memory=memory,
    )
    check_finite(step.losses, "warm-up")
    result.warmup_first_steps_s = warmup_times[:FIRST_STEPS_KEPT]
    window_steps = _agreed_window_steps(
        warmup_times, spent_before_s + result.warmup_s, timing, step.accum_steps, device
    )
    distributed.barrier(device)
    step.scaler.start_window()
    on_window_start()
    cpu_before = cpu_sample()
    rates.start_window(cpu_before)
    steps = _Window(
        hindsight=hindsight, spent_before_s=spent_before_s, warmup=result, timing=timing, accum_steps=step.accum_steps
    )
    window_start = last = time.perf_counter()
    while True:
        batch = next(batches)
        fetched = time.perf_counter()
        step(setup.batch_to_device(batch, device, non_blocking))
        memory.step_done()
        if watch.compiling:  # a compiling step's time must be its own (CUDA runs asynchronously)
            synchronize(device)
        now = time.perf_counter()
        if watch.step_compiled(now - last):  # a new shape compiled: its cost is compile time, not the window's
            steps.add_compiled(now - last)
            last = now
            if window_steps is not None and steps.steps_run >= window_steps:
                break
            continue
        steps.add(now - last, fetched - last, setup.samples_in(batch), setup.audio_seconds_in(batch))
        last = now
        # With hindsight the window's first step, and its first quarter, may still turn out to be warm-up: the pruner
        # holds them to the warm-up bar (where each step's time is its own they stand in for later warm-up steps).
        early = len(steps.times_s) < 2 or now - window_start < 0.25 * timing.window_s
        phase = "warmup" if hindsight and early else "window"
        rates.step(phase, steps.times_s[-1], steps.samples_per_step[-1], now - window_start)
        if window_steps is not None:
            window_done = steps.steps_run >= window_steps
        else:
            window_done = step.at_step_boundary and (steps.done() or _budget_ends_window(steps, result, stop_by))
        if window_done:
            break
    synchronize(device)
    distributed.barrier(device)
    elapsed_s = time.perf_counter() - window_start
    steps.fill(result, elapsed_s, (cpu_before, cpu_sample()))
    check_finite(step.losses, "the timed window")
    result.scaler_skip_fraction = step.scaler.window_skip_fraction()
    memory.sample()
    return result


def _budget_ends_window(steps: _Window, result: WindowMeasurement, stop_by: float | None) -> bool:
    """Whether the run's --budget ends the window now (at an optimiser-step boundary): the next optimiser step, at
    the longer of the last step and the window's mean, would end past stop_by. A window whose spread can be measured
    (_Window.cut_short) is kept, marked cut; a shorter one says nothing and raises BudgetStopped."""
    if stop_by is None or not steps.times_s:
        return False
    kept = len(steps.times_s) - steps.front
    step_s = max(steps.times_s[-1], steps.seconds / max(1, kept))
    if time.perf_counter() + steps.accum_steps * step_s <= stop_by:
        return False
    if not steps.cut_short():
        raise BudgetStopped(
            f"stopped when --budget ran out, {kept} window step(s) ({steps.seconds:.1f} s) into the window: too few "
            "to measure their spread (two parts of two steps and a second each)",
            step_s=steps.seconds / kept if kept else steps.times_s[-1],
        )
    result.cut_by_budget, result.planned_s = True, steps.target_s()
    logger.warning(
        "the run's --budget ends this trial: its window is cut to %.1f s of the %.1f s its rules asked for",
        steps.seconds,
        result.planned_s,
    )
    return True


def _warm_up(
    setup: TrainingSetup,
    batches: Iterator[Any],
    step: Stepper,
    device: torch.device,
    result: WindowMeasurement,
    rates: RunningRates,
    *,
    timing: TimingSettings,
    settle: bool,
    watch: CompileWatch,
    memory: PeakMemory,
) -> list[float]:
    """Warm-up steps, each synchronised (its time must be its own), until steady.warmup_done agrees on every rank.

    A step that compiled (the first of a compiled model, a recompile for a new shape) is recorded by the watch and
    counts in no rate for the pruner: its time is compile time, not the configuration's speed."""
    non_blocking = step.non_blocking
    started = time.perf_counter()
    warmup_times: list[float] = []
    while True:
        step_started = time.perf_counter()
        batch = next(batches)
        if not warmup_times:
            result.loader_start_s = time.perf_counter() - started
        step(setup.batch_to_device(batch, device, non_blocking))
        memory.step_done()
        synchronize(device)
        warmup_times.append(time.perf_counter() - step_started)
        if not watch.step_compiled(warmup_times[-1]):
            rates.step("warmup", warmup_times[-1], setup.samples_in(batch), time.perf_counter() - started)
        if step.at_step_boundary:
            done = steady.warmup_done(warmup_times, timing, require_settled=settle)
            if distributed.all_agree(done, device):  # every rank warms up for the same number of steps
                break
    result.warmup_s = time.perf_counter() - started
    result.warmup_steps = len(warmup_times)
    return warmup_times


def _agreed_window_steps(
    warmup_times: list[float], spent_before_s: float, timing: TimingSettings, accum_steps: int, device: torch.device
) -> int | None:
    """Across ranks, the window's step count (the same on every rank); None on one device (the window is timed)."""
    if distributed.world_size() == 1:
        return None
    settled_step_s = distributed.max_over_ranks(statistics.median(warmup_times[-2:]), device)
    target_s = distributed.max_over_ranks(steady.window_target_s(spent_before_s, timing), device)
    steps = math.ceil(target_s / max(settled_step_s, 1e-6))
    steps = min(max(steps, timing.min_window_steps), timing.max_window_steps)
    return math.ceil(steps / accum_steps) * accum_steps
