"""What the run measures before its first trial and hands the trials: the baseline's step as the AMP check timed it."""

from __future__ import annotations

import pytest

from autotune.knobs.config import TrialConfig
from autotune.run.preflight import baseline_step_estimate
from autotune.trial.amp_check import AmpCheckResult


def _checked(step_s: float | None, batch: int = 4) -> AmpCheckResult:
    return AmpCheckResult(status="ok", settings={"batch_size": batch}, fp32_step_s=step_s)


def test_on_a_cpu_the_checks_fp32_step_is_scaled_to_the_configurations_batch():
    """CAM++ fp32 on 2 cores costs about the same per sample at a batch of 4 as at 64 (0.13-0.20 s)."""
    estimate = baseline_step_estimate(_checked(0.6), "cpu")
    assert estimate is not None
    assert estimate(TrialConfig(per_device_batch_size=64)) == pytest.approx(9.6)
    assert estimate(TrialConfig(per_device_batch_size=2)) == pytest.approx(0.3)


@pytest.mark.parametrize(
    "config",
    [
        TrialConfig(per_device_batch_size=64, precision="bf16"),
        TrialConfig(per_device_batch_size=64, compile="default"),
        TrialConfig(per_device_batch_size=16, workload_knobs={"max_frames_in_batch": 24000}),
    ],
    ids=["autocast", "compiled", "batch-in-frames"],
)
def test_no_estimate_where_a_sample_costs_otherwise_than_in_the_checks_eager_fp32(config):
    estimate = baseline_step_estimate(_checked(0.6), "cpu")
    assert estimate is not None and estimate(config) is None


def test_no_estimate_on_an_accelerator_or_without_a_timed_check():
    """An accelerator's step at a batch of 4 is latency, not compute: scaled up it would refuse budgets that fit."""
    assert baseline_step_estimate(_checked(0.02), "cuda") is None
    assert baseline_step_estimate(_checked(None), "cpu") is None
    assert baseline_step_estimate(None, "cpu") is None
    assert baseline_step_estimate(_checked(0.6, batch=0), "cpu") is None
