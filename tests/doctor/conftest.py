"""Shared pieces of the doctor's tests: running the checks on a prepared context, and a result YAML to size for."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune import workloads
from autotune.doctor import DoctorReport, DoctorRequest, Finding, examine
from autotune.doctor.context import prepare
from autotune.knobs.config import TrialConfig
from autotune.result.tuned_config import TunedConfig, write_config
from tests.conftest import make_cpu


def run_checks(request: DoctorRequest | None = None, names: list[str] | None = None) -> DoctorReport:
    """The registered checks (or those named) on this machine, with whatever NVML the test installed."""
    from autotune.doctor import CHECKS

    context = prepare(request or DoctorRequest())
    try:
        return examine(context, [CHECKS[name] for name in names] if names else None)
    finally:
        context.close()


def finding(report: DoctorReport, name: str) -> Finding:
    matches = [item for item in report.findings if item.name == name]
    assert len(matches) == 1, [item.name for item in report.findings]
    return matches[0]


def one(name: str, request: DoctorRequest | None = None) -> Finding:
    """Run one machine-wide check."""
    return finding(run_checks(request, [name]), name)


def write_result(folder: Path, config: TrialConfig, *, samples_per_second: float = 100.0) -> Path:
    """A cam++ result YAML as `autotune run` writes it, for a winner of this config and throughput."""
    tuned = TunedConfig(
        workload={"name": "cam++", "model": "cam++", "task": "speaker-verification", "options": dict(CAMPP_OPTIONS)},
        config=config,
        device_type="cpu",
        metrics={"winner": {"status": "ok", "samples_per_second": samples_per_second, "measurements": 3}},
        hardware=make_cpu().to_dict(),
        data={"kind": "synthetic", "n_utterances": 12, "total_audio_hours": 0.5, "sample_rates": [16000]},
        search={"trials": 4},
        created="2026-01-02T03:04:05+00:00",
        autotune_version="0.1.0",
    )
    return write_config(tuned, folder / "cam++.yaml")


CAMPP_OPTIONS = workloads.get("cam++").options


@pytest.fixture
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine whose NVML cannot start (this CPU machine, made certain)."""
    from tests.fixtures.fake_nvml import fake_pynvml

    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake_pynvml([], fail_init=True))
