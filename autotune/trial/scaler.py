"""fp16 loss scaling as a stability gate: how many optimiser steps did GradScaler skip in the timed window?

GradScaler skips an optimiser step when the scaled gradients overflow and then halves its scale; a step it took
leaves the scale as it was (or doubles it after a long run of good steps). So "the scale went down in update()" is
exactly "this step was skipped". A fresh scaler starts at 2**16 and halves its way down to a scale the gradients
fit: that first run of skipped steps is calibration, not instability, and is not counted. A configuration whose fp16
gradients keep overflowing after it trains only some of the steps it is timed for: its throughput is not what it
seems, and its training may not converge.

Reading the scale must not slow the steps it judges. On CUDA GradScaler.get_scale() is `.item()`: a host-device sync
that waits for the optimiser step and the scale update. GradScaler.step has synced already, but earlier: it reads
found_inf before it queues optimizer.step(), so a get_scale() after update() would be a second stall in every step,
and the host could not load the next batch or launch the next forward while the optimiser runs. So after each
update() the scale is copied on the device, and the copies are read in one sync where a count is asked for: at the
start of the window (the warm-up synchronises every step anyway) and at its end, when the loop has synchronised
too (as it checks the window's losses in one sync).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from autotune.knobs.precision import NullScaler

__all__ = ["SkipCountingScaler", "skip_gate_reason"]


class SkipCountingScaler:
    """A GradScaler (or NullScaler) that counts the optimiser steps it skipped inside the timed window.

    Args:
        inner: torch.amp.GradScaler, NullScaler, or anything with scale/step/update/get_scale/unscale_.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.active = not isinstance(inner, NullScaler)
        self.in_window = False
        self.window_updates = 0  # every update() in the window, calibration included
        self._calibrated = False  # a step has been taken: the initial scale search is over
        self._window_counted = 0  # window steps after calibration
        self._window_skipped = 0
        self._device_scale = _device_scale_reader(inner) if self.active else None
        # The scale after each update() not yet counted; on CUDA one 512-byte block a step, 5 MB for 10,000 steps.
        self._pending: list[torch.Tensor | float] = []
        # A fresh GradScaler answers its initial scale without touching the device.
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
        if self.in_window:
            self.window_updates += 1
        scale = self._device_scale() if self._device_scale else None
        # update() rewrites the scale tensor in place: keep a copy (queued on the device, no sync).
        self._pending.append(scale.clone() if scale is not None else float(self.inner.get_scale()))

    def start_window(self) -> None:
        """From now on, count: steps before this (warm-up, worst-case scan) are not the timed window's."""
        self._settle()  # the warm-up's steps decide only whether calibration is over
        self.in_window = True
        self.window_updates = self._window_counted = self._window_skipped = 0

    @property
    def window_counted(self) -> int:
        """Window steps after calibration (reads the pending scales: one device sync on CUDA)."""
        self._settle()
        return self._window_counted

    @property
    def window_skipped(self) -> int:
        """Window steps after calibration that were skipped (reads the pending scales: one device sync on CUDA)."""
        self._settle()
        return self._window_skipped

    def has_taken_a_step(self) -> bool:
        """Whether any optimiser step was taken since this scaler started: the scale search is over.

        Reads the pending scales (one device sync on CUDA). True without loss scaling, where no step is skipped.
        """
        self._settle()
        return self._calibrated or not self.active

    def window_skip_fraction(self) -> float | None:
        """Skipped share of the window's optimiser steps after calibration; None without loss scaling.

        A window whose every step was skipped, calibration never ending, is 1.0: nothing trained. Reads the window's
        scales in one device sync on CUDA: ask once the window is over.
        """
        if not self.active or not self.window_updates:
            return None
        self._settle()
        if not self._window_counted:
            return 1.0
        return self._window_skipped / self._window_counted

    def _settle(self) -> None:
        """Count the steps whose scales are pending, reading all of them at once."""
        if not self._pending:
            return
        on_device = [scale for scale in self._pending if isinstance(scale, torch.Tensor)]
        read = iter(torch.cat([scale.reshape(1) for scale in on_device]).tolist() if on_device else [])
        for scale in self._pending:
            self._count(next(read) if isinstance(scale, torch.Tensor) else scale)
        self._pending.clear()

    def _count(self, scale: float) -> None:
        skipped, self._scale = scale < self._scale, scale
        if not self._calibrated and skipped:
            return  # still searching for a scale the gradients fit
        self._calibrated = True
        if self.in_window:
            self._window_counted += 1
            self._window_skipped += int(skipped)


def skip_gate_reason(skip_fraction: float | None, limit: float | None) -> str | None:
    """Why a trial is unstable because of skipped fp16 steps, or None when it passes (or has no scaler)."""
    if skip_fraction is None or limit is None or skip_fraction <= limit:
        return None
    return (
        f"GradScaler skipped {skip_fraction:.0%} of the window's optimiser steps (fp16 gradients overflow; "
        f"limit {limit:.0%})"
    )


def _device_scale_reader(inner: Any) -> Callable[[], torch.Tensor | None] | None:
    """GradScaler's scale as the tensor update() writes, read without a sync; None where only get_scale() tells.

    GradScaler has no public way to read its scale without a sync. _get_scale_async() is the one GradScaler.step
    itself uses to hand the scale to fused optimisers, so it is the least private; a scaler without it (another
    torch, a stand-in) or a disabled one (which has no scale tensor; its get_scale() returns 1.0 without a sync) is
    read through get_scale() after every update().
    """
    read = getattr(inner, "_get_scale_async", None)
    is_enabled = getattr(inner, "is_enabled", None)
    if not callable(read) or (callable(is_enabled) and not is_enabled()):
        return None
    return read
