"""Build a speaker workload's TrainingSetup on a corpus, as a trial process does, for the workload tests."""

from __future__ import annotations

from pathlib import Path

import torch

from autotune import workloads
from autotune.knobs.config import TrialConfig
from autotune.workloads.base import WorkloadContext

# Narrow models: the pipelines are under test, not the networks' widths.
SMALL = {"ecapa-tdnn": {"channels": 64}, "ecapa-tdnn-512": {"channels": 64}, "eres2net-large": {"m_channels": 8}}


def build(
    name: str,
    corpus: Path,
    preload: bool = False,
    feature_device: str | None = None,
    config: TrialConfig | None = None,
    **options: object,
) -> workloads.TrainingSetup:
    """The workload's setup over the corpus, with the given options over its defaults (and a narrow model); `config`
    replaces the trial's configuration (batch 3)."""
    workload = workloads.get(name)
    context = WorkloadContext(
        data=workload.load_data(str(corpus)),
        config=config or TrialConfig(per_device_batch_size=3, preload_audio=preload, feature_device=feature_device),
        options={**workload.options, **SMALL.get(name, {}), **options},
        device=torch.device("cpu"),
    )
    return workload.build(context)
