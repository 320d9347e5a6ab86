"""Pruning: a search trial whose running throughput cannot compete is stopped early."""

from __future__ import annotations

from autotune.knobs.config import TrialConfig
from autotune.search.candidates import TrialRecord
from autotune.search.pruning import Pruner
from autotune.search.settings import TunerSettings
from autotune.trial import TimingSettings, TrialResult


def test_pruner_compares_running_rate_with_the_best_so_far():
    best = TrialRecord(
        number=0,
        role="baseline",
        config=TrialConfig(per_device_batch_size=8),
        result=TrialResult(status="ok", samples_per_second=100.0),
    )
    pruner = Pruner(best, TunerSettings(timing=TimingSettings(window_s=10.0)))
    assert pruner({"phase": "warmup", "samples_per_second": 30.0, "elapsed_s": 1.0}) is None
    assert "below 25%" in pruner({"phase": "warmup", "samples_per_second": 20.0, "elapsed_s": 1.0})
    assert pruner({"phase": "window", "samples_per_second": 10.0, "elapsed_s": 1.0}) is None  # too early to judge
    assert "below 50%" in pruner({"phase": "window", "samples_per_second": 40.0, "elapsed_s": 3.0})
    assert pruner({"phase": "window", "samples_per_second": 60.0, "elapsed_s": 3.0}) is None
    assert Pruner(None, TunerSettings())({"phase": "window", "samples_per_second": 0.1, "elapsed_s": 9.0}) is None
