"""The probe's clock: warm-up and one timed window over a training's optimizer steps, by the trials' rules.

The training decides when a step happens; the probe only sees each optimizer step end (torch's global step hook) and
each batch its DataLoaders yield. Warm-up ends and the window starts and ends at step boundaries, by the rules of
trial/steady.py: seconds with steps as floors, settled chunks where steps are not timed one by one (CUDA, several
ranks), the first quarter moved back to warm-up with hindsight where they are (a CPU, one rank), and a window that is
at least its share of the whole trial. Several ranks must start and end at the same step: rank 0 decides and writes
the step numbers beside its result (PLAN_SUFFIX); the other ranks read them at each step and follow, a step later.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from autotune import yamlio
from autotune.trial.spec import TimingSettings
from autotune.trial.steady import transient_front, warmup_done, window_target_s

__all__ = ["StepClock", "WindowCounts"]

_FOLLOW_LAG = 1  # steps between rank 0's decision and the step every rank acts at (they read it at their next step)


@dataclass(kw_only=True, slots=True)
class WindowCounts:
    """What the window saw, step by step: each step's time, the items and batches yielded for it, its wait for data."""

    step_times_s: list[float] = field(default_factory=list)
    step_items: list[int] = field(default_factory=list)
    step_batches: list[int] = field(default_factory=list)
    step_waits_s: list[float] = field(default_factory=list)
    started_at: float = 0.0
    ended_at: float = 0.0

    @property
    def samples(self) -> int:
        return sum(self.step_items)

    @property
    def batches(self) -> int:
        return sum(self.step_batches)

    @property
    def data_wait_s(self) -> float:
        return sum(self.step_waits_s)

    def drop_front(self, steps: int) -> None:
        """The first steps were warm-up after all: the window starts after them."""
        self.started_at += sum(self.step_times_s[:steps])
        for values in (self.step_times_s, self.step_items, self.step_batches, self.step_waits_s):
            del values[:steps]

    @property
    def window_s(self) -> float:
        return self.ended_at - self.started_at


@dataclass(kw_only=True, slots=True)
class StepClock:
    """Where a training is in its measurement: warm-up, window, done. Fed one call per batch and per step.

    Args:
        timing: the trials' timing settings.
        rank, world_size: this process's place among the training's ranks.
        plan_path: rank 0's decisions, for the other ranks.
        spent_before_s: seconds already gone since the parent launched the command, asked when the window starts.
        synchronize: waits for the device at the window's edges (CUDA); None on a CPU, where nothing runs
            asynchronously.
        require_settled: warm-up waits for settled chunks of steps (CUDA, several ranks: trial/steady.py).
    """

    timing: TimingSettings
    rank: int
    world_size: int
    plan_path: str
    spent_before_s: Callable[[], float]
    synchronize: Callable[[], None] | None = None
    require_settled: bool = False
    phase: str = "warmup"  # warmup | window | done
    steps: int = 0
    warmup_times_s: list[float] = field(default_factory=list)
    window: WindowCounts = field(default_factory=WindowCounts)
    trimmed_steps: int = 0
    _last_at: float = field(default_factory=time.perf_counter)
    _pending_items: int = 0
    _pending_batches: int = 0
    _pending_wait_s: float = 0.0
    _target_s: float = 0.0
    _start_step: int | None = None
    _end_step: int | None = None
    _plan_seen_ns: int = 0

    def on_batch(self, items: int, wait_s: float) -> None:
        self._pending_items += items
        self._pending_batches += 1
        self._pending_wait_s += wait_s

    def on_step(self) -> str:
        """One optimizer step ended; returns the phase after it ("done": the window is measured)."""
        now = time.perf_counter()
        step_s, self._last_at = now - self._last_at, now
        items, batches, wait_s = self._pending_items, self._pending_batches, self._pending_wait_s
        self._pending_items, self._pending_batches, self._pending_wait_s = 0, 0, 0.0
        self.steps += 1
        if self.phase == "warmup":
            self.warmup_times_s.append(step_s)
            self._decide_start()
            if self._start_step is not None and self.steps >= self._start_step:
                self._start_window()
        elif self.phase == "window":
            self.window.step_times_s.append(step_s)
            self.window.step_items.append(items)
            self.window.step_batches.append(batches)
            self.window.step_waits_s.append(wait_s)
            self._decide_end()
            if self._end_step is not None and self.steps >= self._end_step:
                self._synchronize()
                self.window.ended_at = time.perf_counter()
                self.phase = "done"
        return self.phase

    def _decide_start(self) -> None:
        if self._start_step is not None:
            return
        if self.rank != 0:
            self._follow()
            return
        if warmup_done(self.warmup_times_s, self.timing, require_settled=self.require_settled):
            self._start_step = self.steps + (_FOLLOW_LAG if self.world_size > 1 else 0)
            self._announce()

    def _synchronize(self) -> None:
        if self.synchronize is not None:
            self.synchronize()

    def _start_window(self) -> None:
        self._synchronize()
        self.phase = "window"
        self._last_at = time.perf_counter()
        self.window = WindowCounts(started_at=self._last_at)
        self._target_s = window_target_s(self.spent_before_s(), self.timing)

    def _decide_end(self) -> None:
        if self._end_step is not None:
            return
        if self.rank != 0:
            self._follow()
            return
        window = self.window
        steps, spent = len(window.step_times_s), time.perf_counter() - window.started_at
        if steps < self.timing.max_window_steps and (spent < self._target_s or steps < self.timing.min_window_steps):
            return
        if self._trim_front():
            return
        self._end_step = self.steps + (_FOLLOW_LAG if self.world_size > 1 else 0)
        self._announce()

    def _trim_front(self) -> bool:
        """Where each step's time is its own, a first quarter unlike the rest was warm-up: it moves there and the
        window runs on (until warm-up has used its most)."""
        if self.require_settled or not self.timing.trim_transient:
            return False
        window = self.window
        if sum(self.warmup_times_s[1:]) >= self.timing.max_warmup_s:
            return False
        front = transient_front(window.step_times_s, window.step_items, self.timing.steady_tolerance_fraction)
        if not front:
            return False
        self.warmup_times_s.extend(window.step_times_s[:front])
        window.drop_front(front)
        self.trimmed_steps += front
        return True

    def _announce(self) -> None:
        if self.world_size > 1:
            yamlio.write_json(self.plan_path, {"start_step": self._start_step, "end_step": self._end_step})

    def _follow(self) -> None:
        """Rank 0's decisions, read when its plan file changed (one stat a step otherwise)."""
        try:
            changed = os.stat(self.plan_path).st_mtime_ns
        except OSError:
            return
        if changed == self._plan_seen_ns:
            return
        try:
            plan = yamlio.read_json(self.plan_path)
        except (OSError, ValueError):
            return  # being replaced: read it next step
        self._plan_seen_ns = changed
        self._start_step = plan.get("start_step")
        self._end_step = plan.get("end_step")
