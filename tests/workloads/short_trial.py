"""Two real training steps of a workload in a trial subprocess (one warm-up, one timed), for the workload tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune import yamlio
from autotune.data import DataSource
from autotune.knobs.config import TrialConfig
from autotune.trial import TimingSettings, TrialResult, TrialSpec, launch


def run_two_steps(
    name: str, data: DataSource, options: dict[str, Any], config: TrialConfig, tmp_path: Path
) -> TrialResult:
    """Launch the trial child as autotune does and return its result, asserting it finished."""
    spec = TrialSpec(
        workload=name,
        workload_options=options,
        data_file=str(yamlio.write_json(tmp_path / "data.json", data.to_dict())),
        config=config,
        timing=TimingSettings(warmup_steps=1, window_s=0.01, min_window_steps=1, max_window_steps=1),
        device_type="cpu",
        result_path=str(tmp_path / "trial" / "result.json"),
    )
    result = launch(spec, workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == "ok", result.log_tail
    assert result.all_losses_finite and result.window_steps == 1
    return result
