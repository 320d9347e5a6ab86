"""Search spaces for several devices per trial: per-rank cores, a global recipe batch shared, a fixed global batch."""

from __future__ import annotations

import pytest

from autotune import space, workloads
from autotune.errors import SpaceError
from tests.conftest import make_cpu, make_cuda

CAM = space.space_path("cam++")
CONFORMER = space.space_path("conformer")


def _param(loaded: space.SearchSpace, name: str):
    return next(param for param in loaded.params if param.name == name)


def test_auto_is_one_ranks_share_of_the_cores():
    assert _param(space.load(CAM, make_cpu(8)), "num_workers").distribution.high == 8
    assert _param(space.load(CAM, make_cpu(8), world_size=2), "num_workers").distribution.high == 4
    assert _param(space.load(CAM, make_cpu(2), world_size=4), "num_workers").distribution.high == 1


def test_a_global_recipe_batch_is_shared_among_devices_and_a_per_device_one_is_not():
    gpus = make_cuda()
    assert space.load(CAM, gpus).baseline["per_device_batch_size"] == 256
    shared = space.load(CAM, gpus, world_size=4)
    assert shared.baseline["per_device_batch_size"] == 64  # 3D-Speaker divides batch_size by the world size
    assert any("global batch 256 over 4 devices -> 64" in note for note in shared.baseline_notes)
    knobs = tuple(workloads.get("conformer").knobs)
    conformer = space.load(CONFORMER, gpus, world_size=4, workload_knobs=knobs)
    assert conformer.baseline["per_device_batch_size"] == 16  # WeNet's batch_size is per GPU


def test_a_fixed_global_batch_keeps_only_dividing_micro_batches():
    fitted = space.load(CAM, make_cuda(), world_size=4, global_batch_size=512)
    assert list(_param(fitted, "per_device_batch_size").distribution.choices) == [32, 64, 128]
    assert fitted.baseline["per_device_batch_size"] == 128  # 512 over 4 devices
    with pytest.raises(SpaceError, match="divides --global-batch 100"):
        space.load(CAM, make_cuda(), world_size=4, global_batch_size=100)


def test_recipe_batch_must_be_known(tmp_path):
    bad = tmp_path / "space.yaml"
    bad.write_text(CAM.read_text().replace("recipe_batch: global", "recipe_batch: sometimes"))
    with pytest.raises(SpaceError, match="recipe_batch must be one of"):
        space.load(bad, make_cuda(), world_size=2)
