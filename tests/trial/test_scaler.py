"""The fp16 skipped-step gate, on scripted GradScalers and a real one: calibration is ignored, later overflows are
counted, and the timed window reads no scale until its figure is asked for."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from autotune.knobs.precision import NullScaler
from autotune.trial.scaler import SkipCountingScaler, skip_gate_reason


class FakeGradScaler:
    """GradScaler's bookkeeping without tensors: each update halves the scale when that step overflowed."""

    def __init__(self, overflows: list[bool], init_scale: float = 2.0**16) -> None:
        self.overflows, self._scale, self.steps_taken = list(overflows), init_scale, 0
        self._current = False
        self.scale_reads = 0  # get_scale() calls: on CUDA each is a host-device sync

    def get_scale(self) -> float:
        self.scale_reads += 1
        return float(self._scale)

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


class FakeDeviceGradScaler(FakeGradScaler):
    """Like GradScaler: the scale lives in a tensor that update() rewrites in place, readable without a sync."""

    def __init__(self, overflows: list[bool], init_scale: float = 2.0**16) -> None:
        super().__init__(overflows)
        self._scale = torch.tensor(init_scale)

    def _get_scale_async(self) -> torch.Tensor:
        return self._scale

    def update(self) -> None:
        if self._current:
            self._scale.mul_(0.5)


class BlockingReads(TorchFunctionMode):
    """Counts the tensor reads that on CUDA wait for the device (item, tolist, float(), bool(), int())."""

    NAMES = frozenset({"item", "tolist", "__float__", "__bool__", "__int__"})

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", "") in self.NAMES
        return func(*args, **(kwargs or {}))


class _Optimizer:
    def step(self) -> None:
        return None


def _run(scaler: SkipCountingScaler, steps: int) -> None:
    for _ in range(steps):
        scaler.scale(1.0)
        scaler.step(_Optimizer())
        scaler.update()


FAKES = pytest.mark.parametrize("fake", [FakeGradScaler, FakeDeviceGradScaler], ids=["get_scale", "device_scale"])


@FAKES
def test_calibration_is_ignored_and_later_skips_are_counted(fake):
    # 4 skipped steps while the scale comes down (calibration, here running into the window), then 20 steps of
    # which 2 overflow.
    overflows = [True] * 4 + [False] * 9 + [True] + [False] * 9 + [True]
    scaler = SkipCountingScaler(fake(overflows))
    _run(scaler, 2)  # warm-up
    scaler.start_window()
    _run(scaler, 22)
    assert scaler.window_skip_fraction() == pytest.approx(0.1)
    assert scaler.window_updates == 22 and scaler.window_counted == 20 and scaler.window_skipped == 2
    assert "skipped 10% of the window's optimiser steps" in skip_gate_reason(0.1, 0.05)
    assert skip_gate_reason(0.1, 0.2) is None and skip_gate_reason(None, 0.05) is None


@FAKES
def test_calibration_ended_in_the_warmup_is_over_in_the_window(fake):
    # Calibration ends in the warm-up: the window's first overflow is a skipped step, not more calibration.
    scaler = SkipCountingScaler(fake([True, True, False, True] + [False] * 3))
    _run(scaler, 3)
    assert scaler.has_taken_a_step()
    scaler.start_window()
    _run(scaler, 4)
    assert scaler.window_skip_fraction() == pytest.approx(0.25)


@FAKES
def test_a_window_where_no_step_was_taken_is_fully_skipped(fake):
    scaler = SkipCountingScaler(fake([True] * 6))
    scaler.start_window()
    _run(scaler, 6)
    assert scaler.window_skip_fraction() == 1.0 and not scaler.has_taken_a_step()


def test_without_loss_scaling_there_is_nothing_to_gate():
    scaler = SkipCountingScaler(NullScaler())
    scaler.start_window()
    _run(scaler, 3)
    assert scaler.window_skip_fraction() is None and scaler.has_taken_a_step()


def test_the_window_reads_the_scale_once_at_its_end():
    # On CUDA every read of the scale waits for the optimiser step: inside the window none may happen per step.
    inner = FakeDeviceGradScaler([True] * 3 + [False, False, False, True] * 10)
    scaler = SkipCountingScaler(inner)
    _run(scaler, 3)
    scaler.start_window()
    reads_before = inner.scale_reads
    with BlockingReads() as reads:
        _run(scaler, 40)
    assert reads.count == 0 and inner.scale_reads == reads_before
    with BlockingReads() as reads:
        assert scaler.window_skip_fraction() == pytest.approx(0.25)
    assert reads.count == 1 and inner.scale_reads == reads_before


def _real_steps(scaler, weight: torch.Tensor, optimizer: torch.optim.Optimizer, overflows: list[bool]) -> None:
    """Training steps on a real GradScaler; an overflowing step has infinite gradients, so GradScaler skips it."""
    for overflow in overflows:
        loss = (weight * (float("inf") if overflow else 1.0)).sum()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)


def test_a_real_grad_scaler_is_counted_without_a_read_of_its_own_per_step():
    warmup, window = [True, True], [True] + ([False] * 4 + [True]) * 4
    reads = []
    for wrap in (False, True):
        weight = torch.nn.Parameter(torch.ones(4))
        optimizer = torch.optim.SGD([weight], lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        scaler = SkipCountingScaler(scaler) if wrap else scaler
        _real_steps(scaler, weight, optimizer, warmup)
        if wrap:
            scaler.start_window()
        with BlockingReads() as counted:
            _real_steps(scaler, weight, optimizer, window)
        reads.append(counted.count)
        assert torch.allclose(weight.detach(), torch.full((4,), 1.0 - 16 * 0.1))  # 16 steps taken, none with inf
    # GradScaler.step reads found_inf each step; the counting adds no read to that.
    assert reads[0] > 0 and reads[1] == reads[0]
    assert scaler.window_updates == 21 and scaler.window_counted == 20 and scaler.window_skipped == 4
    assert scaler.window_skip_fraction() == pytest.approx(0.2)


@FAKES
def test_the_timed_loop_reports_skips_and_the_gate_rejects_them(monkeypatch, fake):
    from autotune.knobs.config import TrialConfig
    from autotune.knobs.precision import PrecisionSettings
    from autotune.trial.child import _gate
    from autotune.trial.loader import build_loader
    from autotune.trial.loop import measure
    from autotune.trial.memory import PeakMemory
    from autotune.trial.spec import TimingSettings, TrialResult, TrialSpec
    from tests.trial.tiny_setups import linear_setup

    # 3 calibration skips, then every fourth step overflows: 25% of the window's steps are skipped.
    inner = fake([True] * 3 + [False, False, False, True] * 50)
    monkeypatch.setattr(PrecisionSettings, "grad_scaler", lambda self: inner)
    setup = linear_setup()
    config = TrialConfig(per_device_batch_size=4)
    timing = TimingSettings(warmup_steps=3, max_warmup_steps=3, window_s=0.0, min_window_steps=40, max_window_steps=40)
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
