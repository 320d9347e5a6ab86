"""The fp16 skipped-step gate, on a scripted GradScaler: calibration is ignored, later overflows are counted."""

from __future__ import annotations

import pytest

from autotune.trial.precision import NullScaler
from autotune.trial.scaler import SkipCountingScaler, skip_gate_reason


class FakeGradScaler:
    """GradScaler's bookkeeping without tensors: each update halves the scale when that step overflowed."""

    def __init__(self, overflows: list[bool], init_scale: float = 2.0**16) -> None:
        self.overflows, self._scale, self.steps_taken = list(overflows), init_scale, 0
        self._current = False

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss):
        self._current = self.overflows.pop(0)
        return loss

    def unscale_(self, optimizer) -> None:
        return None

    def step(self, optimizer) -> None:
        if not self._current:
            self.steps_taken += 1

    def update(self) -> None:
        self._scale = self._scale / 2 if self._current else self._scale


class _Optimizer:
    def step(self) -> None:
        return None


def _run(scaler: SkipCountingScaler, steps: int) -> None:
    for _ in range(steps):
        scaler.scale(1.0)
        scaler.step(_Optimizer())
        scaler.update()


def test_calibration_is_ignored_and_later_skips_are_counted():
    # 4 skipped steps while the scale comes down (calibration, here running into the window), then 20 steps of
    # which 2 overflow.
    overflows = [True] * 4 + [False] * 9 + [True] + [False] * 9 + [True]
    scaler = SkipCountingScaler(FakeGradScaler(overflows))
    _run(scaler, 2)  # warm-up
    scaler.start_window()
    _run(scaler, 22)
    assert scaler.window_updates == 22 and scaler.window_counted == 20 and scaler.window_skipped == 2
    assert scaler.window_skip_fraction() == pytest.approx(0.1)
    assert "skipped 10% of the window's optimiser steps" in skip_gate_reason(0.1, 0.05)
    assert skip_gate_reason(0.1, 0.2) is None and skip_gate_reason(None, 0.05) is None


def test_a_window_where_no_step_was_taken_is_fully_skipped():
    scaler = SkipCountingScaler(FakeGradScaler([True] * 6))
    scaler.start_window()
    _run(scaler, 6)
    assert scaler.window_skip_fraction() == 1.0


def test_without_loss_scaling_there_is_nothing_to_gate():
    scaler = SkipCountingScaler(NullScaler())
    scaler.start_window()
    _run(scaler, 3)
    assert scaler.window_skip_fraction() is None


def test_the_timed_loop_reports_skips_and_the_gate_rejects_them(monkeypatch):
    import torch

    from autotune.trial.child import _gate
    from autotune.trial.loop import build_loader, measure
    from autotune.trial.memory import PeakMemory
    from autotune.trial.precision import PrecisionSettings
    from autotune.trial.spec import TimingConfig, TrialConfig, TrialResult, TrialSpec
    from tests.trial.tiny_setups import linear_setup

    # 3 calibration skips, then every fourth step overflows: 25% of the window's steps are skipped.
    fake = FakeGradScaler([True] * 3 + [False, False, False, True] * 50)
    monkeypatch.setattr(PrecisionSettings, "grad_scaler", lambda self: fake)
    setup = linear_setup()
    config = TrialConfig(per_device_batch_size=4)
    timing = TimingConfig(warmup_steps=3, max_warmup_steps=3, window_s=0.0, min_window_steps=40, max_window_steps=40)
    memory = PeakMemory(torch.device("cpu"))
    try:
        window = measure(
            setup,
            iter(build_loader(setup, config, total_batches=60, seed=0)),
            config=config,
            timing=timing,
            precision=PrecisionSettings(precision="fp16", device_type="cpu"),
            device=torch.device("cpu"),
            memory=memory,
        )
    finally:
        memory.stop()
    assert window.scaler_skip_fraction == pytest.approx(0.25)
    spec = TrialSpec(
        workload="x", workload_options={}, data_file="", config=config, timing=timing, device_type="cpu", result_path=""
    )
    result = _gate(TrialResult(status="ok", scaler_skip_fraction=window.scaler_skip_fraction), spec)
    assert result.status == "unstable" and "GradScaler skipped 25%" in result.reason
    assert _gate(TrialResult(status="ok", scaler_skip_fraction=0.01), spec).status == "ok"
