"""How long a trial warms up and how long it measures, by its step time: start-up out, steady state in, and a window
worth what the trial cost to reach it.

A fixed count of steps suits no step time. A 10-s CPU step of CAM++ at batch 64 is steady from its second step, so
every step a fixed count adds costs seconds for nothing, while a 50-ms GPU step needs dozens of steps before the
DataLoader's queue and cuDNN's autotuning are behind it (a fixed count against these rules: benchmarks/trial_cost.py,
benchmarks/README.md#short-budgets-and-what-a-trial-costs). So the rules are in seconds, with steps as floors:

- **Warm-up** lasts at least ``warmup_steps`` (the first step carries process start-up: worker fork, first decode,
  kernel selection, the optimiser's state) and ``min_warmup_s``. Where each step's time is its own (a CPU, one rank:
  nothing runs asynchronously, so a step ends when its Python returns) that is all: whether the steps after it are
  steady is judged with hindsight, below. Elsewhere (CUDA, where window steps are not synchronised one by one; several
  ranks, which must agree on the window's step count in advance) warm-up goes on until the last chunk of steps ran
  at the rate of the chunk before (chunks of at least ``settle_chunk_s``, so that a loader delivering in bursts
  settles too; one step each where steps are longer).
- **Hindsight**: when the window has run its length, its first quarter (at least one step) is compared with the
  rest. If their throughputs differ by more than ``steady_tolerance_fraction``, either way (a start-up transient is
  slower; a queue filled during start-up and drained by the first steps is faster), that quarter was warm-up: it
  moves there and the window runs on. Either way, so noise trims fast and slow fronts alike and biases nothing.
- **The window** lasts ``window_s`` and ``min_window_steps``, and long enough that the timed part is at least
  ``min_timed_share`` of the whole trial (its process start, setup and warm-up included), up to ``max_window_s``: a
  trial that spent 10 s getting ready measures for 40, so four fifths of every trial is measurement and a short
  window is never mostly overhead.
- A trial may ask for a longer window (``window_at_least_s``): a long run's confirmation measures a round's share
  of its time in one window per leader instead of several trials that each pay start-up and warm-up again.
- Warm-up, trimmed fronts included, stops at ``max_warmup_s`` (counted after the first step, which carries
  start-up whatever it costs) or ``max_warmup_steps``: a configuration that never settles is measured as it is, and
  its window's stability gate judges it.

The same rules give the budget plan its estimate of a trial it has not measured yet (``expected_trial_s``), and the
trial's DataLoader its length (``planned_batches``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from autotune.trial.window_record import MIN_STABILITY_PART_S

if TYPE_CHECKING:
    from autotune.trial.spec import TimingSettings

__all__ = [
    "STARTUP_STEPS",
    "settled",
    "warmup_done",
    "window_target_s",
    "transient_front",
    "expected_trial_s",
    "least_kept_trial_s",
    "planned_batches",
]

# Steps at a trial's start that carry start-up: the first pays the process's (worker fork, first decode, allocation,
# the optimiser's state), the second may still pay the loader's first batches (at a large batch on a few loaded cores
# the workers are still decoding it when the first step ends). The pruner's settled readings leave both out
# (trial/loop.py RunningRates, search/pruning.py).
STARTUP_STEPS = 2


def _chunk_steps(step_times_s: Sequence[float], chunk_s: float) -> int:
    """The fewest trailing steps lasting chunk_s (at least one)."""
    spent, steps = 0.0, 0
    for step_s in reversed(step_times_s):
        spent, steps = spent + step_s, steps + 1
        if spent >= chunk_s:
            break
    return steps


def settled(step_times_s: Sequence[float], tolerance_fraction: float, chunk_s: float = 0.0) -> bool:
    """The last chunk of steps took about as long per step as the chunk before it: start-up costs are behind us.

    A chunk is the fewest trailing steps lasting chunk_s (one step when steps are longer than that).
    """
    steps = _chunk_steps(step_times_s, chunk_s)
    if len(step_times_s) < 2 * steps:
        return False
    last = sum(step_times_s[-steps:]) / steps
    before = sum(step_times_s[-2 * steps : -steps]) / steps
    return max(last, before) <= (1.0 + tolerance_fraction) * min(last, before)


def warmup_done(step_times_s: Sequence[float], timing: TimingSettings, *, require_settled: bool) -> bool:
    """Whether warm-up may end after these steps (the caller also waits for an optimiser-step boundary)."""
    steps, spent = len(step_times_s), sum(step_times_s)
    if steps >= timing.max_warmup_steps:
        return True
    if steps < max(1, timing.warmup_steps) or spent < timing.min_warmup_s:
        return False
    # The cap counts from the second step: the first carries start-up, whatever it cost (on a GPU cuDNN's search,
    # tens of seconds: benchmarks/gpu_proof.md#results), and the steps after it must still be seen to settle.
    if not require_settled or spent - step_times_s[0] >= timing.max_warmup_s:
        return True
    return settled(step_times_s, timing.warmup_settle_fraction, timing.settle_chunk_s)


def window_target_s(spent_before_s: float, timing: TimingSettings) -> float:
    """Seconds the window must last after a trial spent spent_before_s reaching it (start, setup, warm-up)."""
    share = timing.min_timed_share
    wanted = share / (1.0 - share) * spent_before_s if 0.0 < share < 1.0 else 0.0
    return max(timing.window_s, timing.window_at_least_s, min(wanted, timing.max_window_s))


def transient_front(step_times_s: Sequence[float], step_work: Sequence[float], tolerance_fraction: float) -> int:
    """Leading steps of a window that still belong to warm-up: its first quarter by time (at least one step), when
    that quarter's throughput differs from the rest's by more than the tolerance; 0 when the window is steady."""
    if len(step_times_s) < 3 or len(step_work) != len(step_times_s):
        return 0
    quarter_s, front, spent = sum(step_times_s) / 4.0, 0, 0.0
    while front < len(step_times_s) - 2 and (front == 0 or spent + step_times_s[front] <= quarter_s):
        spent += step_times_s[front]
        front += 1
    rest_s = sum(step_times_s[front:])
    if spent <= 0 or rest_s <= 0:
        return 0
    front_rate, rest_rate = sum(step_work[:front]) / spent, sum(step_work[front:]) / rest_s
    return front if rest_rate > 0 and abs(front_rate / rest_rate - 1.0) > tolerance_fraction else 0


def _expected_warmup_s(step_s: float, timing: TimingSettings) -> float:
    """Warm-up at a steady step time: its steps by the rules, the first taken as one and a half (start-up)."""
    return (max(timing.warmup_steps, math.ceil(timing.min_warmup_s / step_s)) + 0.5) * step_s


def expected_trial_s(step_s: float, fixed_s: float, timing: TimingSettings) -> float:
    """A trial's wall time at a steady step time, by these rules: fixed_s (process start, setup, teardown), warm-up
    (its first step taken as one and a half steps: start-up), and the window in whole steps."""
    step_s = max(step_s, 1e-3)
    warmup_s = _expected_warmup_s(step_s, timing)
    window_s = max(window_target_s(fixed_s + warmup_s, timing), timing.min_window_steps * step_s)
    return fixed_s + warmup_s + math.ceil(window_s / step_s) * step_s


def least_kept_trial_s(step_s: float, fixed_s: float, timing: TimingSettings) -> float:
    """The least wall time of a trial whose window a budget may cut and still keep: fixed_s, warm-up as
    expected_trial_s takes it, and the shortest window whose spread can be measured (two parts of two steps and
    MIN_STABILITY_PART_S each, window_record.throughput_cv). A trial stopped sooner measures nothing."""
    step_s = max(step_s, 1e-3)
    window_steps = max(4, math.ceil(2 * MIN_STABILITY_PART_S / step_s))
    return fixed_s + _expected_warmup_s(step_s, timing) + window_steps * step_s


def planned_batches(timing: TimingSettings, accum_steps: int) -> int:
    """The batches a trial's DataLoader holds: the most warm-up may take (trimmed fronts included), the most a window
    may, and room for each to run on to the next optimiser-step boundary."""
    return max(timing.warmup_steps, timing.max_warmup_steps) + timing.max_window_steps + 2 * accum_steps
