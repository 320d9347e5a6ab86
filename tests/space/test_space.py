from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune import space
from autotune.errors import SpaceError
from tests.conftest import make_cpu, make_cuda

CAM = space.space_path("cam++")


def _names(loaded: space.SearchSpace) -> list[str]:
    return [param.name for param in loaded.params]


def _choices(loaded: space.SearchSpace, name: str) -> list:
    return list(next(p for p in loaded.params if p.name == name).distribution.choices)


@pytest.mark.parametrize(
    ("hardware", "precisions"),
    [
        (make_cpu(), ["fp32", "bf16"]),
        (make_cuda(capability=(8, 0)), ["fp32", "fp32-default", "tf32", "bf16", "fp16"]),
        (make_cuda(name="Tesla V100-SXM2-32GB", capability=(7, 0)), ["fp32", "fp16"]),
    ],
    ids=["cpu", "a100", "v100"],
)
def test_precisions_follow_the_hardware(hardware, precisions):
    assert _choices(space.load(CAM, hardware), "precision") == precisions


def test_cpu_space_has_threads_not_pinning_and_small_batches():
    loaded = space.load(CAM, make_cpu(cores=2))
    assert "intra_op_threads" in _names(loaded) and "pin_memory" not in _names(loaded)
    assert _choices(loaded, "per_device_batch_size") == [8, 16, 32, 64]
    workers = next(p for p in loaded.params if p.name == "num_workers").distribution
    assert (workers.low, workers.high) == (0, 2)  # high: auto = the cores


def test_cuda_space_has_pinning_not_threads():
    loaded = space.load(CAM, make_cuda())
    assert "pin_memory" in _names(loaded) and "intra_op_threads" not in _names(loaded)


def test_baseline_is_the_recipe_adapted_to_the_machine():
    gpu = space.load(CAM, make_cuda())
    assert gpu.baseline["per_device_batch_size"] == 256 and gpu.baseline["precision"] == "fp32-default"
    assert gpu.baseline["num_workers"] == 16 and gpu.baseline["cudnn_benchmark"] is True
    cpu = space.load(CAM, make_cpu(cores=2))
    assert cpu.baseline["per_device_batch_size"] == 64 and cpu.baseline["num_workers"] == 2
    assert any("per_device_batch_size: recipe 256 -> 64" in note for note in cpu.baseline_notes)
    # Without TF32 hardware torch's default fp32 is strict fp32: the same maths, not an adaptation worth a note.
    assert cpu.baseline["precision"] == "fp32"
    assert not any("precision" in note for note in cpu.baseline_notes)
    v100 = space.load(CAM, make_cuda(name="Tesla V100-SXM2-32GB", capability=(7, 0)))
    assert v100.baseline["precision"] == "fp32" and not any("precision" in note for note in v100.baseline_notes)


def test_a_recipe_that_sets_no_precision_runs_torch_defaults(tmp_path):
    text = CAM.read_text().replace("  precision: fp32-default\n  prefetch_factor: 2\n", "  prefetch_factor: 2\n")
    assert text != CAM.read_text()
    path = tmp_path / "cam++.yaml"
    path.write_text(text)
    assert space.load(path, make_cuda()).baseline["precision"] == "fp32-default"
    assert space.load(path, make_cpu()).baseline["precision"] == "fp32"


def test_fixed_torch_default_fp32_is_strict_fp32_without_tf32(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(
        "workload: cam++\nparams:\n  num_workers: {type: categorical, choices: [0, 1]}\n"
        "fixed: {precision: fp32-default}\n"
    )
    assert space.load(path, make_cpu()).fixed["precision"] == "fp32"
    assert space.load(path, make_cuda()).fixed["precision"] == "fp32-default"
    path.write_text(path.read_text().replace("fp32-default", "tf32"))
    with pytest.raises(SpaceError, match="fixed precision 'tf32' does not run on this hardware"):
        space.load(path, make_cpu())


def test_suggest_respects_conditions():
    loaded = space.load(CAM, make_cpu(cores=2))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3), direction="maximize")
    seen_without_workers = seen_with_workers = False
    for _ in range(30):
        trial = study.ask()
        values = loaded.suggest(trial)
        if values["num_workers"] == 0:
            seen_without_workers = True
            assert "prefetch_factor" not in values and "persistent_workers" not in values
        else:
            seen_with_workers = True
            assert 1 <= values["prefetch_factor"] <= 8
        assert values["cudnn_benchmark"] is True
        study.tell(trial, 1.0)
    assert seen_with_workers and seen_without_workers


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("params: [1, 2\n", "not valid YAML at line"),
        ("- a\n- b\n", "must hold a YAML mapping"),
        ("params: {}\n", "'params' must be a non-empty mapping"),
        ("params: {batch: {type: int, low: 1, high: 2}}\n", "unknown parameter 'batch'; valid ones are"),
        ("params: {num_workers: {type: integer, low: 0, high: 2}}\n", "unknown type 'integer'"),
        ("params: {num_workers: {type: int, low: 4, high: 2}}\n", "low 4 is above high 2"),
        ("params: {num_workers: {type: int, low: 0}}\n", "needs 'low' and 'high'"),
        ("params: {precision: {type: categorical, choices: []}}\n", "non-empty 'choices'"),
        ("params: {precision: {type: categorical, choices: [fp8]}}\n", "unknown precision 'fp8'"),
        ("params: {precision: {type: categorical, choices: [tf32, fp16]}}\n", "none of the choices runs"),
        ("params: {pin_memory: {type: categorical, choices: [1, 2]}}\n", "is not a bool"),
        (
            "params:\n  prefetch_factor: {type: int, low: 1, high: 4, when: {num_workers: {at_least: 1}}}\n"
            "  num_workers: {type: int, low: 0, high: 2}\n",
            "neither 'device' nor an earlier parameter",
        ),
        (
            "params:\n  num_workers: {type: int, low: 0, high: 2}\n"
            "  prefetch_factor: {type: int, low: 1, high: 4, when: {num_workers: {more_than: 1}}}\n",
            "condition on 'num_workers' may use only",
        ),
        ("params: {num_workers: {type: int, low: 0, high: 2}}\nbaselines: {}\n", "unknown top-level key 'baselines'"),
        (
            "params: {num_workers: {type: int, low: 0, high: 2}}\nbaseline: {workers: 2}\n",
            "unknown parameter 'workers'",
        ),
        (  # the recipe's accumulation is fixed, never searched
            "params: {grad_accum_steps: {type: int, low: 1, high: 4}}\n",
            "unknown parameter 'grad_accum_steps'",
        ),
        (
            "params: {num_workers: {type: int, low: 0, high: 2}}\nfixed: {grad_accum_steps: 0}\n",
            "fixed grad_accum_steps must be a whole number >= 1, got 0",
        ),
    ],
    ids=lambda value: value if len(value) < 30 else None,
)
def test_invalid_spaces_give_one_line_errors(tmp_path, text, words):
    with pytest.raises(SpaceError) as caught:
        space.load(_write(tmp_path, text), make_cpu())
    assert words in str(caught.value)
    assert "\n" not in str(caught.value)


def test_missing_space_file(tmp_path):
    with pytest.raises(SpaceError, match="does not exist"):
        space.load(tmp_path / "nope.yaml", make_cpu())


def test_grid_and_size():
    loaded = space.from_dict(
        {
            "params": {
                "per_device_batch_size": {"type": "categorical", "choices": [1, 2]},
                "num_workers": {"type": "int", "low": 0, "high": 4, "step": 2},
            }
        },
        make_cpu(),
    )
    assert loaded.grid() == {"per_device_batch_size": [1, 2], "num_workers": [0, 2, 4]}
    assert loaded.size() == 6


def test_points_leave_out_knobs_whose_condition_fails():
    """A grid over CAM++'s CPU space: prefetch and persistence exist only with workers, so a point without workers is
    one configuration, not 16 copies of it with a prefetch depth it cannot use."""
    loaded = space.load(CAM, make_cpu(cores=2))
    points = loaded.points()
    without_workers = [point for point in points if point["num_workers"] == 0]
    assert len(without_workers) == 4 * 2 * 2  # batch sizes x precisions x threads (optimizer kernels: CUDA only)
    assert not any("prefetch_factor" in point or "persistent_workers" in point for point in without_workers)
    assert len(points) == 4 * 2 * 2 * (1 + 2 * 8 * 2)  # ... x (no workers, or 1-2 workers x prefetch x persist)
    assert len({tuple(sorted(point.items())) for point in points}) == len(points)
    assert all(point["cudnn_benchmark"] is True for point in points)  # the space's fixed values fill in the rest


def test_seeds_become_points_of_this_machines_space():
    cpu = space.load(CAM, make_cpu(4))
    first = cpu.seeds[0]
    assert (first["per_device_batch_size"], first["precision"], first["num_workers"]) == (32, "bf16", 1)
    assert first["intra_op_threads"] == 4  # auto: the cores a trial may use
    assert all(seed != cpu.baseline for seed in cpu.seeds)
    old_gpu = make_cuda(capability=(7, 0))  # a V100: no bf16, no TF32 -> the next preference in each list
    precisions = [seed["precision"] for seed in space.load(CAM, old_gpu).seeds]
    assert precisions == ["fp16", "fp32"]


def test_smaller_batch_halves_the_knob_that_sizes_the_batch():
    from autotune.space.fit import smaller_batch

    cam = space.load(CAM, make_cuda())
    seed = cam.seeds[0]
    assert smaller_batch(cam, seed) == {**seed, "per_device_batch_size": 256}
    assert smaller_batch(cam, {**seed, "per_device_batch_size": 192}) == {**seed, "per_device_batch_size": 64}
    assert smaller_batch(cam, {**seed, "per_device_batch_size": 32}) is None  # nothing smaller is offered
    knobs = ("batch_type", "max_frames_in_batch", "num_buckets", "bucket_scaling")
    asr = space.load(space.space_path("conformer"), make_cuda(), workload_knobs=knobs)
    dynamic, static, bucket = asr.seeds
    assert smaller_batch(asr, dynamic) == {**dynamic, "max_frames_in_batch": 24000}  # frames, not the fixed batch
    assert smaller_batch(asr, static) == {**static, "per_device_batch_size": 16}
    assert smaller_batch(asr, bucket) == {**bucket, "max_frames_in_batch": 24000}  # every bucket's batch halves


def test_seeds_must_be_a_list_of_mappings_with_known_knobs(tmp_path):
    minimal = "params:\n  per_device_batch_size: {type: categorical, choices: [8, 16]}\n"
    for bad, words in (("seeds: {a: 1}", "must be a list of mappings"), ("seeds: [{warp: 9}]", "unknown parameter")):
        path = tmp_path / "space.yaml"
        path.write_text(minimal + bad + "\n")
        with pytest.raises(SpaceError, match=words):
            space.load(path, make_cuda())
    path.write_text(minimal + "seeds: [{per_device_batch_size: 12}, {per_device_batch_size: [32, 16]}]\n")
    assert [seed["per_device_batch_size"] for seed in space.load(path, make_cuda()).seeds] == [16]
