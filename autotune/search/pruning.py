"""Stopping a search trial early when its running throughput shows it cannot compete with the best so far."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.search.candidates import TrialRecord
    from autotune.search.settings import TunerSettings

__all__ = ["Pruner"]


class Pruner:
    """Decides from a running trial's progress whether it is hopeless against the best so far.

    Warm-up steps are slower than steady state, so their projection is held to a lower bar; a window is judged only
    after a quarter of it has run, so one slow step cannot condemn a configuration.
    """

    def __init__(self, best: TrialRecord | None, settings: TunerSettings) -> None:
        self.best_rate = best.value if best else None
        self.settings = settings
        self.last_rate = 0.0

    def __call__(self, progress: dict[str, Any]) -> str | None:
        rate, phase = float(progress.get("samples_per_second") or 0.0), progress.get("phase")
        self.last_rate = rate
        if not self.best_rate:
            return None
        if phase == "warmup":
            bar = self.settings.prune_warmup_fraction
        elif phase == "window" and progress.get("elapsed_s", 0.0) >= 0.25 * self.settings.timing.window_s:
            bar = self.settings.prune_window_fraction
        else:
            return None
        if rate < bar * self.best_rate:
            best = self.best_rate
            return f"pruned: {rate:.1f} samples/s during {phase}, below {bar:.0%} of the best so far ({best:.1f})"
        return None
