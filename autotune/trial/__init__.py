"""Trials: one configuration trained and timed in a fresh subprocess."""

from __future__ import annotations

from autotune.trial.launch import launch
from autotune.trial.spec import FEASIBLE_STATUSES, STATUSES, TimingSettings, TrialResult, TrialSpec

__all__ = ["FEASIBLE_STATUSES", "STATUSES", "TimingSettings", "TrialResult", "TrialSpec", "launch"]
