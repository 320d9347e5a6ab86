"""`autotune run --lightning pkg.module:factory`: the user's factory, Lightning's own Trainer, the probe inside: the
factory's knobs and the Trainer's precision reach the training and are read back; the 1/N^2 epoch of a sampler
sharded twice is caught through the factory too; a factory that cannot be used is one line before any trial."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune import load_config
from autotune.cli import app
from autotune.errors import UserError
from autotune.probe.launcher import CommandLauncher
from autotune.probe.lightning import describe, lightning_command
from tests.probe.conftest import spec_for

pytest.importorskip("lightning")
runner = CliRunner()

BROKEN = """
def returns_a_number(per_device_batch_size: int = 8):
    return 3


def needs_a_path(path, num_workers: int = 0):
    return None


not_callable = 7
"""


@pytest.fixture
def project(lightning_training: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example project (make(): train_lightning's factory) and a module of factories that cannot be used."""
    (lightning_training / "broken.py").write_text(BROKEN)
    monkeypatch.chdir(lightning_training)
    return lightning_training


def test_the_factory_is_read_with_its_knobs_and_their_defaults(project: Path) -> None:
    parameters = describe("train_lightning:make", ["devices"], cwd=str(project))
    assert parameters == {"per_device_batch_size": 16, "num_workers": 0, "persistent_workers": False}
    same = describe("train_lightning.py:make", [], cwd=str(project))  # a file names it too
    assert same == parameters


@pytest.mark.parametrize(
    ("spec", "keys", "words"),
    [
        ("train_lightning", [], "write package.module:factory"),
        ("missing_module:make", [], "importing missing_module failed: ModuleNotFoundError"),
        ("train_lightning:nope", [], "train_lightning has no nope"),
        ("broken:not_callable", [], "not_callable is a int, not a function to call"),
        ("broken:needs_a_path", [], "the factory requires 'path', which autotune cannot give"),
        ("train_lightning:make", ["devicez"], "--trainer devicez: Lightning's Trainer takes no such argument"),
        ("train_lightning:make", ["precision"], "--trainer precision: autotune sets it (the precision knob"),
    ],
)
def test_a_factory_that_cannot_be_used_is_one_line(project: Path, spec: str, keys: list[str], words: str) -> None:
    with pytest.raises(UserError) as raised:
        describe(spec, keys, cwd=str(project))
    assert words in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.slow
def test_the_factory_knobs_and_the_trainer_precision_reach_the_training(project: Path, tmp_path: Path) -> None:
    command = lightning_command(
        "train_lightning:make", parameters=["per_device_batch_size", "num_workers", "persistent_workers"], trainer=[]
    )
    spec = spec_for(tmp_path, per_device_batch_size=8, num_workers=1, persistent_workers=True, precision="bf16")
    result = CommandLauncher(command=command)(spec, workdir=tmp_path / "trial", timeout_s=240)
    assert result.status == "ok", result.reason + result.log_tail
    assert result.observed["per_device_batch_size"] == 8 and result.observed["num_workers"] == 1  # type: ignore[index]
    for name in ("per_device_batch_size", "num_workers", "persistent_workers", "precision"):
        assert result.in_force[name]["in_force"] is True, (name, result.in_force)  # type: ignore[index]
    assert result.epoch_accounting["built_at"] == "train_lightning.py:54"  # type: ignore[index]


@pytest.mark.slow
def test_a_sampler_sharded_twice_under_the_factory_is_caught(project: Path, tmp_path: Path) -> None:
    command = lightning_command(
        "train_lightning:make",
        parameters=["per_device_batch_size"],
        trainer=["devices=2", "use_distributed_sampler=true"],
    )
    result = CommandLauncher(command=command)(
        spec_for(tmp_path, per_device_batch_size=8), workdir=tmp_path / "trial", timeout_s=240
    )
    assert result.status == "accounting", result.reason + result.log_tail
    assert "use_distributed_sampler=False" in result.reason and result.observed["world_size"] == 2  # type: ignore[index]


@pytest.mark.slow
def test_a_factory_that_returns_the_wrong_thing_ends_the_run_before_any_trial(project: Path) -> None:
    result = runner.invoke(
        app,
        ["run", "--lightning", "broken:returns_a_number", "--results-dir", "results", "--trials", "2"],
        catch_exceptions=False,
    )
    assert result.exit_code == 2, result.output
    assert "the factory broken:returns_a_number returned a int: return a LightningModule" in result.output
    assert "Traceback" not in result.output and not (project / "results").exists()


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--command", "python train.py"], "give --command or --lightning, not both"),
        (["--set", "a=1"], "--config-file and --set go with --command"),
        (["--trainer", "devices"], "--trainer 'devices': write KEY=VALUE"),
    ],
)
def test_bad_lightning_input_is_one_line(project: Path, extra: list[str], words: str) -> None:
    result = runner.invoke(app, ["run", "--lightning", "train_lightning:make", *extra], catch_exceptions=False)
    assert result.exit_code == 2 and words in result.output, result.output
    assert "Traceback" not in result.output


def test_the_trainer_goes_with_lightning_only() -> None:
    result = runner.invoke(app, ["run", "--model", "cam++", "--trainer", "devices=2"], catch_exceptions=False)
    assert result.exit_code == 2 and "--trainer goes with --lightning" in result.output


@pytest.mark.slow
def test_a_lightning_training_is_tuned_and_exported_as_the_user_writes_it(project: Path) -> None:
    fast = ["--trials", "2", "--budget", "none", "--window", "1", "--confirm", "0", "--no-prune"]
    result = runner.invoke(
        app,
        ["run", "--lightning", "train_lightning:make", "--results-dir", "results", *fast],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    [result_path] = (project / "results" / "train_lightning").glob("*.yaml")
    tuned = load_config(result_path)
    assert tuned.workload["options"]["command"]["lightning"] == "train_lightning:make"
    verdicts = tuned.metrics["winner"]["in_force"]
    assert {"per_device_batch_size", "num_workers", "precision"} <= set(verdicts)
    # each in force, or not used (persistent_workers without workers): none that did not arrive
    assert all(verdict["in_force"] is not False for verdict in verdicts.values()), verdicts
    assert verdicts["per_device_batch_size"]["in_force"] and verdicts["precision"]["in_force"]
    exported = runner.invoke(app, ["export", str(result_path)], catch_exceptions=False)
    assert exported.exit_code == 0, exported.output
    assert f"made = make(per_device_batch_size={tuned.config.per_device_batch_size}" in exported.output
    assert "trainer = Trainer(accelerator='cpu', precision=" in exported.output
    assert exported.output.splitlines()[2].startswith(f"{sys.executable} -m autotune.probe.lightning fit")
