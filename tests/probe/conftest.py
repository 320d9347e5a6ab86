"""Fixtures for the probe's tests: the example training, a small corpus for it, and a trial spec to run it with."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from autotune.data.synth import generate_corpus
from autotune.knobs.config import TrialConfig
from autotune.trial.spec import TimingSettings, TrialSpec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_training"
# Short windows: what is tested is what the probe sees and how a trial ends, not a figure.
FAST_TIMING = TimingSettings(window_s=1.0, min_timed_share=0.0, max_warmup_factor=2.0, max_throughput_cv=None)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """96 WAV files of 4 speakers: six batches of 16 an epoch."""
    return generate_corpus(
        tmp_path_factory.mktemp("corpus"), n_speakers=4, files_per_speaker=24, min_duration_s=2.5, max_duration_s=4.0
    )


@pytest.fixture
def training(tmp_path: Path, corpus: Path) -> Path:
    """A folder holding the example training and its config file pointed at the corpus (the user's project)."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(EXAMPLE / "train.py", project / "train.py")
    text = (EXAMPLE / "train.yaml").read_text().replace("root: data", f"root: {corpus}")
    (project / "train.yaml").write_text(text)
    return project


def spec_for(tmp_path: Path, timing: TimingSettings = FAST_TIMING, **config: object) -> TrialSpec:
    """A trial of the example training: its result in tmp_path/trial."""
    values = {"per_device_batch_size": 16, **config}
    return TrialSpec(
        workload="command",
        workload_options={},
        data_file="",
        config=TrialConfig(**values),  # type: ignore[arg-type]
        timing=timing,
        device_type="cpu",
        result_path=str(tmp_path / "trial" / "result.json"),
    )


@pytest.fixture
def lightning_training(training: Path) -> Path:
    """The project with the Lightning version of the example training beside the plain one."""
    shutil.copy(EXAMPLE / "train_lightning.py", training / "train_lightning.py")
    return training
