"""`autotune run --command` as a user runs it: a plain PyTorch training tuned from outside, the winner's command and
config file written back, and that command measured again; bad input one line before any trial."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune import load_config
from autotune.cli import app
from autotune.probe.command import TrainingCommand
from autotune.probe.launcher import CommandLauncher
from tests.probe.conftest import spec_for

runner = CliRunner()
TEMPLATE = f"{sys.executable} train.py --config {{config}} --num-workers {{num_workers}}"
FAST = ["--trials", "3", "--budget", "none", "--window", "1", "--confirm", "2", "--no-prune"]


def _run(project: Path, *extra: str) -> tuple[int, str]:
    args = ["run", "--command", TEMPLATE, "--config-file", "train.yaml"]
    args += ["--set", "train.batch_size={per_device_batch_size}", "--results-dir", str(project / "results"), *extra]
    result = runner.invoke(app, args, catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.slow
def test_a_training_is_tuned_its_command_and_config_written_back_and_measured_again(
    training: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(training)
    before = (training / "train.yaml").read_text()
    code, output = _run(training, *FAST)
    assert code == 0, output
    [result_path] = (training / "results" / "train").glob("*.yaml")
    tuned = load_config(result_path)
    assert tuned.workload["task"] == "own-training" and tuned.workload["name"] == "train"
    assert tuned.workload["options"]["command"]["template"] == TEMPLATE
    winner = tuned.metrics["winner"]["samples_per_second"]
    assert winner and winner > 0
    assert (training / "train.yaml").read_text() == before  # the user's file is never written
    copy = result_path.with_suffix(".config") / "train.yaml"
    assert f"batch_size: {tuned.config.per_device_batch_size}" in copy.read_text()
    diff = Path(f"{copy}.diff").read_text()
    if tuned.config.per_device_batch_size == 16:  # the baseline's batch won: the copy is the file as it was
        assert diff == "" and copy.read_text() == before
    else:
        assert diff.startswith("--- train.yaml") and f"+  batch_size: {tuned.config.per_device_batch_size}" in diff
    exported = runner.invoke(app, ["export", str(result_path)], catch_exceptions=False)
    assert exported.exit_code == 0, exported.output
    line = next(text for text in exported.output.splitlines() if text.startswith(sys.executable))
    assert f"--num-workers {tuned.config.num_workers}" in line and str(copy) in line
    assert line == result_path.with_suffix(".command.sh").read_text().splitlines()[-1]
    # The written-back command, measured again under the probe: the winner's figure holds within this CPU's noise.
    again = CommandLauncher(command=TrainingCommand.checked(line.replace("{", "{{").replace("}", "}}"), cwd="."))(
        spec_for(tmp_path, per_device_batch_size=tuned.config.per_device_batch_size),
        workdir=tmp_path / "again",
        timeout_s=120,
    )
    assert again.status == "ok", again.reason
    assert again.observed["per_device_batch_size"] == tuned.config.per_device_batch_size  # type: ignore[index]
    assert again.observed["num_workers"] == tuned.config.num_workers  # type: ignore[index]
    assert 1 / 3 < again.samples_per_second / winner < 3  # type: ignore[operator]


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--set", "train.batchsize=1"], "--set train.batchsize: 'batchsize' is not under train"),
        (["--devices", "2"], "--devices does not apply to --command"),
        (["--baseline", "batch=3"], "--baseline 'batch=3': write KNOB=VALUE"),
        (["--apply", "num_workers"], "--apply num_workers: the command carries it already"),
    ],
)
def test_bad_input_is_one_line_before_any_trial(
    training: Path, monkeypatch: pytest.MonkeyPatch, extra: list[str], words: str
) -> None:
    monkeypatch.chdir(training)
    code, output = _run(training, *extra)
    assert code == 2 and words in output, output
    assert "Traceback" not in output and not (training / "results").exists()


def test_neither_a_model_nor_a_command_is_one_line() -> None:
    result = runner.invoke(app, ["run"], catch_exceptions=False)
    assert result.exit_code == 2 and "give --model NAME" in result.output


@pytest.mark.slow
def test_a_command_that_never_trains_ends_the_run_before_any_trial(training: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(training)
    command = f"{sys.executable} -c {shlex.quote('import torch, sys; sys.exit(0)')} {{num_workers}}"
    result = runner.invoke(
        app, ["run", "--command", command, "--results-dir", "results", *FAST], catch_exceptions=False
    )
    assert result.exit_code == 2, result.output
    assert "your training could not be measured: the command ended without an optimizer step" in result.output
    assert not (training / "results").exists()  # refused before anything was made
