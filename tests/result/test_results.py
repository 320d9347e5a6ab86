"""TunedConfig: YAML round trips, atomic writes, loading errors, DataLoader kwargs and measurement summaries."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from autotune import yamlio
from autotune.errors import UserError
from autotune.knobs.config import TrialConfig
from autotune.result import tuned_config as results
from autotune.result.measurements import speedup_range, summarise_measurements
from autotune.result.tuned_config import TunedConfig, load_config, write_config
from autotune.trial.spec import TrialResult
from tests.conftest import make_cpu

WITH_WORKERS = TrialConfig(
    per_device_batch_size=32,
    num_workers=4,
    prefetch_factor=4,
    pin_memory=True,
    persistent_workers=True,
    precision="bf16",
    cudnn_benchmark=False,
    intra_op_threads=2,
    world_size=2,
    grad_accum_steps=2,
    workload_knobs={"crop_seconds": 2.5, "fbank_on_gpu": False},
)
WORKERS_DEFAULT_PREFETCH = TrialConfig(per_device_batch_size=16, num_workers=2, precision="fp32")
NO_WORKERS = TrialConfig(per_device_batch_size=8, num_workers=0, precision="fp32")
PRELOADED = TrialConfig(per_device_batch_size=8, num_workers=2, precision="fp32", preload_audio=True)


def make_tuned(config: TrialConfig = WITH_WORKERS, device_type: str = "cpu") -> TunedConfig:
    return TunedConfig(
        workload={"name": "cam++", "options": {"num_classes": 4}},
        config=config,
        device_type=device_type,
        metrics={"winner": {"status": "ok", "samples_per_second": 123.456, "measurements": 3}, "speedup": 1.7},
        hardware=make_cpu().to_dict(),
        data={"source": "synthetic", "utterances": 12},
        search={"trials": 20, "sampler": "TPESampler", "space_file": "search_spaces/cam++.yaml", "space": {}},
        created="2025-01-02T03:04:05+00:00",
        autotune_version="0.1.0",
        notes=["prefetch_factor: recipe 16 -> 8 (outside this machine's space)"],
    )


@pytest.mark.parametrize(
    "config",
    [WITH_WORKERS, WORKERS_DEFAULT_PREFETCH, NO_WORKERS, PRELOADED],
    ids=["workers", "workers-default-prefetch", "no-workers", "preloaded"],
)
def test_yaml_round_trip(config: TrialConfig) -> None:
    tuned = make_tuned(config)
    assert TunedConfig.from_yaml(tuned.to_yaml()) == tuned


@pytest.mark.parametrize("config", [WITH_WORKERS, NO_WORKERS], ids=["workers", "no-workers"])
def test_write_then_load_round_trip(tmp_path: Path, config: TrialConfig) -> None:
    tuned = make_tuned(config)
    path = write_config(tuned, tmp_path / "results" / "cam++" / "cpu.yaml")
    assert load_config(path) == tuned


def test_written_file_has_header_and_is_valid_yaml(tmp_path: Path) -> None:
    path = write_config(make_tuned(), tmp_path / "out.yaml")
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# autotune result:")
    assert f'autotune.load_config("{path}")' in text
    data = yaml.safe_load(text)
    assert data["batch"] == {
        "per_device_batch_size": 32,
        "world_size": 2,
        "grad_accum_steps": 2,
        "global_batch_size": 128,
    }
    assert data["precision"]["amp_dtype"] == "bfloat16"


def test_write_config_replaces_the_file(tmp_path: Path) -> None:
    path = tmp_path / "out.yaml"
    write_config(make_tuned(WITH_WORKERS), path)
    write_config(make_tuned(NO_WORKERS), path)
    assert load_config(path).config == NO_WORKERS
    assert [p.name for p in tmp_path.iterdir()] == ["out.yaml"]


def test_write_config_failing_at_rename_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "out.yaml"
    write_config(make_tuned(WITH_WORKERS), path)
    before = path.read_bytes()

    def failing_replace(src: str, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(yamlio.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        write_config(make_tuned(NO_WORKERS), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["out.yaml"]


def test_write_config_failing_midway_through_writing_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "out.yaml"
    write_config(make_tuned(WITH_WORKERS), path)
    before = path.read_bytes()

    def failing_fsync(fd: int) -> None:  # the text is half on its way to the disk
        raise OSError("I/O error")

    monkeypatch.setattr(yamlio.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="I/O error"):
        write_config(make_tuned(NO_WORKERS), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["out.yaml"]


def test_dataloader_kwargs_with_workers() -> None:
    assert make_tuned(WITH_WORKERS).dataloader_kwargs() == {
        "batch_size": 32,
        "num_workers": 4,
        "pin_memory": True,
        "drop_last": True,
        "prefetch_factor": 4,
        "persistent_workers": True,
        "in_order": True,  # DataLoader's default, written since the in_order knob
    }


def test_dataloader_kwargs_without_workers_omit_worker_options() -> None:
    kwargs = make_tuned(NO_WORKERS).dataloader_kwargs()
    assert "prefetch_factor" not in kwargs
    assert "persistent_workers" not in kwargs
    assert kwargs == {"batch_size": 8, "num_workers": 0, "pin_memory": False, "drop_last": True}


@pytest.mark.parametrize("config", [NO_WORKERS, WORKERS_DEFAULT_PREFETCH], ids=["no-workers", "workers"])
def test_dataloader_kwargs_are_accepted_by_torch(config: TrialConfig) -> None:
    dataset = torch.utils.data.TensorDataset(torch.arange(20.0).unsqueeze(1), torch.arange(20))
    loader = torch.utils.data.DataLoader(dataset, **make_tuned(config).dataloader_kwargs())
    batches = list(loader)
    batch_size = config.per_device_batch_size
    assert len(batches) == 20 // batch_size  # drop_last
    assert all(features.shape == (batch_size, 1) for features, _ in batches)


def _write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "result.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def _edited_result(old: str, new: str) -> str:
    """A result YAML with one section edited by hand."""
    text = make_tuned().to_yaml()
    assert old in text
    return text.replace(old, new)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        ("batch: [1, 2\nworkload: {", "not valid YAML"),
        (b"\xff\xfe\x00binary", "cannot be read"),
        ("- just\n- a list\n", "mapping"),
        ("name: cam++\nbest: 3\n", "not an autotune result"),
        ("dataloader: 5\nbatch: {}\nprecision: {}\n", "not an autotune result"),
        (_edited_result("threads:\n  intra_op_threads: 2\n", "threads: [2]\n"), "not an autotune result"),
        (_edited_result("workload_knobs:\n", "workload_knobs: [ab, cde]\nx:\n"), "not an autotune result"),
        (_edited_result("implementation: default", "implementation: apex"), "'apex' is not one of default"),
        (_edited_result("name: bf16", "name: bf17"), "'bf17' is not one of fp32"),
    ],
    ids=[
        "missing",
        "not-yaml",
        "not-text",
        "not-a-mapping",
        "other-yaml",
        "wrong-types",
        "threads-list",
        "knobs-list",
        "optimizer-unknown",
        "precision-unknown",
    ],
)
def test_load_config_errors_are_one_line(tmp_path: Path, content: str | bytes | None, message: str) -> None:
    path = tmp_path / "missing.yaml" if content is None else _write(tmp_path, content)
    with pytest.raises(UserError, match=message) as raised:
        load_config(path)
    assert "\n" not in str(raised.value)


def test_load_config_takes_an_emptied_threads_section_as_unset(tmp_path: Path) -> None:
    path = _write(tmp_path, _edited_result("threads:\n  intra_op_threads: 2\n", "threads:\n"))
    assert load_config(path).config.intra_op_threads is None


def _ok(samples_per_second: float, **fields: object) -> TrialResult:
    return TrialResult(status="ok", samples_per_second=samples_per_second, **fields)  # type: ignore[arg-type]


def test_summary_takes_median_and_spread() -> None:
    measured = [
        _ok(100.0, step_time_median_s=0.30, peak_memory_bytes=1_000, memory_capacity_bytes=9_000, wall_s=20.0),
        _ok(120.0, step_time_median_s=0.25, peak_memory_bytes=3_000, memory_capacity_bytes=9_000, wall_s=22.0),
        _ok(110.0, step_time_median_s=0.27, peak_memory_bytes=2_000, memory_capacity_bytes=9_000, wall_s=21.0),
        TrialResult(status="oom", reason="CUDA out of memory"),
    ]
    summary = summarise_measurements(measured).to_dict()
    assert summary["status"] == "ok"
    assert summary["samples_per_second"] == 110.0
    assert (summary["samples_per_second_min"], summary["samples_per_second_max"]) == (100.0, 120.0)
    assert summary["spread_fraction"] == pytest.approx(20 / 110, abs=1e-4)
    assert summary["measurements"] == 3  # the OOM is ignored
    assert summary["step_time_median_s"] == 0.27
    assert summary["peak_memory_bytes"] == 3_000
    assert summary["memory_capacity_bytes"] == 9_000
    assert summary["trial_wall_s"] == 21.0
    assert summary["audio_seconds_per_second"] is None  # never measured


def test_summary_of_an_even_count_averages_the_middle_two() -> None:
    summary = summarise_measurements([_ok(100.0), _ok(200.0), _ok(300.0), _ok(400.0)]).to_dict()
    assert summary["samples_per_second"] == 250.0
    assert summary["measurements"] == 4


def test_summary_ignores_infeasible_and_unmeasured_results() -> None:
    measured = [TrialResult(status="unstable", samples_per_second=999.0), _ok(50.0), TrialResult(status="ok")]
    summary = summarise_measurements(measured).to_dict()
    assert (summary["samples_per_second"], summary["measurements"], summary["spread_fraction"]) == (50.0, 1, 0.0)


def test_summary_when_all_are_infeasible_reports_the_first() -> None:
    measured = [TrialResult(status="oom", reason="out of memory"), TrialResult(status="timeout", reason="hung")]
    assert summarise_measurements(measured).to_dict() == {"status": "oom", "reason": "out of memory"}


def test_summary_of_nothing_is_missing() -> None:
    assert summarise_measurements([]).to_dict() == {"status": "missing", "reason": ""}


def test_header_mentions_every_public_helper() -> None:
    helpers = ("load_config", "dataloader_kwargs", "autocast", "grad_scaler", "optimizer_kwargs")
    assert all(name in results._HEADER for name in helpers)


def test_dynamic_batches_leave_batching_to_the_dataset_and_name_the_frame_budget(tmp_path: Path) -> None:
    dynamic = TrialConfig(
        per_device_batch_size=16, num_workers=2, workload_knobs={"batch_type": "dynamic", "max_frames_in_batch": 12000}
    )
    tuned = make_tuned(dynamic)
    kwargs = tuned.dataloader_kwargs()
    assert kwargs["batch_size"] is None and "drop_last" not in kwargs  # WeNet: DataLoader(batch_size=None)
    batch = tuned.to_dict()["batch"]
    assert batch["batch_type"] == "dynamic" and batch["max_frames_in_batch"] == 12000
    loaded = load_config(write_config(tuned, tmp_path / "dynamic.yaml"))
    assert loaded.config == dynamic and loaded.dataloader_kwargs() == kwargs
    assert "batch_type" not in make_tuned(WITH_WORKERS).to_dict()["batch"]


def test_bucket_batches_record_their_plan_and_hand_users_the_sampler(tmp_path: Path) -> None:
    from dataclasses import replace

    from autotune.data.buckets import BucketBatchSampler, plan_buckets

    knobs = {"batch_type": "bucket", "max_frames_in_batch": 12000, "num_buckets": 4, "bucket_scaling": 1.5}
    config = TrialConfig(per_device_batch_size=16, num_workers=2, workload_knobs=knobs)
    frames = [100 + 37 * i % 1400 for i in range(120)]
    plan = plan_buckets(frames, num_buckets=4, max_frames_in_batch=12000, scaling=1.5)
    tuned = make_tuned(config)
    winner = {**tuned.metrics["winner"], "epoch_accounting": {"dataset_size": 120, "buckets": plan.to_dict()}}
    tuned = replace(tuned, metrics={**tuned.metrics, "winner": winner})
    batch = tuned.to_dict()["batch"]
    assert batch["batch_type"] == "bucket" and batch["max_frames_in_batch"] == 12000
    assert batch["bucket_boundaries"] == list(plan.boundaries) and batch["bucket_batch_sizes"] == list(plan.batch_sizes)
    loaded = load_config(write_config(tuned, tmp_path / "bucket.yaml"))
    assert loaded.bucket_plan == plan and loaded.dataloader_kwargs()["batch_size"] is None
    sampler = loaded.batch_sampler(frames, seed=5, rank=1, world_size=2)
    assert isinstance(sampler, BucketBatchSampler) and list(sampler) == list(
        BucketBatchSampler(frames, plan, seed=5, rank=1, world_size=2)
    )
    dataset = list(range(120))  # a user's DataLoader takes it as its batch_sampler, as docs/result.md says
    kwargs = loaded.dataloader_kwargs()
    kwargs.pop("batch_size")
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=loaded.batch_sampler(frames), **kwargs)
    assert sorted(int(i) for batch in loader for i in batch) == dataset
    with pytest.raises(ValueError, match="not tuned with batch_type bucket"):
        make_tuned(WITH_WORKERS).batch_sampler(frames)
    # a bucket winner whose trials recorded no plan says so rather than posing as dynamic batches
    assert make_tuned(config).to_dict()["batch"]["note"] == "no trial recorded its buckets"


def test_a_preloading_winner_says_so_outside_the_dataloader_kwargs() -> None:
    tuned = make_tuned(PRELOADED)
    assert tuned.to_dict()["audio"]["preload_decoded"] is True and "PreloadedAudio" in tuned.to_dict()["audio"]["note"]
    assert "preload_audio" not in tuned.dataloader_kwargs()
    torch.utils.data.DataLoader(list(range(16)), **tuned.dataloader_kwargs())  # still valid DataLoader arguments
    assert make_tuned(NO_WORKERS).to_dict()["audio"] == {"preload_decoded": False}


def test_the_speedup_comes_with_the_range_its_measurements_allow() -> None:
    winner = summarise_measurements([_ok(200.0), _ok(220.0), _ok(240.0)])
    baseline = summarise_measurements([_ok(100.0), _ok(110.0)])
    assert speedup_range(winner, baseline) == {
        "low": round(200 / 110, 3),
        "high": 2.4,
        "winner_measurements": 3,
        "baseline_measurements": 2,
    }
    failed = summarise_measurements([TrialResult(status="oom", reason="out of memory")])
    assert speedup_range(winner, failed) is None


@pytest.mark.parametrize(
    ("implementation", "kwargs"), [("default", {}), ("foreach", {"foreach": True}), ("fused", {"fused": True})]
)
def test_the_optimizer_section_hands_over_the_constructor_keyword(
    tmp_path: Path, implementation: str, kwargs: dict
) -> None:
    tuned = make_tuned(replace(WITH_WORKERS, optimizer_impl=implementation))
    assert tuned.to_dict()["optimizer"] == {"implementation": implementation, "torch_kwargs": kwargs}
    loaded = load_config(write_config(tuned, tmp_path / "result.yaml"))
    assert loaded.config.optimizer_impl == implementation and loaded.optimizer_kwargs() == kwargs
    torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))], lr=0.1, **loaded.optimizer_kwargs())  # torch takes it


def test_a_result_written_before_the_optimizer_knob_loads_as_default(tmp_path: Path) -> None:
    """Results from before the optimizer knob have no optimizer section: they stepped the recipe's optimizer as
    built."""
    written = make_tuned().to_dict()
    del written["optimizer"]
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(written))
    loaded = load_config(path)
    assert loaded.config.optimizer_impl == "default" and loaded.optimizer_kwargs() == {}
    assert loaded.config == WITH_WORKERS


@pytest.mark.parametrize("placement", (None, "workers", "device"))
def test_feature_placement_is_written_and_read_back(placement: str | None, tmp_path: Path) -> None:
    """features.computed_in: null where the model has no choice (the recipe's placement), else where the winner
    computed its fbank; a result from before the knob has no section and loads unset; a word it does not take is
    not an autotune result."""
    tuned = make_tuned(replace(WITH_WORKERS, feature_device=placement))
    written = tuned.to_dict()
    assert written["features"] == {"computed_in": placement}
    path = tmp_path / "result.yaml"
    path.write_text(yaml.safe_dump(written))
    assert load_config(path).config.feature_device == placement
    del written["features"]
    path.write_text(yaml.safe_dump(written))
    assert load_config(path).config.feature_device is None
    path.write_text(yaml.safe_dump({**written, "features": {"computed_in": "gpu"}}))
    with pytest.raises(UserError):
        load_config(path)
