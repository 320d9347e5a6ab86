"""A real CPU run of the conformer with bucket batches, as a user runs it: trials in subprocesses on the real data
pipeline, the bucket plan reported by each trial and written in the result, and load_config handing the sampler."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autotune.run.plan import RunRequest
from tests.workloads.test_asr_workload import SMALL_MODEL


@pytest.mark.slow
def test_a_real_run_with_bucket_batches_writes_the_buckets(tmp_path: Path, tiny_corpus: Path) -> None:
    from autotune import load_config
    from autotune.data.buckets import BucketBatchSampler
    from autotune.run import runner
    from autotune.search.settings import TunerSettings
    from autotune.trial import TimingSettings

    space_file = tmp_path / "space.yaml"
    space_file.write_text(
        "params:\n  bucket_scaling: {type: categorical, choices: [1.0, 2.0]}\n"
        "fixed: {batch_type: bucket, max_frames_in_batch: 600, num_buckets: 3, per_device_batch_size: 4,\n"
        "        num_workers: 0, precision: fp32, intra_op_threads: 1}\n"
    )
    request = RunRequest(
        model="conformer",
        data=str(tiny_corpus),
        space=str(space_file),
        results_dir=str(tmp_path / "results"),
        device="cpu",
        workload_options={"model": SMALL_MODEL},
        settings=TunerSettings(
            trials=6, sampler="grid", confirm_top_k=0, timing=TimingSettings(warmup_steps=1, window_s=0.3)
        ),
        warm_start=False,
        compute_ceiling=False,
        amp_check=None,
    )
    run = runner.execute(runner.prepare(request))
    records = [record for record in run.outcome.records if record.role != "preload"]
    assert all(record.result.status == "ok" for record in records), records
    plans = {
        record.config.workload_knobs["bucket_scaling"]: record.result.epoch_accounting["buckets"] for record in records
    }  # type: ignore[index]
    assert set(plans) == {1.0, 2.0}, [(r.role, r.config.short(), r.result.status) for r in run.outcome.records]
    # the same boundaries from the same data; the steeper exponent gives the short buckets larger batches
    assert plans[1.0]["bucket_boundaries"] == plans[2.0]["bucket_boundaries"]
    assert plans[2.0]["bucket_batch_sizes"][0] > plans[1.0]["bucket_batch_sizes"][0]
    assert plans[2.0]["bucket_batch_sizes"][-1] == plans[1.0]["bucket_batch_sizes"][-1]  # the longest: the budget's
    assert all(record.result.worst_case_batches == len(plans[1.0]["bucket_batch_sizes"]) for record in records)
    assert any("bucket_scaling=2.0" in record.config.short() for record in records)
    tuned = load_config(run.result_path)
    batch = yaml.safe_load(Path(run.result_path).read_text())["batch"]
    winner = plans[tuned.config.workload_knobs["bucket_scaling"]]
    assert batch["batch_type"] == "bucket" and batch["bucket_batch_sizes"] == winner["bucket_batch_sizes"]
    assert batch["bucket_boundaries"] == winner["bucket_boundaries"]
    frames = [150, 90, 210, 120, 180, 100]
    sampler = tuned.batch_sampler(frames)
    assert isinstance(sampler, BucketBatchSampler) and sorted(i for b in sampler for i in b) == list(range(6))


@pytest.mark.slow
def test_two_gloo_ranks_get_as_many_bucket_batches_and_each_item_once(tmp_path: Path, tiny_corpus: Path) -> None:
    """DDP on 2 gloo ranks: each reads its rank from torch.distributed, takes its share of whole bucket batches,
    and the epoch accounting gathered from both counts every utterance once with as many batches on each rank."""
    from autotune import workloads, yamlio
    from autotune.knobs.config import TrialConfig
    from autotune.trial import TimingSettings, TrialSpec, launch

    data_file = yamlio.write_json(
        tmp_path / "data.json", workloads.get("conformer").load_data(str(tiny_corpus)).to_dict()
    )
    knobs = {"batch_type": "bucket", "max_frames_in_batch": 500, "num_buckets": 3, "bucket_scaling": 1.5}
    spec = TrialSpec(
        workload="conformer",
        workload_options={"model": SMALL_MODEL},
        data_file=str(data_file),
        config=TrialConfig(per_device_batch_size=2, world_size=2, intra_op_threads=1, workload_knobs=knobs),
        timing=TimingSettings(warmup_steps=1, window_s=0.01, min_window_steps=1, max_window_steps=2),
        device_type="cpu",
        result_path=str(tmp_path / "trial" / "result.json"),
        collective_timeout_s=120,
    )
    result = launch(spec, workdir=tmp_path / "trial", timeout_s=240)
    assert result.status == "ok", result.log_tail
    accounting = result.epoch_accounting or {}
    batches = accounting["batches_per_epoch_per_rank"]
    assert len(batches) == 2 and batches[0] == batches[1] > 0  # no rank waits at the epoch's end
    assert accounting["samples_per_epoch"] == accounting["dataset_size"]  # each utterance once across the ranks
    assert accounting["buckets"]["bucket_batch_sizes"]
