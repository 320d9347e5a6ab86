"""The training command's placeholders, --set keys and --apply knobs: checked before anything runs, filled per trial;
the user's config file copied with exactly the asked keys changed, comments kept, the file itself untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.errors import UserError
from autotune.knobs.config import TrialConfig
from autotune.probe import config_file
from autotune.probe.command import TrainingCommand

CONFIG = """\
# the user's comment
data:
  root: data        # where the audio is
train:
  batch_size: 16    # per process
  optim: {lr: 0.001}
  stages:
    - name: warm
      epochs: 2
"""


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text(CONFIG)
    return path


def test_a_command_fills_its_placeholders_and_its_config_copy(tmp_path: Path, config_path: Path) -> None:
    command = TrainingCommand.checked(
        "python train.py --config {config} --workers {num_workers} --pin {pin_memory}",
        config_path=str(config_path),
        sets=["train.batch_size={per_device_batch_size}"],
        apply=["prefetch_factor"],
    )
    assert command.knobs == ("per_device_batch_size", "num_workers", "prefetch_factor", "pin_memory")
    assert command.knobs_by == {
        "num_workers": "command",
        "pin_memory": "command",
        "per_device_batch_size": "config",
        "prefetch_factor": "autotune",
    }
    config = TrialConfig(per_device_batch_size=48, num_workers=3, prefetch_factor=4, pin_memory=True)
    copy = command.write_config(config, tmp_path / "trial")
    assert copy is not None and copy.parent == tmp_path / "trial"
    assert command.argv(config, copy) == [
        "python",
        "train.py",
        "--config",
        str(copy),
        "--workers",
        "3",
        "--pin",
        "true",
    ]
    assert command.apply_values(config) == {"prefetch_factor": 4}
    assert config_path.read_text() == CONFIG  # the user's file is never written
    edited = copy.read_text()
    assert "  batch_size: 48    # per process\n" in edited and "# the user's comment" in edited
    assert edited.replace("batch_size: 48", "batch_size: 16") == CONFIG


def test_a_copy_changes_keys_in_lists_flow_mappings_and_json(tmp_path: Path, config_path: Path) -> None:
    config_file.write_changed(
        str(config_path), {"train.stages.0.epochs": 5, "train.optim.lr": 0.01}, tmp_path / "a.yaml"
    )
    import yaml

    changed = yaml.safe_load((tmp_path / "a.yaml").read_text())
    assert changed["train"]["stages"][0]["epochs"] == 5 and changed["train"]["optim"]["lr"] == 0.01
    source = tmp_path / "conf.json"
    source.write_text(json.dumps({"train": {"batch_size": 8, "num_workers": 2}}))
    config_file.write_changed(str(source), {"train.batch_size": 32}, tmp_path / "b.json")
    assert json.loads((tmp_path / "b.json").read_text()) == {"train": {"batch_size": 32, "num_workers": 2}}
    # a flow mapping and a list are beyond line editing: the copy is written whole (its comments lost), values right
    added = [line for line in config_file.diff(str(config_path), tmp_path / "a.yaml").splitlines() if line[:1] == "+"]
    assert any(line[1:].strip() == "epochs: 5" for line in added)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"template": ""}, "--command is empty"),
        ({"template": "python train.py --bs {batch}"}, "{batch} names no knob"),
        ({"template": "python train.py --bs {per_device_batch_size"}, "write a literal brace"),
        ({"template": "python 'train.py"}, "cannot be split into words"),
        ({"template": "python train.py --config {config}"}, "no --config-file was given"),
        ({"template": "python train.py", "sets": ["a=1"]}, "--set needs --config-file"),
        ({"template": "python train.py", "config": True}, "never reads the tuned copy"),
        (
            {"template": "python train.py {config}", "config": True, "sets": ["train.batchsize=1"]},
            "'batchsize' is not under train",
        ),
        ({"template": "python train.py {config}", "config": True, "sets": ["train=1"]}, "holds a dict, not one value"),
        ({"template": "python train.py {config}", "config": True, "sets": ["train.batch_size"]}, "write KEY=VALUE"),
        (
            {"template": "python train.py {config}", "config": True, "sets": ["train.batch_size={threads}"]},
            "{threads} names no knob",
        ),
        ({"template": "python train.py", "apply": ["precision"]}, "the probe can set only"),
        ({"template": "python train.py --w {num_workers}", "apply": ["num_workers"]}, "carries it already"),
    ],
)
def test_bad_commands_are_one_line(config_path: Path, kwargs: dict, words: str) -> None:
    if kwargs.pop("config", False):
        kwargs["config_path"] = str(config_path)
    with pytest.raises(UserError) as raised:
        TrainingCommand.checked(**kwargs)
    assert words in str(raised.value) and "\n" not in str(raised.value)


def test_a_missing_config_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        TrainingCommand.checked("python t.py {config}", config_path=str(tmp_path / "nope.yaml"))
