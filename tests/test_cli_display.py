"""The run summary's assessment lines, drawn from a result's metrics."""

from __future__ import annotations

import io

from rich.console import Console

from autotune.cli_display import _print_assessment


def _shown(metrics: dict) -> str:
    console = Console(file=io.StringIO(), width=200)
    _print_assessment(console, metrics)
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_a_pipeline_above_its_ceiling_is_shown_as_at_the_ceiling():
    compute = {"flops_per_sample": 1.0e10, "achieved_tflops": 0.148, "ceiling_samples_per_second": 13.35}
    above = _shown({"compute": {**compute, "pipeline_efficiency": 1.1021}})
    assert "pipeline efficiency 110% (at the ceiling: above 100% is measurement noise)" in above
    below = _shown({"compute": {**compute, "pipeline_efficiency": 0.62}})
    assert "pipeline efficiency 62%" in below and "measurement noise" not in below


def test_the_measurement_noise_is_shown_when_something_was_measured_twice():
    noise = {"configurations": 3, "median_spread_fraction": 0.14, "max_spread_fraction": 0.261}
    assert (
        "measurement noise: repeated windows of one configuration spread 14% (median over 3 re-measured; up to 26%)"
        in _shown({"noise": noise})
    )
    assert "measurement noise" not in _shown({"noise": {"configurations": 0}})
