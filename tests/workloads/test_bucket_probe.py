"""The bucket plan's memory probe at its boundary: on a CPU nothing runs out of memory, so a fake OOM stands in for
the device's limit (as the worst-case scan's own tests do), raised where a batch's attention memory (items x the
longest length squared) passes it. A plan within the limit trains every bucket's worst batch; one item past it
fails the scan as the trial's OOM; the seeds' back-off (half the frame budget) brings every bucket back under."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autotune import workloads
from autotune.knobs.config import TrialConfig
from autotune.knobs.precision import PrecisionSettings
from autotune.trial.distributed import Forward
from autotune.trial.worst_case import WorstCaseOutOfMemoryError, scan_worst_case
from autotune.workloads.asr import bucket_plan
from autotune.workloads.base import WorkloadContext
from tests.workloads.test_asr_workload import SMALL_MODEL

CPU = torch.device("cpu")
KNOBS = {"batch_type": "bucket", "max_frames_in_batch": 1600, "num_buckets": 4, "bucket_scaling": 2.0}


@pytest.fixture(scope="module")
def setup_and_frames(tiny_corpus: Path):  # 12 utterances of 1-2 s
    corpus = tiny_corpus
    conformer = workloads.get("conformer")
    config = TrialConfig(per_device_batch_size=16, workload_knobs=KNOBS)
    context = WorkloadContext(
        data=conformer.load_data(str(corpus)),
        config=config,
        options={**conformer.options, "model": SMALL_MODEL, "speed_perturb": False, "spec_aug": False},
        device=CPU,
    )
    setup = conformer.build(context)
    return setup, setup.dataset.max_frames  # type: ignore[attr-defined]


def _scan(setup, config: TrialConfig, limit: int) -> list[tuple[int, int]]:
    """Scan the worst batches under a fake device whose attention memory holds `limit` (items x frames^2)."""
    seen: list[tuple[int, int]] = []
    real_loss = setup.loss_fn

    def loss_fn(module, batch):
        items, longest = int(batch["feats"].shape[0]), int(batch["feat_lengths"].max())
        seen.append((items, longest))
        if items * longest**2 > limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (fake: the probe's limit)")
        return real_loss(module, batch)

    forward = Forward(setup.model, loss_fn, CPU)
    scan_worst_case(
        setup, config, forward=forward, precision=PrecisionSettings(precision="fp32", device_type="cpu"), device=CPU
    )
    return seen


@pytest.mark.slow
def test_the_probe_passes_at_the_limit_and_fails_one_item_past_it(setup_and_frames) -> None:
    setup, frames = setup_and_frames
    config = TrialConfig(per_device_batch_size=16, workload_knobs=KNOBS)
    plan = bucket_plan(frames, config)
    assert len(plan.batch_sizes) >= 3  # several buckets, each with its own batch
    costs = [n * longest**2 for n, longest in zip(plan.batch_sizes, plan.longest, strict=True)]
    seen = _scan(setup, config, limit=max(costs))  # exactly at the limit: every bucket's worst batch trains
    assert sorted(set(seen)) == sorted(zip(plan.batch_sizes, plan.longest, strict=True))
    with pytest.raises(WorstCaseOutOfMemoryError):
        _scan(setup, config, limit=max(costs) - 1)  # the costliest bucket one byte past: the trial's OOM
    # the tuner's back-off halves the space's batch knob (max_frames_in_batch): every bucket's batch shrinks with it
    halved = TrialConfig(per_device_batch_size=16, workload_knobs={**KNOBS, "max_frames_in_batch": 800})
    smaller = bucket_plan(frames, halved)
    assert all(a <= b for a, b in zip(smaller.batch_sizes, plan.batch_sizes, strict=True))
    _scan(setup, halved, limit=max(costs) - 1)
