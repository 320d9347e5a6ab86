"""fp16 loss scaling as a stability gate: how many optimiser steps did GradScaler skip in the timed window?

GradScaler skips an optimiser step when the scaled gradients overflow and then halves its scale; a step it took
leaves the scale as it was (or doubles it after a long run of good steps). So "the scale went down in update()" is
exactly "this step was skipped", read through the public get_scale(). A fresh scaler starts at 2**16 and halves its
way down to a scale the gradients fit: that first run of skipped steps is calibration, not instability, and is not
counted. A configuration whose fp16 gradients keep overflowing after it trains only some of the steps it is timed
for: its throughput is not what it seems, and its training may not converge.

On CUDA get_scale() waits for the device; GradScaler.step already does (it reads found_inf to decide whether to
step), so the reading adds a copy of one number, not a new stall.
"""

from __future__ import annotations

from typing import Any

from autotune.trial.precision import NullScaler

__all__ = ["SkipCountingScaler", "skip_gate_reason"]


class SkipCountingScaler:
    """A GradScaler (or NullScaler) that counts the optimiser steps it skipped inside the timed window.

    Args:
        inner: torch.amp.GradScaler, NullScaler, or anything with scale/step/update/get_scale/unscale_.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.active = not isinstance(inner, NullScaler)
        self.calibrated = False  # a step has been taken: the initial scale search is over
        self.in_window = False
        self.window_updates = 0
        self.window_counted = 0  # window steps after calibration
        self.window_skipped = 0
        self._scale = float(inner.get_scale()) if self.active else 1.0

    def scale(self, loss: Any) -> Any:
        return self.inner.scale(loss)

    def unscale_(self, optimizer: Any) -> None:
        self.inner.unscale_(optimizer)

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        return self.inner.step(optimizer, *args, **kwargs)

    def get_scale(self) -> float:
        return float(self.inner.get_scale())

    def update(self, new_scale: Any = None) -> None:
        if new_scale is None:
            self.inner.update()
        else:
            self.inner.update(new_scale)
        if not self.active:
            return
        scale = float(self.inner.get_scale())
        skipped, self._scale = scale < self._scale, scale
        if not self.calibrated and skipped:
            if self.in_window:
                self.window_updates += 1
            return  # still searching for a scale the gradients fit
        self.calibrated = True
        if self.in_window:
            self.window_updates += 1
            self.window_counted += 1
            self.window_skipped += int(skipped)

    def start_window(self) -> None:
        """From now on, count: steps before this (warm-up, worst-case scan) are not the timed window's."""
        self.in_window = True
        self.window_updates = self.window_counted = self.window_skipped = 0

    def window_skip_fraction(self) -> float | None:
        """Skipped share of the window's optimiser steps after calibration; None without loss scaling.

        A window whose every step was skipped, calibration never ending, is 1.0: nothing trained.
        """
        if not self.active or not self.window_updates:
            return None
        if not self.window_counted:
            return 1.0
        return self.window_skipped / self.window_counted


def skip_gate_reason(skip_fraction: float | None, limit: float | None) -> str | None:
    """Why a trial is unstable because of skipped fp16 steps, or None when it passes (or has no scaler)."""
    if skip_fraction is None or limit is None or skip_fraction <= limit:
        return None
    return (
        f"GradScaler skipped {skip_fraction:.0%} of the window's optimiser steps (fp16 gradients overflow; "
        f"limit {limit:.0%})"
    )
