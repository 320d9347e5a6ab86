"""Stopping a search trial early when its running throughput shows it cannot compete with the best so far."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.trial.steady import STARTUP_STEPS
from autotune.trial.window_record import MIN_STABILITY_PART_S

if TYPE_CHECKING:
    from autotune.search.candidates import TrialRecord
    from autotune.search.settings import TunerSettings

__all__ = ["LEAST_CPU_SHARE", "Pruner"]

LEAST_CPU_SHARE = 0.05  # the CPU share left to a trial is taken as at least this: a reading is never weighed by zero


class Pruner:
    """Decides from a running trial's progress whether it is hopeless against the best so far.

    A reading (trial/child.py ProgressWriter, from trial/loop.py RunningRates) is a rate over steps it names: those
    after the trial's first `after_steps`, how many and how long, and the share of the CPUs other processes took
    meanwhile. No reading covers the first step (it pays process start-up: worker fork, first decode, allocation).

    - **Warm-up, settled**: steps after the first STARTUP_STEPS (2), at least two of them and MIN_STABILITY_PART_S:
      held to `prune_warmup_fraction` (25 %) of the best so far. The second step is left out because it may still
      pay the loader's first batches: at a large batch on a few cores only a few steps fit in warm-up, and a rate
      from the start was that one step.
    - **Warm-up, early**: until then the steps after the first only, held to `prune_early_fraction` (12.5 %): a
      configuration half as fast as the best survives a second step four times slower than its steady ones, while
      one ten times slower is below it whatever its start-up (start-up only slows a step). A slow configuration is
      thus stopped from its second step, not after the several of its long steps a settled reading needs.
    - **Window**: the window's steps after the first two of the trial, once a quarter of window_s has run and two
      such steps have: held to `prune_window_fraction` (50 %).
    - **Load**: each bar is scaled by the CPU share other processes left the trial during its reading over the share
      they left the best's window, at most 1 (never harsher than the plain bar): a configuration slowed by someone
      else's job that started after the best was measured is compared like with like.

    A warm-up reading that does not say which steps it covers (own training's probe counts from the first step) is
    not judged; its window readings are, as before. Why the rule changed: docs/how-it-measures.md, step 7.
    """

    def __init__(self, best: TrialRecord | None, settings: TunerSettings) -> None:
        self.best_rate = best.value if best else None
        others = best.result.others_cpu_fraction if best else None
        self.best_cpu_share = max(LEAST_CPU_SHARE, 1.0 - (others or 0.0))
        self.settings = settings
        self.last_rate = 0.0

    def __call__(self, progress: dict[str, Any]) -> str | None:
        rate, phase = float(progress.get("samples_per_second") or 0.0), progress.get("phase")
        self.last_rate = rate
        if not self.best_rate:
            return None
        bar, covered = self._bar(phase, progress)
        if bar is None:
            return None
        bar *= self._load_factor(progress.get("others_cpu_fraction"))
        if rate < bar * self.best_rate:
            best = self.best_rate
            return (
                f"pruned: {rate:.1f} samples/s during {phase} ({covered}), below {bar:.0%} of the best so far "
                f"({best:.1f})"
            )
        return None

    def _bar(self, phase: Any, progress: dict[str, Any]) -> tuple[float | None, str]:
        """The share of the best's rate this reading is held to (None: not judged), and its steps in words."""
        after, steps = progress.get("after_steps"), int(progress.get("steps") or 0)
        covered = f"{steps} step(s) after the first {after}" if after is not None else "steps from the first"
        if phase == "warmup":
            if after is None or steps < 1:
                return None, covered
            settled = after >= STARTUP_STEPS and steps >= 2 and progress.get("seconds", 0.0) >= MIN_STABILITY_PART_S
            return self.settings.prune_warmup_fraction if settled else self.settings.prune_early_fraction, covered
        if phase != "window" or progress.get("elapsed_s", 0.0) < 0.25 * self.settings.timing.window_s:
            return None, covered
        if after is not None and steps < 2:
            return None, covered
        return self.settings.prune_window_fraction, covered

    def _load_factor(self, others: Any) -> float:
        """The CPU share left to the trial during its reading over the one left to the best's window, at most 1."""
        if others is None:
            return 1.0
        return min(1.0, max(LEAST_CPU_SHARE, 1.0 - float(others)) / self.best_cpu_share)
