"""What crosses the process boundary: specs and results read back exactly, unknown keys and statuses refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import autotune
from autotune.knobs.config import TrialConfig
from autotune.trial.amp_curves import AmpCheckSettings
from autotune.trial.spec import STATUSES, TimingSettings, TrialResult, TrialSpec

SPEC = TrialSpec(
    workload="cam++",
    workload_options={"num_classes": 4},
    data_file="data.json",
    config=TrialConfig(per_device_batch_size=8, num_workers=2, workload_knobs={"crop_seconds": 2.0}),
    timing=TimingSettings(window_s=2.0),
    device_type="cpu",
    result_path="result.json",
)


def test_specs_and_results_read_back_equal() -> None:
    assert TrialSpec.from_dict(SPEC.to_dict()) == SPEC
    result = TrialResult(status="ok", samples_per_second=12.5, epoch_accounting={"dataset_size": 3})
    assert TrialResult.from_dict(result.to_dict()) == result


@pytest.mark.parametrize(
    ("read", "data", "key"),
    [
        (TrialConfig.from_dict, {"per_device_batch_size": 8, "num_wokers": 2}, "num_wokers"),
        (TimingSettings.from_dict, {"window_s": 2.0, "warmup_step": 3}, "warmup_step"),
        (TrialSpec.from_dict, {**SPEC.to_dict(), "seeds": 3}, "seeds"),
        (TrialSpec.from_dict, {**SPEC.to_dict(), "config": {**SPEC.config.to_dict(), "precison": "bf16"}}, "precison"),
        (TrialResult.from_dict, {"status": "ok", "samples_per_secnd": 3.0}, "samples_per_secnd"),
        (AmpCheckSettings.from_dict, {"steps": 4, "tolerance": 0.1}, "tolerance"),
    ],
    ids=["config", "timing", "spec", "spec-config", "result", "amp-settings"],
)
def test_a_misspelled_key_is_an_error_naming_it(read, data, key) -> None:
    with pytest.raises(ValueError, match=f"has no field '{key}'") as raised:
        read(data)
    assert "\n" not in str(raised.value)


def test_a_search_point_with_a_knob_nobody_declared_is_an_error() -> None:
    with pytest.raises(ValueError, match="'crop_seconds'"):
        TrialConfig.from_params({"per_device_batch_size": 8, "crop_seconds": 2.0})  # a workload knob, undeclared
    config = TrialConfig.from_params(
        {"per_device_batch_size": 8, "crop_seconds": 2.0}, workload_knobs=("crop_seconds",)
    )
    assert config.workload_knobs == {"crop_seconds": 2.0}


def test_a_status_no_one_declared_is_refused() -> None:
    with pytest.raises(ValueError, match="'disturbed' is not one of"):
        TrialResult(status="disturbed")
    assert TrialResult(status="skipped", reason="no room left in --budget").feasible is False


def test_every_status_the_code_gives_a_result_is_declared() -> None:
    """Every literal status the package assigns to a trial result (or classify_exception returns) is in STATUSES."""
    package = Path(autotune.__file__).parent
    assigned = re.compile(r'(?:TrialResult\(\s*status=|\.status = |\.status, \w+\.reason = )"(\w+)"')
    classified = re.compile(r'^\s+return "(\w+)", ', re.MULTILINE)
    found: set[str] = set()
    for path in package.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if "TrialResult" in text:
            found |= set(assigned.findall(text))
    found |= set(classified.findall((package / "trial" / "child.py").read_text(encoding="utf-8")))
    assert {"oom", "skipped", "precision", "erratic", "headroom", "timeout"} <= found  # the scan finds them
    assert found <= set(STATUSES), found - set(STATUSES)
