"""The typed summary of a configuration's measurements writes the result's mapping exactly as it always has."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotune.errors import UserError
from autotune.result.measurements import NOT_MEASURED, Measurements, summarise_measurements
from autotune.result.tuned_config import load_config, write_config
from autotune.trial.spec import TrialResult
from tests.result.test_results import make_tuned

# metrics.winner / metrics.baseline of a result YAML, in order, as autotune wrote them before the summary was typed.
RESULT_KEYS = [
    "status",
    "samples_per_second",
    "samples_per_second_min",
    "samples_per_second_max",
    "spread_fraction",
    "measurements",
    "audio_seconds_per_second",
    "step_time_median_s",
    "step_time_p90_s",
    "data_wait_fraction",
    "peak_memory_bytes",
    "memory_capacity_bytes",
    "gpu_utilization_percent",
    "gpu_power_watts",
    "start_s",
    "setup_s",
    "trial_wall_s",
    "world_size",
    "per_rank_samples_per_second",
    "epoch_accounting",
    "fp32_math",
]


def test_a_measured_summary_writes_the_same_keys_in_the_same_order() -> None:
    summary = summarise_measurements([TrialResult(status="ok", samples_per_second=10.0, wall_s=3.0, world_size=2)])
    assert isinstance(summary, Measurements) and summary.ok
    assert list(summary.to_dict()) == RESULT_KEYS
    assert summary.trial_wall_s == 3.0 and summary.world_size == 2 and summary.measurements == 1


def test_an_unmeasured_summary_writes_its_status_and_reason_and_no_baseline_writes_nothing() -> None:
    failed = summarise_measurements([TrialResult(status="timeout", reason="hung")])
    assert not failed.ok and failed.measurements == 0
    assert failed.to_dict() == {"status": "timeout", "reason": "hung"}
    assert NOT_MEASURED.to_dict() == {} and not NOT_MEASURED.ok


def test_a_result_reads_its_measurements_back_typed_and_refuses_a_misspelled_figure(tmp_path: Path) -> None:
    tuned = make_tuned()
    loaded = load_config(write_config(tuned, tmp_path / "result.yaml"))
    assert loaded.winner == Measurements(status="ok", samples_per_second=123.456, measurements=3)
    assert loaded.baseline is NOT_MEASURED  # this result has no baseline section
    winner = {**tuned.metrics["winner"], "samples_per_secnd": 1.0}
    misspelled = dataclasses.replace(tuned, metrics={**tuned.metrics, "winner": winner})
    with pytest.raises(UserError, match="samples_per_secnd") as raised:
        load_config(write_config(misspelled, tmp_path / "misspelled.yaml"))
    assert "\n" not in str(raised.value)


def test_a_compiled_configuration_also_writes_its_compile_and_steady_rate() -> None:
    """Eager results keep their keys (above); a compiled one adds compile_s, recompiles and the steady window rate
    its charged objective was computed from, and reads back equal."""
    results = [
        TrialResult(status="ok", samples_per_second=s, window_samples_per_second=w, compile_s=c, recompiles=r)
        for s, w, c, r in ((40.0, 100.0, 30.0, 1), (44.0, 110.0, 20.0, 0), (42.0, 90.0, 25.0, 2))
    ]
    summary = summarise_measurements(results)
    assert list(summary.to_dict()) == [*RESULT_KEYS, "compile_s", "recompiles", "steady_samples_per_second"]
    assert (summary.compile_s, summary.recompiles, summary.steady_samples_per_second) == (25.0, 2, 100.0)
    assert Measurements.from_dict(summary.to_dict()) == summary


def test_a_configuration_charged_for_its_epochs_starts_writes_that_cost_and_its_steady_rate() -> None:
    """A trial that measured a new epoch's cost (trial/epoch_boundary.py) charged it in samples_per_second: the result
    keeps the median cost and the steady window rate beside the objective, and reads back equal."""
    results = [
        TrialResult(status="ok", samples_per_second=s, window_samples_per_second=w, epoch_boundary_s=b)
        for s, w, b in ((690.0, 1334.0, 1.4), (700.0, 1320.0, 1.3), (680.0, 1340.0, 1.5))
    ]
    summary = summarise_measurements(results)
    assert list(summary.to_dict()) == [*RESULT_KEYS, "steady_samples_per_second", "epoch_start_s"]
    assert (summary.epoch_start_s, summary.steady_samples_per_second) == (1.4, 1334.0)
    assert Measurements.from_dict(summary.to_dict()) == summary
