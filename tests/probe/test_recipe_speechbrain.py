"""`autotune run --recipe speechbrain --command '...'`: a SpeechBrain recipe (a Brain subclass, hparams in
HyperPyYAML, Brain.fit with the hparams' loader options) trained by SpeechBrain's own code, each candidate written as
SpeechBrain's own overrides from the table the SpeechBrain export writes with; every value read back; a value the
recipe's script ignores reported; the winner's command measured again."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.errors import UserError
from autotune.exports.recipes import recipe_command
from autotune.exports.speechbrain import LOADER_OPTIONS, PRECISION_WORDS
from autotune.probe.command import TrainingCommand
from autotune.probe.launcher import CommandLauncher
from tests.probe.conftest import spec_for
from tests.probe.recipe_run import measure_export_again, tune

pytest.importorskip("speechbrain")
runner = CliRunner()
RECIPE = Path(__file__).resolve().parents[2] / "examples" / "speechbrain_recipe"
COMMAND = f"{sys.executable} train.py hparams/train_ecapa_tdnn.yaml --data_folder data"


@pytest.fixture
def recipe(tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example recipe in a folder of its own, its data folder the test corpus."""
    project = tmp_path / "recipe"
    shutil.copytree(RECIPE, project, ignore=shutil.ignore_patterns("data", "results"))
    (project / "data").symlink_to(corpus)
    monkeypatch.chdir(project)
    return project


def test_the_recipe_command_carries_every_loader_knob_and_the_precision_as_speechbrain_overrides(
    recipe: Path,
) -> None:
    command, baseline = recipe_command("speechbrain", COMMAND)
    assert baseline == ["per_device_batch_size=16", "num_workers=0"]  # the hparams' loader options, refs resolved
    assert set(command.knobs) == {*LOADER_OPTIONS, "precision"}
    spec = spec_for(recipe, per_device_batch_size=8, num_workers=2, prefetch_factor=4, precision="bf16")
    argv = command.argv(spec.config, None)
    assert argv[-4:] == [
        "--dataloader_options",
        "{batch_size: 8, num_workers: 2, pin_memory: false, prefetch_factor: 4, persistent_workers: false}",
        "--precision",
        PRECISION_WORDS["bf16"],
    ]
    no_workers = command.argv(spec_for(recipe, per_device_batch_size=8, precision="fp32-default").config, None)
    assert "prefetch_factor: null, persistent_workers: false}" in no_workers[-3]  # what torch takes without workers
    assert no_workers[-1] == "fp32"
    again = TrainingCommand.from_dict(command.to_dict())  # as a result records it, for the export
    assert again.argv(spec.config, None) == argv


@pytest.mark.parametrize(
    ("framework", "command", "words"),
    [
        ("kaldi", COMMAND, "--recipe kaldi: autotune runs the recipes of 3d-speaker, espnet, speechbrain"),
        ("speechbrain", f"{sys.executable} train.py --data_folder data", "the command names no hparams file"),
        ("speechbrain", COMMAND + " --batch_sise 8", "--batch_sise is not a key of hparams/train_ecapa_tdnn.yaml"),
        ("speechbrain", COMMAND + " --precision bf16", "the command sets --precision itself"),
        ("speechbrain", COMMAND + " --dataloader_options {}", "the command sets --dataloader_options itself"),
        ("speechbrain", COMMAND.replace("train_ecapa", "missing"), "cannot read hparams/missing_tdnn.yaml"),
    ],
)
def test_a_recipe_autotune_cannot_run_is_one_line(recipe: Path, framework: str, command: str, words: str) -> None:
    with pytest.raises(UserError) as raised:
        recipe_command(framework, command)
    assert words in str(raised.value) and "\n" not in str(raised.value)


def test_run_options_are_not_taken_for_unknown_keys(recipe: Path) -> None:
    command, _ = recipe_command("speechbrain", COMMAND + " --device cpu --grad_accumulation_factor 1")
    assert command.recipe == "speechbrain"


def test_recipe_options_are_one_line_before_anything(recipe: Path) -> None:
    result = runner.invoke(app, ["run", "--recipe", "speechbrain"], catch_exceptions=False)
    assert result.exit_code == 2 and "--recipe speechbrain goes with --command" in result.output
    result = runner.invoke(
        app, ["run", "--recipe", "speechbrain", "--command", COMMAND, "--apply", "num_workers"], catch_exceptions=False
    )
    assert result.exit_code == 2 and "do not go with --recipe speechbrain" in result.output
    assert not (recipe / "results").exists()


@pytest.mark.slow
def test_a_value_the_recipe_script_ignores_is_reported(recipe: Path, tmp_path: Path) -> None:
    script = (recipe / "train.py").read_text()
    fixed = 'train_loader_kwargs={**hparams["dataloader_options"], "num_workers": 0}'
    (recipe / "train.py").write_text(script.replace('train_loader_kwargs=hparams["dataloader_options"]', fixed))
    command, _ = recipe_command("speechbrain", COMMAND)
    spec = spec_for(tmp_path, per_device_batch_size=8, num_workers=1, precision="bf16")
    result = CommandLauncher(command=command)(spec, workdir=tmp_path / "trial", timeout_s=240)
    assert result.status == "ok", result.reason + result.log_tail
    verdicts = result.in_force or {}
    assert verdicts["num_workers"]["in_force"] is False
    assert verdicts["num_workers"]["note"].startswith("num_workers: your training ran with 0, not 1")
    assert "(train.py:" in verdicts["num_workers"]["note"]  # the recipe's own line, not SpeechBrain's loader maker
    assert verdicts["per_device_batch_size"]["in_force"] is True and verdicts["precision"]["in_force"] is True


@pytest.mark.slow
def test_a_speechbrain_recipe_is_tuned_and_its_command_measured_again(recipe: Path, tmp_path: Path) -> None:
    result_path, tuned = tune("speechbrain", COMMAND, recipe)
    assert tuned.metrics["winner"]["in_force"]["precision"]["in_force"]
    line = measure_export_again(result_path, tuned, tmp_path)
    assert f"--dataloader_options '{{batch_size: {tuned.config.per_device_batch_size}," in line
