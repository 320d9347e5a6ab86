"""`autotune run --recipe FRAMEWORK` end to end, as the recipe tests run it: a short real run in-process, its result
read back, and the command `autotune export` writes from it measured again under the probe."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from autotune import load_config
from autotune.cli import app
from autotune.probe.command import TrainingCommand
from autotune.probe.launcher import CommandLauncher
from tests.probe.conftest import spec_for

# Two trials, one-second windows, no confirmation or pruning: what is tested is the loop, not a figure.
FAST_RUN = ["--trials", "2", "--budget", "none", "--window", "1", "--confirm", "0", "--no-prune"]


def tune(framework: str, command: str, folder: Path) -> tuple[Path, Any]:
    """Run the recipe from `folder` (the working directory) and return its result file and the loaded result, whose
    winner had its batch in force."""
    result = CliRunner().invoke(
        app,
        ["run", "--recipe", framework, "--command", command, "--results-dir", "results", *FAST_RUN],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    [path] = (folder / "results").glob("*/*.yaml")
    tuned = load_config(path)
    assert tuned.workload["options"]["command"]["recipe"] == framework
    assert tuned.metrics["winner"]["in_force"]["per_device_batch_size"]["in_force"]
    return path, tuned


def measure_export_again(result_path: Path, tuned: Any, tmp_path: Path) -> str:
    """The command `autotune export` writes for the result, run again under the probe: the batch it trains with is
    the winner's, and its rate holds within this CPU's noise (1/3-3x). Returns the exported command."""
    exported = CliRunner().invoke(app, ["export", str(result_path)], catch_exceptions=False)
    assert exported.exit_code == 0, exported.output
    line = next(text for text in exported.output.splitlines() if text.startswith(sys.executable))
    batch = tuned.config.per_device_batch_size
    # The exported line is a shell command: braces in it (a YAML block) are literal, not a template's placeholders.
    again = CommandLauncher(command=TrainingCommand.checked(line.replace("{", "{{").replace("}", "}}"), cwd="."))(
        spec_for(tmp_path, per_device_batch_size=batch), workdir=tmp_path / "again", timeout_s=300
    )
    assert again.status == "ok", again.reason + again.log_tail
    assert again.observed["per_device_batch_size"] == batch  # type: ignore[index]
    assert 1 / 3 < again.samples_per_second / tuned.metrics["winner"]["samples_per_second"] < 3  # type: ignore[operator]
    return line
