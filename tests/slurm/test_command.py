"""The user's own training command through the SLURM executor on a real (test) cluster: its trial runs as a job on a
node, under the probe there, and comes back judged knob by knob; `autotune run --command --executor slurm` checks the
command's reach in a job too."""

from __future__ import annotations

import functools
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.data.synth import generate_corpus
from autotune.knobs.config import TrialConfig
from autotune.probe.command import TrainingCommand
from autotune.probe.launcher import run_command
from autotune.trial import TimingSettings, TrialSpec
from autotune.trial.slurm import SlurmLauncher, SlurmSettings
from tests.fixtures.slurm import PARTITION

pytestmark = pytest.mark.slow
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_training"
TEMPLATE = f"{sys.executable} train.py --config {{config}} --num-workers {{num_workers}}"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The example training and its config, pointed at a small corpus, in a folder the node shares."""
    corpus = generate_corpus(tmp_path / "corpus", n_speakers=4, files_per_speaker=24, min_duration_s=2.5)
    folder = tmp_path / "project"
    folder.mkdir()
    shutil.copy(EXAMPLE / "train.py", folder / "train.py")
    (folder / "train.yaml").write_text((EXAMPLE / "train.yaml").read_text().replace("root: data", f"root: {corpus}"))
    return folder


def test_a_command_trial_runs_as_a_slurm_job_under_the_probe(slurm_cluster, project: Path, tmp_path: Path) -> None:
    command = TrainingCommand.checked(
        TEMPLATE,
        config_path=str(project / "train.yaml"),
        sets=["train.batch_size={per_device_batch_size}"],
        cwd=str(project),
    )
    launcher = SlurmLauncher(
        settings=SlurmSettings(partition=PARTITION),
        poll_s=0.2,
        measure=functools.partial(run_command, command.to_dict()),
    )
    spec = TrialSpec(
        workload="command",
        workload_options={},
        data_file="",
        config=TrialConfig(per_device_batch_size=8, num_workers=1),
        timing=TimingSettings(window_s=1.0, min_timed_share=0.0, max_warmup_factor=2.0, max_throughput_cv=None),
        device_type="cpu",
        result_path=str(tmp_path / "trial" / "result.json"),
    )
    result = launcher(spec, workdir=tmp_path / "trial", timeout_s=180)
    assert result.status == "ok", result.reason + result.log_tail
    assert result.node and result.samples_per_second > 0
    assert result.in_force["num_workers"]["in_force"] is True  # type: ignore[index]
    assert result.in_force["per_device_batch_size"]["by"] == "config"  # type: ignore[index]
    assert list((tmp_path / "trial" / "slurm").glob("*_submission.sh"))  # it was a job


def test_run_command_with_the_slurm_executor_checks_its_reach_in_a_job(
    slurm_cluster, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(project)
    args = [
        "run",
        "--command",
        TEMPLATE,
        "--config-file",
        "train.yaml",
        "--set",
        "train.batch_size={per_device_batch_size}",
    ]
    args += ["--executor", "slurm", "--slurm-partition", PARTITION, "--trials", "2", "--budget", "none"]
    args += ["--window", "1", "--confirm", "0", "--no-prune", "--results-dir", "results"]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert list((project / "results" / "train").glob("*.yaml"))
    assert not list(project.glob(".autotune-reach-check-*"))  # the check's folder, in the shared project, removed
