"""The run of a user's own command, without running it: its baseline, its space cut to what it carries, and the space
after the reach check (a value that did not arrive left out, the knobs not carried fixed at what the training ran)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.errors import UserError
from autotune.probe.command import TrainingCommand
from autotune.run.own_training import ReachCheck, after_reach, baseline_values, command_space, moved_off_baseline
from tests.conftest import make_cpu, make_cuda


@pytest.fixture
def command(tmp_path: Path) -> TrainingCommand:
    config = tmp_path / "train.yaml"
    config.write_text("train:\n  batch_size: 24\n")
    return TrainingCommand.checked(
        "python train.py --config {config} --workers {num_workers} --pin {pin_memory}",
        config_path=str(config),
        sets=["train.batch_size={per_device_batch_size}"],
    )


def test_the_baseline_is_the_training_as_it_runs_today(command: TrainingCommand) -> None:
    assert baseline_values(command, []) == {"per_device_batch_size": 24, "num_workers": 0, "pin_memory": False}
    assert baseline_values(command, ["num_workers=6"])["num_workers"] == 6
    bare = TrainingCommand.checked("python train.py --bs {per_device_batch_size}")
    with pytest.raises(UserError, match="the baseline needs per_device_batch_size"):
        baseline_values(bare, [])


def test_the_space_holds_only_what_the_command_carries_around_its_batch(command: TrainingCommand) -> None:
    space = command_space(command, baseline_values(command, []), make_cuda())
    assert {param.name for param in space.params} == {"per_device_batch_size", "num_workers", "pin_memory"}
    batch = next(param for param in space.params if param.name == "per_device_batch_size")
    assert (batch.distribution.low, batch.distribution.high) == (6, 96)  # type: ignore[attr-defined]
    moved = moved_off_baseline(space, space.baseline, "cuda")
    assert moved.per_device_batch_size != 24 and moved.num_workers != 0 and moved.pin_memory is True


def test_a_value_that_did_not_arrive_is_left_out_and_the_rest_is_fixed_at_what_ran(command: TrainingCommand) -> None:
    space = command_space(command, baseline_values(command, []), make_cpu())
    reach = ReachCheck(
        in_force={
            "per_device_batch_size": {"asked": 25, "ran": 25, "in_force": True, "by": "config", "note": ""},
            "num_workers": {"asked": 1, "ran": 0, "in_force": False, "by": "command", "note": "num_workers: ..."},
        },
        observed={
            "per_device_batch_size": 25,
            "num_workers": 0,
            "precision": "bf16",
            "intra_op_threads": 2,
            "grad_accum_steps": 1,
            "world_size": 1,
        },
        wall_s=3.0,
    )
    after = after_reach(space, reach, command)
    assert [param.name for param in after.params] == ["per_device_batch_size"]
    assert after.fixed["num_workers"] == 0  # the baseline's: the search leaves it alone
    assert after.fixed["precision"] == "bf16" and after.fixed["intra_op_threads"] == 2  # what the training ran
    assert reach.notes() == ["num_workers: ...: left out of the search"]
    nothing = ReachCheck(
        in_force={"per_device_batch_size": {**reach.in_force["num_workers"], "note": "bs: ..."}},
        observed={},
        wall_s=1.0,
    )
    only_batch = TrainingCommand.checked("python t.py {per_device_batch_size}")
    space = command_space(only_batch, {"per_device_batch_size": 8}, make_cpu())
    with pytest.raises(UserError, match="none of the values autotune set reached your training: bs: ..."):
        after_reach(space, nothing, only_batch)
